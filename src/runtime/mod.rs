//! Where processors run. The cutover engine only asks a [`Runtime`] to start, stop and scale
//! processor identities; [`local`] runs them as local processes (`plumber up`).
//!
//! A runtime keeps its own durable record of what should run (the local runtime in the state
//! directory, Kubernetes in its Deployments), so a restarted daemon finds running processors
//! as they were and never starts a second copy of one.

pub mod kube;
pub mod local;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::graph::Identity;
use crate::spec::Transform;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start {group}: {message}")]
    Start { group: String, message: String },
    #[error("{group} did not stop within {seconds} s")]
    StopTimeout { group: String, seconds: u64 },
    #[error("cannot record {group} in {path}: {source}")]
    Record {
        group: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How processors run, decided by the daemon for every step alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// Decided once per cluster (`--delivery`); `None` leaves it to the processor (`auto`).
    pub delivery: Option<Delivery>,
    /// Seconds one record may take, every attempt included (`--record-timeout`).
    pub record_timeout: Option<u64>,
}

/// A processor's delivery guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// Outputs and offsets in one transaction: a crash duplicates nothing.
    ExactlyOnce,
    /// Offsets after outputs: a crash may duplicate, never lose.
    AtLeastOnce,
}

impl Delivery {
    /// As `plumber-processor --delivery` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::ExactlyOnce => "exactly-once",
            Delivery::AtLeastOnce => "at-least-once",
        }
    }
}

/// How much longer than its record timeout one record can hold a processor: the retry in
/// hand, dead-lettering it, the commit and a self-restart (plumber-processor logs the sum as
/// `max_record_seconds` when it starts).
pub const RECORD_OVERHEAD: std::time::Duration = std::time::Duration::from_secs(22);

/// One processor identity to run, with everything needed to run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorSpec {
    pub topology: String,
    pub step: String,
    pub identity: Identity,
    /// Consumer group, also the processor's name in the runtime.
    pub group: String,
    pub bootstrap: String,
    pub inputs: Vec<String>,
    /// The topic of each input step, by step name: a `sql` step's query of several SELECTs
    /// runs each on the records of the input its FROM names. Empty for other transforms.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub input_steps: BTreeMap<String, String>,
    pub outputs: Vec<String>,
    pub dlq: String,
    pub transform: Transform,
    pub env: BTreeMap<String, String>,
    pub replicas: u32,
    /// The commit it was started from (its checkout must stay while it runs).
    #[serde(default)]
    pub commit: Option<String>,
    #[serde(default)]
    pub settings: Settings,
    /// The directory of the step's file in a checkout of its commit: `exec` and `http`
    /// commands run there.
    pub workdir: PathBuf,
}

/// What a runtime observes about one processor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorStatus {
    pub topology: String,
    pub step: String,
    pub identity: String,
    pub group: String,
    pub replicas: u32,
    pub running: u32,
    pub restarts: u32,
    /// The commit it was started from.
    pub commit: Option<String>,
}

pub trait Runtime: Send + Sync {
    /// Runs `spec.replicas` instances of the processor (at least one); does nothing for those
    /// already running. Returns once the instances are started, not once they consume.
    fn start(&self, spec: &ProcessorSpec) -> Result<()>;
    /// Stops every instance gracefully (SIGTERM: finish, flush, commit) and returns once all
    /// have exited. Stopping a processor that does not run is not an error.
    fn stop(&self, group: &str) -> Result<()>;
    /// Stops every instance gracefully and starts them again with the same spec.
    fn restart(&self, group: &str) -> Result<()>;
    /// Changes the number of instances of a running processor.
    fn scale(&self, group: &str, replicas: u32) -> Result<()>;
    /// Every processor the runtime runs, by group.
    fn processors(&self) -> Result<Vec<ProcessorStatus>>;
}
