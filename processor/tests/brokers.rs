//! The processor and its brokers (issue 14): topics it must not create, records the brokers
//! refuse, brokers that do not answer at start, brokers that disappear. On rdkafka's
//! MockCluster where the fault is injected into the broker, on tansu where a broker is killed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{STOP_PROMISE, Step, assert_stop_took_under_ten_seconds, final_report, ids, numbered};
use nix::sys::signal::Signal;
use plumber_testkit::{Broker, PATIENCE, TestRecord, unique, wait_until};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

type Mock = MockCluster<'static, DefaultProducerContext>;

fn mock() -> (Mock, Broker) {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let broker = Broker::external(cluster.bootstrap_servers());
    (cluster, broker)
}

fn mock_topic(cluster: &Mock, prefix: &str) -> String {
    let name = unique(prefix);
    cluster.create_topic(&name, 1, 1).expect("mock topic");
    name
}

fn exists(broker: &Broker, topic: &str) -> bool {
    // A consumer's metadata requests never create topics.
    let client: BaseConsumer = broker.client().create().unwrap();
    let metadata = client
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .unwrap();
    metadata
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
}

/// The mock creates a topic a producer's metadata request names, as a Kafka broker with
/// `auto.create.topics.enable` does: librdkafka's producer asks for that by default.
#[test]
fn a_missing_output_topic_is_a_clear_error_and_never_created() {
    let (cluster, broker) = mock();
    let input = mock_topic(&cluster, "in");
    broker.produce(&input, &numbered(0..3));
    let missing = unique("missing-out");
    let step = Step::new(&unique("no-create"), &input, &missing).args(&["--jq", "."]);
    let mut process = step.start(&broker);
    let status = process
        .wait_exit(PATIENCE)
        .expect("the processor stops on its own");
    let log = step.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(
        log.contains(&format!("topic(s) {missing} do not exist"))
            && log.contains("never creates topics"),
        "the error names the topic and what to do:\n{log}"
    );
    assert!(
        !exists(&broker, &missing),
        "the processor created {missing}"
    );
}

/// The brokers refuse a produce request as too large (injected: the mock has no size limit).
fn refuse_next_produce(cluster: &Mock) {
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
}

/// Every id comes out, at the output or as a dead letter (kind too-large, carrying the
/// input's value read again); some were dead-lettered; the processor stops cleanly.
fn refused_records_are_dead_lettered(delivery: &str) -> String {
    let (cluster, broker) = mock();
    let (input, output, dlq) = (
        mock_topic(&cluster, "in"),
        mock_topic(&cluster, "out"),
        mock_topic(&cluster, "dlq"),
    );
    broker.produce(&input, &numbered(0..50));
    refuse_next_produce(&cluster);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let step = Step::new(&unique("refused"), &input, &output)
        .dlq(&dlq)
        .args(&["--jq", ".", "--delivery", delivery, "--metrics", &metrics]);
    let mut process = step.start(&broker);
    let every_id = |outputs: &[TestRecord], dead: &[TestRecord]| {
        let mut seen: BTreeSet<u32> = ids(outputs).into_iter().collect();
        seen.extend(ids(dead));
        seen.len() == 50
    };
    let mut dead = Vec::new();
    wait_until("every id at the output or dead-lettered", PATIENCE, || {
        dead = broker.read_all(&dlq);
        !dead.is_empty() && every_id(&broker.read_all(&output), &dead)
    });
    for record in &dead {
        assert_eq!(record.header_str("plumber.error.kind"), Some("too-large"));
        assert!(
            record
                .header_str("plumber.error")
                .unwrap()
                .contains("refused"),
            "{:?}",
            record.header_str("plumber.error")
        );
        let offset = record.header_str("plumber.source.offset").unwrap();
        assert_eq!(
            record.value_str(),
            format!(r#"{{"id":{offset}}}"#),
            "the dead letter carries the input"
        );
    }
    let text = ureq::get(&format!("http://{metrics}/metrics"))
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .unwrap_or_default();
    process.signal(Signal::SIGTERM);
    let status = process.wait_exit(STOP_PROMISE).expect("exits");
    assert!(status.success(), "log:\n{}", step.log());
    text
}

#[test]
fn at_least_once_dead_letters_the_inputs_of_records_the_brokers_refuse() {
    refused_records_are_dead_lettered("at-least-once");
}

/// A refused record makes the transaction abortable: it is aborted, its records processed
/// again, and the inputs of the refused ones dead-lettered when they come again. (The mock
/// writes no abort markers, so its read_committed readers see the aborted attempt too: only
/// a real cluster could show the outputs exactly once.)
#[test]
fn exactly_once_aborts_the_transaction_of_a_refused_record_and_dead_letters_its_input() {
    let metrics = refused_records_are_dead_lettered("exactly-once");
    assert!(
        metrics.contains("plumber_processor_transaction_aborts_total 1"),
        "{metrics}"
    );
}

#[test]
fn delivery_auto_keeps_asking_until_the_brokers_answer_and_shows_the_mode() {
    let (cluster, broker) = mock();
    let (input, output) = (mock_topic(&cluster, "in"), mock_topic(&cluster, "out"));
    broker.produce(&input, &numbered(0..5));
    cluster.broker_down(1).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let step = Step::new(&unique("auto"), &input, &output).args(&[
        "--jq",
        ".",
        "--delivery",
        "auto",
        "--metrics",
        &metrics,
    ]);
    let mut process = step.start(&broker);
    wait_until("the processor asked twice", PATIENCE, || {
        step.log().matches("asks again").count() >= 2
    });
    assert!(!step.log().contains(r#""message":"processing""#));
    cluster.broker_up(1).unwrap();
    broker.wait_for_records(&output, "5 outputs", |r| r.len() >= 5);
    let log = step.log();
    assert!(
        log.contains(r#""message":"processing","mode":"exactly-once""#),
        "not downgraded for a slow start:\n{log}"
    );
    let text = ureq::get(&format!("http://{metrics}/metrics"))
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .unwrap();
    assert!(
        text.contains(r#"plumber_processor_delivery_mode{mode="exactly-once"} 1"#),
        "{text}"
    );
    process.signal(Signal::SIGTERM);
    assert!(process.wait_exit(STOP_PROMISE).expect("exits").success());

    // Still asking when the stop comes: it ends at once.
    cluster.broker_down(1).unwrap();
    let waiting = Step::new(&unique("auto-stopped"), &input, &output).args(&[
        "--jq",
        ".",
        "--delivery",
        "auto",
    ]);
    let mut process = waiting.start(&broker);
    wait_until("the processor asks", PATIENCE, || {
        waiting.log().contains("asks again")
    });
    process.signal(Signal::SIGTERM);
    let status = process.wait_exit(STOP_PROMISE).expect("exits");
    assert!(status.success(), "log:\n{}", waiting.log());
}

/// Two processors on the same tansu: one committed everything before the broker is killed,
/// the other (commits once an hour) nothing. SIGTERM ends both; the one whose final commit
/// cannot be made exits 1 and says so.
#[test]
fn processors_whose_broker_disappeared_still_stop() {
    let mut broker = Broker::start();
    if !broker.is_tansu() {
        eprintln!("skipped: only the harness's own broker can be killed");
        return;
    }
    let (input, output) = (unique("gone-in"), unique("gone-out"));
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    broker.produce(&input, &numbered(0..20));
    let committed = Step::new(&unique("gone-committed"), &input, &output).args(&[
        "--jq",
        ".",
        "--delivery",
        "at-least-once",
        "--commit-interval-ms",
        "200",
    ]);
    let uncommitted = Step::new(&unique("gone-uncommitted"), &input, &output).args(&[
        "--jq",
        ".",
        "--delivery",
        "at-least-once",
        "--commit-interval-ms",
        "3600000",
    ]);
    let mut first = committed.start(&broker);
    let mut second = uncommitted.start(&broker);
    broker.wait_for_records(&output, "both processed all", |r| r.len() >= 40);
    wait_until("the first committed all", PATIENCE, || {
        broker.committed(&committed.group, &input, 1).get(&0) == Some(&20)
    });
    broker.kill();
    first.signal(Signal::SIGTERM);
    second.signal(Signal::SIGTERM);
    // Generous for a loaded machine; the processor's own clock is checked below.
    let first_status = first.wait_exit(STOP_PROMISE * 3).expect("the first exits");
    let second_status = second
        .wait_exit(STOP_PROMISE * 3)
        .expect("the second exits");

    let log = committed.log();
    assert!(first_status.success(), "log:\n{log}");
    assert_stop_took_under_ten_seconds(&log);
    let log = uncommitted.log();
    assert_eq!(second_status.code(), Some(1), "log:\n{log}");
    let report = final_report(&log).to_string();
    assert!(
        report.contains("the final commit could not be made"),
        "the final report says so: {report}"
    );
    assert_stop_took_under_ten_seconds(&log);
}
