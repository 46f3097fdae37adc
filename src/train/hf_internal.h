/* Hugging Face interop internals shared by hf.c and the LoRA export. */
#ifndef LOOM_HF_INTERNAL_H
#define LOOM_HF_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>

#include "loom/config.h"
#include "loom/model.h"
#include "loom/safetensors.h"
#include "loom/train.h"

typedef struct hf_cfg {
    loom_model_config mc;
    const char *arch; /* "GPT2LMHeadModel" or "LlamaForCausalLM" */
    int tied;         /* llama: tie_word_embeddings (lm_head read from embed_tokens) */
} hf_cfg;
int hf_read_config(const char *dir, hf_cfg *hc, loom_err *err);

/* One loom tensor as part of one HF tensor: loom = hf_flat[off + k] (transpose 0), or
 * loom[o][i] = hf[i][off + o] (transpose 1: Conv1D's (in, out) layout, a column block). */
typedef struct hf_map {
    char hf[160];
    const loom_tensor_info *t;
    int transpose;
    int64_t off;
    int hf_ndim;
    int64_t hf_shape[2];
} hf_map;
typedef struct hf_map_list {
    hf_map *e;
    int n, cap;
} hf_map_list;
/* The map of a whole model (entries of one HF tensor are consecutive). */
void hf_map_build(const loom_model *m, const char *prefix, int tied, hf_map_list *l);
void hf_map_free(hf_map_list *l);
int64_t hf_map_numel(const hf_map *e);
void hf_map_to_loom(const hf_map *e, const float *hf, float *dst);
void hf_map_from_loom(const hf_map *e, const float *src, float *hf);

void hf_config_set_model(loom_config *c, const loom_model_config *mc);
int hf_save_ckpt(const char *out_root, loom_model *m, const loom_config *cfg,
                 const loom_run_data *rd, const char *source, loom_err *err);
int hf_dir_prepare(const char *out_dir, loom_err *err);
int hf_write_weights(const char *out_dir, const loom_st_tensor *ts, int n, uint64_t max_shard,
                     loom_err *err);
int hf_write_tokenizer(const char *out_dir, const loom_run_data *rd, const loom_model_config *c,
                       int *eos_out, loom_err *err);

#endif
