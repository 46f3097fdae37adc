/* Private to src/train: what connects the trainer to src/obs (profiler, per-rank timing,
 * sinks, alerts). docs/observability.md. */
#ifndef LOOM_TRAIN_OBS_H
#define LOOM_TRAIN_OBS_H

#include "loom/backend.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/metrics.h"
#include "loom/model.h"
#include "loom/train.h"

struct trainer;



/* Exit status of `loom train` when an alert rule with action `stop` ended the run (after a
 * checkpoint); loom_train returns it (other failures return -1). */
#define LOOM_TRAIN_ALERT_STOP LOOM_TRAIN_EXIT_ALERT_STOP

/* The scalars of one logged step, as metrics.jsonl has them (rank 0). val_loss < 0: none;
 * mfu < 0: none. */
typedef struct train_obs_row {
    int64_t step;
    double loss, lr, grad_norm, tokens_per_s, mfu, step_ms, val_loss, rss_bytes;
    int skipped;
    int64_t skipped_total;
} train_obs_row;

typedef struct train_obs train_obs;

/* Before anything is created: checks the obs.*, profile.* and alerts keys (errors name the
 * key), and with profile.steps set makes mc->backend the profiling twin of the chosen backend. */
int train_obs_wrap_backend(const loom_config *cfg, loom_model_config *mc, loom_err *err);
/* After the mesh, model and checkpoint exist (t->step is the step resumed from): reads the
 * keys, arms the profiler (peak: per-rank FLOP/s on rank 0, broadcast), watches the
 * collectives, opens rank 0's sinks and alert rules. Collective over the world. */
int train_obs_create(struct trainer *t, double peak, train_obs **out, loom_err *err);
/* LOOM_TEST_LOSS_SPIKE="STEP:FACTOR" (a test hook, tests/e2e/test_alerts.sh): the loss
 * reported for STEP (metrics, sinks, alerts) is multiplied by FACTOR; training is unchanged. */
double train_obs_test_loss(int64_t step, double loss);
/* Top of a step (t->step + 1 is the step about to run). */
void train_obs_step_begin(train_obs *o, struct trainer *t);
/* After the optimizer step: gathers every rank's timing (step seconds dt, data wait, exposed
 * communication from cs, memory) and names a straggler. Collective over the world. */
int train_obs_after_step(train_obs *o, struct trainer *t, double dt, const loom_comm_stats *cs,
                         size_t arena_bytes, loom_err *err);
/* Rank 0: the per-rank fields of this step's metrics line. */
void train_obs_metrics(train_obs *o, loom_metrics *mx);
/* Rank 0, after the metrics line: the sinks (Prometheus, TensorBoard) and the alert rules. */
int train_obs_publish(train_obs *o, const train_obs_row *row, loom_err *err);
/* 1 when an alert with action stop fired (rank 0; agreed over the ranks by the caller). */
int train_obs_stop_requested(const train_obs *o);
/* Bottom of a step: closes the profiler's step span and, once the window is over, writes the
 * trace (collective over the world). */
int train_obs_step_end(train_obs *o, struct trainer *t, loom_err *err);
/* End of the run: a profile window cut short by the last step is written (collective). */
int train_obs_finish(train_obs *o, struct trainer *t, loom_err *err);
void train_obs_free(train_obs *o);

#endif
