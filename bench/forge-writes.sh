#!/usr/bin/env bash
# Forge requests per push to main (issue 23): `plumber up --forge github` against the fake
# GitHub of tests/support/fake_forge.rs, with N closed pull requests and 5 open ones, through
# a first publication, a push to main that changes no plan, one that changes 2 open pull
# requests' plans (and every closed one's) and a restart; against the plumber before issue 23
# (BASELINE, a git revision, built here; `none` to skip) in the same run. Debug builds: what
# is counted is requests, not time. About 10 minutes.
# Knobs: CLOSED (default "0 10 100"), RUNS (default 3), BASELINE (default 3904bb6).
# Writes bench/results/forge-writes.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/forge-writes.md
closed=${CLOSED:-0 10 100}
runs=${RUNS:-3}
baseline=${BASELINE:-3904bb6}
target=${CARGO_TARGET_DIR:-target}
work=$target/forge-writes
mkdir -p "$work"
target=$(realpath "$target")
work=$(realpath "$work")

# Both binaries are copied aside: each build writes target/debug/plumber.
cargo build --quiet --bin plumber
cp "$target/debug/plumber" "$work/plumber"
baseline_bin=
if [ "$baseline" != none ]; then
  src=$work/baseline-src
  git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
  git worktree add --quiet --detach "$src" "$baseline"
  (cd "$src" && CARGO_TARGET_DIR="$target" cargo build --quiet --bin plumber)
  cp "$target/debug/plumber" "$work/plumber-baseline"
  git worktree remove --force "$src"
  baseline_bin=$work/plumber-baseline
fi

cargo bench --quiet --profile dev --bench forge_writes --no-run
sections=$(CLOSED="$closed" RUNS="$runs" PLUMBER_BIN="$work/plumber" \
  PLUMBER_BASELINE_BIN="$baseline_bin" cargo bench --quiet --profile dev --bench forge_writes)

{
  echo "# forge writes per push benchmark"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(git rev-parse --short HEAD), debug builds;"
  echo "baseline: $baseline. Rerun: \`CLOSED=\"$closed\" RUNS=$runs BASELINE=$baseline bash bench/forge-writes.sh\`."
  echo
  echo "\`plumber up --forge github --watch-refs 'refs/pull/*/head'\` against the fake GitHub of"
  echo "tests/support/fake_forge.rs, which records every request, with no broker (nothing runs, so"
  echo "every plan starts from an empty cluster). N closed pull requests (every fifth merged) each"
  echo "change \`orders/clean\`; 5 open ones: 2 change \`orders/clean\`, 3 have an invalid merge of"
  echo "their own (a push to main changes nothing in their plans); a sixth open one, the sentinel,"
  echo "says when a phase was published and its own requests are not counted. Requests and writes"
  echo "(POST, PATCH, PUT) per phase, medians (ranges when runs differ) of $runs runs; seconds from"
  echo "the push (the daemon's start) until the sentinel was published (looked at)."
  echo
  echo "$sections"
} > "$out"
cat "$out"
