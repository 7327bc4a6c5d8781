//! Reading a topology repository at a commit with git2: trees and blobs, never the working
//! tree. Symlinks are reported, never followed; blobs over the size cap are not read.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use git2::{ObjectType, Oid, TreeWalkResult};

use crate::spec::budget::{Budget, Exceeded, Measure};
use crate::spec::{self, FileContent, MAX_FILE_BYTES, SourceFile};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open a git repository at {location}: {source}")]
    Open {
        location: String,
        #[source]
        source: git2::Error,
    },
    #[error(
        "`{location}` is not a local path or file:// URL; clone it first (remote URLs are followed by the daemon)"
    )]
    UnsupportedLocation { location: String },
    #[error("the repository at {location} has no commits yet; commit a topology first")]
    NoCommits { location: String },
    #[error("revision `{rev}` not found in {location}: {message}")]
    UnknownRevision {
        rev: String,
        location: String,
        message: String,
    },
    #[error("directory `{dir}` does not exist at commit {commit}")]
    MissingDirectory { dir: String, commit: Oid },
    #[error("cannot write the checkout file {path}: {source}")]
    Checkout {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The commit is over budget ([`crate::spec::budget`]): a validation error of that commit.
    #[error("commit {commit}: {}", .exceeded.diagnostic().message)]
    OverBudget { commit: Oid, exceeded: Exceeded },
    #[error(
        "commit {commit} has a tree entry `{name}` in `{dir}` that cannot be written as a file name"
    )]
    UnsafeName {
        commit: Oid,
        dir: String,
        name: String,
    },
    #[error("reading {what} of commit {commit}: {source}")]
    Read {
        what: String,
        commit: Oid,
        #[source]
        source: git2::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// What the error says of the commit as a validation error, when it is one: the commit
    /// is over budget or holds a name no file can have. `None` for errors of reading.
    pub fn diagnostic(&self) -> Option<crate::diagnostic::Diagnostic> {
        match self {
            Error::OverBudget { exceeded, .. } => Some(exceeded.diagnostic()),
            Error::UnsafeName { dir, name, .. } => Some(crate::diagnostic::Diagnostic::error(
                crate::diagnostic::Code::UnsupportedEntry,
                dir,
                None,
                format!(
                    "`{}` is not a name a file can have here; nothing of the commit is \
                     written or run (rename it)",
                    name.escape_debug()
                ),
            )),
            _ => None,
        }
    }
}

pub struct Repository {
    git: git2::Repository,
    location: String,
    /// Where the topology repository starts inside the git repository (`""` at its root, or
    /// e.g. `"example-repo/"` for a subdirectory of a monorepo).
    prefix: String,
    /// What one commit may make this handle read and write.
    budget: Budget,
}

/// The largest tree object read, in bytes (about 100,000 entries): git would hold a bigger
/// directory listing whole in memory before anything could be counted.
const MAX_TREE_BYTES: u64 = 4 * 1024 * 1024;

/// Where the files of a checkout say which step directories are complete (written last).
const CHECKOUT_INDEX: &str = ".plumber-checkout";

/// A file a checkout writes: its path, blob and git file mode.
type Blob = (String, Oid, i32);

/// The outcome of merging a pull request's head into its base, in memory.
#[derive(Debug, Clone)]
pub enum MergePreview {
    /// The wanted files of the merged tree.
    Merged(Vec<SourceFile>),
    /// Paths with conflicts, sorted.
    Conflicts(Vec<String>),
}

/// What a merge of two commits gives, in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeTree {
    /// The tree of the topology repository in the merge; its new objects live only in the
    /// [`Repository`] handle that merged (read it through that handle).
    Merged(Oid),
    /// Paths with conflicts, sorted.
    Conflicts(Vec<String>),
}

/// What a person reads of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    /// `Name <email>`.
    pub author: String,
    /// The message's first line.
    pub summary: String,
    /// Authored, in seconds since the Unix epoch.
    pub time: i64,
}

/// A tree of a topology repository by parts, so each part can be read (and validated) only
/// when it is new: `plumber.yaml`, each `topologies/<name>` directory, and whatever else
/// lies directly in `topologies/`.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The blob of `plumber.yaml`, and the file itself (read: it is small).
    pub settings: Option<(Oid, SourceFile)>,
    /// Each topology directory and its tree, by name.
    pub topologies: Vec<(String, Oid)>,
    /// Entries directly in `topologies/` that are not directories (reported by validation).
    pub loose: Vec<SourceFile>,
}

/// One commit's topology files.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub commit: Oid,
    pub files: Vec<SourceFile>,
}

impl Repository {
    /// Opens a local repository (working tree or bare) by path or `file://` URL. A path inside
    /// a working tree opens the enclosing repository, and the topology repository is that
    /// subdirectory (as Argo CD's `path:`), read from each commit's tree.
    pub fn open(location: &str) -> Result<Self> {
        let path = local_path(location)?;
        let open_error = |source| Error::Open {
            location: location.to_owned(),
            source,
        };
        let git = git2::Repository::discover(&path).map_err(open_error)?;
        let prefix = match git.workdir() {
            Some(workdir) => {
                let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
                let inside = canonical(&path);
                let relative = inside
                    .strip_prefix(canonical(workdir))
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                let mut prefix: String = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix
            }
            None => String::new(),
        };
        Ok(Repository {
            git,
            location: location.to_owned(),
            prefix,
            budget: Budget::default(),
        })
    }

    /// The same handle, holding every commit it reads to `budget`.
    #[must_use]
    pub fn with_budget(mut self, budget: Budget) -> Repository {
        self.budget = budget;
        self
    }

    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    pub fn git(&self) -> &git2::Repository {
        &self.git
    }

    /// Resolves anything `git rev-parse` accepts (branch, tag, sha, `HEAD~2`) to a commit.
    pub fn resolve(&self, rev: &str) -> Result<Oid> {
        let unborn = matches!(self.git.head(), Err(e) if e.code() == git2::ErrorCode::UnbornBranch);
        let no_refs = self
            .git
            .references()
            .map(|mut refs| refs.next().is_none())
            .unwrap_or(false);
        if unborn && no_refs {
            return Err(Error::NoCommits {
                location: self.location.clone(),
            });
        }
        let unknown = |message: String| Error::UnknownRevision {
            rev: rev.to_owned(),
            location: self.location.clone(),
            message,
        };
        let object = self
            .git
            .revparse_single(rev)
            .map_err(|e| unknown(e.message().to_owned()))?;
        let commit = object.peel_to_commit().map_err(|_| {
            unknown(format!(
                "it names a {}, not a commit",
                kind_name(object.kind())
            ))
        })?;
        Ok(commit.id())
    }

    /// Who made `commit`, when, and the first line of its message.
    pub fn commit_info(&self, commit: Oid) -> Result<CommitInfo> {
        let read = |source| Error::Read {
            what: "the commit".into(),
            commit,
            source,
        };
        let found = self.git.find_commit(commit).map_err(read)?;
        let author = found.author();
        Ok(CommitInfo {
            author: match (author.name(), author.email()) {
                (Some(name), Some(email)) => format!("{name} <{email}>"),
                (Some(name), None) => name.to_owned(),
                (None, email) => email.unwrap_or_default().to_owned(),
            },
            summary: found.summary().unwrap_or_default().to_owned(),
            time: author.when().seconds(),
        })
    }

    /// The files of `commit` that can matter to a topology repository ([`spec::is_wanted`]).
    pub fn snapshot(&self, commit: Oid) -> Result<Snapshot> {
        let tree = self.commit_root(commit)?;
        Ok(Snapshot {
            commit,
            files: self.files_of(&tree, commit)?,
        })
    }

    /// The tree that merging `head` into `base` would produce. Objects the merge writes go to
    /// an in-memory object store, so the repository on disk is never changed.
    pub fn merge_preview(&self, base: Oid, head: Oid) -> Result<MergePreview> {
        match self.merge_tree(base, head)? {
            MergeTree::Conflicts(paths) => Ok(MergePreview::Conflicts(paths)),
            MergeTree::Merged(tree) => {
                let tree = self.git.find_tree(tree).map_err(|source| Error::Read {
                    what: "the merged tree".into(),
                    commit: head,
                    source,
                })?;
                Ok(MergePreview::Merged(self.files_of(&tree, head)?))
            }
        }
    }

    /// As [`Repository::merge_preview`], giving the topology repository's tree of the merge
    /// (unchanged directories keep their tree ids, so what is known of them stays known).
    /// When one side already contains the other, the merge is that side's tree.
    pub fn merge_tree(&self, base: Oid, head: Oid) -> Result<MergeTree> {
        let fail = |what: &str, source| Error::Read {
            what: what.to_owned(),
            commit: head,
            source,
        };
        // Unrelated histories have no merge base: the merge below works from an empty one.
        let merge_base = match self.git.merge_base(base, head) {
            Ok(found) => Some(found),
            Err(e) if e.code() == git2::ErrorCode::NotFound => None,
            Err(e) => return Err(fail("the merge base", e)),
        };
        if let Some(merge_base) = merge_base
            && (merge_base == base || merge_base == head)
        {
            let side = if merge_base == base { head } else { base };
            return Ok(MergeTree::Merged(self.commit_root(side)?.id()));
        }
        let fail = |what: &str, source| Error::Read {
            what: what.to_owned(),
            commit: head,
            source,
        };
        let odb = self.git.odb().map_err(|e| fail("the object database", e))?;
        odb.add_new_mempack_backend(1000)
            .map_err(|e| fail("an in-memory object store", e))?;
        let base_commit = self
            .git
            .find_commit(base)
            .map_err(|e| fail("the base commit", e))?;
        let head_commit = self
            .git
            .find_commit(head)
            .map_err(|e| fail("the head commit", e))?;
        let mut index = self
            .git
            .merge_commits(&base_commit, &head_commit, None)
            .map_err(|e| fail("the merge", e))?;
        if index.has_conflicts() {
            let mut paths: Vec<String> = index
                .conflicts()
                .map_err(|e| fail("the merge conflicts", e))?
                .filter_map(|c| c.ok())
                .filter_map(|c| c.our.or(c.their).or(c.ancestor))
                .map(|entry| String::from_utf8_lossy(&entry.path).into_owned())
                .collect();
            paths.sort();
            paths.dedup();
            return Ok(MergeTree::Conflicts(paths));
        }
        let tree = index
            .write_tree_to(&self.git)
            .and_then(|oid| self.git.find_tree(oid))
            .map_err(|e| fail("the merged tree", e))?;
        Ok(MergeTree::Merged(self.topology_root(&tree, head)?.id()))
    }

    /// The tree of the topology repository at `commit`.
    pub fn tree_of(&self, commit: Oid) -> Result<Oid> {
        Ok(self.commit_root(commit)?.id())
    }

    /// The parts of a topology repository's tree (`commit` names it in errors).
    pub fn layout(&self, tree: Oid, commit: Oid) -> Result<Layout> {
        let read = |what: &str, source| Error::Read {
            what: what.to_owned(),
            commit,
            source,
        };
        let odb = self.git.odb().map_err(|e| read("the object database", e))?;
        self.check_tree_size(&odb, tree, "", commit)?;
        let tree = self.git.find_tree(tree).map_err(|e| read("the tree", e))?;
        let mut layout = Layout {
            settings: None,
            topologies: Vec::new(),
            loose: Vec::new(),
        };
        if let Some(entry) = tree.get_name(spec::SETTINGS_FILE)
            && entry.kind() != Some(ObjectType::Tree)
        {
            let content = entry_content(&odb, &entry).map_err(|e| read(spec::SETTINGS_FILE, e))?;
            layout.settings = Some((
                entry.id(),
                SourceFile {
                    path: spec::SETTINGS_FILE.to_owned(),
                    content,
                },
            ));
        }
        let Some(dir) = tree.get_name(spec::TOPOLOGIES_DIR) else {
            return Ok(layout);
        };
        if dir.kind() != Some(ObjectType::Tree) {
            return Ok(layout);
        }
        self.check_tree_size(&odb, dir.id(), "topologies/", commit)?;
        let dir = self
            .git
            .find_tree(dir.id())
            .map_err(|e| read("topologies/", e))?;
        for entry in dir.iter() {
            let Some(name) = entry.name() else { continue };
            if entry.kind() == Some(ObjectType::Tree) {
                // Dot-directories are never read.
                if name.starts_with('.') {
                    continue;
                }
                layout.topologies.push((name.to_owned(), entry.id()));
                continue;
            }
            let path = format!("{}/{name}", spec::TOPOLOGIES_DIR);
            let is_link = entry.filemode() == i32::from(git2::FileMode::Link);
            let is_submodule = entry.kind() == Some(ObjectType::Commit);
            if !(spec::is_wanted(&path) || is_link || is_submodule) {
                continue;
            }
            let content = entry_content(&odb, &entry).map_err(|e| read(&path, e))?;
            layout.loose.push(SourceFile { path, content });
        }
        Ok(layout)
    }

    /// An error when the tree object `id` (the directory `dir`) is larger than
    /// [`MAX_TREE_BYTES`]: over budget before it is read.
    fn check_tree_size(&self, odb: &git2::Odb, id: Oid, dir: &str, commit: Oid) -> Result<()> {
        let (size, _) = odb.read_header(id).map_err(|source| Error::Read {
            what: format!("the tree {dir}"),
            commit,
            source,
        })?;
        if size as u64 > MAX_TREE_BYTES {
            return Err(Error::OverBudget {
                commit,
                exceeded: Exceeded {
                    limit: "files",
                    found: size as u64 / 32,
                    allowed: self.budget.files.min(MAX_TREE_BYTES / 32),
                    flag: "--max-commit-files",
                    key: "files",
                    largest: Some(dir.trim_end_matches('/').to_owned()).filter(|d| !d.is_empty()),
                },
            });
        }
        Ok(())
    }

    /// What the directory `tree` at `dir` (`""` for the topology repository's root, where
    /// only `topologies/` is looked into, or `topologies/<name>/`) holds, from its trees and
    /// the sizes git records: no blob is read. Counting stops once the files are over budget.
    pub fn measure(&self, tree: Oid, dir: &str, commit: Oid) -> Result<Measure> {
        let read = |what: &str, source| Error::Read {
            what: what.to_owned(),
            commit,
            source,
        };
        let odb = self.git.odb().map_err(|e| read("the object database", e))?;
        self.check_tree_size(&odb, tree, dir, commit)?;
        let tree = self.git.find_tree(tree).map_err(|e| read("the tree", e))?;
        let mut measure = Measure::default();
        let mut failure = None;
        let walked = walk(&self.git, &tree, dir, |dir, entry| {
            let Some(name) = entry.name() else {
                return TreeWalkResult::Skip;
            };
            if entry.kind() == Some(ObjectType::Tree) {
                let descend = (dir.is_empty() && name == spec::TOPOLOGIES_DIR)
                    || (dir.starts_with("topologies/") && !name.starts_with('.'));
                if !descend {
                    return TreeWalkResult::Skip;
                }
                if dir == "topologies/" {
                    measure.topologies += 1;
                }
                let path = format!("{dir}{name}/");
                if let Err(error) = self.check_tree_size(&odb, entry.id(), &path, commit) {
                    failure = Some(error);
                    return TreeWalkResult::Abort;
                }
                return TreeWalkResult::Ok;
            }
            if !dir.starts_with("topologies/") {
                return TreeWalkResult::Ok;
            }
            measure.files += 1;
            if measure.files > self.budget.files {
                return TreeWalkResult::Abort;
            }
            let path = format!("{dir}{name}");
            if !spec::is_wanted(&path) {
                return TreeWalkResult::Ok;
            }
            measure.steps += 1;
            let is_link = entry.filemode() == i32::from(git2::FileMode::Link);
            if entry.kind() == Some(ObjectType::Blob) && !is_link {
                match odb.read_header(entry.id()) {
                    Ok((size, _)) => measure.bytes += size as u64,
                    Err(error) => {
                        failure = Some(read(&path, error));
                        return TreeWalkResult::Abort;
                    }
                }
            }
            TreeWalkResult::Ok
        });
        if let Some(error) = failure {
            return Err(error);
        }
        if measure.files > self.budget.files {
            // The walk stopped there: at least this many.
            return Ok(measure);
        }
        walked.map_err(|e| read("the tree", e))?;
        Ok(measure)
    }

    /// An error when `measure` (of `commit`) is over this handle's budget.
    pub fn check_budget(
        &self,
        measure: &Measure,
        largest: Option<&str>,
        commit: Oid,
    ) -> Result<()> {
        self.budget
            .check(measure, largest)
            .map_err(|exceeded| Error::OverBudget { commit, exceeded })
    }

    /// The wanted files of the topology directory `topologies/<name>` whose tree is `tree`,
    /// which the caller measured within the budget ([`Repository::measure`]: the daemon's tree
    /// cache does, for the whole commit, before it reads any topology).
    pub fn topology_files(&self, name: &str, tree: Oid, commit: Oid) -> Result<Vec<SourceFile>> {
        let tree = self.git.find_tree(tree).map_err(|source| Error::Read {
            what: format!("{}/{name}", spec::TOPOLOGIES_DIR),
            commit,
            source,
        })?;
        self.files_below(&tree, &format!("{}/{name}/", spec::TOPOLOGIES_DIR), commit)
    }

    /// The `CODEOWNERS` of `commit`, where GitHub looks for it (at the root of the git
    /// repository, also when the topology repository is a subdirectory), or `None`. A file
    /// over the size cap is not read, as GitHub does not load one over its own.
    pub fn codeowners(&self, commit: Oid) -> Result<Option<crate::owners::CodeOwners>> {
        let read = |what: &str, source| Error::Read {
            what: what.to_owned(),
            commit,
            source,
        };
        let tree = self
            .git
            .find_commit(commit)
            .and_then(|c| c.tree())
            .map_err(|e| read("the tree", e))?;
        let odb = self.git.odb().map_err(|e| read("the object database", e))?;
        for location in crate::owners::LOCATIONS {
            let Ok(entry) = tree.get_path(Path::new(location)) else {
                continue;
            };
            if entry.kind() != Some(ObjectType::Blob) || entry.filemode() == 0o120000 {
                continue;
            }
            return match read_blob(&odb, entry.id()).map_err(|e| read(location, e))? {
                FileContent::Bytes(bytes) => Ok(Some(
                    crate::owners::CodeOwners::parse(location, &String::from_utf8_lossy(&bytes))
                        .within(&self.prefix),
                )),
                _ => Ok(None),
            };
        }
        Ok(None)
    }

    /// The tree of the topology repository at `commit`.
    fn commit_root(&self, commit: Oid) -> Result<git2::Tree<'_>> {
        let tree = self
            .git
            .find_commit(commit)
            .and_then(|c| c.tree())
            .map_err(|source| Error::Read {
                what: "the tree".into(),
                commit,
                source,
            })?;
        self.topology_root(&tree, commit)
    }

    fn topology_root<'r>(&'r self, tree: &git2::Tree<'r>, commit: Oid) -> Result<git2::Tree<'r>> {
        if self.prefix.is_empty() {
            return Ok(tree.clone());
        }
        let dir = self.prefix.trim_end_matches('/');
        tree.get_path(Path::new(dir))
            .and_then(|entry| entry.to_object(&self.git))
            .and_then(|object| object.peel_to_tree())
            .map_err(|_| Error::MissingDirectory {
                dir: dir.to_owned(),
                commit,
            })
    }

    /// Writes the files of `dirs` (directories of the topology repository, each with all
    /// below it) of `commit` under `dest`, so that `exec` and `http` commands run next to
    /// their step files; nothing else of the commit is written. Regular files only (symlinks
    /// and submodules are skipped); an entry whose name is not a plain file name refuses the
    /// checkout, and the budget's `checkout_bytes` bounds what is written, checked before
    /// anything is. Each file is written whole and renamed into place, and a directory is
    /// recorded complete only once all its files are (in `.plumber-checkout`): a crash never
    /// leaves a checkout that looks done, and directories asked for later are added.
    pub fn checkout(&self, commit: Oid, dirs: &BTreeSet<String>, dest: &Path) -> Result<()> {
        self.checkout_of(commit, None, dirs, dest, None)
    }

    /// [`Repository::checkout`], each directory written once into `trees` (named by its git
    /// tree id, so a directory no commit changed is never written again) and linked from
    /// `dest` by a symlink: a new commit writes only the directories it changed. Whoever
    /// shares `trees` removes only what no checkout links to ([`linked_trees`]).
    pub fn checkout_shared(
        &self,
        commit: Oid,
        dirs: &BTreeSet<String>,
        dest: &Path,
        trees: &Path,
    ) -> Result<()> {
        self.checkout_of(commit, None, dirs, dest, Some(trees))
    }

    /// [`Repository::checkout`] of `tree`: a merge of `commit` that no commit has (its
    /// objects in this handle). Errors name `commit`.
    pub fn checkout_tree(
        &self,
        tree: Oid,
        commit: Oid,
        dirs: &BTreeSet<String>,
        dest: &Path,
    ) -> Result<()> {
        self.checkout_of(commit, Some(tree), dirs, dest, None)
    }

    fn checkout_of(
        &self,
        commit: Oid,
        tree: Option<Oid>,
        dirs: &BTreeSet<String>,
        dest: &Path,
        trees: Option<&Path>,
    ) -> Result<()> {
        let read = |what: &str, source| Error::Read {
            what: what.to_owned(),
            commit,
            source,
        };
        let write = |path: &Path, e: std::io::Error| Error::Checkout {
            path: path.to_path_buf(),
            source: e,
        };
        std::fs::create_dir_all(dest).map_err(|e| write(dest, e))?;
        let index = dest.join(CHECKOUT_INDEX);
        let mut done: BTreeSet<String> = std::fs::read_to_string(&index)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        // Only what no complete or wanted directory above it holds already.
        let wanted: BTreeSet<String> = dirs
            .iter()
            .filter(|dir| !done.iter().any(|d| is_within(dir, d)))
            .filter(|dir| !dirs.iter().any(|d| d != *dir && is_within(dir, d)))
            .cloned()
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let root = match tree {
            Some(tree) => self
                .git
                .find_tree(tree)
                .map_err(|e| read("the merged tree", e))?,
            None => self.commit_root(commit)?,
        };
        let odb = self.git.odb().map_err(|e| read("the object database", e))?;
        // Per wanted directory: its tree (`None` at the root), and the files to write.
        let mut written: Vec<(&String, Option<Oid>, Vec<Blob>)> = Vec::new();
        let mut bytes: u64 = 0;
        for dir in &wanted {
            if let Some(name) = dir
                .split('/')
                .filter(|_| !dir.is_empty())
                .find(|name| !is_safe_name(name))
            {
                return Err(Error::UnsafeName {
                    commit,
                    dir: dir.clone(),
                    name: name.to_owned(),
                });
            }
            let tree = if dir.is_empty() {
                root.clone()
            } else {
                let Ok(entry) = root.get_path(Path::new(dir)) else {
                    continue;
                };
                self.check_tree_size(&odb, entry.id(), dir, commit)?;
                match self.git.find_tree(entry.id()) {
                    Ok(tree) => tree,
                    // Not a directory: nothing to write.
                    Err(_) => continue,
                }
            };
            let start = if dir.is_empty() {
                String::new()
            } else {
                format!("{dir}/")
            };
            let shared = trees
                .filter(|_| !dir.is_empty())
                .map(|t| t.join(tree.id().to_string()));
            // Measured all the same (the budget is the whole checkout's), but not written.
            let stored = shared.as_deref().is_some_and(Path::exists);
            let mut blobs = Vec::new();
            let mut failure = None;
            let walked = walk(&self.git, &tree, &start, |at, entry| {
                let name = entry.name().unwrap_or_default();
                if !is_safe_name(name) {
                    failure = Some(Error::UnsafeName {
                        commit,
                        dir: at.trim_end_matches('/').to_owned(),
                        name: name.to_owned(),
                    });
                    return TreeWalkResult::Abort;
                }
                if entry.kind() == Some(ObjectType::Tree) {
                    let path = format!("{at}{name}");
                    if let Err(error) = self.check_tree_size(&odb, entry.id(), &path, commit) {
                        failure = Some(error);
                        return TreeWalkResult::Abort;
                    }
                    return TreeWalkResult::Ok;
                }
                if entry.kind() != Some(ObjectType::Blob)
                    || entry.filemode() == i32::from(git2::FileMode::Link)
                {
                    return TreeWalkResult::Ok;
                }
                match odb.read_header(entry.id()) {
                    Ok((size, _)) => bytes += size as u64,
                    Err(error) => {
                        failure = Some(read(&format!("{at}{name}"), error));
                        return TreeWalkResult::Abort;
                    }
                }
                if let Err(exceeded) = self.budget.check_checkout(bytes, Some(dir)) {
                    failure = Some(Error::OverBudget { commit, exceeded });
                    return TreeWalkResult::Abort;
                }
                if !stored {
                    blobs.push((format!("{at}{name}"), entry.id(), entry.filemode()));
                }
                TreeWalkResult::Ok
            });
            if let Some(error) = failure {
                return Err(error);
            }
            walked.map_err(|e| read("the tree", e))?;
            written.push((dir, shared.is_some().then(|| tree.id()), blobs));
        }
        for (dir, tree, blobs) in written {
            let Some((tree, trees)) = tree.zip(trees) else {
                self.write_blobs(dest, &blobs, commit)?;
                continue;
            };
            let stored = trees.join(tree.to_string());
            if !stored.exists() {
                // Written whole beside it, then renamed into place: a directory in `trees`
                // is always complete.
                std::fs::create_dir_all(trees).map_err(|e| write(trees, e))?;
                let staging = tempfile::Builder::new()
                    .prefix(".writing-")
                    .tempdir_in(trees)
                    .map_err(|e| write(trees, e))?;
                let prefix = format!("{dir}/");
                let relative: Vec<Blob> = blobs
                    .into_iter()
                    .map(|(path, id, mode)| {
                        (
                            path.strip_prefix(&prefix).unwrap_or(&path).to_owned(),
                            id,
                            mode,
                        )
                    })
                    .collect();
                self.write_blobs(staging.path(), &relative, commit)?;
                match std::fs::rename(staging.path(), &stored) {
                    Ok(()) => {}
                    // Another checkout wrote the same tree meanwhile.
                    Err(_) if stored.exists() => {}
                    Err(error) => return Err(write(&stored, error)),
                }
            }
            link(
                &std::path::absolute(&stored).map_err(|e| write(&stored, e))?,
                &dest.join(dir),
            )
            .map_err(|e| write(&dest.join(dir), e))?;
        }
        done.extend(wanted);
        let text: String = done.iter().map(|d| format!("{d}\n")).collect();
        let mut file = tempfile::NamedTempFile::new_in(dest).map_err(|e| write(dest, e))?;
        std::io::Write::write_all(&mut file, text.as_bytes()).map_err(|e| write(&index, e))?;
        file.persist(&index).map_err(|e| write(&index, e.error))?;
        Ok(())
    }

    /// Writes `blobs` (path under `dest`, blob, mode) of `commit`.
    fn write_blobs(&self, dest: &Path, blobs: &[Blob], commit: Oid) -> Result<()> {
        let write = |path: &Path, e: std::io::Error| Error::Checkout {
            path: path.to_path_buf(),
            source: e,
        };
        for (path, id, mode) in blobs {
            let blob = self.git.find_blob(*id).map_err(|source| Error::Read {
                what: path.clone(),
                commit,
                source,
            })?;
            let target = dest.join(path);
            let parent = target.parent().unwrap_or(dest);
            std::fs::create_dir_all(parent).map_err(|e| write(parent, e))?;
            // Whole, then renamed: a process already running in this directory (another
            // step of the commit) never reads a half-written file.
            let mut file = tempfile::NamedTempFile::new_in(parent).map_err(|e| write(parent, e))?;
            std::io::Write::write_all(&mut file, blob.content()).map_err(|e| write(&target, e))?;
            if *mode == i32::from(git2::FileMode::BlobExecutable) {
                use std::os::unix::fs::PermissionsExt as _;
                file.as_file()
                    .set_permissions(std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| write(&target, e))?;
            }
            file.persist(&target).map_err(|e| write(&target, e.error))?;
        }
        Ok(())
    }

    /// Reads the wanted files of any tree (a commit's, or a merge preview's), once it is
    /// measured within the budget.
    pub fn files_of(&self, tree: &git2::Tree, commit: Oid) -> Result<Vec<SourceFile>> {
        let measure = self.measure(tree.id(), "", commit)?;
        self.check_budget(&measure, None, commit)?;
        self.files_below(tree, "", commit)
    }

    /// As [`Repository::files_of`], for the tree at path `dir` (`""`, or `a/b/`), measured
    /// within the budget by the caller.
    fn files_below(&self, tree: &git2::Tree, dir: &str, commit: Oid) -> Result<Vec<SourceFile>> {
        let odb = self.git.odb().map_err(|source| Error::Read {
            what: "the object database".into(),
            commit,
            source,
        })?;
        let mut files = Vec::new();
        let mut failure = None;
        let walked = walk(&self.git, tree, dir, |dir, entry| {
            let Some(name) = entry.name() else {
                return TreeWalkResult::Skip;
            };
            if entry.kind() == Some(ObjectType::Tree) {
                // Only `topologies/` matters, and dot-directories are never read.
                let descend = (dir.is_empty() && name == spec::TOPOLOGIES_DIR)
                    || (dir.starts_with("topologies/") && !name.starts_with('.'));
                return if descend {
                    TreeWalkResult::Ok
                } else {
                    TreeWalkResult::Skip
                };
            }
            // Built only for files: a path per directory level would be quadratic.
            let path = format!("{dir}{name}");
            let is_link = entry.filemode() == i32::from(git2::FileMode::Link);
            let is_submodule = entry.kind() == Some(ObjectType::Commit);
            // A symlink or submodule directly in topologies/ would be a topology directory.
            let maybe_topology = dir == "topologies/";
            if !(spec::is_wanted(&path) || ((is_link || is_submodule) && maybe_topology)) {
                return TreeWalkResult::Ok;
            }
            let content = match entry_content(&odb, entry) {
                Ok(content) => content,
                Err(e) => {
                    failure = Some((path, e));
                    return TreeWalkResult::Abort;
                }
            };
            files.push(SourceFile { path, content });
            TreeWalkResult::Ok
        });
        // An aborted walk reports the blob that failed; otherwise the walk's own error.
        if let Some((path, source)) = failure {
            return Err(Error::Read {
                what: path,
                commit,
                source,
            });
        }
        walked.map_err(|source| Error::Read {
            what: "the tree".into(),
            commit,
            source,
        })?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }
}

/// `git2::Tree::walk` in pre-order (`visit` gets the entry's directory, `a/b/`, and decides
/// with [`TreeWalkResult`] whether to descend), but with a stack of its own: libgit2's walk
/// recurses once per directory level, and a commit can nest directories deep enough to
/// overflow any thread's stack.
fn walk(
    git: &git2::Repository,
    tree: &git2::Tree,
    start: &str,
    mut visit: impl FnMut(&str, &git2::TreeEntry<'_>) -> TreeWalkResult,
) -> std::result::Result<(), git2::Error> {
    /// A tree being walked, its next entry, and the length of `dir` without its name.
    struct Level<'r> {
        tree: git2::Tree<'r>,
        next: usize,
        dir_len: usize,
    }
    let mut stack = vec![Level {
        tree: tree.clone(),
        next: 0,
        dir_len: start.len(),
    }];
    let mut dir = start.to_owned();
    while let Some(level) = stack.last_mut() {
        let index = level.next;
        level.next += 1;
        let Some(entry) = level.tree.get(index) else {
            dir.truncate(level.dir_len);
            stack.pop();
            continue;
        };
        let descend = match visit(&dir, &entry) {
            TreeWalkResult::Abort => return Err(git2::Error::from_str("the walk was aborted")),
            TreeWalkResult::Skip => None,
            TreeWalkResult::Ok => (entry.kind() == Some(ObjectType::Tree))
                .then(|| entry.name().map(|name| (entry.id(), name.to_owned())))
                .flatten(),
        };
        drop(entry);
        if let Some((id, name)) = descend {
            let dir_len = dir.len();
            dir.push_str(&name);
            dir.push('/');
            stack.push(Level {
                tree: git.find_tree(id)?,
                next: 0,
                dir_len,
            });
        }
    }
    Ok(())
}

/// Makes `at` a symlink to `to`, replacing what is there: a link of an older checkout, or a
/// directory written for a step directory inside this one (`to` holds it too).
fn link(to: &Path, at: &Path) -> std::io::Result<()> {
    if let Some(parent) = at.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::symlink_metadata(at) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(at)?,
        Ok(_) => std::fs::remove_file(at)?,
        Err(_) => {}
    }
    std::os::unix::fs::symlink(to, at)
}

/// The trees (names in a [`Repository::checkout_shared`] store) that the checkouts in
/// `checkouts` link to: what a collection of the store must keep.
pub fn linked_trees(checkouts: &Path) -> BTreeSet<String> {
    let mut linked = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(checkouts) else {
        return linked;
    };
    for checkout in entries.flatten().map(|e| e.path()) {
        let index = std::fs::read_to_string(checkout.join(CHECKOUT_INDEX)).unwrap_or_default();
        for dir in index.lines().filter(|d| !d.is_empty()) {
            if let Ok(target) = std::fs::read_link(checkout.join(dir))
                && let Some(name) = target.file_name()
            {
                linked.insert(name.to_string_lossy().into_owned());
            }
        }
    }
    linked
}

/// Whether directory `dir` is `ancestor` or below it (`""` is the root, above everything).
fn is_within(dir: &str, ancestor: &str) -> bool {
    ancestor.is_empty()
        || dir == ancestor
        || dir
            .strip_prefix(ancestor)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether a tree entry's name can be joined to a path as one plain component: git itself
/// refuses the others on checkout, but a pushed tree may still hold them.
fn is_safe_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.eq_ignore_ascii_case(".git")
        && !name.contains(['/', '\\', '\0'])
}

/// What a tree entry holds for validation: a symlink or submodule is reported, never read.
fn entry_content(
    odb: &git2::Odb,
    entry: &git2::TreeEntry<'_>,
) -> std::result::Result<FileContent, git2::Error> {
    if entry.filemode() == i32::from(git2::FileMode::Link) {
        return Ok(FileContent::Unsupported {
            what: "a symlink (symlinks are never followed)",
        });
    }
    if entry.kind() == Some(ObjectType::Commit) {
        return Ok(FileContent::Unsupported {
            what: "a submodule",
        });
    }
    read_blob(odb, entry.id())
}

/// A blob's bytes, or `TooLarge` without reading it (the header gives the size).
fn read_blob(odb: &git2::Odb, id: Oid) -> std::result::Result<FileContent, git2::Error> {
    let (size, _) = odb.read_header(id)?;
    let size = size as u64;
    if size > MAX_FILE_BYTES {
        return Ok(FileContent::TooLarge { size });
    }
    Ok(FileContent::Bytes(odb.read(id)?.data().to_vec()))
}

fn kind_name(kind: Option<ObjectType>) -> &'static str {
    match kind {
        Some(ObjectType::Tree) => "tree",
        Some(ObjectType::Blob) => "blob",
        Some(ObjectType::Tag) => "tag",
        _ => "non-commit object",
    }
}

fn local_path(location: &str) -> Result<PathBuf> {
    if let Some(path) = location.strip_prefix("file://") {
        return Ok(PathBuf::from(path));
    }
    if location.contains("://") || looks_like_scp(location) {
        return Err(Error::UnsupportedLocation {
            location: location.to_owned(),
        });
    }
    Ok(Path::new(location).to_path_buf())
}

/// `git@host:org/repo.git`: a remote, not a path.
fn looks_like_scp(location: &str) -> bool {
    match location.split_once(':') {
        Some((user_host, _)) => user_host.contains('@') && !user_host.contains('/'),
        None => false,
    }
}
