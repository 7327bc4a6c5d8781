//! What a commit over budget costs the daemon (issue 23): `plumber up` (release) on a
//! repository with one topology, its peak RSS (VmHWM) in four conditions, each a fresh daemon,
//! interleaved round by round:
//!
//! - `idle`: the branch applied (no broker: nothing runs) and a branch's plan made, the
//!   baseline;
//! - `bomb on a watched branch`: a branch adds 3,000 step files naming one 1 MiB blob (a push
//!   of about 1 MB, 3 GB read), refused unread; its plan says why;
//! - `bomb on main`: the same on the tracked branch, refused unread;
//! - `300 files, no budget`: a tenth of the bomb with the budget raised out of the way
//!   (`--max-commit-bytes` 100 GB), read and validated: what the budget prevents, scaled down
//!   (the whole bomb took 8.9 GB before the budget, too much for this machine to repeat).
//!
//! Medians and ranges of ROUNDS rounds (default 3). `bash bench/trust.sh` writes
//! bench/results/trust.md.

#![allow(clippy::expect_used, clippy::unwrap_used)] // a broken benchmark setup should stop loudly

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{TestRepo, bomb, write};
use plumber_testkit::{Process, Usage, free_port, wait_until};
use serde_json::Value;

const PATIENCE: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, PartialEq)]
enum Condition {
    Idle,
    BombOnBranch,
    BombOnMain,
    Unbudgeted,
}

impl Condition {
    const ALL: [Condition; 4] = [
        Condition::Idle,
        Condition::BombOnBranch,
        Condition::BombOnMain,
        Condition::Unbudgeted,
    ];

    fn name(self) -> &'static str {
        match self {
            Condition::Idle => "idle (baseline)",
            Condition::BombOnBranch => "bomb on a watched branch (3,000 × 1 MiB), refused",
            Condition::BombOnMain => "bomb on main (3,000 × 1 MiB), refused",
            Condition::Unbudgeted => "300 × 1 MiB, no budget: read and validated",
        }
    }
}

fn get(api: &str, path: &str) -> Option<Value> {
    ureq::get(&format!("{api}{path}"))
        .call()
        .ok()?
        .body_mut()
        .read_json()
        .ok()
}

/// Peak RSS in KiB of a fresh daemon in `condition`.
fn run(condition: Condition) -> u64 {
    let repo = TestRepo::new();
    let main = repo.commit(
        "main",
        "t",
        &[
            write("topologies/t/in.yaml", "kind: source\ntopic: in\n"),
            write(
                "topologies/t/clean.yaml",
                "kind: processor\ninput: in\njq: 'select(.v > 1)'\n",
            ),
            write(
                "topologies/t/out.yaml",
                "kind: sink\ntopic: out\ninput: clean\n",
            ),
        ],
    );
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
    command
        .args(["up", &repo.location(), "--branch", "main"])
        .args(["--bootstrap", "127.0.0.1:1"])
        .arg("--state-dir")
        .arg(state.path().join("state"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if condition == Condition::Unbudgeted {
        command.args(["--max-commit-bytes", "100000000000"]);
    }
    let mut daemon = Process::spawn("plumber up", &mut command);
    let main_sha = main.to_string();
    wait_until("the daemon follows main", PATIENCE, || {
        get(&api, "/api/status").is_some_and(|s| s["commit"] == main_sha.as_str())
    });
    repo.git
        .reference("refs/heads/feature", main, true, "branch")
        .unwrap();
    let head = match condition {
        Condition::Idle => repo.commit(
            "feature",
            "a small change",
            &[write(
                "topologies/t/clean.yaml",
                "kind: processor\ninput: in\njq: 'select(.v > 2)'\n",
            )],
        ),
        Condition::BombOnBranch => bomb(&repo, "feature", 3_000),
        Condition::BombOnMain => bomb(&repo, "main", 3_000),
        Condition::Unbudgeted => bomb(&repo, "feature", 300),
    };
    let head = head.to_string();
    if condition == Condition::BombOnMain {
        wait_until("the bombed head is refused", PATIENCE, || {
            get(&api, "/api/status").is_some_and(|s| s["lastError"]["commit"] == head.as_str())
        });
    } else {
        wait_until("the branch's plan is made", PATIENCE, || {
            get(&api, "/api/plans/refs%2Fheads%2Ffeature")
                .is_some_and(|p| p["head"] == head.as_str())
        });
    }
    let peak = Usage::of(daemon.pid()).peak_rss_kb;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    daemon.wait_exit(PATIENCE);
    peak
}

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let mut peaks: Vec<Vec<u64>> = vec![Vec::new(); Condition::ALL.len()];
    for round in 0..rounds {
        for (c, condition) in Condition::ALL.iter().enumerate() {
            let peak = run(*condition);
            eprintln!("round {round}: {}: {} KiB", condition.name(), peak);
            peaks[c].push(peak);
        }
    }
    let baseline = median(&peaks[0]) as f64;
    println!("| condition | daemon peak RSS, median [range] | ratio to idle |");
    println!("|---|---:|---:|");
    for (c, condition) in Condition::ALL.iter().enumerate() {
        let mb = |kb: u64| kb as f64 / 1024.0;
        let (low, high) = (
            *peaks[c].iter().min().unwrap(),
            *peaks[c].iter().max().unwrap(),
        );
        println!(
            "| {} | {:.1} MB [{:.1}–{:.1}] | {:.2}× |",
            condition.name(),
            mb(median(&peaks[c])),
            mb(low),
            mb(high),
            median(&peaks[c]) as f64 / baseline
        );
    }
}
