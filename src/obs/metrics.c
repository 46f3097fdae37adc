/* metrics.jsonl writer. */
#include "loom/metrics.h"

#include <errno.h>
#include <math.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct loom_metrics {
    FILE *f;
    char *path;
    loom_sbuf line; /* the line being built (its allocation kept from line to line) */
};

typedef struct row_ref {
    int64_t step;
    size_t idx; /* line number in the file, 0-based */
} row_ref;

static int by_step_then_line(const void *a, const void *b) {
    const row_ref *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Cuts an existing file to one history up to step keep (see loom_metrics_open). */
static int truncate_history(const char *path, int64_t keep, loom_err *err) {
    char *buf = NULL;
    size_t len = 0;
    if (!loom_path_exists(path)) return 0;
    if (loom_read_file(path, (size_t)1 << 34, &buf, &len, err)) return -1;
    size_t n_lines = 0, n_rows = 0;
    for (size_t i = 0; i < len; i++) n_lines += buf[i] == '\n';
    n_lines += len > 0 && buf[len - 1] != '\n';
    int64_t *step_of = loom_malloc((n_lines + 1) * sizeof *step_of); /* -1 no step, -2 drop */
    row_ref *rows = loom_malloc((n_lines + 1) * sizeof *rows);
    int changed = 0;
    size_t li = 0;
    for (char *line = buf; line < buf + len; li++) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(buf + len - line);
        json_t *row = nl ? json_loadb(line, n, 0, NULL) : NULL; /* unterminated: cut short */
        json_t *step = json_object_get(row, "step");
        step_of[li] = !row ? -2 : json_is_integer(step) ? json_integer_value(step) : -1;
        if (json_is_integer(step) && json_integer_value(step) > keep) step_of[li] = -2;
        if (step_of[li] >= 0) rows[n_rows++] = (row_ref){step_of[li], li};
        json_decref(row);
        line += n + 1;
    }
    /* of several rows of one step the last one written stays (it is the history that went on) */
    qsort(rows, n_rows, sizeof *rows, by_step_then_line);
    int64_t missing = 0, first_missing = 0, expect = 1;
    for (size_t i = 0; i < n_rows; i++) {
        if (i + 1 < n_rows && rows[i + 1].step == rows[i].step) {
            step_of[rows[i].idx] = -2;
            continue;
        }
        if (rows[i].step >= 1) {
            if (rows[i].step > expect && !missing) first_missing = expect;
            if (rows[i].step > expect) missing += rows[i].step - expect;
            expect = rows[i].step + 1;
        }
    }
    if (keep >= expect) {
        if (!missing) first_missing = expect;
        missing += keep - expect + 1;
    }
    char *out = loom_malloc(len + 2);
    size_t olen = 0;
    li = 0;
    for (char *line = buf; line < buf + len; li++) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(buf + len - line);
        if (step_of[li] == -2) changed = 1;
        else {
            memcpy(out + olen, line, n);
            olen += n;
            out[olen++] = '\n';
        }
        line += n + 1;
    }
    int rc = changed ? loom_write_file_atomic(path, out, olen, err) : 0;
    if (rc == 0 && missing > 0)
        loom_warn("%s: %lld of the steps 1..%lld have no row (the first is step %lld): they were "
                  "lost before this run (rows are durable only up to the last checkpoint)",
                  path, (long long)missing, (long long)keep, (long long)first_missing);
    free(out);
    free(rows);
    free(step_of);
    free(buf);
    return rc;
}

int loom_metrics_open(const char *path, int64_t keep_upto_step, loom_metrics **out,
                      loom_err *err) {
    if (truncate_history(path, keep_upto_step, err)) return -1;
    FILE *f = fopen(path, "a");
    if (!f) return loom_errf(err, "%s: cannot open for writing: %s", path, strerror(errno));
    loom_metrics *m = loom_calloc(1, sizeof *m);
    m->f = f;
    m->path = loom_strdup(path);
    m->line = (loom_sbuf){loom_malloc(1024), 0, 1024};
    *out = m;
    return 0;
}

void loom_metrics_begin(loom_metrics *m) {
    m->line.len = 0;
    m->line.p[0] = 0;
}

static void key(loom_metrics *m, const char *k) {
    loom_sbuf_printf(&m->line, "%s\"%s\":", m->line.len ? "," : "{", k);
}

void loom_metrics_int(loom_metrics *m, const char *k, int64_t v) {
    key(m, k);
    loom_sbuf_printf(&m->line, "%lld", (long long)v);
}

/* JSON has no NaN or infinity: a value that is not finite is null */
static void real(loom_metrics *m, const char *sep, double v) {
    if (isfinite(v)) loom_sbuf_printf(&m->line, "%s%.17g", sep, v);
    else loom_sbuf_printf(&m->line, "%snull", sep);
}

void loom_metrics_real(loom_metrics *m, const char *k, double v) {
    key(m, k);
    real(m, "", v);
}

void loom_metrics_reals(loom_metrics *m, const char *k, const double *v, int n, int stride) {
    key(m, k);
    for (int i = 0; i < n; i++) real(m, i ? "," : "[", v[(size_t)i * (size_t)stride]);
    loom_sbuf_printf(&m->line, "%s", n ? "]" : "[]");
}

int loom_metrics_end(loom_metrics *m, loom_err *err) {
    loom_sbuf_printf(&m->line, "%s\n", m->line.len ? "}" : "{}");
    const int bad = fwrite(m->line.p, 1, m->line.len, m->f) != m->line.len || fflush(m->f) != 0;
    if (bad) return loom_errf(err, "%s: write failed: %s", m->path, strerror(errno));
    return 0;
}

int loom_metrics_sync(loom_metrics *m, loom_err *err) {
    if (fflush(m->f) != 0 || fsync(fileno(m->f)) != 0)
        return loom_errf(err, "%s: fsync failed: %s", m->path, strerror(errno));
    return 0;
}

void loom_metrics_close(loom_metrics *m) {
    if (!m) return;
    fclose(m->f);
    free(m->path);
    free(m->line.p);
    free(m);
}
