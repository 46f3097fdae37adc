/* Gradient accumulation (training.grad_accum > 1): a step's micro-batches are read before the
 * first forward, so that the step knows how many valid targets it has in all. Every
 * micro-batch's backward is then scaled by 1 / (the step's valid targets), and the step's
 * loss is the sum over its valid targets divided by their count: the loss and the gradient of
 * one batch of grad_accum x batch_size rows, whatever the loss mask leaves in each
 * micro-batch (a mean of per-micro-batch means would weigh a micro-batch with few assistant
 * tokens as much as one with many). */
#include <stdlib.h>
#include <string.h>

#include "train/trainer_internal.h"

/* elements of a global batch's targets: (B, T), or (B) labels for a classify head */
static size_t target_count(const trainer *t) {
    return t->classify ? (size_t)t->s.B : (size_t)t->s.B * (size_t)t->s.T;
}

void loom_trainer_accum_alloc(trainer *t) {
    if (t->s.accum <= 1) return;
    const size_t BT = (size_t)t->s.B * (size_t)t->s.T, n = (size_t)t->s.accum;
    t->acc_inp = loom_malloc(n * BT * sizeof(int32_t));
    t->acc_tgt = loom_malloc(n * target_count(t) * sizeof(int32_t));
    if (t->g_doc) t->acc_doc = loom_malloc(n * BT * sizeof(int32_t));
}

void loom_trainer_accum_free(trainer *t) {
    free(t->acc_inp);
    free(t->acc_tgt);
    free(t->acc_doc);
    t->acc_inp = t->acc_tgt = t->acc_doc = NULL;
}

int loom_trainer_accum_fetch(trainer *t, loom_trainer_batch_fn next, void *ctx,
                             int64_t *valid, loom_err *err) {
    const size_t BT = (size_t)t->s.B * (size_t)t->s.T, nt = target_count(t);
    int64_t v = 0;
    for (int64_t a = 0; a < t->s.accum; a++) {
        if (next(t, ctx, err)) return -1;
        memcpy(t->acc_inp + (size_t)a * BT, t->g_inp, BT * sizeof(int32_t));
        memcpy(t->acc_tgt + (size_t)a * nt, t->g_tgt, nt * sizeof(int32_t));
        if (t->acc_doc) memcpy(t->acc_doc + (size_t)a * BT, t->g_doc, BT * sizeof(int32_t));
        /* every rank holds the whole global batch: this is the count over all dp ranks */
        for (size_t i = 0; i < nt; i++) v += t->g_tgt[i] >= 0;
    }
    *valid = v;
    return 0;
}

void loom_trainer_accum_use(trainer *t, int64_t micro) {
    const size_t BT = (size_t)t->s.B * (size_t)t->s.T, nt = target_count(t);
    memcpy(t->g_inp, t->acc_inp + (size_t)micro * BT, BT * sizeof(int32_t));
    memcpy(t->g_tgt, t->acc_tgt + (size_t)micro * nt, nt * sizeof(int32_t));
    if (t->acc_doc) memcpy(t->g_doc, t->acc_doc + (size_t)micro * BT, BT * sizeof(int32_t));
}
