//! What a preview environment would run (`plumber plan --preview`), as text, markdown and
//! JSON.

use std::collections::BTreeMap;

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

/// One topology of a preview, as the review texts show it.
pub struct Row<'a> {
    pub topology: &'a str,
    /// Its own name, `<topology>.<slug>`.
    pub preview: &'a str,
    pub processors: Vec<&'a str>,
    /// What it reads live, when known.
    pub reads: Option<Vec<&'a str>>,
    /// Shadow topic → the sink topic it stands in for.
    pub shadow_topics: &'a BTreeMap<String, String>,
}

impl<'a> Row<'a> {
    fn of(preview: &'a Preview) -> Row<'a> {
        Row {
            topology: &preview.of,
            preview: &preview.graph.name,
            processors: processors(preview),
            reads: Some(preview.live_topics.iter().map(String::as_str).collect()),
            shadow_topics: &preview.shadow_topics,
        }
    }
}

/// The section of a plan (`plumber plan --preview`): what a preview would run.
pub fn markdown(previews: &[Preview], slug: &str) -> String {
    let mut out = format!("### Preview environment `{slug}`\n\n");
    if previews.is_empty() {
        out.push_str("Nothing to run: the change starts no processor.\n");
        return out;
    }
    out.push_str(&format!("Runs {WHAT_IT_IS}.\n\n"));
    out.push_str(&table(&previews.iter().map(Row::of).collect::<Vec<_>>()));
    out
}

/// The section of a pull request's plan comment while its preview runs.
pub fn running_markdown(rows: &[Row<'_>], slug: &str) -> String {
    let mut out = format!("### Preview environment `{slug}` runs\n\n");
    out.push_str(&format!(
        "Running {WHAT_IT_IS}. Torn down when the pull request is merged or closed, or loses its label.\n\n"
    ));
    out.push_str(&table(rows));
    out
}

fn table(rows: &[Row<'_>]) -> String {
    let code = |items: &[&str]| {
        items
            .iter()
            .map(|i| format!("`{i}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let reads = rows.iter().any(|r| r.reads.is_some());
    let mut out = String::from("| topology | runs |");
    out.push_str(if reads { " reads live |" } else { "" });
    out.push_str(" writes instead of your sinks |\n|---|---|");
    out.push_str(if reads { "---|" } else { "" });
    out.push_str("---|\n");
    for row in rows {
        out.push_str(&format!(
            "| `{}` (as `{}`) | {} |",
            row.topology,
            row.preview,
            code(&row.processors)
        ));
        if reads {
            out.push_str(&format!(
                " {} |",
                code(row.reads.as_deref().unwrap_or_default())
            ));
        }
        out.push_str(&format!(
            " {} |\n",
            row.shadow_topics
                .iter()
                .map(|(shadow, sink)| format!("`{shadow}` (not `{sink}`)"))
                .collect::<Vec<_>>()
                .join(", ")
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
