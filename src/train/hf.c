/* Hugging Face interop: GPT2LMHeadModel / LlamaForCausalLM directories <-> loom checkpoints.
 *
 * A directory is untrusted: config.json, model.safetensors.index.json and generation_config.json
 * are parsed as strict JSON with size limits, the weights only as safetensors (never a pickle:
 * pytorch_model.bin is refused), and tokenizer.json through loom's tokenizer loader. Every
 * tensor loom needs must be present with its exact shape, and every tensor present must be one
 * loom maps (or a known non-parameter buffer); errors name the file and the tensor.
 *
 * Tensor names (HF -> loom, docs/hf-interop.md):
 *   GPT-2: transformer.wte/wpe.weight -> wte/wpe; h.<l>.ln_1/ln_2 -> ln1/ln2;
 *          h.<l>.attn.c_attn.weight (C, 3C) -> q_w, k_w, v_w (Conv1D stores (in, out): each
 *          is a column block, transposed); c_attn.bias -> q_b, k_b, v_b; attn.c_proj -> attn_proj;
 *          mlp.c_fc -> fc; mlp.c_proj -> fc_proj (transposed); ln_f -> lnf; head tied to wte.
 *   Llama: model.embed_tokens -> wte; layers.<l>.input_layernorm -> ln1_w;
 *          self_attn.{q,k,v,o}_proj -> q_w, k_w, v_w, attn_proj_w; post_attention_layernorm ->
 *          ln2_w; mlp.{gate,up,down}_proj -> gate_w, up_w, fc_proj_w; model.norm -> lnf_w;
 *          lm_head -> lm_head (= embed_tokens when tie_word_embeddings). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>

#include "base/json_util.h"
#include "loom/checkpoint.h"
#include "loom/ckpt_pieces.h"
#include "loom/config.h"
#include "loom/hf.h"
#include "loom/lora.h"
#include "loom/model_config.h"
#include "loom/parallel.h"
#include "loom/safetensors.h"
#include "loom/chat.h"
#include "loom/tokenizer.h"
#include "loom/train.h"
#include "train/hf_internal.h"
#include "train/trainer_internal.h"

#define HF_MAX_JSON ((size_t)64 << 20)
#define HF_ARCH_GPT2 "GPT2LMHeadModel"
#define HF_ARCH_LLAMA "LlamaForCausalLM"

/* ---- JSON helpers ---------------------------------------------------------------------- */

/* an integer key in [lo, hi]; absent or null: dflt, or an error when required */
static int j_int(json_t *o, const char *path, const char *key, int required, int64_t dflt,
                 int64_t lo, int64_t hi, int *out, loom_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return loom_errf(err, "%s: '%s' is missing", path, key);
        *out = (int)dflt;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return loom_errf(err, "%s: '%s' must be an integer in [%lld, %lld]", path, key,
                         (long long)lo, (long long)hi);
    *out = (int)json_integer_value(v);
    return 0;
}

static int j_num(json_t *o, const char *path, const char *key, double dflt, double *out,
                 loom_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return loom_errf(err, "%s: '%s' must be a positive number", path, key);
    *out = json_number_value(v);
    return 0;
}

static int j_bool(json_t *o, const char *path, const char *key, int dflt, int *out,
                  loom_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return loom_errf(err, "%s: '%s' must be true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

/* a string key (NULL when absent or null); a non-string is an error */
static int j_str(json_t *o, const char *path, const char *key, const char **out, loom_err *err) {
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return loom_errf(err, "%s: '%s' must be a string", path, key);
    *out = json_string_value(v);
    return 0;
}

/* The shortest decimal that reads back as the float f (so 1e-06 stays 1e-06). */
static double float_as_double(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}

/* ---- config.json ----------------------------------------------------------------------- */
int loom_hf_is_dir(const char *dir) {
    char p[4200];
    if (loom_path_fmt(p, sizeof p, NULL, "%s/config.json", dir)) return 0;
    if (!loom_path_exists(p)) return 0;
    loom_pathf(p, sizeof p, "%s/COMPLETE", dir);
    return !loom_path_exists(p);
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
    if (!arch && model_type) {
        if (!strcmp(model_type, "gpt2")) arch = HF_ARCH_GPT2;
        else if (!strcmp(model_type, "llama")) arch = HF_ARCH_LLAMA;
    }
    if (!arch) {
        loom_errf(err, "%s: no 'architectures' (and model_type '%s'): loom imports %s and %s",
                  path, model_type ? model_type : "(missing)", HF_ARCH_GPT2, HF_ARCH_LLAMA);
        goto done;
    }
    loom_model_config *mc = &hc->mc;
    mc->head = LOOM_HEAD_LM;
    mc->init_std = 0.02f;
    mc->rope_theta = 10000.0f;
    const int64_t big = 1 << 24;
    if (!strcmp(arch, HF_ARCH_GPT2)) {
        hc->arch = HF_ARCH_GPT2;
        mc->flavor = LOOM_FLAVOR_GPT2;
        int n_pos = 0, n_ctx = 0, tie, scale, by_layer, cross;
        const char *act;
        double eps;
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
            goto done;
        mc->max_seq_len = n_pos;
        mc->n_kv_head = mc->n_head;
        mc->norm_eps = (float)eps;
        if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh")) {
            loom_errf(err, "%s: 'activation_function' is '%s'; loom's GPT-2 computes gelu_new "
                           "(the tanh approximation)", path, act);
            goto done;
        }
        if (!tie) {
            loom_errf(err, "%s: 'tie_word_embeddings' is false; loom's GPT-2 ties the head to wte",
                      path);
            goto done;
        }
        if (!scale || by_layer || cross) {
            loom_errf(err, "%s: '%s' is not supported (loom's GPT-2 scales attention by "
                           "1/sqrt(head_dim) and has no cross-attention)", path,
                      !scale ? "scale_attn_weights: false"
                             : by_layer ? "scale_attn_by_inverse_layer_idx: true"
                                        : "add_cross_attention: true");
            goto done;
        }
    } else if (!strcmp(arch, HF_ARCH_LLAMA)) {
        hc->arch = HF_ARCH_LLAMA;
        mc->flavor = LOOM_FLAVOR_LLAMA;
        int attn_bias, mlp_bias, head_dim = 0;
        const char *act;
        double eps, theta;
        if (j_int(o, path, "vocab_size", 1, 0, 1, big, &mc->vocab_size, err) ||
            j_int(o, path, "hidden_size", 1, 0, 1, big, &mc->d_model, err) ||
            j_int(o, path, "intermediate_size", 1, 0, 1, big, &mc->d_ff, err) ||
            j_int(o, path, "num_hidden_layers", 1, 0, 1, 4096, &mc->n_layer, err) ||
            j_int(o, path, "num_attention_heads", 1, 0, 1, 4096, &mc->n_head, err) ||
            j_int(o, path, "num_key_value_heads", 0, mc->n_head, 1, 4096, &mc->n_kv_head, err) ||
            j_int(o, path, "max_position_embeddings", 1, 0, 1, big, &mc->max_seq_len, err) ||
            j_int(o, path, "head_dim", 0, 0, 1, big, &head_dim, err) ||
            j_num(o, path, "rms_norm_eps", 1e-6, &eps, err) ||
            j_num(o, path, "rope_theta", 10000.0, &theta, err) ||
            j_str(o, path, "hidden_act", &act, err) ||
            j_bool(o, path, "attention_bias", 0, &attn_bias, err) ||
            j_bool(o, path, "mlp_bias", 0, &mlp_bias, err) ||
            j_bool(o, path, "tie_word_embeddings", 0, &hc->tied, err))
            goto done;
        /* transformers 5 keeps RoPE under rope_parameters; older files use rope_theta and
         * rope_scaling */
        static const char *const rope_keys[] = {"rope_parameters", "rope_scaling"};
        for (int k = 0; k < 2; k++) {
            json_t *rp = json_object_get(o, rope_keys[k]);
            if (!rp || json_is_null(rp)) continue;
            if (!json_is_object(rp)) {
                loom_errf(err, "%s: '%s' must be an object", path, rope_keys[k]);
                goto done;
            }
            const char *type = json_string_value(json_object_get(rp, "rope_type"));
            if (!type) type = json_string_value(json_object_get(rp, "type"));
            if (type && strcmp(type, "default") != 0) {
                loom_errf(err, "%s: %s.rope_type is '%s'; loom computes the default RoPE only",
                          path, rope_keys[k], type);
                goto done;
            }
            if (!type && k == 1) {
                loom_errf(err, "%s: 'rope_scaling' is set; loom computes the default RoPE only",
                          path);
                goto done;
            }
            if (json_object_get(rp, "rope_theta") &&
                j_num(rp, path, "rope_theta", 10000.0, &theta, err))
                goto done;
        }
        mc->norm_eps = (float)eps;
        mc->rope_theta = (float)theta;
        if (act && strcmp(act, "silu") != 0) {
            loom_errf(err, "%s: 'hidden_act' is '%s'; loom's Llama computes SwiGLU with silu",
                      path, act);
            goto done;
        }
        if (attn_bias || mlp_bias) {
            loom_errf(err, "%s: '%s' is true; loom's Llama has no biases", path,
                      attn_bias ? "attention_bias" : "mlp_bias");
            goto done;
        }
        if (mc->d_model % mc->n_head != 0 ||
            (head_dim && (int64_t)head_dim * mc->n_head != mc->d_model)) {
            loom_errf(err, "%s: head_dim %d x num_attention_heads %d != hidden_size %d; loom "
                           "needs head_dim = hidden_size / num_attention_heads",
                      path, head_dim ? head_dim : mc->d_model / mc->n_head, mc->n_head,
                      mc->d_model);
            goto done;
        }
        if (mc->n_head % mc->n_kv_head != 0) {
            loom_errf(err, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      path, mc->n_head, mc->n_kv_head);
            goto done;
        }
    } else {
        loom_errf(err, "%s: architecture '%.100s' is not supported (loom imports %s and %s)",
                  path, arch, HF_ARCH_GPT2, HF_ARCH_LLAMA);
        goto done;
    }
    if (mc->d_model % mc->n_head != 0) {
        loom_errf(err, "%s: the width %d is not a multiple of the %d heads", path, mc->d_model,
                  mc->n_head);
        goto done;
    }
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
    if (arch) *arch = hc.arch;
    return 0;
}

/* ---- the tensor map -------------------------------------------------------------------- */
static void map_add(hf_map_list *l, const loom_tensor_info *t, int transpose, int64_t off,
                    int hf_ndim, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
static void map_add(hf_map_list *l, const loom_tensor_info *t, int transpose, int64_t off,
                    int hf_ndim, int64_t d0, int64_t d1, const char *fmt, ...) {
    if (!t) return;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->e = loom_realloc(l->e, l->cap * sizeof *l->e);
    }
    hf_map *e = &l->e[l->n++];
    memset(e, 0, sizeof *e);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->hf, sizeof e->hf, fmt, ap);
    va_end(ap);
    e->t = t;
    e->transpose = transpose;
    e->off = off;
    e->hf_ndim = hf_ndim;
    e->hf_shape[0] = d0;
    e->hf_shape[1] = d1;
}

void hf_map_build(const loom_model *m, const char *prefix, int tied, hf_map_list *l) {
    const loom_model_config *c = loom_model_get_config(m);
    const int64_t C = c->d_model, F = c->d_ff, V = c->vocab_size, D = C / c->n_head;
    const int64_t QH = (int64_t)c->n_head * D, KV = (int64_t)c->n_kv_head * D;
    memset(l, 0, sizeof *l);
    const char *p = prefix;
    if (c->flavor == LOOM_FLAVOR_GPT2) {
        map_add(l, loom_model_global(m, LOOM_P_WTE), 0, 0, 2, V, C, "%swte.weight", p);
        map_add(l, loom_model_global(m, LOOM_P_WPE), 0, 0, 2, c->max_seq_len, C, "%swpe.weight", p);
        for (int i = 0; i < c->n_layer; i++) {
#define LT(k) loom_model_layer_tensor(m, i, k)
            map_add(l, LT(LOOM_L_LN1_W), 0, 0, 1, C, 0, "%sh.%d.ln_1.weight", p, i);
            map_add(l, LT(LOOM_L_LN1_B), 0, 0, 1, C, 0, "%sh.%d.ln_1.bias", p, i);
            map_add(l, LT(LOOM_L_Q_W), 1, 0, 2, C, QH + 2 * KV, "%sh.%d.attn.c_attn.weight", p, i);
            map_add(l, LT(LOOM_L_K_W), 1, QH, 2, C, QH + 2 * KV, "%sh.%d.attn.c_attn.weight", p, i);
            map_add(l, LT(LOOM_L_V_W), 1, QH + KV, 2, C, QH + 2 * KV, "%sh.%d.attn.c_attn.weight", p, i);
            map_add(l, LT(LOOM_L_Q_B), 0, 0, 1, QH + 2 * KV, 0, "%sh.%d.attn.c_attn.bias", p, i);
            map_add(l, LT(LOOM_L_K_B), 0, QH, 1, QH + 2 * KV, 0, "%sh.%d.attn.c_attn.bias", p, i);
            map_add(l, LT(LOOM_L_V_B), 0, QH + KV, 1, QH + 2 * KV, 0, "%sh.%d.attn.c_attn.bias", p, i);
            map_add(l, LT(LOOM_L_ATTN_PROJ_W), 1, 0, 2, QH, C, "%sh.%d.attn.c_proj.weight", p, i);
            map_add(l, LT(LOOM_L_ATTN_PROJ_B), 0, 0, 1, C, 0, "%sh.%d.attn.c_proj.bias", p, i);
            map_add(l, LT(LOOM_L_LN2_W), 0, 0, 1, C, 0, "%sh.%d.ln_2.weight", p, i);
            map_add(l, LT(LOOM_L_LN2_B), 0, 0, 1, C, 0, "%sh.%d.ln_2.bias", p, i);
            map_add(l, LT(LOOM_L_FC_W), 1, 0, 2, C, F, "%sh.%d.mlp.c_fc.weight", p, i);
            map_add(l, LT(LOOM_L_FC_B), 0, 0, 1, F, 0, "%sh.%d.mlp.c_fc.bias", p, i);
            map_add(l, LT(LOOM_L_FC_PROJ_W), 1, 0, 2, F, C, "%sh.%d.mlp.c_proj.weight", p, i);
            map_add(l, LT(LOOM_L_FC_PROJ_B), 0, 0, 1, C, 0, "%sh.%d.mlp.c_proj.bias", p, i);
        }
        map_add(l, loom_model_global(m, LOOM_P_LNF_W), 0, 0, 1, C, 0, "%sln_f.weight", p);
        map_add(l, loom_model_global(m, LOOM_P_LNF_B), 0, 0, 1, C, 0, "%sln_f.bias", p);
    } else {
        map_add(l, loom_model_global(m, LOOM_P_WTE), 0, 0, 2, V, C, "%sembed_tokens.weight", p);
        for (int i = 0; i < c->n_layer; i++) {
            map_add(l, LT(LOOM_L_LN1_W), 0, 0, 1, C, 0, "%slayers.%d.input_layernorm.weight", p, i);
            map_add(l, LT(LOOM_L_Q_W), 0, 0, 2, QH, C, "%slayers.%d.self_attn.q_proj.weight", p, i);
            map_add(l, LT(LOOM_L_K_W), 0, 0, 2, KV, C, "%slayers.%d.self_attn.k_proj.weight", p, i);
            map_add(l, LT(LOOM_L_V_W), 0, 0, 2, KV, C, "%slayers.%d.self_attn.v_proj.weight", p, i);
            map_add(l, LT(LOOM_L_ATTN_PROJ_W), 0, 0, 2, C, QH, "%slayers.%d.self_attn.o_proj.weight", p, i);
            map_add(l, LT(LOOM_L_LN2_W), 0, 0, 1, C, 0, "%slayers.%d.post_attention_layernorm.weight", p, i);
            map_add(l, LT(LOOM_L_GATE_W), 0, 0, 2, F, C, "%slayers.%d.mlp.gate_proj.weight", p, i);
            map_add(l, LT(LOOM_L_UP_W), 0, 0, 2, F, C, "%slayers.%d.mlp.up_proj.weight", p, i);
            map_add(l, LT(LOOM_L_FC_PROJ_W), 0, 0, 2, C, F, "%slayers.%d.mlp.down_proj.weight", p, i);
#undef LT
        }
        map_add(l, loom_model_global(m, LOOM_P_LNF_W), 0, 0, 1, C, 0, "%snorm.weight", p);
        if (tied)
            map_add(l, loom_model_global(m, LOOM_P_LM_HEAD), 0, 0, 2, V, C, "%sembed_tokens.weight", p);
        else
            map_add(l, loom_model_global(m, LOOM_P_LM_HEAD), 0, 0, 2, V, C, "lm_head.weight");
    }
}

void hf_map_free(hf_map_list *l) {
    free(l->e);
    memset(l, 0, sizeof *l);
}

int64_t hf_map_numel(const hf_map *e) {
    return e->hf_ndim == 1 ? e->hf_shape[0] : e->hf_shape[0] * e->hf_shape[1];
}

/* loom tensor <- its part of the HF tensor hf (hf_map_numel floats) */
void hf_map_to_loom(const hf_map *e, const float *hf, float *dst) {
    const loom_tensor_info *t = e->t;
    if (!e->transpose) {
        memcpy(dst, hf + e->off, t->numel * sizeof *dst);
        return;
    }
    const int64_t R = t->shape[0], Cin = t->shape[1], N = e->hf_shape[1];
    for (int64_t o = 0; o < R; o++)
        for (int64_t i = 0; i < Cin; i++) dst[o * Cin + i] = hf[i * N + e->off + o];
}

/* its part of the HF tensor hf <- loom tensor src */
void hf_map_from_loom(const hf_map *e, const float *src, float *hf) {
    const loom_tensor_info *t = e->t;
    if (!e->transpose) {
        memcpy(hf + e->off, src, t->numel * sizeof *src);
        return;
    }
    const int64_t R = t->shape[0], Cin = t->shape[1], N = e->hf_shape[1];
    for (int64_t o = 0; o < R; o++)
        for (int64_t i = 0; i < Cin; i++) hf[i * N + e->off + o] = src[o * Cin + i];
}

/* ---- the weight files ------------------------------------------------------------------ */
typedef struct hf_weights {
    char dir[4096];
    int n_files;
    char **names;          /* file names */
    loom_st_file **files;
    json_t *weight_map;    /* index: tensor -> file name; NULL for one file */
} hf_weights;

static void weights_close(hf_weights *w) {
    for (int i = 0; i < w->n_files; i++) {
        loom_safetensors_close(w->files[i]);
        free(w->names[i]);
    }
    free(w->files);
    free(w->names);
    json_decref(w->weight_map);
    memset(w, 0, sizeof *w);
}

static int shard_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 255 || s[0] == '.' || strchr(s, '/') || strchr(s, '\\')) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20) return 0;
    return n > 12 && !strcmp(s + n - 12, ".safetensors");
}

static int weights_open_file(hf_weights *w, const char *name, loom_err *err) {
    char path[4400];
    if (loom_path_fmt(path, sizeof path, err, "%s/%s", w->dir, name)) return -1;
    w->files = loom_realloc(w->files, (size_t)(w->n_files + 1) * sizeof *w->files);
    w->names = loom_realloc(w->names, (size_t)(w->n_files + 1) * sizeof *w->names);
    if (loom_safetensors_open(path, &w->files[w->n_files], err)) return -1;
    w->names[w->n_files++] = loom_strdup(name);
    return 0;
}

static int weights_open(const char *dir, hf_weights *w, loom_err *err) {
    char path[4400];
    memset(w, 0, sizeof *w);
    if (loom_path_fmt(w->dir, sizeof w->dir, err, "%s", dir)) return -1;
    loom_pathf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (loom_path_exists(path)) {
        json_t *idx;
        if (loom_json_object_file(path, HF_MAX_JSON, &idx, err)) return -1;
        json_t *wm = json_object_get(idx, "weight_map");
        if (!json_is_object(wm) || json_object_size(wm) == 0) {
            json_decref(idx);
            return loom_errf(err, "%s: 'weight_map' missing or not a non-empty object", path);
        }
        w->weight_map = json_incref(wm);
        json_decref(idx);
        const char *k;
        json_t *v;
        json_object_foreach(w->weight_map, k, v) {
            const char *f = json_string_value(v);
            if (!f || !shard_name_ok(f))
                return loom_errf(err, "%s: weight_map['%.200s'] must name a .safetensors file in "
                                      "the directory", path, k);
            int have = 0;
            for (int i = 0; i < w->n_files && !have; i++) have = !strcmp(w->names[i], f);
            if (!have && weights_open_file(w, f, err)) return -1;
        }
        return 0;
    }
    loom_pathf(path, sizeof path, "%s/model.safetensors", dir);
    if (loom_path_exists(path)) return weights_open_file(w, "model.safetensors", err);
    static const char *const pickles[] = {"pytorch_model.bin", "pytorch_model.bin.index.json",
                                          "model.pt", "model.ckpt"};
    for (int i = 0; i < 4; i++) {
        loom_pathf(path, sizeof path, "%s/%s", dir, pickles[i]);
        if (loom_path_exists(path))
            return loom_errf(err, "%s: a pickle file, which can run code when loaded: loom reads "
                                  "only safetensors (convert it with save_pretrained(..., "
                                  "safe_serialization=True))", path);
    }
    return loom_errf(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
}

/* the file holding tensor name, or NULL */
static loom_st_file *weights_find(const hf_weights *w, const char *name, const char **fname) {
    if (w->weight_map) {
        const char *f = json_string_value(json_object_get(w->weight_map, name));
        if (!f) return NULL;
        for (int i = 0; i < w->n_files; i++)
            if (!strcmp(w->names[i], f)) {
                *fname = w->names[i];
                return w->files[i];
            }
        return NULL;
    }
    if (!loom_safetensors_dtype(w->files[0], name, NULL, NULL)) return NULL;
    *fname = w->names[0];
    return w->files[0];
}

static int weights_has(const hf_weights *w, const char *name) {
    const char *f;
    return weights_find(w, name, &f) != NULL;
}

/* buffers HF models carry that are not parameters */
static int ignorable(const char *name) {
    static const char *const suffix[] = {".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"};
    size_t n = strlen(name);
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(suffix[i]);
        if (n >= k && !strcmp(name + n - k, suffix[i])) return 1;
    }
    return 0;
}

int loom_hf_load_params(const char *dir, loom_model *m, loom_err *err) {
    hf_cfg hc;
    hf_weights w;
    hf_map_list map = {0};
    float *buf = NULL;
    int rc = -1;
    if (hf_read_config(dir, &hc, err)) return -1;
    const loom_model_config *c = loom_model_get_config(m);
    const loom_model_layout *lay = loom_model_get_layout(m);
    LOOM_CHECK(loom_model_params(m) != NULL && (lay->tp <= 1) && lay->l0 == 0 &&
               (lay->l1 == 0 || lay->l1 == c->n_layer));
    struct { const char *key; int have, want; } cmp[] = {
        {"flavor", c->flavor, hc.mc.flavor},         {"vocab_size", c->vocab_size, hc.mc.vocab_size},
        {"d_model", c->d_model, hc.mc.d_model},     {"n_layer", c->n_layer, hc.mc.n_layer},
        {"n_head", c->n_head, hc.mc.n_head},        {"n_kv_head", c->n_kv_head, hc.mc.n_kv_head},
        {"d_ff", c->d_ff, hc.mc.d_ff},
        {"max_seq_len", c->flavor == LOOM_FLAVOR_GPT2 ? c->max_seq_len : 0,
         c->flavor == LOOM_FLAVOR_GPT2 ? hc.mc.max_seq_len : 0},
    };
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++)
        if (cmp[i].have != cmp[i].want)
            return loom_errf(err, "%s/config.json: the model has model.%s = %d, the directory's "
                                  "model %d: the shapes of the weights would not match",
                             dir, cmp[i].key, cmp[i].have, cmp[i].want);
    if (weights_open(dir, &w, err)) return -1;
    const char *prefix = "";
    if (hc.mc.flavor == LOOM_FLAVOR_GPT2 && weights_has(&w, "transformer.wte.weight"))
        prefix = "transformer.";
    if (hc.mc.flavor == LOOM_FLAVOR_LLAMA && weights_has(&w, "model.embed_tokens.weight"))
        prefix = "model.";
    hf_map_build(m, prefix, hc.tied, &map);
    float *params = loom_model_params(m);
    const char *cached = NULL;
    size_t cap = 0;
    for (int i = 0; i < map.n; i++) {
        const hf_map *e = &map.e[i];
        if (!cached || strcmp(cached, e->hf) != 0) {
            const char *fname = NULL;
            loom_st_file *f = weights_find(&w, e->hf, &fname);
            if (!f) {
                loom_errf(err, "%s: tensor '%s' (loom '%s') is missing", dir, e->hf, e->t->name);
                goto done;
            }
            const size_t n = (size_t)hf_map_numel(e);
            if (n > cap) {
                free(buf);
                cap = n;
                buf = loom_malloc(cap * sizeof *buf);
            }
            if (loom_safetensors_read_as_f32(f, e->hf, buf, e->hf_ndim, e->hf_shape, err)) goto done;
            cached = e->hf;
        }
        hf_map_to_loom(e, buf, params + e->t->offset);
    }
    /* every tensor in the files is one loom reads (or a known buffer) */
    for (int fi = 0; fi < w.n_files; fi++)
        for (int k = 0; k < loom_safetensors_count(w.files[fi]); k++) {
            const char *name = loom_safetensors_name(w.files[fi], k);
            int used = ignorable(name);
            /* GPT-2's lm_head.weight is tied to wte; transformers may still store it */
            if (hc.mc.flavor == LOOM_FLAVOR_GPT2 && !strcmp(name, "lm_head.weight")) used = 1;
            for (int i = 0; i < map.n && !used; i++) used = !strcmp(map.e[i].hf, name);
            if (!used) {
                loom_errf(err, "%s/%s: tensor '%.200s' is not part of a %s that loom can "
                               "represent", dir, w.names[fi], name, hc.arch);
                goto done;
            }
        }
    rc = 0;
done:
    free(buf);
    hf_map_free(&map);
    weights_close(&w);
    return rc;
}

/* ---- import ----------------------------------------------------------------------------- */
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

void hf_config_set_model(loom_config *c, const loom_model_config *mc) {
    loom_config_set(c, "model.flavor", mc->flavor == LOOM_FLAVOR_GPT2 ? "gpt2" : "llama",
                    "hf import");
    cfg_set_int(c, "model.vocab_size", mc->vocab_size);
    cfg_set_int(c, "model.d_model", mc->d_model);
    cfg_set_int(c, "model.n_layer", mc->n_layer);
    cfg_set_int(c, "model.n_head", mc->n_head);
    cfg_set_int(c, "model.n_kv_head", mc->n_kv_head);
    cfg_set_int(c, "model.d_ff", mc->d_ff);
    cfg_set_int(c, "model.max_seq_len", mc->max_seq_len);
    cfg_set_float(c, "model.norm_eps", mc->norm_eps);
    cfg_set_float(c, "model.rope_theta", mc->rope_theta);
}

/* The tokenizer an import records: (id, tokenizer.json text or NULL for bytes). */
static int import_tokenizer(const char *dir, const char *spec, int vocab, char **id,
                            char **json, size_t *json_len, loom_err *err) {
    char path[4200];
    loom_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    *id = NULL;
    *json = NULL;
    *json_len = 0;
    if (spec && !strcmp(spec, "byte")) {
        if (loom_tokenizer_byte(NULL, 0, &tok, err)) return -1;
    } else {
        if (spec) {
            if (loom_path_fmt(path, sizeof path, err, "%s", spec)) return -1;
        } else {
            if (loom_path_fmt(path, sizeof path, err, "%s/tokenizer.json", dir)) return -1;
            if (!loom_path_exists(path))
                return loom_errf(err, "%s: no tokenizer.json; give the tokenizer with "
                                      "--tokenizer FILE (a tokenizer.json) or --tokenizer byte",
                                 dir);
        }
        if (loom_read_file(path, (size_t)1 << 30, &text, &len, err) ||
            loom_tokenizer_load_json_text(text, len, path, &tok, err)) {
            free(text);
            return -1;
        }
    }
    int rc = -1;
    if (loom_tokenizer_vocab_size(tok) > (uint32_t)vocab) {
        loom_errf(err, "%s: the tokenizer has %u ids, more than the model's vocab_size %d",
                  spec ? spec : path, loom_tokenizer_vocab_size(tok), vocab);
        goto done;
    }
    if (loom_tokenizer_is_plain_bytes(tok)) {
        *id = loom_strdup("byte"); /* the byte-level file loom exports for byte models */
    } else {
        *id = loom_strdup(loom_tokenizer_id(tok));
        *json = loom_tokenizer_hf_json(tok); /* canonical: its id is the sha256 of this */
        *json_len = strlen(*json);
    }
    rc = 0;
done:
    free(text);
    loom_tokenizer_free(tok);
    return rc;
}

int hf_save_ckpt(const char *out_root, loom_model *m, const loom_config *cfg,
                 const loom_run_data *rd, const char *source, loom_err *err) {
    const int n_t = loom_model_num_tensors(m);
    loom_dp_piece *pieces = loom_calloc((size_t)n_t, sizeof *pieces);
    float *params = loom_model_params(m);
    for (int i = 0; i < n_t; i++) {
        const loom_tensor_info *t = loom_model_tensor(m, i);
        pieces[i] = (loom_dp_piece){.kind = 0, .tensor = t, .begin = 0, .count = t->numel,
                                    .data = params + t->offset};
    }
    char *pbuf = NULL, *cbuf = NULL, *dbuf = NULL;
    size_t plen = 0;
    int rc = -1;
    if (loom_pieces_serialize(pieces, n_t, &pbuf, &plen, err)) goto done;
    char pname[64];
    loom_pieces_file_name(0, pname, sizeof pname);
    cbuf = loom_config_to_yaml(cfg);
    dbuf = loom_run_data_json(rd, source);
    loom_ckpt_file files[4] = {
        {pname, pbuf, plen},
        {"config.yaml", cbuf, strlen(cbuf)},
        {"data.json", dbuf, strlen(dbuf)},
        {"tokenizer.json", rd->tokenizer_json, rd->tokenizer_json_len},
    };
    rc = loom_ckpt_save(out_root, 0, files, rd->tokenizer_json ? 4 : 3, NULL, 0, err);
done:
    free(pieces);
    free(pbuf);
    free(cbuf);
    free(dbuf);
    return rc;
}

int loom_hf_import(const char *dir, const char *out_root, const loom_hf_import_opts *o,
                   loom_err *err) {
    hf_cfg hc;
    loom_model *m = NULL;
    loom_config *cfg = NULL;
    loom_run_data rd = {0};
    int rc = -1;
    if (hf_read_config(dir, &hc, err)) return -1;
    if (import_tokenizer(dir, o ? o->tokenizer : NULL, hc.mc.vocab_size, &rd.tokenizer_id,
                         &rd.tokenizer_json, &rd.tokenizer_json_len, err))
        goto done;
    loom_chat_template_from_hf_dir(dir, &rd.chat_template, &rd.chat_default_system); /* when recognized */
    if (loom_model_create_view(&hc.mc, NULL, 1, 1, LOOM_MODEL_INFER, &m, err)) {
        loom_err_prefix(err, "%s/config.json", dir);
        goto done;
    }
    if (loom_hf_load_params(dir, m, err)) goto done;
    cfg = loom_config_new();
    hf_config_set_model(cfg, &hc.mc);
    cfg_set_int(cfg, "training.seq_len", hc.mc.max_seq_len < 1024 ? hc.mc.max_seq_len : 1024);
    int nk;
    const loom_config_key *keys = loom_train_schema(&nk);
    if (loom_config_apply_schema(cfg, keys, nk, err)) goto done;
    char source[4200];
    snprintf(source, sizeof source, "hf:%s", dir);
    rc = hf_save_ckpt(out_root, m, cfg, &rd, source, err);
done:
    free(rd.tokenizer_id);
    free(rd.tokenizer_json);
    free(rd.chat_template);
    free(rd.chat_default_system);
    loom_config_free(cfg);
    loom_model_free(m);
    return rc;
}

/* ---- export ----------------------------------------------------------------------------- */
static int write_json(const char *dir, const char *name, json_t *o, loom_err *err) {
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

static json_t *hf_config_json(const loom_model_config *c, int eos) {
    json_t *o = json_object();
    const int gpt2 = c->flavor == LOOM_FLAVOR_GPT2;
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(gpt2 ? HF_ARCH_GPT2 : HF_ARCH_LLAMA));
    json_object_set_new(o, "architectures", archs);
    json_object_set_new(o, "model_type", json_string(gpt2 ? "gpt2" : "llama"));
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
    } else {
        json_object_set_new(o, "hidden_size", json_integer(c->d_model));
        json_object_set_new(o, "intermediate_size", json_integer(c->d_ff));
        json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layer));
        json_object_set_new(o, "num_attention_heads", json_integer(c->n_head));
        json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_head));
        json_object_set_new(o, "head_dim", json_integer(c->d_model / c->n_head));
        json_object_set_new(o, "max_position_embeddings", json_integer(c->max_seq_len));
        json_object_set_new(o, "rms_norm_eps", json_real(float_as_double(c->norm_eps)));
        const double theta = float_as_double(c->rope_theta);
        json_object_set_new(o, "rope_theta", json_real(theta));
        json_object_set_new(o, "rope_parameters",
                            json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta", theta));
        json_object_set_new(o, "hidden_act", json_string("silu"));
        json_object_set_new(o, "attention_bias", json_false());
        json_object_set_new(o, "attention_dropout", json_real(0));
        json_object_set_new(o, "mlp_bias", json_false());
        json_object_set_new(o, "pretraining_tp", json_integer(1));
        json_object_set_new(o, "tie_word_embeddings", json_false());
        json_object_set_new(o, "initializer_range", json_real(float_as_double(c->init_std)));
    }
    return o;
}

int hf_dir_prepare(const char *out_dir, loom_err *err) {
    if (loom_path_exists(out_dir)) {
        if (!loom_is_dir(out_dir))
            return loom_errf(err, "%s: exists and is not a directory", out_dir);
        DIR *d = opendir(out_dir);
        if (!d) return loom_errf(err, "%s: cannot open the directory", out_dir);
        struct dirent *de;
        int empty = 1;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = 0;
        closedir(d);
        if (!empty)
            return loom_errf(err, "%s: the directory is not empty; export into a new or empty "
                                  "directory (nothing was written)", out_dir);
        return 0;
    }
    return loom_mkdirs(out_dir, err);
}

/* Writes the HF tensors of the map (plus extra ones) as model.safetensors, or sharded with
 * an index when they exceed max_shard bytes. tensors[i].data are owned by the caller. */
int hf_write_weights(const char *out_dir, const loom_st_tensor *ts, int n, uint64_t max_shard,
                     loom_err *err) {
    static const char *const meta[] = {"format", "pt", NULL};
    char path[4400];
    uint64_t total = 0;
    int *shard = loom_calloc((size_t)n + 1, sizeof *shard);
    int n_shards = 0;
    uint64_t cur = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = 4;
        for (int d = 0; d < ts[i].ndim; d++) b *= (uint64_t)ts[i].shape[d];
        total += b;
        if (n_shards == 0 || (cur > 0 && cur + b > max_shard)) {
            n_shards++;
            cur = 0;
        }
        cur += b;
        shard[i] = n_shards - 1;
    }
    int rc = -1;
    if (n_shards <= 1) {
        if (loom_path_fmt(path, sizeof path, err, "%s/model.safetensors", out_dir)) goto done;
        rc = loom_safetensors_write(path, ts, n, meta, err);
        goto done;
    }
    json_t *wm = json_object();
    for (int s = 0, i0 = 0; s < n_shards; s++) {
        int i1 = i0;
        while (i1 < n && shard[i1] == s) i1++;
        char name[96];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        for (int i = i0; i < i1; i++) json_object_set_new(wm, ts[i].name, json_string(name));
        if (loom_path_fmt(path, sizeof path, err, "%s/%s", out_dir, name) ||
            loom_safetensors_write(path, ts + i0, i1 - i0, meta, err)) {
            json_decref(wm);
            goto done;
        }
        i0 = i1;
    }
    json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                            "weight_map", wm);
    rc = write_json(out_dir, "model.safetensors.index.json", idx, err);
done:
    free(shard);
    return rc;
}

/* the HF tensors of a whole model, in map order (data malloc'd; free with free_tensors) */
static loom_st_tensor *model_tensors(loom_model *m, const hf_map_list *map, int *n_out) {
    loom_st_tensor *ts = loom_calloc((size_t)map->n + 1, sizeof *ts);
    const float *params = loom_model_params(m);
    int n = 0;
    for (int i = 0; i < map->n; i++) {
        const hf_map *e = &map->e[i];
        if (n == 0 || strcmp(ts[n - 1].name, e->hf) != 0) {
            loom_st_tensor *t = &ts[n++];
            t->name = e->hf;
            t->ndim = e->hf_ndim;
            t->shape[0] = e->hf_shape[0];
            t->shape[1] = e->hf_shape[1];
            t->data = loom_calloc((size_t)hf_map_numel(e), sizeof(float));
        }
        hf_map_from_loom(e, params + e->t->offset, (float *)ts[n - 1].data);
    }
    *n_out = n;
    return ts;
}

static void free_tensors(loom_st_tensor *ts, int n) {
    for (int i = 0; i < n; i++) free((void *)ts[i].data);
    free(ts);
}

int hf_write_tokenizer(const char *out_dir, const loom_run_data *rd, const loom_model_config *c,
                       int *eos_out, loom_err *err) {
    loom_tokenizer *tok = NULL;
    char path[4400];
    if (loom_run_data_tokenizer(rd, &tok, err)) return -1;
    char *s = loom_tokenizer_hf_json(tok);
    int32_t eos = loom_tokenizer_special_id(tok, "<|endoftext|>");
    int rc = loom_path_fmt(path, sizeof path, err, "%s/tokenizer.json", out_dir);
    if (!rc) rc = loom_write_file_atomic(path, s, strlen(s), err);
    free(s);
    loom_tokenizer_free(tok);
    if (rc) return -1;
    json_t *tc = json_pack("{s:s, s:I, s:b, s:b}", "tokenizer_class", "PreTrainedTokenizerFast",
                           "model_max_length", (json_int_t)c->max_seq_len, "add_bos_token", 0,
                           "clean_up_tokenization_spaces", 0);
    if (eos >= 0) {
        json_object_set_new(tc, "eos_token", json_string("<|endoftext|>"));
        json_object_set_new(tc, "bos_token", json_string("<|endoftext|>"));
    }
    if (write_json(out_dir, "tokenizer_config.json", tc, err)) return -1;
    *eos_out = eos;
    return 0;
}

/* PEFT's layout of the adapters: adapter_model.safetensors with
 * base_model.model.<prefix>.<module>.lora_A.weight (r, in) / lora_B.weight (out, r), and
 * adapter_config.json; the directory's own weights are then the base model's. Llama: one PEFT
 * module per target. GPT-2: q, k and v are column blocks of the fused c_attn, which PEFT adapts
 * as one matrix: its adapter is A = [A_q; A_k; A_v] (the targeted ones, rank n*r) and
 * B = blockdiag-by-rows (B_q in q's rows and columns of its A block, ...), an exact
 * representation of the separate adapters, with rank_pattern / alpha_pattern n*r, n*alpha
 * (the same scale alpha/r). */
static int hf_write_peft(const char *out_dir, loom_model *m, loom_lora *l, loom_err *err) {
    static const char *const llama_mods[LOOM_LORA_NT] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    static const char *const gpt2_mods[LOOM_LORA_NT] = {"attn.c_attn", "attn.c_attn", "attn.c_attn",
                                                        "attn.c_proj", "mlp.c_fc", NULL,
                                                        "mlp.c_proj"};
    const loom_model_config *c = loom_model_get_config(m);
    const int gpt2 = c->flavor == LOOM_FLAVOR_GPT2, r = loom_lora_rank(l);
    const unsigned tg = loom_lora_targets(l);
    const int nqkv = !!(tg & LOOM_LORA_Q) + !!(tg & LOOM_LORA_K) + !!(tg & LOOM_LORA_V);
    const int nt = loom_lora_num_tensors(l);
    loom_st_tensor *ts = loom_calloc((size_t)nt + 1, sizeof *ts);
    char (*names)[160] = loom_calloc((size_t)nt + 1, sizeof *names);
    float **own = loom_calloc((size_t)nt + 1, sizeof *own);
    const float *p = loom_lora_params(l);
    int k = 0;
    for (int i = 0; i < nt; i++) {
        const loom_lora_tensor *x = loom_lora_tensor_at(l, i);
        const char *mod = gpt2 ? gpt2_mods[x->target] : llama_mods[x->target];
        if (gpt2 && x->target <= 2) {
            if (x->is_b || x->target != (tg & LOOM_LORA_Q ? 0 : tg & LOOM_LORA_K ? 1 : 2)) continue;
            /* the first targeted of q, k, v writes c_attn's fused A and B for all of them */
            const int64_t C = c->d_model, R = (int64_t)nqkv * r;
            for (int b = 0; b < 2; b++) {
                float *d = loom_calloc((size_t)(b ? 3 * C * R : R * C), sizeof *d);
                int j = 0;
                for (int t = 0; t < 3; t++) {
                    if (!(tg & (1u << t))) continue;
                    for (int q = 0; q < nt; q++) {
                        const loom_lora_tensor *y = loom_lora_tensor_at(l, q);
                        if (y->layer != x->layer || y->target != t || y->is_b != b) continue;
                        const float *sp = p + y->offset;
                        if (!b) memcpy(d + (int64_t)j * r * C, sp, (size_t)(r * C) * sizeof *d);
                        else
                            for (int64_t o = 0; o < C; o++)
                                memcpy(d + (t * C + o) * R + (int64_t)j * r, sp + o * r,
                                       (size_t)r * sizeof *d);
                    }
                    j++;
                }
                own[k] = d;
                snprintf(names[k], sizeof names[k],
                         "base_model.model.transformer.h.%d.attn.c_attn.lora_%c.weight", x->layer,
                         b ? 'B' : 'A');
                ts[k] = (loom_st_tensor){names[k], d, 2, {b ? 3 * C : R, b ? R : C}};
                k++;
            }
            continue;
        }
        snprintf(names[k], sizeof names[k], "base_model.model.%s.%d.%s.lora_%c.weight",
                 gpt2 ? "transformer.h" : "model.layers", x->layer, mod, x->is_b ? 'B' : 'A');
        ts[k] = (loom_st_tensor){names[k], p + x->offset, 2, {x->rows, x->cols}};
        k++;
    }
    static const char *const meta[] = {"format", "pt", NULL};
    char path[4400];
    int rc = loom_path_fmt(path, sizeof path, err, "%s/adapter_model.safetensors", out_dir);
    if (!rc) rc = loom_safetensors_write(path, ts, k, meta, err);
    for (int i = 0; i < k; i++) free(own[i]);
    free(own);
    free(ts);
    free(names);
    if (rc) return -1;
    json_t *tm = json_array();
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        if (!(tg & (1u << t))) continue;
        if (gpt2 && t <= 2 && t != (tg & LOOM_LORA_Q ? 0 : tg & LOOM_LORA_K ? 1 : 2)) continue;
        const char *mod = gpt2 ? gpt2_mods[t] : strchr(llama_mods[t], '.') + 1;
        json_array_append_new(tm, json_string(gpt2 && t <= 2 ? "c_attn" : mod));
    }
    const double alpha = float_as_double(loom_lora_alpha(l));
    json_t *cfgj = json_pack("{s:s, s:s, s:i, s:f, s:f, s:o, s:s, s:b, s:n, s:b}", "peft_type",
                             "LORA", "task_type", "CAUSAL_LM", "r", r, "lora_alpha", alpha,
                             "lora_dropout", float_as_double(loom_lora_dropout(l)),
                             "target_modules", tm, "bias", "none",
                             "fan_in_fan_out", gpt2, "base_model_name_or_path", "inference_mode", 1);
    if (gpt2 && nqkv) { /* the fused c_attn adapter's rank and alpha */
        json_object_set_new(cfgj, "rank_pattern", json_pack("{s:i}", "c_attn", nqkv * r));
        json_object_set_new(cfgj, "alpha_pattern", json_pack("{s:f}", "c_attn", alpha * nqkv));
    }
    return write_json(out_dir, "adapter_config.json", cfgj, err);
}

int loom_hf_export(const char *ckpt, const char *out_dir, const loom_hf_export_opts *o,
                   loom_err *err) {
    loom_model *m = NULL;
    loom_config *cfg = NULL;
    loom_run_data *rd = NULL;
    hf_map_list map = {0};
    loom_st_tensor *ts = NULL;
    int n = 0, rc = -1;
    const uint64_t max_shard = o && o->max_shard_bytes ? o->max_shard_bytes : (uint64_t)2 << 30;
    loom_lora *lora = NULL;
    if (loom_load_model_lora(ckpt, 1, 0, &m, &cfg, &rd, o && o->merge_lora ? NULL : &lora, err))
        return -1;
    const loom_model_config *c = loom_model_get_config(m);

    if (c->head != LOOM_HEAD_LM) {
        loom_errf(err, "%s: a classifier (model.head = classify) has no Hugging Face causal-LM "
                       "layout to export to", ckpt);
        goto done;
    }
    if (c->n_expert > 0) {
        loom_errf(err, "%s: a mixture-of-experts model (model.moe.experts = %d) has no "
                       "GPT2LMHeadModel / LlamaForCausalLM layout to export to", ckpt, c->n_expert);
        goto done;
    }
    if (hf_dir_prepare(out_dir, err)) goto done;
    int eos = -1;
    if (hf_write_tokenizer(out_dir, rd, c, &eos, err)) goto done;
    hf_map_build(m, c->flavor == LOOM_FLAVOR_GPT2 ? "transformer." : "model.", 0, &map);
    ts = model_tensors(m, &map, &n);
    if (hf_write_weights(out_dir, ts, n, max_shard, err)) goto done;
    json_t *gen = json_object();
    if (eos >= 0) {
        json_object_set_new(gen, "bos_token_id", json_integer(eos));
        json_object_set_new(gen, "eos_token_id", json_integer(eos));
    }
    json_object_set_new(gen, "_from_model_config", json_true());
    if (write_json(out_dir, "generation_config.json", gen, err) ||
        (lora && hf_write_peft(out_dir, m, lora, err)) ||
        write_json(out_dir, "config.json", hf_config_json(c, eos), err))
        goto done;
    rc = 0;
done: /* lora: m's own, freed with it */
    free_tensors(ts, n);
    hf_map_free(&map);
    loom_run_data_free(rd);
    loom_config_free(cfg);
    loom_model_free(m);
    return rc;
}
