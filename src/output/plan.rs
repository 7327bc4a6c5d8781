//! `plumber plan`: the plan as text for a terminal, Markdown for a pull request, JSON for tools.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use serde_json::{Value, json};

use super::graph::{mermaid_id, mermaid_node};
use super::short_commit as short;
use crate::diagnostic::Diagnostic;
use crate::graph::{Kind, Topology};
use crate::plan::deployment::TopicKind;
use crate::plan::{
    Action, Carry, Change, FieldChange, Plan, StartPosition, StepPlan, TopologyPlan,
};
use crate::spec::{CutoverMode, Transform};

/// `{"from","to","valid","errors","topologies"}` (SPEC §5). `plan` is `None` when invalid.
pub fn json(from: Option<&str>, to: &str, plan: Option<&Plan>, errors: &[Diagnostic]) -> Value {
    json!({
        "from": from,
        "to": to,
        "valid": plan.is_some(),
        "errors": errors,
        "keepTopics": plan.is_some_and(|p| p.keep_topics),
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
            kind: TopicKind::Shadow,
            ..
        } => format!(
            "create shadow topic `{topic}` (as many partitions as the topic it stands in for)"
        ),
        Action::CreateTopic {
            topic,
            like: Some(like),
            ..
        } => format!("create topic `{topic}` (as many partitions as `{like}`)"),
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
            let state = match (&start.state, &start.table) {
                (Some(run), _) => format!("; state: {}", carry(&run.topic, &run.carry)),
                (None, Some(table)) => format!("; table: {}", table_read(table)),
                (None, None) => String::new(),
            };
            format!(
                "start `{}` ({}) running {} reading {}; writing {}{state}",
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
        Action::StartWarm(start) => {
            let outputs: Vec<String> = start.outputs.iter().map(|t| format!("`{t}`")).collect();
            format!(
                "start `{}` ({}) warm, running {}: it joins its group and holds {} unread until \
                 its hand-off; writing {}",
                start.step,
                start.identity.short(),
                transform(&start.transform),
                quoted(
                    &start
                        .inputs
                        .iter()
                        .map(|i| i.topic.clone())
                        .collect::<Vec<_>>()
                ),
                if outputs.is_empty() {
                    "nothing".to_owned()
                } else {
                    outputs.join(", ")
                }
            )
        }
        Action::HandOff {
            step,
            identity,
            group,
        } => format!(
            "hand `{step}` ({}) its start through `{}`: where its predecessor stopped, or the \
             beginning of a topic created in this move; it reads once its group committed them",
            identity.short(),
            crate::plan::deployment::handoff_group(group)
        ),
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
        Action::DeleteGroups { base, lives } => {
            if *lives == 1 {
                format!("delete the consumer group of `{base}`")
            } else {
                format!("delete the consumer groups of `{base}`'s {lives} lives")
            }
        }
    }
}

/// What a stateful step's new life starts from, for a reviewer.
/// What a join's new life reads of its table.
fn table_read(topic: &str) -> String {
    format!(
        "`{topic}` read whole, from its beginning, by each instance before its first record \
         (nothing is carried over: the topic is the table)"
    )
}

fn carry(topic: &str, carry: &Carry) -> String {
    match carry {
        Carry::Restore => format!("restored from `{topic}` (the same state as before)"),
        Carry::Rebuild { span_ms } => format!(
            "rebuilt into `{topic}` from each input partition's records of the {} before the \
             cutover offsets, without emitting (the old windows close once, in the new life)",
            humantime::format_duration(std::time::Duration::from_millis(
                u64::try_from(*span_ms).unwrap_or(0)
            ))
        ),
        Carry::Earliest => format!(
            "rebuilt into `{topic}` from the earliest records the input holds, without \
             emitting (`stateStart: earliest`)"
        ),
        Carry::Empty => format!("starts empty in `{topic}`"),
        Carry::Cannot { why } => format!(
            "CANNOT be carried over: {why}. The move waits until the step file sets \
             `stateStart: empty` (windows open at the cutover count only what follows) or \
             `stateStart: earliest` (rebuild from the earliest records)"
        ),
    }
}

/// What a processor runs, on one line: what a reviewer checks first.
fn transform(transform: &Transform) -> String {
    let (kind, text) = match transform {
        Transform::Jq { program } => ("jq", program.clone()),
        Transform::Sql { query, .. } => ("sql", query.clone()),
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

/// Why a step is `replaced` or `updated`, in one line: which fields of its own file changed,
/// and which inputs changed identity.
fn why(step: &StepPlan) -> String {
    let users_topic = matches!(step.kind, Kind::Source | Kind::Sink);
    match step.change {
        Change::Added if users_topic => "new step file; its topic is the users' own".to_owned(),
        Change::Added => "new step file".to_owned(),
        Change::Removed if users_topic => {
            "step file removed; its topic stays (the users' own)".to_owned()
        }
        Change::Removed => "step file removed".to_owned(),
        _ => {
            let Some(reason) = &step.reason else {
                return String::new();
            };
            let mut parts = Vec::new();
            if !reason.changed.is_empty() {
                let fields: Vec<String> = reason
                    .changed
                    .iter()
                    .map(|c| format!("`{}`", c.field))
                    .collect();
                parts.push(format!("changed {}", fields.join(", ")));
            }
            match reason.upstream.as_slice() {
                [] => {}
                [one] => parts.push(format!("its input `{one}` changed")),
                many => parts.push(format!("its inputs {} changed", quoted(many))),
            }
            parts.join("; ")
        }
    }
}

/// The changed fields of a step as diff lines (`-old`, `+new`), each field under a
/// `@@ field @@` line. Long values show only the lines around what changed.
fn field_diffs(changes: &[FieldChange]) -> Vec<String> {
    let mut out = Vec::new();
    for change in changes {
        out.push(format!("@@ {} @@", change.field));
        let old = change.from.as_deref().unwrap_or("");
        let new = change.to.as_deref().unwrap_or("");
        let diff = similar::TextDiff::from_lines(old, new);
        let mut unified = diff.unified_diff();
        for (i, hunk) in unified.context_radius(2).iter_hunks().enumerate() {
            if i > 0 {
                out.push(" …".to_owned());
            }
            for line in hunk.iter_changes() {
                let sign = match line.tag() {
                    similar::ChangeTag::Delete => '-',
                    similar::ChangeTag::Insert => '+',
                    similar::ChangeTag::Equal => ' ',
                };
                let text = line.to_string_lossy();
                out.push(format!("{sign}{}", text.trim_end_matches(['\n', '\r'])));
            }
        }
    }
    out
}

fn ids(step: &StepPlan) -> String {
    match (step.change, step.identity.from, step.identity.to) {
        (Change::Replaced, Some(a), Some(b)) => format!("{} → {}", a.short(), b.short()),
        (_, _, Some(b)) => b.short(),
        (_, Some(a), None) => a.short(),
        (_, None, None) => String::new(),
    }
}

fn cutover_word(mode: CutoverMode) -> &'static str {
    match mode {
        CutoverMode::Parallel => "parallel",
        CutoverMode::Ordered => "ordered",
    }
}

pub fn text(plan: &Plan) -> String {
    let mut out = format!(
        "plan {} → {}{}\n",
        plan.from.as_deref().map_or("(empty cluster)", short),
        short(&plan.to),
        if plan.keep_topics {
            " (--keep-topics: retired topics are kept)"
        } else {
            ""
        }
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
            cutover_word(topology.cutover)
        );
        for step in &topology.steps {
            let _ = writeln!(
                out,
                "  {} {:<24} {:<9} {:<9} {}",
                sign(step.change),
                step.name,
                serde_plain(&step.kind),
                change_word(step.change),
                ids(step)
            );
            if step.change == Change::Unchanged {
                continue;
            }
            let owners = if step.owners.is_empty() {
                String::new()
            } else {
                format!(" (owners {})", step.owners.join(" "))
            };
            let _ = writeln!(out, "      {}{owners}", step.file);
            let why = why(step);
            if !why.is_empty() {
                let _ = writeln!(out, "      why: {}", why.replace('`', ""));
            }
            if let Some(reason) = &step.reason {
                for line in field_diffs(&reason.changed) {
                    let _ = writeln!(out, "        {line}");
                }
            }
        }
        if !topology.actions.is_empty() {
            out.push_str("  actions:\n");
            for (i, action) in topology.actions.iter().enumerate() {
                let _ = writeln!(out, "  {:>3}. {}", i + 1, describe(action));
            }
        }
        if !topology.kept_topics.is_empty() {
            out.push_str("  kept, not deleted (--keep-topics):\n");
            for topic in &topology.kept_topics {
                let _ = writeln!(out, "       {topic}");
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

/// How much of the plan the Markdown shows; [`Shape::FULL`] is all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    diagram: Diagram,
    /// Per topology, the first N cutover actions.
    actions: Option<usize>,
    /// The diffs of changed fields.
    diffs: bool,
    /// Per topology, the first N changed steps of its table.
    steps: Option<usize>,
    /// The first N changed topologies.
    topologies: Option<usize>,
    /// The summary's rows of unchanged topologies (a count stays).
    unchanged_rows: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Diagram {
    Full,
    /// Only the changed steps and their neighbours.
    Changed,
    None,
}

impl Shape {
    const FULL: Shape = Shape {
        diagram: Diagram::Full,
        actions: None,
        diffs: true,
        steps: None,
        topologies: None,
        unchanged_rows: true,
    };

    /// What this shape leaves out, for the note at the top; empty for the full plan.
    fn left_out(&self) -> Vec<String> {
        let mut out = Vec::new();
        match self.diagram {
            Diagram::Full => {}
            Diagram::Changed => {
                out.push("the diagrams show only changed steps and their neighbours".to_owned())
            }
            Diagram::None => out.push("the diagrams are left out".to_owned()),
        }
        if let Some(n) = self.actions {
            out.push(format!(
                "only the first {n} cutover actions of each topology"
            ));
        }
        if !self.unchanged_rows {
            out.push("the summary lists only changed topologies".to_owned());
        }
        if !self.diffs {
            out.push("the diffs are left out".to_owned());
        }
        if let Some(n) = self.steps {
            out.push(format!("only the first {n} changed steps of each topology"));
        }
        if let Some(n) = self.topologies {
            out.push(format!("only the first {n} changed topologies"));
        }
        out
    }
}

/// GitHub's limit on the body of a pull-request comment.
pub const GITHUB_COMMENT_LIMIT: usize = 65_536;

/// What a reviewer reads on a pull request: a summary table; per changed topology the new
/// graph in Mermaid (added, replaced, updated and removed steps styled apart), its changed
/// steps with why, file and owners, the diffs of what changed, and the ordered cutover
/// actions.
pub fn markdown(plan: &Plan, new_graphs: &[Topology], old_graphs: &[Topology]) -> String {
    render_markdown(plan, new_graphs, old_graphs, &Shape::FULL)
}

/// [`markdown`] within `limit` bytes (so within `limit` characters however a forge counts
/// them; [`GITHUB_COMMENT_LIMIT`] for a GitHub comment). Shortened only as far as needed, in
/// this order: no rows of unchanged topologies in the summary (their count stays), diagrams
/// of only the changed steps and their neighbours, no diagrams, fewer cutover actions per
/// topology, no diffs, fewer steps per table, fewer topologies; each cut is whole sections,
/// so tables and code blocks stay whole, and the text says what it left out. A limit too
/// small even for the summary gives a note that says so (cut to `limit`).
pub fn markdown_within(
    plan: &Plan,
    new_graphs: &[Topology],
    old_graphs: &[Topology],
    limit: usize,
) -> String {
    let render = |shape: &Shape| render_markdown(plan, new_graphs, old_graphs, shape);
    let fits = |shape: &Shape| render(shape).len() <= limit;
    let mut shape = Shape::FULL;
    if fits(&shape) {
        return render(&shape);
    }
    // Rows that say "unchanged" go before anything about a change: at a few thousand
    // topologies they alone pass a forge's limit.
    if plan
        .topologies
        .iter()
        .any(|t| t.change == Change::Unchanged)
    {
        shape.unchanged_rows = false;
    }
    for diagram in [Diagram::Full, Diagram::Changed, Diagram::None] {
        shape.diagram = diagram;
        if fits(&shape) {
            return render(&shape);
        }
    }
    let most_actions = plan.topologies.iter().map(|t| t.actions.len()).max();
    let most_steps = plan.topologies.iter().map(|t| t.steps.len()).max();
    let changed = plan
        .topologies
        .iter()
        .filter(|t| t.change != Change::Unchanged)
        .count();
    // Each cut keeps as much as fits, then the next one starts from where it left off.
    type Cut = fn(&mut Shape, Option<usize>);
    let cuts: [(Cut, Option<usize>); 4] = [
        (|s, n| s.actions = n, most_actions),
        (|s, _| s.diffs = false, None),
        (|s, n| s.steps = n, most_steps),
        (|s, n| s.topologies = n, Some(changed)),
    ];
    for (cut, most) in cuts {
        match most {
            None => {
                cut(&mut shape, None);
                if fits(&shape) {
                    return render(&shape);
                }
            }
            Some(most) => {
                let with = |n: usize| {
                    let mut s = shape;
                    cut(&mut s, Some(n));
                    s
                };
                if fits(&with(0)) {
                    // The largest count that fits: `lo` fits, `hi` does not.
                    let (mut lo, mut hi) = (0, most + 1);
                    while hi - lo > 1 {
                        let mid = lo + (hi - lo) / 2;
                        if fits(&with(mid)) {
                            lo = mid;
                        } else {
                            hi = mid;
                        }
                    }
                    return render(&with(lo));
                }
                shape = with(0);
            }
        }
    }
    let mut note = format!(
        "### Plumber plan: `{}` → `{}`\n\nThe plan is too long for this comment \
         ({} characters at the least); run `plumber plan --format markdown` to read it.\n",
        plan.from.as_deref().map_or("empty cluster", short),
        short(&plan.to),
        render(&shape).len()
    );
    if note.len() > limit {
        let mut end = limit;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

/// A table cell: no line breaks, `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// A fenced code block whose fence is longer than any run of backticks in `body`.
fn fenced(info: &str, body: &str) -> String {
    let longest = body.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let mut out = format!("{fence}{info}\n{body}");
    if !body.is_empty() && !body.ends_with('\n') {
        out.push('\n');
    }
    let _ = writeln!(out, "{fence}");
    out
}

fn render_markdown(
    plan: &Plan,
    new_graphs: &[Topology],
    old_graphs: &[Topology],
    shape: &Shape,
) -> String {
    let mut out = format!(
        "### Plumber plan: `{}` → `{}`\n\n",
        plan.from.as_deref().map_or("empty cluster", short),
        short(&plan.to)
    );
    if plan.is_empty() {
        out.push_str("No changes: every topology keeps running as it is.\n");
        return out;
    }
    let left_out = shape.left_out();
    if !left_out.is_empty() {
        let _ = writeln!(
            out,
            "> Shortened to fit one comment: {}. `plumber plan --format markdown` prints all \
             of it.\n",
            left_out.join("; ")
        );
    }
    if plan.keep_topics {
        out.push_str(
            "Planned for a daemon run with `--keep-topics`: retired internal topics are kept, \
             not deleted.\n\n",
        );
    }
    out.push_str("| Topology | Change | Added | Replaced | Updated | Removed | Unchanged |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|\n");
    let mut unlisted = 0;
    for topology in &plan.topologies {
        if !shape.unchanged_rows && topology.change == Change::Unchanged {
            unlisted += 1;
            continue;
        }
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
    if unlisted > 0 {
        let _ = writeln!(
            out,
            "\n{unlisted} unchanged topolog{} not listed.",
            if unlisted == 1 { "y is" } else { "ies are" }
        );
    }
    out.push_str(
        "\nSteps are counted per step file. Only processors are replaced (cut over to a new \
         identity); sources and sinks are topics their users own, which Plumber never creates, \
         changes or deletes.\n",
    );
    let new_by_name: BTreeMap<&str, &Topology> =
        new_graphs.iter().map(|t| (t.name.as_str(), t)).collect();
    let old_by_name: BTreeMap<&str, &Topology> =
        old_graphs.iter().map(|t| (t.name.as_str(), t)).collect();
    let changed: Vec<&TopologyPlan> = plan
        .topologies
        .iter()
        .filter(|t| t.change != Change::Unchanged)
        .collect();
    let shown = shape.topologies.unwrap_or(changed.len()).min(changed.len());
    for topology in &changed[..shown] {
        let _ = writeln!(
            out,
            "\n#### `{}`: {}\n",
            topology.name,
            change_word(topology.change)
        );
        let new = new_by_name.get(topology.name.as_str()).copied();
        let old = old_by_name.get(topology.name.as_str()).copied();
        match shape.diagram {
            Diagram::None => {}
            diagram => {
                out.push_str(&topology_mermaid(topology, new, old, diagram));
                out.push('\n');
            }
        }
        topology_steps(&mut out, topology, shape);
        topology_actions(&mut out, topology, shape);
    }
    if shown < changed.len() {
        let rest: Vec<String> = changed[shown..]
            .iter()
            .map(|t| format!("`{}`", t.name))
            .collect();
        let _ = writeln!(
            out,
            "\n… and {} more changed topolog{}: {}.",
            rest.len(),
            if rest.len() == 1 { "y" } else { "ies" },
            rest.join(", ")
        );
    }
    out
}

/// The changed steps: a table (why, file, owners), then the diff of each one's fields.
fn topology_steps(out: &mut String, topology: &TopologyPlan, shape: &Shape) {
    let changed: Vec<&StepPlan> = topology
        .steps
        .iter()
        .filter(|s| s.change != Change::Unchanged)
        .collect();
    if changed.is_empty() {
        return;
    }
    let shown = shape.steps.unwrap_or(changed.len()).min(changed.len());
    // Owners only where the repository names some (CODEOWNERS).
    let owned = changed.iter().any(|s| !s.owners.is_empty());
    if shown > 0 {
        out.push_str("| Step | Kind | Change | Why | File |");
        out.push_str(if owned { " Owners |\n" } else { "\n" });
        out.push_str(if owned {
            "|---|---|---|---|---|---|\n"
        } else {
            "|---|---|---|---|---|\n"
        });
        for step in &changed[..shown] {
            let _ = write!(
                out,
                "| `{}` | {} | {} | {} | `{}` |",
                step.name,
                serde_plain(&step.kind),
                change_word(step.change),
                cell(&why(step)),
                cell(&step.file),
            );
            if owned {
                let _ = write!(out, " {} |", cell(&step.owners.join(" ")));
            }
            out.push('\n');
        }
    }
    if shown < changed.len() {
        let _ = writeln!(out, "\n… and {} more changed steps.", changed.len() - shown);
    }
    if !shape.diffs {
        return;
    }
    for step in &changed[..shown] {
        let Some(reason) = step.reason.as_ref().filter(|r| !r.changed.is_empty()) else {
            continue;
        };
        let _ = write!(out, "\n`{}`:\n\n", step.name);
        out.push_str(&fenced(
            "diff",
            &(field_diffs(&reason.changed).join("\n") + "\n"),
        ));
    }
}

fn topology_actions(out: &mut String, topology: &TopologyPlan, shape: &Shape) {
    // What each stateful step's new life starts from, whatever the size budget leaves of
    // the actions: a reviewer decides on it (a state that cannot be carried over holds the
    // move until the step file says).
    let stateful: Vec<String> = topology
        .actions
        .iter()
        .filter_map(|action| match action {
            Action::StartProcessor(start) => match (&start.state, &start.table) {
                (Some(run), _) => Some(carry(&run.topic, &run.carry)),
                (None, Some(table)) => Some(format!("its table {}", table_read(table))),
                (None, None) => None,
            }
            .map(|what| format!("- `{}`: {what}", start.step)),
            _ => None,
        })
        .collect();
    if !stateful.is_empty() {
        out.push_str("\nState of the stateful steps that start:\n\n");
        for line in stateful {
            let _ = writeln!(out, "{line}");
        }
    }
    let all = topology.actions.len();
    let shown = shape.actions.unwrap_or(all).min(all);
    if all > 0 {
        out.push_str("\nCutover actions, in order:\n\n");
        for (i, action) in topology.actions[..shown].iter().enumerate() {
            let _ = writeln!(out, "{}. {}", i + 1, describe(action));
        }
        if shown < all {
            let _ = writeln!(
                out,
                "{}… and {} more action{}.",
                if shown > 0 { "\n" } else { "" },
                all - shown,
                if all - shown == 1 { "" } else { "s" }
            );
        }
    }
    if !topology.kept_topics.is_empty() {
        let _ = writeln!(
            out,
            "\nKept, not deleted (`--keep-topics`): {}.",
            quoted(&topology.kept_topics)
        );
    }
}

/// The new graph, with removed steps drawn as dashed ghosts attached to their old inputs.
/// [`Diagram::Changed`] draws only the steps that changed and their inputs and consumers.
fn topology_mermaid(
    plan: &TopologyPlan,
    new: Option<&Topology>,
    old: Option<&Topology>,
    diagram: Diagram,
) -> String {
    let change_of: BTreeMap<&str, Change> = plan
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.change))
        .collect();
    let changed = |name: &str| change_of.get(name).is_some_and(|c| *c != Change::Unchanged);
    // Which steps are drawn: all, or the changed ones and their neighbours.
    let mut drawn_names: BTreeSet<String> = BTreeSet::new();
    for graph in [new, old].into_iter().flatten() {
        for (id, step) in graph.steps() {
            let near = || {
                graph
                    .inputs(id)
                    .into_iter()
                    .chain(graph.consumers(id))
                    .any(|n| changed(&graph.step(n).name))
            };
            if diagram == Diagram::Full || changed(&step.name) || near() {
                drawn_names.insert(step.name.clone());
            }
        }
    }
    let drawn = |name: &str| drawn_names.contains(name);
    let mut out = String::from("```mermaid\nflowchart LR\n");
    let mut classes: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let class_of = |c: Change| match c {
        Change::Added => Some("added"),
        Change::Replaced => Some("replaced"),
        Change::Updated => Some("updated"),
        Change::Removed => Some("removed"),
        Change::Changed | Change::Unchanged => None,
    };
    if let Some(graph) = new {
        for (id, step) in graph.steps().filter(|(_, s)| drawn(&s.name)) {
            let _ = writeln!(out, "  {}", mermaid_node(graph, id));
            if let Some(class) = change_of.get(step.name.as_str()).and_then(|c| class_of(*c)) {
                classes
                    .entry(class)
                    .or_default()
                    .push(mermaid_id(&graph.name, &step.name));
            }
        }
        for (id, step) in graph.steps().filter(|(_, s)| drawn(&s.name)) {
            for input in graph.inputs(id) {
                let from = &graph.step(input).name;
                if drawn(from) {
                    let _ = writeln!(
                        out,
                        "  {} --> {}",
                        mermaid_id(&graph.name, from),
                        mermaid_id(&graph.name, &step.name)
                    );
                }
            }
        }
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
                if present && drawn(from) {
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
    if new.or(old).is_some() {
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
    if diagram == Diagram::Changed {
        out.push_str("\n_Only the changed steps and their neighbours are drawn._\n");
    }
    out
}
