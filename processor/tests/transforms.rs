//! Each transform against a real broker (tansu, or PLUMBER_TEST_BOOTSTRAP): outputs, dead
//! letters and their headers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{STOP_PROMISE, Step, counts, ids, numbered};
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

#[test]
fn jq_filters_maps_and_flat_maps_keeping_keys_and_headers() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 3);
    broker.create_topic(&output, 2);
    let records: Vec<TestRecord> = (0..30)
        .map(|i| {
            TestRecord::new(
                &format!("k{i}"),
                &format!(r#"{{"id":{i},"tags":["a","b"]}}"#),
            )
            .header("trace", &format!("t{i}"))
        })
        .collect();
    broker.produce(&input, &records);
    // Even ids pass; each becomes one record per tag.
    let program = r#"select(.id % 2 == 0) | .tags[] as $t | {id, tag: $t}"#;
    let step = Step::new(&unique("jq"), &input, &output).args(&["--jq", program]);
    let (out, _) = run_until(&broker, &step, &output, 30, None);

    assert_eq!(out.len(), 30, "15 even ids × 2 tags");
    let by_id = counts(&ids(&out));
    assert!(
        by_id.iter().all(|(id, n)| id % 2 == 0 && *n == 2),
        "{by_id:?}"
    );
    for record in &out {
        let id = ids(std::slice::from_ref(record))[0];
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
}

#[test]
fn a_full_producer_queue_holds_the_loop_back_without_loss() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 3);
    broker.create_topic(&output, 3);
    broker.produce(&input, &numbered(0..300));
    // Room for 10 records: nearly every send finds the queue full and waits for deliveries.
    let step = Step::new(&unique("full"), &input, &output).args(&[
        "--jq",
        ".",
        "-X",
        "queue.buffering.max.messages=10",
    ]);
    let (out, _) = run_until(&broker, &step, &output, 300, None);

    assert_eq!(out.len(), 300);
    assert!(counts(&ids(&out)).values().all(|n| *n == 1));
}

#[test]
fn poison_records_go_to_the_dead_letter_topic_with_their_origin() {
    let broker = Broker::start();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    broker.create_topic(&dlq, 1);
    broker.produce(
        &input,
        &[
            TestRecord::new("a", r#"{"id":1}"#),
            TestRecord::new("b", "not json").header("h", "kept"),
            TestRecord::new("c", r#"{"id":3,"bad":true}"#),
            TestRecord::new("d", r#"{"id":4}"#),
        ],
    );
    let program = r#"if .bad then error("refusing bad record") else . end"#;
    let step = Step::new(&unique("poison"), &input, &output)
        .dlq(&dlq)
        .args(&["--jq", program]);
    let (out, dead) = run_until(&broker, &step, &output, 2, Some((&dlq, 2)));

    assert_eq!(
        ids(&out),
        [1, 4],
        "processing continues after a poison record"
    );
    assert_eq!(dead.len(), 2);
    let not_json = &dead[0];
    assert_eq!(
        not_json.value_str(),
        "not json",
        "the original value is kept"
    );
    assert_eq!(not_json.key.as_deref(), Some(&b"b"[..]));
    assert_eq!(not_json.header_str("h"), Some("kept"));
    assert_eq!(
        not_json.header_str("plumber.error.kind"),
        Some("invalid-json")
    );
    assert_eq!(
        not_json.header_str("plumber.source.topic"),
        Some(input.as_str())
    );
    assert_eq!(not_json.header_str("plumber.source.partition"), Some("0"));
    assert_eq!(not_json.header_str("plumber.source.offset"), Some("1"));
    let raised = &dead[1];
    assert_eq!(raised.header_str("plumber.error.kind"), Some("jq-error"));
    assert!(
        raised
            .header_str("plumber.error")
            .unwrap()
            .contains("refusing bad record")
    );
    assert_eq!(raised.header_str("plumber.source.offset"), Some("2"));
}

#[test]
fn without_a_dead_letter_topic_a_poison_record_stops_the_processor_uncommitted() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    broker.produce(
        &input,
        &[
            TestRecord::new("a", r#"{"id":1}"#),
            TestRecord::new("b", "{broken"),
        ],
    );
    let step = Step::new(&unique("nodlq"), &input, &output).args(&["--jq", "."]);
    let mut process = step.start(&broker);
    let status = process
        .wait_exit(plumber_testkit::PATIENCE)
        .expect("the processor stops on its own");
    assert_eq!(status.code(), Some(1), "log:\n{}", step.log());
    assert!(
        step.log().contains("without --dlq"),
        "the error says what to do:\n{}",
        step.log()
    );
    assert_eq!(ids(&broker.read_all(&output)), [1]);
    let committed = broker.committed(&step.group, &input, 1);
    assert_eq!(
        committed.get(&0),
        Some(&1),
        "the poison record itself stays uncommitted"
    );
}

const EXEC_STEP: &str = r#"
import json, os, sys
for line in sys.stdin:
    record = json.loads(line)
    n = record["value"]["id"]
    if n == 13:
        os._exit(3)  # crashes on this record, every time
    if n % 5 == 0:
        answer = {"error": "multiple of five"}
    else:
        copies = 2 if n % 3 == 0 else 1
        output = {"value": {"id": n, "pid": os.getpid()}, "headers": {"from": "exec"}}
        answer = {"outputs": [output] * copies}
    print(json.dumps({"id": record["id"], **answer}), flush=True)
"#;

#[test]
fn exec_child_flat_maps_restarts_after_crashes_and_dead_letters_what_it_cannot_handle() {
    let broker = Broker::start();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    broker.create_topic(&dlq, 1);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("step.py");
    std::fs::write(&script, EXEC_STEP).unwrap();
    broker.produce(&input, &numbered(1..21));
    let step = Step::new(&unique("exec"), &input, &output)
        .dlq(&dlq)
        .args(&[
            "--attempts",
            "2",
            "--exec",
            "--",
            "python3",
            script.to_str().unwrap(),
        ]);
    // 1..=20 minus 5, 10, 15, 20 (errors) and 13 (crash) = 15 ids; 3, 6, 9, 12, 18 twice.
    let (out, dead) = run_until(&broker, &step, &output, 20, Some((&dlq, 5)));

    let by_id = counts(&ids(&out));
    let expected: BTreeMap<u32, usize> = (1..21)
        .filter(|n| n % 5 != 0 && *n != 13)
        .map(|n| (n, if n % 3 == 0 { 2 } else { 1 }))
        .collect();
    assert_eq!(by_id, expected);
    assert!(
        out.iter().all(|r| r.header_str("from") == Some("exec")),
        "headers replaced"
    );
    let kinds: BTreeMap<String, String> = dead
        .iter()
        .map(|r| {
            (
                r.header_str("plumber.source.offset").unwrap().to_owned(),
                r.header_str("plumber.error.kind").unwrap().to_owned(),
            )
        })
        .collect();
    // Offsets are id - 1.
    assert_eq!(
        kinds.get("12").map(String::as_str),
        Some("exec-failed"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.get("4").map(String::as_str),
        Some("exec-error"),
        "{kinds:?}"
    );
    assert!(
        dead.iter()
            .any(|r| r.header_str("plumber.error").unwrap().contains("exited")),
        "the crash is named"
    );
    let pids: std::collections::BTreeSet<u64> = out
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap()["pid"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(
        pids.len() >= 2,
        "the child was restarted after its crash: {pids:?}"
    );
}

/// A sidecar: 422 for id 7, 503 the first time it sees id 4, 204 for id 9, else one output.
fn start_sidecar() -> (String, Arc<AtomicBool>) {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/score", listener.local_addr().unwrap());
    let failed_once = Arc::new(AtomicBool::new(false));
    let flag = failed_once.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = axum::Router::new().route(
                "/score",
                axum::routing::post(move |body: axum::body::Bytes| {
                    let flag = flag.clone();
                    async move {
                        let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        let id = envelope["value"]["id"].as_u64().unwrap();
                        match id {
                            7 => (StatusCode::UNPROCESSABLE_ENTITY, "id 7 is not scorable".to_owned()).into_response(),
                            4 if !flag.swap(true, Ordering::SeqCst) => {
                                (StatusCode::SERVICE_UNAVAILABLE, "warming up".to_owned()).into_response()
                            }
                            9 => StatusCode::NO_CONTENT.into_response(),
                            _ => {
                                let key = envelope["key"].as_str().unwrap().to_owned();
                                let answer = serde_json::json!([{"value": {"id": id, "score": id * 2}, "key": format!("{key}-scored")}]);
                                (StatusCode::OK, answer.to_string()).into_response()
                            }
                        }
                    }
                }),
            );
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (url, failed_once)
}

#[test]
fn http_sidecar_retries_5xx_and_dead_letters_4xx() {
    let broker = Broker::start();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    broker.create_topic(&input, 2);
    broker.create_topic(&output, 1);
    broker.create_topic(&dlq, 1);
    let (url, failed_once) = start_sidecar();
    broker.produce(&input, &numbered(1..11));
    let step = Step::new(&unique("http"), &input, &output)
        .dlq(&dlq)
        .args(&["--http", &url]);
    let (out, dead) = run_until(&broker, &step, &output, 8, Some((&dlq, 1)));

    assert!(
        failed_once.load(Ordering::SeqCst),
        "the sidecar answered 503 once"
    );
    let mut got = ids(&out);
    got.sort_unstable();
    assert_eq!(
        got,
        [1, 2, 3, 4, 5, 6, 8, 10],
        "4 retried after its 503, 7 dead-lettered, 9 filtered"
    );
    assert!(
        out.iter()
            .all(|r| r.key.as_deref().unwrap().ends_with(b"-scored")),
        "keys replaced"
    );
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].header_str("plumber.error.kind"),
        Some("http-status")
    );
    assert!(dead[0].header_str("plumber.error").unwrap().contains("422"));
}

#[test]
fn metrics_count_every_outcome_and_healthz_answers() {
    let broker = Broker::start();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    broker.create_topic(&dlq, 1);
    let mut records = numbered(0..10);
    records.push(TestRecord::new("x", "garbage"));
    broker.produce(&input, &records);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let step = Step::new(&unique("metrics"), &input, &output)
        .dlq(&dlq)
        .args(&["--jq", "select(.id < 6)", "--metrics", &address]);
    let mut process = step.start(&broker);
    let scrape = || -> String {
        ureq::get(&format!("http://{address}/metrics"))
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .unwrap_or_default()
    };
    plumber_testkit::wait_until(
        "all 11 records are counted",
        plumber_testkit::PATIENCE,
        || {
            let text = scrape();
            text.contains("plumber_processor_records_produced_total 6")
                && text.contains(
                    "plumber_processor_records_dead_lettered_total{kind=\"invalid-json\"} 1",
                )
        },
    );
    let text = scrape();
    assert!(
        text.contains("plumber_processor_records_consumed_total 11"),
        "{text}"
    );
    assert!(
        text.contains("plumber_processor_records_filtered_total 4"),
        "{text}"
    );
    assert!(
        text.contains("plumber_processor_transform_duration_seconds_count 11"),
        "{text}"
    );
    // librdkafka's statistics (every 5 s) carry the lag of each assigned partition.
    plumber_testkit::wait_until(
        "the consumer lag is exported",
        plumber_testkit::PATIENCE,
        || {
            scrape().contains(&format!(
                r#"plumber_processor_consumer_lag{{topic="{input}",partition="0"}} 0"#
            ))
        },
    );
    let health = ureq::get(&format!("http://{address}/healthz"))
        .call()
        .unwrap();
    assert_eq!(health.status(), 200);
    process.signal(Signal::SIGTERM);
    assert!(process.wait_exit(STOP_PROMISE).unwrap().success());
}

/// The README's protocol examples, run as written.
fn example(name: &str) -> String {
    format!("{}/examples/protocols/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_readme_exec_example_works_as_documented() {
    let broker = Broker::start();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    for topic in [&input, &output, &dlq] {
        broker.create_topic(topic, 1);
    }
    broker.produce(
        &input,
        &[
            TestRecord::new("a", r#"{"platform":"web","page":"/news/today"}"#),
            TestRecord::new("b", r#"{"platform":"ios","page":"/news"}"#),
            TestRecord::new("c", r#"{"platform":"web"}"#),
        ],
    );
    let step = Step::new(&unique("readme-exec"), &input, &output)
        .dlq(&dlq)
        .args(&["--exec", "--", "python3", &example("exec_step.py")]);
    let (out, dead) = run_until(&broker, &step, &output, 1, Some((&dlq, 1)));
    assert_eq!(out.len(), 1);
    let value: serde_json::Value =
        serde_json::from_slice(out[0].value.as_deref().unwrap()).unwrap();
    assert_eq!(value["section"], "news");
    assert_eq!(out[0].key.as_deref(), Some(&b"a"[..]));
    assert_eq!(dead[0].header_str("plumber.error"), Some("no page"));
}

#[test]
fn the_readme_http_example_works_as_documented() {
    let broker = Broker::start();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    for topic in [&input, &output, &dlq] {
        broker.create_topic(topic, 1);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut sidecar = plumber_testkit::Process::spawn(
        "http_step.py",
        std::process::Command::new("python3")
            .arg(example("http_step.py"))
            .env("PORT", port.to_string()),
    );
    plumber_testkit::wait_until("the sidecar listens", plumber_testkit::PATIENCE, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    broker.produce(
        &input,
        &[
            TestRecord::new("v1", r#"{"speed":100}"#),
            TestRecord::new("v2", r#"{"parked":true}"#),
        ],
    );
    let url = format!("http://127.0.0.1:{port}/score");
    let step = Step::new(&unique("readme-http"), &input, &output)
        .dlq(&dlq)
        .args(&["--http", &url]);
    let (out, dead) = run_until(&broker, &step, &output, 1, Some((&dlq, 1)));
    sidecar.kill();
    let value: serde_json::Value =
        serde_json::from_slice(out[0].value.as_deref().unwrap()).unwrap();
    assert_eq!(value["risk"], 0.5);
    assert_eq!(
        dead[0].header_str("plumber.error.kind"),
        Some("http-status")
    );
    assert!(
        dead[0]
            .header_str("plumber.error")
            .unwrap()
            .contains("no speed")
    );
}
