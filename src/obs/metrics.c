/* metrics.jsonl writer. */
#include "loom/metrics.h"

#include <errno.h>
#include <math.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct loom_metrics {
    FILE *f;
    char *path;
    char *line;   /* the line being built */
    size_t len, cap;
};

static void append(loom_metrics *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(loom_metrics *m, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(m->line + m->len, m->cap - m->len, fmt, ap);
        va_end(ap);
        LOOM_CHECK(n >= 0);
        if ((size_t)n < m->cap - m->len) {
            m->len += (size_t)n;
            return;
        }
        m->cap = 2 * m->cap + (size_t)n;
        m->line = loom_realloc(m->line, m->cap);
    }
}

/* Keeps the lines of an existing file whose step <= keep (or that carry no step). */
static int truncate_history(const char *path, int64_t keep, loom_err *err) {
    char *buf = NULL;
    size_t len = 0;
    if (!loom_path_exists(path)) return 0;
    if (loom_read_file(path, (size_t)1 << 34, &buf, &len, err)) return -1;
    char *out = loom_malloc(len + 1);
    size_t olen = 0;
    int changed = 0;
    for (char *line = buf; line < buf + len;) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(buf + len - line);
        json_t *row = json_loadb(line, n, 0, NULL);
        json_t *step = json_object_get(row, "step");
        int drop = !row || (json_is_integer(step) && json_integer_value(step) > keep);
        json_decref(row);
        if (drop) changed = 1;
        else {
            memcpy(out + olen, line, n);
            olen += n;
            out[olen++] = '\n';
        }
        line += n + 1;
    }
    int rc = changed ? loom_write_file_atomic(path, out, olen, err) : 0;
    free(out);
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
    m->cap = 1024;
    m->line = loom_malloc(m->cap);
    *out = m;
    return 0;
}

void loom_metrics_begin(loom_metrics *m) {
    m->len = 0;
    m->line[0] = 0;
}

static void key(loom_metrics *m, const char *k) { append(m, "%s\"%s\":", m->len ? "," : "{", k); }

void loom_metrics_int(loom_metrics *m, const char *k, int64_t v) {
    key(m, k);
    append(m, "%lld", (long long)v);
}

void loom_metrics_real(loom_metrics *m, const char *k, double v) {
    LOOM_CHECK(isfinite(v));
    key(m, k);
    append(m, "%.17g", v);
}

void loom_metrics_reals(loom_metrics *m, const char *k, const double *v, int n, int stride) {
    key(m, k);
    for (int i = 0; i < n; i++) {
        LOOM_CHECK(isfinite(v[(size_t)i * (size_t)stride]));
        append(m, "%s%.17g", i ? "," : "[", v[(size_t)i * (size_t)stride]);
    }
    append(m, "%s", n ? "]" : "[]");
}

int loom_metrics_end(loom_metrics *m, loom_err *err) {
    append(m, "%s\n", m->len ? "}" : "{}");
    int bad = fwrite(m->line, 1, m->len, m->f) != m->len || fflush(m->f) != 0;
    if (bad) return loom_errf(err, "%s: write failed: %s", m->path, strerror(errno));
    return 0;
}

void loom_metrics_close(loom_metrics *m) {
    if (!m) return;
    fclose(m->f);
    free(m->path);
    free(m->line);
    free(m);
}
