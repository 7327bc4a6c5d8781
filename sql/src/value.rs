//! SQL values of a JSON record and the operators on them.
//!
//! JSON maps onto six kinds: `null` → NULL, `true`/`false` → BOOLEAN, a number written without
//! fraction or exponent that fits 64 bits → INTEGER, any other number → DOUBLE, a string →
//! VARCHAR, an object or array → JSON (kept as written). Operators never convert between
//! kinds implicitly except INTEGER → DOUBLE: anything else that does not fit is a type error,
//! which dead-letters the record instead of silently filtering it.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::value::RawValue;

use crate::EvalError;

#[derive(Debug, Clone)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(Cow<'a, str>),
    /// An object or array, as written in the record.
    Json(Cow<'a, RawValue>),
}

impl<'a> Value<'a> {
    /// The value of one JSON text (already validated by serde_json).
    pub fn from_raw(raw: &'a RawValue) -> Result<Value<'a>, EvalError> {
        let text = raw.get().trim_matches([' ', '\t', '\n', '\r']);
        Ok(match text.as_bytes().first() {
            None | Some(b'n') => Value::Null,
            Some(b't') => Value::Bool(true),
            Some(b'f') => Value::Bool(false),
            Some(b'"') => Value::Text(json_string(text)?),
            Some(b'{' | b'[') => Value::Json(Cow::Borrowed(raw)),
            Some(_) => number(text)?,
        })
    }

    /// The same value, borrowing from this one.
    pub fn reborrow(&self) -> Value<'_> {
        match self {
            Value::Null => Value::Null,
            Value::Bool(b) => Value::Bool(*b),
            Value::Int(i) => Value::Int(*i),
            Value::Float(f) => Value::Float(*f),
            Value::Text(t) => Value::Text(Cow::Borrowed(t)),
            Value::Json(j) => Value::Json(Cow::Borrowed(j)),
        }
    }

    pub fn into_static(self) -> Value<'static> {
        match self {
            Value::Null => Value::Null,
            Value::Bool(b) => Value::Bool(b),
            Value::Int(i) => Value::Int(i),
            Value::Float(f) => Value::Float(f),
            Value::Text(t) => Value::Text(Cow::Owned(t.into_owned())),
            Value::Json(j) => Value::Json(Cow::Owned(j.into_owned())),
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// What the value is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a double",
            Value::Text(_) => "a string",
            Value::Json(j) if j.get().trim_start().starts_with('[') => "a JSON array",
            Value::Json(_) => "a JSON object",
        }
    }

    /// The value as text, as CONCAT, `||` and CAST(… AS VARCHAR) write it: integers in
    /// decimal, doubles as JSON writes them (shortest round-trip form), booleans as
    /// `true`/`false`, JSON without insignificant whitespace. NULL has no text.
    pub fn to_text(&self) -> Option<Cow<'_, str>> {
        Some(match self {
            Value::Null => return None,
            Value::Bool(b) => Cow::Borrowed(if *b { "true" } else { "false" }),
            Value::Int(i) => Cow::Owned(itoa::Buffer::new().format(*i).to_owned()),
            Value::Float(f) => Cow::Owned(format_float(*f)),
            Value::Text(t) => Cow::Borrowed(t),
            Value::Json(j) => Cow::Owned(compact_json(j.get())),
        })
    }
}

/// A JSON string literal's content; borrowed when it has no escapes.
fn json_string(text: &str) -> Result<Cow<'_, str>, EvalError> {
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) if !inner.contains('\\') => Ok(Cow::Borrowed(inner)),
        _ => serde_json::from_str::<String>(text)
            .map(Cow::Owned)
            .map_err(|e| EvalError::new("invalid-json", format!("bad JSON string: {e}"))),
    }
}

fn number(text: &str) -> Result<Value<'static>, EvalError> {
    if !text.contains(['.', 'e', 'E'])
        && let Ok(i) = text.parse::<i64>()
    {
        return Ok(Value::Int(i));
    }
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(Value::Float(f)),
        _ => Err(EvalError::sql(format!(
            "the number {text} is out of the range of a double"
        ))),
    }
}

/// The shortest text that reads back as the same double, as JSON writers print it
/// (`1.0`, `0.1`, `1e20`).
pub fn format_float(f: f64) -> String {
    ryu::Buffer::new().format_finite(f).to_owned()
}

/// JSON text without whitespace outside strings (keys keep their order, numbers their digits).
pub fn compact_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
    }
    out
}

/// The result of a comparison: `None` when either side is NULL.
pub fn compare(a: &Value, b: &Value) -> Result<Option<Ordering>, String> {
    Ok(Some(match (a, b) {
        (Value::Null, _) | (_, Value::Null) => return Ok(None),
        (Value::Int(x), Value::Int(y)) => x.cmp(y),
        // Values are finite (no NaN), and -0.0 equals 0.0.
        (Value::Float(x), Value::Float(y)) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        (Value::Int(x), Value::Float(y)) => compare_int_float(*x, *y),
        (Value::Float(x), Value::Int(y)) => compare_int_float(*y, *x).reverse(),
        (Value::Text(x), Value::Text(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Json(_), Value::Json(_)) => {
            return Err("JSON objects and arrays can only be compared with = and <>".into());
        }
        _ => return Err(format!("cannot compare {} with {}", a.kind(), b.kind())),
    }))
}

/// `a = b`, three-valued: `None` when either side is NULL. JSON values are equal when they
/// hold the same data (key order and spacing do not matter).
pub fn equal(a: &Value, b: &Value) -> Result<Option<bool>, String> {
    if let (Value::Json(x), Value::Json(y)) = (a, b) {
        let parse = |j: &RawValue| serde_json::from_str::<serde_json::Value>(j.get()).ok();
        return Ok(Some(parse(x) == parse(y)));
    }
    Ok(compare(a, b)?.map(Ordering::is_eq))
}

/// Exact, like SQLite: no rounding of the integer to a double first.
fn compare_int_float(i: i64, f: f64) -> Ordering {
    // 2^63 as a double; every i64 is below it and at or above its negation.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f >= TWO_63 {
        return Ordering::Less;
    }
    if f < -TWO_63 {
        return Ordering::Greater;
    }
    let whole = f.trunc();
    // In range, so the conversion is exact.
    #[allow(clippy::cast_possible_truncation)]
    let t = whole as i64;
    match i.cmp(&t) {
        Ordering::Equal => 0.0f64.partial_cmp(&(f - whole)).unwrap_or(Ordering::Equal),
        other => other,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl Arith {
    pub fn symbol(self) -> &'static str {
        match self {
            Arith::Add => "+",
            Arith::Sub => "-",
            Arith::Mul => "*",
            Arith::Div => "/",
            Arith::Rem => "%",
        }
    }
}

/// Arithmetic on numbers. Integers stay integers (`/` truncates toward zero, `%` takes the
/// sign of the dividend) and overflow is an error; a double on either side makes a double.
/// Division by zero and results that are not finite are errors.
pub fn arith(op: Arith, a: &Value, b: &Value) -> Result<Value<'static>, String> {
    let overflow = || "integer overflow".to_owned();
    match (a, b) {
        (Value::Null, _) | (_, Value::Null) => Ok(Value::Null),
        (Value::Int(x), Value::Int(y)) => {
            let (x, y) = (*x, *y);
            let result = match op {
                Arith::Add => x.checked_add(y),
                Arith::Sub => x.checked_sub(y),
                Arith::Mul => x.checked_mul(y),
                Arith::Div | Arith::Rem if y == 0 => return Err("division by zero".into()),
                Arith::Div => x.checked_div(y),
                // i64::MIN % -1 is 0, not an overflow.
                Arith::Rem => Some(x.checked_rem(y).unwrap_or(0)),
            };
            result.map(Value::Int).ok_or_else(overflow)
        }
        (Value::Int(_) | Value::Float(_), Value::Int(_) | Value::Float(_)) => {
            let (x, y) = (as_f64(a), as_f64(b));
            if matches!(op, Arith::Div | Arith::Rem) && y == 0.0 {
                return Err("division by zero".into());
            }
            let result = match op {
                Arith::Add => x + y,
                Arith::Sub => x - y,
                Arith::Mul => x * y,
                Arith::Div => x / y,
                Arith::Rem => x % y,
            };
            finite(result)
        }
        _ => Err(format!(
            "cannot compute {} {} {}",
            a.kind(),
            op.symbol(),
            b.kind()
        )),
    }
}

#[allow(clippy::cast_precision_loss)]
pub fn as_f64(v: &Value) -> f64 {
    match v {
        Value::Int(i) => *i as f64,
        Value::Float(f) => *f,
        _ => f64::NAN,
    }
}

pub fn finite(f: f64) -> Result<Value<'static>, String> {
    if f.is_finite() {
        Ok(Value::Float(f))
    } else {
        Err("the result is not a finite number".into())
    }
}

/// SQL's three-valued truth of a condition: `None` is NULL (unknown).
pub fn truth(v: &Value) -> Result<Option<bool>, String> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        other => Err(format!("expected a boolean, found {}", other.kind())),
    }
}

pub fn from_truth(t: Option<bool>) -> Value<'static> {
    t.map_or(Value::Null, Value::Bool)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn json_kinds_map_onto_sql_kinds() {
        let cases = [
            ("null", "NULL"),
            ("true", "a boolean"),
            ("12", "an integer"),
            ("-0", "an integer"),
            ("12.0", "a double"),
            ("1e3", "a double"),
            ("99999999999999999999", "a double"),
            ("\"a\\nb\"", "a string"),
            ("[1]", "a JSON array"),
            ("{\"a\":1}", "a JSON object"),
        ];
        for (text, kind) in cases {
            let r = raw(text);
            assert_eq!(Value::from_raw(&r).unwrap().kind(), kind, "{text}");
        }
        let r = raw("\"a\\nb\"");
        let Value::Text(t) = Value::from_raw(&r).unwrap() else {
            panic!()
        };
        assert_eq!(t, "a\nb");
        assert!(Value::from_raw(&raw("1e400")).is_err());
    }

    #[test]
    fn integers_and_doubles_compare_exactly() {
        let big = Value::Int(9_007_199_254_740_993); // 2^53 + 1: not a double
        let near = Value::Float(9_007_199_254_740_992.0);
        assert_eq!(compare(&big, &near).unwrap(), Some(Ordering::Greater));
        assert_eq!(
            compare(&Value::Int(3), &Value::Float(3.0)).unwrap(),
            Some(Ordering::Equal)
        );
        assert_eq!(
            compare(&Value::Float(-2.5), &Value::Int(-2)).unwrap(),
            Some(Ordering::Less)
        );
        assert_eq!(
            compare(&Value::Int(i64::MAX), &Value::Float(1e19)).unwrap(),
            Some(Ordering::Less)
        );
        assert_eq!(
            compare(&Value::Float(-0.0), &Value::Float(0.0)).unwrap(),
            Some(Ordering::Equal)
        );
        assert_eq!(compare(&Value::Null, &Value::Int(1)).unwrap(), None);
        assert!(compare(&Value::Int(1), &Value::Text("1".into())).is_err());
    }

    #[test]
    fn arithmetic_keeps_integers_and_refuses_what_has_no_answer() {
        let int = |i| Value::Int(i);
        assert!(matches!(
            arith(Arith::Div, &int(7), &int(-2)),
            Ok(Value::Int(-3))
        ));
        assert!(matches!(
            arith(Arith::Rem, &int(-7), &int(2)),
            Ok(Value::Int(-1))
        ));
        assert!(matches!(
            arith(Arith::Rem, &int(i64::MIN), &int(-1)),
            Ok(Value::Int(0))
        ));
        assert!(arith(Arith::Add, &int(i64::MAX), &int(1)).is_err());
        assert!(arith(Arith::Div, &int(1), &int(0)).is_err());
        assert!(arith(Arith::Div, &Value::Float(1.0), &Value::Float(0.0)).is_err());
        assert!(arith(Arith::Mul, &Value::Float(1e308), &int(10)).is_err());
        assert!(matches!(
            arith(Arith::Add, &int(1), &Value::Float(0.5)),
            Ok(Value::Float(f)) if f == 1.5
        ));
        assert!(matches!(
            arith(Arith::Add, &Value::Null, &int(1)),
            Ok(Value::Null)
        ));
        let err = arith(Arith::Add, &Value::Text("a".into()), &int(1)).unwrap_err();
        assert_eq!(err, "cannot compute a string + an integer");
    }

    #[test]
    fn text_forms() {
        assert_eq!(Value::Float(1.0).to_text().unwrap(), "1.0");
        assert_eq!(Value::Float(1e20).to_text().unwrap(), "1e20");
        assert_eq!(Value::Bool(false).to_text().unwrap(), "false");
        let r = raw("{ \"a b\" : [1, 2] }");
        assert_eq!(
            Value::from_raw(&r).unwrap().to_text().unwrap(),
            "{\"a b\":[1,2]}"
        );
    }
}
