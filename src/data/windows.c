/* Head / body / tail windows over labelled documents (see include/loom/windows.h). */
#include "loom/windows.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

typedef struct doc {
    const loom_shard *shard;
    uint64_t start, len;
    uint64_t hash;        /* FNV-1a over the tokens: keys the body offsets */
    uint32_t label;
    uint64_t first_window; /* index of its first window in the per-epoch numbering */
    int n_windows;
} doc;

struct loom_windows {
    doc *docs;
    uint64_t n_docs, n_windows;
    int T, per_doc, shuffle, pad;
    uint64_t seed;
    uint64_t epoch, position;
    uint64_t *perm;       /* (n_windows) order of the current epoch */
    uint64_t perm_epoch;
    int32_t *scratch;     /* (T) */
};

static uint64_t hash_tokens(const loom_shard *s, uint64_t start, uint64_t len, int32_t *buf,
                            int cap) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint64_t off = 0; off < len; off += (uint64_t)cap) {
        const uint64_t n = len - off < (uint64_t)cap ? len - off : (uint64_t)cap;
        loom_shard_read_tokens(s, start + off, n, buf);
        for (uint64_t i = 0; i < n; i++) h = (h ^ (uint32_t)buf[i]) * 0x100000001b3ULL;
    }
    return h;
}

int loom_windows_open(loom_dataset *d, int T, int per_doc, uint64_t seed, int shuffle,
                      int pad_id, loom_windows **out, loom_err *err) {
    if (T <= 0 || per_doc < 1) return loom_errf(err, "windows: T and per_doc must be positive");
    loom_windows *w = loom_calloc(1, sizeof *w);
    w->T = T;
    w->per_doc = per_doc;
    w->seed = seed;
    w->shuffle = shuffle;
    w->pad = pad_id;
    w->perm_epoch = UINT64_MAX;
    w->scratch = loom_malloc((size_t)(T > 65536 ? T : 65536) * sizeof(int32_t));
    /* labels are untrusted: each must index the dataset's class list */
    char **names = NULL;
    int n_classes = 0;
    if (loom_dataset_classes(loom_dataset_dir(d), &names, &n_classes, err)) {
        loom_windows_free(w);
        return -1;
    }
    loom_free_strings(names, n_classes);
    uint64_t cap = 0;
    for (int i = 0; i < loom_dataset_num_shards(d); i++) {
        const loom_shard *s = loom_dataset_shard(d, i);
        if (!loom_shard_has_labels(s)) {
            loom_windows_free(w);
            return loom_errf(err, "%s: shard has no labels (classification needs a dataset built "
                                  "from a labelled binary source)", loom_shard_path(s));
        }
        const uint64_t nd = loom_shard_num_docs(s), nt = loom_shard_num_tokens(s);
        for (uint64_t k = 0; k < nd; k++) {
            const uint64_t a = loom_shard_doc_start(s, k);
            const uint64_t b = k + 1 < nd ? loom_shard_doc_start(s, k + 1) : nt;
            if (b <= a) continue;
            if (w->n_docs == cap) {
                cap = cap ? 2 * cap : 1024;
                w->docs = loom_realloc(w->docs, cap * sizeof *w->docs);
            }
            const uint32_t label = loom_shard_doc_label(s, k);
            if (label >= (uint32_t)n_classes) {
                loom_windows_free(w);
                return loom_errf(err, "%s: document %llu has label %u, but %s/dataset.json lists "
                                      "%d classes (0..%d)",
                                 loom_shard_path(s), (unsigned long long)k, label,
                                 loom_dataset_dir(d), n_classes, n_classes - 1);
            }
            doc *dc = &w->docs[w->n_docs++];
            dc->shard = s;
            dc->start = a;
            dc->len = b - a;
            dc->label = label;
            dc->hash = hash_tokens(s, a, b - a, w->scratch, 65536);
            dc->n_windows = dc->len <= (uint64_t)T ? 1 : per_doc;
            dc->first_window = w->n_windows;
            w->n_windows += (uint64_t)dc->n_windows;
        }
    }
    if (w->n_windows == 0) {
        loom_windows_free(w);
        return loom_errf(err, "%s: no labelled documents", loom_dataset_dir(d));
    }
    w->perm = loom_malloc(w->n_windows * sizeof(uint64_t));
    *out = w;
    return 0;
}

void loom_windows_free(loom_windows *w) {
    if (!w) return;
    free(w->docs);
    free(w->perm);
    free(w->scratch);
    free(w);
}

uint64_t loom_windows_per_epoch(const loom_windows *w) { return w->n_windows; }

static void make_perm(loom_windows *w) {
    if (w->perm_epoch == w->epoch) return;
    for (uint64_t i = 0; i < w->n_windows; i++) w->perm[i] = i;
    if (w->shuffle)
        for (uint64_t i = w->n_windows - 1; i > 0; i--) {
            const uint64_t j = loom_rng_u64(w->seed, 0x77696e646f7773ULL ^ w->epoch, i) % (i + 1);
            const uint64_t t = w->perm[i];
            w->perm[i] = w->perm[j];
            w->perm[j] = t;
        }
    w->perm_epoch = w->epoch;
}

/* the document holding window number g (binary search over first_window) */
static const doc *doc_of(const loom_windows *w, uint64_t g, int *k) {
    uint64_t lo = 0, hi = w->n_docs - 1;
    while (lo < hi) {
        const uint64_t mid = (lo + hi + 1) / 2;
        if (w->docs[mid].first_window <= g) lo = mid;
        else hi = mid - 1;
    }
    *k = (int)(g - w->docs[lo].first_window);
    return &w->docs[lo];
}

static void fill_window(loom_windows *w, uint64_t g, int32_t *out, int32_t *label) {
    int k;
    const doc *dc = doc_of(w, g, &k);
    const uint64_t T = (uint64_t)w->T;
    *label = (int32_t)dc->label;
    if (dc->len <= T) {
        loom_shard_read_tokens(dc->shard, dc->start, dc->len, out);
        for (uint64_t i = dc->len; i < T; i++) out[i] = w->pad;
        return;
    }
    uint64_t off;
    if (k == 0) off = 0;                         /* head */
    else if (k == 1) off = dc->len - T;          /* tail */
    else off = loom_rng_u64(w->seed ^ dc->hash, w->epoch, (uint64_t)k) % (dc->len - T + 1);
    loom_shard_read_tokens(dc->shard, dc->start + off, T, out);
}

void loom_windows_next(loom_windows *w, int B, int32_t *inputs, int32_t *labels) {
    for (int b = 0; b < B; b++) {
        if (w->position >= w->n_windows) {
            w->epoch++;
            w->position = 0;
        }
        make_perm(w);
        fill_window(w, w->perm[w->position++], inputs + (size_t)b * (size_t)w->T, labels + b);
    }
}

void loom_windows_get_state(const loom_windows *w, uint64_t *epoch, uint64_t *position) {
    *epoch = w->epoch;
    *position = w->position;
}

void loom_windows_set_state(loom_windows *w, uint64_t epoch, uint64_t position) {
    w->epoch = epoch + position / w->n_windows;
    w->position = position % w->n_windows;
}

int loom_dataset_classes(const char *dir, char ***names, int *n, loom_err *err) {
    char path[4200];
    loom_pathf(path, sizeof path, "%s/dataset.json", dir);
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    *names = NULL;
    *n = 0;
    if (!o) return loom_errf(err, "%s:%d: %s", path, je.line, je.text);
    json_t *cl = json_object_get(o, "classes");
    if (!json_is_array(cl) || json_array_size(cl) == 0) {
        json_decref(o);
        return loom_errf(err, "%s: no \"classes\" list (not a labelled dataset)", path);
    }
    const int k = (int)json_array_size(cl);
    char **out = loom_calloc((size_t)k, sizeof *out);
    for (int i = 0; i < k; i++) {
        json_t *s = json_array_get(cl, (size_t)i);
        if (!json_is_string(s)) {
            loom_free_strings(out, i);
            json_decref(o);
            return loom_errf(err, "%s: classes[%d] is not a string", path, i);
        }
        out[i] = loom_strdup(json_string_value(s));
    }
    json_decref(o);
    *names = out;
    *n = k;
    return 0;
}

void loom_free_strings(char **s, int n) {
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}
