/* The CUDA backend's inference weight-format ops against the cpu backend's
 * (tests/gpu/cuda_harness.h, src/cuda/ops_infer.cu):
 *  - the quantizers (Q8_0, Q4_K, the Q4_K inputs' int8 rows) write the cpu's bytes exactly,
 *    over edge cases (zero, constant, all-positive and signed-zero sub-blocks, fp16 subnormal
 *    and overflowing scales, inf and NaN values); the dequantizers the cpu's bits;
 *  - the two quantized products keep the cpu's contract (its chains, its tree): the cpu's
 *    bits, on operands the cpu quantized;
 *  - matmul_bf16_forward (fp32 products of the widened weights, summed in another order) and
 *    matmul_dotbf16_forward (bf16 x bf16, exact products, fp32 sums in cuBLASLt's order
 *    against the cpu's one chain over the pairs): within CU_TOL_F32 = 1e-4 of the cpu, relative
 *    to 1 + |ref|, at these widths (IC <= 520, |x|, |w| <= 1);
 *  - the dotbf16 layouts are the backend's own: a packed row unpacked, and the rounded rows,
 *    equal the cpu's values exactly. */
#include "cuda_harness.h"

#include "loom/fp16.h"

/* the device's n bytes at d equal the host's at ref */
static int check_bytes(const char *what, const void *ref, const void *d, size_t n) {
    unsigned char *g = cu_down(d, n);
    const unsigned char *r = ref;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; i++)
        if (g[i] != r[i]) {
            if (!bad) at = i;
            bad++;
        }
    cu_checks++;
    if (bad) {
        cu_failures++;
        printf("FAIL %s: %zu of %zu bytes differ; first at %zu: ref 0x%02x, got 0x%02x\n", what,
               bad, n, at, r[at], g[at]);
    } else
        printf("ok   %s (%zu bytes equal)\n", what, n);
    free(g);
    return bad ? 1 : 0;
}

/* rows of IC values with the quantizers' edge cases in some blocks of `blk` values */
static float *edge_rows(int64_t N, int IC, int blk) {
    float *x = cu_rand(N * IC, -1, 1);
    const int64_t nb = N * IC / blk;
    for (int64_t b = 0; b < nb; b++) {
        float *v = x + b * blk;
        switch (b % 9) {
        case 1: /* all zeros */
            for (int i = 0; i < blk; i++) v[i] = 0.0f;
            break;
        case 2: /* signed zeros and a positive run */
            for (int i = 0; i < blk; i++) v[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : 0.25f;
            break;
        case 3: /* all positive (the minimum clamps to 0) */
            for (int i = 0; i < blk; i++) v[i] = 0.5f + 0.5f * fabsf(v[i]);
            break;
        case 4: /* a constant */
            for (int i = 0; i < blk; i++) v[i] = -0.3f;
            break;
        case 5: /* tiny: the scale an fp16 subnormal, or 0 */
            for (int i = 0; i < blk; i++) v[i] *= i < blk / 2 ? 1e-5f : 1e-9f;
            break;
        case 6: /* large: a scale past fp16's range in Q8_0 */
            for (int i = 0; i < blk; i++) v[i] *= 1e7f;
            break;
        case 7: /* halves of the step: rounding ties */
            for (int i = 0; i < blk; i++) v[i] = (float)((i % 15) - 7) * 0.5f;
            v[0] = 127.0f;
            break;
        case 8: { /* a block maximum whose scale max / 127 is an fp16 tie (ties to even):
                   * subnormal 0.5 and 1.5 units, normal 1 + 2^-11 and 1 + 3 * 2^-11 */
            static const float amax[4] = {127 * 0x1p-25f, 381 * 0x1p-25f, 127.06201171875f,
                                          127.18603515625f};
            const float m = amax[(b / 9) % 4];
            for (int i = 0; i < blk; i++) v[i] *= 0.9f * m;
            v[blk / 2] = -m;
            break;
        }
        default: break;
        }
    }
    return x;
}

/* ---- Q8_0 ---------------------------------------------------------------------------- */

static void test_q8_format(int64_t N, int IC, int specials) {
    char what[160];
    const int nb = IC / LOOM_Q8_BLOCK;
    float *x = edge_rows(N, IC, LOOM_Q8_BLOCK);
    if (specials) { /* inf and NaN (the quantizers' out-of-range branch), a block of NaNs */
        x[3] = INFINITY;
        x[IC - 1] = NAN;
        x[IC + 5] = -INFINITY;
        for (int i = 0; i < LOOM_Q8_BLOCK; i++) x[2 * IC + i] = NAN;
    }
    int8_t *q = malloc(N * IC);
    uint16_t *d = malloc(N * nb * 2);
    float *y = malloc(N * IC * 4);
    cu_cpu->q8_quantize(q, d, x, N, IC);
    cu_cpu->q8_dequantize(y, q, d, N, IC);
    void *dx = cu_up(x, N * IC * 4), *dq = cu_poisoned(N * IC), *dd = cu_poisoned(N * nb * 2);
    void *dy = cu_poisoned(N * IC * 4);
    cu_dev->q8_quantize(dq, dd, dx, N, IC);
    snprintf(what, sizeof what, "q8_quantize N %lld IC %d%s: values", (long long)N, IC,
             specials ? " (inf, NaN)" : "");
    check_bytes(what, q, dq, N * IC);
    check_bytes("  fp16 scales", d, dd, N * nb * 2);
    /* the cpu's blocks dequantized (bits: NaN where the scale is inf and the value 0) */
    void *dq2 = cu_up(q, N * IC), *dd2 = cu_up(d, N * nb * 2);
    cu_dev->q8_dequantize(dy, dq2, dd2, N, IC);
    check_bytes("  q8_dequantize (bits)", y, dy, N * IC * 4);
    free(x), free(q), free(d), free(y);
    void *all[] = {dx, dq, dd, dy, dq2, dd2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

static void test_matmul_q8(int64_t N, int IC, int OC, int with_bias) {
    char what[160];
    const int nb = IC / LOOM_Q8_BLOCK;
    float *x = cu_rand(N * IC, -2, 2), *w = edge_rows(OC, IC, LOOM_Q8_BLOCK);
    for (int64_t i = 0; i < (int64_t)OC * IC; i++) /* finite weights of moderate size */
        if (fabsf(w[i]) > 4.0f) w[i] = 4.0f * (w[i] > 0 ? 1.0f : -1.0f);
    float *bias = with_bias ? cu_rand(OC, -1, 1) : NULL, *out = malloc(N * OC * 4);
    int8_t *xq = malloc(N * IC), *wq = malloc((int64_t)OC * IC);
    uint16_t *xd = malloc(N * nb * 2), *wd = malloc((int64_t)OC * nb * 2);
    cu_cpu->q8_quantize(xq, xd, x, N, IC);
    cu_cpu->q8_quantize(wq, wd, w, OC, IC);
    cu_cpu->matmul_q8_forward(out, xq, xd, wq, wd, bias, N, IC, OC);
    void *dxq = cu_up(xq, N * IC), *dxd = cu_up(xd, N * nb * 2);
    void *dwq = cu_up(wq, (int64_t)OC * IC), *dwd = cu_up(wd, (int64_t)OC * nb * 2);
    void *db = bias ? cu_up(bias, OC * 4) : NULL, *dout = cu_poisoned(N * OC * 4);
    cu_dev->matmul_q8_forward(dout, dxq, dxd, dwq, dwd, db, N, IC, OC);
    snprintf(what, sizeof what, "matmul_q8_forward N %lld IC %d OC %d%s: the cpu's bits",
             (long long)N, IC, OC, bias ? " +bias" : "");
    check_bytes(what, out, dout, N * OC * 4);
    free(x), free(w), free(bias), free(out), free(xq), free(wq), free(xd), free(wd);
    void *all[] = {dxq, dxd, dwq, dwd, db, dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* ---- Q4_K ---------------------------------------------------------------------------- */

static void test_q4k_format(int64_t N, int IC) {
    char what[160];
    const int nk = IC / LOOM_Q4K_BLOCK;
    const size_t nbytes = (size_t)N * nk * LOOM_Q4K_BYTES;
    float *x = edge_rows(N, IC, 32);
    /* block 0: every sub-block >= 0 (its minimums -0.0: dmin's sign is the libm's fmaxf), the
     * last one signed zeros ending +0 (no fit: its minimum -lo, lo's sign fminf's) */
    for (int i = 0; i < 256; i++) x[i] = i < 224 ? 0.1f + 0.001f * (float)i : i % 2 ? 0.0f : -0.0f;
    if (N > 1) /* row 1's block 0: every sub-block > 0 (dmin -0.0) */
        for (int i = 0; i < 256; i++) x[IC + i] = 0.2f + 0.002f * (float)i;
    uint8_t *blk = malloc(nbytes);
    float *y = malloc(N * IC * 4);
    cu_cpu->q4k_quantize(blk, x, N, IC);
    cu_cpu->q4k_dequantize(y, blk, N, IC);
    void *dx = cu_up(x, N * IC * 4), *dblk = cu_poisoned(nbytes), *dy = cu_poisoned(N * IC * 4);
    cu_dev->q4k_quantize(dblk, dx, N, IC);
    snprintf(what, sizeof what, "q4k_quantize N %lld IC %d: blocks", (long long)N, IC);
    check_bytes(what, blk, dblk, nbytes);
    void *dblk2 = cu_up(blk, nbytes);
    cu_dev->q4k_dequantize(dy, dblk2, N, IC);
    check_bytes("  q4k_dequantize (bits)", y, dy, N * IC * 4);
    free(x), free(blk), free(y);
    void *all[] = {dx, dblk, dy, dblk2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

static void test_q8k(int64_t N, int IC, int specials) {
    char what[160];
    const int nk = IC / LOOM_Q4K_BLOCK;
    float *x = edge_rows(N, IC, LOOM_Q4K_BLOCK);
    if (specials) { /* inf and NaN, a block of NaNs */
        x[7] = NAN, x[IC + 9] = INFINITY;
        for (int i = 0; i < LOOM_Q4K_BLOCK; i++) x[2 * IC + i] = NAN;
    }
    int8_t *q = malloc(N * IC);
    float *d = malloc(N * nk * 4);
    int16_t *s = malloc(N * IC / 32 * 2);
    cu_cpu->q8k_quantize(q, d, s, x, N, IC);
    void *dx = cu_up(x, N * IC * 4), *dq = cu_poisoned(N * IC), *dd = cu_poisoned(N * nk * 4);
    void *ds = cu_poisoned(N * IC / 32 * 2);
    cu_dev->q8k_quantize(dq, dd, ds, dx, N, IC);
    snprintf(what, sizeof what, "q8k_quantize N %lld IC %d%s: values", (long long)N, IC,
             specials ? " (inf, NaN)" : "");
    check_bytes(what, q, dq, N * IC);
    check_bytes("  fp32 scales (bits)", d, dd, N * nk * 4);
    check_bytes("  sub-block sums", s, ds, N * IC / 32 * 2);
    free(x), free(q), free(d), free(s);
    void *all[] = {dx, dq, dd, ds};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

static void test_matmul_q4k(int64_t N, int IC, int OC, int with_bias) {
    char what[160];
    const int nk = IC / LOOM_Q4K_BLOCK;
    const size_t wbytes = (size_t)OC * nk * LOOM_Q4K_BYTES;
    float *x = cu_rand(N * IC, -2, 2), *w = cu_rand((int64_t)OC * IC, -1, 1);
    float *bias = with_bias ? cu_rand(OC, -1, 1) : NULL, *out = malloc(N * OC * 4);
    uint8_t *wb = malloc(wbytes);
    int8_t *xq = malloc(N * IC);
    float *xd = malloc(N * nk * 4);
    int16_t *xs = malloc(N * IC / 32 * 2);
    cu_cpu->q4k_quantize(wb, w, OC, IC);
    cu_cpu->q8k_quantize(xq, xd, xs, x, N, IC);
    cu_cpu->matmul_q4k_forward(out, xq, xd, xs, wb, bias, N, IC, OC);
    void *dwb = cu_up(wb, wbytes), *dxq = cu_up(xq, N * IC), *dxd = cu_up(xd, N * nk * 4);
    void *dxs = cu_up(xs, N * IC / 32 * 2), *db = bias ? cu_up(bias, OC * 4) : NULL;
    void *dout = cu_poisoned(N * OC * 4);
    cu_dev->matmul_q4k_forward(dout, dxq, dxd, dxs, dwb, db, N, IC, OC);
    snprintf(what, sizeof what, "matmul_q4k_forward N %lld IC %d OC %d%s: the cpu's bits",
             (long long)N, IC, OC, bias ? " +bias" : "");
    check_bytes(what, out, dout, N * OC * 4);
    free(x), free(w), free(bias), free(out), free(wb), free(xq), free(xd), free(xs);
    void *all[] = {dwb, dxq, dxd, dxs, db, dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* ---- bf16 weights, bf16 compute -------------------------------------------------------- */

/* misalign: the weights one element past a 16-byte boundary (the kernel's any-alignment path) */
static void test_matmul_bf16(int64_t N, int IC, int OC, int with_bias, int misalign) {
    char what[160];
    float *x = cu_rand(N * IC, -1, 1), *bias = with_bias ? cu_rand(OC, -1, 1) : NULL;
    uint16_t *w = cu_rand_bf16((int64_t)OC * IC + 1, -1, 1);
    float *out = malloc(N * OC * 4);
    cu_cpu->matmul_bf16_forward(out, x, w + misalign, bias, N, IC, OC);
    void *dx = cu_up(x, N * IC * 4), *dw = cu_up(w, ((int64_t)OC * IC + 1) * 2);
    void *db = bias ? cu_up(bias, OC * 4) : NULL, *dout = cu_poisoned(N * OC * 4);
    cu_dev->matmul_bf16_forward(dout, dx, (const uint16_t *)dw + misalign, db, N, IC, OC);
    snprintf(what, sizeof what, "matmul_bf16_forward N %lld IC %d OC %d%s%s", (long long)N, IC,
             OC, bias ? " +bias" : "", misalign ? " (weights not 16-byte aligned)" : "");
    cu_check_dev_f32(what, out, dout, N * OC, CU_TOL_F32);
    free(x), free(bias), free(w), free(out);
    void *all[] = {dx, dw, db, dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* the cpu's activation layout (matmul_dotbf16.c): groups of 16 rows, pairs of the row's
 * elements side by side; element (r, i) of it */
static uint16_t cpu_act_at(const uint16_t *a, int IC, int64_t r, int i) {
    const int64_t P = ((int64_t)IC + 1) / 2;
    return a[(r / 16) * P * 32 + (int64_t)(i / 2) * 32 + 2 * (r % 16) + (i & 1)];
}

static void test_dotbf16(int64_t N, int IC, int OC, int with_bias) {
    char what[160];
    float *x = cu_rand(N * IC, -1, 1), *w = cu_rand((int64_t)OC * IC, -1, 1);
    float *bias = with_bias ? cu_rand(OC, -1, 1) : NULL, *out = malloc(N * OC * 4);
    x[0] = NAN; /* rounded as the cpu rounds it (a quiet NaN) */
    const int64_t cpe = cu_cpu->dotbf16_pack_elems(OC, IC), cae = cu_cpu->dotbf16_act_elems(N, IC);
    const int64_t dpe = cu_dev->dotbf16_pack_elems(OC, IC), dae = cu_dev->dotbf16_act_elems(N, IC);
    uint16_t *cw = malloc(cpe * 2), *ca = malloc(cae * 2);
    cu_cpu->dotbf16_pack(cw, w, 0, OC, IC);
    cu_cpu->bf16_round(ca, x, N, IC);
    /* rounding: every element the cpu's, zeros in the padding */
    void *dx = cu_up(x, N * IC * 4), *da = cu_poisoned(dae * 2);
    cu_dev->bf16_round(da, dx, N, IC);
    uint16_t *ga = cu_down(da, dae * 2);
    const int64_t ld = dae / (N ? N : 1);
    int64_t bad = 0;
    for (int64_t r = 0; r < N; r++)
        for (int64_t i = 0; i < ld; i++)
            bad += ga[r * ld + i] != (i < IC ? cpu_act_at(ca, IC, r, (int)i) : 0);
    cu_checks++, cu_failures += bad != 0;
    printf("%s bf16_round N %lld IC %d: the cpu's values, padding 0 (%lld differ)\n",
           bad ? "FAIL" : "ok  ", (long long)N, IC, (long long)bad);
    /* packing from fp32 and from bf16: each row unpacked equals the cpu's */
    uint16_t *wb = malloc((int64_t)OC * IC * 2);
    for (int64_t i = 0; i < (int64_t)OC * IC; i++) wb[i] = loom_bf16_round(w[i]);
    void *dw = cu_up(w, (int64_t)OC * IC * 4), *dwb = cu_up(wb, (int64_t)OC * IC * 2);
    void *dp = cu_poisoned(dpe * 2), *dp2 = cu_poisoned(dpe * 2);
    cu_dev->dotbf16_pack(dp, dw, 0, OC, IC);
    cu_dev->dotbf16_pack(dp2, dwb, 1, OC, IC);
    uint16_t *gp = cu_down(dp, dpe * 2);
    check_bytes("  dotbf16_pack from bf16 = from fp32", gp, dp2, dpe * 2);
    float *row = malloc(IC * 4);
    void *drow = cu_poisoned(IC * 4);
    for (int r = 0; r < OC; r += OC > 3 ? OC / 3 : 1) {
        cu_cpu->dotbf16_unpack_row(row, cw, OC, IC, r);
        cu_dev->dotbf16_unpack_row(drow, dp, OC, IC, r);
        snprintf(what, sizeof what, "  dotbf16_unpack_row %d of %d (IC %d)", r, OC, IC);
        check_bytes(what, row, drow, IC * 4);
    }
    /* the product, on rows without the NaN */
    x[0] = 0.5f;
    cu_cpu->bf16_round(ca, x, N, IC);
    cu_dev->mem_h2d(dx, x, N * IC * 4);
    cu_dev->bf16_round(da, dx, N, IC);
    cu_cpu->matmul_dotbf16_forward(out, ca, cw, bias, N, IC, OC);
    void *db = bias ? cu_up(bias, OC * 4) : NULL, *dout = cu_poisoned(N * OC * 4);
    cu_dev->matmul_dotbf16_forward(dout, da, dp, db, N, IC, OC);
    snprintf(what, sizeof what, "matmul_dotbf16_forward N %lld IC %d OC %d%s", (long long)N, IC,
             OC, bias ? " +bias" : "");
    cu_check_dev_f32(what, out, dout, N * OC, CU_TOL_F32);
    free(x), free(w), free(bias), free(out), free(cw), free(ca), free(ga), free(wb), free(row);
    free(gp);
    void *all[] = {dx, da, dw, dwb, dp, dp2, drow, db, dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* ---- at a model's width, and timings (the `cuda` backend, or any with
 * LOOM_TEST_CUDA_BENCH=1 at small sizes) -----------------------------------------------------
 * The checks above again at IC = 4,096 (longer chains, more slices), then each product timed
 * on a 4,096 x 4,096 matrix at decode's N = 1 and 16 and a prefill's 256: milliseconds and the
 * weight bytes a call reads per second (figures to tune against, not checks). */
static double time_ms(void (*op)(void *), void *ctx, int reps) {
    op(ctx); /* warm: the first call's set-up (cuBLASLt, the scratch) not timed */
    cu_dev->mem_sync();
    const double t0 = loom_now();
    for (int r = 0; r < reps; r++) op(ctx);
    cu_dev->mem_sync();
    return (loom_now() - t0) * 1e3 / reps;
}

typedef struct bench_ctx {
    int64_t N;
    int IC, OC;
    float *out, *x;
    uint16_t *wbf, *wpk, *xbf, *wqd, *xqd;
    int8_t *wq, *xq;
    uint8_t *w4;
    float *xkd;
    int16_t *xks;
} bench_ctx;

static void op_bf16(void *c_) {
    bench_ctx *c = c_;
    cu_dev->matmul_bf16_forward(c->out, c->x, c->wbf, NULL, c->N, c->IC, c->OC);
}
static void op_dotbf16(void *c_) {
    bench_ctx *c = c_;
    cu_dev->bf16_round(c->xbf, c->x, c->N, c->IC);
    cu_dev->matmul_dotbf16_forward(c->out, c->xbf, c->wpk, NULL, c->N, c->IC, c->OC);
}
static void op_q8(void *c_) {
    bench_ctx *c = c_;
    cu_dev->q8_quantize(c->xq, c->xqd, c->x, c->N, c->IC);
    cu_dev->matmul_q8_forward(c->out, c->xq, c->xqd, c->wq, c->wqd, NULL, c->N, c->IC, c->OC);
}
static void op_q4k(void *c_) {
    bench_ctx *c = c_;
    cu_dev->q8k_quantize(c->xq, c->xkd, c->xks, c->x, c->N, c->IC);
    cu_dev->matmul_q4k_forward(c->out, c->xq, c->xkd, c->xks, c->w4, NULL, c->N, c->IC, c->OC);
}

static void at_width_and_timed(void) {
    const int on_gpu = !strcmp(cu_dev->name, "cuda");
    const char *env = getenv("LOOM_TEST_CUDA_BENCH");
    if (!on_gpu && !(env && !strcmp(env, "1"))) return;
    const int IC = on_gpu ? 4096 : 512, OCc = on_gpu ? 256 : 8;
    test_matmul_q8(1, IC, OCc, 1);
    test_matmul_q8(16, IC, OCc, 0);
    test_q4k_format(4, IC);
    test_q8k(16, IC, 0);
    test_matmul_q4k(1, IC, OCc, 1);
    test_matmul_q4k(16, IC, OCc, 0);
    test_matmul_bf16(1, IC, OCc, 1, 0);
    test_matmul_bf16(16, IC, OCc, 0, 0);
    test_matmul_bf16(100, IC, OCc, 1, 0);
    test_dotbf16(16, IC, OCc, 1);

    bench_ctx c = {0};
    c.IC = on_gpu ? IC : 256, c.OC = on_gpu ? 4096 : 16;
    const int64_t NX = on_gpu ? 256 : 17, W = (int64_t)c.OC * c.IC;
    float *w = cu_rand(W, -1, 1), *x = cu_rand(NX * IC, -1, 1);
    float *dw = cu_up(w, W * 4);
    c.x = cu_up(x, NX * c.IC * 4);
    c.out = cu_dev->mem_alloc(NX * c.OC * 4, 0);
    c.wbf = cu_dev->mem_alloc(W * 2, 0);
    cu_dev->bf16_from_f32(c.wbf, dw, W);
    c.wpk = cu_dev->mem_alloc(cu_dev->dotbf16_pack_elems(c.OC, c.IC) * 2, 0);
    cu_dev->dotbf16_pack(c.wpk, dw, 0, c.OC, c.IC);
    c.xbf = cu_dev->mem_alloc(cu_dev->dotbf16_act_elems(NX, c.IC) * 2, 0);
    c.wq = cu_dev->mem_alloc(W, 0), c.wqd = cu_dev->mem_alloc(W / 32 * 2, 0);
    cu_dev->q8_quantize(c.wq, c.wqd, dw, c.OC, c.IC);
    c.xq = cu_dev->mem_alloc(NX * c.IC, 0), c.xqd = cu_dev->mem_alloc(NX * c.IC / 32 * 2, 0);
    c.xkd = cu_dev->mem_alloc(NX * c.IC / 256 * 4, 0);
    c.xks = cu_dev->mem_alloc(NX * c.IC / 32 * 2, 0);
    const int64_t w4b = W / 256 * LOOM_Q4K_BYTES;
    c.w4 = cu_dev->mem_alloc(w4b, 0);
    cu_dev->mem_sync();
    double t0 = loom_now();
    cu_dev->q4k_quantize(c.w4, dw, c.OC, c.IC);
    cu_dev->mem_sync();
    printf("time q4k_quantize %d x %d: %.1f ms\n", c.OC, c.IC, (loom_now() - t0) * 1e3);
    const struct {
        const char *name;
        void (*op)(void *);
        double wbytes;
    } ops[] = {{"matmul_bf16_forward", op_bf16, 2.0 * W},
               {"bf16_round + matmul_dotbf16_forward", op_dotbf16, 2.0 * W},
               {"q8_quantize + matmul_q8_forward", op_q8, W * 34.0 / 32},
               {"q8k_quantize + matmul_q4k_forward", op_q4k, (double)w4b}};
    const int64_t Ns[3] = {1, 16, NX};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        for (int i = 0; i < 3; i++) {
            c.N = Ns[i];
            const double ms = time_ms(ops[k].op, &c, on_gpu ? 20 : 1);
            printf("time %s N %lld (%d x %d): %.4f ms, weights at %.0f GB/s, %.2f TFLOP/s\n",
                   ops[k].name, (long long)c.N, c.OC, c.IC, ms, ops[k].wbytes / 1e9 / (ms * 1e-3),
                   2.0 * (double)c.N * (double)W / 1e12 / (ms * 1e-3));
        }
    free(w), free(x);
    void *all[] = {dw, c.x, c.out, c.wbf, c.wpk, c.xbf, c.wq,
                   c.wqd, c.xq, c.xqd, c.xkd, c.xks, c.w4};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

int main(int argc, char **argv) {
    cu_setup(argc, argv);
    test_q8_format(3, 96, 1);
    test_q8_format(4, 288, 1);
    test_q8_format(17, 32, 0);
    test_matmul_q8(1, 320, 13, 1);
    test_matmul_q8(3, 96, 5, 0);
    test_matmul_q8(17, 32, 6, 1);
    test_matmul_q8(3, 1056, 7, 1); /* 33 blocks: passes of 16 and a last of 1 */
    test_q4k_format(3, 512);
    test_q4k_format(1, 256);
    test_q8k(3, 512, 1);
    test_q8k(17, 256, 0);
    test_matmul_q4k(1, 1280, 9, 1);
    test_matmul_q4k(3, 256, 5, 0);
    test_matmul_q4k(17, 512, 6, 1);
    test_matmul_q4k(3, 2560, 5, 1); /* 10 blocks: passes of 8 and a last of 2 */
    test_matmul_bf16(1, 64, 40, 1, 0);
    test_matmul_bf16(3, 37, 21, 0, 0);
    test_matmul_bf16(17, 520, 19, 1, 0);
    test_matmul_bf16(2, 64, 9, 1, 1);
    test_matmul_bf16(40, 96, 50, 1, 0);
    test_dotbf16(1, 64, 21, 1);
    test_dotbf16(3, 37, 5, 0);
    test_dotbf16(17, 40, 18, 1);
    at_width_and_timed();
    return cu_finish();
}
