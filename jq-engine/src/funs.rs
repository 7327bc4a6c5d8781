//! Native filters over [`Val`]: jaq-json's (adapted: MIT, Michael Färber; see `LICENSE-jaq`)
//! and those jq has natively that jaq lacks or defines differently.

use bstr::ByteSlice;
use jaq_core::native::{Filter, Fun, bome, run, unary, v};
use jaq_core::{DataT, RunPtr};
use jaq_std::ValT as _;

use crate::value::{Error, Map, Rc, Val, ValR, described, type_error, type_name};
use crate::{json_in, json_out};

fn fail(message: impl std::fmt::Display) -> Error {
    Error::str(message)
}

impl Val {
    /// 0 for null, the absolute value for numbers (the literal kept), the length of strings
    /// (in characters), arrays and objects; an error for booleans.
    fn length(&self) -> ValR {
        match self {
            Val::Null => Ok(Val::from(0usize)),
            Val::Num(n) => Ok(Val::Num(n.abs())),
            Val::TStr(s) => Ok(Val::from(s.chars().count())),
            Val::BStr(b) => Ok(Val::from(b.len())),
            Val::Arr(a) => Ok(Val::from(a.len())),
            Val::Obj(o) => Ok(Val::from(o.len())),
            Val::Bool(_) => Err(fail(format_args!("{} has no length", described(self)))),
        }
    }

    /// The indices of `y` in `self`: of characters in strings, elements in arrays.
    fn indices<'a>(&'a self, y: &'a Val) -> Result<Box<dyn Iterator<Item = usize> + 'a>, Error> {
        match (self, y) {
            (Val::Null, _) => Ok(Box::new(std::iter::empty())),
            (Val::BStr(_) | Val::TStr(_), Val::BStr(y) | Val::TStr(y)) if y.is_empty() => {
                Ok(Box::new(std::iter::empty()))
            }
            (Val::TStr(x), Val::TStr(y)) => {
                let index = |(i, _, _)| x.get(i..i + y.len());
                let iw = x.char_indices().map_while(index).enumerate();
                Ok(Box::new(iw.filter_map(|(i, w)| (w == **y).then_some(i))))
            }
            (Val::Arr(_), Val::Arr(y)) if y.is_empty() => Ok(Box::new(std::iter::empty())),
            (Val::Arr(x), Val::Arr(y)) => {
                let iw = x.windows(y.len()).enumerate();
                Ok(Box::new(iw.filter_map(|(i, w)| (w == **y).then_some(i))))
            }
            (Val::Arr(x), y) => {
                let ix = x.iter().enumerate();
                Ok(Box::new(ix.filter_map(move |(i, x)| (x == y).then_some(i))))
            }
            (x, y) => Err(fail(format_args!(
                "Cannot determine the indices of {} in {}",
                described(y),
                described(x)
            ))),
        }
    }

    /// jq's `contains`: substrings, elements contained in some element, keys whose values
    /// contain; values of different types are an error.
    fn contains(&self, other: &Self) -> Result<bool, Error> {
        Ok(match (self, other) {
            (Self::BStr(l) | Self::TStr(l), Self::BStr(r) | Self::TStr(r)) => l.contains_str(&**r),
            (Self::Arr(l), Self::Arr(r)) => {
                for r in r.iter() {
                    let mut found = false;
                    for l in l.iter() {
                        if type_name(l) == type_name(r) && l.contains(r)? {
                            found = true;
                            break;
                        }
                    }
                    if !found {
                        return Ok(false);
                    }
                }
                true
            }
            (Self::Obj(l), Self::Obj(r)) => {
                for (k, r) in r.iter() {
                    match l.get(k) {
                        Some(l) if type_name(l) == type_name(r) => {
                            if !l.contains(r)? {
                                return Ok(false);
                            }
                        }
                        Some(l) => {
                            return Err(fail(format_args!(
                                "{} and {} cannot have their containment checked",
                                described(l),
                                described(r)
                            )));
                        }
                        None => return Ok(false),
                    }
                }
                true
            }
            _ if type_name(self) == type_name(other) => self == other,
            _ => {
                return Err(fail(format_args!(
                    "{} and {} cannot have their containment checked",
                    described(self),
                    described(other)
                )));
            }
        })
    }

    fn has(&self, key: &Self) -> ValR {
        match (self, key) {
            (Val::Obj(o), Val::TStr(_) | Val::BStr(_)) => Ok(Val::Bool(o.contains_key(key))),
            (Val::Arr(a), Val::Num(n)) => Ok(Val::Bool(
                n.as_index()
                    .is_some_and(|i| i >= 0 && (i as usize) < a.len()),
            )),
            _ => Err(fail(format_args!(
                "Cannot check whether {} has a {} key",
                type_name(self),
                type_name(key)
            ))),
        }
    }

    fn string_bytes(&self) -> Result<&[u8], Error> {
        match self {
            Val::TStr(b) | Val::BStr(b) => Ok(b),
            _ => Err(fail(format_args!("{} is not a string", described(self)))),
        }
    }
}

/// jq's `fromjson`: exactly one JSON value, at most [`json_in::MAX_DEPTH`] levels deep (an
/// unbounded reader overflowed the stack on a string of 100,000 `[`); jq also reads `nan`.
/// What jq refuses gets jq's message, naming the place as jq does ([`crate::jq_parse`]).
fn from_json(value: &Val) -> ValR {
    let (Val::TStr(text) | Val::BStr(text)) = value else {
        return Err(type_error(value, "only strings can be parsed"));
    };
    let text: &[u8] = text;
    if let b"nan" | b"NaN" | b"-nan" | b"-NaN" = text.trim() {
        return Ok(Val::from(f64::NAN));
    }
    json_in::read(text).map_err(|e| {
        if let Some(message) = crate::jq_parse::error(text) {
            return fail(message);
        }
        // Text jq reads but a step does not (`[nan]`, `01`): our reader's words.
        let start: String = String::from_utf8_lossy(&text[..text.len().min(40)]).into();
        let more = if text.len() > 40 { "…" } else { "" };
        fail(format_args!(
            "{start:?}{more} cannot be parsed as JSON: {e}"
        ))
    })
}

fn to_json(value: &Val) -> Val {
    let mut out = Vec::new();
    json_out::write_lossy(&mut out, value);
    Val::utf8_str(out)
}

/// jq 1.8's `tonumber`: a number, or a string that is exactly a number (`+` and a leading
/// `.` allowed, white space not).
fn to_number(value: &Val) -> ValR {
    let refuse = || {
        fail(format_args!(
            "{} cannot be parsed as a number",
            described(value)
        ))
    };
    let text = match value {
        Val::Num(_) => return Ok(value.clone()),
        Val::TStr(text) | Val::BStr(text) => text,
        _ => return Err(refuse()),
    };
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, &text[..]),
    };
    let mut literal = Vec::with_capacity(text.len() + 2);
    if negative {
        literal.push(b'-');
    }
    if digits.first() == Some(&b'.') {
        literal.push(b'0');
    }
    literal.extend_from_slice(digits);
    let whole = literal
        .first()
        .is_some_and(|b| b.is_ascii_digit() || *b == b'-')
        && literal.last().is_some_and(u8::is_ascii_digit);
    match json_in::read(&literal) {
        Ok(number @ Val::Num(_)) if whole => Ok(number),
        _ => Err(refuse()),
    }
}

/// One field of `@csv` or `@tsv`.
fn format_row(row: &Val, csv: bool) -> ValR {
    let Val::Arr(fields) = row else {
        return Err(fail(format_args!(
            "{} cannot be {}-formatted, only an array can be",
            described(row),
            if csv { "csv" } else { "tsv" }
        )));
    };
    let mut out = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            out.push(if csv { b',' } else { b'\t' });
        }
        match field {
            Val::Null => {}
            Val::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Val::Num(n) => crate::num::write(&mut out, n),
            Val::TStr(s) | Val::BStr(s) if csv => {
                out.push(b'"');
                for &b in s.iter() {
                    if b == b'"' {
                        out.push(b'"');
                    }
                    out.push(b);
                }
                out.push(b'"');
            }
            Val::TStr(s) | Val::BStr(s) => {
                for &b in s.iter() {
                    match b {
                        b'\t' => out.extend_from_slice(b"\\t"),
                        b'\r' => out.extend_from_slice(b"\\r"),
                        b'\n' => out.extend_from_slice(b"\\n"),
                        b'\\' => out.extend_from_slice(b"\\\\"),
                        b => out.push(b),
                    }
                }
            }
            other => {
                return Err(fail(format_args!(
                    "{} is not valid in a csv row",
                    described(other)
                )));
            }
        }
    }
    Ok(Val::utf8_str(out))
}

/// jq's `delpaths`: the paths deleted from the last to the first, so that deleting an
/// element does not shift the ones still to delete.
fn del_paths(value: Val, paths: &Val) -> ValR {
    let Val::Arr(paths) = paths else {
        return Err(fail("Paths must be specified as an array"));
    };
    let mut absolute = Vec::with_capacity(paths.len());
    for path in paths.iter() {
        let Val::Arr(path) = path else {
            return Err(fail("Path must be specified as an array"));
        };
        if path.len() > json_in::MAX_DEPTH {
            return Err(fail("Path too deep"));
        }
        absolute.push(absolute_path(&value, path));
    }
    // Indices from the end and slices are made absolute against the value first, as in jq.
    absolute.sort();
    absolute.dedup();
    let mut value = value;
    for path in absolute.iter().rev() {
        value = del_path(value, path)?;
    }
    Ok(value)
}

/// `path` with indices from the end, and slice bounds, as the indices they stand for in
/// `value`.
fn absolute_path(value: &Val, path: &[Val]) -> Vec<Val> {
    let mut at = Some(value.clone());
    let mut out = Vec::with_capacity(path.len());
    for key in path {
        let here = at.take();
        let key = match (&here, key) {
            (Some(Val::Arr(a)), Val::Num(n)) => match n.as_index() {
                Some(i) if i < 0 => Val::from(i + a.len() as isize),
                _ => key.clone(),
            },
            (Some(Val::Arr(a)), Val::Obj(range)) => {
                let len = a.len() as f64;
                let bound = |name: &str, default: f64| {
                    let b = range
                        .get(&Val::utf8_str(name.to_owned()))
                        .and_then(|b| b.as_num().map(|n| n.as_f64()))
                        .unwrap_or(default);
                    let b = if b < 0.0 { b + len } else { b };
                    b.clamp(0.0, len)
                };
                let (start, end) = (bound("start", 0.0).floor(), bound("end", len).ceil());
                let mut m = Map::default();
                m.insert(Val::utf8_str("start"), Val::from(start));
                m.insert(Val::utf8_str("end"), Val::from(end.max(start)));
                Val::obj(m)
            }
            _ => key.clone(),
        };
        at = here.and_then(|v| v.index_opt(&key).ok().flatten());
        out.push(key);
    }
    out
}

/// Whether `value` nests more than `limit` arrays and objects, found without recursing.
pub(crate) fn depth_exceeds(value: &Val, limit: usize) -> bool {
    let mut pending = vec![(value, 0usize)];
    while let Some((value, depth)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &Val>> = match value {
            Val::Arr(a) => Box::new(a.iter()),
            Val::Obj(o) => Box::new(o.values()),
            _ => continue,
        };
        if depth + 1 > limit {
            return true;
        }
        pending.extend(children.map(|child| (child, depth + 1)));
    }
    false
}

fn del_path(value: Val, path: &[Val]) -> ValR {
    let Some((key, rest)) = path.split_first() else {
        return Ok(Val::Null);
    };
    if let Val::Null = value {
        return Ok(Val::Null);
    }
    if !rest.is_empty() {
        let child = value.clone().index_opt(key)?;
        return match child {
            Some(child @ (Val::Arr(_) | Val::Obj(_))) => {
                let child = del_path(child, rest)?;
                set_child(value, key, child)
            }
            _ => Ok(value),
        };
    }
    match (value, key) {
        (Val::Obj(mut o), Val::TStr(_) | Val::BStr(_)) => {
            Rc::make_mut(&mut o).shift_remove(key);
            Ok(Val::Obj(o))
        }
        (Val::Arr(mut a), Val::Num(n)) => {
            if let Some(mut i) = n.as_index() {
                if i < 0 {
                    i += a.len() as isize;
                }
                if i >= 0 && (i as usize) < a.len() {
                    Rc::make_mut(&mut a).remove(i as usize);
                }
            }
            Ok(Val::Arr(a))
        }
        (value @ Val::Arr(_), Val::Obj(range)) => {
            use jaq_core::ValT;
            let start = range.get(&Val::utf8_str("start"));
            let end = range.get(&Val::utf8_str("end"));
            let opt = jaq_core::path::Opt::Essential;
            value
                .map_range(start..end, opt, |_| std::iter::empty())
                .map_err(|e| e.get_err().unwrap_or_else(|_| fail("cannot delete")))
        }
        (value, key) => Err(fail(format_args!(
            "Cannot delete field at index {} of {}",
            described(key),
            type_name(&value)
        ))),
    }
}

fn set_child(value: Val, key: &Val, child: Val) -> ValR {
    use jaq_core::ValT;
    value
        .map_index(key, jaq_core::path::Opt::Essential, |_| {
            std::iter::once(Ok(child.clone()))
        })
        .map_err(|e| e.get_err().unwrap_or_else(|_| fail("cannot update")))
}

fn implode(value: &Val) -> ValR {
    let Val::Arr(points) = value else {
        return Err(fail(format_args!(
            "{} cannot be imploded, it must be an array of codepoints",
            described(value)
        )));
    };
    let mut out = String::new();
    for point in points.iter() {
        let Val::Num(n) = point else {
            return Err(fail(format_args!(
                "{} can't be imploded, unicode codepoint needs to be numeric",
                described(point)
            )));
        };
        let code = n.as_index().unwrap_or(-1);
        // As jq: what is not a character becomes U+FFFD.
        let c = u32::try_from(code)
            .ok()
            .and_then(char::from_u32)
            .unwrap_or('\u{fffd}');
        out.push(c);
    }
    Ok(Val::from(out))
}

fn split_string(value: &Val, sep: &Val) -> ValR {
    match (value, sep) {
        (Val::TStr(_), Val::TStr(_)) => value.clone() / sep.clone(),
        _ => Err(fail("split input and separator must be strings")),
    }
}

fn trim_prefix(value: Val, prefix: &Val, front: bool) -> ValR {
    match (&value, prefix) {
        (Val::TStr(_), Val::TStr(_)) => {}
        _ if front => return Err(fail("startswith() requires string inputs")),
        _ => return Err(fail("endswith() requires string inputs")),
    }
    match (&value, prefix) {
        (Val::TStr(s), Val::TStr(p)) => {
            let rest = if front {
                s.strip_prefix(&***p)
            } else {
                s.strip_suffix(&***p)
            };
            Ok(rest.map_or(value.clone(), |rest| value.as_sub_str(rest)))
        }
        _ => Ok(value),
    }
}

/// jaq's trimming (Unicode white space), with jq's message for what is not a string.
fn trim(value: &Val, f: impl FnOnce(&[u8]) -> &[u8]) -> ValR {
    match value {
        Val::TStr(s) => Ok(value.as_sub_str(f(s))),
        _ => Err(fail("trim input must be a string")),
    }
}

/// jq's checks of what `mktime` (`format` none) and `strftime`/`strflocaltime` (`name`, their
/// format) take, with its messages: a broken-down time whose first 8 elements are numbers, not
/// NaN (`jv2tm`), or for the latter an epoch number too. A short time is padded with zeros to
/// 8, as jq takes it; jaq's conversions do the rest. Native: these run once per date.
fn time_input(value: Val, name: &Val, format: Option<&Val>) -> ValR {
    let name = match name {
        Val::TStr(s) | Val::BStr(s) => String::from_utf8_lossy(s).into_owned(),
        other => other.to_string(),
    };
    let refuse = |what: &str| Err(fail(format_args!("{name} requires {what}")));
    let format_ok = format.is_none_or(|f| matches!(f, Val::TStr(_) | Val::BStr(_)));
    let number = |v: &Val| matches!(v, Val::Num(n) if !n.as_f64().is_nan());
    match value {
        Val::Num(_) if format.is_some() && format_ok => Ok(value),
        Val::Num(_) | Val::Arr(_) if !format_ok => refuse("a string format"),
        Val::Arr(mut fields) if fields.iter().take(8).all(number) => {
            if fields.len() < 8 {
                Rc::make_mut(&mut fields).resize(8, Val::from(0usize));
            }
            Ok(Val::Arr(fields))
        }
        Val::Arr(_) => refuse("parsed datetime inputs"),
        _ if format.is_none() => refuse("array inputs"),
        _ => refuse("parsed datetime inputs"),
    }
}

fn base32(value: &Val) -> ValR {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let bytes = value.string_bytes()?;
    let mut out = Vec::new();
    for chunk in bytes.chunks(5) {
        let mut buf = [0u8; 5];
        buf[..chunk.len()].copy_from_slice(chunk);
        let bits = buf.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b));
        let chars = (chunk.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < chars {
                out.push(ALPHABET[((bits >> (35 - 5 * i)) & 31) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
    Ok(Val::utf8_str(out))
}

fn base32_decode(value: &Val) -> ValR {
    let bytes = value.string_bytes()?;
    let mut out = Vec::new();
    let (mut bits, mut count) = (0u64, 0);
    for &b in bytes.iter() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a',
            b'2'..=b'7' => b - b'2' + 26,
            b'=' => break,
            _ => {
                return Err(fail(format_args!(
                    "{} is not valid base32 data",
                    described(value)
                )));
            }
        };
        bits = (bits << 5) | u64::from(v);
        count += 5;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    Ok(Val::utf8_str(String::from_utf8_lossy(&out).into_owned()))
}

/// `builtins`: set once by [`crate::Engine`], the names of what programs can call.
pub(crate) static BUILTINS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// The natives of this crate; they take precedence over jaq's of the same name and arity.
pub fn funs<D: for<'a> DataT<V<'a> = Val>>() -> impl Iterator<Item = Fun<D>> {
    base().into_vec().into_iter().map(run)
}

fn base<D: for<'a> DataT<V<'a> = Val>>() -> Box<[Filter<RunPtr<D>>]> {
    Box::new([
        ("fromjson", v(0), |cv| bome(from_json(&cv.1))),
        ("tojson", v(0), |cv| bome(Ok(to_json(&cv.1)))),
        ("tostring", v(0), |cv| {
            bome(Ok(match cv.1 {
                text @ Val::TStr(_) => text,
                other => to_json(&other),
            }))
        }),
        ("tonumber", v(0), |cv| bome(to_number(&cv.1))),
        ("length", v(0), |cv| bome(cv.1.length())),
        ("contains", v(1), |cv| {
            unary(cv, |x, y| {
                let limit = json_out::MAX_WRITE_DEPTH;
                if depth_exceeds(&x, limit) || depth_exceeds(&y, limit) {
                    return Err(fail("Containment check too deep"));
                }
                x.contains(&y).map(Val::from)
            })
        }),
        ("has", v(1), |cv| unary(cv, |v, k| v.has(&k))),
        ("indices", v(1), |cv| {
            let to_int = |i: usize| Val::from(i as isize);
            unary(cv, move |x, v| {
                x.indices(&v).map(|idxs| idxs.map(to_int).collect())
            })
        }),
        ("bsearch", v(1), |cv| {
            let to_idx = |r: Result<_, _>| r.map_or_else(|i| -1 - i as isize, |i| i as isize);
            unary(cv, move |a, x| match &a {
                Val::Arr(a) => Ok(Val::from(to_idx(a.binary_search(&x)))),
                _ => Err(type_error(&a, "cannot be searched from")),
            })
        }),
        ("_strindices", v(1), |cv| {
            let to_int = |i: usize| Val::from(i as isize);
            unary(cv, move |x, v| match (&x, &v) {
                (Val::TStr(_) | Val::BStr(_), Val::TStr(_) | Val::BStr(_)) => {
                    x.indices(&v).map(|idxs| idxs.map(to_int).collect())
                }
                (Val::TStr(_) | Val::BStr(_), _) => Err(type_error(&v, "is not a string")),
                _ => Err(type_error(&x, "cannot be searched, as it is not a string")),
            })
        }),
        ("utf8bytelength", v(0), |cv| {
            bome(match &cv.1 {
                Val::TStr(s) | Val::BStr(s) => Ok(Val::from(s.len())),
                v => Err(type_error(v, "only strings have UTF-8 byte length")),
            })
        }),
        ("_plumber_time_in", v(1), |cv| {
            unary(cv, |v, name| time_input(v, &name, None))
        }),
        ("_plumber_time_in", v(2), |mut cv| {
            let format = cv.0.pop_var();
            let name = cv.0.pop_var();
            bome(time_input(cv.1, &name, Some(&format)))
        }),
        ("trim", v(0), |cv| bome(trim(&cv.1, ByteSlice::trim))),
        ("ltrim", v(0), |cv| bome(trim(&cv.1, ByteSlice::trim_start))),
        ("rtrim", v(0), |cv| bome(trim(&cv.1, ByteSlice::trim_end))),
        ("delpaths", v(1), |cv| {
            unary(cv, |v, paths| del_paths(v, &paths))
        }),
        ("implode", v(0), |cv| bome(implode(&cv.1))),
        ("_plumber_split", v(1), |cv| {
            unary(cv, |v, sep| split_string(&v, &sep))
        }),
        ("ltrimstr", v(1), |cv| {
            unary(cv, |v, p| trim_prefix(v, &p, true))
        }),
        ("rtrimstr", v(1), |cv| {
            unary(cv, |v, p| trim_prefix(v, &p, false))
        }),
        ("_plumber_csv", v(0), |cv| bome(format_row(&cv.1, true))),
        ("_plumber_tsv", v(0), |cv| bome(format_row(&cv.1, false))),
        ("_plumber_base32", v(0), |cv| bome(base32(&cv.1))),
        ("_plumber_base32d", v(0), |cv| bome(base32_decode(&cv.1))),
        ("builtins", v(0), |_| {
            let names = BUILTINS.get().map(Vec::as_slice).unwrap_or_default();
            bome(Ok(names.iter().cloned().map(Val::from).collect()))
        }),
        ("nan", v(0), |_| bome(Ok(Val::from(f64::NAN)))),
        ("infinite", v(0), |_| bome(Ok(Val::from(f64::INFINITY)))),
        ("_plumber_shallow", v(1), |cv| {
            unary(cv, |v, message| {
                if depth_exceeds(&v, json_out::MAX_WRITE_DEPTH) {
                    Err(Error::new(message))
                } else {
                    Ok(v)
                }
            })
        }),
    ])
}
