/* loom synth: the near_duplicate validator (docs/synth.md, "Near duplicates").
 * data/'s MinHash and LSH index (include/loom/data.h, src/data/dedup.c), the definition
 * `loom data build`'s dedup_near uses: shingles of `shingle` UTF-8 code points (as for a text
 * source), the same hashes, band keys and threshold rule, so the two make the same decision on
 * the same pair of texts (tests/unit/test_recipe.c). The pool is the seeds and the accepted
 * samples, in item order. */
#define _GNU_SOURCE
#include "synth/synth_internal.h"

void synth_mh_init(mh_index *m) {
    m->ix = loom_minhash_index_new(m->perms, m->bands, m->threshold);
}

void synth_mh_free(mh_index *m) { loom_minhash_index_free(m->ix); }

void synth_mh_signature(const mh_index *m, const char *t, size_t n, uint64_t *sig) {
    loom_minhash((const uint8_t *)t, n, m->shingle, 1, m->perms, sig);
}

/* the index's ids are origins + 2^32 (>= 0; -1 means no candidate): an origin >= 0 is an item,
 * < 0 the seed -1 - origin */
#define ORIGIN_BIAS ((int64_t)1 << 32)

void synth_mh_add(mh_index *m, const uint64_t *sig, int origin) {
    loom_minhash_index_add(m->ix, sig, (int64_t)origin + ORIGIN_BIAS);
}

int synth_mh_query(mh_index *m, const uint64_t *sig, int *origin, double *best) {
    int eq = 0;
    const int64_t id = loom_minhash_index_query(m->ix, sig, 0, &eq);
    *best = (double)eq / m->perms;
    if (id < 0) return -1;
    *origin = (int)(id - ORIGIN_BIAS);
    return loom_minhash_index_is_dup(m->ix, eq);
}
