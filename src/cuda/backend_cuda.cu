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

static const loom_backend *table(void) {
    pthread_once(&g_once, build);
    return &g_table;
}

} // namespace LOOM_CU_NS

/* include/loom/backend.h */
#ifdef LOOM_CUDA_EMU
extern "C" const loom_backend *loom_backend_cuda_emu(void) { return LOOM_CU_NS::table(); }
#else
extern "C" const loom_backend *loom_backend_cuda(void) { return LOOM_CU_NS::table(); }
extern "C" int loom_cuda_init(char *why, size_t n) { return LOOM_CU_NS::cu_init(why, n); }
extern "C" int loom_cuda_device_name(char *buf, size_t n) { return LOOM_CU_NS::cu_device_name(buf, n); }
extern "C" int loom_cuda_mem_info(size_t *used, size_t *total) { return LOOM_CU_NS::cu_mem_info(used, total); }
extern "C" int loom_cuda_describe(char *buf, size_t n) { return LOOM_CU_NS::cu_describe(buf, n); }
#endif
