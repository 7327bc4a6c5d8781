//! Rendering for people and tools: validation results, graphs and plans. Pure functions from
//! data to text; the CLI decides where it goes.

pub mod graph;
pub mod plan;
pub mod preview;
pub mod status;

use serde_json::{Value, json};

use crate::Validation;
use crate::diagnostic::Diagnostic;

/// `plumber validate --format json` (SPEC §5).
pub fn validation_json(commit: &str, validation: &Validation) -> Value {
    json!({
        "valid": validation.is_valid(),
        "commit": commit,
        "topologies": validation
            .found
            .iter()
            .map(|(name, steps)| json!({ "name": name, "steps": steps }))
            .collect::<Vec<_>>(),
        "errors": validation.errors().collect::<Vec<&Diagnostic>>(),
        "warnings": validation.warnings().collect::<Vec<&Diagnostic>>(),
    })
}

/// One `file:line:column: code: message` line per finding, then a summary line.
pub fn validation_text(commit: &str, validation: &Validation) -> String {
    let mut out = String::new();
    for diagnostic in &validation.diagnostics {
        out.push_str(&diagnostic.to_string());
        out.push('\n');
    }
    let steps: usize = validation.found.iter().map(|(_, n)| n).sum();
    let short = short_commit(commit);
    let errors = validation.errors().count();
    let warnings = validation.warnings().count();
    if validation.is_valid() {
        out.push_str(&format!(
            "valid: {} topolog{}, {steps} step{} at {short}{}\n",
            validation.found.len(),
            if validation.found.len() == 1 {
                "y"
            } else {
                "ies"
            },
            plural(steps),
            if warnings > 0 {
                format!(" ({warnings} warning{})", plural(warnings))
            } else {
                String::new()
            }
        ));
    } else {
        out.push_str(&format!(
            "invalid: {errors} error{}, {warnings} warning{} at {short}\n",
            plural(errors),
            plural(warnings)
        ));
    }
    out
}

/// The first 12 hex digits of a commit id, as people quote them.
pub fn short_commit(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
