//! What runs, observed every few seconds: per step its state, instances and lag, for status
//! and metrics; and the stall watchdog, which restarts a processor whose group has lag but
//! commits nothing for longer than any record may take.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::facts::Fact;
use super::status::{LifeStatus, StepLabels, StepState, StepStatus};
use super::{AdminUse, Context};
use crate::graph::{Kind, StepKind};
use crate::kafka::{Admin, Progress};
use crate::plan::{Deployment, Life, moves};
use crate::runtime::ProcessorStatus;
use crate::store::TopologyRecord;

/// Per running group with lag: how far it got and since when it has not moved.
pub(super) struct Watchdog {
    /// How long a group with lag may commit nothing ([`super::DaemonConfig::stall_threshold`]).
    threshold: Duration,
    stalls: Mutex<BTreeMap<String, Stall>>,
    /// Per group, where it stood when last read (what status shows until it is read again).
    last_read: Mutex<BTreeMap<String, Progress>>,
}

/// Refreshes per-step state and lag for status and metrics.
pub(super) fn observe_loop(context: &Arc<Context>) {
    let watchdog = Watchdog::new(context.config.stall_threshold());
    let mut resume = None;
    while !context.is_stopping() {
        {
            let _busy = context.threads.busy("a look at what runs");
            observe(context, &watchdog, &mut resume);
        }
        // Sleep in short slices so a shutdown is not held up.
        let deadline = Instant::now() + context.config.observe_interval;
        while Instant::now() < deadline && !context.is_stopping() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `resume`: the topology whose groups the last look had no time left to read.
fn observe(context: &Context, watchdog: &Watchdog, resume: &mut Option<String>) {
    // Only the replica that may act repairs (the others would fight it); the runtime reads
    // what runs anew in each lease term before it changes anything (what it knew may be
    // another replica's past).
    if context.records.may_act()
        && let Err(error) = context.runtime.repair()
    {
        tracing::warn!(%error, "cannot repair the runtime's processors");
    }
    let running: BTreeMap<String, ProcessorStatus> = match context.runtime.processors() {
        Ok(processors) => processors
            .into_iter()
            .map(|p| (p.group.clone(), p))
            .collect(),
        Err(error) => {
            tracing::warn!(%error, "cannot list the running processors");
            return;
        }
    };
    context
        .rates
        .scrape(context.runtime.as_ref(), &running, &context.store.metrics);
    let Ok(mut records) = context.records.topologies() else {
        return;
    };
    // A preview environment torn down leaves status (its record stays, so that one started
    // again gets new names).
    let gone: Vec<String> = records
        .iter()
        .filter(|(name, record)| {
            crate::plan::preview::is_preview(name) && record.as_ref().is_ok_and(|r| r.is_retired())
        })
        .map(|(name, _)| name.clone())
        .collect();
    // The look's findings, written to the status in one write at its end: one event of the
    // status stream per look, not one per topology read.
    let mut facts = Vec::new();
    for name in gone {
        records.remove(&name);
        // One the previews thread starts again already says what it previews.
        let started_again = context
            .store
            .read()
            .topologies
            .iter()
            .any(|t| t.name == name && t.preview_of.is_some());
        if !started_again {
            facts.push(Fact::Removed(name));
        }
    }
    // Lag is read group by group (committed offsets and watermarks): at 1,000 topologies of
    // 20 steps a full round takes minutes (`bench/results/kafka-lag.md`), and repair and
    // status must not wait for it, so a look reads for a while and the next goes on.
    let reads_until = Instant::now() + context.config.lag_reads_per_look;
    let first = resume.take();
    let from_first = |name: &String| first.as_ref().is_none_or(|f| name >= f);
    let ordered = records
        .iter()
        .filter(|(name, _)| from_first(name))
        .chain(records.iter().filter(|(name, _)| !from_first(name)));
    for (index, (name, record)) in ordered.enumerate() {
        match record {
            Ok(record) => {
                // The look's first topology is read whole, however long it takes.
                let until = (index > 0).then_some(reads_until);
                let read = observe_topology(
                    context,
                    (watchdog, &mut facts),
                    (name, record),
                    &running,
                    until,
                );
                if !read && resume.is_none() {
                    *resume = Some(name.clone());
                }
            }
            Err(error) => facts.push(Fact::RecordUnreadable {
                topology: name.clone(),
                message: error.to_string(),
            }),
        }
    }
    context.store.apply_all(facts);
    watchdog.forget_all_but(records.values().flatten());
    if let Some(sink) = &context.status_sink
        && context.records.may_act()
    {
        let (topologies, error) = {
            let status = context.store.read();
            let error = status.last_error.clone().filter(|e| e.topology.is_none());
            (status.topologies.clone(), error)
        };
        for topology in &topologies {
            sink.publish(topology, error.as_ref());
        }
    }
}

/// Whether every group of the topology was read afresh (before `reads_until`, if any). What
/// it finds goes to `facts`, for the look's one write.
fn observe_topology(
    context: &Context,
    (watchdog, facts): (&Watchdog, &mut Vec<Fact>),
    (name, record): (&str, &TopologyRecord),
    running: &BTreeMap<String, ProcessorStatus>,
    reads_until: Option<Instant>,
) -> bool {
    let admin = record
        .bootstrap
        .as_deref()
        .and_then(|b| context.admin(AdminUse::Observe, b).ok());
    let deployment = &record.deployment;
    let revision = shown_revision(context, name, record);
    let topology = revision.as_ref().and_then(|r| r.topology(name));
    // Where every life stands, retiring ones too: the watchdog looks after all of them (a
    // drain waits for a retiring one).
    let mut progress: BTreeMap<&str, Progress> = BTreeMap::new();
    let mut read_all = true;
    if let Some(admin) = &admin {
        for life in &deployment.lives {
            if reads_until.is_some_and(|until| Instant::now() >= until) {
                read_all = false;
                if let Some(last) = watchdog.last_read(life.group()) {
                    progress.insert(life.group(), last);
                }
                continue;
            }
            let inputs: Vec<String> = life.inputs().map(str::to_owned).collect();
            match admin.progress(life.group(), &inputs) {
                Ok(p) => {
                    watchdog.read(life.group(), p);
                    // A warm life holds its partitions unread until its hand-off: its lag is
                    // the wait, not a stall.
                    if running.contains_key(life.group()) && !life.held {
                        watchdog.watch(context, admin.as_ref(), life.group(), &inputs, p);
                    }
                    progress.insert(life.group(), p);
                }
                Err(error) => tracing::debug!(%error, group = life.group(), "lag unknown"),
            }
        }
    }
    let mut steps = Vec::new();
    let mut listed: Vec<Listed> = Vec::new();
    match topology {
        Some(topology) => {
            for (id, step) in topology.steps() {
                let processor = step.kind() == Kind::Processor;
                let (shown, retiring) = if processor {
                    lives_of(
                        deployment,
                        &step.name,
                        step.identity,
                        record.moving.is_some(),
                    )
                } else {
                    (None, None)
                };
                let (topic, transform, scale) = match &step.kind {
                    StepKind::Source { topic } | StepKind::Sink { topic } => {
                        (Some(topic.clone()), None, None)
                    }
                    StepKind::Processor {
                        transform, scale, ..
                    } => (None, Some(transform.kind().to_owned()), Some(*scale)),
                };
                listed.push(Listed {
                    step: step.name.clone(),
                    kind: step.kind(),
                    identity: processor.then(|| step.identity.to_string()),
                    inputs: topology
                        .inputs(id)
                        .iter()
                        .map(|&i| topology.step(i).name.clone())
                        .collect(),
                    file: Some(step.file.clone()),
                    topic,
                    transform,
                    // The running life's group is its internal topic too, when it writes one.
                    internal_topic: shown
                        .filter(|_| topology.feeds_processor(id))
                        .map(|l| l.group().to_owned()),
                    dead_letter_topic: processor.then(|| topology.dlq_topic(id)),
                    scale,
                    life: shown,
                    retiring,
                });
            }
        }
        // The commit cannot be loaded: show what runs.
        None => {
            for life in &deployment.lives {
                listed.push(Listed {
                    step: life.step().to_owned(),
                    kind: Kind::Processor,
                    identity: Some(life.identity().to_string()),
                    life: Some(life),
                    inputs: Vec::new(),
                    file: None,
                    topic: None,
                    transform: None,
                    internal_topic: None,
                    dead_letter_topic: None,
                    scale: None,
                    // Every life is listed as it is.
                    retiring: None,
                });
            }
        }
    }
    for listed in listed {
        let Listed {
            step, kind, life, ..
        } = &listed;
        let retiring = listed
            .retiring
            .map(|life| life_status(life, running, &progress));
        let (state, lag, replicas) = match (kind, life) {
            (Kind::Source | Kind::Sink, _) => (StepState::External, None, None),
            // During a move: its new life has yet to start.
            (Kind::Processor, None) if record.moving.is_some() => {
                (StepState::Pending, None, Some(0))
            }
            (Kind::Processor, None) => (StepState::Stopped, None, Some(0)),
            (Kind::Processor, Some(life)) => {
                let LifeStatus {
                    state,
                    lag,
                    replicas,
                    ..
                } = life_status(life, running, &progress);
                (state, lag, Some(replicas))
            }
        };
        if *kind == Kind::Processor {
            // The step's metrics follow whichever of its lives runs: the old one until the
            // new one has started.
            let metered = life
                .map(|l| life_status(l, running, &progress))
                .or_else(|| retiring.clone());
            if let Some(metered) = metered {
                let labels = StepLabels {
                    topology: name.to_owned(),
                    step: step.clone(),
                };
                if let Some(lag) = metered.lag {
                    context.store.metrics.lag.get_or_create(&labels).set(lag);
                }
                context
                    .store
                    .metrics
                    .instances
                    .get_or_create(&labels)
                    .set(i64::from(metered.replicas));
            }
        }
        let group = life.map(|l| l.group().to_owned());
        let records_per_second = group.as_deref().and_then(|g| context.rates.per_second(g));
        let keeps_state = life.and_then(|l| {
            let run = l.start.state.as_ref()?;
            let gauges = context.rates.state_of(l.group());
            Some(super::status::StateStatus {
                changelog: run.topic.clone(),
                started_from: match run.carry {
                    crate::plan::Carry::Restore => "restore",
                    crate::plan::Carry::Rebuild { .. } => "rebuild",
                    crate::plan::Carry::Earliest => "earliest",
                    crate::plan::Carry::Empty => "empty",
                    crate::plan::Carry::Cannot { .. } => "cannot",
                }
                .to_owned(),
                groups: gauges.map(|g| g.groups.max(0.0) as u64),
                // 0: no record counted yet.
                watermark_ms: gauges
                    .and_then(|g| g.stream_time)
                    .filter(|t| *t > 0.0)
                    .map(|t| t as i64),
                restoring_entries: gauges.map(|g| g.restoring.max(0.0) as u64),
            })
        });
        let keeps_table = life.and_then(|l| {
            let topic = l.start.table.clone()?;
            let gauges = context.rates.table_of(l.group());
            Some(super::status::TableStatus {
                topic,
                rows: gauges.map(|g| g.rows.max(0.0) as u64),
                bytes: gauges.map(|g| g.bytes.max(0.0) as u64),
                loading_records: gauges.map(|g| g.loading.max(0.0) as u64),
            })
        });
        steps.push(StepStatus {
            name: listed.step,
            kind: listed.kind,
            identity: listed.identity,
            group,
            state,
            lag,
            inputs: listed.inputs,
            file: listed.file,
            topic: listed.topic,
            transform: listed.transform,
            internal_topic: listed.internal_topic,
            dead_letter_topic: listed.dead_letter_topic,
            replicas,
            scale: listed.scale.map(|s| super::status::ScaleStatus {
                min: s.min,
                max: s.max,
            }),
            records_per_second,
            keeps_state,
            keeps_table,
            retiring,
        });
    }
    if !context.records.may_act() {
        facts.push(Fact::Recorded {
            topology: name.to_owned(),
            commit: record.commit.clone(),
            moving: record.moving.clone(),
        });
    }
    facts.push(Fact::Observed {
        topology: name.to_owned(),
        steps,
    });
    read_all
}

/// A step as status lists it, before its state is looked up.
struct Listed<'d> {
    step: String,
    kind: Kind,
    identity: Option<String>,
    /// A processor's life that is shown (`None`: none deployed).
    life: Option<&'d Life>,
    inputs: Vec<String>,
    file: Option<String>,
    topic: Option<String>,
    transform: Option<String>,
    internal_topic: Option<String>,
    dead_letter_topic: Option<String>,
    scale: Option<crate::spec::Scale>,
    retiring: Option<&'d Life>,
}

/// Where a life stands: whether its instances are up, its lag, how many run.
fn life_status(
    life: &Life,
    running: &BTreeMap<String, ProcessorStatus>,
    progress: &BTreeMap<&str, Progress>,
) -> LifeStatus {
    let group = life.group();
    let state = match running.get(group) {
        None => StepState::Stopped,
        Some(p) if p.running >= p.replicas => StepState::Running,
        Some(_) => StepState::Starting,
    };
    LifeStatus {
        group: group.to_owned(),
        identity: life.identity().to_string(),
        state,
        replicas: running.get(group).map_or(0, |p| p.running),
        lag: progress.get(group).map(|p| p.lag),
    }
}

/// The revision whose graph of `name` to show: the one being moved to during a move, else
/// the branch's newest when what runs matches it (the usual case, and the revision every
/// topology shares), else the one the topology last moved to. Topologies that commits left
/// alone last moved at many different commits: loading each of those would validate and check
/// out a commit per topology.
fn shown_revision(
    context: &Context,
    name: &str,
    record: &TopologyRecord,
) -> Option<Arc<super::revisions::Revision>> {
    let load = |commit: &str| context.revisions.load(commit).ok();
    if let Some(moving) = &record.moving {
        return load(&moving.to);
    }
    let newest = context.store.read().commit.clone();
    newest
        .and_then(|commit| load(&commit))
        .filter(|revision| {
            revision.topology(name).is_some()
                && moves::remaining(name, &record.deployment, revision.topology(name)).is_empty()
        })
        .or_else(|| record.commit.as_deref().and_then(load))
}

/// The lives of `step`: the one shown and the first other one, which the move retires.
/// During a move the one shown is the life of `identity` (none until it starts: an ordered
/// cutover starts it only once the old one has stopped); else the life of `identity` if there
/// is one, else the first.
fn lives_of<'d>(
    deployment: &'d Deployment,
    step: &str,
    identity: crate::graph::Identity,
    moving: bool,
) -> (Option<&'d Life>, Option<&'d Life>) {
    let lives: Vec<&Life> = deployment
        .lives
        .iter()
        .filter(|l| l.step() == step)
        .collect();
    let own = lives.iter().find(|l| l.identity() == identity).copied();
    let shown = if moving {
        own
    } else {
        own.or(lives.first().copied())
    };
    let retiring = lives
        .iter()
        .find(|l| shown.is_none_or(|s| s.group() != l.group()))
        .copied();
    (shown, retiring)
}

impl Watchdog {
    pub(super) fn new(threshold: Duration) -> Watchdog {
        Watchdog {
            threshold,
            stalls: Mutex::new(BTreeMap::new()),
            last_read: Mutex::new(BTreeMap::new()),
        }
    }

    fn read(&self, group: &str, progress: Progress) {
        self.last_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(group.to_owned(), progress);
    }

    fn last_read(&self, group: &str) -> Option<Progress> {
        self.last_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(group)
            .copied()
    }

    /// Forgets the groups of lives no record has any more.
    fn forget_all_but<'r>(&self, records: impl Iterator<Item = &'r TopologyRecord>) {
        let groups: std::collections::BTreeSet<&str> = records
            .flat_map(|r| r.deployment.lives.iter().map(|l| l.group()))
            .collect();
        self.last_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|group, _| groups.contains(group.as_str()));
        self.stalls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|group, _| groups.contains(group.as_str()));
    }

    /// Restarts a running group that has lag but whose committed offsets stopped moving.
    pub(super) fn watch(
        &self,
        context: &Context,
        admin: &dyn Admin,
        group: &str,
        inputs: &[String],
        progress: Progress,
    ) {
        let mut stalls = self.stalls.lock().unwrap_or_else(PoisonError::into_inner);
        if progress.lag == 0 {
            stalls.remove(group);
            return;
        }
        let now = Instant::now();
        let stall = stalls
            .entry(group.to_owned())
            .or_insert_with(|| Stall::at(progress.position, now));
        if stall.position != progress.position {
            *stall = Stall::at(progress.position, now);
        } else if now.duration_since(stall.since) >= self.threshold {
            // Behind transactional writers, a group that read everything still shows a lag:
            // the transaction markers after the last record. Such a group is idle, not stalled.
            let drained = admin
                .drained(group, inputs)
                .map_err(|error| tracing::debug!(%error, group, "cannot look past the lag"))
                .unwrap_or(false);
            if drained {
                *stall = Stall::at(progress.position, now);
                return;
            }
            stall.restarts += 1;
            let stalled_for = now.duration_since(stall.since);
            if stall.restarts <= FUTILE_RESTARTS {
                tracing::warn!(
                    group,
                    lag = progress.lag,
                    ?stalled_for,
                    reason =
                        "its group has lag but committed nothing for longer than a record may take",
                    "processor makes no progress; restarting it"
                );
            } else {
                tracing::error!(
                    group,
                    lag = progress.lag,
                    restarts = stall.restarts,
                    hint = "on tansu 0.6, restart the broker (docs/tansu.md)",
                    "processor still makes no progress after restarts, so its consumer group may not form; restarting it again"
                );
            }
            if let Err(error) = context.runtime.restart(group) {
                tracing::error!(%error, group, "cannot restart a stalled processor");
            }
            stall.since = now;
        }
    }
}

/// After this many restarts without progress, the stall is reported as an error.
const FUTILE_RESTARTS: u32 = 3;

/// A running group with lag whose committed offsets do not move.
struct Stall {
    position: i64,
    since: Instant,
    restarts: u32,
}

impl Stall {
    fn at(position: i64, since: Instant) -> Stall {
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

    use super::*;
    use crate::daemon::DaemonConfig;
    use crate::kafka::Result as KafkaResult;
    use crate::plan::PartitionOffset;
    use crate::runtime::{ProcessorSpec, Result as RuntimeResult, Runtime};

    /// Runs every life of `groups` and records which it restarts; nothing else is called by
    /// the watchdog.
    #[derive(Default)]
    struct Restarts {
        groups: Vec<String>,
        restarted: Mutex<Vec<String>>,
    }

    impl Runtime for Restarts {
        fn start(&self, _: &ProcessorSpec) -> RuntimeResult<()> {
            unreachable!("the watchdog only restarts")
        }
        fn stop(&self, _: &str) -> RuntimeResult<()> {
            unreachable!("the watchdog only restarts")
        }
        fn restart(&self, group: &str) -> RuntimeResult<()> {
            self.restarted.lock().unwrap().push(group.to_owned());
            Ok(())
        }
        fn update(
            &self,
            _: &str,
            _: &crate::spec::Scale,
            _: Option<&crate::spec::Resources>,
        ) -> RuntimeResult<()> {
            unreachable!("the watchdog only restarts")
        }
        fn processors(&self) -> RuntimeResult<Vec<ProcessorStatus>> {
            Ok(self
                .groups
                .iter()
                .map(|group| ProcessorStatus {
                    topology: "t".into(),
                    step: "step".into(),
                    identity: String::new(),
                    group: group.clone(),
                    replicas: 1,
                    running: 1,
                    restarts: 0,
                    commit: None,
                })
                .collect())
        }
    }

    /// A warm life holds its partitions unread until its hand-off, its lag never moving: the
    /// watchdog leaves it alone, and restarts the running life beside it that does the same.
    #[test]
    fn a_warm_life_waiting_for_its_hand_off_is_not_stalled() {
        let state = tempfile::tempdir().unwrap();
        let config = DaemonConfig::new("unused", state.path().to_owned());
        let mut record = deployed("t");
        let mut warm = Deployment::of(&graph("t", ".a")).lives.remove(0);
        warm.held = true;
        record.deployment.lives.push(warm.clone());
        let old = record.deployment.lives[0].group().to_owned();
        let runtime = Arc::new(Restarts {
            groups: vec![old.clone(), warm.group().to_owned()],
            restarted: Mutex::default(),
        });
        let connect: Box<crate::daemon::Connect> =
            Box::new(|_| Ok(Arc::new(Lags::default()) as Arc<dyn Admin>));
        let context = Context::with_admin(config, runtime.clone(), connect).unwrap();
        context.records.save("t", &record).unwrap();
        let watchdog = Watchdog::new(Duration::ZERO);
        for _ in 0..3 {
            observe(&context, &watchdog, &mut None);
        }
        let restarted = runtime.restarted.lock().unwrap().clone();
        assert!(restarted.contains(&old), "{restarted:?}");
        assert!(
            !restarted.iter().any(|g| g == warm.group()),
            "the warm life was restarted: {restarted:?}"
        );
    }

    /// A group whose lag never moves: records it cannot read, or only transaction markers.
    struct Behind {
        only_markers: bool,
    }

    impl Admin for Behind {
        fn create_topic(
            &self,
            _: &str,
            _: u32,
            _: Option<u32>,
            _: &std::collections::BTreeMap<String, String>,
        ) -> KafkaResult<()> {
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
        fn delete_group(&self, _: &str) -> KafkaResult<()> {
            unreachable!()
        }
        fn drained(&self, _: &str, _: &[String]) -> KafkaResult<bool> {
            Ok(self.only_markers)
        }
        fn supports_transactions(&self) -> KafkaResult<bool> {
            unreachable!()
        }
    }

    #[test]
    fn a_record_still_in_hand_is_never_taken_for_a_stall() {
        let mut config = DaemonConfig::new("unused", std::path::PathBuf::from("unused"));
        // 60 s per record plus what the processor may add: a 60 s stall timeout is too short.
        assert_eq!(config.stall_threshold(), Duration::from_secs(87));
        config.stalled_after = Duration::from_secs(300);
        assert_eq!(config.stall_threshold(), Duration::from_secs(300));
        config.record_timeout = Duration::from_secs(5);
        config.stalled_after = Duration::from_secs(15);
        assert_eq!(config.stall_threshold(), Duration::from_secs(32));
    }

    #[test]
    fn a_group_behind_only_transaction_markers_is_idle_not_stalled() {
        let state = tempfile::tempdir().unwrap();
        let config = DaemonConfig::new("unused", state.path().to_owned());
        let runtime = Arc::new(Restarts::default());
        let context = Context::new(config, runtime.clone()).unwrap();
        let watchdog = Watchdog::new(Duration::ZERO);
        let inputs = ["in".to_owned()];
        let unmoved = Progress {
            lag: 1,
            position: 10,
        };

        let idle = Behind { only_markers: true };
        for _ in 0..3 {
            watchdog.watch(&context, &idle, "g", &inputs, unmoved);
        }
        assert_eq!(runtime.restarted.lock().unwrap().len(), 0);

        let stalled = Behind {
            only_markers: false,
        };
        for _ in 0..2 {
            watchdog.watch(&context, &stalled, "g", &inputs, unmoved);
        }
        assert_eq!(runtime.restarted.lock().unwrap().len(), 2);
    }

    /// Every group 5 records behind; records which groups' offsets were read.
    #[derive(Default)]
    struct Lags {
        read: Mutex<Vec<String>>,
    }

    impl Admin for Lags {
        fn create_topic(
            &self,
            _: &str,
            _: u32,
            _: Option<u32>,
            _: &std::collections::BTreeMap<String, String>,
        ) -> KafkaResult<()> {
            unreachable!()
        }
        fn delete_topic(&self, _: &str) -> KafkaResult<()> {
            unreachable!()
        }
        fn partitions(&self, _: &str) -> KafkaResult<i32> {
            unreachable!()
        }
        fn watermarks(&self, _: &str) -> KafkaResult<Vec<(i64, i64)>> {
            Ok(vec![(0, 5)])
        }
        fn committed(&self, group: &str, _: &[String]) -> KafkaResult<Vec<PartitionOffset>> {
            self.read.lock().unwrap().push(group.to_owned());
            Ok(Vec::new())
        }
        fn commit(&self, _: &str, _: &[PartitionOffset]) -> KafkaResult<()> {
            unreachable!()
        }
        fn delete_group(&self, _: &str) -> KafkaResult<()> {
            unreachable!()
        }
        fn supports_transactions(&self) -> KafkaResult<bool> {
            unreachable!()
        }
    }

    /// `in` → `step` (running `jq`) → `out`.
    fn graph(topology: &str, jq: &str) -> crate::graph::Topology {
        let step = format!("kind: processor\ninput: in\njq: '{jq}'\n");
        let files: Vec<crate::spec::SourceFile> = [
            ("in", "kind: source\ntopic: in\n"),
            ("step", step.as_str()),
            ("out", "kind: sink\ninput: step\ntopic: out\n"),
        ]
        .iter()
        .map(|(name, yaml)| crate::spec::SourceFile {
            path: format!("topologies/{topology}/{name}.yaml"),
            content: crate::spec::FileContent::Bytes(yaml.as_bytes().to_vec()),
        })
        .collect();
        crate::validate(&files).topologies.unwrap().remove(0)
    }

    fn deployed(topology: &str) -> TopologyRecord {
        TopologyRecord {
            commit: Some("c1".into()),
            bootstrap: Some("fake:9092".into()),
            deployment: Deployment::of(&graph(topology, ".")),
            ..TopologyRecord::default()
        }
    }

    #[test]
    fn a_replaced_step_shows_the_life_it_retires_while_that_life_is_deployed() {
        let state = tempfile::tempdir().unwrap();
        let config = DaemonConfig::new("unused", state.path().to_owned());
        let connect: Box<crate::daemon::Connect> =
            Box::new(|_| Ok(Arc::new(Lags::default()) as Arc<dyn Admin>));
        let context = Context::with_admin(config, Arc::new(Restarts::default()), connect).unwrap();
        let new = graph("t", ".a");
        context.revisions.insert(crate::daemon::Revision {
            commit: "c2".into(),
            topologies: vec![new.clone()],
            clusters: BTreeMap::new(),
            checkout: state.path().join("c2"),
            masked_fields: Vec::new(),
        });
        let old_life = deployed("t").deployment.lives.remove(0);
        let new_life = Deployment::of(&new).lives.remove(0);
        assert_ne!(old_life.group(), new_life.group());
        let mut record = TopologyRecord {
            moving: Some(crate::store::Move {
                from: Some("c1".into()),
                to: "c2".into(),
                started_at: 0,
                done: 1,
                handovers: Vec::new(),
            }),
            ..deployed("t")
        };
        record.deployment.lives = vec![old_life.clone(), new_life.clone()];
        let watchdog = Watchdog::new(Duration::from_secs(3600));
        let step_shown = |record: &TopologyRecord| {
            context.records.save("t", record).unwrap();
            observe(&context, &watchdog, &mut None);
            let status = context.store.read();
            let steps = &status.topologies[0].steps;
            let step = steps.iter().find(|s| s.name == "step").unwrap();
            let json = serde_json::to_value(step).unwrap();
            (step.group.clone(), step.retiring.clone(), json)
        };

        // An ordered cutover: the new life starts only once the old one has stopped. Until
        // then the step's new life is pending and the old one shows as retiring, not as the
        // step's (it is not of the identity the step now has).
        record.deployment.lives = vec![old_life.clone()];
        let (group, retiring, json) = step_shown(&record);
        assert_eq!(group, None, "no life of the new identity yet: {json}");
        assert_eq!(json["state"], "pending");
        assert_eq!(retiring.map(|r| r.group), Some(old_life.group().to_owned()));

        record.deployment.lives = vec![old_life.clone(), new_life.clone()];
        let (group, retiring, json) = step_shown(&record);
        assert_eq!(json["retiring"]["group"], old_life.group());
        assert_eq!(
            group.as_deref(),
            Some(new_life.group()),
            "the new life is the step's"
        );
        assert_eq!(
            retiring,
            Some(LifeStatus {
                group: old_life.group().to_owned(),
                identity: old_life.identity().to_string(),
                state: StepState::Stopped,
                replicas: 0,
                lag: Some(5),
            }),
            "the old life shows beside it, read like the step's"
        );

        record
            .deployment
            .lives
            .retain(|l| l.group() == new_life.group());
        let (group, retiring, json) = step_shown(&record);
        assert_eq!(group.as_deref(), Some(new_life.group()));
        assert_eq!(retiring, None, "a stopped life is gone from the step");
        assert!(json.get("retiring").is_none(), "and from its JSON: {json}");
    }

    #[test]
    fn a_look_writes_the_status_once_whatever_the_number_of_topologies() {
        let state = tempfile::tempdir().unwrap();
        let config = DaemonConfig::new("unused", state.path().to_owned());
        let connect: Box<crate::daemon::Connect> =
            Box::new(|_| Ok(Arc::new(Lags::default()) as Arc<dyn Admin>));
        let context = Context::with_admin(config, Arc::new(Restarts::default()), connect).unwrap();
        let names: Vec<String> = (0..20).map(|n| format!("t{n:02}")).collect();
        for name in &names {
            context.records.save(name, &deployed(name)).unwrap();
        }
        // A record that cannot be read is a finding of the same look.
        std::fs::write(state.path().join("topologies/broken.json"), "{").unwrap();
        let writes = context.store.writes();
        let watchdog = Watchdog::new(Duration::from_secs(3600));
        for look in 1..=3u64 {
            let before = *writes.borrow();
            observe(&context, &watchdog, &mut None);
            assert_eq!(
                writes.borrow().wrapping_sub(before),
                1,
                "look {look}: one write for 21 topologies"
            );
        }
        let status = context.store.read();
        let shown: Vec<&str> = status.topologies.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(shown.len(), 21, "{shown:?}");
        assert!(
            status
                .topologies
                .iter()
                .filter(|t| t.name != "broken")
                .all(|t| t.steps.iter().any(|s| s.name == "step" && s.lag == Some(5))),
            "every topology read in the one write"
        );
        let broken = status.topologies.iter().find(|t| t.name == "broken");
        assert!(
            broken.is_some_and(|t| t.last_error.is_some()),
            "the unreadable record is shown as such: {broken:?}"
        );
    }

    #[test]
    fn a_look_out_of_time_for_lag_reads_shows_the_last_lag_and_the_next_look_goes_on() {
        let state = tempfile::tempdir().unwrap();
        let mut config = DaemonConfig::new("unused", state.path().to_owned());
        // No time for lag reads beyond each look's first topology.
        config.lag_reads_per_look = Duration::ZERO;
        let lags = Arc::new(Lags::default());
        let connect: Box<crate::daemon::Connect> = {
            let lags = lags.clone();
            Box::new(move |_| Ok(lags.clone() as Arc<dyn Admin>))
        };
        let context = Context::with_admin(config, Arc::new(Restarts::default()), connect).unwrap();
        for name in ["a", "b", "c"] {
            context.records.save(name, &deployed(name)).unwrap();
        }
        let groups: BTreeMap<String, String> = ["a", "b", "c"]
            .map(|t| {
                (
                    t.to_owned(),
                    deployed(t).deployment.lives[0].group().to_owned(),
                )
            })
            .into();
        let lag_of = |topology: &str| {
            let status = context.store.read();
            let t = status.topologies.iter().find(|t| t.name == topology);
            t.and_then(|t| t.steps.iter().find(|s| s.name == "step")?.lag)
        };
        let watchdog = Watchdog::new(Duration::from_secs(3600));
        let mut resume = None;
        let mut looks = Vec::new();
        for _ in 0..4 {
            lags.read.lock().unwrap().clear();
            observe(&context, &watchdog, &mut resume);
            looks.push(lags.read.lock().unwrap().clone());
            if looks.len() == 1 {
                assert_eq!(lag_of("a"), Some(5));
                assert_eq!(lag_of("b"), None, "not read yet");
            }
        }
        let expected: Vec<Vec<String>> = ["a", "b", "c", "a"]
            .iter()
            .map(|t| vec![groups[*t].clone()])
            .collect();
        assert_eq!(looks, expected, "one topology per look, in turn");
        assert_eq!(
            (lag_of("a"), lag_of("b"), lag_of("c")),
            (Some(5), Some(5), Some(5)),
            "the lag last read stays shown"
        );
    }
}
