/* loom synth: the content-hash cache (docs/synth.md).
 * DIR/generations.jsonl: {"k": key, "text" | "hex": output, "tokens": n}, key = SHA-256 of
 * (the generator's identity and settings, the sampling seed unless greedy, the prompt);
 * DIR/validations.jsonl: {"k": key, "ok", "message"[, "score"]}, key = SHA-256 of (the
 * validator's settings and what they name: the command's files, the scoring checkpoint; the
 * output). Appended by rank 0 after every round (flushed, fsynced), so an interrupted run
 * resumes from its last round; a torn last line is skipped. Entries are never rewritten: a
 * changed setting makes new keys. */
#define _GNU_SOURCE
#include "synth/synth_internal.h"

#include <errno.h>
#include <unistd.h>


void synth_sha_hex_parts(char hex[65], const char *a, const char *b, size_t bn) {
    const size_t an = strlen(a);
    char *buf = loom_malloc(an + 1 + bn + 1);
    memcpy(buf, a, an);
    buf[an] = '\n';
    if (bn) memcpy(buf + an + 1, b, bn);
    loom_sha256_hex(buf, an + 1 + bn, hex);
    free(buf);
}

static int cache_load(cache *c, const char *name, json_t *into, int *torn, loom_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->dir, name);
    if (access(path, F_OK)) return 0;
    char *text = NULL;
    size_t len = 0;
    if (loom_read_file(path, (size_t)1 << 34, &text, &len, err)) return -1;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        const size_t e = nl ? (size_t)(nl - text) : len;
        json_t *o = json_loadb(text + pos, e - pos, 0, NULL);
        json_t *k = json_object_get(o, "k");
        if (nl && json_is_string(k)) json_object_set(into, json_string_value(k), o);
        else c->skipped++;
        json_decref(o);
        pos = e + 1;
    }
    *torn = len > 0 && text[len - 1] != '\n';
    free(text);
    return 0;
}

static FILE *cache_append(const cache *c, const char *name, loom_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->dir, name);
    FILE *f = fopen(path, "a");
    if (!f) loom_errf(err, "%s: cannot append: %s", path, strerror(errno));
    return f;
}

int synth_cache_open(cache *c, int writer, loom_err *err) {
    c->gen = json_object();
    c->val = json_object();
    if (writer && loom_mkdirs(c->dir, err)) return -1;
    if (cache_load(c, "generations.jsonl", c->gen, &c->torn[0], err) ||
        cache_load(c, "validations.jsonl", c->val, &c->torn[1], err))
        return -1;
    if (writer && (!(c->fg = cache_append(c, "generations.jsonl", err)) ||
                   !(c->fv = cache_append(c, "validations.jsonl", err))))
        return -1;
    if (c->fg && c->torn[0]) fputc('\n', c->fg); /* appends start on a line of their own */
    if (c->fv && c->torn[1]) fputc('\n', c->fv);
    return 0;
}

void synth_cache_close(cache *c) {
    if (c->fg) fclose(c->fg);
    if (c->fv) fclose(c->fv);
    json_decref(c->gen);
    json_decref(c->val);
}

static void cache_put(cache *c, json_t *table, FILE *f, json_t *entry) {
    json_object_set(table, json_string_value(json_object_get(entry, "k")), entry);
    if (!f) return;
    char *line = json_dumps(entry, JSON_COMPACT);
    fprintf(f, "%s\n", line);
    free(line);
}

int synth_cache_sync(cache *c, loom_err *err) {
    FILE *fs[2] = {c->fg, c->fv};
    for (int i = 0; i < 2; i++)
        if (fs[i] && (fflush(fs[i]) || fsync(fileno(fs[i]))))
            return loom_errf(err, "%s: cache write failed: %s", c->dir, strerror(errno));
    return 0;
}

/* a text as a cache value: "text" when it is valid UTF-8, "hex" otherwise */
static void text_to_json(json_t *o, const char *t, size_t n) {
    size_t ml;
    char *clean = loom_utf8_sanitize(t, n, &ml);
    if (ml == n && !memcmp(clean, t, n)) {
        json_object_set_new(o, "text", json_stringn(t, n));
    } else {
        char *h = loom_malloc(2 * n + 1);
        for (size_t i = 0; i < n; i++) snprintf(h + 2 * i, 3, "%02x", (unsigned char)t[i]);
        json_object_set_new(o, "hex", json_stringn(h, 2 * n));
        free(h);
    }
    free(clean);
}

int synth_text_from_json(json_t *o, char **t, size_t *n) {
    json_t *s = json_object_get(o, "text"), *h = json_object_get(o, "hex");
    if (json_is_string(s)) {
        *n = json_string_length(s);
        *t = loom_malloc(*n + 1);
        memcpy(*t, json_string_value(s), *n + 1);
        return 0;
    }
    if (!json_is_string(h) || json_string_length(h) % 2) return -1;
    *n = json_string_length(h) / 2;
    *t = loom_malloc(*n + 1);
    const char *x = json_string_value(h);
    for (size_t i = 0; i < *n; i++) {
        unsigned v;
        if (sscanf(x + 2 * i, "%2x", &v) != 1) {
            free(*t);
            return -1;
        }
        (*t)[i] = (char)v;
    }
    (*t)[*n] = 0;
    return 0;
}

/* an item's new generation and validator verdicts into the cache, once per attempt */
void synth_cache_add(pipeline *P, item *it) {
    if (!P->C.on || it->cached) return;
    it->cached = 1;
    if (it->gen_ok && !it->gen_hit && it->gkey[0]) {
        json_t *e = json_pack("{s:s,s:i}", "k", it->gkey, "tokens", it->tokens);
        text_to_json(e, it->text, it->tlen);
        cache_put(&P->C, P->C.gen, P->C.fg, e);
        json_decref(e);
    }
    size_t j;
    json_t *e;
    json_array_foreach(it->vfresh, j, e) cache_put(&P->C, P->C.val, P->C.fv, e);
}
