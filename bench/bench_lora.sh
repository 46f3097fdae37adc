#!/usr/bin/env bash
# LoRA against full fine-tuning on gpt2-small (124M, seq 256, batch 4), both started with
# training.init_from from the same base checkpoint, and loom's LoRA against PyTorch + PEFT on
# the same model (the base exported with `loom export --hf`), same thread count and targets
# (attention q, k, v, o and the MLP; PEFT adapts GPT-2's fused c_attn as one matrix).
# Per run: median tokens/s over the steps after WARM; peak RSS (loom: the largest rss_bytes in
# metrics.jsonl; PyTorch: ru_maxrss).
#   bash bench/bench_lora.sh [--write]   (--write replaces the section in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
STEPS=${STEPS:-12}
WARM=${WARM:-3}
THREADS=${THREADS:-2}
RANK=${RANK:-8}
W=$(mktemp -d /tmp/loom-bench-lora.XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
COMMON=(--set data.val= --set checkpoint.every=0 --set training.log_every=1000
        --set training.threads=$THREADS --set training.batch_size=4 --set training.seq_len=256)
# the base: gpt2-small after one step (a complete checkpoint to start from)
OMP_NUM_THREADS=$THREADS "$LOOM" train configs/gpt2-small.yaml "${COMMON[@]}" --set run.dir="$W/base" \
  --set training.steps=1 --set checkpoint.every=1 2>/dev/null
"$LOOM" export --hf "$W/base" "$W/hf" >/dev/null
cut -d' ' -f1-3 /proc/loadavg >"$W/load_before"
OMP_NUM_THREADS=$THREADS "$LOOM" train configs/gpt2-small.yaml "${COMMON[@]}" --set run.dir="$W/full" \
  --set training.init_from="$W/base" --set training.steps=$STEPS 2>/dev/null
OMP_NUM_THREADS=$THREADS "$LOOM" train configs/gpt2-small.yaml "${COMMON[@]}" --set run.dir="$W/lora" \
  --set training.init_from="$W/base" --set training.steps=$STEPS --set finetune.lora.rank=$RANK \
  --set finetune.lora.alpha=$((2 * RANK)) --set "finetune.lora.targets=[q, k, v, o, fc, fc_proj]" 2>"$W/lora.log"
grep -o "lora: .*" "$W/lora.log" >"$W/lora_line" || true
python3 - "$W/hf" "$STEPS" "$WARM" "$THREADS" "$RANK" >"$W/peft.json" <<'PY'
import json, resource, sys, time, statistics
import torch, transformers, peft
hf, steps, warm, threads, r = sys.argv[1], *map(int, sys.argv[2:])
torch.set_num_threads(threads)
transformers.logging.set_verbosity_error()
m = transformers.AutoModelForCausalLM.from_pretrained(hf)
m = peft.get_peft_model(m, peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, fan_in_fan_out=True,
                                          target_modules=["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]))
opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
x = torch.randint(0, 256, (4, 257))
tps = []
for s in range(steps):
    t0 = time.perf_counter()
    out = m(x[:, :-1], labels=x[:, 1:].clone())
    # transformers shifts labels itself; the cost per step is what matters here
    out.loss.backward(); opt.step(); opt.zero_grad()
    tps.append(4 * 256 / (time.perf_counter() - t0))
print(json.dumps({"tps": statistics.median(tps[warm:]), "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
PY
cut -d' ' -f1-3 /proc/loadavg >"$W/load_after"
python3 - "$W" "$WARM" "$THREADS" "$RANK" "${1:-}" <<'PY'
import datetime, json, os, statistics, sys
w, warm, threads, rank, write = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "--write"
def run(d):
    rows = [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
    return statistics.median(r["tokens_per_s"] for r in rows[warm:]), max(r.get("rss_bytes", 0) for r in rows)
full, lora = run("full"), run("lora")
pe = json.load(open(f"{w}/peft.json"))
lb, la = (open(f"{w}/load_{k}").read().strip() for k in ("before", "after"))
line = open(f"{w}/lora_line").read().strip()
md = f"""## LoRA vs full fine-tuning

`bash bench/bench_lora.sh` ({datetime.date.today()}, {os.cpu_count()} cores, {threads} threads, load
average {lb} before, {la} after). gpt2-small (124M) at batch 4 x 256, both runs from the same
base with `training.init_from`; LoRA rank {rank}, alpha {2 * int(rank)}, targets q, k, v, o, fc,
fc_proj. PyTorch + PEFT: the same base exported with `loom export --hf`, PEFT LoRA on c_attn,
attn.c_proj, c_fc, mlp.c_proj, AdamW on the adapters, same threads. tokens/s: median over the
steps after the first {warm}; peak RSS: loom's largest `rss_bytes`, PyTorch's ru_maxrss.
{line}

| run | tokens/s | peak RSS (MB) |
|---|---:|---:|
| loom full fine-tuning | {full[0]:.0f} | {full[1] / 1e6:.0f} |
| loom LoRA | {lora[0]:.0f} | {lora[1] / 1e6:.0f} |
| PyTorch + PEFT LoRA | {pe['tps']:.0f} | {pe['rss'] / 1e6:.0f} |
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
