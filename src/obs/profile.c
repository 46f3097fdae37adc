/* The profiler's recorder, its per-rank part files, and the merged trace + summary. */
#define _GNU_SOURCE
#include "loom/profile.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DEPTH 32
#define MAX_LANES 64
#define MAX_EVENTS ((size_t)4 << 20) /* past this, events are counted as dropped */

typedef struct event {
    const char *name, *cat, *group;
    double t0, t1;  /* loom_now() seconds */
    double flops, bytes, wait;
    int tid;
    int nd;             /* shape: nd integers named by keys ("N IC OC"), formatted at write */
    const char *keys;
    int64_t dims[LOOM_PROF_MAX_DIMS];
    char shape[40];     /* or a text shape (loom_prof_end's) */
} event;

typedef struct recorder {
    int armed, rank;
    int64_t first, last, step;
    int replica;            /* the current step's replica_ranks */
    double peak, origin;
    event *ev;
    size_t n, cap, dropped;
    size_t stack[MAX_DEPTH];
    int depth;
    double lane_end[MAX_LANES];
} recorder;

int loom_prof_recording;
static recorder R;

void loom_prof_init(int rank, int64_t first, int64_t last, double peak_flops) {
    loom_prof_shutdown();
    R.armed = 1;
    R.rank = rank;
    R.first = first;
    R.last = last;
    R.peak = peak_flops;
    R.origin = loom_now();
}

void loom_prof_shutdown(void) {
    free(R.ev);
    memset(&R, 0, sizeof R);
    loom_prof_recording = 0;
}

int loom_prof_parse_steps(const char *text, const char *key, int64_t *first, int64_t *last,
                          loom_err *err) {
    long long a = 0, b = 0;
    int used = 0;
    if (sscanf(text, "%lld-%lld%n", &a, &b, &used) == 2 && text[used] == 0) {
    } else if (used = 0, sscanf(text, "%lld%n", &a, &used) == 1 && text[used] == 0) {
        b = a;
    } else {
        return loom_errf(err, "config key '%s': \"%s\" is not a step range: expected \"A-B\" "
                              "(steps A to B, 1-based) or \"A\"", key, text);
    }
    if (a < 1 || b < a)
        return loom_errf(err, "config key '%s': \"%s\": the range must have 1 <= A <= B", key,
                         text);
    *first = a;
    *last = b;
    return 0;
}

static event *push(void) {
    if (R.n == R.cap) {
        if (R.cap >= MAX_EVENTS) {
            R.dropped++;
            return NULL;
        }
        R.cap = R.cap ? 2 * R.cap : 4096;
        if (R.cap > MAX_EVENTS) R.cap = MAX_EVENTS;
        R.ev = loom_realloc(R.ev, R.cap * sizeof *R.ev);
    }
    event *e = &R.ev[R.n++];
    memset(e, 0, sizeof *e);
    return e;
}

int loom_prof_step_begin(int64_t step) {
    if (!R.armed || step < R.first || step > R.last) return 0;
    R.step = step;
    R.depth = 0;
    loom_prof_recording = 1;
    loom_prof_begin("step", "step");
    return 1;
}

void loom_prof_step_end(double model_flops, int replica_ranks) {
    if (!loom_prof_recording) return;
    R.replica = replica_ranks;
    while (R.depth > 1) loom_prof_end(0, 0, NULL); /* spans left open by an error path */
    char s[40];
    snprintf(s, sizeof s, "step %lld", (long long)R.step);
    event *st = R.depth == 1 && R.stack[0] != SIZE_MAX ? &R.ev[R.stack[0]] : NULL;
    loom_prof_end(model_flops, 0, s);
    if (st) st->bytes = replica_ranks; /* a step span's bytes field holds replica_ranks */
    loom_prof_recording = 0;
    if (R.step == R.first && R.n < MAX_EVENTS) {
        /* the window's first step tells how many events a step makes: room for the rest of the
         * window at once (+25%), so recording never grows the array in the middle of a step */
        const double want = 1.25 * (double)R.n * (double)(R.last - R.first + 1);
        const size_t cap = want < (double)MAX_EVENTS ? (size_t)want : MAX_EVENTS;
        if (cap > R.cap) {
            R.ev = loom_realloc(R.ev, cap * sizeof *R.ev);
            R.cap = cap;
        }
    }
}

int loom_prof_window_done(int64_t step) { return R.armed && step >= R.last; }

void loom_prof_begin(const char *name, const char *cat) {
    if (!loom_prof_recording) return;
    LOOM_CHECK(R.depth < MAX_DEPTH);
    event *e = push();
    R.stack[R.depth++] = e ? (size_t)(e - R.ev) : SIZE_MAX;
    if (!e) return;
    e->name = name;
    e->cat = cat;
    e->t0 = loom_now();
}

/* closes the innermost open span: its event, or NULL when none is recorded */
static event *close_span(double flops, double bytes) {
    if (!loom_prof_recording || R.depth == 0) return NULL;
    const size_t i = R.stack[--R.depth];
    if (i == SIZE_MAX) return NULL;
    event *e = &R.ev[i];
    e->t1 = loom_now();
    e->flops = flops;
    e->bytes = bytes;
    return e;
}

void loom_prof_end(double flops, double bytes, const char *shape) {
    event *e = close_span(flops, bytes);
    if (e && shape) snprintf(e->shape, sizeof e->shape, "%s", shape);
}

void loom_prof_end_dims(double flops, double bytes, const char *keys, const int64_t *dims,
                        int n) {
    event *e = close_span(flops, bytes);
    if (!e) return;
    e->keys = keys;
    e->nd = n < LOOM_PROF_MAX_DIMS ? n : LOOM_PROF_MAX_DIMS;
    memcpy(e->dims, dims, (size_t)e->nd * sizeof *dims);
}

void loom_prof_comm(const char *kind, const char *group, double bytes, double t0, double t1,
                    double waited) {
    if (!loom_prof_recording) return;
    int lane = 0;
    while (lane < MAX_LANES - 1 && R.lane_end[lane] > t0) lane++;
    if (R.lane_end[lane] < t1) R.lane_end[lane] = t1;
    event *e = push();
    if (!e) return;
    e->name = kind;
    e->cat = "comm";
    e->group = group;
    e->t0 = t0;
    e->t1 = t1;
    e->bytes = bytes;
    e->wait = waited;
    e->tid = 1 + lane;
    if (waited > 0 && (e = push())) { /* the exposed part, on the main thread's track */
        static char names[16][40];
        static int n_names;
        const char *wn = NULL;
        for (int k = 0; k < n_names && !wn; k++)
            if (!strcmp(names[k] + 5, kind)) wn = names[k];
        if (!wn && n_names < 16) {
            snprintf(names[n_names], sizeof names[0], "wait:%s", kind);
            wn = names[n_names++];
        }
        e->name = wn ? wn : "wait";
        e->cat = "wait";
        e->group = group;
        e->t0 = t1 - waited;
        e->t1 = t1;
        e->bytes = bytes;
    }
}

/* ---- the part file ------------------------------------------------------------------------ */

typedef loom_sbuf sbuf;

static double us(double t) { return (t - R.origin) * 1e6; }

int loom_prof_write_part(const char *run_dir, loom_err *err) {
    sbuf b = {loom_malloc(1 << 16), 0, 1 << 16};
    loom_sbuf_printf(&b, "{\"rank\":%d,\"peak_flops\":%.17g,\"dropped\":%zu,\"events\":[\n", R.rank,
              R.peak, R.dropped);
    loom_sbuf_printf(&b, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                  "\"args\":{\"name\":\"rank %d\"}},\n", R.rank, R.rank);
    loom_sbuf_printf(&b, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                  "\"args\":{\"sort_index\":%d}},\n", R.rank, R.rank);
    loom_sbuf_printf(&b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                  "\"args\":{\"name\":\"main\"}}", R.rank);
    int lanes = 0;
    for (size_t i = 0; i < R.n; i++)
        if (R.ev[i].tid > lanes) lanes = R.ev[i].tid;
    for (int l = 1; l <= lanes; l++)
        loom_sbuf_printf(&b, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                      "\"args\":{\"name\":\"collectives %d\"}}", R.rank, l, l);
    for (size_t i = 0; i < R.n; i++) {
        const event *e = &R.ev[i];
        if (e->t1 < e->t0) continue; /* never closed */
        const double dur = e->t1 - e->t0;
        loom_sbuf_printf(&b,
            ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
                      "\"ts\":%.3f,\"dur\":%.3f,\"args\":{", e->name, e->cat, R.rank, e->tid,
                  us(e->t0), dur * 1e6);
        const char *sep = "";
        if (e->shape[0]) {
            loom_sbuf_printf(&b, "\"shape\":\"%s\"", e->shape);
            sep = ",";
        } else if (e->nd > 0) { /* "N=64 IC=32 OC=96" from the keys "N IC OC" */
            loom_sbuf_printf(&b, "\"shape\":\"");
            const char *k = e->keys;
            for (int d = 0; d < e->nd; d++) {
                const size_t kl = strcspn(k, " ");
                loom_sbuf_printf(&b, "%s%.*s=%lld", d ? " " : "", (int)kl, k, (long long)e->dims[d]);
                k += kl + (k[kl] == ' ');
            }
            loom_sbuf_printf(&b, "\"");
            sep = ",";
        }
        if (!strcmp(e->cat, "comm") || !strcmp(e->cat, "wait")) {
            loom_sbuf_printf(&b,
                "%s\"group\":\"%s\",\"bytes\":%.17g", sep, e->group ? e->group : "",
                      e->bytes);
            if (!strcmp(e->cat, "comm")) loom_sbuf_printf(&b, ",\"wait_s\":%.9g", e->wait);
        } else if (!strcmp(e->cat, "step")) {
            loom_sbuf_printf(&b, "%s\"model_flops\":%.17g,\"replica_ranks\":%.0f", sep, e->flops,
                      e->bytes);
        } else if (e->flops > 0 || e->bytes > 0) {
            loom_sbuf_printf(&b, "%s\"flops\":%.17g,\"bytes\":%.17g", sep, e->flops, e->bytes);
            if (dur > 0 && e->flops > 0) {
                loom_sbuf_printf(&b, ",\"flops_per_s\":%.6g", e->flops / dur);
                if (R.peak > 0) loom_sbuf_printf(&b,
                    ",\"peak_frac\":%.6g", e->flops / dur / R.peak);
            }
        }
        loom_sbuf_printf(&b, "}}");
    }
    loom_sbuf_printf(&b, "\n]}\n");
    char path[4200];
    loom_pathf(path, sizeof path, "%s/trace.rank_%05d.json", run_dir, R.rank);
    const int rc = loom_write_file_atomic(path, b.p, b.len, err);
    free(b.p);
    return rc;
}

/* ---- merge + summary ---------------------------------------------------------------------- */

typedef struct op_stat {
    const char *name; /* borrowed from the parsed parts */
    int64_t calls;
    double seconds, flops, bytes;
} op_stat;

static int by_seconds(const void *a, const void *b) {
    const op_stat *x = a, *y = b;
    return x->seconds < y->seconds ? 1 : x->seconds > y->seconds ? -1 : strcmp(x->name, y->name);
}

static double num(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : 0;
}

int loom_prof_merge(const char *run_dir, int world, loom_err *err) {
    json_t **parts = loom_calloc((size_t)world, sizeof *parts);
    json_t *all = json_array();
    op_stat *ops = NULL;
    int n_ops = 0, cap_ops = 0, rc = -1;
    double peak = 0, steps_flops = 0;
    int64_t dropped = 0;
    json_t *ranks = json_array();
    char path[4200];
    for (int r = 0; r < world; r++) {
        loom_pathf(path, sizeof path, "%s/trace.rank_%05d.json", run_dir, r);
        json_error_t je;
        parts[r] = json_load_file(path, 0, &je);
        if (!parts[r]) {
            loom_errf(err, "%s: cannot read rank %d's trace part: %s (line %d)", path, r, je.text,
                      je.line);
            goto out;
        }
        if (r == 0) peak = num(parts[r], "peak_flops");
        dropped += (int64_t)num(parts[r], "dropped");
        double step_s = 0, wait_s = 0, data_s = 0, ckpt_s = 0;
        int64_t n_steps = 0;
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(parts[r], "events"), i, e) {
            json_array_append(all, e);
            const char *cat = json_string_value(json_object_get(e, "cat"));
            const char *name = json_string_value(json_object_get(e, "name"));
            if (!cat || !name) continue;
            const double dur = num(e, "dur") * 1e-6;
            const json_t *args = json_object_get(e, "args");
            if (!strcmp(cat, "step")) {
                step_s += dur;
                n_steps++;
                if (r == 0) steps_flops += num(args, "model_flops");
            } else if (!strcmp(cat, "wait")) {
                wait_s += dur;
            } else if (!strcmp(cat, "data")) {
                data_s += dur;
            } else if (!strcmp(cat, "ckpt")) {
                ckpt_s += dur;
            } else if (!strcmp(cat, "op")) {
                int k = 0;
                while (k < n_ops && strcmp(ops[k].name, name)) k++;
                if (k == n_ops) {
                    if (n_ops == cap_ops) {
                        cap_ops = cap_ops ? 2 * cap_ops : 32;
                        ops = loom_realloc(ops, (size_t)cap_ops * sizeof *ops);
                    }
                    ops[n_ops++] = (op_stat){name, 0, 0, 0, 0};
                }
                ops[k].calls++;
                ops[k].seconds += dur;
                ops[k].flops += num(args, "flops");
                ops[k].bytes += num(args, "bytes");
            }
        }
        json_t *rk = json_pack("{s:i,s:I,s:f,s:f,s:f,s:f,s:f}", "rank", r, "steps",
                               (json_int_t)n_steps, "step_s", step_s, "compute_s",
                               step_s - wait_s - data_s, "comm_exposed_s", wait_s, "data_wait_s",
                               data_s, "checkpoint_s", ckpt_s);
        json_array_append_new(ranks, rk);
    }
    {
        json_t *trace = json_pack("{s:o,s:s,s:{s:i,s:f,s:I}}", "traceEvents", all,
                                  "displayTimeUnit", "ms", "otherData", "ranks", world,
                                  "peak_flops_per_rank", peak, "dropped_events",
                                  (json_int_t)dropped);
        all = NULL;
        loom_pathf(path, sizeof path, "%s/trace.json", run_dir);
        char *text = json_dumps(trace, JSON_COMPACT);
        json_decref(trace);
        rc = loom_write_file_atomic(path, text, strlen(text), err);
        free(text);
        if (rc) goto out;
        rc = -1;
    }
    qsort(ops, (size_t)n_ops, sizeof *ops, by_seconds);
    {
        json_t *jops = json_array();
        double op_s = 0, op_flops = 0;
        for (int k = 0; k < n_ops; k++) {
            const double fps = ops[k].seconds > 0 ? ops[k].flops / ops[k].seconds : 0;
            json_t *o = json_pack("{s:s,s:I,s:f,s:f,s:f,s:f}", "name", ops[k].name, "calls",
                                  (json_int_t)ops[k].calls, "seconds", ops[k].seconds, "flops",
                                  ops[k].flops, "bytes", ops[k].bytes, "flops_per_s", fps);
            if (peak > 0) json_object_set_new(o, "peak_frac", json_real(fps / peak));
            json_array_append_new(jops, o);
            op_s += ops[k].seconds;
            op_flops += ops[k].flops;
        }
        json_t *sum = json_pack("{s:i,s:f,s:f,s:f,s:f,s:o,s:o,s:I}", "ranks", world,
                                "peak_flops_per_rank", peak, "op_seconds", op_s, "op_flops",
                                op_flops, "model_flops_rank0", steps_flops, "ops", jops,
                                "per_rank", ranks, "dropped_events", (json_int_t)dropped);
        ranks = NULL;
        char *text = json_dumps(sum, JSON_INDENT(1));
        json_decref(sum);
        loom_pathf(path, sizeof path, "%s/profile_summary.json", run_dir);
        rc = loom_write_file_atomic(path, text, strlen(text), err);
        free(text);
        if (rc) goto out;
        /* the table in the log: top ops by time */
        loom_log("profile: %s/trace.json (%d rank%s); top ops by time over all ranks:", run_dir,
                 world, world > 1 ? "s" : "");
        for (int k = 0; k < n_ops && k < 8; k++) {
            const double fps = ops[k].seconds > 0 ? ops[k].flops / ops[k].seconds : 0;
            char pk[32] = "";
            if (peak > 0 && ops[k].flops > 0)
                snprintf(pk, sizeof pk, " (%.1f%% of peak)", 100 * fps / peak);
            loom_log("  %-32s %6lld calls %9.3f ms %9.2f GFLOP/s%s", ops[k].name,
                     (long long)ops[k].calls, ops[k].seconds * 1e3, fps / 1e9, pk);
        }
    }
    for (int r = 0; r < world; r++) {
        loom_pathf(path, sizeof path, "%s/trace.rank_%05d.json", run_dir, r);
        unlink(path);
    }
    rc = 0;
out:
    for (int r = 0; r < world; r++) json_decref(parts[r]);
    free(parts);
    free(ops);
    json_decref(all);
    json_decref(ranks);
    return rc;
}
