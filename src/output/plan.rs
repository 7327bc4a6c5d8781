//! `plumber plan`: the plan as text for a terminal, Markdown for a pull request, JSON for tools.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::{Value, json};

use super::graph::{mermaid_edges, mermaid_id, mermaid_node};
use super::short_commit as short;
use crate::diagnostic::Diagnostic;
use crate::graph::Topology;
use crate::plan::{Action, Change, Plan, StartPosition, TopologyPlan};
use crate::spec::Transform;

/// `{"from","to","valid","errors","topologies"}` (SPEC §5). `plan` is `None` when invalid.
pub fn json(from: Option<&str>, to: &str, plan: Option<&Plan>, errors: &[Diagnostic]) -> Value {
    json!({
        "from": from,
        "to": to,
        "valid": plan.is_some(),
        "errors": errors,
        "topologies": plan.map(|p| json!(p.topologies)).unwrap_or_else(|| json!([])),
    })
}

fn change_word(change: Change) -> &'static str {
    match change {
        Change::Added => "added",
        Change::Removed => "removed",
        Change::Replaced => "replaced",
        Change::Updated => "updated",
        Change::Changed => "changed",
        Change::Unchanged => "unchanged",
    }
}

fn sign(change: Change) -> char {
    match change {
        Change::Added => '+',
        Change::Removed => '-',
        Change::Replaced | Change::Changed => '~',
        Change::Updated => '*',
        Change::Unchanged => ' ',
    }
}

/// One action as a sentence.
pub fn describe(action: &Action) -> String {
    match action {
        Action::CreateTopic {
            topic,
            partitions,
            replication,
            ..
        } => {
            let s = if *partitions == 1 { "" } else { "s" };
            let replicas = match replication {
                Some(n) => format!(", {n} replicas"),
                None => String::new(),
            };
            format!("create topic `{topic}` ({partitions} partition{s}{replicas})")
        }
        Action::StartProcessor(start) => {
            let inputs: Vec<String> = start
                .inputs
                .iter()
                .map(|i| {
                    let from = match i.from {
                        StartPosition::Earliest => "earliest",
                        StartPosition::Latest => "latest",
                        StartPosition::Cutover => "cutover offsets",
                    };
                    format!("`{}` from {from}", i.topic)
                })
                .collect();
            let outputs: Vec<String> = start.outputs.iter().map(|t| format!("`{t}`")).collect();
            format!(
                "start `{}` ({}) running {} reading {}; writing {}",
                start.step,
                start.identity.short(),
                transform(&start.transform),
                inputs.join(", "),
                if outputs.is_empty() {
                    "nothing".to_owned()
                } else {
                    outputs.join(", ")
                }
            )
        }
        Action::UpdateProcessor {
            step,
            identity,
            scale,
            resources,
            ..
        } => {
            let resources = match resources {
                Some(r) => format!(
                    ", cpu {}, memory {}",
                    r.cpu.as_deref().unwrap_or("unset"),
                    r.memory.as_deref().unwrap_or("unset")
                ),
                None => String::new(),
            };
            format!(
                "update `{step}` ({}) in place: {}..{} replicas (lag threshold {}){resources}",
                identity.short(),
                scale.min,
                scale.max,
                scale.lag_threshold
            )
        }
        Action::DrainProcessor {
            step,
            identity,
            topics,
            ..
        } => format!(
            "drain `{step}` ({}) until its lag on {} is 0",
            identity.short(),
            quoted(topics)
        ),
        Action::StopProcessor {
            step,
            identity,
            successor,
            hand_over,
            ..
        } => match successor {
            Some(successor) => format!(
                "stop `{step}` ({}) gracefully and hand its committed offsets on {} over to `{successor}`",
                identity.short(),
                quoted(hand_over)
            ),
            None => format!("stop `{step}` ({}) gracefully", identity.short()),
        },
        Action::DeleteTopic { topic } => format!("delete topic `{topic}`"),
    }
}

/// What a processor runs, on one line: what a reviewer checks first.
fn transform(transform: &Transform) -> String {
    let (kind, text) = match transform {
        Transform::Jq { program } => ("jq", program.clone()),
        Transform::Sql { query } => ("sql", query.clone()),
        Transform::Exec { command, .. } => ("exec", command.join(" ")),
        Transform::Http { image, .. } => ("http", image.clone()),
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    // A code span that holds backticks is delimited by two.
    if text.contains('`') {
        format!("{kind} `` {text} ``")
    } else {
        format!("{kind} `{text}`")
    }
}

fn quoted(topics: &[String]) -> String {
    topics
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn text(plan: &Plan) -> String {
    let mut out = format!(
        "plan {} → {}\n",
        plan.from.as_deref().map_or("(empty cluster)", short),
        short(&plan.to)
    );
    if plan.is_empty() {
        out.push_str("no changes\n");
        return out;
    }
    for topology in plan
        .topologies
        .iter()
        .filter(|t| t.change != Change::Unchanged)
    {
        let _ = writeln!(
            out,
            "\n{} topology {} ({}, {} cutover)",
            sign(topology.change),
            topology.name,
            change_word(topology.change),
            match topology.cutover {
                crate::spec::CutoverMode::Parallel => "parallel",
                crate::spec::CutoverMode::Ordered => "ordered",
            }
        );
        for step in &topology.steps {
            let ids = match (step.identity.from, step.identity.to) {
                (Some(a), Some(b)) if a != b => format!("{} → {}", a.short(), b.short()),
                (_, Some(b)) => b.short(),
                (Some(a), None) => a.short(),
                (None, None) => String::new(),
            };
            let _ = writeln!(
                out,
                "  {} {:<24} {:<9} {:<9} {ids}",
                sign(step.change),
                step.name,
                serde_plain(&step.kind),
                change_word(step.change)
            );
        }
        if !topology.actions.is_empty() {
            out.push_str("  actions:\n");
            for (i, action) in topology.actions.iter().enumerate() {
                let _ = writeln!(out, "  {:>3}. {}", i + 1, describe(action));
            }
        }
    }
    out
}

fn serde_plain<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// What a reviewer reads on a pull request: a summary table, the new graph in Mermaid with
/// added, replaced, updated and removed steps styled apart, and the ordered cutover actions.
pub fn markdown(plan: &Plan, new_graphs: &[Topology], old_graphs: &[Topology]) -> String {
    let mut out = format!(
        "### Plumber plan: `{}` → `{}`\n\n",
        plan.from.as_deref().map_or("empty cluster", short),
        short(&plan.to)
    );
    if plan.is_empty() {
        out.push_str("No changes: every topology keeps running as it is.\n");
        return out;
    }
    out.push_str("| Topology | Change | Added | Replaced | Updated | Removed | Unchanged |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|\n");
    for topology in &plan.topologies {
        let count = |c: Change| topology.steps.iter().filter(|s| s.change == c).count();
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} | {} |",
            topology.name,
            change_word(topology.change),
            count(Change::Added),
            count(Change::Replaced),
            count(Change::Updated),
            count(Change::Removed),
            count(Change::Unchanged)
        );
    }
    let new_by_name: BTreeMap<&str, &Topology> =
        new_graphs.iter().map(|t| (t.name.as_str(), t)).collect();
    let old_by_name: BTreeMap<&str, &Topology> =
        old_graphs.iter().map(|t| (t.name.as_str(), t)).collect();
    for topology in plan
        .topologies
        .iter()
        .filter(|t| t.change != Change::Unchanged)
    {
        let _ = writeln!(
            out,
            "\n#### `{}`: {}\n",
            topology.name,
            change_word(topology.change)
        );
        out.push_str(&topology_mermaid(
            topology,
            new_by_name.get(topology.name.as_str()).copied(),
            old_by_name.get(topology.name.as_str()).copied(),
        ));
        if !topology.actions.is_empty() {
            out.push_str("\nCutover actions, in order:\n\n");
            for (i, action) in topology.actions.iter().enumerate() {
                let _ = writeln!(out, "{}. {}", i + 1, describe(action));
            }
        }
    }
    out
}

/// The new graph, with removed steps drawn as dashed ghosts attached to their old inputs.
fn topology_mermaid(plan: &TopologyPlan, new: Option<&Topology>, old: Option<&Topology>) -> String {
    let mut out = String::from("```mermaid\nflowchart LR\n");
    let change_of: BTreeMap<&str, Change> = plan
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.change))
        .collect();
    let mut classes: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let class_of = |c: Change| match c {
        Change::Added => Some("added"),
        Change::Replaced => Some("replaced"),
        Change::Updated => Some("updated"),
        Change::Removed => Some("removed"),
        Change::Changed | Change::Unchanged => None,
    };
    let drawn = new.or(old);
    if let Some(graph) = new {
        for (id, step) in graph.steps() {
            let _ = writeln!(out, "  {}", mermaid_node(graph, id));
            if let Some(class) = change_of.get(step.name.as_str()).and_then(|c| class_of(*c)) {
                classes
                    .entry(class)
                    .or_default()
                    .push(mermaid_id(&graph.name, &step.name));
            }
        }
        out.push_str(&mermaid_edges(graph));
    }
    if let Some(old) = old {
        let removed = |name: &str| change_of.get(name) == Some(&Change::Removed);
        for (id, step) in old.steps().filter(|(_, s)| removed(&s.name)) {
            let _ = writeln!(out, "  {}", mermaid_node(old, id));
            classes
                .entry("removed")
                .or_default()
                .push(mermaid_id(&old.name, &step.name));
            for input in old.inputs(id) {
                let from = &old.step(input).name;
                let present = new.is_some_and(|n| n.find(from).is_some()) || removed(from);
                if present {
                    let _ = writeln!(
                        out,
                        "  {} -.-> {}",
                        mermaid_id(&old.name, from),
                        mermaid_id(&old.name, &step.name)
                    );
                }
            }
        }
    }
    if drawn.is_some() {
        out.push_str("  classDef added fill:#d4f7d4,stroke:#1a7f37,stroke-width:2px\n");
        out.push_str("  classDef replaced fill:#fff4c2,stroke:#9a6700,stroke-width:2px\n");
        out.push_str("  classDef updated fill:#ddf4ff,stroke:#0969da\n");
        out.push_str(
            "  classDef removed fill:#ffebe9,stroke:#cf222e,stroke-dasharray:5 5,color:#82071e\n",
        );
        for (class, nodes) in classes {
            let _ = writeln!(out, "  class {} {class}", nodes.join(","));
        }
    }
    out.push_str("```\n");
    out
}
