//! A stream–table join run by the processor on a broker (tansu, or the cluster in
//! PLUMBER_TEST_BOOTSTRAP): the table is read whole before the first stream record (every
//! record meets every row written before the processor started), changes to the table
//! reach the records processed after them, records that are no row are skipped and counted,
//! and a table past `--table-max-bytes` stops the processor before it commits anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{STOP_PROMISE, Step, start_assigned};
use plumber_testkit::{Broker, TestRecord, free_port, unique, wait_until};

const QUERY: &str =
    "SELECT o.id, o.cust, c.name, c.tier FROM orders o LEFT JOIN customers c ON o.cust = c._key";

/// Customers with a row: `c0` … `c199`; orders name `c0` … `c249`.
const CUSTOMERS: u32 = 200;

struct Topics {
    orders: String,
    customers: String,
    output: String,
    dlq: String,
}

fn topics(broker: &Broker) -> Topics {
    let topics = Topics {
        orders: unique("orders"),
        customers: unique("customers"),
        output: unique("enriched"),
        dlq: unique("enriched-dlq"),
    };
    broker.create_topic(&topics.orders, 2);
    broker.create_topic(&topics.customers, 2);
    broker.create_topic(&topics.output, 1);
    broker.create_topic(&topics.dlq, 1);
    topics
}

/// A table row, in partition 0 so the rows of a test apply in the order written.
fn row(key: &str, value: Option<&str>) -> TestRecord {
    let mut record = TestRecord::new(key, value.unwrap_or(""));
    record.value = value.map(|v| v.as_bytes().to_vec());
    record.partition = Some(0);
    record
}

fn order(id: u32, cust: u32) -> TestRecord {
    TestRecord::new(
        &format!("o{id}"),
        &format!(r#"{{"id":{id},"cust":"c{cust}"}}"#),
    )
}

fn joining(group: &str, topics: &Topics, extra: &[&str]) -> Step {
    Step::new(group, &topics.orders, &topics.output)
        .dlq(&topics.dlq)
        .args(&[
            "--sql",
            QUERY,
            "--table",
            &format!("customers={}", topics.customers),
            "--delivery",
            "at-least-once",
            "--commit-interval-ms",
            "200",
            "--log-format",
            "json",
        ])
        .args(extra)
}

fn values(records: &[TestRecord]) -> Vec<serde_json::Value> {
    records
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
        .collect()
}

#[test]
fn a_join_meets_the_whole_table_from_its_first_record_and_later_changes_after_them() {
    let broker = Broker::start();
    let topics = topics(&broker);
    let mut rows: Vec<TestRecord> = (0..CUSTOMERS)
        .map(|i| {
            row(
                &format!("c{i}"),
                Some(&format!(r#"{{"name":"n{i}","tier":"gold"}}"#)),
            )
        })
        .collect();
    // Two records that are no row: skipped, counted, and the table unchanged.
    let mut keyless = row("x", Some(r#"{"name":"nobody"}"#));
    keyless.key = None;
    rows.push(keyless);
    rows.push(row("c0", Some("[1, 2]")));
    broker.produce(&topics.customers, &rows);
    let orders: Vec<TestRecord> = (0..400).map(|i| order(i, i % 250)).collect();
    broker.produce(&topics.orders, &orders);

    let group = unique("joiner");
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let step = joining(&group, &topics, &["--metrics", &metrics]);
    let mut process = start_assigned(&broker, &step);
    let records = broker.wait_for_records(&topics.output, "every order joined", |records| {
        records.len() >= 400
    });
    let mut ids: Vec<u64> = Vec::new();
    for (record, value) in records.iter().zip(values(&records)) {
        let id = value["id"].as_u64().unwrap();
        ids.push(id);
        let cust = id % 250;
        assert_eq!(
            record.key.as_deref(),
            Some(format!("o{id}").as_bytes()),
            "an output keeps its order's key"
        );
        if cust < u64::from(CUSTOMERS) {
            assert_eq!(
                value["name"],
                serde_json::json!(format!("n{cust}")),
                "order {id} met its customer's row, loaded before the first order: {value}"
            );
        } else {
            assert!(
                value["name"].is_null() && value["tier"].is_null(),
                "LEFT JOIN: order {id} has no customer and keeps NULL columns: {value}"
            );
        }
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 400, "each order once");
    let log = step.log();
    // On a broker this fast, a table read while the group is joined could be whole by the
    // first order by luck; what the processor promises is the order of the two.
    let loaded = log
        .find("the join's table is loaded")
        .expect("the load is logged");
    let assigned = log.find("partitions assigned").expect("assigned");
    assert!(
        loaded < assigned,
        "the table is loaded before the group is joined: {log}"
    );
    let loaded_line = log[loaded..].lines().next().unwrap();
    assert!(
        loaded_line.contains(&format!(r#""rows":{CUSTOMERS}"#)),
        "the whole table, before the first order: {loaded_line}"
    );
    assert_eq!(
        log.matches("a table record is no row; skipped").count(),
        2,
        "{log}"
    );
    let page = ureq::get(&format!("http://{metrics}/metrics"))
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .unwrap();
    assert!(
        page.contains(&format!("plumber_processor_table_rows {CUSTOMERS}")),
        "{page}"
    );
    assert!(
        page.contains("plumber_processor_table_skipped_records_total 2"),
        "{page}"
    );

    // The table changes while the processor runs: c1 is deleted, then c0 changes tier, in
    // that order in one partition. Once an order sees c0's new tier, c1's row is gone too.
    broker.produce(
        &topics.customers,
        &[
            row("c1", None),
            row("c0", Some(r#"{"name":"n0","tier":"platinum"}"#)),
        ],
    );
    let mut next = 1_000;
    wait_until(
        "an order meets c0's new tier",
        Duration::from_secs(60),
        || {
            broker.produce(&topics.orders, &[order(next, 0)]);
            next += 1;
            let records = broker.read_all(&topics.output);
            values(&records)
                .iter()
                .any(|v| v["cust"] == "c0" && v["tier"] == "platinum")
        },
    );
    broker.produce(&topics.orders, &[order(5_000, 1), order(5_001, 2)]);
    let records = broker.wait_for_records(&topics.output, "orders 5000 and 5001", |records| {
        values(records)
            .iter()
            .filter(|v| v["id"] == 5_000 || v["id"] == 5_001)
            .count()
            >= 2
    });
    for value in values(&records) {
        match value["id"].as_u64() {
            Some(5_000) => assert!(value["name"].is_null(), "c1 was deleted: {value}"),
            Some(5_001) => assert_eq!(value["name"], "n2", "{value}"),
            _ => {}
        }
    }
    process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(process.wait_exit(STOP_PROMISE).is_some_and(|s| s.success()));
    assert!(
        broker.read_all(&topics.dlq).is_empty(),
        "no order is refused"
    );
}

#[test]
fn a_table_past_its_bound_stops_the_processor_before_it_commits_anything() {
    let broker = Broker::start();
    let topics = topics(&broker);
    let rows: Vec<TestRecord> = (0..50)
        .map(|i| {
            row(
                &format!("c{i}"),
                Some(&format!(r#"{{"name":"n{i}","tier":"gold"}}"#)),
            )
        })
        .collect();
    broker.produce(&topics.customers, &rows);
    broker.produce(&topics.orders, &[order(0, 0)]);
    let group = unique("joiner");
    // 50 rows take about 50 × 100 bytes.
    let step = joining(&group, &topics, &["--table-max-bytes", "2000"]);
    let mut process = step.start(&broker);
    let status = process
        .wait_exit(Duration::from_secs(60))
        .expect("the processor stops by itself");
    assert!(!status.success(), "{}", step.log());
    let log = step.log();
    assert!(
        log.contains("--table-max-bytes (2000 bytes)") && log.contains("tableMaxBytes"),
        "the error names the limit and how to raise it: {log}"
    );
    assert!(
        !log.contains("partitions assigned"),
        "it never joined its group: {log}"
    );
    assert!(broker.committed(&group, &topics.orders, 2).is_empty());
    assert!(broker.read_all(&topics.output).is_empty());
}
