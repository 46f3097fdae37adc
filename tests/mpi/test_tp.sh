# Tensor parallelism through `mpirun ... loom train`: TP = 2 and 4, sequence parallelism
# (parallel.sp) off and on, follow the single-process loss curve for 20 steps within 1e-5
# relative, GPT-2 and Llama with grouped-query attention
# (8 query heads, 4 kv heads: at tp = 4 each rank holds 2 query heads and 1 kv head), and
# DP 2 x TP 2 with ZeRO 1 and 3, and SP with model.recompute full and selective (the embedding
# and head vocab-parallel: GPT-2's tied wte split by rows). Also: the step's tp communication time in metrics.jsonl, parameter bytes
# per rank against the formula, and checkpoints saved at tp = 2 resumed at tp = 1 and back;
# training.precision bf16 at tp = 2, with sequence parallelism too (and dp 2 x tp 2 with sp),
# against one bf16 process.
# One thread per rank, --oversubscribe.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 200 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.steps=20 --set training.schedule_steps=20 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=10 --set training.grad_clip=0.5)

for flavor in gpt2 llama; do
  FLAVOR=$flavor make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/$flavor/single"
  ARGS=("${COMMON[@]}" --set model.d_model=64 --set model.n_head=8)
  [ $flavor = llama ] && ARGS+=(--set model.n_kv_head=4) || ARGS+=(--set model.n_kv_head=8)
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor single"; }
  runs=("2 tp=2" "4 tp=4" "4 tp=2,zero=1" "4 tp=2,zero=3"
        "2 tp=2,sp=true" "4 tp=4,sp=true" "4 tp=2,zero=1,sp=true" "4 tp=2,zero=3,sp=true"
        "2 tp=2,sp=true,recompute=full" "2 tp=2,sp=true,recompute=selective")
  for spec in "${runs[@]}"; do
    np=${spec%% *}; kv=${spec#* }
    name=$(echo "$kv" | tr ',=' '_-')
    set_args=()
    for p in ${kv//,/ }; do
      case $p in tp=*|zero=*|sp=*) set_args+=(--set parallel.$p);; recompute=*) set_args+=(--set model.$p);; esac
    done
    run=$WORK/$flavor/$name
    $MPIRUN -np "$np" "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" "${set_args[@]}" \
      --set run.dir="$run" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor $np ranks $kv failed"; }
    grep -q "tp=$(echo "$kv" | sed 's/.*tp=\([0-9]\).*/\1/')" "$WORK/log" || { cat "$WORK/log"; fail "$flavor $kv: layout not in the log"; }
    compare_losses "$WORK/$flavor/single" "$run" 1e-5 || fail "$flavor $np ranks $kv: loss differs from one process"
    # the clipping norm is global: each replicated tensor counted once over the tp ranks
    compare_losses "$WORK/$flavor/single" "$run" 1e-4 1 grad_norm || fail "$flavor $np ranks $kv: gradient norm differs"
    pass "$flavor, $np ranks, $kv: 20 steps equal the single process"
  done

  # the step's time in tp collectives is in metrics.jsonl (not at tp = 1)
  python3 - "$WORK/$flavor/single" "$WORK/$flavor/tp-2" <<'PY' || fail "$flavor: tp_comm_s"
import json, sys
one = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
two = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
assert all("tp_comm_s" not in r for r in one), "tp_comm_s at tp = 1"
v = [r["tp_comm_s"] for r in two]
assert len(v) == 20 and all(x > 0 and x < r["step_ms"] / 1e3 for x, r in zip(v, two)), v
print(f"tp_comm_s per step at tp=2: median {sorted(v)[10] * 1e3:.2f} ms")
PY

  # parameters per rank: the engine's param_bytes (zero 0, dp 1) against the formula
  # whole - (elements split over tp) * (1 - 1/tp), with the whole measured at tp = 1
  python3 - "$WORK/$flavor" $flavor <<'PY' || fail "$flavor: parameter bytes per rank do not drop with tp"
import json, sys
d, flavor = sys.argv[1], sys.argv[2]
V, C, L, H, F = 256, 64, 2, 8, 256
KVH = 4 if flavor == "llama" else 8
D = C // H
if flavor == "gpt2":   # q,k,v (+ biases), attn_proj, fc (+ bias), fc_proj; wte (tied head)
    layer = (H + 2 * KVH) * D * (C + 1) + C * H * D + F * (C + 1) + C * F
else:                  # q,k,v, attn_proj, gate, up, fc_proj; wte and lm_head
    layer = (H + 2 * KVH) * D * C + C * H * D + 2 * F * C + C * F
split = L * layer + V * C * (1 if flavor == "gpt2" else 2)
row = lambda run: json.loads(open(f"{d}/{run}/metrics.jsonl").readline())["param_bytes"]
whole = row("single")
for tp in (2, 4):
    got = row(f"tp-{tp}")
    want = whole - 4 * split * (tp - 1) // tp
    print(f"{flavor} tp={tp}: param bytes per rank {got}, formula {want} (tp=1: {whole}, "
          f"{got / whole:.3f} of it)")
    assert got == want and got < whole
PY
  pass "$flavor: parameter bytes per rank drop with tp as the formula says"

  # sequence parallelism keeps the norm / residual regions' activations for 1/tp of the rows:
  # the rank's memory (parameters, gradients, moments, activation arena) must drop
  python3 - "$WORK/$flavor" <<'PY' || fail "$flavor: sequence parallelism does not save activation memory"
import json, sys
d = sys.argv[1]
mem = lambda run: json.loads(open(f"{d}/{run}/metrics.jsonl").readline())["mem_bytes"]
for tp in (2, 4):
    off, on = mem(f"tp-{tp}"), mem(f"tp-{tp}_sp-true")
    print(f"tp={tp}: memory per rank {off} bytes, with sp {on} ({on / off:.3f})")
    assert on < off
PY

  # checkpoints reshard across tp: saved at tp = 2 (step 10), resumed at tp = 1; saved at
  # tp = 1, resumed at tp = 2: steps 11..20 continue the uninterrupted runs
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set parallel.tp=2 \
    --set training.steps=10 --set checkpoint.every=10 --set run.dir="$WORK/$flavor/rs_a" \
    2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor: save at tp=2"; }
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set run.dir="$WORK/$flavor/rs_a" \
    2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor: resume at tp=1"; }
  grep -q "resumed from" "$WORK/log" || fail "$flavor: tp=1 did not resume"
  compare_losses "$WORK/$flavor/tp-2" "$WORK/$flavor/rs_a" 1e-5 11 || fail "$flavor: tp=2 -> tp=1 diverged"
  pass "$flavor: saved at tp=2, resumed at tp=1: steps 11..20 continue the tp=2 run"
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set training.steps=10 \
    --set checkpoint.every=10 --set run.dir="$WORK/$flavor/rs_b" 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "$flavor: save at tp=1"; }
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set parallel.tp=2 \
    --set run.dir="$WORK/$flavor/rs_b" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor: resume at tp=2"; }
  grep -q "resumed from" "$WORK/log" || fail "$flavor: tp=2 did not resume"
  compare_losses "$WORK/$flavor/single" "$WORK/$flavor/rs_b" 1e-5 11 || fail "$flavor: tp=1 -> tp=2 diverged"
  pass "$flavor: saved at tp=1, resumed at tp=2: steps 11..20 continue the single process"

  # training.precision bf16 at tp = 2 follows the single bf16 process. The row-parallel linears'
  # partial sums (and the vocab-parallel embedding's) are reduced in fp32 and rounded once, but
  # each rank's GEMMs sum a K split the single process sums whole: a bf16 activation can round
  # the other way, so the curves agree to bf16's precision (3e-3; observed 9.8e-4 gpt2, 1.6e-4
  # llama), not fp32's.
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set training.precision=bf16 \
    --set run.dir="$WORK/$flavor/bf16_single" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor bf16 single"; }
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set training.precision=bf16 \
    --set parallel.tp=2 --set run.dir="$WORK/$flavor/bf16_tp2" 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "$flavor bf16 tp=2"; }
  compare_losses "$WORK/$flavor/bf16_single" "$WORK/$flavor/bf16_tp2" 3e-3 \
    || fail "$flavor bf16 tp=2: loss differs from the single bf16 process"
  compare_losses "$WORK/$flavor/single" "$WORK/$flavor/bf16_single" 0 >/dev/null \
    && fail "$flavor: the bf16 losses are fp32's"
  pass "$flavor bf16, 2 ranks, tp=2: 20 steps follow the single bf16 process"

  # bf16 with sequence parallelism: the normed rows all-gathered as bf16, the row-parallel
  # partial sums reduce-scattered in fp32 into the shard, then rounded. At tp = 2 every sum
  # of the forward has the same two operands as tp = 2 without sp, so the first step's loss is
  # bitwise tp = 2's; the norms' weight gradients are then summed per shard and reduced over
  # the tp group (without sp: over all rows on each rank), so later steps may differ by bf16
  # rounding of that (1e-4; observed 6.6e-6 gpt2, 0 llama). Both within 3e-3 of one bf16
  # process, and with dp 2 x tp 2 (ZeRO 1) too; sp's shard keeps the arena smaller.
  for spec in "2 bf16_tp2_sp" "4 bf16_dp2_tp2_sp --set parallel.zero=1"; do
    read -r np name extra <<<"$spec"
    # shellcheck disable=SC2086
    $MPIRUN -np "$np" "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" \
      --set training.precision=bf16 --set parallel.tp=2 --set parallel.sp=true $extra \
      --set run.dir="$WORK/$flavor/$name" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor $name"; }
    compare_losses "$WORK/$flavor/bf16_single" "$WORK/$flavor/$name" 3e-3 \
      || fail "$flavor $name: loss differs from the single bf16 process"
  done
  compare_losses "$WORK/$flavor/bf16_tp2" "$WORK/$flavor/bf16_tp2_sp" 1e-4 \
    || fail "$flavor bf16 tp=2 with sp: loss differs from tp=2 without sp"
  python3 - "$WORK/$flavor" <<'PY' || fail "$flavor bf16 sp: first step or memory"
import json, sys
row = lambda run: json.loads(open(f"{sys.argv[1]}/{run}/metrics.jsonl").readline())
off, on = row("bf16_tp2"), row("bf16_tp2_sp")
assert on["loss"] == off["loss"], (on["loss"], off["loss"])
print(f"bf16 tp=2 memory per rank {off['mem_bytes']} bytes, with sp {on['mem_bytes']}")
assert on["mem_bytes"] < off["mem_bytes"]
PY
  pass "$flavor bf16 tp=2 with sp (and dp=2 x tp=2 with sp): follows the single bf16 process, step 1 bitwise tp=2's"
done
# sequence parallelism: the layouts it does not support are clear errors
expect_fail "sp without tp" "parallel.sp.*parallel.tp > 1" "$LOOM_BIN" train "$WORK/gpt2.yaml" \
  --set parallel.sp=true --set run.dir="$WORK/sp_err1"
expect_fail "sp with pp" "sequence parallelism.*one pipeline stage" $MPIRUN -np 4 "$LOOM_BIN" \
  train "$WORK/gpt2.yaml" --set parallel.sp=true --set parallel.tp=2 --set parallel.pp=2 \
  --set run.dir="$WORK/sp_err2"
echo "all tensor-parallel training tests passed"
