#!/usr/bin/env bash
# A world of one without any launcher: no MPI initialisation at all, every group of one, every
# collective a local copy; a plain process must not need mpirun.
source "$(dirname "$0")/lib.sh"
for v in OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK PMI_SIZE PMI_FD SLURM_STEP_NUM_TASKS SLURM_PROCID; do unset $v; done
out=$("$COMM_DRIVER" single 2>&1) || { echo "$out" >&2; fail "world of one: exit non-zero"; }
echo "$out" | grep -q "world of one ok without MPI" || fail "world of one: $out"
pass "world of one without MPI"
# a point-to-point receive that no send matches (a local group) ends the job after the timeout
rc=0; out=$(timeout 60 "$COMM_DRIVER" unmatched timeout=1 2>&1) || rc=$?
[ $rc -eq 75 ] && echo "$out" | grep -q "receive nobody sends (p2p) on world (1 ranks) did not complete within 1 s; its matching send or receive was never posted" ||
    fail "unmatched local receive: rc=$rc $out"
pass "unmatched local receive: $(echo "$out" | head -1)"
# layout errors in a world of one are errors too
rc=0; out=$("$COMM_DRIVER" mesh tp=2 2>&1) || rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "does not divide the world size 1" || fail "tp=2 in a world of one: rc=$rc $out"
pass "tp=2 in a world of one: $out"
# srun that started several tasks without an MPI plugin: a clear error, not N singletons
rc=0; out=$(SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0 "$COMM_DRIVER" single 2>&1) || rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "srun --mpi=pmix" || fail "srun without pmi: rc=$rc $out"
pass "srun without an MPI plugin: $out"
echo "PASS"
