//! The data diff of a plan: what a change does to records, before it is applied. For each
//! processor a plan replaces or adds, a bounded sample of recent records is read from what
//! feeds it (its source topics, or the internal topics of the upstream steps that run now),
//! and the old and the new version of the step run on the same records, in the step-test
//! worker ([`crate::steptest`]): how many records each passes, filters out and dead-letters,
//! which records' outputs changed (a few side by side), new dead-letter kinds, and output
//! fields that appeared or vanished.
//!
//! Reading never joins a consumer group: partitions are assigned at offsets chosen here and
//! nothing is committed, so the running steps' groups and lag are untouched. What a review
//! shows of a record leaves out the fields `plumber.yaml` masks (`review.maskFields`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde::Serialize;

use crate::graph::{StepKind, Topology};
pub use crate::kafka::SampleLimits;
use crate::kafka::{Admin, Sampled};
use crate::plan::{Change, Plan};
use crate::steptest::{Actual, Commands, Job, JobRecord, Limits, Ran, execute};

/// How many examples of changed records a diff keeps.
const EXAMPLES: usize = 3;

/// The data diff of one replaced or added processor.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepDiff {
    pub topology: String,
    pub step: String,
    pub change: Change,
    /// The topics the sample was read from.
    pub topics: Vec<String>,
    pub sampled: usize,
    /// The running version's results; `None` for an added step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old: Option<Tally>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<Tally>,
    /// Records whose outputs or dead letter differ between the versions.
    pub changed: usize,
    pub examples: Vec<Example>,
    /// Dead-letter kinds the new version gives that the old one does not.
    pub new_dead_letter_kinds: Vec<String>,
    /// Top-level fields of the new version's outputs that the old one's lack, and the other
    /// way round.
    pub fields_appeared: Vec<String>,
    pub fields_vanished: Vec<String>,
    /// Milliseconds reading the sample took, and running both versions on it.
    pub read_ms: u64,
    pub run_ms: u64,
    /// Why the step was not sampled or not run, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the diff of a step with state or a table cannot show.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
}

/// What one version did with the sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tally {
    /// Records with at least one output.
    pub passed: usize,
    pub filtered: usize,
    pub outputs: usize,
    pub dead_lettered: BTreeMap<String, usize>,
    /// Records the worker could not take (it timed out or died on them).
    pub failed: usize,
}

/// A record whose outputs changed, as a review shows it (masked fields left out).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Example {
    pub key: Option<String>,
    pub input: String,
    pub old: Vec<String>,
    pub new: Vec<String>,
}

/// The Kafka client records of a topology are read with (of its cluster), or why none.
pub type KafkaOf<'k> = dyn Fn(&Topology) -> Result<std::sync::Arc<dyn Admin>, String> + 'k;

/// The data diffs of `plan`'s replaced and added processors: `old` is what runs (the
/// plan's `from` side), `new` the planned graphs; records are read through the client
/// `kafka` gives for a topology (of its cluster).
#[allow(clippy::too_many_arguments)]
/// One version of a plan: its graphs, and whether and from where the commands of its exec
/// and http steps run.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    pub graphs: &'a [Topology],
    pub commands: Commands<'a>,
}

pub fn diff(
    plan: &Plan,
    old: Side<'_>,
    new: Side<'_>,
    kafka: &KafkaOf<'_>,
    sample: &SampleLimits,
    limits: &Limits,
    masked: &[String],
) -> Vec<StepDiff> {
    // The whole diff gets one step's time, whatever the plan holds: a pull request adding
    // a thousand steps must not hold the planner (and its wedge limit) for a thousand.
    let deadline = Instant::now() + sample.time + limits.time;
    let mut diffs = Vec::new();
    for topology in &plan.topologies {
        let Some(graph) = new.graphs.iter().find(|g| g.name == topology.name) else {
            continue;
        };
        let running = old.graphs.iter().find(|g| g.name == topology.name);
        for step in &topology.steps {
            if !matches!(step.change, Change::Replaced | Change::Added)
                || step.kind != crate::graph::Kind::Processor
            {
                continue;
            }
            let Some(id) = graph.find(&step.name) else {
                continue;
            };
            let mut diff = StepDiff {
                topology: topology.name.clone(),
                step: step.name.clone(),
                change: step.change,
                topics: Vec::new(),
                sampled: 0,
                old: None,
                new: None,
                changed: 0,
                examples: Vec::new(),
                new_dead_letter_kinds: Vec::new(),
                fields_appeared: Vec::new(),
                fields_vanished: Vec::new(),
                read_ms: 0,
                run_ms: 0,
                note: None,
                caveat: None,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let filled = if left.is_zero() {
                Err(format!(
                    "not sampled: the plan's data diff took all its time ({} s: `dataDiff.time` and `stepTests.time` together)",
                    (sample.time + limits.time).as_secs_f64()
                ))
            } else {
                let sample = SampleLimits {
                    time: sample.time.min(left),
                    ..sample.clone()
                };
                let limits = Limits {
                    time: limits.time.min(left),
                    ..limits.clone()
                };
                kafka(graph).and_then(|kafka| {
                    fill(
                        &mut diff,
                        (graph, new.commands),
                        id,
                        running.map(|r| (r, old.commands)),
                        &*kafka,
                        &sample,
                        &limits,
                        masked,
                    )
                })
            };
            if let Err(why) = filled {
                diff.note = Some(why);
            }
            diffs.push(diff);
        }
    }
    diffs
}

#[allow(clippy::too_many_arguments)]
fn fill(
    diff: &mut StepDiff,
    (graph, new_commands): (&Topology, Commands<'_>),
    id: crate::graph::StepId,
    running: Option<(&Topology, Commands<'_>)>,
    kafka: &dyn Admin,
    sample: &SampleLimits,
    limits: &Limits,
    masked: &[String],
) -> Result<(), String> {
    let new_job = Job::of_step(graph, id, new_commands).map_err(|why| format!("not run: {why}"))?;
    let old_id = running.and_then(|(r, commands)| r.find(&diff.step).map(|old| (r, old, commands)));
    let old_job = match old_id {
        Some((r, old, commands)) if matches!(r.step(old).kind, StepKind::Processor { .. }) => Some(
            Job::of_step(r, old, commands)
                .map_err(|why| format!("the running version is not run: {why}"))?,
        ),
        _ => None,
    };
    let running = running.map(|(r, _)| r);
    // What feeds it now: a source's topic, or the topic the running upstream writes.
    let mut inputs = Vec::new();
    for input in graph.inputs(id) {
        let name = &graph.step(input).name;
        let topic = match &graph.step(input).kind {
            StepKind::Source { topic } => topic.clone(),
            _ => {
                let upstream = running.and_then(|r| r.find(name).map(|u| r.topic_of(u)));
                upstream.ok_or_else(|| {
                    format!("not sampled: it reads `{name}`, which the change adds, so nothing feeds it yet")
                })?
            }
        };
        inputs.push((name.clone(), topic));
    }
    diff.topics = inputs.iter().map(|(_, t)| t.clone()).collect();
    let reading = Instant::now();
    let records = kafka
        .recent_records(&inputs, sample)
        .map_err(|why| format!("not sampled: {why}"))?;
    let read = reading.elapsed();
    // A join's table rows fill its table before its stream records run; they are not
    // records of the diff.
    let table_step = new_job
        .table_step()
        .or_else(|| old_job.as_ref().and_then(Job::table_step))
        .map(str::to_owned);
    let (table, mut records): (Vec<Sampled>, Vec<Sampled>) = records
        .into_iter()
        .partition(|r| Some(&r.from) == table_step.as_ref());
    // In each partition's order: a stateful step's state is the partition's.
    records
        .sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
    diff.sampled = records.len();
    diff.caveat = caveat(&new_job, old_job.as_ref(), &table, table_step.as_deref());
    let mut jobs = jobs_of(&new_job, &records, &table);
    if let Some(old_job) = &old_job {
        jobs.extend(jobs_of(old_job, &records, &table));
    }
    let running = Instant::now();
    let ran = execute(&jobs, limits);
    diff.read_ms = read.as_millis() as u64;
    diff.run_ms = running.elapsed().as_millis() as u64;
    let (new_ran, old_ran) = ran.split_at(records.len());
    diff.new = Some(tally(new_ran));
    let old_ran = (old_job.is_some()).then_some(old_ran);
    if let Some(old_ran) = old_ran {
        diff.old = Some(tally(old_ran));
        compare(diff, &records, old_ran, new_ran, masked);
    }
    Ok(())
}

fn job_record(record: &Sampled) -> JobRecord {
    JobRecord {
        from: record.from.clone(),
        key: record
            .key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned()),
        value: record.value.clone(),
        headers: record.headers.clone(),
        timestamp: record.timestamp,
    }
}

/// One job per record of `records`, so each record's outputs are its own. A stateful step
/// goes on from the state the record before it left: a `GROUP BY` from empty state at the
/// first record of each partition, a join with its table filled by `table` before its first
/// record.
fn jobs_of(template: &Job, records: &[Sampled], table: &[Sampled]) -> Vec<Job> {
    let joins = template.table_step().is_some();
    records
        .iter()
        .enumerate()
        .map(|(i, record)| {
            let mut batch = Vec::new();
            if joins && i == 0 {
                batch.extend(
                    table
                        .iter()
                        .filter(|row| Some(row.from.as_str()) == template.table_step())
                        .map(job_record),
                );
            }
            batch.push(job_record(record));
            let job = template.with_records(batch);
            let same_partition = i > 0
                && (&records[i - 1].topic, records[i - 1].partition)
                    == (&record.topic, record.partition);
            if template.stateful() && (same_partition || (joins && i > 0)) {
                job.carrying_state()
            } else {
                job
            }
        })
        .collect()
}

/// What a diff of a step with state or a table cannot show: what came before the sample.
fn caveat(
    new: &Job,
    old: Option<&Job>,
    table: &[Sampled],
    table_step: Option<&str>,
) -> Option<String> {
    if let Some(step) = table_step {
        return Some(format!(
            "its table `{step}` holds only the {} most recent rows sampled from it: a record whose row is older finds none in both versions",
            table.len()
        ));
    }
    (new.stateful() || old.is_some_and(Job::stateful)).then(|| {
        "from empty state: groups and windows start with the sample, per partition (a window that opened before it counts only what the sample holds); a record that made the step emit nothing counts as filtered out".to_owned()
    })
}

fn tally(ran: &[Ran]) -> Tally {
    let mut tally = Tally::default();
    for ran in ran {
        match ran {
            Ran::Answered(Ok(Actual::Outputs(outputs))) if outputs.is_empty() => {
                tally.filtered += 1;
            }
            Ran::Answered(Ok(Actual::Outputs(outputs))) => {
                tally.passed += 1;
                tally.outputs += outputs.len();
            }
            Ran::Answered(Ok(Actual::DeadLetter { kind, .. })) => {
                *tally.dead_lettered.entry(kind.clone()).or_default() += 1;
            }
            Ran::TimedOut => {
                *tally
                    .dead_lettered
                    .entry(plumber_processor::transform::TIMEOUT.to_owned())
                    .or_default() += 1;
            }
            Ran::Answered(Err(_)) | Ran::Died(_) | Ran::Unfinished(_) => tally.failed += 1,
        }
    }
    tally
}

fn compare(diff: &mut StepDiff, records: &[Sampled], old: &[Ran], new: &[Ran], masked: &[String]) {
    let mut old_fields = BTreeSet::new();
    let mut new_fields = BTreeSet::new();
    for ((record, old), new) in records.iter().zip(old).zip(new) {
        fields_of(old, &mut old_fields);
        fields_of(new, &mut new_fields);
        if same(old, new) {
            continue;
        }
        diff.changed += 1;
        if diff.examples.len() < EXAMPLES {
            let mask = Mask::of(&record.value, masked);
            diff.examples.push(Example {
                key: record
                    .key
                    .as_ref()
                    .filter(|_| !masked.iter().any(|m| m == "_key"))
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                input: crate::steptest::shown_lines(std::iter::once(mask.shown(&record.value)))
                    .concat(),
                old: lines(old, &mask),
                new: lines(new, &mask),
            });
        }
    }
    let kinds = |t: &Option<Tally>| -> BTreeSet<String> {
        t.iter()
            .flat_map(|t| t.dead_lettered.keys().cloned())
            .collect()
    };
    let (old_kinds, new_kinds) = (kinds(&diff.old), kinds(&diff.new));
    diff.new_dead_letter_kinds = new_kinds.difference(&old_kinds).cloned().collect();
    diff.fields_appeared = new_fields.difference(&old_fields).cloned().collect();
    diff.fields_vanished = old_fields.difference(&new_fields).cloned().collect();
}

/// Whether two versions did the same with a record: the same outputs (values and keys), or
/// a dead letter of the same kind.
fn same(old: &Ran, new: &Ran) -> bool {
    match (old, new) {
        (Ran::Answered(Ok(Actual::Outputs(a))), Ran::Answered(Ok(Actual::Outputs(b)))) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(a, b)| a.key == b.key && a.value == b.value)
        }
        (
            Ran::Answered(Ok(Actual::DeadLetter { kind: a, .. })),
            Ran::Answered(Ok(Actual::DeadLetter { kind: b, .. })),
        ) => a == b,
        (Ran::TimedOut, Ran::TimedOut) => true,
        _ => false,
    }
}

fn fields_of(ran: &Ran, fields: &mut BTreeSet<String>) {
    if let Ran::Answered(Ok(Actual::Outputs(outputs))) = ran {
        for output in outputs {
            if let Ok(serde_json::Value::Object(object)) = serde_json::from_slice(&output.value) {
                fields.extend(object.keys().cloned());
            }
        }
    }
}

fn lines(ran: &Ran, mask: &Mask<'_>) -> Vec<String> {
    match ran {
        Ran::Answered(Ok(Actual::Outputs(outputs))) if outputs.is_empty() => {
            vec!["(filtered out)".into()]
        }
        Ran::Answered(Ok(Actual::Outputs(outputs))) => {
            crate::steptest::shown_lines(outputs.iter().map(|o| mask.shown(&o.value)))
        }
        Ran::Answered(Ok(Actual::DeadLetter { kind, .. })) => {
            vec![format!("(dead-lettered: {kind})")]
        }
        Ran::TimedOut => vec!["(dead-lettered: timeout)".into()],
        Ran::Answered(Err(why)) | Ran::Died(why) | Ran::Unfinished(why) => {
            vec![format!("(not run: {why})")]
        }
    }
}

/// What a review hides of one sampled record: the masked fields by name, at any depth, and
/// in its outputs also the values those fields held (a step may copy a value to a field of
/// another name).
pub(crate) struct Mask<'m> {
    fields: &'m [String],
    /// The masked fields' values in the input: strings of 4 or more characters, and numbers.
    values: Vec<serde_json::Value>,
}

impl<'m> Mask<'m> {
    pub(crate) fn of(input: &[u8], fields: &'m [String]) -> Mask<'m> {
        let mut values = Vec::new();
        if !fields.is_empty()
            && let Ok(json) = serde_json::from_slice::<serde_json::Value>(input)
        {
            collect(&json, fields, false, &mut values);
        }
        Mask { fields, values }
    }

    /// A value as a review shows it: JSON with what is masked replaced by `"***"`. A value
    /// that is not JSON cannot be masked field by field: with masked fields, only its size is
    /// shown.
    pub(crate) fn shown(&self, value: &[u8]) -> String {
        match serde_json::from_slice::<serde_json::Value>(value) {
            Ok(mut json) => {
                self.hide(&mut json);
                json.to_string()
            }
            Err(_) if self.fields.is_empty() => String::from_utf8_lossy(value).into_owned(),
            Err(_) => format!(
                "(not JSON, {} bytes: not shown, fields are masked)",
                value.len()
            ),
        }
    }

    /// A text (a header's value) as a review shows it: `"***"` when it holds a masked value.
    pub(crate) fn shown_text(&self, text: &str) -> String {
        let mut value = serde_json::Value::String(text.to_owned());
        self.hide(&mut value);
        value.as_str().unwrap_or_default().to_owned()
    }

    /// Whether keys are masked (`_key` among the fields).
    pub(crate) fn hides_keys(&self) -> bool {
        self.fields.iter().any(|f| f == "_key")
    }

    fn hide(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        let hidden = match &*value {
            Value::String(text) => self.values.iter().any(|v| match v {
                Value::String(secret) => text.contains(secret.as_str()),
                _ => false,
            }),
            Value::Number(_) => self.values.contains(value),
            _ => false,
        };
        if hidden {
            *value = Value::String("***".into());
            return;
        }
        match value {
            Value::Object(object) => {
                for (key, value) in object.iter_mut() {
                    if self.fields.iter().any(|m| m == key) {
                        *value = Value::String("***".into());
                    } else {
                        self.hide(value);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.hide(v)),
            _ => {}
        }
    }
}

/// The values under masked fields of `json` (`inside`: `json` is under one).
fn collect(
    json: &serde_json::Value,
    fields: &[String],
    inside: bool,
    out: &mut Vec<serde_json::Value>,
) {
    use serde_json::Value;
    match json {
        Value::Object(object) => {
            for (key, value) in object {
                collect(
                    value,
                    fields,
                    inside || fields.iter().any(|m| m == key),
                    out,
                );
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect(v, fields, inside, out)),
        Value::String(text) if inside && text.chars().count() >= 4 => out.push(json.clone()),
        Value::Number(_) if inside => out.push(json.clone()),
        _ => {}
    }
}

/// The diffs as text, for `plumber plan`.
pub fn text(diffs: &[StepDiff]) -> String {
    let mut out = String::new();
    for diff in diffs {
        out.push_str(&format!(
            "\ndata diff of `{}` in `{}` ({}):\n",
            diff.step,
            diff.topology,
            diff.change_word()
        ));
        if let Some(note) = &diff.note {
            out.push_str(&format!("  {note}\n"));
            continue;
        }
        out.push_str(&format!(
            "  {} records sampled from {}\n",
            diff.sampled,
            diff.topics
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        if let Some(caveat) = &diff.caveat {
            out.push_str(&format!("  ({caveat})\n"));
        }
        if let Some(old) = &diff.old {
            out.push_str(&format!("  old: {}\n", old.summary()));
        }
        if let Some(new) = &diff.new {
            out.push_str(&format!("  new: {}\n", new.summary()));
        }
        if diff.old.is_some() {
            out.push_str(&format!(
                "  records whose output changed: {}\n",
                diff.changed
            ));
        }
        if !diff.new_dead_letter_kinds.is_empty() {
            out.push_str(&format!(
                "  new dead-letter kinds: {}\n",
                diff.new_dead_letter_kinds.join(", ")
            ));
        }
        if !diff.fields_appeared.is_empty() {
            out.push_str(&format!(
                "  fields appeared: {}\n",
                diff.fields_appeared.join(", ")
            ));
        }
        if !diff.fields_vanished.is_empty() {
            out.push_str(&format!(
                "  fields vanished: {}\n",
                diff.fields_vanished.join(", ")
            ));
        }
        for example in &diff.examples {
            let key = example
                .key
                .as_ref()
                .map_or(String::new(), |k| format!(" (key {k:?})"));
            out.push_str(&format!("  e.g.{key}: {}\n", example.input));
            out.push_str(&format!("    old: {}\n", example.old.join(" | ")));
            out.push_str(&format!("    new: {}\n", example.new.join(" | ")));
        }
    }
    out
}

/// The diffs as a section of a review's markdown: the text in a code block.
pub fn markdown(diffs: &[StepDiff]) -> String {
    if diffs.is_empty() {
        return String::new();
    }
    // Records are the topic's, not the author's: no fence in them closes this one.
    let body = text(diffs).replace("```", "`\u{200b}``");
    format!("\n### Data diff\n\n```\n{}```\n", body.trim_start())
}

impl StepDiff {
    fn change_word(&self) -> &'static str {
        match self.change {
            Change::Added => "added",
            _ => "replaced",
        }
    }
}

impl Tally {
    /// `40 passed, 10 filtered out, 2 dead-lettered (invalid-json 2)`.
    pub fn summary(&self) -> String {
        let dead: usize = self.dead_lettered.values().sum();
        let mut text = format!(
            "{} passed ({} outputs), {} filtered out, {dead} dead-lettered",
            self.passed, self.outputs, self.filtered
        );
        if dead > 0 {
            let kinds: Vec<String> = self
                .dead_lettered
                .iter()
                .map(|(kind, n)| format!("{kind} {n}"))
                .collect();
            text.push_str(&format!(" ({})", kinds.join(", ")));
        }
        if self.failed > 0 {
            text.push_str(&format!(", {} not run", self.failed));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Kafka client whose every read takes the whole time it is given, and counts.
    #[derive(Default)]
    struct Slow {
        reads: std::sync::atomic::AtomicUsize,
    }

    impl Admin for Slow {
        fn create_topic(
            &self,
            _: &str,
            _: u32,
            _: Option<u32>,
            _: &BTreeMap<String, String>,
        ) -> crate::kafka::Result<()> {
            unreachable!("a data diff creates nothing")
        }
        fn delete_topic(&self, _: &str) -> crate::kafka::Result<()> {
            unreachable!("a data diff deletes nothing")
        }
        fn partitions(&self, _: &str) -> crate::kafka::Result<i32> {
            unreachable!()
        }
        fn watermarks(&self, _: &str) -> crate::kafka::Result<Vec<(i64, i64)>> {
            unreachable!()
        }
        fn committed(
            &self,
            _: &str,
            _: &[String],
        ) -> crate::kafka::Result<Vec<crate::plan::PartitionOffset>> {
            unreachable!()
        }
        fn commit(&self, _: &str, _: &[crate::plan::PartitionOffset]) -> crate::kafka::Result<()> {
            unreachable!("a data diff commits nothing")
        }
        fn delete_group(&self, _: &str) -> crate::kafka::Result<()> {
            unreachable!()
        }
        fn supports_transactions(&self) -> crate::kafka::Result<bool> {
            unreachable!()
        }
        fn recent_records(
            &self,
            _: &[(String, String)],
            limits: &SampleLimits,
        ) -> crate::kafka::Result<Vec<Sampled>> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(limits.time);
            Ok(Vec::new())
        }
    }

    /// A plan adding many steps gets one step's time for its whole data diff: the steps past
    /// it are not sampled, and say why.
    #[test]
    fn a_plan_of_many_steps_gets_one_step_s_time_for_its_whole_diff() {
        let mut files = vec![crate::spec::SourceFile {
            path: "topologies/t/sources/in.yaml".into(),
            content: crate::spec::FileContent::Bytes(b"kind: source\ntopic: in\n".to_vec()),
        }];
        for i in 0..20 {
            files.push(crate::spec::SourceFile {
                path: format!("topologies/t/steps/s{i:02}.yaml"),
                content: crate::spec::FileContent::Bytes(
                    b"kind: processor\ninput: in\njq: '.'\n".to_vec(),
                ),
            });
        }
        let graphs = crate::validate(&files).topologies.unwrap();
        let plan = crate::plan::plan(None, ("c", &graphs));
        let slow = std::sync::Arc::new(Slow::default());
        let sample = SampleLimits {
            records: 10,
            bytes: 1 << 20,
            time: std::time::Duration::from_millis(100),
        };
        let limits = Limits {
            time: std::time::Duration::from_millis(100),
            ..Limits::default()
        };
        let kafka = {
            let slow = slow.clone();
            move |_: &Topology| Ok(slow.clone() as std::sync::Arc<dyn Admin>)
        };
        let side = |graphs| Side {
            graphs,
            commands: Commands::Refused("not in this test"),
        };
        let diffs = diff(
            &plan,
            side(&[]),
            side(&graphs),
            &kafka,
            &sample,
            &limits,
            &[],
        );
        assert_eq!(diffs.len(), 20);
        let reads = slow.reads.load(std::sync::atomic::Ordering::SeqCst);
        assert!(reads <= 3, "{reads} reads of 100 ms within 200 ms");
        let cut: Vec<&StepDiff> = diffs
            .iter()
            .filter(|d| {
                d.note
                    .as_deref()
                    .is_some_and(|n| n.contains("the plan's data diff took all its time"))
            })
            .collect();
        assert_eq!(cut.len(), 20 - reads, "{diffs:#?}");
    }

    #[test]
    fn masked_fields_are_hidden_by_name_and_their_values_wherever_a_step_copies_them() {
        let fields = vec!["card".to_owned(), "pin".to_owned()];
        let input = br#"{"v":1,"card":"4111-0000","pin":1234,"nested":{"card":"5500-1111"}}"#;
        let mask = Mask::of(input, &fields);
        assert_eq!(
            mask.shown(input),
            r#"{"card":"***","nested":{"card":"***"},"pin":"***","v":1}"#
        );
        // A step that moves the values under other names, or into a longer text.
        let output = br#"{"leak":"4111-0000","note":"card 5500-1111 seen","code":1234,"v":1}"#;
        assert_eq!(
            mask.shown(output),
            r#"{"code":"***","leak":"***","note":"***","v":1}"#
        );
        // Without masked fields a value is shown as it is; with them, a value that is not
        // JSON only by its size.
        assert_eq!(Mask::of(b"plain", &[]).shown(b"plain"), "plain");
        assert_eq!(
            mask.shown(b"4111-0000 as text"),
            "(not JSON, 17 bytes: not shown, fields are masked)"
        );
    }
}
