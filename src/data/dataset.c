/* A dataset: a directory with manifest.jsonl, one JSON object per line, one line per shard.
 * Only shards listed in the manifest are read (a shard file without a line is ignored, which
 * is what makes appending safe). Each listed shard is fully validated and its SHA-256 must
 * match the manifest. loom_dataset_refresh picks up lines appended since the last read: the
 * bytes already read must be unchanged (the manifest is append-only), and an unterminated
 * last line is an append in progress, read once it is complete. */
#define _GNU_SOURCE
#include "data/data_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MANIFEST_MAX_BYTES ((size_t)256 << 20)

typedef struct entry {
    char *shard, *sha256, *source, *recipe, *created;
    uint64_t tokens, docs;
    double weight, repeat_cap;
    int line;
} entry;

struct loom_dataset {
    char *dir;
    char *mpath;         /* dir/manifest.jsonl */
    int n, cap;
    entry *entries;      /* (n) */
    loom_shard **shards; /* (n) */
    uint32_t vocab;
    uint64_t n_tokens;
    /* what has been read of the manifest: the complete lines in [0, read_bytes) */
    size_t read_bytes;
    char read_sha[65];   /* SHA-256 of those bytes: they must never change */
    int have_stat;       /* the stat below describes the file as last read completely */
    struct stat st;
    size_t warned_at;    /* offset of the unterminated line last warned about (+1) */
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

/* optional number >= lo (and > lo when strict); absent or null gives def */
static int get_number(json_t *obj, const char *key, double def, double lo, int strict,
                      double *out, const char *where, loom_err *err) {
    json_t *v = json_object_get(obj, key);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return loom_errf(err, "%s: \"%s\" must be a number", where, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || (strict && x == lo) || x > 1e15)
        return loom_errf(err, "%s: \"%s\" = %g is out of range (%s %g)", where, key, x,
                         strict ? ">" : ">=", lo);
    *out = x;
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
        get_count(obj, "docs", &e->docs, where, err) ||
        get_number(obj, "weight", 1.0, 0.0, 1, &e->weight, where, err) ||
        get_number(obj, "repeat_cap", 0.0, 0.0, 0, &e->repeat_cap, where, err))
        goto done;
    if (!is_plain_name(e->shard)) {
        loom_errf(err, "%s: shard \"%s\" is not a plain file name in the directory", where, e->shard);
        goto done;
    }
    if (!is_hex64(e->sha256)) {
        loom_errf(err, "%s: sha256 \"%s\" is not 64 lowercase hex digits", where, e->sha256);
        goto done;
    }
    if (*e->recipe && !is_hex64(e->recipe)) {
        loom_errf(err, "%s: recipe \"%.100s\" is not a SHA-256 (64 lowercase hex digits)", where,
                  e->recipe);
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
    free(d->mpath);
    free(d->dir);
    free(d);
}

/* Opens and verifies the shard of e (a parsed line) and appends both to d. */
static int add_entry(loom_dataset *d, entry *e, loom_err *err) {
    const char *mpath = d->mpath;
    for (int i = 0; i < d->n; i++) {
        const entry *o = &d->entries[i];
        if (!strcmp(o->shard, e->shard))
            return loom_errf(err, "%s:%d: shard \"%s\" is listed twice (first on line %d)", mpath,
                             e->line, e->shard, o->line);
        /* the loader mixes sources by these: one value per source */
        if (!strcmp(o->source, e->source) && (o->weight != e->weight || o->repeat_cap != e->repeat_cap))
            return loom_errf(err,
                             "%s:%d: source \"%s\" has weight %g, repeat_cap %g here but weight "
                             "%g, repeat_cap %g on line %d; every line of a source must agree",
                             mpath, e->line, e->source, e->weight, e->repeat_cap, o->weight,
                             o->repeat_cap, o->line);
    }
    char spath[4500], sha[65];
    if (snprintf(spath, sizeof spath, "%s/%s", d->dir, e->shard) >= (int)sizeof spath)
        return loom_errf(err, "%s:%d: shard path too long", mpath, e->line);
    loom_shard *s = NULL;
    if (loom_shard_open(spath, &s, err) != 0)
        return loom_err_prefix(err, "%s:%d", mpath, e->line);
    int rc = -1;
    if (loom_sha256_file(spath, sha, err) != 0) goto done;
    if (strcmp(sha, e->sha256) != 0) {
        loom_errf(err, "%s: sha256 mismatch: manifest.jsonl:%d says %s, the file has %s", spath,
                  e->line, e->sha256, sha);
        goto done;
    }
    if (loom_shard_num_tokens(s) != e->tokens || loom_shard_num_docs(s) != e->docs) {
        loom_errf(err,
                  "%s: manifest.jsonl:%d says %llu tokens / %llu docs, the shard has %llu / %llu",
                  spath, e->line, (unsigned long long)e->tokens, (unsigned long long)e->docs,
                  (unsigned long long)loom_shard_num_tokens(s),
                  (unsigned long long)loom_shard_num_docs(s));
        goto done;
    }
    if (d->n > 0 && loom_shard_vocab_size(s) != d->vocab) {
        loom_errf(err, "%s: vocab_size %u differs from the dataset's first shard (%u)", spath,
                  loom_shard_vocab_size(s), d->vocab);
        goto done;
    }
    if (d->n > 0 && strcmp(loom_shard_tokenizer_id(s), loom_shard_tokenizer_id(d->shards[0]))) {
        loom_errf(err, "%s: tokenizer_id %s differs from the dataset's first shard (%s)", spath,
                  loom_shard_tokenizer_id(s), loom_shard_tokenizer_id(d->shards[0]));
        goto done;
    }
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 16;
        d->entries = loom_realloc(d->entries, (size_t)d->cap * sizeof *d->entries);
        d->shards = loom_realloc(d->shards, (size_t)d->cap * sizeof *d->shards);
    }
    if (d->n == 0) d->vocab = loom_shard_vocab_size(s);
    d->n_tokens += loom_shard_num_tokens(s);
    d->shards[d->n] = s;
    d->entries[d->n++] = *e;
    s = NULL;
    rc = 0;
done:
    loom_shard_close(s);
    return rc;
}

static int same_file_state(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

int loom_dataset_refresh(loom_dataset *d, int *n_added, loom_err *err) {
    const char *mpath = d->mpath;
    *n_added = 0;
    struct stat st;
    if (stat(mpath, &st) != 0)
        return loom_errf(err, "%s: cannot stat the manifest: %s", mpath, strerror(errno));
    if (d->have_stat && same_file_state(&st, &d->st)) return 0; /* unchanged: the cheap path */
    char *text = NULL;
    size_t len = 0;
    if (loom_read_file(mpath, MANIFEST_MAX_BYTES, &text, &len, err) != 0) return -1;
    int rc = -1, complete = 1;
    if (len < d->read_bytes) {
        loom_errf(err, "%s: the manifest shrank from %zu to %zu bytes; it must only be appended to",
                  mpath, d->read_bytes, len);
        goto done;
    }
    if (d->read_bytes > 0) {
        char sha[65];
        loom_sha256_hex(text, d->read_bytes, sha);
        if (strcmp(sha, d->read_sha) != 0) {
            loom_errf(err, "%s: bytes before offset %zu (the %d lines already read) changed; the "
                           "manifest must only be appended to", mpath, d->read_bytes, d->n);
            goto done;
        }
    }
    size_t pos = d->read_bytes;
    int line = d->n;
    while (pos < len) {
        line++;
        const char *start = text + pos;
        const char *nl = memchr(start, '\n', len - pos);
        if (!nl) {
            /* an append in progress (or a crash mid-append): the line is not complete */
            if (d->warned_at != pos + 1)
                loom_warn("%s:%d: ignoring an unterminated last line (incomplete append)", mpath,
                          line);
            d->warned_at = pos + 1;
            complete = 0;
            break;
        }
        size_t n = (size_t)(nl - start);
        char where[4300];
        snprintf(where, sizeof where, "%s:%d", mpath, line);
        int blank = 1;
        for (size_t i = 0; i < n; i++)
            if (start[i] != ' ' && start[i] != '\t' && start[i] != '\r') blank = 0;
        if (blank) {
            loom_errf(err, "%s: empty line", where);
            goto done;
        }
        entry e;
        if (parse_line(start, n, where, &e, err) != 0) goto done;
        e.line = line;
        if (add_entry(d, &e, err) != 0) {
            entry_free(&e);
            goto done;
        }
        pos += n + 1;
        d->read_bytes = pos;
        (*n_added)++;
    }
    rc = 0;
done:
    if (d->read_bytes > 0) loom_sha256_hex(text, d->read_bytes, d->read_sha);
    /* remember the file state only when everything in it was read: anything else (an error,
     * a line being appended) is looked at again next time */
    d->have_stat = rc == 0 && complete;
    if (d->have_stat) d->st = st;
    free(text);
    return rc;
}

int loom_dataset_open(const char *dir, loom_dataset **out, loom_err *err) {
    *out = NULL;
    if (loom_path_check("dataset directory", dir, LOOM_DIR_PATH_MAX, err)) return -1;
    if (!loom_is_dir(dir))
        return loom_errf(err, "%s: dataset directory does not exist", dir);
    char mpath[4200];
    loom_pathf(mpath, sizeof mpath, "%s/manifest.jsonl", dir); /* fits: dir is bounded */
    if (!loom_path_exists(mpath)) return loom_errf(err, "%s: no manifest (missing file)", mpath);
    loom_dataset *d = loom_calloc(1, sizeof *d);
    d->dir = loom_strdup(dir);
    d->mpath = loom_strdup(mpath);
    int added = 0;
    if (loom_dataset_refresh(d, &added, err) != 0) {
        loom_dataset_close(d);
        return -1;
    }
    *out = d;
    return 0;
}

int loom_dataset_num_shards(const loom_dataset *d) { return d->n; }
const loom_shard *loom_dataset_shard(const loom_dataset *d, int i) {
    LOOM_CHECK(i >= 0 && i < d->n);
    return d->shards[i];
}
uint32_t loom_dataset_vocab_size(const loom_dataset *d) { return d->vocab; }
const char *loom_dataset_tokenizer_id(const loom_dataset *d) {
    return d->n ? loom_shard_tokenizer_id(d->shards[0]) : NULL;
}
uint64_t loom_dataset_num_tokens(const loom_dataset *d) { return d->n_tokens; }
const char *loom_dataset_dir(const loom_dataset *d) { return d->dir; }

loom_manifest_entry loom_dataset_entry(const loom_dataset *d, int i) {
    LOOM_CHECK(i >= 0 && i < d->n);
    const entry *e = &d->entries[i];
    loom_manifest_entry m = {e->shard, e->sha256, e->source, e->recipe, e->created,
                             e->tokens, e->docs, e->line, e->weight, e->repeat_cap};
    return m;
}
