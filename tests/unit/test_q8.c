/* 8-bit weights' kernels (src/kernels/matmul_q8.c, docs/inference.md "Weights in int8"):
 *  - loom_fp16_round / loom_fp16_widen against the compiler's _Float16 conversions (IEEE, to
 *    nearest even) over normal, subnormal, tie, overflow and special values;
 *  - q8_quantize_rows writes GGUF's Q8_0 as this file's own reading of the format (scale
 *    max|x| / 127 as fp16, values roundf(x * (1 / scale))), and the round trip: each value's
 *    rounding error at most half the block's fp32 scale, the dequantized value (q times the
 *    fp16 scale) within half the fp16 scale plus the scale's own rounding;
 *  - matmul_q8_forward bit for bit equal to the contract computed here in scalar C (16 fp32
 *    chains over the blocks, each += (float)isum * (dw * dx) of a quarter of a block's
 *    products, summed in a fixed tree, then the bias) at every level the
 *    CPU has (x86-64, avx2, avx512, with VPDPBUSD checked to be the one that ran where the CPU
 *    has avx512_vnni, and avx512 again without it: VPMADDUBSW, as AVX-512 CPUs without VNNI), for OC on and off multiples of 4, IC of 1..18 blocks (odd and even for
 *    the two-block AVX-512 loop), 1..17 rows, with and without a bias; each row alone gives
 *    the same bits as in the batch; 1 and 2 threads agree; and the result is within int8's
 *    error of the fp32 product. */
#include "testutil.h"

#include <math.h>
#include <omp.h>

#include "loom/fp16.h"
#include "loom/kernels.h"

static uint16_t f16_bits(_Float16 h) {
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

static void test_fp16(void **state) {
    (void)state;
    uint64_t s = 3;
    const float special[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 1e6f, -1e6f,
                             INFINITY, -INFINITY, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f,
                             0x1.8p-24f, 0x1.4p-23f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
                             0x1.ffcp-15f, 0x1.ffep-15f, 1e-30f, 0x1p-149f};
    int n = 0;
    for (int i = 0; i < 200000; i++) {
        float x;
        if (i < (int)(sizeof special / sizeof *special)) x = special[i];
        else if (i % 3 == 0) { /* random bits: every exponent */
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            const uint32_t u = (uint32_t)(s >> 32);
            memcpy(&x, &u, sizeof x);
            if (isnan(x)) continue;
        } else
            x = tu_frand(&s) * powf(2.0f, (float)(i % 44) - 28.0f);
        const uint16_t want = f16_bits((_Float16)x), got = loom_fp16_round(x);
        if (got != want) fail_msg("fp16(%a) = 0x%04x, want 0x%04x", (double)x, got, want);
        n++;
    }
    for (uint32_t h = 0; h < 65536; h++) { /* every half back */
        _Float16 v;
        const uint16_t hb = (uint16_t)h;
        memcpy(&v, &hb, sizeof v);
        const float want = (float)v, got = loom_fp16_widen(hb);
        if (isnan(want)) {
            assert_true(isnan(got));
            continue;
        }
        if (memcmp(&want, &got, sizeof want) != 0)
            fail_msg("widen(0x%04x) = %a, want %a", h, (double)got, (double)want);
    }
    assert_true(isnan(loom_fp16_widen(loom_fp16_round(NAN))));
    print_message("fp16: %d values rounded as _Float16, all 65536 halves widened exactly\n", n);
}

/* the format, as this test reads it */
static void ref_quantize(int8_t *q, uint16_t *d, const float *x, int64_t N, int IC) {
    for (int64_t r = 0; r < N; r++)
        for (int b = 0; b < IC / 32; b++) {
            const float *xb = x + r * IC + 32 * b;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
            const float sc = amax / 127.0f, inv = sc == 0.0f ? 0.0f : 1.0f / sc;
            d[r * (IC / 32) + b] = f16_bits((_Float16)sc);
            for (int j = 0; j < 32; j++) q[r * IC + 32 * b + j] = (int8_t)roundf(xb[j] * inv);
        }
}

static void test_quantize(void **state) {
    (void)state;
    enum { N = 7, IC = 96 };
    float x[N * IC], y[N * IC];
    int8_t q[N * IC], qr[N * IC];
    uint16_t d[N * IC / 32], dr[N * IC / 32];
    uint64_t s = 11;
    for (int i = 0; i < N * IC; i++) x[i] = tu_frand(&s) * powf(10.0f, (float)(i / 32 % 7) - 4.0f);
    for (int j = 0; j < 32; j++) x[32 + j] = 0.0f;             /* an all-zero block */
    x[64] = 5.0f, x[65] = -5.0f;                               /* +-127 */
    for (int j = 66; j < 96; j++) x[j] = 5.0f * (float)(j - 80) / 127.0f * 0.5f; /* ties */
    q8_quantize_rows(q, d, x, N, IC);
    ref_quantize(qr, dr, x, N, IC);
    assert_memory_equal(q, qr, sizeof q);
    assert_memory_equal(d, dr, sizeof d);
    q8_dequantize_rows(y, q, d, N, IC);
    double worst = 0.0;
    for (int i = 0; i < N * IC; i++) {
        const float *xb = x + i / 32 * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const double s32 = amax / 127.0f, s16 = loom_fp16_widen(d[i / 32]);
        assert_true(q[i] >= -127 && q[i] <= 127);
        /* the rounding: at most half a step of the fp32 scale (and x * (1/s) is x / s to one
         * part in 2^23) */
        if (s32 > 0) assert_true(fabs(x[i] / s32 - q[i]) <= 0.5 + 1e-5);
        else assert_int_equal(q[i], 0);
        /* the dequantized value: half the fp16 scale plus what the scale's rounding moves */
        const double bound = s16 / 2 * (1 + 1e-6) + 127.0 * fabs(s16 - s32) + 1e-30;
        const double e = fabs((double)y[i] - x[i]);
        if (e > bound) fail_msg("value %d: |x - dq| = %g > %g", i, e, bound);
        if (s16 > 0) worst = fmax(worst, e / s16);
        assert_true(y[i] == (float)q[i] * (float)s16);
    }
    print_message("q8: worst |x - dq| = %.4f scale\n", worst);
}

/* the contract, element by element: 16 fp32 chains, chain 8 * (b % 2) + l taking block b's
 * products 4l..4l+3 (their exact int32 sum) times the product of the two scales, each
 * multiply and add rounded; then the chains summed (l, l + 8), then (l, l + 4), (l, l + 2),
 * (l, l + 1) */
static float ref_dot(const int8_t *xq, const uint16_t *xd, const int8_t *wq, const uint16_t *wd,
                     int IC) {
    volatile float c[16] = {0};
    for (int b = 0; b < IC / 32; b++) {
        const float dd = loom_fp16_widen(wd[b]) * loom_fp16_widen(xd[b]);
        for (int l = 0; l < 8; l++) {
            int32_t is = 0;
            for (int j = 4 * l; j < 4 * l + 4; j++) is += (int32_t)xq[32 * b + j] * (int32_t)wq[32 * b + j];
            volatile float p = (float)is * dd;
            c[8 * (b % 2) + l] = c[8 * (b % 2) + l] + p;
        }
    }
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = c[l] + c[l + 8];
    for (int s = 4; s > 0; s /= 2)
        for (int l = 0; l < s; l++) t[l] = t[l] + t[l + s];
    return t[0];
}

static void check_shape(int N, int IC, int OC, int use_bias, uint64_t seed, const char *level) {
    float *x = malloc(sizeof(float) * (size_t)N * IC), *w = malloc(sizeof(float) * (size_t)OC * IC);
    float *bias = malloc(sizeof(float) * (size_t)OC);
    uint64_t s = seed;
    for (int i = 0; i < N * IC; i++) x[i] = tu_frand(&s);
    for (int i = 0; i < OC * IC; i++) w[i] = tu_frand(&s) * 0.1f;
    for (int i = 0; i < OC; i++) bias[i] = tu_frand(&s);
    int8_t *xq = malloc((size_t)N * IC), *wq = malloc((size_t)OC * IC);
    uint16_t *xd = malloc(2 * (size_t)N * IC / 32), *wd = malloc(2 * (size_t)OC * IC / 32);
    q8_quantize_rows(xq, xd, x, N, IC);
    q8_quantize_rows(wq, wd, w, OC, IC);
    float *out = malloc(sizeof(float) * (size_t)N * OC), *one = malloc(sizeof(float) * (size_t)OC);
    const float *b = use_bias ? bias : NULL;
    matmul_q8_forward(out, xq, xd, wq, wd, b, N, IC, OC);
    double err = 0, ref = 0;
    for (int n = 0; n < N; n++) {
        matmul_q8_forward(one, xq + (int64_t)n * IC, xd + (int64_t)n * IC / 32, wq, wd, b, 1, IC, OC);
        for (int o = 0; o < OC; o++) {
            float want = ref_dot(xq + (int64_t)n * IC, xd + (int64_t)n * IC / 32,
                                 wq + (int64_t)o * IC, wd + (int64_t)o * IC / 32, IC);
            if (b) want = want + b[o];
            const float got = out[(int64_t)n * OC + o];
            if (memcmp(&got, &want, sizeof got) != 0)
                fail_msg("%s N=%d IC=%d OC=%d bias=%d: out(%d, %d) = %a, want %a", level, N, IC,
                         OC, use_bias, n, o, (double)got, (double)want);
            if (memcmp(&one[o], &got, sizeof got) != 0)
                fail_msg("%s N=%d IC=%d OC=%d: row %d alone differs at %d", level, N, IC, OC, n, o);
            double f = b ? b[o] : 0.0; /* the fp32 product, in double */
            for (int i = 0; i < IC; i++) f += (double)x[(int64_t)n * IC + i] * w[(int64_t)o * IC + i];
            err = fmax(err, fabs(f - got));
            ref = fmax(ref, fabs(f));
        }
    }
    /* two 8-bit operands: each product off by ~1/127 of its operands' block maxima at worst */
    if (err > 0.05 * ref + 1e-3)
        fail_msg("%s N=%d IC=%d OC=%d: |q8 - fp32| = %g of %g", level, N, IC, OC, err, ref);
    free(x), free(w), free(bias), free(xq), free(wq), free(xd), free(wd), free(out), free(one);
}

static void test_matmul_contract(void **state) {
    (void)state;
    const struct { int N, IC, OC; } shapes[] = {{1, 32, 1}, {1, 64, 4}, {2, 96, 5}, {3, 576, 7},
                                                {5, 160, 16}, {16, 64, 9}, {17, 128, 13},
                                                {4, 32 * 18, 12}, {1, 32 * 17, 3}, {20, 64, 6}};
    loom_isa lv[4];
    const int nl = tu_isa_levels(lv);
    for (int k = 0; k < nl; k++) {
        tu_set_isa(lv[k]);
        const char *name = loom_isa_name(lv[k]);
        /* at avx512: with VPDPBUSD where the CPU has it, then without (AVX-512 CPUs without
         * VNNI run that path) */
        for (int allow = 1; allow >= (lv[k] == LOOM_ISA_AVX512 ? 0 : 1); allow--) {
            matmul_q8_allow_vnni(allow);
            if (lv[k] == LOOM_ISA_AVX512) {
                __builtin_cpu_init();
                assert_int_equal(matmul_q8_vnni(), allow && __builtin_cpu_supports("avx512vnni") != 0);
                print_message("avx512: %s\n", matmul_q8_vnni() ? "VPDPBUSD" : "VPMADDUBSW");
            } else
                assert_int_equal(matmul_q8_vnni(), 0);
            for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++)
                for (int bias = 0; bias < 2; bias++)
                    check_shape(shapes[c].N, shapes[c].IC, shapes[c].OC, bias, 7 + c, name);
        }
        matmul_q8_allow_vnni(1);
    }
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
}

static void test_matmul_threads(void **state) {
    (void)state;
    enum { N = 4, IC = 256, OC = 1030 };
    float *x = malloc(sizeof(float) * N * IC), *w = malloc(sizeof(float) * OC * IC);
    uint64_t s = 21;
    for (int i = 0; i < N * IC; i++) x[i] = tu_frand(&s);
    for (int i = 0; i < OC * IC; i++) w[i] = tu_frand(&s);
    int8_t *xq = malloc(N * IC), *wq = malloc((size_t)OC * IC);
    uint16_t *xd = malloc(2 * N * IC / 32), *wd = malloc(2 * (size_t)OC * IC / 32);
    q8_quantize_rows(xq, xd, x, N, IC);
    q8_quantize_rows(wq, wd, w, OC, IC);
    float *o1 = malloc(sizeof(float) * N * OC), *o2 = malloc(sizeof(float) * N * OC);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    matmul_q8_forward(o1, xq, xd, wq, wd, NULL, N, IC, OC);
    omp_set_num_threads(2);
    matmul_q8_forward(o2, xq, xd, wq, wd, NULL, N, IC, OC);
    omp_set_num_threads(saved);
    assert_memory_equal(o1, o2, sizeof(float) * N * OC);
    free(x), free(w), free(xq), free(wq), free(xd), free(wd), free(o1), free(o2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_quantize),
        cmocka_unit_test(test_matmul_contract),
        cmocka_unit_test(test_matmul_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
