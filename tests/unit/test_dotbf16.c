/* bf16 compute's kernels (src/kernels/matmul_dotbf16.c, docs/inference.md "Compute in bf16"):
 *  - bf16_round_rows gives loom_bf16_round's bits (to nearest, ties to even, NaN stays NaN,
 *    no overflow to inf from below the largest bf16) on random, tie, special and subnormal
 *    values, at every instruction-set level;
 *  - matmul_dotbf16_forward gives bit for bit the dot products its contract defines (16 lanes
 *    over pairs of IC, per pair the odd product then the even one, each addition rounded; the
 *    tree (l, l+8), (l, l+4), (l, l+2), (l, l+1); then the bias), computed here in scalar C,
 *    for IC below, at and off multiples of 32, odd OC, 1..17 rows and prefill-sized row counts
 *    across the kernel's row chunks, with and without a bias, at every level: the portable
 *    code (x86-64, avx2) and, where the CPU has avx512_bf16, VDPBF16PS (checked to be the one
 *    that ran), so the two give the same bits;
 *  - the same on 1 and 2 threads; and a row's result does not depend on the other rows of the
 *    call (each row alone gives the same bits). */
#include "testutil.h"

#include <math.h>
#include <omp.h>

#include "loom/bf16.h"
#include "loom/kernels.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static uint16_t *rand_bf16(size_t n, uint64_t seed, float scale) {
    uint16_t *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = loom_bf16_round(frand(&seed) * scale);
    return p;
}

/* the contract, element by element */
static float ref_dot(const uint16_t *x, const uint16_t *w, int IC) {
    float lane[16] = {0};
    for (int i0 = 0; i0 < IC; i0 += 32)
        for (int l = 0; l < 16; l++) {
            const int e = i0 + 2 * l, o = e + 1;
            const float po = o < IC ? loom_bf16_widen(x[o]) * loom_bf16_widen(w[o]) : 0.0f;
            const float pe = e < IC ? loom_bf16_widen(x[e]) * loom_bf16_widen(w[e]) : 0.0f;
            lane[l] += po;
            lane[l] += pe;
        }
    for (int s = 8; s > 0; s /= 2)
        for (int l = 0; l < s; l++) lane[l] += lane[l + s];
    return lane[0];
}

static int levels(loom_isa *out) {
    const loom_isa best = loom_isa_detect();
    if (best == LOOM_ISA_NATIVE) {
        out[0] = LOOM_ISA_NATIVE;
        return 1;
    }
    int n = 0;
    const loom_isa all[] = {LOOM_ISA_BASE, LOOM_ISA_AVX2, LOOM_ISA_AVX512};
    for (int i = 0; i < 3; i++)
        if (all[i] <= best) out[n++] = all[i];
    return n;
}

static void set_level(loom_isa lv) {
    if (lv == LOOM_ISA_NATIVE) return;
    loom_err err;
    if (loom_isa_set(lv, &err) != 0) fail_msg("loom_isa_set: %s", err.msg);
}

static void test_round(void **state) {
    (void)state;
    enum { n = 1000 };
    float x[n];
    uint64_t s = 5;
    for (int i = 0; i < n; i++) x[i] = frand(&s) * powf(2.0f, (float)(i % 60) - 30.0f);
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 0.0f,
                             -0.0f, INFINITY, -INFINITY, NAN, 3.0e38f, -3.3e38f, 0x1p-130f,
                             -0x1.fffp-127f, 0x1.01p-149f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) x[3 * i + 1] = special[i];
    loom_isa lv[4];
    const int nl = levels(lv);
    for (int k = 0; k < nl; k++) {
        set_level(lv[k]);
        uint16_t h[n];
        for (int len = 0; len <= n; len += len < 40 ? 1 : 480) {
            memset(h, 0xAB, sizeof h);
            bf16_round_rows(h, x, len);
            for (int i = 0; i < len; i++)
                if (h[i] != loom_bf16_round(x[i]))
                    fail_msg("%s n=%d: bf16(%a) = 0x%04x, want 0x%04x", loom_isa_name(lv[k]), len,
                             (double)x[i], h[i], loom_bf16_round(x[i]));
            for (int i = len; i < n; i++)
                if (h[i] != 0xABAB) fail_msg("n=%d: wrote past the end (%d)", len, i);
        }
    }
    assert_true(isnan(loom_bf16_widen(loom_bf16_round(NAN))));
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
}

static void check_shape(int N, int IC, int OC, int use_bias, const char *level) {
    uint16_t *x = rand_bf16((size_t)N * IC, 100 + (uint64_t)N * 7 + (uint64_t)IC, 2.0f);
    uint16_t *w = rand_bf16((size_t)OC * IC, 200 + (uint64_t)OC + (uint64_t)IC, 0.5f);
    uint64_t s = 300 + (uint64_t)OC;
    float *bias = NULL;
    if (use_bias) {
        bias = malloc((size_t)OC * sizeof *bias);
        for (int o = 0; o < OC; o++) bias[o] = frand(&s);
    }
    if (N > 2) x[IC] = x[IC + 1] = 0; /* some zeros and an exact cancellation */
    if (IC >= 2 && OC > 1) { /* row 0 x weight row 1: its first pair cancels exactly */
        w[IC] = (uint16_t)(w[IC + 1] ^ 0x8000);
        x[0] = x[1];
    }
    float *out = malloc((size_t)N * OC * sizeof *out), *one = malloc((size_t)OC * sizeof *one);
    matmul_dotbf16_forward(out, x, w, bias, N, IC, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float want = ref_dot(x + (size_t)n * IC, w + (size_t)o * IC, IC);
            if (bias) want += bias[o];
            const float got = out[(size_t)n * OC + o];
            if (memcmp(&got, &want, sizeof got))
                fail_msg("%s N=%d IC=%d OC=%d bias=%d: out[%d,%d] = %a, the contract gives %a",
                         level, N, IC, OC, use_bias, n, o, (double)got, (double)want);
        }
    for (int n = 0; n < N; n += N > 20 ? 37 : 1) { /* a row alone: the same bits */
        matmul_dotbf16_forward(one, x + (size_t)n * IC, w, bias, 1, IC, OC);
        if (memcmp(one, out + (size_t)n * OC, (size_t)OC * sizeof *one))
            fail_msg("%s N=%d IC=%d OC=%d: row %d alone differs", level, N, IC, OC, n);
    }
    free(x);
    free(w);
    free(bias);
    free(out);
    free(one);
}

static void test_matmul_contract(void **state) {
    (void)state;
    loom_isa lv[4];
    const int nl = levels(lv);
    int ran_vdp = 0;
    for (int k = 0; k < nl; k++) {
        set_level(lv[k]);
        const int vdp = matmul_dotbf16_vdp();
        ran_vdp |= vdp;
        char name[64];
        snprintf(name, sizeof name, "%s (%s)", loom_isa_name(lv[k]),
                 vdp ? "VDPBF16PS" : "portable");
        if (lv[k] == LOOM_ISA_BASE || lv[k] == LOOM_ISA_AVX2) assert_int_equal(vdp, 0);
        const int ICs[] = {1, 2, 7, 31, 32, 33, 64, 95, 130};
        const int OCs[] = {1, 3, 4, 5, 13};
        for (int N = 1; N <= 17; N++)
            for (size_t a = 0; a < sizeof ICs / sizeof *ICs; a++)
                check_shape(N, ICs[a], OCs[(N + a) % 5], (N + (int)a) % 2, name);
        check_shape(40, 200, 37, 1, name);
        check_shape(100, 3001, 9, 1, name); /* rows in chunks of 40 (3001 bf16 each) */
    }
#if defined(__x86_64__) && !defined(LOOM_NATIVE)
    __builtin_cpu_init();
    if (loom_isa_detect() == LOOM_ISA_AVX512 && __builtin_cpu_supports("avx512bf16"))
        assert_true(ran_vdp); /* this CPU has it: the avx512 level ran VDPBF16PS */
#endif
    print_message("VDPBF16PS %s\n", ran_vdp ? "tested against the contract" : "not on this CPU");
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
}

static void test_matmul_threads(void **state) {
    (void)state;
    enum { N = 16, IC = 300, OC = 257 };
    uint16_t *x = rand_bf16((size_t)N * IC, 1, 1.0f), *w = rand_bf16((size_t)OC * IC, 2, 1.0f);
    float *o1 = malloc(sizeof(float) * N * OC), *o2 = malloc(sizeof(float) * N * OC);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    matmul_dotbf16_forward(o1, x, w, NULL, N, IC, OC);
    omp_set_num_threads(2);
    matmul_dotbf16_forward(o2, x, w, NULL, N, IC, OC);
    omp_set_num_threads(saved);
    assert_memory_equal(o1, o2, sizeof(float) * N * OC);
    free(x);
    free(w);
    free(o1);
    free(o2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round),
        cmocka_unit_test(test_matmul_contract),
        cmocka_unit_test(test_matmul_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
