//! The Kafka operations of a cutover against a real broker (tansu, or
//! `PLUMBER_TEST_BOOTSTRAP`): idempotent topic creation, missing topics, setting and reading a
//! group's offsets, lag and drains, deleting a group; what group membership says.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use plumber::kafka::{Admin, Error, KafkaAdmin};
use plumber::plan::PartitionOffset;
use plumber_testkit::{Broker, TestRecord, unique};

fn at(topic: &str, partition: i32, offset: i64) -> PartitionOffset {
    PartitionOffset {
        topic: topic.into(),
        partition,
        offset,
    }
}

#[test]
fn topics_offsets_lag_and_drains() {
    let broker = Broker::start();
    let admin = KafkaAdmin::connect(broker.bootstrap()).unwrap();
    let topic = unique("admin");
    let config =
        std::collections::BTreeMap::from([("retention.ms".to_owned(), "3600000".to_owned())]);
    admin.create_topic(&topic, 2, None, &config).unwrap();
    admin.create_topic(&topic, 2, None, &config).unwrap(); // exists: nothing to do
    assert!(
        matches!(
            admin.create_topic(&topic, 3, None, &config),
            Err(Error::PartitionMismatch {
                found: 2,
                wanted: 3,
                ..
            })
        ),
        "an existing topic with another partition count is an error"
    );
    assert_eq!(admin.partitions(&topic).unwrap(), 2);
    assert!(matches!(
        admin.partitions(&unique("missing")),
        Err(Error::NoSuchTopic { .. })
    ));

    let records: Vec<TestRecord> = (0..10)
        .map(|i| TestRecord::new(&format!("k{i}"), "{}"))
        .collect();
    broker.produce(&topic, &records);
    let ends: Vec<i64> = admin
        .watermarks(&topic)
        .unwrap()
        .iter()
        .map(|(_, high)| *high)
        .collect();
    assert_eq!(ends.iter().sum::<i64>(), 10);
    // Read in two batched requests: the same as librdkafka's own per-partition query.
    use rdkafka::consumer::Consumer as _;
    let reference: rdkafka::consumer::BaseConsumer = broker.client().create().unwrap();
    for (partition, watermarks) in admin.watermarks(&topic).unwrap().into_iter().enumerate() {
        let expected = reference
            .fetch_watermarks(&topic, partition as i32, std::time::Duration::from_secs(15))
            .unwrap();
        assert_eq!(watermarks, expected, "partition {partition}");
    }

    let group = unique("admin-group");
    let topics = vec![topic.clone()];
    assert_eq!(
        admin.lag(&group, &topics).unwrap(),
        10,
        "nothing committed: all of it"
    );
    assert!(!admin.drained(&group, &topics).unwrap());

    admin
        .commit(&group, &[at(&topic, 0, 0), at(&topic, 1, ends[1])])
        .unwrap();
    assert_eq!(admin.lag(&group, &topics).unwrap(), ends[0]);
    assert_eq!(admin.drained(&group, &topics).unwrap(), ends[0] == 0);
    let mut committed = admin.committed(&group, &topics).unwrap();
    committed.sort();
    assert_eq!(committed, vec![at(&topic, 0, 0), at(&topic, 1, ends[1])]);

    admin
        .commit(&group, &[at(&topic, 0, ends[0]), at(&topic, 1, ends[1])])
        .unwrap();
    assert_eq!(admin.lag(&group, &topics).unwrap(), 0);
    assert!(admin.drained(&group, &topics).unwrap());

    // A deleted group's offsets are gone; deleting it again (or any missing group) is no error.
    admin.delete_group(&group).unwrap();
    assert_eq!(admin.committed(&group, &topics).unwrap(), vec![]);
    assert_eq!(admin.lag(&group, &topics).unwrap(), 10);
    admin.delete_group(&group).unwrap();
    admin.delete_group(&unique("never-was")).unwrap();
}

/// A consumer in `group` on `topic` (two partitions), once it has its partitions.
fn member(broker: &Broker, group: &str, topic: &str) -> rdkafka::consumer::BaseConsumer {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = broker
        .client()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    plumber_testkit::wait_until(
        "the consumer has its partitions",
        plumber_testkit::PATIENCE,
        || {
            let _ = consumer.poll(std::time::Duration::from_millis(100));
            consumer.assignment().is_ok_and(|a| a.count() == 2)
        },
    );
    consumer
}

/// The engine's stop reads a stopped life's offsets once `members` says its group is empty,
/// or cannot say (SPEC §4.2): a group with a live member must never read as empty, nor as
/// "cannot say" where the broker can. What each broker answers, exactly:
///
/// - a group nobody joined: `Some(0)`, on tansu and on a real cluster;
/// - with one consumer in it, and once it left: on a real cluster
///   (`PLUMBER_TEST_BOOTSTRAP`) `Some(1)`, then `Some(0)`; on tansu 0.6, which cannot
///   describe a group that has or had members (DescribeGroups fails: the broker drops the
///   connection), an error both times. There the runtime's own wait for the instances to
///   exit is all that protects a cutover (the Kubernetes runtime's stop waits until the pods
///   are gone).
///
/// librdkafka's MockCluster serves no DescribeGroups: the next test.
#[test]
fn members_counts_a_groups_members_where_the_broker_can_say() {
    use std::time::{Duration, Instant};

    let broker = Broker::start();
    let admin = KafkaAdmin::connect(broker.bootstrap()).unwrap();
    let topic = unique("members");
    broker.create_topic(&topic, 2);
    let group = unique("members-group");
    let members = admin.members(&group);
    assert!(
        matches!(members, Ok(Some(0))),
        "nobody joined yet: {members:?}"
    );

    let consumer = member(&broker, &group, &topic);
    let tansu = broker.is_tansu();
    let cannot_describe = |members: &plumber::kafka::Result<Option<usize>>| matches!(members, Err(Error::Describe { group: g, .. }) if *g == group);
    // Looked at for a while: never anything else, whatever the group does meanwhile.
    let until = Instant::now() + Duration::from_secs(3);
    let mut looks = 0;
    while Instant::now() < until || looks < 3 {
        let _ = consumer.poll(Duration::from_millis(100));
        let members = admin.members(&group);
        if tansu {
            assert!(
                cannot_describe(&members),
                "tansu 0.6 cannot describe a group with a member (if it can now, expect \
                 Some(1) as on a real cluster): {members:?}"
            );
        } else {
            assert!(
                matches!(members, Ok(Some(1))),
                "a group with one live member: {members:?}"
            );
        }
        looks += 1;
    }

    drop(consumer); // closes: leaves the group
    if tansu {
        let members = admin.members(&group);
        assert!(
            cannot_describe(&members),
            "tansu 0.6 cannot describe a group that had members: {members:?}"
        );
    } else {
        plumber_testkit::wait_until(
            "the group is empty once its member left",
            plumber_testkit::PATIENCE,
            || matches!(admin.members(&group), Ok(Some(0))),
        );
    }
}

/// librdkafka's MockCluster (the exactly-once tests' broker) serves no DescribeGroups:
/// `members` cannot say (`None`), before anyone joins and with a member alike; never `Some(0)`
/// for a group with a live member.
#[test]
fn members_cannot_say_on_a_broker_without_describe_groups() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;

    let cluster: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).unwrap();
    let broker = Broker::external(cluster.bootstrap_servers());
    let admin = KafkaAdmin::connect(broker.bootstrap()).unwrap();
    let topic = unique("mock-members");
    cluster.create_topic(&topic, 2, 1).unwrap();
    let group = unique("mock-members-group");
    let members = admin.members(&group);
    assert!(
        matches!(members, Ok(None)),
        "nobody joined yet: {members:?}"
    );
    let _consumer = member(&broker, &group, &topic);
    let members = admin.members(&group);
    assert!(matches!(members, Ok(None)), "with a member: {members:?}");
}
