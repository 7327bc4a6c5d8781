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
//! Calls block, on the store's own executor.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde::{Deserialize, Serialize};

use super::{CutoverStore, Error, FORMAT, HistoryEntry, Result, TopologyRecord};
use crate::runtime::kube::crd::{Topology, TopologySpec, TopologyStatus};
use crate::runtime::kube::render::{MANAGED_BY, Source, TOPOLOGY};

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

/// Whether this daemon replica may write (it holds the lease).
pub type Guard = dyn Fn() -> bool + Send + Sync;

pub struct TopologyStore {
    client: Client,
    namespace: String,
    source: Source,
    guard: Arc<Guard>,
    executor: tokio::runtime::Runtime,
    /// Each topology's object as this store last read or wrote it (`None`: there was none),
    /// without its managed fields: its record is the one a save expects to find, and its
    /// `resourceVersion` the precondition of the next write.
    known: Mutex<BTreeMap<String, Option<Topology>>>,
}

impl TopologyStore {
    /// A store on the client `client` makes (inside the store's own executor, which drives
    /// it).
    pub fn new(
        client: impl FnOnce() -> Client,
        namespace: &str,
        source: Source,
        guard: Arc<Guard>,
    ) -> Result<Self> {
        let executor = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| api("start a client for", "-", e.to_string(), false))?;
        let client = {
            let _inside = executor.enter();
            client()
        };
        Ok(TopologyStore {
            client,
            namespace: namespace.to_owned(),
            source,
            guard,
            executor,
            known: Mutex::new(BTreeMap::new()),
        })
    }

    fn api(&self) -> Api<Topology> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn get(&self, topology: &str) -> Result<Option<Topology>> {
        self.executor
            .block_on(self.api().get_opt(topology))
            .map_err(|e| kube_error("read", topology, e))
    }

    fn remember(&self, topology: &str, mut object: Option<Topology>) {
        if let Some(object) = &mut object {
            // The server keeps them when a write leaves them out; here they only take room.
            object.metadata.managed_fields = None;
        }
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(topology.to_owned(), object);
    }

    fn read(&self, topology: &str) -> Result<StatusRecord> {
        let object = self.get(topology)?;
        let raw = record_of(object.as_ref());
        self.remember(topology, object);
        parse(topology, raw)
    }

    /// Read, change and write the status record of `topology`, with the guarantees above.
    fn write(&self, topology: &str, change: impl Fn(&mut StatusRecord)) -> Result<()> {
        if !(self.guard)() {
            return Err(Error::NotLeader {
                topology: topology.to_owned(),
            });
        }
        let known = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topology)
            .cloned();
        let expected = known.as_ref().map(|object| record_of(object.as_ref()));
        // Written as last seen first: that write fails unless nobody wrote since.
        let mut last_seen = known.flatten();
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
            let raw = record_of(Some(&object));
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
            match self.executor.block_on(self.api().replace_status(
                topology,
                &PostParams::default(),
                &object,
            )) {
                Ok(written) => {
                    self.remember(topology, Some(written));
                    return Ok(());
                }
                // Someone wrote the object since we read it: look again. (A 404 answers a
                // write of the object as last seen once it was deleted: the read creates it.)
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(kube::Error::Api(status)) if status.code == 404 && reads == 0 => continue,
                Err(error) => return Err(kube_error("write the record of", topology, error)),
            }
        }
        Err(api(
            "write the record of",
            topology,
            format!("its status changed {STATUS_RETRIES} times while writing"),
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
            .executor
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

/// The record in an object's status.
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
        Ok(self.read(topology)?.record)
    }

    fn save(&self, topology: &str, record: &TopologyRecord) -> Result<()> {
        self.write(topology, |status| status.record = record.clone())
    }

    fn topologies(&self) -> Result<BTreeMap<String, Result<TopologyRecord>>> {
        let list = self
            .executor
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
            .executor
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
