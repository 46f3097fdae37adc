"""GRPO's loss and gradients against PyTorch in float64 (docs/finetune.md "GRPO").

The pieces `loom train` runs for finetune.method grpo (src/train/train_grpo.c), through
libloom.so: a forward of the rollouts' rows (targets -1 on the prompt, on a tool message's
tokens inside the completion and on the padding), loom_model_token_logps, loom_grpo_advantages
(group-normalized rewards), loom_grpo_loss (the loss, its metrics and the per-token weights
-d loss / d logp_t) and loom_model_backward_weighted. The reference is torch_ref's decoder
with the same weights in float64 and the objective written here from the formulas (TRL's
GRPOTrainer._compute_loss: coef_1 = exp(logp - old), coef_2 = clamp(coef_1, 1 - eps,
1 + eps_high), -min(coef_1 A, coef_2 A) + beta k3, "dapo": masked sum / tokens of the batch,
"grpo": per-sequence masked mean, then the mean), differentiated by autograd.

Cases: both loss types; beta 0 and > 0 (the reference's log-probs from a second loom model);
num_iterations 1 (old log-probs = the current ones, ratio 1) and > 1 (old log-probs of an
earlier policy: the current ones plus noise, so ratios leave [1 - eps, 1 + eps_high] on both
sides and the clip counts are checked non-zero); scale_rewards group and none; llama (dense
head) and gpt2 (tied head, model.loss_chunk 5). Checked: the advantages, the loss, the KL and
clip metrics (<= 1e-5), EVERY parameter gradient (max |d| / max |ref| per tensor <= 1e-5), and
the weights of the tool message's tokens are exactly 0. About 3 s at OMP_NUM_THREADS=2.
"""
import ctypes
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_model as tm  # noqa: E402
import test_preference as tp  # noqa: E402  (its model set-up and libloom bindings)
import torch_ref  # noqa: E402

LIB = tm.LIB
TOL = 1e-5
failures = []
P, I = ctypes.c_void_p, ctypes.c_int
DAPO, GRPO = 0, 1


class Opts(ctypes.Structure):
    _fields_ = [("loss_type", I), ("scale_rewards", I), ("epsilon", ctypes.c_double),
                ("epsilon_high", ctypes.c_double), ("beta", ctypes.c_double)]


METRICS = ["loss", "kl", "clip_low", "clip_high", "clip_region", "tokens"]


class Metrics(ctypes.Structure):
    _fields_ = [(n, ctypes.c_double) for n in METRICS]


LIB.loom_grpo_advantages.restype = None
LIB.loom_grpo_advantages.argtypes = [ctypes.POINTER(Opts), P, I, I, P, P]
LIB.loom_grpo_loss.restype = None
LIB.loom_grpo_loss.argtypes = [ctypes.POINTER(Opts), P, P, P, P, P, I, I, ctypes.c_double,
                               ctypes.c_double, P, ctypes.POINTER(Metrics)]
ptr = tp.ptr


def check(what, err, tol=TOL):
    ok = err <= tol
    print(f"  {'ok  ' if ok else 'FAIL'} {what}: {err:.2e} (tol {tol:g})")
    if not ok:
        failures.append(what)


def rollouts(rng, V, T, G):
    """2 groups of G completions: a shared prompt per group (targets -1), completions of
    different lengths; in row 1 a tool message's tokens inside the completion (targets -1:
    masked out of the loss) between two assistant spans; padding (-1) after."""
    B = 2 * G
    x = rng.integers(0, V, size=(B, T)).astype(np.int32)
    y = np.full((B, T), -1, dtype=np.int32)
    for r in range(B):
        p = 3 if r < G else 4
        x[r, :p] = x[(r // G) * G, :p]
        e = int(rng.integers(p + 2, T + 1))
        y[r, p - 1:e - 1] = x[r, p:e]
    tool = (1, 6, 9)  # row 1: positions [6, 9) predict a tool message's tokens
    y[tool[0], :] = -1
    y[tool[0], 2:tool[1]] = x[tool[0], 3:tool[1] + 1]
    y[tool[0], tool[2]:T - 1] = x[tool[0], tool[2] + 1:T]
    return x, y, tool


def torch_logps(ref, x, y):
    logits, _ = ref.forward(torch.from_numpy(x.astype(np.int64)))
    yy = torch.from_numpy(y.astype(np.int64))
    return torch.gather(F.log_softmax(logits, -1), 2, yy.clamp(min=0).unsqueeze(-1)).squeeze(-1)


def torch_loss(loss_type, eps, eps_high, beta, logp, old, ref_lp, mask, adv):
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps_high)
    A = adv.unsqueeze(1)
    per_tok = -torch.min(coef_1 * A, coef_2 * A)
    kl = torch.exp(ref_lp - logp) - (ref_lp - logp) - 1
    if beta > 0:
        per_tok = per_tok + beta * kl
    if loss_type == DAPO:
        loss = (per_tok * mask).sum() / mask.sum()
    else:
        loss = ((per_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    low = ((coef_1 < 1 - eps) & (A < 0)).to(logp.dtype) * mask
    high = ((coef_1 > 1 + eps_high) & (A > 0)).to(logp.dtype) * mask
    region = (((coef_1 < 1 - eps) & (A < 0)) | ((coef_1 > 1 + eps_high) & (A > 0))).to(
        logp.dtype) * mask
    metrics = {"loss": float(loss.detach()), "kl": float((kl * mask).sum().detach()) if beta > 0
               else 0.0, "clip_low": float(low.sum()), "clip_high": float(high.sum()),
               "clip_region": float(region.sum()), "tokens": float(mask.sum())}
    return loss, metrics


def run(tag, cfg, loss_type, beta, iterations, scale=1, eps=0.2, eps_high=0.28, chunk=0, seed=0):
    print(f"== {tag}: loss_type {['dapo', 'grpo'][loss_type]} beta {beta} num_iterations "
          f"{iterations} scale_rewards {['none', 'group'][scale]}"
          f"{' loss_chunk %d' % chunk if chunk else ''}")
    G, T = 3, 14
    B = 2 * G
    m, c, params, grads, infos = tp.make_model(cfg, B, T, seed + 1, chunk)
    rm, _, rparams, _, _ = tp.make_model(cfg, B, T, seed + 2)  # the reference (beta > 0)
    rng = np.random.default_rng(seed)
    x, y, tool = rollouts(rng, c["vocab_size"], T, G)
    rewards = rng.choice([0.0, 0.5, 1.0, 2.0], size=B)
    rewards[G:] = [1.0, 0.0, 1.0]  # a group with ties
    opts = Opts(loss_type, scale, eps, eps_high, beta)
    adv = np.zeros(B)
    sd = np.zeros(2)
    LIB.loom_grpo_advantages(ctypes.byref(opts), ptr(rewards), B, G, ptr(adv), ptr(sd))
    rg = torch.from_numpy(rewards).view(2, G)
    tadv = (rg - rg.mean(1, keepdim=True))
    if scale:
        tadv = tadv / (rg.std(1, keepdim=True) + 1e-4)
    tadv = tadv.reshape(-1)
    check("advantages", tp.rel(adv, tadv.numpy()))
    check("group std", tp.rel(sd, rg.std(1).numpy()))

    xp = x.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    yp = y.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    ref_lp = np.zeros((B, T), dtype=np.float32)
    if beta > 0:
        LIB.loom_model_forward(rm, xp, yp, B, T)
        LIB.loom_model_token_logps(rm, ptr(ref_lp))
    LIB.loom_model_zero_grad(m)
    LIB.loom_model_forward(m, xp, yp, B, T)
    lp = np.zeros((B, T), dtype=np.float32)
    LIB.loom_model_token_logps(m, ptr(lp))
    # an earlier policy's log-probs (num_iterations > 1), or none: ratio 1
    old = None
    if iterations > 1:
        old = (lp + rng.normal(0, 0.3, size=lp.shape)).astype(np.float32)
    w = np.zeros((B, T), dtype=np.float32)
    mx = Metrics()
    n_tok = float((y >= 0).sum())
    LIB.loom_grpo_loss(ctypes.byref(opts), ptr(lp), ptr(old) if old is not None else None,
                       ptr(ref_lp) if beta > 0 else None, ptr(y), ptr(adv), B, T, float(B),
                       n_tok, ptr(w), ctypes.byref(mx))
    LIB.loom_model_backward_weighted(m, ptr(w), ctypes.c_float(1.0))
    r, a, b = tool
    zero = bool(np.all(w[r, a:b] == 0.0)) and bool(np.all(w[y < 0] == 0.0))
    print(f"  {'ok  ' if zero else 'FAIL'} the tool message's tokens (and prompt, padding) "
          f"have weight 0")
    if not zero:
        failures.append(f"{tag}: masked weights")

    ref = torch_ref.Ref(c, dtype=torch.float64)
    rref = torch_ref.Ref(c, dtype=torch.float64)
    with torch.no_grad():
        for name in ref.names:
            inf = infos[name]
            sl = slice(inf["offset"], inf["offset"] + inf["numel"])
            ref.get_parameter(name).copy_(torch.from_numpy(params[sl].reshape(inf["shape"])))
            rref.get_parameter(name).copy_(torch.from_numpy(rparams[sl].reshape(inf["shape"])))
    tlp = torch_logps(ref, x, y)
    mask = torch.from_numpy((y >= 0).astype(np.float64))
    with torch.no_grad():
        tref = torch_logps(rref, x, y)
    check("policy log-probs", tp.rel(lp[y >= 0], tlp.detach().numpy()[y >= 0]))
    if beta > 0:
        check("reference log-probs", tp.rel(ref_lp[y >= 0], tref.numpy()[y >= 0]))
    told = tlp.detach() if old is None else torch.from_numpy(old.astype(np.float64))
    loss, want = torch_loss(loss_type, eps, eps_high, beta, tlp, told, tref, mask, tadv)
    loss.backward()
    for k in METRICS:
        got = getattr(mx, k)
        check(f"metric {k} ({got:.6g})", abs(got - want[k]) / max(abs(want[k]), 1e-3))
    if iterations > 1 and not (want["clip_low"] > 0 and want["clip_high"] > 0):
        failures.append(f"{tag}: the case clips on both sides")
        print("  FAIL the case must clip on both sides")
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
            e = tp.rel(mine, g.numpy())
        if e > worst:
            worst, where = e, name
    check(f"every parameter gradient (worst: {where})", worst)
    LIB.loom_model_free(m)
    LIB.loom_model_free(rm)


def main():
    torch.set_num_threads(2)
    llama, gpt2 = tm.CONFIGS["llama"], tm.CONFIGS["gpt2"]
    run("llama", llama, DAPO, 0.0, 1)
    run("llama", llama, GRPO, 0.04, 3)
    run("gpt2", gpt2, DAPO, 0.1, 2, scale=0, chunk=5, seed=1)
    run("gpt2", gpt2, GRPO, 0.0, 1, chunk=5, seed=2)
    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
