#!/usr/bin/env bash
# Batched generation: `loom generate --prompts` (16 prompts of 16 bytes, greedy, TOKENS new
# tokens each) with the engine at batch 16 against one request at a time (--batch 1), and
# transformers' generate(do_sample=False) on the same weights (`loom export --hf`) at batch 1
# and 16, the same thread count (OMP_NUM_THREADS, default 2). A 1-step checkpoint: speed does
# not depend on the weights. Median of REPEAT runs.
#   bash bench/bench_infer.sh [--write]   (--write replaces the section in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
TOKENS=${TOKENS:-64}
REPEAT=${REPEAT:-3}
CFGS=${CFGS:-"byte-tiny gpt2-small"}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
W=$(mktemp -d /tmp/loom-bench-infer.XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 -c "
import random
random.seed(1)
for i in range(16): print(''.join(random.choice('abcdefghijklmnopqrstuvwxyz ') for _ in range(16)))" > "$W/prompts.txt"
for cfg in $CFGS; do
  "$LOOM" train configs/$cfg.yaml --set run.dir="$W/$cfg" --set training.steps=1 \
    --set checkpoint.every=1 --set data.val= --set training.peak_flops=1e11 2>/dev/null
  "$LOOM" export --hf "$W/$cfg" "$W/$cfg.hf" >/dev/null 2>&1 || echo "export failed: no transformers column" >&2
  for b in 16 1; do
    for r in $(seq "$REPEAT"); do
      "$LOOM" generate "$W/$cfg" --prompts "$W/prompts.txt" --tokens "$TOKENS" --temperature 0 \
        --batch $b --stats 2>&1 >/dev/null | sed -n 's/.*(\([0-9.]*\) tokens\/s.*/\1/p' >> "$W/$cfg.b$b"
    done
  done
done
python3 - "$W" "$TOKENS" "$REPEAT" "${1:-}" $CFGS <<'PY'
import datetime, os, statistics, sys, time
w, tokens, repeat, write, cfgs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "--write", sys.argv[5:]
def hf_rate(d, batch):
    try:
        import torch, transformers
    except ImportError:
        return None
    if not os.path.isdir(d):
        return None
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    m = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    ids = torch.randint(0, 250, (batch, 16), generator=torch.Generator().manual_seed(0))
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, pad_token_id=0)
        rates.append(batch * (out.shape[1] - 16) / (time.perf_counter() - t0))
    return statistics.median(rates)
lines = [f"## Batched generation ({datetime.date.today()})", "",
         f"`bash bench/bench_infer.sh`: 16 prompts of 16 bytes, greedy, {tokens} new tokens each, "
         f"{os.environ['OMP_NUM_THREADS']} threads, median of {repeat} runs. loom: `loom generate --prompts` "
         "at `--batch 16` and `--batch 1` (one request at a time); transformers: `generate(do_sample=False)` "
         "on the same weights (`loom export --hf`) at batch 16 and 1.", "",
         "| model | loom b16 tok/s | loom b1 tok/s | b16/b1 | HF b16 tok/s | HF b1 tok/s | loom/HF b16 | loom/HF b1 |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
for c in cfgs:
    a = statistics.median(float(x) for x in open(f"{w}/{c}.b16"))
    b = statistics.median(float(x) for x in open(f"{w}/{c}.b1"))
    h16, h1 = hf_rate(f"{w}/{c}.hf", 16), hf_rate(f"{w}/{c}.hf", 1)
    f = lambda x: f"{x:.1f}" if x else "n/a"
    r = lambda x, y: f"{x / y:.2f}x" if y else "n/a"
    lines.append(f"| {c} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {f(h16)} | {f(h1)} | {r(a, h16)} | {r(b, h1)} |")
lines.append(f"\nLoad average at the end: {open('/proc/loadavg').read().split()[:3]}.")
text = "\n".join(lines) + "\n"
print(text)
if write:
    import re
    p = "bench/RESULTS.md"
    s = open(p).read()
    s2 = re.sub(r"## Batched generation \(.*?\)\n.*?(?=\n## |\Z)", text.rstrip("\n") + "\n", s, flags=re.S)
    if s2 == s:
        s2 = s.rstrip("\n") + "\n\n" + text
    open(p, "w").write(s2)
PY
