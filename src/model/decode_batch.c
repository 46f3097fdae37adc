/* Batched (ragged) decoding: one forward over rows of many sequences, each segment at its own
 * positions with its own KV cache. Each layer walks the block definition (src/model/block.c)
 * once over all rows: the linears are one GEMM over every row of the step, rope and attention
 * work per segment (block_frame.seg), so a segment's rows get what a full forward over its
 * sequence gives (tests/unit/test_engine.c).
 *
 * A tensor-parallel view (tp > 1, docs/inference.md) runs the same walk over its heads and
 * columns, with the model's communication points: the vocab-parallel embedding's partial sums
 * through ROW_OUT, each row-parallel linear's through ROW_OUT (the block), and the head's
 * logits of the view's vocabulary rows gathered through VOCAB_GATHER, so that every rank of
 * the tp group returns the whole logits, bit for bit the same on each (tests/unit/
 * test_decode_tp.c). Its KV caches hold the view's kv heads only. */
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "model/model_internal.h"

struct loom_decode_ws {
    const loom_backend *be; /* every buffer is its device memory, but seg and hlogits */
    int32_t *tok;           /* (max_rows) the step's token ids, copied in */
    float *hlogits;         /* (max_logits, V) host: the logits read back for sampling (NULL
                             * where the backend's memory is host memory: w->logits itself) */
    int max_rows, max_logits;
    int64_t floats;
    float *mem;
    float *res[3];          /* (rows, C) the residual stream */
    float *h;               /* (rows, C) norm output */
    float *mean, *rstd;     /* (rows) */
    float *qkst;            /* (rows, H + KVH + 4) the q/k norms' row statistics */
    float *qkv;             /* (rows, QKV) */
    float *att;             /* (rows, H*D) */
    float *fch, *fact;      /* (rows, FFI), (rows, F) */
    float *last;            /* (max_logits, C) the rows that want logits */
    float *lastn;           /* (max_logits, C) their final norm */
    float *logits;          /* (max_logits, V) */
    float *vhead;           /* tp > 1: (max_logits, Vl) this view's logits */
    float *vsend;           /* tp > 1: (max_logits, Vp) the same padded to Vp = ceil(V/tp) */
    float *vall;            /* tp > 1: (tp, max_logits, Vp) every view's, gathered */
    float *scores;          /* (H * maxT) */
    block_seg *seg;         /* (max_rows) */
    float *moe;             /* the MoE op's slots for max_rows rows (an MoE model) */
    float *moe_slot[S_COUNT];
    size_t moe_floats;
    uint16_t *xbf;          /* --compute bf16: (max(max_rows, max_logits), widest input) */
    size_t xbf_n;
    int8_t *xq8;            /* --weights int8: (max(max_rows, max_logits), widest input) */
    uint16_t *xq8d;         /* and their scales, (.., widest input / 32) */
    float *xq4d;            /* --weights int4: (.., widest input / 256) Q4_K-side scales */
    int16_t *xq4s;          /* and (.., widest input / 32) sub-block sums */
    size_t xq8_n;
};

size_t loom_model_kv_floats_per_pos(const loom_model *m) {
    return (size_t)m->cfg.n_layer * (size_t)m->KVH * (size_t)m->D;
}

int loom_model_kv_slots(const loom_model *m, int layer, int cap) {
    const int w = loom_config_layer_window(&m->cfg, layer);
    return w > 0 && w < cap ? w : cap;
}

size_t model_kv_layer_off(const loom_model *m, int l, int cap) {
    size_t rows = 0;
    for (int i = 0; i < l; i++) rows += (size_t)loom_model_kv_slots(m, i, cap);
    return rows * (size_t)m->KVH * (size_t)m->D;
}

size_t loom_model_kv_floats(const loom_model *m, int cap) {
    return model_kv_layer_off(m, m->cfg.n_layer, cap);
}


loom_decode_ws *loom_decode_ws_create(const loom_model *m, int max_rows, int max_logits) {
    const loom_model_config *c = &m->cfg;
    LOOM_CHECK(c->head == LOOM_HEAD_LM && max_rows > 0 && max_logits > 0);
    /* the whole layer range and the whole rows (no sequence or context parallelism) */
    LOOM_CHECK(!m->lay.sp && m->lay.cp <= 1 && m->lay.has_embedding && m->lay.has_head);
    loom_decode_ws *w = loom_calloc(1, sizeof *w);
    const loom_backend *be = w->be = m->be;
    w->max_rows = max_rows;
    w->max_logits = max_logits;
    const int64_t R = max_rows, C = c->d_model, K = max_logits, tp = m->lay.tp;
    const int64_t Vp = tp > 1 ? (c->vocab_size + tp - 1) / tp : 0; /* 0: no gather buffers */
    const int64_t sizes[] = {R * C, R * C, R * C, R * C, R, R, R * m->QKV, R * m->H * m->D,
                             R * m->FFI, R * m->F, K * C, K * C, K * c->vocab_size,
                             (int64_t)m->H * c->max_seq_len, tp > 1 ? K * m->Vl : 0, K * Vp,
                             tp * K * Vp, R * (m->H + m->KVH + 4)};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    int64_t at = 0;
    for (int i = 0; i < NS; i++) at += (sizes[i] + 15) & ~(int64_t)15;
    w->floats = at;
    w->mem = be->mem_alloc((size_t)at * sizeof(float), 0);
    w->tok = be->mem_alloc((size_t)max_rows * sizeof(int32_t), 0);
    if (!be->host_memory)
        w->hlogits = loom_malloc((size_t)K * (size_t)c->vocab_size * sizeof(float));
    float **dst[NS] = {&w->res[0], &w->res[1], &w->res[2], &w->h, &w->mean, &w->rstd,
                       &w->qkv, &w->att, &w->fch, &w->fact, &w->last, &w->lastn, &w->logits,
                       &w->scores, &w->vhead, &w->vsend, &w->vall, &w->qkst};
    at = 0;
    for (int i = 0; i < NS; i++) {
        *dst[i] = w->mem + at;
        at += (sizes[i] + 15) & ~(int64_t)15;
    }
    w->seg = loom_calloc((size_t)max_rows, sizeof *w->seg);
    const int64_t wide = C > m->H * m->D ? (C > m->F ? C : m->F)
                                         : (m->H * m->D > m->F ? m->H * m->D : m->F);
    if (m->wopt == LOOM_WF_Q8_0 || m->wopt == LOOM_WF_Q4_K) {
        /* --weights int8 / int4: the quantized input rows of a linear, or of the head */
        w->xq8_n = (size_t)(R > K ? R : K) * (size_t)wide;
        w->xq8 = be->mem_alloc(w->xq8_n, 0);
        w->xq8d = be->mem_alloc(w->xq8_n / 32 * sizeof(uint16_t) + 64, 0);
        if (m->wopt == LOOM_WF_Q4_K) { /* --weights int4: the Q4_K linears' input scales and sums */
            w->xq4d = be->mem_alloc(w->xq8_n / LOOM_Q4K_BLOCK * sizeof(float) + 64, 0);
            w->xq4s = be->mem_alloc(w->xq8_n / 32 * sizeof(int16_t) + 64, 0);
        }
    }
    if (m->wopt == LOOM_WF_BF16P) { /* --compute bf16: the rounded input rows of a linear or the head */
        w->xbf_n = (size_t)m->be->dotbf16_act_elems((int)(R > K ? R : K), (int)wide);
        w->xbf = be->mem_alloc(w->xbf_n * sizeof(uint16_t), 0);
    }
    if (m->E > 0) { /* MoE layers route the step's rows dropless, as decoding does */
        LOOM_CHECK(m->ep == 1);
        size_t n = 0;
        for (int k = S_MOE_PROB; k < S_COUNT; k++) n += ((size_t)moe_slot_floats(m, k, R) + 15) & ~(size_t)15;
        w->moe = be->mem_alloc(n * sizeof(float), 0);
        w->moe_floats = n;
        n = 0;
        for (int k = S_MOE_PROB; k < S_COUNT; k++) {
            w->moe_slot[k] = w->moe + n;
            n += ((size_t)moe_slot_floats(m, k, R) + 15) & ~(size_t)15;
        }
    }
    return w;
}

void loom_decode_ws_free(loom_decode_ws *w) {
    if (!w) return;
    const loom_backend *be = w->be;
    be->mem_free(w->mem);
    be->mem_free(w->tok);
    free(w->hlogits);
    free(w->seg);
    be->mem_free(w->moe);
    be->mem_free(w->xbf);
    be->mem_free(w->xq8);
    be->mem_free(w->xq8d);
    be->mem_free(w->xq4d);
    be->mem_free(w->xq4s);
    free(w);
}

size_t loom_decode_ws_bytes(const loom_decode_ws *w) {
    return ((size_t)w->floats + w->moe_floats) * sizeof(float) +
           (size_t)w->max_rows * sizeof(block_seg) + w->xbf_n * sizeof(uint16_t) +
           w->xq8_n + w->xq8_n / 32 * sizeof(uint16_t) +
           (w->xq4d ? w->xq8_n / LOOM_Q4K_BLOCK * sizeof(float) + w->xq8_n / 32 * sizeof(int16_t) : 0);
}

/* the k rows of logits sampling reads, in host memory */
static const float *ws_logits(const loom_model *m, const loom_decode_ws *w, int k) {
    if (!w->hlogits) return w->logits; /* the backend's memory is host memory */
    loom_dev_read(m->be, w->hlogits, w->logits,
                  (size_t)k * (size_t)m->cfg.vocab_size * sizeof(float), "sampling logits rows");
    return w->hlogits;
}

const float *loom_model_decode_batch(loom_model *m, loom_decode_ws *w, const int32_t *tokens,
                                     const loom_decode_seg *segs, int nseg) {
    const loom_model_config *c = &m->cfg;
    const int C = c->d_model, V = c->vocab_size;
    LOOM_CHECK(c->head == LOOM_HEAD_LM);
    model_decode_bind(m); /* its own arenas, or resident hooks (a model being trained) */
    LOOM_CHECK(nseg > 0 && nseg <= w->max_rows);
    int rows = 0, nlog = 0;
    for (int i = 0; i < nseg; i++) {
        const loom_decode_seg *s = &segs[i];
        LOOM_CHECK(s->n > 0 && s->pos0 >= 0 && s->pos0 + s->n <= s->cap &&
                   s->cap <= c->max_seq_len);
        w->seg[i] = (block_seg){.k = s->k, .v = s->v, .cap = s->cap, .row0 = rows, .n = s->n,
                                .pos0 = s->pos0};
        rows += s->n;
        nlog += s->want_logits != 0;
        LOOM_CHECK(rows <= w->max_rows && nlog <= w->max_logits);
    }
    for (int r = 0; r < rows; r++) LOOM_CHECK(tokens[r] >= 0 && tokens[r] < V);
    m->be->mem_h2d(w->tok, tokens, (size_t)rows * sizeof(int32_t)); /* the host's token ids */
    /* the workspace predates loom_model_set_compute_bf16 / _weights_int8 / _int4 */
    LOOM_CHECK(m->wopt != LOOM_WF_BF16P || w->xbf);
    LOOM_CHECK((m->wopt != LOOM_WF_Q8_0 && m->wopt != LOOM_WF_Q4_K) || w->xq8);
    LOOM_CHECK(m->wopt != LOOM_WF_Q4_K || w->xq4d);
    /* the tied wte is the head: with inference weights its rows are the stored head's */
    const int emb_stored = m->wmat && c->arch.tied;
    for (int i = 0; i < nseg && emb_stored; i++) { /* what embedding_forward does */
        const float *wpe = PARAM(m, LOOM_P_WPE); /* NULL with RoPE */
        float *y = w->res[0] + (int64_t)w->seg[i].row0 * C;
        for (int t = 0; t < segs[i].n; t++)
            model_wmat_row(m, &m->wmat[4 * c->n_layer], y + (int64_t)t * C, V, C,
                           tokens[w->seg[i].row0 + t]);
        if (wpe) /* the segment's positions are consecutive: their rows of wpe are too */
            m->be->residual_forward(y, y, wpe + (int64_t)segs[i].pos0 * C,
                                    (int64_t)segs[i].n * C);
        if (c->arch.embed_scale) /* as model_embed_rows (RoPE only: no wpe) */
            m->be->scale_inplace(y, (int64_t)segs[i].n * C, EMBED_SCALE(m));
    }
    for (int i = 0; i < nseg && !emb_stored; i++)
        model_embed_rows(m, 0, w->res[0] + (int64_t)w->seg[i].row0 * C, w->tok + w->seg[i].row0,
                         1, segs[i].n, segs[i].pos0);
    /* vocab-parallel (tp > 1): each view's rows of wte gave a partial sum */
    model_vocab_point(m, LOOM_CP_ROW_OUT, 0, LOOM_SITE_EMBED, w->res[0], (int64_t)rows * C);
    block_frame f;
    memset(&f, 0, sizeof f);
    f.B = 1;
    f.T = rows;
    f.seg = w->seg;
    f.nseg = nseg;
    f.scores = w->scores;
    f.xbf16 = w->xbf;
    f.xq8 = w->xq8;
    f.xq8d = w->xq8d;
    f.xq4d = w->xq4d;
    f.xq4s = w->xq4s;
    f.s[S_LN1] = f.s[S_LN2] = w->h; /* ln1 is dead once q|k|v is computed */
    f.s[S_ATTO] = f.s[S_FFO] = w->h; /* the post-norms' inputs, written after ln1 / ln2 died */
    f.s[S_LN1_MEAN] = f.s[S_LN2_MEAN] = w->mean;
    f.s[S_LN1_RSTD] = f.s[S_LN2_RSTD] = f.s[S_PN1_RSTD] = f.s[S_PN2_RSTD] = w->rstd;
    f.s[S_QKN_RSTD] = w->qkst;
    f.s[S_QKV] = w->qkv;
    f.s[S_ATTY] = w->att;
    f.s[S_FCH] = w->fch;
    f.s[S_FCH_ACT] = w->fact;
    for (int k = S_MOE_PROB; k < S_COUNT; k++) f.s[k] = w->moe_slot[k];
    int x = 0; /* which of the three stream buffers holds the layer's input */
    for (int l = 0; l < c->n_layer; l++) {
        f.s[S_X] = w->res[x];
        f.s[S_RES2] = w->res[(x + 1) % 3];
        f.s[S_RES3] = w->res[(x + 2) % 3];
        block_forward(m, &f, l);
        x = (x + 2) % 3;
    }
    /* the head only on the rows that want logits */
    int k = 0;
    for (int i = 0; i < nseg; i++) {
        if (!segs[i].want_logits) continue;
        const int r = w->seg[i].row0 + segs[i].n - 1;
        m->be->mem_d2d(w->last + (int64_t)k * C, w->res[x] + (int64_t)r * C,
                       (size_t)C * sizeof(float));
        k++;
    }
    if (k == 0) return w->logits; /* (no rows: nothing to read) */
    model_norm_fwd(m, w->lastn, w->mean, w->rstd, w->last, PARAM(m, LOOM_P_LNF_W),
                   PARAM(m, LOOM_P_LNF_B), k);
    /* the head: its stored matrix (inference weights: tp = 1), or the view's fp32 rows */
    const model_wmat hw = m->wmat ? m->wmat[4 * c->n_layer]
                                  : (model_wmat){LOOM_WF_F32, HEAD_W(m), NULL};
    const int tp = m->lay.tp;
    if (tp == 1) {
        model_wmat_forward(m, &f, &hw, w->logits, w->lastn, LOOM_DT_F32, NULL, k, C, V, 1);
        model_softcap(m, w->logits, (int64_t)k * V);
        return ws_logits(m, w, k);
    }
    /* the head is column-parallel over the vocabulary: this view's Vl logits of each row,
     * padded to Vp, gathered from every view, and put in place in the whole rows */
    model_vocab_point(m, LOOM_CP_COL_IN, 0, LOOM_SITE_HEAD, w->lastn, (int64_t)k * C);
    model_wmat_forward(m, &f, &hw, w->vhead, w->lastn, LOOM_DT_F32, NULL, k, C, m->Vl, 1);
    const int Vp = (V + tp - 1) / tp;
    m->be->mem_d2d_rows(w->vsend, (size_t)Vp * sizeof(float), w->vhead,
                        (size_t)m->Vl * sizeof(float), (size_t)m->Vl * sizeof(float), (size_t)k);
    for (int i = 0; i < k && Vp > m->Vl; i++)
        m->be->mem_set(w->vsend + (int64_t)i * Vp + m->Vl, 0,
                       (size_t)(Vp - m->Vl) * sizeof(float));
    LOOM_CHECK(m->has_cp && m->cp.move); /* a tp view decodes with its group's points */
    m->cp.move(m->cp.ctx, LOOM_CP_VOCAB_GATHER, 0, -1, LOOM_SITE_HEAD, w->vsend, (int64_t)k * Vp,
               w->vall, (int64_t)tp * k * Vp, sizeof(float));
    for (int r = 0; r < tp; r++) { /* view r holds rows [v0, v0 + vl) (model.c's split) */
        const int q = V / tp, rem = V % tp;
        const int vl = q + (r < rem), v0 = r * q + (r < rem ? r : rem);
        m->be->mem_d2d_rows(w->logits + v0, (size_t)V * sizeof(float),
                            w->vall + (int64_t)r * k * Vp, (size_t)Vp * sizeof(float),
                            (size_t)vl * sizeof(float), (size_t)k);
    }
    model_softcap(m, w->logits, (int64_t)k * V);
    return ws_logits(m, w, k);
}
