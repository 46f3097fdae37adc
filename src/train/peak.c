/* Peak fp32 FLOP/s of this machine, measured with cblas_sgemm and cached per machine. */
#define _GNU_SOURCE
#include "loom/peak.h"

#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PEAK_BUDGET_S 0.5
#define PEAK_MAX_REPS 20

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

/* Seconds for one n x n x n sgemm. */
static double time_sgemm(const float *a, const float *b, float *c, int n) {
    double t0 = loom_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    return loom_now() - t0;
}

static double measure(int threads) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    const int nmax = 1024;
    size_t sz = (size_t)nmax * nmax;
    float *a = loom_alloc_aligned(sz * sizeof(float));
    float *b = loom_alloc_aligned(sz * sizeof(float));
    float *c = loom_alloc_aligned(sz * sizeof(float));
    for (size_t i = 0; i < sz; i++) {
        a[i] = loom_rng_uniform(1, 1, i) - 0.5f;
        b[i] = loom_rng_uniform(1, 2, i) - 0.5f;
    }
    /* warm up (thread pool, caches); a slow machine stays at 512 to keep the budget */
    double t512 = time_sgemm(a, b, c, 512);
    int n = t512 < 0.03 ? 1024 : 512;
    double flop = 2.0 * n * (double)n * n, best = 0, spent = 0;
    for (int rep = 0; rep < PEAK_MAX_REPS && (rep < 3 || spent < PEAK_BUDGET_S); rep++) {
        double t = time_sgemm(a, b, c, n);
        spent += t;
        if (t > 0 && flop / t > best) best = flop / t;
    }
    free(a);
    free(b);
    free(c);
    omp_set_num_threads(saved);
    return best > 0 ? best : 1e9;
}

/* The cache file path (malloc'd), or NULL when neither $LOOM_CACHE_DIR nor $HOME is set. */
static char *cache_path(void) {
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
        loom_warn("%s: ignoring a corrupt peak FLOP/s cache (%s); measuring again", path,
                  root ? "not a JSON object" : jerr.text);
        json_decref(root);
        return json_object();
    }
    return root;
}

static void save_cache(const char *path, json_t *root) {
    loom_err err;
    char *dir = loom_strdup(path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = 0;
    int rc = slash ? loom_mkdirs(dir, &err) : 0;
    free(dir);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!rc && text) rc = loom_write_file_atomic(path, text, strlen(text), &err);
    if (rc) loom_warn("peak FLOP/s cache not written: %s", err.msg);
    free(text);
}

/* "host|cpu model|threads", malloc'd */
static char *cache_key(int threads, char *host, size_t hsize, char **cpu_out) {
    snprintf(host, hsize, "unknown");
    if (gethostname(host, hsize - 1) != 0) snprintf(host, hsize, "unknown");
    host[hsize - 1] = 0;
    char *cpu = cpu_model();
    size_t klen = strlen(host) + strlen(cpu) + 32;
    char *key = loom_malloc(klen);
    snprintf(key, klen, "%s|%s|%d", host, cpu, threads);
    *cpu_out = cpu;
    return key;
}

static void store(json_t *root, const char *key, double flops, const char *host, const char *cpu,
                  int threads) {
    json_t *e = json_pack("{s:f, s:s, s:s, s:i, s:I}", "flops", flops, "host", host, "cpu", cpu,
                          "threads", threads, "measured_at", (json_int_t)time(NULL));
    if (e) json_object_set_new(root, key, e);
}

double loom_peak_flops(int threads) {
    if (threads <= 0) threads = omp_get_max_threads();
    const char *over = getenv("LOOM_PEAK_FLOPS");
    if (over && over[0]) {
        char *end;
        errno = 0;
        double v = strtod(over, &end);
        if (!*end && errno == 0 && isfinite(v) && v > 0) return v;
        loom_warn("LOOM_PEAK_FLOPS='%s' is not a positive number; ignoring it", over);
    }
    char host[256], *cpu;
    char *key = cache_key(threads, host, sizeof host, &cpu);
    char *path = cache_path();
    json_t *root = path ? load_cache(path) : NULL;
    double flops = 0;
    json_t *ent = root ? json_object_get(root, key) : NULL;
    json_t *val = json_is_object(ent) ? json_object_get(ent, "flops") : NULL;
    if (json_is_number(val) && json_number_value(val) > 0 && isfinite(json_number_value(val))) {
        flops = json_number_value(val);
    } else {
        if (ent) loom_warn("%s: bad entry for '%s'; measuring again", path, key);
        flops = measure(threads);
        if (root) {
            store(root, key, flops, host, cpu, threads);
            save_cache(path, root);
        }
    }
    json_decref(root);
    free(path);
    free(key);
    free(cpu);
    return flops;
}

double loom_peak_flops_raise(int threads, double observed) {
    if (threads <= 0) threads = omp_get_max_threads();
    if (!(observed > 0) || !isfinite(observed)) return loom_peak_flops(threads);
    const double cached = loom_peak_flops(threads);
    if (observed <= cached) return cached;
    char host[256], *cpu;
    char *key = cache_key(threads, host, sizeof host, &cpu);
    char *path = cache_path();
    json_t *root = path ? load_cache(path) : NULL;
    if (root) {
        store(root, key, observed, host, cpu, threads);
        save_cache(path, root);
        loom_warn("%s: the peak FLOP/s cached for %d threads (%.1f GFLOP/s) was below what "
                  "training achieved (%.1f GFLOP/s; it was measured on a busy machine): raised",
                  path, threads, cached / 1e9, observed / 1e9);
    }
    json_decref(root);
    free(path);
    free(key);
    free(cpu);
    return observed;
}
