/* loom synth: seed sources and templates (docs/synth.md). */
#define _GNU_SOURCE
#include "synth/synth_internal.h"

#include <zstd.h>

/* ---- seeds ---------------------------------------------------------------------------- */


static void seeds_add(seeds *s, const char *t, size_t n) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = loom_realloc(s->v, (size_t)s->cap * sizeof *s->v);
        s->len = loom_realloc(s->len, (size_t)s->cap * sizeof *s->len);
    }
    s->v[s->n] = loom_malloc(n + 1);
    memcpy(s->v[s->n], t, n);
    s->v[s->n][n] = 0;
    s->len[s->n++] = n;
}

static int ends_with(const char *s, const char *suf) {
    const size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int read_maybe_zst(const char *path, char **out, size_t *len, loom_err *err) {
    if (loom_read_file(path, (size_t)1 << 31, out, len, err)) return -1;
    if (!ends_with(path, ".zst")) return 0;
    ZSTD_DStream *z = ZSTD_createDStream();
    ZSTD_initDStream(z);
    loom_sbuf b = {0};
    ZSTD_inBuffer in = {*out, *len, 0};
    char tmp[1 << 16];
    int rc = 0;
    while (in.pos < in.size) {
        ZSTD_outBuffer ob = {tmp, sizeof tmp, 0};
        const size_t r = ZSTD_decompressStream(z, &ob, &in);
        if (ZSTD_isError(r)) {
            rc = loom_errf(err, "%s: zstd: %s", path, ZSTD_getErrorName(r));
            break;
        }
        loom_sbuf_append(&b, tmp, ob.pos);
        if (b.len > ((size_t)1 << 31)) {
            rc = loom_errf(err, "%s: decompresses to over 2 GiB", path);
            break;
        }
    }
    ZSTD_freeDStream(z);
    free(*out);
    if (rc) {
        free(b.p);
        return -1;
    }
    *out = b.p ? b.p : loom_calloc(1, 1);
    *len = b.len;
    return 0;
}

/* seeds: [{path, field (jsonl, default text), split (text, default "\n"), limit}] */
int synth_load_seeds(const char *where, json_t *list, seeds *s, loom_err *err) {
    if (!json_is_array(list) || json_array_size(list) == 0)
        return loom_errf(err, "%s: 'seeds' must be a non-empty list of {path: ...}", where);
    size_t i;
    json_t *src;
    json_array_foreach(list, i, src) {
        json_t *p = json_object_get(src, "path");
        if (!json_is_string(p)) return loom_errf(err, "%s: seeds[%zu].path must be a string", where, i);
        const char *path = json_string_value(p);
        json_t *f = json_object_get(src, "field"), *sp = json_object_get(src, "split"),
               *lim = json_object_get(src, "limit");
        if ((f && !json_is_string(f)) || (sp && (!json_is_string(sp) || !json_string_length(sp))) ||
            (lim && !json_is_integer(lim)))
            return loom_errf(err, "%s: seeds[%zu]: field and split must be strings, limit an integer",
                             where, i);
        const long long limit = lim ? json_integer_value(lim) : -1;
        const int before = s->n;
        char *buf = NULL;
        size_t len = 0;
        if (read_maybe_zst(path, &buf, &len, err)) return -1;
        const int jsonl = ends_with(path, ".jsonl") || ends_with(path, ".jsonl.zst");
        const char *sep = sp ? json_string_value(sp) : "\n";
        const size_t sl = strlen(sep);
        size_t pos = 0;
        int line = 0;
        while (pos < len && (limit < 0 || s->n - before < limit)) {
            const char *hit = jsonl ? memchr(buf + pos, '\n', len - pos) : memmem(buf + pos, len - pos, sep, sl);
            const size_t e = hit ? (size_t)(hit - buf) : len;
            line++;
            if (e > pos) {
                if (jsonl) {
                    json_error_t je;
                    json_t *o = json_loadb(buf + pos, e - pos, JSON_REJECT_DUPLICATES, &je);
                    json_t *t = o ? json_object_get(o, f ? json_string_value(f) : "text") : NULL;
                    if (!json_is_string(t)) {
                        json_decref(o);
                        free(buf);
                        return loom_errf(err, "%s:%d: %s", path, line,
                                         o ? "the seed field is missing or not a string" : je.text);
                    }
                    seeds_add(s, json_string_value(t), json_string_length(t));
                    json_decref(o);
                } else {
                    seeds_add(s, buf + pos, e - pos);
                }
            }
            pos = e + (jsonl ? 1 : sl);
        }
        free(buf);
        if (s->n == before) return loom_errf(err, "%s: seeds[%zu] (%s) gives no seeds", where, i, path);
    }
    return 0;
}

/* ---- templates ------------------------------------------------------------------------ */

/* {seed} -> the seed text; {feedback} -> the regeneration note ("" at attempt 1); {{ -> { */
void synth_render(loom_sbuf *out, const char *tpl, const char *seed, size_t seed_len, const char *fb) {
    for (const char *p = tpl; *p;) {
        if (!strncmp(p, "{seed}", 6)) {
            loom_sbuf_append(out, seed, seed_len);
            p += 6;
        } else if (!strncmp(p, "{feedback}", 10)) {
            sb_str(out, fb);
            p += 10;
        } else if (!strncmp(p, "{{", 2) || !strncmp(p, "}}", 2)) {
            loom_sbuf_append(out, p, 1);
            p += 2;
        } else {
            loom_sbuf_append(out, p, 1);
            p++;
        }
    }
}
