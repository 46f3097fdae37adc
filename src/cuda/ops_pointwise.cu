/* The CUDA backend's pointwise ops (cu_common.cuh: the dialect; docs/gpu.md). */
#include "cu_common.cuh"

namespace LOOM_CU_NS {

void cu_fill_pointwise(loom_backend *t) { (void)t; }

} // namespace LOOM_CU_NS
