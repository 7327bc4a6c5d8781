//! A stateful step's restore rate from its changelog on a broker (tansu, or the cluster in
//! PLUMBER_TEST_BOOTSTRAP) against a bare consumer reading the same partition to its end, in
//! the same run (issue 26's measure). Run through `bench/stateful-sql.sh` (release build).
//!
//! Environment: `BENCH_RESTORE_KEYS` (default 200000), `BENCH_REPS` (default 5),
//! `BENCH_OUT` (appended to; default bench/results/stateful-sql.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

use plumber_processor::state::restore;
use plumber_sql::{Aggregation, PartitionState, Record};
use plumber_testkit::{Broker, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Reads `topic`/0 from its beginning to its end, keeping nothing: the baseline.
fn bare_read(broker: &Broker, topic: &str) -> usize {
    let consumer: BaseConsumer = broker
        .client()
        .set("group.id", "bench-bare")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let mut read = 0;
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => read += 1,
            Some(Err(KafkaError::PartitionEOF(_))) => return read,
            _ => {}
        }
    }
}

fn main() {
    let keys = env_or("BENCH_RESTORE_KEYS", 200_000);
    let reps = env_or("BENCH_REPS", 5).max(1);
    let out = std::env::var("BENCH_OUT").unwrap_or_else(|_| "bench/results/stateful-sql.md".into());
    let broker = Broker::start();
    let topic = unique("restore-bench");
    broker.create_topic(&topic, 1);
    let aggregation = Aggregation::compile(
        "SELECT _key AS k, COUNT(*) AS n, MAX(v) AS top FROM s GROUP BY _key",
        Some(&["s"]),
    )
    .unwrap();
    let mut state = PartitionState::default();
    for i in 0..keys {
        let key = format!("key-{i}");
        let record = Record {
            value: Some(br#"{"v":1}"#),
            key: Some(key.as_bytes()),
            headers: &[],
        };
        aggregation.feed(&mut state, &record, i as i64).unwrap();
        state.reflects(i as i64);
    }
    let changes = state.take_changes();
    drop(state);
    broker.produce_keyed(&topic, 0, &changes);
    eprintln!(
        "{} changelog entries on {}",
        changes.len(),
        broker.bootstrap()
    );

    let mut bare = Vec::new();
    let mut restores = Vec::new();
    for _ in 0..reps {
        let started = Instant::now();
        let read = bare_read(&broker, &topic);
        bare.push(read as f64 / started.elapsed().as_secs_f64());
        assert_eq!(read, changes.len());
        let started = Instant::now();
        let restored = restore(broker.client(), &topic, 0, Duration::from_secs(300)).unwrap();
        restores.push(changes.len() as f64 / started.elapsed().as_secs_f64());
        assert_eq!(restored.open_groups(), keys);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let (b, b_lo, b_hi) = median(bare);
    let (r, r_lo, r_hi) = median(restores);
    let broker_name = if broker.is_tansu() {
        "tansu (SQLite storage)"
    } else {
        "the cluster in PLUMBER_TEST_BOOTSTRAP"
    };
    let mut md = String::new();
    writeln!(
        md,
        "\n## Restore from a broker ({keys} keys, {})\n",
        broker_name
    )
    .unwrap();
    writeln!(md, "`processor/examples/bench_restore.rs`: the changelog of a running `COUNT, MAX … GROUP BY _key` of {keys} keys on one partition, read to its end by `state::restore` (groupless, `read_committed`, folded into a state) and by a bare consumer that keeps nothing. Medians of {reps}, [ranges].\n").unwrap();
    writeln!(
        md,
        "| reader | entries per second | against the bare consumer |\n|---|---:|---:|"
    )
    .unwrap();
    writeln!(
        md,
        "| bare consumer (the baseline) | {b:.0} [{b_lo:.0}–{b_hi:.0}] | 1.00× |"
    )
    .unwrap();
    writeln!(
        md,
        "| `state::restore` | {r:.0} [{r_lo:.0}–{r_hi:.0}] | {:.2}× the time |",
        b / r
    )
    .unwrap();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&out)
        .unwrap();
    file.write_all(md.as_bytes()).unwrap();
    eprintln!("appended to {out}");
}
