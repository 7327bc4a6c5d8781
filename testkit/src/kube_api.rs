//! An in-memory Kubernetes API server for tests, behind a real [`kube::Client`].
//!
//! [`FakeApi`] is a store of objects that answers kube's HTTP requests as a
//! `tower::Service<http::Request<kube::client::Body>>`; [`FakeApi::client`] wraps it in a
//! `kube::Client`, so the code under test runs its real `kube::Api` calls (typed or
//! `DynamicObject`) and the test reads and edits the same objects through the handle:
//!
//! ```no_run
//! # async fn example() -> Result<(), kube::Error> {
//! use k8s_openapi::api::apps::v1::Deployment;
//! use kube::api::{Api, Patch, PatchParams};
//! use plumber_testkit::kube_api::{FakeApi, PodStart, Verb};
//!
//! let fake = FakeApi::new().with_workload_controller(PodStart::Ready);
//! let deployments: Api<Deployment> = Api::namespaced(fake.client("plumber"), "plumber");
//! let web = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}});
//! deployments.patch("web", &PatchParams::apply("plumber"), &Patch::Apply(&web)).await?;
//! assert_eq!(fake.requests()[0].verb(), Verb::Apply);
//! assert!(fake.get::<k8s_openapi::api::core::v1::Pod>("plumber", "web-0").is_some());
//! # Ok(()) }
//! ```
//!
//! # What it serves
//!
//! Paths of kube's URL scheme: `/api/v1/namespaces/{ns}/{plural}[/{name}[/status]]` and
//! `/apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}[/status]]`; without
//! `namespaces/{ns}`, a list spans all namespaces and a named object is cluster-scoped (kept
//! with an empty namespace). Any plural is accepted: there is no discovery, and a resource
//! exists once an object of it is written. The version in the path is not checked against the
//! stored object's (one object per group, plural, namespace and name).
//!
//! - `GET` an object (404 `NotFound` `Status`, which kube turns into `kube::Error::Api` with
//!   code 404), or a list: `labelSelector` (`a=b`, `a!=b`, `a`, `!a`, `a in (x,y)`,
//!   `a notin (x)`, comma-separated AND), `fieldSelector` on `metadata.name` and
//!   `metadata.namespace`; the List has the kind's `…List` kind and `metadata.resourceVersion`.
//!   `limit` is ignored (everything comes in one page).
//! - `GET` a collection with `watch=true` (or `1`): a watch (see below).
//! - `POST` creates (409 `AlreadyExists`; `generateName`; `status` is dropped).
//! - `PUT` replaces, with optimistic concurrency: a `metadata.resourceVersion` in the body
//!   that is not the stored one is a 409 `Conflict`, as is a stale one in a merge patch or an
//!   apply. A replace of a missing object is 404.
//! - `PATCH`: `application/apply-patch+yaml` (server-side apply; the body must be JSON, as kube
//!   sends it; `fieldManager` is required), `application/merge-patch+json`,
//!   `application/json-patch+json`, and `application/strategic-merge-patch+json`, which is
//!   applied as a JSON merge patch (lists are replaced, not merged by key).
//! - `DELETE` one object: the body's `DeleteOptions` (`propagationPolicy`, `preconditions`,
//!   `dryRun`) are honoured as far as preconditions (409) and dry runs go; the policy is only
//!   recorded. An object with `metadata.finalizers` gets a `deletionTimestamp` and stays until
//!   its finalizers are removed (by the handle or a write); otherwise it is gone at once, and
//!   the answer is a `Success` `Status` (for Pods, the object, as the real server answers).
//!   `DELETE` on a collection deletes what the selectors select and answers the List of it.
//! - `/status`: a write to the main resource keeps the stored `status`; a write to `/status`
//!   changes nothing but `status`. Every resource is taken to have a status subresource.
//! - `dryRun=All` on writes: answered, not stored. `GET /version` answers a version.
//! - Server-set metadata: `uid` (deterministic, from a counter), `creationTimestamp`,
//!   `generation` (1 on create, bumped when anything but `metadata` and `status` changes),
//!   `resourceVersion` (one global counter, bumped by every write that changes the object; a
//!   write that changes nothing changes no `resourceVersion`), `managedFields`.
//!
//! # Watches
//!
//! A watch is answered 200 at once with a body that streams newline-delimited JSON watch
//! events (`{"type": "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR", "object": …}`)
//! and stays open, so `kube::runtime::watcher`, `reflector` and `await_condition` work. It
//! sees every change of the store, whoever made it: requests, the handle's writes
//! ([`FakeApi::put`], [`FakeApi::patch`], [`FakeApi::delete`], [`FakeApi::set_pod_ready`],
//! [`FakeApi::finish_termination`], …) and the workload controller. Each change is given to
//! the open watches under the server's lock, as it is made, through an unbounded channel
//! (nothing waits on a slow reader; a watch never holds the lock while it waits).
//!
//! - `labelSelector` and `fieldSelector` as for lists, the namespace of the path (or all).
//!   An object whose labels change so that it starts matching is `ADDED`, one that stops
//!   `DELETED` (with its new state), as from the API server's watch cache.
//! - `resourceVersion`: absent or `0`, a synthetic `ADDED` for every matching object, then
//!   the changes; a version, every change after it, from a log of the last 10,000 changes
//!   ([`FakeApi::with_watch_history`]); a version older than the log keeps, an `ERROR` event
//!   with a 410 `Expired` `Status`, and the end of the stream (kube's watcher lists again).
//!   Lists answer `metadata.resourceVersion` at the global counter, so a watch from a list's
//!   version misses nothing.
//! - Every event's object carries its `metadata.resourceVersion`. A deletion is a version of
//!   its own (the counter is bumped), and its `DELETED` carries the object's last state at that
//!   version. Marking an object with finalizers for deletion is a `MODIFIED` (with the
//!   `deletionTimestamp`); removing its last finalizer a `MODIFIED`, then a `DELETED`.
//! - `timeoutSeconds` (kube always sends one): the stream ends after that long, queued
//!   events first; with `allowWatchBookmarks=true` its last event is a `BOOKMARK` at the
//!   version up to which the watch saw every change (also of other resources), from which
//!   kube's watcher watches again. `0` or absent: no end.
//! - `sendInitialEvents=true` (kube's streaming lists): the `ADDED`s, then a `BOOKMARK` with
//!   the `k8s.io/initial-events-end` annotation.
//! - A watch ends when its body is dropped (the client's stream is): it is forgotten at the
//!   store's next change, or when [`FakeApi::active_watches`] counts.
//!
//! Since kube's `Body` cannot be made to stream outside kube, the service answers with its
//! own body type, [`FakeBody`] (kube's client takes any `http_body::Body`).
//!
//! # Field ownership (server-side apply)
//!
//! Each object keeps which manager owns which fields (see `fields.rs`): an apply sets the
//! fields it names, removes those its manager applied before and no longer names (unless
//! another manager owns them too), and fails with 409 `Conflict` (causes
//! `FieldManagerConflict`) when it would change a field another manager owns, unless
//! `force=true`, which takes the field over. Updates (`PUT`, merge and JSON patches, create, and
//! the handle's writes as [`HAND_MANAGER`]) take over the fields they change. Unlike the real
//! server, every list is atomic: owned and replaced whole, never merged by key (`containers`
//! by `name`), so two managers writing different elements of one list conflict here.
//!
//! # What it does not do
//!
//! Watches are of collections only (not the old `watch` of a named path; select one object with
//! `fieldSelector=metadata.name=…`); `resourceVersionMatch` is ignored, and a version newer than
//! the server's is waited for rather than refused; bookmarks come only at a timeout, never
//! periodically; a metadata-only watch (`watch_metadata`) gets whole objects. No discovery, no
//! authentication (but a bearer token over HTTPS, [`FakeApi::serve_https`]), no RBAC unless
//! [`FakeApi::with_rbac`], no admission (webhooks, defaulting, Pod Security), no validation of
//! built-in kinds, no garbage collection beyond the workload controller's Pods (owner
//! references of other kinds are not followed, `Foreground` deletion is not modelled), no
//! graceful Pod termination unless a test's kubelet models it with a finalizer
//! ([`FakeApi::with_pod_finalizer`]), no `scale` or other subresources, no YAML request bodies, no
//! protobuf. It is a test double, not an API server: what passes here can still fail on a
//! cluster.
//!
//! # Schemas
//!
//! [`FakeApi::with_schema`] and [`FakeApi::with_crd_yaml`] give a kind the `openAPIV3Schema` of
//! its CRD: every write of that kind (apply, patch, replace, create; not the handle's) is
//! validated, and a violation is answered 422 `Invalid` with a cause per field, as the real
//! server does for custom resources. Unknown fields are violations too (the real server would
//! drop them and warn). See `schema.rs` for what is checked.
//!
//! # The workload controller
//!
//! [`FakeApi::with_workload_controller`] maintains `spec.replicas` (default 1) Pods
//! `<name>-<k>` per Deployment and StatefulSet, with the selector's and template's labels,
//! deletes them when the workload goes or its template changes (and replaces them, a Pod
//! under the same name only once the old one is gone), and writes the workload's status. It runs synchronously after every request or handle call that
//! changed something, before the response is sent, so a test sees its effects at once; with
//! [`FakeApi::with_manual_settle`] it runs only on [`FakeApi::settle`]. Pods added, marked
//! for deletion and deleted (by anyone) are events: [`FakeApi::on_pods_changed`] calls back,
//! and [`FakeApi::take_pod_events`] drains the log, so a test "kubelet" can start and stop a
//! process per Pod and report readiness with [`FakeApi::set_pod_ready`]. Deleting a Pod that
//! has finalizers only marks it, by request or by the controller; with
//! [`FakeApi::with_pod_finalizer`] every Pod it creates has one, which the kubelet removes
//! once the Pod's processes exited ([`FakeApi::finish_termination`]): graceful termination.
//!
//! # Runtimes
//!
//! `kube::Client::new` spawns the client's request buffer on the current tokio runtime:
//! [`FakeApi::client`] must be called inside the runtime that will drive the client (in
//! `#[tokio::test]`, or `runtime.block_on(async { fake.client(ns) })`, or under
//! `runtime.enter()`), and it panics with a message outside one. Code that builds its own
//! runtime can take [`FakeApi::service`] and call `kube::Client::new` itself. The service
//! itself needs no particular runtime: it answers synchronously, except for requests held by
//! [`FakeApi::hold`], and a watch's body streams as changes come; its `timeoutSeconds` needs
//! tokio's timer (outside a tokio runtime, a watch has no timeout).

mod controller;
mod fields;
mod https;
mod rbac;
mod schema;
mod selector;
mod server;
mod store;
mod watch;

pub use https::Served;
pub use rbac::{Attributes, Rbac};
pub use server::Target;

/// KEDA's own `ScaledObject` CRD (v2.20.2, Apache-2.0; see `fixtures/keda/README.md`), for
/// [`FakeApi::with_crd_yaml`].
pub const KEDA_SCALED_OBJECT_CRD: &str =
    include_str!("../fixtures/keda/keda.sh_scaledobjects.yaml");
/// KEDA's own `TriggerAuthentication` CRD.
pub const KEDA_TRIGGER_AUTHENTICATION_CRD: &str =
    include_str!("../fixtures/keda/keda.sh_triggerauthentications.yaml");

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use kube::api::ApiResource;
use kube::client::Body;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tower::BoxError;

use fields::{Ownership, Scope};
use store::{Key, Resource, Store, now};

/// The field manager the handle's writes ([`FakeApi::put`], [`FakeApi::patch`]) are recorded
/// under: a person's `kubectl edit`. Fields it changes are taken from their appliers, so a
/// later apply of other values conflicts unless it forces, as on a cluster.
pub const HAND_MANAGER: &str = "kubectl-edit";

/// What the Pods of the workload controller start as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodStart {
    /// `Running` and `Ready`, at once.
    Ready,
    /// `Pending` and not ready, until [`FakeApi::set_pod_ready`] (a test's kubelet) says so.
    Pending,
}

/// Whether a Pod came or went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodChange {
    Added,
    /// Marked for deletion (it has finalizers: see [`FakeApi::with_pod_finalizer`]); a
    /// `Deleted` follows once they are removed.
    Terminating,
    Deleted,
}

/// A Pod added to, marked for deletion in or deleted from the store, by the deployment
/// controller, a request or the handle.
#[derive(Debug, Clone, PartialEq)]
pub struct PodEvent {
    pub change: PodChange,
    pub namespace: String,
    pub name: String,
    /// The Pod as stored when added, or last stored when deleted.
    pub pod: Value,
}

/// What a request does, from its method, path and content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Replace,
    /// A server-side apply patch.
    Apply,
    /// A merge, strategic merge or JSON patch.
    Patch,
    Delete,
    DeleteCollection,
    /// Anything else (`/version`, unknown paths, unsupported methods).
    Other,
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Replace => "replace",
            Verb::Apply => "apply",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Other => "other",
        })
    }
}

/// One request as the fake API server received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// `GET`, `PATCH`, …
    pub method: String,
    pub path: String,
    /// The query parameters, decoded (the last one wins when a name repeats).
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The body as JSON; a body that is not JSON as a JSON string; `None` when empty.
    pub body: Option<Value>,
    /// The HTTP status answered; `None` while the request is held, or when it failed with an
    /// injected transport error.
    pub status: Option<u16>,
    /// Who sent it: the name given to [`FakeApi::client_as`]; `None` for other clients.
    pub client: Option<String>,
    target: Option<Target>,
    seq: u64,
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl RecordedRequest {
    fn new(parts: &http::request::Parts, body: &[u8], seq: u64) -> RecordedRequest {
        let query = parts
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (percent_decode(k), percent_decode(v))
            })
            .collect();
        let body = if body.is_empty() {
            None
        } else {
            Some(
                serde_json::from_slice(body)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned())),
            )
        };
        let path = parts.uri.path().to_string();
        RecordedRequest {
            method: parts.method.as_str().to_string(),
            target: Target::parse(&path),
            path,
            query,
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body,
            status: None,
            client: None,
            seq,
        }
    }

    /// The parsed path, unless it is not one of kube's resource URLs.
    pub fn target(&self) -> Option<&Target> {
        self.target.as_ref()
    }

    /// The resource's plural (`deployments`).
    pub fn resource(&self) -> Option<&str> {
        self.target.as_ref().map(|t| t.resource.as_str())
    }

    pub fn name(&self) -> Option<&str> {
        self.target.as_ref().and_then(|t| t.name.as_deref())
    }

    pub fn namespace(&self) -> Option<&str> {
        self.target.as_ref().and_then(|t| t.namespace.as_deref())
    }

    pub fn subresource(&self) -> Option<&str> {
        self.target.as_ref().and_then(|t| t.subresource.as_deref())
    }

    pub fn verb(&self) -> Verb {
        let Some(target) = &self.target else {
            return Verb::Other;
        };
        let named = target.name.is_some();
        match (self.method.as_str(), named) {
            ("GET", true) => Verb::Get,
            ("GET", false)
                if self
                    .query
                    .get("watch")
                    .is_some_and(|w| w == "true" || w == "1") =>
            {
                Verb::Watch
            }
            ("GET", false) => Verb::List,
            ("POST", false) => Verb::Create,
            ("PUT", true) => Verb::Replace,
            ("PATCH", true) if self.is_apply() => Verb::Apply,
            ("PATCH", true) => Verb::Patch,
            ("DELETE", true) => Verb::Delete,
            ("DELETE", false) => Verb::DeleteCollection,
            _ => Verb::Other,
        }
    }

    /// Whether the body is a server-side apply patch (by its content type).
    pub fn is_apply(&self) -> bool {
        self.content_type
            .as_deref()
            .is_some_and(|c| c.starts_with(server::APPLY))
    }

    /// The `fieldManager` query parameter.
    pub fn field_manager(&self) -> Option<&str> {
        self.query.get("fieldManager").map(String::as_str)
    }

    /// Whether the `force` query parameter is `true`.
    pub fn force(&self) -> bool {
        self.query.get("force").is_some_and(|f| f == "true")
    }

    /// The deletion's `propagationPolicy` (`Foreground`, `Background`, `Orphan`), from the
    /// body's `DeleteOptions` (where kube sends it) or the query.
    pub fn propagation_policy(&self) -> Option<&str> {
        self.body
            .as_ref()
            .and_then(|b| b.get("propagationPolicy"))
            .and_then(Value::as_str)
            .or_else(|| self.query.get("propagationPolicy").map(String::as_str))
    }

    /// `apply deployments/web`, `replace topologies/orders/status`, `list pods`: a line to
    /// assert request sequences with.
    pub fn summary(&self) -> String {
        let Some(target) = &self.target else {
            return format!("{} {}", self.method, self.path);
        };
        let mut out = format!("{} {}", self.verb(), target.resource);
        if let Some(name) = &target.name {
            out.push('/');
            out.push_str(name);
        }
        if let Some(sub) = &target.subresource {
            out.push('/');
            out.push_str(sub);
        }
        out
    }
}

/// A failure to inject with [`FakeApi::fail_next`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// An HTTP error with a `Status` body: kube's `Error::Api` with this code and reason.
    Status {
        code: u16,
        reason: String,
        message: String,
    },
    /// No HTTP response at all (the service fails): kube's `Error::Service`.
    Transport(String),
}

impl Fault {
    pub fn status(code: u16, reason: &str, message: &str) -> Fault {
        Fault::Status {
            code,
            reason: reason.to_string(),
            message: message.to_string(),
        }
    }

    /// 500 `InternalError`.
    pub fn internal_error() -> Fault {
        Fault::status(
            500,
            "InternalError",
            "an internal error injected by the test",
        )
    }

    /// 409 `Conflict`, as for a stale `resourceVersion`.
    pub fn conflict() -> Fault {
        Fault::status(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and \
             try again (injected by the test)",
        )
    }

    /// 503 `ServiceUnavailable`.
    pub fn unavailable() -> Fault {
        Fault::status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request (injected by the test)",
        )
    }

    pub fn transport(message: &str) -> Fault {
        Fault::Transport(message.to_string())
    }
}

type Matcher = Arc<dyn Fn(&RecordedRequest) -> bool + Send + Sync>;
type Listener = Arc<dyn Fn(&PodEvent) + Send + Sync>;

struct FaultRule {
    remaining: usize,
    matcher: Matcher,
    fault: Fault,
}

struct HoldRule {
    id: u64,
    matcher: Matcher,
    release: tokio::sync::watch::Receiver<bool>,
    held: Arc<AtomicUsize>,
}

struct State {
    store: Store,
    schemas: schema::Schemas,
    requests: Vec<RecordedRequest>,
    seq: u64,
    faults: Vec<FaultRule>,
    holds: Vec<HoldRule>,
    next_hold: u64,
    controller: Option<PodStart>,
    /// The finalizer the controller's Pods carry ([`FakeApi::with_pod_finalizer`]).
    pod_finalizer: Option<String>,
    auto_settle: bool,
    pod_log: Vec<PodEvent>,
    /// [`FakeApi::with_rbac`]; `None`, everything is allowed.
    rbac: Option<rbac::Rbac>,
}

struct Inner {
    state: Mutex<State>,
    listeners: Mutex<Vec<Listener>>,
}

/// The fake API server: the store, the request log, faults and controllers. Cheap to clone;
/// every clone is the same server. See the [module documentation](self).
#[derive(Clone)]
pub struct FakeApi {
    inner: Arc<Inner>,
}

impl fmt::Debug for FakeApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("FakeApi")
            .field("objects", &state.store.all_keys().len())
            .field("requests", &state.requests.len())
            .field("resource_version", &state.store.revision())
            .finish()
    }
}

impl Default for FakeApi {
    fn default() -> Self {
        FakeApi::new()
    }
}

fn deserialize<K: DeserializeOwned>(value: Value, what: &str) -> K {
    serde_json::from_value(value).unwrap_or_else(|e| {
        panic!(
            "the stored {what} does not deserialize as {}: {e}",
            std::any::type_name::<K>()
        )
    })
}

impl FakeApi {
    /// An empty server: no objects, no controller, no schemas.
    pub fn new() -> FakeApi {
        FakeApi {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    store: Store::new(),
                    schemas: schema::Schemas::default(),
                    requests: Vec::new(),
                    seq: 0,
                    faults: Vec::new(),
                    holds: Vec::new(),
                    next_hold: 0,
                    controller: None,
                    pod_finalizer: None,
                    auto_settle: true,
                    pod_log: Vec::new(),
                    rbac: None,
                }),
                listeners: Mutex::new(Vec::new()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .expect("the fake API server's state lock was poisoned by an earlier panic under it")
    }

    /// Runs the workload controller (see the module documentation): Pods for Deployments and
    /// StatefulSets, which start as `start` says.
    pub fn with_workload_controller(self, start: PodStart) -> FakeApi {
        self.lock().controller = Some(start);
        self.settle();
        self
    }

    /// Graceful Pod termination, for a test's kubelet: the workload controller's Pods carry
    /// `finalizer`, so deleting one (the controller does when its workload goes or its
    /// template changes; a request may) only marks it for deletion (`deletionTimestamp`, a
    /// [`PodChange::Terminating`] event) and it stays, `Terminating`, until the finalizer is
    /// removed ([`FakeApi::finish_termination`], once its processes exited), as a Pod stays
    /// until its kubelet saw its containers stop. A replacement of a terminating Pod (same
    /// name) is created once it is gone.
    pub fn with_pod_finalizer(self, finalizer: &str) -> FakeApi {
        self.lock().pod_finalizer = Some(finalizer.to_owned());
        self
    }

    /// Removes `finalizer` from a Pod (it is gone once no finalizer is left, if it was being
    /// deleted); whether there was such a Pod.
    pub fn finish_termination(&self, namespace: &str, name: &str, finalizer: &str) -> bool {
        let key = Key {
            resource: Resource::new("", "pods"),
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        let mut state = self.lock();
        let Some(stored) = state.store.stored(&key).cloned() else {
            return false;
        };
        let mut object = stored.object.clone();
        if let Some(finalizers) = object
            .pointer_mut("/metadata/finalizers")
            .and_then(Value::as_array_mut)
        {
            finalizers.retain(|f| f != finalizer);
        }
        let mut ownership = stored.ownership.clone();
        let time = now();
        ownership.update(
            "kubelet",
            Scope::Main,
            &stored.object,
            &object,
            ("v1", &time),
        );
        state.store.commit(&key, object, ownership);
        self.finish(state, true);
        true
    }

    /// Runs controllers only on [`FakeApi::settle`], not after every change.
    pub fn with_manual_settle(self) -> FakeApi {
        self.lock().auto_settle = false;
        self
    }

    /// Validates writes of `kind` in `group` (any version) against `schema`, a CRD's
    /// `openAPIV3Schema`. Panics when the schema does not compile.
    pub fn with_schema(self, group: &str, kind: &str, schema: Value) -> FakeApi {
        self.lock().schemas.add(group, kind, None, &schema);
        self
    }

    /// Validates writes of a CustomResourceDefinition's kind against each version's schema.
    /// Panics when `crd` is not a CRD with schemas.
    pub fn with_crd(self, crd: &Value) -> FakeApi {
        self.lock().schemas.add_crd(crd);
        self
    }

    /// [`FakeApi::with_crd`] of a CRD in YAML (as `kubectl apply -f` takes it).
    pub fn with_crd_yaml(self, yaml: &str) -> FakeApi {
        let crd: Value = serde_saphyr::from_str(yaml)
            .unwrap_or_else(|e| panic!("the CRD is not YAML the fake API server reads: {e}"));
        self.with_crd(&crd)
    }

    /// A `kube::Client` whose default namespace is `namespace`, talking to this server. Call
    /// it inside the tokio runtime that will drive the client (see the module documentation).
    pub fn client(&self, namespace: &str) -> kube::Client {
        Self::client_of(self.service(), namespace)
    }

    /// [`FakeApi::client`], whose requests are recorded with `client` as their
    /// [`RecordedRequest::client`]: a test tells two replicas' requests apart, or holds one's.
    pub fn client_as(&self, namespace: &str, client: &str) -> kube::Client {
        let service = FakeService {
            api: self.clone(),
            client: Some(client.into()),
        };
        Self::client_of(service, namespace)
    }

    fn client_of(service: FakeService, namespace: &str) -> kube::Client {
        if tokio::runtime::Handle::try_current().is_err() {
            panic!(
                "FakeApi::client needs a tokio runtime: kube::Client spawns its request buffer \
                 on the current one. Call it inside the runtime that will drive the client: \
                 runtime.block_on(async {{ fake.client(ns) }}) or under runtime.enter()"
            );
        }
        kube::Client::new(service, namespace)
    }

    /// [`FakeApi::service`], its requests recorded as `client`'s.
    pub(crate) fn service_as(&self, client: Option<Arc<str>>) -> FakeService {
        FakeService {
            api: self.clone(),
            client,
        }
    }

    /// The server as a tower `Service`, for `kube::Client::new(service, namespace)`.
    pub fn service(&self) -> FakeService {
        FakeService {
            api: self.clone(),
            client: None,
        }
    }

    // ---- the request log ----

    /// Every request received so far (since the last [`FakeApi::take_requests`] or
    /// [`FakeApi::clear_requests`]), in arrival order. The handle's and the controllers'
    /// changes are not requests and are not in it.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// The requests so far, leaving the log empty.
    pub fn take_requests(&self) -> Vec<RecordedRequest> {
        std::mem::take(&mut self.lock().requests)
    }

    pub fn clear_requests(&self) {
        self.lock().requests.clear();
    }

    /// The [`RecordedRequest::summary`] of every request so far that is not a read (`get`,
    /// `list`, `watch`): what the code under test changed, in order.
    pub fn writes(&self) -> Vec<String> {
        self.lock()
            .requests
            .iter()
            .filter(|r| !matches!(r.verb(), Verb::Get | Verb::List | Verb::Watch))
            .map(RecordedRequest::summary)
            .collect()
    }

    // ---- faults ----

    /// Fails the next `times` requests for which `matcher` holds with `fault`, instead of
    /// answering them (they are still recorded, and change nothing). The matcher runs under
    /// the server's lock: it must not call the `FakeApi`.
    pub fn fail_next(
        &self,
        times: usize,
        matcher: impl Fn(&RecordedRequest) -> bool + Send + Sync + 'static,
        fault: Fault,
    ) {
        self.lock().faults.push(FaultRule {
            remaining: times,
            matcher: Arc::new(matcher),
            fault,
        });
    }

    /// Holds every request for which `matcher` holds, from now until the returned [`Hold`] is
    /// released or dropped: such a request is recorded on arrival and answered (against the
    /// store as it is then) on release. The matcher runs under the server's lock: it must not
    /// call the `FakeApi`.
    pub fn hold(&self, matcher: impl Fn(&RecordedRequest) -> bool + Send + Sync + 'static) -> Hold {
        let (sender, receiver) = tokio::sync::watch::channel(false);
        let held = Arc::new(AtomicUsize::new(0));
        let mut state = self.lock();
        state.next_hold += 1;
        let id = state.next_hold;
        state.holds.push(HoldRule {
            id,
            matcher: Arc::new(matcher),
            release: receiver,
            held: held.clone(),
        });
        Hold {
            id,
            sender,
            held,
            api: self.clone(),
        }
    }

    // ---- objects, as a test (or a person with kubectl) sees them ----

    /// An object by namespace (empty for cluster-scoped kinds) and name.
    pub fn get<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let ar = ApiResource::erase::<K>(&());
        self.get_dynamic(&ar, namespace, name)
            .map(|v| deserialize(v, &format!("{} {namespace}/{name}", ar.kind)))
    }

    /// The objects of a kind in a namespace, by name.
    pub fn list<K>(&self, namespace: &str) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let ar = ApiResource::erase::<K>(&());
        self.list_dynamic(&ar, namespace)
            .into_iter()
            .map(|v| deserialize(v, &ar.kind))
            .collect()
    }

    /// Creates or replaces an object as a person would by hand (manager [`HAND_MANAGER`]):
    /// its namespace and name from its metadata, status included, no resourceVersion check,
    /// no schema. Returns it as stored.
    pub fn put<K>(&self, object: &K) -> K
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let ar = ApiResource::erase::<K>(&());
        let value = serde_json::to_value(object)
            .unwrap_or_else(|e| panic!("a {} does not serialize: {e}", ar.kind));
        deserialize(self.put_dynamic(&ar, value), &ar.kind)
    }

    /// Applies a JSON merge patch (RFC 7386: `null` deletes) to a stored object, status
    /// included, as a person would by hand. Panics when there is no such object.
    pub fn patch<K>(&self, namespace: &str, name: &str, merge_patch: Value) -> K
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let ar = ApiResource::erase::<K>(&());
        deserialize(
            self.patch_dynamic(&ar, namespace, name, merge_patch),
            &ar.kind,
        )
    }

    /// Deletes an object at once (finalizers or not), as if it were gone from the cluster.
    /// Whether there was one.
    pub fn delete<K>(&self, namespace: &str, name: &str) -> bool
    where
        K: kube::Resource<DynamicType = ()>,
    {
        self.delete_dynamic(&ApiResource::erase::<K>(&()), namespace, name)
            .is_some()
    }

    fn key(ar: &ApiResource, namespace: &str, name: &str) -> Key {
        Key {
            resource: Resource::new(&ar.group, &ar.plural),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// [`FakeApi::get`] of any kind, as JSON.
    pub fn get_dynamic(&self, ar: &ApiResource, namespace: &str, name: &str) -> Option<Value> {
        self.lock().store.get(&FakeApi::key(ar, namespace, name))
    }

    /// [`FakeApi::list`] of any kind, as JSON.
    pub fn list_dynamic(&self, ar: &ApiResource, namespace: &str) -> Vec<Value> {
        self.lock()
            .store
            .list(&Resource::new(&ar.group, &ar.plural), Some(namespace))
    }

    /// [`FakeApi::put`] of any kind, as JSON.
    pub fn put_dynamic(&self, ar: &ApiResource, mut object: Value) -> Value {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("FakeApi::put of a {} without metadata.name", ar.kind))
            .to_string();
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if object.get("apiVersion").is_none() {
            object["apiVersion"] = Value::from(ar.api_version.clone());
        }
        if object.get("kind").is_none() {
            object["kind"] = Value::from(ar.kind.clone());
        }
        let key = FakeApi::key(ar, &namespace, &name);
        let mut state = self.lock();
        state
            .store
            .learn_kind(&key.resource, &ar.api_version, &ar.kind);
        let stored = state.store.stored(&key).cloned();
        let out = hand_write(&mut state.store, &key, stored, object, &ar.api_version);
        self.finish(state, true);
        out
    }

    /// [`FakeApi::patch`] of any kind, as JSON.
    pub fn patch_dynamic(
        &self,
        ar: &ApiResource,
        namespace: &str,
        name: &str,
        merge_patch: Value,
    ) -> Value {
        let key = FakeApi::key(ar, namespace, name);
        let mut state = self.lock();
        let stored = state.store.stored(&key).cloned().unwrap_or_else(|| {
            panic!("FakeApi::patch: there is no {} {namespace}/{name}", ar.kind)
        });
        let mut object = stored.object.clone();
        json_patch::merge(&mut object, &merge_patch);
        let out = hand_write(
            &mut state.store,
            &key,
            Some(stored),
            object,
            &ar.api_version,
        );
        self.finish(state, true);
        out
    }

    /// [`FakeApi::delete`] of any kind: the object deleted.
    pub fn delete_dynamic(&self, ar: &ApiResource, namespace: &str, name: &str) -> Option<Value> {
        let mut state = self.lock();
        let deleted = state.store.remove(&FakeApi::key(ar, namespace, name));
        self.finish(state, deleted.is_some());
        deleted
    }

    /// The global resource version: the counter every write bumps.
    pub fn resource_version(&self) -> String {
        self.lock().store.revision()
    }

    // ---- watches ----

    /// Keeps the last `changes` changes (10,000 unless set) for watches that resume from a
    /// `resourceVersion`; a watch from an older one gets a 410 `Expired` `ERROR` event, and
    /// kube's watcher lists again. `0` keeps none: every resumed watch is expired unless
    /// nothing changed since its version.
    pub fn with_watch_history(self, changes: usize) -> FakeApi {
        self.lock().store.watches.set_capacity(changes);
        self
    }

    /// How many watches are open: answered, and their response bodies neither ended (by
    /// `timeoutSeconds`) nor dropped (by the client's stream).
    pub fn active_watches(&self) -> usize {
        self.lock().store.watches.active()
    }

    // ---- controllers and Pods ----

    /// Runs the controllers now (with [`FakeApi::with_manual_settle`]; otherwise they run after
    /// every change anyway).
    pub fn settle(&self) {
        let mut state = self.lock();
        if let Some(start) = state.controller {
            let finalizer = state.pod_finalizer.clone();
            controller::settle(&mut state.store, start, finalizer.as_deref());
        }
        self.finish_events(state);
    }

    /// Calls `listener` with every Pod added or deleted from now on, after the change, outside
    /// the server's lock (it may call the `FakeApi`), on the thread that made the change.
    /// Keep it quick: a request waits for its listeners.
    pub fn on_pods_changed(&self, listener: impl Fn(&PodEvent) + Send + Sync + 'static) {
        self.inner
            .listeners
            .lock()
            .expect("the fake API server's listener lock was poisoned")
            .push(Arc::new(listener));
    }

    /// Every Pod added or deleted since the last call, in order.
    pub fn take_pod_events(&self) -> Vec<PodEvent> {
        std::mem::take(&mut self.lock().pod_log)
    }

    /// Marks a Pod ready (`Running`, `Ready` and `ContainersReady` true) or not, as its
    /// kubelet would. Panics when there is no such Pod.
    pub fn set_pod_ready(&self, namespace: &str, name: &str, ready: bool) {
        let key = Key {
            resource: Resource::new("", "pods"),
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        let mut state = self.lock();
        let stored = state.store.stored(&key).cloned().unwrap_or_else(|| {
            panic!("FakeApi::set_pod_ready: there is no Pod {namespace}/{name}")
        });
        let mut object = stored.object.clone();
        let truth = if ready { "True" } else { "False" };
        let mut conditions: Vec<Value> = object
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for type_ in ["ContainersReady", "Ready"] {
            match conditions.iter_mut().find(|c| c["type"] == type_) {
                Some(c) if c["status"] == truth => {}
                Some(c) => {
                    c["status"] = Value::from(truth);
                    c["lastTransitionTime"] = Value::from(now());
                }
                None => conditions
                    .push(json!({"type": type_, "status": truth, "lastTransitionTime": now()})),
            }
        }
        object["status"]["conditions"] = Value::Array(conditions);
        if ready {
            object["status"]["phase"] = Value::from("Running");
        }
        let mut ownership = stored.ownership.clone();
        let time = now();
        ownership.update(
            "kubelet",
            Scope::Status,
            &stored.object,
            &object,
            ("v1", &time),
        );
        state.store.commit(&key, object, ownership);
        self.finish(state, true);
    }

    /// After a change: the controllers (unless settled by hand), then the Pod events, which
    /// are logged and, outside the lock, given to the listeners.
    fn finish(&self, mut state: MutexGuard<'_, State>, mutated: bool) {
        if mutated
            && state.auto_settle
            && let Some(start) = state.controller
        {
            let finalizer = state.pod_finalizer.clone();
            controller::settle(&mut state.store, start, finalizer.as_deref());
        }
        self.finish_events(state);
    }

    fn finish_events(&self, mut state: MutexGuard<'_, State>) {
        let events = std::mem::take(&mut state.store.pod_events);
        state.pod_log.extend(events.iter().cloned());
        drop(state);
        if events.is_empty() {
            return;
        }
        let listeners = self
            .inner
            .listeners
            .lock()
            .expect("the fake API server's listener lock was poisoned")
            .clone();
        for event in &events {
            for listener in &listeners {
                listener(event);
            }
        }
    }

    fn set_status(&self, seq: u64, status: Option<u16>) {
        let mut state = self.lock();
        if let Some(r) = state.requests.iter_mut().rev().find(|r| r.seq == seq) {
            r.status = status;
        }
    }

    async fn serve(
        self,
        request: Request<Body>,
        client: Option<Arc<str>>,
    ) -> Result<Response<FakeBody>, BoxError> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await?;
        let (recorded, hold, fault) = {
            let mut state = self.lock();
            state.seq += 1;
            let mut recorded = RecordedRequest::new(&parts, &bytes, state.seq);
            recorded.client = client.map(|c| c.to_string());
            // Authorization comes first, as in the API server: a denied request is neither
            // held nor failed by a fault.
            if let Some(denied) = rbac::denied(state.rbac.as_ref(), &state.store, &recorded) {
                recorded.status = Some(denied.code);
                state.requests.push(recorded);
                return respond(denied.code, &denied.status());
            }
            let hold = state
                .holds
                .iter()
                .find(|h| (h.matcher)(&recorded))
                .map(|h| (h.release.clone(), h.held.clone()));
            let fault = state
                .faults
                .iter_mut()
                .find(|f| f.remaining > 0 && (f.matcher)(&recorded))
                .map(|f| {
                    f.remaining -= 1;
                    f.fault.clone()
                });
            state.faults.retain(|f| f.remaining > 0);
            state.requests.push(recorded.clone());
            (recorded, hold, fault)
        };
        if let Some((mut release, held)) = hold {
            held.fetch_add(1, Ordering::SeqCst);
            // An error means the Hold is gone, which releases too.
            let _ = release.wait_for(|released| *released).await;
            held.fetch_sub(1, Ordering::SeqCst);
        }
        match fault {
            Some(Fault::Status {
                code,
                reason,
                message,
            }) => {
                self.set_status(recorded.seq, Some(code));
                let error = server::ApiError::new(code, &reason, message);
                return respond(code, &error.status());
            }
            Some(Fault::Transport(message)) => {
                return Err(message.into());
            }
            None => {}
        }
        let mut state = self.lock();
        if recorded.verb() == Verb::Watch {
            let opened = watch::open(&mut state.store, &recorded);
            let code = opened.as_ref().map_or_else(|e| e.code, |_| 200);
            if let Some(r) = state
                .requests
                .iter_mut()
                .rev()
                .find(|r| r.seq == recorded.seq)
            {
                r.status = Some(code);
            }
            drop(state);
            return match opened {
                Ok(opened) => Ok(Response::builder()
                    .status(200)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(FakeBody::watch(opened))?),
                Err(error) => respond(error.code, &error.status()),
            };
        }
        let state_ref = &mut *state;
        let (code, body, mutated) =
            match server::handle(&mut state_ref.store, &state_ref.schemas, &recorded) {
                Ok(reply) => (reply.code, reply.body, reply.mutated),
                Err(error) => (error.code, server::Body::Object(error.status()), false),
            };
        if let Some(r) = state
            .requests
            .iter_mut()
            .rev()
            .find(|r| r.seq == recorded.seq)
        {
            r.status = Some(code);
        }
        self.finish(state, mutated);
        respond(code, &body)
    }
}

/// A write by hand: ownership by [`HAND_MANAGER`] of what changed, main and status alike.
fn hand_write(
    store: &mut Store,
    key: &Key,
    stored: Option<store::Stored>,
    object: Value,
    api_version: &str,
) -> Value {
    let (old, mut ownership) = match stored {
        Some(s) => (s.object, s.ownership),
        None => (json!({}), Ownership::default()),
    };
    let time = now();
    ownership.update(
        HAND_MANAGER,
        Scope::Main,
        &old,
        &object,
        (api_version, &time),
    );
    ownership.update(
        HAND_MANAGER,
        Scope::Status,
        &old,
        &object,
        (api_version, &time),
    );
    store.commit(key, object, ownership)
}

fn respond(code: u16, body: &impl serde::Serialize) -> Result<Response<FakeBody>, BoxError> {
    let bytes = serde_json::to_vec(body)?;
    Ok(Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(FakeBody::full(bytes))?)
}

/// The body of the fake API server's responses: one JSON document, or a watch's stream of
/// events, one JSON line each, that ends with the watch. An `http_body::Body`, as
/// `kube::Client::new` takes (kube's own `Body` cannot be made to stream outside kube).
pub struct FakeBody {
    kind: BodyKind,
}

enum BodyKind {
    Full(Option<bytes::Bytes>),
    Watch(Box<watch::WatchBody>),
}

impl FakeBody {
    /// A body of `bytes`, whole (what every answer but a watch's is).
    pub fn full(bytes: Vec<u8>) -> FakeBody {
        FakeBody {
            kind: BodyKind::Full(Some(bytes.into())),
        }
    }

    fn watch(opened: watch::Opened) -> FakeBody {
        FakeBody {
            kind: BodyKind::Watch(Box::new(watch::WatchBody::new(opened))),
        }
    }

    /// Whether this is a watch's stream.
    pub fn is_watch(&self) -> bool {
        matches!(self.kind, BodyKind::Watch(_))
    }

    /// The whole body (of a watch: once the watch ends), as `kube::client::Body::collect_bytes`.
    pub async fn collect_bytes(mut self) -> Result<bytes::Bytes, BoxError> {
        let mut out = Vec::new();
        while let Some(frame) =
            std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut self), cx)).await
        {
            if let Ok(data) = frame?.into_data() {
                out.extend_from_slice(&data);
            }
        }
        Ok(out.into())
    }
}

impl fmt::Debug for FakeBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            BodyKind::Full(_) => "Full",
            BodyKind::Watch(_) => "Watch",
        };
        f.debug_struct("FakeBody").field("kind", &kind).finish()
    }
}

impl http_body::Body for FakeBody {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            BodyKind::Full(bytes) => {
                Poll::Ready(bytes.take().map(|b| Ok(http_body::Frame::data(b))))
            }
            BodyKind::Watch(body) => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Full(bytes) => bytes.is_none(),
            BodyKind::Watch(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            BodyKind::Full(Some(bytes)) => http_body::SizeHint::with_exact(bytes.len() as u64),
            BodyKind::Full(None) => http_body::SizeHint::with_exact(0),
            BodyKind::Watch(body) => body.size_hint(),
        }
    }
}

/// Requests held by [`FakeApi::hold`], until [`Hold::release`] or drop.
#[must_use = "a Hold releases its requests when dropped"]
pub struct Hold {
    id: u64,
    sender: tokio::sync::watch::Sender<bool>,
    held: Arc<AtomicUsize>,
    api: FakeApi,
}

impl Hold {
    /// How many requests are waiting now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Waits until at least `count` requests are waiting; panics after [`crate::PATIENCE`].
    pub async fn wait_held(&self, count: usize) {
        let deadline = Instant::now() + crate::PATIENCE;
        while self.held() < count {
            if Instant::now() > deadline {
                panic!(
                    "waited {:?} for {count} held requests; {} are held",
                    crate::PATIENCE,
                    self.held()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// Lets the held requests go on, and stops holding new ones.
    pub fn release(self) {}
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Ok(mut state) = self.api.inner.state.lock() {
            state.holds.retain(|h| h.id != self.id);
        }
        let _ = self.sender.send(true);
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold").field("held", &self.held()).finish()
    }
}

/// [`FakeApi`] as a `tower::Service`, the stack `kube::Client::new` takes.
#[derive(Clone, Debug)]
pub struct FakeService {
    api: FakeApi,
    client: Option<Arc<str>>,
}

impl tower::Service<Request<Body>> for FakeService {
    type Response = Response<FakeBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<FakeBody>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        Box::pin(self.api.clone().serve(request, self.client.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded() {
        assert_eq!(percent_decode("app%3Dweb%2Ctier+x"), "app=web,tier x");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
