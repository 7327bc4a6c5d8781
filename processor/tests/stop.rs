//! The foundation of the cutover: a processor stopped with SIGTERM mid-stream commits exactly
//! what it produced, so whoever takes the group over next continues without loss or
//! duplicate. Killed outright, it may duplicate but never lose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Load, STOP_PROMISE, Step, counts, ids, numbered};
use nix::sys::signal::Signal;
use std::collections::BTreeSet;

use plumber_testkit::{Broker, PATIENCE, Process, TestRecord, unique, wait_until};

/// Starts a processor and waits until the group gave it partitions.
///
/// tansu 0.6 sometimes completes a rebalance with a member that was killed (-9) and, once that
/// member's session expires, never gives its partitions to the live one. A fresh member
/// joining after the expiry gets them, so a member left with none is stopped and replaced.
/// Real clusters (PLUMBER_TEST_BOOTSTRAP) pass on the first attempt.
fn start_assigned(broker: &Broker, step: &Step) -> Process {
    let assigned = || {
        step.log()
            .lines()
            .filter(|line| line.contains("partitions assigned"))
            .map(|line| !line.contains(r#""partitions":0"#))
            .collect::<Vec<_>>()
    };
    for _ in 0..5 {
        let before = assigned().len();
        let mut process = step.start(broker);
        wait_until("the new member is assigned partitions", PATIENCE, || {
            assigned().len() > before
        });
        if assigned()[before] {
            return process;
        }
        process.signal(Signal::SIGTERM);
        assert!(process.wait_exit(STOP_PROMISE).expect("exits").success());
    }
    panic!(
        "no member of {} was ever assigned partitions; log:\n{}",
        step.group,
        step.log()
    );
}

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

#[test]
fn kill_9_mid_stream_then_restart_loses_nothing() {
    let (written, all) = interrupt_under_load("kill9", 3, Signal::SIGKILL);
    let by_id = counts(&ids(&all));
    let missing: Vec<u32> = (0..written).filter(|id| !by_id.contains_key(id)).collect();
    assert!(missing.is_empty(), "lost records: {missing:?}");
    let duplicated = all.len() - written as usize;
    // At-least-once on a broker without transactions: a crash may repeat what was not yet
    // committed (up to one commit interval). Reported, not failed.
    eprintln!("kill -9 × 3: {written} records, {duplicated} duplicates at the output");
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
