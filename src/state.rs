//! The daemon's durable state in `--state-dir`: per topology, the commit that is fully applied
//! and the cutover in progress (its exact actions, how many are done, and the cutover offsets
//! recorded so far); and the history of applied cutovers.
//!
//! Every write replaces a whole file atomically (write a temporary file, fsync, rename, fsync
//! the directory), so a daemon killed at any instant finds either the old or the new state,
//! never a torn one. Each topology has its own file, written only by that topology's worker,
//! so workers never contend. The history is append-only JSON lines; a line torn by a crash is
//! skipped when read.
//!
//! ```text
//! STATE_DIR/
//!   topologies/<name>.json   TopologyState
//!   history.jsonl            one HistoryEntry per line
//!   processes/, logs/, checkouts/   owned by the local runtime and the daemon
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::plan::Action;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another `plumber up` (pid {pid}) is using the state directory {path}; stop it, or give this one its own --state-dir"
    )]
    Locked { path: PathBuf, pid: String },
    #[error("{path} is damaged ({source}); move it away to start that topology from scratch")]
    Damaged {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the daemon knows about one topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyState {
    /// The last commit whose cutover finished; `None` before the first one.
    pub commit: Option<String>,
    /// The cutover in progress, if any.
    pub cutover: Option<CutoverProgress>,
}

/// A cutover in progress: enough to resume it exactly after a crash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CutoverProgress {
    pub from: Option<String>,
    pub to: String,
    /// The plan's actions, as planned when the cutover began.
    pub actions: Vec<Action>,
    /// How many actions are finished.
    pub done: usize,
    /// The first half of a two-part action is finished: a `start-processor`'s group offsets
    /// are set. Redoing that half after the processor ran would move its offsets.
    pub prepared: bool,
    /// Cutover offsets recorded by `hand-over-offsets` actions so far.
    pub handovers: Vec<Handover>,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
}

/// The offsets at which one processor handed its inputs over to its successor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    pub step: String,
    pub from_group: String,
    pub to_group: String,
    pub offsets: Vec<PartitionOffset>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// One applied cutover, for `plumber history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub topology: String,
    pub from: Option<String>,
    pub to: String,
    pub started_at: u64,
    pub finished_at: u64,
    pub actions: usize,
    pub handovers: Vec<Handover>,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// Opens (creating if needed) a state directory.
    pub fn open(root: &Path) -> Result<Self> {
        for dir in [root.to_path_buf(), root.join("topologies")] {
            fs::create_dir_all(&dir).map_err(|source| Error::Write { path: dir, source })?;
        }
        Ok(StateDir {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Takes the directory for this process until the lock is dropped (or the process dies):
    /// two daemons on one state directory would both adopt and restart the same processors.
    pub fn lock(&self) -> Result<StateLock> {
        use std::io::{Read as _, Seek as _};
        let path = self.root.join("daemon.lock");
        let write_error = |source| Error::Write {
            path: path.clone(),
            source,
        };
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(write_error)?;
        let mut locked =
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(locked) => locked,
                Err((mut file, _)) => {
                    let mut pid = String::new();
                    let _ = file.read_to_string(&mut pid);
                    return Err(Error::Locked {
                        path: self.root.clone(),
                        pid: pid.trim().to_owned(),
                    });
                }
            };
        locked.set_len(0).map_err(write_error)?;
        locked.rewind().map_err(write_error)?;
        locked
            .write_all(std::process::id().to_string().as_bytes())
            .map_err(write_error)?;
        Ok(StateLock { _file: locked })
    }

    fn topology_path(&self, name: &str) -> PathBuf {
        self.root.join("topologies").join(format!("{name}.json"))
    }

    /// Every topology with a state file, by name.
    pub fn topologies(&self) -> Result<BTreeMap<String, TopologyState>> {
        let dir = self.root.join("topologies");
        let entries = fs::read_dir(&dir).map_err(|source| Error::Read {
            path: dir.clone(),
            source,
        })?;
        let mut out = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Read {
                path: dir.clone(),
                source,
            })?;
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Some(name) = path.file_stem().and_then(|s| s.to_str())
            {
                out.insert(name.to_owned(), self.topology(name)?);
            }
        }
        Ok(out)
    }

    /// The state of one topology; the default (nothing applied) when it has none.
    pub fn topology(&self, name: &str) -> Result<TopologyState> {
        let path = self.topology_path(name);
        match fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| Error::Damaged { path, source })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TopologyState::default()),
            Err(source) => Err(Error::Read { path, source }),
        }
    }

    pub fn save_topology(&self, name: &str, state: &TopologyState) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(state).map_err(|source| Error::Damaged {
            path: self.topology_path(name),
            source,
        })?;
        write_atomically(&self.topology_path(name), &bytes)
    }

    /// Forgets a topology that no longer exists and has nothing running.
    pub fn remove_topology(&self, name: &str) -> Result<()> {
        let path = self.topology_path(name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::Write { path, source: e })
            }
            _ => Ok(()),
        }
    }

    pub fn append_history(&self, entry: &HistoryEntry) -> Result<()> {
        let path = self.root.join("history.jsonl");
        let write_error = |source| Error::Write {
            path: path.clone(),
            source,
        };
        let mut line = serde_json::to_vec(entry).map_err(|source| Error::Damaged {
            path: path.clone(),
            source,
        })?;
        line.push(b'\n');
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(write_error)?;
        file.write_all(&line).map_err(write_error)?;
        file.sync_all().map_err(write_error)
    }

    /// Applied cutovers, oldest first.
    pub fn history(&self) -> Result<Vec<HistoryEntry>> {
        let path = self.root.join("history.jsonl");
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(Error::Read { path, source }),
        };
        // A crash can tear only the last line; it is skipped.
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }
}

/// Held while a daemon uses a state directory.
pub struct StateLock {
    _file: nix::fcntl::Flock<fs::File>,
}

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new content.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let write_error = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut temporary = tempfile::NamedTempFile::new_in(dir).map_err(write_error)?;
    temporary.write_all(bytes).map_err(write_error)?;
    temporary.as_file().sync_all().map_err(write_error)?;
    temporary.persist(path).map_err(|e| write_error(e.error))?;
    // The rename itself is durable once the directory is synced.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(write_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_state_round_trips_and_missing_is_default() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        assert_eq!(state.topology("clicks").unwrap(), TopologyState::default());
        let saved = TopologyState {
            commit: Some("abc".into()),
            cutover: Some(CutoverProgress {
                from: Some("abc".into()),
                to: "def".into(),
                actions: vec![Action::DeleteTopic { topic: "t".into() }],
                done: 1,
                prepared: false,
                handovers: vec![],
                started_at: 7,
            }),
        };
        state.save_topology("clicks", &saved).unwrap();
        assert_eq!(state.topology("clicks").unwrap(), saved);
        assert_eq!(state.topologies().unwrap().len(), 1);
        state.remove_topology("clicks").unwrap();
        assert!(state.topologies().unwrap().is_empty());
    }

    #[test]
    fn one_daemon_per_state_directory() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let held = state.lock().unwrap();
        let error = state.lock().err().unwrap().to_string();
        assert!(error.contains(&std::process::id().to_string()), "{error}");
        drop(held);
        assert!(state.lock().is_ok());
    }

    #[test]
    fn a_torn_history_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let entry = HistoryEntry {
            topology: "clicks".into(),
            from: None,
            to: "abc".into(),
            started_at: 1,
            finished_at: 2,
            actions: 3,
            handovers: vec![],
        };
        state.append_history(&entry).unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("history.jsonl"))
            .unwrap()
            .write_all(b"{\"topology\":\"cli")
            .unwrap();
        assert_eq!(state.history().unwrap(), vec![entry]);
    }

    #[test]
    fn a_damaged_state_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        fs::write(dir.path().join("topologies/clicks.json"), "{").unwrap();
        let error = state.topology("clicks").unwrap_err().to_string();
        assert!(error.contains("clicks.json"), "{error}");
    }
}
