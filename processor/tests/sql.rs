//! `--sql` against a real broker (tansu, or PLUMBER_TEST_BOOTSTRAP): the query filters and
//! projects, keys and headers are kept, records whose evaluation fails are dead-lettered with
//! their origin, and everything else is processed exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{STOP_PROMISE, Step, counts, ids};
use nix::sys::signal::Signal;
use plumber_testkit::{Broker, TestRecord, unique};

/// Starts `step`, waits for `expect` outputs and `dead` dead letters, stops it gracefully.
fn run_until(
    broker: &Broker,
    step: &Step,
    output: &str,
    expect: usize,
    dlq: Option<(&str, usize)>,
) -> (Vec<TestRecord>, Vec<TestRecord>) {
    let mut process = step.start(broker);
    let what = format!("{expect} outputs (log: {})", step.log_path().display());
    broker.wait_for_records(output, &what, |r| r.len() >= expect);
    if let Some((topic, n)) = dlq {
        broker.wait_for_records(topic, &format!("{n} dead letters"), |r| r.len() >= n);
    }
    process.signal(Signal::SIGTERM);
    let status = process
        .wait_exit(STOP_PROMISE)
        .expect("exits within 10 s of SIGTERM");
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        step.log()
    );
    let dead = dlq
        .map(|(topic, _)| broker.read_all(topic))
        .unwrap_or_default();
    (broker.read_all(output), dead)
}

fn json(record: &TestRecord) -> serde_json::Value {
    serde_json::from_slice(record.value.as_deref().unwrap_or_default()).unwrap()
}

#[test]
fn sql_filters_projects_and_dead_letters_what_it_cannot_evaluate() {
    let broker = Broker::start();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    broker.create_topic(&input, 3);
    broker.create_topic(&output, 2);
    broker.create_topic(&dlq, 1);
    let mut records: Vec<TestRecord> = (0..60)
        .map(|i| {
            TestRecord::new(
                &format!("k{i}"),
                &format!(r#"{{"id":{i},"speed":{},"name":"v{i}","n":4}}"#, i % 20),
            )
            .header("trace", &format!("t{i}"))
        })
        .collect();
    // Injected poison, on one key (one partition) so their order is known: a string where
    // a number is compared, a zero divisor, a value that is not JSON.
    records.extend([
        TestRecord::new("poison", r#"{"id":100,"speed":"fast","n":4}"#),
        TestRecord::new("poison", r#"{"id":101,"speed":15,"n":0}"#).header("h", "kept"),
        TestRecord::new("poison", "not json"),
    ]);
    broker.produce(&input, &records);
    let query = "SELECT id, speed * 2 AS double_speed, UPPER(name) AS name, _key AS key, \
                 _headers.trace, 100 / n AS share FROM telemetry WHERE speed > 10";
    let step = Step::new(&unique("sql"), &input, &output)
        .dlq(&dlq)
        .args(&["--sql", query]);
    // Speeds 11..19 pass: 9 of every 20 records.
    let (out, dead) = run_until(&broker, &step, &output, 27, Some((&dlq, 3)));

    let by_id = counts(&ids(&out));
    assert_eq!(by_id.len(), 27, "{by_id:?}");
    assert!(by_id.values().all(|n| *n == 1), "each once: {by_id:?}");
    for record in &out {
        let value = json(record);
        let id = value["id"].as_u64().unwrap();
        assert!(id % 20 > 10, "{value}");
        assert_eq!(
            value,
            serde_json::json!({
                "id": id,
                "double_speed": (id % 20) * 2,
                "name": format!("V{id}"),
                "key": format!("k{id}"),
                "trace": format!("t{id}"),
                "share": 25,
            })
        );
        assert_eq!(
            record.key.as_deref(),
            Some(format!("k{id}").as_bytes()),
            "key kept"
        );
        assert_eq!(
            record.header_str("trace"),
            Some(format!("t{id}").as_str()),
            "headers kept"
        );
    }

    assert_eq!(dead.len(), 3);
    let kinds: Vec<Option<&str>> = dead
        .iter()
        .map(|d| d.header_str("plumber.error.kind"))
        .collect();
    assert_eq!(
        kinds,
        [Some("sql-error"), Some("sql-error"), Some("invalid-json")]
    );
    let errors: Vec<&str> = dead
        .iter()
        .map(|d| d.header_str("plumber.error").unwrap())
        .collect();
    assert!(
        errors[0].contains("`speed > 10`: cannot compare a string with an integer"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("`100 / n`: division by zero"),
        "{errors:?}"
    );
    assert_eq!(
        dead[1].value_str(),
        r#"{"id":101,"speed":15,"n":0}"#,
        "the original value"
    );
    assert_eq!(dead[1].header_str("h"), Some("kept"));
    for d in &dead {
        assert_eq!(d.header_str("plumber.source.topic"), Some(input.as_str()));
    }
    // Everything is committed: a successor of this group starts after the last record.
    let committed = broker.committed(&step.group, &input, 3);
    let total: i64 = committed.values().sum();
    assert_eq!(total, 63, "{committed:?}");
}

#[test]
fn a_union_all_reads_each_input_with_its_own_select() {
    let broker = Broker::start();
    let (cars, trucks, output) = (unique("cars"), unique("trucks"), unique("out"));
    for topic in [&cars, &trucks, &output] {
        broker.create_topic(topic, 1);
    }
    let numbered = |from: u32, field: &str| -> Vec<TestRecord> {
        (from..from + 10)
            .map(|i| TestRecord::new(&format!("k{i}"), &format!(r#"{{"id":{i},"{field}":{i}}}"#)))
            .collect()
    };
    broker.produce(&cars, &numbered(0, "speed"));
    broker.produce(&trucks, &numbered(100, "velocity"));
    let mut step = Step::new(&unique("union"), &cars, &output).args(&[
        "--sql",
        "SELECT id, speed, 'car' AS kind FROM cars WHERE speed >= 5 \
         UNION ALL SELECT id, velocity AS speed, 'truck' AS kind FROM trucks",
        "--sql-input",
        &format!("cars={cars}"),
        "--sql-input",
        &format!("trucks={trucks}"),
    ]);
    step.inputs.push(trucks.clone());
    let (out, _) = run_until(&broker, &step, &output, 15, None);

    let mut seen: Vec<(u64, String)> = out
        .iter()
        .map(|r| {
            let v = json(r);
            assert_eq!(v["speed"], v["id"], "{v}");
            (
                v["id"].as_u64().unwrap(),
                v["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    seen.sort();
    let expected: Vec<(u64, String)> = (5..10)
        .map(|i| (i, "car".to_owned()))
        .chain((100..110).map(|i| (i, "truck".to_owned())))
        .collect();
    assert_eq!(seen, expected);
}

#[test]
fn a_query_that_cannot_run_stops_the_processor_at_start() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    let step = Step::new(&unique("badsql"), &input, &output)
        .args(&["--sql", "SELECT id, COUNT(*) FROM t GROUP BY id"]);
    let mut process = step.start(&broker);
    let status = process
        .wait_exit(plumber_testkit::PATIENCE)
        .expect("the processor stops on its own");
    assert!(!status.success(), "log:\n{}", step.log());
    let log = step.log();
    assert!(log.contains("GROUP BY is not supported"), "{log}");
    assert!(log.contains("COUNT"), "{log}");
}
