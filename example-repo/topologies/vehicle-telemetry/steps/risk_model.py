"""A stand-in for the risk model server: scores a moving vehicle by its speed.

Runs as the `http` step's server: `plumber up` starts it with PORT set (in Kubernetes the
image runs as a sidecar instead). Each POST carries one record's envelope; the answer is a
JSON array of outputs. See the plumber-processor README for the full protocol.
"""
import json
import os
from http.server import BaseHTTPRequestHandler, HTTPServer

MODEL = os.environ.get("MODEL", "v0")


class Score(BaseHTTPRequestHandler):
    def do_POST(self):
        record = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        vehicle = record["value"]
        speed = vehicle.get("speed", 0)
        scored = {**vehicle, "risk": round(min(speed / 40, 1.0), 3), "model": MODEL}
        body = json.dumps([{"value": scored}]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass  # one line per record would drown the processor's log


HTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Score).serve_forever()
