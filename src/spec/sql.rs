//! Checking a `sql:` step's query with the compiler `plumber-processor` runs it with, each
//! problem reported where it is written: the query's line and column mapped through the YAML
//! value (quotes, escapes, block scalars) to the step file's.

use plumber_sql::Compiled;

use super::fields::{Located, Report};
use super::yaml::{self, Node};
use crate::diagnostic::Code;

/// What kind of query a `sql:` step holds, once it compiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kind {
    Stateless,
    /// `GROUP BY`: keeps state per key.
    Stateful,
    /// A stream–table join of the input step `table`.
    Join {
        table: String,
    },
}

/// Checks the query; `None` when it does not compile (each problem reported at its place).
pub(super) fn check(
    query: &str,
    value: &Node,
    inputs: &[Located<String>],
    source: &str,
    report: &mut Report,
) -> Option<Kind> {
    let names: Vec<&str> = inputs.iter().map(|i| i.value.as_str()).collect();
    // Without inputs (a `missing-field` already), any FROM is let through.
    let inputs = (!names.is_empty()).then_some(names.as_slice());
    let problems = match plumber_sql::compile_any(query, inputs, true) {
        Ok(Compiled::Stateless(_)) => return Some(Kind::Stateless),
        Ok(Compiled::Stateful(_)) => return Some(Kind::Stateful),
        Ok(Compiled::Join(join)) => {
            return Some(Kind::Join {
                table: join.table().to_owned(),
            });
        }
        Err(problems) => problems,
    };
    for problem in problems {
        let offset = char_offset(query, problem.line, problem.column);
        match offset.and_then(|o| yaml::position_in_scalar(source, value, o)) {
            Some(pos) => report.error(Code::InvalidSql, pos, problem.message),
            None => report.error(
                Code::InvalidSql,
                value.pos,
                format!(
                    "{} (line {}, column {} of the query)",
                    problem.message, problem.line, problem.column
                ),
            ),
        }
    }
    None
}

/// The character offset of a 1-based line and column of `text`.
fn char_offset(text: &str, line: u32, column: u32) -> Option<usize> {
    let line = usize::try_from(line).ok()?.checked_sub(1)?;
    let column = usize::try_from(column).ok()?.checked_sub(1)?;
    let mut offset = 0;
    for (i, l) in text.split('\n').enumerate() {
        let chars = l.chars().count();
        if i == line {
            return (column <= chars).then_some(offset + column);
        }
        offset += chars + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_count_characters_across_lines() {
        assert_eq!(char_offset("ab\ncd", 1, 1), Some(0));
        assert_eq!(char_offset("ab\ncd", 2, 2), Some(4));
        assert_eq!(char_offset("é€\nx", 2, 1), Some(3));
        assert_eq!(char_offset("ab", 1, 3), Some(2));
        assert_eq!(char_offset("ab", 3, 1), None);
    }
}
