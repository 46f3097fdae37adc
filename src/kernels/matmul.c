/* Linear layer: out = inp @ weight^T + bias, through oneDNN's sgemm (row-major).
 * inp (N,IC), weight (OC,IC), bias (OC), out (N,OC).
 *
 * The products go to dnnl_sgemm rather than OpenBLAS's cblas_sgemm: on this machine's shapes
 * (bench/bench_gemm.c, docs/kernels.md) it is about 8% faster on one thread, most of it on the
 * small byte-tiny products, where OpenBLAS spends a tenth of its time packing; on two threads
 * with the split below, about 10%. oneDNN is built on OpenMP (the same threads as loom's
 * kernels) and dispatches on the CPU itself. */
#include "kernels/kmath.h"

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include "loom/kernels.h"

/* One block of C through dnnl_sgemm. It only fails on invalid arguments, which the callers
 * never pass; should it ever refuse, OpenBLAS computes the same product, so a result is never
 * lost. */
static void sgemm1(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                   int64_t ldc) {
    if (dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success)
        return;
    cblas_sgemm(CblasRowMajor, ta == 'T' ? CblasTrans : CblasNoTrans,
                tb == 'T' ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, alpha,
                A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* below this many multiply-adds (about 40 us on one core) one thread does the whole product:
 * a fork/join costs more than it saves, most of all on a loaded machine */
#define SPLIT_MIN 4194304.0

/* C (M,N) = alpha * op(A) op(B) + beta * C, row-major; op = transpose when ta/tb is 'T'.
 * On several threads each OpenMP thread computes one block of C (rows when M >= N, else
 * columns; 16-aligned) with a single-threaded dnnl_sgemm (oneDNN runs one thread inside a
 * parallel region): no reduction over K, one fork/join per product. oneDNN's own threading
 * was up to 3x slower on some byte-tiny shapes on two threads (bench/bench_gemm.c ":split"). */
/* rows [r0, r1) of C (N columns, ldc apart) = the bias (N floats) in every row */
static void seed_rows(float *C, int64_t ldc, const float *bias, int64_t N, int64_t r0,
                      int64_t r1) {
    for (int64_t r = r0; r < r1; r++) memcpy(C + r * ldc, bias, (size_t)N * sizeof(float));
}

/* seed: NULL, or C is first set to this row (N floats) in every row (then beta must be 1):
 * inside the product's own parallel region, each thread its block of rows just before its
 * product (one fork/join instead of two, and the block still cached) */
static void sgemm_seeded(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                         float *C, int64_t ldc, const float *seed) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt <= 1 || (double)M * (double)N * (double)K < SPLIT_MIN) {
        if (seed) seed_rows(C, ldc, seed, N, 0, M);
        sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const int rows = M >= N;
    const int64_t n = rows ? M : N, per = ((n + nt - 1) / nt + 15) / 16 * 16;
#pragma omp parallel num_threads(nt)
    {
        int64_t x0 = omp_get_thread_num() * per, x1 = x0 + per < n ? x0 + per : n;
        if (seed) { /* the thread's rows (a row split) or an even share of them */
            const int64_t s0 = rows ? x0 : omp_get_thread_num() * ((M + nt - 1) / nt);
            const int64_t s1 = rows ? x1 : s0 + (M + nt - 1) / nt;
            seed_rows(C, ldc, seed, N, s0 < M ? s0 : M, s1 < M ? s1 : M);
            if (!rows) {
#pragma omp barrier
            }
        }
        if (x0 < x1) {
            if (rows) /* rows x0..x1 of op(A) and C */
                sgemm1(ta, tb, x1 - x0, N, K, alpha, A + x0 * (ta == 'N' ? lda : 1), lda, B,
                       ldb, beta, C + x0 * ldc, ldc);
            else /* columns x0..x1 of op(B) and C */
                sgemm1(ta, tb, M, x1 - x0, K, alpha, A, lda, B + x0 * (tb == 'N' ? 1 : ldb),
                       ldb, beta, C + x0, ldc);
        }
    }
}

static void sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc) {
    sgemm_seeded(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

/* the same product for the other kernel files (kernels/sgemm.h: the bf16 GEMMs' fp32 path) */
void kernels_sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                   float *C, int64_t ldc) {
    sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                    int64_t N, int IC, int OC) {
    if (N <= LOOM_MATMUL_ROWS_MAX) { /* a few rows: stream the weights, do not pack them */
        matmul_rows_forward(out, inp, weight, bias, N, IC, OC);
        return;
    }
    /* with a bias, each output row is seeded with it, then sgemm accumulates onto it */
    sgemm_seeded('N', 'T', N, OC, IC, 1.0f, inp, IC, weight, IC, bias ? 1.0f : 0.0f, out, OC,
                 bias);
}

/* Sums of columns [o0, o1) of dout (N, OC) over the rows, in row order, added to dbias. Each
 * column is its own chain of float adds from 0, so the vector width never changes a bit: the
 * AVX-512 version below gives exactly the bits of this one and is chosen by the CPU alone. */
static void colsum_plain(float *dbias, const float *dout, int64_t N, int OC, int o0, int o1) {
    float acc[256];
    for (int o = o0; o < o1; o++) acc[o - o0] = 0.0f;
    for (int64_t n = 0; n < N; n++) {
        const float *row = dout + n * OC;
        for (int o = o0; o < o1; o++) acc[o - o0] += row[o];
    }
    for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
}

#if defined(__x86_64__)
#include <immintrin.h>
/* 16 zmm accumulators hold a 256-column slice in registers (the plain loop, compiled for the
 * portable baseline, loaded and stored its partial sums for every row: 1.7% of a byte-tiny
 * step). Columns past o1 are masked off. */
__attribute__((target("avx512f"))) static void colsum_avx512(float *dbias, const float *dout,
                                                             int64_t N, int OC, int o0, int o1) {
    for (int c0 = o0; c0 < o1; c0 += 256) {
        __m512 acc[16];
        __mmask16 km[16];
        int nv = (o1 - c0 + 15) / 16;
        if (nv > 16) nv = 16;
        for (int v = 0; v < 16; v++) {
            int left = o1 - c0 - 16 * v;
            km[v] = left >= 16 ? (__mmask16)0xFFFF
                    : left > 0 ? (__mmask16)((1u << left) - 1u)
                               : (__mmask16)0;
            acc[v] = _mm512_setzero_ps();
        }
        for (int64_t n = 0; n < N; n++) {
            const float *row = dout + n * OC + c0;
            for (int v = 0; v < nv; v++)
                acc[v] = _mm512_add_ps(acc[v], _mm512_maskz_loadu_ps(km[v], row + 16 * v));
        }
        for (int v = 0; v < nv; v++) {
            float *d = dbias + c0 + 16 * v;
            _mm512_mask_storeu_ps(d, km[v], _mm512_add_ps(_mm512_maskz_loadu_ps(km[v], d), acc[v]));
        }
    }
}

/* The same at AVX2 (16 ymm): NV (a constant where inlined) vectors of 8 columns from c0, in
 * registers over all the rows; with `km`, the one vector is masked to its columns. */
__attribute__((target("avx2"), always_inline)) static inline void colsum_avx2_pass(
    float *dbias, const float *dout, int64_t N, int OC, int c0, const int NV, int masked,
    __m256i km) {
    __m256 acc[16];
    for (int v = 0; v < NV; v++) acc[v] = _mm256_setzero_ps();
    for (int64_t n = 0; n < N; n++) {
        const float *row = dout + n * OC + c0;
        for (int v = 0; v < NV; v++)
            acc[v] = _mm256_add_ps(acc[v], masked ? _mm256_maskload_ps(row + 8 * v, km)
                                                  : _mm256_loadu_ps(row + 8 * v));
    }
    for (int v = 0; v < NV; v++) {
        float *d = dbias + c0 + 8 * v;
        if (masked)
            _mm256_maskstore_ps(d, km, _mm256_add_ps(_mm256_maskload_ps(d, km), acc[v]));
        else
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), acc[v]));
    }
}

/* 128 columns per pass over the rows (16 accumulators: a 256-column slice takes two passes),
 * then 64, then 8, then a masked last vector. The same chains, so the same bits. */
__attribute__((target("avx2"))) static void colsum_avx2(float *dbias, const float *dout,
                                                        int64_t N, int OC, int o0, int o1) {
    const __m256i all = _mm256_set1_epi32(-1);
    int c = o0;
    for (; o1 - c >= 128; c += 128) colsum_avx2_pass(dbias, dout, N, OC, c, 16, 0, all);
    for (; o1 - c >= 64; c += 64) colsum_avx2_pass(dbias, dout, N, OC, c, 8, 0, all);
    for (; o1 - c >= 8; c += 8) colsum_avx2_pass(dbias, dout, N, OC, c, 1, 0, all);
    if (c < o1) {
        const __m256i km = _mm256_cmpgt_epi32(_mm256_set1_epi32(o1 - c),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        colsum_avx2_pass(dbias, dout, N, OC, c, 1, 1, km);
    }
}
#endif

/* dbias (OC) += sum_n dout (N,OC): each thread owns a fixed slice of columns and sums the
 * rows in order, so the result does not depend on the thread count (or the level). The
 * vector version follows the kernels' level (loom_isa_active; NATIVE=1: the CPU's), so that
 * tests at each level run each: none changes a bit. */
static void bias_backward(float *dbias, const float *dout, int64_t N, int OC) {
    /* a slice of columns; its partial sums stay in registers/L1. 256 columns (1 KiB of each
     * row) when there are at least 4 such slices; else 64, so that the threads share the
     * work: byte-tiny's OC = 256 was one 256-column slice (one thread summed it while the
     * other waited) and 768 three. The slice width never changes a bit. */
    const int COLS = OC >= 4 * 256 ? 256 : 64;
#if defined(__x86_64__)
    __builtin_cpu_init();
    const loom_isa lvl = loom_isa_active();
    const int native = lvl == LOOM_ISA_NATIVE;
    const int avx512 = lvl == LOOM_ISA_AVX512 || (native && __builtin_cpu_supports("avx512f"));
    const int avx2 = !avx512 && (lvl == LOOM_ISA_AVX2 || (native && __builtin_cpu_supports("avx2")));
#endif
    int nchunks = (OC + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) if (N * OC >= LOOM_PAR_MIN)
    for (int c = 0; c < nchunks; c++) {
        int o0 = c * COLS, o1 = o0 + COLS < OC ? o0 + COLS : OC;
#if defined(__x86_64__)
        if (avx512) {
            colsum_avx512(dbias, dout, N, OC, o0, o1);
            continue;
        }
        if (avx2) {
            colsum_avx2(dbias, dout, N, OC, o0, o1);
            continue;
        }
#endif
        colsum_plain(dbias, dout, N, OC, o0, o1);
    }
}

/* dinp_beta: 1 accumulates into dinp, 0 overwrites it (sgemm never reads C then) */
static void backward(float *dinp, float dinp_beta, float *dweight, float *dbias,
                     const float *dout, const float *inp, const float *weight, int64_t N, int IC,
                     int OC) {
    if (dinp) /* dinp (N,IC) (+)= dout (N,OC) @ weight (OC,IC) */
        sgemm('N', 'N', N, IC, OC, 1.0f, dout, OC, weight, IC, dinp_beta, dinp, IC);
    if (dweight) /* dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC) */
        sgemm('T', 'N', OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (dbias) bias_backward(dbias, dout, N, OC);
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int64_t N, int IC, int OC) {
    backward(dinp, 1.0f, dweight, dbias, dout, inp, weight, N, IC, OC);
}

/* The model's block zeroed each dinp before accumulating into it: 28 MB of single-threaded
 * memset per byte-tiny layer and step with the GELU's. Overwriting gives the same bits (the
 * product added to +0 is the product, but for the sign of an exact zero). */
void matmul_backward_set(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int64_t N, int IC, int OC) {
    backward(dinp, 0.0f, dweight, dbias, dout, inp, weight, N, IC, OC);
}
