"""Bytes a data-parallel `loom train` really sends per step, per rank, measured by Open MPI.

    python3 bench/dp_wire.py --np 2 --zero 1 CONFIG.yaml [--set k=v ...] [--steps 2,6]

Open MPI's pml "monitoring" component (`--mca pml_monitoring_enable 2`) counts every message the
point-to-point layer sends, collectives included (they are built from point-to-point messages:
coll/tuned and coll/libnbc), by destination; at MPI_Finalize each rank writes the counters to
PREFIX.<rank>.prof. Those are payload bytes as handed to the transport (headers excluded): what
goes on the wire, whatever algorithm Open MPI picked. The script runs the same training twice,
with A and B steps (no validation, no checkpoints), and takes (bytes(B) - bytes(A)) / (B - A)
per rank, which leaves out start-up and shut-down traffic.

The bound it is compared with is the least any data-parallel step can send per rank, on average
over the ranks, for G = 4 x parameters bytes of fp32 gradients over N ranks: every rank must get
the other ranks' contributions to the gradient slice it reduces ((N-1)/N G in all, a
reduce-scatter) and the updated parameters (or reduced gradients) of the slices it does not own
((N-1)/N G, an all-gather): 2 (N-1)/N G, for every ZeRO stage (what a ring all-reduce sends).
ZeRO 3 also re-gathers, during backward, the parameters of the layers its gather buffers no
longer hold (all but the last two layers, the embeddings and the final block), so it sends more
by design. Small per-step messages (gradient norm, stop flag, metrics) are not in the bound.
Prints one JSON object: per-rank bytes/step, their mean, the bound, loom's own accounting
(`comm_bytes` of metrics.jsonl, ring formulas) and the step count used.
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"^([EI])\t(\d+)\t(\d+)\t(\d+) bytes\t(\d+) msgs sent")


def sent_bytes(prefix):
    """{rank: bytes sent} from the PREFIX.<rank>.prof files (E = the program's own point-to-point
    messages, I = messages of collectives)."""
    out = {}
    for path in glob.glob(prefix + ".*.prof"):
        m = re.search(r"\.(\d+)\.prof$", path)
        if not m:
            continue
        rank = int(m.group(1))
        total = 0
        for line in open(path):
            lm = LINE.match(line)
            if lm:
                total += int(lm.group(4))
        out[rank] = total
    if not out:
        raise RuntimeError(f"no Open MPI monitoring output at {prefix}.*.prof")
    return out


def bound(n, grad_bytes):
    return 2 * (n - 1) / n * grad_bytes


def has_monitoring():
    try:
        info = subprocess.run(["ompi_info"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return False
    return re.search(r"MCA pml: monitoring", info) is not None


def run(loom, np_, cfg, sets, steps, workdir, threads=1):
    prefix = os.path.join(workdir, f"mon_{steps}")
    run_dir = os.path.join(workdir, f"run_{steps}")
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none",
           "--mca", "pml_monitoring_enable", "2", "--mca", "pml_monitoring_enable_output", "3",
           "--mca", "pml_monitoring_filename", prefix,
           "-x", f"OMP_NUM_THREADS={threads}", "-x", f"OPENBLAS_NUM_THREADS={threads}"]
    if "LOOM_PEAK_FLOPS" in os.environ:
        cmd += ["-x", "LOOM_PEAK_FLOPS"]
    cmd += [loom, "train", cfg, "--set", f"run.dir={run_dir}", "--set", f"training.steps={steps}",
            "--set", "checkpoint.every=0", "--set", "data.val=", "--set", f"training.threads={threads}",
            "--set", "training.log_every=100000"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise RuntimeError(f"mpirun -np {np_} loom train failed (exit {p.returncode})")
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return sent_bytes(prefix), rows


def measure(loom, np_, zero, cfg, sets, steps=(2, 6)):
    a, b = steps
    work = tempfile.mkdtemp(prefix="loom_dp_wire_")
    try:
        sets = list(sets) + [f"parallel.zero={zero}"]
        ba, _ = run(loom, np_, cfg, sets, a, work)
        bb, rows = run(loom, np_, cfg, sets, b, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if sorted(ba) != list(range(np_)) or sorted(bb) != list(range(np_)):
        raise RuntimeError(f"monitoring output for ranks {sorted(ba)} / {sorted(bb)}, expected {np_}")
    per_rank = [(bb[r] - ba[r]) / (b - a) for r in range(np_)]
    accounted = [statistics.median(r["comm_bytes"][k] for r in rows) for k in range(np_)]
    return {"np": np_, "zero": zero, "steps": [a, b], "bytes_per_step": per_rank,
            "mean": statistics.mean(per_rank), "loom_accounted": accounted}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--steps", default="2,6", help="A,B: the two step counts")
    ap.add_argument("--params", type=int, required=True,
                    help="parameter count (G = 4 x params bytes of fp32 gradients)")
    ap.add_argument("--loom-bin", default=os.environ.get("LOOM_BIN", "build/loom"))
    args = ap.parse_args()
    if not has_monitoring():
        sys.exit("dp_wire: needs Open MPI with the pml monitoring component (ompi_info shows "
                 "'MCA pml: monitoring')")
    a, b = (int(x) for x in args.steps.split(","))
    if not 0 < a < b:
        sys.exit(f"dp_wire: --steps {args.steps}: need 0 < A < B")
    r = measure(args.loom_bin, args.np, args.zero, args.config, args.sets, (a, b))
    r["grad_bytes"] = 4 * args.params
    r["bound"] = bound(args.np, r["grad_bytes"])
    r["mean_over_bound"] = r["mean"] / r["bound"]
    print(json.dumps(r))


if __name__ == "__main__":
    main()
