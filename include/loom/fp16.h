/* IEEE half-precision (fp16) conversions: GGUF's block scales (--weights int8, the GGUF
 * export). Conversions, not ops: inline here for the model code, the kernels and the export. */
#ifndef LOOM_FP16_H
#define LOOM_FP16_H

#include <stdint.h>
#include <string.h>

/* fp32 -> fp16 to nearest, ties to even (as numpy's astype(float16) and F16C's vcvtps2ph);
 * 65520 and up become inf, NaN stays a quiet NaN */
static inline uint16_t loom_fp16_round(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up: inf */
    if (ax >= 0x38800000u) { /* a normal fp16: round at bit 13, rebias the exponent */
        const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - (112u << 23);
        return (uint16_t)(sign | (r >> 13));
    }
    /* below 2^-14: a multiple of 2^-24 (a subnormal fp16, the smallest normal, or 0) */
    const int e = (int)(ax >> 23);
    const int s = 126 - e; /* m * 2^(e - 150) = (m >> s) units of 2^-24 */
    if (e == 0 || s > 24) return sign;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> s;
    const uint32_t rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* fp16 -> the fp32 it stands for, exactly: the magnitude's bits moved to fp32's places and
 * scaled by 2^112 (exact for normal and subnormal halves alike); inf and NaN kept */
static inline float loom_fp16_widen(uint16_t h) {
    const uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
    float f;
    if ((h & 0x7c00u) == 0x7c00u) {
        const uint32_t u = ((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | mag;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    memcpy(&f, &mag, sizeof f);
    f *= 0x1p112f;
    return (h & 0x8000u) ? -f : f;
}

#endif
