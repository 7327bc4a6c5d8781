//! Validating and planning a large repository between two commits that differ in 10 steps
//! (the target: 1,000 topologies × 20 steps, median ≤ 2 s). The baseline in the same
//! run is reading both commits' files out of git, the floor any implementation pays; the
//! ratio is reported by `bench/plan.sh`.

#![allow(clippy::expect_used)] // a broken benchmark setup should stop loudly

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

#[path = "support/repo_gen.rs"]
mod repo_gen;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    for topologies in [100usize, 1000] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (from, to) = repo_gen::generate(dir.path(), topologies, 10).expect("generate");
        // Repositories people plan against are packed (clones, mirrors); so is this one.
        let packed = std::process::Command::new("git")
            .args(["gc", "--quiet"])
            .current_dir(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(packed, "git gc failed");
        let location = dir.path().to_string_lossy().into_owned();

        group.bench_function(format!("read-only/{topologies}"), |b| {
            b.iter(|| {
                let repo = plumber::repo::Repository::open(&location).expect("open");
                let a = repo.snapshot(from).expect("snapshot");
                let b = repo.snapshot(to).expect("snapshot");
                black_box((a.files.len(), b.files.len()))
            })
        });
        group.bench_function(format!("validate-and-plan/{topologies}"), |b| {
            b.iter(|| {
                let repo = plumber::repo::Repository::open(&location).expect("open");
                let old = plumber::validate(&repo.snapshot(from).expect("snapshot").files);
                let new = plumber::validate(&repo.snapshot(to).expect("snapshot").files);
                let (Some(old), Some(new)) = (old.topologies, new.topologies) else {
                    panic!("generated commits are valid");
                };
                let plan = plumber::plan::plan(Some(("from", &old)), ("to", &new));
                black_box(plan.topologies.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
