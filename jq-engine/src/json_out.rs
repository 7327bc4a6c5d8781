//! Writes values as compact JSON bytes, straight into a buffer.
//!
//! jaq's own writer goes through `fmt` for every token (a quarter of the processor's CPU in a
//! profile of `--jq .`), and it prints what JSON cannot express (`NaN`, byte strings,
//! non-string keys) as jaq literals. A record value must be JSON its readers can parse, so this
//! writer follows jq instead: NaN is `null`, infinities are the largest finite doubles, numbers
//! are laid out as jq lays them out (`num::write`), byte strings are written as
//! strings, and a non-string object key is an error.
//!
//! Values nested deeper than [`MAX_DEPTH`] levels (which only a program can build: inputs are
//! refused deeper) are an error, not a recursion as deep as the value.

use crate::json_in::MAX_DEPTH;
use crate::value::Val;

/// An output that has no JSON form.
#[derive(Debug, PartialEq, Eq)]
pub struct NotJson(pub String);

/// How deep values are written: one level more than is read, as jq writes them.
pub const MAX_WRITE_DEPTH: usize = MAX_DEPTH + 1;

/// Writes `value` as JSON, or fails where it has no JSON form (nested too deep, a key that
/// is not a string).
pub fn write(out: &mut Vec<u8>, value: &Val) -> Result<(), NotJson> {
    write_nested(out, value, 0, false)
}

/// Writes `value` as jq's `tojson` does: what is nested too deep is written as
/// `<skipped: too deep>`, so the result is not JSON then. For messages and `tostring`.
pub fn write_lossy(out: &mut Vec<u8>, value: &Val) {
    // Cannot fail when lossy.
    let _ = write_nested(out, value, 0, true);
}

/// Writes `value`, which `depth` arrays and objects enclose.
fn write_nested(out: &mut Vec<u8>, value: &Val, depth: usize, lossy: bool) -> Result<(), NotJson> {
    if matches!(value, Val::Arr(_) | Val::Obj(_)) && depth == MAX_WRITE_DEPTH {
        if lossy {
            out.extend_from_slice(b"<skipped: too deep>");
            return Ok(());
        }
        return Err(NotJson(format!(
            "it is nested more than {MAX_WRITE_DEPTH} levels deep"
        )));
    }
    match value {
        Val::Null => out.extend_from_slice(b"null"),
        Val::Bool(true) => out.extend_from_slice(b"true"),
        Val::Bool(false) => out.extend_from_slice(b"false"),
        Val::Num(number) => crate::num::write(out, number),
        Val::TStr(bytes) | Val::BStr(bytes) => write_string(out, bytes),
        Val::Arr(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_nested(out, item, depth + 1, lossy)?;
            }
            out.push(b']');
        }
        Val::Obj(entries) => {
            out.push(b'{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match key {
                    Val::TStr(key) | Val::BStr(key) => write_string(out, key),
                    _ if lossy => {
                        let mut text = Vec::new();
                        write_nested(&mut text, key, depth + 1, true)?;
                        write_string(out, &text);
                    }
                    _ => {
                        let mut text = Vec::new();
                        write_lossy(&mut text, key);
                        return Err(NotJson(format!(
                            "the object key {} is not a string",
                            String::from_utf8_lossy(&text)
                        )));
                    }
                }
                out.push(b':');
                write_nested(out, item, depth + 1, lossy)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// A string's bytes between quotes, with JSON's escapes. Bytes that are not UTF-8 are kept as
/// they are rather than replaced: the record carries what the input carried.
fn write_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    let mut plain_from = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f | 0x7f => &[],
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain_from..at]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        plain_from = at + 1;
    }
    out.extend_from_slice(&bytes[plain_from..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(input: &str) -> String {
        let value = crate::json_in::read(input.as_bytes()).unwrap();
        let mut out = Vec::new();
        write(&mut out, &value).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_round_trip_compactly() {
        for (input, expected) in [
            ("null", "null"),
            ("[true, false]", "[true,false]"),
            (
                r#"{"a": 1, "b": [1.10, -2, 1.5e300, 12345678901234567890123]}"#,
                r#"{"a":1,"b":[1.10,-2,1.5E+300,12345678901234567890123]}"#,
            ),
            (
                r#""tab\t quote\" back\\ nl\n bell\u0007 del\u007f é \ud83d\ude00""#,
                "\"tab\\t quote\\\" back\\\\ nl\\n bell\\u0007 del\\u007f é 😀\"",
            ),
            ("{}", "{}"),
            ("[]", "[]"),
        ] {
            let written = json(input);
            assert_eq!(written, expected, "{input}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&written).is_ok(),
                "{written} is not JSON"
            );
        }
    }

    #[test]
    fn non_json_numbers_follow_jq() {
        let mut out = Vec::new();
        write(
            &mut out,
            &Val::Arr(std::rc::Rc::new(vec![
                Val::from(f64::NAN),
                Val::from(f64::INFINITY),
                Val::from(f64::NEG_INFINITY),
                Val::from(0.5),
            ])),
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[null,1.7976931348623157e+308,-1.7976931348623157e+308,0.5]"
        );
    }

    #[test]
    fn values_deeper_than_the_limit_are_an_error() {
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn(deeper_than_the_limit)
            .unwrap()
            .join()
            .unwrap();
    }

    fn deeper_than_the_limit() {
        let nested = |depth: usize| {
            (0..depth).fold(Val::Null, |inner, _| {
                Val::Arr(std::rc::Rc::new(vec![inner]))
            })
        };
        let mut out = Vec::new();
        write(&mut out, &nested(MAX_WRITE_DEPTH)).unwrap();
        assert_eq!(out.len(), 2 * MAX_WRITE_DEPTH + 4);
        let error = write(&mut Vec::new(), &nested(MAX_WRITE_DEPTH + 1)).unwrap_err();
        assert!(error.0.contains("10001 levels"), "{}", error.0);
        let mut lossy = Vec::new();
        write_lossy(&mut lossy, &nested(MAX_WRITE_DEPTH + 1));
        let lossy = String::from_utf8(lossy).unwrap();
        assert!(lossy.contains("[<skipped: too deep>]"), "as jq writes it");
    }

    #[test]
    fn a_non_string_key_is_an_error() {
        let object = Val::obj([(Val::from(1isize), Val::Null)].into_iter().collect());
        let error = write(&mut Vec::new(), &object).unwrap_err();
        assert!(error.0.contains("not a string"), "{}", error.0);
    }
}
