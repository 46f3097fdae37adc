/* Architecture descriptors (docs/architectures.md): the named ones, and what a descriptor
 * derives (RoPE's inverse frequencies). The block reads a descriptor's features; nothing in
 * src/model/ tests a family name. */
#include <math.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/model.h"
#include "model/model_internal.h"

#define GPT2_ARCH                                                                          \
    {.name = "gpt2", .norm = LOOM_NORM_LAYER, .pos = LOOM_POS_LEARNED, .mlp = LOOM_MLP_GELU, \
     .qkv_bias = 1, .o_bias = 1, .mlp_bias = 1, .tied = 1}
#define LLAMA_ARCH(n, ...) \
    {.name = n, .norm = LOOM_NORM_RMS, .pos = LOOM_POS_ROPE, .mlp = LOOM_MLP_SWIGLU, __VA_ARGS__}
#define GEMMA_ARCH(n, ...)                                                                      \
    {.name = n, .norm = LOOM_NORM_RMS, .pos = LOOM_POS_ROPE, .mlp = LOOM_MLP_GEGLU,             \
     .norm_place = LOOM_NORM_SANDWICH, .norm_offset = 1, .embed_scale = 1, .tied = 1, __VA_ARGS__}

/* LOOM_FLAVOR_GPT2 and LOOM_FLAVOR_LLAMA index the first two */
static const loom_arch NAMED[] = {
    GPT2_ARCH,
    LLAMA_ARCH("llama", .tied = 0),
    LLAMA_ARCH("qwen2", .qkv_bias = 1),                    /* Qwen 2 / 2.5: q, k, v biases */
    LLAMA_ARCH("qwen3", .qk_norm = LOOM_QK_NORM_HEAD),     /* per-head q/k RMSNorm */
    /* OLMo 2: post-norms (no pre-norms), q/k RMSNorm over the whole projections */
    LLAMA_ARCH("olmo2", .qk_norm = LOOM_QK_NORM_WHOLE, .norm_place = LOOM_NORM_POST),
    /* Gemma 2: sandwich norms stored as 1 + w, GeGLU, embeddings times sqrt(d_model), tied
     * (its windows, soft-caps and query_pre_attn_scalar are per-model keys: model.arch.*) */
    GEMMA_ARCH("gemma2"),
    /* Gemma 3: Gemma 2's block with per-head q/k RMSNorms (1 + w too) */
    GEMMA_ARCH("gemma3", .qk_norm = LOOM_QK_NORM_HEAD),
};
enum { N_NAMED = sizeof NAMED / sizeof NAMED[0] };

const loom_arch *loom_arch_named(const char *name) {
    for (int i = 0; i < N_NAMED; i++)
        if (!strcmp(NAMED[i].name, name)) return &NAMED[i];
    return NULL;
}

const char *loom_arch_names(void) { return "gpt2, llama, qwen2, qwen3, olmo2, gemma2, gemma3"; }

const loom_arch *loom_config_arch(const loom_model_config *c) {
    if (c->flavor == LOOM_FLAVOR_GPT2 || c->flavor == LOOM_FLAVOR_LLAMA) return &NAMED[c->flavor];
    return &c->arch;
}

int loom_config_head_dim(const loom_model_config *c) {
    const loom_arch *a = loom_config_arch(c);
    return a->head_dim > 0 ? a->head_dim : c->n_head > 0 ? c->d_model / c->n_head : 0;
}

int loom_config_layer_window(const loom_model_config *c, int l) {
    const loom_arch *a = loom_config_arch(c);
    if (a->sliding_window <= 0 || l < a->window_start) return 0;
    const int p = a->window_period > 1 ? a->window_period : 1;
    return p > 1 && (l - a->window_start) % p == p - 1 ? 0 : a->sliding_window;
}

/* the scores of layer l: its window, the scale of query_pre_attn_scalar (Python's
 * s ** -0.5 in double, then float32), the soft-cap */
void loom_model_attn_scores(const loom_model *m, int layer, loom_attn_mask *mask) {
    const loom_arch *a = &m->cfg.arch;
    mask->window = loom_config_layer_window(&m->cfg, layer);
    mask->scale = a->query_pre_attn_scalar > 0.0f
                      ? (float)(1.0 / sqrt((double)a->query_pre_attn_scalar))
                      : 0.0f;
    mask->softcap = a->attn_softcap;
}

int arch_check(const loom_model_config *c, loom_err *err) {
    const loom_arch *a = loom_config_arch(c);
    if (c->flavor < LOOM_FLAVOR_GPT2 || c->flavor > LOOM_FLAVOR_ARCH)
        return loom_errf(err, "model: unknown flavor %d", c->flavor);
    if (a->norm < LOOM_NORM_LAYER || a->norm > LOOM_NORM_RMS || a->pos < LOOM_POS_LEARNED ||
        a->pos > LOOM_POS_ROPE || a->mlp < LOOM_MLP_GELU || a->mlp > LOOM_MLP_GEGLU ||
        a->qk_norm < LOOM_QK_NORM_NONE || a->qk_norm > LOOM_QK_NORM_WHOLE ||
        a->norm_place < LOOM_NORM_PRE || a->norm_place > LOOM_NORM_SANDWICH ||
        a->rope_type < LOOM_ROPE_DEFAULT || a->rope_type > LOOM_ROPE_YARN || a->head_dim < 0)
        return loom_errf(err, "model: architecture '%.16s' has an unknown norm, positions, MLP, "
                              "q/k norm, norm placement or RoPE type", a->name);
    if (a->head_dim == 0 && c->n_head > 0 && c->d_model % c->n_head != 0)
        return loom_errf(err, "model: d_model (%d) is not divisible by n_head (%d) (or set "
                              "model.arch.head_dim)", c->d_model, c->n_head);
    const int D = loom_config_head_dim(c);
    if (a->pos == LOOM_POS_ROPE && D % 2 != 0)
        return loom_errf(err, "model: RoPE needs an even head dimension (%d)", D);
    if (a->pos == LOOM_POS_ROPE && !(c->rope_theta > 0.0f))
        return loom_errf(err, "model: rope_theta must be positive");
    if (a->rope_type != LOOM_ROPE_DEFAULT &&
        (a->pos != LOOM_POS_ROPE || !(a->rope_factor > 0.0f) || !isfinite(a->rope_factor)))
        return loom_errf(err, "model: a RoPE scaling (model.arch.rope_type) needs RoPE and a "
                              "positive model.arch.rope_factor");
    if (a->rope_type == LOOM_ROPE_LLAMA3 &&
        (a->rope_orig_max <= 0 || !(a->rope_high_freq > a->rope_low_freq) ||
         !(a->rope_low_freq > 0.0f)))
        return loom_errf(err, "model: llama3 RoPE needs rope_original_max > 0 and "
                              "0 < rope_low_freq_factor < rope_high_freq_factor");
    if (a->rope_type == LOOM_ROPE_YARN &&
        (a->rope_orig_max <= 0 || !(a->rope_beta_fast > 0.0f) || !(a->rope_beta_slow > 0.0f) ||
         !(a->rope_attn_factor >= 0.0f)))
        return loom_errf(err, "model: yarn RoPE needs rope_original_max > 0, positive "
                              "rope_beta_fast / rope_beta_slow and rope_attn_factor >= 0");
    if (a->norm == LOOM_NORM_LAYER && a->qk_norm != LOOM_QK_NORM_NONE)
        return loom_errf(err, "model: q/k norms are RMSNorms (model.arch.norm: rms)");
    if (a->sliding_window < 0 || a->window_start < 0 || a->window_period < 0)
        return loom_errf(err, "model: model.arch.sliding_window, window_start and window_period "
                              "must be >= 0");
    if (!(a->rope_local_theta >= 0.0f) || !isfinite(a->rope_local_theta) ||
        (a->rope_local_theta > 0.0f && a->pos != LOOM_POS_ROPE))
        return loom_errf(err, "model: model.arch.rope_local_theta (the sliding layers' RoPE "
                              "base) needs RoPE and a value >= 0");
    if (a->rope_local_theta > 0.0f && a->sliding_window == 0)
        return loom_errf(err, "model: model.arch.rope_local_theta is the sliding layers' RoPE "
                              "base: it needs model.arch.sliding_window");
    if (!(a->attn_softcap >= 0.0f) || !isfinite(a->attn_softcap))
        return loom_errf(err, "model: model.arch.attn_softcap must be >= 0 (0: none)");
    if (!(a->query_pre_attn_scalar >= 0.0f) || !isfinite(a->query_pre_attn_scalar))
        return loom_errf(err, "model: model.arch.query_pre_attn_scalar must be >= 0 (0: the "
                              "head width)");
    if (a->norm == LOOM_NORM_LAYER && a->norm_place != LOOM_NORM_PRE)
        return loom_errf(err, "model: post and sandwich norms (model.arch.norm_place) are "
                              "RMSNorms (model.arch.norm: rms)");
    if (a->norm_place != LOOM_NORM_PRE && c->n_expert > 0)
        return loom_errf(err, "model: post and sandwich norms (model.arch.norm_place) are not "
                              "supported with MoE layers (model.moe.experts > 0)");
    if (a->mlp == LOOM_MLP_GEGLU && c->n_expert > 0)
        return loom_errf(err, "model: GeGLU (model.arch.mlp: geglu) is not supported in MoE "
                              "layers (model.moe.experts > 0)");
    if (a->embed_scale && a->pos != LOOM_POS_ROPE)
        return loom_errf(err, "model: the embedding scale (model.arch.embed_scale) needs RoPE "
                              "positions (model.arch.pos: rope)");
    if (!(a->final_softcap >= 0.0f) || !isfinite(a->final_softcap))
        return loom_errf(err, "model: model.arch.final_softcap must be >= 0 (0: none)");
    if (a->final_softcap > 0.0f && c->head != LOOM_HEAD_LM)
        return loom_errf(err, "model: final-logit soft-capping (model.arch.final_softcap) needs "
                              "the lm head");
    return 0;
}

/* YaRN's helpers, as transformers computes them (Python floats: double) */
static double yarn_mscale(double scale) { return scale <= 1.0 ? 1.0 : 0.1 * log(scale) + 1.0; }
static double yarn_corr_dim(double rot, int dim, double base, double maxpos) {
    return ((double)dim * log(maxpos / (rot * 2.0 * M_PI))) / (2.0 * log(base));
}

float arch_rope_inv_freq(const loom_arch *a, float theta, int D, float *inv_freq) {
    const int half = D / 2;
    /* default: 1 / theta^(2i/D) in float32 (HF: base ** (arange(0, D, 2).float() / D)) */
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)D);
    switch (a->rope_type) {
    case LOOM_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv_freq[i] = inv_freq[i] / a->rope_factor;
        return 1.0f;
    case LOOM_ROPE_LLAMA3: { /* transformers _compute_llama3_parameters, in float32 */
        const float factor = a->rope_factor, lo = a->rope_low_freq, hi = a->rope_high_freq;
        const float old = (float)a->rope_orig_max;
        const float lo_wl = old / lo, hi_wl = old / hi;
        for (int i = 0; i < half; i++) {
            const float f = inv_freq[i], wl = (float)(2.0 * M_PI) / f;
            const float fl = wl > lo_wl ? f / factor : f;
            const float smooth = (old / wl - lo) / (hi - lo);
            const float smoothed = (1.0f - smooth) * fl / factor + smooth * fl;
            const int medium = !(wl < hi_wl) && !(wl > lo_wl);
            inv_freq[i] = medium ? smoothed : fl;
        }
        return 1.0f;
    }
    case LOOM_ROPE_YARN: { /* transformers _compute_yarn_parameters (truncate: true) */
        const double factor = a->rope_factor, base = theta;
        double lo = floor(yarn_corr_dim(a->rope_beta_fast, D, base, a->rope_orig_max));
        double hi = ceil(yarn_corr_dim(a->rope_beta_slow, D, base, a->rope_orig_max));
        if (lo < 0) lo = 0;
        if (hi > D - 1) hi = D - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            const float pos_freq = powf(theta, (float)(2 * i) / (float)D);
            const float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            const float ef = 1.0f - ramp; /* the extrapolation's share */
            inv_freq[i] = inter * (1.0f - ef) + extra * ef;
        }
        return a->rope_attn_factor > 0.0f ? a->rope_attn_factor : (float)yarn_mscale(factor);
    }
    default: return 1.0f;
    }
}
