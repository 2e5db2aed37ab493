# HTTP mode: a long-running server; the worker proxies each request to it.
from http.server import BaseHTTPRequestHandler, HTTPServer
import sys

calls = 0


class Handler(BaseHTTPRequestHandler):
    def _answer(self):
        global calls
        calls += 1
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else "stranger"
        out = f"Hi {body}, I have answered {calls} call(s) at {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, fmt, *args):
        sys.stderr.write((fmt % args) + "\n")


HTTPServer(("127.0.0.1", 5000), Handler).serve_forever()
