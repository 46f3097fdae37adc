/* Hugging Face interop: GPT2LMHeadModel and LlamaForCausalLM directories (config.json,
 * model.safetensors or sharded model-*.safetensors + model.safetensors.index.json,
 * tokenizer.json, generation_config.json) to loom checkpoints and back. Only JSON and
 * safetensors are read: nothing in a directory is ever executed or unpickled. See
 * docs/hf-interop.md. (src/train/hf.c) */
#ifndef LOOM_HF_H
#define LOOM_HF_H

#include <stddef.h>
#include <stdint.h>

#include "loom/base.h"
#include "loom/model.h"

/* 1 when dir looks like a Hugging Face model directory (it holds config.json and no loom
 * checkpoint marker). */
int loom_hf_is_dir(const char *dir);

/* Reads dir/config.json into a loom model config: the architecture must be GPT2LMHeadModel
 * or LlamaForCausalLM with the options loom computes exactly (errors name the key). *arch
 * (may be NULL) receives a static string naming it. */
int loom_hf_read_config(const char *dir, loom_model_config *mc, const char **arch,
                        loom_err *err);

/* Fills the parameters of m (a whole-model view with its own parameter arena, whose config
 * must be the one loom_hf_read_config gives for dir, up to max_seq_len for GPT-2 and the
 * options that hold no weights) from dir's safetensors. Every tensor the model needs must be
 * there with its exact shape; every tensor there must be one loom maps (or a known buffer):
 * errors name the file and the tensor. F32, F16, BF16 and F64 are read (converted to F32). */
int loom_hf_load_params(const char *dir, loom_model *m, loom_err *err);

typedef struct loom_hf_import_opts {
    const char *tokenizer; /* NULL: dir/tokenizer.json; "byte": the byte tokenizer; else a
                            * tokenizer.json path */
} loom_hf_import_opts;
/* dir -> a loom checkpoint at out_root/step_0000000 (out_root/latest points at it) with the
 * parameters, config.yaml, data.json and (BPE) tokenizer.json, loadable by generate, eval
 * and training.init_from. */
int loom_hf_import(const char *dir, const char *out_root, const loom_hf_import_opts *o,
                   loom_err *err);

typedef struct loom_hf_export_opts {
    uint64_t max_shard_bytes; /* 0: 2 GiB. Above it the weights are split into
                               * model-0000i-of-0000n.safetensors + model.safetensors.index.json */
    int merge_lora;           /* LoRA checkpoints: 1 = merged weights, 0 = PEFT adapter files */
} loom_hf_export_opts;
/* A loom checkpoint (any path loom_ckpt_resolve takes) -> a Hugging Face directory out_dir
 * (created; refused when it exists and is not empty). */
int loom_hf_export(const char *ckpt, const char *out_dir, const loom_hf_export_opts *o,
                   loom_err *err);

#endif
