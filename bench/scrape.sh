#!/usr/bin/env bash
# What one look's read of the processors' /metrics costs the observer, at N local instances
# (real processor metrics servers on loopback), and when they refuse or never answer. Prints
# the table of bench/results/scrape.md. Knobs: BENCH_INSTANCES (50,500), BENCH_REPS (10).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench scrape
