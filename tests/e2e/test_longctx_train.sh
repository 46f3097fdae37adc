# model.loss_chunk and model.recompute through `loom train` (the trainer's step, DP engine and
# AdamW): 6 steps with the LM head chunked (7 tokens per chunk: a partial last chunk) match the
# unfused run within 1e-5 (the head's GEMMs are cut differently), recompute full and selective
# match none bitwise (the same arithmetic), and each run's activation arena (act_bytes in
# metrics.jsonl) is smaller: none > selective > full, unfused > chunked. Both flavors, with and
# without document masking. Bad values of the keys are errors naming the key.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"

check() { # check BASE OTHER MAX_REL: losses / grad norms / val losses within MAX_REL (0: equal)
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
b = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
assert len(a) == len(b) == 6, (len(a), len(b))
keys = ["loss", "grad_norm", "val_loss"]
worst = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b) for k in keys if k in x)
print(f"{sys.argv[2].rsplit('/', 1)[1]}: worst relative difference {worst:.2e}; act_bytes "
      f"{a[0]['act_bytes']} -> {b[0]['act_bytes']}")
tol = float(sys.argv[3])
sys.exit(0 if (worst == 0 if tol == 0 else worst < tol) and b[0]["act_bytes"] < a[0]["act_bytes"]
         else 1)
PY
}

for flavor in gpt2 llama; do
  for dm in false true; do
    export FLAVOR=$flavor KVH=$([ $flavor = llama ] && echo 2 || echo 4)
    tag=${flavor}_dm$dm
    common=(--set training.steps=6 --set checkpoint.every=0 --set eval.every=3
            --set model.doc_mask=$dm)
    run() { # run NAME --set ...
      local name=$1; shift
      make_config "$WORK" "$WORK/$name.yaml" "$WORK/${name}_$tag"
      expect_ok "$tag: $name" "$LOOM_BIN" train "$WORK/$name.yaml" "${common[@]}" "$@"
    }
    run base
    run chunk --set model.loss_chunk=7
    run full --set model.recompute=full
    run selective --set model.recompute=selective
    check "$WORK/base_$tag" "$WORK/chunk_$tag" 1e-5 || fail "$tag: loss_chunk differs from unfused"
    check "$WORK/base_$tag" "$WORK/full_$tag" 0 || fail "$tag: recompute full differs from none"
    check "$WORK/base_$tag" "$WORK/selective_$tag" 0 ||
      fail "$tag: recompute selective differs from none"
    check "$WORK/selective_$tag" "$WORK/full_$tag" 0 || fail "$tag: full not below selective"
    pass "$tag: loss_chunk == unfused, recompute full/selective == none, smaller arenas"
  done
done

make_config "$WORK" "$WORK/bad.yaml" "$WORK/bad"
expect_fail "model.recompute: unknown mode" "model.recompute' = 'some'.*none, full or selective" \
  "$LOOM_BIN" train "$WORK/bad.yaml" --set model.recompute=some
expect_fail "model.loss_chunk: negative" "model.loss_chunk" \
  "$LOOM_BIN" train "$WORK/bad.yaml" --set model.loss_chunk=-1
