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

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// The objects of one kind, by name.
pub struct Cache<K> {
    objects: Arc<RwLock<BTreeMap<String, Arc<K>>>>,
    ready: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
    kind: String,
    /// What is dropped of each object before it is kept.
    trim: fn(K) -> K,
}

impl<K> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// Starts watching the objects of `api` that `labels` selects, on the runtime of
    /// `handle`.
    pub fn start(api: Api<K>, labels: &str, handle: &tokio::runtime::Handle) -> Self {
        Self::start_trimmed(api, labels, handle, |object| object)
    }

    /// As [`Cache::start`], keeping of each object only what `trim` leaves (of a Pod, what
    /// the runtime reads of it: most of a Pod is its spec).
    pub fn start_trimmed(
        api: Api<K>,
        labels: &str,
        handle: &tokio::runtime::Handle,
        trim: fn(K) -> K,
    ) -> Self {
        let objects: Arc<RwLock<BTreeMap<String, Arc<K>>>> = Arc::default();
        let (ready_tx, ready) = watch::channel(false);
        let kind = K::kind(&Default::default()).into_owned();
        let config = watcher::Config::default().labels(labels);
        let task = handle.spawn({
            let objects = objects.clone();
            let kind = kind.clone();
            async move {
                let mut events = watcher(api, config).default_backoff().boxed();
                let mut listing: Option<BTreeMap<String, Arc<K>>> = None;
                while let Some(event) = events.next().await {
                    match event {
                        Ok(Event::Init) => listing = Some(BTreeMap::new()),
                        Ok(Event::InitApply(object)) => {
                            if let (Some(listing), Some(name)) = (&mut listing, name_of(&object)) {
                                listing.insert(name, Arc::new(trim(slim(object))));
                            }
                        }
                        Ok(Event::InitDone) => {
                            let listed = listing.take().unwrap_or_default();
                            tracing::debug!(kind, objects = listed.len(), "watch listed");
                            *write(&objects) = listed;
                            ready_tx.send_replace(true);
                        }
                        Ok(Event::Apply(object)) => {
                            if let Some(name) = name_of(&object) {
                                write(&objects).insert(name, Arc::new(trim(slim(object))));
                            }
                        }
                        Ok(Event::Delete(object)) => {
                            if let Some(name) = name_of(&object) {
                                write(&objects).remove(&name);
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
            trim,
        }
    }

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

    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        read(&self.objects).get(name).cloned()
    }

    pub fn contains(&self, name: &str) -> bool {
        read(&self.objects).contains_key(name)
    }

    /// Every object, by name.
    pub fn all(&self) -> BTreeMap<String, Arc<K>> {
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

    /// An object as a write of this process answered it.
    pub fn written(&self, object: K) {
        if let Some(name) = name_of(&object) {
            write(&self.objects).insert(name, Arc::new((self.trim)(slim(object))));
        }
    }

    /// An object this process deleted.
    pub fn deleted(&self, name: &str) {
        write(&self.objects).remove(name);
    }
}

impl<K> Drop for Cache<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Without its managed fields: they are most of an applied object's bytes, and nothing
/// here reads them (kube's reflector docs advise the same).
fn slim<K: Resource>(mut object: K) -> K {
    object.meta_mut().managed_fields = None;
    object
}

fn name_of<K: Resource>(object: &K) -> Option<String> {
    object.meta().name.clone()
}

fn read<K>(
    objects: &RwLock<BTreeMap<String, Arc<K>>>,
) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<K>>> {
    objects.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<K>(
    objects: &RwLock<BTreeMap<String, Arc<K>>>,
) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<K>>> {
    objects.write().unwrap_or_else(PoisonError::into_inner)
}
