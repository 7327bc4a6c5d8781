#!/usr/bin/env bash
# Validate + plan benchmark (issue: 1,000 topologies × 20 steps, 10 steps changed, median
# ≤ 2 s, peak RSS ≤ 200 MB). Runs criterion at 100 and 1,000 topologies against the git-read
# baseline, then the release CLI at 100 / 1,000 / 5,000 topologies under /usr/bin/time for
# wall time and peak RSS. Writes bench/results/plan.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/plan.md
runs=${RUNS:-5}

cargo bench --bench plan -- --noplot
cargo build --release --quiet --bin plumber --example generate_repo

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
crit() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['median']['point_estimate']/1e9)" "target/criterion/plan/$1/new/estimates.json"; }

{
  echo "# validate + plan benchmark"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(git rev-parse --short HEAD). Rerun: \`bash bench/plan.sh\`."
  echo
  echo "## criterion (library, packed repository), median seconds"
  echo
  echo "| topologies | read both commits (baseline) | validate both + plan | ratio |"
  echo "|---:|---:|---:|---:|"
  for n in 100 1000; do
    base=$(crit "read-only_$n"); full=$(crit "validate-and-plan_$n")
    printf '| %d | %.3f | %.3f | %.1f× |\n' "$n" "$base" "$full" "$(python3 -c "print($full/$base)")"
  done
  echo
  echo "## a chain's plan (issue 28): a change at its head replaces every step, median seconds"
  echo
  echo "| steps | plan | × the 10-step chain | look by look (baseline) | look by look ÷ plan |"
  echo "|---:|---:|---:|---:|---:|"
  base=$(crit "../plan-chain/10")
  for n in 10 100 1000; do
    t=$(crit "../plan-chain/$n")
    if [ "$n" -le 100 ]; then
      l=$(crit "../plan-chain/look-by-look_$n")
      look=$(printf '%.4f | %.0f×' "$l" "$(python3 -c "print($l/$t)")")
    else
      look="not run (minutes) | "
    fi
    printf '| %d | %.4f | %.1f× | %s |\n' "$n" "$t" "$(python3 -c "print($t/$base)")" "$look"
  done
  echo
  echo "## CLI \`plumber plan --from HEAD~1 --to HEAD --format json\`, median of $runs runs"
  echo
  echo "| topologies | steps | objects | wall s | peak RSS MB |"
  echo "|---:|---:|---|---:|---:|"
} > "$out"

for n in 100 1000 5000; do
  dir=$(mktemp -d)
  ./target/release/examples/generate_repo "$dir/repo" "$n" 10 > /dev/null
  for layout in loose packed; do
    if [ "$layout" = packed ]; then git -C "$dir/repo" gc --quiet; fi
    walls=(); rsss=()
    for _ in $(seq "$runs"); do
      line=$( { /usr/bin/time -f "%e %M" ./target/release/plumber plan "$dir/repo" --from HEAD~1 --to HEAD --format json > /dev/null; } 2>&1 | tail -1)
      walls+=("${line% *}"); rsss+=("${line#* }")
    done
    wall=$(printf '%s\n' "${walls[@]}" | median)
    rss=$(printf '%s\n' "${rsss[@]}" | median)
    printf '| %d | %d | %s | %.2f | %.0f |\n' "$n" $((n * 20)) "$layout" "$wall" "$(python3 -c "print($rss/1024)")" >> "$out"
  done
  rm -rf "$dir"
done
cat "$out"
