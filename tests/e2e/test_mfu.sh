# MFU and its peak: with $LOOM_PEAK_FLOPS set (as in every test) nothing is measured or cached;
# metrics.jsonl records the peak used; a throughput above a (deliberately low) cached peak is
# reported as it is, above 100%, with a warning, and never raises the cached peak; `loom peak`
# refuses to measure while LOOM_PEAK_FLOPS is set; a bad LOOM_PEAK_FLOPS is an error.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
export LOOM_PEAK_FLOPS=${LOOM_PEAK_FLOPS:-1e11}
export LOOM_CACHE_DIR="$WORK/cache"
mkdir -p "$LOOM_CACHE_DIR"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run_env"
RUN=(--set training.steps=4 --set checkpoint.every=0 --set training.peak_flops=0
     --set training.threads=1 --set data.val=)

# 1. the peak from the environment: recorded, nothing measured, no cache written
expect_ok "train with LOOM_PEAK_FLOPS" "$LOOM_ASAN_BIN" train "$WORK/c.yaml" "${RUN[@]}"
[ ! -e "$LOOM_CACHE_DIR/peak_flops.json" ] || fail "a cache was written although LOOM_PEAK_FLOPS is set"
grep -q "measured the peak" "$WORK/err.txt" && fail "the trainer measured the peak"
python3 - "$WORK/run_env/metrics.jsonl" "$LOOM_PEAK_FLOPS" <<'PY' || fail "metrics.jsonl does not record the peak from LOOM_PEAK_FLOPS"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 4, rows
peak = float(sys.argv[2])
for r in rows:
    assert r["peak_flops"] == peak, r
    assert 0 < r["mfu"] < 1, r
# the same FLOPs/token in every row: mfu * peak / tokens_per_s
f = [r["mfu"] * r["peak_flops"] / r["tokens_per_s"] for r in rows]
assert max(f) - min(f) <= 1e-9 * max(f), f
PY
pass "metrics.jsonl records peak_flops = \$LOOM_PEAK_FLOPS"

# 2. a cached peak far below what training does: MFU > 100% as it is, a warning, cache unchanged
unset LOOM_PEAK_FLOPS
python3 - "$LOOM_CACHE_DIR/peak_flops.json" <<'PY'
import json, socket, sys, time
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name") and ":" in line:
        cpu = line.split(":", 1)[1].strip(" \t\n"); break
key = f"{socket.gethostname()}|{cpu}|1"
entry = {"flops": 1e6, "host": socket.gethostname(), "cpu": cpu, "threads": 1, "idle": True,
         "load1": 0.1, "ncpu": 2, "measured_at": int(time.time()), "probe": "cblas_sgemm fp32"}
json.dump({key: entry}, open(sys.argv[1], "w"), indent=2)
PY
cp "$LOOM_CACHE_DIR/peak_flops.json" "$WORK/cache_before.json"
make_config "$WORK" "$WORK/c2.yaml" "$WORK/run_low"
expect_ok "train with a cached peak of 1 MFLOP/s" "$LOOM_ASAN_BIN" train "$WORK/c2.yaml" "${RUN[@]}"
grep -q "above 100%" "$WORK/err.txt" || { cat "$WORK/err.txt" >&2; fail "no warning for MFU above 100%"; }
[ "$(grep -c "above 100%" "$WORK/err.txt")" = 1 ] || fail "the MFU warning is repeated"
grep -q "peak 0.0 GFLOP/s per rank (the peak cache)" "$WORK/err.txt" || { cat "$WORK/err.txt" >&2; fail "the start line does not name the cached peak"; }
cmp -s "$LOOM_CACHE_DIR/peak_flops.json" "$WORK/cache_before.json" || fail "training changed the cached peak"
python3 - "$WORK/run_low/metrics.jsonl" <<'PY' || fail "MFU above 100% not reported as it is"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 4
for r in rows:
    assert r["peak_flops"] == 1e6, r
    assert r["mfu"] > 1, r
PY
pass "MFU above 100% reported as it is, with a warning; the cached peak is not raised"

# 3. `loom peak` measures nothing while LOOM_PEAK_FLOPS is set; bad arguments; bad variable
rm -f "$LOOM_CACHE_DIR/peak_flops.json"
LOOM_PEAK_FLOPS=1e11 expect_fail "loom peak with LOOM_PEAK_FLOPS" "LOOM_PEAK_FLOPS=1e11 is set" "$LOOM_ASAN_BIN" peak
[ ! -e "$LOOM_CACHE_DIR/peak_flops.json" ] || fail "loom peak measured although LOOM_PEAK_FLOPS is set"
expect_fail "loom peak --threads 0" "--threads '0'" "$LOOM_ASAN_BIN" peak --threads 0
expect_fail "loom peak --seconds x" "--seconds 'x'" "$LOOM_ASAN_BIN" peak --seconds x
expect_fail "loom peak --bogus" "usage: loom peak" "$LOOM_ASAN_BIN" peak --bogus
make_config "$WORK" "$WORK/c3.yaml" "$WORK/run_bad"
LOOM_PEAK_FLOPS=fast expect_fail "train with LOOM_PEAK_FLOPS=fast" "LOOM_PEAK_FLOPS='fast' is not a positive number" \
  "$LOOM_ASAN_BIN" train "$WORK/c3.yaml" "${RUN[@]}"
[ ! -e "$LOOM_CACHE_DIR/peak_flops.json" ] || fail "a cache was written"

# 4. nothing cached, nothing configured (a new user's first run): the trainer measures the peak
#    before the first step, says so, caches it, and every metrics.jsonl row has mfu; the next
#    run takes it from the cache without measuring
unset LOOM_PEAK_FLOPS
export LOOM_CACHE_DIR="$WORK/cache_new"
make_config "$WORK" "$WORK/c4.yaml" "$WORK/run_first"
expect_ok "a first run with no peak anywhere" "$LOOM_BIN" train "$WORK/c4.yaml" "${RUN[@]}"
grep -q "measuring the peak fp32 GEMM FLOP/s" "$WORK/err.txt" || { cat "$WORK/err.txt" >&2; fail "the first run did not say it measures the peak"; }
[ -s "$LOOM_CACHE_DIR/peak_flops.json" ] || fail "the measured peak was not cached"
python3 - "$WORK/run_first/metrics.jsonl" "$LOOM_CACHE_DIR/peak_flops.json" <<'PY' || fail "no mfu in a first run's metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cache = json.load(open(sys.argv[2]))
(ent,) = cache.values()
assert len(rows) == 4, rows
for r in rows:
    assert r["mfu"] > 0 and r["peak_flops"] == ent["flops"], (r, ent)
PY
make_config "$WORK" "$WORK/c5.yaml" "$WORK/run_second"
first_idle=$(python3 -c 'import json,sys; print(int(list(json.load(open(sys.argv[1])).values())[0]["idle"]))' "$LOOM_CACHE_DIR/peak_flops.json")
expect_ok "a second run" "$LOOM_BIN" train "$WORK/c5.yaml" "${RUN[@]}"
if [ "$first_idle" = 1 ]; then # (a busy machine's figure is measured again once the machine is idle)
  grep -q "measuring the peak" "$WORK/err.txt" && fail "the second run measured again"
  grep -q "(the peak cache)" "$WORK/err.txt" || fail "the second run does not use the cached peak"
fi
pass "a first run measures and caches the peak (mfu in every row); the next uses the cache"
