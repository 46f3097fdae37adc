/* The mixture-of-experts feed-forward: one op of the block (src/model/block.c), LN2 -> RES3.
 *
 * Forward, for the N rows of a micro-batch (docs/moe.md):
 *   router: logits = x W_r^T (N,E), p = softmax(logits), lse = logsumexp(logits);
 *   top-k:  each token's k most probable experts (ties: the lower index), weight p[t,e], or
 *           with arch.moe_renorm p[t,e] / (the sum of its k choices' p) (Mixtral);
 *   capacity: per routing group of G consecutive tokens (model.moe.group_tokens, 0 = one
 *           sequence), at most floor(capacity_factor * k * G / E) assignments per expert, taken
 *           first choices first, in token order (capacity_factor 0, an inference arena and
 *           decoding: dropless); a dropped assignment adds nothing (the token keeps its residual);
 *   dispatch: the kept assignments' rows grouped by expert (expert-major, tokens in order), so
 *           each expert runs one matmul per linear; with expert parallelism the rows of experts
 *           held elsewhere go to their member of the expert group (m->moe_comm) and come back;
 *   combine: out[t] = sum_j p[t,e_j] y_{e_j}(x_t) over the kept choices, plus the shared
 *           experts' outputs.
 * The router losses enter backward only (the loss forward returns is the cross-entropy):
 *   balance: aux_loss_coef * sum over groups of G * E * sum_e f_e P_e (f_e: share of the group's
 *           assignments to e before capacity, P_e: mean router probability of e in the group);
 *   z-loss:  z_loss_coef * sum over tokens of lse^2;
 * both per-token sums scaled by backward's dscale like the cross-entropy, so they do not depend
 * on how the tokens are spread over ranks.
 * Device discipline (docs/engine.md): every loop over the slots is a backend op (backend.h
 * "MoE"); the host reads the per-expert counts ("moe dispatch counts": they size the expert
 * loop and the exchange) and, once a step, the routing statistics ("moe routing stats"); the
 * matmuls go through the block's linear (model_linear_forward), so they follow the model's
 * precision (training.precision bf16: bf16 expert rows and weight copies, fp32 router). */
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "model/model_internal.h"

/* the experts' MLP: GELU with biases (fc_b, proj_b), or SwiGLU without (arch.mlp) */
static int gpt2_of(const loom_model *m) { return m->cfg.arch.mlp == LOOM_MLP_GELU; }

/* The op's host scratch (m->moe_scr), in 64-bit words: the dispatch plan's arrays
 * (4 ep + 2 E + El + 1: make_plan, loom_moe_plan), then the exchanged per-expert counts (2 E),
 * then the counts read back from the device (int32: E kept rows per expert, E received). */
static int64_t scr_cnt(const loom_model *m) { return 4 * (int64_t)m->ep + 2 * m->E + m->El + 1; }
static int64_t scr_host(const loom_model *m) { return scr_cnt(m) + 2 * (int64_t)m->E; }
static int64_t moe_scratch_words(const loom_model *m) { return scr_host(m) + m->E; }
/* the per-layer routing statistics on the device: E loads, dropped, assigned, aux, z, tokens */
static int64_t stat_words(const loom_model *m) { return m->E + 5; }

void moe_init(loom_model *m) {
    const loom_model_config *c = &m->cfg;
    if (c->n_expert <= 0) return;
    m->E = c->n_expert;
    m->El = m->lay.e1 - m->lay.e0;
    m->ep = m->E / m->El;
    m->ep_rank = m->lay.e0 / m->El;
    m->S = c->shared_experts;
    /* experts are whole on every tensor-parallel rank (replicated, not split over tp) */
    m->mF = c->d_ff;
    m->mFFI = gpt2_of(m) ? c->d_ff : 2 * c->d_ff;
    m->sF = c->shared_d_ff > 0 ? c->shared_d_ff : c->d_ff;
    m->sFFI = gpt2_of(m) ? m->sF : 2 * m->sF;
    loom_moe_stats *st = &m->moe_stats;
    m->moe_slot = loom_malloc((size_t)c->n_layer * sizeof(int));
    for (int l = 0; l < c->n_layer; l++) {
        m->moe_slot[l] = -1;
        if (l >= m->lay.l0 && l < m->lay.l1 && loom_model_layer_is_moe(m, l)) m->moe_slot[l] = st->n_layers++;
    }
    st->n_expert = m->E;
    const size_t n = st->n_layers > 0 ? (size_t)st->n_layers : 1;
    st->layer = loom_calloc(n, sizeof(int));
    st->load = loom_calloc(n * (size_t)m->E, sizeof(int64_t));
    st->dropped = loom_calloc(n, sizeof(int64_t));
    st->assigned = loom_calloc(n, sizeof(int64_t));
    st->aux_sum = loom_calloc(n, sizeof(double));
    st->z_sum = loom_calloc(n, sizeof(double));
    st->tokens = loom_calloc(n, sizeof(double));
    for (int l = 0; l < c->n_layer; l++)
        if (m->moe_slot[l] >= 0) st->layer[m->moe_slot[l]] = l;
    m->moe_scr = loom_calloc((size_t)moe_scratch_words(m), sizeof(int64_t));
    m->moe_dstats = m->be->mem_alloc(n * (size_t)stat_words(m) * sizeof(double), 0);
    m->moe_hstats = loom_calloc(n * (size_t)stat_words(m), sizeof(double));
}

void moe_free(loom_model *m) {
    loom_moe_stats *st = &m->moe_stats;
    free(st->layer);
    free(st->load);
    free(st->dropped);
    free(st->assigned);
    free(st->aux_sum);
    free(st->z_sum);
    free(st->tokens);
    free(m->moe_slot);
    free(m->moe_scr);
    if (m->moe_dstats) m->be->mem_free(m->moe_dstats);
    free(m->moe_hstats);
}

/* The statistics accumulate on the device (moe_route); they come back here, one named read of
 * (E + 5) doubles per MoE layer (the trainer asks once per step). */
loom_moe_stats *loom_model_moe_stats(loom_model *m) {
    if (m->E == 0) return NULL;
    loom_moe_stats *st = &m->moe_stats;
    const int64_t W = stat_words(m), E = m->E;
    if (st->n_layers == 0) return st;
    loom_dev_read(m->be, m->moe_hstats, m->moe_dstats,
                  (size_t)(st->n_layers * W) * sizeof(double), "moe routing stats");
    for (int i = 0; i < st->n_layers; i++) {
        const double *h = m->moe_hstats + i * W;
        for (int64_t e = 0; e < E; e++) st->load[(size_t)i * E + e] = (int64_t)h[e];
        st->dropped[i] = (int64_t)h[E];
        st->assigned[i] = (int64_t)h[E + 1];
        st->aux_sum[i] = h[E + 2];
        st->z_sum[i] = h[E + 3];
        st->tokens[i] = h[E + 4];
    }
    return st;
}

void loom_model_moe_stats_reset(loom_model *m) {
    loom_moe_stats *st = &m->moe_stats;
    if (m->E == 0) return;
    const size_t n = (size_t)st->n_layers;
    memset(st->load, 0, n * (size_t)m->E * sizeof(int64_t));
    memset(st->dropped, 0, n * sizeof(int64_t));
    memset(st->assigned, 0, n * sizeof(int64_t));
    memset(st->aux_sum, 0, n * sizeof(double));
    memset(st->z_sum, 0, n * sizeof(double));
    memset(st->tokens, 0, n * sizeof(double));
    if (n) m->be->mem_set(m->moe_dstats, 0, n * (size_t)stat_words(m) * sizeof(double));
}

void loom_model_set_moe_comm(loom_model *m, const loom_moe_comm *c) {
    m->has_moe_comm = c != NULL && c->counts != NULL && c->plan != NULL && c->dispatch != NULL &&
                      c->combine != NULL;
    if (c) m->moe_comm = *c;
}

/* the most rows this view's experts can receive: every assignment of every member's N rows */
static int64_t max_rows(const loom_model *m, int64_t N) { return (int64_t)m->ep * N * m->cfg.top_k; }

/* elements (of the slot's dtype) of MoE slot k at N rows */
int64_t moe_slot_floats(const loom_model *m, int k, int64_t N) {
    if (m->E == 0) return 0;
    const int64_t E = m->E, K = m->cfg.top_k, C = m->cfg.d_model, R = max_rows(m, N), S = m->S;
    switch (k) {
    case S_MOE_PROB: return N * E;
    case S_MOE_LSE: return N;
    case S_MOE_ROUTE: return 2 * N * K;
    case S_MOE_X: case S_MOE_Y: return R * C;
    case S_MOE_H: return R * m->mFFI;
    case S_MOE_A: return R * m->mF;
    case S_MOE_YB: return m->ep > 1 ? N * K * C : 0;
    case S_MOE_SH_H: return S * N * m->sFFI;
    case S_MOE_SH_A: return S * N * m->sF;
    /* each shared expert's output when gated, or in bf16 (one rounding of the whole sum) */
    case S_MOE_SH_Y: return S > 0 ? (m->cfg.shared_gate || m->bf16 ? S : 1) * N * C : 0;
    case S_MOE_SH_G: return m->cfg.shared_gate ? S * N : 0;
    case S_MOE_META: return 2 * E + 2 * (int64_t)m->ep + 16;
    default: return 0;
    }
}

int64_t moe_exchange_floats(const loom_model *m, int64_t N) {
    return m->E > 0 && m->ep > 1 ? max_rows(m, N) * m->cfg.d_model : 0;
}

int64_t moe_grad_floats(const loom_model *m, int k, int64_t N) {
    if (m->E == 0) return 0;
    switch (k) {
    case S_MOE_PROB: return N * m->E;                       /* d logits */
    case S_MOE_LSE: return N * m->cfg.top_k;                /* d gate weights */
    case S_MOE_X: case S_MOE_H: case S_MOE_A: case S_MOE_Y: /* the expert rows' gradients */
        return moe_slot_floats(m, k, N);
    case S_MOE_YB: return moe_slot_floats(m, S_MOE_YB, N);  /* d YB; also d x back */
    case S_MOE_SH_H: return m->S > 0 ? N * m->sFFI : 0;      /* one shared expert at a time */
    case S_MOE_SH_A: return m->S > 0 ? N * m->sF : 0;
    case S_MOE_SH_Y: return m->cfg.shared_gate ? N * m->cfg.d_model : 0; /* gate * dy */
    case S_MOE_SH_G: return m->cfg.shared_gate ? N : 0;              /* d gate logits */
    default: return 0;
    }
}

int64_t moe_dout16_elems(const loom_model *m, int64_t N) {
    if (m->E == 0) return 0;
    const int64_t R = max_rows(m, N), C = m->cfg.d_model;
    int64_t n = R * (m->mFFI > C ? m->mFFI : C);
    if (N * m->sFFI > n) n = N * m->sFFI;
    if (N * m->E > n) n = N * m->E;
    return n;
}

/* ---- routing ------------------------------------------------------------------------------ */

/* The routing in S_MOE_ROUTE and S_MOE_META (device, int32), and the counts read back. */
typedef struct route {
    int32_t *e;      /* (N,k) chosen experts, best first */
    int32_t *pos;    /* (N,k) row in the expert-major send order, -1 = dropped */
    int32_t *meta;   /* (E) kept rows per expert, then (ep, El) rows received from each member
                      * for each local expert (the second part written with ep > 1) */
    int32_t *cnt;    /* host: the read of meta's first E */
    int32_t *rcnt;   /* host: meta's second E */
} route;

static route route_of(const loom_model *m, block_frame *f, int64_t N) {
    route r;
    int32_t *ri = (int32_t *)f->s[S_MOE_ROUTE];
    r.e = ri;
    r.pos = ri + N * m->cfg.top_k;
    r.meta = (int32_t *)f->s[S_MOE_META];
    r.cnt = (int32_t *)(m->moe_scr + scr_host(m));
    r.rcnt = r.cnt + m->E;
    return r;
}

/* ---- the exchange's plan (expert parallelism: parallel/ep.c, through m->moe_comm) --------- */

/* The plan's arrays in the op's host scratch over the route's counts; filled by the hook
 * (ep > 1) or, holding every expert, here: no exchange, the local experts' rows in order. */
static void make_plan(const loom_model *m, const route *r, loom_moe_plan *pl) {
    const int El = m->El, ep = m->ep;
    int64_t *mem = m->moe_scr;
    *pl = (loom_moe_plan){.ep = ep, .El = El, .cnt = r->cnt, .rcnt = r->rcnt, .sn = mem,
                          .rn = mem + ep, .tmp = mem + 2 * ep, .roff = mem + 4 * ep + 2 * m->E};
    if (ep > 1) {
        m->moe_comm.plan(m->moe_comm.ctx, pl);
        return;
    }
    pl->sn[0] = pl->rn[0] = 0;
    for (int el = 0; el < El; el++) {
        pl->roff[el] = pl->rows;
        pl->sn[0] += r->cnt[el];
        pl->rows += r->cnt[el];
    }
    pl->roff[El] = pl->rows;
}

/* ---- the experts ------------------------------------------------------------------------- */

/* the bytes of one element of slot k (fp32 or bf16 activations) */
static size_t esz(const loom_model *m, int k) { return loom_dt_size(m->slot_dt[k]); }
/* element i of a slot's buffer */
static void *el_at(const loom_model *m, int k, void *p, int64_t i) {
    return (char *)p + (size_t)i * esz(m, k);
}

/* the activation of n rows of an expert of width F (first matmul width FI = F or 2F) */
static void act_fwd(const loom_model *m, void *a, const void *h, int64_t n, int F) {
    const loom_backend *be = m->be;
    if (m->bf16) {
        if (gpt2_of(m)) be->bf16_gelu_forward(a, h, n * F);
        else be->bf16_glu_forward(a, h, n, F, 0);
    } else if (gpt2_of(m)) {
        be->gelu_forward(a, h, n * F);
    } else {
        be->swiglu_forward(a, h, n, F);
    }
}
static void act_bwd(const loom_model *m, float *dh, const void *h, const float *da, int64_t n,
                    int F) {
    const loom_backend *be = m->be;
    const int FI = gpt2_of(m) ? F : 2 * F;
    be->mem_set(dh, 0, (size_t)(n * FI) * sizeof(float));
    if (m->bf16) {
        if (gpt2_of(m)) be->bf16_gelu_backward(dh, 0, h, da, n * F);
        else be->bf16_glu_backward(dh, h, da, n, F, 0);
    } else if (gpt2_of(m)) {
        be->gelu_backward(dh, h, da, n * F);
    } else {
        be->swiglu_backward(dh, h, da, n, F);
    }
}

/* one expert, the i-th matrices of layer l's tensors w1 (FI,C), b1 (F), w2 (C,F), b2 (C) (a
 * routed one's width m->mF, a shared one's m->sF), over n rows, through the block's linear
 * (model_linear_forward: the model's precision and weight copies) */
typedef struct expert_w { int w1, b1, w2, b2; int64_t i; int F; } expert_w;

static void expert_fwd(loom_model *m, const block_frame *f, int l, const expert_w *w, void *y,
                       void *h, void *a, const void *x, int64_t n) {
    if (n == 0) return;
    const int C = m->cfg.d_model, FI = gpt2_of(m) ? w->F : 2 * w->F;
    model_linear_forward(m, f, l, w->w1, w->b1, w->i, h, x, n, C, FI, 0);
    act_fwd(m, a, h, n, w->F);
    model_linear_forward(m, f, l, w->w2, w->b2, w->i, y, a, n, w->F, C, 0);
}

/* its backward: dx overwritten (or accumulated), weight gradients accumulated */
static void expert_bwd(loom_model *m, const block_frame *f, int l, const expert_w *w, float *dx,
                       float *dh, float *da, const float *dy, const void *x, const void *h,
                       const void *a, int64_t n, int accumulate_dx) {
    if (n == 0) return;
    const int C = m->cfg.d_model, FI = gpt2_of(m) ? w->F : 2 * w->F;
    /* (zeroed, then accumulated: the sums of the host-loop form, bit for bit) */
    m->be->mem_set(da, 0, (size_t)(n * w->F) * sizeof(float));
    model_linear_backward(m, f, l, w->w2, w->b2, w->i, da, 0, 0, dy, a, n, w->F, C);
    act_bwd(m, dh, h, da, n, w->F);
    if (!accumulate_dx) m->be->mem_set(dx, 0, (size_t)(n * C) * sizeof(float));
    model_linear_backward(m, f, l, w->w1, w->b1, w->i, dx, 0, 0, dh, x, n, C, FI);
}

static expert_w routed_w(const loom_model *m, int64_t el) {
    const int gpt2 = gpt2_of(m);
    return (expert_w){LOOM_L_MOE_FC_W, gpt2 ? LOOM_L_MOE_FC_B : -1, LOOM_L_MOE_PROJ_W,
                      gpt2 ? LOOM_L_MOE_PROJ_B : -1, el, m->mF};
}
static expert_w shared_w(const loom_model *m, int64_t s) {
    const int gpt2 = gpt2_of(m);
    return (expert_w){LOOM_L_MOE_SH_FC_W, gpt2 ? LOOM_L_MOE_SH_FC_B : -1, LOOM_L_MOE_SH_PROJ_W,
                      gpt2 ? LOOM_L_MOE_SH_PROJ_B : -1, s, m->sF};
}

void moe_forward(loom_model *m, block_frame *f, int l, int in, int out) {
    const loom_model_config *c = &m->cfg;
    const loom_backend *be = m->be;
    const int64_t N = (int64_t)f->B * f->T, C = c->d_model, K = c->top_k, E = m->E;
    const void *x = f->s[in];
    void *y = f->s[out];
    LOOM_CHECK(m->ep == 1 || m->has_moe_comm);
    LOOM_CHECK(m->slot_dt[S_MOE_PROB] == LOOM_DT_F32 && m->slot_dt[S_MOE_ROUTE] == LOOM_DT_I32);
    /* the router: fp32 logits, then softmax / lse / top-k / capacity / counts on the device */
    float *p = f->s[S_MOE_PROB], *lse = f->s[S_MOE_LSE];
    model_linear_forward(m, f, l, LOOM_L_MOE_ROUTER_W, -1, 0, p, x, N, (int)C, (int)E, 1);
    route r = route_of(m, f, N);
    const int64_t G = c->group_tokens > 0 ? c->group_tokens : f->T;
    const int capped = f->train && c->capacity_factor > 0.0f;
    const int si = m->moe_slot[l];
    double *stats = f->train && !f->recompute && si >= 0 ? m->moe_dstats + si * stat_words(m)
                                                         : NULL;
    be->moe_route(p, lse, r.e, r.pos, r.meta, stats, N, (int)E, (int)K, G,
                  capped ? c->capacity_factor : 0.0f);
    /* the host reads the per-expert counts only: they size the dispatch */
    loom_dev_read(be, r.cnt, r.meta, (size_t)E * sizeof(int32_t), "moe dispatch counts");
    loom_moe_plan pl;
    void *X = f->s[S_MOE_X], *Y = f->s[S_MOE_Y], *YB = Y;
    const size_t xrow = (size_t)C * esz(m, S_MOE_X);
    if (m->ep == 1) {
        make_plan(m, &r, &pl);
        be->moe_gather(X, x, r.pos, N, (int)K, xrow);
    } else { /* rows to the experts' members, counts first */
        int64_t *sc = m->moe_scr + scr_cnt(m), *rc = sc + E;
        for (int e = 0; e < E; e++) sc[e] = r.cnt[e];
        m->moe_comm.counts(m->moe_comm.ctx, sc, rc, m->El);
        for (int e = 0; e < E; e++) r.rcnt[e] = (int32_t)rc[e];
        /* kept beside the counts for the backward (which reads both back) */
        be->mem_h2d(r.meta + E, r.rcnt, (size_t)E * sizeof(int32_t));
        make_plan(m, &r, &pl);
        be->moe_gather(f->moe_t0, x, r.pos, N, (int)K, xrow);
        m->moe_comm.dispatch(m->moe_comm.ctx, &pl, f->moe_t0, f->moe_t1, X, xrow);
        YB = f->s[S_MOE_YB];
    }
    for (int el = 0; el < m->El; el++) {
        const int64_t r0 = pl.roff[el], n = pl.roff[el + 1] - r0;
        const expert_w w = routed_w(m, el);
        expert_fwd(m, f, l, &w, el_at(m, S_MOE_Y, Y, r0 * C),
                   el_at(m, S_MOE_H, f->s[S_MOE_H], r0 * m->mFFI),
                   el_at(m, S_MOE_A, f->s[S_MOE_A], r0 * m->mF), el_at(m, S_MOE_X, X, r0 * C), n);
    }
    if (m->ep > 1) /* the outputs back to the tokens' members */
        m->moe_comm.combine(m->moe_comm.ctx, &pl, Y, f->moe_t1, YB,
                            (size_t)C * esz(m, S_MOE_Y));
    /* shared experts: every token; model.moe.shared_gate: scaled by sigmoid(x . w_s) (float32,
     * as transformers) */
    const int gated = c->shared_gate;
    for (int s = 0; s < m->S; s++) {
        void *ys = el_at(m, S_MOE_SH_Y, f->s[S_MOE_SH_Y], gated || m->bf16 ? s * N * C : 0);
        const expert_w w = shared_w(m, s);
        expert_fwd(m, f, l, &w, ys, el_at(m, S_MOE_SH_H, f->s[S_MOE_SH_H], s * N * m->sFFI),
                   el_at(m, S_MOE_SH_A, f->s[S_MOE_SH_A], s * N * m->sF), x, N);
        if (gated) {
            float *g = f->s[S_MOE_SH_G] + s * N;
            model_linear_forward(m, f, l, LOOM_L_MOE_SH_GATE_W, -1, s, g, x, N, (int)C, 1, 1);
            be->moe_sigmoid(g, N);
        }
        if (m->bf16) continue; /* summed with the routed experts' outputs below */
        if (s == 0) be->moe_combine(y, YB, p, r.e, r.pos, N, (int)E, (int)K, (int)C,
                                    c->arch.moe_renorm);
        if (gated) be->moe_gate_add(y, f->s[S_MOE_SH_G] + s * N, ys, N, (int)C);
        else be->residual_forward(y, y, ys, N * C);
    }
    if (m->bf16) /* one rounding of the routed and shared experts' sum */
        be->bf16_moe_combine(y, YB, p, r.e, r.pos, N, (int)E, (int)K, (int)C, c->arch.moe_renorm,
                             m->S > 0 ? (const uint16_t *)f->s[S_MOE_SH_Y] : NULL, gated ? f->s[S_MOE_SH_G] : NULL,
                             m->S);
    else if (m->S == 0)
        be->moe_combine(y, YB, p, r.e, r.pos, N, (int)E, (int)K, (int)C, c->arch.moe_renorm);
}

void moe_backward(loom_model *m, block_frame *f, int l, int in, int out) {
    const loom_model_config *c = &m->cfg;
    const loom_backend *be = m->be;
    const int64_t N = (int64_t)f->B * f->T, C = c->d_model, K = c->top_k, E = m->E;
    const void *x = f->s[in];
    const float *dy = f->g[out];
    float *dx = f->g[in];
    route r = route_of(m, f, N);
    const float *p = f->s[S_MOE_PROB], *lse = f->s[S_MOE_LSE];
    /* the counts (and under ep the received counts) the forward left beside the routing */
    loom_dev_read(be, r.cnt, r.meta, (size_t)(m->ep > 1 ? 2 : 1) * (size_t)E * sizeof(int32_t),
                  "moe dispatch counts");
    loom_moe_plan pl;
    make_plan(m, &r, &pl);
    be->mem_set(dx, 0, (size_t)(N * C) * sizeof(float));
    /* shared experts (gated: d ys = g dy; d logit = <dy, ys> g (1 - g) into dx and d w_s) */
    for (int s = 0; s < m->S; s++) {
        const float *dys = dy;
        const expert_w w = shared_w(m, s);
        if (c->shared_gate) {
            const float *g = f->s[S_MOE_SH_G] + s * N;
            const void *ys = el_at(m, S_MOE_SH_Y, f->s[S_MOE_SH_Y], s * N * C);
            float *dg = f->g[S_MOE_SH_Y], *dz = f->g[S_MOE_SH_G];
            if (m->bf16) be->bf16_moe_gate_backward(dg, dz, dy, g, ys, N, (int)C);
            else be->moe_gate_backward(dg, dz, dy, g, ys, N, (int)C);
            model_linear_backward(m, f, l, LOOM_L_MOE_SH_GATE_W, -1, s, dx, 0, 0, dz, x, N, (int)C,
                                  1);
            dys = dg;
        }
        expert_bwd(m, f, l, &w, dx, f->g[S_MOE_SH_H], f->g[S_MOE_SH_A], dys, x,
                   el_at(m, S_MOE_SH_H, f->s[S_MOE_SH_H], s * N * m->sFFI),
                   el_at(m, S_MOE_SH_A, f->s[S_MOE_SH_A], s * N * m->sF), N, 1);
    }
    /* combine: d(expert output) = w dy, d w = <dy, expert output> */
    const void *YB = m->ep > 1 ? f->s[S_MOE_YB] : f->s[S_MOE_Y];
    float *dYB = m->ep > 1 ? f->g[S_MOE_YB] : f->g[S_MOE_Y];
    float *dw = f->g[S_MOE_LSE];
    if (m->bf16)
        be->bf16_moe_combine_backward(dYB, dw, dy, YB, p, r.e, r.pos, N, (int)E, (int)K, (int)C,
                                      c->arch.moe_renorm);
    else
        be->moe_combine_backward(dYB, dw, dy, YB, p, r.e, r.pos, N, (int)E, (int)K, (int)C,
                                 c->arch.moe_renorm);
    float *dY = f->g[S_MOE_Y], *dX = f->g[S_MOE_X];
    const size_t grow = (size_t)C * sizeof(float);
    if (m->ep > 1) m->moe_comm.dispatch(m->moe_comm.ctx, &pl, dYB, f->moe_t1, dY, grow);
    for (int el = 0; el < m->El; el++) {
        const int64_t r0 = pl.roff[el], n = pl.roff[el + 1] - r0;
        const expert_w w = routed_w(m, el);
        expert_bwd(m, f, l, &w, dX + r0 * C, f->g[S_MOE_H] + r0 * m->mFFI,
                   f->g[S_MOE_A] + r0 * m->mF, dY + r0 * C,
                   el_at(m, S_MOE_X, f->s[S_MOE_X], r0 * C),
                   el_at(m, S_MOE_H, f->s[S_MOE_H], r0 * m->mFFI),
                   el_at(m, S_MOE_A, f->s[S_MOE_A], r0 * m->mF), n, 0);
    }
    const float *dXB = dX;
    if (m->ep > 1) { /* the rows' input gradients back to the tokens' members */
        m->moe_comm.combine(m->moe_comm.ctx, &pl, dX, f->moe_t1, f->moe_t0, grow);
        dXB = f->moe_t0;
    }
    be->moe_scatter_add(dx, dXB, r.pos, N, (int)K, (int)C);
    /* the router: d p from the gate weights and the balance loss, softmax backward, z-loss */
    float *dl = f->g[S_MOE_PROB];
    const int64_t G = c->group_tokens > 0 ? c->group_tokens : f->T;
    be->moe_router_backward(dl, p, lse, r.e, r.pos, dw, N, (int)E, (int)K, G,
                            (double)c->aux_loss_coef * f->dscale,
                            (double)c->z_loss_coef * f->dscale, c->arch.moe_renorm);
    model_linear_backward(m, f, l, LOOM_L_MOE_ROUTER_W, -1, 0, dx, 0, 0, dl, x, N, (int)C, (int)E);
}
