/* Deduplication steps.
 *
 * dedup_exact: a document is dropped when an earlier document (of the source, or with
 *   dedup_across_sources of any earlier source) has the same bytes. Documents are compared by
 *   their 128-bit XXH3 hash (a false match needs a 2^-128 collision).
 * dedup_near: MinHash over shingles of `shingle` characters (text) or bytes (binary), with
 *   num_perm hash functions; LSH splits each signature into `bands` bands of num_perm/bands
 *   rows, and documents sharing a band are candidates. A candidate is a duplicate when the
 *   estimated Jaccard similarity (the fraction of equal signature values) is >= threshold.
 *   Documents are visited in input order and the first one of a group is kept, so the result
 *   is deterministic (signatures are computed in parallel, the decisions are sequential). */
#define _GNU_SOURCE
#define XXH_INLINE_ALL
#include "data/build_source.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- a set of 128-bit hashes (open addressing) ---- */
struct loom_hashset {
    XXH128_hash_t *slots;
    uint8_t *used;
    size_t cap, n;
};

loom_hashset *loom_hashset_new(void) {
    loom_hashset *h = loom_calloc(1, sizeof *h);
    h->cap = 1024;
    h->slots = loom_calloc(h->cap, sizeof *h->slots);
    h->used = loom_calloc(h->cap, 1);
    return h;
}

void loom_hashset_free(loom_hashset *h) {
    if (!h) return;
    free(h->slots);
    free(h->used);
    free(h);
}

/* Inserts k; returns 1 if it was new, 0 if already present. */
static int hs_insert(loom_hashset *h, XXH128_hash_t k) {
    if (2 * (h->n + 1) > h->cap) {
        loom_hashset big = {loom_calloc(2 * h->cap, sizeof *h->slots), loom_calloc(2 * h->cap, 1),
                            2 * h->cap, 0};
        for (size_t i = 0; i < h->cap; i++)
            if (h->used[i]) hs_insert(&big, h->slots[i]);
        free(h->slots);
        free(h->used);
        *h = big;
    }
    size_t m = h->cap - 1, i = (size_t)k.low64 & m;
    while (h->used[i]) {
        if (h->slots[i].low64 == k.low64 && h->slots[i].high64 == k.high64) return 0;
        i = (i + 1) & m;
    }
    h->used[i] = 1;
    h->slots[i] = k;
    h->n++;
    return 1;
}

void loom_exact_dedup(const loom_docs *docs, loom_hashset *set, uint8_t *keep) {
    size_t n = docs->n;
    XXH128_hash_t *hs = loom_malloc((n ? n : 1) * sizeof *hs);
    #pragma omp parallel for schedule(dynamic, 64)
    for (size_t i = 0; i < n; i++) hs[i] = XXH3_128bits(loom_doc_bytes(docs, i), docs->v[i].len);
    for (size_t i = 0; i < n; i++) keep[i] = (uint8_t)hs_insert(set, hs[i]);
    free(hs);
}

/* ---- MinHash ---- */

static uint64_t perm_seed(int j) { return loom_mix64(0x9e3779b97f4a7c15ULL * (uint64_t)(j + 1)); }

void loom_minhash(const uint8_t *p, size_t n, int k, int chars, int num_perm, uint64_t *sig) {
    for (int j = 0; j < num_perm; j++) sig[j] = UINT64_MAX;
    if (n == 0) return;
    /* unit starts: every byte, or every byte that is not a UTF-8 continuation byte */
    size_t n_units = 0;
    size_t *start = loom_malloc((n + 1) * sizeof *start);
    for (size_t i = 0; i < n; i++)
        if (!chars || (p[i] & 0xC0) != 0x80) start[n_units++] = i;
    start[n_units] = n;
    size_t n_sh = n_units >= (size_t)k ? n_units - (size_t)k + 1 : 1;
    /* hash function j: h -> a_j * h + b_j (mod 2^64, a_j odd: a permutation of the 64-bit
     * values), applied to a well-mixed 64-bit shingle hash; one multiply-add per function,
     * which the compiler vectorizes */
    uint64_t mul[1024], add[1024];
    for (int j = 0; j < num_perm; j++) {
        mul[j] = perm_seed(2 * j) | 1;
        add[j] = perm_seed(2 * j + 1);
    }
    for (size_t s = 0; s < n_sh; s++) {
        size_t a = start[s], b = start[s + (size_t)k < n_units ? s + (size_t)k : n_units];
        uint64_t h = XXH3_64bits(p + a, b - a);
        for (int j = 0; j < num_perm; j++) {
            uint64_t v = mul[j] * h + add[j];
            sig[j] = v < sig[j] ? v : sig[j];
        }
    }
    free(start);
}

/* buckets: a chained hash map from a band key to the kept documents with that band */
typedef struct bucket_map {
    uint64_t *keys;   /* (cap) */
    int64_t *head;    /* (cap) first entry index, -1 = empty slot */
    size_t cap, n;
    int64_t *next;    /* (entries) */
    size_t *doc;      /* (entries) */
    size_t n_entries, entries_cap;
} bucket_map;

static int64_t *bm_slot(bucket_map *m, uint64_t key, int create) {
    if (create && 2 * (m->n + 1) > m->cap) {
        bucket_map big = {loom_malloc(2 * m->cap * sizeof(uint64_t)),
                          loom_malloc(2 * m->cap * sizeof(int64_t)), 2 * m->cap, 0,
                          m->next, m->doc, m->n_entries, m->entries_cap};
        for (size_t i = 0; i < big.cap; i++) big.head[i] = -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->head[i] >= 0) *bm_slot(&big, m->keys[i], 1) = m->head[i];
        free(m->keys);
        free(m->head);
        *m = big;
    }
    size_t mask = m->cap - 1, i = (size_t)loom_mix64(key) & mask;
    while (m->head[i] >= 0 || (create && m->head[i] == -2)) {
        if (m->keys[i] == key) return &m->head[i];
        i = (i + 1) & mask;
    }
    if (!create) return NULL;
    m->keys[i] = key;
    m->head[i] = -2; /* reserved: the caller stores an entry index */
    m->n++;
    return &m->head[i];
}

static void bm_add(bucket_map *m, uint64_t key, size_t doc) {
    int64_t *h = bm_slot(m, key, 1);
    if (m->n_entries == m->entries_cap) {
        m->entries_cap = m->entries_cap ? 2 * m->entries_cap : 1024;
        m->next = loom_realloc(m->next, m->entries_cap * sizeof *m->next);
        m->doc = loom_realloc(m->doc, m->entries_cap * sizeof *m->doc);
    }
    m->next[m->n_entries] = *h >= 0 ? *h : -1;
    m->doc[m->n_entries] = doc;
    *h = (int64_t)m->n_entries++;
}

void loom_near_dedup(const loom_docs *docs, int num_perm, int bands, int shingle, double threshold,
                     int chars, uint8_t *keep) {
    size_t n = docs->n;
    int rows = num_perm / bands;
    LOOM_CHECK(num_perm <= 1024 && rows >= 1 && rows * bands == num_perm);
    uint64_t *sig = loom_malloc((n ? n : 1) * (size_t)num_perm * sizeof *sig);
    #pragma omp parallel for schedule(dynamic, 16)
    for (size_t i = 0; i < n; i++)
        loom_minhash(loom_doc_bytes(docs, i), docs->v[i].len, shingle, chars, num_perm,
                     sig + i * (size_t)num_perm);
    bucket_map m = {0};
    m.cap = 1024;
    m.keys = loom_malloc(m.cap * sizeof *m.keys);
    m.head = loom_malloc(m.cap * sizeof *m.head);
    for (size_t i = 0; i < m.cap; i++) m.head[i] = -1;
    int need = 0;
    while ((double)need < threshold * num_perm - 1e-9) need++; /* equal values for a match */
    uint64_t *keys = loom_malloc((size_t)bands * sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        const uint64_t *si = sig + i * (size_t)num_perm;
        int dup = 0;
        for (int b = 0; b < bands && !dup; b++) {
            keys[b] = XXH3_64bits_withSeed(si + b * rows, (size_t)rows * sizeof *si, (uint64_t)b);
            int64_t *h = bm_slot(&m, keys[b], 0);
            for (int64_t e = h ? *h : -1; e >= 0 && !dup; e = m.next[e]) {
                const uint64_t *sj = sig + m.doc[e] * (size_t)num_perm;
                int eq = 0;
                for (int j = 0; j < num_perm; j++) eq += si[j] == sj[j];
                dup = eq >= need;
            }
        }
        keep[i] = (uint8_t)!dup;
        if (!dup)
            for (int b = 0; b < bands; b++) bm_add(&m, keys[b], i);
    }
    free(keys);
    free(m.keys);
    free(m.head);
    free(m.next);
    free(m.doc);
    free(sig);
}
