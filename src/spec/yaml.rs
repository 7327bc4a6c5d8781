//! A YAML document as a tree in which every node and every key knows its line and column.
//!
//! serde-style deserialisers report one error and lose the position of keys, but validation
//! must report every problem of a file at the exact key (SPEC §3). So step files are parsed
//! into this spanned tree first and mapped onto typed structs afterwards (`spec::step`).
//!
//! Step files are deliberately plain YAML: anchors, aliases, tags and several documents in one
//! file are rejected with a syntax error instead of being half-supported.

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Span};

/// Nesting deeper than this is rejected: no step file needs it, and it keeps hostile input
/// from exhausting the stack when the tree is dropped.
const MAX_DEPTH: usize = 64;

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    fn of(span: &Span) -> Pos {
        Pos {
            line: saturating_u32(span.start.line()),
            column: saturating_u32(span.start.col() + 1),
        }
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub pos: Pos,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Scalar(Scalar),
    Sequence(Vec<Node>),
    Mapping(Vec<Entry>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub text: String,
    /// Plain (unquoted) scalars may be numbers, booleans or null; quoted ones are strings.
    pub plain: bool,
    pub style: Style,
    /// Where the scalar is written, as character indices into the file (end exclusive): what
    /// [`position_in_scalar`] maps positions inside `text` back through.
    pub span: (usize, usize),
}

/// How a scalar is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Plain,
    SingleQuoted,
    DoubleQuoted,
    /// `|`
    Literal,
    /// `>`
    Folded,
}

impl Scalar {
    pub fn is_null(&self) -> bool {
        self.plain && matches!(self.text.as_str(), "" | "~" | "null" | "Null" | "NULL")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub key_pos: Pos,
    pub value: Node,
}

impl Node {
    /// What the node is, for "expected X, found Y" messages.
    pub fn type_name(&self) -> &'static str {
        match &self.value {
            Value::Scalar(s) if s.is_null() => "null",
            Value::Scalar(s) if s.plain && s.text.parse::<f64>().is_ok() => "a number",
            Value::Scalar(s) if s.plain && matches!(s.text.as_str(), "true" | "false") => {
                "a boolean"
            }
            Value::Scalar(_) => "a string",
            Value::Sequence(_) => "a list",
            Value::Mapping(_) => "a mapping",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub pos: Pos,
    pub message: String,
}

impl SyntaxError {
    fn at(span: &Span, message: impl Into<String>) -> Self {
        SyntaxError {
            pos: Pos::of(span),
            message: message.into(),
        }
    }

    fn scan(err: &ScanError) -> Self {
        SyntaxError {
            pos: Pos {
                line: saturating_u32(err.marker().line()),
                column: saturating_u32(err.marker().col() + 1),
            },
            message: err.info().to_owned(),
        }
    }
}

/// A collection being built while its children are parsed.
enum Open {
    Sequence(Pos, Vec<Node>),
    /// Entries so far, and the key waiting for its value.
    Mapping(Pos, Vec<Entry>, Option<(String, Pos)>),
}

/// Parses one YAML document. An empty document (or one holding only comments) is `None`.
pub fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Open> = Vec::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;

    while let Some(event) = parser.next_event() {
        let (event, span) = event.map_err(|e| SyntaxError::scan(&e))?;
        let complete = match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => None,
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(SyntaxError::at(
                        &span,
                        "a second YAML document (`---`): a step file holds exactly one step",
                    ));
                }
                None
            }
            Event::Alias(_) => {
                return Err(SyntaxError::at(
                    &span,
                    "aliases (`*name`) are not supported",
                ));
            }
            Event::Scalar(text, style, anchor, tag) => {
                reject_anchor_and_tag(anchor, tag.is_some(), &span)?;
                Some(Node {
                    pos: Pos::of(&span),
                    value: Value::Scalar(Scalar {
                        text: text.into_owned(),
                        plain: style == ScalarStyle::Plain,
                        style: match style {
                            ScalarStyle::SingleQuoted => Style::SingleQuoted,
                            ScalarStyle::DoubleQuoted => Style::DoubleQuoted,
                            ScalarStyle::Literal => Style::Literal,
                            ScalarStyle::Folded => Style::Folded,
                            ScalarStyle::Plain => Style::Plain,
                        },
                        span: (span.start.index(), span.end.index()),
                    }),
                })
            }
            Event::SequenceStart(anchor, tag) => {
                reject_anchor_and_tag(anchor, tag.is_some(), &span)?;
                open(
                    &mut stack,
                    Open::Sequence(Pos::of(&span), Vec::new()),
                    &span,
                )?;
                None
            }
            Event::MappingStart(anchor, tag) => {
                reject_anchor_and_tag(anchor, tag.is_some(), &span)?;
                open(
                    &mut stack,
                    Open::Mapping(Pos::of(&span), Vec::new(), None),
                    &span,
                )?;
                None
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Open::Sequence(pos, items)) => Some(Node {
                    pos,
                    value: Value::Sequence(items),
                }),
                Some(Open::Mapping(pos, entries, None)) => Some(Node {
                    pos,
                    value: Value::Mapping(entries),
                }),
                // The parser balances start and end events; anything else is malformed input.
                Some(Open::Mapping(_, _, Some(_))) | None => {
                    return Err(SyntaxError::at(&span, "unbalanced collection"));
                }
            },
        };
        if let Some(node) = complete {
            attach(&mut stack, &mut root, node)?;
        }
    }
    Ok(root)
}

/// Where in the file the character at `offset` (counted in characters) of a scalar's value
/// is written: positions inside a value (a SQL query's error, say) are reported where the
/// user wrote them, through quotes, escapes, folded lines and block indentation.
///
/// The value's characters are matched in order against the characters written; anything
/// that does not match (a style this misreads) gives `None`, and the caller falls back to
/// the value's start.
pub fn position_in_scalar(source: &str, node: &Node, offset: usize) -> Option<Pos> {
    let Value::Scalar(scalar) = &node.value else {
        return None;
    };
    let (start, end) = scalar.span;
    let written: Vec<char> = source
        .chars()
        .skip(start)
        .take(end.saturating_sub(start))
        .collect();
    let mut cursor = Cursor {
        chars: &written,
        at: 0,
        pos: node.pos,
    };
    // Quoted scalars' spans include the opening quote; block scalars' start at their content.
    if matches!(scalar.style, Style::SingleQuoted | Style::DoubleQuoted) {
        cursor.advance(1);
    }
    let double = scalar.style == Style::DoubleQuoted;
    let single = scalar.style == Style::SingleQuoted;
    for (index, wanted) in scalar.text.chars().enumerate() {
        // Find where `wanted` is written, and how many characters write it.
        let width = loop {
            let c = cursor.peek(0)?;
            if double && c == '\\' {
                match escape(&written[cursor.at + 1..]) {
                    // `\` at the end of a line joins it to the next: nothing of the value.
                    Escape::LineJoin(len) => {
                        cursor.advance(1 + len);
                        continue;
                    }
                    Escape::Char(decoded, len) if decoded == wanted => break 1 + len,
                    Escape::Char(decoded, len) if decoded.is_whitespace() => {
                        cursor.advance(1 + len);
                        continue;
                    }
                    _ => return None,
                }
            }
            if wanted.is_whitespace() && c.is_whitespace() {
                break 1;
            }
            if c.is_whitespace() {
                // Indentation, or a line break the value folded away.
                cursor.advance(1);
                continue;
            }
            if single && c == '\'' && wanted == '\'' && cursor.peek(1) == Some('\'') {
                break 2;
            }
            if c == wanted {
                break 1;
            }
            return None;
        };
        if index == offset {
            return Some(cursor.pos);
        }
        cursor.advance(width);
    }
    // Just past the value's end.
    (offset == scalar.text.chars().count()).then_some(cursor.pos)
}

struct Cursor<'a> {
    chars: &'a [char],
    at: usize,
    pos: Pos,
}

impl Cursor<'_> {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn advance(&mut self, n: usize) {
        for _ in 0..n {
            match self.peek(0) {
                Some('\n') => {
                    self.pos.line += 1;
                    self.pos.column = 1;
                }
                Some(_) => self.pos.column += 1,
                None => return,
            }
            self.at += 1;
        }
    }
}

enum Escape {
    /// The character an escape stands for, and how many characters follow the backslash.
    Char(char, usize),
    /// A backslash before a line break, and the line break with the next line's indentation.
    LineJoin(usize),
    Unknown,
}

/// The escape sequence after a backslash of a double-quoted scalar (YAML 1.2, 5.7).
fn escape(after: &[char]) -> Escape {
    let Some(&first) = after.first() else {
        return Escape::Unknown;
    };
    let simple = match first {
        '0' => '\0',
        'a' => '\u{7}',
        'b' => '\u{8}',
        't' | '\t' => '\t',
        'n' => '\n',
        'v' => '\u{b}',
        'f' => '\u{c}',
        'r' => '\r',
        'e' => '\u{1b}',
        ' ' => ' ',
        '"' => '"',
        '/' => '/',
        '\\' => '\\',
        'N' => '\u{85}',
        '_' => '\u{a0}',
        'L' => '\u{2028}',
        'P' => '\u{2029}',
        'x' | 'u' | 'U' => {
            let digits = match first {
                'x' => 2,
                'u' => 4,
                _ => 8,
            };
            let hex: String = after.iter().skip(1).take(digits).collect();
            return u32::from_str_radix(&hex, 16)
                .ok()
                .filter(|_| hex.len() == digits)
                .and_then(char::from_u32)
                .map_or(Escape::Unknown, |c| Escape::Char(c, 1 + digits));
        }
        '\n' | '\r' => {
            let indent = after[1..]
                .iter()
                .take_while(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
                .count();
            return Escape::LineJoin(1 + indent);
        }
        _ => return Escape::Unknown,
    };
    Escape::Char(simple, 1)
}

fn reject_anchor_and_tag(anchor: usize, tagged: bool, span: &Span) -> Result<(), SyntaxError> {
    if anchor != 0 {
        return Err(SyntaxError::at(span, "anchors (`&name`) are not supported"));
    }
    if tagged {
        return Err(SyntaxError::at(span, "tags (`!tag`) are not supported"));
    }
    Ok(())
}

fn open(stack: &mut Vec<Open>, collection: Open, span: &Span) -> Result<(), SyntaxError> {
    if stack.len() >= MAX_DEPTH {
        return Err(SyntaxError::at(
            span,
            format!("nesting deeper than {MAX_DEPTH} levels"),
        ));
    }
    stack.push(collection);
    Ok(())
}

/// Hands a finished node to the collection that contains it, or makes it the document root.
fn attach(stack: &mut [Open], root: &mut Option<Node>, node: Node) -> Result<(), SyntaxError> {
    match stack.last_mut() {
        None => *root = Some(node),
        Some(Open::Sequence(_, items)) => items.push(node),
        Some(Open::Mapping(_, entries, pending)) => match pending.take() {
            Some((key, key_pos)) => entries.push(Entry {
                key,
                key_pos,
                value: node,
            }),
            None => {
                let Value::Scalar(scalar) = node.value else {
                    return Err(SyntaxError {
                        pos: node.pos,
                        message: "mapping keys must be plain strings".into(),
                    });
                };
                if let Some(first) = entries.iter().find(|e| e.key == scalar.text) {
                    return Err(SyntaxError {
                        pos: node.pos,
                        message: format!(
                            "duplicate key `{}` (first defined at line {})",
                            scalar.text, first.key_pos.line
                        ),
                    });
                }
                *pending = Some((scalar.text, node.pos));
            }
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(node: &Node) -> &[Entry] {
        match &node.value {
            Value::Mapping(entries) => entries,
            other => panic!("expected a mapping, got {other:?}"),
        }
    }

    #[test]
    fn keys_and_values_carry_their_positions() {
        let doc = parse("kind: processor\ninput:\n  - a\n  - b\n")
            .unwrap()
            .unwrap();
        let entries = map(&doc);
        assert_eq!(entries[0].key, "kind");
        assert_eq!(entries[0].key_pos, Pos { line: 1, column: 1 });
        assert_eq!(entries[0].value.pos, Pos { line: 1, column: 7 });
        assert_eq!(entries[1].key_pos, Pos { line: 2, column: 1 });
        let Value::Sequence(items) = &entries[1].value.value else {
            panic!("input is a list")
        };
        assert_eq!(items[1].pos, Pos { line: 4, column: 5 });
    }

    #[test]
    fn empty_and_comment_only_documents_are_none() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# nothing here\n").unwrap(), None);
    }

    #[test]
    fn quoted_scalars_are_not_plain() {
        let doc = parse("a: '6'\nb: 6\nc:\n").unwrap().unwrap();
        let entries = map(&doc);
        assert_eq!(entries[0].value.type_name(), "a string");
        assert_eq!(entries[1].value.type_name(), "a number");
        assert_eq!(entries[2].value.type_name(), "null");
    }

    #[test]
    fn duplicate_keys_are_errors_at_the_second_key() {
        let err = parse("kind: source\ntopic: a\nkind: sink\n").unwrap_err();
        assert_eq!(err.pos, Pos { line: 3, column: 1 });
        assert!(
            err.message.contains("duplicate key `kind`"),
            "{}",
            err.message
        );
        assert!(err.message.contains("line 1"), "{}", err.message);
    }

    #[test]
    fn second_documents_anchors_aliases_and_tags_are_rejected() {
        for (text, needle) in [
            ("kind: source\n---\nkind: sink\n", "second YAML document"),
            ("a: &x 1\nb: *x\n", "anchors"),
            ("a: !!str 1\n", "tags"),
            ("? [a]\n: 1\n", "plain strings"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.message.contains(needle), "{text:?}: {}", err.message);
        }
    }

    #[test]
    fn syntax_errors_point_at_the_problem() {
        let err = parse("kind: source\ntopic: [a, b\n").unwrap_err();
        assert!(err.pos.line >= 2, "{err:?}");
    }

    /// The character written at `pos` of `text`.
    fn char_at(text: &str, pos: Pos) -> Option<char> {
        let line = text.split('\n').nth(usize::try_from(pos.line).ok()? - 1)?;
        line.chars().nth(usize::try_from(pos.column).ok()? - 1)
    }

    #[test]
    fn positions_inside_values_map_back_to_where_they_are_written() {
        let docs = [
            "sql: SELECT id FROM t WHERE x > 'a'\n",
            "sql: 'SELECT id, ''it''''s'' FROM t'\n",
            r#"sql: "SELECT\tid,\n  \"q\" FROM \x74 \u00e9\
    WHERE \\ x"
"#,
            "sql: SELECT id\n  FROM t\n\n  WHERE x\n",
            "kind: processor\nsql: |\n  SELECT id,\n     speed\n  FROM t  # not a comment\n  WHERE x > 1\nnext: 1\n",
            "sql: >-\n    SELECT id\n    FROM t\n\n    WHERE x\n",
            "sql: |2- # a comment\n   SELECT € FROM t\n",
            "sql: \"SELECT id\n  FROM t\"\n",
        ];
        for doc in docs {
            let root = parse(doc).unwrap().unwrap();
            let entry = map(&root).iter().find(|e| e.key == "sql").unwrap();
            let Value::Scalar(scalar) = &entry.value.value else {
                panic!()
            };
            let chars: Vec<char> = scalar.text.chars().collect();
            for (offset, c) in chars.iter().enumerate() {
                let pos = position_in_scalar(doc, &entry.value, offset).unwrap_or_else(|| {
                    panic!("{doc:?}: offset {offset} ({c:?}) of {:?}", scalar.text)
                });
                if c.is_whitespace() {
                    continue;
                }
                let written = char_at(doc, pos);
                assert!(
                    written == Some(*c) || written == Some('\\'),
                    "{doc:?}: offset {offset} ({c:?}) at {pos:?} is {written:?}"
                );
            }
            assert!(position_in_scalar(doc, &entry.value, chars.len()).is_some());
            assert!(position_in_scalar(doc, &entry.value, chars.len() + 1).is_none());
        }
        let doc = "sql: |\n  SELECT\n  FROM t\n";
        let root = parse(doc).unwrap().unwrap();
        let value = &map(&root)[0].value;
        assert_eq!(
            position_in_scalar(doc, value, 7),
            Some(Pos { line: 3, column: 3 })
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        // Either the parser's own recursion limit or ours answers; neither may panic.
        for depth in [MAX_DEPTH + 1, 100_000] {
            let text = "[".repeat(depth);
            assert!(parse(&text).is_err(), "depth {depth}");
        }
        // Every way YAML nests, up to the size of the largest step file accepted (1 MiB).
        let shapes = [
            "{a: ".repeat(250_000),
            "- ".repeat(500_000),
            "a:\n".to_owned() + &"  - ".repeat(250_000),
            "? ".repeat(500_000),
            (0..1_400)
                .map(|depth| format!("{}a:\n", " ".repeat(depth)))
                .collect(),
        ];
        for text in shapes {
            let err = parse(&text).unwrap_err();
            assert!(
                err.message.contains("nesting deeper than")
                    || err.message.contains("recursion limit"),
                "{}…: {}",
                &text[..20],
                err.message
            );
        }
    }
}
