/* Peak fp32 FLOP/s of this machine: measured with the GEMM training runs (the cpu backend's
 * matmul_forward, through loom/backend.h's table: the kernels decide how it is computed) by
 * `loom peak`, or on first use when the machine is idle, and cached per machine. Nothing here
 * ever raises a cached value. Part of obs (MFU's denominator): docs/architecture.md. */
#define _GNU_SOURCE
#include "loom/peak.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/backend.h"

#define PEAK_DEFAULT_BUDGET_S 2.0
#define PEAK_MAX_REPS 50

static double (*g_probe)(int, double) = NULL;
static double (*g_load1)(void) = NULL;

void loom_peak_set_hooks(double (*probe)(int, double), double (*load1)(void)) {
    g_probe = probe;
    g_load1 = load1;
}

/* The "model name" line of /proc/cpuinfo (malloc'd), or "unknown". */
static char *cpu_model(void) {
    char *text = NULL;
    /* /proc files report size 0, so loom_read_file cannot be used; read with stdio. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return loom_strdup("unknown");
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *s = colon + 1;
        while (*s == ' ' || *s == '\t') s++;
        size_t n = strcspn(s, "\n");
        text = loom_malloc(n + 1);
        memcpy(text, s, n);
        text[n] = 0;
        break;
    }
    free(line);
    fclose(f);
    return text ? text : loom_strdup("unknown");
}

static double real_load1(void) {
    double l[1];
    return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

static int online_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int loom_machine_idle(int threads, double *load1, int *ncpu) {
    const double l = g_load1 ? g_load1() : real_load1();
    const int n = online_cpus();
    if (load1) *load1 = l;
    if (ncpu) *ncpu = n;
    /* an unknown load (-1) is not idle: the measurement could not be trusted */
    return l >= 0 && l + threads <= n + 0.5;
}

/* Seconds for one n x n x n fp32 GEMM: c (n, n) = a (n, n) @ b (n, n)^T, the linear layers'
 * op (2 n^3 FLOPs). */
static double time_sgemm(const float *a, const float *b, float *c, int n) {
    const loom_backend *be = loom_backend_cpu();
    double t0 = loom_now();
    be->matmul_forward(c, a, b, NULL, n, n, n);
    return loom_now() - t0;
}

double loom_peak_probe(int threads, double budget_s) {
    if (threads <= 0) threads = omp_get_max_threads();
    if (!(budget_s > 0)) budget_s = PEAK_DEFAULT_BUDGET_S;
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    const int nmax = 2048;
    size_t sz = (size_t)nmax * nmax;
    float *a = loom_alloc_aligned(sz * sizeof(float));
    float *b = loom_alloc_aligned(sz * sizeof(float));
    float *c = loom_alloc_aligned(sz * sizeof(float));
    for (size_t i = 0; i < sz; i++) {
        a[i] = loom_rng_uniform(1, 1, i) - 0.5f;
        b[i] = loom_rng_uniform(1, 2, i) - 0.5f;
    }
    /* warm up (thread pool, caches), then the largest size of which a few calls fit the budget */
    double t512 = time_sgemm(a, b, c, 512);
    t512 = fmin(t512, time_sgemm(a, b, c, 512));
    int n = t512 * 64 * 4 < budget_s ? 2048 : t512 * 8 * 4 < budget_s ? 1024 : 512;
    double flop = 2.0 * n * (double)n * n, best = 0, spent = 0;
    for (int rep = 0; rep < PEAK_MAX_REPS && (rep < 3 || spent < budget_s); rep++) {
        double t = time_sgemm(a, b, c, n);
        spent += t;
        if (t > 0 && flop / t > best) best = flop / t;
    }
    free(a);
    free(b);
    free(c);
    omp_set_num_threads(saved);
    return best;
}

char *loom_peak_cache_path(void) {
    const char *dir = getenv("LOOM_CACHE_DIR");
    const char *home = getenv("HOME");
    const char *fmt = "%s/peak_flops.json";
    if (!dir || !dir[0]) {
        if (!home || !home[0]) return NULL;
        dir = home;
        fmt = "%s/.cache/loom/peak_flops.json";
    }
    size_t n = strlen(dir) + 64;
    char *p = loom_malloc(n);
    snprintf(p, n, fmt, dir);
    return p;
}

/* Loads the cache object; a missing file is an empty object, a corrupt one is warned about
 * and replaced by an empty object. */
static json_t *load_cache(const char *path) {
    if (!loom_path_exists(path)) return json_object();
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        loom_warn("%s: ignoring a corrupt peak FLOP/s cache (%s)", path,
                  root ? "not a JSON object" : jerr.text);
        json_decref(root);
        return json_object();
    }
    return root;
}

static int save_cache(const char *path, json_t *root, loom_err *err) {
    char *dir = loom_strdup(path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = 0;
    int rc = slash ? loom_mkdirs(dir, err) : 0;
    free(dir);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text) rc = loom_errf(err, "%s: cannot serialize the peak FLOP/s cache", path);
    if (!rc) rc = loom_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

/* "host|cpu model|threads", malloc'd */
static char *cache_key(int threads, char *host, size_t hsize, char **cpu_out) {
    if (gethostname(host, hsize - 1) != 0) snprintf(host, hsize, "unknown");
    host[hsize - 1] = 0;
    char *cpu = cpu_model();
    size_t klen = strlen(host) + strlen(cpu) + 32;
    char *key = loom_malloc(klen);
    snprintf(key, klen, "%s|%s|%d", host, cpu, threads);
    *cpu_out = cpu;
    return key;
}

/* Fills *pk from a cache entry; 0 when the entry is not a complete current-format one (entries
 * without "idle" come from older versions, which raised the peak from training throughput). */
static int read_entry(json_t *ent, loom_peak *pk) {
    if (!json_is_object(ent)) return 0;
    json_t *f = json_object_get(ent, "flops"), *idle = json_object_get(ent, "idle");
    json_t *load = json_object_get(ent, "load1"), *ncpu = json_object_get(ent, "ncpu");
    json_t *at = json_object_get(ent, "measured_at");
    if (!json_is_number(f) || !(json_number_value(f) > 0) || !isfinite(json_number_value(f)) ||
        !json_is_boolean(idle) || !json_is_number(load) || !json_is_integer(ncpu) ||
        !json_is_integer(at))
        return 0;
    pk->flops = json_number_value(f);
    pk->idle = json_is_true(idle);
    pk->load1 = json_number_value(load);
    pk->ncpu = (int)json_integer_value(ncpu);
    pk->measured_at = (int64_t)json_integer_value(at);
    return 1;
}

static void store(json_t *root, const char *key, const loom_peak *pk, const char *host,
                  const char *cpu) {
    json_t *e = json_pack("{s:f, s:s, s:s, s:i, s:I, s:b, s:f, s:i, s:s}", "flops", pk->flops,
                          "host", host, "cpu", cpu, "threads", pk->threads, "measured_at",
                          (json_int_t)pk->measured_at, "idle", pk->idle, "load1", pk->load1,
                          "ncpu", pk->ncpu, "probe", "cblas_sgemm fp32");
    if (e) json_object_set_new(root, key, e);
}

/* $LOOM_PEAK_FLOPS: 1 and *v when set, 0 when unset, -1 (with err) when not a positive number. */
static int peak_from_env(double *v, loom_err *err) {
    const char *s = getenv("LOOM_PEAK_FLOPS");
    if (!s || !s[0]) return 0;
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    if (*end || errno || !isfinite(*v) || !(*v > 0))
        return loom_errf(err, "LOOM_PEAK_FLOPS='%s' is not a positive number of FLOP/s", s);
    return 1;
}

static void measure_into(loom_peak *pk, int threads, double budget_s) {
    memset(pk, 0, sizeof *pk);
    pk->threads = threads;
    pk->idle = loom_machine_idle(threads, &pk->load1, &pk->ncpu);
    pk->flops = g_probe ? g_probe(threads, budget_s) : loom_peak_probe(threads, budget_s);
    pk->measured_at = (int64_t)time(NULL);
    pk->source = LOOM_PEAK_MEASURED;
}

static void busy_note(loom_peak *pk) {
    snprintf(pk->note, sizeof pk->note,
             "the peak (%.1f GFLOP/s at %d threads) was measured on a busy machine (1-minute load "
             "%.2f on %d CPUs): it is likely low, so MFU reads high; run `loom peak` on an idle "
             "machine", pk->flops / 1e9, pk->threads, pk->load1, pk->ncpu);
}

/* Stores pk (a measurement) under this machine's key, unless that would replace an entry
 * measured on an idle machine by one measured on a busy machine. *stored says which. */
static int store_measured(const loom_peak *pk, int *stored, loom_peak *kept, loom_err *err) {
    *stored = 0;
    char *path = loom_peak_cache_path();
    if (!path) return loom_errf(err, "neither $LOOM_CACHE_DIR nor $HOME is set: no place for the "
                                     "peak FLOP/s cache");
    char host[256], *cpu;
    char *key = cache_key(pk->threads, host, sizeof host, &cpu);
    json_t *root = load_cache(path);
    loom_peak old;
    memset(&old, 0, sizeof old);
    const int had = read_entry(json_object_get(root, key), &old);
    int rc = 0;
    if (had && old.idle && !pk->idle) {
        if (kept) *kept = old;
    } else {
        store(root, key, pk, host, cpu);
        rc = save_cache(path, root, err);
        *stored = rc == 0;
    }
    json_decref(root);
    free(path);
    free(key);
    free(cpu);
    return rc;
}

void loom_peak_measure_now(int threads, double budget_s, loom_peak *out) {
    if (threads <= 0) threads = omp_get_max_threads();
    measure_into(out, threads, budget_s);
    if (!out->idle) busy_note(out);
}

int loom_peak_store(const loom_peak *pk, int *stored, loom_err *err) {
    return store_measured(pk, stored, NULL, err);
}

int loom_peak_get(int threads, int may_measure, loom_peak *out, loom_err *err) {
    if (threads <= 0) threads = omp_get_max_threads();
    memset(out, 0, sizeof *out);
    out->threads = threads;
    double v;
    int env = peak_from_env(&v, err);
    if (env < 0) return -1;
    if (env) {
        out->flops = v;
        out->source = LOOM_PEAK_ENV;
        return 0;
    }
    char host[256], *cpu;
    char *key = cache_key(threads, host, sizeof host, &cpu);
    char *path = loom_peak_cache_path();
    json_t *root = path ? load_cache(path) : NULL;
    json_t *ent = root ? json_object_get(root, key) : NULL;
    loom_peak cached;
    memset(&cached, 0, sizeof cached);
    const int have = read_entry(ent, &cached);
    if (ent && !have) loom_warn("%s: ignoring the entry for '%s' (an older or damaged one)", path, key);
    double load1;
    int ncpu;
    const int idle_now = loom_machine_idle(threads, &load1, &ncpu);
    /* measure when nothing usable is cached, or when only a busy machine's figure is and this
     * one is idle now (it replaces it) */
    if (may_measure && (!have || (!cached.idle && idle_now))) {
        loom_log("measuring the peak fp32 GEMM FLOP/s of this machine at %d threads for MFU (%s; "
                 "about %.0f s, once: it is cached)", threads,
                 have ? "the cached figure was measured on a busy machine" : "none is cached",
                 PEAK_DEFAULT_BUDGET_S);
        measure_into(out, threads, 0);
        loom_log("measured the peak fp32 GEMM FLOP/s of this machine at %d threads: %.1f "
                 "GFLOP/s (1-minute load %.2f on %d CPUs%s)", threads, out->flops / 1e9,
                 out->load1, out->ncpu, out->idle ? "" : ": busy");
        if (!out->idle) busy_note(out);
        if (root) { /* replaces nothing measured on an idle machine (see the condition) */
            loom_err werr;
            store(root, key, out, host, cpu);
            if (save_cache(path, root, &werr)) loom_warn("peak FLOP/s cache not written: %s", werr.msg);
        }
    } else if (have) {
        *out = cached;
        out->threads = threads;
        out->source = LOOM_PEAK_CACHE;
        if (!out->idle) busy_note(out);
    } else {
        out->source = LOOM_PEAK_NONE;
        out->load1 = load1;
        out->ncpu = ncpu;
        snprintf(out->note, sizeof out->note,
                 "no peak FLOP/s is cached for this machine at %d threads: run `loom peak "
                 "--threads %d` on an idle machine, or set training.peak_flops", threads, threads);
    }
    json_decref(root);
    free(path);
    free(key);
    free(cpu);
    return 0;
}

int loom_peak_measure(int threads, double budget_s, loom_peak *out, int *stored, loom_err *err) {
    if (threads <= 0) threads = omp_get_max_threads();
    *stored = 0;
    double v;
    int env = peak_from_env(&v, err);
    if (env < 0) return -1;
    if (env)
        return loom_errf(err, "LOOM_PEAK_FLOPS=%s is set: loom uses it as the peak and measures "
                              "nothing (unset it to measure this machine)", getenv("LOOM_PEAK_FLOPS"));
    char *path = loom_peak_cache_path();
    if (!path) return loom_errf(err, "neither $LOOM_CACHE_DIR nor $HOME is set: no place for the "
                                     "peak FLOP/s cache");
    free(path);
    measure_into(out, threads, budget_s);
    if (!out->idle) busy_note(out);
    loom_peak old;
    memset(&old, 0, sizeof old);
    const int rc = store_measured(out, stored, &old, err);
    if (rc == 0 && !*stored)
        snprintf(out->note, sizeof out->note,
                 "the machine is busy (1-minute load %.2f on %d CPUs): %.1f GFLOP/s not stored; "
                 "the cache keeps %.1f GFLOP/s, measured on an idle machine", out->load1,
                 out->ncpu, out->flops / 1e9, old.flops / 1e9);
    return rc;
}
