/* loom pipeline parallelism: the model's layers split into parallel.pp stages, micro-batches
 * through them in a schedule (docs/parallelism.md).
 *
 * Stage s of p (this rank's index in the mesh's pp group) holds layers [s L/p, (s+1) L/p)
 * (loom_pp_stage_layers: balanced, p divides n_layer), the embedding on stage 0, the final norm
 * and head on stage p - 1 (a tied GPT-2 head keeps a copy of wte there). A batch of this rank's
 * rows is cut into `microbatches` micro-batches of equal rows; each runs forward through the
 * stages and backward in reverse:
 *
 *   gpipe  every forward, then every backward (holds all m micro-batches' activations)
 *   1f1b   stage s runs min(p - s - 1, m) forwards, then one forward / one backward
 *          alternately, then the remaining backwards (holds at most p - s)
 *
 * At the model's stage points (LOOM_CP_STAGE_IN / STAGE_OUT) the stream leaving a stage is sent
 * to the next (loom_isend, non-blocking: the stage computes on while it travels) and the
 * gradient of a stage's input to the previous; receives are posted one micro-batch ahead into a
 * staging buffer, so a message can arrive while the stage computes. The time a stage waits in
 * those receives is its bubble (loom_pp_bubble_seconds).
 *
 * With the data-parallel engine (src/parallel/dp.c: the dp group holds the ranks of one stage)
 * it adds, in loom_dp_finish_grads: the tied embedding's two gradients summed (dp-reduced on
 * stage 0 and on stage p - 1, exchanged between them, both copies get the sum, so both stay
 * equal), and the gradient norm summed over the stages (the last stage's wte copy not
 * counted, nor written to checkpoints). */
#ifndef LOOM_PP_H
#define LOOM_PP_H

#include <stdint.h>

#include "loom/comm.h"
#include "loom/model.h"
#include "loom/parallel.h"

typedef enum loom_pp_schedule { LOOM_PP_GPIPE = 0, LOOM_PP_1F1B = 1 } loom_pp_schedule;

typedef struct loom_pp loom_pp;

/* Layers [*l0, *l1) of stage `stage` of `stages` (stages divides n_layer). */
void loom_pp_stage_layers(int n_layer, int stages, int stage, int *l0, int *l1);
/* "gpipe" / "1f1b" -> LOOM_PP_*; -1 when unknown. */
int loom_pp_schedule_from_name(const char *name);
const char *loom_pp_schedule_name(int schedule);

/* The pipeline of this rank: m is its stage's view (created with LOOM_MODEL_HOOKS_ONLY, rows
 * micro_B), dp the engine serving its parameters (its hooks set), inner the communication
 * points another strategy set (tensor parallelism; NULL: none), which the pipeline's points
 * call at every point. Sets the model's points, and dp's grad sync and norm scope. */
int loom_pp_create(loom_model *m, loom_mesh *mesh, loom_dp *dp, const loom_comm_points *inner,
                   int schedule, int microbatches, int micro_B, int T, loom_pp **out,
                   loom_err *err);
void loom_pp_free(loom_pp *p);

/* What a batch gave on this rank: the last stage's sum over micro-batches of (mean loss x
 * valid targets), its valid targets and (classify) correct predictions; 0 on other stages. */
typedef struct loom_pp_result {
    double loss_sum;
    int64_t valid, correct;
} loom_pp_result;

/* One batch of microbatches x micro_B rows: inputs (rows, T); targets (rows, T), or (rows)
 * labels for the classify head. train = 1: forward and backward in the schedule's order,
 * backward scaled by dscale (the caller's 1 / (global valid targets x accumulation steps));
 * loom_dp_begin_micro is called before each backward, first on the first backward when
 * first_batch, last on the last one when last_batch. train = 0: forwards only (evaluation).
 * Collective over the pp group (and the dp group through dp). */
void loom_pp_run(loom_pp *p, const int32_t *inputs, const int32_t *targets, int train,
                 float dscale, int first_batch, int last_batch, loom_pp_result *res);

int loom_pp_stage(const loom_pp *p);
int loom_pp_stages(const loom_pp *p);
/* Seconds this rank waited on receives from its neighbour stages (the bubble) since the last
 * reset, and on its own sends to complete before reusing their buffers. */
double loom_pp_bubble_seconds(const loom_pp *p);
double loom_pp_send_wait_seconds(const loom_pp *p);
/* Seconds inside loom_pp_run's training batches (the pipeline's time: its bubble fraction is
 * loom_pp_bubble_seconds / this) since the last reset. */
double loom_pp_run_seconds(const loom_pp *p);
void loom_pp_stats_reset(loom_pp *p);
/* Activation arenas: how many this stage has held at once (its peak, what 1f1b bounds by
 * p - s and gpipe does not), and their bytes. */
int loom_pp_peak_arenas(const loom_pp *p);
size_t loom_pp_activation_bytes(const loom_pp *p);
/* 1 when the tied embedding's two copies (stage 0's wte, stage p - 1's) hold bit-identical
 * parameters; 1 as well without a tied head or with zero 3 (each copy sharded differently).
 * Collective over the pp group. */
int loom_pp_tied_in_sync(loom_pp *p);

#endif
