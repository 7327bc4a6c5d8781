//! The [`CutoverStore`] of `plumber daemon`: each topology's record in the status of its
//! `Topology` resource (`status.record`), so a daemon replica that takes the lease over
//! resumes a cutover where the previous holder stopped.
//!
//! # Guarantees
//! - **Never a lost update.** A save replaces the status with the `resourceVersion` of the
//!   object as this store last read or wrote it as a precondition, so it succeeds only if
//!   nobody wrote the object since (no read before each write: one request per save, not
//!   two). When somebody did, it reads the object again and checks that the record in it is
//!   still the one this store last read or wrote: a record another replica wrote meanwhile
//!   is a [`Error::Conflict`], nothing is written, and the engine's next step starts from a
//!   fresh load; a write by another writer of the same status (the observer) that left the
//!   record alone is retried at once, on the object just read.
//! - **Only the lease holder writes**: every write first asks the guard it was given.
//! - The topology's last [`HISTORY_KEPT`] moves are kept beside the record, for
//!   `plumber history`.
//!
//! Calls block the calling thread on the tokio runtime the client lives on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use serde::{Deserialize, Serialize};

use super::{CutoverStore, Error, FORMAT, HistoryEntry, Result, TopologyRecord};
use crate::runtime::kube::cache::{Cache, Kept};
use crate::runtime::kube::crd::{Topology, TopologySpec, TopologyStatus};
use crate::runtime::kube::render::{MANAGED_BY, Source, TOPOLOGY};
use crate::runtime::{Guard, Term};
use kube::Resource as _;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Moves kept per topology.
pub const HISTORY_KEPT: usize = 100;

/// Conflicts with other writers of the status retried in one save.
const STATUS_RETRIES: usize = 5;

/// What `status.record` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusRecord {
    #[serde(flatten)]
    record: TopologyRecord,
    #[serde(default)]
    history: Vec<HistoryEntry>,
}

/// A Topology object as this store last read or wrote it (`None`: there was none), and the
/// lease term it did so in.
/// A Topology as last read or written (`None`: there was none), shared with the watch cache
/// when there is one, and the lease term it was read or written in.
type Known = (Option<Arc<Kept<Topology>>>, Option<u64>);

pub struct TopologyStore {
    client: Client,
    namespace: String,
    source: Source,
    guard: Arc<Guard>,
    /// The tokio runtime the client lives on (its connection tasks run there).
    handle: tokio::runtime::Handle,
    /// Each topology's object as this store last read or wrote it (`None`: there was none),
    /// without its managed fields: its record is the one a save expects to find, and its
    /// `resourceVersion` the precondition of the next write; with the lease term it was
    /// read or written in.
    known: Mutex<BTreeMap<String, Known>>,
    /// The lease's term ([`TopologyStore::with_term`]); `None`: every load reads the object.
    term: Option<Arc<Term>>,
    /// The observed status last published of each topology.
    published: Mutex<BTreeMap<String, TopologyStatus>>,
    /// Who the cutover Events say reported them.
    reporter: Reporter,
    /// The Topologies as a watch keeps them ([`TopologyStore::with_cache`]): what
    /// [`CutoverStore::topologies`] reads instead of listing them.
    cache: Option<Arc<Cache<Topology>>>,
    /// The records read from the cache, with the `resourceVersion` they were read at: a
    /// look parses only the records that changed.
    parsed: Mutex<BTreeMap<String, (String, TopologyRecord)>>,
}

impl TopologyStore {
    /// A store on `client`, whose tasks run on the tokio runtime of `handle` (see
    /// [`KubeRuntime::connect`](crate::runtime::kube::apply::KubeRuntime::connect)).
    pub fn new(
        client: Client,
        handle: tokio::runtime::Handle,
        namespace: &str,
        source: Source,
        guard: Arc<Guard>,
    ) -> Result<Self> {
        Ok(TopologyStore {
            client,
            namespace: namespace.to_owned(),
            source,
            guard,
            handle,
            known: Mutex::new(BTreeMap::new()),
            term: None,
            published: Mutex::new(BTreeMap::new()),
            reporter: Reporter {
                controller: "plumber".into(),
                instance: std::env::var("HOSTNAME").ok(),
            },
            cache: None,
            parsed: Mutex::new(BTreeMap::new()),
        })
    }

    /// Loads a record without reading its object when this store read or wrote it in the
    /// lease term it holds now: nobody else writes during a term, so the engine's load before
    /// each action costs no request (it did one per action). A record written by someone
    /// all the same (by hand) makes the next save a conflict, as before: never overwritten.
    pub fn with_term(mut self, term: Arc<Term>) -> Self {
        self.term = Some(term);
        self
    }

    /// Reads the topologies' records from `cache` (the runtime's, which watches the same
    /// Topologies) instead of listing them: what the observer and the follower look at
    /// every few seconds. The engine's loads still read the object itself.
    pub fn with_cache(mut self, cache: Arc<Cache<Topology>>) -> Self {
        self.cache = Some(cache);
        self
    }

    fn api(&self) -> Api<Topology> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn get(&self, topology: &str) -> Result<Option<Topology>> {
        self.handle
            .block_on(self.api().get_opt(topology))
            .map_err(|e| kube_error("read", topology, e))
    }

    fn remember(&self, topology: &str, object: Option<Topology>) {
        // One copy, the cache's when there is one.
        let object = object.and_then(|object| match &self.cache {
            Some(cache) => cache.written(object),
            None => Kept::of_object(object),
        });
        let term = self.term.as_ref().and_then(|term| term());
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(topology.to_owned(), (object, term));
    }

    /// Forgets what this store knew of a Topology it deleted (or found gone).
    fn forgotten(&self, topology: &str) {
        self.remember(topology, None);
        if let Some(cache) = &self.cache {
            cache.deleted(topology);
        }
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(topology);
        self.parsed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(topology);
    }

    fn read(&self, topology: &str) -> Result<StatusRecord> {
        let object = self.get(topology)?;
        let raw = record_of(object.as_ref());
        self.remember(topology, object);
        parse(topology, raw)
    }

    /// The object as this store last read or wrote it (`None` inside: it did not exist), and
    /// the record it held; `None` when this store never looked.
    fn last_seen(&self, topology: &str) -> Option<(Option<Topology>, Option<serde_json::Value>)> {
        let (known, _) = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topology)
            .cloned()?;
        let known = known.and_then(|kept| kept.object());
        let record = record_of(known.as_ref());
        Some((known, record))
    }

    /// The next load of `topology` reads its object, whatever the term.
    fn stale(&self, topology: &str) {
        if let Some((_, term)) = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(topology)
        {
            *term = None;
        }
    }

    /// The record as this store read or wrote it in the lease term held now, if it did.
    fn current(&self, topology: &str) -> Option<Option<serde_json::Value>> {
        let now = self.term.as_ref().and_then(|term| term())?;
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        match known.get(topology)? {
            (object, Some(term)) if *term == now => {
                Some(object.as_ref().and_then(|kept| kept_record(kept)))
            }
            _ => None,
        }
    }

    /// Read, change and write the status record of `topology`, with the guarantees above.
    fn write(&self, topology: &str, change: impl Fn(&mut StatusRecord)) -> Result<()> {
        if !(self.guard)() {
            return Err(Error::NotLeader {
                topology: topology.to_owned(),
            });
        }
        let (last_seen, expected) = self.last_seen(topology).unzip();
        let written = self
            .replace_status(
                topology,
                "write the record of",
                last_seen.flatten(),
                |object| {
                    let raw = record_of(Some(object));
                    if let Some(known) = &expected
                        && *known != raw
                    {
                        return Err(Error::Conflict {
                            topology: topology.to_owned(),
                        });
                    }
                    let mut record = parse(topology, raw)?;
                    change(&mut record);
                    let value = serde_json::to_value(&record)
                        .map_err(|e| api("encode the record of", topology, e.to_string(), false))?;
                    object
                        .status
                        .get_or_insert_with(TopologyStatus::default)
                        .record = Some(value);
                    Ok(())
                },
            )
            // Whatever failed (a conflict above all), the next load reads the object again.
            .inspect_err(|_| self.stale(topology))?;
        self.remember(topology, Some(written));
        Ok(())
    }

    /// Writes the status `change` makes of the object, trying first the object as last seen
    /// (one request when nobody wrote since; that write fails if somebody did), then reading
    /// it again (creating it when gone) after each 409, up to [`STATUS_RETRIES`] reads. A 404
    /// of the object as last seen means it was deleted since: the read creates it.
    fn replace_status(
        &self,
        topology: &str,
        operation: &'static str,
        mut last_seen: Option<Topology>,
        mut change: impl FnMut(&mut Topology) -> Result<()>,
    ) -> Result<Topology> {
        let mut reads = 0;
        loop {
            let mut object = match last_seen.take() {
                Some(object) => object,
                None if reads == STATUS_RETRIES => break,
                None => {
                    reads += 1;
                    match self.get(topology)? {
                        Some(object) => object,
                        None => self.create(topology)?,
                    }
                }
            };
            change(&mut object)?;
            match self.handle.block_on(self.api().replace_status(
                topology,
                &PostParams::default(),
                &object,
            )) {
                Ok(written) => return Ok(written),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(kube::Error::Api(status)) if status.code == 404 && reads == 0 => continue,
                Err(error) => return Err(kube_error(operation, topology, error)),
            }
        }
        Err(api(
            operation,
            topology,
            format!("it changed {STATUS_RETRIES} times while writing"),
            true,
        ))
    }

    fn create(&self, topology: &str) -> Result<Topology> {
        let mut object = Topology::new(
            topology,
            TopologySpec {
                topology: topology.to_owned(),
                repository: self.source.repository.clone(),
                git_ref: self.source.git_ref.clone(),
            },
        );
        object.metadata.labels = Some(BTreeMap::from([
            (MANAGED_BY.to_owned(), "plumber".to_owned()),
            (TOPOLOGY.to_owned(), topology.to_owned()),
        ]));
        match self
            .handle
            .block_on(self.api().create(&PostParams::default(), &object))
        {
            Ok(created) => Ok(created),
            Err(kube::Error::Api(status)) if status.code == 409 => self
                .get(topology)?
                .ok_or_else(|| api("create", topology, "created and gone".into(), true)),
            Err(error) => Err(kube_error("create", topology, error)),
        }
    }
}

impl TopologyStore {
    /// Records a Kubernetes Event on the topology's resource (`kubectl describe topology`
    /// lists them); dropped before the resource exists (the engine creates it with its
    /// first save).
    ///
    /// Only the lease holder records (a deposed one's report of its last actions would
    /// interleave with its successor's).
    pub fn record_event(&self, topology: &str, reason: &str, note: &str) -> Result<()> {
        if !(self.guard)() {
            return Ok(());
        }
        let Some(object) = self.get(topology)? else {
            return Ok(());
        };
        let reference = object.object_ref(&());
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        self.handle
            .block_on(recorder.publish(
                &Event {
                    type_: EventType::Normal,
                    reason: reason.into(),
                    note: Some(note.chars().take(1000).collect()),
                    action: "Cutover".into(),
                    secondary: None,
                },
                &reference,
            ))
            .map_err(|error| kube_error("record an event of", topology, error))
    }

    /// Writes the observed fields of a topology's status, keeping its record; nothing when
    /// they did not change since the last write, or when this replica does not hold the
    /// lease (the holder's status is the one shown).
    pub fn publish_status(&self, topology: &str, observed: TopologyStatus) -> Result<()> {
        if !(self.guard)() {
            return Ok(());
        }
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if published.get(topology) == Some(&observed) {
            return Ok(());
        }
        let (last_seen, expected) = self.last_seen(topology).unzip();
        let written = self.replace_status(
            topology,
            "write the status of",
            last_seen.flatten(),
            |object| {
                object.status = Some(TopologyStatus {
                    observed_generation: object.metadata.generation,
                    record: record_of(Some(object)),
                    ..observed.clone()
                });
                Ok(())
            },
        )?;
        // Remembered only with the record a save expects: a record another replica wrote
        // must still make the next save a conflict.
        if expected
            .as_ref()
            .is_none_or(|e| *e == record_of(Some(&written)))
        {
            self.remember(topology, Some(written));
        }
        published.insert(topology.to_owned(), observed);
        Ok(())
    }
}

/// The record in an object's status.
/// The record of a cached Topology's status, decoded alone.
#[derive(serde::Deserialize)]
struct RecordOnly {
    record: Option<serde_json::Value>,
}

fn kept_record(object: &Kept<Topology>) -> Option<serde_json::Value> {
    object.status::<RecordOnly>().and_then(|s| s.record)
}

fn record_of(object: Option<&Topology>) -> Option<serde_json::Value> {
    object
        .and_then(|o| o.status.as_ref())
        .and_then(|s| s.record.clone())
}

fn parse(topology: &str, raw: Option<serde_json::Value>) -> Result<StatusRecord> {
    let Some(raw) = raw else {
        return Ok(StatusRecord {
            record: TopologyRecord::default(),
            history: Vec::new(),
        });
    };
    let found = raw.get("format").and_then(serde_json::Value::as_u64);
    if found != Some(u64::from(FORMAT)) {
        return Err(Error::Format {
            path: format!("Topology {topology} status.record").into(),
            found: found.and_then(|f| u32::try_from(f).ok()).unwrap_or(0),
        });
    }
    serde_json::from_value(raw).map_err(|source| Error::Damaged {
        path: format!("Topology {topology} status.record").into(),
        source,
    })
}

fn api(operation: &'static str, topology: &str, message: String, retryable: bool) -> Error {
    Error::Api {
        operation,
        topology: topology.to_owned(),
        message,
        retryable,
    }
}

fn kube_error(operation: &'static str, topology: &str, error: kube::Error) -> Error {
    let retryable = match &error {
        kube::Error::Api(status) => !matches!(status.code, 400 | 403 | 404 | 422),
        _ => true,
    };
    api(operation, topology, error.to_string(), retryable)
}

impl CutoverStore for TopologyStore {
    fn load(&self, topology: &str) -> Result<TopologyRecord> {
        if let Some(raw) = self.current(topology) {
            return Ok(parse(topology, raw)?.record);
        }
        Ok(self.read(topology)?.record)
    }

    fn save(&self, topology: &str, record: &TopologyRecord) -> Result<()> {
        self.write(topology, |status| status.record = record.clone())
    }

    fn topologies(&self) -> Result<BTreeMap<String, Result<TopologyRecord>>> {
        if let Some(cache) = &self.cache {
            let all = cache.all();
            let mut parsed = self.parsed.lock().unwrap_or_else(PoisonError::into_inner);
            parsed.retain(|name, _| all.contains_key(name));
            return Ok(all
                .into_iter()
                .map(|(name, object)| {
                    let version = object.meta().resource_version.clone();
                    if let (Some(version), Some((seen, record))) = (&version, parsed.get(&name))
                        && version == seen
                    {
                        return (name, Ok(record.clone()));
                    }
                    let raw = kept_record(&object);
                    let record = parse(&name, raw).map(|s| s.record);
                    if let (Ok(record), Some(version)) = (&record, version) {
                        parsed.insert(name.clone(), (version, record.clone()));
                    }
                    (name, record)
                })
                .collect());
        }
        let list = self
            .handle
            .block_on(
                self.api()
                    .list(&ListParams::default().labels(&format!("{MANAGED_BY}=plumber"))),
            )
            .map_err(|e| kube_error("list", "-", e))?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|object| {
                let name = object.metadata.name.clone()?;
                let raw = object.status.and_then(|s| s.record);
                let record = parse(&name, raw).map(|s| s.record);
                Some((name, record))
            })
            .collect())
    }

    /// Deletes the preview's Topology object, as this store last read or wrote it (its
    /// `resourceVersion` and uid as preconditions: a record another replica wrote since is a
    /// [`Error::Conflict`], nothing deleted), and only one Plumber created for that name.
    fn forget(&self, preview: &str) -> Result<()> {
        super::only_previews(preview)?;
        if !(self.guard)() {
            return Err(Error::NotLeader {
                topology: preview.to_owned(),
            });
        }
        let object = match self.last_seen(preview) {
            Some((known, _)) => known,
            None => self.get(preview)?,
        };
        let Some(object) = object else {
            self.forgotten(preview);
            return Ok(());
        };
        let labels = object.metadata.labels.as_ref();
        let ours = labels.and_then(|l| l.get(MANAGED_BY)).map(String::as_str) == Some("plumber")
            && labels.and_then(|l| l.get(TOPOLOGY)).map(String::as_str) == Some(preview)
            && object.spec.topology == preview;
        if !ours {
            return Err(api(
                "forget",
                preview,
                "it is no Topology Plumber created for this preview; left as it is".into(),
                false,
            ));
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: object.metadata.resource_version.clone(),
                uid: object.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match self.handle.block_on(self.api().delete(preview, &params)) {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Read again, so that the next look starts from what is there now.
                self.read(preview)?;
                return Err(Error::Conflict {
                    topology: preview.to_owned(),
                });
            }
            Err(error) => return Err(kube_error("delete", preview, error)),
        }
        self.forgotten(preview);
        tracing::info!(topology = preview, "the preview's Topology deleted");
        Ok(())
    }

    fn append_history(&self, entry: &HistoryEntry) -> Result<()> {
        self.write(&entry.topology, |status| {
            if status.history.iter().rev().any(|e| e.same_move(entry)) {
                return;
            }
            status.history.push(entry.clone());
            let excess = status.history.len().saturating_sub(HISTORY_KEPT);
            status.history.drain(..excess);
        })
    }

    fn may_act(&self) -> bool {
        (self.guard)()
    }

    fn history(&self) -> Result<Vec<HistoryEntry>> {
        let list = self
            .handle
            .block_on(
                self.api()
                    .list(&ListParams::default().labels(&format!("{MANAGED_BY}=plumber"))),
            )
            .map_err(|e| kube_error("list", "-", e))?;
        let mut entries: Vec<HistoryEntry> = list
            .items
            .into_iter()
            .filter_map(|object| {
                let name = object.metadata.name.clone()?;
                parse(&name, object.status.and_then(|s| s.record)).ok()
            })
            .flat_map(|status| status.history)
            .collect();
        entries.sort_by_key(|e| e.finished_at);
        Ok(entries)
    }
}
