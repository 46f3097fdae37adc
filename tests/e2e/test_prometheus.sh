#!/usr/bin/env bash
# obs.prometheus_port: a training run serves its metrics on 127.0.0.1 in the Prometheus text
# format; `promtool check metrics` passes on what it serves; a real Prometheus server (Debian
# package prometheus) scrapes it, and its HTTP API returns the loss series, equal to values in
# metrics.jsonl. A bad or busy port is an error naming the key.
source "$(dirname "$0")/lib.sh"
command -v prometheus >/dev/null && command -v promtool >/dev/null ||
  fail "prometheus / promtool not found (Debian package prometheus; scripts/setup.sh --test)"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
read -r PORT PPORT < <(python3 -c "
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(('127.0.0.1', 0))
print(*[s.getsockname()[1] for s in ss])")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

# a long run (each step sleeps 40 ms: the test hook), stopped by SIGTERM once checked
LOOM_TEST_SLOW_RANK=0:40 "$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=6000 \
  --set training.schedule_steps=6000 --set eval.every=0 --set checkpoint.every=0 \
  --set obs.prometheus_port=$PORT >"$WORK/train.out" 2>&1 &
TRAIN=$!
PIDS+=($TRAIN)

get() { python3 -c "
import sys, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=5); sys.stdout.write(r.read().decode())
except Exception as e:
    sys.stdout.write(''); sys.exit(1)" "$1"; }

for i in $(seq 1 240); do
  get "http://127.0.0.1:$PORT/metrics" >"$WORK/scrape.txt" 2>/dev/null && grep -q '^loom_loss ' "$WORK/scrape.txt" && break
  kill -0 $TRAIN 2>/dev/null || { cat "$WORK/train.out"; fail "training ended before serving metrics"; }
  sleep 0.5
done
grep -q '^loom_loss ' "$WORK/scrape.txt" || { cat "$WORK/train.out"; fail "no loom_loss served on port $PORT"; }
for m in loom_learning_rate loom_tokens_per_second loom_step_seconds 'loom_rank_compute_seconds{rank="0"}' \
         'loom_rank_rss_high_water_bytes{rank="0"}' loom_skipped_steps_total loom_alerts_total; do
  grep -qF "$m " "$WORK/scrape.txt" || { cat "$WORK/scrape.txt"; fail "$m not served"; }
done
promtool check metrics <"$WORK/scrape.txt" >"$WORK/promtool.out" 2>&1 ||
  { cat "$WORK/promtool.out"; fail "promtool check metrics"; }
[ -s "$WORK/promtool.out" ] && { cat "$WORK/promtool.out"; fail "promtool check metrics reported problems"; }
pass "the endpoint serves the metrics; promtool check metrics is clean"
python3 -c "
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen('http://127.0.0.1:$PORT/nope', timeout=5); sys.exit(1)
except urllib.error.HTTPError as e:
    sys.exit(0 if e.code == 404 else 1)" || fail "an unknown path is not a 404"

cat > "$WORK/prom.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: loom
    static_configs:
      - targets: ['127.0.0.1:$PORT']
YAML
prometheus --config.file="$WORK/prom.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address=127.0.0.1:$PPORT >"$WORK/prom.out" 2>&1 &
PIDS+=($!)
ok=0
for i in $(seq 1 240); do
  if get "http://127.0.0.1:$PPORT/api/v1/query?query=loom_loss%5B1m%5D" >"$WORK/q.json" 2>/dev/null &&
     python3 - "$WORK/q.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["data"]["result"]
sys.exit(0 if d["status"] == "success" and r and len(r[0]["values"]) >= 3 else 1)
PY
  then ok=1; break; fi
  kill -0 $TRAIN 2>/dev/null || { cat "$WORK/train.out"; fail "training ended before Prometheus scraped 3 samples"; }
  sleep 0.5
done
[ $ok = 1 ] || { tail -20 "$WORK/prom.out"; cat "$WORK/q.json" 2>/dev/null; fail "Prometheus has no loom_loss series"; }
kill -TERM $TRAIN; wait $TRAIN || true
python3 - "$WORK/q.json" "$WORK/run/metrics.jsonl" <<'PY' || fail "the scraped losses are not the run's"
import json, sys
series = json.load(open(sys.argv[1]))["data"]["result"][0]
assert series["metric"]["job"] == "loom" and series["metric"]["__name__"] == "loom_loss", series["metric"]
losses = {json.loads(l)["loss"] for l in open(sys.argv[2])}
vals = [float(v) for _, v in series["values"]]
missing = [v for v in vals if v not in losses]
assert not missing, f"{missing} not in metrics.jsonl"
print(f"ok: Prometheus API: {len(vals)} loss samples, each a loss of metrics.jsonl")
PY
pass "a Prometheus server scraped the run; its API returns the loss series"

expect_fail "port 70000" "obs.prometheus_port.*70000" "$LOOM_BIN" train "$WORK/c.yaml" \
  --set run.dir="$WORK/bad" --set obs.prometheus_port=70000
python3 -c "
import socket, sys, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)
open(sys.argv[1], 'w').write(str(s.getsockname()[1])); time.sleep(60)" "$WORK/busy.port" &
PIDS+=($!)
for i in $(seq 1 50); do [ -s "$WORK/busy.port" ] && break; sleep 0.2; done
BUSY=$(cat "$WORK/busy.port")
expect_fail "port in use" "obs.prometheus_port.*cannot listen on 127.0.0.1:$BUSY" "$LOOM_BIN" train \
  "$WORK/c.yaml" --set run.dir="$WORK/busy" --set obs.prometheus_port=$BUSY
