/* The trainer's observability: profiler window, per-rank timing and stragglers, the sinks and
 * the alert rules (docs/observability.md). trainer.c calls the train_obs_* hooks; the rest of
 * the work is in src/obs/. */
#define _GNU_SOURCE
#include "loom/backend.h"
#include "train/train_obs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "loom/alerts.h"
#include "loom/obs_sinks.h"
#include "loom/profile.h"
#include "train/trainer_internal.h"

/* loom_obs_config_keys (obs.*, profile.*, alerts) are in src/ckpt/run_schema.c */

/* per-rank fields gathered every step */
enum { F_STEP, F_DATA, F_COMM, F_COMPUTE, F_HWM, F_ARENA, F_DEV, NF };

/* What the Prometheus endpoint serves: the last step's values, copied by rank 0 after each
 * step (one memcpy under the endpoint's lock) and formatted by the endpoint's thread only
 * when a scrape asks for them. */
typedef struct prom_snap {
    train_obs_row row;
    double val_loss, lag;
    int64_t alerts_fired;
    int straggler, world;
    double all[];           /* (world, NF) */
} prom_snap;
static void prom_render(const void *data, size_t len, loom_sbuf *b);

struct train_obs {
    int rank, world, rank0;
    int armed, flushed, recorded;
    double ratio;
    double mine[NF];
    double *all;            /* (world, NF) */
    int cand, count;        /* the straggler candidate and its consecutive slow steps */
    int straggler;          /* named: rank, or -1 */
    double lag, lag_s;      /* busy / median, busy - median (seconds) */
    double model_flops;     /* the model FLOPs per step of this rank's model replica */
    int replica;            /* ranks sharing that replica's work: tp x pp x cp */
    int stop;
    const loom_backend *be; /* the model's: a device backend's memory is reported too */
    int device_mem;         /* 1 when be tells its device memory in use (cuda) */
    /* rank 0's sinks */
    loom_prom *prom;
    prom_snap *snap;
    size_t snap_bytes;
    loom_tb *tb;
    double tb_flushed;      /* loom_now() of the last TensorBoard flush */
    double t_start;         /* loom_now() at train_obs_create: elapsed_s */
    double val_loss;        /* the last validation loss (NAN: none yet) */
    int64_t alerts_fired;
    loom_alerts *alerts;    /* parsed on every rank (the same errors everywhere), used by rank 0 */
};

/* one metric family without labels; a value that is not finite is written as NaN */
static void family(loom_sbuf *b, const char *name, const char *type, const char *help, double v) {
    loom_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    if (isfinite(v)) loom_sbuf_printf(b, "%s %.17g\n", name, v);
    else loom_sbuf_printf(b, "%s NaN\n", name);
}

/* one per-rank family: value f of every rank, labelled rank="r" */
static void per_rank(loom_sbuf *b, const prom_snap *s, const char *name, const char *help, int f) {
    loom_sbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    for (int r = 0; r < s->world; r++)
        loom_sbuf_printf(b, "%s{rank=\"%d\"} %.17g\n", name, r, s->all[r * NF + f]);
}

/* the alert rules of the config (alerts, obs.default_alerts) */
static int open_alerts(const loom_config *cfg, const char *path, loom_alerts **out,
                       loom_err *err) {
    int defaults = 1, n_rules = 0;
    char **rules = NULL;
    if (loom_config_get_bool(cfg, "obs.default_alerts", &defaults, err)) return -1;
    if (loom_config_get(cfg, "alerts") && loom_config_get_list(cfg, "alerts", &rules, &n_rules, err))
        return -1;
    char what[200];
    snprintf(what, sizeof what, "config key 'alerts' (%s)",
             loom_config_get(cfg, "alerts") ? loom_config_origin(cfg, "alerts") : "");
    const int rc = loom_alerts_create(rules, n_rules, defaults, what, path, out, err);
    loom_config_free_list(rules, n_rules);
    return rc;
}

/* every obs key checked before anything is created or written */
static int check_keys(const loom_config *cfg, loom_err *err) {
    double ratio;
    int64_t port;
    int tb;
    if (loom_config_get_double(cfg, "obs.straggler_ratio", &ratio, err) ||
        loom_config_get_int(cfg, "obs.prometheus_port", &port, err) ||
        loom_config_get_bool(cfg, "obs.tensorboard", &tb, err))
        return -1;
    if (!(ratio > 1.0))
        return loom_errf(err, "config key 'obs.straggler_ratio' (%s): %g must be > 1",
                         loom_config_origin(cfg, "obs.straggler_ratio"), ratio);
    if (port < 0 || port > 65535)
        return loom_errf(err, "config key 'obs.prometheus_port' (%s): %lld is not a port "
                              "(1..65535, or 0 = off)",
                         loom_config_origin(cfg, "obs.prometheus_port"), (long long)port);
    loom_alerts *a = NULL;
    if (open_alerts(cfg, "", &a, err)) return -1;
    loom_alerts_free(a);
    return 0;
}

int train_obs_wrap_backend(const loom_config *cfg, loom_model_config *mc, loom_err *err) {
    if (check_keys(cfg, err)) return -1;
    const char *steps = loom_config_get(cfg, "profile.steps");
    if (!steps || !steps[0]) return 0;
    int64_t a, b;
    if (loom_prof_parse_steps(steps, "profile.steps", &a, &b, err)) return -1;
    mc->backend = loom_prof_backend(mc->backend ? mc->backend : loom_backend_default());
    return 0;
}

static void on_comm(void *ctx, loom_coll_kind k, loom_group g, double bytes, double t0,
                    double t1, double waited) {
    (void)ctx;
    loom_prof_comm(loom_coll_kind_name(k), loom_group_name(g), bytes, t0, t1, waited);
}

int train_obs_create(trainer *t, double peak, train_obs **out, loom_err *err) {
    *out = NULL;
    train_obs *o = loom_calloc(1, sizeof *o);
    o->rank = t->world_rank;
    o->world = t->world_size;
    o->rank0 = o->rank == 0;
    o->straggler = o->cand = -1;
    o->all = loom_calloc((size_t)o->world * NF, sizeof *o->all);
    o->be = loom_model_backend(t->model);
    size_t used = 0, total = 0;
    o->device_mem = loom_backend_mem_info(o->be, &used, &total) == 0;
    *out = o;
    if (loom_config_get_double(t->cfg, "obs.straggler_ratio", &o->ratio, err)) return -1;
    int64_t port = 0;
    int tb = 0;
    if (loom_config_get_int(t->cfg, "obs.prometheus_port", &port, err) ||
        loom_config_get_bool(t->cfg, "obs.tensorboard", &tb, err))
        return -1;
    o->val_loss = NAN;
    o->t_start = loom_now();
    if (o->rank0 && port > 0) {
        o->snap_bytes = sizeof *o->snap + (size_t)o->world * NF * sizeof(double);
        o->snap = loom_calloc(1, o->snap_bytes);
        if (loom_prom_start((int)port, "config key 'obs.prometheus_port'", prom_render,
                            &o->prom, err))
            return -1;
    }
    if (o->rank0 && tb) {
        char dir[4200];
        loom_pathf(dir, sizeof dir, "%s/tb", t->s.run_dir);
        if (loom_tb_open(dir, &o->tb, err)) return loom_err_prefix(err, "obs.tensorboard");
    }
    {
        char path[4200];
        loom_pathf(path, sizeof path, "%s/alerts.jsonl", t->s.run_dir);
        if (open_alerts(t->cfg, path, &o->alerts, err)) return -1;
    }
    o->model_flops = loom_model_flops_per_token(t->model, (int)t->s.T) * (double)t->local_B *
                     (double)t->s.T * (double)t->s.accum;
    o->replica = loom_mesh_size(t->mesh, LOOM_GROUP_TP) * loom_mesh_size(t->mesh, LOOM_GROUP_PP) *
                 loom_mesh_size(t->mesh, LOOM_GROUP_CP);
    const char *steps = loom_config_get(t->cfg, "profile.steps");
    if (steps && steps[0]) {
        int64_t a, b;
        if (loom_prof_parse_steps(steps, "profile.steps", &a, &b, err)) return -1;
        loom_broadcast(t->mesh, LOOM_GROUP_WORLD, &peak, 1, LOOM_F64, 0);
        loom_barrier(t->mesh, LOOM_GROUP_WORLD); /* the ranks' time origins about together */
        loom_prof_init(o->rank, a, b, peak);
        loom_comm_set_observer(t->mesh, on_comm, o);
        o->armed = 1;
        if (o->rank0 && b <= t->step)
            loom_warn("profile.steps %s: the run resumes after step %lld, past the window: "
                      "nothing will be profiled", steps, (long long)t->step);
    }
    return 0;
}

/* LOOM_TEST_SLOW_RANK="RANK:MS" (a test hook, read only here; tests/mpi/test_straggler.sh):
 * world rank RANK sleeps MS milliseconds in every step, as a slow node would compute. */
static void injected_delay(int rank) {
    const char *f = getenv("LOOM_TEST_SLOW_RANK");
    long r, ms;
    if (!f || sscanf(f, "%ld:%ld", &r, &ms) != 2 || r != rank || ms <= 0) return;
    loom_prof_begin("injected_delay", "test");
    usleep((useconds_t)ms * 1000);
    loom_prof_end(0, 0, NULL);
}

double train_obs_test_loss(int64_t step, double loss) {
    const char *f = getenv("LOOM_TEST_LOSS_SPIKE");
    long long s;
    double k;
    if (!f || sscanf(f, "%lld:%lf", &s, &k) != 2 || s != step) return loss;
    return loss * k;
}

void train_obs_step_begin(train_obs *o, trainer *t) {
    t->data_wait_s = 0;
    if (o->armed && loom_prof_step_begin(t->step + 1)) o->recorded = 1;
    injected_delay(o->rank);
}

/* The resident-set high-water mark of this process (VmHWM), bytes: one getrusage call, not
 * /proc/self/status's text read and parsed every step. */
static double rss_hwm(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru)) return 0;
    return (double)ru.ru_maxrss * 1024; /* kB on Linux */
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int train_obs_after_step(train_obs *o, trainer *t, double dt, const loom_comm_stats *cs,
                         size_t arena_bytes, loom_err *err) {
    (void)err;
    o->mine[F_STEP] = dt;
    o->mine[F_DATA] = t->data_wait_s;
    o->mine[F_COMM] = cs->total_wait_s;
    o->mine[F_COMPUTE] = fmax(0.0, dt - t->data_wait_s - cs->total_wait_s);
    o->mine[F_HWM] = rss_hwm();
    o->mine[F_ARENA] = (double)arena_bytes;
    size_t used = 0, total = 0;
    o->mine[F_DEV] = o->device_mem && loom_backend_mem_info(o->be, &used, &total) == 0
                         ? (double)used : 0;
    loom_allgather(t->mesh, LOOM_GROUP_WORLD, o->mine, o->all, NF * (size_t)o->world, LOOM_F64);
    /* the straggler: busy time (compute + data wait: what a rank spends not waiting for the
     * others) against the median rank's */
    o->straggler = -1;
    o->lag = o->lag_s = 0;
    if (o->world < 2) return 0;
    double *busy = loom_malloc((size_t)o->world * sizeof *busy);
    int slow = 0;
    for (int r = 0; r < o->world; r++) {
        busy[r] = o->all[r * NF + F_COMPUTE] + o->all[r * NF + F_DATA];
        if (busy[r] > busy[slow]) slow = r;
    }
    const double slowest = busy[slow];
    qsort(busy, (size_t)o->world, sizeof *busy, cmp_double);
    const int w = o->world;
    const double median = w % 2 ? busy[w / 2] : 0.5 * (busy[w / 2 - 1] + busy[w / 2]);
    free(busy);
    if (median > 0 && slowest > o->ratio * median) {
        o->count = slow == o->cand ? o->count + 1 : 1;
        o->cand = slow;
    } else {
        o->cand = -1;
        o->count = 0;
    }
    if (o->count >= 3) {
        o->straggler = o->cand;
        o->lag = slowest / median;
        o->lag_s = slowest - median;
        if (o->rank0 && o->count == 3)
            loom_warn("step %lld: rank %d is a straggler: busy %.1f ms per step against the "
                      "median rank's %.1f ms (%.2fx, obs.straggler_ratio = %g) for %d steps",
                      (long long)t->step, o->straggler, 1e3 * slowest, 1e3 * median, o->lag,
                      o->ratio, o->count);
    }
    return 0;
}

void train_obs_metrics(train_obs *o, loom_metrics *mx) {
    const int w = o->world;
    loom_metrics_reals(mx, "compute_s", o->all + F_COMPUTE, w, NF);
    loom_metrics_reals(mx, "comm_exposed_s", o->all + F_COMM, w, NF);
    loom_metrics_reals(mx, "data_wait_s", o->all + F_DATA, w, NF);
    loom_metrics_reals(mx, "step_s", o->all + F_STEP, w, NF);
    loom_metrics_reals(mx, "rss_hwm_bytes", o->all + F_HWM, w, NF);
    loom_metrics_reals(mx, "arena_bytes", o->all + F_ARENA, w, NF);
    if (o->device_mem) /* the GPU's memory in use (the whole device's: cudaMemGetInfo) */
        loom_metrics_reals(mx, "device_mem_used_bytes", o->all + F_DEV, w, NF);
    double share = 0;
    for (int r = 0; r < w; r++)
        if (o->all[r * NF + F_STEP] > 0) share += o->all[r * NF + F_COMM] / o->all[r * NF + F_STEP];
    loom_metrics_real(mx, "comm_exposed_share", share / w);
    loom_metrics_real(mx, "elapsed_s", loom_now() - o->t_start);
    struct rusage ru; /* this process's CPU time: on a shared machine, what it used of it */
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        loom_metrics_real(mx, "cpu_s", (double)ru.ru_utime.tv_sec + 1e-6 * ru.ru_utime.tv_usec +
                                       (double)ru.ru_stime.tv_sec + 1e-6 * ru.ru_stime.tv_usec);
    if (o->straggler >= 0) {
        loom_metrics_int(mx, "straggler_rank", o->straggler);
        loom_metrics_real(mx, "straggler_lag", o->lag);
        loom_metrics_real(mx, "straggler_lag_ms", 1e3 * o->lag_s);
    }
}

/* the endpoint's render callback (its thread, on a private copy of the snapshot) */
static void prom_render(const void *data, size_t len, loom_sbuf *b) {
    const prom_snap *s = data;
    if (len < sizeof *s || len < sizeof *s + (size_t)s->world * NF * sizeof(double)) return;
    const train_obs_row *row = &s->row;
    family(b, "loom_last_step", "gauge", "Steps completed.", (double)row->step);
    family(b, "loom_loss", "gauge", "Training loss of the last step (mean over the global "
                                    "batch).", row->loss);
    if (isfinite(s->val_loss))
        family(b, "loom_val_loss", "gauge", "Last validation loss.", s->val_loss);
    family(b, "loom_learning_rate", "gauge", "Learning rate of the last step.", row->lr);
    family(b, "loom_grad_norm", "gauge", "Global gradient norm before clipping.", row->grad_norm);
    family(b, "loom_tokens_per_second", "gauge", "Training throughput of the last step.",
           row->tokens_per_s);
    if (row->mfu >= 0)
        family(b, "loom_mfu_ratio", "gauge", "Model FLOPs utilization against the measured "
                                             "peak.", row->mfu);
    family(b, "loom_step_seconds", "gauge", "Wall time of the last step on rank 0.",
           row->step_ms * 1e-3);
    family(b, "loom_rss_bytes", "gauge", "Resident set size of rank 0.", row->rss_bytes);
    family(b, "loom_skipped_steps_total", "counter", "Steps skipped for a non-finite loss or "
                                                     "gradient norm.", (double)row->skipped_total);
    family(b, "loom_alerts_total", "counter", "Alert rules fired in this run.",
           (double)s->alerts_fired);
    double share = 0, cmax = 0, hwm = 0;
    for (int r = 0; r < s->world; r++) {
        const double *a = s->all + r * NF;
        if (a[F_STEP] > 0) share += a[F_COMM] / a[F_STEP];
        if (a[F_COMPUTE] > cmax) cmax = a[F_COMPUTE];
        if (a[F_HWM] > hwm) hwm = a[F_HWM];
    }
    family(b, "loom_comm_exposed_ratio", "gauge", "Share of the step spent waiting for "
                                                  "collectives, mean over ranks.", share / s->world);
    family(b, "loom_compute_seconds", "gauge", "Busiest rank's compute time of the last step.",
           cmax);
    family(b, "loom_rss_high_water_bytes", "gauge", "Largest resident-set high-water mark over "
                                                    "the ranks.", hwm);
    family(b, "loom_straggler_rank", "gauge", "The rank named as a straggler, -1 when none.",
           (double)s->straggler);
    family(b, "loom_straggler_lag_ratio", "gauge", "Straggler's busy time over the median "
                                                   "rank's (0 when none).", s->lag);
    per_rank(b, s, "loom_rank_step_seconds", "Wall time of the last step per rank.", F_STEP);
    per_rank(b, s, "loom_rank_compute_seconds", "Compute time of the last step per rank.",
             F_COMPUTE);
    per_rank(b, s, "loom_rank_comm_exposed_seconds", "Time blocked in collectives in the last step "
                                                  "per rank.", F_COMM);
    per_rank(b, s, "loom_rank_data_wait_seconds", "Time getting batches in the last step per rank.",
             F_DATA);
    per_rank(b, s, "loom_rank_rss_high_water_bytes", "Resident-set high-water mark per rank.",
             F_HWM);
    per_rank(b, s, "loom_rank_arena_bytes", "Parameter, gradient, optimizer and activation arenas "
                                         "per rank.", F_ARENA);
}

/* rank 0: the snapshot the endpoint formats when scraped */
static void prometheus(train_obs *o, const train_obs_row *row) {
    prom_snap *s = o->snap;
    s->row = *row;
    s->val_loss = o->val_loss;
    s->lag = o->lag;
    s->alerts_fired = o->alerts_fired;
    s->straggler = o->straggler;
    s->world = o->world;
    memcpy(s->all, o->all, (size_t)o->world * NF * sizeof *s->all);
    loom_prom_publish(o->prom, s, o->snap_bytes);
}

static int tensorboard(train_obs *o, const train_obs_row *row, loom_err *err) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const double wall = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    const struct {
        const char *tag;
        double v;
        int present;
    } v[] = {
        {"loss", row->loss, isfinite(row->loss)},
        {"lr", row->lr, 1},
        {"grad_norm", row->grad_norm, isfinite(row->grad_norm)},
        {"tokens_per_s", row->tokens_per_s, 1},
        {"mfu", row->mfu, row->mfu >= 0},
        {"step_ms", row->step_ms, 1},
        {"val_loss", row->val_loss, row->val_loss >= 0},
        {"rss_bytes", row->rss_bytes, 1},
        {"straggler_lag", o->lag, o->straggler >= 0},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i].present && loom_tb_scalar(o->tb, row->step, wall, v[i].tag, (float)v[i].v, err))
            return -1;
    double share = 0;
    for (int r = 0; r < o->world; r++)
        if (o->all[r * NF + F_STEP] > 0) share += o->all[r * NF + F_COMM] / o->all[r * NF + F_STEP];
    if (loom_tb_scalar(o->tb, row->step, wall, "comm_exposed_share", (float)(share / o->world),
                       err))
        return -1;
    /* buffered: the records reach the file every 2 s (and at the end), not a write per step */
    const double now = loom_now();
    if (now - o->tb_flushed < 2.0) return 0;
    o->tb_flushed = now;
    return loom_tb_flush(o->tb, err);
}

int train_obs_publish(train_obs *o, const train_obs_row *row, loom_err *err) {
    if (row->val_loss >= 0) o->val_loss = row->val_loss;
    double share = 0;
    for (int r = 0; r < o->world; r++)
        if (o->all[r * NF + F_STEP] > 0) share += o->all[r * NF + F_COMM] / o->all[r * NF + F_STEP];
    loom_alert_value v[10];
    int n = 0;
    v[n++] = (loom_alert_value){"loss", row->loss};
    if (row->val_loss >= 0) v[n++] = (loom_alert_value){"val_loss", row->val_loss};
    v[n++] = (loom_alert_value){"grad_norm", row->grad_norm};
    v[n++] = (loom_alert_value){"lr", row->lr};
    v[n++] = (loom_alert_value){"tokens_per_s", row->tokens_per_s};
    if (row->mfu >= 0) v[n++] = (loom_alert_value){"mfu", row->mfu};
    v[n++] = (loom_alert_value){"step_ms", row->step_ms};
    v[n++] = (loom_alert_value){"rss_bytes", row->rss_bytes};
    v[n++] = (loom_alert_value){"comm_exposed_share", share / o->world};
    if (o->straggler >= 0) v[n++] = (loom_alert_value){"straggler_lag", o->lag};
    if (loom_alerts_eval(o->alerts, row->step, v, n, &o->stop, &o->alerts_fired, err))
        return loom_err_prefix(err, "alerts");
    if (o->prom) prometheus(o, row);
    if (o->tb && tensorboard(o, row, err)) return loom_err_prefix(err, "obs.tensorboard");
    return 0;
}

int train_obs_stop_requested(const train_obs *o) { return o && o->stop; }

static int flush_profile(train_obs *o, trainer *t, loom_err *err) {
    o->flushed = 1;
    loom_comm_set_observer(t->mesh, NULL, NULL);
    loom_err mine = {{0}};
    double bad = loom_prof_write_part(t->s.run_dir, &mine) != 0;
    loom_allreduce_max(t->mesh, LOOM_GROUP_WORLD, &bad, 1, LOOM_F64); /* every part written */
    loom_prof_shutdown();
    if (bad > 0) {
        if (mine.msg[0]) return loom_errf(err, "profile: %s", mine.msg);
        return loom_errf(err, "profile: another rank could not write its trace part");
    }
    if (o->rank0 && loom_prof_merge(t->s.run_dir, o->world, err))
        return loom_err_prefix(err, "profile");
    return 0;
}

int train_obs_step_end(train_obs *o, trainer *t, loom_err *err) {
    if (!o->armed || o->flushed) return 0;
    loom_prof_step_end(o->model_flops, o->replica);
    if (loom_prof_window_done(t->step) && o->recorded) return flush_profile(o, t, err);
    return 0;
}

int train_obs_finish(train_obs *o, trainer *t, loom_err *err) {
    if (o && o->armed && !o->flushed && o->recorded) return flush_profile(o, t, err);
    return 0;
}

void train_obs_free(train_obs *o) {
    if (!o) return;
    if (o->armed) loom_prof_shutdown();
    loom_prom_stop(o->prom);
    loom_alerts_free(o->alerts);
    loom_tb_close(o->tb);
    free(o->snap);
    free(o->all);
    free(o);
}
