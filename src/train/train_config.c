/* The trainer's config: the run config's keys (their schema, with defaults, is
 * src/ckpt/run_schema.c) read into settings with range checks. */
#include <stdio.h>
#include <string.h>

#include "loom/model_config.h"
#include "loom/pp.h"
#include "loom/train.h"
#include "train/train_obs.h"
#include "train/trainer_internal.h"

/* the keys themselves are the run config's schema (src/ckpt/run_schema.c): a checkpoint's
 * config.yaml is read back with it when a model is loaded for inference */
const loom_config_key *loom_trainer_schema(int *n) { return loom_train_schema(n); }



int loom_trainer_read_settings(const loom_config *c, settings *s, loom_err *err) {
    memset(s, 0, sizeof *s);
    const char *sched;
    if (loom_config_get_str(c, "run.dir", &s->run_dir, err) ||
        loom_config_get_str(c, "data.val", &s->val_dir, err) ||
        loom_config_get_bool(c, "data.shuffle", &s->shuffle, err) ||
        loom_config_get_bool(c, "data.follow", &s->follow, err) ||
        loom_config_get_int(c, "data.windows_per_doc", &s->windows_per_doc, err) ||
        loom_config_get_int(c, "data.pad_id", &s->pad_id, err) ||
        loom_config_get_int(c, "training.steps", &s->steps, err) ||
        loom_config_get_int(c, "training.seed", &s->seed, err) ||
        loom_config_get_int(c, "training.batch_size", &s->B, err) ||
        loom_config_get_int(c, "training.seq_len", &s->T, err) ||
        loom_config_get_int(c, "training.grad_accum", &s->accum, err) ||
        loom_config_get_double(c, "training.lr", &s->sched.lr, err) ||
        loom_config_get_int(c, "training.warmup", &s->sched.warmup, err) ||
        loom_config_get_str(c, "training.schedule", &sched, err) ||
        loom_config_get_double(c, "training.decay_frac", &s->sched.decay_frac, err) ||
        loom_config_get_double(c, "training.weight_decay", &s->weight_decay, err) ||
        loom_config_get_double(c, "training.beta1", &s->beta1, err) ||
        loom_config_get_double(c, "training.beta2", &s->beta2, err) ||
        loom_config_get_double(c, "training.eps", &s->eps, err) ||
        loom_config_get_double(c, "training.grad_clip", &s->grad_clip, err) ||
        loom_config_get_int(c, "training.threads", &s->threads, err) ||
        loom_config_get_double(c, "training.peak_flops", &s->peak_flops, err) ||
        loom_config_get_int(c, "training.log_every", &s->log_every, err) ||
        loom_config_get_int(c, "training.max_skipped", &s->max_skipped, err) ||
        loom_config_get_int(c, "eval.every", &s->eval_every, err) ||
        loom_config_get_int(c, "eval.batches", &s->eval_batches, err) ||
        loom_config_get_int(c, "checkpoint.every", &s->ckpt_every, err) ||
        loom_config_get_int(c, "parallel.zero", &s->zero, err) ||
        loom_config_get_bool(c, "parallel.check_replicas", &s->check_replicas, err) ||
        loom_config_get_bool(c, "parallel.sp", &s->sp, err))
        return -1;
    const char *mb = loom_config_get(c, "parallel.microbatches");
    if (mb && strcmp(mb, "auto") != 0) {
        if (loom_config_get_int(c, "parallel.microbatches", &s->microbatches, err)) return -1;
        if (s->microbatches < 1 || s->microbatches > (1 << 20))
            return loom_errf(err, "config key 'parallel.microbatches' = %lld (%s): expected auto "
                                  "or an integer in [1, %d]", (long long)s->microbatches,
                             loom_config_origin(c, "parallel.microbatches"), 1 << 20);
    }
    const char *prec = loom_config_get(c, "training.precision");
    if (!prec || !strcmp(prec, "fp32")) s->precision = LOOM_PREC_FP32;
    else if (!strcmp(prec, "bf16")) s->precision = LOOM_PREC_BF16;
    else
        return loom_errf(err, "config key 'training.precision' = '%s' (%s): expected fp32 or bf16",
                         prec, loom_config_origin(c, "training.precision"));
    const char *ps = loom_config_get(c, "parallel.pp_schedule");
    s->pp_schedule = loom_pp_schedule_from_name(ps ? ps : "1f1b");
    if (s->pp_schedule < 0)
        return loom_errf(err, "config key 'parallel.pp_schedule' = '%s' (%s): expected gpipe or "
                              "1f1b", ps, loom_config_origin(c, "parallel.pp_schedule"));
    if (!loom_config_get(c, "data.train"))
        return loom_errf(err, "config: data.train is required (a dataset directory built by "
                              "`loom data build`)");
    if (loom_config_get_str(c, "data.train", &s->train_dir, err)) return -1;
    /* checked before anything is created: a run would otherwise fail at its first
     * checkpoint (or abort on a path buffer) */
    const char *path_keys[] = {"run.dir", "data.train", "data.val"};
    for (int i = 0; i < 3; i++) {
        char what[256];
        snprintf(what, sizeof what, "config key '%s' (%s)", path_keys[i],
                 loom_config_origin(c, path_keys[i]));
        if (loom_path_check(what, loom_config_get(c, path_keys[i]), LOOM_DIR_PATH_MAX, err))
            return -1;
    }
    s->sched.min_lr = s->sched.lr * 0.1;
    if (loom_config_get(c, "training.min_lr") &&
        loom_config_get_double(c, "training.min_lr", &s->sched.min_lr, err))
        return -1;
    if (!strcmp(sched, "cosine")) s->sched.kind = LOOM_SCHED_COSINE;
    else if (!strcmp(sched, "wsd")) s->sched.kind = LOOM_SCHED_WSD;
    else if (!strcmp(sched, "constant")) s->sched.kind = LOOM_SCHED_CONSTANT;
    else
        return loom_errf(err, "config key 'training.schedule' = '%s' (%s): expected cosine, wsd "
                              "or constant", sched, loom_config_origin(c, "training.schedule"));
    s->sched.total = s->steps;
    if (loom_config_get(c, "training.schedule_steps") &&
        loom_config_get_int(c, "training.schedule_steps", &s->sched.total, err))
        return -1;
    struct { const char *key; int64_t v, lo, hi; } ranges[] = {
        {"training.steps", s->steps, 0, INT64_C(1) << 40},
        {"training.batch_size", s->B, 1, 1 << 20},
        {"training.seq_len", s->T, 1, 1 << 24},
        {"training.grad_accum", s->accum, 1, 1 << 20},
        {"training.warmup", s->sched.warmup, 0, INT64_C(1) << 40},
        {"training.schedule_steps", s->sched.total, 0, INT64_C(1) << 40},
        {"training.threads", s->threads, 0, 4096},
        {"training.log_every", s->log_every, 1, INT64_C(1) << 40},
        {"training.max_skipped", s->max_skipped, 1, INT64_C(1) << 40},
        {"eval.every", s->eval_every, 0, INT64_C(1) << 40},
        {"eval.batches", s->eval_batches, 0, 1 << 20},
        {"checkpoint.every", s->ckpt_every, 0, INT64_C(1) << 40},
        {"parallel.zero", s->zero, 0, 3},
        {"data.windows_per_doc", s->windows_per_doc, 1, 1 << 20},
        {"data.pad_id", s->pad_id, 0, INT64_C(1) << 30},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (ranges[i].v < ranges[i].lo || ranges[i].v > ranges[i].hi)
            return loom_errf(err, "config key '%s' = %lld (%s) is out of range [%lld, %lld]",
                             ranges[i].key, (long long)ranges[i].v,
                             loom_config_origin(c, ranges[i].key), (long long)ranges[i].lo,
                             (long long)ranges[i].hi);
    if (!(s->sched.lr > 0) || s->weight_decay < 0 || s->grad_clip < 0 || s->peak_flops < 0 ||
        !(s->beta1 >= 0 && s->beta1 < 1) || !(s->beta2 >= 0 && s->beta2 < 1) || !(s->eps > 0))
        return loom_errf(err, "config: training.lr, eps must be positive, beta1/beta2 in [0, 1), "
                              "weight_decay, grad_clip and peak_flops non-negative");
    return 0;
}
