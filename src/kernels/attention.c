/* Causal scaled-dot-product attention with grouped-query heads, through OpenBLAS sgemm.
 *
 * Layout: qkv (B,T,R) with R = (H + 2*KVH)*D: per row H query heads, KVH key heads, KVH value
 * heads, D floats each. A head's (T,D) matrix is a strided view (leading dimension R), so
 * nothing is copied. out (B,T,H*D); att (B,H,T,T) softmax probabilities, upper triangle 0.
 *
 * Work is blocked in ATT_BS rows of queries so that the masked upper triangle is (mostly)
 * never computed: a block of rows [i0,i1) only needs keys [0,i1).
 *
 * Threading: the forward runs one (b, h) per task; the backward one (b, kv head) per task with
 * the group's query heads in order (they all add into the same dK/dV). sgemm is called
 * inside the parallel region, where the OpenMP build of OpenBLAS runs single-threaded.
 * Every element's arithmetic is fixed by its task alone, so results are bitwise the same for
 * any thread count. */
#ifndef LOOM_KV
#include "kernels/kmath.h"
#include <cblas.h>
#include "loom/kernels.h"
enum { ATT_BS = 64 };

int64_t attention_causal_pairs(int T) {
    int64_t pairs = 0; /* the row blocks of attention_forward (the column blocks of the
                        * backward's dK/dV cover the same count) */
    for (int i0 = 0; i0 < T; i0 += ATT_BS) {
        int i1 = i0 + ATT_BS < T ? i0 + ATT_BS : T;
        pairs += (int64_t)(i1 - i0) * i1;
    }
    return pairs;
}

int64_t attention_window_pairs(int T, int W) {
    if (W <= 0) return attention_causal_pairs(T);
    int64_t pairs = 0;
    for (int i0 = 0; i0 < T; i0 += ATT_BS) {
        int i1 = i0 + ATT_BS < T ? i0 + ATT_BS : T;
        /* the first key tile with a key less than W positions before the block's first query */
        int64_t lo = (int64_t)i0 - W - (ATT_BS - 2);
        int64_t j0 = lo <= 0 ? 0 : (lo + ATT_BS - 1) / ATT_BS * ATT_BS;
        pairs += (int64_t)(i1 - i0) * (i1 - j0);
    }
    return pairs;
}

#define LOOM_KSELF "kernels/attention.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(attention_forward, (float *out, float *att, const float *qkv, int B, int T, int H,
                                  int KVH, int D, const loom_attn_mask *mask),
              (out, att, qkv, B, T, H, KVH, D, mask))
LOOM_DISPATCH(attention_backward, (float *dqkv, float *scratch, const float *dout,
                                   const float *qkv, const float *att, int B, int T, int H,
                                   int KVH, int D, const loom_attn_mask *mask),
              (dqkv, scratch, dout, qkv, att, B, T, H, KVH, D, mask))

#else /* one level of the kernels (isa_variants.h) */

/* the first key row i sees: 0, or with a sliding window W the W - 1 before it */
static inline int LOOM_KV(first_key)(int i, int64_t window) {
    return window > 0 && i - window + 1 > 0 ? (int)(i - window + 1) : 0;
}

/* Row i of the probabilities: softmax over s[lo..i] (soft-capped first with cap > 0), zero
 * for j < lo and j > i. */
static void LOOM_KV(causal_softmax_row)(float *s, int lo, int i, int T, float cap) {
    if (cap > 0.0f)
        for (int j = lo; j <= i; j++) s[j] = cap * tanhf(s[j] / cap);
    float mx = s[lo];
#pragma omp simd reduction(max : mx)
    for (int j = lo; j <= i; j++) mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j <= i; j++) {
        float e = loom_expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (int j = lo; j <= i; j++) s[j] *= inv;
    for (int j = 0; j < lo; j++) s[j] = 0.0f;
    for (int j = i + 1; j < T; j++) s[j] = 0.0f;
}


static void LOOM_KV(attention_forward)(float *out, float *att, const float *qkv,
                       int B, int T, int H, int KVH, int D, const loom_attn_mask *mask) {
    const int64_t R = (int64_t)(H + 2 * KVH) * D, HD = (int64_t)H * D;
    const int group = H / KVH;
    const float scale = mask && mask->scale > 0.0f ? mask->scale : 1.0f / sqrtf((float)D);
    const int64_t W = mask ? mask->window : 0;
    const float cap = mask ? mask->softcap : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < (int64_t)B * H; bh++) {
        int64_t b = bh / H;
        int h = (int)(bh % H), kvh = h / group;
        const float *q = qkv + b * T * R + (int64_t)h * D;
        const float *k = qkv + b * T * R + (int64_t)(H + kvh) * D;
        const float *v = qkv + b * T * R + (int64_t)(H + KVH + kvh) * D;
        float *p = att + bh * T * T;
        float *o = out + b * T * HD + (int64_t)h * D;
        for (int i0 = 0; i0 < T; i0 += ATT_BS) {
            int i1 = i0 + ATT_BS < T ? i0 + ATT_BS : T;
            /* S[i0:i1, k0:i1] = scale * Q[i0:i1] K[k0:i1]^T (k0: the block's first key) */
            const int k0 = LOOM_KV(first_key)(i0, W);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1 - k0, D, scale,
                        q + i0 * R, (blasint)R, k + k0 * R, (blasint)R, 0.0f,
                        p + (int64_t)i0 * T + k0, T);
            for (int i = i0; i < i1; i++)
                LOOM_KV(causal_softmax_row)(p + (int64_t)i * T, LOOM_KV(first_key)(i, W), i, T,
                                            cap);
            /* O[i0:i1] = P[i0:i1, 0:i1] V[0:i1] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, D, i1, 1.0f,
                        p + (int64_t)i0 * T, T, v, (blasint)R, 0.0f, o + i0 * HD, (blasint)HD);
        }
    }
}

static void LOOM_KV(attention_backward)(float *dqkv, float *scratch, const float *dout,
                                        const float *qkv,
                        const float *att, int B, int T, int H, int KVH, int D,
                        const loom_attn_mask *mask) {
    const int64_t R = (int64_t)(H + 2 * KVH) * D, HD = (int64_t)H * D;
    const int group = H / KVH;
    const float scale = mask && mask->scale > 0.0f ? mask->scale : 1.0f / sqrtf((float)D);
    const int64_t W = mask ? mask->window : 0;
    const float cap = mask ? mask->softcap : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t bk = 0; bk < (int64_t)B * KVH; bk++) {
        int64_t b = bk / KVH;
        int kvh = (int)(bk % KVH);
        const float *k = qkv + b * T * R + (int64_t)(H + kvh) * D;
        const float *v = qkv + b * T * R + (int64_t)(H + KVH + kvh) * D;
        float *dk = dqkv + b * T * R + (int64_t)(H + kvh) * D;
        float *dv = dqkv + b * T * R + (int64_t)(H + KVH + kvh) * D;
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *q = qkv + b * T * R + (int64_t)h * D;
            float *dq = dqkv + b * T * R + (int64_t)h * D;
            const float *dO = dout + b * T * HD + (int64_t)h * D;
            const float *p = att + (b * H + h) * T * T;
            float *ds = scratch + (b * H + h) * T * T;
            for (int i0 = 0; i0 < T; i0 += ATT_BS) {
                int i1 = i0 + ATT_BS < T ? i0 + ATT_BS : T;
                /* dP[i0:i1, 0:i1] = dO[i0:i1] V[0:i1]^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, D, 1.0f,
                            dO + i0 * HD, (blasint)HD, v, (blasint)R, 0.0f,
                            ds + (int64_t)i0 * T, T);
                /* dS = P * (dP - rowsum(dP * P)), zero outside the visible keys; soft-capped:
                 * times the cap's derivative 1 - tanh^2 of the raw score (recomputed) */
                for (int i = i0; i < i1; i++) {
                    float *dsr = ds + (int64_t)i * T;
                    const float *pr = p + (int64_t)i * T;
                    const int lo = LOOM_KV(first_key)(i, W);
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int j = lo; j <= i; j++) dot += dsr[j] * pr[j];
                    for (int j = lo; j <= i; j++) dsr[j] = pr[j] * (dsr[j] - dot);
                    if (cap > 0.0f)
                        for (int j = lo; j <= i; j++) {
                            float sc = 0.0f;
                            for (int x = 0; x < D; x++) sc += q[i * R + x] * k[j * R + x];
                            const float t = tanhf(sc * scale / cap);
                            dsr[j] *= 1.0f - t * t;
                        }
                    for (int j = 0; j < lo; j++) dsr[j] = 0.0f;
                    for (int j = i + 1; j < T; j++) dsr[j] = 0.0f;
                }
                /* dQ[i0:i1] += scale * dS[i0:i1, 0:i1] K[0:i1] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, D, i1, scale,
                            ds + (int64_t)i0 * T, T, k, (blasint)R, 1.0f, dq + i0 * R,
                            (blasint)R);
            }
            for (int j0 = 0; j0 < T; j0 += ATT_BS) {
                int j1 = j0 + ATT_BS < T ? j0 + ATT_BS : T;
                /* rows i < j0 of column block [j0,j1) are masked (zero): start at i = j0 */
                const float *dsb = ds + (int64_t)j0 * T + j0;
                const float *pb = p + (int64_t)j0 * T + j0;
                /* dK[j0:j1] += scale * dS[j0:T, j0:j1]^T Q[j0:T] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, D, T - j0, scale,
                            dsb, T, q + j0 * R, (blasint)R, 1.0f, dk + j0 * R, (blasint)R);
                /* dV[j0:j1] += P[j0:T, j0:j1]^T dO[j0:T] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, D, T - j0, 1.0f,
                            pb, T, dO + j0 * HD, (blasint)HD, 1.0f, dv + j0 * R, (blasint)R);
            }
        }
    }
}

#endif
