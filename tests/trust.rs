//! The trust boundary (SPEC §11) end to end, against `plumber up` as a real process: what a
//! step file or a pushed branch can make the daemon read, hold, run or reveal. Each test
//! mounts the attack first and then checks that it is bounded (a broker is tansu unless
//! `PLUMBER_TEST_BOOTSTRAP` names another).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;
#[path = "support/up.rs"]
mod up;

use common::{TestRepo, bomb, tagged, write};
use plumber_testkit::{Broker, TestRecord, Usage, unique};
use serde_json::Value;
use up::{Up, running_group};

/// An exec step sees what its file declares and a minimal environment, never the daemon's:
/// here the daemon holds `PLUMBER_GIT_PASSWORD` (as `plumber up` on a private repository
/// does) and a variable of its shell, and the step prints every variable it has.
#[test]
fn an_exec_step_sees_none_of_the_daemons_environment() {
    let broker = Broker::start();
    let source = unique("env-in");
    let sink = unique("env-out");
    broker.create_topic(&source, 1);
    broker.create_topic(&sink, 1);
    let repo = TestRepo::new();
    repo.commit(
        "main",
        "an exec step that prints its environment",
        &[
            write(
                "topologies/e/in.yaml",
                format!("kind: source\ntopic: {source}\n"),
            ),
            write(
                "topologies/e/steps/env.yaml",
                "kind: processor\ninput: in\nexec: { command: [python3, env.py] }\nenv: { MODEL: v3 }\n",
            ),
            write(
                "topologies/e/steps/env.py",
                "import json, os, sys\n\
                 for line in sys.stdin:\n\
                 \x20   record = json.loads(line)\n\
                 \x20   answer = {'outputs': [{'value': dict(os.environ)}]}\n\
                 \x20   print(json.dumps({'id': record['id'], **answer}), flush=True)\n",
            ),
            write(
                "topologies/e/out.yaml",
                format!("kind: sink\ntopic: {sink}\ninput: env\n"),
            ),
        ],
    );
    let scratch = tempfile::tempdir().unwrap();
    let daemon = Up::start(
        &repo.location(),
        Some(&broker),
        scratch.path(),
        &[],
        &[
            ("PLUMBER_GIT_PASSWORD", "hunter2-git-password"),
            ("AWS_SECRET_ACCESS_KEY", "from-the-daemons-shell"),
        ],
    );
    daemon.wait_topology("e", "the exec step runs", |t| {
        t["phase"] == "idle" && running_group(t, "env").is_some()
    });
    broker.produce(&source, &[TestRecord::new("k", "{}")]);
    let records = broker.wait_for_records(&sink, "the step's environment", |r| !r.is_empty());
    let env: Value = serde_json::from_str(records[0].value_str()).unwrap();
    let names: Vec<&str> = env
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(env["MODEL"], "v3", "what the step declares: {names:?}");
    assert!(env.get("PATH").is_some(), "{names:?}");
    for secret in ["PLUMBER_GIT_PASSWORD", "AWS_SECRET_ACCESS_KEY"] {
        assert!(env.get(secret).is_none(), "{secret} leaked: {names:?}");
    }
    assert!(
        !records[0].value_str().contains("hunter2-git-password"),
        "{names:?}"
    );
}

/// SPEC §11: a commit over budget is refused before its blobs are read, on its ref alone.
/// The bomb on a watched branch leaves the daemon alive and its memory bounded; its plan says
/// why; and the tracked branch still cuts over.
#[test]
fn a_bomb_pushed_to_a_watched_branch_is_refused_unread_and_main_still_cuts_over() {
    let broker = Broker::start();
    let source = unique("bomb-in");
    let sink = unique("bomb-out");
    broker.create_topic(&source, 1);
    broker.create_topic(&sink, 1);
    let repo = TestRepo::new();
    let first = repo.commit("main", "t", &tagged(&source, &sink, "first"));
    let scratch = tempfile::tempdir().unwrap();
    let daemon = Up::start(&repo.location(), Some(&broker), scratch.path(), &[], &[]);
    daemon.wait_topology("t", "t runs", |t| {
        t["commit"] == first.to_string().as_str() && running_group(t, "clean").is_some()
    });
    let idle = Usage::of(daemon.process.pid());

    repo.git
        .reference("refs/heads/feature", first, true, "branch")
        .unwrap();
    let bombed = bomb(&repo, "feature", 3_000);
    let plan = daemon.wait_plan("refs/heads/feature", "the bomb's plan", |p| {
        p["head"] == bombed.to_string().as_str()
    });
    assert_eq!(plan["valid"], false, "{plan:#}");
    let error = &plan["errors"][0];
    assert_eq!(error["code"], "over-budget", "{plan:#}");
    assert_eq!(error["file"], "topologies/bomb", "{plan:#}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("--max-commit-bytes") && message.contains("nothing of it was read"),
        "{message}"
    );

    // The tracked branch is not held up: a change of main cuts over.
    let second = repo.commit("main", "by second", &tagged(&source, &sink, "second"));
    daemon.wait_topology("t", "t runs the second commit", |t| {
        t["commit"] == second.to_string().as_str()
            && t["phase"] == "idle"
            && running_group(t, "clean").is_some()
    });
    broker.produce(&source, &[TestRecord::new("k", "{\"v\":1}")]);
    broker.wait_for_records(&sink, "the second commit's output", |r| {
        r.iter().any(|r| r.value_str().contains("second"))
    });

    // The bomb on the tracked branch itself: refused the same way, what runs keeps running.
    let bombed_main = bomb(&repo, "main", 3_000);
    let status = daemon.wait_status("the bombed head is refused", |s| {
        s["lastError"]["commit"] == bombed_main.to_string().as_str()
    });
    assert!(
        status["lastError"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("over the budget")),
        "{status:#}"
    );
    assert_eq!(
        up::topology(&status, "t")["commit"],
        second.to_string().as_str()
    );
    let after = Usage::of(daemon.process.pid());
    // Reading the bomb would take gigabytes; the daemon's peak stays within a small
    // multiple of what it needs idle.
    assert!(
        after.peak_rss_kb < idle.rss_kb + 256 * 1024,
        "peak {} KiB, idle {} KiB",
        after.peak_rss_kb,
        idle.rss_kb
    );
}

/// SPEC §11: steps may name only the Secrets the operator allows outside Git, here the
/// directories of `plumber up --secrets DIR`; naming the daemon's own (its forge token) is a
/// validation error at the name, and the last valid commit keeps running.
#[test]
fn a_step_naming_a_secret_it_may_not_use_is_invalid_at_the_name() {
    let repo = TestRepo::new();
    let scratch = tempfile::tempdir().unwrap();
    let secrets = scratch.path().join("secrets");
    std::fs::create_dir_all(secrets.join("scoring")).unwrap();
    std::fs::write(secrets.join("scoring").join("api-key"), "k\n").unwrap();
    let step = |secret: &str| {
        write(
            "topologies/t/clean.yaml",
            format!(
                "kind: processor\ninput: in\njq: .\nenv:\n  KEY: {{ secretKeyRef: {{ name: {secret}, key: token }} }}\n"
            ),
        )
    };
    let mut files = tagged("in", "out", "x");
    files[1] = step("plumber-forge");
    let commit = repo.commit("main", "steal the forge token", &files);
    let daemon = Up::start(
        &repo.location(),
        None,
        scratch.path(),
        &["--secrets", &secrets.display().to_string()],
        &[],
    );
    let status = daemon.wait_status("the commit is refused", |s| {
        s["lastError"]["commit"] == commit.to_string().as_str()
    });
    let error = &status["lastError"];
    assert_eq!(
        error["place"]["file"], "topologies/t/clean.yaml",
        "{error:#}"
    );
    assert_eq!(error["place"]["line"], 5, "{error:#}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("may not use Secret `plumber-forge`") && message.contains("`scoring`"),
        "{message}"
    );
    assert!(
        status["commit"].is_null(),
        "nothing was applied: {status:#}"
    );
}
