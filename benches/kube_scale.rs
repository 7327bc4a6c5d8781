//! The Kubernetes runtime at scale (issue 16): N topologies × 20 steps on the in-memory API
//! server of `plumber_testkit::kube_api`, driven by the real cutover engine, `KubeRuntime`
//! and `TopologyStore` through a real `kube::Client`; Kafka is an in-memory [`Admin`].
//!
//! Per N (default 100 and 1,000, each `BENCH_REPS` times on a fresh API server):
//! 1. **first sync**: every topology from nothing to settled, one after the other;
//! 2. **idle**: what the daemon's observer asks of the API every look (`repair`,
//!    `processors`, `topologies`), the first look (comparing every object) apart from `BENCH_LOOKS`
//!    ordinary ones;
//! 3. **commits**, the daemon's way (the follower lists the topologies, then every
//!    topology's worker advances on its own thread): (a) one commit changing 10 steps of
//!    one topology, (b) one changing one mid-tree step in each of 10 topologies (the plan
//!    benchmark's commit, which replaces 6 processors in each);
//! 4. **restart**: a second daemon connecting to what runs;
//! 5. **memory**: the live heap of the daemon's side, the graphs and the fake server apart.
//!
//! Writes `BENCH_OUT` (default `bench/results/kube.md`), keeping a `## Findings` section
//! already there. Run through `bench/kube.sh`. `BENCH_SIZES` (default `100,1000`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a broken benchmark setup stops loudly

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use kube::client::Body;
use peak_alloc::PeakAlloc;
use plumber::cutover::{Advance, CutoverConfig, Engine, Event, Target, Waits};
use plumber::graph::Topology;
use plumber::kafka::{self, Admin};
use plumber::plan::{Action, PartitionOffset};
use plumber::runtime::kube::apply::{KubeConfig, KubeRuntime};
use plumber::runtime::kube::crd;
use plumber::runtime::kube::render::{RenderConfig, Source};
use plumber::runtime::{Cluster, Delivery, Runtime, Settings};
use plumber::spec::{FileContent, SourceFile};
use plumber::store::CutoverStore;
use plumber::store::topology::TopologyStore;
use plumber_testkit::Usage;
use plumber_testkit::kube_api::{
    FakeApi, FakeBody, FakeService, KEDA_SCALED_OBJECT_CRD, KEDA_TRIGGER_AUTHENTICATION_CRD,
    PodStart, RecordedRequest,
};

#[path = "support/repo_gen.rs"]
#[allow(dead_code)] // only its step files are used here, not the git repository
mod repo_gen;

/// Counts every allocation: the fake API server shares the process, and only the heap
/// tells its memory from the daemon's (RSS cannot be given back to a milestone).
#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const NS: &str = "data";
/// The mid-tree processor the plan benchmark's commit changes (with its 5 descendants).
const SPREAD_STEP: usize = 3;
/// 10 step files whose change replaces exactly those 10 processors: p08 and its only child
/// p17, and the leaves p09–p16.
const ONE_TOPOLOGY_STEPS: [usize; 10] = [8, 9, 10, 11, 12, 13, 14, 15, 16, 17];
/// How often the daemon's observer looks (`DaemonConfig::observe_interval`).
const OBSERVE_INTERVAL: f64 = 2.0;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

// ---- the meter in front of the fake API server ----

/// Time spent inside the fake API server and bytes each way, over every client made by
/// [`Meter::client`].
#[derive(Clone, Default)]
struct Meter(Arc<MeterCounts>);

#[derive(Default)]
struct MeterCounts {
    server_nanos: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    /// The heap's peak outside the fake server since [`Meter::track_client_peak`]: the
    /// allocator's peak is read as a request goes in and reset as its answer comes out, so
    /// the server's own building of an answer is left out (one thread at a time only).
    client_peak: AtomicU64,
    /// Bytes received by `verb resource[/subresource]`, since [`Meter::take_received`].
    received_by: Mutex<BTreeMap<String, u64>>,
}

/// `list deployments`, `replace topologies/status`: what a request to a namespaced path of
/// kube's URL scheme does, from its method and path.
fn request_kind(method: &http::Method, path: &str) -> String {
    let rest = path
        .split_once("/namespaces/")
        .and_then(|(_, r)| r.split_once('/'))
        .map_or("", |(_, r)| r);
    let mut parts = rest.split('/');
    let plural = parts.next().unwrap_or("-");
    let named = parts.next().is_some();
    let sub = parts.next().map(|s| format!("/{s}")).unwrap_or_default();
    let verb = match (method.as_str(), named) {
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("PUT", _) => "replace",
        ("PATCH", _) => "apply",
        ("POST", _) => "create",
        ("DELETE", _) => "delete",
        _ => "other",
    };
    format!("{verb} {plural}{sub}")
}

#[derive(Debug, Clone, Copy, Default)]
struct MeterSnapshot {
    server: f64,
    sent: u64,
    received: u64,
}

impl Meter {
    /// A client of `fake` through the meter; call it inside the tokio runtime that drives it.
    fn client(&self, fake: &FakeApi) -> kube::Client {
        kube::Client::new(
            Metered {
                service: fake.service(),
                meter: self.clone(),
            },
            NS,
        )
    }

    fn track_client_peak(&self) {
        HEAP.reset_peak_usage();
        self.0.client_peak.store(0, Ordering::Relaxed);
    }

    fn client_peak(&self) -> usize {
        let peak = HEAP.peak_usage() as u64;
        self.0
            .client_peak
            .fetch_max(peak, Ordering::Relaxed)
            .max(peak) as usize
    }

    fn take_received(&self) -> BTreeMap<String, u64> {
        std::mem::take(&mut self.0.received_by.lock().unwrap())
    }

    fn snapshot(&self) -> MeterSnapshot {
        MeterSnapshot {
            server: self.0.server_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            sent: self.0.sent.load(Ordering::Relaxed),
            received: self.0.received.load(Ordering::Relaxed),
        }
    }

    fn since(&self, before: MeterSnapshot) -> MeterSnapshot {
        let now = self.snapshot();
        MeterSnapshot {
            server: now.server - before.server,
            sent: now.sent - before.sent,
            received: now.received - before.received,
        }
    }
}

#[derive(Clone)]
struct Metered {
    service: FakeService,
    meter: Meter,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for Metered {
    type Response = http::Response<FakeBody>;
    type Error = tower::BoxError;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let mut service = self.service.clone();
        let meter = self.meter.clone();
        // A watch's answer streams until it times out: passed through, unmetered.
        if request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
        {
            return Box::pin(async move { service.call(request).await });
        }
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let kind = request_kind(&parts.method, parts.uri.path());
            let bytes = body.collect_bytes().await?;
            meter
                .0
                .sent
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            let request = http::Request::from_parts(parts, Body::from(bytes));
            meter
                .0
                .client_peak
                .fetch_max(HEAP.peak_usage() as u64, Ordering::Relaxed);
            // The fake answers synchronously inside this future: its wall time is its CPU.
            let started = Instant::now();
            let response = service.call(request).await?;
            let (parts, body) = response.into_parts();
            let bytes = body.collect_bytes().await?;
            HEAP.reset_peak_usage();
            meter
                .0
                .server_nanos
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            meter
                .0
                .received
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            *meter.0.received_by.lock().unwrap().entry(kind).or_default() += bytes.len() as u64;
            Ok(http::Response::from_parts(
                parts,
                FakeBody::full(bytes.to_vec()),
            ))
        })
    }
}

// ---- Kafka, in memory ----

/// Topics exist once created, committed offsets are kept, every topic is empty (so every
/// lag is 0 and drains end at once), and a stopped group has no members.
#[derive(Default)]
struct Kafka {
    state: Mutex<KafkaState>,
    calls: AtomicU64,
}

#[derive(Default)]
struct KafkaState {
    topics: BTreeMap<String, u32>,
    committed: BTreeMap<String, Vec<PartitionOffset>>,
}

impl Kafka {
    /// The users' topics of `n` topologies: what the data engineers made before.
    fn with_user_topics(n: usize) -> Kafka {
        let kafka = Kafka::default();
        let mut state = kafka.state.lock().unwrap();
        for t in 0..n {
            state.topics.insert(format!("in-{t}"), 6);
            state.topics.insert(format!("out-{t}"), 6);
        }
        drop(state);
        kafka
    }

    fn with<T>(&self, f: impl FnOnce(&mut KafkaState) -> T) -> T {
        self.calls.fetch_add(1, Ordering::Relaxed);
        f(&mut self.state.lock().unwrap())
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

fn no_such(topic: &str) -> kafka::Error {
    kafka::Error::NoSuchTopic {
        topic: topic.to_owned(),
    }
}

impl Admin for Kafka {
    fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        _: Option<u32>,
        _: &BTreeMap<String, String>,
    ) -> kafka::Result<()> {
        self.with(|s| match s.topics.get(topic) {
            Some(&found) if found != partitions => Err(kafka::Error::PartitionMismatch {
                topic: topic.to_owned(),
                found: found as i32,
                wanted: partitions as i32,
            }),
            Some(_) => Ok(()),
            None => {
                s.topics.insert(topic.to_owned(), partitions);
                Ok(())
            }
        })
    }

    fn delete_topic(&self, topic: &str) -> kafka::Result<()> {
        self.with(|s| s.topics.remove(topic));
        Ok(())
    }

    fn partitions(&self, topic: &str) -> kafka::Result<i32> {
        self.with(|s| s.topics.get(topic).map(|&p| p as i32))
            .ok_or_else(|| no_such(topic))
    }

    fn watermarks(&self, topic: &str) -> kafka::Result<Vec<(i64, i64)>> {
        self.with(|s| s.topics.get(topic).map(|&p| vec![(0, 0); p as usize]))
            .ok_or_else(|| no_such(topic))
    }

    fn committed(&self, group: &str, topics: &[String]) -> kafka::Result<Vec<PartitionOffset>> {
        Ok(self.with(|s| {
            s.committed
                .get(group)
                .map(|offsets| {
                    offsets
                        .iter()
                        .filter(|o| topics.contains(&o.topic))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
        }))
    }

    fn commit(&self, group: &str, offsets: &[PartitionOffset]) -> kafka::Result<()> {
        self.with(|s| {
            let kept = s.committed.entry(group.to_owned()).or_default();
            kept.retain(|o| {
                !offsets
                    .iter()
                    .any(|n| n.topic == o.topic && n.partition == o.partition)
            });
            kept.extend(offsets.iter().cloned());
        });
        Ok(())
    }

    fn delete_group(&self, group: &str) -> kafka::Result<()> {
        self.with(|s| {
            s.committed.remove(group);
        });
        Ok(())
    }

    fn supports_transactions(&self) -> kafka::Result<bool> {
        Ok(true)
    }

    fn members(&self, _: &str) -> kafka::Result<Option<usize>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(Some(0))
    }
}

// ---- requests and events ----

/// Requests by `verb resource[/subresource]` (`apply deployments`, `replace
/// topologies/status`).
#[derive(Debug, Clone, Default)]
struct Counts(BTreeMap<String, u64>);

/// The verbs reported in tables, in their order.
const VERBS: [&str; 7] = [
    "apply", "get", "list", "replace", "create", "delete", "patch",
];

impl Counts {
    fn add(&mut self, requests: &[RecordedRequest]) {
        for request in requests {
            let mut key = format!(
                "{} {}",
                request.verb(),
                request.resource().unwrap_or("(other)")
            );
            if let Some(sub) = request.subresource() {
                key.push('/');
                key.push_str(sub);
            }
            *self.0.entry(key).or_default() += 1;
        }
    }

    fn total(&self) -> u64 {
        self.0.values().sum()
    }

    fn verb(&self, verb: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.split(' ').next() == Some(verb))
            .map(|(_, n)| n)
            .sum()
    }
}

fn action_kind(action: &Action) -> &'static str {
    match action {
        Action::CreateTopic { .. } => "create-topic",
        Action::StartProcessor(_) => "start-processor",
        Action::StartWarm(_) => "start-warm",
        Action::HandOff { .. } => "hand-off",
        Action::UpdateProcessor { .. } => "update-processor",
        Action::DrainProcessor { .. } => "drain-processor",
        Action::StopProcessor { .. } => "stop-processor",
        Action::DeleteTopic { .. } => "delete-topic",
        Action::DeleteGroups { .. } => "delete-groups",
    }
}

/// What the engines reported, and when.
#[derive(Default)]
struct Events(Mutex<EventLog>);

#[derive(Default)]
struct EventLog {
    actions: BTreeMap<&'static str, u64>,
    first_action: BTreeMap<String, Instant>,
    moved: BTreeMap<String, Instant>,
}

impl Events {
    fn record(&self, topology: &str, event: &Event<'_>) {
        let mut log = self.0.lock().unwrap();
        match event {
            Event::Action { action, .. } => {
                *log.actions.entry(action_kind(action)).or_default() += 1;
                log.first_action
                    .entry(topology.to_owned())
                    .or_insert_with(Instant::now);
            }
            Event::Finished {
                started_at: Some(_),
                ..
            } => {
                log.moved.insert(topology.to_owned(), Instant::now());
            }
            _ => {}
        }
    }

    fn take(&self) -> EventLog {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

// ---- the daemon's side ----

struct Daemon {
    runtime: KubeRuntime,
    store: TopologyStore,
    /// The lease term this replica holds: one for the whole run but for the takeover the
    /// first full look stands for.
    term: Arc<AtomicU64>,
    /// The runtime the clients' connections run on, as `plumber daemon` has one.
    _tokio: tokio::runtime::Runtime,
}

impl Daemon {
    fn connect(fake: &FakeApi, meter: &Meter) -> Daemon {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let client = || {
            let _inside = tokio.enter();
            meter.client(fake)
        };
        let render = RenderConfig {
            namespace: NS.into(),
            processor_image: "ghcr.io/plumber-dev/plumber-processor:0.1.0".into(),
            pull_policy: None,
            owner: None,
        };
        let term = Arc::new(AtomicU64::new(1));
        let held = {
            let term = term.clone();
            move || Some(term.load(Ordering::SeqCst))
        };
        let runtime =
            KubeRuntime::connect(client(), tokio.handle().clone(), KubeConfig::new(render))
                .expect("the runtime connects")
                .fenced_by(Arc::new(held.clone()));
        let store = TopologyStore::new(
            client(),
            tokio.handle().clone(),
            NS,
            Source {
                repository: "https://git.example.com/data/topologies.git".into(),
                git_ref: "main".into(),
            },
            Arc::new(|| true),
        )
        .expect("the store starts")
        .with_cache(runtime.topology_cache())
        .with_term(Arc::new(held));
        Daemon {
            runtime,
            store,
            term,
            _tokio: tokio,
        }
    }
}

/// The cluster of every topology, with credentials as `deploy/` sets it up: each processor
/// is a TriggerAuthentication, a StatefulSet and a ScaledObject.
fn cluster() -> Cluster {
    Cluster {
        bootstrap: "kafka.data.svc:9093".into(),
        properties: BTreeMap::from([
            ("security.protocol".into(), "SASL_SSL".into()),
            ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
        ]),
        credentials: Some("kafka-credentials".into()),
    }
}

/// How the daemon starts processors (`reconcile.rs`).
fn settings() -> Settings {
    Settings {
        delivery: Some(Delivery::ExactlyOnce),
        record_timeout: Some(60),
        assignor: None,
    }
}

/// The graphs of topologies `indices`, each with the processors `bumped` of it changed.
fn graphs(indices: impl Iterator<Item = usize>, bumped: &[usize]) -> Vec<Topology> {
    let files: Vec<SourceFile> = indices
        .flat_map(|t| repo_gen::step_files(t, bumped))
        .map(|(path, content)| SourceFile {
            path,
            content: FileContent::Bytes(content.into_bytes()),
        })
        .collect();
    let validation = plumber::validate(&files);
    validation
        .topologies
        .unwrap_or_else(|| panic!("invalid: {:?}", validation.diagnostics.first()))
}

/// Advances one topology until it settles; how often it had to wait.
fn drive(engine: &Engine<'_>, target: &Target<'_>) -> usize {
    let mut waits = Waits::default();
    let mut waited = 0;
    loop {
        match engine
            .advance(target, &mut waits)
            .expect("the store answers")
        {
            Advance::Settled { .. } | Advance::Removed => return waited,
            Advance::Progressed => {}
            Advance::Waiting { until, waits } => {
                waited += 1;
                assert!(waited < 50, "{} keeps waiting: {waits:?}", engine.topology);
                std::thread::sleep(until.saturating_duration_since(Instant::now()));
            }
        }
    }
}

// ---- samples ----

#[derive(Debug, Default, Clone)]
struct Phase {
    wall: f64,
    /// Process CPU (the fake server's included).
    cpu: f64,
    meter: MeterSnapshot,
    requests: Counts,
    kafka: u64,
    actions: BTreeMap<&'static str, u64>,
    waited: usize,
}

#[derive(Debug, Default, Clone)]
struct Look {
    wall: f64,
    cpu: f64,
    repair: f64,
    processors: f64,
    topologies: f64,
    meter: MeterSnapshot,
    requests: Counts,
    received_by: BTreeMap<String, u64>,
    /// The live heap's peak during the look over its level before, outside the fake server
    /// (the answers' bytes as received included).
    peak_heap: f64,
}

#[derive(Debug, Default, Clone)]
struct Commit {
    phase: Phase,
    /// The commit → the follower's list of the topologies done (the workers start then).
    handed_over: f64,
    /// The follower's lists to keep checkouts, after the workers (see [`World::commit`]).
    bookkeeping: f64,
    bookkeeping_requests: Counts,
    /// Per changed topology: commit handed over → its first cutover action, and → settled.
    to_start: Vec<f64>,
    to_settled: Vec<f64>,
}

#[derive(Debug, Default, Clone)]
struct Run {
    n: usize,
    restart_received_by: BTreeMap<String, u64>,
    sync: Phase,
    full_look: Look,
    looks: Vec<Look>,
    /// Process CPU (the fake's included) over the ordinary looks.
    idle_cpu: f64,
    one_step: Commit,
    spread: Commit,
    restart: Phase,
    restart_heap: f64,
    rss_start: f64,
    rss_synced: f64,
    rss_idle: f64,
    rss_peak: f64,
    heap_daemon: f64,
    /// Of `heap_daemon`: what the store keeps beside the caches (its last-seen Topologies).
    heap_store: f64,
    heap_graphs: f64,
    heap_fake: f64,
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// CPU time of the whole process (exited threads included), at clock-tick resolution.
fn process_cpu() -> f64 {
    Usage::of(std::process::id()).cpu_seconds
}

fn rss_mb() -> (f64, f64) {
    let usage = Usage::of(std::process::id());
    (
        usage.rss_kb as f64 / 1024.0,
        usage.peak_rss_kb as f64 / 1024.0,
    )
}

/// One look of the observer; `first`: the replica's first in a new lease term, whose repair
/// lists what runs first and after which every record is read again (timed with it).
fn look(daemon: &Daemon, fake: &FakeApi, meter: &Meter, first: bool) -> Look {
    fake.clear_requests();
    meter.take_received();
    let before = meter.snapshot();
    let heap_before = HEAP.current_usage();
    meter.track_client_peak();
    let cpu = process_cpu();
    let started = Instant::now();
    if first {
        daemon.term.fetch_add(1, Ordering::SeqCst);
    }
    daemon.runtime.repair().expect("repair");
    let repair = started.elapsed().as_secs_f64();
    let t = Instant::now();
    daemon.runtime.processors().expect("processors");
    let processors = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let listed = daemon.store.topologies().expect("topologies");
    if first {
        // In a new term the engine's first load of each record reads it again (another
        // replica may have written it): the rest of a takeover's cost.
        for name in listed.keys() {
            daemon.store.load(name).expect("a record");
        }
    }
    let topologies = t.elapsed().as_secs_f64();
    let wall = started.elapsed().as_secs_f64();
    let cpu = process_cpu() - cpu;
    let peak_heap = mb(meter.client_peak().saturating_sub(heap_before));
    let mut requests = Counts::default();
    requests.add(&fake.take_requests());
    Look {
        wall,
        cpu,
        repair,
        processors,
        topologies,
        meter: meter.since(before),
        requests,
        received_by: meter.take_received(),
        peak_heap,
    }
}

struct World<'a> {
    fake: &'a FakeApi,
    meter: &'a Meter,
    kafka: &'a Kafka,
    daemon: &'a Daemon,
    config: &'a CutoverConfig,
    cluster: &'a Cluster,
    events: &'a Events,
}

impl World<'_> {
    fn engine<'a>(&'a self, name: &'a str, on_event: &'a (dyn Fn(Event<'_>) + Sync)) -> Engine<'a> {
        Engine {
            topology: name,
            admin: self.kafka,
            runtime: &self.daemon.runtime,
            store: &self.daemon.store,
            config: self.config,
            on_event,
        }
    }

    fn target<'a>(&'a self, commit: &'a str, topology: &'a Topology) -> Target<'a> {
        Target {
            commit,
            topology: Some(topology),
            cluster: Some(self.cluster),
            settings: settings(),
        }
    }

    /// Every topology from nothing to `commit`, one after the other.
    fn first_sync(&self, commit: &str, revision: &[&Topology]) -> Phase {
        self.fake.clear_requests();
        let before = self.meter.snapshot();
        let kafka = self.kafka.calls();
        let mut phase = Phase::default();
        for topology in revision {
            let on_event = |e: Event<'_>| self.events.record(&topology.name, &e);
            let engine = self.engine(&topology.name, &on_event);
            let cpu = process_cpu();
            let started = Instant::now();
            phase.waited += drive(&engine, &self.target(commit, topology));
            phase.wall += started.elapsed().as_secs_f64();
            phase.cpu += process_cpu() - cpu;
            // Outside the clock: the log would otherwise hold every request's body.
            phase.requests.add(&self.fake.take_requests());
        }
        phase.meter = self.meter.since(before);
        phase.kafka = self.kafka.calls() - kafka;
        phase.actions = self.events.take().actions;
        phase
    }

    /// A new commit as the daemon takes it: the follower lists the topologies and hands the
    /// revision to every topology's worker (a thread each), then lists the topologies and
    /// the processors again to keep their checkouts, while the workers go.
    fn commit(&self, commit: &str, revision: &[&Topology], changed: &BTreeSet<String>) -> Commit {
        self.fake.clear_requests();
        self.events.take();
        let before = self.meter.snapshot();
        let kafka = self.kafka.calls();
        let cpu = process_cpu();
        let started = Instant::now();
        // `follow::desire`: the topologies with state, before any worker gets the revision.
        self.daemon.store.topologies().expect("topologies");
        let handed_over = started.elapsed().as_secs_f64();
        let waited = std::thread::scope(|scope| {
            let workers: Vec<_> = revision
                .iter()
                .map(|topology| {
                    scope.spawn(move || {
                        let on_event = |e: Event<'_>| self.events.record(&topology.name, &e);
                        let engine = self.engine(&topology.name, &on_event);
                        drive(&engine, &self.target(commit, topology))
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("a worker panicked"))
                .sum()
        });
        let wall = started.elapsed().as_secs_f64();
        let cpu = process_cpu() - cpu;
        let log = self.events.take();
        // `follow::collect_checkouts` lists the topologies and the processors while the
        // workers go. Here it runs after them: the fake server answers one request at a time
        // under one lock, so its slow lists would hold up every worker's request, which a
        // real API server does not do.
        let mut requests = Counts::default();
        requests.add(&self.fake.take_requests());
        let bookkeeping_started = Instant::now();
        self.daemon.store.topologies().expect("topologies");
        self.daemon.runtime.processors().expect("processors");
        let bookkeeping = bookkeeping_started.elapsed().as_secs_f64();
        let mut bookkeeping_requests = Counts::default();
        bookkeeping_requests.add(&self.fake.take_requests());
        let since = |at: Option<&Instant>| {
            at.expect("a changed topology moved")
                .duration_since(started)
                .as_secs_f64()
        };
        Commit {
            handed_over,
            bookkeeping,
            bookkeeping_requests,
            to_start: changed
                .iter()
                .map(|t| since(log.first_action.get(t)))
                .collect(),
            to_settled: changed.iter().map(|t| since(log.moved.get(t))).collect(),
            phase: Phase {
                wall,
                cpu,
                meter: self.meter.since(before),
                requests,
                kafka: self.kafka.calls() - kafka,
                actions: log.actions,
                waited,
            },
        }
    }
}

fn commit_id(digit: char) -> String {
    std::iter::repeat_n(digit, 40).collect()
}

fn run(n: usize, looks: usize, look_budget: Duration, controller: bool) -> Run {
    let mut out = Run {
        n,
        ..Run::default()
    };
    out.rss_start = rss_mb().0;
    let heap_start = HEAP.current_usage();

    let base = graphs(0..n, &[]);
    let heap_graphs_only = HEAP.current_usage();
    let mut fake = FakeApi::new();
    if controller {
        fake = fake.with_workload_controller(PodStart::Ready);
    }
    let fake = fake
        .with_crd_yaml(KEDA_SCALED_OBJECT_CRD)
        .with_crd_yaml(KEDA_TRIGGER_AUTHENTICATION_CRD)
        .with_crd(&serde_json::to_value(crd::definition()).expect("the CRD serializes"));
    let meter = Meter::default();
    let kafka = Kafka::with_user_topics(n);
    let daemon = Daemon::connect(&fake, &meter);
    let config = CutoverConfig::default();
    let cluster = cluster();
    let events = Events::default();
    let world = World {
        fake: &fake,
        meter: &meter,
        kafka: &kafka,
        daemon: &daemon,
        config: &config,
        cluster: &cluster,
        events: &events,
    };

    let (c1, c2, c3) = (commit_id('1'), commit_id('2'), commit_id('3'));
    let revision1: Vec<&Topology> = base.iter().collect();
    eprintln!("  first sync of {n} topologies");
    out.sync = world.first_sync(&c1, &revision1);
    out.rss_synced = rss_mb().0;

    eprintln!("  idle: 1 full look, {looks} ordinary ones");
    // As the observer does when it starts acting: what runs read again, then every object
    // compared with what it should hold.
    out.full_look = look(&daemon, &fake, &meter, true);
    let cpu = process_cpu();
    // Looks get slow with N: stop after the budget, but take at least 3.
    let budget = Instant::now();
    while out.looks.len() < looks && (out.looks.len() < 3 || budget.elapsed() < look_budget) {
        out.looks.push(look(&daemon, &fake, &meter, false));
    }
    out.idle_cpu = process_cpu() - cpu;
    out.rss_idle = rss_mb().0;

    // (a) 10 steps of one topology, in the middle of the repository.
    eprintln!("  commit: 10 steps of one topology");
    let middle = n / 2;
    let one = graphs(std::iter::once(middle), &ONE_TOPOLOGY_STEPS);
    let mut revision2 = revision1.clone();
    revision2[middle] = &one[0];
    let changed = BTreeSet::from([one[0].name.clone()]);
    out.one_step = world.commit(&c2, &revision2, &changed);

    // (b) One mid-tree step in each of 10 topologies spread over the repository.
    eprintln!("  commit: one step in each of 10 topologies");
    let spread_at: Vec<usize> = (0..10)
        .map(|i| (i * n / 10 + 1) % n)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let spread = graphs(spread_at.iter().copied(), &[SPREAD_STEP]);
    let mut revision3 = revision2.clone();
    for (&t, graph) in spread_at.iter().zip(&spread) {
        revision3[t] = graph;
    }
    let changed: BTreeSet<String> = spread.iter().map(|t| t.name.clone()).collect();
    out.spread = world.commit(&c3, &revision3, &changed);

    // A second daemon replica taking over: it reads what runs from the StatefulSets.
    eprintln!("  restart");
    fake.clear_requests();
    meter.take_received();
    let heap_before = HEAP.current_usage();
    let before = meter.snapshot();
    let cpu = process_cpu();
    let started = Instant::now();
    let second = Daemon::connect(&fake, &meter);
    second.store.topologies().expect("topologies");
    out.restart.wall = started.elapsed().as_secs_f64();
    out.restart.cpu = process_cpu() - cpu;
    out.restart.meter = meter.since(before);
    out.restart.requests.add(&fake.take_requests());
    out.restart_received_by = meter.take_received();
    out.restart_heap = mb(HEAP.current_usage().saturating_sub(heap_before));
    drop(second);

    // Live heap by owner: drop the daemon, then the graphs, then the server.
    fake.clear_requests();
    let (_, peak) = rss_mb();
    out.rss_peak = peak;
    let with_daemon = HEAP.current_usage();
    let Daemon {
        runtime,
        store,
        _tokio,
        ..
    } = daemon;
    // The store first: the Topology cache it shares is the runtime's.
    drop(store);
    out.heap_store = mb(with_daemon.saturating_sub(HEAP.current_usage()));
    drop(runtime);
    drop(_tokio);
    let without_daemon = HEAP.current_usage();
    out.heap_daemon = mb(with_daemon.saturating_sub(without_daemon));
    drop(revision3);
    drop(revision2);
    drop(revision1);
    drop(spread);
    drop(one);
    drop(base);
    out.heap_graphs = mb(heap_graphs_only.saturating_sub(heap_start));
    let before_fake = HEAP.current_usage();
    drop(kafka);
    drop(fake);
    out.heap_fake = mb(before_fake.saturating_sub(HEAP.current_usage()));
    out
}

// ---- the report ----

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let len = values.len();
    if len == 0 {
        return f64::NAN;
    }
    if len % 2 == 1 {
        values[len / 2]
    } else {
        (values[len / 2 - 1] + values[len / 2]) / 2.0
    }
}

/// `median [min–max]` of the values, with `digits` decimals.
fn spread(values: &[f64], digits: usize) -> String {
    let mut sorted = values.to_vec();
    let m = median(&mut sorted);
    match (sorted.first(), sorted.last()) {
        (Some(lo), Some(hi)) if sorted.len() > 1 && (hi - lo).abs() > f64::EPSILON => {
            format!("{m:.digits$} [{lo:.digits$}–{hi:.digits$}]")
        }
        _ => format!("{m:.digits$}"),
    }
}

struct Table<'a> {
    sizes: Vec<usize>,
    runs: &'a [Run],
    out: String,
}

impl<'a> Table<'a> {
    fn new(runs: &'a [Run], sizes: &[usize]) -> Table<'a> {
        let mut out = String::from("| measure |");
        for n in sizes {
            let _ = write!(out, " N = {n} |");
        }
        if sizes.len() > 1 {
            let _ = write!(
                out,
                " {} / {} |",
                sizes[sizes.len() - 1],
                sizes[sizes.len() - 2]
            );
        }
        out.push_str("\n|---|");
        for _ in 0..sizes.len() + usize::from(sizes.len() > 1) {
            out.push_str("---:|");
        }
        out.push('\n');
        Table {
            sizes: sizes.to_vec(),
            runs,
            out,
        }
    }

    /// One row: per N the values `of` gives over its runs (flattened), median and range;
    /// then the ratio of the last two sizes' medians.
    fn row(&mut self, name: &str, digits: usize, of: impl Fn(&Run) -> Vec<f64>) {
        let _ = write!(self.out, "| {name} |");
        let mut medians = Vec::new();
        for n in &self.sizes {
            let values: Vec<f64> = self
                .runs
                .iter()
                .filter(|r| r.n == *n)
                .flat_map(&of)
                .collect();
            medians.push(median(&mut values.clone()));
            let _ = write!(self.out, " {} |", spread(&values, digits));
        }
        if medians.len() > 1 {
            let (a, b) = (medians[medians.len() - 2], medians[medians.len() - 1]);
            if a.abs() > f64::EPSILON {
                let _ = write!(self.out, " {:.1}× |", b / a);
            } else {
                self.out.push_str(" – |");
            }
        }
        self.out.push('\n');
    }

    fn one(&mut self, name: &str, digits: usize, of: impl Fn(&Run) -> f64) {
        self.row(name, digits, |r| vec![of(r)]);
    }

    fn finish(self) -> String {
        self.out
    }
}

fn phase_rows(table: &mut Table<'_>, phase: impl Fn(&Run) -> &Phase + Copy, per: bool) {
    table.one("requests", 0, |r| phase(r).requests.total() as f64);
    if per {
        table.one("requests per topology", 1, |r| {
            phase(r).requests.total() as f64 / r.n as f64
        });
    }
    for verb in VERBS {
        let any = table.runs.iter().any(|r| phase(r).requests.verb(verb) > 0);
        if any {
            table.one(&format!("… {verb}"), 0, |r| {
                phase(r).requests.verb(verb) as f64
            });
        }
    }
    table.one("sent to the API, MB", 1, |r| {
        mb(phase(r).meter.sent as usize)
    });
    table.one("received from the API, MB", 1, |r| {
        mb(phase(r).meter.received as usize)
    });
}

fn report(runs: &[Run], sizes: &[usize], reps: usize, looks: usize, controller: bool) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut md = String::new();
    let _ = writeln!(md, "# Kubernetes runtime at scale (issue 16)\n");
    let _ = writeln!(
        md,
        "{}, {cores} cores shared with other work, commit {}. N topologies × 20 steps (a source, a binary tree of 18 jq processors, a sink: the plan benchmark's topologies), {reps} runs per N, each on a fresh in-memory API server; medians [min–max], and the ratio of the medians in the last column. Rerun: `bash bench/kube.sh` (`BENCH_SIZES`, `BENCH_REPS`, `BENCH_LOOKS`, `BENCH_LOOK_SECONDS`).\n",
        git(&["log", "-1", "--format=%cs"]),
        git(&["rev-parse", "--short", "HEAD"]),
    );
    let _ = writeln!(
        md,
        "What runs: the cutover engine, `KubeRuntime` (server-side apply of a TriggerAuthentication, a StatefulSet and a KEDA ScaledObject per processor: the cluster has credentials, as in `deploy/`) and `TopologyStore` (the record in each Topology's status), through real `kube::Client`s, against `plumber_testkit::kube_api::FakeApi` with KEDA's and the Topology CRD's schemas, {} its workload controller. Kafka is in memory: topics exist once created, every lag is 0, a stopped group has no members.\n",
        if controller { "with" } else { "without" }
    );
    let _ = writeln!(
        md,
        "*CPU* is the process's (its clients' runtime, the fake server's included; other work on the machine does not inflate it). *Server share* is the part of the wall time spent inside the fake API server (timed around each request); *daemon-side CPU* is the CPU less that share, the estimate of what the daemon itself costs (its kube clients, serialization, planning, the engine).\n"
    );

    let _ = writeln!(
        md,
        "## First sync (every topology from nothing, one after the other)\n"
    );
    let mut t = Table::new(runs, sizes);
    t.one("wall time, s", 2, |r| r.sync.wall);
    t.one("CPU, s", 2, |r| r.sync.cpu);
    t.one("server share, %", 0, |r| {
        r.sync.meter.server / r.sync.wall * 100.0
    });
    t.one("daemon-side CPU, s", 2, |r| daemon_cpu(&r.sync));
    t.one("daemon-side CPU per topology, ms", 1, |r| {
        daemon_cpu(&r.sync) / r.n as f64 * 1000.0
    });
    phase_rows(&mut t, |r| &r.sync, true);
    t.one("cutover actions", 0, |r| {
        r.sync.actions.values().sum::<u64>() as f64
    });
    t.one("Kafka calls", 0, |r| r.sync.kafka as f64);
    md.push_str(&t.finish());

    for (title, pick) in [
        (
            "A commit changing 10 steps of one topology",
            (|r: &Run| &r.one_step) as fn(&Run) -> &Commit,
        ),
        (
            "A commit changing one mid-tree step in each of 10 topologies (6 processors replaced in each)",
            |r: &Run| &r.spread,
        ),
    ] {
        let _ = writeln!(
            md,
            "\n## {title}\n\nThe daemon's way (`daemon/follow.rs`, `worker.rs`): the follower lists the topologies, then every topology's worker, a thread each, advances its engine to the new commit until it settles. *Cutover start*: the commit → a changed topology's first cutover action (with several changed topologies, all their values pooled); the commit's validation, which comes before (see `bench/results/plan.md`), is not in it. Requests, bytes and CPU are those of the list and the workers; the follower's checkout lists, which the daemon runs beside the workers, run after them here (the fake server serves one request at a time) and are reported apart.\n"
        );
        let mut t = Table::new(runs, sizes);
        t.one("the follower's list of the topologies, ms", 1, |r| {
            pick(r).handed_over * 1000.0
        });
        t.row("to cutover start, ms", 1, |r| {
            pick(r).to_start.iter().map(|s| s * 1000.0).collect()
        });
        t.row("to the changed topology settled, ms", 1, |r| {
            pick(r).to_settled.iter().map(|s| s * 1000.0).collect()
        });
        t.one("until every topology settled, ms", 1, |r| {
            pick(r).phase.wall * 1000.0
        });
        t.one("process CPU, ms", 0, |r| pick(r).phase.cpu * 1000.0);
        phase_rows(&mut t, |r| &pick(r).phase, false);
        t.one("cutover actions", 0, |r| {
            pick(r).phase.actions.values().sum::<u64>() as f64
        });
        t.one("Kafka calls", 0, |r| pick(r).phase.kafka as f64);
        t.one("then the follower's checkout lists, ms", 0, |r| {
            pick(r).bookkeeping * 1000.0
        });
        t.one("… requests", 0, |r| {
            pick(r).bookkeeping_requests.total() as f64
        });
        md.push_str(&t.finish());
    }

    let _ = writeln!(
        md,
        "\n## Idle: one look of the observer\n\nWhat `daemon/observe.rs` asks of the API every {OBSERVE_INTERVAL:.0} s: `runtime.repair()`, `runtime.processors()`, `store.topologies()` (not its Kafka lag reads). All three read the runtime's watch-fed caches; the first look in a new lease term (the runtime's first change in it) begins by listing what runs again (\"resync\" below): it lists the StatefulSets and ScaledObjects and compares every one with what it should hold (rendering each processor again), and every Topology's record is read again, as the engine's first load of each does in a new term; an ordinary look compares only those whose `resourceVersion` moved, reading each from the API (the caches keep no spec; none moves here: no controller or KEDA writes); watch traffic is not metered. The ordinary looks are {looks} per run (fewer once they took `BENCH_LOOK_SECONDS`, 60 s by default, but at least 3), each a sample.\n"
    );
    let mut t = Table::new(runs, sizes);
    t.row("ordinary look: wall time, ms", 1, |r| {
        r.looks.iter().map(|l| l.wall * 1000.0).collect()
    });
    t.row("… repair(), ms", 1, |r| {
        r.looks.iter().map(|l| l.repair * 1000.0).collect()
    });
    t.row("… processors(), ms", 1, |r| {
        r.looks.iter().map(|l| l.processors * 1000.0).collect()
    });
    t.row("… topologies(), ms", 1, |r| {
        r.looks.iter().map(|l| l.topologies * 1000.0).collect()
    });
    t.row("CPU per look, ms", 1, |r| {
        r.looks.iter().map(|l| l.cpu * 1000.0).collect()
    });
    t.row("server share, %", 0, |r| {
        r.looks
            .iter()
            .map(|l| l.meter.server / l.wall * 100.0)
            .collect()
    });
    t.row("daemon-side CPU per look, ms", 1, |r| {
        r.looks
            .iter()
            .map(|l| l.cpu * (1.0 - l.meter.server / l.wall) * 1000.0)
            .collect()
    });
    t.row(
        &format!("daemon-side CPU at one look per {OBSERVE_INTERVAL:.0} s, %"),
        2,
        |r| {
            r.looks
                .iter()
                .map(|l| l.cpu * (1.0 - l.meter.server / l.wall) / OBSERVE_INTERVAL * 100.0)
                .collect()
        },
    );
    t.one(
        &format!("process CPU at one look per {OBSERVE_INTERVAL:.0} s (server included), %"),
        2,
        |r| r.idle_cpu / r.looks.len() as f64 / OBSERVE_INTERVAL * 100.0,
    );
    t.row("requests per look", 0, |r| {
        r.looks.iter().map(|l| l.requests.total() as f64).collect()
    });
    t.row("received per look, MB", 1, |r| {
        r.looks
            .iter()
            .map(|l| mb(l.meter.received as usize))
            .collect()
    });
    t.row("daemon-side heap peak during a look, MB", 1, |r| {
        r.looks.iter().map(|l| l.peak_heap).collect()
    });
    t.one(
        "first look (resync: lists, compares all): wall time, ms",
        0,
        |r| r.full_look.wall * 1000.0,
    );
    t.one(
        "first look (resync: lists, compares all): CPU, ms",
        0,
        |r| r.full_look.cpu * 1000.0,
    );
    t.one(
        "first look (resync: lists, compares all): requests",
        0,
        |r| r.full_look.requests.total() as f64,
    );
    t.one("… apply", 0, |r| {
        r.full_look.requests.verb("apply") as f64
    });
    t.one(
        "first look (resync: lists, compares all): sent, MB",
        1,
        |r| mb(r.full_look.meter.sent as usize),
    );
    md.push_str(&t.finish());

    let _ = writeln!(
        md,
        "\n## A second daemon replica connecting (restart or lease take-over)\n\n`KubeRuntime::connect` (starts the watches of the four kinds and waits for their first lists, then reads each StatefulSet's and ScaledObject's processor annotation from what they listed), `TopologyStore::new` and one `topologies()`.\n"
    );
    let mut t = Table::new(runs, sizes);
    t.one("wall time, ms", 0, |r| r.restart.wall * 1000.0);
    t.one("CPU, ms", 0, |r| r.restart.cpu * 1000.0);
    t.one("server share, %", 0, |r| {
        r.restart.meter.server / r.restart.wall * 100.0
    });
    t.one("requests", 0, |r| r.restart.requests.total() as f64);
    t.one("received, MB", 1, |r| mb(r.restart.meter.received as usize));
    t.one("heap it keeps, MB", 1, |r| r.restart_heap);
    md.push_str(&t.finish());

    let _ = writeln!(
        md,
        "\n## Memory\n\nRSS is the whole process's: the fake server and its objects, the graphs, the daemon, and whatever the allocator kept from earlier runs of the benchmark (RSS does not go back down). The heap figures are live bytes counted by the allocator, by owner, at the end of a run: the daemon's state (its `KubeRuntime` and `TopologyStore`), the graphs of one revision (what the daemon's revision cache holds per commit), and the fake server (its objects with their managed fields).\n"
    );
    let mut t = Table::new(runs, sizes);
    t.one("RSS at the start of the run, MB", 0, |r| r.rss_start);
    t.one("RSS after the first sync, MB", 0, |r| r.rss_synced);
    t.one("RSS after the idle looks, MB", 0, |r| r.rss_idle);
    t.one("peak RSS of the process so far, MB", 0, |r| r.rss_peak);
    t.one("heap: the daemon's state, MB", 1, |r| r.heap_daemon);
    t.one(
        "… of which the store's own (last-seen Topologies), MB",
        1,
        |r| r.heap_store,
    );
    t.one("heap: the graphs, MB", 1, |r| r.heap_graphs);
    t.one("heap: the fake server, MB", 1, |r| r.heap_fake);
    md.push_str(&t.finish());

    let _ = writeln!(md, "\n## Bytes received per request kind (medians, MB)\n");
    let mut kinds: BTreeSet<String> = BTreeSet::new();
    for run in runs {
        kinds.extend(run.restart_received_by.keys().cloned());
        for l in &run.looks {
            kinds.extend(l.received_by.keys().cloned());
        }
    }
    let _ = write!(md, "| request |");
    for phase in ["ordinary look", "restart"] {
        for n in sizes {
            let _ = write!(md, " {phase}, {n} |");
        }
    }
    md.push_str("\n|---|");
    for _ in 0..2 * sizes.len() {
        md.push_str("---:|");
    }
    md.push('\n');
    for kind in &kinds {
        let _ = write!(md, "| `{kind}` |");
        for restart in [false, true] {
            for n in sizes {
                let mut values: Vec<f64> = runs
                    .iter()
                    .filter(|r| r.n == *n)
                    .flat_map(|r| {
                        if restart {
                            vec![r.restart_received_by.get(kind).copied().unwrap_or(0)]
                        } else {
                            r.looks
                                .iter()
                                .map(|l| l.received_by.get(kind).copied().unwrap_or(0))
                                .collect()
                        }
                    })
                    .map(|b| mb(b as usize))
                    .collect();
                let _ = write!(md, " {:.1} |", median(&mut values));
            }
        }
        md.push('\n');
    }

    let _ = writeln!(md, "\n## Requests by kind (medians)\n");
    let mut keys: BTreeSet<String> = BTreeSet::new();
    let phases: [(&str, CountsOf); 6] = [
        ("first sync", |r| &r.sync.requests),
        ("commit: 10 steps of one", |r| &r.one_step.phase.requests),
        ("commit: 1 step of 10", |r| &r.spread.phase.requests),
        ("ordinary look", |r| &r.looks[0].requests),
        ("first look (resync: lists, compares all)", |r| {
            &r.full_look.requests
        }),
        ("restart", |r| &r.restart.requests),
    ];
    for run in runs {
        for (_, pick) in &phases {
            keys.extend(pick(run).0.keys().cloned());
        }
    }
    let _ = write!(md, "| request |");
    for (name, _) in &phases {
        for n in sizes {
            let _ = write!(md, " {name}, {n} |");
        }
    }
    md.push_str("\n|---|");
    for _ in 0..phases.len() * sizes.len() {
        md.push_str("---:|");
    }
    md.push('\n');
    for key in &keys {
        let _ = write!(md, "| `{key}` |");
        for (_, pick) in &phases {
            for n in sizes {
                let mut values: Vec<f64> = runs
                    .iter()
                    .filter(|r| r.n == *n)
                    .map(|r| pick(r).0.get(key).copied().unwrap_or(0) as f64)
                    .collect();
                let _ = write!(md, " {:.0} |", median(&mut values));
            }
        }
        md.push('\n');
    }
    if let Some(run) = runs.first() {
        let per: Vec<String> = run
            .sync
            .actions
            .iter()
            .map(|(k, v)| format!("{k} {}", *v as usize / run.n))
            .collect();
        let _ = writeln!(
            md,
            "\nCutover actions of the first sync, per topology: {}.",
            per.join(", ")
        );
    }
    let waited: usize = runs
        .iter()
        .map(|r| r.sync.waited + r.one_step.phase.waited + r.spread.phase.waited)
        .sum();
    let _ = writeln!(
        md,
        "Engine calls that answered *waiting* (and slept until due), over all runs: {waited}."
    );
    md
}

/// Where a run keeps one phase's requests.
type CountsOf = fn(&Run) -> &Counts;

/// The CPU of a sequential phase less the fake server's share of its wall time.
fn daemon_cpu(phase: &Phase) -> f64 {
    phase.cpu * (1.0 - phase.meter.server / phase.wall)
}

fn main() {
    let sizes: Vec<usize> = env_or("BENCH_SIZES", "100,1000")
        .split(',')
        .map(|s| s.trim().parse().expect("BENCH_SIZES: numbers"))
        .collect();
    let reps: usize = env_or("BENCH_REPS", "3").parse().expect("BENCH_REPS");
    let looks: usize = env_or("BENCH_LOOKS", "20").parse().expect("BENCH_LOOKS");
    let look_budget = Duration::from_secs(
        env_or("BENCH_LOOK_SECONDS", "60")
            .parse()
            .expect("BENCH_LOOK_SECONDS"),
    );
    let out = env_or("BENCH_OUT", "bench/results/kube.md");
    // The fake's workload controller settles every workload after every write (work
    // that grows with the objects per request): at these sizes it is the fake being
    // measured. The daemon's requests are the same without it (a stop finds no Pod either
    // way: the fake deletes them with their StatefulSet); BENCH_CONTROLLER=1 checks that.
    let controller = env_or("BENCH_CONTROLLER", "0") == "1";
    let mut runs = Vec::new();
    for &n in &sizes {
        for rep in 1..=reps {
            eprintln!("N = {n}, run {rep} of {reps}");
            let started = Instant::now();
            let run = run(n, looks, look_budget, controller);
            eprintln!(
                "  done in {:.0} s: first sync {:.1} s, {} requests; look {:.0} ms",
                started.elapsed().as_secs_f64(),
                run.sync.wall,
                run.sync.requests.total(),
                run.looks.first().map_or(0.0, |l| l.wall * 1000.0),
            );
            runs.push(run);
        }
    }
    let mut md = report(&runs, &sizes, reps, looks, controller);
    // Findings are written by hand after a run: keep them.
    if let Ok(old) = std::fs::read_to_string(&out)
        && let Some(at) = old.find("\n## Findings")
    {
        md.push_str(&old[at..]);
    }
    std::fs::write(&out, &md).expect("write the report");
    println!("{md}");
}
