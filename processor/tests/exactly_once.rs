//! Exactly-once paths on rdkafka's MockCluster (tansu 0.6 has no transactions), or on the
//! cluster in PLUMBER_TEST_BOOTSTRAP: outputs and offsets commit in transactions, a crashed
//! instance's open transaction is never visible to read_committed readers, a fenced zombie
//! cannot commit, and transactions stay short however slow the transform.
//!
//! Each test fails when the processor runs exactly-once without transactions (at-least-once
//! under the exactly-once name): on the mock through what it can tell (below); what only a
//! real cluster shows is asserted only there, never replaced by something weaker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use clap::Parser;
use common::{STOP_PROMISE, Step, counts, ids, numbered};
use nix::sys::signal::Signal;
use plumber_processor::config::Args;
use plumber_processor::stop::Stop;
use plumber_processor::{Config, DeliveryMode};
use plumber_testkit::{Broker, PATIENCE, unique, wait_until};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

/// A broker with transactions: the cluster in PLUMBER_TEST_BOOTSTRAP, else rdkafka's
/// MockCluster (librdkafka 2.12's). The mock speaks the transaction protocol and checks
/// producer ids and epochs, but keeps no transaction state: it drops the offsets committed in
/// a transaction (TxnOffsetCommit) while it stores plain OffsetCommits, writes no commit or
/// abort markers, and serves read_committed readers up to the high watermark; it also hands a
/// restarted transactional id a new producer id instead of bumping its epoch, so it fences
/// nobody by itself. What depends on that is asserted only on a real cluster (`real`).
struct Transactional {
    cluster: Option<MockCluster<'static, DefaultProducerContext>>,
    broker: Broker,
    real: bool,
}

fn transactional() -> Transactional {
    if std::env::var("PLUMBER_TEST_BOOTSTRAP").is_ok_and(|b| !b.is_empty()) {
        return Transactional {
            cluster: None,
            broker: Broker::start(),
            real: true,
        };
    }
    let cluster = MockCluster::new(1).expect("mock cluster");
    let broker = Broker::external(cluster.bootstrap_servers());
    Transactional {
        cluster: Some(cluster),
        broker,
        real: false,
    }
}

impl Transactional {
    fn topic(&self, prefix: &str, partitions: i32) -> String {
        let name = unique(prefix);
        match &self.cluster {
            Some(cluster) => cluster
                .create_topic(&name, partitions, 1)
                .expect("mock topic"),
            None => self.broker.create_topic(&name, partitions),
        }
        name
    }

    /// The offsets `group` committed on `topic` went through transactions: on a real cluster
    /// they add up to `expected`. The mock drops offsets committed in a transaction and keeps
    /// plain commits, so there an offset it holds is one committed outside a transaction,
    /// which at-least-once (or exactly-once without its transactions) does on every stop.
    fn assert_offsets_committed_in_transactions(
        &self,
        group: &str,
        topic: &str,
        partitions: i32,
        expected: i64,
    ) {
        let committed = self.broker.committed(group, topic, partitions);
        if self.real {
            assert_eq!(
                committed.values().sum::<i64>(),
                expected,
                "every input offset committed with its outputs: {committed:?}"
            );
        } else {
            assert!(
                committed.is_empty(),
                "offsets committed outside a transaction (the mock keeps only those): {committed:?}"
            );
        }
    }
}

/// Never commits on its own: the transaction stays open until stop or revocation.
const LONG_TRANSACTIONS: [&str; 2] = ["--commit-interval-ms", "3600000"];

fn config(bootstrap: &str, delivery: &str) -> Config {
    let args = Args::try_parse_from([
        "plumber-processor",
        "--bootstrap",
        bootstrap,
        "--group",
        "g",
        "--input",
        "in",
        "--jq",
        ".",
        "--delivery",
        delivery,
    ])
    .unwrap();
    Config::try_from(args).unwrap()
}

#[test]
fn delivery_auto_picks_exactly_once_only_where_the_brokers_have_transactions() {
    let tx = transactional();
    let stop = Stop::default();
    let mode =
        plumber_processor::pipeline::delivery_mode(&config(tx.broker.bootstrap(), "auto"), &stop);
    assert_eq!(mode.unwrap(), Some(DeliveryMode::ExactlyOnce));

    let tansu = Broker::start();
    if tansu.is_tansu() {
        let auto =
            plumber_processor::pipeline::delivery_mode(&config(tansu.bootstrap(), "auto"), &stop);
        assert_eq!(
            auto.unwrap(),
            Some(DeliveryMode::AtLeastOnce),
            "tansu 0.6 has no EndTxn"
        );
        let forced = plumber_processor::pipeline::delivery_mode(
            &config(tansu.bootstrap(), "exactly-once"),
            &stop,
        );
        assert!(
            forced.is_err(),
            "exactly-once is refused, not silently downgraded"
        );
    }
}

#[test]
fn outputs_dead_letters_and_offsets_commit_in_transactions() {
    let tx = transactional();
    let (input, output, dlq) = (tx.topic("in", 3), tx.topic("out", 2), tx.topic("dlq", 1));
    let mut records = numbered(0..300);
    records.push(plumber_testkit::TestRecord::new("bad", "not json"));
    tx.broker.produce(&input, &records);
    let step = Step::new(&unique("eos"), &input, &output).dlq(&dlq).args(&[
        "--jq",
        ".",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let mut process = step.start(&tx.broker);
    tx.broker
        .wait_for_records(&output, "300 outputs", |r| r.len() >= 300);
    tx.broker
        .wait_for_records(&dlq, "the dead letter", |r| !r.is_empty());
    process.signal(Signal::SIGTERM);
    assert!(
        process.wait_exit(STOP_PROMISE).expect("exits").success(),
        "log:\n{}",
        step.log()
    );

    let log = step.log();
    assert!(log.contains(r#""mode":"exactly-once""#), "log:\n{log}");
    assert!(!log.contains("ERROR"), "no transaction call failed:\n{log}");
    let by_id = counts(&ids(&tx.broker.read_all(&output)));
    assert_eq!(by_id.len(), 300);
    assert!(by_id.values().all(|n| *n == 1));
    tx.assert_offsets_committed_in_transactions(&step.group, &input, 3, 301);
}

/// An instance killed with its transaction open: its restart (same transactional id) processes
/// every input again and commits it in a transaction of its own.
///
/// What the mock cannot show: that the killed instance's 200 records are aborted and never
/// reach read_committed readers. It writes no abort markers and serves read_committed readers
/// up to the high watermark, so there they are visible beside the restart's 200. That, and
/// that each record is seen once, is asserted only on a real cluster; on the mock the test
/// shows that the restart's offsets went through a transaction.
#[test]
fn a_crashed_instance_s_restart_processes_its_open_transaction_again_transactionally() {
    let tx = transactional();
    let (input, output) = (tx.topic("in", 2), tx.topic("out", 2));
    tx.broker.produce(&input, &numbered(0..200));
    let step = Step::new(&unique("crash"), &input, &output)
        .args(&["--jq", ".", "--instance", "replica-0"])
        .args(&LONG_TRANSACTIONS);
    let mut first = step.start(&tx.broker);
    wait_until(
        "the first instance produced all 200 outputs in its open transaction",
        PATIENCE,
        || tx.broker.read_all_uncommitted(&output).len() >= 200,
    );
    if tx.real {
        assert!(
            tx.broker.read_all(&output).is_empty(),
            "nothing is visible before the commit"
        );
    }
    first.signal(Signal::SIGKILL);
    first.wait_exit(STOP_PROMISE).expect("killed");

    // Same transactional id: the restart fences the dead instance and aborts its transaction.
    let restarted = Step {
        args: ["--jq", ".", "--instance", "replica-0"]
            .map(String::from)
            .to_vec(),
        ..step
    }
    .log_as(&unique("crash-restart"));
    let mut second = restarted.start(&tx.broker);
    wait_until(
        "the restart committed its own transaction",
        PATIENCE,
        || {
            restarted.log().contains("partitions assigned")
                && tx.broker.read_all_uncommitted(&output).len() >= 400
        },
    );
    second.signal(Signal::SIGTERM);
    let status = second.wait_exit(STOP_PROMISE).expect("exits");
    assert!(status.success(), "log:\n{}", restarted.log());

    if tx.real {
        let by_id = counts(&ids(&tx.broker.read_all(&output)));
        assert_eq!(by_id.len(), 200);
        assert!(
            by_id.values().all(|n| *n == 1),
            "no duplicate through the crash: {by_id:?}"
        );
    }
    // On the log: the aborted attempt and the committed one.
    assert_eq!(tx.broker.read_all_uncommitted(&output).len(), 400);
    tx.assert_offsets_committed_in_transactions(&restarted.group, &input, 2, 200);
}

/// On a real cluster a successor with the same transactional id fences the frozen instance.
/// The mock hands every new producer a fresh producer id instead of bumping the epoch of the
/// transactional id, so there the broker's answer to the zombie is injected: the
/// PRODUCER_FENCED a real broker sends.
#[test]
fn a_fenced_zombie_cannot_commit() {
    let tx = transactional();
    let (input, output) = (tx.topic("in", 2), tx.topic("out", 2));
    tx.broker.produce(&input, &numbered(0..100));
    let session = [
        "-X",
        "session.timeout.ms=6000",
        "-X",
        "heartbeat.interval.ms=500",
    ];
    let zombie_step = Step::new(&unique("zombie"), &input, &output)
        .args(&["--jq", ".", "--instance", "replica-0"])
        .args(&session)
        .args(&LONG_TRANSACTIONS);
    let mut zombie = zombie_step.start(&tx.broker);
    wait_until(
        "the zombie-to-be produced all 100 outputs in its open transaction",
        PATIENCE,
        || tx.broker.read_all_uncommitted(&output).len() >= 100,
    );

    let successor_step = Step::new(&zombie_step.group, &input, &output)
        .log_as(&format!("{}-successor", zombie_step.group))
        .args(&["--jq", ".", "--instance", "replica-0"])
        .args(&session);
    let mut successor = None;
    match &tx.cluster {
        None => {
            // Frozen, it keeps its open transaction and its group membership.
            zombie.signal(Signal::SIGSTOP);
            let process = successor_step.start(&tx.broker);
            // "processing" is logged after init_transactions: the old epoch is fenced.
            wait_until(
                "the successor initialised its transactions",
                PATIENCE,
                || successor_step.log().contains(r#""message":"processing""#),
            );
            successor = Some(process);
            zombie.signal(Signal::SIGCONT);
        }
        Some(cluster) => cluster.request_errors(
            RDKafkaApiKey::EndTxn,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED; 5],
        ),
    }
    zombie.signal(Signal::SIGTERM);
    let status = zombie.wait_exit(STOP_PROMISE).expect("the zombie exits");
    let log = zombie_step.log();
    assert_eq!(
        status.code(),
        Some(1),
        "a fenced instance fails, never reports success:\n{log}"
    );
    assert!(
        log.to_lowercase().contains("fenced"),
        "the error names the fencing:\n{log}"
    );
    assert!(
        !log.contains(r#""message":"stopped""#),
        "no clean-stop summary:\n{log}"
    );

    if let Some(cluster) = &tx.cluster {
        cluster.clear_request_errors(RDKafkaApiKey::EndTxn);
    }
    let mut successor = successor.unwrap_or_else(|| successor_step.start(&tx.broker));
    wait_until("the successor took both partitions", PATIENCE, || {
        successor_step
            .log()
            .contains(r#""partitions assigned","partitions":2"#)
    });
    successor.signal(Signal::SIGTERM);
    assert!(
        successor.wait_exit(STOP_PROMISE).expect("exits").success(),
        "log:\n{}",
        successor_step.log()
    );
    if tx.real {
        let by_id = counts(&ids(&tx.broker.read_all(&output)));
        assert_eq!(
            by_id.keys().copied().collect::<BTreeSet<_>>(),
            (0..100).collect()
        );
        assert!(
            by_id.values().all(|n| *n == 1),
            "the zombie's work never became visible: {by_id:?}"
        );
    }
}

/// Ids below 10 at once, then 3 s for id 10 and 0.3 s for each after it: the twenty records
/// take longer than a transaction may stay open (a real broker aborts it after
/// transaction.timeout.ms; the mock does not, so the test reads how long each stayed open
/// from the processor's histogram). Id 10 starts with the transaction of the quick ones
/// still open, since they took less than the commit interval.
const SLOW_STEP: &str = r#"
import json, sys, time
for line in sys.stdin:
    record = json.loads(line)
    n = record["value"]["id"]
    time.sleep(0 if n < 10 else 3 if n == 10 else 0.3)
    print(json.dumps({"id": record["id"], "outputs": [{"value": {"id": n}}]}), flush=True)
"#;

/// The value of the sample `name` (with its labels) in Prometheus text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[test]
fn a_transform_slower_than_a_transaction_may_stay_open_commits_as_it_goes() {
    let tx = transactional();
    let (input, output) = (tx.topic("in", 1), tx.topic("out", 1));
    tx.broker.produce(&input, &numbered(0..20));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("slow.py");
    std::fs::write(&script, SLOW_STEP).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let step = Step::new(&unique("slow"), &input, &output).args(&[
        "--delivery",
        "exactly-once",
        "--metrics",
        &metrics,
        "--exec",
        "--",
        "python3",
        script.to_str().unwrap(),
    ]);
    let mut process = step.start(&tx.broker);
    tx.broker
        .wait_for_records(&output, "20 outputs", |r| r.len() >= 20);
    let scrape = || {
        ureq::get(&format!("http://{metrics}/metrics"))
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .unwrap_or_default()
    };
    let open = "plumber_processor_transaction_open_seconds";
    wait_until("the last transaction is committed", PATIENCE, || {
        let text = scrape();
        text.contains(open) && sample(&text, &format!("{open}_count")) >= 10.0
    });
    let text = scrape();
    // A transaction for each slow record, none open longer than a second, though id 10
    // took 3 s and all twenty took 6 s.
    let transactions = sample(&text, &format!("{open}_count"));
    let within_a_second = sample(&text, &format!(r#"{open}_bucket{{le="1.024"}}"#));
    assert_eq!(within_a_second, transactions, "{text}");
    assert_eq!(
        sample(&text, "plumber_processor_transaction_aborts_total"),
        0.0
    );
    process.signal(Signal::SIGTERM);
    assert!(
        process.wait_exit(STOP_PROMISE).expect("exits").success(),
        "log:\n{}",
        step.log()
    );
    let by_id = counts(&ids(&tx.broker.read_all(&output)));
    assert_eq!(by_id.len(), 20);
    assert!(by_id.values().all(|n| *n == 1), "{by_id:?}");
}

/// A stateful step exactly once: its changelog entries go into the transactions that commit
/// its outputs and offsets, and a second life restores the state and emits only what comes
/// after it. On the mock, which drops offsets committed in transactions, the second life
/// reads the input from its start again: the offset its restored state reflects keeps it from
/// emitting a window twice (on a real cluster it starts after the committed offsets).
#[test]
fn a_stateful_step_writes_its_state_in_its_transactions_and_restores_it() {
    let tx = transactional();
    let (input, output, dlq, changelog) = (
        tx.topic("clicks", 1),
        tx.topic("counts", 1),
        tx.topic("dlq", 1),
        tx.topic("state", 1),
    );
    // Three keys, a record every 20 ms of event time: 1 s windows of about 17 records.
    let records = |range: std::ops::Range<u32>| -> Vec<plumber_testkit::TestRecord> {
        range
            .map(|i| {
                plumber_testkit::TestRecord::new(
                    &format!("k{}", i % 3),
                    &format!(
                        r#"{{"id":{i},"at":{}}}"#,
                        1_796_256_000_000_i64 + i64::from(i) * 20
                    ),
                )
            })
            .collect()
    };
    // Windows a partition of `n` records in order closes: all but the last second's.
    let closed = |n: u32| -> usize {
        let seconds = (n - 1) * 20 / 1000;
        3 * seconds as usize
    };
    tx.broker.produce(&input, &records(0..600));
    let step = Step::new(&unique("eos-counts"), &input, &output)
        .dlq(&dlq)
        .args(&[
            "--sql",
            "SELECT _key AS k, COUNT(*) AS n, window_start FROM s \
             GROUP BY _key, TUMBLE(at, INTERVAL '1' SECOND)",
            "--state-topic",
            &changelog,
            "--delivery",
            "exactly-once",
            "--log-format",
            "json",
        ]);
    let mut first = step.start(&tx.broker);
    tx.broker
        .wait_for_records(&output, "the first life's windows", |r| {
            r.len() >= closed(600)
        });
    first.signal(Signal::SIGTERM);
    assert!(
        first.wait_exit(STOP_PROMISE).expect("exits").success(),
        "log:\n{}",
        step.log()
    );
    let log = step.log();
    assert!(log.contains(r#""mode":"exactly-once""#), "log:\n{log}");
    assert!(!log.contains("ERROR"), "no transaction call failed:\n{log}");
    tx.assert_offsets_committed_in_transactions(&step.group, &input, 1, 600);
    let meta = tx
        .broker
        .read_all(&changelog)
        .into_iter()
        .rev()
        .find(|entry| entry.key.as_deref() == Some(b"\0"))
        .expect("the partition's own entry is in the changelog");
    let meta: serde_json::Value = serde_json::from_slice(meta.value.as_deref().unwrap()).unwrap();
    assert_eq!(
        meta["offset"], 599,
        "the state reflects every record: {meta}"
    );

    tx.broker.produce(&input, &records(600..900));
    let mut second = step.start(&tx.broker);
    let outputs = tx
        .broker
        .wait_for_records(&output, "the second life's windows", |r| {
            r.len() >= closed(900)
        });
    second.signal(Signal::SIGTERM);
    assert!(second.wait_exit(STOP_PROMISE).expect("exits").success());
    let windows: Vec<(String, i64, i64)> = outputs
        .iter()
        .map(|r| {
            let value: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            (
                value["k"].as_str().unwrap().to_owned(),
                value["window_start"].as_i64().unwrap(),
                value["n"].as_i64().unwrap(),
            )
        })
        .collect();
    let distinct: BTreeSet<&(String, i64, i64)> = windows.iter().collect();
    assert_eq!(
        distinct.len(),
        windows.len(),
        "a window emitted twice: {windows:?}"
    );
    assert_eq!(windows.len(), closed(900));
    assert!(
        step.log().contains("state restored"),
        "the second life restored the state"
    );
}
