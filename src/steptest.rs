//! `plumber test`: runs a commit's step tests (`spec::step_test`) with the processor's own
//! transforms, in this process: a case's input goes through the same code a running step
//! uses, and its outputs or dead letter are compared with what the case expects.
//!
//! jq steps and per-record `sql` steps run here. Stateful `sql` steps (GROUP BY, JOIN), exec
//! and http steps are reported as not run, with why: they need state, a table, a child
//! process or a server that a test of one record does not have yet.

use std::time::{Duration, Instant};

use plumber_processor::record::{Input, Output};
use plumber_processor::stop::Stop;
use plumber_processor::transform::{self, Outcome};
use serde::Serialize;

use crate::graph::{StepKind, Topology};
use crate::spec::step_test::{Case, Expect, RecordValue, TestRecord};
use crate::spec::{EnvValue, Transform};

/// How long one case may run: a jq program that never ends fails its case, not the run.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(10);

/// One case's result.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseResult {
    pub topology: String,
    pub step: String,
    pub file: String,
    pub line: u32,
    pub column: u32,
    pub name: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "result")]
pub enum Verdict {
    Passed,
    /// What was expected and what came, each as lines a reviewer reads side by side.
    Failed {
        expected: Vec<String>,
        actual: Vec<String>,
    },
    NotRun {
        why: String,
    },
}

/// What a record became.
#[derive(Debug, Clone, PartialEq)]
enum Actual {
    Outputs(Vec<Produced>),
    DeadLetter { kind: String, message: String },
}

#[derive(Debug, Clone, PartialEq)]
struct Produced {
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
}

/// Runs the tests of `topologies`, those of `topology` and `step` only when given.
pub fn run(topologies: &[Topology], topology: Option<&str>, step: Option<&str>) -> Vec<CaseResult> {
    let mut results = Vec::new();
    for graph in topologies
        .iter()
        .filter(|t| topology.is_none_or(|name| t.name == name))
    {
        for tests in graph
            .tests
            .iter()
            .filter(|t| step.is_none_or(|name| t.step == name))
        {
            for case in &tests.cases {
                results.push(CaseResult {
                    topology: graph.name.clone(),
                    step: tests.step.clone(),
                    file: tests.file.clone(),
                    line: case.pos.line,
                    column: case.pos.column,
                    name: case.name.clone(),
                    verdict: run_case(graph, &tests.step, case),
                });
            }
        }
    }
    results
}

/// What a step runs, as far as a test needs it.
struct Runnable {
    transform: Transform,
    env: Vec<(String, String)>,
    /// Its input steps, in name order: a record comes from the first unless it says.
    inputs: Vec<String>,
}

fn runnable(graph: &Topology, step: &str) -> Result<Runnable, String> {
    let id = graph
        .find(step)
        .ok_or_else(|| format!("the topology has no step `{step}`"))?;
    let StepKind::Processor { transform, env, .. } = &graph.step(id).kind else {
        return Err(format!("`{step}` is no processor"));
    };
    match transform {
        Transform::Jq { .. } => {}
        Transform::Sql {
            state: None,
            table: None,
            ..
        } => {}
        Transform::Sql { .. } => {
            return Err(
                "a stateful sql step (GROUP BY or JOIN) keeps state or a table: `plumber test` \
                 runs one record at a time, not yet these"
                    .into(),
            );
        }
        Transform::Exec { .. } | Transform::Http { .. } => {
            return Err(format!(
                "an {} step runs a command or a server: `plumber test` runs jq and sql steps \
                 in-process, not yet these",
                transform.kind()
            ));
        }
    }
    Ok(Runnable {
        transform: transform.clone(),
        // The step's own values; a secret reference is not resolved in a test.
        env: env
            .iter()
            .filter_map(|(name, value)| match value {
                EnvValue::Value(value) => Some((name.clone(), value.clone())),
                EnvValue::Secret { .. } => None,
            })
            .collect(),
        inputs: graph
            .inputs(id)
            .into_iter()
            .map(|i| graph.step(i).name.clone())
            .collect(),
    })
}

fn run_case(graph: &Topology, step: &str, case: &Case) -> Verdict {
    let runnable = match runnable(graph, step) {
        Ok(runnable) => runnable,
        Err(why) => return Verdict::NotRun { why },
    };
    let from = case
        .input
        .from
        .clone()
        .or_else(|| runnable.inputs.first().cloned())
        .unwrap_or_default();
    if !runnable.inputs.contains(&from) {
        return Verdict::Failed {
            expected: vec![format!(
                "an input from one of the step's inputs: {}",
                runnable.inputs.join(", ")
            )],
            actual: vec![format!("`from: {from}`")],
        };
    }
    let input = case.input.clone();
    let (sender, receiver) = std::sync::mpsc::channel();
    // On a thread of its own: a jq program cannot be interrupted, and a case that does not
    // end is left behind (the command ends with the run), not waited for.
    let spawned = std::thread::Builder::new()
        .name("step-test".into())
        .spawn(move || {
            let _ = sender.send(apply(&runnable, &from, &input));
        });
    if let Err(error) = spawned {
        return Verdict::NotRun {
            why: format!("no thread to run the case on: {error}"),
        };
    }
    let actual = match receiver.recv_timeout(CASE_TIMEOUT) {
        Ok(Ok(actual)) => actual,
        Ok(Err(why)) => return Verdict::NotRun { why },
        Err(_) => Actual::DeadLetter {
            kind: transform::TIMEOUT.into(),
            message: format!(
                "the case did not finish within {} s",
                CASE_TIMEOUT.as_secs()
            ),
        },
    };
    compare(&case.expect, &actual)
}

fn apply(runnable: &Runnable, from: &str, record: &TestRecord) -> Result<Actual, String> {
    let mut transform: Box<dyn transform::Transform> = match &runnable.transform {
        Transform::Jq { program } => Box::new(
            transform::jq::Jq::compile_with_env(program, runnable.env.clone())
                .map_err(|e| e.to_string())?,
        ),
        Transform::Sql { query, .. } => {
            // Each input step read from a topic of its own name.
            let topics = runnable.inputs.clone();
            let inputs: Vec<(String, String)> = if topics.len() > 1 {
                topics.iter().map(|t| (t.clone(), t.clone())).collect()
            } else {
                Vec::new()
            };
            Box::new(
                transform::sql::Sql::compile(query, &inputs, &topics).map_err(|e| e.to_string())?,
            )
        }
        other => return Err(format!("a {} step is not run here", other.kind())),
    };
    let value = record.value.bytes();
    let headers: Vec<(String, Vec<u8>)> = record
        .headers
        .iter()
        .flatten()
        .map(|(n, v)| (n.clone(), v.clone().into_bytes()))
        .collect();
    let input = Input {
        topic: from,
        partition: 0,
        offset: 0,
        timestamp: None,
        key: record.key.as_deref().map(str::as_bytes),
        value: Some(&value),
        headers: headers
            .iter()
            .map(|(n, v)| (n.as_str(), Some(v.as_slice())))
            .collect(),
    };
    let outcome = transform
        .apply(&input, &Stop::default(), Instant::now() + CASE_TIMEOUT)
        .map_err(|e| e.to_string())?;
    Ok(match outcome {
        Outcome::Outputs(outputs) => Actual::Outputs(
            outputs
                .into_iter()
                .map(|o| produced(o, &input, &headers))
                .collect(),
        ),
        Outcome::Rejected(rejection) => Actual::DeadLetter {
            kind: rejection.kind.to_owned(),
            message: rejection.message,
        },
        Outcome::Abandoned | Outcome::Emitted { .. } | Outcome::Reflected => {
            return Err("the transform answered as a stateful step does".into());
        }
    })
}

/// An output as the processor writes it: the input's key and headers unless it sets its own.
fn produced(output: Output, input: &Input<'_>, headers: &[(String, Vec<u8>)]) -> Produced {
    Produced {
        key: match output.key {
            Some(key) => key,
            None => input.key.map(<[u8]>::to_vec),
        },
        value: output.value,
        headers: output.headers.unwrap_or_else(|| headers.to_vec()),
    }
}

fn compare(expect: &Expect, actual: &Actual) -> Verdict {
    let matches = match (expect, actual) {
        (Expect::DeadLetter(kind), Actual::DeadLetter { kind: got, .. }) => kind == got,
        (Expect::Outputs(expected), Actual::Outputs(got)) => {
            expected.len() == got.len() && expected.iter().zip(got).all(|(e, g)| same(e, g))
        }
        _ => false,
    };
    if matches {
        return Verdict::Passed;
    }
    Verdict::Failed {
        expected: match expect {
            Expect::DeadLetter(kind) => vec![format!("dead-lettered: {kind}")],
            Expect::Outputs(records) if records.is_empty() => vec!["no output".into()],
            Expect::Outputs(records) => records.iter().map(expected_line).collect(),
        },
        actual: match actual {
            Actual::DeadLetter { kind, message } => {
                vec![format!("dead-lettered: {kind}: {message}")]
            }
            Actual::Outputs(records) if records.is_empty() => vec!["no output".into()],
            Actual::Outputs(records) => records.iter().map(actual_line).collect(),
        },
    }
}

/// Whether an output is what a case expects of it: its value (JSON equal, or the same raw
/// text), and its key and headers where the case gives them.
fn same(expected: &TestRecord, got: &Produced) -> bool {
    let value = match &expected.value {
        RecordValue::Json(json) => {
            serde_json::from_slice::<serde_json::Value>(&got.value).is_ok_and(|v| &v == json)
        }
        RecordValue::Raw(text) => text.as_bytes() == got.value.as_slice(),
    };
    let key = expected
        .key
        .as_ref()
        .is_none_or(|key| got.key.as_deref() == Some(key.as_bytes()));
    let headers = expected.headers.as_ref().is_none_or(|headers| {
        headers.len() == got.headers.len()
            && headers
                .iter()
                .zip(&got.headers)
                .all(|((n, v), (gn, gv))| n == gn && v.as_bytes() == gv.as_slice())
    });
    value && key && headers
}

fn expected_line(record: &TestRecord) -> String {
    let value = match &record.value {
        RecordValue::Json(json) => json.to_string(),
        RecordValue::Raw(text) => format!("raw {text:?}"),
    };
    let key = record
        .key
        .as_ref()
        .map_or(String::new(), |k| format!("key {k:?} "));
    let headers = record
        .headers
        .as_ref()
        .map_or(String::new(), |h| format!(" headers {h:?}"));
    format!("{key}{value}{headers}")
}

fn actual_line(record: &Produced) -> String {
    let key = record.key.as_ref().map_or("no key ".to_owned(), |k| {
        format!("key {:?} ", String::from_utf8_lossy(k))
    });
    let headers = if record.headers.is_empty() {
        String::new()
    } else {
        let h: Vec<(String, String)> = record
            .headers
            .iter()
            .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        format!(" headers {h:?}")
    };
    format!("{key}{}{headers}", String::from_utf8_lossy(&record.value))
}

/// The results as text: one line per case (`file:line:column: step: name: ok`), the
/// expected and actual lines of each failed case, and a summary.
pub fn text(results: &[CaseResult]) -> String {
    let mut out = String::new();
    let (mut passed, mut failed, mut not_run) = (0, 0, 0);
    for r in results {
        let head = format!("{}:{}:{}: {}: {}", r.file, r.line, r.column, r.step, r.name);
        match &r.verdict {
            Verdict::Passed => {
                passed += 1;
                out.push_str(&format!("{head}: ok\n"));
            }
            Verdict::Failed { expected, actual } => {
                failed += 1;
                out.push_str(&format!("{head}: FAILED\n"));
                for line in expected {
                    out.push_str(&format!("  expected: {line}\n"));
                }
                for line in actual {
                    out.push_str(&format!("  actual:   {line}\n"));
                }
            }
            Verdict::NotRun { why } => {
                not_run += 1;
                out.push_str(&format!("{head}: not run: {why}\n"));
            }
        }
    }
    out.push_str(&format!(
        "{} cases: {passed} passed, {failed} failed, {not_run} not run\n",
        results.len()
    ));
    out
}

/// Whether no case failed (cases not run do not fail a run; they are listed).
pub fn all_passed(results: &[CaseResult]) -> bool {
    !results
        .iter()
        .any(|r| matches!(r.verdict, Verdict::Failed { .. }))
}
