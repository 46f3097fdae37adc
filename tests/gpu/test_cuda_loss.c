/* The CUDA backend's loss and optimizer ops against the cpu backend's (tests/gpu/cuda_harness.h):
 * cross-entropy over whole rows (fp32, bf16, soft-capped) and vocab shards, AdamW (fp32 and
 * with the bf16 copy), sum_squares, scale_inplace.
 * Tolerances (relative, |got - ref| <= tol (1 + |ref|)): losses and fp32 gradients 1e-6 (the
 * device sums in another order and uses CUDA's expf, the cpu loom_expf: both within 2 ulp);
 * bf16 gradients 4e-3 (one bf16 rounding of such a difference, 2^-8); AdamW 1e-5 (bit for bit
 * on cuda-emu where the cpu level has FMA: the same operations); sum_squares 1e-12 (double);
 * max, scale and target logits exact. */
#include "cuda_harness.h"

#define TOL_LOSS 1e-6
#define TOL_GRAD 1e-6
#define TOL_GRAD_BF16 4e-3
#define TOL_ADAMW 1e-5

static float *dup_f(const float *x, int64_t n) { return cu_hdup(x, (size_t)n * 4); }

/* N rows of V logits in [-6, 6): row 1 shifted by +60 (the max subtraction), and with `masked`
 * some columns -inf: every row's column (7r mod V), the first column of even rows, and row 2's
 * target column (a loss of +inf); targets in [0, V) with row 0's -1 (ignored) when N > 2 and
 * row 3's the last column */
static void ce_inputs(int64_t N, int V, int masked, float **logits, int32_t **targets) {
    float *x = cu_rand(N * V, -6, 6);
    int32_t *t = cu_rand_int(N, 0, V);
    if (N > 1)
        for (int i = 0; i < V; i++) x[V + i] += 60.0f;
    if (N > 2) t[0] = -1;
    if (N > 3) t[3] = V - 1;
    if (masked)
        for (int64_t r = 0; r < N; r++) {
            float *row = x + r * V;
            const int c = (int)((7 * r) % V);
            if (c != t[r] || r == 2) row[c] = -INFINITY;
            if (r % 2 == 0 && t[r] != 0) row[0] = -INFINITY;
            if (r == 2 && t[r] >= 0) row[t[r]] = -INFINITY;
        }
    *logits = x, *targets = t;
}

/* crossentropy_forward, _softmax_backward (dscale and rw), _softcap_backward; the same on bf16
 * logits */
static void test_ce(int64_t N, int V, int masked) {
    char what[200];
    float *x, *rw = cu_rand(N, 0.1f, 2.0f);
    int32_t *t;
    ce_inputs(N, V, masked, &x, &t);
    const size_t xb = (size_t)(N * V) * 4;
    void *dx = cu_up(x, xb), *dt = cu_up(t, N * 4), *drw = cu_up(rw, N * 4);
    float *loss = malloc(N * 4);
    void *dloss = cu_poisoned(N * 4);
    cu_cpu->crossentropy_forward(loss, x, t, N, V);
    cu_dev->crossentropy_forward(dloss, dx, dt, N, V);
    snprintf(what, sizeof what, "crossentropy_forward N %lld V %d%s", (long long)N, V,
             masked ? " (-inf columns)" : "");
    cu_check_dev_f32(what, loss, dloss, N, TOL_LOSS);

    /* backward in place, dscale 0.37 */
    float *g = dup_f(x, N * V);
    cu_cpu->crossentropy_softmax_backward(g, t, N, V, 0.37f, NULL);
    cu_dev->crossentropy_softmax_backward(dx, dt, N, V, 0.37f, NULL);
    cu_check_dev_f32("  crossentropy_softmax_backward dscale", g, dx, N * V, TOL_GRAD);
    /* per-row weights */
    memcpy(g, x, xb);
    cu_dev->mem_h2d(dx, x, xb);
    cu_cpu->crossentropy_softmax_backward(g, t, N, V, 0.37f, rw);
    cu_dev->crossentropy_softmax_backward(dx, dt, N, V, 0.37f, drw);
    cu_check_dev_f32("  crossentropy_softmax_backward rw", g, dx, N * V, TOL_GRAD);
    /* row N-1 with rw is bit for bit the call with dscale = rw[N-1] (device against device) */
    {
        const int64_t r = N - 1;
        float *got = cu_down((float *)dx + r * V, (size_t)V * 4);
        void *d1 = cu_up(x + r * V, (size_t)V * 4);
        cu_dev->crossentropy_softmax_backward(d1, (int32_t *)dt + r, 1, V, rw[r], NULL);
        cu_check_dev_f32("  rw row == dscale = rw[row] (bits)", got, d1, V, 0);
        free(got), cu_dev->mem_free(d1);
    }

    /* soft-capped logits y = cap tanh(z / cap), cap 5; rw */
    const float cap = 5.0f;
    float *y = dup_f(x, N * V);
    for (int64_t i = 0; i < N * V; i++) y[i] = cap * tanhf(y[i] / cap);
    memcpy(g, y, xb);
    cu_dev->mem_h2d(dx, y, xb);
    cu_cpu->crossentropy_softcap_backward(g, t, N, V, 0.37f, cap, rw);
    cu_dev->crossentropy_softcap_backward(dx, dt, N, V, 0.37f, cap, drw);
    cu_check_dev_f32("  crossentropy_softcap_backward cap 5, rw", g, dx, N * V, TOL_GRAD);

    /* bf16 logits */
    uint16_t *xh = malloc((size_t)(N * V) * 2);
    for (int64_t i = 0; i < N * V; i++) xh[i] = loom_bf16_round(x[i]);
    void *dxh = cu_up(xh, (size_t)(N * V) * 2);
    cu_dev->mem_set(dloss, 0xff, N * 4);
    cu_cpu->bf16_crossentropy_forward(loss, xh, t, N, V);
    cu_dev->bf16_crossentropy_forward(dloss, dxh, dt, N, V);
    cu_check_dev_f32("  bf16_crossentropy_forward", loss, dloss, N, TOL_LOSS);
    cu_cpu->bf16_crossentropy_backward(xh, t, N, V, 0.37f, NULL);
    cu_dev->bf16_crossentropy_backward(dxh, dt, N, V, 0.37f, NULL);
    cu_check_dev_bf16("  bf16_crossentropy_backward dscale", xh, dxh, N * V, TOL_GRAD_BF16);
    for (int64_t i = 0; i < N * V; i++) xh[i] = loom_bf16_round(x[i]);
    cu_dev->mem_h2d(dxh, xh, (size_t)(N * V) * 2);
    cu_cpu->bf16_crossentropy_backward(xh, t, N, V, 0.37f, rw);
    cu_dev->bf16_crossentropy_backward(dxh, dt, N, V, 0.37f, drw);
    cu_check_dev_bf16("  bf16_crossentropy_backward rw", xh, dxh, N * V, TOL_GRAD_BF16);

    free(x), free(t), free(rw), free(loss), free(g), free(y), free(xh);
    void *all[] = {dx, dt, drw, dloss, dxh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* vocab-parallel: the V = S * Vl columns split into S shards at v0 = s * Vl; each shard's
 * max, sums and backward against the cpu's on the same shard, the global max and sums
 * combined on the host as tensor parallelism's all-reduces would (cap 0: shard_backward,
 * else the soft-capped logits through shard_softcap_backward); rw on odd shards */
static void test_ce_shards(int64_t N, int Vl, int S, float cap) {
    char what[200];
    const int V = Vl * S;
    float *x, *rw = cu_rand(N, 0.1f, 2.0f);
    int32_t *t;
    ce_inputs(N, V, 0, &x, &t);
    if (cap > 0)
        for (int64_t i = 0; i < N * V; i++) x[i] = cap * tanhf(x[i] / cap);
    float *sh = malloc((size_t)(N * Vl) * 4), *mx = malloc(N * 4), *gmx = malloc(N * 4);
    float *sums = malloc(N * 8), *gsums = calloc((size_t)N * 2, 4);
    void *dsh = cu_dev->mem_alloc((size_t)(N * Vl) * 4, 0), *dt = cu_up(t, N * 4);
    void *dmx = cu_poisoned(N * 4), *dsums = cu_poisoned(N * 8), *drw = cu_up(rw, N * 4);
    for (int64_t n = 0; n < N; n++) gmx[n] = -INFINITY;
    for (int s = 0; s < S; s++) {
        for (int64_t n = 0; n < N; n++) memcpy(sh + n * Vl, x + n * V + s * Vl, (size_t)Vl * 4);
        cu_dev->mem_h2d(dsh, sh, (size_t)(N * Vl) * 4);
        cu_dev->mem_set(dmx, 0xff, N * 4);
        cu_cpu->crossentropy_shard_max(mx, sh, N, Vl);
        cu_dev->crossentropy_shard_max(dmx, dsh, N, Vl);
        snprintf(what, sizeof what, "crossentropy_shard_max N %lld Vl %d v0 %d%s", (long long)N,
                 Vl, s * Vl, cap > 0 ? " (capped logits)" : "");
        cu_check_dev_f32(what, mx, dmx, N, 0);
        for (int64_t n = 0; n < N; n++) gmx[n] = mx[n] > gmx[n] ? mx[n] : gmx[n];
    }
    cu_dev->mem_h2d(dmx, gmx, N * 4);
    for (int s = 0; s < S; s++) {
        for (int64_t n = 0; n < N; n++) memcpy(sh + n * Vl, x + n * V + s * Vl, (size_t)Vl * 4);
        cu_dev->mem_h2d(dsh, sh, (size_t)(N * Vl) * 4);
        cu_dev->mem_set(dsums, 0xff, N * 8);
        cu_cpu->crossentropy_shard_sums(sums, sh, gmx, t, s * Vl, N, Vl);
        cu_dev->crossentropy_shard_sums(dsums, dsh, dmx, dt, s * Vl, N, Vl);
        snprintf(what, sizeof what, "  crossentropy_shard_sums v0 %d", s * Vl);
        cu_check_dev_f32(what, sums, dsums, 2 * N, TOL_LOSS);
        for (int64_t i = 0; i < 2 * N; i++) gsums[i] += sums[i];
    }
    cu_dev->mem_h2d(dsums, gsums, N * 8);
    for (int s = 0; s < S; s++) {
        for (int64_t n = 0; n < N; n++) memcpy(sh + n * Vl, x + n * V + s * Vl, (size_t)Vl * 4);
        cu_dev->mem_h2d(dsh, sh, (size_t)(N * Vl) * 4);
        const float *hrw = s % 2 ? rw : NULL;
        const void *drws = s % 2 ? drw : NULL;
        if (cap > 0) {
            cu_cpu->crossentropy_shard_softcap_backward(sh, t, gmx, gsums, s * Vl, N, Vl, 0.37f,
                                                        cap, hrw);
            cu_dev->crossentropy_shard_softcap_backward(dsh, dt, dmx, dsums, s * Vl, N, Vl,
                                                        0.37f, cap, drws);
        } else {
            cu_cpu->crossentropy_shard_backward(sh, t, gmx, gsums, s * Vl, N, Vl, 0.37f, hrw);
            cu_dev->crossentropy_shard_backward(dsh, dt, dmx, dsums, s * Vl, N, Vl, 0.37f, drws);
        }
        snprintf(what, sizeof what, "  crossentropy_shard_%sbackward v0 %d%s",
                 cap > 0 ? "softcap_" : "", s * Vl, hrw ? " rw" : "");
        cu_check_dev_f32(what, sh, dsh, N * Vl, TOL_GRAD);
    }
    free(x), free(t), free(rw), free(sh), free(mx), free(gmx), free(sums), free(gsums);
    void *all[] = {dsh, dt, dmx, dsums, drw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* several AdamW steps (weight decay, grad_scale != 1 but for one step) on n parameters, p, m,
 * v (and the bf16 copy) compared after each */
static void test_adamw(int64_t n, int bf16) {
    char what[200];
    /* bit for bit where both sides run the same operations: the emulator (no contraction by
     * the host compiler) against a cpu level with FMA */
    const loom_isa isa = loom_isa_active();
    const int exact = !strcmp(cu_dev->name, "cuda-emu") &&
                      (isa == LOOM_ISA_AVX2 || isa == LOOM_ISA_AVX512);
    const double tol = exact ? 0 : TOL_ADAMW;
    float *p = cu_rand(n, -1, 1), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
    uint16_t *pb = malloc((size_t)n * 2);
    void *dp = cu_up(p, n * 4), *dm = cu_up(m, n * 4), *dv = cu_up(v, n * 4);
    void *dg = cu_dev->mem_alloc(n * 4, 0), *dpb = cu_poisoned((size_t)n * 2);
    const float scales[] = {0.37f, 1.0f, 0.81f, 2.5f, 0.37f};
    for (int step = 1; step <= 5; step++) {
        float *g = cu_rand(n, -0.05f * step, 0.05f * step);
        cu_dev->mem_h2d(dg, g, n * 4);
        const float lr = 1e-3f * (float)step, gs = scales[step - 1];
        if (bf16) {
            cu_cpu->adamw_update_bf16(p, pb, g, m, v, n, lr, 0.9f, 0.95f, 1e-8f, 0.1f, step, gs);
            cu_dev->adamw_update_bf16(dp, dpb, dg, dm, dv, n, lr, 0.9f, 0.95f, 1e-8f, 0.1f,
                                      step, gs);
        } else {
            cu_cpu->adamw_update(p, g, m, v, n, lr, 0.9f, 0.95f, 1e-8f, 0.1f, step, gs);
            cu_dev->adamw_update(dp, dg, dm, dv, n, lr, 0.9f, 0.95f, 1e-8f, 0.1f, step, gs);
        }
        snprintf(what, sizeof what, "adamw_update%s n %lld step %d grad_scale %g: p",
                 bf16 ? "_bf16" : "", (long long)n, step, (double)gs);
        cu_check_dev_f32(what, p, dp, n, tol);
        if (!exact) { /* a figure for the GPU run: are they the cpu's bits there too? */
            float *got = cu_down(dp, (size_t)n * 4);
            int64_t diff = 0;
            for (int64_t i = 0; i < n; i++) diff += memcmp(&got[i], &p[i], 4) != 0;
            printf("     p: %lld of %lld elements differ in bits from the cpu's\n",
                   (long long)diff, (long long)n);
            free(got);
        }
        cu_check_dev_f32("  m", m, dm, n, tol);
        cu_check_dev_f32("  v", v, dv, n, tol);
        /* the copy is the rounded master: exact wherever the masters agree bit for bit */
        if (bf16) cu_check_dev_bf16("  bf16 copy", pb, dpb, n, exact ? 0 : TOL_GRAD_BF16);
        free(g);
    }
    if (!exact)
        printf("     (AdamW within %.0e: bit for bit is checked on cuda-emu at a cpu level with "
               "FMA)\n", TOL_ADAMW);
    free(p), free(m), free(v), free(pb);
    void *all[] = {dp, dm, dv, dg, dpb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* n floats all NaN (the device's own contract where the cpu's is undefined or NaN too) */
static void check_nan(const char *what, const void *d, int64_t n) {
    float *g = cu_down(d, (size_t)n * 4);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += !isnan(g[i]);
    cu_checks++, cu_failures += bad > 0;
    printf("%s %s (%lld of %lld not NaN)\n", bad ? "FAIL" : "ok  ", what, (long long)bad,
           (long long)n);
    free(g);
}

/* rows the cpu kernel has no finite answer for: a target >= V (the cpu reads past its row; the
 * device gives NaN, never an out-of-bounds access) and a row of -inf logits (NaN on both);
 * the finite row beside them as the cpu's on that row alone */
static void test_ce_degenerate(void) {
    enum { V = 45 };
    float *x = cu_rand(3 * V, -4, 4), cl[3], *g = dup_f(x + 2 * V, V);
    const int32_t t[3] = {V, 2, 44};
    for (int i = 0; i < V; i++) x[V + i] = -INFINITY;
    void *dx = cu_up(x, 3 * V * 4), *dt = cu_up(t, sizeof t), *dl = cu_poisoned(3 * 4);
    cu_cpu->crossentropy_forward(cl, x + V, t + 1, 2, V);
    cu_checks++, cu_failures += !isnan(cl[0]);
    printf("%s cpu crossentropy_forward of a -inf row is NaN\n", isnan(cl[0]) ? "ok  " : "FAIL");
    cu_dev->crossentropy_forward(dl, dx, dt, 3, V);
    check_nan("crossentropy_forward target >= V, -inf row: NaN", dl, 2);
    cu_check_dev_f32("  the finite row beside them", cl + 1, (float *)dl + 2, 1, TOL_LOSS);
    cu_cpu->crossentropy_softmax_backward(g, t + 2, 1, V, 0.5f, NULL);
    cu_dev->crossentropy_softmax_backward(dx, dt, 3, V, 0.5f, NULL);
    check_nan("crossentropy_softmax_backward target >= V, -inf row: NaN", dx, 2 * V);
    cu_check_dev_f32("  the finite row beside them", g, (float *)dx + 2 * V, V, TOL_GRAD);
    free(x), free(g);
    cu_dev->mem_free(dx), cu_dev->mem_free(dt), cu_dev->mem_free(dl);
}

static void test_sum_squares(int64_t n, float lo, float hi) {
    char what[120];
    float *x = cu_rand(n, lo, hi);
    void *dx = cu_up(x, n * 4);
    const double ref = cu_cpu->sum_squares(x, n), got = cu_dev->sum_squares(dx, n);
    snprintf(what, sizeof what, "sum_squares n %lld", (long long)n);
    cu_check_scalar(what, ref, got, 1e-12);
    /* deterministic: the same bits again */
    const double again = cu_dev->sum_squares(dx, n);
    cu_checks++;
    if (memcmp(&got, &again, sizeof got)) {
        cu_failures++;
        printf("FAIL sum_squares n %lld repeated: %.17g then %.17g\n", (long long)n, got, again);
    } else
        printf("ok   sum_squares n %lld repeated: the same bits\n", (long long)n);
    free(x), cu_dev->mem_free(dx);
}

static void test_scale(int64_t n) {
    float *x = cu_rand(n, -3, 3);
    void *dx = cu_up(x, n * 4);
    cu_cpu->scale_inplace(x, n, 0.37f);
    cu_dev->scale_inplace(dx, n, 0.37f);
    cu_check_dev_f32("scale_inplace (exact)", x, dx, n, 0);
    free(x), cu_dev->mem_free(dx);
}

/* ---- timings (the `cuda` backend, or any with LOOM_TEST_CUDA_BENCH=1): GPT-2's head at
 * N = 2,048 rows (8 on another backend) and AdamW on GPT-2 124M's parameter count; effective
 * bandwidth from the bytes each op must move. Figures to tune against, not checks; the one
 * check here is that a large backward repeats bit for bit. */
#define BENCH_REPS 10
static double bench_ms(double t0) { return (loom_now() - t0) * 1e3 / BENCH_REPS; }

static void bench(void) {
    const int on_gpu = !strcmp(cu_dev->name, "cuda");
    const char *env = getenv("LOOM_TEST_CUDA_BENCH");
    if (!on_gpu && !(env && !strcmp(env, "1"))) return;
    const int64_t N = on_gpu ? 2048 : 8, n = on_gpu ? 124439808 : 100000;
    const int V = 50257;
    const double gb = 1e9;
    float *x = cu_rand(N * V, -8, 8);
    int32_t *t = cu_rand_int(N, 0, V);
    const size_t xb = (size_t)(N * V) * 4;
    void *dx0 = cu_up(x, xb), *dx = cu_dev->mem_alloc(xb, 0), *dt = cu_up(t, N * 4);
    void *dl = cu_dev->mem_alloc(N * 4, 0), *dxh = cu_dev->mem_alloc(xb / 2, 0);
    cu_dev->bf16_from_f32(dxh, dx0, N * V);
    cu_dev->mem_sync();
    double t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++) cu_dev->crossentropy_forward(dl, dx0, dt, N, V);
    cu_dev->mem_sync();
    double ms = bench_ms(t0);
    printf("time crossentropy_forward N %lld V %d: %.3f ms, %.0f GB/s\n", (long long)N, V, ms,
           (double)xb / gb / (ms * 1e-3));
    t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++) cu_dev->bf16_crossentropy_forward(dl, dxh, dt, N, V);
    cu_dev->mem_sync();
    ms = bench_ms(t0);
    printf("time bf16_crossentropy_forward: %.3f ms, %.0f GB/s\n", ms,
           (double)xb / 2 / gb / (ms * 1e-3));
    double tot = 0;
    for (int r = 0; r < BENCH_REPS; r++) {
        cu_dev->mem_d2d(dx, dx0, xb);
        cu_dev->mem_sync();
        t0 = loom_now();
        cu_dev->crossentropy_softmax_backward(dx, dt, N, V, 1.0f / (float)N, NULL);
        cu_dev->mem_sync();
        tot += loom_now() - t0;
    }
    ms = tot * 1e3 / BENCH_REPS;
    printf("time crossentropy_softmax_backward: %.3f ms, %.0f GB/s (two reads, one write)\n", ms,
           3.0 * (double)xb / gb / (ms * 1e-3));
    float *g1 = cu_down(dx, xb);
    cu_dev->mem_d2d(dx, dx0, xb);
    cu_dev->crossentropy_softmax_backward(dx, dt, N, V, 1.0f / (float)N, NULL);
    float *g2 = cu_down(dx, xb);
    const int same = !memcmp(g1, g2, xb);
    cu_checks++, cu_failures += !same;
    printf("%s crossentropy_softmax_backward N %lld V %d repeats bit for bit\n",
           same ? "ok  " : "FAIL", (long long)N, V);
    free(x), free(t), free(g1), free(g2);
    void *ce[] = {dx0, dx, dt, dl, dxh};
    for (size_t i = 0; i < sizeof ce / sizeof ce[0]; i++) cu_dev->mem_free(ce[i]);

    void *p = cu_dev->mem_alloc(n * 4, 0), *g = cu_dev->mem_alloc(n * 4, 0);
    void *m = cu_dev->mem_alloc(n * 4, 0), *v = cu_dev->mem_alloc(n * 4, 0);
    void *pb = cu_dev->mem_alloc(n * 2, 0);
    cu_dev->fill_float(g, n, 0.01f);
    cu_dev->mem_sync();
    t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->adamw_update(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, r + 1, 0.5f);
    cu_dev->mem_sync();
    ms = bench_ms(t0);
    printf("time adamw_update n %lld: %.3f ms, %.0f GB/s\n", (long long)n, ms,
           28.0 * (double)n / gb / (ms * 1e-3));
    t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->adamw_update_bf16(p, pb, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, r + 1, 0.5f);
    cu_dev->mem_sync();
    ms = bench_ms(t0);
    printf("time adamw_update_bf16: %.3f ms, %.0f GB/s\n", ms, 30.0 * (double)n / gb / (ms * 1e-3));
    t0 = loom_now();
    double ss = 0;
    for (int r = 0; r < BENCH_REPS; r++) ss += cu_dev->sum_squares(g, n);
    ms = bench_ms(t0);
    printf("time sum_squares: %.3f ms (with the read back), %.0f GB/s (sum %.6g)\n", ms,
           4.0 * (double)n / gb / (ms * 1e-3), ss / BENCH_REPS);
    void *ad[] = {p, g, m, v, pb};
    for (size_t i = 0; i < sizeof ad / sizeof ad[0]; i++) cu_dev->mem_free(ad[i]);
}

int main(int argc, char **argv) {
    cu_setup(argc, argv);
    test_ce(1, 7, 0);        /* fewer columns than a warp */
    test_ce(5, 1, 0);        /* one column */
    test_ce(37, 1001, 1);    /* V not a multiple of 32, -inf columns */
    test_ce(3, 2500, 1);     /* bf16 rows past one unrolled trip (8 x 256) and a tail */
    test_ce(2, 50257, 1);    /* GPT-2's vocabulary */
    test_ce_degenerate();
    test_ce_shards(9, 333, 3, 0);
    test_ce_shards(9, 333, 3, 5.0f);
    test_ce_shards(2, 25000, 2, 0);
    test_adamw(10007, 0);
    test_adamw(10007, 1);
    test_sum_squares(1, -2, 2);
    test_sum_squares(1000, -2, 2);
    test_sum_squares(1000003, -2, 2);
    test_sum_squares(5000011, -30, 30); /* past the fixed grid: the grid-stride loop */
    cu_check_scalar("sum_squares n 0", 0.0, cu_dev->sum_squares(NULL, 0), 0);
    test_scale(100003);
    bench();
    return cu_finish();
}
