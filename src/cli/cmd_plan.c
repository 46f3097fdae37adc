/* loom plan CONFIG.yaml [--cluster FILE | --gpu NAME] [--gpus N] ...: every valid layout's
 * per-rank memory and step time, ranked, the best explained and written as keys to paste;
 * loom plan --check RUN_DIR: the prediction for a run's layout beside what it measured.
 * docs/plan.md. */
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "loom/backend.h"
#include "loom/config.h"
#include "loom/cp.h"
#include "loom/load.h"
#include "loom/model_config.h"
#include "loom/peak.h"
#include "loom/plan.h"
#include "loom/pp.h"

static int usage(void) {
    fprintf(stderr,
            "usage: loom plan CONFIG.yaml [--cluster FILE | --gpu NAME] [--gpus N] [--set k=v ...]\n"
            "                 [--precision fp32|bf16] [--efficiency E] [--top K] [--only] [--json]\n"
            "       loom plan --check RUN_DIR [--cluster FILE | --gpu NAME] [--json]\n"
            "  ranks every valid layout of N devices (default: the config's own degrees' product)\n"
            "  by tokens/s among those whose largest rank fits; --only: the config's layout alone.\n"
            "  --cluster: a hardware file (data/hardware/*.yaml); --gpu: one by name (h100, h200,\n"
            "  b200, a100, cpu: this machine, the default). docs/plan.md\n");
    return 2;
}

static const char *human(double b, char *buf, size_t size) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (b >= 1024 && u < 5) b /= 1024, u++;
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", b, units[u]);
    return buf;
}

static const char *rc_name(int r) {
    return r == LOOM_RECOMPUTE_FULL ? "full" : r == LOOM_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

/* a positive integer / real argument, or -1 after a message */
static double num_arg(const char *opt, const char *s, double lo, double hi) {
    char *end;
    const double v = strtod(s, &end);
    if (!*s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "loom plan: %s '%s': expected a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    return v;
}

/* Fills in "measured" figures of a hardware file: the peak of this machine (`loom peak`'s
 * cached figure, measured now when there is none) at `threads` per rank, or the one a run used
 * (run_peak > 0); the node's physical memory. */
static int fill_measured(loom_plan_hw *hw, int threads, double run_peak, loom_err *err) {
    if (hw->peak_measured) {
        if (run_peak > 0) {
            hw->peak_fp32 = run_peak;
        } else {
            loom_peak pk;
            if (loom_peak_get(threads, 1, &pk, err)) return -1;
            if (!(pk.flops > 0))
                return loom_errf(err, "hardware %s: peak_fp32 is measured but no peak is known "
                                      "(%s)", hw->name, pk.note);
            hw->peak_fp32 = pk.flops;
        }
        /* training.precision bf16 on this CPU: its GEMMs widen to the fp32 units, at the fp32
         * peak, unless they run oneDNN's bf16 matmul (AMX), whose peak the probe does not
         * measure (a hardware file's peak_bf16 says it) */
        if (!(hw->peak_bf16 > 0) && !loom_backend_cpu()->bf16_matmul_native())
            hw->peak_bf16 = hw->peak_fp32;
        hw->peak_measured = 0;
    }
    if (hw->mem_measured) {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        hw->mem_bytes = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
        hw->mem_measured = 0;
    }
    return 0;
}

static void layout_name(const loom_plan_layout *L, char *buf, size_t size) {
    snprintf(buf, size, "dp%d tp%d pp%d cp%d ep%d z%d%s%s%s m%lld %s", L->dp, L->tp, L->pp, L->cp,
             L->ep, L->zero, L->sp ? " sp" : "",
             L->pp > 1 ? (L->pp_schedule == LOOM_PP_GPIPE ? " gpipe" : " 1f1b") : "",
             L->cp > 1 ? (L->cp_kind == LOOM_CPKIND_RING ? " ring" : " ulysses") : "",
             (long long)(L->microbatches > 0 ? L->microbatches : L->pp), rc_name(L->recompute));
}

static void print_keys(FILE *f, const loom_plan_layout *L) {
    fprintf(f, "parallel:\n  dp: %d\n  tp: %d\n  pp: %d\n  cp: %d\n  ep: %d\n  zero: %d\n", L->dp,
            L->tp, L->pp, L->cp, L->ep, L->zero);
    if (L->tp > 1) fprintf(f, "  sp: %s\n", L->sp ? "true" : "false");
    if (L->pp > 1)
        fprintf(f, "  pp_schedule: %s\n  microbatches: %lld\n", loom_pp_schedule_name(L->pp_schedule),
                (long long)(L->microbatches > 0 ? L->microbatches : L->pp));
    if (L->cp > 1) fprintf(f, "  cp_kind: %s\n", loom_cp_kind_name(L->cp_kind));
    fprintf(f, "training:\n  batch_size: %lld\n  seq_len: %lld\n  grad_accum: %lld\n",
            (long long)L->B, (long long)L->T, (long long)L->accum);
    fprintf(f, "model:\n  recompute: %s\n", rc_name(L->recompute));
}

static void explain(const loom_plan_entry *e, const loom_plan_hw *hw, int world,
                    const loom_model_config *mc) {
    const loom_plan_time *t = &e->time;
    const loom_plan_memory *m = &e->mem;
    char a[32], b[32], c[32], d[32], g[32], h[32], k[32], l[32];
    printf("\nbest: %.0f tokens/s (%.0f per device), step %.1f ms, MFU %.1f%% at %.0f%% "
           "efficiency of %.3g FLOP/s per device\n", t->tokens_per_s, t->tokens_per_s / world,
           1e3 * t->step, 100 * t->mfu, 100 * hw->efficiency, hw->peak_flops);
    printf("  time:   compute %.1f ms (%.3g FLOPs on the busiest rank), pipeline bubble %.1f ms, "
           "data-parallel %.1f ms exposed of %.1f ms (%s), tensor-parallel %.1f ms%s, context "
           "%.1f ms%s, expert %.1f ms%s, pipeline p2p %.1f ms%s\n",
           1e3 * t->compute, t->flops_rank, 1e3 * t->bubble, 1e3 * t->dp_exposed,
           1e3 * t->dp_comm, t->dp_inter ? "across nodes" : "inside a node", 1e3 * t->tp_comm,
           t->tp_inter ? " (across nodes)" : "", 1e3 * t->cp_comm,
           t->cp_inter ? " (across nodes)" : "", 1e3 * t->ep_comm,
           t->ep_inter ? " (across nodes)" : "", 1e3 * t->pp_comm,
           t->pp_inter ? " (across nodes)" : "");
    printf("  memory: largest rank (stage %d) %s: parameters %s, gradients %s, AdamW moments %s, "
           "activations %s (%lld arena%s of %lld x %lld), other %s; needs %s of %s%s\n",
           m->stage, human(m->total, a, sizeof a), human(m->param, b, sizeof b),
           human(m->grad, c, sizeof c), human(m->optim, d, sizeof d), human(m->act, g, sizeof g),
           (long long)m->arenas, m->arenas == 1 ? "" : "s", (long long)m->rows,
           (long long)m->local_T, human(m->act_rows + m->rope + m->batch + m->comm, h, sizeof h),
           human(e->need, k, sizeof k), human(hw->mem_bytes, l, sizeof l),
           hw->shared_memory ? " (the node's ranks together)" : " per device");
    double kv = 0;
    loom_err kerr;
    if (mc->head == LOOM_HEAD_LM && loom_plan_kv_bytes(mc, e->layout.tp, e->layout.bf16, &kv, &kerr) == 0)
        printf("  inference: the KV cache of one %d-position sequence is %s per rank at tp %d\n",
               mc->max_seq_len, human(kv, a, sizeof a), e->layout.tp);
    printf("\nkeys to paste:\n");
    print_keys(stdout, &e->layout);
}

static json_t *entry_json(const loom_plan_entry *e, int world) {
    const loom_plan_layout *L = &e->layout;
    const loom_plan_memory *m = &e->mem;
    const loom_plan_time *t = &e->time;
    return json_pack(
        "{s:i,s:i,s:i,s:i,s:i,s:i,s:b,s:s,s:s,s:I,s:s,s:b,"
        "s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,"
        "s:{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:i},s:f,s:b}",
        "dp", L->dp, "tp", L->tp, "pp", L->pp, "cp", L->cp, "ep", L->ep, "zero", L->zero, "sp",
        L->sp, "pp_schedule", loom_pp_schedule_name(L->pp_schedule), "cp_kind",
        loom_cp_kind_name(L->cp_kind), "microbatches",
        (json_int_t)(L->microbatches > 0 ? L->microbatches : L->pp), "recompute",
        rc_name(L->recompute), "bf16", L->bf16,
        "tokens_per_s", t->tokens_per_s, "tokens_per_s_per_device", t->tokens_per_s / world,
        "step_s", t->step, "compute_s", t->compute, "bubble_s", t->bubble, "dp_comm_s",
        t->dp_comm, "dp_exposed_s", t->dp_exposed, "tp_comm_s", t->tp_comm, "cp_comm_s",
        t->cp_comm, "ep_comm_s", t->ep_comm, "pp_comm_s", t->pp_comm, "mfu", t->mfu,
        "memory", "param", m->param, "grad", m->grad, "optim", m->optim, "act", m->act,
        "act_rows", m->act_rows, "rope", m->rope, "batch", m->batch, "comm", m->comm, "total",
        m->total, "arenas", (json_int_t)m->arenas, "stage", m->stage, "need", e->need, "fits",
        e->fits);
}

/* the hardware of --cluster / --gpu (default: cpu) */
static int load_hw(const char *cluster, const char *gpu, loom_plan_hw *hw, loom_err *err) {
    char path[4200];
    if (cluster) snprintf(path, sizeof path, "%s", cluster);
    else if (loom_plan_hw_find(gpu ? gpu : "cpu", path, sizeof path, err)) return -1;
    return loom_plan_hw_load(path, hw, err);
}

static int load_config(const char *path, char **sets, int n_sets, loom_config **out,
                       loom_model_config *mc, loom_err *err) {
    loom_config *c = loom_config_new();
    *out = c;
    if (loom_config_load_yaml(c, path, err)) return -1;
    for (int i = 0; i < n_sets; i++)
        if (loom_config_set_arg(c, sets[i], err)) return -1;
    int n;
    const loom_config_key *keys = loom_train_schema(&n);
    if (loom_config_apply_schema(c, keys, n, err)) return -1;
    int64_t T = 0;
    if (loom_config_get_int(c, "training.seq_len", &T, err)) return -1;
    if (T < 1 || T > (1 << 24))
        return loom_errf(err, "config key 'training.seq_len' = %lld: out of range", (long long)T);
    if (loom_model_config_from(c, (int)T, mc, err)) return -1;
    if (T > mc->max_seq_len)
        return loom_errf(err, "config: training.seq_len %lld exceeds model.max_seq_len %d",
                         (long long)T, mc->max_seq_len);
    return 0;
}

/* ---- --check RUN_DIR ---------------------------------------------------------------------- */

static double median(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: a run's steps */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            const double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double arr_at(json_t *o, const char *key, int i) {
    json_t *a = json_object_get(o, key);
    if (json_is_array(a)) return json_number_value(json_array_get(a, (size_t)i));
    return i == 0 ? json_number_value(a) : 0;
}

static double arr_max(json_t *o, const char *key) {
    json_t *a = json_object_get(o, key);
    double m = 0;
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++)
        m = fmax(m, json_number_value(json_array_get(a, i)));
    return json_is_array(a) ? m : json_number_value(a);
}

static int check_run(const char *dir, const char *cluster, const char *gpu, int json,
                     loom_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    loom_config *c = NULL;
    loom_model_config mc;
    int rc = -1;
    json_t **rows = NULL;
    int n_rows = 0, cap = 0;
    double *steps = NULL;
    if (load_config(path, NULL, 0, &c, &mc, err)) goto done;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "re");
    if (!f) {
        loom_errf(err, "%s: cannot open (a run directory of `loom train`?)", path);
        goto done;
    }
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)len, 0, &je);
        if (!o || !json_object_get(o, "step")) { /* not a step row */
            json_decref(o);
            continue;
        }
        if (n_rows == cap) {
            cap = cap ? 2 * cap : 64;
            rows = loom_realloc(rows, (size_t)cap * sizeof *rows);
        }
        rows[n_rows++] = o;
    }
    free(line);
    fclose(f);
    if (!n_rows) {
        loom_errf(err, "%s: no step rows", path);
        goto done;
    }
    json_t *last = rows[n_rows - 1];
    json_t *arena = json_object_get(last, "arena_bytes");
    const int world = json_is_array(arena) ? (int)json_array_size(arena) : 1;
    loom_plan_layout L;
    if (loom_plan_layout_from_config(c, &mc, world, &L, err) || loom_plan_check(&mc, &L, err))
        goto done;
    if ((int64_t)L.dp * L.tp * L.pp * L.cp != world) {
        loom_errf(err, "%s: %d ranks measured, the config's layout has %lld", dir, world,
                  (long long)L.dp * L.tp * L.pp * L.cp);
        goto done;
    }
    loom_plan_hw hw;
    const double run_peak = json_number_value(json_object_get(last, "peak_flops")) / world;
    int64_t threads = 0;
    loom_config_get_int(c, "training.threads", &threads, err);
    if (load_hw(cluster, gpu, &hw, err) ||
        fill_measured(&hw, threads > 0 ? (int)threads : omp_get_max_threads(), run_peak, err))
        goto done;
    hw.peak_flops = L.bf16 ? hw.peak_bf16 : hw.peak_fp32;
    loom_plan_time pt;
    if (loom_plan_step_time(&mc, &L, &hw, &pt, err)) goto done;
    /* the measured step: the median over the steps after the first (which pays the first
     * touches of every arena), the slowest rank's each step */
    steps = loom_calloc(2 * (size_t)n_rows, sizeof *steps);
    double *cpus = steps + n_rows; /* rank 0's CPU seconds per step (cpu_s: the process's) */
    double comm = 0, compute = 0, exposed = 0;
    int ns = 0, nc = 0;
    for (int i = n_rows > 1 ? 1 : 0; i < n_rows; i++) {
        const double s = arr_max(rows[i], "step_s");
        if (s > 0) steps[ns++] = s;
        const double c0 = json_number_value(json_object_get(rows[i - (i > 0)], "cpu_s")),
                     c1 = json_number_value(json_object_get(rows[i], "cpu_s"));
        if (i > 0 && c1 > c0) cpus[nc++] = c1 - c0;
        comm += arr_max(rows[i], "comm_s");
        exposed += arr_max(rows[i], "comm_exposed_s");
        compute += arr_max(rows[i], "compute_s");
    }
    const int counted = n_rows > 1 ? n_rows - 1 : 1;
    comm /= counted;
    compute /= counted;
    exposed /= counted;
    const double step = median(steps, ns), cpu_step = median(cpus, nc); /* (sorts cpus) */
    const double cpu_best = nc ? cpus[0] : 0;
    const double pred_comm = pt.dp_comm + pt.tp_comm + pt.cp_comm + pt.ep_comm + pt.pp_comm;
    const double pred_exposed = pt.dp_exposed + pt.tp_comm + pt.cp_comm + pt.ep_comm + pt.pp_comm;
    json_t *ranks = json_array();
    double worst = 0;
    char name[160];
    layout_name(&L, name, sizeof name);
    if (!json)
        printf("run %s: %s, %d rank%s, %s\n  rank  arena predicted   measured   error   total "
               "predicted  peak RSS\n", dir, name, world, world == 1 ? "" : "s", hw.name);
    const int pipe = L.pp > 1 || (L.microbatches > 0 ? L.microbatches : L.pp) > 1;
    for (int r = 0; r < world; r++) {
        loom_plan_memory m;
        if (loom_plan_rank_memory(&mc, &L, r, &m, err)) goto done;
        /* the engine's arenas: arena_bytes (parameters, gradients, moments, the model's own
         * activation arena) and, with a pipeline, its micro-batches' arenas */
        const double meas = arr_at(last, "arena_bytes", r) +
                            (pipe ? arr_at(last, "pp_act_bytes", r) : 0.0);
        const double e = meas > 0 ? (m.arena - meas) / meas : 1.0;
        worst = fmax(worst, fabs(e));
        const double rss = arr_at(last, "rss_hwm_bytes", r);
        json_array_append_new(ranks, json_pack("{s:i,s:f,s:f,s:f,s:f,s:f}", "rank", r,
                                               "arena_predicted", m.arena, "arena_measured", meas,
                                               "error", e, "total_predicted", m.total,
                                               "rss_hwm", rss));
        if (!json) {
            char a[32], b[32], t[32], s[32];
            printf("  %4d %15s %10s %+6.2f%% %15s %9s\n", r, human(m.arena, a, sizeof a),
                   human(meas, b, sizeof b), 100 * e, human(m.total, t, sizeof t),
                   human(rss, s, sizeof s));
        }
    }
    const double terr = step > 0 ? (pt.step - step) / step : 1.0;
    const double cerr = cpu_step > 0 ? (pt.step - cpu_step) / cpu_step : 1.0;
    const double berr = cpu_best > 0 ? (pt.step - cpu_best) / cpu_best : 1.0;
    if (json) {
        json_t *o = json_pack("{s:s,s:s,s:i,s:o,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,"
                              "s:f,s:f,s:f,s:f}",
                              "run", dir, "layout", name, "world", world, "ranks", ranks,
                              "memory_worst_error", worst, "step_predicted", pt.step,
                              "step_measured", step, "step_error", terr, "cpu_step_measured",
                              cpu_step, "cpu_step_error", cerr, "cpu_step_best", cpu_best,
                              "cpu_step_best_error", berr, "flops_rank", pt.flops_rank,
                              "compute_predicted", pt.compute,
                              "compute_measured", compute, "comm_predicted", pred_comm,
                              "comm_measured", comm, "comm_exposed_predicted", pred_exposed,
                              "comm_exposed_measured", exposed, "peak_flops", hw.peak_flops);
        ranks = NULL;
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!s) { /* a number JSON cannot hold (not finite) */
            loom_errf(err, "%s: the comparison could not be written as JSON", dir);
            goto done;
        }
        printf("%s\n", s);
        free(s);
    } else {
        printf("  memory: largest error %.2f%%\n  step: predicted %.1f ms, measured %.1f ms "
               "(median of %d steps after the first, slowest rank): %+.1f%%; rank 0's CPU time "
               "%.1f ms per step: %+.1f%% (its best step %.1f ms: %+.1f%%)\n  compute: "
               "predicted %.1f ms (%.3g FLOP/s x %.2f), measured %.1f ms; communication: "
               "predicted %.1f ms, measured %.1f ms in collectives (start to completion); waited for: "
               "predicted %.1f ms, measured %.1f ms (the slowest rank)\n",
               100 * worst, 1e3 * pt.step, 1e3 * step, ns, 100 * terr, 1e3 * cpu_step,
               100 * cerr, 1e3 * cpu_best, 100 * berr, 1e3 * pt.compute,
               hw.peak_flops, hw.efficiency, 1e3 * compute, 1e3 * pred_comm, 1e3 * comm,
               1e3 * pred_exposed, 1e3 * exposed);
    }
    json_decref(ranks);
    rc = 0;
done:
    for (int i = 0; i < n_rows; i++) json_decref(rows[i]);
    free(rows);
    free(steps);
    loom_config_free(c);
    return rc;
}

/* ---- the search ------------------------------------------------------------------------------ */

int loom_cli_plan(int argc, char **argv) {
    const char *config = NULL, *cluster = NULL, *gpu = NULL, *check = NULL, *prec = NULL;
    int json = 0, only = 0, top = 10;
    double gpus = 0, eff = 0;
    char **sets = loom_calloc((size_t)argc, sizeof *sets);
    int n_sets = 0, rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--only")) only = 1;
        else if (!strcmp(a, "--cluster") && more) cluster = argv[++i];
        else if (!strcmp(a, "--gpu") && more) gpu = argv[++i];
        else if (!strcmp(a, "--check") && more) check = argv[++i];
        else if (!strcmp(a, "--set") && more) sets[n_sets++] = argv[++i];
        else if (!strcmp(a, "--precision") && more) prec = argv[++i];
        else if (!strcmp(a, "--gpus") && more) {
            if ((gpus = num_arg(a, argv[++i], 1, 1 << 20)) < 0 || gpus != floor(gpus)) goto out;
        } else if (!strcmp(a, "--top") && more) {
            double v = num_arg(a, argv[++i], 1, 1e6);
            if (v < 0) goto out;
            top = (int)v;
        } else if (!strcmp(a, "--efficiency") && more) {
            if ((eff = num_arg(a, argv[++i], 1e-3, 1)) < 0) goto out;
        } else if (a[0] != '-' && !config) config = a;
        else {
            rc = usage();
            goto out;
        }
    }
    if (cluster && gpu) {
        fprintf(stderr, "loom plan: --cluster and --gpu name the hardware twice: give one\n");
        goto out;
    }
    if (prec && strcmp(prec, "fp32") != 0 && strcmp(prec, "bf16") != 0) {
        fprintf(stderr, "loom plan: --precision '%s': expected fp32 or bf16\n", prec);
        goto out;
    }
    loom_err err = {{0}};
    rc = 1;
    if (check) {
        if (config) {
            rc = usage();
            goto out;
        }
        if (check_run(check, cluster, gpu, json, &err)) fprintf(stderr, "loom: error: %s\n", err.msg);
        else rc = 0;
        goto out;
    }
    if (!config) {
        rc = usage();
        goto out;
    }
    loom_config *c = NULL;
    loom_model_config mc;
    loom_plan_hw hw;
    loom_plan_entry *v = NULL;
    int n = 0;
    if (load_config(config, sets, n_sets, &c, &mc, &err) || load_hw(cluster, gpu, &hw, &err))
        goto fail;
    int64_t threads = 0;
    if (loom_config_get_int(c, "training.threads", &threads, &err)) goto fail;
    if (fill_measured(&hw, threads > 0 ? (int)threads : omp_get_max_threads(), 0, &err)) goto fail;
    if (eff > 0) hw.efficiency = eff;
    loom_plan_layout base;
    if (loom_plan_layout_from_config(c, &mc, 0, &base, &err)) goto fail;
    if (prec) base.bf16 = !strcmp(prec, "bf16");
    hw.peak_flops = base.bf16 ? hw.peak_bf16 : hw.peak_fp32;
    if (!(hw.peak_flops > 0)) {
        loom_errf(&err, "hardware %s has no %s peak (peak_%s)", hw.name,
                  base.bf16 ? "bf16" : "fp32", base.bf16 ? "bf16" : "fp32");
        goto fail;
    }
    const int world = gpus > 0 ? (int)gpus
                      : hw.nodes > 0 ? hw.nodes * hw.per_node
                                     : base.dp * base.tp * base.pp * base.cp;
    if (only) {
        if (base.dp * base.tp * base.pp * base.cp != world) {
            /* the config's degrees with dp filled in (parallel.dp = auto) */
            const int inner = base.tp * base.pp * base.cp;
            const char *dpv = loom_config_get(c, "parallel.dp");
            if (dpv && strcmp(dpv, "auto") != 0) {
                loom_errf(&err, "--only: parallel.dp * tp * pp * cp = %d ranks (%s), not the "
                                "%d devices of --gpus (set parallel.dp=auto to fill it in)",
                          base.dp * inner, loom_config_origin(c, "parallel.dp"), world);
                goto fail;
            }
            if (world % inner) {
                loom_errf(&err, "--only: parallel.tp * pp * cp = %d does not divide %d devices",
                          inner, world);
                goto fail;
            }
            base.dp = world / inner;
        }
        v = loom_calloc(1, sizeof *v);
        v->layout = base;
        if (loom_plan_check(&mc, &base, &err) || loom_plan_max_memory(&mc, &base, &v->mem, &err) ||
            loom_plan_step_time(&mc, &base, &hw, &v->time, &err))
            goto fail;
        v->fits = loom_plan_fits(&hw, &base, &v->mem, &v->need);
        n = 1;
    } else if (loom_plan_search(&mc, &base, world, &hw, &v, &n, &err)) {
        goto fail;
    }
    int fitting = 0;
    for (int i = 0; i < n; i++) fitting += v[i].fits;
    if (json) {
        json_t *arr = json_array();
        for (int i = 0; i < n && i < top; i++) json_array_append_new(arr, entry_json(&v[i], world));
        json_t *o = json_pack("{s:s,s:s,s:i,s:f,s:f,s:f,s:i,s:i,s:s,s:o}", "config", config,
                              "hardware", hw.name, "devices", world, "peak_flops", hw.peak_flops,
                              "efficiency", hw.efficiency, "mem_bytes", hw.mem_bytes, "layouts", n,
                              "fitting", fitting, "precision", base.bf16 ? "bf16" : "fp32",
                              "ranked", arr);
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!s) { /* a number JSON cannot hold (not finite) */
            loom_errf(&err, "the plan could not be written as JSON");
            goto fail;
        }
        printf("%s\n", s);
        free(s);
    } else {
        char mem[32];
        printf("loom plan %s on %d x %s (%s each%s; peak %.3g FLOP/s %s, efficiency %.2f): %d "
               "valid layout%s, %d fit%s\n", config, world, hw.name,
               human(hw.mem_bytes, mem, sizeof mem), hw.shared_memory ? ", a node's shared" : "",
               hw.peak_flops, base.bf16 ? "bf16" : "fp32", hw.efficiency, n, n == 1 ? "" : "s",
               fitting, fitting == 1 ? "s" : "");
        printf("%4s  %-44s %12s %10s %9s %6s %10s %10s %10s %10s %10s  %s\n", "rank", "layout",
               "tokens/s", "per dev", "step ms", "MFU", "params", "grads", "moments", "acts",
               "rank total", "fits");
        for (int i = 0; i < n && i < top; i++) {
            char name[160], a[32], b[32], cc[32], d[32], e[32];
            layout_name(&v[i].layout, name, sizeof name);
            printf("%4d  %-44s %12.0f %10.1f %9.1f %5.1f%% %10s %10s %10s %10s %10s  %s\n", i + 1,
                   name, v[i].time.tokens_per_s, v[i].time.tokens_per_s / world,
                   1e3 * v[i].time.step, 100 * v[i].time.mfu, human(v[i].mem.param, a, sizeof a),
                   human(v[i].mem.grad, b, sizeof b), human(v[i].mem.optim, cc, sizeof cc),
                   human(v[i].mem.act, d, sizeof d), human(v[i].mem.total, e, sizeof e),
                   v[i].fits ? "yes" : "NO");
        }
        if (fitting) explain(&v[0], &hw, world, &mc);
        else {
            char need[32];
            printf("\nno layout fits: the smallest needs %s per %s, %s is there\n",
                   human(v[0].need, need, sizeof need), hw.shared_memory ? "node" : "device",
                   human(hw.mem_bytes, mem, sizeof mem));
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "loom: error: %s\n", err.msg);
done:
    free(v);
    loom_config_free(c);
out:
    free(sets);
    return rc;
}
