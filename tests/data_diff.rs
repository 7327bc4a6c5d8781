//! `plumber plan --sample`: the data diff of a plan on a real broker (tansu unless
//! `PLUMBER_TEST_BOOTSTRAP` names another). A pull request changes a jq filter; the plan
//! runs the old and the new version on the same recent records of the live source and
//! says what each passes, which records changed (examples with the masked fields hidden)
//! and which output fields appeared, and the sampling reader commits nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use common::{TestRepo, run, write};
use plumber_testkit::{Broker, TestRecord, unique};

#[test]
fn a_changed_jq_filter_shows_what_each_version_does_to_live_records() {
    let broker = Broker::start();
    let topic = unique("orders");
    broker.create_topic(&topic, 2);
    let mut records: Vec<TestRecord> = (0..40)
        .map(|v| {
            TestRecord::new(
                &format!("k{v}"),
                &format!(r#"{{"v":{v},"card":"4111-0000-{v:04}"}}"#),
            )
        })
        .collect();
    records.push(TestRecord::new("bad", "not json"));
    broker.produce(&topic, &records);

    let repo = TestRepo::new();
    let step = |jq: &str| {
        write(
            "topologies/t/steps/big.yaml",
            format!("kind: processor\ninput: orders\njq: '{jq}'\n"),
        )
    };
    let old = repo.commit(
        "main",
        "big orders",
        &[
            write("plumber.yaml", "review:\n  maskFields: [card]\n"),
            write(
                "topologies/t/sources/orders.yaml",
                format!("kind: source\ntopic: {topic}\n"),
            ),
            step("select(.v > 9)"),
            write(
                "topologies/t/sinks/out.yaml",
                "kind: sink\ntopic: big-orders\ninput: big\n",
            ),
        ],
    );
    let new = repo.commit(
        "main",
        "bigger orders, doubled",
        &[step("select(.v > 29) | . + {doubled: (.v * 2)}")],
    );
    let (code, out, err) = run(&[
        "plan",
        &repo.location(),
        "--from",
        &old.to_string(),
        "--to",
        &new.to_string(),
        "--sample",
        "100",
        "--bootstrap",
        broker.bootstrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    for line in [
        "data diff of `big` in `t` (replaced):".to_owned(),
        format!("  41 records sampled from `{topic}`"),
        "  old: 30 passed (30 outputs), 10 filtered out, 1 dead-lettered (invalid-json 1)".into(),
        "  new: 10 passed (10 outputs), 30 filtered out, 1 dead-lettered (invalid-json 1)".into(),
        // 10..=29 are filtered out now, 30..=39 doubled.
        "  records whose output changed: 30".into(),
        "  fields appeared: doubled".into(),
    ] {
        assert!(out.contains(&line), "missing {line:?} in:\n{out}");
    }
    let examples: Vec<&str> = out.lines().filter(|l| l.starts_with("  e.g.")).collect();
    assert_eq!(examples.len(), 3, "{out}");
    assert!(
        examples.iter().all(|e| e.contains(r#""card":"***""#)),
        "{examples:#?}"
    );
    assert!(
        !out.contains("4111-0000"),
        "a masked field is shown:\n{out}"
    );

    // As JSON, for the page and tools.
    let (code, out, _) = run(&[
        "plan",
        &repo.location(),
        "--from",
        &old.to_string(),
        "--to",
        &new.to_string(),
        "--sample",
        "10",
        "--bootstrap",
        broker.bootstrap(),
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let diff = &json["dataDiff"][0];
    assert_eq!(diff["step"], "big");
    // Ten records, the most recent of each partition's share.
    let sampled = diff["sampled"].as_u64().unwrap();
    assert!((10..=11).contains(&sampled), "{diff}");
    assert!(!out.contains("4111-0000"), "{out}");

    // Read without a group: nothing was committed.
    assert_eq!(
        broker.committed("plumber-plan-sample", &topic, 2),
        Default::default()
    );

    // Sampling needs a cluster.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_plumber"))
        .args(["plan", &repo.location(), "--to", &new.to_string()])
        .args(["--sample", "10"])
        .env_remove("PLUMBER_BOOTSTRAP")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("--bootstrap"), "{err}");
}

/// An exec step's data diff runs each version's own command, from a checkout of its own
/// commit, on the same records, and only with `--run-commands` (its code runs here).
#[test]
fn a_changed_exec_step_is_diffed_with_each_version_s_command() {
    let broker = Broker::start();
    let topic = unique("readings");
    broker.create_topic(&topic, 1);
    let records: Vec<TestRecord> = (0..20)
        .map(|v| TestRecord::new(&format!("k{v}"), &format!(r#"{{"v":{v}}}"#)))
        .collect();
    broker.produce(&topic, &records);

    let repo = TestRepo::new();
    let script = |keep: &str, extra: &str| {
        write(
            "topologies/t/steps/tag/tag.py",
            format!(
                "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    v = r['value']\n    out = [{{'value': {{**v{extra}}}}}] if {keep} else []\n    print(json.dumps({{'id': r['id'], 'outputs': out}}), flush=True)\n"
            ),
        )
    };
    let old = repo.commit(
        "main",
        "tagging",
        &[
            write(
                "topologies/t/sources/readings.yaml",
                format!("kind: source\ntopic: {topic}\n"),
            ),
            write(
                "topologies/t/steps/tag/tag.yaml",
                "kind: processor\ninput: readings\nexec:\n  command: [python3, tag.py]\n",
            ),
            script("True", ""),
            write(
                "topologies/t/sinks/out.yaml",
                "kind: sink\ntopic: tagged\ninput: tag\n",
            ),
        ],
    );
    let new = repo.commit(
        "main",
        "only the even ones, tagged",
        &[
            script("v['v'] % 2 == 0", ", 'even': True"),
            // An exec step's identity is its file's: its image tag says the code changed.
            write(
                "topologies/t/steps/tag/tag.yaml",
                "kind: processor\ninput: readings\nexec:\n  command: [python3, tag.py]\n  image: example/tag:2\n",
            ),
        ],
    );
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "plan".to_owned(),
            repo.location(),
            "--from".into(),
            old.to_string(),
            "--to".into(),
            new.to_string(),
            "--sample".into(),
            "100".into(),
            "--bootstrap".into(),
            broker.bootstrap().to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    };
    let (code, out, err) = plan(&["--run-commands"]);
    assert_eq!(code, 0, "{out}{err}");
    for line in [
        "data diff of `tag` in `t` (replaced):",
        "  20 records sampled from",
        "  old: 20 passed (20 outputs), 0 filtered out, 0 dead-lettered",
        "  new: 10 passed (10 outputs), 10 filtered out, 0 dead-lettered",
        "  records whose output changed: 20",
        "  fields appeared: even",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }

    let (code, out, err) = plan(&[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("not run: an exec step runs a command of the commit: `plumber plan` runs them with `--run-commands`"),
        "{out}"
    );
}

/// A step with state, and a join, are diffed on the sample too: each version runs the
/// sample's records in each partition's order, a `GROUP BY` from empty state carried from
/// record to record, a join with its table filled by the rows sampled from the table's
/// topic. Here the new count emits only past 3 readings of a key (4 of the 10 records, which
/// only a state carried over the records can say), and the new join drops the records
/// whose key has no row.
#[test]
fn a_stateful_step_and_a_join_are_diffed_from_the_state_the_sample_builds() {
    let broker = Broker::start();
    let readings = unique("readings");
    let fleets = unique("fleets");
    broker.create_topic(&readings, 1);
    broker.create_topic(&fleets, 1);
    let records: Vec<TestRecord> = (0..10)
        .map(|i| {
            let car = if i < 6 { "car-1" } else { "car-2" };
            TestRecord::new(car, &format!(r#"{{"car":"{car}","speed":{i}}}"#))
        })
        .collect();
    broker.produce(&readings, &records);
    broker.produce(&fleets, &[TestRecord::new("car-1", r#"{"fleet":"north"}"#)]);

    let repo = TestRepo::new();
    let count = |having: &str| {
        write(
            "topologies/t/steps/count.yaml",
            format!(
                "kind: processor\ninput: readings\nemit: update\nsql: SELECT _key AS car, COUNT(*) AS n FROM readings GROUP BY _key{having}\n"
            ),
        )
    };
    let named = |join: &str| {
        write(
            "topologies/t/steps/named.yaml",
            format!(
                "kind: processor\ninput: [readings, fleets]\nsql: SELECT r.speed, f.fleet FROM readings r {join} fleets f ON r.car = f._key\n"
            ),
        )
    };
    let old = repo.commit(
        "main",
        "count and name",
        &[
            write(
                "topologies/t/sources/readings.yaml",
                format!("kind: source\ntopic: {readings}\n"),
            ),
            write(
                "topologies/t/sources/fleets.yaml",
                format!("kind: source\ntopic: {fleets}\n"),
            ),
            count(""),
            named("LEFT JOIN"),
            write(
                "topologies/t/sinks/out.yaml",
                "kind: sink\ntopic: counted\ninput: [count, named]\n",
            ),
        ],
    );
    let new = repo.commit(
        "main",
        "busy cars, named ones",
        &[count(" HAVING COUNT(*) > 3"), named("JOIN")],
    );
    let (code, out, err) = run(&[
        "plan",
        &repo.location(),
        "--from",
        &old.to_string(),
        "--to",
        &new.to_string(),
        "--sample",
        "100",
        "--bootstrap",
        broker.bootstrap(),
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let diff = |step: &str| {
        json["dataDiff"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["step"] == step)
            .unwrap()
            .clone()
    };
    let counted = diff("count");
    assert!(counted["note"].is_null(), "{counted:#}");
    assert_eq!(counted["sampled"], 10, "{counted:#}");
    assert_eq!(counted["old"]["passed"], 10, "{counted:#}");
    // car-1's 4th, 5th and 6th readings, car-2's 4th.
    assert_eq!(counted["new"]["passed"], 4, "{counted:#}");
    assert_eq!(counted["new"]["filtered"], 6, "{counted:#}");
    assert!(
        counted["caveat"]
            .as_str()
            .unwrap()
            .starts_with("from empty state"),
        "{counted:#}"
    );

    let joined = diff("named");
    assert!(joined["note"].is_null(), "{joined:#}");
    assert_eq!(
        joined["sampled"], 10,
        "the table's rows are not records of the diff: {joined:#}"
    );
    assert_eq!(joined["old"]["passed"], 10, "{joined:#}");
    assert_eq!(joined["new"]["passed"], 6, "car-1 has its row: {joined:#}");
    assert_eq!(joined["changed"], 4, "{joined:#}");
    assert!(
        joined["caveat"]
            .as_str()
            .unwrap()
            .contains("holds only the 1 most recent rows"),
        "{joined:#}"
    );
}
