"""The same tiny GRPO run in loom and in TRL's GRPOTrainer (bench/RESULTS.md, "GRPO").

  bench_grpo.py CKPT CALC_DIR TEMPLATE [--steps N] [--prompts B] [--gens G]

CKPT: a loom checkpoint of the calculator tool-use model (tests/e2e/test_tooluse.sh's SFT run,
e.g. its step-500 checkpoint), CALC_DIR: `tooluse.py gen`'s directory (train.jsonl), TEMPLATE:
its chat template file. Both sides run GRPO from the same weights on the same prompts (the
first B x N training conversations, rendered "U:<prompt>\\nA:"), G completions each, sampled at
temperature 1 up to the end of the line (loom: the template's end marker "\\n"; TRL: "\\n" as
the tokenizer's end-of-text), at most 64 tokens, the exact-call reward, lr 3e-4 constant,
beta 0, loss_type dapo, one update per batch, fp32 on the CPU. TRL's rollouts are
transformers' generate on the model being trained (GRPOTrainer without vLLM); loom's are its
batched engine on the trainer's weights.

Printed per side: rollout tokens/s (generated tokens / rollout seconds), update tokens/s (the
positions forward and backward ran over: rows x padded length, / update seconds), wall
seconds per step, and the mean reward of the first and last steps. TRL's rollout time is the
time in model.generate (wrapped); its update time is the rest of each step.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOOM = os.environ.get("LOOM_BIN") or os.path.join(HERE, "..", "build", "loom")


def prompts(calc, n):
    out = []
    for line in open(os.path.join(calc, "train.jsonl")):
        m = json.loads(line)["messages"]
        f = m[1]["tool_calls"][0]["function"]
        out.append((m[0]["content"], {"name": f["name"], "arguments": json.loads(f["arguments"])}))
        if len(out) == n:
            break
    return out


def exact(reply, want):
    try:
        return 1.0 if json.loads(reply.strip().split("\n")[0]) == want else 0.0
    except Exception:
        return 0.0


def loom_side(a, work):
    rows = prompts(a.calc, a.prompts * a.steps)
    with open(os.path.join(work, "p.jsonl"), "w") as f:
        for p, call in rows:
            tc = {"type": "function", "function": {"name": call["name"],
                                                    "arguments": json.dumps(call["arguments"])}}
            f.write(json.dumps({"messages": [{"role": "user", "content": p},
                                             {"role": "assistant", "content": None,
                                              "tool_calls": [tc]}]}) + "\n")
    open(os.path.join(work, "r.yaml"), "w").write(f"""name: p
sources:
  - {{name: p, kind: chat, path: {work}/p.jsonl, template: {a.template}, pack: false}}
tokenizer: byte
seq_len: 96
shard_tokens: 96000
val_fraction: 0
output: {work}/data
""")
    subprocess.run([LOOM, "data", "build", os.path.join(work, "r.yaml")], check=True,
                   capture_output=True)
    open(os.path.join(work, "g.yaml"), "w").write(f"""run: {{dir: {work}/run}}
data: {{train: {work}/data/train, shuffle: false}}
finetune:
  method: grpo
  template: {a.template}
  num_generations: {a.gens}
  max_completion_tokens: 64
  rewards: [tool_call]
training: {{init_from: {a.ckpt}, steps: {a.steps}, batch_size: {a.prompts}, seq_len: 96, lr: 3e-4,
           warmup: 0, schedule: constant, weight_decay: 0, grad_clip: 1.0, seed: 1}}
eval: {{every: 0}}
""")
    t0 = time.time()
    subprocess.run([LOOM, "train", os.path.join(work, "g.yaml")], check=True, capture_output=True)
    wall = time.time() - t0
    m = [json.loads(l) for l in open(os.path.join(work, "run", "metrics.jsonl"))]
    gen = sum(r["completions/mean_length"] * a.prompts * a.gens for r in m)
    ro = sum(r["rollout_s"] for r in m)
    up = sum(r["update_s"] for r in m)
    return {"rollout_tok_s": gen / ro, "update_tok_s": a.prompts * a.gens * 96 * len(m) / up,
            "s_per_step": wall / len(m), "reward_first": m[0]["reward"],
            "reward_last": m[-1]["reward"]}


def trl_side(a, work):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer
    torch.manual_seed(1)
    hf = os.path.join(work, "hf")
    subprocess.run([LOOM, "export", "--hf", a.ckpt, hf], check=True, capture_output=True)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(hf, "tokenizer.json"))
    tok.eos_token = tok.convert_ids_to_tokens(10)  # "\n": the end of the call's line
    tok.pad_token = tok.convert_ids_to_tokens(0)
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32)
    model.generation_config.eos_token_id = 10
    rows = prompts(a.calc, a.prompts * a.steps)
    ds = Dataset.from_list([{"prompt": f"U:{p}\nA:", "want": json.dumps(c)} for p, c in rows])

    def reward(completions, want, **kw):
        return [exact(c, json.loads(w)) for c, w in zip(completions, want)]

    stats = {"gen_s": 0.0, "gen_tok": 0}
    orig = model.generate

    def timed(*args, **kw):
        t = time.time()
        out = orig(*args, **kw)
        stats["gen_s"] += time.time() - t
        n_in = (kw.get("input_ids") if "input_ids" in kw else args[0]).shape[1]
        stats["gen_tok"] += int((out[:, n_in:] != tok.pad_token_id).sum())
        return out

    model.generate = timed
    cfg = GRPOConfig(output_dir=os.path.join(work, "trl"), per_device_train_batch_size=a.prompts * a.gens,
                     num_generations=a.gens, max_completion_length=64, max_steps=a.steps,
                     learning_rate=3e-4, lr_scheduler_type="constant", warmup_steps=0,
                     weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, report_to=[],
                     use_cpu=True, temperature=1.0, beta=0.0, loss_type="dapo",
                     save_strategy="no", seed=1, shuffle_dataset=False)
    tr = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                     processing_class=tok)
    t0 = time.time()
    tr.train()
    wall = time.time() - t0
    logs = [h for h in tr.state.log_history if "reward" in h]
    # the update runs over prompt + completion, padded: B x G rows of (its prompt + 64) at most
    lens = [h.get("completions/mean_length", 0) for h in logs]
    pos = sum(a.prompts * a.gens * (30 + l) for l in lens)
    return {"rollout_tok_s": stats["gen_tok"] / stats["gen_s"],
            "update_tok_s": pos / max(wall - stats["gen_s"], 1e-9), "s_per_step": wall / a.steps,
            "reward_first": logs[0]["reward"], "reward_last": logs[-1]["reward"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ckpt")
    p.add_argument("calc")
    p.add_argument("template")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--gens", type=int, default=8)
    a = p.parse_args()
    a.template = os.path.abspath(a.template)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as work:
        res = {"loom": loom_side(a, work), "trl": trl_side(a, work)}
    print(f"GRPO, {a.steps} steps of {a.prompts} prompts x {a.gens} completions "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '?')}, load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f})")
    print("| | rollout tokens/s | update tokens/s | s/step | reward first -> last step |")
    print("|---|---|---|---|---|")
    for k, r in res.items():
        print(f"| {k} | {r['rollout_tok_s']:.0f} | {r['update_tok_s']:.0f} | {r['s_per_step']:.2f} |"
              f" {r['reward_first']:.3f} -> {r['reward_last']:.3f} |")
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
