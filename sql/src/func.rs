//! Scalar functions, CAST and LIKE. Every function returns NULL when an argument is NULL
//! (CONCAT skips NULLs instead), and refuses arguments of the wrong kind.

use std::borrow::Cow;

use crate::value::{self, Arith, Value, finite, format_float};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Upper,
    Lower,
    Length,
    Substr,
    Trim(Side),
    Concat,
    Replace,
    Abs,
    Round,
    Floor,
    Ceil,
    Sqrt,
    Power,
    Mod,
    NullIf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Both,
    Leading,
    Trailing,
}

impl Func {
    /// The function a name calls (case-insensitive), and how many arguments it takes.
    pub fn by_name(name: &str) -> Option<(Func, usize, usize)> {
        Some(match name.to_ascii_uppercase().as_str() {
            "UPPER" | "UCASE" => (Func::Upper, 1, 1),
            "LOWER" | "LCASE" => (Func::Lower, 1, 1),
            "LENGTH" | "CHAR_LENGTH" | "CHARACTER_LENGTH" => (Func::Length, 1, 1),
            "SUBSTR" | "SUBSTRING" => (Func::Substr, 2, 3),
            "TRIM" | "BTRIM" => (Func::Trim(Side::Both), 1, 2),
            "LTRIM" => (Func::Trim(Side::Leading), 1, 2),
            "RTRIM" => (Func::Trim(Side::Trailing), 1, 2),
            "CONCAT" => (Func::Concat, 1, usize::MAX),
            "REPLACE" => (Func::Replace, 3, 3),
            "ABS" => (Func::Abs, 1, 1),
            "ROUND" => (Func::Round, 1, 2),
            "FLOOR" => (Func::Floor, 1, 1),
            "CEIL" | "CEILING" => (Func::Ceil, 1, 1),
            "SQRT" => (Func::Sqrt, 1, 1),
            "POWER" | "POW" => (Func::Power, 2, 2),
            "MOD" => (Func::Mod, 2, 2),
            "NULLIF" => (Func::NullIf, 2, 2),
            _ => return None,
        })
    }
}

/// The names [`Func::by_name`] knows, plus the special forms, for "unknown function" messages.
pub const SUPPORTED: &str = "UPPER, LOWER, LENGTH, SUBSTR/SUBSTRING, TRIM, LTRIM, RTRIM, \
     CONCAT, REPLACE, ABS, ROUND, FLOOR, CEIL, SQRT, POWER, MOD, COALESCE, NULLIF";

/// Aggregate and window functions, refused by name: they need many records at once.
pub fn is_aggregate(name: &str) -> bool {
    matches!(
        name.to_ascii_uppercase().as_str(),
        "COUNT"
            | "SUM"
            | "AVG"
            | "MIN"
            | "MAX"
            | "ARRAY_AGG"
            | "STRING_AGG"
            | "GROUP_CONCAT"
            | "LISTAGG"
            | "STDDEV"
            | "STDDEV_POP"
            | "STDDEV_SAMP"
            | "VARIANCE"
            | "VAR_POP"
            | "VAR_SAMP"
            | "BOOL_AND"
            | "BOOL_OR"
            | "EVERY"
            | "ANY_VALUE"
            | "FIRST_VALUE"
            | "LAST_VALUE"
            | "ROW_NUMBER"
            | "RANK"
            | "DENSE_RANK"
            | "LAG"
            | "LEAD"
            | "NTILE"
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlType {
    Integer,
    Double,
    Varchar,
    Boolean,
}

impl SqlType {
    pub fn name(self) -> &'static str {
        match self {
            SqlType::Integer => "INTEGER",
            SqlType::Double => "DOUBLE",
            SqlType::Varchar => "VARCHAR",
            SqlType::Boolean => "BOOLEAN",
        }
    }
}

/// Strings a query builds are limited to this many bytes: nested REPLACE or `||` multiply
/// lengths, and one record must not exhaust the processor's memory.
pub const MAX_TEXT_BYTES: usize = 16 * 1024 * 1024;

pub fn check_length(bytes: usize) -> Result<(), String> {
    if bytes > MAX_TEXT_BYTES {
        Err(format!(
            "the result would be longer than {} MiB",
            MAX_TEXT_BYTES / (1024 * 1024)
        ))
    } else {
        Ok(())
    }
}

fn text_arg<'v>(v: &'v Value, what: &str) -> Result<&'v str, String> {
    match v {
        Value::Text(t) => Ok(t),
        other => Err(format!("{what} must be a string, found {}", other.kind())),
    }
}

fn int_arg(v: &Value, what: &str) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(format!("{what} must be an integer, found {}", other.kind())),
    }
}

fn number_arg(v: &Value, what: &str) -> Result<(), String> {
    match v {
        Value::Int(_) | Value::Float(_) => Ok(()),
        other => Err(format!("{what} must be a number, found {}", other.kind())),
    }
}

pub fn call(func: Func, args: Vec<Value<'_>>) -> Result<Value<'_>, String> {
    if func == Func::Concat {
        let mut out = String::new();
        for arg in &args {
            if let Some(text) = arg.to_text() {
                check_length(out.len() + text.len())?;
                out.push_str(&text);
            }
        }
        return Ok(Value::Text(Cow::Owned(out)));
    }
    if func == Func::NullIf {
        let mut args = args.into_iter();
        let (a, b) = (
            args.next().unwrap_or(Value::Null),
            args.next().unwrap_or(Value::Null),
        );
        return Ok(match value::equal(&a, &b)? {
            Some(true) => Value::Null,
            _ => a,
        });
    }
    if args.iter().any(Value::is_null) {
        return Ok(Value::Null);
    }
    let arg = |i: usize| args.get(i).unwrap_or(&Value::Null);
    Ok(match func {
        Func::Upper => Value::Text(Cow::Owned(text_arg(arg(0), "the argument")?.to_uppercase())),
        Func::Lower => Value::Text(Cow::Owned(text_arg(arg(0), "the argument")?.to_lowercase())),
        Func::Length => Value::Int(
            i64::try_from(text_arg(arg(0), "the argument")?.chars().count()).unwrap_or(i64::MAX),
        ),
        Func::Substr => {
            let text = text_arg(arg(0), "the string")?;
            let start = int_arg(arg(1), "the start")?;
            let length = match args.get(2) {
                Some(v) => Some(int_arg(v, "the length")?),
                None => None,
            };
            Value::Text(Cow::Owned(substr(text, start, length)))
        }
        Func::Trim(side) => {
            let text = text_arg(arg(0), "the string")?;
            let chars = match args.get(1) {
                Some(v) => text_arg(v, "the characters to trim")?,
                None => " ",
            };
            let is_trimmed = |c: char| chars.contains(c);
            Value::Text(Cow::Owned(
                match side {
                    Side::Both => text.trim_matches(is_trimmed),
                    Side::Leading => text.trim_start_matches(is_trimmed),
                    Side::Trailing => text.trim_end_matches(is_trimmed),
                }
                .to_owned(),
            ))
        }
        Func::Replace => {
            let text = text_arg(arg(0), "the string")?;
            let from = text_arg(arg(1), "the text to replace")?;
            let to = text_arg(arg(2), "the replacement")?;
            if from.is_empty() {
                Value::Text(Cow::Owned(text.to_owned()))
            } else {
                let grows = to.len().saturating_sub(from.len());
                check_length(text.len() + text.matches(from).count().saturating_mul(grows))?;
                Value::Text(Cow::Owned(text.replace(from, to)))
            }
        }
        Func::Abs => match arg(0) {
            Value::Int(i) => Value::Int(i.checked_abs().ok_or("integer overflow")?),
            Value::Float(f) => Value::Float(f.abs()),
            other => return Err(format!("ABS needs a number, found {}", other.kind())),
        },
        Func::Round => {
            let digits = match args.get(1) {
                Some(v) => int_arg(v, "the number of digits")?,
                None => 0,
            };
            match arg(0) {
                Value::Int(i) => Value::Int(round_int(*i, digits)?),
                Value::Float(f) => Value::Float(round_float(*f, digits)),
                other => return Err(format!("ROUND needs a number, found {}", other.kind())),
            }
        }
        Func::Floor | Func::Ceil => match arg(0) {
            Value::Int(i) => Value::Int(*i),
            Value::Float(f) => Value::Float(if func == Func::Floor {
                f.floor()
            } else {
                f.ceil()
            }),
            other => return Err(format!("needs a number, found {}", other.kind())),
        },
        Func::Sqrt => {
            number_arg(arg(0), "the argument")?;
            let x = value::as_f64(arg(0));
            if x < 0.0 {
                return Err("the square root of a negative number".into());
            }
            Value::Float(x.sqrt())
        }
        Func::Power => {
            number_arg(arg(0), "the base")?;
            number_arg(arg(1), "the exponent")?;
            finite(value::as_f64(arg(0)).powf(value::as_f64(arg(1))))?
        }
        Func::Mod => value::arith(Arith::Rem, arg(0), arg(1))?,
        Func::Concat | Func::NullIf => Value::Null,
    })
}

/// SQLite's `substr`: 1-based; a negative start counts from the end; a negative length takes
/// the characters before the start.
fn substr(text: &str, start: i64, length: Option<i64>) -> String {
    let len = i64::try_from(text.chars().count()).unwrap_or(i64::MAX);
    let mut p1 = start;
    let (mut p2, negative) = match length {
        Some(l) if l < 0 => (l.saturating_neg(), true),
        Some(l) => (l, false),
        // SQLite takes "everything": its length limit, far past any string.
        None => (i64::MAX, false),
    };
    if p1 < 0 {
        p1 = p1.saturating_add(len);
        if p1 < 0 {
            p2 = p2.saturating_add(p1).max(0);
            p1 = 0;
        }
    } else if p1 > 0 {
        p1 -= 1;
    } else if p2 > 0 {
        p2 -= 1;
    }
    if negative {
        p1 -= p2;
        if p1 < 0 {
            p2 += p1;
            p1 = 0;
        }
    }
    let skip = usize::try_from(p1).unwrap_or(usize::MAX);
    let take = usize::try_from(p2.max(0)).unwrap_or(usize::MAX);
    text.chars().skip(skip).take(take).collect()
}

/// Rounds half away from zero at `digits` decimals (negative: tens, hundreds, …).
fn round_int(i: i64, digits: i64) -> Result<i64, String> {
    if digits >= 0 {
        return Ok(i);
    }
    let Some(unit) = u32::try_from(-digits)
        .ok()
        .and_then(|d| 10i64.checked_pow(d))
    else {
        return Ok(0);
    };
    let rest = i % unit;
    let down = i - rest;
    let result = if rest.unsigned_abs() * 2 >= unit.unsigned_abs() {
        down.checked_add(if i < 0 { -unit } else { unit })
    } else {
        Some(down)
    };
    result.ok_or_else(|| "integer overflow".into())
}

/// Rounds half away from zero at `digits` decimals of the double's exact value, as SQLite
/// (and Python) do: ROUND(2.675, 2) is 2.67, because the double nearest 2.675 lies a little
/// below it; ROUND(0.125, 2) is 0.13, a true tie.
fn round_float(f: f64, digits: i64) -> f64 {
    if f.abs() >= 4_503_599_627_370_496.0 && digits >= 0 {
        // 2^52 and above: no fraction to round.
        return f;
    }
    // Every double's exact decimal expansion has at most 1074 fractional digits.
    let exact = format!("{:.1074}", f.abs());
    let (whole, fraction) = exact.split_once('.').unwrap_or((&exact, ""));
    let mut all: Vec<u8> = whole.bytes().chain(fraction.bytes()).collect();
    // The value is 0.<all> × 10^point.
    let mut point = i64::try_from(whole.len()).unwrap_or(0);
    let lead = all.iter().take_while(|d| **d == b'0').count();
    all.drain(..lead);
    point -= i64::try_from(lead).unwrap_or(0);
    if all.is_empty() {
        return 0.0;
    }
    let keep = point.saturating_add(digits);
    let Ok(keep) = usize::try_from(keep) else {
        return 0.0;
    };
    if keep >= all.len() {
        return f;
    }
    let round_up = all[keep] >= b'5';
    all.truncate(keep);
    if round_up {
        let mut i = all.len();
        loop {
            if i == 0 {
                all.insert(0, b'1');
                point += 1;
                break;
            }
            i -= 1;
            if all[i] == b'9' {
                all[i] = b'0';
            } else {
                all[i] += 1;
                break;
            }
        }
    }
    if all.is_empty() {
        return 0.0;
    }
    let text = format!("0.{}e{point}", String::from_utf8_lossy(&all));
    let magnitude = text.parse::<f64>().unwrap_or(f.abs());
    let rounded = if f < 0.0 { -magnitude } else { magnitude };
    // -0.0 reads as 0 in every SQL engine.
    if rounded == 0.0 { 0.0 } else { rounded }
}

pub fn cast<'v>(v: Value<'v>, to: SqlType) -> Result<Value<'v>, String> {
    if v.is_null() {
        return Ok(Value::Null);
    }
    let refuse = |v: &Value| format!("cannot cast {} to {}", v.kind(), to.name());
    Ok(match to {
        SqlType::Varchar => match v {
            Value::Text(t) => Value::Text(t),
            other => Value::Text(Cow::Owned(
                other.to_text().map(Cow::into_owned).unwrap_or_default(),
            )),
        },
        SqlType::Integer => match &v {
            Value::Int(_) => v,
            Value::Bool(b) => Value::Int(i64::from(*b)),
            Value::Float(f) => {
                let t = f.trunc();
                if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&t) {
                    return Err(format!(
                        "{} is out of the range of INTEGER",
                        format_float(*f)
                    ));
                }
                #[allow(clippy::cast_possible_truncation)]
                Value::Int(t as i64)
            }
            Value::Text(text) => Value::Int(
                trim_space(text)
                    .parse::<i64>()
                    .map_err(|_| format!("'{}' is not an INTEGER", shorten(text)))?,
            ),
            _ => return Err(refuse(&v)),
        },
        SqlType::Double => match &v {
            Value::Float(_) => v,
            Value::Int(_) => Value::Float(value::as_f64(&v)),
            Value::Bool(b) => Value::Float(if *b { 1.0 } else { 0.0 }),
            Value::Text(text) => match trim_space(text).parse::<f64>() {
                Ok(f) if f.is_finite() => Value::Float(f),
                _ => return Err(format!("'{}' is not a DOUBLE", shorten(text))),
            },
            _ => return Err(refuse(&v)),
        },
        SqlType::Boolean => match &v {
            Value::Bool(_) => v,
            Value::Int(i) => Value::Bool(*i != 0),
            Value::Text(text) => match trim_space(text).to_ascii_lowercase().as_str() {
                "true" | "t" | "yes" | "y" | "on" | "1" => Value::Bool(true),
                "false" | "f" | "no" | "n" | "off" | "0" => Value::Bool(false),
                _ => return Err(format!("'{}' is not a BOOLEAN", shorten(text))),
            },
            _ => return Err(refuse(&v)),
        },
    })
}

/// The text without the whitespace around it that SQLite skips when it reads a number:
/// ASCII space, tab, line feed, vertical tab, form feed and carriage return. Not Unicode
/// spaces: SQLite reads `'12\u{3000}'` as no number, and so do we.
fn trim_space(text: &str) -> &str {
    text.trim_matches([' ', '\t', '\n', '\u{b}', '\u{c}', '\r'])
}

/// At most 40 characters of a value, for error messages.
fn shorten(text: &str) -> String {
    let mut short: String = text.chars().take(40).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    short
}

/// `text LIKE pattern [ESCAPE escape]`: `%` matches any run of characters, `_` one
/// character, the escape character makes the next one literal. Case-sensitive unless
/// `case_insensitive` (ILIKE). `None` when an operand is NULL.
pub fn like(
    text: &Value,
    pattern: &Value,
    escape: Option<&Value>,
    case_insensitive: bool,
) -> Result<Option<bool>, String> {
    if text.is_null() || pattern.is_null() || escape.is_some_and(Value::is_null) {
        return Ok(None);
    }
    let text = text_arg(text, "the left side of LIKE")?;
    let pattern = text_arg(pattern, "the pattern")?;
    let escape = match escape {
        Some(e) => {
            let e = text_arg(e, "ESCAPE")?;
            let mut chars = e.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => Some(c),
                _ => return Err("ESCAPE must be a single character".into()),
            }
        }
        None => None,
    };
    let tokens = like_tokens(pattern, escape)?;
    let fold = |c: char| {
        if case_insensitive {
            c.to_lowercase().next().unwrap_or(c)
        } else {
            c
        }
    };
    let text: Vec<char> = text.chars().map(fold).collect();
    let tokens: Vec<Token> = tokens
        .into_iter()
        .map(|t| match t {
            Token::Char(c) => Token::Char(fold(c)),
            other => other,
        })
        .collect();
    Ok(Some(matches(&text, &tokens)))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Token {
    Char(char),
    One,
    Any,
}

fn like_tokens(pattern: &str, escape: Option<char>) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        tokens.push(if Some(c) == escape {
            match chars.next() {
                Some(next) => Token::Char(next),
                None => return Err("the LIKE pattern ends with its escape character".into()),
            }
        } else {
            match c {
                '%' => Token::Any,
                '_' => Token::One,
                c => Token::Char(c),
            }
        });
    }
    Ok(tokens)
}

/// Wildcard matching that backtracks only to the last `%`: linear in practice, at worst
/// text × pattern.
fn matches(text: &[char], pattern: &[Token]) -> bool {
    let (mut t, mut p) = (0, 0);
    let mut resume: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(Token::Any) => {
                resume = Some((p, t));
                p += 1;
                continue;
            }
            Some(Token::One) => {
                t += 1;
                p += 1;
                continue;
            }
            Some(Token::Char(c)) if *c == text[t] => {
                t += 1;
                p += 1;
                continue;
            }
            _ => {}
        }
        match resume {
            Some((star, from)) => {
                p = star + 1;
                t = from + 1;
                resume = Some((star, from + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|t| *t == Token::Any)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value<'_> {
        Value::Text(Cow::Borrowed(s))
    }

    fn like_str(t: &str, p: &str) -> bool {
        like(&text(t), &text(p), None, false).unwrap().unwrap()
    }

    #[test]
    fn like_wildcards_and_escapes() {
        assert!(like_str("abc", "a%"));
        assert!(like_str("abc", "%c"));
        assert!(like_str("abc", "_b_"));
        assert!(like_str("", "%"));
        assert!(!like_str("", "_"));
        assert!(like_str("a€c", "a_c"), "_ is one character, not one byte");
        assert!(!like_str("abc", "A%"), "case-sensitive");
        assert!(like_str("mississippi", "%iss%ppi"));
        assert!(!like_str("mississippi", "%iss%ppx"));
        let esc = |t: &str, p: &str| {
            like(&text(t), &text(p), Some(&text("!")), false)
                .unwrap()
                .unwrap()
        };
        assert!(esc("50%", "50!%"));
        assert!(!esc("500", "50!%"));
        assert!(like(&text("a"), &text("a!"), Some(&text("!")), false).is_err());
        assert!(like(&text("a"), &text("a"), Some(&text("!!")), false).is_err());
        assert!(
            like(&text("ABC"), &text("a%"), None, true)
                .unwrap()
                .unwrap()
        );
        assert_eq!(like(&Value::Null, &text("a"), None, false).unwrap(), None);
        assert!(like(&Value::Int(1), &text("1"), None, false).is_err());
    }

    #[test]
    fn substr_follows_sqlite() {
        let cases = [
            ("hello", 2, Some(3), "ell"),
            ("hello", 0, Some(3), "he"),
            ("hello", -3, None, "llo"),
            ("hello", -3, Some(2), "ll"),
            ("hello", 3, Some(-2), "he"),
            ("hello", -7, Some(4), "he"),
            ("hello", 9, None, ""),
            ("a", 0, None, "a"),
            ("héllo", 2, Some(1), "é"),
        ];
        for (s, start, len, want) in cases {
            assert_eq!(substr(s, start, len), want, "substr({s}, {start}, {len:?})");
        }
    }

    #[test]
    fn round_uses_the_exact_value_and_breaks_ties_away_from_zero() {
        assert_eq!(round_float(2.675, 2), 2.67);
        assert_eq!(round_float(0.125, 2), 0.13);
        assert_eq!(round_float(2.345, 2), 2.35);
        assert_eq!(round_float(-2.5, 0), -3.0);
        assert_eq!(round_float(0.5, 0), 1.0);
        assert_eq!(round_float(1.005, 2), 1.0);
        assert_eq!(round_float(9.99, 1), 10.0);
        assert_eq!(round_float(1234.5, -2), 1200.0);
        assert_eq!(round_float(1e-7, 2), 0.0);
        assert_eq!(round_float(1.5e20, 2), 1.5e20);
        assert_eq!(round_float(-0.4, 0), 0.0);
        assert_eq!(round_int(1250, -2).unwrap(), 1300);
        assert_eq!(round_int(-1250, -2).unwrap(), -1300);
        assert_eq!(round_int(1249, -2).unwrap(), 1200);
        assert_eq!(round_int(5, -30).unwrap(), 0);
        assert!(round_int(i64::MAX, -1).is_err());
    }

    #[test]
    fn casts() {
        let int = |v: Value| match cast(v, SqlType::Integer) {
            Ok(Value::Int(i)) => Ok(i),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(int(Value::Float(-2.7)), Ok(-2));
        assert_eq!(int(text(" 42 ")), Ok(42));
        assert!(int(text("4.2")).is_err());
        assert!(int(Value::Float(1e19)).is_err());
        assert_eq!(int(Value::Bool(true)), Ok(1));
        assert!(matches!(
            cast(text("1e3"), SqlType::Double),
            Ok(Value::Float(f)) if f == 1000.0
        ));
        assert!(cast(text("inf"), SqlType::Double).is_err());
        assert!(matches!(
            cast(Value::Float(2.5), SqlType::Varchar),
            Ok(Value::Text(t)) if t == "2.5"
        ));
        assert!(matches!(
            cast(text("Yes"), SqlType::Boolean),
            Ok(Value::Bool(true))
        ));
        assert!(cast(text("maybe"), SqlType::Boolean).is_err());
        assert!(matches!(
            cast(Value::Null, SqlType::Integer),
            Ok(Value::Null)
        ));
    }
}
