import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer
class Score(BaseHTTPRequestHandler):
    def do_POST(self):
        record = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        speed = record["value"].get("speed")
        status, outputs = (422, []) if speed is None else (200, [{"value": {**record["value"], "risk": speed / 200}}])
        self.send_response(status); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(json.dumps(outputs if status == 200 else {"error": "no speed"}).encode())
HTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Score).serve_forever()
