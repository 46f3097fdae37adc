#!/usr/bin/env bash
# bench/dp_wire.py: the bytes a data-parallel `loom train` sends per step, counted by Open MPI's
# pml monitoring (what bench_dp.sh reports against the bound). For 2 and 3 ranks and every ZeRO
# stage, on a tiny model: every rank sends something, the mean over ranks is at least the
# lower bound 2(N-1)/N x gradient bytes (no data-parallel step can send less) and within 2.5x
# of it; ZeRO 3 on a 4-layer model sends more than ZeRO 2 (it re-gathers layers in backward).
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/single"
export LOOM_BIN
"$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=1 --set data.val= --set checkpoint.every=0 \
  --set model.n_layer=4 2>/dev/null
params=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['param_bytes'] // 4)" \
  "$WORK/single/metrics.jsonl")
for np in 2 3; do
  for z in 0 1 2 3; do
    timeout 120 python3 "$LOOM_SRC/bench/dp_wire.py" "$WORK/c.yaml" --np $np --zero $z \
      --params "$params" --set model.n_layer=4 --set training.batch_size=6 >"$WORK/w_${np}_$z.json" \
      || fail "dp_wire np=$np zero=$z failed"
    python3 - "$WORK/w_${np}_$z.json" <<'PY' || fail "np=$np zero=$z: measured bytes out of range"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"np={r['np']} zero={r['zero']}: bytes/step per rank {r['bytes_per_step']}, mean / bound "
      f"{r['mean_over_bound']:.3f}, loom's accounting {r['loom_accounted']}")
assert len(r["bytes_per_step"]) == r["np"]
assert all(b > 0 for b in r["bytes_per_step"]), "a rank sent nothing"
assert r["bound"] == 2 * (r["np"] - 1) / r["np"] * r["grad_bytes"]
assert 1.0 <= r["mean_over_bound"] <= 2.5, r["mean_over_bound"]
PY
  done
  python3 - "$WORK/w_${np}_2.json" "$WORK/w_${np}_3.json" <<'PY' || fail "np=$np: zero 3 does not send more than zero 2"
import json, sys
z2, z3 = (json.load(open(p))["mean"] for p in sys.argv[1:])
assert z3 > z2 * 1.05, (z2, z3)
PY
  pass "np=$np: measured bytes per step >= the bound 2(N-1)/N G for every ZeRO stage"
done
echo "PASS"
