/* loom model: the decoder's forward and backward over the activation arena (the embedding,
 * the layers' blocks (block.c), the final norm, the LM or classification head and the loss),
 * with the hooks around each unit's parameters, the communication points of tensor, sequence,
 * context and pipeline parallelism, and the FLOP count. Creation, the parameter layout and init
 * are model.c. */
#include "loom/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/lora.h"
#include "model/model_internal.h"

/* hooks around each use of a unit's parameters; a no-op without hooks */
/* the gradient buffer of unit u, asked of the hooks once per backward before the first write */
static void ensure_grads(loom_model *m, int u) {
    if (m->has_hooks && m->hooks.grads && !m->have_grads[u]) {
        m->gbase[u] = m->hooks.grads(m->hooks.ctx, u);
        m->have_grads[u] = 1;
    }
    LOOM_CHECK(m->gbase[u] != NULL);
}
static void acquire(loom_model *m, int u, int phase) {
    if (m->has_hooks && m->hooks.acquire_params) m->pbase[u] = m->hooks.acquire_params(m->hooks.ctx, u, phase);
    LOOM_CHECK(m->pbase[u] != NULL);
    if (m->bf16) model_bf16_refresh(m, u); /* the unit's bf16 copy, when its masters changed */
    if (phase == 1) ensure_grads(m, u);
}
static void release(loom_model *m, int u, int phase) {
    if (m->has_hooks && m->hooks.release_params) m->hooks.release_params(m->hooks.ctx, u, phase);
}
static void grads_ready(loom_model *m, int u) {
    if (m->has_hooks && m->hooks.grads_ready) m->hooks.grads_ready(m->hooks.ctx, u);
}


void model_norm_fwd(const loom_model *m, float *out, float *mean, float *rstd, const float *in,
                    const float *w, const float *b, int64_t N) {
    if (m->bf16) { /* training.precision bf16: bf16 rows in and out (fp32 statistics) */
        if (m->cfg.arch.norm == LOOM_NORM_LAYER)
            m->be->bf16_layernorm_forward((uint16_t *)out, mean, rstd, (const uint16_t *)in, w,
                                          b, N, m->cfg.d_model, m->cfg.norm_eps);
        else
            m->be->bf16_rmsnorm_forward((uint16_t *)out, rstd, (const uint16_t *)in, w, N,
                                        m->cfg.d_model, m->cfg.norm_eps);
        return;
    }
    if (m->cfg.arch.norm == LOOM_NORM_LAYER)
        m->be->layernorm_forward(out, mean, rstd, in, w, b, N, m->cfg.d_model, m->cfg.norm_eps);
    else
        m->be->rmsnorm_forward(out, rstd, in, w, N, m->cfg.d_model, m->cfg.norm_eps);
}

static void norm_bwd(const loom_model *m, float *din, float *dw, float *db, const float *dout,
                     const float *in, const float *w, const float *mean, const float *rstd,
                     int64_t N) {
    if (m->bf16) { /* in: the bf16 rows the forward normed */
        if (m->cfg.arch.norm == LOOM_NORM_LAYER)
            m->be->bf16_layernorm_backward(din, dw, db, dout, (const uint16_t *)in, w, mean, rstd,
                                           N, m->cfg.d_model);
        else
            m->be->bf16_rmsnorm_backward(din, dw, dout, (const uint16_t *)in, w, rstd, N,
                                         m->cfg.d_model);
        return;
    }
    if (m->cfg.arch.norm == LOOM_NORM_LAYER)
        m->be->layernorm_backward(din, dw, db, dout, in, w, mean, rstd, N, m->cfg.d_model);
    else
        m->be->rmsnorm_backward(din, dw, dout, in, w, rstd, N, m->cfg.d_model);
}

void model_softcap(const loom_model *m, float *logits, int64_t n) {
    if (m->cfg.arch.final_softcap > 0.0f)
        m->be->softcap_forward(logits, n, m->cfg.arch.final_softcap);
}

/* the LM head's in-place cross-entropy backward of N rows of V (soft-capped) logits */
static void ce_backward(const loom_model *m, float *logits, const int32_t *targets, int64_t N,
                        int V, float dscale, const float *rw) {
    const float cap = m->cfg.arch.final_softcap;
    if (cap > 0.0f) m->be->crossentropy_softcap_backward(logits, targets, N, V, dscale, cap, rw);
    else m->be->crossentropy_softmax_backward(logits, targets, N, V, dscale, rw);
}

/* The LM head's in-place cross-entropy backward of rows [r0, r0 + n) of the forward (their
 * logits at `logits`, row r0 first; Vl columns each: the vocab-parallel kernels with tp > 1),
 * every row scaled by dscale, or with weighted = 1 token i's by the per-token weight the
 * backward copied to the device (a->loss_w[i]); one op call either way (rows with target < 0
 * become 0 whatever their weight). */
static void head_ce_backward(const loom_model *m, const loom_acts *a, float *logits, int64_t r0,
                             int64_t n, float dscale, int weighted) {
    const float cap = m->cfg.arch.final_softcap;
    const int vp = m->lay.tp > 1, Vl = m->Vl;
    const int32_t *tg = a->targets + r0;
    const float *rw = weighted ? a->loss_w + r0 : NULL;
    if (!model_logits_f32(m)) /* bf16 logits (no soft-cap, tp = 1) */
        m->be->bf16_crossentropy_backward((uint16_t *)logits, tg, n, Vl, dscale, rw);
    else if (vp && cap > 0.0f)
        m->be->crossentropy_shard_softcap_backward(logits, tg, a->vmax + r0, a->vsums + 2 * r0,
                                                   m->V0, n, Vl, dscale, cap, rw);
    else if (vp)
        m->be->crossentropy_shard_backward(logits, tg, a->vmax + r0, a->vsums + 2 * r0, m->V0,
                                           n, Vl, dscale, rw);
    else
        ce_backward(m, logits, tg, n, Vl, dscale, rw);
}

/* ---- the LM head and its loss: one code for the dense, the chunked (model.loss_chunk) and
 * the vocab-parallel (tp > 1) variants; they differ only where their data does ---- */

/* The head's logits of n rows of normed activations (this view's Vl columns; Vl = V at
 * tp = 1), with arch.final_softcap (elementwise): into logits (n, Vl). */
static void head_logits(const loom_model *m, float *logits, const float *lnf, int64_t n) {
    if (!model_logits_f32(m)) /* bf16 rows and weights, bf16 logits (as autocast's) */
        m->be->bf16_matmul_forward((uint16_t *)logits, (const uint16_t *)lnf,
                                   bview(m, HEAD_T(m)), NULL, n, m->cfg.d_model, m->Vl);
    else if (m->bf16) /* vocab-parallel: fp32 logits for the fp32 cross-entropy pieces;
                       * arch.final_softcap: the cap applied in fp32 to the fp32 sums */
        m->be->bf16_matmul_forward_f32(logits, (const uint16_t *)lnf, bview(m, HEAD_T(m)),
                                       NULL, n, m->cfg.d_model, m->Vl);
    else
        m->be->matmul_forward(logits, lnf, HEAD_W(m), NULL, n, m->cfg.d_model, m->Vl);
    model_softcap(m, logits, n * m->Vl);
}

/* row r of the (B*T, C) normed rows lnf: fp32 or bf16 elements (training.precision) */
static float *lnf_row(const loom_model *m, float *lnf, int64_t r) {
    const int64_t C = m->cfg.d_model;
    return m->bf16 ? (float *)((uint16_t *)lnf + r * C) : lnf + r * C;
}

/* the head's backward over n rows: d(lnf) rows set, d(head) += (bf16: dlogits are the bf16
 * gradient bf16_crossentropy_backward left in the logits, with the bf16 rows and weight copy) */
static void head_backward(const loom_model *m, const loom_acts *a, float *dln, float *dhead,
                          const float *dlogits, const float *lnf, int64_t n) {
    const int C = m->cfg.d_model;
    if (m->bf16 && model_logits_f32(m)) { /* fp32 dlogits rounded through the scratch */
        m->be->bf16_matmul_backward(dln, 1, dhead, NULL, dlogits, a->dout16,
                                    (const uint16_t *)lnf, bview(m, HEAD_T(m)), n, C, m->Vl);
        return;
    }
    if (m->bf16) {
        m->be->bf16_matmul_backward(dln, 1, dhead, NULL, NULL, (uint16_t *)dlogits,
                                    (const uint16_t *)lnf, bview(m, HEAD_T(m)), n, C, m->Vl);
        return;
    }
    m->be->matmul_backward_set(dln, dhead, NULL, dlogits, lnf, HEAD_W(m), n, C, m->Vl);
}

/* Keeps targets (N, < 0 ignored, each < K) for backward (copied to the device, and a host
 * copy) and counts the valid ones. */
static void keep_targets(const loom_model *m, loom_acts *a, const int32_t *targets, int64_t N,
                         int K) {
    m->be->mem_h2d(a->targets, targets, (size_t)N * sizeof(int32_t));
    memcpy(a->h_targets, targets, (size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++) {
        LOOM_CHECK(targets[i] < K);
        if (targets[i] >= 0) a->valid++;
    }
}

/* the mean of the N per-row losses over the valid targets (0 without any): their sum on the
 * device, one double read back */
static float mean_valid_loss(const loom_model *m, const loom_acts *a, int64_t N) {
    double sum = 0.0;
    m->be->sum_double(a->scalars, a->losses, N);
    loom_dev_read(m->be, &sum, a->scalars, sizeof sum, "loss sum");
    return a->valid > 0 ? (float)(sum / (double)a->valid) : 0.0f;
}

/* the losses of n rows of K logits: fp32 logits, or bf16 ones (training.precision bf16, LM
 * head) */
static void head_ce(const loom_model *m, float *losses, const float *logits,
                    const int32_t *targets, int64_t n, int K) {
    if (!model_logits_f32(m))
        m->be->bf16_crossentropy_forward(losses, (const uint16_t *)logits, targets, n, K);
    else
        m->be->crossentropy_forward(losses, logits, targets, n, K);
}

/* Cross-entropy against targets (N, < 0 ignored) of the last logits (N rows of K), or with
 * model.loss_chunk (a->chunk rows) of the LM head's logits computed chunk by chunk from lnf:
 * keeps the targets for backward and returns the mean over the valid ones. */
static float mean_loss(const loom_model *m, loom_acts *a, const int32_t *targets, int64_t N,
                       int K) {
    keep_targets(m, a, targets, N, K);
    if (a->chunk) {
        for (int64_t r0 = 0; r0 < N; r0 += a->chunk) {
            const int64_t n = N - r0 < a->chunk ? N - r0 : a->chunk;
            head_logits(m, a->logits, lnf_row(m, a->lnf, r0), n);
            head_ce(m, a->losses + r0, a->logits, a->targets + r0, n, K);
        }
    } else {
        head_ce(m, a->losses, a->logits, a->targets, N, K);
    }
    return mean_valid_loss(m, a, N);
}

static const char *const cp_names[LOOM_CP_COUNT] = {
    "stage_in", "attn_in", "col_in", "row_out", "attn_out", "ffn_in", "ffn_out", "stage_out",
    "vocab_max", "vocab_sum", "vocab_gather", "qknorm_sum"};

const char *loom_comm_point_name(int point) {
    return point >= 0 && point < LOOM_CP_COUNT ? cp_names[point] : "?";
}

void loom_model_set_attention(loom_model *m, const loom_attn_hook *h) {
    m->has_attn = h != NULL && h->forward != NULL && h->backward != NULL;
    if (h) m->attn = *h;
}

int model_row_runs(const loom_model *m, int T, int start[2], int len[2], int pos[2]) {
    if (m->lay.cp <= 1) {
        start[0] = 0, len[0] = T, pos[0] = 0;
        return 1;
    }
    LOOM_CHECK(T % 2 == 0);
    const int c = T / 2;
    start[0] = 0, len[0] = c, pos[0] = m->lay.cp_rank * c;
    start[1] = c, len[1] = c, pos[1] = (2 * m->lay.cp - 1 - m->lay.cp_rank) * c;
    return 2;
}

int64_t loom_model_row_position(const loom_model *m, int T, int t) {
    int start[2], len[2], pos[2];
    const int n = model_row_runs(m, T, start, len, pos);
    for (int i = 0; i < n; i++)
        if (t >= start[i] && t < start[i] + len[i]) return (int64_t)pos[i] + (t - start[i]);
    LOOM_CHECK(0 && "row outside the sequence");
    return -1;
}

/* the embedding of B x T rows (wpe at each run's global positions) and its backward */
/* One embedding kernel call over rows of B x T tokens at positions pos0.. (forward into out,
 * backward from dout). With tp > 1 the vocab-parallel ops: this view's rows of wte, wpe added
 * by tp rank 0 only in forward (its gradient whole on every rank). */
void model_embed_rows(loom_model *m, int bwd, float *x, const int32_t *inputs, int B, int T,
                      int pos0) {
    const int C = m->cfg.d_model;
    const int64_t n = (int64_t)B * T * C;
    /* arch.embed_scale: y = wte[token] * s (learned positions are not scaled: no family has
     * both), so the gradient into wte is dy * s (x scaled in place, read only here after) */
    const int scale = m->cfg.arch.embed_scale;
    if (scale && bwd) m->be->scale_inplace(x, n, EMBED_SCALE(m));
    if (m->bf16 && !bwd && m->lay.tp <= 1 && !scale) { /* bf16 rows of the fp32 tables; with
                                                         * tp or embed_scale fp32 rows (embed) */
        m->be->bf16_embedding_forward((uint16_t *)x, inputs, PARAM(m, LOOM_P_WTE),
                                      PARAM(m, LOOM_P_WPE), B, T, C, pos0);
        return;
    }
    if (m->lay.tp > 1 && bwd)
        m->be->embedding_shard_backward(GRAD(m, LOOM_P_WTE), GRAD(m, LOOM_P_WPE), x, inputs,
                                        m->V0, m->Vl, B, T, C, pos0);
    else if (m->lay.tp > 1)
        m->be->embedding_shard_forward(x, inputs, PARAM(m, LOOM_P_WTE), m->V0, m->Vl,
                                       m->lay.tp_rank == 0 ? PARAM(m, LOOM_P_WPE) : NULL, B, T,
                                       C, pos0);
    else if (bwd)
        m->be->embedding_backward(GRAD(m, LOOM_P_WTE), GRAD(m, LOOM_P_WPE), x, inputs, B, T, C,
                                  pos0);
    else
        m->be->embedding_forward(x, inputs, PARAM(m, LOOM_P_WTE), PARAM(m, LOOM_P_WPE), B, T, C,
                                 pos0);
    if (scale && !bwd) m->be->scale_inplace(x, n, EMBED_SCALE(m));
}

/* bf16 precision, tp = 1, arch.embed_scale: the embedding's rows formed in fp32 (x32) */
static int embed_rows_f32(const loom_model *m) {
    return m->bf16 && m->lay.tp <= 1 && m->cfg.arch.embed_scale;
}

static void embed(loom_model *m, loom_acts *a, const int32_t *inputs, int B, int T, int bwd) {
    const int C = m->cfg.d_model;
    /* the whole rows (under sequence parallelism the scratch around the shard's move) */
    /* (bf16 with tp: the fp32 partial sums; bf16 with arch.embed_scale: the fp32 rows scaled
     * in fp32, rounded once by the caller, as autocast scales the fp32 table's rows) */
    float *x = bwd ? a->dres_full : a->rowp ? a->rowp : embed_rows_f32(m) ? a->x32
                                                                           : a->sp_partial;
    /* a row's elements in x: fp32, or bf16 where the bf16 forward writes the stream itself */
    const size_t es = m->bf16 && !bwd && x == a->sp_partial ? sizeof(uint16_t) : sizeof(float);
    if (a->n_runs && loom_model_global(m, LOOM_P_WPE)) { /* doc_mask: positions per document */
        for (int r = 0; r < a->n_runs; r++) {
            const size_t row = (size_t)a->run_row[r];
            model_embed_rows(m, bwd, (float *)((char *)x + row * (size_t)C * es), inputs + row,
                             1, a->run_len[r], a->run_pos[r]);
        }
        return;
    }
    int start[2], len[2], pos[2];
    const int n = model_row_runs(m, T, start, len, pos);
    if (n == 1) {
        model_embed_rows(m, bwd, x, inputs, B, T, 0);
        return;
    }
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n; i++) {
            const size_t row = (size_t)b * (size_t)T + (size_t)start[i];
            model_embed_rows(m, bwd, (float *)((char *)x + row * (size_t)C * es), inputs + row,
                             1, len[i], pos[i]);
        }
}

void loom_model_set_comm_points(loom_model *m, const loom_comm_points *cp) {
    m->has_cp = cp != NULL && cp->fn != NULL;
    if (cp) m->cp = *cp;
}

/* a stage point (the block calls the others itself) */
static void stage_point(loom_model *m, int point, int dir, float *buf, int64_t n) {
    if (m->has_cp) m->cp.fn(m->cp.ctx, point, dir, -1, LOOM_SITE_NONE, buf, n);
}

/* a point of the vocab-parallel embedding and head (tp > 1 only) */
void model_vocab_point(loom_model *m, int point, int dir, int site, float *buf, int64_t n) {
    if (m->has_cp && m->lay.tp > 1) m->cp.fn(m->cp.ctx, point, dir, -1, site, buf, n);
}

/* The embedding's ROW_OUT and the head's COL_IN: under sequence parallelism the move between
 * the whole rows and this view's shard (in -> out; elements of es bytes: fp32, or the bf16
 * normed rows the head's COL_IN gathers), else the vocab-parallel point in place (in and out
 * are then one buffer). */
static void shard_point(loom_model *m, int point, int dir, int site, float *in, int64_t n_in,
                        float *out, int64_t n_out, size_t es) {
    if (!m->lay.sp) {
        LOOM_CHECK(in == out);
        model_vocab_point(m, point, dir, site, out, n_out);
        return;
    }
    LOOM_CHECK(m->has_cp && m->cp.move);
    m->cp.move(m->cp.ctx, point, dir, -1, site, in, n_in, out, n_out, es);
}

int loom_model_grad_tp_partial(const loom_model *m, const loom_tensor_info *t) {
    /* per-head q/k norm weights are shared by the heads, which tp splits: each rank's gradient
     * is its heads' part (a replicated kv head's part from its rank's query heads); the
     * whole-projection ones are split with the heads (their own box) */
    if (m->lay.tp > 1 && t->layer >= 0 && m->cfg.arch.qk_norm == LOOM_QK_NORM_HEAD &&
        (t->kind == LOOM_L_Q_NORM_W || t->kind == LOOM_L_K_NORM_W))
        return 1;
    if (!m->lay.sp || t->split_group == LOOM_SPLIT_TP) return 0;
    if (t->layer < 0) return t->kind == LOOM_P_LNF_W || t->kind == LOOM_P_LNF_B;
    return t->kind == LOOM_L_LN1_W || t->kind == LOOM_L_LN1_B || t->kind == LOOM_L_LN2_W ||
           t->kind == LOOM_L_LN2_B || t->kind == LOOM_L_ATTN_POST_W ||
           t->kind == LOOM_L_FFN_POST_W;
}

int loom_model_tp_owner(const loom_model *m, const loom_tensor_info *t) {
    if (t->split_group != LOOM_SPLIT_TP) return m->lay.tp_rank == 0;
    return t->tp_replicas <= 1 || m->lay.tp_rank % t->tp_replicas == 0;
}

/* Vocab-parallel cross-entropy of the view's logits (N rows of its Vl columns): the global row
 * max and the sums of exp and the target logit come from the VOCAB_MAX / VOCAB_SUM points, so
 * the whole logits are never gathered. Keeps the targets and statistics for backward; returns
 * the mean over the valid targets. */
static float vocab_parallel_loss(loom_model *m, loom_acts *a, const int32_t *targets,
                                 int64_t N) {
    keep_targets(m, a, targets, N, m->cfg.vocab_size);
    m->be->crossentropy_shard_max(a->vmax, a->logits, N, m->Vl);
    model_vocab_point(m, LOOM_CP_VOCAB_MAX, 0, LOOM_SITE_HEAD, a->vmax, N);
    m->be->crossentropy_shard_sums(a->vsums, a->logits, a->vmax, a->targets, m->V0, N, m->Vl);
    model_vocab_point(m, LOOM_CP_VOCAB_SUM, 0, LOOM_SITE_HEAD, a->vsums, 2 * N);
    m->be->crossentropy_shard_losses(a->losses, a->vmax, a->vsums, a->targets, N);
    return mean_valid_loss(m, a, N);
}

float loom_model_forward_acts(loom_model *m, loom_acts *a, const int32_t *inputs,
                              const int32_t *targets, int B, int T) {
    LOOM_CHECK(B > 0 && B <= a->maxB && T > 0 && T <= a->maxT);
    LOOM_CHECK(m->wmat == NULL); /* inference weights: the batched decode only (weights_*.c) */
    const loom_model_config *c = &m->cfg;
    const int C = c->d_model, V = c->vocab_size;
    const int64_t BT = (int64_t)B * T;
    a->B = B;
    a->T = T;
    for (int64_t i = 0; i < BT; i++) LOOM_CHECK(inputs[i] >= 0 && inputs[i] < V);
    m->be->mem_h2d(a->inputs, inputs, (size_t)BT * sizeof(int32_t)); /* the host's token ids */

    /* documents set by loom_model_set_docs are for this shape */
    LOOM_CHECK(!a->n_runs || (a->docs_B == B && a->docs_T == T));
    const int U_FINAL = m->n_units - 1;
    const int vp = m->lay.tp > 1; /* vocab-parallel embedding and head */
    /* the rows of the norm / residual regions: this view's shard under sequence parallelism */
    LOOM_CHECK(!m->lay.sp || BT % m->lay.tp == 0);
    const int64_t BTs = m->lay.sp ? BT / m->lay.tp : BT;
    if (m->lay.has_embedding) { /* a later pipeline stage gets a->encoded at STAGE_IN */
        acquire(m, 0, 0);
        embed(m, a, a->inputs, B, T, 0);
        /* vocab-parallel (tp > 1): the embedding's output is a partial sum over the tp ranks
         * (reduce-scattered to the shard under sequence parallelism) */
        if (a->rowp) { /* bf16 with tp: reduced in fp32 (under sequence parallelism
                        * reduce-scattered into the fp32 shard), then rounded into the stream */
            float *sum = m->lay.sp ? a->sp_partial : a->rowp;
            shard_point(m, LOOM_CP_ROW_OUT, 0, LOOM_SITE_EMBED, a->rowp, BT * C, sum, BTs * C,
                        sizeof(float));
            m->be->bf16_from_f32((uint16_t *)a->encoded, sum, BTs * C);
        } else if (embed_rows_f32(m)) { /* bf16 with embed_scale: the scaled rows rounded */
            m->be->bf16_from_f32((uint16_t *)a->encoded, a->x32, BT * C);
        } else {
            shard_point(m, LOOM_CP_ROW_OUT, 0, LOOM_SITE_EMBED, a->sp_partial, BT * C,
                        a->encoded, BTs * C, sizeof(float));
        }
        release(m, 0, 0);
    }
    stage_point(m, LOOM_CP_STAGE_IN, 0, a->encoded, BTs * C);
    block_frame f;
    for (int l = m->lay.l0; l < m->lay.l1; l++) {
        acts_frame(m, a, l, B, T, &f);
        acquire(m, l - m->lay.l0 + 1, 0);
        block_forward(m, &f, l);
        release(m, l - m->lay.l0 + 1, 0);
    }
    float *residual = f.s[S_RES3];
    stage_point(m, LOOM_CP_STAGE_OUT, 0, residual, BTs * C);
    a->valid = 0;
    if (!m->lay.has_head) { /* a pipeline stage before the last: no head, no loss */
        a->has_targets = targets != NULL;
        return 0.0f;
    }
    const int cls = c->head == LOOM_HEAD_CLASSIFY, tied = c->arch.tied && !cls;
    acquire(m, U_FINAL, 0);
    if (tied) acquire(m, 0, 0); /* the tied head reads wte */
    model_norm_fwd(m, a->lnf, a->lnf_mean, a->lnf_rstd, residual, PARAM(m, LOOM_P_LNF_W),
             PARAM(m, LOOM_P_LNF_B), BTs);
    if (cls && m->bf16) { /* the bf16 rows widened (exactly), mean-pooled in fp32, rounded
                           * once for the head's bf16 GEMM (fp32 logits) */
        m->be->bf16_to_f32(a->x32, (const uint16_t *)a->lnf, BT * C);
        m->be->mean_pool_forward(a->pooled, a->x32, B, T, C);
        m->be->bf16_from_f32(a->pooled16, a->pooled, (int64_t)B * C);
        m->be->bf16_matmul_forward_f32(a->logits, a->pooled16,
                                       bview(m, loom_model_global(m, LOOM_P_CLS_W)),
                                       PARAM(m, LOOM_P_CLS_B), B, C, c->num_classes);
    } else if (cls) {
        m->be->mean_pool_forward(a->pooled, a->lnf, B, T, C);
        m->be->matmul_forward(a->logits, a->pooled, PARAM(m, LOOM_P_CLS_W),
                              PARAM(m, LOOM_P_CLS_B), B, C, c->num_classes);
    } else if (!a->chunk) { /* with tp > 1 this view's Vl columns of the logits (chunked:
                             * mean_loss computes them chunk by chunk) */
        shard_point(m, LOOM_CP_COL_IN, 0, LOOM_SITE_HEAD, a->lnf, BTs * C, a->lnf_full, BT * C,
                    m->bf16 ? sizeof(uint16_t) : sizeof(float));
        head_logits(m, a->logits, a->lnf_full, BT);
    }
    a->has_targets = targets != NULL;
    a->valid = 0;
    float loss = 0.0f;
    /* N rows of K-way logits: B sequences x K classes, or B*T positions x V tokens */
    if (targets && !cls && vp)
        loss = vocab_parallel_loss(m, a, targets, BT);
    else if (targets)
        loss = mean_loss(m, a, targets, cls ? B : BT, cls ? c->num_classes : V);
    if (tied) release(m, 0, 0);
    release(m, U_FINAL, 0);
    return loss;
}

void loom_model_recompute_layer(loom_model *m, loom_acts *a, int layer) {
    LOOM_CHECK(a->stacked && layer >= m->lay.l0 && layer < m->lay.l1 && a->B > 0);
    block_frame f;
    acts_frame(m, a, layer, a->B, a->T, &f);
    f.recompute = 1;
    const int u = layer - m->lay.l0 + 1;
    acquire(m, u, 0);
    block_forward(m, &f, layer);
    release(m, u, 0);
}

/* The stage's layers backward, last first; with model.recompute each layer's dropped
 * activations are recomputed from what its forward kept first (the shared buffers still hold
 * the last layer's). */
static void layers_backward(loom_model *m, loom_acts *a, float dscale) {
    block_frame f;
    for (int l = m->lay.l1 - 1; l >= m->lay.l0; l--) {
        const int u = l - m->lay.l0 + 1;
        acts_frame(m, a, l, a->B, a->T, &f);
        acquire(m, u, 1);
        if (m->cfg.recompute != LOOM_RECOMPUTE_NONE && l != m->lay.l1 - 1) {
            f.recompute = 1; /* MoE: routing statistics are not counted again */
            block_recompute(m, &f, l);
            f.recompute = 0;
        }
        f.dscale = dscale;
        block_backward(m, &f, l);
        release(m, u, 1);
        grads_ready(m, u);
    }
}

/* Backward of a pipeline stage without the head: the gradient of the stream leaving the stage
 * comes in at STAGE_OUT (zero without a communication point), the layers run backward, and
 * the gradient of the stream entering it leaves at STAGE_IN (then the embedding's, on the
 * first stage). */
static void stage_backward(loom_model *m, loom_acts *a, float dscale) {
    const int C = m->cfg.d_model, B = a->B, T = a->T;
    const int64_t BT = (int64_t)B * T;
    memset(m->have_grads, 0, (size_t)m->n_units);
    m->be->mem_set(a->dres, 0, (size_t)BT * C * sizeof(float));
    stage_point(m, LOOM_CP_STAGE_OUT, 1, a->dres, BT * C);
    layers_backward(m, a, dscale);
    stage_point(m, LOOM_CP_STAGE_IN, 1, a->dres, BT * C);
    if (m->lay.has_embedding) {
        ensure_grads(m, 0);
        embed(m, a, a->inputs, B, T, 1);
        grads_ready(m, 0);
    }
    a->has_targets = 0;
}

/* The head's and the layers' backward; w (B*T) NULL: every token's loss scaled by dscale,
 * else token i's by w[i] (the LM head only) and the layers' own terms (MoE) by dscale. */
static void backward_impl(loom_model *m, loom_acts *a, float dscale, const float *w) {
    LOOM_CHECK(a->has_targets && a->stacked);
    LOOM_CHECK(!w || m->cfg.head == LOOM_HEAD_LM);
    if (!m->lay.has_head) {
        stage_backward(m, a, dscale);
        return;
    }
    const loom_model_config *c = &m->cfg;
    const int C = c->d_model;
    const int B = a->B, T = a->T;
    const int64_t BT = (int64_t)B * T;
    const int U_FINAL = m->n_units - 1;
    memset(m->have_grads, 0, (size_t)m->n_units);
    const int cls = c->head == LOOM_HEAD_CLASSIFY, tied = c->arch.tied && !cls;
    const int64_t BTs = m->lay.sp ? BT / m->lay.tp : BT; /* the norm / residual regions' rows */
    if (w) /* the per-token weights: one copy to the device, read by the cross-entropy op */
        m->be->mem_h2d(a->loss_w, w, (size_t)BT * sizeof(float));
    acquire(m, U_FINAL, 1);
    if (tied) acquire(m, 0, 1);
    if (cls) { /* logits (B,K) become dlogits; pooled <- mean over T */
        const int K = c->num_classes;
        m->be->crossentropy_softmax_backward(a->logits, a->targets, B, K, dscale, NULL);
        if (m->bf16) /* the fp32 dlogits rounded into the scratch; d(pooled) set */
            m->be->bf16_matmul_backward(a->dpooled, 1, GRAD(m, LOOM_P_CLS_W),
                                        GRAD(m, LOOM_P_CLS_B), a->logits, a->dout16,
                                        a->pooled16,
                                        bview(m, loom_model_global(m, LOOM_P_CLS_W)), B, C, K);
        else {
            m->be->mem_set(a->dpooled, 0, (size_t)B * C * sizeof(float));
            m->be->matmul_backward(a->dpooled, GRAD(m, LOOM_P_CLS_W), GRAD(m, LOOM_P_CLS_B),
                                   a->logits, a->pooled, PARAM(m, LOOM_P_CLS_W), B, C, K);
        }
        m->be->mem_set(a->dln_full, 0, (size_t)BT * C * sizeof(float));
        m->be->mean_pool_backward(a->dln, a->dpooled, B, T, C);
    } else if (a->chunk) { /* model.loss_chunk (tp = 1): each chunk's logits again, then its
                            * dlogits, d(lnf) and d(head): no (B,T,V) buffer */
        float *dhead = HEAD_G(m);
        for (int64_t r0 = 0; r0 < BT; r0 += a->chunk) {
            const int64_t n = BT - r0 < a->chunk ? BT - r0 : a->chunk;
            head_logits(m, a->logits, lnf_row(m, a->lnf, r0), n);
            head_ce_backward(m, a, a->logits, r0, n, dscale, w != NULL);
            head_backward(m, a, a->dln + r0 * C, dhead, a->logits, lnf_row(m, a->lnf, r0),
                          n); /* rows r0.. set */
        }
    } else { /* logits (B,T,V) become dlogits in place (tp > 1: this view's columns) */
        head_ce_backward(m, a, a->logits, 0, BT, dscale, w != NULL);
        /* d(lnf) overwritten: no zeroing pass first */
        head_backward(m, a, a->dln_full, HEAD_G(m), a->logits, a->lnf_full, BT);
        shard_point(m, LOOM_CP_COL_IN, 1, LOOM_SITE_HEAD, a->dln_full, BT * C, a->dln, BTs * C,
                    sizeof(float));
    }
    block_frame f;
    acts_frame(m, a, m->lay.l1 - 1, B, T, &f);
    const float *last = f.s[S_RES3];
    m->be->mem_set(a->dres, 0, (size_t)BTs * C * sizeof(float));
    norm_bwd(m, a->dres, GRAD(m, LOOM_P_LNF_W), GRAD(m, LOOM_P_LNF_B), a->dln, last,
             PARAM(m, LOOM_P_LNF_W), a->lnf_mean, a->lnf_rstd, BTs);
    if (tied) release(m, 0, 1);
    release(m, U_FINAL, 1);
    grads_ready(m, U_FINAL);
    stage_point(m, LOOM_CP_STAGE_OUT, 1, a->dres, BTs * C);

    layers_backward(m, a, dscale);
    stage_point(m, LOOM_CP_STAGE_IN, 1, a->dres, BTs * C);
    if (m->lay.has_embedding) {
        ensure_grads(m, 0);
        shard_point(m, LOOM_CP_ROW_OUT, 1, LOOM_SITE_EMBED, a->dres, BTs * C, a->dres_full,
                    BT * C, sizeof(float));
        embed(m, a, a->inputs, B, T, 1);
    }
    /* a last stage without the embedding holds the tied head's wte in unit 0 */
    if (m->lay.has_embedding || tied) grads_ready(m, 0);
    a->has_targets = 0;
}

void loom_model_backward_acts(loom_model *m, loom_acts *a, float dscale) {
    backward_impl(m, a, dscale, NULL);
}

void loom_model_backward_weighted_acts(loom_model *m, loom_acts *a, const float *w,
                                       float dscale) {
    LOOM_CHECK(w != NULL);
    backward_impl(m, a, dscale, w);
}

void loom_model_token_logps_acts(const loom_model *m, const loom_acts *a, float *out) {
    LOOM_CHECK(a->has_targets && m->lay.has_head && m->cfg.head == LOOM_HEAD_LM);
    const int64_t BT = (int64_t)a->B * a->T;
    loom_dev_read(m->be, out, a->losses, (size_t)BT * sizeof(float), "token log-probs");
    for (int64_t i = 0; i < BT; i++) out[i] = a->h_targets[i] < 0 ? 0.0f : -out[i];
}

void loom_acts_read_logits(const loom_model *m, const loom_acts *a, float *dst, size_t first,
                           size_t n) {
    LOOM_CHECK(a->logits != NULL);
    LOOM_CHECK(model_logits_f32(m)); /* bf16 logits (a bf16 LM head's): no fp32 rows to read */
    loom_dev_read(m->be, dst, a->logits + first, n * sizeof(float), "logits rows");
}

void loom_model_read_logits(const loom_model *m, float *dst, size_t first, size_t n) {
    LOOM_CHECK(m->acts != NULL && !m->acts->chunk);
    loom_acts_read_logits(m, m->acts, dst, first, n);
}

void loom_model_backward_weighted(loom_model *m, const float *w, float dscale) {
    LOOM_CHECK(m->acts != NULL);
    loom_model_backward_weighted_acts(m, m->acts, w, dscale);
}

void loom_model_token_logps(const loom_model *m, float *out) {
    LOOM_CHECK(m->acts != NULL);
    loom_model_token_logps_acts(m, m->acts, out);
}

float loom_model_forward(loom_model *m, const int32_t *inputs, const int32_t *targets, int B,
                         int T) {
    if (!m->acts && m->mode == LOOM_MODEL_INFER) m->acts = loom_acts_create(m, m->maxB, m->maxT, 0);
    LOOM_CHECK(m->acts != NULL);
    return loom_model_forward_acts(m, m->acts, inputs, targets, B, T);
}

void loom_model_backward(loom_model *m, float dscale) {
    LOOM_CHECK(m->acts != NULL);
    loom_model_backward_acts(m, m->acts, dscale);
}

const float *loom_model_next_logits(loom_model *m, const int32_t *tokens, int n) {
    LOOM_CHECK(n > 0 && n <= m->maxT && m->cfg.head == LOOM_HEAD_LM);
    loom_model_forward(m, tokens, NULL, 1, n);
    LOOM_CHECK(!m->acts->chunk); /* a chunked LM head keeps no logits */
    const size_t V = (size_t)m->cfg.vocab_size;
    if (!m->h_next) m->h_next = loom_malloc(V * sizeof(float));
    loom_acts_read_logits(m, m->acts, m->h_next, (size_t)(n - 1) * V, V);
    return m->h_next;
}

double loom_model_flops_per_token(const loom_model *m, int T) {
    /* the whole model's (a view's share is 1/tp of the layers' matmuls) */
    const loom_model_config *c = &m->cfg;
    const double C = c->d_model, L = c->n_layer, HD = (double)c->n_head * m->D;
    const double QKV = (double)(c->n_head + 2 * c->n_kv_head) * m->D;
    const double FFI = c->arch.mlp != LOOM_MLP_GELU ? 2.0 * c->d_ff : c->d_ff;
    /* a shared expert: its two (gated: three) matrices of width shared_d_ff (0: d_ff), and
     * its gate's C weights */
    const double SHW = (c->arch.mlp != LOOM_MLP_GELU ? 3.0 : 2.0) * C *
                           (c->shared_d_ff > 0 ? c->shared_d_ff : c->d_ff) +
                       (c->shared_gate ? C : 0.0);
    const double head = c->head == LOOM_HEAD_CLASSIFY ? 0.0 : (double)c->vocab_size * C;
    /* an MoE layer's active weights: the router, top_k routed and the shared experts */
    double ffn = 0;
    for (int l = 0; l < c->n_layer; l++)
        ffn += loom_model_layer_is_moe(m, l)
                   ? (double)c->n_expert * C +
                         (double)c->top_k * (C * FFI + (double)c->d_ff * C) +
                         (double)c->shared_experts * SHW
                   : C * FFI + (double)c->d_ff * C;
    const double matmul_params = L * (C * QKV + HD * C) + ffn + head;
    /* 6 FLOPs per weight per token (fwd 2, bwd 4), plus attention: per layer and query head,
     * 2 forward and 4 backward GEMMs of 2*D FLOPs per (query, key) pair the causal kernels
     * compute (about T^2/2 pairs per sequence, not T^2: the masked blocks are skipped; a
     * sliding layer's about T * W: the tiles outside its window are skipped too). */
    double pairs = 0;
    for (int l = 0; l < c->n_layer; l++)
        pairs += (double)attention_window_pairs(T, loom_config_layer_window(c, l));
    return 6.0 * matmul_params + 12.0 * HD * pairs / T;
}
