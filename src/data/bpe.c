/* GPT-2 byte-level BPE: the alphabet, hash maps, pre-tokenization, merging, encode, decode.
 * Loading and saving files live in bpe_io.c, training in bpe_train.c. The behaviour follows
 * Hugging Face `tokenizers` (ByteLevel pre-tokenizer + BPE model) id for id; the places where
 * that needs care are commented.
 *
 * Why one file: encoding is one pipeline over shared hash maps (the merge ranks, the vocabulary,
 * the word cache) and the pre-tokenizer's scanner; loading, saving and training, which only
 * fill those maps, are already in files of their own. */
#include <stdlib.h>
#include <string.h>

#include "data/bpe_internal.h"

/* ---- hash maps ---------------------------------------------------------------------------- */
static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

void bpe_strmap_init(bpe_strmap *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 16);
    m->n = 0;
    m->keys = loom_calloc(m->cap, sizeof *m->keys);
    m->lens = loom_calloc(m->cap, sizeof *m->lens);
    m->vals = loom_calloc(m->cap, sizeof *m->vals);
}

void bpe_strmap_free(bpe_strmap *m) {
    free(m->keys);
    free(m->lens);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

int32_t bpe_strmap_get(const bpe_strmap *m, const char *k, size_t len) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1, i = bpe_hash_bytes(k, len) & mask;
    for (;;) {
        if (!m->keys[i]) return -1;
        if (m->lens[i] == len && !memcmp(m->keys[i], k, len)) return m->vals[i];
        i = (i + 1) & mask;
    }
}

static void strmap_grow(bpe_strmap *m) {
    bpe_strmap bigger;
    bpe_strmap_init(&bigger, m->cap);
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) bpe_strmap_put(&bigger, m->keys[i], m->lens[i], m->vals[i]);
    bpe_strmap_free(m);
    *m = bigger;
}

int32_t bpe_strmap_put(bpe_strmap *m, const char *k, size_t len, int32_t v) {
    if ((m->n + 1) * 2 > m->cap) strmap_grow(m);
    size_t mask = m->cap - 1, i = bpe_hash_bytes(k, len) & mask;
    for (;;) {
        if (!m->keys[i]) {
            m->keys[i] = k;
            m->lens[i] = (uint32_t)len;
            m->vals[i] = v;
            m->n++;
            return -1;
        }
        if (m->lens[i] == len && !memcmp(m->keys[i], k, len)) {
            int32_t old = m->vals[i];
            m->vals[i] = v;
            return old;
        }
        i = (i + 1) & mask;
    }
}

void bpe_u64map_init(bpe_u64map *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 16);
    m->n = 0;
    m->keys = loom_malloc(m->cap * sizeof *m->keys);
    m->vals = loom_malloc(m->cap * sizeof *m->vals);
    memset(m->keys, 0xFF, m->cap * sizeof *m->keys);
}

void bpe_u64map_free(bpe_u64map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

uint64_t *bpe_u64map_get(const bpe_u64map *m, uint64_t k) {
    size_t mask = m->cap - 1, i = bpe_hash_u64(k) & mask;
    for (;;) {
        if (m->keys[i] == k) return &m->vals[i];
        if (m->keys[i] == UINT64_MAX) return NULL;
        i = (i + 1) & mask;
    }
}

uint64_t *bpe_u64map_upsert(bpe_u64map *m, uint64_t k, uint64_t init, int *fresh) {
    LOOM_CHECK(k != UINT64_MAX);
    if ((m->n + 1) * 2 > m->cap) {
        bpe_u64map bigger;
        bpe_u64map_init(&bigger, m->cap);
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i] != UINT64_MAX) *bpe_u64map_upsert(&bigger, m->keys[i], 0, NULL) = m->vals[i];
        bpe_u64map_free(m);
        *m = bigger;
    }
    size_t mask = m->cap - 1, i = bpe_hash_u64(k) & mask;
    for (;;) {
        if (m->keys[i] == k) {
            if (fresh) *fresh = 0;
            return &m->vals[i];
        }
        if (m->keys[i] == UINT64_MAX) {
            m->keys[i] = k;
            m->vals[i] = init;
            m->n++;
            if (fresh) *fresh = 1;
            return &m->vals[i];
        }
        i = (i + 1) & mask;
    }
}

/* ---- GPT-2 alphabet ------------------------------------------------------------------------
 * Printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the
 * other 68 bytes take code points 256, 257, ... in byte order. */
static int printable_byte(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t bpe_byte_to_cp(uint8_t b) {
    if (printable_byte(b)) return b;
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++) n += !printable_byte(x);
    return 256 + n;
}

int bpe_cp_to_byte(uint32_t cp) {
    if (cp < 256) return printable_byte(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t n = cp - 256;
    for (unsigned x = 0; x < 256; x++)
        if (!printable_byte(x) && n-- == 0) return (int)x;
    return -1;
}

static uint8_t g_spell[256][2]; /* UTF-8 of each byte's code point (all are 2 bytes or 1) */
static uint8_t g_spell_len[256];
static pthread_once_t g_spell_once = PTHREAD_ONCE_INIT;
static void spell_init(void) {
    for (int b = 0; b < 256; b++) {
        uint32_t cp = bpe_byte_to_cp((uint8_t)b);
        if (cp < 0x80) {
            g_spell[b][0] = (uint8_t)cp;
            g_spell_len[b] = 1;
        } else {
            g_spell[b][0] = (uint8_t)(0xC0 | (cp >> 6));
            g_spell[b][1] = (uint8_t)(0x80 | (cp & 0x3F));
            g_spell_len[b] = 2;
        }
    }
}

size_t bpe_bytes_to_spelling(const uint8_t *s, size_t n, char *out) {
    pthread_once(&g_spell_once, spell_init);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        out[k++] = (char)g_spell[s[i]][0];
        if (g_spell_len[s[i]] == 2) out[k++] = (char)g_spell[s[i]][1];
    }
    return k;
}

size_t bpe_utf8_len(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        if (cp) *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) len = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    if (cp) *cp = v;
    return len;
}

/* ---- pre-tokenization ---------------------------------------------------------------------- */
static int regex_pieces(const loom_tokenizer *t, pcre2_match_data *md, const uint8_t *s, size_t n,
                        bpe_piece_fn fn, void *ctx, loom_err *err) {
    size_t pos = 0;
    while (pos < n) {
        int rc = t->jit ? pcre2_jit_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL)
                        : pcre2_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT ||
            rc == PCRE2_ERROR_HEAPLIMIT)
            rc = pcre2_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return loom_errf(err, "tokenizer: pre-tokenizer regex failed at byte %zu: %s", pos,
                             (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a > pos) fn(ctx, s + pos, a - pos); /* unmatched text is a piece (HF "Isolated") */
        if (b > a) {
            fn(ctx, s + a, b - a);
            pos = b;
        } else { /* empty match: step one character */
            size_t l = bpe_utf8_len(s + a, n - a, NULL);
            if (a > pos) {
                pos = a;
                continue;
            }
            fn(ctx, s + a, l ? l : 1);
            pos = a + (l ? l : 1);
        }
    }
    if (pos < n) fn(ctx, s + pos, n - pos);
    return 0;
}

int bpe_pretokenize(const loom_tokenizer *t, pcre2_match_data *md, const uint8_t *s, size_t n,
                    bpe_piece_fn fn, void *ctx, loom_err *err) {
    /* Hugging Face only ever sees valid UTF-8 (a Rust str). loom splits the bytes into maximal
     * valid runs, pre-tokenized independently, and maximal invalid runs, one piece each. */
    size_t i = 0;
    while (i < n) {
        size_t start = i;
        size_t l = 0;
        while (i < n && (s[i] < 0x80 || (l = bpe_utf8_len(s + i, n - i, NULL)) != 0))
            i += s[i] < 0x80 ? 1 : l;
        if (i > start) {
            if (!t->use_regex) fn(ctx, s + start, i - start);
            else if (regex_pieces(t, md, s + start, i - start, fn, ctx, err)) return -1;
        }
        start = i;
        while (i < n && s[i] >= 0x80 && bpe_utf8_len(s + i, n - i, NULL) == 0) i++;
        if (i > start) fn(ctx, s + start, i - start);
    }
    return 0;
}

/* ---- merging ------------------------------------------------------------------------------ */
static inline int merge_lookup(const loom_tokenizer *t, int32_t a, int32_t b, uint32_t *rank,
                               int32_t *new_id) {
    const uint64_t *v = bpe_u64map_get(&t->merge_map, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b);
    if (!v) return 0;
    *rank = (uint32_t)(*v >> 32);
    *new_id = (int32_t)(uint32_t)*v;
    return 1;
}

/* Repeatedly merge the lowest-rank adjacent pair, the leftmost on ties: the order in which
 * HF's heap (ordered by rank, then position) applies them. O(n^2), fast for short words. */
size_t bpe_merge_word_scan(const loom_tokenizer *t, int32_t *ids, size_t n) {
    if (n < 2) return n;
    uint32_t rank_buf[64], *rank = n - 1 <= 64 ? rank_buf : loom_malloc((n - 1) * sizeof *rank);
    int32_t nid_buf[64], *nid = n - 1 <= 64 ? nid_buf : loom_malloc((n - 1) * sizeof *nid);
    for (size_t i = 0; i + 1 < n; i++)
        if (!merge_lookup(t, ids[i], ids[i + 1], &rank[i], &nid[i])) rank[i] = UINT32_MAX;
    while (n > 1) {
        size_t k = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[k]) k = i;
        if (rank[k] == UINT32_MAX) break;
        ids[k] = nid[k];
        memmove(ids + k + 1, ids + k + 2, (n - k - 2) * sizeof *ids);
        memmove(rank + k + 1, rank + k + 2, (n >= k + 3 ? n - k - 3 : 0) * sizeof *rank);
        memmove(nid + k + 1, nid + k + 2, (n >= k + 3 ? n - k - 3 : 0) * sizeof *nid);
        n--;
        if (k > 0 && !merge_lookup(t, ids[k - 1], ids[k], &rank[k - 1], &nid[k - 1]))
            rank[k - 1] = UINT32_MAX;
        if (k + 1 < n && !merge_lookup(t, ids[k], ids[k + 1], &rank[k], &nid[k]))
            rank[k] = UINT32_MAX;
    }
    if (rank != rank_buf) free(rank);
    if (nid != nid_buf) free(nid);
    return n;
}

/* HF's Word::merge_all: a min-heap of (rank, position) over a doubly linked symbol list;
 * an entry is stale when the pair at its position no longer produces its new id. */
typedef struct heap_item {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} heap_item;

static inline int item_less(heap_item a, heap_item b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!item_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && item_less(h[c + 1], h[c])) c++;
        if (!item_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

size_t bpe_merge_word_heap(const loom_tokenizer *t, int32_t *ids, size_t n) {
    if (n < 2) return n;
    int64_t *prev = loom_malloc(n * sizeof *prev), *next = loom_malloc(n * sizeof *next);
    uint8_t *alive = loom_malloc(n);
    size_t cap = 2 * n + 8, hn = 0;
    heap_item *h = loom_malloc(cap * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int64_t)i - 1;
        next[i] = i + 1 < n ? (int64_t)i + 1 : -1;
        alive[i] = 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        heap_item it = {0, (uint32_t)i, 0};
        if (merge_lookup(t, ids[i], ids[i + 1], &it.rank, &it.new_id)) heap_push(h, &hn, it);
    }
    while (hn) {
        heap_item top = heap_pop(h, &hn);
        size_t p = top.pos;
        if (!alive[p] || next[p] < 0) continue;
        size_t q = (size_t)next[p];
        uint32_t r;
        int32_t nid;
        if (!merge_lookup(t, ids[p], ids[q], &r, &nid) || nid != top.new_id) continue;
        ids[p] = top.new_id;
        next[p] = next[q];
        alive[q] = 0;
        if (next[q] >= 0) prev[next[q]] = (int64_t)p;
        if (hn + 2 > cap) {
            cap *= 2;
            h = loom_realloc(h, cap * sizeof *h);
        }
        if (prev[p] >= 0) {
            heap_item it = {0, (uint32_t)prev[p], 0};
            if (merge_lookup(t, ids[prev[p]], ids[p], &it.rank, &it.new_id)) heap_push(h, &hn, it);
        }
        if (next[p] >= 0) {
            heap_item it = {0, (uint32_t)p, 0};
            if (merge_lookup(t, ids[p], ids[next[p]], &it.rank, &it.new_id)) heap_push(h, &hn, it);
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (alive[i]) ids[k++] = ids[i];
    free(prev);
    free(next);
    free(alive);
    free(h);
    return k;
}

size_t bpe_merge_word(const loom_tokenizer *t, int32_t *ids, size_t n) {
    return n <= 48 ? bpe_merge_word_scan(t, ids, n) : bpe_merge_word_heap(t, ids, n);
}

/* ---- ids ---------------------------------------------------------------------------------- */
void loom_ids_free(loom_ids *v) {
    free(v->ids);
    memset(v, 0, sizeof *v);
}

static void ids_reserve(loom_ids *v, size_t extra) {
    if (v->n + extra <= v->cap) return;
    size_t c = v->cap ? v->cap : 256;
    while (c < v->n + extra) c *= 2;
    v->ids = loom_realloc(v->ids, c * sizeof *v->ids);
    v->cap = c;
}

static inline void ids_push(loom_ids *v, int32_t id) {
    ids_reserve(v, 1);
    v->ids[v->n++] = id;
}

/* ---- the pre-token cache --------------------------------------------------------------------
 * 64 stripes, each an open-addressing table behind a mutex taken with trylock: a busy stripe
 * is skipped (the word is merged again), so threads never wait on each other. Stripes stop
 * taking entries when three quarters full or past 1 MiB of keys and ids. */
static int cache_get(const loom_tokenizer *t, uint64_t h, const uint8_t *w, size_t n, loom_ids *out) {
    bpe_cache_stripe *s = &t->cache[h % BPE_CACHE_STRIPES];
    if (pthread_mutex_trylock(&s->mu)) return 0;
    int hit = 0;
    size_t mask = BPE_CACHE_SLOTS - 1, i = (h >> 8) & mask;
    for (;;) {
        bpe_cache_entry *e = &s->slots[i];
        if (!e->hash) break;
        if (e->hash == h && e->key_len == n && !memcmp(s->pool + e->key_off, w, n)) {
            if (e->n_ids) {
                ids_reserve(out, e->n_ids);
                memcpy(out->ids + out->n, s->pool + e->ids_off, e->n_ids * sizeof(int32_t));
                out->n += e->n_ids;
            }
            hit = 1;
            break;
        }
        i = (i + 1) & mask;
    }
    pthread_mutex_unlock(&s->mu);
    return hit;
}

static void cache_put(const loom_tokenizer *t, uint64_t h, const uint8_t *w, size_t n,
                      const int32_t *ids, size_t n_ids) {
    bpe_cache_stripe *s = &t->cache[h % BPE_CACHE_STRIPES];
    size_t need = ((n + 3) & ~(size_t)3) + n_ids * sizeof(int32_t);
    if (pthread_mutex_trylock(&s->mu)) return;
    if (s->used * 4 >= BPE_CACHE_SLOTS * 3 || s->pool_len + need > ((size_t)1 << 20)) goto out;
    if (s->pool_len + need > s->pool_cap) {
        size_t c = s->pool_cap ? s->pool_cap : 16384;
        while (c < s->pool_len + need) c *= 2;
        s->pool = loom_realloc(s->pool, c);
        s->pool_cap = c;
    }
    size_t mask = BPE_CACHE_SLOTS - 1, i = (h >> 8) & mask;
    while (s->slots[i].hash) {
        if (s->slots[i].hash == h && s->slots[i].key_len == n &&
            !memcmp(s->pool + s->slots[i].key_off, w, n))
            goto out; /* another thread put it first */
        i = (i + 1) & mask;
    }
    bpe_cache_entry *e = &s->slots[i];
    e->key_off = (uint32_t)s->pool_len;
    e->key_len = (uint32_t)n;
    memcpy(s->pool + s->pool_len, w, n);
    s->pool_len += (n + 3) & ~(size_t)3;
    e->ids_off = (uint32_t)s->pool_len;
    e->n_ids = (uint32_t)n_ids;
    if (n_ids) memcpy(s->pool + s->pool_len, ids, n_ids * sizeof(int32_t));
    s->pool_len += n_ids * sizeof(int32_t);
    e->hash = h;
    s->used++;
out:
    pthread_mutex_unlock(&s->mu);
}

/* ---- encoding one pre-token ----------------------------------------------------------------- */
typedef struct enc_ctx {
    const loom_tokenizer *t;
    loom_ids *out;
} enc_ctx;

/* The word cache in front of both encoders: 1 when w's ids were appended from it; else *h is
 * its key (0: too long to cache). */
static int word_cached(const loom_tokenizer *t, const uint8_t *w, size_t n, loom_ids *out,
                       uint64_t *h) {
    *h = 0;
    if (n >= BPE_CACHE_MAX_WORD) return 0;
    *h = bpe_hash_bytes(w, n) | 1;
    return cache_get(t, *h, w, n, out);
}

/* Both encoders' end: merges the k initial symbols of w, appends the result, caches it (h). */
static void merge_and_emit(const loom_tokenizer *t, const uint8_t *w, size_t n, uint64_t h,
                           int32_t *sym, size_t k, loom_ids *out) {
    k = bpe_merge_word(t, sym, k);
    if (k) {
        ids_reserve(out, k);
        memcpy(out->ids + out->n, sym, k * sizeof *sym);
        out->n += k;
    }
    if (h) cache_put(t, h, w, n, sym, k);
}

static void encode_word(void *vctx, const uint8_t *w, size_t n) {
    enc_ctx *c = vctx;
    const loom_tokenizer *t = c->t;
    loom_ids *out = c->out;
    if (!n) return;
    uint64_t h = 0;
    if (word_cached(t, w, n, out, &h)) return;
    if (t->ignore_merges) {
        char sbuf[2 * BPE_CACHE_MAX_WORD], *sp = n <= BPE_CACHE_MAX_WORD ? sbuf : loom_malloc(2 * n);
        size_t sl = bpe_bytes_to_spelling(w, n, sp);
        int32_t id = bpe_strmap_get(&t->vocab, sp, sl);
        if (sp != sbuf) free(sp);
        if (id >= 0) {
            ids_push(out, id);
            return;
        }
    }
    int32_t buf[2 * BPE_CACHE_MAX_WORD];
    int32_t *sym = 2 * n <= 2 * BPE_CACHE_MAX_WORD ? buf : loom_malloc(2 * n * sizeof *sym);
    size_t k = 0;
    /* HF's merge_word, one character (= one byte) at a time. A pending unknown is flushed by
     * the next known character but not by byte-fallback tokens, exactly as HF does. */
    int32_t unk = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id >= 0) {
            if (unk >= 0) sym[k++] = unk, unk = -1;
            sym[k++] = id;
            continue;
        }
        if (t->byte_fallback && t->fallback_id[w[i]][0] >= 0) {
            sym[k++] = t->fallback_id[w[i]][0];
            if (t->fallback_id[w[i]][1] >= 0) sym[k++] = t->fallback_id[w[i]][1];
            continue;
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !t->fuse_unk) sym[k++] = unk;
            unk = t->unk_id;
        }
        /* no unk token: the character is dropped, as in HF */
    }
    if (unk >= 0) sym[k++] = unk;
    merge_and_emit(t, w, n, h, sym, k, out);
    if (sym != buf) free(sym);
}

/* The same for a tokenizer whose vocabulary is spelled in characters (no ByteLevel step, e.g.
 * SentencePiece-style BPE): HF's merge_word over the piece's characters. A byte that does not
 * start a valid UTF-8 character (loom's extension: HF never sees one) is a character of its
 * own that no vocabulary entry spells, so it takes the byte-fallback or unknown path. */
static void encode_word_chars(void *vctx, const uint8_t *w, size_t n) {
    enc_ctx *c = vctx;
    const loom_tokenizer *t = c->t;
    loom_ids *out = c->out;
    if (!n) return;
    uint64_t h = 0;
    if (word_cached(t, w, n, out, &h)) return;
    if (t->ignore_merges) {
        int32_t id = bpe_strmap_get(&t->vocab, (const char *)w, n);
        if (id >= 0) {
            ids_push(out, id);
            return;
        }
    }
    int32_t buf[BPE_CACHE_MAX_WORD];
    int32_t *sym = n <= BPE_CACHE_MAX_WORD ? buf : loom_malloc(n * sizeof *sym);
    size_t k = 0;
    int32_t unk = -1;
    for (size_t i = 0; i < n;) {
        size_t l = w[i] < 0x80 ? 1 : bpe_utf8_len(w + i, n - i, NULL);
        int32_t id = w[i] < 0x80 ? t->char_id[w[i]] : l ? bpe_strmap_get(&t->vocab, (const char *)w + i, l) : -1;
        if (!l) l = 1;
        if (id >= 0) {
            if (unk >= 0) sym[k++] = unk, unk = -1;
            sym[k++] = id;
            i += l;
            continue;
        }
        if (t->byte_fallback) {
            int ok = 1;
            for (size_t j = 0; j < l; j++) ok &= t->fb_id[w[i + j]] >= 0;
            if (ok) { /* a pending unknown is not flushed by byte-fallback tokens (as HF) */
                for (size_t j = 0; j < l; j++) sym[k++] = t->fb_id[w[i + j]];
                i += l;
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !t->fuse_unk) sym[k++] = unk;
            unk = t->unk_id;
        }
        i += l;
    }
    if (unk >= 0) sym[k++] = unk;
    merge_and_emit(t, w, n, h, sym, k, out);
    if (sym != buf) free(sym);
}

static void byte_piece(void *vctx, const uint8_t *w, size_t n) {
    enc_ctx *c = vctx;
    ids_reserve(c->out, n);
    for (size_t i = 0; i < n; i++) c->out->ids[c->out->n++] = w[i];
}

/* ---- added tokens, then pre-tokenization ------------------------------------------------------ */
typedef struct seg_ctx {
    const loom_tokenizer *t;
    pcre2_match_data *md;
    bpe_piece_fn fn; /* called per final piece */
    void *fn_ctx;
    loom_ids *out;   /* where added tokens' ids go (NULL: report them as pieces) */
    loom_err *err;
    int cont;        /* LOOM_TOK_CONTINUE: the text continues earlier text */
} seg_ctx;

static int plain_segment(seg_ctx *c, const uint8_t *s, size_t n, size_t off) {
    const loom_tokenizer *t = c->t;
    if (!n) return 0;
    if (t->kind == LOOM_TOKENIZER_BYTE) {
        c->fn(c->fn_ctx, s, n);
        return 0;
    }
    if (t->add_prefix_space && s[0] != ' ' && !(c->cont && off == 0)) {
        /* HF ByteLevel adds one space in front of every split that does not start with one */
        uint8_t *tmp = loom_malloc(n + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, s, n);
        int rc = bpe_pretokenize(t, c->md, tmp, n + 1, c->fn, c->fn_ctx, c->err);
        free(tmp);
        return rc;
    }
    return bpe_pretokenize(t, c->md, s, n, c->fn, c->fn_ctx, c->err);
}

static int split_added(seg_ctx *c, const uint8_t *s, size_t n, int pass, size_t off);

/* Unicode White_Space (Rust's char::is_whitespace, what HF's lstrip/rstrip take) */
static int is_ws_cp(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == ' ' || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* length of the whitespace character at the start of s[0..n), or 0 */
static size_t ws_len_at(const uint8_t *s, size_t n) {
    uint32_t cp;
    size_t l = bpe_utf8_len(s, n, &cp);
    return l && is_ws_cp(cp) ? l : 0;
}

/* length of the whitespace character that ends s[0..n), or 0 */
static size_t ws_len_before(const uint8_t *s, size_t n) {
    for (size_t l = 1; l <= 4 && l <= n; l++) {
        if (l < n && l < 4 && (s[n - l] & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        uint32_t cp;
        return bpe_utf8_len(s + n - l, l, &cp) == l && is_ws_cp(cp) ? l : 0;
    }
    return 0;
}

/* What lies between the added tokens of one pass. The plain GPT-2 form: its second pass, then
 * the ByteLevel pre-tokenizer. General tokenizers: the first pass's segments are normalized
 * and searched for the normalized added tokens; the second pass's go through the
 * pre-tokenizers. off: the segment's offset in the encoded text (0 = its start). */
static int between_added(seg_ctx *c, const uint8_t *s, size_t n, int pass, size_t off) {
    const loom_tokenizer *t = c->t;
    if (!n) return 0;
    if (!t->general) return pass == 0 ? split_added(c, s, n, 1, off) : plain_segment(c, s, n, off);
    if (pass == 1) return bpe_pretok_run(t, c->md, 0, s, n, off == 0, c->cont, c->fn, c->fn_ctx, c->err);
    uint8_t *ns;
    size_t nl;
    if (bpe_normalize(t, s, n, !(c->cont && off == 0), &ns, &nl, c->err)) return -1;
    int rc = split_added(c, ns ? ns : s, nl, 1, off);
    free(ns);
    return rc;
}

/* HF extracts the added tokens that are not normalized first (on the raw text), then the
 * normalized ones in what is left (after normalization); each pass takes the leftmost match,
 * the longest at that position. The plain GPT-2 form keeps loom's original order: special
 * tokens, then the others. */
static int split_added(seg_ctx *c, const uint8_t *s, size_t n, int pass, size_t off) {
    const loom_tokenizer *t = c->t;
    size_t seg = 0, i = 0;
    while (i < n) {
        if (!t->added_first[s[i]]) {
            i++;
            continue;
        }
        int best = -1;
        size_t best_len = 0;
        for (int a = 0; a < t->n_added; a++) {
            const bpe_added *ad = &t->added[a];
            const int in_pass = t->general ? ad->normalized == pass : ad->special != pass;
            const char *pat = pass && ad->ncontent ? ad->ncontent : ad->content;
            const size_t pl = pass && ad->ncontent ? ad->nlen : ad->len;
            if (!in_pass || pl <= best_len || pl > n - i) continue;
            if (!memcmp(s + i, pat, pl)) best = a, best_len = pl;
        }
        if (best < 0) {
            i++;
            continue;
        }
        /* lstrip / rstrip: the token's split takes the whitespace before it (not what an
         * earlier match took) and after it */
        size_t a0 = i, e = i + best_len;
        if (t->added[best].lstrip)
            while (a0 > seg) {
                size_t l = ws_len_before(s + seg, a0 - seg);
                if (!l) break;
                a0 -= l;
            }
        if (t->added[best].rstrip)
            for (size_t l; e < n && (l = ws_len_at(s + e, n - e)) != 0;) e += l;
        if (a0 > seg && between_added(c, s + seg, a0 - seg, pass, off + seg)) return -1;
        if (c->out) ids_push(c->out, t->added[best].id);
        else c->fn(c->fn_ctx, s + a0, e - a0);
        i = e;
        seg = i;
    }
    if (n > seg) return between_added(c, s + seg, n - seg, pass, off + seg);
    return 0;
}

int loom_tokenizer_encode_ex(const loom_tokenizer *t, const void *text, size_t len, unsigned flags,
                             loom_ids *out, loom_err *err) {
    if (len > ((size_t)1 << 31)) return loom_errf(err, "tokenizer: input of %zu bytes is too large for one encode call (limit 2 GiB)", len);
    enc_ctx ec = {t, out};
    bpe_piece_fn fn = t->kind == LOOM_TOKENIZER_BYTE ? byte_piece : t->general && !t->byte_level ? encode_word_chars : encode_word;
    seg_ctx c = {t, NULL, fn, &ec, out, err, (flags & LOOM_TOK_CONTINUE) != 0};
    if (t->kind == LOOM_TOKENIZER_BPE && (t->use_regex || t->general)) {
        c.md = pcre2_match_data_create(1, NULL);
        LOOM_CHECK(c.md != NULL);
    }
    int rc = split_added(&c, text, len, 0, 0);
    if (c.md) pcre2_match_data_free(c.md);
    return rc;
}

int loom_tokenizer_encode(const loom_tokenizer *t, const void *text, size_t len, loom_ids *out,
                          loom_err *err) {
    return loom_tokenizer_encode_ex(t, text, len, 0, out, err);
}

typedef struct dbg_ctx {
    size_t *ends, max, n;
    const uint8_t *base;
} dbg_ctx;

static void dbg_piece(void *v, const uint8_t *p, size_t n) {
    dbg_ctx *d = v;
    if (d->n < d->max) d->ends[d->n] = (size_t)(p - d->base) + n;
    d->n++;
}

long loom_bpe_debug_pieces(const loom_tokenizer *t, const char *text, size_t len, size_t *ends,
                           size_t max) {
    if (t->add_prefix_space || t->general) return -1; /* offsets would not refer to text */
    dbg_ctx d = {ends, max, 0, (const uint8_t *)text};
    loom_err err;
    seg_ctx c = {t, NULL, dbg_piece, &d, NULL, &err, 0};
    c.md = pcre2_match_data_create(1, NULL);
    int rc = split_added(&c, (const uint8_t *)text, len, 0, 0);
    pcre2_match_data_free(c.md);
    return rc ? -1 : (long)d.n;
}

/* ---- decode ---------------------------------------------------------------------------------- */
int loom_tokenizer_decode_ex(const loom_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                             char **out, size_t *out_len, loom_err *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->vocab_size || !t->tok[ids[i]].raw)
            return loom_errf(err, "tokenizer: token id %d (at position %zu) is not in the vocabulary (size %u)",
                             (int)ids[i], i, t->vocab_size);
        total += t->tok[ids[i]].raw_len;
    }
    const int at_start = !(flags & LOOM_TOK_CONTINUE);
    /* a Metaspace decoder treats the first token of a text apart (its replacement is dropped) */
    char *first = NULL;
    size_t first_len = 0;
    if (at_start && n && t->general && t->dec_meta_first) {
        const bpe_token *tk = &t->tok[ids[0]];
        const char *s = tk->str;
        size_t sl = tk->str_len;
        for (int a = 0; a < t->n_added && !tk->in_vocab; a++) /* an added token's normalized spelling */
            if (t->added[a].id == ids[0] && t->added[a].ncontent) s = t->added[a].ncontent, sl = t->added[a].nlen;
        bpe_decode_token(t, s, sl, 1, &first, &first_len);
        total += first_len;
    }
    char *buf = loom_malloc(total + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const bpe_token *tk = &t->tok[ids[i]];
        if (i == 0 && first) {
            memcpy(buf, first, first_len);
            k = first_len;
            continue;
        }
        memcpy(buf + k, tk->raw, tk->raw_len);
        k += tk->raw_len;
    }
    free(first);
    if (at_start && t->general && (t->strip_start || t->strip_stop)) { /* a Strip decoder after Fuse */
        const size_t cl = t->strip_char_len;
        size_t a = 0, b = k;
        for (int i = 0; i < t->strip_start && a + cl <= b && !memcmp(buf + a, t->strip_char, cl); i++) a += cl;
        for (int i = 0; i < t->strip_stop && b >= a + cl && !memcmp(buf + b - cl, t->strip_char, cl); i++) b -= cl;
        memmove(buf, buf + a, b - a);
        k = b - a;
    }
    buf[k] = 0;
    *out = buf;
    *out_len = k;
    return 0;
}

int loom_tokenizer_decode(const loom_tokenizer *t, const int32_t *ids, size_t n, char **out,
                          size_t *out_len, loom_err *err) {
    return loom_tokenizer_decode_ex(t, ids, n, 0, out, out_len, err);
}

/* ---- queries ---------------------------------------------------------------------------------- */
loom_tokenizer_kind loom_tokenizer_get_kind(const loom_tokenizer *t) { return t->kind; }
uint32_t loom_tokenizer_vocab_size(const loom_tokenizer *t) { return t->vocab_size; }
const char *loom_tokenizer_id(const loom_tokenizer *t) { return t->id_hex; }

int32_t loom_tokenizer_special_id(const loom_tokenizer *t, const char *content) {
    size_t n = strlen(content);
    for (int a = 0; a < t->n_added; a++)
        if (t->added[a].len == n && !memcmp(t->added[a].content, content, n)) return t->added[a].id;
    return -1;
}

int loom_tokenizer_is_added(const loom_tokenizer *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->vocab_size && t->tok[id].added >= 0;
}

int32_t loom_tokenizer_token_id(const loom_tokenizer *t, const char *token) {
    int32_t id = bpe_strmap_get(&t->vocab, token, strlen(token));
    return id >= 0 ? id : loom_tokenizer_special_id(t, token);
}

/* ---- construction ------------------------------------------------------------------------------ */
int bpe_new(loom_tokenizer **out, loom_err *err) {
    loom_tokenizer *t = loom_calloc(1, sizeof *t);
    t->kind = LOOM_TOKENIZER_BPE;
    t->use_regex = 1;
    t->unk_id = -1;
    int ec;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)BPE_GPT2_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &ec, &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        free(t);
        return loom_errf(err, "tokenizer: cannot compile the GPT-2 pre-tokenizer regex: %s", (const char *)msg);
    }
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    bpe_strmap_init(&t->vocab, 1024);
    bpe_u64map_init(&t->merge_map, 1024);
    *out = t;
    return 0;
}

void bpe_set_token(loom_tokenizer *t, int32_t id, char *str, size_t len, int in_vocab) {
    bpe_token *tk = &t->tok[id];
    free(tk->str);
    if (tk->raw != tk->str) free(tk->raw);
    tk->str = str;
    tk->str_len = (uint32_t)len;
    tk->in_vocab = (uint8_t)in_vocab;
    /* raw bytes: alphabet characters give their byte, any other character its own UTF-8 */
    tk->raw = loom_malloc(len + 1);
    size_t k = 0;
    const uint8_t *s = (const uint8_t *)str;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t l = bpe_utf8_len(s + i, len - i, &cp);
        int b = l ? bpe_cp_to_byte(cp) : -1;
        if (b >= 0) {
            tk->raw[k++] = (char)b;
            i += l;
        } else {
            size_t m = l ? l : 1;
            memcpy(tk->raw + k, s + i, m);
            k += m;
            i += m;
        }
    }
    tk->raw[k] = 0;
    tk->raw_len = (uint32_t)k;
}

int bpe_finish(loom_tokenizer *t, loom_err *err) {
    pthread_once(&g_spell_once, spell_init);
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = bpe_strmap_get(&t->vocab, (const char *)g_spell[b], g_spell_len[b]);
        /* byte_fallback looks up "<0xXX>" for each UTF-8 byte of the character */
        t->fallback_id[b][0] = t->fallback_id[b][1] = -1;
        int32_t f[2] = {-1, -1};
        int ok = 1;
        for (int j = 0; j < g_spell_len[b]; j++) {
            char code[8];
            snprintf(code, sizeof code, "<0x%02X>", g_spell[b][j]);
            f[j] = bpe_strmap_get(&t->vocab, code, strlen(code));
            if (f[j] < 0) ok = 0;
        }
        if (ok) t->fallback_id[b][0] = f[0], t->fallback_id[b][1] = f[1];
    }
    for (int b = 0; b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        t->fb_id[b] = bpe_strmap_get(&t->vocab, code, strlen(code));
        if (b < 128) t->char_id[b] = bpe_strmap_get(&t->vocab, (const char *)&(char){(char)b}, 1);
    }
    memset(t->added_first, 0, sizeof t->added_first);
    for (uint32_t i = 0; i < t->vocab_size; i++) t->tok[i].added = -1;
    for (int a = 0; a < t->n_added; a++) {
        bpe_added *ad = &t->added[a];
        t->added_first[(uint8_t)ad->content[0]] = 1;
        if (t->general && ad->normalized && t->n_norm && !ad->ncontent) {
            /* HF matches a normalized added token by its normalized content */
            uint8_t *nc;
            size_t nl;
            if (bpe_normalize(t, (const uint8_t *)ad->content, ad->len, 1, &nc, &nl, err)) return -1;
            if (nc && nl) {
                ad->ncontent = loom_realloc(nc, nl + 1);
                ad->ncontent[nl] = 0;
                ad->nlen = nl;
                t->added_first[(uint8_t)ad->ncontent[0]] = 1;
            } else {
                free(nc);
            }
        }
        bpe_token *tk = &t->tok[ad->id];
        tk->added = (int8_t)(a < 127 ? a : 127);
        /* an added token decodes to its content */
        if (tk->raw != tk->str) free(tk->raw);
        tk->raw = loom_malloc(ad->len + 1);
        memcpy(tk->raw, ad->content, ad->len + 1);
        tk->raw_len = (uint32_t)ad->len;
        if (!tk->str) {
            tk->str = loom_malloc(ad->len + 1);
            memcpy(tk->str, ad->content, ad->len + 1);
            tk->str_len = (uint32_t)ad->len;
        }
    }
    if (t->general) /* what each token decodes to, through the file's decoders (added tokens too, as HF) */
        for (uint32_t i = 0; i < t->vocab_size; i++) {
            bpe_token *tk = &t->tok[i];
            if (!tk->str) continue;
            if (tk->raw != tk->str) free(tk->raw);
            size_t rl;
            bpe_decode_token(t, tk->str, tk->str_len, 0, &tk->raw, &rl);
            tk->raw_len = (uint32_t)rl;
        }
    for (int a = 0; t->general && a < t->n_added; a++) { /* HF decodes these as their normalized content */
        bpe_added *ad = &t->added[a];
        bpe_token *tk = &t->tok[ad->id];
        if (!ad->ncontent || tk->in_vocab) continue;
        if (tk->raw != tk->str) free(tk->raw);
        size_t rl;
        bpe_decode_token(t, ad->ncontent, ad->nlen, 0, &tk->raw, &rl);
        tk->raw_len = (uint32_t)rl;
    }
    if (t->kind == LOOM_TOKENIZER_BPE) {
        t->cache = loom_calloc(BPE_CACHE_STRIPES, sizeof *t->cache);
        for (int i = 0; i < BPE_CACHE_STRIPES; i++) {
            pthread_mutex_init(&t->cache[i].mu, NULL);
            t->cache[i].slots = loom_calloc(BPE_CACHE_SLOTS, sizeof(bpe_cache_entry));
        }
        char *js = bpe_json_text(t, 1);
        loom_sha256_hex(js, strlen(js), t->id_hex);
        free(js);
    }
    (void)err;
    return 0;
}

void loom_tokenizer_free(loom_tokenizer *t) {
    if (!t) return;
    for (uint32_t i = 0; t->tok && i < t->vocab_size; i++) {
        if (t->tok[i].raw != t->tok[i].str) free(t->tok[i].raw);
        free(t->tok[i].str);
    }
    free(t->tok);
    bpe_strmap_free(&t->vocab);
    if (t->merge_map.cap) bpe_u64map_free(&t->merge_map);
    free(t->merges);
    for (int a = 0; a < t->n_added; a++) free(t->added[a].content), free(t->added[a].ncontent);
    free(t->added);
    if (t->re) pcre2_code_free(t->re);
    bpe_pipeline_free(t);
    if (t->cache) {
        for (int i = 0; i < BPE_CACHE_STRIPES; i++) {
            pthread_mutex_destroy(&t->cache[i].mu);
            free(t->cache[i].slots);
            free(t->cache[i].pool);
        }
        free(t->cache);
    }
    free(t);
}

int loom_tokenizer_byte(const char *const *specials, int n_specials, loom_tokenizer **out,
                        loom_err *err) {
    if (n_specials < 0 || n_specials > 65536) return loom_errf(err, "tokenizer: %d special tokens (0..65536)", n_specials);
    for (int i = 0; i < n_specials; i++) {
        if (!specials[i] || !specials[i][0]) return loom_errf(err, "tokenizer: special token %d is empty", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(specials[i], specials[j]))
                return loom_errf(err, "tokenizer: special token '%s' is given twice", specials[i]);
    }
    loom_tokenizer *t = loom_calloc(1, sizeof *t);
    t->kind = LOOM_TOKENIZER_BYTE;
    t->unk_id = -1;
    t->vocab_size = 256 + (uint32_t)n_specials;
    t->tok = loom_calloc(t->vocab_size, sizeof *t->tok);
    bpe_strmap_init(&t->vocab, 16);
    for (int b = 0; b < 256; b++) {
        bpe_token *tk = &t->tok[b];
        tk->raw = loom_malloc(2);
        tk->raw[0] = (char)b;
        tk->raw[1] = 0;
        tk->raw_len = 1;
        tk->str = loom_malloc(4);
        size_t l = bpe_bytes_to_spelling((const uint8_t *)tk->raw, 1, tk->str);
        tk->str[l] = 0;
        tk->str_len = (uint32_t)l;
        tk->in_vocab = 1;
        tk->added = -1;
        bpe_strmap_put(&t->vocab, tk->str, l, b);
    }
    t->n_added = n_specials;
    t->added = loom_calloc(n_specials ? (size_t)n_specials : 1, sizeof *t->added);
    for (int i = 0; i < n_specials; i++) {
        t->added[i].len = strlen(specials[i]);
        t->added[i].content = loom_strdup(specials[i]);
        t->added[i].id = 256 + i;
        t->added[i].special = 1;
        t->tok[256 + i].added = -1;
    }
    bpe_finish(t, err);
    if (!n_specials) {
        snprintf(t->id_hex, sizeof t->id_hex, "byte");
    } else {
        size_t total = 5;
        for (int i = 0; i < n_specials; i++) total += strlen(specials[i]) + 1;
        char *buf = loom_malloc(total), *p = buf;
        memcpy(p, "byte", 5);
        p += 5;
        for (int i = 0; i < n_specials; i++) {
            size_t l = strlen(specials[i]) + 1;
            memcpy(p, specials[i], l);
            p += l;
        }
        loom_sha256_hex(buf, total, t->id_hex);
        free(buf);
    }
    *out = t;
    return 0;
}

/* Exported for tests: bitmap (0x110000 bits) of the code points PCRE2's Unicode tables leave
 * unassigned (\p{Cn}); loom classifies characters with those tables. Returns 0 or -1. */
int loom_bpe_debug_unassigned(uint8_t *bitmap) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR) "\\p{Cn}", PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED, &ec, &eo, NULL);
    if (!re) return -1;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    memset(bitmap, 0, 0x110000 / 8);
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        uint8_t u[4];
        size_t n;
        if (cp < 0x80) u[0] = (uint8_t)cp, n = 1;
        else if (cp < 0x800) u[0] = (uint8_t)(0xC0 | (cp >> 6)), u[1] = (uint8_t)(0x80 | (cp & 0x3F)), n = 2;
        else if (cp < 0x10000)
            u[0] = (uint8_t)(0xE0 | (cp >> 12)), u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)),
            u[2] = (uint8_t)(0x80 | (cp & 0x3F)), n = 3;
        else
            u[0] = (uint8_t)(0xF0 | (cp >> 18)), u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F)),
            u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (uint8_t)(0x80 | (cp & 0x3F)), n = 4;
        if (pcre2_match(re, u, n, 0, 0, md, NULL) > 0) bitmap[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return 0;
}
