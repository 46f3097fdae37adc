# `loom serve` on a byte-tiny-size checkpoint (d 256, 4 layers) with 16 streamed requests in
# flight, SIGTERM or SIGINT at a random moment of their generation: every request finishes
# (finish_reason "length", [DONE]) and the server exits 0 (issue 30: 4 of 12 servers died,
# "munmap_chunk(): invalid pointer", every request lost). First a deterministic check: with
# the requests in flight, no thread of the server (the engine's, OpenMP's, libmicrohttpd's
# connection threads) takes SIGINT or SIGTERM.
#   SIGNAL_RUNS=N (default 4): how many servers to stop.
source "$(dirname "$0")/lib.sh"
RUNS=${SIGNAL_RUNS:-4}
cd "$WORK"
make_fullsize "$WORK" "$WORK/bt.yaml" 1
"$LOOM_BIN" train "$WORK/bt.yaml" --set run.dir="$WORK/run" --set checkpoint.every=1 2>"$WORK/train.log" \
  || { cat "$WORK/train.log"; fail "train"; }

for i in $(seq 0 $((RUNS - 1))); do
  sig=$([ $((i % 2)) = 0 ] && echo TERM || echo INT)
  rm -f "$WORK/port"
  start_server "$WORK/port" "$WORK/serve$i.log" "$LOOM_BIN" serve "$WORK/run" --port 0 \
    --port-file "$WORK/port" --batch 16 --max-concurrent 16
  # the client: 16 streams; once each has its response head (the server has them all), the threads are checked (first
  # run), then a random delay, the signal, and every stream must run to its end
  python3 - "$(cat "$WORK/port")" "$SERVER_PID" "$sig" "$i" "$LOOM_SRC" <<'PY' \
    || { cat "$WORK/serve$i.log" >&2; fail "run $i: SIG$sig with 16 requests in flight"; }
import http.client, json, os, random, signal, subprocess, sys, threading, time
port, pid, sig, run = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
N, TOKENS = 16, 96
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly".split()
rnd = random.Random(run)
# prompts of 120-150 bytes (tokens): their prefill GEMMs are large ones too
prompts = [" ".join(rnd.choice(words) for _ in range(40))[:rnd.randint(120, 150)] for _ in range(N)]
first = [threading.Event() for _ in range(N)]
result = [None] * N

def stream(k):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        c.request("POST", "/v1/completions", json.dumps({"prompt": prompts[k], "max_tokens": TOKENS,
                  "temperature": 0.8, "seed": k, "stream": True}), {"Content-Type": "application/json"})
        r = c.getresponse()
        first[k].set()  # the headers: the server has the request (its prefill may not have run)
        if r.status != 200:
            result[k] = f"status {r.status}: {r.read()[:200]!r}"
            return
        finish, done, chunks = None, False, 0
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            ch = json.loads(line[6:])["choices"][0]
            chunks += 1
            finish = ch.get("finish_reason") or finish
        result[k] = "ok" if done and finish == "length" else f"ended: done={done} finish={finish} chunks={chunks}"
    except Exception as e:  # noqa: BLE001 - any failure is the test's
        result[k] = f"error {e!r}"
    first[k].set()

ts = [threading.Thread(target=stream, args=(k,)) for k in range(N)]
for t in ts:
    t.start()
for e in first:
    if not e.wait(120):
        sys.exit("a request got no response headers within 120 s")
if run == 0:
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            st = open(f"/proc/{pid}/task/{tid}/status").read()
        except OSError:
            continue  # a connection thread that just ended
        blk = int(st.split("SigBlk:")[1].split()[0], 16)
        if not (blk >> 1 & 1 and blk >> 14 & 1):
            sys.exit(f"thread {tid} of the server takes SIGINT/SIGTERM (SigBlk {blk:016x})")
        n += 1
    if n < N + 2:
        sys.exit(f"expected at least {N + 2} threads (16 connections, the engine), saw {n}")
    print(f"ok: all {n} threads of the server block SIGINT and SIGTERM")
delay = random.uniform(0, 0.8)
time.sleep(delay)
os.kill(pid, signal.SIGTERM if sig == "TERM" else signal.SIGINT)
for t in ts:
    t.join(300)
bad = [(k, r) for k, r in enumerate(result) if r != "ok"]
if bad:
    sys.exit(f"SIG{sig} {delay:.2f} s after the 16 response heads: requests lost: {bad}")
print(f"ok: SIG{sig} {delay:.2f} s after the 16 response heads: all {N} requests finished")
PY
  rc=0; wait $SERVER_PID || rc=$?
  crashed "$WORK/serve$i.log" || grep -qE "corrupted|double free|invalid pointer|munmap_chunk" "$WORK/serve$i.log" \
    && { cat "$WORK/serve$i.log"; fail "run $i: the server crashed (exit $rc)"; }
  [ $rc = 0 ] || { cat "$WORK/serve$i.log"; fail "run $i: the server exited $rc after SIG$sig"; }
  grep -q "SIG$sig: finishing" "$WORK/serve$i.log" || { cat "$WORK/serve$i.log"; fail "run $i: no drain message"; }
  # (on a fast quiet machine the signal can come after the last request ended: that run still
  #  checks the clean exit, and at least one run must have had requests in flight)
  if grep -qE "finishing [1-9][0-9]* request" "$WORK/serve$i.log"; then inflight=$((${inflight:-0} + 1)); fi
  pass "run $i: SIG$sig with 16 requests in flight: all finished, exit 0 ($(grep -o "finishing [0-9]* request(s) in flight" "$WORK/serve$i.log"))"
done
[ "${inflight:-0}" -ge 1 ] || fail "no run had a request in flight at the signal"
echo "all serve signal tests passed"
