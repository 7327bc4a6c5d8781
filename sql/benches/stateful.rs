//! Stateful SQL's engine (`docs/stateful-sql.md`, issue 26), in process: the per-record cost
//! of a windowed `COUNT … GROUP BY` and of a running aggregate against a per-record `SELECT`
//! over the same records (the baseline, same run); and, at 1 million keys, the heap the state
//! takes, the changelog it writes, and how fast a state is restored from that changelog
//! against decoding the same entries as JSON without building a state (the baseline).
//!
//! Not here: a changelog read from Kafka (the processor does not run stateful steps yet), so
//! a restore is measured against decoding the same entries as JSON, not against a consumer. Knobs: `BENCH_RECORDS` (default 200,000),
//! `BENCH_KEYS` (1,000,000), `BENCH_REPS` (5), `BENCH_OUT` (bench/results/stateful-sql.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::time::Instant;

use peak_alloc::PeakAlloc;
use plumber_sql::{Aggregation, PartitionState, Query, Record};

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median_and_range(mut samples: Vec<f64>) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    (median, samples[0], samples[samples.len() - 1])
}

/// `n` records of `keys` keys, 10 ms apart, values `{"v": …, "cat": …}`.
fn records(n: usize, keys: usize) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    (0..n)
        .map(|i| {
            let key = format!("k{}", (i * 7919) % keys).into_bytes();
            let value = format!(r#"{{"v":{},"cat":"c{}"}}"#, i % 100, i % 7).into_bytes();
            (key, value, 1_700_000_000_000 + i as i64 * 10)
        })
        .collect()
}

fn record<'a>(key: &'a [u8], value: &'a [u8]) -> Record<'a> {
    Record {
        value: Some(value),
        key: Some(key),
        headers: &[],
    }
}

fn main() {
    let n = env("BENCH_RECORDS", 200_000);
    let million = env("BENCH_KEYS", 1_000_000);
    let reps = env("BENCH_REPS", 5).max(1);
    let out = std::env::var("BENCH_OUT").unwrap_or_else(|_| "bench/results/stateful-sql.md".into());
    let input = records(n, 1_000);
    let inputs = Some(&["s"][..]);

    let select = Query::compile("SELECT _key AS k, v FROM s WHERE v >= 0", inputs).unwrap();
    let windowed = Aggregation::compile(
        "SELECT _key AS k, COUNT(*) AS n, SUM(v) AS total, window_start FROM s \
         GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)",
        inputs,
    )
    .unwrap();
    let running = Aggregation::compile(
        "SELECT _key AS k, COUNT(*) AS n, MAX(v) AS top FROM s GROUP BY _key",
        inputs,
    )
    .unwrap();
    let per_record = |name: &str, run: &mut dyn FnMut() -> usize| {
        let samples: Vec<f64> = (0..reps)
            .map(|_| {
                let started = Instant::now();
                let outputs = run();
                std::hint::black_box(outputs);
                started.elapsed().as_nanos() as f64 / n as f64
            })
            .collect();
        eprintln!(
            "  {name}: {:.0} ns/record",
            median_and_range(samples.clone()).0
        );
        median_and_range(samples)
    };
    eprintln!("per-record cost, {n} records of 1,000 keys, {reps} runs");
    let baseline = per_record("SELECT … WHERE", &mut || {
        input
            .iter()
            .map(|(k, v, _)| select.eval(&record(k, v), None).unwrap().len())
            .sum()
    });
    let tumbling = per_record("COUNT, SUM … TUMBLE 1 min", &mut || {
        let mut state = PartitionState::default();
        input
            .iter()
            .map(|(k, v, t)| windowed.feed(&mut state, &record(k, v), *t).unwrap().len())
            .sum()
    });
    let updating = per_record("COUNT, MAX … GROUP BY _key", &mut || {
        let mut state = PartitionState::default();
        input
            .iter()
            .map(|(k, v, t)| running.feed(&mut state, &record(k, v), *t).unwrap().len())
            .sum()
    });

    eprintln!("state of {million} keys");
    let keyed = records(million, million);
    let heap_before = HEAP.current_usage();
    let mut state = PartitionState::default();
    let started = Instant::now();
    for (i, (k, v, t)) in keyed.iter().enumerate() {
        running.feed(&mut state, &record(k, v), *t).unwrap();
        state.reflects(i as i64);
    }
    let fed = started.elapsed().as_secs_f64();
    assert_eq!(state.open_groups(), million);
    let state_heap = HEAP.current_usage().saturating_sub(heap_before);
    let changes = state.take_changes();
    let changelog_bytes: usize = changes
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum();
    drop(state);
    let mut restores = Vec::new();
    let mut reads = Vec::new();
    let mut restored_heap = 0;
    for _ in 0..reps {
        // The baseline: each entry's value decoded as JSON, no state built.
        let copy = changes.clone();
        let started = Instant::now();
        for (_, value) in copy.iter() {
            if let Some(value) = value {
                let decoded: serde_json::Value = serde_json::from_slice(value).unwrap();
                std::hint::black_box(decoded);
            }
        }
        reads.push(changes.len() as f64 / started.elapsed().as_secs_f64());
        drop(copy);
        // Measured before the copy the restore consumes: what is left is the state.
        let before = HEAP.current_usage();
        let copy = changes.clone();
        let started = Instant::now();
        let restored = PartitionState::restore(copy).unwrap();
        restores.push(changes.len() as f64 / started.elapsed().as_secs_f64());
        assert_eq!(restored.open_groups(), million);
        assert_eq!(restored.offset(), Some(million as i64 - 1));
        restored_heap = HEAP.current_usage().saturating_sub(before);
        drop(restored);
    }
    let (restore, restore_lo, restore_hi) = median_and_range(restores);
    let (read, read_lo, read_hi) = median_and_range(reads);
    let mb = |b: usize| b as f64 / (1 << 20) as f64;

    let mut md = String::new();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    writeln!(md, "# Stateful SQL: the engine in process\n").unwrap();
    writeln!(
        md,
        "Commit {commit}, {} build, {} cores. Rerun: `bash bench/stateful-sql.sh`. Medians of {reps} runs, [ranges]. The processor does not run stateful steps yet: these are `plumber-sql`'s own costs (`sql/benches/stateful.rs`), not a step's.\n",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )
    .unwrap();
    writeln!(
        md,
        "## Per record ({n} records of 1,000 keys, 10 ms apart: 6 records of a key in each minute)\n"
    )
    .unwrap();
    writeln!(md, "| query | ns per record | against `SELECT … WHERE` |").unwrap();
    writeln!(md, "|---|---:|---:|").unwrap();
    for (name, (m, lo, hi)) in [
        (
            "`SELECT _key, v … WHERE v >= 0` (stateless, the baseline)",
            baseline,
        ),
        (
            "`COUNT(*), SUM(v) … GROUP BY _key, TUMBLE(1 min)` (emit on close)",
            tumbling,
        ),
        (
            "`COUNT(*), MAX(v) … GROUP BY _key` (running, emit per record)",
            updating,
        ),
    ] {
        writeln!(
            md,
            "| {name} | {m:.0} [{lo:.0}–{hi:.0}] | {:.2}× |",
            m / baseline.0
        )
        .unwrap();
    }
    writeln!(
        md,
        "\n## State of {million} keys (a running `COUNT, MAX … GROUP BY _key`)\n"
    )
    .unwrap();
    writeln!(md, "| | |\n|---|---:|").unwrap();
    writeln!(md, "| fed {million} records, one per key | {fed:.2} s |").unwrap();
    writeln!(
        md,
        "| heap of the state, its changes not yet taken | {:.0} MB ({:.0} bytes per key) |",
        mb(state_heap),
        state_heap as f64 / million as f64
    )
    .unwrap();
    writeln!(
        md,
        "| its changelog (keys and values) | {:.0} MB in {} entries |",
        mb(changelog_bytes),
        changes.len()
    )
    .unwrap();
    writeln!(
        md,
        "| restore: entries folded per second | {restore:.0} [{restore_lo:.0}–{restore_hi:.0}] |"
    )
    .unwrap();
    writeln!(
        md,
        "| baseline: the same entries decoded as JSON, per second | {read:.0} [{read_lo:.0}–{read_hi:.0}] |"
    )
    .unwrap();
    writeln!(
        md,
        "| restore against the decode | {:.2}× the time |",
        read / restore
    )
    .unwrap();
    writeln!(
        md,
        "| heap of the restored state (nothing pending) | {:.0} MB ({:.0} bytes per key) |",
        mb(restored_heap),
        restored_heap as f64 / million as f64
    )
    .unwrap();
    if let Some(parent) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&out, md).unwrap();
    eprintln!("wrote {out}");
}
