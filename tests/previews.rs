//! Preview environments (SPEC §9) end to end: a broker (tansu unless `PLUMBER_TEST_BOOTSTRAP`
//! names another), a real git repository with a pull-request ref, the fake GitHub of
//! `support/fake_forge.rs` (which checks every request), and `plumber up --preview-label` as a
//! real process running real processors.
//!
//! Tansu cannot delete topics without breaking, so on tansu the daemon runs with
//! `--keep-topics` and the teardown is asserted through processes and status, not topic
//! deletion. Every wait is on a condition with a generous timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;
#[path = "support/fake_forge.rs"]
mod fake_forge;
#[path = "support/up.rs"]
mod up;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestRepo, processor_binary, write};
use fake_forge::{GITHUB_REPO, Server, TOKEN};
use plumber::forge::{Kind, MARKER, PullRequestState};
use plumber_testkit::{Broker, Process, TestRecord, live_instances, unique, wait_until};
use rdkafka::producer::{BaseProducer, Producer as _};
use serde_json::Value;
use up::running_group;

/// A cutover on a slow broker and a busy machine.
const PATIENCE: Duration = Duration::from_secs(180);
const LABEL: &str = "preview";
const WEBHOOK_SECRET: &str = "hook-s3cret";

/// Topology `t`: `in` (the source) → `clean` (tags each record with `by`) → `out`.
fn topology(source: &str, sink: &str, by: &str) -> Vec<common::Change> {
    vec![
        write(
            "topologies/t/sources/in.yaml",
            format!("kind: source\ntopic: {source}\n"),
        ),
        clean(by),
        write(
            "topologies/t/sinks/out.yaml",
            format!("kind: sink\ntopic: {sink}\ninput: clean\n"),
        ),
    ]
}

fn clean(by: &str) -> common::Change {
    write(
        "topologies/t/steps/clean.yaml",
        format!("kind: processor\ninput: in\njq: '. + {{by: \"{by}\"}}'\n"),
    )
}

struct Daemon {
    process: Process,
    api: String,
}

impl Daemon {
    /// `plumber up --preview-label` on `repo`'s main, with `forge` as its GitHub.
    fn start(repo: &TestRepo, broker: &Broker, forge: &Server, state: &std::path::Path) -> Daemon {
        Daemon::start_with(repo, broker, forge, state, &[])
    }

    /// [`Daemon::start`] with more arguments for `plumber up`.
    fn start_with(
        repo: &TestRepo,
        broker: &Broker,
        forge: &Server,
        state: &std::path::Path,
        more: &[&str],
    ) -> Daemon {
        let token_file = state.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let secret_file = state.join("webhook-secret");
        std::fs::write(&secret_file, WEBHOOK_SECRET).unwrap();
        let port = plumber_testkit::free_port();
        let log = state.join("daemon.log");
        eprintln!("daemon log: {}", log.display());
        let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
        command
            .args(["up", &repo.location(), "--branch", "main"])
            .args(["--bootstrap", broker.bootstrap()])
            .arg("--state-dir")
            .arg(state.join("state"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--poll-interval", "1"])
            .args(["--stall-timeout", "15", "--record-timeout", "5"])
            .args(["--watch-refs", "refs/pull/*/head"])
            .args(["--forge", "github", "--forge-url", &forge.url])
            .args(["--forge-repo", GITHUB_REPO])
            .arg("--forge-token-file")
            .arg(&token_file)
            .arg("--webhook-secret-file")
            .arg(&secret_file)
            .args(["--preview-label", LABEL])
            .args(more)
            .env("PLUMBER_PROCESSOR", processor_binary())
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if broker.is_tansu() {
            command.arg("--keep-topics");
            command.env("PLUMBER_ASSIGNOR", "eager");
        }
        Daemon {
            process: Process::spawn("plumber up", &mut command),
            api: format!("http://127.0.0.1:{port}"),
        }
    }

    fn status(&self) -> Option<Value> {
        let mut response = ureq::get(&format!("{}/api/status", self.api)).call().ok()?;
        response.body_mut().read_json().ok()
    }

    /// The status of topology `name` once `condition` holds of it.
    fn wait_topology(&self, name: &str, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        let mut last = Value::Null;
        while Instant::now() < deadline {
            if let Some(status) = self.status() {
                let found = status["topologies"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|t| t["name"] == name)
                    .cloned()
                    .unwrap_or(Value::Null);
                if condition(&found) {
                    return found;
                }
                last = status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out waiting until {what}; last status: {last:#}");
    }

    fn plan(&self, refname: &str) -> Value {
        let mut response = ureq::get(&format!(
            "{}/api/plans/{}",
            self.api,
            refname.replace('/', "%2F")
        ))
        .call()
        .unwrap();
        response.body_mut().read_json().unwrap()
    }

    /// A signed webhook (an unsigned one would only fetch).
    fn hook(&self, event: &str, body: &str) -> u16 {
        use hmac::Mac as _;
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(WEBHOOK_SECRET.as_bytes()).unwrap();
        mac.update(body.as_bytes());
        let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        ureq::post(&format!("{}/hooks/git", self.api))
            .header("x-github-event", event)
            .header("x-hub-signature-256", &signature)
            .send(body)
            .unwrap()
            .status()
            .as_u16()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.process.signal(nix::sys::signal::Signal::SIGTERM);
        let _ = self.process.wait_exit(PATIENCE);
    }
}

fn partitions(broker: &Broker, topic: &str) -> usize {
    let client: BaseProducer = broker.client().create().unwrap();
    let metadata = client
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    metadata
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len())
}

fn records(from: u32, count: u32) -> Vec<TestRecord> {
    (from..from + count)
        .map(|v| TestRecord::new(&format!("k{v}"), &format!("{{\"v\":{v}}}")))
        .collect()
}

/// The `v`s of `records` tagged `by`, sorted, each as often as it was written.
fn values_by(records: &[TestRecord], by: &str) -> Vec<u64> {
    let mut values: Vec<u64> = records
        .iter()
        .filter_map(|r| serde_json::from_str::<Value>(r.value_str()).ok())
        .filter(|json| json["by"] == by)
        .filter_map(|json| json["v"].as_u64())
        .collect();
    values.sort_unstable();
    values
}

/// One record on each of the source's `partitions`, produced after the records a check is
/// about: a processor that wrote a marker on has read everything before it on every
/// partition, and written what it made of it. `v`s from `from` on.
fn markers(broker: &Broker, source: &str, partitions: i32, from: u64) -> Vec<u64> {
    let records: Vec<TestRecord> = (0..partitions)
        .map(|p| TestRecord {
            partition: Some(p),
            ..TestRecord::new(
                &format!("marker-{p}"),
                &format!("{{\"v\":{}}}", from + p as u64),
            )
        })
        .collect();
    broker.produce(source, &records);
    (from..from + partitions as u64).collect()
}

/// Waits until every `v` of `expected` reached `topic` tagged `by` (the markers among them:
/// what the step wrote before them is there too), then asserts that `topic` holds exactly
/// these records, each once, and nothing else.
fn holds_exactly(broker: &Broker, topic: &str, by: &str, expected: &[u64]) {
    let records = broker.wait_for_records(topic, &format!("the records tagged {by}"), |r| {
        let written = values_by(r, by);
        expected.iter().all(|v| written.contains(v))
    });
    let mut wanted = expected.to_vec();
    wanted.sort_unstable();
    assert_eq!(values_by(&records, by), wanted, "{topic}: each record once");
    let others: Vec<&str> = records
        .iter()
        .map(TestRecord::value_str)
        .filter(|v| serde_json::from_str::<Value>(v).map_or(true, |json| json["by"] != by))
        .collect();
    assert!(
        others.is_empty(),
        "{topic} holds records not by {by}: {others:?}"
    );
}

#[test]
fn a_labelled_pull_request_previews_its_change_on_live_data_into_shadow_topics_until_unlabelled() {
    let broker = Broker::start();
    let source = unique("preview-in");
    let sink = unique("preview-out");
    broker.create_topic(&source, 3);
    broker.create_topic(&sink, 3);
    let repo = TestRepo::new();
    let main = repo.commit("main", "t", &topology(&source, &sink, "main"));

    let forge = Server::start(Kind::GitHub);
    forge.seed(7, 0, None, "");
    forge.set_pull_request(7, PullRequestState::Open, &[LABEL]);
    let state = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&repo, &broker, &forge, state.path());
    let real = daemon.wait_topology("t", "t runs main", |t| {
        t["commit"] == main.to_string().as_str()
            && t["phase"] == "idle"
            && running_group(t, "clean").is_some()
    });
    let real_group = running_group(&real, "clean").unwrap();

    // The pull request changes `clean`; the forge says it is open and labelled.
    repo.git
        .reference("refs/heads/pr-7", main, true, "branch")
        .unwrap();
    let head = repo.commit("pr-7", "tag by pr", &[clean("pr")]);
    repo.git
        .reference("refs/pull/7/head", head, true, "pull request")
        .unwrap();
    let preview = daemon.wait_topology("t.pr-7", "the preview runs", |t| {
        t["previewOf"]["topology"] == "t" && running_group(t, "clean").is_some()
    });
    let shadow = format!("{sink}.preview.pr-7");
    assert_eq!(preview["previewOf"]["ref"], "refs/pull/7/head");
    assert_eq!(preview["previewOf"]["pullRequest"], 7);
    assert_eq!(preview["previewOf"]["shadowTopics"][&shadow], sink.as_str());
    let preview_group = running_group(&preview, "clean").unwrap();
    assert!(
        preview_group.starts_with("plumber.t.pr-7.clean."),
        "a group of its own: {preview_group}"
    );
    assert_ne!(preview_group, real_group);
    assert_eq!(
        partitions(&broker, &shadow),
        3,
        "the shadow topic has the sink's partitions"
    );
    let plan = daemon.plan("refs/pull/7/head");
    assert_eq!(plan["preview"], true, "{plan:#}");
    assert_eq!(plan["previews"][0]["preview"], "t.pr-7", "{plan:#}");
    wait_until("the plan comment shows the preview", PATIENCE, || {
        forge
            .comments(7)
            .iter()
            .any(|c| c.body.starts_with(MARKER) && c.body.contains(&shadow))
    });

    // Records written now reach the shadow topic transformed by the pull request's step, and
    // the users' sink only through main's: each exactly once, and nothing else on either
    // (the preview wrote no users' sink, main no shadow topic), checked once markers
    // written after them passed both steps.
    broker.produce(&source, &records(1, 10));
    let mut expected: Vec<u64> = (1..=10).collect();
    expected.extend(markers(&broker, &source, 3, 1000));
    holds_exactly(&broker, &shadow, "pr", &expected);
    holds_exactly(&broker, &sink, "main", &expected);
    let previewed = expected.clone();

    // The label removed (the webhook says so): the preview's processes exit and it leaves
    // status; the real topology runs on, untouched.
    forge.set_pull_request(7, PullRequestState::Open, &[]);
    assert_eq!(
        daemon.hook("pull_request", r#"{"action":"unlabeled","number":7}"#),
        202
    );
    daemon.wait_topology("t.pr-7", "the preview left status", Value::is_null);
    wait_until("the preview's processes exit", PATIENCE, || {
        live_instances(&preview_group) == 0
    });
    assert!(
        live_instances(&real_group) > 0,
        "the real topology's processor runs on"
    );
    // Its consumer group goes too (tansu deletes groups; only topics it cannot).
    wait_until("the preview's group is deleted", PATIENCE, || {
        broker.committed(&preview_group, &source, 3).is_empty()
    });
    assert!(
        !broker.committed(&real_group, &source, 3).is_empty(),
        "the real topology's group keeps its offsets"
    );
    let real = daemon.wait_topology("t", "t still runs main", |t| t["phase"] == "idle");
    assert_eq!(real["commit"], main.to_string().as_str());
    assert_eq!(
        running_group(&real, "clean").as_deref(),
        Some(real_group.as_str())
    );
    wait_until(
        "the plan comment no longer shows the preview",
        PATIENCE,
        || {
            forge
                .comments(7)
                .iter()
                .any(|c| c.body.starts_with(MARKER) && !c.body.contains(&shadow))
        },
    );
    assert_eq!(daemon.plan("refs/pull/7/head")["preview"], false);
    // Records written after the teardown reach the users' sink, once each, and nothing
    // reaches the shadow topic: checked once markers written after them passed main's step
    // (where a preview still running would have read them too).
    broker.produce(&source, &records(11, 5));
    expected.extend(11..=15);
    expected.extend(markers(&broker, &source, 3, 2000));
    holds_exactly(&broker, &sink, "main", &expected);
    let shadowed = broker.read_all(&shadow);
    assert_eq!(
        (values_by(&shadowed, "pr"), shadowed.len()),
        (previewed.clone(), previewed.len()),
        "the shadow topic holds what the preview wrote, and nothing came after the teardown: {:?}",
        shadowed
            .iter()
            .map(TestRecord::value_str)
            .collect::<Vec<_>>()
    );
    assert!(
        broker.committed(&preview_group, &source, 3).is_empty(),
        "the preview's group read on after the teardown"
    );
    forge.assert_clean();
}

/// The exec step a pull request's author pushes after the label: it leaves `$MARKER` as soon
/// as it starts (before any record), then copies records.
const PWN: &str = "import json, os, sys\n\
open(os.environ['MARKER'], 'w').write('ran')\n\
for line in sys.stdin:\n\
\x20   record = json.loads(line)\n\
\x20   value = dict(record['value'], by='pwned')\n\
\x20   print(json.dumps({'id': record['id'], 'outputs': [{'value': value}]}), flush=True)\n";

/// SPEC §11: a preview label approves the head it was set on. The author pushes an exec step
/// after a maintainer labelled a reviewed jq change: it never runs until the label is set
/// again; the preview stops, the comment and a `plumber/preview` status say why, and the label
/// comes off. Set again, it approves the new head, which runs.
#[test]
fn code_pushed_after_the_label_never_runs_until_the_pull_request_is_labelled_again() {
    let broker = Broker::start();
    let source = unique("approve-in");
    let sink = unique("approve-out");
    broker.create_topic(&source, 1);
    broker.create_topic(&sink, 1);
    let repo = TestRepo::new();
    let main = repo.commit("main", "t", &topology(&source, &sink, "main"));
    repo.git
        .reference("refs/heads/pr-7", main, true, "branch")
        .unwrap();
    let reviewed = repo.commit("pr-7", "a reviewed jq change", &[clean("pr")]);
    repo.git
        .reference("refs/pull/7/head", reviewed, true, "pull request")
        .unwrap();
    let forge = Server::start(Kind::GitHub);
    forge.seed(7, 0, None, "");
    forge.set_pull_request(7, PullRequestState::Open, &[LABEL]);
    forge.set_head(7, &reviewed.to_string());
    let state = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&repo, &broker, &forge, state.path());
    let previewed = daemon.wait_topology("t.pr-7", "the reviewed change is previewed", |t| {
        t["commit"] == reviewed.to_string().as_str() && running_group(t, "clean").is_some()
    });
    let reviewed_group = running_group(&previewed, "clean").unwrap();
    let status_of = |sha: &str| {
        forge
            .statuses()
            .into_iter()
            .rev()
            .find(|(s, body)| s == sha && body["context"] == "plumber/preview")
            .map(|(_, body)| body)
    };
    wait_until("the reviewed head's preview status", PATIENCE, || {
        status_of(&reviewed.to_string()).is_some_and(|s| s["state"] == "success")
    });

    // The author pushes an exec step; nobody labels again.
    let marker = state.path().join("pwned");
    let pushed = repo.commit(
        "pr-7",
        "an exec step nobody reviewed",
        &[
            write(
                "topologies/t/steps/clean.yaml",
                format!(
                    "kind: processor\ninput: in\nexec: {{ command: [python3, pwn.py] }}\nenv: {{ MARKER: {} }}\n",
                    marker.display()
                ),
            ),
            write("topologies/t/steps/pwn.py", PWN),
        ],
    );
    repo.git
        .reference("refs/pull/7/head", pushed, true, "push")
        .unwrap();
    forge.set_head(7, &pushed.to_string());
    let pushed_sha = pushed.to_string();
    wait_until(
        "the new head is told to wait for the label",
        PATIENCE,
        || {
            status_of(&pushed_sha).is_some_and(|s| {
                s["state"] == "pending"
                    && s["description"]
                        .as_str()
                        .is_some_and(|d| d.contains("label the pull request again"))
            })
        },
    );
    wait_until("the label comes off", PATIENCE, || {
        !forge.labels(7).iter().any(|l| l == LABEL)
    });
    wait_until("the comment says why no preview runs", PATIENCE, || {
        forge.comments(7).iter().any(|c| {
            c.body.starts_with(MARKER)
                && c.body
                    .contains("Not running: new commits since the `preview` label")
        })
    });
    daemon.wait_topology("t.pr-7", "the preview is torn down", Value::is_null);
    let plan = daemon.plan("refs/pull/7/head");
    assert_eq!(plan["head"], pushed_sha.as_str(), "{plan:#}");
    assert_eq!(plan["preview"], false, "{plan:#}");
    assert!(!marker.exists(), "the unreviewed exec step ran");
    // Nor was it started and stopped before it wrote the marker: the runtime logs every start
    // before the process runs, and the preview is torn down, so no start can come later.
    let log = std::fs::read_to_string(state.path().join("daemon.log")).unwrap();
    let started: std::collections::BTreeSet<&str> = log
        .lines()
        .filter(|l| l.contains("instance started") && l.contains("pr-7"))
        .filter_map(|l| l.split_whitespace().find(|w| w.contains("pr-7")))
        .collect();
    assert!(
        started.iter().all(|w| w.contains(&reviewed_group)),
        "only the reviewed head's step ran in the preview: {started:?}"
    );
    assert!(!started.is_empty(), "the reviewed head's start is logged");

    // A maintainer labels it again (at the pushed head): now it runs.
    forge.set_pull_request(7, PullRequestState::Open, &[LABEL]);
    daemon.wait_topology("t.pr-7", "the new head is previewed", |t| {
        t["commit"] == pushed_sha.as_str() && running_group(t, "clean").is_some()
    });
    wait_until("the exec step runs once approved", PATIENCE, || {
        marker.exists()
    });
    forge.assert_clean();
}

/// The data diff of a pull request's plan (`plumber up --sample`): a pull request, not
/// labelled (nothing of it runs), changes the running step's jq filter. Its plan and its
/// comment say how many of the source's recent records the old and the new version pass and
/// show records whose output changed, with the field `plumber.yaml` masks hidden even where
/// the new code copies it; the sample was read without a group (nothing committed under the
/// sampler's name) and the running step's group still has read everything. Then
/// `GET /api/records/t/clean` shows what the running step wrote lately and its dead letter
/// with its reason, masked the same way.
#[test]
fn a_pull_request_s_plan_shows_what_its_step_does_to_live_records() {
    let broker = Broker::start();
    let source = unique("diff-in");
    let sink = unique("diff-out");
    broker.create_topic(&source, 2);
    broker.create_topic(&sink, 2);
    let repo = TestRepo::new();
    let step = |jq: &str| {
        write(
            "topologies/t/steps/clean.yaml",
            format!("kind: processor\ninput: in\njq: '{jq}'\n"),
        )
    };
    let mut files = topology(&source, &sink, "main");
    // `clean` keeps the big ones instead.
    files[1] = step("select(.v > 9)");
    files.push(write("plumber.yaml", "review:\n  maskFields: [card]\n"));
    let main = repo.commit("main", "t", &files);
    let forge = Server::start(Kind::GitHub);
    forge.seed(8, 0, None, "");
    forge.set_pull_request(8, PullRequestState::Open, &[]);
    let state = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_with(&repo, &broker, &forge, state.path(), &["--sample", "50"]);
    let running = daemon.wait_topology("t", "t runs main", |t| {
        t["commit"] == main.to_string().as_str()
            && t["phase"] == "idle"
            && running_group(t, "clean").is_some()
    });
    let group = running_group(&running, "clean").unwrap();
    let produced: Vec<TestRecord> = (0..40)
        .map(|v| {
            TestRecord::new(
                &format!("k{v}"),
                &format!(r#"{{"v":{v},"card":"4111-0000-{v:04}"}}"#),
            )
        })
        .collect();
    broker.produce(&source, &produced);
    wait_until("the running step read everything", PATIENCE, || {
        broker.committed(&group, &source, 2).values().sum::<i64>() == 40
    });

    // The pull request: a stricter filter, and the card copied under another name.
    repo.git
        .reference("refs/heads/pr-8", main, true, "branch")
        .unwrap();
    let head = repo.commit(
        "pr-8",
        "stricter, with a copy",
        &[step("select(.v > 29) | . + {copy: .card}")],
    );
    repo.git
        .reference("refs/pull/8/head", head, true, "pull request")
        .unwrap();
    let mut plan = Value::Null;
    wait_until("the plan has its data diff", PATIENCE, || {
        // 404 until the ref is planned.
        plan = ureq::get(&format!("{}/api/plans/refs%2Fpull%2F8%2Fhead", daemon.api))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_json().ok())
            .unwrap_or_default();
        plan["head"] == head.to_string().as_str() && plan["dataDiff"].is_array()
    });
    let diff = &plan["dataDiff"][0];
    assert_eq!(diff["step"], "clean", "{plan:#}");
    assert_eq!(diff["sampled"], 40, "{diff:#}");
    assert_eq!(diff["old"]["passed"], 30, "{diff:#}");
    assert_eq!(diff["new"]["passed"], 10, "{diff:#}");
    assert_eq!(diff["changed"], 30, "{diff:#}");
    assert_eq!(
        diff["fieldsAppeared"],
        serde_json::json!(["copy"]),
        "{diff:#}"
    );
    assert_eq!(diff["examples"].as_array().unwrap().len(), 3, "{diff:#}");
    assert!(!plan.to_string().contains("4111-0000"), "{plan:#}");
    let mut comment = String::new();
    wait_until("the comment shows the data diff", PATIENCE, || {
        comment = forge
            .comments(8)
            .into_iter()
            .find(|c| c.body.starts_with(MARKER))
            .map(|c| c.body)
            .unwrap_or_default();
        comment.contains("### Data diff")
    });
    for line in [
        "  old: 30 passed (30 outputs), 10 filtered out, 0 dead-lettered",
        "  new: 10 passed (10 outputs), 30 filtered out, 0 dead-lettered",
        "  records whose output changed: 30",
    ] {
        assert!(comment.contains(line), "missing {line:?} in:\n{comment}");
    }
    assert!(
        !comment.contains("4111-0000"),
        "a masked value is shown:\n{comment}"
    );

    // Read without a group; the running step's group is where it was.
    assert_eq!(
        broker.committed("plumber-plan-sample", &source, 2),
        Default::default()
    );
    assert_eq!(
        broker.committed(&group, &source, 2).values().sum::<i64>(),
        40
    );

    // What the running step wrote lately, and its dead letters with why, on demand.
    broker.produce(&source, &[TestRecord::new("bad", "not json")]);
    let mut tail = Value::Null;
    wait_until("the dead letter is shown", PATIENCE, || {
        tail = ureq::get(&format!("{}/api/records/t/clean?limit=5", daemon.api))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_json().ok())
            .unwrap_or_default();
        tail["deadLetters"]
            .as_array()
            .is_some_and(|d| !d.is_empty())
    });
    assert_eq!(tail["topics"], serde_json::json!([sink]), "{tail:#}");
    let records = tail["records"].as_array().unwrap();
    assert_eq!(records.len(), 5, "{tail:#}");
    assert!(
        records
            .iter()
            .all(|r| r["value"].as_str().unwrap().contains(r#""card":"***""#)),
        "{tail:#}"
    );
    let dead = &tail["deadLetters"][0];
    assert!(
        dead["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "plumber.error.kind" && h[1] == "invalid-json"),
        "{tail:#}"
    );
    assert!(!tail.to_string().contains("4111-0000"), "{tail:#}");
    let missing = ureq::get(&format!("{}/api/records/t/nope", daemon.api)).call();
    assert!(
        matches!(missing, Err(ureq::Error::StatusCode(404))),
        "{missing:?}"
    );
    let too_many = ureq::get(&format!("{}/api/records/t/clean?limit=1000", daemon.api)).call();
    assert!(
        matches!(too_many, Err(ureq::Error::StatusCode(400))),
        "{too_many:?}"
    );
    // Still nothing committed by any reader but the step.
    assert_eq!(
        broker.committed("plumber-plan-sample", &source, 2),
        Default::default()
    );
}

/// A daemon that runs commands (`plumber up --run-commands --sample`): the data diff of a
/// pull request whose preview label approved its head runs the exec step's old and new
/// command, each from a checkout of its own commit. Once the label is taken off, nothing
/// approves the head and the plan says the step is not run, and why.
#[test]
fn an_approved_pull_request_s_exec_step_is_diffed_with_its_own_command() {
    let broker = Broker::start();
    let source = unique("exec-diff-in");
    let sink = unique("exec-diff-out");
    broker.create_topic(&source, 1);
    broker.create_topic(&sink, 1);
    let repo = TestRepo::new();
    let step = |keep: &str, image: &str| {
        vec![
            write(
                "topologies/t/steps/clean/clean.py",
                format!(
                    "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    out = [{{'value': r['value']}}] if {keep} else []\n    print(json.dumps({{'id': r['id'], 'outputs': out}}), flush=True)\n"
                ),
            ),
            write(
                "topologies/t/steps/clean/clean.yaml",
                format!(
                    "kind: processor\ninput: in\nexec:\n  command: [python3, clean.py]\n  image: example/clean:{image}\n"
                ),
            ),
        ]
    };
    let mut files = topology(&source, &sink, "main");
    files.remove(1);
    files.extend(step("True", "1"));
    let main = repo.commit("main", "t", &files);
    let forge = Server::start(Kind::GitHub);
    forge.seed(9, 0, None, "");
    forge.set_pull_request(9, PullRequestState::Open, &[LABEL]);
    let state = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_with(
        &repo,
        &broker,
        &forge,
        state.path(),
        &["--sample", "50", "--run-commands"],
    );
    let running = daemon.wait_topology("t", "t runs main", |t| {
        t["commit"] == main.to_string().as_str()
            && t["phase"] == "idle"
            && running_group(t, "clean").is_some()
    });
    let group = running_group(&running, "clean").unwrap();
    broker.produce(&source, &records(0, 20));
    wait_until("the running step read everything", PATIENCE, || {
        broker.committed(&group, &source, 1).values().sum::<i64>() == 20
    });

    // The labelled pull request keeps the even records only.
    repo.git
        .reference("refs/heads/pr-9", main, true, "branch")
        .unwrap();
    let head = repo.commit("pr-9", "even only", &step("r['value']['v'] % 2 == 0", "2"));
    repo.git
        .reference("refs/pull/9/head", head, true, "pull request")
        .unwrap();
    let plan_of = |what: &str, condition: &dyn Fn(&Value) -> bool| {
        let mut plan = Value::Null;
        wait_until(what, PATIENCE, || {
            plan = ureq::get(&format!("{}/api/plans/refs%2Fpull%2F9%2Fhead", daemon.api))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_json().ok())
                .unwrap_or_default();
            plan["head"] == head.to_string().as_str() && condition(&plan["dataDiff"][0])
        });
        plan
    };
    let plan = plan_of("the approved head's exec step is diffed", &|diff| {
        diff["new"].is_object()
    });
    let diff = &plan["dataDiff"][0];
    assert_eq!(diff["step"], "clean", "{plan:#}");
    assert_eq!(diff["sampled"], 20, "{diff:#}");
    assert_eq!(diff["old"]["passed"], 20, "{diff:#}");
    assert_eq!(diff["new"]["passed"], 10, "{diff:#}");
    assert_eq!(diff["new"]["filtered"], 10, "{diff:#}");
    assert_eq!(diff["changed"], 10, "{diff:#}");

    // Unlabelled: nothing approves its head, so its command runs nowhere.
    forge.set_pull_request(9, PullRequestState::Open, &[]);
    assert_eq!(
        daemon.hook("pull_request", r#"{"action":"unlabeled","number":9}"#),
        202
    );
    let plan = plan_of("the step is no longer diffed", &|diff| {
        diff["note"].is_string()
    });
    let note = plan["dataDiff"][0]["note"].as_str().unwrap();
    assert!(
        note.contains("on a head a maintainer's preview label approved"),
        "{note}"
    );
}
