//! The Kubernetes runtime and the Topology-status store on the in-memory API server of
//! `plumber_testkit::kube_api` (a real `kube::Client` in front of it): the requests they make
//! (apply patch type, field manager, order, selectors), stop ordering, drift repair, garbage
//! collection, a restarted daemon, and never a lost update of the cutover record. KEDA's own
//! CRD schemas validate what is applied, as the API server would.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8s_openapi::api::core::v1::Pod;
use kube::core::{ApiResource, GroupVersionKind};
use plumber::runtime::kube::apply::{KubeConfig, KubeRuntime};
use plumber::runtime::kube::crd;
use plumber::runtime::kube::keda::TriggerAuthentication;
use plumber::runtime::kube::lease::{HOLDER_LABEL, Lease, LeaseConfig};
use plumber::runtime::kube::render::{RenderConfig, SPEC_ANNOTATION, Source, workload_name};
use plumber::runtime::{Cluster, ProcessorSpec, Runtime, Settings};
use plumber::spec::{EnvValue, Resources, Scale, Transform};
use plumber::store::topology::{HISTORY_KEPT, TopologyStore};
use plumber::store::{CutoverStore, HistoryEntry, Outcome, TopologyRecord};
use plumber_testkit::kube_api::{
    FakeApi, Fault, KEDA_SCALED_OBJECT_CRD, KEDA_TRIGGER_AUTHENTICATION_CRD, PodStart, Verb,
};

const NS: &str = "data";

fn fake() -> FakeApi {
    FakeApi::new()
        .with_workload_controller(PodStart::Ready)
        .with_crd_yaml(KEDA_SCALED_OBJECT_CRD)
        .with_crd_yaml(KEDA_TRIGGER_AUTHENTICATION_CRD)
        .with_crd(&serde_json::to_value(crd::definition()).unwrap())
}

fn config() -> KubeConfig {
    KubeConfig {
        stop_timeout: Duration::from_secs(2),
        poll: Duration::from_millis(20),
        ..KubeConfig::new(RenderConfig {
            namespace: NS.into(),
            processor_image: "ghcr.io/plumber-dev/plumber-processor:0.1.0".into(),
            pull_policy: None,
            owner: None,
        })
    }
}

/// The tokio runtime the clients live on, as `plumber daemon` has one.
static TOKIO: std::sync::LazyLock<tokio::runtime::Runtime> = std::sync::LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
});

fn handle() -> tokio::runtime::Handle {
    TOKIO.handle().clone()
}

fn client(fake: &FakeApi) -> kube::Client {
    let _inside = TOKIO.enter();
    fake.client(NS)
}

fn runtime(fake: &FakeApi) -> KubeRuntime {
    KubeRuntime::connect(client(fake), handle(), config()).unwrap()
}

fn spec(step: &str, id: &str) -> ProcessorSpec {
    ProcessorSpec {
        topology: "shop".into(),
        step: step.into(),
        identity: id.repeat(32).parse().unwrap(),
        group: format!("plumber.shop.{step}.{}", id.repeat(6)),
        cluster: Cluster {
            bootstrap: "kafka:9093".into(),
            properties: BTreeMap::from([
                ("security.protocol".into(), "SASL_SSL".into()),
                ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
            ]),
            credentials: Some("kafka-user".into()),
        },
        inputs: vec!["orders".into()],
        input_steps: BTreeMap::new(),
        outputs: vec!["orders.valid".into()],
        dlq: format!("plumber.shop.{step}.dlq"),
        transform: Transform::Jq {
            program: "select(.ok)".into(),
        },
        env: BTreeMap::from([("MODEL".into(), EnvValue::Value("v3".into()))]),
        scale: Scale {
            min: 1,
            max: 4,
            lag_threshold: 100,
        },
        resources: None,
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        dir: "topologies/shop".into(),
        settings: Settings::default(),
        state: None,
        table: None,
        handoff_group: None,
    }
}

fn keda(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("keda.sh", "v1alpha1", kind), plural)
}

fn scaled_objects() -> ApiResource {
    keda("ScaledObject", "scaledobjects")
}

fn pods_of(fake: &FakeApi, spec: &ProcessorSpec) -> usize {
    fake.list::<Pod>(NS)
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get("plumber.dev/identity") == Some(&spec.identity.short()))
        })
        .count()
}

/// Mutating requests as `VERB resource`, in order.
fn writes(fake: &FakeApi) -> Vec<(Verb, String)> {
    fake.requests()
        .into_iter()
        .filter(|r| !matches!(r.verb(), Verb::Get | Verb::List | Verb::Watch))
        .map(|r| (r.verb(), r.resource().unwrap_or("-").to_owned()))
        .collect()
}

#[test]
fn a_start_applies_authentication_statefulset_then_scaled_object_as_plumber() {
    let fake = fake();
    let runtime = runtime(&fake);
    fake.clear_requests();
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    assert_eq!(
        writes(&fake),
        [
            (Verb::Apply, "triggerauthentications".to_owned()),
            (Verb::Apply, "statefulsets".to_owned()),
            (Verb::Apply, "scaledobjects".to_owned()),
        ]
    );
    for request in fake.requests().iter().filter(|r| r.verb() == Verb::Apply) {
        assert_eq!(
            request.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        assert_eq!(request.field_manager(), Some("plumber"));
        assert!(request.force(), "{}", request.summary());
        assert_eq!(request.namespace(), Some(NS));
    }
    let workload: StatefulSet = fake.get(NS, &workload_name(&spec.group)).unwrap();
    assert_eq!(
        workload.metadata.labels.unwrap()["plumber.dev/step"],
        "validate"
    );
    // The next processor with the cluster's credentials shares the TriggerAuthentication.
    fake.clear_requests();
    let enrich = self::spec("enrich", "cd");
    runtime.start(&enrich).unwrap();
    assert_eq!(
        writes(&fake),
        [
            (Verb::Apply, "statefulsets".to_owned()),
            (Verb::Apply, "scaledobjects".to_owned()),
        ]
    );
    wait_for(|| pods_of(&fake, &spec) == 1);
    // Starting what runs changes nothing.
    let before: StatefulSet = fake.get(NS, &workload_name(&spec.group)).unwrap();
    runtime.start(&spec).unwrap();
    let after: StatefulSet = fake.get(NS, &workload_name(&spec.group)).unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(after.metadata.generation, Some(1));
}

fn wait_for(mut condition: impl FnMut() -> bool) {
    plumber_testkit::wait_until("the fake API settles", Duration::from_secs(30), || {
        condition()
    });
}

#[test]
fn a_stop_deletes_the_scaled_object_first_and_returns_once_no_pod_is_left() {
    let fake = fake();
    let runtime = runtime(&fake);
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    wait_for(|| pods_of(&fake, &spec) == 1);
    fake.clear_requests();
    runtime.stop(&spec.group).unwrap();
    let deletes: Vec<String> = writes(&fake)
        .into_iter()
        .filter(|(verb, _)| *verb == Verb::Delete)
        .map(|(_, resource)| resource)
        .collect();
    assert_eq!(
        deletes,
        ["scaledobjects", "statefulsets"],
        "KEDA must not scale back what is stopping"
    );
    let workload_delete = fake
        .requests()
        .into_iter()
        .find(|r| r.verb() == Verb::Delete && r.resource() == Some("statefulsets"))
        .unwrap();
    assert_eq!(workload_delete.propagation_policy(), Some("Foreground"));
    assert_eq!(pods_of(&fake, &spec), 0);
    // Stopping what does not run is not an error.
    runtime.stop(&spec.group).unwrap();
    runtime.stop("plumber.shop.never.cdcdcdcdcdcd").unwrap();
    // The TriggerAuthentication it shared goes at the next look, no processor using it.
    assert_eq!(
        fake.list::<TriggerAuthentication>(NS).len(),
        1,
        "kept until a look"
    );
    runtime.repair().unwrap();
    assert_eq!(fake.list::<TriggerAuthentication>(NS).len(), 0);
}

#[test]
fn a_stop_whose_pods_do_not_go_is_an_error_naming_them() {
    let fake = FakeApi::new(); // no controller: nothing removes the pod below
    let runtime = runtime(&fake);
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    let mut pod = Pod::default();
    pod.metadata.name = Some("stuck".into());
    pod.metadata.namespace = Some(NS.into());
    pod.metadata.labels = Some(plumber::runtime::kube::render::selector(&spec));
    fake.put(&pod);
    let error = runtime.stop(&spec.group).unwrap_err();
    assert!(error.to_string().contains("1 pods still exist"), "{error}");
    assert!(error.is_retryable());
}

/// The finalizer of a test kubelet: a deleted Pod terminates until it is removed.
const KUBELET: &str = "test.plumber.dev/kubelet";

/// A fake API server whose Pods terminate until [`KUBELET`]'s finalizer is removed.
fn with_terminating_pods() -> FakeApi {
    FakeApi::new()
        .with_workload_controller(PodStart::Ready)
        .with_pod_finalizer(KUBELET)
}

/// A replica deleted the StatefulSet and crashed while its pod was still terminating (its
/// process finishing); the replica that takes over stops the same life again, knowing nothing
/// of it but its group: the stop still waits for the pod, found by the group's name.
#[test]
fn a_stop_after_the_statefulset_went_still_waits_for_its_terminating_pods() {
    let fake = with_terminating_pods();
    let crashed = runtime(&fake);
    let spec = spec("validate", "ab");
    crashed.start(&spec).unwrap();
    assert!(fake.delete::<StatefulSet>(NS, &workload_name(&spec.group)));
    drop(crashed);
    assert_eq!(pods_of(&fake, &spec), 1, "the pod terminates");
    let other = runtime(&fake);
    let error = other.stop(&spec.group).unwrap_err();
    assert!(error.to_string().contains("1 pods still exist"), "{error}");
    let pod = fake.list::<Pod>(NS).remove(0).metadata.name.unwrap();
    assert!(fake.finish_termination(NS, &pod, KUBELET));
    other.stop(&spec.group).unwrap();
}

/// An evicted processor pod is replaced under its own name, and only once it is gone: the
/// replacement's processor takes the same instance name from HOSTNAME, so its first
/// transaction fences its predecessor's and aborts what that left open, and the two never run
/// at once (a Deployment's replacement would have a new name, and its predecessor's open
/// transaction would hold read_committed readers until the transaction timeout).
#[test]
fn an_evicted_processor_pod_is_replaced_under_its_own_name_once_it_is_gone() {
    let fake = with_terminating_pods();
    let runtime = runtime(&fake);
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    // KEDA scales it to two.
    let name = workload_name(&spec.group);
    let mut workload: StatefulSet = fake.get(NS, &name).unwrap();
    workload.spec.replicas = Some(2);
    fake.put(&workload);
    let pods = || {
        let mut pods: Vec<(String, String, bool)> = fake
            .list::<Pod>(NS)
            .into_iter()
            .map(|p| {
                (
                    p.metadata.name.unwrap(),
                    p.metadata.uid.unwrap(),
                    p.metadata.deletion_timestamp.is_some(),
                )
            })
            .collect();
        pods.sort();
        pods
    };
    let before = pods();
    let names: Vec<&str> = before.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, [format!("{name}-0"), format!("{name}-1")]);
    // The pod running the processor's instance `-1` is evicted: it terminates, and no second
    // pod of that name, nor any other, starts meanwhile.
    let evicted = &before[1];
    let pods_api: kube::Api<Pod> = kube::Api::namespaced(client(&fake), NS);
    handle()
        .block_on(pods_api.delete(&evicted.0, &Default::default()))
        .unwrap();
    let terminating = pods();
    assert_eq!(terminating.len(), 2, "{terminating:?}");
    assert_eq!(terminating[1], (evicted.0.clone(), evicted.1.clone(), true));
    // Its process exited: the replacement has its name (its transactional id), not its uid.
    assert!(fake.finish_termination(NS, &evicted.0, KUBELET));
    let after = pods();
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(after[0], before[0], "the other instance is untouched");
    assert_eq!(after[1].0, evicted.0);
    assert_ne!(after[1].1, evicted.1, "a new pod");
    assert!(!after[1].2);
    // Nothing in the pod names the instance otherwise: the processor reads HOSTNAME.
    let template = workload.spec.template.spec.unwrap();
    for container in &template.containers {
        let args = container.args.clone().unwrap_or_default();
        assert!(
            !args.iter().any(|a| a.starts_with("--instance")),
            "{args:?}"
        );
        assert!(
            container
                .env
                .iter()
                .flatten()
                .all(|e| e.name != "PLUMBER_INSTANCE" && e.name != "HOSTNAME"),
            "{:?}",
            container.env
        );
    }
}

#[test]
fn repair_puts_back_what_was_deleted_or_edited_by_hand_and_deletes_what_nothing_runs() {
    let fake = fake();
    let runtime = runtime(&fake);
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    // By hand: the StatefulSet deleted, the ScaledObject's bound changed.
    assert!(fake.delete::<StatefulSet>(NS, &workload_name(&spec.group)));
    fake.patch_dynamic(
        &scaled_objects(),
        NS,
        &spec.group,
        serde_json::json!({"spec": {"maxReplicaCount": 99}}),
    );
    // An object of plumber's that no identity runs.
    let mut orphan = fake
        .get_dynamic(&scaled_objects(), NS, &spec.group)
        .unwrap();
    orphan["metadata"] = serde_json::json!({
        "name": "plumber.shop.gone.cdcdcdcdcdcd",
        "namespace": NS,
        "labels": {"app.kubernetes.io/managed-by": "plumber"},
    });
    fake.put_dynamic(&scaled_objects(), orphan);
    // Repair sees what its watches brought: looked at until they brought the edits.
    wait_for(|| {
        runtime.repair().unwrap();
        let so = fake.get_dynamic(&scaled_objects(), NS, &spec.group);
        fake.get::<StatefulSet>(NS, &workload_name(&spec.group))
            .is_some()
            && so.is_some_and(|so| so["spec"]["maxReplicaCount"] == 4)
            && fake
                .get_dynamic(&scaled_objects(), NS, "plumber.shop.gone.cdcdcdcdcdcd")
                .is_none()
    });
    // By hand: the processor's annotation edited (the caches keep only its digest).
    fake.patch_dynamic(
        &scaled_objects(),
        NS,
        &spec.group,
        serde_json::json!({"metadata": {"annotations": {SPEC_ANNOTATION: "{}"}}}),
    );
    let annotation = serde_json::to_string(&spec).unwrap();
    wait_for(|| {
        runtime.repair().unwrap();
        fake.get_dynamic(&scaled_objects(), NS, &spec.group)
            .is_some_and(|so| so["metadata"]["annotations"][SPEC_ANNOTATION] == annotation)
    });
    // Objects that are not plumber's are never touched.
    let mut theirs = StatefulSet::default();
    theirs.metadata.name = Some("theirs".into());
    theirs.metadata.namespace = Some(NS.into());
    fake.put(&theirs);
    runtime.repair().unwrap();
    assert!(fake.get::<StatefulSet>(NS, "theirs").is_some());
}

#[test]
fn an_idle_repair_reads_only_what_moved_and_what_others_add_is_no_drift() {
    let fake = fake();
    let runtime = runtime(&fake);
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    // What KEDA and the controllers write: replicas, status, a label of their own.
    fake.patch_dynamic(
        &scaled_objects(),
        NS,
        &spec.group,
        serde_json::json!({"metadata": {"labels": {"scaledobject.keda.sh/name": "x"}}, "status": {"health": {}}}),
    );
    let mut workload: StatefulSet = fake.get(NS, &workload_name(&spec.group)).unwrap();
    workload.spec.replicas = Some(3);
    fake.put(&workload);
    let version = |fake: &FakeApi| {
        fake.get_dynamic(&scaled_objects(), NS, &spec.group)
            .unwrap()["metadata"]["resourceVersion"]
            .clone()
    };
    let edited = version(&fake);
    fake.clear_requests();
    // Until the watch brought the edits, and a while after: never a write, never a list;
    // each edited object read once (the caches keep no spec to compare).
    let mut looks = 0;
    wait_for(|| {
        runtime.repair().unwrap();
        looks += 1;
        runtime
            .processors()
            .unwrap()
            .iter()
            .any(|p| p.group == spec.group)
            && looks >= 20
    });
    assert!(writes(&fake).is_empty(), "{:?}", writes(&fake));
    let reads: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| r.verb() != Verb::Watch)
        .map(|r| r.summary())
        .collect();
    let mut expected = vec![
        format!("get statefulsets/{}", workload_name(&spec.group)),
        format!("get scaledobjects/{}", spec.group),
    ];
    // The watch may bring the two edits to different looks, in either order.
    let mut sorted = reads.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "{reads:?}");
    assert_eq!(version(&fake), edited, "nothing re-applied");
    // A StatefulSet deleted by hand comes back.
    assert!(fake.delete::<StatefulSet>(NS, &workload_name(&spec.group)));
    wait_for(|| {
        runtime.repair().unwrap();
        fake.get::<StatefulSet>(NS, &workload_name(&spec.group))
            .is_some()
    });
}

#[test]
fn an_update_changes_scale_and_resources_in_place() {
    let fake = fake();
    let runtime = runtime(&fake);
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    fake.clear_requests();
    let scale = Scale {
        min: 0,
        max: 9,
        lag_threshold: 50,
    };
    let resources = Resources {
        cpu: Some("250m".into()),
        memory: Some("128Mi".into()),
    };
    runtime
        .update(&spec.group, &scale, Some(&resources))
        .unwrap();
    assert!(
        writes(&fake).iter().all(|(verb, _)| *verb == Verb::Apply),
        "{:?}",
        writes(&fake)
    );
    let so = fake
        .get_dynamic(&scaled_objects(), NS, &spec.group)
        .unwrap();
    assert_eq!(so["spec"]["minReplicaCount"], 0);
    assert_eq!(so["spec"]["maxReplicaCount"], 9);
    assert_eq!(so["spec"]["triggers"][0]["metadata"]["lagThreshold"], "50");
    let workload: StatefulSet = fake.get(NS, &workload_name(&spec.group)).unwrap();
    let container = &workload.spec.template.spec.unwrap().containers[0];
    assert_eq!(
        container
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["cpu"]
            .0,
        "250m"
    );
}

#[test]
fn a_new_daemon_knows_what_runs_from_the_statefulsets() {
    let fake = fake();
    let first = runtime(&fake);
    let a = spec("validate", "ab");
    let b = spec("enrich", "cd");
    first.start(&a).unwrap();
    first.start(&b).unwrap();
    drop(first);
    fake.clear_requests();
    let second = runtime(&fake);
    let listed = fake
        .requests()
        .iter()
        .filter(|r| r.summary() == "list statefulsets")
        .count();
    assert_eq!(listed, 1, "the watch's list is what it knows runs from");
    let mut groups: Vec<String> = second
        .processors()
        .unwrap()
        .into_iter()
        .map(|p| {
            assert_eq!(p.commit.as_deref(), Some(a.commit.as_str()));
            p.group
        })
        .collect();
    groups.sort();
    let mut expected = vec![a.group.clone(), b.group.clone()];
    expected.sort();
    assert_eq!(groups, expected);
    // It repairs and stops them as its own.
    assert!(fake.delete::<StatefulSet>(NS, &workload_name(&b.group)));
    wait_for(|| {
        second.repair().unwrap();
        fake.get::<StatefulSet>(NS, &workload_name(&b.group))
            .is_some()
    });
    second.stop(&a.group).unwrap();
    assert!(
        fake.get::<StatefulSet>(NS, &workload_name(&a.group))
            .is_none()
    );
}

/// A standby replica connects while the holder of the lease runs `a`; the holder then starts
/// `b` and stops `a`. Once the standby holds the lease, its first change (a repair) reads
/// what runs first: it keeps `b` and does not bring `a` back. Taking the lease back later
/// (another term: the other replica may have acted between) reads it again.
#[test]
fn a_replica_taking_the_lease_repairs_what_the_other_replica_left_running() {
    let fake = fake();
    let holder = runtime(&fake);
    let a = spec("validate", "ab");
    let b = spec("enrich", "cd");
    holder.start(&a).unwrap();
    let term = Arc::new(AtomicU64::new(0));
    let standby = {
        let term = term.clone();
        runtime(&fake).fenced_by(Arc::new(move || {
            Some(term.load(Ordering::SeqCst)).filter(|t| *t > 0)
        }))
    };
    holder.start(&b).unwrap();
    holder.stop(&a.group).unwrap();
    let writes = fake.writes().len();
    assert!(standby.repair().is_err(), "a standby changes nothing");
    assert_eq!(fake.writes().len(), writes);
    term.store(1, Ordering::SeqCst);
    standby.repair().unwrap();
    assert!(
        fake.get::<StatefulSet>(NS, &workload_name(&b.group))
            .is_some(),
        "what the other replica started keeps running"
    );
    assert!(
        fake.get::<StatefulSet>(NS, &workload_name(&a.group))
            .is_none(),
        "what the other replica stopped stays stopped"
    );
    let groups: Vec<String> = standby
        .processors()
        .unwrap()
        .into_iter()
        .map(|p| p.group)
        .collect();
    assert_eq!(groups, std::slice::from_ref(&b.group));

    // The lease goes to the other replica, which stops b and starts a again, and comes
    // back: the next repair reads that, not what this replica knew.
    term.store(0, Ordering::SeqCst);
    holder.stop(&b.group).unwrap();
    holder.start(&a).unwrap();
    term.store(2, Ordering::SeqCst);
    standby.repair().unwrap();
    assert!(
        fake.get::<StatefulSet>(NS, &workload_name(&a.group))
            .is_some()
    );
    assert!(
        fake.get::<StatefulSet>(NS, &workload_name(&b.group))
            .is_none()
    );
}

fn store(fake: &FakeApi, leader: &Arc<AtomicBool>) -> TopologyStore {
    let leader = leader.clone();
    TopologyStore::new(
        client(fake),
        handle(),
        NS,
        Source {
            repository: "https://git.example.com/data/topologies.git".into(),
            git_ref: "main".into(),
        },
        Arc::new(move || leader.load(Ordering::SeqCst)),
    )
    .unwrap()
}

fn moved(commit: &str) -> TopologyRecord {
    TopologyRecord {
        commit: Some(commit.into()),
        bootstrap: Some("kafka:9093".into()),
        ..TopologyRecord::default()
    }
}

#[test]
fn the_record_lives_in_the_topology_status_and_a_second_replica_resumes_from_it() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let first = store(&fake, &leader);
    assert_eq!(first.load("shop").unwrap(), TopologyRecord::default());
    first.save("shop", &moved("aaa")).unwrap();
    let object: crd::Topology = fake.get(NS, "shop").unwrap();
    assert_eq!(object.spec.topology, "shop");
    assert_eq!(object.spec.git_ref, "main");
    assert_eq!(object.status.unwrap().record.unwrap()["commit"], "aaa");
    let status_write = fake
        .requests()
        .into_iter()
        .find(|r| r.subresource() == Some("status") && r.verb() == Verb::Replace)
        .expect("the record is written to the status subresource");
    assert!(status_write.body.is_some());
    let second = store(&fake, &leader);
    assert_eq!(second.load("shop").unwrap(), moved("aaa"));
    assert_eq!(
        second.topologies().unwrap().keys().collect::<Vec<_>>(),
        ["shop"]
    );
}

#[test]
fn a_record_written_by_another_replica_since_it_was_read_is_never_overwritten() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let old = store(&fake, &leader);
    let new = store(&fake, &leader);
    old.save("shop", &moved("aaa")).unwrap();
    new.load("shop").unwrap();
    new.save("shop", &moved("bbb")).unwrap();
    let error = old.save("shop", &moved("stale")).unwrap_err();
    assert!(
        error.to_string().contains("another daemon replica"),
        "{error}"
    );
    assert!(error.is_retryable());
    assert_eq!(new.load("shop").unwrap(), moved("bbb"));
    // Read again, the old one may write.
    assert_eq!(old.load("shop").unwrap(), moved("bbb"));
    old.save("shop", &moved("ccc")).unwrap();
    assert_eq!(new.load("shop").unwrap(), moved("ccc"));
}

#[test]
fn another_writer_of_the_status_is_no_conflict_and_keeps_its_fields() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let store = store(&fake, &leader);
    store.save("shop", &moved("aaa")).unwrap();
    // The observer's fields, written beside the record.
    let mut object: crd::Topology = fake.get(NS, "shop").unwrap();
    object.status.as_mut().unwrap().phase = Some(crd::Phase::Cutover);
    fake.put(&object);
    // And a write between the store's read and its write: answered 409 once.
    fake.fail_next(
        1,
        |r| r.subresource() == Some("status") && r.verb() == Verb::Replace,
        Fault::conflict(),
    );
    store.save("shop", &moved("bbb")).unwrap();
    let status_writes = fake
        .requests()
        .iter()
        .filter(|r| r.subresource() == Some("status") && r.verb() == Verb::Replace)
        .count();
    assert_eq!(
        status_writes, 3,
        "the first save, the refused write, its retry"
    );
    let object: crd::Topology = fake.get(NS, "shop").unwrap();
    let status = object.status.unwrap();
    assert_eq!(status.phase, Some(crd::Phase::Cutover));
    assert_eq!(status.record.unwrap()["commit"], "bbb");
}

#[test]
fn a_replica_without_the_lease_neither_acts_nor_writes() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let store = store(&fake, &leader);
    store.save("shop", &moved("aaa")).unwrap();
    leader.store(false, Ordering::SeqCst);
    assert!(!store.may_act());
    fake.clear_requests();
    let error = store.save("shop", &moved("bbb")).unwrap_err();
    assert!(error.to_string().contains("lease"), "{error}");
    assert!(
        fake.requests().iter().all(|r| r.verb() != Verb::Replace),
        "no write without the lease"
    );
    leader.store(true, Ordering::SeqCst);
    assert!(store.may_act());
}

#[test]
fn history_keeps_each_move_once_and_the_newest_few() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let store = store(&fake, &leader);
    store.load("shop").unwrap();
    let entry = |n: u64| HistoryEntry {
        topology: "shop".into(),
        from: None,
        to: format!("c{n}"),
        outcome: Outcome::Applied,
        started_at: n,
        finished_at: n + 1,
        actions: 3,
        handovers: Vec::new(),
    };
    store.append_history(&entry(1)).unwrap();
    store.append_history(&entry(1)).unwrap();
    assert_eq!(store.history().unwrap(), [entry(1)]);
    for n in 2..=(HISTORY_KEPT as u64 + 5) {
        store.append_history(&entry(n)).unwrap();
    }
    let history = store.history().unwrap();
    assert_eq!(history.len(), HISTORY_KEPT);
    assert_eq!(history.last(), Some(&entry(HISTORY_KEPT as u64 + 5)));
    // The record beside it is untouched.
    assert_eq!(store.load("shop").unwrap(), TopologyRecord::default());
}

fn lease(fake: &FakeApi, identity: &str) -> Lease {
    let config = LeaseConfig {
        duration: Duration::from_secs(3),
        grace: Duration::from_secs(1),
        check: Duration::from_millis(100),
        ..LeaseConfig::new("plumber", NS, identity)
    };
    Lease::seek(client(fake), &handle(), config)
}

fn holder(fake: &FakeApi) -> Option<String> {
    fake.get::<LeaseObject>(NS, "plumber")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// The daemon pod's [`HOLDER_LABEL`], which the Service selects on.
fn holder_label(fake: &FakeApi, pod: &str) -> Option<String> {
    fake.get::<k8s_openapi::api::core::v1::Pod>(NS, pod)
        .and_then(|p| p.metadata.labels)
        .and_then(|labels| labels.get(HOLDER_LABEL).cloned())
}

#[test]
fn one_replica_holds_the_lease_and_another_takes_over_when_it_is_released() {
    let fake = fake();
    for pod in ["daemon-a", "daemon-b"] {
        fake.put(&k8s_openapi::api::core::v1::Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(pod.into()),
                namespace: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        });
    }
    let a = lease(&fake, "daemon-a");
    wait_for(|| a.held());
    assert_eq!(holder(&fake).as_deref(), Some("daemon-a"));
    // The Service reaches the holder only.
    wait_for(|| holder_label(&fake, "daemon-a").as_deref() == Some("true"));
    let b = lease(&fake, "daemon-b");
    // B's manager has looked at the Lease once it exists and names A.
    wait_for(|| {
        fake.requests()
            .iter()
            .filter(|r| r.resource() == Some("leases"))
            .count()
            > 4
    });
    assert!(!b.held(), "two holders");
    wait_for(|| holder_label(&fake, "daemon-b").as_deref() == Some("false"));
    let guard = a.guard();
    a.release(Duration::from_secs(10));
    assert!(!guard(), "a released lease guards nothing");
    assert_eq!(holder_label(&fake, "daemon-a").as_deref(), Some("false"));
    wait_for(|| b.held());
    assert_eq!(holder(&fake).as_deref(), Some("daemon-b"));
    wait_for(|| holder_label(&fake, "daemon-b").as_deref() == Some("true"));
}

#[test]
fn a_holder_that_no_longer_finds_itself_in_the_lease_stops_acting() {
    let fake = fake();
    let a = lease(&fake, "daemon-a");
    wait_for(|| a.held());
    // Another writer (a replica that took it over while this one could not renew) names
    // itself holder.
    fake.patch::<LeaseObject>(
        NS,
        "plumber",
        serde_json::json!({"spec": {"holderIdentity": "daemon-z", "renewTime": "2099-01-01T00:00:00.000000Z"}}),
    );
    wait_for(|| !a.held());
}

#[test]
fn observed_status_is_published_beside_the_record_and_only_when_it_changed() {
    use plumber::daemon::StatusSink as _;
    use plumber::daemon::status::{Delivery, Kind, Phase, StepState, StepStatus, TopologyStatus};
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let store = store(&fake, &leader);
    store.save("shop", &moved("aaa")).unwrap();
    let step = |name: &str, kind, state, lag| StepStatus {
        name: name.into(),
        kind,
        identity: None,
        group: None,
        state,
        lag,
        inputs: Vec::new(),
        file: None,
        topic: None,
        transform: None,
        internal_topic: None,
        dead_letter_topic: None,
        replicas: None,
        scale: None,
        records_per_second: None,
        keeps_state: None,
        keeps_table: None,
        retiring: None,
    };
    let observed = TopologyStatus {
        name: "shop".into(),
        commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
        phase: Phase::Idle,
        cutover: None,
        steps: vec![
            step("orders", Kind::Source, StepState::External, None),
            step("validate", Kind::Processor, StepState::Running, Some(3)),
            step("enrich", Kind::Processor, StepState::Starting, Some(4)),
            step("valid", Kind::Sink, StepState::External, None),
        ],
        last_error: None,
        delivery: Some(Delivery::ExactlyOnce),
        preview_of: None,
    };
    store.publish(&observed, None);
    let status = fake
        .get::<crd::Topology>(NS, "shop")
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.phase, Some(crd::Phase::Idle));
    assert_eq!(status.short_commit.as_deref(), Some("0123456789ab"));
    assert_eq!(status.steps_ready.as_deref(), Some("1/2"));
    assert_eq!(status.lag, Some(7));
    assert_eq!(status.steps.len(), 4);
    assert_eq!(
        status.record.unwrap()["commit"],
        "aaa",
        "the record is kept"
    );
    // The record written after keeps the observed fields, in one request: the publish
    // left the store the object it wrote.
    fake.clear_requests();
    store.save("shop", &moved("bbb")).unwrap();
    assert_eq!(
        fake.requests()
            .iter()
            .map(|r| r.summary())
            .collect::<Vec<_>>(),
        ["replace topologies/shop/status"]
    );
    let status = fake
        .get::<crd::Topology>(NS, "shop")
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.phase, Some(crd::Phase::Idle));
    // Nothing changed: nothing written.
    fake.clear_requests();
    store.publish(&observed, None);
    assert!(
        fake.requests().iter().all(|r| r.verb() != Verb::Replace),
        "{:?}",
        fake.writes()
    );
    // An invalid head shows in every topology, at its file and place.
    let invalid = plumber::daemon::status::LastError {
        commit: Some("c0ffee".into()),
        topology: None,
        message: "commit c0ffee is not valid: unknown field".into(),
        at: 0,
        place: Some(plumber::daemon::status::Place::new(
            plumber::diagnostic::Diagnostic::error(
                plumber::diagnostic::Code::UnknownField,
                "topologies/shop/validate.yaml",
                Some(plumber::spec::yaml::Pos { line: 4, column: 1 }),
                "unknown field `partitons`",
            ),
            "c0ffee",
            None,
        )),
    };
    store.publish(&observed, Some(&invalid));
    let error = fake
        .get::<crd::Topology>(NS, "shop")
        .unwrap()
        .status
        .unwrap()
        .last_error
        .unwrap();
    assert_eq!(error.file.as_deref(), Some("topologies/shop/validate.yaml"));
    assert_eq!((error.line, error.column), (Some(4), Some(1)));
    assert_eq!(error.code.as_deref(), Some("unknown-field"));
    assert_eq!(error.commit.as_deref(), Some("c0ffee"));
}

#[test]
fn each_cutover_step_is_an_event_of_its_topology() {
    use plumber::daemon::{CutoverEvent, StatusSink as _};
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let store = store(&fake, &leader);
    store.save("shop", &moved("aaa")).unwrap();
    for (reason, note) in [
        ("CutoverStarted", "moving from aaa to bbb"),
        (
            "CutoverProgress",
            "stop processor plumber.shop.validate.abababababab (3 done, 4 left)",
        ),
        ("CutoverFinished", "runs bbb"),
    ] {
        store.event(
            "shop",
            &CutoverEvent {
                reason,
                note: note.into(),
            },
        );
    }
    let events = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("events.k8s.io", "v1", "Event"),
        "events",
    );
    let recorded = fake.list_dynamic(&events, NS);
    let reasons: Vec<&str> = recorded
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 3, "{recorded:#?}");
    for reason in ["CutoverStarted", "CutoverProgress", "CutoverFinished"] {
        assert!(reasons.contains(&reason), "{reasons:?}");
    }
    for event in &recorded {
        assert_eq!(event["regarding"]["kind"], "Topology");
        assert_eq!(event["regarding"]["name"], "shop");
        assert_eq!(event["reportingController"], "plumber");
    }
}

#[test]
fn processors_are_owned_by_their_topology_once_it_exists() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let runtime = runtime(&fake);
    let lone = spec("validate", "ab");
    runtime.start(&lone).unwrap();
    let workload: StatefulSet = fake.get(NS, &workload_name(&lone.group)).unwrap();
    assert!(workload.metadata.owner_references.is_none());
    // The engine saves the topology's record (creating its Topology) before its first start.
    store(&fake, &leader).save("shop", &moved("aaa")).unwrap();
    let topology: crd::Topology = fake.get(NS, "shop").unwrap();
    let owned = spec("enrich", "cd");
    runtime.start(&owned).unwrap();
    let name = &owned.group;
    let workload: StatefulSet = fake.get(NS, &workload_name(name)).unwrap();
    let owners = workload.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].kind, "Topology");
    assert_eq!(owners[0].name, "shop");
    assert_eq!(Some(&owners[0].uid), topology.metadata.uid.as_ref());
    assert_eq!(owners[0].controller, Some(true));
    let so = fake.get_dynamic(&scaled_objects(), NS, name).unwrap();
    assert_eq!(so["metadata"]["ownerReferences"][0]["name"], "shop");
    // Repair gives the first one its owner too, once the watch brought the Topology.
    wait_for(|| {
        runtime.repair().unwrap();
        let workload: StatefulSet = fake.get(NS, &workload_name(&lone.group)).unwrap();
        workload
            .metadata
            .owner_references
            .is_some_and(|owners| owners[0].name == "shop")
    });
}

/// SPEC §11: processors may run in a namespace of their own, without the daemon's Secrets.
/// Their objects go there and have no owner (the Topologies stay with the daemon, and an
/// owner in another namespace would have the garbage collector delete them); repair still
/// deletes what nothing runs.
#[test]
fn processors_in_a_namespace_of_their_own_are_applied_there_without_an_owner() {
    const PROCESSORS: &str = "data-processors";
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    // The Topology exists in the daemon's namespace before the start.
    store(&fake, &leader).save("shop", &moved("aaa")).unwrap();
    let apart = || {
        let mut config = config();
        config.render.namespace = PROCESSORS.into();
        config.topologies_namespace = Some(NS.into());
        config
    };
    let runtime = KubeRuntime::connect(client(&fake), handle(), apart()).unwrap();
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    for request in fake.requests().iter().filter(|r| r.verb() == Verb::Apply) {
        assert_eq!(
            request.namespace(),
            Some(PROCESSORS),
            "{}",
            request.summary()
        );
    }
    let workload: StatefulSet = fake.get(PROCESSORS, &workload_name(&spec.group)).unwrap();
    assert!(workload.metadata.owner_references.is_none());
    assert!(
        fake.get::<StatefulSet>(NS, &workload_name(&spec.group))
            .is_none()
    );
    let so = fake
        .get_dynamic(&scaled_objects(), PROCESSORS, &spec.group)
        .unwrap();
    assert!(so["metadata"]["ownerReferences"].is_null(), "{so:#}");
    // Repair neither gives them an owner nor leaves behind what nothing runs.
    runtime.repair().unwrap();
    let workload: StatefulSet = fake.get(PROCESSORS, &workload_name(&spec.group)).unwrap();
    assert!(workload.metadata.owner_references.is_none());
    // A new daemon knows them from their namespace, and stops them there.
    let other = KubeRuntime::connect(client(&fake), handle(), apart()).unwrap();
    other.stop(&spec.group).unwrap();
    assert!(
        fake.get::<StatefulSet>(PROCESSORS, &workload_name(&spec.group))
            .is_none()
    );
}

#[test]
fn a_save_writes_the_object_as_last_seen_without_reading_it_again() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let store = store(&fake, &leader);
    store.save("shop", &moved("aaa")).unwrap();
    store.load("shop").unwrap();
    fake.clear_requests();
    store.save("shop", &moved("bbb")).unwrap();
    store.save("shop", &moved("ccc")).unwrap();
    assert_eq!(
        fake.requests()
            .iter()
            .map(|r| r.summary())
            .collect::<Vec<_>>(),
        [
            "replace topologies/shop/status",
            "replace topologies/shop/status"
        ],
        "one request per save"
    );
    assert_eq!(store.load("shop").unwrap(), moved("ccc"));
}

#[test]
fn a_topology_deleted_since_it_was_read_is_a_conflict_then_starts_over() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let store = store(&fake, &leader);
    store.save("shop", &moved("aaa")).unwrap();
    assert!(fake.delete::<crd::Topology>(NS, "shop"));
    let error = store.save("shop", &moved("bbb")).unwrap_err();
    assert!(
        error.to_string().contains("another daemon replica"),
        "{error}"
    );
    assert_eq!(store.load("shop").unwrap(), TopologyRecord::default());
    store.save("shop", &moved("ccc")).unwrap();
    assert_eq!(store.load("shop").unwrap(), moved("ccc"));
}

#[test]
fn a_publish_after_another_replica_wrote_the_record_leaves_the_next_save_a_conflict() {
    use plumber::daemon::StatusSink as _;
    use plumber::daemon::status::{Phase, TopologyStatus};
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let ours = store(&fake, &leader);
    ours.save("shop", &moved("aaa")).unwrap();
    // Another replica (a former lease holder) moves the record on.
    let theirs = store(&fake, &leader);
    theirs.load("shop").unwrap();
    theirs.save("shop", &moved("bbb")).unwrap();
    let observed = TopologyStatus {
        name: "shop".into(),
        commit: Some("aaa".into()),
        phase: Phase::Idle,
        cutover: None,
        steps: Vec::new(),
        last_error: None,
        delivery: None,
        preview_of: None,
    };
    ours.publish(&observed, None);
    let status = fake
        .get::<crd::Topology>(NS, "shop")
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.phase, Some(crd::Phase::Idle), "published");
    assert_eq!(status.record.unwrap()["commit"], "bbb", "their record kept");
    let error = ours.save("shop", &moved("ccc")).unwrap_err();
    assert!(
        error.to_string().contains("another daemon replica"),
        "{error}"
    );
    assert_eq!(ours.load("shop").unwrap(), moved("bbb"));
}

#[test]
fn with_the_runtimes_cache_the_store_reads_every_record_without_asking_the_api() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let runtime = runtime(&fake);
    let ours = store(&fake, &leader).with_cache(runtime.topology_cache());
    ours.save("shop", &moved("aaa")).unwrap();
    fake.clear_requests();
    // Its own write at once (written through), and no list.
    let records = ours.topologies().unwrap();
    assert_eq!(records["shop"].as_ref().unwrap(), &moved("aaa"));
    assert!(
        fake.requests().iter().all(|r| r.verb() == Verb::Watch),
        "{:?}",
        fake.requests()
            .iter()
            .map(|r| r.summary())
            .collect::<Vec<_>>()
    );
    // Another replica's write comes through the watch.
    let theirs = store(&fake, &leader);
    theirs.load("shop").unwrap();
    theirs.save("shop", &moved("bbb")).unwrap();
    wait_for(|| {
        ours.topologies().unwrap()["shop"]
            .as_ref()
            .is_ok_and(|r| *r == moved("bbb"))
    });
    // The engine's load still reads the object itself.
    assert_eq!(ours.load("shop").unwrap(), moved("bbb"));
}

#[test]
fn a_statefulset_deleted_by_hand_while_no_daemon_ran_is_put_back_from_its_scaled_object() {
    let fake = fake();
    let first = runtime(&fake);
    let spec = spec("validate", "ab");
    first.start(&spec).unwrap();
    drop(first);
    assert!(fake.delete::<StatefulSet>(NS, &workload_name(&spec.group)));
    let second = runtime(&fake);
    assert!(
        second
            .processors()
            .unwrap()
            .iter()
            .any(|p| p.group == spec.group),
        "known by its ScaledObject"
    );
    second.repair().unwrap();
    let workload: StatefulSet = fake.get(NS, &workload_name(&spec.group)).expect("put back");
    let annotation = &workload.metadata.annotations.unwrap()[SPEC_ANNOTATION];
    let back: ProcessorSpec = serde_json::from_str(annotation).unwrap();
    assert_eq!(back.identity, spec.identity);
}

#[test]
fn a_replica_that_has_not_read_what_runs_yet_knows_a_processor_another_replica_started() {
    let fake = fake();
    let standby = runtime(&fake);
    let holder = runtime(&fake);
    let spec = spec("validate", "ab");
    holder.start(&spec).unwrap();
    // The standby listed what ran when it connected (nothing) and has not resynced since, as
    // when it has just taken the lease and the engine asks before the observer has read
    // what runs: its watch of the StatefulSets answers, so the engine does not start the
    // processor again.
    plumber_testkit::wait_until(
        "the standby sees the processor run",
        Duration::from_secs(30),
        || standby.runs(&spec.group).unwrap(),
    );
}

#[test]
fn a_processor_whose_objects_were_all_deleted_while_no_daemon_ran_is_unknown_until_started_again() {
    let fake = fake();
    let first = runtime(&fake);
    let spec = spec("validate", "ab");
    first.start(&spec).unwrap();
    drop(first);
    // Injected: both objects deleted by hand while no daemon runs. Only the Topology's
    // record (the engine's) still says the processor runs; the engine starts it again
    // (tests/cutover.rs: a running processor gone from the runtime).
    assert!(fake.delete::<StatefulSet>(NS, &workload_name(&spec.group)));
    assert!(
        fake.delete_dynamic(&scaled_objects(), NS, &spec.group)
            .is_some()
    );
    let second = runtime(&fake);
    assert!(!second.runs(&spec.group).unwrap());
    second.start(&spec).unwrap();
    assert!(second.runs(&spec.group).unwrap());
    let workload: StatefulSet = fake
        .get(NS, &workload_name(&spec.group))
        .expect("applied again");
    assert_eq!(
        workload.metadata.labels.unwrap()["plumber.dev/step"],
        "validate"
    );
    assert!(
        fake.get_dynamic(&scaled_objects(), NS, &spec.group)
            .is_some()
    );
}

/// A pull request's preview environment keeps its record as any topology does: in a Topology
/// object named `<topology>.<slug>` (a DNS subdomain; the CRD takes the name with its one
/// dot), beside the topology it previews and apart from it.
#[test]
fn a_preview_topology_keeps_its_record_in_a_topology_object_of_its_own() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let store = store(&fake, &leader);
    store.save("shop", &moved("aaa")).unwrap();
    store.save("shop.pr-7", &moved("bbb")).unwrap();
    let object: crd::Topology = fake.get(NS, "shop.pr-7").unwrap();
    assert_eq!(object.spec.topology, "shop.pr-7");
    assert_eq!(object.status.unwrap().record.unwrap()["commit"], "bbb");
    assert_eq!(
        store.topologies().unwrap().keys().collect::<Vec<_>>(),
        ["shop", "shop.pr-7"]
    );
    assert_eq!(store.load("shop").unwrap(), moved("aaa"), "untouched");
    // Torn down: its record is retired, never mistaken for the topology's.
    store.save("shop.pr-7", &TopologyRecord::default()).unwrap();
    assert!(store.load("shop.pr-7").unwrap().is_retired());
    assert_eq!(store.load("shop").unwrap(), moved("aaa"));
}

/// A torn-down preview's record is forgotten by deleting the Topology object the store
/// created for it, only as the store last saw it: a record another replica wrote since is a
/// conflict and the object stays; a topology's record is never forgotten; only the lease
/// holder deletes.
#[test]
fn a_preview_s_topology_is_deleted_when_forgotten_and_a_topology_s_never() {
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let this = store(&fake, &leader);
    this.save("shop", &moved("aaa")).unwrap();
    this.save("shop.pr-7", &TopologyRecord::default()).unwrap();
    this.save("shop.pr-8", &TopologyRecord::default()).unwrap();

    let refused = this.forget("shop").unwrap_err();
    assert!(refused.to_string().contains("only a preview"), "{refused}");
    assert!(fake.get::<crd::Topology>(NS, "shop").is_some());

    leader.store(false, Ordering::SeqCst);
    let refused = this.forget("shop.pr-7").unwrap_err();
    assert!(refused.to_string().contains("lease"), "{refused}");
    assert!(fake.get::<crd::Topology>(NS, "shop.pr-7").is_some());
    leader.store(true, Ordering::SeqCst);

    this.forget("shop.pr-7").unwrap();
    assert!(fake.get::<crd::Topology>(NS, "shop.pr-7").is_none());
    let delete = fake
        .requests()
        .into_iter()
        .find(|r| r.verb() == Verb::Delete && r.resource() == Some("topologies"))
        .expect("a delete of the Topology");
    assert!(
        delete
            .body
            .as_ref()
            .and_then(|b| b.pointer("/preconditions/resourceVersion"))
            .is_some(),
        "deleted with the version last seen as a precondition: {:?}",
        delete.body
    );
    assert_eq!(this.load("shop.pr-7").unwrap(), TopologyRecord::default());
    assert_eq!(
        this.topologies().unwrap().keys().collect::<Vec<_>>(),
        ["shop", "shop.pr-8"]
    );
    this.forget("shop.pr-7").unwrap();

    // Another replica starts pull request 8's preview again after this store last saw it.
    let other = store(&fake, &leader);
    other.load("shop.pr-8").unwrap();
    other.save("shop.pr-8", &moved("bbb")).unwrap();
    let conflict = this.forget("shop.pr-8").unwrap_err();
    assert!(
        conflict.to_string().contains("another daemon replica"),
        "{conflict}"
    );
    assert_eq!(
        other.load("shop.pr-8").unwrap(),
        moved("bbb"),
        "left as it is"
    );
    assert_eq!(this.load("shop").unwrap(), moved("aaa"), "untouched");
}

/// Each running Pod of a processor serves `/metrics` at its Pod IP on the metrics port; a Pod
/// without an IP yet is nowhere to read.
#[test]
fn the_metrics_of_a_processor_are_at_its_running_pods_ips() {
    let fake = fake();
    let runtime = runtime(&fake);
    let spec = spec("validate", "ab");
    runtime.start(&spec).unwrap();
    wait_for(|| pods_of(&fake, &spec) == 1);
    let endpoints = |runtime: &KubeRuntime| -> Vec<String> {
        runtime
            .metrics_endpoints()
            .unwrap()
            .get(&spec.group)
            .into_iter()
            .flatten()
            .map(|e| e.addr.to_string())
            .collect()
    };
    assert_eq!(endpoints(&runtime), Vec::<String>::new(), "no Pod IP yet");
    let pod = fake.list::<Pod>(NS).remove(0);
    let name = pod.metadata.name.clone().unwrap();
    fake.patch::<Pod>(
        NS,
        &name,
        serde_json::json!({"status": {"podIP": "10.1.2.3"}}),
    );
    wait_for(|| endpoints(&runtime) == ["10.1.2.3:9400"]);
    let uid = pod.metadata.uid.unwrap();
    assert_eq!(
        runtime.metrics_endpoints().unwrap()[&spec.group][0].instance,
        uid,
        "an instance is its Pod"
    );
    runtime.stop(&spec.group).unwrap();
    wait_for(|| runtime.metrics_endpoints().unwrap().is_empty());
}

/// Within one lease term a load costs no request: what this replica wrote or read in the
/// term is what is there, since nobody else writes during it. A new term reads again, and a
/// record written by someone else all the same (by hand) is still a conflict, never
/// overwritten.
#[test]
fn loads_within_a_lease_term_read_nothing_and_a_write_by_another_is_still_a_conflict() {
    use std::sync::atomic::AtomicU64;
    let fake = fake();
    let leader = Arc::new(AtomicBool::new(true));
    let term = Arc::new(AtomicU64::new(1));
    let ours = store(&fake, &leader).with_term({
        let (leader, term) = (leader.clone(), term.clone());
        Arc::new(move || {
            leader
                .load(Ordering::SeqCst)
                .then(|| term.load(Ordering::SeqCst))
        })
    });
    ours.save("shop", &moved("aaa")).unwrap();
    fake.clear_requests();
    for _ in 0..3 {
        assert_eq!(ours.load("shop").unwrap().commit.as_deref(), Some("aaa"));
    }
    ours.save("shop", &moved("bbb")).unwrap();
    assert_eq!(ours.load("shop").unwrap().commit.as_deref(), Some("bbb"));
    let summaries =
        |fake: &FakeApi| -> Vec<String> { fake.requests().iter().map(|r| r.summary()).collect() };
    assert_eq!(
        summaries(&fake),
        ["replace topologies/shop/status"],
        "one write, no read"
    );

    // A new term (the lease lost and taken again): read again, once.
    term.store(2, Ordering::SeqCst);
    fake.clear_requests();
    ours.load("shop").unwrap();
    ours.load("shop").unwrap();
    assert_eq!(summaries(&fake), ["get topologies/shop"]);

    // Someone writes the record meanwhile: the load, from this term, does not see it, but
    // the save does, and refuses.
    let other = store(&fake, &Arc::new(AtomicBool::new(true)));
    let store = ours;
    other.save("shop", &moved("by-hand")).unwrap();
    assert_eq!(store.load("shop").unwrap().commit.as_deref(), Some("bbb"));
    let error = store.save("shop", &moved("ccc")).unwrap_err();
    assert!(
        matches!(error, plumber::store::Error::Conflict { .. }),
        "{error}"
    );
    assert_eq!(
        other.load("shop").unwrap().commit.as_deref(),
        Some("by-hand")
    );
    // After the conflict the next load reads what is there, and the engine goes on from it.
    assert_eq!(
        store.load("shop").unwrap().commit.as_deref(),
        Some("by-hand")
    );
    store.save("shop", &moved("ddd")).unwrap();

    // Not holding the lease: every load reads.
    leader.store(false, Ordering::SeqCst);
    fake.clear_requests();
    store.load("shop").unwrap();
    assert_eq!(summaries(&fake), ["get topologies/shop"]);
}
