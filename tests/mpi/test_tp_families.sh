# Tensor parallelism over the architecture features (docs/architectures.md): each family's
# example config (shrunk: d_model 64, 2 layers) trains 12 steps with parallel.tp = 2 (and the
# MoE one with parallel.ep = 2) like one process, losses within 1e-5 relative: q/k/v biases
# split by heads (qwen2), per-head q/k norms whose weights' gradients are summed over the tp
# group (qwen3), a tied head over the vocab-parallel embedding with llama3 RoPE (llama3),
# head_dim != d_model / n_head (qwen3), fused-in-HF phi3, Mixtral's renormalized top-k over
# ep = 2, Qwen2-MoE's gated shared expert of its own width over ep = 2 (replicated: its
# gradients summed over the data-parallel group only) and tp = 2; context parallelism
# (cp = 2, Ulysses and ring) with q/k norms and head_dim 24 != d_model / n_head (qwen3: the cp
# engine once took d_model / n_head for the head width); and OLMo 2's post-norms and
# whole-projection q/k norms over tp = 2 (their row sums of squares and the backward's added
# over the tp group at QKNORM_SUM, the weights split with the heads; without that reduction
# olmo2 is off by 1.7e-2), also with sequence parallelism (sp: the post-norms on the row
# shard, their weights' gradients summed over the tp group) and over two pipeline stages
# (pp = 2); Gemma 2 (sandwich norms, GeGLU, embedding scale, soft-caps, an alternating window)
# over tp = 2 and Gemma 3 (with per-head q/k norms and the local RoPE base) over tp = 2 with sp;
# Mistral's sliding window (24 of the 32 positions) over tp = 2 and Qwen3-MoE over ep = 2;
# OLMo 2 (post-norms, whole q/k norms) over Ulysses cp = 2 and Gemma 2 over ring cp = 2; and
# qwen3, olmo2, gemma2 over tp = 2 and gemma3 over tp = 2 with sp in training.precision bf16
# (within 3e-3 of one bf16 process; gemma3's sandwich norms, q/k norms and embedding scale on
# the row shard).
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for case in qwen2:tp qwen3:tp llama3:tp phi3:tp mixtral:ep qwen2moe:ep qwen2moe:tp qwen3:cp qwen3:ring \
            olmo2:tp olmo2:sp olmo2:pp gemma2:tp gemma3:sp mistral:tp qwen3moe:ep olmo2:cp gemma2:ring \
            qwen3:tp:bf16 olmo2:tp:bf16 gemma2:tp:bf16 gemma3:sp:bf16; do
  IFS=: read -r name par prec <<<"$case"
  prec=${prec:-fp32} tol=1e-5
  # bf16 (training.precision): each rank's GEMMs split K, so a bf16 activation can round the
  # other way (tests/mpi/test_tp.sh's bf16 tolerance)
  [ $prec = bf16 ] && tol=3e-3
  par_args=(--set parallel.$par=2)
  [ $par = ring ] && par_args=(--set parallel.cp=2 --set parallel.cp_kind=ring)
  [ $par = sp ] && par_args=(--set parallel.tp=2 --set parallel.sp=true)
  set_args=(--set data.train="$WORK/data/train" --set data.val="$WORK/data/val"
            --set model.d_model=64 --set model.n_layer=2 --set model.d_ff=96
            --set training.steps=12 --set training.schedule_steps=12 --set training.seq_len=32
            --set training.batch_size=2 --set training.lr=3e-3 --set training.warmup=1
            --set eval.every=0 --set checkpoint.every=12 --set training.precision=$prec)
  [ $name = qwen3 ] && set_args+=(--set model.arch.head_dim=24)
  # Gemma: a window inside the 32 positions, one sliding and one full layer of the two
  case $name in gemma*) set_args+=(--set model.arch.sliding_window=8 --set model.arch.window_period=2) ;; esac
  "$LOOM_BIN" train "$LOOM_SRC/configs/$name-tiny.yaml" "${set_args[@]}" \
    --set run.dir="$WORK/${name}_${par}_${prec}_1" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$name: one process"; }
  run_mpi 2 "$WORK/log2" "$LOOM_BIN" train "$LOOM_SRC/configs/$name-tiny.yaml" "${set_args[@]}" \
    --set run.dir="$WORK/${name}_${par}_${prec}_2" "${par_args[@]}"
  [ "$RC" = 0 ] || { cat "$WORK/log2"; fail "$name: $par = 2"; }
  compare_losses "$WORK/${name}_${par}_${prec}_1" "$WORK/${name}_${par}_${prec}_2" $tol || fail "$name: $par = 2 ($prec) differs from one process"
  pass "$name: $par = 2 ($prec) trains like one process"
  if [ $prec = bf16 ]; then # the bf16 path ran: its losses are not the fp32 run's
    if compare_losses "$WORK/${name}_${par}_fp32_1" "$WORK/${name}_${par}_bf16_1" 1e-6 >/dev/null; then
      fail "$name: the bf16 run's losses equal the fp32 run's"
    fi
  fi
  if [ $case = qwen3:tp ]; then # resharding: the tp = 2 checkpoint loads whole on one process
    for r in 1 2; do
      "$LOOM_BIN" eval "$WORK/${name}_${par}_${prec}_$r" --data "$WORK/data/val" --batches 0 --format json \
        >"$WORK/eval_$r.json" 2>"$WORK/log" || { cat "$WORK/log"; fail "$name: loom eval of run $r"; }
    done
    python3 - "$WORK/eval_1.json" "$WORK/eval_2.json" <<'PY' || fail "$name: the tp = 2 checkpoint evaluates differently"
import json, sys
a, b = (json.load(open(p))["loss"] for p in sys.argv[1:])
assert abs(a - b) <= 1e-5 * abs(a), (a, b)
PY
    pass "$name: its tp = 2 checkpoint reshards onto one process (eval loss equal)"
  fi
done
