/* Hardware files (data/hardware/NAME.yaml): a device's peaks, memory and links. Read with the
 * config tree (one YAML dialect), unknown keys refused. docs/plan.md#hardware. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "loom/backend.h" /* the kernels' instruction-set level */
#include "loom/config.h"
#include "loom/plan.h"

#ifndef LOOM_DATA_DIR
#define LOOM_DATA_DIR "data"
#endif

static const loom_config_key hw_keys[] = {
    {"name", NULL, "what the file describes"},
    {"base", NULL, "another hardware file this one starts from (its name)"},
    {"source", NULL, "where the figures come from"},
    {"peak_bf16", NULL, "dense bf16 FLOP/s per device"},
    {"peak_fp32", NULL, "fp32 (GPUs: tf32) FLOP/s per device, or measured (loom peak)"},
    {"efficiency", NULL, "fraction of the peak a training step's FLOPs reach"},
    {"efficiency_avx512", NULL, "the CPU's efficiency when the kernels run at avx512"},
    {"efficiency_avx2", NULL, "... at avx2 (LOOM_ISA=avx2)"},
    {"efficiency_x86_64", NULL, "... at x86-64 (LOOM_ISA=x86-64)"},
    {"mem_bytes", NULL, "memory per device (CPU: the node's), or measured"},
    {"mem_bw", NULL, "memory bandwidth, bytes/s"},
    {"intra_bw", NULL, "per device and direction inside a node, bytes/s"},
    {"inter_bw", NULL, "per device and direction between nodes, bytes/s"},
    {"latency_s", NULL, "per step of a collective, seconds"},
    {"per_node", NULL, "devices (ranks) per node"},
    {"shared_memory", NULL, "true: a node's ranks share mem_bytes (CPU)"},
    {"nodes", NULL, "nodes in the cluster (0: as many as needed)"},
    {"cuda_names", NULL, "the CUDA device names (cudaGetDeviceProperties) this file is, comma-separated: "
                         "MFU of a model.backend cuda run (not inherited from a base)"},
    {"peak_fp32_simt", NULL, "GPUs: fp32 FLOP/s without tensor cores (fp32 training, TF32 off)"},
};
#define N_HW_KEYS (int)(sizeof hw_keys / sizeof hw_keys[0])

int loom_plan_hw_find(const char *name, char *path, size_t size, loom_err *err) {
    const char *dir = getenv("LOOM_HW_DIR");
    char def[4096];
    if (!dir || !*dir) {
        snprintf(def, sizeof def, "%s/hardware", LOOM_DATA_DIR);
        dir = def;
    }
    static const struct { const char *alias, *file; } aliases[] = {
        {"h100", "h100-sxm"}, {"a100", "a100-sxm"}, {"h200", "h200-sxm"}, {"b200", "b200"}};
    const char *file = name;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i].alias)) file = aliases[i].file;
    for (const char *p = file; *p; p++)
        if (!(*p == '-' || *p == '_' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z')))
            return loom_errf(err, "hardware name '%s': expected lower-case letters, digits, - "
                                  "and _ (a file in %s)", name, dir);
    const int w = snprintf(path, size, "%s/%s.yaml", dir, file);
    if (w < 0 || (size_t)w >= size) return loom_errf(err, "hardware path too long: %s", dir);
    if (access(path, R_OK) != 0)
        return loom_errf(err, "hardware '%s': no file %s (the known ones: h100, h200, b200, "
                              "a100, cpu; LOOM_HW_DIR names another folder)", name, path);
    return 0;
}

/* a positive number, or "measured" when allowed (*measured = 1) */
static int number(const loom_config *c, const char *path, const char *key, int allow_measured,
                  double lo, double hi, double *out, int *measured, loom_err *err) {
    const char *v = loom_config_get(c, key);
    if (!v) return 0;
    if (allow_measured && !strcmp(v, "measured")) {
        *measured = 1;
        return 0;
    }
    if (allow_measured) *measured = 0;
    if (loom_config_get_double(c, key, out, err)) return loom_err_prefix(err, "%s", path);
    if (!(*out >= lo && *out <= hi))
        return loom_errf(err, "%s: key '%s' = %s: expected a number in [%g, %g]%s", path, key, v,
                         lo, hi, allow_measured ? " or measured" : "");
    return 0;
}

/* efficiency_<level> of the kernels' level now (a CPU file: the step's share of the peak
 * differs between the levels' kernels), over efficiency */
static int level_efficiency(const loom_config *c, const char *path, loom_plan_hw *out,
                            loom_err *err) {
    char key[64];
    snprintf(key, sizeof key, "efficiency_%s", loom_isa_name(loom_isa_active()));
    for (char *p = key; *p; p++)
        if (*p == '-') *p = '_';
    return number(c, path, key, 0, 1e-3, 1.0, &out->efficiency, NULL, err);
}

static int load(const char *path, int depth, loom_plan_hw *out, loom_err *err) {
    loom_config *c = loom_config_new();
    int rc = -1;
    if (loom_config_load_yaml(c, path, err) || loom_config_apply_schema(c, hw_keys, N_HW_KEYS, err))
        goto done;
    const char *base = loom_config_get(c, "base");
    if (base) {
        char bpath[4200];
        if (depth >= 4) {
            loom_errf(err, "%s: key 'base' = %s: bases nest more than 4 deep", path, base);
            goto done;
        }
        if (loom_plan_hw_find(base, bpath, sizeof bpath, err) || load(bpath, depth + 1, out, err)) {
            loom_err_prefix(err, "%s: key 'base'", path);
            goto done;
        }
    }
    const char *name = loom_config_get(c, "name");
    if (name) snprintf(out->name, sizeof out->name, "%s", name);
    const char *cn = loom_config_get(c, "cuda_names"); /* the file's own, never its base's */
    snprintf(out->cuda_names, sizeof out->cuda_names, "%s", cn ? cn : "");
    const char *src = loom_config_get(c, "source");
    if (src) snprintf(out->source, sizeof out->source, "%s", src);
    double per_node = out->per_node, nodes = out->nodes;
    int shared = out->shared_memory;
    if (number(c, path, "peak_bf16", 0, 1e6, 1e18, &out->peak_bf16, NULL, err) ||
        number(c, path, "peak_fp32", 1, 1e6, 1e18, &out->peak_fp32, &out->peak_measured, err) ||
        number(c, path, "efficiency", 0, 1e-3, 1.0, &out->efficiency, NULL, err) ||
        level_efficiency(c, path, out, err) ||
        number(c, path, "mem_bytes", 1, 1e6, 1e18, &out->mem_bytes, &out->mem_measured, err) ||
        number(c, path, "mem_bw", 0, 1e6, 1e16, &out->mem_bw, NULL, err) ||
        number(c, path, "intra_bw", 0, 1e3, 1e16, &out->intra_bw, NULL, err) ||
        number(c, path, "inter_bw", 0, 1e3, 1e16, &out->inter_bw, NULL, err) ||
        number(c, path, "latency_s", 0, 0.0, 1.0, &out->latency_s, NULL, err) ||
        number(c, path, "per_node", 0, 1, 1 << 16, &per_node, NULL, err) ||
        number(c, path, "nodes", 0, 0, 1 << 20, &nodes, NULL, err) ||
        number(c, path, "peak_fp32_simt", 0, 1e6, 1e18, &out->peak_fp32_simt, NULL, err))
        goto done;
    if (loom_config_get(c, "shared_memory") &&
        loom_config_get_bool(c, "shared_memory", &shared, err)) {
        loom_err_prefix(err, "%s", path);
        goto done;
    }
    out->per_node = (int)per_node;
    out->nodes = (int)nodes;
    out->shared_memory = shared;
    rc = 0;
done:
    loom_config_free(c);
    return rc;
}

int loom_plan_hw_load(const char *path, loom_plan_hw *out, loom_err *err) {
    memset(out, 0, sizeof *out);
    out->per_node = 1;
    out->efficiency = 0.5;
    if (load(path, 0, out, err)) return -1;
    const char *missing = !out->peak_fp32 && !out->peak_measured ? "peak_fp32"
                          : !out->intra_bw                       ? "intra_bw"
                                                                 : NULL;
    if (missing)
        return loom_errf(err, "%s: key '%s' is required (docs/plan.md#hardware)", path, missing);
    if (!out->inter_bw) out->inter_bw = out->intra_bw;
    if (!out->name[0]) snprintf(out->name, sizeof out->name, "%s", path);
    return 0;
}

/* one name of a comma-separated list, spaces around it ignored */
static int names_have(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && t[-1] == ' ') t--;
        if ((size_t)(t - p) == n && n && !memcmp(p, name, n)) return 1;
        p = e;
    }
    return 0;
}

int loom_plan_hw_for_device(const char *device, loom_plan_hw *out, char *path, size_t size,
                            loom_err *err) {
    const char *dir = getenv("LOOM_HW_DIR");
    char def[4096];
    if (!dir || !*dir) {
        snprintf(def, sizeof def, "%s/hardware", LOOM_DATA_DIR);
        dir = def;
    }
    DIR *d = opendir(dir);
    if (!d) return loom_errf(err, "hardware files: cannot read the folder %s", dir);
    /* in name order, so that the answer does not depend on the directory's order */
    char best[256] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        const size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".yaml") || n >= sizeof best) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        loom_plan_hw hw;
        loom_err ignored;
        if (loom_plan_hw_load(p, &hw, &ignored)) continue;
        if (names_have(hw.cuda_names, device) && (!best[0] || strcmp(e->d_name, best) < 0))
            snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    if (!best[0]) return 1;
    const int w = snprintf(path, size, "%s/%s", dir, best);
    if (w < 0 || (size_t)w >= size) return loom_errf(err, "hardware path too long: %s", dir);
    return loom_plan_hw_load(path, out, err);
}
