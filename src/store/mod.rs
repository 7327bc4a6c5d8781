//! Durable cutover state: per topology what runs ([`Deployment`]), the commit it last fully
//! matched and the move in progress; and the history of moves. The cutover engine is its only
//! writer; everything else reads it.
//!
//! [`CutoverStore`] is what the engine needs; [`dir::StateDir`] keeps it in the state
//! directory of `plumber up`, [`topology::TopologyStore`] in the status of each `Topology`
//! resource for `plumber daemon`.

pub mod dir;
pub mod topology;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::plan::{Deployment, PartitionOffset};
pub use dir::{StateDir, StateLock, checkouts_dir};

/// The version of [`TopologyRecord`]'s format; a record of another version is refused.
pub const FORMAT: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another `plumber up` (pid {pid}) is using the state directory {path}; stop it, or give this one its own --state-dir"
    )]
    Locked { path: PathBuf, pid: String },
    #[error("{path} is damaged ({source}); move it away to start that topology from scratch")]
    Damaged {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path} was written by another version of plumber (state format {found}, this one reads {FORMAT}); stop its processors and move the state directory away, or run the plumber that wrote it"
    )]
    Format { path: PathBuf, found: u32 },
    #[error(
        "the state directory {path} belongs to another repository (its branch starts at commit {recorded}, this one at {found}); give this repository its own --state-dir"
    )]
    OtherRepository {
        path: PathBuf,
        recorded: String,
        found: String,
    },
    #[error(
        "the record of {topology} was written by another daemon replica since this one read it; reading it again"
    )]
    Conflict { topology: String },
    #[error("not writing the record of {topology}: this daemon replica does not hold the lease")]
    NotLeader { topology: String },
    #[error(
        "not forgetting the record of {topology}: only a preview environment's record (a name with a dot) is forgotten; a topology's keeps the lives that name its next ones"
    )]
    NotAPreview { topology: String },
    #[error("cannot {operation} Topology {topology}: {message}")]
    Api {
        operation: &'static str,
        topology: String,
        message: String,
        retryable: bool,
    },
}

impl Error {
    /// Whether trying again can help (an I/O error may pass; a damaged or foreign file not).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Write { .. } | Error::Read { .. } | Error::Conflict { .. } => true,
            Error::NotLeader { .. } => true,
            Error::Api { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Refuses to forget the record of a name that is no preview's (it holds no dot).
fn only_previews(topology: &str) -> Result<()> {
    if topology.contains('.') {
        Ok(())
    } else {
        Err(Error::NotAPreview {
            topology: topology.to_owned(),
        })
    }
}

/// Everything durable about one topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyRecord {
    /// [`FORMAT`].
    pub format: u32,
    /// The commit the deployment last moved to: the graph that runs is that commit's.
    /// `None` before the first. A later commit that leaves the topology as it is moves
    /// nothing and leaves this as it is.
    pub commit: Option<String>,
    /// The bootstrap servers of the cluster its lives and topics are on.
    pub bootstrap: Option<String>,
    /// What runs.
    pub deployment: Deployment,
    /// The move in progress, if any.
    pub moving: Option<Move>,
    /// A finished move whose history line may not be written yet (written first thing on the
    /// next start, so a crash can neither lose nor repeat it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unrecorded: Option<HistoryEntry>,
}

impl TopologyRecord {
    /// Nothing of the topology runs or exists any more, and nothing moves: what is left is
    /// only the memory of the lives it ran.
    pub fn is_retired(&self) -> bool {
        self.deployment.is_empty() && self.moving.is_none()
    }
}

impl Default for TopologyRecord {
    fn default() -> Self {
        TopologyRecord {
            format: FORMAT,
            commit: None,
            bootstrap: None,
            deployment: Deployment::default(),
            moving: None,
            unrecorded: None,
        }
    }
}

/// A move towards a commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    pub from: Option<String>,
    pub to: String,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    /// Actions that took effect.
    pub done: usize,
    /// Cutover offsets handed to starting lives so far.
    pub handovers: Vec<Handover>,
}

/// The offsets at which one life handed an input over to its successor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    pub step: String,
    pub from_group: String,
    pub to_group: String,
    pub offsets: Vec<PartitionOffset>,
}

/// How a move ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The deployment matches the commit.
    #[default]
    Applied,
    /// A newer commit took over before it finished; the next entry continues from here.
    Superseded,
}

/// One move, for `plumber history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub topology: String,
    pub from: Option<String>,
    pub to: String,
    #[serde(default)]
    pub outcome: Outcome,
    pub started_at: u64,
    pub finished_at: u64,
    pub actions: usize,
    pub handovers: Vec<Handover>,
}

impl HistoryEntry {
    /// Whether two entries describe the same move (a history line written twice is one).
    pub fn same_move(&self, other: &HistoryEntry) -> bool {
        self.topology == other.topology
            && self.to == other.to
            && self.started_at == other.started_at
            && self.outcome == other.outcome
    }
}

/// Where the cutover engine keeps its state.
pub trait CutoverStore: Send + Sync {
    /// The record of one topology; the default (nothing deployed) when it has none.
    fn load(&self, topology: &str) -> Result<TopologyRecord>;
    /// Replaces the record as a whole, atomically.
    fn save(&self, topology: &str, record: &TopologyRecord) -> Result<()>;
    /// Every topology with a record; one that cannot be read is an error of its own.
    fn topologies(&self) -> Result<BTreeMap<String, Result<TopologyRecord>>>;
    /// Appends a history entry, unless the newest entries already hold the same move.
    fn append_history(&self, entry: &HistoryEntry) -> Result<()>;
    /// Moves, oldest first.
    fn history(&self) -> Result<Vec<HistoryEntry>>;
    /// Forgets a torn-down preview environment's record (`<topology>.<slug>`): afterwards it
    /// has none, and one started again names its lives from the first. Refused
    /// ([`Error::NotAPreview`]) for a topology's record, whose lives name its next ones;
    /// nothing to forget is no error.
    fn forget(&self, preview: &str) -> Result<()>;
    /// Whether this daemon may act on what the store holds now (it holds the lease where
    /// several replicas share one store). The engine asks before every action.
    fn may_act(&self) -> bool {
        true
    }
}
