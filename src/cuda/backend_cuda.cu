/* The `cuda` backend's op table (and, compiled by the host compiler, `cuda-emu`'s): each ops
 * file fills its part (cu_common.cuh lists them). docs/gpu.md. */
#include "cu_common.cuh"

#include <pthread.h>
#include <string.h>

namespace LOOM_CU_NS {

static loom_backend g_table;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build(void) {
    memset(&g_table, 0, sizeof g_table);
#ifdef LOOM_CUDA_EMU
    g_table.name = "cuda-emu";
#else
    g_table.name = "cuda";
#endif
    cu_fill_memory(&g_table);
    cu_fill_gemm(&g_table);
    cu_fill_pointwise(&g_table);
    cu_fill_loss(&g_table);
    cu_fill_attention(&g_table);
    cu_fill_moe_lora(&g_table);
    cu_fill_infer(&g_table);
}

/* the tensor-core primitive's self-test (test_cuda_core): one warp, D (16 x 8 fp32) = A (16 x
 * 16 bf16, row-major) B (16 x 8 bf16, k-major) + C, each lane loading its fragments by
 * cu_mma_bf16_16816's layout */
__global__ void k_mma_selftest(float *D, const uint16_t *A, const uint16_t *B, const float *C) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t a[4], b[2];
    float c[4], d[4];
    for (int r = 0; r < 4; r++) {
        const int row = g + ((r & 1) ? 8 : 0), col = 2 * t + ((r & 2) ? 8 : 0);
        a[r] = (uint32_t)A[row * 16 + col] | ((uint32_t)A[row * 16 + col + 1] << 16);
    }
    for (int r = 0; r < 2; r++) {
        const int k = 2 * t + 8 * r;
        b[r] = (uint32_t)B[k * 8 + g] | ((uint32_t)B[(k + 1) * 8 + g] << 16);
    }
    for (int i = 0; i < 4; i++) c[i] = C[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)];
    cu_mma_bf16_16816(d, a, b, c);
    for (int i = 0; i < 4; i++) D[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = d[i];
}
static void mma_selftest(float *D, const uint16_t *A, const uint16_t *B, const float *C) {
    CU_LAUNCH(k_mma_selftest, 1, 32, 0, D, A, B, C);
}

static const loom_backend *table(void) {
    pthread_once(&g_once, build);
    return &g_table;
}

} // namespace LOOM_CU_NS

/* include/loom/backend.h */
#ifdef LOOM_CUDA_EMU
extern "C" const loom_backend *loom_backend_cuda_emu(void) { return LOOM_CU_NS::table(); }
extern "C" void loom_cuda_emu_mma_selftest(float *D, const uint16_t *A, const uint16_t *B,
                                           const float *C) {
    LOOM_CU_NS::mma_selftest(D, A, B, C);
}
#else
extern "C" const loom_backend *loom_backend_cuda(void) { return LOOM_CU_NS::table(); }
extern "C" void loom_cuda_mma_selftest(float *D, const uint16_t *A, const uint16_t *B,
                                       const float *C) {
    LOOM_CU_NS::mma_selftest(D, A, B, C);
}
extern "C" int loom_cuda_init(char *why, size_t n) { return LOOM_CU_NS::cu_init(why, n); }
extern "C" int loom_cuda_device_name(char *buf, size_t n) { return LOOM_CU_NS::cu_device_name(buf, n); }
extern "C" int loom_cuda_mem_info(size_t *used, size_t *total) { return LOOM_CU_NS::cu_mem_info(used, total); }
extern "C" int loom_cuda_describe(char *buf, size_t n) { return LOOM_CU_NS::cu_describe(buf, n); }
#endif
