/* Incremental decoding with a KV cache: one token through the decoder, reading the keys and
 * values of earlier positions from the cache instead of recomputing them. The arithmetic of
 * each op is the training forward's (same kernels, one row), so decoding position p gives the
 * logits a full forward over positions 0..p gives at its last row (tests/unit/test_decode.c). */
#include <stdlib.h>
#include <string.h>

#include "loom/kernels.h"
#include "model/model_internal.h"

struct loom_kv_cache {
    int L, maxT, kv;     /* layers, positions, KVH*D floats per position */
    int len;             /* positions held */
    float *k, *v;        /* (L, maxT, KVH*D) */
    /* one row of scratch */
    float *x, *h, *stat, *qkv, *att, *tmp, *fch, *fact, *logits, *scores;
};

loom_kv_cache *loom_kv_cache_create(const loom_model *m) {
    const loom_model_config *c = &m->cfg;
    LOOM_CHECK(c->head == LOOM_HEAD_LM);
    loom_kv_cache *kc = loom_calloc(1, sizeof *kc);
    kc->L = c->n_layer;
    kc->maxT = c->max_seq_len;
    LOOM_CHECK(m->lay.tp == 1 && m->lay.has_embedding && m->lay.has_head);
    kc->kv = m->KVH * m->D;
    const size_t cache = (size_t)kc->L * (size_t)kc->maxT * (size_t)kc->kv;
    kc->k = loom_alloc_aligned(cache * sizeof(float));
    kc->v = loom_alloc_aligned(cache * sizeof(float));
    const int C = c->d_model, HD = m->H * m->D;
    kc->x = loom_alloc_aligned((size_t)C * sizeof(float));
    kc->h = loom_alloc_aligned((size_t)C * sizeof(float));
    kc->tmp = loom_alloc_aligned((size_t)C * sizeof(float));
    kc->stat = loom_alloc_aligned(2 * sizeof(float));
    kc->qkv = loom_alloc_aligned((size_t)m->QKV * sizeof(float));
    kc->att = loom_alloc_aligned((size_t)HD * sizeof(float));
    kc->fch = loom_alloc_aligned((size_t)m->FFI * sizeof(float));
    kc->fact = loom_alloc_aligned((size_t)m->F * sizeof(float));
    kc->logits = loom_alloc_aligned((size_t)c->vocab_size * sizeof(float));
    kc->scores = loom_alloc_aligned((size_t)m->H * (size_t)kc->maxT * sizeof(float));
    return kc;
}

void loom_kv_cache_free(loom_kv_cache *c) {
    if (!c) return;
    free(c->k);
    free(c->v);
    free(c->x);
    free(c->h);
    free(c->tmp);
    free(c->stat);
    free(c->qkv);
    free(c->att);
    free(c->fch);
    free(c->fact);
    free(c->logits);
    free(c->scores);
    free(c);
}

void loom_kv_cache_reset(loom_kv_cache *c) { c->len = 0; }
int loom_kv_cache_len(const loom_kv_cache *c) { return c->len; }

const float *loom_model_decode(loom_model *m, loom_kv_cache *kc, int32_t token) {
    const loom_model_config *c = &m->cfg;
    const int C = c->d_model, H = m->H, KVH = m->KVH, D = m->D, HD = H * D;
    const int F = m->F, QKV = m->QKV, FFI = m->FFI, V = c->vocab_size;
    const int gpt2 = c->flavor == LOOM_FLAVOR_GPT2, pos = kc->len;
    LOOM_CHECK(c->head == LOOM_HEAD_LM && !m->has_hooks && m->params != NULL);
    LOOM_CHECK(token >= 0 && token < V && pos < kc->maxT);

    embedding_forward(kc->x, &token, PARAM(m, LOOM_P_WTE), PARAM(m, LOOM_P_WPE), 1, 1, C, pos);
    for (int l = 0; l < c->n_layer; l++) {
        float *kl = kc->k + ((size_t)l * kc->maxT + (size_t)pos) * kc->kv;
        float *vl = kc->v + ((size_t)l * kc->maxT + (size_t)pos) * kc->kv;
        model_norm_fwd(m, kc->h, kc->stat, kc->stat + 1, kc->x, LP(m, LOOM_L_LN1_W, l),
                       LP(m, LOOM_L_LN1_B, l), 1);
        matmul_forward(kc->qkv, kc->h, QKV_W(m, l), QKV_B(m, l), 1, C, QKV);
        if (!gpt2) {
            rope_forward(kc->qkv, 1, 1, H, D, QKV, m->rope_cos, m->rope_sin, pos);
            rope_forward(kc->qkv + HD, 1, 1, KVH, D, QKV, m->rope_cos, m->rope_sin, pos);
        }
        memcpy(kl, kc->qkv + HD, (size_t)kc->kv * sizeof(float));
        memcpy(vl, kc->qkv + HD + kc->kv, (size_t)kc->kv * sizeof(float));
        attention_decode(kc->att, kc->qkv, kc->k + (size_t)l * kc->maxT * kc->kv,
                         kc->v + (size_t)l * kc->maxT * kc->kv, pos + 1, H, KVH, D, kc->scores);
        matmul_forward(kc->tmp, kc->att, LP(m, LOOM_L_ATTN_PROJ_W, l), LP(m, LOOM_L_ATTN_PROJ_B, l),
                       1, HD, C);
        residual_forward(kc->x, kc->x, kc->tmp, C);
        model_norm_fwd(m, kc->h, kc->stat, kc->stat + 1, kc->x, LP(m, LOOM_L_LN2_W, l),
                       LP(m, LOOM_L_LN2_B, l), 1);
        matmul_forward(kc->fch, kc->h, FC1_W(m, l), LP(m, LOOM_L_FC_B, l), 1, C, FFI);
        if (gpt2) gelu_forward(kc->fact, kc->fch, F);
        else swiglu_forward(kc->fact, kc->fch, 1, F);
        matmul_forward(kc->tmp, kc->fact, LP(m, LOOM_L_FC_PROJ_W, l), LP(m, LOOM_L_FC_PROJ_B, l),
                       1, F, C);
        residual_forward(kc->x, kc->x, kc->tmp, C);
    }
    model_norm_fwd(m, kc->h, kc->stat, kc->stat + 1, kc->x, PARAM(m, LOOM_P_LNF_W),
                   PARAM(m, LOOM_P_LNF_B), 1);
    matmul_forward(kc->logits, kc->h, gpt2 ? PARAM(m, LOOM_P_WTE) : PARAM(m, LOOM_P_LM_HEAD), NULL,
                   1, C, V);
    kc->len++;
    return kc->logits;
}
