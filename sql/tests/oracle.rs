//! SQLite as an oracle: generated queries run over generated records both through
//! [`Query::eval`] and through SQLite (its JSON functions reading the same record), and every
//! output record must agree.
//!
//! Expressions are generated typed (each subexpression is an integer, double, string or
//! boolean expression over fields of that kind), so both engines see well-typed queries; the
//! records leave fields out, make them null, or give the nested object another kind. Where
//! the two differ by design (README "Differences from SQLite"), the generator either spells
//! the operation the SQLite way (MOD of doubles is SQLite's `mod()`, booleans are read back
//! from SQLite's 1 and 0, LIKE runs with `case_sensitive_like`) or accepts our refusal: a
//! record we dead-letter for division by zero, integer overflow, a result that is not a
//! finite number or the square root of a negative number is one where SQLite answers NULL or
//! a double instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plumber_sql::{Query, Record};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rusqlite::Connection;
use rusqlite::types::Value as Lite;
use serde_json::value::RawValue;
use serde_json::{Map, Value as Json, json};
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Int,
    Float,
    Text,
    Bool,
}

const TYPES: [Ty; 4] = [Ty::Int, Ty::Float, Ty::Text, Ty::Bool];

/// The fields of every generated record, by kind. `o` is an object (or, in some records,
/// missing, null or a string).
const FIELDS: [(&str, Ty); 9] = [
    ("i0", Ty::Int),
    ("i1", Ty::Int),
    ("d0", Ty::Float),
    ("d1", Ty::Float),
    ("s0", Ty::Text),
    ("s1", Ty::Text),
    ("b0", Ty::Bool),
    ("o.x", Ty::Int),
    ("o.s", Ty::Text),
];

/// Characters of generated strings: cased ASCII, LIKE's wildcards and our escape, a space
/// for TRIM, and characters of several UTF-8 bytes that have no case (SQLite's UPPER and
/// LOWER only know ASCII).
const ALPHABET: [char; 10] = ['a', 'A', 'b', 'B', '%', '_', '!', ' ', '€', '日'];

/// One expression in both dialects.
#[derive(Debug, Clone)]
struct Sql {
    ours: String,
    lite: String,
}

impl Sql {
    fn same(text: impl Into<String>) -> Sql {
        let text = text.into();
        Sql {
            ours: text.clone(),
            lite: text,
        }
    }
}

/// Decisions of the generator, drawn from bytes proptest chooses and shrinks (toward 0:
/// the first alternative of each choice is the simplest).
struct Choices<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Choices<'_> {
    fn pick(&mut self, n: usize) -> usize {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        usize::from(b) % n
    }

    fn int(&mut self) -> i64 {
        match self.pick(12) {
            0 => 0,
            1 => i64::MAX,
            2 => -i64::MAX,
            3 => 1 << 40,
            n => i64::try_from(self.pick(41)).unwrap() - 20 + i64::try_from(n).unwrap() - 4,
        }
    }

    fn float(&mut self) -> f64 {
        match self.pick(8) {
            0 => 0.5,
            1 => 2.675,
            2 => 0.1,
            3 => -1e15,
            _ => (f64::from(u8::try_from(self.pick(241)).unwrap()) - 120.0) / 8.0,
        }
    }

    fn text(&mut self) -> String {
        let len = self.pick(5);
        (0..len)
            .map(|_| ALPHABET[self.pick(ALPHABET.len())])
            .collect()
    }
}

fn int_literal(i: i64) -> Sql {
    Sql::same(if i < 0 {
        format!("({i})")
    } else {
        i.to_string()
    })
}

fn float_literal(f: f64) -> Sql {
    let text = ryu::Buffer::new().format_finite(f).to_owned();
    Sql::same(if f < 0.0 { format!("({text})") } else { text })
}

fn text_literal(s: &str) -> Sql {
    Sql::same(format!("'{}'", s.replace('\'', "''")))
}

fn field(path: &str) -> Sql {
    Sql {
        ours: path.to_owned(),
        lite: format!("json_extract(v, '$.{path}')"),
    }
}

/// `f(a, b, …)` in both dialects, with SQLite's name.
fn call(ours: &str, lite: &str, args: &[Sql]) -> Sql {
    let join = |f: fn(&Sql) -> &str| args.iter().map(f).collect::<Vec<_>>().join(", ");
    Sql {
        ours: format!("{ours}({})", join(|a| &a.ours)),
        lite: format!("{lite}({})", join(|a| &a.lite)),
    }
}

/// `(a OP b)`.
fn infix(a: &Sql, op: &str, b: &Sql) -> Sql {
    Sql {
        ours: format!("({} {op} {})", a.ours, b.ours),
        lite: format!("({} {op} {})", a.lite, b.lite),
    }
}

fn wrap(template: &str, args: &[&Sql]) -> Sql {
    let fill = |f: fn(&Sql) -> &str| {
        let mut out = template.to_owned();
        for (i, a) in args.iter().enumerate() {
            out = out.replace(&format!("${i}"), f(a));
        }
        out
    };
    Sql {
        ours: fill(|a| &a.ours),
        lite: fill(|a| &a.lite),
    }
}

fn leaf(ty: Ty, c: &mut Choices) -> Sql {
    let fields: Vec<&str> = FIELDS
        .iter()
        .filter(|(_, t)| *t == ty)
        .map(|(n, _)| *n)
        .collect();
    match c.pick(4) {
        0 | 1 => field(fields[c.pick(fields.len())]),
        2 => match ty {
            Ty::Int => int_literal(c.int()),
            Ty::Float => float_literal(c.float()),
            Ty::Text => text_literal(&c.text()),
            Ty::Bool => Sql::same(if c.pick(2) == 0 { "TRUE" } else { "FALSE" }),
        },
        _ => Sql::same("NULL"),
    }
}

fn expr(ty: Ty, depth: u32, c: &mut Choices) -> Sql {
    if depth == 0 || c.pick(3) == 0 {
        return leaf(ty, c);
    }
    let d = depth - 1;
    // Alternatives common to every kind.
    match c.pick(10) {
        0 => {
            let (cond, a, b) = (expr(Ty::Bool, d, c), expr(ty, d, c), expr(ty, d, c));
            return wrap("(CASE WHEN $0 THEN $1 ELSE $2 END)", &[&cond, &a, &b]);
        }
        1 => {
            let (a, b) = (expr(ty, d, c), expr(ty, d, c));
            return call("COALESCE", "coalesce", &[a, b]);
        }
        2 if ty != Ty::Bool => {
            let (a, b) = (expr(ty, d, c), expr(ty, d, c));
            return call("NULLIF", "nullif", &[a, b]);
        }
        _ => {}
    }
    match ty {
        Ty::Int => int_expr(d, c),
        Ty::Float => float_expr(d, c),
        Ty::Text => text_expr(d, c),
        Ty::Bool => bool_expr(d, c),
    }
}

fn int_expr(d: u32, c: &mut Choices) -> Sql {
    let int = |c: &mut Choices| expr(Ty::Int, d, c);
    match c.pick(11) {
        0 => {
            let (a, b) = (int(c), int(c));
            infix(&a, ["+", "-", "*"][c.pick(3)], &b)
        }
        1 => {
            let (a, b) = (int(c), int(c));
            infix(&a, ["/", "%"][c.pick(2)], &b)
        }
        2 => wrap("(-$0)", &[&int(c)]),
        3 => call("ABS", "abs", &[int(c)]),
        4 => call("LENGTH", "length", &[expr(Ty::Text, d, c)]),
        5 => wrap("CAST($0 AS INTEGER)", &[&expr(Ty::Float, d, c)]),
        6 => wrap("CAST($0 AS INTEGER)", &[&expr(Ty::Bool, d, c)]),
        7 => {
            let (a, b) = (int(c), int(c));
            Sql {
                ours: format!("MOD({}, {})", a.ours, b.ours),
                lite: format!("({} % {})", a.lite, b.lite),
            }
        }
        8 => {
            let a = int(c);
            let (ours, lite) =
                [("FLOOR", "floor"), ("CEIL", "ceil"), ("ROUND", "round")][c.pick(3)];
            let mut sql = call(ours, lite, std::slice::from_ref(&a));
            // SQLite's round() always answers a double; ours keeps an integer as it is.
            if ours == "ROUND" {
                sql.lite = a.lite;
            }
            sql
        }
        _ => leaf(Ty::Int, c),
    }
}

fn float_expr(d: u32, c: &mut Choices) -> Sql {
    let number = |c: &mut Choices| {
        let ty = if c.pick(3) == 0 { Ty::Int } else { Ty::Float };
        expr(ty, d, c)
    };
    let float = |c: &mut Choices| expr(Ty::Float, d, c);
    match c.pick(11) {
        0 => {
            // At least one side a double, so the result is one.
            let (a, b) = (float(c), number(c));
            let op = ["+", "-", "*", "/"][c.pick(4)];
            if c.pick(2) == 0 {
                infix(&a, op, &b)
            } else {
                infix(&b, op, &a)
            }
        }
        1 => wrap("(-$0)", &[&float(c)]),
        2 => call("ABS", "abs", &[float(c)]),
        3 | 4 => {
            // Ours: ROUND of an integer is that integer; SQLite's is a double.
            let a = float(c);
            let digits = i64::try_from(c.pick(4)).unwrap();
            Sql {
                ours: format!("ROUND({}, {digits})", a.ours),
                lite: format!(
                    "(CASE WHEN typeof({0}) = 'integer' THEN {0} ELSE round({0}, {digits}) END)",
                    a.lite
                ),
            }
        }
        5 => {
            let (ours, lite) = [("FLOOR", "floor"), ("CEIL", "ceil")][c.pick(2)];
            call(ours, lite, &[float(c)])
        }
        6 => call("SQRT", "sqrt", &[call("ABS", "abs", &[float(c)])]),
        7 => {
            let a = float(c);
            let exponent = int_literal(i64::try_from(c.pick(4)).unwrap());
            call("POWER", "pow", &[a, exponent])
        }
        8 => {
            let a = expr(Ty::Int, d, c);
            Sql {
                ours: format!("CAST({} AS DOUBLE)", a.ours),
                lite: format!("CAST({} AS REAL)", a.lite),
            }
        }
        9 => {
            // Ours: integer MOD integer is an integer (SQLite's `%`), else a double (its
            // `mod()`); a "double" field may hold an integer.
            let (a, b) = (float(c), number(c));
            Sql {
                ours: format!("MOD({}, {})", a.ours, b.ours),
                lite: format!(
                    "(CASE WHEN typeof({0}) = 'integer' AND typeof({1}) = 'integer' \
                     THEN ({0} % {1}) ELSE mod({0}, {1}) END)",
                    a.lite, b.lite
                ),
            }
        }
        _ => leaf(Ty::Float, c),
    }
}

fn text_expr(d: u32, c: &mut Choices) -> Sql {
    let text = |c: &mut Choices| expr(Ty::Text, d, c);
    match c.pick(11) {
        0 => {
            let (ours, lite) = [("UPPER", "upper"), ("LOWER", "lower")][c.pick(2)];
            call(ours, lite, &[text(c)])
        }
        1 => {
            let s = text(c);
            let start = int_literal(i64::try_from(c.pick(10)).unwrap() - 4);
            if c.pick(2) == 0 {
                call("SUBSTR", "substr", &[s, start])
            } else {
                let length = int_literal(i64::try_from(c.pick(9)).unwrap() - 3);
                call("SUBSTR", "substr", &[s, start, length])
            }
        }
        2 => {
            let (ours, lite) =
                [("TRIM", "trim"), ("LTRIM", "ltrim"), ("RTRIM", "rtrim")][c.pick(3)];
            let s = text(c);
            if c.pick(2) == 0 {
                call(ours, lite, &[s])
            } else {
                call(ours, lite, &[s, text_literal(&c.text())])
            }
        }
        3 => {
            let s = text(c);
            call(
                "REPLACE",
                "replace",
                &[s, text_literal(&c.text()), text_literal(&c.text())],
            )
        }
        4 => {
            let (a, b) = (text(c), text(c));
            infix(&a, "||", &b)
        }
        5 => {
            let (a, b) = (text(c), text(c));
            call("CONCAT", "concat", &[a, b])
        }
        6 => {
            let a = expr(Ty::Int, d, c);
            Sql {
                ours: format!("CAST({} AS VARCHAR)", a.ours),
                lite: format!("CAST({} AS TEXT)", a.lite),
            }
        }
        _ => leaf(Ty::Text, c),
    }
}

fn bool_expr(d: u32, c: &mut Choices) -> Sql {
    let boolean = |c: &mut Choices| expr(Ty::Bool, d, c);
    // Two operands of comparable kinds.
    let comparable = |c: &mut Choices| -> (Sql, Sql, Ty) {
        match c.pick(5) {
            0 => (expr(Ty::Int, d, c), expr(Ty::Float, d, c), Ty::Float),
            1 => (expr(Ty::Float, d, c), expr(Ty::Float, d, c), Ty::Float),
            2 => (expr(Ty::Text, d, c), expr(Ty::Text, d, c), Ty::Text),
            3 => (expr(Ty::Bool, d, c), expr(Ty::Bool, d, c), Ty::Bool),
            _ => (expr(Ty::Int, d, c), expr(Ty::Int, d, c), Ty::Int),
        }
    };
    match c.pick(11) {
        0 => {
            let (a, b, _) = comparable(c);
            infix(&a, ["=", "<>", "<", "<=", ">", ">="][c.pick(6)], &b)
        }
        1 => {
            let (a, b) = (boolean(c), boolean(c));
            infix(&a, ["AND", "OR"][c.pick(2)], &b)
        }
        2 => wrap("(NOT $0)", &[&boolean(c)]),
        3 => {
            let x = expr(TYPES[c.pick(4)], d, c);
            wrap(["($0 IS NULL)", "($0 IS NOT NULL)"][c.pick(2)], &[&x])
        }
        4 => {
            let (x, first, ty) = comparable(c);
            let mut items = vec![first];
            for _ in 0..c.pick(3) {
                items.push(expr(ty, d, c));
            }
            let not = if c.pick(2) == 0 { "" } else { "NOT " };
            let list = |f: fn(&Sql) -> &str| items.iter().map(f).collect::<Vec<_>>().join(", ");
            Sql {
                ours: format!("({} {not}IN ({}))", x.ours, list(|s| &s.ours)),
                lite: format!("({} {not}IN ({}))", x.lite, list(|s| &s.lite)),
            }
        }
        5 => {
            let (x, low, ty) = comparable(c);
            let high = expr(ty, d, c);
            let not = if c.pick(2) == 0 { "" } else { "NOT " };
            wrap(&format!("($0 {not}BETWEEN $1 AND $2)"), &[&x, &low, &high])
        }
        6 => {
            let s = expr(Ty::Text, d, c);
            let not = if c.pick(2) == 0 { "" } else { "NOT " };
            let mut pattern = c.text();
            if c.pick(3) == 0 {
                if pattern.ends_with('!') {
                    pattern.push('a');
                }
                let p = text_literal(&pattern);
                wrap(&format!("($0 {not}LIKE $1 ESCAPE '!')"), &[&s, &p])
            } else {
                let p = text_literal(&pattern);
                wrap(&format!("($0 {not}LIKE $1)"), &[&s, &p])
            }
        }
        7 => {
            let (a, b, _) = comparable(c);
            if c.pick(2) == 0 {
                Sql {
                    ours: format!("({} IS DISTINCT FROM {})", a.ours, b.ours),
                    lite: format!("({} IS NOT {})", a.lite, b.lite),
                }
            } else {
                Sql {
                    ours: format!("({} IS NOT DISTINCT FROM {})", a.ours, b.ours),
                    lite: format!("({} IS {})", a.lite, b.lite),
                }
            }
        }
        _ => leaf(Ty::Bool, c),
    }
}

#[derive(Debug, Clone)]
struct Case {
    columns: Vec<(Sql, Ty)>,
    filter: Option<Sql>,
    records: Vec<Json>,
}

impl Case {
    fn ours(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, (s, _))| format!("{} AS c{i}", s.ours))
            .collect();
        let filter = self
            .filter
            .as_ref()
            .map(|f| format!(" WHERE {}", f.ours))
            .unwrap_or_default();
        format!("SELECT {} FROM t{filter}", columns.join(", "))
    }

    fn lite(&self) -> String {
        let columns: Vec<String> = self.columns.iter().map(|(s, _)| s.lite.clone()).collect();
        let filter = self
            .filter
            .as_ref()
            .map(|f| format!(" WHERE {}", f.lite))
            .unwrap_or_default();
        format!(
            "SELECT {} FROM (SELECT ?1 AS v){filter}",
            columns.join(", ")
        )
    }
}

fn record(c: &mut Choices) -> Json {
    let mut object = Map::new();
    let value = |ty: Ty, c: &mut Choices| -> Option<Json> {
        match c.pick(7) {
            0 => None,
            1 => Some(Json::Null),
            _ => Some(match ty {
                Ty::Int => json!(c.int()),
                Ty::Float if c.pick(4) == 0 => json!(c.int()),
                Ty::Float => json!(c.float()),
                Ty::Text => json!(c.text()),
                Ty::Bool => json!(c.pick(2) == 0),
            }),
        }
    };
    for (name, ty) in FIELDS.iter().filter(|(n, _)| !n.contains('.')) {
        if let Some(v) = value(*ty, c) {
            object.insert((*name).to_owned(), v);
        }
    }
    match c.pick(6) {
        0 => {}
        1 => {
            object.insert("o".into(), Json::Null);
        }
        2 => {
            object.insert("o".into(), json!("not an object"));
        }
        _ => {
            let mut o = Map::new();
            if let Some(v) = value(Ty::Int, c) {
                o.insert("x".into(), v);
            }
            if let Some(v) = value(Ty::Text, c) {
                o.insert("s".into(), v);
            }
            object.insert("o".into(), Json::Object(o));
        }
    }
    Json::Object(object)
}

fn case(bytes: &[u8]) -> Case {
    let mut c = Choices { bytes, at: 0 };
    let columns = (0..1 + c.pick(3))
        .map(|_| {
            let ty = TYPES[c.pick(4)];
            (expr(ty, 4, &mut c), ty)
        })
        .collect();
    let filter = (c.pick(3) != 0).then(|| expr(Ty::Bool, 4, &mut c));
    let records = (0..20).map(|_| record(&mut c)).collect();
    Case {
        columns,
        filter,
        records,
    }
}

/// Why we may refuse a record that SQLite answers (with NULL, a double or an error).
const ACCEPTED_REFUSALS: [&str; 4] = [
    "division by zero",
    "integer overflow",
    "not a finite number",
    "out of the range of INTEGER",
];

/// SQLite's answer as the JSON our query writes, given the column's kind.
fn lite_json(value: Lite, ty: Ty) -> Result<Json, String> {
    Ok(match (value, ty) {
        (Lite::Null, _) => Json::Null,
        (Lite::Integer(i), Ty::Bool) if i == 0 || i == 1 => json!(i == 1),
        // A "double" field may hold an integer, and so may expressions over it.
        (Lite::Integer(i), Ty::Int | Ty::Float) => json!(i),
        (Lite::Real(f), Ty::Float) => json!(f),
        (Lite::Text(s), Ty::Text) => json!(s),
        (other, ty) => return Err(format!("SQLite answered {other:?} for a {ty:?} column")),
    })
}

/// Our column (raw JSON text) against SQLite's answer. Numbers are read with Rust's exact
/// parser: serde_json's default one may be a unit off in the last place.
fn same_value(ours: &RawValue, lite: &Json) -> bool {
    match lite {
        Json::Number(n) if n.is_f64() => ours.get().parse::<f64>().ok() == n.as_f64(),
        Json::Number(n) => ours.get().parse::<i64>().ok() == n.as_i64(),
        other => serde_json::from_str::<Json>(ours.get()).ok().as_ref() == Some(other),
    }
}

#[derive(Debug, Default)]
struct Tally {
    compared: usize,
    passed_filter: usize,
    refused: usize,
}

fn check(case: &Case, db: &Connection, tally: &mut Tally) -> Result<(), TestCaseError> {
    let sql = case.ours();
    let query = Query::compile(&sql, Some(&["t"]));
    let query = match query {
        Ok(q) => q,
        // A constant part that always fails (1 / 0) is refused when compiling.
        Err(problems) => {
            let accepted = problems
                .iter()
                .all(|p| ACCEPTED_REFUSALS.iter().any(|r| p.message.contains(r)));
            prop_assert!(accepted, "{sql}: {problems:?}");
            tally.refused += case.records.len();
            return Ok(());
        }
    };
    let lite_sql = case.lite();
    let mut statement = db
        .prepare(&lite_sql)
        .map_err(|e| TestCaseError::fail(format!("SQLite refuses {lite_sql}: {e}")))?;
    for record in &case.records {
        let text = record.to_string();
        let input = Record {
            value: Some(text.as_bytes()),
            key: None,
            headers: &[],
        };
        let ours = query.eval(&input, None);
        let lite: Result<Vec<Vec<Lite>>, rusqlite::Error> = statement
            .query_map([&text], |row| {
                (0..case.columns.len())
                    .map(|i| row.get::<_, Lite>(i))
                    .collect()
            })
            .and_then(|rows| rows.collect());
        let context = || format!("\nquery:  {sql}\nsqlite: {lite_sql}\nrecord: {text}");
        match ours {
            Err(e) => {
                prop_assert!(
                    ACCEPTED_REFUSALS.iter().any(|r| e.message.contains(r))
                        || e.message.contains("square root of a negative"),
                    "we refused: {}{}",
                    e.message,
                    context()
                );
                tally.refused += 1;
            }
            Ok(outputs) => {
                let lite = lite.map_err(|e| {
                    TestCaseError::fail(format!(
                        "SQLite failed: {e}; we answered {outputs:?}{}",
                        context()
                    ))
                })?;
                prop_assert_eq!(outputs.len(), lite.len(), "number of outputs{}", context());
                if let (Some(output), Some(row)) = (outputs.first(), lite.into_iter().next()) {
                    let output: HashMap<String, Box<RawValue>> =
                        serde_json::from_slice(output).unwrap();
                    for (i, (value, (_, ty))) in row.into_iter().zip(&case.columns).enumerate() {
                        let expected = lite_json(value, *ty)
                            .map_err(|e| TestCaseError::fail(format!("{e}{}", context())))?;
                        let got = &output[&format!("c{i}")];
                        prop_assert!(
                            same_value(got, &expected),
                            "column c{i}: ours {got}, SQLite {expected}{}",
                            context()
                        );
                    }
                    tally.passed_filter += 1;
                }
                tally.compared += 1;
            }
        }
    }
    Ok(())
}

#[test]
fn sql_steps_agree_with_sqlite() {
    let db = Connection::open_in_memory().unwrap();
    db.execute_batch("PRAGMA case_sensitive_like = ON;")
        .unwrap();
    // PROPTEST_CASES raises the number of queries (each runs over 20 records).
    let mut runner = TestRunner::new(Config {
        cases: Config::default().cases.max(256),
        ..Config::default()
    });
    let tally = std::cell::RefCell::new(Tally::default());
    let result = runner.run(&proptest::collection::vec(any::<u8>(), 0..600), |bytes| {
        check(&case(&bytes), &db, &mut tally.borrow_mut())
    });
    if let Err(failure) = result {
        // The failure's message has the query and record; the shrunk bytes say nothing.
        let message = failure.to_string();
        panic!(
            "{}",
            message
                .split("minimal failing input")
                .next()
                .unwrap_or(&message)
        );
    }
    let tally = tally.into_inner();
    eprintln!("{tally:?}");
    let total = tally.compared + tally.refused;
    // Most records must be compared, and many must pass a filter: a generator that only
    // produces refusals or empty results would test nothing.
    assert!(tally.compared * 10 >= total * 8, "{tally:?}");
    assert!(tally.passed_filter * 4 >= tally.compared, "{tally:?}");
}
