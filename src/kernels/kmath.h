/* Private math helpers for the CPU kernels: branch-free exp/tanh/sigmoid written so that
 * gcc -O3 vectorizes the loops that call them (libm's expf/tanhf stay scalar without
 * -ffast-math). Accuracy: loom_expf is within ~2 ulp of exp on [-87.3, 88]; inputs below
 * -87.3 return 0, inputs above 88 saturate at exp(88).
 *
 * Including this header turns on gcc's -fno-trapping-math for the rest of the file (include
 * it first): gcc only if-converts the clamps, and so vectorizes these loops, under it. That flag
 * changes no result (no reassociation, no contraction change, IEEE semantics kept); it only
 * lets the compiler assume floating-point exceptions are not trapped. */
#ifndef LOOM_KERNELS_KMATH_H
#define LOOM_KERNELS_KMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Below this many elements a loop runs on one thread (the fork/join costs more). */
#define LOOM_PAR_MIN 16384

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

/* exp(x) by Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial
 * for exp(r) (Cephes' expf coefficients), and 2^n assembled in the exponent bits. */
static inline float loom_expf(float x) {
    const float hi = 88.0f, lo = -87.3365447505531f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    /* round(x / ln2) with the 1.5*2^23 trick: exact for |n| < 2^22, no libm call */
    const float shifter = 12582912.0f;
    float t = xc * 1.44269504088896341f + shifter;
    float n = t - shifter;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t e = (int32_t)n + 127;
    /* below lo the bits are masked to 0.0f, so exp underflows to 0 (an integer mask, not a
     * float select, keeps the loop branch-free for the vectorizer) */
    uint32_t keep = (uint32_t)0 - (uint32_t)(xc > lo);
    uint32_t bits = ((uint32_t)e << 23) & keep;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) in (0, 1]: tends to +-1 exactly
 * for large |x|; absolute error ~1e-7 near 0 (harmless where it is used: GELU adds 1). */
static inline float loom_tanhf(float x) {
    float e = loom_expf(-2.0f * fabsf(x));
    return copysignf((1.0f - e) / (1.0f + e), x);
}

/* 1 - tanh(x)^2 = 4e / (1 + e)^2 with e = exp(-2|x|): decays to 0 with no cancellation. */
static inline float loom_sech2f(float x) {
    float e = loom_expf(-2.0f * fabsf(x));
    float d = 1.0f + e;
    return 4.0f * e / (d * d);
}

/* 1 / (1 + exp(-x)) */
static inline float loom_sigmoidf(float x) {
    return 1.0f / (1.0f + loom_expf(-x));
}

#endif
