"""Batched greedy generation against Hugging Face `transformers` on the same weights, 64 tokens:
tiny random GPT2LMHeadModel and LlamaForCausalLM (GQA) with perturbed parameters, imported with
`loom import --hf --tokenizer byte`; 8 prompts of different lengths through
`loom generate --prompts --batch 4` (continuous batching: prompts join as others finish) must
give, for every prompt, the tokens of transformers' generate(do_sample=False) on that prompt
alone."""
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_tiny import tiny_model  # noqa: E402
from loomlib import expect, finish  # noqa: E402

LOOM = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(__file__), "../../build/loom")
torch.set_num_threads(2)
N = 64


def main():
    prompts = ["a", "the quick brown fox", "12+34", "hello world, this is a longer prompt",
               "xyz", "lorem ipsum dolor", "Q: ", "end"]
    with tempfile.TemporaryDirectory() as work:
        pf = os.path.join(work, "prompts.txt")
        with open(pf, "w") as f:
            f.write("\n".join(prompts) + "\n")
        for flavor in ("gpt2", "llama"):
            torch.manual_seed(0)
            model = tiny_model(flavor)
            src = os.path.join(work, f"hf_{flavor}")
            model.save_pretrained(src, safe_serialization=True)
            ck = os.path.join(work, f"ck_{flavor}")
            r = subprocess.run([LOOM, "import", "--hf", src, ck, "--tokenizer", "byte"],
                               capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(r.stderr)
            r = subprocess.run([LOOM, "generate", ck, "--prompts", pf, "--tokens", str(N),
                                "--temperature", "0", "--batch", "4", "--format", "ids"],
                               capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(r.stderr)
            rows = [json.loads(l) for l in r.stdout.splitlines()]
            same = 0
            for p, row in zip(prompts, rows):
                ids = list(p.encode())
                with torch.no_grad():
                    out = model.generate(torch.tensor([ids]), max_new_tokens=N, min_new_tokens=N,
                                         do_sample=False, pad_token_id=0, eos_token_id=None)
                want = out[0, len(ids):].tolist()
                same += row["ids"] == want
                expect(f"{flavor} {p!r}: {N} greedy tokens equal transformers'", row["ids"] == want,
                       f"{row['ids'][:16]}... vs {want[:16]}...")
            print(f"{flavor}: {same} of {len(prompts)} prompts equal transformers for {N} tokens")
    sys.exit(finish())


if __name__ == "__main__":
    main()
