//! Forge requests per push to the tracked branch (issue 23): `plumber up --forge github`
//! against the fake GitHub of `tests/support/fake_forge.rs` (every request recorded), on a
//! repository with N closed pull requests (every fifth merged) and 5 open ones:
//!
//! - 2 open ones that change `orders/clean` (valid; the second push makes them conflict);
//! - 3 open ones whose merge is invalid (an unknown input in a file of their own: no push to
//!   main below changes their plans);
//! - the N closed ones change `orders/clean` too (valid; they conflict after the second push).
//!
//! A sixth open pull request, the sentinel (`refs/pull/9/head`, last in ref order: plans are
//! made and published in that order), tells when a phase was published; its own requests are
//! not counted. The phases: the first publication; a push to main that changes no plan (a
//! README); a push to main that changes the plans of the 2 open ones (and of every closed
//! one); a restart on the same state directory.
//!
//! Counted per phase: requests, writes (POST/PATCH/PUT) and the seconds from the push (or the
//! daemon's start) until the sentinel was published (the restart: until its comment was
//! looked at). The same phases run against a baseline binary
//! (`PLUMBER_BASELINE_BIN`, `bash bench/forge-writes.sh` builds the one before issue 23) in
//! the same run. Medians and ranges of RUNS runs (default 3) for CLOSED="0 10 100".

#![allow(clippy::expect_used, clippy::unwrap_used)] // a broken benchmark setup should stop loudly

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/support/fake_forge.rs"]
mod fake_forge;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Change, TestRepo, write};
use fake_forge::{GITHUB_REPO, Recorded, Server, TOKEN};
use git2::Oid;
use plumber::forge::{Kind, MARKER, PullRequestState};
use plumber_testkit::{Process, free_port, wait_until};
use serde_json::Value;

const PATIENCE: Duration = Duration::from_secs(120);
/// The open pull requests besides the sentinel: the first two change with the second push.
const OPEN: [u64; 5] = [2, 3, 4, 5, 6];
const CHANGED_OPEN: usize = 2;
const SENTINEL: u64 = 9;
const FIRST_CLOSED: u64 = 1000;

fn clean(threshold: u64) -> Change {
    write(
        "topologies/orders/steps/clean.yaml",
        format!("kind: processor\ninput: in\njq: 'select(.v > {threshold})'\n"),
    )
}

/// `main` with one topology, `orders` (source → clean → sink).
fn repository() -> TestRepo {
    let repo = TestRepo::new();
    repo.commit(
        "main",
        "orders",
        &[
            write(
                "topologies/orders/sources/in.yaml",
                "kind: source\ntopic: orders\n",
            ),
            clean(1),
            write(
                "topologies/orders/sinks/out.yaml",
                "kind: sink\ntopic: orders-out\ninput: clean\n",
            ),
        ],
    );
    repo
}

/// Commits `changes` on pull request `number`'s branch (from `main`) and points
/// `refs/pull/N/head` there.
fn push(repo: &TestRepo, number: u64, changes: &[Change]) -> Oid {
    let branch = format!("pr-{number}");
    if repo
        .git
        .find_reference(&format!("refs/heads/{branch}"))
        .is_err()
    {
        let main = repo.git.refname_to_id("refs/heads/main").unwrap();
        repo.git
            .reference(&format!("refs/heads/{branch}"), main, true, "branch")
            .unwrap();
    }
    let head = repo.commit(&branch, "change", changes);
    repo.git
        .reference(&format!("refs/pull/{number}/head"), head, true, "pull")
        .unwrap();
    head
}

/// What one phase cost the forge.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    requests: usize,
    writes: usize,
    seconds: f64,
}

/// The four phases of one run.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    first: Cost,
    no_change: Cost,
    change: Cost,
    restart: Cost,
}

struct Daemon {
    process: Process,
    binary: PathBuf,
    repo: TestRepo,
    forge: Server,
    state: tempfile::TempDir,
    api: String,
    sentinel_heads: Vec<Oid>,
}

impl Daemon {
    fn spawn(&mut self) {
        let state = self.state.path();
        self.process = start(&self.binary, &self.repo, &self.forge, state, &self.api);
    }

    fn comment_of_sentinel(&self) -> Option<fake_forge::Comment> {
        self.forge
            .comments(SENTINEL)
            .into_iter()
            .find(|c| c.body.starts_with(MARKER))
    }

    fn wait_sentinel(&self, what: &str, check: impl Fn(&str) -> bool) {
        wait_until(what, PATIENCE, || {
            self.comment_of_sentinel().is_some_and(|c| check(&c.body))
        });
    }

    /// Waits until every watched ref is planned against `base`.
    fn planned_against(&self, base: Oid, count: usize) {
        wait_until(&format!("{count} plans against {base}"), PATIENCE, || {
            let plans: Vec<Value> = ureq::get(&format!("{}/api/plans", self.api))
                .call()
                .ok()
                .and_then(|mut answer| answer.body_mut().read_json().ok())
                .unwrap_or_default();
            plans.len() == count && plans.iter().all(|p| p["base"] == base.to_string())
        });
    }

    /// The requests since the last one, the sentinel's left out.
    fn cost(&self, started: Instant) -> Cost {
        let seconds = started.elapsed().as_secs_f64();
        let sentinel_comment = self.comment_of_sentinel().map(|c| c.id);
        let of_sentinel = |r: &Recorded| {
            r.path.contains(&format!("/issues/{SENTINEL}/"))
                || sentinel_comment.is_some_and(|id| r.path.ends_with(&format!("/comments/{id}")))
                || self
                    .sentinel_heads
                    .iter()
                    .any(|head| r.path.ends_with(&format!("/statuses/{head}")))
        };
        let counted: Vec<Recorded> = self
            .forge
            .requests()
            .into_iter()
            .filter(|r| !of_sentinel(r))
            .collect();
        self.forge.clear_requests();
        Cost {
            requests: counted.len(),
            writes: counted.iter().filter(|r| r.method != "GET").count(),
            seconds,
        }
    }
}

fn start(binary: &Path, repo: &TestRepo, forge: &Server, state: &Path, api: &str) -> Process {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join("daemon.log"))
        .unwrap();
    Process::spawn(
        "plumber up",
        Command::new(binary)
            .args(["up", &repo.location(), "--branch", "main"])
            .args(["--bootstrap", "127.0.0.1:1"])
            .arg("--state-dir")
            .arg(state.join("state"))
            .args(["--listen", api.trim_start_matches("http://")])
            .args(["--watch-refs", "refs/pull/*/head"])
            .args(["--forge", "github", "--forge-url", &forge.url])
            .args(["--forge-repo", GITHUB_REPO])
            .arg("--forge-token-file")
            .arg(state.join("token"))
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log),
    )
}

/// One run of the four phases with `closed` closed pull requests.
fn run(binary: &Path, closed: u64) -> Run {
    let repo = repository();
    let forge = Server::start(Kind::GitHub);
    for number in FIRST_CLOSED..FIRST_CLOSED + closed {
        push(&repo, number, &[clean(100 + number)]);
        let state = if number % 5 == 0 {
            PullRequestState::Merged
        } else {
            PullRequestState::Closed
        };
        forge.seed(number, 0, None, "");
        forge.set_pull_request(number, state, &[]);
    }
    for (i, number) in OPEN.into_iter().enumerate() {
        if i < CHANGED_OPEN {
            push(&repo, number, &[clean(5 + number)]);
        } else {
            let broken = format!("kind: processor\ninput: nowhere{number}\njq: '.'\n");
            push(
                &repo,
                number,
                &[write("topologies/orders/steps/enrich.yaml", broken)],
            );
        }
    }
    let sentinel = push(&repo, SENTINEL, &[write("notes/round.txt", "0")]);
    for number in OPEN.into_iter().chain([SENTINEL]) {
        forge.seed(number, 0, None, "");
        forge.set_pull_request(number, PullRequestState::Open, &[]);
    }
    let refs = closed as usize + OPEN.len() + 1;
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("token"), format!("{TOKEN}\n")).unwrap();
    let api = format!("http://127.0.0.1:{}", free_port());
    let started = Instant::now();
    let process = start(binary, &repo, &forge, state.path(), &api);
    let mut daemon = Daemon {
        process,
        binary: binary.to_owned(),
        repo,
        forge,
        state,
        api,
        sentinel_heads: vec![sentinel],
    };
    let short = |commit: Oid| commit.to_string()[..7].to_owned();
    daemon.wait_sentinel("the first publication", |body| {
        body.contains(&short(sentinel))
    });
    let first = daemon.cost(started);

    let started = Instant::now();
    let docs = daemon
        .repo
        .commit("main", "docs", &[write("README.md", "# topologies\n")]);
    daemon.planned_against(docs, refs);
    let sentinel = push(&daemon.repo, SENTINEL, &[write("notes/round.txt", "1")]);
    daemon.sentinel_heads.push(sentinel);
    daemon.wait_sentinel("the push changing no plan", |body| {
        body.contains(&short(sentinel))
    });
    let no_change = daemon.cost(started);

    let started = Instant::now();
    daemon.repo.commit("main", "orders stricter", &[clean(2)]);
    daemon.wait_sentinel("the push changing plans", |body| {
        body.contains("select(.v > 2)")
    });
    let change = daemon.cost(started);

    daemon.process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(daemon.process.wait_exit(PATIENCE).is_some(), "SIGTERM");
    let started = Instant::now();
    daemon.spawn();
    let sentinel_comments = format!("GET /api/v3/repos/{GITHUB_REPO}/issues/{SENTINEL}/comments");
    wait_until("the restart looked at the sentinel", PATIENCE, || {
        daemon.forge.lines().contains(&sentinel_comments)
    });
    let restart = daemon.cost(started);
    daemon.forge.assert_clean();
    daemon.process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(daemon.process.wait_exit(PATIENCE).is_some(), "SIGTERM");
    Run {
        first,
        no_change,
        change,
        restart,
    }
}

/// A row of the table: what happened, how many open pull requests' plans it changed, and
/// its cost in a run.
type Phase = (&'static str, String, fn(&Run) -> Cost);

/// Median, min and max.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// `median (min–max)`, or the median alone when all runs agree.
fn cell(values: Vec<f64>, decimals: usize) -> String {
    let (median, low, high) = spread(values);
    if low == high {
        format!("{median:.decimals$}")
    } else {
        format!("{median:.decimals$} ({low:.decimals$}–{high:.decimals$})")
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let sizes: Vec<u64> = std::env::var("CLOSED")
        .unwrap_or_else(|_| "0 10 100".into())
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    let current = std::env::var_os("PLUMBER_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_plumber")),
        PathBuf::from,
    );
    let baseline = std::env::var_os("PLUMBER_BASELINE_BIN")
        .filter(|path| !path.is_empty())
        .map(PathBuf::from);
    let mut binaries = vec![("this build", current)];
    binaries.extend(baseline.map(|b| ("baseline", b)));
    for closed in sizes {
        let measured: Vec<(&str, Vec<Run>)> = binaries
            .iter()
            .map(|(label, binary)| {
                let runs: Vec<Run> = (0..runs).map(|_| run(binary, closed)).collect();
                (*label, runs)
            })
            .collect();
        let open = OPEN.len();
        println!("## {closed} closed pull requests, {open} open (+ the sentinel), {runs} runs\n");
        let mut header = String::from("| phase | open PRs whose plan changed |");
        let mut rule = String::from("|---|---:|");
        for (label, _) in &measured {
            header.push_str(&format!(" {label}: requests | writes | s |"));
            rule.push_str("---:|---:|---:|");
        }
        println!("{header}\n{rule}");
        let phases: [Phase; 4] = [
            ("first publication", format!("{open} (new)"), |r| r.first),
            ("push to main changing no plan", "0".into(), |r| r.no_change),
            (
                "push to main changing 2 open PRs' plans (and every closed one's)",
                CHANGED_OPEN.to_string(),
                |r| r.change,
            ),
            ("restart", "0".into(), |r| r.restart),
        ];
        for (phase, changed, cost) in phases {
            let mut line = format!("| {phase} | {changed} |");
            for (_, runs) in &measured {
                let costs: Vec<Cost> = runs.iter().map(cost).collect();
                line.push_str(&format!(
                    " {} | {} | {} |",
                    cell(costs.iter().map(|c| c.requests as f64).collect(), 0),
                    cell(costs.iter().map(|c| c.writes as f64).collect(), 0),
                    cell(costs.iter().map(|c| c.seconds).collect(), 2),
                ));
            }
            println!("{line}");
        }
        println!();
    }
}
