/* Attention of one new query position over a KV cache (incremental decoding). Threads split
 * the positions (scores) and the heads (softmax, weighted sum); each head's arithmetic is
 * fixed by the head alone, so the result does not depend on the thread count. */
#ifndef LOOM_KV
#include <math.h>
#include <omp.h>
#include "kernels/kmath.h"
#include "loom/kernels.h"

#define LOOM_KSELF "kernels/attention_decode.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(attention_decode, (float *out, const float *q, const float *kcache,
                                 const float *vcache, int n, int H, int KVH, int D, float *scratch,
                                 const loom_attn_mask *mask),
              (out, q, kcache, vcache, n, H, KVH, D, scratch, mask))

#else /* one level of the kernels (isa_variants.h) */

/* q . k over D: 16 partial sums (one vector FMA per 16 elements, where a single running sum
 * would be a chain of D dependent scalar FMAs), added in a fixed tree, then the tail */
static inline float LOOM_KV(ad_dot)(const float *q, const float *k, int D) {
    enum { W = 16 };
    float acc[W] = {0};
    const int Dv = D - D % W;
    for (int d = 0; d < Dv; d += W)
        for (int l = 0; l < W; l++) acc[l] += q[d + l] * k[d + l];
    for (int s = W / 2; s > 0; s /= 2)
        for (int l = 0; l < s; l++) acc[l] += acc[l + s];
    float dot = acc[0];
    for (int d = Dv; d < D; d++) dot += q[d] * k[d];
    return dot;
}

static void LOOM_KV(attention_decode)(float *out, const float *q, const float *kcache,
                                      const float *vcache,
                      int n, int H, int KVH, int D, float *scratch,
                      const loom_attn_mask *mask) {
    const int group = H / KVH;
    const int64_t row = (int64_t)KVH * D;
    const float scale = mask && mask->scale > 0.0f ? mask->scale : 1.0f / sqrtf((float)D);
    const float cap = mask ? mask->softcap : 0.0f;
    /* The cache rows are read in order, every head of a row at once (the rows stream from
     * memory; head by head would stride through them H times). */
#pragma omp parallel if ((int64_t)n * row >= LOOM_PAR_MIN)
    {
#pragma omp for schedule(static)
        for (int j = 0; j < n; j++) {
            const float *k = kcache + (int64_t)j * row;
            for (int h = 0; h < H; h++) {
                float sc =
                    LOOM_KV(ad_dot)(q + (int64_t)h * D, k + (int64_t)(h / group) * D, D) * scale;
                scratch[(int64_t)h * n + j] = cap > 0.0f ? cap * tanhf(sc / cap) : sc;
            }
        }
#pragma omp for schedule(static)
        for (int h = 0; h < H; h++) { /* softmax in place: s[j] becomes the probability */
            float *s = scratch + (int64_t)h * n;
            float mx = -INFINITY;
            for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
            for (int j = 0; j < n; j++) s[j] = loom_expf(s[j] - mx); /* vectorized */
            float sum = 0.0f; /* in order of j, apart (one loop would run the exps scalar) */
            for (int j = 0; j < n; j++) sum += s[j];
            const float inv = 1.0f / sum;
            for (int j = 0; j < n; j++) s[j] *= inv;
        }
        /* out_h = sum_j p_hj v_j in order of j; each thread owns a range of heads */
        const int nth = omp_get_num_threads(), t = omp_get_thread_num();
        const int h0 = (int)((int64_t)H * t / nth), h1 = (int)((int64_t)H * (t + 1) / nth);
        for (int h = h0; h < h1; h++)
            for (int d = 0; d < D; d++) out[(int64_t)h * D + d] = 0.0f;
        for (int j = 0; j < n; j++) {
            const float *v = vcache + (int64_t)j * row;
            for (int h = h0; h < h1; h++) {
                const float p = scratch[(int64_t)h * n + j];
                const float *vh = v + (int64_t)(h / group) * D;
                float *o = out + (int64_t)h * D;
                for (int d = 0; d < D; d++) o[d] += p * vh[d];
            }
        }
    }
}

#endif
