#!/usr/bin/env bash
# The mesh under mpirun: layouts resolve and every group matches the documented rank order
# (TP innermost); invalid layouts are clear errors and a non-zero exit.
source "$(dirname "$0")/lib.sh"

# dp=auto with tp=2 on 4 ranks -> dp=2; TP groups {0,1},{2,3}, DP groups {0,2},{1,3}
run_mpi 4 "$WORK/m" "$COMM_DRIVER" mesh dp=auto tp=2 heads=4 layers=2
[ $RC -eq 0 ] || { cat "$WORK/m" >&2; fail "dp=auto tp=2 on 4 ranks: exit $RC"; }
for r in 0 1 2 3; do
  line=$(grep "^rank $r: mesh" "$WORK/m") || { cat "$WORK/m" >&2; fail "no mesh line for rank $r"; }
  echo "$line" | grep -q "dp=2 tp=2 pp=1 cp=1 ep=1 (world 4)" || fail "rank $r layout: $line"
done
grep -q "^rank 0: .* dp=0/2 tp=0/2 .* tp_members=0,1 dp_members=0,2$" "$WORK/m" || fail "rank 0 groups: $(cat "$WORK/m")"
grep -q "^rank 1: .* dp=0/2 tp=1/2 .* tp_members=0,1 dp_members=1,3$" "$WORK/m" || fail "rank 1 groups"
grep -q "^rank 2: .* dp=1/2 tp=0/2 .* tp_members=2,3 dp_members=0,2$" "$WORK/m" || fail "rank 2 groups"
grep -q "^rank 3: .* dp=1/2 tp=1/2 .* tp_members=2,3 dp_members=1,3$" "$WORK/m" || fail "rank 3 groups"
pass "dp=auto tp=2 on 4 ranks -> dp=2, TP innermost"

# every group checked by the driver against the formula, on richer layouts
run_mpi 8 "$WORK/m8" "$COMM_DRIVER" mesh tp=2 pp=2 cp=2 heads=4 kv_heads=2 layers=4 seq=64
[ $RC -eq 0 ] && [ "$(grep -c ': mesh dp=1 tp=2 pp=2 cp=2' "$WORK/m8")" = 8 ] || { cat "$WORK/m8" >&2; fail "tp=2 pp=2 cp=2 on 8 ranks"; }
pass "tp=2 pp=2 cp=2 on 8 ranks"
run_mpi 8 "$WORK/m8e" "$COMM_DRIVER" mesh dp=2 cp=2 pp=2 ep=2 experts=4
[ $RC -eq 0 ] && [ "$(grep -c ': mesh dp=2 tp=1 pp=2 cp=2 ep=2' "$WORK/m8e")" = 8 ] || { cat "$WORK/m8e" >&2; fail "dp=2 pp=2 cp=2 ep=2 on 8 ranks"; }
pass "dp=2 pp=2 cp=2 ep=2 on 8 ranks"

# invalid layouts: clear errors, non-zero exit, printed once (rank 0)
must_fail_within "tp=3 with 4 heads" 30 "parallel.tp=3 does not divide model.n_head=4" \
  3 "$COMM_DRIVER" mesh tp=3 heads=4
must_fail_within "product != world size" 30 \
  "parallel.dp \* parallel.tp \* parallel.pp \* parallel.cp = 2 \* 1 \* 1 \* 1 = 2 but the world has 4 ranks" \
  4 "$COMM_DRIVER" mesh dp=2
must_fail_within "dp=auto with tp=3 on 4 ranks" 30 "tp \* parallel.pp \* parallel.cp = 3 \* 1 \* 1 = 3 does not divide the world size 4" \
  4 "$COMM_DRIVER" mesh tp=3
must_fail_within "pp=2 with 3 layers" 30 "parallel.pp=2 does not divide model.n_layer=3" \
  2 "$COMM_DRIVER" mesh pp=2 layers=3
must_fail_within "cp=2 with odd sequence" 30 "parallel.cp=2 does not divide the sequence length 63" \
  2 "$COMM_DRIVER" mesh cp=2 seq=63
must_fail_within "ep=2 without experts" 30 "parallel.ep=2 but the model has no experts" \
  2 "$COMM_DRIVER" mesh ep=2
must_fail_within "ep not dividing dp*cp" 30 "parallel.ep=4 must divide parallel.dp \* parallel.cp = 2 \* 1" \
  2 "$COMM_DRIVER" mesh ep=4 experts=8
[ "$(grep -c 'parallel.ep=4 must divide' "$WORK/out")" = 1 ] || fail "layout error printed more than once"
pass "layout errors printed once"
# threads per rank: CPUs of the node / ranks on the node (no binding), or OMP_NUM_THREADS
ncpu=$(getconf _NPROCESSORS_ONLN)
want=$(( ncpu / 2 )); [ $want -ge 1 ] || want=1
RC=0; env -u OMP_NUM_THREADS -u SLURM_CPUS_PER_TASK timeout 90 mpirun -np 2 --bind-to none "$COMM_DRIVER" threads >"$WORK/t" 2>&1 || RC=$?
[ $RC -eq 0 ] && [ "$(grep -c "threads $want\$" "$WORK/t")" = 2 ] || { cat "$WORK/t" >&2; fail "threads on 2 ranks: want $want each"; }
RC=0; OMP_NUM_THREADS=3 timeout 90 mpirun -np 2 "$COMM_DRIVER" threads >"$WORK/t" 2>&1 || RC=$?
[ $RC -eq 0 ] && [ "$(grep -c 'threads 3$' "$WORK/t")" = 2 ] || { cat "$WORK/t" >&2; fail "threads with OMP_NUM_THREADS=3"; }
pass "threads per rank: $want with 2 ranks on $ncpu CPUs, 3 with OMP_NUM_THREADS=3"
echo "PASS"
