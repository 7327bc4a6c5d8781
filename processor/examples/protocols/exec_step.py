import json, sys
for line in sys.stdin:                          # one input record per line
    record = json.loads(line)                   # {"topic","partition","offset","timestamp","key","headers","value"}
    click = record["value"]
    if "page" not in click:
        print(json.dumps({"error": "no page"}))  # dead-letter this record
    elif click.get("platform") == "web":
        click["section"] = click["page"].split("/")[1]
        print(json.dumps({"value": click}))     # zero or more outputs…
    print(flush=True)                           # …then an empty line ends them
