//! Numbers as jq 1.8 has them: arithmetic in doubles, literals kept as written.
//!
//! Adapted from jaq-json's `Num` (MIT, Michael Färber; see `LICENSE-jaq`). jaq computes with
//! integers of any size; jq computes with doubles, so `9007199254740993 + 0` is
//! `9007199254740992` in jq, and programs written for jq expect that. What jq 1.8 keeps is the
//! literal: a number that passes through unchanged is written with all its digits, and two
//! literals compare as decimals.
//!
//! - [`Num::Int`]: an integer that a double holds exactly (|n| ≤ 2^53), the common case, kept
//!   as an integer so that indexing and counting stay cheap.
//! - [`Num::Float`]: a computed double.
//! - [`Num::Dec`]: any other literal (`1.10`, `100000000000000000000001`, `1E+1000`).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

/// The largest integer up to which doubles hold every integer.
pub const MAX_EXACT: i64 = 1 << 53;

#[derive(Clone, Debug)]
pub enum Num {
    Int(isize),
    Float(f64),
    Dec(Rc<String>),
}

impl Num {
    /// A number literal (JSON or jq syntax: `1`, `-0.5`, `1e3`, `.5`).
    pub fn from_literal(text: &str) -> Self {
        if !text.contains(['.', 'e', 'E'])
            && let Ok(i) = text.parse::<i64>()
            && i.unsigned_abs() <= MAX_EXACT as u64
            && let Ok(i) = isize::try_from(i)
            // `-0` is a double's negative zero, as in jq.
            && text != "-0"
        {
            return Num::Int(i);
        }
        Num::Dec(Rc::new(text.to_owned()))
    }

    /// A computed double; integral ones small enough become [`Num::Int`].
    pub fn float(x: f64) -> Self {
        if x.fract() == 0.0 && x.abs() <= MAX_EXACT as f64 && !(x == 0.0 && x.is_sign_negative()) {
            Num::Int(x as isize)
        } else {
            Num::Float(x)
        }
    }

    fn int_or_float(i: Option<isize>, exact: impl FnOnce() -> f64) -> Self {
        match i {
            Some(i) if (i as i64).unsigned_abs() <= MAX_EXACT as u64 => Num::Int(i),
            _ => Num::Float(exact()),
        }
    }

    pub fn is_int(&self) -> bool {
        match self {
            Num::Int(_) => true,
            Num::Float(f) => f.fract() == 0.0,
            Num::Dec(_) => self.as_f64().fract() == 0.0,
        }
    }

    pub fn as_isize(&self) -> Option<isize> {
        match self {
            Num::Int(i) => Some(*i),
            _ => {
                let f = self.as_f64();
                (f.fract() == 0.0 && f.abs() < 9.2e18).then_some(f as isize)
            }
        }
    }

    /// jq's conversion of a number to an index or count: the double, truncated.
    pub fn as_index(&self) -> Option<isize> {
        match self {
            Num::Int(i) => Some(*i),
            _ => {
                let f = self.as_f64();
                if f.is_nan() {
                    None
                } else {
                    // Saturates: `as` clamps infinities to the bounds.
                    Some(f.floor() as isize)
                }
            }
        }
    }

    pub fn as_f64(&self) -> f64 {
        match self {
            Num::Int(i) => *i as f64,
            Num::Float(f) => *f,
            // Only literals the readers accepted are here; all of them parse.
            Num::Dec(d) => d.parse().unwrap_or(f64::NAN),
        }
    }

    pub fn is_nan(&self) -> bool {
        matches!(self, Num::Float(f) if f.is_nan())
    }

    /// jq's `length` and `abs` of a number: the literal keeps its digits.
    pub fn abs(&self) -> Self {
        match self {
            Num::Int(i) => Num::Int(i.abs()),
            Num::Float(f) => Num::Float(f.abs()),
            Num::Dec(d) => match d.strip_prefix('-') {
                Some(positive) => Num::Dec(Rc::new(positive.to_owned())),
                None => self.clone(),
            },
        }
    }

    /// The literal's digits as a decimal: (negative, significant digits, exponent of the
    /// last digit), or `None` for a computed double.
    fn decimal(&self) -> Option<Decimal> {
        match self {
            Num::Int(i) => Some(Decimal::of(&i.to_string())),
            Num::Dec(d) => Some(Decimal::of(d)),
            Num::Float(_) => None,
        }
    }
}

/// A decimal number as its significant digits.
#[derive(PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: String,
    /// The power of ten of the last digit.
    exponent: i64,
}

impl Decimal {
    fn of(literal: &str) -> Self {
        let negative = literal.starts_with('-');
        let literal = literal.trim_start_matches(['-', '+']);
        let (mantissa, exponent) = match literal.find(['e', 'E']) {
            Some(at) => (
                &literal[..at],
                literal[at + 1..].parse::<i64>().unwrap_or(0),
            ),
            None => (literal, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let all = format!("{int}{frac}");
        let trimmed = all.trim_start_matches('0');
        let digits = trimmed.trim_end_matches('0');
        if digits.is_empty() {
            return Decimal {
                negative: false,
                digits: String::new(),
                exponent: 0,
            };
        }
        let exponent = exponent - frac.len() as i64 + (trimmed.len() - digits.len()) as i64;
        Decimal {
            negative,
            digits: digits.to_owned(),
            exponent,
        }
    }

    fn cmp_magnitude(&self, other: &Self) -> Ordering {
        // The power of ten of the first digit decides, then the digits themselves.
        let top = |d: &Decimal| d.exponent + d.digits.len() as i64;
        match (self.digits.is_empty(), other.digits.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        top(self).cmp(&top(other)).then_with(|| {
            let n = self.digits.len().max(other.digits.len());
            let pad = |d: &Decimal| format!("{:0<n$}", d.digits);
            pad(self).cmp(&pad(other))
        })
    }

    fn cmp(&self, other: &Self) -> Ordering {
        let sign = |d: &Decimal| {
            if d.digits.is_empty() {
                0
            } else if d.negative {
                -1
            } else {
                1
            }
        };
        match sign(self).cmp(&sign(other)) {
            Ordering::Equal if sign(self) < 0 => other.cmp_magnitude(self),
            Ordering::Equal => self.cmp_magnitude(other),
            unequal => unequal,
        }
    }
}

impl std::ops::Add for Num {
    type Output = Num;
    fn add(self, rhs: Self) -> Num {
        match (&self, &rhs) {
            (Num::Int(x), Num::Int(y)) => {
                Num::int_or_float(x.checked_add(*y), || *x as f64 + *y as f64)
            }
            _ => Num::float(self.as_f64() + rhs.as_f64()),
        }
    }
}

impl std::ops::Sub for Num {
    type Output = Num;
    fn sub(self, rhs: Self) -> Num {
        match (&self, &rhs) {
            (Num::Int(x), Num::Int(y)) => {
                Num::int_or_float(x.checked_sub(*y), || *x as f64 - *y as f64)
            }
            _ => Num::float(self.as_f64() - rhs.as_f64()),
        }
    }
}

impl std::ops::Mul for Num {
    type Output = Num;
    fn mul(self, rhs: Self) -> Num {
        match (&self, &rhs) {
            (Num::Int(x), Num::Int(y)) => {
                Num::int_or_float(x.checked_mul(*y), || *x as f64 * *y as f64)
            }
            _ => Num::float(self.as_f64() * rhs.as_f64()),
        }
    }
}

impl std::ops::Div for Num {
    type Output = Num;
    fn div(self, rhs: Self) -> Num {
        Num::float(self.as_f64() / rhs.as_f64())
    }
}

impl std::ops::Neg for Num {
    type Output = Num;
    fn neg(self) -> Num {
        match self {
            Num::Int(0) => Num::Float(-0.0),
            Num::Int(x) => Num::Int(-x),
            Num::Float(x) => Num::Float(-x),
            Num::Dec(d) => match d.strip_prefix('-') {
                Some(positive) => Num::Dec(Rc::new(positive.to_owned())),
                None => Num::Dec(Rc::new(format!("-{d}"))),
            },
        }
    }
}

impl PartialEq for Num {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Num {}

impl PartialOrd for Num {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Num {
    /// As jq: two literals as decimals, anything else as doubles, NaN below every number.
    fn cmp(&self, other: &Self) -> Ordering {
        if let (Num::Int(x), Num::Int(y)) = (self, other) {
            return x.cmp(y);
        }
        // An integer may have been computed: against a literal it compares as a double.
        if let (Num::Dec(_), Num::Dec(_)) = (self, other)
            && let (Some(x), Some(y)) = (self.decimal(), other.decimal())
        {
            return x.cmp(&y);
        }
        let (x, y) = (self.as_f64(), other.as_f64());
        if x.is_nan() {
            Ordering::Less
        } else if y.is_nan() {
            Ordering::Greater
        } else {
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
    }
}

impl Hash for Num {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Equal numbers have equal doubles; all NaNs hash alike (they are unequal anyway).
        state.write_u8(0);
        let f = self.as_f64();
        if f == 0.0 {
            0.0f64.to_bits().hash(state)
        } else if !f.is_nan() {
            f.to_bits().hash(state)
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut out = Vec::new();
        write(&mut out, self);
        f.write_str(&String::from_utf8_lossy(&out))
    }
}

/// Writes a number as jq 1.8 does: a literal canonically (as decNumber prints it: `1.10`,
/// `1E+1000`), a double with the shortest digits that read back the same, in jq's layout
/// (`3`, `1e+17`, `1e-05`, `0.0001`), NaN as `null` and infinities as the largest doubles.
pub fn write(out: &mut Vec<u8>, number: &Num) {
    match number {
        Num::Int(i) => out.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes()),
        Num::Dec(literal) => write_literal(out, literal),
        Num::Float(x) if x.is_nan() => out.extend_from_slice(b"null"),
        Num::Float(x) => write_double(out, x.clamp(f64::MIN, f64::MAX)),
    }
}

fn write_double(out: &mut Vec<u8>, x: f64) {
    if x == 0.0 {
        out.extend_from_slice(if x.is_sign_negative() { b"-0" } else { b"0" });
        return;
    }
    // ryu gives the shortest digits; jq lays them out as David Gay's g_fmt does.
    let mut buffer = ryu::Buffer::new();
    let shortest = buffer.format_finite(x);
    let d = Decimal::of(shortest);
    let digits = d.digits.as_bytes();
    // The position of the decimal point relative to the first digit (dtoa's `decpt`).
    let decpt = d.exponent + digits.len() as i64;
    if d.negative {
        out.push(b'-');
    }
    if decpt <= -4 || decpt > digits.len() as i64 + 15 {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        let e = decpt - 1;
        out.push(if e < 0 { b'-' } else { b'+' });
        if e.abs() < 10 {
            out.push(b'0');
        }
        out.extend_from_slice(itoa::Buffer::new().format(e.abs()).as_bytes());
    } else if decpt <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-decpt) as usize));
        out.extend_from_slice(digits);
    } else if decpt as usize >= digits.len() {
        out.extend_from_slice(digits);
        out.extend(std::iter::repeat_n(b'0', decpt as usize - digits.len()));
    } else {
        out.extend_from_slice(&digits[..decpt as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[decpt as usize..]);
    }
}

/// A literal as decNumber's to-scientific-string writes it: the digits as written, in plain
/// notation unless the exponent is positive or the number is smaller than 1E-6.
fn write_literal(out: &mut Vec<u8>, literal: &str) {
    // Most literals (`42.5`, a long integer) are already in that form: written as they are.
    let unsigned = literal.strip_prefix('-').unwrap_or(literal);
    let tiny = unsigned.starts_with("0.000000");
    if !tiny && !literal.contains(['e', 'E', '+']) && !unsigned.starts_with("00") {
        out.extend_from_slice(literal.as_bytes());
        return;
    }
    let negative = literal.starts_with('-');
    let body = literal.trim_start_matches(['-', '+']);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => (&body[..at], body[at + 1..].parse::<i64>().unwrap_or(0)),
        None => (body, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int}{frac}");
    let coefficient = match all.trim_start_matches('0') {
        "" => "0",
        digits => digits,
    };
    let exponent = exponent - frac.len() as i64;
    let adjusted = exponent + coefficient.len() as i64 - 1;
    if negative {
        out.push(b'-');
    }
    if exponent <= 0 && adjusted >= -6 {
        let point = coefficient.len() as i64 + exponent;
        if point > 0 {
            let point = point as usize;
            out.extend_from_slice(&coefficient.as_bytes()[..point]);
            if point < coefficient.len() {
                out.push(b'.');
                out.extend_from_slice(&coefficient.as_bytes()[point..]);
            }
        } else {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-point) as usize));
            out.extend_from_slice(coefficient.as_bytes());
        }
    } else {
        out.push(coefficient.as_bytes()[0]);
        if coefficient.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&coefficient.as_bytes()[1..]);
        }
        out.push(b'E');
        out.push(if adjusted < 0 { b'-' } else { b'+' });
        out.extend_from_slice(itoa::Buffer::new().format(adjusted.abs()).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(n: Num) -> String {
        let mut out = Vec::new();
        write(&mut out, &n);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn doubles_are_written_as_jq_writes_them() {
        for (x, jq) in [
            (3.0, "3"),
            (0.5, "0.5"),
            (1e17, "1e+17"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000"),
            (12345678901234567.0, "12345678901234568"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e300, "1.5e+300"),
            (-2.5e-7, "-2.5e-07"),
            (f64::INFINITY, "1.7976931348623157e+308"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(written(Num::Float(x)), jq, "{x}");
        }
    }

    #[test]
    fn literals_are_written_as_decnumber_writes_them() {
        for (literal, jq) in [
            ("1.10", "1.10"),
            ("100000000000000000000001", "100000000000000000000001"),
            ("1E1000", "1E+1000"),
            ("-1e+1000", "-1E+1000"),
            ("1.5e3", "1.5E+3"),
            ("0.0000001", "1E-7"),
            ("0.000001", "0.000001"),
            ("1e-2", "0.01"),
            (
                "0.12345678901234567890123456789",
                "0.12345678901234567890123456789",
            ),
        ] {
            assert_eq!(written(Num::from_literal(literal)), jq, "{literal}");
        }
    }

    #[test]
    fn literals_compare_as_decimals_and_compute_as_doubles() {
        let big = Num::from_literal("13911860366432393");
        assert_ne!(big, Num::from_literal("13911860366432392"));
        assert_eq!(big, Num::from_literal("1.3911860366432393e16"));
        assert_eq!(
            written(big - Num::Int(10)),
            "13911860366432382",
            "computed in doubles"
        );
        assert_eq!(
            Num::Int(9007199254740992) + Num::Int(1),
            Num::Float(9007199254740992.0)
        );
        assert_eq!(Num::from_literal("1.5"), Num::from_literal("15e-1"));
        assert!(Num::Float(f64::NAN) < Num::Int(-5));
    }
}
