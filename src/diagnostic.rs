//! Validation findings: a stable code, the repo-relative file, a 1-based line and column, and a
//! message that says what to do (SPEC §3).

use std::fmt;

use serde::Serialize;

use crate::spec::yaml::Pos;

/// Stable codes: tools match on them, so they never change meaning. The first block is SPEC §3;
/// the rest cover input the spec does not name (oversized, non-UTF-8, symlinked files) and the
/// warnings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Code {
    YamlSyntax,
    UnknownField,
    MissingField,
    InvalidKind,
    InvalidName,
    DuplicateStep,
    UnknownInput,
    InvalidEdge,
    Cycle,
    TransformCount,
    InvalidJq,
    InvalidSql,
    InvalidValue,
    TopicLoop,
    FileTooLarge,
    InvalidEncoding,
    UnsupportedEntry,
    OverBudget,
    /// A step test's case failed, or did not finish in the time step tests have.
    TestFailed,
    // Warnings.
    DeadEnd,
    UnreadSource,
    EmptyTopology,
    StrayFile,
    /// A step test's case of a kind of step `plumber test` does not run yet.
    TestNotRun,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::YamlSyntax => "yaml-syntax",
            Code::UnknownField => "unknown-field",
            Code::MissingField => "missing-field",
            Code::InvalidKind => "invalid-kind",
            Code::InvalidName => "invalid-name",
            Code::DuplicateStep => "duplicate-step",
            Code::UnknownInput => "unknown-input",
            Code::InvalidEdge => "invalid-edge",
            Code::Cycle => "cycle",
            Code::TransformCount => "transform-count",
            Code::InvalidJq => "invalid-jq",
            Code::InvalidSql => "invalid-sql",
            Code::InvalidValue => "invalid-value",
            Code::TopicLoop => "topic-loop",
            Code::FileTooLarge => "file-too-large",
            Code::InvalidEncoding => "invalid-encoding",
            Code::UnsupportedEntry => "unsupported-entry",
            Code::OverBudget => "over-budget",
            Code::TestFailed => "test-failed",
            Code::DeadEnd => "dead-end",
            Code::UnreadSource => "unread-source",
            Code::EmptyTopology => "empty-topology",
            Code::StrayFile => "stray-file",
            Code::TestNotRun => "test-not-run",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Diagnostic {
    #[serde(skip)]
    pub severity: Severity,
    pub code: Code,
    pub file: String,
    /// `None` only when no single place is to blame (a cycle, a directory name).
    pub line: Option<u32>,
    pub column: Option<u32>,
    pub message: String,
}

impl Diagnostic {
    pub fn error(code: Code, file: &str, pos: Option<Pos>, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, code, file, pos, message.into())
    }

    pub fn warning(code: Code, file: &str, pos: Option<Pos>, message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, code, file, pos, message.into())
    }

    fn new(severity: Severity, code: Code, file: &str, pos: Option<Pos>, message: String) -> Self {
        Diagnostic {
            severity,
            code,
            file: file.to_owned(),
            line: pos.map(|p| p.line),
            column: pos.map(|p| p.column),
            message,
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The order users read them in: by file, then position, then code.
    fn sort_key(&self) -> (&str, Option<u32>, Option<u32>, Code, &str) {
        (&self.file, self.line, self.column, self.code, &self.message)
    }
}

/// `file:line:column: code: message`, as rustc and cargo print; warnings say so.
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if self.severity == Severity::Warning {
            f.write_str(": warning")?;
        }
        write!(f, ": {}: {}", self.code, self.message)
    }
}

/// Sorts into reading order and drops exact repeats, so output is stable across runs.
pub fn normalize(diagnostics: &mut Vec<Diagnostic>) {
    diagnostics.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    diagnostics.dedup();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_rustc() {
        let d = Diagnostic::error(
            Code::UnknownField,
            "topologies/t/a.yaml",
            Some(Pos { line: 3, column: 1 }),
            "unknown field `jqq`",
        );
        assert_eq!(
            d.to_string(),
            "topologies/t/a.yaml:3:1: unknown-field: unknown field `jqq`"
        );
        let w = Diagnostic::warning(Code::Cycle, "topologies/t", None, "x");
        assert_eq!(w.to_string(), "topologies/t: warning: cycle: x");
    }

    #[test]
    fn codes_serialize_as_their_names() {
        for code in [Code::YamlSyntax, Code::TopicLoop, Code::UnsupportedEntry] {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }
}
