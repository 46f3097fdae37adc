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
 * for each output and input row 8 fp32 chains c_l and 4 e_i over the blocks in order,
 *     c_l = c_l + (float)s_l * (dw_k * dx_k)      e_i = e_i + (float)u_i * (dmw_k * dx_k)
 * where s_l = sum_j sc_j * (products 4l..4l+3 of sub-block j) and u_i = m_2i xs_2i +
 * m_2i+1 xs_2i+1 (xs: the input's sub-block sums) are exact int32s (s_l at most 8 * 63 * 4 *
 * 15 * 127) and dw, dmw the block's fp16 d and dmin widened; then ((c0+c4) + (c2+c6)) +
 * ((c1+c5) + (c3+c7)) minus ((e0+e2) + (e1+e3)), then the bias. The lanes are what the
 * instructions give: VPMADDUBSW of the unsigned nibbles with the signed int8 inputs, then
 * VPMADDWD with the 6-bit scales, leaves s_l in int32 lane l (no sign trick, no saturation:
 * pairs of products are at most 2 * 15 * 127); the chains are one ymm and one xmm (AVX2 at the
 * avx2 and avx512 levels: a 512-bit version, two sub-blocks a vector, measured slower, its
 * shuffles lining the inputs up costing more than the halved multiplies saved),
 * plain C at x86-64; a block's nibbles and scales are decoded once for all the input rows of a
 * pass, and with one input row (decoding) the chains stay in registers. So every level gives
 * the same bits whatever N; -ffp-contract=off (CMakeLists.txt) keeps the multiplies and adds
 * apart. */
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

/* a block decoded once for all the input rows of a pass (q4k_decode), then each row's chains
 * advanced by it (q4k_step): the contract's c[8] and e[4] of the row in c, e */
#if defined(__AVX2__)
/* q[j]: sub-block j's 32 values; sc[j]: its scale in all 16 int16 lanes (a byte shuffle of the
 * eight); m: the eight minimums */
typedef struct {
    __m256i q[8], sc[8];
    __m128i m;
} LOOM_KV(q4k_dec);

static inline __attribute__((always_inline)) void LOOM_KV(q4k_decode)(const uint8_t *blk,
                                                                      LOOM_KV(q4k_dec) *d) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int p = 0; p < 4; p++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * p));
        d->q[2 * p] = _mm256_and_si256(v, m4);
        d->q[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    uint32_t u[4];
    q4k_words(blk + 4, u);
    const __m256i sm = _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
    const __m256i s2 = _mm256_permute2x128_si256(sm, sm, 0x00); /* sc_0..7 in both halves */
    for (int j = 0; j < 8; j++)
        d->sc[j] = _mm256_shuffle_epi8(s2, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
    d->m = _mm256_extracti128_si256(sm, 1);
}

/* the chains as vectors (lane l of c: c_l; of e: e_i) */
static inline __attribute__((always_inline)) void LOOM_KV(q4k_step_v)(
    const LOOM_KV(q4k_dec) *d, const int8_t *x, const int16_t *xs, float dd, float dm, __m256 *c,
    __m128 *e) {
    __m256i acc = _mm256_setzero_si256(); /* lane l: sum_j sc_j * products 4l..4l+3 of j */
    for (int j = 0; j < 8; j++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 32 * j));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(d->q[j], xv), d->sc[j]));
    }
    const __m128i u = _mm_madd_epi16(d->m, _mm_loadu_si128((const __m128i *)xs));
    *c = _mm256_add_ps(*c, _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(dd)));
    *e = _mm_add_ps(*e, _mm_mul_ps(_mm_cvtepi32_ps(u), _mm_set1_ps(dm)));
}

static inline __attribute__((always_inline)) void LOOM_KV(q4k_step)(
    const LOOM_KV(q4k_dec) *d, const int8_t *x, const int16_t *xs, float dd, float dm, float *c,
    float *e) {
    __m256 cv = _mm256_loadu_ps(c);
    __m128 ev = _mm_loadu_ps(e);
    LOOM_KV(q4k_step_v)(d, x, xs, dd, dm, &cv, &ev);
    _mm256_storeu_ps(c, cv);
    _mm_storeu_ps(e, ev);
}
#else
typedef struct {
    const uint8_t *qs;
    uint8_t sc[8], mn[8];
} LOOM_KV(q4k_dec);

static inline void LOOM_KV(q4k_decode)(const uint8_t *blk, LOOM_KV(q4k_dec) *d) {
    d->qs = blk + 16;
    q4k_unpack(blk + 4, d->sc, d->mn);
}

static inline void LOOM_KV(q4k_step)(const LOOM_KV(q4k_dec) *d, const int8_t *x,
                                     const int16_t *xs, float dd, float dm, float *c, float *e) {
    for (int l = 0; l < 8; l++) {
        int32_t s = 0;
        for (int j = 0; j < 8; j++) {
            int32_t t = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) {
                const uint8_t b = d->qs[32 * (j / 2) + i];
                t += (int32_t)(j % 2 ? b >> 4 : b & 15) * (int32_t)x[32 * j + i];
            }
            s += (int32_t)d->sc[j] * t;
        }
        c[l] = c[l] + (float)s * dd;
    }
    for (int i = 0; i < 4; i++) {
        const int32_t u = (int32_t)d->mn[2 * i] * xs[2 * i] + (int32_t)d->mn[2 * i + 1] * xs[2 * i + 1];
        e[i] = e[i] + (float)u * dm;
    }
}
#endif

/* the chains' fixed tree, then the bias */
static inline float LOOM_KV(q4k_finish)(const float *c, const float *e, const float *bias) {
    const float a0 = c[0] + c[4], a1 = c[1] + c[5], a2 = c[2] + c[6], a3 = c[3] + c[7];
    const float t = (a0 + a2) + (a1 + a3), u = (e[0] + e[2]) + (e[1] + e[3]);
    const float y = t - u;
    return bias ? y + *bias : y;
}

static void LOOM_KV(matmul_q4k_forward)(float *out, const int8_t *xq, const float *xd,
                                        const int16_t *xsum, const uint8_t *w, const float *bias,
                                        int64_t N, int IC, int OC) {
    const int nk = IC / QK;
    LOOM_CHECK(IC % QK == 0);
    const int64_t row_bytes = (int64_t)nk * QB;
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * N >= 4 * LOOM_PAR_MIN)
    for (int o = 0; o < OC; o++) {
        const uint8_t *wr = w + (int64_t)o * row_bytes;
#if defined(__AVX2__)
        if (N == 1) { /* one input row (decoding): the chains stay in registers */
            __m256 cv = _mm256_setzero_ps();
            __m128 ev = _mm_setzero_ps();
            for (int k = 0; k < nk; k++) {
                const uint8_t *blk = wr + (int64_t)k * QB;
                for (int b = 0; b < QB; b += 64) __builtin_prefetch(blk + 4 * row_bytes + b, 0, 3);
                uint16_t dh, mh;
                memcpy(&dh, blk, 2);
                memcpy(&mh, blk + 2, 2);
                LOOM_KV(q4k_dec) dec;
                LOOM_KV(q4k_decode)(blk, &dec);
                LOOM_KV(q4k_step_v)(&dec, xq + (int64_t)k * QK, xsum + (int64_t)k * QSUB,
                                    loom_fp16_widen(dh) * xd[k], loom_fp16_widen(mh) * xd[k], &cv, &ev);
            }
            float cn[8], en[4];
            _mm256_storeu_ps(cn, cv);
            _mm_storeu_ps(en, ev);
            out[o] = LOOM_KV(q4k_finish)(cn, en, bias ? bias + o : NULL);
            continue;
        }
#endif
        for (int64_t n0 = 0; n0 < N; n0 += Q4K_ROWS_MAX) {
            const int64_t nn = N - n0 < Q4K_ROWS_MAX ? N - n0 : Q4K_ROWS_MAX;
            float c[Q4K_ROWS_MAX][8], e[Q4K_ROWS_MAX][4];
            memset(c, 0, sizeof(float) * 8 * (size_t)nn);
            memset(e, 0, sizeof(float) * 4 * (size_t)nn);
            for (int k = 0; k < nk; k++) {
                const uint8_t *blk = wr + (int64_t)k * QB;
                if (n0 == 0) /* the row four ahead: the matrix is one stream */
                    for (int b = 0; b < QB; b += 64) __builtin_prefetch(blk + 4 * row_bytes + b, 0, 3);
                uint16_t dh, mh;
                memcpy(&dh, blk, 2);
                memcpy(&mh, blk + 2, 2);
                const float dw = loom_fp16_widen(dh), dmw = loom_fp16_widen(mh);
                LOOM_KV(q4k_dec) dec; /* the block decoded once for all the input rows */
                LOOM_KV(q4k_decode)(blk, &dec);
                for (int64_t n = 0; n < nn; n++) {
                    const int64_t row = n0 + n;
                    const float dx = xd[row * nk + k];
                    LOOM_KV(q4k_step)(&dec, xq + row * IC + (int64_t)k * QK,
                                      xsum + (row * nk + k) * QSUB, dw * dx, dmw * dx, c[n], e[n]);
                }
            }
            for (int64_t n = 0; n < nn; n++)
                out[(n0 + n) * OC + o] = LOOM_KV(q4k_finish)(c[n], e[n], bias ? bias + o : NULL);
        }
    }
}

#endif
