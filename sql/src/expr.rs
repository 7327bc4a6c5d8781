//! Compiled expressions and their evaluation over one record, with SQL's three-valued logic:
//! NULL is "unknown", `NULL AND FALSE` is FALSE, `NULL OR TRUE` is TRUE, anything else with a
//! NULL is NULL, and `WHERE` keeps a row only when its condition is TRUE.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::value::RawValue;

use crate::EvalError;
use crate::func::{self, Func, SqlType};
use crate::json::{Object, write_string};
use crate::value::{self, Arith, Value, compare, equal, from_truth, truth};

/// The SQL text of an expression, to say which one failed.
pub type Snippet = Box<str>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

impl CmpOp {
    fn holds(self, ordering: Ordering) -> bool {
        match self {
            CmpOp::Eq => ordering.is_eq(),
            CmpOp::NotEq => ordering.is_ne(),
            CmpOp::Lt => ordering.is_lt(),
            CmpOp::LtEq => ordering.is_le(),
            CmpOp::Gt => ordering.is_gt(),
            CmpOp::GtEq => ordering.is_ge(),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Expr {
    Literal(Value<'static>),
    /// A field (or nested field) of the record value: an index into [`Row::values`].
    Field(usize),
    /// The record key as text.
    Key,
    /// One header's value as text.
    Header(String),
    /// All headers as a JSON object.
    Headers,
    /// The record's Kafka timestamp, ms since the epoch (`_timestamp`; stateful queries).
    Timestamp,
    /// The key of the table row a join matched, as text (NULL without a match).
    TableKey,
    /// A value a stateful query computed for a group: a grouping value, a window bound or
    /// an aggregate ([`Row::slots`]).
    Slot(usize),
    Neg(Box<Expr>, Snippet),
    Arith(Arith, Box<Expr>, Box<Expr>, Snippet),
    /// `a || b`: NULL if either is NULL.
    Concat(Box<Expr>, Box<Expr>, Snippet),
    Compare(CmpOp, Box<Expr>, Box<Expr>, Snippet),
    /// `a IS [NOT] DISTINCT FROM b`: equality where NULL equals NULL; never NULL.
    Distinct {
        left: Box<Expr>,
        right: Box<Expr>,
        negated: bool,
        snippet: Snippet,
    },
    And(Box<Expr>, Box<Expr>, Snippet),
    Or(Box<Expr>, Box<Expr>, Snippet),
    Not(Box<Expr>, Snippet),
    IsNull(Box<Expr>, bool),
    /// `x IS [NOT] TRUE | FALSE | UNKNOWN`; `value` None is UNKNOWN.
    Is {
        expr: Box<Expr>,
        value: Option<bool>,
        negated: bool,
        snippet: Snippet,
    },
    In {
        expr: Box<Expr>,
        list: Vec<Expr>,
        negated: bool,
        snippet: Snippet,
    },
    Between {
        expr: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
        negated: bool,
        snippet: Snippet,
    },
    Like {
        expr: Box<Expr>,
        pattern: Box<Expr>,
        escape: Option<Box<Expr>>,
        negated: bool,
        case_insensitive: bool,
        snippet: Snippet,
    },
    Case {
        operand: Option<Box<Expr>>,
        whens: Vec<(Expr, Expr)>,
        otherwise: Option<Box<Expr>>,
        snippet: Snippet,
    },
    Cast {
        expr: Box<Expr>,
        to: SqlType,
        /// TRY_CAST: NULL instead of an error.
        try_cast: bool,
        snippet: Snippet,
    },
    /// COALESCE: the first argument that is not NULL; the rest are not evaluated.
    Coalesce(Vec<Expr>),
    Call {
        func: Func,
        args: Vec<Expr>,
        snippet: Snippet,
    },
}

/// One record as the expressions of a query see it.
#[derive(Debug)]
pub struct Row<'a> {
    pub object: Object<'a>,
    /// The raw JSON at each field path the query uses (`None`: missing).
    pub raw: Vec<Option<&'a RawValue>>,
    /// The same, as values (missing is NULL).
    pub values: Vec<Value<'a>>,
    pub key: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
    pub timestamp: Option<i64>,
    /// A group's values, for the columns of a stateful query's output.
    pub slots: &'a [Value<'static>],
    /// The key of the table row a join matched.
    pub table_key: Option<&'a [u8]>,
}

impl Row<'static> {
    /// No fields, key or headers: what constant expressions are evaluated against.
    pub fn empty() -> Self {
        Row::of_slots(&[])
    }
}

impl<'a> Row<'a> {
    /// A group's output row: no record, only the group's `slots`.
    pub fn of_slots(slots: &'a [Value<'static>]) -> Self {
        Row {
            object: Object::default(),
            raw: Vec::new(),
            values: Vec::new(),
            key: None,
            headers: &[],
            timestamp: None,
            slots,
            table_key: None,
        }
    }
}

fn fail(snippet: &str, message: impl std::fmt::Display) -> EvalError {
    EvalError::sql(format!("`{snippet}`: {message}"))
}

fn text_of_bytes<'a>(bytes: &'a [u8], what: &str) -> Result<Value<'a>, EvalError> {
    std::str::from_utf8(bytes)
        .map(|s| Value::Text(Cow::Borrowed(s)))
        .map_err(|_| EvalError::sql(format!("{what} is not UTF-8 text")))
}

impl Expr {
    pub fn eval<'r>(&'r self, row: &'r Row<'r>) -> Result<Value<'r>, EvalError> {
        Ok(match self {
            Expr::Literal(v) => v.reborrow(),
            Expr::Field(i) => row.values.get(*i).map_or(Value::Null, Value::reborrow),
            Expr::Key => match row.key {
                Some(key) => text_of_bytes(key, "the record key")?,
                None => Value::Null,
            },
            Expr::Header(name) => match row.headers.iter().rev().find(|(n, _)| n == name) {
                Some((_, Some(bytes))) => text_of_bytes(bytes, &format!("header `{name}`"))?,
                _ => Value::Null,
            },
            Expr::Headers => headers_json(row.headers)?,
            Expr::Timestamp => row.timestamp.map_or(Value::Null, Value::Int),
            Expr::TableKey => match row.table_key {
                Some(key) => text_of_bytes(key, "the table row's key")?,
                None => Value::Null,
            },
            Expr::Slot(i) => row.slots.get(*i).map_or(Value::Null, Value::reborrow),
            Expr::Neg(e, snippet) => match e.eval(row)? {
                Value::Null => Value::Null,
                Value::Int(i) => Value::Int(
                    i.checked_neg()
                        .ok_or_else(|| fail(snippet, "integer overflow"))?,
                ),
                Value::Float(f) => Value::Float(-f),
                other => return Err(fail(snippet, format!("cannot negate {}", other.kind()))),
            },
            Expr::Arith(op, a, b, snippet) => {
                let (a, b) = (a.eval(row)?, b.eval(row)?);
                value::arith(*op, &a, &b).map_err(|m| fail(snippet, m))?
            }
            Expr::Concat(a, b, snippet) => {
                let (a, b) = (a.eval(row)?, b.eval(row)?);
                match (a.to_text(), b.to_text()) {
                    (Some(a), Some(b)) => {
                        func::check_length(a.len() + b.len()).map_err(|m| fail(snippet, m))?;
                        Value::Text(Cow::Owned(a.into_owned() + &b))
                    }
                    _ => Value::Null,
                }
            }
            Expr::Compare(op, a, b, snippet) => {
                let (a, b) = (a.eval(row)?, b.eval(row)?);
                let result = if matches!(op, CmpOp::Eq | CmpOp::NotEq) {
                    equal(&a, &b)
                        .map(|eq| eq.map(|eq| eq == (*op == CmpOp::Eq)))
                        .map_err(|m| fail(snippet, m))?
                } else {
                    compare(&a, &b)
                        .map_err(|m| fail(snippet, m))?
                        .map(|o| op.holds(o))
                };
                from_truth(result)
            }
            Expr::Distinct {
                left,
                right,
                negated,
                snippet,
            } => {
                let (a, b) = (left.eval(row)?, right.eval(row)?);
                let same = match (a.is_null(), b.is_null()) {
                    (true, true) => true,
                    (true, false) | (false, true) => false,
                    (false, false) => equal(&a, &b)
                        .map_err(|m| fail(snippet, m))?
                        .unwrap_or(false),
                };
                // IS DISTINCT FROM is true when they differ; IS NOT DISTINCT FROM when alike.
                Value::Bool(same == *negated)
            }
            Expr::And(a, b, snippet) => {
                let left = truth(&a.eval(row)?).map_err(|m| fail(snippet, m))?;
                if left == Some(false) {
                    return Ok(Value::Bool(false));
                }
                let right = truth(&b.eval(row)?).map_err(|m| fail(snippet, m))?;
                from_truth(match (left, right) {
                    (_, Some(false)) => Some(false),
                    (Some(true), Some(true)) => Some(true),
                    _ => None,
                })
            }
            Expr::Or(a, b, snippet) => {
                let left = truth(&a.eval(row)?).map_err(|m| fail(snippet, m))?;
                if left == Some(true) {
                    return Ok(Value::Bool(true));
                }
                let right = truth(&b.eval(row)?).map_err(|m| fail(snippet, m))?;
                from_truth(match (left, right) {
                    (_, Some(true)) => Some(true),
                    (Some(false), Some(false)) => Some(false),
                    _ => None,
                })
            }
            Expr::Not(e, snippet) => from_truth(
                truth(&e.eval(row)?)
                    .map_err(|m| fail(snippet, m))?
                    .map(|b| !b),
            ),
            Expr::IsNull(e, negated) => Value::Bool(e.eval(row)?.is_null() != *negated),
            Expr::Is {
                expr,
                value,
                negated,
                snippet,
            } => {
                let t = truth(&expr.eval(row)?).map_err(|m| fail(snippet, m))?;
                Value::Bool((t == *value) != *negated)
            }
            Expr::In {
                expr,
                list,
                negated,
                snippet,
            } => {
                let needle = expr.eval(row)?;
                let mut found = Some(false);
                for item in list {
                    match equal(&needle, &item.eval(row)?).map_err(|m| fail(snippet, m))? {
                        Some(true) => {
                            found = Some(true);
                            break;
                        }
                        Some(false) => {}
                        None => found = None,
                    }
                }
                from_truth(found.map(|f| f != *negated))
            }
            Expr::Between {
                expr,
                low,
                high,
                negated,
                snippet,
            } => {
                let x = expr.eval(row)?;
                let (low, high) = (low.eval(row)?, high.eval(row)?);
                let cmp = |bound: &Value, want: fn(Ordering) -> bool| {
                    compare(&x, bound)
                        .map(|o| o.map(want))
                        .map_err(|m| fail(snippet, m))
                };
                let above = cmp(&low, Ordering::is_ge)?;
                let below = cmp(&high, Ordering::is_le)?;
                let inside = match (above, below) {
                    (Some(false), _) | (_, Some(false)) => Some(false),
                    (Some(true), Some(true)) => Some(true),
                    _ => None,
                };
                from_truth(inside.map(|i| i != *negated))
            }
            Expr::Like {
                expr,
                pattern,
                escape,
                negated,
                case_insensitive,
                snippet,
            } => {
                let text = expr.eval(row)?;
                let pattern = pattern.eval(row)?;
                let escape = match escape {
                    Some(e) => Some(e.eval(row)?),
                    None => None,
                };
                func::like(&text, &pattern, escape.as_ref(), *case_insensitive)
                    .map_err(|m| fail(snippet, m))?
                    .map_or(Value::Null, |m| Value::Bool(m != *negated))
            }
            Expr::Case {
                operand,
                whens,
                otherwise,
                snippet,
            } => {
                let operand = match operand {
                    Some(o) => Some(o.eval(row)?),
                    None => None,
                };
                for (when, then) in whens {
                    let w = when.eval(row)?;
                    let taken = match &operand {
                        Some(o) => equal(o, &w).map_err(|m| fail(snippet, m))?,
                        None => truth(&w).map_err(|m| fail(snippet, m))?,
                    };
                    if taken == Some(true) {
                        return then.eval(row);
                    }
                }
                match otherwise {
                    Some(e) => e.eval(row)?,
                    None => Value::Null,
                }
            }
            Expr::Cast {
                expr,
                to,
                try_cast,
                snippet,
            } => {
                let v = expr.eval(row)?;
                match func::cast(v, *to) {
                    Ok(v) => v,
                    Err(_) if *try_cast => Value::Null,
                    Err(m) => return Err(fail(snippet, m)),
                }
            }
            Expr::Coalesce(args) => {
                for arg in args {
                    let v = arg.eval(row)?;
                    if !v.is_null() {
                        return Ok(v);
                    }
                }
                Value::Null
            }
            Expr::Call {
                func,
                args,
                snippet,
            } => {
                let mut values = Vec::with_capacity(args.len());
                for arg in args {
                    values.push(arg.eval(row)?);
                }
                func::call(*func, values).map_err(|m| fail(snippet, m))?
            }
        })
    }

    /// Whether the expression reads nothing of the record (so it can be evaluated once).
    pub fn is_literal(&self) -> bool {
        matches!(self, Expr::Literal(_))
    }
}

fn headers_json<'a>(headers: &[(&str, Option<&[u8]>)]) -> Result<Value<'a>, EvalError> {
    let mut out = Vec::from(&b"{"[..]);
    for (i, (name, value)) in headers.iter().enumerate() {
        // The last of repeated names wins, as for `_headers.name`.
        if headers[i + 1..].iter().any(|(later, _)| later == name) {
            continue;
        }
        if out.len() > 1 {
            out.push(b',');
        }
        write_string(&mut out, name);
        out.push(b':');
        match value {
            None => out.extend_from_slice(b"null"),
            Some(bytes) => {
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| EvalError::sql(format!("header `{name}` is not UTF-8 text")))?;
                write_string(&mut out, text);
            }
        }
    }
    out.push(b'}');
    // Written by a JSON writer just now, so always valid.
    let text = String::from_utf8(out).unwrap_or_default();
    RawValue::from_string(text)
        .map(|raw| Value::Json(Cow::Owned(raw)))
        .map_err(|e| EvalError::new("internal", e.to_string()))
}
