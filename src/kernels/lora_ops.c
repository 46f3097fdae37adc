/* The cpu kernels of the backend's LoRA ops (include/loom/backend.h, "LoRA"): the loops
 * src/model/lora.c ran on the host over adapter and activation memory, moved here unchanged
 * (same operations, same order: the cpu backend's results are those of before, bit for bit).
 * Compiled once, at the portable baseline like the rest of the library (not per ISA level), so
 * no level contracts a product and a sum into an FMA. */
#include <stdint.h>
#include <string.h>

#include "loom/base.h"
#include "loom/bf16.h"
#include "kernels/backend_mem.h"

void loom_lora_add_scaled(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                          int64_t width, int64_t rows, float a) {
    for (int64_t i = 0; i < rows; i++) {
        float *o = dst + i * dst_stride;
        const float *d = src + i * src_stride;
        for (int64_t j = 0; j < width; j++) o[j] += a * d[j];
    }
}

void loom_lora_scale_rows(float *dst, const float *src, int64_t src_stride, int64_t width,
                          int64_t rows, float a) {
    for (int64_t i = 0; i < rows; i++) {
        const float *g = src + i * src_stride;
        float *d = dst + i * width;
        for (int64_t j = 0; j < width; j++) d[j] = a * g[j];
    }
}

void loom_lora_dropout_forward(float *xd, uint8_t *keep, const float *x, int64_t N, int64_t in,
                               int T, int split, int64_t pos0, int64_t pos1, int64_t row0,
                               int64_t Tg, uint64_t key, float p) {
    const float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const int t = (int)(i % T);
        const int64_t row = row0 + i / T;
        const int64_t pos = t < split ? pos0 + t : pos1 + (t - split);
        const uint64_t c0 = (uint64_t)(row * Tg + pos) * (uint64_t)in;
        const float *xi = x + i * in;
        float *o = xd + i * in;
        uint8_t *k = keep + i * in;
        for (int64_t j = 0; j < in; j++) {
            /* loom_rng_uniform's 24 bits of loom_rng_u64(seed, stream, c0 + j) */
            const float u = (float)(loom_rng_at(key, c0 + (uint64_t)j) >> 40) * 0x1p-24f;
            k[j] = u >= p;
            o[j] = k[j] ? xi[j] * keep_scale : 0.0f;
        }
    }
}

void loom_lora_dropout_backward(float *din, const float *dxd, const uint8_t *keep, int64_t n,
                                float p) {
    const float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        if (keep[i]) din[i] += dxd[i] * keep_scale;
}

void loom_lora_merge_into(float *W, const float *A, const float *B, int64_t out, int64_t in,
                          int r, float scale) {
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double acc = 0;
            for (int k = 0; k < r; k++) acc += (double)B[o * r + k] * A[(int64_t)k * in + i];
            W[o * in + i] += scale * (float)acc;
        }
}

void loom_lora_add_scaled_bf16(uint16_t *dst, int64_t dst_stride, const float *src,
                               int64_t src_stride, int64_t width, int64_t rows, float a) {
#pragma omp parallel for schedule(static) if (rows * width > 65536)
    for (int64_t i = 0; i < rows; i++) {
        uint16_t *o = dst + i * dst_stride;
        const float *d = src + i * src_stride;
        for (int64_t j = 0; j < width; j++)
            o[j] = loom_bf16_round(loom_bf16_widen(o[j]) + a * d[j]);
    }
}
