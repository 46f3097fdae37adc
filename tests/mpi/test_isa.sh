#!/usr/bin/env bash
# The kernels' instruction-set level is agreed over the ranks (src/parallel/start.c, loom_parallel_start):
# ranks forced to different levels (LOOM_ISA, as on nodes of different CPU types) all run the
# minimum, rank 0 says so, and a `loom train` job whose ranks differ gives bit-identical
# metrics to one whose ranks are all forced to that minimum. A LOOM_ISA one rank refuses ends
# the job with its message, without a hang. See docs/build.md.
source "$(dirname "$0")/lib.sh"
MPIRUN=(timeout -k 5 120 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)

best=$("$LOOM_BIN" version | sed -n 's/.*this CPU supports up to \([a-z0-9-]*\)).*/\1/p')
if "$LOOM_BIN" version | grep -q "NATIVE=1"; then
  best=native
fi
[ -n "$best" ] || fail "loom version does not name the CPU's level: $("$LOOM_BIN" version)"
echo "this CPU: $best"
if [ "$best" = native ]; then
  # one level only: every rank reports native, another level is refused
  "${MPIRUN[@]}" -np 2 "$COMM_DRIVER" isa >"$WORK/n.txt" 2>&1 || { cat "$WORK/n.txt"; fail "isa (native)"; }
  [ "$(grep -c "kernels native" "$WORK/n.txt")" = 2 ] || { cat "$WORK/n.txt"; fail "native: both ranks"; }
  must_fail_within "LOOM_ISA=avx2 in a NATIVE=1 build" 60 "NATIVE=1 build" 2 env LOOM_ISA=avx2 "$COMM_DRIVER" isa
  echo "PASS (NATIVE=1 build)"
  exit 0
fi
top=$best

# both ranks on their own: the CPU's best level, no note
"${MPIRUN[@]}" -np 2 "$COMM_DRIVER" isa >"$WORK/a.txt" 2>&1 || { cat "$WORK/a.txt"; fail "isa, default"; }
[ "$(grep -c "kernels $top " "$WORK/a.txt")" = 2 ] || { cat "$WORK/a.txt"; fail "default: not both at $top"; }
! grep -q "support different levels" "$WORK/a.txt" || { cat "$WORK/a.txt"; fail "default: a note about differing ranks"; }
pass "default: both ranks run the $top kernels"

# ranks forced to different levels: both run the minimum (x86-64), rank 0 says so
for lv in $top avx2; do
  "${MPIRUN[@]}" -np 1 env LOOM_ISA=$lv "$COMM_DRIVER" isa : -np 1 env LOOM_ISA=x86-64 "$COMM_DRIVER" isa \
    >"$WORK/b.txt" 2>&1 || { cat "$WORK/b.txt"; fail "isa, $lv + x86-64"; }
  grep -q "rank 0: kernels x86-64 .*LOOM_ISA=$lv" "$WORK/b.txt" && grep -q "rank 1: kernels x86-64 .*LOOM_ISA=x86-64" "$WORK/b.txt" ||
    { cat "$WORK/b.txt"; fail "ranks at $lv and x86-64 did not both end at x86-64"; }
  if [ $lv != x86-64 ]; then
    grep -q "ranks' CPUs support different levels (x86-64 to $lv): every rank runs the x86-64 kernels" "$WORK/b.txt" ||
      { cat "$WORK/b.txt"; fail "no note about the differing ranks"; }
  fi
  pass "ranks at $lv and x86-64: both run x86-64 ($(grep -o "support different.*" "$WORK/b.txt" | head -1))"
  [ $top = avx2 ] && break
done
# three ranks, the minimum is in the middle of the list
"${MPIRUN[@]}" -np 1 env LOOM_ISA=$top "$COMM_DRIVER" isa : -np 1 env LOOM_ISA=avx2 "$COMM_DRIVER" isa \
  : -np 1 env LOOM_ISA=$top "$COMM_DRIVER" isa >"$WORK/c.txt" 2>&1 || { cat "$WORK/c.txt"; fail "isa, 3 ranks"; }
[ "$(grep -c "kernels avx2 " "$WORK/c.txt")" = 3 ] || { cat "$WORK/c.txt"; fail "3 ranks: not all at avx2"; }
pass "ranks at $top, avx2, $top: all run avx2"

# a level one rank refuses: the job ends with that rank's message, the others do not hang
must_fail_within "LOOM_ISA=sse9 on rank 1" 60 "LOOM_ISA='sse9': unknown level" \
  1 "$COMM_DRIVER" isa : -np 1 env LOOM_ISA=sse9 "$COMM_DRIVER" isa

# training: replicas whose ranks differ run the agreed level, bit for bit
make_dataset "$WORK"
make_config "$WORK" "$WORK/t.yaml" "$WORK/unused"
train() { # train NAME LEVEL_RANK0 LEVEL_RANK1
  "${MPIRUN[@]}" -np 1 env LOOM_ISA=$2 "$LOOM_BIN" train "$WORK/t.yaml" --set run.dir="$WORK/$1" \
    --set training.steps=6 --set checkpoint.every=0 --set eval.every=3 \
    : -np 1 env LOOM_ISA=$3 "$LOOM_BIN" train "$WORK/t.yaml" --set run.dir="$WORK/$1" \
    --set training.steps=6 --set checkpoint.every=0 --set eval.every=3 >"$WORK/$1.log" 2>&1 ||
    { cat "$WORK/$1.log"; fail "train $1 ($2, $3)"; }
}
train mixed $top x86-64
train base x86-64 x86-64
train top $top $top
losses "$WORK/mixed" >"$WORK/mixed.l"; losses "$WORK/base" >"$WORK/base.l"; losses "$WORK/top" >"$WORK/top.l"
[ -s "$WORK/base.l" ] || fail "no metrics"
cmp -s "$WORK/mixed.l" "$WORK/base.l" || { paste "$WORK/mixed.l" "$WORK/base.l"; fail "ranks at $top + x86-64 differ from both at x86-64"; }
grep -q "every rank runs the x86-64 kernels" "$WORK/mixed.log" || { cat "$WORK/mixed.log"; fail "train: no note"; }
# the levels are other code: the same job at $top differs in bits (so the equality above means something)
! cmp -s "$WORK/top.l" "$WORK/base.l" || fail "training at $top and at x86-64 gave identical bits: is the level used?"
pass "loom train with ranks at $top and x86-64 = both at x86-64, bit for bit ($(wc -l <"$WORK/base.l") rows); at $top the bits differ"
echo "PASS"
