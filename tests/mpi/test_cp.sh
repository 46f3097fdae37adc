# Context parallelism through `mpirun ... loom train`: parallel.cp = 2 and 4, cp_kind ulysses
# and ring, alone and with data parallelism (dp = 2, ZeRO 1 and 3), GPT-2 and Llama (grouped
# kv heads) flavors, with tensor parallelism (tp = 2 x cp = 2), with document masking
# (documents crossing chunks and ranks) and with a sliding window: 20-step loss trajectories
# equal the single-process run within 1e-5 relative (bf16 runs the single bf16 process's
# within 5e-4), and the replicas over dp x cp stay
# bit-identical. Bad layouts are clear errors;
# a rank killed during training ends the job within the collective timeout + 30 s; checkpoints
# saved at one cp layout resume at another.
# One thread per rank, --oversubscribe, a tiny model (T = 32: chunks of 4 positions at cp = 4).
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 300 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.steps=20 --set training.schedule_steps=20 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=10)

compare() { # compare REF RUN TOL: losses (and validation losses) of RUN within TOL of REF
  python3 - "$@" <<'PY'
import json, sys
ref, run, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
a = [json.loads(l) for l in open(ref + '/metrics.jsonl')]
b = [json.loads(l) for l in open(run + '/metrics.jsonl')]
def by(rows, key): return {r['step']: r[key] for r in rows if r.get(key) is not None}
worst = 0.0
for key in ('loss', 'val_loss'):
    x, y = by(a, key), by(b, key)
    if key == 'loss' and len(x) != 20: sys.exit(f"{ref}: {len(x)} loss steps, expected 20")
    missing = [s for s in x if s not in y]
    if missing: sys.exit(f"{run}: {key} of steps {missing} missing")
    worst = max([worst] + [abs(x[s] - y[s]) / abs(x[s]) for s in x])
print(f"max relative loss difference over 20 steps: {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}

for flavor in gpt2 llama; do
  kvh=4; [ $flavor = llama ] && kvh=2   # llama: grouped-query attention, 2 heads per kv head
  FLAVOR=$flavor KVH=$kvh make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/${flavor}_single"
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "$flavor single process"; }
  for kind in ulysses ring; do
    # (np, cp, zero): cp alone at 2 and 4; cp = 2 with dp = 2 (ZeRO 1, and ZeRO 3 for ring)
    for layout in "2 2 0" "4 4 1" "4 2 1" "4 2 3"; do
      set -- $layout; np=$1; cp=$2; z=$3
      [ $z = 3 ] && [ $kind = ulysses ] && continue
      ycfg=$WORK/$flavor.yaml
      if [ $kind = ulysses ] && [ $cp = 4 ] && [ $kvh = 2 ]; then
        # ulysses needs n_kv_head divisible by cp: the llama model with 4 kv heads, whose own
        # single-process run is the reference
        ycfg=$WORK/${flavor}_kv4.yaml
        if [ ! -f "$ycfg" ]; then
          FLAVOR=$flavor KVH=4 make_config "$WORK" "$ycfg" "$WORK/${flavor}_kv4_single"
          "$LOOM_BIN" train "$ycfg" "${COMMON[@]}" 2>"$WORK/log" \
            || { cat "$WORK/log"; fail "$flavor kv4 single process"; }
        fi
        ref=$WORK/${flavor}_kv4_single
      else
        ref=$WORK/${flavor}_single
      fi
      run=$WORK/${flavor}_${kind}_np${np}_cp${cp}_z$z
      check=true; [ $z = 3 ] && check=false
      $MPIRUN -np $np "$LOOM_BIN" train "$ycfg" "${COMMON[@]}" --set run.dir="$run" \
        --set parallel.cp=$cp --set parallel.cp_kind=$kind --set parallel.zero=$z \
        --set parallel.check_replicas=$check 2>"$WORK/log" \
        || { cat "$WORK/log"; fail "$flavor $kind np=$np cp=$cp zero=$z failed"; }
      compare "$ref" "$run" 1e-5 \
        || fail "$flavor $kind np=$np cp=$cp zero=$z: loss differs from one process"
      pass "$flavor $kind cp=$cp dp=$((np / cp)) zero=$z: 20 steps equal the single process"
    done
  done
done

# with tensor parallelism: tp = 2 x cp = 2 (the cp group's ranks are tp-strided); gpt2 both
# kinds (2 heads per tp rank: ulysses splits them over cp), llama ring (1 kv head per tp rank)
for spec in "gpt2 ulysses" "gpt2 ring" "llama ring"; do
  set -- $spec; flavor=$1; kind=$2
  run=$WORK/${flavor}_${kind}_tp2_cp2
  $MPIRUN -np 4 "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" --set run.dir="$run" \
    --set parallel.tp=2 --set parallel.cp=2 --set parallel.cp_kind=$kind --set parallel.zero=1 \
    --set parallel.check_replicas=true 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor $kind tp=2 cp=2 failed"; }
  compare "$WORK/${flavor}_single" "$run" 1e-5 || fail "$flavor $kind tp=2 cp=2: loss differs from one process"
  pass "$flavor $kind tp=2 cp=2 zero=1: 20 steps equal the single process"
done

# training.precision bf16: cp = 2, ulysses and ring (and ring with dp = 2, ZeRO 1), follow the
# single bf16 process within 5e-4 relative over 20 steps (observed <= 1.1e-4 at every level). The hook widens the layer's bf16
# q|k|v and output and runs the fp32 attention, as the one-process bf16 flash kernel does, so
# only the fp32 split of the attention differs (as fp32 cp's 1e-5), and a bf16 rounding of the
# output may then go the other way.
for flavor in gpt2 llama; do
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" --set run.dir="$WORK/${flavor}_bf16" \
    --set training.precision=bf16 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor bf16 single"; }
  compare "$WORK/${flavor}_single" "$WORK/${flavor}_bf16" 0 >/dev/null && fail "$flavor bf16: the losses are fp32's"
  for spec in "2 ulysses" "2 ring" "4 ring"; do
    set -- $spec; np=$1; kind=$2
    run=$WORK/${flavor}_bf16_${kind}_np$np
    $MPIRUN -np $np "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" --set run.dir="$run" \
      --set training.precision=bf16 --set parallel.cp=2 --set parallel.cp_kind=$kind \
      --set parallel.zero=1 --set parallel.check_replicas=true 2>"$WORK/log" \
      || { cat "$WORK/log"; fail "$flavor bf16 $kind np=$np cp=2 failed"; }
    compare "$WORK/${flavor}_bf16" "$run" 5e-4 || fail "$flavor bf16 $kind np=$np cp=2: loss differs from one bf16 process"
    pass "$flavor bf16 $kind cp=2 dp=$((np / 2)): 20 steps follow the single bf16 process"
  done
done

# a sliding window (model.arch.sliding_window = 6 on every layer of the llama model: windows
# crossing the chunks of 8 and 4 positions, whole chunk pairs outside it skipped): ring at
# cp = 4 and ulysses at cp = 2 equal one process with the window; the window changes the loss
"$LOOM_BIN" train "$WORK/llama.yaml" "${COMMON[@]}" --set run.dir="$WORK/llama_win_single" \
  --set model.arch.sliding_window=6 2>"$WORK/log" || { cat "$WORK/log"; fail "llama window single process"; }
compare "$WORK/llama_single" "$WORK/llama_win_single" 1e-5 \
  && fail "the sliding window did not change the llama losses"
for spec in "ring 4" "ulysses 2"; do
  set -- $spec; kind=$1; cp=$2
  run=$WORK/llama_win_${kind}_cp$cp
  $MPIRUN -np $cp "$LOOM_BIN" train "$WORK/llama.yaml" "${COMMON[@]}" --set run.dir="$run" \
    --set model.arch.sliding_window=6 --set parallel.cp=$cp --set parallel.cp_kind=$kind \
    2>"$WORK/log" || { cat "$WORK/log"; fail "llama window $kind cp=$cp failed"; }
  compare "$WORK/llama_win_single" "$run" 1e-5 || fail "llama window $kind cp=$cp: loss differs from one process"
  pass "llama sliding window 6, $kind cp=$cp: 20 steps equal the single process"
done

# checkpoints reshard across cp layouts: save at cp = 2 ring (ZeRO 1) at step 10, resume at one
# process and at cp = 4 ulysses (ZeRO 3): steps 11..20 continue the uninterrupted single run
SAVE=$WORK/cp_save
$MPIRUN -np 2 "$LOOM_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" --set run.dir="$SAVE" \
  --set parallel.cp=2 --set parallel.cp_kind=ring --set parallel.zero=1 --set training.steps=10 \
  --set checkpoint.every=10 2>"$WORK/log" || { cat "$WORK/log"; fail "cp=2 save failed"; }
[ -f "$SAVE/ckpt/step_0000010/rank_00001.safetensors" ] || fail "cp rank 1 wrote no checkpoint piece"
cp -r "$SAVE" "$WORK/cp_save4"
"$LOOM_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" --set run.dir="$SAVE" 2>"$WORK/log" \
  || { cat "$WORK/log"; fail "resume at one process failed"; }
grep -q "resumed from" "$WORK/log" || fail "one process did not resume"
$MPIRUN -np 4 "$LOOM_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" --set run.dir="$WORK/cp_save4" \
  --set parallel.cp=4 --set parallel.zero=3 2>"$WORK/log" || { cat "$WORK/log"; fail "resume at cp=4 failed"; }
grep -q "resumed from" "$WORK/log" || fail "cp=4 did not resume"
for r in "$SAVE" "$WORK/cp_save4"; do
  compare "$WORK/gpt2_single" "$r" 1e-5 || fail "$r: resumed run differs from one process"
done
pass "saved at cp=2 ring, resumed at one process and at cp=4 ulysses zero 3: 20 steps equal one process"

# with document masking (model.doc_mask): short documents (3-24 bytes) packed into windows of
# 32, so documents cross the chunk boundaries and ranks (at cp = 4 a chunk is 4 positions);
# ulysses and ring at cp 2 and 4 (with dp 2 at cp 2) equal one process with the mask, both
# flavors; the control without the mask differs
mkdir -p "$WORK/short/corpus"
python3 - "$WORK/short/corpus" <<'PY'
import random, sys, os
random.seed(11)
letters = "abcdefghij klmnop"
with open(os.path.join(sys.argv[1], "docs.txt"), "w") as fh:
    fh.write("\n%\n".join("".join(random.choice(letters) for _ in range(random.randint(3, 24)))
                          for _ in range(1500)))
PY
cat > "$WORK/short/recipe.yaml" <<YAML
name: short
sources:
  - name: docs
    kind: text
    path: $WORK/short/corpus
    split: "\n%\n"
tokenizer: byte
seq_len: 32
val_fraction: 0.1
output: $WORK/short/data
shard_tokens: 100000
YAML
"$LOOM_BIN" data build "$WORK/short/recipe.yaml" >/dev/null 2>&1 || fail "short-document data build"
for flavor in gpt2 llama; do
  kvh=4; [ $flavor = llama ] && kvh=2
  FLAVOR=$flavor KVH=$kvh make_config "$WORK/short" "$WORK/short/$flavor.yaml" "$WORK/short/${flavor}_single"
  "$LOOM_BIN" train "$WORK/short/$flavor.yaml" "${COMMON[@]}" --set model.doc_mask=true 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "$flavor doc_mask single process"; }
  "$LOOM_BIN" train "$WORK/short/$flavor.yaml" "${COMMON[@]}" --set run.dir="$WORK/short/${flavor}_nomask" \
    2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor single process without the mask"; }
  if compare "$WORK/short/${flavor}_single" "$WORK/short/${flavor}_nomask" 1e-3 >/dev/null; then
    fail "$flavor: the mask makes no difference on this data: the test cannot tell"
  fi
  for spec in "ulysses 2 2" "ring 4 4" "ring 4 2" "ulysses 4 2"; do
    set -- $spec; kind=$1; np=$2; cp=$3
    [ $kind = ulysses ] && [ $cp = 4 ] && [ $kvh = 2 ] && continue
    run=$WORK/short/${flavor}_${kind}_np${np}_cp$cp
    $MPIRUN -np $np "$LOOM_BIN" train "$WORK/short/$flavor.yaml" "${COMMON[@]}" --set run.dir="$run" \
      --set model.doc_mask=true --set parallel.cp=$cp --set parallel.cp_kind=$kind \
      --set parallel.zero=1 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor $kind cp=$cp doc_mask failed"; }
    compare "$WORK/short/${flavor}_single" "$run" 1e-5 \
      || fail "$flavor $kind np=$np cp=$cp doc_mask: loss differs from one process"
    pass "$flavor $kind cp=$cp dp=$((np / cp)) with doc_mask: 20 steps equal the single process"
  done
done

# with the other long-context knobs: activation checkpointing (the attention hook runs again
# in the recompute, on every cp rank alike) and the chunked loss, on the masked documents
for spec in "ring full" "ulysses selective"; do
  set -- $spec; kind=$1; rc=$2
  run=$WORK/short/llama_${kind}_$rc
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/short/llama.yaml" "${COMMON[@]}" --set run.dir="$run" \
    --set model.doc_mask=true --set parallel.cp=2 --set parallel.cp_kind=$kind \
    --set model.recompute=$rc --set model.loss_chunk=16 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "llama $kind cp=2 recompute=$rc failed"; }
  compare "$WORK/short/llama_single" "$run" 1e-5 || fail "llama $kind cp=2 recompute=$rc differs"
  pass "llama $kind cp=2 with doc_mask, recompute $rc, loss_chunk 16: 20 steps equal one process"
done

# bad layouts are clear errors naming the keys
expect_fail "ulysses with n_kv_head 2 at cp 4" "parallel.cp_kind = ulysses: parallel.cp = 4 must divide model.n_head \(4\) and model.n_kv_head \(2\)" \
  $MPIRUN -np 4 "$LOOM_BIN" train "$WORK/llama.yaml" --set parallel.cp=4 --set run.dir="$WORK/bad1"
expect_fail "seq_len not divisible by 2 cp" "training.seq_len = 36 must be divisible by 2 \* parallel.cp = 8" \
  $MPIRUN -np 4 "$LOOM_BIN" train "$WORK/gpt2.yaml" --set parallel.cp=4 --set parallel.cp_kind=ring \
  --set training.seq_len=36 --set model.max_seq_len=64 --set run.dir="$WORK/bad2"
expect_fail "unknown cp_kind" "parallel.cp_kind = 'zigzag'.*expected ulysses or ring" \
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/gpt2.yaml" --set parallel.cp=2 --set parallel.cp_kind=zigzag \
  --set run.dir="$WORK/bad3"
expect_fail "cp with sdpa" "model.attention = sdpa: parallel.cp = 2 needs model.attention: flash" \
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/gpt2.yaml" --set parallel.cp=2 --set model.attention=sdpa \
  --set run.dir="$WORK/bad4"

# a rank killed during ring training ends the job (the survivor is in the K/V exchange of the
# next step) within parallel.timeout_s + 30 s
t0=$(date +%s); rc=0
LOOM_TEST_FAIL="1:3:kill" $MPIRUN -np 2 -x LOOM_TEST_FAIL "$LOOM_BIN" train "$WORK/gpt2.yaml" \
  "${COMMON[@]}" --set parallel.cp=2 --set parallel.cp_kind=ring --set parallel.timeout_s=10 \
  --set run.dir="$WORK/killed" >"$WORK/out" 2>"$WORK/log" || rc=$?
dt=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] || fail "ring rank killed: mpirun returned 0"
[ $rc -ne 124 ] || fail "ring rank killed: the job hung (killed by timeout)"
[ $dt -le 40 ] || fail "ring rank killed: took $dt s (limit timeout 10 s + 30 s)"
pass "ring cp=2, rank 1 killed after step 3: mpirun exit $rc after ${dt}s"
echo "all context-parallel tests passed"
