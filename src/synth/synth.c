/* loom synth: a synthetic-data pipeline (docs/synth.md).
 *
 * Rounds: every (seed, sample) item starts at attempt 1; each round generates the prompts of
 * all pending items (block by block: the local engine batches them; the HTTP generator sends them over
 * `concurrency` connections), then runs the validators in order on every output (threads);
 * an item whose output fails gets another attempt with the failing validator's message added
 * to its prompt, up to max_attempts. Sampling seeds derive from (pipeline seed, item, attempt),
 * and the output is written in item order, so it does not depend on the thread count. */
#define _GNU_SOURCE
#include "loom/synth.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>
#include <zstd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "loom/chat.h"
#include "loom/checkpoint.h"
#include "loom/comm.h"
#include "loom/infer.h"
#include "loom/progress.h"
#include "loom/signals.h"
#include "loom/tokenizer.h"
#include "loom/train.h"

/* ---- YAML -> JSON (the pipeline file) ------------------------------------------------- */

static json_t *yaml_node_json(yaml_document_t *d, yaml_node_t *n, int depth, long *budget) {
    if (!n || depth > 64 || --*budget < 0) return NULL;
    switch (n->type) {
    case YAML_SCALAR_NODE: {
        const char *v = (const char *)n->data.scalar.value;
        const size_t len = n->data.scalar.length;
        if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
            char *end;
            if (len && len < 32) {
                errno = 0;
                long long i = strtoll(v, &end, 10);
                if (!errno && *end == 0) return json_integer(i);
                double x = strtod(v, &end);
                if (*end == 0 && end != v) return json_real(x);
            }
            if (!strcmp(v, "true")) return json_true();
            if (!strcmp(v, "false")) return json_false();
            if (!strcmp(v, "null") || !strcmp(v, "~") || len == 0) return json_null();
        }
        return json_stringn(v, len);
    }
    case YAML_SEQUENCE_NODE: {
        json_t *a = json_array();
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
            json_t *x = yaml_node_json(d, yaml_document_get_node(d, *it), depth + 1, budget);
            if (!x) {
                json_decref(a);
                return NULL;
            }
            json_array_append_new(a, x);
        }
        return a;
    }
    case YAML_MAPPING_NODE: {
        json_t *o = json_object();
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(d, p->key);
            json_t *x = k && k->type == YAML_SCALAR_NODE
                            ? yaml_node_json(d, yaml_document_get_node(d, p->value), depth + 1, budget)
                            : NULL;
            if (!x || json_object_get(o, (const char *)k->data.scalar.value)) {
                json_decref(x);
                json_decref(o);
                return NULL;
            }
            json_object_set_new(o, (const char *)k->data.scalar.value, x);
        }
        return o;
    }
    default: return NULL;
    }
}

static json_t *load_yaml(const char *path, loom_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (loom_read_file(path, (size_t)16 << 20, &text, &len, err)) return NULL;
    yaml_parser_t p;
    yaml_document_t d;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    json_t *out = NULL;
    if (!yaml_parser_load(&p, &d)) {
        loom_errf(err, "%s:%zu:%zu: %s", path, p.problem_mark.line + 1, p.problem_mark.column + 1,
                  p.problem ? p.problem : "malformed YAML");
    } else {
        long budget = 1000000;
        yaml_node_t *root = yaml_document_get_root_node(&d);
        out = root ? yaml_node_json(&d, root, 0, &budget) : NULL;
        if (!out || !json_is_object(out)) {
            json_decref(out);
            out = NULL;
            loom_errf(err, "%s: expected a mapping at the top (no duplicate keys, at most 64 "
                           "levels and 10^6 nodes)", path);
        }
        yaml_document_delete(&d);
    }
    yaml_parser_delete(&p);
    free(text);
    return out;
}

/* ---- small helpers ---------------------------------------------------------------------- */

static void sb_str(loom_sbuf *b, const char *s) { loom_sbuf_append(b, s, strlen(s)); }

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* ---- MinHash near-duplicates (docs/synth.md) ------------------------------------------------
 * A text's shingles are its byte k-grams (k = `shingle`; a text shorter than k is one
 * shingle), each hashed with FNV-1a 64 and taken mod p = 2^61 - 1. Permutation i maps x to
 * (a_i x + b_i) mod p, with a_i = 1 + s mod (p - 1) and b_i = s' mod p from a SplitMix64 stream
 * seeded with 0x6d696e68617368 ("minhash"), drawn a_0, b_0, a_1, b_1, ...; the signature holds
 * each permutation's minimum over the shingles. Two texts' Jaccard similarity is estimated as
 * the fraction of equal signature entries. LSH: the signature is cut into `bands` bands of
 * perms / bands rows; texts that agree on a whole band are candidates, and a candidate whose
 * estimate reaches `threshold` makes the text a near duplicate. */
#define MH_P ((1ull << 61) - 1)

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct mh_index {
    int perms, bands, rows, shingle;
    double threshold;
    uint64_t *a, *b;
    uint64_t *sig;              /* the pool's signatures, n x perms */
    int *origin;                /* >= 0: an item index; < 0: seed -1 - origin */
    int n, cap;
    uint64_t *bkey;             /* buckets (open addressing): band key -> first node */
    int *bhead;
    size_t bcap, bn;
    int *nidx, *nnext;          /* nodes: pool index, next node */
    size_t nn, ncap;
    int *stamp;                 /* per pool entry: the query that saw it last */
    int query;
} mh_index;

static void mh_init(mh_index *m) {
    m->rows = m->perms / m->bands;
    m->a = loom_malloc((size_t)m->perms * sizeof *m->a);
    m->b = loom_malloc((size_t)m->perms * sizeof *m->b);
    uint64_t s = 0x6d696e68617368ull;
    for (int i = 0; i < m->perms; i++) {
        m->a[i] = 1 + splitmix64(&s) % (MH_P - 1);
        m->b[i] = splitmix64(&s) % MH_P;
    }
    m->bcap = 1024;
    m->bkey = loom_calloc(m->bcap, sizeof *m->bkey);
    m->bhead = loom_malloc(m->bcap * sizeof *m->bhead);
    for (size_t i = 0; i < m->bcap; i++) m->bhead[i] = -1;
}

static void mh_free(mh_index *m) {
    free(m->a), free(m->b), free(m->sig), free(m->origin), free(m->bkey), free(m->bhead);
    free(m->nidx), free(m->nnext), free(m->stamp);
}

static void mh_signature(const mh_index *m, const char *t, size_t n, uint64_t *sig) {
    for (int i = 0; i < m->perms; i++) sig[i] = UINT64_MAX;
    const size_t k = (size_t)m->shingle;
    const size_t count = n < k ? (n ? 1 : 0) : n - k + 1;
    for (size_t s = 0; s < count; s++) {
        const uint64_t x = fnv1a(t + s, n < k ? n : k) % MH_P;
        for (int i = 0; i < m->perms; i++) {
            const uint64_t h = (uint64_t)(((unsigned __int128)m->a[i] * x + m->b[i]) % MH_P);
            if (h < sig[i]) sig[i] = h;
        }
    }
}

static uint64_t mh_band_key(const mh_index *m, const uint64_t *sig, int band) {
    uint64_t h = loom_mix64(0x62616e64ull + (uint64_t)band);
    for (int r = 0; r < m->rows; r++) h = loom_mix64(h ^ sig[band * m->rows + r]);
    return h ? h : 1; /* 0 marks an empty bucket */
}

static size_t mh_slot(const mh_index *m, uint64_t key) {
    size_t i = (size_t)key & (m->bcap - 1);
    while (m->bkey[i] && m->bkey[i] != key) i = (i + 1) & (m->bcap - 1);
    return i;
}

static void mh_add(mh_index *m, const uint64_t *sig, int origin) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->sig = loom_realloc(m->sig, (size_t)m->cap * (size_t)m->perms * sizeof *m->sig);
        m->origin = loom_realloc(m->origin, (size_t)m->cap * sizeof *m->origin);
        m->stamp = loom_realloc(m->stamp, (size_t)m->cap * sizeof *m->stamp);
    }
    const int idx = m->n++;
    memcpy(m->sig + (size_t)idx * (size_t)m->perms, sig, (size_t)m->perms * sizeof *sig);
    m->origin[idx] = origin;
    m->stamp[idx] = 0;
    for (int band = 0; band < m->bands; band++) {
        if (2 * (m->bn + 1) > m->bcap) { /* grow and rehash */
            const size_t oc = m->bcap;
            uint64_t *ok = m->bkey;
            int *oh = m->bhead;
            m->bcap *= 2;
            m->bkey = loom_calloc(m->bcap, sizeof *m->bkey);
            m->bhead = loom_malloc(m->bcap * sizeof *m->bhead);
            for (size_t i = 0; i < m->bcap; i++) m->bhead[i] = -1;
            for (size_t i = 0; i < oc; i++) {
                if (!ok[i]) continue;
                const size_t s = mh_slot(m, ok[i]);
                m->bkey[s] = ok[i];
                m->bhead[s] = oh[i];
            }
            free(ok);
            free(oh);
        }
        const uint64_t key = mh_band_key(m, sig, band);
        const size_t s = mh_slot(m, key);
        if (!m->bkey[s]) m->bkey[s] = key, m->bn++;
        if (m->nn == m->ncap) {
            m->ncap = m->ncap ? 2 * m->ncap : 1024;
            m->nidx = loom_realloc(m->nidx, m->ncap * sizeof *m->nidx);
            m->nnext = loom_realloc(m->nnext, m->ncap * sizeof *m->nnext);
        }
        m->nidx[m->nn] = idx;
        m->nnext[m->nn] = m->bhead[s];
        m->bhead[s] = (int)m->nn++;
    }
}

/* the candidate with the highest estimated similarity (-1: no candidate) */
static int mh_query(mh_index *m, const uint64_t *sig, double *best) {
    int bi = -1;
    *best = 0;
    m->query++;
    for (int band = 0; band < m->bands; band++) {
        const size_t s = mh_slot(m, mh_band_key(m, sig, band));
        if (!m->bkey[s]) continue;
        for (int nd = m->bhead[s]; nd >= 0; nd = m->nnext[nd]) {
            const int idx = m->nidx[nd];
            if (m->stamp[idx] == m->query) continue;
            m->stamp[idx] = m->query;
            const uint64_t *o = m->sig + (size_t)idx * (size_t)m->perms;
            int eq = 0;
            for (int i = 0; i < m->perms; i++) eq += o[i] == sig[i];
            const double j = (double)eq / m->perms;
            if (bi < 0 || j > *best || (j == *best && idx < bi)) *best = j, bi = idx;
        }
    }
    return bi;
}

/* ---- the content-hash cache (docs/synth.md) -------------------------------------------------
 * DIR/generations.jsonl: {"k": key, "text" | "hex": output, "tokens": n}, key = SHA-256 of
 * (the generator's identity and settings, the sampling seed unless greedy, the prompt);
 * DIR/validations.jsonl: {"k": key, "ok", "message"[, "score"]}, key = SHA-256 of (the
 * validator's settings and what they name: the command's files, the scoring checkpoint; the
 * output). Appended by rank 0 after every round (flushed, fsynced), so an interrupted run
 * resumes from its last round; a torn last line is skipped. Entries are never rewritten: a
 * changed setting makes new keys. */
typedef struct cache {
    int on;
    char dir[4096];
    json_t *gen, *val;
    FILE *fg, *fv;
    long long gen_hits, gen_runs, val_hits, val_runs, skipped;
    int torn[2];                /* the file ends without a newline (generations, validations) */
} cache;

static void sha_hex_parts(char hex[65], const char *a, const char *b, size_t bn) {
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

static int cache_open(cache *c, int writer, loom_err *err) {
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

static void cache_close(cache *c) {
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

static int cache_sync(cache *c, loom_err *err) {
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

static int text_from_json(json_t *o, char **t, size_t *n) {
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

/* ---- the scoring model: mean log-likelihood of the output (docs/synth.md) -------------------
 * The output's tokens (after `prefix`'s, which are context only) through a loom checkpoint's
 * forward; the score is the mean of log p(token | the tokens before it) over the output's
 * tokens that have a token before them. Loaded on first use; one forward at a time. */
typedef struct scorer {
    char ckpt[1024];
    char *prefix;
    pthread_mutex_t mu;
    int loaded, failed;
    loom_err err;
    loom_model *m;
    loom_tokenizer *tok;
    int T, V;
    int32_t *in, *tg;
} scorer;

static int score_text(scorer *s, const char *text, size_t len, double *score, char *msg, size_t n) {
    pthread_mutex_lock(&s->mu);
    int rc = -1;
    if (!s->loaded && !s->failed) {
        loom_run_data *run = NULL;
        if (loom_load_model_ex(s->ckpt, 1, 0, &s->m, NULL, &run, &s->err) ||
            loom_run_data_tokenizer(run, &s->tok, &s->err)) {
            s->failed = 1;
        } else {
            const loom_model_config *c = loom_model_get_config(s->m);
            s->T = c->max_seq_len;
            s->V = c->vocab_size;
            s->in = loom_malloc((size_t)(s->T + 1) * sizeof *s->in);
            s->tg = loom_malloc((size_t)(s->T + 1) * sizeof *s->tg);
            s->loaded = 1;
        }
        loom_run_data_free(run);
    }
    if (s->failed) {
        snprintf(msg, n, "the scoring model: %.400s", s->err.msg);
        goto out;
    }
    loom_ids a = {0}, b = {0};
    loom_err e = {{0}};
    if ((s->prefix[0] && loom_tokenizer_encode(s->tok, s->prefix, strlen(s->prefix), &a, &e)) ||
        loom_tokenizer_encode_ex(s->tok, text, len, s->prefix[0] ? LOOM_TOK_CONTINUE : 0, &b, &e)) { /* continues it */
        snprintf(msg, n, "cannot tokenize: %.400s", e.msg);
        loom_ids_free(&a), loom_ids_free(&b);
        goto out;
    }
    /* the sequence: prefix + output, at most T + 1 tokens (the output's first ones) */
    int total = 0;
    for (size_t i = 0; i < a.n && total < s->T + 1; i++) s->in[total++] = a.ids[i];
    const int n_prefix = total;
    for (size_t i = 0; i < b.n && total < s->T + 1; i++) s->in[total++] = b.ids[i];
    loom_ids_free(&a), loom_ids_free(&b);
    const int first = n_prefix > 1 ? n_prefix : 1; /* the first scored position */
    if (total - first < 1) {
        snprintf(msg, n, "too short to score (%d tokens)", total - n_prefix);
        goto out;
    }
    const int T = total - 1;
    for (int t = 0; t < T; t++) s->tg[t] = s->in[t + 1];
    loom_model_forward(s->m, s->in, NULL, 1, T);
    const float *lg = loom_model_logits(s->m);
    double sum = 0;
    for (int t = first - 1; t < T; t++) { /* log softmax at the target */
        const float *row = lg + (size_t)t * (size_t)s->V;
        float mx = row[0];
        for (int v = 1; v < s->V; v++) mx = row[v] > mx ? row[v] : mx;
        double z = 0;
        for (int v = 0; v < s->V; v++) z += exp((double)row[v] - mx);
        sum += (double)row[s->tg[t]] - mx - log(z);
    }
    *score = sum / (T - (first - 1));
    rc = 0;
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void scorer_free(scorer *s) {
    if (!s) return;
    loom_model_free(s->m);
    loom_tokenizer_free(s->tok);
    free(s->in), free(s->tg), free(s->prefix);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- seeds ---------------------------------------------------------------------------- */

typedef struct seeds {
    char **v;
    size_t *len;
    int n, cap;
} seeds;

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
static int load_seeds(const char *where, json_t *list, seeds *s, loom_err *err) {
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
static void render(loom_sbuf *out, const char *tpl, const char *seed, size_t seed_len, const char *fb) {
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

/* ---- validators ----------------------------------------------------------------------- */

enum { V_LENGTH, V_REGEX, V_JSON, V_COMMAND, V_UNIQUE, V_NEARDUP, V_SCORE };

typedef struct validator {
    int kind;
    char name[64];
    long long min, max;          /* length (bytes) */
    pcre2_code *re;              /* regex */
    json_t *schema;              /* json (NULL: parse only) */
    char **argv;                 /* command */
    int argc;
    double timeout_s;
    mh_index *mh;                /* near_duplicate */
    scorer *sc;                  /* score */
    double smin, smax;           /* score: the accepted range */
    char key[65];                /* the cache key of the settings (command, score) */
} validator;

/* a JSON-schema subset: type, enum, properties, required, additionalProperties (false),
 * items, minLength/maxLength, minimum/maximum, minItems/maxItems */
static int schema_check(json_t *s, json_t *x, const char *path, char *msg, size_t n) {
    if (!json_is_object(s)) return 0;
    json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) {
        const char *ty = json_string_value(t);
        int ok = !strcmp(ty, "object") ? json_is_object(x)
               : !strcmp(ty, "array") ? json_is_array(x)
               : !strcmp(ty, "string") ? json_is_string(x)
               : !strcmp(ty, "integer") ? json_is_integer(x)
               : !strcmp(ty, "number") ? json_is_number(x)
               : !strcmp(ty, "boolean") ? json_is_boolean(x)
               : !strcmp(ty, "null") ? json_is_null(x) : 1;
        if (!ok) {
            snprintf(msg, n, "%s: expected %s", path, ty);
            return -1;
        }
    }
    json_t *en = json_object_get(s, "enum");
    if (json_is_array(en)) {
        size_t i;
        json_t *v;
        int found = 0;
        json_array_foreach(en, i, v) found |= json_equal(v, x);
        if (!found) {
            snprintf(msg, n, "%s: not one of the allowed values", path);
            return -1;
        }
    }
    if (json_is_string(x)) {
        json_t *a = json_object_get(s, "minLength"), *b = json_object_get(s, "maxLength");
        const long long l = (long long)json_string_length(x);
        if ((json_is_integer(a) && l < json_integer_value(a)) || (json_is_integer(b) && l > json_integer_value(b))) {
            snprintf(msg, n, "%s: string length %lld out of range", path, l);
            return -1;
        }
    }
    if (json_is_number(x)) {
        json_t *a = json_object_get(s, "minimum"), *b = json_object_get(s, "maximum");
        const double v = json_number_value(x);
        if ((json_is_number(a) && v < json_number_value(a)) || (json_is_number(b) && v > json_number_value(b))) {
            snprintf(msg, n, "%s: %g out of range", path, v);
            return -1;
        }
    }
    if (json_is_object(x)) {
        json_t *req = json_object_get(s, "required"), *props = json_object_get(s, "properties");
        size_t i;
        json_t *v;
        json_array_foreach(req, i, v) {
            if (json_is_string(v) && !json_object_get(x, json_string_value(v))) {
                snprintf(msg, n, "%s: missing required key '%s'", path, json_string_value(v));
                return -1;
            }
        }
        const char *k;
        json_object_foreach(x, k, v) {
            json_t *ps = json_is_object(props) ? json_object_get(props, k) : NULL;
            if (!ps && json_is_false(json_object_get(s, "additionalProperties"))) {
                snprintf(msg, n, "%s: unexpected key '%s'", path, k);
                return -1;
            }
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s", path, k);
            if (ps && schema_check(ps, v, sub, msg, n)) return -1;
        }
    }
    if (json_is_array(x)) {
        json_t *a = json_object_get(s, "minItems"), *b = json_object_get(s, "maxItems");
        const long long l = (long long)json_array_size(x);
        if ((json_is_integer(a) && l < json_integer_value(a)) || (json_is_integer(b) && l > json_integer_value(b))) {
            snprintf(msg, n, "%s: %lld items out of range", path, l);
            return -1;
        }
        json_t *it = json_object_get(s, "items");
        size_t i;
        json_t *v;
        json_array_foreach(x, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            if (it && schema_check(it, v, sub, msg, n)) return -1;
        }
    }
    return 0;
}

/* runs argv with the sample on stdin; the verdict is the exit status, the message its stderr */
static int run_command(const validator *v, const char *text, size_t len, char *msg, size_t n) {
    /* close-on-exec: validators run on several threads, and a pipe another thread's child
     * inherited would keep this child's stdin open (no EOF) until that child exits: two
     * such children wait for each other until the timeout. dup2 clears the flag on 0-2. */
    int in[2], er[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(er, O_CLOEXEC)) {
        snprintf(msg, n, "cannot create pipes: %s", strerror(errno));
        return -1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
        snprintf(msg, n, "cannot fork: %s", strerror(errno));
        close(in[0]), close(in[1]), close(er[0]), close(er[1]);
        return -1;
    }
    if (pid == 0) {
        loom_signals_child(); /* the mask and dispositions loom started with */
        dup2(in[0], 0);
        dup2(er[1], 2);
        const int dn = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (dn >= 0) dup2(dn, 1);
        close(in[0]), close(in[1]), close(er[0]), close(er[1]);
        execvp(v->argv[0], v->argv);
        fprintf(stderr, "cannot run %s: %s", v->argv[0], strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(er[1]);
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    fcntl(er[0], F_SETFL, O_NONBLOCK);
    size_t sent = 0, got = 0;
    const double t0 = loom_now();
    int in_open = 1, er_open = 1, timed_out = 0;
    if (len == 0) close(in[1]), in_open = 0;
    char ebuf[1024];
    while (er_open) {
        struct pollfd p[2] = {{er[0], POLLIN, 0}, {in_open ? in[1] : -1, POLLOUT, 0}};
        const double left = v->timeout_s - (loom_now() - t0);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        if (poll(p, 2, (int)(left * 1000) + 1) < 0 && errno != EINTR) break;
        if (in_open && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            const ssize_t w = write(in[1], text + sent, len - sent);
            if (w > 0) sent += (size_t)w;
            if (w < 0 && errno != EAGAIN) sent = len;
            if (sent == len) close(in[1]), in_open = 0;
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            char tmp[512];
            const ssize_t r = read(er[0], tmp, sizeof tmp);
            if (r <= 0) {
                er_open = 0;
            } else {
                const size_t keep = got + (size_t)r < sizeof ebuf - 1 ? (size_t)r : sizeof ebuf - 1 - got;
                memcpy(ebuf + got, tmp, keep);
                got += keep;
            }
        }
    }
    if (in_open) close(in[1]);
    close(er[0]);
    int status = 0;
    if (timed_out) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ebuf[got] = 0;
    while (got && (ebuf[got - 1] == '\n' || ebuf[got - 1] == '\r')) ebuf[--got] = 0;
    if (timed_out) {
        snprintf(msg, n, "timed out after %g s", v->timeout_s);
        return -1;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    snprintf(msg, n, "%.400s", got ? ebuf : "rejected (non-zero exit)");
    return -1;
}

static int validate(const validator *v, const char *text, size_t len, char *msg, size_t n) {
    msg[0] = 0;
    switch (v->kind) {
    case V_LENGTH:
        if ((long long)len < v->min || (v->max >= 0 && (long long)len > v->max)) {
            snprintf(msg, n, "length %zu is outside [%lld, %lld]", len, v->min, v->max);
            return -1;
        }
        return 0;
    case V_REGEX: {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(v->re, NULL);
        const int r = pcre2_match(v->re, (PCRE2_SPTR)text, len, 0, 0, md, NULL);
        pcre2_match_data_free(md);
        if (r < 0) {
            snprintf(msg, n, "does not match the pattern");
            return -1;
        }
        return 0;
    }
    case V_JSON: {
        json_error_t je;
        json_t *x = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
        if (!x) {
            snprintf(msg, n, "not JSON: %s at column %d", je.text, je.column);
            return -1;
        }
        const int r = v->schema ? schema_check(v->schema, x, "$", msg, n) : 0;
        json_decref(x);
        return r;
    }
    case V_COMMAND: return run_command(v, text, len, msg, n);
    default: return 0;
    }
}

/* ---- generators ----------------------------------------------------------------------- */

typedef struct gen_cfg {
    int http;
    char url[1024];
    char model[256];
    char checkpoint[1024];
    int max_tokens, top_k, concurrency, retries, chat, batch;
    int bf16;                   /* generator.weights: bf16 (local; docs/inference.md) */
    int cbf16;                  /* generator.compute: bf16 (local; implies weights bf16) */
    double temperature, top_p, timeout_s;
    char *stop[17];             /* + the chat template's end of turn (local) */
    int n_stop;
    loom_chat_template *chat_tpl; /* local chat form: generator.chat_template */
} gen_cfg;

typedef struct item {
    int seed_idx, sample;
    int attempt;
    int done, accepted;
    char *prompt;               /* this attempt's prompt */
    char *text;                 /* this attempt's output */
    size_t tlen;
    int gen_ok;
    char gen_err[1536];
    int failed_validator;       /* -1: all passed */
    char vmsg[1024];
    json_t *results;            /* this attempt's validator results */
    int tokens;
    int gen_hit;                /* the output came from the cache */
    int cached;                 /* this attempt's outcome went into the cache */
    char gkey[65];              /* its generation's cache key ("" without a cache) */
    json_t *vfresh;             /* validation results to add to the cache */
    int val_hits, val_runs;
} item;

/* ---- HTTP (libcurl) ---- */

static size_t curl_sink(char *p, size_t sz, size_t nm, void *ud) {
    loom_sbuf *b = ud;
    if (b->len + sz * nm > ((size_t)64 << 20)) return 0;
    loom_sbuf_append(b, p, sz * nm);
    return sz * nm;
}

static void http_one(const gen_cfg *g, item *it, uint64_t seed) {
    json_t *req = json_pack("{s:s,s:i,s:f,s:f,s:I}", "model", g->model, "max_tokens", g->max_tokens,
                            "temperature", g->temperature, "top_p", g->top_p, "seed",
                            (json_int_t)(seed & 0x3fffffffffffffffull));
    if (g->top_k) json_object_set_new(req, "top_k", json_integer(g->top_k));
    if (g->n_stop) {
        json_t *a = json_array();
        for (int i = 0; i < g->n_stop; i++) json_array_append_new(a, json_string(g->stop[i]));
        json_object_set_new(req, "stop", a);
    }
    size_t pl;
    char *clean = loom_utf8_sanitize(it->prompt, strlen(it->prompt), &pl);
    if (g->chat)
        json_object_set_new(req, "messages", json_pack("[{s:s,s:s%}]", "role", "user", "content", clean, pl));
    else
        json_object_set_new(req, "prompt", json_stringn(clean, pl));
    free(clean);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    char url[1200];
    snprintf(url, sizeof url, "%s%s", g->url, g->chat ? "/chat/completions" : "/completions");
    it->gen_ok = 0;
    for (int attempt = 0; attempt <= g->retries; attempt++) {
        if (attempt) usleep((useconds_t)(100000u << (attempt < 6 ? attempt : 6)));
        CURL *c = curl_easy_init();
        loom_sbuf resp = {0};
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, curl_sink);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &resp);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(g->timeout_s * 1000));
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        const CURLcode rc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(h);
        curl_easy_cleanup(c);
        if (rc != CURLE_OK) {
            snprintf(it->gen_err, sizeof it->gen_err, "%s: %s", url, curl_easy_strerror(rc));
            free(resp.p);
            continue; /* connection errors and timeouts are retried */
        }
        json_t *r = resp.p ? json_loads(resp.p, 0, NULL) : NULL;
        free(resp.p);
        if (status != 200) {
            json_t *m = json_object_get(json_object_get(r, "error"), "message");
            snprintf(it->gen_err, sizeof it->gen_err, "%s: HTTP %ld%s%s", url, status,
                     json_is_string(m) ? ": " : "", json_is_string(m) ? json_string_value(m) : "");
            json_decref(r);
            if (status == 429 || status >= 500) continue; /* retried; other 4xx are final */
            break;
        }
        json_t *ch = json_array_get(json_object_get(r, "choices"), 0);
        json_t *t = g->chat ? json_object_get(json_object_get(ch, "message"), "content")
                            : json_object_get(ch, "text");
        if (!json_is_string(t)) {
            snprintf(it->gen_err, sizeof it->gen_err, "%s: no choices[0] text in the response", url);
            json_decref(r);
            continue;
        }
        it->tlen = json_string_length(t);
        it->text = loom_malloc(it->tlen + 1);
        memcpy(it->text, json_string_value(t), it->tlen + 1);
        it->tokens = (int)json_integer_value(json_object_get(json_object_get(r, "usage"), "completion_tokens"));
        it->gen_ok = 1;
        json_decref(r);
        break;
    }
    free(body);
}

typedef struct http_pool {
    const gen_cfg *g;
    item **items;
    int n;
    int next;
    uint64_t seed;
    pthread_mutex_t mu;
} http_pool;

/* the sampling seed of an item's attempt (62 bits: it travels as a JSON integer) */
static uint64_t item_seed(uint64_t seed, const item *it) {
    return 0x3fffffffffffffffull & loom_mix64(seed ^ loom_mix64((uint64_t)it->seed_idx * 1000003ull + (uint64_t)it->sample) ^
                      ((uint64_t)it->attempt << 48));
}

static void *http_worker(void *arg) {
    http_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        const int i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->mu);
        if (i < 0) break;
        http_one(p->g, p->items[i], item_seed(p->seed, p->items[i]));
    }
    return NULL;
}

/* ---- the pipeline ----------------------------------------------------------------------- */

typedef struct pipeline {
    const char *path;
    json_t *root;
    seeds sd;
    char *template_name;
    const char *tpl;
    const char *feedback;
    gen_cfg g;
    validator *v;
    int nv;
    int max_attempts, samples;
    uint64_t seed;
    const char *output, *summary, *rejected;
    char *gen_id;               /* the generator's identity and settings (cache keys) */
    cache C;
} pipeline;

static const char *jstr(json_t *o, const char *k, const char *def) {
    json_t *x = json_object_get(o, k);
    return json_is_string(x) ? json_string_value(x) : def;
}

static int jint(pipeline *P, json_t *o, const char *where, const char *k, long long def,
                long long lo, long long hi, long long *out, loom_err *err) {
    json_t *x = json_object_get(o, k);
    if (!x) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
        return loom_errf(err, "%s: %s%s must be an integer in [%lld, %lld]", P->path, where, k, lo, hi);
    *out = json_integer_value(x);
    return 0;
}

static int jnum(pipeline *P, json_t *o, const char *where, const char *k, double def, double lo,
                double hi, double *out, loom_err *err) {
    json_t *x = json_object_get(o, k);
    if (!x) {
        *out = def;
        return 0;
    }
    if (!json_is_number(x) || !(json_number_value(x) >= lo && json_number_value(x) <= hi))
        return loom_errf(err, "%s: %s%s must be a number in [%g, %g]", P->path, where, k, lo, hi);
    *out = json_number_value(x);
    return 0;
}

static int check_keys(pipeline *P, json_t *o, const char *where, const char *const *known, loom_err *err) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(k, known[i]);
        if (!ok) return loom_errf(err, "%s: unknown key '%s%s'", P->path, where, k);
    }
    return 0;
}

/* what identifies a checkpoint's weights: its COMPLETE marker (the SHA-256 of its manifest,
 * which holds every file's SHA-256) */
static int ckpt_identity(const char *path, char out[65], loom_err *err) {
    char dir[4096], marker[4200];
    if (loom_ckpt_resolve(path, dir, sizeof dir, err)) return -1;
    snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
    char *text = NULL;
    size_t len = 0;
    if (loom_read_file(marker, 4096, &text, &len, err)) return -1;
    loom_sha256_hex(text, len, out);
    free(text);
    return 0;
}

/* a validator's settings (its YAML minus the name) and what they name (the files among a
 * command's arguments, by content; the scoring checkpoint's identity) -> v->key */
static int validator_key(pipeline *P, validator *v, json_t *node, loom_err *err) {
    json_t *o = json_deep_copy(node);
    json_object_del(o, "name");
    json_t *files = json_array();
    for (int i = 0; i < v->argc; i++) {
        struct stat st;
        char hex[65];
        loom_err e2 = {{0}};
        if (stat(v->argv[i], &st) || !S_ISREG(st.st_mode) || loom_sha256_file(v->argv[i], hex, &e2))
            continue;
        json_array_append_new(files, json_pack("[s,s]", v->argv[i], hex));
    }
    json_object_set_new(o, "files", files);
    if (v->sc) {
        char id[65];
        if (ckpt_identity(v->sc->ckpt, id, err)) {
            json_decref(o);
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            return loom_errf(err, "%s: score validator '%s': %s", P->path, v->name, m);
        }
        json_object_set_new(o, "checkpoint_id", json_string(id));
        json_object_del(o, "min"); /* the threshold is applied to the cached score */
        json_object_del(o, "max");
    }
    char *str = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    loom_sha256_hex(str, strlen(str), v->key);
    free(str);
    json_decref(o);
    return 0;
}

/* the generator's identity and every setting that shapes its output */
static int generator_identity(pipeline *P, loom_err *err) {
    json_t *g = json_pack("{s:s,s:s,s:i,s:f,s:f,s:i,s:b}", "kind", P->g.http ? "http" : "local",
                          "model", P->g.model, "max_tokens", P->g.max_tokens, "temperature",
                          P->g.temperature, "top_p", P->g.top_p, "top_k", P->g.top_k, "chat", P->g.chat);
    json_t *st = json_array();
    for (int i = 0; i < P->g.n_stop; i++) json_array_append_new(st, json_string(P->g.stop[i]));
    json_object_set_new(g, "stop", st);
    if (P->g.chat_tpl) json_object_set_new(g, "chat_template", json_string(jstr(json_object_get(P->root, "generator"), "chat_template", "plain")));
    if (P->g.bf16) json_object_set_new(g, "weights", json_string("bf16"));
    if (P->g.cbf16) json_object_set_new(g, "compute", json_string("bf16"));
    if (P->g.http) {
        json_object_set_new(g, "url", json_string(P->g.url));
    } else if (P->C.on) {
        char id[65];
        if (ckpt_identity(P->g.checkpoint, id, err)) {
            json_decref(g);
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            return loom_errf(err, "%s: generator.checkpoint: %s", P->path, m);
        }
        json_object_set_new(g, "checkpoint_id", json_string(id));
    }
    P->gen_id = json_dumps(g, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(g);
    return 0;
}

static int parse_pipeline(pipeline *P, loom_err *err) {
    json_t *r = P->root;
    static const char *const top[] = {"name", "seed", "seeds", "templates", "template", "feedback",
                                      "generator", "validators", "max_attempts", "samples_per_seed",
                                      "output", "summary", "rejected", "cache", NULL};
    if (check_keys(P, r, "", top, err)) return -1;
    if (load_seeds(P->path, json_object_get(r, "seeds"), &P->sd, err)) return -1;
    long long v = 0;
    if (jint(P, r, "", "seed", 1, 0, (1LL << 62), &v, err)) return -1;
    P->seed = (uint64_t)v;
    if (jint(P, r, "", "max_attempts", 3, 1, 100, &v, err)) return -1;
    P->max_attempts = (int)v;
    if (jint(P, r, "", "samples_per_seed", 1, 1, 1000, &v, err)) return -1;
    P->samples = (int)v;
    json_t *tpls = json_object_get(r, "templates");
    const char *tname = jstr(r, "template", NULL);
    if (!json_is_object(tpls) || !tname)
        return loom_errf(err, "%s: 'templates' (a mapping of name: text) and 'template' (the name "
                              "to use) are required", P->path);
    json_t *t = json_object_get(tpls, tname);
    if (json_is_object(t) && json_is_string(json_object_get(t, "chat"))) {
        P->g.chat = 1;
        t = json_object_get(t, "chat");
    }
    if (!json_is_string(t))
        return loom_errf(err, "%s: template '%s' is not in 'templates' (a string, or {chat: string})",
                         P->path, tname);
    P->template_name = strdup(tname);
    P->tpl = json_string_value(t);
    if (!strstr(P->tpl, "{seed}"))
        return loom_errf(err, "%s: templates.%s has no {seed} placeholder", P->path, tname);
    P->feedback = jstr(r, "feedback", "\n(An earlier answer was rejected: {message}. Write a corrected one.)\n");
    P->output = jstr(r, "output", NULL);
    if (!P->output) return loom_errf(err, "%s: 'output' (the JSONL file of accepted samples) is required", P->path);
    P->summary = jstr(r, "summary", NULL);
    P->rejected = jstr(r, "rejected", NULL);
    json_t *cj = json_object_get(r, "cache");
    if (cj && !json_is_false(cj) && !(json_is_string(cj) && json_string_length(cj)))
        return loom_errf(err, "%s: 'cache' must be a directory or false", P->path);
    P->C.on = !json_is_false(cj);
    if (json_is_string(cj)) snprintf(P->C.dir, sizeof P->C.dir, "%s", json_string_value(cj));
    else snprintf(P->C.dir, sizeof P->C.dir, "%s.cache", P->output);
    /* generator */
    json_t *g = json_object_get(r, "generator");
    static const char *const gk[] = {"kind", "url", "model", "checkpoint", "max_tokens", "temperature",
                                     "top_p", "top_k", "stop", "concurrency", "timeout_s", "retries",
                                     "batch", "chat_template", "weights", "compute", NULL};
    if (!json_is_object(g)) return loom_errf(err, "%s: 'generator' (a mapping) is required", P->path);
    if (check_keys(P, g, "generator.", gk, err)) return -1;
    const char *kind = jstr(g, "kind", "");
    if (!strcmp(kind, "http")) {
        P->g.http = 1;
        const char *url = jstr(g, "url", NULL);
        if (!url || strncmp(url, "http", 4) || strlen(url) >= sizeof P->g.url)
            return loom_errf(err, "%s: generator.url must be an http(s) URL ending at /v1", P->path);
        snprintf(P->g.url, sizeof P->g.url, "%s", url);
        size_t ul = strlen(P->g.url);
        while (ul && P->g.url[ul - 1] == '/') P->g.url[--ul] = 0;
        snprintf(P->g.model, sizeof P->g.model, "%s", jstr(g, "model", "loom"));
    } else if (!strcmp(kind, "local")) {
        const char *ck = jstr(g, "checkpoint", NULL);
        if (!ck) return loom_errf(err, "%s: generator.checkpoint is required for kind local", P->path);
        snprintf(P->g.checkpoint, sizeof P->g.checkpoint, "%s", ck);
        snprintf(P->g.model, sizeof P->g.model, "%s", ck);
        const char *wt = jstr(g, "weights", "fp32");
        if (strcmp(wt, "fp32") && strcmp(wt, "bf16"))
            return loom_errf(err, "%s: generator.weights must be fp32 or bf16", P->path);
        P->g.bf16 = !strcmp(wt, "bf16");
        const char *cm = jstr(g, "compute", "fp32");
        if (strcmp(cm, "fp32") && strcmp(cm, "bf16"))
            return loom_errf(err, "%s: generator.compute must be fp32 or bf16", P->path);
        P->g.cbf16 = !strcmp(cm, "bf16");
        if (P->g.cbf16 && json_object_get(g, "weights") && !P->g.bf16)
            return loom_errf(err, "%s: generator.compute bf16 multiplies bf16 weights: it "
                                  "cannot run with generator.weights fp32", P->path);
        P->g.bf16 |= P->g.cbf16;
    } else {
        return loom_errf(err, "%s: generator.kind must be local or http", P->path);
    }
    if (jint(P, g, "generator.", "max_tokens", 64, 1, 1 << 20, &v, err)) return -1;
    P->g.max_tokens = (int)v;
    if (jint(P, g, "generator.", "top_k", 0, 0, 1 << 24, &v, err)) return -1;
    P->g.top_k = (int)v;
    if (jint(P, g, "generator.", "concurrency", 8, 1, 1024, &v, err)) return -1;
    P->g.concurrency = (int)v;
    if (jint(P, g, "generator.", "retries", 3, 0, 20, &v, err)) return -1;
    P->g.retries = (int)v;
    if (jint(P, g, "generator.", "batch", 16, 1, 4096, &v, err)) return -1;
    P->g.batch = (int)v;
    if (jnum(P, g, "generator.", "temperature", 1.0, 0, 2, &P->g.temperature, err) ||
        jnum(P, g, "generator.", "top_p", 1.0, 0, 1, &P->g.top_p, err) ||
        jnum(P, g, "generator.", "timeout_s", 60, 0.001, 86400, &P->g.timeout_s, err))
        return -1;
    json_t *st = json_object_get(g, "stop");
    if (json_is_string(st)) st = json_pack("[O]", st);
    else json_incref(st);
    size_t i;
    json_t *x;
    json_array_foreach(st, i, x) {
        if (!json_is_string(x) || !json_string_length(x) || P->g.n_stop == 16) {
            json_decref(st);
            return loom_errf(err, "%s: generator.stop must be up to 16 non-empty strings", P->path);
        }
        P->g.stop[P->g.n_stop++] = strdup(json_string_value(x));
    }
    json_decref(st);
    const char *ct = jstr(g, "chat_template", NULL);
    if (ct && P->g.http)
        return loom_errf(err, "%s: generator.chat_template is for kind local (an HTTP server applies "
                              "its own template)", P->path);
    if (P->g.chat && !P->g.http) { /* the chat form through the shared chat template code */
        if (loom_chat_template_load(ct ? ct : "plain", &P->g.chat_tpl, err)) {
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            return loom_errf(err, "%s: generator.chat_template: %s", P->path, m);
        }
        char *pr = NULL, *eot = NULL;
        loom_chat_prompt(P->g.chat_tpl, NULL, "", &pr, &eot);
        free(pr);
        if (eot[0] && P->g.n_stop < 16) P->g.stop[P->g.n_stop++] = eot; /* its end of turn */
        else free(eot);
    }
    /* validators */
    json_t *vl = json_object_get(r, "validators");
    if (vl && !json_is_array(vl)) return loom_errf(err, "%s: 'validators' must be a list", P->path);
    P->nv = (int)json_array_size(vl);
    P->v = loom_calloc((size_t)P->nv + 1, sizeof *P->v);
    json_array_foreach(vl, i, x) {
        validator *d = &P->v[i];
        char where[64];
        snprintf(where, sizeof where, "validators[%zu].", i);
        const char *k = jstr(x, "kind", "");
        snprintf(d->name, sizeof d->name, "%s", jstr(x, "name", k));
        if (!strcmp(k, "length")) {
            static const char *const kk[] = {"kind", "name", "min", "max", NULL};
            if (check_keys(P, x, where, kk, err) || jint(P, x, where, "min", 0, 0, 1LL << 40, &d->min, err) ||
                jint(P, x, where, "max", -1, -1, 1LL << 40, &d->max, err))
                return -1;
            d->kind = V_LENGTH;
        } else if (!strcmp(k, "regex")) {
            static const char *const kk[] = {"kind", "name", "pattern", NULL};
            const char *pat = jstr(x, "pattern", NULL);
            if (check_keys(P, x, where, kk, err)) return -1;
            if (!pat) return loom_errf(err, "%s: %spattern is required", P->path, where);
            int ec;
            PCRE2_SIZE eo;
            d->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
            if (!d->re) {
                PCRE2_UCHAR m[256];
                pcre2_get_error_message(ec, m, sizeof m);
                return loom_errf(err, "%s: %spattern: %s at offset %zu", P->path, where, (char *)m, (size_t)eo);
            }
            d->kind = V_REGEX;
        } else if (!strcmp(k, "json")) {
            static const char *const kk[] = {"kind", "name", "schema", NULL};
            if (check_keys(P, x, where, kk, err)) return -1;
            d->schema = json_incref(json_object_get(x, "schema"));
            d->kind = V_JSON;
        } else if (!strcmp(k, "command")) {
            static const char *const kk[] = {"kind", "name", "command", "timeout_s", NULL};
            if (check_keys(P, x, where, kk, err) ||
                jnum(P, x, where, "timeout_s", 10, 0.001, 86400, &d->timeout_s, err))
                return -1;
            json_t *c = json_object_get(x, "command");
            if (!json_is_array(c) || json_array_size(c) == 0)
                return loom_errf(err, "%s: %scommand must be a non-empty list (argv)", P->path, where);
            d->argc = (int)json_array_size(c);
            d->argv = loom_calloc((size_t)d->argc + 1, sizeof(char *));
            size_t j;
            json_t *a;
            json_array_foreach(c, j, a) {
                if (!json_is_string(a)) return loom_errf(err, "%s: %scommand[%zu] is not a string", P->path, where, j);
                d->argv[j] = strdup(json_string_value(a));
            }
            d->kind = V_COMMAND;
        } else if (!strcmp(k, "unique")) {
            static const char *const kk[] = {"kind", "name", NULL};
            if (check_keys(P, x, where, kk, err)) return -1;
            d->kind = V_UNIQUE;
        } else if (!strcmp(k, "near_duplicate")) {
            static const char *const kk[] = {"kind", "name", "shingle", "permutations", "bands",
                                             "threshold", NULL};
            long long sh = 0, pe = 0, ba = 1;
            double th = 0;
            if (check_keys(P, x, where, kk, err) || jint(P, x, where, "shingle", 5, 1, 1024, &sh, err) ||
                jint(P, x, where, "permutations", 128, 1, 4096, &pe, err) ||
                jint(P, x, where, "bands", 16, 1, 4096, &ba, err) ||
                jnum(P, x, where, "threshold", 0.8, 0, 1, &th, err))
                return -1;
            if (pe % ba)
                return loom_errf(err, "%s: %sbands (%lld) must divide permutations (%lld)", P->path,
                                 where, ba, pe);
            d->mh = loom_calloc(1, sizeof *d->mh);
            d->mh->shingle = (int)sh, d->mh->perms = (int)pe, d->mh->bands = (int)ba;
            d->mh->threshold = th;
            mh_init(d->mh);
            d->kind = V_NEARDUP;
        } else if (!strcmp(k, "score")) {
            static const char *const kk[] = {"kind", "name", "checkpoint", "min", "max", "prefix", NULL};
            const char *ck = jstr(x, "checkpoint", NULL), *pre = jstr(x, "prefix", "");
            if (check_keys(P, x, where, kk, err)) return -1;
            if (!ck) return loom_errf(err, "%s: %scheckpoint (a loom checkpoint) is required", P->path, where);
            if (!json_is_number(json_object_get(x, "min")))
                return loom_errf(err, "%s: %smin (the lowest mean log-likelihood accepted) is required",
                                 P->path, where);
            if (jnum(P, x, where, "min", 0, -1e9, 0, &d->smin, err) ||
                jnum(P, x, where, "max", 0, -1e9, 0, &d->smax, err))
                return -1;
            if (json_object_get(x, "prefix") && !json_is_string(json_object_get(x, "prefix")))
                return loom_errf(err, "%s: %sprefix must be a string", P->path, where);
            d->sc = loom_calloc(1, sizeof *d->sc);
            snprintf(d->sc->ckpt, sizeof d->sc->ckpt, "%s", ck);
            d->sc->prefix = strdup(pre);
            pthread_mutex_init(&d->sc->mu, NULL);
            d->kind = V_SCORE;
        } else {
            return loom_errf(err, "%s: %skind '%s': expected length, regex, json, command, unique, "
                                  "near_duplicate or score", P->path, where, k);
        }
        if ((d->kind == V_COMMAND || d->kind == V_SCORE) && validator_key(P, d, x, err)) return -1;
    }
    return generator_identity(P, err);
}

/* the local generator: every pending prompt through the engine at once */
typedef struct local_gen {
    loom_model *m;
    loom_tokenizer *tok;
    loom_engine *eng;
    int tp, tp_rank;              /* the tp view this rank holds (tp 1: the whole model) */
    loom_comm_points tp_points;   /* its tp group's points (tp > 1) */
} local_gen;

static void local_generate(pipeline *P, local_gen *L, item **items, int n) {
    int64_t *ids = loom_calloc((size_t)n, sizeof *ids);
    loom_gen_params gp = loom_gen_params_default();
    gp.max_tokens = P->g.max_tokens;
    gp.temperature = (float)P->g.temperature;
    gp.top_p = (float)P->g.top_p;
    gp.top_k = P->g.top_k;
    gp.stop = (const char *const *)P->g.stop;
    gp.n_stop = P->g.n_stop;
    const int T = loom_model_get_config(L->m)->max_seq_len;
    for (int i = 0; i < n; i++) {
        /* the prompt's end, leaving room for a token; the engine stops at the context */
        gp.seed = item_seed(P->seed, items[i]);
        loom_err e2 = {{0}};
        char *chat = NULL, *eot = NULL, why[256];
        if (P->g.chat_tpl) { /* a user message, as the server renders /v1/chat/completions */
            json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", items[i]->prompt);
            if (!msgs || loom_chat_prompt_messages(P->g.chat_tpl, msgs, &chat, &eot, why, sizeof why))
                loom_errf(&e2, "chat prompt: %s", msgs ? why : "not UTF-8");
            json_decref(msgs);
            free(eot);
        }
        const char *pt = chat ? chat : items[i]->prompt;
        if (e2.msg[0] || loom_engine_submit_text(L->eng, L->tok, pt, strlen(pt), T - 1, &gp, NULL,
                                                 NULL, &ids[i], NULL, &e2)) {
            items[i]->gen_ok = 0;
            snprintf(items[i]->gen_err, sizeof items[i]->gen_err, "%.1000s", e2.msg);
            ids[i] = -1;
        }
        free(chat);
    }
    while (loom_engine_step(L->eng) > 0) {}
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0) continue;
        const char *text;
        size_t len;
        int ntok;
        LOOM_CHECK(loom_engine_result(L->eng, ids[i], NULL, &ntok, &text, &len, NULL) == 0);
        items[i]->text = loom_malloc(len + 1);
        memcpy(items[i]->text, text, len);
        items[i]->text[len] = 0;
        items[i]->tlen = len;
        items[i]->tokens = ntok;
        items[i]->gen_ok = 1;
        loom_engine_release(L->eng, ids[i]);
    }
    free(ids);
}

/* validation in parallel */
typedef struct vpool {
    pipeline *P;
    item **items;
    int n, next;
    pthread_mutex_t mu;
} vpool;

static void validate_item(pipeline *P, item *it) {
    it->results = json_array();
    it->failed_validator = -1;
    if (!it->gen_ok) {
        it->failed_validator = P->nv; /* the generator */
        snprintf(it->vmsg, sizeof it->vmsg, "generation failed: %.900s", it->gen_err);
        return;
    }
    for (int k = 0; k < P->nv; k++) {
        const validator *v = &P->v[k];
        if (v->kind == V_UNIQUE || v->kind == V_NEARDUP) continue; /* in item order, after these */
        char msg[512] = "", vk[65] = "";
        int bad;
        double score = NAN;
        json_t *hit = NULL;
        if (P->C.on && (v->kind == V_COMMAND || v->kind == V_SCORE)) {
            sha_hex_parts(vk, v->key, it->text, it->tlen);
            hit = json_object_get(P->C.val, vk);
        }
        if (hit) {
            it->val_hits++;
            bad = !json_is_true(json_object_get(hit, "ok"));
            snprintf(msg, sizeof msg, "%s", jstr(hit, "message", ""));
            json_t *sj = json_object_get(hit, "score");
            if (json_is_number(sj)) score = json_number_value(sj);
        } else {
            bad = v->kind == V_SCORE ? score_text(v->sc, it->text, it->tlen, &score, msg, sizeof msg) != 0
                                     : validate(v, it->text, it->tlen, msg, sizeof msg) != 0;
            if (vk[0] && !(v->kind == V_SCORE && v->sc->failed)) {
                size_t ml;
                char *cm = loom_utf8_sanitize(msg, strlen(msg), &ml);
                json_t *e = json_pack("{s:s,s:b,s:s%}", "k", vk, "ok", !bad, "message", cm, ml);
                free(cm);
                if (!isnan(score)) json_object_set_new(e, "score", json_real(score));
                if (!it->vfresh) it->vfresh = json_array();
                json_array_append_new(it->vfresh, e);
                it->val_runs++;
            }
        }
        if (v->kind == V_SCORE && !bad) { /* the threshold applies to the (cached) score */
            bad = !(score >= v->smin && score <= v->smax);
            if (bad) snprintf(msg, sizeof msg, "mean log-likelihood %.4f is outside [%g, %g]", score, v->smin, v->smax);
        }
        size_t ml;
        char *cm = loom_utf8_sanitize(msg, strlen(msg), &ml);
        json_t *res = json_pack("{s:s,s:b,s:s%}", "validator", v->name, "ok", !bad, "message", cm, ml);
        free(cm);
        if (!isnan(score)) json_object_set_new(res, "score", json_real(score));
        json_array_append_new(it->results, res);
        if (bad) {
            it->failed_validator = k;
            snprintf(it->vmsg, sizeof it->vmsg, "%.60s: %.500s", v->name, msg);
            return;
        }
    }
}

static void *vworker(void *arg) {
    vpool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        const int i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->mu);
        if (i < 0) break;
        validate_item(p->P, p->items[i]);
    }
    return NULL;
}

static void run_pool(void *(*fn)(void *), void *arg, int threads) {
    pthread_t *t = loom_calloc((size_t)threads, sizeof *t);
    for (int i = 0; i < threads; i++) LOOM_CHECK(pthread_create(&t[i], NULL, fn, arg) == 0);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    free(t);
}

/* an item's new generation and validator verdicts into the cache, once per attempt */
static void cache_add(pipeline *P, item *it) {
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

/* ---- spreading over MPI ranks ------------------------------------------------------------
 * Every rank holds every item. A round's pending items (the same list on every rank) are cut
 * into blocks of generator.batch in item order; block b belongs to replica b % (world / tp)
 * (with --tp, a replica is tp consecutive ranks; else each rank), which generates (a local
 * block is one engine batch of its own, so its batch, and with it every float, is the same
 * whatever the number of ranks; a replica's tp ranks step that batch together) and validates
 * it (its tp rank 0). The ranks then exchange their items' outcomes (allgather), and every
 * rank runs the order-dependent checks (duplicates) over all items in item order, so all ranks
 * agree; rank 0 writes. */

static void put_u32(loom_sbuf *b, uint32_t v) { loom_sbuf_append(b, (const char *)&v, 4); }
static void put_bytes(loom_sbuf *b, const char *s, size_t n) {
    put_u32(b, (uint32_t)n);
    if (n) loom_sbuf_append(b, s, n);
}

typedef struct rdr {
    const char *p;
    size_t n, at;
} rdr;
static uint32_t get_u32(rdr *r) {
    uint32_t v;
    LOOM_CHECK(r->at + 4 <= r->n);
    memcpy(&v, r->p + r->at, 4);
    r->at += 4;
    return v;
}
static const char *get_bytes(rdr *r, size_t *n) {
    *n = get_u32(r);
    LOOM_CHECK(r->at + *n <= r->n);
    const char *s = r->p + r->at;
    r->at += *n;
    return s;
}

/* the replica (of `replicas`) that owns pending item k */
static int owner_of(const pipeline *P, int k, int replicas) { return (k / P->g.batch) % replicas; }

/* an item's position in the round's pending list (items are pending in item order) */
static int pend_pos(item **pend, int np, const item *it) {
    int lo = 0, hi = np - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (pend[mid] < it) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* one item's outcome (after generation and the per-item validators) */
static void pack_item(loom_sbuf *b, uint32_t k, const item *it) {
    put_u32(b, k);
    put_u32(b, (uint32_t)it->tokens);
    put_u32(b, (uint32_t)it->gen_ok);
    put_u32(b, (uint32_t)(it->failed_validator + 1));
    put_bytes(b, it->text, it->text ? it->tlen : 0);
    put_bytes(b, it->gen_err, strlen(it->gen_err));
    put_bytes(b, it->vmsg, strlen(it->vmsg));
    char *res = json_dumps(it->results, JSON_COMPACT);
    put_bytes(b, res, strlen(res));
    free(res);
    put_u32(b, (uint32_t)it->gen_hit);
    put_bytes(b, it->gkey, strlen(it->gkey));
    res = it->vfresh ? json_dumps(it->vfresh, JSON_COMPACT) : NULL;
    put_bytes(b, res, res ? strlen(res) : 0);
    free(res);
    put_u32(b, (uint32_t)it->val_hits);
    put_u32(b, (uint32_t)it->val_runs);
}

static void unpack_item(rdr *r, item **pend, int np) {
    const uint32_t k = get_u32(r);
    LOOM_CHECK(k < (uint32_t)np);
    item *it = pend[k];
    it->tokens = (int)get_u32(r);
    it->gen_ok = (int)get_u32(r);
    it->failed_validator = (int)get_u32(r) - 1;
    size_t n;
    const char *s = get_bytes(r, &n);
    free(it->text);
    it->text = loom_malloc(n + 1);
    if (n) memcpy(it->text, s, n);
    it->text[n] = 0;
    it->tlen = n;
    s = get_bytes(r, &n);
    snprintf(it->gen_err, sizeof it->gen_err, "%.*s", (int)n, s);
    s = get_bytes(r, &n);
    snprintf(it->vmsg, sizeof it->vmsg, "%.*s", (int)n, s);
    s = get_bytes(r, &n);
    json_decref(it->results);
    it->results = json_loadb(s, n, 0, NULL);
    LOOM_CHECK(it->results != NULL);
    it->gen_hit = (int)get_u32(r);
    s = get_bytes(r, &n);
    snprintf(it->gkey, sizeof it->gkey, "%.*s", (int)n, s);
    s = get_bytes(r, &n);
    json_decref(it->vfresh);
    it->vfresh = n ? json_loadb(s, n, 0, NULL) : NULL;
    it->val_hits = (int)get_u32(r);
    it->val_runs = (int)get_u32(r);
}

/* every rank's items to every rank (mesh: NULL with one rank); a replica's tp rank 0 sends
 * its items */
static void exchange_items(loom_mesh *mesh, int rank, int world, int tp, item **pend, int np,
                           const pipeline *P) {
    loom_sbuf b = {0};
    for (int k = 0; k < np; k++)
        if (rank % tp == 0 && owner_of(P, k, world / tp) == rank / tp)
            pack_item(&b, (uint32_t)k, pend[k]);
    int64_t mine = (int64_t)b.len, longest = 0;
    int64_t *lens = loom_calloc((size_t)world, sizeof *lens);
    loom_allgather(mesh, LOOM_GROUP_WORLD, &mine, lens, (size_t)world, LOOM_I64);
    for (int r = 0; r < world; r++) longest = lens[r] > longest ? lens[r] : longest;
    char *send = loom_calloc((size_t)longest + 1, 1);
    char *all = loom_malloc((size_t)world * ((size_t)longest + 1));
    if (b.len) memcpy(send, b.p, b.len);
    loom_allgather(mesh, LOOM_GROUP_WORLD, send, all, (size_t)world * ((size_t)longest + 1), LOOM_U8);
    for (int r = 0; r < world; r++) {
        if (r == rank) continue;
        rdr rd = {all + (size_t)r * ((size_t)longest + 1), (size_t)lens[r], 0};
        while (rd.at < rd.n) unpack_item(&rd, pend, np);
    }
    free(send);
    free(all);
    free(lens);
    free(b.p);
}

/* the local generator, loaded on first use */
static int local_open(pipeline *P, local_gen *L, loom_err *err) {
    if (L->eng) return 0;
    loom_run_data *run = NULL;
    /* with --tp this rank's view (docs/inference.md), stepped with its tp group */
    const loom_model_layout lay = {.tp = L->tp, .tp_rank = L->tp_rank};
    if (loom_load_model_view(P->g.checkpoint, L->tp > 1 ? &lay : NULL, 1, 0, &L->m, NULL, &run,
                             NULL, err) ||
        loom_run_data_tokenizer(run, &L->tok, err)) {
        loom_run_data_free(run);
        return -1;
    }
    loom_run_data_free(run);
    if (L->tp > 1) loom_model_set_comm_points(L->m, &L->tp_points);
    if (P->g.bf16 && !P->g.cbf16 && loom_model_set_weights_bf16(L->m, err)) return -1;
    if (P->g.cbf16 && loom_model_set_compute_bf16(L->m, err)) return -1;
    loom_engine_opts eo = {.max_batch = P->g.batch};
    return loom_engine_create(L->m, L->tok, &eo, &L->eng, err);
}

int loom_synth_run(const char *path, const loom_synth_opts *o, loom_err *err) {
    pipeline P;
    memset(&P, 0, sizeof P);
    P.path = path;
    int rc = -1;
    local_gen L = {0};
    item *items = NULL;
    int n_items = 0;
    FILE *out = NULL, *rej = NULL;
    uint64_t *hashes = NULL;
    size_t n_hash = 0, cap_hash = 0;
    loom_mesh *mesh = NULL;
    const int rank = loom_comm_world_rank(), world = loom_comm_world_size();
    const int quiet = (o && o->quiet) || rank > 0;
    int uniform = 1; /* an error every rank meets alike (the pipeline file) */
    P.root = load_yaml(path, err);
    if (!P.root || parse_pipeline(&P, err)) goto done;
    const int threads = o && o->threads > 0 ? o->threads : 2;
    signal(SIGPIPE, SIG_IGN); /* a command validator that exits without reading its input */
    if (o && o->no_cache) P.C.on = 0;
    if (P.C.on && cache_open(&P.C, rank == 0, err)) goto done;
    if (P.C.skipped && rank == 0)
        fprintf(stderr, "loom: warning: %s: %lld torn or malformed cache lines skipped\n", P.C.dir, P.C.skipped);
    if (P.g.http) curl_global_init(CURL_GLOBAL_DEFAULT);
    const int tp = o && o->tp > 1 ? o->tp : 1, replicas = world / tp, replica = rank / tp;
    if (world % tp) {
        loom_errf(err, "--tp %d does not divide the %d ranks of the job (mpirun -np must be a "
                       "multiple of --tp)", tp, world);
        goto done;
    }
    if (tp > 1 && P.g.http) {
        loom_errf(err, "%s: --tp splits the local generator's model, but generator.kind is "
                       "http", path);
        goto done;
    }
    L.tp = tp;
    L.tp_rank = rank % tp;
    if (tp > 1) L.tp_points = o->tp_points;
    if (world > 1) {
        loom_mesh_spec spec;
        loom_mesh_spec_default(&spec);
        spec.timeout_s = 86400; /* ranks wait for the slowest one's round */
        if (loom_mesh_create(&spec, NULL, &mesh, err)) goto done;
    }
    n_items = P.sd.n * P.samples;
    items = loom_calloc((size_t)n_items, sizeof *items);
    for (int i = 0; i < n_items; i++) {
        items[i].seed_idx = i / P.samples;
        items[i].sample = i % P.samples;
    }
    /* exact duplicates are checked against the seeds and the accepted pool */
    for (int s = 0; s < P.sd.n; s++) {
        if (n_hash == cap_hash) hashes = loom_realloc(hashes, (cap_hash = cap_hash ? 2 * cap_hash : 256) * sizeof *hashes);
        hashes[n_hash++] = fnv1a(P.sd.v[s], P.sd.len[s]);
    }
    for (int v = 0; v < P.nv; v++) { /* near duplicates: against the seeds and the pool */
        if (P.v[v].kind != V_NEARDUP) continue;
        uint64_t *sig = loom_malloc((size_t)P.v[v].mh->perms * sizeof *sig);
        for (int s = 0; s < P.sd.n; s++) {
            mh_signature(P.v[v].mh, P.sd.v[s], P.sd.len[s], sig);
            mh_add(P.v[v].mh, sig, -1 - s);
        }
        free(sig);
    }
    long long *rejected_by = loom_calloc((size_t)P.nv + 1, sizeof(long long));
    long long *accepted_at = loom_calloc((size_t)P.max_attempts + 1, sizeof(long long));
    long long tokens = 0, generated = 0;
    const double t0 = loom_now();
    loom_progress pg;
    loom_progress_init(&pg, 0);
    item **pend = loom_calloc((size_t)n_items, sizeof *pend);
    item **mine = loom_calloc((size_t)n_items, sizeof *mine);
    item **gen = loom_calloc((size_t)n_items, sizeof *gen);
    uniform = 0;
    for (int attempt = 1; attempt <= P.max_attempts; attempt++) {
        int np = 0;
        for (int i = 0; i < n_items; i++) {
            item *it = &items[i];
            if (it->done) continue;
            it->attempt = attempt;
            loom_sbuf fb = {0}, pr = {0};
            if (attempt > 1) {
                size_t pl = it->tlen > 200 ? 200 : it->tlen;
                for (const char *p = P.feedback; *p;) {
                    if (!strncmp(p, "{message}", 9)) sb_str(&fb, it->vmsg), p += 9;
                    else if (!strncmp(p, "{previous}", 10)) loom_sbuf_append(&fb, it->text ? it->text : "", it->text ? pl : 0), p += 10;
                    else loom_sbuf_append(&fb, p, 1), p++;
                }
            }
            render(&pr, P.tpl, P.sd.v[it->seed_idx], P.sd.len[it->seed_idx], fb.p ? fb.p : "");
            if (attempt > 1 && !strstr(P.tpl, "{feedback}")) sb_str(&pr, fb.p); /* appended */
            free(fb.p);
            free(it->prompt);
            free(it->text);
            it->text = NULL;
            it->tlen = 0;
            it->tokens = 0;
            it->gen_ok = 0;
            it->gen_err[0] = 0;
            it->vmsg[0] = 0;
            json_decref(it->results);
            it->results = NULL;
            json_decref(it->vfresh);
            it->vfresh = NULL;
            it->gen_hit = it->val_hits = it->val_runs = it->cached = 0;
            it->gkey[0] = 0;
            it->prompt = pr.p ? pr.p : loom_strdup("");
            pend[np++] = it;
        }
        if (np == 0) break;
        /* this rank's blocks, one at a time: cache lookups, generation (a local block is one
         * engine batch), validation, and (rank 0) the block's new outputs and verdicts appended
         * to the cache and synced, so a kill loses at most the block in progress. With an HTTP
         * generator a step is enough blocks for generator.concurrency requests in flight. */
        const int bper = P.g.http && P.g.concurrency > P.g.batch
                             ? (P.g.concurrency + P.g.batch - 1) / P.g.batch : 1;
        for (int k0 = 0; k0 < np;) {
            int nm = 0, ng = 0, k1 = k0, nb = 0;
            while (k1 < np && nb < bper) { /* this rank's next bper blocks from k0 */
                const int bend = (k1 / P.g.batch + 1) * P.g.batch < np ? (k1 / P.g.batch + 1) * P.g.batch : np;
                if (owner_of(&P, k1, replicas) == replica) {
                    for (int k = k1; k < bend; k++) {
                        item *it = pend[k];
                        if (L.tp_rank == 0) mine[nm++] = it; /* a replica's tp rank 0 validates */
                        if (P.C.on) {
                            loom_sbuf kb = {0};
                            char sd[32];
                            snprintf(sd, sizeof sd, "%llu", (unsigned long long)item_seed(P.seed, it));
                            sb_str(&kb, P.g.temperature > 0 ? sd : "greedy");
                            loom_sbuf_append(&kb, "\n", 1);
                            sb_str(&kb, it->prompt);
                            sha_hex_parts(it->gkey, P.gen_id, kb.p, kb.len);
                            free(kb.p);
                            json_t *hit = json_object_get(P.C.gen, it->gkey);
                            if (hit && !text_from_json(hit, &it->text, &it->tlen)) {
                                it->tokens = (int)json_integer_value(json_object_get(hit, "tokens"));
                                it->gen_ok = it->gen_hit = 1;
                                continue;
                            }
                        }
                        gen[ng++] = it;
                    }
                    nb++;
                }
                k1 = bend;
            }
            if (P.g.http && ng) {
                http_pool hp = {.g = &P.g, .items = gen, .n = ng, .seed = P.seed};
                pthread_mutex_init(&hp.mu, NULL);
                run_pool(http_worker, &hp, P.g.concurrency < ng ? P.g.concurrency : ng);
                pthread_mutex_destroy(&hp.mu);
            } else if (ng) {
                if (local_open(&P, &L, err)) goto done_counts;
                /* one engine batch per block (the block's items not in the cache) */
                for (int a = 0, b; a < ng; a = b) {
                    const int blk = (int)(pend_pos(pend, np, gen[a]) / P.g.batch);
                    for (b = a + 1; b < ng && (int)(pend_pos(pend, np, gen[b]) / P.g.batch) == blk; b++) {}
                    local_generate(&P, &L, gen + a, b - a);
                }
            }
            if (nm) {
                vpool vp = {.P = &P, .items = mine, .n = nm};
                pthread_mutex_init(&vp.mu, NULL);
                run_pool(vworker, &vp, threads < nm ? threads : nm);
                pthread_mutex_destroy(&vp.mu);
            }
            for (int v = 0; v < P.nv; v++)
                if (P.v[v].sc && P.v[v].sc->failed) {
                    loom_errf(err, "%s: validator '%s': %s", path, P.v[v].name, P.v[v].sc->err.msg);
                    goto done_counts;
                }
            if (P.C.on && rank == 0 && nm) { /* this block's outcomes, durable now */
                for (int i = 0; i < nm; i++) cache_add(&P, mine[i]);
                if (cache_sync(&P.C, err)) goto done_counts;
            }
            k0 = k1;
        }
        if (world > 1) exchange_items(mesh, rank, world, tp, pend, np, &P);
        for (int k = 0; P.C.on && k < np; k++) { /* the other ranks' outputs into the cache */
            item *it = pend[k];
            P.C.gen_hits += it->gen_hit;
            P.C.gen_runs += !it->gen_hit;
            P.C.val_hits += it->val_hits;
            P.C.val_runs += it->val_runs;
            cache_add(&P, it);
        }
        if (P.C.on && rank == 0 && cache_sync(&P.C, err)) goto done_counts;
        for (int k = 0; k < np; k++) { /* in item order: duplicates, verdicts */
            item *it = pend[k];
            generated++;
            tokens += it->tokens;
            if (it->failed_validator < 0) {
                const uint64_t h = fnv1a(it->text, it->tlen);
                for (int v = 0; v < P.nv && it->failed_validator < 0; v++) {
                    if (P.v[v].kind == V_UNIQUE) {
                        int dup = 0;
                        for (size_t j = 0; j < n_hash && !dup; j++) dup = hashes[j] == h;
                        json_array_append_new(it->results, json_pack("{s:s,s:b,s:s}", "validator", P.v[v].name,
                                                                     "ok", !dup, "message", dup ? "an exact duplicate" : ""));
                        if (dup) {
                            it->failed_validator = v;
                            snprintf(it->vmsg, sizeof it->vmsg, "%s: an exact duplicate of a seed or an earlier sample", P.v[v].name);
                        }
                    } else if (P.v[v].kind == V_NEARDUP) {
                        mh_index *mh = P.v[v].mh;
                        uint64_t *sig = loom_malloc((size_t)mh->perms * sizeof *sig);
                        mh_signature(mh, it->text, it->tlen, sig);
                        double best;
                        const int idx = mh_query(mh, sig, &best);
                        free(sig);
                        const int near = idx >= 0 && best >= mh->threshold;
                        char what[96] = "", msg[200] = "";
                        if (idx >= 0) {
                            const int og = mh->origin[idx];
                            if (og < 0) snprintf(what, sizeof what, "seed %d", -1 - og);
                            else snprintf(what, sizeof what, "the sample %d of seed %d", items[og].sample, items[og].seed_idx);
                        }
                        if (near)
                            snprintf(msg, sizeof msg, "a near duplicate of %s (estimated Jaccard similarity %.3f >= %g)",
                                     what, best, mh->threshold);
                        json_t *res = json_pack("{s:s,s:b,s:s}", "validator", P.v[v].name, "ok", !near, "message", msg);
                        if (idx >= 0) {
                            json_object_set_new(res, "similarity", json_real(best));
                            json_object_set_new(res, "nearest", json_string(what));
                        }
                        json_array_append_new(it->results, res);
                        if (near) {
                            it->failed_validator = v;
                            snprintf(it->vmsg, sizeof it->vmsg, "%s: %s", P.v[v].name, msg);
                        }
                    }
                }
            }
            if (it->failed_validator < 0) {
                it->done = it->accepted = 1;
                accepted_at[attempt]++;
                if (n_hash == cap_hash) hashes = loom_realloc(hashes, (cap_hash = cap_hash ? 2 * cap_hash : 256) * sizeof *hashes);
                hashes[n_hash++] = fnv1a(it->text, it->tlen);
                for (int v = 0; v < P.nv; v++) {
                    if (P.v[v].kind != V_NEARDUP) continue;
                    uint64_t *sig = loom_malloc((size_t)P.v[v].mh->perms * sizeof *sig);
                    mh_signature(P.v[v].mh, it->text, it->tlen, sig);
                    mh_add(P.v[v].mh, sig, (int)(it - items));
                    free(sig);
                }
            } else {
                rejected_by[it->failed_validator]++;
                if (attempt == P.max_attempts) it->done = 1;
            }
        }
        if (!quiet) { /* forced: one line per round (plain), the latest (terminal) */
            /* items, like the summary's accepted and rejected: rejected = failed their last
             * attempt; the others failed so far get another (retrying) */
            long long acc = 0, n_rej = 0, decided = 0, retry = 0;
            for (int a = 1; a <= attempt; a++) acc += accepted_at[a];
            for (int i = 0; i < n_items; i++) {
                decided += items[i].done;
                n_rej += items[i].done && !items[i].accepted;
                retry += !items[i].done && items[i].failed_validator >= 0;
            }
            const double dt = loom_now() - t0;
            char eta[48];
            loom_progress_eta(eta, sizeof eta, dt, (double)decided, (double)n_items);
            loom_progress_show(&pg, 1, "synth: attempt %d/%d: %lld/%d accepted, %lld rejected, "
                               "%lld to retry, %lld generations, %.1f samples/s, %s", attempt,
                               P.max_attempts, acc, n_items, n_rej, retry, generated,
                               dt > 0 ? (double)generated / dt : 0.0, eta);
        }
    }
    loom_progress_end(&pg);
    if (rank > 0) { /* rank 0 writes */
        rc = 0;
        goto done_counts;
    }
    /* output: accepted records in item order (temp file, then rename) */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", P.output);
    out = fopen(tmp, "w");
    if (!out) {
        loom_errf(err, "%s: cannot write: %s", tmp, strerror(errno));
        goto done_counts;
    }
    if (P.rejected) {
        rej = fopen(P.rejected, "w");
        if (!rej) {
            loom_errf(err, "%s: cannot write: %s", P.rejected, strerror(errno));
            goto done_counts;
        }
    }
    long long accepted = 0;
    for (int i = 0; i < n_items; i++) {
        item *it = &items[i];
        FILE *f = it->accepted ? out : rej;
        if (!f) continue;
        accepted += it->accepted;
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a(P.sd.v[it->seed_idx], P.sd.len[it->seed_idx]));
        size_t tl;
        char *ct = loom_utf8_sanitize(it->text ? it->text : "", it->tlen, &tl);
        json_t *rec = json_pack("{s:s%,s:s,s:i,s:i,s:s,s:{s:s,s:s},s:i,s:O}", "text", ct, tl, "seed_hash", hex,
                                "seed_index", it->seed_idx, "sample", it->sample, "template", P.template_name,
                                "generator", "kind", P.g.http ? "http" : "local", "model", P.g.model,
                                "attempt", it->attempt, "validators", it->results ? it->results : json_array());
        free(ct);
        if (!it->accepted) json_object_set_new(rec, "rejected_by", json_string(it->vmsg));
        char *line = json_dumps(rec, JSON_COMPACT);
        fprintf(f, "%s\n", line);
        free(line);
        json_decref(rec);
    }
    if (fflush(out) || fsync(fileno(out)) || fclose(out)) {
        out = NULL;
        loom_errf(err, "%s: write failed: %s", tmp, strerror(errno));
        goto done_counts;
    }
    out = NULL;
    if (rename(tmp, P.output)) {
        loom_errf(err, "%s: cannot rename into place: %s", P.output, strerror(errno));
        goto done_counts;
    }
    {
        const double dt = loom_now() - t0;
        json_t *rb = json_object(), *hist = json_object();
        for (int v = 0; v < P.nv; v++) json_object_set_new(rb, P.v[v].name, json_integer(rejected_by[v]));
        json_object_set_new(rb, "generator", json_integer(rejected_by[P.nv]));
        for (int a = 1; a <= P.max_attempts; a++) {
            char k[16];
            snprintf(k, sizeof k, "%d", a);
            json_object_set_new(hist, k, json_integer(accepted_at[a]));
        }
        json_t *sum = json_pack("{s:i,s:I,s:I,s:I,s:o,s:o,s:f,s:f,s:f,s:i}", "items", n_items, "accepted",
                                (json_int_t)accepted, "rejected", (json_int_t)(n_items - accepted),
                                "generations", (json_int_t)generated, "rejected_by", rb,
                                "accepted_at_attempt", hist, "seconds", dt, "tokens_per_s",
                                dt > 0 ? (double)tokens / dt : 0.0, "samples_per_s",
                                dt > 0 ? (double)generated / dt : 0.0, "ranks", world);
        if (P.C.on)
            json_object_set_new(sum, "cache", json_pack("{s:s,s:I,s:I,s:I,s:I}", "dir", P.C.dir,
                                "generation_hits", (json_int_t)P.C.gen_hits, "generations_run",
                                (json_int_t)P.C.gen_runs, "validation_hits", (json_int_t)P.C.val_hits,
                                "validations_run", (json_int_t)P.C.val_runs));
        char *s = json_dumps(sum, JSON_COMPACT);
        fprintf(stderr, "synth: %s\n", s);
        if (P.summary && loom_write_file_atomic(P.summary, s, strlen(s), err)) {
            free(s);
            json_decref(sum);
            goto done_counts;
        }
        free(s);
        json_decref(sum);
    }
    rc = 0;
done_counts:
    free(rejected_by);
    free(accepted_at);
    free(pend);
    free(mine);
    free(gen);
done:
    if (out) fclose(out);
    if (rej) fclose(rej);
    for (int i = 0; i < n_items; i++) {
        free(items[i].prompt);
        free(items[i].text);
        json_decref(items[i].results);
        json_decref(items[i].vfresh);
    }
    free(items);
    free(hashes);
    for (int i = 0; i < P.sd.n; i++) free(P.sd.v[i]);
    free(P.sd.v);
    free(P.sd.len);
    for (int i = 0; i < P.nv; i++) {
        if (P.v[i].re) pcre2_code_free(P.v[i].re);
        json_decref(P.v[i].schema);
        for (int j = 0; j < P.v[i].argc; j++) free(P.v[i].argv[j]);
        free(P.v[i].argv);
        if (P.v[i].mh) mh_free(P.v[i].mh);
        free(P.v[i].mh);
        scorer_free(P.v[i].sc);
    }
    if (P.C.on) cache_close(&P.C);
    free(P.gen_id);
    free(P.v);
    for (int i = 0; i < P.g.n_stop; i++) free(P.g.stop[i]);
    loom_chat_template_free(P.g.chat_tpl);
    free(P.template_name);
    json_decref(P.root);
    loom_engine_free(L.eng);
    loom_tokenizer_free(L.tok);
    loom_model_free(L.m);
    loom_mesh_free(mesh);
    if (P.g.http) curl_global_cleanup();
    /* under mpirun a failure on one rank ends the job (the others wait in a collective) */
    if (rc && world > 1) {
        if (uniform) loom_comm_fail_all(err);
        loom_comm_fail(err);
    }
    return rc;
}
