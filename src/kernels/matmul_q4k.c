/* 4-bit weights (--weights int4, docs/inference.md "Weights in int4"): GGUF's Q4_K format and
 * the linear layer over it.
 *
 * Format (q4k_quantize_rows): each row of IC values (IC a multiple of 256) in blocks of 256,
 * 144 bytes each, GGUF's block_q4_K byte for byte: fp16 d, fp16 dmin, 12 bytes holding eight
 * 6-bit scales sc_j and eight 6-bit minimums m_j (one of each per sub-block of 32), then 128
 * bytes of 4-bit values q in [0, 15]: bytes 32p..32p+31 hold sub-block 2p in their low
 * nibbles and sub-block 2p+1 in their high ones. A value is (d * sc_j) * q - (dmin * m_j).
 * The scales' packing: bytes 0-3 are sc_0..3 in their low 6 bits, bytes 4-7 m_0..3; bytes
 * 8-11 hold the low 4 bits of sc_4..7 (low nibble) and of m_4..7 (high nibble); the top 2 bits
 * of bytes 0-3 are the high bits of sc_4..7, those of bytes 4-7 the high bits of m_4..7.
 *
 * The quantizer is loom's own: each sub-block's (scale, minimum) is the least-squares fit of
 * x = s * q - m over 21 candidate roundings around (max - min) / 15 (the minimum at most 0, as
 * the format's m_j is not negative), the best kept; then the block's d and dmin are the largest
 * scale and minimum over 63, rounded to fp16, the sub-blocks' sc_j, m_j those over d, dmin
 * rounded to 6 bits, and the values requantized against the scales as stored.
 *
 * The product (matmul_q4k_forward): the input rows in blocks of 256 too (q8k_quantize_rows:
 * an fp32 scale dx = max|x| / 127 and int8 values, with each sub-block's sum of values), then
 * for each output and input row one fp32 sum over the blocks in order,
 *     acc = acc + ((float)isum_k * (dw_k * dx_k) - (float)msum_k * (dmw_k * dx_k))
 * where isum_k = sum_j sc_j * sum_{i in j} q_i xq_i and msum_k = sum_j m_j * xsum_j are exact
 * int32s (at most 8 * 63 * 32 * 15 * 127 < 2^31) and dw, dmw the block's fp16 d and dmin
 * widened; then the bias. Only the integer sums are vectorized (VPMADDUBSW of the unsigned
 * nibbles with the signed int8 inputs, then VPMADDWD with the scales: no sign trick, no
 * saturation as pairs of products are at most 2 * 15 * 127), so every level gives the same
 * bits whatever N; -ffp-contract=off (CMakeLists.txt) keeps the multiplies and adds apart. */
#ifndef LOOM_KV
#include <math.h>
#include <string.h>

#include "kernels/kmath.h"
#include "loom/base.h"
#include "loom/fp16.h"
#include "loom/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { QK = LOOM_Q4K_BLOCK, QB = LOOM_Q4K_BYTES, QSUB = QK / 32 };

/* a block's 12 scale bytes as four words of four bytes: u[0] sc_0..3, u[1] sc_4..7, u[2]
 * m_0..3, u[3] m_4..7 */
static inline void q4k_words(const uint8_t *s, uint32_t u[4]) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    u[0] = w0 & 0x3f3f3f3fu;
    u[1] = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
    u[2] = w1 & 0x3f3f3f3fu;
    u[3] = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
}

/* the eight scales and eight minimums of a block's 12 scale bytes */
static inline void q4k_unpack(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[4];
    q4k_words(s, u);
    memcpy(sc, u, 8);
    memcpy(mn, u + 2, 8);
}

static void q4k_pack(uint8_t *s, const uint8_t sc[8], const uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* x (32 values) ~ s * q - m, q in [0, 15], m >= 0: the best least-squares fit over the
 * candidate roundings */
static void sub_fit(const float *x, float *scale, float *min) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    if (lo > 0.0f) lo = 0.0f;
    *scale = 0.0f;
    *min = -lo;
    if (!(hi > lo)) return; /* one value (or none but zeros): q = 0, value -m */
    double best = INFINITY;
    for (int c = -1; c <= 20; c++) {
        int q[32];
        /* c = -1: the plain rounding (max - min) / 15; else 15 + (c - 10) / 10 steps */
        const float inv = c < 0 ? 15.0f / (hi - lo) : (15.0f + 0.1f * (float)(c - 10)) / (hi - lo);
        double sq = 0, sqq = 0, sx = 0, sxq = 0;
        for (int i = 0; i < 32; i++) {
            q[i] = clampi((int)nearbyintf(inv * (x[i] - lo)), 0, 15);
            sq += q[i], sqq += (double)q[i] * q[i], sx += x[i], sxq += (double)x[i] * q[i];
        }
        const double det = 32.0 * sqq - sq * sq;
        double s, b;
        if (det <= 0) continue;
        s = (32.0 * sxq - sq * sx) / det;
        b = (sqq * sx - sq * sxq) / det;
        if (b > 0) b = 0, s = sxq / sqq; /* the offset is -m, m >= 0 */
        if (!(s > 0)) continue;
        double e = 0;
        for (int i = 0; i < 32; i++) {
            const double r = s * q[i] + b - x[i];
            e += r * r;
        }
        if (e < best) best = e, *scale = (float)s, *min = (float)-b;
    }
}

void q4k_quantize_rows(uint8_t *dst, const float *x, int64_t N, int IC) {
    const int nk = IC / QK;
    for (int64_t r = 0; r < N; r++)
        for (int k = 0; k < nk; k++) {
            const float *xb = x + r * IC + (int64_t)k * QK;
            uint8_t *blk = dst + (r * nk + k) * QB;
            float s[QSUB], m[QSUB], smax = 0.0f, mmax = 0.0f;
            for (int j = 0; j < QSUB; j++) {
                sub_fit(xb + 32 * j, &s[j], &m[j]);
                smax = fmaxf(smax, s[j]);
                mmax = fmaxf(mmax, m[j]);
            }
            const uint16_t dh = loom_fp16_round(smax / 63.0f), mh = loom_fp16_round(mmax / 63.0f);
            const float d = loom_fp16_widen(dh), dm = loom_fp16_widen(mh);
            const float id = d > 0.0f ? 1.0f / d : 0.0f, idm = dm > 0.0f ? 1.0f / dm : 0.0f;
            uint8_t sc[QSUB], mn[QSUB];
            for (int j = 0; j < QSUB; j++) {
                sc[j] = (uint8_t)clampi((int)nearbyintf(s[j] * id), 0, 63);
                mn[j] = (uint8_t)clampi((int)nearbyintf(m[j] * idm), 0, 63);
            }
            memcpy(blk, &dh, 2);
            memcpy(blk + 2, &mh, 2);
            q4k_pack(blk + 4, sc, mn);
            uint8_t *qs = blk + 16;
            memset(qs, 0, QK / 2);
            for (int j = 0; j < QSUB; j++) {
                const float S = d * (float)sc[j], M = dm * (float)mn[j];
                const float inv = S > 0.0f ? 1.0f / S : 0.0f;
                for (int i = 0; i < 32; i++) {
                    const int q = clampi((int)nearbyintf((xb[32 * j + i] + M) * inv), 0, 15);
                    qs[32 * (j / 2) + i] |= (uint8_t)(j % 2 ? q << 4 : q);
                }
            }
        }
}

void q4k_dequantize_rows(float *x, const uint8_t *src, int64_t N, int IC) {
    const int nk = IC / QK;
    for (int64_t r = 0; r < N; r++)
        for (int k = 0; k < nk; k++) {
            const uint8_t *blk = src + (r * nk + k) * QB;
            uint16_t dh, mh;
            memcpy(&dh, blk, 2);
            memcpy(&mh, blk + 2, 2);
            const float d = loom_fp16_widen(dh), dm = loom_fp16_widen(mh);
            uint8_t sc[QSUB], mn[QSUB];
            q4k_unpack(blk + 4, sc, mn);
            float *y = x + r * IC + (int64_t)k * QK;
            for (int j = 0; j < QSUB; j++) {
                const float S = d * (float)sc[j], M = dm * (float)mn[j];
                for (int i = 0; i < 32; i++) {
                    const uint8_t b = blk[16 + 32 * (j / 2) + i];
                    y[32 * j + i] = S * (float)(j % 2 ? b >> 4 : b & 15) - M;
                }
            }
        }
}

void q8k_quantize_rows(int8_t *q, float *d, int16_t *sums, const float *x, int64_t N, int IC) {
    const int nk = IC / QK;
    for (int64_t r = 0; r < N; r++)
        for (int k = 0; k < nk; k++) {
            const float *xb = x + r * IC + (int64_t)k * QK;
            int8_t *qb = q + r * IC + (int64_t)k * QK;
            float amax = 0.0f;
            for (int i = 0; i < QK; i++) {
                const float a = fabsf(xb[i]);
                amax = a > amax ? a : amax;
            }
            const float s = amax / 127.0f, inv = s != 0.0f ? 1.0f / s : 0.0f;
            d[r * nk + k] = s;
            for (int j = 0; j < QSUB; j++) {
                int sum = 0;
                for (int i = 32 * j; i < 32 * j + 32; i++) {
                    const float v = roundf(xb[i] * inv); /* in [-127, 127] but for inf / NaN */
                    qb[i] = v >= -127.0f && v <= 127.0f ? (int8_t)v : 0;
                    sum += qb[i];
                }
                sums[(r * nk + k) * QSUB + j] = (int16_t)sum;
            }
        }
}

#define LOOM_KSELF "kernels/matmul_q4k.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(matmul_q4k_forward,
              (float *out, const int8_t *xq, const float *xd, const int16_t *xsum,
               const uint8_t *w, const float *bias, int64_t N, int IC, int OC),
              (out, xq, xd, xsum, w, bias, N, IC, OC))

#else /* one variant (isa_variants.h) */

#ifndef LOOM_Q4K_TYPES
#define LOOM_Q4K_TYPES
enum { Q4K_ROWS_MAX = 64 }; /* input rows per pass over a weight row */
#endif

#if defined(__AVX2__)
/* a block's 256 values as 8 vectors of 32 bytes (sub-block j in q[j]), and its scales and
 * minimums widened to int16 lanes (each scale in all 16 lanes of sc[j], by a byte shuffle of
 * the eight; the minimums in m) */
static inline __attribute__((always_inline)) void LOOM_KV(q4k_decode)(
    const uint8_t *blk, __m256i q[8], __m256i sc[8], __m128i *m) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const uint8_t *qs = blk + 16;
    for (int p = 0; p < 4; p++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        q[2 * p] = _mm256_and_si256(v, m4);
        q[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    uint32_t u[4];
    q4k_words(blk + 4, u);
    const __m256i sm = _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
    const __m256i s2 = _mm256_permute2x128_si256(sm, sm, 0x00); /* sc_0..7 in both halves */
    for (int j = 0; j < 8; j++)
        sc[j] = _mm256_shuffle_epi8(s2, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
    *m = _mm256_extracti128_si256(sm, 1);
}

/* isum = sum_j sc_j * (q . x over sub-block j) and msum = sum_j m_j * xs_j of one input row's
 * block (x: its 256 int8 values, xs: its 8 sub-block sums): exact int32s */
static inline __attribute__((always_inline)) void LOOM_KV(q4k_sums)(
    const __m256i q[8], const __m256i sc[8], __m128i m, const int8_t *x, const int16_t *xs,
    int32_t *isum, int32_t *msum) {
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 32 * j));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], xv), sc[j]));
    }
    const __m128i a = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    const __m128i b = _mm_madd_epi16(m, _mm_loadu_si128((const __m128i *)xs));
    const __m128i h = _mm_hadd_epi32(a, b);     /* a0+a1 a2+a3 b0+b1 b2+b3 */
    const __m128i g = _mm_hadd_epi32(h, h);     /* isum msum isum msum */
    *isum = _mm_cvtsi128_si32(g);
    *msum = _mm_extract_epi32(g, 1);
}
#else
static inline void LOOM_KV(q4k_sums)(const uint8_t *qs, const uint8_t *sc, const uint8_t *mn,
                                     const int8_t *x, const int16_t *xs, int32_t *isum,
                                     int32_t *msum) {
    int32_t total = 0, ms = 0;
    for (int j = 0; j < 8; j++) {
        int32_t t = 0;
        for (int i = 0; i < 32; i++) {
            const uint8_t b = qs[32 * (j / 2) + i];
            t += (int32_t)(j % 2 ? b >> 4 : b & 15) * (int32_t)x[32 * j + i];
        }
        total += (int32_t)sc[j] * t;
        ms += (int32_t)mn[j] * xs[j];
    }
    *isum = total;
    *msum = ms;
}
#endif

static void LOOM_KV(matmul_q4k_forward)(float *out, const int8_t *xq, const float *xd,
                                        const int16_t *xsum, const uint8_t *w, const float *bias,
                                        int64_t N, int IC, int OC) {
    const int nk = IC / QK;
    LOOM_CHECK(IC % QK == 0);
    const int64_t row_bytes = (int64_t)nk * QB;
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * N >= 4 * LOOM_PAR_MIN)
    for (int o = 0; o < OC; o++) {
        const uint8_t *wr = w + (int64_t)o * row_bytes;
        for (int64_t n0 = 0; n0 < N; n0 += Q4K_ROWS_MAX) {
            const int64_t nn = N - n0 < Q4K_ROWS_MAX ? N - n0 : Q4K_ROWS_MAX;
            float acc[Q4K_ROWS_MAX];
            for (int64_t n = 0; n < nn; n++) acc[n] = 0.0f;
            for (int k = 0; k < nk; k++) {
                const uint8_t *blk = wr + (int64_t)k * QB;
                if (n0 == 0) /* the row four ahead: the matrix is one stream */
                    for (int c = 0; c < QB; c += 64) __builtin_prefetch(blk + 4 * row_bytes + c, 0, 3);
                uint16_t dh, mh;
                memcpy(&dh, blk, 2);
                memcpy(&mh, blk + 2, 2);
                const float dw = loom_fp16_widen(dh), dmw = loom_fp16_widen(mh);
#if defined(__AVX2__)
                __m256i qv[8], scv[8]; /* the block decoded once for all the input rows */
                __m128i mv;
                LOOM_KV(q4k_decode)(blk, qv, scv, &mv);
#else
                uint8_t sc[QSUB], mn[QSUB];
                q4k_unpack(blk + 4, sc, mn);
#endif
                for (int64_t n = 0; n < nn; n++) {
                    const int64_t row = n0 + n;
                    int32_t is, ms;
#if defined(__AVX2__)
                    LOOM_KV(q4k_sums)(qv, scv, mv, xq + row * IC + (int64_t)k * QK,
                                      xsum + (row * nk + k) * QSUB, &is, &ms);
#else
                    LOOM_KV(q4k_sums)(blk + 16, sc, mn, xq + row * IC + (int64_t)k * QK,
                                      xsum + (row * nk + k) * QSUB, &is, &ms);
#endif
                    const float dx = xd[row * nk + k];
                    const float a = (float)is * (dw * dx), b = (float)ms * (dmw * dx);
                    acc[n] = acc[n] + (a - b);
                }
            }
            for (int64_t n = 0; n < nn; n++)
                out[(n0 + n) * OC + o] = bias ? acc[n] + bias[o] : acc[n];
        }
    }
}

#endif
