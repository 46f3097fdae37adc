#!/usr/bin/env python3
"""Server throughput: `loom serve` under CLIENTS concurrent clients.

One checkpoint of CONFIG's shape (one training step). `loom serve CKPT --batch 16` with
OMP_NUM_THREADS=THREADS; CLIENTS client threads (http.client, one keep-alive connection each)
each send REQUESTS `POST /v1/completions` one after another: a prompt of 16 random letters
(16 byte tokens), `max_tokens` TOKENS, `temperature` 0 (the byte tokenizer has no end-of-text
token: every request generates TOKENS tokens). Measured from the first request sent to the
last response: completion tokens/s (`usage.completion_tokens` summed) and requests/s, the
latency of a request (median, 95th percentile), and the server's CPU seconds over the same
span (/proc/PID/stat) for tokens per CPU second. For reference the same engine offline:
`loom generate --prompts` with CLIENTS prompts at `--batch 16`.

  python3 bench/bench_serve.py [--config gpt2-small] [--clients 16] [--requests 4]
                               [--tokens 64] [--threads 1] [--write]
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
from bench_infer import STATS, sh  # noqa: E402  (the same command runner and stats line)


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="gpt2-small")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    w = tempfile.mkdtemp(prefix="loom-bench-serve.")
    rnd = random.Random(2)
    prompts = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(16))
               for _ in range(a.clients * a.requests)]
    if not os.path.exists(os.path.join(REPO, "data/fortunes/train/manifest.jsonl")):
        sh([LOOM, "data", "build", "recipes/fortunes.yaml"])
    ckpt = f"{w}/{a.config}"
    sh([LOOM, "train", f"configs/{a.config}.yaml", "--set", f"run.dir={ckpt}", "--set",
        "training.steps=1", "--set", "checkpoint.every=1", "--set", "data.val=", "--set",
        "training.batch_size=1", "--set", "training.seq_len=32", "--set",
        "training.peak_flops=1e11"], env=dict(os.environ, OMP_NUM_THREADS="2"))
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    load0 = open("/proc/loadavg").read().split()[:3]
    srv = subprocess.Popen([LOOM, "serve", ckpt, "--port", "0", "--port-file", f"{w}/port",
                            "--batch", "16", "--max-tokens", str(a.tokens), "--timeout", "3600"],
                           cwd=REPO, env=env, stderr=open(f"{w}/serve.log", "w"))
    try:
        for _ in range(600):
            if os.path.exists(f"{w}/port") and open(f"{w}/port").read().strip():
                break
            if srv.poll() is not None:
                sys.exit("the server exited: " + open(f"{w}/serve.log").read()[-2000:])
            time.sleep(0.1)
        port = int(open(f"{w}/port").read())
        lat, toks, errors = [], [], []
        lock = threading.Lock()

        def client(c):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
            for r in range(a.requests):
                body = json.dumps({"prompt": prompts[c * a.requests + r], "max_tokens": a.tokens,
                                   "temperature": 0})
                t0 = time.perf_counter()
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                dt = time.perf_counter() - t0
                with lock:
                    if resp.status != 200:
                        errors.append(f"{resp.status} {data[:200]!r}")
                        continue
                    lat.append(dt)
                    toks.append(json.loads(data)["usage"]["completion_tokens"])
            conn.close()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
        c0, t0 = cpu_seconds(srv.pid), time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall, cpu = time.perf_counter() - t0, cpu_seconds(srv.pid) - c0
    finally:
        srv.terminate()
        srv.wait(timeout=600)
    if errors:
        sys.exit(f"{len(errors)} requests failed: {errors[:3]}")
    # the same engine offline, for reference
    with open(f"{w}/p.txt", "w") as f:
        f.write("\n".join(prompts[: a.clients]) + "\n")
    r = sh([LOOM, "generate", ckpt, "--prompts", f"{w}/p.txt", "--tokens", str(a.tokens),
            "--temperature", "0", "--batch", "16", "--stats"], env=env)
    m = STATS.search(r.stderr)
    off_wall, off_cpu = int(m[1]) / float(m[2]), int(m[1]) / float(m[3])
    load1 = open("/proc/loadavg").read().split()[:3]
    n = len(lat)
    q95 = sorted(lat)[max(0, int(0.95 * n + 0.999) - 1)]
    out = [f"## Server throughput ({datetime.date.today()})", "",
           f"`python3 bench/bench_serve.py --clients {a.clients} --requests {a.requests} "
           f"--tokens {a.tokens} --threads {a.threads}`: `loom serve` ({a.config}, one training "
           f"step, `--batch 16`, {a.threads} thread(s)); {a.clients} concurrent clients, each "
           f"sending {a.requests} `/v1/completions` requests in turn (16-token prompt, "
           f"`max_tokens` {a.tokens}, temperature 0); from the first request to the last "
           "response. Offline: `loom generate --prompts` with the same engine at `--batch 16` "
           f"over {a.clients} prompts.", "",
           "| | requests | tokens | seconds | tokens/s | requests/s | latency p50 / p95 s | "
           "tokens per CPU-s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|",
           f"| loom serve | {n} | {sum(toks)} | {wall:.1f} | {sum(toks) / wall:.1f} | "
           f"{n / wall:.2f} | {statistics.median(lat):.1f} / {q95:.1f} | {sum(toks) / cpu:.1f} |",
           f"| loom generate (offline) | {a.clients} | | | {off_wall:.1f} | | | {off_cpu:.1f} |",
           "", f"Load average (1, 5, 15 min) before: {' '.join(load0)}; after: {' '.join(load1)} "
           f"({os.cpu_count()} CPUs)."]
    text = "\n".join(out) + "\n"
    print(text)
    if a.write:  # our section of the shared RESULTS.md (bench/results_md.py)
        from results_md import replace_section
        replace_section(text, "## Server throughput (", os.path.join(REPO, "bench/RESULTS.md"))
    subprocess.run(["rm", "-rf", w])


if __name__ == "__main__":
    main()
