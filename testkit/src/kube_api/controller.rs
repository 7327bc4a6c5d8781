//! A stand-in for the deployment, ReplicaSet and StatefulSet controllers and the scheduler at
//! once: each Deployment and StatefulSet gets `spec.replicas` (default 1) Pods named
//! `<name>-<k>`, owned by the workload itself (no ReplicaSet objects), labelled with
//! `spec.selector.matchLabels`, the template's labels and the template's revision
//! (`pod-template-hash`; a StatefulSet's Pods `controller-revision-hash: <name>-<hash>` and
//! `statefulset.kubernetes.io/pod-name`). A Pod of an older template, past the replica
//! count, or of a workload that is gone or being deleted is deleted; a Pod deleted by hand
//! comes back, under the same name once the old one is gone (a StatefulSet's guarantee: at
//! most one Pod per ordinal; a real Deployment's replacement has a new random name, which
//! this stand-in does not model). A Deployment's status counts the Pods (`replicas`,
//! `updatedReplicas`, `readyReplicas`, `availableReplicas`) and carries the `Available` and
//! `Progressing` conditions `kube::runtime::conditions` reads; a StatefulSet's counts them
//! too, with `currentRevision` and `updateRevision`. Pods of a StatefulSet's new revision
//! replace the old all at once, not one ordinal after another.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Map, Value, json};

use super::PodStart;
use super::fields::Scope;
use super::store::{Key, Resource, Store, now};

/// The manager the controller's writes are recorded under.
const MANAGER: &str = "kube-controller-manager";

fn template_hash(template: &Value) -> String {
    let mut hasher = DefaultHasher::new();
    template.to_string().hash(&mut hasher);
    let hex = format!("{:016x}", hasher.finish());
    hex[..10].to_string()
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// The kinds of workload this controller runs Pods for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    Deployment,
    StatefulSet,
}

impl Workload {
    const ALL: [Workload; 2] = [Workload::Deployment, Workload::StatefulSet];

    fn kind(self) -> &'static str {
        match self {
            Workload::Deployment => "Deployment",
            Workload::StatefulSet => "StatefulSet",
        }
    }

    fn resource(self) -> Resource {
        match self {
            Workload::Deployment => Resource::new("apps", "deployments"),
            Workload::StatefulSet => Resource::new("apps", "statefulsets"),
        }
    }

    /// The label a Pod carries its template's revision in, and its value.
    fn revision(self, name: &str, hash: &str) -> (&'static str, String) {
        match self {
            Workload::Deployment => ("pod-template-hash", hash.to_owned()),
            Workload::StatefulSet => ("controller-revision-hash", format!("{name}-{hash}")),
        }
    }
}

fn owner_uid(pod: &Value) -> Option<String> {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| Workload::ALL.iter().any(|w| r["kind"] == w.kind()) && r["controller"] == true)
        .and_then(|r| r["uid"].as_str())
        .map(str::to_string)
}

/// The status a Pod starts with.
pub(crate) fn pod_status(ready: bool) -> Value {
    let truth = if ready { "True" } else { "False" };
    let conditions: Vec<Value> = ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
        .iter()
        .map(|t| {
            let status = if matches!(*t, "PodScheduled" | "Initialized") {
                "True"
            } else {
                truth
            };
            json!({"type": t, "status": status, "lastTransitionTime": now()})
        })
        .collect();
    json!({
        "phase": if ready { "Running" } else { "Pending" },
        "conditions": conditions,
        "hostIP": "10.0.0.1",
    })
}

fn string_map(value: Option<&Value>) -> Map<String, Value> {
    value
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// Brings Pods and workload statuses in line with the Deployments and StatefulSets once; the
/// result is stable (a second call changes nothing).
pub(crate) fn settle(store: &mut Store, start: PodStart, finalizer: Option<&str>) {
    let pods = Resource::new("", "pods");
    let mut live_uids = BTreeSet::new();
    for workload in Workload::ALL {
        settle_kind(store, workload, start, finalizer, &mut live_uids);
    }

    // The garbage collector: Pods whose owning workload is gone.
    for pod_key in store.keys(&pods, None) {
        let orphan = store
            .stored(&pod_key)
            .and_then(|s| owner_uid(&s.object))
            .is_some_and(|uid| !live_uids.contains(&uid));
        if orphan {
            delete_pod(store, &pod_key);
        }
    }
}

fn settle_kind(
    store: &mut Store,
    workload: Workload,
    start: PodStart,
    finalizer: Option<&str>,
    live_uids: &mut BTreeSet<String>,
) {
    let pods = Resource::new("", "pods");
    for key in store.keys(&workload.resource(), None) {
        let Some(object) = store.stored(&key).map(|s| s.object.clone()) else {
            continue;
        };
        let uid = object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        live_uids.insert(uid.clone());
        let deleting = object.pointer("/metadata/deletionTimestamp").is_some();
        let replicas = if deleting {
            0
        } else {
            object
                .pointer("/spec/replicas")
                .and_then(Value::as_u64)
                .unwrap_or(1)
        };
        let template = object
            .pointer("/spec/template")
            .cloned()
            .unwrap_or(json!({}));
        let (revision_label, revision) = workload.revision(&key.name, &template_hash(&template));
        let desired: BTreeSet<String> =
            (0..replicas).map(|k| format!("{}-{k}", key.name)).collect();

        let owned: BTreeMap<Key, Value> = store
            .keys(&pods, Some(&key.namespace))
            .into_iter()
            .filter_map(|k| store.stored(&k).map(|s| (k, s.object.clone())))
            .filter(|(_, pod)| owner_uid(pod).as_deref() == Some(uid.as_str()))
            .collect();
        for (pod_key, pod) in &owned {
            let current = pod
                .pointer("/metadata/labels")
                .and_then(|labels| labels.get(revision_label))
                == Some(&Value::from(revision.clone()));
            if !current || !desired.contains(&pod_key.name) {
                delete_pod(store, pod_key);
            }
        }
        for name in &desired {
            let pod_key = Key {
                resource: pods.clone(),
                namespace: key.namespace.clone(),
                name: name.clone(),
            };
            if store.stored(&pod_key).is_some() {
                continue; // ours and current, or someone else's of the same name
            }
            let mut labels = string_map(template.pointer("/metadata/labels"));
            labels.extend(string_map(object.pointer("/spec/selector/matchLabels")));
            labels.insert(revision_label.into(), Value::from(revision.clone()));
            if workload == Workload::StatefulSet {
                labels.insert(
                    "statefulset.kubernetes.io/pod-name".into(),
                    Value::from(name.clone()),
                );
            }
            let mut metadata = json!({
                "name": name,
                "namespace": key.namespace,
                "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "apps/v1",
                    "kind": workload.kind(),
                    "name": key.name,
                    "uid": uid,
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
            });
            if let Some(annotations) = template.pointer("/metadata/annotations") {
                metadata["annotations"] = annotations.clone();
            }
            if let Some(finalizer) = finalizer {
                metadata["finalizers"] = json!([finalizer]);
            }
            let mut spec = template.get("spec").cloned().unwrap_or(json!({}));
            spec["nodeName"] = Value::from("fake-node");
            let pod = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": metadata,
                "spec": spec,
                "status": pod_status(start == PodStart::Ready),
            });
            let mut ownership = super::fields::Ownership::default();
            let meta = ("v1", now());
            ownership.update(MANAGER, Scope::Main, &json!({}), &pod, (meta.0, &meta.1));
            ownership.update(MANAGER, Scope::Status, &json!({}), &pod, (meta.0, &meta.1));
            store.commit(&pod_key, pod, ownership);
        }

        update_status(
            store,
            workload,
            &key,
            &uid,
            (revision_label, &revision),
            replicas,
        );
    }
}

/// Deletes a Pod as the API server would: one with finalizers is only marked, and stays
/// (terminating) until they are removed.
fn delete_pod(store: &mut Store, key: &Key) {
    let finalized = store
        .stored(key)
        .and_then(|s| s.object.pointer("/metadata/finalizers"))
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if finalized {
        store.remove(key);
    } else {
        store.mark_deleted(key);
    }
}

fn condition(old: Option<&Value>, type_: &str, status: bool, reason: &str, message: &str) -> Value {
    let status = if status { "True" } else { "False" };
    let previous = old
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_));
    let unchanged = previous.is_some_and(|c| c["status"] == status && c["reason"] == reason);
    let time = match previous {
        Some(c) if unchanged => c["lastTransitionTime"].clone(),
        _ => Value::from(now()),
    };
    json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": time,
        "lastUpdateTime": time,
    })
}

fn update_status(
    store: &mut Store,
    workload: Workload,
    key: &Key,
    uid: &str,
    (revision_label, revision): (&str, &str),
    desired: u64,
) {
    let pods = Resource::new("", "pods");
    let owned: Vec<Value> = store
        .keys(&pods, Some(&key.namespace))
        .iter()
        .filter_map(|k| store.stored(k).map(|s| s.object.clone()))
        .filter(|pod| owner_uid(pod).as_deref() == Some(uid))
        .collect();
    let replicas = owned.len() as u64;
    let updated = owned
        .iter()
        .filter(|p| {
            p.pointer("/metadata/labels")
                .and_then(|labels| labels.get(revision_label))
                == Some(&Value::from(revision))
        })
        .count() as u64;
    // A terminating Pod serves no more, whatever its last readiness said.
    let ready = owned
        .iter()
        .filter(|p| is_ready(p) && p.pointer("/metadata/deletionTimestamp").is_none())
        .count() as u64;
    let Some(stored) = store.stored(key) else {
        return;
    };
    let old_status = stored.object.get("status").cloned().unwrap_or(json!({}));
    let old_conditions = old_status.get("conditions");
    let generation = stored
        .object
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let status = match workload {
        Workload::Deployment => deployment_status(
            old_conditions,
            generation,
            (replicas, updated, ready),
            desired,
        ),
        Workload::StatefulSet => json!({
            "observedGeneration": generation,
            "replicas": replicas,
            "currentReplicas": updated,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentRevision": revision,
            "updateRevision": revision,
        }),
    };
    if status == old_status {
        return;
    }
    let mut object = stored.object.clone();
    let mut ownership = stored.ownership.clone();
    object["status"] = status;
    let time = now();
    ownership.update(
        MANAGER,
        Scope::Status,
        &stored.object,
        &object,
        ("apps/v1", &time),
    );
    store.commit(key, object, ownership);
}

fn deployment_status(
    old_conditions: Option<&Value>,
    generation: Value,
    (replicas, updated, ready): (u64, u64, u64),
    desired: u64,
) -> Value {
    let available = ready >= desired;
    let complete = updated == desired && ready == desired && replicas == desired;
    let mut status = json!({
        "observedGeneration": generation,
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": [
            condition(
                old_conditions,
                "Available",
                available,
                if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                if available { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." },
            ),
            condition(
                old_conditions,
                "Progressing",
                true,
                if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                &format!("{} pods of {desired} are current and ready", ready.min(updated)),
            ),
        ],
    });
    if replicas > ready {
        status["unavailableReplicas"] = Value::from(replicas - ready);
    }
    status
}
