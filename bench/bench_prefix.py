#!/usr/bin/env python3
"""Prefix caching: `loom serve` with and without it, for requests sharing a long prefix.

One checkpoint of CONFIG's shape (one training step, max_seq_len raised to hold the prefix).
Every request is PREFIX tokens of shared text (an agent's system prompt and tool list) plus a
short question of its own, `/v1/completions`, greedy, TOKENS new tokens. The same requests go
to a server started with `--prefix-cache on` and to one with `--prefix-cache off` (one at a
time, interleaved: run k of each side alternate, so a change of machine load hits both):
  - time to first token: REQUESTS requests one after another, streamed (the first text
    chunk), after one warm-up request that fills the cache; median per side;
  - throughput: CLIENTS concurrent clients, 2 requests each, non-streamed: completion tokens
    per second from the first request sent to the last answer;
and the ratio off / on of each. The prefix's cached tokens (usage.prompt_tokens_details) are
checked to be the whole blocks of the prefix, and the answers equal on both sides.

  python3 bench/bench_prefix.py [--config gpt2-small] [--prefix 1000] [--requests 5]
                                [--clients 8] [--tokens 16] [--threads 2] [--runs 2] [--write]
"""
import argparse
import datetime
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM = os.environ.get("LOOM_BIN", os.path.join(REPO, "build", "loom"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_infer import sh  # noqa: E402


def post(port, body, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=stream)), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {r.read()[:300]!r}")
    if not stream:
        out = json.loads(r.read())
        c.close()
        return time.perf_counter() - t0, out
    first, text = None, ""
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        t = json.loads(line[6:])["choices"][0]["text"]
        if t and first is None:
            first = time.perf_counter() - t0
        text += t
    c.close()
    return first, text


def serve(ckpt, w, side, threads):
    pf = f"{w}/port_{side}"
    if os.path.exists(pf):
        os.remove(pf)
    p = subprocess.Popen([LOOM, "serve", ckpt, "--port", "0", "--port-file", pf, "--prefix-cache", side,
                          "--batch", "16", "--timeout", "3600"], cwd=REPO,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads)), stderr=open(f"{w}/{side}.log", "w"))
    for _ in range(600):
        if os.path.exists(pf) and open(pf).read().strip():
            return p, int(open(pf).read())
        if p.poll() is not None:
            sys.exit("the server exited: " + open(f"{w}/{side}.log").read()[-2000:])
        time.sleep(0.1)
    sys.exit("the server did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="gpt2-small")
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    w = tempfile.mkdtemp(prefix="loom-bench-prefix.")
    if not os.path.exists(os.path.join(REPO, "data/fortunes/train/manifest.jsonl")):
        sh([LOOM, "data", "build", "recipes/fortunes.yaml"])
    ckpt = f"{w}/{a.config}"
    T = a.prefix + 256
    sh([LOOM, "train", f"configs/{a.config}.yaml", "--set", f"run.dir={ckpt}", "--set", "training.steps=1",
        "--set", "checkpoint.every=1", "--set", "data.val=", "--set", "training.batch_size=1", "--set",
        "training.seq_len=32", "--set", f"model.max_seq_len={T}", "--set", "training.peak_flops=1e11"],
       env=dict(os.environ, OMP_NUM_THREADS="2"))
    rnd = random.Random(5)
    words = "the agent reads its tools and the user's task then calls a function with arguments".split()
    prefix = ""
    while len(prefix) < a.prefix:
        prefix += " " + rnd.choice(words)
    prefix = prefix[: a.prefix]  # the fortunes data is byte-tokenized: a.prefix tokens
    n_prefix = len(prefix.encode())
    questions = [f"\nQ{i}: do item {i * 7}?" for i in range(200)]
    load0 = open("/proc/loadavg").read().split()[:3]
    res = {"on": {"ttft": [], "tps": []}, "off": {"ttft": [], "tps": []}}
    answers = {"on": {}, "off": {}}
    cached = []
    dec = {"text": [], "json": []}  # seconds per decoded token
    for run in range(a.runs):
        for side in ("on", "off") if run % 2 == 0 else ("off", "on"):
            srv, port = serve(ckpt, w, side, a.threads)
            try:
                body = {"max_tokens": a.tokens, "temperature": 0}
                post(port, dict(body, prompt=prefix + "\nwarm up"))  # fills the cache (on)
                for i in range(a.requests):
                    qi = questions[run * 100 + i]
                    t, text = post(port, dict(body, prompt=prefix + qi), stream=True)
                    res[side]["ttft"].append(t)
                    answers[side][qi] = text
                lock, toks = threading.Lock(), []

                def client(c):
                    for r in range(2):
                        qi = questions[run * 100 + 50 + c * 2 + r]
                        _, out = post(port, dict(body, prompt=prefix + qi))
                        with lock:
                            toks.append(out["usage"]["completion_tokens"])
                            answers[side][qi] = out["choices"][0]["text"]
                            if side == "on":
                                cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
                th = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
                t0 = time.perf_counter()
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                res[side]["tps"].append(sum(toks) / (time.perf_counter() - t0))
                if side == "on":  # constrained decoding against unconstrained, one at a time
                    long_doc = {"type": "json_schema", "json_schema": {"name": "doc", "schema": {
                        "type": "object", "properties": {"s": {"type": "string", "minLength": 50}},
                        "required": ["s"]}}}  # at least 58 tokens: decoding, not the end, is timed
                    for rf in (None, long_doc):
                        for i in range(a.requests):
                            b = {"prompt": "{", "max_tokens": 64, "temperature": 1, "seed": 100 + i}
                            if rf:
                                b["response_format"] = rf
                            t_first, _ = post(port, b, stream=True)
                            t_all, out = post(port, b)
                            n = out["usage"]["completion_tokens"]
                            if n > 1:
                                dec["json" if rf else "text"].append((t_all - t_first) / (n - 1))
            finally:
                srv.terminate()
                srv.wait(timeout=600)
    load1 = open("/proc/loadavg").read().split()[:3]
    same = sum(answers["on"][k] == answers["off"][k] for k in answers["on"])
    if same != len(answers["on"]):
        sys.exit(f"answers differ with and without the cache: {len(answers['on']) - same} of {len(answers['on'])}")
    blocks = n_prefix // 16 * 16
    ttft = {s: statistics.median(res[s]["ttft"]) for s in res}
    tps = {s: statistics.median(res[s]["tps"]) for s in res}
    out = [f"## Prefix caching ({datetime.date.today()})", "",
           f"`python3 bench/bench_prefix.py --config {a.config} --prefix {a.prefix} --requests {a.requests} "
           f"--clients {a.clients} --tokens {a.tokens} --threads {a.threads} --runs {a.runs}`: `loom serve` "
           f"({a.config}, one training step, max_seq_len {T}, `--batch 16`, {a.threads} thread(s)) with "
           f"`--prefix-cache on` and `off`, runs interleaved; every request is the same {n_prefix}-token prefix "
           f"plus a question of its own (about 15 tokens: the byte tokenizer), greedy, {a.tokens} new tokens. Time to first token: "
           f"{a.requests} streamed requests in turn per run after a warm-up; throughput: {a.clients} concurrent "
           "clients, 2 requests each. Medians over the runs.", "",
           "| | time to first token (s) | completion tokens/s, concurrent |",
           "|---|---:|---:|",
           f"| `--prefix-cache off` | {ttft['off']:.3f} | {tps['off']:.1f} |",
           f"| `--prefix-cache on` | {ttft['on']:.3f} | {tps['on']:.1f} |",
           f"| off / on | {ttft['off'] / ttft['on']:.1f}x | {tps['on'] / tps['off']:.1f}x (on / off) |", "",
           f"Constrained decoding (`response_format` a JSON schema of an object with a string of at least 50 "
           f"characters, sampled, 64 tokens at most, the byte tokenizer's 256-token vocabulary) against unconstrained on the same server: {statistics.median(dec['json']) * 1e3:.1f} "
           f"vs {statistics.median(dec['text']) * 1e3:.1f} ms per decoded token (median over "
           f"{len(dec['json'])} requests; a request's decode time is its whole time less the first "
           f"token's, over its tokens after the first).", "",
           f"Cached tokens per request with the cache: {min(cached)}-{max(cached)} (the prefix's full "
           f"16-token blocks: {blocks}); the {same} answers are the same on both sides. "
           f"Load average (1, 5, 15 min) before: {' '.join(load0)}; after: {' '.join(load1)} "
           f"({os.cpu_count()} CPUs)."]
    text = "\n".join(out) + "\n"
    print(text)
    if a.write:
        from results_md import replace_section
        replace_section(text, "## Prefix caching (", os.path.join(REPO, "bench/RESULTS.md"))
    subprocess.run(["rm", "-rf", w])


if __name__ == "__main__":
    main()
