//! Rebalances (issue 16): instances that join and leave a step's group while records flow
//! hand partitions over without loss or duplicate, under the cooperative protocol (the
//! default, KIP-429: only the partitions that move stop) and under the eager one
//! (`--assignor eager`: every change stops every member). After the last instance stopped
//! the group has no members, which the cutover waits for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Load, STOP_PROMISE, Step, counts, ids, numbered};
use nix::sys::signal::Signal;
use plumber_processor::delivery::{REFUSED_REVOCATION_COMMIT, UNCOMMITTED_AT_STOP};
use plumber_testkit::{Broker, PATIENCE, Process, TestRecord, unique, wait_until};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

/// The rebalance lines of a processor's log, as JSON.
fn rebalances(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter(|line| line.contains("partitions assigned") || line.contains("partitions revoked"))
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// How many partitions the instance owns by its last assignment.
fn owned(step: &Step) -> u64 {
    rebalances(&step.log())
        .iter()
        .rev()
        .find(|line| line["message"] == "partitions assigned")
        .and_then(|line| line["owned"].as_u64())
        .unwrap_or(0)
}

/// The members `group` has, as DescribeGroups tells; `None` where the broker cannot say.
fn members(broker: &Broker, group: &str) -> Option<usize> {
    let client: BaseConsumer = broker.client().create().unwrap();
    match client.fetch_group_list(Some(group), Duration::from_secs(10)) {
        Ok(list) => Some(
            list.groups()
                .iter()
                .filter(|g| g.name() == group)
                .map(|g| g.members().len())
                .sum(),
        ),
        // The mock has no DescribeGroups.
        Err(KafkaError::GroupListFetch(
            RDKafkaErrorCode::UnsupportedVersion | RDKafkaErrorCode::UnsupportedFeature,
        )) => None,
        // tansu 0.6 drops the connection.
        Err(_) if broker.is_tansu() => None,
        Err(error) => panic!("describing {group}: {error}"),
    }
}

/// One instance of the step, with a log of its own.
fn instance(step: &Step, n: usize) -> Step {
    Step {
        group: step.group.clone(),
        inputs: step.inputs.clone(),
        outputs: step.outputs.clone(),
        dlq: step.dlq.clone(),
        args: step.args.clone(),
        log_name: format!("{}-{n}", step.group),
    }
}

/// Waits until the output grew by `by` records.
fn output_grows(broker: &Broker, output: &str, by: i64, what: &str) {
    let before = broker.end_offsets(output);
    wait_until(&format!("the output grows {what}"), PATIENCE, || {
        broker.end_offsets(output) >= before + by
    });
}

fn stop(process: &mut Process, step: &Step) {
    process.signal(Signal::SIGTERM);
    let status = process.wait_exit(STOP_PROMISE).expect("exits within 10 s");
    assert!(
        status.success(),
        "a graceful stop exits 0, got {status}; log:\n{}",
        step.log()
    );
}

/// [`stop`], on the mock: its coordinator refuses commits while the group rebalances, and a
/// member that stops then and does not poll while it retries cannot rejoin, so its final
/// commit may end with IllegalGeneration (Kafka takes a commit until the JoinGroup round
/// ends). The processor then exits 1 and names what it leaves uncommitted, which the
/// duplicates bound counts ([`refused_revocations`]); anything else fails.
fn stop_on(cluster: &Cluster, process: &mut Process, step: &Step) {
    if cluster.mock.is_none() {
        return stop(process, step);
    }
    process.signal(Signal::SIGTERM);
    let status = process.wait_exit(STOP_PROMISE).expect("exits within 10 s");
    let log = step.log();
    assert!(
        status.success()
            || (status.code() == Some(1)
                && log.contains(UNCOMMITTED_AT_STOP)
                && log.contains("IllegalGeneration")),
        "a graceful stop exits 0, got {status}; log:\n{log}"
    );
}

fn assert_none_lost(all: &[TestRecord], written: u32) {
    let by_id = counts(&ids(all));
    let lost: Vec<u32> = (0..written).filter(|id| !by_id.contains_key(id)).collect();
    assert!(lost.is_empty(), "{} lost: {lost:?}", lost.len());
}

/// The input ranges whose commit a revocation could not make, as the instances logged them:
/// (input partition, first offset, offset after the last).
fn refused_revocations(steps: &[Step]) -> Vec<(i32, i64, i64)> {
    let mut ranges = Vec::new();
    for step in steps {
        for line in step.log().lines() {
            let Ok(line) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if line["message"] != REFUSED_REVOCATION_COMMIT
                && line["message"] != UNCOMMITTED_AT_STOP
            {
                continue;
            }
            // "topic/partition:from..until", space separated.
            for range in line["uncommitted"]
                .as_str()
                .unwrap_or_default()
                .split_whitespace()
            {
                let (partition, offsets) = range
                    .rsplit_once('/')
                    .and_then(|(_, rest)| rest.split_once(':'))
                    .expect("topic/partition:from..until");
                let (from, until) = offsets.split_once("..").expect("from..until");
                ranges.push((
                    partition.parse().unwrap(),
                    from.parse().unwrap(),
                    until.parse().unwrap(),
                ));
            }
        }
    }
    ranges
}

/// Every duplicated record's input lies in a range whose commit was refused.
fn assert_duplicates_within(
    all: &[TestRecord],
    inputs: &[TestRecord],
    refused: &[(i32, i64, i64)],
) {
    let at: std::collections::BTreeMap<u32, (i32, i64)> = ids(inputs)
        .into_iter()
        .zip(inputs)
        .map(|(id, r)| (id, (r.partition.unwrap(), r.offset.unwrap())))
        .collect();
    let duplicated: Vec<u32> = counts(&ids(all))
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id)
        .collect();
    let unexplained: Vec<(u32, (i32, i64))> = duplicated
        .iter()
        .map(|id| (*id, at[id]))
        .filter(|(_, (partition, offset))| {
            !refused
                .iter()
                .any(|(p, from, until)| p == partition && (from..until).contains(&offset))
        })
        .collect();
    eprintln!(
        "{} duplicated, from revocations whose commit was refused: {refused:?}",
        duplicated.len()
    );
    assert!(
        unexplained.is_empty(),
        "duplicates outside the refused ranges {refused:?}: {unexplained:?}"
    );
}

fn assert_each_once(all: &[TestRecord], written: u32) {
    assert_none_lost(all, written);
    let by_id = counts(&ids(all));
    let duplicated: Vec<_> = by_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "{} duplicated: {duplicated:?}",
        duplicated.len()
    );
    assert_eq!(all.len(), written as usize);
}

/// Where a test runs.
///
/// tansu 0.6's group coordinator has no join barrier: it answers a JoinGroup at once, handing
/// the leader the other members' metadata from their last join, before they rejoined. With
/// three members the assignor then gives a partition to one member while another still
/// reads it: duplicates, under both protocols (the cooperative assignor reads a stale list
/// of the partitions each member owns; an eager member reads on until its next heartbeat
/// tells it to rejoin). With two members at most that does not happen. So the scenarios
/// with three members run on a coordinator that waits for every member, as Kafka's does:
/// rdkafka's MockCluster, or the cluster in PLUMBER_TEST_BOOTSTRAP.
struct Cluster {
    mock: Option<MockCluster<'static, DefaultProducerContext>>,
    broker: Broker,
}

impl Cluster {
    /// A real cluster (PLUMBER_TEST_BOOTSTRAP), else the MockCluster.
    fn coordinated() -> Cluster {
        if std::env::var("PLUMBER_TEST_BOOTSTRAP").is_ok_and(|b| !b.is_empty()) {
            return Cluster::harness();
        }
        let mock = MockCluster::new(1).expect("mock cluster");
        let broker = Broker::external(mock.bootstrap_servers());
        Cluster {
            mock: Some(mock),
            broker,
        }
    }

    /// The harness's broker: tansu, or PLUMBER_TEST_BOOTSTRAP.
    fn harness() -> Cluster {
        Cluster {
            mock: None,
            broker: Broker::start(),
        }
    }

    fn topic(&self, prefix: &str, partitions: i32) -> String {
        let name = unique(prefix);
        match &self.mock {
            Some(mock) => mock.create_topic(&name, partitions, 1).expect("mock topic"),
            None => self.broker.create_topic(&name, partitions),
        }
        name
    }

    /// Whether outputs and offsets committed in a transaction are kept: not on the mock,
    /// which stores no offsets committed in a transaction (so a new owner of a partition
    /// reads it from the start again).
    fn keeps_transactions(&self) -> bool {
        self.mock.is_none() && !self.broker.is_tansu()
    }

    /// Client settings for the cluster. The mock waits for members to rejoin for the
    /// session timeout less a second (9 s with the processor's 10 s), every round, and
    /// refuses commits meanwhile: a shorter session makes its rounds 5 s. Not shorter: on a
    /// loaded machine a 3 s session expired under a member mid-revocation (its commit then
    /// failed with IllegalGeneration).
    fn settings(&self) -> Vec<&'static str> {
        match self.mock {
            Some(_) => vec![
                "-X",
                "session.timeout.ms=6000",
                "-X",
                "heartbeat.interval.ms=500",
            ],
            None => Vec::new(),
        }
    }

    /// The delivery mode that shows exactly-once handovers where the cluster can:
    /// at-least-once on the mock (see above), `auto` elsewhere (exactly-once on a real
    /// cluster, at-least-once on tansu).
    fn delivery(&self) -> &'static str {
        if self.mock.is_some() {
            "at-least-once"
        } else {
            "auto"
        }
    }
}

/// What a scenario did: the instances' steps, the first being the one that ran throughout.
struct Ran {
    steps: Vec<Step>,
}

impl Ran {
    /// The rebalance lines of the instance that ran throughout.
    fn first(&self) -> Vec<serde_json::Value> {
        rebalances(&self.steps[0].log())
    }
}

/// Starts instances of one step and stops them in turn while records flow: `plan` is the
/// number of instances after each change (1, 2, 3, 2, 1: one joins, another joins, one
/// leaves, …; the one that leaves is the newest, the first runs throughout). Each change
/// waits until the partitions settled and the output moved on. Then the load stops, the
/// first instance drains and stops, and every record must be at the output exactly once.
/// Last, the group must be empty: DescribeGroups says so where the broker answers it, and
/// everywhere a fresh instance gets all partitions at its first assignment (a member that
/// had not left would keep some until its session expired).
fn scale_under_load(cluster: &Cluster, assignor: &str, plan: &[usize]) -> Ran {
    let broker = &cluster.broker;
    let (input, output) = (cluster.topic("rebal-in", 6), cluster.topic("rebal-out", 3));
    let step = Step::new(&unique(&format!("rebal-{assignor}")), &input, &output)
        .args(&[
            "--jq",
            ".",
            "--assignor",
            assignor,
            "--delivery",
            cluster.delivery(),
            "--commit-interval-ms",
            "200",
        ])
        .args(&cluster.settings());
    let mut steps: Vec<Step> = Vec::new();
    let mut running: Vec<(Process, usize)> = Vec::new();
    let load = Load::start(broker.bootstrap(), &input);
    for (change, &instances) in plan.iter().enumerate() {
        while running.len() < instances {
            let n = steps.len();
            steps.push(instance(&step, n).args(&["--instance", &format!("replica-{n}")]));
            running.push((steps[n].start(broker), n));
            wait_until(
                &format!("instance {n} owns partitions (change {change})"),
                PATIENCE,
                || owned(&steps[n]) > 0,
            );
        }
        while running.len() > instances {
            let (mut process, n) = running.pop().expect("an instance runs");
            stop_on(cluster, &mut process, &steps[n]);
        }
        let live: Vec<usize> = running.iter().map(|(_, n)| *n).collect();
        wait_until(
            &format!("instances {live:?} own all 6 partitions (change {change})"),
            PATIENCE,
            || live.iter().map(|n| owned(&steps[*n])).sum::<u64>() == 6,
        );
        output_grows(broker, &output, 300, &format!("after change {change}"));
    }
    let written = load.finish();
    broker.wait_for_records(&output, "every record at the output", |r| {
        ids(r).into_iter().collect::<BTreeSet<u32>>().len() >= written as usize
    });
    for (mut process, n) in running.into_iter().rev() {
        stop_on(cluster, &mut process, &steps[n]);
    }
    // Graceful handovers only: at-least-once (the mock, tansu) and exactly-once (a real
    // cluster) alike leave no duplicate, unless the coordinator refused a revocation's
    // commit. The mock does that while any member is rejoining (Kafka takes commits until
    // the JoinGroup round ends), and an at-least-once processor then goes on, leaving its
    // next owner to process again what was done since the last commit.
    let all = broker.read_all(&output);
    let uncommitted = refused_revocations(&steps);
    if uncommitted.is_empty() || cluster.mock.is_none() {
        assert_each_once(&all, written);
    } else {
        assert_none_lost(&all, written);
        assert_duplicates_within(&all, &broker.read_all(&input), &uncommitted);
    }

    if let Some(n) = members(broker, &step.group) {
        assert_eq!(n, 0, "every instance left the group on its way out");
    }
    let fresh = instance(&step, steps.len());
    let mut process = fresh.start(broker);
    wait_until("a fresh instance is assigned partitions", PATIENCE, || {
        owned(&fresh) > 0
    });
    let assigned = rebalances(&fresh.log());
    assert_eq!(
        assigned[0]["partitions"], 6,
        "nobody else was in the group: {assigned:#?}"
    );
    stop_on(cluster, &mut process, &fresh);
    assert_eq!(
        broker.read_all(&output).len(),
        all.len(),
        "everything was committed: the fresh instance had nothing to do"
    );
    Ran { steps }
}

/// Under the cooperative protocol the instance that ran throughout never stopped reading:
/// every revocation before its own stop (the last) left it partitions to go on with.
fn assert_kept_partitions_throughout(ran: &Ran) {
    let first = ran.first();
    assert!(
        first.iter().all(|line| line["protocol"] == "cooperative"),
        "{first:#?}"
    );
    let revoked: Vec<&serde_json::Value> = first
        .iter()
        .filter(|line| line["message"] == "partitions revoked")
        .collect();
    let (last, before) = revoked.split_last().expect("revoked at its stop");
    assert!(
        !before.is_empty(),
        "it gave partitions to the instances that joined: {first:#?}"
    );
    assert!(
        before.iter().all(|line| line["kept"].as_u64() > Some(0)),
        "a revocation took all its partitions: {first:#?}"
    );
    assert_eq!(last["kept"], 0, "its stop gave everything up");
    assert!(revoked.iter().all(|line| line["lost"] == false));
}

#[test]
fn cooperative_instances_joining_and_leaving_under_load_move_only_their_partitions_and_lose_or_duplicate_nothing()
 {
    let cluster = Cluster::coordinated();
    let ran = scale_under_load(&cluster, "cooperative", &[1, 2, 3, 2, 1]);
    assert_kept_partitions_throughout(&ran);
}

/// The plan on the harness's broker: two instances at most on tansu, whose coordinator gets
/// those right (see [`Cluster`]).
fn harness_plan(cluster: &Cluster) -> &'static [usize] {
    if cluster.broker.is_tansu() {
        &[1, 2, 1, 2, 1]
    } else {
        &[1, 2, 3, 2, 1]
    }
}

#[test]
fn cooperative_rebalances_on_the_harness_broker_lose_or_duplicate_nothing() {
    let cluster = Cluster::harness();
    let ran = scale_under_load(&cluster, "cooperative", harness_plan(&cluster));
    assert_kept_partitions_throughout(&ran);
}

/// On the harness's broker only: the mock refuses commits while the group rebalances
/// (REBALANCE_IN_PROGRESS), which is when the eager protocol revokes, where Kafka (and tansu)
/// take a commit of the generation that is ending.
#[test]
fn eager_rebalances_on_the_harness_broker_lose_or_duplicate_nothing() {
    let cluster = Cluster::harness();
    let ran = scale_under_load(&cluster, "eager", harness_plan(&cluster));
    let first = ran.first();
    assert!(
        first.iter().all(|line| line["protocol"] == "eager"),
        "{first:#?}"
    );
    // Every change revoked everything from every member.
    assert!(
        first
            .iter()
            .filter(|line| line["message"] == "partitions revoked")
            .all(|line| line["kept"] == 0),
        "{first:#?}"
    );
}

/// Exactly-once: a joining instance takes partitions from a member whose open transaction
/// holds records of them; the revocation commits it first. The mock stores no offsets
/// committed in a transaction, so there the new owner reads its partitions from the start
/// again: only a real cluster (PLUMBER_TEST_BOOTSTRAP) shows that nothing is duplicated.
/// Everywhere nothing is lost and no transaction call fails.
#[test]
fn exactly_once_cooperative_rebalances_commit_the_transaction_before_partitions_move() {
    let cluster = Cluster::coordinated();
    let broker = &cluster.broker;
    let (input, output) = (
        cluster.topic("eos-rebal-in", 4),
        cluster.topic("eos-rebal-out", 2),
    );
    let step = Step::new(&unique("eos-rebal"), &input, &output)
        .args(&["--jq", ".", "--delivery", "exactly-once"])
        .args(&cluster.settings());
    let steps: Vec<Step> = (0..2)
        .map(|n| instance(&step, n).args(&["--instance", &format!("replica-{n}")]))
        .collect();
    let load = Load::start(broker.bootstrap(), &input);
    let mut first = steps[0].start(broker);
    wait_until("the first instance owns all 4 partitions", PATIENCE, || {
        owned(&steps[0]) == 4
    });
    output_grows(broker, &output, 500, "with one instance");
    let mut second = steps[1].start(broker);
    wait_until("the second instance owns partitions", PATIENCE, || {
        owned(&steps[1]) > 0
    });
    output_grows(broker, &output, 1000, "with two instances");
    stop(&mut second, &steps[1]);
    wait_until("the first owns all 4 partitions again", PATIENCE, || {
        owned(&steps[0]) == 4
    });
    let written = load.finish();
    broker.wait_for_records(&output, "every record at the output", |r| {
        ids(r).into_iter().collect::<BTreeSet<u32>>().len() >= written as usize
    });
    stop(&mut first, &steps[0]);

    for step in &steps {
        let log = step.log();
        assert!(log.contains(r#""mode":"exactly-once""#), "log:\n{log}");
        assert!(!log.contains("ERROR"), "no transaction call failed:\n{log}");
        assert!(!log.contains("aborting the transaction"), "log:\n{log}");
    }
    let revoked: Vec<serde_json::Value> = rebalances(&steps[0].log())
        .into_iter()
        .filter(|line| line["message"] == "partitions revoked")
        .collect();
    assert!(
        revoked.len() >= 2 && revoked[0]["kept"].as_u64() > Some(0),
        "it gave some partitions up when the second joined, and kept the others: {revoked:#?}"
    );
    let all = broker.read_all(&output);
    if cluster.keeps_transactions() {
        assert_each_once(&all, written);
    } else {
        let by_id = counts(&ids(&all));
        let lost: Vec<u32> = (0..written).filter(|id| !by_id.contains_key(id)).collect();
        assert!(lost.is_empty(), "lost: {lost:?}");
    }
}

/// A member frozen past its session (SIGSTOP) finds, when it runs again, that the group gave
/// its partitions away: librdkafka revokes them as lost. It must not commit them (the
/// coordinator refuses its stale generation) nor stop: it joins again and goes on. Its
/// records since its last commit are processed again by their new owner, as after a crash:
/// nothing is lost.
#[test]
fn an_instance_that_lost_its_partitions_joins_again_and_nothing_is_lost() {
    let cluster = MockCluster::<DefaultProducerContext>::new(1).expect("mock");
    let broker = Broker::external(cluster.bootstrap_servers());
    let (input, output) = (unique("lost-in"), unique("lost-out"));
    cluster.create_topic(&input, 4, 1).expect("mock topic");
    cluster.create_topic(&output, 2, 1).expect("mock topic");
    let step = Step::new(&unique("lost"), &input, &output).args(&[
        "--jq",
        ".",
        "--delivery",
        "at-least-once",
        "--commit-interval-ms",
        "200",
        "-X",
        "session.timeout.ms=6000",
        "-X",
        "heartbeat.interval.ms=500",
    ]);
    let steps: Vec<Step> = (0..2).map(|n| instance(&step, n)).collect();
    broker.produce(&input, &numbered(0..1000));
    let mut frozen = steps[0].start(&broker);
    wait_until("the first instance owns all 4 partitions", PATIENCE, || {
        owned(&steps[0]) == 4
    });
    let mut other = steps[1].start(&broker);
    wait_until("both instances own partitions", PATIENCE, || {
        owned(&steps[0]) > 0 && owned(&steps[1]) > 0
    });
    frozen.signal(Signal::SIGSTOP);
    wait_until(
        "the other instance took all 4 partitions from the frozen one",
        PATIENCE,
        || owned(&steps[1]) == 4,
    );
    frozen.signal(Signal::SIGCONT);
    wait_until(
        "the frozen instance found its partitions lost",
        PATIENCE,
        || {
            rebalances(&steps[0].log())
                .iter()
                .any(|line| line["lost"] == true)
        },
    );
    wait_until("it joined again and owns partitions", PATIENCE, || {
        owned(&steps[0]) > 0 && owned(&steps[0]) + owned(&steps[1]) == 4
    });
    broker.produce(&input, &numbered(1000..2000));
    broker.wait_for_records(&output, "every record at the output", |r| {
        ids(r).into_iter().collect::<BTreeSet<u32>>().len() >= 2000
    });
    stop(&mut other, &steps[1]);
    stop(&mut frozen, &steps[0]);
    let log = steps[0].log();
    assert!(!log.contains("commit before revocation failed"), "{log}");
    let by_id = counts(&ids(&broker.read_all(&output)));
    assert_eq!(by_id.len(), 2000, "nothing lost");
}
