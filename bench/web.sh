#!/usr/bin/env bash
# What the web page costs the daemon: `plumber up`'s idle CPU and RSS with 10 topologies running
# and records trickling in, with no page open (the baseline, same run), the page open on the
# overview, on a topology's DAG, one plain /api/events client and one asking for gzip (events
# per minute, bytes on the wire); the page's cold and warm load in headless Chromium (time,
# requests, bytes). About 14 minutes.
# Writes bench/results/web.md. Knobs: BENCH_TOPOLOGIES (10), BENCH_RATE (5), BENCH_WINDOW (45),
# BENCH_ROUNDS (3), BENCH_LOADS (5), BENCH_KEEP, PLUMBER_TEST_BOOTSTRAP, PLUMBER_CHROMIUM.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps --tests
cargo build --release -p plumber-processor --bin plumber-processor
# Builds target/release/plumber too, with the features the bench's dev-dependencies add (a
# separate `cargo build --release -p plumber` would build it once more without them).
cargo bench --bench web
