/* matmul_rows_bf16_forward and the bf16 conversions: the kernels of matmul_rows.c compiled
 * with bf16 weights, in an object of their own. */
#ifndef LOOM_KV
#include <string.h>

#include "kernels/kmath.h"
#include "loom/kernels.h"

#define LOOM_KSELF "kernels/matmul_rows_bf16.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(matmul_rows_bf16_forward, (float *out, const float *inp, const uint16_t *weight,
                                         const float *bias, int64_t N, int IC, int OC),
              (out, inp, weight, bias, N, IC, OC))

#else
#define LOOM_MR_BF16_FILE
#include "kernels/matmul_rows.c"
#undef LOOM_MR_BF16_FILE
#endif
