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

/// Topology `chain`: a source, `steps` jq steps one after the other, a sink; the first
/// step's program is `first`.
fn chain(steps: usize, first: &str) -> Vec<plumber::spec::SourceFile> {
    let file = |path: String, text: String| plumber::spec::SourceFile {
        path,
        content: plumber::spec::FileContent::Bytes(text.into_bytes()),
    };
    let mut files = vec![
        file(
            "topologies/chain/sources/in.yaml".into(),
            "kind: source\ntopic: in\n".into(),
        ),
        file(
            "topologies/chain/sinks/out.yaml".into(),
            format!("kind: sink\ntopic: out\ninput: s{steps}\n"),
        ),
    ];
    for i in 1..=steps {
        let input = if i == 1 {
            "in".to_owned()
        } else {
            format!("s{}", i - 1)
        };
        let program = if i == 1 { first } else { "." };
        files.push(file(
            format!("topologies/chain/steps/s{i}.yaml"),
            format!("kind: processor\ninput: {input}\njq: '{program}'\n"),
        ));
    }
    files
}

/// Planning a change at the head of a chain, which replaces every step below it: the
/// plan's growth with the chain's length (issue 28: linear). The 10-step chain is the
/// baseline of the ratio, and the same plan worked out look by look (`moves::next` applied
/// until nothing remains, what the plan stands for) the baseline of the simulation.
fn bench_chain(c: &mut Criterion) {
    use plumber::plan::{Action, Deployment, Effect, moves};
    let mut group = c.benchmark_group("plan-chain");
    group.sample_size(10);
    for steps in [10usize, 100, 1000] {
        let graphs = |first: &str| {
            plumber::validate(&chain(steps, first))
                .topologies
                .expect("a valid chain")
        };
        let (old, new) = (graphs("."), graphs(". + {x: 1}"));
        let deployed = Deployment::of(&old[0]);
        let name = old[0].name.clone();
        group.bench_function(format!("{steps}"), |b| {
            b.iter(|| black_box(moves::plan(&name, &deployed, Some(&new[0])).len()))
        });
        if steps > 100 {
            continue; // look by look, 1,000 steps take minutes
        }
        group.bench_function(format!("look-by-look/{steps}"), |b| {
            b.iter(|| {
                let mut simulated = deployed.clone();
                let mut actions = 0;
                while let Some(action) = moves::next(&name, &simulated, Some(&new[0]), &|_| false) {
                    let effect = match action {
                        Action::StopProcessor { .. } => Effect::Stopped(Vec::new()),
                        _ => Effect::Done,
                    };
                    simulated.apply(&action, effect);
                    actions += 1;
                }
                black_box(actions)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench, bench_chain);
criterion_main!(benches);
