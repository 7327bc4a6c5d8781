//! The daemon: follows a branch and moves each topology to the newest valid commit.
//!
//! Data enters through [`watch`] (a local repository's refs, or a fetched mirror); every
//! reason to look again is a [`Trigger`] on one channel. The reconcile loop resolves the
//! branch, validates a new head and, if it is valid, hands it to every topology's worker as
//! that topology's desired revision. An invalid commit is never applied: the last valid one
//! keeps running and the error shows in status, logs and metrics.
//!
//! Each topology has its own worker thread, so one topology's cutover never blocks another's.
//! A worker first resumes a cutover left in the state directory, then, if its desired
//! revision differs from the applied one, plans and runs the next cutover. Commits arriving
//! meanwhile replace the desired revision (newest wins): intermediate ones are skipped.
//! Failed attempts are retried with exponential backoff (1 s to 60 s).

pub mod api;
pub mod status;
pub mod watch;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cutover::{self, CutoverConfig, Engine, Event};
use crate::graph::{Kind, Topology};
use crate::kafka::{Admin, KafkaAdmin, Progress};
use crate::plan::plan_topology;
use crate::runtime::Runtime;
use crate::spec::ClusterSpec;
use crate::state::{CutoverProgress, StateDir, TopologyState};
use status::{CutoverStatus, LastError, Phase, StepLabels, StepStatus, Store, TopologyLabel};
pub use watch::{Source, Trigger};

/// Settings of the daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub repo: String,
    pub branch: String,
    pub state_dir: PathBuf,
    pub listen: SocketAddr,
    /// Overrides every cluster's bootstrap servers (`plumber up --bootstrap`).
    pub bootstrap: Option<String>,
    /// How often a remote repository is fetched (a local one is watched instead).
    pub poll_interval: Duration,
    /// How often lag and instances are observed for status and metrics.
    pub observe_interval: Duration,
    /// A processor with lag whose committed offsets have not moved for this long is
    /// restarted: a consumer stuck in a broker quirk (tansu 0.6 can leave a member with no
    /// partitions after a crash) reads on after a graceful restart, which loses nothing.
    pub stalled_after: Duration,
    pub cutover: CutoverConfig,
    /// Verifies `POST /hooks/git` when set.
    pub webhook_secret: Option<String>,
}

impl DaemonConfig {
    pub fn new(repo: &str, state_dir: PathBuf) -> Self {
        DaemonConfig {
            repo: repo.to_owned(),
            branch: "main".into(),
            state_dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            bootstrap: None,
            poll_interval: Duration::from_secs(30),
            observe_interval: Duration::from_secs(2),
            stalled_after: Duration::from_secs(60),
            cutover: CutoverConfig::default(),
            webhook_secret: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Watch(#[from] watch::Error),
    #[error(transparent)]
    State(#[from] crate::state::Error),
    #[error(transparent)]
    Repo(#[from] crate::repo::Error),
    #[error(transparent)]
    Kafka(#[from] crate::kafka::Error),
    #[error(transparent)]
    Cutover(#[from] cutover::Error),
    #[error("commit {commit} is not valid: {errors}")]
    Invalid { commit: String, errors: String },
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
    #[error("cannot start the {name} thread: {source}")]
    Thread {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// One valid commit, ready to run: its graphs, clusters and a checkout of its files.
#[derive(Debug)]
pub struct Revision {
    pub commit: String,
    pub topologies: Vec<Topology>,
    pub clusters: BTreeMap<String, ClusterSpec>,
    pub checkout: PathBuf,
}

impl Revision {
    pub fn topology(&self, name: &str) -> Option<&Topology> {
        self.topologies.iter().find(|t| t.name == name)
    }

    /// The directory of each step's file in the checkout.
    fn workdirs(&self, topology: &Topology) -> BTreeMap<String, PathBuf> {
        topology
            .steps()
            .map(|(_, step)| {
                let dir = std::path::Path::new(&step.file)
                    .parent()
                    .map(|p| self.checkout.join(p))
                    .unwrap_or_else(|| self.checkout.clone());
                (step.name.clone(), dir)
            })
            .collect()
    }
}

/// Revisions kept in memory; a daemon needs a few (applied, in progress, desired) at a time.
const MAX_CACHED_REVISIONS: usize = 64;

/// Loads and caches revisions by commit.
pub struct Revisions {
    source: Source,
    checkouts: PathBuf,
    cache: Mutex<BTreeMap<String, Arc<Revision>>>,
}

impl Revisions {
    pub fn new(source: Source, state: &StateDir) -> Self {
        Revisions {
            source,
            checkouts: state.root().join("checkouts"),
            cache: Mutex::new(BTreeMap::new()),
        }
    }

    /// The revision of `commit`; an error if it is not valid.
    pub fn load(&self, commit: &str) -> Result<Arc<Revision>, Error> {
        if let Some(found) = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(commit)
        {
            return Ok(found.clone());
        }
        let repository = self.source.open()?;
        let oid = repository.resolve(commit)?;
        let snapshot = repository.snapshot(oid)?;
        let validation = crate::validate(&snapshot.files);
        let Some(topologies) = validation.topologies else {
            let errors: Vec<String> = validation.errors().map(ToString::to_string).collect();
            return Err(Error::Invalid {
                commit: commit.to_owned(),
                errors: errors.join("; "),
            });
        };
        let checkout = self.checkouts.join(oid.to_string());
        repository.checkout(oid, &checkout)?;
        let revision = Arc::new(Revision {
            commit: oid.to_string(),
            topologies,
            clusters: validation.clusters,
            checkout,
        });
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        // Any revision can be loaded again from git: the cache only saves work.
        if cache.len() >= MAX_CACHED_REVISIONS {
            cache.clear();
        }
        cache.insert(commit.to_owned(), revision.clone());
        Ok(revision)
    }
}

/// Shared by the reconcile loop, the workers and the observer.
pub struct Context {
    pub config: DaemonConfig,
    pub state: StateDir,
    pub runtime: Arc<dyn Runtime>,
    pub revisions: Revisions,
    pub store: Store,
    admins: Mutex<BTreeMap<String, Arc<dyn Admin>>>,
    /// Per running group with lag: how far it got and since when it has not moved.
    progress: Mutex<BTreeMap<String, Stall>>,
    stopping: AtomicBool,
}

impl Context {
    pub fn new(config: DaemonConfig, runtime: Arc<dyn Runtime>) -> Result<Arc<Self>, Error> {
        let state = StateDir::open(&config.state_dir)?;
        let source = Source::new(&config.repo, &config.state_dir);
        let store = Store::default();
        store.write().branch = config.branch.clone();
        Ok(Arc::new(Context {
            revisions: Revisions::new(source, &state),
            config,
            state,
            runtime,
            store,
            admins: Mutex::new(BTreeMap::new()),
            progress: Mutex::new(BTreeMap::new()),
            stopping: AtomicBool::new(false),
        }))
    }

    fn admin(&self, bootstrap: &str) -> Result<Arc<dyn Admin>, Error> {
        let mut admins = self.admins.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(admin) = admins.get(bootstrap) {
            return Ok(admin.clone());
        }
        let admin: Arc<dyn Admin> = Arc::new(KafkaAdmin::connect(bootstrap)?);
        admins.insert(bootstrap.to_owned(), admin.clone());
        Ok(admin)
    }

    fn bootstrap(&self, revision: &Revision, topology: &Topology) -> Result<String, Error> {
        if let Some(bootstrap) = &self.config.bootstrap {
            return Ok(bootstrap.clone());
        }
        revision
            .clusters
            .get(&topology.cluster)
            .map(|c| c.bootstrap.clone())
            .ok_or_else(|| Error::NoCluster {
                topology: topology.name.clone(),
                cluster: topology.cluster.clone(),
            })
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// The daemon's threads; [`Daemon::shutdown`] stops them.
pub struct Daemon {
    context: Arc<Context>,
    triggers: Sender<Trigger>,
    reconciler: Option<JoinHandle<()>>,
    observer: Option<JoinHandle<()>>,
    api: Option<api::Server>,
    pub listening: SocketAddr,
}

impl Daemon {
    /// Starts watching, reconciling, observing and serving the API.
    pub fn start(context: Arc<Context>) -> Result<Daemon, Error> {
        let (triggers, receiver) = mpsc::channel();
        let api = api::Server::start(context.clone(), triggers.clone())?;
        let listening = api.addr;
        let watcher = context.revisions.source.watch(triggers.clone())?;
        let reconciler = {
            let context = context.clone();
            std::thread::Builder::new()
                .name("reconcile".into())
                .spawn(move || {
                    // The watcher lives as long as the loop.
                    let _watcher = watcher;
                    reconcile_loop(&context, &receiver);
                })
                .map_err(|source| Error::Thread {
                    name: "reconcile".into(),
                    source,
                })?
        };
        let observer = {
            let context = context.clone();
            std::thread::Builder::new()
                .name("observe".into())
                .spawn(move || observe_loop(&context))
                .map_err(|source| Error::Thread {
                    name: "observe".into(),
                    source,
                })?
        };
        let _ = triggers.send(Trigger::Startup);
        tracing::info!(repo = %context.revisions.source.display(), branch = %context.config.branch, api = %listening, "daemon started");
        Ok(Daemon {
            context,
            triggers,
            reconciler: Some(reconciler),
            observer: Some(observer),
            api: Some(api),
            listening,
        })
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// Stops reconciling: the current cutover action finishes and is persisted (the next
    /// start resumes the cutover). Processors keep running; the caller decides about them.
    pub fn shutdown(&mut self) {
        self.context.stopping.store(true, Ordering::SeqCst);
        let _ = self.triggers.send(Trigger::Shutdown);
        if let Some(reconciler) = self.reconciler.take() {
            let _ = reconciler.join();
        }
        // The observer only reads; it may be inside a slow Kafka call and ends on its own.
        drop(self.observer.take());
        if let Some(api) = self.api.take() {
            api.stop();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A topology's worker and the slot its desired revision goes into.
struct Worker {
    slot: Arc<(Mutex<Slot>, Condvar)>,
    handle: JoinHandle<()>,
}

#[derive(Default)]
struct Slot {
    desired: Option<Arc<Revision>>,
    /// Bumped whenever `desired` changes, so a waiting worker wakes for it.
    generation: u64,
}

impl Worker {
    fn spawn(name: &str, context: &Arc<Context>) -> Result<Worker, Error> {
        let slot = Arc::new((Mutex::new(Slot::default()), Condvar::new()));
        let thread = format!("topology-{name}");
        let handle = {
            let (name, context, slot) = (name.to_owned(), context.clone(), slot.clone());
            std::thread::Builder::new()
                .name(thread.clone())
                .spawn(move || worker_loop(&name, &context, &slot))
                .map_err(|source| Error::Thread {
                    name: thread,
                    source,
                })?
        };
        Ok(Worker { slot, handle })
    }

    fn desire(&self, revision: Arc<Revision>) {
        let (lock, wake) = &*self.slot;
        let mut slot = lock.lock().unwrap_or_else(PoisonError::into_inner);
        slot.desired = Some(revision);
        slot.generation += 1;
        wake.notify_all();
    }

    fn wake(&self) {
        let (lock, wake) = &*self.slot;
        let mut slot = lock.lock().unwrap_or_else(PoisonError::into_inner);
        slot.generation += 1;
        wake.notify_all();
    }
}

fn reconcile_loop(context: &Arc<Context>, receiver: &Receiver<Trigger>) {
    let mut workers: BTreeMap<String, Worker> = BTreeMap::new();
    // Topologies with state: resume their cutovers even before the branch is read.
    match context.state.topologies() {
        Ok(known) => {
            for name in known.keys() {
                match Worker::spawn(name, context) {
                    Ok(worker) => {
                        workers.insert(name.clone(), worker);
                    }
                    Err(error) => tracing::error!(%error, "cannot resume a topology"),
                }
            }
        }
        Err(error) => tracing::error!(%error, "cannot read the state directory"),
    }
    let mut followed = Followed::default();
    loop {
        let trigger = match receiver.recv_timeout(context.config.poll_interval) {
            Ok(trigger) => trigger,
            Err(RecvTimeoutError::Timeout) => Trigger::Poll,
            Err(RecvTimeoutError::Disconnected) => Trigger::Shutdown,
        };
        // Coalesce a burst (one commit moves several files) into one look.
        let burst: Vec<Trigger> = std::iter::once(trigger)
            .chain(receiver.try_iter())
            .collect();
        if burst.contains(&Trigger::Shutdown) || context.is_stopping() {
            break;
        }
        workers.retain(|_, w| !w.handle.is_finished());
        tracing::debug!(triggers = ?burst, "looking at the branch");
        match newest_valid(context, &mut followed) {
            Ok(Some(revision)) => {
                let mut names: Vec<String> =
                    revision.topologies.iter().map(|t| t.name.clone()).collect();
                names.extend(context.state.topologies().unwrap_or_default().into_keys());
                names.extend(workers.keys().cloned());
                names.sort();
                names.dedup();
                for name in names {
                    if !workers.contains_key(&name) {
                        match Worker::spawn(&name, context) {
                            Ok(worker) => {
                                workers.insert(name.clone(), worker);
                            }
                            // The next new commit tries again.
                            Err(error) => tracing::error!(%error, "cannot start a topology worker"),
                        }
                    }
                    if let Some(worker) = workers.get(&name) {
                        worker.desire(revision.clone());
                    }
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::error!(%error, "cannot follow the branch");
                context.store.set_error(Some(LastError {
                    commit: followed.head.clone(),
                    topology: None,
                    message: error.to_string(),
                    at: cutover::now(),
                }));
            }
        }
    }
    for worker in workers.values() {
        worker.wake();
    }
    for (_, worker) in workers {
        let _ = worker.handle.join();
    }
}

/// What the reconcile loop has seen of the branch.
#[derive(Default)]
struct Followed {
    /// The last head looked at.
    head: Option<String>,
    /// The last revision handed to the workers.
    desired: Option<String>,
}

/// How far back an invalid head's history is searched for a valid commit.
const MAX_INVALID_RUN: usize = 100;

/// The newest valid commit of the branch, if the head moved and that commit is not the one
/// the workers already have. An invalid head is recorded as the last error; its first-parent
/// ancestors are searched for the newest valid commit (a valid commit followed by a broken one
/// still gets applied), back to the revision already running.
fn newest_valid(
    context: &Context,
    followed: &mut Followed,
) -> Result<Option<Arc<Revision>>, Error> {
    let source = &context.revisions.source;
    source.fetch()?;
    let repository = source.open()?;
    let branch = &context.config.branch;
    let head = repository
        .resolve(&format!("refs/heads/{branch}"))
        .or_else(|_| repository.resolve(branch))
        .map_err(|e| Error::NoBranch {
            branch: branch.clone(),
            repo: source.display(),
            message: e.to_string(),
        })?;
    if followed.head.as_deref() == Some(head.to_string().as_str()) {
        return Ok(None);
    }
    followed.head = Some(head.to_string());
    context.store.metrics.commits_seen.inc();
    let mut candidate = head;
    for _ in 0..MAX_INVALID_RUN {
        let commit = candidate.to_string();
        if followed.desired.as_deref() == Some(commit.as_str()) {
            return Ok(None);
        }
        match context.revisions.load(&commit) {
            Ok(revision) => {
                if candidate == head {
                    tracing::info!(%commit, "new valid commit");
                    // A valid head ends a repository-level error; a topology's own error stays.
                    let kept = context
                        .store
                        .read()
                        .last_error
                        .clone()
                        .filter(|e| e.topology.is_some());
                    context.store.set_error(kept);
                } else {
                    tracing::warn!(%commit, head = %head, "the head is not valid; applying its newest valid ancestor");
                }
                context.store.write().commit = Some(commit.clone());
                followed.desired = Some(commit);
                return Ok(Some(revision));
            }
            Err(Error::Invalid { commit, errors }) => {
                if candidate == head {
                    context.store.metrics.invalid_commits.inc();
                    tracing::error!(%commit, %errors, "commit is not valid; the last valid commit keeps running");
                    context.store.set_error(Some(LastError {
                        commit: Some(commit.clone()),
                        topology: None,
                        message: format!("commit {commit} is not valid: {errors}"),
                        at: cutover::now(),
                    }));
                }
                let parent = repository
                    .git()
                    .find_commit(candidate)
                    .ok()
                    .and_then(|c| c.parent_id(0).ok());
                match parent {
                    Some(parent) => candidate = parent,
                    None => return Ok(None),
                }
            }
            Err(other) => {
                // Not a verdict on the commit: look at it again next time.
                followed.head = None;
                return Err(other);
            }
        }
    }
    Ok(None)
}

enum Outcome {
    /// Nothing more to do until the desired revision changes.
    Settled,
    /// The topology is gone from the repository and nothing of it runs.
    Removed,
}

fn worker_loop(name: &str, context: &Arc<Context>, slot: &(Mutex<Slot>, Condvar)) {
    let (lock, wake) = slot;
    let mut backoff = Duration::from_secs(1);
    let mut seen_generation = u64::MAX;
    loop {
        if context.is_stopping() {
            return;
        }
        let (desired, generation) = {
            let slot = lock.lock().unwrap_or_else(PoisonError::into_inner);
            (slot.desired.clone(), slot.generation)
        };
        let wait = match converge(name, context, desired.as_deref()) {
            Ok(Outcome::Settled) => {
                backoff = Duration::from_secs(1);
                seen_generation = generation;
                None
            }
            Ok(Outcome::Removed) => {
                context.store.remove_topology(name);
                tracing::info!(topology = name, "topology removed");
                return;
            }
            Err(Error::Cutover(cutover::Error::Interrupted { .. })) => return,
            Err(error) => {
                tracing::error!(topology = name, %error, retry_in = ?backoff, "cutover attempt failed");
                context.store.topology(name, |t| {
                    t.phase = Phase::Error;
                    t.last_error = Some(error.to_string());
                });
                context.store.set_error(Some(LastError {
                    commit: None,
                    topology: Some(name.to_owned()),
                    message: error.to_string(),
                    at: cutover::now(),
                }));
                context
                    .store
                    .metrics
                    .cutovers
                    .get_or_create(&status::OutcomeLabels {
                        topology: name.to_owned(),
                        outcome: "failed-attempt".into(),
                    })
                    .inc();
                let wait = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(60));
                Some(wait)
            }
        };
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        match wait {
            // Settled: sleep until a new desired revision (or a stop) arrives.
            None => {
                drop(
                    wake.wait_while(guard, |s| {
                        s.generation == seen_generation && !context.is_stopping()
                    })
                    .unwrap_or_else(PoisonError::into_inner),
                );
            }
            // Failed: retry after the backoff, or earlier for a new revision.
            Some(wait) => {
                drop(
                    wake.wait_timeout_while(guard, wait, |s| {
                        s.generation == generation && !context.is_stopping()
                    })
                    .unwrap_or_else(PoisonError::into_inner),
                );
            }
        }
    }
}

/// Resumes a cutover in progress, then moves to `desired` if it differs from what is applied.
fn converge(
    name: &str,
    context: &Arc<Context>,
    desired: Option<&Revision>,
) -> Result<Outcome, Error> {
    loop {
        let state = context.state.topology(name)?;
        if let Some(progress) = state.cutover {
            let revision = context.revisions.load(&progress.to)?;
            let from = match &progress.from {
                Some(commit) => Some(context.revisions.load(commit)?),
                None => None,
            };
            run_cutover(name, context, &revision, from.as_deref(), progress)?;
            continue;
        }
        let Some(desired) = desired else {
            show_applied(name, context, &state);
            return Ok(Outcome::Settled);
        };
        if state.commit.as_deref() == Some(desired.commit.as_str()) {
            show_applied(name, context, &state);
            return Ok(Outcome::Settled);
        }
        let applied = match &state.commit {
            Some(commit) => Some(context.revisions.load(commit)?),
            None => None,
        };
        let old = applied.as_deref().and_then(|r| r.topology(name));
        let new = desired.topology(name);
        if old.is_none() && new.is_none() {
            context.state.remove_topology(name)?;
            return Ok(Outcome::Removed);
        }
        let plan = plan_topology(old, new);
        let progress = CutoverProgress {
            from: state.commit.clone(),
            to: desired.commit.clone(),
            actions: plan.actions,
            done: 0,
            prepared: false,
            handovers: Vec::new(),
            started_at: cutover::now(),
        };
        run_cutover(name, context, desired, applied.as_deref(), progress)?;
    }
}

fn show_applied(name: &str, context: &Context, state: &TopologyState) {
    context.store.topology(name, |t| {
        t.commit = state.commit.clone();
        t.phase = Phase::Idle;
        t.cutover = None;
        t.last_error = None;
    });
    context.store.clear_error_of(name);
    context
        .store
        .metrics
        .in_cutover
        .get_or_create(&TopologyLabel {
            topology: name.to_owned(),
        })
        .set(0);
}

fn run_cutover(
    name: &str,
    context: &Arc<Context>,
    to: &Revision,
    from: Option<&Revision>,
    progress: CutoverProgress,
) -> Result<(), Error> {
    // The topology's cluster: the new revision's, or the old one's when it is removed.
    let (revision, topology) = match (
        to.topology(name),
        from.and_then(|f| f.topology(name).map(|t| (f, t))),
    ) {
        (Some(t), _) => (to, t),
        (None, Some((f, t))) => (f, t),
        (None, None) => {
            // Nothing of it in either revision: nothing to run, only the commit to record.
            context.state.save_topology(
                name,
                &TopologyState {
                    commit: Some(progress.to),
                    cutover: None,
                },
            )?;
            return Ok(());
        }
    };
    let bootstrap = context.bootstrap(revision, topology)?;
    let admin = context.admin(&bootstrap)?;
    let workdirs = to
        .topology(name)
        .map(|t| to.workdirs(t))
        .unwrap_or_default();
    let label = TopologyLabel {
        topology: name.to_owned(),
    };
    let metrics = &context.store.metrics;
    let started = std::time::Instant::now();
    let on_event = |event: Event<'_>| match event {
        Event::Started { to, actions, .. } => {
            metrics.in_cutover.get_or_create(&label).set(1);
            context.store.topology(name, |t| {
                t.phase = Phase::Cutover;
                t.cutover = Some(CutoverStatus {
                    to: to.to_owned(),
                    done: 0,
                    actions,
                    current: None,
                });
            });
        }
        Event::Action { index, action } => {
            metrics.cutover_actions.get_or_create(&label).inc();
            context.store.topology(name, |t| {
                if let Some(c) = &mut t.cutover {
                    c.done = index;
                    c.current = Some(cutover::describe(action));
                }
            });
        }
        Event::Draining { group, lag } => {
            tracing::debug!(topology = name, group, lag, "draining");
        }
        Event::Finished { to } => {
            metrics.in_cutover.get_or_create(&label).set(0);
            metrics
                .cutover_seconds
                .get_or_create(&label)
                .observe(started.elapsed().as_secs_f64());
            metrics
                .cutovers
                .get_or_create(&status::OutcomeLabels {
                    topology: name.to_owned(),
                    outcome: "applied".into(),
                })
                .inc();
            context.store.topology(name, |t| {
                t.phase = Phase::Idle;
                t.commit = Some(to.to_owned());
                t.cutover = None;
                t.last_error = None;
            });
            tracing::info!(topology = name, commit = to, "cutover finished");
        }
    };
    let stopping = || context.is_stopping();
    let engine = Engine {
        topology: name,
        bootstrap: &bootstrap,
        admin: admin.as_ref(),
        runtime: context.runtime.as_ref(),
        state: &context.state,
        config: &context.config.cutover,
        workdirs: &workdirs,
        on_event: &on_event,
        stopping: &stopping,
    };
    engine.run(progress)?;
    Ok(())
}

/// Refreshes per-step state and lag for status and metrics.
fn observe_loop(context: &Arc<Context>) {
    while !context.is_stopping() {
        observe(context);
        // Sleep in short slices so a shutdown is not held up.
        let deadline = std::time::Instant::now() + context.config.observe_interval;
        while std::time::Instant::now() < deadline && !context.is_stopping() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn observe(context: &Context) {
    let running: BTreeMap<String, crate::runtime::ProcessorStatus> = context
        .runtime
        .processors()
        .into_iter()
        .map(|p| (p.group.clone(), p))
        .collect();
    let Ok(states) = context.state.topologies() else {
        return;
    };
    for (name, state) in states {
        // Show the graph being moved to during a cutover, else the applied one.
        let commit = state
            .cutover
            .as_ref()
            .map(|c| c.to.clone())
            .or(state.commit.clone());
        let Some(revision) = commit.and_then(|c| context.revisions.load(&c).ok()) else {
            continue;
        };
        let Some(topology) = revision.topology(&name) else {
            continue;
        };
        let admin = context
            .bootstrap(&revision, topology)
            .and_then(|b| context.admin(&b))
            .ok();
        let mut steps = Vec::new();
        for (id, step) in topology.steps() {
            let (state, lag) = match step.kind() {
                Kind::Source | Kind::Sink => ("external".to_owned(), None),
                Kind::Processor => {
                    let group = topology.internal_name(id);
                    let state = match running.get(&group) {
                        None => "stopped",
                        Some(p) if p.running >= p.replicas => "running",
                        Some(_) => "starting",
                    };
                    let inputs = topology.input_topics(id);
                    let progress = admin.as_ref().and_then(|a| {
                        a.progress(&group, &inputs)
                            .map_err(|error| tracing::debug!(%error, group, "lag unknown"))
                            .ok()
                    });
                    if let (Some(admin), Some(progress), true) =
                        (&admin, progress, running.contains_key(&group))
                    {
                        watch_progress(context, admin.as_ref(), &group, &inputs, progress);
                    }
                    let lag = progress.map(|p| p.lag);
                    let labels = StepLabels {
                        topology: name.clone(),
                        step: step.name.clone(),
                    };
                    if let Some(lag) = lag {
                        context.store.metrics.lag.get_or_create(&labels).set(lag);
                    }
                    context
                        .store
                        .metrics
                        .instances
                        .get_or_create(&labels)
                        .set(running.get(&group).map_or(0, |p| i64::from(p.running)));
                    (state.to_owned(), lag)
                }
            };
            steps.push(StepStatus {
                name: step.name.clone(),
                kind: format!("{:?}", step.kind()).to_lowercase(),
                identity: (step.kind() == Kind::Processor).then(|| step.identity.to_string()),
                state,
                lag,
            });
        }
        context.store.topology(&name, |t| t.steps = steps);
    }
}

/// Restarts a running group that has lag but whose committed offsets stopped moving.
fn watch_progress(
    context: &Context,
    admin: &dyn Admin,
    group: &str,
    inputs: &[String],
    progress: Progress,
) {
    let mut stalls = context
        .progress
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if progress.lag == 0 {
        stalls.remove(group);
        return;
    }
    let now = std::time::Instant::now();
    let stall = stalls
        .entry(group.to_owned())
        .or_insert_with(|| Stall::at(progress.position, now));
    if stall.position != progress.position {
        *stall = Stall::at(progress.position, now);
    } else if now.duration_since(stall.since) >= context.config.stalled_after {
        // Behind transactional writers, a group that read everything still shows a lag: the
        // transaction markers after the last record. Such a group is idle, not stalled.
        let drained = admin
            .drained(group, inputs)
            .map_err(|error| tracing::debug!(%error, group, "cannot look past the lag"))
            .unwrap_or(false);
        if drained {
            *stall = Stall::at(progress.position, now);
            return;
        }
        stall.restarts += 1;
        if stall.restarts <= FUTILE_RESTARTS {
            tracing::warn!(group, lag = progress.lag, stalled_for = ?now.duration_since(stall.since), "processor makes no progress; restarting it");
        } else {
            tracing::error!(
                group,
                lag = progress.lag,
                restarts = stall.restarts,
                hint = "on tansu 0.6, restart the broker (README, \"tansu\")",
                "processor still makes no progress after restarts, so its consumer group may not form; restarting it again"
            );
        }
        if let Err(error) = context.runtime.restart(group) {
            tracing::error!(%error, group, "cannot restart a stalled processor");
        }
        stall.since = now;
    }
}

/// After this many restarts without progress, the stall is reported as an error.
const FUTILE_RESTARTS: u32 = 3;

/// A running group with lag whose committed offsets do not move.
struct Stall {
    position: i64,
    since: std::time::Instant,
    restarts: u32,
}

impl Stall {
    fn at(position: i64, since: std::time::Instant) -> Stall {
        Stall {
            position,
            since,
            restarts: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::kafka::Result as KafkaResult;
    use crate::runtime::{ProcessorSpec, ProcessorStatus, Result as RuntimeResult};
    use crate::state::PartitionOffset;

    /// Counts restarts; nothing else is called by the watchdog.
    #[derive(Default)]
    struct Restarts(AtomicU32);

    impl Runtime for Restarts {
        fn start(&self, _: &ProcessorSpec) -> RuntimeResult<()> {
            unreachable!("the watchdog only restarts")
        }
        fn stop(&self, _: &str) -> RuntimeResult<()> {
            unreachable!("the watchdog only restarts")
        }
        fn restart(&self, _: &str) -> RuntimeResult<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn scale(&self, _: &str, _: u32) -> RuntimeResult<()> {
            unreachable!("the watchdog only restarts")
        }
        fn processors(&self) -> Vec<ProcessorStatus> {
            Vec::new()
        }
    }

    /// A group whose lag never moves: records it cannot read, or only transaction markers.
    struct Behind {
        only_markers: bool,
    }

    impl Admin for Behind {
        fn create_topic(&self, _: &str, _: u32) -> KafkaResult<()> {
            unreachable!()
        }
        fn delete_topic(&self, _: &str) -> KafkaResult<()> {
            unreachable!()
        }
        fn partitions(&self, _: &str) -> KafkaResult<i32> {
            unreachable!()
        }
        fn watermarks(&self, _: &str) -> KafkaResult<Vec<(i64, i64)>> {
            unreachable!()
        }
        fn committed(&self, _: &str, _: &[String]) -> KafkaResult<Vec<PartitionOffset>> {
            unreachable!()
        }
        fn commit(&self, _: &str, _: &[PartitionOffset]) -> KafkaResult<()> {
            unreachable!()
        }
        fn drained(&self, _: &str, _: &[String]) -> KafkaResult<bool> {
            Ok(self.only_markers)
        }
    }

    #[test]
    fn a_group_behind_only_transaction_markers_is_idle_not_stalled() {
        let state = tempfile::tempdir().unwrap();
        let mut config = DaemonConfig::new("unused", state.path().to_owned());
        config.stalled_after = Duration::ZERO;
        let runtime = Arc::new(Restarts::default());
        let context = Context::new(config, runtime.clone()).unwrap();
        let inputs = ["in".to_owned()];
        let unmoved = Progress {
            lag: 1,
            position: 10,
        };

        let idle = Behind { only_markers: true };
        for _ in 0..3 {
            watch_progress(&context, &idle, "g", &inputs, unmoved);
        }
        assert_eq!(runtime.0.load(Ordering::SeqCst), 0);

        let stalled = Behind {
            only_markers: false,
        };
        for _ in 0..2 {
            watch_progress(&context, &stalled, "g", &inputs, unmoved);
        }
        assert_eq!(runtime.0.load(Ordering::SeqCst), 2);
    }
}
