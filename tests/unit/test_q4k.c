/* 4-bit weights' kernels (src/kernels/matmul_q4k.c, docs/inference.md "Weights in int4"):
 *  - q4k_quantize_rows writes GGUF's Q4_K as this file reads the format byte by byte (the
 *    scales' 6-bit packing after ggml's get_scale_min_k4, the nibbles' order), and
 *    q4k_dequantize_rows is that reading; the round trip's error on Gaussian-like rows is
 *    within 4 bits' worth (RMS under 8% of the rows' RMS, 0.077 being a uniform 4-bit grid's
 *    over 32 Gaussian values; loom's fit beats the plain min/max rounding on every row); an
 *    all-zero row comes back exactly, a constant one to fp16's rounding;
 *  - q8k_quantize_rows is max|x| / 127 per 256 in fp32, roundf(x / d), each sub-block's sum;
 *  - matmul_q4k_forward bit for bit equal to the contract computed here in scalar C (per
 *    output 8 fp32 chains over the blocks, += (float)s_l * (dw * dx) of exact int32 lane sums,
 *    and 4 for the minimums' term, summed in a fixed tree, then the bias) at every level the CPU has, for OC 1..13, IC of 1..4 blocks,
 *    1..70 rows (past the kernel's 64-row passes), with and without a bias; each row alone the
 *    same bits as in the batch; 1 and 2 threads agree; within int4's error of the fp32 product
 *    of the dequantized weights. */
#include "testutil.h"

#include <math.h>
#include <omp.h>

#include "loom/fp16.h"
#include "loom/kernels.h"

/* roughly Gaussian: the sum of four uniforms */
static float grand(uint64_t *s) { return (tu_frand(s) + tu_frand(s) + tu_frand(s) + tu_frand(s)) * 0.5f; }

/* sub-block j's 6-bit scale and minimum, read as ggml's get_scale_min_k4 reads them */
static void scale_min(const uint8_t *q, int j, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* one block of 256 values as this test reads the format */
static void ref_block(float *y, const uint8_t *blk) {
    uint16_t dh, mh;
    memcpy(&dh, blk, 2);
    memcpy(&mh, blk + 2, 2);
    const float d = loom_fp16_widen(dh), dmin = loom_fp16_widen(mh);
    const uint8_t *qs = blk + 16;
    for (int p = 0; p < 4; p++) { /* 64 values: 32 bytes, low nibbles then high ones */
        int sc, m;
        scale_min(blk + 4, 2 * p, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min(blk + 4, 2 * p + 1, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            volatile float a = d1 * (float)(qs[32 * p + l] & 0xF); /* no FMA: as numpy */
            volatile float b = d2 * (float)(qs[32 * p + l] >> 4);
            y[64 * p + l] = a - m1;
            y[64 * p + 32 + l] = b - m2;
        }
    }
}

static void test_format(void **state) {
    (void)state;
    enum { N = 9, IC = 512 };
    float *x = malloc(sizeof(float) * N * IC), *y = malloc(sizeof(float) * N * IC);
    float *r = malloc(sizeof(float) * N * IC);
    uint8_t *q = malloc((size_t)N * IC / 256 * 144);
    uint64_t s = 5;
    for (int i = 0; i < N * IC; i++) x[i] = grand(&s) * powf(10.0f, (float)(i / IC % 5) - 3.0f);
    for (int i = 0; i < 64; i++) x[IC * 5 + i] *= 8.0f;       /* an outlier sub-block pair */
    for (int i = 0; i < IC; i++) x[IC * 6 + i] = 0.0f;        /* zeros */
    for (int i = 0; i < IC; i++) x[IC * 7 + i] = -0.375f;     /* a constant (negative) row */
    for (int i = 0; i < IC; i++) x[IC * 8 + i] = fabsf(x[i]); /* all positive: min 0 */
    q4k_quantize_rows(q, x, N, IC);
    q4k_dequantize_rows(y, q, N, IC);
    for (int b = 0; b < N * IC / 256; b++) ref_block(r + 256 * b, q + 144 * b);
    assert_memory_equal(y, r, sizeof(float) * N * IC);
    for (int i = 0; i < IC; i++) {
        assert_true(y[IC * 6 + i] == 0.0f);
        /* the constant is the minimum's 63 steps of dmin: fp16's rounding, no more */
        assert_true(fabsf(y[IC * 7 + i] + 0.375f) <= 0.375f * 0x1p-10f);
    }
    for (int row = 0; row < N; row++) {
        if (row == 6 || row == 7) continue;
        double e2 = 0, x2 = 0, p2 = 0;
        for (int k = 0; k < IC / 256; k++)
            for (int j = 0; j < 8; j++) { /* the plain rounding, per sub-block, for comparison */
                const float *xb = x + row * IC + 256 * k + 32 * j;
                float lo = 0.0f, hi = xb[0];
                for (int i = 0; i < 32; i++) lo = fminf(lo, xb[i]), hi = fmaxf(hi, xb[i]);
                const double st = (hi - lo) / 15.0;
                for (int i = 0; i < 32; i++) {
                    const double qv = st > 0 ? nearbyint((xb[i] - lo) / st) : 0;
                    p2 += pow(qv * st + lo - xb[i], 2);
                }
            }
        for (int i = 0; i < IC; i++) {
            e2 += pow((double)y[row * IC + i] - x[row * IC + i], 2);
            x2 += pow(x[row * IC + i], 2);
        }
        const double rel = sqrt(e2 / x2);
        print_message("row %d: RMS error %.4f of the RMS (plain rounding, unquantized scales: "
                      "%.4f)\n", row, rel, sqrt(p2 / x2));
        if (rel > 0.08) fail_msg("row %d: RMS error %.4f of the row's RMS", row, rel);
        /* the 6-bit scales cost a little; the fit must still beat plain min/max rounding */
        if (e2 > p2 * 1.05) fail_msg("row %d: the fit (%g) is worse than plain rounding (%g)", row, e2, p2);
    }
    free(x), free(y), free(r), free(q);
}

static void test_q8k(void **state) {
    (void)state;
    enum { N = 3, IC = 512 };
    float x[N * IC];
    int8_t q[N * IC];
    float d[N * IC / 256];
    int16_t sums[N * IC / 32];
    uint64_t s = 9;
    for (int i = 0; i < N * IC; i++) x[i] = tu_frand(&s) * (i < IC ? 1e-3f : 3.0f);
    for (int i = 2 * IC; i < 2 * IC + 256; i++) x[i] = 0.0f;
    q8k_quantize_rows(q, d, sums, x, N, IC);
    for (int b = 0; b < N * IC / 256; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[256 * b + i]));
        const float sc = amax / 127.0f, inv = sc == 0.0f ? 0.0f : 1.0f / sc;
        assert_true(d[b] == sc);
        for (int j = 0; j < 8; j++) {
            int sum = 0;
            for (int i = 256 * b + 32 * j; i < 256 * b + 32 * j + 32; i++) {
                assert_int_equal(q[i], (int8_t)roundf(x[i] * inv));
                sum += q[i];
            }
            assert_int_equal(sums[8 * b + j], sum);
        }
    }
}

/* the contract, for one output of one row: 8 chains c_l over the blocks, each += (float)s_l *
 * (dw * dx) where s_l = sum_j sc_j * (products 4l..4l+3 of sub-block j), and 4 chains e_i +=
 * (float)(m_2i xs_2i + m_2i+1 xs_2i+1) * (dmw * dx); then ((c0+c4) + (c2+c6)) + ((c1+c5) +
 * (c3+c7)) minus ((e0+e2) + (e1+e3)) */
static float ref_dot(const int8_t *xq, const float *xd, const int16_t *xs, const uint8_t *w,
                     int IC) {
    volatile float c[8] = {0}, e[4] = {0};
    for (int k = 0; k < IC / 256; k++) {
        const uint8_t *blk = w + 144 * k;
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        volatile float dd = loom_fp16_widen(dh) * xd[k], dm = loom_fp16_widen(mh) * xd[k];
        for (int l = 0; l < 8; l++) {
            int32_t sl = 0;
            for (int j = 0; j < 8; j++) {
                int sc, m, t = 0;
                scale_min(blk + 4, j, &sc, &m);
                for (int i = 4 * l; i < 4 * l + 4; i++) {
                    const uint8_t b = blk[16 + 32 * (j / 2) + i];
                    t += (j % 2 ? b >> 4 : b & 0xF) * xq[256 * k + 32 * j + i];
                }
                sl += sc * t;
            }
            volatile float p = (float)sl * dd;
            c[l] = c[l] + p;
        }
        for (int i = 0; i < 4; i++) {
            int sc0, m0, sc1, m1;
            scale_min(blk + 4, 2 * i, &sc0, &m0);
            scale_min(blk + 4, 2 * i + 1, &sc1, &m1);
            volatile float p = (float)(m0 * xs[8 * k + 2 * i] + m1 * xs[8 * k + 2 * i + 1]) * dm;
            e[i] = e[i] + p;
        }
    }
    volatile float a0 = c[0] + c[4], a1 = c[1] + c[5], a2 = c[2] + c[6], a3 = c[3] + c[7];
    volatile float t0 = a0 + a2, t1 = a1 + a3, u0 = e[0] + e[2], u1 = e[1] + e[3];
    volatile float t = t0 + t1, u = u0 + u1;
    return t - u;
}

static void check_shape(int N, int IC, int OC, int use_bias, uint64_t seed, const char *level) {
    float *x = malloc(sizeof(float) * (size_t)N * IC), *w = malloc(sizeof(float) * (size_t)OC * IC);
    float *wd = malloc(sizeof(float) * (size_t)OC * IC), *bias = malloc(sizeof(float) * (size_t)OC);
    uint64_t s = seed;
    for (int i = 0; i < N * IC; i++) x[i] = tu_frand(&s);
    for (int i = 0; i < OC * IC; i++) w[i] = grand(&s) * 0.1f;
    for (int i = 0; i < OC; i++) bias[i] = tu_frand(&s);
    uint8_t *wq = malloc((size_t)OC * IC / 256 * 144);
    int8_t *xq = malloc((size_t)N * IC);
    float *xd = malloc(sizeof(float) * (size_t)N * IC / 256);
    int16_t *xs = malloc(sizeof(int16_t) * (size_t)N * IC / 32);
    q4k_quantize_rows(wq, w, OC, IC);
    q4k_dequantize_rows(wd, wq, OC, IC);
    q8k_quantize_rows(xq, xd, xs, x, N, IC);
    float *out = malloc(sizeof(float) * (size_t)N * OC), *one = malloc(sizeof(float) * (size_t)OC);
    const float *b = use_bias ? bias : NULL;
    matmul_q4k_forward(out, xq, xd, xs, wq, b, N, IC, OC);
    const int nk = IC / 256;
    double err = 0, ref = 0;
    for (int n = 0; n < N; n++) {
        matmul_q4k_forward(one, xq + (int64_t)n * IC, xd + (int64_t)n * nk, xs + (int64_t)n * nk * 8,
                           wq, b, 1, IC, OC);
        for (int o = 0; o < OC; o++) {
            float want = ref_dot(xq + (int64_t)n * IC, xd + (int64_t)n * nk, xs + (int64_t)n * nk * 8,
                                 wq + (int64_t)o * nk * 144, IC);
            if (b) want = want + b[o];
            const float got = out[(int64_t)n * OC + o];
            if (memcmp(&got, &want, sizeof got) != 0)
                fail_msg("%s N=%d IC=%d OC=%d bias=%d: out(%d, %d) = %a, want %a", level, N, IC,
                         OC, use_bias, n, o, (double)got, (double)want);
            if (memcmp(&one[o], &got, sizeof got) != 0)
                fail_msg("%s N=%d IC=%d OC=%d: row %d alone differs at %d", level, N, IC, OC, n, o);
            double f = b ? b[o] : 0.0; /* the dequantized weights times fp32 x, in double */
            for (int i = 0; i < IC; i++) f += (double)x[(int64_t)n * IC + i] * wd[(int64_t)o * IC + i];
            err = fmax(err, fabs(f - got));
            ref = fmax(ref, fabs(f));
        }
    }
    /* only the inputs' 8-bit rounding stands between them: ~1/254 of a block's max per value */
    if (err > 0.02 * ref + 1e-3)
        fail_msg("%s N=%d IC=%d OC=%d: |q4k - dequantized fp32| = %g of %g", level, N, IC, OC, err, ref);
    free(x), free(w), free(wd), free(bias), free(wq), free(xq), free(xd), free(xs), free(out), free(one);
}

static void test_matmul_contract(void **state) {
    (void)state;
    const struct { int N, IC, OC; } shapes[] = {{1, 256, 1}, {1, 512, 4}, {2, 768, 5},
                                                {3, 1024, 7}, {16, 256, 9}, {17, 512, 13},
                                                {70, 256, 3}};
    loom_isa lv[4];
    const int nl = tu_isa_levels(lv);
    for (int k = 0; k < nl; k++) {
        tu_set_isa(lv[k]);
        for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++)
            for (int bias = 0; bias < 2; bias++)
                check_shape(shapes[c].N, shapes[c].IC, shapes[c].OC, bias, 3 + c, loom_isa_name(lv[k]));
    }
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
}

static void test_matmul_threads(void **state) {
    (void)state;
    enum { N = 4, IC = 512, OC = 1030 };
    float *x = malloc(sizeof(float) * N * IC), *w = malloc(sizeof(float) * OC * IC);
    uint64_t s = 21;
    for (int i = 0; i < N * IC; i++) x[i] = tu_frand(&s);
    for (int i = 0; i < OC * IC; i++) w[i] = tu_frand(&s);
    uint8_t *wq = malloc((size_t)OC * IC / 256 * 144);
    int8_t *xq = malloc(N * IC);
    float *xd = malloc(sizeof(float) * N * IC / 256);
    int16_t *xs = malloc(sizeof(int16_t) * N * IC / 32);
    q4k_quantize_rows(wq, w, OC, IC);
    q8k_quantize_rows(xq, xd, xs, x, N, IC);
    float *o1 = malloc(sizeof(float) * N * OC), *o2 = malloc(sizeof(float) * N * OC);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    matmul_q4k_forward(o1, xq, xd, xs, wq, NULL, N, IC, OC);
    omp_set_num_threads(2);
    matmul_q4k_forward(o2, xq, xd, xs, wq, NULL, N, IC, OC);
    omp_set_num_threads(saved);
    assert_memory_equal(o1, o2, sizeof(float) * N * OC);
    free(x), free(w), free(wq), free(xq), free(xd), free(xs), free(o1), free(o2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_q8k),
        cmocka_unit_test(test_matmul_contract),
        cmocka_unit_test(test_matmul_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
