# A shared work queue kept in Silt's function state, through the state API on
# loopback (SILT_STATE_URL); only the Python standard library. Any instance
# of any function of the namespace can submit or work tasks.
from http.server import BaseHTTPRequestHandler, HTTPServer
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

# Read once at start: the address stays the same across snapshots.
STATE = os.environ["SILT_STATE_URL"]


def state(method, path, body=None):
    """One state API request: (status, body bytes)."""
    req = urllib.request.Request(STATE + path, data=body, method=method)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:  # 404, 408, 409, 413, 503: a value
        return e.code, e.read()


def result_key(task):
    return "/state/maps/task-results/" + urllib.parse.quote(task, safe="")


class Handler(BaseHTTPRequestHandler):
    def answer(self, status, text):
        out = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path == "/submit":
            status, err = state("POST", "/state/queues/tasks", body)
            if status != 204:
                return self.answer(status, err.decode())
            return self.answer(202, "queued\n")
        if self.path == "/work":
            status, task = state("POST", "/state/queues/tasks/pop?timeout_ms=1000")
            if status == 408:
                return self.answer(204, "")  # nothing to do
            if status != 200:
                return self.answer(status, task.decode())
            result = task.decode().upper()  # the work
            status, err = state("PUT", result_key(task.decode()), result.encode())
            if status != 204:
                return self.answer(status, err.decode())
            return self.answer(200, result + "\n")
        self.answer(404, "use POST /submit, POST /work or GET /result?task=TASK\n")

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        task = urllib.parse.parse_qs(url.query).get("task", [""])[0]
        if url.path != "/result" or not task:
            return self.answer(404, "use POST /submit, POST /work or GET /result?task=TASK\n")
        status, value = state("GET", result_key(task))
        if status == 404:
            return self.answer(404, f"no result for {task!r} yet\n")
        self.answer(status, value.decode() + "\n")

    def log_message(self, fmt, *args):
        sys.stderr.write((fmt % args) + "\n")


HTTPServer(("127.0.0.1", 5000), Handler).serve_forever()
