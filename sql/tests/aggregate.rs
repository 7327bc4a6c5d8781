//! What a stateful query may say, and the errors (at line and column) for what it may not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plumber_sql::{Aggregation, CarryOver, PartitionState, Query, Record};

fn problems(sql: &str) -> Vec<String> {
    match Aggregation::compile(sql, Some(&["s"])) {
        Ok(_) => Vec::new(),
        Err(problems) => problems.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_group_by_must_keep_a_group_in_one_partition() {
    let found = problems("SELECT driver, COUNT(*) AS n FROM s\nGROUP BY driver");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("2:1: GROUP BY must include `_key`"),
        "{found:?}"
    );
}

#[test]
fn a_column_is_grouped_or_aggregated() {
    let found = problems("SELECT _key, speed, MAX(speed) AS top FROM s GROUP BY _key");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("1:14: `speed` is neither in GROUP BY nor inside an aggregate"),
        "{found:?}"
    );
    assert!(problems("SELECT _key AS k, MAX(speed) + 1 AS top FROM s GROUP BY _key").is_empty());
}

#[test]
fn windows_are_checked_where_they_are_written() {
    let hop = problems(
        "SELECT _key, COUNT(*) AS n FROM s GROUP BY _key, \
         HOP(_timestamp, INTERVAL '10' SECOND, INTERVAL '3' SECOND)",
    );
    assert!(
        hop.iter()
            .any(|p| p.contains("must be a multiple of its advance")),
        "{hop:?}"
    );
    // A hostile step file: a record in 86,400,000 windows.
    let many = problems(
        "SELECT _key, COUNT(*) AS n FROM s GROUP BY _key, \
         HOP(_timestamp, INTERVAL '1' DAY, INTERVAL '1' MILLISECOND)",
    );
    assert!(
        many[0].contains("in 86400000 windows; at most 1000: advance by at least 86400 ms"),
        "{many:?}"
    );
    let session = problems("SELECT _key, COUNT(*) AS n FROM s GROUP BY _key, SESSION(t)");
    assert!(
        session[0].starts_with("1:50: write SESSION(time, INTERVAL 'gap' unit)"),
        "{session:?}"
    );
    let unit =
        problems("SELECT _key, COUNT(*) AS n FROM s GROUP BY _key, TUMBLE(t, INTERVAL '5' YEAR)");
    assert!(unit[0].contains("is not one of MILLISECOND"), "{unit:?}");
    assert!(
        problems("SELECT _key, COUNT(*) AS n, window_end FROM s GROUP BY _key, TUMBLE(t, INTERVAL '1 minute')")
            .is_empty()
    );
    let unwindowed = problems("SELECT _key, window_start FROM s GROUP BY _key");
    assert!(
        unwindowed[0].contains("`window_start` is neither"),
        "{unwindowed:?}"
    );
}

#[test]
fn an_aggregate_belongs_in_the_columns() {
    let found = problems("SELECT _key, COUNT(*) AS n FROM s WHERE SUM(x) > 1 GROUP BY _key");
    assert!(
        found[0].starts_with("1:41: SUM is an aggregate"),
        "{found:?}"
    );
}

#[test]
fn a_stateless_step_refuses_group_by_and_says_why() {
    let Err(problems) = Query::compile("SELECT _key, COUNT(*) FROM s GROUP BY _key", None) else {
        panic!("GROUP BY compiled as a stateless query");
    };
    assert!(
        problems
            .iter()
            .any(|p| p.message.contains("docs/stateful-sql.md")),
        "{problems:?}"
    );
}

/// An RFC 3339 event time, a HAVING that hides a group, and a record whose MAX cannot be
/// compared with the group's: dead-lettered, and the group as it was.
#[test]
fn a_record_that_cannot_join_its_group_changes_nothing() {
    let aggregation = Aggregation::compile(
        "SELECT _key AS k, COUNT(*) AS n, MAX(v) AS top, window_start FROM s \
         GROUP BY _key, TUMBLE(at, INTERVAL '1' MINUTE) HAVING COUNT(*) > 1",
        Some(&["s"]),
    )
    .unwrap();
    let mut state = PartitionState::default();
    let mut feed = |value: &str| {
        aggregation.feed(
            &mut state,
            &Record {
                value: Some(value.as_bytes()),
                key: Some(b"car"),
                headers: &[],
            },
            0,
        )
    };
    assert_eq!(
        feed(r#"{"at":"2026-12-03T10:00:05Z","v":3}"#).unwrap(),
        vec![]
    );
    let refused = feed(r#"{"at":"2026-12-03T10:00:06Z","v":"fast"}"#).unwrap_err();
    assert_eq!(refused.kind, "sql-error");
    assert!(refused.message.contains("cannot compare"), "{refused:?}");
    assert_eq!(
        feed(r#"{"at":"2026-12-03T10:00:07+01:00","v":1}"#)
            .unwrap_err()
            .kind,
        "late-record"
    );
    assert_eq!(
        feed(r#"{"at":"2026-12-03T10:00:30Z","v":4}"#).unwrap(),
        vec![]
    );
    let closed = feed(r#"{"at":"2026-12-03T10:01:00Z","v":1}"#).unwrap();
    assert_eq!(closed.len(), 1);
    // 2026-12-03T10:00:00Z
    let start: i64 = 1796292000000;
    assert_eq!(
        String::from_utf8(closed[0].value.clone().unwrap()).unwrap(),
        format!(r#"{{"k":"car","n":2,"top":4,"window_start":{start}}}"#)
    );
    assert_eq!(closed[0].key.as_deref(), Some(&b"car"[..]));
    // Alone in its window: HAVING hides it when it closes.
    assert_eq!(
        feed(r#"{"at":"2026-12-03T10:02:00Z","v":1}"#).unwrap(),
        vec![]
    );
}

/// At its bound, the state refuses only what would open a group: records of open groups
/// count, and a record that closes windows makes room for its own.
#[test]
fn a_full_state_refuses_new_groups_and_still_closes_windows() {
    let aggregation = Aggregation::compile(
        "SELECT _key AS k, COUNT(*) AS n FROM s GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' SECOND)",
        Some(&["s"]),
    )
    .unwrap();
    let mut state = PartitionState::default();
    let mut feed = |key: &str, at: i64| {
        aggregation.feed_within(
            &mut state,
            &Record {
                value: Some(b"{}"),
                key: Some(key.as_bytes()),
                headers: &[],
            },
            at,
            2,
        )
    };
    assert!(feed("a", 0).unwrap().is_empty());
    assert!(feed("b", 10).unwrap().is_empty());
    let full = feed("c", 20).unwrap_err();
    assert_eq!(full.kind, "state-full");
    assert!(full.message.contains("bound of 2 entries"), "{full:?}");
    assert!(
        feed("a", 30).unwrap().is_empty(),
        "an open group still counts"
    );
    // Closes a's and b's windows, then opens c's: emitted, not refused.
    let closed = feed("c", 1000).unwrap();
    assert_eq!(closed.len(), 2);
    assert_eq!(
        String::from_utf8(closed[0].value.clone().unwrap()).unwrap(),
        r#"{"k":"a","n":2}"#
    );
    assert_eq!(state.open_groups(), 1);
}

/// A hostile group: one key, a running COUNT(DISTINCT …) fed a new value with every record.
/// Each value held counts toward the bound, so the group cannot grow without end: past the
/// bound, a record with a new value is refused and one with a value held still counts; a
/// window that closes gives its values back; a restore counts them again.
#[test]
fn distinct_values_count_toward_the_bound() {
    let running = Aggregation::compile(
        "SELECT _key AS k, COUNT(DISTINCT v) AS n FROM s GROUP BY _key",
        Some(&["s"]),
    )
    .unwrap();
    let record = |v: u32| format!(r#"{{"v":{v}}}"#);
    let mut state = PartitionState::default();
    let mut refused = 0;
    for v in 0..1_000 {
        let value = record(v);
        let fed = running.feed_within(
            &mut state,
            &Record {
                value: Some(value.as_bytes()),
                key: Some(b"steady"),
                headers: &[],
            },
            i64::from(v),
            100,
        );
        match fed {
            Ok(_) => {}
            Err(error) => {
                assert_eq!(error.kind, "state-full", "{error:?}");
                assert!(
                    error
                        .message
                        .contains("1 groups, and 99 values of COUNT(DISTINCT"),
                    "{error:?}"
                );
                refused += 1;
            }
        }
    }
    // One group and 99 values: the bound of 100 entries.
    assert_eq!(state.entries(), 100);
    assert_eq!(refused, 901);
    let again = record(5);
    let emitted = running
        .feed_within(
            &mut state,
            &Record {
                value: Some(again.as_bytes()),
                key: Some(b"steady"),
                headers: &[],
            },
            2_000,
            100,
        )
        .expect("a value held adds nothing");
    let out: serde_json::Value =
        serde_json::from_slice(emitted[0].value.as_deref().unwrap()).unwrap();
    assert_eq!(out["n"], 99);
    let restored = PartitionState::restore(state.take_changes()).unwrap();
    assert_eq!(restored.entries(), 100, "a restore counts the values again");

    // Windowed: a closing window gives its values back.
    let windowed = Aggregation::compile(
        "SELECT _key AS k, COUNT(DISTINCT v) AS n FROM s \
         GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' SECOND)",
        Some(&["s"]),
    )
    .unwrap();
    let mut state = PartitionState::default();
    let mut feed = |v: u32, at: i64| {
        let value = record(v);
        windowed.feed_within(
            &mut state,
            &Record {
                value: Some(value.as_bytes()),
                key: Some(b"steady"),
                headers: &[],
            },
            at,
            10,
        )
    };
    for v in 0..9 {
        feed(v, i64::from(v)).unwrap();
    }
    assert_eq!(feed(9, 9).unwrap_err().kind, "state-full");
    let closed = feed(100, 1_000).expect("the first window closes and frees its values");
    assert_eq!(closed.len(), 1);
    assert_eq!(state.entries(), 2);
}

/// What a replaced step's new life starts from: the old state when both build the same
/// state; a rebuild over the widest window and its grace; or nothing, said with why.
#[test]
fn a_new_definition_reuses_rebuilds_or_cannot_and_says_why() {
    let compile = |sql: &str| Aggregation::compile(sql, Some(&["s"])).unwrap();
    let old = compile(
        "SELECT _key, COUNT(*) AS n FROM s WHERE v > 1 \
         GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)",
    );
    let renamed = compile(
        "SELECT _key AS k, COUNT(*) AS count, window_end FROM s WHERE v > 1 \
         GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE) HAVING COUNT(*) > 2",
    );
    assert_eq!(
        renamed.carry_over(&old),
        CarryOver::Rebuild { span_ms: 60_000 },
        "HAVING COUNT(*) is a second aggregate of the state"
    );
    let same_state = compile(
        "select _key AS k, count(*) AS total, window_end FROM s where v > 1 \
         group by _key, tumble(_timestamp, INTERVAL '1' MINUTE)",
    );
    assert_eq!(same_state.carry_over(&old), CarryOver::Reuse);
    let filtered = compile(
        "SELECT _key, COUNT(*) AS n FROM s WHERE v > 2 \
         GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)",
    )
    .with_grace(5_000);
    assert_eq!(
        filtered.carry_over(&old),
        CarryOver::Rebuild { span_ms: 65_000 }
    );
    let graced = compile(
        "SELECT _key, COUNT(*) AS n FROM s WHERE v > 1 \
         GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)",
    )
    .with_grace(1);
    assert!(matches!(graced.carry_over(&old), CarryOver::Rebuild { .. }));
    let session = compile(
        "SELECT _key, COUNT(*) AS n FROM s GROUP BY _key, SESSION(_timestamp, INTERVAL '1' MINUTE)",
    );
    assert!(
        matches!(session.carry_over(&old), CarryOver::Cannot { why } if why.contains("session"))
    );
    let running = compile("SELECT _key, COUNT(*) AS n FROM s GROUP BY _key");
    let running_more = compile("SELECT _key, COUNT(*) AS n, MAX(v) AS top FROM s GROUP BY _key");
    assert_eq!(running.carry_over(&running), CarryOver::Reuse);
    assert!(
        matches!(running_more.carry_over(&running), CarryOver::Cannot { why } if why.contains("every record"))
    );
}
