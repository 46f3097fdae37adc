#!/usr/bin/env bash
# Non-finite values under data parallelism: a NaN loss and NaN gradients on ONE rank of an
# mpirun job (LOOM_TEST_INJECT_NAN=RANK:STEP, the trainer's test hook) skip that step on every
# rank: the replicas stay bit-identical (parallel.check_replicas compares them after every step,
# and the checkpoints before and after the skipped step hold the same bytes), metrics.jsonl
# records skipped_steps, and training.max_skipped consecutive skips stop the run with a
# checkpoint, a clear error and a non-zero exit; the same command then resumes.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
COMMON=(--set training.batch_size=4 --set parallel.zero=1 --set parallel.check_replicas=true
        --set eval.every=0 --set training.schedule_steps=20)

# ---- one NaN on rank 1 at step 4 ----
LOOM_TEST_INJECT_NAN=1:4 run_mpi 2 "$WORK/out" -x LOOM_TEST_INJECT_NAN "$LOOM_BIN" train "$WORK/c.yaml" \
  "${COMMON[@]}" --set run.dir="$WORK/one" --set training.steps=8 --set checkpoint.every=1
[ $RC -eq 0 ] || { cat "$WORK/out"; fail "one NaN on rank 1: exit $RC"; }
grep -q "step 4: loss nan, gradient norm nan: not finite; the step is skipped on every rank" "$WORK/out" ||
  { cat "$WORK/out"; fail "rank 0 did not report the skipped step"; }
grep -q "rank 1: step 4 skipped" "$WORK/out" || { cat "$WORK/out"; fail "rank 1 did not skip step 4"; }
# The two ranks' warnings can land on one line of the merged output, so count matches, not lines.
skips=$(grep -oE "step [0-9]+: loss nan[^;]*; the step is skipped|rank [0-9]+: step [0-9]+ skipped" "$WORK/out" |
        grep -oE "step [0-9]+" | sort | uniq -c | tr -s ' ')
[ "$skips" = " 2 step 4" ] || { cat "$WORK/out"; fail "steps skipped other than step 4 (once per rank): '$skips'"; }
python3 - "$WORK/one/metrics.jsonl" <<'PY' || fail "metrics of the run with one NaN"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, 9)), [r["step"] for r in rows]
for r in rows:
    s = r["step"]
    assert r["skipped_steps"] == (1 if s >= 4 else 0), r
    assert ("skipped" in r) == (s == 4), r
    assert (r["loss"] is None) == (s == 4) and (r["grad_norm"] is None) == (s == 4), r
print("ok: metrics: step 4 skipped (loss and grad_norm null), skipped_steps 0 before, 1 from step 4")
PY
for r in 0 1; do  # the skipped step changed nothing: parameters and AdamW moments, on both ranks
  f=rank_0000$r.safetensors
  cmp -s "$WORK/one/ckpt/step_0000003/$f" "$WORK/one/ckpt/step_0000004/$f" ||
    fail "rank $r: the checkpoint after the skipped step 4 differs from the one after step 3"
  cmp -s "$WORK/one/ckpt/step_0000004/$f" "$WORK/one/ckpt/step_0000005/$f" &&
    fail "rank $r: step 5 changed nothing (the run did not go on after the skip)"
done
python3 - "$WORK/one/ckpt/step_0000008/trainer_state.json" <<'PY' || fail "trainer state"
import json, sys
s = json.load(open(sys.argv[1]))
assert (s["step"], s["optimizer_step"], s["skipped_steps"]) == (8, 7, 1), s
PY
pass "one NaN on rank 1 at step 4: skipped on both ranks, replicas bit-identical every step, step 4's checkpoint == step 3's"

# ---- NaN on rank 0 from step 3 on: training.max_skipped = 3 stops at step 5 ----
LOOM_TEST_INJECT_NAN=0:3-100 run_mpi 2 "$WORK/out" -x LOOM_TEST_INJECT_NAN "$LOOM_BIN" train "$WORK/c.yaml" \
  "${COMMON[@]}" --set run.dir="$WORK/many" --set training.steps=20 --set checkpoint.every=0 \
  --set training.max_skipped=3
[ $RC -ne 0 ] || { cat "$WORK/out"; fail "max_skipped: mpirun exited 0"; }
grep -q "step 5: 3 consecutive steps had a non-finite loss or gradient norm (training.max_skipped = 3); stopping. Checkpoint saved in .*/many/ckpt/step_0000005: its parameters are those of step 2" "$WORK/out" ||
  { cat "$WORK/out"; fail "max_skipped: no clear error"; }
[ -f "$WORK/many/ckpt/step_0000005/COMPLETE" ] || fail "max_skipped: no checkpoint at step 5"
python3 - "$WORK/many" <<'PY' || fail "max_skipped: metrics or state"
import json, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5], rows
assert [r["skipped_steps"] for r in rows] == [0, 0, 1, 2, 3], rows
s = json.load(open(d + "/ckpt/step_0000005/trainer_state.json"))
assert (s["step"], s["optimizer_step"], s["skipped_steps"]) == (5, 2, 3), s
PY
pass "3 consecutive skips: exit $RC, checkpoint at step 5 (optimizer step 2), clear error"

# ---- the same command without the fault resumes from it ----
run_mpi 2 "$WORK/out" "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/many" \
  --set training.steps=8 --set checkpoint.every=0 --set training.max_skipped=3
[ $RC -eq 0 ] || { cat "$WORK/out"; fail "resume after max_skipped: exit $RC"; }
grep -q "resumed from .*step_0000005" "$WORK/out" || { cat "$WORK/out"; fail "did not resume from step 5"; }
python3 - "$WORK/many/metrics.jsonl" <<'PY' || fail "metrics after the resume"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, 9)), rows
assert all(r["skipped_steps"] == 3 and r["loss"] is not None for r in rows[5:]), rows[5:]
PY
pass "resumed from step 5 to 8 with skipped_steps carried over"
echo "all NaN-skip tests passed"
