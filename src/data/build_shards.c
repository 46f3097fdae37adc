/* The data build per source: reading its files into documents, the steps, train/val routing,
 * tokenizing (byte, BPE, chat) and writing its shards, in parallel and over a team
 * (build_internal.h). */
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

/* ---- small helpers ---- */
/* The block [*off, *off + *len) of n items that member i of size owns (the first n % size
 * members get one more). */
static void block_of(uint64_t n, int size, int i, uint64_t *off, uint64_t *len) {
    uint64_t base = n / (uint64_t)size, rem = n % (uint64_t)size, u = (uint64_t)i;
    *off = u * base + (u < rem ? u : rem);
    *len = base + (u < rem);
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

/* the train/val routing: a hash of the document's bytes, so duplicates land together */
static int is_val(const uint8_t *p, size_t n, double frac) {
    if (frac <= 0) return 0;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    uint64_t u = loom_rng_u64(h, loom_hash_str("loom.data.val_split"), n);
    return (double)(u >> 11) * (1.0 / 9007199254740992.0) < frac;
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
        json_t *line = build_manifest_line(b, s, name, sha, hi - lo, (uint64_t)nd[k], created);
        rc = build_append_line(b, sp, line, err);
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
                json_t *line = build_manifest_line(b, s, name, sha, hi - lo, n_docs, created);
                ok = build_append_line(b, sp, line, &e) == 0;
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

/* A preference pair's document (segments [0, pair_seg) the chosen conversation, the rest the
 * rejected one) as two windows of T tokens, each half encoded and padded to T (pad tokens
 * mask 0): *ids 2T tokens. 1 (ids empty) when a half is longer than T (dropped, as
 * too_long: drop), 0, or -1 on an encoding error. */
static int pref_encode(const loom_chat_doc *cd, uint32_t pair_seg, const loom_tokenizer *tok,
                       uint64_t T, int32_t pad, loom_ids *ids, uint8_t **mask, loom_err *err) {
    LOOM_CHECK(pair_seg > 0 && pair_seg < cd->n_seg);
    ids->ids = loom_malloc(2 * T * sizeof *ids->ids);
    ids->n = 0;
    *mask = loom_malloc(2 * T);
    int rc = 0;
    const uint64_t cut = cd->seg[pair_seg - 1].end;
    for (int h = 0; h < 2 && rc == 0; h++) {
        loom_chat_seg *segs = loom_malloc(cd->n_seg * sizeof *segs);
        size_t n = 0;
        for (size_t k = h ? pair_seg : 0; k < (h ? cd->n_seg : pair_seg); k++)
            segs[n++] = (loom_chat_seg){cd->seg[k].end - (h ? cut : 0), cd->seg[k].train};
        loom_chat_doc half = {cd->text + (h ? cut : 0), (h ? cd->len - cut : cut), 0, segs, n, n};
        loom_ids v = {0};
        uint8_t *m = NULL;
        if (loom_chat_encode(&half, tok, &v, &m, err) != 0) rc = -1;
        else if (v.n > T) rc = 1;
        else {
            memcpy(ids->ids + h * T, v.ids, v.n * sizeof *v.ids);
            memcpy(*mask + h * T, m, v.n);
            for (uint64_t k = v.n; k < T; k++) ids->ids[h * T + k] = pad, (*mask)[h * T + k] = 0;
        }
        free(v.ids);
        free(m);
        free(segs);
    }
    if (rc == 0) ids->n = 2 * T;
    else {
        free(ids->ids);
        free(*mask);
        ids->ids = NULL, *mask = NULL;
    }
    return rc;
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
    if (s->preference && (T == 0 || (uint64_t)b->r.shard_tokens % (2 * T) != 0)) {
        loom_tokenizer_free(own);
        return loom_errf(err, "%s:%d: source '%s': kind: preference needs shard_tokens (%lld) to be "
                              "a multiple of 2 x seq_len (%lld), so that every pair (its chosen "
                              "and its rejected window) lies in one shard", b->r.file, s->line,
                         s->name, (long long)b->r.shard_tokens, (long long)(2 * T));
    }
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
        if (s->preference) { /* two windows: the chosen conversation, the rejected one */
            int r = pref_encode(&cd, dc->pair_seg, tok, T, pad, &v, &m, &e);
            if (r < 0) {
                #pragma omp critical(loom_build_err)
                if (!failed) failed = 1, first = e;
                continue;
            }
            if (r == 1) dropped++;
            ids[i] = v.ids;
            masks[i] = m;
            ntok[i] = v.n;
            continue;
        }
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

int build_source(build *b, int si, loom_err *err) {
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
        rc = build_reuse_source(b, si, err);
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
