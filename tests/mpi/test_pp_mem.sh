# Memory per rank with pipeline parallelism, measured (the engine's byte counts in
# metrics.jsonl) and printed beside the formula: parameters (each stage its layers; stage 0 the
# embedding, the last stage the final norm and the tied wte copy) and activation arenas (each
# arena B/m rows x T of its stage's layers, the head's buffers on the last stage only; gpipe
# holds m arenas, 1f1b min(m, p - s)); both must equal the formula; the largest rank's
# parameters drop as pp grows, its activations are below one process holding the whole batch
# in one arena, gpipe's drop as pp grows, and 1f1b never holds more than gpipe (its last
# stage's drop with pp; its stage 0 keeps p micro-batches of L/p layers whatever p). gpt2, d 64, 8 layers, seq 32, batch 8, m = 4. One thread per rank.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 200 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/unused"
COMMON=(--set training.steps=2 --set training.schedule_steps=2 --set training.batch_size=8
        --set checkpoint.every=0 --set eval.every=0 --set model.d_model=64 --set model.n_layer=8)
"$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/single" 2>"$WORK/log" \
  || { cat "$WORK/log"; fail "single"; }
for pp in 1 2 4; do
  for sched in gpipe 1f1b; do
    cmd=("$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set parallel.pp=$pp --set parallel.microbatches=4
         --set parallel.pp_schedule=$sched --set run.dir="$WORK/pp${pp}_$sched")
    if [ $pp -gt 1 ]; then $MPIRUN -np $pp "${cmd[@]}" 2>"$WORK/log"; else "${cmd[@]}" 2>"$WORK/log"; fi \
      || { cat "$WORK/log"; fail "pp=$pp $sched failed"; }
  done
done
python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
V, C, L, T, F, H, B, M = 256, 64, 8, 32, 256, 4, 8, 4      # make_config's gpt2, d 64, 8 layers
D = C // H
emb = V * C + T * C
layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C)
fin = 2 * C
def pad(n): return (n + 15) // 16 * 16
def arena_floats(rows, nl, head):
    N = rows * T
    per_layer = [N * C, N, N, N * 3 * H * D, rows * H * T, N * H * D, N * C, N * C, N, N,
                 N * F, N * F, N * C]                     # flash attention: S_ATT is the lse
    f = sum(pad(x) for x in per_layer) * nl + pad(N * C)  # + the stream entering the stage
    if head: f += pad(N * C) + pad(N) + pad(N) + pad(N * V) + pad(N)
    f += pad(N * C) + pad(N * C) + pad(N * 3 * H * D) + pad(N * H * D) + pad(N * F) + pad(N * F)
    return f
def last(run): return [json.loads(l) for l in open(f"{w}/{run}/metrics.jsonl")][-1]
ok = True
single = last("single")
want = (4 * (emb + L * layer + fin), 4 * arena_floats(B, L, 1))
got = (single["param_bytes"], single["act_bytes"])
print(f"one process, batch {B} in one arena: params {got[0]} (formula {want[0]}), "
      f"activations {got[1]} (formula {want[1]})")
ok &= got == want
worst = {}
for pp in (1, 2, 4):
    for sched in ("gpipe", "1f1b"):
        r = last(f"pp{pp}_{sched}")
        print(f"pp={pp} {sched}: rank  stage  params (formula)      arenas  activations (formula)")
        for k, s in enumerate(int(x) for x in r["pp_stage"]):
            nl = L // pp
            p = nl * layer + (emb if s == 0 else 0) + (fin + V * C if s == pp - 1 else 0)
            if pp == 1: p -= V * C                          # one stage: wte is not a copy
            arenas = M if sched == "gpipe" else min(M, pp - s)
            a = arenas * (4 * arena_floats(B // M, nl, s == pp - 1) + 2 * (B // M) * T * 4)
            gp, ga, gn = int(r["pp_param_bytes"][k]), int(r["pp_act_bytes"][k]), int(r["pp_peak_arenas"][k])
            mark = "" if (gp, ga, gn) == (4 * p, a, arenas) else "   MISMATCH"
            ok &= mark == ""
            print(f"{'':>16}{k:>4} {s:>6} {gp:>8} ({4 * p:>8}) {gn:>6}/{arenas} {ga:>10} ({a:>10}){mark}")
        worst[(pp, sched)] = (max(r["pp_param_bytes"]), max(r["pp_act_bytes"]))
for sched in ("gpipe", "1f1b"):
    seq = [worst[(pp, sched)] for pp in (1, 2, 4)]
    print(f"{sched}: largest rank's parameters {[int(x[0]) for x in seq]}, activations "
          f"{[int(x[1]) for x in seq]} at pp 1, 2, 4 (one process, whole batch: {single['act_bytes']})")
    if not (seq[0][0] > seq[1][0] > seq[2][0]): print("  parameters per rank do not drop"); ok = False
    if not all(single["act_bytes"] > x[1] for x in seq[1:]): print("  activations per rank do not drop"); ok = False
    if sched == "gpipe" and not seq[0][1] > seq[1][1] > seq[2][1]: print("  gpipe's arenas do not drop"); ok = False
# 1f1b bounds the micro-batches in flight to p - s: stage 0 keeps p of them, each with L/p
# layers (about one micro-batch through every layer, whatever p), the later stages fewer; it
# never holds more than gpipe, and its last stage (one arena of L/p layers) drops with p
for pp in (2, 4):
    g, f = last(f"pp{pp}_gpipe"), last(f"pp{pp}_1f1b")
    if any(b > a for a, b in zip(g["pp_act_bytes"], f["pp_act_bytes"])):
        print(f"  pp={pp}: 1f1b holds more than gpipe on some rank"); ok = False
lasts = [last(f"pp{pp}_1f1b")["pp_act_bytes"][-1] for pp in (1, 2, 4)]
print(f"1f1b: the last stage's activations {[int(x) for x in lasts]} at pp 1, 2, 4")
if not lasts[0] > lasts[1] > lasts[2]: print("  1f1b's last stage does not drop"); ok = False
sys.exit(0 if ok else 1)
PY
pass "parameter and activation bytes per rank equal the formula and drop with pp"

# the trainer's memory check (training.memory_limit) estimates each rank's own stage: refused
# with a tiny limit, every rank's message shows the bytes measured above for its stage
for sched in gpipe 1f1b; do
  rc=0
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set parallel.pp=2 \
    --set parallel.microbatches=4 --set parallel.pp_schedule=$sched --set training.memory_limit=1000 \
    --set run.dir="$WORK/refused_$sched" >"$WORK/out" 2>&1 || rc=$?
  [ $rc -ne 0 ] || { cat "$WORK/out"; fail "memory_limit=1000 accepted"; }
  python3 - "$WORK" "$sched" <<'PY' || { cat "$WORK/out"; fail "pp=2 $sched: the memory estimate is not the stage's"; }
import json, re, sys
w, sched = sys.argv[1], sys.argv[2]
def human(b):
    units = ["B", "KiB", "MiB", "GiB"]
    u = 0
    while b >= 1024 and u < 3: b /= 1024; u += 1
    return f"{b:.1f} {units[u]}" if u else f"{b:.0f} B"
r = [json.loads(l) for l in open(f"{w}/pp2_{sched}/metrics.jsonl")][-1]
out = open(f"{w}/out").read()
ok = True
for k in range(2):
    m = re.search(rf"loom: rank {k}: error: .*Per rank: parameters ([0-9.]+ \w+), .*activations and "
                  rf"batch ([0-9.]+ \w+) \((\d+) micro-batch(?:es)? of (\d+) x 32\)", out)
    if not m: print(f"rank {k}: no estimate in the message"); ok = False; continue
    arenas = int(r["pp_peak_arenas"][k])
    want = (human(r["pp_param_bytes"][k]), human(r["pp_act_bytes"][k] + 2 * 8 * 32 * 4), arenas, 2)
    got = (m.group(1), m.group(2), int(m.group(3)), int(m.group(4)))
    print(f"rank {k} ({sched}): estimate parameters {got[0]}, activations and batch {got[1]} "
          f"({got[2]} micro-batches of {got[3]} rows); measured {want[0]}, {want[1]} ({want[2]})")
    ok &= got == want
sys.exit(0 if ok else 1)
PY
done
pass "the memory check estimates each stage's parameters and in-flight activations"
