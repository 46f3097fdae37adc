/* Sampling (src/infer/sample.c): loom_sample (the single-sequence generators') against a naive
 * reference that sorts the whole vocabulary (temperature, top-k, ties to the lower id), and two
 * threads sampling at once giving what each gives alone (the sampler keeps no global state). */
#include "testutil.h"

#include <math.h>
#include <pthread.h>

#include "loom/infer.h"

/* the reference: every id sorted by (logit - max) / temperature, descending, ties by id; the
 * first k; one uniform draw against the running sum of exp */
static const float *ref_p;
static int ref_desc(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    if (ref_p[i] != ref_p[j]) return ref_p[i] > ref_p[j] ? -1 : 1;
    return i - j;
}
static int ref_sample(float temp, int k, loom_rng *rng, const float *logits, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp <= 0.0f) return best;
    float *p = malloc((size_t)V * sizeof *p);
    int *idx = malloc((size_t)V * sizeof *idx);
    for (int i = 0; i < V; i++) {
        p[i] = (logits[i] - logits[best]) / temp;
        idx[i] = i;
    }
    ref_p = p;
    qsort(idx, (size_t)V, sizeof *idx, ref_desc);
    const int n = k > 0 && k < V ? k : V;
    int *order = idx;
    int *plain = NULL;
    if (n == V) { /* no top-k: the ids in order, as the sampler walks them */
        plain = malloc((size_t)V * sizeof *plain);
        for (int i = 0; i < V; i++) plain[i] = i;
        order = plain;
    }
    double sum = 0;
    for (int j = 0; j < n; j++) sum += exp((double)p[order[j]]);
    const double r = (double)loom_rng_next_uniform(rng) * sum;
    double acc = 0;
    int got = order[n - 1];
    for (int j = 0; j < n; j++) {
        acc += exp((double)p[order[j]]);
        if (r < acc) {
            got = order[j];
            break;
        }
    }
    free(p);
    free(idx);
    free(plain);
    return got;
}

static void fill_logits(float *lg, int V, uint64_t seed, int ties) {
    for (int i = 0; i < V; i++) {
        const float u = 8.0f * loom_rng_uniform(seed, 1, (uint64_t)i) - 4.0f;
        lg[i] = ties ? floorf(u) : u; /* ties: whole numbers, many equal logits */
    }
}

static void test_matches_reference(void **state) {
    (void)state;
    static const int Vs[] = {1, 7, 300, 4099};
    static const float temps[] = {0.0f, 0.3f, 1.0f, 2.5f};
    for (size_t a = 0; a < sizeof Vs / sizeof *Vs; a++) {
        const int V = Vs[a];
        const int ks[] = {0, 1, 2, 5, V - 1, V, V + 3};
        float *lg = malloc((size_t)V * sizeof *lg);
        void *scratch = malloc(loom_sample_scratch_bytes(V));
        for (int ties = 0; ties < 2; ties++) {
            fill_logits(lg, V, 11 + (uint64_t)V, ties);
            for (size_t b = 0; b < sizeof temps / sizeof *temps; b++)
                for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) {
                    loom_sampler s = {.temperature = temps[b], .top_k = ks[c],
                                      .rng = {.seed = 5, .stream = b * 100 + c}};
                    loom_rng r = s.rng;
                    for (int d = 0; d < (V > 1000 ? 8 : 40); d++) {
                        const int want = ref_sample(temps[b], ks[c], &r, lg, V);
                        const int got = loom_sample(&s, lg, V, scratch);
                        if (got != want)
                            fail_msg("V %d ties %d temperature %g top_k %d draw %d: %d, reference %d",
                                     V, ties, (double)temps[b], ks[c], d, got, want);
                    }
                }
        }
        free(lg);
        free(scratch);
    }
}

enum { TV = 8192, TK = 64, TN = 1000 };
typedef struct job {
    float *lg;
    int out[TN];
} job;

static void draw_all(job *j) {
    void *scratch = malloc(loom_sample_scratch_bytes(TV));
    loom_sampler s = {.temperature = 1.0f, .top_k = TK, .rng = {.seed = 3, .stream = 9}};
    for (int d = 0; d < TN; d++) j->out[d] = loom_sample(&s, j->lg, TV, scratch);
    free(scratch);
}
static void *thread_main(void *arg) {
    draw_all(arg);
    return NULL;
}

static void test_two_threads(void **state) {
    (void)state;
    job *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    a->lg = malloc(TV * sizeof(float));
    b->lg = malloc(TV * sizeof(float));
    fill_logits(a->lg, TV, 1, 0);
    fill_logits(b->lg, TV, 2, 0);
    int alone_a[TN], alone_b[TN];
    draw_all(a);
    memcpy(alone_a, a->out, sizeof alone_a);
    draw_all(b);
    memcpy(alone_b, b->out, sizeof alone_b);
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, thread_main, a), 0);
    assert_int_equal(pthread_create(&tb, NULL, thread_main, b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_memory_equal(a->out, alone_a, sizeof alone_a);
    assert_memory_equal(b->out, alone_b, sizeof alone_b);
    free(a->lg);
    free(b->lg);
    free(a);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_two_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
