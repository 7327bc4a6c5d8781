//! A stand-in for the deployment controller, the ReplicaSet controller and the scheduler at
//! once: each Deployment gets `spec.replicas` (default 1) Pods named `<deployment>-<k>`,
//! owned by the Deployment itself (no ReplicaSet objects), labelled with
//! `spec.selector.matchLabels`, the template's labels and `pod-template-hash`. A Pod of an
//! older template, past the replica count, or of a Deployment that is gone or being deleted
//! is deleted; a Pod deleted by hand comes back. The Deployment's status counts the Pods
//! (`replicas`, `updatedReplicas`, `readyReplicas`, `availableReplicas`) and carries the
//! `Available` and `Progressing` conditions `kube::runtime::conditions` reads.

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

fn owner_uid(pod: &Value) -> Option<String> {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["kind"] == "Deployment" && r["controller"] == true)
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

/// Brings Pods and Deployment statuses in line with the Deployments once; the result is
/// stable (a second call changes nothing).
pub(crate) fn settle(store: &mut Store, start: PodStart, finalizer: Option<&str>) {
    let deployments = Resource::new("apps", "deployments");
    let pods = Resource::new("", "pods");
    let mut live_uids = BTreeSet::new();
    for key in store.keys(&deployments, None) {
        let Some(deployment) = store.stored(&key).map(|s| s.object.clone()) else {
            continue;
        };
        let uid = deployment
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        live_uids.insert(uid.clone());
        let deleting = deployment.pointer("/metadata/deletionTimestamp").is_some();
        let replicas = if deleting {
            0
        } else {
            deployment
                .pointer("/spec/replicas")
                .and_then(Value::as_u64)
                .unwrap_or(1)
        };
        let template = deployment
            .pointer("/spec/template")
            .cloned()
            .unwrap_or(json!({}));
        let hash = template_hash(&template);
        let desired: BTreeSet<String> =
            (0..replicas).map(|k| format!("{}-{k}", key.name)).collect();

        let owned: BTreeMap<Key, Value> = store
            .keys(&pods, Some(&key.namespace))
            .into_iter()
            .filter_map(|k| store.stored(&k).map(|s| (k, s.object.clone())))
            .filter(|(_, pod)| owner_uid(pod).as_deref() == Some(uid.as_str()))
            .collect();
        for (pod_key, pod) in &owned {
            let current = pod.pointer("/metadata/labels/pod-template-hash")
                == Some(&Value::from(hash.clone()));
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
            labels.extend(string_map(deployment.pointer("/spec/selector/matchLabels")));
            labels.insert("pod-template-hash".into(), Value::from(hash.clone()));
            let mut metadata = json!({
                "name": name,
                "namespace": key.namespace,
                "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
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

        update_status(store, &key, &uid, &hash, replicas);
    }

    // The garbage collector: Pods whose owning Deployment is gone.
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

fn update_status(store: &mut Store, key: &Key, uid: &str, hash: &str, desired: u64) {
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
        .filter(|p| p.pointer("/metadata/labels/pod-template-hash") == Some(&Value::from(hash)))
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
    let available = ready >= desired;
    let complete = updated == desired && ready == desired && replicas == desired;
    let mut status = json!({
        "observedGeneration": stored.object.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
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
