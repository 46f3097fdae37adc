/* LoRA adapters on the block's linears (include/loom/lora.h). The block calls
 * lora_linear_forward after a linear's GEMM (adds scale * (x A^T) B^T into the output columns
 * of each adapted target) and lora_linear_backward after its backward GEMM (the adapters'
 * gradients and their part of the input gradient; x A^T is recomputed, not kept). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/lora.h"
#include "model/model_internal.h"

typedef struct lora_slot {
    int on;
    int site;         /* LORA_SITE_* : which linear of the block */
    int64_t col0;     /* first output column of the target in that linear's output */
    int64_t in, out;  /* widths */
    int kind;         /* the base tensor (LOOM_L_*) it adapts */
    size_t a_off, b_off; /* per layer l: + l * layer_floats */
} lora_slot;

struct loom_lora {
    loom_model *m;
    int r;
    float alpha, scale;
    unsigned targets;
    lora_slot slot[LOOM_LORA_NT];
    size_t layer_floats, n;
    float *params, *grads;
    loom_lora_tensor *t;
    int nt;
    float *h, *dh, *tmp; /* scratch (N, r), (N, r), (N, max out or in) */
    int64_t scratch_n;
};

static const char *const NAMES[LOOM_LORA_NT] = {"q", "k", "v", "o", "gate", "up", "down"};

int loom_lora_target_bit(const char *name, int flavor) {
    if (flavor == LOOM_FLAVOR_GPT2) {
        if (!strcmp(name, "fc")) return LOOM_LORA_GATE;
        if (!strcmp(name, "fc_proj")) return LOOM_LORA_DOWN;
        if (!strcmp(name, "gate") || !strcmp(name, "up") || !strcmp(name, "down")) return -1;
    } else if (!strcmp(name, "fc") || !strcmp(name, "fc_proj")) {
        return -1;
    }
    for (int i = 0; i < LOOM_LORA_NT; i++)
        if (!strcmp(name, NAMES[i])) return 1 << i;
    return -1;
}

const char *loom_lora_target_name(int t, int flavor) {
    if (flavor == LOOM_FLAVOR_GPT2 && t == 4) return "fc";
    if (flavor == LOOM_FLAVOR_GPT2 && t == 6) return "fc_proj";
    return NAMES[t];
}

int loom_lora_attach(loom_model *m, int rank, float alpha, unsigned targets, uint64_t seed,
                     loom_lora **out, loom_err *err) {
    const int gpt2 = m->cfg.flavor == LOOM_FLAVOR_GPT2;
    if (rank < 1 || rank > 4096) return loom_errf(err, "finetune.lora.rank = %d: expected 1..4096", rank);
    if (!(alpha > 0)) return loom_errf(err, "finetune.lora.alpha must be positive");
    if (!targets) return loom_errf(err, "finetune.lora.targets is empty");
    if (gpt2 && (targets & LOOM_LORA_UP))
        return loom_errf(err, "finetune.lora.targets: gpt2 has no 'up' (its MLP is fc, fc_proj)");
    if (m->lay.tp > 1 || m->lay.l0 != 0 || m->lay.l1 != m->cfg.n_layer)
        return loom_errf(err, "LoRA needs the whole model on each rank (tensor and pipeline "
                              "parallelism with LoRA are not supported; use data parallelism)");
    if (m->E > 0 && (targets & (LOOM_LORA_GATE | LOOM_LORA_UP | LOOM_LORA_DOWN)))
        return loom_errf(err, "LoRA on the MLP of a mixture-of-experts model is not supported");
    if (m->lora) return loom_errf(err, "the model already has LoRA adapters");
    loom_lora *l = loom_calloc(1, sizeof *l);
    l->m = m;
    l->r = rank;
    l->alpha = alpha;
    l->scale = alpha / (float)rank;
    l->targets = targets;
    const int64_t C = m->cfg.d_model, HD = (int64_t)m->H * m->D, KD = (int64_t)m->KVH * m->D;
    const int64_t F = m->F;
    const lora_slot spec[LOOM_LORA_NT] = {
        {0, 0, 0, C, HD, LOOM_L_Q_W, 0, 0},
        {0, 0, HD, C, KD, LOOM_L_K_W, 0, 0},
        {0, 0, HD + KD, C, KD, LOOM_L_V_W, 0, 0},
        {0, 1, 0, HD, C, LOOM_L_ATTN_PROJ_W, 0, 0},
        {0, 2, 0, C, F, gpt2 ? LOOM_L_FC_W : LOOM_L_GATE_W, 0, 0},
        {0, 2, F, C, F, LOOM_L_UP_W, 0, 0},
        {0, 3, 0, F, C, LOOM_L_FC_PROJ_W, 0, 0},
    };
    size_t off = 0;
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        l->slot[t] = spec[t];
        if (!(targets & (1u << t))) continue;
        l->slot[t].on = 1;
        l->slot[t].a_off = off;
        off += (size_t)rank * (size_t)spec[t].in;
        l->slot[t].b_off = off;
        off += (size_t)spec[t].out * (size_t)rank;
    }
    l->layer_floats = off;
    l->n = off * (size_t)m->cfg.n_layer;
    l->params = loom_alloc_aligned(l->n * sizeof(float));
    l->grads = loom_alloc_aligned(l->n * sizeof(float));
    l->t = loom_calloc((size_t)m->cfg.n_layer * LOOM_LORA_NT * 2, sizeof *l->t);
    for (int layer = 0; layer < m->cfg.n_layer; layer++)
        for (int t = 0; t < LOOM_LORA_NT; t++) {
            const lora_slot *s = &l->slot[t];
            if (!s->on) continue;
            for (int b = 0; b < 2; b++) {
                loom_lora_tensor *x = &l->t[l->nt++];
                snprintf(x->name, sizeof x->name, "layers.%d.%s.lora_%c", layer,
                         loom_lora_target_name(t, m->cfg.flavor), b ? 'B' : 'A');
                x->layer = layer;
                x->target = t;
                x->is_b = b;
                x->offset = (size_t)layer * l->layer_floats + (b ? s->b_off : s->a_off);
                x->rows = b ? s->out : rank;
                x->cols = b ? rank : s->in;
            }
        }
    /* init: A uniform in [-1/sqrt(in), 1/sqrt(in)] (kaiming_uniform with a = sqrt(5), PEFT's
     * default), keyed by the tensor's name and the element; B zero */
    for (int i = 0; i < l->nt; i++) {
        const loom_lora_tensor *x = &l->t[i];
        float *p = l->params + x->offset;
        const size_t n = (size_t)(x->rows * x->cols);
        if (x->is_b) {
            memset(p, 0, n * sizeof *p);
            continue;
        }
        const float bound = 1.0f / sqrtf((float)x->cols);
        const uint64_t stream = loom_hash_str(x->name);
        for (size_t k = 0; k < n; k++)
            p[k] = (2.0f * loom_rng_uniform(seed, stream, k) - 1.0f) * bound;
    }
    memset(l->grads, 0, l->n * sizeof(float));
    m->lora = l;
    *out = l;
    return 0;
}

void loom_lora_free(loom_lora *l) {
    if (!l) return;
    if (l->m && l->m->lora == l) l->m->lora = NULL;
    free(l->params);
    free(l->grads);
    free(l->t);
    free(l->h);
    free(l->dh);
    free(l->tmp);
    free(l);
}

int loom_lora_rank(const loom_lora *l) { return l->r; }
float loom_lora_alpha(const loom_lora *l) { return l->alpha; }
unsigned loom_lora_targets(const loom_lora *l) { return l->targets; }
size_t loom_lora_num_params(const loom_lora *l) { return l->n; }
float *loom_lora_params(loom_lora *l) { return l->params; }
float *loom_lora_grads(loom_lora *l) { return l->grads; }
void loom_lora_zero_grad(loom_lora *l) { memset(l->grads, 0, l->n * sizeof(float)); }
int loom_lora_num_tensors(const loom_lora *l) { return l->nt; }
const loom_lora_tensor *loom_lora_tensor_at(const loom_lora *l, int i) { return &l->t[i]; }

static void scratch(loom_lora *l, int64_t N) {
    if (N <= l->scratch_n) return; /* grows once to the largest batch of rows, then reused */
    int64_t w = l->m->cfg.d_model;
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        if (l->slot[t].out > w) w = l->slot[t].out;
        if (l->slot[t].in > w) w = l->slot[t].in;
    }
    free(l->h);
    free(l->dh);
    free(l->tmp);
    l->h = loom_alloc_aligned((size_t)N * (size_t)l->r * sizeof(float));
    l->dh = loom_alloc_aligned((size_t)N * (size_t)l->r * sizeof(float));
    l->tmp = loom_alloc_aligned((size_t)N * (size_t)w * sizeof(float));
    l->scratch_n = N;
}

void lora_linear_forward(loom_model *m, int layer, int site, float *out, const float *in,
                         int64_t N, int64_t ow) {
    loom_lora *l = m->lora;
    const loom_backend *be = m->be;
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        const lora_slot *s = &l->slot[t];
        if (!s->on || s->site != site) continue;
        scratch(l, N);
        const float *A = l->params + (size_t)layer * l->layer_floats + s->a_off;
        const float *B = l->params + (size_t)layer * l->layer_floats + s->b_off;
        be->matmul_forward(l->h, in, A, NULL, N, (int)s->in, l->r);        /* h = x A^T  (N, r) */
        be->matmul_forward(l->tmp, l->h, B, NULL, N, l->r, (int)s->out);   /* h B^T      (N, out) */
        for (int64_t i = 0; i < N; i++) {
            float *o = out + i * ow + s->col0;
            const float *d = l->tmp + i * s->out;
            for (int64_t j = 0; j < s->out; j++) o[j] += l->scale * d[j];
        }
    }
}

void lora_linear_backward(loom_model *m, int layer, int site, float *din, const float *dout,
                          const float *in, int64_t N, int64_t ow) {
    loom_lora *l = m->lora;
    const loom_backend *be = m->be;
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        const lora_slot *s = &l->slot[t];
        if (!s->on || s->site != site) continue;
        scratch(l, N);
        const size_t base = (size_t)layer * l->layer_floats;
        const float *A = l->params + base + s->a_off, *B = l->params + base + s->b_off;
        float *dA = l->grads + base + s->a_off, *dB = l->grads + base + s->b_off;
        for (int64_t i = 0; i < N; i++) { /* dy = scale * dout's columns of the target */
            const float *g = dout + i * ow + s->col0;
            float *d = l->tmp + i * s->out;
            for (int64_t j = 0; j < s->out; j++) d[j] = l->scale * g[j];
        }
        be->matmul_forward(l->h, in, A, NULL, N, (int)s->in, l->r); /* h = x A^T, recomputed */
        be->matmul_backward(NULL, dB, NULL, l->tmp, l->h, B, N, l->r, (int)s->out); /* dB += dy^T h */
        memset(l->dh, 0, (size_t)N * (size_t)l->r * sizeof(float));
        be->matmul_backward(l->dh, NULL, NULL, l->tmp, l->h, B, N, l->r, (int)s->out); /* dh = dy B */
        be->matmul_backward(din, dA, NULL, l->dh, in, A, N, (int)s->in, l->r); /* dA += dh^T x, dx += dh A */
    }
}

void loom_lora_merge(const loom_lora *l, const loom_model *m, float *base) {
    for (int layer = 0; layer < m->cfg.n_layer; layer++)
        for (int t = 0; t < LOOM_LORA_NT; t++) {
            const lora_slot *s = &l->slot[t];
            if (!s->on) continue;
            const loom_tensor_info *ti = loom_model_layer_tensor(m, layer, s->kind);
            LOOM_CHECK(ti && ti->shape[0] == s->out && ti->shape[1] == s->in);
            const float *A = l->params + (size_t)layer * l->layer_floats + s->a_off;
            const float *B = l->params + (size_t)layer * l->layer_floats + s->b_off;
            float *W = base + ti->offset;
            for (int64_t o = 0; o < s->out; o++)
                for (int64_t i = 0; i < s->in; i++) {
                    double acc = 0;
                    for (int k = 0; k < l->r; k++) acc += (double)B[o * l->r + k] * A[(int64_t)k * s->in + i];
                    W[o * s->in + i] += l->scale * (float)acc;
                }
        }
}
