/* The CUDA backend's infer ops (cu_common.cuh: the dialect; docs/gpu.md). */
#include "cu_common.cuh"

namespace LOOM_CU_NS {

void cu_fill_infer(loom_backend *t) { (void)t; }

} // namespace LOOM_CU_NS
