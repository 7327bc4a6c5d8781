//! What a preview environment would run (`plumber plan --preview`), as text, markdown and
//! JSON.

use serde_json::{Value, json};

use crate::graph::Kind;
use crate::plan::preview::Preview;

const WHAT_IT_IS: &str = "the changed steps and those downstream of them, on live data, in consumer groups of their own from the latest offsets, writing shadow topics instead of your sinks";

fn processors(preview: &Preview) -> Vec<&str> {
    preview
        .graph
        .steps()
        .filter(|(_, s)| s.kind() == Kind::Processor)
        .map(|(_, s)| s.name.as_str())
        .collect()
}

pub fn text(previews: &[Preview], slug: &str) -> String {
    if previews.is_empty() {
        return format!("preview `{slug}`: nothing to run (the change starts no processor)\n");
    }
    let mut out = format!("preview `{slug}` runs {WHAT_IT_IS}:\n");
    for preview in previews {
        out.push_str(&format!(
            "  {} (as {})\n    runs:   {}\n    reads:  {}\n    writes: {}\n",
            preview.of,
            preview.graph.name,
            processors(preview).join(", "),
            join(preview.live_topics.iter().map(String::as_str)),
            join(
                preview
                    .shadow_topics
                    .iter()
                    .map(|(shadow, sink)| format!("{shadow} (instead of {sink})"))
            ),
        ));
    }
    out
}

pub fn markdown(previews: &[Preview], slug: &str) -> String {
    let mut out = format!("### Preview environment `{slug}`\n\n");
    if previews.is_empty() {
        out.push_str("Nothing to run: the change starts no processor.\n");
        return out;
    }
    out.push_str(&format!("Runs {WHAT_IT_IS}.\n\n"));
    out.push_str("| topology | runs | reads live | writes instead of your sinks |\n");
    out.push_str("|---|---|---|---|\n");
    for preview in previews {
        let code = |items: Vec<String>| {
            items
                .iter()
                .map(|i| format!("`{i}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&format!(
            "| `{}` (as `{}`) | {} | {} | {} |\n",
            preview.of,
            preview.graph.name,
            code(processors(preview).into_iter().map(str::to_owned).collect()),
            code(preview.live_topics.iter().cloned().collect()),
            preview
                .shadow_topics
                .iter()
                .map(|(shadow, sink)| format!("`{shadow}` (not `{sink}`)"))
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    out
}

pub fn json(previews: &[Preview], slug: &str) -> Value {
    json!({
        "slug": slug,
        "topologies": previews.iter().map(|p| json!({
            "topology": p.of,
            "preview": p.graph.name,
            "processors": processors(p),
            "reads": p.live_topics,
            "shadowTopics": p.shadow_topics,
        })).collect::<Vec<_>>(),
    })
}

fn join(items: impl Iterator<Item = impl AsRef<str>>) -> String {
    let items: Vec<String> = items.map(|i| i.as_ref().to_owned()).collect();
    if items.is_empty() {
        "nothing".into()
    } else {
        items.join(", ")
    }
}
