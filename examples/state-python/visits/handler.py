# A visit counter kept in Silt's function state, through the state API on
# loopback (SILT_STATE_URL); only the Python standard library.
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

STATE = os.environ["SILT_STATE_URL"]


def state(method, path, body=None):
    """One state API request: (status, body bytes)."""
    req = urllib.request.Request(STATE + path, data=body, method=method)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:  # 404, 409, 413, 503, ...: a value
        return e.code, e.read()


def fail(what, status, body):
    sys.stderr.write(f"{what}: {status} {body.decode(errors='replace')}")
    sys.exit(1)  # the caller gets a 500 with this message


page = os.environ.get("Http_Path", "/").strip("/") or "home"
key = "/state/maps/visits/" + urllib.parse.quote(page, safe="")

status, body = state("GET", key)
if status not in (200, 404):
    fail("reading the count", status, body)
# Not atomic: two instances counting the same page at once may both write
# the same count. The log below never loses a visit.
count = int(body) + 1 if status == 200 else 1
status, body = state("PUT", key, str(count).encode())
if status != 204:
    fail("storing the count", status, body)

status, body = state("POST", "/state/vectors/visit-log", page.encode())
if status != 200:
    fail("logging the visit", status, body)
overall = json.loads(body)["index"] + 1

print(f"{page}: {count} visit(s), visit #{overall} overall")
