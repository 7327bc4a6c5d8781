#!/usr/bin/env bash
# The data diff's cost (issue 27): `plumber plan --from A --to B` of a pull request that
# changes a jq step and a sql step, without the data diff (the baseline) and with it
# (`--sample 1000`: each step's old and new version on the 1,000 most recent records of its
# source, run in the step-test worker), on tansu (or PLUMBER_TEST_BOOTSTRAP) with the release
# binary. Wall time and peak RSS under /usr/bin/time, RUNS runs each, medians and ranges.
# Writes bench/results/datadiff.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/datadiff.md
runs=${RUNS:-7}
records=${RECORDS:-1000}

cargo build --release --quiet --bin plumber
plumber=$PWD/target/release/plumber
work=$(mktemp -d)
trap 'kill "${tansu_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

if [[ -n "${PLUMBER_TEST_BOOTSTRAP:-}" ]]; then
  bootstrap=$PLUMBER_TEST_BOOTSTRAP
else
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  bootstrap=127.0.0.1:$port
  mkdir -p "$work/broker"
  (cd "$work/broker" && exec "${TANSU:-$(command -v tansu || echo "$HOME/.cargo/bin/tansu")}" broker \
      --listener-url "tcp://$bootstrap" --advertised-listener-url "tcp://$bootstrap" \
      --storage-engine "sqlite://./broker.db" >tansu.log 2>&1) &
  tansu_pid=$!
fi

topic=bench-telemetry-$$
repo=$work/repo
mkdir -p "$repo/topologies/t/steps"
cd "$repo"
git init -q -b main
git config user.name bench && git config user.email bench@example.com
write() {
  cat >topologies/t/steps/telemetry.yaml <<EOF
kind: source
topic: $topic
EOF
  cat >topologies/t/steps/moving.yaml <<EOF
kind: processor
input: telemetry
jq: '$1'
EOF
  cat >topologies/t/steps/fast.yaml <<EOF
kind: processor
input: telemetry
sql: $2
EOF
  cat >topologies/t/steps/out.yaml <<EOF
kind: sink
topic: bench-out-$$
input: [moving, fast]
EOF
  git add -A && git commit -qm "$3"
}
jq_old='select(.speed > 10)'
jq_new='select(.speed > 20) | . + {kmh: (.speed * 3.6)}'
sql_old='SELECT vehicle, speed FROM telemetry WHERE speed > 10'
sql_new='SELECT vehicle, speed * 3.6 AS kmh FROM telemetry WHERE speed > 20'
write "$jq_old" "$sql_old" base
from=$(git rev-parse HEAD)
write "$jq_new" "$sql_old" "the jq step"
to_jq=$(git rev-parse HEAD)
git checkout -q "$from"
write "$jq_old" "$sql_new" "the sql step"
to_sql=$(git rev-parse HEAD)
cd - >/dev/null

# The source, with the records.
"$plumber" dev topics "$repo" --rev "$from" --bootstrap "$bootstrap" --partitions 3 >/dev/null 2>&1 ||
  "$plumber" dev topics "$repo" --rev "$from" --bootstrap "$bootstrap" --partitions 3
"$plumber" dev load --topic "$topic" --bootstrap "$bootstrap" --rate 2000 --count "$records" 2>/dev/null

measure() { # label, to, args…: one line "seconds rss_kb" per run
  local label=$1 to=$2; shift 2
  for _ in $(seq "$runs"); do
    /usr/bin/time -f '%e %M' -o "$work/time" "$plumber" plan "$repo" --from "$from" --to "$to" "$@" >"$work/$label.out"
    cat "$work/time"
  done >"$work/$label.times"
}
sample=(--sample "$records" --bootstrap "$bootstrap" --sample-time 30 --test-time 120)
measure plain "$to_jq"
measure jq "$to_jq" "${sample[@]}"
measure sql "$to_sql" "${sample[@]}"
for kind in jq sql; do
  "$plumber" plan "$repo" --from "$from" --to "$([[ $kind == jq ]] && echo "$to_jq" || echo "$to_sql")" "${sample[@]}" --format json >"$work/$kind.json"
  grep -q "$records records sampled" "$work/$kind.out" || { cat "$work/$kind.out"; echo "no data diff of $records records" >&2; exit 1; }
done

stats() { # file, column → "median [min–max]"
  cut -d' ' -f"$2" "$1" | sort -n | awk -v scale="$3" '{a[NR]=$1/scale} END {m=(NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2); printf "%.2f [%.2f–%.2f]", m, a[1], a[NR]}'
}
median() { cut -d' ' -f"$2" "$1" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

{
  echo "# Data diff benchmark (issue 27)"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(git rev-parse --short HEAD), ${runs} runs each, release build, $( [[ -n "${PLUMBER_TEST_BOOTSTRAP:-}" ]] && echo "cluster $bootstrap" || echo tansu). Rerun: \`bash bench/datadiff.sh\` (\`RUNS\`, \`RECORDS\`)."
  echo
  echo "Topology \`t\`: a source (3 partitions, $records records from \`plumber dev load\`) read by a jq"
  echo "step and a sql step. A pull request changes one of them: \`plumber plan --from A --to B\`"
  echo "(the jq change) is the baseline; with \`--sample $records\` the changed step's old and new"
  echo "version run on the source's $records most recent records: read without a group, then"
  echo "$((2 * records)) cases in one step-test worker process. Medians [min–max]; RSS is the plan"
  echo "command's peak (\`/usr/bin/time %M\`; the worker's is counted only where it was larger)."
  echo
  echo "| measure | plan | plan with the data diff of the jq step | ratio | plan with the data diff of the sql step | ratio |"
  echo "|---|---:|---:|---:|---:|---:|"
  for column in 1 2; do
    scale=$([[ $column == 1 ]] && echo 1 || echo 1024)
    name=$([[ $column == 1 ]] && echo "wall time, s" || echo "peak RSS, MB")
    base=$(median "$work/plain.times" "$column")
    printf '| %s | %s | %s | %.1f× | %s | %.1f× |\n' "$name" "$(stats "$work/plain.times" "$column" "$scale")" \
      "$(stats "$work/jq.times" "$column" "$scale")" "$(python3 -c "print($(median "$work/jq.times" "$column")/max($base,0.001))")" \
      "$(stats "$work/sql.times" "$column" "$scale")" "$(python3 -c "print($(median "$work/sql.times" "$column")/max($base,0.001))")"
  done
  echo
  for kind in jq sql; do
    python3 - "$work/$kind.json" "$kind" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["dataDiff"][0]
print(f"- {sys.argv[2]} step, one more run: reading the {d['sampled']} records {d['readMs']} ms, both versions on them in the worker {d['runMs']} ms.")
PY
  done
  echo
  echo "What the last runs printed:"
  echo
  echo '```'
  sed -n '/^data diff/,$p' "$work/jq.out" "$work/sql.out"
  echo '```'
} >"$out"
cat "$out"
