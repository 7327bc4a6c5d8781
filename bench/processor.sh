#!/usr/bin/env bash
# plumber-processor against the hand-written baseline loop: throughput, CPU per record, peak
# RSS, latency at 1,000 records/s, and exactly-once against at-least-once.
# Results: bench/results/processor.md. Knobs: BENCH_RECORDS, BENCH_ROUNDS, BENCH_LATENCY_SECS.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps
cargo build --release -p plumber-processor --bin plumber-processor --example baseline_loop --example bench_processor
target/release/examples/bench_processor
