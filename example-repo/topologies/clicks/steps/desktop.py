"""Splits a desktop click's page into section and path.

Runs as an `exec` step: one JSON record per input line on stdin; for each, zero or more
output lines on stdout, then an empty line that ends that record's outputs. See the
plumber-processor README for the full protocol.
"""
import json
import os
import sys

DEPTH = int(os.environ.get("SECTION_DEPTH", "1"))

for line in sys.stdin:
    record = json.loads(line)
    click = record["value"]
    if click.get("platform") == "web":
        parts = [p for p in click.get("page", "/").split("/") if p]
        click["section"] = "/".join(parts[:DEPTH]) or "home"
        print(json.dumps({"value": click}))
    print(flush=True)
