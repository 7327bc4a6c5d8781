//! Stream–table joins (`docs/stateful-sql.md`): `SELECT … FROM orders o [LEFT] JOIN
//! customers c ON o.customer = c._key`. The table is the latest value per key of its topic
//! ([`Table`], fed by [`Join::update_table`]); each stream record is joined to the table as
//! it stands when the record is processed ([`Join::feed`]). Changes to the table emit
//! nothing. Outputs keep the stream record's key and headers, as a stateless step's do.

use std::collections::HashMap;

use crate::expr::Expr;
use crate::json::Object;
use crate::value::{self, Value};
use crate::{Arm, EvalError, Record, parse_joined};

/// A compiled stream–table join.
#[derive(Debug, Clone)]
pub struct Join {
    stream: String,
    table: String,
    left: bool,
    /// The stream's side of `ON … = table._key`.
    on: Expr,
    /// The columns and WHERE, over the joined row.
    arm: Arm,
    pub(crate) paths: Vec<Vec<String>>,
    /// Which of `paths` are the table's.
    pub(crate) table_paths: Vec<bool>,
}

/// The table side of a join: the latest JSON object per key.
#[derive(Debug, Clone, Default)]
pub struct Table {
    rows: HashMap<Vec<u8>, Box<str>>,
    /// What the rows take: keys, values and [`ROW_OVERHEAD`] each.
    bytes: usize,
}

/// What a row takes beyond its key and value: the map's entry and the two allocations'
/// headers, about.
pub const ROW_OVERHEAD: usize = 64;

fn row_bytes(key: &[u8], value: &str) -> usize {
    key.len() + value.len() + ROW_OVERHEAD
}

impl Table {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// About the memory the rows take: what a processor bounds (`--table-max-bytes`).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl Join {
    pub(crate) fn new(stream: String, table: String, left: bool, on: Expr, arm: Arm) -> Join {
        Join {
            stream,
            table,
            left,
            on,
            arm,
            paths: Vec::new(),
            table_paths: Vec::new(),
        }
    }

    /// The input step whose records are joined (one output each, at most).
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The input step read as a table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Takes one record of the table's topic: its value becomes the key's row; a tombstone
    /// deletes it. `Err`: the record cannot be a row (no key, not a JSON object); the table
    /// is unchanged and the record goes to the dead-letter topic.
    pub fn update_table(
        &self,
        table: &mut Table,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<(), EvalError> {
        let Some(key) = key else {
            return Err(EvalError::sql(
                "a record of the table has no key; the table is keyed by it",
            ));
        };
        let Some(value) = value else {
            if let Some(old) = table.rows.remove(key) {
                table.bytes -= row_bytes(key, &old);
            }
            return Ok(());
        };
        let text = std::str::from_utf8(value).map_err(|e| {
            EvalError::new("invalid-json", format!("the record value is not JSON: {e}"))
        })?;
        match Object::parse(text) {
            Ok(Some(_)) => {
                table.bytes += row_bytes(key, text);
                if let Some(old) = table.rows.insert(key.to_vec(), text.into()) {
                    table.bytes -= row_bytes(key, &old);
                }
                Ok(())
            }
            Ok(None) => Err(EvalError::sql(
                "a record of the table is not a JSON object; a table's rows are JSON objects",
            )),
            Err(e) => Err(EvalError::new(
                "invalid-json",
                format!("the record value is not JSON: {e}"),
            )),
        }
    }

    /// The output values for one stream record, joined to `table` as it stands.
    pub fn feed(&self, table: &Table, record: &Record<'_>) -> Result<Vec<Vec<u8>>, EvalError> {
        let alone = parse_joined(record, &self.paths, &self.table_paths, None)?;
        let matched = match self.on.eval(&alone)? {
            Value::Null => None,
            Value::Text(text) => table.rows.get_key_value(text.as_bytes()),
            Value::Int(i) => table
                .rows
                .get_key_value(itoa::Buffer::new().format(i).as_bytes()),
            other => {
                return Err(EvalError::sql(format!(
                    "ON: the stream's side is {}; a table is keyed by strings (or integers \
                     written as such)",
                    other.kind()
                )));
            }
        };
        let parsed = match matched {
            Some((key, text)) => match Object::parse(text) {
                Ok(Some(row)) => Some((key.as_slice(), row)),
                _ => None,
            },
            None => None,
        };
        let row = match &parsed {
            Some((key, object)) => {
                parse_joined(record, &self.paths, &self.table_paths, Some((key, object)))?
            }
            None if self.left => alone,
            None => return Ok(Vec::new()),
        };
        if let Some(filter) = &self.arm.filter {
            let keep = value::truth(&filter.eval(&row)?)
                .map_err(|m| EvalError::sql(format!("WHERE: {m}")))?;
            if keep != Some(true) {
                return Ok(Vec::new());
            }
        }
        let size = record.value.map_or(0, <[u8]>::len);
        Ok(vec![self.arm.output(&row, size)?])
    }
}
