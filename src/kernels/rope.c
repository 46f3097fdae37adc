/* Rotary position embeddings, "rotate half" convention (Hugging Face Llama): in each head of
 * D floats, element i < D/2 pairs with i + D/2 and turns by angle pos * theta^(-2i/D). */
#ifndef LOOM_KV
#include "kernels/kmath.h"
#include "loom/kernels.h"

/* cos_t, sin_t (max_T, D/2). The angle is formed in float32 exactly as HF does
 * (inv_freq = 1 / theta^(2i/D) in float32, then float(pos) * inv_freq rounded to float), and
 * its cos/sin are taken in double, so the tables match HF's to an ulp. */
void rope_tables(float *cos_t, float *sin_t, int max_T, int D, float theta) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)D);
        for (int t = 0; t < max_T; t++) {
            float ang = (float)t * inv_freq;
            cos_t[(int64_t)t * half + i] = (float)cos((double)ang);
            sin_t[(int64_t)t * half + i] = (float)sin((double)ang);
        }
    }
}

/* cos_t, sin_t (max_T, D/2) from given inverse frequencies (RoPE scalings, model/arch.c):
 * the angle float(pos) * inv_freq[i] in float32 as HF forms it, cos/sin in double, times
 * scale (yarn's attention factor; 1 leaves the tables unscaled). */
void rope_tables_freq(float *cos_t, float *sin_t, int max_T, int D, const float *inv_freq,
                      float scale) {
    int half = D / 2;
    for (int i = 0; i < half; i++)
        for (int t = 0; t < max_T; t++) {
            float ang = (float)t * inv_freq[i];
            cos_t[(int64_t)t * half + i] = (float)cos((double)ang) * scale;
            sin_t[(int64_t)t * half + i] = (float)sin((double)ang) * scale;
        }
}

#define LOOM_KSELF "kernels/rope.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(rope_forward, (float *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                             const float *cos_t, const float *sin_t, int pos0),
              (x, B, T, nh, D, row_stride, cos_t, sin_t, pos0))
LOOM_DISPATCH(rope_backward, (float *dx, int64_t B, int T, int nh, int D, int64_t row_stride,
                              const float *cos_t, const float *sin_t, int pos0),
              (dx, B, T, nh, D, row_stride, cos_t, sin_t, pos0))

#else /* one level of the kernels (isa_variants.h) */

/* sign = +1: forward rotation; -1: its transpose (inverse). */
static void LOOM_KV(rope_apply)(float *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                       const float *cos_t, const float *sin_t, int pos0, float sign) {
    int half = D / 2;
    int64_t rows = B * T;
#pragma omp parallel for schedule(static) if (rows * nh * D >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t pos = pos0 + r % T;
        const float *c = cos_t + pos * half, *s = sin_t + pos * half;
        for (int h = 0; h < nh; h++) {
            float *x1 = x + r * row_stride + (int64_t)h * D, *x2 = x1 + half;
            for (int i = 0; i < half; i++) {
                float a = x1[i], b = x2[i], sn = sign * s[i];
                x1[i] = a * c[i] - b * sn;
                x2[i] = b * c[i] + a * sn;
            }
        }
    }
}

static void LOOM_KV(rope_forward)(float *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                  const float *cos_t, const float *sin_t, int pos0) {
    LOOM_KV(rope_apply)(x, B, T, nh, D, row_stride, cos_t, sin_t, pos0, 1.0f);
}

static void LOOM_KV(rope_backward)(float *dx, int64_t B, int T, int nh, int D, int64_t row_stride,
                   const float *cos_t, const float *sin_t, int pos0) {
    LOOM_KV(rope_apply)(dx, B, T, nh, D, row_stride, cos_t, sin_t, pos0, -1.0f);
}

#endif
