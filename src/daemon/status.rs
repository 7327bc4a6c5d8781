//! What the daemon shows: the status document of `GET /api/status` (SPEC §6) and the
//! Prometheus metrics. The document has one writer, [`super::facts::reduce`], which applies
//! the facts the daemon's parts send ([`super::facts::Store::apply`]); HTTP handlers only
//! read snapshots.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Serialize;

pub use crate::graph::Kind;
pub use crate::runtime::Delivery;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    #[default]
    Idle,
    Cutover,
    Error,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub branch: String,
    /// The newest valid commit of the branch (what the topologies move to).
    pub commit: Option<String>,
    pub phase: Phase,
    pub topologies: Vec<TopologyStatus>,
    pub last_error: Option<LastError>,
    /// With `--trusted-keys`: the verdict on the branch's head (absent without).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<SignatureStatus>,
    /// What was published on the forge (absent without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forge: Option<ForgeStatus>,
}

/// The verdict of the trusted keys on the branch's head. It is also what a forge's commit
/// status on that head reports ([`SignatureStatus::commit_status`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SignatureStatus {
    pub commit: String,
    pub trusted: bool,
    /// `verdict` (`trusted`, `unsigned`, `unknown-key`, `bad-signature`) and its fields.
    #[serde(flatten)]
    pub verdict: crate::trust::Verdict,
    /// Why, and for a refused head what to do.
    pub message: String,
}

impl SignatureStatus {
    pub fn new(commit: &str, verdict: crate::trust::Verdict, keys_dir: &std::path::Path) -> Self {
        SignatureStatus {
            commit: commit.to_owned(),
            trusted: verdict.is_trusted(),
            message: verdict.describe(commit, keys_dir),
            verdict,
        }
    }

    /// The forge commit status of the head: failure for a refused head (its message says
    /// why and what to do); `None` for a trusted one, whose status is the plan's.
    pub fn commit_status(&self) -> Option<crate::forge::CommitStatus> {
        (!self.trusted)
            .then(|| crate::forge::CommitStatus::new(crate::forge::State::Failure, &self.message))
    }
}

/// What the API shows of the forge (`forge` in `GET /api/status`).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForgeStatus {
    /// `github` or `gitlab`.
    pub kind: String,
    pub repo: String,
    /// Statuses and comments sent (an unchanged comment counts: the forge was asked).
    pub published: u64,
    /// Publications that failed after the client's retries.
    pub failures: u64,
    pub last_published: Option<Published>,
    pub last_error: Option<Failed>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Published {
    #[serde(rename = "ref")]
    pub name: String,
    pub head: String,
    pub pull_request: Option<u64>,
    /// `status`, or the comment's fate: `created`, `updated`, `unchanged`.
    pub what: String,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failed {
    #[serde(rename = "ref")]
    pub name: String,
    pub pull_request: Option<u64>,
    pub message: String,
    /// Whether it is tried again later (else: when the plan changes).
    pub retrying: bool,
    pub at: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyStatus {
    pub name: String,
    /// The commit whose graph runs: the one the topology last moved to. Commits that leave
    /// the topology as it is do not change it (the daemon's `commit` is the branch's).
    pub commit: Option<String>,
    pub phase: Phase,
    /// During a cutover: the commit it moves to and how far it is.
    pub cutover: Option<CutoverStatus>,
    pub steps: Vec<StepStatus>,
    pub last_error: Option<String>,
    /// How its processors deliver: `exactly-once` or `at-least-once` (decided per cluster).
    pub delivery: Option<Delivery>,
    /// Set on a pull request's preview environment: what it previews.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview_of: Option<PreviewOf>,
}

/// What a preview topology previews.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviewOf {
    /// The pull request's ref (`refs/pull/N/head`).
    #[serde(rename = "ref")]
    pub name: String,
    pub pull_request: u64,
    /// The topology whose changed steps it runs.
    pub topology: String,
    /// Shadow topic → the sink topic it stands in for.
    pub shadow_topics: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CutoverStatus {
    /// The commit it moves from (`null`: a first deployment).
    pub from: Option<String>,
    pub to: String,
    /// When the move began, in seconds since the Unix epoch.
    pub started_at: Option<u64>,
    /// Actions that took effect in this move.
    pub done: usize,
    /// Actions left, the current one included.
    pub remaining: usize,
    /// The action running or last tried.
    pub current: Option<String>,
    /// What the move waits for: actions that cannot run yet, and why.
    pub waiting: Vec<WaitStatus>,
    /// Action by action: those done while this daemon watched, then what remains in the
    /// engine's order.
    pub actions: Vec<ActionStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionStatus {
    pub action: String,
    pub state: ActionState,
    /// What a waiting (or blocked pending) action waits for.
    pub reason: Option<String>,
    pub failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionState {
    Done,
    /// Tried at the last step and not waiting.
    Running,
    /// Tried, and waits (a drain, a missing topic) or failed and is retried.
    Waiting,
    /// Not tried yet (blocked by another action when `reason` says so).
    Pending,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitStatus {
    pub action: String,
    pub reason: String,
    /// Failed attempts so far (0: it waits for something else to happen first).
    pub failures: u32,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepStatus {
    pub name: String,
    pub kind: Kind,
    pub identity: Option<String>,
    /// The consumer group (and internal topic) of the processor's life that runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub state: StepState,
    /// Records the processor's group has not consumed yet; `null` when unknown.
    pub lag: Option<i64>,
    /// The steps it reads: the graph's edges.
    pub inputs: Vec<String>,
    /// The step file (`null` when the commit cannot be read).
    pub file: Option<String>,
    /// A source's or sink's Kafka topic.
    pub topic: Option<String>,
    /// A processor's transform: `jq`, `sql`, `exec` or `http`.
    pub transform: Option<String>,
    /// The topic a processor writes for the processors it feeds (its group's name).
    pub internal_topic: Option<String>,
    /// Where a processor's records that cannot be handled go.
    pub dead_letter_topic: Option<String>,
    /// A processor's instances running now.
    pub replicas: Option<u32>,
    /// A processor's scale bounds.
    pub scale: Option<ScaleStatus>,
    /// Input records/s, from the processor's own `/metrics`; `null` while unknown.
    pub records_per_second: Option<f64>,
    /// A stateful step's state (`docs/stateful-sql.md`); absent for the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keeps_state: Option<StateStatus>,
    /// A join's table, from its processors' `/metrics`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keeps_table: Option<TableStatus>,
    /// During a move, another life of the processor that is still deployed: the one the
    /// move replaces, running until it has drained and is stopped. Absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retiring: Option<LifeStatus>,
}

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepState {
    /// A source or a sink: a topic Plumber does not run.
    External,
    /// Every instance asked for is up.
    Running,
    /// Fewer instances up than asked.
    Starting,
    Stopped,
    /// During a move: a processor whose new life has yet to start.
    Pending,
}

/// One life of a processor: its group, and where it stands (as [`StepStatus`] says them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LifeStatus {
    pub group: String,
    pub identity: String,
    /// `running`, `starting` or `stopped`.
    pub state: StepState,
    pub replicas: u32,
    pub lag: Option<i64>,
}

/// A stateful step's state, from its processors' `/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StateStatus {
    /// Its changelog topic.
    pub changelog: String,
    /// What the running life's state started from: `restore`, `rebuild`, `earliest`,
    /// `empty`; `cannot` while the move waits for the step file's `stateStart`.
    pub started_from: String,
    /// Open groups (a key's window, or its running aggregate); `null` while unknown.
    pub groups: Option<u64>,
    /// The window watermark: the least stream time of its partitions, ms since the epoch.
    pub watermark_ms: Option<i64>,
    /// Changelog entries read by restores under way; 0 when none is.
    pub restoring_entries: Option<u64>,
}

/// A join's table, from its processors' `/metrics`: each instance holds all of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TableStatus {
    /// The table's topic.
    pub topic: String,
    /// Its rows; `null` while unknown.
    pub rows: Option<u64>,
    /// About the memory they take in each instance.
    pub bytes: Option<u64>,
    /// Records read by a load under way (the table is read whole before an instance joins
    /// its group); 0 once loaded.
    pub loading_records: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ScaleStatus {
    pub min: u32,
    pub max: u32,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastError {
    /// The commit concerned, if any.
    pub commit: Option<String>,
    pub topology: Option<String>,
    pub message: String,
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// An invalid commit's first error, with its file, line and column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub place: Option<Place>,
}

/// Where an error is, and with a forge, the link to that line of the file at the commit.
#[derive(Debug, Clone, Serialize)]
pub struct Place {
    #[serde(flatten)]
    pub diagnostic: crate::diagnostic::Diagnostic,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl Place {
    pub fn new(
        diagnostic: crate::diagnostic::Diagnostic,
        commit: &str,
        forge: Option<&crate::forge::Config>,
    ) -> Place {
        Place {
            url: forge.and_then(|f| f.file_url(commit, &diagnostic.file, diagnostic.line)),
            diagnostic,
        }
    }
}

/// One move as `GET /api/history` shows it: with who made the commit it moved to, and why.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryShown {
    #[serde(flatten)]
    pub entry: crate::store::HistoryEntry,
    pub author: Option<String>,
    /// The first line of the commit's message.
    pub message: Option<String>,
    /// When the commit was authored, in seconds since the Unix epoch.
    pub committed_at: Option<i64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopologyLabel {
    pub topology: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub topology: String,
    pub step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabel {
    /// `unsigned`, `unknown-key` or `bad-signature` ([`crate::trust::Verdict::label`]).
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabel {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub topology: String,
    pub outcome: String,
}

/// The daemon's Prometheus metrics, prefixed `plumber_`.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Arc<Registry>,
    pub commits_seen: Counter,
    pub invalid_commits: Counter,
    pub untrusted_commits: Family<VerdictLabel, Counter>,
    /// 1 while the branch's head is refused for its signature.
    pub head_untrusted: Gauge,
    pub cutovers: Family<OutcomeLabels, Counter>,
    pub cutover_actions: Family<TopologyLabel, Counter>,
    pub cutover_seconds: Family<TopologyLabel, Histogram>,
    pub in_cutover: Family<TopologyLabel, Gauge>,
    pub exactly_once: Family<TopologyLabel, Gauge>,
    pub lag: Family<StepLabels, Gauge>,
    pub instances: Family<StepLabels, Gauge>,
    /// From the processors' own `/metrics` ([`super::rates`]).
    pub records_per_second: Family<StepLabels, Gauge<f64, AtomicU64>>,
    pub records_consumed: Family<StepLabels, Counter>,
    pub records_dead_lettered: Family<StepLabels, Counter>,
    pub forge_publications: Counter,
    pub forge_publish_failures: Counter,
    /// `POST /hooks/git` deliveries by what they did ([`super::hooks`]).
    pub webhooks: Family<WebhookLabel, Counter>,
    pub listener: super::listener::ListenerMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("plumber");
        let commits_seen = Counter::default();
        let invalid_commits = Counter::default();
        let untrusted_commits = Family::<VerdictLabel, Counter>::default();
        let head_untrusted = Gauge::default();
        let cutovers = Family::<OutcomeLabels, Counter>::default();
        let cutover_actions = Family::<TopologyLabel, Counter>::default();
        let cutover_seconds = Family::<TopologyLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0])
        });
        let in_cutover = Family::<TopologyLabel, Gauge>::default();
        let exactly_once = Family::<TopologyLabel, Gauge>::default();
        let lag = Family::<StepLabels, Gauge>::default();
        let instances = Family::<StepLabels, Gauge>::default();
        let records_per_second = Family::<StepLabels, Gauge<f64, AtomicU64>>::default();
        let records_consumed = Family::<StepLabels, Counter>::default();
        let records_dead_lettered = Family::<StepLabels, Counter>::default();
        let forge_publications = Counter::default();
        let forge_publish_failures = Counter::default();
        registry.register(
            "commits_seen",
            "New branch heads seen",
            commits_seen.clone(),
        );
        registry.register(
            "invalid_commits",
            "Commits refused by validation (never applied)",
            invalid_commits.clone(),
        );
        registry.register(
            "untrusted_commits",
            "Branch heads refused because no trusted key signed them (never applied), by verdict",
            untrusted_commits.clone(),
        );
        registry.register(
            "head_untrusted",
            "1 while the branch's head is refused because no trusted key signed it",
            head_untrusted.clone(),
        );
        registry.register("cutovers", "Cutovers by outcome", cutovers.clone());
        registry.register(
            "cutover_actions",
            "Cutover actions executed",
            cutover_actions.clone(),
        );
        registry.register(
            "cutover_duration_seconds",
            "Time from a cutover's start to its end",
            cutover_seconds.clone(),
        );
        registry.register(
            "in_cutover",
            "1 while the topology is in a cutover",
            in_cutover.clone(),
        );
        registry.register(
            "exactly_once",
            "1 when the topology's processors run exactly-once, 0 at-least-once",
            exactly_once.clone(),
        );
        registry.register(
            "processor_lag",
            "Records a processor has not consumed",
            lag.clone(),
        );
        registry.register(
            "processor_instances",
            "Running instances of a processor",
            instances.clone(),
        );
        registry.register(
            "processor_records_per_second",
            "Input records a processor consumes per second, summed over its instances (absent while unknown)",
            records_per_second.clone(),
        );
        registry.register(
            "processor_records",
            "Input records a processor's instances consumed since this daemon started reading their /metrics",
            records_consumed.clone(),
        );
        registry.register(
            "processor_records_dead_lettered",
            "Input records a processor's instances sent to the dead-letter topic since this daemon started reading their /metrics",
            records_dead_lettered.clone(),
        );
        registry.register(
            "forge_publications",
            "Commit statuses and plan comments sent to the forge",
            forge_publications.clone(),
        );
        registry.register(
            "forge_publish_failures",
            "Commit statuses and plan comments the forge did not take, after retries",
            forge_publish_failures.clone(),
        );
        let webhooks = Family::<WebhookLabel, Counter>::default();
        registry.register(
            "webhooks",
            "POST /hooks/git deliveries by outcome: fetch (not a pull-request event), pull-request (verified: fetch, plan published, preview decided), unsigned (a pull-request event without a webhook secret: fetch only), replayed (a verified body seen before: fetch only), duplicate (a delivery id seen before: nothing), refused (a wrong signature)",
            webhooks.clone(),
        );
        let listener = super::listener::ListenerMetrics::default();
        listener.register(&mut registry);
        Metrics {
            registry: Arc::new(registry),
            webhooks,
            listener,
            commits_seen,
            invalid_commits,
            untrusted_commits,
            head_untrusted,
            cutovers,
            cutover_actions,
            cutover_seconds,
            in_cutover,
            exactly_once,
            lag,
            instances,
            records_per_second,
            records_consumed,
            records_dead_lettered,
            forge_publications,
            forge_publish_failures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_of_the_head_is_flat_json_and_a_refused_one_fails_the_commit_status() {
        use crate::trust::{KeyKind, Verdict};
        let dir = std::path::Path::new("/etc/plumber/keys");
        let refused = SignatureStatus::new("0123456789abcdef", Verdict::Unsigned, dir);
        let json = serde_json::to_value(&refused).unwrap_or_default();
        assert_eq!(json["verdict"], "unsigned");
        assert_eq!(json["trusted"], false);
        assert_eq!(json["commit"], "0123456789abcdef");
        let status = refused.commit_status();
        assert!(
            status
                .as_ref()
                .is_some_and(|s| s.state == crate::forge::State::Failure
                    && s.description.contains("is not signed")
                    && s.description.contains("/etc/plumber/keys")),
            "{status:?}"
        );

        let unknown = Verdict::UnknownKey {
            kind: KeyKind::Ssh,
            key: "SHA256:abc".into(),
        };
        let json =
            serde_json::to_value(SignatureStatus::new("c", unknown, dir)).unwrap_or_default();
        assert_eq!(
            (&json["verdict"], &json["kind"], &json["key"]),
            (&"unknown-key".into(), &"ssh".into(), &"SHA256:abc".into())
        );

        let trusted = Verdict::Trusted(crate::trust::Signer {
            kind: KeyKind::OpenPgp,
            fingerprint: "ABCD".into(),
            file: dir.join("team.asc"),
        });
        let trusted = SignatureStatus::new("c", trusted, dir);
        assert!(trusted.trusted && trusted.commit_status().is_none());
        let json = serde_json::to_value(&trusted).unwrap_or_default();
        assert_eq!(json["fingerprint"], "ABCD");
        assert_eq!(json["file"], "/etc/plumber/keys/team.asc");
    }
}
