#!/usr/bin/env bash
# A real Slurm on localhost (scripts/slurm/local_slurm.sh):
# - a real `loom train` through scripts/slurm/train.sbatch (its first usage example: the
#   config and layout it shows, on a test-sized model and dataset), 2 tasks: it writes
#   checkpoints, is requeued (`scontrol requeue`: SIGTERM, checkpoint, exit), and the requeued
#   job resumes from that checkpoint and finishes; metrics.jsonl holds every step once and its
#   losses equal, bit for bit, those of an uninterrupted job;
# - the comm driver launched through the sbatch templates (sbatch + srun --mpi=pmix) runs its
#   collectives and mesh checks on 2 and 4 tasks; a rank that exits with an error and a
#   collective timeout each end their job (FAILED) promptly, and so does a SIGKILLed task. Slurm's packages missing (and not installable) is a
# failure; LOOM_TEST_SKIP=slurm is the opt-out (tests/run_test.sh).
set -euo pipefail
LOOM_SRC=${LOOM_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
COMM_DRIVER=${COMM_DRIVER:-$LOOM_SRC/build/tests/comm_driver}
[ -x "$COMM_DRIVER" ] || { echo "FAIL: comm driver not built: $COMM_DRIVER" >&2; exit 1; }
LOOM_BIN=${LOOM_BIN:-$LOOM_SRC/build/loom}
[ -x "$LOOM_BIN" ] || { echo "FAIL: loom not built: $LOOM_BIN" >&2; exit 1; }
export LOOM_BIN
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0}
export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
WORK=$(mktemp -d /tmp/loom-slurm.XXXXXX)
export LOOM_SLURM_DIR=${LOOM_SLURM_DIR:-$WORK/slurm}  # this run's own cluster state
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

# ---- a training job, requeued and resumed ----
python3 - "$WORK/corpus" <<'PY'
import os, random, sys
random.seed(7)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly".split()
os.makedirs(sys.argv[1])
with open(os.path.join(sys.argv[1], "docs.txt"), "w") as f:
    for _ in range(120):
        f.write(" ".join(random.choice(words) for _ in range(random.randint(20, 80))) + "\n%\n")
PY
cat >"$WORK/recipe.yaml" <<YAML
name: slurmtest
sources:
  - name: corpus
    kind: text
    path: $WORK/corpus
    split: "\n%\n"
tokenizer: byte
seq_len: 32
val_fraction: 0.1
output: $WORK/data
YAML
"$LOOM_BIN" data build "$WORK/recipe.yaml" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log" >&2; fail "data build"; }
# train.sbatch's first usage example: `sbatch scripts/slurm/train.sbatch CONFIG ARGS...`
example=$(sed -n 's|^#   sbatch scripts/slurm/train.sbatch ||p' "$S/train.sbatch" | head -n 1)
read -ra EX <<<"$example"
[ ${#EX[@]} -ge 1 ] && [ -f "$LOOM_SRC/${EX[0]}" ] || fail "train.sbatch: its example config '${EX[0]:-}' does not exist"
for f in $(grep -ohE 'configs/[A-Za-z0-9_.-]+\.yaml' "$S"/*.sbatch "$LOOM_SRC/docs/distributed.md" | sort -u); do
  [ -f "$LOOM_SRC/$f" ] || fail "$f, named in scripts/slurm/*.sbatch or docs/distributed.md, does not exist"
done
STEPS=600
TRAIN=("$LOOM_SRC/${EX[0]}" "${EX[@]:1}"
  --set data.train="$WORK/data/train" --set data.val="$WORK/data/val" --set data.follow=false
  --set model.d_model=32 --set model.n_layer=2 --set model.n_head=4 --set model.n_kv_head=4
  --set model.d_ff=128 --set training.seq_len=32 --set training.batch_size=4
  --set training.steps=$STEPS --set training.schedule_steps=$STEPS --set training.warmup=10
  --set training.log_every=100 --set training.peak_flops=1e11 --set eval.every=0
  --set eval.batches=0 --set checkpoint.every=50)
# the uninterrupted reference and the job to requeue, side by side (2 tasks each)
( cd "$WORK" && submit ref -n 2 "$S/train.sbatch" "${TRAIN[@]}" --set run.dir="$WORK/ref" )
( cd "$WORK" && submit train -n 2 "$S/train.sbatch" "${TRAIN[@]}" --set run.dir="$WORK/train" )
tjid=$(<"$WORK/train.id")
t0=$SECONDS
until [ -e "$WORK/train/ckpt/step_0000050/COMPLETE" ]; do
  st=$(scontrol show job -o "$tjid" | grep -oP 'JobState=\K\S+' || true)
  case $st in PENDING|RUNNING|CONFIGURING) ;; *) cat "$WORK/train.out" >&2; fail "train: job $tjid is $st before its first checkpoint" ;; esac
  (( SECONDS - t0 < 90 )) || { cat "$WORK/train.out" >&2; fail "train: no checkpoint at step 50 after 90 s"; }
  sleep 0.1
done
st=$(scontrol show job -o "$tjid" | grep -oP 'JobState=\K\S+')
[ "$st" = RUNNING ] || { cat "$WORK/train.out" >&2; fail "train: job $tjid is $st at its first checkpoint, not RUNNING (too fast to requeue?)"; }
scontrol requeue "$tjid" || fail "scontrol requeue $tjid"
# a requeued job waits for its credentials to expire (BeginTime = now + 121 s): release it now
for _ in $(seq 1 120); do
  st=$(scontrol show job -o "$tjid" | grep -oP 'JobState=\K\S+' || true)
  [ "$st" = PENDING ] && { scontrol update JobId="$tjid" StartTime=now || fail "scontrol update StartTime"; break; }
  [ "$st" = COMPLETING ] || fail "train: job $tjid is $st after the requeue (expected COMPLETING, then PENDING)"
  sleep 0.25
done
[ "$st" = PENDING ] || fail "train: job $tjid never went back to PENDING after the requeue"
pass "train.sbatch ${example}: 2 tasks, checkpoint at step 50, requeued"

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
wait_job train COMPLETED 150
wait_job ref COMPLETED 60
python3 - "$WORK" "$STEPS" <<'PY' || { cat "$WORK/train.out" >&2; fail "train: the requeued run did not resume exactly"; }
import json, re, sys
w, steps = sys.argv[1], int(sys.argv[2])
log = open(f"{w}/train.out").read()
runs = re.split(r"(?m)^(?=loom: job )", log)[1:]
assert len(runs) == 2, f"{len(runs)} runs in the log, expected 2 (the first and the requeued one)"
assert "(restart 0)" in runs[0] and "(restart 1)" in runs[1], "restart counts"
assert "dp=2 " in runs[0] and "zero 1" in runs[0], "layout: not dp=2 with the example's zero 1"
m = re.search(r"interrupted by signal 15 at step (\d+); checkpoint saved", runs[0])
assert m, "the first run was not stopped by SIGTERM with a checkpoint"
k = int(m.group(1))
r = re.search(r"resumed from \S+/ckpt/step_(\d+) \(step (\d+)\)", runs[1])
assert r and int(r.group(1)) == k and int(r.group(2)) == k, f"the second run did not resume from step {k}"
assert 50 <= k < steps, k
rows = [json.loads(l) for l in open(f"{w}/train/metrics.jsonl")]
assert [x["step"] for x in rows] == list(range(1, steps + 1)), "metrics.jsonl: steps missing or repeated"
ref = [json.loads(l) for l in open(f"{w}/ref/metrics.jsonl")]
diff = [x["step"] for x, y in zip(rows, ref) if x["loss"] != y["loss"] or x["grad_norm"] != y["grad_norm"]]
assert len(ref) == steps and not diff, f"losses differ from the uninterrupted job at steps {diff[:5]}"
assert rows[-1].get("val_loss") == ref[-1].get("val_loss") is not None, "val_loss"
print(f"stopped at step {k}, resumed from its checkpoint, {steps} steps, losses = the uninterrupted job's")
PY
latest=$(readlink "$WORK/train/ckpt/latest" || true)
[ "${latest##*/}" = step_0000600 ] && [ -e "$WORK/train/ckpt/step_0000600/COMPLETE" ] ||
  fail "train: ckpt/latest is '$latest', not the complete step_0000600"
pass "requeued job resumed from its checkpoint and finished: $(grep -m1 -o 'resumed from .*' "$WORK/train.out")"
echo "PASS"
