# Activation memory per rank with tensor (and sequence) parallelism, measured (every rank's
# arena bytes, tp_act_bytes in metrics.jsonl; act_bytes at tp = 1) and printed beside the
# formula of docs/parallelism.md ("Activation memory per rank"): tp = 1, 2, 4, sp off and on,
# gpt2 (LayerNorm, flash attention) and llama (RMSNorm, grouped-query attention 8 / 4 heads,
# SwiGLU, sdpa attention). The vocabulary (259) does not divide by tp, so the ranks' vocabulary
# rows, and their arenas, differ. Every rank must equal the formula exactly, and every rank's
# bytes drop as tp grows (sp off and on). One step, one thread per rank.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 200 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.steps=1 --set training.schedule_steps=1 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=0 --set model.vocab_size=259
        --set model.d_model=64 --set model.n_head=8 --set model.d_ff=256)
for flavor in gpt2 llama; do
  FLAVOR=$flavor make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/unused"
  ARGS=("${COMMON[@]}")
  [ $flavor = llama ] && ARGS+=(--set model.n_kv_head=4 --set model.attention=sdpa) \
                      || ARGS+=(--set model.n_kv_head=8 --set model.attention=flash)
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set run.dir="$WORK/$flavor/tp1" \
    2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor single"; }
  for tp in 2 4; do
    for sp in false true; do
      $MPIRUN -np $tp "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set parallel.tp=$tp \
        --set parallel.sp=$sp --set run.dir="$WORK/$flavor/tp${tp}_sp$sp" 2>"$WORK/log" \
        || { cat "$WORK/log"; fail "$flavor tp=$tp sp=$sp"; }
    done
  done
done

python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
B, T, C, H, F, V, L = 4, 32, 64, 8, 256, 259, 2
D = C // H
def pad(n): return (n + 15) // 16 * 16
def formula(flavor, tp, sp, r):
    """floats of tp rank r's training arena (docs/parallelism.md)"""
    gpt2 = flavor == "gpt2"
    KVH = 8 if gpt2 else 4
    h, kv, f = H // tp, KVH // tp, F // tp
    vl = V // tp + (1 if r < V % tp else 0)             # the first V % tp ranks: one row more
    ffi = f if gpt2 else 2 * f                          # gelu's input; SwiGLU's gate|up
    N = B * T
    Ns = N // tp if sp else N                           # the norm / residual regions' rows
    mean = Ns if gpt2 else 0                            # LayerNorm keeps a mean, RMSNorm not
    att = B * h * T if gpt2 else B * h * T * T          # flash: the lse; sdpa: probabilities
    layer = [Ns * C, mean, Ns, N * (h + 2 * kv) * D, att, N * h * D,     # ln1, attention
             Ns * C, Ns * C, mean, Ns, N * ffi, N * f, Ns * C]          # res2, ln2, ffn, res3
    once = [Ns * C, Ns * C, mean, Ns,                   # embedding output, final norm
            N * vl, N]                                  # the head's logits columns, losses
    if tp > 1: once += [N, 2 * N]                       # vocab-parallel loss row statistics
    if sp: once += [N * C] * 5                          # whole-row scratch (gather, partial,
                                                        # final norm, two gradients)
    once += [Ns * C, Ns * C,                            # backward: stream's and norm's grads
             N * (h + 2 * kv) * D, N * h * D, N * ffi, N * f, 0 if gpt2 else att]
    return L * sum(pad(x) for x in layer) + sum(pad(x) for x in once)
def first(run): return json.loads(open(f"{w}/{run}/metrics.jsonl").readline())
ok = True
for flavor in ("gpt2", "llama"):
    per = {}
    one = first(f"{flavor}/tp1")["act_bytes"]
    per[(1, False)] = [one]
    want = 4 * formula(flavor, 1, False, 0)
    print(f"{flavor} tp=1: activation arena {one} bytes (formula {want})"
          + ("" if one == want else "   MISMATCH"))
    ok &= one == want
    for tp in (2, 4):
        for sp in (False, True):
            r = first(f"{flavor}/tp{tp}_sp{str(sp).lower()}")
            got = [int(x) for x in r["tp_act_bytes"]]
            want = [4 * formula(flavor, tp, sp, k) for k in range(tp)]
            mark = "" if got == want else "   MISMATCH"
            ok &= mark == ""
            print(f"{flavor} tp={tp} sp={'on ' if sp else 'off'}: per rank {got} (formula {want}), "
                  f"{max(got) / one:.3f} of tp=1{mark}")
            per[(tp, sp)] = got
    for sp in (False, True):
        seq = [per[(1, False)] * 4] + [per[(tp, sp)] * (4 // tp) for tp in (2, 4)]
        # every rank at tp = 4 below every rank at tp = 2, below tp = 1
        if not (min(seq[0]) > max(seq[1]) and min(seq[1]) > max(seq[2])):
            print(f"{flavor} sp={sp}: activations per rank do not drop with tp"); ok = False
    for tp in (2, 4):
        print(f"{flavor} tp={tp}: with sp {max(per[(tp, True)])} bytes, without "
              f"{max(per[(tp, False)])} ({max(per[(tp, True)]) / max(per[(tp, False)]):.3f})")
sys.exit(0 if ok else 1)
PY
pass "activation bytes per rank equal the formula at tp 1, 2, 4, sp off and on, and drop with tp"
