//! `GET /api/records/{topology}/{step}`: the last records a step wrote and its dead letters
//! with their reasons, read on demand where the topology runs (Lenses' data view, Redpanda
//! Console's topic browser). Nothing is read until someone asks; a read is bounded in
//! records, bytes and time, joins no group and commits nothing; the fields `plumber.yaml`
//! masks are hidden as in a plan's data diff.

use std::time::Duration;

use serde::Serialize;

use super::{AdminUse, Context};
use crate::datadiff::Mask;
use crate::graph::StepKind;
use crate::kafka::{SampleLimits, Sampled};

/// The most records one request may ask for, of what a step wrote and of its dead letters.
pub const MAX_RECORDS: usize = 100;
/// Bytes of keys and values one read takes at most.
const MAX_BYTES: u64 = 1 << 20;
/// How long one read may take.
const READ_TIME: Duration = Duration::from_secs(5);

/// What `GET /api/records/{topology}/{step}` answers.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecords {
    pub topology: String,
    pub step: String,
    /// The commit whose step this is (what runs).
    pub commit: String,
    /// The topics it writes (a source or sink: its own).
    pub topics: Vec<String>,
    pub records: Vec<ShownRecord>,
    /// Its dead-letter topic, for a processor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    pub dead_letters: Vec<ShownRecord>,
    /// Why a part could not be read (its topic missing, the broker not answering).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A record as the API shows it: masked fields hidden.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShownRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    pub key: Option<String>,
    pub value: String,
    /// Its headers: a dead letter's say why it is one.
    pub headers: Vec<(String, String)>,
}

/// Why the records cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    /// No such topology or step where the daemon runs things (404).
    #[error("{0}")]
    NotFound(String),
    /// The record or the commit could not be read (503: asking again may help).
    #[error("{0}")]
    Unavailable(String),
}

impl Context {
    /// The last `limit` records `step` of `topology` wrote, and its last `limit` dead letters.
    pub fn step_records(
        &self,
        topology: &str,
        step: &str,
        limit: usize,
    ) -> Result<StepRecords, TailError> {
        let unavailable = |e: &dyn std::fmt::Display| TailError::Unavailable(e.to_string());
        let record = self.records.load(topology).map_err(|e| unavailable(&e))?;
        let (Some(commit), Some(bootstrap)) = (record.commit.clone(), record.bootstrap.clone())
        else {
            return Err(TailError::NotFound(format!(
                "topology `{topology}` runs nowhere"
            )));
        };
        let revision = self.revisions.load(&commit).map_err(|e| unavailable(&e))?;
        let graph = revision.topology(topology).ok_or_else(|| {
            TailError::NotFound(format!("topology `{topology}` is not in {commit}"))
        })?;
        let id = graph.find(step).ok_or_else(|| {
            let steps: Vec<&str> = graph.steps().map(|(_, s)| s.name.as_str()).collect();
            TailError::NotFound(format!(
                "topology `{topology}` has no step `{step}`; its steps: {}",
                steps.join(", ")
            ))
        })?;
        let (topics, dead_letter_topic) = match &graph.step(id).kind {
            StepKind::Source { topic } | StepKind::Sink { topic } => (vec![topic.clone()], None),
            StepKind::Processor { .. } => (graph.output_topics(id), Some(graph.dlq_topic(id))),
        };
        let admin = self
            .admin(AdminUse::Observe, &bootstrap)
            .map_err(|e| unavailable(&e))?;
        let limits = SampleLimits {
            records: limit,
            bytes: MAX_BYTES,
            time: READ_TIME,
        };
        let masked = &revision.masked_fields;
        let mut notes = Vec::new();
        let mut read = |topics: &[String]| -> Vec<ShownRecord> {
            let inputs: Vec<(String, String)> = topics
                .iter()
                .map(|t| (step.to_owned(), t.clone()))
                .collect();
            match admin.recent_records(&inputs, &limits) {
                Ok(records) => records.iter().map(|r| shown(r, masked)).collect(),
                Err(error) => {
                    notes.push(format!("{}: {error}", topics.join(", ")));
                    Vec::new()
                }
            }
        };
        let records = read(&topics);
        let dead_letters = dead_letter_topic
            .as_ref()
            .map(|t| read(std::slice::from_ref(t)))
            .unwrap_or_default();
        Ok(StepRecords {
            topology: topology.to_owned(),
            step: step.to_owned(),
            commit,
            topics,
            records,
            dead_letter_topic,
            dead_letters,
            notes,
        })
    }
}

fn shown(record: &Sampled, masked: &[String]) -> ShownRecord {
    let mask = Mask::of(&record.value, masked);
    ShownRecord {
        topic: record.topic.clone(),
        partition: record.partition,
        offset: record.offset,
        timestamp: record.timestamp,
        key: record
            .key
            .as_ref()
            .filter(|_| !mask.hides_keys())
            .map(|k| String::from_utf8_lossy(k).into_owned()),
        value: mask.shown(&record.value),
        headers: record
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), mask.shown_text(value)))
            .collect(),
    }
}
