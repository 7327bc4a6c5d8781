#!/usr/bin/env bash
# The Kubernetes runtime at scale (issue 16): N topologies × 20 steps on the in-memory API
# server: first sync, a commit changing 10 steps, the observer's idle looks, a restart, memory;
# N = 100 and 1,000 in the same run. Writes bench/results/kube.md (a "## Findings" section
# already there is kept). Knobs: BENCH_SIZES (100,1000), BENCH_REPS (3), BENCH_LOOKS (20),
# BENCH_LOOK_SECONDS (60), BENCH_CONTROLLER=1 (the fake's deployment controller: small N only).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench kube_scale
