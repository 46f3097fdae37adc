/* The activation arena (struct loom_acts) of the block in block.c: each slot's size and dtype
 * for one micro-batch, their layout (stacked per layer for training, one set for inference,
 * the backward's scratch, the head's buffers), a layer's frame of slots, and the documents'
 * runs (model.doc_mask). */
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/bf16.h"
#include "model/model_internal.h"
/* ---- the activation arena ---------------------------------------------------------------- */

/* floats of slot k for one layer at rows N (B of them) */
static int64_t slot_floats(const loom_model *m, int k, int64_t B, int64_t T) {
    const int64_t N = B * T, C = m->cfg.d_model;
    const int64_t Ns = m->lay.sp ? N / m->lay.tp : N; /* the sequence-sharded regions' rows */
    const int pre = has_pre(m), post = has_post(m);
    switch (k) {
    case S_RES2: case S_RES3: return Ns * C;
    case S_LN1: case S_LN2: return pre ? Ns * C : 0; /* norm_place post: the stream's */
    case S_LN1_RSTD: case S_LN2_RSTD: return pre ? Ns : 0;
    case S_LN1_MEAN: case S_LN2_MEAN: /* LayerNorm's; RMSNorm keeps no mean */
        return m->cfg.arch.norm == LOOM_NORM_LAYER ? Ns : 0;
    case S_ATTO: case S_FFO: return post ? Ns * C : 0;
    case S_PN1_RSTD: case S_PN2_RSTD: return post ? Ns : 0;
    case S_QKVR: return m->cfg.arch.qk_norm ? N * m->QKV : 0;
    case S_QKN_RSTD: /* per head: (N, H + KVH); whole: (N, 2) rstd and (N, 2) backward sums */
        return m->cfg.arch.qk_norm == LOOM_QK_NORM_WHOLE ? 4 * N
               : m->cfg.arch.qk_norm                     ? N * (m->H + m->KVH)
                                                         : 0;
    case S_LN1G: case S_LN2G: case S_RES2P: case S_RES3P: return 0; /* scratch or aliases */
    case S_QKV: return N * m->QKV;
    case S_ATT: /* flash: the per-row log-sum-exp; sdpa: the probabilities */
        return m->cfg.attention == LOOM_ATTN_FLASH ? B * m->H * T : B * m->H * T * T;
    case S_ATTY: return N * m->H * m->D;
    case S_FCH: return N * m->FFI;
    case S_FCH_ACT: return N * m->F;
    case S_X: return 0; /* the previous layer's S_RES3 */
    default: return moe_slot_floats(m, k, N);
    }
}

static size_t pad16(int64_t n) { return ((size_t)n + 15) & ~(size_t)15; } /* 64-byte aligned */

void acts_dtypes(loom_model *m) {
    for (int k = 0; k < S_COUNT; k++) {
        const int stat = k == S_LN1_MEAN || k == S_LN1_RSTD || k == S_LN2_MEAN ||
                         k == S_LN2_RSTD || k == S_ATT || k == S_QKN_RSTD || k == S_PN1_RSTD ||
                         k == S_PN2_RSTD || k == S_MOE_PROB || k == S_MOE_LSE ||
                         k == S_MOE_SH_G;
        m->slot_dt[k] = m->bf16 && !stat ? LOOM_DT_BF16 : LOOM_DT_F32;
    }
    m->slot_dt[S_MOE_ROUTE] = m->slot_dt[S_MOE_META] = LOOM_DT_I32; /* routing ints */
}

/* the 4-byte words of n elements of dtype dt (the arena counts in them) */
static int64_t words(int64_t n, int dt) { return (n * (int64_t)loom_dt_size(dt) + 3) / 4; }

/* Whether slot k is kept per layer for backward under model.recompute (a training arena);
 * the others are one buffer shared by every layer, refilled by block_recompute. full keeps
 * the residual stream only (S_X is the previous layer's S_RES3); selective also the matmul
 * outputs and the norms' statistics, and drops the norms' outputs, attention's output and
 * its lse / probabilities, and the activation's output. */
static int slot_kept(const loom_model *m, int k) {
    switch (m->cfg.recompute) {
    case LOOM_RECOMPUTE_FULL: return k == S_RES3;
    case LOOM_RECOMPUTE_SELECTIVE:
        return !(k == S_LN1 || k == S_ATT || k == S_ATTY || k == S_LN2 || k == S_FCH_ACT);
    default: return 1;
    }
}

/* rows of the LM head's logits chunk (model.loss_chunk) in a training arena; 0 = none */
static int64_t acts_chunk(const loom_model *m, int B, int T, int stacked) {
    const int64_t BT = (int64_t)B * T;
    /* (a tensor-parallel view's vocab-parallel cross-entropy is not chunked) */
    if (!stacked || m->cfg.head != LOOM_HEAD_LM || m->cfg.loss_chunk <= 0 || m->lay.tp > 1)
        return 0;
    return m->cfg.loss_chunk < BT ? m->cfg.loss_chunk : BT;
}

/* Lays the arena out (a = NULL: only counts); returns its floats. */
static size_t layout_acts(const loom_model *m, struct loom_acts *a, float *base, int B, int T,
                          int stacked) {
    const int64_t BT = (int64_t)B * T, C = m->cfg.d_model;
    const int64_t K = m->cfg.num_classes;
    const int cls = m->cfg.head == LOOM_HEAD_CLASSIFY;
    const int64_t nl = stacked ? m->lay.l1 - m->lay.l0 : 1;
    size_t at = 0;
    float *dummy;
#define TAKE(ptr, n)                                   \
    do {                                               \
        float **dst_ = (ptr);                          \
        *dst_ = a ? base + at : NULL;                  \
        at += pad16(n);                                \
    } while (0)
    const int dt_act = m->bf16 ? LOOM_DT_BF16 : LOOM_DT_F32; /* the stream's and lnf's */
    for (int k = 1; k < S_COUNT; k++) {
        const int64_t per = words(slot_floats(m, k, B, T), m->slot_dt[k]);
        const int keep = stacked && slot_kept(m, k); /* else one buffer shared by the layers */
        if (a) {
            a->slot[k] = base + at;
            a->stride[k] = keep ? (int64_t)pad16(per) : 0;
        }
        at += pad16(per) * (size_t)(keep ? nl : 1);
    }
    const int sp = m->lay.sp;
    const int64_t BTs = sp ? BT / m->lay.tp : BT; /* the sequence-sharded regions' rows */
    TAKE(a ? &a->encoded : &dummy, words(BTs * C, dt_act));
    /* a pipeline stage before the last has no head: none of its buffers */
    const int64_t hd = m->lay.has_head;
    TAKE(a ? &a->lnf : &dummy, words(hd * BTs * C, dt_act));
    TAKE(a ? &a->lnf_mean : &dummy, m->cfg.arch.norm == LOOM_NORM_LAYER ? hd * BTs : 0);
    TAKE(a ? &a->lnf_rstd : &dummy, hd * BTs);
    if (sp) { /* whole-row scratch; without sequence parallelism these are the shard buffers.
               * bf16: the gathered normed rows are bf16, the row-parallel partial sums rowp's
               * (below), reduce-scattered into an fp32 shard here before they are rounded */
        TAKE(a ? &a->sp_gather : &dummy, words(BT * C, dt_act));
        TAKE(a ? &a->sp_partial : &dummy, m->bf16 ? BTs * C : BT * C);
        TAKE(a ? &a->lnf_full : &dummy, words(hd * BT * C, dt_act));
    }
    const int64_t chunk = hd ? acts_chunk(m, B, T, stacked) : 0;
    if (a) a->chunk = chunk;
    /* bf16 logits (fp32 for a vocab-parallel head: its cross-entropy pieces are fp32) */
    TAKE(a ? &a->logits : &dummy,
         words(hd * (cls ? (int64_t)B * K : (chunk ? chunk : BT) * m->Vl),
               model_logits_f32(m) ? LOOM_DT_F32 : dt_act));
    TAKE(a ? &a->losses : &dummy, hd * BT);
    if (!cls && hd && m->lay.tp > 1) { /* vocab-parallel cross-entropy's row statistics */
        TAKE(a ? &a->vmax : &dummy, BT);
        TAKE(a ? &a->vsums : &dummy, 2 * BT);
    }
    if (cls && hd) {
        TAKE(a ? &a->pooled : &dummy, (int64_t)B * C);
        TAKE(a ? &a->dpooled : &dummy, (int64_t)B * C);
        float *p16 = NULL;
        TAKE(a ? &p16 : &dummy, m->bf16 ? words((int64_t)B * C, LOOM_DT_BF16) : 0);
        if (a) a->pooled16 = m->bf16 ? (uint16_t *)p16 : NULL;
    }
    const int bf16_own = m->cfg.arch.qk_norm != LOOM_QK_NORM_NONE || has_post(m);
    if (stacked && m->bf16 && !bf16_own) {
        /* bf16 (no q/k or post-norms: those take the fp32 layout below) shares the fp32
         * gradient scratch between ops whose gradients are never alive together. A layer's
         * backward runs fc_proj (writes dfch_act), the activation (dfch), fc (dln), ln2,
         * attn_proj (datty), attention (dqkv), RoPE, qkv (dln), ln1: so datty shares dln's
         * buffer (dln is dead from ln2's backward to qkv's), dqkv the MLP's (dead after fc's),
         * and GELU's gradient is formed in place over its output's (element-wise). Under
         * sequence parallelism the linears' input gradient is the whole rows' dln_full
         * (reduce-scattered into the shard's dln before the norm's backward): datty shares
         * that one; dres and dln are the shard's rows, dres_full the gathered stream's */
        const int64_t HD = (int64_t)m->H * m->D, nln = BT * (HD > C ? HD : C);
        const int gelu = m->cfg.arch.mlp == LOOM_MLP_GELU;
        const int64_t qkv = slot_floats(m, S_QKV, B, T);
        const int64_t mlp = slot_floats(m, gelu ? S_FCH_ACT : S_FCH, B, T);
        TAKE(a ? &a->dres : &dummy, BTs * C);
        TAKE(a ? &a->dln : &dummy, sp ? BTs * C : nln);
        if (sp) {
            TAKE(a ? &a->dres_full : &dummy, BT * C);
            TAKE(a ? &a->dln_full : &dummy, nln);
        }
        TAKE(a ? &a->dfch : &dummy, qkv > mlp ? qkv : mlp);
        TAKE(a ? &a->dfch_act : &dummy, gelu ? 0 : slot_floats(m, S_FCH_ACT, B, T));
        /* an MoE layer's own gradient scratch (its backward writes dln, reads dres only) */
        for (int k = S_MOE_PROB; k < S_COUNT; k++)
            TAKE(a ? &a->moe_g[k] : &dummy, moe_grad_floats(m, k, BT));
        if (a) {
            if (gelu) a->dfch_act = a->dfch;
            a->dqkv = a->dqkvr = a->dfch;
            a->datty = sp ? a->dln_full : a->dln;
            a->dpost = NULL; /* (no post-norms) */
            a->datt = NULL;  /* (flash) */
        }
    } else if (stacked) {
        TAKE(a ? &a->dres : &dummy, BTs * C);
        TAKE(a ? &a->dln : &dummy, BTs * C);
        if (sp) {
            TAKE(a ? &a->dres_full : &dummy, BT * C);
            TAKE(a ? &a->dln_full : &dummy, BT * C);
        }
        TAKE(a ? &a->dqkv : &dummy, slot_floats(m, S_QKV, B, T));
        TAKE(a ? &a->dqkvr : &dummy, slot_floats(m, S_QKVR, B, T));
        TAKE(a ? &a->dpost : &dummy, slot_floats(m, S_ATTO, B, T));
        TAKE(a ? &a->datty : &dummy, slot_floats(m, S_ATTY, B, T));
        TAKE(a ? &a->dfch : &dummy, slot_floats(m, S_FCH, B, T));
        TAKE(a ? &a->dfch_act : &dummy, slot_floats(m, S_FCH_ACT, B, T));
        TAKE(a ? &a->datt : &dummy,
             m->cfg.attention == LOOM_ATTN_FLASH ? 0 : slot_floats(m, S_ATT, B, T));
        for (int k = S_MOE_PROB; k < S_COUNT; k++)
            TAKE(a ? &a->moe_g[k] : &dummy, moe_grad_floats(m, k, BT));
    }
    if (m->bf16) { /* flash attention's workspace; a training arena's bf16 dout scratch (the
                    * block's linears: the head's dlogits are bf16 in place) */
        float *ws = NULL;
        TAKE(a ? &ws : &dummy, m->be->bf16_flash_ws_floats(B, T, m->H, m->KVH, m->D));
        int64_t oc = m->QKV > C ? m->QKV : C;
        if (m->FFI > oc) oc = m->FFI;
        /* the MoE op's linears: the expert rows (up to ep x k per token), the router, the
         * shared experts */
        const int64_t moe16 = moe_dout16_elems(m, BT);
        /* the fp32 dlogits: vocab-parallel, or soft-capped (model_forward.c head_logits) */
        if ((m->lay.tp > 1 || m->cfg.arch.final_softcap > 0.0f) && hd && m->Vl > oc) oc = m->Vl;
        float *rp = NULL;
        TAKE(a ? &rp : &dummy, m->lay.tp > 1 ? BT * C : 0);
        if (a) a->rowp = m->lay.tp > 1 ? rp : NULL;
        /* fp32 rows of the bf16 ones where an op widens them explicitly (bf16_to_f32): the
         * q|k|v rows the q/k norms read, the embedding rows arch.embed_scale scales */
        int64_t w32 = m->cfg.arch.qk_norm != LOOM_QK_NORM_NONE ? BT * m->QKV : 0;
        if ((m->cfg.arch.embed_scale || cls) && BT * C > w32) w32 = BT * C; /* (cls: lnf) */
        float *x32 = NULL;
        TAKE(a ? &x32 : &dummy, w32);
        if (a) a->x32 = w32 ? x32 : NULL;
        float *d16 = NULL;
        TAKE(a ? &d16 : &dummy,
             stacked ? words(BT * oc > moe16 ? BT * oc : moe16, LOOM_DT_BF16) : 0);
        if (a) {
            a->fws = ws;
            a->dout16 = stacked ? (uint16_t *)d16 : NULL;
        }
    }
    if (m->E > 0) { /* the exchange buffers (inference arenas too: eval under ep) */
        TAKE(a ? &a->moe_t0 : &dummy, moe_exchange_floats(m, BT));
        TAKE(a ? &a->moe_t1 : &dummy, moe_exchange_floats(m, BT));
    }
#undef TAKE
    (void)dummy;
    return at;
}

size_t acts_floats(const loom_model *m, int B, int T, int stacked) {
    return layout_acts(m, NULL, NULL, B, T, stacked);
}

loom_acts *loom_acts_create(const loom_model *m, int B, int T, int for_training) {
    LOOM_CHECK(B > 0 && T > 0 && T <= m->cfg.max_seq_len);
    const loom_backend *be = m->be;
    loom_acts *a = loom_calloc(1, sizeof *a);
    a->be = be;
    a->maxB = B;
    a->maxT = T;
    a->stacked = for_training != 0;
    a->nl = m->lay.l1 - m->lay.l0;
    a->floats = acts_floats(m, B, T, a->stacked);
    a->mem = be->mem_alloc(a->floats * sizeof(float), 0);
    layout_acts(m, a, a->mem, B, T, a->stacked);
    if (!m->lay.sp) { /* one row set: the whole rows are the shard's buffers */
        a->sp_gather = NULL; /* the block aliases its slots itself */
        a->sp_partial = a->encoded;
        a->lnf_full = a->lnf;
        a->dres_full = a->dres;
        a->dln_full = a->dln;
    }
    const size_t BT = (size_t)B * (size_t)T;
    a->inputs = be->mem_alloc(BT * sizeof(int32_t), 0);
    a->targets = be->mem_alloc(BT * sizeof(int32_t), 0);
    a->h_targets = loom_calloc(BT, sizeof(int32_t));
    a->loss_w = be->mem_alloc(BT * sizeof(float), 0);
    a->scalars = be->mem_alloc(8 * sizeof(double), 0);
    if (m->cfg.doc_mask) {
        a->docs = be->mem_alloc(BT * sizeof(int32_t), 0);
        a->h_docs = loom_calloc(BT, sizeof(int32_t));
        a->run_row = loom_calloc(BT, sizeof(int32_t));
        a->run_len = loom_calloc(BT, sizeof(int32_t));
        a->run_pos = loom_calloc(BT, sizeof(int32_t));
        if (m->lay.cp > 1) {
            a->gdocs = be->mem_alloc(BT * (size_t)m->lay.cp * sizeof(int32_t), 0);
            a->h_gdocs = loom_calloc(BT * (size_t)m->lay.cp, sizeof(int32_t));
            a->gdocs_cp = m->lay.cp;
        }
    }
    return a;
}

void loom_acts_free(loom_acts *a) {
    if (!a) return;
    const loom_backend *be = a->be;
    be->mem_free(a->mem);
    be->mem_free(a->inputs);
    be->mem_free(a->targets);
    be->mem_free(a->scalars);
    be->mem_free(a->loss_w);
    be->mem_free(a->docs);
    be->mem_free(a->gdocs);
    free(a->h_targets);
    free(a->h_docs);
    free(a->h_gdocs);
    free(a->run_row);
    free(a->run_len);
    free(a->run_pos);
    free(a);
}

size_t loom_acts_bytes(const loom_acts *a) {
    /* inputs, targets; documents: ids, run rows, lengths, positions (and the whole sequences'
     * ids of a cp view: cp times the rows) */
    const size_t ints = (a->docs ? 6 + (a->gdocs ? (size_t)a->gdocs_cp : 0) : 2) *
                        (size_t)a->maxB * (size_t)a->maxT;
    return a->floats * sizeof(float) + ints * sizeof(int32_t);
}

const float *loom_acts_logits(const loom_acts *a) { return a->logits; }

void acts_frame(const loom_model *m, const loom_acts *a, int l, int B, int T, block_frame *f) {
    memset(f, 0, sizeof *f);
    const int64_t li = l - m->lay.l0;
    for (int k = 1; k < S_COUNT; k++) f->s[k] = a->slot[k] + li * a->stride[k];
    /* the stream entering layer l: the previous layer's output (in an unstacked arena the
     * same buffer: S_RES3 is written only after the block's last read of S_X) */
    f->s[S_X] = l == m->lay.l0 ? a->encoded : a->slot[S_RES3] + (li - 1) * a->stride[S_RES3];
    f->B = B;
    f->T = T;
    if (m->lay.sp) { /* whole-row scratch shared by the layers (else aliases of the shards) */
        f->s[S_LN1G] = f->s[S_LN2G] = a->sp_gather;
        /* (bf16: the row-parallel linears write rowp, reduce-scattered into rowps) */
        f->s[S_RES2P] = f->s[S_RES3P] = m->bf16 ? NULL : a->sp_partial;
        f->rowps = m->bf16 ? a->sp_partial : NULL;
    } else {
        f->s[S_LN1G] = f->s[S_LN2G] = f->s[S_RES2P] = f->s[S_RES3P] = NULL;
    }
    if (a->stacked) {
        f->g[S_X] = f->g[S_RES2] = f->g[S_RES3] = a->dres;
        f->g[S_LN1] = f->g[S_LN2] = a->dln;
        if (m->lay.sp) {
            f->g[S_LN1G] = f->g[S_LN2G] = a->dln_full;
            f->g[S_RES2P] = f->g[S_RES3P] = a->dres_full;
        }
        f->g[S_QKV] = a->dqkv;
        f->g[S_QKVR] = m->cfg.arch.qk_norm ? a->dqkvr : a->dqkv;
        f->g[S_ATTO] = f->g[S_FFO] = a->dpost; /* (aliases of dres without post-norms) */
        f->g[S_ATTY] = a->datty;
        f->g[S_FCH] = a->dfch;
        f->g[S_FCH_ACT] = a->dfch_act;
        f->datt = a->datt;
        for (int k = S_MOE_PROB; k < S_COUNT; k++) f->g[k] = a->moe_g[k];
    }
    f->moe_t0 = a->moe_t0;
    f->moe_t1 = a->moe_t1;
    f->fws = a->fws;
    f->dout16 = a->dout16;
    f->rowp = a->rowp;
    f->x32 = a->x32;
    f->train = a->stacked;
    if (a->n_runs) { /* loom_model_forward_acts checked the shape */
        f->docs = a->docs;
        f->run_row = a->run_row;
        f->run_len = a->run_len;
        f->run_pos = a->run_pos;
        f->gdocs = a->gdocs;
        f->n_runs = a->n_runs;
    }
}

void loom_model_set_docs(loom_model *m, loom_acts *a, const int32_t *docs, int B, int T) {
    if (!a && !m->acts && m->mode == LOOM_MODEL_INFER) /* its arena comes with a forward */
        m->acts = loom_acts_create(m, m->maxB, m->maxT, 0);
    if (!a) a = m->acts;
    LOOM_CHECK(a != NULL);
    a->n_runs = 0;
    if (!docs) return;
    LOOM_CHECK(m->lay.cp <= 1); /* a cp view takes the whole sequences: set_docs_global */
    LOOM_CHECK(m->cfg.doc_mask && a->docs && B > 0 && B <= a->maxB && T > 0 && T <= a->maxT);
    int n = 0;
    for (int64_t b = 0; b < B; b++) {
        int32_t id = -1;
        for (int64_t t = 0; t < T; t++) {
            const int64_t i = b * T + t;
            if (t == 0 || docs[i] != docs[i - 1]) { /* a document starts */
                id++;
                a->run_row[n] = (int32_t)i;
                a->run_len[n] = 0;
                a->run_pos[n] = 0;
                n++;
            }
            a->run_len[n - 1]++;
            a->h_docs[i] = id;
        }
    }
    m->be->mem_h2d(a->docs, a->h_docs, (size_t)B * (size_t)T * sizeof(int32_t));
    a->n_runs = n;
    a->docs_B = B;
    a->docs_T = T;
}

void loom_model_set_docs_global(loom_model *m, loom_acts *a, const int32_t *gdocs, int B,
                                int Tg) {
    if (!a) a = m->acts;
    LOOM_CHECK(a != NULL);
    a->n_runs = 0;
    if (!gdocs) return;
    const int cp = m->lay.cp;
    LOOM_CHECK(cp > 1 && Tg % (2 * cp) == 0);
    const int T = Tg / cp;
    LOOM_CHECK(m->cfg.doc_mask && a->gdocs && B > 0 && B <= a->maxB && T <= a->maxT);
    int start[2], len[2], pos[2];
    const int nc = model_row_runs(m, T, start, len, pos);
    int n = 0;
    for (int64_t b = 0; b < B; b++) {
        /* the whole sequence's ids renumbered from 0 (a new id where the id changes) */
        const int32_t *g = gdocs + b * Tg;
        int32_t *w = a->h_gdocs + b * Tg;
        for (int64_t t = 0; t < Tg; t++) w[t] = t == 0 ? 0 : w[t - 1] + (g[t] != g[t - 1]);
        for (int c = 0; c < nc; c++) {
            /* where the document of the chunk's first position started */
            int64_t doc0 = pos[c];
            while (doc0 > 0 && w[doc0 - 1] == w[pos[c]]) doc0--;
            for (int64_t j = 0; j < len[c]; j++) {
                const int64_t gt = pos[c] + j, i = b * T + start[c] + j;
                if (j == 0 || w[gt] != w[gt - 1]) { /* a run starts: the chunk's or a document's */
                    if (j > 0) doc0 = gt;
                    a->run_row[n] = (int32_t)i;
                    a->run_len[n] = 0;
                    a->run_pos[n] = (int32_t)(gt - doc0);
                    n++;
                }
                a->run_len[n - 1]++;
                a->h_docs[i] = w[gt];
            }
        }
    }
    m->be->mem_h2d(a->docs, a->h_docs, (size_t)B * (size_t)T * sizeof(int32_t));
    m->be->mem_h2d(a->gdocs, a->h_gdocs, (size_t)B * (size_t)Tg * sizeof(int32_t));
    a->n_runs = n;
    a->docs_B = B;
    a->docs_T = T;
}

void loom_acts_poison_layer(const loom_model *m, loom_acts *a, int layer, float value) {
    LOOM_CHECK(a->stacked && layer >= m->lay.l0 && layer < m->lay.l1);
    block_frame f;
    acts_frame(m, a, layer, a->maxB, a->maxT, &f);
    for (int k = 1; k < S_COUNT; k++) { /* S_X is the previous layer's: not this layer's */
        const size_t n = (size_t)slot_floats(m, k, a->maxB, a->maxT);
        /* a host pattern copied in (a test helper: not the step's path), in the slot's dtype */
        const size_t es = loom_dt_size(m->slot_dt[k]);
        void *v = loom_malloc((n ? n : 1) * es);
        for (size_t i = 0; i < n; i++) {
            if (m->slot_dt[k] == LOOM_DT_BF16) ((uint16_t *)v)[i] = loom_bf16_round(value);
            else ((float *)v)[i] = value;
        }
        m->be->mem_h2d(f.s[k], v, n * es);
        free(v);
    }
}
