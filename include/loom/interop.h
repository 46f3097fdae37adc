/* loom import --hf / loom export --hf (src/interop/): Hugging Face directories (the formats
 * of include/loom/hf.h) <-> loom checkpoints. docs/hf-interop.md. */
#ifndef LOOM_INTEROP_H
#define LOOM_INTEROP_H

#include <stdint.h>

#include "loom/base.h"

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
    /* tokenizer_config.json's chat_template: this template (a built-in name or a JSON template
     * file, as loom_chat_template_load takes), else the one the checkpoint records (an import's:
     * data.json chat_template), else none; written as Jinja (loom_chat_template_jinja) */
    const char *chat_template;
} loom_hf_export_opts;
/* A loom checkpoint (any path loom_ckpt_resolve takes) -> a Hugging Face directory out_dir
 * (created; refused when it exists and is not empty). */
int loom_hf_export(const char *ckpt, const char *out_dir, const loom_hf_export_opts *o,
                   loom_err *err);
/* loom export --gguf (src/interop/gguf.c, docs/inference.md "GGUF export"): a loom checkpoint
 * -> one GGUF v3 file at out for llama.cpp (architectures llama: Llama and Mistral, qwen2,
 * gpt2; others refused naming theirs), its 2-D tensors in type "f32", "bf16", "q8_0" or
 * "q4_k" (those with rows of whole 256-blocks but the embedding and head in Q4_K, the others
 * Q8_0: what --weights int4 holds; 1-D ones f32), the tokenizer and chat template in the metadata. Written to a temp file and
 * renamed: an error leaves no out. */
int loom_gguf_export(const char *ckpt, const char *out, const char *type, loom_err *err);

#endif
