//! Loading a commit once: its files validated into graphs, and a checkout of it for the
//! processors that run commands next to their step files (`exec`, `http`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use git2::Oid;

use super::{Error, Source};
use crate::Validation;
use crate::diagnostic::Diagnostic;
use crate::graph::Topology;
use crate::repo::Repository;
use crate::spec::budget::{Budget, Measure};
use crate::spec::{ClusterSpec, RepoSettings, StepSecrets};
use crate::store::StateDir;

/// One valid commit, ready to run: its graphs, clusters and a checkout of its files.
#[derive(Debug)]
pub struct Revision {
    pub commit: String,
    pub topologies: Vec<Topology>,
    pub clusters: BTreeMap<String, ClusterSpec>,
    pub checkout: PathBuf,
    /// The record fields a review never shows (`plumber.yaml`'s `review.maskFields`).
    pub masked_fields: Vec<String>,
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
    /// What one commit may make the daemon read and write.
    budget: Budget,
    checkouts: PathBuf,
    /// The directories checkouts link to, one per git tree: a new commit writes only the
    /// directories it changed.
    checkout_trees: PathBuf,
    /// Held while a checkout is written or collected: a tree just written and not linked
    /// yet is not collected.
    checkout_lock: Mutex<()>,
    cache: Mutex<BTreeMap<String, Arc<Revision>>>,
    trees: Arc<TreeCache>,
    /// Checkouts [`Revisions::collect_checkouts`] keeps whatever it is told: the heads that
    /// preview environments run or are about to.
    pinned: Mutex<BTreeSet<String>>,
    /// Authors and messages of the commits history shows (they never change).
    commits: Mutex<BTreeMap<String, crate::repo::CommitInfo>>,
    /// What running the step tests of exec and http steps may take, when the daemon runs
    /// them (`plumber up --run-commands`): from a commit's checkout, once it is validated.
    command_tests: Option<crate::steptest::Limits>,
    /// Those tests' results per commit: an invalid head is loaded again at every look.
    command_results: Mutex<BTreeMap<String, Arc<Vec<crate::steptest::CaseResult>>>>,
}

impl Revisions {
    pub fn new(
        source: Source,
        state: &StateDir,
        secrets: StepSecrets,
        budget: Budget,
        tests: crate::steptest::Limits,
        run_commands: bool,
    ) -> Self {
        Revisions {
            source,
            budget,
            checkouts: state.checkouts(),
            checkout_trees: state.checkout_trees(),
            checkout_lock: Mutex::new(()),
            cache: Mutex::new(BTreeMap::new()),
            command_tests: run_commands.then(|| tests.clone()),
            trees: Arc::new(TreeCache::new(secrets, tests)),
            pinned: Mutex::new(BTreeSet::new()),
            commits: Mutex::new(BTreeMap::new()),
            command_results: Mutex::new(BTreeMap::new()),
        }
    }

    /// The step tests of `validation`'s exec and http steps, run from `checkout` (a checkout
    /// of `commit`) and folded into it, when the daemon runs commands.
    fn test_commands(&self, commit: &str, validation: &mut Validation, checkout: &std::path::Path) {
        let Some(limits) = &self.command_tests else {
            return;
        };
        let known = self
            .command_results
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(commit)
            .cloned();
        let results = match known {
            Some(results) => results,
            None => {
                let results = Arc::new(crate::steptest::run_commands(validation, limits, checkout));
                if !results.is_empty() {
                    let failed = results.iter().filter(|r| r.verdict.fails()).count();
                    tracing::info!(%commit, cases = results.len(), failed, "step tests of exec and http steps run");
                }
                results
            }
        };
        // One cut short by the run's time is run again at the next load.
        if crate::steptest::fold_commands(validation, &results) {
            let mut cached = self
                .command_results
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if cached.len() >= MAX_CACHED_REVISIONS {
                cached.clear();
            }
            cached.insert(commit.to_owned(), results);
        }
    }

    /// Author, time and message of each of `commits` the repository has (one opening of the
    /// repository for all of them; each commit read once per run).
    pub fn commit_infos<'c>(
        &self,
        commits: impl IntoIterator<Item = &'c str>,
    ) -> BTreeMap<String, crate::repo::CommitInfo> {
        let mut known = self.commits.lock().unwrap_or_else(PoisonError::into_inner);
        let mut repository = None;
        let mut found = BTreeMap::new();
        for commit in commits {
            if let Some(info) = known.get(commit) {
                found.insert(commit.to_owned(), info.clone());
                continue;
            }
            if repository.is_none() {
                match self.source.open() {
                    Ok(opened) => repository = Some(opened),
                    Err(error) => {
                        tracing::debug!(%error, "cannot read commit authors");
                        break;
                    }
                }
            }
            let Some(repository) = &repository else { break };
            let info = Oid::from_str(commit)
                .ok()
                .and_then(|oid| repository.commit_info(oid).ok());
            if let Some(info) = info {
                known.insert(commit.to_owned(), info.clone());
                found.insert(commit.to_owned(), info);
            }
        }
        found
    }

    /// A checkout of `commit` for the processors of `topologies` that run commands (a
    /// preview runs a pull request's head, whose merge was validated, valid or not on its
    /// own), kept until [`Revisions::pin`] no longer names it.
    pub fn checkout(&self, commit: &str, topologies: &[Topology]) -> Result<PathBuf, Error> {
        let repository = self.open()?;
        let oid = repository.resolve(commit)?;
        let checkout = self.checkouts.join(oid.to_string());
        self.write_checkout(&repository, oid, topologies, &checkout)?;
        Ok(checkout)
    }

    /// The repository, holding what it reads to the daemon's budget: every reader of
    /// commits opens it here.
    pub fn open(&self) -> Result<Repository, Error> {
        Ok(self.source.open()?.with_budget(self.budget))
    }

    /// The commits whose checkouts are kept besides those the follower keeps.
    pub fn pin(&self, commits: BTreeSet<String>) {
        *self.pinned.lock().unwrap_or_else(PoisonError::into_inner) = commits;
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// What is known of topology trees: shared with the plans of watched refs.
    pub fn trees(&self) -> &Arc<TreeCache> {
        &self.trees
    }

    /// Makes `revision` load without a repository.
    #[cfg(test)]
    pub(crate) fn insert(&self, revision: Revision) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(revision.commit.clone(), Arc::new(revision));
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
        let repository = self.open()?;
        let oid = repository.resolve(commit)?;
        let tree = repository.tree_of(oid)?;
        let mut validation = self.trees.validate(&repository, tree, oid)?.to_validation();
        let checkout = self.checkouts.join(oid.to_string());
        if let Some(topologies) = &validation.topologies {
            self.write_checkout(&repository, oid, topologies, &checkout)?;
            self.test_commands(&oid.to_string(), &mut validation, &checkout);
        }
        let Some(topologies) = validation.topologies else {
            let errors: Vec<String> = validation.errors().map(ToString::to_string).collect();
            return Err(Error::Invalid {
                commit: commit.to_owned(),
                errors: errors.join("; "),
                first: validation.errors().next().cloned().map(Box::new),
            });
        };
        let revision = Arc::new(Revision {
            commit: oid.to_string(),
            topologies,
            clusters: validation.clusters,
            checkout,
            masked_fields: validation.masked_fields,
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
    /// there, or may run there next), so they do not pile up with every commit; then the
    /// directories no checkout left links to.
    pub fn collect_checkouts(&self, keep: &BTreeSet<String>) {
        let _writing = self
            .checkout_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.collect_commits(keep);
        let linked = crate::repo::linked_trees(&self.checkouts);
        let Ok(trees) = std::fs::read_dir(&self.checkout_trees) else {
            return;
        };
        for tree in trees.flatten() {
            // Partly written ones too (`.writing-*`): nothing writes while the lock is held.
            if linked.contains(&*tree.file_name().to_string_lossy()) {
                continue;
            }
            if let Err(error) = std::fs::remove_dir_all(tree.path()) {
                tracing::warn!(%error, path = %tree.path().display(), "cannot remove an unused checkout directory");
            }
        }
    }

    fn collect_commits(&self, keep: &BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(&self.checkouts) else {
            return;
        };
        let pinned = self
            .pinned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let commit = name.strip_suffix(".partial").unwrap_or(&name);
            if keep.contains(commit) || pinned.contains(commit) {
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

    /// Writes what the processors of `topologies` run from (the directories of their `exec`
    /// and `http` steps) into `checkout`, each directory linked to its tree's one copy. A
    /// commit whose checkout is over budget, or whose tree holds a name that cannot be a file
    /// name, is invalid: it says so like any other invalid commit.
    fn write_checkout(
        &self,
        repository: &Repository,
        commit: Oid,
        topologies: &[Topology],
        checkout: &std::path::Path,
    ) -> Result<(), Error> {
        let _writing = self
            .checkout_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let dirs = crate::graph::checkout_dirs(topologies);
        let written = repository.checkout_shared(commit, &dirs, checkout, &self.checkout_trees);
        checkout_result(commit, written)
    }
}

/// A checkout's outcome as a revision's error: a checkout the commit's content refuses makes
/// the commit invalid.
fn checkout_result(commit: Oid, written: crate::repo::Result<()>) -> Result<(), Error> {
    match written {
        Err(error) => match error.diagnostic() {
            Some(diagnostic) => Err(Error::Invalid {
                commit: commit.to_string(),
                errors: diagnostic.to_string(),
                first: Some(Box::new(diagnostic)),
            }),
            None => Err(error.into()),
        },
        Ok(()) => Ok(()),
    }
}

/// Which settings and which tree a topology was validated with: nothing else decides what it
/// is ([`crate::validate_topologies`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopologyKey {
    /// The blob of `plumber.yaml`, if there is one.
    pub settings: Option<Oid>,
    /// The tree of `topologies/<name>`.
    pub tree: Oid,
}

/// `plumber.yaml` read once per blob.
#[derive(Debug)]
struct Settings {
    settings: RepoSettings,
    diagnostics: Vec<Diagnostic>,
}

/// A cached topology: its validation (`None`: the directory holds no step file, so it is no
/// topology) and the last validation that used it.
struct Cached {
    validation: Option<Arc<Validation>>,
    used: u64,
}

#[derive(Default)]
struct TreeCacheInner {
    /// What each topology tree holds ([`Repository::measure`]), by tree id.
    measures: HashMap<Oid, Measure>,
    settings: HashMap<Option<Oid>, Arc<Settings>>,
    topologies: HashMap<TopologyKey, Cached>,
    /// Counts validations, for [`Cached::used`].
    stamp: u64,
}

/// Validations of topology trees, by git tree id (with the settings' blob id), so a topology
/// that did not change between two commits, or between a branch and the merge preview of a
/// ref into it, is read from git and validated once. Entries unused by the last
/// `KEPT_VALIDATIONS` validations go once the cache outgrows what they hold.
#[derive(Default)]
pub struct TreeCache {
    inner: Mutex<TreeCacheInner>,
    parsed: AtomicU64,
    /// The Secrets steps may reference: the operator's, fixed for the daemon's life.
    secrets: StepSecrets,
    /// What running a tree's step tests may take.
    tests: crate::steptest::Limits,
}

/// Validations whose topologies are kept in a full cache.
const KEPT_VALIDATIONS: u64 = 64;

/// Why a tree's validation does not run the cases of exec and http steps: they need a
/// checkout of a commit, and the daemon runs them only where its configuration allows.
const DAEMON_COMMANDS: &str = "the daemon runs them only with `plumber up --run-commands` (a branch's commits from their checkout; a pull request's while its preview environment runs)";

/// A tree of a topology repository, validated.
#[derive(Debug, Clone)]
pub struct TreeValidation {
    pub tree: Oid,
    settings: Arc<Settings>,
    /// Problems of entries directly in `topologies/`.
    loose: Vec<Diagnostic>,
    /// Each topology, by name.
    pub topologies: Vec<(String, TopologyKey, Arc<Validation>)>,
}

impl TreeValidation {
    /// Whether the tree has no errors at all.
    pub fn is_valid(&self) -> bool {
        self.errors().next().is_none()
    }

    /// Every error of the tree.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.settings
            .diagnostics
            .iter()
            .chain(&self.loose)
            .chain(self.topologies.iter().flat_map(|(_, _, v)| &v.diagnostics))
            .filter(|d| d.is_error())
    }

    /// A topology's graph, when it is valid.
    pub fn graph(&self, name: &str) -> Option<&Topology> {
        self.topologies
            .iter()
            .find(|(n, _, _)| n == name)
            .and_then(|(_, _, v)| v.topologies.as_ref())
            .and_then(|graphs| graphs.first())
    }

    pub fn clusters(&self) -> &BTreeMap<String, ClusterSpec> {
        &self.settings.settings.clusters
    }

    /// The record fields a review never shows (`plumber.yaml`'s `review.maskFields`).
    pub fn masked_fields(&self) -> &[String] {
        &self.settings.settings.masked_fields
    }

    /// What [`crate::validate`] says of the tree's files.
    pub fn to_validation(&self) -> Validation {
        let mut diagnostics: Vec<Diagnostic> = self.settings.diagnostics.clone();
        diagnostics.extend(self.loose.iter().cloned());
        let mut found = Vec::new();
        let mut graphs = Vec::new();
        for (_, _, validation) in &self.topologies {
            diagnostics.extend(validation.diagnostics.iter().cloned());
            found.extend(validation.found.iter().cloned());
            graphs.extend(validation.topologies.iter().flatten().cloned());
        }
        crate::diagnostic::normalize(&mut diagnostics);
        let valid = !diagnostics.iter().any(Diagnostic::is_error);
        Validation {
            found,
            topologies: valid.then_some(graphs),
            diagnostics,
            clusters: self.settings.settings.clusters.clone(),
            masked_fields: self.settings.settings.masked_fields.clone(),
        }
    }
}

impl TreeCache {
    /// The validation of a tree refused as a whole (over budget, an unsafe name): nothing of
    /// it was read. Other errors are errors of reading, not of the tree.
    fn refused(
        &self,
        tree: Oid,
        error: crate::repo::Error,
    ) -> Result<TreeValidation, crate::repo::Error> {
        let Some(diagnostic) = error.diagnostic() else {
            return Err(error);
        };
        tracing::warn!(%tree, error = %diagnostic, "a tree refused before it was read");
        Ok(TreeValidation {
            tree,
            settings: Arc::new(Settings {
                settings: RepoSettings::default(),
                diagnostics: Vec::new(),
            }),
            loose: vec![diagnostic],
            topologies: Vec::new(),
        })
    }

    /// Whether the tree of `layout` is within the repository's budget, measured from its
    /// trees alone (each topology directory once per tree id) before any step file is read.
    fn within_budget(
        &self,
        repository: &Repository,
        layout: &crate::repo::Layout,
        commit: Oid,
    ) -> Result<(), crate::repo::Error> {
        let mut total = Measure {
            topologies: layout.topologies.len() as u64,
            ..Measure::default()
        };
        let mut each = Vec::with_capacity(layout.topologies.len());
        for (name, tree) in &layout.topologies {
            let known = self
                .inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .measures
                .get(tree)
                .copied();
            let measure = match known {
                Some(measure) => measure,
                None => {
                    let measure =
                        repository.measure(*tree, &format!("topologies/{name}/"), commit)?;
                    let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
                    if inner.measures.len() > 4 * layout.topologies.len() + 256 {
                        inner.measures.clear();
                    }
                    inner.measures.insert(*tree, measure);
                    measure
                }
            };
            total += measure;
            each.push((name, measure));
            // Over already: the rest need not be measured.
            if repository.budget().check(&total, None).is_err() {
                break;
            }
        }
        repository
            .budget()
            .check(&total, None)
            .map_err(|mut exceeded| {
                let of = |m: &Measure| match exceeded.limit {
                    "files" => m.files,
                    "steps" => m.steps,
                    _ => m.bytes,
                };
                exceeded.largest = each
                    .iter()
                    .filter(|_| exceeded.limit != "topologies")
                    .max_by_key(|(_, m)| of(m))
                    .map(|(name, _)| format!("topologies/{name}"));
                crate::repo::Error::OverBudget { commit, exceeded }
            })
    }

    /// A cache whose validations check the Secrets steps reference against `secrets` and
    /// run the step tests within `tests`.
    pub fn new(secrets: StepSecrets, tests: crate::steptest::Limits) -> TreeCache {
        TreeCache {
            secrets,
            tests,
            ..TreeCache::default()
        }
    }

    /// How many topologies were read and validated (cache misses) so far.
    pub fn parsed(&self) -> u64 {
        self.parsed.load(Ordering::Relaxed)
    }

    /// Validates the topology repository's tree `tree` (of `commit`, or of a merge of it):
    /// only the topologies not validated before with the same tree and settings are read.
    /// `repository` must be the handle that can read `tree` (a merge's lives in memory).
    pub fn validate(
        &self,
        repository: &Repository,
        tree: Oid,
        commit: Oid,
    ) -> Result<TreeValidation, crate::repo::Error> {
        let layout = match repository.layout(tree, commit) {
            Ok(layout) => layout,
            Err(error) => return self.refused(tree, error),
        };
        let settings_id = layout.settings.as_ref().map(|(id, _)| *id);
        let lock = || self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let known = lock().settings.get(&settings_id).cloned();
        let settings = match known {
            Some(settings) => settings,
            None => {
                let (settings, diagnostics) =
                    crate::spec::load_settings(layout.settings.as_ref().map(|(_, file)| file));
                let settings = Arc::new(Settings {
                    settings,
                    diagnostics,
                });
                let mut inner = lock();
                // A new plumber.yaml makes every topology new: the old ones can go.
                if inner.settings.len() >= 4 {
                    inner.settings.clear();
                }
                inner.settings.insert(settings_id, settings.clone());
                settings
            }
        };
        if let Err(error) = self.within_budget(repository, &layout, commit) {
            return self.refused(tree, error).map(|mut refused| {
                refused.settings = settings;
                refused
            });
        }
        let mut found: Vec<(String, TopologyKey, Option<Arc<Validation>>)> = Vec::new();
        let mut missing: Vec<usize> = Vec::new();
        {
            let mut inner = lock();
            inner.stamp += 1;
            let stamp = inner.stamp;
            for (name, tree) in &layout.topologies {
                let key = TopologyKey {
                    settings: settings_id,
                    tree: *tree,
                };
                let cached = inner.topologies.get_mut(&key).map(|cached| {
                    cached.used = stamp;
                    cached.validation.clone()
                });
                if cached.is_none() {
                    missing.push(found.len());
                }
                found.push((name.clone(), key, cached.flatten()));
            }
        }
        if !missing.is_empty() {
            let mut files = Vec::with_capacity(missing.len());
            for &i in &missing {
                let (name, key, _) = &found[i];
                files.push(repository.topology_files(name, key.tree, commit)?);
            }
            let mut validations =
                crate::validate_topologies(&settings.settings, &self.secrets, &files);
            // The step tests of what changed, in one run: a failed case makes its topology
            // invalid like a bad step file.
            let (results, finished) = crate::steptest::check_each(
                &mut validations,
                &self.tests,
                crate::steptest::Commands::Refused(DAEMON_COMMANDS),
            );
            if !results.is_empty() {
                let failed = results.iter().filter(|r| r.verdict.fails()).count();
                tracing::info!(%commit, cases = results.len(), failed, "step tests run");
            }
            self.parsed
                .fetch_add(missing.len() as u64, Ordering::Relaxed);
            let mut inner = lock();
            let stamp = inner.stamp;
            for (((&i, files), validation), finished) in
                missing.iter().zip(&files).zip(validations).zip(finished)
            {
                // A directory without step files is no topology, as for `validate`.
                let validation = (!files.is_empty()).then(|| Arc::new(validation));
                found[i].2 = validation.clone();
                // Cut short by the time of a run it shared with other topologies' tests: its
                // cases run again at the next tree that has it.
                if !finished {
                    continue;
                }
                inner.topologies.insert(
                    found[i].1,
                    Cached {
                        validation,
                        used: stamp,
                    },
                );
            }
            let limit = 2 * layout.topologies.len() + 256;
            if inner.topologies.len() > limit {
                let oldest = stamp.saturating_sub(KEPT_VALIDATIONS);
                inner.topologies.retain(|_, cached| cached.used > oldest);
            }
        }
        let loose = if layout.loose.is_empty() {
            Vec::new()
        } else {
            crate::spec::load_with(RepoSettings::default(), &layout.loose).1
        };
        let mut topologies: Vec<(String, TopologyKey, Arc<Validation>)> = found
            .into_iter()
            .filter_map(|(name, key, v)| v.map(|v| (name, key, v)))
            .collect();
        topologies.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(TreeValidation {
            tree,
            settings,
            loose,
            topologies,
        })
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
        let revisions = Revisions::new(
            Source::new("unused", dir.path()),
            &state,
            StepSecrets::Unchecked,
            Budget::default(),
            crate::steptest::Limits::default(),
            false,
        );
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

    /// Commits `files` (path, content) over the branch's last commit.
    fn commit(git: &git2::Repository, files: &[(&str, &str)]) -> String {
        let parent = git.head().ok().and_then(|h| h.peel_to_commit().ok());
        let base = match &parent {
            Some(commit) => commit.tree().unwrap(),
            None => git
                .find_tree(git.treebuilder(None).unwrap().write().unwrap())
                .unwrap(),
        };
        let mut update = git2::build::TreeUpdateBuilder::new();
        for (path, content) in files {
            let blob = git.blob(content.as_bytes()).unwrap();
            update.upsert(*path, blob, git2::FileMode::Blob);
        }
        let tree = git
            .find_tree(update.create_updated(git, &base).unwrap())
            .unwrap();
        let signature = git2::Signature::now("t", "t@example.com").unwrap();
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        git.commit(Some("HEAD"), &signature, &signature, "c", &tree, &parents)
            .unwrap()
            .to_string()
    }

    /// A new head writes only the step directories it changed: the others link to the copy
    /// an earlier checkout wrote, and a collection keeps what a kept checkout links to.
    #[test]
    fn a_checkout_writes_only_the_directories_its_commit_changed() {
        use std::os::unix::fs::MetadataExt as _;
        let repo = tempfile::tempdir().unwrap();
        let git = git2::Repository::init(repo.path()).unwrap();
        let exec = |script: &str| {
            format!("kind: processor\ninput: in\nexec:\n  command: [python3, {script}]\n")
        };
        let (pa, pb) = (exec("a.py"), exec("b.py"));
        let first = commit(
            &git,
            &[
                ("topologies/t/in.yaml", "kind: source\ntopic: in\n"),
                (
                    "topologies/t/out.yaml",
                    "kind: sink\ntopic: out\ninput: [pa, pb]\n",
                ),
                ("topologies/t/a/pa.yaml", &pa),
                ("topologies/t/a/a.py", "print('a1')\n"),
                ("topologies/t/b/pb.yaml", &pb),
                ("topologies/t/b/b.py", "print('b')\n"),
            ],
        );
        let second = commit(&git, &[("topologies/t/a/a.py", "print('a2')\n")]);
        let state_dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(state_dir.path()).unwrap();
        let revisions = Revisions::new(
            Source::new(&repo.path().display().to_string(), state_dir.path()),
            &state,
            StepSecrets::Unchecked,
            Budget::default(),
            crate::steptest::Limits::default(),
            false,
        );
        let first = revisions.load(&first).unwrap();
        let second = revisions.load(&second).unwrap();
        let file =
            |revision: &Revision, path: &str| revision.checkout.join("topologies/t").join(path);
        let read = |revision: &Revision, path: &str| {
            std::fs::read_to_string(file(revision, path)).unwrap()
        };
        assert_eq!(read(&first, "a/a.py"), "print('a1')\n");
        assert_eq!(read(&second, "a/a.py"), "print('a2')\n");
        assert_eq!(read(&second, "b/b.py"), "print('b')\n");
        let inode = |revision: &Revision, path: &str| {
            std::fs::metadata(file(revision, path)).unwrap().ino()
        };
        assert_eq!(
            inode(&first, "b/pb.yaml"),
            inode(&second, "b/pb.yaml"),
            "the unchanged directory was written once"
        );
        assert_ne!(inode(&first, "a/pa.yaml"), inode(&second, "a/pa.yaml"));
        let stored = || {
            let mut names: Vec<String> = std::fs::read_dir(state.checkout_trees())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(stored().len(), 3, "a twice, b once: {:?}", stored());

        // A head whose directories are all stored still counts them against the budget (the
        // whole checkout's): one over it is refused, though it would write nothing.
        let third = commit(
            &git,
            &[(
                "topologies/t/out.yaml",
                "kind: sink\ntopic: out2\ninput: [pa, pb]\n",
            )],
        );
        let bytes = (pa.len() + pb.len() + "print('a2')\n".len() + "print('b')\n".len()) as u64;
        let budgeted = |checkout_bytes| {
            Revisions::new(
                Source::new(&repo.path().display().to_string(), state_dir.path()),
                &state,
                StepSecrets::Unchecked,
                Budget {
                    checkout_bytes,
                    ..Budget::default()
                },
                crate::steptest::Limits::default(),
                false,
            )
        };
        match budgeted(bytes - 1).load(&third) {
            Err(Error::Invalid { errors, .. }) => assert!(errors.contains("checkout"), "{errors}"),
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("a checkout over its budget was written"),
        }
        assert!(budgeted(bytes).load(&third).is_ok());
        assert_eq!(stored().len(), 3, "nothing new written: {:?}", stored());

        revisions.collect_checkouts(&BTreeSet::from([second.commit.clone()]));
        assert!(!first.checkout.exists());
        assert_eq!(stored().len(), 2, "the first a is gone: {:?}", stored());
        assert_eq!(read(&second, "a/a.py"), "print('a2')\n");
        assert_eq!(read(&second, "b/b.py"), "print('b')\n");
    }
}
