//! The values of jq programs: JSON, with jq 1.8's semantics for paths and arithmetic.
//!
//! Adapted from jaq-json 2.0.3's `Val` (MIT, Michael Färber; see `LICENSE-jaq`). The changes
//! are jq's semantics where jaq's differ:
//!
//! - Updating a path through `null` creates it (`null | .a.b = 1`, `.[2] = 1` on null), and
//!   assigning past the end of an array pads it with nulls, as in jq; jaq refused both, so
//!   the most common jq idiom dead-lettered records.
//! - Division by zero and `%` by zero are errors (jaq gave infinities); `%` works on
//!   integers, truncating, as in jq; a string times a number repeats it as jq does.
//! - Numbers follow jq 1.8 ([`crate::num`]); fractional indices and slice bounds are
//!   truncated as in jq; object keys must be strings.

use bstr::ByteSlice;
use bytes::{BufMut, Bytes, BytesMut};
use jaq_core::box_iter::box_once;
use jaq_core::{Exn, path, val};
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

pub use crate::num::Num;
pub use std::rc::Rc;

/// JSON superset with binary data and non-string object keys.
///
/// This is the default value type for jaq.
#[derive(Clone, Debug, Default)]
pub enum Val {
    #[default]
    /// Null
    Null,
    /// Boolean
    Bool(bool),
    /// Number
    Num(Num),
    /// Byte string
    BStr(Box<Bytes>),
    /// Text string (interpreted as UTF-8)
    ///
    /// Note that this does not require the actual bytes to be all valid UTF-8;
    /// this just means that the bytes are interpreted as UTF-8.
    /// An effort is made to preserve invalid UTF-8 as is, else
    /// replace invalid UTF-8 by the Unicode replacement character.
    TStr(Box<Bytes>),
    /// Array
    Arr(Rc<Vec<Val>>),
    /// Object
    Obj(Rc<Map<Val, Val>>),
}

#[cfg(target_arch = "x86_64")]
const _: () = {
    assert!(core::mem::size_of::<Val>() == 16);
};

/// Order-preserving map
pub type Map<K = Val, V = K> = indexmap::IndexMap<K, V, foldhash::fast::RandomState>;

/// Error that can occur during filter execution.
pub type Error = jaq_core::Error<Val>;
/// A value or an eRror.
pub type ValR = jaq_core::ValR<Val>;
/// A value or an eXception.
pub type ValX<'a> = jaq_core::ValX<'a, Val>;

// This is part of the Rust standard library since 1.76:
// <https://doc.rust-lang.org/std/rc/struct.Rc.html#method.unwrap_or_clone>.
// However, to keep MSRV low, we reimplement it here.
fn rc_unwrap_or_clone<T: Clone>(a: Rc<T>) -> T {
    Rc::try_unwrap(a).unwrap_or_else(|a| (*a).clone())
}

/// The name jq gives the type of a value in its messages.
pub fn type_name(v: &Val) -> &'static str {
    match v {
        Val::Null => "null",
        Val::Bool(_) => "boolean",
        Val::Num(_) => "number",
        Val::BStr(_) | Val::TStr(_) => "string",
        Val::Arr(_) => "array",
        Val::Obj(_) => "object",
    }
}

/// A value as jq 1.8's messages show it (`jv_dump_string_trunc` into a 30-byte buffer): its
/// JSON, or when that is longer than 29 bytes, as much of it as fits in 29 with `...` and the
/// closing `"`, `]` or `}`, cut where a character starts.
pub fn dump_trunc(v: &Val) -> String {
    const MAX: usize = 29;
    let mut json = Vec::new();
    crate::json_out::write_lossy(&mut json, v);
    let text = String::from_utf8_lossy(&json);
    if text.len() <= MAX {
        return text.into_owned();
    }
    let close = match v {
        Val::TStr(_) | Val::BStr(_) => "\"",
        Val::Arr(_) => "]",
        Val::Obj(_) => "}",
        _ => "",
    };
    let mut end = MAX - "...".len() - close.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...{close}", &text[..end])
}

/// `type (value)`, as jq's messages name a value.
pub fn described(v: &Val) -> String {
    format!("{} ({})", type_name(v), dump_trunc(v))
}

/// jq's `type_error`: `type (value) message`.
pub fn type_error(v: &Val, message: &str) -> Error {
    fail(format_args!("{} {message}", described(v)))
}

fn fail(message: impl fmt::Display) -> Error {
    Error::str(message)
}

fn cannot_index(v: &Val, index: &Val) -> Error {
    fail(format_args!(
        "Cannot index {} with {}",
        type_name(v),
        described(index)
    ))
}

fn cannot_iterate(v: &Val) -> Error {
    fail(format_args!("Cannot iterate over {}", described(v)))
}

/// Beyond this index jq refuses to grow an array.
const MAX_ARRAY_INDEX: isize = (i32::MAX >> 2) as isize;

impl jaq_core::ValT for Val {
    fn from_num(n: &str) -> ValR {
        Ok(Self::Num(Num::from_literal(n)))
    }

    fn from_map<I: IntoIterator<Item = (Self, Self)>>(iter: I) -> ValR {
        let iter = iter.into_iter();
        let mut map = Map::with_capacity_and_hasher(iter.size_hint().0, Default::default());
        for (k, v) in iter {
            if !matches!(k, Val::TStr(_) | Val::BStr(_)) {
                return Err(fail(format_args!(
                    "Object keys must be strings, not {}",
                    described(&k)
                )));
            }
            map.insert(k, v);
        }
        Ok(Self::obj(map))
    }

    fn key_values(self) -> Box<dyn Iterator<Item = Result<(Val, Val), Error>>> {
        let arr_idx = |(i, x)| Ok((Self::from(i as isize), x));
        match self {
            Self::Arr(a) => Box::new(rc_unwrap_or_clone(a).into_iter().enumerate().map(arr_idx)),
            Self::Obj(o) => Box::new(rc_unwrap_or_clone(o).into_iter().map(Ok)),
            _ => box_once(Err(cannot_iterate(&self))),
        }
    }

    fn values(self) -> Box<dyn Iterator<Item = ValR>> {
        match self {
            Self::Arr(a) => Box::new(rc_unwrap_or_clone(a).into_iter().map(Ok)),
            Self::Obj(o) => Box::new(rc_unwrap_or_clone(o).into_iter().map(|(_k, v)| Ok(v))),
            _ => box_once(Err(cannot_iterate(&self))),
        }
    }

    fn index(self, index: &Self) -> ValR {
        self.index_opt(index).map(|o| o.unwrap_or(Val::Null))
    }

    fn range(self, range: val::Range<&Self>) -> ValR {
        match self {
            Val::Null => Ok(Val::Null),
            Val::TStr(b) => {
                let chars = b.chars().count();
                let (skip, take) = slice_bounds(range, chars)?;
                let (from, to) = char_offsets(&b, skip, skip + take);
                Ok(Val::utf8_str(b.slice(from..to)))
            }
            Val::BStr(b) => {
                let (skip, take) = slice_bounds(range, b.len())?;
                Ok(Val::byte_str(b.slice(skip..skip + take)))
            }
            Val::Arr(a) => {
                let (skip, take) = slice_bounds(range, a.len())?;
                Ok(a.iter().skip(skip).take(take).cloned().collect())
            }
            _ => Err(fail(format_args!(
                "Cannot index {} with object",
                type_name(&self)
            ))),
        }
    }

    fn map_values<'a, I: Iterator<Item = ValX<'a>>>(
        self,
        opt: path::Opt,
        f: impl Fn(Self) -> I,
    ) -> ValX<'a> {
        match self {
            Self::Arr(a) => {
                // As jq: the first output replaces an element, none deletes it.
                let mut out = Vec::with_capacity(a.len());
                for x in rc_unwrap_or_clone(a) {
                    if let Some(y) = f(x).next() {
                        out.push(y?);
                    }
                }
                Ok(Val::Arr(Rc::new(out)))
            }
            Self::Obj(o) => {
                let iter = rc_unwrap_or_clone(o).into_iter();
                let iter = iter.filter_map(|(k, v)| f(v).next().map(|v| Ok((k, v?))));
                Ok(Self::obj(iter.collect::<Result<_, Exn<_>>>()?))
            }
            v => opt.fail(v, |v| Exn::from(cannot_iterate(&v))),
        }
    }

    fn map_index<'a, I: Iterator<Item = ValX<'a>>>(
        mut self,
        index: &Self,
        opt: path::Opt,
        f: impl Fn(Self) -> I,
    ) -> ValX<'a> {
        if let (Val::Null | Val::Arr(_), Val::Obj(o)) = (&self, index) {
            let range = o.get(&Val::utf8_str("start"))..o.get(&Val::utf8_str("end"));
            return self.map_range(range, opt, f);
        };
        // jq creates the path through null: an object for a key, an array for an index.
        if let Val::Null = self {
            match index {
                Val::TStr(_) | Val::BStr(_) => self = Val::obj(Map::default()),
                Val::Num(_) => self = Val::Arr(Rc::default()),
                _ => {}
            }
        }
        match self {
            Val::Obj(ref mut o) if matches!(index, Val::TStr(_) | Val::BStr(_)) => {
                use indexmap::map::Entry::{Occupied, Vacant};
                match Rc::make_mut(o).entry(index.clone()) {
                    Occupied(mut e) => {
                        let v = core::mem::take(e.get_mut());
                        match f(v).next().transpose()? {
                            Some(y) => {
                                e.insert(y);
                            }
                            // jq keeps the order of the other keys.
                            None => {
                                e.shift_remove();
                            }
                        };
                    }
                    Vacant(e) => {
                        if let Some(y) = f(Val::Null).next().transpose()? {
                            e.insert(y);
                        }
                    }
                }
                Ok(self)
            }
            Val::Arr(ref mut a) if matches!(index, Val::Num(_)) => {
                let Val::Num(n) = index else { unreachable!() };
                let Some(mut i) = n.as_index() else {
                    return opt.fail(self, |_| {
                        Exn::from(fail("Cannot set array element at NaN index"))
                    });
                };
                let len = a.len() as isize;
                if i < 0 {
                    i += len;
                    if i < 0 {
                        return opt.fail(self, |_| {
                            Exn::from(fail("Out of bounds negative array index"))
                        });
                    }
                }
                if i > MAX_ARRAY_INDEX {
                    return opt.fail(self, |_| Exn::from(fail("Array index too large")));
                }
                let i = i as usize;
                if i >= a.len() {
                    if let Some(y) = f(Val::Null).next().transpose()? {
                        let a = Rc::make_mut(a);
                        a.resize(i, Val::Null);
                        a.push(y);
                    }
                    return Ok(self);
                }
                let a = Rc::make_mut(a);
                let x = core::mem::take(&mut a[i]);
                if let Some(y) = f(x).next().transpose()? {
                    a[i] = y;
                } else {
                    a.remove(i);
                }
                Ok(self)
            }
            // What jq can read but not set (`jv_set`), after what it cannot read at all.
            Val::Arr(_) if matches!(index, Val::Arr(_)) => opt.fail(self, |_| {
                Exn::from(fail("Cannot update field at array index of array"))
            }),
            Val::TStr(_) | Val::BStr(_) if matches!(index, Val::Obj(_)) => {
                opt.fail(self, |_| Exn::from(fail("Cannot update string slices")))
            }
            _ => opt.fail(self, |v| Exn::from(cannot_index(&v, index))),
        }
    }

    fn map_range<'a, I: Iterator<Item = ValX<'a>>>(
        mut self,
        range: val::Range<&Self>,
        opt: path::Opt,
        f: impl Fn(Self) -> I,
    ) -> ValX<'a> {
        if let Val::Null = self {
            self = Val::Arr(Rc::default());
        }
        match self {
            Val::Arr(ref mut a) => {
                let (skip, take) = match slice_bounds(range, a.len()) {
                    Ok(bounds) => bounds,
                    Err(e) => return opt.fail(self, |_| Exn::from(e)),
                };
                let arr = a.iter().skip(skip).take(take).cloned().collect();
                let y = match f(arr).next() {
                    Some(y) => match y? {
                        Val::Arr(y) => y,
                        other => {
                            return Err(Exn::from(fail(format_args!(
                                "A slice of an array can only be assigned another array, not {}",
                                described(&other)
                            ))));
                        }
                    },
                    None => Rc::default(),
                };
                Rc::make_mut(a).splice(skip..skip + take, (*y).clone());
                Ok(self)
            }
            Val::TStr(_) | Val::BStr(_) => {
                opt.fail(self, |_| Exn::from(fail("Cannot update string slices")))
            }
            _ => opt.fail(self, |v| {
                Exn::from(fail(format_args!(
                    "Cannot update field at object index of {}",
                    type_name(&v)
                )))
            }),
        }
    }

    /// True if the value is neither null nor false.
    fn as_bool(&self) -> bool {
        !matches!(self, Self::Null | Self::Bool(false))
    }

    fn into_string(self) -> Self {
        match self {
            Self::BStr(b) | Self::TStr(b) => Self::TStr(b),
            _ => {
                let mut json = Vec::new();
                crate::json_out::write_lossy(&mut json, &self);
                Self::utf8_str(json)
            }
        }
    }
}

impl jaq_std::ValT for Val {
    fn into_seq<S: FromIterator<Self>>(self) -> Result<S, Self> {
        match self {
            Self::Arr(a) => match Rc::try_unwrap(a) {
                Ok(a) => Ok(a.into_iter().collect()),
                Err(a) => Ok(a.iter().cloned().collect()),
            },
            _ => Err(self),
        }
    }

    fn is_int(&self) -> bool {
        self.as_num().is_some_and(Num::is_int)
    }

    fn as_isize(&self) -> Option<isize> {
        self.as_num().and_then(Num::as_isize)
    }

    fn as_f64(&self) -> Option<f64> {
        self.as_num().map(Num::as_f64)
    }

    fn is_utf8_str(&self) -> bool {
        matches!(self, Self::TStr(_))
    }

    fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Self::BStr(b) | Self::TStr(b) => Some(b),
            _ => None,
        }
    }

    fn as_sub_str(&self, sub: &[u8]) -> Self {
        match self {
            Self::BStr(b) => Self::byte_str(b.slice_ref(sub)),
            Self::TStr(b) => Self::utf8_str(b.slice_ref(sub)),
            // Only called on strings, with a part of them.
            _ => Self::Null,
        }
    }

    fn from_utf8_bytes(b: impl AsRef<[u8]> + Send + 'static) -> Self {
        Self::utf8_str(Bytes::from_owner(b))
    }
}

/// jq's slice bounds: negative ones count from the end, the start is rounded down and the
/// end up, both clipped to the length. Returns (skip, take).
fn slice_bounds(range: val::Range<&Val>, len: usize) -> Result<(usize, usize), Error> {
    let bound = |b: Option<&Val>, default: f64| -> Result<f64, Error> {
        match b {
            None | Some(Val::Null) => Ok(default),
            Some(Val::Num(n)) => Ok(n.as_f64()),
            Some(other) => Err(fail(format_args!(
                "Start and end indices of an array slice must be numbers, not {}",
                described(other)
            ))),
        }
    };
    let len_f = len as f64;
    let clip = |mut x: f64, nan: f64| {
        if x.is_nan() {
            x = nan;
        }
        if x < 0.0 {
            x += len_f;
        }
        x.clamp(0.0, len_f)
    };
    let start = clip(bound(range.start, 0.0)?, 0.0).floor();
    let end = clip(bound(range.end, len_f)?, len_f).ceil().max(start);
    Ok((start as usize, (end - start) as usize))
}

/// The byte offsets of the `from`-th and `to`-th characters of `b`.
fn char_offsets(b: &[u8], from: usize, to: usize) -> (usize, usize) {
    let mut starts = b.char_indices().map(|(start, ..)| start).chain([b.len()]);
    let first = starts.nth(from).unwrap_or(b.len());
    let last = if to > from {
        starts.nth(to - from - 1).unwrap_or(b.len())
    } else {
        first
    };
    (first, last)
}

impl Val {
    /// Construct an object value.
    pub fn obj(m: Map) -> Self {
        Self::Obj(m.into())
    }

    /// Construct a string that is interpreted as UTF-8.
    pub fn utf8_str(s: impl Into<Bytes>) -> Self {
        Self::TStr(s.into().into())
    }

    /// Construct a string that is interpreted as bytes.
    pub fn byte_str(s: impl Into<Bytes>) -> Self {
        Self::BStr(s.into().into())
    }

    pub(crate) fn as_num(&self) -> Option<&Num> {
        match self {
            Self::Num(n) => Some(n),
            _ => None,
        }
    }

    pub(crate) fn index_opt(self, index: &Self) -> Result<Option<Val>, Error> {
        Ok(match (self, index) {
            (Val::Null, Val::TStr(_) | Val::BStr(_) | Val::Num(_) | Val::Null | Val::Obj(_)) => {
                None
            }
            (Val::Arr(a), Val::Num(i)) => i.as_index().and_then(|i| {
                let i = if i < 0 { i + a.len() as isize } else { i };
                usize::try_from(i).ok().and_then(|i| a.get(i).cloned())
            }),
            (Val::Arr(_), Val::Arr(y)) if y.is_empty() => None,
            (Val::Arr(x), Val::Arr(y)) => {
                let iw = x.windows(y.len()).enumerate();
                let indices = iw.filter_map(|(i, w)| (w == **y).then_some(i));
                Some(indices.map(Val::from).collect())
            }
            (Val::Obj(o), i @ (Val::TStr(_) | Val::BStr(_))) => o.get(i).cloned(),
            (v @ (Val::TStr(_) | Val::Arr(_)), Val::Obj(o)) => {
                use jaq_core::ValT;
                let start = o.get(&Val::utf8_str("start"));
                let end = o.get(&Val::utf8_str("end"));
                return v.range(start..end).map(Some);
            }
            (s, _) => return Err(cannot_index(&s, index)),
        })
    }
}

impl From<bool> for Val {
    fn from(b: bool) -> Self {
        Self::Bool(b)
    }
}

impl From<isize> for Val {
    /// Also integer literals of programs: those beyond a double's precision keep their digits.
    fn from(i: isize) -> Self {
        Self::Num(
            if (i as i64).unsigned_abs() <= crate::num::MAX_EXACT as u64 {
                Num::Int(i)
            } else {
                Num::Dec(Rc::new(i.to_string()))
            },
        )
    }
}

impl From<usize> for Val {
    fn from(i: usize) -> Self {
        match isize::try_from(i) {
            Ok(i) => Self::from(i),
            Err(_) => Self::Num(Num::Float(i as f64)),
        }
    }
}

impl From<f64> for Val {
    fn from(f: f64) -> Self {
        Self::Num(Num::float(f))
    }
}

impl From<String> for Val {
    fn from(s: String) -> Self {
        Self::utf8_str(Bytes::from_owner(s))
    }
}

impl From<val::Range<Val>> for Val {
    fn from(r: val::Range<Val>) -> Self {
        let kv = |(k, v): (&str, Option<_>)| v.map(|v| (k.to_owned().into(), v));
        let kvs = [("start", r.start), ("end", r.end)];
        Val::obj(kvs.into_iter().flat_map(kv).collect())
    }
}

impl FromIterator<Self> for Val {
    fn from_iter<T: IntoIterator<Item = Self>>(iter: T) -> Self {
        Self::Arr(Rc::new(iter.into_iter().collect()))
    }
}

fn cannot(l: &Val, r: &Val, what: &str) -> Error {
    fail(format_args!("{} and {} {what}", described(l), described(r)))
}

impl std::ops::Add for Val {
    type Output = ValR;
    fn add(self, rhs: Self) -> Self::Output {
        let concat_bytes = |l, r| {
            let mut buf = BytesMut::from(l);
            buf.put(r);
            buf
        };
        use Val::*;
        match (self, rhs) {
            // `null` is a neutral element for addition
            (Null, x) | (x, Null) => Ok(x),
            (Num(x), Num(y)) => Ok(Num(x + y)),
            (BStr(l), BStr(r)) => Ok(Val::byte_str(concat_bytes(*l, r))),
            (TStr(l), TStr(r)) => Ok(Val::utf8_str(concat_bytes(*l, r))),
            (Arr(mut l), Arr(r)) => {
                Rc::make_mut(&mut l).extend(r.iter().cloned());
                Ok(Arr(l))
            }
            (Obj(mut l), Obj(r)) => {
                Rc::make_mut(&mut l).extend(r.iter().map(|(k, v)| (k.clone(), v.clone())));
                Ok(Obj(l))
            }
            (l, r) => Err(cannot(&l, &r, "cannot be added")),
        }
    }
}

impl std::ops::Sub for Val {
    type Output = ValR;
    fn sub(self, rhs: Self) -> Self::Output {
        match (self, rhs) {
            (Self::Num(x), Self::Num(y)) => Ok(Self::Num(x - y)),
            (Self::Arr(mut l), Self::Arr(r)) => {
                Rc::make_mut(&mut l).retain(|x| !r.contains(x));
                Ok(Self::Arr(l))
            }
            (l, r) => Err(cannot(&l, &r, "cannot be subtracted")),
        }
    }
}

fn obj_merge(l: &mut Rc<Map>, r: Rc<Map>) {
    let l = Rc::make_mut(l);
    let r = rc_unwrap_or_clone(r).into_iter();
    r.for_each(|(k, v)| match (l.get_mut(&k), v) {
        (Some(Val::Obj(l)), Val::Obj(r)) => obj_merge(l, r),
        (Some(l), r) => *l = r,
        (None, r) => {
            l.insert(k, r);
        }
    });
}

/// jq's `"abc" * n`: null for a negative count (or NaN), else the string repeated `n`
/// times, rounded down.
fn repeat(s: &[u8], n: &Num, into: BytesValFn) -> ValR {
    let n = n.as_f64();
    if n.is_nan() || n < 0.0 {
        return Ok(Val::Null);
    }
    let count = n.floor();
    if count * s.len() as f64 > i32::MAX as f64 {
        return Err(fail("Repeat string result too long"));
    }
    Ok(into(Bytes::from(s.repeat(count as usize))))
}

impl std::ops::Mul for Val {
    type Output = ValR;
    fn mul(self, rhs: Self) -> Self::Output {
        use Val::*;
        match (self, rhs) {
            (Num(x), Num(y)) => Ok(Num(x * y)),
            (BStr(s), Num(n)) | (Num(n), BStr(s)) => repeat(&s, &n, Val::byte_str),
            (TStr(s), Num(n)) | (Num(n), TStr(s)) => repeat(&s, &n, Val::utf8_str),
            (Obj(mut l), Obj(r)) => {
                let too_deep = |o: &Rc<Map>| {
                    crate::funs::depth_exceeds(&Obj(o.clone()), crate::json_out::MAX_WRITE_DEPTH)
                };
                if too_deep(&l) || too_deep(&r) {
                    return Err(fail("Object merge too deep"));
                }
                obj_merge(&mut l, r);
                Ok(Obj(l))
            }
            (l, r) => Err(cannot(&l, &r, "cannot be multiplied")),
        }
    }
}

/// Split a string by a given separator string.
fn split<'a>(s: &'a [u8], sep: &'a [u8]) -> Box<dyn Iterator<Item = &'a [u8]> + 'a> {
    if s.is_empty() {
        Box::new(core::iter::empty())
    } else if sep.is_empty() {
        Box::new(s.char_indices().map(|(start, end, _)| &s[start..end]))
    } else {
        Box::new(s.split_str(sep))
    }
}

type BytesValFn = fn(Bytes) -> Val;

impl std::ops::Div for Val {
    type Output = ValR;
    fn div(self, rhs: Self) -> Self::Output {
        let fs = |x: Bytes, y: Bytes, into: BytesValFn| {
            split(&x, &y).map(|s| into(x.slice_ref(s))).collect()
        };
        match (self, rhs) {
            (l @ Self::Num(_), r @ Self::Num(Num::Int(0))) => Err(cannot(
                &l,
                &r,
                "cannot be divided because the divisor is zero",
            )),
            (Self::Num(x), Self::Num(y)) if y.as_f64() == 0.0 => Err(cannot(
                &Self::Num(x),
                &Self::Num(y),
                "cannot be divided because the divisor is zero",
            )),
            (Self::Num(x), Self::Num(y)) => Ok(Self::Num(x / y)),
            (Self::TStr(x), Self::TStr(y)) => Ok(fs(*x, *y, Val::utf8_str)),
            (Self::BStr(x), Self::BStr(y)) => Ok(fs(*x, *y, Val::byte_str)),
            (l, r) => Err(cannot(&l, &r, "cannot be divided")),
        }
    }
}

/// C's conversion of a double to an integer, saturating as jq's `dtoi` does.
fn dtoi(x: f64) -> i64 {
    // `as` saturates at the bounds, as jq's explicit checks do.
    x as i64
}

impl std::ops::Rem for Val {
    type Output = ValR;
    fn rem(self, rhs: Self) -> Self::Output {
        match (&self, &rhs) {
            (Self::Num(x), Self::Num(y)) => {
                if let (Num::Int(x), Num::Int(y)) = (x, y)
                    && *y != 0
                {
                    return Ok(Self::Num(Num::Int(x.checked_rem(*y).unwrap_or(0))));
                }
                let (x, y) = (x.as_f64(), y.as_f64());
                if x.is_nan() || y.is_nan() {
                    return Ok(Self::Num(Num::Float(f64::NAN)));
                }
                let divisor = dtoi(y);
                if divisor == 0 {
                    return Err(cannot(
                        &self,
                        &rhs,
                        "cannot be divided (remainder) because the divisor is zero",
                    ));
                }
                let r = if divisor == -1 { 0 } else { dtoi(x) % divisor };
                Ok(Self::Num(Num::float(r as f64)))
            }
            _ => Err(cannot(&self, &rhs, "cannot be divided (remainder)")),
        }
    }
}

impl std::ops::Neg for Val {
    type Output = ValR;
    fn neg(self) -> Self::Output {
        match self {
            Self::Num(n) => Ok(Self::Num(-n)),
            x => Err(fail(format_args!("{} cannot be negated", described(&x)))),
        }
    }
}

impl PartialOrd for Val {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Val {
    fn cmp(&self, other: &Self) -> Ordering {
        use Ordering::{Equal, Greater, Less};
        match (self, other) {
            (Self::Null, Self::Null) => Equal,
            (Self::Bool(x), Self::Bool(y)) => x.cmp(y),
            (Self::Num(x), Self::Num(y)) => x.cmp(y),
            (Self::BStr(x) | Self::TStr(x), Self::BStr(y) | Self::TStr(y)) => x.cmp(y),
            (Self::Arr(x), Self::Arr(y)) => x.cmp(y),
            (Self::Obj(x), Self::Obj(y)) => match (x.len(), y.len()) {
                (0, 0) => Equal,
                (0, _) => Less,
                (_, 0) => Greater,
                _ => {
                    let mut l: Vec<_> = x.iter().collect();
                    let mut r: Vec<_> = y.iter().collect();
                    l.sort_by_key(|(k, _v)| *k);
                    r.sort_by_key(|(k, _v)| *k);
                    let kl = l.iter().map(|(k, _v)| k);
                    let kr = r.iter().map(|(k, _v)| k);
                    let vl = l.iter().map(|(_k, v)| v);
                    let vr = r.iter().map(|(_k, v)| v);
                    kl.cmp(kr).then_with(|| vl.cmp(vr))
                }
            },
            (Self::Null, _) => Less,
            (_, Self::Null) => Greater,
            (Self::Bool(_), _) => Less,
            (_, Self::Bool(_)) => Greater,
            (Self::Num(_), _) => Less,
            (_, Self::Num(_)) => Greater,
            (Self::BStr(_) | Self::TStr(_), _) => Less,
            (_, Self::BStr(_) | Self::TStr(_)) => Greater,
            (Self::Arr(_), _) => Less,
            (_, Self::Arr(_)) => Greater,
        }
    }
}

impl PartialEq for Val {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Null, Self::Null) => true,
            (Self::Bool(x), Self::Bool(y)) => x == y,
            (Self::Num(x), Self::Num(y)) => x == y,
            (Self::BStr(x) | Self::TStr(x), Self::BStr(y) | Self::TStr(y)) => x == y,
            (Self::Arr(x), Self::Arr(y)) => x == y,
            (Self::Obj(x), Self::Obj(y)) => x == y,
            _ => false,
        }
    }
}

impl Eq for Val {}

impl Hash for Val {
    fn hash<H: Hasher>(&self, state: &mut H) {
        fn hash_with(u: u8, x: impl Hash, state: &mut impl Hasher) {
            state.write_u8(u);
            x.hash(state)
        }
        match self {
            Self::Num(n) => n.hash(state),
            Self::Null => state.write_u8(2),
            Self::Bool(b) => state.write_u8(if *b { 3 } else { 4 }),
            Self::BStr(b) | Self::TStr(b) => hash_with(5, b, state),
            Self::Arr(a) => hash_with(6, a, state),
            Self::Obj(o) => {
                state.write_u8(7);
                let mut kvs: Vec<_> = o.iter().collect();
                kvs.sort_by_key(|(k, _v)| *k);
                kvs.iter().for_each(|(k, v)| (k, v).hash(state));
            }
        }
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut json = Vec::new();
        crate::json_out::write_lossy(&mut json, self);
        f.write_str(&String::from_utf8_lossy(&json))
    }
}
