//! The daemon: follows a branch and moves each topology to the newest valid commit.
//!
//! A commit travels one way: [`watch`] says a ref may have moved (notify, polling, a webhook);
//! `follow` resolves the branch and loads the newest valid commit once ([`revisions`]);
//! each topology's `worker` takes it as its desired revision (newest wins) and
//! `reconcile`s towards it, one engine action at a time ([`crate::cutover`]), so a newer
//! commit takes over at the next action even while a move waits. `observe` reads what runs
//! (lag, instances, stalls) for status and metrics; [`api`] serves [`status`] to readers.
//!
//! An invalid commit is never applied: the last valid one keeps running and the error shows
//! in status, logs and metrics. With trusted keys, neither is a head they did not sign.

pub mod api;
pub mod config;
pub mod events;
pub mod facts;
mod follow;
pub mod health;
pub mod hooks;
pub mod listener;
mod mailbox;
mod observe;
pub mod rates;
mod reconcile;
mod resource;
pub mod review;
pub mod revisions;
pub mod status;
pub mod tail;
pub mod watch;
mod worker;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cutover::{self, CutoverConfig};
use crate::kafka::{Admin, KafkaAdmin};
use crate::runtime::{Cluster, Delivery, Runtime};
use crate::store::{CutoverStore, StateDir};
use facts::Store;
use health::Kind;
pub use listener::ListenerConfig;
pub use revisions::{Revision, Revisions};
use status::HistoryShown;
pub use watch::{GitAuth, Source, Trigger};

/// Settings of the daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub repo: String,
    pub branch: String,
    pub state_dir: PathBuf,
    pub listen: SocketAddr,
    /// What the listener holds at most: connections, time, event streams, webhook bodies.
    pub listener: ListenerConfig,
    /// Overrides every cluster's bootstrap servers (`plumber up --bootstrap`).
    pub bootstrap: Option<String>,
    /// The credentials of the clusters that have some, one librdkafka property per file
    /// (`plumber up --kafka-credentials DIR`).
    pub kafka_credentials: Option<PathBuf>,
    /// Where the daemon's pod mounts each credentials Secret, by the Secret's name (over
    /// `kafka_credentials`).
    pub credential_dirs: BTreeMap<String, PathBuf>,
    /// What differs per cluster of `plumber.yaml` in this environment, by cluster name.
    pub clusters: BTreeMap<String, ClusterOverride>,
    /// Git credentials instead of the `PLUMBER_GIT_*` variables.
    pub git_auth: Option<watch::GitAuth>,
    /// How often a remote repository is fetched (a local one is watched instead).
    pub poll_interval: Duration,
    /// How often lag and instances are observed for status and metrics.
    pub observe_interval: Duration,
    /// How long one look of the observer may spend reading lag from Kafka. The groups it
    /// did not get to show the lag last read and are read first at the next look; the
    /// first topology of a look is always read whole, so every group is read in turn.
    pub lag_reads_per_look: Duration,
    /// A processor with lag whose committed offsets have not moved for this long is
    /// restarted: a consumer stuck in a broker quirk (tansu 0.6 can leave a member with no
    /// partitions after a crash) reads on after a graceful restart, which loses nothing.
    /// Never shorter than the longest time the processor may spend on one record.
    pub stalled_after: Duration,
    /// How long one unit of a thread's work (an engine step, a look at the branch, a plan
    /// pass) may run before `/healthz` says the daemon is wedged ([`health::Threads::busy`]).
    pub wedged_after: Duration,
    /// How long one record may take in a processor, every attempt included.
    pub record_timeout: Duration,
    /// The rebalance protocol of the groups of lives started from now on (a life keeps the
    /// one it started with).
    pub assignor: crate::runtime::Assignor,
    pub cutover: CutoverConfig,
    /// Verifies `POST /hooks/git` when set.
    pub webhook_secret: Option<String>,
    /// When set, only commits signed by a key of this directory are applied
    /// (`--trusted-keys`, [`crate::trust`]); read once, at start.
    pub trusted_keys: Option<PathBuf>,
    /// Refs planned as merge previews into the branch (`--watch-refs`; the branch itself
    /// aside): glob patterns with one `*` at most.
    pub watch_refs: Vec<String>,
    /// Push the plan notes of a remote repository's mirror back to it (`--push-notes`).
    pub push_notes: bool,
    /// Where each pull request's plan and its head's commit status are published (`--forge`).
    pub forge: Option<crate::forge::Config>,
    /// The daemon's API as the forge's readers reach it: commit statuses link to
    /// `{public_url}/api/plans/{ref}` (`--public-url`; absent: no link).
    pub public_url: Option<String>,
    /// Open pull requests carrying this label get a preview environment (`--preview-label`,
    /// [`review::previews`]); needs `forge`. `None`: no previews.
    pub preview_label: Option<String>,
    /// What one commit may make the daemon read and write ([`crate::spec::budget`]).
    pub budget: crate::spec::budget::Budget,
    /// With trusted keys: apply a head that does not descend from what runs (a force-push to
    /// an older signed commit). Off by default: the way back is `git revert`.
    pub allow_rollback: bool,
    /// The Secrets steps may reference (`stepSecrets`, the subdirectories of `plumber up
    /// --secrets DIR`); a reference to any other is a validation error. Default: none.
    pub step_secrets: crate::spec::StepSecrets,
    /// What running a commit's step tests may take; a commit whose tests fail, or do not
    /// finish within it, is not applied ([`crate::steptest`]).
    pub step_tests: crate::steptest::Limits,
    /// The data diff of every ref plan ([`crate::datadiff`]): how much of what feeds each
    /// replaced or added step is read; `None`: no data diff.
    pub data_diff: Option<crate::datadiff::SampleLimits>,
    /// Run the commands of exec and http steps in step tests (of the branch's commits) and in
    /// the data diff (of pull requests whose preview environment runs): `plumber up
    /// --run-commands`. The daemon in Kubernetes never does: those commands live in the
    /// steps' images.
    pub run_commands: bool,
}

impl DaemonConfig {
    /// How long a group with lag may commit nothing before its processor is restarted: never
    /// less than the longest a processor may spend on one record, so a record it is still
    /// retrying is never taken away from it.
    pub fn stall_threshold(&self) -> Duration {
        let busiest =
            self.record_timeout + crate::runtime::RECORD_OVERHEAD + Duration::from_secs(5);
        self.stalled_after.max(busiest)
    }

    pub fn new(repo: &str, state_dir: PathBuf) -> Self {
        DaemonConfig {
            repo: repo.to_owned(),
            branch: "main".into(),
            state_dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            listener: ListenerConfig::default(),
            bootstrap: None,
            kafka_credentials: None,
            credential_dirs: BTreeMap::new(),
            clusters: BTreeMap::new(),
            git_auth: None,
            poll_interval: Duration::from_secs(30),
            observe_interval: Duration::from_secs(2),
            lag_reads_per_look: Duration::from_secs(5),
            stalled_after: Duration::from_secs(60),
            wedged_after: health::DEFAULT_WEDGED_AFTER,
            record_timeout: Duration::from_secs(60),
            assignor: crate::runtime::Assignor::default(),
            cutover: CutoverConfig::default(),
            webhook_secret: None,
            trusted_keys: None,
            watch_refs: watch::DEFAULT_WATCH_REFS.map(str::to_owned).to_vec(),
            push_notes: false,
            forge: None,
            public_url: None,
            preview_label: None,
            allow_rollback: false,
            budget: crate::spec::budget::Budget::default(),
            step_secrets: crate::spec::StepSecrets::Only {
                names: Default::default(),
                origin: "no Secret is allowed for steps".into(),
            },
            step_tests: crate::steptest::Limits::default(),
            data_diff: None,
            run_commands: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Watch(#[from] watch::Error),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error(transparent)]
    Repo(#[from] crate::repo::Error),
    #[error(transparent)]
    Kafka(#[from] crate::kafka::Error),
    #[error(transparent)]
    Cutover(#[from] cutover::Error),
    #[error(transparent)]
    TrustedKeys(#[from] crate::trust::LoadError),
    #[error(transparent)]
    Signature(#[from] crate::trust::ReadError),
    #[error("commit {commit} is not valid: {errors}")]
    Invalid {
        commit: String,
        errors: String,
        /// The first error, with its file and place.
        first: Option<Box<crate::diagnostic::Diagnostic>>,
    },
    #[error("branch `{branch}` not found in {repo}: {message}")]
    NoBranch {
        branch: String,
        repo: String,
        message: String,
    },
    #[error("topology {topology} uses cluster `{cluster}`, which plumber.yaml does not declare")]
    NoCluster { topology: String, cluster: String },
    #[error("cannot serve the API on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Forge(#[from] crate::forge::Error),
    #[error("cannot start the {name} thread: {source}")]
    Thread {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether this daemon replica did nothing because another one holds the lease: not a
    /// failure of the topology, and over as soon as the lease comes its way.
    pub fn is_not_leader(&self) -> bool {
        matches!(
            self,
            Error::Store(crate::store::Error::NotLeader { .. })
                | Error::Cutover(cutover::Error::Store {
                    source: crate::store::Error::NotLeader { .. },
                    ..
                })
        )
    }

    /// Whether trying again can help without a new commit or a person (a network or broker
    /// hiccup can pass; a damaged state file or an undeclared cluster does not).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Cutover(e) => e.is_retryable(),
            Error::Forge(e) => e.is_retryable(),
            Error::Store(e) => e.is_retryable(),
            Error::Invalid { .. }
            | Error::NoCluster { .. }
            | Error::NoBranch { .. }
            | Error::TrustedKeys(_) => false,
            Error::Watch(_)
            | Error::Signature(_)
            | Error::Repo(_)
            | Error::Kafka(_)
            | Error::Listen { .. }
            | Error::Thread { .. } => true,
        }
    }
}

/// Who uses an admin client (each use has its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum AdminUse {
    Cutover,
    Observe,
}

/// Where the observed status of each topology is published beside `GET /api/status` (the
/// Topology resources of `plumber daemon`). Called after every look of the observer.
pub trait StatusSink: Send + Sync {
    /// `repository`: the error of the branch's head (an invalid commit), shown by every
    /// topology that has no error of its own.
    fn publish(&self, topology: &status::TopologyStatus, repository: Option<&status::LastError>);
    /// A step of a cutover, as `kubectl describe topology` lists Events.
    fn event(&self, topology: &str, event: &CutoverEvent);
}

/// What [`StatusSink::event`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutoverEvent {
    /// `CutoverStarted`, `CutoverProgress` (actions that took effect), `CutoverFinished`.
    pub reason: &'static str,
    pub note: String,
}

/// A cluster of `plumber.yaml` as this environment reaches it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterOverride {
    pub bootstrap: Option<String>,
    /// Added to the cluster's own, key by key.
    pub properties: BTreeMap<String, String>,
    /// The Secret of its credentials, instead of `plumber.yaml`'s.
    pub credentials: Option<String>,
}

/// Connects to a cluster's admin API.
pub type Connect = dyn Fn(&Cluster) -> Result<Arc<dyn Admin>, crate::kafka::Error> + Send + Sync;

/// Shared by the follower, the workers and the observer.
pub struct Context {
    pub config: DaemonConfig,
    /// The state directory: the repository's claim, the mirror and the checkouts (and, for
    /// `plumber up`, the cutover records).
    pub state: Arc<StateDir>,
    /// Where the cutover engine keeps its records: the state directory for `plumber up`, the
    /// Topology statuses for `plumber daemon`.
    pub records: Arc<dyn CutoverStore>,
    /// Where observed status goes besides the API (set before [`Daemon::start`]).
    pub status_sink: Option<Arc<dyn StatusSink>>,
    pub runtime: Arc<dyn Runtime>,
    pub revisions: Revisions,
    pub store: Store,
    /// The keys of [`DaemonConfig::trusted_keys`]: only commits they signed are applied.
    pub trusted_keys: Option<Arc<crate::trust::TrustedKeys>>,
    /// The plans of the watched refs.
    pub plans: Arc<review::plans::Plans>,
    /// What `GET /api/events` streams.
    pub events: Arc<events::Events>,
    /// Asks the forge publisher to publish a pull request's plan again (webhooks).
    pub publish: review::publish::Requests,
    /// Asks the previews thread to decide a pull request's preview again (webhooks).
    pub previews: review::previews::Requests,
    /// The daemon's threads, for `GET /healthz`.
    pub threads: Arc<health::Threads>,
    /// A webhook asked for a fetch that has not started yet (later ones need not ask again).
    fetch_asked: AtomicBool,
    connect: Box<Connect>,
    /// Per use and cluster: the cutover engine and the observer have clients of their own,
    /// so the observer's many lag reads (tansu answers each in up to seconds under load)
    /// never queue in front of a cutover's calls.
    admins: Mutex<BTreeMap<(AdminUse, String), Arc<dyn Admin>>>,
    /// The delivery mode of each cluster's processors, decided once per cluster.
    deliveries: Mutex<BTreeMap<String, Delivery>>,
    /// The clusters of the revisions seen, by bootstrap servers: what the observer connects
    /// with, knowing only the bootstrap servers a topology's record keeps.
    clusters: Mutex<BTreeMap<String, Cluster>>,
    /// Records/s per processor, from their `/metrics` (the observer reads them).
    rates: rates::Rates,
    stopping: AtomicBool,
}

impl Context {
    pub fn new(config: DaemonConfig, runtime: Arc<dyn Runtime>) -> Result<Arc<Self>, Error> {
        Context::with_records(config, runtime, None, None)
    }

    /// As [`Context::new`], with the cutover records kept in `records` instead of the state
    /// directory, and observed status published to `sink` too.
    pub fn with_records(
        config: DaemonConfig,
        runtime: Arc<dyn Runtime>,
        records: Option<Arc<dyn CutoverStore>>,
        sink: Option<Arc<dyn StatusSink>>,
    ) -> Result<Arc<Self>, Error> {
        let any = config.kafka_credentials.clone();
        let by_secret = config.credential_dirs.clone();
        let connect: Box<Connect> = Box::new(move |cluster| {
            let dir = cluster
                .credentials
                .as_ref()
                .and_then(|secret| by_secret.get(secret))
                .or(any.as_ref());
            let admin = KafkaAdmin::connect_to(cluster, dir.map(PathBuf::as_path))?;
            Ok(Arc::new(admin) as Arc<dyn Admin>)
        });
        Context::build(config, runtime, records, sink, connect)
    }

    /// As [`Context::new`], with another way to reach Kafka's admin API (a test's broker
    /// that cannot create topics through it, for one).
    pub fn with_admin(
        config: DaemonConfig,
        runtime: Arc<dyn Runtime>,
        connect: Box<Connect>,
    ) -> Result<Arc<Self>, Error> {
        Context::build(config, runtime, None, None, connect)
    }

    fn build(
        config: DaemonConfig,
        runtime: Arc<dyn Runtime>,
        records: Option<Arc<dyn CutoverStore>>,
        status_sink: Option<Arc<dyn StatusSink>>,
        connect: Box<Connect>,
    ) -> Result<Arc<Self>, Error> {
        // A directory that trusts nothing, or a key that cannot be read, stops the start: the
        // operator asked for signed commits and must not get a daemon that applies none.
        let trusted_keys = match &config.trusted_keys {
            Some(dir) => {
                let keys = crate::trust::TrustedKeys::load(dir)?;
                tracing::info!(dir = %dir.display(), keys = keys.len(), "only commits signed by a trusted key are applied");
                Some(Arc::new(keys))
            }
            None => None,
        };
        let state = Arc::new(StateDir::open(&config.state_dir)?);
        let wedged_after = config.wedged_after;
        let threads = Arc::new(health::Threads::new(wedged_after));
        threads.wait_for({
            let runtime = runtime.clone();
            Arc::new(move || runtime.unsynced())
        });
        let records = records.unwrap_or_else(|| state.clone() as Arc<dyn CutoverStore>);
        for pattern in &config.watch_refs {
            watch::check_ref_pattern(pattern)?;
        }
        let mut source =
            Source::new(&config.repo, &config.state_dir).with_watched_refs(&config.watch_refs);
        if let Some(auth) = &config.git_auth {
            source = source.with_auth(auth.clone());
        }
        let store = Store::default();
        store.apply(facts::Fact::Branch(config.branch.clone()));
        Ok(Arc::new(Context {
            revisions: Revisions::new(
                source,
                &state,
                config.step_secrets.clone(),
                config.budget,
                config.step_tests.clone(),
                config.run_commands,
            ),
            config,
            state,
            records,
            status_sink,
            runtime,
            store,
            trusted_keys,
            plans: Arc::new(review::plans::Plans::default()),
            events: Arc::new(events::Events::default()),
            publish: review::publish::Requests::default(),
            previews: review::previews::Requests::default(),
            threads,
            fetch_asked: AtomicBool::new(false),
            connect,
            admins: Mutex::new(BTreeMap::new()),
            deliveries: Mutex::new(BTreeMap::new()),
            clusters: Mutex::new(BTreeMap::new()),
            rates: rates::Rates::default(),
            stopping: AtomicBool::new(false),
        }))
    }

    fn admin(&self, usage: AdminUse, bootstrap: &str) -> Result<Arc<dyn Admin>, Error> {
        let mut admins = self.admins.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (usage, bootstrap.to_owned());
        if let Some(admin) = admins.get(&key) {
            return Ok(admin.clone());
        }
        let cluster = self
            .clusters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(bootstrap)
            .cloned()
            .unwrap_or_else(|| Cluster::at(bootstrap));
        let records = self.records.clone();
        let admin: Arc<dyn Admin> = Arc::new(crate::kafka::Fenced::new(
            (self.connect)(&cluster)?,
            Arc::new(move || records.may_act()),
        ));
        admins.insert(key, admin.clone());
        Ok(admin)
    }

    /// How the processors of the cluster at `bootstrap` run: exactly-once when its brokers
    /// support transactions. Decided once, and only on an answer: no answer is an error (the
    /// caller retries), never a silent at-least-once.
    fn delivery(&self, bootstrap: &str, admin: &dyn Admin) -> Result<Delivery, Error> {
        if let Some(known) = self
            .deliveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(bootstrap)
        {
            return Ok(*known);
        }
        let delivery = if admin.supports_transactions()? {
            Delivery::ExactlyOnce
        } else {
            tracing::warn!(
                bootstrap,
                "the cluster does not support transactions: its processors run at-least-once (a crash may duplicate, never lose)"
            );
            Delivery::AtLeastOnce
        };
        tracing::info!(
            bootstrap,
            delivery = delivery.as_str(),
            "delivery mode decided"
        );
        self.deliveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(bootstrap.to_owned(), delivery);
        Ok(delivery)
    }

    /// A topology's cluster in a revision (with `--bootstrap` over its bootstrap servers).
    fn cluster(
        &self,
        revision: &Revision,
        topology: &crate::graph::Topology,
    ) -> Result<Cluster, Error> {
        let spec = revision
            .clusters
            .get(&topology.cluster)
            .ok_or_else(|| Error::NoCluster {
                topology: topology.name.clone(),
                cluster: topology.cluster.clone(),
            })?;
        let mut cluster = Cluster::of(spec);
        if let Some(over) = self.config.clusters.get(&topology.cluster) {
            if let Some(bootstrap) = &over.bootstrap {
                cluster.bootstrap = bootstrap.clone();
            }
            cluster.properties.extend(over.properties.clone());
            if over.credentials.is_some() {
                cluster.credentials = over.credentials.clone();
            }
        }
        if let Some(bootstrap) = &self.config.bootstrap {
            cluster.bootstrap = bootstrap.clone();
        }
        self.clusters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(cluster.bootstrap.clone(), cluster.clone());
        Ok(cluster)
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// History entries with the author, time and message of the commit each moved to.
    pub fn shown_history(&self, entries: Vec<crate::store::HistoryEntry>) -> Vec<HistoryShown> {
        let infos = self
            .revisions
            .commit_infos(entries.iter().map(|e| e.to.as_str()));
        entries
            .into_iter()
            .map(|entry| {
                let info = infos.get(&entry.to);
                HistoryShown {
                    author: info.map(|i| i.author.clone()),
                    message: info.map(|i| i.summary.clone()),
                    committed_at: info.map(|i| i.time),
                    entry,
                }
            })
            .collect()
    }
}

/// The daemon's threads; [`Daemon::shutdown`] stops them.
pub struct Daemon {
    context: Arc<Context>,
    triggers: Sender<Trigger>,
    follower: Option<JoinHandle<()>>,
    observer: Option<JoinHandle<()>>,
    planner: Option<JoinHandle<()>>,
    publisher: Option<review::Running>,
    previews: Option<review::Running>,
    api: Option<api::Server>,
    pub listening: SocketAddr,
}

impl Daemon {
    /// Starts watching, reconciling, observing and serving the API.
    pub fn start(context: Arc<Context>) -> Result<Daemon, Error> {
        // First: a forge that cannot be used (its token file) stops the daemon before it acts.
        // Should a later step fail, dropping it ends it.
        let publisher = review::publish::start(&context)?;
        let previews = review::previews::start(&context)?;
        let (triggers, receiver) = mpsc::channel();
        let api = api::Server::start(context.clone(), triggers.clone())?;
        let listening = api.addr;
        let watcher = context.revisions.source().watch(triggers.clone())?;
        if context.config.forge.is_some() && context.config.webhook_secret.is_none() {
            tracing::warn!(
                "no webhook secret: POST /hooks/git accepts anyone's posts, so a webhook only \
                 fetches; pull-request webhooks neither publish plans again nor decide previews \
                 (give --webhook-secret-file, or webhook.secretFile in the daemon's configuration)"
            );
        }
        let follower = spawn(&context.threads, "follow", Kind::Essential, {
            let context = context.clone();
            move || {
                // The watcher lives as long as the loop.
                let _watcher = watcher;
                follow::follow(&context, &receiver);
            }
        })?;
        let observer = spawn(&context.threads, "observe", Kind::Essential, {
            let context = context.clone();
            move || observe::observe_loop(&context)
        })?;
        let wake_planner = context.plans.receiver();
        let planner = spawn(&context.threads, "plans", Kind::Essential, {
            let context = context.clone();
            move || review::plans::run(&context, &wake_planner)
        })?;
        let _ = triggers.send(Trigger::Startup);
        tracing::info!(repo = %context.revisions.source().display(), branch = %context.config.branch, api = %listening, "daemon started");
        Ok(Daemon {
            context,
            triggers,
            follower: Some(follower),
            observer: Some(observer),
            planner: Some(planner),
            publisher,
            previews,
            api: Some(api),
            listening,
        })
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// Stops reconciling: the action in hand finishes and is saved (the next start goes on
    /// from there). Processors keep running; the caller decides about them.
    pub fn shutdown(&mut self) {
        self.shutdown_within(None);
    }

    /// As [`Daemon::shutdown`], waiting for the daemon's threads until `deadline` at most:
    /// answers the names of those still busy then, which are left to end with the process
    /// (a topology's worker in the middle of an action is a crash the engine resumes from;
    /// the review side holds nothing). So a stop is bounded even while a plan of a large ref,
    /// a fetch or a cutover action takes long.
    pub fn shutdown_within(&mut self, deadline: Option<Instant>) -> Vec<&'static str> {
        self.context.threads.stop();
        self.context.stopping.store(true, Ordering::SeqCst);
        let _ = self.triggers.send(Trigger::Shutdown);
        self.context.plans.look();
        let mut busy = Vec::new();
        // Everything is told to stop before anything is waited for: they end together.
        let publisher = self.publisher.take().and_then(review::Running::stopping);
        let previews = self.previews.take().and_then(review::Running::stopping);
        // The observer only reads; it may be inside a slow Kafka call and ends on its own.
        drop(self.observer.take());
        let waits = [
            ("follow", self.follower.take()),
            ("previews", previews),
            ("plans", self.planner.take()),
            ("publish", publisher),
        ];
        for (name, thread) in waits {
            if let Some(thread) = thread
                && !join_by(thread, deadline)
            {
                busy.push(name);
            }
        }
        if let Some(api) = self.api.take() {
            api.stop();
        }
        busy
    }
}

/// Joins `thread` unless it is still running at `deadline` (`None`: waits as long as it
/// takes); whether it ended.
fn join_by(thread: JoinHandle<()>, deadline: Option<Instant>) -> bool {
    if let Some(deadline) = deadline {
        // JoinHandle has no timed join; its end is looked at often enough for a shutdown.
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = thread.join();
    true
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts a thread of the daemon, which `GET /healthz` watches from now on.
fn spawn(
    threads: &Arc<health::Threads>,
    name: &str,
    kind: Kind,
    body: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, Error> {
    let alive = threads.enter(name, kind);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // Dropped as the thread ends, panicking or not.
            let _alive = alive;
            body();
        })
        .map_err(|source| Error::Thread {
            name: name.into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_holding_the_lease_is_told_apart_from_failures() {
        let not_leader = || crate::store::Error::NotLeader {
            topology: "t".into(),
        };
        assert!(Error::Store(not_leader()).is_not_leader());
        assert!(
            Error::Cutover(cutover::Error::Store {
                topology: "t".into(),
                source: not_leader(),
            })
            .is_not_leader()
        );
        let conflict = Error::Store(crate::store::Error::Conflict {
            topology: "t".into(),
        });
        assert!(!conflict.is_not_leader());
    }
}
