#!/usr/bin/env bash
# --weights int8's and int4's quality (docs/inference.md "Weights in int8", "Weights in int4"):
# a small Llama (d_model 256, d_ff 512: every linear's input width a multiple of 256, so int4
# holds them all in Q4_K) trained here for 120 steps on the e2e corpus (sequences of 32); on
# held-out text of the same kind (words drawn with another seed; windows of 32 tokens), for
# each of int8 and int4 against fp32, all from the next-token logits of loom_model_decode_batch
# (the step `loom generate` runs: one token per step through the KV cache, through libloom):
# the perplexity, the mean KL divergence of the next-token distributions and how often the top
# tokens (each position's greedy choice) agree (llama.cpp's quality figures). Bounds:
# perplexity within 1% (int8) / 5% (int4) of fp32's (and fp32's below 8, so the model has
# learned the corpus: the byte-uniform perplexity is 256), mean KL at most 0.002 / 0.02, the
# greedy token the same at 95% / 90% of the positions at least. Observed at avx512, avx2 and
# x86-64: int8 within 0.04% of fp32's perplexity, KL under 0.00001, 100% the same token; int4
# within 0.08%, KL 0.00003-0.00004, 99.7%. The free-running greedy continuation of an 8-byte
# prompt over 64 tokens is printed, not bounded: this model's text has near-ties (" while" or
# " wizards"), and one flipped token sends the continuations apart (at avx2 int8's and int4's
# from the second token on, at x86-64 int4's from the eleventh). The corpus is nearly deterministic
# text, so these figures say that quantization does not move a trained model's confident
# predictions, not what it costs a large model (see docs/inference.md). Then `loom generate --weights int8|int4` must give the same 64 greedy
# tokens as the decode above (the CLI's path). The figures are printed.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
make_dataset "$WORK"
FLAVOR=llama KVH=2 make_config "$WORK" "$WORK/llama.yaml" "$WORK/run"
t0=$SECONDS
expect_ok "train (120 steps)" "$LOOM_BIN" train "$WORK/llama.yaml" --set training.steps=120 \
  --set training.schedule_steps=120 --set training.batch_size=8 --set eval.every=1000 \
  --set checkpoint.every=120 --set model.max_seq_len=96 --set model.d_model=256 --set model.d_ff=512
echo "trained in $((SECONDS - t0)) s"
python3 - "$WORK/run" <<'PY' || fail "int8 quality out of bounds"
import ctypes, json, math, os, random, sys
P = ctypes.c_void_p
L = ctypes.CDLL(os.environ["LOOM_LIB"])
class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 2048)]
class Seg(ctypes.Structure):
    _fields_ = [("k", P), ("v", P), ("cap", ctypes.c_int), ("pos0", ctypes.c_int),
                ("n", ctypes.c_int), ("want_logits", ctypes.c_int)]
L.loom_load_model_ex.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(P), P, P, ctypes.POINTER(Err)]
L.loom_model_set_weights_int8.argtypes = [P, ctypes.POINTER(Err)]
L.loom_model_set_weights_int4.argtypes = [P, ctypes.POINTER(Err)]
L.loom_model_weights_int4.argtypes = [P]
L.loom_model_kv_floats.argtypes = [P, ctypes.c_int]
L.loom_model_kv_floats.restype = ctypes.c_size_t
L.loom_decode_ws_create.argtypes = [P, ctypes.c_int, ctypes.c_int]
L.loom_decode_ws_create.restype = P
L.loom_model_decode_batch.argtypes = [P, P, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(Seg), ctypes.c_int]
L.loom_model_decode_batch.restype = ctypes.POINTER(ctypes.c_float)
V, CAP = 256, 96  # model.max_seq_len

def load(bits):
    m, err = P(), Err()
    assert L.loom_load_model_ex(sys.argv[1].encode(), 1, 0, ctypes.byref(m), None, None, ctypes.byref(err)) == 0, err.msg
    if bits == 8:
        assert L.loom_model_set_weights_int8(m, ctypes.byref(err)) == 0, err.msg
    if bits == 4:
        assert L.loom_model_set_weights_int4(m, ctypes.byref(err)) == 0, err.msg
        assert L.loom_model_weights_int4(m) == 1
    return m

class Seq:
    def __init__(self, m):
        self.m = m
        n = L.loom_model_kv_floats(m, CAP)
        self.k, self.v = (ctypes.c_float * n)(), (ctypes.c_float * n)()
        self.ws = L.loom_decode_ws_create(m, 1, 1)
        self.pos = 0
    def step(self, tok):  # the next-token logits after tok
        s = Seg(ctypes.cast(self.k, P), ctypes.cast(self.v, P), CAP, self.pos, 1, 1)
        t = (ctypes.c_int32 * 1)(tok)
        lg = L.loom_model_decode_batch(self.m, self.ws, t, ctypes.byref(s), 1)
        self.pos += 1
        return lg[:V]

def logps(m, ids):  # windows of 32 tokens (the training length), each a fresh sequence:
    out = []         # the next-token log-probabilities at every position
    for w0 in range(0, len(ids) - 1, 32):
        w = ids[w0:w0 + 33]
        s = Seq(m)
        for i in range(len(w) - 1):
            lg = s.step(w[i])
            mx = max(lg)
            lse = mx + math.log(sum(math.exp(x - mx) for x in lg))
            out.append([x - lse for x in lg])
    return out

def nll(lp, ids):
    return -sum(lp[i][ids[i + 1]] for i in range(len(lp))) / len(lp)

def greedy(m, prompt, n):
    s, out = Seq(m), []
    for t in prompt[:-1]:
        s.step(t)
    t = prompt[-1]
    for _ in range(n):
        lg = s.step(t)
        t = max(range(V), key=lambda i: lg[i])
        out.append(t)
    return out

random.seed(12345)  # held out: not the corpus's seed
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly".split()
text = " ".join(random.choice(words) for _ in range(60))[:300]
ids = list(text.encode())
f32 = load(32)
lf = logps(f32, ids)
pf = math.exp(nll(lf, ids))
prompt = list(b"the lazy")
gf = greedy(f32, prompt, 64)
print(f"held-out perplexity ({len(ids) - 1} tokens): fp32 {pf:.4f}")
print("fp32:", bytes(gf).decode(errors="replace"))
ok = pf < 8
for bits, ppl_tol, kl_max, min_top in ((8, 0.01, 0.002, 0.95), (4, 0.05, 0.02, 0.90)):
    q = load(bits)
    lq = logps(q, ids)
    pq = math.exp(nll(lq, ids))
    # llama.cpp's quality figures: the mean KL divergence of the quantized model's next-token
    # distribution from fp32's, and how often their top tokens agree
    kl = sum(sum(math.exp(a) * (a - b) for a, b in zip(x, y)) for x, y in zip(lf, lq)) / len(lf)
    top = sum(max(range(V), key=x.__getitem__) == max(range(V), key=y.__getitem__)
              for x, y in zip(lf, lq)) / len(lf)
    gq = greedy(q, prompt, 64)
    same = sum(a == b for a, b in zip(gf, gq))
    prefix = next((i for i, (a, b) in enumerate(zip(gf, gq)) if a != b), 64)
    print(f"int{bits}: perplexity {pq:.4f} ({100 * (pq / pf - 1):+.2f}% of fp32's, bound "
          f"{100 * ppl_tol:.0f}%); mean KL from fp32 {kl:.6f} (bound {kl_max}); the greedy "
          f"(top) token the same at {100 * top:.1f}% of the positions (bound "
          f"{100 * min_top:.0f}%); free-running greedy over 64 tokens: {same}/64 the same, "
          f"first difference at {prefix}")
    print(f"int{bits}:", bytes(gq).decode(errors="replace"))
    with open(f"greedy_int{bits}.json", "w") as f:
        json.dump(gq, f)
    ok = ok and abs(pq / pf - 1) <= ppl_tol and kl <= kl_max and top >= min_top
sys.exit(0 if ok else 1)
PY
pass "int8 and int4: perplexity and greedy agreement within bounds"
# the CLI's path: loom generate --weights int4 gives the same greedy tokens as libloom above
# (the prompt's last byte is fed as the first step there: the same sequence)
for bits in 8 4; do
  expect_ok "generate --weights int$bits" "$LOOM_BIN" generate "$WORK/run" --prompt "the lazy" \
    --tokens 64 --temperature 0 --weights int$bits --format ids --stats
  grep -q "weights int$bits; resident memory" "$WORK/err.txt" || fail "no int$bits weights line: $(cat "$WORK/err.txt")"
  sed -n 's/.*weight bytes: \([0-9.]*\) MB a step.*/\1/p' "$WORK/err.txt" > "mb_int$bits"
  python3 - "$WORK/out.txt" "greedy_int$bits.json" <<'PY' || fail "generate --weights int$bits differs from libloom's decode"
import json, sys
got, want = [int(t) for t in open(sys.argv[1]).read().split()], json.load(open(sys.argv[2]))
assert got == want, (got, want)
PY
  pass "loom generate --weights int$bits: the same 64 greedy tokens as the decode above"
done
# --stats' weight bytes a step: int8 about 34/32 bytes a weight, int4 144/256 (every linear
# here is Q4_K; the head stays Q8_0), against fp32's 4 (the norms in fp32 throughout)
expect_ok "generate (fp32)" "$LOOM_BIN" generate "$WORK/run" --prompt "the lazy" --tokens 4 --stats
sed -n 's/.*weight bytes: \([0-9.]*\) MB a step.*/\1/p' "$WORK/err.txt" > mb_fp32
python3 - mb_fp32 mb_int8 mb_int4 <<'PY' || fail "--stats weight bytes out of their bounds"
import sys
f, q8, q4 = (float(open(p).read()) for p in sys.argv[1:])
print(f"weight bytes a step: fp32 {f} MB, int8 {q8} MB ({q8 / f:.3f}), int4 {q4} MB ({q4 / f:.3f})")
assert 0.25 < q8 / f < 0.30 and 0.14 < q4 / f < 0.22, (f, q8, q4)
PY
pass "--stats: the weight bytes a step of fp32, int8 and int4 in their ratios"

