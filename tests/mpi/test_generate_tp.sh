#!/usr/bin/env bash
# Tensor-parallel generation: `mpirun -np N loom generate CKPT --tp T` runs N / T replicas of T
# ranks, each rank a tp view of the model (its heads, columns and vocabulary rows, read from the
# checkpoint). For GPT-2 and for Llama with grouped-query attention and a vocabulary that tp
# does not divide (261), 7 prompts of mixed lengths batched 3 at a time (continuous batching),
# the output of -np 2 --tp 2, -np 4 --tp 2 (2 replicas x tp 2) and (Llama, 2 kv heads
# replicated over 4 ranks) -np 4 --tp 4 equals the single process token for token: greedy with
# a repetition penalty (so that the outputs use many tokens) and sampled with a seed
# (temperature 1, no top-k: every logit of the whole vocabulary counts). A checkpoint saved by
# a tp 2 training run generates the same at tp 1 and tp 2. Errors: -np not a multiple of --tp,
# --tp not dividing the heads, --no-kv-cache or --weights bf16 with --tp; each ends the job
# non-zero with the message. --stats reports each rank's parameters and KV cache (half of the single process's).
source "$(dirname "$0")/lib.sh"
cd "$WORK"
make_dataset "$WORK"
COMMON=(--set training.steps=60 --set training.schedule_steps=60 --set training.seq_len=64
        --set checkpoint.every=60 --set eval.every=0)
make_config "$WORK" g.yaml "$WORK/g"
FLAVOR=llama KVH=2 make_config "$WORK" l.yaml "$WORK/l"
"$LOOM_BIN" train g.yaml "${COMMON[@]}" >/dev/null 2>g.log || { cat g.log; fail "train gpt2"; }
"$LOOM_BIN" train l.yaml "${COMMON[@]}" --set model.vocab_size=261 >/dev/null 2>l.log \
  || { cat l.log; fail "train llama"; }
printf 'the\nquick brown fox jumps over\nfox\na lazy dog sleeps while the jolly wizards\nover\nhex seven\nq\n' > prompts.txt
GREEDY=(--temperature 0 --repetition-penalty 1.5)
SAMPLED=(--temperature 1 --top-k 0 --seed 7)
GEN=(--prompts prompts.txt --tokens 24 --batch 3 --format ids)

# distinct ids over every output (a degenerate output would make the comparison weak)
distinct() { python3 -c 'import json,sys; print(len({t for l in open(sys.argv[1]) for t in json.loads(l)["ids"]}))' "$1"; }

for model in g l; do
  for mode in greedy sampled; do
    if [ $mode = greedy ]; then args=("${GREEDY[@]}"); else args=("${SAMPLED[@]}"); fi
    "$LOOM_BIN" generate "$model" "${GEN[@]}" "${args[@]}" > $model.$mode.1 2>err \
      || { cat err; fail "$model $mode: single process"; }
    [ "$(grep -c '"ids"' $model.$mode.1)" = 7 ] || fail "$model $mode: $(cat $model.$mode.1)"
    d=$(distinct $model.$mode.1)
    [ "$d" -ge 10 ] || fail "$model $mode: the outputs use only $d distinct tokens"
    layouts=("2 2" "4 2")
    [ $model = l ] && layouts+=("4 4")
    for lt in "${layouts[@]}"; do
      read -r np tp <<<"$lt"
      run_mpi "$np" out "$LOOM_BIN" generate "$model" "${GEN[@]}" "${args[@]}" --tp "$tp"
      [ $RC = 0 ] || { cat out >&2; fail "$model $mode -np $np --tp $tp: exit $RC"; }
      grep '^{' out > $model.$mode.$np.$tp
      cmp -s $model.$mode.1 $model.$mode.$np.$tp \
        || { diff $model.$mode.1 $model.$mode.$np.$tp >&2; cat out >&2; fail "$model $mode -np $np --tp $tp differs from one process"; }
      pass "$model $mode: -np $np --tp $tp ($((np / tp)) replica(s)) = one process, token for token ($d distinct ids)"
    done
  done
done

# one --prompt: the first replica runs it, its tp rank 0 prints it once
"$LOOM_BIN" generate l --prompt "the quick" --tokens 16 "${GREEDY[@]}" > p.1 2>err || { cat err; fail "--prompt"; }
run_mpi 4 out "$LOOM_BIN" generate l --prompt "the quick" --tokens 16 "${GREEDY[@]}" --tp 2
[ $RC = 0 ] || { cat out >&2; fail "--prompt at -np 4 --tp 2"; }
grep -v '^loom:' out > p.4
cmp -s p.1 p.4 || { diff p.1 p.4 >&2; fail "--prompt at -np 4 --tp 2 differs from one process"; }
pass "--prompt at -np 4 --tp 2: printed once, as one process prints it"

# --stats: every rank reports its view's parameters and KV cache: a tp 2 view holds more than
# half of the whole model's parameters (the norms are whole on each) and less than all, and
# exactly half of its KV cache (one of the two kv heads)
"$LOOM_BIN" generate l "${GEN[@]}" "${GREEDY[@]}" --stats >/dev/null 2>one.err || fail "stats"
run_mpi 2 out "$LOOM_BIN" generate l "${GEN[@]}" "${GREEDY[@]}" --tp 2 --stats
[ $RC = 0 ] || { cat out >&2; fail "--stats at tp 2"; }
python3 - <<'PY' || { cat one.err out >&2; fail "per-rank memory"; }
import re
pat = r'rank (\d) \(replica 0, tp rank \d of (\d)\): parameters [\d.]+ MiB \((\d+) floats\), KV cache [\d.]+ MiB \((\d+) bytes\)'
one = re.findall(pat, open('one.err').read())
two = re.findall(pat, open('out').read())
assert len(one) == 1 and len(two) == 2, (one, two)
P, K = int(one[0][2]), int(one[0][3])
for r, tp, p, k in two:
    assert tp == '2' and P / 2 < int(p) < P, (P, p)
    assert 2 * int(k) == K, (K, k)
print(f"whole model: {P} floats, KV peak {K} bytes; tp 2 views: {[int(t[2]) for t in two]} floats, "
      f"KV peaks {[int(t[3]) for t in two]} bytes")
PY
pass "--stats: each tp rank reports its parameters and KV cache ($(grep -o 'tp rank 1 of 2): parameters [^,]*' out))"

# a checkpoint saved by tensor-parallel training (tp 2 boxes) loads at tp 1 and tp 2 alike
FLAVOR=llama KVH=2 make_config "$WORK" t.yaml "$WORK/t"
timeout -k 5 200 mpirun -np 2 --oversubscribe "$LOOM_BIN" train t.yaml "${COMMON[@]}" \
  --set parallel.tp=2 >/dev/null 2>t.log || { cat t.log; fail "train at tp 2"; }
"$LOOM_BIN" generate t "${GEN[@]}" "${GREEDY[@]}" > t.1 2>err || { cat err; fail "tp-2 checkpoint at tp 1"; }
run_mpi 2 out "$LOOM_BIN" generate t "${GEN[@]}" "${GREEDY[@]}" --tp 2
grep '^{' out > t.2
cmp -s t.1 t.2 || { diff t.1 t.2 >&2; fail "a tp-2 checkpoint generates differently at tp 1 and tp 2"; }
pass "a checkpoint saved at tp 2 generates the same at tp 1 and tp 2"

# errors
must_fail_within "-np 3 --tp 2" 60 "tp 2 does not divide the 3 ranks" 3 \
  "$LOOM_BIN" generate l "${GEN[@]}" --tp 2
must_fail_within "--tp 3 with 4 heads" 60 "tensor-parallel degree 3 must divide n_head \(4\)" 3 \
  "$LOOM_BIN" generate l "${GEN[@]}" --tp 3
must_fail_within "--no-kv-cache --tp 2" 60 "no-kv-cache runs the whole model in one process, not with --tp" 2 \
  "$LOOM_BIN" generate l --prompt hi --no-kv-cache --tp 2
must_fail_within "--weights bf16 --tp 2" 60 "weights bf16 needs a whole language model \(tp = 1\)" 2 \
  "$LOOM_BIN" generate l "${GEN[@]}" --weights bf16 --tp 2
