/* The training loop: config -> model + optimizer + loader, resume, steps, eval, metrics,
 * checkpoints. */
#define _GNU_SOURCE
#include "loom/train.h"

#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/backend.h"
#include "loom/checkpoint.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/lora.h"
#include "loom/metrics.h"
#include "loom/model.h"
#include "loom/model_config.h"
#include "loom/peak.h"
#include "loom/plan.h"
#include "loom/parallel.h"
#include "loom/schedule.h"
#include "loom/signals.h"
#include "loom/profile.h"
#include "loom/progress.h"
#include "loom/pp.h"
#include "loom/tp.h"
#include "loom/windows.h"

#include "train/train_obs.h"
#include "train/trainer_internal.h"

/* ---- interruption: SIGINT/SIGTERM finish the current step, checkpoint, and stop ----
 * The signal thread (loom/signals.h) records the first one; the loop reads it at the step
 * boundary. No handler ever runs on a computing thread. */

/* MFU's denominator on a GPU (model.backend cuda): the dense peak of the hardware file that
 * names the device (bf16: tensor cores; fp32: tf32 with LOOM_CUDA_TF32=1, else the CUDA
 * cores' fp32). 0 with `from` saying where it came from; -1 with `from` saying why there is
 * none (then MFU is not reported). */
static int loom_gpu_peak(const loom_backend *be, int bf16, double *peak, char *from, size_t n) {
    *peak = 0;
    char dev[256] = "";
    if (loom_backend_device_name(be, dev, sizeof dev)) {
        snprintf(from, n, "no MFU: the CUDA device's name is unknown");
        return -1;
    }
    loom_plan_hw hw;
    char path[4400];
    loom_err err;
    const int rc = loom_plan_hw_for_device(dev, &hw, path, sizeof path, &err);
    if (rc) {
        snprintf(from, n, "no MFU: %.120s (set training.peak_flops, or add the device to a "
                 "data/hardware file's cuda_names)", rc > 0 ? "no hardware file names this GPU" : err.msg);
        return -1;
    }
    const char *tf32 = getenv("LOOM_CUDA_TF32");
    const int use_tf32 = tf32 && !strcmp(tf32, "1");
    *peak = bf16 ? hw.peak_bf16 : use_tf32 ? hw.peak_fp32 : hw.peak_fp32_simt;
    if (!(*peak > 0)) {
        snprintf(from, n, "no MFU: %.60s gives no %s peak", hw.name,
                 bf16 ? "bf16" : use_tf32 ? "tf32" : "fp32 (peak_fp32_simt)");
        return -1;
    }
    snprintf(from, n, "%.40s %s, %.40s", hw.name, bf16 ? "bf16" : use_tf32 ? "tf32" : "fp32",
             strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
    return 0;
}

static void on_stop_signal(void *ctx, int sig) {
    atomic_int *stop = ctx;
    int none = 0;
    atomic_compare_exchange_strong(stop, &none, sig);
}

/* ---- test-only fault injection -----------------------------------------------------------
 * LOOM_TEST_FAIL="RANK:STEP:error" makes world rank RANK return an error at step STEP;
 * "RANK:STEP:kill" makes it SIGKILL itself; "RANK:STEP:hang" makes it wait forever (alive but
 * silent: the others' checked waits time out and name it). (Inside a pipeline step:
 * LOOM_TEST_PP_FAIL, src/parallel/pp.c.) Used by tests/mpi to check that one
 * rank's failure ends the whole job. */
static int fault_check(int rank, int64_t step, loom_err *err) {
    const char *f = getenv("LOOM_TEST_FAIL");
    long r, st;
    char mode[16];
    if (!f || sscanf(f, "%ld:%ld:%15s", &r, &st, mode) != 3 || r != rank || st != step) return 0;
    if (!strcmp(mode, "kill")) raise(SIGKILL);
    if (!strcmp(mode, "hang"))
        for (;;) pause(); /* until the job is ended (SIGKILL) */
    return loom_errf(err, "LOOM_TEST_FAIL: injected error on rank %d at step %lld", rank,
                     (long long)step);
}

/* LOOM_TEST_INJECT_NAN="RANK:STEP" or "RANK:FIRST-LAST" (a test hook, read only here; see
 * tests/mpi/test_nan_skip.sh): on world rank RANK, the steps STEP or FIRST..LAST (1-based, the
 * step being computed) get a NaN loss and NaN gradients, as a bad batch or an overflow on one
 * rank would give. */
static int nan_injected(int rank, int64_t step) {
    const char *f = getenv("LOOM_TEST_INJECT_NAN");
    long r;
    long long first, last;
    char dash;
    if (!f) return 0;
    const int n = sscanf(f, "%ld:%lld%c%lld", &r, &first, &dash, &last);
    if (n == 2) last = first;
    else if (n != 4 || dash != '-') return 0;
    return r == rank && step >= first && step <= last;
}

/* ---- one batch ------------------------------------------------------------------------- */

/* This rank's rows of the global batch in t->g_inp/g_tgt (with context parallelism, its
 * two chunks of each row, copied into `local`). */
static const int32_t *local_rows(const trainer *t, const int32_t *global, int32_t *local) {
    const int32_t *mine = global + (size_t)t->dp_rank * (size_t)t->local_B * (size_t)t->s.T;
    if (t->cp_size <= 1) return mine;
    loom_cp_local_rows(t->cp_size, t->cp_rank, mine, local, (int)t->local_B, t->s.T);
    return local;
}

static const int32_t *local_targets(const trainer *t) {
    return t->classify ? t->g_tgt + (size_t)t->dp_rank * (size_t)t->local_B
                       : local_rows(t, t->g_tgt, t->l_tgt);
}

/* the next global batch from the training data */
static int next_batch(trainer *t, loom_loader *l, loom_windows *w, loom_err *err) {
    if (w) {
        loom_windows_next(w, (int)t->s.B, t->g_inp, t->g_tgt);
        return 0;
    }
    return loom_loader_next_docs(l, (int)t->s.B, 0, 1, t->g_inp, t->g_tgt, t->g_doc, err);
}

/* loom_trainer_batch_fn of the training loop: the next batch of data.train */
static int next_train_batch(trainer *t, void *ctx, loom_err *err) {
    (void)ctx;
    const double t0 = loom_now(); /* data wait: per-rank timing and the profiler's span */
    loom_prof_begin("data_wait", "data");
    if (next_batch(t, t->train_ld, t->train_w, err))
        return loom_err_prefix(err, "data.train %s", t->s.train_dir);
    loom_prof_end(0, 0, NULL);
    t->data_wait_s += loom_now() - t0;
    return 0;
}

/* Forward on this rank's slice; returns the global mean loss and (optionally) the global
 * number of valid targets and, for classify, of correct predictions. */
static double forward_global(trainer *t, int64_t *global_valid, int64_t *global_correct) {
    if (t->pp) return loom_trainer_pp_forward(t, global_valid, global_correct);
    if (t->g_doc && t->cp_size > 1) /* model.doc_mask: the whole rows' documents (pp = 1) */
        loom_model_set_docs_global(t->model, NULL,
                                   t->g_doc + (size_t)t->dp_rank * (size_t)t->local_B *
                                                  (size_t)t->s.T,
                                   (int)t->local_B, (int)t->s.T);
    else if (t->g_doc) /* this rank's rows' documents */
        loom_model_set_docs(t->model, NULL, local_rows(t, t->g_doc, NULL), (int)t->local_B,
                            (int)t->local_T);
    const float loss = loom_model_forward(t->model, local_rows(t, t->g_inp, t->l_inp),
                                          local_targets(t), (int)t->local_B, (int)t->local_T);
    const int64_t valid = loom_model_valid_targets(t->model);
    double v[3] = {t->inject_nan ? NAN : (double)loss * (double)valid, (double)valid, 0};
    if (t->classify) {
        const int K = t->mc.num_classes;
        float *lg = t->h_logits;
        loom_model_read_logits(t->model, lg, 0, (size_t)t->local_B * (size_t)K);
        const int32_t *y = local_targets(t);
        for (int64_t b = 0; b < t->local_B; b++) {
            int best = 0;
            for (int k = 1; k < K; k++)
                if (lg[b * K + k] > lg[b * K + best]) best = k;
            if (y[b] >= 0 && best == y[b]) v[2] += 1;
        }
    }
    loom_allreduce_sum(t->mesh, t->red_group, v, 3, LOOM_F64);
    if (global_valid) *global_valid = (int64_t)v[1];
    if (global_correct) *global_correct = (int64_t)v[2];
    return v[1] > 0 ? v[0] / v[1] : 0.0;
}

int loom_trainer_step(trainer *t, loom_trainer_batch_fn next, void *ctx, double *loss_out,
                      double *lr_out, float *grad_norm, int *skipped, loom_err *err) {
    double loss = 0;
    if (t->lora) loom_lora_zero_grad(t->lora); /* LoRA: the adapters' gradients of this step */
    if (t->grpo) { /* finetune.method grpo: rollouts, rewards, the clipped objective */
        if (loom_trainer_grpo_grads(t, next, ctx, &loss, err)) return -1;
    } else if (t->pref.method != LOOM_PREF_SFT) { /* finetune.method: a preference loss */
        if (loom_trainer_pref_grads(t, next, ctx, &loss, err)) return -1;
    } else if (t->pp) { /* pipeline parallelism: the batches' micro-batches through the stages */
        loom_prof_begin("pipeline", "phase");
        if (loom_trainer_pp_grads(t, next, ctx, &loss, err)) return -1;
        loom_prof_end(0, 0, NULL);
    } else {
        /* grad_accum > 1: the step's micro-batches first, for its count of valid targets */
        int64_t total = 0;
        if (t->s.accum > 1 && loom_trainer_accum_fetch(t, next, ctx, &total, err)) return -1;
        double sum = 0; /* the step's loss summed over its valid targets */
        for (int64_t micro = 0; micro < t->s.accum; micro++) {
            /* every rank reads the whole global batch (token ids: cheap) and uses its rows */
            if (t->s.accum > 1) loom_trainer_accum_use(t, micro);
            else if (next(t, ctx, err)) return -1;
            int64_t valid = 0;
            if (t->lora) loom_trainer_lora_micro(t, micro); /* adapter dropout's key */
            loom_prof_begin("forward", "phase");
            const double mean = forward_global(t, &valid, NULL);
            loom_prof_end(0, 0, NULL);
            if (t->s.accum == 1) {
                loss = mean;
                total = valid;
            } else sum += mean * (double)valid;
            loom_dp_begin_micro(t->dp, micro == 0, micro == t->s.accum - 1);
            const float dscale = total > 0 ? 1.0f / (float)total : 0.0f;
            loom_prof_begin("backward", "phase");
            loom_model_backward(t->model, t->inject_nan ? NAN : dscale);
            loom_prof_end(0, 0, NULL);
            if (t->lora) loom_trainer_lora_micro(t, -1); /* off: evaluation has none */
        }
        if (t->s.accum > 1) loss = total > 0 ? sum / (double)total : 0.0;
    }
    loom_prof_begin("optimizer", "phase");
    t->inject_nan = 0;
    float gnorm = loom_dp_finish_grads(t->dp, t->lora ? 0.0f : (float)t->s.grad_clip);
    if (t->lora) gnorm = loom_trainer_lora_finish(t); /* LoRA: the norm and clip are the adapters' */
    const double lr = loom_schedule_lr(&t->s.sched, t->step);
    /* A non-finite loss or gradient norm skips the update on every rank: parameters and
     * optimizer state stay as they are (the gradients are zeroed by the next step). Both
     * values are reduced over the ranks already; the decision is agreed over the world
     * anyway, so the replicas cannot part. */
    double bad = !isfinite(loss) || !isfinite((double)gnorm);
    loom_allreduce_max(t->mesh, LOOM_GROUP_WORLD, &bad, 1, LOOM_F64);
    *skipped = bad > 0;
    if (*skipped) t->skipped_steps++;
    else if (t->lora) loom_trainer_lora_step(t, (float)lr);
    else loom_dp_step(t->dp, (float)lr);
    loom_prof_end(0, 0, NULL);
    t->step++;
    *loss_out = loss;
    *lr_out = lr;
    *grad_norm = gnorm;
    return 0;
}

/* Validation: eval.batches > 0: the first eval.batches global batches of the validation
 * data's mixture (unshuffled), always the same ones; eval.batches = 0: one pass over every
 * window of the split exactly once (LM: loom_loader_pass_slice; classify: epoch 0 of the
 * unshuffled windows), the last batch short, each DP rank reading its rows. The loss is the
 * mean over every valid target, so each window counts once; for classify also the accuracy. */
static int eval_loss(trainer *t, double *out, double *accuracy, loom_err *err) {
    loom_loader *vl = NULL;
    loom_windows *vw = NULL;
    if (t->classify) {
        if (loom_windows_open(t->val_ds, (int)t->s.T, (int)t->s.windows_per_doc,
                              (uint64_t)t->s.seed, 0, (int)t->s.pad_id, &vw, err))
            return loom_err_prefix(err, "validation data %s", t->s.val_dir);
    } else {
        const loom_loader_opts o = {.T = (int)t->s.T, .seed = (uint64_t)t->s.seed, .shuffle = 0,
                                    .ignore_caps = 1};
        if (loom_loader_open(t->val_ds, &o, &vl, err))
            return loom_err_prefix(err, "validation data %s", t->s.val_dir);
    }
    const int64_t B = t->s.B, T = t->s.T;
    const int pass = t->s.eval_batches == 0;
    const uint64_t n_windows = vw ? loom_windows_per_epoch(vw) : loom_loader_num_samples(vl);
    const int64_t batches = pass ? (int64_t)((n_windows + (uint64_t)B - 1) / (uint64_t)B)
                                 : t->s.eval_batches;
    double sum = 0;
    int64_t valid = 0, correct = 0;
    int rc = 0;
    for (int64_t b = 0; b < batches; b++) {
        if (pass && vl) { /* this rank's rows of the pass, where forward_global reads them */
            const size_t mine = (size_t)t->dp_rank * (size_t)t->local_B * (size_t)T;
            loom_loader_pass_slice_docs(vl, (uint64_t)b, (int)B, t->dp_rank, t->dp_size,
                                        t->g_inp + mine, t->g_tgt + mine,
                                        t->g_doc ? t->g_doc + mine : NULL);
        } else if (pass) { /* classify: every rank reads the global batch; the last is short */
            const uint64_t left = n_windows - (uint64_t)b * (uint64_t)B;
            const int nb = left < (uint64_t)B ? (int)left : (int)B;
            loom_windows_next(vw, nb, t->g_inp, t->g_tgt);
            for (int64_t r = nb; r < B; r++) { /* rows the loss ignores */
                memset(t->g_inp + (size_t)r * (size_t)T, 0, (size_t)T * sizeof *t->g_inp);
                t->g_tgt[r] = -1;
            }
        } else if (next_batch(t, vl, vw, err)) {
            rc = loom_err_prefix(err, "validation data %s", t->s.val_dir);
            break;
        }
        int64_t v = 0, c = 0;
        sum += forward_global(t, &v, &c) * (double)v; /* back to a sum over targets */
        valid += v;
        correct += c;
    }
    loom_loader_free(vl);
    loom_windows_free(vw);
    *out = valid > 0 ? sum / (double)valid : 0.0;
    *accuracy = valid > 0 ? (double)correct / (double)valid : 0.0;
    return rc;
}

static int64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = 0, rss = 0;
    if (!f) return 0;
    if (fscanf(f, "%lld %lld", &pages, &rss) != 2) rss = 0;
    fclose(f);
    return (int64_t)rss * sysconf(_SC_PAGESIZE);
}

static int open_data(trainer *t, loom_err *err) {
    if (loom_dataset_open(t->s.train_dir, &t->train_ds, err))
        return loom_err_prefix(err, "data.train");
    if (loom_dataset_vocab_size(t->train_ds) > (uint32_t)t->mc.vocab_size)
        return loom_errf(err, "data.train %s has vocabulary size %u, larger than model.vocab_size "
                              "%d", t->s.train_dir, loom_dataset_vocab_size(t->train_ds),
                         t->mc.vocab_size);
    if (t->classify) {
        char **names = NULL;
        if (loom_dataset_classes(t->s.train_dir, &names, &t->num_classes, err))
            return loom_err_prefix(err, "data.train");
        loom_free_strings(names, t->num_classes);
        if (t->num_classes > t->mc.num_classes)
            return loom_errf(err, "data.train %s has %d classes, more than model.num_classes %d",
                             t->s.train_dir, t->num_classes, t->mc.num_classes);
        if (t->s.pad_id >= t->mc.vocab_size)
            return loom_errf(err, "data.pad_id %lld (the padding token of short documents) needs "
                                  "model.vocab_size > %lld", (long long)t->s.pad_id,
                             (long long)t->s.pad_id);
        if (loom_windows_open(t->train_ds, (int)t->s.T, (int)t->s.windows_per_doc,
                              (uint64_t)t->s.seed, t->s.shuffle, (int)t->s.pad_id, &t->train_w,
                              err))
            return loom_err_prefix(err, "data.train %s", t->s.train_dir);
        return t->s.val_dir[0] && loom_dataset_open(t->s.val_dir, &t->val_ds, err)
                   ? loom_err_prefix(err, "data.val")
                   : 0;
    }
    /* preference pairs: a sample is the pair's two windows (recipe kind: preference) */
    const int64_t sample_T = t->pref.method != LOOM_PREF_SFT ? 2 * t->s.T : t->s.T;
    if (loom_loader_create(t->train_ds, (int)sample_T, (uint64_t)t->s.seed, t->s.shuffle,
                           &t->train_ld, err))
        return loom_err_prefix(err, "data.train %s", t->s.train_dir);
    if (t->s.val_dir[0]) {
        if (loom_dataset_open(t->s.val_dir, &t->val_ds, err))
            return loom_err_prefix(err, "data.val");
        if (loom_dataset_vocab_size(t->val_ds) > (uint32_t)t->mc.vocab_size)
            return loom_errf(err, "data.val %s has vocabulary size %u, larger than "
                                  "model.vocab_size %d", t->s.val_dir,
                             loom_dataset_vocab_size(t->val_ds), t->mc.vocab_size);
    }
    return 0;
}

/* the progress line: on a terminal updated in place (rate-limited, every step offered), else a
 * plain line every train.log_every steps and at the last (force) */
static void progress(const trainer *t, loom_progress *pg, int force, double loss, double lr,
                     double tps, double mfu, double elapsed, int64_t first_step) {
    if (!force && !loom_progress_due(pg)) return;
    const int64_t done = t->step - first_step, left = t->s.steps - t->step;
    const double eta = done > 0 ? elapsed / (double)done * (double)left : 0;
    char mfu_s[32] = "-"; /* no peak: MFU is not reported */
    if (mfu >= 0) snprintf(mfu_s, sizeof mfu_s, "%.1f%%", 100 * mfu);
    loom_progress_show(pg, force, "step %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | mfu %s | eta %.0fs",
                       (long long)t->step, (long long)t->s.steps, loss, lr, tps, mfu_s, eta);
}

/* the mesh from parallel.*; data and tensor parallelism are implemented in the trainer so far */
int loom_trainer_build_mesh(trainer *t, loom_err *err) {
    loom_mesh_spec spec;
    if (loom_mesh_spec_from_config(t->cfg, &spec, err)) return -1;
    const loom_mesh_dims dims = {t->mc.n_head, t->mc.n_kv_head, t->mc.n_layer, (int)t->s.T,
                                 t->mc.n_expert};
    if (loom_mesh_create(&spec, &dims, &t->mesh, err)) return -1;
    const loom_mesh_spec *l = loom_mesh_layout(t->mesh);
    if (l->pp > 1 && l->cp > 1)
        return loom_errf(err, "parallel.pp = %d with parallel.cp = %d: pipeline and context "
                              "parallelism do not combine yet; use one of them", l->pp, l->cp);
    t->pp_rank = loom_mesh_rank(t->mesh, LOOM_GROUP_PP);
    t->pp_size = loom_mesh_size(t->mesh, LOOM_GROUP_PP);
    t->tp_rank = loom_mesh_rank(t->mesh, LOOM_GROUP_TP);
    t->tp_size = loom_mesh_size(t->mesh, LOOM_GROUP_TP);
    t->cp_rank = loom_mesh_rank(t->mesh, LOOM_GROUP_CP);
    t->cp_size = loom_mesh_size(t->mesh, LOOM_GROUP_CP);
    t->red_group = t->cp_size > 1 ? LOOM_GROUP_DPCP : LOOM_GROUP_DP;
    t->local_T = t->s.T / t->cp_size;
    if (loom_cp_kind_from_config(t->cfg, &t->cp_kind, err) ||
        loom_cp_check(&t->mc, l->tp, t->cp_size, t->cp_kind, t->s.T, err))
        return -1;
    if (l->pp > 1 && t->mc.doc_mask)
        return loom_errf(err, "config: model.doc_mask with parallel.pp = %d: document masking is "
                              "not built into pipeline parallelism yet (it passes no document "
                              "ids on); use pp = 1", l->pp);
    t->dp_rank = loom_mesh_rank(t->mesh, LOOM_GROUP_DP);
    t->dp_size = loom_mesh_size(t->mesh, LOOM_GROUP_DP);
    t->world_rank = loom_mesh_rank(t->mesh, LOOM_GROUP_WORLD);
    t->world_size = loom_mesh_size(t->mesh, LOOM_GROUP_WORLD);
    if (t->s.B % t->dp_size != 0)
        return loom_errf(err, "training.batch_size = %lld (the global batch) is not divisible by "
                              "the %d data-parallel ranks", (long long)t->s.B, t->dp_size);
    t->local_B = t->s.B / t->dp_size;
    /* pipeline micro-batches: each dp rank's rows of a batch cut into equal parts */
    t->microbatches = t->s.microbatches > 0 ? t->s.microbatches : t->pp_size;
    if (t->local_B % t->microbatches != 0)
        return loom_errf(err, "training.batch_size = %lld gives %lld rows per data-parallel rank "
                              "(parallel.dp = %d), not divisible by parallel.microbatches = %lld%s",
                         (long long)t->s.B, (long long)t->local_B, t->dp_size,
                         (long long)t->microbatches,
                         t->s.microbatches > 0 ? "" : " (auto: parallel.pp)");
    return 0;
}

int loom_trainer_create_engine(trainer *t, loom_err *err) {
    /* this rank's view: its tp rank's heads and columns, its cp rank's chunks of each
     * sequence (the whole model at tp = cp = 1), and with a pipeline its stage's layers for
     * micro-batches of local_B / microbatches rows */
    loom_model_layout lay = {.tp = t->tp_size, .tp_rank = t->tp_rank, .cp = t->cp_size,
                             .cp_rank = t->cp_rank, .sp = (int)t->s.sp,
                             .precision = t->s.precision};
    if (t->s.sp && t->tp_size == 1)
        return loom_errf(err, "parallel.sp = true: sequence parallelism shards the tensor-parallel "
                              "group's rows; it needs parallel.tp > 1 (got parallel.tp = 1)");
    const int pipe = t->pp_size > 1 || t->microbatches > 1;
    const int64_t rows = pipe ? t->local_B / t->microbatches
                              : t->local_B * (t->pref.method != LOOM_PREF_SFT ? 2 : 1) *
                                    loom_trainer_grpo_rows(t);
    if (loom_trainer_moe_setup(t, &lay, err)) return -1; /* its experts (ep) */
    if (pipe) loom_pp_stage_layers(t->mc.n_layer, t->pp_size, t->pp_rank, &lay.l0, &lay.l1);
    if (loom_model_create_view(&t->mc, &lay, (int)rows, (int)t->local_T,
                               pipe ? LOOM_MODEL_HOOKS_ONLY : LOOM_MODEL_NO_ARENAS, &t->model, err))
        /* the layout named only where there is one (a bf16 or config refusal is not about it) */
        return t->tp_size > 1 || t->cp_size > 1 || t->s.sp
                   ? loom_err_prefix(err, "parallel.tp = %d, parallel.cp = %d, parallel.sp = %s",
                                     t->tp_size, t->cp_size, t->s.sp ? "true" : "false")
                   : -1;
    loom_comm_points cp = {0};
    if (t->tp_size > 1) {
        t->tp = loom_tp_create(t->mesh);
        cp = loom_tp_comm_points(t->tp);
        loom_model_set_comm_points(t->model, &cp);
    }
    if (t->cp_size > 1) {
        if (loom_cp_create(t->model, t->mesh, t->cp_kind, (int)t->local_B, (int)t->local_T,
                           &t->cp, err))
            return -1;
        const size_t n = (size_t)t->local_B * (size_t)t->local_T;
        t->l_inp = loom_malloc(n * sizeof(int32_t));
        t->l_tgt = loom_malloc(n * sizeof(int32_t));
    }
    loom_trainer_moe_attach(t);
    if (t->classify)
        t->h_logits = loom_malloc((size_t)t->local_B * (size_t)t->mc.num_classes * sizeof(float));
    if (loom_dp_create(t->model, t->mesh, (int)t->s.zero, (uint64_t)t->s.seed,
                       (float)t->s.beta1, (float)t->s.beta2, (float)t->s.eps,
                       (float)t->s.weight_decay, &t->dp, err))
        return -1;
    /* the pipeline's stage points wrap tensor parallelism's */
    return pipe ? loom_pp_create(t->model, t->mesh, t->dp, cp.fn ? &cp : NULL, t->s.pp_schedule,
                                 (int)t->microbatches, (int)rows, (int)t->s.T, &t->pp, err)
                : 0;
}

int loom_train(loom_config *cfg, loom_err *err) {
    int n_keys;
    const loom_config_key *keys = loom_trainer_schema(&n_keys);
    if (loom_config_apply_schema(cfg, keys, n_keys, err)) return -1;
    trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    int rc = -1, handlers = 0, run_lock = -1;
    int64_t consecutive_skips = 0; /* not saved: a resumed run starts counting again */
    loom_metrics *mx = NULL;
    train_obs *obs = NULL;
    loom_progress pg = {0}; /* width 0: loom_progress_end is a no-op until it draws */
    double *per_rank = NULL, *pp_ranks = NULL, *tp_act = NULL;
    enum { PP_METRICS = 6 };
    atomic_int stop_signal = 0;
    if (loom_trainer_read_settings(cfg, &t.s, err) ||
        loom_trainer_pref_settings(cfg, &t.pref, err))
        return -1;
    /* training.init_from: the model.* keys come from the source (init_from.c) */
    if (loom_trainer_init_from_config(cfg, err)) return -1;
    if (loom_model_config_from(cfg, (int)t.s.T, &t.mc, err)) return -1;
    if (t.s.T > t.mc.max_seq_len)
        return loom_errf(err, "config: training.seq_len %lld exceeds model.max_seq_len %d",
                         (long long)t.s.T, t.mc.max_seq_len);
    if (train_obs_wrap_backend(cfg, &t.mc, err)) return -1;
    t.classify = t.mc.head == LOOM_HEAD_CLASSIFY;
    if (t.classify && t.mc.doc_mask)
        return loom_errf(err, "config key 'model.doc_mask' (%s): document masking is for packed "
                              "sequences of the lm head; a classify window is one document",
                         loom_config_origin(cfg, "model.doc_mask"));
    if (loom_trainer_grpo_settings(&t, err) || /* finetune.method grpo: its keys */
        loom_trainer_build_mesh(&t, err) || loom_trainer_pref_check(&t, err) ||
        loom_trainer_grpo_check(&t, err))
        goto done;
    const int rank0 = t.world_rank == 0;
    if (t.s.threads > 0) omp_set_num_threads((int)t.s.threads);
    else if (loom_comm_mpi_active()) omp_set_num_threads(loom_comm_default_threads());
    const int threads = omp_get_max_threads();
    if (loom_trainer_check_memory(&t, err)) goto done; /* before anything is allocated */

    char path[4200];
    loom_pathf(t.ckpt_root, sizeof t.ckpt_root, "%s/ckpt", t.s.run_dir);
    if (rank0) {
        if (loom_mkdirs(t.s.run_dir, err)) goto done;
        /* one job per run directory: only world rank 0 locks (every job has exactly one) */
        loom_pathf(path, sizeof path, "%s/train.lock", t.s.run_dir);
        const int lrc = loom_lock_file(path, "loom train", &run_lock, err);
        if (lrc == 1) {
            char why[sizeof err->msg];
            memcpy(why, err->msg, sizeof why);
            loom_errf(err, "run.dir %.500s is in use by another `loom train`: %.1200s. Two "
                           "trainers on one run directory would overwrite each other's metrics "
                           "and checkpoints: wait for the other one to end, or use another "
                           "run.dir", t.s.run_dir, why);
        }
        if (lrc != 0) goto done;
        /* a run already past training.steps: nothing to train, and nothing is touched */
        char done_dir[4200];
        int64_t done_step = -1;
        if (loom_ckpt_find_latest(t.ckpt_root, done_dir, sizeof done_dir, &done_step, err))
            goto done;
        if (done_step > t.s.steps) {
            loom_errf(err, "training.steps is %lld, but run.dir %.500s has a checkpoint at step "
                           "%lld (%.1000s), past it: nothing to train. Raise training.steps to "
                           "continue the run, or use another run.dir for a new one",
                      (long long)t.s.steps, t.s.run_dir, (long long)done_step, done_dir);
            goto done;
        }
        if (loom_config_write_yaml(cfg, loom_pathf(path, sizeof path, "%s/config.yaml", t.s.run_dir),
                                   err))
            goto done;
    }
    if (open_data(&t, err) || loom_trainer_open_run_data(&t, err)) goto done;
    if (loom_trainer_create_engine(&t, err)) goto done;
    if (loom_trainer_lora_setup(&t, err)) goto done; /* finetune.lora: adapters, base frozen */
    if (loom_trainer_pref_setup(&t, err)) goto done;  /* finetune.method: its reference */
    if (loom_trainer_grpo_setup(&t, err)) goto done;  /* grpo: the rollout engine */

    char latest[4200];
    int64_t latest_step = -1;
    loom_barrier(t.mesh, LOOM_GROUP_WORLD); /* run dir exists before anyone looks */
    if (loom_ckpt_find_latest(t.ckpt_root, latest, sizeof latest, &latest_step, err)) goto done;
    if (latest_step >= 0) {
        if (loom_trainer_load_checkpoint(&t, latest, err)) goto done;
        if (rank0) loom_log("resumed from %s (step %lld)", latest, (long long)t.step);
    } else if (loom_config_get(cfg, "training.init_from") &&
               *loom_config_get(cfg, "training.init_from")) {
        if (loom_trainer_init_from_load(&t, err)) goto done;
        if (rank0)
            loom_log("initialized from %s (fresh optimizer state and schedule)",
                     loom_config_get(cfg, "training.init_from"));
    }
    if (rank0) {
        loom_pathf(path, sizeof path, "%s/metrics.jsonl", t.s.run_dir);
        if (loom_metrics_open(path, t.step, &mx, err)) goto done;
    }

    /* the per-rank peak FLOP/s for MFU (rank 0 reports it), 0 = none; never changed by what
     * training achieves (docs/training.md, "MFU and the peak"). With none cached, a
     * single-process run measures it here; a multi-rank run measures on every rank at once
     * (each on its own cores, as training runs) and uses the ranks' mean. */
    double peak = 0;
    char peak_from[256] = "training.peak_flops";
    const loom_backend *mbe = loom_model_backend(t.model);
    if (t.s.peak_flops > 0) {
        if (rank0) peak = t.s.peak_flops;
    } else if (!strcmp(mbe->name, "cuda")) {
        /* a GPU's peak is its datasheet's (data/hardware: cuda_names), never measured */
        if (rank0 && loom_gpu_peak(mbe, t.s.precision == LOOM_PREC_BF16, &peak, peak_from,
                                   sizeof peak_from))
            loom_warn("%s", peak_from);
    } else {
        loom_peak pk;
        memset(&pk, 0, sizeof pk);
        int32_t need = 0;
        if (rank0) {
            if (loom_peak_get(threads, t.world_size == 1, &pk, err)) goto done;
            need = t.world_size > 1 && pk.source == LOOM_PEAK_NONE;
        }
        if (t.world_size > 1) loom_broadcast(t.mesh, LOOM_GROUP_WORLD, &need, 1, LOOM_I32, 0);
        if (need) {
            const int node_ranks = loom_comm_node_ranks(); /* collective */
            if (rank0)
                loom_log("measuring the peak fp32 GEMM FLOP/s at %d threads on all %d ranks at "
                         "once for MFU (none is cached; about 2 s, once)", threads, t.world_size);
            loom_peak mine;
            loom_peak_measure_now(threads, 0, &mine);
            double sums[2] = {mine.flops, mine.idle && node_ranks * threads <= mine.ncpu};
            loom_allreduce_sum(t.mesh, LOOM_GROUP_WORLD, sums, 2, LOOM_F64);
            if (rank0) {
                pk = mine;
                pk.flops = sums[0] / t.world_size;
                pk.idle = sums[1] == t.world_size;
                pk.source = LOOM_PEAK_MEASURED;
                pk.note[0] = 0;
                loom_log("measured the peak fp32 GEMM FLOP/s per rank: %.1f GFLOP/s (the mean of "
                         "%d ranks%s)", pk.flops / 1e9, t.world_size,
                         pk.idle ? "" : "; the node was busy or its ranks share cores");
                if (!pk.idle)
                    snprintf(pk.note, sizeof pk.note,
                             "the peak (%.1f GFLOP/s per rank) was measured while the node was "
                             "busy or its ranks shared cores: it is likely low, so MFU reads "
                             "high; run `loom peak --threads %d` on an idle node",
                             pk.flops / 1e9, threads);
                int stored;
                loom_err werr;
                if (loom_peak_store(&pk, &stored, &werr))
                    loom_warn("peak FLOP/s cache not written: %s", werr.msg);
            }
        }
        if (rank0) {
            peak = pk.flops;
            snprintf(peak_from, sizeof peak_from, "%s",
                     pk.source == LOOM_PEAK_ENV ? "LOOM_PEAK_FLOPS"
                     : pk.source == LOOM_PEAK_CACHE ? "the peak cache" : "measured now");
            if (pk.note[0]) loom_warn("%s", pk.note);
        }
    }
    int mfu_warned = 0;
    const double flops_tok = loom_model_flops_per_token(t.model, (int)t.s.T);
    /* tokens per batch (a preference pair is two rows) */
    const int64_t BT = t.s.B * t.s.T * (t.pref.method != LOOM_PREF_SFT ? 2 : 1) *
                       loom_trainer_grpo_rows(&t); /* (GRPO: G rows per prompt) */
    loom_dp_memory mem;
    loom_dp_memory_usage(t.dp, &mem);
    const size_t mem_bytes = mem.param_bytes + mem.grad_bytes + mem.optim_bytes +
                             2 * mem.bf16_elems + loom_model_arena_bytes(t.model);
    if (rank0) {
        char layout[256], mine[64] = "";
        /* the whole model's count: under tp/pp/ep this rank's view holds only a part of it */
        size_t n_params = loom_model_num_params(t.model);
        loom_model *whole = NULL;
        loom_err werr;
        if (t.world_size > 1 && loom_model_create_layout(&t.mc, 1, 1, &whole, &werr) == 0) {
            if (loom_model_num_params(whole) != n_params)
                snprintf(mine, sizeof mine, " (%zu on rank 0)", n_params);
            n_params = loom_model_num_params(whole);
        }
        loom_model_free(whole);
        loom_log("model: %s, %zu parameters%s; %s, zero %lld, %d threads per rank, peak %.1f "
                 "GFLOP/s per rank (%s); data: %llu training samples of %lld tokens",
                 loom_config_arch(&t.mc)->name, n_params, mine,
                 loom_mesh_describe(t.mesh, layout, sizeof layout),
                 (long long)t.s.zero, threads, peak / 1e9, peak > 0 ? peak_from : "none",
                 (unsigned long long)(t.classify ? loom_windows_per_epoch(t.train_w)
                                                 : loom_loader_num_samples(t.train_ld)),
                 (long long)t.s.T);
    }
    if (t.tp && !t.pp) { /* every rank's activation arena (its share of the heads, columns,
                          * vocabulary rows and, with sp, rows): fixed, gathered once */
        const double mine_act = (double)loom_model_arena_bytes(t.model);
        tp_act = loom_calloc((size_t)t.world_size, sizeof(double));
        loom_allgather(t.mesh, LOOM_GROUP_WORLD, &mine_act, tp_act, (size_t)t.world_size,
                       LOOM_F64);
    }
    t.g_inp = loom_malloc((size_t)BT * sizeof(int32_t));
    t.g_tgt = loom_malloc((size_t)BT * sizeof(int32_t));
    if (t.mc.doc_mask) t.g_doc = loom_malloc((size_t)BT * sizeof(int32_t));
    loom_trainer_accum_alloc(&t);
    const int64_t first_step = t.step;
    const double t_start = loom_now();
    loom_progress_init(&pg, 0);
    loom_signals_catch(on_stop_signal, &stop_signal);
    handlers = 1;
    per_rank = loom_calloc(3 * (size_t)t.world_size, sizeof(double));
    if (train_obs_create(&t, peak, &obs, err)) goto done;
    pp_ranks = loom_calloc(PP_METRICS * (size_t)t.world_size, sizeof(double));

    while (t.step < t.s.steps) {
        const double t0 = loom_now();
        loom_comm_stats_reset(t.mesh);
        train_obs_step_begin(obs, &t);
        if (t.pp) loom_pp_stats_reset(t.pp);
        if (t.tp) loom_tp_stats_reset(t.tp);
        if (t.s.follow && !t.classify) { /* rank 0 decides how many manifest lines everyone uses */
            int lines = 0;
            if (rank0 && loom_loader_refresh(t.train_ld, 0, &lines, err)) goto done;
            int64_t nl = lines;
            loom_broadcast(t.mesh, LOOM_GROUP_WORLD, &nl, 1, LOOM_I64, 0);
            if (!rank0 && loom_loader_refresh(t.train_ld, (int)nl, NULL, err)) goto done;
        }
        double loss, lr;
        float gnorm;
        int skipped;
        t.inject_nan = nan_injected(t.world_rank, t.step + 1);
        loom_trainer_moe_begin_step(&t);
        if (loom_trainer_step(&t, next_train_batch, NULL, &loss, &lr, &gnorm, &skipped, err))
            goto done;
        loom_trainer_moe_reduce(&t); /* before eval's forwards */
        consecutive_skips = skipped ? consecutive_skips + 1 : 0;
        loss = train_obs_test_loss(t.step, loss);
        if (skipped && rank0)
            loom_warn("step %lld: loss %g, gradient norm %g: not finite; the step is skipped on "
                      "every rank (parameters and optimizer state unchanged; %lld consecutive, "
                      "training.max_skipped = %lld)", (long long)t.step, loss, (double)gnorm,
                      (long long)consecutive_skips, (long long)t.s.max_skipped);
        else if (skipped)
            loom_warn("rank %d: step %lld skipped (not finite)", t.world_rank, (long long)t.step);
        if (fault_check(t.world_rank, t.step, err)) goto done;
        if (t.s.check_replicas && t.s.zero < 3 && t.dp_size * t.cp_size > 1) {
            uint64_t h = loom_dp_param_hash(t.dp), lo = h, hi = h;
            int64_t v[2] = {(int64_t)(h >> 1), -(int64_t)(h >> 1)};
            /* with expert parallelism the dp ranks hold different experts: replicas are the
             * expert-data group's */
            loom_allreduce_max(t.mesh, t.ep ? LOOM_GROUP_EDP : t.red_group, v, 2, LOOM_I64);
            lo = (uint64_t)(-v[1]);
            hi = (uint64_t)v[0];
            if (lo != hi) {
                loom_errf(err, "step %lld: data-parallel replicas' parameters differ (hash range "
                               "%016llx..%016llx)", (long long)t.step, (unsigned long long)lo << 1,
                          (unsigned long long)hi << 1);
                goto done;
            }
        }
        if (t.s.check_replicas && t.pp && !loom_pp_tied_in_sync(t.pp)) {
            loom_errf(err, "step %lld: the tied embedding's two copies (wte on the first and the "
                           "last pipeline stage) differ", (long long)t.step);
            goto done;
        }
        const double dt = loom_now() - t0;
        /* the step's time in tensor parallelism's collectives (this rank; before eval) */
        const double tp_comm_s = t.tp ? loom_tp_comm_seconds(t.tp) : 0.0;
        const double tps = (double)(BT * t.s.accum) / dt;
        const double mfu = peak > 0 ? flops_tok * tps / (peak * t.world_size) : -1;
        if (rank0 && mfu > 1.0 && !mfu_warned) {
            /* reported as it is: the peak is what is wrong */
            mfu_warned = 1;
            loom_warn("step %lld: MFU %.1f%% is above 100%%: the peak (%.1f GFLOP/s per rank, "
                      "from %s) is wrong, most likely measured on a busy machine; run `loom peak` "
                      "on an idle machine", (long long)t.step, 100 * mfu, peak / 1e9, peak_from);
        }
        loom_comm_stats cs;
        loom_comm_stats_get(t.mesh, &cs);
        double mine[3] = {cs.total_time_s, cs.total_bytes, cs.total_wait_s};
        loom_allgather(t.mesh, LOOM_GROUP_WORLD, mine, per_rank, 3 * (size_t)t.world_size, LOOM_F64);
        if (t.pp) { /* per rank: the pipeline's bubble, activation arenas, parameter bytes */
            double pm[PP_METRICS] = {loom_pp_bubble_seconds(t.pp),
                                     (double)loom_pp_activation_bytes(t.pp),
                                     (double)loom_pp_peak_arenas(t.pp), (double)mem.param_bytes,
                                     (double)loom_pp_stage(t.pp), loom_pp_run_seconds(t.pp)};
            loom_allgather(t.mesh, LOOM_GROUP_WORLD, pm, pp_ranks,
                           PP_METRICS * (size_t)t.world_size, LOOM_F64);
        }
        if (train_obs_after_step(obs, &t, dt, &cs, mem_bytes, err)) goto done;
        const int last = t.step == t.s.steps;
        double vloss = -1, vacc = 0;
        if (t.val_ds && ((t.s.eval_every > 0 && t.step % t.s.eval_every == 0) || last)) {
            loom_prof_begin("eval", "phase");
            if (eval_loss(&t, &vloss, &vacc, err)) goto done;
            loom_prof_end(0, 0, NULL);
            if (rank0 && (!isatty(STDERR_FILENO) || last)) {
                loom_progress_end(&pg); /* a terminal: the log line below the progress line */
                if (t.classify)
                    loom_log("step %lld: val loss %.4f, val accuracy %.4f", (long long)t.step,
                             vloss, vacc);
                else
                    loom_log("step %lld: val loss %.4f", (long long)t.step, vloss);
            }
        }
        if (rank0) {
            loom_metrics_begin(mx);
            loom_metrics_int(mx, "step", t.step);
            loom_metrics_real(mx, "loss", loss);
            loom_metrics_real(mx, "lr", lr);
            loom_trainer_moe_write(&t, mx);
            loom_trainer_pref_write(&t, mx);
            loom_trainer_grpo_write(&t, mx);
            loom_metrics_real(mx, "grad_norm", (double)gnorm);
            loom_metrics_int(mx, "skipped_steps", t.skipped_steps);
            if (skipped) loom_metrics_int(mx, "skipped", 1);
            loom_metrics_real(mx, "tokens_per_s", tps);
            if (peak > 0) { /* the peak used: MFU = tokens/s x FLOPs/token / peak_flops */
                loom_metrics_real(mx, "mfu", mfu);
                loom_metrics_real(mx, "peak_flops", peak * t.world_size);
            }
            loom_metrics_int(mx, "mem_bytes", (int64_t)mem_bytes +
                             (t.pp ? (int64_t)loom_pp_activation_bytes(t.pp) : 0));
            /* the activation arenas: the model's own, or the pipeline's micro-batches' */
            loom_metrics_int(mx, "act_bytes", t.pp ? (int64_t)loom_pp_activation_bytes(t.pp)
                                                   : (int64_t)loom_model_arena_bytes(t.model));
            const int64_t rss = rss_bytes(); /* read once: the sinks must agree */
            loom_metrics_int(mx, "rss_bytes", rss);
            loom_metrics_real(mx, "step_ms", dt * 1e3);
            if (vloss >= 0) loom_metrics_real(mx, "val_loss", vloss);
            if (vloss >= 0 && t.classify) loom_metrics_real(mx, "val_accuracy", vacc);
            loom_metrics_int(mx, "param_bytes", (int64_t)mem.param_bytes);
            loom_metrics_int(mx, "grad_bytes", (int64_t)mem.grad_bytes);
            loom_metrics_int(mx, "optim_bytes", (int64_t)mem.optim_bytes);
            if (t.tp) loom_metrics_real(mx, "tp_comm_s", tp_comm_s);
            if (tp_act) loom_metrics_reals(mx, "tp_act_bytes", tp_act, t.world_size, 1);
            if (t.world_size > 1) {
                loom_metrics_reals(mx, "comm_s", per_rank, t.world_size, 3);
                loom_metrics_reals(mx, "comm_bytes", per_rank + 1, t.world_size, 3);
                loom_metrics_reals(mx, "comm_wait_s", per_rank + 2, t.world_size, 3);
            }
            if (t.pp) {
                loom_metrics_reals(mx, "pp_bubble_s", pp_ranks, t.world_size, PP_METRICS);
                loom_metrics_reals(mx, "pp_act_bytes", pp_ranks + 1, t.world_size, PP_METRICS);
                loom_metrics_reals(mx, "pp_peak_arenas", pp_ranks + 2, t.world_size, PP_METRICS);
                loom_metrics_reals(mx, "pp_param_bytes", pp_ranks + 3, t.world_size, PP_METRICS);
                loom_metrics_reals(mx, "pp_stage", pp_ranks + 4, t.world_size, PP_METRICS);
                loom_metrics_reals(mx, "pp_run_s", pp_ranks + 5, t.world_size, PP_METRICS);
            }
            train_obs_metrics(obs, mx);
            if (loom_metrics_end(mx, err)) goto done;
            const train_obs_row row = {t.step, loss, lr, (double)gnorm, tps, mfu, dt * 1e3,
                                       vloss, (double)rss, skipped,
                                       t.skipped_steps};
            if (train_obs_publish(obs, &row, err)) goto done;
            progress(&t, &pg, (t.step % t.s.log_every == 0 && !pg.tty) || last, loss, lr, tps,
                     mfu, loom_now() - t_start, first_step);
        }
        /* the stop decision must be the same on every rank */
        double stops[2] = {atomic_load(&stop_signal), train_obs_stop_requested(obs)};
        loom_allreduce_max(t.mesh, LOOM_GROUP_WORLD, stops, 2, LOOM_F64);
        const double stop = stops[0], alert_stop = stops[1];
        const int give_up = consecutive_skips >= t.s.max_skipped;
        if ((t.s.ckpt_every > 0 && (t.step % t.s.ckpt_every == 0 || last)) || stop > 0 ||
            give_up || alert_stop > 0) {
            /* the rows up to this step are durable before the checkpoint commits */
            if (rank0 && loom_metrics_sync(mx, err)) goto done;
            loom_prof_begin("checkpoint", "ckpt");
            if (loom_trainer_save_checkpoint(&t, err)) goto done;
            loom_prof_end(0, 0, NULL);
        }
        if (train_obs_step_end(obs, &t, err)) goto done;
        if (alert_stop > 0) {
            loom_errf(err, "step %lld: stopped by an alert rule with action stop (see %s/"
                           "alerts.jsonl); checkpoint saved in %s (exit status %d)",
                      (long long)t.step, t.s.run_dir, t.ckpt_root, LOOM_TRAIN_ALERT_STOP);
            rc = LOOM_TRAIN_ALERT_STOP;
            goto stopped;
        }
        if (give_up) {
            loom_errf(err, "step %lld: %lld consecutive steps had a non-finite loss or gradient "
                           "norm (training.max_skipped = %lld); stopping. Checkpoint saved in "
                           "%s/step_%07lld: its parameters are those of step %lld, the last good "
                           "one (lower training.lr, check the data, or raise training.max_skipped)",
                      (long long)t.step, (long long)consecutive_skips, (long long)t.s.max_skipped,
                      t.ckpt_root, (long long)t.step, (long long)(t.step - consecutive_skips));
            goto done;
        }
        if (stop > 0) {
            loom_errf(err, "interrupted by signal %d at step %lld; checkpoint saved in %s "
                           "(run the same command to continue)",
                      (int)stop, (long long)t.step, t.ckpt_root);
            rc = LOOM_TRAIN_EXIT_SIGNAL + (int)stop;
            goto stopped;
        }
    }
    loom_progress_end(&pg);
    if (train_obs_finish(obs, &t, err)) goto done;
    rc = 0;
    goto done;
stopped:
    if (train_obs_finish(obs, &t, err)) rc = -1;
done:
    loom_progress_end(&pg); /* a terminal: the error or the shell prompt on the next line */
    if (handlers) loom_signals_catch(NULL, NULL);
    train_obs_free(obs);
    free(per_rank);
    free(pp_ranks);
    free(tp_act);
    free(t.g_inp);
    free(t.g_tgt);
    free(t.g_doc);
    loom_trainer_accum_free(&t);
    loom_metrics_close(mx);
    loom_loader_free(t.train_ld);
    loom_windows_free(t.train_w);
    loom_dataset_close(t.train_ds);
    loom_dataset_close(t.val_ds);
    loom_trainer_lora_free(&t);
    loom_trainer_grpo_free(&t); /* (its engine decodes t.model: before it) */
    loom_trainer_pref_free(&t);
    loom_run_data_free(t.run_data);
    loom_pp_free(t.pp);
    loom_dp_free(t.dp);
    loom_cp_free(t.cp);
    free(t.l_inp);
    free(t.l_tgt);
    free(t.h_logits);
    loom_model_free(t.model);
    loom_tp_free(t.tp);
    loom_trainer_moe_free(&t);
    loom_unlock_file(run_lock);
    /* collective under MPI: on an error the job is ended by the caller instead */
    if (rc == 0 || rc == LOOM_TRAIN_ALERT_STOP || !loom_comm_mpi_active())
        loom_mesh_free(t.mesh);
    return rc;
}
