#!/usr/bin/env bash
# Plans of watched refs (issue 17): 30 branches over N topologies × 20 steps, the daemon's
# plans worker driven pass by pass, against a full plan today (read + validate both commits,
# plan) measured in the same run. Knobs: SIZES (default "100 1000"), RUNS (default 5).
# Writes bench/results/refs.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/refs.md
sizes=${SIZES:-100 1000}
runs=${RUNS:-5}

cargo bench --bench refs --no-run --quiet
sections=$(SIZES="$sizes" RUNS="$runs" cargo bench --quiet --bench refs)

{
  echo "# plans of watched refs benchmark"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(git rev-parse --short HEAD), release build."
  echo "Rerun: \`SIZES=\"$sizes\" RUNS=$runs bash bench/refs.sh\`."
  echo
  echo "A repository of N topologies × 20 steps (benches/support/repo_gen.rs, packed), what runs"
  echo "= the tracked branch \`main\` (saved in the state directory as a settled cutover leaves"
  echo "it), 30 branches each changing one step of its own topology. Each pass of the plans worker"
  echo "renders every plan's markdown and writes its git note, which the baseline does not."
  echo
  echo "$sections"
} > "$out"
cat "$out"
