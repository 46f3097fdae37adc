/* Hugging Face formats (src/hf/, docs/hf-interop.md): config.json <-> loom model configs
 * through one table row per architecture (GPT2LMHeadModel, LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM), the tensor-name
 * maps, the weights (model.safetensors or shards + model.safetensors.index.json), the
 * tokenizer and PEFT adapter files. Only JSON and safetensors are read: nothing in a
 * directory is ever executed or unpickled. loom import / export (checkpoints) are
 * include/loom/interop.h. */
#ifndef LOOM_HF_H
#define LOOM_HF_H

#include <stddef.h>
#include <stdint.h>

#include "loom/base.h"
#include "loom/config.h"
#include "loom/model.h"
#include "loom/safetensors.h"

struct loom_lora;
struct loom_tokenizer;

/* 1 when dir looks like a Hugging Face model directory (it holds config.json and no loom
 * checkpoint marker). */
int loom_hf_is_dir(const char *dir);

/* Reads dir/config.json into a loom model config: the architecture must be one loom imports,
 * with the options loom computes exactly (errors name the file and the key). *arch (may be
 * NULL) receives a static string naming it. */
int loom_hf_read_config(const char *dir, loom_model_config *mc, const char **arch,
                        loom_err *err);

/* Fills the parameters of m (a whole-model view with its own parameter arena, whose config
 * must be the one loom_hf_read_config gives for dir, up to max_seq_len for learned positions
 * and the options that hold no weights) from dir's safetensors. Every tensor the model needs
 * must be there with its exact shape; every tensor there must be one loom maps (or a known
 * buffer): errors name the file and the tensor. F32, F16, BF16 and F64 are read (converted
 * to F32). */
int loom_hf_load_params(const char *dir, loom_model *m, loom_err *err);

/* The model.* keys of an imported config (the descriptor as model.flavor + model.arch.*). */
void loom_hf_config_set(loom_config *c, const loom_model_config *mc);

/* 0 when a model of this config has a Hugging Face layout to export to, else an error
 * naming what has none (MoE, a feature no family row combines). */
int loom_hf_export_check(const loom_model_config *c, loom_err *err);
/* out_dir created, or an existing empty directory; a non-empty one is refused. */
int loom_hf_dir_prepare(const char *out_dir, loom_err *err);
/* tokenizer.json (the tokenizer's canonical file) and tokenizer_config.json (with
 * chat_template = chat_jinja when not NULL); *eos = the id of <|endoftext|> or -1. */
int loom_hf_write_tokenizer(const char *out_dir, const struct loom_tokenizer *tok, int max_len,
                            const char *chat_jinja, int *eos, loom_err *err);
/* The weights of a whole model in its family's names (sharded above max_shard bytes),
 * generation_config.json, PEFT adapter files for lora (NULL: none) and config.json, last. */
int loom_hf_write_model(const char *out_dir, loom_model *m, struct loom_lora *lora, int eos,
                        uint64_t max_shard, loom_err *err);
/* The tensors of a whole model in its family's Hugging Face names and layouts, fp32, as
 * loom_hf_write_model writes them (*model_type, may be NULL: the family's config.json
 * model_type, "llama", "qwen2", "gpt2", ...); *ts malloc'd, freed by loom_hf_tensors_free.
 * The GGUF export (src/interop/gguf.c) converts these, as llama.cpp's converter does. */
int loom_hf_model_tensors(loom_model *m, loom_st_tensor **ts, int *n, const char **model_type,
                          loom_err *err);
void loom_hf_tensors_free(loom_st_tensor *ts, int n);

#endif
