/* bfloat16 conversions (--weights bf16, docs/inference.md): a bf16 is the upper 16 bits of an
 * fp32. Conversions, not ops: inline here for the model code and the kernels alike. */
#ifndef LOOM_BF16_H
#define LOOM_BF16_H

#include <stdint.h>
#include <string.h>

/* fp32 -> bf16 to nearest, ties to even (as torch's .to(bfloat16)); NaN stays a quiet NaN */
static inline uint16_t loom_bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bf16 -> the fp32 it stands for, exactly */
static inline float loom_bf16_widen(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
