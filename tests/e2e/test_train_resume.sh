# Bit-exact resume and the COMPLETE rule, through the CLI, for both flavors; with
# training.precision bf16 (llama) bit-exact resume too, and its checkpoint (the fp32 masters)
# resumed by an fp32 run and back.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"

for flavor in gpt2 llama; do
  export FLAVOR=$flavor KVH=$([ $flavor = llama ] && echo 2 || echo 4)
  # uninterrupted: 12 steps
  make_config "$WORK" "$WORK/a.yaml" "$WORK/run_a_$flavor"
  "$LOOM_BIN" train "$WORK/a.yaml" --set training.steps=12 --set checkpoint.every=0 2>"$WORK/log_a"
  # interrupted: 6 steps, then the same command with 12
  make_config "$WORK" "$WORK/b.yaml" "$WORK/run_b_$flavor"
  "$LOOM_BIN" train "$WORK/b.yaml" --set training.steps=6 --set checkpoint.every=3 2>"$WORK/log_b1"
  [ -f "$WORK/run_b_$flavor/ckpt/step_0000006/COMPLETE" ] || fail "$flavor: no complete checkpoint at step 6"
  "$LOOM_BIN" train "$WORK/b.yaml" --set training.steps=12 --set checkpoint.every=3 2>"$WORK/log_b2"
  grep -q "resumed from .*step_0000006" "$WORK/log_b2" || { cat "$WORK/log_b2"; fail "$flavor: did not resume from step 6"; }
  losses "$WORK/run_a_$flavor" > "$WORK/la"
  losses "$WORK/run_b_$flavor" > "$WORK/lb"
  [ "$(wc -l < "$WORK/la")" = 12 ] || fail "$flavor: expected 12 metrics lines"
  diff "$WORK/la" "$WORK/lb" || fail "$flavor: resumed losses differ from the uninterrupted run"
  pass "$flavor: 6 + 6 steps resumed == 12 uninterrupted steps, bit for bit (loss, grad_norm, val_loss)"
  first=$(head -1 "$WORK/la" | cut -d' ' -f2); last=$(tail -1 "$WORK/la" | cut -d' ' -f2)
  python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if b < a else 1)" "$first" "$last" \
    || fail "$flavor: loss did not go down ($first -> $last)"
  pass "$flavor: loss went down $first -> $last"
done

# training.precision bf16: 6 + 6 steps == 12 bit for bit; the checkpoint holds the fp32 masters,
# so an fp32 run resumes it (and a bf16 run resumes the fp32 one's)
export FLAVOR=llama KVH=2
P="--set training.precision=bf16"
make_config "$WORK" "$WORK/a.yaml" "$WORK/run_a_bf16"
"$LOOM_BIN" train "$WORK/a.yaml" $P --set training.steps=12 --set checkpoint.every=0 2>"$WORK/log_a"
make_config "$WORK" "$WORK/b.yaml" "$WORK/run_b_bf16"
"$LOOM_BIN" train "$WORK/b.yaml" $P --set training.steps=6 --set checkpoint.every=3 2>"$WORK/log_b1"
"$LOOM_BIN" train "$WORK/b.yaml" $P --set training.steps=12 --set checkpoint.every=3 2>"$WORK/log_b2"
grep -q "resumed from .*step_0000006" "$WORK/log_b2" || { cat "$WORK/log_b2"; fail "bf16: did not resume from step 6"; }
losses "$WORK/run_a_bf16" > "$WORK/la"
losses "$WORK/run_b_bf16" > "$WORK/lb"
[ "$(wc -l < "$WORK/la")" = 12 ] || fail "bf16: expected 12 metrics lines"
diff "$WORK/la" "$WORK/lb" || fail "bf16: resumed losses differ from the uninterrupted run"
losses "$WORK/run_a_llama" > "$WORK/lf"
cmp -s "$WORK/la" "$WORK/lf" && fail "bf16: the losses are the fp32 run's (bf16 did not run)"
pass "bf16: 6 + 6 steps resumed == 12 uninterrupted steps, bit for bit (and not the fp32 run's)"
# cross-precision: the bf16 run's step 6 continued in fp32 to step 9, and that in bf16 to 12
cp -r "$WORK/run_b_bf16" "$WORK/run_c"
rm -rf "$WORK/run_c/ckpt/step_0000009" "$WORK/run_c/ckpt/step_0000012"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run_c"
"$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=9 --set checkpoint.every=3 2>"$WORK/log_c1"
grep -q "resumed from .*step_0000006" "$WORK/log_c1" || { cat "$WORK/log_c1"; fail "fp32 did not resume the bf16 checkpoint"; }
"$LOOM_BIN" train "$WORK/c.yaml" $P --set training.steps=12 --set checkpoint.every=3 2>"$WORK/log_c2"
grep -q "resumed from .*step_0000009" "$WORK/log_c2" || { cat "$WORK/log_c2"; fail "bf16 did not resume the fp32 checkpoint"; }
losses "$WORK/run_c" > "$WORK/lc"
[ "$(wc -l < "$WORK/lc")" = 12 ] || fail "bf16 -> fp32 -> bf16: expected 12 metrics lines"
python3 - "$WORK/la" "$WORK/lc" <<'PY' || fail "bf16 -> fp32 -> bf16: the losses left the bf16 run's"
import sys
a = [float(l.split()[1]) for l in open(sys.argv[1])]
c = [float(l.split()[1]) for l in open(sys.argv[2])]
assert a[:6] == c[:6], "steps 1-6 are the bf16 run's own"
d = max(abs(x - y) / abs(x) for x, y in zip(a[6:], c[6:]))
print(f"  steps 7-12 (fp32 then bf16) against the bf16 run: max rel diff {d:.2e} (tol 1e-3)")
assert d <= 1e-2
PY
pass "bf16 checkpoint resumed in fp32 and that one in bf16 (same model to bf16 precision)"
unset FLAVOR KVH

# COMPLETE rule: a newer step directory without COMPLETE is never loaded.
RB=$WORK/run_b_gpt2
cp -r "$RB/ckpt/step_0000012" "$RB/ckpt/step_0000099"
rm "$RB/ckpt/step_0000099/COMPLETE"
printf 'garbage' > "$RB/ckpt/step_0000099/model.safetensors"
export FLAVOR=gpt2 KVH=4
make_config "$WORK" "$WORK/b.yaml" "$RB"
"$LOOM_BIN" train "$WORK/b.yaml" --set training.steps=13 --set checkpoint.every=3 2>"$WORK/log_c"
grep -q "resumed from .*step_0000012" "$WORK/log_c" || { cat "$WORK/log_c"; fail "incomplete step_0000099 was not skipped"; }
pass "step directory without COMPLETE skipped on resume"
expect_fail "generate refuses an incomplete step directory" "COMPLETE|incomplete" \
  "$LOOM_ASAN_BIN" generate "$RB/ckpt/step_0000099" --prompt "the" --tokens 5

# generate from the trained run works and is deterministic for a seed
out1=$("$LOOM_BIN" generate "$RB" --prompt "the " --tokens 40 --seed 3)
out2=$("$LOOM_BIN" generate "$RB" --prompt "the " --tokens 40 --seed 3)
[ "$out1" = "$out2" ] || fail "generate is not deterministic for a fixed seed"
[[ "$out1" == "the "* ]] || fail "generate output does not start with the prompt"
[ ${#out1} -ge 30 ] || fail "generate produced too little: '$out1'"
pass "generate: '$out1'"
echo "all resume tests passed"
