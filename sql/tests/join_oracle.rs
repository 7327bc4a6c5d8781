//! SQLite as the oracle of stream–table joins (`docs/stateful-sql.md`): generated records of
//! a stream and of a table's topic, interleaved (rows written, rewritten and deleted by
//! tombstones; stream records whose join field is missing, NULL or names no row), go
//! through [`Join::update_table`] and [`Join::feed`] in order. For each stream record,
//! SQLite runs the same join over that record and the table as its topic stands then (the
//! latest value of each key), and the outputs must agree, for JOIN and LEFT JOIN, with and
//! without WHERE on either side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plumber_sql::{Join, Record, Table};
use proptest::prelude::*;
use rusqlite::Connection;
use rusqlite::types::Value as Lite;
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Event {
    Stream {
        key: Option<String>,
        /// `None`: the field is missing; `Some(None)`: it is null.
        cust: Option<Option<String>>,
        amount: Option<i64>,
    },
    Table {
        key: Option<String>,
        /// `None`: a tombstone.
        row: Option<(Option<String>, Option<i64>)>,
    },
}

fn event() -> impl Strategy<Value = Event> {
    let cust = || prop::sample::select(vec!["c1", "c2", "c3", "c4"]).prop_map(str::to_owned);
    prop_oneof![
        3 => (
            prop::option::of(prop::sample::select(vec!["o1", "o2"]).prop_map(str::to_owned)),
            prop::option::weighted(0.9, prop::option::weighted(0.9, cust())),
            prop::option::weighted(0.9, -2i64..8),
        )
            .prop_map(|(key, cust, amount)| Event::Stream { key, cust, amount }),
        2 => (
            prop::option::weighted(0.95, cust()),
            prop::option::weighted(
                0.8,
                (
                    prop::option::weighted(0.9, prop::sample::select(vec!["ann", "bo"]).prop_map(str::to_owned)),
                    prop::option::weighted(0.9, 0i64..4),
                ),
            ),
        )
            .prop_map(|(key, row)| Event::Table { key, row }),
    ]
}

const WHERES: [&str; 3] = [
    "",
    " WHERE c.tier > 1 OR c.tier IS NULL",
    " WHERE o.amount > 3",
];

fn run(events: &[Event], left: bool, filter: &str, reversed: bool) -> Result<(), TestCaseError> {
    let join = if left { "LEFT JOIN" } else { "JOIN" };
    let on = if reversed {
        "c._key = o.cust"
    } else {
        "o.cust = c._key"
    };
    let sql = format!(
        "SELECT o.amount AS amount, c.name AS name, c.tier AS tier, c._key AS ck \
         FROM orders o {join} customers c ON {on}{filter}"
    );
    let compiled = Join::compile(&sql, Some(&["orders", "customers"]))
        .map_err(|p| TestCaseError::fail(format!("{sql}: {p:?}")))?;
    let lite =
        format!("SELECT o.amount, c.name, c.tier, c.key FROM o {join} c ON o.cust = c.key{filter}");
    let db = Connection::open_in_memory().unwrap();
    db.execute_batch(
        "CREATE TABLE o (amount INTEGER, cust TEXT); CREATE TABLE c (key TEXT, name TEXT, tier INTEGER)",
    )
    .unwrap();
    let mut table = Table::default();
    let mut rows: BTreeMap<String, (Option<String>, Option<i64>)> = BTreeMap::new();
    // What each row's key and value take, as the table counts them.
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    for (i, event) in events.iter().enumerate() {
        match event {
            Event::Table { key, row } => {
                let value = row
                    .as_ref()
                    .map(|(name, tier)| json!({"name": name, "tier": tier}).to_string());
                let updated = compiled.update_table(
                    &mut table,
                    key.as_deref().map(str::as_bytes),
                    value.as_deref().map(str::as_bytes),
                );
                match (key, row) {
                    (None, _) => prop_assert!(updated.is_err(), "a row without a key"),
                    (Some(key), Some(row)) => {
                        prop_assert!(updated.is_ok());
                        rows.insert(key.clone(), row.clone());
                        let text = value.as_deref().map_or(0, str::len);
                        sizes.insert(key.clone(), key.len() + text + plumber_sql::ROW_OVERHEAD);
                    }
                    (Some(key), None) => {
                        prop_assert!(updated.is_ok());
                        rows.remove(key);
                        sizes.remove(key);
                    }
                }
                prop_assert_eq!(table.len(), rows.len());
                prop_assert_eq!(table.bytes(), sizes.values().sum::<usize>());
            }
            Event::Stream { key, cust, amount } => {
                let mut object = serde_json::Map::new();
                if let Some(cust) = cust {
                    object.insert("cust".into(), json!(cust));
                }
                if let Some(amount) = amount {
                    object.insert("amount".into(), json!(amount));
                }
                let value = Json::Object(object).to_string();
                let ours = compiled
                    .feed(
                        &table,
                        &Record {
                            value: Some(value.as_bytes()),
                            key: key.as_deref().map(str::as_bytes),
                            headers: &[],
                        },
                    )
                    .map_err(|e| TestCaseError::fail(format!("{sql}\nevent {i}: {e:?}")))?;
                db.execute_batch("DELETE FROM o; DELETE FROM c").unwrap();
                db.execute(
                    "INSERT INTO o VALUES (?1, ?2)",
                    rusqlite::params![amount, cust.clone().flatten()],
                )
                .unwrap();
                for (k, (name, tier)) in &rows {
                    db.execute(
                        "INSERT INTO c VALUES (?1, ?2, ?3)",
                        rusqlite::params![k, name, tier],
                    )
                    .unwrap();
                }
                let mut statement = db.prepare(&lite).unwrap();
                let theirs: Vec<Vec<Lite>> = statement
                    .query_map([], |row| (0..4).map(|c| row.get::<_, Lite>(c)).collect())
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                prop_assert_eq!(ours.len(), theirs.len(), "{}\nevent {}: {}", sql, i, value);
                for (output, row) in ours.iter().zip(&theirs) {
                    let output: Json = serde_json::from_slice(output).unwrap();
                    for (name, lite) in ["amount", "name", "tier", "ck"].iter().zip(row) {
                        let same = match (&output[name], lite) {
                            (Json::Null, Lite::Null) => true,
                            (Json::Number(n), Lite::Integer(i)) => n.as_i64() == Some(*i),
                            (Json::String(s), Lite::Text(t)) => s == t,
                            _ => false,
                        };
                        prop_assert!(
                            same,
                            "{}\nevent {} {}: {} is {} here, {:?} in SQLite",
                            sql,
                            i,
                            value,
                            name,
                            output[name],
                            lite
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn joins_agree_with_sqlite(
        events in prop::collection::vec(event(), 0..40),
        left in any::<bool>(),
        filter in prop::sample::select(WHERES.to_vec()),
        reversed in any::<bool>(),
    ) {
        run(&events, left, filter, reversed)?;
    }
}
