//! Where processors run. The cutover engine only asks a [`Runtime`] to start, stop and scale
//! processor identities; [`local`] runs them as local processes (`plumber up`).
//!
//! A runtime keeps its own durable record of what should run (the local runtime in the state
//! directory, Kubernetes in its StatefulSets), so a restarted daemon finds running processors
//! as they were and never starts a second copy of one.

pub mod args;
pub mod kube;
pub mod local;
pub mod metrics;
mod start;

pub use start::Target;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::graph::Identity;
use crate::spec::{ClusterSpec, EnvValue, Resources, Scale, Transform};

/// Why a runtime could not do what the engine asked. Every error names the group; whether
/// trying again can help is part of it ([`Error::is_retryable`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The processor cannot be started as specified (a missing secret, an image the runtime
    /// refuses, …).
    #[error("cannot start {group}: {message}")]
    Start {
        group: String,
        message: String,
        retryable: bool,
    },
    /// Its instances did not exit in time, or the runtime could not tell.
    #[error("cannot stop {group}: {message}")]
    Stop { group: String, message: String },
    /// Where the runtime keeps what should run (the state directory, the Kubernetes API)
    /// refused or could not be reached.
    #[error("cannot {operation} {group}: {message}")]
    Backend {
        operation: &'static str,
        group: String,
        message: String,
        retryable: bool,
    },
}

impl Error {
    /// Whether the same call can succeed later without a change to the repository.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Start { retryable, .. } | Error::Backend { retryable, .. } => *retryable,
            Error::Stop { .. } => true,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether this daemon replica may still write (it holds the lease): asked immediately before
/// each write, so a replica deposed in the middle of an action writes nothing more.
pub type Guard = dyn Fn() -> bool + Send + Sync;

/// Which term of the lease this replica holds now (`None`: it does not): a new number each
/// time it takes the lease. Nobody else writes Plumber's state during one term, so what this
/// replica read or wrote in it is still current.
pub type Term = dyn Fn() -> Option<u64> + Send + Sync;

/// How processors run, decided by the daemon for every step alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// Decided once per cluster (`--delivery`); `None` leaves it to the processor (`auto`).
    pub delivery: Option<Delivery>,
    /// Seconds one record may take, every attempt included (`--record-timeout`).
    pub record_timeout: Option<u64>,
    /// The rebalance protocol of the group (`--assignor`). Recorded with each life, so
    /// every instance of a group runs the same one: brokers refuse a member that offers
    /// another protocol than the group's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignor: Option<Assignor>,
}

/// A consumer group's rebalance protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assignor {
    /// Incremental (KIP-429, cooperative-sticky): a replica coming or going moves only the
    /// partitions it takes or gives.
    #[default]
    Cooperative,
    /// Every member gives up every partition at each rebalance (range, roundrobin).
    Eager,
}

impl Assignor {
    /// As `plumber-processor --assignor` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Assignor::Cooperative => "cooperative",
            Assignor::Eager => "eager",
        }
    }
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

/// The Kafka cluster a processor runs on, as every runtime hands it to the processor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    pub bootstrap: String,
    /// librdkafka settings from `plumber.yaml` (never secrets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// The Secret (locally: the directory) the cluster's credentials come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

impl Cluster {
    pub fn of(spec: &ClusterSpec) -> Cluster {
        Cluster {
            bootstrap: spec.bootstrap.clone(),
            properties: spec.properties.clone(),
            credentials: spec.credentials.clone(),
        }
    }

    /// A cluster reached at `bootstrap` with no other settings.
    pub fn at(bootstrap: impl Into<String>) -> Cluster {
        Cluster::of(&ClusterSpec::at(bootstrap))
    }
}

/// One processor identity to run, with everything needed to run it, on any runtime. How
/// many instances run within `scale`, and where a step's files come from, is each runtime's
/// business (the local one runs `scale.min` instances in a checkout of `commit`; Kubernetes
/// leaves the count to KEDA and runs images).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorSpec {
    pub topology: String,
    pub step: String,
    pub identity: Identity,
    /// Consumer group, also the processor's name in the runtime.
    pub group: String,
    pub cluster: Cluster,
    pub inputs: Vec<String>,
    /// The topic of each input step, by step name: a `sql` step's query of several SELECTs
    /// runs each on the records of the input its FROM names. Empty for other transforms.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub input_steps: BTreeMap<String, String>,
    pub outputs: Vec<String>,
    pub dlq: String,
    pub transform: Transform,
    pub env: BTreeMap<String, EnvValue>,
    pub scale: Scale,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// The commit it was started from.
    pub commit: String,
    /// The directory of the step's file, relative to the repository's root: `exec` and
    /// `http` commands run there.
    pub dir: String,
    #[serde(default)]
    pub settings: Settings,
    /// A stateful step's changelog and what its state starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<crate::plan::StateRun>,
    /// A join's table topic, read whole by each instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Started warm: where its partitions start comes through this group (`hand-off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_group: Option<String>,
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

/// Where one running instance of a processor serves its Prometheus `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsEndpoint {
    /// Names this run of the instance (a local process's pid, a Pod's uid): under a new name
    /// its counters start again, and the first reading gives no rate yet.
    pub instance: String,
    pub addr: SocketAddr,
}

/// Calls block until done (the engine runs one action at a time on its own thread); a
/// runtime built on an async client runs it on its own executor, as `kafka::KafkaAdmin`
/// does.
pub trait Runtime: Send + Sync {
    /// Runs the processor; does nothing if it already runs. Returns once it is started, not
    /// once it consumes.
    fn start(&self, spec: &ProcessorSpec) -> Result<()>;
    /// Stops every instance gracefully (SIGTERM: finish, flush, commit) and returns once all
    /// have exited or, where the runtime can tell (the processor's `/metrics` gauge
    /// `plumber_processor_final_commit_made`), made their final commit with nothing in
    /// flight: their group's offsets do not move again, and the runtime finishes the rest of
    /// their stop (leaving the group, closing) on its own. Stopping a processor that does
    /// not run is not an error.
    fn stop(&self, group: &str) -> Result<()>;
    /// Stops every instance gracefully and starts them again with the same spec.
    fn restart(&self, group: &str) -> Result<()>;
    /// Changes the scale bounds and resources of a running processor in place.
    fn update(&self, group: &str, scale: &Scale, resources: Option<&Resources>) -> Result<()>;
    /// Every processor the runtime runs, by group.
    fn processors(&self) -> Result<Vec<ProcessorStatus>>;
    /// Whether the runtime runs the processor of `group` (or keeps trying to).
    fn runs(&self, group: &str) -> Result<bool> {
        Ok(self.processors()?.iter().any(|p| p.group == group))
    }
    /// Puts back what was changed outside the runtime and removes what it does not run
    /// (the observer calls it at every look). The local runtime's supervisor does this on
    /// its own.
    fn repair(&self) -> Result<()> {
        Ok(())
    }
    /// What the runtime has not read yet of where processors run (a watch not listed yet),
    /// `None` once it has: the daemon is not ready (`/readyz`) before.
    fn unsynced(&self) -> Option<String> {
        None
    }
    /// How many input partitions the running instances of `group`, started warm, hold for
    /// their hand-off (summed over instances: 0 when none runs); `None` when the runtime
    /// cannot tell (it knows no `/metrics` of any processor), and the engine then stops the
    /// predecessor without waiting for it. Read from each instance's page.
    fn held(&self, group: &str) -> Result<Option<u64>> {
        let endpoints = self.metrics_endpoints()?;
        if endpoints.is_empty() {
            return Ok(None);
        }
        Ok(Some(endpoints.get(group).map_or(0, |e| metrics::held(e))))
    }
    /// Where the running instances of each processor serve `/metrics`, by group; cheap (the
    /// observer asks at every look). An instance that serves none, or that the runtime cannot
    /// place, is left out, and so is a runtime that cannot tell: their rates are unknown.
    fn metrics_endpoints(&self) -> Result<BTreeMap<String, Vec<MetricsEndpoint>>> {
        Ok(BTreeMap::new())
    }
}
