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
 *    call (each row alone gives the same bits).
 * bf16 mixed-precision training's kernels (training.precision bf16, src/kernels/matmul_bf16.c,
 * bf16_ops.c, adamw.c), each against a float64 reference computed on the same bf16-rounded
 * inputs, at every level (and at avx512 every GEMM path: the fp32 one on operands widened
 * exactly, whole and in small tiles (LOOM_BF16_GEMM_BUDGET: 2-D tiles and K blocks), and where
 * the CPU has avx512_bf16 oneDNN's bf16 matmul, checked to be the one that ran):
 *  - the linear's forward (bf16 and fp32 out, with and without a bias) and backward (dinp set
 *    and accumulated, dweight accumulated onto what was there, dbias): fp32 accumulation, so
 *    within 4 K 2^-24 of the sum of the terms' magnitudes (and half a bf16 ulp more for a bf16
 *    result);
 *  - layernorm / rmsnorm, GELU, SwiGLU, GeGLU, residual, RoPE, embedding forward on bf16
 *    storage (within a bf16 rounding of the float64 value) and their backwards into fp32
 *    gradients (1e-5 of the largest gradient);
 *  - flash attention over bf16 q|k|v (fp32 softmax and lse): out within a bf16 rounding, lse and
 *    dq|dk|dv within 1e-5 of the float64 attention (causal, GQA);
 *  - cross-entropy over bf16 logits: fp32 losses within 1e-6 of the float64 value, and the
 *    in-place bf16 gradient within a bf16 rounding of (softmax - onehot) * dscale;
 *  - adamw_update_bf16: the bits of adamw_update's p, m, v, and pb = round(p);
 *  - the MoE op's bf16 combine, its backward and the shared gate's backward (test_train_moe). */
#include "testutil.h"

#include <dnnl.h>

#include <math.h>
#include <omp.h>
#include <pthread.h>

#include "loom/backend.h"
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

/* ---- bf16 training ---------------------------------------------------------------------- */

static double w16(uint16_t h) { return (double)loom_bf16_widen(h); }

static void fill_bf16(uint16_t *p, size_t n, uint64_t seed, float scale) {
    for (size_t i = 0; i < n; i++) p[i] = loom_bf16_round(tu_frand(&seed) * scale);
}
static void fill_f32(float *p, size_t n, uint64_t seed, float scale) {
    for (size_t i = 0; i < n; i++) p[i] = tu_frand(&seed) * scale;
}

/* |got - ref| <= tol, tol from the magnitude of the sum's terms (fp32 accumulation of K of
 * them) and, for a bf16 result, half an ulp of bf16 more */
static void check_sum(const char *what, double got, double ref, double absterms, int K,
                      int is_bf16) {
    const double tol = 4.0 * (K + 1) * 0x1p-24 * absterms + (is_bf16 ? 0x1p-8 * fabs(ref) : 0) +
                       1e-30;
    if (!(fabs(got - ref) <= tol))
        fail_msg("%s: got %.9g, float64 %.9g (tolerance %.3g)", what, got, ref, tol);
}

static void gemm_case(const char *lvl, int N, int IC, int OC, int with_bias) {
    uint16_t *x = malloc(sizeof *x * N * IC), *w = malloc(sizeof *w * OC * IC);
    uint16_t *o16 = malloc(sizeof *o16 * N * OC), *dob = malloc(sizeof *dob * N * OC);
    float *o32 = malloc(sizeof *o32 * N * OC), *b = malloc(sizeof *b * OC);
    float *dout = malloc(sizeof *dout * N * OC), *dinp = malloc(sizeof *dinp * N * IC);
    float *dinp2 = malloc(sizeof *dinp2 * N * IC), *dw = malloc(sizeof *dw * OC * IC);
    float *db = malloc(sizeof *db * OC), *dw0 = malloc(sizeof *dw0 * OC * IC);
    float *db0 = malloc(sizeof *db0 * OC), *d0 = malloc(sizeof *d0 * N * IC);
    fill_bf16(x, (size_t)N * IC, 11 + N, 1.0f);
    fill_bf16(w, (size_t)OC * IC, 12 + IC, 0.5f);
    fill_f32(b, OC, 13, 0.3f);
    fill_f32(dout, (size_t)N * OC, 14 + OC, 1.0f);
    fill_f32(dw0, (size_t)OC * IC, 15, 0.1f);
    fill_f32(db0, OC, 16, 0.1f);
    fill_f32(d0, (size_t)N * IC, 17, 0.2f);
    const float *bias = with_bias ? b : NULL;
    bf16_matmul_forward(o16, x, w, bias, N, IC, OC);
    bf16_matmul_forward_f32(o32, x, w, bias, N, IC, OC);
    memcpy(dw, dw0, sizeof *dw * OC * IC);
    memcpy(db, db0, sizeof *db * OC);
    memcpy(dinp2, d0, sizeof *dinp2 * N * IC);
    bf16_matmul_backward(dinp, 1, dw, with_bias ? db : NULL, dout, dob, x, w, N, IC, OC);
    bf16_matmul_backward(dinp2, 0, NULL, NULL, dout, dob, x, w, N, IC, OC);
    char what[160];
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double r = bias ? bias[o] : 0.0, a = bias ? fabs(bias[o]) : 0.0;
            for (int i = 0; i < IC; i++) {
                r += w16(x[n * IC + i]) * w16(w[o * IC + i]);
                a += fabs(w16(x[n * IC + i]) * w16(w[o * IC + i]));
            }
            snprintf(what, sizeof what, "%s forward N=%d IC=%d OC=%d (%d,%d)", lvl, N, IC, OC, n, o);
            check_sum(what, w16(o16[n * OC + o]), r, a, IC, 1);
            check_sum(what, o32[n * OC + o], r, a, IC, 0);
        }
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double r = 0.0, a = 0.0;
            for (int o = 0; o < OC; o++) {
                const double t = w16(loom_bf16_round(dout[n * OC + o])) * w16(w[o * IC + i]);
                r += t;
                a += fabs(t);
            }
            snprintf(what, sizeof what, "%s dinp N=%d IC=%d OC=%d (%d,%d)", lvl, N, IC, OC, n, i);
            check_sum(what, dinp[n * IC + i], r, a, OC, 0);
            check_sum(what, dinp2[n * IC + i], r + d0[n * IC + i], a + fabs(d0[n * IC + i]), OC, 0);
        }
    for (int o = 0; o < OC; o++) {
        double rb = db0[o], ab = fabs(db0[o]);
        for (int n = 0; n < N; n++) {
            rb += dout[n * OC + o];
            ab += fabs(dout[n * OC + o]);
        }
        if (with_bias) {
            snprintf(what, sizeof what, "%s dbias N=%d OC=%d (%d)", lvl, N, OC, o);
            check_sum(what, db[o], rb, ab, N, 0);
        }
        for (int i = 0; i < IC; i++) {
            double r = dw0[o * IC + i], a = fabs(dw0[o * IC + i]);
            for (int n = 0; n < N; n++) {
                const double t = w16(loom_bf16_round(dout[n * OC + o])) * w16(x[n * IC + i]);
                r += t;
                a += fabs(t);
            }
            snprintf(what, sizeof what, "%s dweight N=%d IC=%d OC=%d (%d,%d)", lvl, N, IC, OC, o, i);
            check_sum(what, dw[o * IC + i], r, a, N, 0);
        }
    }
    free(x); free(w); free(o16); free(dob); free(o32); free(b); free(dout); free(dinp);
    free(dinp2); free(dw); free(db); free(dw0); free(db0); free(d0);
}

static void test_train_gemm(void **state) {
    (void)state;
    const struct { int N, IC, OC; } shapes[] = {{1, 1, 1}, {5, 7, 3}, {33, 70, 17}, {64, 128, 96},
                                                {130, 300, 65}, {600, 40, 24}};
    loom_isa lv[4];
    const int nl = tu_isa_levels(lv);
    for (int k = 0; k < nl; k++) {
        tu_set_isa(lv[k]);
        /* 0: the level's default, 1: fp32 path in small tiles, 2: oneDNN (avx512_bf16) */
        for (int mode = 0; mode < 3; mode++) {
            const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(); /* ONEDNN_MAX_CPU_ISA */
            const int bf16hw = lv[k] == LOOM_ISA_AVX512 && __builtin_cpu_supports("avx512bf16") &&
                               (isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
                                   (unsigned)dnnl_cpu_isa_avx512_core_bf16;
            if (mode == 2 && !bf16hw) break;
            if (mode == 1) setenv("LOOM_BF16_GEMM_BUDGET", "20000", 1);
            if (mode == 2) setenv("LOOM_BF16_GEMM", "onednn", 1);
            const int native = bf16_matmul_native();
            assert_int_equal(native, mode == 2 ? 1
                                     : mode == 1 ? native
                                                 : bf16hw && __builtin_cpu_supports("amx-bf16"));
            char lvl[64];
            snprintf(lvl, sizeof lvl, "%s %s", loom_isa_name(lv[k]),
                     native ? "onednn" : mode == 1 ? "fp32 tiles" : "fp32");
            for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++)
                for (int wb = 0; wb < 2; wb++)
                    gemm_case(lvl, shapes[c].N, shapes[c].IC, shapes[c].OC, wb);
            unsetenv("LOOM_BF16_GEMM_BUDGET");
            unsetenv("LOOM_BF16_GEMM");
        }
    }
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
}

/* Two threads running bf16 GEMMs at once (model views in threads of their own): each gets
 * what it gets alone, bit for bit. Small tiles (LOOM_BF16_GEMM_BUDGET) and two shapes make
 * every call reallocate the process's widening panel, which the other thread would otherwise
 * be reading. */
typedef struct gemm_job {
    int N, IC, OC, reps, bad;
    const uint16_t *x, *w;
    const float *want;
    float *out;
} gemm_job;
static void *gemm_job_run(void *arg) {
    gemm_job *j = arg;
    omp_set_num_threads(1);
    for (int r = 0; r < j->reps && !j->bad; r++) {
        bf16_matmul_forward_f32(j->out, j->x, j->w, NULL, j->N, j->IC, j->OC);
        j->bad = memcmp(j->out, j->want, sizeof(float) * (size_t)j->N * (size_t)j->OC) != 0;
    }
    return NULL;
}
static void test_train_gemm_concurrent(void **state) {
    (void)state;
    setenv("LOOM_BF16_GEMM_BUDGET", "20000", 1);
    gemm_job j[2] = {{.N = 40, .IC = 96, .OC = 72, .reps = 40},
                     {.N = 70, .IC = 200, .OC = 30, .reps = 40}};
    for (int t = 0; t < 2; t++) {
        j[t].x = rand_bf16((size_t)j[t].N * j[t].IC, 31 + t, 1.0f);
        j[t].w = rand_bf16((size_t)j[t].OC * j[t].IC, 41 + t, 0.5f);
        float *want = malloc(sizeof(float) * (size_t)j[t].N * j[t].OC);
        bf16_matmul_forward_f32(want, j[t].x, j[t].w, NULL, j[t].N, j[t].IC, j[t].OC);
        j[t].want = want;
        j[t].out = malloc(sizeof(float) * (size_t)j[t].N * j[t].OC);
    }
    pthread_t th[2];
    for (int t = 0; t < 2; t++) assert_int_equal(pthread_create(&th[t], NULL, gemm_job_run, &j[t]), 0);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++) {
        if (j[t].bad) fail_msg("thread %d: a bf16 GEMM beside another thread's differs from alone", t);
        free((void *)j[t].x);
        free((void *)j[t].w);
        free((void *)j[t].want);
        free(j[t].out);
    }
    unsetenv("LOOM_BF16_GEMM_BUDGET");
}

/* got (bf16) within a bf16 rounding of ref (plus fp32 noise relative to scale) */
static void check_b16(const char *what, int64_t i, uint16_t got, double ref, double scale) {
    const double tol = 0x1p-8 * fabs(ref) + 1e-6 * scale;
    if (!(fabs(w16(got) - ref) <= tol))
        fail_msg("%s [%lld]: got %.9g, float64 %.9g", what, (long long)i, w16(got), ref);
}
static void check_f32(const char *what, int64_t i, float got, double ref, double scale) {
    if (!(fabs(got - ref) <= 1e-5 * scale))
        fail_msg("%s [%lld]: got %.9g, float64 %.9g (scale %.3g)", what, (long long)i, got, ref,
                 scale);
}
static double maxabs(const double *x, int64_t n) {
    double m = 1e-30;
    for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}
static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_grad_d(double x) {
    const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}
static double silu_d(double x) { return x / (1.0 + exp(-x)); }

static void test_train_ops(void **state) {
    (void)state;
    enum { N = 37, C = 80, F = 48, NC = N * C };
    uint16_t x[NC], y[NC], x2[NC], g2[N * 2 * F], o[N * F];
    float w[C], bb[C], dy[NC], dx[NC], dw[C], db[C], mean[N], rstd[N], dyf[N * F], dg[N * 2 * F];
    double r[NC], rdx[NC], rdw[C], rdb[C], rg[N * 2 * F];
    char what[96];
    loom_isa lv[4];
    const int nl = tu_isa_levels(lv);
    for (int k = 0; k < nl; k++) {
        tu_set_isa(lv[k]);
        const char *L = loom_isa_name(lv[k]);
        fill_bf16(x, NC, 21, 2.0f);
        fill_bf16(x2, NC, 22, 1.0f);
        fill_f32(w, C, 23, 1.0f);
        fill_f32(bb, C, 24, 0.5f);
        fill_f32(dy, NC, 25, 1.0f);
        for (int norm = 0; norm < 2; norm++) { /* 0 layernorm, 1 rmsnorm */
            for (int i = 0; i < C; i++) dw[i] = db[i] = 0.25f;
            for (int i = 0; i < NC; i++) dx[i] = 0.5f;
            if (norm == 0) {
                bf16_layernorm_forward(y, mean, rstd, x, w, bb, N, C, 1e-5f);
                bf16_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
            } else {
                bf16_rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f);
                bf16_rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
            }
            for (int i = 0; i < C; i++) rdw[i] = rdb[i] = 0.25;
            for (int n = 0; n < N; n++) {
                double m = 0, v = 0;
                if (norm == 0) {
                    for (int i = 0; i < C; i++) m += w16(x[n * C + i]);
                    m /= C;
                }
                for (int i = 0; i < C; i++) v += (w16(x[n * C + i]) - m) * (w16(x[n * C + i]) - m);
                const double rs = 1.0 / sqrt(v / C + 1e-5);
                double a = 0, bsum = 0;
                for (int i = 0; i < C; i++) {
                    const double xh = (w16(x[n * C + i]) - m) * rs;
                    r[n * C + i] = xh * w[i] + (norm == 0 ? bb[i] : 0.0);
                    a += dy[n * C + i] * w[i];
                    bsum += dy[n * C + i] * w[i] * xh;
                    rdw[i] += dy[n * C + i] * xh;
                    rdb[i] += dy[n * C + i];
                }
                for (int i = 0; i < C; i++) {
                    const double xh = (w16(x[n * C + i]) - m) * rs;
                    rdx[n * C + i] = 0.5 + rs * (dy[n * C + i] * w[i] - (norm == 0 ? a / C : 0.0) -
                                                 xh * bsum / C);
                }
                check_f32(norm ? "rmsnorm rstd" : "layernorm rstd", n, rstd[n], rs, rs);
            }
            const double sr = maxabs(r, NC), sdx = maxabs(rdx, NC), sdw = maxabs(rdw, C);
            snprintf(what, sizeof what, "%s %s", L, norm ? "rmsnorm" : "layernorm");
            for (int i = 0; i < NC; i++) check_b16(what, i, y[i], r[i], sr);
            for (int i = 0; i < NC; i++) check_f32(what, i, dx[i], rdx[i], sdx);
            for (int i = 0; i < C; i++) check_f32(what, i, dw[i], rdw[i], sdw);
            if (norm == 0)
                for (int i = 0; i < C; i++) check_f32(what, i, db[i], rdb[i], maxabs(rdb, C));
        }
        /* GELU */
        bf16_gelu_forward(y, x, NC);
        for (int i = 0; i < NC; i++) r[i] = gelu_d(w16(x[i]));
        snprintf(what, sizeof what, "%s gelu", L);
        for (int i = 0; i < NC; i++) check_b16(what, i, y[i], r[i], maxabs(r, NC));
        for (int set = 0; set < 2; set++) {
            for (int i = 0; i < NC; i++) dx[i] = 0.5f;
            bf16_gelu_backward(dx, set, x, dy, NC);
            for (int i = 0; i < NC; i++) rdx[i] = (set ? 0.0 : 0.5) + gelu_grad_d(w16(x[i])) * dy[i];
            for (int i = 0; i < NC; i++) check_f32(what, i, dx[i], rdx[i], maxabs(rdx, NC));
        }
        /* SwiGLU, GeGLU: g2 (N, 2F) */
        fill_bf16(g2, N * 2 * F, 26, 3.0f);
        fill_f32(dyf, N * F, 27, 1.0f);
        for (int gl = 0; gl < 2; gl++) {
            bf16_glu_forward(o, g2, N, F, gl);
            for (int i = 0; i < N * 2 * F; i++) dg[i] = 0.5f;
            bf16_glu_backward(dg, g2, dyf, N, F, gl);
            for (int n = 0; n < N; n++)
                for (int i = 0; i < F; i++) {
                    const double gg = w16(g2[n * 2 * F + i]), u = w16(g2[n * 2 * F + F + i]);
                    const double act = gl ? gelu_d(gg) : silu_d(gg);
                    const double s = 1.0 / (1.0 + exp(-gg));
                    const double dact = gl ? gelu_grad_d(gg) : s * (1.0 + gg * (1.0 - s));
                    r[n * F + i] = act * u;
                    rg[n * 2 * F + i] = 0.5 + dyf[n * F + i] * u * dact;
                    rg[n * 2 * F + F + i] = 0.5 + dyf[n * F + i] * act;
                }
            snprintf(what, sizeof what, "%s %s", L, gl ? "geglu" : "swiglu");
            for (int i = 0; i < N * F; i++) check_b16(what, i, o[i], r[i], maxabs(r, N * F));
            for (int i = 0; i < N * 2 * F; i++) check_f32(what, i, dg[i], rg[i], maxabs(rg, N * 2 * F));
        }
        /* residual (out aliases a) */
        memcpy(y, x, sizeof y);
        bf16_residual_forward(y, y, x2, NC);
        snprintf(what, sizeof what, "%s residual", L);
        for (int i = 0; i < NC; i++) check_b16(what, i, y[i], w16(x[i]) + w16(x2[i]), 2.0);
        /* RoPE: 2 rows of T = 5 positions from pos0 = 3, nh = 2 heads of D = 8 in rows of C */
        {
            enum { T = 5, D = 8, NH = 2, MAXT = 16 };
            float cs[MAXT * D / 2], sn[MAXT * D / 2];
            rope_tables(cs, sn, MAXT, D, 10000.0f);
            memcpy(y, x, sizeof y);
            bf16_rope_forward(y, 2, T, NH, D, C, cs, sn, 3);
            snprintf(what, sizeof what, "%s rope", L);
            for (int rr = 0; rr < 2 * T; rr++) {
                const int pos = 3 + rr % T;
                for (int h = 0; h < NH; h++)
                    for (int i = 0; i < D / 2; i++) {
                        const int a = rr * C + h * D + i, b2 = a + D / 2;
                        const double ang = (double)(float)((float)pos *
                                                           (1.0f / powf(10000.0f, (float)(2 * i) / D)));
                        const double c = cos(ang), s = sin(ang);
                        check_b16(what, a, y[a], w16(x[a]) * c - w16(x[b2]) * s, 2.0);
                        check_b16(what, b2, y[b2], w16(x[b2]) * c + w16(x[a]) * s, 2.0);
                    }
                for (int i = NH * D; i < C; i++) assert_int_equal(y[rr * C + i], x[rr * C + i]);
            }
        }
        /* cross-entropy over bf16 logits: N rows of C classes, some targets ignored */
        {
            int32_t tg[N];
            float ls[N];
            for (int n = 0; n < N; n++) tg[n] = n % 7 == 3 ? -1 : (n * 13) % C;
            bf16_crossentropy_forward(ls, x, tg, N, C);
            memcpy(y, x, sizeof y);
            bf16_crossentropy_backward(y, tg, N, C, 0.25f, NULL);
            snprintf(what, sizeof what, "%s bf16 cross-entropy", L);
            for (int n = 0; n < N; n++) {
                if (tg[n] < 0) {
                    assert_true(ls[n] == 0.0f);
                    for (int i = 0; i < C; i++) assert_int_equal(y[n * C + i], 0);
                    continue;
                }
                double mx = -1e300, s = 0;
                for (int i = 0; i < C; i++) mx = w16(x[n * C + i]) > mx ? w16(x[n * C + i]) : mx;
                for (int i = 0; i < C; i++) s += exp(w16(x[n * C + i]) - mx);
                const double lref = log(s) + mx - w16(x[n * C + tg[n]]);
                check_f32(what, n, ls[n], lref, fabs(lref) / 10.0);
                for (int i = 0; i < C; i++)
                    check_b16(what, n * C + i, y[n * C + i],
                              0.25 * (exp(w16(x[n * C + i]) - mx) / s - (i == tg[n])), 0.25);
            }
            /* per-row weights: bit for bit each row's call with dscale = its weight */
            float rw[N];
            uint16_t yw[N * C], y1[C];
            for (int n = 0; n < N; n++) rw[n] = 0.125f * (float)(n % 5) - 0.2f;
            memcpy(yw, x, sizeof yw);
            bf16_crossentropy_backward(yw, tg, N, C, 9.0f, rw);
            for (int n = 0; n < N; n++) {
                memcpy(y1, x + n * C, sizeof y1);
                bf16_crossentropy_backward(y1, tg + n, 1, C, rw[n], NULL);
                assert_memory_equal(yw + n * C, y1, sizeof y1);
            }
        }
        /* embedding: wte (V, C) + wpe (maxT, C) */
        {
            enum { V = 11, B = 2, T = 4 };
            float wte[V * C], wpe[8 * C];
            int32_t tok[B * T] = {3, 0, 10, 3, 7, 7, 1, 2};
            fill_f32(wte, V * C, 28, 1.0f);
            fill_f32(wpe, 8 * C, 29, 0.1f);
            bf16_embedding_forward(y, tok, wte, wpe, B, T, C, 2);
            snprintf(what, sizeof what, "%s embedding", L);
            for (int rr = 0; rr < B * T; rr++)
                for (int i = 0; i < C; i++)
                    check_b16(what, rr * C + i, y[rr * C + i],
                              (double)wte[tok[rr] * C + i] + wpe[(2 + rr % T) * C + i], 1.0);
        }
    }
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
}

static void test_train_flash(void **state) {
    (void)state;
    enum { B = 2, T = 19, H = 4, KVH = 2, D = 16, QKV = (H + 2 * KVH) * D, HD = H * D };
    enum { N = B * T };
    uint16_t *qkv = malloc(sizeof *qkv * N * QKV), *out = malloc(sizeof *out * N * HD);
    float *lse = malloc(sizeof *lse * B * H * T), *dout = malloc(sizeof *dout * N * HD);
    float *dqkv = malloc(sizeof *dqkv * N * QKV);
    float *ws = malloc(sizeof *ws * (size_t)bf16_flash_ws_floats(B, T, H, KVH, D));
    double *ro = calloc((size_t)N * HD, sizeof *ro), *rl = calloc((size_t)B * H * T, sizeof *rl);
    double *rd = calloc((size_t)N * QKV, sizeof *rd);
    fill_bf16(qkv, (size_t)N * QKV, 31, 1.5f);
    fill_f32(dout, (size_t)N * HD, 32, 1.0f);
    /* float64 causal attention with GQA and its backward */
    const double sc = 1.0 / sqrt((double)D);
    double p[T], dp[T];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int kh = h / (H / KVH);
            for (int i = 0; i < T; i++) {
                const uint16_t *q = qkv + (b * T + i) * QKV + h * D;
                double mx = -1e300, s = 0;
                for (int j = 0; j <= i; j++) {
                    const uint16_t *kk = qkv + (b * T + j) * QKV + HD + kh * D;
                    double d = 0;
                    for (int e = 0; e < D; e++) d += w16(q[e]) * w16(kk[e]);
                    p[j] = d * sc;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= i; j++) s += exp(p[j] - mx);
                rl[(b * H + h) * T + i] = mx + log(s);
                for (int j = 0; j <= i; j++) p[j] = exp(p[j] - mx) / s;
                double *o = ro + (b * T + i) * HD + h * D;
                for (int j = 0; j <= i; j++) {
                    const uint16_t *vv = qkv + (b * T + j) * QKV + HD + KVH * D + kh * D;
                    for (int e = 0; e < D; e++) o[e] += p[j] * w16(vv[e]);
                }
                /* backward: dv += p dO, dp = dO . v, ds = p (dp - sum p dp), dq, dk */
                const float *g = dout + (b * T + i) * HD + h * D;
                double pd = 0;
                for (int j = 0; j <= i; j++) {
                    const uint16_t *vv = qkv + (b * T + j) * QKV + HD + KVH * D + kh * D;
                    dp[j] = 0;
                    for (int e = 0; e < D; e++) dp[j] += g[e] * w16(vv[e]);
                    pd += p[j] * dp[j];
                }
                for (int j = 0; j <= i; j++) {
                    const double ds = p[j] * (dp[j] - pd) * sc;
                    const uint16_t *kk = qkv + (b * T + j) * QKV + HD + kh * D;
                    double *dq = rd + (b * T + i) * QKV + h * D;
                    double *dk = rd + (b * T + j) * QKV + HD + kh * D;
                    double *dv = rd + (b * T + j) * QKV + HD + KVH * D + kh * D;
                    for (int e = 0; e < D; e++) {
                        dq[e] += ds * w16(kk[e]);
                        dk[e] += ds * w16(q[e]);
                        dv[e] += p[j] * g[e];
                    }
                }
            }
        }
    loom_isa lv[4];
    const int nl = tu_isa_levels(lv);
    char what[64];
    for (int k = 0; k < nl; k++) {
        tu_set_isa(lv[k]);
        const loom_attn_mask mask = {.causal = 1};
        assert_int_equal(bf16_flash_attention_forward(out, lse, qkv, ws, B, T, H, KVH, D, &mask), 0);
        memset(dqkv, 0xff, sizeof *dqkv * N * QKV); /* set, not accumulated: NaNs overwritten */
        assert_int_equal(bf16_flash_attention_backward(dqkv, dout, qkv, out, lse, ws, B, T, H, KVH,
                                                       D, &mask), 0);
        snprintf(what, sizeof what, "%s flash out", loom_isa_name(lv[k]));
        for (int i = 0; i < N * HD; i++) check_b16(what, i, out[i], ro[i], maxabs(ro, N * HD));
        snprintf(what, sizeof what, "%s flash lse", loom_isa_name(lv[k]));
        for (int i = 0; i < B * H * T; i++) check_f32(what, i, lse[i], rl[i], maxabs(rl, B * H * T));
        /* the backward reads the bf16 out: its rounding (2^-9 relative) reaches the gradients
         * through sum p dp, so 1e-5 of the largest gradient does not hold; 2e-3 does */
        snprintf(what, sizeof what, "%s flash dqkv", loom_isa_name(lv[k]));
        const double sd = maxabs(rd, N * QKV);
        for (int i = 0; i < N * QKV; i++)
            if (!(fabs(dqkv[i] - rd[i]) <= 2e-3 * sd))
                fail_msg("%s [%d]: got %.9g, float64 %.9g", what, i, dqkv[i], rd[i]);
    }
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
    free(qkv); free(out); free(lse); free(dout); free(dqkv); free(ws); free(ro); free(rl); free(rd);
}

static void test_train_adamw(void **state) {
    (void)state;
    enum { n = 5000 };
    float *p = malloc(sizeof *p * n), *g = malloc(sizeof *g * n), *m = malloc(sizeof *m * n);
    float *v = malloc(sizeof *v * n), *p2 = malloc(sizeof *p2 * n), *m2 = malloc(sizeof *m2 * n);
    float *v2 = malloc(sizeof *v2 * n);
    uint16_t *pb = malloc(sizeof *pb * n);
    loom_isa lv[4];
    const int nl = tu_isa_levels(lv);
    for (int k = 0; k < nl; k++) {
        tu_set_isa(lv[k]);
        fill_f32(p, n, 41, 1.0f);
        fill_f32(g, n, 42, 0.1f);
        fill_f32(m, n, 43, 0.01f);
        for (int i = 0; i < n; i++) v[i] = 0.001f * (1.0f + tu_frand(&(uint64_t){(uint64_t)i}));
        memcpy(p2, p, sizeof *p * n);
        memcpy(m2, m, sizeof *m * n);
        memcpy(v2, v, sizeof *v * n);
        for (int step = 1; step <= 3; step++) {
            adamw_update(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f);
            adamw_update_bf16(p2, pb, g, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f);
        }
        assert_memory_equal(p, p2, sizeof *p * n);
        assert_memory_equal(m, m2, sizeof *m * n);
        assert_memory_equal(v, v2, sizeof *v * n);
        for (int i = 0; i < n; i++) assert_int_equal(pb[i], loom_bf16_round(p[i]));
    }
    loom_err err;
    assert_int_equal(loom_isa_set(loom_isa_detect(), &err), 0);
    free(p); free(g); free(m); free(v); free(p2); free(m2); free(v2); free(pb);
}

/* The MoE op's bf16 kernels (backend.h "MoE", src/kernels/moe.c; compiled once, not per level),
 * against float64 on the same bf16 inputs: bf16_moe_combine (the routed experts' bf16 rows
 * times their gate weights, dropped choices skipped, plus every shared expert's bf16 output
 * times its gate or 1, in fp32, rounded once) within a bf16 rounding of the float64 sum plus
 * the fp32 accumulation's bound, with and without renormalized gate weights and gates; its
 * backward (dYB = w dy exactly as fp32 multiplies it; dw = <dy, YB> within 1e-6 relative, 0
 * for a dropped choice) and bf16_moe_gate_backward (dys = g dy; dz = <dy, ys> g (1 - g)). */
static void test_train_moe(void **state) {
    (void)state;
    enum { N = 7, E = 4, K = 2, C = 12, S = 2 };
    const loom_backend *be = loom_backend_cpu();
    float p[N * E], g[S * N], dy[N * C], dYB[N * K * C], dw[N * K], dys[N * C], dz[N];
    int32_t e[N * K], pos[N * K];
    uint16_t YB[N * K * C], ys[S * N * C], y[N * C];
    fill_f32(dy, N * C, 31, 1.0f);
    fill_f32(g, S * N, 32, 0.5f);
    for (int i = 0; i < S * N; i++) g[i] = 0.5f + 0.4f * g[i]; /* sigmoid values in (0.3, 0.7) */
    fill_bf16(YB, N * K * C, 33, 2.0f);
    fill_bf16(ys, S * N * C, 34, 1.0f);
    fill_f32(p, N * E, 35, 1.0f);
    for (int t = 0; t < N; t++) { /* probabilities: positive rows summing to 1 */
        double z = 0;
        for (int x = 0; x < E; x++) z += (p[t * E + x] = expf(p[t * E + x]));
        for (int x = 0; x < E; x++) p[t * E + x] = (float)(p[t * E + x] / z);
    }
    int rows = 0;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            e[t * K + j] = (t + 3 * j) % E; /* distinct for a token (K <= E, 3 coprime with 4) */
            pos[t * K + j] = (t * K + j) % 5 == 3 ? -1 : rows++; /* some dropped */
        }
    for (int renorm = 0; renorm < 2; renorm++)
        for (int gated = 0; gated < 2; gated++) {
            be->bf16_moe_combine(y, YB, p, e, pos, N, E, K, C, renorm, ys, gated ? g : NULL, S);
            be->bf16_moe_combine_backward(dYB, dw, dy, YB, p, e, pos, N, E, K, C, renorm);
            for (int t = 0; t < N; t++) {
                float wsum = 0.0f, w[K];
                for (int j = 0; j < K; j++) wsum += p[t * E + e[t * K + j]];
                for (int j = 0; j < K; j++)
                    w[j] = renorm ? p[t * E + e[t * K + j]] / wsum : p[t * E + e[t * K + j]];
                for (int i = 0; i < C; i++) {
                    double ref = 0, mag = 0;
                    for (int j = 0; j < K; j++) {
                        if (pos[t * K + j] < 0) continue;
                        const double v = (double)w[j] * w16(YB[pos[t * K + j] * C + i]);
                        ref += v;
                        mag += fabs(v);
                    }
                    for (int s = 0; s < S; s++) {
                        const double v =
                            (gated ? g[s * N + t] : 1.0) * w16(ys[(s * N + t) * C + i]);
                        ref += v;
                        mag += fabs(v);
                    }
                    const double got = w16(y[t * C + i]);
                    assert_true(fabs(got - ref) <=
                                ldexp(fabs(ref), -8) + 4.0 * (K + S) * ldexp(mag, -24));
                }
                for (int j = 0; j < K; j++) {
                    const int q = pos[t * K + j];
                    if (q < 0) {
                        assert_true(dw[t * K + j] == 0.0f);
                        continue;
                    }
                    double dot = 0, mag = 0;
                    for (int i = 0; i < C; i++) {
                        assert_true(dYB[q * C + i] == w[j] * dy[t * C + i]);
                        dot += (double)dy[t * C + i] * w16(YB[q * C + i]);
                        mag += fabs((double)dy[t * C + i] * w16(YB[q * C + i]));
                    }
                    assert_true(fabs(dw[t * K + j] - dot) <= 1e-6 * mag);
                }
            }
        }
    be->bf16_moe_gate_backward(dys, dz, dy, g, ys, N, C);
    for (int t = 0; t < N; t++) {
        double dot = 0, mag = 0;
        for (int i = 0; i < C; i++) {
            assert_true(dys[t * C + i] == g[t] * dy[t * C + i]);
            dot += (double)dy[t * C + i] * w16(ys[t * C + i]);
            mag += fabs((double)dy[t * C + i] * w16(ys[t * C + i]));
        }
        const double ref = dot * g[t] * (1.0 - g[t]);
        assert_true(fabs(dz[t] - ref) <= 1e-6 * mag);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round),
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_matmul_contract),
        cmocka_unit_test(test_matmul_threads),
        cmocka_unit_test(test_train_gemm),
        cmocka_unit_test(test_train_gemm_concurrent),
        cmocka_unit_test(test_train_ops),
        cmocka_unit_test(test_train_flash),
        cmocka_unit_test(test_train_adamw),
        cmocka_unit_test(test_train_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
