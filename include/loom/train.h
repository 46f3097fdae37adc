/* loom trainer: the single-process training loop, checkpoints, metrics. */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include "loom/config.h"

/* Every key `loom train` accepts, with defaults (model.* included); *n gets the count. */
const loom_config_key *loom_train_schema(int *n);

/* Applies the schema to cfg (defaults, unknown keys rejected), writes the resolved config
 * to <run.dir>/config.yaml, resumes from the newest complete checkpoint under
 * <run.dir>/ckpt when there is one, and trains to training.steps. */
int loom_train(loom_config *cfg, loom_err *err);



#include "loom/model.h"
/* Loads the model of a checkpoint (a step directory, `latest`, a ckpt root or a run
 * directory) for inference: verifies the checkpoint, rebuilds the model from its
 * config.yaml with batch B (B <= 0: the run's training.batch_size) and T = model.max_seq_len
 * (T = training.seq_len when T_train is set), and loads the weights. cfg_out (may be NULL) receives the checkpoint's resolved
 * config (the caller frees it). */
int loom_load_model(const char *path, int B, int T_train, loom_model **out,
                    loom_config **cfg_out, loom_err *err);
#endif
