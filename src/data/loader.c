/* The loader: fixed-length samples over a dataset's shards, visited in a seeded permutation
 * per epoch. Sample j of a shard is tokens [j*T, j*T+T+1) (T+1 tokens: inputs and the
 * targets shifted by one); samples never cross shards. Samples are numbered globally in
 * manifest order. The state (epoch, position) is all that a resume needs. */
#include "data/data_internal.h"

#include <stdlib.h>
#include <string.h>

struct loom_loader {
    loom_dataset *d;
    int T;
    uint64_t seed;
    int shuffle;
    int n_shards;
    uint64_t *first;    /* (n_shards + 1) global index of each shard's first sample */
    uint64_t n_samples;
    uint64_t *perm;     /* (n_samples) the order of the current epoch; NULL when !shuffle */
    uint64_t perm_epoch;
    loom_loader_state st;
    int32_t *buf;       /* (T+1) */
};

/* The stream of the RNG used for the permutation of `epoch` (a tag keeps it apart from the
 * streams that other modules derive from the same seed). */
static uint64_t perm_stream(uint64_t epoch) {
    return loom_hash_str("loom.loader.permutation") ^ (epoch * 0x9e3779b97f4a7c15ULL);
}

/* Fisher-Yates driven by counter draws: swap i with j uniform in [0, i] (Lemire's
 * multiply-shift, bias < n / 2^64). */
static void build_perm(loom_loader *l, uint64_t epoch) {
    uint64_t n = l->n_samples, stream = perm_stream(epoch);
    for (uint64_t i = 0; i < n; i++) l->perm[i] = i;
    for (uint64_t i = n; i-- > 1;) {
        uint64_t r = loom_rng_u64(l->seed, stream, i);
        uint64_t j = (uint64_t)(((unsigned __int128)r * (i + 1)) >> 64);
        uint64_t t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
    l->perm_epoch = epoch;
}

int loom_loader_create(loom_dataset *d, int T, uint64_t seed, int shuffle, loom_loader **out,
                       loom_err *err) {
    *out = NULL;
    if (T < 1) return loom_errf(err, "loader: sequence length T=%d must be positive", T);
    int n = loom_dataset_num_shards(d);
    uint64_t *first = loom_malloc((size_t)(n + 1) * sizeof *first);
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        uint64_t nt = loom_shard_num_tokens(loom_dataset_shard(d, i));
        uint64_t ns = nt >= (uint64_t)T + 1 ? (nt - 1) / (uint64_t)T : 0;
        first[i + 1] = first[i] + ns;
    }
    if (first[n] == 0) {
        free(first);
        return loom_errf(err,
                         "%s: no complete sample of %d tokens (T+1) in any of its %d shard(s)",
                         loom_dataset_dir(d), T + 1, n);
    }
    if (first[n] > (uint64_t)SIZE_MAX / sizeof(uint64_t)) {
        free(first);
        return loom_errf(err, "%s: too many samples", loom_dataset_dir(d));
    }
    loom_loader *l = loom_calloc(1, sizeof *l);
    l->d = d;
    l->T = T;
    l->seed = seed;
    l->shuffle = shuffle != 0;
    l->n_shards = n;
    l->first = first;
    l->n_samples = first[n];
    l->buf = loom_malloc((size_t)(T + 1) * sizeof *l->buf);
    if (l->shuffle) {
        l->perm = loom_malloc((size_t)l->n_samples * sizeof *l->perm);
        build_perm(l, 0);
    }
    *out = l;
    return 0;
}

void loom_loader_free(loom_loader *l) {
    if (!l) return;
    free(l->first);
    free(l->perm);
    free(l->buf);
    free(l);
}

uint64_t loom_loader_num_samples(const loom_loader *l) { return l->n_samples; }

/* Copies global sample g (T+1 tokens) into l->buf. */
static void read_sample(loom_loader *l, uint64_t g) {
    int lo = 0, hi = l->n_shards - 1; /* the shard with first[s] <= g < first[s+1] */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (l->first[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    while (l->first[lo + 1] <= g) lo++; /* skip shards with no samples */
    uint64_t j = g - l->first[lo];
    loom_shard_read_tokens(loom_dataset_shard(l->d, lo), j * (uint64_t)l->T, (uint64_t)l->T + 1,
                           l->buf);
}

void loom_loader_next(loom_loader *l, int B, int32_t *inputs, int32_t *targets) {
    size_t T = (size_t)l->T;
    for (int b = 0; b < B; b++) {
        if (l->shuffle && l->perm_epoch != l->st.epoch) build_perm(l, l->st.epoch);
        uint64_t g = l->shuffle ? l->perm[l->st.position] : l->st.position;
        read_sample(l, g);
        memcpy(inputs + (size_t)b * T, l->buf, T * sizeof *inputs);
        memcpy(targets + (size_t)b * T, l->buf + 1, T * sizeof *targets);
        if (++l->st.position == l->n_samples) {
            l->st.position = 0;
            l->st.epoch++;
        }
    }
}

loom_loader_state loom_loader_get_state(const loom_loader *l) { return l->st; }

void loom_loader_set_state(loom_loader *l, loom_loader_state s) {
    /* normalized: a position at or past the end of an epoch continues into the next ones */
    l->st.epoch = s.epoch + s.position / l->n_samples;
    l->st.position = s.position % l->n_samples;
}
