# Pipeline parallelism through `mpirun ... loom train`: PP = 2 and 4, both schedules (gpipe,
# 1f1b), GPT-2 (tied embeddings: stage 0's wte and the last stage's copy) and Llama with
# grouped-query attention, follow the single-process loss curve for 20 steps within 1e-5
# relative (gradient clipping active: the norm is global over the stages, the tied copy counted
# once; within 1e-4), the tied copies stay bit-identical (parallel.check_replicas), and each
# stage holds the activation arenas its schedule says (gpipe: m micro-batches, 1f1b:
# min(m, p - s)). Tiny model (d 64, 4 layers, seq 32), batch 8 cut into m = pp micro-batches
# (parallel.microbatches auto). One thread per rank, --oversubscribe.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 200 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.steps=20 --set training.schedule_steps=20 --set training.batch_size=8
        --set checkpoint.every=0 --set eval.every=10 --set training.grad_clip=0.5
        --set model.d_model=64 --set model.n_layer=4)

# arenas RUN P M SCHEDULE: the peak activation arenas per stage in RUN's metrics
arenas() {
  python3 - "$@" <<'PY'
import json, sys
run, P, M, sched = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(run + '/metrics.jsonl')]
got = [int(x) for x in rows[-1]['pp_peak_arenas']]
stage = [int(x) for x in rows[-1]['pp_stage']]
want = [M if sched == 'gpipe' else min(M, P - s) for s in stage]
print(f"peak activation arenas per rank {got} (stages {stage}), {sched} wants {want}")
b, r = rows[-1]['pp_bubble_s'], rows[-1]['pp_run_s']
print(f"bubble (s waited on receives) per rank at the last step: {[round(x, 4) for x in b]} "
      f"of {[round(x, 4) for x in r]} s in the pipeline")
sys.exit(0 if got == want and all(0 <= x <= y and y > 0 for x, y in zip(b, r)) else 1)
PY
}

for flavor in gpt2 llama; do
  KVH=4
  [ $flavor = llama ] && KVH=2
  FLAVOR=$flavor KVH=$KVH make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/$flavor/single"
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor single"; }
  for pp in 2 4; do
    for sched in gpipe 1f1b; do
      run=$WORK/$flavor/pp${pp}_$sched
      $MPIRUN -np $pp "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" --set run.dir="$run" \
        --set parallel.pp=$pp --set parallel.pp_schedule=$sched --set parallel.check_replicas=true \
        2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor pp=$pp $sched failed"; }
      grep -q "pp=$pp" "$WORK/log" || { cat "$WORK/log"; fail "$flavor pp=$pp: layout not in the log"; }
      compare_losses "$WORK/$flavor/single" "$run" 1e-5 || fail "$flavor pp=$pp $sched: loss differs from one process"
      compare_losses "$WORK/$flavor/single" "$run" 1e-4 1 grad_norm || fail "$flavor pp=$pp $sched: gradient norm differs"
      arenas "$run" $pp $pp $sched || fail "$flavor pp=$pp $sched: activation arenas"
      pass "$flavor, pp=$pp, $sched: 20 steps equal the single process"
    done
  done
done

# under ASan/UBSan with leak detection (the sanitized binary): pp 2 with evaluation and a
# checkpoint, then resumed at pp 4 with gpipe
ASAN_ARGS=(--set training.steps=3 --set training.schedule_steps=4 --set checkpoint.every=3
           --set eval.every=2 --set run.dir="$WORK/asan")
$MPIRUN -np 2 -x ASAN_OPTIONS -x LSAN_OPTIONS "$LOOM_ASAN_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" \
  "${ASAN_ARGS[@]}" --set parallel.pp=2 >"$WORK/asan.log" 2>&1 || { cat "$WORK/asan.log"; fail "asan pp 2"; }
$MPIRUN -np 4 -x ASAN_OPTIONS -x LSAN_OPTIONS "$LOOM_ASAN_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" \
  "${ASAN_ARGS[@]}" --set training.steps=4 --set parallel.pp=4 --set parallel.pp_schedule=gpipe \
  >>"$WORK/asan.log" 2>&1 || { cat "$WORK/asan.log"; fail "asan pp 4 resume"; }
grep -q "resumed from" "$WORK/asan.log" || { cat "$WORK/asan.log"; fail "asan: pp 4 did not resume"; }
! grep -qE "Sanitizer|runtime error" "$WORK/asan.log" || { cat "$WORK/asan.log"; fail "asan: a sanitizer report"; }
pass "pp 2 -> pp 4 under ASan/UBSan with leak detection: clean"
echo "all pipeline-parallel training tests passed"
