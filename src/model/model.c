/* loom model: the config checks, the parameter layout (llm.c's pattern: one arena per tensor
 * group, a table of sizes, typed views into it), creation of a model or a view, the accessors
 * and the init. The forward and backward are model_forward.c. */
#include "loom/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/lora.h"
#include "model/model_internal.h"



static const char *const global_names[LOOM_P_COUNT] = {"wte", "wpe", "lnf_w", "lnf_b",
                                                        "lm_head", "cls_w", "cls_b"};
static const char *const layer_names[LOOM_L_COUNT] = {
    "ln1_w", "ln1_b", "q_w",  "k_w",  "v_w",   "q_b",  "k_b",   "v_b",       "attn_proj_w",
    "attn_proj_b", "ln2_w", "ln2_b", "fc_w", "gate_w", "up_w", "fc_b", "fc_proj_w", "fc_proj_b",
    "moe_router_w", "moe_shared_fc_w", "moe_shared_fc_b", "moe_shared_proj_w",
    "moe_shared_proj_b", "moe_fc_w", "moe_fc_b", "moe_proj_w", "moe_proj_b", "q_norm_w",
    "k_norm_w", "moe_shared_gate_w", "attn_post_w", "ffn_post_w"};

/* Part r of n elements split over p: the first n % p parts get one more. */
static void split_range(int64_t n, int p, int r, int64_t *off, int64_t *len) {
    const int64_t q = n / p, rem = n % p;
    *len = q + (r < rem);
    *off = r * q + (r < rem ? r : rem);
}

/* Appends a tensor to the table (when present) and returns its index, or -1. split_dim >= 0:
 * that dimension is split over the tp group (this view holds its tp_rank-th part). */
static int add_tensor(loom_model *m, size_t *off, int layer, int kind, int present, int decay,
                      int ndim, int64_t d0, int64_t d1, int split_dim) {
    if (!present) return -1;
    loom_tensor_info *t = &m->info[m->n_info];
    memset(t, 0, sizeof *t);
    LOOM_CHECK(kind >= 0 && kind < (layer < 0 ? LOOM_P_COUNT : LOOM_L_COUNT));
    if (layer < 0) snprintf(t->name, sizeof t->name, "%s", kind < LOOM_P_COUNT ? global_names[kind] : "?");
    else snprintf(t->name, sizeof t->name, "layers.%d.%s", layer, layer_names[kind]);
    t->layer = layer;
    t->kind = kind;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->decay = decay;
    t->split_dim = split_dim;
    t->split_group = split_dim >= 0 ? LOOM_SPLIT_TP : LOOM_SPLIT_NONE;
    t->reduce_group = LOOM_REDUCE_DP;
    t->numel = 1;
    /* grouped-query attention with fewer kv heads than tp ranks: k and v split over n_kv_head
     * parts, part j held by tp ranks [j·rep, (j+1)·rep) (their query heads all read kv head j) */
    const int kv = layer >= 0 && (kind == LOOM_L_K_W || kind == LOOM_L_V_W ||
                                  kind == LOOM_L_K_B || kind == LOOM_L_V_B);
    t->tp_replicas = kv && m->cfg.n_kv_head < m->lay.tp ? m->lay.tp / m->cfg.n_kv_head : 1;
    const int rep = t->tp_replicas;
    for (int d = 0; d < ndim; d++) {
        t->box_len[d] = t->shape[d];
        if (d == split_dim) /* even splits (heads, columns) or the vocabulary's uneven one */
            split_range(t->shape[d], m->lay.tp / rep, m->lay.tp_rank / rep, &t->box_off[d],
                        &t->box_len[d]);
        t->numel *= (size_t)t->box_len[d];
    }
    t->offset = *off;
    t->unit = layer >= 0 ? layer - m->lay.l0 + 1
                         : (kind == LOOM_P_WTE || kind == LOOM_P_WPE ? 0 : m->lay.l1 - m->lay.l0 + 1);
    *off += t->numel;
    return m->n_info++;
}

/* An MoE tensor of a layer with up to 3 dimensions (d2 = 0: two); ep_split: dimension 0 is the
 * routed experts, split over the expert group (this view holds [e0, e1)) and reduced over the
 * expert-data group. */
static int add_moe_tensor(loom_model *m, size_t *off, int layer, int kind, int present, int decay,
                          int ndim, int64_t d0, int64_t d1, int64_t d2, int ep_split) {
    const int i = add_tensor(m, off, layer, kind, present, decay, ndim < 3 ? ndim : 2, d0, d1, -1);
    if (i < 0) return i;
    loom_tensor_info *t = &m->info[i];
    *off -= t->numel;
    if (ndim == 3) {
        t->ndim = 3;
        t->shape[2] = t->box_len[2] = d2;
    }
    if (ep_split) {
        t->split_dim = 0;
        t->split_group = LOOM_SPLIT_EP;
        t->reduce_group = LOOM_REDUCE_EDP;
        t->box_off[0] = m->lay.e0;
        t->box_len[0] = m->lay.e1 - m->lay.e0;
    }
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) t->numel *= (size_t)t->box_len[d];
    *off += t->numel;
    return i;
}

int64_t loom_tensor_global_index(const loom_tensor_info *t, int64_t k) {
    int64_t g = 0;
    int64_t rest = k;
    int64_t inner = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        const int64_t i = rest % t->box_len[d];
        rest /= t->box_len[d];
        g += (t->box_off[d] + i) * inner;
        inner *= t->shape[d];
    }
    return g;
}

/* Checks that the parts of each fused GEMM operand are adjacent (q_w k_w v_w, q_b k_b v_b,
 * gate_w up_w), and records where each part lived in the fused checkpoint format. */
static void set_fused_layout(loom_model *m) {
    const loom_arch *a = &m->cfg.arch;
    static const int groups[3][3] = {{LOOM_L_Q_W, LOOM_L_K_W, LOOM_L_V_W},
                                     {LOOM_L_Q_B, LOOM_L_K_B, LOOM_L_V_B},
                                     {LOOM_L_GATE_W, LOOM_L_UP_W, -1}};
    static const char *const fused[3] = {"qkv_w", "qkv_b", "fc_w"};
    for (int l = m->lay.l0; l < m->lay.l1; l++)
        for (int g = 0; g < 3; g++) {
            if ((g == 1 && !a->qkv_bias) || (g == 2 && a->mlp == LOOM_MLP_GELU)) continue;
            if (g == 2 && loom_model_layer_is_moe(m, l)) continue; /* no dense gate/up */
            const loom_tensor_info *first = loom_model_layer_tensor(m, l, groups[g][0]);
            int64_t rows = 0;
            for (int j = 0; j < 3 && groups[g][j] >= 0; j++) rows += loom_model_layer_tensor(m, l, groups[g][j])->shape[0];
            size_t at = first->offset;
            int64_t row0 = 0;
            for (int j = 0; j < 3 && groups[g][j] >= 0; j++) {
                loom_tensor_info *t = &m->info[m->lidx[(size_t)l * LOOM_L_COUNT + groups[g][j]]];
                LOOM_CHECK(t->offset == at); /* the fused GEMMs rely on it */
                snprintf(t->legacy_name, sizeof t->legacy_name, "layers.%d.%s", l, fused[g]);
                t->legacy_row0 = row0;
                t->legacy_ndim = t->ndim;
                t->legacy_shape[0] = rows;
                t->legacy_shape[1] = t->shape[1];
                at += t->numel;
                row0 += t->shape[0];
            }
        }
}

/* layer l of a model with this config has an MoE feed-forward */
static int moe_layer(const loom_model_config *c, int l) {
    const int every = c->moe_every > 0 ? c->moe_every : 1;
    return c->n_expert > 0 && (l + 1) % every == 0;
}

int loom_model_layer_is_moe(const loom_model *m, int l) { return moe_layer(&m->cfg, l); }

static int check_config(const loom_model_config *c, loom_err *err) {
    if (arch_check(c, err)) return -1;
    const loom_arch *a = loom_config_arch(c);
    if (c->vocab_size <= 0 || c->max_seq_len <= 0 || c->n_layer <= 0 || c->n_head <= 0 ||
        c->n_kv_head <= 0 || c->d_model <= 0 || c->d_ff <= 0)
        return loom_errf(err, "model: vocab_size, max_seq_len, n_layer, n_head, n_kv_head, "
                              "d_model and d_ff must all be positive");
    if (c->n_head % c->n_kv_head != 0)
        return loom_errf(err, "model: n_head (%d) is not divisible by n_kv_head (%d)",
                         c->n_head, c->n_kv_head);
    if (a->pos == LOOM_POS_LEARNED && c->n_kv_head != c->n_head)
        return loom_errf(err, "model: learned positions (the gpt2 flavor) have n_kv_head = "
                              "n_head (got %d and %d)", c->n_kv_head, c->n_head);
    if (!(c->norm_eps > 0.0f) || !(c->init_std > 0.0f))
        return loom_errf(err, "model: norm_eps and init_std must be positive");
    if (c->attention != LOOM_ATTN_FLASH && c->attention != LOOM_ATTN_SDPA)
        return loom_errf(err, "model: unknown attention %d", c->attention);
    if (c->doc_mask != 0 && c->doc_mask != 1)
        return loom_errf(err, "model: doc_mask must be 0 or 1 (got %d)", c->doc_mask);
    if (c->loss_chunk < 0)
        return loom_errf(err, "model: loss_chunk must be >= 0 (got %d)", c->loss_chunk);
    if (c->recompute < LOOM_RECOMPUTE_NONE || c->recompute > LOOM_RECOMPUTE_SELECTIVE)
        return loom_errf(err, "model: unknown recompute mode %d", c->recompute);
    if (c->head != LOOM_HEAD_LM && c->head != LOOM_HEAD_CLASSIFY)
        return loom_errf(err, "model: unknown head %d", c->head);
    if (c->n_expert < 0 || (c->n_expert > 0 &&
                             (c->top_k < 1 || c->top_k > c->n_expert || c->moe_every < 0 ||
                              c->shared_experts < 0 || c->group_tokens < 0 ||
                              !(c->capacity_factor >= 0.0f) || !(c->aux_loss_coef >= 0.0f) ||
                              !(c->z_loss_coef >= 0.0f))))
        return loom_errf(err, "model: mixture of experts needs 1 <= model.moe.top_k (%d) <= "
                              "model.moe.experts (%d), and model.moe.every, shared_experts, "
                              "group_tokens, capacity_factor, aux_loss_coef, z_loss_coef >= 0",
                         c->top_k, c->n_expert);
    /* the fields after arch exist in a LOOM_FLAVOR_ARCH config only (create zeroes them
     * otherwise) */
    const int ext = c->flavor == LOOM_FLAVOR_ARCH;
    if (ext && (c->shared_d_ff < 0 || (c->shared_gate != 0 && c->shared_gate != 1)))
        return loom_errf(err, "model: model.moe.shared_d_ff must be >= 0 and shared_gate a "
                              "boolean (got %d, %d)", c->shared_d_ff, c->shared_gate);
    if (ext && c->n_expert > 0 && c->shared_gate && c->shared_experts < 1)
        return loom_errf(err, "model: model.moe.shared_gate needs shared experts "
                              "(model.moe.shared_experts >= 1)");
    if (c->head == LOOM_HEAD_CLASSIFY && c->num_classes < 2)
        return loom_errf(err, "model: the classify head needs model.num_classes >= 2 (got %d)",
                         c->num_classes);
    return 0;
}

static int create(const loom_model_config *cfg, const loom_model_layout *layout, int B, int T,
                  int mode, int layout_only, loom_model **out, loom_err *err);

/* Normalizes a layout (NULL: the whole model) and checks it against the config. */
static int check_layout(const loom_model_config *c, const loom_model_layout *in,
                        loom_model_layout *out, loom_err *err) {
    memset(out, 0, sizeof *out);
    if (in) *out = *in;
    if (out->tp == 0) out->tp = 1;
    if (out->l1 == 0 && out->l0 == 0) out->l1 = c->n_layer;
    if (out->tp < 1 || out->tp_rank < 0 || out->tp_rank >= out->tp)
        return loom_errf(err, "model layout: tp rank %d of degree %d", out->tp_rank, out->tp);
    if (out->tp > c->vocab_size)
        return loom_errf(err, "model layout: tensor-parallel degree %d exceeds vocab_size %d "
                              "(the vocabulary is split over the tp ranks)", out->tp,
                         c->vocab_size);
    /* n_kv_head < tp: each kv head replicated over tp / n_kv_head ranks (Megatron-LM's) */
    if (c->n_head % out->tp || c->d_ff % out->tp ||
        (c->n_kv_head >= out->tp ? c->n_kv_head % out->tp : out->tp % c->n_kv_head))
        return loom_errf(err, "model layout: tensor-parallel degree %d must divide n_head (%d) "
                              "and d_ff (%d), and divide n_kv_head (%d) or be a multiple of it",
                         out->tp, c->n_head, c->d_ff, c->n_kv_head);
    if (out->tp > 1 && loom_config_arch(c)->qk_norm == LOOM_QK_NORM_WHOLE &&
        c->n_kv_head % out->tp)
        return loom_errf(err, "model layout: whole-projection q/k norms (model.arch.qk_norm: "
                              "whole) need parallel.tp (%d) to divide n_kv_head (%d)", out->tp,
                         c->n_kv_head);
    if (out->tp == 1) out->sp = 0; /* nothing to shard */
    if (out->precision != LOOM_PREC_FP32 && out->precision != LOOM_PREC_BF16)
        return loom_errf(err, "training.precision: unknown precision %d", out->precision);
    if (out->precision == LOOM_PREC_BF16) { /* what bf16 does not cover yet (docs/training.md) */
        const char *key = c->attention != LOOM_ATTN_FLASH ? "model.attention" : NULL;
        if (key)
            return loom_errf(err, "training.precision = bf16 does not support %s as configured "
                                  "yet (bf16 covers one process, data, tensor (with or without "
                                  "sequence parallelism), pipeline, "
                                  "context and expert parallelism, decoders dense or MoE with "
                                  "every norm placement, q/k norms, the embedding scale, final "
                                  "soft-capping and document masks, flash attention, the lm "
                                  "and classify heads: "
                                  "docs/training.md); use "
                                  "training.precision = fp32", key);
    }
    if (out->sp && (c->head != LOOM_HEAD_LM || c->n_expert > 0 || out->cp > 1 ||
                    out->l0 != 0 || (out->l1 != 0 && out->l1 != c->n_layer)))
        return loom_errf(err, "model layout: sequence parallelism (parallel.sp) needs the LM "
                              "head, dense layers (no model.moe), one pipeline stage and no "
                              "context parallelism");
    if (out->l0 < 0 || out->l1 > c->n_layer || out->l0 >= out->l1)
        return loom_errf(err, "model layout: layer range [%d, %d) is not a non-empty part of "
                              "the model's %d layers", out->l0, out->l1, c->n_layer);
    if (c->n_expert == 0 && (out->e0 != 0 || out->e1 != 0))
        return loom_errf(err, "model layout: expert range [%d, %d) given, but the model has "
                              "no experts", out->e0, out->e1);
    if (c->n_expert > 0) {
        if (out->e0 == 0 && out->e1 == 0) out->e1 = c->n_expert;
        const int el = out->e1 - out->e0;
        if (out->e0 < 0 || el < 1 || out->e1 > c->n_expert || c->n_expert % el || out->e0 % el)
            return loom_errf(err, "model layout: expert range [%d, %d) is not one of equal parts "
                                  "of the model's %d experts (model.moe.experts must be divisible "
                                  "by parallel.ep)", out->e0, out->e1, c->n_expert);
    }
    if (out->cp == 0) out->cp = 1;
    if (out->cp < 1 || out->cp_rank < 0 || out->cp_rank >= out->cp)
        return loom_errf(err, "model layout: cp rank %d of degree %d", out->cp_rank, out->cp);
    if (out->cp > 1 && c->attention != LOOM_ATTN_FLASH)
        return loom_errf(err, "model.attention: context parallelism (parallel.cp = %d) needs "
                              "flash attention (model.attention: flash), not sdpa", out->cp);
    if (out->cp > 1 && c->head != LOOM_HEAD_LM)
        return loom_errf(err, "model.head: context parallelism (parallel.cp = %d) needs the lm "
                              "head (the classify head pools over the whole sequence)", out->cp);
    if (out->cp > 1 && c->n_kv_head < out->tp)
        return loom_errf(err, "model.n_kv_head: context parallelism (parallel.cp = %d) needs "
                              "parallel.tp (%d) to divide model.n_kv_head (%d): key/value heads "
                              "replicated over tp ranks are not split over cp",
                         out->cp, out->tp, c->n_kv_head);
    out->has_embedding = out->l0 == 0;
    out->has_head = out->l1 == c->n_layer;
    return 0;
}

int loom_model_create(const loom_model_config *cfg, const loom_model_layout *layout, int B,
                      int T, loom_model **out, loom_err *err) {
    return create(cfg, layout, B, T, LOOM_MODEL_TRAIN, 0, out, err);
}

const loom_model_layout *loom_model_get_layout(const loom_model *m) { return &m->lay; }

static void point_units_at_arenas(loom_model *m) {
    for (int u = 0; u < m->n_units; u++) {
        m->pbase[u] = m->params ? m->params + m->unit_off[u] : NULL;
        m->gbase[u] = m->grads ? m->grads + m->unit_off[u] : NULL;
    }
}

/* layout_only: the tensor table, the units and the activation size table, without allocating
 * any arena (what loom_model_create_layout returns) */
static int create(const loom_model_config *cfg, const loom_model_layout *layout, int B, int T,
                  int mode, int layout_only, loom_model **out, loom_err *err) {
    if (check_config(cfg, err) != 0) return -1;
    loom_model_layout lay;
    if (check_layout(cfg, layout, &lay, err) != 0) return -1;
    if (B <= 0 || T <= 0) return loom_errf(err, "model: batch size and sequence length must be positive");
    if (lay.sp && ((int64_t)B * T) % lay.tp != 0)
        return loom_errf(err, "model layout: sequence parallelism shards a micro-batch's %d x %d "
                              "rows over tp = %d: their number must be divisible by tp", B, T,
                         lay.tp);
    if (T > cfg->max_seq_len)
        return loom_errf(err, "model: sequence length %d exceeds model.max_seq_len %d", T,
                         cfg->max_seq_len);
    if (lay.cp > 1 && (T % 2 != 0 || (int64_t)T * lay.cp > cfg->max_seq_len))
        return loom_errf(err, "model: with context parallelism of degree %d a view's %d rows "
                              "must be even (two chunks) and %d x %d within model.max_seq_len "
                              "%d", lay.cp, T, lay.cp, T, cfg->max_seq_len);
    loom_model *m = loom_calloc(1, sizeof *m);
    if (cfg->flavor == LOOM_FLAVOR_ARCH) {
        m->cfg = *cfg;
    } else { /* a built-in descriptor: the caller's struct may end before arch (an older
              * layout), so only what precedes it is read */
        memcpy(&m->cfg, cfg, offsetof(loom_model_config, arch));
        m->cfg.arch = *loom_config_arch(cfg); /* and the fields after it stay 0 */
    }
    cfg = &m->cfg;
    const loom_arch *ar = &m->cfg.arch;
    if (!m->cfg.backend) m->cfg.backend = loom_backend_default();
    m->be = m->cfg.backend;
    m->lay = lay;
    m->maxB = B;
    m->maxT = T;
    const int64_t V = cfg->vocab_size, C = cfg->d_model, L = cfg->n_layer, Hg = cfg->n_head,
                  KVHg = cfg->n_kv_head, Fg = cfg->d_ff, maxT = cfg->max_seq_len;
    const int gated = ar->mlp != LOOM_MLP_GELU, rms = ar->norm == LOOM_NORM_RMS;
    const int tp = lay.tp;
    m->D = loom_config_head_dim(cfg);
    m->H = (int)(Hg / tp);
    m->KVH = KVHg >= tp ? (int)(KVHg / tp) : 1; /* else one kv head, shared with other ranks */
    m->F = (int)(Fg / tp);
    m->QKV = (m->H + 2 * m->KVH) * m->D;
    m->FFI = gated ? 2 * m->F : m->F;
    const int64_t HDg = Hg * m->D, KDg = KVHg * m->D;
    const int cls = cfg->head == LOOM_HEAD_CLASSIFY, tied = ar->tied && !cls;
    int64_t v0, vl;
    split_range(V, tp, lay.tp_rank, &v0, &vl);
    m->V0 = (int)v0;
    m->Vl = (int)vl;

    m->info = loom_calloc(LOOM_P_COUNT + (size_t)L * LOOM_L_COUNT, sizeof(loom_tensor_info));
    m->lidx = loom_malloc((size_t)L * LOOM_L_COUNT * sizeof(int));
    for (size_t i = 0; i < (size_t)L * LOOM_L_COUNT; i++) m->lidx[i] = -1;
    for (int k = 0; k < LOOM_P_COUNT; k++) m->gidx[k] = -1;
    size_t off = 0;
    /* the tied head reads wte: a last stage without the embedding still holds it */
    const int want_wte = lay.has_embedding || (tied && lay.has_head);
    /* vocab-parallel: wte and lm_head split by rows over tp */
    m->gidx[LOOM_P_WTE] = add_tensor(m, &off, -1, LOOM_P_WTE, want_wte, 1, 2, V, C, 0);
    m->gidx[LOOM_P_WPE] = add_tensor(m, &off, -1, LOOM_P_WPE,
                                     ar->pos == LOOM_POS_LEARNED && lay.has_embedding, 1, 2, maxT,
                                     C, -1);
    for (int l = lay.l0; l < lay.l1; l++) {
        int *li = m->lidx + (size_t)l * LOOM_L_COUNT;
        /* column-parallel (q, k, v by heads; fc, gate, up by columns) split dim 0,
         * row-parallel (attn_proj, fc_proj) split dim 1, the rest replicated */
        const int pre = ar->norm_place != LOOM_NORM_POST; /* post: no ln1, ln2 */
        li[LOOM_L_LN1_W] = add_tensor(m, &off, l, LOOM_L_LN1_W, pre, 0, 1, C, 0, -1);
        li[LOOM_L_LN1_B] = add_tensor(m, &off, l, LOOM_L_LN1_B, pre && !rms, 0, 1, C, 0, -1);
        li[LOOM_L_Q_W] = add_tensor(m, &off, l, LOOM_L_Q_W, 1, 1, 2, HDg, C, 0);
        li[LOOM_L_K_W] = add_tensor(m, &off, l, LOOM_L_K_W, 1, 1, 2, KDg, C, 0);
        li[LOOM_L_V_W] = add_tensor(m, &off, l, LOOM_L_V_W, 1, 1, 2, KDg, C, 0);
        const int qb = ar->qkv_bias, ob = ar->o_bias, mb = ar->mlp_bias;
        li[LOOM_L_Q_B] = add_tensor(m, &off, l, LOOM_L_Q_B, qb, 0, 1, HDg, 0, 0);
        li[LOOM_L_K_B] = add_tensor(m, &off, l, LOOM_L_K_B, qb, 0, 1, KDg, 0, 0);
        li[LOOM_L_V_B] = add_tensor(m, &off, l, LOOM_L_V_B, qb, 0, 1, KDg, 0, 0);
        /* q/k norms: per head one (D) weight each, replicated; whole-projection (H*D) and
         * (KVH*D), split with the heads */
        if (ar->qk_norm == LOOM_QK_NORM_WHOLE) {
            li[LOOM_L_Q_NORM_W] = add_tensor(m, &off, l, LOOM_L_Q_NORM_W, 1, 0, 1, HDg, 0, 0);
            li[LOOM_L_K_NORM_W] = add_tensor(m, &off, l, LOOM_L_K_NORM_W, 1, 0, 1, KDg, 0, 0);
        } else {
            const int qkn = ar->qk_norm == LOOM_QK_NORM_HEAD;
            li[LOOM_L_Q_NORM_W] = add_tensor(m, &off, l, LOOM_L_Q_NORM_W, qkn, 0, 1, m->D, 0, -1);
            li[LOOM_L_K_NORM_W] = add_tensor(m, &off, l, LOOM_L_K_NORM_W, qkn, 0, 1, m->D, 0, -1);
        }
        li[LOOM_L_ATTN_PROJ_W] = add_tensor(m, &off, l, LOOM_L_ATTN_PROJ_W, 1, 1, 2, C, HDg, 1);
        li[LOOM_L_ATTN_PROJ_B] = add_tensor(m, &off, l, LOOM_L_ATTN_PROJ_B, ob, 0, 1, C, 0, -1);
        li[LOOM_L_LN2_W] = add_tensor(m, &off, l, LOOM_L_LN2_W, pre, 0, 1, C, 0, -1);
        li[LOOM_L_LN2_B] = add_tensor(m, &off, l, LOOM_L_LN2_B, pre && !rms, 0, 1, C, 0, -1);
        const int dense = !moe_layer(cfg, l);
        li[LOOM_L_FC_W] = add_tensor(m, &off, l, LOOM_L_FC_W, dense && !gated, 1, 2, Fg, C, 0);
        li[LOOM_L_GATE_W] = add_tensor(m, &off, l, LOOM_L_GATE_W, dense && gated, 1, 2, Fg, C, 0);
        li[LOOM_L_UP_W] = add_tensor(m, &off, l, LOOM_L_UP_W, dense && gated, 1, 2, Fg, C, 0);
        li[LOOM_L_FC_B] = add_tensor(m, &off, l, LOOM_L_FC_B, dense && mb && !gated, 0, 1, Fg, 0,
                                     0);
        li[LOOM_L_FC_PROJ_W] = add_tensor(m, &off, l, LOOM_L_FC_PROJ_W, dense, 1, 2, C, Fg, 1);
        li[LOOM_L_FC_PROJ_B] = add_tensor(m, &off, l, LOOM_L_FC_PROJ_B, dense && mb, 0, 1, C, 0,
                                          -1);
        /* post / sandwich norms (dense layers only: arch_check refuses MoE with them) */
        const int post = ar->norm_place != LOOM_NORM_PRE;
        li[LOOM_L_ATTN_POST_W] = add_tensor(m, &off, l, LOOM_L_ATTN_POST_W, post, 0, 1, C, 0, -1);
        li[LOOM_L_FFN_POST_W] = add_tensor(m, &off, l, LOOM_L_FFN_POST_W, post, 0, 1, C, 0, -1);
        if (!dense) { /* the router, shared experts, then the routed experts (last: one range) */
            const int64_t E = cfg->n_expert, S = cfg->shared_experts, FI = gated ? 2 * Fg : Fg;
            /* the shared experts' width (model.moe.shared_d_ff; whole on every tp rank) */
            const int64_t SF = cfg->shared_d_ff > 0 ? cfg->shared_d_ff : Fg;
            const int64_t SFI = gated ? 2 * SF : SF;
            const int gpt2 = mb && !gated; /* the expert MLPs' biases (GELU experts only) */
            li[LOOM_L_MOE_ROUTER_W] = add_moe_tensor(m, &off, l, LOOM_L_MOE_ROUTER_W, 1, 1, 2, E,
                                                     C, 0, 0);
            li[LOOM_L_MOE_SH_FC_W] = add_moe_tensor(m, &off, l, LOOM_L_MOE_SH_FC_W, S > 0, 1, 3,
                                                    S, SFI, C, 0);
            li[LOOM_L_MOE_SH_FC_B] = add_moe_tensor(m, &off, l, LOOM_L_MOE_SH_FC_B, S > 0 && gpt2,
                                                    0, 2, S, SF, 0, 0);
            li[LOOM_L_MOE_SH_PROJ_W] = add_moe_tensor(m, &off, l, LOOM_L_MOE_SH_PROJ_W, S > 0, 1,
                                                      3, S, C, SF, 0);
            li[LOOM_L_MOE_SH_PROJ_B] = add_moe_tensor(m, &off, l, LOOM_L_MOE_SH_PROJ_B,
                                                      S > 0 && gpt2, 0, 2, S, C, 0, 0);
            /* a matrix (C -> 1 per shared expert): decayed like the router */
            li[LOOM_L_MOE_SH_GATE_W] = add_moe_tensor(m, &off, l, LOOM_L_MOE_SH_GATE_W,
                                                      S > 0 && cfg->shared_gate, 1, 2, S, C, 0, 0);
            li[LOOM_L_MOE_FC_W] = add_moe_tensor(m, &off, l, LOOM_L_MOE_FC_W, 1, 1, 3, E, FI, C,
                                                 1);
            li[LOOM_L_MOE_FC_B] = add_moe_tensor(m, &off, l, LOOM_L_MOE_FC_B, gpt2, 0, 2, E, Fg,
                                                 0, 1);
            li[LOOM_L_MOE_PROJ_W] = add_moe_tensor(m, &off, l, LOOM_L_MOE_PROJ_W, 1, 1, 3, E, C,
                                                   Fg, 1);
            li[LOOM_L_MOE_PROJ_B] = add_moe_tensor(m, &off, l, LOOM_L_MOE_PROJ_B, gpt2, 0, 2, E, C,
                                                   0, 1);
        }
    }
    const int head = lay.has_head;
    const int64_t K = cfg->num_classes;
    m->gidx[LOOM_P_LNF_W] = add_tensor(m, &off, -1, LOOM_P_LNF_W, head, 0, 1, C, 0, -1);
    m->gidx[LOOM_P_LNF_B] = add_tensor(m, &off, -1, LOOM_P_LNF_B, head && !rms, 0, 1, C, 0, -1);
    m->gidx[LOOM_P_LM_HEAD] = add_tensor(m, &off, -1, LOOM_P_LM_HEAD, head && !ar->tied && !cls,
                                         1, 2, V, C, 0);
    m->gidx[LOOM_P_CLS_W] = add_tensor(m, &off, -1, LOOM_P_CLS_W, head && cls, 1, 2, K, C, -1);
    m->gidx[LOOM_P_CLS_B] = add_tensor(m, &off, -1, LOOM_P_CLS_B, head && cls, 0, 1, K, 0, -1);
    m->n_params = off;
    set_fused_layout(m);
    moe_init(m);
    m->n_units = lay.l1 - lay.l0 + 2;
    m->unit_off = loom_calloc((size_t)m->n_units, sizeof(size_t));
    m->unit_cnt = loom_calloc((size_t)m->n_units, sizeof(size_t));
    for (int i = 0; i < m->n_info; i++) { /* tensors are in unit order */
        const loom_tensor_info *ti = &m->info[i];
        if (m->unit_cnt[ti->unit] == 0) m->unit_off[ti->unit] = ti->offset;
        m->unit_cnt[ti->unit] += ti->numel;
    }
    /* training.precision bf16: the bf16 copy of the parameter arena (refreshed per unit before
     * a forward when stale, written by the optimizer step) and the slots' dtypes */
    m->bf16 = lay.precision == LOOM_PREC_BF16;
    if (m->bf16 && !layout_only) {
        m->wb = m->be->mem_alloc(off * sizeof(uint16_t), 0);
        m->wb_stale = loom_calloc((size_t)m->n_units, 1);
        memset(m->wb_stale, 1, (size_t)m->n_units);
        m->wbase = loom_calloc((size_t)m->n_units, sizeof *m->wbase);
        for (int u = 0; u < m->n_units; u++) m->wbase[u] = m->wb + m->unit_off[u];
    }
    acts_dtypes(m);
    m->pbase = loom_calloc((size_t)m->n_units, sizeof(float *));
    m->gbase = loom_calloc((size_t)m->n_units, sizeof(float *));
    m->have_grads = loom_calloc((size_t)m->n_units, 1);
    LOOM_CHECK(mode >= LOOM_MODEL_NO_ARENAS && mode <= LOOM_MODEL_HOOKS_ONLY);
    m->mode = mode;
    if (mode != LOOM_MODEL_NO_ARENAS && mode != LOOM_MODEL_HOOKS_ONLY && !layout_only) {
        m->params = m->be->mem_alloc(off * sizeof(float), 0);
        if (mode == LOOM_MODEL_TRAIN) m->grads = m->be->mem_alloc(off * sizeof(float), 0);
    }
    point_units_at_arenas(m);

    /* the model's own activation arena (one micro-batch); an inference model's comes with its
     * first forward, forward-only */
    const int training = mode != LOOM_MODEL_INFER;
    m->act_floats = acts_floats(m, B, T, training);
    if (layout_only) {
        *out = m;
        return 0;
    }
    if (training && mode != LOOM_MODEL_HOOKS_ONLY) m->acts = loom_acts_create(m, B, T, 1);
    if (ar->pos == LOOM_POS_ROPE) {
        const size_t rope_bytes = (size_t)maxT * (size_t)(m->D / 2) * sizeof(float);
        m->rope_cos = m->be->mem_alloc(rope_bytes, 0);
        m->rope_sin = m->be->mem_alloc(rope_bytes, 0);
        if (ar->rope_type == LOOM_ROPE_DEFAULT) {
            m->be->rope_tables(m->rope_cos, m->rope_sin, (int)maxT, m->D, cfg->rope_theta);
        } else { /* a scaling: the descriptor's frequencies */
            float *inv = loom_malloc((size_t)(m->D / 2) * sizeof(float));
            const float scale = arch_rope_inv_freq(ar, cfg->rope_theta, m->D, inv);
            float *dinv = m->be->mem_alloc((size_t)(m->D / 2) * sizeof(float), 0);
            m->be->mem_h2d(dinv, inv, (size_t)(m->D / 2) * sizeof(float));
            m->be->rope_tables_freq(m->rope_cos, m->rope_sin, (int)maxT, m->D, dinv, scale);
            m->be->mem_free(dinv);
            free(inv);
        }
        if (ar->rope_local_theta > 0.0f) { /* the sliding layers' own base, default RoPE */
            m->rope_cos_local = m->be->mem_alloc(rope_bytes, 0);
            m->rope_sin_local = m->be->mem_alloc(rope_bytes, 0);
            m->be->rope_tables(m->rope_cos_local, m->rope_sin_local, (int)maxT, m->D,
                               ar->rope_local_theta);
        }
    }
    *out = m;
    return 0;
}

int loom_model_create_view(const loom_model_config *cfg, const loom_model_layout *layout, int B,
                           int T, int mode, loom_model **out, loom_err *err) {
    return create(cfg, layout, B, T, mode, 0, out, err);
}

int loom_model_create_ex(const loom_model_config *cfg, int B, int T, int own_arenas,
                         loom_model **out, loom_err *err) {
    return create(cfg, NULL, B, T, own_arenas ? LOOM_MODEL_TRAIN : LOOM_MODEL_NO_ARENAS, 0, out,
                  err);
}

int loom_model_create_layout(const loom_model_config *cfg, int B, int T, loom_model **out,
                             loom_err *err) {
    return create(cfg, NULL, B, T, 0, 1, out, err);
}

int loom_model_create_layout_view(const loom_model_config *cfg, const loom_model_layout *layout,
                                  int B, int T, loom_model **out, loom_err *err) {
    return create(cfg, layout, B, T, 0, 1, out, err);
}

size_t loom_model_activation_bytes(const loom_model *m) {
    const size_t BT = (size_t)m->maxB * (size_t)m->maxT;
    const size_t rope = m->cfg.arch.pos != LOOM_POS_ROPE
                            ? 0
                            : 2 * (size_t)m->cfg.max_seq_len * (size_t)(m->D / 2) * sizeof(float);
    /* inputs, targets; documents (ids, run rows, lengths, positions; a cp view also the whole
     * sequences' ids) */
    const size_t ints =
        (m->cfg.doc_mask ? 6 + (m->lay.cp > 1 ? (size_t)m->lay.cp : 0) : 2) * BT;
    return m->act_floats * sizeof(float) + ints * sizeof(int32_t) + rope;
}

size_t loom_model_activation_floats(const loom_model *m) { return m->act_floats; }

uint16_t *loom_model_bf16_weights(loom_model *m) { return m->wb; }

void loom_model_params_changed(loom_model *m) {
    if (m->wb_stale) memset(m->wb_stale, 1, (size_t)m->n_units);
}

void model_bf16_refresh(loom_model *m, int u) {
    if (m->has_hooks && m->hooks.bf16_buffer) { /* ZeRO 3: the copy of what was gathered */
        int fresh = 0;
        uint16_t *w = m->hooks.bf16_buffer(m->hooks.ctx, u, &fresh);
        LOOM_CHECK(w != NULL && m->pbase[u] != NULL);
        if (fresh) m->be->bf16_from_f32(w, m->pbase[u], (int64_t)m->unit_cnt[u]);
        m->wbase[u] = w;
        return;
    }
    if (!m->wb || !m->wb_stale[u]) return;
    LOOM_CHECK(m->pbase[u] != NULL);
    m->be->bf16_from_f32(m->wb + m->unit_off[u], m->pbase[u], (int64_t)m->unit_cnt[u]);
    m->wb_stale[u] = 0;
}

void loom_model_free(loom_model *m) {
    if (!m) return;
    loom_lora_free(m->lora); /* the model owns its adapters (include/loom/lora.h) */
    const loom_backend *be = m->be;
    be->mem_free(m->params);
    be->mem_free(m->grads);
    be->mem_free(m->warena); /* the inference weights' stored matrices */
    free(m->wmat);
    be->mem_free(m->wb);
    free(m->wb_stale);
    free(m->wbase);
    loom_acts_free(m->acts);
    be->mem_free(m->rope_cos);
    be->mem_free(m->rope_sin);
    be->mem_free(m->rope_cos_local);
    be->mem_free(m->rope_sin_local);
    free(m->h_next);
    free(m->info);
    free(m->lidx);
    free(m->unit_off);
    free(m->unit_cnt);
    free(m->pbase);
    free(m->gbase);
    free(m->have_grads);
    moe_free(m);
    free(m);
}

const loom_model_config *loom_model_get_config(const loom_model *m) { return &m->cfg; }
const loom_backend *loom_model_backend(const loom_model *m) { return m->be; }
size_t loom_model_num_params(const loom_model *m) { return m->n_params; }
float *loom_model_params(loom_model *m) { return m->params; }
float *loom_model_grads(loom_model *m) { return m->grads; }
const float *loom_model_logits(const loom_model *m) {
    /* (bf16: the fp32 logits of model_logits_f32 only: classify, soft-capped, vocab-parallel) */
    return m->acts && !m->acts->chunk && model_logits_f32(m) ? m->acts->logits : NULL;
}
void loom_model_vocab_range(const loom_model *m, int *v0, int *vl) {
    *v0 = m->V0;
    *vl = m->Vl;
}
int64_t loom_model_valid_targets(const loom_model *m) { return m->acts ? m->acts->valid : 0; }

int loom_model_num_tensors(const loom_model *m) { return m->n_info; }

const loom_tensor_info *loom_model_tensor(const loom_model *m, int i) {
    LOOM_CHECK(i >= 0 && i < m->n_info);
    return &m->info[i];
}

const loom_tensor_info *loom_model_global(const loom_model *m, int kind) {
    LOOM_CHECK(kind >= 0 && kind < LOOM_P_COUNT);
    return m->gidx[kind] < 0 ? NULL : &m->info[m->gidx[kind]];
}

const loom_tensor_info *loom_model_layer_tensor(const loom_model *m, int layer, int kind) {
    LOOM_CHECK(layer >= 0 && layer < m->cfg.n_layer && kind >= 0 && kind < LOOM_L_COUNT);
    const int i = m->lidx[(size_t)layer * LOOM_L_COUNT + kind];
    return i < 0 ? NULL : &m->info[i];
}

void loom_model_layer_range(const loom_model *m, int l, size_t *offset, size_t *count) {
    LOOM_CHECK(l >= m->lay.l0 && l < m->lay.l1);
    loom_model_unit_range(m, l - m->lay.l0 + 1, offset, count);
}

size_t loom_model_arena_bytes(const loom_model *m) {
    return ((m->params ? m->n_params : 0) + (m->grads ? m->n_params : 0) +
            (m->acts ? m->acts->floats : 0)) * sizeof(float);
}

void loom_model_zero_grad(loom_model *m) {
    if (m->grads) m->be->mem_set(m->grads, 0, m->n_params * sizeof(float));
}

int loom_model_num_units(const loom_model *m) { return m->n_units; }

void loom_model_unit_range(const loom_model *m, int u, size_t *offset, size_t *count) {
    LOOM_CHECK(u >= 0 && u < m->n_units);
    *offset = m->unit_off[u];
    *count = m->unit_cnt[u];
}

void loom_model_set_hooks(loom_model *m, const loom_model_hooks *h) {
    if (h) {
        m->hooks = *h;
        m->has_hooks = 1;
        if (h->bf16_buffer && m->wb) { /* the hooks hold the acquired units' bf16 copies */
            LOOM_CHECK(m->bf16);
            m->be->mem_free(m->wb);
            m->wb = NULL;
            for (int u = 0; u < m->n_units; u++) m->wbase[u] = NULL;
        }
    } else {
        LOOM_CHECK(m->params && m->grads);
        m->has_hooks = 0;
        point_units_at_arenas(m);
    }
}

int loom_model_can_decode(const loom_model *m) {
    if (m->has_hooks) return m->hooks.resident && m->hooks.acquire_params != NULL;
    return m->params != NULL;
}

void model_decode_bind(loom_model *m) {
    LOOM_CHECK(loom_model_can_decode(m)); /* callers check it first (loom_engine_create) */
    if (!m->has_hooks) return;
    for (int u = 0; u < m->n_units; u++) { /* resident: pointers into storage, nothing moves */
        m->pbase[u] = m->hooks.acquire_params(m->hooks.ctx, u, 0);
        LOOM_CHECK(m->pbase[u] != NULL);
    }
}

/* init value of element k of tensor t */
static float init_value(const loom_model *m, const loom_tensor_info *t, uint64_t seed,
                        uint64_t stream, size_t k) {
    const int g = t->layer < 0;
    const int is_norm = g ? (t->kind == LOOM_P_LNF_W)
                          : (t->kind == LOOM_L_LN1_W || t->kind == LOOM_L_LN2_W ||
                             t->kind == LOOM_L_Q_NORM_W || t->kind == LOOM_L_K_NORM_W ||
                             t->kind == LOOM_L_ATTN_POST_W || t->kind == LOOM_L_FFN_POST_W);
    if (is_norm) return 1.0f;
    if (!t->decay) return 0.0f; /* biases */
    const float std = m->cfg.init_std;
    const float s = (!g && (t->kind == LOOM_L_ATTN_PROJ_W || t->kind == LOOM_L_FC_PROJ_W ||
                            t->kind == LOOM_L_MOE_PROJ_W || t->kind == LOOM_L_MOE_SH_PROJ_W))
                        ? std / sqrtf(2.0f * (float)m->cfg.n_layer)
                        : std;
    return s * loom_rng_normal(seed, stream, k);
}

void loom_model_init_range(const loom_model *m, uint64_t seed, size_t offset, size_t count,
                           float *dst) {
    for (int i = 0; i < m->n_info; i++) {
        const loom_tensor_info *t = &m->info[i];
        const size_t lo = t->offset > offset ? t->offset : offset;
        const size_t hi = t->offset + t->numel < offset + count ? t->offset + t->numel
                                                                : offset + count;
        if (lo >= hi) continue;
        const uint64_t stream = loom_hash_str(t->name);
        #pragma omp parallel for schedule(static)
        for (size_t k = lo; k < hi; k++) /* keyed by the element's index in the global tensor */
            dst[k - offset] = init_value(m, t, seed, stream,
                                         (size_t)loom_tensor_global_index(t, (int64_t)(k - t->offset)));
    }
}

float *loom_model_params_to_host(const loom_model *m) {
    if (m->be->host_memory) return NULL;
    float *h = loom_malloc((m->n_params ? m->n_params : 1) * sizeof(float));
    loom_dev_read(m->be, h, m->params, m->n_params * sizeof(float), "parameters to host");
    return h;
}

void loom_model_params_from_host(loom_model *m, const float *src) {
    m->be->mem_h2d(m->params, src, m->n_params * sizeof(float));
}

void loom_model_init_device(const loom_model *m, uint64_t seed, size_t offset, size_t count,
                            float *dst) {
    /* drawn on the host chunk by chunk and copied in (the draws do not depend on the chunks) */
    const size_t chunk = (size_t)1 << 20;
    float *h = loom_malloc((count < chunk ? (count ? count : 1) : chunk) * sizeof(float));
    for (size_t at = 0; at < count; at += chunk) {
        const size_t n = count - at < chunk ? count - at : chunk;
        loom_model_init_range(m, seed, offset + at, n, h);
        m->be->mem_h2d(dst + at, h, n * sizeof(float));
    }
    free(h);
}

void loom_model_init_weights(loom_model *m, uint64_t seed) {
    LOOM_CHECK(m->params != NULL);
    loom_model_init_device(m, seed, 0, m->n_params, m->params);
}
