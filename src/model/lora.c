/* LoRA adapters on the block's linears (include/loom/lora.h). The block calls
 * lora_linear_forward after a linear's GEMM (adds scale * (x A^T) B^T into the output columns
 * of each adapted target) and lora_linear_backward after its backward GEMM (the adapters'
 * gradients and their part of the input gradient; x A^T is recomputed, not kept). With
 * adapter dropout on, x is first replaced by its dropped copy (drop_input), drawn again from
 * the counter-based RNG in backward rather than kept. Every buffer here (adapters, gradients,
 * scratch, the dropout mask) is the model's backend's memory (mem_alloc) and every loop over it
 * is one of the backend's LoRA ops (include/loom/backend.h); the host only draws A's init and
 * copies it in (mem_h2d), and reads the adapters back through loom_lora_to_host.
 *
 * training.precision bf16: the block's activations are bf16 and its linears' outputs bf16; the
 * adapters stay fp32 masters (their gradients and moments fp32), with a bf16 copy (pb) that
 * the optimizer step writes (adamw_update_bf16) and a load refreshes. Forward: h = x A^T in
 * bf16 (bf16 x bf16, fp32 accumulation, rounded once, as autocast's lora_A), then h B^T in
 * fp32, added times the scale into the base's bf16 output and rounded once. Backward: the
 * bf16 GEMMs' backward (the fp32 gradient rounded into a bf16 operand, fp32 accumulation into
 * the fp32 dA, dB and the input gradient), as the base linears'. */

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
    const loom_backend *be; /* the model's: every buffer below is its memory */
    float *h, *dh, *tmp; /* scratch (N, r), (N, r), (N, max out or in) */
    int64_t scratch_n;
    /* adapter dropout (loom_lora_set_dropout, loom_lora_dropout_key) */
    float drop;          /* p in [0, 1); 0 = none */
    uint64_t drop_seed, drop_key;
    int drop_on;         /* applies to the next forwards/backwards */
    int off;             /* loom_lora_set_enabled(l, 0): forwards run the base model alone */
    int64_t drop_row0;   /* the global row of the model's first row */
    float *xd, *dxd;     /* scratch (N, max in): the dropped input, its gradient */
    /* training.precision bf16 (the model's m->bf16) */
    uint16_t *pb;        /* (n) the adapters' bf16 copy, written by the optimizer step */
    int pb_stale;        /* pb is not round(params): refreshed before the next forward */
    uint16_t *h16, *d16; /* scratch (N, r): x A^T in bf16; (N, max out or in): a GEMM's bf16
                          * gradient operand */
    uint8_t *keep;       /* scratch (N, max in): 1 where the input element is kept */
    int64_t drop_n;
};

static const char *const NAMES[LOOM_LORA_NT] = {"q", "k", "v", "o", "gate", "up", "down"};

int loom_lora_target_bit(const char *name, int gelu_mlp) {
    if (gelu_mlp) {
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

unsigned loom_lora_target_mask(const char *name, int gelu_mlp) {
    const int b = loom_lora_target_bit(name, gelu_mlp);
    if (b > 0) return (unsigned)b;
    const unsigned qkv = LOOM_LORA_Q | LOOM_LORA_K | LOOM_LORA_V;
    if (!strcmp(name, "all-linear"))
        return qkv | LOOM_LORA_O | LOOM_LORA_GATE | LOOM_LORA_DOWN | (gelu_mlp ? 0 : LOOM_LORA_UP);
    if (gelu_mlp) { /* GPT-2's Conv1D modules */
        if (!strcmp(name, "c_attn")) return qkv;
        if (!strcmp(name, "c_fc")) return LOOM_LORA_GATE;
        if (!strcmp(name, "c_proj")) return LOOM_LORA_O | LOOM_LORA_DOWN;
        return 0;
    }
    static const struct { const char *hf; unsigned mask; } HF[] = {
        {"q_proj", LOOM_LORA_Q},       {"k_proj", LOOM_LORA_K},     {"v_proj", LOOM_LORA_V},
        {"o_proj", LOOM_LORA_O},       {"gate_proj", LOOM_LORA_GATE}, {"up_proj", LOOM_LORA_UP},
        {"down_proj", LOOM_LORA_DOWN}, {"qkv_proj", LOOM_LORA_Q | LOOM_LORA_K | LOOM_LORA_V},
        {"gate_up_proj", LOOM_LORA_GATE | LOOM_LORA_UP},
    };
    for (size_t i = 0; i < sizeof HF / sizeof HF[0]; i++)
        if (!strcmp(name, HF[i].hf)) return HF[i].mask;
    return 0;
}

const char *loom_lora_target_name(int t, int gelu_mlp) {
    if (gelu_mlp && t == 4) return "fc";
    if (gelu_mlp && t == 6) return "fc_proj";
    return NAMES[t];
}

int loom_lora_attach(loom_model *m, int rank, float alpha, unsigned targets, uint64_t seed,
                     loom_lora **out, loom_err *err) {
    const int gpt2 = m->cfg.arch.mlp == LOOM_MLP_GELU; /* fc, fc_proj */
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
    l->be = m->be;
    l->params = l->be->mem_alloc(l->n * sizeof(float), 0); /* zeroed: B starts at 0 */
    l->grads = l->be->mem_alloc(l->n * sizeof(float), 0);
    if (m->bf16) { /* refreshed from the masters before the first forward */
        l->pb = l->be->mem_alloc(l->n * sizeof(uint16_t), 0);
        l->pb_stale = 1;
    }
    l->t = loom_calloc((size_t)m->cfg.n_layer * LOOM_LORA_NT * 2, sizeof *l->t);
    for (int layer = 0; layer < m->cfg.n_layer; layer++)
        for (int t = 0; t < LOOM_LORA_NT; t++) {
            const lora_slot *s = &l->slot[t];
            if (!s->on) continue;
            for (int b = 0; b < 2; b++) {
                loom_lora_tensor *x = &l->t[l->nt++];
                snprintf(x->name, sizeof x->name, "layers.%d.%s.lora_%c", layer,
                         loom_lora_target_name(t, gpt2), b ? 'B' : 'A');
                x->layer = layer;
                x->target = t;
                x->is_b = b;
                x->offset = (size_t)layer * l->layer_floats + (b ? s->b_off : s->a_off);
                x->rows = b ? s->out : rank;
                x->cols = b ? rank : s->in;
            }
        }
    /* init: A uniform in [-1/sqrt(in), 1/sqrt(in)] (kaiming_uniform with a = sqrt(5), PEFT's
     * default), keyed by the tensor's name and the element, drawn on the host and copied in;
     * B zero (mem_alloc zeroed it) */
    for (int i = 0; i < l->nt; i++) {
        const loom_lora_tensor *x = &l->t[i];
        if (x->is_b) continue;
        const size_t n = (size_t)(x->rows * x->cols);
        float *p = loom_malloc(n * sizeof *p);
        const float bound = 1.0f / sqrtf((float)x->cols);
        const uint64_t stream = loom_hash_str(x->name);
        for (size_t k = 0; k < n; k++)
            p[k] = (2.0f * loom_rng_uniform(seed, stream, k) - 1.0f) * bound;
        l->be->mem_h2d(l->params + x->offset, p, n * sizeof *p);
        free(p);
    }
    m->lora = l;
    *out = l;
    return 0;
}

void loom_lora_free(loom_lora *l) {
    if (!l) return;
    if (l->m && l->m->lora == l) l->m->lora = NULL;
    const loom_backend *be = l->be;
    be->mem_free(l->params);
    be->mem_free(l->grads);
    free(l->t);
    be->mem_free(l->h);
    be->mem_free(l->dh);
    be->mem_free(l->tmp);
    be->mem_free(l->xd);
    be->mem_free(l->dxd);
    be->mem_free(l->keep);
    be->mem_free(l->pb);
    be->mem_free(l->h16);
    be->mem_free(l->d16);
    free(l);
}

int loom_lora_rank(const loom_lora *l) { return l->r; }
float loom_lora_alpha(const loom_lora *l) { return l->alpha; }
unsigned loom_lora_targets(const loom_lora *l) { return l->targets; }
size_t loom_lora_num_params(const loom_lora *l) { return l->n; }
float *loom_lora_params(loom_lora *l) { return l->params; }
float *loom_lora_grads(loom_lora *l) { return l->grads; }
void loom_lora_set_enabled(loom_lora *l, int on) { l->off = !on; }
void loom_lora_zero_grad(loom_lora *l) { l->be->mem_set(l->grads, 0, l->n * sizeof(float)); }
const loom_backend *loom_lora_backend(const loom_lora *l) { return l->be; }

float *loom_lora_to_host(const loom_lora *l, const float *dev) {
    float *h = loom_malloc(l->n * sizeof *h);
    loom_dev_read(l->be, h, dev, l->n * sizeof *h, "lora adapters");
    return h;
}

void loom_lora_upload(loom_lora *l, float *dev, const float *host) {
    l->be->mem_h2d(dev, host, l->n * sizeof *host);
    if (dev == l->params && l->pb) l->pb_stale = 1;
}

uint16_t *loom_lora_bf16_params(loom_lora *l) { return l->pb; }
int loom_lora_num_tensors(const loom_lora *l) { return l->nt; }
const loom_lora_tensor *loom_lora_tensor_at(const loom_lora *l, int i) { return &l->t[i]; }

static void scratch(loom_lora *l, int64_t N) {
    if (N <= l->scratch_n) return; /* grows once to the largest batch of rows, then reused */
    int64_t w = l->m->cfg.d_model;
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        if (l->slot[t].out > w) w = l->slot[t].out;
        if (l->slot[t].in > w) w = l->slot[t].in;
    }
    const loom_backend *be = l->be;
    be->mem_free(l->h);
    be->mem_free(l->dh);
    be->mem_free(l->tmp);
    l->h = be->mem_alloc((size_t)N * (size_t)l->r * sizeof(float), 0);
    l->dh = be->mem_alloc((size_t)N * (size_t)l->r * sizeof(float), 0);
    l->tmp = be->mem_alloc((size_t)N * (size_t)w * sizeof(float), 0);
    if (l->pb) {
        be->mem_free(l->h16);
        be->mem_free(l->d16);
        l->h16 = be->mem_alloc((size_t)N * (size_t)l->r * sizeof(uint16_t), 0);
        l->d16 = be->mem_alloc((size_t)N * (size_t)w * sizeof(uint16_t), 0);
    }
    l->scratch_n = N;
}

int loom_lora_set_dropout(loom_lora *l, float p, uint64_t seed, loom_err *err) {
    if (!(p >= 0.0f && p < 1.0f))
        return loom_errf(err, "finetune.lora.dropout = %g: expected 0 <= p < 1", (double)p);
    if (p > 0 && l->m->bf16)
        return loom_errf(err, "finetune.lora.dropout = %g with training.precision = bf16: not "
                              "supported (adapter dropout is fp32 only); use dropout 0 or "
                              "training.precision = fp32", (double)p);
    if (p > 0 && l->m->cfg.n_layer > LOOM_LORA_DROP_MAX_LAYERS)
        return loom_errf(err, "finetune.lora.dropout with %d layers: at most %d are supported",
                         l->m->cfg.n_layer, LOOM_LORA_DROP_MAX_LAYERS);
    l->drop = p;
    l->drop_seed = seed;
    l->drop_on = 0;
    return 0;
}

float loom_lora_dropout(const loom_lora *l) { return l->drop; }

void loom_lora_dropout_key(loom_lora *l, int on, uint64_t key, int64_t row0) {
    l->drop_on = on && l->drop > 0;
    l->drop_key = key;
    l->drop_row0 = row0;
}

static int dropping(const loom_lora *l, const block_frame *f) {
    return l->drop_on && f->train && !f->seg && !f->kcache;
}

/* xd = the adapter input of (layer, target t) after dropout: x * keep / (1 - p), keep (also in
 * l->keep) when the element's uniform draw is >= p (docs/finetune.md, "Adapter dropout", gives
 * the keying) */
static void drop_input(loom_lora *l, const loom_model *m, const block_frame *f, int layer,
                       int t, const float *x, int64_t in) {
    const int64_t N = (int64_t)f->B * f->T;
    if (N > l->drop_n) { /* grows once to the largest batch of rows, then reused */
        int64_t w = 0;
        for (int k = 0; k < LOOM_LORA_NT; k++)
            if (l->slot[k].in > w) w = l->slot[k].in;
        const loom_backend *be = l->be;
        be->mem_free(l->xd);
        be->mem_free(l->dxd);
        be->mem_free(l->keep);
        l->xd = be->mem_alloc((size_t)N * (size_t)w * sizeof(float), 0);
        l->dxd = be->mem_alloc((size_t)N * (size_t)w * sizeof(float), 0);
        l->keep = be->mem_alloc((size_t)N * (size_t)w, 0);
        l->drop_n = N;
    }
    const uint64_t stream = (l->drop_key << 16) | ((uint64_t)layer << 3) | (uint64_t)t;
    const uint64_t key = loom_rng_key(l->drop_seed, stream);
    const int64_t Tg = (int64_t)f->T * m->lay.cp; /* the whole sequence's length */
    /* the rows' global positions: one run (positions 0..T-1), or context parallelism's two
     * load-balanced chunks (loom_model_row_position) */
    const int split = f->T / (m->lay.cp > 1 ? 2 : 1);
    const int64_t pos0 = loom_model_row_position(m, f->T, 0);
    const int64_t pos1 = split < f->T ? loom_model_row_position(m, f->T, split) : 0;
    l->be->lora_dropout_forward(l->xd, l->keep, x, N, in, f->T, split, pos0, pos1, l->drop_row0,
                                Tg, key, l->drop);
}

/* training.precision bf16: the bf16 copy of the masters, refreshed where a load changed them */
static void refresh_bf16(loom_lora *l) {
    if (!l->pb_stale) return;
    l->be->bf16_from_f32(l->pb, l->params, (int64_t)l->n);
    l->pb_stale = 0;
}

/* the bf16 forward (out, x: the block's bf16 slots; no dropout: set_dropout refuses it) */
static void forward_bf16(loom_lora *l, int64_t N, int layer, int site, uint16_t *out,
                         const uint16_t *x, int64_t ow) {
    const loom_backend *be = l->be;
    refresh_bf16(l);
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        const lora_slot *s = &l->slot[t];
        if (!s->on || s->site != site) continue;
        scratch(l, N);
        const size_t base = (size_t)layer * l->layer_floats;
        const uint16_t *A = l->pb + base + s->a_off, *B = l->pb + base + s->b_off;
        be->bf16_matmul_forward(l->h16, x, A, NULL, N, (int)s->in, l->r); /* h = x A^T, bf16 */
        be->bf16_matmul_forward_f32(l->tmp, l->h16, B, NULL, N, l->r, (int)s->out); /* h B^T */
        be->lora_add_scaled_bf16(out + s->col0, ow, l->tmp, s->out, s->out, N, l->scale);
    }
}

/* the bf16 backward: dout, din fp32, x the bf16 slot */
static void backward_bf16(loom_lora *l, int64_t N, int layer, int site, float *din,
                          const float *dout, const uint16_t *x, int64_t ow) {
    const loom_backend *be = l->be;
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        const lora_slot *s = &l->slot[t];
        if (!s->on || s->site != site) continue;
        scratch(l, N);
        const size_t base = (size_t)layer * l->layer_floats;
        const uint16_t *A = l->pb + base + s->a_off, *B = l->pb + base + s->b_off;
        float *dA = l->grads + base + s->a_off, *dB = l->grads + base + s->b_off;
        /* dy = scale * dout's columns of the target (fp32) */
        be->lora_scale_rows(l->tmp, dout + s->col0, ow, s->out, N, l->scale);
        be->bf16_matmul_forward(l->h16, x, A, NULL, N, (int)s->in, l->r); /* h, recomputed */
        /* dh = dy B (set), dB += dy^T h: dy rounded into the bf16 operand d16 */
        be->bf16_matmul_backward(l->dh, 1, dB, NULL, l->tmp, l->d16, l->h16, B, N, l->r,
                                 (int)s->out);
        /* dx += dh A, dA += dh^T x */
        be->bf16_matmul_backward(din, 0, dA, NULL, l->dh, l->d16, x, A, N, (int)s->in, l->r);
    }
}

void lora_linear_forward(loom_model *m, const block_frame *f, int layer, int site, void *out_,
                         const void *x_, int64_t ow) {
    loom_lora *l = m->lora;
    if (l->off) return; /* the base model alone (a preference method's reference) */
    const loom_backend *be = m->be;
    const int64_t N = (int64_t)f->B * f->T;
    if (m->bf16) {
        forward_bf16(l, N, layer, site, out_, x_, ow);
        return;
    }
    float *out = out_;
    const float *x = x_;
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        const lora_slot *s = &l->slot[t];
        if (!s->on || s->site != site) continue;
        scratch(l, N);
        const float *in = x;
        if (dropping(l, f)) {
            drop_input(l, m, f, layer, t, x, s->in);
            in = l->xd;
        }
        const float *A = l->params + (size_t)layer * l->layer_floats + s->a_off;
        const float *B = l->params + (size_t)layer * l->layer_floats + s->b_off;
        be->matmul_forward(l->h, in, A, NULL, N, (int)s->in, l->r);        /* h = x A^T  (N, r) */
        be->matmul_forward(l->tmp, l->h, B, NULL, N, l->r, (int)s->out);   /* h B^T      (N, out) */
        be->lora_add_scaled(out + s->col0, ow, l->tmp, s->out, s->out, N, l->scale);
    }
}

void lora_linear_backward(loom_model *m, const block_frame *f, int layer, int site, float *din,
                          const float *dout, const void *x_, int64_t ow) {
    loom_lora *l = m->lora;
    const loom_backend *be = m->be;
    const int64_t N = (int64_t)f->B * f->T;
    if (m->bf16) {
        backward_bf16(l, N, layer, site, din, dout, x_, ow);
        return;
    }
    const float *x = x_;
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        const lora_slot *s = &l->slot[t];
        if (!s->on || s->site != site) continue;
        scratch(l, N);
        const int drop = dropping(l, f);
        const float *in = x;
        if (drop) { /* the forward's dropped input, drawn again */
            drop_input(l, m, f, layer, t, x, s->in);
            in = l->xd;
        }
        const size_t base = (size_t)layer * l->layer_floats;
        const float *A = l->params + base + s->a_off, *B = l->params + base + s->b_off;
        float *dA = l->grads + base + s->a_off, *dB = l->grads + base + s->b_off;
        /* dy = scale * dout's columns of the target */
        be->lora_scale_rows(l->tmp, dout + s->col0, ow, s->out, N, l->scale);
        be->matmul_forward(l->h, in, A, NULL, N, (int)s->in, l->r); /* h = x A^T, recomputed */
        be->matmul_backward(NULL, dB, NULL, l->tmp, l->h, B, N, l->r, (int)s->out); /* dB += dy^T h */
        be->mem_set(l->dh, 0, (size_t)N * (size_t)l->r * sizeof(float));
        be->matmul_backward(l->dh, NULL, NULL, l->tmp, l->h, B, N, l->r, (int)s->out); /* dh = dy B */
        if (!drop) {
            /* dA += dh^T x, dx += dh A */
            be->matmul_backward(din, dA, NULL, l->dh, in, A, N, (int)s->in, l->r);
            continue;
        }
        /* dA += dh^T xd; dxd = dh A, and dx += dxd where kept, scaled as in forward */
        be->mem_set(l->dxd, 0, (size_t)N * (size_t)s->in * sizeof(float));
        be->matmul_backward(l->dxd, dA, NULL, l->dh, in, A, N, (int)s->in, l->r);
        be->lora_dropout_backward(din, l->dxd, l->keep, N * s->in, l->drop);
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
            l->be->lora_merge(base + ti->offset, A, B, s->out, s->in, l->r, l->scale);
        }
}
