/* model.* config keys -> loom_model_config. */
#include <string.h>

#include <stdlib.h>

#include "loom/backend.h"
#include "loom/model.h"
#include "loom/model_config.h"

const loom_config_key loom_model_config_keys[] = {
    {"model.flavor", "gpt2", "the named architecture (docs/architectures.md): gpt2 (LayerNorm, "
                            "learned positions, GELU, biases, tied head), llama (RMSNorm, RoPE, "
                            "SwiGLU, GQA, untied head), qwen2 (llama + q/k/v biases), qwen3 "
                            "(llama + per-head q/k RMSNorm) or olmo2 (llama + post-norms + "
                            "whole-projection q/k RMSNorm); model.arch.* change single "
                            "features"},
    {"model.arch.norm", NULL, "layer (LayerNorm with bias) or rms (default: the flavor's)"},
    {"model.arch.pos", NULL, "learned (wpe) or rope"},
    {"model.arch.mlp", NULL, "gelu (fc, GELU tanh, fc_proj), swiglu (silu(gate) * up) or geglu "
                            "(gelu_tanh(gate) * up)"},
    {"model.arch.qkv_bias", NULL, "biases on q, k and v (true/false)"},
    {"model.arch.o_bias", NULL, "a bias on the attention output projection"},
    {"model.arch.mlp_bias", NULL, "biases on the MLP's linears (gelu MLP only)"},
    {"model.arch.tied", NULL, "the LM head is the token embedding"},
    {"model.arch.head_dim", NULL, "D: the width of a head (0: d_model / n_head)"},
    {"model.arch.qk_norm", NULL, "none, head (RMSNorm of each q and k head before RoPE) or "
                                "whole (of the whole q and k projections, OLMo 2)"},
    {"model.arch.norm_place", NULL, "pre (x + f(norm(x))), post (x + norm(f(x)), OLMo 2) or "
                                   "sandwich (x + norm(f(norm(x))), Gemma 2/3)"},
    {"model.arch.norm_offset", NULL, "Hugging Face norm weights are w of a norm scaling by 1 + w "
                                    "(Gemma): loom holds 1 + w; import / export convert"},
    {"model.arch.embed_scale", NULL, "the token embeddings times sqrt(d_model) (Gemma)"},
    {"model.arch.final_softcap", NULL, "final-logit soft-capping cap: logits = cap * tanh(logits "
                                      "/ cap) (0: none)"},
    {"model.arch.rope_type", NULL, "default, linear, llama3 or yarn (Hugging Face's rope_type)"},
    {"model.arch.rope_factor", NULL, "RoPE scaling factor (linear, llama3, yarn)"},
    {"model.arch.rope_low_freq_factor", NULL, "llama3 RoPE: low_freq_factor"},
    {"model.arch.rope_high_freq_factor", NULL, "llama3 RoPE: high_freq_factor"},
    {"model.arch.rope_original_max", NULL, "llama3 / yarn RoPE: original_max_position_embeddings"},
    {"model.arch.rope_beta_fast", NULL, "yarn RoPE: beta_fast (default 32)"},
    {"model.arch.rope_beta_slow", NULL, "yarn RoPE: beta_slow (default 1)"},
    {"model.arch.rope_attn_factor", NULL, "yarn RoPE: attention_factor (0: 0.1 ln(factor) + 1)"},
    {"model.arch.moe_renorm", NULL, "MoE: top-k gate weights renormalized to sum 1 (Mixtral, "
                                    "norm_topk_prob)"},
    {"model.arch.sliding_window", NULL, "sliding-window attention: a query sees the keys less "
                                        "than this many positions back (0: none)"},
    {"model.arch.window_start", NULL, "the first layer that slides (Qwen's max_window_layers; "
                                      "default 0)"},
    {"model.arch.window_period", NULL, "p > 1: of every p layers from window_start, p - 1 slide "
                                       "and the last attends fully (Gemma 2: 2, Gemma 3: 6); "
                                       "0 or 1: every one slides"},
    {"model.arch.rope_local_theta", NULL, "the sliding layers' RoPE base (default RoPE, no "
                                          "scaling; 0: as the full layers)"},
    {"model.arch.attn_softcap", NULL, "attention logit soft-capping: scores = cap * tanh(scores "
                                      "/ cap) (0: none)"},
    {"model.arch.query_pre_attn_scalar", NULL, "the attention scale is this^-0.5 (0: "
                                               "head_dim^-0.5)"},
    {"model.arch.family", NULL, "the Hugging Face architecture export --hf writes (default: the "
                                "flavor's, e.g. LlamaForCausalLM; imports set it)"},
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
    {"model.backend", "cpu", "the kernels' backend: cpu, or cpu-guard (the cpu kernels over "
                             "memory the host cannot touch, for tests); the environment's "
                             "LOOM_BACKEND overrides it (docs/engine.md \"Backends\")"},
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
    {"model.moe.shared_d_ff", "0", "the shared experts' feed-forward width (0 = model.d_ff)"},
    {"model.moe.shared_gate", "false", "each shared expert's output scaled per token by "
                                       "sigmoid(x . w), w (C) learned (Qwen2-MoE)"},
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

/* a model.arch.* key naming one of n choices (absent: *out unchanged) */
static int get_choice(const loom_config *c, const char *key, const char *const *names, int n,
                      int *out, loom_err *err) {
    const char *v;
    if (!loom_config_get(c, key)) return 0;
    if (loom_config_get_str(c, key, &v, err)) return -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) {
            *out = i;
            return 0;
        }
    return loom_errf(err, "config key '%s' = '%s' (%s): expected %s%s%s%s%s%s%s", key, v,
                     loom_config_origin(c, key), names[0], n > 1 ? " or " : "",
                     n > 1 ? names[1] : "", n > 2 ? ", " : "", n > 2 ? names[2] : "",
                     n > 3 ? ", " : "", n > 3 ? names[3] : "");
}
static int get_flag(const loom_config *c, const char *key, int *out, loom_err *err) {
    return loom_config_get(c, key) ? loom_config_get_bool(c, key, out, err) : 0;
}
static int get_opt_float(const loom_config *c, const char *key, float *out, int zero_ok,
                         loom_err *err) {
    double v;
    if (!loom_config_get(c, key)) return 0;
    if (loom_config_get_double(c, key, &v, err)) return -1;
    if (!(zero_ok ? v >= 0.0 : v > 0.0) || !(v < 1e30))
        return loom_errf(err, "config key '%s' = %g (%s) must be %s", key, v,
                         loom_config_origin(c, key), zero_ok ? ">= 0" : "positive");
    *out = (float)v;
    return 0;
}

static const char *const NORMS[] = {"layer", "rms"}, *const POSS[] = {"learned", "rope"},
                  *const MLPS[] = {"gelu", "swiglu", "geglu"},
                  *const QKN[] = {"none", "head", "whole"},
                  *const PLACES[] = {"pre", "post", "sandwich"},
                  *const ROPES[] = {"default", "linear", "llama3", "yarn"};

/* model.flavor and model.arch.* -> the descriptor */
static int arch_from(const loom_config *c, loom_model_config *out, loom_err *err) {
    const char *flavor;
    if (loom_config_get_str(c, "model.flavor", &flavor, err) != 0) return -1;
    const loom_arch *named = loom_arch_named(flavor);
    if (!named)
        return loom_errf(err, "config key 'model.flavor' = '%s' (%s): expected one of %s", flavor,
                         loom_config_origin(c, "model.flavor"), loom_arch_names());
    loom_arch *a = &out->arch;
    *a = *named;
    if (get_choice(c, "model.arch.norm", NORMS, 2, &a->norm, err) ||
        get_choice(c, "model.arch.pos", POSS, 2, &a->pos, err) ||
        get_choice(c, "model.arch.mlp", MLPS, 3, &a->mlp, err) ||
        get_choice(c, "model.arch.norm_place", PLACES, 3, &a->norm_place, err) ||
        get_flag(c, "model.arch.norm_offset", &a->norm_offset, err) ||
        get_flag(c, "model.arch.embed_scale", &a->embed_scale, err) ||
        get_opt_float(c, "model.arch.final_softcap", &a->final_softcap, 1, err) ||
        get_flag(c, "model.arch.qkv_bias", &a->qkv_bias, err) ||
        get_flag(c, "model.arch.o_bias", &a->o_bias, err) ||
        get_flag(c, "model.arch.mlp_bias", &a->mlp_bias, err) ||
        get_flag(c, "model.arch.tied", &a->tied, err) ||
        get_flag(c, "model.arch.moe_renorm", &a->moe_renorm, err) ||
        (loom_config_get(c, "model.arch.head_dim") &&
         get_int(c, "model.arch.head_dim", 0, 1 << 16, &a->head_dim, err)) ||
        get_choice(c, "model.arch.qk_norm", QKN, 3, &a->qk_norm, err) ||
        get_choice(c, "model.arch.rope_type", ROPES, 4, &a->rope_type, err) ||
        get_opt_float(c, "model.arch.rope_factor", &a->rope_factor, 0, err) ||
        get_opt_float(c, "model.arch.rope_low_freq_factor", &a->rope_low_freq, 0, err) ||
        get_opt_float(c, "model.arch.rope_high_freq_factor", &a->rope_high_freq, 0, err) ||
        (loom_config_get(c, "model.arch.rope_original_max") &&
         get_int(c, "model.arch.rope_original_max", 1, 1 << 30, &a->rope_orig_max, err)) ||
        get_opt_float(c, "model.arch.rope_beta_fast", &a->rope_beta_fast, 0, err) ||
        get_opt_float(c, "model.arch.rope_beta_slow", &a->rope_beta_slow, 0, err) ||
        get_opt_float(c, "model.arch.rope_attn_factor", &a->rope_attn_factor, 1, err) ||
        (loom_config_get(c, "model.arch.sliding_window") &&
         get_int(c, "model.arch.sliding_window", 0, 1 << 30, &a->sliding_window, err)) ||
        (loom_config_get(c, "model.arch.window_start") &&
         get_int(c, "model.arch.window_start", 0, 1 << 20, &a->window_start, err)) ||
        (loom_config_get(c, "model.arch.window_period") &&
         get_int(c, "model.arch.window_period", 0, 1 << 20, &a->window_period, err)) ||
        get_opt_float(c, "model.arch.rope_local_theta", &a->rope_local_theta, 1, err) ||
        get_opt_float(c, "model.arch.attn_softcap", &a->attn_softcap, 1, err) ||
        get_opt_float(c, "model.arch.query_pre_attn_scalar", &a->query_pre_attn_scalar, 1, err))
        return -1;
    const char *fam;
    if (loom_config_get(c, "model.arch.family")) {
        if (loom_config_get_str(c, "model.arch.family", &fam, err)) return -1;
        if (strlen(fam) >= sizeof a->family)
            return loom_errf(err, "config key 'model.arch.family' (%s) is longer than %zu bytes",
                             loom_config_origin(c, "model.arch.family"), sizeof a->family - 1);
        memset(a->family, 0, sizeof a->family);
        memcpy(a->family, fam, strlen(fam));
    }
    if (a->rope_type == LOOM_ROPE_YARN) { /* HF's defaults */
        if (!loom_config_get(c, "model.arch.rope_beta_fast")) a->rope_beta_fast = 32.0f;
        if (!loom_config_get(c, "model.arch.rope_beta_slow")) a->rope_beta_slow = 1.0f;
    }
    /* the built-in gpt2 / llama unchanged keep their flavor number (the older layout) */
    if ((named == loom_arch_named("gpt2") || named == loom_arch_named("llama")) &&
        !memcmp(a, named, sizeof *a))
        out->flavor = named == loom_arch_named("gpt2") ? LOOM_FLAVOR_GPT2 : LOOM_FLAVOR_LLAMA;
    else
        out->flavor = LOOM_FLAVOR_ARCH;
    return 0;
}

void loom_arch_config_set(loom_config *c, const loom_arch *a, const char *origin) {
    const loom_arch *n = loom_arch_named(a->name);
    LOOM_CHECK(n != NULL);
    char b[32];
    loom_config_set(c, "model.flavor", a->name, origin);
#define SET_CHOICE(key, f, names) \
    if (a->f != n->f) loom_config_set(c, key, names[a->f], origin)
#define SET_FLAG(key, f) \
    if (a->f != n->f) loom_config_set(c, key, a->f ? "true" : "false", origin)
#define SET_NUM(key, f, fmt)                                  \
    if (a->f != n->f) {                                       \
        snprintf(b, sizeof b, fmt, a->f);                     \
        loom_config_set(c, key, b, origin);                   \
    }
    SET_CHOICE("model.arch.norm", norm, NORMS);
    SET_CHOICE("model.arch.pos", pos, POSS);
    SET_CHOICE("model.arch.mlp", mlp, MLPS);
    SET_FLAG("model.arch.qkv_bias", qkv_bias);
    SET_FLAG("model.arch.o_bias", o_bias);
    SET_FLAG("model.arch.mlp_bias", mlp_bias);
    SET_FLAG("model.arch.tied", tied);
    SET_FLAG("model.arch.moe_renorm", moe_renorm);
    SET_NUM("model.arch.head_dim", head_dim, "%d");
    SET_CHOICE("model.arch.qk_norm", qk_norm, QKN);
    SET_CHOICE("model.arch.norm_place", norm_place, PLACES);
    SET_FLAG("model.arch.norm_offset", norm_offset);
    SET_FLAG("model.arch.embed_scale", embed_scale);
    SET_NUM("model.arch.final_softcap", final_softcap, "%.9g");
    SET_CHOICE("model.arch.rope_type", rope_type, ROPES);
    SET_NUM("model.arch.rope_factor", rope_factor, "%.9g");
    SET_NUM("model.arch.rope_low_freq_factor", rope_low_freq, "%.9g");
    SET_NUM("model.arch.rope_high_freq_factor", rope_high_freq, "%.9g");
    SET_NUM("model.arch.rope_original_max", rope_orig_max, "%d");
    SET_NUM("model.arch.rope_beta_fast", rope_beta_fast, "%.9g");
    SET_NUM("model.arch.rope_beta_slow", rope_beta_slow, "%.9g");
    SET_NUM("model.arch.rope_attn_factor", rope_attn_factor, "%.9g");
    SET_NUM("model.arch.sliding_window", sliding_window, "%d");
    SET_NUM("model.arch.window_start", window_start, "%d");
    SET_NUM("model.arch.window_period", window_period, "%d");
    SET_NUM("model.arch.rope_local_theta", rope_local_theta, "%.9g");
    SET_NUM("model.arch.attn_softcap", attn_softcap, "%.9g");
    SET_NUM("model.arch.query_pre_attn_scalar", query_pre_attn_scalar, "%.9g");
    if (a->family[0]) loom_config_set(c, "model.arch.family", a->family, origin);
#undef SET_CHOICE
#undef SET_FLAG
#undef SET_NUM
}

int loom_model_config_from(const loom_config *c, int default_seq_len, loom_model_config *out,
                           loom_err *err) {
    memset(out, 0, sizeof *out);
    if (arch_from(c, out, err)) return -1;
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
    /* the environment's LOOM_BACKEND overrides the key (the cpu-guard runs of the test suite:
     * docs/engine.md) */
    const char *env = getenv("LOOM_BACKEND");
    if (env && *env) {
        out->backend = loom_backend_find(env);
        if (!out->backend)
            return loom_errf(err, "environment variable LOOM_BACKEND = '%s': unknown backend "
                                  "(known: %s)", env, loom_backend_names());
    }
    if (loom_backend_ready(out->backend, err)) return -1;
    if (get_int(c, "model.moe.experts", 0, 1024, &out->n_expert, err) ||
        get_int(c, "model.moe.top_k", 1, 1024, &out->top_k, err) ||
        get_int(c, "model.moe.every", 1, 4096, &out->moe_every, err) ||
        get_int(c, "model.moe.shared_experts", 0, 64, &out->shared_experts, err) ||
        get_int(c, "model.moe.shared_d_ff", 0, 1 << 24, &out->shared_d_ff, err) ||
        loom_config_get_bool(c, "model.moe.shared_gate", &out->shared_gate, err) ||
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
        out->shared_d_ff = out->shared_gate = 0;
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
    /* the fields after arch are read with LOOM_FLAVOR_ARCH only (the older layouts end before) */
    if (out->shared_d_ff || out->shared_gate) out->flavor = LOOM_FLAVOR_ARCH;
    return 0;
}
