//! Reads JSON text (a record value, or the string `fromjson` parses) into a value.
//!
//! jaq's own reader (`jaq_json::read`) recurses once per level of nesting without a bound: one
//! record of 100,000 `[` overflowed the stack and aborted the processor, and its restart met the
//! same record again, for ever. It also accepts what JSON does not (`NaN`, `# comments`, `+1`,
//! `b"bytes"`), so such a record passed as JSON. This reader follows RFC 8259, refuses more
//! than [`MAX_DEPTH`] levels, and builds the values jaq's would: numbers keep their literal
//! (`1.10` stays `1.10`, a 30-digit integer all its digits), bytes that are not UTF-8 are kept
//! as they are. It also takes 0.55–0.7× the time on the benchmark record: it sizes each object
//! once instead of growing it key by key, copies a string without escapes in one piece, and
//! reads a short integer without a detour through text.

use crate::value::{Map, Num, Rc, Val};

/// Deeper text is refused, not read: every level costs stack in the reader, in jaq and in the
/// writer. jq 1.8 has the same limit ("Exceeds depth limit for parsing").
pub const MAX_DEPTH: usize = 10_000;

/// Why a value is not JSON: the byte offset where reading stopped, and what it expected there.
#[derive(Debug, PartialEq, Eq)]
pub struct NotJson {
    pub at: usize,
    pub expected: &'static str,
}

impl std::fmt::Display for NotJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at byte {}, expected {}", self.at, self.expected)
    }
}

/// Exactly one JSON value, with optional whitespace around it.
pub fn read(text: &[u8]) -> Result<Val, NotJson> {
    let mut reader = Reader { text, at: 0 };
    let value = reader.value(0)?;
    reader.skip_whitespace();
    if reader.at < text.len() {
        return Err(reader.expected("the end of the value"));
    }
    Ok(value)
}

struct Reader<'a> {
    text: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn expected(&self, expected: &'static str) -> NotJson {
        NotJson {
            at: self.at,
            expected,
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// The value after any whitespace; `depth` is how many arrays and objects enclose it.
    fn value(&mut self, depth: usize) -> Result<Val, NotJson> {
        self.skip_whitespace();
        // A byte order mark, which jq skips too.
        if depth == 0 && self.text[self.at..].starts_with("\u{feff}".as_bytes()) {
            self.at += 3;
            self.skip_whitespace();
        }
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Val::utf8_str),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'n') => self.word(b"null", Val::Null),
            Some(b't') => self.word(b"true", Val::Bool(true)),
            Some(b'f') => self.word(b"false", Val::Bool(false)),
            _ => Err(self.expected("a value")),
        }
    }

    fn word(&mut self, word: &[u8], value: Val) -> Result<Val, NotJson> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(self.expected("a value"))
        }
    }

    /// Steps over the opening bracket of an array or object `depth` levels deep.
    fn open(&mut self, depth: usize) -> Result<(), NotJson> {
        const _: () = assert!(MAX_DEPTH == 10_000, "the message below names the limit");
        if depth > MAX_DEPTH {
            return Err(self.expected(
                "at most 10000 levels of nested arrays and objects (Exceeds depth limit for parsing)",
            ));
        }
        self.at += 1;
        self.skip_whitespace();
        Ok(())
    }

    /// After an element: true at the closing `close`, false after a comma.
    fn next_or_close(&mut self, close: u8, expected: &'static str) -> Result<bool, NotJson> {
        self.skip_whitespace();
        match self.peek() {
            Some(b',') => {
                self.at += 1;
                Ok(false)
            }
            Some(c) if c == close => {
                self.at += 1;
                Ok(true)
            }
            _ => Err(self.expected(expected)),
        }
    }

    fn array(&mut self, depth: usize) -> Result<Val, NotJson> {
        self.open(depth)?;
        let mut items = Vec::new();
        if self.peek() == Some(b']') {
            self.at += 1;
        } else {
            loop {
                items.push(self.value(depth)?);
                if self.next_or_close(b']', "`,` or `]`")? {
                    break;
                }
            }
        }
        Ok(Val::Arr(Rc::new(items)))
    }

    fn object(&mut self, depth: usize) -> Result<Val, NotJson> {
        self.open(depth)?;
        let mut entries = Vec::new();
        if self.peek() == Some(b'}') {
            self.at += 1;
        } else {
            loop {
                self.skip_whitespace();
                if self.peek() != Some(b'"') {
                    return Err(self.expected("a string (an object key)"));
                }
                let key = Val::utf8_str(self.string()?);
                self.skip_whitespace();
                if self.peek() != Some(b':') {
                    return Err(self.expected("`:`"));
                }
                self.at += 1;
                entries.push((key, self.value(depth)?));
                if self.next_or_close(b'}', "`,` or `}`")? {
                    break;
                }
            }
        }
        // A repeated key keeps its first place and its last value, as in jaq.
        let mut object = Map::with_capacity_and_hasher(entries.len(), Default::default());
        object.extend(entries);
        Ok(Val::obj(object))
    }

    /// The string whose opening quote is at `self.at`, unescaped.
    fn string(&mut self) -> Result<Vec<u8>, NotJson> {
        let start = self.at + 1;
        let mut end = start;
        loop {
            match self.text.get(end) {
                Some(b'"') => {
                    self.at = end + 1;
                    return Ok(self.text[start..end].to_vec());
                }
                Some(b'\\') => break,
                Some(0x00..=0x1f) => return Err(self.control_character(end)),
                Some(_) => end += 1,
                None => return Err(self.unterminated(end)),
            }
        }
        let mut out = self.text[start..end].to_vec();
        self.at = end;
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => self.escape(&mut out)?,
                Some(0x00..=0x1f) => return Err(self.control_character(self.at)),
                Some(byte) => {
                    out.push(byte);
                    self.at += 1;
                }
                None => return Err(self.unterminated(self.at)),
            }
        }
    }

    fn control_character(&self, at: usize) -> NotJson {
        NotJson {
            at,
            expected: "no control character in a string (escape it)",
        }
    }

    fn unterminated(&self, at: usize) -> NotJson {
        NotJson {
            at,
            expected: "`\"` to end the string",
        }
    }

    /// The escape sequence at `self.at`, appended to `out` as UTF-8.
    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), NotJson> {
        self.at += 1;
        let unescaped = match self.peek() {
            Some(b'"') => b'"',
            Some(b'\\') => b'\\',
            Some(b'/') => b'/',
            Some(b'b') => 0x08,
            Some(b'f') => 0x0c,
            Some(b'n') => b'\n',
            Some(b'r') => b'\r',
            Some(b't') => b'\t',
            Some(b'u') => {
                let unit = self.hex4()?;
                let code = match unit {
                    0xd800..=0xdbff => {
                        if !self.text[self.at..].starts_with(b"\\u") {
                            return Err(self.expected("`\\u` and a low surrogate after a high one"));
                        }
                        self.at += 1;
                        let low = self.hex4()?;
                        if !(0xdc00..=0xdfff).contains(&low) {
                            return Err(self.expected("a low surrogate after a high one"));
                        }
                        0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
                    }
                    unit => unit,
                };
                let Some(character) = char::from_u32(code) else {
                    return Err(self.expected("a character, not a lone low surrogate"));
                };
                out.extend_from_slice(character.encode_utf8(&mut [0; 4]).as_bytes());
                return Ok(());
            }
            _ => return Err(self.expected("an escape: one of \"\\/bfnrt or u")),
        };
        out.push(unescaped);
        self.at += 1;
        Ok(())
    }

    /// The four hex digits after the `u` at `self.at`; leaves `self.at` after them.
    fn hex4(&mut self) -> Result<u32, NotJson> {
        let digits = self.text.get(self.at + 1..self.at + 5);
        let value = digits
            .and_then(|d| std::str::from_utf8(d).ok())
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|d| u32::from_str_radix(d, 16).ok());
        match value {
            Some(value) => {
                self.at += 5;
                Ok(value)
            }
            None => Err(NotJson {
                at: self.at + 1,
                expected: "four hex digits after `\\u`",
            }),
        }
    }

    fn number(&mut self) -> Result<Val, NotJson> {
        let start = self.at;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let integral = self.at;
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.expected("a digit")),
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.some_digits()?;
        }
        let digits = &self.text[integral..self.at];
        if integer && digits.len() <= 15 && !(negative && digits == b"0") {
            // Below 2^53 for sure: the common case, without a detour through text.
            let magnitude = digits
                .iter()
                .fold(0i64, |n, digit| n * 10 + i64::from(digit - b'0'));
            let value = if negative { -magnitude } else { magnitude };
            if let Ok(value) = isize::try_from(value) {
                return Ok(Val::Num(Num::Int(value)));
            }
        }
        // Only ASCII digits, signs, `.` and `e` were taken: always UTF-8.
        let literal = std::str::from_utf8(&self.text[start..self.at])
            .map_err(|_| self.expected("a number"))?;
        Ok(Val::Num(Num::from_literal(literal)))
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Result<(), NotJson> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.expected("a digit"));
        }
        self.digits();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What serde_json reads from our reading written back.
    fn round_trip(text: &[u8]) -> serde_json::Value {
        let mut out = Vec::new();
        crate::json_out::write(&mut out, &read(text).unwrap()).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    fn serde(text: &[u8]) -> serde_json::Value {
        serde_json::from_slice(text).unwrap()
    }

    fn written(text: &str) -> String {
        let mut out = Vec::new();
        crate::json_out::write(&mut out, &read(text.as_bytes()).unwrap()).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn reads_what_serde_json_reads() {
        for text in [
            "null",
            " true ",
            "false",
            "0",
            "-0",
            "-12",
            "999999999999999999",
            "-999999999999999999",
            "1000000000000000000",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775809",
            "123456789012345678901234567890",
            "-123456789012345678901234567890",
            "1.10",
            "-0.5e-7",
            "1E+3",
            r#""""#,
            r#""plain""#,
            r#""esc \" \\ \/ \b \f \n \r \t \u00e9 \ud83d\ude00 end""#,
            "\"é 😀\"",
            "[]",
            "{}",
            "[1, [2, [3]], {\"a\": []}]",
            "{\"a\": 1, \"b\": {\"c\": [true, null]}, \"a\": 2}",
            " \t\r\n{ \"k\" : \"v\" } \n",
        ] {
            assert_eq!(
                round_trip(text.as_bytes()),
                serde(text.as_bytes()),
                "{text}"
            );
        }
        // Literals keep their digits.
        assert_eq!(
            written("[1.10, 123456789012345678901234567890, -0]"),
            "[1.10,123456789012345678901234567890,-0]"
        );
        assert_eq!(
            written("\u{feff} 1"),
            "1",
            "a byte order mark is skipped, as in jq"
        );
    }

    #[test]
    fn keeps_bytes_that_are_not_utf8() {
        let text = b"\"\xff\xfe\"";
        assert_eq!(read(text), Ok(Val::utf8_str(&b"\xff\xfe"[..])));
    }

    #[test]
    fn refuses_what_json_does_not_allow() {
        for (text, at) in [
            ("", 0),
            ("   ", 3),
            ("NaN", 0),
            ("Infinity", 0),
            ("+1", 0),
            ("01", 1),
            ("1.", 2),
            (".5", 0),
            ("1e", 2),
            ("-", 1),
            ("nul", 0),
            ("[1,]", 3),
            ("[1 2]", 3),
            ("{\"a\" 1}", 5),
            ("{\"a\": 1,}", 8),
            ("{1: 2}", 1),
            ("{\"a\": 1", 7),
            ("\"open", 5),
            ("\"tab\there\"", 4),
            ("\"\\x\"", 2),
            ("\"\\u12\"", 3),
            ("\"\\ud83d\"", 7),
            ("\"\\ud83d\\u0041\"", 13),
            ("\"\\ude00\"", 7),
            ("1 2", 2),
            ("[1] # comment", 4),
            ("b\"bytes\"", 0),
        ] {
            let error = read(text.as_bytes()).unwrap_err();
            assert_eq!(error.at, at, "{text}: {error}");
        }
    }

    #[test]
    /// On a thread with a stack as large as the processor's processing thread has room for:
    /// the reader recurses once per level, up to the limit.
    fn deep_nesting_is_refused_not_a_crash() {
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn(|| {
                let nested = |depth: usize| "[".repeat(depth) + &"]".repeat(depth);
                assert!(read(nested(MAX_DEPTH).as_bytes()).is_ok());
                let error = read(nested(MAX_DEPTH + 1).as_bytes()).unwrap_err();
                assert_eq!(error.at, MAX_DEPTH, "{error}");
                // Deep enough to overflow the stack of a reader without the bound.
                assert!(read(nested(1_000_000).as_bytes()).is_err());
                let objects = "{\"a\":".repeat(MAX_DEPTH + 1) + "1" + &"}".repeat(MAX_DEPTH + 1);
                assert!(read(objects.as_bytes()).is_err());
            })
            .unwrap()
            .join()
            .unwrap();
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(serde_json::Value::from),
            any::<String>().prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                prop::collection::vec((any::<String>(), inner), 0..6).prop_map(|entries| {
                    serde_json::Value::Object(entries.into_iter().collect())
                }),
            ]
        })
    }

    /// Numbers by the value they denote: an integral literal written with an exponent
    /// (`1.6794268024627006e16`) reads as jq's integer where serde_json keeps a float.
    fn numbers_by_value(value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::Number(n) => {
                let exact = n
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| n.as_u64().map(i128::from))
                    .or_else(|| {
                        n.as_f64()
                            .filter(|x| x.fract() == 0.0 && x.abs() < 1e38)
                            .map(|x| x as i128)
                    });
                Value::String(match exact {
                    Some(i) => i.to_string(),
                    None => format!("{:e}", n.as_f64().unwrap_or(f64::NAN)),
                })
            }
            Value::Array(items) => Value::Array(items.into_iter().map(numbers_by_value).collect()),
            Value::Object(entries) => Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, numbers_by_value(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    proptest! {
        /// Any JSON serde_json writes, compact or pretty, reads as serde_json reads it.
        #[test]
        fn agrees_with_serde_json(value in json_value(), pretty in any::<bool>()) {
            let text = if pretty {
                serde_json::to_vec_pretty(&value).unwrap()
            } else {
                serde_json::to_vec(&value).unwrap()
            };
            // Compared with serde_json's reading of the same digits (it does not round every
            // literal correctly; the literal is kept, in decNumber's notation).
            prop_assert_eq!(numbers_by_value(round_trip(&text)), numbers_by_value(serde(&text)));
        }

        /// Cut or corrupted JSON is refused whenever serde_json refuses it, except bytes that
        /// are not UTF-8 in a string (kept as they are) and numbers beyond a double (kept as
        /// literals, as jq does).
        #[test]
        fn refuses_what_serde_json_refuses(value in json_value(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let mut text = serde_json::to_vec(&value).unwrap();
            let at = cut.index(text.len());
            text[at] = byte;
            let refused = serde_json::from_slice::<serde_json::Value>(&text)
                .is_err_and(|e| !e.to_string().contains("number out of range"));
            if refused && std::str::from_utf8(&text).is_ok() {
                prop_assert!(read(&text).is_err());
            }
        }
    }
}
