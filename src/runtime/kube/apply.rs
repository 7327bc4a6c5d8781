//! The Kubernetes [`Runtime`]: processors as the objects [`render`] makes,
//! applied with server-side apply (field manager `plumber`).
//!
//! # Guarantees
//! - **Start** applies the TriggerAuthentication, the StatefulSet, then the ScaledObject:
//!   KEDA never scales a StatefulSet that does not exist, nor one it cannot authenticate for.
//! - **Stop** deletes the ScaledObject first (else KEDA scales the StatefulSet back up), then
//!   the StatefulSet (foreground), and returns only once no pod of it is left (pods found by
//!   the group's name when the StatefulSet is gone already), so its processes have exited. The
//!   engine then waits until the group has no members where the broker can say (SPEC §4.2;
//!   tansu 0.6 cannot, and there this wait is all that protects the cutover offsets).
//! - **Drift**: [`Runtime::repair`] puts back every object of a processor this runtime runs
//!   that was deleted, or edited by hand so that it no longer holds what was applied
//!   ([`drift::holds`]: fields of other managers, KEDA's `replicas` among them, are no
//!   drift), and deletes Plumber's objects of identities it does not run. It reads watch-fed
//!   [`Cache`]s, not lists: an idle look sends no request, and an object is read from the
//!   API server and compared again only once its `resourceVersion` moved from the one it
//!   was last found right at (the caches keep no spec of StatefulSets and ScaledObjects).
//! - **Restarts of the daemon**: what runs is read back from the StatefulSets' annotation
//!   ([`SPEC_ANNOTATION`], also on each ScaledObject, for a StatefulSet deleted meanwhile),
//!   so a new daemon replica knows every processor without a record of its own; and listed
//!   again at the first change in each lease term ([`KubeRuntime::fenced_by`]), so a
//!   replica that takes the lease (over, or back) repairs what the previous holder left
//!   running, not what ran when it last looked.
//! - **Fencing**: a change (start, stop, restart, update, repair) begins in a lease term, and
//!   each of its writes is refused once that term has ended, even if the replica holds the
//!   lease again by then.
//! - **Metrics**: every running Pod of a processor serves `/metrics` at its Pod IP on
//!   [`METRICS_PORT`](render::METRICS_PORT) ([`Runtime::metrics_endpoints`]), from a watch
//!   of Plumber's Pods that keeps only their labels, uid, phase and IP.
//!
//! # Caveats
//! A processor whose StatefulSet *and* ScaledObject were deleted by hand while no daemon ran
//! is not recreated by the next one (both carry its annotation; one is enough); the engine's
//! record still lists the life, and status shows it without instances. The caches hold
//! every object of Plumber's, compact ([`Kept`]: metadata typed, status as JSON text, no
//! spec of the per-processor objects): about 0.15 MB of heap per topology of 20 steps
//! (`bench/results/kube.md`).
//!
//! Calls block the calling thread (the engine's, the observer's) on the tokio runtime the
//! client lives on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::cache::{Cache, Kept};
use super::crd::Topology;
use super::drift;
use super::keda::{ScaledObject, TriggerAuthentication};
use super::render::{
    self, IDENTITY, LIFE, MANAGED_BY, Objects, RenderConfig, SPEC_ANNOTATION, STEP, TOPOLOGY,
};
use crate::runtime::{
    Error, MetricsEndpoint, ProcessorSpec, ProcessorStatus, Result, Runtime, Term,
};
use crate::spec::{Resources, Scale};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The field manager of every apply (SPEC §7).
pub const FIELD_MANAGER: &str = "plumber";

#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// Where and how processors are rendered (`render.namespace`: the processors' namespace).
    pub render: RenderConfig,
    /// The namespace of the Topologies, when the processors run in a namespace of their own
    /// (`None`: the processors' own). Their objects then have no owner (an owner in another
    /// namespace is none to the garbage collector): repair deletes what no Topology runs.
    pub topologies_namespace: Option<String>,
    /// How long a stop waits for the pods to go (their grace period is 30 s).
    pub stop_timeout: Duration,
    /// How often a stop looks at the pods.
    pub poll: Duration,
    /// How long connecting waits for the watches' first lists.
    pub watch_timeout: Duration,
}

impl KubeConfig {
    pub fn new(render: RenderConfig) -> Self {
        KubeConfig {
            render,
            topologies_namespace: None,
            stop_timeout: Duration::from_secs(60),
            poll: Duration::from_millis(500),
            watch_timeout: Duration::from_secs(60),
        }
    }
}

pub struct KubeRuntime {
    client: Client,
    config: KubeConfig,
    /// The tokio runtime the client lives on (its connection tasks run there).
    handle: tokio::runtime::Handle,
    /// What this runtime runs, by group: what repair puts back.
    running: Mutex<BTreeMap<String, ProcessorSpec>>,
    /// The `resourceVersion` at which each object of a running processor (`Kind/name`) last
    /// held what it should, with the uid of the owner it was rendered with ([`stamp`]):
    /// repair compares an object again only once either moved.
    verified: Mutex<BTreeMap<String, String>>,
    /// Held while objects are applied or deleted, so a repair never puts back what a stop
    /// is deleting ([`KubeRuntime::changing`]); inside, the lease term in which this
    /// runtime last read what runs.
    changing: Mutex<Option<u64>>,
    /// The owner reference of each Topology read by name, for those the watch did not
    /// bring yet (the store creates a Topology just before its first processor starts).
    owners: Mutex<BTreeMap<String, OwnerReference>>,
    /// The processors' StatefulSets, by [`render::workload_name`].
    workloads: Cache<StatefulSet>,
    scaled_objects: Cache<ScaledObject>,
    authentications: Cache<TriggerAuthentication>,
    topologies: Arc<Cache<Topology>>,
    /// Only where the processors' `/metrics` are ([`trim_pod`]).
    pods: Cache<Pod>,
    /// Asked when a change begins and immediately before each of its writes
    /// ([`KubeRuntime::fenced_by`]).
    fence: Option<Arc<Term>>,
}

/// One change of the runtime's objects (a start, stop, restart, update or repair): holds
/// [`KubeRuntime::changing`], and the lease term it began in; each write of it checks that
/// this term still holds.
struct Changing<'a> {
    _lock: MutexGuard<'a, Option<u64>>,
    term: Option<u64>,
}

/// The term of a runtime no lease fences: one that never ends.
const UNFENCED: Option<u64> = Some(0);

/// The label selector of every object Plumber manages.
fn managed() -> String {
    format!("{MANAGED_BY}=plumber")
}

impl KubeRuntime {
    /// A runtime on `client`, whose tasks run on the tokio runtime of `handle` (a
    /// multi-threaded one: calls block this thread while its workers drive the connection),
    /// knowing what runs from the StatefulSets it finds, once its watches listed what is
    /// there.
    pub fn connect(
        client: Client,
        handle: tokio::runtime::Handle,
        config: KubeConfig,
    ) -> Result<KubeRuntime> {
        let namespace = config.render.namespace.clone();
        let labels = managed();
        let runtime = KubeRuntime {
            workloads: Cache::start_without_spec(
                Api::namespaced(client.clone(), &namespace),
                &labels,
                &handle,
                SPEC_ANNOTATION,
            ),
            scaled_objects: Cache::start_without_spec(
                Api::namespaced(client.clone(), &namespace),
                &labels,
                &handle,
                SPEC_ANNOTATION,
            ),
            authentications: Cache::start(
                Api::namespaced(client.clone(), &namespace),
                &labels,
                &handle,
            ),
            topologies: Arc::new(Cache::start(
                Api::namespaced(
                    client.clone(),
                    config.topologies_namespace.as_deref().unwrap_or(&namespace),
                ),
                &labels,
                &handle,
            )),
            pods: Cache::start_trimmed(
                Api::namespaced(client.clone(), &namespace),
                &labels,
                &handle,
                trim_pod,
            ),
            client,
            config,
            handle,
            running: Mutex::new(BTreeMap::new()),
            verified: Mutex::new(BTreeMap::new()),
            changing: Mutex::new(UNFENCED),
            owners: Mutex::new(BTreeMap::new()),
            fence: None,
        };
        runtime.wait_listed(&runtime.workloads)?;
        runtime.wait_listed(&runtime.scaled_objects)?;
        runtime.wait_listed(&runtime.authentications)?;
        runtime.wait_listed(&runtime.topologies)?;
        runtime.wait_listed(&runtime.pods)?;
        // What the watches just listed is as fresh as a list: no second one. The caches keep
        // the annotations' digests; the first list's values are handed over once.
        {
            let _changing = runtime.changing()?;
            let workloads = runtime.workloads.take_listed();
            let scaled_objects = runtime.scaled_objects.take_listed();
            runtime.adopt(
                workloads.iter().map(|(n, a)| (n.as_str(), a.as_str())),
                scaled_objects.iter().map(|(n, a)| (n.as_str(), a.as_str())),
            );
        }
        Ok(runtime)
    }

    /// Writes only within one term of the lease (`term`, the lease's [`Term`]), asked
    /// immediately before each write: a change begun in a term writes nothing once that
    /// term has ended, even if this replica holds the lease again by then (another replica
    /// may have acted in between). The first change of a new term reads what runs first
    /// (see `changing`).
    pub fn fenced_by(mut self, term: Arc<Term>) -> Self {
        self.fence = Some(term);
        *self
            .changing
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self
    }

    fn term(&self) -> Option<u64> {
        self.fence.as_ref().map_or(UNFENCED, |term| term())
    }

    /// `Err` when `change`'s term has ended: this replica may no longer write `object` (a
    /// group's name or that of one of its objects) for it.
    fn fenced(&self, change: &Changing<'_>, operation: &'static str, object: &str) -> Result<()> {
        if change.term.is_some() && self.term() == change.term {
            return Ok(());
        }
        tracing::warn!(
            operation,
            object,
            "not written: this replica no longer holds the lease term this change began in"
        );
        Err(Error::Backend {
            operation,
            group: object.to_owned(),
            message: "this replica no longer holds the lease term this change began in: it \
                      writes nothing"
                .into(),
            retryable: true,
        })
    }

    /// Forgets what this runtime believes runs and lists it again (under `changing`, which
    /// the caller holds: a start or stop is wholly before or after it), comparing what it
    /// lists so that the next repair reads only what moved since.
    fn read_what_runs(&self) -> Result<()> {
        // Listed, not read from the cache: the replica that held the lease before may have
        // applied a moment ago, and what runs decides what repair deletes.
        let workloads = self.list::<Kept<StatefulSet>>()?;
        let scaled_objects = self.list::<Kept<ScaledObject>>()?;
        self.adopt(
            workloads.iter().filter_map(|w| annotation_of(w.meta())),
            scaled_objects
                .iter()
                .filter_map(|s| annotation_of(s.meta())),
        );
        // Compared now, from the lists: the next repair reads only what moved since.
        let (workloads, scaled_objects) = (named(workloads), named(scaled_objects));
        let specs: Vec<ProcessorSpec> = self.running().values().cloned().collect();
        let mut drift = Vec::new();
        for spec in &specs {
            let Ok(objects) = self.objects_owned_by(spec, self.known_owner(&spec.topology)) else {
                continue;
            };
            let name = render::workload_name(&spec.group);
            if let Some(live) = workloads.get(&name) {
                self.check(&self.workloads, &name, live, &objects.workload, &mut drift);
            }
            if let Some(live) = scaled_objects.get(&spec.group) {
                let applied = &objects.scaled_object;
                self.check(&self.scaled_objects, &spec.group, live, applied, &mut drift);
            }
        }
        Ok(())
    }

    /// Takes what runs from the annotations of Plumber's StatefulSets and, for a processor
    /// whose StatefulSet was deleted by hand while no daemon ran, of its ScaledObject (repair
    /// then puts the StatefulSet back). Everything is compared again at the next repair.
    ///
    /// Each object comes as its name and its annotation.
    fn adopt<'a>(
        &self,
        workloads: impl Iterator<Item = (&'a str, &'a str)>,
        scaled_objects: impl Iterator<Item = (&'a str, &'a str)>,
    ) {
        let mut found: BTreeMap<String, ProcessorSpec> = workloads
            .filter_map(spec_of)
            .map(|spec| (spec.group.clone(), spec))
            .collect();
        for spec in scaled_objects.filter_map(spec_of) {
            if !found.contains_key(&spec.group) {
                tracing::info!(group = %spec.group, "a processor without its StatefulSet: known by its ScaledObject");
                found.insert(spec.group.clone(), spec);
            }
        }
        *self.running() = found;
        self.verified().clear();
    }

    fn wait_listed<K>(&self, cache: &Cache<K>) -> Result<()>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Default,
    {
        if cache.wait_ready(&self.handle, self.config.watch_timeout) {
            return Ok(());
        }
        Err(backend(
            "watch",
            "-",
            format!(
                "the watch of the {} objects did not list them within {} s (is the API server reachable, and may the daemon's ServiceAccount list and watch them?)",
                cache.kind(),
                self.config.watch_timeout.as_secs()
            ),
            true,
        ))
    }

    /// The watch-fed cache of the Topologies, for the store of their records to share.
    pub fn topology_cache(&self) -> Arc<Cache<Topology>> {
        self.topologies.clone()
    }

    fn verified(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.verified.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn running(&self) -> MutexGuard<'_, BTreeMap<String, ProcessorSpec>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Begins a change. In a lease term this runtime has not read what runs in yet, it
    /// reads it first: another replica may have started and stopped processors since, and
    /// no write (a repair least of all) may act on what this one knew before.
    fn changing(&self) -> Result<Changing<'_>> {
        let mut lock = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let term = self.term();
        if term.is_some() && *lock != term {
            self.read_what_runs()?;
            *lock = term;
        }
        Ok(Changing { _lock: lock, term })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.config.render.namespace)
    }

    /// Plumber's objects of kind `K` as the API lists them now, for when a cache's view may
    /// be behind.
    fn list<K>(&self) -> Result<Vec<K>>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api();
        let list = self
            .handle
            .block_on(api.list(&ListParams::default().labels(&managed())))
            .map_err(|e| api_error("list the objects of", "-", e))?;
        Ok(list.items)
    }

    /// The owner reference to the processor's Topology, when it exists: deleting the
    /// Topology deletes its processors' objects with it.
    fn owner(&self, topology: &str) -> Result<Option<OwnerReference>> {
        if self.processors_apart() {
            return Ok(None);
        }
        if let Some(owner) = self.known_owner(topology) {
            return Ok(Some(owner));
        }
        let api: Api<Topology> = self.api();
        let found = self
            .handle
            .block_on(api.get_opt(topology))
            .map_err(|e| api_error("read the Topology of", topology, e))?;
        let owner = found.as_ref().and_then(|t| owner_of(&t.metadata));
        if let Some(owner) = &owner {
            self.owners().insert(topology.to_owned(), owner.clone());
        }
        Ok(owner)
    }

    /// Whether processors run in a namespace other than the Topologies'.
    fn processors_apart(&self) -> bool {
        self.config
            .topologies_namespace
            .as_ref()
            .is_some_and(|ns| *ns != self.config.render.namespace)
    }

    /// The owner reference as the watch (or an earlier read) knows it, asking nothing.
    fn known_owner(&self, topology: &str) -> Option<OwnerReference> {
        if self.processors_apart() {
            return None;
        }
        self.topologies
            .get(topology)
            .and_then(|t| owner_of(t.meta()))
            .or_else(|| self.owners().get(topology).cloned())
    }

    fn owners(&self) -> MutexGuard<'_, BTreeMap<String, OwnerReference>> {
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn objects(&self, spec: &ProcessorSpec) -> Result<Objects> {
        self.objects_owned_by(spec, self.owner(&spec.topology)?)
    }

    fn objects_owned_by(
        &self,
        spec: &ProcessorSpec,
        owner: Option<OwnerReference>,
    ) -> Result<Objects> {
        let config = RenderConfig {
            owner,
            ..self.config.render.clone()
        };
        render::processor(spec, &config).map_err(|e| Error::Start {
            group: spec.group.clone(),
            message: e.to_string(),
            retryable: false,
        })
    }

    /// Applies the objects of `spec` in the order that keeps KEDA from acting on a
    /// StatefulSet it cannot see or reach.
    fn apply(&self, change: &Changing<'_>, spec: &ProcessorSpec) -> Result<()> {
        self.apply_objects(change, spec, &self.objects(spec)?)
    }

    fn apply_objects(
        &self,
        change: &Changing<'_>,
        spec: &ProcessorSpec,
        objects: &Objects,
    ) -> Result<()> {
        if let Some(authentication) = &objects.trigger_authentication {
            // Shared: applied once, and again only when it is not as it should be.
            let name = shared_name(authentication);
            if !at_verified(&self.authentications, name, None, &self.verified()) {
                let mut drift = Vec::new();
                self.compare(&self.authentications, name, authentication, &mut drift)?;
                if !drift.is_empty() {
                    self.apply_one(change, &self.authentications, name, authentication)?;
                }
            }
        }
        self.apply_one(
            change,
            &self.workloads,
            &render::workload_name(&spec.group),
            &objects.workload,
        )?;
        self.apply_one(
            change,
            &self.scaled_objects,
            &spec.group,
            &objects.scaled_object,
        )
    }

    fn apply_one<K>(
        &self,
        change: &Changing<'_>,
        cache: &Cache<K>,
        group: &str,
        object: &K,
    ) -> Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Serialize
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        <K as Resource>::DynamicType: Default,
    {
        self.fenced(change, "apply", group)?;
        let api: Api<K> = self.api();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let applied = self
            .handle
            .block_on(api.patch(group, &params, &Patch::Apply(object)))
            .map_err(|e| api_error("apply", group, e))?;
        if let Some(version) = &applied.meta().resource_version {
            self.verified()
                .insert(object_key(cache, group), stamp(version, owner_uid(object)));
        }
        cache.written(applied);
        Ok(())
    }

    /// Deletes one object; one already gone is not an error.
    fn delete<K>(
        &self,
        change: &Changing<'_>,
        cache: &Cache<K>,
        group: &str,
        params: &DeleteParams,
    ) -> Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        <K as Resource>::DynamicType: Default,
    {
        self.fenced(change, "delete", group)?;
        let api: Api<K> = self.api();
        match self.handle.block_on(api.delete(group, params)) {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(api_error("delete", group, error)),
        }
        self.verified().remove(&object_key(cache, group));
        cache.deleted(group);
        Ok(())
    }

    /// Whether every object of `spec` is where it was last found right (or applied): then
    /// nothing needs comparing.
    ///
    /// `owner`: the uid of the processor's Topology as the watch knows it; `authentication`:
    /// the name of the TriggerAuthentication it shares, if any.
    fn unchanged(
        &self,
        spec: &ProcessorSpec,
        owner: Option<&str>,
        authentication: Option<&str>,
        verified: &BTreeMap<String, String>,
    ) -> bool {
        let group = &spec.group;
        at_verified(
            &self.workloads,
            &render::workload_name(group),
            owner,
            verified,
        ) && at_verified(&self.scaled_objects, group, owner, verified)
            && authentication
                .is_none_or(|name| at_verified(&self.authentications, name, None, verified))
    }

    /// What differs between the objects of `spec` and the cluster's: nothing when they hold
    /// what they should (and they are marked so), else what is missing or changed.
    fn drift(&self, spec: &ProcessorSpec, objects: &Objects) -> Result<Vec<String>> {
        let mut drift = Vec::new();
        self.compare(
            &self.workloads,
            &render::workload_name(&spec.group),
            &objects.workload,
            &mut drift,
        )?;
        self.compare(
            &self.scaled_objects,
            &spec.group,
            &objects.scaled_object,
            &mut drift,
        )?;
        if let Some(authentication) = &objects.trigger_authentication {
            self.compare(
                &self.authentications,
                shared_name(authentication),
                authentication,
                &mut drift,
            )?;
        }
        Ok(drift)
    }

    /// Compares object `name` with what was `applied`, as the API server holds it now (the
    /// caches keep no spec of StatefulSets and ScaledObjects): one read, only for an object
    /// whose `resourceVersion` moved since it was last found right.
    fn compare<K>(
        &self,
        cache: &Cache<K>,
        name: &str,
        applied: &K,
        drift: &mut Vec<String>,
    ) -> Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Serialize
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default,
    {
        if !cache.contains(name) {
            drift.push(format!("{} missing", cache.kind()));
            return Ok(());
        }
        if at_verified(cache, name, owner_uid(applied), &self.verified()) {
            return Ok(());
        }
        let api: Api<Kept<K>> = self.api();
        let live = self
            .handle
            .block_on(api.get_opt(name))
            .map_err(|e| api_error("read", name, e))?;
        match live {
            Some(live) => self.check(cache, name, &live, applied, drift),
            None => drift.push(format!("{} missing", cache.kind())),
        }
        Ok(())
    }

    /// Whether `live` holds what was `applied`: marked found right at its version if so,
    /// else a drift.
    fn check<K>(
        &self,
        cache: &Cache<K>,
        name: &str,
        live: &Kept<K>,
        applied: &K,
        drift: &mut Vec<String>,
    ) where
        K: Resource + Serialize,
        K::DynamicType: Default,
    {
        let holds = match (live.json(), serde_json::to_value(applied)) {
            (Some(live), Ok(applied)) => drift::holds(&live, &applied),
            _ => false,
        };
        match (holds, &live.meta().resource_version) {
            (true, Some(version)) => {
                self.verified()
                    .insert(object_key(cache, name), stamp(version, owner_uid(applied)));
            }
            (true, None) => {}
            (false, _) => drift.push(format!("{} changed", cache.kind())),
        }
    }

    /// The pods of one life (by its StatefulSet's selector labels).
    fn pods(&self, group: &str, selector: &BTreeMap<String, String>) -> Result<usize> {
        let selector = selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let api: Api<Pod> = self.api();
        let pods = self
            .handle
            .block_on(api.list(&ListParams::default().labels(&selector)))
            .map_err(|e| api_error("list the pods of", group, e))?;
        Ok(pods.items.len())
    }

    /// The spec of a group this runtime runs, else the one its StatefulSet records.
    fn spec(&self, group: &str) -> Result<Option<ProcessorSpec>> {
        if let Some(spec) = self.running().get(group) {
            return Ok(Some(spec.clone()));
        }
        // The cache keeps the annotation's digest only: the StatefulSet is read.
        let name = render::workload_name(group);
        let api: Api<StatefulSet> = self.api();
        let found = self
            .handle
            .block_on(api.get_opt(&name))
            .map_err(|e| api_error("read", group, e))?;
        Ok(found
            .as_ref()
            .and_then(|d| annotation_of(&d.metadata))
            .and_then(spec_of))
    }
}

/// What [`Runtime::metrics_endpoints`] reads of a Pod: its labels (whose life it is), uid,
/// phase and IP. The spec and the rest of the status are most of a Pod's bytes.
fn trim_pod(mut pod: Kept<Pod>) -> Kept<Pod> {
    let status = pod.status::<PodStatus>().map(|status| PodStatus {
        phase: status.phase,
        pod_ip: status.pod_ip,
        ..PodStatus::default()
    });
    pod.set_status(status.as_ref());
    pod.drop_spec();
    let meta = pod.meta_mut();
    *meta = ObjectMeta {
        name: meta.name.take(),
        uid: meta.uid.take(),
        labels: meta.labels.take(),
        resource_version: meta.resource_version.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
    pod
}

/// Where a Pod serves `/metrics`, once it runs and has an IP.
fn metrics_of(pod: &Kept<Pod>) -> Option<MetricsEndpoint> {
    let status = pod.status::<PodStatus>()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ip: std::net::IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    Some(MetricsEndpoint {
        // A Pod's containers restarted in place count from zero: the scraper sees the
        // counter go down.
        instance: pod.meta().uid.clone().or_else(|| pod.meta().name.clone())?,
        addr: std::net::SocketAddr::new(ip, render::METRICS_PORT),
    })
}

/// Whether `cache`'s object `name` is at the version, and was rendered with the owner, it was
/// last found right at.
fn at_verified<K>(
    cache: &Cache<K>,
    name: &str,
    owner: Option<&str>,
    verified: &BTreeMap<String, String>,
) -> bool {
    let Some(object) = cache.get(name) else {
        return false;
    };
    object
        .meta()
        .resource_version
        .as_deref()
        .is_some_and(|version| {
            verified.get(&object_key(cache, name)) == Some(&stamp(version, owner))
        })
}

/// The name of a shared object (rendered with one).
fn shared_name<K: Resource>(object: &K) -> &str {
    object.meta().name.as_deref().unwrap_or_default()
}

/// What [`KubeRuntime::verified`] keeps of an object found right.
fn stamp(version: &str, owner: Option<&str>) -> String {
    format!("{version}@{}", owner.unwrap_or("-"))
}

/// The uid of the owner an object was rendered with.
fn owner_uid<K: Resource>(object: &K) -> Option<&str> {
    object
        .meta()
        .owner_references
        .as_ref()
        .and_then(|owners| owners.first())
        .map(|owner| owner.uid.as_str())
}

/// The key of an object in [`KubeRuntime::verified`].
fn object_key<K>(cache: &Cache<K>, name: &str) -> String {
    format!("{}/{name}", cache.kind())
}

/// The owner reference to the Topology with metadata `topology`.
fn owner_of(topology: &ObjectMeta) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: Topology::api_version(&()).into_owned(),
        kind: Topology::kind(&()).into_owned(),
        name: topology.name.clone()?,
        uid: topology.uid.clone()?,
        controller: Some(true),
        // Deleting a processor's objects never waits on its Topology.
        block_owner_deletion: Some(false),
    })
}

/// Listed objects by name.
fn named<K>(objects: Vec<Kept<K>>) -> BTreeMap<String, Kept<K>> {
    objects
        .into_iter()
        .filter_map(|o| Some((o.meta().name.clone()?, o)))
        .collect()
}

/// An object's name and its processor annotation.
fn annotation_of(metadata: &ObjectMeta) -> Option<(&str, &str)> {
    let annotation = metadata.annotations.as_ref()?.get(SPEC_ANNOTATION)?;
    Some((metadata.name.as_deref().unwrap_or("-"), annotation))
}

/// What an object of Plumber's (a StatefulSet or a ScaledObject, by name) runs, from its
/// annotation.
fn spec_of((object, annotation): (&str, &str)) -> Option<ProcessorSpec> {
    match serde_json::from_str(annotation) {
        Ok(spec) => Some(spec),
        Err(error) => {
            tracing::warn!(
                object,
                %error,
                "an object of plumber's with an unreadable processor annotation: it runs no identity this daemon knows, and repair deletes it"
            );
            None
        }
    }
}

fn backend(operation: &'static str, group: &str, message: String, retryable: bool) -> Error {
    Error::Backend {
        operation,
        group: group.to_owned(),
        message,
        retryable,
    }
}

/// An API error, retryable unless the server refused the request as such.
fn api_error(operation: &'static str, group: &str, error: kube::Error) -> Error {
    let retryable = match &error {
        kube::Error::Api(status) => !matches!(status.code, 400 | 403 | 422),
        _ => true,
    };
    backend(operation, group, error.to_string(), retryable)
}

impl Runtime for KubeRuntime {
    fn start(&self, spec: &ProcessorSpec) -> Result<()> {
        if let Some(existing) = self.running().get(&spec.group)
            && existing.identity != spec.identity
        {
            return Err(Error::Start {
                group: spec.group.clone(),
                message: "another identity runs under this group name".into(),
                retryable: false,
            });
        }
        let change = self.changing()?;
        self.apply(&change, spec)?;
        self.running().insert(spec.group.clone(), spec.clone());
        tracing::info!(group = %spec.group, namespace = %self.config.render.namespace, "processor applied");
        Ok(())
    }

    fn stop(&self, group: &str) -> Result<()> {
        let spec = self.spec(group)?;
        {
            let change = self.changing()?;
            self.running().remove(group);
            // Its TriggerAuthentication is shared: a look deletes it once no processor uses it.
            self.delete(
                &change,
                &self.scaled_objects,
                group,
                &DeleteParams::default(),
            )?;
            self.delete(
                &change,
                &self.workloads,
                &render::workload_name(group),
                &DeleteParams::foreground(),
            )?;
        }
        // Without a spec (its StatefulSet was deleted already, by a replica that crashed
        // before its pods were gone) the pods are found by the group's name: terminating
        // pods may still be processing, and the engine reads the group's offsets next.
        let Some(selector) = spec
            .as_ref()
            .map(render::selector)
            .or_else(|| render::selector_of_group(group))
        else {
            return Ok(());
        };
        let deadline = Instant::now() + self.config.stop_timeout;
        loop {
            let left = self.pods(group, &selector)?;
            if left == 0 {
                tracing::info!(group, "processor stopped: no pod left");
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Stop {
                    group: group.to_owned(),
                    message: format!(
                        "{left} pods still exist {} s after their StatefulSet was deleted",
                        self.config.stop_timeout.as_secs()
                    ),
                });
            }
            tracing::debug!(group, left, "waiting for the pods to go");
            std::thread::sleep(self.config.poll);
        }
    }

    fn restart(&self, group: &str) -> Result<()> {
        // As `kubectl rollout restart`: a new template annotation (the same RFC 3339 time
        // kubectl writes) rolls the pods.
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        let patch = serde_json::json!({
            "spec": { "template": { "metadata": { "annotations": {
                "plumber.dev/restarted-at": now.to_string()
            }}}}
        });
        let change = self.changing()?;
        self.fenced(&change, "restart", group)?;
        let api: Api<StatefulSet> = self.api();
        match self.handle.block_on(api.patch(
            &render::workload_name(group),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(api_error("restart", group, error)),
        }
    }

    fn update(&self, group: &str, scale: &Scale, resources: Option<&Resources>) -> Result<()> {
        let Some(mut spec) = self.spec(group)? else {
            return Ok(());
        };
        spec.scale = *scale;
        spec.resources = resources.cloned();
        let change = self.changing()?;
        self.apply(&change, &spec)?;
        self.running().insert(group.to_owned(), spec);
        Ok(())
    }

    fn runs(&self, group: &str) -> Result<bool> {
        // The StatefulSet too: a replica that has just taken the lease may be asked before its
        // first resync has read what the previous holder started.
        Ok(self.running().contains_key(group)
            || self.workloads.contains(&render::workload_name(group)))
    }

    fn processors(&self) -> Result<Vec<ProcessorStatus>> {
        Ok(self
            .running()
            .values()
            .map(|spec| {
                let workload = self.workloads.get(&render::workload_name(&spec.group));
                let status = workload.and_then(|w| w.status::<StatefulSetStatus>());
                let status = status.as_ref();
                let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
                ProcessorStatus {
                    topology: spec.topology.clone(),
                    step: spec.step.clone(),
                    identity: spec.identity.to_string(),
                    group: spec.group.clone(),
                    replicas: count(status.map(|s| s.replicas)),
                    running: count(status.and_then(|s| s.ready_replicas)),
                    restarts: 0,
                    commit: Some(spec.commit.clone()),
                }
            })
            .collect())
    }

    fn metrics_endpoints(&self) -> Result<BTreeMap<String, Vec<MetricsEndpoint>>> {
        // A Pod is the life's whose selector labels it carries, as its StatefulSet selects it.
        let lives: BTreeMap<BTreeMap<String, String>, String> = self
            .running()
            .values()
            .map(|spec| (render::selector(spec), spec.group.clone()))
            .collect();
        let mut endpoints: BTreeMap<String, Vec<MetricsEndpoint>> = BTreeMap::new();
        for pod in self.pods.all().values() {
            let Some(labels) = &pod.meta().labels else {
                continue;
            };
            let selected: BTreeMap<String, String> = [TOPOLOGY, STEP, IDENTITY, LIFE]
                .iter()
                .filter_map(|key| Some(((*key).to_owned(), labels.get(*key)?.clone())))
                .collect();
            if let (Some(group), Some(endpoint)) = (lives.get(&selected), metrics_of(pod)) {
                endpoints.entry(group.clone()).or_default().push(endpoint);
            }
        }
        Ok(endpoints)
    }

    fn unsynced(&self) -> Option<String> {
        let unlisted: Vec<&str> = [
            (self.workloads.kind(), self.workloads.is_ready()),
            (self.scaled_objects.kind(), self.scaled_objects.is_ready()),
            (self.authentications.kind(), self.authentications.is_ready()),
            (self.topologies.kind(), self.topologies.is_ready()),
            (self.pods.kind(), self.pods.is_ready()),
        ]
        .into_iter()
        .filter(|(_, ready)| !ready)
        .map(|(kind, _)| kind)
        .collect();
        (!unlisted.is_empty()).then(|| {
            format!(
                "the watches of {} have not listed them yet (may the daemon's ServiceAccount list and watch them?)",
                unlisted.join(", ")
            )
        })
    }

    fn repair(&self) -> Result<()> {
        let change = self.changing()?;
        // Only the specs whose objects moved are cloned: at 18,000 processors, cloning them
        // all was most of an idle look.
        // The TriggerAuthentications running processors share: kept, the others collected.
        let mut shared: BTreeSet<String> = BTreeSet::new();
        let (keep, moved) = {
            let running = self.running();
            let verified = self.verified();
            let mut owners: BTreeMap<&str, Option<String>> = BTreeMap::new();
            let moved: Vec<ProcessorSpec> = running
                .values()
                .filter(|spec| {
                    let owner = owners
                        .entry(spec.topology.as_str())
                        .or_insert_with(|| self.known_owner(&spec.topology).map(|o| o.uid));
                    let authentication = render::trigger_authentication_name(spec);
                    let unchanged = self.unchanged(
                        spec,
                        owner.as_deref(),
                        authentication.as_deref(),
                        &verified,
                    );
                    shared.extend(authentication);
                    !unchanged
                })
                .cloned()
                .collect();
            (running.keys().cloned().collect::<BTreeSet<String>>(), moved)
        };
        let keep_workloads = keep.iter().map(|g| render::workload_name(g)).collect();
        self.collect(&change, &self.workloads, &keep_workloads)?;
        self.collect(&change, &self.scaled_objects, &keep)?;
        self.collect(&change, &self.authentications, &shared)?;
        for spec in &moved {
            // The owner as the watch knows it: a repair asks the API nothing it need not.
            let objects = self.objects_owned_by(spec, self.known_owner(&spec.topology))?;
            let drift = self.drift(spec, &objects)?;
            if !drift.is_empty() {
                tracing::warn!(group = %spec.group, drift = %drift.join(", "), "objects of a running processor were deleted or changed; putting them back");
                self.apply_objects(&change, spec, &objects)?;
            }
        }
        Ok(())
    }
}

impl KubeRuntime {
    /// Deletes Plumber's objects in `cache` whose group is not in `keep`.
    fn collect<K>(
        &self,
        change: &Changing<'_>,
        cache: &Cache<K>,
        keep: &BTreeSet<String>,
    ) -> Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        <K as Resource>::DynamicType: Default,
    {
        for name in cache.names_outside(keep) {
            tracing::info!(
                kind = %cache.kind(),
                name,
                "deleting an object of an identity nothing runs"
            );
            self.delete(change, cache, &name, &DeleteParams::foreground())?;
        }
        Ok(())
    }
}
