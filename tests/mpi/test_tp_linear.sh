# Tensor parallelism's communication points (src/parallel/tp.c): a column-parallel linear then
# a row-parallel one, sharded over tp = 1, 2, 3 and 4 ranks, equal one plain pair of linears on
# the same weights, forward and backward (tests/mpi/tp_driver.c), also with sequence
# parallelism's row shards (tp = 1, 2, 3). One thread per rank.
source "$(dirname "$0")/lib.sh"
TP_DRIVER=${TP_DRIVER:-$LOOM_SRC/build/tests/tp_driver}
[ -x "$TP_DRIVER" ] || fail "tp driver not built: $TP_DRIVER"
for np in 1 2 3 4; do
  run_mpi "$np" "$WORK/out" "$TP_DRIVER" linear
  [ $RC -eq 0 ] || { cat "$WORK/out" >&2; fail "tp=$np: sharded linear differs from the plain one"; }
  # (matches, not lines: two ranks' lines can share one in mpirun's merged output)
  n=$(grep -o "equals the plain one" "$WORK/out" | wc -l || true)
  [ "$n" -eq "$np" ] || { cat "$WORK/out" >&2; fail "tp=$np: $n of $np ranks reported success"; }
  pass "tp=$np: $(grep -m1 'equals the plain one' "$WORK/out" | sed 's/^rank 0: //')"
  if [ $((6 % np)) -eq 0 ]; then
    n=$(grep -o "with sequence parallelism: rows" "$WORK/out" | wc -l || true)
    [ "$n" -eq "$np" ] || { cat "$WORK/out" >&2; fail "tp=$np sp: $n of $np ranks reported success"; }
    pass "tp=$np, sequence parallelism: $(grep -m1 'with sequence parallelism' "$WORK/out" | sed 's/^rank 0: //')"
  fi
done
echo "all tensor-parallel linear tests passed"
