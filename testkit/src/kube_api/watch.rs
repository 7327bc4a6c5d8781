//! Watches: the log of recent changes, the open watches the store feeds as it changes, and
//! the streaming body of a watch response.
//!
//! Every change the store makes (create, update, deletion mark, removal; by a request, the
//! handle or a controller) is a [`Change`] with the global `resourceVersion` it got. The store
//! keeps the last few thousand of them ([`DEFAULT_HISTORY`]) and, under its lock, gives each
//! to every open watch whose filter it concerns, as a line of JSON on an unbounded channel:
//! nothing waits on a reader. A watch's response body reads that channel; when the body is
//! dropped (the client's stream is), the channel closes and the store forgets the watch at
//! its next change or count.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tower::BoxError;

use super::RecordedRequest;
use super::selector::{FieldSelector, LabelSelector};
use super::server::ApiError;
use super::store::{Key, Resource, Store};

/// How many changes the store keeps for watches resuming from a `resourceVersion`, unless
/// [`super::FakeApi::with_watch_history`] says otherwise.
pub(crate) const DEFAULT_HISTORY: usize = 10_000;

/// One change of one object.
#[derive(Debug)]
pub(crate) struct Change {
    revision: u64,
    key: Key,
    /// `metadata.labels` before the change (`Null` when there were none); `None` when the
    /// object did not exist.
    before: Option<Value>,
    /// The object after the change; for a removal, its last state with the removal's
    /// `resourceVersion`.
    object: Arc<Value>,
    removed: bool,
}

impl Change {
    pub(crate) fn new(
        revision: u64,
        key: &Key,
        before: Option<Value>,
        object: Value,
        removed: bool,
    ) -> Change {
        Change {
            revision,
            key: key.clone(),
            before,
            object: Arc::new(object),
            removed,
        }
    }
}

/// `metadata.labels` of an object, for [`Change::new`].
pub(crate) fn labels_of(object: &Value) -> Value {
    object
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or(Value::Null)
}

/// Which objects a watch is about: the resource, the namespace (`None`: all) and selectors.
#[derive(Debug, Clone)]
struct Filter {
    resource: Resource,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn concerns(&self, key: &Key) -> bool {
        key.resource == self.resource
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == key.namespace)
    }

    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// The event `change` is for this watch, if any: an object that starts matching is
    /// `ADDED`, one that stops (removed, or its labels changed) `DELETED`.
    fn event(&self, change: &Change) -> Option<&'static str> {
        if !self.concerns(&change.key) {
            return None;
        }
        let was = change.before.as_ref().is_some_and(|labels| {
            let before = json!({"metadata": {
                "name": change.key.name,
                "namespace": change.key.namespace,
                "labels": labels,
            }});
            self.matches(&before)
        });
        let is = !change.removed && self.matches(&change.object);
        match (was, is) {
            (false, true) => Some("ADDED"),
            (true, true) => Some("MODIFIED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        }
    }
}

/// One line of a watch stream.
fn line(kind: &str, object: &Value) -> Bytes {
    let mut out = format!("{{\"type\":\"{kind}\",\"object\":").into_bytes();
    // A Value always serializes.
    let _ = serde_json::to_writer(&mut out, object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// An event on its way to a watch's body: the `resourceVersion` it carries, and its line.
type Event = (u64, Bytes);

struct Watcher {
    filter: Filter,
    /// Changes up to this revision are not for the watch (it asked for a newer version).
    after: u64,
    sender: mpsc::UnboundedSender<Event>,
    /// The revision up to which every change was given to the watch (or did not concern it),
    /// for its bookmark.
    progress: Arc<AtomicU64>,
}

/// The change log and the open watches.
pub(crate) struct Watches {
    log: VecDeque<Change>,
    capacity: usize,
    /// Every change after this revision is in the log.
    since: u64,
    watchers: Vec<Watcher>,
}

impl Default for Watches {
    fn default() -> Self {
        Watches {
            log: VecDeque::new(),
            capacity: DEFAULT_HISTORY,
            since: 0,
            watchers: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("log", &self.log.len())
            .field("since", &self.since)
            .field("watchers", &self.watchers.len())
            .finish()
    }
}

impl Watches {
    /// Keeps the last `capacity` changes from now on.
    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
        self.trim();
    }

    fn trim(&mut self) {
        while self.log.len() > self.capacity {
            if let Some(change) = self.log.pop_front() {
                self.since = change.revision;
            }
        }
    }

    /// Gives a change to the open watches it concerns, and logs it.
    pub(crate) fn record(&mut self, change: Change) {
        self.watchers.retain(|watcher| {
            let event = (change.revision > watcher.after)
                .then(|| watcher.filter.event(&change))
                .flatten();
            if let Some(kind) = event {
                let event = (change.revision, line(kind, &change.object));
                if watcher.sender.send(event).is_err() {
                    return false; // the body is gone: forget the watch
                }
            } else if watcher.sender.is_closed() {
                return false;
            }
            watcher
                .progress
                .fetch_max(change.revision, Ordering::SeqCst);
            true
        });
        self.log.push_back(change);
        self.trim();
    }

    /// How many watches are open (their bodies not dropped nor ended).
    pub(crate) fn active(&mut self) -> usize {
        self.watchers.retain(|w| !w.sender.is_closed());
        self.watchers.len()
    }
}

/// What a watch answers with: its events so far and those to come.
pub(crate) struct Opened {
    receiver: mpsc::UnboundedReceiver<Event>,
    timeout: Option<Duration>,
    bookmark: Option<(String, String)>,
    progress: Arc<AtomicU64>,
}

fn query<'r>(request: &'r RecordedRequest, name: &str) -> Option<&'r str> {
    request.query.get(name).map(String::as_str)
}

/// A `Status` as a watch's `ERROR` event carries it.
fn expired(wanted: u64, oldest: u64) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("too old resource version: {wanted} ({oldest})"),
        "reason": "Expired",
        "code": 410,
    })
}

/// Opens a watch on a collection (under the server's lock): the initial events (the current
/// objects, or the changes since the `resourceVersion` asked for, or a 410 `ERROR` when those
/// are no longer in the log) are queued, and the watch registered for the changes to come.
pub(crate) fn open(store: &mut Store, request: &RecordedRequest) -> Result<Opened, ApiError> {
    let target = request
        .target()
        .ok_or_else(|| ApiError::new(404, "NotFound", "not a resource path"))?;
    let filter = Filter {
        resource: Resource::new(&target.group, &target.resource),
        namespace: target.namespace.clone(),
        labels: LabelSelector::parse(query(request, "labelSelector").unwrap_or_default())
            .map_err(|e| ApiError::new(400, "BadRequest", e))?,
        fields: FieldSelector::parse(query(request, "fieldSelector").unwrap_or_default())
            .map_err(|e| ApiError::new(400, "BadRequest", e))?,
    };
    let timeout = match query(request, "timeoutSeconds") {
        None | Some("" | "0") => None,
        Some(text) => Some(Duration::from_secs(text.parse().map_err(|_| {
            ApiError::new(
                400,
                "BadRequest",
                format!("invalid timeoutSeconds {text:?}"),
            )
        })?)),
    };
    let initial_events = query(request, "sendInitialEvents") == Some("true");
    let from = match query(request, "resourceVersion") {
        _ if initial_events => None,
        None | Some("" | "0") => None,
        Some(text) => Some(text.parse::<u64>().map_err(|_| {
            ApiError::new(
                400,
                "BadRequest",
                format!("invalid resourceVersion {text:?}: the fake API server's are numbers"),
            )
        })?),
    };
    let api_version = if target.group.is_empty() {
        target.version.clone()
    } else {
        format!("{}/{}", target.group, target.version)
    };
    let kind = store
        .kind(&filter.resource)
        .map(|(_, kind)| kind.clone())
        .unwrap_or_default();
    let revision: u64 = store.revision().parse().unwrap_or_default();
    let (sender, receiver) = mpsc::unbounded_channel();
    let progress = Arc::new(AtomicU64::new(revision));
    let bookmarks = query(request, "allowWatchBookmarks") == Some("true");
    let opened = Opened {
        receiver,
        timeout,
        bookmark: bookmarks.then(|| (api_version.clone(), kind.clone())),
        progress: progress.clone(),
    };
    let watches = &store.watches;
    let mut after = 0;
    match from {
        Some(wanted) if wanted < watches.since => {
            // Gone from the log: the client lists again. The stream ends after the error.
            let _ = sender.send((revision, line("ERROR", &expired(wanted, watches.since))));
            return Ok(opened);
        }
        Some(wanted) => {
            after = wanted;
            for change in watches.log.iter().filter(|c| c.revision > wanted) {
                if let Some(kind) = filter.event(change) {
                    let _ = sender.send((change.revision, line(kind, &change.object)));
                }
            }
        }
        None => {
            for object in store.list_shared(&filter.resource, filter.namespace.as_deref()) {
                if filter.matches(&object) {
                    let _ = sender.send((revision, line("ADDED", &object)));
                }
            }
            if initial_events {
                let mut mark = bookmark(&api_version, &kind, revision);
                mark["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                let _ = sender.send((revision, line("BOOKMARK", &mark)));
            }
        }
    }
    progress.fetch_max(after, Ordering::SeqCst);
    store.watches.watchers.push(Watcher {
        filter,
        after,
        sender,
        progress,
    });
    Ok(opened)
}

fn bookmark(api_version: &str, kind: &str, revision: u64) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"resourceVersion": revision.to_string()},
    })
}

/// The body of a watch response: the queued events, then those to come, until the
/// `timeoutSeconds` elapse (then a `BOOKMARK`, when allowed) or the server ends it.
pub(crate) struct WatchBody {
    receiver: mpsc::UnboundedReceiver<Event>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    timed_out: bool,
    bookmark: Option<(String, String)>,
    progress: Arc<AtomicU64>,
    /// The highest `resourceVersion` given so far.
    last: u64,
    done: bool,
}

impl WatchBody {
    pub(crate) fn new(opened: Opened) -> WatchBody {
        // A timeout needs tokio's timer: kube's clients run on tokio anyway.
        let deadline = opened
            .timeout
            .filter(|_| tokio::runtime::Handle::try_current().is_ok())
            .map(|timeout| Box::pin(tokio::time::sleep(timeout)));
        WatchBody {
            receiver: opened.receiver,
            deadline,
            timed_out: false,
            bookmark: opened.bookmark,
            progress: opened.progress,
            last: 0,
            done: false,
        }
    }

    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(deadline) = &mut self.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            // No more events in; those queued still go out.
            self.deadline = None;
            self.timed_out = true;
            self.receiver.close();
        }
        match self.receiver.poll_recv(cx) {
            Poll::Ready(Some((revision, bytes))) => {
                self.last = self.last.max(revision);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Poll::Ready(None) => {
                self.done = true;
                match (&self.bookmark, self.timed_out) {
                    (Some((api_version, kind)), true) => {
                        let revision = self.progress.load(Ordering::SeqCst).max(self.last);
                        let mark = bookmark(api_version, kind, revision);
                        Poll::Ready(Some(Ok(Frame::data(line("BOOKMARK", &mark)))))
                    }
                    _ => Poll::Ready(None),
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        self.done
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
