# Inference loads hold what inference needs: the peak resident set of `loom generate` on a
# ~25M-parameter model stays within 1.3 x (parameters + KV cache) plus a fixed allowance for
# the binary, its libraries and the process' small buffers (FIXED_MIB, stated here; the test
# measures it on a tiny model and checks that it holds). Before the checkpoint reader streamed
# the piece file (parameters and both AdamW moments, 3x the parameters) it held it whole, and
# the peak was ~4x the parameters. See docs/checkpoints.md.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
FIXED_MIB=32
make_dataset "$WORK"

# peak RSS in bytes of one command (getrusage of the child)
peak_rss() {
  python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)' "$@"
}

# model NAME D LAYERS HEADS: one training step of a byte-level gpt2 -> run dir NAME
model() {
  make_config "$WORK" "$1.yaml" "$WORK/$1"
  expect_ok "train $1 (d $2, $3 layers)" "$LOOM_BIN" train "$1.yaml" --set model.d_model="$2" \
    --set model.n_layer="$3" --set model.n_head="$4" --set model.n_kv_head="$4" --set model.max_seq_len=256 \
    --set training.steps=1 --set training.batch_size=1 --set checkpoint.every=1 --set eval.every=0
}

model tiny 32 2 4
model big 512 8 8
# parameters (the param/ tensors of the piece file) and KV cache (2 x L x T x C floats)
sizes=$(python3 - "$WORK/big/ckpt/latest" <<'PY'
import glob, json, struct, sys
p = 0
for f in glob.glob(sys.argv[1] + "/rank_*.safetensors"):
    with open(f, "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    p += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k.startswith("param/"))
print(p, 2 * 8 * 256 * 512 * 4)
PY
)
read -r params kv <<<"$sizes"
[ "$params" -gt 20000000 ] || fail "the big model has only $params parameter bytes"

tiny=$(peak_rss "$LOOM_BIN" generate "$WORK/tiny" --prompt "the " --tokens 20 --temperature 0)
big=$(peak_rss "$LOOM_BIN" generate "$WORK/big" --prompt "the " --tokens 20 --temperature 0)
fixed=$((FIXED_MIB << 20))
echo "params $params B, kv cache $kv B, peak RSS: tiny model $tiny B, big model $big B"
[ "$tiny" -le "$fixed" ] || fail "generate on a tiny model peaks at $tiny B, over the ${FIXED_MIB} MiB allowance"
bound=$(python3 -c "print(int(1.3 * ($params + $kv)) + $fixed)")
[ "$big" -le "$bound" ] || fail "generate peaks at $big B, over 1.3 x (params $params + kv $kv) + ${FIXED_MIB} MiB = $bound"
pass "generate peak RSS $big B <= 1.3 x (params + KV cache) + ${FIXED_MIB} MiB = $bound B"
