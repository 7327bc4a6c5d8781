//! What the cluster holds of one kind of Plumber's objects, kept current by a watch (kube's
//! [`watcher()`]): the runtime's looks (repair, status) read memory, and the API server sends
//! only changes, instead of every StatefulSet, ScaledObject and TriggerAuthentication every
//! few seconds (`bench/results/kube.md`: 197 MB per look at 1,000 topologies).
//!
//! kube's own `reflector::Store` is written by its watch alone; this one is also written
//! through by the runtime with the objects its own applies and deletes answered, so a look
//! right after a start does not take a processor's fresh objects for missing. A watch event
//! that comes later (its own, or an older one) replaces what was written through.
//!
//! A watch that fails is retried with kube's default backoff, the cache serving what it
//! last knew meanwhile; after a restart of the watch the list it begins with replaces the
//! cache whole (objects deleted meanwhile go).
//!
//! Each object is [`Kept`] compact: its metadata typed (what every look reads), its spec and
//! status as JSON text, decoded only when asked. A typed StatefulSet of a processor holds
//! about 16 KB of heap, its JSON 3 KB: at 20,000 processors the typed objects were most of
//! the daemon's heap (`bench/results/kube.md`).
//!
//! The caches of the objects there are one or two of per processor (StatefulSets,
//! ScaledObjects) keep no spec, and the annotation the runtime writes for itself and reads
//! back only when it connects (the processor each runs, 1.3 KB) as its SHA-256 alone
//! ([`Cache::start_without_spec`]): what the looks read is metadata and status; an object
//! whose `resourceVersion` moved is read from the API server to be compared, and the first
//! list's annotations are handed over once ([`Cache::take_listed`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// An object of kind `K` as a [`Cache`] keeps it: its metadata typed, its `spec` and
/// `status` as the JSON text the API server sent (checked, not built into typed values). The
/// watch decodes into this directly, so neither the typed object nor a [`Value`] is ever made
/// of what nothing reads.
#[derive(Serialize, Deserialize, Debug)]
#[serde(bound = "")]
pub struct Kept<K> {
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<Box<RawValue>>,
    #[serde(skip)]
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Kept<K> {
    fn clone(&self) -> Self {
        Kept {
            metadata: self.metadata.clone(),
            spec: self.spec.clone(),
            status: self.status.clone(),
            kind: PhantomData,
        }
    }
}

/// The API resource of `K`: a [`Kept<K>`] is requested and watched as a `K`.
impl<K: Resource> Resource for Kept<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<K> Kept<K> {
    pub fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    /// The `status` alone, decoded as `T` (e.g. a StatefulSet's replica counts).
    pub fn status<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_str(self.status.as_ref()?.get()).ok()
    }

    /// Replaces the `status` (what a trim keeps of it).
    pub fn set_status(&mut self, status: Option<&impl Serialize>) {
        self.status = status.and_then(|s| serde_json::value::to_raw_value(s).ok());
    }

    /// Drops the `spec`.
    pub fn drop_spec(&mut self) {
        self.spec = None;
    }
}

impl<K: Resource> Kept<K>
where
    K::DynamicType: Default,
{
    /// The whole object as JSON, as the typed object serializes.
    pub fn json(&self) -> Option<Value> {
        let dt = K::DynamicType::default();
        let mut object = serde_json::Map::new();
        object.insert("apiVersion".into(), K::api_version(&dt).into());
        object.insert("kind".into(), K::kind(&dt).into());
        object.insert(
            "metadata".into(),
            serde_json::to_value(&self.metadata).ok()?,
        );
        for (field, raw) in [("spec", &self.spec), ("status", &self.status)] {
            if let Some(raw) = raw {
                object.insert(field.into(), serde_json::from_str(raw.get()).ok()?);
            }
        }
        Some(Value::Object(object))
    }

    /// The typed object.
    pub fn object(&self) -> Option<K>
    where
        K: DeserializeOwned,
    {
        serde_json::from_value(self.json()?).ok()
    }
}

impl<K: Serialize> Kept<K> {
    /// `None` for an object that does not serialize as a Kubernetes object does.
    fn of(object: &K) -> Option<Kept<K>> {
        serde_json::from_str(&serde_json::to_string(object).ok()?).ok()
    }

    /// What a cache would keep of `object` (without its managed fields), for whoever keeps
    /// one apart from a cache.
    pub fn of_object(object: K) -> Option<Arc<Kept<K>>> {
        Some(Arc::new(slim(Kept::of(&object)?)))
    }
}

/// The objects of one kind, by name.
pub struct Cache<K> {
    objects: Arc<RwLock<Objects<K>>>,
    ready: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
    kind: String,
    keeping: Keeping<K>,
    /// The digested annotation's values in the first list, by object name, until taken.
    listed: Arc<Mutex<Option<BTreeMap<String, String>>>>,
}

/// What a cache drops or condenses of each object before it keeps it.
struct Keeping<K> {
    trim: fn(Kept<K>) -> Kept<K>,
    /// The annotation kept as its digest ([`annotation_digest`]).
    digested: Option<&'static str>,
}

impl<K> Clone for Keeping<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Keeping<K> {}

/// What a digesting cache keeps of an annotation's value.
fn annotation_digest(value: &str) -> String {
    format!("sha256:{:x}", Sha256::digest(value.as_bytes()))
}

impl<K> Cache<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// Starts watching the objects of `api` that `labels` selects, on the runtime of
    /// `handle`.
    pub fn start(api: Api<Kept<K>>, labels: &str, handle: &tokio::runtime::Handle) -> Self {
        Self::start_trimmed(api, labels, handle, |object| object)
    }

    /// As [`Cache::start`], keeping of each object only what `trim` leaves (of a Pod, what
    /// the runtime reads of it: most of a Pod is its spec).
    pub fn start_trimmed(
        api: Api<Kept<K>>,
        labels: &str,
        handle: &tokio::runtime::Handle,
        trim: fn(Kept<K>) -> Kept<K>,
    ) -> Self {
        let keeping = Keeping {
            trim,
            digested: None,
        };
        Self::start_keeping(api, labels, handle, keeping)
    }

    /// As [`Cache::start`], keeping no spec, and annotation `annotation` of each object as
    /// its SHA-256; the first list's values are kept for [`Cache::take_listed`].
    pub fn start_without_spec(
        api: Api<Kept<K>>,
        labels: &str,
        handle: &tokio::runtime::Handle,
        annotation: &'static str,
    ) -> Self {
        let keeping = Keeping {
            trim: |mut object| {
                object.drop_spec();
                object
            },
            digested: Some(annotation),
        };
        Self::start_keeping(api, labels, handle, keeping)
    }

    fn start_keeping(
        api: Api<Kept<K>>,
        labels: &str,
        handle: &tokio::runtime::Handle,
        keeping: Keeping<K>,
    ) -> Self {
        let objects: Arc<RwLock<Objects<K>>> = Arc::default();
        let listed: Arc<Mutex<Option<BTreeMap<String, String>>>> = Arc::default();
        let (ready_tx, ready) = watch::channel(false);
        let kind = K::kind(&Default::default()).into_owned();
        let config = watcher::Config::default().labels(labels);
        let task = handle.spawn({
            let objects = objects.clone();
            let kind = kind.clone();
            let listed = listed.clone();
            async move {
                let mut events = watcher(api, config).default_backoff().boxed();
                let mut listing: Option<Objects<K>> = None;
                // The digested annotation's values until the first list is done.
                let mut first: Option<BTreeMap<String, String>> =
                    keeping.digested.map(|_| BTreeMap::new());
                while let Some(event) = events.next().await {
                    match event {
                        Ok(Event::Init) => listing = Some(BTreeMap::new()),
                        Ok(Event::InitApply(object)) => {
                            if let (Some(first), Some(annotation), Some(name)) =
                                (&mut first, keeping.digested, &object.metadata.name)
                                && let Some(value) = object
                                    .metadata
                                    .annotations
                                    .as_ref()
                                    .and_then(|a| a.get(annotation))
                            {
                                first.insert(name.clone(), value.clone());
                            }
                            if let (Some(listing), Some((name, kept))) =
                                (&mut listing, keep(object, keeping))
                            {
                                listing.insert(name, kept);
                            }
                        }
                        Ok(Event::InitDone) => {
                            let done = listing.take().unwrap_or_default();
                            tracing::debug!(kind, objects = done.len(), "watch listed");
                            if let Some(first) = first.take() {
                                *listed.lock().unwrap_or_else(PoisonError::into_inner) =
                                    Some(first);
                            }
                            *write(&objects) = done;
                            ready_tx.send_replace(true);
                        }
                        Ok(Event::Apply(object)) => {
                            if let Some((name, kept)) = keep(object, keeping) {
                                write(&objects).insert(name, kept);
                            }
                        }
                        Ok(Event::Delete(object)) => {
                            if let Some(name) = &object.meta().name {
                                write(&objects).remove(name);
                            }
                        }
                        Err(error) => {
                            tracing::warn!(kind, %error, "the watch failed; watching again after a backoff, from what is cached")
                        }
                    }
                }
            }
        });
        Cache {
            objects,
            ready,
            task,
            kind,
            keeping,
            listed,
        }
    }
}

impl<K> Cache<K> {
    /// Waits until the first list arrived, `timeout` at most; whether it did.
    pub fn wait_ready(&self, handle: &tokio::runtime::Handle, timeout: Duration) -> bool {
        let mut ready = self.ready.clone();
        // The timer is made inside: it needs the runtime's context.
        handle.block_on(async move {
            tokio::time::timeout(timeout, ready.wait_for(|r| *r))
                .await
                .is_ok_and(|r| r.is_ok())
        })
    }

    /// Whether the watch has listed the objects once.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    pub fn kind(&self) -> &str {
        &self.kind
    }

    pub fn get(&self, name: &str) -> Option<Arc<Kept<K>>> {
        read(&self.objects).get(name).cloned()
    }

    pub fn contains(&self, name: &str) -> bool {
        read(&self.objects).contains_key(name)
    }

    /// Every object, by name.
    pub fn all(&self) -> Objects<K> {
        read(&self.objects).clone()
    }

    /// The names of the objects not in `keep`.
    pub fn names_outside(&self, keep: &std::collections::BTreeSet<String>) -> Vec<String> {
        read(&self.objects)
            .keys()
            .filter(|name| !keep.contains(*name))
            .cloned()
            .collect()
    }

    /// An object this process deleted.
    pub fn deleted(&self, name: &str) {
        write(&self.objects).remove(name);
    }

    /// The digested annotation's full values in the watch's first list, by object name,
    /// once (empty after, and for a cache that digests nothing).
    pub fn take_listed(&self) -> BTreeMap<String, String> {
        self.listed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_default()
    }
}

impl<K> Cache<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    /// An object as a write of this process answered it; what the cache keeps of it.
    pub fn written(&self, object: K) -> Option<Arc<Kept<K>>> {
        let (name, kept) = Kept::of(&object).and_then(|kept| keep(kept, self.keeping))?;
        write(&self.objects).insert(name, kept.clone());
        Some(kept)
    }
}

impl<K> Drop for Cache<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Without its managed fields: they are most of an applied object's bytes, and nothing
/// here reads them (kube's reflector docs advise the same).
fn slim<K>(mut object: Kept<K>) -> Kept<K> {
    object.metadata.managed_fields = None;
    object
}

/// What the cache keeps of `object`, under its name.
fn keep<K>(object: Kept<K>, keeping: Keeping<K>) -> Option<(String, Arc<Kept<K>>)> {
    let name = object.metadata.name.clone()?;
    let mut object = (keeping.trim)(slim(object));
    if let Some(annotation) = keeping.digested
        && let Some(value) = object
            .metadata
            .annotations
            .as_mut()
            .and_then(|a| a.get_mut(annotation))
    {
        *value = annotation_digest(value);
    }
    Some((name, Arc::new(object)))
}

/// A cache's objects, by name.
pub type Objects<K> = BTreeMap<String, Arc<Kept<K>>>;

fn read<K>(objects: &RwLock<Objects<K>>) -> std::sync::RwLockReadGuard<'_, Objects<K>> {
    objects.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<K>(objects: &RwLock<Objects<K>>) -> std::sync::RwLockWriteGuard<'_, Objects<K>> {
    objects.write().unwrap_or_else(PoisonError::into_inner)
}
