/* loom trainer: the single-process training loop, checkpoints, metrics. */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "loom/config.h"

/* Every key `loom train` accepts, with defaults (model.* included); *n gets the count. */
const loom_config_key *loom_train_schema(int *n);

/* Applies the schema to cfg (defaults, unknown keys rejected), writes the resolved config
 * to <run.dir>/config.yaml, resumes from the newest complete checkpoint under
 * <run.dir>/ckpt when there is one, and trains to training.steps. Returns 0, -1 on an error,
 * LOOM_TRAIN_EXIT_ALERT_STOP when an alert rule with action stop ended the run after a
 * checkpoint, or LOOM_TRAIN_EXIT_SIGNAL + N when signal N (SIGINT, SIGTERM) stopped it after a
 * checkpoint (the shells' status for a signal: 130, 143). Both stops are agreed by every rank,
 * so they end without an MPI abort; err says which; `loom train` exits with that status. */
#define LOOM_TRAIN_EXIT_ALERT_STOP 3
#define LOOM_TRAIN_EXIT_SIGNAL 128
int loom_train(loom_config *cfg, loom_err *err);

/* ---- the training engine, without a run --------------------------------------------------
 * What one optimizer step of `loom train` runs (the mesh of parallel.*, the model, the DP/ZeRO
 * engine with AdamW and global-norm clipping, the lr schedule), set up and stepped through the
 * trainer's own functions, on batches the caller gives: tests/reference/test_engine.py drives
 * it against PyTorch. No run directory, dataset, metrics or checkpoint. */
typedef struct loom_train_engine loom_train_engine;
/* cfg: `loom train`'s keys (the schema is applied to it: defaults, unknown keys refused;
 * data.train must be set but is not opened). cfg must outlive the engine. Collective over the
 * world under MPI, like loom_train. */
int loom_train_engine_create(loom_config *cfg, loom_train_engine **out, loom_err *err);
void loom_train_engine_free(loom_train_engine *e);
/* One optimizer step on training.grad_accum global micro-batches: inputs (accum, B, T) token
 * ids, targets (accum, B, T) next tokens (-1 = ignored) or, for a classify head, (accum, B)
 * labels. Out of range ids are refused. *loss: the step's loss summed over its valid targets /
 * their count (the mean of one batch of accum x B rows; so is the gradient); *lr:
 * the rate of the schedule this step used; *grad_norm: the global norm before clipping. */
int loom_train_engine_step(loom_train_engine *e, const int32_t *inputs, const int32_t *targets,
                           double *loss, double *lr, double *grad_norm, loom_err *err);
/* steps taken (the trainer's count), steps skipped as not finite, and the DP engine's AdamW
 * step count */
int64_t loom_train_engine_steps_done(const loom_train_engine *e);
int64_t loom_train_engine_skipped_steps(const loom_train_engine *e);
int64_t loom_train_engine_optimizer_step(const loom_train_engine *e);
/* The model's tensors, in arena order: name (NULL when i is out of range) and element count. */
int loom_train_engine_num_tensors(const loom_train_engine *e);
const char *loom_train_engine_tensor_name(const loom_train_engine *e, int i);
size_t loom_train_engine_tensor_numel(const loom_train_engine *e, int i);
/* Copies what this rank holds of tensor i (kind 0 = parameters, 1 = AdamW m, 2 = AdamW v;
 * all of it in a world of one, at every ZeRO stage) into out (numel floats, flat, at its
 * element offsets). Returns the elements copied. */
size_t loom_train_engine_read(loom_train_engine *e, int kind, int i, float *out);



#include "loom/model.h"
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
/* The tokenizer the model was trained with (byte, or BPE from its tokenizer.json). */
/* data.json's text for a checkpoint (caller frees). */
char *loom_run_data_json(const loom_run_data *d, const char *train_dir);
int loom_run_data_tokenizer(const loom_run_data *d, loom_tokenizer **out, loom_err *err);
/* 0 when dataset dir (opened as ds) was tokenized with the model's tokenizer; otherwise an
 * error naming the dataset and the checkpoint's record. */
int loom_run_data_check_dataset(const loom_run_data *d, const loom_dataset *ds, const char *dir,
                                loom_err *err);
/* 0 when dir/dataset.json lists exactly the model's classes (names and order). */
int loom_run_data_check_classes(const loom_run_data *d, const char *dir, loom_err *err);
#endif
