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
                Transform::Sql {
                    query,
                    state,
                    table,
                } => {
                    push("sql", query.clone());
                    if let Some(table) = table {
                        push(
                            "tableMaxBytes",
                            table.max_bytes.map_or("default".into(), |m| m.to_string()),
                        );
                    }
                    if let Some(state) = state {
                        push("grace", format!("{} ms", state.grace_ms));
                        push("emit", state.emit.as_str().to_owned());
                        push(
                            "stateMaxGroups",
                            state.max_groups.map_or("default".into(), |m| m.to_string()),
                        );
                        push(
                            "stateStart",
                            match state.start {
                                None => "unset",
                                Some(crate::spec::StateStart::Empty) => "empty",
                                Some(crate::spec::StateStart::Earliest) => "earliest",
                            }
                            .to_owned(),
                        );
                    }
                }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

    use super::*;
    use crate::plan::{Change, plan_topology};
    use crate::spec::{FileContent, SourceFile};

    /// `in → a → b → out` with the given files replacing or adding to those defaults.
    fn topology(overrides: &[(&str, &str)]) -> Topology {
        let mut files: std::collections::BTreeMap<&str, &str> = [
            ("in", "kind: source\ntopic: in\n"),
            ("a", "kind: processor\ninput: in\njq: '.'\n"),
            ("b", "kind: processor\ninput: a\njq: '.'\n"),
            ("out", "kind: sink\ntopic: out\ninput: b\n"),
        ]
        .into_iter()
        .collect();
        files.extend(overrides.iter().copied());
        let files: Vec<SourceFile> = files
            .into_iter()
            .filter(|(_, yaml)| !yaml.is_empty())
            .map(|(name, yaml)| SourceFile {
                path: format!("topologies/t/{name}.yaml"),
                content: FileContent::Bytes(yaml.as_bytes().to_vec()),
            })
            .collect();
        let validation = crate::validate(&files);
        let mut topologies = validation
            .topologies
            .unwrap_or_else(|| panic!("invalid: {:?}", validation.diagnostics));
        topologies.remove(0)
    }

    fn reason(old: &Topology, new: &Topology, step: &str) -> Reason {
        between(old, old.find(step).unwrap(), new, new.find(step).unwrap())
    }

    fn change(field: &str, from: Option<&str>, to: Option<&str>) -> FieldChange {
        FieldChange {
            field: field.into(),
            from: from.map(str::to_owned),
            to: to.map(str::to_owned),
        }
    }

    #[test]
    fn a_changed_program_is_named_with_both_versions_and_its_consumer_names_it_upstream() {
        let old = topology(&[]);
        let new = topology(&[("a", "kind: processor\ninput: in\njq: 'select(.x)'\n")]);
        assert_eq!(
            reason(&old, &new, "a"),
            Reason {
                changed: vec![change("jq", Some("."), Some("select(.x)"))],
                upstream: vec![],
            }
        );
        assert_eq!(
            reason(&old, &new, "b"),
            Reason {
                changed: vec![],
                upstream: vec!["a".into()],
            }
        );
        // The sink's own file did not change: it is a topic its users own, not replaced.
        assert!(reason(&old, &new, "out").is_empty());
    }

    #[test]
    fn exec_http_env_and_partitions_differences_are_field_by_field() {
        let old = topology(&[(
            "a",
            "kind: processor\ninput: in\nexec: { command: [python3, a.py], image: img:1 }\n\
             env: { MODEL: v1, KEEP: same, GONE: x }\npartitions: 3\n",
        )]);
        let new = topology(&[(
            "a",
            "kind: processor\ninput: in\nexec: { command: [python3, a.py, --fast], image: img:1 }\n\
             env: { MODEL: v2, KEEP: same, KEY: { secretKeyRef: { name: s, key: k } } }\n\
             partitions: 6\n",
        )]);
        assert_eq!(
            reason(&old, &new, "a").changed,
            vec![
                change(
                    "exec.command",
                    Some(r#"["python3","a.py"]"#),
                    Some(r#"["python3","a.py","--fast"]"#)
                ),
                change("env.GONE", Some(r#""x""#), None),
                change("env.MODEL", Some(r#""v1""#), Some(r#""v2""#)),
                change("partitions", Some("3"), Some("6")),
                change("env.KEY", None, Some("secretKeyRef s/k")),
            ]
        );
        let http = |port: u16| {
            format!("kind: processor\ninput: in\nhttp: {{ image: score:2, port: {port} }}\n")
        };
        let (old, new) = (
            topology(&[("a", &http(8080))]),
            topology(&[("a", &http(9090))]),
        );
        assert_eq!(
            reason(&old, &new, "a").changed,
            vec![change("http.port", Some("8080"), Some("9090"))]
        );
        // Another kind of transform: the old field goes, the new one comes.
        let new = topology(&[("a", "kind: processor\ninput: in\njq: '.'\n")]);
        let changed: Vec<String> = reason(&old, &new, "a")
            .changed
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            changed,
            ["http.image", "http.port", "http.path", "jq"],
            "{changed:?}"
        );
    }

    #[test]
    fn new_inputs_sinks_and_readers_are_the_step_s_own_change() {
        let old = topology(&[]);
        let new = topology(&[
            ("a", "kind: processor\ninput: [in, in2]\njq: '.'\n"),
            ("in2", "kind: source\ntopic: in2\n"),
            ("a-out", "kind: sink\ntopic: a-out\ninput: a\n"),
        ]);
        assert_eq!(
            reason(&old, &new, "a").changed,
            vec![
                change("input", Some("in"), Some("in, in2")),
                change("sinks", None, Some("a-out")),
            ]
        );
        // b no longer read by anything but a sink: it stops writing an internal topic.
        let old = topology(&[("c", "kind: processor\ninput: b\njq: '.'\n")]);
        let new = topology(&[]);
        assert_eq!(
            reason(&old, &new, "b").changed,
            vec![change(
                "internalTopic",
                Some("written (a processor reads it)"),
                None
            )]
        );
    }

    #[test]
    fn a_source_s_new_topic_updates_it_and_replaces_its_readers() {
        let old = topology(&[]);
        let new = topology(&[("in", "kind: source\ntopic: in-v2\n")]);
        let plan = plan_topology(Some(&old), Some(&new));
        let of = |name: &str| plan.steps.iter().find(|s| s.name == name).unwrap();
        assert_eq!(of("in").change, Change::Updated);
        assert_eq!(
            of("in").reason.as_ref().unwrap().changed,
            vec![change("topic", Some("in"), Some("in-v2"))]
        );
        assert_eq!(of("a").change, Change::Replaced);
        assert_eq!(of("a").reason.as_ref().unwrap().upstream, ["in"]);
        assert_eq!(of("b").reason.as_ref().unwrap().upstream, ["a"]);
        assert_eq!(of("out").change, Change::Unchanged);
        assert!(of("out").reason.is_none());
    }

    #[test]
    fn settings_outside_the_identity_update_in_place_with_their_reason() {
        let old = topology(&[]);
        let new = topology(&[(
            "a",
            "kind: processor\ninput: in\njq: '.'\nscale: { min: 2, max: 4 }\ndescription: d\n",
        )]);
        let plan = plan_topology(Some(&old), Some(&new));
        let a = &plan.steps[1];
        assert_eq!((a.name.as_str(), a.change), ("a", Change::Updated));
        let fields: Vec<&str> = a
            .reason
            .as_ref()
            .unwrap()
            .changed
            .iter()
            .map(|c| c.field.as_str())
            .collect();
        assert_eq!(fields, ["scale", "description"]);
        assert_eq!(plan.steps[2].change, Change::Unchanged);
    }

    /// Whatever makes a processor's identity change, its plan says why.
    #[test]
    fn every_replaced_processor_has_a_reason() {
        let base = topology(&[]);
        let variants: [&[(&str, &str)]; 7] = [
            &[("a", "kind: processor\ninput: in\njq: '. '\n")],
            &[(
                "a",
                "kind: processor\ninput: in\njq: '.'\nenv: { A: '1' }\n",
            )],
            &[("a", "kind: processor\ninput: in\njq: '.'\npartitions: 9\n")],
            &[("in", "kind: source\ntopic: other\n")],
            &[("out", "kind: sink\ntopic: out\ninput: a\n")],
            &[("out", "kind: sink\ntopic: out-v2\ninput: b\n")],
            &[
                ("b", "kind: processor\ninput: in\njq: '.'\n"),
                ("out", "kind: sink\ntopic: out\ninput: [a, b]\n"),
            ],
        ];
        for (i, files) in variants.iter().enumerate() {
            let new = topology(files);
            let plan = plan_topology(Some(&base), Some(&new));
            let replaced: Vec<_> = plan
                .steps
                .iter()
                .filter(|s| s.change == Change::Replaced)
                .collect();
            assert!(!replaced.is_empty(), "variant {i} replaces something");
            for step in replaced {
                assert_eq!(step.kind, Kind::Processor, "variant {i}: {}", step.name);
                let reason = step.reason.as_ref().unwrap();
                assert!(
                    !reason.is_empty(),
                    "variant {i}: {} has no reason",
                    step.name
                );
            }
            assert!(
                plan.steps
                    .iter()
                    .filter(|s| s.kind != Kind::Processor)
                    .all(|s| s.change != Change::Replaced),
                "variant {i}: sources and sinks are never replaced"
            );
        }
    }
}
