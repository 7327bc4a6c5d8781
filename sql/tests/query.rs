//! What queries mean: projection, filters, NULL, types, names, errors; and what compiling
//! refuses, at which line and column.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plumber_sql::{EvalError, Problem, Query, Record};

fn query(sql: &str) -> Query {
    Query::compile(sql, Some(&["t"])).unwrap_or_else(|p| panic!("{sql}: {p:?}"))
}

fn problems(sql: &str, inputs: &[&str]) -> Vec<Problem> {
    match Query::compile(sql, Some(inputs)) {
        Ok(_) => panic!("{sql} compiles"),
        Err(problems) => problems,
    }
}

/// The only problem of `sql` (read from step `t`), with its position.
fn problem(sql: &str) -> (u32, u32, String) {
    let mut p = problems(sql, &["t"]);
    assert_eq!(p.len(), 1, "{sql}: {p:?}");
    let p = p.remove(0);
    (p.line, p.column, p.message)
}

fn run_with(
    q: &Query,
    value: &str,
    key: Option<&str>,
    headers: &[(&str, Option<&[u8]>)],
) -> Result<Vec<String>, EvalError> {
    let record = Record {
        value: Some(value.as_bytes()),
        key: key.map(str::as_bytes),
        headers,
    };
    q.eval(&record, None).map(|outputs| {
        outputs
            .into_iter()
            .map(|o| String::from_utf8(o).unwrap())
            .collect()
    })
}

fn run(sql: &str, value: &str) -> Result<Vec<String>, EvalError> {
    run_with(&query(sql), value, None, &[])
}

/// The single output of `sql` on `value`.
fn one(sql: &str, value: &str) -> String {
    let mut out = run(sql, value).unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(out.len(), 1, "{sql}: {out:?}");
    out.remove(0)
}

/// The value of `expr` on `value`, as JSON.
fn eval(expr: &str, value: &str) -> String {
    let out = one(&format!("SELECT {expr} AS x FROM t"), value);
    out.strip_prefix("{\"x\":")
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned()
}

fn error(expr: &str, value: &str) -> String {
    run(&format!("SELECT {expr} AS x FROM t"), value)
        .expect_err(expr)
        .message
}

const CAR: &str = r#"{"id": 7, "speed": 12.50, "name": "Ada", "tags": ["a", "b"], "meta": {"source": "gps", "n": 3}, "gone": null}"#;

#[test]
fn projection_filter_and_rename() {
    let q = "SELECT id, speed * 2 AS double_speed, meta.source FROM t WHERE speed > 10";
    assert_eq!(
        one(q, CAR),
        r#"{"id":7,"double_speed":25.0,"source":"gps"}"#
    );
    assert_eq!(
        run(q, r#"{"id": 8, "speed": 3}"#).unwrap(),
        Vec::<String>::new()
    );
    // Fields are copied as written: 12.50 keeps its digits, objects their spacing.
    assert_eq!(
        one("SELECT speed, meta FROM t", CAR),
        r#"{"speed":12.50,"meta":{"source": "gps", "n": 3}}"#
    );
}

#[test]
fn star_keeps_the_record_and_explicit_columns_replace_fields() {
    let record = r#"{"b": 1, "a": "x", "c": [1, 2]}"#;
    assert_eq!(
        one("SELECT * FROM t", record),
        r#"{"b":1,"a":"x","c":[1, 2]}"#
    );
    assert_eq!(
        one("SELECT t.* FROM t", record),
        r#"{"b":1,"a":"x","c":[1, 2]}"#
    );
    assert_eq!(
        one("SELECT *, UPPER(a) AS a, b + 1 AS d FROM t", record),
        r#"{"b":1,"c":[1, 2],"a":"X","d":2}"#
    );
}

#[test]
fn natural_column_names() {
    assert_eq!(
        one(
            "SELECT meta.n, t.id, speed*2, UPPER(name), _key, _headers.trace FROM t",
            CAR
        ),
        r#"{"n":3,"id":7,"speed * 2":25.0,"UPPER(name)":"ADA","_key":null,"trace":null}"#
    );
}

#[test]
fn missing_fields_are_null_and_null_propagates() {
    assert_eq!(eval("nope", CAR), "null");
    assert_eq!(eval("meta.nope.deeper", CAR), "null");
    assert_eq!(
        eval("name.first", CAR),
        "null",
        "a field of a string is missing"
    );
    assert_eq!(eval("gone + 1", CAR), "null");
    assert_eq!(eval("nope || 'x'", CAR), "null");
    assert_eq!(eval("UPPER(nope)", CAR), "null");
    assert_eq!(eval("nope = nope", CAR), "null");
    assert_eq!(eval("nope IS NULL", CAR), "true");
    assert_eq!(eval("gone IS NOT NULL", CAR), "false");
    assert_eq!(eval("nope IS NOT DISTINCT FROM gone", CAR), "true");
    assert_eq!(eval("1 IS DISTINCT FROM nope", CAR), "true");
    // WHERE keeps a record only when the condition is TRUE, not NULL.
    assert_eq!(
        run("SELECT id FROM t WHERE nope > 1", CAR).unwrap().len(),
        0
    );
    assert_eq!(
        run("SELECT id FROM t WHERE NOT (nope > 1)", CAR)
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn three_valued_logic() {
    let table = [
        ("TRUE AND NULL", "null"),
        ("FALSE AND NULL", "false"),
        ("NULL AND FALSE", "false"),
        ("TRUE OR NULL", "true"),
        ("NULL OR TRUE", "true"),
        ("FALSE OR NULL", "null"),
        ("NOT NULL", "null"),
        ("NULL IS UNKNOWN", "true"),
        ("(1 > 2) IS FALSE", "true"),
        ("NULL IS NOT TRUE", "true"),
        ("1 IN (2, NULL)", "null"),
        ("1 IN (1, NULL)", "true"),
        ("1 NOT IN (2, NULL)", "null"),
        ("1 NOT IN (2, 3)", "true"),
        ("NULL IN (1)", "null"),
        ("5 BETWEEN 1 AND NULL", "null"),
        ("0 BETWEEN 1 AND NULL", "false"),
        ("5 NOT BETWEEN 1 AND 10", "false"),
        ("CASE WHEN NULL THEN 1 ELSE 2 END", "2"),
        ("CASE NULL WHEN NULL THEN 1 ELSE 2 END", "2"),
        ("COALESCE(NULL, NULL, 3, 4)", "3"),
        ("NULLIF(3, 3)", "null"),
        ("NULLIF(3, 4)", "3"),
    ];
    for (expr, want) in table {
        assert_eq!(eval(expr, "{}"), want, "{expr}");
    }
}

#[test]
fn short_circuits_skip_what_cannot_matter() {
    // Evaluated left to right; what cannot change the result is not evaluated.
    let record = r#"{"n": 0}"#;
    assert_eq!(eval("n <> 0 AND 10 / n > 1", record), "false");
    assert_eq!(eval("n = 0 OR 10 / n > 1", record), "true");
    assert_eq!(eval("CASE WHEN n = 0 THEN 0 ELSE 10 / n END", record), "0");
    assert_eq!(eval("COALESCE(n, 10 / n)", record), "0");
    assert!(error("n = 0 AND 10 / n > 1", record).contains("division by zero"));
}

#[test]
fn numbers() {
    let table = [
        ("7 / 2", "3"),
        ("-7 / 2", "-3"),
        ("7 % 3", "1"),
        ("-7 % 3", "-1"),
        ("7.0 / 2", "3.5"),
        ("MOD(7, 3)", "1"),
        ("MOD(7.5, 2)", "1.5"),
        ("1 + 2 * 3", "7"),
        ("speed + id", "19.5"),
        ("-speed", "-12.5"),
        ("ABS(-3)", "3"),
        ("ABS(-2.5)", "2.5"),
        ("ROUND(2.675, 2)", "2.67"),
        ("ROUND(0.125, 2)", "0.13"),
        ("ROUND(0.49999999999999994)", "0.0"),
        ("ROUND(-2.5)", "-3.0"),
        ("ROUND(1234, -2)", "1200"),
        ("FLOOR(-2.5)", "-3.0"),
        ("CEIL(2.1)", "3.0"),
        ("CEILING(2)", "2"),
        ("SQRT(16)", "4.0"),
        ("POWER(2, 10)", "1024.0"),
        ("9223372036854775807", "9223372036854775807"),
        ("-9223372036854775808", "-9223372036854775808"),
        ("9223372036854775808", "9.223372036854776e18"),
        ("1e3", "1000.0"),
    ];
    for (expr, want) in table {
        assert_eq!(eval(expr, CAR), want, "{expr}");
    }
    for (expr, why) in [
        ("id / 0", "division by zero"),
        ("id % 0", "division by zero"),
        ("speed / 0", "division by zero"),
        ("id + 9223372036854775807", "integer overflow"),
        ("-(id - 9223372036854775807 - 8)", "integer overflow"),
        ("SQRT(-id)", "negative"),
        ("POWER(speed, 1000)", "not a finite number"),
        ("ABS(id - 9223372036854775807 - 8)", "integer overflow"),
    ] {
        let message = error(expr, CAR);
        assert!(message.contains(why), "{expr}: {message}");
        assert!(
            message.contains(&format!("`{expr}`")) || message.contains('`'),
            "{message}"
        );
    }
}

#[test]
fn comparisons_do_not_mix_kinds() {
    assert_eq!(eval("id = 7.0", CAR), "true");
    assert_eq!(eval("'abc' < 'abd'", CAR), "true");
    assert_eq!(eval("'B' < 'a'", CAR), "true", "binary order");
    assert_eq!(eval("TRUE > FALSE", CAR), "true");
    assert_eq!(eval("meta = meta", CAR), "true");
    assert_eq!(
        eval("tags <> tags", r#"{"tags": [1, {"a": 2, "b": 3}]}"#),
        "false"
    );
    for expr in ["id = '7'", "name > 1", "tags < tags", "(id > 1) = 1"] {
        let message = error(expr, CAR);
        assert!(message.contains("compare"), "{expr}: {message}");
    }
}

#[test]
fn strings() {
    let table = [
        ("UPPER(name)", r#""ADA""#),
        ("LOWER('ÀB')", r#""àb""#),
        ("LENGTH('h€llo')", "5"),
        ("SUBSTR('hello', 2, 3)", r#""ell""#),
        ("SUBSTRING('hello' FROM 2 FOR 3)", r#""ell""#),
        ("SUBSTRING('hello', -3)", r#""llo""#),
        ("TRIM('  a b  ')", r#""a b""#),
        ("TRIM(LEADING 'x' FROM 'xxaxx')", r#""axx""#),
        ("TRIM(TRAILING FROM '  a  ')", r#""  a""#),
        ("LTRIM('xxa', 'x')", r#""a""#),
        ("RTRIM('a  ')", r#""a""#),
        ("REPLACE('a.b.c', '.', '/')", r#""a/b/c""#),
        ("name || '-' || id", r#""Ada-7""#),
        ("CONCAT(name, NULL, ':', speed, TRUE)", r#""Ada:12.5true""#),
        ("name LIKE 'A%'", "true"),
        ("name LIKE 'a%'", "false"),
        ("name ILIKE 'a%'", "true"),
        ("name NOT LIKE '_d_'", "false"),
        ("'50%' LIKE '50!%' ESCAPE '!'", "true"),
        ("CAST(id AS VARCHAR)", r#""7""#),
        ("CAST(meta AS TEXT)", r#""{\"source\":\"gps\",\"n\":3}""#),
        ("CAST('12' AS INT) + 1", "13"),
        ("CAST(speed AS INTEGER)", "12"),
        ("CAST('2.5' AS DOUBLE)", "2.5"),
        ("CAST(id AS DOUBLE)", "7.0"),
        ("CAST('true' AS BOOLEAN)", "true"),
        ("CAST(0 AS BOOLEAN)", "false"),
        ("id::VARCHAR", r#""7""#),
        ("TRY_CAST('x' AS INT)", "null"),
    ];
    for (expr, want) in table {
        assert_eq!(eval(expr, CAR), want, "{expr}");
    }
    for (expr, why) in [
        ("UPPER(id)", "must be a string"),
        ("CAST(name AS INT)", "is not an INTEGER"),
        ("CAST(tags AS INT)", "cannot cast a JSON array"),
        ("id LIKE '7'", "must be a string"),
        ("name LIKE 'A' ESCAPE 'ab'", "single character"),
        ("NOT name", "expected a boolean"),
        ("id AND TRUE", "expected a boolean"),
        ("-name", "cannot negate"),
        ("name + 1", "cannot compute a string + an integer"),
    ] {
        let message = error(expr, CAR);
        assert!(message.contains(why), "{expr}: {message}");
    }
}

/// CAST from text skips the whitespace SQLite skips around a number (space, tab, line feed,
/// vertical tab, form feed, carriage return) and no other: `'12\u{3000}'` is no number in
/// SQLite, and the oracle found us reading it as 12.
#[test]
fn cast_from_text_skips_only_the_whitespace_sqlite_skips() {
    let value = r#"{"a": " \t\n\u000b\u000c\r12 \r\n", "b": "12\u3000", "c": "\u00a02.5", "d": "\u2003true"}"#;
    assert_eq!(eval("CAST(a AS INTEGER)", value), "12");
    assert_eq!(eval("CAST(a AS DOUBLE)", value), "12.0");
    assert_eq!(eval("TRY_CAST(b AS INTEGER)", value), "null");
    for (expr, why) in [
        ("CAST(b AS INTEGER)", "is not an INTEGER"),
        ("CAST(b AS DOUBLE)", "is not a DOUBLE"),
        ("CAST(c AS DOUBLE)", "is not a DOUBLE"),
        ("CAST(d AS BOOLEAN)", "is not a BOOLEAN"),
    ] {
        let message = error(expr, value);
        assert!(message.contains(why), "{expr}: {message}");
    }
}

#[test]
fn case_forms() {
    let q = "CASE WHEN speed > 100 THEN 'fast' WHEN speed > 10 THEN 'moving' ELSE 'slow' END";
    assert_eq!(eval(q, CAR), r#""moving""#);
    assert_eq!(
        eval("CASE id WHEN 1 THEN 'one' WHEN 7 THEN 'seven' END", CAR),
        r#""seven""#
    );
    assert_eq!(eval("CASE id WHEN 1 THEN 'one' END", CAR), "null");
    assert!(error("CASE WHEN name THEN 1 END", CAR).contains("expected a boolean"));
}

#[test]
fn key_and_headers() {
    let q = query(
        "SELECT _key, _headers.trace, _headers, t._key AS field FROM t WHERE _headers.kind = 'x'",
    );
    let headers: &[(&str, Option<&[u8]>)] = &[
        ("trace", Some(b"t1")),
        ("kind", Some(b"y")),
        ("kind", Some(b"x")),
        ("empty", None),
    ];
    assert_eq!(
        run_with(&q, r#"{"_key": "mine"}"#, Some("k1"), headers).unwrap(),
        [
            r#"{"_key":"k1","trace":"t1","_headers":{"trace":"t1","kind":"x","empty":null},"field":"mine"}"#
        ]
    );
    assert_eq!(run_with(&q, "{}", None, &[]).unwrap().len(), 0);
    let bad: &[(&str, Option<&[u8]>)] = &[("kind", Some(&[0xff]))];
    let err = run_with(&q, "{}", Some("k"), bad).unwrap_err();
    assert!(err.message.contains("not UTF-8"), "{err}");
    let key_only = query("SELECT _key FROM t");
    let err = run_with(&key_only, "{}", None, &[]).map(|_| ());
    assert!(err.is_ok(), "no key is NULL");
}

#[test]
fn records_that_are_not_json_objects_are_rejected() {
    let q = query("SELECT * FROM t");
    for (value, kind) in [
        ("nope", "invalid-json"),
        ("[1]", "sql-error"),
        ("5", "sql-error"),
        ("{} {}", "invalid-json"),
    ] {
        assert_eq!(
            run_with(&q, value, None, &[]).unwrap_err().kind,
            kind,
            "{value}"
        );
    }
    let tombstone = Record {
        value: None,
        key: None,
        headers: &[],
    };
    assert!(
        q.eval(&tombstone, None)
            .unwrap_err()
            .message
            .contains("tombstone")
    );
    let bad_utf8 = Record {
        value: Some(&[b'{', 0xff, b'}']),
        key: None,
        headers: &[],
    };
    assert_eq!(q.eval(&bad_utf8, None).unwrap_err().kind, "invalid-json");
}

#[test]
fn union_all_reads_each_input_with_its_own_select() {
    let q = Query::compile(
        "SELECT id, speed FROM cars WHERE speed > 10 UNION ALL SELECT id, velocity AS speed FROM trucks",
        Some(&["cars", "trucks"]),
    )
    .unwrap();
    assert_eq!(q.inputs(), ["cars", "trucks"]);
    let record = |v: &'static str| Record {
        value: Some(v.as_bytes()),
        key: None,
        headers: &[],
    };
    let outputs = |v, from| {
        q.eval(&record(v), from)
            .unwrap()
            .into_iter()
            .map(|o| String::from_utf8(o).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        outputs(r#"{"id":1,"speed":20}"#, Some("cars")),
        [r#"{"id":1,"speed":20}"#]
    );
    assert_eq!(
        outputs(r#"{"id":2,"velocity":5}"#, Some("trucks")),
        [r#"{"id":2,"speed":5}"#]
    );
    assert_eq!(
        outputs(r#"{"id":3,"speed":5}"#, Some("cars")),
        Vec::<String>::new()
    );
    // Without a step, every SELECT runs.
    assert_eq!(outputs(r#"{"id":4,"speed":50}"#, None).len(), 2);
}

#[test]
fn constant_errors_are_found_when_compiling() {
    let (line, column, message) = problem("SELECT id, 1 / 0 AS x FROM t");
    assert_eq!((line, column), (1, 12));
    assert!(message.contains("division by zero"), "{message}");
    let (_, column, message) = problem("SELECT UPPER(5) FROM t");
    assert_eq!(column, 8);
    assert!(message.contains("must be a string"), "{message}");
    let (_, column, message) = problem("SELECT id FROM t WHERE 1");
    assert_eq!(column, 24);
    assert!(message.contains("WHERE needs a condition"), "{message}");
    assert!(Query::compile("SELECT id FROM t WHERE TRUE", Some(&["t"])).is_ok());
}

#[test]
fn syntax_errors_point_into_the_query() {
    let (line, column, message) = problem("SELECT id,\n  speed +\nFROM t");
    assert_eq!((line, column), (3, 1), "{message}");
    assert!(message.starts_with("syntax error"), "{message}");
    let (line, column, message) = problem("SELECT 'unterminated FROM t");
    assert_eq!(line, 1);
    assert!(column >= 8, "{column}");
    assert!(message.contains("syntax error"), "{message}");
    let (line, column, message) = problem("SELECT id\nFROM t WHERE");
    assert_eq!((line, column), (2, 13), "{message}");
    assert!(message.contains("end of the query"), "{message}");
    let (_, column, message) = problem("SELECT id FROM raw-clicks");
    assert_eq!(column, 19);
    assert!(message.contains(r#"FROM "raw-clicks""#), "{message}");
    assert!(
        Query::compile(
            r#"SELECT "raw-clicks".id FROM "raw-clicks""#,
            Some(&["raw-clicks"])
        )
        .is_ok()
    );
    let (_, _, message) = problem("");
    assert!(message.contains("empty"), "{message}");
    let (line, column, message) = problem("SELECT id FROM t; SELECT id FROM t");
    assert_eq!((line, column), (1, 19));
    assert!(message.contains("one SELECT"), "{message}");
    let (_, column, message) = problem("DELETE FROM t");
    assert_eq!(column, 1);
    assert!(message.contains("not DELETE"), "{message}");
}

#[test]
fn what_needs_more_than_one_record_is_refused_by_name() {
    let cases = [
        ("SELECT id FROM t GROUP BY id", 18, "GROUP BY"),
        ("SELECT COUNT(*) FROM t", 8, "aggregate function COUNT"),
        ("SELECT sum(speed) FROM t", 8, "aggregate function SUM"),
        ("SELECT id FROM t ORDER BY id", 18, "ORDER BY"),
        ("SELECT id FROM t LIMIT 5", 18, "LIMIT"),
        ("SELECT DISTINCT id FROM t", 8, "DISTINCT"),
        ("SELECT id FROM t JOIN u ON t.id = u.id", 18, "JOIN"),
        ("SELECT id FROM t, u", 19, "join"),
        (
            "SELECT ROW_NUMBER() OVER (ORDER BY id) FROM t",
            8,
            "window functions",
        ),
        ("SELECT lag(id) OVER w FROM t", 8, "window functions"),
        (
            "SELECT id FROM t WHERE id IN (SELECT id FROM t)",
            24,
            "subquery",
        ),
        ("SELECT (SELECT 1) FROM t", 9, "subquery"),
        ("SELECT id FROM (SELECT id FROM t)", 17, "subqueries"),
        ("SELECT id FROM t HAVING id > 1", 18, "HAVING"),
        ("WITH x AS (SELECT id FROM t) SELECT id FROM x", 1, "WITH"),
        ("SELECT id FROM t UNION SELECT id FROM t", 18, "UNION ALL"),
        ("SELECT id FROM t EXCEPT SELECT id FROM t", 17, "EXCEPT"),
        ("SELECT nosuch(id) FROM t", 8, "unknown function `nosuch`"),
        ("SELECT UPPER(a, b) FROM t", 8, "UPPER takes 1 argument"),
        (
            "SELECT CAST(id AS DECIMAL(10, 2)) FROM t",
            19,
            "write DOUBLE",
        ),
        ("SELECT CAST(id AS VARCHAR(10)) FROM t", 19, "write VARCHAR"),
        ("SELECT CAST(id AS DATE) FROM t", 19, "CAST to `DATE`"),
        ("SELECT tags[0] FROM t", 8, "indexing"),
        ("SELECT id::DATE FROM t", 12, "CAST to `DATE`"),
        (
            "SELECT id FROM t WHERE name SIMILAR TO 'a'",
            24,
            "not supported",
        ),
        ("SELECT id, id FROM t", 12, "two columns are named `id`"),
        (
            "SELECT a.x AS y, b AS y FROM t",
            23,
            "two columns are named `y`",
        ),
        ("SELECT *, * FROM t", 11, "`*` appears twice"),
        ("SELECT 1", 1, "add `FROM <input step>`"),
        ("SELECT _key.x FROM t", 8, "has no fields"),
        ("SELECT id FROM u", 16, "FROM `u`: the step reads `t`"),
        (
            "SELECT speed * 3.6 AS kmh FROM t WHERE kmh > 40",
            40,
            "WHERE runs before SELECT",
        ),
        (
            "SELECT velocity AS speed FROM t WHERE speed > 4",
            39,
            "write `t.speed`",
        ),
    ];
    for (sql, column, needle) in cases {
        let all = problems(sql, &["t"]);
        let found = all
            .iter()
            .find(|p| p.message.contains(needle))
            .unwrap_or_else(|| panic!("{sql}: no problem mentions {needle:?}: {all:?}"));
        assert_eq!((found.line, found.column), (1, column), "{sql}: {found:?}");
    }
}

#[test]
fn where_may_use_the_fields_select_renames() {
    // Renaming a field to its own name, or qualifying, is no trap.
    for sql in [
        "SELECT speed AS speed FROM t WHERE speed > 1",
        "SELECT t.speed AS speed FROM t WHERE speed > 1",
        "SELECT speed * 2 AS kmh FROM t WHERE t.kmh > 1",
    ] {
        assert!(Query::compile(sql, Some(&["t"])).is_ok(), "{sql}");
    }
}

#[test]
fn strings_cannot_grow_without_bound() {
    // 3000 characters: one REPLACE of each by the whole makes 9 MB, two of those 18 MB.
    let record = format!(r#"{{"s": "{}"}}"#, "a".repeat(3000));
    assert_eq!(eval("LENGTH(REPLACE(s, 'a', s))", &record), "9000000");
    for q in [
        "REPLACE(REPLACE(s, 'a', s), 'a', s)",
        "CONCAT(REPLACE(s, 'a', s), REPLACE(s, 'a', s))",
        "REPLACE(s, 'a', s) || REPLACE(s, 'a', s)",
    ] {
        let message = error(q, &record);
        assert!(message.contains("longer than 16 MiB"), "{q}: {message}");
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let sql = "SELECT COUNT(id), UPPER(1), nosuch(x)\nFROM t\nGROUP BY id\nORDER BY id";
    let all = problems(sql, &["t"]);
    let positions: Vec<(u32, u32)> = all.iter().map(|p| (p.line, p.column)).collect();
    assert_eq!(
        positions,
        [(1, 8), (1, 19), (1, 29), (3, 1), (4, 1)],
        "{all:?}"
    );
}

#[test]
fn fan_in_must_read_every_input() {
    let sql = "SELECT id FROM a";
    let all = problems(sql, &["a", "b"]);
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(
        all[0].message.contains("UNION ALL SELECT … FROM b"),
        "{all:?}"
    );
    assert!(
        Query::compile(
            "SELECT id FROM a UNION ALL SELECT id FROM b",
            Some(&["a", "b"])
        )
        .is_ok()
    );
    // Aliases qualify fields; the step name does not once aliased.
    let q = Query::compile(
        "SELECT c.id FROM a AS c UNION ALL SELECT b.id FROM b",
        Some(&["a", "b"]),
    )
    .unwrap();
    let record = Record {
        value: Some(br#"{"id": 1}"#),
        key: None,
        headers: &[],
    };
    assert_eq!(q.eval(&record, None).unwrap().len(), 2);
    let names = problems(
        "SELECT id, speed FROM a UNION ALL SELECT id, velocity FROM b",
        &["a", "b"],
    );
    assert_eq!(names.len(), 1, "{names:?}");
    assert_eq!((names[0].line, names[0].column), (1, 35));
    assert!(names[0].message.contains("`velocity`"), "{names:?}");
    assert!(
        Query::compile(
            "SELECT * FROM a UNION ALL SELECT id FROM b",
            Some(&["a", "b"])
        )
        .is_ok()
    );
    // Without inputs (the processor), any FROM is accepted.
    assert!(Query::compile("SELECT id FROM whatever", None).is_ok());
}

#[test]
fn huge_and_deep_queries_are_refused_not_a_crash() {
    let long = format!("SELECT {} AS x FROM t", vec!["1"; 3000].join(" + "));
    let (_, _, message) = problem(&long);
    assert!(message.contains("tokens"), "{message}");
    let deep_ok = format!("SELECT {} AS x FROM t", vec!["id"; 100].join(" + "));
    assert!(Query::compile(&deep_ok, Some(&["t"])).is_ok());
    let deep = format!("SELECT {} AS x FROM t", vec!["id"; 1500].join(" + "));
    let (_, _, message) = problem(&deep);
    assert!(message.contains("levels"), "{message}");
    let parens = format!("SELECT {}1{} FROM t", "(".repeat(2000), ")".repeat(2000));
    let (_, _, message) = problem(&parens);
    assert!(message.contains("deep"), "{message}");
    // On a small stack, as on any thread.
    let handle = std::thread::Builder::new()
        .stack_size(512 * 1024)
        .spawn(move || Query::compile(&deep, Some(&["t"])).is_err())
        .unwrap();
    assert!(handle.join().unwrap());
}
