/* Attention of one new query position over a KV cache (incremental decoding). One task per
 * query head; each head's arithmetic is fixed by the head alone, so the result does not
 * depend on the thread count. */
#ifndef LOOM_KV
#include <math.h>
#include "kernels/kmath.h"
#include "loom/kernels.h"

#define LOOM_KSELF "kernels/attention_decode.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(attention_decode, (float *out, const float *q, const float *kcache,
                                 const float *vcache, int n, int H, int KVH, int D, float *scratch),
              (out, q, kcache, vcache, n, H, KVH, D, scratch))

#else /* one level of the kernels (isa_variants.h) */

static void LOOM_KV(attention_decode)(float *out, const float *q, const float *kcache,
                                      const float *vcache,
                      int n, int H, int KVH, int D, float *scratch) {
    const int group = H / KVH;
    const int64_t row = (int64_t)KVH * D;
    const float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for schedule(static)
    for (int h = 0; h < H; h++) {
        const int kvh = h / group;
        const float *qh = q + (int64_t)h * D;
        float *s = scratch + (int64_t)h * n;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            const float *k = kcache + j * row + (int64_t)kvh * D;
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += qh[d] * k[d];
            s[j] = dot * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        float sum = 0.0f;
        for (int j = 0; j < n; j++) {
            s[j] = loom_expf(s[j] - mx);
            sum += s[j];
        }
        const float inv = 1.0f / sum;
        float *o = out + (int64_t)h * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int j = 0; j < n; j++) {
            const float p = s[j] * inv;
            const float *v = vcache + j * row + (int64_t)kvh * D;
            for (int d = 0; d < D; d++) o[d] += p * v[d];
        }
    }
}

#endif
