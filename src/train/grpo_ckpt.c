/* GRPO's rollout batch in a checkpoint (docs/finetune.md "Resume"): a checkpoint taken in the
 * middle of a batch's finetune.num_iterations updates holds grpo_rollouts.safetensors, the
 * batch as the updates read it: every row's inputs and targets, the old log-probs (the policy's
 * before the batch's first update), the reference's, the advantages, and the batch's metrics.
 * A resumed run then takes the remaining updates on those rows, as the run that was not stopped
 * does, instead of sampling a new batch from updated weights (and drawing the next prompts from
 * the loader early). The file holds the global batch in the order of its prompts, so it loads
 * onto any number of data-parallel ranks. At a batch boundary (and with num_iterations 1) the
 * next step samples afresh, and no file is written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/safetensors.h"
#include "train/train_grpo.h"
#include "train/trainer_internal.h"

#define GRPO_FILE "grpo_rollouts.safetensors"
#define GRPO_FORMAT "loom-grpo-rollouts-1"

int loom_trainer_grpo_ckpt_file(const trainer *t, const char **name) {
    const train_grpo *g = t->grpo;
    *name = GRPO_FILE;
    return g && g->have_rollouts && t->step % g->num_iterations != 0;
}

/* Collective over the data-parallel group: every rank's rows gathered (the global batch, by
 * prompt); rank 0 serializes them into *buf. */
int loom_trainer_grpo_save(trainer *t, char **buf, size_t *len, loom_err *err) {
    const train_grpo *g = t->grpo;
    const size_t T = (size_t)t->s.T, rows = (size_t)g->rows, n = rows * T;
    const size_t W = (size_t)t->dp_size, N = W * rows;
    int32_t *inp = loom_malloc(N * T * sizeof *inp), *tgt = loom_malloc(N * T * sizeof *tgt);
    float *old = loom_malloc(N * T * sizeof *old), *ref = loom_malloc(N * T * sizeof *ref);
    double *adv = loom_malloc(N * sizeof *adv);
    const size_t at = (size_t)t->dp_rank;
    memcpy(inp + at * n, g->inp, n * sizeof *inp);
    memcpy(tgt + at * n, g->tgt, n * sizeof *tgt);
    memcpy(old + at * n, g->old, n * sizeof *old);
    if (g->o.beta > 0) memcpy(ref + at * n, g->ref, n * sizeof *ref);
    else memset(ref + at * n, 0, n * sizeof *ref);
    memcpy(adv + at * rows, g->adv, rows * sizeof *adv);
    /* moves, no arithmetic: each rank's block in place (loom_allgather's send in recv) */
    loom_allgather(t->mesh, t->red_group, inp + at * n, inp, N * T, LOOM_I32);
    loom_allgather(t->mesh, t->red_group, tgt + at * n, tgt, N * T, LOOM_I32);
    loom_allgather(t->mesh, t->red_group, old + at * n, old, N * T, LOOM_F32);
    loom_allgather(t->mesh, t->red_group, ref + at * n, ref, N * T, LOOM_F32);
    loom_allgather(t->mesh, t->red_group, adv + at * rows, adv, N, LOOM_F64);
    int rc = 0;
    if (t->world_rank == 0) {
        double times[2] = {g->rollout_s, g->logp_diff};
        const loom_st_tensor ts[] = {
            {"inputs", (const float *)inp, 2, {(int64_t)N, (int64_t)T}, "I32"},
            {"targets", (const float *)tgt, 2, {(int64_t)N, (int64_t)T}, "I32"},
            {"old_logps", old, 2, {(int64_t)N, (int64_t)T}, NULL},
            {"ref_logps", ref, 2, {(int64_t)N, (int64_t)T}, NULL},
            {"advantages", (const float *)adv, 1, {(int64_t)N}, "F64"},
            {"metrics", (const float *)g->m, 1, {64}, "F64"},
            {"rollout_s_logp_diff", (const float *)times, 1, {2}, "F64"},
        };
        char step[32], gens[32];
        snprintf(step, sizeof step, "%lld", (long long)t->step);
        snprintf(gens, sizeof gens, "%d", g->G);
        const char *meta[] = {"format", GRPO_FORMAT, "step", step, "num_generations", gens, NULL};
        rc = loom_safetensors_serialize(ts, (int)(sizeof ts / sizeof ts[0]), meta, buf, len, err);
    }
    free(inp);
    free(tgt);
    free(old);
    free(ref);
    free(adv);
    return rc;
}

int loom_trainer_grpo_load(trainer *t, const loom_ckpt *ck, loom_err *err) {
    train_grpo *g = t->grpo;
    if (!g) return 0;
    size_t len;
    const char *data = loom_ckpt_file_data(ck, GRPO_FILE, &len);
    char where[4300];
    snprintf(where, sizeof where, "%s/%s", loom_ckpt_dir(ck), GRPO_FILE);
    if (!data) {
        if (t->step % g->num_iterations != 0 && t->world_rank == 0)
            loom_log("warning: %s: the checkpoint is at step %lld, inside a rollout batch of "
                     "finetune.num_iterations = %d, but holds no rollouts (written before "
                     "loom kept them): the run samples a new batch now, so it does not follow "
                     "the run that was stopped exactly", loom_ckpt_dir(ck),
                     (long long)t->step, g->num_iterations);
        return 0;
    }
    loom_st_file *f = NULL;
    if (loom_safetensors_parse(data, len, where, &f, err)) return -1;
    const char *fmt = loom_safetensors_metadata(f, "format");
    const char *gens = loom_safetensors_metadata(f, "num_generations");
    const char *step = loom_safetensors_metadata(f, "step");
    const size_t T = (size_t)t->s.T, rows = (size_t)g->rows, n = rows * T;
    const int64_t N = (int64_t)t->dp_size * (int64_t)rows;
    int rc = -1;
    char want[32];
    snprintf(want, sizeof want, "%d", g->G);
    if (!fmt || strcmp(fmt, GRPO_FORMAT) != 0) {
        loom_errf(err, "%s: not a rollout batch of this format (metadata format '%s', expected "
                       "'%s')", where, fmt ? fmt : "(none)", GRPO_FORMAT);
        goto done;
    }
    if (!gens || strcmp(gens, want) != 0) {
        loom_errf(err, "%s: a batch of %s completions per prompt, but finetune.num_generations "
                       "is %d: resume with the run's settings", where, gens ? gens : "(none)",
                  g->G);
        goto done;
    }
    if (!step || strtoll(step, NULL, 10) != t->step) {
        loom_errf(err, "%s: the batch of step %s in the checkpoint of step %lld", where,
                  step ? step : "(none)", (long long)t->step);
        goto done;
    }
    /* this rank's rows of the global batch (its prompts, as the loader splits them) */
    const int64_t shape2[2] = {N, (int64_t)T}, shape1[1] = {N}, shapem[1] = {64};
    const int64_t shapet[1] = {2};
    int32_t *inp = loom_malloc((size_t)N * T * sizeof *inp);
    int32_t *tgt = loom_malloc((size_t)N * T * sizeof *tgt);
    float *old = loom_malloc((size_t)N * T * sizeof *old);
    float *ref = loom_malloc((size_t)N * T * sizeof *ref);
    double *adv = loom_malloc((size_t)N * sizeof *adv), times[2];
    if (loom_safetensors_read_raw(f, "inputs", "I32", inp, 2, shape2, err) ||
        loom_safetensors_read_raw(f, "targets", "I32", tgt, 2, shape2, err) ||
        loom_safetensors_read_raw(f, "old_logps", "F32", old, 2, shape2, err) ||
        loom_safetensors_read_raw(f, "ref_logps", "F32", ref, 2, shape2, err) ||
        loom_safetensors_read_raw(f, "advantages", "F64", adv, 1, shape1, err) ||
        loom_safetensors_read_raw(f, "metrics", "F64", g->m, 1, shapem, err) ||
        loom_safetensors_read_raw(f, "rollout_s_logp_diff", "F64", times, 1, shapet, err)) {
        loom_err_prefix(err, "the rollout batch (training.batch_size x "
                             "finetune.num_generations rows of training.seq_len)");
    } else {
        const size_t at = (size_t)t->dp_rank;
        memcpy(g->inp, inp + at * n, n * sizeof *inp);
        memcpy(g->tgt, tgt + at * n, n * sizeof *tgt);
        memcpy(g->old, old + at * n, n * sizeof *old);
        memcpy(g->ref, ref + at * n, n * sizeof *ref);
        memcpy(g->adv, adv + at * rows, rows * sizeof *adv);
        g->rollout_s = times[0];
        g->logp_diff = times[1];
        g->have_rollouts = 1;
        rc = 0;
    }
    free(inp);
    free(tgt);
    free(old);
    free(ref);
    free(adv);
done:
    loom_safetensors_close(f);
    return rc;
}
