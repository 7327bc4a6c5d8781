import json, sys
for line in sys.stdin:                            # one input record per line
    record = json.loads(line)                     # {"id","topic","partition","offset","timestamp","key","headers","value"}
    click = record["value"]
    if "page" not in click:
        answer = {"error": "no page"}             # dead-letter this record
    elif click.get("platform") == "web":
        click["section"] = click["page"].split("/")[1]
        answer = {"outputs": [{"value": click}]}  # zero or more outputs
    else:
        answer = {"outputs": []}                  # filtered out
    print(json.dumps({"id": record["id"], **answer}), flush=True)  # one answer line per record
