//! The fake Kubernetes API server, through a real `kube::Client`: typed and dynamic `Api`s,
//! what the server stores and answers, and what it records.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::WatchEvent;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, Preconditions, WatchParams,
};
use kube::core::Status;
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::watcher::{self, watcher};
use plumber_testkit::kube_api::{FakeApi, Fault, HAND_MANAGER, PodChange, PodStart, Verb};
use serde_json::{Value, json};

const NS: &str = "plumber";

fn deployment(name: &str, replicas: Option<i64>, image: &str) -> Value {
    let mut spec = json!({
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name, "plumber.dev/step": "enrich"}},
            "spec": {"containers": [{"name": "processor", "image": image}]},
        },
    });
    if let Some(n) = replicas {
        spec["replicas"] = json!(n);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "plumber"}},
        "spec": spec,
    })
}

fn scaled_object_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "keda.sh",
        "v1alpha1",
        "ScaledObject",
    ))
}

fn scaled_object(name: &str) -> Value {
    json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": name},
            "minReplicaCount": 0,
            "maxReplicaCount": 4,
            "triggers": [{
                "type": "kafka",
                "metadata": {
                    "bootstrapServers": "kafka:9092",
                    "consumerGroup": "plumber-enrich",
                    "topic": "clicks",
                    "lagThreshold": "100",
                },
            }],
        },
    })
}

fn apply() -> PatchParams {
    PatchParams::apply("plumber")
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> Box<Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn rv(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .expect("a resourceVersion")
        .parse()
        .expect("a numeric resourceVersion")
}

#[tokio::test]
async fn apply_creates_then_merges_with_generation_and_resource_version() {
    let fake = FakeApi::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(NS), NS);

    let created = api
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(2), "img:1")),
        )
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some());
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert_eq!(meta.namespace.as_deref(), Some(NS));
    let first_rv = rv(meta);

    // The same apply again is no write: nothing changes, not even the resourceVersion.
    let again = api
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(2), "img:1")),
        )
        .await
        .unwrap();
    assert_eq!(rv(&again.metadata), first_rv);
    assert_eq!(again.metadata.uid, meta.uid);

    // A label is metadata: a new resourceVersion, the same generation.
    let mut labelled = deployment("web", Some(2), "img:1");
    labelled["metadata"]["labels"]["extra"] = json!("yes");
    let labelled = api
        .patch("web", &apply(), &Patch::Apply(labelled))
        .await
        .unwrap();
    assert!(rv(&labelled.metadata) > first_rv);
    assert_eq!(labelled.metadata.generation, Some(1));

    // A spec change bumps the generation; what the manager no longer applies is removed.
    let changed = api
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", None, "img:2")),
        )
        .await
        .unwrap();
    assert_eq!(changed.metadata.generation, Some(2));
    let spec = changed.spec;
    assert_eq!(spec.replicas, None, "replicas are no longer applied");
    assert!(!changed.metadata.labels.unwrap().contains_key("extra"));
    let image = spec.template.spec.unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some("img:2"));
    assert_eq!(changed.metadata.uid, meta.uid);

    let managed = changed.metadata.managed_fields.expect("managedFields");
    assert_eq!(managed.len(), 1);
    assert_eq!(managed[0].manager.as_deref(), Some("plumber"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));
}

#[tokio::test]
async fn get_of_a_missing_object_is_a_404_api_error() {
    let fake = FakeApi::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(NS), NS);
    let status = api_error(api.get("nothing").await);
    assert_eq!(status.code, 404);
    assert_eq!(status.reason, "NotFound");
    assert_eq!(status.message, "deployments.apps \"nothing\" not found");
    assert_eq!(api.get_opt("nothing").await.unwrap(), None);
}

#[tokio::test]
async fn list_by_label_and_field_selectors() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "front"})),
        ("b", json!({"app": "web"})),
        ("c", json!({"app": "db"})),
    ] {
        let cm =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    // Another namespace is not listed.
    let other: Api<ConfigMap> = Api::namespaced(fake.client(NS), "other");
    let cm = serde_json::from_value(json!({"metadata": {"name": "d", "labels": {"app": "web"}}}))
        .unwrap();
    other.create(&PostParams::default(), &cm).await.unwrap();

    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect()
    };
    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.metadata.resource_version, Some(fake.resource_version()));
    assert_eq!(names(all), ["a", "b", "c"]);
    let lp = |s: &str| ListParams::default().labels(s);
    assert_eq!(names(api.list(&lp("app=web")).await.unwrap()), ["a", "b"]);
    assert_eq!(names(api.list(&lp("app=web,tier")).await.unwrap()), ["a"]);
    assert_eq!(names(api.list(&lp("app!=web")).await.unwrap()), ["c"]);
    assert_eq!(
        names(api.list(&lp("app in (db,cache)")).await.unwrap()),
        ["c"]
    );
    assert_eq!(
        names(api.list(&lp("app notin (db),!tier")).await.unwrap()),
        ["b"]
    );
    let by_name = ListParams::default().fields("metadata.name=b");
    assert_eq!(names(api.list(&by_name).await.unwrap()), ["b"]);
    let everywhere: Api<ConfigMap> = Api::all(fake.client(NS));
    assert_eq!(
        names(everywhere.list(&lp("app=web")).await.unwrap()),
        ["d", "a", "b"],
        "by namespace, then name"
    );

    let bad = api_error(api.list(&lp("app in (x")).await);
    assert_eq!(bad.code, 400);
    assert_eq!(
        fake.requests().last().unwrap().query["labelSelector"],
        "app in (x"
    );
}

#[tokio::test]
async fn create_twice_is_already_exists() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "v"}})).unwrap();
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let status = api_error(api.create(&PostParams::default(), &cm).await);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (409, "AlreadyExists")
    );
}

/// What a CutoverStore writing a Topology's status with resourceVersion preconditions relies
/// on: a write from a stale read is refused, never lost.
#[tokio::test]
async fn replace_with_a_stale_resource_version_conflicts() {
    let fake = FakeApi::new();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "plumber.dev",
        "v1alpha1",
        "Topology",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(fake.client(NS), NS, &ar);
    let topology = json!({
        "apiVersion": "plumber.dev/v1alpha1", "kind": "Topology",
        "metadata": {"name": "orders"}, "spec": {"path": "orders"},
    });
    api.patch("orders", &apply(), &Patch::Apply(&topology))
        .await
        .unwrap();

    let mut read = api.get("orders").await.unwrap();
    let mut stale = read.clone();
    read.data["status"] = json!({"phase": "Cutover", "record": "step 1"});
    let written = api
        .replace_status("orders", &PostParams::default(), &read)
        .await
        .unwrap();
    assert_eq!(written.data["status"]["record"], "step 1");
    assert_eq!(
        written.metadata.generation,
        Some(1),
        "status is no generation"
    );

    // The second writer read before the first wrote.
    stale.data["status"] = json!({"phase": "Cutover", "record": "other"});
    let status = api_error(
        api.replace_status("orders", &PostParams::default(), &stale)
            .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("the object has been modified"),
        "{}",
        status.message
    );
    assert_eq!(
        api.get("orders").await.unwrap().data["status"]["record"],
        "step 1"
    );

    // The main resource's PUT checks too, and keeps the status.
    let mut fresh = api.get("orders").await.unwrap();
    fresh.data["spec"]["path"] = json!("orders-v2");
    fresh.data["status"] = json!({"phase": "ignored"});
    let replaced = api
        .replace("orders", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_eq!(replaced.data["spec"]["path"], "orders-v2");
    assert_eq!(replaced.data["status"]["record"], "step 1");
    assert_eq!(replaced.metadata.generation, Some(2));
    let status = api_error(api.replace("orders", &PostParams::default(), &fresh).await);
    assert_eq!(status.code, 409);

    // Without a resourceVersion, a replace is unconditional.
    let mut blind = api.get("orders").await.unwrap();
    blind.metadata.resource_version = None;
    blind.data["status"]["record"] = json!("blind");
    api.replace_status("orders", &PostParams::default(), &blind)
        .await
        .unwrap();

    let missing = api_error(api.replace("nothing", &PostParams::default(), &fresh).await);
    assert_eq!(missing.code, 400, "the body names another object");
}

#[tokio::test]
async fn merge_and_json_patches_of_the_status() {
    let fake = FakeApi::new();
    let ar = scaled_object_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(fake.client(NS), NS, &ar);
    api.patch("web", &apply(), &Patch::Apply(scaled_object("web")))
        .await
        .unwrap();

    let merged = api
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"health": {"a": 1}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.data["status"]["health"]["a"], 1);
    // A status patch cannot change the spec.
    let sneaky = json!({"spec": {"maxReplicaCount": 99}, "status": {"health": null}});
    let patched = api
        .patch_status("web", &PatchParams::default(), &Patch::Merge(sneaky))
        .await
        .unwrap();
    assert_eq!(patched.data["spec"]["maxReplicaCount"], 4);
    assert!(
        patched.data["status"].get("health").is_none(),
        "null deletes"
    );

    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/status", "value": {"conditions": []}},
        {"op": "add", "path": "/status/conditions/-", "value": {"type": "Ready", "status": "True"}},
    ]))
    .unwrap();
    let patched = api
        .patch_status("web", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["conditions"][0]["type"], "Ready");

    let bad: json_patch::Patch = serde_json::from_value(
        json!([{"op": "test", "path": "/spec/maxReplicaCount", "value": 1}]),
    )
    .unwrap();
    let status = api_error(
        api.patch("web", &PatchParams::default(), &Patch::Json::<()>(bad))
            .await,
    );
    assert_eq!(status.code, 422);

    let missing = api_error(
        api.patch_status("nothing", &PatchParams::default(), &Patch::Merge(json!({})))
            .await,
    );
    assert_eq!(missing.code, 404);

    let contents: Vec<String> = fake
        .requests()
        .iter()
        .filter_map(|r| r.content_type.clone())
        .collect();
    assert!(contents.contains(&"application/merge-patch+json".to_string()));
    assert!(contents.contains(&"application/json-patch+json".to_string()));
}

#[tokio::test]
async fn the_request_log_records_patch_type_field_manager_and_force() {
    let fake = FakeApi::new();
    let client = fake.client(NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let scaled: Api<DynamicObject> = Api::namespaced_with(client, NS, &scaled_object_resource());
    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", None, "img:1")),
        )
        .await
        .unwrap();
    scaled
        .patch("web", &apply().force(), &Patch::Apply(scaled_object("web")))
        .await
        .unwrap();
    deployments.get("web").await.unwrap();

    let requests = fake.requests();
    assert_eq!(requests.len(), 3);
    let applies: Vec<_> = requests
        .iter()
        .filter(|r| r.verb() == Verb::Apply)
        .collect();
    assert_eq!(applies.len(), 2);
    for r in &applies {
        assert_eq!(r.method, "PATCH");
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        assert_eq!(r.field_manager(), Some("plumber"));
        assert_eq!(r.status, Some(201));
        assert_eq!(r.namespace(), Some(NS));
    }
    assert!(!applies[0].force());
    assert!(applies[1].force());
    assert_eq!(
        applies[1].path,
        "/apis/keda.sh/v1alpha1/namespaces/plumber/scaledobjects/web"
    );
    assert_eq!(
        applies[1].body.as_ref().unwrap()["spec"]["maxReplicaCount"],
        4
    );
    assert_eq!(requests[2].summary(), "get deployments/web");
    assert_eq!(
        fake.writes(),
        ["apply deployments/web", "apply scaledobjects/web"]
    );

    assert_eq!(fake.take_requests().len(), 3);
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn apply_requires_a_field_manager() {
    let fake = FakeApi::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(NS), NS);
    let no_manager = PatchParams::default();
    let status = api_error(
        api.patch(
            "web",
            &no_manager,
            &Patch::Apply(deployment("web", None, "i")),
        )
        .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(fake.get::<Deployment>(NS, "web").is_none());
}

#[tokio::test]
async fn deletes_are_recorded_in_order_with_their_propagation_policy() {
    let fake = FakeApi::new();
    let client = fake.client(NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let scaled: Api<DynamicObject> = Api::namespaced_with(client, NS, &scaled_object_resource());
    deployments
        .patch("web", &apply(), &Patch::Apply(deployment("web", None, "i")))
        .await
        .unwrap();
    scaled
        .patch("web", &apply(), &Patch::Apply(scaled_object("web")))
        .await
        .unwrap();
    fake.clear_requests();

    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some("1".to_string()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    let status = api_error(scaled.delete("web", &stale).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("Precondition failed"),
        "{}",
        status.message
    );
    fake.clear_requests();

    let gone = scaled
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    let status = gone
        .right()
        .expect("a Status for an object deleted at once");
    assert_eq!(status.details.unwrap().name, "web");
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    assert_eq!(
        fake.writes(),
        ["delete scaledobjects/web", "delete deployments/web"]
    );
    let policies: Vec<_> = fake
        .requests()
        .iter()
        .map(|r| r.propagation_policy().map(str::to_string))
        .collect();
    assert_eq!(
        policies,
        [
            Some("Foreground".to_string()),
            Some("Background".to_string())
        ]
    );
    assert!(fake.get::<Deployment>(NS, "web").is_none());

    let status = api_error(deployments.delete("web", &DeleteParams::default()).await);
    assert_eq!(status.code, 404);
}

#[tokio::test]
async fn delete_collection_dry_run_and_generate_name() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    for labels in [
        json!({"step": "a"}),
        json!({"step": "a"}),
        json!({"step": "b"}),
    ] {
        let cm =
            serde_json::from_value(json!({"metadata": {"generateName": "cm-", "labels": labels}}))
                .unwrap();
        let created = api.create(&PostParams::default(), &cm).await.unwrap();
        assert!(created.metadata.name.unwrap().starts_with("cm-"));
    }

    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let cm = serde_json::from_value(json!({"metadata": {"name": "dry"}})).unwrap();
    api.create(&dry, &cm).await.unwrap();
    assert!(
        fake.get::<ConfigMap>(NS, "dry").is_none(),
        "a dry run stores nothing"
    );

    let deleted = api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("step=a"),
        )
        .await
        .unwrap();
    let deleted = deleted.left().expect("the list of deleted objects");
    assert_eq!(deleted.items.len(), 2);
    assert_eq!(fake.list::<ConfigMap>(NS).len(), 1);
    assert_eq!(
        fake.requests().last().unwrap().verb(),
        Verb::DeleteCollection
    );
}

#[tokio::test]
async fn finalizers_hold_a_deleted_object_until_they_are_removed() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let cm = serde_json::from_value(
        json!({"metadata": {"name": "c", "finalizers": ["plumber.dev/cleanup"]}}),
    )
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    let deleting = api.delete("c", &DeleteParams::default()).await.unwrap();
    let deleting = deleting.left().expect("the object, still being finalized");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert!(
        api.get("c")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api.get_opt("c").await.unwrap(), None);
}

#[tokio::test]
async fn the_deployment_controller_maintains_pods() {
    let fake = FakeApi::new().with_workload_controller(PodStart::Ready);
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    fake.on_pods_changed(move |e| seen.lock().unwrap().push((e.change, e.name.clone())));
    let client = fake.client(NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let names = |list: Vec<Pod>| -> Vec<String> {
        list.into_iter().map(|p| p.metadata.name.unwrap()).collect()
    };

    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(3), "img:1")),
        )
        .await
        .unwrap();
    let listed = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    assert_eq!(names(listed.clone()), ["web-0", "web-1", "web-2"]);
    let labels = listed[0].metadata.labels.clone().unwrap();
    assert_eq!(labels["plumber.dev/step"], "enrich");
    assert!(labels.contains_key("pod-template-hash"));
    let owner = &listed[0].metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Deployment", "web")
    );
    let status = deployments.get("web").await.unwrap().status.unwrap();
    assert_eq!(
        (
            status.replicas,
            status.ready_replicas,
            status.observed_generation
        ),
        (Some(3), Some(3), Some(1))
    );

    // Scaled down: the highest-numbered Pods go.
    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(1), "img:1")),
        )
        .await
        .unwrap();
    assert_eq!(names(fake.list::<Pod>(NS)), ["web-0"]);

    // A Pod deleted by hand comes back, as a new Pod.
    let uid = fake.get::<Pod>(NS, "web-0").unwrap().metadata.uid;
    assert!(fake.delete::<Pod>(NS, "web-0"));
    let back = fake.get::<Pod>(NS, "web-0").expect("the Pod is back");
    assert_ne!(back.metadata.uid, uid);

    // A new template replaces the Pods.
    events.lock().unwrap().clear();
    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(1), "img:2")),
        )
        .await
        .unwrap();
    let image = fake
        .get::<Pod>(NS, "web-0")
        .unwrap()
        .spec
        .unwrap()
        .containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("img:2"));
    assert_eq!(
        *events.lock().unwrap(),
        [
            (PodChange::Deleted, "web-0".to_string()),
            (PodChange::Added, "web-0".to_string())
        ]
    );

    // Deleting the Deployment deletes its Pods, before the delete is answered.
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let log = fake.take_pod_events();
    assert_eq!(log.last().unwrap().change, PodChange::Deleted);
    assert_eq!(
        log.iter().filter(|e| e.change == PodChange::Added).count(),
        5
    );
}

/// With a kubelet's finalizer, a Pod the controller deletes stays, terminating, until the
/// kubelet says its processes exited; its replacement (same name) comes only then.
#[tokio::test]
async fn pods_with_the_kubelet_finalizer_terminate_gracefully() {
    const KUBELET: &str = "test.plumber.dev/kubelet";
    let fake = FakeApi::new()
        .with_workload_controller(PodStart::Ready)
        .with_pod_finalizer(KUBELET);
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    fake.on_pods_changed(move |e| seen.lock().unwrap().push((e.change, e.name.clone())));
    let client = fake.client(NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client, NS);
    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(1), "img:1")),
        )
        .await
        .unwrap();
    let first = fake.get::<Pod>(NS, "web-0").unwrap();
    assert_eq!(first.metadata.finalizers, Some(vec![KUBELET.to_string()]));

    // A new template: the old Pod is marked, and no new one comes while it terminates.
    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(1), "img:2")),
        )
        .await
        .unwrap();
    let terminating = fake.get::<Pod>(NS, "web-0").unwrap();
    assert_eq!(terminating.metadata.uid, first.metadata.uid);
    assert!(terminating.metadata.deletion_timestamp.is_some());
    let status = deployments.get("web").await.unwrap().status.unwrap();
    assert_eq!(
        status.ready_replicas,
        Some(0),
        "a terminating Pod is not ready"
    );
    assert!(fake.finish_termination(NS, "web-0", KUBELET));
    let second = fake.get::<Pod>(NS, "web-0").expect("the replacement");
    assert_ne!(second.metadata.uid, first.metadata.uid);
    assert!(second.metadata.deletion_timestamp.is_none());

    // The Deployment deleted: its Pod stays until the kubelet is done with it.
    deployments
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    let listed = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].metadata.deletion_timestamp.is_some());
    assert!(fake.finish_termination(NS, "web-0", KUBELET));
    assert!(fake.get::<Pod>(NS, "web-0").is_none());
    assert_eq!(
        *events.lock().unwrap(),
        [
            (PodChange::Added, "web-0".to_string()),
            (PodChange::Terminating, "web-0".to_string()),
            (PodChange::Deleted, "web-0".to_string()),
            (PodChange::Added, "web-0".to_string()),
            (PodChange::Terminating, "web-0".to_string()),
            (PodChange::Deleted, "web-0".to_string()),
        ]
    );
}

#[tokio::test]
async fn pending_pods_become_ready_when_the_test_kubelet_says_so() {
    let fake = FakeApi::new()
        .with_workload_controller(PodStart::Pending)
        .with_manual_settle();
    let deployments: Api<Deployment> = Api::namespaced(fake.client(NS), NS);
    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(2), "i")),
        )
        .await
        .unwrap();
    assert!(fake.list::<Pod>(NS).is_empty(), "no Pods before settle");
    fake.settle();
    let pods = fake.list::<Pod>(NS);
    assert_eq!(pods.len(), 2);
    assert_eq!(
        pods[0].status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    let status = fake.get::<Deployment>(NS, "web").unwrap().status.unwrap();
    assert_eq!(status.ready_replicas, Some(0));

    fake.set_pod_ready(NS, "web-0", true);
    fake.set_pod_ready(NS, "web-1", true);
    fake.settle();
    let status = deployments.get("web").await.unwrap().status.unwrap();
    assert_eq!(status.ready_replicas, Some(2));
    let progressing = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_.as_deref() == Some("Progressing"))
        .unwrap();
    assert_eq!(
        progressing.reason.as_deref(),
        Some("NewReplicaSetAvailable")
    );
    // Settled is stable: settling again writes nothing.
    let version = fake.resource_version();
    fake.settle();
    assert_eq!(fake.resource_version(), version);
}

#[tokio::test]
async fn drift_by_hand_is_seen_and_only_a_forced_apply_puts_it_back() {
    let fake = FakeApi::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(NS), NS);
    api.patch(
        "web",
        &apply(),
        &Patch::Apply(deployment("web", Some(2), "img:1")),
    )
    .await
    .unwrap();

    // Someone scales it by hand.
    let edited: Deployment = fake.patch(NS, "web", json!({"spec": {"replicas": 5}}));
    assert_eq!(edited.metadata.generation, Some(2));
    assert_eq!(api.get("web").await.unwrap().spec.replicas, Some(5));
    let managers: Vec<_> = edited
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&HAND_MANAGER.to_string()), "{managers:?}");

    // As on a cluster: the edit took the field over, so a plain apply conflicts...
    let status = api_error(
        api.patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(2), "img:1")),
        )
        .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains(".spec.replicas"),
        "{}",
        status.message
    );
    assert!(status.message.contains(HAND_MANAGER), "{}", status.message);
    // ...and a forced one puts it back.
    let restored = api
        .patch(
            "web",
            &apply().force(),
            &Patch::Apply(deployment("web", Some(2), "img:1")),
        )
        .await
        .unwrap();
    assert_eq!(restored.spec.replicas, Some(2));

    // Someone deletes it: gone for the client, back as a new object on the next apply.
    let uid = restored.metadata.uid;
    assert!(fake.delete::<Deployment>(NS, "web"));
    assert_eq!(api.get_opt("web").await.unwrap(), None);
    let recreated = api
        .patch(
            "web",
            &apply().force(),
            &Patch::Apply(deployment("web", Some(2), "img:1")),
        )
        .await
        .unwrap();
    assert_ne!(recreated.metadata.uid, uid);
    assert_eq!(recreated.metadata.generation, Some(1));

    // A put by hand replaces the whole object, status included.
    let mut by_hand = recreated.clone();
    by_hand.metadata.labels = None;
    by_hand.status = serde_json::from_value(json!({"replicas": 7})).unwrap();
    fake.put(&by_hand);
    let read = api.get("web").await.unwrap();
    assert_eq!(read.metadata.labels, None);
    assert_eq!(read.status.unwrap().replicas, Some(7));
}

/// The lease's mutual exclusion rests on this: two managers applying one field conflict.
#[tokio::test]
async fn two_managers_applying_one_field_conflict() {
    let fake = FakeApi::new();
    let api: Api<Lease> = Api::namespaced(fake.client(NS), NS);
    let lease = |holder: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "plumber"}, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}})
    };
    api.patch(
        "plumber",
        &PatchParams::apply("replica-a"),
        &Patch::Apply(lease("a")),
    )
    .await
    .unwrap();
    let status = api_error(
        api.patch(
            "plumber",
            &PatchParams::apply("replica-b"),
            &Patch::Apply(lease("b")),
        )
        .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    let causes = status.details.unwrap().causes;
    assert_eq!(causes[0].field, ".spec.holderIdentity");
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    // The same values are no conflict: the fields become shared.
    api.patch(
        "plumber",
        &PatchParams::apply("replica-b"),
        &Patch::Apply(lease("a")),
    )
    .await
    .unwrap();
    let held = api.get("plumber").await.unwrap();
    assert_eq!(held.spec.unwrap().holder_identity.as_deref(), Some("a"));
}

#[tokio::test]
async fn injected_faults_fail_the_matching_requests_a_number_of_times() {
    let fake = FakeApi::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(NS), NS);
    fake.fail_next(2, |r| r.verb() == Verb::Apply, Fault::internal_error());
    let web = || Patch::Apply(deployment("web", None, "i"));
    for _ in 0..2 {
        let status = api_error(api.patch("web", &apply(), &web()).await);
        assert_eq!(
            (status.code, status.reason.as_str()),
            (500, "InternalError")
        );
    }
    assert!(
        fake.get::<Deployment>(NS, "web").is_none(),
        "a failed request changes nothing"
    );
    api.patch("web", &apply(), &web()).await.unwrap();
    let statuses: Vec<_> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Some(500), Some(500), Some(201)]);

    fake.fail_next(
        1,
        |r| r.name() == Some("web") && r.method == "GET",
        Fault::transport("connection reset"),
    );
    match api.get("web").await {
        Err(kube::Error::Service(e)) => assert!(e.to_string().contains("connection reset"), "{e}"),
        other => panic!("expected a service error, got {other:?}"),
    }
    api.get("web").await.unwrap();

    fake.fail_next(1, |r| r.verb() == Verb::Replace, Fault::conflict());
    let current = api.get("web").await.unwrap();
    let status = api_error(api.replace("web", &PostParams::default(), &current).await);
    assert_eq!(status.code, 409);
    api.replace("web", &PostParams::default(), &current)
        .await
        .unwrap();
}

#[tokio::test]
async fn held_requests_are_answered_on_release() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let hold = fake.hold(|r| r.verb() == Verb::Create);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    let pending = tokio::spawn({
        let api = api.clone();
        async move { api.create(&PostParams::default(), &cm).await }
    });
    hold.wait_held(1).await;
    assert_eq!(fake.requests()[0].status, None, "recorded, not answered");
    assert!(fake.get::<ConfigMap>(NS, "c").is_none());
    // Other requests pass.
    assert_eq!(api.get_opt("c").await.unwrap(), None);
    hold.release();
    pending.await.unwrap().unwrap();
    assert!(fake.get::<ConfigMap>(NS, "c").is_some());
    assert_eq!(fake.requests()[0].status, Some(201));
}

#[tokio::test]
async fn scaled_objects_are_validated_against_kedas_crd() {
    let crd = plumber_testkit::kube_api::KEDA_SCALED_OBJECT_CRD;
    let fake = FakeApi::new().with_crd_yaml(crd);
    let api: Api<DynamicObject> =
        Api::namespaced_with(fake.client(NS), NS, &scaled_object_resource());
    api.patch("web", &apply(), &Patch::Apply(scaled_object("web")))
        .await
        .unwrap();

    let mut numeric_lag = scaled_object("bad");
    numeric_lag["spec"]["triggers"][0]["metadata"]["lagThreshold"] = json!(100);
    numeric_lag["spec"]["minReplicaCount"] = json!(-1);
    numeric_lag["spec"]["scaleTargetRef"] = json!({});
    numeric_lag["spec"]["typo"] = json!(true);
    let status = api_error(
        api.patch("bad", &apply(), &Patch::Apply(&numeric_lag))
            .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    let fields: Vec<String> = status
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    for expected in [
        "spec.triggers[0].metadata.lagThreshold",
        "spec.minReplicaCount",
        "spec.scaleTargetRef",
        "spec.typo",
    ] {
        assert!(
            fields.iter().any(|f| f == expected),
            "{expected} not in {fields:?}"
        );
    }
    assert!(
        status
            .message
            .starts_with("ScaledObject.keda.sh \"bad\" is invalid"),
        "{}",
        status.message
    );
    assert_eq!(api.get_opt("bad").await.unwrap(), None);

    // The result of a patch is validated, too.
    let status = api_error(
        api.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"triggers": []}})),
        )
        .await,
    );
    assert_eq!(status.code, 422);
}

/// As production code runs kube calls: its own current-thread runtime in a plain thread,
/// `block_on` for each call (like `src/kafka.rs` with rdkafka's admin).
#[test]
fn block_on_from_a_plain_thread() {
    let fake = FakeApi::new().with_workload_controller(PodStart::Ready);
    let worker = {
        let fake = fake.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let client = runtime.block_on(async { fake.client(NS) });
            let api: Api<Deployment> = Api::namespaced(client, NS);
            for image in ["img:1", "img:2"] {
                let patch = Patch::Apply(deployment("web", Some(2), image));
                runtime
                    .block_on(api.patch("web", &apply(), &patch))
                    .unwrap();
            }
            let pods: Api<Pod> = {
                let _guard = runtime.enter();
                Api::namespaced(fake.client(NS), NS)
            };
            runtime
                .block_on(pods.list(&ListParams::default()))
                .unwrap()
                .items
                .len()
        })
    };
    assert_eq!(worker.join().unwrap(), 2);
    assert_eq!(
        fake.get::<Deployment>(NS, "web")
            .unwrap()
            .metadata
            .generation,
        Some(2)
    );
}

#[test]
#[should_panic(expected = "FakeApi::client needs a tokio runtime")]
fn a_client_outside_a_runtime_is_a_clear_panic() {
    let _ = FakeApi::new().client(NS);
}

// ---- watches ----

/// Polls `condition` until it holds; fails after a generous minute.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + plumber_testkit::PATIENCE;
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited {:?} for {what}",
            plumber_testkit::PATIENCE
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The next event of a raw watch, within a minute.
async fn next_event<K>(
    stream: &mut (impl futures::Stream<Item = Result<WatchEvent<K>, kube::Error>> + Unpin),
) -> Option<WatchEvent<K>> {
    tokio::time::timeout(plumber_testkit::PATIENCE, stream.next())
        .await
        .expect("a watch event within the patience")
        .map(|event| event.expect("a watch event, not an error"))
}

fn labelled_deployment(name: &str, tier: &str) -> Value {
    let mut object = deployment(name, None, "img:1");
    object["metadata"]["labels"]["tier"] = json!(tier);
    object
}

fn names<K: kube::Resource + Clone>(reader: &reflector::Store<K>) -> Vec<String>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    let mut names: Vec<String> = reader
        .state()
        .iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect();
    names.sort();
    names
}

/// Runs a reflector over `api` until the test ends; returns its store and every name any
/// event carried.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (reflector::Store<K>, Arc<Mutex<Vec<String>>>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let stream = reflector(writer, watcher(api, config));
    tokio::spawn({
        let seen = seen.clone();
        async move {
            stream
                .for_each(|event| {
                    if let Ok(event) = event {
                        let objects: Vec<&K> = match &event {
                            watcher::Event::Apply(o)
                            | watcher::Event::Delete(o)
                            | watcher::Event::InitApply(o) => vec![o],
                            watcher::Event::Init | watcher::Event::InitDone => vec![],
                        };
                        seen.lock().unwrap().extend(
                            objects
                                .into_iter()
                                .map(|o| o.meta().name.clone().unwrap_or_default()),
                        );
                    }
                    async {}
                })
                .await;
        }
    });
    (reader, seen)
}

#[tokio::test]
async fn a_reflector_follows_deployments_by_label_selector() {
    let fake = FakeApi::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(NS), NS);
    api.patch(
        "before",
        &apply(),
        &Patch::Apply(labelled_deployment("before", "web")),
    )
    .await
    .unwrap();
    let (reader, seen) = reflect(api.clone(), watcher::Config::default().labels("tier=web"));
    eventually("the listed Deployment", || names(&reader) == ["before"]).await;

    // Created by a request, while the watch is open.
    api.patch(
        "a",
        &apply(),
        &Patch::Apply(labelled_deployment("a", "web")),
    )
    .await
    .unwrap();
    api.patch("c", &apply(), &Patch::Apply(labelled_deployment("c", "db")))
        .await
        .unwrap();
    eventually("a created", || names(&reader) == ["a", "before"]).await;
    let a = ObjectRef::new("a").within(NS);

    // Edited by hand, then by an apply.
    fake.patch::<Deployment>(NS, "a", json!({"spec": {"replicas": 3}}));
    eventually("the hand edit", || {
        reader
            .get(&a)
            .is_some_and(|d| serde_json::to_value(&*d).unwrap()["spec"]["replicas"] == 3)
    })
    .await;
    let mut image_2 = labelled_deployment("a", "web");
    image_2["spec"]["template"]["spec"]["containers"][0]["image"] = json!("img:2");
    api.patch("a", &apply(), &Patch::Apply(&image_2))
        .await
        .unwrap();
    eventually("the apply", || {
        reader.get(&a).is_some_and(|d| {
            serde_json::to_value(&*d).unwrap()["spec"]["template"]["spec"]["containers"][0]["image"]
                == "img:2"
        })
    })
    .await;
    let stored = fake.get::<Deployment>(NS, "a").unwrap();
    eventually("the stored resourceVersion", || {
        reader.get(&a).unwrap().metadata.resource_version == stored.metadata.resource_version
    })
    .await;

    // Moved into and out of the selector by their labels.
    fake.patch::<Deployment>(NS, "c", json!({"metadata": {"labels": {"tier": "web"}}}));
    eventually("c moved in", || names(&reader) == ["a", "before", "c"]).await;
    fake.patch::<Deployment>(NS, "a", json!({"metadata": {"labels": {"tier": "db"}}}));
    eventually("a moved out", || names(&reader) == ["before", "c"]).await;

    // Deleted by a request and by hand.
    api.delete("c", &DeleteParams::default()).await.unwrap();
    assert!(fake.delete::<Deployment>(NS, "before"));
    eventually("the deletes", || names(&reader).is_empty()).await;

    // `outside` never matched: no event carried it, nor `a` after it left.
    api.patch(
        "outside",
        &apply(),
        &Patch::Apply(labelled_deployment("outside", "db")),
    )
    .await
    .unwrap();
    fake.patch::<Deployment>(NS, "a", json!({"spec": {"replicas": 4}}));
    api.patch(
        "last",
        &apply(),
        &Patch::Apply(labelled_deployment("last", "web")),
    )
    .await
    .unwrap();
    eventually("the last one", || names(&reader) == ["last"]).await;
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.iter().any(|n| n == "outside"), "{seen:?}");
    let watches: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.verb() == Verb::Watch)
        .collect();
    assert_eq!(watches.len(), 1, "one watch, still open");
    assert_eq!(watches[0].status, Some(200));
    assert_eq!(watches[0].query["labelSelector"], "tier=web");
    assert_eq!(fake.active_watches(), 1);
}

#[tokio::test]
async fn a_watch_from_a_lists_version_sees_exactly_the_later_changes() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "1"}})).unwrap()
    };
    api.create(&PostParams::default(), &cm("old"))
        .await
        .unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    let from = list.metadata.resource_version.clone().unwrap();
    assert_eq!(
        from,
        fake.resource_version(),
        "a list is at the global version"
    );

    // Changes after the list, before the watch; and some no watch of these sees.
    api.create(&PostParams::default(), &cm("x")).await.unwrap();
    api.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    let other: Api<ConfigMap> = Api::namespaced(fake.client("other"), "other");
    other
        .create(&PostParams::default(), &cm("elsewhere"))
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(fake.client(NS), NS);
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "l"}})).unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    api.delete("x", &DeleteParams::default()).await.unwrap();
    let deleted_at = fake.resource_version();

    let mut stream = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    // And one after the watch began.
    fake.patch::<ConfigMap>(NS, "old", json!({"data": {"k": "3"}}));

    let mut events = Vec::new();
    for _ in 0..4 {
        events.push(next_event(&mut stream).await.unwrap());
    }
    let summary: Vec<(&str, String, u64)> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(o) => ("ADDED", o.metadata.name.clone().unwrap(), rv(&o.metadata)),
            WatchEvent::Modified(o) => (
                "MODIFIED",
                o.metadata.name.clone().unwrap(),
                rv(&o.metadata),
            ),
            WatchEvent::Deleted(o) => {
                ("DELETED", o.metadata.name.clone().unwrap(), rv(&o.metadata))
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let kinds: Vec<(&str, &str)> = summary.iter().map(|(k, n, _)| (*k, n.as_str())).collect();
    assert_eq!(
        kinds,
        [
            ("ADDED", "x"),
            ("MODIFIED", "x"),
            ("DELETED", "x"),
            ("MODIFIED", "old")
        ]
    );
    let versions: Vec<u64> = summary.iter().map(|(_, _, v)| *v).collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    assert!(versions[0] > from.parse().unwrap());
    assert_eq!(
        versions[2].to_string(),
        deleted_at,
        "a deletion is a version of its own"
    );
    let WatchEvent::Deleted(last) = &events[2] else {
        unreachable!()
    };
    assert_eq!(last.data.as_ref().unwrap()["k"], "2", "the last state");
    assert_eq!(versions[3].to_string(), fake.resource_version());

    // A version older than the log keeps: 410 Expired, then the end.
    let short = FakeApi::new().with_watch_history(2);
    let api: Api<ConfigMap> = Api::namespaced(short.client(NS), NS);
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let from = short.resource_version();
    for name in ["b", "c", "d"] {
        api.create(&PostParams::default(), &cm(name)).await.unwrap();
    }
    let mut stream = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    match next_event(&mut stream).await {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(next_event(&mut stream).await.is_none(), "the stream ends");
    // Within the log: the last two.
    let mut stream = api
        .watch(&WatchParams::default(), "2")
        .await
        .unwrap()
        .boxed();
    for name in ["c", "d"] {
        match next_event(&mut stream).await {
            Some(WatchEvent::Added(o)) => assert_eq!(o.metadata.name.as_deref(), Some(name)),
            other => panic!("expected {name} ADDED, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_watch_from_nothing_starts_with_the_current_objects() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    for (name, app) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": app}}}))
                .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let mut stream = api
        .watch(&WatchParams::default().labels("app=web"), "0")
        .await
        .unwrap()
        .boxed();
    for name in ["a", "c"] {
        match next_event(&mut stream).await {
            Some(WatchEvent::Added(o)) => assert_eq!(o.metadata.name.as_deref(), Some(name)),
            other => panic!("expected {name} ADDED, got {other:?}"),
        }
    }
    // Across namespaces, with a field selector.
    let all: Api<ConfigMap> = Api::all(fake.client(NS));
    let mut stream = all
        .watch(&WatchParams::default().fields("metadata.name=b"), "0")
        .await
        .unwrap()
        .boxed();
    match next_event(&mut stream).await {
        Some(WatchEvent::Added(o)) => assert_eq!(o.metadata.name.as_deref(), Some("b")),
        other => panic!("expected b ADDED, got {other:?}"),
    }
    let status = api_error(
        api.watch(&WatchParams::default().labels("app in (web"), "0")
            .await
            .map(|_| ()),
    );
    assert_eq!(status.code, 400);
}

#[tokio::test]
async fn finalizers_make_a_deletion_a_modified_then_a_deleted() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "f", "finalizers": ["plumber.dev/hold"]}}),
    )
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &fake.resource_version())
        .await
        .unwrap()
        .boxed();
    api.delete("f", &DeleteParams::default()).await.unwrap();
    match next_event(&mut stream).await {
        Some(WatchEvent::Modified(o)) => assert!(o.metadata.deletion_timestamp.is_some()),
        other => panic!("expected a MODIFIED with a deletionTimestamp, got {other:?}"),
    }
    fake.patch::<ConfigMap>(NS, "f", json!({"metadata": {"finalizers": null}}));
    match next_event(&mut stream).await {
        Some(WatchEvent::Modified(o)) => assert_eq!(o.metadata.finalizers, None),
        other => panic!("expected the finalizer's removal, got {other:?}"),
    }
    match next_event(&mut stream).await {
        Some(WatchEvent::Deleted(o)) => {
            assert_eq!(rv(&o.metadata).to_string(), fake.resource_version());
        }
        other => panic!("expected a DELETED, got {other:?}"),
    }
    assert!(fake.get::<ConfigMap>(NS, "f").is_none());
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream_and_the_watcher_watches_again() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let leases: Api<Lease> = Api::namespaced(fake.client(NS), NS);
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "l"}})).unwrap();

    // A raw watch: its events, then (bookmarks allowed) a BOOKMARK at the version it is
    // complete to, then the end.
    let mut stream = api
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        next_event(&mut stream).await,
        Some(WatchEvent::Added(_))
    ));
    leases.create(&PostParams::default(), &lease).await.unwrap();
    match next_event(&mut stream).await {
        Some(WatchEvent::Bookmark(mark)) => {
            assert_eq!(mark.metadata.resource_version, fake.resource_version());
            assert_eq!(mark.types.kind, "ConfigMap");
        }
        other => panic!("expected a BOOKMARK, got {other:?}"),
    }
    assert!(next_event(&mut stream).await.is_none(), "the stream ends");
    eventually("the ended watch is forgotten", || {
        fake.active_watches() == 0
    })
    .await;
    let params = WatchParams {
        bookmarks: false,
        ..WatchParams::default().timeout(1)
    };
    let mut stream = api.watch(&params, "0").await.unwrap().boxed();
    assert!(matches!(
        next_event(&mut stream).await,
        Some(WatchEvent::Added(_))
    ));
    assert!(
        next_event(&mut stream).await.is_none(),
        "no bookmark unless allowed"
    );

    // kube's watcher watches again from the last version it saw, without listing again.
    fake.clear_requests();
    let (reader, _) = reflect(api.clone(), watcher::Config::default().timeout(1));
    eventually("the list", || names(&reader) == ["a"]).await;
    eventually("a second watch", || {
        fake.requests()
            .iter()
            .filter(|r| r.verb() == Verb::Watch)
            .count()
            >= 2
    })
    .await;
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    eventually("b after the re-watch", || names(&reader) == ["a", "b"]).await;
    fake.patch::<ConfigMap>(NS, "a", json!({"data": {"k": "v"}}));
    eventually("a's change", || {
        reader
            .get(&ObjectRef::new("a").within(NS))
            .is_some_and(|a| a.data.is_some())
    })
    .await;
    let requests = fake.requests();
    let lists = requests.iter().filter(|r| r.verb() == Verb::List).count();
    assert_eq!(lists, 1, "resumed, not listed again: {requests:?}");
    assert!(
        requests
            .iter()
            .filter(|r| r.verb() == Verb::Watch)
            .all(|r| r.query["timeoutSeconds"] == "1")
    );
}

#[tokio::test]
async fn an_expired_version_makes_the_watcher_list_again() {
    let fake = FakeApi::new().with_watch_history(1);
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    // Every re-watch from the list's version finds it expired once two changes passed.
    let hold = fake.hold(|r| r.verb() == Verb::Watch);
    let (reader, _) = reflect(api.clone(), watcher::Config::default().timeout(1));
    hold.wait_held(1).await;
    eventually("the list", || names(&reader) == ["a"]).await;
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    api.create(&PostParams::default(), &cm("c")).await.unwrap();
    hold.release();
    eventually("all three, listed again", || {
        names(&reader) == ["a", "b", "c"]
    })
    .await;
    let lists = fake
        .requests()
        .iter()
        .filter(|r| r.verb() == Verb::List)
        .count();
    assert!(lists >= 2, "listed again after the 410");
}

#[tokio::test]
async fn a_dynamic_watch_of_keda_scaled_objects() {
    let fake = FakeApi::new().with_crd_yaml(plumber_testkit::kube_api::KEDA_SCALED_OBJECT_CRD);
    let ar = scaled_object_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(fake.client(NS), NS, &ar);
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    api.patch("web", &apply(), &Patch::Apply(scaled_object("web")))
        .await
        .unwrap();
    match next_event(&mut stream).await {
        Some(WatchEvent::Added(o)) => {
            assert_eq!(o.metadata.name.as_deref(), Some("web"));
            assert_eq!(o.types.unwrap().kind, "ScaledObject");
            assert_eq!(o.data["spec"]["maxReplicaCount"], 4);
        }
        other => panic!("expected web ADDED, got {other:?}"),
    }
    let mut bigger = scaled_object("web");
    bigger["spec"]["maxReplicaCount"] = json!(8);
    api.patch("web", &apply(), &Patch::Apply(&bigger))
        .await
        .unwrap();
    match next_event(&mut stream).await {
        Some(WatchEvent::Modified(o)) => assert_eq!(o.data["spec"]["maxReplicaCount"], 8),
        other => panic!("expected web MODIFIED, got {other:?}"),
    }
    api.delete("web", &DeleteParams::default()).await.unwrap();
    assert!(matches!(
        next_event(&mut stream).await,
        Some(WatchEvent::Deleted(_))
    ));

    // And through kube's watcher, dynamically typed.
    let writer = reflector::store::Writer::new(ar.clone());
    let reader = writer.as_reader();
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default()));
    tokio::spawn(stream.for_each(|_| async {}));
    api.patch("two", &apply(), &Patch::Apply(scaled_object("two")))
        .await
        .unwrap();
    eventually("two in the store", || {
        reader
            .get(&ObjectRef::new_with("two", ar.clone()).within(NS))
            .is_some()
    })
    .await;
}

#[tokio::test]
async fn pod_watches_see_the_controllers_pods_come_and_go() {
    let fake = FakeApi::new().with_workload_controller(PodStart::Pending);
    let deployments: Api<Deployment> = Api::namespaced(fake.client(NS), NS);
    let pods: Api<Pod> = Api::namespaced(fake.client(NS), NS);
    let (reader, _) = reflect(pods, watcher::Config::default().labels("app=web"));
    let ready = |name: &str| {
        reader
            .get(&ObjectRef::new(name).within(NS))
            .is_some_and(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
    };
    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(2), "img:1")),
        )
        .await
        .unwrap();
    deployments
        .patch(
            "db",
            &apply(),
            &Patch::Apply(deployment("db", Some(1), "img:1")),
        )
        .await
        .unwrap();
    eventually("two web Pods", || names(&reader) == ["web-0", "web-1"]).await;
    fake.set_pod_ready(NS, "web-1", true);
    eventually("web-1 ready", || ready("web-1")).await;
    assert!(!ready("web-0"));

    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(1), "img:1")),
        )
        .await
        .unwrap();
    eventually("one web Pod", || names(&reader) == ["web-0"]).await;
    let uid = |reader: &reflector::Store<Pod>| {
        reader
            .get(&ObjectRef::new("web-0").within(NS))
            .and_then(|p| p.metadata.uid.clone())
    };
    let first = uid(&reader);
    deployments
        .patch(
            "web",
            &apply(),
            &Patch::Apply(deployment("web", Some(1), "img:2")),
        )
        .await
        .unwrap();
    eventually("a new web-0 for the new template", || uid(&reader) != first).await;
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("no web Pods", || names(&reader).is_empty()).await;
    assert_eq!(fake.list::<Pod>(NS).len(), 1, "db's Pod stays");
}

#[tokio::test]
async fn a_dropped_watch_unregisters() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    let stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let other = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert_eq!(fake.active_watches(), 2);
    drop(stream);
    eventually("one watch left", || fake.active_watches() == 1).await;
    // Changes with a dropped watch do not fail (nor block on the unread one).
    for name in ["a", "b"] {
        api.create(&PostParams::default(), &cm(name)).await.unwrap();
    }
    drop(other);
    api.create(&PostParams::default(), &cm("c")).await.unwrap();
    assert_eq!(fake.active_watches(), 0);

    // A watcher's, with its task and client gone.
    let (reader, _) = reflect(api.clone(), watcher::Config::default());
    eventually("the watcher's list", || names(&reader).len() == 3).await;
    eventually("its watch", || fake.active_watches() == 1).await;
    let task = {
        let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
        tokio::spawn(async move {
            let mut stream = api
                .watch(&WatchParams::default(), "0")
                .await
                .unwrap()
                .boxed();
            while stream.next().await.is_some() {}
        })
    };
    eventually("two watches", || fake.active_watches() == 2).await;
    task.abort();
    let _ = task.await;
    eventually("the aborted task's watch gone", || {
        fake.active_watches() == 1
    })
    .await;
    drop(api);
    assert_eq!(fake.active_watches(), 1, "the reflector still runs");
}

#[tokio::test]
async fn await_condition_sees_a_rollout_complete() {
    let fake = FakeApi::new().with_workload_controller(PodStart::Pending);
    let api: Api<Deployment> = Api::namespaced(fake.client(NS), NS);
    api.patch(
        "web",
        &apply(),
        &Patch::Apply(deployment("web", Some(1), "img:1")),
    )
    .await
    .unwrap();
    let waiting = tokio::spawn(kube::runtime::wait::await_condition(
        api.clone(),
        "web",
        kube::runtime::wait::conditions::is_deployment_completed(),
    ));
    eventually("the condition's watch", || fake.active_watches() == 1).await;
    assert!(!waiting.is_finished());
    fake.set_pod_ready(NS, "web-0", true);
    let done = tokio::time::timeout(plumber_testkit::PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(done.status.unwrap().ready_replicas, Some(1));
    assert!(fake.requests().iter().any(|r| r.verb() == Verb::Watch
        && r.query.get("fieldSelector").map(String::as_str) == Some("metadata.name=web")));
}

#[tokio::test]
async fn a_watch_from_a_newer_version_sees_only_what_comes_after_it() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(NS), NS);
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    let ahead = (fake.resource_version().parse::<u64>().unwrap() + 1).to_string();
    let mut stream = api
        .watch(&WatchParams::default(), &ahead)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("skipped"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("seen"))
        .await
        .unwrap();
    match next_event(&mut stream).await {
        Some(WatchEvent::Added(o)) => assert_eq!(o.metadata.name.as_deref(), Some("seen")),
        other => panic!("expected seen ADDED, got {other:?}"),
    }
}
