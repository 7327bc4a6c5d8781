//! `plumber graph`: DOT, Mermaid and JSON views of topologies.

use std::fmt::Write;

use serde_json::{Value, json};

use crate::graph::{Kind, StepId, StepKind, Topology};

/// A short label for what a step does: its topic, or its transform kind.
pub fn step_detail(topology: &Topology, id: StepId) -> String {
    match &topology.step(id).kind {
        StepKind::Source { topic } | StepKind::Sink { topic } => topic.clone(),
        StepKind::Processor { transform, .. } => transform.kind().to_owned(),
    }
}

pub fn dot(topologies: &[&Topology]) -> String {
    let mut out =
        String::from("digraph plumber {\n  rankdir=LR;\n  node [fontname=\"Helvetica\"];\n");
    for topology in topologies {
        let _ = writeln!(
            out,
            "  subgraph \"cluster_{0}\" {{\n    label=\"{0}\";",
            topology.name
        );
        for (id, step) in topology.steps() {
            let shape = match step.kind() {
                Kind::Source => "cds",
                Kind::Processor => "box",
                Kind::Sink => "cylinder",
            };
            let _ = writeln!(
                out,
                "    \"{}/{}\" [label=\"{}\\n{}\", shape={shape}];",
                topology.name,
                step.name,
                step.name,
                escape_dot(&step_detail(topology, id))
            );
        }
        for (id, step) in topology.steps() {
            for input in topology.inputs(id) {
                let _ = writeln!(
                    out,
                    "    \"{0}/{1}\" -> \"{0}/{2}\";",
                    topology.name,
                    topology.step(input).name,
                    step.name
                );
            }
        }
        out.push_str("  }\n");
    }
    out.push_str("}\n");
    out
}

fn escape_dot(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A Mermaid node id: `<topology>__<step>` with `-` as `_`. Names are DNS labels (no `_`, no
/// leading or trailing `-`), so ids cannot collide.
pub fn mermaid_id(topology: &str, step: &str) -> String {
    format!("{topology}__{step}").replace('-', "_")
}

/// A Mermaid node: sources and sinks are rounded, processors rectangles.
pub fn mermaid_node(topology: &Topology, id: StepId) -> String {
    let step = topology.step(id);
    let node = mermaid_id(&topology.name, &step.name);
    let label = format!(
        "{}<br/><small>{}</small>",
        step.name,
        step_detail(topology, id)
    );
    match step.kind() {
        Kind::Source => format!("{node}([\"{label}\"])"),
        Kind::Processor => format!("{node}[\"{label}\"]"),
        Kind::Sink => format!("{node}[(\"{label}\")]"),
    }
}

pub fn mermaid(topologies: &[&Topology]) -> String {
    let mut out = String::from("flowchart LR\n");
    for topology in topologies {
        let _ = writeln!(
            out,
            "  subgraph {}[\"{}\"]",
            topology.name.replace('-', "_"),
            topology.name
        );
        for (id, _) in topology.steps() {
            let _ = writeln!(out, "    {}", mermaid_node(topology, id));
        }
        out.push_str("  end\n");
        out.push_str(&mermaid_edges(topology));
    }
    out
}

/// One `a --> b` line per edge.
pub fn mermaid_edges(topology: &Topology) -> String {
    let mut out = String::new();
    for (id, step) in topology.steps() {
        for input in topology.inputs(id) {
            let _ = writeln!(
                out,
                "  {} --> {}",
                mermaid_id(&topology.name, &topology.step(input).name),
                mermaid_id(&topology.name, &step.name)
            );
        }
    }
    out
}

pub fn json(commit: &str, topologies: &[&Topology]) -> Value {
    json!({
        "commit": commit,
        "topologies": topologies.iter().map(|t| topology_json(t)).collect::<Vec<_>>(),
    })
}

fn topology_json(topology: &Topology) -> Value {
    let steps: Vec<Value> = topology
        .steps()
        .map(|(id, step)| {
            let mut v = json!({
                "name": step.name,
                "kind": step.kind(),
                "file": step.file,
                "identity": step.identity,
                "inputs": topology
                    .inputs(id)
                    .iter()
                    .map(|&i| topology.step(i).name.clone())
                    .collect::<Vec<_>>(),
            });
            match &step.kind {
                StepKind::Source { topic } | StepKind::Sink { topic } => {
                    v["topic"] = json!(topic);
                }
                StepKind::Processor {
                    transform,
                    env,
                    partitions,
                    scale,
                    resources,
                    start_from,
                } => {
                    v["transform"] = json!(transform);
                    v["env"] = json!(env);
                    v["partitions"] = json!(partitions);
                    v["scale"] = json!(scale);
                    if let Some(resources) = resources {
                        v["resources"] = json!(resources);
                    }
                    v["startFrom"] = json!(start_from);
                    v["group"] = json!(topology.internal_name(id));
                    v["outputs"] = json!(topology.output_topics(id));
                }
            }
            v
        })
        .collect();
    let edges: Vec<[&str; 2]> = topology
        .steps()
        .flat_map(|(id, step)| {
            topology
                .inputs(id)
                .into_iter()
                .map(move |i| [topology.step(i).name.as_str(), step.name.as_str()])
        })
        .collect();
    json!({
        "name": topology.name,
        "cutover": topology.cutover,
        "cluster": topology.cluster,
        "steps": steps,
        "edges": edges,
    })
}
