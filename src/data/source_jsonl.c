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

/* Appends the chat document cd (its text and segments) to the docs' last document, or makes
 * it a new one (append 0). */
static void add_chat_doc(loom_docs *d, const loom_chat_doc *cd, int fi, int append) {
    uint64_t base = 0;
    if (append) { /* the arena is contiguous: the last document grows by cd's bytes */
        loom_doc *last = &d->v[d->n - 1];
        LOOM_CHECK(last->off + last->len == d->arena_len);
        base = last->len;
        loom_docs_put(d, cd->text, cd->len);
        last->len += cd->len;
    } else {
        loom_docs_add(d, cd->text, cd->len, -1, fi);
        d->v[d->n - 1].seg0 = d->n_segs;
    }
    if (d->n_segs + cd->n_seg > d->cap_segs) {
        d->cap_segs = (d->n_segs + cd->n_seg) * 2;
        d->segs = loom_realloc(d->segs, d->cap_segs * sizeof *d->segs);
    }
    for (size_t k = 0; k < cd->n_seg; k++)
        d->segs[d->n_segs + k] = (loom_chat_seg){cd->seg[k].end + base, cd->seg[k].train};
    d->v[d->n - 1].n_seg += (uint32_t)cd->n_seg;
    d->n_segs += cd->n_seg;
}

/* The messages of one half of a preference row: prompt then completion, each a messages array
 * or a string (the prompt's a user message, the completion's an assistant message). New
 * reference, or NULL with the reason in why. */
static json_t *pref_messages(json_t *prompt, json_t *completion, const char *key, char *why,
                             size_t why_size) {
    json_t *msgs = json_array();
    json_t *parts[2] = {prompt, completion};
    const char *roles[2] = {"user", "assistant"}, *names[2] = {"prompt", key};
    for (int i = 0; i < 2; i++) {
        if (json_is_string(parts[i])) {
            json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", roles[i], "content",
                                                  parts[i]));
        } else if (json_is_array(parts[i])) {
            json_array_extend(msgs, parts[i]);
        } else {
            snprintf(why, why_size, "field \"%s\" is not a string or a list of messages",
                     names[i]);
            json_decref(msgs);
            return NULL;
        }
    }
    return msgs;
}

/* A preference row {"prompt", "chosen", "rejected"}: both conversations rendered (TRL's
 * standard format, three strings: prompt + completion as plain text, the completion trained
 * on; else the chat template, as kind: chat) into ONE document, the chosen conversation's
 * segments first (pair_seg of them), so that filters and dedup keep or drop the pair whole.
 * 0, or -1 with the reason in why. */
static int add_preference(loom_read_ctx *c, json_t *o, int fi, char *why, size_t why_size) {
    json_t *prompt = json_object_get(o, "prompt");
    const char *keys[2] = {"chosen", "rejected"};
    json_t *comp[2] = {json_object_get(o, "chosen"), json_object_get(o, "rejected")};
    if (!prompt) return snprintf(why, why_size, "no field \"prompt\""), -1;
    for (int h = 0; h < 2; h++)
        if (!comp[h]) return snprintf(why, why_size, "no field \"%s\"", keys[h]), -1;
    const int standard = json_is_string(prompt) && json_is_string(comp[0]) &&
                         json_is_string(comp[1]);
    loom_chat_doc cd[2];
    memset(cd, 0, sizeof cd);
    int rc = 0;
    for (int h = 0; h < 2 && rc == 0; h++) {
        if (standard) {
            const char *t[2] = {json_string_value(prompt), json_string_value(comp[h])};
            const size_t n[2] = {json_string_length(prompt), json_string_length(comp[h])};
            if (n[1] == 0) {
                snprintf(why, why_size, "field \"%s\" is empty", keys[h]);
                rc = -1;
                break;
            }
            cd[h].text = loom_malloc(n[0] + n[1] + 1);
            memcpy(cd[h].text, t[0], n[0]);
            memcpy(cd[h].text + n[0], t[1], n[1]);
            cd[h].len = n[0] + n[1];
            cd[h].seg = loom_malloc(2 * sizeof *cd[h].seg);
            cd[h].seg[0] = (loom_chat_seg){n[0], 0};
            cd[h].seg[1] = (loom_chat_seg){n[0] + n[1], 1};
            cd[h].n_seg = 2;
            if (n[0] == 0) cd[h].seg[0] = cd[h].seg[1], cd[h].n_seg = 1;
            continue;
        }
        json_t *msgs = pref_messages(prompt, comp[h], keys[h], why, why_size);
        char inner[560];
        if (!msgs) rc = -1;
        else if (loom_chat_render_tools(c->chat, msgs, json_object_get(o, "tools"), &cd[h], inner,
                                        sizeof inner) != 0) {
            snprintf(why, why_size, "%s: %.560s", keys[h], inner);
            rc = -1;
        }
        json_decref(msgs);
    }
    if (rc == 0) {
        add_chat_doc(c->docs, &cd[0], fi, 0);
        add_chat_doc(c->docs, &cd[1], fi, 1);
        c->docs->v[c->docs->n - 1].pair_seg = (uint32_t)cd[0].n_seg;
    }
    loom_chat_doc_free(&cd[0]);
    loom_chat_doc_free(&cd[1]);
    return rc;
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
        } else if (s->preference) {
            add_preference(c, o, fi, why, sizeof why);
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
