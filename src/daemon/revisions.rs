//! Loading a commit once: its files validated into graphs, and a checkout of it for the
//! processors that run commands next to their step files (`exec`, `http`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use super::{Error, Source};
use crate::graph::Topology;
use crate::spec::ClusterSpec;
use crate::store::StateDir;

/// One valid commit, ready to run: its graphs, clusters and a checkout of its files.
#[derive(Debug)]
pub struct Revision {
    pub commit: String,
    pub topologies: Vec<Topology>,
    pub clusters: BTreeMap<String, ClusterSpec>,
    pub checkout: PathBuf,
}

impl Revision {
    pub fn topology(&self, name: &str) -> Option<&Topology> {
        self.topologies.iter().find(|t| t.name == name)
    }
}

/// Revisions kept in memory; a daemon needs a few (applied, in progress, desired) at a time.
const MAX_CACHED_REVISIONS: usize = 64;

/// Loads and caches revisions by commit.
pub struct Revisions {
    source: Source,
    checkouts: PathBuf,
    cache: Mutex<BTreeMap<String, Arc<Revision>>>,
}

impl Revisions {
    pub fn new(source: Source, state: &StateDir) -> Self {
        Revisions {
            source,
            checkouts: state.checkouts(),
            cache: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The revision of `commit`; an error if it is not valid.
    pub fn load(&self, commit: &str) -> Result<Arc<Revision>, Error> {
        if let Some(found) = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(commit)
        {
            return Ok(found.clone());
        }
        let repository = self.source.open()?;
        let oid = repository.resolve(commit)?;
        let snapshot = repository.snapshot(oid)?;
        let validation = crate::validate(&snapshot.files);
        let Some(topologies) = validation.topologies else {
            let errors: Vec<String> = validation.errors().map(ToString::to_string).collect();
            return Err(Error::Invalid {
                commit: commit.to_owned(),
                errors: errors.join("; "),
                first: validation.errors().next().cloned().map(Box::new),
            });
        };
        let checkout = self.checkouts.join(oid.to_string());
        repository.checkout(oid, &checkout)?;
        let revision = Arc::new(Revision {
            commit: oid.to_string(),
            topologies,
            clusters: validation.clusters,
            checkout,
        });
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        // Any revision can be loaded again from git: the cache only saves work.
        if cache.len() >= MAX_CACHED_REVISIONS {
            cache.clear();
        }
        cache.insert(commit.to_owned(), revision.clone());
        Ok(revision)
    }

    /// Removes the checkouts of commits not in `keep` (processors of those commits still run
    /// there, or may run there next), so they do not pile up with every commit.
    pub fn collect_checkouts(&self, keep: &BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(&self.checkouts) else {
            return;
        };
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let commit = name.strip_suffix(".partial").unwrap_or(&name);
            if keep.contains(commit) {
                continue;
            }
            cache.remove(commit);
            if let Err(error) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(%error, path = %entry.path().display(), "cannot remove an unused checkout");
            } else {
                tracing::debug!(commit, "unused checkout removed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn checkouts_nothing_needs_are_removed_and_the_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let revisions = Revisions::new(Source::new("unused", dir.path()), &state);
        for name in ["aaa", "bbb", "ccc.partial", "ddd"] {
            std::fs::create_dir_all(dir.path().join("checkouts").join(name).join("steps")).unwrap();
        }
        revisions.collect_checkouts(&BTreeSet::from(["aaa".to_owned(), "ccc".to_owned()]));
        let mut left: Vec<String> = std::fs::read_dir(dir.path().join("checkouts"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["aaa", "ccc.partial"]);
    }
}
