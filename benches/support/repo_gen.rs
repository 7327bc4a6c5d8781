//! Generates a large topology repository for benchmarks: `topologies` topologies of 20 steps
//! (a source, a binary tree of 18 jq processors, a sink reading the leaves), committed twice
//! with git2; the second commit changes `changed` processors in different topologies.
//! [`step_files`] alone gives one topology's files, for benchmarks that need no repository.

use std::path::Path;

use git2::build::TreeUpdateBuilder;
use git2::{FileMode, Oid, Repository, Signature, Time};

pub const PROCESSORS: usize = 18;

/// The files (path, content) of topology `topology`, with the processors in `bumped`
/// changed (another jq threshold: a new identity for each, and for everything below it).
pub fn step_files(topology: usize, bumped: &[usize]) -> Vec<(String, String)> {
    let dir = format!("topologies/t{topology:05}");
    let mut files = vec![(
        format!("{dir}/sources/in.yaml"),
        format!("kind: source\ntopic: in-{topology}\n"),
    )];
    for p in 0..PROCESSORS {
        let input = if p == 0 {
            "in".to_string()
        } else {
            format!("p{:02}", (p - 1) / 2)
        };
        let threshold = p + if bumped.contains(&p) { 1000 } else { 0 };
        files.push((
            format!("{dir}/steps/p{p:02}.yaml"),
            format!(
                "kind: processor\ninput: {input}\njq: 'select(.v > {threshold}) | {{id, v}}'\nscale: {{ min: 1, max: 4 }}\n"
            ),
        ));
    }
    let leaves: Vec<String> = (0..PROCESSORS)
        .filter(|p| 2 * p + 1 >= PROCESSORS)
        .map(|p| format!("p{p:02}"))
        .collect();
    files.push((
        format!("{dir}/sinks/out.yaml"),
        format!(
            "kind: sink\ntopic: out-{topology}\ninput: [{}]\n",
            leaves.join(", ")
        ),
    ));
    files
}

/// Creates the repository at `dir`; returns (first commit, second commit).
pub fn generate(dir: &Path, topologies: usize, changed: usize) -> Result<(Oid, Oid), git2::Error> {
    let git = Repository::init(dir)?;
    let signature = Signature::new("Bench", "bench@example.com", &Time::new(1_700_000_000, 0))?;
    let empty = git.find_tree(git.treebuilder(None)?.write()?)?;

    let mut update = TreeUpdateBuilder::new();
    for t in 0..topologies {
        for (path, content) in step_files(t, &[]) {
            update.upsert(path.as_str(), git.blob(content.as_bytes())?, FileMode::Blob);
        }
    }
    let tree = git.find_tree(update.create_updated(&git, &empty)?)?;
    let first = git.commit(Some("HEAD"), &signature, &signature, "base", &tree, &[])?;

    // Change one mid-tree processor in each of `changed` topologies spread over the repo.
    let mut update = TreeUpdateBuilder::new();
    for i in 0..changed {
        let t = i * topologies / changed.max(1);
        let p = 3;
        for (path, content) in step_files(t, &[p]) {
            if path.ends_with(&format!("p{p:02}.yaml")) {
                update.upsert(path.as_str(), git.blob(content.as_bytes())?, FileMode::Blob);
            }
        }
    }
    let tree = git.find_tree(update.create_updated(&git, &tree)?)?;
    let parent = git.find_commit(first)?;
    let second = git.commit(
        Some("HEAD"),
        &signature,
        &signature,
        "change",
        &tree,
        &[&parent],
    )?;
    Ok((first, second))
}
