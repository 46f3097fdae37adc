/* GEMMs of the CUDA backend: cu_gemm (cuBLASLt on the GPU, plain loops in the emulator) and
 * the table's matmul ops on it (fp32, bf16 mixed precision). Row-major loom tensors are
 * column-major transposes to cuBLAS: out (N,OC) = inp (N,IC) W^T is, column-major,
 * out^T (OC,N) = W^T (OC,IC) inp^T (IC,N), W stored (IC,OC) ld IC; docs/gpu.md. */
#include "cu_common.cuh"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifndef LOOM_CUDA_EMU
#include <cublasLt.h>
#include <dlfcn.h>
#endif

extern "C" {
#include "loom/base.h"
}

namespace LOOM_CU_NS {

__device__ __forceinline__ float cu_gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* the bias (and GELU) applied after a GEMM whose epilogue could not: C (m, n) column-major */
__global__ void k_bias_cols(void *C, int c_type, int ldc, int m, int n, const float *bias,
                            int gelu) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)m * n) return;
    const int i = (int)(idx % m), j = (int)(idx / m);
    const int64_t at = (int64_t)j * ldc + i;
    float v = c_type == CU_BF16 ? cu_bf16(((uint16_t *)C)[at]) : ((float *)C)[at];
    if (bias) v += bias[i];
    if (gelu) v = cu_gelu_tanh(v);
    if (c_type == CU_BF16) ((uint16_t *)C)[at] = cu_round(v);
    else ((float *)C)[at] = v;
}

#ifdef LOOM_CUDA_EMU

static float ld_el(const void *p, int type, int64_t i) {
    return type == CU_BF16 ? cu_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

void cu_gemm(int a_t, int b_t, int m, int n, int k, float alpha, const void *A, int lda,
             int64_t stride_a, const void *B, int ldb, int64_t stride_b, float beta, void *C,
             int ldc, int64_t stride_c, int batch, int ab_type, int c_type, const float *bias,
             int epi_gelu) {
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                for (int p = 0; p < k; p++) {
                    const int64_t ai = b * stride_a + (a_t ? p + (int64_t)i * lda : i + (int64_t)p * lda);
                    const int64_t bi = b * stride_b + (b_t ? j + (int64_t)p * ldb : p + (int64_t)j * ldb);
                    acc += ld_el(A, ab_type, ai) * ld_el(B, ab_type, bi);
                }
                const int64_t ci = b * stride_c + i + (int64_t)j * ldc;
                float v = alpha * acc;
                if (beta != 0.0f) v += beta * ld_el(C, c_type, ci);
                if (bias) v += bias[i];
                if (epi_gelu) v = cu_gelu_tanh(v);
                if (c_type == CU_BF16) ((uint16_t *)C)[ci] = cu_round(v);
                else ((float *)C)[ci] = v;
            }
}

#else

#define LT_CHECK(call)                                                                      \
    do {                                                                                    \
        cublasStatus_t lt_s_ = (call);                                                      \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS)                                                 \
            cu_fail(__FILE__, __LINE__, #call, cublasLtGetStatusString(lt_s_));              \
    } while (0)

/* cuBLASLt is opened at the first GEMM (dlopen), not linked: the library is half a gigabyte,
 * and a loader that maps and relocates it at start-up made every loom process, cpu runs
 * included, ~230 MB resident before doing anything. Only cublasLt.h's declarations are used at
 * build time; the calls below go through the opened library. */
#define LOOM_LT_FNS(X)                                                                        \
    X(Create) X(GetStatusString) X(Matmul) X(MatmulAlgoGetHeuristic) X(MatmulDescCreate)       \
    X(MatmulDescDestroy) X(MatmulDescSetAttribute) X(MatmulPreferenceCreate)                   \
    X(MatmulPreferenceDestroy) X(MatmulPreferenceSetAttribute) X(MatrixLayoutCreate)           \
    X(MatrixLayoutDestroy) X(MatrixLayoutSetAttribute)
static struct {
#define LOOM_LT_PTR(name) decltype(&cublasLt##name) name;
    LOOM_LT_FNS(LOOM_LT_PTR)
#undef LOOM_LT_PTR
} g_lt_api;
#define cublasLtCreate (g_lt_api.Create)
#define cublasLtGetStatusString (g_lt_api.GetStatusString)
#define cublasLtMatmul (g_lt_api.Matmul)
#define cublasLtMatmulAlgoGetHeuristic (g_lt_api.MatmulAlgoGetHeuristic)
#define cublasLtMatmulDescCreate (g_lt_api.MatmulDescCreate)
#define cublasLtMatmulDescDestroy (g_lt_api.MatmulDescDestroy)
#define cublasLtMatmulDescSetAttribute (g_lt_api.MatmulDescSetAttribute)
#define cublasLtMatmulPreferenceCreate (g_lt_api.MatmulPreferenceCreate)
#define cublasLtMatmulPreferenceDestroy (g_lt_api.MatmulPreferenceDestroy)
#define cublasLtMatmulPreferenceSetAttribute (g_lt_api.MatmulPreferenceSetAttribute)
#define cublasLtMatrixLayoutCreate (g_lt_api.MatrixLayoutCreate)
#define cublasLtMatrixLayoutDestroy (g_lt_api.MatrixLayoutDestroy)
#define cublasLtMatrixLayoutSetAttribute (g_lt_api.MatrixLayoutSetAttribute)

static cublasLtHandle_t g_lt;
static void *g_ws;
static const size_t WS_BYTES = (size_t)32 << 20; /* Hopper wants 32 MiB (llm.c) */
static pthread_once_t g_lt_once = PTHREAD_ONCE_INIT;
static void lt_init(void) {
    static const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h)
        loom_panic(__FILE__, __LINE__, "cuda: cuBLASLt is not installed where the loader looks "
                   "(dlopen libcublasLt.so.13: %s; LD_LIBRARY_PATH names its folder)", dlerror());
#define LOOM_LT_SYM(name)                                                                    \
    if (!(g_lt_api.name = (decltype(g_lt_api.name))dlsym(h, "cublasLt" #name)))              \
        loom_panic(__FILE__, __LINE__, "cuda: libcublasLt has no cublasLt" #name " (too old)");
    LOOM_LT_FNS(LOOM_LT_SYM)
#undef LOOM_LT_SYM
    LT_CHECK(cublasLtCreate(&g_lt));
    CU_CHECK(cudaMalloc(&g_ws, WS_BYTES));
}

static cudaDataType_t dt(int t) { return t == CU_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

static cublasLtMatrixLayout_t layout(int type, int rows, int cols, int ld, int batch,
                                     int64_t stride) {
    cublasLtMatrixLayout_t l;
    LT_CHECK(cublasLtMatrixLayoutCreate(&l, dt(type), (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                  sizeof batch));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof stride));
    }
    return l;
}

/* one attempt: 0 done, -1 when no algorithm supports it (then the caller drops the epilogue) */
static int lt_matmul(int a_t, int b_t, int m, int n, int k, float alpha, const void *A, int lda,
                     int64_t sa, const void *B, int ldb, int64_t sb, float beta, void *C, int ldc,
                     int64_t sc, int batch, int ab_type, int c_type, const float *bias,
                     int epi_gelu) {
    static int tf32 = -1;
    if (tf32 < 0) tf32 = getenv("LOOM_CUDA_TF32") && !strcmp(getenv("LOOM_CUDA_TF32"), "1");
    const cublasComputeType_t ct =
        ab_type == CU_F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t d;
    LT_CHECK(cublasLtMatmulDescCreate(&d, ct, CUDA_R_32F));
    cublasOperation_t ta = a_t ? CUBLAS_OP_T : CUBLAS_OP_N, tb = b_t ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (bias && epi_gelu) epi = CUBLASLT_EPILOGUE_GELU_BIAS;
    else if (bias) epi = CUBLASLT_EPILOGUE_BIAS;
    else if (epi_gelu) epi = CUBLASLT_EPILOGUE_GELU;
    LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) {
        cudaDataType_t bt = CUDA_R_32F;
        LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
        LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                sizeof bt));
    }
    cublasLtMatrixLayout_t la = layout(ab_type, a_t ? k : m, a_t ? m : k, lda, batch, sa);
    cublasLtMatrixLayout_t lb = layout(ab_type, b_t ? n : k, b_t ? k : n, ldb, batch, sb);
    cublasLtMatrixLayout_t lc = layout(c_type, m, n, ldc, batch, sc);
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &WS_BYTES, sizeof WS_BYTES));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g_lt, d, la, lb, lc, lc, pref, 1, &h, &found);
    int rc = -1;
    if (s == CUBLAS_STATUS_SUCCESS && found > 0) {
        LT_CHECK(cublasLtMatmul(g_lt, d, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &h.algo, g_ws,
                                WS_BYTES, cu_stream()));
        rc = 0;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
    return rc;
}

void cu_gemm(int a_t, int b_t, int m, int n, int k, float alpha, const void *A, int lda,
             int64_t stride_a, const void *B, int ldb, int64_t stride_b, float beta, void *C,
             int ldc, int64_t stride_c, int batch, int ab_type, int c_type, const float *bias,
             int epi_gelu) {
    if (m <= 0 || n <= 0 || batch <= 0) return;
    cu_enter();
    pthread_once(&g_lt_once, lt_init);
    if (k <= 0) { /* C = beta C (+ bias): cuBLASLt wants k >= 1 */
        if (beta == 0.0f) {
            for (int b = 0; b < batch; b++)
                CU_CHECK(cudaMemset2DAsync((char *)C + b * stride_c * (c_type == CU_BF16 ? 2 : 4),
                                           (size_t)ldc * (c_type == CU_BF16 ? 2 : 4), 0,
                                           (size_t)m * (c_type == CU_BF16 ? 2 : 4), (size_t)n,
                                           cu_stream()));
        }
        if (bias || epi_gelu)
            for (int b = 0; b < batch; b++)
                CU_LAUNCH(k_bias_cols, cu_blocks((int64_t)m * n, 256), 256, 0,
                          (char *)C + b * stride_c * (c_type == CU_BF16 ? 2 : 4), c_type, ldc, m,
                          n, bias, epi_gelu);
        return;
    }
    if (!lt_matmul(a_t, b_t, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                   stride_c, batch, ab_type, c_type, bias, epi_gelu))
        return;
    /* no algorithm with this epilogue: the plain GEMM, then the bias/GELU kernel */
    if ((bias || epi_gelu) &&
        !lt_matmul(a_t, b_t, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                   stride_c, batch, ab_type, c_type, NULL, 0)) {
        for (int b = 0; b < batch; b++)
            CU_LAUNCH(k_bias_cols, cu_blocks((int64_t)m * n, 256), 256, 0,
                      (char *)C + b * stride_c * (c_type == CU_BF16 ? 2 : 4), c_type, ldc, m, n,
                      bias, epi_gelu);
        return;
    }
    char what[160];
    snprintf(what, sizeof what, "cublasLt: no algorithm for m %d n %d k %d batch %d (%s)", m, n,
             k, batch, ab_type == CU_BF16 ? "bf16" : "fp32");
    cu_fail(__FILE__, __LINE__, what, "CUBLAS_STATUS_NOT_SUPPORTED");
}

#endif

/* ---- the matmul ops ------------------------------------------------------------------- */

/* dbias (OC) += column sums of dout (N, OC): 32 columns per block, 32 row lanes, fixed order */
__global__ void k_bias_grad(float *dbias, const float *dout, int64_t N, int OC) {
    __shared__ float sh[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < OC)
        for (int64_t r = threadIdx.y; r < N; r += 32) s += dout[r * OC + c];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.0f;
        for (int y = 0; y < 32; y++) t += sh[y][threadIdx.x];
        dbias[c] += t;
    }
}
static void bias_grad(float *dbias, const float *dout, int64_t N, int OC) {
    if (dbias && N > 0) CU_LAUNCH(k_bias_grad, cu_blocks(OC, 32), dim3(32, 32), 0, dbias, dout, N, OC);
}

static void mm_forward(float *out, const float *inp, const float *weight, const float *bias,
                       int64_t N, int IC, int OC) {
    cu_gemm(1, 0, OC, (int)N, IC, 1.0f, weight, IC, 0, inp, IC, 0, 0.0f, out, OC, 0, 1, CU_F32,
            CU_F32, bias, 0);
}
static void mm_backward_(float *dinp, int set, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int64_t N, int IC, int OC) {
    if (dinp)
        cu_gemm(0, 0, IC, (int)N, OC, 1.0f, weight, IC, 0, dout, OC, 0, set ? 0.0f : 1.0f, dinp,
                IC, 0, 1, CU_F32, CU_F32, NULL, 0);
    if (dweight)
        cu_gemm(0, 1, IC, OC, (int)N, 1.0f, inp, IC, 0, dout, OC, 0, 1.0f, dweight, IC, 0, 1,
                CU_F32, CU_F32, NULL, 0);
    bias_grad(dbias, dout, N, OC);
}
static void mm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int64_t N, int IC, int OC) {
    mm_backward_(dinp, 0, dweight, dbias, dout, inp, weight, N, IC, OC);
}
static void mm_backward_set(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int64_t N, int IC, int OC) {
    mm_backward_(dinp, 1, dweight, dbias, dout, inp, weight, N, IC, OC);
}

/* fp32 <-> bf16 conversions (bf16_from_f32 / bf16_to_f32, and the backward's rounded dout) */
__global__ void k_widen(float *dst, const uint16_t *src, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = cu_bf16(src[i]);
}
__global__ void k_round(uint16_t *dst, const float *src, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = cu_round(src[i]);
}

static void bf16_mm_forward(uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                            const float *bias, int64_t N, int IC, int OC) {
    cu_gemm(1, 0, OC, (int)N, IC, 1.0f, weight, IC, 0, inp, IC, 0, 0.0f, out, OC, 0, 1, CU_BF16,
            CU_BF16, bias, 0);
}
static void bf16_mm_forward_f32(float *out, const uint16_t *inp, const uint16_t *weight,
                                const float *bias, int64_t N, int IC, int OC) {
    cu_gemm(1, 0, OC, (int)N, IC, 1.0f, weight, IC, 0, inp, IC, 0, 0.0f, out, OC, 0, 1, CU_BF16,
            CU_F32, bias, 0);
}
static void bf16_mm_backward(float *dinp, int dinp_set, float *dweight, float *dbias,
                             const float *dout, uint16_t *dout_bf16, const uint16_t *inp,
                             const uint16_t *weight, int64_t N, int IC, int OC) {
    const int64_t n = N * OC;
    if (dout && n > 0) CU_LAUNCH(k_round, cu_blocks(n, 256), 256, 0, dout_bf16, dout, n);
    if (dinp)
        cu_gemm(0, 0, IC, (int)N, OC, 1.0f, weight, IC, 0, dout_bf16, OC, 0,
                dinp_set ? 0.0f : 1.0f, dinp, IC, 0, 1, CU_BF16, CU_F32, NULL, 0);
    if (dweight)
        cu_gemm(0, 1, IC, OC, (int)N, 1.0f, inp, IC, 0, dout_bf16, OC, 0, 1.0f, dweight, IC, 0,
                1, CU_BF16, CU_F32, NULL, 0);
    if (dout) bias_grad(dbias, dout, N, OC);
}
static int bf16_native(void) { return 1; }

static void bf16_from_f32_(uint16_t *dst, const float *src, int64_t n) {
    if (n > 0) CU_LAUNCH(k_round, cu_blocks(n, 256), 256, 0, dst, src, n);
}
static void bf16_to_f32_(float *dst, const uint16_t *src, int64_t n) {
    if (n > 0) CU_LAUNCH(k_widen, cu_blocks(n, 256), 256, 0, dst, src, n);
}

void cu_fill_gemm(loom_backend *t) {
    t->matmul_forward = mm_forward;
    t->matmul_backward = mm_backward;
    t->matmul_backward_set = mm_backward_set;
    t->bf16_matmul_native = bf16_native;
    t->bf16_matmul_forward = bf16_mm_forward;
    t->bf16_matmul_forward_f32 = bf16_mm_forward_f32;
    t->bf16_matmul_backward = bf16_mm_backward;
    t->bf16_from_f32 = bf16_from_f32_;
    t->bf16_to_f32 = bf16_to_f32_;
}

} // namespace LOOM_CU_NS
