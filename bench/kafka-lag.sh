#!/usr/bin/env bash
# What the observer's Kafka reads cost per group (committed offsets and watermarks), against
# one metadata request in the same run, on tansu (or PLUMBER_TEST_BOOTSTRAP). Writes
# bench/results/kafka-lag.md. Knobs: BENCH_GROUPS (200), BENCH_PARTITIONS (6), BENCH_REPS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench kafka_lag
