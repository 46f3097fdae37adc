/* Incremental decoding with a KV cache: one token through the decoder, reading the keys and
 * values of earlier positions from the cache instead of recomputing them. Each layer walks the
 * same block definition as training (src/model/block.c) over one row, its attention op
 * appending to and reading the cache, so decoding position p gives the logits a full forward
 * over positions 0..p gives at its last row (tests/unit/test_decode.c). */
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "model/model_internal.h"

struct loom_kv_cache {
    const loom_backend *be; /* every buffer below but hlogits is its device memory */
    int L, maxT, kv;     /* layers, positions, KVH*D floats per position */
    int len;             /* positions held */
    size_t floats;       /* of each of k, v: loom_model_kv_floats(m, maxT) */
    float *k, *v;        /* every layer's rows (model_kv_layer_off; a sliding layer a ring) */
    /* one row of scratch */
    float *x, *h, *stat, *qkv, *att, *tmp, *fch, *fact, *logits, *scores;
    float *qkst;         /* the q/k norms' row statistics (per head: H + KVH; whole: 4) */
    float *res[3];       /* the residual stream: layer input, after attention, layer output */
    float *moe;          /* one row of the MoE slots (an MoE model) */
    float *moe_slot[S_COUNT];
    int32_t *tok;        /* (1) the token being decoded, copied in */
    float *hlogits;      /* (V) host: the logits read back for the caller */
};

loom_kv_cache *loom_kv_cache_create(const loom_model *m) {
    const loom_model_config *c = &m->cfg;
    LOOM_CHECK(c->head == LOOM_HEAD_LM);
    loom_kv_cache *kc = loom_calloc(1, sizeof *kc);
    const loom_backend *be = kc->be = m->be;
    kc->L = c->n_layer;
    kc->maxT = c->max_seq_len;
    LOOM_CHECK(m->lay.tp == 1 && m->lay.has_embedding && m->lay.has_head);
    kc->kv = m->KVH * m->D;
    kc->floats = loom_model_kv_floats(m, kc->maxT);
    kc->k = be->mem_alloc(kc->floats * sizeof(float), 0);
    kc->v = be->mem_alloc(kc->floats * sizeof(float), 0);
    const int C = c->d_model, HD = m->H * m->D;
    kc->x = be->mem_alloc((size_t)C * sizeof(float), 0);
    kc->h = be->mem_alloc((size_t)C * sizeof(float), 0);
    kc->tmp = be->mem_alloc((size_t)C * sizeof(float), 0);
    kc->res[0] = kc->x;
    kc->res[1] = kc->tmp;
    kc->res[2] = be->mem_alloc((size_t)C * sizeof(float), 0);
    kc->stat = be->mem_alloc(2 * sizeof(float), 0);
    kc->qkst = be->mem_alloc((size_t)(m->H + m->KVH + 4) * sizeof(float), 0);
    kc->qkv = be->mem_alloc((size_t)m->QKV * sizeof(float), 0);
    kc->att = be->mem_alloc((size_t)HD * sizeof(float), 0);
    kc->fch = be->mem_alloc((size_t)m->FFI * sizeof(float), 0);
    kc->fact = be->mem_alloc((size_t)m->F * sizeof(float), 0);
    kc->logits = be->mem_alloc((size_t)c->vocab_size * sizeof(float), 0);
    kc->scores = be->mem_alloc((size_t)m->H * (size_t)kc->maxT * sizeof(float), 0);
    kc->tok = be->mem_alloc(sizeof(int32_t), 0);
    kc->hlogits = loom_malloc((size_t)c->vocab_size * sizeof(float));
    if (m->E > 0) { /* the MoE op's slots for one row (decoding routes dropless) */
        LOOM_CHECK(m->ep == 1);
        size_t n = 0;
        for (int k = S_MOE_PROB; k < S_COUNT; k++) n += ((size_t)moe_slot_floats(m, k, 1) + 15) & ~(size_t)15;
        kc->moe = be->mem_alloc(n * sizeof(float), 0);
        n = 0;
        for (int k = S_MOE_PROB; k < S_COUNT; k++) {
            kc->moe_slot[k] = kc->moe + n;
            n += ((size_t)moe_slot_floats(m, k, 1) + 15) & ~(size_t)15;
        }
    }
    return kc;
}

void loom_kv_cache_free(loom_kv_cache *c) {
    if (!c) return;
    const loom_backend *be = c->be;
    be->mem_free(c->k);
    be->mem_free(c->v);
    be->mem_free(c->x);
    be->mem_free(c->h);
    be->mem_free(c->tmp);
    be->mem_free(c->res[2]);
    be->mem_free(c->stat);
    be->mem_free(c->qkst);
    be->mem_free(c->qkv);
    be->mem_free(c->att);
    be->mem_free(c->fch);
    be->mem_free(c->fact);
    be->mem_free(c->logits);
    be->mem_free(c->scores);
    be->mem_free(c->moe);
    be->mem_free(c->tok);
    free(c->hlogits);
    free(c);
}

void loom_kv_cache_reset(loom_kv_cache *c) { c->len = 0; }
int loom_kv_cache_len(const loom_kv_cache *c) { return c->len; }
size_t loom_kv_cache_bytes(const loom_kv_cache *c) { return 2 * c->floats * sizeof(float); }

const float *loom_model_decode(loom_model *m, loom_kv_cache *kc, int32_t token) {
    LOOM_CHECK(m->wmat == NULL); /* inference weights: the batched decode only */
    const loom_model_config *c = &m->cfg;
    const int C = c->d_model, V = c->vocab_size;
    const int pos = kc->len;
    LOOM_CHECK(c->head == LOOM_HEAD_LM);
    model_decode_bind(m); /* its own arenas, or resident hooks (a model being trained) */
    LOOM_CHECK(token >= 0 && token < V && pos < kc->maxT);

    m->be->mem_h2d(kc->tok, &token, sizeof token);
    model_embed_rows(m, 0, kc->res[0], kc->tok, 1, 1, pos); /* (tp = 1: the plain kernel) */
    block_frame f;
    memset(&f, 0, sizeof f);
    f.B = f.T = 1;
    f.pos0 = pos;
    f.scores = kc->scores;
    f.s[S_LN1] = f.s[S_LN2] = kc->h; /* ln1 is dead once q|k|v is computed */
    /* post-norms' inputs: attn_proj's and fc_proj's outputs, written after ln1 / ln2 are dead */
    f.s[S_ATTO] = f.s[S_FFO] = kc->h;
    f.s[S_LN1_MEAN] = f.s[S_LN2_MEAN] = kc->stat;
    f.s[S_LN1_RSTD] = f.s[S_LN2_RSTD] = f.s[S_PN1_RSTD] = f.s[S_PN2_RSTD] = kc->stat + 1;
    f.s[S_QKN_RSTD] = kc->qkst;
    f.s[S_QKV] = kc->qkv;
    f.s[S_ATTY] = kc->att;
    f.s[S_FCH] = kc->fch;
    f.s[S_FCH_ACT] = kc->fact;
    for (int k = S_MOE_PROB; k < S_COUNT; k++) f.s[k] = kc->moe_slot[k];
    int x = 0; /* which of the three stream buffers holds the layer's input */
    for (int l = 0; l < c->n_layer; l++) {
        f.s[S_X] = kc->res[x];
        f.s[S_RES2] = kc->res[(x + 1) % 3];
        f.s[S_RES3] = kc->res[(x + 2) % 3];
        f.kcache = kc->k + model_kv_layer_off(m, l, kc->maxT);
        f.vcache = kc->v + model_kv_layer_off(m, l, kc->maxT);
        f.kcap = kc->maxT;
        block_forward(m, &f, l);
        x = (x + 2) % 3;
    }
    model_norm_fwd(m, kc->h, kc->stat, kc->stat + 1, kc->res[x], PARAM(m, LOOM_P_LNF_W),
                   PARAM(m, LOOM_P_LNF_B), 1);
    m->be->matmul_forward(kc->logits, kc->h, HEAD_W(m), NULL, 1, C, V);
    model_softcap(m, kc->logits, V);
    kc->len++;
    loom_dev_read(m->be, kc->hlogits, kc->logits, (size_t)V * sizeof(float), "decode logits");
    return kc->hlogits;
}
