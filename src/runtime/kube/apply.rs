//! The Kubernetes [`Runtime`]: processors as the objects [`render`](super::render) makes,
//! applied with server-side apply (field manager `plumber`).
//!
//! # Guarantees
//! - **Start** applies the TriggerAuthentication, the Deployment, then the ScaledObject:
//!   KEDA never scales a Deployment that does not exist, nor one it cannot authenticate for.
//! - **Stop** deletes the ScaledObject first (else KEDA scales the Deployment back up), then
//!   the Deployment (foreground), and returns only once no pod of it is left (pods found by
//!   the group's name when the Deployment is gone already), so its processes have exited. The
//!   engine then waits until the group has no members where the broker can say (SPEC §4.2;
//!   tansu 0.6 cannot, and there this wait is all that protects the cutover offsets).
//! - **Drift**: [`Runtime::repair`] re-applies every processor this runtime runs (an object
//!   edited or deleted by hand is put back; server-side apply leaves fields of other managers,
//!   KEDA's `replicas` among them) and deletes Plumber's objects of identities it does not run.
//! - **Restarts of the daemon**: what runs is read back from the Deployments' annotation
//!   ([`SPEC_ANNOTATION`]), so a new daemon replica knows every processor without a record
//!   of its own; and read again ([`Runtime::resync`]) whenever a replica starts acting, so a
//!   standby that takes the lease over repairs what the previous holder left running, not
//!   what ran when the standby started.
//!
//! # Caveats
//! A Deployment deleted by hand while no daemon runs is not recreated by the next one (its
//! annotation went with it); the engine's record still lists the life, and status shows it
//! without instances.
//!
//! Calls block the calling thread (the engine's, the observer's) on the tokio runtime the
//! client lives on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::crd::Topology;
use super::keda::{ScaledObject, TriggerAuthentication};
use super::render::{self, MANAGED_BY, Objects, RenderConfig, SPEC_ANNOTATION};
use crate::runtime::{Error, ProcessorSpec, ProcessorStatus, Result, Runtime};
use crate::spec::{Resources, Scale};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// The field manager of every apply (SPEC §7).
pub const FIELD_MANAGER: &str = "plumber";

#[derive(Debug, Clone)]
pub struct KubeConfig {
    pub render: RenderConfig,
    /// How long a stop waits for the pods to go (their grace period is 30 s).
    pub stop_timeout: Duration,
    /// How often a stop looks at the pods.
    pub poll: Duration,
    /// How often [`Runtime::repair`] re-applies every object, not only the missing ones: a
    /// hand edit is undone within this (each apply is a request; most find nothing to do).
    pub full_repair_interval: Duration,
}

impl KubeConfig {
    pub fn new(render: RenderConfig) -> Self {
        KubeConfig {
            render,
            stop_timeout: Duration::from_secs(60),
            poll: Duration::from_millis(500),
            full_repair_interval: Duration::from_secs(600),
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
    /// When repair last re-applied everything.
    last_full_repair: Mutex<Option<Instant>>,
    /// Held while objects are applied or deleted, so a repair never puts back what a stop
    /// is deleting.
    changing: Mutex<()>,
    /// The owner reference of each Topology, by name.
    owners: Mutex<BTreeMap<String, OwnerReference>>,
}

/// The label selector of every object Plumber manages.
fn managed() -> String {
    format!("{MANAGED_BY}=plumber")
}

impl KubeRuntime {
    /// A runtime on `client`, whose tasks run on the tokio runtime of `handle` (a
    /// multi-threaded one: calls block this thread while its workers drive the connection),
    /// knowing what runs from the Deployments it finds.
    pub fn connect(
        client: Client,
        handle: tokio::runtime::Handle,
        config: KubeConfig,
    ) -> Result<KubeRuntime> {
        let runtime = KubeRuntime {
            client,
            config,
            handle,
            running: Mutex::new(BTreeMap::new()),
            last_full_repair: Mutex::new(None),
            changing: Mutex::new(()),
            owners: Mutex::new(BTreeMap::new()),
        };
        runtime.resync()?;
        Ok(runtime)
    }

    fn running(&self) -> MutexGuard<'_, BTreeMap<String, ProcessorSpec>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changing(&self) -> MutexGuard<'_, ()> {
        self.changing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.config.render.namespace)
    }

    fn deployments(&self) -> Result<Vec<Deployment>> {
        let api: Api<Deployment> = self.api();
        let list = self
            .handle
            .block_on(api.list(&ListParams::default().labels(&managed())))
            .map_err(|e| api_error("list the Deployments of", "-", e))?;
        Ok(list.items)
    }

    /// The owner reference to the processor's Topology, when it exists: deleting the
    /// Topology deletes its processors' objects with it.
    fn owner(&self, topology: &str) -> Result<Option<OwnerReference>> {
        if let Some(owner) = self.owners().get(topology) {
            return Ok(Some(owner.clone()));
        }
        let api: Api<Topology> = self.api();
        let found = self
            .handle
            .block_on(api.get_opt(topology))
            .map_err(|e| api_error("read the Topology of", topology, e))?;
        let owner = found.as_ref().and_then(owner_of);
        if let Some(owner) = &owner {
            self.owners().insert(topology.to_owned(), owner.clone());
        }
        Ok(owner)
    }

    fn owners(&self) -> MutexGuard<'_, BTreeMap<String, OwnerReference>> {
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads every Topology's uid again (one that was deleted and made again has another).
    fn refresh_owners(&self) -> Result<()> {
        let api: Api<Topology> = self.api();
        let list = self
            .handle
            .block_on(api.list(&ListParams::default().labels(&managed())))
            .map_err(|e| api_error("list the Topologies of", "-", e))?;
        let owners = list
            .items
            .iter()
            .filter_map(|t| Some((t.metadata.name.clone()?, owner_of(t)?)))
            .collect();
        *self.owners() = owners;
        Ok(())
    }

    fn objects(&self, spec: &ProcessorSpec) -> Result<Objects> {
        let config = RenderConfig {
            owner: self.owner(&spec.topology)?,
            ..self.config.render.clone()
        };
        render::processor(spec, &config).map_err(|e| Error::Start {
            group: spec.group.clone(),
            message: e.to_string(),
            retryable: false,
        })
    }

    /// Applies the objects of `spec` in the order that keeps KEDA from acting on a
    /// Deployment it cannot see or reach.
    fn apply(&self, spec: &ProcessorSpec) -> Result<()> {
        let objects = self.objects(spec)?;
        if let Some(authentication) = &objects.trigger_authentication {
            self.apply_one(&spec.group, authentication)?;
        }
        self.apply_one(&spec.group, &objects.deployment)?;
        self.apply_one(&spec.group, &objects.scaled_object)
    }

    fn apply_one<K>(&self, group: &str, object: &K) -> Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Serialize
            + DeserializeOwned
            + Clone
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.handle
            .block_on(api.patch(group, &params, &Patch::Apply(object)))
            .map(|_| ())
            .map_err(|e| api_error("apply", group, e))
    }

    /// Deletes one object; one already gone is not an error.
    fn delete<K>(&self, group: &str, params: &DeleteParams) -> Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api();
        match self.handle.block_on(api.delete(group, params)) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(api_error("delete", group, error)),
        }
    }

    /// The pods of one life (by its Deployment's selector labels).
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

    /// The spec of a group this runtime runs, else the one its Deployment records.
    fn spec(&self, group: &str) -> Result<Option<ProcessorSpec>> {
        if let Some(spec) = self.running().get(group) {
            return Ok(Some(spec.clone()));
        }
        let api: Api<Deployment> = self.api();
        let found = self
            .handle
            .block_on(api.get_opt(group))
            .map_err(|e| api_error("read", group, e))?;
        Ok(found.as_ref().and_then(spec_of))
    }
}

fn owner_of(topology: &Topology) -> Option<OwnerReference> {
    let mut owner = topology.controller_owner_ref(&())?;
    // Deleting a processor's objects never waits on its Topology.
    owner.block_owner_deletion = Some(false);
    Some(owner)
}

/// What a Deployment of Plumber's runs, from its annotation.
fn spec_of(deployment: &Deployment) -> Option<ProcessorSpec> {
    let annotation = deployment
        .metadata
        .annotations
        .as_ref()?
        .get(SPEC_ANNOTATION)?;
    match serde_json::from_str(annotation) {
        Ok(spec) => Some(spec),
        Err(error) => {
            tracing::warn!(
                deployment = deployment.metadata.name.as_deref().unwrap_or("-"),
                %error,
                "a Deployment of plumber's with an unreadable processor annotation: it runs no identity this daemon knows, and repair deletes it"
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
        let _changing = self.changing();
        self.apply(spec)?;
        self.running().insert(spec.group.clone(), spec.clone());
        tracing::info!(group = %spec.group, namespace = %self.config.render.namespace, "processor applied");
        Ok(())
    }

    fn stop(&self, group: &str) -> Result<()> {
        let spec = self.spec(group)?;
        {
            let _changing = self.changing();
            self.running().remove(group);
            self.delete::<ScaledObject>(group, &DeleteParams::default())?;
            self.delete::<TriggerAuthentication>(group, &DeleteParams::default())?;
            self.delete::<Deployment>(group, &DeleteParams::foreground())?;
        }
        // Without a spec (its Deployment was deleted already, by a replica that crashed
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
                        "{left} pods still exist {} s after their Deployment was deleted",
                        self.config.stop_timeout.as_secs()
                    ),
                });
            }
            tracing::debug!(group, left, "waiting for the pods to go");
            std::thread::sleep(self.config.poll);
        }
    }

    fn restart(&self, group: &str) -> Result<()> {
        // As `kubectl rollout restart`: a new template annotation rolls the pods.
        let patch = serde_json::json!({
            "spec": { "template": { "metadata": { "annotations": {
                "plumber.dev/restarted-at": crate::cutover::now().to_string()
            }}}}
        });
        let api: Api<Deployment> = self.api();
        match self
            .handle
            .block_on(api.patch(group, &PatchParams::default(), &Patch::Merge(&patch)))
        {
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
        let _changing = self.changing();
        self.apply(&spec)?;
        self.running().insert(group.to_owned(), spec);
        Ok(())
    }

    fn processors(&self) -> Result<Vec<ProcessorStatus>> {
        let deployments = self.deployments()?;
        let by_name: BTreeMap<String, &Deployment> = deployments
            .iter()
            .filter_map(|d| Some((d.metadata.name.clone()?, d)))
            .collect();
        Ok(self
            .running()
            .values()
            .map(|spec| {
                let status = by_name.get(&spec.group).and_then(|d| d.status.as_ref());
                let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
                ProcessorStatus {
                    topology: spec.topology.clone(),
                    step: spec.step.clone(),
                    identity: spec.identity.to_string(),
                    group: spec.group.clone(),
                    replicas: count(status.and_then(|s| s.replicas)),
                    running: count(status.and_then(|s| s.ready_replicas)),
                    restarts: 0,
                    commit: Some(spec.commit.clone()),
                }
            })
            .collect())
    }

    fn resync(&self) -> Result<()> {
        // Under `changing`: a start or stop of this runtime is wholly before or after it.
        let _changing = self.changing();
        let found: BTreeMap<String, ProcessorSpec> = self
            .deployments()?
            .iter()
            .filter_map(spec_of)
            .map(|spec| (spec.group.clone(), spec))
            .collect();
        *self.running() = found;
        Ok(())
    }

    fn repair(&self) -> Result<()> {
        let _changing = self.changing();
        let running: Vec<ProcessorSpec> = self.running().values().cloned().collect();
        let keep: BTreeSet<String> = running.iter().map(|s| s.group.clone()).collect();
        let full = {
            let mut last = self
                .last_full_repair
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let due = last.is_none_or(|at| at.elapsed() >= self.config.full_repair_interval);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if full {
            self.refresh_owners()?;
        }
        let deployments = self.collect::<Deployment>(&keep)?;
        let scaled_objects = self.collect::<ScaledObject>(&keep)?;
        let authentications = self.collect::<TriggerAuthentication>(&keep)?;
        for spec in &running {
            let missing = !deployments.contains(&spec.group)
                || !scaled_objects.contains(&spec.group)
                || (spec.cluster.credentials.is_some() && !authentications.contains(&spec.group));
            if missing {
                tracing::warn!(group = %spec.group, "objects of a running processor are gone; putting them back");
            }
            if full || missing {
                self.apply(spec)?;
            }
        }
        Ok(())
    }
}

impl KubeRuntime {
    /// Deletes Plumber's objects of kind `K` whose group is not in `keep`; returns the names
    /// of those that are.
    fn collect<K>(&self, keep: &BTreeSet<String>) -> Result<BTreeSet<String>>
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
        let mut kept = BTreeSet::new();
        for object in list.items {
            let Some(name) = object.meta().name.clone() else {
                continue;
            };
            if keep.contains(&name) {
                kept.insert(name);
                continue;
            }
            tracing::info!(
                kind = %K::kind(&Default::default()),
                name,
                "deleting an object of an identity nothing runs"
            );
            self.delete::<K>(&name, &DeleteParams::foreground())?;
        }
        Ok(kept)
    }
}
