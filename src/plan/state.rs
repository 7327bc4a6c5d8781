//! A stateful `sql` step's changelog, and what a new life's state starts from
//! (`docs/stateful-sql.md`, "Cutover of a stateful step"). Pure: the decision is a function of
//! the two queries, the inputs and what the deployment holds.
//!
//! The changelog is named by what the state is made of (the query's state definition, its
//! grace and the input topics), so a new life whose state is the old one's finds the old
//! changelog under the same name and restores it. Any other new life gets a new changelog and
//! rebuilds its state from the inputs (windows bound how far back), or the reviewer says what
//! it starts from (`stateStart`).

use plumber_sql::{Aggregation, CarryOver, Compiled};
use sha2::{Digest, Sha256};

use serde::{Deserialize, Serialize};

use super::{Carry, StartProcessor, StateRun};
use crate::spec::{SqlState, StateStart, Transform};

/// A stopped stateful life's state: its changelog and the query that built it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OldState {
    pub topic: String,
    pub query: String,
    pub grace_ms: u64,
}

impl OldState {
    /// The state of a life started with `start`, if it keeps one.
    pub fn of(start: &StartProcessor) -> Option<OldState> {
        match (&start.transform, &start.state) {
            (
                Transform::Sql {
                    query,
                    state: Some(sql),
                    ..
                },
                Some(run),
            ) => Some(OldState {
                topic: run.topic.clone(),
                query: query.clone(),
                grace_ms: sql.grace_ms,
            }),
            _ => None,
        }
    }
}

/// A new life's input topics.
pub(super) struct Inputs<'a> {
    pub topics: &'a [String],
    /// Those created in this move (a replaced upstream step's): they hold nothing from
    /// before the cutover.
    pub new: &'a [String],
}

/// The state a step's new life runs with; `None` for a step that keeps none. `existing`
/// says whether a changelog of that name holds an old life's state (it exists, and was not
/// created in this move).
pub(super) fn run(
    topology: &str,
    step: &str,
    transform: &Transform,
    inputs: &Inputs<'_>,
    existing: &dyn Fn(&str) -> bool,
    predecessor: Option<Predecessor>,
) -> Option<StateRun> {
    let Transform::Sql {
        query,
        state: Some(settings),
        ..
    } = transform
    else {
        return None;
    };
    let aggregation = match compile(query, settings.grace_ms) {
        Ok(aggregation) => aggregation,
        Err(why) => {
            return Some(StateRun {
                topic: format!("plumber.{topology}.{step}.invalid.state"),
                carry: Carry::Cannot { why },
            });
        }
    };
    let topic = changelog_topic(topology, step, &aggregation, inputs.topics);
    let carry = if existing(&topic) {
        Carry::Restore
    } else {
        match predecessor {
            None => Carry::Empty,
            Some(predecessor) => carry_from(&aggregation, settings, &predecessor, inputs.new),
        }
    };
    Some(StateRun { topic, carry })
}

/// What ran before a step's new life.
#[derive(Debug, Clone)]
pub(super) enum Predecessor {
    /// A life that kept state.
    Stateful(OldState),
    /// A life that kept none (the step becomes stateful).
    Stateless,
}

fn carry_from(
    new: &Aggregation,
    settings: &SqlState,
    old: &Predecessor,
    new_inputs: &[String],
) -> Carry {
    let verdict = match old {
        Predecessor::Stateful(old) => match compile(&old.query, old.grace_ms) {
            // Same state, but not under the same changelog: the inputs changed (an upstream
            // step was replaced), and the old state's offsets are not the new input's.
            Ok(old) => match new.carry_over(&old) {
                CarryOver::Reuse => carry_over_new_inputs(new),
                other => other,
            },
            Err(why) => CarryOver::Cannot {
                why: format!("the old life's query does not compile any more: {why}"),
            },
        },
        // The old life kept no state: rebuild what a window needs, or nothing can.
        Predecessor::Stateless => new.without_old_state(),
    };
    // A rebuild reads the new life's input back from its cutover offsets; an input created
    // in this move starts at them: the records before are on the old upstream's topic.
    let verdict = match (verdict, new_inputs.first()) {
        (CarryOver::Rebuild { .. }, Some(topic)) => CarryOver::Cannot {
            why: format!(
                "its input `{topic}` is new in this move (an upstream step was replaced), and \
                 the records before the cutover are on the old upstream's topic, which the new \
                 life does not read: windows open at the cutover would count only what follows"
            ),
        },
        (verdict, _) => verdict,
    };
    match (verdict, settings.start) {
        (CarryOver::Rebuild { span_ms }, _) => Carry::Rebuild { span_ms },
        (_, Some(StateStart::Empty)) => Carry::Empty,
        (_, Some(StateStart::Earliest)) => Carry::Earliest,
        (CarryOver::Cannot { why }, None) => Carry::Cannot { why },
        // Not produced above: a reusable state is found under its own changelog's name.
        (CarryOver::Reuse, None) => Carry::Restore,
    }
}

/// The same state, but no old changelog applies to the inputs: rebuilt where windows bound
/// it.
fn carry_over_new_inputs(new: &Aggregation) -> CarryOver {
    match new.without_old_state() {
        CarryOver::Cannot { why } => CarryOver::Cannot {
            why: format!("its input topics changed, so the old state does not apply; and {why}"),
        },
        other => other,
    }
}

fn compile(query: &str, grace_ms: u64) -> Result<Aggregation, String> {
    match plumber_sql::compile_any(query, None, true) {
        Ok(Compiled::Stateful(aggregation)) => {
            Ok(aggregation.with_grace(i64::try_from(grace_ms).unwrap_or(i64::MAX)))
        }
        Ok(_) => Err("the query keeps no state".into()),
        Err(problems) => Err(plumber_sql::Problem::all(&problems)),
    }
}

/// `plumber.<topology>.<step>.<state12>.state`: twelve hex digits of a hash of the state's
/// definition and the input topics.
fn changelog_topic(
    topology: &str,
    step: &str,
    aggregation: &Aggregation,
    inputs: &[String],
) -> String {
    let mut hash = Sha256::new();
    hash.update(aggregation.state_fingerprint().as_bytes());
    for input in inputs {
        hash.update([0]);
        hash.update(input.as_bytes());
    }
    let digest = hash.finalize();
    let short: String = digest
        .iter()
        .take(6)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("plumber.{topology}.{step}.{short}.state")
}
