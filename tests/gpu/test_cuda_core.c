/* The CUDA backend's memory ops, small reductions and GEMMs against the cpu backend
 * (tests/gpu/cuda_harness.h). */
#include <stddef.h>

#include "cuda_harness.h"

static void test_memory(void) {
    const int64_t n = 1000;
    float *h = cu_rand(n, -1, 1);
    float *d = cu_dev->mem_alloc(n * 4, 0);
    float *z = cu_down(d, n * 4), zero[1000] = {0};
    cu_check_f32("mem_alloc zeroes", zero, z, n, 0);
    cu_dev->mem_h2d(d, h, n * 4);
    float *e = cu_dev->mem_alloc(n * 4, 0);
    cu_dev->mem_d2d(e, d, n * 4);
    cu_check_dev_f32("mem_h2d, mem_d2d, mem_d2h round trip", h, e, n, 0);
    /* rows: 10 rows of 7 floats from a pitch of 100 floats into a pitch of 8 */
    float *r = cu_poisoned(80 * 4), ref[80];
    memset(ref, 0xff, sizeof ref);
    for (int i = 0; i < 10; i++) memcpy(ref + i * 8, h + i * 100, 7 * 4);
    cu_dev->mem_d2d_rows(r, 8 * 4, d, 100 * 4, 7 * 4, 10);
    float *rg = cu_down(r, 80 * 4);
    int bad = 0;
    for (int i = 0; i < 10; i++) bad |= memcmp(rg + i * 8, ref + i * 8, 7 * 4) != 0;
    cu_checks++, cu_failures += bad;
    printf("%s mem_d2d_rows\n", bad ? "FAIL" : "ok  ");
    cu_dev->mem_set(e, 0, n * 4);
    cu_check_dev_f32("mem_set", zero, e, n, 0);
    cu_dev->mem_sync();
    free(h), free(z), free(rg);
    cu_dev->mem_free(d), cu_dev->mem_free(e), cu_dev->mem_free(r);
    cu_dev->mem_free(NULL);
}

static void test_small_reductions(void) {
    const int64_t n = 100003;
    float *x = cu_rand(n, -2, 2), *y = cu_rand(n, -1, 1);
    float *dx = cu_up(x, n * 4), *dy = cu_up(y, n * 4);
    double ref, *dd = cu_poisoned(8), got;
    loom_backend_cpu()->sum_double(&ref, x, n);
    cu_dev->sum_double(dd, dx, n);
    cu_dev->mem_d2h(&got, dd, 8);
    cu_check_scalar("sum_double", ref, got, 1e-12);
    cu_check_scalar("sum_squares", cu_cpu->sum_squares(x, n), cu_dev->sum_squares ?
                    cu_dev->sum_squares(dx, n) : NAN, 1e-12);
    cu_cpu->add_inplace(x, y, n);
    cu_dev->add_inplace(dx, dy, n);
    cu_check_dev_f32("add_inplace", x, dx, n, 0);
    cu_cpu->fill_float(x, 77, -INFINITY);
    cu_dev->fill_float(dx, 77, -INFINITY);
    cu_check_dev_f32("fill_float", x, dx, 100, 0);
    /* add_rows: 33 rows of 50 from a stride of 70 into a stride of 90 */
    float *a = cu_rand(33 * 90, -1, 1), *b = cu_rand(33 * 70, -1, 1);
    float *da = cu_up(a, 33 * 90 * 4), *db = cu_up(b, 33 * 70 * 4);
    cu_cpu->add_rows(a, 90, b, 70, 50, 33);
    cu_dev->add_rows(da, 90, db, 70, 50, 33);
    cu_check_dev_f32("add_rows", a, da, 33 * 90, 0);
    /* crossentropy_shard_losses */
    const int64_t N = 300;
    float *mx = cu_rand(N, -3, 3), *sums = cu_rand(2 * N, 0.5f, 4);
    int32_t *tg = cu_rand_int(N, -1, 5);
    float *loss = malloc(N * 4);
    void *dmx = cu_up(mx, N * 4), *dsums = cu_up(sums, 2 * N * 4), *dtg = cu_up(tg, N * 4);
    void *dloss = cu_poisoned(N * 4);
    cu_cpu->crossentropy_shard_losses(loss, mx, sums, tg, N);
    cu_dev->crossentropy_shard_losses(dloss, dmx, dsums, dtg, N);
    cu_check_dev_f32("crossentropy_shard_losses", loss, dloss, N, 1e-6);
    /* attn_lse_merge: B 2, H 3, n 17, D 40, some -inf rows on either side */
    const int B = 2, H = 3, D = 40;
    const int64_t nr = 17, HD = H * D, obs = (nr + 5) * HD;
    float *out = cu_rand(B * obs, -1, 1), *blk = cu_rand(B * nr * HD, -1, 1);
    float *lse = cu_rand(B * H * nr, -2, 2), *blse = cu_rand(B * H * nr, -2, 2);
    for (int i = 0; i < B * H * nr; i += 5) lse[i] = -INFINITY;
    for (int i = 0; i < B * H * nr; i += 7) blse[i] = -INFINITY;
    void *dout = cu_up(out, B * obs * 4), *dblk = cu_up(blk, B * nr * HD * 4);
    void *dlse = cu_up(lse, B * H * nr * 4), *dblse = cu_up(blse, B * H * nr * 4);
    cu_cpu->attn_lse_merge(out, lse, blk, blse, B, H, nr, D, obs);
    cu_dev->attn_lse_merge(dout, dlse, dblk, dblse, B, H, nr, D, obs);
    cu_check_dev_f32("attn_lse_merge out", out, dout, B * obs, 1e-6);
    cu_check_dev_f32("attn_lse_merge lse", lse, dlse, B * H * nr, 1e-6);
    free(x), free(y), free(a), free(b), free(mx), free(sums), free(tg), free(loss);
    free(out), free(blk), free(lse), free(blse);
}

/* matmul forward / backward (accumulate and set), fp32 and bf16, odd sizes */
static void test_gemm(int64_t N, int IC, int OC, int with_bias) {
    char what[160];
    float *x = cu_rand(N * IC, -1, 1), *w = cu_rand((int64_t)OC * IC, -0.5f, 0.5f);
    float *bias = with_bias ? cu_rand(OC, -1, 1) : NULL, *out = malloc(N * OC * 4);
    void *dx = cu_up(x, N * IC * 4), *dw = cu_up(w, (int64_t)OC * IC * 4);
    void *db = bias ? cu_up(bias, OC * 4) : NULL, *dout = cu_poisoned(N * OC * 4);
    cu_cpu->matmul_forward(out, x, w, bias, N, IC, OC);
    cu_dev->matmul_forward(dout, dx, dw, db, N, IC, OC);
    snprintf(what, sizeof what, "matmul_forward N %lld IC %d OC %d%s", (long long)N, IC, OC,
             bias ? " +bias" : "");
    cu_check_dev_f32(what, out, dout, N * OC, CU_TOL_F32);
    /* backward: gradients start from random values (they accumulate) */
    float *g = cu_rand(N * OC, -1, 1), *dinp = cu_rand(N * IC, -1, 1);
    float *dwt = cu_rand((int64_t)OC * IC, -1, 1), *dbias = cu_rand(OC, -1, 1);
    void *dg = cu_up(g, N * OC * 4), *ddinp = cu_up(dinp, N * IC * 4);
    void *ddw = cu_up(dwt, (int64_t)OC * IC * 4), *ddb = cu_up(dbias, OC * 4);
    cu_cpu->matmul_backward(dinp, dwt, dbias, g, x, w, N, IC, OC);
    cu_dev->matmul_backward(ddinp, ddw, ddb, dg, dx, dw, N, IC, OC);
    snprintf(what, sizeof what, "matmul_backward dinp += (N %lld IC %d OC %d)", (long long)N, IC, OC);
    cu_check_dev_f32(what, dinp, ddinp, N * IC, CU_TOL_F32);
    cu_check_dev_f32("  dweight +=", dwt, ddw, (int64_t)OC * IC, CU_TOL_F32);
    cu_check_dev_f32("  dbias +=", dbias, ddb, OC, CU_TOL_F32);
    void *dset = cu_poisoned(N * IC * 4);
    cu_cpu->matmul_backward_set(dinp, NULL, NULL, g, x, w, N, IC, OC);
    cu_dev->matmul_backward_set(dset, NULL, NULL, dg, dx, dw, N, IC, OC);
    cu_check_dev_f32("matmul_backward_set dinp = (poisoned before)", dinp, dset, N * IC, CU_TOL_F32);

    /* bf16: the same shapes on rounded operands */
    uint16_t *xb = malloc(N * IC * 2), *wb = malloc((int64_t)OC * IC * 2), *ob = malloc(N * OC * 2);
    for (int64_t i = 0; i < N * IC; i++) xb[i] = loom_bf16_round(x[i]);
    for (int64_t i = 0; i < (int64_t)OC * IC; i++) wb[i] = loom_bf16_round(w[i]);
    void *dxb = cu_up(xb, N * IC * 2), *dwb = cu_up(wb, (int64_t)OC * IC * 2);
    void *dob = cu_poisoned(N * OC * 2), *dof = cu_poisoned(N * OC * 4);
    cu_cpu->bf16_matmul_forward(ob, xb, wb, bias, N, IC, OC);
    cu_dev->bf16_matmul_forward(dob, dxb, dwb, db, N, IC, OC);
    cu_check_dev_bf16("bf16_matmul_forward", ob, dob, N * OC, CU_TOL_BF16);
    cu_cpu->bf16_matmul_forward_f32(out, xb, wb, bias, N, IC, OC);
    cu_dev->bf16_matmul_forward_f32(dof, dxb, dwb, db, N, IC, OC);
    cu_check_dev_f32("bf16_matmul_forward_f32", out, dof, N * OC, CU_TOL_F32);
    uint16_t *gb = malloc(N * OC * 2);
    void *dgb = cu_poisoned(N * OC * 2);
    cu_dev->mem_h2d(ddinp, dinp, N * IC * 4);
    cu_dev->mem_h2d(ddw, dwt, (int64_t)OC * IC * 4);
    cu_dev->mem_h2d(ddb, dbias, OC * 4);
    cu_cpu->bf16_matmul_backward(dinp, 0, dwt, dbias, g, gb, xb, wb, N, IC, OC);
    cu_dev->bf16_matmul_backward(ddinp, 0, ddw, ddb, dg, dgb, dxb, dwb, N, IC, OC);
    cu_check_dev_bf16("bf16_matmul_backward dout rounded", gb, dgb, N * OC, 0);
    cu_check_dev_f32("bf16_matmul_backward dinp +=", dinp, ddinp, N * IC, CU_TOL_F32);
    cu_check_dev_f32("  dweight +=", dwt, ddw, (int64_t)OC * IC, CU_TOL_F32);
    cu_check_dev_f32("  dbias +=", dbias, ddb, OC, CU_TOL_F32);
    /* from f32 / to f32 */
    uint16_t *rb = malloc(N * IC * 2);
    void *drb = cu_poisoned(N * IC * 2), *dwd = cu_poisoned(N * IC * 4);
    cu_cpu->bf16_from_f32(rb, x, N * IC);
    cu_dev->bf16_from_f32(drb, dx, N * IC);
    cu_check_dev_bf16("bf16_from_f32", rb, drb, N * IC, 0);
    float *wd = malloc(N * IC * 4);
    cu_cpu->bf16_to_f32(wd, rb, N * IC);
    cu_dev->bf16_to_f32(dwd, drb, N * IC);
    cu_check_dev_f32("bf16_to_f32", wd, dwd, N * IC, 0);
    free(x), free(w), free(bias), free(out), free(g), free(dinp), free(dwt), free(dbias);
    free(xb), free(wb), free(ob), free(gb), free(rb), free(wd);
    void *all[] = {dx, dw, db, dout, dg, ddinp, ddw, ddb, dset, dxb, dwb, dob, dof, dgb, drb, dwd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* every op of the table is set (the names: tests/e2e/test_backend_confined.sh) */
static void test_table_complete(void) {
    const char *base = (const char *)cu_dev;
    const size_t first = offsetof(loom_backend, mem_alloc);
    int null = 0;
    for (size_t off = first; off + sizeof(void (*)(void)) <= sizeof(loom_backend);
         off += sizeof(void (*)(void))) {
        void (*fn)(void);
        memcpy(&fn, base + off, sizeof fn);
        if (!fn) printf("  op %zu of the table is NULL\n", (off - first) / sizeof fn), null++;
    }
    cu_checks++, cu_failures += null != 0;
    printf("%s every op of the %s table is set\n", null ? "FAIL" : "ok  ", cu_dev->name);
}

/* the tensor-core primitive (cu_mma_bf16_16816): its fragment layout against a host product;
 * the emulator's reading of PTX's layout is checked where a GPU runs it */
void loom_cuda_mma_selftest(float *D, const uint16_t *A, const uint16_t *B, const float *C);
void loom_cuda_emu_mma_selftest(float *D, const uint16_t *A, const uint16_t *B, const float *C);
static void test_mma(void) {
    void (*fn)(float *, const uint16_t *, const uint16_t *, const float *) =
        !strcmp(cu_dev->name, "cuda-emu") ? loom_cuda_emu_mma_selftest : NULL;
#ifdef LOOM_HAVE_CUDA
    if (!strcmp(cu_dev->name, "cuda")) fn = loom_cuda_mma_selftest;
#endif
    if (!fn) return;
    /* distinct values per element (a transposed or shifted fragment shows) */
    uint16_t *A = cu_rand_bf16(16 * 16, -2, 2), *B = cu_rand_bf16(16 * 8, -2, 2);
    float *C = cu_rand(16 * 8, -1, 1), ref[128];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            double acc = C[i * 8 + j];
            for (int k = 0; k < 16; k++)
                acc += (double)loom_bf16_widen(A[i * 16 + k]) * loom_bf16_widen(B[k * 8 + j]);
            ref[i * 8 + j] = (float)acc;
        }
    void *dA = cu_up(A, 512), *dB = cu_up(B, 256), *dC = cu_up(C, 512), *dD = cu_poisoned(512);
    fn(dD, dA, dB, dC);
    /* the tensor core's accumulation order and rounding are its own: 16 products of |x| < 4 */
    cu_check_dev_f32("cu_mma_bf16_16816 (one warp, m16n8k16) against a float64 product", ref, dD,
                     128, 1e-5);
    free(A), free(B), free(C);
    cu_dev->mem_free(dA), cu_dev->mem_free(dB), cu_dev->mem_free(dC), cu_dev->mem_free(dD);
}

int main(int argc, char **argv) {
    cu_setup(argc, argv);
    test_table_complete();
    test_mma();
    test_memory();
    test_small_reductions();
    test_gemm(7, 13, 5, 1);
    test_gemm(64, 48, 80, 0);
    test_gemm(33, 96, 17, 1);
    return cu_finish();
}
