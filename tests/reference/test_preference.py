"""Preference optimization (DPO, SimPO, ORPO) against PyTorch in float64.

Through `loom train` (the path users run): `loom data build` of a `kind: preference` recipe
(TRL's conversational and standard rows, chatml, byte tokenizer) puts pair k in windows 2k
(chosen) and 2k+1 (rejected), rendered and masked as written here; then two steps of `loom
train` per method (init_from a random Hugging Face Llama, shuffle off, AdamW, no clipping):
DPO (beta 0.5, label smoothing 0.2; its reference the init_from weights), SimPO (gamma 0.3)
and ORPO. Each step's loss (<= 1e-5), gradient norm and TRL metrics (<= 1e-4) equal a PyTorch
float64 run of the same two steps (torch.optim.AdamW, the losses written below from TRL's
formulas). Step 2 is after an update, so DPO's loss there is not ln 2. DPO with LoRA: step 1 is
ln 2 and step 2's rewards are not 0 (the reference is the base with the adapters off).

The pieces a preference step runs, through libloom.so: a forward of the chosen and rejected
rows (targets -1 on the prompt), loom_model_token_logps, loom_pref_seq_logps, loom_pref_loss
(the loss and d loss / d sequence log-prob) and loom_pref_token_weights, then
loom_model_backward_weighted. The reference is torch_ref's decoder with the same weights in
float64, its log-probs from log_softmax, and the losses written here from the papers' and TRL's
formulas (DPOTrainer loss_type sigmoid with label_smoothing; CPOTrainer loss_type simpo;
ORPOTrainer), differentiated by autograd. DPO's reference model is a second loom model (other
weights) whose log-probs both sides use.

Checked for each method: the loss, every metric, and EVERY parameter gradient (max |d| / max
|ref| per tensor) <= 1e-5 (observed <= 2e-6); the dense head and model.loss_chunk = 5 (the
chunked head), llama (GQA, RoPE) and gpt2 (tied head). About 13 s of CPU at OMP_NUM_THREADS=2. Also: backward_weighted with every weight equal to dscale is
loom_model_backward(dscale) bit for bit, and positions with target -1 take no gradient from
their weight (a NaN weight there changes nothing).
"""
import ctypes
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_model as tm  # noqa: E402
import torch_ref  # noqa: E402

LIB = tm.LIB
TOL = 1e-5
failures = []

P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
DP = ctypes.POINTER(ctypes.c_double)


class Opts(ctypes.Structure):
    _fields_ = [("method", I), ("beta", ctypes.c_double), ("label_smoothing", ctypes.c_double),
                ("gamma", ctypes.c_double), ("rpo_alpha", ctypes.c_double)]


METRICS = ["loss", "rewards_chosen", "rewards_rejected", "margins", "accuracies",
           "logps_chosen", "logps_rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"]


class Metrics(ctypes.Structure):
    _fields_ = [(n, ctypes.c_double) for n in METRICS]


for name, res, args in [
        ("loom_model_token_logps", None, [P, P]),
        ("loom_model_backward_weighted", None, [P, P, ctypes.c_float]),
        ("loom_pref_seq_logps", None, [P, P, I, I, P, P]),
        ("loom_pref_loss", None, [ctypes.POINTER(Opts), L, P, P, P, P, P, P, ctypes.c_double,
                                  ctypes.c_double, P, P, ctypes.POINTER(Metrics)]),
        ("loom_pref_token_weights", None, [P, P, I, I, P])]:
    fn = getattr(LIB, name)
    fn.restype, fn.argtypes = res, args

DPO, SIMPO, ORPO = 1, 2, 3


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def check(what, err, tol=TOL):
    ok = err <= tol
    print(f"  {'ok  ' if ok else 'FAIL'} {what}: {err:.2e} (tol {tol:g})")
    if not ok:
        failures.append(what)


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def make_model(cfg, B, T, seed, chunk=0):
    c = torch_ref.normalize_config(cfg)
    mc = tm.ModelConfig(c["flavor"], c["vocab_size"], c["max_seq_len"], c["n_layer"], c["n_head"],
                        c["n_kv_head"], c["d_model"], c["d_ff"], c["norm_eps"], c["rope_theta"],
                        c["init_std"], loss_chunk=chunk)
    m, err = ctypes.c_void_p(), tm.Err()
    if LIB.loom_model_create(ctypes.byref(mc), None, B, T, ctypes.byref(m), ctypes.byref(err)):
        raise RuntimeError(err.msg.decode())
    n = LIB.loom_model_num_params(m)
    params = np.ctypeslib.as_array(LIB.loom_model_params(m), shape=(n,))
    grads = np.ctypeslib.as_array(LIB.loom_model_grads(m), shape=(n,))
    infos = {i["name"]: i for i in (tm.LoomModel.as_dict(LIB.loom_model_tensor(m, k))
                                    for k in range(LIB.loom_model_num_tensors(m)))}
    # weights large enough for log-probs far from uniform (init_std 0.02 gives ~log V)
    rng = np.random.default_rng(seed)
    params[:] = rng.normal(0, 0.15, n).astype(np.float32)
    for name, inf in infos.items():
        if name.endswith(("ln1_w", "ln2_w", "lnf_w")):
            params[inf["offset"]:inf["offset"] + inf["numel"]] += 1.0
    return m, c, params, grads, infos


def batch(rng, V, T):
    """Two pairs as 4 rows (chosen, rejected, chosen, rejected): a shared prompt per pair
    (targets -1), completions of different lengths, padding (-1) after them."""
    x = rng.integers(0, V, size=(4, T)).astype(np.int32)
    y = np.full((4, T), -1, dtype=np.int32)
    spans = [(3, 10), (3, 7), (5, 12), (5, 11)]  # (prompt length, end of the completion)
    for r, (p, e) in enumerate(spans):
        if r % 2:
            x[r, :p] = x[r - 1, :p]
        y[r, p - 1:e - 1] = x[r, p:e]
    return x, y


def loom_logps(m, x, y):
    B, T = x.shape
    LIB.loom_model_forward(m, x.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                           y.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), B, T)
    lp = np.zeros((B, T), dtype=np.float32)
    LIB.loom_model_token_logps(m, ptr(lp))
    sums, counts = np.zeros(B), np.zeros(B)
    LIB.loom_pref_seq_logps(ptr(lp), ptr(y), B, T, ptr(sums), ptr(counts))
    return lp, sums, counts


def torch_seq_logps(ref, x, y):
    logits, _ = ref.forward(torch.from_numpy(x.astype(np.int64)))
    yy = torch.from_numpy(y.astype(np.int64))
    mask = (yy >= 0).to(logits.dtype)
    lp = torch.gather(F.log_softmax(logits, -1), 2, yy.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (lp * mask).sum(-1), mask.sum(-1)


def torch_loss(method, beta, ls, gamma, s, cnt, ref_s, rpo=0.0):
    """The loss (mean over pairs) and TRL's metrics from sequence sums s (rows c, r, c, r);
    rpo: DPO's RPO term, TRL's loss_type [sigmoid, sft] with loss_weights [1, rpo]."""
    lc, lr = s[0::2], s[1::2]
    nc, nr = cnt[0::2], cnt[1::2]
    out = {}
    if method == DPO:
        rc, rr = ref_s[0::2], ref_s[1::2]
        z = (lc - rc) - (lr - rr)
        losses = -(1 - ls) * F.logsigmoid(beta * z) - ls * F.logsigmoid(-beta * z)
        ch, rj = beta * (lc - rc), beta * (lr - rr)
        out.update(logps_chosen=lc, logps_rejected=lr)
        loss = losses.mean()
        if rpo:  # TRL's "sft" loss: the chosen tokens' mean NLL over the batch
            nll = -lc.sum() / nc.sum()
            loss = loss + rpo * nll
            out.update(nll_loss=nll * len(lc))
    elif method == SIMPO:
        pc, pr = lc / nc, lr / nr
        z = pc - pr - gamma / beta
        losses = -(1 - ls) * F.logsigmoid(beta * z) - ls * F.logsigmoid(-beta * z)
        ch, rj = beta * pc, beta * pr
        out.update(logps_chosen=pc, logps_rejected=pr)
        loss = losses.mean()
    else:
        pc, pr = lc / nc, lr / nr
        log_odds = (pc - pr) - (torch.log1p(-torch.exp(pc)) - torch.log1p(-torch.exp(pr)))
        ratio = F.logsigmoid(log_odds)
        nll = -lc.sum() / nc.sum()  # the chosen tokens' mean cross-entropy
        loss = nll - beta * ratio.mean()
        ch, rj = beta * pc, beta * pr
        out.update(logps_chosen=pc, logps_rejected=pr, nll_loss=nll * len(lc),
                   log_odds_ratio=ratio, log_odds_chosen=log_odds)
    out.update(rewards_chosen=ch, rewards_rejected=rj, margins=ch - rj,
               accuracies=(ch > rj).to(ch.dtype))
    # loom's metrics are sums over pairs (the trainer divides by the pairs)
    metrics = {k: float(v.detach().sum()) for k, v in out.items()}
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def run(tag, cfg, method, beta, ls=0.0, gamma=0.0, chunk=0, seed=0, rpo=0.0):
    print(f"== {tag}: {['', 'dpo', 'simpo', 'orpo'][method]} beta {beta} label_smoothing {ls}"
          f" gamma {gamma}{' rpo_alpha %g' % rpo if rpo else ''}"
          f"{' loss_chunk %d' % chunk if chunk else ''}")
    B, T = 4, 12
    m, c, params, grads, infos = make_model(cfg, B, T, seed + 1, chunk)
    rm, _, rparams, _, _ = make_model(cfg, B, T, seed + 2)  # the frozen reference
    rng = np.random.default_rng(seed)
    x, y = batch(rng, c["vocab_size"], T)

    ref_s = np.zeros(B)
    if method == DPO:
        _, ref_s, _ = loom_logps(rm, x, y)
    LIB.loom_model_zero_grad(m)
    _, s, cnt = loom_logps(m, x, y)
    opts = Opts(method, beta, ls, gamma, rpo)
    lc, lr = np.ascontiguousarray(s[0::2]), np.ascontiguousarray(s[1::2])
    nc, nr = np.ascontiguousarray(cnt[0::2]), np.ascontiguousarray(cnt[1::2])
    rc, rr = np.ascontiguousarray(ref_s[0::2]), np.ascontiguousarray(ref_s[1::2])
    dc, dr = np.zeros(2), np.zeros(2)
    mx = Metrics()
    LIB.loom_pref_loss(ctypes.byref(opts), 2, ptr(lc), ptr(lr), ptr(nc), ptr(nr),
                       ptr(rc) if method == DPO else None, ptr(rr) if method == DPO else None,
                       2.0, float(nc.sum()), ptr(dc), ptr(dr), ctypes.byref(mx))
    dseq = np.zeros(B)
    dseq[0::2], dseq[1::2] = dc, dr
    w = np.zeros((B, T), dtype=np.float32)
    LIB.loom_pref_token_weights(ptr(dseq), ptr(y), B, T, ptr(w))
    LIB.loom_model_backward_weighted(m, ptr(w), ctypes.c_float(1.0))

    ref = torch_ref.Ref(c, dtype=torch.float64)
    rref = torch_ref.Ref(c, dtype=torch.float64)
    with torch.no_grad():
        for name in ref.names:
            inf = infos[name]
            sl = slice(inf["offset"], inf["offset"] + inf["numel"])
            ref.get_parameter(name).copy_(torch.from_numpy(params[sl].reshape(inf["shape"])))
            rref.get_parameter(name).copy_(torch.from_numpy(rparams[sl].reshape(inf["shape"])))
    ts, tcnt = torch_seq_logps(ref, x, y)
    with torch.no_grad():
        tref_s, _ = torch_seq_logps(rref, x, y)
    check("reference log-prob sums", rel(ref_s, tref_s.numpy()) if method == DPO else 0.0)
    check("policy log-prob sums", rel(s, ts.detach().numpy()))
    loss, tm_ = torch_loss(method, beta, ls, gamma, ts, tcnt, tref_s, rpo)
    loss.backward()
    for k in METRICS:
        got, want = getattr(mx, k), tm_.get(k, 0.0)
        check(f"metric {k} ({got:.6g})", abs(got - want) / max(abs(want), 1e-3))
    worst, where = 0.0, ""
    for name in ref.names:
        inf = infos[name]
        g = ref.get_parameter(name).grad
        if g is None or float(g.abs().max()) == 0.0:
            continue
        mine = grads[inf["offset"]:inf["offset"] + inf["numel"]].reshape(inf["shape"])
        if name.endswith(".k_b"):  # 0 analytically: loom's noise against q_b's scale
            e = float(np.abs(mine).max()) / float(
                ref.get_parameter(name[:-3] + "q_b").grad.abs().max())
        else:
            e = rel(mine, g.numpy())
        if e > worst:
            worst, where = e, name
    check(f"every parameter gradient (worst: {where})", worst)
    LIB.loom_model_free(m)
    LIB.loom_model_free(rm)


def check_equal_weights(cfg, chunk):
    """backward_weighted(w = dscale everywhere) == backward(dscale), bit for bit; a NaN
    weight on an ignored position changes nothing."""
    B, T = 4, 12
    m, c, params, grads, _ = make_model(cfg, B, T, 5, chunk)
    x, y = batch(np.random.default_rng(3), c["vocab_size"], T)
    xp = x.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    yp = y.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    dscale = 1.0 / float((y >= 0).sum())
    LIB.loom_model_zero_grad(m)
    LIB.loom_model_forward(m, xp, yp, B, T)
    LIB.loom_model_backward(m, ctypes.c_float(dscale))
    g0 = grads.copy()
    w = np.full((B, T), dscale, dtype=np.float32)
    w[y < 0] = np.nan
    LIB.loom_model_zero_grad(m)
    LIB.loom_model_forward(m, xp, yp, B, T)
    LIB.loom_model_backward_weighted(m, ptr(w), ctypes.c_float(dscale))
    same = np.array_equal(g0.view(np.uint32), grads.view(np.uint32))
    print(f"  {'ok  ' if same else 'FAIL'} equal weights = backward(dscale) bit for bit"
          f"{' (loss_chunk %d)' % chunk if chunk else ''}")
    if not same:
        failures.append("equal weights bitwise")
    LIB.loom_model_free(m)


# ---- through `loom train`: recipe kind: preference, finetune.method, the trainer's step -------
LOOM = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "../../build/loom")


def loom_run(*args):
    import subprocess
    r = subprocess.run([LOOM, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"loom {' '.join(args)} failed:\n{r.stderr}")
    return r


PAIRS = [  # TRL's conversational format, and its standard one (three strings)
    {"prompt": [{"role": "user", "content": "what is 12 plus 7?"}],
     "chosen": [{"role": "assistant", "content": "19"}],
     "rejected": [{"role": "assistant", "content": "21, I think"}]},
    {"prompt": "2 times 4 is", "chosen": " 8", "rejected": " nine"},
    {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
     "chosen": [{"role": "assistant", "content": "hello"}],
     "rejected": [{"role": "assistant", "content": "good morning to you"}]},
    {"prompt": "the sky is", "chosen": " blue", "rejected": " green"},
    # a shard's last pair is not a sample (a sample is 2T + 1 tokens): this one makes the
    # four above two whole batches
    {"prompt": "last", "chosen": " one", "rejected": " two"},
]
T_DATA = 128


def chatml(msgs):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)


def expected_windows(pair):
    """(tokens, mask) of the chosen and the rejected window, as kind: preference renders them
    (byte tokenizer, chatml; mask 1 on the assistant's content and end of turn)."""
    out = []
    for key in ("chosen", "rejected"):
        if isinstance(pair["prompt"], str):
            text, trained = pair["prompt"] + pair[key], len(pair[key])
        else:
            p = chatml(pair["prompt"]) + "<|im_start|>assistant\n"
            c = pair[key][0]["content"] + "<|im_end|>\n"
            text, trained = p + c, len(c)
        b = list(text.encode())
        m = [0] * (len(b) - trained) + [1] * trained
        out.append((b + [0] * (T_DATA - len(b)), m + [0] * (T_DATA - len(b))))
    return out


def build_pairs(work):
    with open(os.path.join(work, "pairs.jsonl"), "w") as f:
        for p in PAIRS:
            f.write(json.dumps(p) + "\n")
    open(os.path.join(work, "r.yaml"), "w").write(f"""name: pairs
sources:
  - name: pairs
    kind: preference
    path: {work}/pairs.jsonl
    template: chatml
tokenizer: byte
seq_len: {T_DATA}
val_fraction: 0
output: {work}/data
shard_tokens: {2 * T_DATA * 64}
""")
    loom_run("data", "build", os.path.join(work, "r.yaml"))
    b = open(os.path.join(work, "data", "train", "shard_00000.bin"), "rb").read()
    n, = struct.unpack("<Q", b[24:32])
    mo, mb = struct.unpack("<QQ", b[288:304])
    toks = np.frombuffer(b, dtype=np.uint8, count=n, offset=4096).astype(np.int64)
    mask = np.frombuffer(b, dtype=np.uint8, count=mb, offset=mo).astype(np.int64)
    ok = n == 2 * T_DATA * len(PAIRS)
    for k, pair in enumerate(PAIRS):
        for h, (want_t, want_m) in enumerate(expected_windows(pair)):
            s0 = (2 * k + h) * T_DATA
            ok &= toks[s0:s0 + T_DATA].tolist() == want_t and mask[s0:s0 + T_DATA].tolist() == want_m
    print(f"  {'ok  ' if ok else 'FAIL'} kind: preference: pair k is windows 2k (chosen) and 2k+1 "
          f"(rejected), rendered and masked as expected")
    if not ok:
        failures.append("preference data layout")
    return os.path.join(work, "data", "train"), toks, mask


def hf_llama(work):
    import transformers
    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # far from uniform: log-probs that differ between the pairs
        for p in model.parameters():
            p.mul_(6.0)
    d = os.path.join(work, "hf")
    model.save_pretrained(d)
    return model, d


def train_case(work, data, hf, name, method, keys, steps):
    conf = os.path.join(work, f"{name}.yaml")
    extra = "".join(f"  {k}: {v}\n" for k, v in keys.items())
    open(conf, "w").write(f"""run:
  dir: {work}/{name}
data:
  train: {data}
  shuffle: false
finetune:
  method: {method}
{extra}training:
  init_from: {hf}
  steps: {steps}
  batch_size: 2
  seq_len: {T_DATA}
  lr: 1e-3
  warmup: 0
  schedule: constant
  weight_decay: 0
  grad_clip: 0
  peak_flops: 1e11
eval:
  every: 0
""")
    loom_run("train", conf)
    return [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]


def train_checks(work, lora_only=False):
    import copy
    print("== through loom train (kind: preference, finetune.method, init_from a HF Llama)")
    data, toks, mask = build_pairs(work)
    model, hf = hf_llama(work)
    if lora_only:
        train_ckpt_check(work, data, hf)
        return train_lora_check(work, data, hf)
    T = T_DATA
    # the first batch: pairs 0 and 1 (shuffle false), rows chosen, rejected, chosen, rejected;
    # the second: pairs 2 and 3. Targets: the next token where its mask is 1, else -1.
    def batch(b):
        x = np.stack([toks[r * T:r * T + T] for r in range(4 * b, 4 * b + 4)])
        y = np.stack([toks[r * T + 1:r * T + T + 1] for r in range(4 * b, 4 * b + 4)])
        m = np.stack([mask[r * T + 1:r * T + T + 1] for r in range(4 * b, 4 * b + 4)])
        return x, np.where(m > 0, y, -1)

    def logps(mdl, x, y):
        lg = mdl(torch.tensor(x)).logits.double()
        yy = torch.tensor(y)
        lp = torch.gather(F.log_softmax(lg, -1), 2, yy.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        msk = (yy >= 0).double()
        return (lp * msk).sum(-1), msk.sum(-1)

    # rpo: one step (its second would follow the sign AdamW's first step gives a wte element
    # whose gradient is 1e-5 of the largest, where fp32 and float64 disagree; RPO away from
    # the reference, z != 0, is checked on a fixed batch by run() below)
    cases = [("dpo", DPO, {"beta": 0.5, "label_smoothing": 0.2}, 0.5, 0.2, 0.0, 0.0, 2),
             ("rpo", DPO, {"beta": 0.5, "rpo_alpha": 0.7}, 0.5, 0.0, 0.0, 0.7, 1),
             ("simpo", SIMPO, {"gamma": 0.3}, 2.0, 0.0, 0.3, 0.0, 2),
             ("orpo", ORPO, {}, 0.1, 0.0, 0.0, 0.0, 2)]
    for name, method, keys, beta, ls, gamma, rpo, steps in cases:
        rows = train_case(work, data, hf, name, ["", "dpo", "simpo", "orpo"][method], keys, steps)
        pol = copy.deepcopy(model).double()
        ref = copy.deepcopy(model).double()
        opt = torch.optim.AdamW(pol.parameters(), lr=rows[0]["lr"], betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.0)
        for step in range(steps):
            x, y = batch(step)
            with torch.no_grad():
                ref_s, _ = logps(ref, x, y)
            s_, cnt = logps(pol, x, y)
            loss, tmx = torch_loss(method, beta, ls, gamma, s_, cnt, ref_s, rpo)
            opt.zero_grad()
            loss.backward()
            gn = math.sqrt(sum(float((p.grad ** 2).sum()) for p in pol.parameters()))
            row = rows[step]
            print(f"  {name} step {step + 1}: loss {row['loss']:.6f} (torch {loss.item():.6f})")
            check(f"{name} step {step + 1} loss", abs(row["loss"] - loss.item()) / abs(loss.item()))
            check(f"{name} step {step + 1} grad norm", abs(row["grad_norm"] - gn) / gn, 1e-4)
            for k, key in (("logps_chosen", "logps/chosen"), ("rewards_chosen", "rewards/chosen"),
                           ("margins", "rewards/margins"), ("accuracies", "rewards/accuracies")):
                want = tmx[k] / 2
                check(f"{name} step {step + 1} {key}", abs(row[key] - want) / max(abs(want), 1e-3),
                      1e-4)
            if rpo:
                want = tmx["nll_loss"] / 2
                check(f"{name} step {step + 1} nll_loss", abs(row["nll_loss"] - want) / abs(want), 1e-4)
            opt.step()
    try:  # RPO's NLL term is DPO's: another method with it is refused, naming the key
        train_case(work, data, hf, "simpo_rpo", "simpo", {"rpo_alpha": 0.5}, 1)
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    ok = "finetune.rpo_alpha" in refused and "DPO" in refused
    print(f"  {'ok  ' if ok else 'FAIL'} simpo with rpo_alpha refused: {refused.strip().splitlines()[-1] if refused else 'it ran'}")
    if not ok:
        failures.append("simpo with rpo_alpha refused")
    train_ckpt_check(work, data, hf)
    train_lora_check(work, data, hf)


def train_ckpt_check(work, data, hf):
    # DPO's reference from a loom checkpoint (training.init_from: its parameters copied into the
    # reference model through the backend) equals the reference from the Hugging Face weights
    # it was imported from, bit for bit
    loom_run("import", "--hf", hf, f"{work}/hf_as_loom", "--tokenizer", "byte")
    a = train_case(work, data, hf, "dpo_hf", "dpo", {"beta": 0.5}, 2)
    b = train_case(work, data, f"{work}/hf_as_loom", "dpo_ckpt", "dpo", {"beta": 0.5}, 2)
    same = [(r["loss"], r["grad_norm"], r["rewards/chosen"]) for r in a] == \
           [(r["loss"], r["grad_norm"], r["rewards/chosen"]) for r in b]
    print(f"  {'ok  ' if same else 'FAIL'} dpo: the reference from a loom checkpoint = from its HF "
          "source (losses, grad norms, rewards bit for bit)")
    if not same:
        failures.append("dpo reference from a loom checkpoint")


def train_lora_check(work, data, hf):
    # LoRA: the reference is the model with its adapters off. Step 1: the adapters' B is 0, so
    # policy = reference (loss ln 2, rewards 0); step 2: the adapters have moved and the
    # reference has not (rewards != 0: a reference with the adapters on would give 0 again).
    rows = train_case(work, data, hf, "dpo_lora", "dpo", {"lora.rank": 4}, 2)
    check("dpo + lora step 1 loss = ln 2", abs(rows[0]["loss"] - math.log(2)) / math.log(2))
    moved = abs(rows[1]["rewards/chosen"]) + abs(rows[1]["rewards/rejected"])
    ok = moved > 1e-4 and abs(rows[1]["loss"] - math.log(2)) > 1e-6
    print(f"  {'ok  ' if ok else 'FAIL'} dpo + lora step 2: rewards {rows[1]['rewards/chosen']:.3g}, "
          f"{rows[1]['rewards/rejected']:.3g} (the reference is the base without adapters)")
    if not ok:
        failures.append("dpo + lora reference")


def error_checks(work):
    """A malformed row fails the build naming FILE:LINE and the field; on_error: skip skips it."""
    print("== malformed preference rows")
    good = json.dumps(PAIRS[1])
    bad = [({"prompt": "x", "chosen": " y"}, 'no field "rejected"'),
           ({"prompt": 3, "chosen": " y", "rejected": " z"}, 'field "prompt" is not a string'),
           ({"prompt": "x", "chosen": "", "rejected": " z"}, 'field "chosen" is empty'),
           ({"prompt": [{"role": "robot", "content": "x"}], "chosen": "y", "rejected": "z"},
            "chosen: message 0: role 'robot'")]
    for i, (row, want) in enumerate(bad):
        d = os.path.join(work, f"bad{i}")
        os.makedirs(d)
        open(os.path.join(d, "p.jsonl"), "w").write(good + "\n" + json.dumps(row) + "\n")
        for skip in (0, 1):
            open(os.path.join(d, "r.yaml"), "w").write(f"""name: bad
sources:
  - name: p
    kind: preference
    path: {d}/p.jsonl
{"    on_error: skip" if skip else ""}
tokenizer: byte
seq_len: 64
val_fraction: 0
output: {d}/out{skip}
shard_tokens: 8192
""")
            import subprocess
            r = subprocess.run([LOOM, "data", "build", os.path.join(d, "r.yaml")],
                               capture_output=True, text=True)
            if skip:
                ok = r.returncode == 0 and "skipped bad line" in r.stderr
                what = f"bad row {i} skipped with on_error: skip"
            else:
                ok = r.returncode != 0 and f"p.jsonl:2: {want}" in r.stderr
                what = f"bad row {i} refused naming p.jsonl:2 ({want})"
            print(f"  {'ok  ' if ok else 'FAIL'} {what}")
            if not ok:
                print(r.stderr[-500:])
                failures.append(what)


def main():
    torch.set_num_threads(2)
    import tempfile
    if os.environ.get("LOOM_BACKEND") == "cpu-guard":
        # scripts/ci_guard.sh: DPO with LoRA through `loom train` alone (the full-model methods
        # and the parse errors are the same code on every backend; the libloom parts below read
        # the engine's memory from Python directly, which cpu-guard forbids)
        with tempfile.TemporaryDirectory() as work:
            train_checks(work, lora_only=True)
        if failures:
            print("FAILED:", ", ".join(failures))
            sys.exit(1)
        print("all checks passed (cpu-guard: DPO with LoRA through loom train)")
        return
    with tempfile.TemporaryDirectory() as work:
        error_checks(work)
        train_checks(work)
    llama, gpt2 = tm.CONFIGS["llama"], tm.CONFIGS["gpt2"]
    run("llama", llama, DPO, 0.1)
    run("gpt2", gpt2, DPO, 0.5, ls=0.2, chunk=5, rpo=0.7)
    run("llama", llama, SIMPO, 2.0, ls=0.1, gamma=1.0, chunk=5)
    run("gpt2", gpt2, ORPO, 0.5)
    print("== backward_weighted with equal weights")
    check_equal_weights(llama, 0)
    check_equal_weights(gpt2, 5)
    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
