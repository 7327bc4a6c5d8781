//! A processor's process killed in its Pod (an OOM kill, `kill -9`): the container is started
//! again in the same Pod, so under the same `HOSTNAME`, which is the instance part of its
//! transactional id (`<group>.<instance>`, `plumber-processor --instance`).

use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::*;

/// A read_committed reader of a sink from where it ended when made, outside any group.
struct Tail(BaseConsumer);

impl Tail {
    fn at_end(world: &World, topic: &str) -> Tail {
        let consumer: BaseConsumer = world
            .broker
            .client()
            .set("isolation.level", "read_committed")
            // Assigned, never joined or committed: the group only names the client.
            .set("group.id", format!("tail-{topic}"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap();
        let mut assignment = TopicPartitionList::new();
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let (_, end) = consumer
                .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
                .unwrap();
            assignment
                .add_partition_offset(topic, partition.id(), Offset::Offset(end))
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        Tail(consumer)
    }

    /// Waits until a record the load wrote as `seq` or later is read.
    fn wait_for_seq(&self, seq: u64) {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            let Some(Ok(message)) = self.0.poll(Duration::from_millis(100)) else {
                continue;
            };
            let value: Option<serde_json::Value> = message
                .payload()
                .and_then(|v| serde_json::from_slice(v).ok());
            if value
                .and_then(|v| v["seq"].as_u64())
                .is_some_and(|s| s >= seq)
            {
                return;
            }
        }
        panic!("no record written as {seq} or later reached the sink in {PATIENCE:?}");
    }
}

/// The head step `a` killed with records flowing, so with a transaction open on a cluster
/// with transactions. Its restart, in the same Pod, has the killed process's transactional
/// id: it fences the killed producer and aborts its open transaction when it starts, so the
/// read_committed steps below `a` read past it at once rather than after the broker's
/// transaction timeout, and nothing is duplicated. Without transactions (tansu: at-least-once)
/// nothing is lost and the restart repeats at most what the killed process had not
/// committed. On a real cluster the records written after the kill reach the sink before the
/// killed transaction could have timed out.
#[test]
fn a_processor_killed_in_its_pod_restarts_under_its_transactional_id_and_downstream_moves_on() {
    let scratch = Scratch::new();
    let world = World::new("kube-killed");
    let fake = cluster();
    let kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let revisions = vec![first()];
    let r1 = world.commit("first", &revisions[0]);
    let daemon = Replica::start(&fake, &world, "plumber-0", &scratch.path("plumber-0"));
    wait_applied(&fake, r1);
    assert_runs(&fake, &kubelet, &world, &revisions[0]);
    let load = world.start_load(100);
    load.wait_for(200);

    let group = record(&fake)
        .unwrap()
        .deployment
        .lives
        .iter()
        .find(|l| l.step() == "a")
        .map(|l| l.group().to_owned())
        .unwrap();
    let victim = kubelet
        .processes()
        .into_iter()
        .find(|p| p.group == group)
        .unwrap();
    // Records reach `a` all the time: what it read since its last commit is in flight.
    let sink = world.sink_topic("out1").to_owned();
    let before = world.broker.end_offsets(&sink);
    wait_until("a passes records on", PATIENCE, || {
        world.broker.end_offsets(&sink) > before
    });
    let tail = Tail::at_end(&world, &sink);
    let inputs = [world.source_topic().to_owned()];
    let committed = world.committed(&group, &inputs);
    let pid = Pid::from_raw(i32::try_from(victim.pid).unwrap());
    kill(pid, Signal::SIGKILL).unwrap();
    let killed_at = Instant::now();
    let sent_at_kill = load.sent();
    wait_until("the killed process is reaped", PATIENCE, || {
        !kubelet.processes().iter().any(|p| p.pid == victim.pid)
    });
    let uncommitted = world.uncommitted(&committed);

    // Started again in the same Pod: the same name, so the same transactional id.
    let restarted = wait_until_some("a started again", PATIENCE, || {
        kubelet
            .processes()
            .into_iter()
            .find(|p| p.group == group && p.pid != victim.pid)
    });
    assert_eq!(
        restarted.pod, victim.pod,
        "restarted in the killed one's Pod"
    );

    // Downstream moves on: a record written after the kill reaches the sink, read_committed,
    // sooner than the broker would abort the killed transaction on its own.
    tail.wait_for_seq(sent_at_kill);
    let moved_on = killed_at.elapsed();
    // The least a transaction of the processor's may stay open, whatever its commit interval.
    let timeout = plumber_processor::kafka::transaction_timeout(Duration::ZERO);
    eprintln!(
        "killed {} (pid {}); restarted as pid {}; records past the kill reached {sink} after {moved_on:?} (a transaction times out after {timeout:?}); {uncommitted} input records were past its commits",
        victim.pod, victim.pid, restarted.pid
    );
    // On tansu the restart gets no partitions until the stall watchdog restarts it (its
    // group coordinator keeps the killed member's: docs/tansu.md), so only a real cluster shows
    // how soon the pipeline moves on.
    if !world.broker.is_tansu() {
        assert!(
            moved_on < timeout,
            "downstream waited {moved_on:?}, as long as a killed transaction's timeout ({timeout:?})"
        );
    }

    let (sent, final_from) = load.finish(200);
    let duplicates = world.assert_oracle_allowing_duplicates(&revisions, sent, final_from);
    let routes = revisions[0].routes_from("a") as u64;
    eprintln!(
        "duplicates: {duplicates} (at most {} on tansu)",
        uncommitted * routes
    );
    if world.broker.is_tansu() {
        assert!(
            duplicates as u64 <= uncommitted * routes,
            "{duplicates} duplicates; a had only {uncommitted} records past its commits ({routes} routes below it)"
        );
    } else {
        assert_eq!(duplicates, 0, "exactly-once processors duplicate nothing");
    }
    assert_runs(&fake, &kubelet, &world, &revisions[0]);
    daemon.stop();
}
