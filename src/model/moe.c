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
 * on how the tokens are spread over ranks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "model/model_internal.h"

/* the experts' MLP: GELU with biases (fc_b, proj_b), or SwiGLU without (arch.mlp) */
static int gpt2_of(const loom_model *m) { return m->cfg.arch.mlp == LOOM_MLP_GELU; }

/* The op's scratch (m->moe_scr), in 64-bit words; the parts live at the same time:
 *   [SCR_PLAN]  the dispatch plan's arrays: 4 ep + 2 E + El + 1 (make_plan, loom_moe_plan)
 *   [SCR_ROUTE] route_tokens' per-expert counts and mean probabilities: 3 E
 *   [SCR_CNT]   the exchanged per-expert counts: 2 E
 *   [SCR_BWD]   the router backward's f_e and d p: 2 E */
static int64_t scr_plan(const loom_model *m) { return 0; }
static int64_t scr_route(const loom_model *m) { return 4 * (int64_t)m->ep + 2 * m->E + m->El + 1; }
static int64_t scr_cnt(const loom_model *m) { return scr_route(m) + 3 * (int64_t)m->E; }
static int64_t scr_bwd(const loom_model *m) { return scr_cnt(m) + 2 * (int64_t)m->E; }
static int64_t moe_scratch_words(const loom_model *m) { return scr_bwd(m) + 2 * (int64_t)m->E; }

/* the gate weight of choice j of a token (its probabilities p (E), choices e (K)): p[e_j], or
 * with arch.moe_renorm p[e_j] over the sum of its top k (float32, as transformers) */
static float gate_weight(const loom_model *m, const float *p, const int32_t *e, int j) {
    if (!m->cfg.arch.moe_renorm) return p[e[j]];
    float S = 0.0f;
    for (int i = 0; i < m->cfg.top_k; i++) S += p[e[i]];
    return p[e[j]] / S;
}

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
}

loom_moe_stats *loom_model_moe_stats(loom_model *m) { return m->E > 0 ? &m->moe_stats : NULL; }

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
}

void loom_model_set_moe_comm(loom_model *m, const loom_moe_comm *c) {
    m->has_moe_comm = c != NULL && c->counts != NULL && c->plan != NULL && c->dispatch != NULL &&
                      c->combine != NULL;
    if (c) m->moe_comm = *c;
}

/* the most rows this view's experts can receive: every assignment of every member's N rows */
static int64_t max_rows(const loom_model *m, int64_t N) { return (int64_t)m->ep * N * m->cfg.top_k; }

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
    case S_MOE_SH_Y: return S > 0 ? (m->cfg.shared_gate ? S : 1) * N * C : 0;
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

/* ---- routing ------------------------------------------------------------------------------ */

/* The view of the routing kept in S_MOE_ROUTE and S_MOE_META. */
typedef struct route {
    int32_t *e;      /* (N,k) chosen experts, best first */
    int32_t *pos;    /* (N,k) row in the expert-major send order, -1 = dropped */
    int32_t *cnt;    /* (E) kept rows per expert (what this view sends) */
    int32_t *rcnt;   /* (ep, El) rows received from each member for each local expert */
} route;

static route route_of(const loom_model *m, block_frame *f, int64_t N) {
    route r;
    int32_t *ri = (int32_t *)f->s[S_MOE_ROUTE], *meta = (int32_t *)f->s[S_MOE_META];
    r.e = ri;
    r.pos = ri + N * m->cfg.top_k;
    r.cnt = meta;
    r.rcnt = meta + m->E;
    return r;
}

/* router probabilities, top-k choices, capacity; returns nothing, fills the route and the
 * routing statistics */
static void route_tokens(loom_model *m, block_frame *f, int l, const float *x, int64_t N) {
    const loom_model_config *c = &m->cfg;
    const int E = m->E, K = c->top_k, C = c->d_model;
    float *p = f->s[S_MOE_PROB], *lse = f->s[S_MOE_LSE];
    route r = route_of(m, f, N);
    m->be->matmul_forward(p, x, LP(m, LOOM_L_MOE_ROUTER_W, l), NULL, N, C, E); /* logits */
    for (int64_t t = 0; t < N; t++) {
        float *row = p + t * E;
        float mx = row[0];
        for (int e = 1; e < E; e++) mx = row[e] > mx ? row[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += exp((double)row[e] - mx);
        const double ls = mx + log(sum);
        lse[t] = (float)ls;
        for (int e = 0; e < E; e++) row[e] = (float)exp((double)row[e] - ls);
        for (int j = 0; j < K; j++) { /* the j-th best not yet taken; ties: the lower index */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= r.e[t * K + i] == e;
                if (!taken && (best < 0 || row[e] > row[best])) best = e;
            }
            r.e[t * K + j] = best;
        }
    }
    const int64_t G = c->group_tokens > 0 ? c->group_tokens : f->T;
    const int capped = f->train && c->capacity_factor > 0.0f;
    const int counted = f->train && !f->recompute && m->moe_slot[l] >= 0;
    loom_moe_stats *st = &m->moe_stats;
    const int si = m->moe_slot[l];
    int64_t *all = m->moe_scr + scr_route(m), *fill = all + E;
    double *pm = (double *)(fill + E);
    for (int e = 0; e < E; e++) r.cnt[e] = 0;
    for (int64_t g0 = 0; g0 < N; g0 += G) {
        const int64_t g1 = g0 + G < N ? g0 + G : N, Gg = g1 - g0;
        const int64_t cap = capped ? (int64_t)floor((double)c->capacity_factor * K * (double)Gg / E)
                                   : INT64_MAX;
        memset(all, 0, (size_t)E * sizeof(int64_t));
        memset(fill, 0, (size_t)E * sizeof(int64_t));
        memset(pm, 0, (size_t)E * sizeof(double));
        int64_t dropped = 0;
        for (int j = 0; j < K; j++) /* first choices first, then in token order */
            for (int64_t t = g0; t < g1; t++) {
                const int e = r.e[t * K + j];
                all[e]++;
                if (fill[e] < cap) {
                    fill[e]++;
                    r.pos[t * K + j] = 0; /* kept: its row is numbered below */
                } else {
                    r.pos[t * K + j] = -1;
                    dropped++;
                }
            }
        if (counted) {
            for (int64_t t = g0; t < g1; t++)
                for (int e = 0; e < E; e++) pm[e] += p[t * E + e];
            double aux = 0;
            for (int e = 0; e < E; e++) aux += (double)all[e] / (double)(Gg * K) * (pm[e] / (double)Gg);
            st->aux_sum[si] += (double)Gg * E * aux;
            st->tokens[si] += (double)Gg;
            st->dropped[si] += dropped;
            st->assigned[si] += Gg * K;
            for (int e = 0; e < E; e++) st->load[(size_t)si * E + e] += all[e];
            for (int64_t t = g0; t < g1; t++) st->z_sum[si] += (double)lse[t] * lse[t];
        }
    }
    /* number the kept rows expert-major, tokens in order */
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++)
            if (r.pos[t * K + j] >= 0) r.cnt[r.e[t * K + j]]++;
    int64_t *next = all; /* reused: the next row of each expert */
    int64_t at = 0;
    for (int e = 0; e < E; e++) {
        next[e] = at;
        at += r.cnt[e];
    }
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++)
            if (r.pos[t * K + j] >= 0) r.pos[t * K + j] = (int32_t)next[r.e[t * K + j]]++;
}

/* ---- the exchange's plan (expert parallelism: parallel/ep.c, through m->moe_comm) --------- */

/* The plan's arrays in the op's scratch (4 ep + 2 E + El + 1 words at SCR_PLAN) over the route's
 * counts; filled by the hook (ep > 1) or, holding every expert, here: no exchange, the local
 * experts' rows in order. */
static void make_plan(const loom_model *m, const route *r, loom_moe_plan *pl) {
    const int El = m->El, ep = m->ep;
    int64_t *mem = m->moe_scr + scr_plan(m);
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

static const float *ew(const loom_model *m, int kind, int l, int64_t i, int64_t per) {
    const float *p = LP(m, kind, l);
    return p ? p + i * per : NULL;
}
static float *eg(const loom_model *m, int kind, int l, int64_t i, int64_t per) {
    float *p = LG(m, kind, l);
    return p ? p + i * per : NULL;
}

/* the activation of n rows of an expert of width F (first matmul width FI = F or 2F) */
static void act_fwd(const loom_model *m, float *a, const float *h, int64_t n, int F) {
    if (gpt2_of(m)) m->be->gelu_forward(a, h, n * F);
    else m->be->swiglu_forward(a, h, n, F);
}
static void act_bwd(const loom_model *m, float *dh, const float *h, const float *da, int64_t n,
                    int F) {
    const int FI = gpt2_of(m) ? F : 2 * F;
    memset(dh, 0, (size_t)(n * FI) * sizeof(float));
    if (gpt2_of(m)) m->be->gelu_backward(dh, h, da, n * F);
    else m->be->swiglu_backward(dh, h, da, n, F);
}

/* one expert of width F (a routed one's m->mF, a shared one's m->sF; weights w1 (FI,C),
 * b1 (F), w2 (C,F), b2 (C)) over n rows */
static void expert_fwd(const loom_model *m, int F, float *y, float *h, float *a, const float *x,
                       const float *w1, const float *b1, const float *w2, const float *b2,
                       int64_t n) {
    if (n == 0) return;
    const int C = m->cfg.d_model;
    m->be->matmul_forward(h, x, w1, b1, n, C, gpt2_of(m) ? F : 2 * F);
    act_fwd(m, a, h, n, F);
    m->be->matmul_forward(y, a, w2, b2, n, F, C);
}

/* its backward: dx = (not accumulated: overwritten), weight gradients accumulated */
static void expert_bwd(const loom_model *m, int F, float *dx, float *dh, float *da,
                       const float *dy, const float *x, const float *h, const float *a,
                       const float *w1, const float *w2, float *dw1, float *db1, float *dw2,
                       float *db2, int64_t n, int accumulate_dx) {
    if (n == 0) return;
    const int C = m->cfg.d_model;
    memset(da, 0, (size_t)(n * F) * sizeof(float));
    m->be->matmul_backward(da, dw2, db2, dy, a, w2, n, F, C);
    act_bwd(m, dh, h, da, n, F);
    if (!accumulate_dx) memset(dx, 0, (size_t)(n * C) * sizeof(float));
    m->be->matmul_backward(dx, dw1, db1, dh, x, w1, n, C, gpt2_of(m) ? F : 2 * F);
}

void moe_forward(loom_model *m, block_frame *f, int l, int in, int out) {
    const loom_model_config *c = &m->cfg;
    const int64_t N = (int64_t)f->B * f->T, C = c->d_model, K = c->top_k, E = m->E;
    const int64_t FC = (int64_t)m->mFFI * C, PC = C * m->mF;
    const float *x = f->s[in];
    float *y = f->s[out];
    LOOM_CHECK(m->ep == 1 || m->has_moe_comm);
    route_tokens(m, f, l, x, N);
    route r = route_of(m, f, N);
    const float *p = f->s[S_MOE_PROB];
    loom_moe_plan pl;
    float *X = f->s[S_MOE_X], *Y = f->s[S_MOE_Y], *YB = Y;
    if (m->ep == 1) {
        make_plan(m, &r, &pl);
        for (int64_t t = 0; t < N; t++)
            for (int64_t j = 0; j < K; j++)
                if (r.pos[t * K + j] >= 0)
                    memcpy(X + (int64_t)r.pos[t * K + j] * C, x + t * C, (size_t)C * sizeof(float));
    } else { /* rows to the experts' members, counts first */
        int64_t *sc = m->moe_scr + scr_cnt(m), *rc = sc + E;
        for (int e = 0; e < E; e++) sc[e] = r.cnt[e];
        m->moe_comm.counts(m->moe_comm.ctx, sc, rc, m->El);
        for (int e = 0; e < E; e++) r.rcnt[e] = (int32_t)rc[e];
        make_plan(m, &r, &pl);
        float *send = f->moe_t0, *recv = f->moe_t1;
        for (int64_t t = 0; t < N; t++)
            for (int64_t j = 0; j < K; j++)
                if (r.pos[t * K + j] >= 0)
                    memcpy(send + (int64_t)r.pos[t * K + j] * C, x + t * C, (size_t)C * sizeof(float));
        m->moe_comm.dispatch(m->moe_comm.ctx, &pl, send, recv, X, C);
        YB = f->s[S_MOE_YB];
    }
    const int gpt2 = gpt2_of(m);
    for (int el = 0; el < m->El; el++) {
        const int64_t r0 = pl.roff[el], n = pl.roff[el + 1] - r0;
        expert_fwd(m, m->mF, Y + r0 * C, f->s[S_MOE_H] + r0 * m->mFFI, f->s[S_MOE_A] + r0 * m->mF,
                   X + r0 * C, ew(m, LOOM_L_MOE_FC_W, l, el, FC),
                   gpt2 ? ew(m, LOOM_L_MOE_FC_B, l, el, m->mF) : NULL,
                   ew(m, LOOM_L_MOE_PROJ_W, l, el, PC),
                   gpt2 ? ew(m, LOOM_L_MOE_PROJ_B, l, el, C) : NULL, n);
    }
    if (m->ep > 1) { /* the outputs back to the tokens' members */
        m->moe_comm.combine(m->moe_comm.ctx, &pl, Y, f->moe_t1, YB, C);
    }
    memset(y, 0, (size_t)(N * C) * sizeof(float));
    for (int64_t t = 0; t < N; t++)
        for (int64_t j = 0; j < K; j++) {
            const int32_t q = r.pos[t * K + j];
            if (q < 0) continue;
            const float w = gate_weight(m, p + t * E, r.e + t * K, j);
            const float *src = YB + (int64_t)q * C;
            float *dst = y + t * C;
            for (int64_t i = 0; i < C; i++) dst[i] += w * src[i];
        }
    const int64_t SFC = (int64_t)m->sFFI * C, SPC = C * m->sF;
    for (int s = 0; s < m->S; s++) { /* shared experts: every token */
        const int gated = c->shared_gate;
        float *ys = f->s[S_MOE_SH_Y] + (gated ? s * N * C : 0);
        expert_fwd(m, m->sF, ys, f->s[S_MOE_SH_H] + s * N * m->sFFI,
                   f->s[S_MOE_SH_A] + s * N * m->sF, x, ew(m, LOOM_L_MOE_SH_FC_W, l, s, SFC),
                   gpt2 ? ew(m, LOOM_L_MOE_SH_FC_B, l, s, m->sF) : NULL,
                   ew(m, LOOM_L_MOE_SH_PROJ_W, l, s, SPC),
                   gpt2 ? ew(m, LOOM_L_MOE_SH_PROJ_B, l, s, C) : NULL, N);
        if (!gated) {
            for (int64_t i = 0; i < N * C; i++) y[i] += ys[i];
            continue;
        }
        /* model.moe.shared_gate: y += sigmoid(x . w_s) ys (float32, as transformers) */
        float *g = f->s[S_MOE_SH_G] + s * N;
        m->be->matmul_forward(g, x, ew(m, LOOM_L_MOE_SH_GATE_W, l, s, C), NULL, N, (int)C, 1);
        for (int64_t t = 0; t < N; t++) {
            g[t] = 1.0f / (1.0f + expf(-g[t]));
            for (int64_t i = 0; i < C; i++) y[t * C + i] += g[t] * ys[t * C + i];
        }
    }
}

void moe_backward(loom_model *m, block_frame *f, int l, int in, int out) {
    const loom_model_config *c = &m->cfg;
    const int64_t N = (int64_t)f->B * f->T, C = c->d_model, K = c->top_k, E = m->E;
    const int64_t FC = (int64_t)m->mFFI * C, PC = C * m->mF;
    const int gpt2 = gpt2_of(m);
    const float *x = f->s[in], *dy = f->g[out];
    float *dx = f->g[in];
    route r = route_of(m, f, N);
    const float *p = f->s[S_MOE_PROB], *lse = f->s[S_MOE_LSE];
    loom_moe_plan pl;
    make_plan(m, &r, &pl);
    memset(dx, 0, (size_t)(N * C) * sizeof(float));
    /* shared experts (gated: d ys = g dy; d logit = <dy, ys> g (1 - g) into dx and d w_s) */
    const int64_t SFC = (int64_t)m->sFFI * C, SPC = C * m->sF;
    for (int s = 0; s < m->S; s++) {
        const float *dys = dy;
        if (c->shared_gate) {
            const float *g = f->s[S_MOE_SH_G] + s * N, *ys = f->s[S_MOE_SH_Y] + s * N * C;
            float *dg = f->g[S_MOE_SH_Y], *dz = f->g[S_MOE_SH_G];
            for (int64_t t = 0; t < N; t++) {
                double dot = 0;
                for (int64_t i = 0; i < C; i++) {
                    dg[t * C + i] = g[t] * dy[t * C + i];
                    dot += (double)dy[t * C + i] * ys[t * C + i];
                }
                dz[t] = (float)(dot * g[t] * (1.0 - g[t]));
            }
            m->be->matmul_backward(dx, eg(m, LOOM_L_MOE_SH_GATE_W, l, s, C), NULL, dz, x,
                                   ew(m, LOOM_L_MOE_SH_GATE_W, l, s, C), N, (int)C, 1);
            dys = dg;
        }
        expert_bwd(m, m->sF, dx, f->g[S_MOE_SH_H], f->g[S_MOE_SH_A], dys, x,
                   f->s[S_MOE_SH_H] + s * N * m->sFFI, f->s[S_MOE_SH_A] + s * N * m->sF,
                   ew(m, LOOM_L_MOE_SH_FC_W, l, s, SFC), ew(m, LOOM_L_MOE_SH_PROJ_W, l, s, SPC),
                   eg(m, LOOM_L_MOE_SH_FC_W, l, s, SFC),
                   gpt2 ? eg(m, LOOM_L_MOE_SH_FC_B, l, s, m->sF) : NULL,
                   eg(m, LOOM_L_MOE_SH_PROJ_W, l, s, SPC),
                   gpt2 ? eg(m, LOOM_L_MOE_SH_PROJ_B, l, s, C) : NULL, N, 1);
    }
    /* combine: d(expert output) = w dy, d w = <dy, expert output> */
    const float *YB = m->ep > 1 ? f->s[S_MOE_YB] : f->s[S_MOE_Y];
    float *dYB = m->ep > 1 ? f->g[S_MOE_YB] : f->g[S_MOE_Y];
    float *dw = f->g[S_MOE_LSE];
    for (int64_t t = 0; t < N; t++)
        for (int64_t j = 0; j < K; j++) {
            const int32_t q = r.pos[t * K + j];
            dw[t * K + j] = 0;
            if (q < 0) continue;
            const float w = gate_weight(m, p + t * E, r.e + t * K, j);
            const float *g = dy + t * C, *yq = YB + (int64_t)q * C;
            float *d = dYB + (int64_t)q * C;
            double dot = 0;
            for (int64_t i = 0; i < C; i++) {
                d[i] = w * g[i];
                dot += (double)g[i] * yq[i];
            }
            dw[t * K + j] = (float)dot;
        }
    float *dY = f->g[S_MOE_Y], *dX = f->g[S_MOE_X];
    if (m->ep > 1) {
        m->moe_comm.dispatch(m->moe_comm.ctx, &pl, dYB, f->moe_t1, dY, C);
    }
    for (int el = 0; el < m->El; el++) {
        const int64_t r0 = pl.roff[el], n = pl.roff[el + 1] - r0;
        expert_bwd(m, m->mF, dX + r0 * C, f->g[S_MOE_H] + r0 * m->mFFI, f->g[S_MOE_A] + r0 * m->mF,
                   dY + r0 * C, f->s[S_MOE_X] + r0 * C, f->s[S_MOE_H] + r0 * m->mFFI,
                   f->s[S_MOE_A] + r0 * m->mF, ew(m, LOOM_L_MOE_FC_W, l, el, FC),
                   ew(m, LOOM_L_MOE_PROJ_W, l, el, PC), eg(m, LOOM_L_MOE_FC_W, l, el, FC),
                   gpt2 ? eg(m, LOOM_L_MOE_FC_B, l, el, m->mF) : NULL,
                   eg(m, LOOM_L_MOE_PROJ_W, l, el, PC),
                   gpt2 ? eg(m, LOOM_L_MOE_PROJ_B, l, el, C) : NULL, n, 0);
    }
    const float *dXB = dX;
    if (m->ep > 1) { /* the rows' input gradients back to the tokens' members */
        m->moe_comm.combine(m->moe_comm.ctx, &pl, dX, f->moe_t1, f->moe_t0, C);
        dXB = f->moe_t0;
    }
    for (int64_t t = 0; t < N; t++)
        for (int64_t j = 0; j < K; j++) {
            const int32_t q = r.pos[t * K + j];
            if (q < 0) continue;
            const float *src = dXB + (int64_t)q * C;
            float *d = dx + t * C;
            for (int64_t i = 0; i < C; i++) d[i] += src[i];
        }
    /* the router: d p from the gate weights and the balance loss, softmax backward, z-loss */
    float *dl = f->g[S_MOE_PROB];
    const int64_t G = c->group_tokens > 0 ? c->group_tokens : f->T;
    const double aux = (double)c->aux_loss_coef * f->dscale, zc = (double)c->z_loss_coef * f->dscale;
    double *fe = (double *)(m->moe_scr + scr_bwd(m)), *dp = fe + E;
    for (int64_t g0 = 0; g0 < N; g0 += G) {
        const int64_t g1 = g0 + G < N ? g0 + G : N, Gg = g1 - g0;
        memset(fe, 0, (size_t)E * sizeof(double));
        for (int64_t t = g0; t < g1; t++)
            for (int64_t j = 0; j < K; j++) fe[r.e[t * K + j]] += 1.0;
        for (int e = 0; e < E; e++) fe[e] /= (double)(Gg * K);
        for (int64_t t = g0; t < g1; t++) {
            const float *pt = p + t * E;
            for (int e = 0; e < E; e++) dp[e] = aux * E * fe[e];
            if (c->arch.moe_renorm) { /* w_j = p_j / S over the top k: dp_j = (dw_j - sum_i dw_i w_i) / S */
                double S = 0, sw = 0;
                for (int64_t j = 0; j < K; j++) S += pt[r.e[t * K + j]];
                for (int64_t j = 0; j < K; j++)
                    if (r.pos[t * K + j] >= 0)
                        sw += (double)dw[t * K + j] * gate_weight(m, pt, r.e + t * K, (int)j);
                for (int64_t j = 0; j < K; j++)
                    dp[r.e[t * K + j]] += ((r.pos[t * K + j] >= 0 ? dw[t * K + j] : 0.0) - sw) / S;
            } else {
                for (int64_t j = 0; j < K; j++)
                    if (r.pos[t * K + j] >= 0) dp[r.e[t * K + j]] += dw[t * K + j];
            }
            double sum = 0;
            for (int e = 0; e < E; e++) sum += pt[e] * dp[e];
            for (int e = 0; e < E; e++)
                dl[t * E + e] = (float)(pt[e] * (dp[e] - sum) + zc * 2.0 * lse[t] * pt[e]);
        }
    }
    m->be->matmul_backward(dx, LG(m, LOOM_L_MOE_ROUTER_W, l), NULL, dl, x,
                           LP(m, LOOM_L_MOE_ROUTER_W, l), N, (int)C, (int)E);
}
