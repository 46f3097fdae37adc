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
static void sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt <= 1 || (double)M * (double)N * (double)K < SPLIT_MIN) {
        sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const int rows = M >= N;
    const int64_t n = rows ? M : N, per = ((n + nt - 1) / nt + 15) / 16 * 16;
#pragma omp parallel num_threads(nt)
    {
        int64_t x0 = omp_get_thread_num() * per, x1 = x0 + per < n ? x0 + per : n;
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

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                    int64_t N, int IC, int OC) {
    if (N <= LOOM_MATMUL_ROWS_MAX) { /* a few rows: stream the weights, do not pack them */
        matmul_rows_forward(out, inp, weight, bias, N, IC, OC);
        return;
    }
    float beta = 0.0f;
    if (bias) {
        /* seed each output row with the bias, then sgemm accumulates onto it */
#pragma omp parallel for schedule(static) if (N * OC >= LOOM_PAR_MIN)
        for (int64_t n = 0; n < N; n++) memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    sgemm('N', 'T', N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

/* dbias (OC) += sum_n dout (N,OC): each thread owns a fixed slice of columns and sums the
 * rows in order, so the result does not depend on the thread count. */
static void bias_backward(float *dbias, const float *dout, int64_t N, int OC) {
    enum { COLS = 256 }; /* a slice of columns; its partial sums stay in registers/L1 */
    int nchunks = (OC + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) if (N * OC >= LOOM_PAR_MIN)
    for (int c = 0; c < nchunks; c++) {
        int o0 = c * COLS, o1 = o0 + COLS < OC ? o0 + COLS : OC;
        float acc[COLS];
        for (int o = o0; o < o1; o++) acc[o - o0] = 0.0f;
        for (int64_t n = 0; n < N; n++) {
            const float *row = dout + n * OC;
            for (int o = o0; o < o1; o++) acc[o - o0] += row[o];
        }
        for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int64_t N, int IC, int OC) {
    if (dinp) /* dinp (N,IC) += dout (N,OC) @ weight (OC,IC) */
        sgemm('N', 'N', N, IC, OC, 1.0f, dout, OC, weight, IC, 1.0f, dinp, IC);
    if (dweight) /* dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC) */
        sgemm('T', 'N', OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (dbias) bias_backward(dbias, dout, N, OC);
}
