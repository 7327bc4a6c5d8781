#!/usr/bin/env bash
# The reconciler on a 10-step topology at 2,000 records/s: commit → cutover start, the longest
# output gap of a replaced source-connected step, the daemon's idle RSS and CPU.
# Results: bench/results/reconciler.md. Knobs: BENCH_ROUNDS, BENCH_RATE, PLUMBER_TEST_BOOTSTRAP.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps
cargo build --release -p plumber --bin plumber --example bench_reconciler -p plumber-processor --bin plumber-processor
target/release/examples/bench_reconciler
