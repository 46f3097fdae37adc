/* The CUDA backend's pointwise ops (src/cuda/ops_pointwise.cu) against the cpu backend's
 * (tests/gpu/cuda_harness.h): norms, activations, RoPE, embeddings, pooling, residual, fp32
 * and bf16, at odd sizes (C not a multiple of 32, N = 1, strided rows), gradients accumulated
 * into random initial values, NULL gradients skipped. Contiguous outputs are poisoned (NaN)
 * first; strided outputs start from the same random values on both sides, so an element the
 * op misses (or one it writes but should not) differs. Tolerances (relative to 1 + |ref|):
 *   0      sums in the cpu's order (embedding backward, mean pooling) and copies;
 *   2e-7   the RoPE tables (cos/sin in double, rounded once);
 *   1e-6   rotations and the mean-pool gradient (FMA contraction);
 *   1e-5   norm outputs and input gradients (row sums in double in another order), the
 *          activations (the device's expf against kmath.h's);
 *   CU_TOL_F32 (1e-4) the weight gradients (column sums over rows in fp32, another order);
 *   CU_TOL_BF16 (1e-2) bf16 outputs (one rounding apart where fp32 noise crosses a tie). */
#include "cuda_harness.h"

#define TOL_NORM 1e-5
#define TOL_ACT 1e-5
#define TOL_ROT 1e-6
#define TOL_TAB 2e-7

static void *up_f(const float *h, int64_t n) { return cu_up(h, (size_t)n * sizeof(float)); }
static void *up_h(const uint16_t *h, int64_t n) { return cu_up(h, (size_t)n * 2); }
static float *copy_f(const float *h, int64_t n) { return cu_hdup(h, (size_t)n * sizeof(float)); }
static void dfree(void *p) { cu_dev->mem_free(p); }
static uint16_t *to_bf16(const float *x, int64_t n) {
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) h[i] = loom_bf16_round(x[i]);
    return h;
}
/* two device results of the same op equal bit for bit (results repeat) */
static void check_repeat(const char *what, const void *a, const void *b, int64_t n) {
    float *x = cu_down(a, (size_t)n * 4), *y = cu_down(b, (size_t)n * 4);
    const int same = memcmp(x, y, (size_t)n * 4) == 0;
    cu_checks++;
    if (!same) cu_failures++;
    printf("%s %s: two runs bit for bit\n", same ? "ok  " : "FAIL", what);
    free(x), free(y);
}

/* ---- LayerNorm, RMSNorm (fp32 and bf16) ----------------------------------------------- */

static void test_layernorm(int64_t N, int C) {
    char w[160];
    const float eps = 1e-5f;
    float *x = cu_rand(N * C, -2, 3), *g = cu_rand(C, 0.5f, 1.5f), *b = cu_rand(C, -1, 1);
    float *out = malloc(N * C * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    void *dx = up_f(x, N * C), *dg = up_f(g, C), *db = up_f(b, C);
    void *dout = cu_poisoned(N * C * 4), *dmean = cu_poisoned(N * 4), *drstd = cu_poisoned(N * 4);
    cu_cpu->layernorm_forward(out, mean, rstd, x, g, b, N, C, eps);
    cu_dev->layernorm_forward(dout, dmean, drstd, dx, dg, db, N, C, eps);
    snprintf(w, sizeof w, "layernorm_forward N %lld C %d: out", (long long)N, C);
    cu_check_dev_f32(w, out, dout, N * C, TOL_NORM);
    cu_check_dev_f32("  mean", mean, dmean, N, TOL_NORM);
    cu_check_dev_f32("  rstd", rstd, drstd, N, TOL_NORM);
    void *dout2 = cu_poisoned(N * C * 4);
    cu_dev->layernorm_forward(dout2, NULL, NULL, dx, dg, db, N, C, eps);
    cu_check_dev_f32("  mean, rstd NULL: out", out, dout2, N * C, TOL_NORM);

    /* backward: every gradient starts from random values; then with NULL ones */
    float *dy = cu_rand(N * C, -1, 1), *gi = cu_rand(N * C, -1, 1), *gw = cu_rand(C, -1, 1);
    float *gb = cu_rand(C, -1, 1);
    float *gi0 = copy_f(gi, N * C), *gw0 = copy_f(gw, C), *gb0 = copy_f(gb, C);
    void *ddy = up_f(dy, N * C), *dgi = up_f(gi, N * C), *dgw = up_f(gw, C), *dgb = up_f(gb, C);
    cu_cpu->layernorm_backward(gi, gw, gb, dy, x, g, mean, rstd, N, C);
    cu_dev->layernorm_backward(dgi, dgw, dgb, ddy, dx, dg, dmean, drstd, N, C);
    snprintf(w, sizeof w, "layernorm_backward N %lld C %d: dinp +=", (long long)N, C);
    cu_check_dev_f32(w, gi, dgi, N * C, TOL_NORM);
    cu_check_dev_f32("  dweight +=", gw, dgw, C, CU_TOL_F32);
    cu_check_dev_f32("  dbias +=", gb, dgb, C, CU_TOL_F32);
    /* dinp, dbias NULL: dweight alone; then dweight NULL: dbias alone */
    void *dgw2 = up_f(gw0, C), *dgb2 = up_f(gb0, C);
    memcpy(gw, gw0, C * 4), memcpy(gb, gb0, C * 4);
    cu_cpu->layernorm_backward(NULL, gw, NULL, dy, x, g, mean, rstd, N, C);
    cu_dev->layernorm_backward(NULL, dgw2, NULL, ddy, dx, dg, dmean, drstd, N, C);
    cu_check_dev_f32("  dinp, dbias NULL: dweight +=", gw, dgw2, C, CU_TOL_F32);
    cu_cpu->layernorm_backward(NULL, NULL, gb, dy, x, g, mean, rstd, N, C);
    cu_dev->layernorm_backward(NULL, NULL, dgb2, ddy, dx, dg, dmean, drstd, N, C);
    cu_check_dev_f32("  dinp, dweight NULL: dbias +=", gb, dgb2, C, CU_TOL_F32);
    /* the weight gradient repeats bit for bit */
    void *r1 = up_f(gw0, C), *r2 = up_f(gw0, C);
    cu_dev->layernorm_backward(NULL, r1, NULL, ddy, dx, dg, dmean, drstd, N, C);
    cu_dev->layernorm_backward(NULL, r2, NULL, ddy, dx, dg, dmean, drstd, N, C);
    check_repeat("  dweight", r1, r2, C);

    /* bf16: bf16 input and output, fp32 statistics and gradients; bias NULL once */
    uint16_t *xh = to_bf16(x, N * C), *oh = malloc(N * C * 2);
    void *dxh = up_h(xh, N * C), *doh = cu_poisoned(N * C * 2);
    cu_dev->mem_set(dmean, 0xff, N * 4), cu_dev->mem_set(drstd, 0xff, N * 4);
    cu_cpu->bf16_layernorm_forward(oh, mean, rstd, xh, g, b, N, C, eps);
    cu_dev->bf16_layernorm_forward(doh, dmean, drstd, dxh, dg, db, N, C, eps);
    cu_check_dev_bf16("bf16_layernorm_forward: out", oh, doh, N * C, CU_TOL_BF16);
    cu_check_dev_f32("  mean", mean, dmean, N, TOL_NORM);
    cu_check_dev_f32("  rstd", rstd, drstd, N, TOL_NORM);
    cu_dev->mem_set(doh, 0xff, N * C * 2);
    cu_cpu->bf16_layernorm_forward(oh, NULL, NULL, xh, g, NULL, N, C, eps);
    cu_dev->bf16_layernorm_forward(doh, NULL, NULL, dxh, dg, NULL, N, C, eps);
    cu_check_dev_bf16("  bias, mean, rstd NULL: out", oh, doh, N * C, CU_TOL_BF16);
    memcpy(gi, gi0, N * C * 4), memcpy(gw, gw0, C * 4), memcpy(gb, gb0, C * 4);
    cu_dev->mem_h2d(dgi, gi0, N * C * 4), cu_dev->mem_h2d(dgw, gw0, C * 4);
    cu_dev->mem_h2d(dgb, gb0, C * 4);
    cu_cpu->bf16_layernorm_backward(gi, gw, gb, dy, xh, g, mean, rstd, N, C);
    cu_dev->bf16_layernorm_backward(dgi, dgw, dgb, ddy, dxh, dg, dmean, drstd, N, C);
    cu_check_dev_f32("bf16_layernorm_backward: dinp +=", gi, dgi, N * C, TOL_NORM);
    cu_check_dev_f32("  dweight +=", gw, dgw, C, CU_TOL_F32);
    cu_check_dev_f32("  dbias +=", gb, dgb, C, CU_TOL_F32);
    cu_cpu->bf16_layernorm_backward(gi, NULL, NULL, dy, xh, g, mean, rstd, N, C);
    cu_dev->bf16_layernorm_backward(dgi, NULL, NULL, ddy, dxh, dg, dmean, drstd, N, C);
    cu_check_dev_f32("  dweight, dbias NULL: dinp +=", gi, dgi, N * C, TOL_NORM);

    free(x), free(g), free(b), free(out), free(mean), free(rstd), free(dy), free(gi), free(gw);
    free(gb), free(gi0), free(gw0), free(gb0), free(xh), free(oh);
    void *all[] = {dx, dg, db, dout, dmean, drstd, dout2, ddy, dgi, dgw, dgb, dgw2, dgb2, r1, r2,
                   dxh, doh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

static void test_rmsnorm(int64_t N, int C) {
    char w[160];
    const float eps = 1e-6f;
    float *x = cu_rand(N * C, -2, 2), *g = cu_rand(C, 0.5f, 1.5f);
    float *out = malloc(N * C * 4), *rstd = malloc(N * 4);
    void *dx = up_f(x, N * C), *dg = up_f(g, C);
    void *dout = cu_poisoned(N * C * 4), *drstd = cu_poisoned(N * 4);
    cu_cpu->rmsnorm_forward(out, rstd, x, g, N, C, eps);
    cu_dev->rmsnorm_forward(dout, drstd, dx, dg, N, C, eps);
    snprintf(w, sizeof w, "rmsnorm_forward N %lld C %d: out", (long long)N, C);
    cu_check_dev_f32(w, out, dout, N * C, TOL_NORM);
    cu_check_dev_f32("  rstd", rstd, drstd, N, TOL_NORM);

    float *dy = cu_rand(N * C, -1, 1), *gi = cu_rand(N * C, -1, 1), *gw = cu_rand(C, -1, 1);
    float *gi0 = copy_f(gi, N * C), *gw0 = copy_f(gw, C);
    void *ddy = up_f(dy, N * C), *dgi = up_f(gi, N * C), *dgw = up_f(gw, C);
    cu_cpu->rmsnorm_backward(gi, gw, dy, x, g, rstd, N, C);
    cu_dev->rmsnorm_backward(dgi, dgw, ddy, dx, dg, drstd, N, C);
    snprintf(w, sizeof w, "rmsnorm_backward N %lld C %d: dinp +=", (long long)N, C);
    cu_check_dev_f32(w, gi, dgi, N * C, TOL_NORM);
    cu_check_dev_f32("  dweight +=", gw, dgw, C, CU_TOL_F32);
    cu_cpu->rmsnorm_backward(gi, NULL, dy, x, g, rstd, N, C);
    cu_dev->rmsnorm_backward(dgi, NULL, ddy, dx, dg, drstd, N, C);
    cu_check_dev_f32("  dweight NULL: dinp +=", gi, dgi, N * C, TOL_NORM);
    cu_cpu->rmsnorm_backward(NULL, gw, dy, x, g, rstd, N, C);
    cu_dev->rmsnorm_backward(NULL, dgw, ddy, dx, dg, drstd, N, C);
    cu_check_dev_f32("  dinp NULL: dweight +=", gw, dgw, C, CU_TOL_F32);

    uint16_t *xh = to_bf16(x, N * C), *oh = malloc(N * C * 2);
    void *dxh = up_h(xh, N * C), *doh = cu_poisoned(N * C * 2);
    cu_dev->mem_set(drstd, 0xff, N * 4);
    cu_cpu->bf16_rmsnorm_forward(oh, rstd, xh, g, N, C, eps);
    cu_dev->bf16_rmsnorm_forward(doh, drstd, dxh, dg, N, C, eps);
    cu_check_dev_bf16("bf16_rmsnorm_forward: out", oh, doh, N * C, CU_TOL_BF16);
    cu_check_dev_f32("  rstd", rstd, drstd, N, TOL_NORM);
    memcpy(gi, gi0, N * C * 4), memcpy(gw, gw0, C * 4);
    cu_dev->mem_h2d(dgi, gi0, N * C * 4), cu_dev->mem_h2d(dgw, gw0, C * 4);
    cu_cpu->bf16_rmsnorm_backward(gi, gw, dy, xh, g, rstd, N, C);
    cu_dev->bf16_rmsnorm_backward(dgi, dgw, ddy, dxh, dg, drstd, N, C);
    cu_check_dev_f32("bf16_rmsnorm_backward: dinp +=", gi, dgi, N * C, TOL_NORM);
    cu_check_dev_f32("  dweight +=", gw, dgw, C, CU_TOL_F32);
    cu_cpu->bf16_rmsnorm_backward(NULL, gw, dy, xh, g, rstd, N, C);
    cu_dev->bf16_rmsnorm_backward(NULL, dgw, ddy, dxh, dg, drstd, N, C);
    cu_check_dev_f32("  dinp NULL: dweight +=", gw, dgw, C, CU_TOL_F32);

    free(x), free(g), free(out), free(rstd), free(dy), free(gi), free(gw), free(gi0), free(gw0);
    free(xh), free(oh);
    void *all[] = {dx, dg, dout, drstd, ddy, dgi, dgw, dxh, doh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

/* ---- q/k norms: per head (headnorm) and whole row (rownorm) on fused q|k|v rows --------- */

static void test_headnorm(int64_t N, int nh, int D) {
    char w[160];
    const int64_t rs = (int64_t)(nh + 3) * D + 5, sts = nh + 2; /* row and rstd strides */
    const float eps = 1e-6f;
    float *x = cu_rand(N * rs, -2, 2), *g = cu_rand(D, 0.5f, 1.5f);
    float *out = cu_rand(N * rs, -1, 1), *rstd = cu_rand(N * sts, -1, 1);
    void *dx = up_f(x, N * rs), *dg = up_f(g, D), *dout = up_f(out, N * rs);
    void *drstd = up_f(rstd, N * sts);
    cu_cpu->headnorm_forward(out, rstd, x, g, N, nh, D, rs, sts, eps);
    cu_dev->headnorm_forward(dout, drstd, dx, dg, N, nh, D, rs, sts, eps);
    snprintf(w, sizeof w, "headnorm_forward N %lld nh %d D %d (strided rows): out",
             (long long)N, nh, D);
    cu_check_dev_f32(w, out, dout, N * rs, TOL_NORM);
    cu_check_dev_f32("  rstd (strided)", rstd, drstd, N * sts, TOL_NORM);
    /* in place (out = in), rstd NULL */
    float *xi = copy_f(x, N * rs);
    void *dxi = up_f(x, N * rs);
    cu_cpu->headnorm_forward(xi, NULL, xi, g, N, nh, D, rs, sts, eps);
    cu_dev->headnorm_forward(dxi, NULL, dxi, dg, N, nh, D, rs, sts, eps);
    cu_check_dev_f32("  in place, rstd NULL", xi, dxi, N * rs, TOL_NORM);

    /* backward: din SET (the gaps keep their values), dw += */
    float *dy = cu_rand(N * rs, -1, 1), *din = cu_rand(N * rs, -1, 1), *gw = cu_rand(D, -1, 1);
    float *din0 = copy_f(din, N * rs), *gw0 = copy_f(gw, D);
    void *ddy = up_f(dy, N * rs), *ddin = up_f(din, N * rs), *dgw = up_f(gw, D);
    cu_cpu->headnorm_backward(din, gw, dy, x, g, rstd, N, nh, D, rs, sts);
    cu_dev->headnorm_backward(ddin, dgw, ddy, dx, dg, drstd, N, nh, D, rs, sts);
    cu_check_dev_f32("headnorm_backward: din =", din, ddin, N * rs, TOL_NORM);
    cu_check_dev_f32("  dw +=", gw, dgw, D, CU_TOL_F32);
    cu_dev->mem_h2d(ddin, din0, N * rs * 4);
    memcpy(din, din0, N * rs * 4);
    cu_cpu->headnorm_backward(din, NULL, dy, x, g, rstd, N, nh, D, rs, sts);
    cu_dev->headnorm_backward(ddin, NULL, ddy, dx, dg, drstd, N, nh, D, rs, sts);
    cu_check_dev_f32("  dw NULL: din =", din, ddin, N * rs, TOL_NORM);
    free(x), free(g), free(out), free(rstd), free(xi), free(dy), free(din), free(gw), free(din0);
    free(gw0);
    void *all[] = {dx, dg, dout, drstd, dxi, ddy, ddin, dgw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

/* as block.c runs it: st (N, 2) holds q's sums then its rstd (rownorm_forward's rstd = ss);
 * one part of n floats of a row of n_global */
static void test_rownorm(int64_t N, int n, int n_global) {
    char w[160];
    const int64_t rs = (int64_t)n * 2 + 9;
    const float eps = 1e-6f;
    float *x = cu_rand(N * rs, -2, 2), *g = cu_rand(n, 0.5f, 1.5f);
    float *st = cu_rand(N * 2, -1, 1), *out = cu_rand(N * rs, -1, 1);
    void *dx = up_f(x, N * rs), *dg = up_f(g, n), *dst = up_f(st, N * 2), *dout = up_f(out, N * rs);
    cu_cpu->rownorm_sums(st, 2, x, NULL, NULL, NULL, N, n, rs);
    cu_dev->rownorm_sums(dst, 2, dx, NULL, NULL, NULL, N, n, rs);
    snprintf(w, sizeof w, "rownorm_sums N %lld n %d: sum of squares", (long long)N, n);
    cu_check_dev_f32(w, st, dst, N * 2, TOL_NORM);
    /* the group's sum: another part's squares added (as the tp all-reduce would) */
    for (int64_t r = 0; r < N; r++) st[2 * r] += 0.37f * (float)(r + 1);
    cu_dev->mem_h2d(dst, st, N * 2 * 4);
    cu_cpu->rownorm_forward(out, st, x, g, st, N, n, rs, 2, n_global, eps);
    cu_dev->rownorm_forward(dout, dst, dx, dg, dst, N, n, rs, 2, n_global, eps);
    cu_check_dev_f32("rownorm_forward (rstd = ss): out", out, dout, N * rs, TOL_NORM);
    cu_check_dev_f32("  rstd", st, dst, N * 2, TOL_NORM);
    float *xi = copy_f(x, N * rs), *sti = copy_f(st, N * 2);
    void *dxi = up_f(x, N * rs);
    float *ss = cu_rand(N * 2, 5, 50);
    void *dss = up_f(ss, N * 2), *drs = up_f(sti, N * 2);
    cu_cpu->rownorm_forward(xi, sti, xi, g, ss, N, n, rs, 2, n_global, eps);
    cu_dev->rownorm_forward(dxi, drs, dxi, dg, dss, N, n, rs, 2, n_global, eps);
    cu_check_dev_f32("  in place, rstd apart from ss: out", xi, dxi, N * rs, TOL_NORM);
    cu_check_dev_f32("  rstd", sti, drs, N * 2, TOL_NORM);

    /* backward: dots (N, 2) from dy, then din SET, dw += */
    float *dy = cu_rand(N * rs, -1, 1), *dots = cu_rand(N * 2, -1, 1);
    float *din = cu_rand(N * rs, -1, 1), *gw = cu_rand(n, -1, 1);
    void *ddy = up_f(dy, N * rs), *ddots = up_f(dots, N * 2), *ddin = up_f(din, N * rs);
    void *dgw = up_f(gw, n);
    cu_cpu->rownorm_sums(dots, 2, x, dy, g, st, N, n, rs);
    cu_dev->rownorm_sums(ddots, 2, dx, ddy, dg, dst, N, n, rs);
    cu_check_dev_f32("rownorm_sums (backward's dots)", dots, ddots, N * 2, TOL_NORM);
    cu_cpu->rownorm_backward(din, gw, dy, x, g, st, dots, N, n, rs, 2, n_global);
    cu_dev->rownorm_backward(ddin, dgw, ddy, dx, dg, dst, ddots, N, n, rs, 2, n_global);
    cu_check_dev_f32("rownorm_backward: din =", din, ddin, N * rs, TOL_NORM);
    cu_check_dev_f32("  dw +=", gw, dgw, n, CU_TOL_F32);
    cu_cpu->rownorm_backward(din, NULL, dy, x, g, st, dots, N, n, rs, 2, n_global);
    cu_dev->rownorm_backward(ddin, NULL, ddy, dx, dg, dst, ddots, N, n, rs, 2, n_global);
    cu_check_dev_f32("  dw NULL: din =", din, ddin, N * rs, TOL_NORM);
    free(x), free(g), free(st), free(out), free(xi), free(sti), free(ss), free(dy), free(dots);
    free(din), free(gw);
    void *all[] = {dx, dg, dst, dout, dxi, dss, drs, ddy, ddots, ddin, dgw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

/* ---- activations ------------------------------------------------------------------------ */

static void test_gelu(int64_t n) {
    float *x = cu_rand(n, -6, 6), *out = malloc(n * 4), *dy = cu_rand(n, -1, 1);
    float *gi = cu_rand(n, -1, 1);
    void *dx = up_f(x, n), *dout = cu_poisoned(n * 4), *ddy = up_f(dy, n), *dgi = up_f(gi, n);
    cu_cpu->gelu_forward(out, x, n);
    cu_dev->gelu_forward(dout, dx, n);
    cu_check_dev_f32("gelu_forward", out, dout, n, TOL_ACT);
    cu_cpu->gelu_backward(gi, x, dy, n);
    cu_dev->gelu_backward(dgi, dx, ddy, n);
    cu_check_dev_f32("gelu_backward +=", gi, dgi, n, TOL_ACT);
    void *dset = cu_poisoned(n * 4);
    cu_cpu->gelu_backward_set(gi, x, dy, n);
    cu_dev->gelu_backward_set(dset, dx, ddy, n);
    cu_check_dev_f32("gelu_backward_set =", gi, dset, n, TOL_ACT);
    /* bf16 */
    uint16_t *xh = to_bf16(x, n), *oh = malloc(n * 2);
    void *dxh = up_h(xh, n), *doh = cu_poisoned(n * 2);
    cu_cpu->bf16_gelu_forward(oh, xh, n);
    cu_dev->bf16_gelu_forward(doh, dxh, n);
    cu_check_dev_bf16("bf16_gelu_forward", oh, doh, n, CU_TOL_BF16);
    cu_dev->mem_set(dset, 0xff, n * 4);
    cu_cpu->bf16_gelu_backward(gi, 1, xh, dy, n);
    cu_dev->bf16_gelu_backward(dset, 1, dxh, ddy, n);
    cu_check_dev_f32("bf16_gelu_backward set", gi, dset, n, TOL_ACT);
    cu_cpu->bf16_gelu_backward(gi, 0, xh, dy, n);
    cu_dev->bf16_gelu_backward(dset, 0, dxh, ddy, n);
    cu_check_dev_f32("bf16_gelu_backward +=", gi, dset, n, TOL_ACT);
    free(x), free(out), free(dy), free(gi), free(xh), free(oh);
    void *all[] = {dx, dout, ddy, dgi, dset, dxh, doh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

static void test_glu(int64_t N, int F) {
    char w[160];
    const int64_t ni = N * 2 * F, no = N * F;
    float *x = cu_rand(ni, -5, 5), *out = malloc(no * 4), *dy = cu_rand(no, -1, 1);
    float *gi = cu_rand(ni, -1, 1), *gi0 = copy_f(gi, ni);
    uint16_t *xh = to_bf16(x, ni), *oh = malloc(no * 2);
    void *dx = up_f(x, ni), *dout = cu_poisoned(no * 4), *ddy = up_f(dy, no), *dgi = up_f(gi, ni);
    void *dxh = up_h(xh, ni), *doh = cu_poisoned(no * 2);
    for (int gelu = 0; gelu <= 1; gelu++) {
        const char *nm = gelu ? "geglu" : "swiglu";
        cu_dev->mem_set(dout, 0xff, no * 4);
        (gelu ? cu_cpu->geglu_forward : cu_cpu->swiglu_forward)(out, x, N, F);
        (gelu ? cu_dev->geglu_forward : cu_dev->swiglu_forward)(dout, dx, N, F);
        snprintf(w, sizeof w, "%s_forward N %lld F %d", nm, (long long)N, F);
        cu_check_dev_f32(w, out, dout, no, TOL_ACT);
        memcpy(gi, gi0, ni * 4);
        cu_dev->mem_h2d(dgi, gi0, ni * 4);
        (gelu ? cu_cpu->geglu_backward : cu_cpu->swiglu_backward)(gi, x, dy, N, F);
        (gelu ? cu_dev->geglu_backward : cu_dev->swiglu_backward)(dgi, dx, ddy, N, F);
        snprintf(w, sizeof w, "%s_backward dinp +=", nm);
        cu_check_dev_f32(w, gi, dgi, ni, TOL_ACT);
        cu_dev->mem_set(doh, 0xff, no * 2);
        cu_cpu->bf16_glu_forward(oh, xh, N, F, gelu);
        cu_dev->bf16_glu_forward(doh, dxh, N, F, gelu);
        snprintf(w, sizeof w, "bf16_glu_forward gelu %d", gelu);
        cu_check_dev_bf16(w, oh, doh, no, CU_TOL_BF16);
        memcpy(gi, gi0, ni * 4);
        cu_dev->mem_h2d(dgi, gi0, ni * 4);
        cu_cpu->bf16_glu_backward(gi, xh, dy, N, F, gelu);
        cu_dev->bf16_glu_backward(dgi, dxh, ddy, N, F, gelu);
        snprintf(w, sizeof w, "bf16_glu_backward gelu %d dinp +=", gelu);
        cu_check_dev_f32(w, gi, dgi, ni, TOL_ACT);
    }
    free(x), free(out), free(dy), free(gi), free(gi0), free(xh), free(oh);
    void *all[] = {dx, dout, ddy, dgi, dxh, doh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

static void test_softcap_residual(int64_t n) {
    float *x = cu_rand(n, -100, 100), *y = cu_rand(n, -3, 3), *out = malloc(n * 4);
    void *dx = up_f(x, n), *dy = up_f(y, n), *dout = cu_poisoned(n * 4);
    cu_cpu->softcap_forward(x, n, 30.0f);
    cu_dev->softcap_forward(dx, n, 30.0f);
    cu_check_dev_f32("softcap_forward cap 30 (in place)", x, dx, n, TOL_ACT);
    cu_dev->mem_h2d(dx, x, n * 4); /* the residual from equal inputs */
    cu_cpu->residual_forward(out, x, y, n);
    cu_dev->residual_forward(dout, dx, dy, n);
    cu_check_dev_f32("residual_forward", out, dout, n, 0);
    cu_cpu->residual_forward(x, x, y, n);
    cu_dev->residual_forward(dx, dx, dy, n);
    cu_check_dev_f32("residual_forward out = a", x, dx, n, 0);
    uint16_t *ah = to_bf16(x, n), *bh = to_bf16(y, n), *oh = malloc(n * 2);
    void *dah = up_h(ah, n), *dbh = up_h(bh, n), *doh = cu_poisoned(n * 2);
    cu_cpu->bf16_residual_forward(oh, ah, bh, n);
    cu_dev->bf16_residual_forward(doh, dah, dbh, n);
    cu_check_dev_bf16("bf16_residual_forward", oh, doh, n, 0);
    cu_cpu->bf16_residual_forward(ah, ah, bh, n);
    cu_dev->bf16_residual_forward(dah, dah, dbh, n);
    cu_check_dev_bf16("bf16_residual_forward out = a", ah, dah, n, 0);
    free(x), free(y), free(out), free(ah), free(bh), free(oh);
    void *all[] = {dx, dy, dout, dah, dbh, doh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

/* ---- RoPE ------------------------------------------------------------------------------- */

static void test_rope(int64_t B, int T, int nh, int D, int pos0) {
    char w[160];
    const int maxT = pos0 + T + 3, half = D / 2;
    const int64_t tab = (int64_t)maxT * half;
    float *c = malloc(tab * 4), *s = malloc(tab * 4);
    void *dc = cu_poisoned(tab * 4), *ds = cu_poisoned(tab * 4);
    cu_cpu->rope_tables(c, s, maxT, D, 10000.0f);
    cu_dev->rope_tables(dc, ds, maxT, D, 10000.0f);
    snprintf(w, sizeof w, "rope_tables max_T %d D %d: cos", maxT, D);
    cu_check_dev_f32(w, c, dc, tab, TOL_TAB);
    cu_check_dev_f32("  sin", s, ds, tab, TOL_TAB);
    /* large positions: the angle t * inv_freq is formed in fp32 exactly as the cpu forms it */
    const int bigT = 4099;
    float *cb = malloc((int64_t)bigT * 4 * 4), *sb = malloc((int64_t)bigT * 4 * 4);
    void *dcb = cu_poisoned((int64_t)bigT * 4 * 4), *dsb = cu_poisoned((int64_t)bigT * 4 * 4);
    cu_cpu->rope_tables(cb, sb, bigT, 8, 500000.0f);
    cu_dev->rope_tables(dcb, dsb, bigT, 8, 500000.0f);
    cu_check_dev_f32("rope_tables max_T 4099 D 8 theta 5e5: cos", cb, dcb, (int64_t)bigT * 4,
                     TOL_TAB);
    cu_check_dev_f32("  sin", sb, dsb, (int64_t)bigT * 4, TOL_TAB);
    float *f = cu_rand(half, 0.001f, 1.0f);
    void *df = up_f(f, half);
    cu_dev->mem_set(dc, 0xff, tab * 4), cu_dev->mem_set(ds, 0xff, tab * 4);
    cu_cpu->rope_tables_freq(c, s, maxT, D, f, 1.25f);
    cu_dev->rope_tables_freq(dc, ds, maxT, D, df, 1.25f);
    cu_check_dev_f32("rope_tables_freq scale 1.25: cos", c, dc, tab, TOL_TAB);
    cu_check_dev_f32("  sin", s, ds, tab, TOL_TAB);

    /* rotate rows of stride (nh + 2) * D + 3 (the rest of each row untouched) */
    const int64_t rs = (int64_t)(nh + 2) * D + 3, n = B * T * rs;
    float *x = cu_rand(n, -2, 2);
    void *dx = up_f(x, n);
    cu_cpu->rope_forward(x, B, T, nh, D, rs, c, s, pos0);
    cu_dev->rope_forward(dx, B, T, nh, D, rs, dc, ds, pos0);
    snprintf(w, sizeof w, "rope_forward B %lld T %d nh %d D %d pos0 %d", (long long)B, T, nh, D,
             pos0);
    cu_check_dev_f32(w, x, dx, n, TOL_ROT);
    cu_cpu->rope_backward(x, B, T, nh, D, rs, c, s, pos0);
    cu_dev->rope_backward(dx, B, T, nh, D, rs, dc, ds, pos0);
    cu_check_dev_f32("rope_backward", x, dx, n, TOL_ROT);
    uint16_t *xh = to_bf16(x, n);
    void *dxh = up_h(xh, n);
    cu_cpu->bf16_rope_forward(xh, B, T, nh, D, rs, c, s, pos0);
    cu_dev->bf16_rope_forward(dxh, B, T, nh, D, rs, dc, ds, pos0);
    cu_check_dev_bf16("bf16_rope_forward", xh, dxh, n, CU_TOL_BF16);
    free(c), free(s), free(cb), free(sb), free(f), free(x), free(xh);
    void *all[] = {dc, ds, dcb, dsb, df, dx, dxh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

/* ---- embeddings, pooling ---------------------------------------------------------------- */

static void test_embedding(int B, int T, int C, int V, int pos0) {
    char w[160];
    const int64_t rows = (int64_t)B * T, maxT = pos0 + T + 2;
    float *wte = cu_rand((int64_t)V * C, -1, 1), *wpe = cu_rand(maxT * C, -1, 1);
    /* tokens from a few values, so rows repeat tokens (and runs of one token occur) */
    int32_t *tok = cu_rand_int(rows, 0, V);
    for (int64_t r = 0; r < rows; r += 5) tok[r] = 2 % V;
    if (rows > 3) tok[1] = tok[2] = tok[3];
    float *out = malloc(rows * C * 4);
    void *dwte = up_f(wte, (int64_t)V * C), *dwpe = up_f(wpe, maxT * C);
    void *dtok = cu_up(tok, rows * 4), *dout = cu_poisoned(rows * C * 4);
    for (int with_pe = 1; with_pe >= 0; with_pe--) {
        cu_dev->mem_set(dout, 0xff, rows * C * 4);
        cu_cpu->embedding_forward(out, tok, wte, with_pe ? wpe : NULL, B, T, C, pos0);
        cu_dev->embedding_forward(dout, dtok, dwte, with_pe ? dwpe : NULL, B, T, C, pos0);
        snprintf(w, sizeof w, "embedding_forward B %d T %d C %d V %d%s", B, T, C, V,
                 with_pe ? " +wpe" : "");
        cu_check_dev_f32(w, out, dout, rows * C, 0);
    }
    uint16_t *oh = malloc(rows * C * 2);
    void *doh = cu_poisoned(rows * C * 2);
    cu_cpu->bf16_embedding_forward(oh, tok, wte, wpe, B, T, C, pos0);
    cu_dev->bf16_embedding_forward(doh, dtok, dwte, dwpe, B, T, C, pos0);
    cu_check_dev_bf16("bf16_embedding_forward +wpe", oh, doh, rows * C, 0);
    cu_dev->mem_set(doh, 0xff, rows * C * 2);
    cu_cpu->bf16_embedding_forward(oh, tok, wte, NULL, B, T, C, pos0);
    cu_dev->bf16_embedding_forward(doh, dtok, dwte, NULL, B, T, C, pos0);
    cu_check_dev_bf16("bf16_embedding_forward", oh, doh, rows * C, 0);

    /* backward: += into random tables, in the cpu's order (bit for bit) */
    float *dy = cu_rand(rows * C, -1, 1), *gte = cu_rand((int64_t)V * C, -1, 1);
    float *gpe = cu_rand(maxT * C, -1, 1);
    float *gte0 = copy_f(gte, (int64_t)V * C), *gpe0 = copy_f(gpe, maxT * C);
    void *ddy = up_f(dy, rows * C), *dgte = up_f(gte, (int64_t)V * C), *dgpe = up_f(gpe, maxT * C);
    cu_cpu->embedding_backward(gte, gpe, dy, tok, B, T, C, pos0);
    cu_dev->embedding_backward(dgte, dgpe, ddy, dtok, B, T, C, pos0);
    cu_check_dev_f32("embedding_backward dwte +=", gte, dgte, (int64_t)V * C, 0);
    cu_check_dev_f32("  dwpe +=", gpe, dgpe, maxT * C, 0);
    cu_cpu->embedding_backward(gte, NULL, dy, tok, B, T, C, pos0);
    cu_dev->embedding_backward(dgte, NULL, ddy, dtok, B, T, C, pos0);
    cu_check_dev_f32("  dwpe NULL: dwte +=", gte, dgte, (int64_t)V * C, 0);
    cu_cpu->embedding_backward(NULL, gpe, dy, tok, B, T, C, pos0);
    cu_dev->embedding_backward(NULL, dgpe, ddy, dtok, B, T, C, pos0);
    cu_check_dev_f32("  dwte NULL: dwpe +=", gpe, dgpe, maxT * C, 0);

    /* vocab shard [v0, v0 + Vl): other tokens give zeros (+ wpe) and no gradient */
    const int v0 = V / 3, Vl = V / 2 > 1 ? V / 2 : 1;
    const float *wsh = wte + (int64_t)v0 * C;
    void *dwsh = up_f(wsh, (int64_t)Vl * C);
    for (int with_pe = 1; with_pe >= 0; with_pe--) {
        cu_dev->mem_set(dout, 0xff, rows * C * 4);
        cu_cpu->embedding_shard_forward(out, tok, wsh, v0, Vl, with_pe ? wpe : NULL, B, T, C, pos0);
        cu_dev->embedding_shard_forward(dout, dtok, dwsh, v0, Vl, with_pe ? dwpe : NULL, B, T, C,
                                        pos0);
        snprintf(w, sizeof w, "embedding_shard_forward v0 %d Vl %d%s", v0, Vl,
                 with_pe ? " +wpe" : "");
        cu_check_dev_f32(w, out, dout, rows * C, 0);
    }
    float *gsh = copy_f(gte0, (int64_t)Vl * C);
    void *dgsh = up_f(gsh, (int64_t)Vl * C);
    memcpy(gpe, gpe0, maxT * C * 4);
    cu_dev->mem_h2d(dgpe, gpe0, maxT * C * 4);
    cu_cpu->embedding_shard_backward(gsh, gpe, dy, tok, v0, Vl, B, T, C, pos0);
    cu_dev->embedding_shard_backward(dgsh, dgpe, ddy, dtok, v0, Vl, B, T, C, pos0);
    cu_check_dev_f32("embedding_shard_backward dwte +=", gsh, dgsh, (int64_t)Vl * C, 0);
    cu_check_dev_f32("  dwpe +=", gpe, dgpe, maxT * C, 0);
    free(wte), free(wpe), free(tok), free(out), free(oh), free(dy), free(gte), free(gpe);
    free(gte0), free(gpe0), free(gsh);
    void *all[] = {dwte, dwpe, dtok, dout, doh, ddy, dgte, dgpe, dwsh, dgsh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

static void test_mean_pool(int B, int T, int C) {
    char w[160];
    const int64_t n = (int64_t)B * T * C;
    float *x = cu_rand(n, -2, 2), *out = malloc((int64_t)B * C * 4);
    float *dy = cu_rand((int64_t)B * C, -1, 1), *gi = cu_rand(n, -1, 1);
    void *dx = up_f(x, n), *dout = cu_poisoned((int64_t)B * C * 4);
    void *ddy = up_f(dy, (int64_t)B * C), *dgi = up_f(gi, n);
    cu_cpu->mean_pool_forward(out, x, B, T, C);
    cu_dev->mean_pool_forward(dout, dx, B, T, C);
    snprintf(w, sizeof w, "mean_pool_forward B %d T %d C %d", B, T, C);
    cu_check_dev_f32(w, out, dout, (int64_t)B * C, 0);
    cu_cpu->mean_pool_backward(gi, dy, B, T, C);
    cu_dev->mean_pool_backward(dgi, ddy, B, T, C);
    cu_check_dev_f32("mean_pool_backward +=", gi, dgi, n, TOL_ROT);
    free(x), free(out), free(dy), free(gi);
    dfree(dx), dfree(dout), dfree(ddy), dfree(dgi);
}

/* ---- timings (the `cuda` backend, or any with LOOM_TEST_CUDA_BENCH=1): GPT-2 124M's sizes,
 * N = 8,192 rows (B 8 x T 1,024; 16 on another backend) of C = 768; effective bandwidth from
 * the bytes each op must move. Figures to tune against, not checks. The checks here: at
 * these sizes the embedding backward equals the cpu's bit for bit (uniform tokens and one
 * token everywhere, the worst case of its partitions) and the LayerNorm weight gradient
 * repeats bit for bit. */
#define BENCH_REPS 10
static double g_t0;
static void bench_start(void) {
    cu_dev->mem_sync();
    g_t0 = loom_now();
}
/* ms per call since bench_start; prints GB/s for `bytes` per call */
static void bench_stop(const char *what, double bytes) {
    cu_dev->mem_sync();
    const double ms = (loom_now() - g_t0) * 1e3 / BENCH_REPS;
    printf("time %s: %.3f ms, %.0f GB/s\n", what, ms, bytes / 1e9 / (ms * 1e-3));
}

static void bench(void) {
    const int on_gpu = !strcmp(cu_dev->name, "cuda");
    const char *env = getenv("LOOM_TEST_CUDA_BENCH");
    if (!on_gpu && !(env && !strcmp(env, "1"))) return;
    const int B = on_gpu ? 8 : 2, T = on_gpu ? 1024 : 8, C = 768, V = on_gpu ? 50257 : 300;
    const int64_t N = (int64_t)B * T, nc = N * C, F = 4 * C;
    char w[160];
    float *x = cu_rand(nc, -2, 2), *g = cu_rand(C, 0.5f, 1.5f);
    void *dx = up_f(x, nc), *dg = up_f(g, C), *db = up_f(g, C), *dy = up_f(x, nc);
    void *dout = cu_dev->mem_alloc(nc * 4, 0), *dmean = cu_dev->mem_alloc(N * 4, 0);
    void *drstd = cu_dev->mem_alloc(N * 4, 0), *dgw = cu_dev->mem_alloc(C * 4, 0);
    void *dgb = cu_dev->mem_alloc(C * 4, 0), *dxh = cu_dev->mem_alloc(nc * 2, 0);
    void *doh = cu_dev->mem_alloc(nc * 2, 0);
    cu_dev->bf16_from_f32(dxh, dx, nc);
    snprintf(w, sizeof w, "layernorm_forward N %lld C %d", (long long)N, C);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->layernorm_forward(dout, dmean, drstd, dx, dg, db, N, C, 1e-5f);
    bench_stop(w, 8.0 * nc);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->layernorm_backward(dout, dgw, dgb, dy, dx, dg, dmean, drstd, N, C);
    bench_stop("layernorm_backward (dinp +=, dweight, dbias)", 16.0 * nc);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->bf16_layernorm_forward(doh, dmean, drstd, dxh, dg, db, N, C, 1e-5f);
    bench_stop("bf16_layernorm_forward", 4.0 * nc);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->bf16_layernorm_backward(dout, dgw, dgb, dy, dxh, dg, dmean, drstd, N, C);
    bench_stop("bf16_layernorm_backward", 14.0 * nc);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++) cu_dev->rmsnorm_forward(dout, drstd, dx, dg, N, C, 1e-5f);
    bench_stop("rmsnorm_forward", 8.0 * nc);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->rmsnorm_backward(dout, dgw, dy, dx, dg, drstd, N, C);
    bench_stop("rmsnorm_backward (dinp +=, dweight)", 16.0 * nc);
    /* the weight gradient repeats at this size (many row chunks) */
    cu_dev->layernorm_forward(dout, dmean, drstd, dx, dg, db, N, C, 1e-5f);
    void *r1 = cu_dev->mem_alloc(C * 4, 0), *r2 = cu_dev->mem_alloc(C * 4, 0);
    cu_dev->layernorm_backward(NULL, r1, NULL, dy, dx, dg, dmean, drstd, N, C);
    cu_dev->layernorm_backward(NULL, r2, NULL, dy, dx, dg, dmean, drstd, N, C);
    snprintf(w, sizeof w, "layernorm_backward dweight N %lld", (long long)N);
    check_repeat(w, r1, r2, C);
    dfree(r1), dfree(r2);
    dfree(dout), dfree(doh);

    /* activations over the MLP's N x 4C, SwiGLU over N x 2F -> N x F, the residual */
    void *da = cu_dev->mem_alloc(N * F * 4, 0), *dd = cu_dev->mem_alloc(N * F * 4, 0);
    void *dgg = cu_dev->mem_alloc(N * F * 8, 0), *dgi = cu_dev->mem_alloc(N * F * 8, 0);
    cu_dev->fill_float(da, N * F, 0.3f), cu_dev->fill_float(dd, N * F, 0.1f);
    cu_dev->fill_float(dgg, 2 * N * F, 0.7f);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++) cu_dev->gelu_forward(dd, da, N * F);
    bench_stop("gelu_forward n N x 4C", 8.0 * N * F);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++) cu_dev->gelu_backward(dgi, da, dd, N * F);
    bench_stop("gelu_backward (+=)", 16.0 * N * F);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++) cu_dev->swiglu_forward(dd, dgg, N, (int)F);
    bench_stop("swiglu_forward N x 2F -> N x F", 12.0 * N * F);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++) cu_dev->swiglu_backward(dgi, dgg, dd, N, (int)F);
    bench_stop("swiglu_backward (+=)", 28.0 * N * F);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++) cu_dev->residual_forward(dd, dd, da, nc);
    bench_stop("residual_forward n N x C", 12.0 * nc);

    /* RoPE on llama-like fused rows: 12 q + 4 k heads of 64 in rows of (12 + 8) x 64 */
    const int H = 12, KVH = 4, D = 64, maxT = T;
    void *dc = cu_dev->mem_alloc((int64_t)maxT * D / 2 * 4, 0);
    void *ds = cu_dev->mem_alloc((int64_t)maxT * D / 2 * 4, 0);
    cu_dev->rope_tables(dc, ds, maxT, D, 10000.0f);
    bench_start();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->rope_forward(dgg, B, T, H + KVH, D, (int64_t)(H + 2 * KVH) * D, dc, ds, 0);
    bench_stop("rope_forward 16 heads of 64", 8.0 * N * (H + KVH) * D);
    dfree(da), dfree(dd), dfree(dgg), dfree(dgi), dfree(dc), dfree(ds);

    /* embeddings: forward, and backward against the cpu at this size */
    float *wte = cu_rand((int64_t)V * C, -1, 1), *wpe = cu_rand((int64_t)T * C, -1, 1);
    void *dwte = up_f(wte, (int64_t)V * C), *dwpe = up_f(wpe, (int64_t)T * C);
    void *demb = cu_dev->mem_alloc(nc * 4, 0);
    for (int same = 0; same <= 1; same++) {
        int32_t *tok = cu_rand_int(N, 0, V);
        if (same)
            for (int64_t r = 0; r < N; r++) tok[r] = 13;
        void *dtok = cu_up(tok, N * 4);
        if (!same) {
            bench_start();
            for (int r = 0; r < BENCH_REPS; r++)
                cu_dev->embedding_forward(demb, dtok, dwte, dwpe, B, T, C, 0);
            bench_stop("embedding_forward +wpe", 12.0 * nc);
        }
        float *gte = cu_rand((int64_t)V * C, -1, 1), *gpe = cu_rand((int64_t)T * C, -1, 1);
        void *dgte = up_f(gte, (int64_t)V * C), *dgpe = up_f(gpe, (int64_t)T * C);
        cu_cpu->embedding_backward(gte, gpe, x, tok, B, T, C, 0);
        cu_dev->embedding_backward(dgte, dgpe, dx, dtok, B, T, C, 0);
        snprintf(w, sizeof w, "embedding_backward B %d T %d C %d V %d%s: dwte", B, T, C, V,
                 same ? " (one token everywhere)" : "");
        cu_check_dev_f32(w, gte, dgte, (int64_t)V * C, 0);
        cu_check_dev_f32("  dwpe", gpe, dgpe, (int64_t)T * C, 0);
        snprintf(w, sizeof w, "embedding_backward%s (dout read)", same ? " one token" : "");
        bench_start();
        for (int r = 0; r < BENCH_REPS; r++)
            cu_dev->embedding_backward(dgte, dgpe, dx, dtok, B, T, C, 0);
        bench_stop(w, 4.0 * nc);
        free(tok), free(gte), free(gpe);
        dfree(dtok), dfree(dgte), dfree(dgpe);
    }
    free(x), free(g), free(wte), free(wpe);
    void *all[] = {dx, dg, db, dy, dmean, drstd, dgw, dgb, dxh, dwte, dwpe, demb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dfree(all[i]);
}

int main(int argc, char **argv) {
    cu_setup(argc, argv);
    test_layernorm(1, 77);
    test_layernorm(13, 96);
    test_layernorm(200, 45); /* several row chunks in the weight gradients */
    test_layernorm(3, 300);  /* rows past one unrolled trip per lane (4 x 32) and a tail */
    test_rmsnorm(1, 50);
    test_rmsnorm(9, 131);
    test_rmsnorm(150, 33);
    test_rmsnorm(2, 1000);
    test_headnorm(1, 2, 40);
    test_headnorm(11, 3, 24);
    test_headnorm(3, 2, 136);
    test_rownorm(1, 40, 64);
    test_rownorm(9, 70, 150);
    test_rownorm(4, 200, 300);
    test_gelu(1001);
    test_glu(1, 45);
    test_glu(7, 33);
    test_softcap_residual(999);
    test_rope(1, 1, 1, 2, 0);
    test_rope(2, 5, 3, 34, 4);
    test_embedding(1, 1, 33, 3, 0);
    test_embedding(2, 7, 77, 11, 3);
    test_embedding(2, 70, 300, 23, 1); /* two token tiles, three column slices */
    test_mean_pool(1, 1, 40);
    test_mean_pool(3, 5, 77);
    bench();
    return cu_finish();
}
