#!/usr/bin/env bash
# LoRA against full fine-tuning on gpt2-small (124M), both started with training.init_from from
# the same base checkpoint, and loom's LoRA against PyTorch + PEFT on the same model (the base
# exported with `loom export --hf`), same thread count and targets (attention q, k, v, o and
# the MLP; PEFT adapts GPT-2's fused c_attn as one matrix).
# The three runs are interleaved, ROUNDS times (the order rotated each round), so that a
# machine whose load changes weighs on all of them alike; the load average is sampled before
# every run. Per run: median tokens/s over the steps after WARM; peak RSS (loom: the largest
# rss_bytes in metrics.jsonl; PyTorch: ru_maxrss). Reported: the median over the rounds of
# each, the ratios of the medians, and the range of the rounds.
#   bash bench/bench_lora.sh [--write]   (--write replaces the section in bench/RESULTS.md)
#   env: ROUNDS (5), STEPS (4), WARM (1), THREADS (1), RANK (8), BATCH (1), SEQ (256)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-4}
WARM=${WARM:-1}
THREADS=${THREADS:-1}
RANK=${RANK:-8}
BATCH=${BATCH:-1}
SEQ=${SEQ:-256}
W=$(mktemp -d /tmp/loom-bench-lora.XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
COMMON=(--set data.val= --set checkpoint.every=0 --set training.log_every=1000
        --set training.threads=$THREADS --set training.batch_size=$BATCH --set training.seq_len=$SEQ)
# the base: gpt2-small after one step (a complete checkpoint to start from)
"$LOOM" train configs/gpt2-small.yaml "${COMMON[@]}" --set run.dir="$W/base" \
  --set training.steps=1 --set checkpoint.every=1 2>/dev/null
"$LOOM" export --hf "$W/base" "$W/hf" >/dev/null
cat >"$W/peft_run.py" <<'PY'
import json, resource, sys, time, statistics
import torch, transformers, peft
hf, steps, warm, threads, r, B, T = sys.argv[1], *map(int, sys.argv[2:])
torch.set_num_threads(threads)
transformers.logging.set_verbosity_error()
m = transformers.AutoModelForCausalLM.from_pretrained(hf)
m = peft.get_peft_model(m, peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, fan_in_fan_out=True,
                                          target_modules=["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]))
opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
x = torch.randint(0, 256, (B, T + 1))
tps = []
for s in range(steps):
    t0 = time.perf_counter()
    out = m(x[:, :-1], labels=x[:, 1:].clone())
    # transformers shifts labels itself; the cost per step is what matters here
    out.loss.backward(); opt.step(); opt.zero_grad()
    tps.append(B * T / (time.perf_counter() - t0))
print(json.dumps({"tps": statistics.median(tps[warm:]), "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
PY

run_full() {
  "$LOOM" train configs/gpt2-small.yaml "${COMMON[@]}" --set run.dir="$W/full_$1" \
    --set training.init_from="$W/base" --set training.steps=$STEPS 2>/dev/null
}
run_lora() {
  "$LOOM" train configs/gpt2-small.yaml "${COMMON[@]}" --set run.dir="$W/lora_$1" \
    --set training.init_from="$W/base" --set training.steps=$STEPS --set finetune.lora.rank=$RANK \
    --set finetune.lora.alpha=$((2 * RANK)) --set "finetune.lora.targets=[q, k, v, o, fc, fc_proj]" \
    2>"$W/lora.log"
  grep -o "lora: .*" "$W/lora.log" >"$W/lora_line" || true
}
run_peft() {
  python3 "$W/peft_run.py" "$W/hf" "$STEPS" "$WARM" "$THREADS" "$RANK" "$BATCH" "$SEQ" >"$W/peft_$1.json"
}
KINDS=(full lora peft)
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < 3; k++)); do
    kind=${KINDS[$(((r + k) % 3))]}
    cut -d' ' -f1 /proc/loadavg >>"$W/loads"
    echo "round $((r + 1))/$ROUNDS: $kind (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    "run_$kind" "$r"
  done
done

python3 - "$W" "$WARM" "$THREADS" "$RANK" "$ROUNDS" "$BATCH" "$SEQ" "${1:-}" <<'PY'
import datetime, json, os, statistics, sys
w, warm, threads, rank, rounds, B, T = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7]
write = sys.argv[8] == "--write"
def loom_run(d):
    rows = [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
    return statistics.median(r["tokens_per_s"] for r in rows[warm:]), max(r.get("rss_bytes", 0) for r in rows)
res = {"full": [], "lora": [], "peft": []}
for r in range(rounds):
    res["full"].append(loom_run(f"full_{r}"))
    res["lora"].append(loom_run(f"lora_{r}"))
    pe = json.load(open(f"{w}/peft_{r}.json"))
    res["peft"].append((pe["tps"], pe["rss"]))
med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
rng = {k: (min(x[0] for x in v), max(x[0] for x in v)) for k, v in res.items()}
loads = [float(x) for x in open(f"{w}/loads").read().split()]
line = open(f"{w}/lora_line").read().strip()
def row(name, k):
    return f"| {name} | {med[k][0]:.0f} | {rng[k][0]:.0f}-{rng[k][1]:.0f} | {med[k][1] / 1e6:.0f} |"
md = f"""## LoRA vs full fine-tuning

`bash bench/bench_lora.sh` ({datetime.date.today()}, {os.cpu_count()} cores shared with other
jobs, {threads} thread(s) per run). The machine was loaded: 1-minute load average sampled before
each of the {3 * rounds} runs: median {statistics.median(loads):.1f}, range {min(loads):.1f}-{max(loads):.1f}
on {os.cpu_count()} cores, so absolute figures are far below what the cores give alone; the three
runs were interleaved {rounds} times (order rotated each round) so the ratios compare like with
like. gpt2-small (124M) at batch {B} x {T}, both loom runs from the same base with
`training.init_from`; LoRA rank {rank}, alpha {2 * int(rank)}, targets q, k, v, o, fc, fc_proj.
PyTorch + PEFT: the same base exported with `loom export --hf`, PEFT LoRA on c_attn, attn.c_proj,
c_fc, mlp.c_proj, AdamW on the adapters, same threads. tokens/s: per run the median over the
steps after the first {warm}, then the median over the {rounds} rounds (range: the rounds' lowest
and highest: a wide range is the load changing between rounds, which hits the three runs of a
round alike); peak RSS: loom's largest `rss_bytes`, PyTorch's ru_maxrss (median over rounds).
{line}

| run | tokens/s (median) | tokens/s (range) | peak RSS (MB) |
|---|---:|---:|---:|
{row("loom full fine-tuning", "full")}
{row("loom LoRA", "lora")}
{row("PyTorch + PEFT LoRA", "peft")}

Ratios of the medians: loom LoRA / loom full fine-tuning = {med['lora'][0] / med['full'][0]:.2f}x
tokens/s, {med['lora'][1] / med['full'][1]:.2f}x peak RSS; loom LoRA / PyTorch + PEFT =
{med['lora'][0] / med['peft'][0]:.2f}x tokens/s, {med['lora'][1] / med['peft'][1]:.2f}x peak RSS.
"""
print(md)
if write:
    p = "bench/RESULTS.md"
    s = open(p).read()
    start = s.find("## LoRA vs full fine-tuning")
    if start >= 0:
        end = s.find("\n## ", start + 5)
        s = s[:start] + md + (s[end + 1:] if end >= 0 else "")
    else:
        s = s.rstrip("\n") + "\n\n" + md
    open(p, "w").write(s)
PY
