//! `plumber up --forge` against the fake GitHub and GitLab of `support/fake_forge.rs`, which
//! checks every request (method, path, query, token header, body, the forge's limits): real
//! git repositories with pull-request refs (`refs/pull/N/head`, `refs/merge-requests/N/head`)
//! made with git2, the real binary, and what it publishes read back from the fake.
//!
//! No broker: the daemon's bootstrap servers answer nothing, so nothing runs and every plan
//! adds its topologies (what is published is what matters here). Every wait is on a condition
//! with a generous timeout; the local repository's watcher notices the refs moving.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;
#[path = "support/fake_forge.rs"]
mod fake_forge;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{TestRepo, write};
use fake_forge::{Fault, GITHUB_REPO, GITLAB_PROJECT, Server, TOKEN};
use git2::Oid;
use hmac::{Hmac, Mac};
use plumber::forge::{Kind, MARKER, PullRequestState};
use plumber_testkit::{Process, wait_until};
use serde_json::Value;
use sha2::Sha256;

const PATIENCE: Duration = Duration::from_secs(60);
const WEBHOOK_SECRET: &str = "hook-s3cret";

fn source(topology: &str) -> common::Change {
    write(
        &format!("topologies/{topology}/sources/in.yaml"),
        format!("kind: source\ntopic: {topology}\n"),
    )
}

fn clean(topology: &str, threshold: u32) -> common::Change {
    write(
        &format!("topologies/{topology}/steps/clean.yaml"),
        format!("kind: processor\ninput: in\njq: 'select(.v > {threshold})'\n"),
    )
}

fn sink(topology: &str, input: &str) -> common::Change {
    write(
        &format!("topologies/{topology}/sinks/out.yaml"),
        format!("kind: sink\ntopic: {topology}-out\ninput: {input}\n"),
    )
}

/// `main` with one topology, `orders` (source → clean → sink).
fn repository() -> (TestRepo, Oid) {
    let repo = TestRepo::new();
    let main = repo.commit(
        "main",
        "orders",
        &[
            source("orders"),
            clean("orders", 1),
            sink("orders", "clean"),
        ],
    );
    (repo, main)
}

/// The pull-request ref of `number` for `kind`.
fn pull_ref(kind: Kind, number: u64) -> String {
    match kind {
        Kind::GitHub => format!("refs/pull/{number}/head"),
        Kind::GitLab => format!("refs/merge-requests/{number}/head"),
    }
}

/// Commits `changes` on the pull request's own branch (`pr-N`, from `main`) and points its
/// pull-request ref there, as the forge does on a push.
fn push(repo: &TestRepo, kind: Kind, number: u64, changes: &[common::Change]) -> Oid {
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
        .reference(&pull_ref(kind, number), head, true, "pull request")
        .unwrap();
    head
}

/// `plumber up --forge KIND` on a repository, with the fake forge and a webhook secret.
struct Setup {
    kind: Kind,
    repo: TestRepo,
    forge: Server,
    daemon: Process,
    api: String,
    state: tempfile::TempDir,
    more: Vec<std::ffi::OsString>,
}

impl Setup {
    fn start(kind: Kind) -> Setup {
        Setup::start_with(kind, &[])
    }

    /// [`Setup::start`] with more arguments for `plumber up`.
    fn start_with(kind: Kind, more: &[std::ffi::OsString]) -> Setup {
        Setup::start_on(kind, repository().0, Server::start(kind), more)
    }

    /// `plumber up` with the fake forge and no webhook secret: anyone may post.
    fn start_unsigned(kind: Kind, more: &[std::ffi::OsString]) -> Setup {
        Setup::start_on_with(kind, repository().0, Server::start(kind), more, false)
    }

    /// [`Setup::start_with`] on `repo`, with `forge` as it is.
    fn start_on(kind: Kind, repo: TestRepo, forge: Server, more: &[std::ffi::OsString]) -> Setup {
        Setup::start_on_with(kind, repo, forge, more, true)
    }

    /// [`Setup::start_on`], with a webhook secret or without one.
    fn start_on_with(
        kind: Kind,
        repo: TestRepo,
        forge: Server,
        more: &[std::ffi::OsString],
        secret: bool,
    ) -> Setup {
        let state = tempfile::tempdir().unwrap();
        std::fs::write(state.path().join("token"), format!("{TOKEN}\n")).unwrap();
        if secret {
            std::fs::write(state.path().join("webhook-secret"), WEBHOOK_SECRET).unwrap();
        }
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let api = format!("http://127.0.0.1:{port}");
        let daemon = spawn(kind, &repo, &forge, state.path(), &api, more, "");
        Setup {
            kind,
            repo,
            forge,
            daemon,
            api,
            state,
            more: more.to_vec(),
        }
    }

    /// Stops the daemon (SIGTERM) and starts it again on the same state directory.
    fn restart(&mut self) {
        self.daemon.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(
            self.daemon.wait_exit(PATIENCE).is_some(),
            "the daemon stops on SIGTERM"
        );
        self.daemon = spawn(
            self.kind,
            &self.repo,
            &self.forge,
            self.state.path(),
            &self.api,
            &self.more,
            ".2",
        );
    }

    /// An open pull request the forge knows (with no comment yet).
    fn open(&self, number: u64) {
        open(&self.forge, number);
    }

    fn plan_comments(&self, number: u64) -> Vec<fake_forge::Comment> {
        self.forge
            .comments(number)
            .into_iter()
            .filter(|c| c.body.starts_with(MARKER))
            .collect()
    }

    /// Waits until pull request `number` has a plan comment for which `check` holds.
    fn comment_where(&self, number: u64, what: &str, check: impl Fn(&str) -> bool) -> String {
        let mut body = String::new();
        wait_until(what, PATIENCE, || {
            match self.plan_comments(number).as_slice() {
                [comment] if check(&comment.body) => {
                    body = comment.body.clone();
                    true
                }
                [_] | [] => false,
                more => panic!("{} plan comments on {number}: {more:#?}", more.len()),
            }
        });
        body
    }

    /// The statuses set on `head`, oldest first.
    fn statuses_of(&self, head: Oid) -> Vec<Value> {
        self.forge
            .statuses()
            .into_iter()
            .filter(|(sha, _)| *sha == head.to_string())
            .map(|(_, body)| body)
            .collect()
    }

    fn status_of(&self, head: Oid) -> Value {
        let mut found = Value::Null;
        wait_until(&format!("a status on {head}"), PATIENCE, || {
            found = self.statuses_of(head).pop().unwrap_or_default();
            !found.is_null()
        });
        found
    }

    fn comments_path(&self, number: u64) -> String {
        match self.kind {
            Kind::GitHub => format!("/api/v3/repos/{GITHUB_REPO}/issues/{number}/comments"),
            Kind::GitLab => {
                format!("/api/v4/projects/{GITLAB_PROJECT}/merge_requests/{number}/notes")
            }
        }
    }

    /// The comment writes of pull request `number`: (creations, updates).
    fn writes(&self, number: u64) -> (usize, usize) {
        let path = self.comments_path(number);
        let requests = self.forge.requests();
        let created = requests
            .iter()
            .filter(|r| r.method == "POST" && r.path == path)
            .count();
        let updated = requests
            .iter()
            .filter(|r| match self.kind {
                Kind::GitHub => {
                    r.method == "PATCH"
                        && r.path
                            .starts_with(&format!("/api/v3/repos/{GITHUB_REPO}/issues/comments/"))
                }
                Kind::GitLab => r.method == "PUT" && r.path.starts_with(&format!("{path}/")),
            })
            .count();
        (created, updated)
    }

    /// Waits until each of the `count` watched refs is planned against `base` (its plan
    /// announced: the publisher reads plans in the order they were made).
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

    /// What the fake records for a status on `head` and for an update of comment `id` of
    /// pull request `number`.
    fn status_line(&self, head: Oid) -> String {
        match self.kind {
            Kind::GitHub => format!("POST /api/v3/repos/{GITHUB_REPO}/statuses/{head}"),
            Kind::GitLab => format!("POST /api/v4/projects/{GITLAB_PROJECT}/statuses/{head}"),
        }
    }

    fn update_line(&self, number: u64, id: u64) -> String {
        match self.kind {
            Kind::GitHub => format!("PATCH /api/v3/repos/{GITHUB_REPO}/issues/comments/{id}"),
            Kind::GitLab => format!("PUT {}/{id}", self.comments_path(number)),
        }
    }

    /// The id of pull request `number`'s plan comment.
    fn comment_id(&self, number: u64) -> u64 {
        match self.plan_comments(number).as_slice() {
            [comment] => comment.id,
            other => panic!("{} plan comments on {number}: {other:#?}", other.len()),
        }
    }

    /// A signed webhook saying pull request `number` is `action` (GitHub's word).
    fn pull_request_hook(&self, number: u64, action: &str) -> u16 {
        let (event, body) = match self.kind {
            Kind::GitHub => (
                ("x-github-event", "pull_request".to_owned()),
                format!(
                    r#"{{"action":"{action}","number":{number},"pull_request":{{"number":{number}}}}}"#
                ),
            ),
            Kind::GitLab => {
                let action = match action {
                    "closed" => "close",
                    "reopened" => "reopen",
                    other => other,
                };
                (
                    ("x-gitlab-event", "Merge Request Hook".to_owned()),
                    format!(
                        r#"{{"object_kind":"merge_request","object_attributes":{{"iid":{number},"action":"{action}"}}}}"#
                    ),
                )
            }
        };
        let proof = match self.kind {
            Kind::GitHub => ("x-hub-signature-256", signed(&body)),
            Kind::GitLab => ("x-gitlab-token", WEBHOOK_SECRET.to_owned()),
        };
        self.hook(&[event, proof], &body)
    }

    fn hook(&self, headers: &[(&str, String)], body: &str) -> u16 {
        let mut request = ureq::post(&format!("{}/hooks/git", self.api))
            .config()
            .http_status_as_error(false)
            .build();
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request.send(body).unwrap().status().as_u16()
    }

    /// What the forge was asked about pull request `number` (its comments, itself), from its
    /// `from`th request on.
    fn requests_about(&self, number: u64, from: usize) -> Vec<String> {
        let within = [
            format!("/issues/{number}/"),
            format!("/merge_requests/{number}/"),
        ];
        let itself = [
            format!("/pulls/{number}"),
            format!("/merge_requests/{number}"),
        ];
        self.forge
            .requests()
            .iter()
            .skip(from)
            .filter(|r| {
                within.iter().any(|w| r.path.contains(w.as_str()))
                    || itself.iter().any(|i| r.path.ends_with(i.as_str()))
                    // A GitHub comment updated is named by its id alone.
                    || r.path.contains("/issues/comments/")
            })
            .map(|r| r.line())
            .collect()
    }

    /// Whether the forge was asked for pull request `number` itself (what deciding its
    /// preview does).
    fn pull_request_read(&self, number: u64) -> bool {
        self.requests_about(number, 0).iter().any(|line| {
            line.starts_with("GET")
                && (line.ends_with(&format!("/pulls/{number}"))
                    || line.ends_with(&format!("/merge_requests/{number}")))
        })
    }

    /// The `plumber_webhooks_total` of `outcome`.
    fn webhooks(&self, outcome: &str) -> u64 {
        let metrics = ureq::get(&format!("{}/metrics", self.api))
            .call()
            .unwrap()
            .into_body()
            .read_to_string()
            .unwrap();
        let line = format!("plumber_webhooks_total{{outcome=\"{outcome}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map_or(0, |n| n.trim().parse().unwrap())
    }

    /// Pushes pull request `number` and waits until its comment is there and, with
    /// `previews`, until the previews thread asked the forge about it: both threads read
    /// their requests before plan changes, so whatever was asked of them before is done.
    fn sign_post(&self, number: u64, previews: bool) {
        self.open(number);
        let head = push(
            &self.repo,
            self.kind,
            number,
            &[clean("orders", 40 + number as u32)],
        );
        self.comment_where(number, "the sign-post's comment", |body| {
            body.contains(&short(head))
        });
        if previews {
            wait_until("the previews thread read the sign-post", PATIENCE, || {
                self.pull_request_read(number)
            });
        }
    }

    fn output(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.state.path().join(name)).unwrap_or_default();
        ["stdout", "stderr", "stdout.2", "stderr.2"]
            .iter()
            .map(|name| read(name))
            .collect()
    }

    /// Stops the daemon (SIGTERM) and checks what it said and asked of the forge.
    fn finish(mut self) -> String {
        self.daemon.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(
            self.daemon.wait_exit(PATIENCE).is_some(),
            "the daemon stops on SIGTERM"
        );
        self.forge.assert_clean();
        let output = self.output();
        assert!(
            !output.contains(TOKEN),
            "the token is in the daemon's output"
        );
        assert!(
            output.contains("commit status set"),
            "the daemon logs what it publishes: {output}"
        );
        output
    }
}

/// `plumber up` on `repo` with `forge`, listening at `api`, its state, token and webhook
/// secret in `state`, its output in `stdout{suffix}` and `stderr{suffix}` there.
fn spawn(
    kind: Kind,
    repo: &TestRepo,
    forge: &Server,
    state: &std::path::Path,
    api: &str,
    more: &[std::ffi::OsString],
    suffix: &str,
) -> Process {
    let forge_name = match kind {
        Kind::GitHub => "github",
        Kind::GitLab => "gitlab",
    };
    let output = |name: &str| std::fs::File::create(state.join(format!("{name}{suffix}"))).unwrap();
    Process::spawn(
        "plumber up",
        Command::new(env!("CARGO_BIN_EXE_plumber"))
            .args(["up", &repo.location(), "--branch", "main"])
            .args(["--bootstrap", "127.0.0.1:1"])
            .arg("--state-dir")
            .arg(state.join("state"))
            .args(["--listen", api.trim_start_matches("http://")])
            .args(["--watch-refs", &pull_ref(kind, 0).replace("/0/", "/*/")])
            .args(["--forge", forge_name, "--forge-url", &forge.url])
            .args(["--forge-repo", GITHUB_REPO])
            .arg("--forge-token-file")
            .arg(state.join("token"))
            // A setup without a secret has no file of it.
            .args(
                state
                    .join("webhook-secret")
                    .is_file()
                    .then(|| {
                        [
                            "--webhook-secret-file".into(),
                            state.join("webhook-secret").into_os_string(),
                        ]
                    })
                    .into_iter()
                    .flatten()
                    .collect::<Vec<std::ffi::OsString>>(),
            )
            .args(["--public-url", api])
            .args(more)
            // Everything the daemon says, the forge clients' debug lines included, is
            // searched for the token.
            .env("RUST_LOG", "debug,librdkafka=warn")
            .stdin(Stdio::null())
            .stdout(output("stdout"))
            .stderr(output("stderr")),
    )
}

/// Pull request `number` is open on `forge` (with no comment yet).
fn open(forge: &Server, number: u64) {
    forge.seed(number, 0, None, "");
    forge.set_pull_request(number, PullRequestState::Open, &[]);
}

fn short(commit: Oid) -> String {
    commit.to_string()[..7].to_owned()
}

fn signed(body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(WEBHOOK_SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Forge writes proportional to change (issue 23), before the fix one write per watched
/// pull request on every push to main and at every start. Pull requests 10 to 59 are closed (every
/// fifth merged), 7 and 8 open, and 9 open too: the sentinel. Plans are made in ref order
/// (`refs/pull/9/head` is last) and published in the order they were made, so once 9's
/// comment shows what a round changed in it (or a push to it after every plan was made
/// against the round's base), the round was published; the requests since the last round are
/// then compared with what the round changed.
fn a_push_to_main_writes_only_on_open_pull_requests_whose_plan_changed(kind: Kind) {
    let (repo, _) = repository();
    let forge = Server::start(kind);
    let mut closed = Vec::new();
    for number in 10..60 {
        closed.push(push(
            &repo,
            kind,
            number,
            &[clean("orders", 100 + number as u32)],
        ));
        let state = if number % 5 == 0 {
            PullRequestState::Merged
        } else {
            PullRequestState::Closed
        };
        forge.seed(number, 0, None, "");
        forge.set_pull_request(number, state, &[]);
    }
    let seven = push(&repo, kind, 7, &[clean("orders", 5)]);
    let eight = push(&repo, kind, 8, &[clean("orders", 9)]);
    let mut sentinel = push(&repo, kind, 9, &[write("notes/round.txt", "0")]);
    for number in [7, 8, 9] {
        open(&forge, number);
    }
    let mut setup = Setup::start_on(kind, repo, forge, &[]);
    setup.comment_where(9, "the sentinel's first comment", |body| {
        body.contains(&short(sentinel))
    });
    for number in [7, 8] {
        setup.comment_where(number, "an open pull request's comment", |_| true);
    }
    let ids = [7, 8, 9].map(|number| setup.comment_id(number));
    let no_closed_one_touched = |setup: &Setup| {
        for (number, head) in (10..60).zip(&closed) {
            assert!(
                setup.forge.comments(number).is_empty(),
                "{number} commented"
            );
            assert!(setup.statuses_of(*head).is_empty(), "{number} has a status");
        }
        let lines = setup.forge.lines();
        for number in 10..60 {
            let mentions = |line: &&String| {
                line.contains(&format!("/{number}/")) || line.ends_with(&format!("/{number}"))
            };
            assert!(
                !lines.iter().any(|l| mentions(&l)),
                "{number} asked about: {lines:#?}"
            );
        }
    };
    no_closed_one_touched(&setup);
    setup.forge.clear_requests();

    // A push to main that changes no plan: the sentinel, pushed to after it, is all that is
    // written (the base in every plan moved; before issue 23 every comment was rewritten).
    let docs = setup
        .repo
        .commit("main", "docs", &[write("README.md", "# topologies\n")]);
    setup.planned_against(docs, 53);
    sentinel = push(&setup.repo, kind, 9, &[write("notes/round.txt", "1")]);
    setup.comment_where(9, "the sentinel's comment, round 1", |body| {
        body.contains(&short(sentinel))
    });
    assert_eq!(
        setup.forge.lines(),
        [setup.status_line(sentinel), setup.update_line(9, ids[2])],
        "no write (and no read) for the closed pull requests nor for 7 and 8"
    );
    setup.forge.clear_requests();

    // A push to main that makes 7 and 8 (and every closed one) conflict: exactly 7's and 8's
    // status and comment, once each; the sentinel's plan shows main's new `clean`.
    setup
        .repo
        .commit("main", "orders stricter", &[clean("orders", 2)]);
    setup.comment_where(9, "the sentinel's comment, round 2", |body| {
        body.contains("select(.v > 2)")
    });
    assert_eq!(
        setup.forge.lines(),
        [
            setup.status_line(seven),
            setup.update_line(7, ids[0]),
            setup.status_line(eight),
            setup.update_line(8, ids[1]),
            setup.update_line(9, ids[2]),
        ]
    );
    for number in [7, 8] {
        setup.comment_where(number, "the conflict", |body| body.contains("conflicts in"));
    }
    no_closed_one_touched(&setup);

    // A restart: the open pull requests listed and each open one's comment looked at, which
    // says its plan already (and so that its status was set): nothing written.
    setup.forge.clear_requests();
    setup.restart();
    let comments_of_nine = format!("GET {}", setup.comments_path(9));
    wait_until("the sentinel's comment is looked at", PATIENCE, || {
        setup.forge.lines().contains(&comments_of_nine)
    });
    let lines = setup.forge.lines();
    assert!(lines.iter().all(|l| l.starts_with("GET ")), "{lines:#?}");
    assert_eq!(
        lines.len(),
        5,
        "/user, the listing, 3 comment pages: {lines:#?}"
    );
    no_closed_one_touched(&setup);

    // 8 closed by a webhook (the forge still lists it open): main taking 8's change clears
    // its conflict, and nothing is written on it.
    assert_eq!(setup.pull_request_hook(8, "closed"), 202);
    setup.forge.clear_requests();
    setup
        .repo
        .commit("main", "orders as 8 has it", &[clean("orders", 9)]);
    setup.comment_where(9, "the sentinel's comment, round 4", |body| {
        body.contains("select(.v > 9)")
    });
    assert_eq!(setup.forge.lines(), [setup.update_line(9, ids[2])]);
    assert!(setup.plan_comments(8)[0].body.contains("conflicts in"));
    setup.finish();
}

#[test]
fn github_a_push_to_main_writes_only_on_open_pull_requests_whose_plan_changed() {
    a_push_to_main_writes_only_on_open_pull_requests_whose_plan_changed(Kind::GitHub);
}

#[test]
fn gitlab_a_push_to_main_writes_only_on_open_merge_requests_whose_plan_changed() {
    a_push_to_main_writes_only_on_open_pull_requests_whose_plan_changed(Kind::GitLab);
}

/// (a) one comment and a success status; (b) a new head updates the comment in place and
/// gets its own status.
fn a_pull_request_gets_one_comment_updated_in_place_and_a_status_per_head(kind: Kind) {
    let setup = Setup::start(kind);
    setup.open(1);
    let first = push(&setup.repo, kind, 1, &[clean("orders", 5)]);
    let body = setup.comment_where(1, "the plan comment of the first head", |body| {
        body.contains(&short(first))
    });
    assert!(body.contains("### Plumber plan"), "{body}");
    assert!(body.contains("`orders`"), "{body}");
    let status = setup.status_of(first);
    assert_eq!(status["state"], "success", "{status}");
    let description = status["description"].as_str().unwrap();
    assert!(
        description.starts_with("valid; 1 topology changes"),
        "{description}"
    );
    let link = status["target_url"].as_str().unwrap();
    let expected = format!(
        "{}/api/plans/{}",
        setup.api,
        pull_ref(kind, 1).replace('/', "%2F")
    );
    assert_eq!(link, expected);
    let linked = ureq::get(link)
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    assert!(
        linked.contains(&first.to_string()),
        "the link shows the plan: {linked}"
    );
    assert_eq!(setup.writes(1), (1, 0), "created once");

    let second = push(&setup.repo, kind, 1, &[clean("orders", 9)]);
    setup.comment_where(1, "the plan comment of the new head", |body| {
        body.contains(&short(second))
    });
    let status = setup.status_of(second);
    assert_eq!(status["state"], "success", "{status}");
    let (created, updated) = setup.writes(1);
    assert_eq!(created, 1, "never a second comment");
    assert!(updated >= 1, "updated in place");
    assert_eq!(setup.statuses_of(first).len(), 1, "one status per head");
    let get = |path: &str| {
        ureq::get(&format!("{}{path}", setup.api))
            .call()
            .unwrap()
            .into_body()
            .read_to_string()
            .unwrap()
    };
    let status: Value = serde_json::from_str(&get("/api/status")).unwrap();
    let forge = &status["forge"];
    assert_eq!(forge["kind"], kind.to_string(), "{status}");
    assert_eq!(forge["repo"], GITHUB_REPO);
    assert!(forge["published"].as_u64().unwrap() >= 4, "{forge}");
    assert_eq!(forge["lastPublished"]["ref"], pull_ref(kind, 1), "{forge}");
    assert!(forge["lastError"].is_null(), "{forge}");
    let metrics = get("/metrics");
    assert!(
        metrics.contains("plumber_forge_publications_total"),
        "{metrics}"
    );
    setup.finish();
}

#[test]
fn github_pull_request_gets_one_comment_updated_in_place_and_a_status_per_head() {
    a_pull_request_gets_one_comment_updated_in_place_and_a_status_per_head(Kind::GitHub);
}

#[test]
fn gitlab_merge_request_gets_one_note_updated_in_place_and_a_status_per_head() {
    a_pull_request_gets_one_comment_updated_in_place_and_a_status_per_head(Kind::GitLab);
}

/// (c) an invalid head: a failure status naming the file of the first error, and the comment
/// says what is wrong. (d) a burst of 502s, then the forge answers: one comment all the same.
/// A merge that conflicts fails naming the files.
fn an_invalid_head_fails_and_a_502_burst_still_ends_with_one_comment(kind: Kind) {
    let setup = Setup::start(kind);
    setup.open(2);
    let broken = push(
        &setup.repo,
        kind,
        2,
        &[write(
            "topologies/orders/steps/enrich.yaml",
            "kind: processor\ninput: nowhere\njq: '.'\n",
        )],
    );
    let status = setup.status_of(broken);
    let failed = match kind {
        Kind::GitHub => "failure",
        Kind::GitLab => "failed",
    };
    assert_eq!(status["state"], failed, "{status}");
    let description = status["description"].as_str().unwrap();
    assert!(
        description.starts_with("topologies/orders/steps/enrich.yaml:"),
        "the first error and its file: {description}"
    );
    let body = setup.comment_where(2, "the comment of the invalid head", |_| true);
    assert!(body.contains("cannot be merged"), "{body}");
    assert!(body.contains("enrich.yaml"), "{body}");

    // The next three requests answer 502 (what the fake injects: before any effect).
    setup.open(3);
    for later in 0..3 {
        setup.forge.fail(later, Fault::status(502));
    }
    let head = push(&setup.repo, kind, 3, &[clean("orders", 7)]);
    setup.comment_where(3, "the comment after the 502s", |body| {
        body.contains(&short(head))
    });
    assert_eq!(setup.status_of(head)["state"], "success");
    assert!(
        setup.forge.fake().faults.is_empty(),
        "every injected 502 was answered"
    );
    assert_eq!(setup.writes(3).0, 1, "one comment");
    assert_eq!(setup.statuses_of(head).len(), 1);

    // The branch moves under pull request 3: it now conflicts, and its head says where.
    setup
        .repo
        .commit("main", "orders stricter on main", &[clean("orders", 2)]);
    let mut description = String::new();
    wait_until("pull request 3 fails on the conflict", PATIENCE, || {
        let last = setup.statuses_of(head).pop().unwrap_or_default();
        description = last["description"].as_str().unwrap_or("").to_owned();
        last["state"] == failed
    });
    assert_eq!(
        description,
        "merge conflicts in topologies/orders/steps/clean.yaml"
    );
    let output = setup.finish();
    assert!(
        output.contains("forge request failed; retrying"),
        "{output}"
    );
}

#[test]
fn github_an_invalid_head_fails_and_a_502_burst_still_ends_with_one_comment() {
    an_invalid_head_fails_and_a_502_burst_still_ends_with_one_comment(Kind::GitHub);
}

#[test]
fn gitlab_an_invalid_head_fails_and_a_502_burst_still_ends_with_one_note() {
    an_invalid_head_fails_and_a_502_burst_still_ends_with_one_comment(Kind::GitLab);
}

/// (e) a verified pull-request webhook publishes the plan again (the comment was deleted);
/// a webhook with a wrong signature gets 401 and causes nothing.
fn a_pull_request_webhook_publishes_again_and_a_bad_signature_nothing(kind: Kind) {
    let setup = Setup::start(kind);
    setup.open(1);
    let head = push(&setup.repo, kind, 1, &[clean("orders", 5)]);
    setup.comment_where(1, "the plan comment", |_| true);
    setup.status_of(head);
    // Someone deletes the comment.
    setup.forge.fake().comments.get_mut(&1).unwrap().clear();

    let (event, body) = match kind {
        Kind::GitHub => (
            ("x-github-event", "pull_request".to_owned()),
            r#"{"action":"synchronize","number":1,"pull_request":{"number":1}}"#,
        ),
        Kind::GitLab => (
            ("x-gitlab-event", "Merge Request Hook".to_owned()),
            r#"{"object_kind":"merge_request","object_attributes":{"iid":1,"action":"update"}}"#,
        ),
    };
    let wrong = match kind {
        Kind::GitHub => ("x-hub-signature-256", signed("another body")),
        Kind::GitLab => ("x-gitlab-token", "not-the-secret".to_owned()),
    };
    assert_eq!(setup.hook(&[event.clone(), wrong], body), 401);
    // A republish it had asked for would come before the plan of a pull request pushed after
    // (the publisher reads requests first): pull request 4's comment is the sign it did not.
    setup.open(4);
    push(&setup.repo, kind, 4, &[clean("orders", 6)]);
    setup.comment_where(4, "pull request 4's comment", |_| true);
    assert!(
        setup.plan_comments(1).is_empty(),
        "a refused webhook republished pull request 1"
    );

    let right = match kind {
        Kind::GitHub => ("x-hub-signature-256", signed(body)),
        Kind::GitLab => ("x-gitlab-token", WEBHOOK_SECRET.to_owned()),
    };
    assert_eq!(setup.hook(&[event, right], body), 202);
    setup.comment_where(1, "the comment put back by the webhook", |body| {
        body.contains(&short(head))
    });
    assert_eq!(setup.writes(1).0, 2, "created again, once");
    let output = setup.finish();
    assert!(output.contains("webhook refused"), "{output}");
}

#[test]
fn github_a_pull_request_webhook_publishes_again_and_a_bad_signature_nothing() {
    a_pull_request_webhook_publishes_again_and_a_bad_signature_nothing(Kind::GitHub);
}

#[test]
fn gitlab_a_merge_request_webhook_publishes_again_and_a_bad_token_nothing() {
    a_pull_request_webhook_publishes_again_and_a_bad_signature_nothing(Kind::GitLab);
}

/// A plan longer than a GitHub comment takes is shortened to fit, whole sections only.
#[test]
fn github_a_plan_over_the_comment_limit_is_shortened_to_fit() {
    let kind = Kind::GitHub;
    let setup = Setup::start(kind);
    setup.open(5);
    let many: Vec<common::Change> = (0..120)
        .flat_map(|i| {
            let name = format!("t{i:03}");
            [source(&name), clean(&name, i), sink(&name, "clean")]
        })
        .collect();
    let head = push(&setup.repo, kind, 5, &many);
    let body = setup.comment_where(5, "the shortened comment", |_| true);
    let full = ureq::get(&format!(
        "{}/api/plans/{}?format=markdown",
        setup.api,
        pull_ref(kind, 5).replace('/', "%2F")
    ))
    .call()
    .unwrap()
    .into_body()
    .with_config()
    .limit(16 * 1024 * 1024)
    .read_to_string()
    .unwrap();
    assert!(
        full.chars().count() > kind.comment_limit(),
        "the test's plan is over the limit: {} characters",
        full.chars().count()
    );
    assert!(body.chars().count() <= kind.comment_limit());
    assert!(
        body.contains("Shortened to fit"),
        "{}",
        &body[body.len() - 500..]
    );
    assert_eq!(setup.status_of(head)["state"], "success");
    setup.finish();
}

/// A token file that cannot be read stops `plumber up` at start, naming the file (exit 2).
#[test]
fn a_tracked_head_no_trusted_key_signed_gets_a_failing_status_saying_what_to_do() {
    // A directory trusting one SSH key (made here), and a branch whose head nobody signed.
    let keys = tempfile::tempdir().unwrap();
    let generated = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "alice", "-f"])
        .arg(keys.path().join("alice"))
        .status()
        .unwrap();
    assert!(generated.success());
    std::fs::remove_file(keys.path().join("alice")).unwrap();
    let setup = Setup::start_with(
        Kind::GitHub,
        &["--trusted-keys".into(), keys.path().as_os_str().to_owned()],
    );
    let head = setup.repo.git.refname_to_id("refs/heads/main").unwrap();
    let status = setup.status_of(head);
    assert_eq!(status["state"], "failure", "{status}");
    let description = status["description"].as_str().unwrap();
    assert!(
        description.contains("is not signed") && description.contains("sign it"),
        "{description}"
    );
    assert_eq!(setup.statuses_of(head).len(), 1, "one status per head");
    setup.finish();
}

#[test]
fn a_missing_token_file_stops_the_daemon_at_start_naming_it() {
    let (repo, _) = repository();
    let state = tempfile::tempdir().unwrap();
    let missing: PathBuf = state.path().join("no-such-token");
    let stderr_file = state.path().join("stderr");
    let mut daemon = Process::spawn(
        "plumber up",
        Command::new(env!("CARGO_BIN_EXE_plumber"))
            .args(["up", &repo.location(), "--branch", "main"])
            .arg("--state-dir")
            .arg(state.path().join("state"))
            .args(["--listen", "127.0.0.1:0"])
            .args(["--forge", "github", "--forge-repo", GITHUB_REPO])
            .arg("--forge-token-file")
            .arg(&missing)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_file).unwrap()),
    );
    let exit = daemon
        .wait_exit(PATIENCE)
        .expect("the daemon stops at start");
    assert_eq!(exit.code(), Some(2));
    let stderr = std::fs::read_to_string(&stderr_file).unwrap();
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert_eq!(
        error.matches("No such file or directory").count(),
        1,
        "the cause once: {error}"
    );
}

/// The pull-request webhook of `kind` for `number` (`action` as the forge names it).
fn pull_request_hook(kind: Kind, number: u64, action: &str) -> ((&'static str, String), String) {
    match kind {
        Kind::GitHub => (
            ("x-github-event", "pull_request".to_owned()),
            format!(
                r#"{{"action":"{action}","number":{number},"pull_request":{{"number":{number}}}}}"#
            ),
        ),
        Kind::GitLab => (
            ("x-gitlab-event", "Merge Request Hook".to_owned()),
            format!(
                r#"{{"object_kind":"merge_request","object_attributes":{{"iid":{number},"action":"{action}"}}}}"#
            ),
        ),
    }
}

/// Without a webhook secret anyone can post to `/hooks/git`. Before, each unsigned
/// pull-request webhook had the daemon publish that pull request's plan again and decide its
/// preview, both asking the forge (a forge write per post). Now 1,000 of them only fetch: the
/// forge hears nothing about the pull request, and the daemon said at start that it has no
/// secret.
#[test]
fn unsigned_webhooks_only_fetch_never_a_forge_request() {
    let kind = Kind::GitHub;
    let setup = Setup::start_unsigned(
        kind,
        &[
            "--preview-label".into(),
            "preview".into(),
            // No periodic look at previews during the test: what asks the forge is the posts.
            "--poll-interval".into(),
            "3600".into(),
        ],
    );
    setup.open(1);
    setup.forge.set_pull_request(1, PullRequestState::Open, &[]);
    let head = push(&setup.repo, kind, 1, &[clean("orders", 5)]);
    setup.comment_where(1, "the plan comment", |body| body.contains(&short(head)));
    setup.status_of(head);
    wait_until(
        "the preview of pull request 1 was decided",
        PATIENCE,
        || setup.pull_request_read(1),
    );
    let mark = setup.forge.requests().len();

    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    for n in 0..1000 {
        let action = if n % 2 == 0 { "synchronize" } else { "labeled" };
        let (event, body) = pull_request_hook(kind, 1, action);
        let status = agent
            .post(&format!("{}/hooks/git", setup.api))
            .header(event.0, &event.1)
            .send(&body)
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(status, 202, "post {n}");
    }
    setup.sign_post(4, true);
    let asked = setup.requests_about(1, mark);
    assert!(
        asked.is_empty(),
        "unsigned webhooks made the daemon ask the forge {} times about pull request 1: {:?} …",
        asked.len(),
        &asked[..asked.len().min(4)]
    );
    assert_eq!(setup.webhooks("unsigned"), 1000);
    let output = setup.finish();
    assert!(output.contains("no webhook secret"), "{output}");
}

/// A signed pull-request webhook captured and posted again: as it was (the same delivery id)
/// it does nothing, under a new id it only fetches. Before, every replay published the plan
/// again. The delivery itself had its one effect: the deleted comment came back, once.
fn a_replayed_signed_webhook_has_one_effect(kind: Kind) {
    let setup = Setup::start(kind);
    setup.open(1);
    let head = push(&setup.repo, kind, 1, &[clean("orders", 5)]);
    setup.comment_where(1, "the plan comment", |_| true);
    setup.status_of(head);
    setup.forge.fake().comments.get_mut(&1).unwrap().clear();

    let (event, body) = pull_request_hook(
        kind,
        1,
        match kind {
            Kind::GitHub => "synchronize",
            Kind::GitLab => "update",
        },
    );
    let signature = match kind {
        Kind::GitHub => ("x-hub-signature-256", signed(&body)),
        Kind::GitLab => ("x-gitlab-token", WEBHOOK_SECRET.to_owned()),
    };
    let delivery = |id: &str| match kind {
        Kind::GitHub => ("x-github-delivery", id.to_owned()),
        Kind::GitLab => ("idempotency-key", id.to_owned()),
    };
    let first = [event.clone(), signature.clone(), delivery("d-1")];
    assert_eq!(setup.hook(&first, &body), 202);
    setup.comment_where(1, "the comment put back by the delivery", |body| {
        body.contains(&short(head))
    });
    for _ in 0..10 {
        assert_eq!(setup.hook(&first, &body), 200, "the same delivery again");
    }
    for n in 0..10 {
        let renamed = [
            event.clone(),
            signature.clone(),
            delivery(&format!("replay-{n}")),
        ];
        assert_eq!(setup.hook(&renamed, &body), 202, "under a new id: a fetch");
    }
    setup.sign_post(4, false);
    assert_eq!(setup.writes(1).0, 2, "created again once, by the delivery");
    assert_eq!(setup.webhooks("pull-request"), 1);
    assert_eq!(setup.webhooks("duplicate"), 10);
    assert_eq!(setup.webhooks("replayed"), 10);
    setup.finish();
}

#[test]
fn github_a_replayed_signed_webhook_has_one_effect() {
    a_replayed_signed_webhook_has_one_effect(Kind::GitHub);
}

#[test]
fn gitlab_a_replayed_signed_webhook_has_one_effect() {
    a_replayed_signed_webhook_has_one_effect(Kind::GitLab);
}

/// Step tests gate a change like its step files: a pull request whose step test fails gets a
/// failing status naming the case's file and line, and its comment says why; merged anyway,
/// the branch's head is refused as an invalid commit would be, and the commit that fixes the
/// test is the one applied.
#[test]
fn a_failing_step_test_fails_the_pull_request_and_its_merge_is_not_applied() {
    let kind = Kind::GitHub;
    let setup = Setup::start(kind);
    let api = setup.api.clone();
    let status = || -> Value {
        let text = ureq::get(&format!("{api}/api/status"))
            .call()
            .ok()
            .and_then(|r| r.into_body().read_to_string().ok())
            .unwrap_or_default();
        serde_json::from_str(&text).unwrap_or_default()
    };
    // `clean` keeps `v > 1`; the case says it keeps 0 too.
    let failing = write(
        "topologies/orders/steps/clean.test.yaml",
        "cases:\n  - name: keeps a big one\n    input: { value: { v: 5 } }\n    output: [{ value: { v: 5 } }]\n  - name: keeps zero\n    input: { value: { v: 0 } }\n    output: [{ value: { v: 0 } }]\n",
    );
    setup.open(4);
    let head = push(&setup.repo, kind, 4, &[failing]);
    let state = setup.status_of(head);
    assert_eq!(state["state"], "failure", "{state}");
    let description = state["description"].as_str().unwrap();
    assert!(
        description.starts_with(
            "topologies/orders/steps/clean.test.yaml:5: step test `keeps zero` of `clean` failed"
        ),
        "the failed case, at its line: {description}"
    );
    let body = setup.comment_where(4, "the comment of the failing test", |_| true);
    assert!(
        body.contains("step test `keeps zero` of `clean` failed"),
        "{body}"
    );

    // Merged all the same: main's head is refused, and says why.
    setup
        .repo
        .git
        .reference("refs/heads/main", head, true, "merged")
        .unwrap();
    let refused = head.to_string();
    wait_until("the merged head is refused", PATIENCE, || {
        status()["lastError"]["commit"] == refused.as_str()
    });
    let shown = status();
    let message = shown["lastError"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("clean.test.yaml:5:5") && message.contains("test-failed"),
        "{shown}"
    );
    assert_ne!(shown["commit"], refused.as_str(), "not applied: {shown}");

    // The fix is applied.
    let fixed = setup.repo.commit(
        "main",
        "the case expects what clean does",
        &[write(
            "topologies/orders/steps/clean.test.yaml",
            "cases:\n  - name: drops zero\n    input: { value: { v: 0 } }\n    output: []\n",
        )],
    );
    wait_until("the fixed head is taken", PATIENCE, || {
        let s = status();
        s["lastError"].is_null() && s["commit"] == fixed.to_string().as_str()
    });
    setup.finish();
}
