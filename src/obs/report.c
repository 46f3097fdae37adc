/* The run report: metrics.jsonl and the run's other files -> one HTML page with inline SVG
 * line charts. No scripts, no styles or fonts fetched, no URLs: it opens offline. */
#define _GNU_SOURCE
#include "loom/report.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/config.h"

/* ---- output buffer ---------------------------------------------------------------------- */
typedef loom_sbuf sbuf;

/* text as HTML (also safe inside attribute values) */
static void esc(sbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '<') loom_sbuf_printf(b, "&lt;");
        else if (c == '>') loom_sbuf_printf(b, "&gt;");
        else if (c == '&') loom_sbuf_printf(b, "&amp;");
        else if (c == '"') loom_sbuf_printf(b, "&quot;");
        else if (c == '\'') loom_sbuf_printf(b, "&#39;");
        else if (c < 0x20 && c != '\n' && c != '\t') loom_sbuf_printf(b, " ");
        else loom_sbuf_printf(b, "%c", c);
    }
}
static void escs(sbuf *b, const char *s) { esc(b, s, strlen(s)); }

/* ---- series ------------------------------------------------------------------------------ */
typedef struct series {
    char name[64];
    double *x, *y;
    int n, cap;
} series;

static void push(series *s, double x, double y) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->x = loom_realloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = loom_realloc(s->y, (size_t)s->cap * sizeof *s->y);
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
}

static void free_series(series *s, int n) {
    for (int i = 0; i < n; i++) {
        free(s[i].x);
        free(s[i].y);
    }
}

static int finite_points(const series *s) {
    int k = 0;
    for (int i = 0; i < s->n; i++) k += isfinite(s->y[i]);
    return k;
}

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

/* a "nice" step (1, 2 or 5 x 10^k) for about n ticks over span */
static double nice_step(double span, int n) {
    const double raw = span / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

static void fmt_num(char *out, size_t cap, double v) {
    const double a = fabs(v);
    if (a != 0 && (a >= 1e6 || a < 1e-3)) snprintf(out, cap, "%.3g", v);
    else snprintf(out, cap, "%.4g", v);
}

/* One line chart (x: step). Returns 1 when drawn, 0 when no series had a finite point. */
static int chart(sbuf *b, const char *id, const char *title, const char *ylabel, const series *s,
                 int ns) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    int any = 0;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].y[i])) continue;
            any = 1;
            x0 = fmin(x0, s[k].x[i]);
            x1 = fmax(x1, s[k].x[i]);
            y0 = fmin(y0, s[k].y[i]);
            y1 = fmax(y1, s[k].y[i]);
        }
    if (!any) return 0;
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) {
        const double d = fabs(y0) > 0 ? fabs(y0) * 0.05 : 1;
        y0 -= d;
        y1 += d;
    }
    const double pad = 0.05 * (y1 - y0);
    y0 -= pad;
    y1 += pad;
    const int W = 720, H = 280, L = 70, R = 20, T = 34, B = 40;
    const double pw = W - L - R, ph = H - T - B;
#define PX(x) (L + ((x) - x0) / (x1 - x0) * pw)
#define PY(y) (T + (1 - ((y) - y0) / (y1 - y0)) * ph)
    loom_sbuf_printf(b,
        "<figure class=\"plot\" id=\"plot-%s\"><svg width=\"%d\" height=\"%d\" viewBox=\"0 0 "
           "%d %d\" role=\"img\" aria-label=\"", id, W, H, W, H);
    escs(b, title);
    loom_sbuf_printf(b,
        "\"><rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>", W, H);
    loom_sbuf_printf(b, "<text x=\"%d\" y=\"20\" font-size=\"15\" font-weight=\"bold\">", L);
    escs(b, title);
    loom_sbuf_printf(b, "</text>");
    /* grid + ticks */
    const double ys = nice_step(y1 - y0, 5), xs = nice_step(x1 - x0, 6);
    for (double v = ceil(y0 / ys) * ys; v <= y1; v += ys) {
        char t[32];
        fmt_num(t, sizeof t, fabs(v) < 1e-12 * ys ? 0 : v);
        loom_sbuf_printf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
               "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>",
            L, W - R, PY(v), PY(v), L - 6, PY(v) + 4, t);
    }
    for (double v = ceil(x0 / xs) * xs; v <= x1; v += xs) {
        char t[32];
        fmt_num(t, sizeof t, v);
        loom_sbuf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#e4e4e4\"/>"
               "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>",
            PX(v), PX(v), T, H - B, PX(v), H - B + 15, t);
    }
    loom_sbuf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
           "stroke=\"#999\"/>", L, T, pw, ph);
    loom_sbuf_printf(b,
        "<text x=\"%.0f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">step</text>",
        L + pw / 2, H - 6);
    loom_sbuf_printf(b, "<text x=\"14\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\" "
           "transform=\"rotate(-90 14 %.0f)\">", T + ph / 2, T + ph / 2);
    escs(b, ylabel);
    loom_sbuf_printf(b, "</text>");
    /* the lines (long series: every k-th point, the last one kept) */
    for (int k = 0; k < ns; k++) {
        const char *col = palette[k % 10];
        const int stride = s[k].n > 1500 ? (s[k].n + 1499) / 1500 : 1;
        const int single = finite_points(&s[k]) == 1;
        loom_sbuf_printf(b,
            "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
               "points=\"", col);
        for (int i = 0; i < s[k].n; i++) {
            if (i % stride && i != s[k].n - 1) continue;
            if (isfinite(s[k].y[i])) loom_sbuf_printf(b,
                "%.1f,%.1f ", PX(s[k].x[i]), PY(s[k].y[i]));
        }
        loom_sbuf_printf(b, "\"/>");
        if (single || s[k].n <= 60) /* markers where points are few (val loss) */
            for (int i = 0; i < s[k].n; i++)
                if (isfinite(s[k].y[i]))
                    loom_sbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>",
                        PX(s[k].x[i]), PY(s[k].y[i]), col);
        /* legend */
        const int lx = L + 10 + (k % 4) * 165, ly = T + 14 + (k / 4) * 16;
        loom_sbuf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"3\" fill=\"%s\"/>"
               "<text x=\"%d\" y=\"%d\" font-size=\"11\">", lx, ly - 4, col, lx + 16, ly);
        escs(b, s[k].name);
        loom_sbuf_printf(b, "</text>");
    }
    loom_sbuf_printf(b, "</svg></figure>\n");
#undef PX
#undef PY
    return 1;
}

/* ---- inputs ------------------------------------------------------------------------------- */

/* a file's lines parsed as JSON objects (unparsable ones skipped, counted) */
static json_t *read_jsonl(const char *path, int *bad) {
    char *buf = NULL;
    size_t len = 0;
    loom_err e;
    *bad = 0;
    if (!loom_path_exists(path) || loom_read_file(path, (size_t)1 << 34, &buf, &len, &e))
        return NULL;
    json_t *rows = json_array();
    for (char *line = buf; line < buf + len;) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        const size_t n = nl ? (size_t)(nl - line) : (size_t)(buf + len - line);
        if (n > 0) {
            json_t *r = json_loadb(line, n, 0, NULL);
            if (json_is_object(r)) json_array_append_new(rows, r);
            else {
                json_decref(r);
                ++*bad;
            }
        }
        line += n + 1;
    }
    free(buf);
    return rows;
}

static double num_or_nan(const json_t *v) {
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* series of a scalar key over the rows; scale multiplies the values */
static void scalar_series(json_t *rows, const char *key, const char *name, double scale,
                          series *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const json_t *v = json_object_get(r, key);
        if (!v) continue;
        push(s, num_or_nan(json_object_get(r, "step")), num_or_nan(v) * scale);
    }
}

/* per-rank series of array keys (sum of keys a and b when b is not NULL), one per rank */
static int rank_series(json_t *rows, const char *a, const char *b, double scale, const char *what,
                       series *s, int max) {
    int ranks = 0;
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const int n = (int)json_array_size(json_object_get(r, a));
        if (n > ranks) ranks = n;
    }
    if (ranks > max) ranks = max;
    for (int k = 0; k < ranks; k++) {
        memset(&s[k], 0, sizeof s[k]);
        snprintf(s[k].name, sizeof s[k].name, "%s rank %d", what, k);
    }
    json_array_foreach(rows, i, r) {
        const json_t *va = json_object_get(r, a), *vb = b ? json_object_get(r, b) : NULL;
        for (int k = 0; k < ranks && k < (int)json_array_size(va); k++) {
            double v = num_or_nan(json_array_get(va, (size_t)k));
            if (vb) v += num_or_nan(json_array_get(vb, (size_t)k));
            push(&s[k], num_or_nan(json_object_get(r, "step")), v * scale);
        }
    }
    return ranks;
}

static void manifest_summary(sbuf *b, const char *what, const char *dir) {
    char path[4200];
    loom_pathf(path, sizeof path, "%s/manifest.jsonl", dir);
    int bad = 0;
    json_t *rows = read_jsonl(path, &bad);
    loom_sbuf_printf(b, "<tr><td>%s</td><td><code>", what);
    escs(b, dir);
    loom_sbuf_printf(b, "</code></td>");
    if (!rows) {
        loom_sbuf_printf(b, "<td colspan=\"3\">manifest.jsonl not found</td></tr>\n");
        return;
    }
    double tokens = 0, docs = 0;
    json_t *by_source = json_object();
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const double t = num_or_nan(json_object_get(r, "tokens"));
        tokens += isfinite(t) ? t : 0;
        const double d = num_or_nan(json_object_get(r, "docs"));
        docs += isfinite(d) ? d : 0;
        const char *src = json_string_value(json_object_get(r, "source"));
        if (!src) src = "(none)";
        const double prev = num_or_nan(json_object_get(by_source, src));
        json_object_set_new(by_source, src, json_real((isfinite(prev) ? prev : 0) +
                                                      (isfinite(t) ? t : 0)));
    }
    loom_sbuf_printf(b,
        "<td>%zu</td><td>%.0f</td><td>%.0f</td><td>", json_array_size(rows), tokens, docs);
    const char *k;
    json_t *v;
    int first = 1;
    json_object_foreach(by_source, k, v) {
        loom_sbuf_printf(b, "%s", first ? "" : ", ");
        escs(b, k);
        loom_sbuf_printf(b, " %.0f", json_number_value(v));
        first = 0;
    }
    loom_sbuf_printf(b, "</td></tr>\n");
    json_decref(by_source);
    json_decref(rows);
}

static void profile_section(sbuf *b, const char *run_dir) {
    char path[4200];
    loom_pathf(path, sizeof path, "%s/profile_summary.json", run_dir);
    if (!loom_path_exists(path)) return;
    json_t *s = json_load_file(path, 0, NULL);
    if (!json_is_object(s)) {
        json_decref(s);
        loom_sbuf_printf(b, "<h2>Profile</h2><p>profile_summary.json is not readable.</p>\n");
        return;
    }
    const double peak = num_or_nan(json_object_get(s, "peak_flops_per_rank"));
    const double total = num_or_nan(json_object_get(s, "op_seconds"));
    loom_sbuf_printf(b,
        "<h2 id=\"profile\">Profile</h2><p>From <code>trace.json</code> (open it in Perfetto "
           "or chrome://tracing). Top ops by time over all ranks");
    if (isfinite(peak) && peak > 0) loom_sbuf_printf(b, "; peak %.1f GFLOP/s per rank", peak / 1e9);
    loom_sbuf_printf(b,
        ".</p>\n<table class=\"ops\"><tr><th>op</th><th>calls</th><th>ms</th><th>share of "
           "op time</th><th>GFLOP/s</th><th>of peak</th><th>GB/s</th></tr>\n");
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(s, "ops"), i, o) {
        if (i >= 15) break;
        const double sec = num_or_nan(json_object_get(o, "seconds"));
        const double fl = num_or_nan(json_object_get(o, "flops"));
        const double by = num_or_nan(json_object_get(o, "bytes"));
        loom_sbuf_printf(b, "<tr><td>");
        escs(b, json_string_value(json_object_get(o, "name")) ? json_string_value(
                                                                   json_object_get(o, "name"))
                                                             : "?");
        loom_sbuf_printf(b, "</td><td>%lld</td><td>%.3f</td><td>%.1f%%</td><td>%.2f</td><td>",
            (long long)json_integer_value(json_object_get(o, "calls")), sec * 1e3,
            total > 0 ? 100 * sec / total : 0, sec > 0 ? fl / sec / 1e9 : 0);
        if (isfinite(peak) && peak > 0 && fl > 0 && sec > 0) loom_sbuf_printf(b,
            "%.1f%%", 100 * fl / sec / peak);
        loom_sbuf_printf(b, "</td><td>%.2f</td></tr>\n", sec > 0 ? by / sec / 1e9 : 0);
    }
    loom_sbuf_printf(b, "</table>\n");
    /* compute / exposed communication / data wait per rank, as a stacked bar */
    json_t *ranks = json_object_get(s, "per_rank");
    const int nr = (int)json_array_size(ranks);
    if (nr > 0) {
        const int W = 760, row = 22, L = 70, H = 40 + nr * row + 24;
        loom_sbuf_printf(b,
            "<figure class=\"plot\" id=\"plot-profile-split\"><svg width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"time split per rank\">"
               "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>"
               "<text x=\"%d\" y=\"20\" font-size=\"15\" font-weight=\"bold\">Profiled steps: "
               "compute / exposed communication / data wait per rank</text>",
            W, H, W, H, W, H, L);
        const char *names[3] = {"compute_s", "comm_exposed_s", "data_wait_s"};
        const char *labels[3] = {"compute", "exposed communication", "data wait"};
        double most = 0;
        json_array_foreach(ranks, i, o) {
            double t = 0;
            for (int k = 0; k < 3; k++) t += fmax(0, num_or_nan(json_object_get(o, names[k])));
            if (t > most) most = t;
        }
        json_array_foreach(ranks, i, o) {
            const int y = 34 + (int)i * row;
            loom_sbuf_printf(b,
                "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">rank %zu</text>",
                L - 6, y + 13, i);
            double x = L;
            for (int k = 0; k < 3; k++) {
                const double v = fmax(0, num_or_nan(json_object_get(o, names[k])));
                const double w = most > 0 ? v / most * (W - L - 20) : 0;
                loom_sbuf_printf(b,
                    "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"16\" fill=\"%s\"/>", x,
                    y, w, palette[k]);
                x += w;
            }
        }
        for (int k = 0; k < 3; k++)
            loom_sbuf_printf(b,
                "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"8\" fill=\"%s\"/><text x=\"%d\" "
                   "y=\"%d\" font-size=\"11\">%s</text>", L + k * 200, H - 16, palette[k],
                L + k * 200 + 16, H - 8, labels[k]);
        loom_sbuf_printf(b, "</svg></figure>\n");
        loom_sbuf_printf(b,
            "<table><tr><th>rank</th><th>steps</th><th>step s</th><th>compute s</th><th>"
               "exposed comm s</th><th>data wait s</th></tr>\n");
        json_array_foreach(ranks, i, o) {
            loom_sbuf_printf(b,
                "<tr><td>%zu</td><td>%lld</td><td>%.4f</td><td>%.4f</td><td>%.4f</td><td>%.4f"
                   "</td></tr>\n", i, (long long)json_integer_value(json_object_get(o, "steps")),
                num_or_nan(json_object_get(o, "step_s")),
                num_or_nan(json_object_get(o, "compute_s")),
                num_or_nan(json_object_get(o, "comm_exposed_s")),
                num_or_nan(json_object_get(o, "data_wait_s")));
        }
        loom_sbuf_printf(b, "</table>\n");
    }
    json_decref(s);
}

/* ---- the trace timeline: one profiled step, a row group per rank ---------------------------- */
typedef struct span {
    const char *name, *cat;
    double t0, t1, flops;
    int pid, tid, depth;
} span;

static int by_start(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->pid != y->pid) return x->pid - y->pid;
    if (x->tid != y->tid) return x->tid - y->tid;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    return x->t1 > y->t1 ? -1 : x->t1 < y->t1;
}

static const char *cat_color(const char *cat, const char *name) {
    if (!strcmp(cat, "step")) return "#d9d9d9";
    if (!strcmp(cat, "phase")) return "#9ecae1";
    if (!strcmp(cat, "data")) return "#fdae6b";
    if (!strcmp(cat, "wait")) return "#e6550d";
    if (!strcmp(cat, "comm")) return "#9467bd";
    if (!strcmp(cat, "ckpt")) return "#8c564b";
    if (!strcmp(cat, "op")) {
        if (!strncmp(name, "matmul", 6)) return "#31a354";
        if (strstr(name, "attention")) return "#3182bd";
        if (!strncmp(name, "adamw", 5) || !strcmp(name, "sum_squares") ||
            !strcmp(name, "scale_inplace"))
            return "#756bb1";
        return "#a1d99b";
    }
    return "#bdbdbd";
}

static void trace_section(sbuf *b, const char *run_dir) {
    char path[4200];
    loom_pathf(path, sizeof path, "%s/trace.json", run_dir);
    if (!loom_path_exists(path)) return;
    json_t *doc = json_load_file(path, 0, NULL);
    json_t *ev = json_object_get(doc, "traceEvents");
    if (!json_is_array(ev)) {
        json_decref(doc);
        return;
    }
    /* the first profiled step of rank 0, and the same step on every rank */
    const char *which = NULL;
    double best = INFINITY;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (!cat || strcmp(cat, "step") || json_integer_value(json_object_get(e, "pid")) != 0)
            continue;
        const double ts = num_or_nan(json_object_get(e, "ts"));
        const char *shape = json_string_value(json_object_get(json_object_get(e, "args"), "shape"));
        if (shape && ts < best) best = ts, which = shape;
    }
    if (!which) {
        json_decref(doc);
        return;
    }
    int max_pid = 0;
    double w0 = INFINITY, w1 = -INFINITY;
    json_array_foreach(ev, i, e) { /* the window: the step spans named `which` */
        const char *cat = json_string_value(json_object_get(e, "cat"));
        const char *shape = json_string_value(json_object_get(json_object_get(e, "args"), "shape"));
        if (!cat || strcmp(cat, "step") || !shape || strcmp(shape, which)) continue;
        const double ts = num_or_nan(json_object_get(e, "ts")), du = num_or_nan(json_object_get(e, "dur"));
        w0 = fmin(w0, ts);
        w1 = fmax(w1, ts + du);
        const int pid = (int)json_integer_value(json_object_get(e, "pid"));
        if (pid > max_pid) max_pid = pid;
    }
    if (max_pid > 15) max_pid = 15; /* the first 16 ranks */
    span *sp = NULL;
    size_t n = 0, cap = 0;
    json_array_foreach(ev, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")) ? json_string_value(json_object_get(e, "ph")) : "", "X"))
            continue;
        const double ts = num_or_nan(json_object_get(e, "ts")), du = num_or_nan(json_object_get(e, "dur"));
        const int pid = (int)json_integer_value(json_object_get(e, "pid"));
        if (!(ts + du > w0 && ts < w1) || pid > max_pid) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            sp = loom_realloc(sp, cap * sizeof *sp);
        }
        const char *nm = json_string_value(json_object_get(e, "name"));
        const char *ct = json_string_value(json_object_get(e, "cat"));
        sp[n++] = (span){nm ? nm : "?", ct ? ct : "?", fmax(ts, w0), fmin(ts + du, w1),
                         num_or_nan(json_object_get(json_object_get(e, "args"), "flops")), pid,
                         (int)json_integer_value(json_object_get(e, "tid")), 0};
    }
    qsort(sp, n, sizeof *sp, by_start);
    /* depth on the main thread by nesting; lanes of collectives are rows of their own */
    int depth_max = 0, lanes_max = 0;
    for (size_t a = 0; a < n;) {
        size_t z = a;
        while (z < n && sp[z].pid == sp[a].pid && sp[z].tid == sp[a].tid) z++;
        if (sp[a].tid == 0) {
            double ends[16];
            int d = 0;
            for (size_t k = a; k < z; k++) {
                while (d > 0 && ends[d - 1] <= sp[k].t0 + 1e-3) d--;
                sp[k].depth = d < 15 ? d : 15;
                if (d < 16) ends[d++] = sp[k].t1;
                if (sp[k].depth > depth_max) depth_max = sp[k].depth;
            }
        } else if (sp[a].tid > lanes_max) {
            lanes_max = sp[a].tid;
        }
        a = z;
    }
    if (lanes_max > 4) lanes_max = 4;
    const int rows = depth_max + 1 + lanes_max, rh = 16, L = 90, W = 1500, R = 10;
    const int group = rows * rh + 10, T = 40, H = T + (max_pid + 1) * group + 30;
    const double pw = W - L - R, span_us = w1 - w0 > 0 ? w1 - w0 : 1;
    loom_sbuf_printf(b, "<h2 id=\"trace\">Trace</h2><p>");
    escs(b, which);
    loom_sbuf_printf(b,
        " of <code>trace.json</code>, %.3f ms, a row group per rank (main thread: step, "
           "phases, ops, waits by nesting depth; then the lanes of collectives). Hover a span "
           "for its name, duration and FLOPs. Open the file in Perfetto or chrome://tracing for "
           "every step.</p>\n", span_us / 1e3);
    loom_sbuf_printf(b,
        "<figure class=\"plot\" id=\"plot-trace\"><svg width=\"%d\" height=\"%d\" viewBox=\"0 "
           "0 %d %d\" role=\"img\" aria-label=\"trace timeline\"><rect x=\"0\" y=\"0\" "
           "width=\"%d\" height=\"%d\" fill=\"#fff\"/>", W, H, W, H, W, H);
    const double tick = nice_step(span_us / 1e3, 8);
    for (double v = 0; v <= span_us / 1e3 + 1e-9; v += tick) {
        const double x = L + v * 1e3 / span_us * pw;
        loom_sbuf_printf(b,
            "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#eee\"/><text x=\"%.1f\" "
               "y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%.4g ms</text>", x, x, T - 6, H - 24,
            x, T - 10, v);
    }
    for (int p = 0; p <= max_pid; p++)
        loom_sbuf_printf(b,
            "<text x=\"6\" y=\"%d\" font-size=\"12\" font-weight=\"bold\">rank %d</text>",
            T + p * group + 12, p);
    for (size_t k = 0; k < n; k++) {
        const span *s = &sp[k];
        const int row = s->tid == 0 ? s->depth : depth_max + (s->tid < 4 ? s->tid : 4);
        const double x = L + (s->t0 - w0) / span_us * pw, w = fmax(0.5, (s->t1 - s->t0) / span_us * pw);
        const int y = T + s->pid * group + row * rh;
        loom_sbuf_printf(b,
            "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"#fff\" "
               "stroke-width=\"0.3\"><title>", x, y, w, rh - 2, cat_color(s->cat, s->name));
        escs(b, s->name);
        loom_sbuf_printf(b, " (%s) %.1f us", s->cat, s->t1 - s->t0);
        if (s->flops > 0) loom_sbuf_printf(b, ", %.4g FLOP", s->flops);
        loom_sbuf_printf(b, "</title></rect>");
        if (w > 7.0 * (double)strlen(s->name)) {
            loom_sbuf_printf(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\">", x + 2, y + rh - 5);
            escs(b, s->name);
            loom_sbuf_printf(b, "</text>");
        }
    }
    const char *keys[][2] = {{"step", "step"}, {"phase", "phase"}, {"matmul", "op"},
                             {"attention", "op"}, {"optimizer op", "op"}, {"other op", "op"},
                             {"data wait", "data"}, {"wait (exposed comm)", "wait"},
                             {"collective", "comm"}, {"checkpoint", "ckpt"}};
    const char *kname[] = {"", "", "matmul", "attention", "adamw", "x", "", "", "", ""};
    for (int k = 0; k < 10; k++)
        loom_sbuf_printf(b,
            "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"10\" fill=\"%s\"/><text x=\"%d\" "
               "y=\"%d\" font-size=\"11\">%s</text>", L + k * 140, H - 16,
            cat_color(keys[k][1], kname[k]), L + k * 140 + 16, H - 7, keys[k][0]);
    loom_sbuf_printf(b, "</svg></figure>\n");
    free(sp);
    json_decref(doc);
}

int loom_report(const char *run_dir, const char *out_path, loom_err *err) {
    char path[4200], outp[4200];
    loom_pathf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    int bad = 0;
    json_t *rows = read_jsonl(path, &bad);
    if (!rows)
        return loom_errf(err, "%s: cannot read it: is %s a run directory (run.dir of `loom "
                              "train`)?", path, run_dir);
    loom_pathf(outp, sizeof outp, "%s", out_path ? out_path : "");
    if (!out_path) loom_pathf(outp, sizeof outp, "%s/report.html", run_dir);
    sbuf b = {loom_malloc(1 << 16), 0, 1 << 16};
    loom_sbuf_printf(&b,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>loom report: ");
    escs(&b, run_dir);
    loom_sbuf_printf(&b,
        "</title><style>body{font-family:sans-serif;margin:24px;max-width:1600px;color:#222}"
            "figure{display:inline-block;margin:6px;border:1px solid #ddd}"
            "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;"
            "padding:3px 8px;font-size:13px;text-align:left}pre{background:#f6f6f6;padding:8px;"
            "font-size:12px;overflow:auto;max-height:480px}</style></head><body>\n");
    loom_sbuf_printf(&b, "<h1>loom run <code>");
    escs(&b, run_dir);
    loom_sbuf_printf(&b, "</code></h1>\n");
    /* summary */
    const size_t n = json_array_size(rows);
    json_t *last = n ? json_array_get(rows, n - 1) : NULL;
    double best_val = INFINITY, tps = 0, mfu = 0;
    int n_tps = 0, n_mfu = 0;
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const double v = num_or_nan(json_object_get(r, "val_loss"));
        if (isfinite(v) && v < best_val) best_val = v;
        const double t = num_or_nan(json_object_get(r, "tokens_per_s"));
        if (isfinite(t)) tps += t, n_tps++;
        const double m = num_or_nan(json_object_get(r, "mfu"));
        if (isfinite(m)) mfu += m, n_mfu++;
    }
    loom_sbuf_printf(&b, "<table class=\"summary\"><tr><th>steps logged</th><td>%zu</td></tr>", n);
    if (last)
        loom_sbuf_printf(&b,
            "<tr><th>last step</th><td>%lld</td></tr><tr><th>last loss</th><td>%.5g</td></tr>",
            (long long)json_integer_value(json_object_get(last, "step")),
            num_or_nan(json_object_get(last, "loss")));
    if (isfinite(best_val)) loom_sbuf_printf(&b,
        "<tr><th>best val loss</th><td>%.5g</td></tr>", best_val);
    if (n_tps) loom_sbuf_printf(&b, "<tr><th>mean tokens/s</th><td>%.1f</td></tr>", tps / n_tps);
    if (n_mfu) loom_sbuf_printf(&b, "<tr><th>mean MFU</th><td>%.2f%%</td></tr>", 100 * mfu / n_mfu);
    if (bad) loom_sbuf_printf(&b, "<tr><th>unreadable metrics lines</th><td>%d</td></tr>", bad);
    loom_sbuf_printf(&b, "</table>\n<h2 id=\"plots\">Training</h2>\n");
    /* plots */
    series s[16];
    int drawn = 0;
    scalar_series(rows, "loss", "train loss", 1, &s[0]);
    scalar_series(rows, "val_loss", "val loss", 1, &s[1]);
    drawn += chart(&b, "loss", "Loss", "loss", s, 2);
    free_series(s, 2);
    scalar_series(rows, "lr", "learning rate", 1, &s[0]);
    drawn += chart(&b, "lr", "Learning rate", "lr", s, 1);
    free_series(s, 1);
    scalar_series(rows, "grad_norm", "gradient norm (before clipping)", 1, &s[0]);
    drawn += chart(&b, "grad_norm", "Gradient norm", "norm", s, 1);
    free_series(s, 1);
    /* GRPO (finetune.method grpo): rewards, completion lengths, rollout vs update time */
    scalar_series(rows, "reward", "reward (mean)", 1, &s[0]);
    scalar_series(rows, "pass_rate", "pass rate", 1, &s[1]);
    scalar_series(rows, "reward_std", "reward std (group mean)", 1, &s[2]);
    drawn += chart(&b, "grpo_reward", "GRPO rewards", "reward", s, 3);
    free_series(s, 3);
    scalar_series(rows, "completions/mean_length", "mean", 1, &s[0]);
    scalar_series(rows, "completions/max_length", "max", 1, &s[1]);
    drawn += chart(&b, "grpo_length", "GRPO completion length", "tokens", s, 2);
    free_series(s, 2);
    scalar_series(rows, "rollout_s", "rollout", 1, &s[0]);
    scalar_series(rows, "update_s", "update (forward + backward)", 1, &s[1]);
    drawn += chart(&b, "grpo_time", "GRPO rollout vs update time", "s", s, 2);
    free_series(s, 2);
    scalar_series(rows, "tokens_per_s", "tokens/s", 1, &s[0]);
    drawn += chart(&b, "tokens_per_s", "Throughput", "tokens/s", s, 1);
    free_series(s, 1);
    scalar_series(rows, "mfu", "MFU %", 100, &s[0]);
    drawn += chart(&b, "mfu", "Model FLOPs utilization", "% of peak", s, 1);
    free_series(s, 1);
    scalar_series(rows, "rss_bytes", "RSS rank 0", 1.0 / (1 << 20), &s[0]);
    scalar_series(rows, "mem_bytes", "arenas rank 0", 1.0 / (1 << 20), &s[1]);
    int k = 2 + rank_series(rows, "rss_hwm_bytes", NULL, 1.0 / (1 << 20), "RSS high-water", s + 2,
                            8);
    drawn += chart(&b, "memory", "Memory", "MiB", s, k);
    free_series(s, k);
    scalar_series(rows, "comm_exposed_share", "exposed communication %", 100, &s[0]);
    drawn += chart(&b, "comm", "Exposed communication share of the step", "% of step", s, 1);
    free_series(s, 1);
    k = rank_series(rows, "compute_s", "data_wait_s", 1e3, "busy", s, 16);
    if (!k) {
        scalar_series(rows, "step_ms", "step time", 1, &s[0]);
        k = 1;
    }
    drawn += chart(&b, "rank_step", "Per-rank step time (busy: compute + data wait)", "ms", s, k);
    free_series(s, k);
    if (!drawn) loom_sbuf_printf(&b, "<p>No numeric metrics to plot.</p>\n");
    /* alerts */
    loom_pathf(path, sizeof path, "%s/alerts.jsonl", run_dir);
    int abad = 0;
    json_t *alerts = read_jsonl(path, &abad);
    loom_sbuf_printf(&b, "<h2 id=\"alerts\">Alerts</h2>\n");
    if (!alerts || json_array_size(alerts) == 0) {
        loom_sbuf_printf(&b, "<p>No alert fired.</p>\n");
    } else {
        loom_sbuf_printf(&b,
            "<table class=\"alerts\"><tr><th>step</th><th>rule</th><th>value</th><th>"
                "reference</th><th>action</th></tr>\n");
        json_array_foreach(alerts, i, r) {
            loom_sbuf_printf(&b,
                "<tr><td>%lld</td><td>", (long long)json_integer_value(json_object_get(r, "step")));
            const char *rule = json_string_value(json_object_get(r, "rule"));
            escs(&b, rule ? rule : "?");
            loom_sbuf_printf(&b,
                "</td><td>%.6g</td><td>%.6g</td><td>", num_or_nan(json_object_get(r, "value")),
                num_or_nan(json_object_get(r, "reference")));
            const char *act = json_string_value(json_object_get(r, "action"));
            escs(&b, act ? act : "?");
            loom_sbuf_printf(&b, "</td></tr>\n");
        }
        loom_sbuf_printf(&b, "</table>\n");
    }
    json_decref(alerts);
    /* profile */
    profile_section(&b, run_dir);
    trace_section(&b, run_dir);
    /* data + config */
    loom_pathf(path, sizeof path, "%s/config.yaml", run_dir);
    char *cfg_text = NULL;
    size_t cfg_len = 0;
    loom_err e2;
    const int have_cfg = loom_path_exists(path) &&
                         !loom_read_file(path, (size_t)1 << 24, &cfg_text, &cfg_len, &e2);
    loom_sbuf_printf(&b, "<h2 id=\"data\">Data</h2>\n");
    loom_config *cfg = loom_config_new();
    if (have_cfg && !loom_config_load_yaml(cfg, path, &e2)) {
        loom_sbuf_printf(&b,
            "<table class=\"data\"><tr><th>split</th><th>directory</th><th>shards</th><th>"
                "tokens</th><th>documents</th><th>tokens per source</th></tr>\n");
        const char *tr = loom_config_get(cfg, "data.train"), *va = loom_config_get(cfg, "data.val");
        if (tr && tr[0]) manifest_summary(&b, "train", tr);
        if (va && va[0]) manifest_summary(&b, "val", va);
        loom_sbuf_printf(&b, "</table>\n");
    } else {
        loom_sbuf_printf(&b, "<p>No readable config.yaml: the dataset is unknown.</p>\n");
    }
    loom_config_free(cfg);
    loom_sbuf_printf(&b, "<h2 id=\"config\">Config</h2>\n");
    if (have_cfg) {
        loom_sbuf_printf(&b, "<pre class=\"config\">");
        esc(&b, cfg_text, cfg_len);
        loom_sbuf_printf(&b, "</pre>\n");
    } else {
        loom_sbuf_printf(&b, "<p>config.yaml not found.</p>\n");
    }
    free(cfg_text);
    loom_sbuf_printf(&b, "</body></html>\n");
    const int rc = loom_write_file_atomic(outp, b.p, b.len, err);
    if (rc == 0) loom_log("report: %s (%d plots)", outp, drawn);
    free(b.p);
    json_decref(rows);
    return rc;
}
