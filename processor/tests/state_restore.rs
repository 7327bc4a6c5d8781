//! A stateful step's state restored from its changelog on a broker (tansu, or the cluster in
//! PLUMBER_TEST_BOOTSTRAP): the changes a partition's state wrote, produced to a changelog
//! partition as the processor will produce them, read back by `state::restore` outside any
//! group, make a state that emits exactly what the state that wrote them emits for the
//! records after. And a state of 200,000 keys (a million with PLUMBER_TEST_RESTORE_KEYS)
//! comes back whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use plumber_processor::state::restore;
use plumber_sql::{Aggregation, PartitionState, Record};
use plumber_testkit::{Broker, unique};

const PATIENCE: Duration = Duration::from_secs(60);

fn record<'a>(key: &'a [u8], value: &'a [u8]) -> Record<'a> {
    Record {
        value: Some(value),
        key: Some(key),
        headers: &[],
    }
}

/// Windows that close (tombstones) and keys that come back: the state restored at a commit
/// point emits, record for record, what the state that never stopped emits.
#[test]
fn a_partition_restored_from_its_changelog_on_the_broker_emits_what_it_would_have() {
    let broker = Broker::start();
    let changelog = unique("state");
    broker.create_topic(&changelog, 2);
    let aggregation = Aggregation::compile(
        "SELECT _key AS k, COUNT(*) AS n, SUM(v) AS total, window_start FROM s \
         GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' SECOND)",
        Some(&["s"]),
    )
    .unwrap()
    .with_grace(200);
    let records: Vec<(String, String, i64)> = (0..3_000i64)
        .map(|i| {
            // Out of order by up to 150 ms: some late, most within the grace.
            let jitter = (i * 37) % 150;
            (
                format!("k{}", i % 17),
                format!(r#"{{"v":{}}}"#, i % 9),
                i * 5 - jitter,
            )
        })
        .collect();
    let mut running = PartitionState::default();
    let mut written = PartitionState::default();
    let mut changes = Vec::new();
    let cut = 1_700;
    let mut expected = Vec::new();
    for (i, (key, value, time)) in records.iter().enumerate() {
        let outputs = aggregation.feed(
            &mut running,
            &record(key.as_bytes(), value.as_bytes()),
            *time,
        );
        if i < cut {
            let again = aggregation.feed(
                &mut written,
                &record(key.as_bytes(), value.as_bytes()),
                *time,
            );
            assert_eq!(again, outputs);
            written.reflects(i as i64);
            // Taken every 50 records, as a commit interval would.
            if (i + 1) % 50 == 0 {
                changes.extend(written.take_changes());
            }
        } else {
            expected.push(outputs);
        }
    }
    assert!(
        changes.iter().any(|(_, value)| value.is_none()),
        "some windows closed before the cut: their tombstones are in the changelog"
    );
    broker.produce_keyed(&changelog, 1, &changes);

    let mut restored = restore(broker.client(), &changelog, 1, PATIENCE).unwrap();
    assert_eq!(restored.offset(), Some(cut as i64 - 1));
    assert_eq!(restored.open_groups(), written.open_groups());
    for ((key, value, time), expected) in records[cut..].iter().zip(&expected) {
        let outputs = aggregation.feed(
            &mut restored,
            &record(key.as_bytes(), value.as_bytes()),
            *time,
        );
        assert_eq!(&outputs, expected);
    }
    // The other partition holds nothing: an empty state.
    let empty = restore(broker.client(), &changelog, 0, PATIENCE).unwrap();
    assert_eq!((empty.open_groups(), empty.offset()), (0, None));
}

/// A running aggregate of 200,000 keys, restored whole from the broker. The issue asks for a
/// million: `PLUMBER_TEST_RESTORE_KEYS=1000000` runs that (104 s on this machine's debug build,
/// nearly all of it CPU of the debug build and tansu; the suite keeps minutes).
#[test]
fn a_state_of_200_000_keys_comes_back_whole() {
    let keys: i64 = std::env::var("PLUMBER_TEST_RESTORE_KEYS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(200_000);
    let broker = Broker::start();
    let changelog = unique("state-large");
    broker.create_topic(&changelog, 1);
    let aggregation = Aggregation::compile(
        "SELECT _key AS k, COUNT(*) AS n, MAX(v) AS top FROM s GROUP BY _key",
        Some(&["s"]),
    )
    .unwrap();
    let mut state = PartitionState::default();
    for i in 0..keys {
        let key = format!("key-{i}");
        aggregation
            .feed(&mut state, &record(key.as_bytes(), br#"{"v":1}"#), i)
            .unwrap();
        state.reflects(i);
    }
    let changes = state.take_changes();
    broker.produce_keyed(&changelog, 0, &changes);
    let restored = restore(broker.client(), &changelog, 0, Duration::from_secs(300)).unwrap();
    assert_eq!(restored.open_groups() as i64, keys);
    assert_eq!(restored.offset(), Some(keys - 1));
    // A key's group carries on from its restored count.
    let mut restored = restored;
    let outputs = aggregation
        .feed(&mut restored, &record(b"key-7", br#"{"v":5}"#), keys)
        .unwrap();
    assert_eq!(
        String::from_utf8(outputs[0].value.clone().unwrap()).unwrap(),
        r#"{"k":"key-7","n":2,"top":5}"#
    );
}
