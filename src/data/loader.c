/* The loader: fixed-length samples from the sources of a dataset, mixed by weight.
 *
 * - A sample is T+1 consecutive tokens inside one shard: sample j of a shard is tokens
 *   [j*T, j*T+T+1). Samples never cross shards.
 * - A source is the set of manifest lines with the same "source" name. Its lines are numbered
 *   in manifest order and so are its samples (all samples of its first line, then the
 *   second's, ...). Every line of a source carries the same "weight" and "repeat_cap".
 * - Mixing needs no RNG: global sample i comes from the active source with the smallest
 *   (consumed + skip + 1/2) / weight, ties to the source seen first in the manifest (the
 *   Sainte-Lague divisor rule, applied one sample at a time): after n samples each source has
 *   delivered its share of n to within half a sample with two sources, one with three, and
 *   about two with ten.
 * - Each source runs through epochs (passes). An epoch is a list of segments, each a run of
 *   the source's lines (segment ends are stored as line counts, `cuts`): an epoch starts with
 *   one segment holding every line known then; lines that arrive later are appended as new
 *   segments when the epoch reaches its end, so the order of samples already planned never
 *   changes. Each segment is visited in a seeded permutation (a keyed Feistel network with
 *   cycle walking: O(1) memory, any index in O(1)).
 * - A source with a repeat_cap of c stops after c passes (the last one partial when c is
 *   fractional): it is parked. A parked source that gets new lines (a growing dataset) joins
 *   the mix again, with `skip` raised so that it does not take every sample until it
 *   catches up.
 * - The state is per source {consumed, skip, epoch, position, cuts} plus the global count:
 *   a pure function of those and the manifest lines gives the rest of the order, so resume
 *   is exact. */
#define _GNU_SOURCE
#include "data/data_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STATE_FORMAT "loom-loader-state"
#define STATE_VERSION 1
#define FEISTEL_ROUNDS 6

typedef struct source {
    char *name;
    double weight;        /* > 0 */
    double cap;           /* passes allowed; 0 = no cap */
    int line;             /* the manifest line that introduced the source */
    uint64_t stream;      /* loom_hash_str(name): keys its permutations */
    int n_lines, lines_cap;
    int *entry;           /* (n_lines) dataset entry of each of its lines */
    uint64_t *first;      /* (n_lines + 1) source-local index of each line's first sample */
    /* state */
    uint64_t consumed;    /* samples delivered, all epochs */
    uint64_t skip;        /* mixing credit given when it (re)joined the mix */
    uint64_t epoch;       /* passes started before the current one */
    uint64_t position;    /* samples delivered in the current epoch */
    int n_cuts, cuts_cap;
    int *cuts;            /* (n_cuts) segment ends of the current epoch, in lines, ascending */
} source;

struct loom_loader {
    loom_dataset *d;
    loom_loader_opts o;
    int n_src, src_cap;
    source *src;          /* (n_src) in order of first appearance in the manifest */
    int n_seen;           /* manifest lines assigned to sources */
    uint64_t sample;      /* global samples delivered */
    uint64_t seg_tag;
    int32_t *buf;         /* (T+1) */
};

/* ---- sources and their epochs ------------------------------------------------------------ */

static uint64_t line_samples(uint64_t tokens, int T) {
    return tokens >= (uint64_t)T + 1 ? (tokens - 1) / (uint64_t)T : 0;
}

static uint64_t epoch_len(const source *s) {
    return s->n_cuts ? s->first[s->cuts[s->n_cuts - 1]] : 0;
}

/* how many samples of the current epoch the source may deliver: all of them, except in the
 * last pass that a fractional repeat_cap allows */
static uint64_t epoch_limit(const loom_loader *l, const source *s) {
    uint64_t len = epoch_len(s);
    if (l->o.ignore_caps || s->cap <= 0 || (double)(s->epoch + 1) <= s->cap) return len;
    double frac = s->cap - (double)s->epoch;
    return frac > 0 ? (uint64_t)floor(frac * (double)len) : 0;
}

static int is_active(const loom_loader *l, const source *s) {
    return s->position < epoch_limit(l, s);
}

static void push_cut(source *s, int c) {
    if (s->n_cuts == s->cuts_cap) {
        s->cuts_cap = s->cuts_cap ? 2 * s->cuts_cap : 4;
        s->cuts = loom_realloc(s->cuts, (size_t)s->cuts_cap * sizeof *s->cuts);
    }
    s->cuts[s->n_cuts++] = c;
}

/* Moves a source that reached the end of what its epoch allows: appends its lines not yet in
 * the epoch as a new segment, or starts the next epoch (all lines, one segment); leaves it
 * parked when neither is possible. Returns whether the source is active afterwards. */
static int settle(const loom_loader *l, source *s) {
    while (s->position >= epoch_limit(l, s)) {
        int last = s->n_cuts ? s->cuts[s->n_cuts - 1] : 0;
        if (s->first[s->n_lines] > s->first[last]) {
            push_cut(s, s->n_lines);
            continue;
        }
        const int more = l->o.ignore_caps || s->cap <= 0 || (double)(s->epoch + 1) < s->cap;
        if (s->n_cuts > 0 && s->position == epoch_len(s) && more) {
            s->epoch++;
            s->position = 0;
            s->n_cuts = 0;
            push_cut(s, s->n_lines);
            continue;
        }
        return 0;
    }
    return 1;
}

static double progress(const source *s) { return (double)(s->consumed + s->skip) / s->weight; }

/* A source (re)joining the mix: its progress is raised to the front of the active sources
 * (or of all sources when none is active), so it takes its share from now on instead of
 * catching up on the samples it missed. */
static void rejoin(loom_loader *l, source *s) {
    double v = 0;
    int any = 0;
    for (int pass = 0; pass < 2 && !any; pass++)
        for (int i = 0; i < l->n_src; i++) {
            const source *t = &l->src[i];
            if (t == s || (pass == 0 && !is_active(l, t))) continue;
            if (!any || progress(t) > v) v = progress(t);
            any = 1;
        }
    double target = floor(v * s->weight);
    if (target > 4e18) target = 4e18;
    if (target > (double)(s->consumed + s->skip)) s->skip = (uint64_t)target - s->consumed;
}

/* Parked sources that can continue (new lines, or new sources) join the mix. */
static void wake(loom_loader *l) {
    for (int i = 0; i < l->n_src; i++) {
        source *s = &l->src[i];
        if (!is_active(l, s) && settle(l, s)) rejoin(l, s);
    }
}

static source *find_source(loom_loader *l, const char *name) {
    for (int i = 0; i < l->n_src; i++)
        if (!strcmp(l->src[i].name, name)) return &l->src[i];
    return NULL;
}

/* Assigns the dataset's manifest lines [n_seen, upto) to their sources. */
static void absorb(loom_loader *l, int upto) {
    for (; l->n_seen < upto; l->n_seen++) {
        loom_manifest_entry e = loom_dataset_entry(l->d, l->n_seen);
        source *s = find_source(l, e.source);
        if (!s) {
            if (l->n_src == l->src_cap) {
                l->src_cap = l->src_cap ? 2 * l->src_cap : 4;
                l->src = loom_realloc(l->src, (size_t)l->src_cap * sizeof *l->src);
            }
            s = &l->src[l->n_src++];
            memset(s, 0, sizeof *s);
            s->name = loom_strdup(e.source);
            s->weight = e.weight;
            s->cap = e.repeat_cap;
            s->line = e.line;
            s->stream = loom_hash_str(e.source);
            s->first = loom_malloc(sizeof *s->first);
            s->first[0] = 0;
        } else {
            /* loom_dataset_refresh refuses a manifest whose lines of a source disagree */
            LOOM_CHECK(e.weight == s->weight && e.repeat_cap == s->cap);
        }
        if (s->n_lines == s->lines_cap) {
            s->lines_cap = s->lines_cap ? 2 * s->lines_cap : 8;
            s->entry = loom_realloc(s->entry, (size_t)s->lines_cap * sizeof *s->entry);
            s->first = loom_realloc(s->first, (size_t)(s->lines_cap + 1) * sizeof *s->first);
        }
        s->entry[s->n_lines] = l->n_seen;
        s->first[s->n_lines + 1] = s->first[s->n_lines] + line_samples(e.tokens, l->o.T);
        s->n_lines++;
    }
}

int loom_loader_refresh(loom_loader *l, int lines, int *n_lines, loom_err *err) {
    int added = 0;
    if (loom_dataset_refresh(l->d, &added, err)) return -1;
    int have = loom_dataset_num_shards(l->d);
    int upto = lines > 0 ? lines : have;
    if (upto > have)
        return loom_errf(err, "%s/manifest.jsonl: %d lines asked for, it holds %d",
                         loom_dataset_dir(l->d), upto, have);
    if (upto > l->n_seen) {
        absorb(l, upto);
        wake(l);
    }
    if (n_lines) *n_lines = l->n_seen;
    return 0;
}

/* ---- create / free ----------------------------------------------------------------------- */

int loom_loader_open(loom_dataset *d, const loom_loader_opts *o, loom_loader **out,
                     loom_err *err) {
    *out = NULL;
    if (o->T < 1) return loom_errf(err, "loader: sequence length T=%d must be positive", o->T);
    int have = loom_dataset_num_shards(d);
    if (o->lines < 0 || o->lines > have)
        return loom_errf(err, "%s/manifest.jsonl: %d lines asked for, it holds %d",
                         loom_dataset_dir(d), o->lines, have);
    loom_loader *l = loom_calloc(1, sizeof *l);
    l->d = d;
    l->o = *o;
    l->seg_tag = loom_hash_str("loom.loader.segment");
    absorb(l, o->lines > 0 ? o->lines : have);
    if (loom_loader_num_samples(l) == 0) {
        loom_errf(err, "%s: no complete sample of %d tokens (T+1) in any of its %d shard(s)",
                  loom_dataset_dir(d), o->T + 1, l->n_seen);
        goto fail;
    }
    l->buf = loom_malloc((size_t)(o->T + 1) * sizeof *l->buf);
    wake(l);
    *out = l;
    return 0;
fail:
    loom_loader_free(l);
    return -1;
}

int loom_loader_create(loom_dataset *d, int T, uint64_t seed, int shuffle, loom_loader **out,
                       loom_err *err) {
    loom_loader_opts o = {.T = T, .seed = seed, .shuffle = shuffle != 0};
    return loom_loader_open(d, &o, out, err);
}

void loom_loader_free(loom_loader *l) {
    if (!l) return;
    for (int i = 0; i < l->n_src; i++) {
        free(l->src[i].name);
        free(l->src[i].entry);
        free(l->src[i].first);
        free(l->src[i].cuts);
    }
    free(l->src);
    free(l->buf);
    free(l);
}

uint64_t loom_loader_num_samples(const loom_loader *l) {
    uint64_t n = 0;
    for (int i = 0; i < l->n_src; i++) n += l->src[i].first[l->src[i].n_lines];
    return n;
}

uint64_t loom_loader_position(const loom_loader *l) { return l->sample; }
int loom_loader_num_sources(const loom_loader *l) { return l->n_src; }

const char *loom_loader_source(const loom_loader *l, int i, uint64_t *consumed,
                               uint64_t *epoch) {
    LOOM_CHECK(i >= 0 && i < l->n_src);
    if (consumed) *consumed = l->src[i].consumed;
    if (epoch) *epoch = l->src[i].epoch;
    return l->src[i].name;
}

/* ---- the order --------------------------------------------------------------------------- */

/* One pass of a balanced Feistel network on 2h-bit values, keyed by `key`. */
static uint64_t feistel(uint64_t x, int h, uint64_t key) {
    const uint64_t mask = (UINT64_C(1) << h) - 1;
    uint64_t L = x >> h, R = x & mask;
    for (uint64_t r = 0; r < FEISTEL_ROUNDS; r++) {
        uint64_t t = L ^ (loom_rng_u64(key, r, R) & mask);
        L = R;
        R = t;
    }
    return (L << h) | R;
}

/* A permutation of [0, n) keyed by `key`: the Feistel network on the smallest even bit width
 * holding n-1, walked along its cycle until the value lands in range (fewer than 4 steps
 * on average, since the domain is < 4n). */
static uint64_t permute(uint64_t q, uint64_t n, uint64_t key) {
    if (n <= 1) return q;
    int bits = 64 - __builtin_clzll(n - 1);
    int h = (bits + 1) / 2;
    uint64_t x = q;
    do x = feistel(x, h, key);
    while (x >= n);
    return x;
}

static source *pick(const loom_loader *l) {
    source *best = NULL;
    double best_key = 0;
    for (int i = 0; i < l->n_src; i++) {
        source *s = &l->src[i];
        if (!is_active(l, s)) continue;
        double key = ((double)(s->consumed + s->skip) + 0.5) / s->weight;
        if (!best || key < best_key) {
            best = s;
            best_key = key;
        }
    }
    return best;
}

/* The document of each of the n tokens from `start` of shard sh (its doc-index entries),
 * numbered from 0 at the first one: docs (n). */
static void doc_ids(const loom_shard *sh, uint64_t start, size_t n, int32_t *docs) {
    const uint64_t nd = loom_shard_num_docs(sh);
    uint64_t a = 0, b = nd - 1; /* the last entry starting at or before `start` */
    while (a < b) {
        const uint64_t mid = a + (b - a + 1) / 2;
        if (loom_shard_doc_start(sh, mid) <= start) a = mid;
        else b = mid - 1;
    }
    int32_t id = 0;
    uint64_t next = a + 1 < nd ? loom_shard_doc_start(sh, a + 1) : UINT64_MAX;
    for (size_t t = 0; t < n; t++) {
        while (start + t >= next) { /* a document starts here */
            id++;
            a++;
            next = a + 1 < nd ? loom_shard_doc_start(sh, a + 1) : UINT64_MAX;
        }
        docs[t] = id;
    }
}

/* Copies sample idx of source s (source-local numbering: its lines in manifest order) into
 * inputs/targets (T each), and when docs is not NULL the inputs' document ids (T). */
static void read_sample(loom_loader *l, const source *s, uint64_t idx, int32_t *inputs,
                        int32_t *targets, int32_t *docs) {
    int a = 0, b = s->n_lines - 1; /* the last line with first[a] <= idx */
    while (a < b) {
        int mid = a + (b - a + 1) / 2;
        if (s->first[mid] <= idx) a = mid;
        else b = mid - 1;
    }
    const size_t T = (size_t)l->o.T;
    const loom_shard *sh = loom_dataset_shard(l->d, s->entry[a]);
    const uint64_t start = (idx - s->first[a]) * (uint64_t)T;
    loom_shard_read_tokens(sh, start, (uint64_t)T + 1, l->buf);
    memcpy(inputs, l->buf, T * sizeof *inputs);
    memcpy(targets, l->buf + 1, T * sizeof *targets);
    /* a shard with a loss mask (chat data): only masked tokens are targets */
    loom_shard_apply_mask(sh, start + 1, (uint64_t)T, targets);
    if (docs) doc_ids(sh, start, T, docs);
}

/* Delivers the source's next sample: copied into inputs/targets (T each) unless they are
 * NULL (a sample another DP rank reads). */
static void take(loom_loader *l, source *s, int32_t *inputs, int32_t *targets, int32_t *docs) {
    if (inputs) {
        const uint64_t p = s->position;
        int j = 0; /* the segment holding position p */
        while (s->first[s->cuts[j]] <= p) j++;
        const uint64_t lo = j ? s->first[s->cuts[j - 1]] : 0, n = s->first[s->cuts[j]] - lo;
        uint64_t q = p - lo;
        if (l->o.shuffle)
            q = permute(q, n, loom_rng_u64(loom_rng_u64(l->o.seed, s->stream, s->epoch),
                                           l->seg_tag, (uint64_t)j));
        read_sample(l, s, lo + q, inputs, targets, docs);
    }
    s->position++;
    s->consumed++;
    l->sample++;
    if (s->position >= epoch_limit(l, s)) settle(l, s);
}

static int exhausted(const loom_loader *l, loom_err *err) {
    char what[512];
    size_t n = 0;
    what[0] = 0;
    for (int i = 0; i < l->n_src && n < sizeof what - 64; i++) {
        int w = snprintf(what + n, sizeof what - n, "%s%s\"%s\" %llu samples in %g passes",
                         i ? ", " : "", i >= 6 ? "... " : "", l->src[i].name,
                         (unsigned long long)l->src[i].consumed, l->src[i].cap);
        if (w < 0 || (size_t)w >= sizeof what - n || i >= 6) break;
        n += (size_t)w;
    }
    return loom_errf(err,
                     "%s: all sources exhausted at sample %llu: every source reached its "
                     "repeat_cap (%s)",
                     loom_dataset_dir(l->d), (unsigned long long)l->sample, what);
}

int loom_loader_next_slice(loom_loader *l, int B, int dp_rank, int dp_size, int32_t *inputs,
                           int32_t *targets, loom_err *err) {
    return loom_loader_next_docs(l, B, dp_rank, dp_size, inputs, targets, NULL, err);
}

int loom_loader_next_docs(loom_loader *l, int B, int dp_rank, int dp_size, int32_t *inputs,
                          int32_t *targets, int32_t *docs, loom_err *err) {
    LOOM_CHECK(B >= 1 && dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size);
    if (l->o.follow && loom_loader_refresh(l, 0, NULL, err)) return -1;
    const int64_t lo = (int64_t)B * dp_rank / dp_size, hi = (int64_t)B * (dp_rank + 1) / dp_size;
    const size_t T = (size_t)l->o.T;
    for (int64_t b = 0; b < B; b++) {
        source *s = pick(l);
        if (!s && l->o.follow) {
            if (loom_loader_refresh(l, 0, NULL, err)) return -1;
            s = pick(l);
        }
        if (!s) return exhausted(l, err);
        const int mine = b >= lo && b < hi;
        take(l, s, mine ? inputs + (size_t)(b - lo) * T : NULL,
             mine ? targets + (size_t)(b - lo) * T : NULL,
             mine && docs ? docs + (size_t)(b - lo) * T : NULL);
    }
    return 0;
}

int loom_loader_next(loom_loader *l, int B, int32_t *inputs, int32_t *targets, loom_err *err) {
    return loom_loader_next_slice(l, B, 0, 1, inputs, targets, err);
}

/* ---- one pass in a fixed order (evaluation) ---------------------------------------------- */

uint64_t loom_loader_pass_batches(const loom_loader *l, int B) {
    LOOM_CHECK(B >= 1);
    const uint64_t n = loom_loader_num_samples(l);
    return (n + (uint64_t)B - 1) / (uint64_t)B;
}

int loom_loader_pass_slice(loom_loader *l, uint64_t batch, int B, int dp_rank, int dp_size,
                           int32_t *inputs, int32_t *targets) {
    return loom_loader_pass_slice_docs(l, batch, B, dp_rank, dp_size, inputs, targets, NULL);
}

int loom_loader_pass_slice_docs(loom_loader *l, uint64_t batch, int B, int dp_rank,
                                int dp_size, int32_t *inputs, int32_t *targets, int32_t *docs) {
    LOOM_CHECK(B >= 1 && dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size);
    const uint64_t total = loom_loader_num_samples(l);
    const uint64_t lo = (uint64_t)B * (uint64_t)dp_rank / (uint64_t)dp_size;
    const uint64_t hi = (uint64_t)B * (uint64_t)(dp_rank + 1) / (uint64_t)dp_size;
    const uint64_t start = batch * (uint64_t)B; /* the global batch's first sample */
    LOOM_CHECK(batch < loom_loader_pass_batches(l, B));
    const size_t T = (size_t)l->o.T;
    /* the source and source-local index of sample start + lo */
    uint64_t k = start + lo;
    int i = 0;
    while (i < l->n_src && k >= l->src[i].first[l->src[i].n_lines]) {
        k -= l->src[i].first[l->src[i].n_lines];
        i++;
    }
    int real = 0;
    for (uint64_t r = lo; r < hi; r++) {
        int32_t *in = inputs + (size_t)(r - lo) * T, *tg = targets + (size_t)(r - lo) * T;
        int32_t *dc = docs ? docs + (size_t)(r - lo) * T : NULL;
        if (start + r >= total) { /* past the end of the pass: a row the loss ignores */
            memset(in, 0, T * sizeof *in);
            for (size_t t = 0; t < T; t++) tg[t] = -1;
            if (dc) memset(dc, 0, T * sizeof *dc);
            continue;
        }
        while (k >= l->src[i].first[l->src[i].n_lines]) { /* sources without samples too */
            k -= l->src[i].first[l->src[i].n_lines];
            i++;
        }
        read_sample(l, &l->src[i], k, in, tg, dc);
        k++;
        real++;
    }
    return real;
}

/* ---- state ------------------------------------------------------------------------------- */

char *loom_loader_state_json(const loom_loader *l) {
    json_t *srcs = json_array();
    for (int i = 0; i < l->n_src; i++) {
        const source *s = &l->src[i];
        json_t *cuts = json_array();
        for (int c = 0; c < s->n_cuts; c++) json_array_append_new(cuts, json_integer(s->cuts[c]));
        json_t *js = json_pack("{s:s, s:I, s:I, s:I, s:I, s:o}", "name", s->name, "consumed",
                               (json_int_t)s->consumed, "skip", (json_int_t)s->skip, "epoch",
                               (json_int_t)s->epoch, "position", (json_int_t)s->position,
                               "segments", cuts);
        LOOM_CHECK(js != NULL);
        json_array_append_new(srcs, js);
    }
    json_t *o = json_pack("{s:s, s:i, s:i, s:I, s:b, s:I, s:o}", "format", STATE_FORMAT,
                          "version", STATE_VERSION, "seq_len", l->o.T, "seed",
                          (json_int_t)l->o.seed, "shuffle", l->o.shuffle != 0, "samples",
                          (json_int_t)l->sample, "sources", srcs);
    LOOM_CHECK(o != NULL);
    char *text = json_dumps(o, JSON_COMPACT);
    LOOM_CHECK(text != NULL);
    json_decref(o);
    return text;
}

static int get_u64(json_t *obj, const char *key, uint64_t *out, const char *where,
                   loom_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return loom_errf(err, "loader state%s: \"%s\" missing or not a non-negative integer",
                         where, key);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* the state of one source as read, before it is applied */
typedef struct saved {
    int given;
    uint64_t consumed, skip, epoch, position;
    int n_cuts;
    int *cuts;
} saved;

/* Reads and checks the state of one source against the loader's view of it. */
static int read_source(const loom_loader *l, json_t *js, int k, saved *sv, int *idx,
                       loom_err *err) {
    char where[320];
    snprintf(where, sizeof where, " sources[%d]", k);
    json_t *jn = json_object_get(js, "name");
    if (!json_is_object(js) || !json_is_string(jn))
        return loom_errf(err, "loader state%s: not an object with a string \"name\"", where);
    const char *name = json_string_value(jn);
    snprintf(where, sizeof where, " source \"%.200s\"", name);
    int i = 0;
    while (i < l->n_src && strcmp(l->src[i].name, name)) i++;
    if (i == l->n_src)
        return loom_errf(err, "loader state%s: %s/manifest.jsonl has no line of this source "
                              "(was the dataset replaced?)", where, loom_dataset_dir(l->d));
    if (sv[i].given) return loom_errf(err, "loader state%s: listed twice", where);
    saved *v = &sv[i];
    if (get_u64(js, "consumed", &v->consumed, where, err) ||
        get_u64(js, "skip", &v->skip, where, err) ||
        get_u64(js, "epoch", &v->epoch, where, err) ||
        get_u64(js, "position", &v->position, where, err))
        return -1;
    json_t *jc = json_object_get(js, "segments");
    if (!json_is_array(jc)) return loom_errf(err, "loader state%s: \"segments\" must be an array", where);
    const source *s = &l->src[i];
    v->n_cuts = (int)json_array_size(jc);
    v->cuts = loom_malloc(((size_t)v->n_cuts + 1) * sizeof *v->cuts);
    v->given = 1;
    for (int c = 0; c < v->n_cuts; c++) {
        json_t *x = json_array_get(jc, (size_t)c);
        json_int_t prev = c ? v->cuts[c - 1] : 0;
        if (!json_is_integer(x) || json_integer_value(x) <= prev)
            return loom_errf(err, "loader state%s: segments[%d] is not a line count above the "
                                  "previous one", where, c);
        if (json_integer_value(x) > s->n_lines)
            return loom_errf(err, "loader state%s: its data order covers %lld manifest lines of "
                                  "the source, %s/manifest.jsonl has only %d (was the dataset "
                                  "replaced?)", where, (long long)json_integer_value(x),
                             loom_dataset_dir(l->d), s->n_lines);
        v->cuts[c] = (int)json_integer_value(x);
    }
    if (!l->o.ignore_caps && s->cap > 0 && (double)v->epoch >= s->cap)
        return loom_errf(err, "loader state%s: epoch %llu is past the repeat_cap %g", where,
                         (unsigned long long)v->epoch, s->cap);
    /* the position must lie inside what its epoch allows */
    source tmp = *s;
    tmp.epoch = v->epoch;
    tmp.position = v->position;
    tmp.n_cuts = v->n_cuts;
    tmp.cuts = v->cuts;
    if (v->position > epoch_limit(l, &tmp) || v->consumed < v->position ||
        v->consumed > (UINT64_C(1) << 62) || v->skip > (UINT64_C(1) << 62))
        return loom_errf(err, "loader state%s: position %llu (consumed %llu) is out of range for "
                              "epoch %llu of %llu samples", where,
                         (unsigned long long)v->position, (unsigned long long)v->consumed,
                         (unsigned long long)v->epoch, (unsigned long long)epoch_len(&tmp));
    *idx = i;
    return 0;
}

int loom_loader_restore_json(loom_loader *l, const char *text, loom_err *err) {
    json_error_t je;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!o) return loom_errf(err, "loader state: invalid JSON (line %d): %s", je.line, je.text);
    saved *sv = loom_calloc((size_t)l->n_src + 1, sizeof *sv);
    int rc = -1;
    json_t *fmt = json_object_get(o, "format"), *jsh = json_object_get(o, "shuffle");
    json_t *srcs = json_object_get(o, "sources"), *jseed = json_object_get(o, "seed");
    uint64_t version = 0, T = 0, samples = 0, total = 0;
    if (!json_is_object(o) || !json_is_string(fmt) || strcmp(json_string_value(fmt), STATE_FORMAT)) {
        loom_errf(err, "loader state: not a \"%s\" object (a checkpoint from an older loader, "
                       "whose order cannot be continued exactly?)", STATE_FORMAT);
        goto done;
    }
    if (get_u64(o, "version", &version, "", err) || get_u64(o, "seq_len", &T, "", err) ||
        get_u64(o, "samples", &samples, "", err))
        goto done;
    if (version != STATE_VERSION) {
        loom_errf(err, "loader state: version %llu, this loader reads version %d",
                  (unsigned long long)version, STATE_VERSION);
        goto done;
    }
    if (!json_is_integer(jseed) || !json_is_boolean(jsh) || !json_is_array(srcs)) {
        loom_errf(err, "loader state: \"seed\" (integer), \"shuffle\" (boolean) and \"sources\" "
                       "(array) are required");
        goto done;
    }
    if (T != (uint64_t)l->o.T || (uint64_t)json_integer_value(jseed) != l->o.seed ||
        json_is_true(jsh) != (l->o.shuffle != 0)) {
        loom_errf(err, "loader state: saved with seq_len %llu, seed %lld, shuffle %s; this run "
                       "has seq_len %d, seed %lld, shuffle %s: the data order would differ",
                  (unsigned long long)T, (long long)json_integer_value(jseed),
                  json_is_true(jsh) ? "true" : "false", l->o.T, (long long)l->o.seed,
                  l->o.shuffle ? "true" : "false");
        goto done;
    }
    for (size_t k = 0; k < json_array_size(srcs); k++) {
        int i = 0;
        if (read_source(l, json_array_get(srcs, k), (int)k, sv, &i, err)) goto done;
        total += sv[i].consumed;
    }
    if (total != samples) {
        loom_errf(err, "loader state: \"samples\" is %llu but the sources' \"consumed\" add up "
                       "to %llu", (unsigned long long)samples, (unsigned long long)total);
        goto done;
    }
    /* apply: sources the state does not name are new ones (a grown dataset) */
    for (int i = 0; i < l->n_src; i++) {
        source *s = &l->src[i];
        s->consumed = sv[i].consumed;
        s->skip = sv[i].skip;
        s->epoch = sv[i].epoch;
        s->position = sv[i].position;
        s->n_cuts = 0;
        for (int c = 0; c < sv[i].n_cuts; c++) push_cut(s, sv[i].cuts[c]);
    }
    l->sample = samples;
    wake(l);
    rc = 0;
done:
    for (int i = 0; i < l->n_src; i++) free(sv[i].cuts);
    free(sv);
    json_decref(o);
    return rc;
}
