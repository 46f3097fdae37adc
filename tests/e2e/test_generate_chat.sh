# loom generate --chat: the prompt becomes a user turn of the chat template followed by the
# assistant's opening, the reply is printed without the prompt, and it stops at the assistant's
# end-of-turn marker.
source "$(dirname "$0")/lib.sh"
python3 - "$WORK/hf" <<'PY'
import sys, torch, transformers
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                               tie_word_embeddings=False)
transformers.LlamaForCausalLM(cfg).save_pretrained(sys.argv[1])
PY
expect_ok "import a byte-level model" "$LOOM_BIN" import --hf "$WORK/hf" "$WORK/ck" --tokenizer byte
q='what is 2 plus 3?'
for tpl in chatml llama3; do
  if [ $tpl = chatml ]; then
    printf -v rendered '<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$q"
  else
    printf -v rendered '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n' "$q"
  fi
  a=$("$LOOM_ASAN_BIN" generate "$WORK/ck" --chat --template $tpl --system "be brief" --prompt "$q" \
      --temperature 0 --tokens 12 --format ids)
  b=$("$LOOM_BIN" generate "$WORK/ck" --prompt "$rendered" --temperature 0 --tokens 12 --format ids)
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$tpl: --chat ids '$a' differ from the rendered prompt's '$b'"
  pass "$tpl: --chat generates from the template's rendering ($a)"
done
# text mode: only the reply (no echo of the prompt)
out=$("$LOOM_BIN" generate "$WORK/ck" --chat --prompt "$q" --temperature 0 --tokens 8)
case "$out" in *"im_start"*|*"$q"*) fail "--chat echoed the prompt: $out";; esac
pass "--chat prints the reply only"
expect_fail "an unknown template file" "chat template" \
  "$LOOM_BIN" generate "$WORK/ck" --chat --template "$WORK/nope.json" --prompt hi
echo '{"user": "{content}"}' > "$WORK/bad.json"
expect_fail "a template file without every role" "'system' is missing" \
  "$LOOM_BIN" generate "$WORK/ck" --chat --template "$WORK/bad.json" --prompt hi
echo "all generate --chat tests passed"
