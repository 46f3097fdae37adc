#!/usr/bin/env bash
# LeakSanitizer on the CLI's successful paths (the error paths are covered by the other e2e
# tests, which run the same ASan/UBSan binary): every command below runs `loom-asan` under the
# tests' ASAN_OPTIONS (detect_leaks=1, tests/CMakeLists.txt) and must exit 0 without a report.
# First, the environment itself is checked: a program that leaks must be reported.
source "$(dirname "$0")/lib.sh"
L=$LOOM_ASAN_BIN
cd "$WORK"

# ---- leak detection is on in the tests' environment -----------------------------------------
case ":${ASAN_OPTIONS:-}:" in *:detect_leaks=1:*) ;; *) fail "ASAN_OPTIONS='${ASAN_OPTIONS:-}' does not turn leak detection on" ;; esac
printf '#include <stdlib.h>\n#include <stdio.h>\nint main(void) { void *volatile p = malloc(77); p = NULL; puts("leaked"); return 0; }\n' > leak.c
${CC:-cc} -fsanitize=address -g -O0 leak.c -o leak || fail "cannot build the leak probe"
rc=0; ./leak >probe.out 2>probe.err || rc=$?
[ $rc -ne 0 ] && grep -q "LeakSanitizer: detected memory leaks" probe.err && crashed probe.err ||
  { cat probe.err >&2; fail "a leaking ASan program is not reported (exit $rc): leak detection is off"; }
pass "leak detection is on: a 77-byte leak is reported (exit $rc)"
# the MPI tests' suppressions (Open MPI's libraries only) do not hide a leak outside them
rc=0; LSAN_OPTIONS=suppressions=$LOOM_SRC/tests/mpi/lsan.supp ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0 \
  ./leak >probe.out 2>probe.err || rc=$?
[ $rc -ne 0 ] && grep -q "LeakSanitizer: detected memory leaks" probe.err ||
  { cat probe.err >&2; fail "tests/mpi/lsan.supp suppresses a leak outside Open MPI (exit $rc)"; }
pass "tests/mpi/lsan.supp does not suppress a leak outside Open MPI"

# ---- data: build (text + labelled binary), inspect, verify -----------------------------------
make_dataset "$WORK"   # the plain binary builds the shared dataset
rm -rf "$WORK/data"
expect_ok "data build (text)" "$L" data build "$WORK/recipe.yaml"
expect_ok "data build again (cached)" "$L" data build "$WORK/recipe.yaml"
expect_ok "data inspect" "$L" data inspect "$WORK/data"
expect_ok "data verify --inputs" "$L" data verify --inputs "$WORK/data"
make_labelled_recipe "$WORK/bin" 24 "[dedup_exact]"
expect_ok "data build (labelled binary)" "$L" data build bin/recipe.yaml

# ---- tokenizer: train, info, encode, decode --------------------------------------------------
expect_ok "tokenizer train" "$L" tokenizer train --vocab-size 300 --special "<|endoftext|>" \
  --out tok.json --vocab-out vocab.json --merges-out merges.txt "$WORK"/corpus/part0.txt
expect_ok "tokenizer info" "$L" tokenizer info --tokenizer tok.json
echo "the quick brown fox" > text.txt
expect_ok "tokenizer encode" "$L" tokenizer encode --tokenizer tok.json --format json text.txt
cp "$WORK/out.txt" ids.json
expect_ok "tokenizer decode" "$L" tokenizer decode --vocab vocab.json --merges merges.txt ids.json
grep -q "the quick brown fox" "$WORK/out.txt" || fail "tokenizer decode: $(cat "$WORK/out.txt")"

# ---- train (checkpoint, resume), eval, generate: both flavors --------------------------------
for flavor in gpt2 llama; do
  kvh=4; [ $flavor = llama ] && kvh=2
  FLAVOR=$flavor KVH=$kvh make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/run_$flavor"
  expect_ok "train ($flavor, 6 steps, checkpoints)" "$L" train "$WORK/$flavor.yaml" \
    --set training.steps=6 --set checkpoint.every=3
  expect_ok "train ($flavor, resumed to 8 steps)" "$L" train "$WORK/$flavor.yaml" --set training.steps=8 --set checkpoint.every=4
  grep -q "resumed from" "$WORK/err.txt" || { cat "$WORK/err.txt" >&2; fail "$flavor: did not resume"; }
  expect_ok "eval ($flavor)" "$L" eval "$WORK/run_$flavor" --data "$WORK/data/val" --batches 2 --format json
  expect_ok "generate ($flavor)" "$L" generate "$WORK/run_$flavor" --prompt "the " --tokens 8 --seed 1 --top-k 5
done
make_config "$WORK" cls.yaml "$WORK/run_cls"
expect_ok "train (classify head)" "$L" train cls.yaml --set model.head=classify --set model.num_classes=3 \
  --set model.vocab_size=257 --set data.train="$WORK/bin/data/train" --set data.val="$WORK/bin/data/val" \
  --set training.seq_len=64 --set training.steps=4 --set training.schedule_steps=4 --set eval.every=2 \
  --set checkpoint.every=2
expect_ok "eval (classify head)" "$L" eval "$WORK/run_cls" --data "$WORK/bin/data/val"
echo "no leak on the successful paths"
