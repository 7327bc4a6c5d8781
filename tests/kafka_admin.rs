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

/// The engine's stop reads a stopped life's offsets once `members` says its group is empty,
/// or cannot say (SPEC §4.2): a group with a live member must never read as empty. tansu 0.6
/// cannot describe a group that has members (DescribeGroups fails: a transport error or a
/// timeout), so there the runtime's own wait for the instances to exit is all that protects
/// a cutover (the Kubernetes runtime's stop waits until the pods are gone).
#[test]
fn a_group_with_a_live_member_never_reads_as_empty() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use std::time::{Duration, Instant};

    let broker = Broker::start();
    let admin = KafkaAdmin::connect(broker.bootstrap()).unwrap();
    let topic = unique("members");
    broker.create_topic(&topic, 2);
    let group = unique("members-group");
    assert!(
        matches!(admin.members(&group), Ok(None | Some(0))),
        "nobody joined yet"
    );
    let consumer: BaseConsumer = broker
        .client()
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    plumber_testkit::wait_until(
        "the consumer has its partitions",
        plumber_testkit::PATIENCE,
        || {
            let _ = consumer.poll(Duration::from_millis(100));
            consumer.assignment().is_ok_and(|a| a.count() == 2)
        },
    );
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let _ = consumer.poll(Duration::from_millis(100));
        let members = admin.members(&group);
        assert!(
            !matches!(members, Ok(Some(0))),
            "a group with a live member read as empty: {members:?}"
        );
    }
}
