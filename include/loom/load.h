/* Loading a trained model for inference (src/ckpt/load.c): a checkpoint's weights, its config
 * read back with the run config's schema, what the model was trained on (its tokenizer and
 * classes), LoRA adapters. Below train/ (docs/architecture.md): generate, serve, eval, synth and
 * interop load models through it without depending on the trainer. The checkpoint format itself
 * is loom/checkpoint.h and loom/ckpt_pieces.h (the same module, src/ckpt/). */
#ifndef LOOM_LOAD_H
#define LOOM_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "loom/checkpoint.h"
#include "loom/config.h"
#include "loom/model.h"

/* Every key `loom train` accepts, with defaults (model.* included); *n gets the count: the
 * schema of a run's config.yaml (src/ckpt/run_schema.c). */
const loom_config_key *loom_train_schema(int *n);
/* its obs.*, profile.* and alerts keys */
extern const loom_config_key loom_obs_config_keys[];
extern const int loom_obs_config_nkeys;

/* Loads the model of a checkpoint (a step directory, `latest`, a ckpt root or a run
 * directory) for inference: verifies the checkpoint, rebuilds the model from its
 * config.yaml with batch B (B <= 0: the run's training.batch_size) and T = model.max_seq_len
 * (T = training.seq_len when T_train is set), and loads the weights. The model is an
 * inference one (LOOM_MODEL_INFER): no gradients, no optimizer state, activations only at its
 * first forward. cfg_out (may be NULL) receives the checkpoint's resolved config (the caller
 * frees it). */
int loom_load_model(const char *path, int B, int T_train, loom_model **out,
                    loom_config **cfg_out, loom_err *err);

/* What a model was trained on, as its checkpoint records it (data.json, tokenizer.json; see
 * docs/checkpoints.md). A checkpoint written before data.json falls back to its run's
 * data.train (dataset.json), and is refused when that cannot tell. */
typedef struct loom_run_data {
    char *where;           /* the file it came from, for messages */
    char *tokenizer_id;    /* "byte" or the sha256 of the canonical tokenizer.json */
    char *tokenizer_json;  /* BPE: the tokenizer.json text (NULL when none was recorded) */
    size_t tokenizer_json_len;
    char **classes;        /* classify: the class names in label order; NULL otherwise */
    int n_classes;
    char *chat_template;   /* a built-in chat template the model's chat_template matched (an
                            * import from Hugging Face records it), or NULL */
    char *chat_default_system; /* its default system message, or NULL */
} loom_run_data;
void loom_run_data_free(loom_run_data *d);
/* loom_load_model, and what the model was trained on (data_out may be NULL; caller frees). */
int loom_load_model_ex(const char *path, int B, int T_train, loom_model **out,
                       loom_config **cfg_out, loom_run_data **data_out, loom_err *err);

/* loom_load_model_ex; a LoRA checkpoint's adapters are merged into the parameters, unless
 * lora_out is not NULL: then they are attached to the model (a loom_lora, include/loom/lora.h;
 * *lora_out = NULL for a checkpoint without adapters). */
struct loom_lora;
int loom_load_model_lora(const char *path, int B, int T_train, loom_model **out,
                         loom_config **cfg_out, loom_run_data **data_out,
                         struct loom_lora **lora_out, loom_err *err);
/* loom_load_model_lora for the view `layout` of the model (NULL: the whole model), e.g. tensor
 * parallelism's tp rank r of tp: each tensor's box of that view is read from the checkpoint's
 * pieces, whatever layout they were saved with. A layout the model's config does not allow
 * (tp not dividing n_head, ...) is an error naming the checkpoint. */
int loom_load_model_view(const char *path, const loom_model_layout *layout, int B, int T_train,
                         loom_model **out, loom_config **cfg_out, loom_run_data **data_out,
                         struct loom_lora **lora_out, loom_err *err);

typedef struct loom_tokenizer loom_tokenizer;
typedef struct loom_dataset loom_dataset;
/* data.json's text for a checkpoint (caller frees). */
char *loom_run_data_json(const loom_run_data *d, const char *train_dir);
/* The tokenizer the model was trained with (byte, or BPE from its tokenizer.json). */
int loom_run_data_tokenizer(const loom_run_data *d, loom_tokenizer **out, loom_err *err);
/* 0 when dataset dir (opened as ds) was tokenized with the model's tokenizer; otherwise an
 * error naming the dataset and the checkpoint's record. */
int loom_run_data_check_dataset(const loom_run_data *d, const loom_dataset *ds, const char *dir,
                                loom_err *err);
/* 0 when dir/dataset.json lists exactly the model's classes (names and order). */
int loom_run_data_check_classes(const loom_run_data *d, const char *dir, loom_err *err);

/* finetune.lora.* of cfg, checked (rank 0 = off; alpha > 0, dropout in [0, 1), targets of the
 * model's MLP kind: gelu_mlp), for the trainer and for loading a LoRA checkpoint. */
int loom_lora_settings(const loom_config *cfg, int gelu_mlp, int *rank, float *alpha,
                       unsigned *targets, float *dropout, loom_err *err);

/* lora.safetensors (src/ckpt/lora_file.c): the adapters (and, when m is not NULL, their
 * moments m and v) */
int loom_lora_serialize(struct loom_lora *l, const float *m, const float *v, char **buf,
                        size_t *len, loom_err *err);
int loom_lora_restore(struct loom_lora *l, const char *data, size_t len, const char *where,
                      float *m, float *v, loom_err *err);

/* the record's file in a checkpoint's step directory */
#define LOOM_RUN_DATA_FILE "data.json"
/* The run's data record from its training dataset (tokenizer id and tokenizer.json; classes
 * when classify); where = dir. */
int loom_run_data_from_dataset(const loom_dataset *ds, const char *dir, int classify,
                               loom_run_data **out, loom_err *err);
/* From an open checkpoint (data.json + tokenizer.json), or for an older checkpoint from
 * cfg's data.train. */
int loom_run_data_read(const loom_ckpt *ck, const loom_config *cfg, loom_run_data **out,
                       loom_err *err);

#endif
