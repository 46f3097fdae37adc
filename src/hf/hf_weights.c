/* Hugging Face weights <-> a loom model's parameters: the tensor-name maps (one-to-many and
 * many-to-one: fused and split tensors), safetensors files (one, or shards with an index),
 * and PEFT adapter files. A directory is untrusted: only safetensors are read (never a
 * pickle), every tensor loom needs must be there with its exact shape and every tensor there
 * must be one loom maps (or a known buffer); errors name the file and the tensor. */
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
#include "loom/tokenizer.h"

#define HF_MAX_JSON ((size_t)64 << 20)

/* ---- the tensor map -------------------------------------------------------------------- */
static hf_map *map_add(hf_map_list *l, const loom_tensor_info *t, int transpose, int64_t off,
                       int hf_ndim, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
static hf_map *map_add(hf_map_list *l, const loom_tensor_info *t, int transpose, int64_t off,
                       int hf_ndim, int64_t d0, int64_t d1, const char *fmt, ...) {
    if (!t) return NULL;
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
    return e;
}

/* an HF tensor (d0, d1) holding floats [loff, loff + d0 * d1) of loom tensor t */
#define map_part(l, t, loff_, d0, d1, ...)                                   \
    do {                                                                     \
        hf_map *e_ = map_add((l), (t), 0, 0, 2, (d0), (d1), __VA_ARGS__);    \
        if (e_) {                                                            \
            e_->loff = (loff_);                                              \
            e_->n = (int64_t)(d0) * (int64_t)(d1);                           \
        }                                                                    \
    } while (0)

void hf_map_build(const loom_model *m, const hf_family *fam, const char *prefix,
                  hf_map_list *l) {
    const loom_model_config *c = loom_model_get_config(m);
    const int64_t C = c->d_model, F = c->d_ff, V = c->vocab_size, D = loom_config_head_dim(c);
    const int64_t QH = (int64_t)c->n_head * D, KV = (int64_t)c->n_kv_head * D;
    memset(l, 0, sizeof *l);
    const char *p = prefix;
#define LT(k) loom_model_layer_tensor(m, i, k)
    if (fam->map == HF_MAP_GPT2) {
        map_add(l, loom_model_global(m, LOOM_P_WTE), 0, 0, 2, V, C, "%swte.weight", p);
        map_add(l, loom_model_global(m, LOOM_P_WPE), 0, 0, 2, c->max_seq_len, C, "%swpe.weight", p);
        for (int i = 0; i < c->n_layer; i++) {
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
        return;
    }
    /* Llama's layout (Mistral, Qwen 2/3); Phi-3 fuses q|k|v and gate|up by rows, so each loom
     * tensor is a row block (a flat offset) of the fused one */
    const int phi3 = fam->map == HF_MAP_PHI3;
    map_add(l, loom_model_global(m, LOOM_P_WTE), 0, 0, 2, V, C, "%sembed_tokens.weight", p);
    for (int i = 0; i < c->n_layer; i++) {
        map_add(l, LT(LOOM_L_LN1_W), 0, 0, 1, C, 0, "%slayers.%d.input_layernorm.weight", p, i);
        if (phi3) {
            const int64_t R = QH + 2 * KV;
            map_add(l, LT(LOOM_L_Q_W), 0, 0, 2, R, C, "%slayers.%d.self_attn.qkv_proj.weight", p, i);
            map_add(l, LT(LOOM_L_K_W), 0, QH * C, 2, R, C, "%slayers.%d.self_attn.qkv_proj.weight", p, i);
            map_add(l, LT(LOOM_L_V_W), 0, (QH + KV) * C, 2, R, C, "%slayers.%d.self_attn.qkv_proj.weight", p, i);
        } else {
            map_add(l, LT(LOOM_L_Q_W), 0, 0, 2, QH, C, "%slayers.%d.self_attn.q_proj.weight", p, i);
            map_add(l, LT(LOOM_L_K_W), 0, 0, 2, KV, C, "%slayers.%d.self_attn.k_proj.weight", p, i);
            map_add(l, LT(LOOM_L_V_W), 0, 0, 2, KV, C, "%slayers.%d.self_attn.v_proj.weight", p, i);
        }
        map_add(l, LT(LOOM_L_Q_B), 0, 0, 1, QH, 0, "%slayers.%d.self_attn.q_proj.bias", p, i);
        map_add(l, LT(LOOM_L_K_B), 0, 0, 1, KV, 0, "%slayers.%d.self_attn.k_proj.bias", p, i);
        map_add(l, LT(LOOM_L_V_B), 0, 0, 1, KV, 0, "%slayers.%d.self_attn.v_proj.bias", p, i);
        /* q/k norms per head (D) or over the whole projections (OLMo 2: H*D, KVH*D) */
        const int whole = c->arch.qk_norm == LOOM_QK_NORM_WHOLE;
        map_add(l, LT(LOOM_L_Q_NORM_W), 0, 0, 1, whole ? QH : D, 0,
                "%slayers.%d.self_attn.q_norm.weight", p, i);
        map_add(l, LT(LOOM_L_K_NORM_W), 0, 0, 1, whole ? KV : D, 0,
                "%slayers.%d.self_attn.k_norm.weight", p, i);
        map_add(l, LT(LOOM_L_ATTN_PROJ_W), 0, 0, 2, C, QH, "%slayers.%d.self_attn.o_proj.weight", p, i);
        map_add(l, LT(LOOM_L_ATTN_PROJ_B), 0, 0, 1, C, 0, "%slayers.%d.self_attn.o_proj.bias", p, i);
        if (c->arch.norm_place == LOOM_NORM_PRE) {
            map_add(l, LT(LOOM_L_LN2_W), 0, 0, 1, C, 0, "%slayers.%d.post_attention_layernorm.weight",
                    p, i);
        } else { /* post (OLMo 2: no pre-norms) and sandwich (Gemma 2/3) norms */
            map_add(l, LT(LOOM_L_ATTN_POST_W), 0, 0, 1, C, 0,
                    "%slayers.%d.post_attention_layernorm.weight", p, i);
            map_add(l, LT(LOOM_L_LN2_W), 0, 0, 1, C, 0, "%slayers.%d.pre_feedforward_layernorm.weight",
                    p, i);
            map_add(l, LT(LOOM_L_FFN_POST_W), 0, 0, 1, C, 0,
                    "%slayers.%d.post_feedforward_layernorm.weight", p, i);
        }
        if (phi3) {
            map_add(l, LT(LOOM_L_GATE_W), 0, 0, 2, 2 * F, C, "%slayers.%d.mlp.gate_up_proj.weight", p, i);
            map_add(l, LT(LOOM_L_UP_W), 0, F * C, 2, 2 * F, C, "%slayers.%d.mlp.gate_up_proj.weight", p, i);
        } else {
            map_add(l, LT(LOOM_L_GATE_W), 0, 0, 2, F, C, "%slayers.%d.mlp.gate_proj.weight", p, i);
            map_add(l, LT(LOOM_L_UP_W), 0, 0, 2, F, C, "%slayers.%d.mlp.up_proj.weight", p, i);
        }
        map_add(l, LT(LOOM_L_FC_PROJ_W), 0, 0, 2, C, F, "%slayers.%d.mlp.down_proj.weight", p, i);
        if (!LT(LOOM_L_MOE_ROUTER_W)) continue;
        /* an MoE layer: the router, and each expert's gate / up rows of loom's (E, 2F, C)
         * moe_fc_w and its (C, F) block of moe_proj_w (E, C, F) */
        const int64_t E = c->n_expert;
        const int mix = fam->moe == HF_MOE_MIXTRAL;
        const char *blk = mix ? "block_sparse_moe" : "mlp";
        map_add(l, LT(LOOM_L_MOE_ROUTER_W), 0, 0, 2, E, C, "%slayers.%d.%s.gate.weight", p, i, blk);
        for (int64_t e = 0; e < E; e++) {
            map_part(l, LT(LOOM_L_MOE_FC_W), e * 2 * F * C, F, C, "%slayers.%d.%s.experts.%lld.%s.weight",
                     p, i, blk, (long long)e, mix ? "w1" : "gate_proj");
            map_part(l, LT(LOOM_L_MOE_FC_W), (e * 2 + 1) * F * C, F, C,
                     "%slayers.%d.%s.experts.%lld.%s.weight", p, i, blk, (long long)e,
                     mix ? "w3" : "up_proj");
            map_part(l, LT(LOOM_L_MOE_PROJ_W), e * C * F, C, F, "%slayers.%d.%s.experts.%lld.%s.weight",
                     p, i, blk, (long long)e, mix ? "w2" : "down_proj");
        }
        if (LT(LOOM_L_MOE_SH_GATE_W)) { /* Qwen2-MoE's shared expert (S = 1) and its gate */
            const int64_t SF = c->shared_d_ff > 0 ? c->shared_d_ff : F;
            map_part(l, LT(LOOM_L_MOE_SH_FC_W), 0, SF, C,
                     "%slayers.%d.mlp.shared_expert.gate_proj.weight", p, i);
            map_part(l, LT(LOOM_L_MOE_SH_FC_W), SF * C, SF, C,
                     "%slayers.%d.mlp.shared_expert.up_proj.weight", p, i);
            map_part(l, LT(LOOM_L_MOE_SH_PROJ_W), 0, C, SF,
                     "%slayers.%d.mlp.shared_expert.down_proj.weight", p, i);
            map_add(l, LT(LOOM_L_MOE_SH_GATE_W), 0, 0, 2, 1, C,
                    "%slayers.%d.mlp.shared_expert_gate.weight", p, i);
        }
    }
#undef LT
    map_add(l, loom_model_global(m, LOOM_P_LNF_W), 0, 0, 1, C, 0, "%snorm.weight", p);
    map_add(l, loom_model_global(m, LOOM_P_LM_HEAD), 0, 0, 2, V, C, "lm_head.weight");
    if (!c->arch.norm_offset) return;
    for (int k = 0; k < l->n; k++) { /* arch.norm_offset: every norm's weight (loom's 1 + w) */
        const loom_tensor_info *t = l->e[k].t;
        const int g = t->layer < 0;
        l->e[k].add1 = g ? t->kind == LOOM_P_LNF_W
                         : (t->kind == LOOM_L_LN1_W || t->kind == LOOM_L_LN2_W ||
                            t->kind == LOOM_L_ATTN_POST_W || t->kind == LOOM_L_FFN_POST_W ||
                            t->kind == LOOM_L_Q_NORM_W || t->kind == LOOM_L_K_NORM_W);
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
    if (e->n) {
        memcpy(dst + e->loff, hf, (size_t)e->n * sizeof *dst);
        return;
    }
    if (!e->transpose) {
        memcpy(dst, hf + e->off, t->numel * sizeof *dst);
        /* Gemma's norms scale by 1 + w computed in float32: loom holds that float */
        if (e->add1)
            for (size_t k = 0; k < t->numel; k++) dst[k] = 1.0f + dst[k];
        return;
    }
    const int64_t R = t->shape[0], Cin = t->shape[1], N = e->hf_shape[1];
    for (int64_t o = 0; o < R; o++)
        for (int64_t i = 0; i < Cin; i++) dst[o * Cin + i] = hf[i * N + e->off + o];
}

/* its part of the HF tensor hf <- loom tensor src */
void hf_map_from_loom(const hf_map *e, const float *src, float *hf) {
    const loom_tensor_info *t = e->t;
    if (e->n) {
        memcpy(hf, src + e->loff, (size_t)e->n * sizeof *hf);
        return;
    }
    if (!e->transpose) {
        memcpy(hf + e->off, src, t->numel * sizeof *src);
        /* w = loom's weight - 1: exact for loom weights in [0.5, 2] (Sterbenz), so that
         * transformers' 1 + w is loom's float again; outside it the nearest float */
        if (e->add1)
            for (size_t k = 0; k < t->numel; k++) hf[e->off + k] = hf[e->off + k] - 1.0f;
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
    float *hostp = NULL; /* (see below) */
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
        {"vocab_size", c->vocab_size, hc.mc.vocab_size},
        {"d_model", c->d_model, hc.mc.d_model},     {"n_layer", c->n_layer, hc.mc.n_layer},
        {"n_head", c->n_head, hc.mc.n_head},        {"n_kv_head", c->n_kv_head, hc.mc.n_kv_head},
        {"d_ff", c->d_ff, hc.mc.d_ff},
        {"moe.experts", c->n_expert, hc.mc.n_expert},
        {"max_seq_len", c->arch.pos == LOOM_POS_LEARNED ? c->max_seq_len : 0,
         c->arch.pos == LOOM_POS_LEARNED ? hc.mc.max_seq_len : 0},
        {"arch.head_dim", loom_config_head_dim(c), loom_config_head_dim(&hc.mc)},
    };
    const loom_arch *ma = &c->arch, *da = loom_config_arch(&hc.mc);
    if (ma->norm != da->norm || ma->pos != da->pos || ma->mlp != da->mlp ||
        ma->qkv_bias != da->qkv_bias || ma->o_bias != da->o_bias || ma->tied != da->tied ||
        ma->qk_norm != da->qk_norm || ma->moe_renorm != da->moe_renorm ||
        ma->norm_place != da->norm_place || ma->norm_offset != da->norm_offset)
        return loom_errf(err, "%s/config.json: the model's architecture ('%s' and its "
                              "model.arch.* features) is not the directory's (%s): the weights "
                              "would not match", dir, ma->name, hc.fam->arch);
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++)
        if (cmp[i].have != cmp[i].want)
            return loom_errf(err, "%s/config.json: the model has model.%s = %d, the directory's "
                                  "model %d: the shapes of the weights would not match",
                             dir, cmp[i].key, cmp[i].have, cmp[i].want);
    if (weights_open(dir, &w, err)) return -1;
    const char *prefix = "";
    /* a bare decoder (GPT2Model, LlamaModel) has no prefix */
    char emb[64];
    snprintf(emb, sizeof emb, "%s%s", hc.fam->prefix,
             hc.fam->map == HF_MAP_GPT2 ? "wte.weight" : "embed_tokens.weight");
    if (weights_has(&w, emb)) prefix = hc.fam->prefix;
    hf_map_build(m, hc.fam, prefix, &map);
    /* the parameters are the backend's memory: on a backend whose memory is not host memory
     * they are read back whole first and copied in after (loom_model_params_to_host) */
    hostp = loom_model_params_to_host(m);
    float *params = hostp ? hostp : loom_model_params(m);
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
            for (int j = 0; j < 2 && hc.fam->skip[j]; j++) /* a multimodal model's other parts */
                used |= !strncmp(name, hc.fam->skip[j], strlen(hc.fam->skip[j]));
            /* a tied lm_head.weight is wte; transformers may still store it */
            if (c->arch.tied && !strcmp(name, "lm_head.weight")) used = 1;
            for (int i = 0; i < map.n && !used; i++) used = !strcmp(map.e[i].hf, name);
            if (!used) {
                loom_errf(err, "%s/%s: tensor '%.200s' is not part of a %s that loom can "
                               "represent", dir, w.names[fi], name, hc.fam->arch);
                goto done;
            }
        }
    if (hostp) loom_model_params_from_host(m, hostp);
    rc = 0;
done:
    free(hostp);
    free(buf);
    hf_map_free(&map);
    weights_close(&w);
    return rc;
}

int loom_hf_dir_prepare(const char *out_dir, loom_err *err) {
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
    rc = hf_write_json(out_dir, "model.safetensors.index.json", idx, err);
done:
    free(shard);
    return rc;
}

/* the HF tensors of a whole model, in map order (data malloc'd; free with free_tensors) */
static loom_st_tensor *model_tensors(loom_model *m, const hf_map_list *map, int *n_out) {
    loom_st_tensor *ts = loom_calloc((size_t)map->n + 1, sizeof *ts);
    float *hostp = loom_model_params_to_host(m); /* NULL: the arena itself is host memory */
    const float *params = hostp ? hostp : loom_model_params(m);
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
    free(hostp);
    *n_out = n;
    return ts;
}

static void free_tensors(loom_st_tensor *ts, int n) {
    for (int i = 0; i < n; i++) free((void *)ts[i].data);
    free(ts);
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
    const int gpt2 = hf_family_of(c)->map == HF_MAP_GPT2, r = loom_lora_rank(l);
    if (hf_family_of(c)->map == HF_MAP_PHI3)
        return loom_errf(err, "LoRA adapters of a Phi3ForCausalLM (fused qkv_proj, gate_up_proj) "
                              "have no PEFT layout loom writes: export with --merge-lora");
    const unsigned tg = loom_lora_targets(l);
    const int nqkv = !!(tg & LOOM_LORA_Q) + !!(tg & LOOM_LORA_K) + !!(tg & LOOM_LORA_V);
    const int nt = loom_lora_num_tensors(l);
    loom_st_tensor *ts = loom_calloc((size_t)nt + 1, sizeof *ts);
    char (*names)[160] = loom_calloc((size_t)nt + 1, sizeof *names);
    float **own = loom_calloc((size_t)nt + 1, sizeof *own);
    float *p = loom_lora_to_host(l, loom_lora_params(l)); /* the adapters, staged */
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
                ts[k] = (loom_st_tensor){names[k], d, 2, {b ? 3 * C : R, b ? R : C}, NULL};
                k++;
            }
            continue;
        }
        snprintf(names[k], sizeof names[k], "base_model.model.%s.%d.%s.lora_%c.weight",
                 gpt2 ? "transformer.h" : "model.layers", x->layer, mod, x->is_b ? 'B' : 'A');
        ts[k] = (loom_st_tensor){names[k], p + x->offset, 2, {x->rows, x->cols}, NULL};
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
    free(p);
    if (rc) return -1;
    json_t *tm = json_array();
    for (int t = 0; t < LOOM_LORA_NT; t++) {
        if (!(tg & (1u << t))) continue;
        if (gpt2 && t <= 2 && t != (tg & LOOM_LORA_Q ? 0 : tg & LOOM_LORA_K ? 1 : 2)) continue;
        const char *mod = gpt2 ? gpt2_mods[t] : strchr(llama_mods[t], '.') + 1;
        json_array_append_new(tm, json_string(gpt2 && t <= 2 ? "c_attn" : mod));
    }
    const double alpha = hf_float_as_double(loom_lora_alpha(l));
    json_t *cfgj = json_pack("{s:s, s:s, s:i, s:f, s:f, s:o, s:s, s:b, s:n, s:b}", "peft_type",
                             "LORA", "task_type", "CAUSAL_LM", "r", r, "lora_alpha", alpha,
                             "lora_dropout", hf_float_as_double(loom_lora_dropout(l)),
                             "target_modules", tm, "bias", "none",
                             "fan_in_fan_out", gpt2, "base_model_name_or_path", "inference_mode", 1);
    if (gpt2 && nqkv) { /* the fused c_attn adapter's rank and alpha */
        json_object_set_new(cfgj, "rank_pattern", json_pack("{s:i}", "c_attn", nqkv * r));
        json_object_set_new(cfgj, "alpha_pattern", json_pack("{s:f}", "c_attn", alpha * nqkv));
    }
    return hf_write_json(out_dir, "adapter_config.json", cfgj, err);
}


int loom_hf_write_tokenizer(const char *out_dir, const loom_tokenizer *tok, int max_len,
                            const char *chat_jinja, int *eos_out, loom_err *err) {
    char path[4400];
    char *s = loom_tokenizer_hf_json(tok);
    int32_t eos = loom_tokenizer_special_id(tok, "<|endoftext|>");
    int rc = loom_path_fmt(path, sizeof path, err, "%s/tokenizer.json", out_dir);
    if (!rc) rc = loom_write_file_atomic(path, s, strlen(s), err);
    free(s);
    if (rc) return -1;
    json_t *tc = json_pack("{s:s, s:I, s:b, s:b}", "tokenizer_class", "PreTrainedTokenizerFast",
                           "model_max_length", (json_int_t)max_len, "add_bos_token", 0,
                           "clean_up_tokenization_spaces", 0);
    if (eos >= 0) {
        json_object_set_new(tc, "eos_token", json_string("<|endoftext|>"));
        json_object_set_new(tc, "bos_token", json_string("<|endoftext|>"));
    }
    if (chat_jinja) json_object_set_new(tc, "chat_template", json_string(chat_jinja));
    if (hf_write_json(out_dir, "tokenizer_config.json", tc, err)) return -1;
    *eos_out = eos;
    return 0;
}

int loom_hf_model_tensors(loom_model *m, loom_st_tensor **ts, int *n, const char **model_type,
                          loom_err *err) {
    const loom_model_config *c = loom_model_get_config(m);
    if (loom_hf_export_check(c, err)) return -1;
    hf_map_list map = {0};
    const hf_family *f = hf_family_of(c);
    hf_map_build(m, f, f->prefix, &map);
    loom_st_tensor *t = model_tensors(m, &map, n);
    /* the names point into the map: copied, so the list outlives it */
    for (int i = 0; i < *n; i++) t[i].name = loom_strdup(t[i].name);
    hf_map_free(&map);
    *ts = t;
    if (model_type) *model_type = f->model_type;
    return 0;
}

void loom_hf_tensors_free(loom_st_tensor *ts, int n) {
    for (int i = 0; ts && i < n; i++) free((void *)ts[i].name);
    free_tensors(ts, n);
}

int loom_hf_write_model(const char *out_dir, loom_model *m, loom_lora *lora, int eos,
                        uint64_t max_shard, loom_err *err) {
    const loom_model_config *c = loom_model_get_config(m);
    hf_map_list map = {0};
    loom_st_tensor *ts = NULL;
    int n = 0, rc = -1;
    if (loom_hf_export_check(c, err)) return -1;
    hf_map_build(m, hf_family_of(c), hf_family_of(c)->prefix, &map);
    ts = model_tensors(m, &map, &n);
    if (hf_write_weights(out_dir, ts, n, max_shard, err)) goto done;
    json_t *gen = json_object();
    if (eos >= 0) {
        json_object_set_new(gen, "bos_token_id", json_integer(eos));
        json_object_set_new(gen, "eos_token_id", json_integer(eos));
    }
    json_object_set_new(gen, "_from_model_config", json_true());
    if (hf_write_json(out_dir, "generation_config.json", gen, err) ||
        (lora && hf_write_peft(out_dir, m, lora, err)) ||
        hf_write_json(out_dir, "config.json", hf_config_json(c, eos), err))
        goto done;
    rc = 0;
done:
    free_tensors(ts, n);
    hf_map_free(&map);
    return rc;
}
