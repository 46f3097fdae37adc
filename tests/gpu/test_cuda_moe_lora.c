/* The CUDA backend's MoE and LoRA ops against the cpu backend (tests/gpu/cuda_harness.h):
 * routing (softmax, top-k with ties, capacity per group, expert-major rows, counts, stats)
 * with its ints compared exactly, dispatch and combine in fp32 and bf16 (renorm on and off,
 * shared experts S = 0, 1, 2), their backward, the router's backward, the shared gate, and
 * LoRA's row ops, dropout (its keep mask bit for bit, one and two position chunks) and merge.
 * Tolerances: CU_TOL_F32 / CU_TOL_BF16 (the harness), routing's softmax 1e-6 (the device's
 * exp/log in double), the stats' sums 1e-12 (another summation order). */
#include "cuda_harness.h"

/* n bytes of the device buffer d equal ref's */
static int cu_check_dev_bytes(const char *what, const void *ref, const void *d, int64_t n) {
    unsigned char *g = cu_down(d, (size_t)n);
    const unsigned char *r = ref;
    int64_t bad = 0, at = -1;
    for (int64_t i = 0; i < n; i++)
        if (g[i] != r[i]) bad++, at = at < 0 ? i : at;
    cu_checks++;
    if (bad) {
        cu_failures++;
        printf("FAIL %s: %lld of %lld bytes differ; first at %lld: ref %u, got %u\n", what,
               (long long)bad, (long long)n, (long long)at, r[at], g[at]);
    } else
        printf("ok   %s (%lld bytes equal)\n", what, (long long)n);
    free(g);
    return bad ? 1 : 0;
}

/* n doubles of d against ref: |got - ref| <= tol (1 + |ref|) */
static int cu_check_dev_f64(const char *what, const double *ref, const void *d, int64_t n,
                            double tol) {
    double *g = cu_down(d, (size_t)n * 8), worst = 0;
    int64_t bad = 0, at = -1;
    for (int64_t i = 0; i < n; i++) {
        const double e = ref[i] == g[i] ? 0 : fabs(g[i] - ref[i]) / (1 + fabs(ref[i]));
        if (!(e <= tol)) bad++, at = at < 0 ? i : at;
        else if (e > worst) worst = e;
    }
    cu_checks++;
    if (bad) {
        cu_failures++;
        printf("FAIL %s: %lld of %lld doubles off (tolerance %.1e); first at %lld: ref %.17g, "
               "got %.17g\n", what, (long long)bad, (long long)n, tol, (long long)at, ref[at],
               g[at]);
    } else
        printf("ok   %s (%lld doubles, max rel err %.2e <= %.1e)\n", what, (long long)n, worst,
               tol);
    free(g);
    return bad ? 1 : 0;
}

/* as cu_check_dev_f32, with NaN on both sides at the same place counted equal (routing's
 * all-(-inf) rows) */
static int cu_check_dev_f32_nan(const char *what, const float *ref, const void *d, int64_t n,
                                double tol) {
    float *g = cu_down(d, (size_t)n * 4), *r = cu_hdup(ref, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        if (isnan(r[i]) && isnan(g[i])) r[i] = g[i] = 0;
    const int bad = cu_check_f32(what, r, g, n, tol);
    free(g), free(r);
    return bad;
}

static void dev_free(void **all, size_t n) {
    for (size_t i = 0; i < n; i++) cu_dev->mem_free(all[i]);
}

/* ---- routing ------------------------------------------------------------------------------ */

/* a routing the cpu made (and the device matched): what the dispatch and combine tests use */
typedef struct {
    int64_t N, G, rows; /* rows: the kept choices, sum of cnt */
    int E, K;
    float *p, *lse;
    int32_t *e, *pos, *cnt;
} routing;

enum { LOGITS_RANDOM, LOGITS_TIES, LOGITS_SKEW, LOGITS_NEG_INF };

static float *make_logits(int64_t N, int E, int kind) {
    float *l = cu_rand(N * E, -3, 3);
    for (int64_t i = 0; i < N * E; i++) {
        if (kind == LOGITS_TIES) l[i] = floorf(l[i]) * 0.5f; /* 6 values: many equal p */
        if (kind == LOGITS_SKEW && i % E == 3 && (i / E) % 7 != 0) l[i] += 6; /* most pick 3 */
        if (kind == LOGITS_NEG_INF && i % 5 == 2) l[i] = -INFINITY;
    }
    if (kind == LOGITS_NEG_INF && N > 3)
        for (int x = 0; x < E; x++) l[3 * E + x] = -INFINITY; /* a row of NaN probabilities */
    return l;
}

static routing test_route(int64_t N, int E, int K, int64_t G, float cf, int with_stats,
                          int kind) {
    char what[200];
    const char *kinds[] = {"random", "ties", "skewed to expert 3", "-inf logits"};
    snprintf(what, sizeof what, "moe_route N %lld E %d K %d G %lld capacity %g%s, %s logits",
             (long long)N, E, K, (long long)G, (double)cf, with_stats ? ", stats" : "",
             kinds[kind]);
    printf("-- %s\n", what);
    routing r = {.N = N, .G = G, .E = E, .K = K};
    r.p = make_logits(N, E, kind);
    r.lse = malloc((size_t)(N ? N : 1) * 4);
    r.e = malloc((size_t)(N ? N : 1) * K * 4), r.pos = malloc((size_t)(N ? N : 1) * K * 4);
    r.cnt = malloc((size_t)E * 4);
    const int ns = E + 5;
    double *stats = malloc((size_t)ns * 8);
    for (int i = 0; i < ns; i++) stats[i] = 0.25 * i + 1; /* they accumulate */
    void *dp = cu_up(r.p, (size_t)N * E * 4), *dlse = cu_poisoned((size_t)N * 4);
    void *de = cu_poisoned((size_t)N * K * 4), *dpos = cu_poisoned((size_t)N * K * 4);
    void *dcnt = cu_poisoned((size_t)E * 4), *dstats = cu_up(stats, (size_t)ns * 8);
    cu_cpu->moe_route(r.p, r.lse, r.e, r.pos, r.cnt, with_stats ? stats : NULL, N, E, K, G, cf);
    cu_dev->moe_route(dp, dlse, de, dpos, dcnt, with_stats ? dstats : NULL, N, E, K, G, cf);
    cu_check_dev_f32_nan("  p = softmax(logits)", r.p, dp, N * E, 1e-6);
    cu_check_dev_f32_nan("  lse", r.lse, dlse, N, 1e-6);
    cu_check_dev_i32("  e (top-k)", r.e, de, N * K);
    cu_check_dev_i32("  pos (capacity, expert-major rows)", r.pos, dpos, N * K);
    cu_check_dev_i32("  cnt", r.cnt, dcnt, E);
    cu_check_dev_f64(with_stats ? "  stats +=" : "  stats untouched (NULL)", stats, dstats, ns,
                     1e-12);
    r.rows = 0;
    int64_t dropped = 0;
    for (int x = 0; x < E; x++) r.rows += r.cnt[x];
    for (int64_t i = 0; i < N * K; i++) dropped += r.pos[i] < 0;
    printf("  (%lld kept rows, %lld dropped)\n", (long long)r.rows, (long long)dropped);
    free(stats);
    void *all[] = {dp, dlse, de, dpos, dcnt, dstats};
    dev_free(all, sizeof all / sizeof all[0]);
    return r;
}

static void routing_free(routing *r) {
    free(r->p), free(r->lse), free(r->e), free(r->pos), free(r->cnt);
}

/* ---- dispatch, combine and their backward on a routing ------------------------------------ */

static void test_moe_ops(const routing *r, int C, int renorm, int S, int gated) {
    const int64_t N = r->N, NK = N * r->K, R = r->rows;
    const int E = r->E, K = r->K;
    char what[200];
    printf("-- MoE ops: N %lld E %d K %d C %d, %lld rows, renorm %d, shared experts %d%s\n",
           (long long)N, E, K, C, (long long)R, renorm, S, S ? (gated ? " gated" : " ungated") : "");
    void *dp = cu_up(r->p, (size_t)N * E * 4), *dlse = cu_up(r->lse, (size_t)N * 4);
    void *de = cu_up(r->e, (size_t)NK * 4), *dpos = cu_up(r->pos, (size_t)NK * 4);

    /* gather: fp32 rows, bf16 rows (2-byte words when C is odd), 3-byte rows */
    float *x = cu_rand(N * C, -1, 1), *X = malloc((size_t)(R ? R : 1) * C * 4);
    void *dx = cu_up(x, (size_t)N * C * 4), *dX = cu_poisoned((size_t)R * C * 4);
    cu_cpu->moe_gather(X, x, r->pos, N, K, (size_t)C * 4);
    cu_dev->moe_gather(dX, dx, dpos, N, K, (size_t)C * 4);
    cu_check_dev_bytes("moe_gather fp32 rows", X, dX, R * C * 4);
    uint16_t *xb = cu_rand_bf16(N * C, -1, 1), *Xb = malloc((size_t)(R ? R : 1) * C * 2);
    void *dxb = cu_up(xb, (size_t)N * C * 2), *dXb = cu_poisoned((size_t)R * C * 2);
    cu_cpu->moe_gather(Xb, xb, r->pos, N, K, (size_t)C * 2);
    cu_dev->moe_gather(dXb, dxb, dpos, N, K, (size_t)C * 2);
    cu_check_dev_bytes("moe_gather bf16 rows", Xb, dXb, R * C * 2);
    void *dX3 = cu_poisoned((size_t)R * 3);
    unsigned char *X3 = malloc((size_t)(R ? R : 1) * 3);
    cu_cpu->moe_gather(X3, xb, r->pos, N, K, 3);
    cu_dev->moe_gather(dX3, dxb, dpos, N, K, 3);
    cu_check_dev_bytes("moe_gather 3-byte rows", X3, dX3, R * 3);

    /* combine and its backward, fp32 */
    float *YB = cu_rand(R * C, -1, 1), *y = malloc((size_t)N * C * 4);
    void *dYB = cu_up(YB, (size_t)R * C * 4), *dy_ = cu_poisoned((size_t)N * C * 4);
    cu_cpu->moe_combine(y, YB, r->p, r->e, r->pos, N, E, K, C, renorm);
    cu_dev->moe_combine(dy_, dYB, dp, de, dpos, N, E, K, C, renorm);
    cu_check_dev_f32("moe_combine y =", y, dy_, N * C, CU_TOL_F32);
    float *gy = cu_rand(N * C, -1, 1), *gYB = malloc((size_t)(R ? R : 1) * C * 4);
    float *gw = malloc((size_t)NK * 4);
    void *dgy = cu_up(gy, (size_t)N * C * 4), *dgYB = cu_poisoned((size_t)R * C * 4);
    void *dgw = cu_poisoned((size_t)NK * 4);
    cu_cpu->moe_combine_backward(gYB, gw, gy, YB, r->p, r->e, r->pos, N, E, K, C, renorm);
    cu_dev->moe_combine_backward(dgYB, dgw, dgy, dYB, dp, de, dpos, N, E, K, C, renorm);
    cu_check_dev_f32("moe_combine_backward dYB =", gYB, dgYB, R * C, CU_TOL_F32);
    cu_check_dev_f32("  dw = <dy, YB row> (0 dropped)", gw, dgw, NK, CU_TOL_F32);

    /* scatter_add: dx += its choices' rows */
    float *gXB = cu_rand(R * C, -1, 1), *gx = cu_rand(N * C, -1, 1);
    void *dgXB = cu_up(gXB, (size_t)R * C * 4), *dgx = cu_up(gx, (size_t)N * C * 4);
    cu_cpu->moe_scatter_add(gx, gXB, r->pos, N, K, C);
    cu_dev->moe_scatter_add(dgx, dgXB, dpos, N, K, C);
    cu_check_dev_f32("moe_scatter_add dx +=", gx, dgx, N * C, CU_TOL_F32);

    /* the router's backward, from the combine's dw (0 where dropped) */
    float *dl = malloc((size_t)N * E * 4);
    void *ddl = cu_poisoned((size_t)N * E * 4), *dgw2 = cu_up(gw, (size_t)NK * 4);
    const double aux = 0.01 * 1.7, zc = 0.001 * 1.3;
    cu_cpu->moe_router_backward(dl, r->p, r->lse, r->e, r->pos, gw, N, E, K, r->G, aux, zc,
                                renorm);
    cu_dev->moe_router_backward(ddl, dp, dlse, de, dpos, dgw2, N, E, K, r->G, aux, zc, renorm);
    cu_check_dev_f32("moe_router_backward dl =", dl, ddl, N * E, CU_TOL_F32);

    /* bf16 combine with S shared experts (gated: g (S,N); else NULL = 1) and its backward */
    uint16_t *YBb = cu_rand_bf16(R * C, -1, 1), *ysb = cu_rand_bf16(S * N * C, -1, 1);
    uint16_t *yb = malloc((size_t)N * C * 2);
    float *gS = cu_rand(S * N, 0, 1);
    void *dYBb = cu_up(YBb, (size_t)R * C * 2), *dysb = S ? cu_up(ysb, (size_t)S * N * C * 2) : NULL;
    void *dgS = S && gated ? cu_up(gS, (size_t)S * N * 4) : NULL;
    void *dyb = cu_poisoned((size_t)N * C * 2);
    cu_cpu->bf16_moe_combine(yb, YBb, r->p, r->e, r->pos, N, E, K, C, renorm, S ? ysb : NULL,
                             S && gated ? gS : NULL, S);
    cu_dev->bf16_moe_combine(dyb, dYBb, dp, de, dpos, N, E, K, C, renorm, dysb, dgS, S);
    snprintf(what, sizeof what, "bf16_moe_combine y = (S %d)", S);
    cu_check_dev_bf16(what, yb, dyb, N * C, CU_TOL_BF16);
    void *dgYB2 = cu_poisoned((size_t)R * C * 4), *dgw3 = cu_poisoned((size_t)NK * 4);
    cu_cpu->bf16_moe_combine_backward(gYB, gw, gy, YBb, r->p, r->e, r->pos, N, E, K, C, renorm);
    cu_dev->bf16_moe_combine_backward(dgYB2, dgw3, dgy, dYBb, dp, de, dpos, N, E, K, C, renorm);
    cu_check_dev_f32("bf16_moe_combine_backward dYB =", gYB, dgYB2, R * C, CU_TOL_F32);
    cu_check_dev_f32("  dw =", gw, dgw3, NK, CU_TOL_F32);

    /* the shared gate: g = sigmoid(z); y += g ys; backward (fp32 and bf16 ys) */
    float *z = cu_rand(N, -4, 4), *ys = cu_rand(N * C, -1, 1), *yg = cu_rand(N * C, -1, 1);
    void *dz = cu_up(z, (size_t)N * 4), *dys = cu_up(ys, (size_t)N * C * 4);
    void *dyg = cu_up(yg, (size_t)N * C * 4);
    cu_cpu->moe_sigmoid(z, N);
    cu_dev->moe_sigmoid(dz, N);
    cu_check_dev_f32("moe_sigmoid", z, dz, N, CU_TOL_F32);
    cu_dev->mem_h2d(dz, z, (size_t)N * 4); /* the same gates on both sides from here */
    cu_cpu->moe_gate_add(yg, z, ys, N, C);
    cu_dev->moe_gate_add(dyg, dz, dys, N, C);
    cu_check_dev_f32("moe_gate_add y +=", yg, dyg, N * C, CU_TOL_F32);
    float *gys = malloc((size_t)N * C * 4), *gz = malloc((size_t)N * 4);
    void *dgys = cu_poisoned((size_t)N * C * 4), *dgz = cu_poisoned((size_t)N * 4);
    cu_cpu->moe_gate_backward(gys, gz, gy, z, ys, N, C);
    cu_dev->moe_gate_backward(dgys, dgz, dgy, dz, dys, N, C);
    cu_check_dev_f32("moe_gate_backward dys =", gys, dgys, N * C, CU_TOL_F32);
    cu_check_dev_f32("  dz =", gz, dgz, N, CU_TOL_F32);
    void *dgys2 = cu_poisoned((size_t)N * C * 4), *dgz2 = cu_poisoned((size_t)N * 4);
    cu_cpu->bf16_moe_gate_backward(gys, gz, gy, z, xb, N, C);
    cu_dev->bf16_moe_gate_backward(dgys2, dgz2, dgy, dz, dxb, N, C);
    cu_check_dev_f32("bf16_moe_gate_backward dys =", gys, dgys2, N * C, CU_TOL_F32);
    cu_check_dev_f32("  dz =", gz, dgz2, N, CU_TOL_F32);

    free(x), free(X), free(xb), free(Xb), free(X3), free(YB), free(y), free(gy), free(gYB);
    free(gw), free(gXB), free(gx), free(dl), free(YBb), free(ysb), free(yb), free(gS);
    free(z), free(ys), free(yg), free(gys), free(gz);
    void *all[] = {dp, dlse, de, dpos, dx, dX, dxb, dXb, dX3, dYB, dy_, dgy, dgYB, dgw, dgXB, dgx,
                   ddl, dgw2, dYBb, dysb, dgS, dyb, dgYB2, dgw3, dz, dys, dyg, dgys, dgz, dgys2,
                   dgz2};
    dev_free(all, sizeof all / sizeof all[0]);
}

static void test_moe(void) {
    routing r;
    /* dropless, groups of 16 (the last one of 2), then a small capacity on the same shapes */
    r = test_route(50, 8, 2, 16, 0.0f, 1, LOGITS_RANDOM);
    test_moe_ops(&r, 40, 0, 0, 0);
    routing_free(&r);
    r = test_route(50, 8, 2, 16, 0.5f, 1, LOGITS_RANDOM);
    test_moe_ops(&r, 40, 1, 2, 1);
    routing_free(&r);
    /* ties (to the lower expert), one group, K 3 */
    r = test_route(40, 6, 3, 40, 1.25f, 0, LOGITS_TIES);
    test_moe_ops(&r, 33, 1, 1, 0);
    routing_free(&r);
    /* more experts than a warp's lanes */
    r = test_route(33, 40, 4, 11, 1.0f, 1, LOGITS_RANDOM);
    test_moe_ops(&r, 17, 0, 2, 1);
    routing_free(&r);
    r = test_route(20, 40, 5, 20, 0.0f, 0, LOGITS_TIES); /* ties inside a lane's experts too */
    routing_free(&r);
    /* more experts than a block's threads (the per-expert loops stride) */
    r = test_route(16, 300, 3, 8, 13.0f, 1, LOGITS_SKEW); /* capacity 1 */
    test_moe_ops(&r, 5, 1, 1, 1);
    routing_free(&r);
    /* one expert wanted by most tokens: groups of several tiles (600 choices) with and
     * without a capacity */
    r = test_route(300, 8, 2, 300, 1.0f, 1, LOGITS_SKEW);
    test_moe_ops(&r, 8, 1, 0, 0);
    routing_free(&r);
    r = test_route(300, 8, 2, 150, 0.0f, 1, LOGITS_SKEW);
    routing_free(&r);
    /* capacity 0: every choice dropped (floor(0.1 x 1 x 16 / 8) = 0) */
    r = test_route(20, 8, 1, 16, 0.1f, 1, LOGITS_RANDOM);
    test_moe_ops(&r, 12, 0, 2, 1);
    routing_free(&r);
    /* -inf logits, one row all -inf (NaN probabilities: experts 0..K-1, as the cpu) */
    r = test_route(24, 12, 3, 8, 1.5f, 0, LOGITS_NEG_INF);
    routing_free(&r);
    /* one expert; no tokens */
    r = test_route(5, 1, 1, 2, 0.0f, 1, LOGITS_RANDOM);
    test_moe_ops(&r, 7, 1, 0, 0);
    routing_free(&r);
    r = test_route(0, 4, 2, 16, 1.0f, 1, LOGITS_RANDOM);
    routing_free(&r);
}

/* ---- LoRA ----------------------------------------------------------------------------- */

static void test_lora_rows(void) {
    const int64_t rows = 13, width = 37, ds = 50, ss = 41;
    float *dst = cu_rand(rows * ds, -1, 1), *src = cu_rand(rows * ss, -1, 1);
    void *ddst = cu_up(dst, rows * ds * 4), *dsrc = cu_up(src, rows * ss * 4);
    cu_cpu->lora_add_scaled(dst, ds, src, ss, width, rows, 0.37f);
    cu_dev->lora_add_scaled(ddst, ds, dsrc, ss, width, rows, 0.37f);
    cu_check_dev_f32("lora_add_scaled (strided rows; the gaps untouched)", dst, ddst, rows * ds,
                     CU_TOL_F32);
    float *sc = malloc(rows * width * 4);
    void *dsc = cu_poisoned(rows * width * 4);
    cu_cpu->lora_scale_rows(sc, src, ss, width, rows, -1.5f);
    cu_dev->lora_scale_rows(dsc, dsrc, ss, width, rows, -1.5f);
    cu_check_dev_f32("lora_scale_rows =", sc, dsc, rows * width, CU_TOL_F32);
    uint16_t *db = cu_rand_bf16(rows * ds, -2, 2);
    void *ddb = cu_up(db, rows * ds * 2);
    cu_cpu->lora_add_scaled_bf16(db, ds, src, ss, width, rows, 0.37f);
    cu_dev->lora_add_scaled_bf16(ddb, ds, dsrc, ss, width, rows, 0.37f);
    cu_check_dev_bf16("lora_add_scaled_bf16", db, ddb, rows * ds, CU_TOL_BF16);
    /* merge: W (33, 47) += 0.8 B (33, 5) A (5, 47) */
    const int64_t out = 33, in = 47;
    const int rk = 5;
    float *W = cu_rand(out * in, -1, 1), *A = cu_rand(rk * in, -1, 1), *B = cu_rand(out * rk, -1, 1);
    void *dW = cu_up(W, out * in * 4), *dA = cu_up(A, rk * in * 4), *dB = cu_up(B, out * rk * 4);
    cu_cpu->lora_merge(W, A, B, out, in, rk, 0.8f);
    cu_dev->lora_merge(dW, dA, dB, out, in, rk, 0.8f);
    cu_check_dev_f32("lora_merge W +=", W, dW, out * in, CU_TOL_F32);
    free(dst), free(src), free(sc), free(db), free(W), free(A), free(B);
    void *all[] = {ddst, dsrc, dsc, ddb, dW, dA, dB};
    dev_free(all, sizeof all / sizeof all[0]);
}

/* dropout of B sequences of T rows; split < T: two position chunks (context parallelism) */
static void test_lora_dropout(int B, int T, int split, int64_t in, float p) {
    char what[200];
    const int64_t N = (int64_t)B * T, n = N * in, pos0 = 100, pos1 = 300, row0 = 2, Tg = 400;
    const uint64_t key = loom_rng_key(42, 7);
    float *x = cu_rand(n, -1, 1), *xd = malloc(n * 4);
    uint8_t *keep = malloc(n);
    void *dx = cu_up(x, n * 4), *dxd = cu_poisoned(n * 4), *dkeep = cu_poisoned(n);
    cu_cpu->lora_dropout_forward(xd, keep, x, N, in, T, split, pos0, pos1, row0, Tg, key, p);
    cu_dev->lora_dropout_forward(dxd, dkeep, dx, N, in, T, split, pos0, pos1, row0, Tg, key, p);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) kept += keep[i];
    snprintf(what, sizeof what, "lora_dropout_forward keep (B %d T %d split %d in %lld p %g: "
             "%lld of %lld kept)", B, T, split, (long long)in, (double)p, (long long)kept,
             (long long)n);
    cu_check_dev_bytes(what, keep, dkeep, n);
    cu_check_dev_f32("  xd = x keep / (1 - p)", xd, dxd, n, CU_TOL_F32);
    float *din = cu_rand(n, -1, 1), *g = cu_rand(n, -1, 1);
    void *ddin = cu_up(din, n * 4), *dg = cu_up(g, n * 4);
    cu_cpu->lora_dropout_backward(din, g, keep, n, p);
    cu_dev->lora_dropout_backward(ddin, dg, dkeep, n, p);
    cu_check_dev_f32("lora_dropout_backward din +=", din, ddin, n, CU_TOL_F32);
    free(x), free(xd), free(keep), free(din), free(g);
    void *all[] = {dx, dxd, dkeep, ddin, dg};
    dev_free(all, sizeof all / sizeof all[0]);
}

int main(int argc, char **argv) {
    cu_setup(argc, argv);
    test_moe();
    test_lora_rows();
    test_lora_dropout(3, 10, 6, 37, 0.3f);  /* two chunks */
    test_lora_dropout(2, 9, 9, 20, 0.5f);   /* one chunk */
    test_lora_dropout(1, 4, 4, 300, 0.0f);  /* p 0: everything kept */
    return cu_finish();
}
