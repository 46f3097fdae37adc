/* Hugging Face config.json <-> loom model configs (docs/hf-interop.md): the family table
 * (architecture name -> descriptor and the keys read), strict JSON with size limits, every
 * option loom cannot compute exactly an error naming the key. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>

#include "base/json_util.h"
#include "hf/hf_internal.h"
#include "loom/config.h"
#include "loom/hf.h"
#include "loom/lora.h"
#include "loom/model_config.h"
#include "loom/safetensors.h"

#define HF_MAX_JSON ((size_t)64 << 20)

/* ---- JSON keys: base's typed getters (src/base/json_util.h) --------------------------- */

/* an integer key in [lo, hi]; absent or null: dflt, or an error when required */
static int j_int(json_t *o, const char *path, const char *key, int required, int64_t dflt,
                 int64_t lo, int64_t hi, int *out, loom_err *err) {
    int64_t v;
    if (loom_json_int(o, path, "", key, required, dflt, lo, hi, &v, err)) return -1;
    *out = (int)v;
    return 0;
}

/* a positive finite number */
static int j_num(json_t *o, const char *path, const char *key, double dflt, double *out,
                 loom_err *err) {
    return loom_json_num(o, path, "", key, dflt, 0, 1, INFINITY, out, err);
}

static int j_bool(json_t *o, const char *path, const char *key, int dflt, int *out,
                  loom_err *err) {
    return loom_json_bool(o, path, "", key, dflt, out, err);
}

/* a string key (NULL when absent or null); a non-string is an error */
static int j_str(json_t *o, const char *path, const char *key, const char **out, loom_err *err) {
    return loom_json_str(o, path, "", key, out, err);
}

double hf_float_as_double(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}
#define float_as_double hf_float_as_double

/* ---- the family table ------------------------------------------------------------------ */
/* a row of a text model (no multimodal parts) */
#define TEXT_ROW(...) {__VA_ARGS__, NULL, {NULL, NULL}}
static const hf_family FAMILIES[] = {
    TEXT_ROW("GPT2LMHeadModel", "gpt2", "gpt2", "transformer.", HF_MAP_GPT2, 0, 0, HF_MOE_NONE),
    TEXT_ROW("LlamaForCausalLM", "llama", "llama", "model.", HF_MAP_LLAMA, 1, 0, HF_MOE_NONE),
    TEXT_ROW("MistralForCausalLM", "mistral", "llama", "model.", HF_MAP_LLAMA, 0, 1, HF_MOE_NONE),
    TEXT_ROW("Qwen2ForCausalLM", "qwen2", "qwen2", "model.", HF_MAP_LLAMA, 0, 1, HF_MOE_NONE),
    TEXT_ROW("Qwen3ForCausalLM", "qwen3", "qwen3", "model.", HF_MAP_LLAMA, 1, 1, HF_MOE_NONE),
    TEXT_ROW("Phi3ForCausalLM", "phi3", "llama", "model.", HF_MAP_PHI3, 0, 1, HF_MOE_NONE),
    TEXT_ROW("MixtralForCausalLM", "mixtral", "llama", "model.", HF_MAP_LLAMA, 0, 1, HF_MOE_MIXTRAL),
    TEXT_ROW("Qwen3MoeForCausalLM", "qwen3_moe", "qwen3", "model.", HF_MAP_LLAMA, 1, 1, HF_MOE_QWEN),
    TEXT_ROW("Qwen2MoeForCausalLM", "qwen2_moe", "qwen2", "model.", HF_MAP_LLAMA, 0, 1, HF_MOE_QWEN2),
    TEXT_ROW("Olmo2ForCausalLM", "olmo2", "olmo2", "model.", HF_MAP_LLAMA, 1, 0, HF_MOE_NONE),
    TEXT_ROW("Gemma2ForCausalLM", "gemma2", "gemma2", "model.", HF_MAP_LLAMA, 1, 1, HF_MOE_NONE),
    TEXT_ROW("Gemma3ForCausalLM", "gemma3_text", "gemma3", "model.", HF_MAP_LLAMA, 1, 1, HF_MOE_NONE),
    /* Gemma 3 4B / 12B / 27B: the language model of the image-text checkpoint */
    {"Gemma3ForConditionalGeneration", "gemma3", "gemma3", "language_model.model.",
     HF_MAP_LLAMA, 1, 1, HF_MOE_NONE, "Gemma3ForCausalLM",
     {"vision_tower.", "multi_modal_projector."}},
};
enum { N_FAMILIES = sizeof FAMILIES / sizeof FAMILIES[0] };

const hf_family *hf_family_find(const char *arch) {
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(FAMILIES[i].arch, arch)) return &FAMILIES[i];
    return NULL;
}

const char *hf_family_names(void) {
    return "GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
           "Qwen3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM, "
           "Qwen2MoeForCausalLM, Olmo2ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "
           "Gemma3ForConditionalGeneration (its language model)";
}

const hf_family *hf_family_of(const loom_model_config *c) {
    const loom_arch *a = loom_config_arch(c);
    if (a->family[0]) return hf_family_find(a->family);
    for (int i = 0; i < N_FAMILIES; i++) /* the first row of its descriptor */
        if (!strcmp(FAMILIES[i].descriptor, a->name)) return &FAMILIES[i];
    return NULL;
}

/* Qwen's families switch the window with use_sliding_window and slide from layer
 * max_window_layers on; Mistral's and Phi-3's slide on every layer (transformers 5.24) */
static int qwen_sliding(const hf_family *f) { return !strncmp(f->model_type, "qwen", 4); }

/* Gemma 2 / 3: layer_types (else the family's pattern) say which layers slide; their
 * attention scale, soft-caps and (Gemma 3) local RoPE base are config keys */
static int gemma_family(const hf_family *f) { return !strncmp(f->model_type, "gemma", 5); }
static int gemma3_family(const hf_family *f) { return !strncmp(f->model_type, "gemma3", 6); }

/* The families whose sliding windows loom imports (tested against transformers); the MoE rows
 * keep refusing a window that excludes a position (not tested) */
static int window_family(const hf_family *f) { return f->sliding_keys && !f->moe; }

int loom_hf_export_check(const loom_model_config *c, loom_err *err) {
    const loom_arch *a = loom_config_arch(c), *n = loom_arch_named(a->name);
    const hf_family *f = hf_family_of(c);
    if (!f || !n)
        return loom_errf(err, "architecture '%.16s' (family '%.32s') has no Hugging Face "
                              "layout loom exports to", a->name, a->family);
    /* what the family's config.json can say beyond its descriptor */
    const char *bad = NULL;
    if (a->norm != n->norm || a->pos != n->pos || a->mlp != n->mlp || a->qk_norm != n->qk_norm ||
        a->mlp_bias != n->mlp_bias)
        bad = "model.arch.norm / pos / mlp / qk_norm / mlp_bias";
    else if (a->norm_place != n->norm_place || a->norm_offset != n->norm_offset ||
             a->embed_scale != n->embed_scale ||
             (a->final_softcap != n->final_softcap && !gemma_family(f)))
        bad = "model.arch.norm_place / norm_offset / embed_scale / final_softcap";
    else if (f->map == HF_MAP_GPT2 &&
             (!a->tied || !a->qkv_bias || !a->o_bias || a->head_dim || a->rope_type))
        bad = "model.arch.tied / qkv_bias / o_bias / head_dim (GPT2LMHeadModel)";
    else if (f->map != HF_MAP_GPT2 && f->attn_bias_key && a->qkv_bias != a->o_bias)
        bad = "model.arch.qkv_bias != o_bias ('attention_bias' covers q, k, v and o)";
    else if (f->map != HF_MAP_GPT2 && !f->attn_bias_key &&
             ((a->qkv_bias != n->qkv_bias && f->moe != HF_MOE_QWEN2) || a->o_bias != n->o_bias))
        bad = "model.arch.qkv_bias / o_bias";
    else if (c->n_expert > 0 && !f->moe)
        bad = "model.moe.experts > 0 (a mixture-of-experts model exports as "
              "MixtralForCausalLM, Qwen3MoeForCausalLM or Qwen2MoeForCausalLM: "
              "model.arch.family)";
    else if (f->moe && (c->n_expert == 0 || c->moe_every > 1 ||
                        (f->moe == HF_MOE_MIXTRAL && !a->moe_renorm)))
        bad = "model.moe.experts / every / model.arch.moe_renorm";
    else if (f->moe && f->moe != HF_MOE_QWEN2 && (c->shared_experts > 0 || c->shared_gate))
        bad = "model.moe.shared_experts / shared_gate (Qwen2MoeForCausalLM has a gated one)";
    else if (f->moe == HF_MOE_QWEN2 && (c->shared_experts != 1 || !c->shared_gate))
        bad = "model.moe.shared_experts != 1 or shared_gate false (Qwen2MoeForCausalLM has one "
              "gated shared expert)";
    else if ((a->attn_softcap > 0.0f || a->query_pre_attn_scalar > 0.0f ||
              a->rope_local_theta > 0.0f) && !gemma_family(f))
        bad = "model.arch.attn_softcap / query_pre_attn_scalar / rope_local_theta (Gemma's)";
    else if (a->rope_local_theta > 0.0f && !gemma3_family(f))
        bad = "model.arch.rope_local_theta (Gemma 3's rope_parameters.sliding_attention)";
    else if (a->sliding_window > 0 &&
             (!window_family(f) || (!qwen_sliding(f) && !gemma_family(f) &&
                                    (a->window_period > 1 || a->window_start > 0))))
        bad = "model.arch.sliding_window / window_start / window_period (Mistral and Phi-3 slide "
              "every layer; Qwen 2/3 and Gemma take any layer_types)";
    if (bad)
        return loom_errf(err, "%s: this combination has no %s layout", bad, f->arch);
    return 0;
}

/* ---- config.json ----------------------------------------------------------------------- */
int loom_hf_is_dir(const char *dir) {
    char p[4200];
    if (loom_path_fmt(p, sizeof p, NULL, "%s/config.json", dir)) return 0;
    if (!loom_path_exists(p)) return 0;
    loom_pathf(p, sizeof p, "%s/COMPLETE", dir);
    return !loom_path_exists(p);
}

/* a number key inside an object (absent or null: dflt); lo: the exclusive lower bound */
static int j_float(json_t *o, const char *path, const char *obj, const char *key, double dflt,
                   double lo, float *out, loom_err *err) {
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s%s", obj ? obj : "", obj ? "." : "");
    double v;
    if (loom_json_num(o, path, prefix, key, dflt, lo, 1, INFINITY, &v, err)) return -1;
    *out = (float)v;
    return 0;
}

/* RoPE: transformers 5 keeps it under rope_parameters; older files use rope_theta and
 * rope_scaling. rope_type default / linear / llama3 / yarn; any other (dynamic, longrope)
 * is an error naming the key. */
static int read_rope(json_t *o, const char *path, int max_pos, loom_model_config *mc,
                     const char *as, loom_err *err) {
    loom_arch *a = &mc->arch;
    double theta = 10000.0;
    if (j_num(o, path, "rope_theta", 10000.0, &theta, err)) return -1;
    static const char *const rope_keys[] = {"rope_parameters", "rope_scaling"};
    for (int k = 0; k < 2; k++) {
        json_t *rp = json_object_get(o, rope_keys[k]);
        /* as: the key named in errors for rope_parameters (a part of Gemma 3's) */
        const char *rk = as && k == 0 ? as : rope_keys[k];
        if (!rp || json_is_null(rp)) continue;
        if (!json_is_object(rp)) return loom_errf(err, "%s: '%s' must be an object", path, rk);
        const char *type = json_string_value(json_object_get(rp, "rope_type"));
        if (!type) type = json_string_value(json_object_get(rp, "type"));
        if (!type) type = "default";
        if (json_object_get(rp, "rope_theta") &&
            j_num(rp, path, "rope_theta", 10000.0, &theta, err))
            return -1;
        float prf = 1.0f;
        if (j_float(rp, path, rk, "partial_rotary_factor", 1.0, 0.0, &prf, err)) return -1;
        if (prf != 1.0f)
            return loom_errf(err, "%s: '%s.partial_rotary_factor' is %g; loom rotates the whole "
                                  "head (1.0)", path, rk, (double)prf);
        if (!strcmp(type, "default")) continue;
        int orig = 0;
        if (j_int(rp, path, "original_max_position_embeddings", 0, max_pos, 1, 1 << 30, &orig,
                  err))
            return -1;
        if (!strcmp(type, "linear")) {
            a->rope_type = LOOM_ROPE_LINEAR;
            if (j_float(rp, path, rk, "factor", 1.0, 0.0, &a->rope_factor, err)) return -1;
        } else if (!strcmp(type, "llama3")) {
            a->rope_type = LOOM_ROPE_LLAMA3;
            a->rope_orig_max = orig;
            if (j_float(rp, path, rk, "factor", 8.0, 0.0, &a->rope_factor, err) ||
                j_float(rp, path, rk, "low_freq_factor", 1.0, 0.0, &a->rope_low_freq, err) ||
                j_float(rp, path, rk, "high_freq_factor", 4.0, 0.0, &a->rope_high_freq, err))
                return -1;
        } else if (!strcmp(type, "yarn")) {
            a->rope_type = LOOM_ROPE_YARN;
            a->rope_orig_max = orig;
            float ms = 0.0f, msa = 0.0f;
            int trunc = 1;
            if (j_float(rp, path, rk, "factor", (double)max_pos / orig, 0.0, &a->rope_factor,
                        err) ||
                j_float(rp, path, rk, "beta_fast", 32.0, 0.0, &a->rope_beta_fast, err) ||
                j_float(rp, path, rk, "beta_slow", 1.0, 0.0, &a->rope_beta_slow, err) ||
                j_float(rp, path, rk, "attention_factor", 0.0, -1.0, &a->rope_attn_factor, err) ||
                j_float(rp, path, rk, "mscale", 0.0, -1.0, &ms, err) ||
                j_float(rp, path, rk, "mscale_all_dim", 0.0, -1.0, &msa, err) ||
                j_bool(rp, path, "truncate", 1, &trunc, err))
                return -1;
            if (!trunc)
                return loom_errf(err, "%s: '%s.truncate' is false; loom computes YaRN's "
                                      "truncated correction range", path, rk);
            if (a->rope_attn_factor == 0.0f && ms > 0.0f && msa > 0.0f) {
                const double f = a->rope_factor;
                const double num = f <= 1 ? 1.0 : 0.1 * ms * log(f) + 1.0;
                const double den = f <= 1 ? 1.0 : 0.1 * msa * log(f) + 1.0;
                a->rope_attn_factor = (float)(num / den);
            }
        } else {
            return loom_errf(err, "%s: '%s.rope_type' is '%.40s'; loom computes default, "
                                  "linear, llama3 and yarn RoPE", path, rk, type);
        }
    }
    mc->rope_theta = (float)theta;
    return 0;
}

/* The sliding-window keys -> arch.sliding_window / window_start / window_period. Which layers
 * slide: transformers' layer_types when the file has them, else what its config derives
 * (every layer; Qwen: layers >= max_window_layers, only with use_sliding_window). The list
 * must be one loom represents: every layer from some start, or p - 1 of every p from some
 * start; else an error naming layer_types. */
static int read_sliding(json_t *o, const char *path, const hf_family *f, loom_model_config *mc,
                        loom_err *err) {
    int win = 0, use = 1, mwl = 0, pat = 2; /* max_window_layers: transformers' default 28 */
    const int qwen = qwen_sliding(f), L = mc->n_layer, max_pos = mc->max_seq_len;
    const int gemma = gemma_family(f); /* pattern: p - 1 of every p layers slide */
    if (j_int(o, path, "sliding_window", 0, gemma ? 4096 : 0, 0, 1 << 30, &win, err) ||
        (qwen && j_bool(o, path, "use_sliding_window", 0, &use, err)) ||
        (qwen && j_int(o, path, "max_window_layers", 0, 28, 0, 1 << 20, &mwl, err)) ||
        (gemma && j_int(o, path, "sliding_window_pattern", 0, gemma3_family(f) ? 6 : 2, 1,
                        1 << 20, &pat, err)))
        return -1;
    if (!use) win = 0; /* transformers: sliding_window = None without use_sliding_window */
    if (win >= max_pos && !window_family(f)) win = 0; /* it excludes nothing: full attention */
    if (win > 0 && win < max_pos && !window_family(f))
        return loom_errf(err, "%s: 'sliding_window' is %d < max_position_embeddings %d; loom "
                              "imports sliding windows for MistralForCausalLM, Qwen2/Qwen3 and "
                              "Phi3ForCausalLM only (set it to null or >= %d to import as full "
                              "attention)", path, win, max_pos, max_pos);
    char *slides = loom_calloc((size_t)L + 1, 1);
    for (int l = 0; l < L; l++)
        slides[l] = win > 0 && (gemma ? (l + 1) % pat != 0 : !qwen || l >= mwl);
    json_t *lt = json_object_get(o, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)L) {
            free(slides);
            return loom_errf(err, "%s: 'layer_types' must be a list of num_hidden_layers (%d) "
                                  "strings", path, L);
        }
        for (int l = 0; l < L; l++) {
            const char *t = json_string_value(json_array_get(lt, (size_t)l));
            const int full = t && !strcmp(t, "full_attention");
            const int sl = t && !strcmp(t, "sliding_attention");
            /* Mistral's and Phi-3's models read sliding_window on every layer whatever the
             * list says: a list that disagrees is refused; without a window (null, or Qwen's
             * use_sliding_window false) a sliding_attention layer attends fully */
            const int want = qwen || gemma ? sl && win > 0 : slides[l];
            if (!full && !sl) {
                free(slides);
                return loom_errf(err, "%s: 'layer_types[%d]' is '%.40s'; loom computes "
                                      "full_attention and sliding_attention layers", path, l,
                                 t ? t : "(not a string)");
            }
            if (!qwen && !gemma && win > 0 && sl != slides[l]) {
                free(slides);
                return loom_errf(err, "%s: 'layer_types[%d]' is '%s' but %s slides every layer "
                                      "when 'sliding_window' is set", path, l, t, f->arch);
            }
            slides[l] = (char)want;
        }
    }
    loom_arch *a = &mc->arch;
    a->sliding_window = a->window_start = a->window_period = 0;
    int any = 0;
    for (int l = 0; l < L; l++) any |= slides[l];
    if (any) { /* the first (start, period) whose pattern is the list */
        int found = 0;
        loom_model_config t = *mc; /* (mc's flavor is set after the keys are read) */
        t.flavor = LOOM_FLAVOR_ARCH;
        for (int s = 0; s < L && !found; s++)
            for (int p = 1; p <= L && !found; p++) {
                t.arch.sliding_window = win;
                t.arch.window_start = s;
                t.arch.window_period = p > 1 ? p : 0;
                int same = 1;
                for (int l = 0; l < L && same; l++)
                    same = (loom_config_layer_window(&t, l) > 0) == (slides[l] != 0);
                found = same;
            }
        if (found) {
            a->sliding_window = win;
            a->window_start = t.arch.window_start;
            a->window_period = t.arch.window_period;
        }
        if (!found) {
            free(slides);
            return loom_errf(err, "%s: 'layer_types' has sliding layers in a pattern loom does "
                                  "not represent (every layer from one on, or p - 1 of every p)",
                             path);
        }
    }
    free(slides);
    return 0;
}

/* the MoE keys: every layer MoE, dropless, no router losses (transformers adds its balance
 * loss only with output_router_logits, which is refused: loom's is normalized differently) */
static int read_moe(json_t *o, const char *path, const hf_family *f, loom_model_config *mc,
                    loom_err *err) {
    const int mix = f->moe == HF_MOE_MIXTRAL;
    int out_logits = 0, renorm = 1, step = 1;
    float jitter = 0.0f;
    /* transformers 5 writes num_local_experts for both; older Qwen files num_experts */
    const char *ne = json_object_get(o, "num_local_experts") || mix ? "num_local_experts"
                                                                    : "num_experts";
    if (j_int(o, path, ne, 1, 0, 1, 1024, &mc->n_expert, err) ||
        j_int(o, path, "num_experts_per_tok", 0, 2, 1, 1024, &mc->top_k, err) ||
        j_bool(o, path, "output_router_logits", 0, &out_logits, err) ||
        j_float(o, path, NULL, "router_jitter_noise", 0.0, -1.0, &jitter, err))
        return -1;
    if (!mix &&
        (j_int(o, path, "moe_intermediate_size", 1, 0, 1, 1 << 24, &mc->d_ff, err) ||
         j_bool(o, path, "norm_topk_prob", 0, &renorm, err) ||
         j_int(o, path, "decoder_sparse_step", 0, 1, 1, 4096, &step, err)))
        return -1;
    if (f->moe == HF_MOE_QWEN2) { /* one shared expert of its own width, sigmoid-gated */
        if (j_int(o, path, "shared_expert_intermediate_size", 1, 0, 1, 1 << 24,
                  &mc->shared_d_ff, err))
            return -1;
        mc->shared_experts = 1;
        mc->shared_gate = 1;
    }
    if (mc->top_k > mc->n_expert)
        return loom_errf(err, "%s: 'num_experts_per_tok' %d exceeds the %d experts", path,
                         mc->top_k, mc->n_expert);
    if (out_logits)
        return loom_errf(err, "%s: 'output_router_logits' is true; loom's load-balancing loss "
                              "(model.moe.aux_loss_coef) is not transformers' (import with "
                              "false and set loom's keys)", path);
    if (jitter != 0.0f)
        return loom_errf(err, "%s: 'router_jitter_noise' is %g; loom's router has no jitter",
                         path, (double)jitter);
    json_t *mlp_only = json_object_get(o, "mlp_only_layers");
    if (step != 1 || (mlp_only && !json_is_null(mlp_only) &&
                      (!json_is_array(mlp_only) || json_array_size(mlp_only) > 0)))
        return loom_errf(err, "%s: '%s' makes some layers dense; loom imports models whose "
                              "every layer is MoE", path,
                         step != 1 ? "decoder_sparse_step" : "mlp_only_layers");
    mc->arch.moe_renorm = renorm;
    mc->moe_every = 1;
    mc->capacity_factor = mc->aux_loss_coef = mc->z_loss_coef = 0.0f;
    return 0;
}

static int read_gpt2(json_t *o, const char *path, loom_model_config *mc, loom_err *err) {
    const int64_t big = 1 << 24;
    int n_pos = 0, n_ctx = 0, tie = 1, scale = 1, by_layer = 0, cross = 0;
    const char *act;
    double eps = 1e-5;
    if (j_int(o, path, "vocab_size", 1, 0, 1, big, &mc->vocab_size, err) ||
        j_int(o, path, "n_embd", 1, 0, 1, big, &mc->d_model, err) ||
        j_int(o, path, "n_layer", 1, 0, 1, 4096, &mc->n_layer, err) ||
        j_int(o, path, "n_head", 1, 0, 1, 4096, &mc->n_head, err) ||
        j_int(o, path, "n_ctx", 0, 0, 1, big, &n_ctx, err) ||
        j_int(o, path, "n_positions", n_ctx == 0, n_ctx, 1, big, &n_pos, err) ||
        j_int(o, path, "n_inner", 0, 4 * (int64_t)mc->d_model, 1, big, &mc->d_ff, err) ||
        j_num(o, path, "layer_norm_epsilon", 1e-5, &eps, err) ||
        j_str(o, path, "activation_function", &act, err) ||
        j_bool(o, path, "tie_word_embeddings", 1, &tie, err) ||
        j_bool(o, path, "scale_attn_weights", 1, &scale, err) ||
        j_bool(o, path, "scale_attn_by_inverse_layer_idx", 0, &by_layer, err) ||
        j_bool(o, path, "add_cross_attention", 0, &cross, err))
        return -1;
    mc->max_seq_len = n_pos;
    mc->n_kv_head = mc->n_head;
    mc->norm_eps = (float)eps;
    if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
        return loom_errf(err, "%s: 'activation_function' is '%s'; loom's GPT-2 computes gelu_new "
                              "(the tanh approximation)", path, act);
    if (!tie)
        return loom_errf(err, "%s: 'tie_word_embeddings' is false; loom's GPT-2 ties the head to "
                              "wte", path);
    if (!scale || by_layer || cross)
        return loom_errf(err, "%s: '%s' is not supported (loom's GPT-2 scales attention by "
                              "1/sqrt(head_dim) and has no cross-attention)", path,
                         !scale ? "scale_attn_weights: false"
                                : by_layer ? "scale_attn_by_inverse_layer_idx: true"
                                           : "add_cross_attention: true");
    return 0;
}

/* Gemma 2 / 3's keys beyond Llama's: the GeGLU activation, the attention scale and soft-caps,
 * and RoPE (Gemma 3: rope_parameters per layer type, or the older rope_theta /
 * rope_local_base_freq / rope_scaling keys; the sliding layers' RoPE is default) */
static int read_gemma(json_t *o, const char *path, const hf_family *f, loom_model_config *mc,
                      loom_err *err) {
    loom_arch *a = &mc->arch;
    const char *act = NULL, *key = "hidden_activation";
    int bidir = 0;
    double qpas = 256.0;
    const int g3 = gemma3_family(f);
    if (j_str(o, path, key, &act, err)) return -1;
    if (!act) { /* older files: hidden_act */
        key = "hidden_act";
        if (j_str(o, path, key, &act, err)) return -1;
    }
    if (act && strcmp(act, "gelu_pytorch_tanh") != 0)
        return loom_errf(err, "%s: '%s' is '%s'; loom computes %s's GeGLU with "
                              "gelu_pytorch_tanh", path, key, act, f->arch);
    if (j_num(o, path, "query_pre_attn_scalar", 256.0, &qpas, err) ||
        j_float(o, path, NULL, "attn_logit_softcapping", g3 ? 0.0 : 50.0, -1.0,
                &a->attn_softcap, err) ||
        j_float(o, path, NULL, "final_logit_softcapping", g3 ? 0.0 : 30.0, -1.0,
                &a->final_softcap, err) ||
        j_bool(o, path, "use_bidirectional_attention", 0, &bidir, err))
        return -1;
    if (!(qpas > 0.0) || !isfinite(qpas))
        return loom_errf(err, "%s: 'query_pre_attn_scalar' must be a positive number", path);
    if (bidir)
        return loom_errf(err, "%s: 'use_bidirectional_attention' is true; loom's attention is "
                              "causal", path);
    if (a->attn_softcap < 0.0f || a->final_softcap < 0.0f)
        return loom_errf(err, "%s: 'attn_logit_softcapping' and 'final_logit_softcapping' must "
                              "be positive or null", path);
    a->query_pre_attn_scalar = (float)qpas;
    if (!g3) return read_rope(o, path, mc->max_seq_len, mc, NULL, err);
    json_t *rp = json_object_get(o, "rope_parameters");
    json_t *full = json_is_object(rp) ? json_object_get(rp, "full_attention") : NULL;
    json_t *slide = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
    if (!full && !slide) { /* older files: rope_theta, rope_scaling, rope_local_base_freq */
        double local = 10000.0;
        if (j_num(o, path, "rope_local_base_freq", 10000.0, &local, err) ||
            read_rope(o, path, mc->max_seq_len, mc, NULL, err))
            return -1;
        a->rope_local_theta = (float)local;
        return 0;
    }
    if (!json_is_object(full) || !json_is_object(slide))
        return loom_errf(err, "%s: 'rope_parameters' must hold the objects 'full_attention' and "
                              "'sliding_attention'", path);
    const char *st = json_string_value(json_object_get(slide, "rope_type"));
    if (st && strcmp(st, "default") != 0)
        return loom_errf(err, "%s: 'rope_parameters.sliding_attention.rope_type' is '%.40s'; "
                              "loom's sliding layers compute default RoPE", path, st);
    double local = 10000.0;
    if (j_num(slide, path, "rope_theta", 10000.0, &local, err)) return -1;
    json_t *w = json_pack("{s:O}", "rope_parameters", full);
    LOOM_CHECK(w != NULL);
    const int rc = read_rope(w, path, mc->max_seq_len, mc, "rope_parameters.full_attention", err);
    json_decref(w);
    if (rc) return -1;
    a->rope_local_theta = (float)local;
    return 0;
}

/* Llama and the families that share its layout (Mistral, Qwen 2/3, Phi-3, OLMo 2, Gemma) */
static int read_llama(json_t *o, const char *path, const hf_family *f, loom_model_config *mc,
                      loom_err *err) {
    const int64_t big = 1 << 24;
    loom_arch *a = &mc->arch;
    int attn_bias = 0, mlp_bias = 0, head_dim = 0;
    const char *act;
    double eps = 1e-5;
    if (j_int(o, path, "vocab_size", 1, 0, 1, big, &mc->vocab_size, err) ||
        j_int(o, path, "hidden_size", 1, 0, 1, big, &mc->d_model, err) ||
        j_int(o, path, "intermediate_size", 1, 0, 1, big, &mc->d_ff, err) ||
        j_int(o, path, "num_hidden_layers", 1, 0, 1, 4096, &mc->n_layer, err) ||
        j_int(o, path, "num_attention_heads", 1, 0, 1, 4096, &mc->n_head, err) ||
        j_int(o, path, "num_key_value_heads", 0, mc->n_head, 1, 4096, &mc->n_kv_head, err) ||
        j_int(o, path, "max_position_embeddings", 1, 0, 1, big, &mc->max_seq_len, err) ||
        j_int(o, path, "head_dim", 0, 0, 1, 1 << 16, &head_dim, err) ||
        j_num(o, path, "rms_norm_eps", 1e-6, &eps, err) ||
        j_str(o, path, "hidden_act", &act, err) ||
        (f->attn_bias_key && j_bool(o, path, "attention_bias", 0, &attn_bias, err)) ||
        j_bool(o, path, "mlp_bias", 0, &mlp_bias, err) ||
        j_bool(o, path, "tie_word_embeddings", gemma_family(f), &a->tied, err))
        return -1;
    if (!f->attn_bias_key && json_is_true(json_object_get(o, "attention_bias")))
        return loom_errf(err, "%s: 'attention_bias' is true; %s has no attention biases in "
                              "transformers", path, f->arch);
    if (gemma_family(f)) {
        if (read_gemma(o, path, f, mc, err)) return -1;
    } else if (read_rope(o, path, mc->max_seq_len, mc, NULL, err)) {
        return -1;
    }
    if (f->moe && read_moe(o, path, f, mc, err)) return -1;
    if (f->moe == HF_MOE_QWEN2) { /* 'qkv_bias' (default true) switches q/k/v biases */
        int qkv_bias = 1;
        if (j_bool(o, path, "qkv_bias", 1, &qkv_bias, err)) return -1;
        a->qkv_bias = qkv_bias;
    }
    if (f->sliding_keys && read_sliding(o, path, f, mc, err)) return -1;
    mc->norm_eps = (float)eps;
    if (act && strcmp(act, "silu") != 0 && !gemma_family(f))
        return loom_errf(err, "%s: 'hidden_act' is '%s'; loom computes SwiGLU with silu for %s",
                         path, act, f->arch);
    if (mlp_bias)
        return loom_errf(err, "%s: 'mlp_bias' is true; loom's gated MLP has no biases", path);
    if (attn_bias) a->qkv_bias = a->o_bias = 1;
    if (head_dim && (int64_t)head_dim * mc->n_head != mc->d_model) a->head_dim = head_dim;
    if (!head_dim && mc->d_model % mc->n_head != 0)
        return loom_errf(err, "%s: hidden_size %d is not a multiple of num_attention_heads %d "
                              "and no 'head_dim' is given", path, mc->d_model, mc->n_head);
    if (mc->n_head % mc->n_kv_head != 0)
        return loom_errf(err, "%s: num_attention_heads %d is not a multiple of "
                              "num_key_value_heads %d", path, mc->n_head, mc->n_kv_head);
    return 0;
}

int hf_read_config(const char *dir, hf_cfg *hc, loom_err *err) {
    char path[4200];
    json_t *o = NULL;
    int rc = -1;
    memset(hc, 0, sizeof *hc);
    if (loom_path_fmt(path, sizeof path, err, "%s/config.json", dir)) return -1;
    if (loom_json_object_file(path, HF_MAX_JSON, &o, err)) return -1;
    const char *arch = NULL, *model_type = NULL;
    json_t *archs = json_object_get(o, "architectures");
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs) || json_array_size(archs) != 1 ||
            !json_is_string(json_array_get(archs, 0))) {
            loom_errf(err, "%s: 'architectures' must be a list of one architecture name", path);
            goto done;
        }
        arch = json_string_value(json_array_get(archs, 0));
    }
    if (j_str(o, path, "model_type", &model_type, err)) goto done;
    const hf_family *f = arch ? hf_family_find(arch) : NULL;
    for (int i = 0; !arch && model_type && i < N_FAMILIES; i++)
        if (!strcmp(FAMILIES[i].model_type, model_type)) f = &FAMILIES[i];
    if (!arch && !f) {
        loom_errf(err, "%s: no 'architectures' (and model_type '%s'): loom imports %s", path,
                  model_type ? model_type : "(missing)", hf_family_names());
        goto done;
    }
    if (!f) {
        loom_errf(err, "%s: architecture '%.100s' is not supported (loom imports %s)", path, arch,
                  hf_family_names());
        goto done;
    }
    hc->fam = f;
    loom_model_config *mc = &hc->mc;
    mc->head = LOOM_HEAD_LM;
    mc->init_std = 0.02f;
    mc->rope_theta = 10000.0f;
    mc->arch = *loom_arch_named(f->descriptor);
    json_t *keys = o; /* a multimodal model's language model: its text_config */
    if (f->as_text) {
        keys = json_object_get(o, "text_config");
        if (!json_is_object(keys)) {
            loom_errf(err, "%s: '%s' needs a 'text_config' object (its language model)", path,
                      f->arch);
            goto done;
        }
        if (!json_object_get(keys, "tie_word_embeddings") &&
            json_object_get(o, "tie_word_embeddings")) /* said at the top level */
            json_object_set(keys, "tie_word_embeddings", json_object_get(o, "tie_word_embeddings"));
    }
    if (f->map == HF_MAP_GPT2 ? read_gpt2(keys, path, mc, err)
                              : read_llama(keys, path, f, mc, err))
        goto done;
    /* transformers' Gemma3ForConditionalGeneration never applies text_config's
     * final_logit_softcapping (its Gemma3ForCausalLM does): what the model computes */
    if (f->as_text) mc->arch.final_softcap = 0.0f;
    /* the family it exports back as, when its descriptor's first row is another one */
    mc->flavor = LOOM_FLAVOR_ARCH;
    const char *as = f->as_text ? f->as_text : f->arch;
    if (hf_family_of(mc) != hf_family_find(as))
        snprintf(mc->arch.family, sizeof mc->arch.family, "%s", as);
    const loom_arch *named = loom_arch_named(f->descriptor);
    if (!memcmp(&mc->arch, named, sizeof *named))
        mc->flavor = !strcmp(named->name, "gpt2") ? LOOM_FLAVOR_GPT2
                     : !strcmp(named->name, "llama") ? LOOM_FLAVOR_LLAMA : LOOM_FLAVOR_ARCH;
    if (mc->shared_d_ff || mc->shared_gate) mc->flavor = LOOM_FLAVOR_ARCH; /* read after arch */
    rc = 0;
done:
    json_decref(o);
    return rc;
}

int loom_hf_read_config(const char *dir, loom_model_config *mc, const char **arch,
                        loom_err *err) {
    hf_cfg hc;
    if (hf_read_config(dir, &hc, err)) return -1;
    *mc = hc.mc;
    if (arch) *arch = hc.fam->arch;
    return 0;
}

/* ---- import: config.yaml's model keys --------------------------------------------------- */
static void cfg_set_int(loom_config *c, const char *key, int v) {
    char b[32];
    snprintf(b, sizeof b, "%d", v);
    loom_config_set(c, key, b, "hf import");
}

static void cfg_set_float(loom_config *c, const char *key, float v) {
    char b[32];
    snprintf(b, sizeof b, "%.9g", float_as_double(v));
    loom_config_set(c, key, b, "hf import");
}

void loom_hf_config_set(loom_config *c, const loom_model_config *mc) {
    loom_arch_config_set(c, loom_config_arch(mc), "hf import");
    cfg_set_int(c, "model.vocab_size", mc->vocab_size);
    cfg_set_int(c, "model.d_model", mc->d_model);
    cfg_set_int(c, "model.n_layer", mc->n_layer);
    cfg_set_int(c, "model.n_head", mc->n_head);
    cfg_set_int(c, "model.n_kv_head", mc->n_kv_head);
    cfg_set_int(c, "model.d_ff", mc->d_ff);
    cfg_set_int(c, "model.max_seq_len", mc->max_seq_len);
    cfg_set_float(c, "model.norm_eps", mc->norm_eps);
    cfg_set_float(c, "model.rope_theta", mc->rope_theta);
    if (mc->n_expert > 0) { /* dropless, no router losses: transformers' defaults */
        cfg_set_int(c, "model.moe.experts", mc->n_expert);
        cfg_set_int(c, "model.moe.top_k", mc->top_k);
        cfg_set_int(c, "model.moe.every", 1);
        loom_config_set(c, "model.moe.capacity_factor", "0", "hf import");
        loom_config_set(c, "model.moe.aux_loss_coef", "0", "hf import");
        loom_config_set(c, "model.moe.z_loss_coef", "0", "hf import");
        if (mc->shared_experts > 0) {
            cfg_set_int(c, "model.moe.shared_experts", mc->shared_experts);
            cfg_set_int(c, "model.moe.shared_d_ff", mc->shared_d_ff);
            loom_config_set(c, "model.moe.shared_gate", mc->shared_gate ? "true" : "false",
                            "hf import");
        }
    }
}

/* ---- export: config.json ---------------------------------------------------------------- */
int hf_write_json(const char *dir, const char *name, json_t *o, loom_err *err) {
    char path[4400];
    if (loom_path_fmt(path, sizeof path, err, "%s/%s", dir, name)) {
        json_decref(o);
        return -1;
    }
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(o);
    LOOM_CHECK(s != NULL);
    size_t n = strlen(s);
    s = loom_realloc(s, n + 2);
    s[n++] = '\n';
    int rc = loom_write_file_atomic(path, s, n, err);
    free(s);
    return rc;
}

static json_t *rope_json(const loom_model_config *c) {
    const loom_arch *a = loom_config_arch(c);
    static const char *const types[] = {"default", "linear", "llama3", "yarn"};
    json_t *r = json_pack("{s:s, s:f}", "rope_type", types[a->rope_type], "rope_theta",
                          float_as_double(c->rope_theta));
    if (a->rope_type != LOOM_ROPE_DEFAULT)
        json_object_set_new(r, "factor", json_real(float_as_double(a->rope_factor)));
    if (a->rope_type == LOOM_ROPE_LLAMA3) {
        json_object_set_new(r, "low_freq_factor", json_real(float_as_double(a->rope_low_freq)));
        json_object_set_new(r, "high_freq_factor", json_real(float_as_double(a->rope_high_freq)));
    }
    if (a->rope_type == LOOM_ROPE_YARN) {
        json_object_set_new(r, "beta_fast", json_real(float_as_double(a->rope_beta_fast)));
        json_object_set_new(r, "beta_slow", json_real(float_as_double(a->rope_beta_slow)));
        if (a->rope_attn_factor > 0.0f)
            json_object_set_new(r, "attention_factor",
                                json_real(float_as_double(a->rope_attn_factor)));
    }
    if (a->rope_type == LOOM_ROPE_LLAMA3 || a->rope_type == LOOM_ROPE_YARN)
        json_object_set_new(r, "original_max_position_embeddings", json_integer(a->rope_orig_max));
    return r;
}

json_t *hf_config_json(const loom_model_config *c, int eos) {
    const hf_family *f = hf_family_of(c);
    const loom_arch *a = loom_config_arch(c);
    LOOM_CHECK(f != NULL); /* loom_hf_export_check passed */
    json_t *o = json_object();
    const int gpt2 = f->map == HF_MAP_GPT2;
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(f->arch));
    json_object_set_new(o, "architectures", archs);
    json_object_set_new(o, "model_type", json_string(f->model_type));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "dtype", json_string("float32"));
    json_object_set_new(o, "torch_dtype", json_string("float32"));
    json_object_set_new(o, "bos_token_id", eos >= 0 ? json_integer(eos) : json_null());
    json_object_set_new(o, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
    json_object_set_new(o, "use_cache", json_true());
    if (gpt2) {
        json_object_set_new(o, "n_embd", json_integer(c->d_model));
        json_object_set_new(o, "n_layer", json_integer(c->n_layer));
        json_object_set_new(o, "n_head", json_integer(c->n_head));
        json_object_set_new(o, "n_positions", json_integer(c->max_seq_len));
        json_object_set_new(o, "n_ctx", json_integer(c->max_seq_len));
        json_object_set_new(o, "n_inner", json_integer(c->d_ff));
        json_object_set_new(o, "layer_norm_epsilon", json_real(float_as_double(c->norm_eps)));
        json_object_set_new(o, "activation_function", json_string("gelu_new"));
        json_object_set_new(o, "tie_word_embeddings", json_true());
        json_object_set_new(o, "scale_attn_weights", json_true());
        json_object_set_new(o, "scale_attn_by_inverse_layer_idx", json_false());
        json_object_set_new(o, "reorder_and_upcast_attn", json_false());
        json_object_set_new(o, "attn_pdrop", json_real(0));
        json_object_set_new(o, "embd_pdrop", json_real(0));
        json_object_set_new(o, "resid_pdrop", json_real(0));
        json_object_set_new(o, "initializer_range", json_real(float_as_double(c->init_std)));
        return o;
    }
    json_object_set_new(o, "pad_token_id", json_null()); /* Phi-3's default is outside small vocabularies */
    json_object_set_new(o, "hidden_size", json_integer(c->d_model));
    json_object_set_new(o, "intermediate_size", json_integer(c->d_ff));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layer));
    json_object_set_new(o, "num_attention_heads", json_integer(c->n_head));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_head));
    json_object_set_new(o, "head_dim", json_integer(loom_config_head_dim(c)));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_seq_len));
    json_object_set_new(o, "rms_norm_eps", json_real(float_as_double(c->norm_eps)));
    json_object_set_new(o, "rope_theta", json_real(float_as_double(c->rope_theta)));
    json_object_set_new(o, "rope_parameters", rope_json(c));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    if (f->attn_bias_key) json_object_set_new(o, "attention_bias", json_boolean(a->o_bias));
    json_object_set_new(o, "attention_dropout", json_real(0));
    if (!strcmp(f->model_type, "llama")) {
        json_object_set_new(o, "mlp_bias", json_false());
        json_object_set_new(o, "pretraining_tp", json_integer(1));
    }
    if (f->sliding_keys) /* (loom_hf_export_check: a pattern the family's keys say) */
        json_object_set_new(o, "sliding_window", a->sliding_window > 0
                                                     ? json_integer(a->sliding_window)
                                                     : json_null());
    if (f->sliding_keys && qwen_sliding(f)) {
        json_object_set_new(o, "use_sliding_window", json_boolean(a->sliding_window > 0));
        json_object_set_new(o, "max_window_layers",
                            json_integer(a->sliding_window > 0 ? a->window_start : c->n_layer));
        json_t *lt = json_array(); /* explicit: a window_period pattern too */
        for (int l = 0; l < c->n_layer; l++)
            json_array_append_new(lt, json_string(loom_config_layer_window(c, l) > 0
                                                      ? "sliding_attention"
                                                      : "full_attention"));
        json_object_set_new(o, "layer_types", lt);
    }
    if (f->map == HF_MAP_PHI3) {
        json_object_set_new(o, "resid_pdrop", json_real(0));
        json_object_set_new(o, "embd_pdrop", json_real(0));
        json_object_set_new(o, "original_max_position_embeddings", json_integer(c->max_seq_len));
    }
    if (f->moe) {
        const int mix = f->moe == HF_MOE_MIXTRAL;
        json_object_set_new(o, "num_local_experts", json_integer(c->n_expert));
        json_object_set_new(o, "num_experts_per_tok", json_integer(c->top_k));
        json_object_set_new(o, "output_router_logits", json_false());
        json_object_set_new(o, "router_aux_loss_coef", json_real(float_as_double(c->aux_loss_coef)));
        if (mix) json_object_set_new(o, "router_jitter_noise", json_real(0));
        if (!mix) {
            json_object_set_new(o, "moe_intermediate_size", json_integer(c->d_ff));
            json_object_set_new(o, "norm_topk_prob", json_boolean(a->moe_renorm));
            json_object_set_new(o, "decoder_sparse_step", json_integer(1));
            json_object_set_new(o, "mlp_only_layers", json_array());
        }
        if (f->moe == HF_MOE_QWEN2) {
            json_object_set_new(o, "num_experts", json_integer(c->n_expert));
            json_object_set_new(o, "shared_expert_intermediate_size",
                                json_integer(c->shared_d_ff > 0 ? c->shared_d_ff : c->d_ff));
            json_object_set_new(o, "qkv_bias", json_boolean(a->qkv_bias));
        }
    }
    if (gemma_family(f)) { /* GeGLU, the attention scale and soft-caps, Gemma 3's RoPE */
        json_object_del(o, "hidden_act");
        json_object_set_new(o, "hidden_activation", json_string("gelu_pytorch_tanh"));
        /* transformers types it int: an integral value is written as one */
        const float qp = a->query_pre_attn_scalar > 0.0f ? a->query_pre_attn_scalar
                                                          : (float)loom_config_head_dim(c);
        json_object_set_new(o, "query_pre_attn_scalar",
                            qp == floorf(qp) && qp < 1e9f ? json_integer((json_int_t)qp)
                                                          : json_real(float_as_double(qp)));
        json_object_set_new(o, "attn_logit_softcapping",
                            a->attn_softcap > 0.0f ? json_real(float_as_double(a->attn_softcap))
                                                   : json_null());
        json_object_set_new(o, "final_logit_softcapping",
                            a->final_softcap > 0.0f ? json_real(float_as_double(a->final_softcap))
                                                    : json_null());
        json_object_set_new(o, "use_bidirectional_attention", json_false());
        json_t *lt = json_array(); /* which layers slide, explicitly */
        for (int l = 0; l < c->n_layer; l++)
            json_array_append_new(lt, json_string(loom_config_layer_window(c, l) > 0
                                                      ? "sliding_attention"
                                                      : "full_attention"));
        json_object_set_new(o, "layer_types", lt);
        if (gemma3_family(f)) { /* rope_parameters per layer type */
            json_object_del(o, "rope_theta");
            const float local = a->rope_local_theta > 0.0f ? a->rope_local_theta : c->rope_theta;
            json_object_set_new(o, "rope_parameters",
                                json_pack("{s:o, s:{s:s, s:f}}", "full_attention", rope_json(c),
                                          "sliding_attention", "rope_type", "default",
                                          "rope_theta", float_as_double(local)));
        }
    }
    json_object_set_new(o, "tie_word_embeddings", json_boolean(a->tied));
    json_object_set_new(o, "initializer_range", json_real(float_as_double(c->init_std)));
    return o;
}
