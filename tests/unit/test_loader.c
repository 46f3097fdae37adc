/* The loader: sample definition, every sample once per epoch, seeded shuffles, weighted
 * mixing, repeat caps, exact resume at 30 points, the same global order at DP 1/2/3, growing
 * datasets (follow), and errors on bad states and manifests.
 *
 * Datasets are built here with loom_shard_write and hand-written manifest lines. Token value
 * = a globally unique index, so a sample is identified by its first token. */
#include "testutil.h"

#include <math.h>

#include "loom/data.h"

enum { T = 16 }; /* sequence length */
#define MAXS 64

/* ---- dataset builder --------------------------------------------------------------------- */

typedef struct shard_info {
    char source[32];
    uint64_t base, n; /* token values [base, base+n) */
} shard_info;

typedef struct ds {
    char dir[256];
    int n;
    shard_info sh[MAXS];
    uint64_t next_base;
} ds;

static void ds_init(ds *d) {
    memset(d, 0, sizeof *d);
    assert_int_equal(tu_mkdtemp(d->dir, sizeof d->dir), 0);
    d->next_base = 1000;
}

static void ds_rm(ds *d) { assert_int_equal(tu_rmtree(d->dir), 0); }

/* Writes shard `name` of n tokens; returns its sha256 in sha. */
static void write_shard(ds *d, const char *name, uint64_t base, uint64_t n, char sha[65]) {
    loom_err err = {{0}};
    uint32_t *tok = malloc((n ? n : 1) * sizeof *tok);
    for (uint64_t i = 0; i < n; i++) tok[i] = (uint32_t)(base + i);
    uint64_t docs[1] = {0};
    loom_shard_spec spec = {1u << 30, 4, "test", NULL};
    char sp[512];
    snprintf(sp, sizeof sp, "%s/%s", d->dir, name);
    if (loom_shard_write(sp, &spec, tok, n, docs, n ? 1 : 0, &err) ||
        loom_sha256_file(sp, sha, &err))
        fail_msg("%s", err.msg);
    free(tok);
}

/* A shard of n tokens for `source` plus its manifest line (weight/cap < 0: key left out). */
static void add(ds *d, const char *source, double weight, double cap, uint64_t n) {
    assert_true(d->n < MAXS);
    shard_info *s = &d->sh[d->n];
    snprintf(s->source, sizeof s->source, "%s", source);
    s->base = d->next_base;
    s->n = n;
    d->next_base += n + 1000;
    char name[64], sha[65], line[512], extra[128] = "";
    snprintf(name, sizeof name, "shard_%05d.bin", d->n);
    write_shard(d, name, s->base, n, sha);
    size_t k = 0;
    if (weight >= 0) k += (size_t)snprintf(extra + k, sizeof extra - k, ",\"weight\":%g", weight);
    if (cap >= 0) snprintf(extra + k, sizeof extra - k, ",\"repeat_cap\":%g", cap);
    snprintf(line, sizeof line,
             "{\"shard\":\"%s\",\"sha256\":\"%s\",\"tokens\":%llu,\"docs\":%d,\"source\":\"%s\"%s}",
             name, sha, (unsigned long long)n, n ? 1 : 0, source, extra);
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", d->dir);
    loom_err err = {{0}};
    if (loom_append_line(mpath, line, &err)) fail_msg("%s", err.msg);
    d->n++;
}

static loom_dataset *ds_open(const ds *d) {
    loom_dataset *x = NULL;
    loom_err err = {{0}};
    if (loom_dataset_open(d->dir, &x, &err)) fail_msg("%s", err.msg);
    return x;
}

static uint64_t shard_samples(uint64_t n) { return n >= T + 1 ? (n - 1) / T : 0; }

/* the shard and sample index of a sample's first token; fails on a token that is no sample */
static int locate(const ds *d, int32_t first, uint64_t *j) {
    for (int s = 0; s < d->n; s++)
        if ((uint64_t)first >= d->sh[s].base && (uint64_t)first < d->sh[s].base + d->sh[s].n) {
            uint64_t off = (uint64_t)first - d->sh[s].base;
            assert_int_equal(off % T, 0);
            assert_true(off / T < shard_samples(d->sh[s].n));
            if (j) *j = off / T;
            return s;
        }
    fail_msg("token %d is in no listed shard", first);
    return -1;
}

/* checks one sample's tokens and returns its id (first token) */
static int32_t check_sample(const ds *d, const int32_t *in, const int32_t *tg) {
    locate(d, in[0], NULL);
    for (int t = 0; t < T; t++) {
        assert_int_equal(in[t], in[0] + t);     /* consecutive tokens of one shard */
        assert_int_equal(tg[t], in[0] + t + 1); /* targets shifted by one */
    }
    return in[0];
}

/* draws n samples in batches of B (the last batch may be shorter), ids into out */
static void draw(const ds *d, loom_loader *l, int n, int B, int32_t *out) {
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    loom_err err = {{0}};
    for (int i = 0; i < n; i += B) {
        int b = n - i < B ? n - i : B;
        if (loom_loader_next(l, b, in, tg, &err)) fail_msg("%s", err.msg);
        for (int k = 0; k < b; k++) out[i + k] = check_sample(d, in + k * T, tg + k * T);
    }
    free(in);
    free(tg);
}

static loom_loader *mk(loom_dataset *x, uint64_t seed, int shuffle, int follow) {
    loom_loader *l = NULL;
    loom_err err = {{0}};
    loom_loader_opts o = {.T = T, .seed = seed, .shuffle = shuffle, .follow = follow};
    if (loom_loader_open(x, &o, &l, &err)) fail_msg("%s", err.msg);
    return l;
}

/* ---- single source: definition, epochs, shuffles ---------------------------------------- */

/* shard sizes: samples per shard = (n-1)/T when n >= T+1: 62, 0, 2, 0, 32 -> 96 */
static const uint64_t SIZES[] = {1000, 10, 37, 16, 517};
#define N_SAMPLES 96

static void one_source(ds *d) {
    ds_init(d);
    for (int s = 0; s < 5; s++) add(d, "", -1, -1, SIZES[s]); /* no source, weight or cap keys */
}

static void test_sequential_order(void **state) {
    (void)state;
    ds d;
    one_source(&d);
    loom_dataset *x = ds_open(&d);
    loom_loader *l = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_loader_create(x, T, 1, 0, &l, &err), 0);
    assert_int_equal(loom_loader_num_samples(l), N_SAMPLES);
    /* unshuffled: manifest order, wrapping into the next epoch */
    int32_t ids[300];
    draw(&d, l, 300, 5, ids);
    int32_t expect[N_SAMPLES];
    int k = 0;
    for (int s = 0; s < 5; s++)
        for (uint64_t j = 0; j < shard_samples(SIZES[s]); j++)
            expect[k++] = (int32_t)(d.sh[s].base + j * T);
    assert_int_equal(k, N_SAMPLES);
    for (int i = 0; i < 300; i++) assert_int_equal(ids[i], expect[i % N_SAMPLES]);
    assert_int_equal(loom_loader_position(l), 300);
    uint64_t consumed, epoch;
    loom_loader_source(l, 0, &consumed, &epoch);
    assert_int_equal(consumed, 300);
    assert_int_equal(epoch, 300 / N_SAMPLES);
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);
}

/* every sample exactly once per epoch; epochs and seeds give different orders */
static void test_every_sample_once_per_epoch(void **state) {
    (void)state;
    ds d;
    one_source(&d);
    loom_dataset *x = ds_open(&d);
    loom_loader *l = mk(x, 1234, 1, 0);
    int32_t ids[4 * N_SAMPLES];
    draw(&d, l, 4 * N_SAMPLES, 7, ids);
    for (int e = 0; e < 4; e++) {
        int32_t *ep = ids + e * N_SAMPLES;
        for (int i = 0; i < N_SAMPLES; i++)
            for (int k = i + 1; k < N_SAMPLES; k++) assert_int_not_equal(ep[i], ep[k]);
    }
    assert_memory_not_equal(ids, ids + N_SAMPLES, N_SAMPLES * sizeof *ids);
    int sorted = 1; /* a shuffle is not the manifest order */
    for (int i = 1; i < N_SAMPLES; i++) sorted &= ids[i] > ids[i - 1];
    assert_false(sorted);
    loom_loader_free(l);
    int32_t a[N_SAMPLES], b[N_SAMPLES];
    l = mk(x, 1234, 1, 0);
    draw(&d, l, N_SAMPLES, 3, a);
    loom_loader_free(l);
    assert_memory_equal(a, ids, sizeof a); /* same seed, other batch size: same order */
    l = mk(x, 1235, 1, 0);
    draw(&d, l, N_SAMPLES, 3, b);
    loom_loader_free(l);
    assert_memory_not_equal(a, b, sizeof a);
    loom_dataset_close(x);
    ds_rm(&d);
}

/* ---- mixing ---------------------------------------------------------------------------- */

static int source_of(const ds *d, int32_t id) { return (int)d->sh[locate(d, id, NULL)].source[0]; }

static void test_mixing_proportions(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    /* weights 5 : 3 : 2, sources of different sizes (they cycle through many epochs) */
    add(&d, "a", 5, -1, 16 * 40 + 1);
    add(&d, "b", 3, 0, 16 * 7 + 1);
    add(&d, "a", 5, -1, 16 * 3 + 1);
    add(&d, "c", 2, 0, 16 * 13 + 1);
    loom_dataset *x = ds_open(&d);
    loom_loader *l = mk(x, 7, 1, 0);
    assert_int_equal(loom_loader_num_sources(l), 3);
    assert_string_equal(loom_loader_source(l, 1, NULL, NULL), "b");
    enum { N = 10000 };
    int32_t *ids = malloc(N * sizeof *ids);
    draw(&d, l, N, 64, ids);
    const double w[3] = {0.5, 0.3, 0.2};
    double cnt[3] = {0, 0, 0};
    for (int i = 0; i < N; i++) {
        cnt[source_of(&d, ids[i]) - 'a'] += 1;
        /* every prefix is within one sample of the weights */
        for (int s = 0; s < 3; s++) assert_true(fabs(cnt[s] - w[s] * (i + 1)) <= 1.0 + 1e-9);
    }
    for (int s = 0; s < 3; s++) {
        assert_true(fabs(cnt[s] / N - w[s]) < 0.01);
        uint64_t consumed;
        loom_loader_source(l, s, &consumed, NULL);
        assert_int_equal(consumed, (uint64_t)cnt[s]);
    }
    /* within a source, each epoch is a permutation of its samples */
    int32_t *b = malloc(N * sizeof *b);
    int nb = 0;
    for (int i = 0; i < N; i++)
        if (source_of(&d, ids[i]) == 'b') b[nb++] = ids[i];
    for (int e = 0; (e + 1) * 7 <= nb; e++)
        for (int i = 0; i < 7; i++)
            for (int k = i + 1; k < 7; k++) assert_int_not_equal(b[e * 7 + i], b[e * 7 + k]);
    free(b);
    free(ids);
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);
}

/* repeat caps: a source stops after its passes (a fractional cap: part of the last pass);
 * when every source has stopped, next() fails saying so */
static void test_repeat_cap(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    add(&d, "a", 1, 1, 16 * 10 + 1);  /* 10 samples, one pass */
    add(&d, "b", 1, 2.5, 16 * 8 + 1); /* 8 samples, 2.5 passes = 20 */
    loom_dataset *x = ds_open(&d);
    loom_loader *l = mk(x, 3, 1, 0);
    int32_t ids[30];
    draw(&d, l, 30, 4, ids);
    int ca[10] = {0}, cb[8] = {0};
    for (int i = 0; i < 30; i++) {
        uint64_t j;
        int s = locate(&d, ids[i], &j);
        if (s == 0) ca[j]++;
        else cb[j]++;
    }
    int halves = 0;
    for (int j = 0; j < 10; j++) assert_int_equal(ca[j], 1);
    for (int j = 0; j < 8; j++) {
        assert_true(cb[j] == 2 || cb[j] == 3);
        halves += cb[j] == 3;
    }
    assert_int_equal(halves, 4);
    int32_t in[2 * T], tg[2 * T];
    loom_err err = {{0}};
    assert_int_equal(loom_loader_next(l, 1, in, tg, &err), -1);
    TU_ASSERT_HAS(err.msg, "all sources exhausted at sample 30");
    /* the state says the same after a round trip */
    char *js = loom_loader_state_json(l);
    loom_loader *l2 = mk(x, 3, 1, 0);
    if (loom_loader_restore_json(l2, js, &err)) fail_msg("%s", err.msg);
    assert_int_equal(loom_loader_next(l2, 1, in, tg, &err), -1);
    free(js);
    loom_loader_free(l2);
    loom_loader_free(l);
    /* evaluation ignores caps */
    loom_loader_opts o = {.T = T, .seed = 3, .ignore_caps = 1};
    assert_int_equal(loom_loader_open(x, &o, &l, &err), 0);
    int32_t many[100];
    draw(&d, l, 100, 9, many);
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);
}

/* ---- resume --------------------------------------------------------------------------- */

/* A reference run of N samples one at a time with its state before every sample; resumes at
 * 30 points (random ones, shard boundaries, epoch boundaries) on a freshly opened dataset
 * must continue with exactly the same samples, whatever the batch size. */
static void resume_check(ds *d, uint64_t seed, int shuffle) {
    enum { N = 700 };
    loom_dataset *x = ds_open(d);
    loom_loader *ref = mk(x, seed, shuffle, 0);
    int32_t *ids = malloc(N * sizeof *ids);
    char **st = calloc(N + 1, sizeof *st);
    int32_t in[T], tg[T];
    loom_err err = {{0}};
    int n = 0;
    for (; n < N; n++) {
        st[n] = loom_loader_state_json(ref);
        if (loom_loader_next(ref, 1, in, tg, &err)) break; /* caps reached */
        ids[n] = check_sample(d, in, tg);
    }
    st[n] = loom_loader_state_json(ref);
    loom_loader_free(ref);
    loom_dataset_close(x);
    assert_true(n > 200);
    /* the stop points: epoch and shard boundaries first, then random ones */
    int pts[30], np = 1;
    pts[0] = 0;
    int nsrc = 0;
    char names[8][32];
    uint64_t seen_epoch[8] = {0}, count[8] = {0};
    for (int i = 0; i < n && np < 12; i++) {
        uint64_t j;
        int s = locate(d, ids[i], &j);
        int k = 0;
        while (k < nsrc && strcmp(names[k], d->sh[s].source)) k++;
        if (k == nsrc) snprintf(names[nsrc++], 32, "%s", d->sh[s].source);
        uint64_t total = 0;
        for (int q = 0; q < d->n; q++)
            if (!strcmp(d->sh[q].source, d->sh[s].source)) total += shard_samples(d->sh[q].n);
        count[k]++;
        if (count[k] / total != seen_epoch[k] && count[k] % total == 0) {
            seen_epoch[k] = count[k] / total;
            pts[np++] = i + 1; /* right after the last sample of an epoch */
        } else if (!shuffle && j + 1 == shard_samples(d->sh[s].n) && np < 8) {
            pts[np++] = i + 1; /* right after the last sample of a shard */
        }
    }
    assert_true(np >= 3);
    uint64_t r = seed * 2654435761u + 1;
    while (np < 30) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        pts[np++] = (int)((r >> 33) % (uint64_t)n);
    }
    for (int p = 0; p < 30; p++) {
        int at = pts[p], B = 1 + p % 7;
        loom_dataset *y = ds_open(d); /* as after a restart */
        loom_loader *l = mk(y, seed, shuffle, 0);
        int32_t junk[3];
        draw(d, l, 3, 2, junk); /* a used loader: restore must replace everything */
        if (loom_loader_restore_json(l, st[at], &err)) fail_msg("point %d: %s", at, err.msg);
        char *again = loom_loader_state_json(l);
        assert_string_equal(again, st[at]);
        free(again);
        int32_t *rest = malloc((size_t)(n - at + 1) * sizeof *rest);
        if (n > at) draw(d, l, n - at, B, rest);
        assert_memory_equal(rest, ids + at, (size_t)(n - at) * sizeof *ids);
        char *end = loom_loader_state_json(l);
        assert_string_equal(end, st[n]);
        free(end);
        free(rest);
        loom_loader_free(l);
        loom_dataset_close(y);
    }
    for (int i = 0; i <= n; i++) free(st[i]);
    free(st);
    free(ids);
}

static void test_resume_exact_one_source(void **state) {
    (void)state;
    ds d;
    one_source(&d);
    resume_check(&d, 99, 1);
    resume_check(&d, 99, 0);
    /* every sample once per epoch across resumes is covered by the order equality with an
     * uninterrupted run, whose epochs test_every_sample_once_per_epoch checks */
    ds_rm(&d);
}

static void test_resume_exact_mixed(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    add(&d, "web", 3, 0, 16 * 20 + 5);
    add(&d, "code", 1, 4, 16 * 9 + 1);
    add(&d, "web", 3, 0, 16 * 11 + 1);
    add(&d, "books", 0.5, 1.5, 16 * 30 + 1);
    add(&d, "code", 1, 4, 16 * 2 + 1);
    resume_check(&d, 5, 1);
    resume_check(&d, 5, 0);
    ds_rm(&d);
}

/* ---- data parallelism ------------------------------------------------------------------ */

static void test_dp_slices(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    add(&d, "a", 2, 0, 16 * 25 + 1);
    add(&d, "b", 1, 3, 16 * 12 + 1);
    loom_dataset *x = ds_open(&d);
    enum { STEPS = 20 };
    for (int B = 5; B <= 7; B++) {
        loom_loader *one = mk(x, 11, 1, 0);
        int32_t *ref = malloc((size_t)STEPS * B * T * sizeof *ref);
        int32_t *tref = malloc((size_t)STEPS * B * T * sizeof *tref);
        loom_err err = {{0}};
        for (int s = 0; s < STEPS; s++)
            if (loom_loader_next(one, B, ref + (size_t)s * B * T, tref + (size_t)s * B * T, &err))
                fail_msg("%s", err.msg);
        for (int dp = 2; dp <= 3; dp++) {
            loom_loader *rk[3];
            for (int r = 0; r < dp; r++) rk[r] = mk(x, 11, 1, 0);
            int32_t *got = malloc((size_t)B * T * sizeof *got), *tgot = malloc((size_t)B * T * sizeof *got);
            for (int s = 0; s < STEPS; s++) {
                for (int r = 0; r < dp; r++) {
                    int lo = B * r / dp;
                    if (loom_loader_next_slice(rk[r], B, r, dp, got + (size_t)lo * T,
                                               tgot + (size_t)lo * T, &err))
                        fail_msg("%s", err.msg);
                }
                assert_memory_equal(got, ref + (size_t)s * B * T, (size_t)B * T * sizeof *got);
                assert_memory_equal(tgot, tref + (size_t)s * B * T, (size_t)B * T * sizeof *got);
            }
            char *s0 = loom_loader_state_json(one);
            for (int r = 0; r < dp; r++) {
                char *sr = loom_loader_state_json(rk[r]); /* every rank: the same counters */
                assert_string_equal(sr, s0);
                free(sr);
                loom_loader_free(rk[r]);
            }
            free(s0);
            free(got);
            free(tgot);
        }
        free(ref);
        free(tref);
        loom_loader_free(one);
    }
    loom_dataset_close(x);
    ds_rm(&d);
}

/* ---- one pass for evaluation ----------------------------------------------------------- */

/* Two sources (weights 3:1, capped), lines interleaved, one line too short for a sample: 57
 * samples, not a multiple of any batch tried. Every batch size and DP degree reads each
 * sample exactly once, in the fixed order (source a's samples in manifest order, then b's),
 * the rows past the end have targets -1, and the pass leaves the mixture's state alone. */
static void test_eval_pass(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    add(&d, "a", 3, 1, 16 * 20 + 1); /* 20 samples */
    add(&d, "b", 1, 0.5, 16 * 12 + 5); /* 12 */
    add(&d, "a", 3, 1, 10);          /* 0 */
    add(&d, "a", 3, 1, 16 * 17 + 1); /* 17 */
    add(&d, "b", 1, 0.5, 16 * 8 + 1); /* 8 */
    enum { N = 57 };
    int32_t expect[N];
    int k = 0;
    const int order[] = {0, 2, 3, 1, 4}; /* a's lines, then b's */
    for (int i = 0; i < 5; i++)
        for (uint64_t j = 0; j < shard_samples(d.sh[order[i]].n); j++)
            expect[k++] = (int32_t)(d.sh[order[i]].base + j * T);
    assert_int_equal(k, N);
    loom_dataset *x = ds_open(&d);
    loom_loader *l = NULL;
    loom_err err = {{0}};
    loom_loader_opts o = {.T = T, .seed = 5, .shuffle = 0, .ignore_caps = 1};
    if (loom_loader_open(x, &o, &l, &err)) fail_msg("%s", err.msg);
    assert_int_equal(loom_loader_num_samples(l), N);
    int32_t before[8], after[8];
    draw(&d, l, 8, 3, before); /* the mixture, 8 samples in */
    char *state0 = loom_loader_state_json(l);
    const int Bs[] = {1, 4, 5, 8, 60}, dps[] = {1, 2, 3, 4};
    for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++)
        for (size_t di = 0; di < sizeof dps / sizeof dps[0]; di++) {
            const int B = Bs[bi], dp = dps[di];
            if (dp > B) continue;
            const uint64_t nb = loom_loader_pass_batches(l, B);
            assert_int_equal(nb, (N + B - 1) / B);
            int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
            int32_t got[N + 64];
            int n = 0, seen_pad = 0;
            for (uint64_t b = 0; b < nb; b++)
                for (int r = 0; r < dp; r++) {
                    const int lo = B * r / dp, hi = B * (r + 1) / dp;
                    for (int i = 0; i < (hi - lo) * T; i++) in[i] = tg[i] = 12345;
                    const int real = loom_loader_pass_slice(l, b, B, r, dp, in, tg);
                    for (int row = 0; row < hi - lo; row++) {
                        const uint64_t g = b * (uint64_t)B + (uint64_t)(lo + row);
                        if (g < N) {
                            assert_true(row < real); /* real rows come first */
                            got[n++] = check_sample(&d, in + row * T, tg + row * T);
                        } else {
                            assert_true(row >= real);
                            for (int t = 0; t < T; t++) {
                                assert_int_equal(tg[row * T + t], -1);
                                assert_int_equal(in[row * T + t], 0);
                            }
                            seen_pad = 1;
                        }
                    }
                }
            assert_int_equal(n, N);
            assert_memory_equal(got, expect, sizeof expect); /* each once, in order */
            assert_int_equal(seen_pad, N % B != 0);
            free(in);
            free(tg);
        }
    char *state1 = loom_loader_state_json(l);
    assert_string_equal(state0, state1);
    draw(&d, l, 8, 3, after); /* the mixture goes on where it was */
    loom_loader_free(l);
    if (loom_loader_open(x, &o, &l, &err)) fail_msg("%s", err.msg);
    int32_t ref[16];
    draw(&d, l, 16, 4, ref);
    assert_memory_equal(ref, before, sizeof before);
    assert_memory_equal(ref + 8, after, sizeof after);
    free(state0);
    free(state1);
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);
}

/* ---- growing datasets ------------------------------------------------------------------ */

static void append_raw(const ds *d, const char *text) {
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", d->dir);
    FILE *f = fopen(mpath, "a");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_follow_growing(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    add(&d, "a", 1, 0, 16 * 6 + 1); /* 6 samples */
    add(&d, "a", 1, 0, 16 * 4 + 1); /* 4 samples */
    loom_dataset *x = ds_open(&d);
    loom_loader *l = mk(x, 21, 1, 1);
    loom_loader *still = mk(x, 21, 1, 0); /* a loader over the same dataset without follow */
    int32_t ids[64];
    draw(&d, l, 4, 2, ids);
    char *st4 = loom_loader_state_json(l);

    /* a shard written without its manifest line (half-written, or not yet listed) */
    char sha[65];
    write_shard(&d, "shard_00002.bin", 900000, 16 * 5 + 1, sha);
    /* and its line, written in two parts: the first part is no complete line */
    char line[400];
    snprintf(line, sizeof line,
             "{\"shard\":\"shard_00002.bin\",\"sha256\":\"%s\",\"tokens\":%d,\"docs\":1,"
             "\"source\":\"a\"}\n", sha, 16 * 5 + 1);
    size_t half = strlen(line) / 2;
    char first[400];
    snprintf(first, sizeof first, "%.*s", (int)half, line);
    append_raw(&d, first);
    draw(&d, l, 5, 3, ids + 4); /* epoch 0 goes on with the 10 known samples */
    for (int i = 0; i < 9; i++) assert_true(locate(&d, ids[i], NULL) < 2);
    d.sh[2] = (shard_info){"a", 900000, 16 * 5 + 1};
    d.n = 3;
    append_raw(&d, line + half);
    /* complete now: after the last known sample, epoch 0 goes on with the new shard's 5
     * samples (a new segment), then epoch 1 has all 15 in one permutation */
    draw(&d, l, 1 + 5 + 15, 4, ids + 9);
    assert_true(locate(&d, ids[9], NULL) < 2);
    for (int i = 10; i < 15; i++) assert_int_equal(locate(&d, ids[i], NULL), 2);
    for (int e = 0; e < 2; e++) {
        int32_t *ep = ids + 15 * e;
        for (int i = 0; i < 15; i++)
            for (int k = i + 1; k < 15; k++) assert_int_not_equal(ep[i], ep[k]);
    }
    uint64_t epoch;
    loom_loader_source(l, 0, NULL, &epoch);
    assert_int_equal(epoch, 2);
    assert_int_equal(loom_loader_num_samples(l), 15);
    assert_int_equal(loom_loader_num_samples(still), 10); /* no follow: only what it knew */

    /* a resume from before the growth continues the same way */
    loom_dataset *y = ds_open(&d);
    loom_loader *r = mk(y, 21, 1, 0);
    loom_err err = {{0}};
    if (loom_loader_restore_json(r, st4, &err)) fail_msg("%s", err.msg);
    int32_t again[26];
    draw(&d, r, 26, 5, again);
    assert_memory_equal(again, ids + 4, sizeof again);
    loom_loader_free(r);
    loom_dataset_close(y);
    free(st4);

    /* a new source joins with its share from now on (weights 1 : 1), not a catch-up run */
    add(&d, "z", 1, 0, 16 * 40 + 1);
    draw(&d, l, 20, 4, ids);
    int nz = 0;
    for (int i = 0; i < 20; i++) nz += d.sh[locate(&d, ids[i], NULL)].source[0] == 'z';
    assert_true(nz >= 9 && nz <= 11);
    /* the join credit is part of the state: a resume continues the same mix */
    char *stz = loom_loader_state_json(l);
    const char *zs = strstr(stz, "\"name\":\"z\"");
    assert_non_null(zs);
    zs = strstr(zs, "\"skip\":");
    assert_non_null(zs);
    assert_true(strtoull(zs + 7, NULL, 10) > 20); /* z joined with a's progress as credit */
    int32_t more[30], again2[30];
    draw(&d, l, 30, 6, more);
    y = ds_open(&d);
    r = mk(y, 21, 1, 0);
    if (loom_loader_restore_json(r, stz, &err)) fail_msg("%s", err.msg);
    draw(&d, r, 30, 7, again2);
    assert_memory_equal(more, again2, sizeof more);
    free(stz);
    loom_loader_free(r);
    loom_dataset_close(y);
    loom_loader_free(still);
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);
}

/* a capped source that ran dry joins again when its manifest grows (streaming one pass) */
static void test_follow_capped_stream(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    add(&d, "s", 1, 1, 16 * 3 + 1);
    loom_dataset *x = ds_open(&d);
    loom_loader *l = mk(x, 2, 1, 1);
    int32_t ids[16], in[T], tg[T];
    draw(&d, l, 3, 1, ids);
    loom_err err = {{0}};
    assert_int_equal(loom_loader_next(l, 1, in, tg, &err), -1);
    TU_ASSERT_HAS(err.msg, "exhausted at sample 3");
    char *parked = loom_loader_state_json(l);
    add(&d, "s", 1, 1, 16 * 2 + 1);
    draw(&d, l, 2, 2, ids + 3);
    for (int i = 3; i < 5; i++) assert_int_equal(locate(&d, ids[i], NULL), 1);
    assert_int_equal(loom_loader_next(l, 1, in, tg, &err), -1);
    /* a resume of the parked state over the grown manifest reads the new shard too */
    loom_dataset *y = ds_open(&d);
    loom_loader *r = mk(y, 2, 1, 0);
    if (loom_loader_restore_json(r, parked, &err)) fail_msg("%s", err.msg);
    int32_t again[2];
    draw(&d, r, 2, 1, again);
    assert_memory_equal(again, ids + 3, sizeof again);
    assert_int_equal(loom_loader_next(r, 1, in, tg, &err), -1);
    free(parked);
    loom_loader_free(r);
    loom_dataset_close(y);
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void expect_restore_error(loom_loader *l, const char *json, const char *needle) {
    loom_err err = {{0}};
    assert_int_equal(loom_loader_restore_json(l, json, &err), -1);
    TU_ASSERT_HAS(err.msg, needle);
}

static void test_state_errors(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    add(&d, "a", 1, 2, 16 * 4 + 1);
    add(&d, "b", 1, 0, 16 * 4 + 1);
    loom_dataset *x = ds_open(&d);
    loom_loader *l = mk(x, 4, 1, 0);
    int32_t ids[6];
    draw(&d, l, 6, 6, ids);
    char *good = loom_loader_state_json(l);
    char buf[2048];
#define BAD(from, to, needle)                                                                  \
    do {                                                                                       \
        const char *p_ = strstr(good, from);                                                   \
        assert_non_null(p_);                                                                   \
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(p_ - good), good, to, p_ + strlen(from));  \
        expect_restore_error(l, buf, needle);                                                  \
    } while (0)
    expect_restore_error(l, "{", "invalid JSON");
    expect_restore_error(l, "{\"epoch\":1,\"position\":3}", "older loader");
    BAD("\"seq_len\":16", "\"seq_len\":32", "seq_len 32");
    BAD("\"seed\":4", "\"seed\":5", "seed 5");
    BAD("\"shuffle\":true", "\"shuffle\":false", "would differ");
    BAD("\"name\":\"b\"", "\"name\":\"zz\"", "source \"zz\"");
    BAD("\"name\":\"b\"", "\"name\":\"a\"", "listed twice");
    BAD("\"segments\":[1]", "\"segments\":[2]", "has only 1");
    BAD("\"segments\":[1]", "\"segments\":[1,1]", "segments[1]");
    BAD("\"samples\":6", "\"samples\":7", "add up");
    BAD("\"version\":1", "\"version\":9", "version 9");
    BAD("\"position\":3", "\"position\":30", "out of range");
    BAD("\"epoch\":0", "\"epoch\":2", "repeat_cap");
#undef BAD
    /* a good state still restores after all that */
    loom_err err = {{0}};
    assert_int_equal(loom_loader_restore_json(l, good, &err), 0);
    free(good);
    loom_loader_free(l);
    loom_dataset_close(x);

    /* lines of one source must agree on weight and cap: the dataset refuses them (so train and
     * `data verify` apply the rule alike) */
    add(&d, "a", 2, 2, 16 * 4 + 1);
    x = NULL;
    assert_int_equal(loom_dataset_open(d.dir, &x, &err), -1);
    assert_null(x);
    TU_ASSERT_HAS(err.msg, "manifest.jsonl:3: source \"a\" has weight 2", "line 1");
    ds_rm(&d);

    /* bad weight values are manifest errors naming the line */
    ds_init(&d);
    add(&d, "a", 1, 0, 40);
    append_raw(&d, "{\"shard\":\"x.bin\",\"sha256\":\"0000000000000000000000000000000000000000000000000000000000000000\",\"tokens\":1,\"docs\":1,\"weight\":-1}\n");
    loom_dataset *bad = NULL;
    assert_int_equal(loom_dataset_open(d.dir, &bad, &err), -1);
    TU_ASSERT_HAS(err.msg, "manifest.jsonl:2: \"weight\" = -1");
    ds_rm(&d);
}

static void test_follow_errors(void **state) {
    (void)state;
    ds d;
    ds_init(&d);
    add(&d, "a", 1, 0, 16 * 4 + 1);
    loom_dataset *x = ds_open(&d);
    loom_loader *l = mk(x, 4, 1, 1);
    int32_t ids[4], in[T], tg[T];
    draw(&d, l, 2, 2, ids);
    /* a new line whose shard does not match its sha256: an error naming the shard */
    char sha[65];
    write_shard(&d, "shard_00001.bin", 5000, 40, sha);
    append_raw(&d, "{\"shard\":\"shard_00001.bin\",\"sha256\":\"1111111111111111111111111111111111111111111111111111111111111111\",\"tokens\":40,\"docs\":1,\"source\":\"a\"}\n");
    loom_err err = {{0}};
    assert_int_equal(loom_loader_next(l, 1, in, tg, &err), -1);
    TU_ASSERT_HAS(err.msg, "shard_00001.bin: sha256 mismatch");
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);

    /* a manifest rewritten under a follower (not an append) */
    ds_init(&d);
    add(&d, "a", 1, 0, 16 * 4 + 1);
    x = ds_open(&d);
    l = mk(x, 4, 1, 1);
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", d.dir);
    FILE *f = fopen(mpath, "r+");
    assert_non_null(f);
    fputc(' ', f);
    fclose(f);
    append_raw(&d, "");
    assert_int_equal(loom_loader_next(l, 1, in, tg, &err), -1);
    TU_ASSERT_HAS(err.msg, "append");
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);
}

static void test_short_shards(void **state) {
    (void)state;
    ds d;
    one_source(&d);
    loom_dataset *x = ds_open(&d);
    loom_loader *l = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_loader_create(x, 1000, 1, 0, &l, &err), -1); /* needs 1001 tokens */
    TU_ASSERT_HAS(err.msg, "no complete sample of 1001 tokens");
    assert_null(l);
    assert_int_equal(loom_loader_create(x, 0, 1, 0, &l, &err), -1);
    assert_int_equal(loom_loader_create(x, 999, 1, 1, &l, &err), 0);
    assert_int_equal(loom_loader_num_samples(l), 1);
    loom_loader_free(l);
    loom_dataset_close(x);
    ds_rm(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_order),
        cmocka_unit_test(test_every_sample_once_per_epoch),
        cmocka_unit_test(test_mixing_proportions),
        cmocka_unit_test(test_repeat_cap),
        cmocka_unit_test(test_resume_exact_one_source),
        cmocka_unit_test(test_resume_exact_mixed),
        cmocka_unit_test(test_dp_slices),
        cmocka_unit_test(test_eval_pass),
        cmocka_unit_test(test_follow_growing),
        cmocka_unit_test(test_follow_capped_stream),
        cmocka_unit_test(test_state_errors),
        cmocka_unit_test(test_follow_errors),
        cmocka_unit_test(test_short_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
