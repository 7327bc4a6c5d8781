//! The reconciler tests' world: a broker, a topology repository described by a [`Model`],
//! `plumber up` as a real process, a continuous load, and the oracle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plumber_testkit::{Broker, Process, TestRecord, live_instances, unique, wait_until};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use serde_json::Value;
use tempfile::TempDir;

pub use crate::common::processor_binary;
use crate::common::{Change, TestRepo, remove, write};

/// How long a cutover or a drain may take on a slow broker and a busy machine.
pub const PATIENCE: Duration = Duration::from_secs(180);

/// One processor: `jq` appends `name@version` to the record's `path`.
#[derive(Debug, Clone)]
pub struct Proc {
    pub name: String,
    pub version: u32,
    pub inputs: Vec<String>,
    pub replicas: u32,
    /// Creation order: a processor only reads what was created before it, so no cycles.
    born: u64,
}

impl Proc {
    pub fn new(name: &str, version: u32, inputs: &[&str]) -> Proc {
        static BORN: AtomicU64 = AtomicU64::new(0);
        Proc {
            name: name.into(),
            version,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            replicas: 1,
            born: BORN.fetch_add(1, Ordering::SeqCst),
        }
    }

    fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

/// A revision of the topology `t`: processors and sinks; the source is always `src`.
#[derive(Debug, Clone, Default)]
pub struct Model {
    procs: BTreeMap<String, Proc>,
    sinks: BTreeMap<String, Vec<String>>,
}

impl Model {
    pub fn new() -> Model {
        Model::default()
    }

    pub fn processor(mut self, proc: Proc) -> Model {
        self.procs.insert(proc.name.clone(), proc);
        self
    }

    pub fn sink(mut self, name: &str, inputs: &[&str]) -> Model {
        self.sinks
            .insert(name.into(), inputs.iter().map(|s| s.to_string()).collect());
        self
    }

    pub fn sink_from(mut self, name: &str, inputs: Vec<String>) -> Model {
        self.sinks.insert(name.into(), inputs);
        self
    }

    pub fn replace(mut self, name: &str, version: u32) -> Model {
        if let Some(p) = self.procs.get_mut(name) {
            p.version = version;
        }
        self
    }

    pub fn without(mut self, name: &str) -> Model {
        self.procs.remove(name);
        self
    }

    pub fn scale(mut self, name: &str, replicas: u32) -> Model {
        if let Some(p) = self.procs.get_mut(name) {
            p.replicas = replicas;
        }
        self
    }

    /// Processor names, in the order they were added (an input always comes before).
    pub fn processors(&self) -> Vec<&Proc> {
        let mut procs: Vec<&Proc> = self.procs.values().collect();
        procs.sort_by_key(|p| p.born);
        procs
    }

    pub fn sink_inputs(&self, sink: &str) -> &[String] {
        self.sinks.get(sink).map(Vec::as_slice).unwrap_or_default()
    }

    /// Whether any processor reads `name`.
    pub fn is_read(&self, name: &str) -> bool {
        self.procs
            .values()
            .any(|p| p.inputs.iter().any(|i| i == name))
    }

    pub fn rewire(mut self, name: &str, inputs: &[String]) -> Model {
        if let Some(p) = self.procs.get_mut(name) {
            p.inputs = inputs.to_vec();
        }
        self
    }

    /// The paths (labels of the processors passed) from the source to `step`.
    fn paths_to(&self, step: &str) -> Vec<Vec<String>> {
        if step == "src" {
            return vec![vec![]];
        }
        let Some(proc) = self.procs.get(step) else {
            return vec![];
        };
        proc.inputs
            .iter()
            .flat_map(|i| self.paths_to(i))
            .map(|mut p| {
                p.push(proc.label());
                p
            })
            .collect()
    }

    /// How many sink records one input record of `step` becomes (its paths to the sinks):
    /// what one record the step processes twice duplicates downstream.
    pub fn routes_from(&self, step: &str) -> usize {
        fn paths(model: &Model, from: &str, to: &str) -> usize {
            if from == to {
                return 1;
            }
            model
                .procs
                .get(to)
                .map(|p| p.inputs.iter().map(|i| paths(model, from, i)).sum())
                .unwrap_or(0)
        }
        self.sinks
            .values()
            .flatten()
            .map(|input| paths(self, step, input))
            .sum()
    }

    /// What one input record becomes at `sink`, sorted.
    fn expected(&self, sink: &str) -> Vec<Vec<String>> {
        let mut paths: Vec<Vec<String>> = self
            .sinks
            .get(sink)
            .into_iter()
            .flatten()
            .flat_map(|i| self.paths_to(i))
            .collect();
        paths.sort();
        paths
    }

    fn files(&self, world: &World) -> BTreeMap<String, String> {
        let mut files = BTreeMap::new();
        files.insert(
            "plumber.yaml".into(),
            format!(
                "clusters:\n  default: {{ bootstrap: \"{}\" }}\n",
                world.broker.bootstrap()
            ),
        );
        files.insert(
            "topologies/t/sources/src.yaml".into(),
            format!("kind: source\ntopic: {}\n", world.source),
        );
        for p in self.procs.values() {
            files.insert(
                format!("topologies/t/steps/{}.yaml", p.name),
                format!(
                    "kind: processor\ninput: [{}]\njq: '.path += [\"{}\"]'\nstartFrom: earliest\npartitions: 2\nscale: {{ min: {}, max: {} }}\n",
                    p.inputs.join(", "),
                    p.label(),
                    p.replicas,
                    p.replicas + 2
                ),
            );
        }
        for (name, inputs) in &self.sinks {
            files.insert(
                format!("topologies/t/sinks/{name}.yaml"),
                format!(
                    "kind: sink\ntopic: {}\ninput: [{}]\n",
                    world.sink_topic(name),
                    inputs.join(", ")
                ),
            );
        }
        files
    }
}

pub struct World {
    pub broker: Broker,
    repo: TestRepo,
    source: String,
    sinks: BTreeMap<String, String>,
    state: TempDir,
    written: RefCell<BTreeSet<String>>,
}

impl World {
    pub fn new(name: &str) -> World {
        let broker = Broker::start();
        let source = unique(&format!("{name}-src"));
        broker.create_topic(&source, 3);
        let mut sinks = BTreeMap::new();
        for sink in ["out1", "out2"] {
            let topic = unique(&format!("{name}-{sink}"));
            broker.create_topic(&topic, 3);
            sinks.insert(sink.to_owned(), topic);
        }
        World {
            broker,
            repo: TestRepo::new(),
            source,
            sinks,
            state: tempfile::tempdir().unwrap(),
            written: RefCell::new(BTreeSet::new()),
        }
    }

    pub fn sink_topic(&self, sink: &str) -> &str {
        &self.sinks[sink]
    }

    /// The first-life internal topic (and group) of `step` in `model`.
    pub fn internal_topic(&self, model: &Model, step: &str) -> String {
        let files: Vec<plumber::spec::SourceFile> = model
            .files(self)
            .into_iter()
            .map(|(path, content)| plumber::spec::SourceFile {
                path,
                content: plumber::spec::FileContent::Bytes(content.into_bytes()),
            })
            .collect();
        let topologies = plumber::validate(&files)
            .topologies
            .expect("the model is a valid revision");
        let t = &topologies[0];
        t.internal_name(t.find(step).expect("the step is in the model"))
    }

    /// The identity of every processor of `model`, by step name.
    #[allow(dead_code)] // for tests/kube_oracle, which shares this harness
    pub fn identities(&self, model: &Model) -> BTreeMap<String, String> {
        let files: Vec<plumber::spec::SourceFile> = model
            .files(self)
            .into_iter()
            .map(|(path, content)| plumber::spec::SourceFile {
                path,
                content: plumber::spec::FileContent::Bytes(content.into_bytes()),
            })
            .collect();
        let topologies = plumber::validate(&files)
            .topologies
            .expect("the model is a valid revision");
        topologies[0]
            .steps()
            .filter(|(_, s)| model.procs.contains_key(&s.name))
            .map(|(_, s)| (s.name.clone(), s.identity.to_string()))
            .collect()
    }

    /// Points `main` at `commit` (a force-push) and drops what is no longer reachable from
    /// the repository's object store, so the commits left behind cannot be read any more.
    pub fn force_main(&self, commit: git2::Oid) {
        self.repo
            .git
            .reference("refs/heads/main", commit, true, "force-push")
            .unwrap();
    }

    pub fn prune_unreachable(&self) {
        for args in [
            &["reflog", "expire", "--expire=now", "--all"][..],
            &["gc", "--prune=now", "--quiet"][..],
        ] {
            let status = Command::new("git")
                .arg("-C")
                .arg(self.repo.path())
                .args(args)
                .status()
                .unwrap();
            assert!(status.success(), "git {args:?}");
        }
    }

    /// Commits `model` as the whole topology (files of steps no longer there are removed).
    pub fn commit(&self, message: &str, model: &Model) -> git2::Oid {
        let files = model.files(self);
        let mut changes: Vec<Change> = files.iter().map(|(p, c)| write(p, c)).collect();
        let mut written = self.written.borrow_mut();
        for gone in written.iter().filter(|p| !files.contains_key(*p)) {
            changes.push(remove(gone));
        }
        *written = files.keys().cloned().collect();
        self.repo.commit("main", message, &changes)
    }

    /// Commits `model` as topology `t` plus `extra` files (another topology) as given.
    pub fn commit_with(
        &self,
        message: &str,
        model: &Model,
        extra: &[(String, String)],
    ) -> git2::Oid {
        let mut files = model.files(self);
        files.extend(extra.iter().cloned());
        let mut changes: Vec<Change> = files.iter().map(|(p, c)| write(p, c)).collect();
        let mut written = self.written.borrow_mut();
        for gone in written.iter().filter(|p| !files.contains_key(*p)) {
            changes.push(remove(gone));
        }
        *written = files.keys().cloned().collect();
        self.repo.commit("main", message, &changes)
    }

    /// Pull request `number`'s head: main's head with `path` written as `content`, at
    /// `refs/pull/<number>/head` (main does not move).
    #[allow(dead_code)] // for tests/kube_oracle, which shares this harness
    pub fn pull_request(&self, number: u64, message: &str, path: &str, content: &str) -> git2::Oid {
        let branch = format!("pr-{number}");
        let main = self
            .repo
            .git
            .refname_to_id("refs/heads/main")
            .expect("main has a commit");
        self.repo
            .git
            .reference(&format!("refs/heads/{branch}"), main, true, "branch")
            .unwrap();
        let head = self.repo.commit(&branch, message, &[write(path, content)]);
        self.repo
            .git
            .reference(
                &format!("refs/pull/{number}/head"),
                head,
                true,
                "pull request",
            )
            .unwrap();
        head
    }

    pub fn source_topic(&self) -> &str {
        &self.source
    }

    /// A new topic on the world's broker.
    pub fn topic(&self, prefix: &str) -> String {
        let topic = unique(prefix);
        self.broker.create_topic(&topic, 3);
        topic
    }

    /// Commits one file as given (e.g. an invalid step).
    pub fn commit_raw(&self, message: &str, path: &str, content: &str) -> git2::Oid {
        self.written.borrow_mut().insert(path.to_owned());
        self.repo.commit("main", message, &[write(path, content)])
    }

    pub fn start_load(&self, rate: u64) -> Load {
        Load::start(&self.broker, &self.source, rate)
    }

    /// The repository's directory.
    pub fn repo_path(&self) -> &std::path::Path {
        self.repo.path()
    }

    /// The repository's path (a daemon watches it for commits).
    pub fn repo_location(&self) -> String {
        self.repo.location()
    }

    pub fn repo_url(&self) -> String {
        format!("file://{}", self.repo.location())
    }

    /// A file in the test's scratch space.
    pub fn scratch_file(&self, name: &str, content: &str) -> PathBuf {
        let path = self.state.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    fn processes(&self) -> PathBuf {
        self.state.path().join("state/processes")
    }

    /// SIGKILLs the first instance of the running processor of `step`; returns what the
    /// crash may make it repeat.
    pub fn kill_processor(&self, step: &str) -> Killed {
        let prefix = format!("plumber.t.{step}.");
        let pid_file = self
            .live_pid_files()
            .into_iter()
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with(&prefix) && name.ends_with(".0.pid")
            })
            .unwrap_or_else(|| panic!("no running instance of {step}"));
        self.kill_instance(&pid_file)
            .unwrap_or_else(|| panic!("{step} exited before it could be killed"))
    }

    /// SIGKILLs the `n`-th (modulo how many there are) running processor instance; panics
    /// when none runs, so a chaos test cannot pass by killing nothing.
    pub fn kill_any_processor(&self, n: usize) -> Killed {
        // An instance can exit on its own (a cutover stops it) between being listed and the
        // kill: then the next one listed is killed.
        for _ in 0..10 {
            let pid_files = self.live_pid_files();
            assert!(
                !pid_files.is_empty(),
                "no processor instance runs: nothing to kill"
            );
            if let Some(killed) = self.kill_instance(&pid_files[n % pid_files.len()]) {
                return killed;
            }
        }
        panic!("every processor instance exited before it could be killed, ten times")
    }

    /// The pid files of instances whose process is alive (a file can outlive its process
    /// until the runtime notices), sorted.
    fn live_pid_files(&self) -> Vec<PathBuf> {
        let mut pid_files: Vec<PathBuf> = std::fs::read_dir(self.processes())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "pid"))
            .filter(|p| pid_in(p).is_some_and(is_alive))
            .collect();
        pid_files.sort();
        pid_files
    }

    /// Reads the instance's group offsets, SIGKILLs it, waits until it is gone, and measures
    /// what it had read or could read without committing; `None` when it had exited already.
    fn kill_instance(&self, pid_file: &std::path::Path) -> Option<Killed> {
        let name = pid_file.file_name().unwrap().to_string_lossy().into_owned();
        // Gone with its life's stop: nothing to kill.
        let pid = pid_in(pid_file)?;
        // `<group>.<index>.pid`, beside `<group>.json`.
        let group = name
            .trim_end_matches(".pid")
            .rsplit_once('.')
            .map(|(group, _)| group.to_owned())
            .unwrap();
        let spec = read_spec(&self.processes().join(format!("{group}.json")))?;
        let step = spec["step"].as_str().unwrap().to_owned();
        let inputs = inputs_in(&spec);
        let committed = self.committed(&group, &inputs);
        match nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        ) {
            Ok(()) => {}
            Err(nix::errno::Errno::ESRCH) => return None,
            Err(e) => panic!("kill -9 {pid} ({name}): {e}"),
        }
        wait_until(&format!("{name} (pid {pid}) is gone"), PATIENCE, || {
            !is_alive(pid)
        });
        let uncommitted = self.uncommitted(&committed);
        eprintln!("killed {name} (pid {pid}); {uncommitted} input records past its commits");
        Some(Killed {
            step,
            group,
            committed,
            uncommitted,
        })
    }

    /// `group`'s committed offset on every partition of `topics`; the partition's first
    /// offset where it has none (it starts there).
    pub fn committed(&self, group: &str, topics: &[String]) -> Offsets {
        let consumer: BaseConsumer = self
            .broker
            .client()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut list = rdkafka::TopicPartitionList::new();
        for topic in topics {
            let metadata = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .unwrap();
            for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
                list.add_partition(topic, partition.id());
            }
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap();
        committed
            .elements()
            .iter()
            .map(|e| {
                let key = (e.topic().to_owned(), e.partition());
                let offset = match e.offset() {
                    rdkafka::Offset::Offset(offset) => offset,
                    _ => {
                        consumer
                            .fetch_watermarks(&key.0, key.1, Duration::from_secs(10))
                            .unwrap()
                            .0
                    }
                };
                (key, offset)
            })
            .collect()
    }

    /// The records past `committed` on its partitions now: all that a group which
    /// committed there and died may process again (at-least-once).
    pub fn uncommitted(&self, committed: &Offsets) -> u64 {
        let consumer: BaseConsumer = self.broker.client().create().unwrap();
        committed
            .iter()
            .map(|((topic, partition), offset)| {
                let (_, end) = consumer
                    .fetch_watermarks(topic, *partition, Duration::from_secs(10))
                    .unwrap();
                (end - offset).max(0) as u64
            })
            .sum()
    }

    /// Every running group's committed offsets, by step: measured before a fault, what
    /// the fault may make each step repeat is [`World::uncommitted`] of them after it.
    pub fn running_groups(&self) -> Vec<(String, Offsets)> {
        self.recorded_specs()
            .iter()
            .map(|spec| {
                let step = spec["step"].as_str().unwrap().to_owned();
                let group = spec["group"].as_str().unwrap();
                (step, self.committed(group, &inputs_in(spec)))
            })
            .collect()
    }

    /// The spec the runtime recorded of every running group (`<group>.json`).
    fn recorded_specs(&self) -> Vec<Value> {
        std::fs::read_dir(self.processes())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .filter_map(|path| read_spec(&path))
            .collect()
    }

    /// The first line of every instance's pid file (its pids and start times), by file.
    pub fn recorded_instances(&self) -> BTreeMap<String, String> {
        std::fs::read_dir(self.processes())
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
            .map(|e| {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let first = text.lines().next().unwrap_or_default().to_owned();
                (e.file_name().to_string_lossy().into_owned(), first)
            })
            .collect()
    }

    /// What the daemons of this world logged, in order.
    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("daemon.log")).unwrap_or_default()
    }

    /// Whether `topic` is on the broker, with partitions.
    pub fn topic_exists(&self, topic: &str) -> bool {
        self.broker.topic_names().contains(topic)
    }

    /// The assignor recorded with each running group.
    pub fn recorded_assignors(&self) -> BTreeMap<String, String> {
        self.recorded_specs()
            .iter()
            .map(|spec| {
                let assignor = spec["settings"]["assignor"].as_str().unwrap_or("none");
                (
                    spec["group"].as_str().unwrap().to_owned(),
                    assignor.to_owned(),
                )
            })
            .collect()
    }

    /// Every recorded group runs exactly its number of instances, no more.
    pub fn assert_one_instance_per_group(&self) {
        for spec in self.recorded_specs() {
            let group = spec["group"].as_str().unwrap().to_owned();
            // The local runtime runs `scale.min` instances, at least one.
            let replicas = spec["scale"]["min"].as_u64().unwrap().max(1);
            wait_until(
                &format!("{group} runs {replicas} instances"),
                PATIENCE,
                || live_instances(&group) as u64 == replicas,
            );
        }
    }

    /// Waits until every sink holds, for each input below `sent`, the records the oracle
    /// allows ([`judge`]); panics with the first mismatches after [`PATIENCE`].
    pub fn assert_oracle(&self, revisions: &[Model], sent: u64, final_from: u64) {
        let duplicates = self.check_oracle(revisions, sent, final_from, false);
        assert_eq!(duplicates, 0);
    }

    /// As [`assert_oracle`], but duplicates (a crashed at-least-once processor) are counted
    /// rather than failing; nothing may be missing.
    pub fn assert_oracle_allowing_duplicates(
        &self,
        revisions: &[Model],
        sent: u64,
        final_from: u64,
    ) -> usize {
        self.check_oracle(revisions, sent, final_from, true)
    }

    fn check_oracle(
        &self,
        revisions: &[Model],
        sent: u64,
        final_from: u64,
        allow_duplicates: bool,
    ) -> usize {
        let mut duplicates = 0;
        for (sink, topic) in &self.sinks {
            let expected: Vec<Vec<Vec<String>>> =
                revisions.iter().map(|m| m.expected(sink)).collect();
            let deadline = Instant::now() + PATIENCE;
            loop {
                let records = self.broker.read_all(topic);
                let verdict = judge(&records, &expected, sent, final_from, allow_duplicates);
                match verdict {
                    Ok(dups) => {
                        duplicates += dups;
                        break;
                    }
                    Err(problems) if Instant::now() >= deadline => panic!(
                        "sink {sink} ({topic}, {} records) breaks the oracle for {} of {sent} inputs; first: {:#?}",
                        records.len(),
                        problems.len(),
                        &problems[..problems.len().min(5)]
                    ),
                    Err(_) => std::thread::sleep(Duration::from_millis(500)),
                }
            }
        }
        duplicates
    }
}

impl Drop for World {
    /// Processors a failed test left behind (the daemon was killed) must not outlive it;
    /// the logs of a failed test are kept.
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(self.processes()) {
            for path in entries.flatten().map(|e| e.path()) {
                if path.extension().is_some_and(|e| e == "pid")
                    && let Ok(text) = std::fs::read_to_string(&path)
                {
                    for pid in text
                        .split_whitespace()
                        .step_by(2)
                        .filter_map(|p| p.parse().ok())
                    {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
        if std::thread::panicking() {
            let kept = std::mem::replace(&mut self.state, tempfile::tempdir().unwrap()).keep();
            eprintln!(
                "state, daemon and processor logs kept in {}",
                kept.display()
            );
        }
    }
}

/// A group's offsets, by topic and partition.
pub type Offsets = BTreeMap<(String, i32), i64>;

/// A processor instance killed with SIGKILL, and what its crash may repeat.
#[derive(Debug)]
pub struct Killed {
    pub step: String,
    pub group: String,
    /// Its group's committed offsets on its inputs just before the kill.
    pub committed: Offsets,
    /// The input records past those offsets just after the kill: the records in flight and
    /// those read since the last commit (at most one commit interval's) — all that an
    /// at-least-once successor may process again.
    pub uncommitted: u64,
}

/// A group's recorded spec; `None` when it is gone (its life stopped).
fn read_spec(path: &std::path::Path) -> Option<Value> {
    Some(serde_json::from_slice(&std::fs::read(path).ok()?).unwrap())
}

/// The input topics of a recorded spec.
fn inputs_in(spec: &Value) -> Vec<String> {
    spec["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap().to_owned())
        .collect()
}

/// The processor pid recorded first in a pid file.
fn pid_in(pid_file: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(pid_file)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Whether `pid` runs (a zombie does not: it waits only to be reaped).
fn is_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.contains(") Z ") && !stat.contains(") X "))
}

/// The path of a record without versions: which steps it went through.
fn route(path: &[String]) -> Vec<String> {
    path.iter()
        .map(|label| label.split('@').next().unwrap_or(label).to_owned())
        .collect()
}

/// Ok(duplicates) when every input below `sent` passed each route at most once, with the
/// versions of one revision along it; exactly once on routes every revision has, and on the
/// final revision's routes for inputs from `final_from` on (sent after it took over).
fn judge(
    records: &[TestRecord],
    revisions: &[Vec<Vec<String>>],
    sent: u64,
    final_from: u64,
    allow_duplicates: bool,
) -> Result<usize, Vec<String>> {
    let mut labelings: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for paths in revisions {
        for path in paths {
            labelings
                .entry(route(path))
                .or_default()
                .insert(path.clone());
        }
    }
    let everywhere: BTreeSet<Vec<String>> = labelings
        .keys()
        .filter(|r| {
            revisions
                .iter()
                .all(|paths| paths.iter().any(|p| &route(p) == *r))
        })
        .cloned()
        .collect();
    let last: &[Vec<String>] = revisions.last().map(Vec::as_slice).unwrap_or_default();
    // A route can live more than once: a step re-wired back to an input it read in an
    // earlier revision is started again at its `startFrom` (earliest here), because offsets
    // a group kept from an earlier life are never trusted (SPEC §4). Each life may pass an
    // input once.
    let has = |paths: &[Vec<String>], r: &Vec<String>| paths.iter().any(|p| &route(p) == r);
    let lives: BTreeMap<&Vec<String>, usize> = labelings
        .keys()
        .map(|r| {
            let starts = (0..revisions.len())
                .filter(|&i| has(&revisions[i], r) && (i == 0 || !has(&revisions[i - 1], r)))
                .count();
            (r, starts.max(1))
        })
        .collect();

    let mut by_seq: BTreeMap<u64, Vec<Vec<String>>> = BTreeMap::new();
    let mut problems = Vec::new();
    for record in records {
        let value: Value = match serde_json::from_str(record.value_str()) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("not JSON ({e}): {}", record.value_str()));
                continue;
            }
        };
        let seq = value["seq"].as_u64().unwrap_or(u64::MAX);
        let path: Vec<String> = value["path"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect();
        by_seq.entry(seq).or_default().push(path);
    }
    let mut duplicates = 0;
    for seq in 0..sent {
        let observed = by_seq.remove(&seq).unwrap_or_default();
        let mut per_route: BTreeMap<Vec<String>, Vec<&Vec<String>>> = BTreeMap::new();
        for path in &observed {
            per_route.entry(route(path)).or_default().push(path);
        }
        for (r, paths) in &per_route {
            for path in paths {
                if !labelings
                    .get(r)
                    .is_some_and(|allowed| allowed.contains(*path))
                {
                    problems.push(format!("input {seq}: path {path:?} belongs to no revision"));
                }
            }
            let allowed = lives.get(r).copied().unwrap_or(1);
            if paths.len() > allowed {
                if allow_duplicates {
                    duplicates += paths.len() - allowed;
                } else {
                    problems.push(format!(
                        "input {seq}: {} times through {r:?} ({allowed} lives): {paths:?}",
                        paths.len()
                    ));
                }
            }
        }
        for r in &everywhere {
            if !per_route.contains_key(r) {
                problems.push(format!(
                    "input {seq}: lost on route {r:?} (got {observed:?})"
                ));
            }
        }
        if seq >= final_from {
            for path in last {
                if !per_route
                    .get(&route(path))
                    .is_some_and(|ps| ps.contains(&path))
                {
                    problems.push(format!(
                        "input {seq}: sent after the last cutover, but not through {path:?} (got {observed:?})"
                    ));
                }
            }
        }
    }
    for (seq, paths) in by_seq {
        if seq >= sent {
            problems.push(format!("input {seq} was never sent but arrived: {paths:?}"));
        }
    }
    if problems.is_empty() {
        Ok(duplicates)
    } else {
        Err(problems)
    }
}

/// Sequence-numbered records written continuously to the source.
pub struct Load {
    sent: Arc<AtomicU64>,
    running: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    fn start(broker: &Broker, topic: &str, rate: u64) -> Load {
        let sent = Arc::new(AtomicU64::new(0));
        let running = Arc::new(AtomicBool::new(true));
        let producer: BaseProducer = broker
            .client()
            .set("enable.idempotence", "true")
            // A produce request every 100 ms, not one per record: tansu serves every
            // request of every client in turn (docs/tansu.md).
            .set("linger.ms", "100")
            .create()
            .unwrap();
        let thread = {
            let (sent, running, topic) = (sent.clone(), running.clone(), topic.to_owned());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut seq = 0u64;
                while running.load(Ordering::SeqCst) {
                    let due = start + Duration::from_micros(seq * 1_000_000 / rate);
                    while Instant::now() < due {
                        producer.poll(due.saturating_duration_since(Instant::now()));
                    }
                    let value = format!(r#"{{"seq":{seq},"path":[]}}"#);
                    let key = format!("k{}", seq % 10);
                    let mut record = BaseRecord::to(&topic).key(&key).payload(&value);
                    while let Err((error, back)) = producer.send(record) {
                        eprintln!("load: {error}; retrying");
                        record = back;
                        producer.poll(Duration::from_millis(100));
                    }
                    seq += 1;
                    sent.store(seq, Ordering::SeqCst);
                }
                producer.flush(Duration::from_secs(60)).expect("load flush");
            })
        };
        Load {
            sent,
            running,
            thread: Some(thread),
        }
    }

    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    pub fn wait_for(&self, records: u64) {
        wait_until(&format!("{records} records sent"), PATIENCE, || {
            self.sent() >= records
        });
    }

    /// After the last cutover: writes `more` records, then stops. Returns (records written,
    /// the first record written after the last cutover).
    pub fn finish(self, more: u64) -> (u64, u64) {
        let final_from = self.sent();
        self.wait_for(final_from + more);
        (self.stop(), final_from)
    }

    /// Stops writing; returns how many records were written (all acknowledged).
    pub fn stop(mut self) -> u64 {
        self.running.store(false, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.sent()
    }
}

/// `plumber up` on the world's repository and state directory.
pub struct Plumber {
    process: Option<Process>,
    server: String,
    /// The world's repository, where a commit's graph is read.
    repo: PathBuf,
}

/// The identities of `topology`'s processors in `commit`'s graph, by step name.
pub fn processors_at(
    repo: &std::path::Path,
    topology: &str,
    commit: git2::Oid,
) -> BTreeMap<String, String> {
    let repo = plumber::repo::Repository::open(repo.to_str().unwrap()).unwrap();
    let snapshot = repo.snapshot(commit).unwrap();
    let validation = plumber::validate(&snapshot.files);
    let topologies = validation
        .topologies
        .unwrap_or_else(|| panic!("{commit} is not valid: {:?}", validation.diagnostics));
    topologies
        .iter()
        .filter(|t| t.name == topology)
        .flat_map(|t| t.steps())
        .filter(|(_, step)| step.kind() == plumber::graph::Kind::Processor)
        .map(|(_, step)| (step.name.clone(), step.identity.to_string()))
        .collect()
}

impl Plumber {
    pub fn up(world: &World) -> Plumber {
        Plumber::start(world, &world.repo_location(), &[])
    }

    /// `plumber up LOCATION` with extra arguments, on the world's state directory; keeping
    /// retired topics on tansu (README, tansu).
    pub fn start(world: &World, location: &str, extra: &[&str]) -> Plumber {
        Plumber::launch(world, location, extra, world.broker.is_tansu())
    }

    /// `plumber up` deleting retired topics, on tansu too: only for a world whose topics
    /// may all break when one is deleted.
    pub fn deleting_topics(world: &World) -> Plumber {
        Plumber::launch(world, &world.repo_location(), &[], false)
    }

    /// `plumber daemon --config CONFIG`, the shipped binary in its Kubernetes mode, as a
    /// process of its own; `port` is the one its config listens on.
    #[allow(dead_code)] // for tests/kube_oracle, which shares this harness
    pub fn daemon(world: &World, config: &std::path::Path, port: u16) -> Plumber {
        Plumber::daemon_named(world, config, port, "plumber-0")
    }

    /// [`Plumber::daemon`] as the replica `pod` (its `HOSTNAME`, its Lease identity).
    #[allow(dead_code)] // for tests/kube_oracle, which shares this harness
    pub fn daemon_named(world: &World, config: &std::path::Path, port: u16, pod: &str) -> Plumber {
        let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
        command
            .arg("daemon")
            .arg("--config")
            .arg(config)
            .env("HOSTNAME", pod);
        Plumber::spawn(world, "plumber daemon", command, port)
    }

    /// Runs `command` with the world's daemon log as its stderr, and waits until its API on
    /// `port` answers.
    fn spawn(world: &World, name: &str, mut command: Command, port: u16) -> Plumber {
        let path = world.state.path().join("daemon.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        eprintln!("daemon log: {}", path.display());
        command
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let plumber = Plumber {
            process: Some(Process::spawn(name, &mut command)),
            server: format!("http://127.0.0.1:{port}"),
            repo: world.repo.path().to_owned(),
        };
        wait_until("the daemon answers", PATIENCE, || {
            plumber.try_status().is_some()
        });
        plumber
    }

    /// SIGTERM, as Kubernetes stops a Pod; how the daemon exited (`None`: not in time).
    #[allow(dead_code)] // for tests/kube_oracle, which shares this harness
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut process = self.process.take()?;
        process.signal(nix::sys::signal::Signal::SIGTERM);
        process.wait_exit(PATIENCE)
    }

    fn launch(world: &World, location: &str, extra: &[&str], keep_topics: bool) -> Plumber {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
        command
            .arg("up")
            .arg(location)
            .args(extra)
            .args(["--branch", "main", "--bootstrap", world.broker.bootstrap()])
            .arg("--state-dir")
            .arg(world.state.path().join("state"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--stall-timeout", "15", "--record-timeout", "5"])
            .env("PLUMBER_PROCESSOR", processor_binary());
        if keep_topics {
            command.arg("--keep-topics");
        }
        if world.broker.is_tansu() {
            // `plumber up --assignor`, passed to every processor. On tansu a processor restarted after a kill -9 got
            // no partitions under the cooperative assignor, restart after restart (README,
            // tansu); the eager one recovers.
            command.env("PLUMBER_ASSIGNOR", "eager");
        }
        Plumber::spawn(world, "plumber up", command, port)
    }

    fn try_status(&self) -> Option<Value> {
        let mut response = ureq::get(&format!("{}/api/status", self.server))
            .call()
            .ok()?;
        response.body_mut().read_json().ok()
    }

    pub fn wait_until(&self, what: &str, condition: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        let mut last = Value::Null;
        while Instant::now() < deadline {
            if let Some(status) = self.try_status() {
                if condition(&status) {
                    return;
                }
                last = status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out waiting until {what}; last status: {last:#}");
    }

    /// The status entry of `topology`.
    pub fn topology(&self, topology: &str) -> Value {
        self.try_status()
            .and_then(|s| {
                s["topologies"]
                    .as_array()?
                    .iter()
                    .find(|t| t["name"] == topology)
                    .cloned()
            })
            .unwrap_or(Value::Null)
    }

    /// Waits until `topology` runs `commit`'s graph: the daemon has read the commit, the
    /// topology is idle, and its processors are the commit's. Not that the topology's
    /// `commit` is `commit`: a commit that leaves a topology as it runs (a step added, then
    /// removed again before the first move) does not move it (README, "Where this differs").
    pub fn wait_applied(&self, topology: &str, commit: git2::Oid) {
        let wanted = processors_at(&self.repo, topology, commit);
        let commit = commit.to_string();
        self.wait_until(
            &format!("{topology} runs the graph of {commit}"),
            |status| {
                status["commit"] == commit.as_str()
                    && status["topologies"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|t| {
                            let processors: BTreeMap<String, String> = t["steps"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter(|s| s["kind"] == "processor")
                                .filter_map(|s| {
                                    Some((
                                        s["name"].as_str()?.to_owned(),
                                        s["identity"].as_str()?.to_owned(),
                                    ))
                                })
                                .collect();
                            t["name"] == topology
                                && t["phase"] == "idle"
                                && t["cutover"].is_null()
                                && processors == wanted
                        })
            },
        );
    }

    pub fn applied(&self, topology: &str) -> Option<String> {
        let status = self.try_status()?;
        status["topologies"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == topology)?["commit"]
            .as_str()
            .map(str::to_owned)
    }

    /// POSTs a push webhook; returns the HTTP status.
    pub fn hook(&self, body: &[u8], signature: Option<&str>) -> u16 {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent.post(&format!("{}/hooks/git", self.server));
        if let Some(signature) = signature {
            request = request.header("X-Plumber-Signature", signature);
        }
        request.send(body).unwrap().status().as_u16()
    }

    pub fn history(&self) -> Value {
        let mut response = ureq::get(&format!("{}/api/history", self.server))
            .call()
            .unwrap();
        response.body_mut().read_json().unwrap()
    }

    /// `GET path` (`/healthz`, `/readyz`): the status and the body; `None` while nothing
    /// answers.
    #[allow(dead_code)] // for tests/kube_oracle, which shares this harness
    pub fn probe(&self, path: &str) -> Option<(u16, String)> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent.get(&format!("{}{path}", self.server)).call().ok()?;
        let status = response.status().as_u16();
        Some((
            status,
            response.body_mut().read_to_string().unwrap_or_default(),
        ))
    }

    /// The daemon's `/metrics` (Prometheus text).
    pub fn metrics(&self) -> String {
        ureq::get(&format!("{}/metrics", self.server))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default()
    }

    /// kill -9: the processors keep running.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }
}

impl Drop for Plumber {
    /// A graceful stop: the daemon stops its processors before exiting.
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal(nix::sys::signal::Signal::SIGTERM);
            if process.wait_exit(PATIENCE).is_none() {
                eprintln!("the daemon did not stop within {PATIENCE:?}");
            }
        }
    }
}

/// Prints the seed again when the test fails, next to the failure.
pub struct SeedReport(pub u64);

impl Drop for SeedReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "failed with PLUMBER_TEST_SEED={}; rerun with it to replay",
                self.0
            );
        }
    }
}
