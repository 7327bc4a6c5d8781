#!/usr/bin/env bash
# What a commit over budget costs the daemon (issue 23): `plumber up`'s peak RSS refusing a
# 3,000-file bomb on a watched branch and on main, against an idle daemon, and a tenth of the
# bomb read with the budget out of the way, fresh daemons interleaved per round. Knob: ROUNDS
# (default 3). Writes bench/results/trust.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/trust.md
rounds=${ROUNDS:-3}

cargo bench --bench trust --no-run --quiet
table=$(ROUNDS="$rounds" cargo bench --quiet --bench trust)

{
  echo "# what a commit over budget costs the daemon"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(git rev-parse --short HEAD), release build."
  echo "Rerun: \`ROUNDS=$rounds bash bench/trust.sh\`."
  echo
  echo "\`plumber up\` on a repository of one topology (no broker: nothing runs), a fresh daemon"
  echo "per condition, the conditions interleaved in each of $rounds rounds; peak RSS is the"
  echo "process's VmHWM once the commit was refused (or its plan made). The bomb is 3,000 step"
  echo "files naming one blob of 1 MiB: a push of about 1 MB that reads as 3 GB. Before the"
  echo "budget it drove \`plumber up\` to 8.9 GB (issue 23); the last row reads a tenth of it with"
  echo "the budget out of the way."
  echo
  echo "$table"
} > "$out"
cat "$out"
