/* bf16 compute's kernels (src/kernels/matmul_dotbf16.c, docs/inference.md "Compute in bf16"):
 *  - bf16_round_rows puts loom_bf16_round's bits (to nearest, ties to even, NaN stays NaN, no
 *    overflow to inf from below the largest bf16) of every element at its place in the
 *    activation layout, zeros in the padding (rows to 16, IC to even), nothing past
 *    dotbf16_act_elems, at every instruction-set level;
 *  - dotbf16_pack puts each weight (rounded from fp32, or taken as bf16: the same) at its place
 *    in the weight layout, zeros in the padding, nothing past dotbf16_pack_elems, and
 *    dotbf16_unpack_row gives a row back;
 *  - matmul_dotbf16_forward gives bit for bit the dot products its contract defines (one fp32
 *    chain per output over the pairs of IC, per pair the odd product then the even one, each
 *    addition rounded; then the bias), computed here in scalar C, for IC odd and even, below,
 *    at and off multiples of 32, OC below, at and off multiples of 16 and 64, 1..17 rows and
 *    prefill-sized row counts across the kernel's passes, with and without a bias, at every
 *    level: the portable code (x86-64, avx2) and, where the CPU has avx512_bf16, VDPBF16PS
 *    (checked to be the one that ran), so the two give the same bits;
 *  - the same on 1 and 2 threads; and a row's result does not depend on the other rows of the
 *    call (each row alone gives the same bits). */
#include "testutil.h"

#include <math.h>
#include <omp.h>

#include "loom/bf16.h"
#include "loom/kernels.h"

static uint16_t *rand_bf16(size_t n, uint64_t seed, float scale) {
    uint16_t *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = loom_bf16_round(tu_frand(&seed) * scale);
    return p;
}

/* the contract, element by element: x, w rows of IC bf16 */
static float ref_dot(const uint16_t *x, const uint16_t *w, int IC) {
    float acc = 0.0f;
    for (int i = 0; i < IC; i += 2) {
        const float po = i + 1 < IC ? loom_bf16_widen(x[i + 1]) * loom_bf16_widen(w[i + 1]) : 0.0f;
        const float pe = loom_bf16_widen(x[i]) * loom_bf16_widen(w[i]);
        acc += po;
        acc += pe;
    }
    return acc;
}

/* element (r, i) of the layouts (rows in blocks of 16, pairs of IC) */
static int64_t at16(int64_t r, int64_t i, int IC) {
    const int64_t P = ((int64_t)IC + 1) / 2;
    return ((r / 16) * P + i / 2) * 32 + (r % 16) * 2 + (i & 1);
}

static uint16_t *pack_act(const uint16_t *x, int64_t N, int IC) { /* from bf16 rows */
    const int64_t n = dotbf16_act_elems(N, IC);
    uint16_t *p = calloc((size_t)n, sizeof *p);
    for (int64_t r = 0; r < N; r++)
        for (int i = 0; i < IC; i++) p[at16(r, i, IC)] = x[r * IC + i];
    return p;
}

static void test_round(void **state) {
    (void)state;
    enum { n = 1000 };
    float x[n];
    uint64_t s = 5;
    for (int i = 0; i < n; i++) x[i] = tu_frand(&s) * powf(2.0f, (float)(i % 60) - 30.0f);
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 0.0f,
                             -0.0f, INFINITY, -INFINITY, NAN, 3.0e38f, -3.3e38f, 0x1p-130f,
                             -0x1.fffp-127f, 0x1.01p-149f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) x[3 * i + 1] = special[i];
    const struct { int N, IC; } shapes[] = {{1, 1}, {1, 7}, {3, 33}, {16, 31}, {17, 40}, {5, 64},
                                            {20, 50}, {2, 333}};
    loom_isa lv[4];
    const int nl = tu_isa_levels(lv);
    for (int k = 0; k < nl; k++) {
        tu_set_isa(lv[k]);
        for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
            const int N = shapes[c].N, IC = shapes[c].IC;
            LOOM_CHECK(N * IC <= n);
            const int64_t ne = dotbf16_act_elems(N, IC);
            assert_int_equal(ne, (int64_t)((N + 15) / 16) * 16 * (IC + (IC & 1)));
            uint16_t *h = malloc((size_t)(ne + 8) * sizeof *h);
            memset(h, 0xAB, (size_t)(ne + 8) * sizeof *h);
            bf16_round_rows(h, x, N, IC);
            for (int64_t r = 0; r < (N + 15) / 16 * 16; r++)
                for (int i = 0; i < IC + (IC & 1); i++) {
                    const uint16_t want = r < N && i < IC ? loom_bf16_round(x[r * IC + i]) : 0;
                    if (h[at16(r, i, IC)] != want)
                        fail_msg("%s N=%d IC=%d: element (%lld, %d) = 0x%04x, want 0x%04x",
                                 loom_isa_name(lv[k]), N, IC, (long long)r, i, h[at16(r, i, IC)],
                                 want);
                }
            for (int i = 0; i < 8; i++)
                if (h[ne + i] != 0xABAB) fail_msg("N=%d IC=%d: wrote past the end", N, IC);
            free(h);
        }
    }
    assert_true(isnan(loom_bf16_widen(loom_bf16_round(NAN))));
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
}

static void test_pack(void **state) {
    (void)state;
    const struct { int OC, IC; } shapes[] = {{1, 1}, {5, 7}, {16, 32}, {17, 33}, {40, 3}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int OC = shapes[c].OC, IC = shapes[c].IC;
        uint64_t s = 9 + c;
        float *w = malloc((size_t)OC * IC * sizeof *w), *row = malloc((size_t)IC * sizeof *row);
        uint16_t *wh = malloc((size_t)OC * IC * sizeof *wh);
        for (int i = 0; i < OC * IC; i++) wh[i] = loom_bf16_round(w[i] = tu_frand(&s));
        const int64_t ne = dotbf16_pack_elems(OC, IC);
        assert_int_equal(ne, (int64_t)((OC + 15) / 16) * 16 * (IC + (IC & 1)));
        uint16_t *p1 = malloc((size_t)(ne + 8) * 2), *p2 = malloc((size_t)(ne + 8) * 2);
        memset(p1, 0xAB, (size_t)(ne + 8) * 2);
        memset(p2, 0xCD, (size_t)(ne + 8) * 2);
        dotbf16_pack(p1, w, 0, OC, IC);
        dotbf16_pack(p2, wh, 1, OC, IC);
        assert_memory_equal(p1, p2, (size_t)ne * 2); /* from fp32 (rounded) = from bf16 */
        for (int64_t o = 0; o < (OC + 15) / 16 * 16; o++)
            for (int i = 0; i < IC + (IC & 1); i++) {
                const uint16_t want = o < OC && i < IC ? wh[o * IC + i] : 0;
                if (p1[at16(o, i, IC)] != want)
                    fail_msg("OC=%d IC=%d: weight (%lld, %d) misplaced", OC, IC, (long long)o, i);
            }
        for (int i = 0; i < 8; i++)
            if (p1[ne + i] != 0xABAB) fail_msg("OC=%d IC=%d: packed past the end", OC, IC);
        for (int o = 0; o < OC; o++) {
            dotbf16_unpack_row(row, p1, OC, IC, o);
            for (int i = 0; i < IC; i++)
                if (row[i] != loom_bf16_widen(wh[o * IC + i]))
                    fail_msg("OC=%d IC=%d: unpacked row %d differs at %d", OC, IC, o, i);
        }
        free(w);
        free(row);
        free(wh);
        free(p1);
        free(p2);
    }
}

static void check_shape(int N, int IC, int OC, int use_bias, const char *level) {
    uint16_t *x = rand_bf16((size_t)N * IC, 100 + (uint64_t)N * 7 + (uint64_t)IC, 2.0f);
    uint16_t *w = rand_bf16((size_t)OC * IC, 200 + (uint64_t)OC + (uint64_t)IC, 0.5f);
    uint64_t s = 300 + (uint64_t)OC;
    float *bias = NULL;
    if (use_bias) {
        bias = malloc((size_t)OC * sizeof *bias);
        for (int o = 0; o < OC; o++) bias[o] = tu_frand(&s);
    }
    if (N > 2) x[IC] = x[IC + 1] = 0; /* some zeros and an exact cancellation */
    if (IC >= 2 && OC > 1) { /* row 0 x weight row 1: its first pair cancels exactly */
        w[IC] = (uint16_t)(w[IC + 1] ^ 0x8000);
        x[0] = x[1];
    }
    float *out = malloc((size_t)N * OC * sizeof *out), *one = malloc((size_t)OC * sizeof *one);
    uint16_t *xp = pack_act(x, N, IC), *wp = malloc((size_t)dotbf16_pack_elems(OC, IC) * 2);
    dotbf16_pack(wp, w, 1, OC, IC);
    matmul_dotbf16_forward(out, xp, wp, bias, N, IC, OC);
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
        uint16_t *x1 = pack_act(x + (size_t)n * IC, 1, IC);
        matmul_dotbf16_forward(one, x1, wp, bias, 1, IC, OC);
        free(x1);
        if (memcmp(one, out + (size_t)n * OC, (size_t)OC * sizeof *one))
            fail_msg("%s N=%d IC=%d OC=%d: row %d alone differs", level, N, IC, OC, n);
    }
    free(x);
    free(w);
    free(xp);
    free(wp);
    free(bias);
    free(out);
    free(one);
}

static void test_matmul_contract(void **state) {
    (void)state;
    loom_isa lv[4];
    const int nl = tu_isa_levels(lv);
    int ran_vdp = 0;
    for (int k = 0; k < nl; k++) {
        tu_set_isa(lv[k]);
        const int vdp = matmul_dotbf16_vdp();
        ran_vdp |= vdp;
        char name[64];
        snprintf(name, sizeof name, "%s (%s)", loom_isa_name(lv[k]),
                 vdp ? "VDPBF16PS" : "portable");
        if (lv[k] == LOOM_ISA_BASE || lv[k] == LOOM_ISA_AVX2) assert_int_equal(vdp, 0);
        const int ICs[] = {1, 2, 7, 31, 32, 33, 64, 95, 130};
        const int OCs[] = {1, 5, 16, 17, 33, 64, 70, 130};
        for (int N = 1; N <= 17; N++)
            for (size_t a = 0; a < sizeof ICs / sizeof *ICs; a++)
                check_shape(N, ICs[a], OCs[(N + a) % 8], (N + (int)a) % 2, name);
        check_shape(40, 200, 77, 1, name);
        check_shape(300, 45, 9, 1, name); /* 19 groups of 16 rows: two passes */
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
    uint16_t *xr = rand_bf16((size_t)N * IC, 1, 1.0f), *wr = rand_bf16((size_t)OC * IC, 2, 1.0f);
    uint16_t *x = pack_act(xr, N, IC), *w = malloc((size_t)dotbf16_pack_elems(OC, IC) * 2);
    dotbf16_pack(w, wr, 1, OC, IC);
    free(xr);
    free(wr);
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
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_matmul_contract),
        cmocka_unit_test(test_matmul_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
