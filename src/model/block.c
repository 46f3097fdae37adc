/* The transformer block, written once: a list of ops over named activation slots. Forward
 * walks it in order, backward in reverse, recompute is forward again over the same slots, and
 * decoding walks it over one row with the attention op reading and extending the KV cache.
 * The activation arena (struct loom_acts) that holds the slots of one micro-batch: acts.c. */
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "model/model_internal.h"

enum { OP_NORM, OP_POINT, OP_LINEAR, OP_QKNORM, OP_ROPE, OP_ATTN, OP_ACT, OP_RESIDUAL, OP_MOE };
/* widths of a linear's input / output */
enum { W_C, W_QKV, W_HD, W_FFI, W_F };
/* the first MLP matrix: gpt2 fc_w, llama gate_w|up_w */
enum { P_FC1 = -2, P_NONE = -1 };

typedef struct block_op {
    int kind;
    int in, out;        /* slots */
    int aux0, aux1;     /* NORM: mean, rstd slots; ATTN: probabilities slot */
    int w, b;           /* LOOM_L_* parameters (q_w, q_b: the fused q|k|v) or P_FC1 / P_NONE */
    int iw, ow;         /* LINEAR: W_* widths */
    int row_parallel;   /* LINEAR: partial sums over tp; the bias is added by tp rank 0 */
    int point, site;    /* POINT */
} block_op;

#define NORM(i, o, mean, rstd, w_, b_) {OP_NORM, i, o, mean, rstd, w_, b_, 0, 0, 0, 0, 0}
#define POINT(p, slot, site_) {OP_POINT, slot, slot, 0, 0, P_NONE, P_NONE, 0, 0, 0, p, site_}
/* a point that moves between a row shard and the whole rows under sequence parallelism (the
 * two slots are one buffer without it) */
#define POINT2(p, i, o, site_) {OP_POINT, i, o, 0, 0, P_NONE, P_NONE, 0, 0, 0, p, site_}
#define LINEAR(i, o, w_, b_, iw_, ow_, row) {OP_LINEAR, i, o, 0, 0, w_, b_, iw_, ow_, row, 0, 0}

static const block_op BLOCK[] = {
    /* attention: RES2 = X + post(attn_proj(attention(rope(qknorm(qkv(ln1(X))))))); ln1 absent
     * with norm_place post (S_LN1 is S_X), post absent with pre (S_ATTO is S_RES2) */
    NORM(S_X, S_LN1, S_LN1_MEAN, S_LN1_RSTD, LOOM_L_LN1_W, LOOM_L_LN1_B),
    POINT(LOOM_CP_ATTN_IN, S_LN1, LOOM_SITE_ATTN),
    POINT2(LOOM_CP_COL_IN, S_LN1, S_LN1G, LOOM_SITE_ATTN),
    LINEAR(S_LN1G, S_QKVR, LOOM_L_Q_W, LOOM_L_Q_B, W_C, W_QKV, 0),
    /* arch.qk_norm: RMSNorm of each q and k head (v copied) */
    {OP_QKNORM, S_QKVR, S_QKV, S_QKN_RSTD, 0, LOOM_L_Q_NORM_W, LOOM_L_K_NORM_W, 0, 0, 0, 0, 0},
    {OP_ROPE, S_QKV, S_QKV, 0, 0, P_NONE, P_NONE, 0, 0, 0, 0, 0},
    {OP_ATTN, S_QKV, S_ATTY, S_ATT, 0, P_NONE, P_NONE, 0, 0, 0, 0, 0},
    LINEAR(S_ATTY, S_RES2P, LOOM_L_ATTN_PROJ_W, LOOM_L_ATTN_PROJ_B, W_HD, W_C, 1),
    POINT2(LOOM_CP_ROW_OUT, S_RES2P, S_ATTO, LOOM_SITE_ATTN),
    POINT(LOOM_CP_ATTN_OUT, S_ATTO, LOOM_SITE_ATTN),
    /* the post-norm (RMSNorm: no mean slot, its rstd slot given twice) */
    NORM(S_ATTO, S_RES2, S_PN1_RSTD, S_PN1_RSTD, LOOM_L_ATTN_POST_W, P_NONE),
    {OP_RESIDUAL, S_X, S_RES2, 0, 0, P_NONE, P_NONE, 0, 0, 0, 0, 0},
    /* feed-forward: RES3 = RES2 + post(fc_proj(act(fc1(ln2(RES2))))) */
    NORM(S_RES2, S_LN2, S_LN2_MEAN, S_LN2_RSTD, LOOM_L_LN2_W, LOOM_L_LN2_B),
    POINT(LOOM_CP_FFN_IN, S_LN2, LOOM_SITE_FFN),
    POINT2(LOOM_CP_COL_IN, S_LN2, S_LN2G, LOOM_SITE_FFN),
    LINEAR(S_LN2G, S_FCH, P_FC1, LOOM_L_FC_B, W_C, W_FFI, 0),
    {OP_ACT, S_FCH, S_FCH_ACT, 0, 0, P_NONE, P_NONE, 0, 0, 0, 0, 0},
    LINEAR(S_FCH_ACT, S_RES3P, LOOM_L_FC_PROJ_W, LOOM_L_FC_PROJ_B, W_F, W_C, 1),
    /* an MoE layer: RES3 = experts(LN2) instead of the dense ops (src/model/moe.c) */
    {OP_MOE, S_LN2, S_RES3, 0, 0, P_NONE, P_NONE, 0, 0, 0, 0, 0},
    POINT2(LOOM_CP_ROW_OUT, S_RES3P, S_FFO, LOOM_SITE_FFN),
    POINT(LOOM_CP_FFN_OUT, S_FFO, LOOM_SITE_FFN),
    NORM(S_FFO, S_RES3, S_PN2_RSTD, S_PN2_RSTD, LOOM_L_FFN_POST_W, P_NONE),
    {OP_RESIDUAL, S_RES2, S_RES3, 0, 0, P_NONE, P_NONE, 0, 0, 0, 0, 0},
};
enum { N_OPS = sizeof BLOCK / sizeof BLOCK[0] };

static int width(const loom_model *m, int w) {
    switch (w) {
    case W_C: return m->cfg.d_model;
    case W_QKV: return m->QKV;
    case W_HD: return m->H * m->D;
    case W_FFI: return m->FFI;
    default: return m->F;
    }
}

static int param_kind(const loom_model *m, int w) { return w == P_FC1 ? FC1_KIND(m) : w; }
/* the LoRA site of a linear (lora.c) */
static int lora_site(int w) {
    return w == LOOM_L_Q_W ? 0 : w == LOOM_L_ATTN_PROJ_W ? 1 : w == P_FC1 ? 2 : 3;
}
static const float *param(const loom_model *m, int w, int l) {
    return w == P_NONE ? NULL : LP(m, param_kind(m, w), l);
}
static float *grad(const loom_model *m, int w, int l) {
    return w == P_NONE ? NULL : LG(m, param_kind(m, w), l);
}

/* a named communication point: nothing unless parallel/ supplied one */
static void point(loom_model *m, int p, int dir, int layer, int site, float *buf, int64_t n) {
    if (m->has_cp) m->cp.fn(m->cp.ctx, p, dir, layer, site, buf, n);
}

/* the slots of the sequence-sharded regions (norms, residual stream) */
static int sharded(int slot) {
    return slot == S_X || slot == S_LN1 || slot == S_LN1_MEAN || slot == S_LN1_RSTD ||
           slot == S_RES2 || slot == S_LN2 || slot == S_LN2_MEAN || slot == S_LN2_RSTD ||
           slot == S_RES3 || slot == S_ATTO || slot == S_FFO || slot == S_PN1_RSTD ||
           slot == S_PN2_RSTD;
}

/* norm placement: the block has pre-norms (ln1, ln2) / post-norms (attn_post, ffn_post) */
static int is_post_norm(const block_op *op) {
    return op->kind == OP_NORM && (op->w == LOOM_L_ATTN_POST_W || op->w == LOOM_L_FFN_POST_W);
}

/* rows of a slot in this frame: the shard's under sequence parallelism, else all B*T */
static int64_t rows(const loom_model *m, const block_frame *f, int slot) {
    const int64_t N = (int64_t)f->B * f->T;
    return m->lay.sp && sharded(slot) ? N / m->lay.tp : N;
}

/* A point between two slots: under sequence parallelism the move between the shard and the
 * whole rows (in, out in the direction of the data), else the point in place. Gradients move
 * as fp32, the forward's slots in their dtype (bf16 normed rows gathered as bf16). */
static void point2(loom_model *m, block_frame *f, const block_op *op, int dir, int l) {
    const int C = m->cfg.d_model;
    float **b = dir ? f->g : f->s;
    if (!m->lay.sp || op->in == op->out) {
        point(m, op->point, dir, l, op->site, b[op->in], rows(m, f, op->in) * C);
        return;
    }
    LOOM_CHECK(m->has_cp && m->cp.move);
    const int from = dir ? op->out : op->in, to = dir ? op->in : op->out;
    LOOM_CHECK(dir || m->slot_dt[from] == m->slot_dt[to]);
    const size_t es = dir ? sizeof(float) : loom_dt_size(m->slot_dt[from]);
    m->cp.move(m->cp.ctx, op->point, dir, l, op->site, b[from], rows(m, f, from) * C, b[to],
               rows(m, f, to) * C, es);
}

/* sequence parallelism: the whole rows of LN1 / LN2 are one scratch shared by the layers, so
 * a linear's backward gathers this layer's shard into them again (its weight gradient) */
static void regather(loom_model *m, block_frame *f, const block_op *op, int l) {
    if (!m->lay.sp || (op->in != S_LN1G && op->in != S_LN2G)) return;
    const block_op again = POINT2(LOOM_CP_COL_IN, op->in == S_LN1G ? S_LN1 : S_LN2, op->in,
                                  op->in == S_LN1G ? LOOM_SITE_ATTN : LOOM_SITE_FFN);
    point2(m, f, &again, 0, l);
}

/* Without sequence parallelism the whole-row slots are their shards (set at every walk: a
 * decoding frame rotates its stream buffers between layers); with it acts_frame gave them
 * their scratch. */
static void alias_whole_slots(const loom_model *m, block_frame *f) {
    static const int pairs[4][2] = {{S_LN1G, S_LN1}, {S_LN2G, S_LN2}, {S_RES2P, S_ATTO},
                                    {S_RES3P, S_FFO}};
    if (!has_post(m)) { /* the row-parallel outputs are the residual stream's slots */
        f->s[S_ATTO] = f->s[S_RES2];
        f->g[S_ATTO] = f->g[S_RES2];
        f->s[S_FFO] = f->s[S_RES3];
        f->g[S_FFO] = f->g[S_RES3];
    }
    if (!has_pre(m)) { /* the stream itself goes into attention and the feed-forward; their
                        * input gradients stay apart (the absent norm's backward adds them) */
        f->s[S_LN1] = f->s[S_X];
        f->s[S_LN2] = f->s[S_RES2];
    }
    /* without q/k norms the linear writes q|k|v where attention reads it; with them a frame
     * without its own S_QKVR (decoding) norms in place */
    if (m->cfg.arch.qk_norm == LOOM_QK_NORM_NONE) {
        f->s[S_QKVR] = f->s[S_QKV];
        f->g[S_QKVR] = f->g[S_QKV];
    } else if (!f->s[S_QKVR]) {
        f->s[S_QKVR] = f->s[S_QKV];
    }
    if (m->lay.sp) return;
    for (int i = 0; i < 4; i++) {
        f->s[pairs[i][0]] = f->s[pairs[i][1]];
        f->g[pairs[i][0]] = f->g[pairs[i][1]];
    }
}

/* An MoE layer runs OP_MOE instead of the dense feed-forward's ops (its linears, activation
 * and tensor-parallel points); a dense layer skips OP_MOE. */
static int skipped(const loom_model *m, int l, const block_op *op) {
    if (op->kind == OP_QKNORM) return m->cfg.arch.qk_norm == LOOM_QK_NORM_NONE;
    if (is_post_norm(op)) return !has_post(m);
    if (op->kind == OP_ROPE) return m->cfg.arch.pos != LOOM_POS_ROPE;
    const int moe = loom_model_layer_is_moe(m, l);
    if (op->kind == OP_MOE) return !moe;
    if (!moe) return 0;
    return op->kind == OP_ACT ||
           (op->kind == OP_LINEAR && (op->w == P_FC1 || op->w == LOOM_L_FC_PROJ_W)) ||
           (op->kind == OP_POINT && op->site == LOOM_SITE_FFN &&
            (op->point == LOOM_CP_COL_IN || op->point == LOOM_CP_ROW_OUT));
}

/* layer l's RoPE tables: a sliding layer's own base (arch.rope_local_theta), else the model's */
static void rope_tabs(const loom_model *m, int l, const float **cs, const float **sn) {
    const int local = m->rope_cos_local && loom_config_layer_window(&m->cfg, l) > 0;
    *cs = local ? m->rope_cos_local : m->rope_cos;
    *sn = local ? m->rope_sin_local : m->rope_sin;
}

/* One RoPE kernel call over q and k of `rows` rows starting at fused row r0 of x (fp32 forward or
 * inverse, or the bf16 forward), at positions pos.. */
typedef struct rope_call {
    const loom_model *m;
    void *x;
    int bf16, bwd;
    const float *rc, *rs;
} rope_call;

static void rope_rows(const rope_call *c, int64_t r0, int B, int T, int pos) {
    const loom_model *m = c->m;
    const loom_backend *be = m->be;
    const int64_t off = r0 * m->QKV, ko = (int64_t)m->H * m->D;
    if (c->bf16) {
        uint16_t *x = (uint16_t *)c->x + off;
        be->bf16_rope_forward(x, B, T, m->H, m->D, m->QKV, c->rc, c->rs, pos);
        be->bf16_rope_forward(x + ko, B, T, m->KVH, m->D, m->QKV, c->rc, c->rs, pos);
        return;
    }
    void (*fn)(float *, int64_t, int, int, int, int64_t, const float *, const float *, int) =
        c->bwd ? be->rope_backward : be->rope_forward;
    float *x = (float *)c->x + off;
    fn(x, B, T, m->H, m->D, m->QKV, c->rc, c->rs, pos);
    fn(x + ko, B, T, m->KVH, m->D, m->QKV, c->rc, c->rs, pos);
}

/* RoPE (forward or its inverse; bf16: the forward on the bf16 slot) on the q and k heads of the
 * fused rows x of layer l, at each row's position: f->pos0 + t, with documents (model.doc_mask)
 * each document from its position, or with context parallelism each chunk's global positions */
static void rope_any(loom_model *m, block_frame *f, int l, void *x, int bf16, int bwd) {
    rope_call c = {.m = m, .x = x, .bf16 = bf16, .bwd = bwd};
    rope_tabs(m, l, &c.rc, &c.rs);
    if (f->n_runs && !f->kcache) { /* a document's run starts at 0 unless a cp chunk cuts it */
        for (int r = 0; r < f->n_runs; r++)
            rope_rows(&c, f->run_row[r], 1, f->run_len[r], f->run_pos[r]);
        return;
    }
    int start[2], len[2], pos[2];
    const int n = f->kcache ? 1 : model_row_runs(m, f->T, start, len, pos);
    if (n == 1) {
        rope_rows(&c, 0, f->B, f->T, f->pos0);
        return;
    }
    for (int b = 0; b < f->B; b++)
        for (int i = 0; i < n; i++) rope_rows(&c, (int64_t)b * f->T + start[i], 1, len[i], pos[i]);
}

static void rope(loom_model *m, block_frame *f, int l, float *x, int bwd) {
    rope_any(m, f, l, x, 0, bwd);
}
static void rope_bf16(loom_model *m, block_frame *f, int l, uint16_t *x) {
    rope_any(m, f, l, x, 1, 0);
}

/* causal, and with documents (model.doc_mask) inside each document of the row; layer l's
 * window and scores */
static loom_attn_mask attn_mask(const loom_model *m, const block_frame *f, int l) {
    loom_attn_mask mk = {.causal = 1};
    loom_model_attn_scores(m, l, &mk);
    if (f->n_runs) {
        mk.q_doc = mk.k_doc = f->docs;
        mk.q_doc_bs = mk.k_doc_bs = f->T;
    }
    return mk;
}

/* Decoding with a KV cache (layer l's kc, vc: (slots, KVH*D) of a cache with room for cap
 * positions): row by row, appends the keys and values of n fused q|k|v rows at positions
 * pos0.. and attends the row to the cache up to its own position. A sliding layer's cache is
 * a ring of its window (slot = position % slots): written, then attended, one row at a time,
 * so a chunk longer than the window sees only its window too. Single-sequence decoding
 * (n = 1) and the engine's ragged segments both come here. */
static void attend_cache(loom_model *m, int l, float *out, const float *qkv, float *kc,
                         float *vc, int cap, int pos0, int n, float *scores) {
    const int kv = m->KVH * m->D, HD = m->H * m->D;
    const int slots = loom_model_kv_slots(m, l, cap);
    loom_attn_mask mk = {.causal = 1};
    loom_model_attn_scores(m, l, &mk);
    for (int r = 0; r < n; r++) {
        const float *row = qkv + (int64_t)r * m->QKV;
        const int p = pos0 + r;
        /* the KV append: device to device */
        m->be->mem_d2d(kc + (size_t)(p % slots) * kv, row + HD, (size_t)kv * sizeof(float));
        m->be->mem_d2d(vc + (size_t)(p % slots) * kv, row + HD + kv, (size_t)kv * sizeof(float));
        m->be->attention_decode(out + (int64_t)r * HD, row, kc, vc, p + 1 < slots ? p + 1 : slots,
                                m->H, m->KVH, m->D, scores, &mk);
    }
}

/* the q/k norms (fp32 rows x into o, which may be x): q heads, then k heads, of each row; v
 * copied unless in place */
static void qknorm_forward(loom_model *m, block_frame *f, int l, const block_op *op, float *o,
                           const float *x) {
    const int64_t N = (int64_t)f->B * f->T;
    const loom_backend *be = m->be;
    float **s = f->s;
    const int HD = m->H * m->D, KD = m->KVH * m->D;
    if (m->cfg.arch.qk_norm == LOOM_QK_NORM_WHOLE) {
        /* the whole q (and k) of a row: the view's heads' sums of squares, summed over the
         * tp group, then normed; st (N, 2) holds the sums, then the rstd */
        float *st = s[op->aux0];
        LOOM_CHECK(st != NULL);
        be->rownorm_sums(st, 2, x, NULL, NULL, NULL, N, HD, m->QKV);
        be->rownorm_sums(st + 1, 2, x + HD, NULL, NULL, NULL, N, KD, m->QKV);
        if (m->lay.tp > 1) point(m, LOOM_CP_QKNORM_SUM, 0, l, LOOM_SITE_ATTN, st, 2 * N);
        be->rownorm_forward(o, st, x, param(m, op->w, l), st, N, HD, m->QKV, 2,
                            m->cfg.n_head * m->D, m->cfg.norm_eps);
        be->rownorm_forward(o + HD, st + 1, x + HD, param(m, op->b, l), st + 1, N, KD,
                            m->QKV, 2, m->cfg.n_kv_head * m->D, m->cfg.norm_eps);
    } else {
        be->headnorm_forward(o, s[op->aux0], x, param(m, op->w, l), N, m->H, m->D, m->QKV,
                             m->H + m->KVH, m->cfg.norm_eps);
        /* a decoding frame keeps no statistics (NULL) */
        be->headnorm_forward(o + HD, s[op->aux0] ? s[op->aux0] + m->H : NULL, x + HD,
                             param(m, op->b, l), N, m->KVH, m->D, m->QKV, m->H + m->KVH,
                             m->cfg.norm_eps);
    }
    if (o != x) /* the v rows unchanged */
        be->mem_d2d_rows(o + HD + KD, (size_t)m->QKV * sizeof(float), x + HD + KD,
                         (size_t)m->QKV * sizeof(float), (size_t)KD * sizeof(float),
                         (size_t)N);
}

static void op_forward_bf16(loom_model *m, block_frame *f, int l, const block_op *op);

void model_wmat_forward(const loom_model *m, const block_frame *f, const model_wmat *w,
                        void *out, const void *in, int in_dt, const float *b, int64_t N, int IC,
                        int OC, int out_f32) {
    const loom_backend *be = m->be;
    if (in_dt == LOOM_DT_BF16) { /* training.precision bf16: bf16 rows x the bf16 copy */
        LOOM_CHECK(w->fmt == LOOM_WF_BF16);
        if (out_f32) be->bf16_matmul_forward_f32(out, in, w->w, b, N, IC, OC);
        else be->bf16_matmul_forward(out, in, w->w, b, N, IC, OC);
        return;
    }
    LOOM_CHECK(in_dt == LOOM_DT_F32 && out_f32);
    switch (w->fmt) {
    case LOOM_WF_F32: be->matmul_forward(out, in, w->w, b, N, IC, OC); break;
    case LOOM_WF_BF16: /* widened exactly, computed as in fp32 */
        be->matmul_bf16_forward(out, in, w->w, b, N, IC, OC);
        break;
    case LOOM_WF_BF16P: /* the rows rounded to bf16, then bf16 x bf16 */
        LOOM_CHECK(f->xbf16 != NULL);
        be->bf16_round(f->xbf16, in, N, IC);
        be->matmul_dotbf16_forward(out, f->xbf16, w->w, b, N, IC, OC);
        break;
    case LOOM_WF_Q8_0: /* the rows quantized to Q8_0, then Q8_0 x Q8_0 */
        LOOM_CHECK(f->xq8 != NULL && f->xq8d != NULL);
        be->q8_quantize(f->xq8, f->xq8d, in, N, IC);
        be->matmul_q8_forward(out, f->xq8, f->xq8d, w->w, w->scales, b, N, IC, OC);
        break;
    case LOOM_WF_Q4_K: /* the rows quantized in blocks of 256, then x Q4_K */
        LOOM_CHECK(f->xq8 != NULL && f->xq4d != NULL && f->xq4s != NULL);
        be->q8k_quantize(f->xq8, f->xq4d, f->xq4s, in, N, IC);
        be->matmul_q4k_forward(out, f->xq8, f->xq4d, f->xq4s, w->w, b, N, IC, OC);
        break;
    default: loom_panic(__FILE__, __LINE__, "stored weight format %d", w->fmt);
    }
}

void model_wmat_row(const loom_model *m, const model_wmat *w, float *dst, int OC, int IC,
                    int r) {
    const loom_backend *be = m->be;
    LOOM_CHECK(r >= 0 && r < OC);
    const size_t at = (size_t)r * (size_t)IC;
    switch (w->fmt) {
    case LOOM_WF_F32: be->mem_d2d(dst, (const float *)w->w + at, (size_t)IC * sizeof(float)); break;
    case LOOM_WF_BF16: be->bf16_to_f32(dst, (const uint16_t *)w->w + at, IC); break;
    case LOOM_WF_BF16P: be->dotbf16_unpack_row(dst, w->w, OC, IC, r); break;
    case LOOM_WF_Q8_0:
        be->q8_dequantize(dst, (const int8_t *)w->w + at, w->scales + at / LOOM_Q8_BLOCK, 1, IC);
        break;
    case LOOM_WF_Q4_K:
        be->q4k_dequantize(dst, (const uint8_t *)w->w + at / LOOM_Q4K_BLOCK * LOOM_Q4K_BYTES, 1,
                           IC);
        break;
    default: loom_panic(__FILE__, __LINE__, "stored weight format %d", w->fmt);
    }
}

/* the inference copy's index of layer l's linear of tensor kind wk (by LoRA site) */
static int wmat_site(int wk) {
    return wk == LOOM_L_Q_W ? 0 : wk == LOOM_L_ATTN_PROJ_W ? 1
           : wk == LOOM_L_FC_W || wk == LOOM_L_GATE_W ? 2 : 3;
}

void model_linear_forward(loom_model *m, const block_frame *f, int l, int wk, int bk, int64_t i,
                          void *out, const void *in, int64_t N, int IC, int OC, int out_f32) {
    const loom_tensor_info *tw = loom_model_layer_tensor(m, l, wk);
    const loom_tensor_info *tb = bk >= 0 ? loom_model_layer_tensor(m, l, bk) : NULL;
    const int64_t per = (int64_t)OC * IC;
    const float *b = tb ? pview(m, tb) + i * OC : NULL;
    LOOM_CHECK(tw != NULL);
    model_wmat w;
    if (m->wmat) { /* inference weights (a dense fp32 model: model_infer_weights_check) */
        LOOM_CHECK(i == 0 && !m->bf16);
        w = m->wmat[4 * l + wmat_site(wk)];
    } else if (m->bf16)
        w = (model_wmat){LOOM_WF_BF16, bview(m, tw) + i * per, NULL};
    else
        w = (model_wmat){LOOM_WF_F32, pview(m, tw) + i * per, NULL};
    model_wmat_forward(m, f, &w, out, in, m->bf16 ? LOOM_DT_BF16 : LOOM_DT_F32, b, N, IC, OC,
                       m->bf16 ? out_f32 : 1);
}

void model_linear_backward(loom_model *m, const block_frame *f, int l, int wk, int bk,
                           int64_t i, float *din, int din_set, int no_wgrad, const float *dout,
                           const void *in, int64_t N, int IC, int OC) {
    const loom_backend *be = m->be;
    const loom_tensor_info *tw = loom_model_layer_tensor(m, l, wk);
    const loom_tensor_info *tb = bk >= 0 ? loom_model_layer_tensor(m, l, bk) : NULL;
    const int64_t per = (int64_t)OC * IC;
    LOOM_CHECK(tw != NULL);
    float *dw = no_wgrad ? NULL : gview(m, tw), *db = no_wgrad || !tb ? NULL : gview(m, tb);
    if (dw) dw += i * per;
    if (db) db += i * OC;
    if (m->bf16) {
        LOOM_CHECK(f->dout16 != NULL);
        be->bf16_matmul_backward(din, din_set, dw, db, dout, f->dout16, in,
                                 bview(m, tw) + i * per, N, IC, OC);
        return;
    }
    const float *w = pview(m, tw) + i * per;
    if (din_set) be->matmul_backward_set(din, dw, db, dout, in, w, N, IC, OC);
    else be->matmul_backward(din, dw, db, dout, in, w, N, IC, OC);
}

/* its backward: dx (fp32, this op's alone) set from dy and the fp32 rows x the forward normed */
static void qknorm_backward(loom_model *m, block_frame *f, int l, const block_op *op, float *dx,
                            const float *dy, const float *x) {
    const int64_t N = (int64_t)f->B * f->T;
    const loom_backend *be = m->be;
    float **s = f->s;
    const int HD = m->H * m->D, KD = m->KVH * m->D;
    if (m->cfg.arch.qk_norm == LOOM_QK_NORM_WHOLE) {
        /* the rows' sums of dy * w * xhat over the whole q (k), summed over the tp group
         * (after the rstd: (N, 2) scratch) */
        const float *st = s[op->aux0];
        float *dots = s[op->aux0] + 2 * N;
        const float *qw = param(m, op->w, l), *kw = param(m, op->b, l);
        be->rownorm_sums(dots, 2, x, dy, qw, st, N, HD, m->QKV);
        be->rownorm_sums(dots + 1, 2, x + HD, dy + HD, kw, st + 1, N, KD, m->QKV);
        if (m->lay.tp > 1) point(m, LOOM_CP_QKNORM_SUM, 1, l, LOOM_SITE_ATTN, dots, 2 * N);
        be->rownorm_backward(dx, grad(m, op->w, l), dy, x, qw, st, dots, N, HD, m->QKV, 2,
                             m->cfg.n_head * m->D);
        be->rownorm_backward(dx + HD, grad(m, op->b, l), dy + HD, x + HD, kw, st + 1,
                             dots + 1, N, KD, m->QKV, 2, m->cfg.n_kv_head * m->D);
    } else {
        be->headnorm_backward(dx, grad(m, op->w, l), dy, x, param(m, op->w, l),
                              s[op->aux0], N, m->H, m->D, m->QKV, m->H + m->KVH);
        be->headnorm_backward(dx + HD, grad(m, op->b, l), dy + HD, x + HD,
                              param(m, op->b, l), s[op->aux0] + m->H, N, m->KVH, m->D,
                              m->QKV, m->H + m->KVH);
    }
    be->mem_d2d_rows(dx + HD + KD, (size_t)m->QKV * sizeof(float), dy + HD + KD,
                     (size_t)m->QKV * sizeof(float), (size_t)KD * sizeof(float), (size_t)N);
}

static void op_backward_bf16(loom_model *m, block_frame *f, int l, const block_op *op);

static void op_forward(loom_model *m, block_frame *f, int l, const block_op *op) {
    if (m->bf16) { /* training.precision bf16: the ops on bf16 slots (below) */
        op_forward_bf16(m, f, l, op);
        return;
    }
    const int64_t N = (int64_t)f->B * f->T;
    const int C = m->cfg.d_model, mlp = m->cfg.arch.mlp;
    float **s = f->s;
    const loom_backend *be = m->be;
    switch (op->kind) {
    case OP_NORM:
        if (!is_post_norm(op) && !has_pre(m)) break; /* norm_place post: out is in */
        model_norm_fwd(m, s[op->out], s[op->aux0], s[op->aux1], s[op->in], param(m, op->w, l),
                       param(m, op->b, l), rows(m, f, op->in));
        break;
    case OP_POINT: point2(m, f, op, 0, l); break;
    case OP_LINEAR: {
        const int bias_here = !op->row_parallel || m->lay.tp_rank == 0;
        model_linear_forward(m, f, l, param_kind(m, op->w), bias_here ? op->b : -1, 0,
                             s[op->out], s[op->in], N, width(m, op->iw), width(m, op->ow), 0);
        if (m->lora)
            lora_linear_forward(m, f, l, lora_site(op->w), s[op->out], s[op->in], width(m, op->ow));
        break;
    }
    case OP_QKNORM: qknorm_forward(m, f, l, op, s[op->out], s[op->in]); break;
    case OP_ROPE:
        if (f->seg) { /* ragged: each segment at its own positions */
            for (int i = 0; i < f->nseg; i++) {
                const block_seg *g = &f->seg[i];
                float *r = s[op->in] + (int64_t)g->row0 * m->QKV;
                const float *rc, *rs;
                rope_tabs(m, l, &rc, &rs);
                be->rope_forward(r, 1, g->n, m->H, m->D, m->QKV, rc, rs, g->pos0);
                be->rope_forward(r + m->H * m->D, 1, g->n, m->KVH, m->D, m->QKV, rc, rs,
                                 g->pos0);
            }
            break;
        }
        rope(m, f, l, s[op->in], 0);
        break;
    case OP_ATTN:
        if (f->seg) { /* ragged: each segment against its own cache */
            for (int i = 0; i < f->nseg; i++) {
                const block_seg *g = &f->seg[i];
                const size_t off = model_kv_layer_off(m, l, g->cap);
                attend_cache(m, l, s[op->out] + (int64_t)g->row0 * m->H * m->D,
                             s[op->in] + (int64_t)g->row0 * m->QKV, g->k + off, g->v + off,
                             g->cap, g->pos0, g->n, f->scores);
            }
        } else if (f->kcache) { /* decode: one row against the cache */
            attend_cache(m, l, s[op->out], s[op->in], f->kcache, f->vcache, f->kcap, f->pos0, 1,
                         f->scores);
        } else if (m->has_attn) { /* context parallelism: parallel/ attends across ranks */
            m->attn.forward(m->attn.ctx, l, s[op->out], s[op->aux0], s[op->in], f->B, f->T,
                            f->n_runs ? f->gdocs : NULL);
        } else if (m->cfg.attention == LOOM_ATTN_FLASH) { /* S_ATT keeps the lse (B,H,T) */
            LOOM_CHECK(m->lay.cp <= 1); /* a cp view attends only through its hook */
            const loom_attn_dims dims = flash_attention_dims_qkv(f->B, f->T, m->H, m->KVH, m->D);
            const loom_attn_mask mask = attn_mask(m, f, l);
            const float *q = s[op->in], *k = q + m->H * m->D, *v = k + m->KVH * m->D;
            LOOM_CHECK(be->flash_attention_forward(s[op->out], s[op->aux0], q, k, v, &dims,
                                                   &mask) == 0);
        } else if (f->n_runs) { /* sdpa per document: S_ATT packs each run's (H,len,len) */
            const loom_attn_mask mask = attn_mask(m, f, l); /* (its window and scores only) */
            int64_t at = 0;
            for (int r = 0; r < f->n_runs; r++) {
                const int64_t row = f->run_row[r], len = f->run_len[r];
                be->attention_forward(s[op->out] + row * m->H * m->D, s[op->aux0] + at,
                                      s[op->in] + row * m->QKV, 1, (int)len, m->H, m->KVH, m->D,
                                      &mask);
                at += (int64_t)m->H * len * len;
            }
        } else {
            const loom_attn_mask mask = attn_mask(m, f, l);
            be->attention_forward(s[op->out], s[op->aux0], s[op->in], f->B, f->T, m->H, m->KVH,
                                  m->D, &mask);
        }
        break;
    case OP_ACT:
        if (mlp == LOOM_MLP_GELU) be->gelu_forward(s[op->out], s[op->in], N * m->F);
        else if (mlp == LOOM_MLP_GEGLU) be->geglu_forward(s[op->out], s[op->in], N, m->F);
        else be->swiglu_forward(s[op->out], s[op->in], N, m->F);
        break;
    case OP_RESIDUAL:
        be->residual_forward(s[op->out], s[op->out], s[op->in], rows(m, f, op->in) * C);
        break;
    case OP_MOE: moe_forward(m, f, l, op->in, op->out); break;
    }
}

static void op_backward(loom_model *m, block_frame *f, int l, const block_op *op) {
    if (m->bf16) {
        op_backward_bf16(m, f, l, op);
        return;
    }
    const int64_t N = (int64_t)f->B * f->T;
    const int C = m->cfg.d_model, mlp = m->cfg.arch.mlp;
    float **s = f->s, **g = f->g;
    const loom_backend *be = m->be;
    switch (op->kind) {
    case OP_NORM: /* accumulates into the residual stream's gradient */
        if (!is_post_norm(op) && !has_pre(m)) { /* absent: out was in, its gradient adds */
            be->residual_forward(g[op->in], g[op->in], g[op->out], rows(m, f, op->in) * C);
            break;
        }
        if (is_post_norm(op)) /* in (S_ATTO, S_FFO) is the post-norm's alone: zeroed first */
            be->mem_set(g[op->in], 0, (size_t)rows(m, f, op->in) * (size_t)C * sizeof(float));
        if (m->cfg.arch.norm == LOOM_NORM_LAYER)
            be->layernorm_backward(g[op->in], grad(m, op->w, l), grad(m, op->b, l), g[op->out],
                                   s[op->in], param(m, op->w, l), s[op->aux0], s[op->aux1],
                                   rows(m, f, op->in), C);
        else
            be->rmsnorm_backward(g[op->in], grad(m, op->w, l), g[op->out], s[op->in],
                                 param(m, op->w, l), s[op->aux1], rows(m, f, op->in), C);
        break;
    case OP_POINT: point2(m, f, op, 1, l); break;
    case OP_LINEAR: {
        const int iw = width(m, op->iw);
        regather(m, f, op, l);
        /* g[in] is this op's alone (no other op adds to it): overwritten, not zeroed first;
         * with LoRA adapters the base weights are frozen: no gradient for them */
        model_linear_backward(m, f, l, param_kind(m, op->w), op->b, 0, g[op->in], 1,
                              m->lora != NULL, g[op->out], s[op->in], N, iw, width(m, op->ow));
        if (m->lora)
            lora_linear_backward(m, f, l, lora_site(op->w), g[op->in], g[op->out], s[op->in],
                                 width(m, op->ow));
        break;
    }
    case OP_QKNORM: /* g[in] is this op's alone: q, k set by the norms' backward, v copied */
        LOOM_CHECK(g[op->in] != g[op->out] && s[op->in] != s[op->out]);
        qknorm_backward(m, f, l, op, g[op->in], g[op->out], s[op->in]);
        break;
    case OP_ROPE:
        rope(m, f, l, g[op->in], 1);
        break;
    case OP_ATTN:
        if (!m->has_attn && m->cfg.attention == LOOM_ATTN_FLASH) { /* recomputes the tiles
                                                                    * from q, k, v, lse */
            const loom_attn_dims dims = flash_attention_dims_qkv(f->B, f->T, m->H, m->KVH, m->D);
            const loom_attn_mask mask = attn_mask(m, f, l);
            const int HD = m->H * m->D, KD = m->KVH * m->D;
            const float *q = s[op->in];
            float *dq = g[op->in];
            /* dq|dk|dv fill the fused rows exactly: overwritten, no zeroing pass first */
            LOOM_CHECK(be->flash_attention_backward_set(dq, dq + HD, dq + HD + KD, g[op->out],
                                                        q, q + HD, q + HD + KD, s[op->out],
                                                        s[op->aux0], &dims, &mask) == 0);
            break;
        }
        be->mem_set(g[op->in], 0, (size_t)N * (size_t)m->QKV * sizeof(float));
        const loom_attn_mask smask = attn_mask(m, f, l); /* sdpa: its window and scores */
        if (m->has_attn) {
            m->attn.backward(m->attn.ctx, l, g[op->in], g[op->out], s[op->in], s[op->out],
                             s[op->aux0], f->B, f->T, f->n_runs ? f->gdocs : NULL);
        } else if (f->n_runs) {
            int64_t at = 0;
            for (int r = 0; r < f->n_runs; r++) {
                const int64_t row = f->run_row[r], len = f->run_len[r];
                be->attention_backward(g[op->in] + row * m->QKV, f->datt + at,
                                       g[op->out] + row * m->H * m->D, s[op->in] + row * m->QKV,
                                       s[op->aux0] + at, 1, (int)len, m->H, m->KVH, m->D,
                                       &smask);
                at += (int64_t)m->H * len * len;
            }
        } else {
            be->attention_backward(g[op->in], f->datt, g[op->out], s[op->in], s[op->aux0], f->B,
                                   f->T, m->H, m->KVH, m->D, &smask);
        }
        break;
    case OP_ACT:
        if (mlp == LOOM_MLP_GELU) { /* overwrites g[in]: no zeroing pass */
            be->gelu_backward_set(g[op->in], s[op->in], g[op->out], N * m->F);
            break;
        }
        be->mem_set(g[op->in], 0, (size_t)N * (size_t)m->FFI * sizeof(float));
        if (mlp == LOOM_MLP_GEGLU) be->geglu_backward(g[op->in], s[op->in], g[op->out], N, m->F);
        else be->swiglu_backward(g[op->in], s[op->in], g[op->out], N, m->F);
        break;
    case OP_RESIDUAL: /* out = out + in: both see the residual stream's gradient (one buffer) */
        LOOM_CHECK(g[op->in] == g[op->out]);
        break;
    case OP_MOE: moe_backward(m, f, l, op->in, op->out); break;
    }
}

/* ---- training.precision bf16: the block's ops on bf16 slots ------------------------------
 * Saved activations are bf16 (m->slot_dt), their gradients fp32; the linears read the bf16
 * weight copies (bview: m->wb, or ZeRO 3's gathered unit's), the norms fp32 weights and
 * biases. Only what create allows in bf16 (model.c check_layout; docs/training.md "Precision"
 * lists what it refuses) comes here; LoRA's adapters (lora.c) add after a linear's GEMM. */

/* a slot's buffer as dtype dt: any other dtype stops the run here (nothing converts silently) */
static void *slot_as(const loom_model *m, const block_frame *f, int k, int dt, const char *file,
                     int line) {
    if (m->slot_dt[k] != dt)
        loom_panic(file, line, "activation slot %d holds dtype %d, read as dtype %d", k,
                   m->slot_dt[k], dt);
    return f->s[k];
}
#define SLOT_BF16(m, f, k) ((uint16_t *)slot_as((m), (f), (k), LOOM_DT_BF16, __FILE__, __LINE__))
#define SLOT_F32(m, f, k) ((float *)slot_as((m), (f), (k), LOOM_DT_F32, __FILE__, __LINE__))

/* a linear's bf16 weight copy */
static const uint16_t *bparam(const loom_model *m, int w, int l) {
    LOOM_CHECK(w != P_NONE && m->bf16);
    return bview(m, loom_model_layer_tensor(m, l, param_kind(m, w)));
}

static void op_forward_bf16(loom_model *m, block_frame *f, int l, const block_op *op) {
    const int64_t N = (int64_t)f->B * f->T;
    const int C = m->cfg.d_model, mlp = m->cfg.arch.mlp;
    const loom_backend *be = m->be;
    LOOM_CHECK(!f->kcache && !f->seg);
    switch (op->kind) {
    case OP_NORM: {
        if (!is_post_norm(op) && !has_pre(m)) break; /* norm_place post: out is in */
        uint16_t *out = SLOT_BF16(m, f, op->out);
        const uint16_t *in = SLOT_BF16(m, f, op->in);
        const int64_t n = rows(m, f, op->in); /* (the shard's under sequence parallelism) */
        if (m->cfg.arch.norm == LOOM_NORM_LAYER)
            be->bf16_layernorm_forward(out, SLOT_F32(m, f, op->aux0), SLOT_F32(m, f, op->aux1),
                                       in, param(m, op->w, l), param(m, op->b, l), n, C,
                                       m->cfg.norm_eps);
        else
            be->bf16_rmsnorm_forward(out, SLOT_F32(m, f, op->aux1), in, param(m, op->w, l), n,
                                     C, m->cfg.norm_eps);
        break;
    }
    case OP_POINT:
        if (m->lay.tp > 1 && op->point == LOOM_CP_ROW_OUT) {
            /* the row-parallel partial sums reduced in fp32 (under sequence parallelism
             * reduce-scattered into the shard's fp32 rows), then rounded once */
            const int64_t n = rows(m, f, op->out);
            float *sum = f->rowp;
            LOOM_CHECK(f->rowp != NULL);
            if (m->lay.sp) {
                LOOM_CHECK(f->rowps != NULL && m->has_cp && m->cp.move);
                m->cp.move(m->cp.ctx, op->point, 0, l, op->site, f->rowp, N * C, f->rowps,
                           n * C, sizeof(float));
                sum = f->rowps;
            } else {
                point(m, op->point, 0, l, op->site, f->rowp, N * C);
            }
            be->bf16_from_f32(SLOT_BF16(m, f, op->out), sum, n * C);
            break;
        }
        point2(m, f, op, 0, l);
        break;
    case OP_LINEAR:
        if (op->row_parallel && m->lay.tp > 1) { /* fp32 partial sums (bias on tp rank 0) */
            be->bf16_matmul_forward_f32(f->rowp, SLOT_BF16(m, f, op->in), bparam(m, op->w, l),
                                        m->lay.tp_rank == 0 ? param(m, op->b, l) : NULL, N,
                                        width(m, op->iw), width(m, op->ow));
            break;
        }
        model_linear_forward(m, f, l, param_kind(m, op->w), op->b, 0, SLOT_BF16(m, f, op->out),
                             SLOT_BF16(m, f, op->in), N, width(m, op->iw), width(m, op->ow), 0);
        if (m->lora) /* the adapters' product added into the bf16 output, rounded once */
            lora_linear_forward(m, f, l, lora_site(op->w), SLOT_BF16(m, f, op->out),
                                SLOT_BF16(m, f, op->in), width(m, op->ow));
        break;
    case OP_QKNORM: { /* the bf16 rows widened (exactly) into x32, normed there in fp32 as
                       * the fp32 op does (v unchanged), rounded once into the output */
        const int64_t n = N * m->QKV;
        float *x = f->x32;
        LOOM_CHECK(x != NULL);
        (void)SLOT_F32(m, f, op->aux0);
        be->bf16_to_f32(x, SLOT_BF16(m, f, op->in), n);
        qknorm_forward(m, f, l, op, x, x);
        be->bf16_from_f32(SLOT_BF16(m, f, op->out), x, n);
        break;
    }
    case OP_ROPE: rope_bf16(m, f, l, SLOT_BF16(m, f, op->in)); break;
    case OP_ATTN: {
        if (m->has_attn) { /* context parallelism: the hook widens the bf16 slots (cp.c) */
            m->attn.forward(m->attn.ctx, l, (float *)SLOT_BF16(m, f, op->out),
                            SLOT_F32(m, f, op->aux0), (const float *)SLOT_BF16(m, f, op->in),
                            f->B, f->T, f->n_runs ? f->gdocs : NULL);
            break;
        }
        const loom_attn_mask mask = attn_mask(m, f, l);
        LOOM_CHECK(f->fws != NULL);
        LOOM_CHECK(be->bf16_flash_attention_forward(SLOT_BF16(m, f, op->out),
                                                    SLOT_F32(m, f, op->aux0),
                                                    SLOT_BF16(m, f, op->in), f->fws, f->B, f->T,
                                                    m->H, m->KVH, m->D, &mask) == 0);
        break;
    }
    case OP_ACT:
        if (mlp == LOOM_MLP_GELU)
            be->bf16_gelu_forward(SLOT_BF16(m, f, op->out), SLOT_BF16(m, f, op->in), N * m->F);
        else
            be->bf16_glu_forward(SLOT_BF16(m, f, op->out), SLOT_BF16(m, f, op->in), N, m->F,
                                 mlp == LOOM_MLP_GEGLU);
        break;
    case OP_RESIDUAL: {
        uint16_t *out = SLOT_BF16(m, f, op->out);
        be->bf16_residual_forward(out, out, SLOT_BF16(m, f, op->in), rows(m, f, op->in) * C);
        break;
    }
    case OP_MOE: /* bf16 rows in and out (moe.c: fp32 router, bf16 experts) */
        (void)SLOT_BF16(m, f, op->in);
        (void)SLOT_BF16(m, f, op->out);
        moe_forward(m, f, l, op->in, op->out);
        break;
    default: LOOM_CHECK(0 && "this op has no bf16 form (training.precision bf16)");
    }
}

/* backward: the fp32 gradients g[] from the bf16 slots; the same accumulation as fp32's */
static void op_backward_bf16(loom_model *m, block_frame *f, int l, const block_op *op) {
    const int64_t N = (int64_t)f->B * f->T;
    const int C = m->cfg.d_model, mlp = m->cfg.arch.mlp;
    float **g = f->g;
    const loom_backend *be = m->be;
    switch (op->kind) {
    case OP_NORM: { /* accumulates into the residual stream's gradient (the shard's rows under
                     * sequence parallelism) */
        const int64_t n = rows(m, f, op->in);
        if (!is_post_norm(op) && !has_pre(m)) { /* absent: out was in, its gradient adds */
            be->residual_forward(g[op->in], g[op->in], g[op->out], n * C);
            break;
        }
        if (is_post_norm(op)) /* in (S_ATTO, S_FFO) is the post-norm's alone: zeroed first */
            be->mem_set(g[op->in], 0, (size_t)n * (size_t)C * sizeof(float));
        if (m->cfg.arch.norm == LOOM_NORM_LAYER)
            be->bf16_layernorm_backward(g[op->in], grad(m, op->w, l), grad(m, op->b, l),
                                        g[op->out], SLOT_BF16(m, f, op->in), param(m, op->w, l),
                                        SLOT_F32(m, f, op->aux0), SLOT_F32(m, f, op->aux1), n, C);
        else
            be->bf16_rmsnorm_backward(g[op->in], grad(m, op->w, l), g[op->out],
                                      SLOT_BF16(m, f, op->in), param(m, op->w, l),
                                      SLOT_F32(m, f, op->aux1), n, C);
        break;
    }
    case OP_POINT: point2(m, f, op, 1, l); break;
    case OP_LINEAR: /* g[in] is this op's alone: set (LoRA: the base frozen, no wgrad) */
        regather(m, f, op, l);
        model_linear_backward(m, f, l, param_kind(m, op->w), op->b, 0, g[op->in], 1,
                              m->lora != NULL, g[op->out], SLOT_BF16(m, f, op->in), N,
                              width(m, op->iw), width(m, op->ow));
        if (m->lora)
            lora_linear_backward(m, f, l, lora_site(op->w), g[op->in], g[op->out],
                                 SLOT_BF16(m, f, op->in), width(m, op->ow));
        break;
    case OP_QKNORM: { /* from the bf16 rows widened again (exactly) into x32 */
        LOOM_CHECK(f->x32 != NULL && g[op->in] != g[op->out]);
        (void)SLOT_F32(m, f, op->aux0);
        be->bf16_to_f32(f->x32, SLOT_BF16(m, f, op->in), N * m->QKV);
        qknorm_backward(m, f, l, op, g[op->in], g[op->out], f->x32);
        break;
    }
    case OP_ROPE: rope(m, f, l, g[op->in], 1); break; /* the inverse rotation of the fp32 dq|dk */
    case OP_ATTN: {
        if (m->has_attn) { /* context parallelism (cp.c): dq|dk|dv accumulate from zero */
            be->mem_set(g[op->in], 0, (size_t)N * (size_t)m->QKV * sizeof(float));
            m->attn.backward(m->attn.ctx, l, g[op->in], g[op->out],
                             (const float *)SLOT_BF16(m, f, op->in),
                             (const float *)SLOT_BF16(m, f, op->out), SLOT_F32(m, f, op->aux0),
                             f->B, f->T, f->n_runs ? f->gdocs : NULL);
            break;
        }
        const loom_attn_mask mask = attn_mask(m, f, l);
        LOOM_CHECK(be->bf16_flash_attention_backward(g[op->in], g[op->out],
                                                     SLOT_BF16(m, f, op->in),
                                                     SLOT_BF16(m, f, op->out),
                                                     SLOT_F32(m, f, op->aux0), f->fws, f->B,
                                                     f->T, m->H, m->KVH, m->D, &mask) == 0);
        break;
    }
    case OP_ACT:
        if (mlp == LOOM_MLP_GELU) {
            be->bf16_gelu_backward(g[op->in], 1, SLOT_BF16(m, f, op->in), g[op->out], N * m->F);
            break;
        }
        be->mem_set(g[op->in], 0, (size_t)N * (size_t)m->FFI * sizeof(float));
        be->bf16_glu_backward(g[op->in], SLOT_BF16(m, f, op->in), g[op->out], N, m->F,
                              mlp == LOOM_MLP_GEGLU);
        break;
    case OP_RESIDUAL: LOOM_CHECK(g[op->in] == g[op->out]); break;
    case OP_MOE: moe_backward(m, f, l, op->in, op->out); break;
    default: LOOM_CHECK(0 && "this op has no bf16 form (training.precision bf16)");
    }
}

void block_forward(loom_model *m, block_frame *f, int layer) {
    alias_whole_slots(m, f);
    for (int i = 0; i < N_OPS; i++)
        if (!skipped(m, layer, &BLOCK[i])) op_forward(m, f, layer, &BLOCK[i]);
}

void block_backward(loom_model *m, block_frame *f, int layer) {
    alias_whole_slots(m, f);
    for (int i = N_OPS - 1; i >= 0; i--)
        if (!skipped(m, layer, &BLOCK[i])) op_backward(m, f, layer, &BLOCK[i]);
}

void block_recompute(loom_model *m, block_frame *f, int layer) {
    if (m->cfg.recompute == LOOM_RECOMPUTE_FULL) {
        block_forward(m, f, layer);
        return;
    }
    /* selective: the ops whose outputs were not kept (slot_kept), from kept inputs; q|k|v is
     * kept rotated, so attention runs on it as the forward did */
    for (int i = 0; i < N_OPS; i++) {
        const int k = BLOCK[i].kind;
        /* (a post-norm's output is the residual stream, kept: not recomputed) */
        if ((k == OP_NORM || k == OP_ATTN || k == OP_ACT) && !is_post_norm(&BLOCK[i]) &&
            !skipped(m, layer, &BLOCK[i]))
            op_forward(m, f, layer, &BLOCK[i]);
    }
}
