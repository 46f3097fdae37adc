"""A stand-in OpenAI-compatible completions endpoint for the synth tests: its answers are a
deterministic function of the prompt, so a pipeline's outputs are known in advance.

  python3 fake_openai.py PORT_FILE LOG_FILE

Serves POST /v1/completions on 127.0.0.1 (a free port, written to PORT_FILE) and appends one
JSON line per request ({"prompt": ...}) to LOG_FILE. The answer to a prompt:
  "COPY <text>"     -> <text> with its last word replaced by "zzz" (a near copy of the seed)
  "TWIN <k> <x>..." -> 30 words drawn from k, the last one replaced by the first word of x
                       (two seeds with the same k give two near copies of each other)
  anything else     -> 30 words drawn from the prompt's SHA-256 (distinct texts)
"""
import hashlib
import json
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber "
         "basil cedar dune ember fjord grove heath iris jade kelp loch moss nook opal").split()
lock = threading.Lock()


def words(seed, n=30):
    r = random.Random(seed)
    return [r.choice(WORDS) for _ in range(n)]


def answer(prompt):
    p = prompt.strip()
    if p.startswith("COPY "):
        w = p[5:].split()
        return " ".join(w[:-1] + ["zzz"])
    if p.startswith("TWIN "):
        parts = p.split()
        w = words("twin" + parts[1])
        return " ".join(w[:-1] + [parts[2] if len(parts) > 2 else "x"])
    return " ".join(words(hashlib.sha256(prompt.encode()).hexdigest()))


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        req = json.loads(self.rfile.read(n))
        prompt = req.get("prompt", "")
        with lock:
            with open(sys.argv[2], "a") as f:
                f.write(json.dumps({"prompt": prompt}) + "\n")
        text = answer(prompt)
        body = json.dumps({"object": "text_completion", "model": req.get("model", "fake"),
                           "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(text),
                                     "total_tokens": len(prompt) + len(text)}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
srv.serve_forever()
