//! Real git repositories in temporary directories, with real commits made through git2.
#![allow(dead_code)] // each test binary uses a different part

pub mod daemon;

use std::path::{Path, PathBuf};

use git2::build::TreeUpdateBuilder;
use git2::{FileMode, Oid, Repository, RepositoryInitOptions, Signature};
use tempfile::TempDir;

pub enum Change {
    Write(String, Vec<u8>),
    Link(String, String),
    Remove(String),
}

pub fn write(path: &str, content: impl AsRef<[u8]>) -> Change {
    Change::Write(path.to_owned(), content.as_ref().to_vec())
}

pub fn link(path: &str, target: &str) -> Change {
    Change::Link(path.to_owned(), target.to_owned())
}

pub fn remove(path: &str) -> Change {
    Change::Remove(path.to_owned())
}

pub struct TestRepo {
    dir: TempDir,
    pub git: Repository,
}

impl TestRepo {
    /// An empty repository whose HEAD is `refs/heads/main`.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let git = Repository::init_opts(
            dir.path(),
            RepositoryInitOptions::new().initial_head("main"),
        )
        .expect("git init");
        TestRepo { dir, git }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn location(&self) -> String {
        self.dir.path().to_string_lossy().into_owned()
    }

    /// Commits `changes` on top of `branch` (created if missing) and returns the commit.
    pub fn commit(&self, branch: &str, message: &str, changes: &[Change]) -> Oid {
        let refname = format!("refs/heads/{branch}");
        let parent = self
            .git
            .find_reference(&refname)
            .ok()
            .and_then(|r| r.peel_to_commit().ok());
        let base_tree = match &parent {
            Some(commit) => commit.tree().expect("parent tree"),
            None => {
                let empty = self
                    .git
                    .treebuilder(None)
                    .expect("treebuilder")
                    .write()
                    .expect("empty tree");
                self.git.find_tree(empty).expect("empty tree")
            }
        };
        let mut update = TreeUpdateBuilder::new();
        for change in changes {
            match change {
                Change::Write(path, bytes) => {
                    let blob = self.git.blob(bytes).expect("blob");
                    update.upsert(path.as_str(), blob, FileMode::Blob);
                }
                Change::Link(path, target) => {
                    let blob = self.git.blob(target.as_bytes()).expect("blob");
                    update.upsert(path.as_str(), blob, FileMode::Link);
                }
                Change::Remove(path) => {
                    update.remove(path.as_str());
                }
            }
        }
        let tree_id = update.create_updated(&self.git, &base_tree).expect("tree");
        let tree = self.git.find_tree(tree_id).expect("tree");
        // A fixed time keeps commit ids reproducible, so golden files can name them.
        let signature = Signature::new(
            "Test",
            "test@example.com",
            &git2::Time::new(1_700_000_000, 0),
        )
        .expect("signature");
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        self.git
            .commit(
                Some(&refname),
                &signature,
                &signature,
                message,
                &tree,
                &parents,
            )
            .expect("commit")
    }

    /// Commits a whole snapshot: every file of `files` written, every other file removed.
    pub fn commit_snapshot(&self, branch: &str, message: &str, files: &[(String, Vec<u8>)]) -> Oid {
        let refname = format!("refs/heads/{branch}");
        let existing: Vec<String> = self
            .git
            .find_reference(&refname)
            .ok()
            .and_then(|r| r.peel_to_tree().ok())
            .map(|tree| {
                let mut paths = Vec::new();
                tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
                    if entry.kind() != Some(git2::ObjectType::Tree) {
                        paths.push(format!("{dir}{}", entry.name().unwrap_or_default()));
                    }
                    git2::TreeWalkResult::Ok
                })
                .expect("walk");
                paths
            })
            .unwrap_or_default();
        let mut changes: Vec<Change> = existing
            .into_iter()
            .filter(|p| !files.iter().any(|(f, _)| f == p))
            .map(Change::Remove)
            .collect();
        changes.extend(
            files
                .iter()
                .map(|(p, b)| Change::Write(p.clone(), b.clone())),
        );
        self.commit(branch, message, &changes)
    }
}

/// The files of `example-repo/`, repo-relative, as a test fixture.
pub fn example_files() -> Vec<(String, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("example-repo");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read example-repo") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let relative = path
                    .strip_prefix(&root)
                    .expect("inside")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push((relative, std::fs::read(&path).expect("read file")));
            }
        }
    }
    out.sort();
    out
}

/// Validates `commit` of `repo` through the library, as the CLI does.
pub fn validate_commit(repo: &TestRepo, commit: Oid) -> plumber::Validation {
    let opened = plumber::repo::Repository::open(&repo.location()).expect("open");
    let snapshot = opened.snapshot(commit).expect("snapshot");
    plumber::validate(&snapshot.files)
}

/// `plumber-processor`, beside the `plumber` binary under test: built if it is not there
/// yet (a `cargo test` of one test target builds only `plumber`).
pub fn processor_binary() -> PathBuf {
    let sibling = PathBuf::from(plumber_bin()).with_file_name("plumber-processor");
    if !sibling.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args([
                "build",
                "-p",
                "plumber-processor",
                "--bin",
                "plumber-processor",
            ])
            .status()
            .expect("cargo build");
        assert!(status.success(), "building plumber-processor failed");
    }
    sibling
}

pub fn plumber_bin() -> &'static str {
    env!("CARGO_BIN_EXE_plumber")
}

/// Runs the `plumber` binary; returns (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let output = std::process::Command::new(plumber_bin())
        .args(args)
        .output()
        .expect("run plumber");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// One blob of 1 MiB named by `count` step files of topology `bomb`: a push of about 1 MB
/// that, read and parsed, would be gigabytes.
pub fn bomb(repo: &TestRepo, branch: &str, count: usize) -> Oid {
    let git = &repo.git;
    let blob = git
        .blob(
            format!(
                "# {}\nkind: source\ntopic: x\n",
                "x".repeat(1024 * 1024 - 64)
            )
            .as_bytes(),
        )
        .unwrap();
    let mut steps = git.treebuilder(None).unwrap();
    for i in 0..count {
        steps
            .insert(format!("s{i}.yaml"), blob, FileMode::Blob.into())
            .unwrap();
    }
    let steps = steps.write().unwrap();
    let parent = git
        .find_reference(&format!("refs/heads/{branch}"))
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let mut topologies = git
        .treebuilder(Some(
            &parent
                .tree()
                .unwrap()
                .get_name("topologies")
                .unwrap()
                .to_object(git)
                .unwrap()
                .peel_to_tree()
                .unwrap(),
        ))
        .unwrap();
    topologies
        .insert("bomb", steps, FileMode::Tree.into())
        .unwrap();
    let topologies = topologies.write().unwrap();
    let mut root = git.treebuilder(Some(&parent.tree().unwrap())).unwrap();
    root.insert("topologies", topologies, FileMode::Tree.into())
        .unwrap();
    let tree = git.find_tree(root.write().unwrap()).unwrap();
    let signature = git2::Signature::now("Mallory", "mallory@example.com").unwrap();
    git.commit(
        Some(&format!("refs/heads/{branch}")),
        &signature,
        &signature,
        "3,000 steps, one blob",
        &tree,
        &[&parent],
    )
    .unwrap()
}

/// Topology `t`: `in` (topic `source`) → `clean` (a jq step tagging each record with `by`) →
/// `out` (topic `sink`).
pub fn tagged(source: &str, sink: &str, by: &str) -> Vec<Change> {
    vec![
        write(
            "topologies/t/in.yaml",
            format!("kind: source\ntopic: {source}\n"),
        ),
        write(
            "topologies/t/clean.yaml",
            format!("kind: processor\ninput: in\njq: '. + {{by: \"{by}\"}}'\n"),
        ),
        write(
            "topologies/t/out.yaml",
            format!("kind: sink\ntopic: {sink}\ninput: clean\n"),
        ),
    ]
}

/// A repository whose `main` holds one topology `t`: `in` (topic `t-in`) → `clean` (jq `.`)
/// → `out` (topic `t-out`).
pub fn one_topology() -> TestRepo {
    let repo = TestRepo::new();
    repo.commit(
        "main",
        "one topology",
        &[
            write("topologies/t/in.yaml", "kind: source\ntopic: t-in\n"),
            write(
                "topologies/t/clean.yaml",
                "kind: processor\ninput: in\njq: '.'\n",
            ),
            write(
                "topologies/t/out.yaml",
                "kind: sink\ntopic: t-out\ninput: clean\n",
            ),
        ],
    );
    repo
}
