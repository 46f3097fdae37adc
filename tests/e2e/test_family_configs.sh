# Every family's example config (configs/<family>-tiny.yaml, docs/architectures.md) trains:
# a few steps on the e2e dataset (the configs' own sizes and architecture; shorter sequences,
# a larger learning rate), the loss goes down, `loom generate` decodes from the checkpoint
# (KV cache), and `loom export --hf` writes the family's Hugging Face architecture; the
# sliding-window families (mistral, gemma3) also serve a greedy completion longer than their
# window equal to `loom generate`'s.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
for fam in llama3:LlamaForCausalLM mistral:MistralForCausalLM qwen2:Qwen2ForCausalLM \
           qwen3:Qwen3ForCausalLM phi3:Phi3ForCausalLM mixtral:MixtralForCausalLM \
           qwen3moe:Qwen3MoeForCausalLM qwen2moe:Qwen2MoeForCausalLM olmo2:Olmo2ForCausalLM \
           gemma2:Gemma2ForCausalLM gemma3:Gemma3ForCausalLM; do
  name=${fam%%:*} arch=${fam#*:}
  run=$WORK/run_$name
  extra=() # Gemma's windows (64) inside the 32 positions trained here
  case $name in gemma*) extra=(--set model.arch.sliding_window=12) ;; esac
  expect_ok "train configs/$name-tiny.yaml" "$LOOM_BIN" train "$LOOM_SRC/configs/$name-tiny.yaml" \
    --set run.dir="$run" --set data.train="$WORK/data/train" --set data.val="$WORK/data/val" \
    --set training.steps=8 --set training.seq_len=32 --set training.batch_size=2 \
    --set training.lr=3e-3 --set training.warmup=1 --set eval.every=0 --set checkpoint.every=8 \
    "${extra[@]}"
  python3 - "$run/metrics.jsonl" <<'PY' || fail "$name: loss did not go down"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 8 and all(math.isfinite(r["loss"]) for r in rows), rows
assert rows[-1]["loss"] < rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
PY
  expect_ok "$name: generate" "$LOOM_BIN" generate "$run" --prompt "the " --tokens 8 --seed 1
  [[ "$(cat "$WORK/out.txt")" == "the "* ]] || fail "$name generate output: $(cat "$WORK/out.txt")"
  expect_ok "$name: export --hf" "$LOOM_BIN" export --hf "$run" "$WORK/hf_$name"
  grep -q "\"$arch\"" "$WORK/hf_$name/config.json" || fail "$name: export wrote $(grep -A1 architectures "$WORK/hf_$name/config.json")"
  if [ $name = mistral ]; then # its sliding window (24 < the 32 positions trained here)
    grep -q '"sliding_window": 24' "$WORK/hf_$name/config.json" || fail "mistral: export lost sliding_window"
  fi
  if [ $name = gemma2 ] || [ $name = gemma3 ]; then # the window and its layers, Gemma's keys
    python3 - "$WORK/hf_$name/config.json" $name <<'PY' || fail "$name: export wrote $(cat "$WORK/hf_$name/config.json")"
import json, sys
c, name = json.load(open(sys.argv[1])), sys.argv[2]
S, F = "sliding_attention", "full_attention"
assert c["sliding_window"] == 12 and c["hidden_activation"] == "gelu_pytorch_tanh", c
assert c["layer_types"] == ([S, F] * 2 if name == "gemma2" else [S] * 5 + [F]), c["layer_types"]
if name == "gemma2":
    assert c["attn_logit_softcapping"] == 50 and c["final_logit_softcapping"] == 30, c
else:
    rp = c["rope_parameters"]
    assert rp["sliding_attention"]["rope_theta"] == 10000 and rp["full_attention"]["rope_theta"] == 1e6, rp
PY
  fi
  if [ $name = gemma3 ] || [ $name = mistral ]; then # serve past the window: the ring caches
    want=$("$LOOM_BIN" generate "$run" --prompt "the " --tokens 24 --temperature 0)
    rm -f "$WORK/port"
    start_server "$WORK/port" "$WORK/serve.err" "$LOOM_BIN" serve "$run" --port 0 --port-file "$WORK/port"
    python3 - "$(cat "$WORK/port")" "$want" <<'PY' || { cat "$WORK/serve.err" >&2; fail "$name: serve"; }
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions",
    data=json.dumps({"prompt": "the ", "max_tokens": 24, "temperature": 0}).encode(),
    headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=60))
got = "the " + r["choices"][0]["text"]
assert r["usage"]["completion_tokens"] == 24 and got == sys.argv[2], (got, sys.argv[2])
PY
    kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true
    pass "$name: loom serve completes past its window as loom generate does"
  fi
  pass "$name: trains (loss down), generates, exports as $arch"
done
