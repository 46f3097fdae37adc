/* Private to src/kernels: the fp32 GEMM of matmul.c (dnnl_sgemm, split over the OpenMP
 * threads by blocks of C), for kernels that multiply fp32 operands of their own. */
#ifndef LOOM_KERNELS_SGEMM_H
#define LOOM_KERNELS_SGEMM_H

#include <stdint.h>

/* C (M,N) = alpha * op(A) op(B) + beta * C, row-major; op = transpose when ta/tb is 'T' */
void kernels_sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                   float *C, int64_t ldc);

#endif
