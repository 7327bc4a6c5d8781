//! The objects of the fake API server and the metadata the server owns: `uid`,
//! `creationTimestamp`, `generation`, `resourceVersion`, `managedFields`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::fields::Ownership;
use super::watch::{Change, Watches, labels_of};
use super::{PodChange, PodEvent};

/// A resource type as URLs name it: group (empty for the core group) and plural.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Resource {
    pub(crate) group: String,
    pub(crate) plural: String,
}

impl Resource {
    pub(crate) fn new(group: &str, plural: &str) -> Resource {
        Resource {
            group: group.to_string(),
            plural: plural.to_string(),
        }
    }

    /// `deployments.apps`, `pods`: how the API server names a resource in messages.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// One object's identity. Cluster-scoped objects have an empty namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key {
    pub(crate) resource: Resource,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) object: Value,
    pub(crate) ownership: Ownership,
    /// The object as the server answers it (with its managedFields), made once per write:
    /// a list renders nothing and copies nothing (36,000 objects in the scale benchmark).
    rendered: Arc<Value>,
}

impl Stored {
    fn new(object: Value, ownership: Ownership) -> Stored {
        let rendered = Arc::new(rendered(&object, &ownership));
        Stored {
            object,
            ownership,
            rendered,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Store {
    objects: BTreeMap<Key, Stored>,
    revision: u64,
    uids: u64,
    generated_names: u64,
    /// `apiVersion` and `kind` of each resource, learned from the objects written and seeded
    /// with the kinds Plumber uses: list responses name their kind after it.
    kinds: BTreeMap<Resource, (String, String)>,
    /// Pods added and deleted since the owner of the store last took them.
    pub(crate) pod_events: Vec<PodEvent>,
    /// The recent changes and the open watches, which every change is given to.
    pub(crate) watches: Watches,
}

const KNOWN_KINDS: &[(&str, &str, &str, &str)] = &[
    ("", "pods", "v1", "Pod"),
    ("", "configmaps", "v1", "ConfigMap"),
    ("", "secrets", "v1", "Secret"),
    ("", "services", "v1", "Service"),
    ("", "events", "v1", "Event"),
    ("", "serviceaccounts", "v1", "ServiceAccount"),
    ("", "namespaces", "v1", "Namespace"),
    ("apps", "deployments", "apps/v1", "Deployment"),
    ("apps", "replicasets", "apps/v1", "ReplicaSet"),
    ("apps", "statefulsets", "apps/v1", "StatefulSet"),
    (
        "coordination.k8s.io",
        "leases",
        "coordination.k8s.io/v1",
        "Lease",
    ),
    ("events.k8s.io", "events", "events.k8s.io/v1", "Event"),
    (
        "keda.sh",
        "scaledobjects",
        "keda.sh/v1alpha1",
        "ScaledObject",
    ),
    (
        "keda.sh",
        "triggerauthentications",
        "keda.sh/v1alpha1",
        "TriggerAuthentication",
    ),
    (
        "plumber.dev",
        "topologies",
        "plumber.dev/v1alpha1",
        "Topology",
    ),
];

/// The current time as Kubernetes writes timestamps (RFC 3339, seconds, UTC).
pub(crate) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Everything but `metadata` and `status`: what bumps `metadata.generation` when it changes.
fn generation_content(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
        map.remove("apiVersion");
        map.remove("kind");
    }
    object
}

fn without_revision(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
    }
    object
}

pub(crate) fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = Value::Object(Map::new());
    }
    let map = object
        .as_object_mut()
        .unwrap_or_else(|| unreachable!("made an object above"));
    let metadata = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !metadata.is_object() {
        *metadata = Value::Object(Map::new());
    }
    metadata
        .as_object_mut()
        .unwrap_or_else(|| unreachable!("made an object above"))
}

impl Store {
    pub(crate) fn new() -> Store {
        let mut store = Store::default();
        for (group, plural, api_version, kind) in KNOWN_KINDS {
            store.kinds.insert(
                Resource::new(group, plural),
                (api_version.to_string(), kind.to_string()),
            );
        }
        store
    }

    /// The global counter every write bumps, as a `resourceVersion`.
    pub(crate) fn revision(&self) -> String {
        self.revision.to_string()
    }

    /// A new suffix for `metadata.generateName` (the real server's are random).
    pub(crate) fn generated_name(&mut self) -> u64 {
        self.generated_names += 1;
        self.generated_names
    }

    pub(crate) fn learn_kind(&mut self, resource: &Resource, api_version: &str, kind: &str) {
        if !api_version.is_empty() && !kind.is_empty() {
            self.kinds.insert(
                resource.clone(),
                (api_version.to_string(), kind.to_string()),
            );
        }
    }

    pub(crate) fn kind(&self, resource: &Resource) -> Option<&(String, String)> {
        self.kinds.get(resource)
    }

    pub(crate) fn stored(&self, key: &Key) -> Option<&Stored> {
        self.objects.get(key)
    }

    /// An object as the API server returns it (with `managedFields`).
    pub(crate) fn get(&self, key: &Key) -> Option<Value> {
        self.objects.get(key).map(render)
    }

    /// The objects of a resource, in one namespace or (`None`) all, by namespace and name.
    pub(crate) fn list(&self, resource: &Resource, namespace: Option<&str>) -> Vec<Value> {
        self.list_shared(resource, namespace)
            .into_iter()
            .map(|object| (*object).clone())
            .collect()
    }

    /// [`Store::list`], sharing the objects as rendered instead of copying them.
    pub(crate) fn list_shared(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
    ) -> Vec<Arc<Value>> {
        self.objects
            .iter()
            .filter(|(k, _)| {
                k.resource == *resource && namespace.is_none_or(|ns| k.namespace == ns)
            })
            .map(|(_, stored)| stored.rendered.clone())
            .collect()
    }

    pub(crate) fn keys(&self, resource: &Resource, namespace: Option<&str>) -> Vec<Key> {
        self.objects
            .keys()
            .filter(|k| k.resource == *resource && namespace.is_none_or(|ns| k.namespace == ns))
            .cloned()
            .collect()
    }

    pub(crate) fn all_keys(&self) -> Vec<Key> {
        self.objects.keys().cloned().collect()
    }

    /// Writes `object` at `key`: keeps `uid` and `creationTimestamp`, bumps `generation`
    /// when anything but metadata and status changed, and `resourceVersion` when anything
    /// changed at all (a write that changes nothing is no write, as in the API server). An
    /// object marked for deletion whose last finalizer is gone is deleted. Returns the object
    /// as stored (or as it was when deleted).
    pub(crate) fn commit(&mut self, key: &Key, mut object: Value, ownership: Ownership) -> Value {
        let now = now();
        {
            let metadata = metadata_mut(&mut object);
            metadata.remove("managedFields");
            metadata.insert("name".into(), Value::from(key.name.clone()));
            if key.namespace.is_empty() {
                metadata.remove("namespace");
            } else {
                metadata.insert("namespace".into(), Value::from(key.namespace.clone()));
            }
        }
        if let (Some(api_version), Some(kind)) = (
            object.get("apiVersion").and_then(Value::as_str),
            object.get("kind").and_then(Value::as_str),
        ) {
            let (api_version, kind) = (api_version.to_string(), kind.to_string());
            self.learn_kind(&key.resource, &api_version, &kind);
        }
        let old = self.objects.get(key);
        match old {
            Some(old) => {
                let old_meta = old.object.get("metadata").cloned().unwrap_or(json!({}));
                let old_generation = old_meta
                    .get("generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                let bump = generation_content(&old.object) != generation_content(&object);
                let metadata = metadata_mut(&mut object);
                for field in ["uid", "creationTimestamp", "deletionTimestamp"] {
                    match old_meta.get(field) {
                        Some(v) => metadata.insert(field.into(), v.clone()),
                        None => metadata.remove(field),
                    };
                }
                metadata.insert(
                    "generation".into(),
                    Value::from(old_generation + i64::from(bump)),
                );
                metadata.insert(
                    "resourceVersion".into(),
                    old_meta
                        .get("resourceVersion")
                        .cloned()
                        .unwrap_or(Value::Null),
                );
                if without_revision(&old.object) == without_revision(&object) {
                    let stored = self.objects.get_mut(key).unwrap_or_else(|| unreachable!());
                    *stored = Stored::new(stored.object.clone(), ownership);
                    return render(stored);
                }
            }
            None => {
                self.uids += 1;
                let uid = format!("00000000-0000-4000-8000-{:012x}", self.uids);
                let metadata = metadata_mut(&mut object);
                metadata.insert("uid".into(), Value::from(uid));
                metadata.insert("creationTimestamp".into(), Value::from(now));
                metadata.insert("generation".into(), Value::from(1));
                metadata.remove("deletionTimestamp");
            }
        }
        self.revision += 1;
        let revision = self.revision.to_string();
        metadata_mut(&mut object).insert("resourceVersion".into(), Value::from(revision));
        let before = self.objects.get(key).map(|s| labels_of(&s.object));
        let stored = Stored::new(object, ownership);
        let deleting = stored
            .object
            .pointer("/metadata/deletionTimestamp")
            .is_some();
        let finalized = stored
            .object
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        let out = render(&stored);
        self.watches
            .record(Change::new(self.revision, key, before, out.clone(), false));
        if deleting && finalized {
            self.objects.insert(key.clone(), stored);
            self.remove(key);
            return out;
        }
        let added = self.objects.insert(key.clone(), stored).is_none();
        if added && key.resource == Resource::new("", "pods") {
            self.pod_events.push(PodEvent {
                change: PodChange::Added,
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                pod: out.clone(),
            });
        }
        out
    }

    /// Deletes an object now, finalizers or not.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Value> {
        let stored = self.objects.remove(key)?;
        self.revision += 1;
        let out = render(&stored);
        let mut last = out.clone();
        metadata_mut(&mut last).insert(
            "resourceVersion".into(),
            Value::from(self.revision.to_string()),
        );
        self.watches.record(Change::new(
            self.revision,
            key,
            Some(labels_of(&stored.object)),
            last,
            true,
        ));
        if key.resource == Resource::new("", "pods") {
            self.pod_events.push(PodEvent {
                change: PodChange::Deleted,
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                pod: out.clone(),
            });
        }
        Some(out)
    }

    /// Marks an object for deletion (`deletionTimestamp`), as the API server does with an
    /// object that has finalizers.
    pub(crate) fn mark_deleted(&mut self, key: &Key) -> Option<Value> {
        let stored = self.objects.get(key)?;
        if stored
            .object
            .pointer("/metadata/deletionTimestamp")
            .is_some()
        {
            return Some(render(stored));
        }
        let mut object = stored.object.clone();
        let ownership = stored.ownership.clone();
        let before = labels_of(&stored.object);
        self.revision += 1;
        let metadata = metadata_mut(&mut object);
        metadata.insert("deletionTimestamp".into(), Value::from(now()));
        metadata.insert(
            "resourceVersion".into(),
            Value::from(self.revision.to_string()),
        );
        let stored = Stored::new(object, ownership);
        let out = render(&stored);
        self.objects.insert(key.clone(), stored);
        self.watches.record(Change::new(
            self.revision,
            key,
            Some(before),
            out.clone(),
            false,
        ));
        if key.resource == Resource::new("", "pods") {
            self.pod_events.push(PodEvent {
                change: PodChange::Terminating,
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                pod: out.clone(),
            });
        }
        Some(out)
    }
}

fn render(stored: &Stored) -> Value {
    (*stored.rendered).clone()
}

fn rendered(object: &Value, ownership: &Ownership) -> Value {
    let mut object = object.clone();
    let managed = ownership.render();
    if managed.as_array().is_some_and(|a| !a.is_empty()) {
        metadata_mut(&mut object).insert("managedFields".into(), managed);
    }
    object
}
