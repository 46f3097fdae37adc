#!/usr/bin/env bash
# A real Slurm on localhost (scripts/slurm/local_slurm.sh): the comm driver launched through
# the sbatch templates (sbatch + srun --mpi=pmix) runs its collectives and mesh checks on 2 and
# 4 tasks; a rank that exits with an error and a collective timeout each end their job (FAILED)
# promptly, and so does a SIGKILLed task. Slurm's packages missing (and not installable) is a
# failure; LOOM_TEST_SKIP=slurm is the opt-out (tests/run_test.sh).
set -euo pipefail
LOOM_SRC=${LOOM_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
COMM_DRIVER=${COMM_DRIVER:-$LOOM_SRC/build/tests/comm_driver}
[ -x "$COMM_DRIVER" ] || { echo "FAIL: comm driver not built: $COMM_DRIVER" >&2; exit 1; }
export LOOM_SLURM_DIR=${LOOM_SLURM_DIR:-/tmp/loom-slurm-test}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0}
export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
WORK=$(mktemp -d /tmp/loom-slurm.XXXXXX)
S=$LOOM_SRC/scripts/slurm

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }

rc=0
"$S/local_slurm.sh" up >"$WORK/env" || rc=$?
if [ $rc -eq 77 ]; then
  rm -rf "$WORK"
  fail "Slurm's packages (slurmctld slurmd slurm-client munge) are not installed and could not be installed (scripts/setup.sh --test), or opt out with LOOM_TEST_SKIP=slurm"
fi
cleanup() { "$S/local_slurm.sh" down || true; rm -rf "$WORK"; }
trap cleanup EXIT
[ $rc -eq 0 ] || fail "local Slurm did not come up (exit $rc)"
source "$WORK/env"   # SLURM_CONF

submit() {  # submit NAME sbatch-args... -> job id in $WORK/NAME.id
  local name=$1; shift
  sbatch --parsable -o "$WORK/$name.out" "$@" >"$WORK/$name.id" || fail "$name: sbatch failed"
}
# wait_job NAME WANT LIMIT_S: the job must reach state WANT (COMPLETED / FAILED) within LIMIT_S
wait_job() {
  local name=$1 want=$2 limit=$3 jid st t0=$SECONDS
  jid=$(<"$WORK/$name.id")
  while :; do
    st=$(scontrol show job -o "$jid" 2>/dev/null | grep -oP 'JobState=\K\S+' || true)
    case $st in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) break ;;
    esac
    if (( SECONDS - t0 > limit )); then
      scancel "$jid" || true; cat "$WORK/$name.out" >&2 || true
      tail -n 20 "$LOOM_SLURM_DIR"/log/*.log >&2 || true
      fail "$name: job $jid still '$st' after ${limit}s"
    fi
    sleep 0.5
  done
  [ "$st" = "$want" ] || { cat "$WORK/$name.out" >&2; fail "$name: job $jid ended $st, expected $want"; }
  JOB_SECS=$((SECONDS - t0))
}

# every job at once (the node declares >= 4 CPUs, shared by 2 jobs each)
submit coll -n 2 "$S/batch.sbatch" "$COMM_DRIVER" coll
submit mesh -n 4 "$S/interactive.sbatch" "$COMM_DRIVER" mesh tp=2 heads=4
submit exit -n 2 "$S/batch.sbatch" "$COMM_DRIVER" exit rank=1
submit kill -n 2 "$S/batch.sbatch" "$COMM_DRIVER" kill rank=1
submit tmo -n 2 "$S/batch.sbatch" "$COMM_DRIVER" timeout timeout=2 rank=0 sleep=120

wait_job coll COMPLETED 120
[ "$(grep -c 'collectives ok on 8 groups' "$WORK/coll.out")" = 2 ] || { cat "$WORK/coll.out" >&2; fail "coll: not every task ok"; }
grep -q "partition batch" "$WORK/coll.out" || fail "coll: not on the batch partition"
pass "2-task collectives through sbatch + srun --mpi=pmix (batch partition)"

wait_job mesh COMPLETED 120
[ "$(grep -c ': mesh dp=2 tp=2 pp=1 cp=1 ep=1 (world 4)' "$WORK/mesh.out")" = 4 ] || { cat "$WORK/mesh.out" >&2; fail "mesh: not 4 tasks with dp=2 tp=2"; }
grep -q "partition interactive" "$WORK/mesh.out" || fail "mesh: not on the interactive partition"
pass "4-task mesh dp=auto tp=2 -> dp=2 (interactive partition)"

wait_job exit FAILED 60
pass "a task exiting with status 3 fails the job (${JOB_SECS}s)"

wait_job kill FAILED 60
pass "a SIGKILLed task fails the job (${JOB_SECS}s)"

wait_job tmo FAILED 60
grep -q "allreduce #4 on world (2 ranks) did not complete within 2 s; ranks still missing: 0" "$WORK/tmo.out" || { cat "$WORK/tmo.out" >&2; fail "timeout: message"; }
pass "collective timeout under srun fails the job (${JOB_SECS}s): $(grep -m1 'did not complete' "$WORK/tmo.out")"
echo "PASS"
