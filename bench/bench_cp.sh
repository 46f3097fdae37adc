#!/usr/bin/env bash
# Context-parallel benchmark on byte-tiny (docs/context-parallel.md): for each T in $TS, one
# process x 1 thread (cp = 1) against 2 ranks x 1 thread with parallel.cp = 2, cp_kind ulysses
# and ring; B = 1. Per case: the median over the steps after WARM of tokens/s and step time,
# peak RSS of rank 0, and rank 0's communication per step: loom's accounting of the bytes it
# sends (all of them: attention's and the dp x cp gradient reduction), the time its
# collectives/messages took from start to completion (overlapping compute) and the time
# blocked waiting, beside the bytes-over-bandwidth bound (bytes / the rate measured by
# bench/bench_cp_bw.c with loom's own isend/irecv (ring) or all-to-all (ulysses) on this
# machine). The attention share of the bytes is computed from the shapes.
#   bash bench/bench_cp.sh [--write]   (--write replaces the section in bench/RESULTS.md)
#   TS="1024 4096" STEPS=4 WARM=1 bash bench/bench_cp.sh     (a quick look)
# Per run bench/step_cpu.py samples each rank's CPU seconds per step (a figure that hardly
# depends on the machine's load, unlike step time and wait: a rank blocked in a message sleeps).
# ROUNDS=n (default 1) repeats the three runs of each T n times interleaved (cp 1, ulysses,
# ring, cp 1, ...): on a shared machine the table then gives the median over the rounds of
# each run's median step, and the rounds' spread.
# RECOMPUTE=full sets model.recompute (default none). Time: a step at T = 65,536 is minutes on
# one thread (attention is quadratic), so the default list takes about an hour.
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
BUILD=${BUILD:-build}
TS=${TS:-4096 16384 65536}
STEPS=${STEPS:-4}
WARM=${WARM:-1}
ROUNDS=${ROUNDS:-1}
RECOMPUTE=${RECOMPUTE:-none}
W=$(mktemp -d /tmp/loom-bench-cp.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f "$BUILD/libloom_static.a" ] || { echo "build first: make (no $BUILD/libloom_static.a)" >&2; exit 1; }
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
cc -O2 -std=c11 -Iinclude -Isrc bench/bench_cp_bw.c "$BUILD/libloom_static.a" \
   $(pkg-config --libs jansson yaml-0.1 libcrypto libpcre2-8 libzstd) -fopenmp -lm -ldnnl -lopenblas $(cat "$BUILD/loom_extra_libs.txt") \
   $(mpicc --showme:link 2>/dev/null || true) -o "$W/bench_cp_bw"
MPI=(mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)
"${MPI[@]}" "$W/bench_cp_bw" 32 >"$W/bw.json"
echo "bandwidth: $(cat "$W/bw.json")" >&2
cut -d' ' -f1-3 /proc/loadavg >"$W/load_before"
for T in $TS; do
  COMMON=(--set training.steps=$STEPS --set checkpoint.every=0 --set data.val=
          --set training.log_every=1000 --set training.batch_size=1 --set training.seq_len=$T
          --set model.max_seq_len=$T --set training.threads=1 --set training.memory_limit=off
          --set model.recompute=$RECOMPUTE)
  for r in $(seq 1 "$ROUNDS"); do
    python3 bench/step_cpu.py "$W/T${T}_cp1_r$r" "$W/T${T}_cp1_r$r.cpu" &
    OMP_NUM_THREADS=1 "$LOOM" train configs/byte-tiny.yaml "${COMMON[@]}" \
      --set run.dir="$W/T${T}_cp1_r$r" 2>"$W/log" || { cat "$W/log" >&2; exit 1; }
    wait
    for kind in ulysses ring; do
      python3 bench/step_cpu.py "$W/T${T}_${kind}_r$r" "$W/T${T}_${kind}_r$r.cpu" &
      "${MPI[@]}" "$LOOM" train configs/byte-tiny.yaml "${COMMON[@]}" --set run.dir="$W/T${T}_${kind}_r$r" \
        --set parallel.cp=2 --set parallel.cp_kind=$kind 2>"$W/log" || { cat "$W/log" >&2; exit 1; }
      wait
    done
    echo "T=$T round $r done ($(cut -d' ' -f1-3 /proc/loadavg))" >&2
  done
done
cut -d' ' -f1-3 /proc/loadavg >"$W/load_after"
python3 - "$W" "$WARM" "$TS" "${1:-}" "$RECOMPUTE" "$ROUNDS" "$STEPS" <<'PY'
import datetime, json, os, statistics, sys
w, warm, ts, write = sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3].split()], sys.argv[4] == "--write"
recompute, rounds, steps = sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
bw = json.load(open(f"{w}/bw.json"))
load_before, load_after = (open(f"{w}/load_{k}").read().strip() for k in ("before", "after"))
# byte-tiny: L 4, C 256, H 4 (= KVH), D 64; B 1; cp 2
L, C, H, KVH, D, P = 4, 256, 4, 4, 64, 2
def attn_bytes(kind, T):
    """bytes one rank sends per step for attention (fwd + bwd), fp32"""
    Tl = T // P
    qkv, out, kv = Tl * (H + 2 * KVH) * D * 4, Tl * H * D * 4, Tl * 2 * KVH * D * 4
    if kind == "ulysses":  # fwd: qkv, out; bwd: qkv, out, dout, dqkv; each (P-1)/P of it sent
        return L * (P - 1) / P * (3 * qkv + 3 * out)
    return L * ((P - 1) * kv + (P - 1) * kv + P * kv)  # fwd kv, bwd kv and dkv
def stats1(d):
    rows = [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")][warm:]
    med = lambda k, i=None: statistics.median(r[k] if i is None else r[k][i] for r in rows)
    out = {"tps": med("tokens_per_s"), "ms": med("step_ms"),
           "rss": max(r["rss_bytes"] for r in rows)}
    if "comm_bytes" in rows[0] and len(rows[0]["comm_bytes"]) > 0:
        out.update(bytes=med("comm_bytes", 0), comm_s=med("comm_s", 0), wait_s=med("comm_wait_s", 0))
    c = json.load(open(f"{w}/{d}.cpu"))["cpu"]  # per metrics line, each rank's CPU seconds
    per = [[b - a for a, b in zip(c[i - 1], c[i])] for i in range(max(warm, 1), len(c))]
    if per and all(x is not None for p in per for x in p):
        out["cpu_rank"] = statistics.median(statistics.mean(p) for p in per)
        out["cpu_all"] = statistics.median(sum(p) for p in per)
    return out
def stats(d):
    """the median over the rounds of each run's median; spread = the rounds' step ms"""
    runs = [stats1(f"{d}_r{r}") for r in range(1, rounds + 1)]
    out = {k: statistics.median(x[k] for x in runs if k in x) for k in runs[0] if k != "rss"}
    out["rss"] = max(x["rss"] for x in runs)
    out["spread"] = "/".join(f"{x['ms']:.0f}" for x in runs)
    return out
busy = float(load_before.split()[0]) > 0.5 or float(load_after.split()[0]) > 3.0
lines = [f"## Context parallelism ({datetime.date.today()})", "",
         f"`bash bench/bench_cp.sh`: byte-tiny (B 1, recompute {recompute}), {os.cpu_count()} cores; one process x 1 thread "
         "against `mpirun -np 2` x 1 thread with `parallel.cp=2`, full causal attention (flash). "
         f"{steps} steps per run; per run the median over the steps after the first {warm}; "
         f"{rounds} round(s) of the three runs interleaved, the table gives the median over "
         f"the rounds (step ms of each round in the last column). Bandwidth measured with loom's own calls between 2 ranks of this "
         f"machine (bench/bench_cp_bw.c, 32 MiB): send/recv {bw['p2p_GBps']:.2f} GB/s per direction, "
         f"all-to-all {bw['alltoall_GBps']:.2f} GB/s sent per rank. 1-minute load average "
         f"{load_before} before, {load_after} after"
         + (": the machine was shared with other work, so these are not quiet-machine figures." if busy else "."),
         "",
         "Comm bytes are everything rank 0 sends per step (attention and the gradient reduction "
         "over dp x cp) by loom's accounting; the bound is those bytes over the measured rate; "
         "comm time is start to completion of its messages (they overlap compute), wait is the "
         "time blocked in them. CPU s/step: each rank's CPU seconds per step (bench/step_cpu.py; "
         "the mean over the ranks, and all ranks together): what the step costs the machine, "
         "hardly changed by the load; a rank blocked in a message sleeps, so wait time is not in it, "
         "the copies of shared-memory transfers are.", "",
         "| T | run | tokens/s | vs cp 1 | step ms | CPU s/step per rank (all ranks) | peak RSS MiB | comm MB/step (attention share) | bound ms | comm ms | wait ms | rounds' step ms |",
         "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
cpu = lambda s: f"{s['cpu_rank']:.2f} ({s['cpu_all']:.2f})" if "cpu_rank" in s else "-"
for T in ts:
    base = stats(f"T{T}_cp1")
    lines.append(f"| {T} | cp 1 | {base['tps']:.0f} | 1.00 | {base['ms']:.0f} | {cpu(base)} | {base['rss']/2**20:.0f} | - | - | - | - | {base['spread']} |")
    for kind in ("ulysses", "ring"):
        s = stats(f"T{T}_{kind}")
        rate = (bw["alltoall_GBps"] if kind == "ulysses" else bw["p2p_GBps"]) * 1e9
        lines.append(f"| {T} | cp 2 {kind} | {s['tps']:.0f} | {s['tps']/base['tps']:.2f} | {s['ms']:.0f} | {cpu(s)} | "
                     f"{s['rss']/2**20:.0f} | {s['bytes']/1e6:.1f} ({attn_bytes(kind, T)/1e6:.1f}) | "
                     f"{s['bytes']/rate*1e3:.1f} | {s['comm_s']*1e3:.1f} | {s['wait_s']*1e3:.1f} | {s['spread']} |")
text = "\n".join(lines) + "\n"
print(text)
if write:
    sys.path.insert(0, "bench")
    from results_md import replace_section
    replace_section(text, "## Context parallelism")
PY
