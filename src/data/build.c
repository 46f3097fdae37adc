/* `loom data build RECIPE.yaml`: sources -> documents -> steps -> tokens -> shards + manifest.
 *
 * Per source, in recipe order: its input files are collected (source_files.c) and hashed,
 * and a cache key is made from the source's recipe section, the tokenizer, the shard settings
 * and the (path, size, SHA-256) of every input. A source whose key matches the previous build
 * (OUTPUT/train/dataset.json) and whose shards still match their manifest SHA-256 is reused:
 * its shards are hard-linked into the new output, nothing is read or tokenized. Otherwise its
 * files are read into documents, every step runs with counts before and after, documents
 * are routed to train/val by a hash of their bytes, and its shards are written in parallel
 * (OpenMP, one shard per task: each a temp file, fsynced, renamed) and appended to the
 * manifest in order. A shard holds documents of one source; its manifest line carries the
 * source's weight and repeat_cap for the loader. When every source is reused and the recipe
 * is unchanged, the build does nothing at all.
 *
 * Deterministic: inputs are read in sorted path order, shard k of a source is tokens
 * [k*shard_tokens, (k+1)*shard_tokens) of its documents' concatenation, and no step or
 * shard depends on the number of threads; shards carry no timestamps.
 *
 * The new output is built as OUTPUT.tmp.<pid> and renamed into place; an existing OUTPUT is
 * replaced only when it looks like a previous build or is empty.
 *
 * A team (MPI ranks, through the hooks of loom_build_team; this file makes no MPI call): every
 * member reads the sources and runs the steps (documents, dedup and train/val routing then agree
 * everywhere); input hashing and the check of cached shards are split by index, BPE
 * tokenization by blocks of documents (token counts summed over the team), and each split's
 * shards in contiguous blocks, one block per member, rotated by the source's first train shard
 * number (the BPE count blocks too, so a member mostly writes what it counted). Member 0 names the temp directory (its pid), creates it, links reused shards, writes
 * every manifest line in shard order once the shards' SHA-256 and counts are gathered, writes
 * dataset.json and renames. The output is byte-identical to one process's ("created" aside,
 * which member 0 stamps; SOURCE_DATE_EPOCH fixes it). */
#define _GNU_SOURCE
#include "data/build_source.h"
#include "data/data_internal.h"
#include "data/recipe.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#include "loom/chat.h"
#include "loom/progress.h"
#if __has_include("loom/tokenizer.h")
#include "loom/tokenizer.h"
#define LOOM_HAVE_BPE 1
#endif
#endif

#define BYTE_VOCAB 256u
#define BUILD_KEY_VERSION "loom.data.build/2"
#define DATASET_JSON_MAX ((size_t)256 << 20)

static const char *const SPLITS[2] = {"train", "val"};

typedef struct split_stats {
    uint64_t shards, tokens, docs, pieces;
} split_stats;

typedef struct src_state {
    int *files;           /* indices into the build's inputs */
    int n_files;
    char key[65];
    int reuse, need_docs, has_exact;
    json_t *old_obj;      /* the previous build's source object (borrowed) */
    json_t *old_lines[2]; /* its previous manifest lines, per split (owned arrays) */
    loom_skips skipped, bad_lines, unlabeled;
    uint64_t empty_docs;
    loom_step_count *counts;  /* read + one per step */
    int n_counts;
    split_stats split[2];
    loom_labels *labels;
    char labels_sha[65];
    uint64_t rot;         /* a team: shard blocks and BPE count blocks rotate by this */
    loom_chat_template *chat; /* chat: its template */
    uint64_t dropped_long;    /* chat, pack: false, too_long: drop: conversations dropped */
} src_state;

typedef struct build {
    loom_recipe r;
    loom_inputs in;
    src_state *src;
    const char **classes;   /* sorted distinct class names over all labelled sources */
    int n_classes;
    const char *tok_id;
    uint32_t vocab;
    json_t *old_ds;         /* previous train/dataset.json, or NULL */
    char out[4096], tmp[4200], old[4200];
    uint64_t next_shard[2]; /* next shard number per split */
    loom_hashset *global;   /* dedup_across_sources */
    double t0;
    const loom_build_team *team; /* NULL or a team of one: one process */
    int rank, size;              /* in the team (0 and 1 without one) */
    int fail_shard;              /* LOOM_TEST_FAIL_BUILD names this rank: fail (1) or SIGKILL
                                  * itself (2) at the first shard */
    int lock_fd;                 /* member 0: the lock on the output (.NAME.lock), -1 none */
#ifdef LOOM_HAVE_BPE
    loom_tokenizer *tok;    /* tokenizer: bpe; NULL for byte */
#endif
} build;

/* ---- small helpers ---- */
static int multi(const build *b) { return b->size > 1; }

/* The block [*off, *off + *len) of n items that member i of size owns (the first n % size
 * members get one more). */
static void block_of(uint64_t n, int size, int i, uint64_t *off, uint64_t *len) {
    uint64_t base = n / (uint64_t)size, rem = n % (uint64_t)size, u = (uint64_t)i;
    *off = u * base + (u < rem ? u : rem);
    *len = base + (u < rem);
}

static json_t *jstr(const char *s) {
    json_t *j = json_string(s);
    return j ? j : json_string("<not valid UTF-8>");
}

/* now, or SOURCE_DATE_EPOCH (reproducible builds: seconds since 1970) when set */
static void iso_now(char *buf, size_t n) {
    time_t t = time(NULL);
    const char *sde = getenv("SOURCE_DATE_EPOCH");
    if (sde && *sde) {
        char *end;
        errno = 0;
        long long v = strtoll(sde, &end, 10);
        if (!*end && errno == 0 && v >= 0) t = (time_t)v;
    }
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* the train/val routing: a hash of the document's bytes, so duplicates land together */
static int is_val(const uint8_t *p, size_t n, double frac) {
    if (frac <= 0) return 0;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    uint64_t u = loom_rng_u64(h, loom_hash_str("loom.data.val_split"), n);
    return (double)(u >> 11) * (1.0 / 9007199254740992.0) < frac;
}

/* ---- output directory ---- */
static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(path);
}

static void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0) nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
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

/* ---- one build per output, and what killed builds left ---- */

/* "<base><kind><digits>" (kind ".tmp." or ".old."): a temp directory (or a moved-aside previous
 * output) of a build of the output named base */
static int is_leftover(const char *name, const char *base, const char *kind) {
    const size_t nb = strlen(base), nk = strlen(kind);
    if (strncmp(name, base, nb) != 0 || strncmp(name + nb, kind, nk) != 0) return 0;
    const char *d = name + nb + nk;
    if (!*d) return 0;
    for (; *d; d++)
        if (*d < '0' || *d > '9') return 0;
    return 1;
}

/* The directory that holds the output (into parent); returns the output's last component. */
static const char *output_parent(const build *b, char *parent, size_t size) {
    const char *slash = strrchr(b->out, '/');
    if (!slash) loom_pathf(parent, size, ".");
    else if (slash == b->out) loom_pathf(parent, size, "/");
    else loom_pathf(parent, size, "%.*s", (int)(slash - b->out), b->out);
    return slash ? slash + 1 : b->out;
}

/* Member 0, holding the output's lock, so no other build of this output runs: removes the temp
 * directories (OUTPUT.tmp.<pid>) and moved-aside outputs (OUTPUT.old.<pid>) of builds that were
 * killed. A build killed between its two renames leaves no OUTPUT but a complete OUTPUT.old:
 * that one is put back first (the caching then reuses it). */
static void sweep_leftovers(const build *b) {
    char parent[4200], path[8500];
    const char *base = output_parent(b, parent, sizeof parent);
    DIR *d = opendir(parent);
    if (!d) return;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const int tmp = is_leftover(de->d_name, base, ".tmp."), old = is_leftover(de->d_name, base, ".old.");
        if (!tmp && !old) continue;
        loom_pathf(path, sizeof path, "%s/%s", parent, de->d_name);
        if (old && !loom_path_exists(b->out) && looks_like_build(path) && rename(path, b->out) == 0) {
            loom_warn("data build: %s was missing and %s (the previous output, moved aside by a "
                      "build that was killed) was put back", b->out, path);
            continue;
        }
        remove_tree(path);
        removed++;
    }
    closedir(d);
    if (removed)
        loom_log("data build: removed %d temp director%s of %s left by builds that are no "
                 "longer running", removed, removed == 1 ? "y" : "ies", b->out);
}

/* Member 0 locks PARENT/.NAME.lock (beside the output, which is replaced by a rename; hidden,
 * as it stays) for the whole build, then sweeps what killed builds left; every member learns
 * the outcome. */
static int lock_output(build *b, const char *recipe_path, loom_err *err) {
    uint8_t bad = 0;
    if (b->rank == 0) {
        char parent[4200], lock[8500];
        const char *base = output_parent(b, parent, sizeof parent);
        int rc = loom_mkdirs(parent, err);
        loom_pathf(lock, sizeof lock, "%s/.%s.lock", parent, base);
        if (rc == 0) rc = loom_lock_file(lock, "loom data build", &b->lock_fd, err);
        if (rc == 1)
            loom_err_prefix(err, "%s: another `loom data build` of output '%s' is running "
                                 "(two builds of one output would replace each other's files)",
                            recipe_path, b->out);
        if (rc == 0) sweep_leftovers(b);
        bad = rc != 0;
    }
    if (multi(b)) b->team->max_u8(b->team->ctx, &bad, 1);
    if (bad && b->rank != 0)
        return loom_errf(err, "%s: member 0 could not lock output '%s' (see its message)",
                         recipe_path, b->out);
    return bad ? -1 : 0;
}

/* ---- the previous build ---- */
static json_t *old_source(const build *b, const char *name) {
    json_t *arr = b->old_ds ? json_object_get(b->old_ds, "sources") : NULL;
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o) {
        const char *n = json_string_value(json_object_get(o, "name"));
        if (n && !strcmp(n, name)) return o;
    }
    return NULL;
}

/* Reads the previous dataset.json and manifests (if any); problems only disable reuse. */
static void load_previous(build *b) {
    char p[4300];
    if (!loom_is_dir(b->out)) return;
    loom_pathf(p, sizeof p, "%s/train/dataset.json", b->out);
    if (!loom_path_exists(p)) return;
    char *text;
    size_t len;
    loom_err e;
    if (loom_read_file(p, DATASET_JSON_MAX, &text, &len, &e) != 0) return;
    json_error_t je;
    b->old_ds = json_loadb(text, len, 0, &je);
    free(text);
    if (b->old_ds && !json_is_object(b->old_ds)) {
        json_decref(b->old_ds);
        b->old_ds = NULL;
    }
    if (!b->old_ds) return;
    for (int s = 0; s < 2; s++) {
        loom_pathf(p, sizeof p, "%s/%s/manifest.jsonl", b->out, SPLITS[s]);
        if (loom_read_file(p, DATASET_JSON_MAX, &text, &len, &e) != 0) continue;
        size_t pos = 0;
        while (pos < len) {
            char *nl = memchr(text + pos, '\n', len - pos);
            if (!nl) break;
            json_t *o = json_loadb(text + pos, (size_t)(nl - text - pos), JSON_REJECT_DUPLICATES, &je);
            pos = (size_t)(nl - text) + 1;
            const char *src = o ? json_string_value(json_object_get(o, "source")) : NULL;
            for (int i = 0; src && i < b->r.n_sources; i++) {
                if (strcmp(src, b->r.sources[i].name) != 0) continue;
                if (!b->src[i].old_lines[s]) b->src[i].old_lines[s] = json_array();
                json_array_append(b->src[i].old_lines[s], o);
            }
            json_decref(o);
        }
        free(text);
    }
}

/* ---- inputs: hashes (fast path: an unchanged size and mtime keep the recorded SHA-256) ---- */
typedef struct old_input {
    const char *path;
    json_t *o;
} old_input;

static int cmp_old_input(const void *a, const void *b) {
    return strcmp(((const old_input *)a)->path, ((const old_input *)b)->path);
}

static int hash_inputs(build *b, loom_err *err) {
    json_t *old_inputs = b->old_ds ? json_object_get(b->old_ds, "inputs") : NULL;
    size_t n_old = 0, k;
    json_t *o;
    old_input *idx = loom_malloc((json_array_size(old_inputs) + 1) * sizeof *idx);
    json_array_foreach(old_inputs, k, o) {
        const char *p = json_string_value(json_object_get(o, "path"));
        if (p) idx[n_old++] = (old_input){p, o};
    }
    if (n_old) qsort(idx, n_old, sizeof *idx, cmp_old_input);
    for (int i = 0; i < b->in.n && n_old; i++) {
        loom_input *f = &b->in.v[i];
        old_input key = {f->path, NULL};
        const old_input *hit = bsearch(&key, idx, n_old, sizeof *idx, cmp_old_input);
        if (!hit) continue;
        const char *sha = json_string_value(json_object_get(hit->o, "sha256"));
        json_t *mt = json_object_get(hit->o, "mtime_ns"), *by = json_object_get(hit->o, "bytes");
        if (sha && strlen(sha) == 64 && json_is_integer(mt) && json_is_integer(by) &&
            (uint64_t)json_integer_value(by) == f->bytes && json_integer_value(mt) == f->mtime_ns)
            memcpy(f->sha256, sha, 65);
    }
    free(idx);
    int failed = 0;
    loom_err first = {{0}};
    /* a team splits the files still to hash by index, then combines the hex digests */
    uint8_t *todo = loom_calloc((size_t)b->in.n + 1, 1);
    for (int i = 0; i < b->in.n; i++) todo[i] = !b->in.v[i].sha256[0];
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < b->in.n; i++) {
        if (!todo[i] || i % b->size != b->rank) continue;
        loom_err e;
        if (loom_input_sha256(&b->in.v[i], b->in.v[i].sha256, &e) != 0) {
            #pragma omp critical(loom_build_err)
            if (!failed) failed = 1, first = e;
        }
    }
    if (failed) {
        free(todo);
        *err = first;
        return -1;
    }
    if (multi(b)) {
        uint8_t *hex = loom_calloc((size_t)b->in.n * 64 + 1, 1);
        for (int i = 0; i < b->in.n; i++)
            if (todo[i] && i % b->size == b->rank) memcpy(hex + (size_t)i * 64, b->in.v[i].sha256, 64);
        b->team->max_u8(b->team->ctx, hex, (size_t)b->in.n * 64);
        for (int i = 0; i < b->in.n; i++) {
            if (!todo[i]) continue;
            memcpy(b->in.v[i].sha256, hex + (size_t)i * 64, 64);
            b->in.v[i].sha256[64] = 0;
            LOOM_CHECK(strlen(b->in.v[i].sha256) == 64);
        }
        free(hex);
    }
    free(todo);
    return 0;
}

/* ---- labels: one sorted class list over every labelled source ---- */
static int load_labels(build *b, loom_err *err) {
    int cap = 0;
    for (int i = 0; i < b->r.n_sources; i++) {
        const loom_recipe_source *s = &b->r.sources[i];
        if (s->kind != LOOM_SRC_BINARY || !s->labels) continue;
        if (loom_labels_load(s->labels, s->label_key, s->label_field, &b->src[i].labels, err) != 0)
            return loom_err_prefix(err, "%s:%d: source '%s'", b->r.file, s->line, s->name);
        char *text;
        size_t len;
        LOOM_CHECK(loom_read_file(s->labels, (size_t)1 << 30, &text, &len, err) == 0);
        loom_sha256_hex(text, len, b->src[i].labels_sha);
        free(text);
        const char **names;
        int n = loom_labels_names(b->src[i].labels, &names);
        for (int j = 0; j <= n; j++) {
            const char *nm = j < n ? names[j] : s->default_label;
            if (!nm) continue;
            if (b->n_classes == cap) {
                cap = cap ? 2 * cap : 64;
                b->classes = loom_realloc(b->classes, (size_t)cap * sizeof *b->classes);
            }
            b->classes[b->n_classes++] = nm;
        }
    }
    if (b->n_classes) qsort(b->classes, (size_t)b->n_classes, sizeof *b->classes, cmp_cstr);
    int w = 0;
    for (int i = 0; i < b->n_classes; i++)
        if (w == 0 || strcmp(b->classes[w - 1], b->classes[i])) b->classes[w++] = b->classes[i];
    b->n_classes = w;
    return 0;
}

/* ---- cache keys ---- */
typedef struct kbuf {
    char *p;
    size_t n, cap;
} kbuf;

static void kput(kbuf *k, const char *s) {
    size_t n = strlen(s);
    if (k->n + n + 2 > k->cap) {
        k->cap = (k->n + n + 2) * 2;
        k->p = loom_realloc(k->p, k->cap);
    }
    memcpy(k->p + k->n, s, n);
    k->n += n;
    k->p[k->n++] = '\n';
    k->p[k->n] = 0;
}

static void compute_keys(build *b) {
    char num[128];
    for (int i = 0; i < b->r.n_sources; i++) {
        const loom_recipe_source *s = &b->r.sources[i];
        src_state *st = &b->src[i];
        kbuf k = {0};
        kput(&k, BUILD_KEY_VERSION);
        kput(&k, b->tok_id);
        snprintf(num, sizeof num, "shard_tokens=%lld val_fraction=%.17g", (long long)b->r.shard_tokens,
                 b->r.val_fraction);
        kput(&k, num);
        kput(&k, s->canon);
        if (s->kind == LOOM_SRC_CHAT && (!loom_chat_template_is_builtin(s->chat_template) ||
                                         !strcmp(s->chat_template, "plain"))) { /* a file: its bytes ("plain"
                                                                                  * as before: unreadable) */
            char *text = NULL, sha[65] = "unreadable";
            size_t tl = 0;
            if (loom_read_file(s->chat_template, (size_t)1 << 20, &text, &tl, NULL) == 0)
                loom_sha256_hex(text, tl, sha);
            free(text);
            kput(&k, sha);
        }
        snprintf(num, sizeof num, "seq_len=%lld", (long long)b->r.seq_len);
        if (s->kind == LOOM_SRC_CHAT) kput(&k, num);
        if (st->labels) {
            kput(&k, st->labels_sha);
            for (int c = 0; c < b->n_classes; c++) kput(&k, b->classes[c]);
        }
        for (int j = 0; j < st->n_files; j++) {
            const loom_input *f = &b->in.v[st->files[j]];
            snprintf(num, sizeof num, "%llu %s", (unsigned long long)f->bytes, f->sha256);
            kput(&k, f->rel);
            kput(&k, num);
        }
        if (b->r.dedup_across_sources && st->has_exact)
            for (int j = 0; j < i; j++)
                if (b->src[j].has_exact) kput(&k, b->src[j].key);
        loom_sha256_hex(k.p, k.n, st->key);
        free(k.p);
    }
}

/* A source is reused when its key is unchanged and its old shards are intact. A team splits
 * the shard checks and agrees on the result. */
static void decide_reuse(build *b) {
    uint8_t *bad = loom_calloc((size_t)b->r.n_sources + 1, 1);
    for (int i = 0; i < b->r.n_sources; i++) {
        src_state *st = &b->src[i];
        json_t *o = old_source(b, b->r.sources[i].name);
        const char *k = o ? json_string_value(json_object_get(o, "key")) : NULL;
        st->old_obj = o;
        if (!k || strcmp(k, st->key) != 0) continue;
        int ok = 1;
        for (int s = 0; s < 2 && ok; s++) {
            json_t *sp = json_object_get(json_object_get(o, "splits"), SPLITS[s]);
            json_int_t want = json_integer_value(json_object_get(sp, "shards"));
            size_t have = st->old_lines[s] ? json_array_size(st->old_lines[s]) : 0;
            if (!json_is_object(sp) || (json_int_t)have != want) ok = 0;
            size_t j;
            json_t *line;
            json_array_foreach(st->old_lines[s], j, line) {
                if ((j + (size_t)(2 * i + s)) % (size_t)b->size != (size_t)b->rank) continue;
                const char *shard = json_string_value(json_object_get(line, "shard"));
                const char *sha = json_string_value(json_object_get(line, "sha256"));
                char p[4400], got[65];
                loom_err e;
                if (!shard || !sha || strchr(shard, '/') ||
                    snprintf(p, sizeof p, "%s/%s/%s", b->out, SPLITS[s], shard) >= (int)sizeof p ||
                    loom_sha256_file(p, got, &e) != 0 || strcmp(got, sha) != 0) {
                    ok = 0;
                    if (shard) loom_warn("source '%s': previous shard %s/%s is missing or changed; rebuilding",
                                         b->r.sources[i].name, SPLITS[s], shard);
                    break;
                }
            }
        }
        st->reuse = ok;
        bad[i] = k && !strcmp(k, st->key) && !ok;
    }
    if (multi(b)) {
        b->team->max_u8(b->team->ctx, bad, (size_t)b->r.n_sources);
        for (int i = 0; i < b->r.n_sources; i++) b->src[i].reuse &= !bad[i];
    }
    free(bad);
    /* cross-source exact dedup needs the documents of every earlier deduplicated source */
    int later = 0;
    for (int i = b->r.n_sources - 1; i >= 0; i--) {
        src_state *st = &b->src[i];
        st->need_docs = !st->reuse || (b->r.dedup_across_sources && st->has_exact && later);
        if (!st->reuse && st->has_exact) later = 1;
    }
}

/* ---- manifest ---- */
static int append_line(build *b, int split, json_t *line, loom_err *err) {
    char *s = json_dumps(line, JSON_COMPACT);
    LOOM_CHECK(s != NULL);
    char mpath[4300];
    loom_pathf(mpath, sizeof mpath, "%s/%s/manifest.jsonl", b->tmp, SPLITS[split]);
    int rc = loom_append_line(mpath, s, err);
    free(s);
    return rc;
}

static json_t *manifest_line(const build *b, const loom_recipe_source *s, const char *name,
                             const char *sha, uint64_t tokens, uint64_t docs, const char *created) {
    json_t *o = json_object();
    json_object_set_new(o, "shard", json_string(name));
    json_object_set_new(o, "sha256", json_string(sha));
    json_object_set_new(o, "tokens", json_integer((json_int_t)tokens));
    json_object_set_new(o, "docs", json_integer((json_int_t)docs));
    json_object_set_new(o, "source", json_string(s->name));
    json_object_set_new(o, "recipe", json_string(b->r.sha256));
    json_object_set_new(o, "created", json_string(created));
    json_object_set_new(o, "weight", json_real(s->weight));
    json_object_set_new(o, "repeat_cap", json_real(s->repeat_cap));
    return o;
}

static int link_or_copy(const char *from, const char *to, loom_err *err) {
    if (link(from, to) == 0) return 0;
    char *buf;
    size_t len;
    if (loom_read_file(from, (size_t)1 << 40, &buf, &len, err) != 0) return -1;
    int rc = loom_write_file_atomic(to, buf, len, err);
    free(buf);
    return rc;
}

/* Links the source's previous shards into the new output (member 0 of a team; the others only
 * take the counts). */
static int reuse_source(build *b, int si, loom_err *err) {
    src_state *st = &b->src[si];
    const loom_recipe_source *s = &b->r.sources[si];
    for (int sp = 0; sp < 2; sp++) {
        size_t j;
        json_t *line;
        if (b->rank != 0) b->next_shard[sp] += st->old_lines[sp] ? json_array_size(st->old_lines[sp]) : 0;
        else json_array_foreach(st->old_lines[sp], j, line) {
            char from[4400], to[4400], name[64];
            snprintf(name, sizeof name, "shard_%05llu.bin", (unsigned long long)b->next_shard[sp]++);
            loom_pathf(from, sizeof from, "%s/%s/%s", b->out, SPLITS[sp],
                       json_string_value(json_object_get(line, "shard")));
            loom_pathf(to, sizeof to, "%s/%s/%s", b->tmp, SPLITS[sp], name);
            if (link_or_copy(from, to, err) != 0) return -1;
            json_t *nl = json_deep_copy(line);
            json_object_set_new(nl, "shard", json_string(name));
            json_object_set_new(nl, "recipe", json_string(b->r.sha256));
            json_object_set_new(nl, "weight", json_real(s->weight));
            json_object_set_new(nl, "repeat_cap", json_real(s->repeat_cap));
            int rc = append_line(b, sp, nl, err);
            json_decref(nl);
            if (rc) return -1;
        }
        json_t *o = json_object_get(json_object_get(st->old_obj, "splits"), SPLITS[sp]);
        st->split[sp].shards = (uint64_t)json_integer_value(json_object_get(o, "shards"));
        st->split[sp].tokens = (uint64_t)json_integer_value(json_object_get(o, "tokens"));
        st->split[sp].docs = (uint64_t)json_integer_value(json_object_get(o, "documents"));
        st->split[sp].pieces = (uint64_t)json_integer_value(json_object_get(o, "doc_index_entries"));
    }
    if (b->rank == 0)
        loom_log("data build: source '%s': reused %llu + %llu shard(s) (inputs and recipe section "
             "unchanged)", s->name, (unsigned long long)st->split[0].shards,
             (unsigned long long)st->split[1].shards);
    return 0;
}

/* ---- reading + steps ---- */
static int read_source(build *b, int si, loom_docs *docs, loom_err *err) {
    src_state *st = &b->src[si];
    const loom_recipe_source *s = &b->r.sources[si];
    loom_read_ctx c = {&b->r, s, &b->in, docs, &st->bad_lines, &st->unlabeled, 0, st->labels,
                       b->classes, b->n_classes, NULL};
    if (s->kind == LOOM_SRC_CHAT) {
        if (!st->chat && loom_chat_template_load(s->chat_template, &st->chat, err))
            return loom_err_prefix(err, "%s:%d: source '%s'", b->r.file, s->line, s->name);
        c.chat = st->chat;
    }
    for (int j = 0; j < st->n_files; j++) {
        int fi = st->files[j], rc;
        if (s->kind == LOOM_SRC_TEXT) rc = loom_read_text(&c, fi, err);
        else if (s->kind == LOOM_SRC_JSONL || s->kind == LOOM_SRC_CHAT) rc = loom_read_jsonl(&c, fi, err);
        else rc = loom_read_binary(&c, fi, err);
        if (rc) return -1;
    }
    st->empty_docs = c.empty_docs;
    st->n_counts = 1 + s->n_steps;
    st->counts = loom_calloc((size_t)st->n_counts, sizeof *st->counts);
    uint64_t bytes = 0;
    for (size_t i = 0; i < docs->n; i++) bytes += docs->v[i].len;
    st->counts[0] = (loom_step_count){"read", 0, docs->n, 0, bytes, 0};
    for (int k = 0; k < s->n_steps; k++) {
        const loom_recipe_step *step = &s->steps[k];
        loom_hashset *g = step->kind == LOOM_STEP_DEDUP_EXACT && b->r.dedup_across_sources ? b->global : NULL;
        if (loom_step_run(step, s->kind != LOOM_SRC_BINARY, docs, g, &st->counts[k + 1], err) != 0)
            return loom_err_prefix(err, "%s:%d: source '%s': step %s", b->r.file, step->line, s->name,
                                   loom_step_name(step->kind));
    }
    return 0;
}

/* ---- tokenization + shards ---- */
typedef struct doc_set {
    const loom_docs *docs;
    size_t *idx;          /* (n) documents of this split, in order */
    uint64_t *cum;        /* (n+1) token offsets of each document in the concatenation */
    size_t n;
    const uint8_t *suffix;
    size_t suffix_len;
    const int32_t *const *ids;  /* bpe: ids[doc] of every document of the source, else NULL */
    const uint8_t *const *masks; /* chat: masks[doc], the loss mask of ids[doc]; else NULL */
} doc_set;

/* tokens [from, from+n) of document k of the set (byte tokenizer: bytes ++ suffix) */
static void doc_tokens(const doc_set *ds, size_t k, uint64_t from, uint64_t n, uint32_t *out) {
    if (ds->ids) {
        const int32_t *t = ds->ids[ds->idx[k]] + from;
        for (uint64_t i = 0; i < n; i++) out[i] = (uint32_t)t[i];
        return;
    }
    const loom_doc *d = &ds->docs->v[ds->idx[k]];
    const uint8_t *p = ds->docs->arena + d->off;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t t = from + i;
        out[i] = t < d->len ? p[t] : ds->suffix[t - d->len];
    }
}

/* Writes shard k of a split (tokens [k*cap, min((k+1)*cap, total)) of the set) as
 * SPLIT/shard_<number>.bin in the temp directory: its SHA-256 into sha, its documents (pieces)
 * into *n_docs_out. */
static int write_shard(const build *b, int sp, const doc_set *ds, const loom_shard_spec *spec,
                       int labelled, uint64_t k, uint64_t number, char sha[65],
                       uint64_t *n_docs_out, loom_err *e) {
    uint64_t total = ds->cum[ds->n], cap = (uint64_t)b->r.shard_tokens;
    uint64_t lo = k * cap, hi = lo + cap < total ? lo + cap : total, n_docs = 0;
    char path[4400];
    if (b->fail_shard == 2) raise(SIGKILL);
    if (b->fail_shard)
        return loom_errf(e, "%s: LOOM_TEST_FAIL_BUILD=%d: injected failure before writing %s/shard_%05llu.bin",
                         b->r.file, b->rank, SPLITS[sp], (unsigned long long)number);
    uint32_t *tok = loom_malloc((size_t)(hi - lo) * sizeof *tok);
    uint8_t *mask = ds->masks ? loom_malloc((size_t)(hi - lo) + 1) : NULL;
    /* the first document overlapping [lo, hi): cum[d] <= lo < cum[d+1] */
    size_t a = 0, z = ds->n;
    while (z - a > 1) {
        size_t m = (a + z) / 2;
        if (ds->cum[m] <= lo) a = m;
        else z = m;
    }
    size_t cap_docs = 16;
    uint64_t *starts = loom_malloc(cap_docs * sizeof *starts);
    uint32_t *lab = labelled ? loom_malloc(cap_docs * sizeof *lab) : NULL;
    for (size_t d = a; d < ds->n && ds->cum[d] < hi; d++) {
        uint64_t from = ds->cum[d] > lo ? ds->cum[d] : lo;
        uint64_t to = ds->cum[d + 1] < hi ? ds->cum[d + 1] : hi;
        if (to <= from) continue;
        if (n_docs == cap_docs) {
            cap_docs *= 2;
            starts = loom_realloc(starts, cap_docs * sizeof *starts);
            if (lab) lab = loom_realloc(lab, cap_docs * sizeof *lab);
        }
        starts[n_docs] = from - lo;
        if (lab) { /* every label indexes the class list written to dataset.json */
            const int64_t label = ds->docs->v[ds->idx[d]].label;
            if (label < 0 || label >= b->n_classes) {
                free(tok);
                free(mask);
                free(starts);
                free(lab);
                return loom_errf(e, "%s: %s/shard_%05llu.bin: document %llu has label %lld, "
                                    "outside the %d classes",
                                 b->r.file, SPLITS[sp], (unsigned long long)number,
                                 (unsigned long long)n_docs, (long long)label, b->n_classes);
            }
            lab[n_docs] = (uint32_t)label;
        }
        n_docs++;
        doc_tokens(ds, d, from - ds->cum[d], to - from, tok + (from - lo));
        if (mask) memcpy(mask + (from - lo), ds->masks[ds->idx[d]] + (from - ds->cum[d]), to - from);
    }
    loom_pathf(path, sizeof path, "%s/%s/shard_%05llu.bin", b->tmp, SPLITS[sp], (unsigned long long)number);
    int rc = loom_shard_write_masked(path, spec, tok, hi - lo, starts, n_docs, lab, mask, sha, e);
    free(mask);
    free(tok);
    free(starts);
    free(lab);
    *n_docs_out = n_docs;
    return rc;
}

/* A team's part of a split: this member writes its block of the shards, then the SHA-256 and
 * document counts of every shard are combined over the team and member 0 appends the lines. */
static int write_split_team(build *b, int si, int sp, const doc_set *ds, int32_t **ids,
                            const loom_shard_spec *spec, int labelled, uint64_t first,
                            uint64_t n_shards, loom_err *err) {
    src_state *st = &b->src[si];
    const loom_recipe_source *s = &b->r.sources[si];
    uint64_t total = ds->cum[ds->n], cap = (uint64_t)b->r.shard_tokens, off, len;
    int blk = (int)(((uint64_t)b->rank + (uint64_t)b->size - st->rot % (uint64_t)b->size) % (uint64_t)b->size);
    block_of(n_shards, b->size, blk, &off, &len);
#ifdef LOOM_HAVE_BPE
    if (ids && len) { /* tokenize the documents of the block that another member counted */
        uint64_t lo = off * cap, hi = (off + len) * cap < total ? (off + len) * cap : total;
        int failed = 0;
        loom_err first_err = {{0}};
        #pragma omp parallel for schedule(dynamic, 16)
        for (size_t d = 0; d < ds->n; d++) {
            size_t i = ds->idx[d];
            if (ds->cum[d + 1] <= lo || ds->cum[d] >= hi || ids[i]) continue;
            loom_ids v = {0};
            loom_err e;
            size_t n = ds->docs->v[i].len + s->doc_suffix_len;
            uint8_t *text = loom_malloc(n + 1);
            memcpy(text, loom_doc_bytes(ds->docs, i), ds->docs->v[i].len);
            if (s->doc_suffix_len) memcpy(text + ds->docs->v[i].len, s->doc_suffix, s->doc_suffix_len);
            int bad = loom_tokenizer_encode(b->tok, text, n, &v, &e) != 0;
            if (bad) {
                #pragma omp critical(loom_build_err)
                if (!failed) failed = 1, first_err = e;
            }
            free(text);
            LOOM_CHECK(bad || (uint64_t)v.n == ds->cum[d + 1] - ds->cum[d]);
            ids[i] = v.ids;
        }
        if (failed) {
            *err = first_err;
            return -1;
        }
    }
#else
    (void)ids;
#endif
    uint8_t *hex = loom_calloc((size_t)n_shards * 64 + 1, 1);
    int64_t *nd = loom_calloc((size_t)n_shards + 1, sizeof *nd);
    int failed = 0;
    loom_err first_err = {{0}};
    #pragma omp parallel for schedule(dynamic, 1)
    for (uint64_t j = 0; j < len; j++) {
        loom_err e = {{0}};
        char sha[65] = "";
        uint64_t n_docs = 0, k = off + j;
        if (failed) continue;
        if (write_shard(b, sp, ds, spec, labelled, k, first + k, sha, &n_docs, &e) != 0) {
            #pragma omp critical(loom_build_err)
            if (!failed) failed = 1, first_err = e;
            continue;
        }
        memcpy(hex + k * 64, sha, 64);
        nd[k] = (int64_t)n_docs;
    }
    if (failed) {
        free(hex);
        free(nd);
        *err = first_err;
        return -1;
    }
    if (n_shards) {
        b->team->max_u8(b->team->ctx, hex, (size_t)n_shards * 64);
        b->team->sum_i64(b->team->ctx, nd, (size_t)n_shards);
    }
    uint64_t pieces = 0;
    int rc = 0;
    for (uint64_t k = 0; k < n_shards; k++) {
        char sha[65], name[64];
        memcpy(sha, hex + k * 64, 64);
        sha[64] = 0;
        LOOM_CHECK(strlen(sha) == 64); /* every shard was written by exactly one member */
        pieces += (uint64_t)nd[k];
        if (b->rank != 0 || rc) continue;
        uint64_t lo = k * cap, hi = lo + cap < total ? lo + cap : total;
        char created[32];
        iso_now(created, sizeof created);
        snprintf(name, sizeof name, "shard_%05llu.bin", (unsigned long long)(first + k));
        json_t *line = manifest_line(b, s, name, sha, hi - lo, (uint64_t)nd[k], created);
        rc = append_line(b, sp, line, err);
        json_decref(line);
    }
    st->split[sp].pieces = pieces;
    free(hex);
    free(nd);
    return rc;
}

static int write_split(build *b, int si, int sp, const doc_set *ds, int32_t **ids, int labelled,
                       loom_err *err) {
    src_state *st = &b->src[si];
    const loom_recipe_source *s = &b->r.sources[si];
    uint64_t total = ds->cum[ds->n], cap = (uint64_t)b->r.shard_tokens;
    uint64_t n_shards = (total + cap - 1) / cap, first = b->next_shard[sp];
    b->next_shard[sp] += n_shards;
    st->split[sp].shards = n_shards;
    st->split[sp].tokens = total;
    st->split[sp].docs = ds->n;
    loom_shard_spec spec = {b->vocab, 0, b->tok_id, st->key};
    if (multi(b)) return write_split_team(b, si, sp, ds, ids, &spec, labelled, first, n_shards, err);
    int failed = 0;
    loom_err first_err = {{0}};
    uint64_t pieces = 0;
    #pragma omp parallel for schedule(dynamic, 1) ordered reduction(+ : pieces)
    for (uint64_t k = 0; k < n_shards; k++) {
        loom_err e = {{0}};
        char name[64], sha[65] = "";
        uint64_t lo = k * cap, hi = lo + cap < total ? lo + cap : total, n_docs = 0;
        int ok = !failed;
        snprintf(name, sizeof name, "shard_%05llu.bin", (unsigned long long)(first + k));
        if (ok) {
            ok = write_shard(b, sp, ds, &spec, labelled, k, first + k, sha, &n_docs, &e) == 0;
            pieces += n_docs;
        }
        #pragma omp ordered
        {
            /* in shard order: the manifest line goes in once the shard is durably in place */
            if (ok && !failed) {
                char created[32];
                iso_now(created, sizeof created);
                json_t *line = manifest_line(b, s, name, sha, hi - lo, n_docs, created);
                ok = append_line(b, sp, line, &e) == 0;
                json_decref(line);
            }
            if (!ok && !failed) {
                failed = 1;
                first_err = e;
            }
        }
    }
    st->split[sp].pieces = pieces;
    if (failed) {
        *err = first_err;
        return -1;
    }
    return 0;
}

/* Chat sources: every conversation's tokens and loss mask (each segment of the rendering
 * encoded on its own), with pack: false padded to a multiple of seq_len (pad tokens have mask
 * 0) or, with too_long: drop, dropped when longer than seq_len. Every member of a team
 * computes all of them (the split into shards needs every count). */
static int chat_tokenize(build *b, int si, const loom_docs *docs, uint64_t *ntok, int32_t ***ids_out,
                         uint8_t ***masks_out, loom_err *err) {
    src_state *st = &b->src[si];
    const loom_recipe_source *s = &b->r.sources[si];
    const loom_tokenizer *tok = NULL;
    loom_tokenizer *own = NULL;
#ifdef LOOM_HAVE_BPE
    tok = b->tok;
#endif
    if (!tok) {
        if (loom_tokenizer_byte(NULL, 0, &own, err)) return -1;
        tok = own;
    }
    const uint64_t T = (uint64_t)b->r.seq_len;
    if (!s->pack && (T == 0 || (uint64_t)b->r.shard_tokens % T != 0)) {
        loom_tokenizer_free(own);
        return loom_errf(err, "%s:%d: source '%s': pack: false needs shard_tokens (%lld) to be a "
                              "multiple of seq_len (%lld), so that every conversation starts a "
                              "window", b->r.file, s->line, s->name, (long long)b->r.shard_tokens,
                         (long long)T);
    }
    int32_t pad = loom_tokenizer_special_id(tok, "<|endoftext|>");
    if (pad < 0) pad = 0;
    int32_t **ids = loom_calloc(docs->n + 1, sizeof *ids);
    uint8_t **masks = loom_calloc(docs->n + 1, sizeof *masks);
    int failed = 0;
    uint64_t dropped = 0;
    loom_err first = {{0}};
    #pragma omp parallel for schedule(dynamic, 16) reduction(+ : dropped)
    for (size_t i = 0; i < docs->n; i++) {
        const loom_doc *dc = &docs->v[i];
        loom_chat_doc cd = {(char *)loom_doc_bytes(docs, i), dc->len, dc->len,
                            docs->segs + dc->seg0, dc->n_seg, dc->n_seg};
        loom_ids v = {0};
        uint8_t *m = NULL;
        loom_err e;
        if (loom_chat_encode(&cd, tok, &v, &m, &e) != 0) {
            #pragma omp critical(loom_build_err)
            if (!failed) failed = 1, first = e;
            continue;
        }
        if (!s->pack && s->drop_long && v.n > T) {
            dropped++;
            v.n = 0;
        } else if (!s->pack && v.n % T) {
            const size_t n = (v.n + T - 1) / T * T;
            v.ids = loom_realloc(v.ids, n * sizeof *v.ids);
            m = loom_realloc(m, n);
            for (size_t k = v.n; k < n; k++) v.ids[k] = pad, m[k] = 0;
            v.n = n;
        }
        ids[i] = v.ids;
        masks[i] = m;
        ntok[i] = v.n;
    }
    loom_tokenizer_free(own);
    st->dropped_long = dropped;
    *ids_out = ids;
    *masks_out = masks;
    if (failed) {
        *err = first;
        return -1;
    }
    return 0;
}

/* not a terminal: a plain progress line at most this often (a long source in a log) */
#define BUILD_PLAIN_EVERY_S 30.0

/* one source's progress line: phase, documents (of total when known), bytes, tokens, rate, ETA
 * (from the bytes when the total is known, else the elapsed time) */
static void build_progress(loom_progress *pg, int force, const char *name, const char *phase,
                           uint64_t docs, uint64_t docs_total, uint64_t bytes,
                           uint64_t bytes_total, uint64_t toks, double t0) {
    const double el = loom_now() - t0;
    char eta[48], dn[48] = "";
    loom_progress_eta(eta, sizeof eta, el, (double)bytes, (double)bytes_total);
    if (docs_total) snprintf(dn, sizeof dn, "/%llu", (unsigned long long)docs_total);
    loom_progress_show(pg, force, "data build: source '%s': %s %llu%s docs | %.1f MB | %llu tokens "
                       "| %.1f MB/s | %s", name, phase, (unsigned long long)docs, dn,
                       (double)bytes / 1e6, (unsigned long long)toks,
                       el > 0 ? (double)bytes / 1e6 / el : 0.0, eta);
}

static int build_source(build *b, int si, loom_err *err) {
    src_state *st = &b->src[si];
    const loom_recipe_source *s = &b->r.sources[si];
    double t0 = loom_now();
    loom_docs docs = {0};
    int rc = -1;
    doc_set ds[2];
    memset(ds, 0, sizeof ds);
    uint64_t *ntok = NULL;   /* (docs.n) tokens per document */
    int32_t **ids = NULL;    /* bpe: (docs.n) token arrays */
    uint8_t **masks = NULL;  /* chat: (docs.n) loss masks */
    st->rot = b->next_shard[0]; /* the same rotation for both splits and the BPE counts */
    loom_progress pg;
    loom_progress_init(&pg, BUILD_PLAIN_EVERY_S);
    const int pg_on = b->rank == 0;
    if (read_source(b, si, &docs, err) != 0) goto done;
    if (pg_on && !st->reuse) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < docs.n; i++) bytes += docs.v[i].len;
        build_progress(&pg, 0, s->name, "read", docs.n, 0, bytes, 0, 0, t0);
    }
    if (st->reuse) { /* read only for the cross-source dedup set */
        rc = reuse_source(b, si, err);
        goto done;
    }
    ntok = loom_malloc((docs.n + 1) * sizeof *ntok);
    for (size_t i = 0; i < docs.n; i++) ntok[i] = docs.v[i].len + s->doc_suffix_len;
    if (s->kind == LOOM_SRC_CHAT) {
        if (chat_tokenize(b, si, &docs, ntok, &ids, &masks, err)) goto done;
    }
#ifdef LOOM_HAVE_BPE
    else if (b->tok) { /* tokenize every document (thread-safe encode), in parallel */
        ids = loom_calloc(docs.n + 1, sizeof *ids);
        int failed = 0;
        loom_err first = {{0}};
        /* a team: each member counts the tokens of one block of the documents (blocks of about
         * equal bytes); the documents its shards need are tokenized in write_split_team */
        uint8_t *mine = NULL;
        if (multi(b)) {
            uint64_t all = 0, before = 0;
            for (size_t i = 0; i < docs.n; i++) all += docs.v[i].len;
            mine = loom_malloc(docs.n + 1);
            for (size_t i = 0; i < docs.n; i++) {
                int blk = all ? (int)((double)before * b->size / (double)all) : 0;
                blk = blk < b->size ? blk : b->size - 1;
                mine[i] = (int)(((uint64_t)blk + st->rot) % (uint64_t)b->size) == b->rank;
                before += docs.v[i].len;
            }
        }
        uint64_t my_docs = 0, my_bytes = 0, done_docs = 0, done_bytes = 0, done_toks = 0;
        for (size_t i = 0; i < docs.n; i++)
            if (!mine || mine[i]) my_docs++, my_bytes += docs.v[i].len;
        #pragma omp parallel for schedule(dynamic, 16)
        for (size_t i = 0; i < docs.n; i++) {
            if (mine && !mine[i]) {
                ntok[i] = 0;
                continue;
            }
            loom_ids v = {0};
            loom_err e;
            size_t n = docs.v[i].len + s->doc_suffix_len;
            uint8_t *text = loom_malloc(n + 1);
            memcpy(text, loom_doc_bytes(&docs, i), docs.v[i].len);
            if (s->doc_suffix_len) memcpy(text + docs.v[i].len, s->doc_suffix, s->doc_suffix_len);
            if (loom_tokenizer_encode(b->tok, text, n, &v, &e) != 0) {
                #pragma omp critical(loom_build_err)
                if (!failed) failed = 1, first = e;
            }
            free(text);
            ids[i] = v.ids;
            ntok[i] = v.n;
            if (pg_on) {
                #pragma omp critical(loom_build_progress)
                {
                    done_docs++, done_bytes += docs.v[i].len, done_toks += v.n;
                    if (loom_progress_due(&pg))
                        build_progress(&pg, 0, s->name, "tokenize", done_docs, my_docs,
                                       done_bytes, my_bytes, done_toks, t0);
                }
            }
        }
        if (pg_on) /* the phase's last count (a terminal) */
            build_progress(&pg, pg.tty, s->name, "tokenize", done_docs, my_docs, done_bytes, my_bytes,
                           done_toks, t0);
        free(mine);
        if (failed) {
            *err = first;
            goto done;
        }
        if (multi(b)) b->team->sum_i64(b->team->ctx, (int64_t *)ntok, docs.n);
    }
#endif
    uint8_t *val = loom_malloc(docs.n ? docs.n : 1);
    uint64_t in_bytes = 0;
    for (size_t i = 0; i < docs.n; i++) {
        val[i] = (uint8_t)is_val(loom_doc_bytes(&docs, i), docs.v[i].len, b->r.val_fraction);
        in_bytes += docs.v[i].len;
    }
    for (int sp = 0; sp < 2; sp++) {
        ds[sp].docs = &docs;
        ds[sp].idx = loom_malloc((docs.n + 1) * sizeof *ds[sp].idx);
        ds[sp].cum = loom_malloc((docs.n + 1) * sizeof *ds[sp].cum);
        ds[sp].suffix = (const uint8_t *)s->doc_suffix;
        ds[sp].suffix_len = s->doc_suffix_len;
        ds[sp].ids = (const int32_t *const *)ids;
        ds[sp].masks = (const uint8_t *const *)masks;
        ds[sp].cum[0] = 0;
    }
    for (size_t i = 0; i < docs.n; i++) {
        if (ntok[i] == 0) continue; /* a document that tokenizes to nothing */
        doc_set *d = &ds[val[i]];
        d->idx[d->n] = i;
        d->cum[d->n + 1] = d->cum[d->n] + ntok[i];
        d->n++;
    }
    free(val);
    int labelled = st->labels != NULL;
    for (int sp = 0; sp < 2; sp++)
        if (write_split(b, si, sp, &ds[sp], ids, labelled, err) != 0) goto done;
    if (pg_on && pg.tty) { /* the finished source's last update (a terminal only) */
        build_progress(&pg, 1, s->name, "written", docs.n, docs.n, in_bytes, in_bytes,
                       st->split[0].tokens + st->split[1].tokens, t0);
        loom_progress_end(&pg);
    }
    double dt = loom_now() - t0;
    if (b->rank == 0)
        loom_log("data build: source '%s': built %zu document(s), %llu tokens -> train %llu + val %llu "
             "shard(s) (%.1f MB/s)", s->name, docs.n,
             (unsigned long long)(st->split[0].tokens + st->split[1].tokens),
             (unsigned long long)st->split[0].shards, (unsigned long long)st->split[1].shards,
             dt > 0 ? (double)in_bytes / 1e6 / dt : 0.0);
    rc = 0;
done:
    for (int sp = 0; sp < 2; sp++) {
        free(ds[sp].idx);
        free(ds[sp].cum);
    }
    for (size_t i = 0; ids && i < docs.n; i++) free(ids[i]);
    free(ids);
    for (size_t i = 0; masks && i < docs.n; i++) free(masks[i]);
    free(masks);
    free(ntok);
    loom_docs_free(&docs);
    return rc;
}

/* ---- dataset.json ---- */
static json_t *skips_json(const loom_skips *k) {
    json_t *o = json_object(), *a = json_array();
    json_object_set_new(o, "count", json_integer((json_int_t)k->count));
    for (int i = 0; i < k->n_kept; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "what", jstr(k->v[i].what));
        json_object_set_new(e, "why", jstr(k->v[i].why));
        json_array_append_new(a, e);
    }
    json_object_set_new(o, "first", a);
    return o;
}

static json_t *source_json(const build *b, int si) {
    const src_state *st = &b->src[si];
    const loom_recipe_source *s = &b->r.sources[si];
    json_t *o;
    if (st->reuse && st->old_obj) {
        o = json_deep_copy(st->old_obj);
        json_object_set_new(o, "built", json_string("reused"));
        return o;
    }
    o = json_object();
    json_object_set_new(o, "name", json_string(s->name));
    json_object_set_new(o, "kind", json_string(s->kind_name));
    json_object_set_new(o, "key", json_string(st->key));
    json_object_set_new(o, "built", json_string("rebuilt"));
    json_object_set_new(o, "weight", json_real(s->weight));
    json_object_set_new(o, "repeat_cap", json_real(s->repeat_cap));
    json_object_set_new(o, "files", json_integer(st->n_files));
    json_object_set_new(o, "skipped_files", skips_json(&st->skipped));
    if (s->kind == LOOM_SRC_JSONL || s->kind == LOOM_SRC_CHAT)
        json_object_set_new(o, "bad_lines", skips_json(&st->bad_lines));
    if (s->kind == LOOM_SRC_CHAT) {
        json_object_set_new(o, "template", json_string(s->chat_template));
        json_object_set_new(o, "pack", json_boolean(s->pack));
        if (!s->pack && s->drop_long)
            json_object_set_new(o, "dropped_too_long", json_integer((json_int_t)st->dropped_long));
    }
    if (s->kind == LOOM_SRC_BINARY && st->labels) {
        json_object_set_new(o, "unlabeled", skips_json(&st->unlabeled));
        json_t *l = json_object();
        json_object_set_new(l, "file", jstr(s->labels));
        json_object_set_new(l, "sha256", json_string(st->labels_sha));
        json_object_set_new(l, "key", json_string(s->label_key));
        json_object_set_new(l, "field", jstr(s->label_field));
        json_object_set_new(o, "labels", l);
    }
    json_object_set_new(o, "empty_documents", json_integer((json_int_t)st->empty_docs));
    json_t *steps = json_array();
    for (int k = 0; k < st->n_counts; k++) {
        const loom_step_count *c = &st->counts[k];
        json_t *e = json_object();
        json_object_set_new(e, "step", json_string(c->step));
        if (k > 0) {
            json_object_set_new(e, "docs_in", json_integer((json_int_t)c->docs_in));
            json_object_set_new(e, "bytes_in", json_integer((json_int_t)c->bytes_in));
        }
        json_object_set_new(e, "docs_out", json_integer((json_int_t)c->docs_out));
        json_object_set_new(e, "bytes_out", json_integer((json_int_t)c->bytes_out));
        if (!strcmp(c->step, "utf8_repair")) json_object_set_new(e, "changed", json_integer((json_int_t)c->changed));
        json_array_append_new(steps, e);
    }
    json_object_set_new(o, "steps", steps);
    json_t *splits = json_object();
    for (int sp = 0; sp < 2; sp++) {
        json_t *x = json_object();
        json_object_set_new(x, "shards", json_integer((json_int_t)st->split[sp].shards));
        json_object_set_new(x, "tokens", json_integer((json_int_t)st->split[sp].tokens));
        json_object_set_new(x, "documents", json_integer((json_int_t)st->split[sp].docs));
        json_object_set_new(x, "doc_index_entries", json_integer((json_int_t)st->split[sp].pieces));
        json_object_set_new(splits, SPLITS[sp], x);
    }
    json_object_set_new(o, "splits", splits);
    return o;
}

static int write_dataset_json(const build *b, int sp, loom_err *err) {
    const loom_recipe *r = &b->r;
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string("loom-dataset"));
    json_object_set_new(o, "format_version", json_integer(1));
    json_object_set_new(o, "name", jstr(r->name));
    json_object_set_new(o, "split", json_string(SPLITS[sp]));
    json_t *rec = json_object();
    json_object_set_new(rec, "path", jstr(r->file));
    json_object_set_new(rec, "sha256", json_string(r->sha256));
    json_t *text = json_stringn(r->text, r->text_len);
    json_object_set_new(rec, "text", text ? text : json_null());
    json_object_set_new(o, "recipe", rec);
    json_t *inputs = json_array();
    for (int i = 0; i < b->in.n; i++) {
        const loom_input *f = &b->in.v[i];
        json_t *x = json_object();
        json_object_set_new(x, "source", jstr(r->sources[f->source].name));
        json_object_set_new(x, "path", jstr(f->path));
        json_object_set_new(x, "bytes", json_integer((json_int_t)f->bytes));
        json_object_set_new(x, "sha256", json_string(f->sha256));
        json_object_set_new(x, "mtime_ns", json_integer((json_int_t)f->mtime_ns));
        json_array_append_new(inputs, x);
    }
    json_object_set_new(o, "inputs", inputs);
    split_stats tot = {0};
    for (int i = 0; i < r->n_sources; i++) {
        tot.shards += b->src[i].split[sp].shards;
        tot.tokens += b->src[i].split[sp].tokens;
        tot.docs += b->src[i].split[sp].docs;
        tot.pieces += b->src[i].split[sp].pieces;
    }
    json_t *counts = json_object();
    json_object_set_new(counts, "shards", json_integer((json_int_t)tot.shards));
    json_object_set_new(counts, "tokens", json_integer((json_int_t)tot.tokens));
    json_object_set_new(counts, "documents", json_integer((json_int_t)tot.docs));
    json_object_set_new(counts, "doc_index_entries", json_integer((json_int_t)tot.pieces));
    json_object_set_new(o, "counts", counts);
    /* the manifest as built: its order is the sample order, so `data verify` checks it */
    char mpath[4300], *mtext = NULL;
    size_t mlen = 0;
    loom_pathf(mpath, sizeof mpath, "%s/%s/manifest.jsonl", b->tmp, SPLITS[sp]);
    if (loom_read_file(mpath, (size_t)1 << 30, &mtext, &mlen, err) != 0) {
        json_decref(o);
        return -1;
    }
    char mhex[65];
    loom_sha256_hex(mtext, mlen, mhex);
    json_t *order = json_array();
    for (char *line = mtext, *nl; line < mtext + mlen; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(mtext + mlen - line));
        if (!nl) nl = mtext + mlen;
        json_t *e = json_loadb(line, (size_t)(nl - line), 0, NULL);
        const char *name = json_string_value(json_object_get(e, "shard"));
        json_array_append_new(order, json_string(name ? name : ""));
        json_decref(e);
    }
    free(mtext);
    json_t *man = json_object();
    json_object_set_new(man, "sha256", json_string(mhex));
    json_object_set_new(man, "shards", order);
    json_object_set_new(o, "manifest", man);
    json_t *tok = json_object();
    json_object_set_new(tok, "id", json_string(b->tok_id));
    json_object_set_new(tok, "vocab_size", json_integer(b->vocab));
#ifdef LOOM_HAVE_BPE
    if (b->tok) json_object_set_new(tok, "file", json_string("tokenizer.json"));
#endif
    json_object_set_new(o, "tokenizer", tok);
    json_object_set_new(o, "seq_len", json_integer((json_int_t)r->seq_len));
    json_object_set_new(o, "val_fraction", json_real(r->val_fraction));
    json_object_set_new(o, "shard_tokens", json_integer((json_int_t)r->shard_tokens));
    json_object_set_new(o, "dedup_across_sources", json_boolean(r->dedup_across_sources));
    if (b->n_classes) {
        json_t *cl = json_array();
        for (int i = 0; i < b->n_classes; i++) json_array_append_new(cl, jstr(b->classes[i]));
        json_object_set_new(o, "classes", cl);
    }
    json_t *srcs = json_array();
    for (int i = 0; i < r->n_sources; i++) json_array_append_new(srcs, source_json(b, i));
    json_object_set_new(o, "sources", srcs);
    json_object_set_new(o, "loom_version", json_string(LOOM_VERSION));
    char *s = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    LOOM_CHECK(s != NULL);
    char path[4300];
#ifdef LOOM_HAVE_BPE
    /* a BPE dataset carries its tokenizer (canonical tokenizer.json, whose id the shards hold):
     * training records it in checkpoints, generate and eval encode and decode with it */
    if (b->tok) {
        loom_pathf(path, sizeof path, "%s/%s/tokenizer.json", b->tmp, SPLITS[sp]);
        if (loom_tokenizer_save_json(b->tok, path, err) != 0) {
            free(s);
            return -1;
        }
    }
#endif
    loom_pathf(path, sizeof path, "%s/%s/dataset.json", b->tmp, SPLITS[sp]);
    size_t n = strlen(s);
    s = loom_realloc(s, n + 2);
    s[n] = '\n';
    s[n + 1] = 0;
    int rc = loom_write_file_atomic(path, s, n + 1, err);
    free(s);
    return rc;
}

/* Nothing to do: every source reused, the same recipe file, the same source list. */
static int up_to_date(const build *b) {
    if (!b->old_ds) return 0;
    const char *sha = json_string_value(json_object_get(json_object_get(b->old_ds, "recipe"), "sha256"));
    if (!sha || strcmp(sha, b->r.sha256) != 0) return 0;
    json_t *srcs = json_object_get(b->old_ds, "sources");
    if ((int)json_array_size(srcs) != b->r.n_sources) return 0;
    for (int i = 0; i < b->r.n_sources; i++) {
        const char *n = json_string_value(json_object_get(json_array_get(srcs, (size_t)i), "name"));
        if (!b->src[i].reuse || !n || strcmp(n, b->r.sources[i].name) != 0) return 0;
    }
    /* the inputs list must be the same too (a new empty file changes no key but the list) */
    json_t *ins = json_object_get(b->old_ds, "inputs");
    if ((int)json_array_size(ins) != b->in.n) return 0;
    for (int i = 0; i < b->in.n; i++) {
        json_t *x = json_array_get(ins, (size_t)i);
        const char *p = json_string_value(json_object_get(x, "path"));
        json_t *mt = json_object_get(x, "mtime_ns");
        if (!p || strcmp(p, b->in.v[i].path) || !json_is_integer(mt) ||
            json_integer_value(mt) != b->in.v[i].mtime_ns)
            return 0;
    }
    /* and the output holds exactly what a build writes (a stray file gets a clean rebuild) */
    for (int sp = 0; sp < 2; sp++) {
        char dir[4300];
        loom_pathf(dir, sizeof dir, "%s/%s", b->out, SPLITS[sp]);
        DIR *d = opendir(dir);
        if (!d) return 0;
        size_t listed = 0, seen = 0;
        for (int i = 0; i < b->r.n_sources; i++)
            listed += b->src[i].old_lines[sp] ? json_array_size(b->src[i].old_lines[sp]) : 0;
        struct dirent *e;
        int clean = 1;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                !strcmp(e->d_name, "manifest.jsonl") || !strcmp(e->d_name, "dataset.json"))
                continue;
            seen++;
            int found = 0;
            for (int i = 0; i < b->r.n_sources && !found; i++) {
                size_t j;
                json_t *line;
                json_array_foreach(b->src[i].old_lines[sp], j, line) {
                    const char *n = json_string_value(json_object_get(line, "shard"));
                    if (n && !strcmp(n, e->d_name)) found = 1;
                }
            }
            clean &= found;
        }
        closedir(d);
        if (!clean || seen != listed) return 0;
    }
    return 1;
}

/* template: auto on a chat source: the tokenizer_config.json beside the recipe's tokenizer.json
 * (its chat_template picks the built-in, include/loom/chat.h). */
static int resolve_auto_templates(build *b, loom_err *err) {
    for (int i = 0; i < b->r.n_sources; i++) {
        loom_recipe_source *s = &b->r.sources[i];
        if (s->kind != LOOM_SRC_CHAT || strcmp(s->chat_template, "auto")) continue;
        if (!strcmp(b->r.tokenizer, "byte") || !b->r.tokenizer_path)
            return loom_errf(err, "%s:%d: source '%s': template: auto takes the chat template from the "
                                  "tokenizer_config.json beside a BPE tokenizer.json; with the byte tokenizer name "
                                  "the template", b->r.file, s->line, s->name);
        const char *slash = strrchr(b->r.tokenizer_path, '/');
        size_t dl = slash ? (size_t)(slash - b->r.tokenizer_path) + 1 : 0;
        char *p = loom_malloc(dl + sizeof "tokenizer_config.json");
        memcpy(p, b->r.tokenizer_path, dl);
        memcpy(p + dl, "tokenizer_config.json", sizeof "tokenizer_config.json");
        free(s->chat_template);
        s->chat_template = p;
    }
    return 0;
}

static int resolve_tokenizer(build *b, loom_err *err) {
    if (resolve_auto_templates(b, err)) return -1;
    if (!strcmp(b->r.tokenizer, "byte")) {
        b->tok_id = "byte";
        b->vocab = BYTE_VOCAB;
        return 0;
    }
#ifdef LOOM_HAVE_BPE
    if (loom_tokenizer_load_json(b->r.tokenizer_path, &b->tok, err) != 0)
        return loom_err_prefix(err, "%s:%d: tokenizer", b->r.file, b->r.tokenizer_line);
    b->tok_id = loom_tokenizer_id(b->tok);
    b->vocab = loom_tokenizer_vocab_size(b->tok);
    return 0;
#else
    return loom_errf(err, "%s:%d: tokenizer 'bpe' is not available in this build (no "
                     "include/loom/tokenizer.h); use 'tokenizer: byte'", b->r.file, b->r.tokenizer_line);
#endif
}

int loom_data_build(const char *recipe_path, loom_err *err) {
    return loom_data_build_team(recipe_path, NULL, err);
}

int loom_data_build_team(const char *recipe_path, const loom_build_team *team, loom_err *err) {
    build B;
    memset(&B, 0, sizeof B);
    build *b = &B;
    b->lock_fd = -1;
    int rc = -1, made_tmp = 0;
    b->t0 = loom_now();
    b->size = 1;
    int64_t pid0 = (int64_t)getpid(); /* names the temp directory: member 0's pid */
    if (team && team->size > 1) {
        LOOM_CHECK(team->rank >= 0 && team->rank < team->size);
        b->team = team;
        b->rank = team->rank;
        b->size = team->size;
        team->bcast_i64(team->ctx, &pid0, 1);
    }
    const char *fail_env = getenv("LOOM_TEST_FAIL_BUILD");
    if (fail_env && *fail_env) { /* test hook: "RANK" fails that rank, "RANK:kill" kills it */
        char *end;
        long v = strtol(fail_env, &end, 10);
        if (v == b->rank && (!*end || !strcmp(end, ":kill"))) b->fail_shard = *end ? 2 : 1;
    }
    if (loom_recipe_load(recipe_path, &b->r, err) != 0) goto done;
    loom_recipe *r = &b->r;
    if (loom_path_check("output", r->output, LOOM_DIR_PATH_MAX, err)) {
        loom_err_prefix(err, "%s", recipe_path);
        goto done;
    }
    loom_pathf(b->out, sizeof b->out, "%s", r->output);
    for (size_t n = strlen(b->out); n > 1 && b->out[n - 1] == '/'; n--) b->out[n - 1] = 0;
    if (lock_output(b, recipe_path, err) != 0) goto done;
    if (loom_path_exists(b->out) &&
        !(loom_is_dir(b->out) && (looks_like_build(b->out) || dir_is_empty(b->out)))) {
        loom_errf(err, "%s: output '%s' exists and is not a loom data build; refusing to replace it",
                  recipe_path, b->out);
        goto done;
    }
    loom_pathf(b->tmp, sizeof b->tmp, "%s.tmp.%lld", b->out, (long long)pid0);
    loom_pathf(b->old, sizeof b->old, "%s.old.%lld", b->out, (long long)pid0);
    if (resolve_tokenizer(b, err) != 0) goto done;
    b->src = loom_calloc((size_t)r->n_sources, sizeof *b->src);
    for (int i = 0; i < r->n_sources; i++) {
        int before = b->in.n;
        if (loom_inputs_collect(r, i, &b->in, &b->src[i].skipped, err) != 0) goto done;
        b->src[i].n_files = b->in.n - before;
        b->src[i].files = loom_malloc((size_t)(b->src[i].n_files + 1) * sizeof(int));
        for (int j = 0; j < b->src[i].n_files; j++) b->src[i].files[j] = before + j;
        for (int k = 0; k < r->sources[i].n_steps; k++)
            b->src[i].has_exact |= r->sources[i].steps[k].kind == LOOM_STEP_DEDUP_EXACT;
    }
    if (load_labels(b, err) != 0) goto done;
    load_previous(b);
    if (hash_inputs(b, err) != 0) goto done;
    compute_keys(b);
    decide_reuse(b);
    uint8_t stale = (uint8_t)!up_to_date(b);
    if (multi(b)) b->team->max_u8(b->team->ctx, &stale, 1); /* every member must agree */
    if (!stale) {
        if (b->rank == 0)
            loom_log("data build: %s: up to date (%d source(s) unchanged: nothing read, nothing written) -> %s",
                 r->name, r->n_sources, b->out);
        rc = 0;
        goto done;
    }
    if (b->rank == 0) {
        remove_tree(b->tmp);
        if (loom_mkdirs(b->tmp, err) != 0) goto done;
        made_tmp = 1;
        for (int sp = 0; sp < 2; sp++) {
            char p[4400];
            loom_pathf(p, sizeof p, "%s/%s", b->tmp, SPLITS[sp]);
            if (loom_mkdirs(p, err) != 0) goto done;
            loom_pathf(p, sizeof p, "%s/%s/manifest.jsonl", b->tmp, SPLITS[sp]);
            if (loom_write_file_atomic(p, "", 0, err) != 0) goto done;
        }
    }
    if (multi(b)) {
        b->team->barrier(b->team->ctx); /* the temp directory exists */
        made_tmp = 1;
    }
    if (r->dedup_across_sources) b->global = loom_hashset_new();
    for (int i = 0; i < r->n_sources; i++) {
        int res = b->src[i].need_docs ? build_source(b, i, err) : reuse_source(b, i, err);
        if (res != 0) goto done;
    }
    for (int sp = 0; sp < 2 && b->rank == 0; sp++)
        if (write_dataset_json(b, sp, err) != 0) goto done;
    uint64_t train_tokens = 0;
    for (int i = 0; i < r->n_sources; i++) train_tokens += b->src[i].split[0].tokens;
    if (train_tokens == 0) {
        loom_errf(err, "%s: the sources hold no training documents (after the steps)", recipe_path);
        goto done;
    }
    if (b->rank != 0) { /* every shard of this member is in place (gathered by member 0) */
        made_tmp = 0;
        rc = 0;
        goto done;
    }
    /* swap into place */
    if (loom_path_exists(b->out) && rename(b->out, b->old) != 0) {
        loom_errf(err, "%s: cannot move the previous build aside: %s", b->out, strerror(errno));
        goto done;
    }
    if (rename(b->tmp, b->out) != 0) {
        loom_errf(err, "%s: cannot rename the new build into place: %s", b->out, strerror(errno));
        if (loom_path_exists(b->old)) rename(b->old, b->out);
        goto done;
    }
    made_tmp = 0;
    remove_tree(b->old);
    int reused = 0;
    uint64_t tok[2] = {0, 0}, docs[2] = {0, 0}, shards[2] = {0, 0};
    for (int i = 0; i < r->n_sources; i++) {
        reused += b->src[i].reuse;
        for (int sp = 0; sp < 2; sp++) {
            tok[sp] += b->src[i].split[sp].tokens;
            docs[sp] += b->src[i].split[sp].docs;
            shards[sp] += b->src[i].split[sp].shards;
        }
    }
    char team_note[64] = "";
    if (multi(b)) snprintf(team_note, sizeof team_note, ", %d ranks", b->size);
    loom_log("data build: %s: %d files, %d source(s) rebuilt, %d reused -> %s: train %llu shard(s), "
             "%llu tokens, %llu docs; val %llu shard(s), %llu tokens, %llu docs (%.2f s%s)",
             r->name, b->in.n, r->n_sources - reused, reused, b->out, (unsigned long long)shards[0],
             (unsigned long long)tok[0], (unsigned long long)docs[0], (unsigned long long)shards[1],
             (unsigned long long)tok[1], (unsigned long long)docs[1], loom_now() - b->t0, team_note);
    rc = 0;
done:
    /* on an error any member removes the temp directory (the caller then ends the team) */
    if (made_tmp && rc != 0) {
        if (multi(b) && !loom_is_dir(b->tmp))
            loom_err_prefix(err, "%s is gone: another rank failed first (see its message); here", b->tmp);
        remove_tree(b->tmp);
    }
    for (int i = 0; b->src && i < b->r.n_sources; i++) {
        src_state *st = &b->src[i];
        free(st->files);
        json_decref(st->old_lines[0]);
        json_decref(st->old_lines[1]);
        loom_skips_free(&st->skipped);
        loom_skips_free(&st->bad_lines);
        loom_skips_free(&st->unlabeled);
        free(st->counts);
        loom_labels_free(st->labels);
        loom_chat_template_free(st->chat);
    }
    free(b->src);
    free(b->classes);
    loom_hashset_free(b->global);
    json_decref(b->old_ds);
    loom_inputs_free(&b->in);
#ifdef LOOM_HAVE_BPE
    loom_tokenizer_free(b->tok);
#endif
    loom_recipe_free(&b->r);
    loom_unlock_file(b->lock_fd);
    return rc;
}
