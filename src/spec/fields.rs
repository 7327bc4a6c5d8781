//! Reading typed values out of the spanned YAML tree, reporting every problem at its key.
//!
//! Each getter reports what is wrong and returns `None`, so one pass over a file collects all
//! of its errors instead of stopping at the first.

use crate::diagnostic::{Code, Diagnostic};
use crate::spec::yaml::{Entry, Node, Pos, Value};

/// A value and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located<T> {
    pub value: T,
    pub pos: Pos,
}

/// Where findings of one file go.
pub struct Report<'a> {
    pub file: &'a str,
    pub diagnostics: &'a mut Vec<Diagnostic>,
}

impl Report<'_> {
    pub fn error(&mut self, code: Code, pos: Pos, message: impl Into<String>) {
        self.diagnostics
            .push(Diagnostic::error(code, self.file, Some(pos), message));
    }

    pub fn warning(&mut self, code: Code, pos: Pos, message: impl Into<String>) {
        self.diagnostics
            .push(Diagnostic::warning(code, self.file, Some(pos), message));
    }

    fn wrong_type(&mut self, entry: &Entry, expected: &str) {
        self.error(
            Code::InvalidValue,
            entry.key_pos,
            format!(
                "`{}` must be {expected}, found {}",
                entry.key,
                entry.value.type_name()
            ),
        );
    }
}

/// The entries of a YAML mapping, looked up by key.
#[derive(Clone, Copy)]
pub struct Fields<'n> {
    pub entries: &'n [Entry],
}

impl<'n> Fields<'n> {
    /// The mapping's fields, or an `invalid-value` error naming what it should have been.
    pub fn of(node: &'n Node, what: &str, at: Pos, report: &mut Report) -> Option<Self> {
        match &node.value {
            Value::Mapping(entries) => Some(Fields { entries }),
            _ => {
                report.error(
                    Code::InvalidValue,
                    at,
                    format!("{what} must be a mapping, found {}", node.type_name()),
                );
                None
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<&'n Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// Reports each key not in `allowed`, suggesting the closest known key.
    pub fn reject_unknown(&self, allowed: &[&str], what: &str, report: &mut Report) {
        for entry in self.entries {
            if allowed.contains(&entry.key.as_str()) {
                continue;
            }
            let hint = closest(&entry.key, allowed.iter().copied())
                .map(|k| format!("did you mean `{k}`?"))
                .unwrap_or_else(|| format!("expected one of: {}", allowed.join(", ")));
            report.error(
                Code::UnknownField,
                entry.key_pos,
                format!("unknown field `{}` in {what}; {hint}", entry.key),
            );
        }
    }
}

/// The candidate most like `word`, if any is close enough to be a likely typo.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (strsim::jaro_winkler(word, candidate), candidate))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

/// Any non-null scalar, as written. (`topic: 123` is the topic named "123".)
pub fn string(entry: &Entry, report: &mut Report) -> Option<Located<String>> {
    match &entry.value.value {
        Value::Scalar(s) if !s.is_null() => Some(Located {
            value: s.text.clone(),
            pos: entry.value.pos,
        }),
        _ => {
            report.wrong_type(entry, "a string");
            None
        }
    }
}

/// An unquoted integer within `range`.
pub fn integer(
    entry: &Entry,
    range: std::ops::RangeInclusive<u64>,
    report: &mut Report,
) -> Option<u64> {
    let parsed = match &entry.value.value {
        Value::Scalar(s) if s.plain => s.text.parse::<u64>().ok(),
        _ => None,
    };
    match parsed {
        Some(n) if range.contains(&n) => Some(n),
        Some(n) => {
            report.error(
                Code::InvalidValue,
                entry.key_pos,
                format!(
                    "`{}` must be between {} and {}, found {n}",
                    entry.key,
                    range.start(),
                    range.end()
                ),
            );
            None
        }
        None => {
            report.wrong_type(entry, "a whole number");
            None
        }
    }
}

/// One string or a list of them (`input: a` or `input: [a, b]`), each with its own position.
pub fn one_or_many(entry: &Entry, report: &mut Report) -> Vec<Located<String>> {
    let items: Vec<&Node> = match &entry.value.value {
        Value::Sequence(items) => items.iter().collect(),
        _ => vec![&entry.value],
    };
    let items_were_empty = items.is_empty();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match &item.value {
            Value::Scalar(s) if !s.is_null() => out.push(Located {
                value: s.text.clone(),
                pos: item.pos,
            }),
            _ => report.error(
                Code::InvalidValue,
                item.pos,
                format!(
                    "`{}` takes step names, found {}",
                    entry.key,
                    item.type_name()
                ),
            ),
        }
    }
    if items_were_empty {
        report.error(
            Code::InvalidValue,
            entry.key_pos,
            format!("`{}` must name at least one step", entry.key),
        );
    }
    out
}

/// A list of strings (`command: [python3, enrich.py]`).
pub fn string_list(entry: &Entry, report: &mut Report) -> Option<Vec<String>> {
    let Value::Sequence(items) = &entry.value.value else {
        report.wrong_type(entry, "a list of strings");
        return None;
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match &item.value {
            Value::Scalar(s) if !s.is_null() => out.push(s.text.clone()),
            _ => {
                report.error(
                    Code::InvalidValue,
                    item.pos,
                    format!(
                        "`{}` must be a list of strings, found {} in it",
                        entry.key,
                        item.type_name()
                    ),
                );
                return None;
            }
        }
    }
    Some(out)
}

/// One of a fixed set of words.
pub fn choice<'c>(entry: &Entry, choices: &[&'c str], report: &mut Report) -> Option<&'c str> {
    let text = match &entry.value.value {
        Value::Scalar(s) => Some(s.text.as_str()),
        _ => None,
    };
    match text.and_then(|t| choices.iter().find(|c| **c == t)) {
        Some(choice) => Some(choice),
        None => {
            report.error(
                Code::InvalidValue,
                entry.key_pos,
                format!(
                    "`{}` must be one of {}, found {}",
                    entry.key,
                    choices.join(" | "),
                    text.map(|t| format!("`{t}`"))
                        .unwrap_or_else(|| entry.value.type_name().to_owned())
                ),
            );
            None
        }
    }
}
