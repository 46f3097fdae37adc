#!/usr/bin/env bash
# Observability under mpirun -np 2: the profiler's trace has a track per rank (pid 0 and 1),
# with the collectives (kind, group, bytes) on their lanes (dp, and tp / pp runs); metrics.jsonl has both ranks'
# compute / exposed communication / data wait and memory high-water; a rank slowed
# artificially (LOOM_TEST_SLOW_RANK=RANK:MS sleeps in its every step) is named as the
# straggler after 3 steps slower than the median by obs.straggler_ratio.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
COMMON=(--set training.batch_size=4 --set eval.every=0 --set checkpoint.every=0)

run_mpi 2 "$WORK/out" "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/prof" \
  --set training.steps=4 --set profile.steps=2-3
[ $RC -eq 0 ] || { cat "$WORK/out"; fail "profiled 2-rank run: exit $RC"; }
python3 "$LOOM_SRC/tests/e2e/trace_check.py" "$WORK/prof" 2 2 || fail "2-rank trace"
python3 - "$WORK/prof" <<'PY' || fail "collectives in the trace"
import json, sys
ev = json.load(open(sys.argv[1] + "/trace.json"))["traceEvents"]
for pid in (0, 1):
    comm = [e for e in ev if e.get("cat") == "comm" and e["pid"] == pid]
    assert any(e["name"] == "allreduce" and e["args"]["group"] == "dp" and e["args"]["bytes"] > 0
               for e in comm), f"rank {pid}: no dp allreduce with bytes"
    assert all(e["tid"] >= 1 for e in comm)
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["pid"] == pid and e["name"] == "process_name"}
    assert names == {f"rank {pid}"}, names
print("ok: both ranks' collectives (kind, group, bytes) on their own lanes")
PY
pass "2-rank profile: one trace, a track per rank"

# tensor and pipeline parallelism: the profiling op table wraps every op the views call (the
# vocab-parallel ones included); a replica's ops, spread over its ranks, sum to its FLOPs
for par in tp pp; do
  run_mpi 2 "$WORK/out" "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/prof_$par" \
    --set training.steps=4 --set profile.steps=2-3 --set parallel.$par=2
  [ $RC -eq 0 ] || { cat "$WORK/out"; fail "profiled $par=2 run: exit $RC"; }
  python3 "$LOOM_SRC/tests/e2e/trace_check.py" "$WORK/prof_$par" 2 2 || fail "$par=2 trace"
done
pass "profiles of tp=2 and pp=2: traces nest, FLOPs add up over the replica's ranks"

LOOM_TEST_SLOW_RANK=1:300 run_mpi 2 "$WORK/out" -x LOOM_TEST_SLOW_RANK "$LOOM_BIN" train "$WORK/c.yaml" \
  "${COMMON[@]}" --set run.dir="$WORK/slow" --set training.steps=6
[ $RC -eq 0 ] || { cat "$WORK/out"; fail "slowed run: exit $RC"; }
grep -q "rank 1 is a straggler" "$WORK/out" || { cat "$WORK/out"; fail "the straggler was not named in the log"; }
python3 - "$WORK/slow/metrics.jsonl" "$WORK/slow/alerts.jsonl" <<'PY' || fail "straggler in metrics.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    for k in ("compute_s", "comm_exposed_s", "data_wait_s", "rss_hwm_bytes", "arena_bytes"):
        assert len(r[k]) == 2, (k, r)
    assert r["compute_s"][1] >= 0.3, r  # the 300 ms sleep is compute time of rank 1
# rank 0 waits for rank 1 in the collectives: its exposed communication holds the lag
assert sum(r["comm_exposed_s"][0] for r in rows) > sum(r["comm_exposed_s"][1] for r in rows)
# named after 3 consecutive slow steps: step 3 at the earliest (a step where the machine's
# load stalled rank 0 as long would restart the count), never rank 0
named = [r["step"] for r in rows if "straggler_rank" in r]
assert named and min(named) >= 3, named
assert all(r["straggler_rank"] == 1 for r in rows if "straggler_rank" in r), rows
for r in rows:
    if "straggler_rank" in r:
        # busy 300 ms against a median of (300 + rank 0's few ms) / 2
        assert r["straggler_lag"] > 1.2 and r["straggler_lag_ms"] > 100, r
al = [json.loads(l) for l in open(sys.argv[2])]
st = [a for a in al if a["metric"] == "straggler_lag"]
assert st and st[0]["step"] == min(named) and st[0]["action"] == "log" and st[0]["value"] > 1.2, al
print(f"ok: rank 1 named at steps {named}, with its lag; the default rule 'straggler_lag > 0 -> log' fired at step {min(named)}")
PY
pass "straggler: the slowed rank named with its lag"

# an alert with action stop ends both ranks after a checkpoint, with exit status 3
LOOM_TEST_INJECT_NAN=1:3 run_mpi 2 "$WORK/out" -x LOOM_TEST_INJECT_NAN "$LOOM_BIN" train "$WORK/c.yaml" \
  "${COMMON[@]}" --set run.dir="$WORK/stop" --set training.steps=8 --set 'alerts=["loss nonfinite -> stop"]'
[ $RC -eq 3 ] || { cat "$WORK/out"; fail "alert stop under mpirun: exit $RC, expected 3"; }
[ "$(grep -c "stopped by an alert rule" "$WORK/out")" = 2 ] || { cat "$WORK/out"; fail "both ranks should report the stop"; }
[ -f "$WORK/stop/ckpt/step_0000003/COMPLETE" ] || fail "alert stop: no checkpoint at step 3"
pass "alert stop under mpirun -np 2: checkpoint, exit status 3"

# MFU with no peak anywhere: a 2-rank run measures it on both ranks at once before the first
# step (rank 0 says so and caches the mean; on 2 oversubscribed cores it is flagged), and every
# metrics.jsonl row has mfu
run_mpi 2 "$WORK/out" env -u LOOM_PEAK_FLOPS LOOM_CACHE_DIR="$WORK/peak_cache" "$LOOM_BIN" train \
  "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/mfu" --set training.steps=3 --set training.peak_flops=0
[ $RC -eq 0 ] || { cat "$WORK/out"; fail "2-rank run without a peak: exit $RC"; }
grep -q "measuring the peak fp32 GEMM FLOP/s at 1 threads on all 2 ranks" "$WORK/out" || { cat "$WORK/out"; fail "the 2-rank run did not measure the peak"; }
python3 - "$WORK/mfu/metrics.jsonl" "$WORK/peak_cache/peak_flops.json" <<'PY' || fail "mfu missing in a 2-rank run"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
(ent,) = json.load(open(sys.argv[2])).values()
assert len(rows) == 3, rows
for r in rows:
    assert r["mfu"] > 0 and abs(r["peak_flops"] - 2 * ent["flops"]) <= 1e-6 * r["peak_flops"], (r, ent)
PY
pass "a 2-rank run with no peak measures it on every rank, caches it, reports mfu"
