/* model.* config keys -> loom_model_config. */
#include <string.h>

#include "loom/backend.h"
#include "loom/model.h"
#include "loom/model_config.h"

const loom_config_key loom_model_config_keys[] = {
    {"model.flavor", "gpt2", "gpt2 (LayerNorm, learned positions, GELU, tied head) or llama "
                            "(RMSNorm, RoPE, SwiGLU, GQA, untied head)"},
    {"model.vocab_size", "256", "V: vocabulary size (>= the dataset's)"},
    {"model.d_model", "256", "C: width of the residual stream"},
    {"model.n_layer", "4", "L: transformer blocks"},
    {"model.n_head", "4", "H: query heads"},
    {"model.n_kv_head", NULL, "KVH: key/value heads (default n_head; llama may use fewer)"},
    {"model.d_ff", NULL, "F: feed-forward width (default 4*d_model)"},
    {"model.max_seq_len", NULL, "position limit (default training.seq_len)"},
    {"model.norm_eps", "1e-5", "epsilon of LayerNorm / RMSNorm"},
    {"model.rope_theta", "10000", "RoPE base (llama)"},
    {"model.init_std", "0.02", "std of the normal init of weight matrices"},
    {"model.head", "lm", "lm (next-token prediction) or classify (mean-pooled sequence "
                         "classification, one label per sequence)"},
    {"model.num_classes", "0", "K: classes of the classify head"},
    {"model.attention", "flash", "flash (tiled, O(T) memory, the default) or sdpa (the "
                                 "materialized reference: B x H x T x T probabilities per layer)"},
    {"model.backend", "cpu", "the kernels' backend: cpu (the only one today; docs/engine.md "
                             "\"Backends\")"},
    {"model.moe.experts", "0", "E: routed experts of the MoE feed-forward layers (0 = a dense "
                               "model; docs/moe.md)"},
    {"model.moe.top_k", "2", "experts per token"},
    {"model.moe.every", "1", "layer l is an MoE layer when (l + 1) % every == 0"},
    {"model.moe.capacity_factor", "0", "per expert and routing group at most "
                                       "floor(capacity_factor * top_k * group / E) tokens, the "
                                       "rest dropped (pass through the residual); 0 = dropless"},
    {"model.moe.group_tokens", "0", "tokens of a routing group for the capacity and the balance "
                                    "loss (0 = one sequence, training.seq_len)"},
    {"model.moe.aux_loss_coef", "0.01", "weight of the load-balancing loss"},
    {"model.moe.z_loss_coef", "0.001", "weight of the router z-loss"},
    {"model.moe.shared_experts", "0", "experts every token goes through (besides its top_k)"},
    {"model.doc_mask", "false", "packed sequences: attention stays inside each document of the "
                                "shards' document index, positions restart per document"},
    {"model.loss_chunk", "0", "LM head + loss in chunks of this many tokens (no B x T x V "
                              "logits); 0 = all at once"},
    {"model.recompute", "none", "activation checkpointing: none, full (re-run each block in "
                                "backward) or selective (recompute norms, activation, attention)"},
};
const int loom_model_config_nkeys = sizeof loom_model_config_keys / sizeof loom_model_config_keys[0];

static int get_int(const loom_config *c, const char *key, int64_t lo, int64_t hi, int *out,
                   loom_err *err) {
    int64_t v;
    if (loom_config_get_int(c, key, &v, err) != 0) return -1;
    if (v < lo || v > hi)
        return loom_errf(err, "config key '%s' = %lld (%s) is out of range [%lld, %lld]", key,
                         (long long)v, loom_config_origin(c, key), (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

static int get_float(const loom_config *c, const char *key, float *out, loom_err *err) {
    double v;
    if (loom_config_get_double(c, key, &v, err) != 0) return -1;
    if (!(v > 0.0))
        return loom_errf(err, "config key '%s' (%s) must be positive", key,
                         loom_config_origin(c, key));
    *out = (float)v;
    return 0;
}

static int get_nonneg(const loom_config *c, const char *key, float *out, loom_err *err) {
    double v;
    if (loom_config_get_double(c, key, &v, err) != 0) return -1;
    if (!(v >= 0.0) || v > 1e6)
        return loom_errf(err, "config key '%s' = %g (%s) must be in [0, 1e6]", key, v,
                         loom_config_origin(c, key));
    *out = (float)v;
    return 0;
}

int loom_model_config_from(const loom_config *c, int default_seq_len, loom_model_config *out,
                           loom_err *err) {
    memset(out, 0, sizeof *out);
    const char *flavor;
    if (loom_config_get_str(c, "model.flavor", &flavor, err) != 0) return -1;
    if (!strcmp(flavor, "gpt2")) out->flavor = LOOM_FLAVOR_GPT2;
    else if (!strcmp(flavor, "llama")) out->flavor = LOOM_FLAVOR_LLAMA;
    else
        return loom_errf(err, "config key 'model.flavor' = '%s' (%s): expected gpt2 or llama",
                         flavor, loom_config_origin(c, "model.flavor"));
    const int64_t big = 1 << 24;
    if (get_int(c, "model.vocab_size", 1, big, &out->vocab_size, err) ||
        get_int(c, "model.d_model", 1, big, &out->d_model, err) ||
        get_int(c, "model.n_layer", 1, 4096, &out->n_layer, err) ||
        get_int(c, "model.n_head", 1, 4096, &out->n_head, err))
        return -1;
    out->n_kv_head = out->n_head;
    if (loom_config_get(c, "model.n_kv_head") &&
        get_int(c, "model.n_kv_head", 1, 4096, &out->n_kv_head, err))
        return -1;
    out->d_ff = 4 * out->d_model;
    if (loom_config_get(c, "model.d_ff") && get_int(c, "model.d_ff", 1, big, &out->d_ff, err))
        return -1;
    out->max_seq_len = default_seq_len;
    if (loom_config_get(c, "model.max_seq_len") &&
        get_int(c, "model.max_seq_len", 1, big, &out->max_seq_len, err))
        return -1;
    const char *head;
    if (loom_config_get_str(c, "model.head", &head, err)) return -1;
    if (!strcmp(head, "lm")) out->head = LOOM_HEAD_LM;
    else if (!strcmp(head, "classify")) out->head = LOOM_HEAD_CLASSIFY;
    else
        return loom_errf(err, "config key 'model.head' = '%s' (%s): expected lm or classify", head,
                         loom_config_origin(c, "model.head"));
    if (get_int(c, "model.num_classes", 0, 1 << 20, &out->num_classes, err)) return -1;
    const char *attn;
    if (loom_config_get_str(c, "model.attention", &attn, err)) return -1;
    if (!strcmp(attn, "flash")) out->attention = LOOM_ATTN_FLASH;
    else if (!strcmp(attn, "sdpa")) out->attention = LOOM_ATTN_SDPA;
    else
        return loom_errf(err, "config key 'model.attention' = '%s' (%s): expected flash or sdpa",
                         attn, loom_config_origin(c, "model.attention"));
    const char *be;
    if (loom_config_get_str(c, "model.backend", &be, err)) return -1;
    out->backend = loom_backend_find(be);
    if (!out->backend)
        return loom_errf(err, "config key 'model.backend' = '%s' (%s): unknown backend (known: %s)",
                         be, loom_config_origin(c, "model.backend"), loom_backend_names());
    if (get_int(c, "model.moe.experts", 0, 1024, &out->n_expert, err) ||
        get_int(c, "model.moe.top_k", 1, 1024, &out->top_k, err) ||
        get_int(c, "model.moe.every", 1, 4096, &out->moe_every, err) ||
        get_int(c, "model.moe.shared_experts", 0, 64, &out->shared_experts, err) ||
        get_int(c, "model.moe.group_tokens", 0, big, &out->group_tokens, err) ||
        get_nonneg(c, "model.moe.capacity_factor", &out->capacity_factor, err) ||
        get_nonneg(c, "model.moe.aux_loss_coef", &out->aux_loss_coef, err) ||
        get_nonneg(c, "model.moe.z_loss_coef", &out->z_loss_coef, err))
        return -1;
    if (out->n_expert > 0 && out->top_k > out->n_expert)
        return loom_errf(err, "config key 'model.moe.top_k' = %d (%s) exceeds model.moe.experts = "
                              "%d", out->top_k, loom_config_origin(c, "model.moe.top_k"),
                         out->n_expert);
    if (out->n_expert == 0) { /* a dense model: the other moe keys do nothing */
        out->top_k = out->moe_every = out->shared_experts = out->group_tokens = 0;
        out->capacity_factor = out->aux_loss_coef = out->z_loss_coef = 0.0f;
    }
    if (loom_config_get_bool(c, "model.doc_mask", &out->doc_mask, err) ||
        get_int(c, "model.loss_chunk", 0, 1 << 30, &out->loss_chunk, err))
        return -1;
    const char *rc;
    if (loom_config_get_str(c, "model.recompute", &rc, err)) return -1;
    if (!strcmp(rc, "none")) out->recompute = LOOM_RECOMPUTE_NONE;
    else if (!strcmp(rc, "full")) out->recompute = LOOM_RECOMPUTE_FULL;
    else if (!strcmp(rc, "selective")) out->recompute = LOOM_RECOMPUTE_SELECTIVE;
    else
        return loom_errf(err, "config key 'model.recompute' = '%s' (%s): expected none, full or "
                              "selective", rc, loom_config_origin(c, "model.recompute"));
    if (get_float(c, "model.norm_eps", &out->norm_eps, err) ||
        get_float(c, "model.rope_theta", &out->rope_theta, err) ||
        get_float(c, "model.init_std", &out->init_std, err))
        return -1;
    return 0;
}
