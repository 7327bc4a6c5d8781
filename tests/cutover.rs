//! The cutover engine on an in-memory Kafka and runtime (one fake world), with crashes
//! injected at every Kafka call, every runtime call and every save of the state, each both
//! before the call takes effect and after it took effect but before the engine saw it; and
//! with single calls failing the same way while the daemon lives on (the engine retries them),
//! or a step's starts refused for a while (the other actions go on meanwhile).
//!
//! The fake checks, as it goes, what SPEC §4 promises of every record: per step and input
//! partition, each life starts exactly where the step's previous life stopped (no gap, no
//! overlap), two lives of one step never read one topic at once, a group's offsets are never
//! set while it runs, and no group or internal topic is ever used by two lives; at the end,
//! every sink holds each record of the source once. Every planned crash or failure must be
//! injected (the model records it). After a crash the next "daemon" (a fresh engine on the
//! same state directory and the same running processors), after a failure the same daemon,
//! must end where an uninterrupted run ends.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use plumber::cutover::{Advance, CutoverConfig, Engine, Event, Target, Waits};
use plumber::graph::Topology;
use plumber::kafka::{self, Admin};
use plumber::plan::{PartitionOffset, moves};
use plumber::runtime::{self, ProcessorSpec, ProcessorStatus, Runtime};
use plumber::spec::{FileContent, Resources, Scale, SourceFile};
use plumber::store::{self, CutoverStore, HistoryEntry, Outcome, StateDir, TopologyRecord};

fn topology(steps: &[(&str, String)]) -> Topology {
    let files: Vec<SourceFile> = steps
        .iter()
        .map(|(name, yaml)| SourceFile {
            path: format!("topologies/t/{name}.yaml"),
            content: FileContent::Bytes(yaml.as_bytes().to_vec()),
        })
        .collect();
    let validation = plumber::validate(&files);
    let mut topologies = validation.topologies.unwrap_or_else(|| {
        panic!("invalid: {:?}", validation.diagnostics);
    });
    topologies.remove(0)
}

/// `in → a → b → out`, `a → c → out2`, with `a` and `c` at the given versions.
fn revision(a: u32, c: u32, ordered: bool) -> Topology {
    let mut steps = vec![
        ("in", "kind: source\ntopic: in\n".to_owned()),
        (
            "a",
            format!("kind: processor\ninput: in\njq: '.a = {a}'\npartitions: 2\n"),
        ),
        ("b", "kind: processor\ninput: a\njq: '.b = 1'\n".to_owned()),
        (
            "c",
            format!("kind: processor\ninput: a\njq: '.c = {c}'\npartitions: 1\n"),
        ),
        ("out", "kind: sink\ntopic: out\ninput: b\n".to_owned()),
        ("out2", "kind: sink\ntopic: out2\ninput: c\n".to_owned()),
    ];
    if ordered {
        steps.push(("topology", "cutover: ordered\n".to_owned()));
    }
    topology(&steps)
}

/// Two branches that share only the source: `in → a → out`, `in → c → out2`, with `a` and
/// `c` at the given versions.
fn branches(a: u32, c: u32) -> Topology {
    topology(&[
        ("in", "kind: source\ntopic: in\n".to_owned()),
        (
            "a",
            format!("kind: processor\ninput: in\njq: '.a = {a}'\npartitions: 2\n"),
        ),
        (
            "c",
            format!("kind: processor\ninput: in\njq: '.c = {c}'\npartitions: 1\n"),
        ),
        ("out", "kind: sink\ntopic: out\ninput: a\n".to_owned()),
        ("out2", "kind: sink\ntopic: out2\ninput: c\n".to_owned()),
    ])
}

/// Where a fault hits: the `at`-th call of `site`, before or after its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Site {
    Kafka,
    Runtime,
    Save,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fault {
    site: Site,
    at: u32,
    after_effect: bool,
}

/// A fault as it was injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Injected {
    /// The daemon died in the call: it and every call after it fail.
    Crash(Fault),
    /// The call failed (an error the engine sees), and the daemon lives on: the calls after
    /// it go through.
    Failure(Fault),
}

/// Counts calls per site; crashes once, or fails one call, as planned, and records what it
/// injected. A crashed daemon makes no more calls.
#[derive(Default)]
struct Faults {
    crash: Mutex<Option<Fault>>,
    failure: Mutex<Option<Fault>>,
    injected: Mutex<Vec<Injected>>,
    calls: Mutex<BTreeMap<String, u32>>,
    crashed: AtomicBool,
}

impl Faults {
    /// Runs `effect` unless the daemon crashed, or crashes or fails here.
    fn call<T>(&self, site: Site, effect: impl FnOnce() -> T) -> Result<T, String> {
        if self.crashed.load(Ordering::SeqCst) {
            return Err("the daemon crashed".into());
        }
        let n = {
            let mut calls = self.calls.lock().unwrap();
            let n = calls.entry(format!("{site:?}")).or_default();
            *n += 1;
            *n
        };
        let here = |planned: &Mutex<Option<Fault>>| {
            planned
                .lock()
                .unwrap()
                .filter(|f| f.site == site && f.at == n)
        };
        let (fault, injected) = if let Some(fault) = here(&self.crash) {
            self.crashed.store(true, Ordering::SeqCst);
            (fault, Injected::Crash(fault))
        } else if let Some(fault) = here(&self.failure) {
            (fault, Injected::Failure(fault))
        } else {
            return Ok(effect());
        };
        self.injected.lock().unwrap().push(injected);
        if fault.after_effect {
            effect();
        }
        Err(format!("injected {injected:?}"))
    }

    fn injected(&self) -> Vec<Injected> {
        self.injected.lock().unwrap().clone()
    }

    fn count(&self, site: Site) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .get(&format!("{site:?}"))
            .copied()
            .unwrap_or(0)
    }
}

/// Kafka and the processors in one: running processors consume everything at once (unless
/// their step is stuck) and write one record to each topic they write (their internal topic
/// or a sink) per record consumed.
#[derive(Default)]
struct World {
    faults: Faults,
    inner: Mutex<Inner>,
    /// The engine's `keep_topics` (`plumber up --keep-topics`).
    keep_topics: AtomicBool,
    /// Steps whose starts the runtime refuses (a retryable error; the daemon lives on), and
    /// how many starts it refused.
    refusing: Mutex<BTreeSet<String>>,
    refused: Mutex<u32>,
}

#[derive(Default, Clone, PartialEq, Debug)]
struct Inner {
    topics: BTreeMap<String, Vec<i64>>,
    /// Every topic and group ever created or started: names are never reused by a new life.
    ever_topics: BTreeSet<String>,
    ever_groups: BTreeSet<String>,
    committed: BTreeMap<String, BTreeMap<(String, i32), i64>>,
    running: BTreeMap<String, ProcessorSpec>,
    stuck: BTreeSet<String>,
    /// Per step and input partition: where the step's last life stopped.
    stopped_at: BTreeMap<(String, String, i32), i64>,
}

impl Inner {
    /// Whether `spec` may read `topic`/`partition`: a warm processor holds a partition until
    /// its group has an offset there, which it takes from its hand-off group, as the
    /// processor does, once the engine put one there (checking that it starts where the
    /// step's last life stopped, and that no other life of the step reads the topic).
    fn take_hand_off(&mut self, spec: &ProcessorSpec, topic: &str, partition: i32) -> bool {
        let Some(handoff) = &spec.handoff_group else {
            return true;
        };
        let key = (topic.to_owned(), partition);
        if self
            .committed
            .get(&spec.group)
            .is_some_and(|c| c.contains_key(&key))
        {
            return true;
        }
        let Some(start) = self
            .committed
            .get(handoff)
            .and_then(|c| c.get(&key))
            .copied()
        else {
            return false;
        };
        for other in self.running.values() {
            assert!(
                other.group == spec.group
                    || other.step != spec.step
                    || !other.inputs.iter().any(|i| i == topic),
                "{} reads {topic} handed off while {} of step {} runs",
                spec.group,
                other.group,
                spec.step
            );
        }
        let stopped_at = (spec.step.clone(), topic.to_owned(), partition);
        if let Some(stopped) = self.stopped_at.get(&stopped_at) {
            assert_eq!(
                start, *stopped,
                "{} takes {topic}/{partition} at {start}, its step stopped at {stopped}",
                spec.group
            );
        }
        self.committed
            .entry(spec.group.clone())
            .or_default()
            .insert(key, start);
        true
    }

    /// Running processors consume what is there, and write what they consumed onward.
    fn consume(&mut self) {
        loop {
            let mut moved = false;
            let groups: Vec<String> = self.running.keys().cloned().collect();
            for group in groups {
                let spec = self.running[&group].clone();
                if self.stuck.contains(&spec.step) {
                    continue;
                }
                let mut consumed = 0;
                for input in &spec.inputs {
                    let ends = self.topics.get(input).cloned().unwrap_or_default();
                    for (partition, end) in ends.into_iter().enumerate() {
                        if !self.take_hand_off(&spec, input, partition as i32) {
                            continue;
                        }
                        let at = self
                            .committed
                            .entry(group.clone())
                            .or_default()
                            .entry((input.clone(), partition as i32))
                            .or_insert(0);
                        if *at < end {
                            consumed += end - *at;
                            *at = end;
                        }
                    }
                }
                if consumed > 0 {
                    moved = true;
                    for output in &spec.outputs {
                        if let Some(partitions) = self.topics.get_mut(output) {
                            partitions[0] += consumed;
                        }
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }
}

impl World {
    /// The users' topics: source `in`, sinks `out` and `out2`.
    fn with_user_topics() -> World {
        let world = World::default();
        let mut inner = world.inner.lock().unwrap();
        inner.topics.insert("in".into(), vec![0, 0, 0]);
        inner.topics.insert("out".into(), vec![0]);
        inner.topics.insert("out2".into(), vec![0]);
        drop(inner);
        world
    }

    fn with<T>(&self, site: Site, f: impl FnOnce(&mut Inner) -> T) -> Result<T, String> {
        self.faults.call(site, || {
            let mut inner = self.inner.lock().unwrap();
            inner.consume();
            f(&mut inner)
        })
    }

    fn produce(&self, topic: &str, per_partition: i64) {
        let mut inner = self.inner.lock().unwrap();
        for end in inner.topics.get_mut(topic).unwrap() {
            *end += per_partition;
        }
        inner.consume();
    }

    fn snapshot(&self) -> Inner {
        let mut inner = self.inner.lock().unwrap();
        inner.consume();
        inner.clone()
    }
}

fn kafka_error(message: String) -> kafka::Error {
    kafka::Error::Metadata {
        topic: "-".into(),
        message,
    }
}

impl Admin for World {
    fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        _: Option<u32>,
        _: &BTreeMap<String, String>,
    ) -> kafka::Result<()> {
        self.with(Site::Kafka, |w| {
            if !w.topics.contains_key(topic) {
                assert!(
                    w.ever_topics.insert(topic.to_owned()),
                    "{topic} created again: a new life reuses an old topic"
                );
                w.topics.insert(topic.into(), vec![0; partitions as usize]);
            }
        })
        .map_err(kafka_error)
    }
    fn delete_topic(&self, topic: &str) -> kafka::Result<()> {
        self.with(Site::Kafka, |w| {
            for spec in w.running.values() {
                assert!(
                    !spec.inputs.iter().chain(&spec.outputs).any(|t| t == topic),
                    "{topic} deleted while {} uses it",
                    spec.group
                );
            }
            w.topics.remove(topic);
        })
        .map_err(kafka_error)
    }
    fn partitions(&self, topic: &str) -> kafka::Result<i32> {
        Ok(self.watermarks(topic)?.len() as i32)
    }
    fn watermarks(&self, topic: &str) -> kafka::Result<Vec<(i64, i64)>> {
        self.with(Site::Kafka, |w| {
            w.topics
                .get(topic)
                .map(|ends| ends.iter().map(|e| (0, *e)).collect())
        })
        .map_err(kafka_error)?
        .ok_or_else(|| kafka::Error::NoSuchTopic {
            topic: topic.into(),
        })
    }
    fn committed(&self, group: &str, topics: &[String]) -> kafka::Result<Vec<PartitionOffset>> {
        self.with(Site::Kafka, |w| {
            w.committed
                .get(group)
                .into_iter()
                .flatten()
                .filter(|((t, _), _)| topics.contains(t))
                .map(|((topic, partition), offset)| PartitionOffset {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: *offset,
                })
                .collect()
        })
        .map_err(kafka_error)
    }
    fn supports_transactions(&self) -> kafka::Result<bool> {
        Ok(false)
    }
    fn commit(&self, group: &str, offsets: &[PartitionOffset]) -> kafka::Result<()> {
        self.with(Site::Kafka, |w| {
            assert!(
                !w.running.contains_key(group),
                "offsets of {group} set while it runs"
            );
            let at = w.committed.entry(group.into()).or_default();
            for p in offsets {
                at.insert((p.topic.clone(), p.partition), p.offset);
            }
        })
        .map_err(kafka_error)
    }
    fn delete_group(&self, group: &str) -> kafka::Result<()> {
        self.with(Site::Kafka, |w| {
            assert!(
                !w.running.contains_key(group),
                "{group} deleted while it runs"
            );
            w.committed.remove(group);
        })
        .map_err(kafka_error)
    }
}

fn runtime_error(message: String) -> runtime::Error {
    runtime::Error::Start {
        group: "-".into(),
        message,
        retryable: true,
    }
}

impl Runtime for World {
    fn start(&self, spec: &ProcessorSpec) -> runtime::Result<()> {
        if self.refusing.lock().unwrap().contains(&spec.step) {
            *self.refused.lock().unwrap() += 1;
            return Err(runtime_error(format!(
                "injected: the runtime refuses to start {}",
                spec.group
            )));
        }
        self.with(Site::Runtime, |w| {
            if w.running.contains_key(&spec.group) {
                return;
            }
            assert!(
                w.ever_groups.insert(spec.group.clone()),
                "{} started twice: a new life reuses an old group",
                spec.group
            );
            // A warm one reads nothing before its hand-off (checked then).
            let reads = spec.handoff_group.is_none();
            for other in w.running.values().filter(|o| reads && o.step == spec.step) {
                for input in &spec.inputs {
                    assert!(
                        !other.inputs.contains(input),
                        "{} and {} of step {} both read {input}",
                        other.group,
                        spec.group,
                        spec.step
                    );
                }
            }
            // No gap, no overlap: where the step's last life stopped, this one begins.
            let at = w.committed.get(&spec.group).cloned().unwrap_or_default();
            for ((topic, partition), offset) in &at {
                let key = (spec.step.clone(), topic.clone(), *partition);
                if let Some(stopped) = w.stopped_at.get(&key) {
                    assert_eq!(
                        offset, stopped,
                        "{} starts on {topic}/{partition} at {offset}, its step stopped at {stopped}",
                        spec.group
                    );
                }
            }
            w.running.insert(spec.group.clone(), spec.clone());
        })
        .map_err(runtime_error)
    }
    fn stop(&self, group: &str) -> runtime::Result<()> {
        self.with(Site::Runtime, |w| {
            if let Some(spec) = w.running.remove(group) {
                for ((topic, partition), offset) in w.committed.get(group).into_iter().flatten() {
                    w.stopped_at
                        .insert((spec.step.clone(), topic.clone(), *partition), *offset);
                }
            }
        })
        .map_err(runtime_error)
    }
    fn restart(&self, _group: &str) -> runtime::Result<()> {
        Ok(())
    }
    fn update(
        &self,
        group: &str,
        scale: &Scale,
        resources: Option<&Resources>,
    ) -> runtime::Result<()> {
        self.with(Site::Runtime, |w| {
            if let Some(spec) = w.running.get_mut(group) {
                spec.scale = *scale;
                spec.resources = resources.cloned();
            }
        })
        .map_err(runtime_error)
    }
    fn processors(&self) -> runtime::Result<Vec<ProcessorStatus>> {
        Ok(Vec::new())
    }
    fn runs(&self, group: &str) -> runtime::Result<bool> {
        Ok(self.snapshot().running.contains_key(group))
    }
    fn held(&self, group: &str) -> runtime::Result<Option<u64>> {
        let world = self.snapshot();
        let Some(spec) = world
            .running
            .get(group)
            .filter(|s| s.handoff_group.is_some())
        else {
            return Ok(Some(0));
        };
        let committed = world.committed.get(group);
        let held = spec
            .inputs
            .iter()
            .flat_map(|t| {
                let partitions = world.topics.get(t).map_or(0, Vec::len);
                (0..partitions as i32).map(move |p| (t.clone(), p))
            })
            .filter(|key| !committed.is_some_and(|c| c.contains_key(key)))
            .count();
        Ok(Some(held as u64))
    }
}

/// The state directory, with the world's faults on every save.
struct Store<'a> {
    dir: StateDir,
    faults: &'a Faults,
}

impl CutoverStore for Store<'_> {
    fn load(&self, topology: &str) -> store::Result<TopologyRecord> {
        self.dir.load(topology)
    }
    fn save(&self, topology: &str, record: &TopologyRecord) -> store::Result<()> {
        self.faults
            .call(Site::Save, || self.dir.save(topology, record))
            .map_err(|message| store::Error::Write {
                path: PathBuf::from(message),
                source: std::io::Error::other("injected"),
            })?
    }
    fn topologies(&self) -> store::Result<BTreeMap<String, store::Result<TopologyRecord>>> {
        self.dir.topologies()
    }
    fn append_history(&self, entry: &HistoryEntry) -> store::Result<()> {
        self.dir.append_history(entry)
    }
    fn history(&self) -> store::Result<Vec<HistoryEntry>> {
        self.dir.history()
    }
    fn forget(&self, preview: &str) -> store::Result<()> {
        self.dir.forget(preview)
    }
}

static CLUSTER: std::sync::LazyLock<runtime::Cluster> =
    std::sync::LazyLock::new(|| runtime::Cluster::at("fake:9092"));

fn target<'a>(commit: &'a str, topology: Option<&'a Topology>) -> Target<'a> {
    Target {
        commit,
        topology,
        cluster: topology.map(|_| &*CLUSTER),
        settings: plumber::runtime::Settings::default(),
    }
}

thread_local! {
    /// The engine's actions per call in this test (its thread), and how long a call may
    /// begin new ones.
    static BATCH: std::cell::Cell<usize> = std::cell::Cell::new(CutoverConfig::default().batch);
    static BATCH_FOR: std::cell::Cell<std::time::Duration> =
        std::cell::Cell::new(CutoverConfig::default().batch_for);
}

/// Runs `body` with the engine of a fresh daemon on `dir`, looking again at once at what
/// waits (a test never waits for time to pass).
fn with_engine<T>(world: &World, dir: &StateDir, body: impl FnOnce(&Engine<'_>) -> T) -> T {
    with_engine_seeing(world, dir, &|_| {}, body)
}

/// [`with_engine`], handing every event of the engine to `on_event`.
fn with_engine_seeing<T>(
    world: &World,
    dir: &StateDir,
    on_event: &(dyn Fn(Event<'_>) + Sync),
    body: impl FnOnce(&Engine<'_>) -> T,
) -> T {
    with_engine_named(world, dir, "t", on_event, body)
}

/// [`with_engine_seeing`] for topology `name`.
fn with_engine_named<T>(
    world: &World,
    dir: &StateDir,
    name: &str,
    on_event: &(dyn Fn(Event<'_>) + Sync),
    body: impl FnOnce(&Engine<'_>) -> T,
) -> T {
    let store = Store {
        dir: dir.clone(),
        faults: &world.faults,
    };
    let config = CutoverConfig {
        poll: std::time::Duration::ZERO,
        topic_poll: std::time::Duration::ZERO,
        retry: (std::time::Duration::ZERO, std::time::Duration::ZERO),
        keep_topics: world.keep_topics.load(Ordering::SeqCst),
        batch: BATCH.get(),
        batch_for: BATCH_FOR.get(),
        ..CutoverConfig::default()
    };
    body(&Engine {
        topology: name,
        admin: world,
        runtime: world,
        store: &store,
        config: &config,
        on_event,
    })
}

/// Advances until `done` says so about an answer; panics on an answer it refuses.
fn advance_until(
    engine: &Engine<'_>,
    target: &Target<'_>,
    waits: &mut Waits,
    done: impl Fn(&Advance) -> bool,
) -> Advance {
    let mut last = None;
    for _ in 0..1000 {
        let advance = engine.advance(target, waits).unwrap();
        if done(&advance) {
            return advance;
        }
        last = Some(advance);
    }
    panic!(
        "no end after 1000 steps towards {}; the last: {last:#?}",
        target.commit
    );
}

/// One commit to move to, and how many actions to run towards it before the next one
/// arrives (`None`: until settled).
struct Step<'a> {
    commit: &'a str,
    topology: &'a Topology,
    actions: Option<usize>,
}

/// A daemon: drives the engine through `steps` from the `cursor`-th on (which commit is the
/// branch's head is not the daemon's state: it survives a crash); returns false when it
/// crashed. A step's action count is read from the saved move, as a resumed daemon sees it.
fn daemon(world: &World, dir: &StateDir, steps: &[Step<'_>], cursor: &mut usize) -> bool {
    with_engine(world, dir, |engine| {
        drive(world, dir, engine, steps, cursor)
    })
}

fn drive(
    world: &World,
    dir: &StateDir,
    engine: &Engine<'_>,
    steps: &[Step<'_>],
    cursor: &mut usize,
) -> bool {
    let mut waits = Waits::default();
    let mut spins = 0;
    while *cursor < steps.len() {
        let step = &steps[*cursor];
        let target = target(step.commit, Some(step.topology));
        let done = dir
            .load("t")
            .unwrap()
            .moving
            .filter(|m| m.to == step.commit)
            .map_or(0, |m| m.done);
        if step.actions.is_some_and(|n| done >= n) {
            *cursor += 1;
            continue;
        }
        let advanced = engine.advance(&target, &mut waits);
        if world.faults.crashed.load(Ordering::SeqCst) {
            return false;
        }
        match advanced {
            Ok(Advance::Progressed) => {}
            Ok(Advance::Settled { .. } | Advance::Removed) => *cursor += 1,
            Ok(Advance::Waiting { waits, .. }) => {
                spins += 1;
                assert!(spins < 1000, "the move waits forever: {waits:#?}");
            }
            // A save failed: the daemon's worker tries the step again (as it does after every
            // retryable error), with the same waits.
            Err(error) => {
                assert!(
                    error.is_retryable() && !world.faults.injected().is_empty(),
                    "{error}"
                );
                spins += 1;
                assert!(spins < 1000, "the move fails forever: {error}");
            }
        }
    }
    true
}

/// What a run ends with: the world, the state, the history.
type Ending = (Inner, TopologyRecord, Vec<HistoryEntry>);

/// What an uninterrupted run ends with.
fn ending(world: &World, dir: &StateDir) -> Ending {
    let mut inner = world.snapshot();
    // Which calls were made is not part of the outcome.
    inner.stopped_at.clear();
    let mut history = dir.history().unwrap();
    for entry in &mut history {
        entry.started_at = 0;
        entry.finished_at = 0;
    }
    let mut record = dir.load("t").unwrap();
    if let Some(entry) = &mut record.unrecorded {
        entry.started_at = 0;
    }
    // Nor is the order in which independent actions ran (a failed one runs later).
    record
        .deployment
        .lives
        .sort_by(|a, b| a.group().cmp(b.group()));
    for entry in &mut history {
        entry
            .handovers
            .sort_by(|a, b| (&a.step, &a.from_group).cmp(&(&b.step, &b.from_group)));
    }
    (inner, record, history)
}

/// A world with the first revision deployed and records on the source.
fn deployed(first: &Topology) -> (World, tempfile::TempDir, StateDir) {
    let world = World::with_user_topics();
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let first = [Step {
        commit: "r1",
        topology: first,
        actions: None,
    }];
    assert!(daemon(&world, &state, &first, &mut 0));
    world.produce("in", 10);
    *world.faults.calls.lock().unwrap() = BTreeMap::new();
    (world, dir, state)
}

/// The calls per site of an uninterrupted run of `steps` after deploying `first`, and what
/// it ends with: every sink holds each record of the source once.
fn reference_run(first: &Topology, steps: &[Step<'_>]) -> (Vec<(Site, u32)>, Ending) {
    let (world, _dir, state) = deployed(first);
    assert!(daemon(&world, &state, steps, &mut 0));
    let calls: Vec<(Site, u32)> = [Site::Kafka, Site::Runtime, Site::Save]
        .into_iter()
        .map(|site| (site, world.faults.count(site)))
        .collect();
    assert!(calls.iter().any(|(_, n)| *n > 0), "{calls:?}");
    assert_eq!(sink_counts(&world), [("in", 30), ("out", 30), ("out2", 30)]);
    (calls, ending(&world, &state))
}

/// Every fault of a reference run's calls: each call of each site, before and after its
/// effect.
fn every_fault(calls: &[(Site, u32)]) -> impl Iterator<Item = Fault> + '_ {
    calls.iter().flat_map(|&(site, count)| {
        (1..=count).flat_map(move |at| {
            [false, true].map(|after_effect| Fault {
                site,
                at,
                after_effect,
            })
        })
    })
}

/// Runs `steps` after deploying `first`, crashing at every call of every site, before and
/// after its effect; each crashed run, resumed by a new daemon, must end like the run
/// without a crash. Every planned crash must happen (the runs are deterministic: the crashed
/// run makes the reference run's calls up to the crash). Returns how many crashed.
fn every_crash_ends_like_no_crash(first: &Topology, steps: &[Step<'_>]) -> usize {
    let (calls, reference) = reference_run(first, steps);
    let mut crashes = 0;
    for crash in every_fault(&calls) {
        let (world, _dir, state) = deployed(first);
        *world.faults.crash.lock().unwrap() = Some(crash);
        let mut cursor = 0;
        assert!(
            !daemon(&world, &state, steps, &mut cursor),
            "the daemon ran to the end without {crash:?}"
        );
        assert_eq!(world.faults.injected(), [Injected::Crash(crash)]);
        crashes += 1;
        // The next daemon: same state directory, same running processors.
        world.faults.crashed.store(false, Ordering::SeqCst);
        *world.faults.crash.lock().unwrap() = None;
        assert!(daemon(&world, &state, steps, &mut cursor));
        assert_eq!(ending(&world, &state), reference, "after {crash:?}");
    }
    crashes
}

/// Runs `steps` after deploying `first`, failing each call of each site in turn (one call,
/// before or after its effect) while the daemon lives on: the engine retries the failed
/// action (or the worker the failed step), and the run must end like the run without a
/// failure. Returns how many failures were injected.
fn every_failure_ends_like_no_failure(first: &Topology, steps: &[Step<'_>]) -> usize {
    let (calls, reference) = reference_run(first, steps);
    let mut failures = 0;
    for failure in every_fault(&calls) {
        let (world, _dir, state) = deployed(first);
        *world.faults.failure.lock().unwrap() = Some(failure);
        assert!(
            daemon(&world, &state, steps, &mut 0),
            "a failure is no crash: {failure:?}"
        );
        assert_eq!(world.faults.injected(), [Injected::Failure(failure)]);
        failures += 1;
        assert_eq!(ending(&world, &state), reference, "after {failure:?}");
    }
    failures
}

#[test]
fn a_first_deploy_starts_every_processor_at_explicit_offsets() {
    let (world, _dir, state) = deployed(&revision(1, 1, false));
    let inner = world.snapshot();
    assert_eq!(inner.running.len(), 3);
    let record = state.load("t").unwrap();
    assert_eq!(record.commit.as_deref(), Some("r1"));
    assert!(record.moving.is_none());
    let a = inner
        .running
        .keys()
        .find(|g| g.starts_with("plumber.t.a."))
        .unwrap();
    assert_eq!(inner.committed[a].len(), 3, "a's offsets on `in` are set");
    assert_eq!(state.history().unwrap().len(), 1);
}

/// The record is written once per call of the engine, not once per action.
#[test]
fn a_first_deploy_saves_its_record_once_per_batch_not_once_per_action() {
    let world = World::with_user_topics();
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let first = revision(1, 1, false);
    let plan = plumber::plan::plan(None, ("r1", std::slice::from_ref(&first)));
    let actions = plan.topologies[0].actions.len();
    let step = Step {
        commit: "r1",
        topology: &first,
        actions: None,
    };
    assert!(daemon(&world, &state, &[step], &mut 0));
    assert_eq!(world.snapshot().running.len(), 3);
    assert_eq!(actions, 7, "four topics and three starts");
    // Its start, the new lives' offsets, everything else, and the settled deployment with
    // its history entry still to append, then without.
    assert_eq!(world.faults.count(Site::Save), 5);
}

/// A call begins no action once it has run `batch_for` (none at all: one action a call), so
/// that a call of slow actions (stops wait for processes to exit) stays short.
#[test]
fn a_call_begins_no_action_after_its_time_is_up() {
    BATCH_FOR.set(std::time::Duration::ZERO);
    let world = World::with_user_topics();
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let first = revision(1, 1, false);
    let moved = with_engine(&world, &state, |engine| {
        let target = target("r1", Some(&first));
        let mut waits = Waits::default();
        let mut progressed = 0;
        while engine.advance(&target, &mut waits).unwrap() == Advance::Progressed {
            progressed += 1;
        }
        progressed
    });
    assert_eq!(moved, 7, "one call per action");
    assert_eq!(world.snapshot().running.len(), 3);
}

/// `plumber plan --keep-topics` shows what a daemon with `--keep-topics` does: the topics the
/// engine would delete without it are the ones the plan lists as kept, and it deletes none.
#[test]
fn the_plan_with_keep_topics_is_what_the_engine_with_keep_topics_does() {
    let (from, to) = (revision(1, 1, false), revision(2, 1, false));
    let deleted_by_run = |keep: bool| {
        let (world, _dir, state) = deployed(&from);
        world.keep_topics.store(keep, Ordering::SeqCst);
        let topics = |w: &World| -> BTreeSet<String> { w.snapshot().topics.into_keys().collect() };
        let before = topics(&world);
        let step = Step {
            commit: "r2",
            topology: &to,
            actions: None,
        };
        assert!(daemon(&world, &state, &[step], &mut 0));
        before
            .difference(&topics(&world))
            .cloned()
            .collect::<Vec<_>>()
    };
    let plan = plumber::plan::plan(
        Some(("r1", std::slice::from_ref(&from))),
        ("r2", std::slice::from_ref(&to)),
    );
    let deletes = |plan: &plumber::plan::Plan| -> Vec<String> {
        plan.topologies[0]
            .actions
            .iter()
            .filter_map(|a| match a {
                plumber::plan::Action::DeleteTopic { topic } => Some(topic.clone()),
                _ => None,
            })
            .collect()
    };
    let deleted = deleted_by_run(false);
    assert_eq!(deleted.len(), 1, "replacing `a` retires its internal topic");
    assert_eq!(deletes(&plan), deleted);
    assert!(plan.topologies[0].kept_topics.is_empty());

    let kept = plan.clone().keeping_topics();
    assert!(
        deleted_by_run(true).is_empty(),
        "--keep-topics deletes nothing"
    );
    assert!(deletes(&kept).is_empty());
    assert_eq!(kept.topologies[0].kept_topics, deleted);
    assert_eq!(
        kept.topologies[0].actions.len(),
        plan.topologies[0].actions.len() - 1,
        "nothing else changes"
    );
}

#[test]
fn replacing_a_source_connected_step_survives_a_crash_anywhere() {
    let (from, to) = (revision(1, 1, false), revision(2, 1, false));
    let crashes = every_crash_ends_like_no_crash(
        &from,
        &[Step {
            commit: "r2",
            topology: &to,
            actions: None,
        }],
    );
    assert!(crashes > 20, "only {crashes} crashes injected");
}

#[test]
fn replacing_a_source_connected_step_survives_a_failing_call_anywhere() {
    let (from, to) = (revision(1, 1, false), revision(2, 1, false));
    let failures = every_failure_ends_like_no_failure(
        &from,
        &[Step {
            commit: "r2",
            topology: &to,
            actions: None,
        }],
    );
    assert!(failures > 20, "only {failures} failures injected");
}

#[test]
fn an_ordered_cutover_survives_a_crash_anywhere() {
    let (from, to) = (revision(1, 1, true), revision(2, 1, true));
    let crashes = every_crash_ends_like_no_crash(
        &from,
        &[Step {
            commit: "r2",
            topology: &to,
            actions: None,
        }],
    );
    assert!(crashes > 20, "only {crashes} crashes injected");
}

#[test]
fn an_ordered_cutover_survives_a_failing_call_anywhere() {
    let (from, to) = (revision(1, 1, true), revision(2, 1, true));
    let failures = every_failure_ends_like_no_failure(
        &from,
        &[Step {
            commit: "r2",
            topology: &to,
            actions: None,
        }],
    );
    assert!(failures > 20, "only {failures} failures injected");
}

/// The records on the source and on each of the users' sinks: every step passes each
/// record on, so a sink holds each record of the source exactly once, however many lives
/// wrote it.
fn sink_counts(world: &World) -> [(&'static str, i64); 3] {
    let topics = world.snapshot().topics;
    ["in", "out", "out2"].map(|t| (t, topics[t].iter().sum()))
}

/// The runtime refuses to start `a`'s new life (a retryable error, the daemon lives on): the
/// engine tries it again at every look, and meanwhile `c`'s replacement, which does not
/// depend on it, runs to its end. `a`'s new life starts warm, so its old life stops only once
/// the new one runs: until then the old one goes on, and status says what its stop waits
/// for. Once the runtime starts it, the move ends as the same move without the failure ends:
/// none lost, none read twice.
#[test]
fn a_failing_start_is_retried_while_the_other_actions_go_on() {
    let (one, two) = (branches(1, 1), branches(2, 2));
    let r2 = [Step {
        commit: "r2",
        topology: &two,
        actions: None,
    }];
    let reference = {
        let (world, _dir, state) = deployed(&one);
        assert!(daemon(&world, &state, &r2, &mut 0));
        world.produce("in", 5);
        assert_eq!(sink_counts(&world), [("in", 45), ("out", 45), ("out2", 45)]);
        ending(&world, &state).1
    };

    let (world, _dir, state) = deployed(&one);
    let groups_of = |step: &str| -> Vec<String> {
        world
            .snapshot()
            .running
            .into_values()
            .filter(|s| s.step == step)
            .map(|s| s.group)
            .collect()
    };
    let (old_a, old_c) = (groups_of("a"), groups_of("c"));
    let refused = || *world.refused.lock().unwrap();
    world.refusing.lock().unwrap().insert("a".into());
    with_engine(&world, &state, |engine| {
        let mut waits = Waits::default();
        let r2 = target("r2", Some(&two));
        // Until only what waits for `a`'s start is left; per look, the lives of `c` and how
        // often `a`'s start failed by then.
        let mut looks = Vec::new();
        let waiting_for = loop {
            assert!(looks.len() < 1000, "no end of the other actions");
            let advanced = engine.advance(&r2, &mut waits).unwrap();
            looks.push((groups_of("c"), refused()));
            match advanced {
                Advance::Progressed => {}
                Advance::Waiting { waits, .. } => break waits,
                settled => panic!("settled while a cannot start: {settled:?}"),
            }
        };
        // `c` moved on after `a`'s start first failed: its new life runs, its old one is
        // gone; `a`'s old life still runs.
        let new_c = groups_of("c");
        assert_eq!(new_c.len(), 1);
        assert!(!old_c.contains(&new_c[0]), "{new_c:?}");
        let c_started = looks.iter().position(|(c, _)| *c == new_c).unwrap();
        assert!(
            looks[c_started].1 >= 1,
            "c started only after a's start failed: {looks:#?}"
        );
        assert_eq!(groups_of("a"), old_a, "the old a runs on");
        let [start_a, stop_a] = &waiting_for[..] else {
            panic!("only a's start and its old life's stop wait: {waiting_for:#?}");
        };
        assert!(
            start_a.action.starts_with("start-warm a as ")
                && start_a.failures >= 2
                && start_a.reason.contains("injected: the runtime refuses"),
            "{start_a:#?}"
        );
        assert!(
            stop_a.action == format!("stop-processor {}", old_a[0])
                && stop_a.reason.ends_with("to start warm")
                && stop_a.failures == 0,
            "{stop_a:#?}"
        );
        // Records keep coming while `a` cannot start: the old `a` and `c` write them on.
        world.produce("in", 5);
        assert_eq!(sink_counts(&world), [("in", 45), ("out", 45), ("out2", 45)]);
        // The engine keeps trying, once per look, and status counts the failures.
        let before = refused();
        for look in 1..=3 {
            let Advance::Waiting { waits: now, .. } = engine.advance(&r2, &mut waits).unwrap()
            else {
                panic!("a started while refused");
            };
            assert_eq!(refused(), before + look);
            assert_eq!(now.len(), 2, "{now:#?}");
            assert_eq!(now[0].failures, start_a.failures + look, "{now:#?}");
        }
        // The runtime starts it again: the move ends.
        world.refusing.lock().unwrap().clear();
        advance_until(engine, &r2, &mut waits, |a| {
            matches!(a, Advance::Settled { .. })
        });
    });
    let new_a = groups_of("a");
    assert_eq!(new_a.len(), 1);
    assert!(!old_a.contains(&new_a[0]), "{new_a:?}");
    assert_eq!(
        sink_counts(&world),
        [("in", 45), ("out", 45), ("out2", 45)],
        "every record of `in` reaches each sink once"
    );
    // The same lives and commit (the offsets handed over are later: the old `a` read on).
    assert_eq!(ending(&world, &state).1, reference);
}

#[test]
fn a_revert_runs_the_old_identities_in_new_lives_and_survives_a_crash_anywhere() {
    let (one, two) = (revision(1, 1, false), revision(2, 1, false));
    let steps = [
        Step {
            commit: "r2",
            topology: &two,
            actions: None,
        },
        Step {
            commit: "r3",
            topology: &one,
            actions: None,
        },
    ];
    let crashes = every_crash_ends_like_no_crash(&one, &steps);
    assert!(crashes > 40, "only {crashes} crashes injected");

    let (world, _dir, state) = deployed(&one);
    let first_groups: BTreeSet<String> = world.snapshot().running.keys().cloned().collect();
    assert!(daemon(&world, &state, &steps, &mut 0));
    let last_groups: BTreeSet<String> = world.snapshot().running.keys().cloned().collect();
    // `c` never changed its identity... but it reads `a`, whose new life has a new topic.
    assert!(
        first_groups.is_disjoint(&last_groups),
        "{first_groups:?} ran again as {last_groups:?}"
    );
    assert!(
        last_groups.iter().all(|g| g.ends_with(".2")),
        "{last_groups:?}"
    );
}

#[test]
fn a_newer_commit_takes_over_a_move_half_way_and_survives_a_crash_anywhere() {
    let (one, two, three) = (
        revision(1, 1, false),
        revision(2, 1, false),
        revision(2, 2, false),
    );
    // One action per call: the newer commit comes after exactly `taken` actions, whether a
    // crash came before or not (calls of many actions end where they fail or crash).
    BATCH.set(1);
    let full = moves::plan(&one.name, &plumber::plan::Deployment::of(&one), Some(&two)).len();
    // Early, half-way and late: each point crashes everywhere, so not every point.
    let mut points = vec![1, full / 2, full - 1];
    points.dedup();
    for taken in points {
        let steps = [
            Step {
                commit: "r2",
                topology: &two,
                actions: Some(taken),
            },
            Step {
                commit: "r3",
                topology: &three,
                actions: None,
            },
        ];
        let crashes = every_crash_ends_like_no_crash(&one, &steps);
        assert!(crashes > 10, "only {crashes} crashes injected at {taken}");
        // And back to where it started, half-way through.
        let back = [
            Step {
                commit: "r2",
                topology: &two,
                actions: Some(taken),
            },
            Step {
                commit: "r1b",
                topology: &one,
                actions: None,
            },
        ];
        let crashes = every_crash_ends_like_no_crash(&one, &back);
        assert!(
            crashes > 10,
            "only {crashes} crashes injected back at {taken}"
        );
    }
}

/// Where the first action that `describe`s as starting with `verb` stands in the plan from
/// `from` to `to`.
fn plan_position(from: &Topology, to: &Topology, verb: &str) -> usize {
    let plan = moves::plan(&from.name, &plumber::plan::Deployment::of(from), Some(to));
    plan.iter()
        .position(|a| plumber::cutover::describe(a).starts_with(verb))
        .unwrap_or_else(|| panic!("no {verb} in {plan:#?}"))
}

/// The move from `one` to `two`, taken over by `three` once `taken` of its actions are
/// recorded, ends like no crash whatever crashes on the way.
fn taken_over_after(one: &Topology, two: &Topology, three: &Topology, taken: usize) {
    let steps = [
        Step {
            commit: "r2",
            topology: two,
            actions: Some(taken),
        },
        Step {
            commit: "r3",
            topology: three,
            actions: None,
        },
    ];
    let crashes = every_crash_ends_like_no_crash(one, &steps);
    assert!(crashes > 10, "only {crashes} crashes injected at {taken}");
}

/// A newer commit replaces `a` again while its warm life waits for its hand-off, at each
/// point of the warm start (started, its predecessor stopped, handed off): the warm life is
/// stopped without a position of its own unless it read (its step's recorded one stands),
/// and the next life takes over exactly where `a` stood, whatever crashes on the way.
#[test]
fn a_warm_life_replaced_before_its_hand_off_survives_a_crash_anywhere() {
    let (one, two, three) = (
        revision(1, 1, false),
        revision(2, 1, false),
        revision(3, 1, false),
    );
    BATCH.set(1);
    let at = |verb: &str| plan_position(&one, &two, verb);
    let (warm, stop, hand_off) = (
        at("start-warm a "),
        at(&format!(
            "stop-processor {}",
            one.internal_name(one.find("a").unwrap())
        )),
        at("hand-off "),
    );
    assert!(
        warm < stop && stop < hand_off,
        "start-warm at {warm}, stop at {stop}, hand-off at {hand_off}"
    );
    for taken in [warm + 1, stop + 1] {
        taken_over_after(&one, &two, &three, taken);
    }
}

/// `c` is replaced (its next life starts warm on `a`'s topic) and, before the hand-off is
/// recorded, a newer commit replaces `a`: the warm `c` now reads a retiring topic and is
/// handed nothing more. Without a hand-off written it never reads, so its drain is done at
/// once and it stops; with one written (a crash after the hand-off's commit) it reads from
/// there and drains `a`'s old topic. Either way the move finishes, nothing lost, whatever
/// crashes on the way.
#[test]
fn a_warm_life_whose_input_retires_before_its_hand_off_is_recorded_loses_nothing() {
    let (one, two, three) = (
        revision(1, 1, false),
        revision(1, 2, false),
        revision(2, 2, false),
    );
    BATCH.set(1);
    let warm = plan_position(&one, &two, "start-warm c ");
    let hand_off = plan_position(&one, &two, "hand-off ");
    for taken in [warm + 1, hand_off, hand_off + 1] {
        taken_over_after(&one, &two, &three, taken);
    }
}

/// The daemon crashes after the hand-off's commit and before its record, and the next one
/// finds a newer commit that retires the topic the warm life reads: that life reads from
/// the hand-off meanwhile, so it is drained like any other before it stops, and every
/// record reaches the sink once.
#[test]
fn a_warm_life_handed_off_unrecorded_drains_the_topic_it_retires() {
    let (one, two, three) = (
        revision(1, 1, false),
        revision(1, 2, false),
        revision(2, 2, false),
    );
    BATCH.set(1);
    let hand_off = plan_position(&one, &two, "hand-off ");
    let (world, _dir, state) = deployed(&one);
    world.produce("in", 5);
    let before = [Step {
        commit: "r2",
        topology: &two,
        actions: Some(hand_off),
    }];
    assert!(daemon(&world, &state, &before, &mut 0));
    let record = state.load("t").unwrap();
    let warm = record
        .deployment
        .lives
        .iter()
        .find(|l| l.held)
        .unwrap_or_else(|| panic!("no warm life: {record:#?}"))
        .group()
        .to_owned();
    // What the crashed engine had committed: where the old `c` stopped.
    let handed: BTreeMap<(String, i32), i64> = world
        .snapshot()
        .stopped_at
        .into_iter()
        .filter(|((step, _, _), _)| step == "c")
        .map(|((_, topic, partition), offset)| ((topic, partition), offset))
        .collect();
    assert!(!handed.is_empty(), "the old c has stopped");
    // `c` reads nothing for a while: the warm life does not take its hand-off yet.
    world.inner.lock().unwrap().stuck.insert("c".into());
    world
        .inner
        .lock()
        .unwrap()
        .committed
        .insert(plumber::plan::deployment::handoff_group(&warm), handed);
    world.produce("in", 5);
    with_engine(&world, &state, |engine| {
        let mut waits = Waits::default();
        let r3 = target("r3", Some(&three));
        let Advance::Waiting {
            waits: waiting_for, ..
        } = advance_until(engine, &r3, &mut waits, |a| {
            matches!(a, Advance::Waiting { .. })
        })
        else {
            unreachable!()
        };
        assert!(
            waiting_for.iter().any(
                |w| w.action.starts_with(&format!("drain-processor {warm} "))
                    && w.reason.contains("records left")
            ),
            "the warm life, handed off, drains before it stops: {waiting_for:#?}"
        );
        assert!(world.snapshot().running.contains_key(&warm));
        world.inner.lock().unwrap().stuck.clear();
        advance_until(engine, &r3, &mut waits, |a| {
            matches!(a, Advance::Settled { .. })
        });
    });
    let inner = world.snapshot();
    let sent: i64 = inner.topics["in"].iter().sum();
    assert_eq!(
        inner.topics["out2"][0], sent,
        "every record through c to out2 once: {:#?}",
        inner.committed
    );
    assert!(!inner.running.contains_key(&warm), "the warm life stopped");
}

#[test]
fn a_stuck_drain_waits_without_holding_up_the_rest_or_a_newer_commit() {
    let (one, two, three) = (
        revision(1, 1, false),
        revision(2, 1, false),
        revision(2, 2, false),
    );
    let (world, _dir, state) = deployed(&one);
    // The old `b` never consumes: it cannot drain `a`'s old topic.
    world.inner.lock().unwrap().stuck.insert("b".into());
    world.produce("in", 5);
    let waiting = |a: &Advance| matches!(a, Advance::Waiting { .. });
    with_engine(&world, &state, |engine| {
        let mut waits = Waits::default();
        let Advance::Waiting {
            waits: waiting_for, ..
        } = advance_until(engine, &target("r2", Some(&two)), &mut waits, waiting)
        else {
            unreachable!()
        };
        assert!(
            waiting_for
                .iter()
                .any(|w| w.action.starts_with("drain-processor plumber.t.b.")
                    && w.reason.contains("records left")),
            "status says what the move waits for: {waiting_for:#?}"
        );
        let c_before: Vec<String> = world
            .snapshot()
            .running
            .into_keys()
            .filter(|g| g.starts_with("plumber.t.c."))
            .collect();
        // A newer commit replaces `c`: applied while `b` still cannot drain.
        advance_until(engine, &target("r3", Some(&three)), &mut waits, waiting);
        let c_now: Vec<String> = world
            .snapshot()
            .running
            .into_keys()
            .filter(|g| g.starts_with("plumber.t.c."))
            .collect();
        assert_eq!(c_now.len(), 1);
        assert!(!c_before.contains(&c_now[0]), "the new c runs: {c_now:?}");
        // Once `b` reads again, the move ends at the newest commit.
        world.inner.lock().unwrap().stuck.clear();
        advance_until(engine, &target("r3", Some(&three)), &mut waits, |a| {
            matches!(a, Advance::Settled { .. })
        });
    });
    let outcomes: Vec<(String, Outcome)> = state
        .history()
        .unwrap()
        .into_iter()
        .map(|h| (h.to, h.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("r1".to_owned(), Outcome::Applied),
            ("r2".to_owned(), Outcome::Superseded),
            ("r3".to_owned(), Outcome::Applied)
        ]
    );
}

#[test]
fn a_missing_source_topic_makes_only_its_step_wait() {
    let with_other = topology(&[
        ("in", "kind: source\ntopic: in\n".to_owned()),
        ("late", "kind: source\ntopic: late\n".to_owned()),
        ("a", "kind: processor\ninput: in\njq: '.'\n".to_owned()),
        ("l", "kind: processor\ninput: late\njq: '.'\n".to_owned()),
        ("out", "kind: sink\ntopic: out\ninput: [a, l]\n".to_owned()),
    ]);
    let world = World::with_user_topics();
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let r1 = target("r1", Some(&with_other));
    with_engine(&world, &state, |engine| {
        let mut waits = Waits::default();
        let Advance::Waiting {
            waits: waiting_for, ..
        } = advance_until(engine, &r1, &mut waits, |a| {
            matches!(a, Advance::Waiting { .. })
        })
        else {
            unreachable!()
        };
        assert!(
            waiting_for
                .iter()
                .any(|w| w.reason.contains("topic late does not exist")),
            "{waiting_for:#?}"
        );
        let running: Vec<String> = world
            .snapshot()
            .running
            .into_values()
            .map(|s| s.step)
            .collect();
        assert_eq!(running, ["a"], "a runs while l waits for its topic");
        world
            .inner
            .lock()
            .unwrap()
            .topics
            .insert("late".into(), vec![0]);
        // The step starts by itself once its topic exists.
        advance_until(engine, &r1, &mut waits, |a| {
            matches!(a, Advance::Settled { .. })
        });
    });
    assert_eq!(world.snapshot().running.len(), 2);
}

/// A join's table topic is waited for like a source: the join starts once it exists (the
/// processor would refuse to start without it).
#[test]
fn a_join_waits_for_its_table_topic() {
    let joining = topology(&[
        ("ord", "kind: source\ntopic: in\n".to_owned()),
        ("tbl", "kind: source\ntopic: late\n".to_owned()),
        (
            "j",
            "kind: processor\ninput: [ord, tbl]\nsql: SELECT o.x, t.y FROM ord o JOIN tbl t ON o.k = t._key\n"
                .to_owned(),
        ),
        ("out", "kind: sink\ntopic: out\ninput: j\n".to_owned()),
    ]);
    let world = World::with_user_topics();
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let r1 = target("r1", Some(&joining));
    with_engine(&world, &state, |engine| {
        let mut waits = Waits::default();
        let Advance::Waiting {
            waits: waiting_for, ..
        } = advance_until(engine, &r1, &mut waits, |a| {
            matches!(a, Advance::Waiting { .. })
        })
        else {
            unreachable!()
        };
        assert!(
            waiting_for
                .iter()
                .any(|w| w.reason.contains("topic late does not exist")),
            "{waiting_for:#?}"
        );
        assert!(world.snapshot().running.is_empty());
        world
            .inner
            .lock()
            .unwrap()
            .topics
            .insert("late".into(), vec![0]);
        advance_until(engine, &r1, &mut waits, |a| {
            matches!(a, Advance::Settled { .. })
        });
    });
    let running: Vec<String> = world
        .snapshot()
        .running
        .into_values()
        .map(|s| s.step)
        .collect();
    assert_eq!(running, ["j"]);
}

#[test]
fn a_removed_topology_keeps_the_memory_of_its_lives() {
    let one = revision(1, 1, false);
    let (world, _dir, state) = deployed(&one);
    with_engine(&world, &state, |engine| {
        let mut waits = Waits::default();
        advance_until(engine, &target("r2", None), &mut waits, |a| {
            *a == Advance::Removed
        });
        assert!(world.snapshot().running.is_empty());
        let record = state.load("t").unwrap();
        assert!(record.is_retired(), "{record:#?}");
        let kept: Vec<String> = world.snapshot().topics.into_keys().collect();
        assert!(
            kept.iter()
                .all(|t| ["in", "out", "out2"].contains(&t.as_str()) || t.ends_with(".dlq")),
            "internal topics are deleted, the users' and dead letters kept: {kept:?}"
        );
        assert!(
            matches!(state.history().unwrap().last(), Some(h) if h.to == "r2"),
            "the removal is in the history"
        );
        // Back again: its identities run in new lives, never under the names that ran here.
        advance_until(engine, &target("r3", Some(&one)), &mut waits, |a| {
            matches!(a, Advance::Settled { .. })
        });
    });
    let groups: Vec<String> = world.snapshot().running.into_keys().collect();
    assert!(groups.iter().all(|g| g.ends_with(".2")), "{groups:?}");
}

#[test]
fn a_commit_that_leaves_the_topology_as_it_runs_writes_nothing() {
    let one = revision(1, 1, false);
    let (world, _dir, state) = deployed(&one);
    let finished = Mutex::new(Vec::new());
    let on_event = |event: Event<'_>| {
        if let Event::Finished { to, moved, .. } = event {
            finished.lock().unwrap().push((to.to_owned(), moved));
        }
    };
    let two = revision(2, 1, false);
    with_engine_seeing(&world, &state, &on_event, |engine| {
        let mut waits = Waits::default();
        let settled = engine
            .advance(&target("r2", Some(&one)), &mut waits)
            .unwrap();
        assert_eq!(settled, Advance::Settled { moved: false });
        assert_eq!(world.faults.count(Site::Save), 0, "nothing is saved");
        assert_eq!(state.load("t").unwrap().commit.as_deref(), Some("r1"));
        // A commit that changes it moves it, and the next unrelated commit leaves it there.
        advance_until(engine, &target("r3", Some(&two)), &mut waits, |a| {
            matches!(a, Advance::Settled { .. })
        });
        let saves = world.faults.count(Site::Save);
        assert!(saves > 0);
        let settled = engine
            .advance(&target("r4", Some(&two)), &mut waits)
            .unwrap();
        assert_eq!(settled, Advance::Settled { moved: false });
        assert_eq!(world.faults.count(Site::Save), saves);
    });
    assert_eq!(state.load("t").unwrap().commit.as_deref(), Some("r3"));
    let history: Vec<String> = state.history().unwrap().into_iter().map(|h| h.to).collect();
    assert_eq!(history, ["r1", "r3"], "only moves are history");
    assert_eq!(
        *finished.lock().unwrap(),
        [
            ("r1".to_owned(), false),
            ("r3".to_owned(), true),
            ("r3".to_owned(), false)
        ],
        "a settle that moved nothing names the commit that runs"
    );
}

#[test]
fn a_running_processor_gone_from_the_runtime_is_started_again_where_it_was() {
    let one = revision(1, 1, false);
    let (world, _dir, state) = deployed(&one);
    // Injected: one running processor vanishes outside the engine (on Kubernetes, its
    // StatefulSet and ScaledObject deleted while no daemon ran), its committed offsets kept.
    let (group, before) = {
        let mut inner = world.inner.lock().unwrap();
        inner.consume();
        let group = inner.running.keys().next().unwrap().clone();
        let spec = inner.running.remove(&group).unwrap();
        inner.ever_groups.remove(&group);
        (group, spec)
    };
    let committed = world.snapshot().committed[&group].clone();
    with_engine(&world, &state, |engine| {
        let mut waits = Waits::default();
        let settled = engine
            .advance(&target("r1", Some(&one)), &mut waits)
            .unwrap();
        assert_eq!(settled, Advance::Settled { moved: false });
    });
    let after = world.snapshot();
    let again = after.running.get(&group).expect("started again");
    assert_eq!(
        (
            again.identity,
            &again.inputs,
            &again.outputs,
            &again.transform
        ),
        (
            before.identity,
            &before.inputs,
            &before.outputs,
            &before.transform
        )
    );
    assert_eq!(
        after.committed[&group], committed,
        "it resumes where it was"
    );
    assert_eq!(state.load("t").unwrap().commit.as_deref(), Some("r1"));
}

/// A preview of `t` (its step `a` changed) as the daemon makes it: `t.pr-1`, writing the
/// shadow topics of the sinks it reaches.
fn preview_of_a() -> plumber::plan::preview::Preview {
    let running = revision(1, 1, false);
    let merged = revision(2, 1, false);
    plumber::plan::preview::preview(
        &merged,
        &plumber::plan::Deployment::of(&running),
        &plumber::spec::RepoSettings::default().clusters,
        "pr-1",
    )
    .unwrap()
    .expect("a changed: a preview")
}

/// Drives the engine of preview `name` to `preview` (commit `p1`: `cursor` 0), then to its
/// removal (1), up to target `until` (excluded); false when the daemon crashed.
fn preview_daemon(
    world: &World,
    dir: &StateDir,
    name: &str,
    preview: &Topology,
    cursor: &mut usize,
    until: usize,
) -> bool {
    with_engine_named(world, dir, name, &|_| {}, |engine| {
        let mut waits = Waits::default();
        let targets = [target("p1", Some(preview)), target("gone", None)];
        let mut spins = 0;
        while let Some(target) = targets.get(*cursor).filter(|_| *cursor < until) {
            let advanced = engine.advance(target, &mut waits);
            if world.faults.crashed.load(Ordering::SeqCst) {
                return false;
            }
            match advanced {
                Ok(Advance::Settled { .. } | Advance::Removed) => *cursor += 1,
                Ok(Advance::Progressed) => {}
                Ok(Advance::Waiting { waits, .. }) => {
                    spins += 1;
                    assert!(spins < 1000, "the preview waits forever: {waits:#?}");
                }
                Err(error) => {
                    assert!(error.is_retryable(), "{error}");
                    spins += 1;
                    assert!(spins < 1000, "the preview fails forever: {error}");
                }
            }
        }
        true
    })
}

/// A retired preview leaves nothing on Kafka: its engine made its shadow topics (with the
/// users' sinks' partitions) and, once retired, deleted them and every consumer group its
/// lives had, and a daemon crashed at any call of the retirement ends the same.
#[test]
fn a_retired_preview_leaves_no_shadow_topic_nor_group_and_survives_a_crash_anywhere() {
    let preview = preview_of_a();
    let name = preview.graph.name.clone();
    let deploy = || {
        let world = World::with_user_topics();
        world
            .inner
            .lock()
            .unwrap()
            .topics
            .insert("out".into(), vec![0, 0, 0]);
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        assert!(preview_daemon(
            &world,
            &state,
            &name,
            &preview.graph,
            &mut 0,
            1
        ));
        world.produce("in", 10);
        *world.faults.calls.lock().unwrap() = BTreeMap::new();
        (world, dir, state)
    };
    let (world, _dir, state) = deploy();
    {
        let inner = world.inner.lock().unwrap();
        let shadows: BTreeMap<&String, usize> = preview
            .shadow_topics
            .keys()
            .map(|t| (t, inner.topics.get(t).map_or(0, Vec::len)))
            .collect();
        assert_eq!(
            shadows,
            BTreeMap::from([
                (&"out.preview.pr-1".to_owned(), 3),
                (&"out2.preview.pr-1".to_owned(), 1)
            ]),
            "each shadow topic exists with its sink's partitions"
        );
        assert!(!inner.running.is_empty());
    }
    assert!(preview_daemon(
        &world,
        &state,
        &name,
        &preview.graph,
        &mut 1,
        2
    ));
    let calls: Vec<(Site, u32)> = [Site::Kafka, Site::Runtime, Site::Save]
        .into_iter()
        .map(|site| (site, world.faults.count(site)))
        .collect();
    let retired = |world: &World, state: &StateDir| {
        let inner = world.inner.lock().unwrap();
        let own = format!("plumber.{name}.");
        let left: Vec<&String> = inner
            .topics
            .keys()
            .filter(|t| t.starts_with(&own) && !t.ends_with(".dlq") || t.contains(".preview."))
            .chain(inner.committed.keys().filter(|g| g.starts_with(&own)))
            .collect();
        assert_eq!(
            left,
            Vec::<&String>::new(),
            "nothing of the preview is left"
        );
        assert!(inner.running.is_empty());
        assert_eq!(
            ["in", "out", "out2"].map(|t| inner.topics.contains_key(t)),
            [true; 3],
            "the users' topics stay"
        );
        let record = state.load(&name).unwrap();
        assert!(record.is_retired(), "{record:#?}");
        (inner.topics.clone(), record.deployment)
    };
    let reference = retired(&world, &state);
    let mut crashes = 0;
    for crash in every_fault(&calls) {
        let (world, _dir, state) = deploy();
        *world.faults.crash.lock().unwrap() = Some(crash);
        let mut cursor = 1;
        assert!(
            !preview_daemon(&world, &state, &name, &preview.graph, &mut cursor, 2),
            "the daemon ran to the end without {crash:?}"
        );
        world.faults.crashed.store(false, Ordering::SeqCst);
        *world.faults.crash.lock().unwrap() = None;
        assert!(preview_daemon(
            &world,
            &state,
            &name,
            &preview.graph,
            &mut cursor,
            2
        ));
        assert_eq!(retired(&world, &state), reference, "after {crash:?}");
        crashes += 1;
    }
    assert!(crashes > 10, "{crashes} crashes");
}
