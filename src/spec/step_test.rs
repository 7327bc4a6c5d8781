//! Step tests (`<step>.test.yaml` beside `<step>.yaml`): cases of one input record and the
//! outputs expected of it, or the dead-letter kind it must get. Read and checked like step
//! files, every problem at its line; run by `plumber test` (`crate::steptest`).
//!
//! ```yaml
//! cases:
//!   - name: a fast car passes
//!     input: { key: car-1, value: { speed: 30 }, headers: { trace: t1 } }
//!     output:
//!       - { key: car-1, value: { speed: 30 } }
//!   - name: text is dead-lettered
//!     input: { raw: "not json" }
//!     deadLetter: invalid-json
//! ```

use serde_json::Value as Json;

use super::fields::{self, Fields, Report};
use super::yaml::{Node, Pos, Value};
use crate::diagnostic::Code;

/// The tests of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTests {
    /// The test file's path.
    pub file: String,
    /// The step it tests: the file's name without `.test.yaml`.
    pub step: String,
    pub cases: Vec<Case>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub name: String,
    pub pos: Pos,
    /// Its input records, in order: one (`input:`) or several (`inputs:`, for a step that
    /// keeps state between records).
    pub inputs: Vec<TestRecord>,
    pub expect: Expect,
}

/// What a case expects of its input.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// These outputs, in order (none: the record is filtered out).
    Outputs(Vec<TestRecord>),
    /// The record is dead-lettered with this kind (`invalid-json`, `jq-error`, …).
    DeadLetter(String),
}

/// A record of a test: its value as JSON, or raw text that need not be JSON; a key and
/// headers where given (an expected output's absent key or headers are not compared).
#[derive(Debug, Clone, PartialEq)]
pub struct TestRecord {
    pub key: Option<String>,
    pub value: RecordValue,
    pub headers: Option<Vec<(String, String)>>,
    /// The input step it comes from, for a step with several (`sql` with UNION ALL); `None`:
    /// the step's first input.
    pub from: Option<String>,
    /// An input's Kafka timestamp, ms since the epoch: a stateful step keeps time by it.
    pub timestamp: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RecordValue {
    Json(Json),
    Raw(String),
}

impl RecordValue {
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            RecordValue::Json(json) => json.to_string().into_bytes(),
            RecordValue::Raw(text) => text.clone().into_bytes(),
        }
    }
}

/// Whether `path` is a step test file rather than a step file.
pub fn is_test_file(path: &str) -> bool {
    path.ends_with(".test.yaml") || path.ends_with(".test.yml")
}

/// The step a test file tests.
pub fn step_of(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.strip_suffix(".test.yaml")
        .or_else(|| file.strip_suffix(".test.yml"))
        .unwrap_or(file)
}

/// The most cases a file may hold: tests run in review, bounded like everything a commit
/// makes the daemon do.
pub const MAX_CASES: usize = 1_000;

/// The most input records one case may hold.
pub const MAX_CASE_INPUTS: usize = 1_000;

/// Reads a test file's parsed YAML; `None` when it has errors (reported).
pub fn read(file: &str, root: Option<&Node>, report: &mut Report) -> Option<StepTests> {
    let start = Pos { line: 1, column: 1 };
    let Some(root) = root else {
        report.error(
            Code::MissingField,
            start,
            "a step test file has `cases:`, a list of cases (docs/step-tests.md)",
        );
        return None;
    };
    let top = Fields::of(root, "a step test file", root.pos, report)?;
    top.reject_unknown(&["cases"], "a step test file", report);
    let Some(entry) = top.get("cases") else {
        report.error(
            Code::MissingField,
            root.pos,
            "missing `cases`: a list of cases, each with `name`, `input` and `output` or `deadLetter`",
        );
        return None;
    };
    let Value::Sequence(items) = &entry.value.value else {
        report.error(
            Code::InvalidValue,
            entry.key_pos,
            format!("`cases` must be a list, found {}", entry.value.type_name()),
        );
        return None;
    };
    if items.len() > MAX_CASES {
        report.error(
            Code::InvalidValue,
            entry.key_pos,
            format!(
                "{} cases; a file holds at most {MAX_CASES}: split the tests",
                items.len()
            ),
        );
        return None;
    }
    let before = report.diagnostics.len();
    let mut cases = Vec::with_capacity(items.len());
    let mut names = std::collections::BTreeSet::new();
    for item in items {
        if let Some(case) = case(item, report) {
            if !names.insert(case.name.clone()) {
                report.error(
                    Code::InvalidValue,
                    case.pos,
                    format!(
                        "a second case named `{}`; names tell cases apart",
                        case.name
                    ),
                );
            }
            cases.push(case);
        }
    }
    (report.diagnostics.len() == before).then(|| StepTests {
        file: file.to_owned(),
        step: step_of(file).to_owned(),
        cases,
    })
}

fn case(node: &Node, report: &mut Report) -> Option<Case> {
    let fields = Fields::of(node, "a case", node.pos, report)?;
    fields.reject_unknown(
        &["name", "input", "inputs", "output", "deadLetter"],
        "a case",
        report,
    );
    let name = match fields.get("name") {
        Some(entry) => fields::string(entry, report)?.value,
        None => {
            report.error(Code::MissingField, node.pos, "a case needs a `name`");
            return None;
        }
    };
    let inputs = match (fields.get("input"), fields.get("inputs")) {
        (Some(entry), None) => vec![record(&entry.value, true, report)?],
        (None, Some(entry)) => {
            let Value::Sequence(items) = &entry.value.value else {
                report.error(
                    Code::InvalidValue,
                    entry.key_pos,
                    format!(
                        "`inputs` is a list of records, found {}",
                        entry.value.type_name()
                    ),
                );
                return None;
            };
            if items.is_empty() || items.len() > MAX_CASE_INPUTS {
                report.error(
                    Code::InvalidValue,
                    entry.key_pos,
                    format!(
                        "`inputs` holds 1 to {MAX_CASE_INPUTS} records, not {}",
                        items.len()
                    ),
                );
                return None;
            }
            items
                .iter()
                .map(|item| record(item, true, report))
                .collect::<Option<Vec<_>>>()?
        }
        (Some(_), Some(entry)) => {
            report.error(
                Code::InvalidValue,
                entry.key_pos,
                "a case has `input` (one record) or `inputs` (a list), not both",
            );
            return None;
        }
        (None, None) => {
            report.error(
                Code::MissingField,
                node.pos,
                format!("case `{name}` needs an `input` record (or `inputs`, a list)"),
            );
            return None;
        }
    };
    let expect = match (fields.get("output"), fields.get("deadLetter")) {
        (Some(output), None) => {
            let items: Vec<&Node> = match &output.value.value {
                Value::Sequence(items) => items.iter().collect(),
                Value::Scalar(s) if s.is_null() => Vec::new(),
                _ => vec![&output.value],
            };
            let mut outputs = Vec::with_capacity(items.len());
            for item in items {
                outputs.push(record(item, false, report)?);
            }
            Expect::Outputs(outputs)
        }
        (None, Some(kind)) => Expect::DeadLetter(fields::string(kind, report)?.value),
        (Some(_), Some(kind)) => {
            report.error(
                Code::InvalidValue,
                kind.key_pos,
                "a case expects `output` or `deadLetter`, not both",
            );
            return None;
        }
        (None, None) => {
            report.error(
                Code::MissingField,
                node.pos,
                format!(
                    "case `{name}` says what it expects: `output` (a list; [] for a record \
                     filtered out) or `deadLetter` (the kind, e.g. invalid-json)"
                ),
            );
            return None;
        }
    };
    Some(Case {
        name,
        pos: node.pos,
        inputs,
        expect,
    })
}

/// `{key, value | raw, headers, from, timestamp}`; `from` and `timestamp` only on an input.
fn record(node: &Node, input: bool, report: &mut Report) -> Option<TestRecord> {
    let what = if input {
        "an input record"
    } else {
        "an output record"
    };
    let fields = Fields::of(node, what, node.pos, report)?;
    let allowed: &[&str] = if input {
        &["key", "value", "raw", "headers", "from", "timestamp"]
    } else {
        &["key", "value", "raw", "headers"]
    };
    fields.reject_unknown(allowed, what, report);
    let key = match fields.get("key") {
        Some(entry) => Some(fields::string(entry, report)?.value),
        None => None,
    };
    let value = match (fields.get("value"), fields.get("raw")) {
        (Some(value), None) => RecordValue::Json(to_json(&value.value, report)?),
        (None, Some(raw)) => RecordValue::Raw(fields::string(raw, report)?.value),
        (Some(_), Some(raw)) => {
            report.error(
                Code::InvalidValue,
                raw.key_pos,
                "a record has `value` (JSON, written as YAML) or `raw` (text as is), not both",
            );
            return None;
        }
        (None, None) => {
            report.error(
                Code::MissingField,
                node.pos,
                format!("{what} needs a `value` (JSON, written as YAML) or a `raw` text"),
            );
            return None;
        }
    };
    let headers = match fields.get("headers") {
        Some(entry) => {
            let headers = Fields::of(&entry.value, "`headers`", entry.key_pos, report)?;
            let mut out = Vec::new();
            for header in headers.entries {
                out.push((header.key.clone(), fields::string(header, report)?.value));
            }
            Some(out)
        }
        None => None,
    };
    let from = match fields.get("from") {
        Some(entry) => Some(fields::string(entry, report)?.value),
        None => None,
    };
    let timestamp = match fields.get("timestamp") {
        Some(entry) => {
            let text = fields::string(entry, report)?;
            match text.value.parse::<i64>() {
                Ok(ms) if ms >= 0 => Some(ms),
                _ => {
                    report.error(
                        Code::InvalidValue,
                        entry.key_pos,
                        format!(
                            "`timestamp` is milliseconds since 1970 (e.g. 1700000000000), not `{}`",
                            text.value
                        ),
                    );
                    return None;
                }
            }
        }
        None => None,
    };
    Some(TestRecord {
        key,
        value,
        headers,
        from,
        timestamp,
    })
}

/// YAML as JSON: plain scalars are null, booleans and numbers where they read as such;
/// quoted and block scalars are strings.
fn to_json(node: &Node, report: &mut Report) -> Option<Json> {
    Some(match &node.value {
        Value::Scalar(s) if s.is_null() => Json::Null,
        Value::Scalar(s) if s.plain => match s.text.as_str() {
            "true" => Json::Bool(true),
            "false" => Json::Bool(false),
            text => match text.parse::<i64>() {
                Ok(n) => Json::from(n),
                Err(_) => match text
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                {
                    Some(n) => Json::Number(n),
                    None => Json::String(text.to_owned()),
                },
            },
        },
        Value::Scalar(s) => Json::String(s.text.clone()),
        Value::Sequence(items) => Json::Array(
            items
                .iter()
                .map(|item| to_json(item, report))
                .collect::<Option<_>>()?,
        ),
        Value::Mapping(entries) => {
            let mut object = serde_json::Map::new();
            for entry in entries {
                if object
                    .insert(entry.key.clone(), to_json(&entry.value, report)?)
                    .is_some()
                {
                    report.error(
                        Code::InvalidValue,
                        entry.key_pos,
                        format!("`{}` is written twice", entry.key),
                    );
                    return None;
                }
            }
            Json::Object(object)
        }
    })
}
