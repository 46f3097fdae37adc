/* Linear layer: out = inp @ weight^T + bias, through OpenBLAS sgemm (row-major).
 * inp (N,IC), weight (OC,IC), bias (OC), out (N,OC). */
#include "kernels/kmath.h"

#include <cblas.h>

#include "loom/kernels.h"

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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)N, OC, IC, 1.0f, inp, IC,
                weight, IC, beta, out, OC);
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)N, IC, OC, 1.0f, dout,
                    OC, weight, IC, 1.0f, dinp, IC);
    if (dweight) /* dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, (blasint)N, 1.0f, dout, OC,
                    inp, IC, 1.0f, dweight, IC);
    if (dbias) bias_backward(dbias, dout, N, OC);
}
