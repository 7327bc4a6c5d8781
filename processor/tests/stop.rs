//! The foundation of the cutover: a processor stopped with SIGTERM mid-stream commits exactly
//! what it produced, so whoever takes the group over next continues without loss or
//! duplicate. Killed outright, it never loses, and repeats only what it finished after its
//! last commit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use clap::Parser as _;
use common::{Load, STOP_PROMISE, Step, counts, ids, numbered, start_assigned};
use nix::sys::signal::Signal;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use plumber_processor::config::Args;
use plumber_processor::delivery::KAFKA_CALL_TIMEOUT;
use plumber_processor::{Config, DeliveryMode};
use plumber_testkit::{Broker, PATIENCE, TestRecord, unique, wait_until};

/// Runs a processor until the output grows by `at_least` records, then ends it with `signal`.
fn run_a_while(broker: &Broker, step: &Step, output: &str, at_least: i64, signal: Signal) {
    let mut process = start_assigned(broker, step);
    let before = broker.end_offsets(output);
    wait_until(
        &format!(
            "{at_least} more outputs (log: {})",
            step.log_path().display()
        ),
        PATIENCE,
        || broker.end_offsets(output) >= before + at_least,
    );
    process.signal(signal);
    let status = process
        .wait_exit(STOP_PROMISE)
        .expect("the processor exits within 10 s");
    if signal == Signal::SIGTERM {
        assert!(
            status.success(),
            "a graceful stop exits 0, got {status}; log:\n{}",
            step.log()
        );
    }
}

/// Runs a last processor until every written record reached the output, stops it, and
/// returns the output.
fn drain(broker: &Broker, step: &Step, output: &str, written: u32) -> Vec<TestRecord> {
    let mut process = start_assigned(broker, step);
    broker.wait_for_records(output, "every record at the output", |r| {
        ids(r).into_iter().collect::<BTreeSet<u32>>().len() == written as usize
    });
    process.signal(Signal::SIGTERM);
    assert!(process.wait_exit(STOP_PROMISE).expect("exits").success());
    broker.read_all(output)
}

/// Under continuous load, runs the step `cycles` times until it made progress and ends it with
/// `signal`, then lets a last instance catch up. Returns how many records were written and the
/// whole output.
fn interrupt_under_load(name: &str, cycles: usize, signal: Signal) -> (u32, Vec<TestRecord>) {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 3);
    broker.create_topic(&output, 3);
    let step = Step::new(&unique(name), &input, &output).args(&["--jq", "."]);
    let load = Load::start(broker.bootstrap(), &input);
    for _ in 0..cycles {
        run_a_while(&broker, &step, &output, 500, signal);
    }
    let written = load.finish();
    (written, drain(&broker, &step, &output, written))
}

fn assert_exactly_once(all: &[TestRecord], written: u32) {
    let duplicates: Vec<_> = counts(&ids(all))
        .into_iter()
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(
        duplicates.is_empty(),
        "ids not seen exactly once: {duplicates:?}"
    );
    assert_eq!(all.len(), written as usize);
}

#[test]
fn sigterm_mid_stream_then_restart_gives_every_record_exactly_once() {
    let (written, all) = interrupt_under_load("sigterm", 4, Signal::SIGTERM);
    assert_exactly_once(&all, written);
}

/// Offsets per input partition: committed ones, or the end of what was finished.
type Offsets = BTreeMap<i32, i64>;

/// How long the processor may take to commit what it finished, by its own code: the commit
/// interval (`--delivery auto` runs at-least-once on tansu, and the test passes no
/// `--commit-interval-ms`) plus one commit call, which the processor bounds by
/// KAFKA_CALL_TIMEOUT. Its loop asks for a commit at the first housekeeping past the
/// interval (every 50 ms at most), well within the call's bound.
fn commit_deadline() -> Duration {
    let args = ["plumber-processor", "--bootstrap", "b:9092", "--group", "g"];
    let args = Args::try_parse_from(args.iter().chain(&["--input", "in", "--jq", "."])).unwrap();
    Config::try_from(args)
        .unwrap()
        .commit_interval(DeliveryMode::AtLeastOnce)
        + KAFKA_CALL_TIMEOUT
}

/// Where each id was written in the input: (partition, offset).
fn positions(broker: &Broker, input: &str) -> BTreeMap<u32, (i32, i64)> {
    let records = broker.read_all(input);
    ids(&records)
        .into_iter()
        .zip(&records)
        .map(|(id, r)| (id, (r.partition.unwrap(), r.offset.unwrap())))
        .collect()
}

/// Per input partition, the end of the run of inputs from its start whose outputs are all
/// written: what a processor that commits what it finished must have committed by now.
fn finished(outputs: &[TestRecord], positions: &BTreeMap<u32, (i32, i64)>) -> Offsets {
    let mut done: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
    for id in ids(outputs) {
        let (partition, offset) = positions[&id];
        done.entry(partition).or_default().insert(offset);
    }
    done.into_iter()
        .map(|(partition, offsets)| {
            let end = (0..).find(|o| !offsets.contains(o)).unwrap();
            (partition, end)
        })
        .collect()
}

/// Panics unless every partition of `then` is at or behind `now`.
fn assert_not_behind(now: &Offsets, then: &Offsets, what: &str) {
    for (partition, offset) in then {
        let at = now.get(partition).copied().unwrap_or(-1);
        assert!(
            at >= *offset,
            "{what}: partition {partition} committed {at}, behind {offset} ({now:?} against {then:?})"
        );
    }
}

/// What a crash can repeat, and why that bounds the duplicates: at-least-once commits an
/// input's offset only once its outputs are acknowledged, so a processor killed outright has
/// written the outputs of the inputs it finished after its last commit (and of the produce
/// request in flight, which the broker may still take), without their offsets. Its successor
/// starts at the committed offsets and writes those outputs again: each is one duplicate, and
/// nothing else is. The processor commits what it finished within one commit interval (plus
/// the commit call, [`commit_deadline`]), which the test asserts before each kill: so a crash
/// repeats at most one commit interval of records plus the request in flight. A processor that
/// reprocessed more after a crash (from the start of the input, or from an older commit), or
/// committed only when stopped gracefully, fails here.
#[test]
fn kill_9_mid_stream_then_restart_loses_nothing_and_repeats_only_what_was_uncommitted() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 3);
    broker.create_topic(&output, 3);
    let step = Step::new(&unique("kill9"), &input, &output).args(&["--jq", "."]);
    let load = Load::start(broker.bootstrap(), &input);
    let deadline = commit_deadline();
    let mut committed_before = Offsets::new();
    // Per crash, the inputs whose outputs its successor writes again.
    let mut repeatable: Vec<BTreeSet<u32>> = Vec::new();
    for crash in 1..=3 {
        let mut process = start_assigned(&broker, &step);
        let before = broker.end_offsets(&output);
        wait_until("500 more outputs", PATIENCE, || {
            broker.end_offsets(&output) >= before + 500
        });
        let finished = finished(&broker.read_all(&output), &positions(&broker, &input));
        let mut committed = Offsets::new();
        wait_until(
            &format!(
                "what was finished ({finished:?}) is committed within one commit interval and a \
                 commit call (crash {crash}; log: {})",
                step.log_path().display()
            ),
            deadline,
            || {
                committed = broker.committed(&step.group, &input, 3);
                finished
                    .iter()
                    .all(|(p, end)| committed.get(p).is_some_and(|c| c >= end))
            },
        );
        assert_not_behind(
            &committed,
            &committed_before,
            &format!("after the restart that followed crash {}", crash - 1),
        );
        process.signal(Signal::SIGKILL);
        process.wait_exit(STOP_PROMISE).expect("killed");
        // The dead process commits no more: these are the offsets its successor starts at.
        // Its outputs are all written by now (the broker took the request in flight long
        // before this read answers).
        let at_kill = broker.committed(&step.group, &input, 3);
        assert_not_behind(&at_kill, &committed, &format!("at crash {crash}"));
        let positions = positions(&broker, &input);
        repeatable.push(
            ids(&broker.read_all(&output))
                .into_iter()
                .filter(|id| {
                    let (partition, offset) = positions[id];
                    at_kill.get(&partition).is_none_or(|c| offset >= *c)
                })
                .collect(),
        );
        committed_before = at_kill;
    }
    let written = load.finish();
    let all = drain(&broker, &step, &output, written);
    let committed = broker.committed(&step.group, &input, 3);
    assert_not_behind(&committed, &committed_before, "after the last restart");
    assert_eq!(
        committed.values().sum::<i64>(),
        i64::from(written),
        "the last, graceful stop committed every input"
    );

    let by_id = counts(&ids(&all));
    let missing: Vec<u32> = (0..written).filter(|id| !by_id.contains_key(id)).collect();
    assert!(missing.is_empty(), "lost records: {missing:?}");
    let beyond: Vec<(u32, usize, usize)> = by_id
        .iter()
        .map(|(id, n)| {
            (
                *id,
                n - 1,
                repeatable.iter().filter(|r| r.contains(id)).count(),
            )
        })
        .filter(|(_, duplicates, may)| duplicates > may)
        .collect();
    assert!(
        beyond.is_empty(),
        "(id, duplicates, crashes that could repeat it) beyond what the crashes left uncommitted: \
         {beyond:?}"
    );
    let duplicated = all.len() - written as usize;
    let bound: usize = repeatable.iter().map(BTreeSet::len).sum();
    assert!(duplicated <= bound);
    eprintln!(
        "kill -9 × 3: {written} records, {duplicated} duplicates at the output, at most {bound} \
         finished after the last commit before each crash ({:?})",
        repeatable.iter().map(BTreeSet::len).collect::<Vec<_>>()
    );
}

#[test]
fn a_rebalance_hands_partitions_over_without_loss_or_duplicates() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 4);
    broker.create_topic(&output, 2);
    let step = Step::new(&unique("rebalance"), &input, &output).args(&["--jq", "."]);
    let load = Load::start(broker.bootstrap(), &input);
    let mut first = step.start(&broker);
    let grown = |by: i64| {
        let before = broker.end_offsets(&output);
        wait_until("the output grows", PATIENCE, || {
            broker.end_offsets(&output) >= before + by
        });
    };
    grown(300);
    // A second member joins: the first must commit what it did before giving partitions up.
    let mut second = step.start(&broker);
    grown(1000);
    first.signal(Signal::SIGTERM);
    assert!(
        first
            .wait_exit(STOP_PROMISE)
            .expect("first exits")
            .success()
    );
    let written = load.finish();
    broker.wait_for_records(&output, "every record at the output", |r| {
        ids(r).into_iter().collect::<BTreeSet<u32>>().len() == written as usize
    });
    second.signal(Signal::SIGTERM);
    assert!(
        second
            .wait_exit(STOP_PROMISE)
            .expect("second exits")
            .success(),
        "log:\n{}",
        step.log()
    );

    assert_exactly_once(&broker.read_all(&output), written);
}

const STUCK_ON_THREE: &str = r#"
import json, sys, time
for line in sys.stdin:
    record = json.loads(line)
    n = record["value"]["id"]
    if n == 3:
        time.sleep(3600)
    print(json.dumps({"id": record["id"], "outputs": [{"value": {"id": n}}]}), flush=True)
"#;

#[test]
fn a_stuck_record_is_abandoned_uncommitted_and_the_stop_still_takes_under_ten_seconds() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 1);
    broker.create_topic(&output, 1);
    broker.produce(&input, &numbered(1..6));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("stuck.py");
    std::fs::write(&script, STUCK_ON_THREE).unwrap();
    let step = Step::new(&unique("stuck"), &input, &output).args(&[
        "--exec",
        "--",
        "python3",
        script.to_str().unwrap(),
    ]);
    let mut process = step.start(&broker);
    broker.wait_for_records(&output, "the two records before the stuck one", |r| {
        r.len() >= 2
    });
    // Ids 1 and 2 are out, so id 3 is the record in hand.
    process.signal(Signal::SIGTERM);
    let status = process
        .wait_exit(STOP_PROMISE)
        .expect("exits within 10 s despite the stuck record");
    assert!(status.success(), "log:\n{}", step.log());
    assert_eq!(ids(&broker.read_all(&output)), [1, 2]);
    let committed = broker.committed(&step.group, &input, 1);
    assert_eq!(
        committed.get(&0),
        Some(&2),
        "offset 2 (id 3) is where the next owner starts"
    );
    assert!(step.log().contains("abandoned"), "log:\n{}", step.log());
}

/// What the cutover's drain watches: a running processor commits what it finished every
/// commit interval (from its background committer), not only when it stops.
#[test]
fn a_running_processor_commits_what_it_finished() {
    let broker = Broker::start();
    let (input, output) = (unique("periodic-in"), unique("periodic-out"));
    broker.create_topic(&input, 3);
    broker.create_topic(&output, 3);
    broker.produce(&input, &numbered(0..300));
    let step = Step::new(&unique("periodic"), &input, &output).args(&[
        "--jq",
        ".",
        "--delivery",
        "at-least-once",
        "--commit-interval-ms",
        "200",
    ]);
    let mut process = start_assigned(&broker, &step);
    wait_until(
        &format!(
            "all 300 inputs committed (log: {})",
            step.log_path().display()
        ),
        PATIENCE,
        || {
            broker
                .committed(&step.group, &input, 3)
                .values()
                .sum::<i64>()
                == 300
        },
    );
    assert!(
        process.wait_exit(std::time::Duration::ZERO).is_none(),
        "the offsets were committed while the processor runs"
    );
    assert_eq!(broker.end_offsets(&output), 300);
    process.signal(Signal::SIGTERM);
    assert!(process.wait_exit(STOP_PROMISE).expect("exits").success());
}

/// What the local runtime's stop returns on: a stopping processor says on `/metrics` that its
/// final commit is made, with the group's offsets final, before it has left its group and
/// exited; nothing moves them after that.
#[test]
fn a_stop_shows_its_final_commit_before_the_exit_and_the_offsets_stay() {
    let broker = Broker::start();
    let (input, output) = (unique("final-in"), unique("final-out"));
    broker.create_topic(&input, 3);
    broker.create_topic(&output, 3);
    broker.produce(&input, &numbered(0..300));
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    // Commits only when it stops.
    let step = Step::new(&unique("final"), &input, &output).args(&[
        "--jq",
        ".",
        "--delivery",
        "at-least-once",
        "--commit-interval-ms",
        "600000",
        "--metrics",
        &address,
    ]);
    let made = || {
        ureq::get(&format!("http://{address}/metrics"))
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .ok()
            .map(|page| {
                page.lines()
                    .any(|l| l == "plumber_processor_final_commit_made 1")
            })
    };
    let mut process = start_assigned(&broker, &step);
    wait_until("all 300 inputs are processed", PATIENCE, || {
        broker.end_offsets(&output) == 300
    });
    assert_eq!(made(), Some(false), "not before the stop");
    assert!(broker.committed(&step.group, &input, 3).is_empty());

    process.signal(Signal::SIGTERM);
    let mut seen = None;
    wait_until(
        "the final commit is shown, or the processor exits",
        PATIENCE,
        || {
            if made() == Some(true) {
                seen = Some(broker.committed(&step.group, &input, 3));
            }
            seen.is_some() || process.wait_exit(Duration::ZERO).is_some()
        },
    );
    assert!(process.wait_exit(STOP_PROMISE).expect("exits").success());
    let after_exit = broker.committed(&step.group, &input, 3);
    assert_eq!(after_exit.values().sum::<i64>(), 300);
    match seen {
        Some(at_the_signal) => assert_eq!(at_the_signal, after_exit, "final when shown"),
        // tansu takes about 0.2 s to let a member leave and close: the gauge is seen there.
        // A real cluster may close faster than a scrape.
        None => assert!(
            std::env::var_os("PLUMBER_TEST_BOOTSTRAP").is_some(),
            "the processor exited before its final commit was shown"
        ),
    }
}

/// Writes ids `partition * 1000 + i` for `i` in `range` to `topic`'s `partition`: on a
/// partition filled from 0, id `p * 1000 + i` is at offset `i`.
fn fill(broker: &Broker, topic: &str, partition: i32, range: std::ops::Range<u32>) {
    let entries: Vec<(Vec<u8>, Option<Vec<u8>>)> = range
        .map(|i| {
            let id = partition as u32 * 1000 + i;
            (
                format!("k{id}").into_bytes(),
                Some(format!(r#"{{"id":{id}}}"#).into_bytes()),
            )
        })
        .collect();
    broker.produce_keyed(topic, partition, &entries);
}

/// Commits `offsets` (partition, offset) of `topic` to `group` from outside it, as the
/// cutover engine hands a warm successor its start.
fn hand_off(broker: &Broker, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
    let consumer: BaseConsumer = broker
        .client()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("hand-off client");
    let mut list = rdkafka::TopicPartitionList::new();
    for (partition, offset) in offsets {
        list.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(*offset))
            .expect("offset");
    }
    consumer
        .commit(&list, CommitMode::Sync)
        .expect("the hand-off is committed");
}

/// A `--jq .` step of `group` started warm: its hand-off group is `<group>.handoff`.
fn warm_step(group: &str, input: &str, output: &str) -> (Step, String) {
    let handoff = format!("{group}.handoff");
    let step = Step::new(group, input, output).args(&[
        "--jq",
        ".",
        "--delivery",
        "at-least-once",
        "--handoff-group",
        &handoff,
    ]);
    (step, handoff)
}

/// A warm start (`--handoff-group`), the successor's half of a cutover users do not notice:
/// it joins its group and holds its partitions while the hand-off group names no start, then
/// starts exactly where the hand-off says (never from where a group without offsets would
/// begin), leaves its group's committed offsets there for whoever owns a partition next, and
/// once it has them a restart does not wait again.
#[test]
fn a_warm_start_reads_nothing_before_the_hand_off_and_starts_exactly_there() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 2);
    broker.create_topic(&output, 2);
    let fill = |partition, range| fill(&broker, &input, partition, range);
    fill(0, 0..100);
    fill(1, 0..100);
    let group = unique("warm");
    let (step, handoff) = warm_step(&group, &input, &output);
    let mut process = start_assigned(&broker, &step);
    wait_until("both partitions held", PATIENCE, || {
        step.log().lines().any(|l| {
            l.contains("partitions held until their start is known") && l.contains(r#""held":2"#)
        })
    });
    // More records while it holds them: a reader would have plenty.
    fill(0, 100..150);
    fill(1, 100..150);
    assert!(
        !step.log().contains("held partitions started"),
        "started without a hand-off; log:\n{}",
        step.log()
    );

    hand_off(&broker, &handoff, &input, &[(0, 40), (1, 70)]);
    let expected: BTreeSet<u32> = (40..150).chain((70..150).map(|i| 1000 + i)).collect();
    broker.wait_for_records(&output, "every record from the hand-off on", |records| {
        ids(records).into_iter().collect::<BTreeSet<u32>>().len() >= expected.len()
    });
    let log = step.log();
    assert!(log.contains("the hand-off came"), "{log}");
    assert!(log.contains(r#""from_handoff":2"#), "{log}");
    process.signal(Signal::SIGTERM);
    assert!(process.wait_exit(STOP_PROMISE).expect("exits").success());
    let outputs = ids(&broker.read_all(&output));
    let before: Vec<&u32> = outputs.iter().filter(|id| !expected.contains(id)).collect();
    assert!(
        before.is_empty(),
        "read before the hand-off's offsets: {before:?}"
    );
    assert_eq!(
        counts(&outputs).values().filter(|n| **n > 1).count(),
        0,
        "a graceful stop repeats nothing"
    );
    assert_eq!(
        broker.committed(&group, &input, 2),
        BTreeMap::from([(0, 150), (1, 150)])
    );

    // Started again with the same flag: its group has offsets, so nothing is held for long
    // and nothing is read twice.
    let mut again = start_assigned(&broker, &step);
    fill(0, 150..160);
    fill(1, 150..160);
    broker.wait_for_records(&output, "the new records", |records| {
        ids(records).contains(&1159) && ids(records).contains(&159)
    });
    again.signal(Signal::SIGTERM);
    assert!(again.wait_exit(STOP_PROMISE).expect("exits").success());
    let outputs = ids(&broker.read_all(&output));
    assert_eq!(outputs.len(), expected.len() + 20, "each record once");
}

/// A hand-off names the partitions its inputs had when the engine wrote it (in one commit,
/// written whole): a partition it does not name came to the topic later, nobody read it
/// before the cutover, and it starts from its beginning rather than wait for a hand-off that
/// never names it. (tansu cannot add partitions: a hand-off that leaves one out stands in.)
#[test]
fn a_partition_newer_than_the_hand_off_starts_from_its_beginning() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 2);
    broker.create_topic(&output, 2);
    fill(&broker, &input, 0, 0..30);
    fill(&broker, &input, 1, 0..30);
    let group = unique("warm-new");
    let (step, handoff) = warm_step(&group, &input, &output);
    let mut process = start_assigned(&broker, &step);
    hand_off(&broker, &handoff, &input, &[(0, 10)]);
    let expected: BTreeSet<u32> = (10..30).chain((0..30).map(|i| 1000 + i)).collect();
    broker.wait_for_records(
        &output,
        "partition 0 from 10, partition 1 whole",
        |records| ids(records).into_iter().collect::<BTreeSet<u32>>().len() >= expected.len(),
    );
    process.signal(Signal::SIGTERM);
    assert!(process.wait_exit(STOP_PROMISE).expect("exits").success());
    let log = step.log();
    assert!(log.contains(r#""newer_than_handoff":1"#), "{log}");
    let outputs = ids(&broker.read_all(&output));
    assert_eq!(
        outputs.iter().copied().collect::<BTreeSet<u32>>(),
        expected,
        "partition 0 from the hand-off, the newer partition from its beginning"
    );
    assert_eq!(outputs.len(), expected.len(), "each record once");
    assert_eq!(
        broker.committed(&group, &input, 2),
        BTreeMap::from([(0, 30), (1, 30)])
    );
}

/// Two warm instances of one successor (its `scale.min`): the partitions the group spreads
/// over them are all held until the hand-off, then each starts exactly there, whichever
/// instance owns it.
#[test]
fn warm_instances_share_the_hand_off_whoever_owns_a_partition() {
    let broker = Broker::start();
    let (input, output) = (unique("in"), unique("out"));
    broker.create_topic(&input, 4);
    broker.create_topic(&output, 2);
    for partition in 0..4 {
        fill(&broker, &input, partition, 0..50);
    }
    let group = unique("warm2");
    let handoff = format!("{group}.handoff");
    let steps: Vec<Step> = (0..2)
        .map(|n| {
            Step::new(&group, &input, &output)
                .args(&["--jq", ".", "--delivery", "at-least-once"])
                .args(&["--handoff-group", &handoff])
                .log_as(&format!("{group}.{n}"))
        })
        .collect();
    let held = |step: &Step| {
        step.log()
            .lines()
            .rev()
            .filter(|l| l.contains("partitions held until their start is known"))
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|l| l["held"].as_u64())
            .unwrap_or(0)
    };
    let mut first = start_assigned(&broker, &steps[0]);
    let mut second = steps[1].start(&broker);
    wait_until("the group's 4 partitions held over both", PATIENCE, || {
        let (a, b) = (held(&steps[0]), held(&steps[1]));
        a > 0 && b > 0 && a + b == 4
    });
    let handed: Vec<(i32, i64)> = vec![(0, 10), (1, 20), (2, 30), (3, 40)];
    hand_off(&broker, &handoff, &input, &handed);
    let expected: BTreeSet<u32> = handed
        .iter()
        .flat_map(|&(p, from)| (from as u32..50).map(move |i| p as u32 * 1000 + i))
        .collect();
    broker.wait_for_records(&output, "every record from the hand-off on", |records| {
        ids(records).into_iter().collect::<BTreeSet<u32>>().len() >= expected.len()
    });
    for (process, step) in [(&mut second, &steps[1]), (&mut first, &steps[0])] {
        process.signal(Signal::SIGTERM);
        assert!(
            process.wait_exit(STOP_PROMISE).expect("exits").success(),
            "{}",
            step.log()
        );
    }
    let outputs = ids(&broker.read_all(&output));
    let outside: Vec<&u32> = outputs.iter().filter(|id| !expected.contains(id)).collect();
    assert!(
        outside.is_empty(),
        "read before the hand-off's offsets: {outside:?}"
    );
    assert_eq!(outputs.len(), expected.len(), "each record once");
    assert_eq!(
        broker.committed(&group, &input, 4),
        BTreeMap::from([(0, 50), (1, 50), (2, 50), (3, 50)])
    );
}
