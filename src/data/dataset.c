/* A dataset: a directory with manifest.jsonl, one JSON object per line, one line per shard.
 * Only shards listed in the manifest are read (a shard file without a line is ignored, which
 * is what makes appending safe). Each listed shard is fully validated and its SHA-256 must
 * match the manifest. */
#define _GNU_SOURCE
#include "data/data_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MANIFEST_MAX_BYTES ((size_t)256 << 20)

typedef struct entry {
    char *shard, *sha256, *source, *recipe, *created;
    uint64_t tokens, docs;
    int line;
} entry;

struct loom_dataset {
    char *dir;
    int n;
    entry *entries;      /* (n) */
    loom_shard **shards; /* (n) */
    uint32_t vocab;
    uint64_t n_tokens;
};

static int is_hex64(const char *s) {
    if (strlen(s) != 64) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    return 1;
}

/* a plain file name inside the directory: no path separators, not hidden, not ".." */
static int is_plain_name(const char *s) {
    if (!*s || s[0] == '.' || strlen(s) > 255) return 0;
    for (const char *p = s; *p; p++)
        if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20) return 0;
    return 1;
}

static int get_string(json_t *obj, const char *key, int required, char **out, const char *where,
                      loom_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return loom_errf(err, "%s: missing key \"%s\"", where, key);
        *out = loom_strdup("");
        return 0;
    }
    if (!json_is_string(v)) return loom_errf(err, "%s: \"%s\" must be a string", where, key);
    *out = loom_strdup(json_string_value(v));
    return 0;
}

static int get_count(json_t *obj, const char *key, uint64_t *out, const char *where,
                     loom_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) return loom_errf(err, "%s: missing key \"%s\"", where, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return loom_errf(err, "%s: \"%s\" must be a non-negative integer", where, key);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static void entry_free(entry *e) {
    free(e->shard);
    free(e->sha256);
    free(e->source);
    free(e->recipe);
    free(e->created);
}

static int parse_line(const char *text, size_t len, const char *where, entry *e,
                      loom_err *err) {
    memset(e, 0, sizeof *e);
    json_error_t je;
    json_t *obj = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!obj) return loom_errf(err, "%s: invalid JSON at column %d: %s", where, je.column, je.text);
    int rc = -1;
    if (!json_is_object(obj)) {
        loom_errf(err, "%s: expected a JSON object", where);
        goto done;
    }
    if (get_string(obj, "shard", 1, &e->shard, where, err) ||
        get_string(obj, "sha256", 1, &e->sha256, where, err) ||
        get_string(obj, "source", 0, &e->source, where, err) ||
        get_string(obj, "recipe", 0, &e->recipe, where, err) ||
        get_string(obj, "created", 0, &e->created, where, err) ||
        get_count(obj, "tokens", &e->tokens, where, err) ||
        get_count(obj, "docs", &e->docs, where, err))
        goto done;
    if (!is_plain_name(e->shard)) {
        loom_errf(err, "%s: shard \"%s\" is not a plain file name in the directory", where, e->shard);
        goto done;
    }
    if (!is_hex64(e->sha256)) {
        loom_errf(err, "%s: sha256 \"%s\" is not 64 lowercase hex digits", where, e->sha256);
        goto done;
    }
    rc = 0;
done:
    json_decref(obj);
    if (rc != 0) entry_free(e);
    return rc;
}

void loom_dataset_close(loom_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        loom_shard_close(d->shards[i]);
        entry_free(&d->entries[i]);
    }
    free(d->shards);
    free(d->entries);
    free(d->dir);
    free(d);
}

/* Parses manifest.jsonl into d->entries (shards not opened yet). */
static int read_manifest(loom_dataset *d, const char *mpath, loom_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (loom_read_file(mpath, MANIFEST_MAX_BYTES, &text, &len, err) != 0) return -1;
    int cap = 0, line = 0;
    size_t pos = 0;
    while (pos < len) {
        line++;
        const char *start = text + pos;
        const char *nl = memchr(start, '\n', len - pos);
        if (!nl) {
            /* an append in progress (or a crash mid-append): the line is not complete */
            loom_warn("%s:%d: ignoring an unterminated last line (incomplete append)", mpath, line);
            break;
        }
        size_t n = (size_t)(nl - start);
        pos += n + 1;
        char where[4300];
        snprintf(where, sizeof where, "%s:%d", mpath, line);
        int blank = 1;
        for (size_t i = 0; i < n; i++)
            if (start[i] != ' ' && start[i] != '\t' && start[i] != '\r') blank = 0;
        if (blank) {
            free(text);
            return loom_errf(err, "%s: empty line", where);
        }
        entry e;
        if (parse_line(start, n, where, &e, err) != 0) {
            free(text);
            return -1;
        }
        e.line = line;
        for (int i = 0; i < d->n; i++)
            if (!strcmp(d->entries[i].shard, e.shard)) {
                loom_errf(err, "%s: shard \"%s\" is listed twice (first on line %d)", where,
                          e.shard, d->entries[i].line);
                entry_free(&e);
                free(text);
                return -1;
            }
        if (d->n == cap) {
            cap = cap ? 2 * cap : 16;
            d->entries = loom_realloc(d->entries, (size_t)cap * sizeof *d->entries);
            d->shards = loom_realloc(d->shards, (size_t)cap * sizeof *d->shards);
        }
        d->shards[d->n] = NULL;
        d->entries[d->n++] = e;
    }
    free(text);
    return 0;
}

int loom_dataset_open(const char *dir, loom_dataset **out, loom_err *err) {
    *out = NULL;
    if (!loom_is_dir(dir))
        return loom_errf(err, "%s: dataset directory does not exist", dir);
    char mpath[4200];
    if (snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", dir) >= (int)sizeof mpath)
        return loom_errf(err, "%s: path too long", dir);
    if (!loom_path_exists(mpath)) return loom_errf(err, "%s: no manifest (missing file)", mpath);
    loom_dataset *d = loom_calloc(1, sizeof *d);
    d->dir = loom_strdup(dir);
    if (read_manifest(d, mpath, err) != 0) goto fail;
    for (int i = 0; i < d->n; i++) {
        const entry *e = &d->entries[i];
        char spath[4500], sha[65];
        if (snprintf(spath, sizeof spath, "%s/%s", dir, e->shard) >= (int)sizeof spath) {
            loom_errf(err, "%s:%d: shard path too long", mpath, e->line);
            goto fail;
        }
        if (loom_shard_open(spath, &d->shards[i], err) != 0) {
            loom_err_prefix(err, "%s:%d", mpath, e->line);
            goto fail;
        }
        if (loom_sha256_file(spath, sha, err) != 0) goto fail;
        if (strcmp(sha, e->sha256) != 0) {
            loom_errf(err, "%s: sha256 mismatch: manifest.jsonl:%d says %s, the file has %s",
                      spath, e->line, e->sha256, sha);
            goto fail;
        }
        const loom_shard *s = d->shards[i];
        if (loom_shard_num_tokens(s) != e->tokens || loom_shard_num_docs(s) != e->docs) {
            loom_errf(err,
                      "%s: manifest.jsonl:%d says %llu tokens / %llu docs, the shard has "
                      "%llu / %llu",
                      spath, e->line, (unsigned long long)e->tokens, (unsigned long long)e->docs,
                      (unsigned long long)loom_shard_num_tokens(s),
                      (unsigned long long)loom_shard_num_docs(s));
            goto fail;
        }
        if (i == 0) d->vocab = loom_shard_vocab_size(s);
        else if (loom_shard_vocab_size(s) != d->vocab) {
            loom_errf(err, "%s: vocab_size %u differs from the dataset's first shard (%u)", spath,
                      loom_shard_vocab_size(s), d->vocab);
            goto fail;
        }
        d->n_tokens += loom_shard_num_tokens(s);
    }
    *out = d;
    return 0;
fail:
    loom_dataset_close(d);
    return -1;
}

int loom_dataset_num_shards(const loom_dataset *d) { return d->n; }
const loom_shard *loom_dataset_shard(const loom_dataset *d, int i) {
    LOOM_CHECK(i >= 0 && i < d->n);
    return d->shards[i];
}
uint32_t loom_dataset_vocab_size(const loom_dataset *d) { return d->vocab; }
uint64_t loom_dataset_num_tokens(const loom_dataset *d) { return d->n_tokens; }
const char *loom_dataset_dir(const loom_dataset *d) { return d->dir; }

loom_manifest_entry loom_dataset_entry(const loom_dataset *d, int i) {
    LOOM_CHECK(i >= 0 && i < d->n);
    const entry *e = &d->entries[i];
    loom_manifest_entry m = {e->shard, e->sha256, e->source, e->recipe, e->created,
                             e->tokens, e->docs, e->line};
    return m;
}
