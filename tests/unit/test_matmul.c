/* matmul_forward / matmul_backward (src/kernels/matmul.c) on 1, 2 and 3 OpenMP threads
 * against a double-precision reference: the GEMMs go to oneDNN, split into one block of C per
 * thread (rows when M >= N, else columns, 16-aligned), so each shape below takes both splits
 * across its three products (out (N,OC), dinp (N,IC), dweight (OC,IC)), with sizes that are
 * not multiples of 16 or of the thread count, and blocks of a thread that gets nothing. The
 * backward accumulates (+=) onto nonzero gradients; bias seeded or absent; dinp NULL. dbias:
 * bitwise the in-order column sums on any thread count and vector width. */
#include "testutil.h"

#include <math.h>
#include <omp.h>

#include "loom/kernels.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
}

static float *rnd(size_t n, uint64_t *s) {
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = frand(s);
    return p;
}

/* max |got - want| / (|want| + 1) over n values, want in double */
static double maxerr(const float *got, const double *want, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / (fabs(want[i]) + 1.0);
        if (d > e || isnan(d)) e = isnan(d) ? INFINITY : d;
    }
    return e;
}

static void check_shape(int64_t N, int IC, int OC, int threads, int with_bias) {
    uint64_t s = 12345u + (uint64_t)N * 7u + (uint64_t)IC * 13u + (uint64_t)OC;
    float *x = rnd((size_t)N * IC, &s), *w = rnd((size_t)OC * IC, &s), *b = rnd((size_t)OC, &s);
    float *dy = rnd((size_t)N * OC, &s), *dx = rnd((size_t)N * IC, &s);
    float *dw = rnd((size_t)OC * IC, &s), *db = rnd((size_t)OC, &s);
    float *dw0 = malloc((size_t)OC * IC * sizeof *dw0);
    assert_non_null(dw0);
    memcpy(dw0, dw, (size_t)OC * IC * sizeof *dw0);
    float *out = malloc((size_t)N * OC * sizeof *out);
    double *ro = malloc((size_t)N * OC * sizeof *ro), *rdx = malloc((size_t)N * IC * sizeof *rdx);
    double *rdw = malloc((size_t)OC * IC * sizeof *rdw), *rdb = malloc((size_t)OC * sizeof *rdb);
    assert_true(out && ro && rdx && rdw && rdb);
    for (int64_t n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double a = with_bias ? b[o] : 0.0;
            for (int i = 0; i < IC; i++) a += (double)x[n * IC + i] * w[(int64_t)o * IC + i];
            ro[n * OC + o] = a;
        }
    for (int64_t n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double a = dx[n * IC + i];
            for (int o = 0; o < OC; o++) a += (double)dy[n * OC + o] * w[(int64_t)o * IC + i];
            rdx[n * IC + i] = a;
        }
    for (int o = 0; o < OC; o++) {
        double sb = db[o];
        for (int64_t n = 0; n < N; n++) sb += dy[n * OC + o];
        rdb[o] = sb;
        for (int i = 0; i < IC; i++) {
            double a = dw[(int64_t)o * IC + i];
            for (int64_t n = 0; n < N; n++) a += (double)dy[n * OC + o] * x[n * IC + i];
            rdw[(int64_t)o * IC + i] = a;
        }
    }
    omp_set_num_threads(threads);
    matmul_forward(out, x, w, with_bias ? b : NULL, N, IC, OC);
    matmul_backward(dx, dw, with_bias ? db : NULL, dy, x, w, N, IC, OC);
    double tol = 2e-5 * sqrt((double)(IC > N ? IC : N) + OC);
    double eo = maxerr(out, ro, (size_t)N * OC), ex = maxerr(dx, rdx, (size_t)N * IC);
    double ew = maxerr(dw, rdw, (size_t)OC * IC), eb = with_bias ? maxerr(db, rdb, OC) : 0.0;
    if (eo > tol || ex > tol || ew > tol || eb > tol)
        fail_msg("N=%lld IC=%d OC=%d threads=%d bias=%d: errors out %.2e dinp %.2e dweight "
                 "%.2e dbias %.2e > %.2e",
                 (long long)N, IC, OC, threads, with_bias, eo, ex, ew, eb, tol);
    /* dinp NULL: only dweight accumulates, here onto w */
    memcpy(dw, w, (size_t)OC * IC * sizeof *dw);
    matmul_backward(NULL, dw, NULL, dy, x, w, N, IC, OC);
    for (size_t i = 0; i < (size_t)OC * IC; i++) rdw[i] += (double)w[i] - (double)dw0[i];
    ew = maxerr(dw, rdw, (size_t)OC * IC);
    if (ew > tol)
        fail_msg("N=%lld IC=%d OC=%d threads=%d, dinp NULL: dweight error %.2e > %.2e",
                 (long long)N, IC, OC, threads, ew, tol);
    free(x), free(w), free(b), free(dy), free(dx), free(dw), free(dw0), free(db), free(out);
    free(ro), free(rdx), free(rdw), free(rdb);
}

static void test_shapes(void **state) {
    (void)state;
    static const struct {
        int64_t N;
        int IC, OC;
    } shapes[] = {
        {600, 96, 160},  /* out rows split; dinp rows; dweight (160,96) rows */
        {37, 250, 700},  /* out columns (700 > 37); dinp columns; dweight rows */
        {300, 500, 40},  /* out rows; dinp columns (500 > 300); dweight columns */
        {17, 260, 1000}, /* out columns: 3 threads over 1000 columns, 16-aligned blocks */
        {3, 5, 7},       /* below the split threshold (2^22 multiply-adds): one call */
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int t = 1; t <= 3; t++)
            for (int bias = 0; bias <= 1; bias++)
                check_shape(shapes[k].N, shapes[k].IC, shapes[k].OC, t, bias);
}

/* dbias is each column's float sum in row order, added to dbias: exactly those bits on every
 * thread count and at every kernel level this CPU runs (AVX-512, AVX2 or the plain loop: the
 * vector version follows loom_isa_active), column counts that end inside an 8- or 16-wide
 * vector and a 128- or 256-column pass included. */
static void dbias_bits(void) {
    static const int ocs[] = {1, 15, 17, 256, 300, 769, 1100};
    for (size_t k = 0; k < sizeof ocs / sizeof ocs[0]; k++) {
        const int OC = ocs[k], IC = 4;
        const int64_t N = 333;
        uint64_t s = 7u + (uint64_t)OC;
        float *x = rnd((size_t)N * IC, &s), *w = rnd((size_t)OC * IC, &s);
        float *dy = rnd((size_t)N * OC, &s), *db0 = rnd((size_t)OC, &s);
        float *want = malloc((size_t)OC * sizeof *want), *db = malloc((size_t)OC * sizeof *db);
        assert_true(want && db);
        for (int o = 0; o < OC; o++) {
            float a = 0.0f;
            for (int64_t n = 0; n < N; n++) a += dy[n * OC + o];
            want[o] = db0[o] + a;
        }
        for (int t = 1; t <= 3; t++) {
            omp_set_num_threads(t);
            memcpy(db, db0, (size_t)OC * sizeof *db);
            matmul_backward(NULL, NULL, db, dy, x, w, N, IC, OC);
            for (int o = 0; o < OC; o++)
                if (memcmp(&db[o], &want[o], sizeof(float)) != 0)
                    fail_msg("OC=%d threads=%d: dbias[%d] = %.9g, the in-order sum is %.9g", OC,
                             t, o, db[o], want[o]);
        }
        free(x), free(w), free(dy), free(db0), free(want), free(db);
    }
}

static void test_dbias_bits(void **state) {
    (void)state;
    const loom_isa top = loom_isa_detect();
    if (top == LOOM_ISA_NATIVE) { /* NATIVE=1: one level */
        dbias_bits();
        return;
    }
    static const loom_isa levels[] = {LOOM_ISA_BASE, LOOM_ISA_AVX2, LOOM_ISA_AVX512};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        if (levels[i] > top) continue;
        assert_int_equal(loom_isa_set(levels[i], NULL), 0);
        dbias_bits();
    }
    assert_int_equal(loom_isa_set(top, NULL), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_shapes),
                                       cmocka_unit_test(test_dbias_bits)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
