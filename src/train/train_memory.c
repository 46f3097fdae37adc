/* The trainer's memory check: before anything is allocated, the bytes a rank will hold
 * (parameters, gradients, AdamW moments at its DP/ZeRO layout, activations of its micro-batch,
 * the batch buffers) times the ranks on its node, against the memory the node can give
 * (MemAvailable, and the cgroup limit when one is set). See docs/training.md#memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/model.h"
#include "loom/model_config.h"
#include "loom/plan.h"
#include "loom/train.h"
#include "train/trainer_internal.h"

/* The first line of a small file, or -1. */
static int read_line(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    const int ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}

/* A byte count in a cgroup file: 0 for "max" or a value that means "no limit". */
static uint64_t read_limit(const char *path) {
    char line[128];
    if (read_line(path, line, sizeof line)) return 0;
    if (!strcmp(line, "max")) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(line, &end, 10);
    if (errno || end == line) return 0;
    /* cgroup v1 reports "no limit" as a huge page-aligned number (LONG_MAX rounded down) */
    if (v >= (1ULL << 62)) return 0;
    return (uint64_t)v;
}

int loom_memory_limits(const char *root, uint64_t *avail, uint64_t *cgroup) {
    char path[4200], line[4200];
    *avail = 0;
    *cgroup = 0;
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    FILE *f = fopen(path, "re");
    if (f) {
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                *avail = (uint64_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    /* this process's cgroup: "0::/path" (v2) or "N:memory:/path" (v1, among others) */
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    f = fopen(path, "re");
    char v2[4096] = "", v1[4096] = "";
    int have_v2 = 0, have_v1 = 0;
    if (f) {
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c2) continue;
            *c1 = 0;
            *c2 = 0;
            const char *ctrl = c1 + 1, *cpath = c2 + 1;
            if (!strcmp(line, "0") && !*ctrl) {
                snprintf(v2, sizeof v2, "%s", cpath);
                have_v2 = 1;
            } else {
                char *save = NULL;
                for (char *tok = strtok_r((char *)ctrl, ",", &save); tok;
                     tok = strtok_r(NULL, ",", &save))
                    if (!strcmp(tok, "memory")) {
                        snprintf(v1, sizeof v1, "%s", cpath);
                        have_v1 = 1;
                    }
            }
        }
        fclose(f);
    }
    uint64_t lim = 0;
    if (have_v2) { /* its own memory.max, else the mount root's (inside a container) */
        snprintf(path, sizeof path, "%s/sys/fs/cgroup%s/memory.max", root, v2);
        lim = read_limit(path);
        if (!lim) {
            snprintf(path, sizeof path, "%s/sys/fs/cgroup/memory.max", root);
            lim = read_limit(path);
        }
    }
    if (!lim && have_v1) {
        snprintf(path, sizeof path, "%s/sys/fs/cgroup/memory%s/memory.limit_in_bytes", root, v1);
        lim = read_limit(path);
        if (!lim) {
            snprintf(path, sizeof path, "%s/sys/fs/cgroup/memory/memory.limit_in_bytes", root);
            lim = read_limit(path);
        }
    }
    *cgroup = lim;
    return *avail || *cgroup ? 0 : -1;
}

/* "12.3 GiB" */
static const char *human(double b, char *buf, size_t size) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (b >= 1024 && u < 6) b /= 1024, u++;
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", b, units[u]);
    return buf;
}

/* The keys that size the model and the batch, as "key=value key=value ..." */
static void size_keys(const loom_config *c, char *buf, size_t size) {
    static const char *const keys[] = {"model.vocab_size", "model.d_model", "model.n_layer",
                                       "model.n_head",     "model.d_ff",    "model.max_seq_len",
                                       "training.batch_size", "training.seq_len",
                                       "parallel.dp",      "parallel.zero",
                                       "parallel.pp",      "parallel.microbatches"};
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0] && n < size; i++) {
        const char *v = loom_config_get(c, keys[i]);
        if (!v) continue;
        int w = snprintf(buf + n, size - n, "%s%s=%s", n ? " " : "", keys[i], v);
        if (w < 0) break;
        n += (size_t)w;
    }
}

/* Parameters and attention scores in double: a layout whose sizes overflow 64-bit counts is
 * refused before the exact (size_t) layout is built. */
static double rough_floats(const loom_model_config *mc, double B, double T) {
    const double C = mc->d_model, L = mc->n_layer, V = mc->vocab_size, F = mc->d_ff,
                 H = mc->n_head, P = mc->max_seq_len;
    const double params = V * C + P * C + L * (4 * C * C + 3 * F * C) +
                          (mc->num_classes > 0 ? mc->num_classes * C : 0);
    const double acts = L * B * T * (16 * C + 2 * F) + 2 * L * B * H * T * T + B * T * V;
    return 4 * params + acts;
}

int loom_trainer_check_memory(const trainer *t, loom_err *err) {
    const loom_config *c = t->cfg;
    const char *mode = loom_config_get(c, "training.memory_limit");
    if (!mode) mode = "auto";
    const int on_mpi = loom_comm_mpi_active();
    const int node_ranks = on_mpi ? loom_comm_node_ranks() : 1; /* collective: every rank */
    if (!strcmp(mode, "off")) return 0;
    uint64_t limit = 0;
    char source[256] = "";
    if (strcmp(mode, "auto") != 0) {
        char *end;
        errno = 0;
        const double v = strtod(mode, &end);
        if (end == mode || *end || errno || !(v >= 1) || v > 1.8e19)
            return loom_errf(err, "config key 'training.memory_limit' = '%s' (%s): expected auto, "
                                  "off, or a number of bytes (e.g. 64e9)",
                             mode, loom_config_origin(c, "training.memory_limit"));
        limit = (uint64_t)v;
        snprintf(source, sizeof source, "training.memory_limit (%s)",
                 loom_config_origin(c, "training.memory_limit"));
    } else {
        uint64_t avail, cg;
        if (loom_memory_limits("", &avail, &cg)) return 0; /* nothing to compare with */
        char a[32], b[32];
        if (avail && (!cg || avail <= cg)) {
            limit = avail;
            snprintf(source, sizeof source, "MemAvailable in /proc/meminfo%s%s",
                     cg ? "; cgroup limit " : "", cg ? human((double)cg, b, sizeof b) : "");
        } else {
            limit = cg;
            snprintf(source, sizeof source, "the cgroup memory limit; MemAvailable %s",
                     human((double)avail, a, sizeof a));
        }
    }

    char keys[600];
    size_keys(c, keys, sizeof keys);
    const double rough = rough_floats(&t->mc, (double)t->local_B, (double)t->local_T) *
                         (double)sizeof(float);
    char need_s[32], have_s[32];
    if (rough * node_ranks > 4e18) /* beyond any machine, and beyond 64-bit sizes */
        return loom_errf(err, "%s: this layout needs about %s per rank, more than any machine "
                              "has (%s available: %s)",
                         keys, human(rough, need_s, sizeof need_s),
                         human((double)limit, have_s, sizeof have_s), source);

    /* this rank's memory by the planner's accounting (src/plan/plan_memory.c: its model
     * view, the DP/ZeRO engine's storage, the arenas its pipeline schedule keeps in flight),
     * the numbers `loom plan` ranks layouts by */
    const loom_mesh_spec *ms = loom_mesh_layout(t->mesh);
    const loom_plan_layout L = {
        .dp = ms->dp, .tp = ms->tp, .pp = ms->pp, .cp = ms->cp, .ep = ms->ep,
        .zero = (int)t->s.zero, .sp = (int)t->s.sp, .pp_schedule = t->s.pp_schedule,
        .cp_kind = t->cp_kind, .microbatches = t->microbatches, .B = t->s.B, .T = t->s.T,
        .accum = t->s.accum, .recompute = t->mc.recompute, .doc_mask = t->mc.doc_mask,
        .bf16 = t->s.precision == LOOM_PREC_BF16, /* its weight copies and bf16 arena */
        .pairs = t->pref.method != LOOM_PREF_SFT ? 2 : loom_trainer_grpo_rows(t)}; /* GRPO: G */
    loom_plan_memory pm;
    if (loom_plan_rank_memory(&t->mc, &L, t->world_rank, &pm, err)) return -1;
    const double acts = pm.act, batch = pm.act_rows + pm.rope + pm.batch + pm.comm;
    const double per_rank = pm.total;
    const double need = per_rank * node_ranks;
    if (need <= (double)limit) return 0;
    char p[32], g[32], o[32], a[32], r[32], where[96] = "";
    if (node_ranks > 1)
        snprintf(where, sizeof where, " on this node (%d ranks x %s)", node_ranks,
                 human(per_rank, r, sizeof r));
    return loom_errf(
        err,
        "%s: needs an estimated %s of memory%s, but %s is available (%s). Per rank: "
        "parameters %s, gradients %s, AdamW moments %s (dp %d, zero %lld), activations and "
        "batch %s (%lld micro-batch%s of %lld x %lld). Shrink the model or the batch, shard it "
        "(parallel.dp with parallel.zero; parallel.pp splits the layers; `loom plan` ranks the "
        "layouts that fit), or set training.memory_limit (bytes, or off) if you know better",
        keys, human(need, need_s, sizeof need_s), where,
        human((double)limit, have_s, sizeof have_s), source,
        human(pm.param, p, sizeof p), human(pm.grad, g, sizeof g),
        human(pm.optim, o, sizeof o), t->dp_size, (long long)t->s.zero,
        human(acts + batch, a, sizeof a), (long long)pm.arenas, pm.arenas == 1 ? "" : "es",
        (long long)pm.rows, (long long)pm.local_T);
}
