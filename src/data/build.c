/* `loom data build RECIPE.yaml`: sources -> documents -> byte tokens -> shards + manifest.
 *
 * Deterministic: files are read in sorted (strcmp) order of their paths, documents are routed
 * to train/val by a hash of their bytes, shards carry no timestamps, so the same recipe and
 * inputs give identical shard bytes. The output directory is built beside the target as
 * OUTPUT.tmp.<pid> and renamed into place at the end; an existing OUTPUT is replaced only
 * when it looks like a previous build (it has train/ or val/ with a manifest.jsonl) or is
 * empty; anything else is refused. */
#define _GNU_SOURCE
#include "data/data_internal.h"
#include "data/recipe.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <ftw.h>
#include <glob.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define INPUT_MAX_BYTES ((size_t)1 << 31)
#define BYTE_VOCAB 256u

/* ---- input files ---- */
typedef struct input_file {
    char *path;
    int source;       /* index into recipe sources */
    uint64_t bytes;
    char sha256[65];
    dev_t dev;
    ino_t ino;
} input_file;

typedef struct file_list {
    input_file *v;
    int n, cap;
} file_list;

static void list_push(file_list *l, const char *path, int source, const struct stat *st) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = loom_realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    input_file *f = &l->v[l->n++];
    memset(f, 0, sizeof *f);
    f->path = loom_strdup(path);
    f->source = source;
    f->dev = st->st_dev;
    f->ino = st->st_ino;
}

static int excluded(const loom_recipe_source *s, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (int i = 0; i < s->n_exclude; i++)
        if (fnmatch(s->exclude[i], base, 0) == 0) return 1;
    return 0;
}

static int cmp_path(const void *a, const void *b) {
    return strcmp(((const input_file *)a)->path, ((const input_file *)b)->path);
}

/* Adds path (a file, or a directory walked recursively; hidden entries are skipped). */
static int collect(const loom_recipe *r, int si, const char *path, int depth, file_list *out,
                   loom_err *err) {
    const loom_recipe_source *s = &r->sources[si];
    struct stat st;
    if (stat(path, &st) != 0)
        return loom_errf(err, "%s:%d: source '%s': cannot read '%s': %s", r->file, s->line,
                         s->name, path, strerror(errno));
    if (S_ISREG(st.st_mode)) {
        if (!excluded(s, path)) list_push(out, path, si, &st);
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) return 0;
    if (depth > 32)
        return loom_errf(err, "%s:%d: source '%s': directories nested too deep at '%s'", r->file,
                         s->line, s->name, path);
    DIR *d = opendir(path);
    if (!d)
        return loom_errf(err, "%s:%d: source '%s': cannot open directory '%s': %s", r->file,
                         s->line, s->name, path, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        size_t n = strlen(path) + strlen(e->d_name) + 2;
        char *child = loom_malloc(n);
        snprintf(child, n, "%s%s%s", path, path[strlen(path) - 1] == '/' ? "" : "/", e->d_name);
        rc = collect(r, si, child, depth + 1, out, err);
        free(child);
    }
    closedir(d);
    return rc;
}

/* All input files of the recipe, sorted per source, each file once (symlinks and repeated
 * matches resolve to one (device, inode)). */
static int collect_inputs(const loom_recipe *r, file_list *all, loom_err *err) {
    for (int si = 0; si < r->n_sources; si++) {
        const loom_recipe_source *s = &r->sources[si];
        file_list l = {0};
        int rc = 0;
        if (strpbrk(s->path, "*?[")) {
            glob_t g;
            int gr = glob(s->path, 0, NULL, &g);
            if (gr == GLOB_NOMATCH)
                rc = loom_errf(err, "%s:%d: source '%s': path '%s' matches no files", r->file,
                               s->line, s->name, s->path);
            else if (gr != 0)
                rc = loom_errf(err, "%s:%d: source '%s': cannot expand '%s'", r->file, s->line,
                               s->name, s->path);
            for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++)
                rc = collect(r, si, g.gl_pathv[i], 0, &l, err);
            if (gr == 0) globfree(&g);
        } else if (!loom_path_exists(s->path)) {
            rc = loom_errf(err, "%s:%d: source '%s': path '%s' does not exist", r->file, s->line,
                           s->name, s->path);
        } else {
            rc = collect(r, si, s->path, 0, &l, err);
        }
        if (rc == 0 && l.n == 0)
            rc = loom_errf(err, "%s:%d: source '%s': no input files under '%s' (after exclude)",
                           r->file, s->line, s->name, s->path);
        if (l.n) qsort(l.v, (size_t)l.n, sizeof *l.v, cmp_path);
        for (int i = 0; i < l.n; i++) {
            int dup = -1;
            for (int j = 0; j < all->n && dup < 0; j++)
                if (all->v[j].dev == l.v[i].dev && all->v[j].ino == l.v[i].ino) dup = j;
            if (dup >= 0 || rc != 0) {
                if (dup >= 0 && all->v[dup].source != si)
                    loom_warn("source '%s': %s was already read by another source; skipped",
                              s->name, l.v[i].path);
                free(l.v[i].path);
                continue;
            }
            if (all->n == all->cap) {
                all->cap = all->cap ? 2 * all->cap : 64;
                all->v = loom_realloc(all->v, (size_t)all->cap * sizeof *all->v);
            }
            all->v[all->n++] = l.v[i];
        }
        free(l.v);
        if (rc) return -1;
    }
    return 0;
}

/* ---- shard writer (one per split) ---- */
typedef struct writer {
    const char *split;   /* "train" / "val" */
    char *dir;
    const loom_recipe *r;
    uint32_t *tokens;    /* (cap) */
    uint64_t *starts;    /* (cap) doc starts of the shard being filled */
    uint64_t cap, fill, n_starts;
    int n_shards;
    uint64_t total_tokens, total_docs, total_pieces;
    char sources[512];   /* comma-separated names of the sources in the current shard */
} writer;

static void note_source(writer *w, const char *name) {
    size_t n = strlen(name), have = strlen(w->sources);
    for (const char *p = w->sources; (p = strstr(p, name)) != NULL; p += n)
        if ((p == w->sources || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return;
    if (have + n + 2 > sizeof w->sources) return; /* very many sources: the list is cut */
    if (have) strcat(w->sources, ",");
    strcat(w->sources, name);
}

static void iso_now(char *buf, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int flush_shard(writer *w, loom_err *err) {
    if (w->fill == 0) return 0;
    char name[64], path[4200], sha[65], created[32];
    snprintf(name, sizeof name, "shard_%05d.bin", w->n_shards);
    if (snprintf(path, sizeof path, "%s/%s", w->dir, name) >= (int)sizeof path)
        return loom_errf(err, "%s: path too long", w->dir);
    loom_shard_spec spec = {BYTE_VOCAB, 1, "byte", w->r->sha256};
    if (loom_shard_write_sha(path, &spec, w->tokens, w->fill, w->starts, w->n_starts, sha, err))
        return -1;
    /* the manifest line is appended only once the shard is durably in place */
    iso_now(created, sizeof created);
    json_t *o = json_object();
    json_object_set_new(o, "shard", json_string(name));
    json_object_set_new(o, "sha256", json_string(sha));
    json_object_set_new(o, "tokens", json_integer((json_int_t)w->fill));
    json_object_set_new(o, "docs", json_integer((json_int_t)w->n_starts));
    json_object_set_new(o, "source", json_string(w->sources));
    json_object_set_new(o, "recipe", json_string(w->r->sha256));
    json_object_set_new(o, "created", json_string(created));
    char *line = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    LOOM_CHECK(line != NULL);
    char mpath[4200];
    loom_pathf(mpath, sizeof mpath, "%s/manifest.jsonl", w->dir);
    int rc = loom_append_line(mpath, line, err);
    free(line);
    if (rc) return -1;
    w->n_shards++;
    w->total_tokens += w->fill;
    w->total_pieces += w->n_starts;
    w->fill = w->n_starts = 0;
    w->sources[0] = 0;
    return 0;
}

/* Appends bytes to the current document (begin = 1 starts a new one). A document that does
 * not fit continues at the start of the next shard (a new doc-index entry there). */
static int writer_add(writer *w, const char *source, const uint8_t *p, size_t len, int begin,
                      loom_err *err) {
    if (begin && len) w->total_docs++;
    while (len > 0) {
        if (w->fill == w->cap && flush_shard(w, err) != 0) return -1;
        if (begin || w->fill == 0) {
            w->starts[w->n_starts++] = w->fill;
            note_source(w, source);
        }
        begin = 0;
        uint64_t room = w->cap - w->fill, n = len < room ? len : room;
        for (uint64_t i = 0; i < n; i++) w->tokens[w->fill + i] = p[i];
        w->fill += n;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* the train/val routing: a hash of the document's bytes, so duplicates land together */
static int is_val(const uint8_t *p, size_t n, double frac) {
    if (frac <= 0) return 0;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    uint64_t u = loom_rng_u64(h, loom_hash_str("loom.data.val_split"), n);
    return (double)(u >> 11) * (1.0 / 9007199254740992.0) < frac;
}

static int add_document(writer *ws, const loom_recipe_source *s, const loom_recipe *r,
                        const uint8_t *p, size_t n, loom_err *err) {
    if (n == 0) return 0;
    writer *w = &ws[is_val(p, n, r->val_fraction)];
    if (writer_add(w, s->name, p, n, 1, err) != 0) return -1;
    if (s->doc_suffix_len &&
        writer_add(w, s->name, (const uint8_t *)s->doc_suffix, s->doc_suffix_len, 0, err) != 0)
        return -1;
    return 0;
}

static int process_file(writer *ws, const loom_recipe *r, input_file *f, loom_err *err) {
    const loom_recipe_source *s = &r->sources[f->source];
    char *text;
    size_t len;
    if (loom_read_file(f->path, INPUT_MAX_BYTES, &text, &len, err) != 0) return -1;
    f->bytes = len;
    loom_sha256_hex(text, len, f->sha256);
    const uint8_t *p = (const uint8_t *)text, *end = p + len;
    int rc = 0;
    if (!s->split) {
        rc = add_document(ws, s, r, p, len, err);
    } else {
        while (rc == 0 && p < end) {
            const uint8_t *q = memmem(p, (size_t)(end - p), s->split, s->split_len);
            size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
            rc = add_document(ws, s, r, p, n, err);
            p += n + (q ? s->split_len : 0);
        }
    }
    free(text);
    return rc;
}

/* ---- dataset.json ---- */
static json_t *jstr(const char *s) {
    json_t *j = json_string(s);
    return j ? j : json_string("<not valid UTF-8>");
}

static int write_dataset_json(const writer *w, const loom_recipe *r, const file_list *files,
                              loom_err *err) {
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string("loom-dataset"));
    json_object_set_new(o, "format_version", json_integer(1));
    json_object_set_new(o, "name", jstr(r->name));
    json_object_set_new(o, "split", json_string(w->split));
    json_t *rec = json_object();
    json_object_set_new(rec, "path", jstr(r->file));
    json_object_set_new(rec, "sha256", json_string(r->sha256));
    json_t *text = json_stringn(r->text, r->text_len);
    json_object_set_new(rec, "text", text ? text : json_null());
    json_object_set_new(o, "recipe", rec);
    json_t *inputs = json_array();
    for (int i = 0; i < files->n; i++) {
        json_t *f = json_object();
        json_object_set_new(f, "source", jstr(r->sources[files->v[i].source].name));
        json_object_set_new(f, "path", jstr(files->v[i].path));
        json_object_set_new(f, "bytes", json_integer((json_int_t)files->v[i].bytes));
        json_object_set_new(f, "sha256", json_string(files->v[i].sha256));
        json_array_append_new(inputs, f);
    }
    json_object_set_new(o, "inputs", inputs);
    json_t *counts = json_object();
    json_object_set_new(counts, "shards", json_integer(w->n_shards));
    json_object_set_new(counts, "tokens", json_integer((json_int_t)w->total_tokens));
    json_object_set_new(counts, "documents", json_integer((json_int_t)w->total_docs));
    json_object_set_new(counts, "doc_index_entries", json_integer((json_int_t)w->total_pieces));
    json_object_set_new(o, "counts", counts);
    json_t *tok = json_object();
    json_object_set_new(tok, "id", json_string("byte"));
    json_object_set_new(tok, "vocab_size", json_integer(BYTE_VOCAB));
    json_object_set_new(o, "tokenizer", tok);
    json_object_set_new(o, "seq_len", json_integer((json_int_t)r->seq_len));
    json_object_set_new(o, "val_fraction", json_real(r->val_fraction));
    json_object_set_new(o, "shard_tokens", json_integer((json_int_t)r->shard_tokens));
    json_object_set_new(o, "loom_version", json_string(LOOM_VERSION));
    char *s = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    LOOM_CHECK(s != NULL);
    char path[4200];
    loom_pathf(path, sizeof path, "%s/dataset.json", w->dir);
    size_t n = strlen(s);
    s = loom_realloc(s, n + 2);
    s[n] = '\n';
    s[n + 1] = 0;
    int rc = loom_write_file_atomic(path, s, n + 1, err);
    free(s);
    return rc;
}

/* ---- output directory ---- */
static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(path);
}

static void remove_tree(const char *path) {
    if (loom_path_exists(path)) nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

static int looks_like_build(const char *out) {
    char p[4200];
    loom_pathf(p, sizeof p, "%s/train/manifest.jsonl", out);
    if (loom_path_exists(p)) return 1;
    loom_pathf(p, sizeof p, "%s/val/manifest.jsonl", out);
    return loom_path_exists(p);
}

int loom_data_build(const char *recipe_path, loom_err *err) {
    loom_recipe r;
    file_list files = {0};
    writer ws[2];
    memset(ws, 0, sizeof ws);
    char out[4096], tmp[4200], old[4200];
    int rc = -1, made_tmp = 0;
    if (loom_recipe_load(recipe_path, &r, err) != 0) goto done;

    if (snprintf(out, sizeof out, "%s", r.output) >= (int)sizeof out) {
        loom_errf(err, "%s: output path too long", recipe_path);
        goto done;
    }
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0;
    if (loom_path_exists(out) && !(loom_is_dir(out) && (looks_like_build(out) || dir_is_empty(out)))) {
        loom_errf(err, "%s: output '%s' exists and is not a loom data build; refusing to replace it",
                  recipe_path, out);
        goto done;
    }
    loom_pathf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    loom_pathf(old, sizeof old, "%s.old.%d", out, (int)getpid());
    if (collect_inputs(&r, &files, err) != 0) goto done;
    remove_tree(tmp);
    if (loom_mkdirs(tmp, err) != 0) goto done;
    made_tmp = 1;
    const char *splits[2] = {"train", "val"};
    for (int i = 0; i < 2; i++) {
        writer *w = &ws[i];
        w->split = splits[i];
        w->r = &r;
        size_t n = strlen(tmp) + 8;
        w->dir = loom_malloc(n);
        snprintf(w->dir, n, "%s/%s", tmp, splits[i]);
        if (loom_mkdirs(w->dir, err) != 0) goto done;
        char mpath[4200];
        loom_pathf(mpath, sizeof mpath, "%s/manifest.jsonl", w->dir);
        if (loom_write_file_atomic(mpath, "", 0, err) != 0) goto done;
        w->cap = (uint64_t)r.shard_tokens;
        w->tokens = loom_malloc((size_t)w->cap * sizeof *w->tokens);
        w->starts = loom_malloc((size_t)w->cap * sizeof *w->starts);
    }
    for (int i = 0; i < files.n; i++)
        if (process_file(ws, &r, &files.v[i], err) != 0) goto done;
    for (int i = 0; i < 2; i++) {
        if (flush_shard(&ws[i], err) != 0) goto done;
        /* the directory fsync after the shard renames made them durable; now the summary */
        if (write_dataset_json(&ws[i], &r, &files, err) != 0) goto done;
    }
    if (ws[0].total_tokens == 0) {
        loom_errf(err, "%s: the sources hold no training documents", recipe_path);
        goto done;
    }
    /* swap into place */
    if (loom_path_exists(out)) {
        if (rename(out, old) != 0) {
            loom_errf(err, "%s: cannot move the previous build aside: %s", out, strerror(errno));
            goto done;
        }
    }
    if (rename(tmp, out) != 0) {
        loom_errf(err, "%s: cannot rename the new build into place: %s", out, strerror(errno));
        if (loom_path_exists(old)) rename(old, out);
        goto done;
    }
    made_tmp = 0;
    remove_tree(old);
    loom_log("data build: %s: %d files -> %s: train %d shard(s), %llu tokens, %llu docs; "
             "val %d shard(s), %llu tokens, %llu docs",
             r.name, files.n, out, ws[0].n_shards, (unsigned long long)ws[0].total_tokens,
             (unsigned long long)ws[0].total_docs, ws[1].n_shards,
             (unsigned long long)ws[1].total_tokens, (unsigned long long)ws[1].total_docs);
    rc = 0;
done:
    if (made_tmp) remove_tree(tmp);
    for (int i = 0; i < 2; i++) {
        free(ws[i].dir);
        free(ws[i].tokens);
        free(ws[i].starts);
    }
    for (int i = 0; i < files.n; i++) free(files.v[i].path);
    free(files.v);
    loom_recipe_free(&r);
    return rc;
}
