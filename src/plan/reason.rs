//! Why a step changed between two revisions: which fields of its own definition differ, and
//! which of its inputs changed identity. Pure: two graphs in, data out.
//!
//! Each step is flattened into `(field, value)` pairs named as in the step file (`jq`,
//! `exec.command`, `env.MODEL`, `scale`, …), plus what the graph adds to a processor's
//! identity: the sink topics it writes (`sinks`) and whether a processor reads it
//! (`internalTopic`). Comparing the pairs of both revisions gives every difference, so a
//! replaced processor always has a reason: what its identity covers is either one of its
//! own fields or an input's identity (SPEC §4).

use serde::Serialize;

use crate::graph::{Kind, StepId, StepKind, Topology};
use crate::spec::{EnvValue, StartFrom, Transform};

/// Why a step is not unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// Fields of the step's own definition that differ, in the order of the step file.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<FieldChange>,
    /// Inputs (step names, in both revisions) whose identity changed: a processor replaced,
    /// or a source whose topic or cluster changed. Only for processors, whose identity
    /// covers their inputs'.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<String>,
}

impl Reason {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.upstream.is_empty()
    }
}

/// One field whose value differs. `None`: the field is absent in that revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    pub field: String,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// What differs between step `old_id` of `old` and step `new_id` of `new` (one step name).
pub fn between(old: &Topology, old_id: StepId, new: &Topology, new_id: StepId) -> Reason {
    let before = fields(old, old_id);
    let after = fields(new, new_id);
    let mut changed = Vec::new();
    for (field, from) in &before {
        let to = value_of(&after, field);
        if to != Some(from.as_str()) {
            changed.push(FieldChange {
                field: field.clone(),
                from: Some(from.clone()),
                to: to.map(str::to_owned),
            });
        }
    }
    for (field, to) in &after {
        if value_of(&before, field).is_none() {
            changed.push(FieldChange {
                field: field.clone(),
                from: None,
                to: Some(to.clone()),
            });
        }
    }
    let upstream = if new.step(new_id).kind() == Kind::Processor {
        changed_inputs(old, old_id, new, new_id)
    } else {
        Vec::new()
    };
    Reason { changed, upstream }
}

fn value_of<'a>(fields: &'a [(String, String)], field: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(name, _)| name == field)
        .map(|(_, value)| value.as_str())
}

/// Inputs present (by name) in both revisions whose identity differs, sorted by name.
fn changed_inputs(old: &Topology, old_id: StepId, new: &Topology, new_id: StepId) -> Vec<String> {
    let old_inputs = old.inputs(old_id);
    new.inputs(new_id)
        .into_iter()
        .map(|id| new.step(id))
        .filter(|input| {
            old_inputs
                .iter()
                .map(|&id| old.step(id))
                .any(|before| before.name == input.name && before.identity != input.identity)
        })
        .map(|input| input.name.clone())
        .collect()
}

/// A step as `(field, value)` pairs, in the order of a step file.
fn fields(topology: &Topology, id: StepId) -> Vec<(String, String)> {
    let step = topology.step(id);
    let mut out: Vec<(String, String)> = Vec::new();
    let mut push = |field: &str, value: String| out.push((field.to_owned(), value));
    let inputs = || {
        topology
            .inputs(id)
            .into_iter()
            .map(|i| topology.step(i).name.clone())
            .collect::<Vec<_>>()
            .join(", ")
    };
    push("kind", kind_word(step.kind()).to_owned());
    match &step.kind {
        StepKind::Source { topic } => {
            push("topic", topic.clone());
            push("cluster", topology.cluster.clone());
        }
        StepKind::Sink { topic } => {
            push("topic", topic.clone());
            push("cluster", topology.cluster.clone());
            push("input", inputs());
        }
        StepKind::Processor {
            transform,
            env,
            partitions,
            scale,
            resources,
            start_from,
        } => {
            push("input", inputs());
            match transform {
                Transform::Jq { program } => push("jq", program.clone()),
                Transform::Sql { query } => push("sql", query.clone()),
                Transform::Exec { command, image } => {
                    push("exec.command", list(command));
                    if let Some(image) = image {
                        push("exec.image", image.clone());
                    }
                }
                Transform::Http {
                    image,
                    port,
                    path,
                    command,
                } => {
                    push("http.image", image.clone());
                    push("http.port", port.to_string());
                    push("http.path", path.clone());
                    if let Some(command) = command {
                        push("http.command", list(command));
                    }
                }
            }
            for (name, value) in env {
                // Quoted, so no value reads like a secret reference.
                let value = match value {
                    EnvValue::Value(value) => quote(value),
                    EnvValue::Secret { secret_key_ref } => format!(
                        "secretKeyRef {}/{}",
                        secret_key_ref.name, secret_key_ref.key
                    ),
                };
                push(&format!("env.{name}"), value);
            }
            push("partitions", partitions.to_string());
            let sinks: Vec<String> = topology
                .consumers(id)
                .into_iter()
                .filter_map(|c| match &topology.step(c).kind {
                    StepKind::Sink { topic } => Some(topic.clone()),
                    _ => None,
                })
                .collect();
            if !sinks.is_empty() {
                let mut sinks = sinks;
                sinks.sort();
                sinks.dedup();
                push("sinks", sinks.join(", "));
            }
            if topology.feeds_processor(id) {
                push("internalTopic", "written (a processor reads it)".to_owned());
            }
            push(
                "scale",
                format!(
                    "{}..{} replicas, lag threshold {}",
                    scale.min, scale.max, scale.lag_threshold
                ),
            );
            if let Some(resources) = resources {
                push(
                    "resources",
                    format!(
                        "cpu {}, memory {}",
                        resources.cpu.as_deref().unwrap_or("unset"),
                        resources.memory.as_deref().unwrap_or("unset")
                    ),
                );
            }
            push(
                "startFrom",
                match start_from {
                    StartFrom::Latest => "latest",
                    StartFrom::Earliest => "earliest",
                }
                .to_owned(),
            );
        }
    }
    if let Some(description) = &step.description {
        push("description", description.clone());
    }
    if let Some(owner) = &step.owner {
        push("owner", owner.clone());
    }
    out
}

fn kind_word(kind: Kind) -> &'static str {
    match kind {
        Kind::Source => "source",
        Kind::Processor => "processor",
        Kind::Sink => "sink",
    }
}

/// A command as a JSON list, so arguments holding commas or spaces stay apart.
fn list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_default()
}

fn quote(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
