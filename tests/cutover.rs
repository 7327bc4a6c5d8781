//! The cutover engine on an in-memory Kafka and runtime: resuming after a crash at every
//! point of a cutover ends where an uninterrupted cutover ends, never sets a started group's
//! offsets twice, and hands over exactly the offsets the predecessor committed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use plumber::cutover::{CutoverConfig, Engine, Event};
use plumber::graph::Topology;
use plumber::kafka::{self, Admin};
use plumber::plan::{Action, plan_topology};
use plumber::runtime::{self, ProcessorSpec, ProcessorStatus, Runtime};
use plumber::spec::{FileContent, SourceFile};
use plumber::state::{CutoverProgress, PartitionOffset, StateDir};

fn topology(steps: &[(&str, &str)]) -> Topology {
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

fn revision(a_version: u32) -> Topology {
    topology(&[
        ("src", "kind: source\ntopic: in\n"),
        (
            "a",
            &format!("kind: processor\ninput: src\njq: '.a = {a_version}'\npartitions: 2\n"),
        ),
        ("b", "kind: processor\ninput: a\njq: '.b = 1'\n"),
        ("out", "kind: sink\ntopic: out\ninput: b\n"),
    ])
}

/// Topics with fixed watermarks; committed offsets per group; a log of commits.
#[derive(Default)]
struct FakeKafka {
    topics: Mutex<BTreeMap<String, Vec<(i64, i64)>>>,
    committed: Mutex<BTreeMap<String, Vec<PartitionOffset>>>,
    commits: Mutex<Vec<String>>,
}

impl Admin for FakeKafka {
    fn create_topic(&self, topic: &str, partitions: u32) -> kafka::Result<()> {
        self.topics
            .lock()
            .unwrap()
            .entry(topic.into())
            .or_insert_with(|| vec![(0, 0); partitions as usize]);
        Ok(())
    }
    fn delete_topic(&self, topic: &str) -> kafka::Result<()> {
        self.topics.lock().unwrap().remove(topic);
        Ok(())
    }
    fn partitions(&self, topic: &str) -> kafka::Result<i32> {
        Ok(self.watermarks(topic)?.len() as i32)
    }
    fn watermarks(&self, topic: &str) -> kafka::Result<Vec<(i64, i64)>> {
        self.topics
            .lock()
            .unwrap()
            .get(topic)
            .cloned()
            .ok_or_else(|| kafka::Error::Metadata {
                topic: topic.into(),
                message: "Unknown topic".into(),
            })
    }
    fn committed(&self, group: &str, topics: &[String]) -> kafka::Result<Vec<PartitionOffset>> {
        Ok(self
            .committed
            .lock()
            .unwrap()
            .get(group)
            .into_iter()
            .flatten()
            .filter(|p| topics.contains(&p.topic))
            .cloned()
            .collect())
    }
    fn commit(&self, group: &str, offsets: &[PartitionOffset]) -> kafka::Result<()> {
        self.committed
            .lock()
            .unwrap()
            .insert(group.into(), offsets.to_vec());
        self.commits.lock().unwrap().push(group.into());
        Ok(())
    }
}

/// Runs processors in a map. A stopped processor has consumed its inputs to their ends (as a
/// graceful stop commits); the runtime fails its `fail_at`-th call, like a daemon crash.
struct FakeRuntime<'a> {
    kafka: &'a FakeKafka,
    running: Mutex<BTreeMap<String, ProcessorSpec>>,
    calls: Mutex<u32>,
    fail_at: Option<u32>,
}

impl FakeRuntime<'_> {
    fn call(&self) -> runtime::Result<()> {
        let mut calls = self.calls.lock().unwrap();
        *calls += 1;
        if Some(*calls) == self.fail_at {
            return Err(runtime::Error::Start {
                group: "-".into(),
                message: "injected crash".into(),
            });
        }
        Ok(())
    }
}

impl Runtime for FakeRuntime<'_> {
    fn start(&self, spec: &ProcessorSpec) -> runtime::Result<()> {
        self.call()?;
        self.running
            .lock()
            .unwrap()
            .entry(spec.group.clone())
            .or_insert_with(|| spec.clone());
        Ok(())
    }
    fn stop(&self, group: &str) -> runtime::Result<()> {
        self.call()?;
        if let Some(spec) = self.running.lock().unwrap().remove(group) {
            let mut ends = Vec::new();
            for topic in &spec.inputs {
                for (partition, (_, high)) in self
                    .kafka
                    .watermarks(topic)
                    .unwrap()
                    .into_iter()
                    .enumerate()
                {
                    ends.push(PartitionOffset {
                        topic: topic.clone(),
                        partition: partition as i32,
                        offset: high,
                    });
                }
            }
            self.kafka
                .committed
                .lock()
                .unwrap()
                .insert(group.into(), ends);
        }
        Ok(())
    }
    fn restart(&self, _group: &str) -> runtime::Result<()> {
        self.call()
    }
    fn scale(&self, group: &str, replicas: u32) -> runtime::Result<()> {
        self.call()?;
        if let Some(spec) = self.running.lock().unwrap().get_mut(group) {
            spec.replicas = replicas;
        }
        Ok(())
    }
    fn processors(&self) -> Vec<ProcessorStatus> {
        Vec::new()
    }
}

fn run(
    state: &StateDir,
    kafka: &FakeKafka,
    runtime: &FakeRuntime<'_>,
    progress: CutoverProgress,
) -> Result<(), plumber::cutover::Error> {
    let workdirs: BTreeMap<String, PathBuf> = BTreeMap::new();
    let on_event = |_: Event<'_>| {};
    let stopping = || false;
    Engine {
        topology: "t",
        bootstrap: "fake:9092",
        admin: kafka,
        runtime,
        state,
        config: &CutoverConfig::default(),
        workdirs: &workdirs,
        on_event: &on_event,
        stopping: &stopping,
    }
    .run(progress)
}

fn fresh(from: Option<&str>, to: &str, actions: Vec<Action>) -> CutoverProgress {
    CutoverProgress {
        from: from.map(str::to_owned),
        to: to.into(),
        actions,
        done: 0,
        prepared: false,
        handovers: Vec::new(),
        started_at: 0,
    }
}

/// Deploys revision 1 and lets the source grow, on fresh fakes.
fn deployed(kafka: &FakeKafka) -> (tempfile::TempDir, StateDir, BTreeMap<String, ProcessorSpec>) {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    kafka.create_topic("in", 3).unwrap();
    let runtime = FakeRuntime {
        kafka,
        running: Mutex::new(BTreeMap::new()),
        calls: Mutex::new(0),
        fail_at: None,
    };
    let first = plan_topology(None, Some(&revision(1)));
    run(&state, kafka, &runtime, fresh(None, "r1", first.actions)).unwrap();
    *kafka.topics.lock().unwrap().get_mut("in").unwrap() = vec![(0, 10), (5, 20), (0, 30)];
    let running = runtime.running.into_inner().unwrap();
    (dir, state, running)
}

#[test]
fn a_first_deploy_starts_every_processor_at_explicit_offsets() {
    let kafka = FakeKafka::default();
    let (_dir, state, running) = deployed(&kafka);
    assert_eq!(running.len(), 2);
    assert_eq!(state.topology("t").unwrap().commit.as_deref(), Some("r1"));
    // `a` reads the existing source from `latest` (its end then: all zeros here).
    let a = running
        .keys()
        .find(|g| g.starts_with("plumber.t.a."))
        .unwrap();
    let offsets = &kafka.committed.lock().unwrap()[a];
    assert_eq!(offsets.len(), 3);
    assert_eq!(state.history().unwrap().len(), 1);
}

#[test]
fn a_cutover_resumed_after_a_crash_at_any_point_ends_like_an_uninterrupted_one() {
    // The reference: no crash.
    let reference = {
        let kafka = FakeKafka::default();
        let (_dir, state, running) = deployed(&kafka);
        let runtime = FakeRuntime {
            kafka: &kafka,
            running: Mutex::new(running),
            calls: Mutex::new(0),
            fail_at: None,
        };
        let plan = plan_topology(Some(&revision(1)), Some(&revision(2)));
        run(
            &state,
            &kafka,
            &runtime,
            fresh(Some("r1"), "r2", plan.actions),
        )
        .unwrap();
        let calls = *runtime.calls.lock().unwrap();
        (
            runtime
                .running
                .into_inner()
                .unwrap()
                .into_keys()
                .collect::<Vec<_>>(),
            state.history().unwrap().last().unwrap().handovers.clone(),
            kafka.committed.into_inner().unwrap(),
            calls,
        )
    };
    let (running_after, handovers, committed, calls) = reference;
    assert_eq!(handovers.len(), 1, "a hands over to its successor");
    assert_eq!(
        handovers[0]
            .offsets
            .iter()
            .map(|p| p.offset)
            .collect::<Vec<_>>(),
        vec![10, 20, 30],
        "the cutover offsets are where the stopped predecessor committed"
    );

    for crash_at in 1..=calls {
        let kafka = FakeKafka::default();
        let (_dir, state, running) = deployed(&kafka);
        let crashing = FakeRuntime {
            kafka: &kafka,
            running: Mutex::new(running),
            calls: Mutex::new(0),
            fail_at: Some(crash_at),
        };
        let plan = plan_topology(Some(&revision(1)), Some(&revision(2)));
        assert!(
            run(
                &state,
                &kafka,
                &crashing,
                fresh(Some("r1"), "r2", plan.actions)
            )
            .is_err()
        );
        let commits_before = kafka.commits.lock().unwrap().clone();
        // A new daemon: what survives is the state directory and what runs.
        let progress = state
            .topology("t")
            .unwrap()
            .cutover
            .expect("progress persisted");
        let resumed = FakeRuntime {
            kafka: &kafka,
            running: Mutex::new(crashing.running.into_inner().unwrap()),
            calls: Mutex::new(0),
            fail_at: None,
        };
        run(&state, &kafka, &resumed, progress).unwrap();
        assert_eq!(
            resumed
                .running
                .into_inner()
                .unwrap()
                .into_keys()
                .collect::<Vec<_>>(),
            running_after,
            "crash at runtime call {crash_at}"
        );
        assert_eq!(state.topology("t").unwrap().commit.as_deref(), Some("r2"));
        assert_eq!(
            state.history().unwrap().last().unwrap().handovers,
            handovers
        );
        assert_eq!(
            kafka.committed.into_inner().unwrap(),
            committed,
            "crash at {crash_at}"
        );
        // A group whose processor already started never gets its offsets set again.
        let commits = kafka.commits.into_inner().unwrap();
        for group in &commits_before {
            assert_eq!(
                commits.iter().filter(|g| *g == group).count(),
                1,
                "{group} set twice after a crash at runtime call {crash_at}"
            );
        }
    }
}
