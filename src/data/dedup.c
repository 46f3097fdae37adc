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
 *   is deterministic (signatures are computed in parallel, the decisions are sequential).
 *   The signature and the LSH index are public (include/loom/data.h): loom synth's
 *   near_duplicate validator uses them, so it decides as dedup_near does. */
#define _GNU_SOURCE
#define XXH_INLINE_ALL
#include "data/build_source.h"
#include "loom/data.h"

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

/* ---- the LSH index (include/loom/data.h): dedup_near's and synth's near_duplicate's ----
 * Buckets: open addressing from a band key (XXH3-64 of the band's rows, seeded with the band
 * number; 0 marks an empty slot, so a key of 0 is stored as 1) to a chain of nodes, one per
 * (indexed signature, band). A query compares sig with every indexed signature that shares
 * a band key with it, once each (a stamp per entry). */
struct loom_minhash_index {
    int perms, bands, rows, need;
    uint64_t *sig;              /* (n, perms) the indexed signatures */
    int64_t *id;                /* (n) the caller's ids */
    uint64_t *stamp;            /* (n) the query that compared the entry last */
    size_t n, cap;
    uint64_t query;
    uint64_t *bkey;             /* (bcap) */
    int64_t *bhead;             /* (bcap) first node, -1: none */
    size_t bcap, bn;
    int64_t *nidx, *nnext;      /* (ncap) nodes: entry index, next node */
    size_t nn, ncap;
};

int loom_minhash_need(double threshold, int num_perm) {
    int need = 0;
    while ((double)need < threshold * num_perm - 1e-9) need++;
    return need;
}

loom_minhash_index *loom_minhash_index_new(int num_perm, int bands, double threshold) {
    LOOM_CHECK(num_perm >= 1 && num_perm <= 1024 && bands >= 1 && num_perm % bands == 0);
    loom_minhash_index *m = loom_calloc(1, sizeof *m);
    m->perms = num_perm;
    m->bands = bands;
    m->rows = num_perm / bands;
    m->need = loom_minhash_need(threshold, num_perm);
    m->bcap = 1024;
    m->bkey = loom_calloc(m->bcap, sizeof *m->bkey);
    m->bhead = loom_malloc(m->bcap * sizeof *m->bhead);
    for (size_t i = 0; i < m->bcap; i++) m->bhead[i] = -1;
    return m;
}

void loom_minhash_index_free(loom_minhash_index *m) {
    if (!m) return;
    free(m->sig), free(m->id), free(m->stamp), free(m->bkey), free(m->bhead);
    free(m->nidx), free(m->nnext);
    free(m);
}

int loom_minhash_index_is_dup(const loom_minhash_index *m, int eq) { return eq >= m->need; }

static uint64_t band_key(const loom_minhash_index *m, const uint64_t *sig, int band) {
    const uint64_t k = XXH3_64bits_withSeed(sig + (size_t)band * (size_t)m->rows,
                                            (size_t)m->rows * sizeof *sig, (uint64_t)band);
    return k ? k : 1;
}

static size_t band_slot(const loom_minhash_index *m, uint64_t key) {
    size_t i = (size_t)key & (m->bcap - 1);
    while (m->bkey[i] && m->bkey[i] != key) i = (i + 1) & (m->bcap - 1);
    return i;
}

void loom_minhash_index_add(loom_minhash_index *m, const uint64_t *sig, int64_t id) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->sig = loom_realloc(m->sig, (size_t)m->cap * (size_t)m->perms * sizeof *m->sig);
        m->id = loom_realloc(m->id, (size_t)m->cap * sizeof *m->id);
        m->stamp = loom_realloc(m->stamp, (size_t)m->cap * sizeof *m->stamp);
    }
    const size_t idx = m->n++;
    memcpy(m->sig + (size_t)idx * (size_t)m->perms, sig, (size_t)m->perms * sizeof *sig);
    m->id[idx] = id;
    m->stamp[idx] = 0;
    for (int band = 0; band < m->bands; band++) {
        if (2 * (m->bn + 1) > m->bcap) { /* grow and rehash */
            const size_t oc = m->bcap;
            uint64_t *ok = m->bkey;
            int64_t *oh = m->bhead;
            m->bcap *= 2;
            m->bkey = loom_calloc(m->bcap, sizeof *m->bkey);
            m->bhead = loom_malloc(m->bcap * sizeof *m->bhead);
            for (size_t i = 0; i < m->bcap; i++) m->bhead[i] = -1;
            for (size_t i = 0; i < oc; i++) {
                if (!ok[i]) continue;
                const size_t sl = band_slot(m, ok[i]);
                m->bkey[sl] = ok[i];
                m->bhead[sl] = oh[i];
            }
            free(ok);
            free(oh);
        }
        const uint64_t key = band_key(m, sig, band);
        const size_t sl = band_slot(m, key);
        if (!m->bkey[sl]) m->bkey[sl] = key, m->bn++;
        if (m->nn == m->ncap) {
            m->ncap = m->ncap ? 2 * m->ncap : 1024;
            m->nidx = loom_realloc(m->nidx, m->ncap * sizeof *m->nidx);
            m->nnext = loom_realloc(m->nnext, m->ncap * sizeof *m->nnext);
        }
        m->nidx[m->nn] = (int64_t)idx;
        m->nnext[m->nn] = m->bhead[sl];
        m->bhead[sl] = (int64_t)m->nn++;
    }
}

int64_t loom_minhash_index_query(loom_minhash_index *m, const uint64_t *sig, int first_dup, int *eq) {
    int64_t bi = -1;
    int best = -1;
    m->query++;
    for (int band = 0; band < m->bands; band++) {
        const size_t sl = band_slot(m, band_key(m, sig, band));
        if (!m->bkey[sl]) continue;
        for (int64_t nd = m->bhead[sl]; nd >= 0; nd = m->nnext[nd]) {
            const int64_t idx = m->nidx[nd];
            if (m->stamp[idx] == m->query) continue;
            m->stamp[idx] = m->query;
            const uint64_t *o = m->sig + (size_t)idx * (size_t)m->perms;
            int e = 0;
            for (int i = 0; i < m->perms; i++) e += o[i] == sig[i];
            if (bi < 0 || e > best || (e == best && idx < bi)) best = e, bi = idx;
            if (first_dup && e >= m->need) goto out;
        }
    }
out:
    *eq = bi < 0 ? 0 : best;
    return bi < 0 ? -1 : m->id[bi];
}

/* signatures in parallel, a chunk at a time; decisions in document order */
void loom_near_dedup(const loom_docs *docs, int num_perm, int bands, int shingle, double threshold,
                     int chars, uint8_t *keep) {
    const size_t n = docs->n, chunk = 4096;
    loom_minhash_index *m = loom_minhash_index_new(num_perm, bands, threshold);
    uint64_t *sig = loom_malloc((n < chunk ? (n ? n : 1) : chunk) * (size_t)num_perm * sizeof *sig);
    for (size_t c0 = 0; c0 < n; c0 += chunk) {
        const size_t c1 = c0 + chunk < n ? c0 + chunk : n;
        #pragma omp parallel for schedule(dynamic, 16)
        for (size_t i = c0; i < c1; i++)
            loom_minhash(loom_doc_bytes(docs, i), docs->v[i].len, shingle, chars, num_perm,
                         sig + (i - c0) * (size_t)num_perm);
        for (size_t i = c0; i < c1; i++) {
            const uint64_t *si = sig + (i - c0) * (size_t)num_perm;
            int eq;
            const int dup = loom_minhash_index_query(m, si, 1, &eq) >= 0 && loom_minhash_index_is_dup(m, eq);
            keep[i] = (uint8_t)!dup;
            if (!dup) loom_minhash_index_add(m, si, (int64_t)i);
        }
    }
    free(sig);
    loom_minhash_index_free(m);
}
