"""Splits a desktop click's page into section and path.

Runs as an `exec` step: one JSON record per input line on stdin; for each, one answer line
on stdout naming the record's id, with its outputs. See the plumber-processor README for the
full protocol.
"""
import json
import os
import sys

DEPTH = int(os.environ.get("SECTION_DEPTH", "1"))

for line in sys.stdin:
    record = json.loads(line)
    click = record["value"]
    outputs = []
    if click.get("platform") == "web":
        parts = [p for p in click.get("page", "/").split("/") if p]
        click["section"] = "/".join(parts[:DEPTH]) or "home"
        outputs.append({"value": click})
    print(json.dumps({"id": record["id"], "outputs": outputs}), flush=True)
