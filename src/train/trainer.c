/* The training loop: config -> model + optimizer + loader, resume, steps, eval, metrics,
 * checkpoints. */
#define _GNU_SOURCE
#include "loom/train.h"

#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/checkpoint.h"
#include "loom/data.h"
#include "loom/metrics.h"
#include "loom/model.h"
#include "loom/model_config.h"
#include "loom/obs.h"
#include "loom/optim.h"

static const loom_config_key train_only_keys[] = {
    {"run.dir", "runs/default", "run directory: config.yaml, metrics.jsonl, ckpt/"},
    {"data.train", NULL, "training dataset directory (with manifest.jsonl)"},
    {"data.val", "", "validation dataset directory; empty = no validation"},
    {"data.shuffle", "true", "visit training samples in a seeded permutation per epoch"},
    {"training.steps", "1000", "optimizer steps to reach (raising it continues a run)"},
    {"training.schedule_steps", NULL, "horizon of the lr schedule (default training.steps); "
                                      "fix it to stop and continue a run along one schedule"},
    {"training.seed", "1337", "seeds init and data order"},
    {"training.batch_size", "8", "B: sequences per micro-batch"},
    {"training.seq_len", "256", "T: tokens per sequence"},
    {"training.grad_accum", "1", "micro-batches per optimizer step"},
    {"training.lr", "3e-4", "peak learning rate"},
    {"training.min_lr", NULL, "final learning rate (default lr/10)"},
    {"training.warmup", "100", "linear warmup steps"},
    {"training.schedule", "cosine", "cosine | wsd | constant"},
    {"training.decay_frac", "0.2", "wsd: fraction of the steps after warmup spent decaying"},
    {"training.weight_decay", "0.1", "AdamW decoupled weight decay (matrices only)"},
    {"training.beta1", "0.9", "AdamW beta1"},
    {"training.beta2", "0.95", "AdamW beta2"},
    {"training.eps", "1e-8", "AdamW epsilon"},
    {"training.grad_clip", "1.0", "global gradient-norm clip; 0 = off"},
    {"training.threads", "0", "OpenMP/BLAS threads; 0 = all cores"},
    {"training.peak_flops", "0", "peak FLOP/s for MFU; 0 = measure once per machine"},
    {"training.log_every", "1", "progress line every N steps"},
    {"eval.every", "100", "validation loss every N steps (0 = only at the end)"},
    {"eval.batches", "8", "validation batches per evaluation"},
    {"checkpoint.every", "0", "checkpoint every N steps (0 = no checkpoints)"},
};
#define N_TRAIN_ONLY ((int)(sizeof train_only_keys / sizeof train_only_keys[0]))

/* the full schema, assembled once */
static loom_config_key all_keys[64];
static int n_all_keys;

static void build_schema(void) {
    if (n_all_keys) return;
    for (int i = 0; i < N_TRAIN_ONLY; i++) all_keys[n_all_keys++] = train_only_keys[i];
    for (int i = 0; i < loom_model_config_nkeys; i++) all_keys[n_all_keys++] = loom_model_config_keys[i];
    LOOM_CHECK(n_all_keys <= (int)(sizeof all_keys / sizeof all_keys[0]));
}

const loom_config_key *loom_train_schema(int *n) {
    build_schema();
    *n = n_all_keys;
    return all_keys;
}

typedef struct settings {
    const char *run_dir, *train_dir, *val_dir;
    int shuffle;
    int64_t steps, seed, B, T, accum, threads, log_every, eval_every, eval_batches;
    int64_t ckpt_every;
    double weight_decay, beta1, beta2, eps, grad_clip, peak_flops;
    loom_schedule sched;
} settings;

static int read_settings(const loom_config *c, settings *s, loom_err *err) {
    memset(s, 0, sizeof *s);
    const char *sched;
    if (loom_config_get_str(c, "run.dir", &s->run_dir, err) ||
        loom_config_get_str(c, "data.val", &s->val_dir, err) ||
        loom_config_get_bool(c, "data.shuffle", &s->shuffle, err) ||
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
        loom_config_get_int(c, "eval.every", &s->eval_every, err) ||
        loom_config_get_int(c, "eval.batches", &s->eval_batches, err) ||
        loom_config_get_int(c, "checkpoint.every", &s->ckpt_every, err))
        return -1;
    if (!loom_config_get(c, "data.train"))
        return loom_errf(err, "config: data.train is required (a dataset directory built by "
                              "`loom data build`)");
    if (loom_config_get_str(c, "data.train", &s->train_dir, err)) return -1;
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
        {"eval.every", s->eval_every, 0, INT64_C(1) << 40},
        {"eval.batches", s->eval_batches, 1, 1 << 20},
        {"checkpoint.every", s->ckpt_every, 0, INT64_C(1) << 40},
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

/* ---- checkpoint payloads -------------------------------------------------------------- */

typedef struct trainer {
    settings s;
    loom_config *cfg;
    loom_model_config mc;
    loom_model *model;
    loom_adamw opt;
    loom_dataset *train_ds, *val_ds;
    loom_loader *train_ld;
    int64_t step;  /* optimizer steps completed */
    char ckpt_root[4096];
} trainer;

static int save_checkpoint(trainer *t, loom_err *err) {
    loom_model *m = t->model;
    const int nt = loom_model_num_tensors(m);
    loom_st_tensor *pt = loom_calloc((size_t)nt, sizeof *pt);
    loom_st_tensor *ot = loom_calloc(2 * (size_t)nt, sizeof *ot);
    char (*onames)[64] = loom_calloc(2 * (size_t)nt, 64);
    int np = 0, no = 0;
    for (int i = 0; i < loom_model_num_tensors(m); i++) {
        const loom_tensor_info *ti = loom_model_tensor(m, i);
        if (ti->numel == 0) continue;
        loom_st_tensor x = {.name = ti->name, .data = loom_model_params(m) + ti->offset,
                            .ndim = ti->ndim};
        for (int d = 0; d < ti->ndim; d++) x.shape[d] = ti->shape[d];
        pt[np++] = x;
        for (int k = 0; k < 2; k++) {
            snprintf(onames[no], sizeof onames[no], "%s.%s", k == 0 ? "adam_m" : "adam_v", ti->name);
            loom_st_tensor y = x;
            y.name = onames[no];
            y.data = (k == 0 ? t->opt.m : t->opt.v) + ti->offset;
            ot[no++] = y;
        }
    }
    char *model_buf = NULL, *opt_buf = NULL, *state_buf = NULL, *cfg_buf = NULL;
    size_t model_len = 0, opt_len = 0;
    int rc = -1;
    if (loom_safetensors_serialize(pt, np, NULL, &model_buf, &model_len, err) ||
        loom_safetensors_serialize(ot, no, NULL, &opt_buf, &opt_len, err))
        goto done;
    loom_loader_state ls = loom_loader_get_state(t->train_ld);
    json_t *st = json_pack("{s:I, s:I, s:{s:I, s:I}, s:{s:I, s:s}, s:s}", "step", (json_int_t)t->step,
                           "optimizer_step", (json_int_t)t->opt.step, "loader", "epoch",
                           (json_int_t)ls.epoch, "position", (json_int_t)ls.position, "rng",
                           "seed", (json_int_t)t->s.seed, "kind", "counter-based (stateless)",
                           "loom_version", LOOM_VERSION);
    LOOM_CHECK(st != NULL);
    state_buf = json_dumps(st, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(st);
    cfg_buf = loom_config_to_yaml(t->cfg);
    loom_ckpt_file files[] = {
        {"model.safetensors", model_buf, model_len},
        {"optimizer.safetensors", opt_buf, opt_len},
        {"trainer_state.json", state_buf, strlen(state_buf)},
        {"config.yaml", cfg_buf, strlen(cfg_buf)},
    };
    rc = loom_ckpt_save(t->ckpt_root, t->step, files, 4, NULL, 0, err);
done:
    free(model_buf);
    free(opt_buf);
    free(state_buf);
    free(cfg_buf);
    free(pt);
    free(ot);
    free(onames);
    return rc;
}

static int json_get_int(json_t *obj, const char *key, int64_t *out, const char *where,
                        loom_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return loom_errf(err, "%s: '%s' missing or not a non-negative integer", where, key);
    *out = json_integer_value(v);
    return 0;
}

static int load_checkpoint(trainer *t, const char *dir, loom_err *err) {
    loom_ckpt *ck = NULL;
    loom_st_file *mf = NULL, *of = NULL;
    json_t *st = NULL;
    int rc = -1;
    char where[4200];
    if (loom_ckpt_open(dir, &ck, err)) return -1;
    size_t ml, ol, sl;
    const char *mb = loom_ckpt_file_data(ck, "model.safetensors", &ml);
    const char *ob = loom_ckpt_file_data(ck, "optimizer.safetensors", &ol);
    const char *sb = loom_ckpt_file_data(ck, "trainer_state.json", &sl);
    if (!mb || !ob || !sb) {
        loom_errf(err, "%s: checkpoint lacks model.safetensors, optimizer.safetensors or "
                       "trainer_state.json", dir);
        goto done;
    }
    loom_pathf(where, sizeof where, "%s/model.safetensors", dir);
    if (loom_safetensors_parse(mb, ml, where, &mf, err)) goto done;
    loom_pathf(where, sizeof where, "%s/optimizer.safetensors", dir);
    if (loom_safetensors_parse(ob, ol, where, &of, err)) goto done;
    for (int i = 0; i < loom_model_num_tensors(t->model); i++) {
        const loom_tensor_info *ti = loom_model_tensor(t->model, i);
        if (ti->numel == 0) continue;
        char name[80];
        if (loom_safetensors_read_into(mf, ti->name, loom_model_params(t->model) + ti->offset,
                                       ti->ndim, ti->shape, err))
            goto done;
        snprintf(name, sizeof name, "adam_m.%s", ti->name);
        if (loom_safetensors_read_into(of, name, t->opt.m + ti->offset, ti->ndim, ti->shape, err))
            goto done;
        snprintf(name, sizeof name, "adam_v.%s", ti->name);
        if (loom_safetensors_read_into(of, name, t->opt.v + ti->offset, ti->ndim, ti->shape, err))
            goto done;
    }
    json_error_t je;
    loom_pathf(where, sizeof where, "%s/trainer_state.json", dir);
    st = json_loadb(sb, sl, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(st)) {
        loom_errf(err, "%s:%d: %s", where, je.line, st ? "not a JSON object" : je.text);
        goto done;
    }
    int64_t step = 0, ostep = 0, epoch = 0, pos = 0;
    json_t *ld = json_object_get(st, "loader");
    if (json_get_int(st, "step", &step, where, err) ||
        json_get_int(st, "optimizer_step", &ostep, where, err) ||
        json_get_int(ld, "epoch", &epoch, where, err) ||
        json_get_int(ld, "position", &pos, where, err))
        goto done;
    t->step = step;
    t->opt.step = ostep;
    loom_loader_set_state(t->train_ld, (loom_loader_state){(uint64_t)epoch, (uint64_t)pos});
    rc = 0;
done:
    json_decref(st);
    loom_safetensors_close(mf);
    loom_safetensors_close(of);
    loom_ckpt_close(ck);
    return rc;
}

/* ---- interruption: SIGINT/SIGTERM finish the current step, checkpoint, and stop ---- */
static volatile sig_atomic_t g_stop_signal;
static void on_stop_signal(int sig) { g_stop_signal = sig; }

static void install_stop_handlers(struct sigaction *old_int, struct sigaction *old_term) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    g_stop_signal = 0;
    sigaction(SIGINT, &sa, old_int);
    sigaction(SIGTERM, &sa, old_term);
}

/* ---- evaluation ------------------------------------------------------------------------ */

static int eval_loss(trainer *t, int32_t *inp, int32_t *tgt, double *out, loom_err *err) {
    loom_loader *vl = NULL;
    if (loom_loader_create(t->val_ds, (int)t->s.T, (uint64_t)t->s.seed, 0, &vl, err))
        return loom_err_prefix(err, "validation data %s", t->s.val_dir);
    double sum = 0;
    for (int64_t b = 0; b < t->s.eval_batches; b++) {
        loom_loader_next(vl, (int)t->s.B, inp, tgt);
        sum += loom_model_forward(t->model, inp, tgt, (int)t->s.B, (int)t->s.T);
    }
    loom_loader_free(vl);
    *out = sum / (double)t->s.eval_batches;
    return 0;
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
    if (loom_loader_create(t->train_ds, (int)t->s.T, (uint64_t)t->s.seed, t->s.shuffle,
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

static void progress(const trainer *t, double loss, double lr, double tps, double mfu,
                     double elapsed, int64_t first_step) {
    const int64_t done = t->step - first_step, left = t->s.steps - t->step;
    const double eta = done > 0 ? elapsed / (double)done * (double)left : 0;
    const int tty = isatty(STDERR_FILENO);
    fprintf(stderr, "%sstep %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | mfu %.1f%% | eta %.0fs%s",
            tty ? "\r" : "", (long long)t->step, (long long)t->s.steps, loss, lr, tps, 100 * mfu,
            eta, tty ? "   " : "\n");
    fflush(stderr);
}

int loom_train(loom_config *cfg, loom_err *err) {
    build_schema();
    if (loom_config_apply_schema(cfg, all_keys, n_all_keys, err)) return -1;
    trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    int rc = -1;
    int32_t *inp = NULL, *tgt = NULL;
    loom_metrics *mx = NULL;
    if (read_settings(cfg, &t.s, err)) return -1;
    if (loom_model_config_from(cfg, (int)t.s.T, &t.mc, err)) return -1;
    if (t.s.T > t.mc.max_seq_len)
        return loom_errf(err, "config: training.seq_len %lld exceeds model.max_seq_len %d",
                         (long long)t.s.T, t.mc.max_seq_len);
    if (t.s.threads > 0) omp_set_num_threads((int)t.s.threads);
    const int threads = omp_get_max_threads();

    char path[4200];
    if (loom_mkdirs(t.s.run_dir, err)) return -1;
    loom_pathf(t.ckpt_root, sizeof t.ckpt_root, "%s/ckpt", t.s.run_dir);
    if (loom_config_write_yaml(cfg, loom_pathf(path, sizeof path, "%s/config.yaml", t.s.run_dir),
                               err))
        return -1;
    if (open_data(&t, err)) goto done;
    if (loom_model_create(&t.mc, (int)t.s.B, (int)t.s.T, &t.model, err)) goto done;
    loom_model_init_weights(t.model, (uint64_t)t.s.seed);
    loom_adamw_init(&t.opt, loom_model_num_params(t.model), (float)t.s.beta1, (float)t.s.beta2,
                    (float)t.s.eps, (float)t.s.weight_decay);

    char latest[4200];
    int64_t latest_step = -1;
    if (loom_ckpt_find_latest(t.ckpt_root, latest, sizeof latest, &latest_step, err)) goto done;
    if (latest_step >= 0) {
        if (load_checkpoint(&t, latest, err)) goto done;
        loom_log("resumed from %s (step %lld)", latest, (long long)t.step);
    }
    loom_pathf(path, sizeof path, "%s/metrics.jsonl", t.s.run_dir);
    if (loom_metrics_open(path, t.step, &mx, err)) goto done;

    const double peak = t.s.peak_flops > 0 ? t.s.peak_flops : loom_peak_flops(threads);
    const double flops_tok = loom_model_flops_per_token(t.model, (int)t.s.T);
    const int64_t BT = t.s.B * t.s.T;
    loom_log("model: %s, %zu parameters, %d threads, peak %.1f GFLOP/s; data: %llu training "
             "samples of %lld tokens",
             t.mc.flavor == LOOM_FLAVOR_GPT2 ? "gpt2" : "llama", loom_model_num_params(t.model),
             threads, peak / 1e9, (unsigned long long)loom_loader_num_samples(t.train_ld),
             (long long)t.s.T);
    inp = loom_malloc((size_t)BT * sizeof(int32_t));
    tgt = loom_malloc((size_t)BT * sizeof(int32_t));
    const size_t mem_bytes = loom_model_arena_bytes(t.model) + 2 * t.opt.n * sizeof(float);
    const int64_t first_step = t.step;
    const double t_start = loom_now();
    struct sigaction old_int, old_term;
    install_stop_handlers(&old_int, &old_term);

    while (t.step < t.s.steps) {
        const double t0 = loom_now();
        loom_model_zero_grad(t.model);
        double loss = 0;
        for (int64_t micro = 0; micro < t.s.accum; micro++) {
            loom_loader_next(t.train_ld, (int)t.s.B, inp, tgt);
            loss += loom_model_forward(t.model, inp, tgt, (int)t.s.B, (int)t.s.T);
            const int64_t valid = loom_model_valid_targets(t.model);
            loom_model_backward(t.model, valid > 0 ? 1.0f / (float)(valid * t.s.accum) : 0.0f);
        }
        loss /= (double)t.s.accum;
        const float gnorm = loom_clip_grad_norm(loom_model_grads(t.model), t.opt.n,
                                                (float)t.s.grad_clip);
        const double lr = loom_schedule_lr(&t.s.sched, t.step);
        loom_adamw_step(&t.opt, t.model, (float)lr);
        t.step++;
        const double dt = loom_now() - t0;
        const double tps = (double)(BT * t.s.accum) / dt;
        const double mfu = flops_tok * tps / peak;

        json_t *row = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:f}", "step",
                                (json_int_t)t.step, "loss", loss, "lr", lr, "grad_norm",
                                (double)gnorm, "tokens_per_s", tps, "mfu", mfu, "mem_bytes",
                                (json_int_t)mem_bytes, "rss_bytes", (json_int_t)rss_bytes(),
                                "step_ms", dt * 1e3);
        LOOM_CHECK(row != NULL);
        if (!isfinite(loss)) {
            json_decref(row);
            loom_errf(err, "step %lld: loss is not finite (%f); stopping", (long long)t.step, loss);
            goto done;
        }
        const int last = t.step == t.s.steps;
        if (t.val_ds && ((t.s.eval_every > 0 && t.step % t.s.eval_every == 0) || last)) {
            double vloss = 0;
            if (eval_loss(&t, inp, tgt, &vloss, err)) {
                json_decref(row);
                goto done;
            }
            json_object_set_new(row, "val_loss", json_real(vloss));
            if (!isatty(STDERR_FILENO) || last) loom_log("step %lld: val loss %.4f", (long long)t.step, vloss);
        }
        int wr = loom_metrics_write(mx, row, err);
        json_decref(row);
        if (wr) goto done;
        if (t.step % t.s.log_every == 0 || last)
            progress(&t, loss, lr, tps, mfu, loom_now() - t_start, first_step);
        const int stop = g_stop_signal != 0;
        if ((t.s.ckpt_every > 0 && (t.step % t.s.ckpt_every == 0 || last)) || stop) {
            if (save_checkpoint(&t, err)) goto done;
        }
        if (stop) {
            loom_errf(err, "interrupted by signal %d at step %lld; checkpoint saved in %s "
                           "(run the same command to continue)",
                      (int)g_stop_signal, (long long)t.step, t.ckpt_root);
            goto done;
        }
    }
    if (isatty(STDERR_FILENO)) fputc('\n', stderr);
    rc = 0;
done:
    if (inp) { /* handlers were installed */
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
    }
    free(inp);
    free(tgt);
    loom_metrics_close(mx);
    loom_loader_free(t.train_ld);
    loom_dataset_close(t.train_ds);
    loom_dataset_close(t.val_ds);
    if (t.model) loom_adamw_free(&t.opt);
    loom_model_free(t.model);
    return rc;
}
