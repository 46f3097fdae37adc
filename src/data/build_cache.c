/* The data build's cache: the previous build (dataset.json and manifests), the inputs' hashes,
 * the labels, each source's cache key and the reuse decisions, and linking a reused source's
 * shards (build_internal.h). */
#define _GNU_SOURCE
#include "data/build_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
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
void build_load_previous(build *b) {
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

int build_hash_inputs(build *b, loom_err *err) {
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
int build_load_labels(build *b, loom_err *err) {
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
/* one line of a source's key text (in base's loom_sbuf) */
static void kput(loom_sbuf *k, const char *s) {
    loom_sbuf_append(k, s, strlen(s));
    loom_sbuf_append(k, "\n", 1);
}

void build_compute_keys(build *b) {
    char num[128];
    for (int i = 0; i < b->r.n_sources; i++) {
        const loom_recipe_source *s = &b->r.sources[i];
        src_state *st = &b->src[i];
        loom_sbuf k = {0};
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
        loom_sha256_hex(k.p, k.len, st->key);
        free(k.p);
    }
}

/* A source is reused when its key is unchanged and its old shards are intact. A team splits
 * the shard checks and agrees on the result. */
void build_decide_reuse(build *b) {
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
int build_reuse_source(build *b, int si, loom_err *err) {
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
            int rc = build_append_line(b, sp, nl, err);
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
