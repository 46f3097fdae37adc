/* The decode kernels (docs/inference.md "Speed"):
 *  - matmul_rows_forward (the linear layer over a few rows, weights streamed in place) agrees
 *    with a double-precision product over shapes whose IC, OC and N are not multiples of its
 *    blocks, with and without a bias;
 *  - matmul_forward at N <= LOOM_MATMUL_ROWS_MAX gives each row bitwise what that row alone
 *    gives (a sequence's logits do not depend on what else is in the engine's step), and
 *    neither kernel depends on the thread count;
 *  - matmul_rows_bf16_forward (bf16 weights, --weights bf16) gives bit for bit what
 *    matmul_rows_forward gives on the weights rounded to bf16 and widened back, for N below,
 *    at and above 16 rows; loom_bf16_round rounds to nearest, ties to even;
 *  - attention_decode (rows streamed in order, all heads at once) agrees with a double
 *    softmax-attention over the cache, grouped heads and a head size off the vector width
 *    included, bitwise the same on 1 and 2 threads. */
#include "testutil.h"

#include <math.h>
#include <omp.h>

#include "loom/bf16.h"
#include "loom/kernels.h"

static float *rand_buf(size_t n, uint64_t seed) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = tu_frand(&seed);
    return p;
}

static void test_matmul_rows_reference(void **state) {
    (void)state;
    const int Ns[] = {1, 3, 4, 5, 16}, ICs[] = {7, 16, 40, 64, 129}, OCs[] = {1, 5, 8, 13};
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
        for (size_t b = 0; b < sizeof ICs / sizeof *ICs; b++)
            for (size_t c = 0; c < sizeof OCs / sizeof *OCs; c++)
                for (int use_bias = 0; use_bias < 2; use_bias++) {
                    const int N = Ns[a], IC = ICs[b], OC = OCs[c];
                    float *x = rand_buf((size_t)N * IC, 1 + a);
                    float *w = rand_buf((size_t)OC * IC, 7 + b);
                    float *bias = use_bias ? rand_buf((size_t)OC, 11 + c) : NULL;
                    float *out = malloc((size_t)N * OC * sizeof *out);
                    matmul_rows_forward(out, x, w, bias, N, IC, OC);
                    for (int n = 0; n < N; n++)
                        for (int o = 0; o < OC; o++) {
                            double ref = bias ? bias[o] : 0.0, mag = bias ? fabs(bias[o]) : 0.0;
                            for (int i = 0; i < IC; i++) {
                                ref += (double)x[n * IC + i] * w[o * IC + i];
                                mag += fabs((double)x[n * IC + i] * w[o * IC + i]);
                            }
                            const double err = fabs(out[n * OC + o] - ref);
                            if (err > 1e-6 * mag + 1e-7)
                                fail_msg("N=%d IC=%d OC=%d bias=%d: out[%d,%d] = %.9g, want %.9g",
                                         N, IC, OC, use_bias, n, o, out[n * OC + o], ref);
                        }
                    free(x);
                    free(w);
                    free(bias);
                    free(out);
                }
}

/* each row of an N-row call equals that row computed alone, through matmul_forward */
static void test_matmul_rows_independent(void **state) {
    (void)state;
    enum { IC = 200, OC = 333 };
    float *w = rand_buf((size_t)OC * IC, 3), *bias = rand_buf(OC, 4);
    for (int N = 2; N <= LOOM_MATMUL_ROWS_MAX; N++) {
        float *x = rand_buf((size_t)N * IC, 100 + (uint64_t)N);
        float *all = malloc((size_t)N * OC * sizeof *all), *one = malloc(OC * sizeof *one);
        matmul_forward(all, x, w, bias, N, IC, OC);
        for (int n = 0; n < N; n++) {
            matmul_forward(one, x + (size_t)n * IC, w, bias, 1, IC, OC);
            if (memcmp(one, all + (size_t)n * OC, OC * sizeof *one))
                fail_msg("N=%d: row %d differs from the same row alone", N, n);
        }
        free(x);
        free(all);
        free(one);
    }
    free(w);
    free(bias);
}

static void test_matmul_rows_bf16(void **state) {
    (void)state;
    /* rounding: 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: to the even one (1); 1 + 3 *
     * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6; just above halfway rounds up */
    assert_int_equal(loom_bf16_round(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(loom_bf16_round(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(loom_bf16_round(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_int_equal(loom_bf16_round(-2.0f), 0xc000);
    assert_true(isnan(loom_bf16_widen(loom_bf16_round(NAN))));
    assert_true(isfinite(loom_bf16_widen(loom_bf16_round(3.0e38f)))); /* not rounded to inf */
    const int Ns[] = {1, 3, 4, 16, 17, 37}, ICs[] = {16, 40, 768}, OCs[] = {5, 13, 64};
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
        for (size_t b = 0; b < sizeof ICs / sizeof *ICs; b++)
            for (size_t c = 0; c < sizeof OCs / sizeof *OCs; c++) {
                const int N = Ns[a], IC = ICs[b], OC = OCs[c];
                float *x = rand_buf((size_t)N * IC, 7 + a), *w = rand_buf((size_t)OC * IC, 8 + b);
                float *bias = rand_buf(OC, 9);
                uint16_t *h = malloc((size_t)OC * IC * sizeof *h);
                for (size_t i = 0; i < (size_t)OC * IC; i++) {
                    h[i] = loom_bf16_round(w[i]);
                    w[i] = loom_bf16_widen(h[i]);
                }
                float *r = malloc((size_t)N * OC * sizeof *r), *o = malloc((size_t)N * OC * sizeof *o);
                matmul_rows_forward(r, x, w, bias, N, IC, OC);
                matmul_rows_bf16_forward(o, x, h, bias, N, IC, OC);
                if (memcmp(r, o, (size_t)N * OC * sizeof *r))
                    fail_msg("N=%d IC=%d OC=%d: bf16 kernel differs from fp32 on rounded weights",
                             N, IC, OC);
                free(x);
                free(w);
                free(bias);
                free(h);
                free(r);
                free(o);
            }
}

static void test_matmul_rows_threads(void **state) {
    (void)state;
    enum { N = 5, IC = 300, OC = 1001 };
    float *x = rand_buf((size_t)N * IC, 5), *w = rand_buf((size_t)OC * IC, 6);
    float *a = malloc((size_t)N * OC * sizeof *a), *b = malloc((size_t)N * OC * sizeof *b);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    matmul_rows_forward(a, x, w, NULL, N, IC, OC);
    omp_set_num_threads(2);
    matmul_rows_forward(b, x, w, NULL, N, IC, OC);
    omp_set_num_threads(saved);
    assert_memory_equal(a, b, (size_t)N * OC * sizeof *a);
    free(x);
    free(w);
    free(a);
    free(b);
}

static void attn_ref(double *out, const float *q, const float *k, const float *v, int n, int H,
                     int KVH, int D) {
    const int row = KVH * D;
    double *s = malloc((size_t)n * sizeof *s);
    for (int h = 0; h < H; h++) {
        const int kvh = h / (H / KVH);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n; j++) {
            double d = 0;
            for (int e = 0; e < D; e++) d += (double)q[h * D + e] * k[j * row + kvh * D + e];
            s[j] = d / sqrt((double)D);
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j < n; j++) sum += s[j] = exp(s[j] - mx);
        for (int e = 0; e < D; e++) {
            double o = 0;
            for (int j = 0; j < n; j++) o += s[j] / sum * v[j * row + kvh * D + e];
            out[h * D + e] = o;
        }
    }
    free(s);
}

static void test_attention_decode(void **state) {
    (void)state;
    const struct { int n, H, KVH, D; } cases[] = {{1, 4, 4, 16}, {37, 4, 2, 20}, {300, 6, 2, 32},
                                                  {260, 8, 1, 64}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int n = cases[c].n, H = cases[c].H, KVH = cases[c].KVH, D = cases[c].D;
        float *q = rand_buf((size_t)H * D, 20 + c);
        float *k = rand_buf((size_t)n * KVH * D, 30 + c), *v = rand_buf((size_t)n * KVH * D, 40 + c);
        float *o1 = malloc((size_t)H * D * sizeof *o1), *o2 = malloc((size_t)H * D * sizeof *o2);
        float *scr = malloc((size_t)H * n * sizeof *scr);
        double *ref = malloc((size_t)H * D * sizeof *ref);
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        attention_decode(o1, q, k, v, n, H, KVH, D, scr, NULL);
        omp_set_num_threads(2);
        attention_decode(o2, q, k, v, n, H, KVH, D, scr, NULL);
        omp_set_num_threads(saved);
        assert_memory_equal(o1, o2, (size_t)H * D * sizeof *o1);
        attn_ref(ref, q, k, v, n, H, KVH, D);
        for (int i = 0; i < H * D; i++)
            if (fabs(o1[i] - ref[i]) > 1e-5)
                fail_msg("n=%d H=%d KVH=%d D=%d: out[%d] = %.9g, want %.9g", n, H, KVH, D, i,
                         o1[i], ref[i]);
        free(q);
        free(k);
        free(v);
        free(o1);
        free(o2);
        free(scr);
        free(ref);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_rows_reference),
        cmocka_unit_test(test_matmul_rows_independent),
        cmocka_unit_test(test_matmul_rows_threads),
        cmocka_unit_test(test_matmul_rows_bf16),
        cmocka_unit_test(test_attention_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
