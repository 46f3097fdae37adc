/* loom synth: MinHash near-duplicates (docs/synth.md).
 * A text's shingles are its byte k-grams (k = `shingle`; a text shorter than k is one
 * shingle), each hashed with FNV-1a 64 and taken mod p = 2^61 - 1. Permutation i maps x to
 * (a_i x + b_i) mod p, with a_i = 1 + s mod (p - 1) and b_i = s' mod p from a SplitMix64 stream
 * seeded with 0x6d696e68617368 ("minhash"), drawn a_0, b_0, a_1, b_1, ...; the signature holds
 * each permutation's minimum over the shingles. Two texts' Jaccard similarity is estimated as
 * the fraction of equal signature entries. LSH: the signature is cut into `bands` bands of
 * perms / bands rows; texts that agree on a whole band are candidates, and a candidate whose
 * estimate reaches `threshold` makes the text a near duplicate. */
#define _GNU_SOURCE
#include "synth/synth_internal.h"

#include <string.h>

#define MH_P ((1ull << 61) - 1)

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}


void synth_mh_init(mh_index *m) {
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

void synth_mh_free(mh_index *m) {
    free(m->a), free(m->b), free(m->sig), free(m->origin), free(m->bkey), free(m->bhead);
    free(m->nidx), free(m->nnext), free(m->stamp);
}

void synth_mh_signature(const mh_index *m, const char *t, size_t n, uint64_t *sig) {
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

void synth_mh_add(mh_index *m, const uint64_t *sig, int origin) {
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
int synth_mh_query(mh_index *m, const uint64_t *sig, double *best) {
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
