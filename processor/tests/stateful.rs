//! A stateful SQL step run by the processor on a broker (tansu, or the cluster in
//! PLUMBER_TEST_BOOTSTRAP), at least once: its state is restored from the changelog after a
//! kill -9 and after a graceful stop, and every window is emitted with the count of exactly
//! its records. What the kill may repeat is bounded: only windows closed by records after the
//! last commit, each at most twice, with the same result. A graceful stop repeats nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{STOP_PROMISE, Step, start_assigned};
use plumber_testkit::{Broker, TestRecord, unique, wait_until};

const PATIENCE: Duration = Duration::from_secs(90);
/// Event time of record 0, ms (2026-12-03T00:00:00Z).
const BASE: i64 = 1_796_256_000_000;
/// Event time between two records, ms: 50 records a second of event time.
const STEP_MS: i64 = 20;
const KEYS: u32 = 6;

const QUERY: &str = "SELECT _key AS k, COUNT(*) AS n, MIN(id) AS first, window_start FROM s \
                     GROUP BY _key, TUMBLE(at, INTERVAL '1' SECOND)";

/// Record `i`: key `k<i % 6>`, in partition `(i % 6) % 2` (a key stays in one partition).
fn record(i: u32) -> TestRecord {
    let key = i % KEYS;
    let mut record = TestRecord::new(
        &format!("k{key}"),
        &format!(r#"{{"id":{i},"at":{}}}"#, BASE + i64::from(i) * STEP_MS),
    );
    record.partition = Some((key % 2) as i32);
    // Event time is also the record's timestamp, as when producers stamp what happened when.
    record.timestamp = Some(at(i));
    record
}

fn partition_of(i: u32) -> i32 {
    ((i % KEYS) % 2) as i32
}

fn at(i: u32) -> i64 {
    BASE + i64::from(i) * STEP_MS
}

/// One window's output, as the query writes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Window {
    key: String,
    start: i64,
    n: u64,
    first: u64,
}

/// The windows records `0..n` close, computed by hand: a window closes once its
/// partition has a record at or after its end (grace 0). With each one, the offset (in its
/// partition) of the record that closes it.
fn expected(n: u32) -> BTreeMap<Window, (i32, i64)> {
    expected_where(n, |_| true)
}

/// [`expected`] of a query whose WHERE keeps the records `keep` says.
fn expected_where(n: u32, keep: impl Fn(u32) -> bool) -> BTreeMap<Window, (i32, i64)> {
    let mut groups: BTreeMap<(String, i64), (u64, u64, i32)> = BTreeMap::new();
    for i in (0..n).filter(|i| keep(*i)) {
        let start = at(i).div_euclid(1000) * 1000;
        let entry = groups.entry((format!("k{}", i % KEYS), start)).or_insert((
            0,
            u64::from(i),
            partition_of(i),
        ));
        entry.0 += 1;
    }
    let mut closed = BTreeMap::new();
    for ((key, start), (count, first, partition)) in groups {
        // The first record of the partition at or after the window's end, and its offset.
        let closer = (0..n)
            .filter(|i| keep(*i))
            .find(|i| partition_of(*i) == partition && at(*i) >= start + 1000);
        if let Some(closer) = closer {
            let offset = (0..closer)
                .filter(|i| partition_of(*i) == partition)
                .count() as i64;
            closed.insert(
                Window {
                    key,
                    start,
                    n: count,
                    first,
                },
                (partition, offset),
            );
        }
    }
    closed
}

fn windows(records: &[TestRecord]) -> Vec<Window> {
    records
        .iter()
        .map(|r| {
            let value: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            assert_eq!(
                r.key.as_deref(),
                Some(value["k"].as_str().unwrap().as_bytes()),
                "an output is keyed by its group"
            );
            Window {
                key: value["k"].as_str().unwrap().to_owned(),
                start: value["window_start"].as_i64().unwrap(),
                n: value["n"].as_u64().unwrap(),
                first: value["first"].as_u64().unwrap(),
            }
        })
        .collect()
}

/// A counting step's topics: its input (two partitions), output and dead letters.
struct Topics {
    input: String,
    output: String,
    dlq: String,
}

fn topics(broker: &Broker) -> Topics {
    let topics = Topics {
        input: unique("clicks"),
        output: unique("counts"),
        dlq: unique("counts-dlq"),
    };
    broker.create_topic(&topics.input, 2);
    broker.create_topic(&topics.output, 1);
    broker.create_topic(&topics.dlq, 1);
    topics
}

/// A changelog for the counting step's two input partitions.
fn changelog(broker: &Broker, prefix: &str) -> String {
    let topic = unique(prefix);
    broker.create_topic(&topic, 2);
    topic
}

/// An instance of `group` running `query` with its state in `changelog`, at least once,
/// committing every 200 ms.
fn counting(group: &str, topics: &Topics, query: &str, changelog: &str) -> Step {
    Step::new(group, &topics.input, &topics.output)
        .dlq(&topics.dlq)
        .args(&[
            "--sql",
            query,
            "--state-topic",
            changelog,
            "--delivery",
            "at-least-once",
            "--commit-interval-ms",
            "200",
            "--log-format",
            "json",
        ])
}

fn produce(broker: &Broker, topic: &str, range: std::ops::Range<u32>) {
    let records: Vec<TestRecord> = range.map(record).collect();
    broker.produce(topic, &records);
}

#[test]
fn a_windowed_count_survives_a_kill_and_a_stop_with_every_window_counted_once() {
    let broker = Broker::start();
    let topics = topics(&broker);
    let (input, output, dlq) = (
        topics.input.clone(),
        topics.output.clone(),
        topics.dlq.clone(),
    );
    let changelog = changelog(&broker, "counts-state");
    let group = unique("counter");
    let step = counting(&group, &topics, QUERY, &changelog);

    // Life 1: killed once the state was written at least once and windows were emitted.
    produce(&broker, &input, 0..1_500);
    let mut first = start_assigned(&broker, &step);
    wait_until(
        "both partitions' state is in the changelog",
        PATIENCE,
        || {
            let committed = broker.committed(&group, &input, 2);
            committed.len() == 2 && committed.values().all(|offset| *offset > 0)
        },
    );
    first.kill();
    let committed_at_kill = broker.committed(&group, &input, 2);

    // Life 2: restores, goes on, and is stopped gracefully mid-stream.
    produce(&broker, &input, 1_500..2_500);
    let mut second = start_assigned(&broker, &step);
    let closed_so_far = expected(2_000).len();
    broker.wait_for_records(&output, "life 2's windows", |records| {
        windows(records).into_iter().collect::<BTreeSet<_>>().len() >= closed_so_far
    });
    second.signal(nix::sys::signal::Signal::SIGTERM);
    let status = second.wait_exit(STOP_PROMISE).expect("life 2 stops");
    assert!(status.success(), "life 2 stops cleanly: {}", step.log());

    // Life 3: restores again and emits the rest.
    produce(&broker, &input, 2_500..3_500);
    let mut third = start_assigned(&broker, &step);
    let expected = expected(3_500);
    let records = broker.wait_for_records(&output, "every closed window", |records| {
        windows(records).into_iter().collect::<BTreeSet<_>>().len() >= expected.len()
    });
    third.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(third.wait_exit(STOP_PROMISE).is_some_and(|s| s.success()));

    let log = step.log();
    assert!(
        log.matches("state restored").count() >= 2 * 2,
        "lives 2 and 3 restored both partitions: {log}"
    );
    let emitted = windows(&records);
    let distinct: BTreeSet<Window> = emitted.iter().cloned().collect();
    let wanted: BTreeSet<Window> = expected.keys().cloned().collect();
    assert_eq!(
        distinct.difference(&wanted).collect::<Vec<_>>(),
        Vec::<&Window>::new(),
        "no window was counted wrong (a record counted twice, or missed)"
    );
    assert_eq!(
        wanted.difference(&distinct).collect::<Vec<_>>(),
        Vec::<&Window>::new(),
        "every closed window was emitted"
    );
    // What the kill may repeat: windows closed by records at or after the offsets committed
    // when it came, each once more. The graceful stop repeats nothing.
    let mut times: BTreeMap<&Window, usize> = BTreeMap::new();
    for window in &emitted {
        *times.entry(window).or_default() += 1;
    }
    let repeated: Vec<(&Window, usize)> = times.into_iter().filter(|(_, n)| *n > 1).collect();
    for (window, n) in &repeated {
        let (partition, closer) = expected[*window];
        let committed = committed_at_kill.get(&partition).copied().unwrap_or(0);
        assert!(
            *n == 2 && closer >= committed,
            "{window:?} was emitted {n} times, closed by offset {closer} of partition \
             {partition}, before the offset {committed} committed at the kill"
        );
    }
    eprintln!(
        "{} windows, {} repeated after the kill (committed then: {committed_at_kill:?})",
        wanted.len(),
        repeated.len()
    );
    assert!(
        broker.read_all(&dlq).is_empty(),
        "in-order records are never late"
    );
}

/// A replaced step's new life, whose WHERE differs, starts from the old life's offsets with
/// a new, empty changelog and `--rebuild`: it rebuilds the windows open at the cutover from
/// the records before it, without emitting, so every window closed before the cutover comes
/// from the old query, every one after from the new query over all its records, none twice.
#[test]
fn a_new_query_rebuilds_the_open_windows_and_emits_each_window_once() {
    let broker = Broker::start();
    let topics = topics(&broker);
    let (input, output) = (topics.input.clone(), topics.output.clone());
    let (old_state, new_state) = (
        changelog(&broker, "old-state"),
        changelog(&broker, "new-state"),
    );
    let group = unique("counter");
    let life = |query: &str, state: &str, extra: &[&str]| {
        counting(&group, &topics, query, state)
            .log_as(&format!("{group}-{state}"))
            .args(extra)
    };
    let new_query = QUERY.replace("FROM s", "FROM s WHERE id % 7 <> 3");
    let keep_new = |i: u32| i % 7 != 3;

    produce(&broker, &input, 0..1_500);
    let old = life(QUERY, &old_state, &[]);
    let mut first = start_assigned(&broker, &old);
    let before = expected(1_500);
    broker.wait_for_records(&output, "the old life's windows", |records| {
        windows(records).len() >= before.len()
    });
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(first.wait_exit(STOP_PROMISE).is_some_and(|s| s.success()));
    let cutover = broker.committed(&group, &input, 2);
    assert_eq!(
        cutover.values().sum::<i64>(),
        1_500,
        "the graceful stop committed every record"
    );

    produce(&broker, &input, 1_500..3_000);
    let new = life(&new_query, &new_state, &["--rebuild", "1000"]);
    let mut second = start_assigned(&broker, &new);
    // Windows closed by records before the cutover: the old query's. After: the new one's.
    let old_windows = expected(1_500);
    let new_windows: BTreeMap<Window, (i32, i64)> = expected_where(3_000, keep_new)
        .into_iter()
        .filter(|(_, (partition, closer))| *closer >= cutover[partition])
        .collect();
    let wanted: Vec<Window> = old_windows
        .keys()
        .chain(new_windows.keys())
        .cloned()
        .collect();
    let records = broker.wait_for_records(&output, "the new life's windows", |records| {
        windows(records).len() >= wanted.len()
    });
    second.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(second.wait_exit(STOP_PROMISE).is_some_and(|s| s.success()));
    let log = new.log();
    assert!(
        log.contains("state rebuilt from the input, without emitting"),
        "the new life rebuilt: {log}"
    );
    let mut emitted = windows(&records);
    emitted.sort();
    let mut wanted = wanted;
    wanted.sort();
    assert_eq!(
        emitted, wanted,
        "every window once: the old query's before the cutover, the new one's after"
    );
    // The straddling windows were counted with the records before the cutover too.
    let straddling = new_windows.keys().filter(|w| w.first < 1_500).count();
    assert!(straddling > 0, "some window straddles the cutover");
}

/// How many partitions an instance owns by its last assignment, as its log says.
fn owned(step: &Step) -> u64 {
    step.log()
        .lines()
        .rev()
        .filter(|line| line.contains("partitions assigned"))
        .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .and_then(|line| line["owned"].as_u64())
        .unwrap_or(0)
}

/// A second instance joins mid-stream and takes a partition, with its state, from the first;
/// then leaves again, handing it back: each hand-over writes the state before the offsets,
/// so every window is emitted once, with its exact count.
#[test]
fn partitions_that_move_between_instances_take_their_state_along() {
    let broker = Broker::start();
    let topics = topics(&broker);
    let (input, output) = (topics.input.clone(), topics.output.clone());
    let changelog = changelog(&broker, "counts-state");
    let group = unique("counter");
    let instance =
        |n: u32| counting(&group, &topics, QUERY, &changelog).log_as(&format!("{group}-{n}"));
    let (one, two) = (instance(1), instance(2));
    produce(&broker, &input, 0..1_000);
    let mut first = start_assigned(&broker, &one);
    broker.wait_for_records(&output, "the first instance's windows", |records| {
        windows(records).len() >= expected(1_000).len()
    });

    let mut second = two.start(&broker);
    wait_until("the second instance owns a partition", PATIENCE, || {
        owned(&two) == 1 && owned(&one) == 1
    });
    produce(&broker, &input, 1_000..2_000);
    broker.wait_for_records(&output, "both instances' windows", |records| {
        windows(records).len() >= expected(2_000).len()
    });
    assert!(
        two.log().contains("state restored"),
        "the partition's state came along: {}",
        two.log()
    );

    second.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(second.wait_exit(STOP_PROMISE).is_some_and(|s| s.success()));
    wait_until(
        "the first instance owns both partitions again",
        PATIENCE,
        || owned(&one) == 2,
    );
    produce(&broker, &input, 2_000..3_000);
    let wanted: Vec<Window> = expected(3_000).into_keys().collect();
    let records = broker.wait_for_records(&output, "every window", |records| {
        windows(records).len() >= wanted.len()
    });
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(first.wait_exit(STOP_PROMISE).is_some_and(|s| s.success()));
    let mut emitted = windows(&records);
    emitted.sort();
    assert_eq!(
        emitted, wanted,
        "every window once, with its exact count, across two hand-overs"
    );
}

/// A changelog that does not exist stops the processor at its start, naming it, instead of a
/// restore waiting for it.
#[test]
fn a_missing_changelog_is_refused_at_the_start() {
    let broker = Broker::start();
    let (input, output, dlq) = (unique("clicks"), unique("counts"), unique("counts-dlq"));
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    broker.create_topic(&dlq, 1);
    let missing = unique("no-such-state");
    let step = Step::new(&unique("counter"), &input, &output)
        .dlq(&dlq)
        .args(&[
            "--sql",
            QUERY,
            "--state-topic",
            &missing,
            "--log-format",
            "json",
        ]);
    let mut process = step.start(&broker);
    let status = process
        .wait_exit(PATIENCE)
        .expect("the processor stops by itself");
    assert_eq!(status.code(), Some(1), "{}", step.log());
    let log = step.log();
    assert!(
        log.contains(&missing) && log.contains("do not exist"),
        "{log}"
    );
}
