//! Plans of watched refs at scale (issue 17): a repository of N topologies × 20 steps, what
//! runs = the tracked branch (saved in the state directory as a settled cutover leaves it),
//! and 30 branches each changing one step. Measured, as the daemon does them:
//!
//! - `full plan today`: read both commits, validate both, plan (no cache), the reference;
//! - `read both`: reading both commits' blobs out of git, the floor;
//! - `cached plan`: one plan through the daemon's tree cache (each tree validated once);
//! - `push to main`: a new commit on the tracked branch (one step of another topology): the
//!   follower's load of it (validation and checkout), then, timed apart, one pass of the
//!   plans worker making all 30 plans fresh;
//! - `push to a branch`: one new commit on one branch, and the pass that makes its plan fresh.
//!
//! Medians and ranges of RUNS runs (default 5) at 100 and 1,000 topologies (SIZES="100 1000
//! 5000" for more). `bash bench/refs.sh` writes bench/results/refs.md.

#![allow(clippy::expect_used, clippy::unwrap_used)] // a broken benchmark setup should stop loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use git2::build::TreeUpdateBuilder;
use git2::{FileMode, Oid, Repository, Signature, Time};
use plumber::daemon::review::plans::Planner;
use plumber::daemon::{Context, DaemonConfig};
use plumber::plan::Deployment;
use plumber::runtime::local::{LocalConfig, LocalRuntime};
use plumber::store::TopologyRecord;

#[path = "support/repo_gen.rs"]
mod repo_gen;

const BRANCHES: usize = 30;

/// Commits `changes` (topology, processor, bump) on `parent` to `refname`.
fn commit(git: &Repository, refname: &str, parent: Oid, changes: &[(usize, usize, usize)]) -> Oid {
    let files: Vec<(String, String)> = changes
        .iter()
        .map(|&(topology, processor, bump)| {
            let path = format!("topologies/t{topology:05}/steps/p{processor:02}.yaml");
            let input = if processor == 0 {
                "in".to_string()
            } else {
                format!("p{:02}", (processor - 1) / 2)
            };
            let content = format!(
                "kind: processor\ninput: {input}\njq: 'select(.v > {}) | {{id, v}}'\nscale: {{ min: 1, max: 4 }}\n",
                processor + bump
            );
            (path, content)
        })
        .collect();
    commit_files(git, refname, parent, &files)
}

/// Commits `files` (path, content) on `parent` to `refname`.
fn commit_files(git: &Repository, refname: &str, parent: Oid, files: &[(String, String)]) -> Oid {
    let signature = Signature::new("Bench", "bench@example.com", &Time::new(1_700_000_000, 0))
        .expect("signature");
    let parent = git.find_commit(parent).expect("parent");
    let mut update = TreeUpdateBuilder::new();
    for (path, content) in files {
        let blob = git.blob(content.as_bytes()).expect("blob");
        update.upsert(path.as_str(), blob, FileMode::Blob);
    }
    let tree = update
        .create_updated(git, &parent.tree().expect("tree"))
        .expect("tree");
    let tree = git.find_tree(tree).expect("tree");
    // Branches are updated by reference, not by commit(): the ref may not exist yet.
    let oid = git
        .commit(None, &signature, &signature, "change", &tree, &[&parent])
        .expect("commit");
    git.reference(refname, oid, true, "bench").expect("ref");
    oid
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Median, min and max of `runs` timings of `f`.
fn measure(runs: usize, mut f: impl FnMut() -> Duration) -> (f64, f64, f64) {
    let mut times: Vec<f64> = (0..runs).map(|_| seconds(f())).collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0], times[times.len() - 1])
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let sizes: Vec<usize> = std::env::var("SIZES")
        .unwrap_or_else(|_| "100 1000".into())
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    for n in sizes {
        bench(n, runs);
    }
}

fn bench(n: usize, runs: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo_dir = dir.path().join("repo");
    let (main, changed) = repo_gen::generate(&repo_dir, n, 10).expect("generate");
    let git = Repository::open(&repo_dir).expect("open");
    // generate() leaves HEAD at the second commit; `main` starts at the first. HEAD's branch
    // (git's default name, unless it is `main`) would be a 31st watched ref: it goes.
    let generated = git.head().expect("head").name().map(str::to_owned);
    git.reference("refs/heads/main", main, true, "bench")
        .expect("main");
    git.set_head("refs/heads/main").expect("HEAD");
    if let Some(generated) = generated.filter(|name| name != "refs/heads/main") {
        git.find_reference(&generated)
            .expect("generated branch")
            .delete()
            .expect("delete");
    }
    for b in 0..BRANCHES {
        // Topologies apart from those `changed` and the pushes below touch.
        let topology = (b * n / BRANCHES + 1) % n;
        commit(
            &git,
            &format!("refs/heads/b{b:02}"),
            main,
            &[(topology, 5, 1000)],
        );
    }
    let packed = std::process::Command::new("git")
        .args(["gc", "--quiet"])
        .current_dir(&repo_dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(packed, "git gc failed");
    let location = repo_dir.to_string_lossy().into_owned();

    let read_both = measure(runs, || {
        let started = Instant::now();
        let repo = plumber::repo::Repository::open(&location).expect("open");
        let a = repo.snapshot(main).expect("snapshot");
        let b = repo.snapshot(changed).expect("snapshot");
        std::hint::black_box((a.files.len(), b.files.len()));
        started.elapsed()
    });
    let full = measure(runs, || {
        let started = Instant::now();
        let repo = plumber::repo::Repository::open(&location).expect("open");
        let old = plumber::validate(&repo.snapshot(main).expect("snapshot").files);
        let new = plumber::validate(&repo.snapshot(changed).expect("snapshot").files);
        let (Some(old), Some(new)) = (old.topologies, new.topologies) else {
            panic!("generated commits are valid");
        };
        std::hint::black_box(plumber::plan::plan(Some(("from", &old)), ("to", &new)));
        started.elapsed()
    });
    let cached = measure(runs, || {
        let started = Instant::now();
        let repo = plumber::repo::Repository::open(&location).expect("open");
        let trees = plumber::daemon::revisions::TreeCache::default();
        let validate = |commit: Oid| {
            let tree = repo.tree_of(commit).expect("tree");
            trees
                .validate(&repo, tree, commit)
                .expect("validate")
                .to_validation()
        };
        let (Some(old), Some(new)) = (validate(main).topologies, validate(changed).topologies)
        else {
            panic!("generated commits are valid");
        };
        std::hint::black_box(plumber::plan::plan(Some(("from", &old)), ("to", &new)));
        started.elapsed()
    });

    // The daemon's pieces: what runs is main, as a settled cutover leaves the store.
    let mut config = DaemonConfig::new(&location, dir.path().join("state"));
    config.watch_refs = vec!["refs/heads/*".into()];
    let runtime = Arc::new(
        LocalRuntime::open(
            &config.state_dir,
            LocalConfig {
                checkouts: plumber::store::checkouts_dir(&config.state_dir),
                ..LocalConfig::default()
            },
        )
        .expect("runtime"),
    );
    let context = Context::with_admin(
        config,
        runtime,
        Box::new(|cluster| {
            Err(plumber::kafka::Error::NoAnswer {
                bootstrap: cluster.bootstrap.clone(),
            })
        }),
    )
    .expect("context");
    let revision = context.revisions.load(&main.to_string()).expect("main");
    for topology in &revision.topologies {
        let record = TopologyRecord {
            commit: Some(main.to_string()),
            bootstrap: Some("localhost:9092".into()),
            deployment: Deployment::of(topology),
            ..TopologyRecord::default()
        };
        context.records.save(&topology.name, &record).expect("save");
    }
    let mut planner = Planner::default();
    context.plans.followed(Some(&main.to_string()));
    let started = Instant::now();
    planner.pass(&context).expect("pass");
    let first = started.elapsed();
    assert_eq!(context.plans.list().len(), BRANCHES);
    assert!(context.plans.list().iter().all(|p| p.valid));

    // A push to main: the follower loads it, then the pass plans all 30 again.
    let mut head = main;
    let mut pushes = 0;
    // Timed apart: the load writes a checkout of every file, whose time is the disk's (it
    // varied 10× between runs on this shared machine), while the pass is the plans' work.
    let mut pass_times = Vec::new();
    let load = measure(runs, || {
        pushes += 1;
        head = commit(&git, "refs/heads/main", head, &[(0, 7, 1000 + pushes)]);
        let before = context.plans.computed();
        let started = Instant::now();
        context.revisions.load(&head.to_string()).expect("load");
        let loaded = started.elapsed();
        context.plans.followed(Some(&head.to_string()));
        let started = Instant::now();
        planner.pass(&context).expect("pass");
        pass_times.push(seconds(started.elapsed()));
        assert_eq!(context.plans.computed() - before, BRANCHES as u64);
        loaded
    });
    pass_times.sort_by(f64::total_cmp);
    let push_main = (
        pass_times[pass_times.len() / 2],
        pass_times[0],
        pass_times[pass_times.len() - 1],
    );

    // A push to one branch: its plan alone.
    let mut branch_head = git.refname_to_id("refs/heads/b03").expect("b03");
    let push_branch = measure(runs, || {
        pushes += 1;
        branch_head = commit(
            &git,
            "refs/heads/b03",
            branch_head,
            &[(3 * n / BRANCHES + 1, 9, 2000 + pushes)],
        );
        let before = context.plans.computed();
        let started = Instant::now();
        planner.pass(&context).expect("pass");
        let took = started.elapsed();
        assert_eq!(context.plans.computed() - before, 1);
        took
    });
    let parsed = context.revisions.trees().parsed();

    // A markdown section per size: bench/refs.sh appends them to bench/results/refs.md.
    println!("## {n} topologies × 20 steps, {BRANCHES} branches, {runs} runs\n");
    println!("| measurement | median s | range s | × full plan today |");
    println!("|---|---:|---:|---:|");
    let ratio = |median: f64| median / full.0;
    let first = seconds(first);
    let rows = [
        ("read both commits (floor)", read_both),
        (
            "**full plan today** (validate both + plan; the baseline)",
            full,
        ),
        ("cached plan (one plan through the tree cache)", cached),
        ("first pass: 30 plans cold (1 run)", (first, first, first)),
        (
            "push to main: the follower's load (validation + checkout)",
            load,
        ),
        (
            "push to main: then the pass making 30 plans fresh",
            push_main,
        ),
        ("push to one branch → its plan fresh", push_branch),
    ];
    for (name, (median, min, max)) in rows {
        println!(
            "| {name} | {median:.3} | {min:.3}–{max:.3} | {:.2}× |",
            ratio(median)
        );
    }
    println!("\nTopologies validated in all (tree cache misses): {parsed}.\n");
    checkouts(&git, &context, head, n, runs);
}

/// The follower's checkout when every topology runs a command: `p00` of each becomes an exec
/// step beside its script, so a checkout holds every topology's `steps/` (20 files each:
/// 20,000 at 1,000 topologies). A push changes one script; the follower's load of it
/// (validation and checkout) against a whole checkout of the same head written afresh, as
/// every load wrote one before checkouts shared their directories, in the same run.
fn checkouts(git: &Repository, context: &Context, head: Oid, n: usize, runs: usize) {
    let exec = "kind: processor\ninput: in\nexec:\n  command: [python3, p00.py]\nscale: { min: 1, max: 4 }\n";
    let script = |version: usize| format!("print('v{version}')\n");
    let files: Vec<(String, String)> = (0..n)
        .flat_map(|t| {
            let dir = format!("topologies/t{t:05}/steps");
            [
                (format!("{dir}/p00.yaml"), exec.to_owned()),
                (format!("{dir}/p00.py"), script(0)),
            ]
        })
        .collect();
    let mut head = commit_files(git, "refs/heads/main", head, &files);
    let revision = context
        .revisions
        .load(&head.to_string())
        .expect("exec head");
    let dirs = plumber::graph::checkout_dirs(&revision.topologies);
    let written = count_files(&revision.checkout);
    let mut previous = head;
    let mut version = 0;
    let shared = measure(runs, || {
        version += 1;
        head = commit_files(
            git,
            "refs/heads/main",
            head,
            &[("topologies/t00000/steps/p00.py".into(), script(version))],
        );
        let started = Instant::now();
        context.revisions.load(&head.to_string()).expect("load");
        let took = started.elapsed();
        // As the follower does after a load: the checkouts of the last two heads stay.
        context
            .revisions
            .collect_checkouts(&[previous.to_string(), head.to_string()].into());
        previous = head;
        took
    });
    let repo = context.revisions.open().expect("open");
    let whole = measure(runs, || {
        let dest = tempfile::tempdir_in(&context.config.state_dir).expect("temp dir");
        let started = Instant::now();
        repo.checkout(head, &dirs, dest.path()).expect("checkout");
        started.elapsed()
    });
    println!("### A checkout of {written} files: a push changes one\n");
    println!("| measurement | median s | range s | × whole checkout |");
    println!("|---|---:|---:|---:|");
    for (name, (median, min, max)) in [
        (
            "**a whole checkout of the head** (every load before; the baseline)",
            whole,
        ),
        (
            "the follower's load of the head (validation + checkout)",
            shared,
        ),
    ] {
        println!(
            "| {name} | {median:.3} | {min:.3}–{max:.3} | {:.3}× |",
            median / whole.0
        );
    }
    println!();
}

/// Regular files under `dir`, through its links.
fn count_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| {
            let path = entry.path();
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => count_files(&path),
                Ok(meta) if meta.is_file() => 1,
                _ => 0,
            }
        })
        .sum()
}
