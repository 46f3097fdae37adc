# Mixture of experts through the CLI, one process (docs/moe.md): an MoE llama (8 experts,
# top-2, capacity 1.25, a shared expert on every second layer) trains (loss goes down, the
# routing metrics are in metrics.jsonl), resumes bit for bit, `loom generate` (KV-cache
# decoding through the MoE op) and `loom eval` read its checkpoint, a training.precision bf16 run
# resumes bit for bit, export to Hugging Face is refused with a message, and bad model.moe keys
# are refused naming the key.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
export FLAVOR=llama KVH=2
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
MOE=(--set model.moe.experts=8 --set model.moe.top_k=2 --set model.moe.capacity_factor=1.25
     --set model.moe.every=1 --set model.moe.shared_experts=1 --set training.steps=12
     --set checkpoint.every=6)
expect_ok "train an MoE model" "$LOOM_BIN" train "$WORK/c.yaml" "${MOE[@]}"
python3 - "$WORK/run/metrics.jsonl" <<'PY' || fail "MoE metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 12, len(rows)
for r in rows:
    for l in (0, 1):
        load = r[f"moe_load.{l}"]
        assert len(load) == 8 and sum(load) == 2 * 2 * 32, load   # batch 2 x seq 32, top-2
    assert 0 <= r["moe_dropped_frac"] < 1 and r["moe_aux_loss"] >= 1 - 1e-6 and r["moe_z_loss"] > 0, r
assert rows[-1]["loss"] < rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
assert any(r["moe_dropped_frac"] > 0 for r in rows), "capacity 1.25 never dropped"
print("loss", rows[0]["loss"], "->", rows[-1]["loss"], "dropped", rows[-1]["moe_dropped_frac"],
      "aux", rows[-1]["moe_aux_loss"])
PY
pass "metrics: moe_load.<layer> sums to tokens x top_k, dropped fraction, aux >= 1, loss went down"

# resume: 6 + 6 steps equal 12
make_config "$WORK" "$WORK/b.yaml" "$WORK/run_b"
"$LOOM_BIN" train "$WORK/b.yaml" "${MOE[@]}" --set training.steps=6 2>/dev/null || fail "first half"
"$LOOM_BIN" train "$WORK/b.yaml" "${MOE[@]}" 2>/dev/null || fail "second half"
losses "$WORK/run" > "$WORK/la"
losses "$WORK/run_b" > "$WORK/lb"
diff "$WORK/la" "$WORK/lb" || fail "resumed MoE run differs"
pass "resume: 6 + 6 steps equal 12, bit for bit"

# training.precision bf16 (docs/moe.md "Through the backend, and bf16"): 4 + 4 steps equal 8 bit
# for bit (the checkpoint holds the fp32 masters), and the run is not fp32's
BF=("${MOE[@]}" --set training.precision=bf16 --set training.steps=8 --set training.schedule_steps=8
    --set checkpoint.every=4)
make_config "$WORK" "$WORK/f.yaml" "$WORK/run_f"
"$LOOM_BIN" train "$WORK/f.yaml" "${BF[@]}" 2>/dev/null || fail "bf16 run"
make_config "$WORK" "$WORK/g.yaml" "$WORK/run_g"
"$LOOM_BIN" train "$WORK/g.yaml" "${BF[@]}" --set training.steps=4 2>/dev/null || fail "bf16 first half"
"$LOOM_BIN" train "$WORK/g.yaml" "${BF[@]}" 2>/dev/null || fail "bf16 second half"
# (step, loss, grad norm: the first half's last step also evaluates, as a run's end does)
losses "$WORK/run_f" | cut -d' ' -f1-3 > "$WORK/lf"
losses "$WORK/run_g" | cut -d' ' -f1-3 > "$WORK/lg"
[ "$(wc -l <"$WORK/lf")" = 8 ] || fail "bf16 run: $(wc -l <"$WORK/lf") steps, expected 8"
diff "$WORK/lf" "$WORK/lg" || fail "resumed bf16 MoE run differs"
# (the first step's loss: the same weights and batch as the fp32 run's, before any update)
[ "$(head -1 "$WORK/lf" | cut -d' ' -f2)" != "$(head -1 "$WORK/la" | cut -d' ' -f2)" ] ||
  fail "bf16's first loss equals fp32's: the bf16 path did not run"
pass "bf16: 4 + 4 steps equal 8, bit for bit"

expect_ok "generate from the MoE checkpoint" "$LOOM_ASAN_BIN" generate "$WORK/run" --prompt "the " --tokens 20 --seed 3
[[ "$(cat "$WORK/out.txt")" == "the "* ]] || fail "generate output: $(cat "$WORK/out.txt")"
g2=$("$LOOM_BIN" generate "$WORK/run" --prompt "the " --tokens 20 --seed 3)
[ "$g2" = "$(cat "$WORK/out.txt")" ] || fail "generate not deterministic"
expect_ok "eval the MoE checkpoint" "$LOOM_ASAN_BIN" eval "$WORK/run" --data "$WORK/data/val" --batches 2
grep -q "loss" "$WORK/out.txt" || fail "eval printed no loss"
expect_fail "export --hf of an MoE model" "mixture-of-experts" \
  "$LOOM_BIN" export --hf "$WORK/run" "$WORK/hf_out"

expect_fail "top_k above experts" "model.moe.top_k" \
  "$LOOM_BIN" train "$WORK/c.yaml" --set model.moe.experts=4 --set model.moe.top_k=5 --set run.dir="$WORK/bad1"
expect_fail "negative capacity factor" "model.moe.capacity_factor" \
  "$LOOM_BIN" train "$WORK/c.yaml" --set model.moe.experts=4 --set model.moe.capacity_factor=-1 --set run.dir="$WORK/bad2"
expect_fail "group_tokens not dividing a rank's tokens" "model.moe.group_tokens" \
  "$LOOM_BIN" train "$WORK/c.yaml" --set model.moe.experts=4 --set model.moe.group_tokens=48 --set run.dir="$WORK/bad3"
echo "all MoE CLI tests passed"
