/* Private to src/hf: the family table, the config reader's result and the tensor maps. */
#ifndef LOOM_HF_INTERNAL_H
#define LOOM_HF_INTERNAL_H

#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>

#include "loom/config.h"
#include "loom/lora.h"
#include "loom/model.h"
#include "loom/safetensors.h"

/* The tensor-name layouts: GPT-2's (Conv1D, fused c_attn), Llama's (separate q/k/v and
 * gate/up; Mistral, Qwen 2/3 use it, Qwen 3 with q_norm/k_norm), Phi-3's (fused qkv_proj
 * rows [q | k | v] and gate_up_proj rows [gate | up]). */
enum { HF_MAP_GPT2 = 0, HF_MAP_LLAMA = 1, HF_MAP_PHI3 = 2 };
/* MoE layouts: none; Mixtral's (block_sparse_moe.gate, experts.<e>.w1/w3/w2, always
 * renormalized top-k); Qwen's (mlp.gate, mlp.experts.<e>.gate/up/down_proj, norm_topk_prob);
 * Qwen2-MoE's: Qwen's plus one shared expert (mlp.shared_expert.gate/up/down_proj, width
 * shared_expert_intermediate_size) behind a sigmoid gate (mlp.shared_expert_gate) */
enum { HF_MOE_NONE = 0, HF_MOE_MIXTRAL = 1, HF_MOE_QWEN = 2, HF_MOE_QWEN2 = 3 };

/* One row per Hugging Face architecture: its names, the loom descriptor it starts from and
 * what its config.json may switch (hf_config.c reads the rest). */
typedef struct hf_family {
    const char *arch;       /* "LlamaForCausalLM" */
    const char *model_type; /* "llama" */
    const char *descriptor; /* loom's named descriptor (loom_arch_named) */
    const char *prefix;     /* of the decoder's tensors: "model." */
    int map;                /* HF_MAP_* */
    int attn_bias_key;      /* 'attention_bias' puts biases on q, k, v and o */
    int sliding_keys;       /* 'sliding_window' (and 'use_sliding_window', 'layer_types') */
    int moe;                /* HF_MOE_*: the MoE layout and keys */
    /* a multimodal model whose language model loom imports alone: its config is config.json's
     * text_config, the tensors under these prefixes (the vision tower, the projector) are
     * left out, and it exports as the text-only architecture as_text */
    const char *as_text;
    const char *skip[2];
} hf_family;
/* the row of an architecture name, or NULL */
const hf_family *hf_family_find(const char *arch);
/* the row a loom model exports as (its arch.family, else by its descriptor), or NULL */
const hf_family *hf_family_of(const loom_model_config *c);
/* the architectures loom imports, ", "-separated */
const char *hf_family_names(void);

typedef struct hf_cfg {
    loom_model_config mc;
    const hf_family *fam;
} hf_cfg;
int hf_read_config(const char *dir, hf_cfg *hc, loom_err *err);
/* config.json of a model (the architecture of hf_family_of) */
json_t *hf_config_json(const loom_model_config *c, int eos);
int hf_write_json(const char *dir, const char *name, json_t *o, loom_err *err);
/* The shortest decimal that reads back as the float f (so 1e-06 stays 1e-06). */
double hf_float_as_double(float f);

/* One loom tensor as part of one HF tensor: loom = hf_flat[off + k] (transpose 0), or
 * loom[o][i] = hf[i][off + o] (transpose 1: Conv1D's (in, out) layout, a column block); or,
 * with n > 0, a part of a loom tensor as one HF tensor: loom_flat[loff + k] = hf_flat[k],
 * k < n (the per-expert HF tensors of loom's (E, ...) expert tensors). */
typedef struct hf_map {
    char hf[160];
    const loom_tensor_info *t;
    int transpose;
    int64_t off;
    int64_t loff, n;
    int add1;               /* a norm weight of arch.norm_offset: loom = hf + 1 (Gemma's 1 + w) */
    int hf_ndim;
    int64_t hf_shape[2];
} hf_map;
typedef struct hf_map_list {
    hf_map *e;
    int n, cap;
} hf_map_list;
/* The map of a whole model in family fam's names (entries of one HF tensor are consecutive). */
void hf_map_build(const loom_model *m, const hf_family *fam, const char *prefix,
                  hf_map_list *l);
void hf_map_free(hf_map_list *l);
int64_t hf_map_numel(const hf_map *e);
void hf_map_to_loom(const hf_map *e, const float *hf, float *dst);
void hf_map_from_loom(const hf_map *e, const float *src, float *hf);

int hf_write_weights(const char *out_dir, const loom_st_tensor *ts, int n, uint64_t max_shard,
                     loom_err *err);

#endif
