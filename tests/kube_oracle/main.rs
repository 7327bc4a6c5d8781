//! The reconciler's oracle on the Kubernetes runtime: `plumber daemon` replicas in this
//! process (the Kubernetes runtime, the Topology-status records, the Lease) on the in-memory
//! API server, a test kubelet that runs the real `plumber-processor` for every Pod from the
//! container it was rendered with, a real broker (tansu, or `PLUMBER_TEST_BOOTSTRAP`), and the
//! oracle of `tests/reconciler`: each input record reaches each sink once per route, with the
//! versions one revision gives that route; exactly once on routes every revision has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
// Shared with tests/reconciler: the world, the models, the load and the oracle (this test
// uses no `plumber up`, so parts of it go unused here).
#[path = "../support/fake_forge.rs"]
mod fake_forge;
mod fence;
#[allow(dead_code)]
#[path = "../reconciler/harness.rs"]
mod harness;
mod killed;
mod kubelet;
mod replica;
mod shipped;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use plumber::daemon::status::StepState;
use plumber::runtime::kube::crd::{self, Topology};
use plumber::runtime::kube::render::{SPEC_ANNOTATION, workload_name};
use plumber::store::{HistoryEntry, TopologyRecord};
use plumber_testkit::kube_api::{
    FakeApi, KEDA_SCALED_OBJECT_CRD, KEDA_TRIGGER_AUTHENTICATION_CRD, PodStart, RecordedRequest,
    Verb,
};
use plumber_testkit::wait_until;

use harness::{Model, Proc, World, processor_binary};
use kubelet::{FINALIZER, Kubelet};
use replica::{LeaseHolder, NS, Replica};

/// How long a cutover may take on tansu and a busy machine.
const PATIENCE: Duration = Duration::from_secs(180);

/// R1: src → a → b → out1, a → c → out2.
fn first() -> Model {
    Model::new()
        .processor(Proc::new("a", 1, &["src"]))
        .processor(Proc::new("b", 1, &["a"]))
        .processor(Proc::new("c", 1, &["a"]))
        .sink("out1", &["b"])
        .sink("out2", &["c"])
}

/// The in-memory API server as a cluster with KEDA's and Plumber's CRDs, whose Pods wait for
/// the kubelet (not ready until their probe answers; terminating until their process exited).
fn cluster() -> FakeApi {
    FakeApi::new()
        .with_workload_controller(PodStart::Pending)
        .with_pod_finalizer(FINALIZER)
        .with_crd_yaml(KEDA_SCALED_OBJECT_CRD)
        .with_crd_yaml(KEDA_TRIGGER_AUTHENTICATION_CRD)
        .with_crd(&serde_json::to_value(crd::definition()).unwrap())
}

/// The daemons' logs (every test's, interleaved), replaced by each run.
fn daemon_log() -> &'static PathBuf {
    static LOG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kube_oracle.log");
        let file = std::fs::File::create(&path).unwrap();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,plumber::cutover=debug,librdkafka=warn",
            ))
            .with_writer(std::sync::Mutex::new(file))
            .with_ansi(false)
            .init();
        path
    })
}

/// Where a test keeps its replicas' caches and its processes' logs: kept when it fails.
struct Scratch(Option<tempfile::TempDir>);

impl Scratch {
    fn new() -> Scratch {
        eprintln!("daemon log: {}", daemon_log().display());
        Scratch(Some(tempfile::tempdir().unwrap()))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.as_ref().unwrap().path().join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("caches and processor logs kept in {}", dir.keep().display());
        }
    }
}

/// The engine's record of topology `t`, from its Topology's status.
fn record(fake: &FakeApi) -> Option<TopologyRecord> {
    let topology = fake.get::<Topology>(NS, "t")?;
    let raw = topology.status?.record?;
    Some(serde_json::from_value(raw).expect("a readable record"))
}

/// The moves of topology `t` its Topology's status keeps (`plumber history`).
fn history(fake: &FakeApi) -> Vec<HistoryEntry> {
    let raw = fake
        .get::<Topology>(NS, "t")
        .and_then(|t| t.status?.record)
        .unwrap_or_default();
    serde_json::from_value(raw["history"].clone()).unwrap_or_default()
}

/// Waits until the record says `t` runs `commit`, with no move in progress.
fn wait_applied(fake: &FakeApi, commit: git2::Oid) {
    let commit = commit.to_string();
    wait_until(&format!("t runs {commit}"), PATIENCE, || {
        record(fake).is_some_and(|r| r.commit.as_deref() == Some(&commit) && r.moving.is_none())
    });
}

/// Plumber's StatefulSets, by the group of the life each runs.
fn workloads(fake: &FakeApi) -> BTreeMap<String, StatefulSet> {
    fake.list::<StatefulSet>(NS)
        .into_iter()
        .filter(|w| {
            w.metadata.labels.as_ref().is_some_and(|l| {
                l.get("app.kubernetes.io/managed-by").map(String::as_str) == Some("plumber")
            })
        })
        .map(|w| {
            let spec: serde_json::Value =
                serde_json::from_str(&w.metadata.annotations.as_ref().unwrap()[SPEC_ANNOTATION])
                    .unwrap();
            let group = spec["group"].as_str().unwrap().to_owned();
            assert_eq!(
                w.metadata.name.as_deref(),
                Some(workload_name(&group).as_str())
            );
            (group, w)
        })
        .collect()
}

/// What runs is what `model` (the final commit) says: a StatefulSet per processor life the
/// record keeps, of the model's identities and nothing else, each with one ready Pod whose
/// process the kubelet runs with the StatefulSet's group.
fn assert_runs(fake: &FakeApi, kubelet: &Kubelet, world: &World, model: &Model) {
    let identities = world.identities(model);
    let record = record(fake).expect("a record");
    let lives: BTreeMap<String, (String, String)> = record
        .deployment
        .lives
        .iter()
        .map(|l| {
            assert!(l.running, "{} is recorded as not running", l.group());
            (
                l.group().to_owned(),
                (l.step().to_owned(), l.identity().to_string()),
            )
        })
        .collect();
    let steps: BTreeMap<String, String> = lives.values().cloned().collect();
    assert_eq!(
        steps, identities,
        "the record runs the final identities only"
    );
    assert_eq!(steps.len(), lives.len(), "one life per step");
    let groups: BTreeSet<String> = lives.keys().cloned().collect();
    wait_until("only the final lives' StatefulSets exist", PATIENCE, || {
        workloads(fake).keys().cloned().collect::<BTreeSet<_>>() == groups
    });
    for (name, workload) in workloads(fake) {
        let labels = workload.metadata.labels.clone().unwrap_or_default();
        let (step, identity) = &lives[&name];
        assert_eq!(labels.get("plumber.dev/step"), Some(step));
        assert_eq!(
            labels.get("plumber.dev/identity").map(String::as_str),
            Some(&identity[..12]),
            "{name} runs the final commit's identity of {step}"
        );
    }
    wait_until(
        "one ready Pod and one process per final life, and nothing else",
        PATIENCE,
        || {
            let pods = fake.list::<Pod>(NS);
            let ready = pods.iter().all(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
            let mut running: Vec<String> =
                kubelet.processes().into_iter().map(|p| p.group).collect();
            running.sort();
            ready
                && pods.len() == groups.len()
                && running == groups.iter().cloned().collect::<Vec<_>>()
        },
    );
    assert_eq!(kubelet.refused(), Vec::<String>::new(), "every Pod ran");
}

/// A replace, a new branch, an invalid commit and a revert, each cut over by the daemon on
/// the Kubernetes runtime while records flow: nothing lost, nothing duplicated, and what
/// runs at the end is the final commit.
#[test]
fn replace_branch_invalid_commit_and_revert_deliver_exactly_once() {
    let scratch = Scratch::new();
    let world = World::new("kube-oracle");
    let fake = cluster();
    let kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let mut revisions = vec![first()];
    let r1 = world.commit("first", &revisions[0]);
    let daemon = Replica::start(&fake, &world, "plumber-0", &scratch.path("plumber-0"));
    wait_applied(&fake, r1);
    assert_runs(&fake, &kubelet, &world, &revisions[0]);
    let load = world.start_load(100);
    load.wait_for(200);

    // Replace the head step: everything below it is replaced too.
    let m = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    wait_applied(&fake, r2);
    load.wait_for(load.sent() + 200);

    // A new branch: d reads a and writes out1 beside b.
    let m = revisions[1]
        .clone()
        .processor(Proc::new("d", 1, &["a"]))
        .sink("out1", &["b", "d"]);
    let r3 = world.commit("add d", &m);
    revisions.push(m);
    wait_applied(&fake, r3);
    load.wait_for(load.sent() + 200);

    // An invalid commit changes nothing; status says why.
    let before: BTreeSet<String> = workloads(&fake).keys().cloned().collect();
    let broken = world.commit_raw(
        "broken jq",
        "topologies/t/steps/b.yaml",
        "kind: processor\ninput: a\njq: 'select('\n",
    );
    wait_until("the invalid commit is reported", PATIENCE, || {
        daemon
            .status()
            .last_error
            .is_some_and(|e| e.message.contains(&broken.to_string()))
    });
    load.wait_for(load.sent() + 100);
    assert_eq!(
        record(&fake).and_then(|r| r.commit),
        Some(r3.to_string()),
        "the invalid commit must not be applied"
    );
    assert_eq!(
        workloads(&fake).keys().cloned().collect::<BTreeSet<_>>(),
        before,
        "nothing changes for an invalid commit"
    );

    // Revert a to v1: its first identity runs again, in a new life, and so does everything
    // below it.
    let m = revisions[2].clone().replace("a", 1);
    let r4 = world.commit("revert a v2", &m);
    revisions.push(m);
    wait_applied(&fake, r4);
    let (sent, final_from) = load.finish(200);
    world.assert_oracle(&revisions, sent, final_from);
    assert_runs(&fake, &kubelet, &world, &revisions[3]);
    let a = record(&fake)
        .unwrap()
        .deployment
        .lives
        .into_iter()
        .find(|l| l.step() == "a")
        .unwrap();
    assert_eq!(a.life, 2, "the reverted identity runs in its second life");
    let moves: Vec<String> = history(&fake).into_iter().map(|h| h.to).collect();
    assert_eq!(
        moves,
        [r1, r2, r3, r4].map(|c| c.to_string()),
        "one history entry per cutover"
    );
    daemon.stop();
}

/// A step's `env` from a Secret reaches the process as the Pod renders it: the Pod holds the
/// reference (`valueFrom.secretKeyRef`), the kubelet resolves it as a node would.
#[test]
fn a_step_reads_its_secret_from_the_pod_it_runs_in() {
    let scratch = Scratch::new();
    let world = World::new("kube-secret");
    let fake = cluster();
    let kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let mut secret = Secret::default();
    secret.metadata.name = Some("greeting".into());
    secret.metadata.namespace = Some(NS.into());
    secret.data = Some(BTreeMap::from([(
        "text".to_owned(),
        ByteString(b"hello from a Secret".to_vec()),
    )]));
    fake.put(&secret);
    let sink = world.topic("kube-secret-out");
    let topology = [
        (
            "topologies/s/sources/in.yaml".to_owned(),
            format!("kind: source\ntopic: {}\n", world.source_topic()),
        ),
        (
            "topologies/s/steps/greet.yaml".to_owned(),
            "kind: processor\ninput: in\njq: '{seq, greeting: $ENV.GREETING}'\nstartFrom: earliest\nenv:\n  GREETING: { secretKeyRef: { name: greeting, key: text } }\n".to_owned(),
        ),
        (
            "topologies/s/sinks/out.yaml".to_owned(),
            format!("kind: sink\ntopic: {sink}\ninput: greet\n"),
        ),
    ];
    let commit = world.commit_with("a step with a secret", &Model::new(), &topology);
    // The operator allows steps this Secret (`stepSecrets`).
    let daemon = Replica::start_with(
        &fake,
        &world,
        "plumber-0",
        &scratch.path("plumber-0"),
        |config| {
            config.step_secrets = plumber::spec::StepSecrets::Only {
                names: ["greeting".to_owned()].into(),
                origin: "the test".into(),
            };
        },
    );
    wait_until("s runs its commit", PATIENCE, || {
        fake.get::<Topology>(NS, "s")
            .and_then(|t| t.status?.record)
            .and_then(|r| serde_json::from_value::<TopologyRecord>(r).ok())
            .is_some_and(|r| r.commit == Some(commit.to_string()) && r.moving.is_none())
    });
    world.broker.produce(
        world.source_topic(),
        &[plumber_testkit::TestRecord::new("k", r#"{"seq":7}"#)],
    );
    let out = world
        .broker
        .wait_for_records(&sink, "the greeting", |r| !r.is_empty());
    assert_eq!(
        out[0].value_str(),
        r#"{"seq":7,"greeting":"hello from a Secret"}"#
    );
    let pods = fake.list::<Pod>(NS);
    assert_eq!(pods.len(), 1);
    let env = &pods[0].spec.as_ref().unwrap().containers[0].env;
    assert!(
        env.iter().flatten().any(|e| e.name == "GREETING"
            && e.value.is_none()
            && e.value_from
                .as_ref()
                .is_some_and(|f| f.secret_key_ref.is_some())),
        "the Pod holds the reference, not the value: {env:?}"
    );

    // Records/s come from the Pod's own /metrics, which the daemon reads at its Pod IP.
    let pod_ip = pods[0].status.as_ref().and_then(|s| s.pod_ip.clone());
    assert!(
        pod_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("127.") && ip != "127.0.0.1"),
        "the Pod has an address of its own: {pod_ip:?}"
    );
    let load = world.start_load(50);
    wait_until("greet shows its records/s", PATIENCE, || {
        daemon
            .status()
            .topologies
            .iter()
            .find(|t| t.name == "s")
            .and_then(|t| {
                t.steps
                    .iter()
                    .find(|s| s.name == "greet")?
                    .records_per_second
            })
            .is_some_and(|rate| rate > 0.0)
    });
    let metrics = ureq::get(&format!("{}/metrics", daemon.api()))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let gauge = r#"plumber_processor_records_per_second{topology="s",step="greet"} "#;
    assert!(metrics.contains(gauge), "{gauge} in\n{metrics}");
    load.stop();
    assert_eq!(kubelet.refused(), Vec::<String>::new());
    daemon.stop();
}

/// The cutover's write that records a stopped life (and so its cutover offsets) on `t`'s
/// Topology status: a status replace whose record no longer holds life `group`.
fn records_stop_of(request: &RecordedRequest, group: &str) -> bool {
    request.verb() == Verb::Replace
        && request.resource() == Some("topologies")
        && request.subresource() == Some("status")
        && request
            .body
            .as_ref()
            .and_then(|b| b.pointer("/status/record/deployment/lives"))
            .and_then(|lives| lives.as_array())
            .is_some_and(|lives| lives.iter().all(|l| l["start"]["group"] != group))
}

/// A stop's look at whether the pods of life `group` are gone: a list of pods selected by
/// the life's labels.
fn lists_pods_of(request: &RecordedRequest, group: &str) -> bool {
    let Some(selector) = plumber::runtime::kube::render::selector_of_group(group) else {
        return false;
    };
    let query = request
        .query
        .get("labelSelector")
        .map(String::as_str)
        .unwrap_or_default();
    request.verb() == Verb::List
        && request.resource() == Some("pods")
        && selector
            .iter()
            .all(|(k, v)| query.split(',').any(|term| term == format!("{k}={v}")))
}

/// Two daemon replicas, as `deploy/` runs them, both up from the start (the second waits for
/// the lease), with R1 running under load.
struct Takeover {
    scratch: Scratch,
    world: World,
    fake: FakeApi,
    kubelet: Kubelet,
    holder: Option<Replica>,
    standby: Replica,
    revisions: Vec<Model>,
    commits: Vec<git2::Oid>,
    load: Option<harness::Load>,
}

impl Takeover {
    fn new(name: &str) -> Takeover {
        let scratch = Scratch::new();
        let world = World::new(name);
        let fake = cluster();
        let kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
        let holder = Replica::start(&fake, &world, "plumber-0", &scratch.path("plumber-0"));
        wait_until("plumber-0 holds the lease", PATIENCE, || {
            holder.holds_lease()
        });
        let standby = Replica::start(&fake, &world, "plumber-1", &scratch.path("plumber-1"));
        let revisions = vec![first()];
        let r1 = world.commit("first", &revisions[0]);
        wait_applied(&fake, r1);
        assert!(!standby.holds_lease());
        let load = world.start_load(100);
        load.wait_for(200);
        Takeover {
            scratch,
            world,
            fake,
            kubelet,
            holder: Some(holder),
            standby,
            revisions,
            commits: vec![r1],
            load: Some(load),
        }
    }

    /// Commits R2: a replaced by its v2 (and b and c below it).
    fn replace_a(&mut self) {
        let m = self.revisions[0].clone().replace("a", 2);
        self.commits.push(self.world.commit("a v2", &m));
        self.revisions.push(m);
    }

    /// The group of a's first life.
    fn first_a(&self) -> String {
        let identity = &self.world.identities(&self.revisions[0])["a"];
        plumber::plan::deployment::base_name("t", "a", identity.parse().unwrap())
    }

    /// Crashes the holder; waits until the standby took the lease over and R2 runs.
    fn crash_and_take_over(&mut self) -> replica::Crashed {
        let crashed = self.holder.take().unwrap().crash();
        wait_until("plumber-1 takes the lease over", PATIENCE, || {
            self.standby.holds_lease()
        });
        wait_applied(&self.fake, self.commits[1]);
        crashed
    }

    /// The oracle over R1 and R2, what runs is R2, and the history has each cutover once.
    fn finish(mut self) {
        let load = self.load.take().unwrap();
        load.wait_for(load.sent() + 200);
        let (sent, final_from) = load.finish(200);
        self.world.assert_oracle(&self.revisions, sent, final_from);
        assert_runs(&self.fake, &self.kubelet, &self.world, &self.revisions[1]);
        let moves: Vec<String> = history(&self.fake).into_iter().map(|h| h.to).collect();
        assert_eq!(
            moves,
            self.commits
                .iter()
                .map(git2::Oid::to_string)
                .collect::<Vec<_>>(),
            "each cutover recorded once, across the crash"
        );
        self.standby.stop();
        drop(self.scratch);
    }
}

/// The lease holder dies in the middle of a cutover, after it stopped the replaced step (its
/// pods gone, its process exited after committing) and before the write that records the
/// stop was answered: the other replica takes the lease once it lapses, resumes from the
/// Topology's record, redoes the stop (nothing left to stop; the same cutover offsets) and
/// finishes the cutover. Nothing lost, nothing duplicated; the dead replica's late write is
/// refused.
#[test]
fn a_replica_killed_before_it_recorded_a_stop_hands_over_to_the_other() {
    let mut t = Takeover::new("kube-takeover");
    // Injected: the API server holds plumber-0's write that records the stop of a's first
    // life (the first status write with a position of step a) until the end of the test;
    // plumber-0 crashes while it waits for the answer.
    let taken = AtomicBool::new(false);
    let first_a = t.first_a();
    // The first deploy's writes, before a's first life, do not hold it either.
    let before = t.fake.requests().len();
    let hold = {
        let group = first_a.clone();
        t.fake
            .hold(move |r| records_stop_of(r, &group) && !taken.swap(true, Ordering::SeqCst))
    };
    t.replace_a();
    wait_until("plumber-0 records the stop of a", PATIENCE, || {
        hold.held() == 1
    });
    assert!(
        record(&t.fake)
            .unwrap()
            .deployment
            .lives
            .iter()
            .any(|l| l.group() == first_a),
        "a's first life is still recorded: its stop is not"
    );
    assert!(
        !workloads(&t.fake).contains_key(&first_a),
        "a's first life was stopped before the crash"
    );
    let crashed = t.crash_and_take_over();

    // The dead replica's write arrives now: refused, the record stays plumber-1's.
    drop(hold);
    wait_until(
        "the dead replica's late write is answered",
        PATIENCE,
        || {
            t.fake
                .requests()
                .iter()
                .skip(before)
                .find(|r| records_stop_of(r, &first_a))
                .is_some_and(|r| r.status.is_some())
        },
    );
    let late = t
        .fake
        .requests()
        .into_iter()
        .skip(before)
        .find(|r| records_stop_of(r, &first_a))
        .unwrap();
    assert_eq!(late.status, Some(409), "a stale record write must conflict");
    crashed.reap();
    assert_eq!(
        record(&t.fake).and_then(|r| r.commit),
        Some(t.commits[1].to_string())
    );
    t.finish();
}

/// The lease holder deletes the replaced step's StatefulSet and dies while its pod still
/// terminates (a 15 s `preStop` sleep: the process goes on processing and committing). The
/// replica that takes over knows the life by its record only (no StatefulSet, no spec): its
/// stop must still wait for the pod, and read the cutover offsets only after the process
/// committed its last records.
#[test]
fn a_replica_killed_while_the_replaced_step_terminates_hands_over_to_the_other() {
    let mut t = Takeover::new("kube-terminating");
    let first_a = t.first_a();
    // Injected: the first look of plumber-0's stop at a's pods (right after it deleted the
    // StatefulSet) is held; plumber-0 crashes there. The kubelet keeps the pod's process
    // running for 15 s after it was told to terminate.
    t.kubelet.delay_terminations(Duration::from_secs(15));
    let taken = AtomicBool::new(false);
    let hold = {
        let group = first_a.clone();
        t.fake
            .hold(move |r| lists_pods_of(r, &group) && !taken.swap(true, Ordering::SeqCst))
    };
    t.replace_a();
    wait_until("plumber-0 looks at a's pods", PATIENCE, || hold.held() == 1);
    assert!(!workloads(&t.fake).contains_key(&first_a));
    let terminating = t.fake.list::<Pod>(NS).into_iter().any(|p| {
        p.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(&workload_name(&first_a)))
            && p.metadata.deletion_timestamp.is_some()
    });
    assert!(terminating, "a's first pod terminates when plumber-0 dies");
    let crashed = t.holder.take().unwrap().crash();
    // What the dead replica's held request answers, nobody acts on.
    drop(hold);
    crashed.reap();
    wait_until("plumber-1 takes the lease over", PATIENCE, || {
        t.standby.holds_lease()
    });
    wait_until("a's first pod is gone", PATIENCE, || {
        t.fake.list::<Pod>(NS).iter().all(|p| {
            p.metadata
                .name
                .as_deref()
                .is_none_or(|n| !n.starts_with(&workload_name(&first_a)))
        })
    });
    // The other old pods stop as usual.
    t.kubelet.delay_terminations(Duration::ZERO);
    wait_applied(&t.fake, t.commits[1]);
    t.finish();
}

/// The label that opts a pull request into a preview.
const PREVIEW_LABEL: &str = "preview";

/// The webhook secret of the preview scenario's replica.
const HOOK_SECRET: &str = "kube-preview-hook-secret";

/// Topology `s`: the world's source → `clean` (tags each record with `by`) → `sink`.
fn tagging(world: &World, sink: &str, by: &str) -> Vec<(String, String)> {
    vec![
        (
            "topologies/s/sources/in.yaml".to_owned(),
            format!("kind: source\ntopic: {}\n", world.source_topic()),
        ),
        ("topologies/s/steps/clean.yaml".to_owned(), clean(by)),
        (
            "topologies/s/sinks/out.yaml".to_owned(),
            format!("kind: sink\ntopic: {sink}\ninput: clean\n"),
        ),
    ]
}

fn clean(by: &str) -> String {
    format!("kind: processor\ninput: in\njq: '. + {{by: \"{by}\"}}'\nstartFrom: earliest\n")
}

/// The record of topology `name`, from its Topology's status.
fn record_of(fake: &FakeApi, name: &str) -> Option<TopologyRecord> {
    let raw = fake.get::<Topology>(NS, name)?.status?.record?;
    Some(serde_json::from_value(raw).expect("a readable record"))
}

/// The `v`s of the records on a sink tagged `by`, in the order read (duplicates kept).
fn values_by(records: &[plumber_testkit::TestRecord], by: &str) -> Vec<u64> {
    records
        .iter()
        .filter_map(|r| serde_json::from_str::<serde_json::Value>(r.value_str()).ok())
        .filter(|json| json["by"] == by)
        .filter_map(|json| json["v"].as_u64())
        .collect()
}

fn sorted(mut values: Vec<u64>) -> Vec<u64> {
    values.sort_unstable();
    values
}

fn numbered(from: u64, count: u64) -> Vec<plumber_testkit::TestRecord> {
    (from..from + count)
        .map(|v| plumber_testkit::TestRecord::new(&format!("k{v}"), &format!("{{\"v\":{v}}}")))
        .collect()
}

/// KEDA's ScaledObjects in the namespace, by name.
fn scaled_objects(fake: &FakeApi) -> BTreeMap<String, serde_json::Value> {
    let resource = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    );
    fake.list_dynamic(&resource, NS)
        .into_iter()
        .filter_map(|o| Some((o["metadata"]["name"].as_str()?.to_owned(), o)))
        .collect()
}

/// The group of the preview `s.pr-7`'s step `clean` once `replica` shows it running.
fn preview_group(replica: &Replica, what: &str) -> String {
    wait_until_some(what, PATIENCE, || {
        let preview = shown(replica, "s.pr-7")?;
        preview
            .steps
            .iter()
            .find(|s| s.name == "clean" && s.state == StepState::Running)?
            .group
            .clone()
    })
}

/// The status a replica shows of topology `name`.
fn shown(replica: &Replica, name: &str) -> Option<plumber::daemon::status::TopologyStatus> {
    replica
        .status()
        .topologies
        .into_iter()
        .find(|t| t.name == name)
}

/// A daemon that previews pull requests labelled [`PREVIEW_LABEL`] (the fake GitHub says
/// which), watching pull requests' refs and taking webhooks signed with [`HOOK_SECRET`].
fn with_previews(
    config: &mut plumber::daemon::DaemonConfig,
    forge: &fake_forge::Server,
    token: &std::path::Path,
) {
    config.watch_refs = vec!["refs/pull/*/head".into()];
    config.forge = Some(
        plumber::forge::Config::new(plumber::forge::Kind::GitHub, fake_forge::GITHUB_REPO, token)
            .with_url(&forge.url),
    );
    config.preview_label = Some(PREVIEW_LABEL.into());
    config.webhook_secret = Some(HOOK_SECRET.into());
    config.poll_interval = Duration::from_secs(1);
}

/// Whether the broker has topic `topic`.
fn topic_exists(world: &World, topic: &str) -> bool {
    world.broker.topic_names().contains(topic)
}

/// A replica that does not hold the lease leaves a labelled pull request's preview to the
/// holder: it creates no shadow topic and applies nothing. Once it holds the lease (the
/// other holder gave it up), it runs the preview: shadow topic, StatefulSet, records.
#[test]
fn a_standby_leaves_previews_to_the_lease_holder_until_it_holds_the_lease() {
    use fake_forge::{Server, TOKEN};
    use plumber::forge::{Kind, PullRequestState};

    let scratch = Scratch::new();
    let world = World::new("kube-preview-standby");
    let fake = cluster();
    let kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let sink = world.topic("kube-preview-standby-out");
    let main = world.commit_with("main", &Model::new(), &tagging(&world, &sink, "main"));
    world.pull_request(
        7,
        "tag by pr",
        "topologies/s/steps/clean.yaml",
        &clean("pr"),
    );
    let forge = Server::start(Kind::GitHub);
    forge.seed(7, 0, None, "");
    forge.set_pull_request(7, PullRequestState::Open, &[PREVIEW_LABEL]);
    let token = world.scratch_file("forge-token", &format!("{TOKEN}\n"));
    // Injected: the Lease is held by "elsewhere", which is no daemon and never acts.
    let elsewhere = LeaseHolder::start(&fake, "elsewhere");
    wait_until("elsewhere holds the lease", PATIENCE, || elsewhere.held());
    let standby = Replica::start_with(
        &fake,
        &world,
        "plumber-0",
        &scratch.path("plumber-0"),
        |config| with_previews(config, &forge, &token),
    );
    wait_until(
        "the standby decided to preview pull request 7",
        PATIENCE,
        || shown(&standby, "s.pr-7").is_some_and(|t| t.preview_of.is_some()),
    );
    let shadow = format!("{sink}.preview.pr-7");
    // The decision creates the shadow topics before it shows `previewOf`, in one call, so
    // their absence now is final for it. A standby's worker leaves no trace in the API to
    // wait for, so its StatefulSets are checked at the end, against the order of requests.
    assert!(
        !topic_exists(&world, &shadow),
        "a standby created the shadow topic"
    );
    assert!(!standby.holds_lease());

    elsewhere.release();
    wait_until("plumber-0 takes the lease", PATIENCE, || {
        standby.holds_lease()
    });
    wait_until("s runs main", PATIENCE, || {
        record_of(&fake, "s")
            .is_some_and(|r| r.commit == Some(main.to_string()) && r.moving.is_none())
    });
    let group = wait_until_some("the preview's step runs", PATIENCE, || {
        let preview = shown(&standby, "s.pr-7")?;
        preview
            .steps
            .iter()
            .find(|s| s.name == "clean" && s.state == StepState::Running)?
            .group
            .clone()
    });
    assert!(
        topic_exists(&world, &shadow),
        "the holder creates the shadow topic"
    );
    wait_until("the kubelet runs the preview's pod", PATIENCE, || {
        kubelet.processes().iter().any(|p| p.group == group)
    });
    world.broker.produce(world.source_topic(), &numbered(1, 10));
    let expected: Vec<u64> = (1..=10).collect();
    world
        .broker
        .wait_for_records(&shadow, "the preview's output", |r| {
            sorted(values_by(r, "pr")) == expected
        });
    // Whenever the standby would have written a StatefulSet, the request log holds it: the
    // first write of one comes after plumber-0 took the lease.
    let requests = fake.requests();
    let took_lease = requests
        .iter()
        .position(|r| {
            r.method != "GET"
                && r.path.contains("/leases")
                && r.body
                    .as_ref()
                    .is_some_and(|b| b["spec"]["holderIdentity"].as_str() == Some("plumber-0"))
        })
        .expect("plumber-0's lease write is in the log");
    let first_workload_write = requests
        .iter()
        .position(|r| r.method != "GET" && r.path.contains("/statefulsets"))
        .expect("the holder applied the preview's StatefulSet");
    assert!(
        first_workload_write > took_lease,
        "a standby wrote a StatefulSet (request {first_workload_write}) before it took the lease (request {took_lease})"
    );
    standby.stop();
}

/// Without `--keep-topics`, a torn-down preview's record is forgotten: its Topology object
/// is deleted once its processors stopped and its group was deleted, and labelled again it
/// starts over in a new Topology that owns its new StatefulSet. The topology's own Topology
/// and record stay. (Deleting the shadow topic breaks tansu's other topics, the sink the
/// preview needs to start again among them: on tansu the test ends with the teardown.)
#[test]
fn a_torn_down_preview_s_topology_is_deleted_and_made_again_when_labelled_again() {
    use fake_forge::{Server, TOKEN};
    use plumber::forge::{Kind, PullRequestState};

    let scratch = Scratch::new();
    let world = World::new("kube-preview-forget");
    let fake = cluster();
    let _kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let sink = world.topic("kube-preview-forget-out");
    let main = world.commit_with("main", &Model::new(), &tagging(&world, &sink, "main"));
    world.pull_request(
        7,
        "tag by pr",
        "topologies/s/steps/clean.yaml",
        &clean("pr"),
    );
    let forge = Server::start(Kind::GitHub);
    forge.seed(7, 0, None, "");
    forge.set_pull_request(7, PullRequestState::Open, &[PREVIEW_LABEL]);
    let token = world.scratch_file("forge-token", &format!("{TOKEN}\n"));
    let daemon = Replica::start_with(
        &fake,
        &world,
        "plumber-0",
        &scratch.path("plumber-0"),
        |config| {
            with_previews(config, &forge, &token);
            config.cutover.keep_topics = false;
        },
    );
    let running = |what: &str| preview_group(&daemon, what);
    let group = running("the preview runs");
    let first = fake.get::<Topology>(NS, "s.pr-7").unwrap();
    let owner = |group: &str| {
        workloads(&fake)
            .remove(group)
            .and_then(|d| d.metadata.owner_references)
            .and_then(|o| o.into_iter().next())
            .map(|o| o.uid)
    };
    assert_eq!(owner(&group), first.metadata.uid);

    forge.set_pull_request(7, PullRequestState::Open, &[]);
    daemon.look_at_pull_request(7);
    wait_until("the preview's Topology is deleted", PATIENCE, || {
        fake.get::<Topology>(NS, "s.pr-7").is_none()
    });
    assert!(!workloads(&fake).contains_key(&group));
    assert_eq!(
        record_of(&fake, "s").and_then(|r| r.commit),
        Some(main.to_string()),
        "the topology's record stays"
    );

    if world.broker.is_tansu() {
        daemon.stop();
        return;
    }
    forge.set_pull_request(7, PullRequestState::Open, &[PREVIEW_LABEL]);
    daemon.look_at_pull_request(7);
    let again = running("the preview runs again");
    assert_eq!(
        again, group,
        "its first life's names, its old group deleted"
    );
    let second = fake.get::<Topology>(NS, "s.pr-7").expect("a new Topology");
    assert_ne!(second.metadata.uid, first.metadata.uid);
    wait_until(
        "the new Topology owns the new StatefulSet",
        PATIENCE,
        || owner(&again) == second.metadata.uid,
    );
    daemon.stop();
}

/// GitHub's `X-Hub-Signature-256` of `body`.
fn github_signature(body: &str) -> String {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(HOOK_SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// A pull request labelled for a preview, on the Kubernetes runtime: its changed step runs as
/// a StatefulSet and a ScaledObject of its own (`plumber.s.pr-7.clean.<id>`) owned by the
/// preview's Topology, whose pod the kubelet runs; what the source gets once it runs reaches
/// the shadow topic through the pull request's step and the users' sink only through main's
/// (once). The label removed (a signed webhook says so): the preview's objects and pod go, it
/// leaves status, and the real topology's StatefulSet is left as it was.
#[test]
fn a_labelled_pull_request_s_preview_runs_as_statefulsets_and_goes_when_unlabelled() {
    use fake_forge::{Server, TOKEN};
    use plumber::forge::{Kind, PullRequestState};

    let scratch = Scratch::new();
    let world = World::new("kube-preview");
    let fake = cluster();
    let kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let sink = world.topic("kube-preview-out");
    let main = world.commit_with("main", &Model::new(), &tagging(&world, &sink, "main"));
    let forge = Server::start(Kind::GitHub);
    forge.seed(7, 0, None, "");
    forge.set_pull_request(7, PullRequestState::Open, &[PREVIEW_LABEL]);
    let token = world.scratch_file("forge-token", &format!("{TOKEN}\n"));
    let configure = |config: &mut plumber::daemon::DaemonConfig| {
        with_previews(config, &forge, &token);
    };
    let holder = Replica::start_with(
        &fake,
        &world,
        "plumber-0",
        &scratch.path("plumber-0"),
        configure,
    );
    wait_until("plumber-0 holds the lease", PATIENCE, || {
        holder.holds_lease()
    });
    let standby = Replica::start_with(
        &fake,
        &world,
        "plumber-1",
        &scratch.path("plumber-1"),
        configure,
    );
    wait_until("s runs main", PATIENCE, || {
        record_of(&fake, "s")
            .is_some_and(|r| r.commit == Some(main.to_string()) && r.moving.is_none())
    });
    let real: Vec<(String, StatefulSet)> = workloads(&fake).into_iter().collect();
    assert_eq!(real.len(), 1, "one StatefulSet for s's one step");
    let (real_name, real_workload) = real.into_iter().next().unwrap();
    assert!(real_name.starts_with("plumber.s.clean."), "{real_name}");

    // The pull request changes `clean`.
    world.pull_request(
        7,
        "tag by pr",
        "topologies/s/steps/clean.yaml",
        &clean("pr"),
    );
    let group = wait_until_some("the preview's step runs", PATIENCE, || {
        let preview = shown(&holder, "s.pr-7")?;
        preview
            .steps
            .iter()
            .find(|s| s.name == "clean" && s.state == StepState::Running)?
            .group
            .clone()
    });
    assert!(group.starts_with("plumber.s.pr-7.clean."), "{group}");
    let shadow = format!("{sink}.preview.pr-7");
    let preview_of = shown(&holder, "s.pr-7").unwrap().preview_of.unwrap();
    assert_eq!(preview_of.topology, "s");
    assert_eq!(preview_of.pull_request, 7);
    assert_eq!(preview_of.shadow_topics.get(&shadow), Some(&sink));

    // Its objects, as rendered: labels of the preview, owned by the preview's Topology.
    let topology = fake
        .get::<Topology>(NS, "s.pr-7")
        .expect("the preview's Topology");
    let workload = workloads(&fake)
        .remove(&group)
        .expect("the preview's StatefulSet");
    let labels = workload.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("plumber.dev/topology").map(String::as_str),
        Some("s.pr-7")
    );
    assert_eq!(
        labels.get("plumber.dev/step").map(String::as_str),
        Some("clean")
    );
    let owners = workload
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].kind, "Topology");
    assert_eq!(owners[0].name, "s.pr-7");
    assert_eq!(Some(&owners[0].uid), topology.metadata.uid.as_ref());
    let scaled = scaled_objects(&fake)
        .remove(&group)
        .expect("the preview's ScaledObject");
    assert_eq!(scaled["metadata"]["ownerReferences"][0]["name"], "s.pr-7");
    assert_eq!(
        scaled["metadata"]["labels"]["plumber.dev/topology"], "s.pr-7",
        "{scaled:#}"
    );
    wait_until("the kubelet runs the preview's pod", PATIENCE, || {
        kubelet.processes().iter().any(|p| p.group == group)
    });

    // Records written now reach the shadow topic through the pull request's step, the users'
    // sink through main's only, once each.
    world.broker.produce(world.source_topic(), &numbered(1, 10));
    let expected: Vec<u64> = (1..=10).collect();
    world
        .broker
        .wait_for_records(&shadow, "the preview's output", |r| {
            sorted(values_by(r, "pr")) == expected
        });
    let out = world.broker.wait_for_records(&sink, "main's output", |r| {
        sorted(values_by(r, "main")) == expected
    });
    assert!(
        values_by(&out, "pr").is_empty(),
        "the preview wrote the users' sink"
    );
    assert!(
        values_by(&world.broker.read_all(&shadow), "main").is_empty(),
        "main wrote the shadow topic"
    );

    // A rolling restart of the daemon: plumber-0 stops, plumber-1 takes the lease over and
    // leaves the preview running as it is.
    let preview_workload = workload;
    holder.stop();
    wait_until("plumber-1 takes the lease over", PATIENCE, || {
        standby.holds_lease()
    });
    world.broker.produce(world.source_topic(), &numbered(11, 5));
    let expected: Vec<u64> = (1..=15).collect();
    world
        .broker
        .wait_for_records(&shadow, "the preview's output after the takeover", |r| {
            sorted(values_by(r, "pr")) == expected
        });
    world
        .broker
        .wait_for_records(&sink, "main's output after the takeover", |r| {
            sorted(values_by(r, "main")) == expected
        });
    wait_until("plumber-1 shows the preview running", PATIENCE, || {
        shown(&standby, "s.pr-7").is_some_and(|t| {
            t.steps
                .iter()
                .any(|s| s.group.as_ref() == Some(&group) && s.state == StepState::Running)
        })
    });
    let kept = workloads(&fake)
        .remove(&group)
        .expect("the preview's StatefulSet stays");
    assert_eq!(kept.metadata.uid, preview_workload.metadata.uid);
    assert_eq!(
        kept.metadata.generation,
        preview_workload.metadata.generation
    );
    let daemon = standby;

    // The label removed; a signed webhook says so.
    forge.set_pull_request(7, PullRequestState::Open, &[]);
    let body = r#"{"action":"unlabeled","number":7}"#;
    let answer = ureq::post(&format!("{}/hooks/git", daemon.api()))
        .header("x-github-event", "pull_request")
        .header("x-hub-signature-256", &github_signature(body))
        .send(body)
        .unwrap();
    assert_eq!(answer.status().as_u16(), 202);
    wait_until("the preview leaves status", PATIENCE, || {
        shown(&daemon, "s.pr-7").is_none()
    });
    wait_until(
        "the preview's StatefulSet and ScaledObject are deleted",
        PATIENCE,
        || !workloads(&fake).contains_key(&group) && !scaled_objects(&fake).contains_key(&group),
    );
    wait_until("the preview's pod is gone", PATIENCE, || {
        fake.list::<Pod>(NS).iter().all(|p| {
            p.metadata
                .name
                .as_deref()
                .is_none_or(|n| !n.starts_with(&workload_name(&group)))
        }) && kubelet.processes().iter().all(|p| p.group != group)
    });
    let after = workloads(&fake)
        .remove(&real_name)
        .expect("s's StatefulSet stays");
    assert_eq!(after.metadata.uid, real_workload.metadata.uid);
    assert_eq!(after.metadata.generation, real_workload.metadata.generation);
    assert_eq!(
        after.spec, real_workload.spec,
        "s's StatefulSet is untouched"
    );
    assert_eq!(
        record_of(&fake, "s").and_then(|r| r.commit),
        Some(main.to_string())
    );

    // s runs on: what comes now reaches the users' sink, once, and nothing the shadow topic.
    world.broker.produce(world.source_topic(), &numbered(16, 5));
    let all: Vec<u64> = (1..=20).collect();
    let out = world
        .broker
        .wait_for_records(&sink, "main's output after the teardown", |r| {
            sorted(values_by(r, "main")) == all
        });
    assert_eq!(
        sorted(values_by(&out, "main")),
        all,
        "exactly once on the users' sink"
    );
    assert!(
        values_by(&world.broker.read_all(&shadow), "pr")
            .iter()
            .all(|v| *v <= 15),
        "nothing reaches the shadow topic after the teardown"
    );
    // Its record: with --keep-topics (tansu) its internal topics keep their records, so its
    // retired record stays and one started again gets new names; otherwise its Topology goes.
    if world.broker.is_tansu() {
        assert!(
            record_of(&fake, "s.pr-7").is_some_and(|r| r.is_retired()),
            "the retired record stays beside kept topics"
        );
    } else {
        wait_until("the preview's Topology is deleted", PATIENCE, || {
            fake.get::<Topology>(NS, "s.pr-7").is_none()
        });
    }
    assert!(fake.get::<Topology>(NS, "s").is_some());
    assert_eq!(kubelet.refused(), Vec::<String>::new(), "every Pod ran");
    forge.assert_clean();
    daemon.stop();
}

/// Waits until `look` finds something, and returns it.
fn wait_until_some<T>(what: &str, timeout: Duration, mut look: impl FnMut() -> Option<T>) -> T {
    let mut found = None;
    wait_until(what, timeout, || {
        found = look();
        found.is_some()
    });
    found.unwrap()
}

/// SPEC §11, on the Kubernetes runtime: a label approves the head it was set on. Commits
/// pushed after it stop the preview (no StatefulSet of theirs is ever applied) until a
/// maintainer labels the pull request again: a signed `labeled` webhook names the head it
/// approves, and that head's step runs, as a pod of the test kubelet.
#[test]
fn a_preview_runs_only_the_heads_its_label_approved() {
    use fake_forge::{Server, TOKEN};
    use plumber::forge::{Kind, PullRequestState};

    let scratch = Scratch::new();
    let world = World::new("kube-preview-approve");
    let fake = cluster();
    let kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let sink = world.topic("kube-preview-approve-out");
    world.commit_with("main", &Model::new(), &tagging(&world, &sink, "main"));
    let reviewed = world.pull_request(
        7,
        "tag by pr",
        "topologies/s/steps/clean.yaml",
        &clean("pr"),
    );
    let forge = Server::start(Kind::GitHub);
    forge.seed(7, 0, None, "");
    forge.set_pull_request(7, PullRequestState::Open, &[PREVIEW_LABEL]);
    forge.set_head(7, &reviewed.to_string());
    let token = world.scratch_file("forge-token", &format!("{TOKEN}\n"));
    let daemon = Replica::start_with(
        &fake,
        &world,
        "plumber-0",
        &scratch.path("plumber-0"),
        |config| with_previews(config, &forge, &token),
    );
    let running = |what: &str| preview_group(&daemon, what);
    let approved_group = running("the reviewed head's preview runs");
    wait_until("the kubelet runs its pod", PATIENCE, || {
        kubelet
            .processes()
            .iter()
            .any(|p| p.group == approved_group)
    });

    // The author pushes again; nobody labels.
    let pushed = world.pull_request(
        7,
        "tag otherwise",
        "topologies/s/steps/clean.yaml",
        &clean("pushed"),
    );
    forge.set_head(7, &pushed.to_string());
    wait_until("the preview stops for the new commits", PATIENCE, || {
        shown(&daemon, "s.pr-7").is_none() && !workloads(&fake).contains_key(&approved_group)
    });
    wait_until("the label comes off", PATIENCE, || {
        !forge.labels(7).iter().any(|l| l == PREVIEW_LABEL)
    });
    assert!(
        workloads(&fake)
            .keys()
            .all(|name| !name.starts_with("plumber.s.pr-7.")),
        "a StatefulSet of the unapproved head: {:?}",
        workloads(&fake).keys().collect::<Vec<_>>()
    );

    // Labelled again: the signed webhook names the head the label approves.
    forge.set_pull_request(7, PullRequestState::Open, &[PREVIEW_LABEL]);
    let body = format!(
        r#"{{"action":"labeled","number":7,"label":{{"name":"{PREVIEW_LABEL}"}},"pull_request":{{"head":{{"sha":"{pushed}"}}}}}}"#
    );
    let answer = ureq::post(&format!("{}/hooks/git", daemon.api()))
        .header("x-github-event", "pull_request")
        .header("x-hub-signature-256", &github_signature(&body))
        .send(&body)
        .unwrap();
    assert_eq!(answer.status().as_u16(), 202);
    let group = running("the pushed head's preview runs once labelled again");
    assert_ne!(
        group, approved_group,
        "the new head's step is another identity"
    );
    wait_until("the kubelet runs the new head's pod", PATIENCE, || {
        kubelet.processes().iter().any(|p| p.group == group)
    });
    world.broker.produce(world.source_topic(), &numbered(1, 5));
    let shadow = format!("{sink}.preview.pr-7");
    world
        .broker
        .wait_for_records(&shadow, "the approved head's output", |r| {
            sorted(values_by(r, "pushed")) == (1..=5).collect::<Vec<u64>>()
        });
    daemon.stop();
}
