/* loom trainer: the single-process training loop, checkpoints, metrics. */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "loom/config.h"
#include "loom/load.h" /* the run config's schema, loading a model (src/ckpt/) */

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
/* finetune.lora (the engine then trains the adapters, the base frozen): the adapters (NULL
 * without; their tensors: include/loom/lora.h), and a copy of all of them (num_params floats)
 * into out: kind 0 = parameters, 1 = AdamW m, 2 = AdamW v, 3 = the last step's gradients
 * (summed over the ranks, before clipping's factor). Returns the floats copied (0: none). */
struct loom_lora;
struct loom_lora *loom_train_engine_lora(loom_train_engine *e);
size_t loom_train_engine_lora_read(loom_train_engine *e, int kind, float *out);

#endif
