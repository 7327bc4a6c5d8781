#!/usr/bin/env bash
# plumber-processor against the hand-written baseline loop: throughput, CPU per record, peak
# RSS, latency at 1,000 records/s, and exactly-once against at-least-once; then the jq
# transform alone against copying the record (criterion).
# Results: bench/results/processor.md. Knobs: BENCH_RECORDS, BENCH_ROUNDS, BENCH_LATENCY_SECS,
# BENCH_LATENCY_ROUNDS, BENCH_BROKERS, BENCH_PROCESSOR_ARGS (see
# processor/examples/bench_processor.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps
cargo build --release -p plumber-processor --bin plumber-processor --example baseline_loop --example bench_processor
out=${BENCH_OUT:-bench/results/processor.md}
BENCH_OUT=$out target/release/examples/bench_processor

cargo bench -p plumber-processor --bench transform
python3 - "$out" <<'PY'
import json, pathlib, sys
root = pathlib.Path("target/criterion/transform")
def median_ns(name):
    return json.loads((root / name / "new" / "estimates.json").read_text())["median"]["point_estimate"]
copy = median_ns("copy")
lines = ["", "## The jq transform alone (criterion, medians)", "",
         "Parse, run and write one benchmark record, against copying it. Rerun: "
         "`cargo bench -p plumber-processor --bench transform`.", "",
         "| program | ns/record | × copy |", "|---|---:|---:|",
         f"| (copy the bytes) | {copy:.0f} | 1 |"]
for bench in sorted(p.name for p in root.iterdir() if p.name.startswith("jq ")):
    program = json.loads((root / bench / "new" / "benchmark.json").read_text())["function_id"]
    ns = median_ns(bench)
    shown = program[3:].replace("|", "\\|")
    lines.append(f"| `{shown}` | {ns:.0f} | {ns / copy:.0f} |")
with open(sys.argv[1], "a") as report:
    report.write("\n".join(lines) + "\n")
PY
