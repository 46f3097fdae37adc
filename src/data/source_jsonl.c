/* kind: jsonl -- one JSON object per line; the document is the string at `text_field`.
 * Files ending in .zst are decompressed as a stream (libzstd), so a file never has to fit in
 * memory. A bad line (invalid JSON, not an object, no string field, longer than
 * max_line_bytes) fails the build naming FILE:LINE, or with `on_error: skip` is skipped,
 * counted and the first few are reported by FILE:LINE. Blank lines are ignored. */
#define _GNU_SOURCE
#include "data/build_source.h"
#include "loom/chat.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#define WARN_FIRST 5

typedef struct stream {
    int fd;
    int zst;
    ZSTD_DCtx *dctx;
    uint8_t *in;           /* compressed input buffer (zst) */
    size_t in_cap;
    ZSTD_inBuffer zin;
    size_t last_ret;       /* 0 when the last zstd frame was complete */
    int eof;
    const char *path;
} stream;

/* Reads up to cap decompressed bytes; 0 at the end; -1 on error. */
static ssize_t stream_read(stream *s, uint8_t *out, size_t cap, loom_err *err) {
    if (!s->zst) {
        for (;;) {
            ssize_t r = read(s->fd, out, cap);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return loom_errf(err, "%s: read failed: %s", s->path, strerror(errno));
            return r;
        }
    }
    ZSTD_outBuffer zout = {out, cap, 0};
    while (zout.pos == 0) {
        if (s->zin.pos == s->zin.size) {
            if (s->eof) {
                if (s->last_ret != 0)
                    return loom_errf(err, "%s: truncated zstd stream (the last frame is incomplete)",
                                     s->path);
                return 0;
            }
            ssize_t r;
            do r = read(s->fd, s->in, s->in_cap); while (r < 0 && errno == EINTR);
            if (r < 0) return loom_errf(err, "%s: read failed: %s", s->path, strerror(errno));
            if (r == 0) {
                s->eof = 1;
                continue;
            }
            s->zin.src = s->in;
            s->zin.size = (size_t)r;
            s->zin.pos = 0;
        }
        size_t ret = ZSTD_decompressStream(s->dctx, &zout, &s->zin);
        if (ZSTD_isError(ret))
            return loom_errf(err, "%s: zstd: %s (compressed byte ~%zu)", s->path,
                             ZSTD_getErrorName(ret), s->zin.pos);
        s->last_ret = ret;
    }
    return (ssize_t)zout.pos;
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

/* One complete line: adds a document or reports a bad line. Returns -1 only to stop. */
static int handle_line(loom_read_ctx *c, int fi, const char *line, size_t n, uint64_t lineno,
                       int too_long, loom_err *err) {
    const loom_recipe_source *s = c->src;
    const char *path = c->inputs->v[fi].path;
    char why[600];
    why[0] = 0;
    if (too_long) {
        snprintf(why, sizeof why, "line is longer than max_line_bytes (%lld)",
                 (long long)s->max_line_bytes);
    } else {
        size_t i = 0;
        while (i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
        if (i == n) return 0; /* blank */
        json_error_t je;
        json_t *o = json_loadb(line, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
        if (!o) {
            snprintf(why, sizeof why, "invalid JSON at column %d: %s", je.column, je.text);
        } else if (!json_is_object(o)) {
            snprintf(why, sizeof why, "not a JSON object");
        } else if (s->kind == LOOM_SRC_CHAT) {
            json_t *msgs = json_object_get(o, s->messages_field);
            loom_chat_doc cd = {0};
            if (!msgs) {
                snprintf(why, sizeof why, "no field \"%s\"", s->messages_field);
            } else if (loom_chat_render_tools(c->chat, msgs, json_object_get(o, "tools"), &cd, why,
                                              sizeof why) == 0) { /* "tools": their definitions */
                /* the rendered text is the document (filters and dedup see it); its segments
                 * say which bytes are trained on */
                loom_docs *d = c->docs;
                loom_docs_add(d, cd.text, cd.len, -1, fi);
                if (d->n_segs + cd.n_seg > d->cap_segs) {
                    d->cap_segs = (d->n_segs + cd.n_seg) * 2;
                    d->segs = loom_realloc(d->segs, d->cap_segs * sizeof *d->segs);
                }
                memcpy(d->segs + d->n_segs, cd.seg, cd.n_seg * sizeof *cd.seg);
                d->v[d->n - 1].seg0 = d->n_segs;
                d->v[d->n - 1].n_seg = (uint32_t)cd.n_seg;
                d->n_segs += cd.n_seg;
            }
            loom_chat_doc_free(&cd);
        } else {
            json_t *t = json_object_get(o, s->text_field);
            if (!t) snprintf(why, sizeof why, "no field \"%s\"", s->text_field);
            else if (!json_is_string(t)) snprintf(why, sizeof why, "field \"%s\" is not a string", s->text_field);
            else if (json_string_length(t) == 0) c->empty_docs++;
            else loom_docs_add(c->docs, json_string_value(t), json_string_length(t), -1, fi);
        }
        json_decref(o);
    }
    if (!why[0]) return 0;
    if (!s->on_error_skip)
        return loom_errf(err, "%s:%llu: %s (source '%s'; on_error: skip would skip it)", path,
                         (unsigned long long)lineno, why, s->name);
    char where[4200];
    snprintf(where, sizeof where, "%s:%llu", path, (unsigned long long)lineno);
    if (c->bad_lines->count < WARN_FIRST)
        loom_warn("source '%s': skipped bad line %s: %s", s->name, where, why);
    loom_skips_add(c->bad_lines, where, why);
    return 0;
}

int loom_read_jsonl(loom_read_ctx *c, int fi, loom_err *err) {
    const loom_input *f = &c->inputs->v[fi];
    stream st = {0};
    st.path = f->path;
    st.fd = loom_input_open(f, err);
    if (st.fd < 0) return -1;
    st.zst = ends_with(f->path, ".zst");
    if (st.zst) {
        st.dctx = ZSTD_createDCtx();
        LOOM_CHECK(st.dctx != NULL);
        st.in_cap = ZSTD_DStreamInSize();
        st.in = loom_malloc(st.in_cap);
    }
    size_t max = (size_t)c->src->max_line_bytes;
    size_t cap = 1 << 20;
    uint8_t *chunk = loom_malloc(cap);
    char *line = NULL;
    size_t line_n = 0, line_cap = 0;
    int too_long = 0, rc = 0;
    uint64_t lineno = 1;
    for (;;) {
        ssize_t got = stream_read(&st, chunk, cap, err);
        if (got < 0) {
            rc = -1;
            break;
        }
        if (got == 0) {
            if (line_n || too_long) rc = handle_line(c, fi, line, line_n, lineno, too_long, err);
            break;
        }
        const uint8_t *p = chunk, *end = chunk + got;
        while (p < end && rc == 0) {
            const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
            if (!too_long) {
                if (line_n + n > max) {
                    too_long = 1;
                    line_n = 0;
                } else {
                    if (line_n + n + 1 > line_cap) {
                        line_cap = (line_n + n + 1) * 2;
                        if (line_cap > max + 1) line_cap = max + 1;
                        line = loom_realloc(line, line_cap);
                    }
                    memcpy(line + line_n, p, n);
                    line_n += n;
                }
            }
            p += n;
            if (nl) {
                rc = handle_line(c, fi, line, line_n, lineno, too_long, err);
                lineno++;
                line_n = 0;
                too_long = 0;
                p++;
            }
        }
        if (rc) break;
    }
    free(line);
    free(chunk);
    free(st.in);
    if (st.dctx) ZSTD_freeDCtx(st.dctx);
    close(st.fd);
    if (rc && c->src->on_error_skip && st.zst && strstr(err->msg, "zstd")) {
        /* a corrupt compressed file: skip the rest of it, but say so */
        loom_warn("source '%s': %s; the rest of the file is skipped", c->src->name, err->msg);
        char where[4200];
        snprintf(where, sizeof where, "%s:%llu", f->path, (unsigned long long)lineno);
        loom_skips_add(c->bad_lines, where, err->msg);
        return 0;
    }
    return rc;
}
