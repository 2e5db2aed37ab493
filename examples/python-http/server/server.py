# HTTP mode: a long-running server; the worker proxies each request to it.
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse
from urllib.request import Request, urlopen
import os
import sys
import time

calls = 0
STATE = os.environ.get("SILT_STATE_URL", "")


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

    def _events(self, query):
        # Server-sent events: each reaches the caller as it is written (no
        # Content-Length: the body ends when this connection closes). ?n=N
        # events, one a second; with ?q=NAME each waits instead for an item
        # in the state queue NAME (POST /go?q=NAME puts one there).
        n = int(query.get("n", ["3"])[0])
        gate = query.get("q", [None])[0]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for i in range(1, n + 1):
            self.wfile.write(f"data: event {i}\n\n".encode())
            self.wfile.flush()
            if i == n:
                break
            if gate:
                urlopen(Request(f"{STATE}/state/queues/{gate}/pop?timeout_ms=30000", data=b"",
                                method="POST"), timeout=35).read()
            else:
                time.sleep(1)

    def _go(self, query):
        urlopen(Request(f"{STATE}/state/queues/{query['q'][0]}", data=b"go",
                        method="POST"), timeout=5).read()
        self.send_response(204)
        self.end_headers()

    def _route(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if url.path == "/events":
            return self._events(query)
        if url.path == "/go" and "q" in query:
            return self._go(query)
        return self._answer()

    do_GET = _route
    do_POST = _route

    def log_message(self, fmt, *args):
        sys.stderr.write((fmt % args) + "\n")


HTTPServer(("127.0.0.1", 5000), Handler).serve_forever()
