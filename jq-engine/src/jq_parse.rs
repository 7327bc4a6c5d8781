//! The message jq 1.8's parser (`jv_parse.c`, MIT) gives for text it refuses, for `fromjson`.
//!
//! Values are read by [`crate::json_in`]; this is asked only when that refuses a text, so that
//! a program catching the error sees jq's words and jq's place (`… at line 1, column 4 (while
//! parsing '…')`). It follows jq's scanner byte by byte: jq reports an error where its
//! state machine meets it, which is not always where a recursive reader does (a bad literal
//! is found at the delimiter after it), so only a replay of that machine gives its place.

use crate::json_in::MAX_DEPTH;

/// jq's message for `text`, or `None` when jq reads it (ours is stricter: `nan` in an array,
/// `01`, `+1`, `.5`, `Infinity`).
pub fn error(text: &[u8]) -> Option<String> {
    let message = first_error(text)?;
    Some(format!("{message} (while parsing '{}')", quoted(text)))
}

/// At most this much of the text is quoted in the message.
const QUOTED_MAX: usize = 100;

/// The text as the message quotes it: whole, as jq does, up to [`QUOTED_MAX`] bytes; longer,
/// cut at a character with `...`, since a record's string can be megabytes and the message
/// travels on (dead letters, logs).
fn quoted(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    if text.len() <= QUOTED_MAX {
        return text.into_owned();
    }
    let mut end = QUOTED_MAX - "...".len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// `jv_parse_sized`: one value, and nothing after it but white space.
fn first_error(text: &[u8]) -> Option<String> {
    let text = match text.iter().zip(BOM).take_while(|(a, b)| a == b).count() {
        3 => &text[3..],
        0 => text,
        n if n == text.len() => &text[n..],
        _ => return Some("Malformed BOM".into()),
    };
    let mut parser = Parser::default();
    let mut at = 0;
    match parser.next(text, &mut at) {
        Err(message) => Some(message),
        Ok(false) => Some("Expected JSON value".into()),
        Ok(true) => match parser.next(text, &mut at) {
            Err(message) => Some(message),
            Ok(true) => Some("Unexpected extra JSON values".into()),
            Ok(false) => None,
        },
    }
}

/// What the parser holds open (`p->stack`): the key of an object is pushed over it.
#[derive(Clone, Copy)]
enum Open {
    Array { empty: bool },
    Object { empty: bool },
    Key,
}

/// The value that was just completed (`p->next`): whether it is a string matters for keys.
#[derive(Clone, Copy, PartialEq)]
enum Next {
    Str,
    Other,
}

#[derive(Clone, Copy, PartialEq, Default)]
enum State {
    #[default]
    Normal,
    Str,
    Escape,
}

type Step = Result<(), &'static str>;

struct Parser {
    stack: Vec<Open>,
    next: Option<Next>,
    token: Vec<u8>,
    state: State,
    line: usize,
    column: usize,
    eof: bool,
}

impl Default for Parser {
    fn default() -> Self {
        Parser {
            stack: Vec::new(),
            next: None,
            token: Vec::new(),
            state: State::Normal,
            line: 1,
            column: 0,
            eof: false,
        }
    }
}

impl Parser {
    /// `jv_parser_next`: `Ok(true)` when a value was completed, `Ok(false)` at the end with
    /// none.
    fn next(&mut self, text: &[u8], at: &mut usize) -> Result<bool, String> {
        if self.eof {
            return Ok(false);
        }
        while let Some(&ch) = text.get(*at) {
            *at += 1;
            match self.scan(ch) {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(message) => {
                    return Err(format!(
                        "{message} at line {}, column {}",
                        self.line, self.column
                    ));
                }
            }
        }
        self.eof = true;
        let (line, column) = (self.line, self.column);
        if self.state != State::Normal {
            return Err(format!(
                "Unfinished string at EOF at line {line}, column {column}"
            ));
        }
        if let Err(message) = self.check_literal() {
            return Err(format!("{message} at EOF at line {line}, column {column}"));
        }
        if !self.stack.is_empty() {
            return Err(format!(
                "Unfinished JSON term at EOF at line {line}, column {column}"
            ));
        }
        Ok(self.next.take().is_some())
    }

    /// `scan`: one byte; `Ok(true)` when it completed a value at the top.
    fn scan(&mut self, ch: u8) -> Result<bool, &'static str> {
        self.column += 1;
        if ch == b'\n' {
            self.line += 1;
            self.column = 0;
        }
        let mut done = false;
        if self.state == State::Normal {
            let literal = !matches!(
                ch,
                b' ' | b'\t' | b'\r' | b'\n' | b'"' | b'[' | b',' | b']' | b'{' | b':' | b'}'
            );
            if !literal {
                self.check_literal()?;
                done |= self.check_done();
            }
            match ch {
                b' ' | b'\t' | b'\r' | b'\n' => {}
                b'"' => self.state = State::Str,
                b'[' | b',' | b']' | b'{' | b':' | b'}' => self.structure(ch)?,
                _ => self.token.push(ch),
            }
            done |= self.check_done();
        } else if ch == b'"' && self.state == State::Str {
            self.found_string()?;
            self.state = State::Normal;
            done |= self.check_done();
        } else {
            self.token.push(ch);
            self.state = if ch == b'\\' && self.state == State::Str {
                State::Escape
            } else {
                State::Str
            };
        }
        Ok(done)
    }

    /// `parse_check_done`: a completed value at the top is taken.
    fn check_done(&mut self) -> bool {
        self.stack.is_empty() && self.next.take().is_some()
    }

    /// `value`: a completed value, which must not follow another.
    fn value(&mut self, next: Next) -> Step {
        if self.next.is_some() {
            return Err("Expected separator between values");
        }
        self.next = Some(next);
        Ok(())
    }

    /// The object under the key on top of the stack is no longer empty.
    fn pop_key(&mut self) {
        self.stack.pop();
        if let Some(Open::Object { empty }) = self.stack.last_mut() {
            *empty = false;
        }
    }

    /// `parse_token`.
    fn structure(&mut self, ch: u8) -> Step {
        match ch {
            b'[' | b'{' => {
                if self.stack.len() >= MAX_DEPTH {
                    return Err("Exceeds depth limit for parsing");
                }
                if self.next.is_some() {
                    return Err("Expected separator between values");
                }
                self.stack.push(if ch == b'[' {
                    Open::Array { empty: true }
                } else {
                    Open::Object { empty: true }
                });
            }
            b':' => {
                let Some(next) = self.next else {
                    return Err("Expected string key before ':'");
                };
                if !matches!(self.stack.last(), Some(Open::Object { .. })) {
                    return Err("':' not as part of an object");
                }
                if next != Next::Str {
                    return Err("Object keys must be strings");
                }
                self.stack.push(Open::Key);
                self.next = None;
            }
            b',' => {
                if self.next.is_none() {
                    return Err("Expected value before ','");
                }
                match self.stack.last_mut() {
                    None => return Err("',' not as part of an object or array"),
                    Some(Open::Array { empty }) => *empty = false,
                    Some(Open::Key) => self.pop_key(),
                    Some(Open::Object { .. }) => {
                        return Err("Objects must consist of key:value pairs");
                    }
                }
                self.next = None;
            }
            b']' => {
                let Some(Open::Array { empty }) = self.stack.last() else {
                    return Err("Unmatched ']'");
                };
                if self.next.is_none() && !empty {
                    return Err("Expected another array element");
                }
                self.stack.pop();
                self.next = Some(Next::Other);
            }
            _ => {
                if self.stack.is_empty() {
                    return Err("Unmatched '}'");
                }
                if self.next.is_some() {
                    if !matches!(self.stack.last(), Some(Open::Key)) {
                        return Err("Objects must consist of key:value pairs");
                    }
                    self.pop_key();
                } else {
                    match self.stack.last() {
                        Some(Open::Object { empty: true }) => {}
                        Some(Open::Object { empty: false }) => {
                            return Err("Expected another key-value pair");
                        }
                        _ => return Err("Unmatched '}'"),
                    }
                }
                self.stack.pop();
                self.next = Some(Next::Other);
            }
        }
        Ok(())
    }

    /// `found_string`: the escapes of the string just closed, and no raw control characters.
    fn found_string(&mut self) -> Step {
        let text = std::mem::take(&mut self.token);
        let mut i = 0;
        while let Some(&c) = text.get(i) {
            i += 1;
            if c == b'\\' {
                let Some(&c) = text.get(i) else {
                    return Err("Expected escape character at end of string");
                };
                i += 1;
                match c {
                    b'\\' | b'"' | b'/' | b'b' | b'f' | b't' | b'n' | b'r' => {}
                    b'u' => {
                        let Some(hex) = text.get(i..i + 4) else {
                            return Err("Invalid \\uXXXX escape");
                        };
                        let Some(unit) = unhex4(hex) else {
                            return Err("Invalid characters in \\uXXXX escape");
                        };
                        i += 4;
                        if (0xD800..=0xDBFF).contains(&unit) {
                            let low = match text.get(i..i + 6) {
                                Some([b'\\', b'u', hex @ ..]) => unhex4(hex),
                                _ => None,
                            };
                            if !low.is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) {
                                return Err("Invalid \\uXXXX\\uXXXX surrogate pair escape");
                            }
                            i += 6;
                        }
                    }
                    _ => return Err("Invalid escape"),
                }
            } else if c <= 0x1F {
                return Err(
                    "Invalid string: control characters from U+0000 through U+001F must be escaped",
                );
            }
        }
        self.value(Next::Str)
    }

    /// `check_literal`: the bare word just ended, `true`, `false`, `null` or a number.
    fn check_literal(&mut self) -> Step {
        let Some(&first) = self.token.first() else {
            return Ok(());
        };
        let pattern: Option<&[u8]> = match first {
            b't' => Some(b"true"),
            b'f' => Some(b"false"),
            b'\'' => return Err("Invalid string literal; expected \", but got '"),
            // Else it may be `nan`, a number to jq.
            b'n' if self.token.get(1) == Some(&b'u') => Some(b"null"),
            _ => None,
        };
        match pattern {
            Some(pattern) if self.token != pattern => return Err("Invalid literal"),
            None if !is_number(&self.token) => return Err("Invalid numeric literal"),
            _ => self.value(Next::Other)?,
        }
        self.token.clear();
        Ok(())
    }
}

fn unhex4(hex: &[u8]) -> Option<u32> {
    let hex = std::str::from_utf8(hex).ok()?;
    u32::from_str_radix(hex, 16)
        .ok()
        .filter(|_| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What jq 1.8 reads as a number (decNumber's syntax, less NaNs with a payload): a sign, then
/// digits with at most one `.` and an exponent, or `Inf`, `Infinity`, `NaN`, `sNaN`.
fn is_number(token: &[u8]) -> bool {
    let unsigned = token.strip_prefix(b"+").or(token.strip_prefix(b"-"));
    let word = unsigned.unwrap_or(token).to_ascii_lowercase();
    if word == b"inf" || word == b"infinity" {
        return true;
    }
    if let Some(payload) = word.strip_prefix(b"nan").or(word.strip_prefix(b"snan")) {
        // A payload other than zero is refused ("NaN1"); its digits must be digits.
        return payload.iter().all(u8::is_ascii_digit) && payload.iter().all(|&b| b == b'0');
    }
    let (mantissa, exponent) = match word.iter().position(|&b| b == b'e') {
        Some(e) => (&word[..e], Some(&word[e + 1..])),
        None => (&word[..], None),
    };
    let mut parts = mantissa.splitn(2, |&b| b == b'.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next().unwrap_or_default();
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    let mantissa_ok = digits(whole) && digits(fraction) && whole.len() + fraction.len() > 0;
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(b"+").or(e.strip_prefix(b"-")).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str) -> Option<String> {
        first_error(text.as_bytes())
    }

    #[test]
    fn messages_and_places_are_jqs() {
        let cases = [
            ("NaN1", "Invalid numeric literal at EOF at line 1, column 4"),
            (
                "{'a': 123}",
                "Invalid string literal; expected \", but got ' at line 1, column 5",
            ),
            ("\"\\v\"", "Invalid escape at line 1, column 4"),
            ("[1,2", "Unfinished JSON term at EOF at line 1, column 4"),
            ("[1,]", "Expected another array element at line 1, column 4"),
            (
                "{\"a\":1,}",
                "Expected another key-value pair at line 1, column 8",
            ),
            (
                "{\"a\"}",
                "Objects must consist of key:value pairs at line 1, column 5",
            ),
            ("{1:2}", "Object keys must be strings at line 1, column 3"),
            (
                "[1 2]",
                "Expected separator between values at line 1, column 5",
            ),
            ("1]", "Unmatched ']' at line 1, column 2"),
            ("tru", "Invalid literal at EOF at line 1, column 3"),
            ("nul ", "Invalid literal at line 1, column 4"),
            ("[\n  x]", "Invalid numeric literal at line 2, column 4"),
            ("\"abc", "Unfinished string at EOF at line 1, column 4"),
            (
                "\"\\ud800\"",
                "Invalid \\uXXXX\\uXXXX surrogate pair escape at line 1, column 8",
            ),
            (
                "\"a\u{1}\"",
                "Invalid string: control characters from U+0000 through U+001F must be escaped at line 1, column 4",
            ),
            ("", "Expected JSON value"),
            ("  ", "Expected JSON value"),
            ("1 2", "Unexpected extra JSON values"),
            ("1 [", "Unfinished JSON term at EOF at line 1, column 3"),
            ("\u{feff}", "Expected JSON value"),
        ];
        for (text, expected) in cases {
            assert_eq!(message(text).as_deref(), Some(expected), "{text:?}");
        }
        assert_eq!(first_error(b"\xEF\xBB1").as_deref(), Some("Malformed BOM"));
        let deep = "[".repeat(MAX_DEPTH + 1);
        assert_eq!(
            message(&deep).as_deref(),
            Some("Exceeds depth limit for parsing at line 1, column 10001")
        );
    }

    #[test]
    fn what_jq_reads_is_no_error() {
        for text in [
            "NaN",
            "-nan",
            "[nan]",
            "01",
            "+1",
            ".5",
            "1.",
            "1e5",
            "-Infinity",
            "NaN0",
            "[]",
            "{}",
            "{\"a\":[1,{\"b\":null}]}",
            " true ",
            "\u{feff}1",
        ] {
            assert_eq!(message(text), None, "{text:?}");
        }
        for text in ["1e", "e5", "1.2.3", "--1", "NaN1", "Infx", "."] {
            assert!(!is_number(text.as_bytes()), "{text:?}");
        }
    }

    #[test]
    fn the_text_follows_the_message() {
        assert_eq!(
            error(b"NaN1").as_deref(),
            Some("Invalid numeric literal at EOF at line 1, column 4 (while parsing 'NaN1')")
        );
    }
}
