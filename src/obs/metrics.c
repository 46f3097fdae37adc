/* metrics.jsonl writer. */
#include "loom/metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct loom_metrics {
    FILE *f;
    char *path;
};

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
    *out = m;
    return 0;
}

int loom_metrics_write(loom_metrics *m, json_t *row, loom_err *err) {
    char *s = json_dumps(row, JSON_COMPACT | JSON_REAL_PRECISION(17));
    LOOM_CHECK(s != NULL);
    int bad = fprintf(m->f, "%s\n", s) < 0 || fflush(m->f) != 0;
    free(s);
    if (bad) return loom_errf(err, "%s: write failed: %s", m->path, strerror(errno));
    return 0;
}

void loom_metrics_close(loom_metrics *m) {
    if (!m) return;
    fclose(m->f);
    free(m->path);
    free(m);
}
