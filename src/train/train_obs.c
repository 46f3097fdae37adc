/* The trainer's observability: profiler window, per-rank timing and stragglers, the sinks and
 * the alert rules (docs/observability.md). trainer.c calls the train_obs_* hooks; the rest of
 * the work is in src/obs/. */
#define _GNU_SOURCE
#include "train/train_obs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/profile.h"
#include "train/trainer_internal.h"

const loom_config_key loom_obs_config_keys[] = {
    {"profile.steps", "", "profile steps \"A-B\" (1-based, inclusive) into run.dir/trace.json "
                          "(Chrome trace, a track per rank); empty = off"},
    {"obs.straggler_ratio", "1.2", "name the slowest rank when its busy time exceeds the "
                                   "median rank's by this factor for 3 logged steps"},
    {"obs.prometheus_port", "0", "serve Prometheus metrics on 127.0.0.1:PORT (rank 0); 0 = off"},
    {"obs.tensorboard", "false", "write TensorBoard event files into run.dir/tb/"},
    {"obs.default_alerts", "true", "the built-in alert rules (loss spike, throughput drop, "
                                   "straggler, memory growth), with action log"},
    {"alerts", NULL, "alert rules: a list of \"METRIC CONDITION -> ACTION\" (ACTION: log | "
                     "stop | exec: CMD)"},
};
const int loom_obs_config_nkeys = (int)(sizeof loom_obs_config_keys /
                                        sizeof loom_obs_config_keys[0]);

/* per-rank fields gathered every step */
enum { F_STEP, F_DATA, F_COMM, F_COMPUTE, F_RSS, F_HWM, F_ARENA, NF };

struct train_obs {
    int rank, world, rank0;
    int armed, flushed, recorded;
    double ratio;
    double mine[NF];
    double *all;            /* (world, NF) */
    int cand, count;        /* the straggler candidate and its consecutive slow steps */
    int straggler;          /* named: rank, or -1 */
    double lag, lag_s;      /* busy / median, busy - median (seconds) */
    double model_flops;     /* this rank's model FLOPs per step */
    int stop;
};

int train_obs_wrap_backend(const loom_config *cfg, loom_model_config *mc, loom_err *err) {
    const char *steps = loom_config_get(cfg, "profile.steps");
    if (!steps || !steps[0]) return 0;
    int64_t a, b;
    if (loom_prof_parse_steps(steps, "profile.steps", &a, &b, err)) return -1;
    mc->backend = loom_prof_backend(mc->backend ? mc->backend : loom_backend_cpu());
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
    *out = o;
    if (loom_config_get_double(t->cfg, "obs.straggler_ratio", &o->ratio, err)) return -1;
    if (!(o->ratio > 1.0))
        return loom_errf(err, "config key 'obs.straggler_ratio' (%s): %g must be > 1",
                         loom_config_origin(t->cfg, "obs.straggler_ratio"), o->ratio);
    o->model_flops = loom_model_flops_per_token(t->model, (int)t->s.T) * (double)t->local_B *
                     (double)t->s.T * (double)t->s.accum;
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

void train_obs_step_begin(train_obs *o, trainer *t) {
    t->data_wait_s = 0;
    if (o->armed && loom_prof_step_begin(t->step + 1)) o->recorded = 1;
    injected_delay(o->rank);
}

/* VmRSS and VmHWM (the high-water mark) of this process, bytes */
static void rss(double *now, double *hwm) {
    *now = *hwm = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long long kb;
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) *now = (double)kb * 1024;
        else if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) *hwm = (double)kb * 1024;
    }
    fclose(f);
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
    rss(&o->mine[F_RSS], &o->mine[F_HWM]);
    o->mine[F_ARENA] = (double)arena_bytes;
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
    double share = 0;
    for (int r = 0; r < w; r++)
        if (o->all[r * NF + F_STEP] > 0) share += o->all[r * NF + F_COMM] / o->all[r * NF + F_STEP];
    loom_metrics_real(mx, "comm_exposed_share", share / w);
    if (o->straggler >= 0) {
        loom_metrics_int(mx, "straggler_rank", o->straggler);
        loom_metrics_real(mx, "straggler_lag", o->lag);
        loom_metrics_real(mx, "straggler_lag_ms", 1e3 * o->lag_s);
    }
}

int train_obs_publish(train_obs *o, const train_obs_row *row, loom_err *err) {
    (void)o;
    (void)row;
    (void)err;
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
    loom_prof_step_end(o->model_flops);
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
    free(o->all);
    free(o);
}
