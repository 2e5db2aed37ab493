# Classic watchdog mode: one process per request, the body on stdin, the answer on stdout.
import json
import os
import sys

text = sys.stdin.read()
words = text.split()
print(json.dumps({
    "words": len(words),
    "lines": text.count("\n"),
    "method": os.environ.get("Http_Method", ""),
    "path": os.environ.get("Http_Path", ""),
}))
