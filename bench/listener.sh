#!/usr/bin/env bash
# What holding connections costs the daemon: `plumber up`'s peak RSS while it holds 1,000 idle
# connections, 1,000 half-sent request heads, and its maximum of gzipped event streams that
# never read, against an idle daemon in the same run (no broker needed). About 2 minutes.
# Writes bench/results/listener.md. Knobs: BENCH_CONNECTIONS (1000), BENCH_ROUNDS (5),
# BENCH_HOLD (5), BENCH_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
# The bench and the daemon each hold a file descriptor per connection.
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 8192 ]; then ulimit -n 8192; else ulimit -n "$hard"; fi
# Builds target/release/plumber too (the binary the bench starts).
cargo bench --bench listener
