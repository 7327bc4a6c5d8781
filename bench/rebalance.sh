#!/usr/bin/env bash
# The longest output gap of a step while its instances come and go (1 → 2 → 1 → 2 → 1 by
# default), the eager rebalance protocol against the cooperative one, at 2,000 records/s.
# Results: bench/results/rebalance.md. Knobs: BENCH_ROUNDS, BENCH_RATE, BENCH_PLAN,
# BENCH_SETTLE_SECS, PLUMBER_TEST_BOOTSTRAP (see processor/examples/bench_rebalance.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps
cargo build --release -p plumber-processor --bin plumber-processor --example bench_rebalance
target/release/examples/bench_rebalance
