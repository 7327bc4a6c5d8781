#!/usr/bin/env bash
# Stateful SQL's engine in process (issue 26): per-record cost of windowed and running
# aggregates against a per-record SELECT, and the heap, changelog and restore rate of a
# state of 1 million keys. Writes bench/results/stateful-sql.md. Knobs: BENCH_RECORDS,
# BENCH_KEYS, BENCH_REPS (see sql/benches/stateful.rs), BENCH_RESTORE_KEYS
# (processor/examples/bench_restore.rs); BENCH_RATE, BENCH_ROUNDS for the cutover (examples/bench_reconciler.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_OUT="$PWD/bench/results/stateful-sql.md" cargo bench -p plumber-sql --bench stateful
# The restore from a broker against a bare consumer (appended to the same file).
scripts/install-deps
cargo build --release -p plumber-processor --example bench_restore
BENCH_OUT="$PWD/bench/results/stateful-sql.md" target/release/examples/bench_restore
# The cutover of a stateful step through `plumber up`: the longest output gap during a
# cutover against the steady gap between cutovers (bench/results/stateful-cutover.md).
cargo build --release -p plumber --bin plumber --example bench_reconciler -p plumber-processor --bin plumber-processor
BENCH_STATEFUL=1 BENCH_RATE="${BENCH_RATE:-500}" BENCH_ROUNDS="${BENCH_ROUNDS:-6}" \
    BENCH_OUT="$PWD/bench/results/stateful-cutover.md" target/release/examples/bench_reconciler
