//! The SQL of Plumber's `sql:` steps (SPEC §8): a stateless
//! `SELECT … FROM <input step> [WHERE …]` over each record's JSON value, with `_key` and
//! `_headers` for the record's key and headers; one output object per record that passes
//! `WHERE`; NULL as SQL has it.
//!
//! [`Query::compile`] parses with sqlparser and refuses, with a line and column in the
//! query, whatever needs more than one record (GROUP BY, aggregates, JOIN, ORDER BY, LIMIT,
//! DISTINCT, window functions, subqueries); `plumber validate` and `plumber-processor` both
//! call it, so a query that validates is a query that runs. [`Query::eval`] is a pure
//! function of one record. The dialect, the mapping of JSON onto SQL types and every
//! difference from SQLite are documented in `processor/README.md`.
//!
//! Stateful queries (`docs/stateful-sql.md`) compile through their own entry points and run
//! over state the caller keeps: [`Aggregation`] (`GROUP BY _key` with aggregates and
//! windows, fed one partition's records in order, its state a [`PartitionState`] that
//! changelog entries rebuild) and [`Join`] (a stream joined to a [`Table`] by key).

mod aggregate;
mod compile;
mod expr;
mod func;
mod join;
mod json;
mod value;

pub use aggregate::{Aggregation, CarryOver, Change, Emit, Output, PartitionState};
pub use compile::{Compiled, MAX_DEPTH, MAX_HOPS, MAX_TOKENS, Problem, compile_any};
pub use join::{Join, ROW_OVERHEAD, Table};

use expr::{Expr, Row};
use json::{Object, write_string};
use value::Value;

/// Why one record has no result: it goes to the dead-letter topic with this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EvalError {
    /// `invalid-json` (the value is not JSON) or `sql-error` (anything else).
    pub kind: &'static str,
    pub message: String,
}

impl EvalError {
    fn new(kind: &'static str, message: impl Into<String>) -> Self {
        EvalError {
            kind,
            message: message.into(),
        }
    }

    fn sql(message: impl Into<String>) -> Self {
        EvalError::new("sql-error", message)
    }
}

/// One record as a query reads it.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// `None`: a tombstone.
    pub value: Option<&'a [u8]>,
    pub key: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
}

/// A compiled query: one `Arm` per SELECT of a `UNION ALL`.
#[derive(Debug, Clone)]
pub struct Query {
    arms: Vec<Arm>,
    /// Every field path the query reads, resolved once per record.
    paths: Vec<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Arm {
    /// The input step of its FROM.
    from: String,
    columns: Vec<Column>,
    filter: Option<Expr>,
    /// The names of its explicit columns: `*` leaves these fields out.
    named: Vec<String>,
}

#[derive(Debug, Clone)]
enum Column {
    /// Every field of the value that no explicit column names, as written.
    Star,
    Value {
        /// The column's name as a JSON key, with its colon.
        key: Vec<u8>,
        expr: Expr,
        /// A plain field: copied as written instead of converted and written again.
        passthrough: Option<usize>,
    },
}

impl Query {
    /// Compiles `sql`. With `inputs` (the step's input step names), every FROM must name one
    /// of them and every input must be read by some SELECT of the query. All problems are
    /// returned, sorted by position.
    pub fn compile(sql: &str, inputs: Option<&[&str]>) -> Result<Query, Vec<Problem>> {
        compile::compile(sql, inputs)
    }

    /// The input steps the query's SELECTs read, in order, each once.
    pub fn inputs(&self) -> Vec<&str> {
        let mut inputs: Vec<&str> = Vec::new();
        for arm in &self.arms {
            if !inputs.contains(&arm.from.as_str()) {
                inputs.push(&arm.from);
            }
        }
        inputs
    }

    /// The output values (JSON objects) for one record. With `from`, only the SELECTs that
    /// read that input step run; without, all of them.
    pub fn eval(&self, record: &Record<'_>, from: Option<&str>) -> Result<Vec<Vec<u8>>, EvalError> {
        let row = parse_row(record, &self.paths)?;
        let size = record.value.map_or(0, <[u8]>::len);
        let mut outputs = Vec::new();
        for arm in &self.arms {
            if from.is_some_and(|from| from != arm.from) {
                continue;
            }
            if let Some(filter) = &arm.filter {
                let keep = value::truth(&filter.eval(&row)?)
                    .map_err(|m| EvalError::sql(format!("WHERE: {m}")))?;
                if keep != Some(true) {
                    continue;
                }
            }
            outputs.push(arm.output(&row, size)?);
        }
        Ok(outputs)
    }
}

/// The record as a query's expressions read it: its value parsed, the fields at `paths`
/// looked up once.
fn parse_row<'a>(record: &Record<'a>, paths: &[Vec<String>]) -> Result<Row<'a>, EvalError> {
    parse_joined(record, paths, &[], None)
}

/// [`parse_row`] of a join: the paths marked in `table_paths` are read from the matched
/// table row (`table`: its key and value), NULL without one.
fn parse_joined<'a>(
    record: &Record<'a>,
    paths: &[Vec<String>],
    table_paths: &[bool],
    table: Option<(&'a [u8], &Object<'a>)>,
) -> Result<Row<'a>, EvalError> {
    let Some(bytes) = record.value else {
        return Err(EvalError::sql(
            "the record has no value (a tombstone); a SQL step reads JSON objects",
        ));
    };
    let text = std::str::from_utf8(bytes).map_err(|e| {
        EvalError::new("invalid-json", format!("the record value is not JSON: {e}"))
    })?;
    let object = match Object::parse(text) {
        Ok(Some(object)) => object,
        Ok(None) => {
            return Err(EvalError::sql(
                "the record value is not a JSON object; a SQL step reads JSON objects",
            ));
        }
        Err(e) => {
            return Err(EvalError::new(
                "invalid-json",
                format!("the record value is not JSON: {e}"),
            ));
        }
    };
    let mut raw = Vec::with_capacity(paths.len());
    let mut values = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        let from_table = table_paths.get(i).copied().unwrap_or(false);
        let found = match (from_table, table) {
            (false, _) => path
                .split_first()
                .and_then(|(first, rest)| json::lookup(object.get(first)?, rest)),
            (true, Some((_, row))) => path
                .split_first()
                .and_then(|(first, rest)| json::lookup(row.get(first)?, rest)),
            (true, None) => None,
        };
        values.push(match found {
            Some(r) => Value::from_raw(r)?,
            None => Value::Null,
        });
        raw.push(found);
    }
    Ok(Row {
        object,
        raw,
        values,
        key: record.key,
        headers: record.headers,
        timestamp: None,
        slots: &[],
        table_key: table.map(|(key, _)| key),
    })
}

impl Arm {
    fn output(&self, row: &Row<'_>, capacity: usize) -> Result<Vec<u8>, EvalError> {
        let mut out = Vec::with_capacity(capacity);
        out.push(b'{');
        let mut first = true;
        let mut separate = |out: &mut Vec<u8>| {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
        };
        for column in &self.columns {
            match column {
                Column::Star => {
                    for (name, value) in &row.object.fields {
                        if self.named.iter().any(|n| n == name) {
                            continue;
                        }
                        separate(&mut out);
                        write_string(&mut out, name);
                        out.push(b':');
                        out.extend_from_slice(value.get().as_bytes());
                    }
                }
                Column::Value {
                    key,
                    expr,
                    passthrough,
                } => {
                    separate(&mut out);
                    out.extend_from_slice(key);
                    match passthrough {
                        Some(i) => match row.raw.get(*i).copied().flatten() {
                            Some(raw) => out.extend_from_slice(raw.get().as_bytes()),
                            None => out.extend_from_slice(b"null"),
                        },
                        None => write_value(&mut out, &expr.eval(row)?)?,
                    }
                }
            }
        }
        out.push(b'}');
        Ok(out)
    }
}

pub(crate) fn write_value(out: &mut Vec<u8>, value: &Value<'_>) -> Result<(), EvalError> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Int(i) => out.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes()),
        Value::Float(f) if f.is_finite() => {
            out.extend_from_slice(ryu::Buffer::new().format_finite(*f).as_bytes());
        }
        Value::Float(_) => return Err(EvalError::sql("a result is not a finite number")),
        Value::Text(t) => write_string(out, t),
        Value::Json(j) => out.extend_from_slice(j.get().as_bytes()),
    }
    Ok(())
}
