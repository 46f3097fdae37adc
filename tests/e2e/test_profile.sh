#!/usr/bin/env bash
# The profiler (profile.steps): run.dir/trace.json in the Trace Event format with spans per
# op (FLOPs and bytes), phase, data wait and checkpoint, nested; the matmul and attention
# spans of each step sum to the model FLOPs (within 2%); profile_summary.json has achieved
# FLOP/s per op against the peak. Both flavors (gpt2: flash and sdpa attention). A bad range
# is an error naming the key.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
for variant in gpt2:flash gpt2:sdpa llama:flash; do
  fl=${variant%%:*} att=${variant##*:}
  FLAVOR=$fl make_config "$WORK" "$WORK/c.yaml" "$WORK/run-$fl-$att"
  expect_ok "train $variant with profile.steps 2-3" "$LOOM_BIN" train "$WORK/c.yaml" \
    --set training.steps=5 --set profile.steps=2-3 --set checkpoint.every=3 \
    --set model.attention=$att
  run="$WORK/run-$fl-$att"
  python3 "$LOOM_SRC/tests/e2e/trace_check.py" "$run" 1 2 || fail "$variant: trace"
  ls "$run"/trace.rank_* >/dev/null 2>&1 && fail "$variant: trace parts left behind"
  python3 - "$run" <<'PY' || fail "$variant: summary or checkpoint span"
import json, sys
run = sys.argv[1]
s = json.load(open(run + "/profile_summary.json"))
assert s["peak_flops_per_rank"] == 1e11, s["peak_flops_per_rank"]
ops = {o["name"]: o for o in s["ops"]}
mm = ops["matmul_forward"]
assert mm["calls"] > 0 and mm["flops"] > 0 and mm["flops_per_s"] > 0, mm
assert abs(mm["peak_frac"] - mm["flops_per_s"] / 1e11) < 1e-9 * mm["peak_frac"] + 1e-12, mm
secs = [o["seconds"] for o in s["ops"]]
assert secs == sorted(secs, reverse=True), "ops not sorted by time"
r0 = s["per_rank"][0]
assert r0["steps"] == 2 and abs(r0["compute_s"] + r0["comm_exposed_s"] + r0["data_wait_s"] - r0["step_s"]) < 1e-6, r0
ev = json.load(open(run + "/trace.json"))["traceEvents"]
assert any(e.get("cat") == "ckpt" and e["name"] == "checkpoint" for e in ev), "no checkpoint span (step 3)"
print("ok: summary: ops by time, FLOP/s and share of the peak; checkpoint span")
PY
  grep -q "profile: .*trace.json" "$WORK/err.txt" || fail "$variant: no profile summary in the log"
done
pass "profiler: traces of gpt2 (flash, sdpa) and llama nest, FLOPs add up to the model's"

FLAVOR=gpt2 make_config "$WORK" "$WORK/c.yaml" "$WORK/run-bad"
expect_fail "profile.steps 3-2" "profile.steps.*3-2" "$LOOM_BIN" train "$WORK/c.yaml" --set profile.steps=3-2
expect_fail "profile.steps abc" "profile.steps.*not a step range" "$LOOM_BIN" train "$WORK/c.yaml" --set profile.steps=abc

# profiling off: no trace, and the metrics carry the per-rank timing
FLAVOR=gpt2 make_config "$WORK" "$WORK/c.yaml" "$WORK/run-off"
expect_ok "train without profile" "$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=3
[ -e "$WORK/run-off/trace.json" ] && fail "trace.json written with profiling off"
python3 - "$WORK/run-off/metrics.jsonl" <<'PY' || fail "per-rank timing in metrics.jsonl"
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    for k in ("compute_s", "comm_exposed_s", "data_wait_s", "step_s", "rss_hwm_bytes", "arena_bytes"):
        assert isinstance(r[k], list) and len(r[k]) == 1, (k, r)
    assert abs(r["compute_s"][0] + r["comm_exposed_s"][0] + r["data_wait_s"][0] - r["step_s"][0]) < 1e-9, r
    assert r["rss_hwm_bytes"][0] > 0 and r["rss_bytes"] > 0 and r["arena_bytes"][0] == r["mem_bytes"], r
    assert 0 <= r["comm_exposed_share"] <= 1 and "straggler_rank" not in r, r
print("ok: metrics: compute/comm/data per rank, memory high-water")
PY
pass "profiling off: no trace; per-rank timing and memory in metrics.jsonl"
