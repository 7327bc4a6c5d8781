//! The state directory of `plumber up` (`--state-dir`): per topology its [`TopologyRecord`],
//! the history of moves, and which repository the directory belongs to.
//!
//! Every write replaces a whole file atomically (write a temporary file, fsync, rename, fsync
//! the directory), so a daemon killed at any instant finds either the old or the new state,
//! never a torn one. Each topology has its own file, written only by that topology's cutover
//! engine, so topologies never contend, and one damaged file affects only its topology. The
//! history is append-only JSON lines: a line torn by a crash is skipped when read, and the
//! next append starts on a line of its own.
//!
//! ```text
//! STATE_DIR/
//!   topologies/<name>.json   TopologyRecord
//!   history.jsonl            one HistoryEntry per line
//!   repository.json          the repository this directory belongs to
//!   processes/, logs/, checkouts/   owned by the local runtime and the daemon
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{CutoverStore, Error, FORMAT, HistoryEntry, Result, TopologyRecord};

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

    /// Where the checkouts of commits are, one directory per commit.
    pub fn checkouts(&self) -> PathBuf {
        checkouts_dir(&self.root)
    }

    /// Where the checkouts' directories are written, once per git tree: a checkout's step
    /// directories link there ([`crate::repo::Repository::checkout_shared`]).
    pub fn checkout_trees(&self) -> PathBuf {
        self.root.join("checkout-trees")
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

    fn history_path(&self) -> PathBuf {
        self.root.join("history.jsonl")
    }

    /// Records which repository this directory belongs to (the first commit of the followed
    /// branch's first-parent history), or refuses one that belongs to another.
    pub fn claim(&self, root_commit: &str, location: &str) -> Result<()> {
        let path = self.root.join("repository.json");
        match fs::read(&path) {
            Ok(bytes) => {
                let claimed: Claim =
                    serde_json::from_slice(&bytes).map_err(|source| Error::Damaged {
                        path: path.clone(),
                        source,
                    })?;
                if claimed.root_commit != root_commit {
                    return Err(Error::OtherRepository {
                        path: self.root.clone(),
                        recorded: claimed.root_commit,
                        found: root_commit.to_owned(),
                    });
                }
                if claimed.location != location {
                    tracing::info!(from = %claimed.location, to = %location, "the repository moved; same history, so the state directory still applies");
                    self.write_claim(&path, root_commit, location)?;
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.write_claim(&path, root_commit, location)
            }
            Err(source) => Err(Error::Read { path, source }),
        }
    }

    fn write_claim(&self, path: &Path, root_commit: &str, location: &str) -> Result<()> {
        let claim = Claim {
            root_commit: root_commit.to_owned(),
            location: location.to_owned(),
        };
        let bytes = serde_json::to_vec_pretty(&claim).map_err(|source| Error::Damaged {
            path: path.to_path_buf(),
            source,
        })?;
        write_atomically(path, &bytes)
    }
}

/// `repository.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Claim {
    root_commit: String,
    location: String,
}

impl CutoverStore for StateDir {
    fn load(&self, name: &str) -> Result<TopologyRecord> {
        let path = self.topology_path(name);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(TopologyRecord::default());
            }
            Err(source) => return Err(Error::Read { path, source }),
        };
        #[derive(Deserialize)]
        struct Versioned {
            #[serde(default)]
            format: u32,
        }
        let found = serde_json::from_slice::<Versioned>(&bytes)
            .map_err(|source| Error::Damaged {
                path: path.clone(),
                source,
            })?
            .format;
        if found != FORMAT {
            return Err(Error::Format { path, found });
        }
        serde_json::from_slice(&bytes).map_err(|source| Error::Damaged { path, source })
    }

    fn save(&self, name: &str, record: &TopologyRecord) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(record).map_err(|source| Error::Damaged {
            path: self.topology_path(name),
            source,
        })?;
        write_atomically(&self.topology_path(name), &bytes)
    }

    fn forget(&self, preview: &str) -> Result<()> {
        super::only_previews(preview)?;
        let path = self.topology_path(preview);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Write { path, source }),
        }
    }

    fn topologies(&self) -> Result<BTreeMap<String, Result<TopologyRecord>>> {
        let dir = self.root.join("topologies");
        let entries = fs::read_dir(&dir).map_err(|source| Error::Read {
            path: dir.clone(),
            source,
        })?;
        let mut out = BTreeMap::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Some(name) = path.file_stem().and_then(|s| s.to_str())
            {
                out.insert(name.to_owned(), self.load(name));
            }
        }
        Ok(out)
    }

    fn append_history(&self, entry: &HistoryEntry) -> Result<()> {
        let path = self.history_path();
        let write_error = |source| Error::Write {
            path: path.clone(),
            source,
        };
        if self.recent_history()?.iter().any(|e| e.same_move(entry)) {
            return Ok(());
        }
        let mut line = serde_json::to_vec(entry).map_err(|source| Error::Damaged {
            path: path.clone(),
            source,
        })?;
        line.push(b'\n');
        let mut file = fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(write_error)?;
        // A line torn by a crash stays a line of its own (skipped when read) instead of
        // swallowing this one.
        let length = file.metadata().map_err(write_error)?.len();
        if length > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(length - 1))
                .map_err(write_error)?;
            file.read_exact(&mut last).map_err(write_error)?;
            if last[0] != b'\n' {
                line.insert(0, b'\n');
            }
        }
        file.write_all(&line).map_err(write_error)?;
        file.sync_all().map_err(write_error)
    }

    fn history(&self) -> Result<Vec<HistoryEntry>> {
        let path = self.history_path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(Error::Read { path, source }),
        };
        // A crash can tear only the line being written; it is skipped.
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }
}

/// How much of the history's end is searched for an entry about to be written twice.
const RECENT_HISTORY_BYTES: u64 = 256 * 1024;

impl StateDir {
    /// The entries at the end of the history (those a repeated append could repeat).
    fn recent_history(&self) -> Result<Vec<HistoryEntry>> {
        let path = self.history_path();
        let mut file = match fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(Error::Read { path, source }),
        };
        let read_error = |source| Error::Read {
            path: path.clone(),
            source,
        };
        let length = file.metadata().map_err(read_error)?.len();
        file.seek(SeekFrom::Start(length.saturating_sub(RECENT_HISTORY_BYTES)))
            .map_err(read_error)?;
        let mut tail = Vec::new();
        file.read_to_end(&mut tail).map_err(read_error)?;
        Ok(tail
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect())
    }
}

/// Held while a daemon uses a state directory.
pub struct StateLock {
    _file: nix::fcntl::Flock<fs::File>,
}

/// Replaces `path` with `bytes` (see [`crate::durable::write`]).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::durable::write(path, bytes).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The checkouts of the state directory at `root` (see [`StateDir::checkouts`]).
pub fn checkouts_dir(root: &Path) -> PathBuf {
    root.join("checkouts")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Move, Outcome};

    fn entry(to: &str) -> HistoryEntry {
        HistoryEntry {
            topology: "clicks".into(),
            from: None,
            to: to.into(),
            outcome: Outcome::Applied,
            started_at: 1,
            finished_at: 2,
            actions: 3,
            handovers: vec![],
        }
    }

    #[test]
    fn a_preview_s_record_is_forgotten_and_a_topology_s_never() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let record = TopologyRecord {
            commit: Some("abc".into()),
            ..TopologyRecord::default()
        };
        state.save("clicks", &record).unwrap();
        state.save("clicks.pr-7", &record).unwrap();
        state.forget("clicks.pr-7").unwrap();
        assert_eq!(
            state.load("clicks.pr-7").unwrap(),
            TopologyRecord::default()
        );
        assert_eq!(
            state.topologies().unwrap().keys().collect::<Vec<_>>(),
            ["clicks"]
        );
        state.forget("clicks.pr-7").unwrap();
        let refused = state.forget("clicks").unwrap_err();
        assert!(matches!(refused, Error::NotAPreview { .. }), "{refused}");
        assert_eq!(
            state.load("clicks").unwrap(),
            record,
            "a topology's record stays"
        );
    }

    #[test]
    fn a_topology_record_round_trips_and_missing_is_default() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        assert_eq!(state.load("clicks").unwrap(), TopologyRecord::default());
        let saved = TopologyRecord {
            commit: Some("abc".into()),
            moving: Some(Move {
                from: Some("abc".into()),
                to: "def".into(),
                started_at: 7,
                done: 1,
                handovers: vec![],
            }),
            ..TopologyRecord::default()
        };
        state.save("clicks", &saved).unwrap();
        assert_eq!(state.load("clicks").unwrap(), saved);
        assert_eq!(state.topologies().unwrap().len(), 1);
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
    fn a_torn_history_line_is_skipped_and_does_not_swallow_the_next_entry() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        state.append_history(&entry("a")).unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("history.jsonl"))
            .unwrap()
            .write_all(b"{\"topology\":\"cli")
            .unwrap();
        state.append_history(&entry("b")).unwrap();
        assert_eq!(state.history().unwrap(), vec![entry("a"), entry("b")]);
    }

    #[test]
    fn a_move_appended_twice_is_recorded_once() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        state.append_history(&entry("a")).unwrap();
        state.append_history(&entry("a")).unwrap();
        assert_eq!(state.history().unwrap().len(), 1);
    }

    #[test]
    fn a_damaged_record_is_an_error_of_its_topology_only() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        state.save("good", &TopologyRecord::default()).unwrap();
        fs::write(dir.path().join("topologies/clicks.json"), "{").unwrap();
        let error = state.load("clicks").unwrap_err().to_string();
        assert!(error.contains("clicks.json"), "{error}");
        let all = state.topologies().unwrap();
        assert!(all["clicks"].is_err());
        assert!(all["good"].is_ok());
    }

    #[test]
    fn a_record_of_another_format_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        fs::write(
            dir.path().join("topologies/clicks.json"),
            r#"{"commit":"abc","cutover":null}"#,
        )
        .unwrap();
        let error = state.load("clicks").unwrap_err();
        assert!(matches!(error, Error::Format { found: 0, .. }), "{error}");
        assert!(error.to_string().contains("move the state directory away"));
    }

    #[test]
    fn a_state_directory_belongs_to_one_repository() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        state.claim("r00t", "/repo").unwrap();
        state
            .claim("r00t", "https://moved.example/repo.git")
            .unwrap();
        let error = state.claim("other", "/elsewhere").unwrap_err();
        assert!(matches!(error, Error::OtherRepository { .. }), "{error}");
    }
}
