//! What a stream–table join may say, and the errors (at line and column) for what it may not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plumber_sql::{Join, Query, Record, Table};

fn problems(sql: &str) -> Vec<String> {
    match Join::compile(sql, Some(&["orders", "customers"])) {
        Ok(_) => Vec::new(),
        Err(problems) => problems.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_stream_joins_a_table_by_its_key_only() {
    let right = problems("SELECT o.id FROM orders o RIGHT JOIN customers c ON o.cust = c._key");
    assert!(right[0].contains("JOIN or LEFT JOIN"), "{right:?}");
    let field = problems("SELECT o.id FROM orders o JOIN customers c ON o.cust = c.id");
    assert!(
        field[0].starts_with("1:47: write `ON <stream>.<field> = <table>._key`"),
        "{field:?}"
    );
    let both = problems("SELECT o.id FROM orders o JOIN customers c ON c.region = c._key");
    assert!(
        both[0].starts_with("1:47: this side of ON reads the stream's record"),
        "{both:?}"
    );
    let star = problems("SELECT c.* FROM orders o JOIN customers c ON o.cust = c._key");
    assert!(star[0].contains("name the table's columns"), "{star:?}");
    let grouped = problems(
        "SELECT o._key, COUNT(*) FROM orders o JOIN customers c ON o.cust = c._key GROUP BY o._key",
    );
    assert!(
        grouped
            .iter()
            .any(|p| p.contains("join in one step, group in the next")),
        "{grouped:?}"
    );
    let unread = problems("SELECT o.id FROM orders o JOIN regions c ON o.region = c._key");
    assert!(
        unread.iter().any(|p| p.contains("FROM `regions`")),
        "{unread:?}"
    );
    let Err(stateless) = Query::compile(
        "SELECT o.id FROM orders o JOIN customers c ON o.cust = c._key",
        None,
    ) else {
        panic!("a join compiled as a stateless query");
    };
    assert!(
        stateless[0].message.contains("docs/stateful-sql.md"),
        "{stateless:?}"
    );
}

/// `*` is the stream's fields (those the columns do not name), the table's come by name,
/// and the output keeps the stream record's key.
#[test]
fn star_is_the_stream_s_record_and_the_table_s_columns_are_named() {
    let join = Join::compile(
        "SELECT o.*, c.name AS customer FROM orders o LEFT JOIN customers c ON o.cust = c._key",
        Some(&["orders", "customers"]),
    )
    .unwrap();
    assert_eq!((join.stream(), join.table()), ("orders", "customers"));
    let mut table = Table::default();
    join.update_table(&mut table, Some(b"c1"), Some(br#"{"name":"Ann"}"#))
        .unwrap();
    let refused = join
        .update_table(&mut table, Some(b"c2"), Some(b"[1]"))
        .unwrap_err();
    assert_eq!(refused.kind, "sql-error");
    let feed = |value: &str| {
        join.feed(
            &table,
            &Record {
                value: Some(value.as_bytes()),
                key: Some(b"o-7"),
                headers: &[],
            },
        )
        .unwrap()
        .into_iter()
        .map(|v| String::from_utf8(v).unwrap())
        .collect::<Vec<_>>()
    };
    assert_eq!(
        feed(r#"{"id":7,"cust":"c1"}"#),
        [r#"{"id":7,"cust":"c1","customer":"Ann"}"#]
    );
    assert_eq!(
        feed(r#"{"id":8,"cust":"c2"}"#),
        [r#"{"id":8,"cust":"c2","customer":null}"#]
    );
}
