/* The trainer's side of pipeline parallelism: a step's batches through the pipeline
 * (src/parallel/pp.c), the loss reduced from the last stage, and evaluation's forwards. The
 * DP/ZeRO engine, clipping and AdamW are the ones of loom_trainer_step. */
#include <math.h>
#include <string.h>

#include "loom/pp.h"
#include "train/trainer_internal.h"

/* targets >= 0 in the global batch (every rank holds all of it): the count one process sees */
static int64_t global_valid(const trainer *t) {
    const size_t n = t->classify ? (size_t)t->s.B : (size_t)t->s.B * (size_t)t->s.T;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) v += t->g_tgt[i] >= 0;
    return v;
}

/* this rank's rows (its dp slice) of the global batch */
static const int32_t *rows(const trainer *t, const int32_t *g, int per_row) {
    return g + (size_t)t->dp_rank * (size_t)t->local_B * (size_t)per_row;
}

/* the last stage's sums to every rank: over the stages (the others add zeros), then over dp */
static void reduce(trainer *t, const loom_pp_result *r, double v[3]) {
    v[0] = r->loss_sum;
    v[1] = (double)r->valid;
    v[2] = (double)r->correct;
    loom_allreduce_sum(t->mesh, LOOM_GROUP_PP, v, 3, LOOM_F64);
    loom_allreduce_sum(t->mesh, LOOM_GROUP_DP, v, 3, LOOM_F64);
}

int loom_trainer_pp_grads(trainer *t, loom_trainer_batch_fn next, void *ctx, double *loss,
                          loom_err *err) {
    double sum = 0, count = 0; /* the step's loss summed over its valid targets, and those */
    const int ty = t->classify ? 1 : (int)t->s.T;
    int64_t total = 0; /* grad_accum > 1: the step's batches first, for their valid targets */
    if (t->s.accum > 1 && loom_trainer_accum_fetch(t, next, ctx, &total, err)) return -1;
    for (int64_t a = 0; a < t->s.accum; a++) {
        if (t->s.accum > 1) loom_trainer_accum_use(t, a);
        else if (next(t, ctx, err)) return -1; /* (next counts its own data wait) */
        else total = global_valid(t);
        float dscale = total > 0 ? 1.0f / (float)total : 0.0f;
        if (t->inject_nan) dscale = NAN;
        loom_pp_result r;
        loom_pp_run(t->pp, rows(t, t->g_inp, (int)t->s.T), rows(t, t->g_tgt, ty), 1, dscale,
                    a == 0, a == t->s.accum - 1, &r);
        double v[3];
        reduce(t, &r, v);
        if (t->inject_nan) v[0] = NAN;
        sum += v[0];
        count += v[1];
    }
    *loss = count > 0 ? sum / count : 0.0;
    return 0;
}

double loom_trainer_pp_forward(trainer *t, int64_t *gv, int64_t *gc) {
    loom_pp_result r;
    loom_pp_run(t->pp, rows(t, t->g_inp, (int)t->s.T), rows(t, t->g_tgt, t->classify ? 1 : (int)t->s.T),
                0, 0.0f, 0, 0, &r);
    double v[3];
    reduce(t, &r, v);
    if (gv) *gv = (int64_t)v[1];
    if (gc) *gc = (int64_t)v[2];
    return v[1] > 0 ? v[0] / v[1] : 0.0;
}
