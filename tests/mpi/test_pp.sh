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

# training.precision bf16: one process with parallel.microbatches = 2 (the pipeline's
# micro-batches on one stage) and pp = 2 (gpipe, 1f1b; the stream travels between stages in
# bf16, its gradient in fp32) follow the single bf16 process within 2e-3 relative over 20 steps,
# half of bf16's relative precision 2^-8 (the gradients are summed over two micro-batches
# instead of in one GEMM, so a master can land an ulp away and its bf16 copy round the other
# way; measured: llama 9.9e-5, gpt2 1.6e-4 at avx512; llama 2.0e-4, gpt2 8.2e-4 at x86-64);
# pp = 2 equals microbatches = 2 bit for bit
# for Llama (the same sums in the same order; GPT-2's tied embedding sums its two gradients
# across the stages, in another order: 2e-3 from one process). GPT-2 at pp = 2 keeps its tied
# copies bit-identical (check_replicas). Gradient clipping is off here: with it these tiny runs
# spike (gradient norm 7.5 at step 5) and bf16's one-ulp differences grow to 5e-3 by step 20.
BF=(--set training.precision=bf16 --set training.grad_clip=0)
for flavor in llama gpt2; do
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" "${BF[@]}" --set run.dir="$WORK/$flavor/bf16" \
    2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor bf16 single"; }
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" "${BF[@]}" --set run.dir="$WORK/$flavor/bf16_mb2" \
    --set parallel.microbatches=2 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor bf16 microbatches 2"; }
  compare_losses "$WORK/$flavor/bf16" "$WORK/$flavor/bf16_mb2" 2e-3 || fail "$flavor bf16 microbatches=2: loss differs from one batch"
  scheds=gpipe; [ $flavor = llama ] && scheds="gpipe 1f1b"
  for sched in $scheds; do
    run=$WORK/$flavor/bf16_pp2_$sched
    $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" "${BF[@]}" --set run.dir="$run" \
      --set parallel.pp=2 --set parallel.pp_schedule=$sched --set parallel.check_replicas=true \
      2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor bf16 pp=2 $sched failed"; }
    if [ $flavor = llama ]; then
      compare_losses "$WORK/$flavor/bf16_mb2" "$run" 0 || fail "$flavor bf16 pp=2 $sched: not microbatches=2's losses"
      compare_losses "$WORK/$flavor/bf16_mb2" "$run" 0 1 grad_norm || fail "$flavor bf16 pp=2 $sched: not microbatches=2's gradient norms"
    else # the tied embedding's two gradients summed across the stages, not in one buffer
      compare_losses "$WORK/$flavor/bf16" "$run" 2e-3 || fail "$flavor bf16 pp=2 $sched: loss differs from one process"
    fi
  done
  compare_losses "$WORK/$flavor/single" "$WORK/$flavor/bf16" 0 >/dev/null && fail "$flavor bf16: the losses are fp32's"
  pass "$flavor bf16: microbatches=2 and pp=2 ($scheds) follow one bf16 process (2e-3)$([ $flavor = llama ] && echo ', pp=2 = microbatches=2 bitwise')"
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
