/* 8-bit weights (--weights int8, docs/inference.md "Weights in int8"): GGUF's Q8_0 format and
 * the linear layer over it, llama.cpp's Q8_0 x Q8_0 dot product.
 *
 * Format (q8_quantize_rows): each row of IC values (IC a multiple of 32) in blocks of 32; a
 * block's scale d = max|x| / 127 in fp32, stored as fp16 (to nearest, ties to even), and its 32
 * values q = roundf(x * (1 / d)) (ties away from zero; 0 when d is 0) as int8 in [-127, 127].
 * That is the reference quantizer of ggml (quantize_row_q8_0_ref) and of the gguf Python
 * package, so a matrix quantized here is the bytes they write. Held as two arrays: the values
 * (OC, IC) int8 and the scales (OC, IC / 32) fp16 (a GGUF block interleaves them; the export
 * puts them together, src/interop/gguf.c).
 *
 * The product (matmul_q8_forward): the input rows quantized the same way (q8_quantize_rows),
 * then for each output 16 fp32 chains over the blocks in order,
 *     c[8 * (b % 2) + l] += (float)s_bl * (dw_b * dx_b)        l = 0..7
 * where s_bl is the exact int32 sum of block b's products 4l..4l+3 and dw_b, dx_b the two fp16
 * scales widened (their product is exact in fp32: 11 x 11 bits); then t[l] = c[l] + c[l + 8],
 * summed (l, l+4), (l, l+2), (l, l+1); then the bias. One rounded multiply and one rounded add
 * per step. That is the contract: the same bits at every level, whatever N, whatever rows
 * share the call. This file is compiled with -ffp-contract=off (CMakeLists.txt), so a multiply
 * and an add are never fused into an FMA at one level and not at another. The lanes are what
 * the instructions give: vpmaddubsw + vpmaddwd (AVX2, AVX-512 BW: |w| times x with w's sign,
 * the "sign trick"; pairs of products are at most 2 * 127^2 = 32258, so the int16 sums never
 * saturate) and vpdpbusd (AVX-512 VNNI, a variant of its own beside the avx512 level) both
 * leave products 4l..4l+3 in int32 lane l; at avx512 one zmm holds two blocks, lanes 0-7 the
 * even chains, 8-15 the odd ones; plain C at the x86-64 level. Four weight rows per pass over
 * an input row, each with its own accumulators. */
#ifndef LOOM_KV
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/kmath.h"
#include "loom/base.h"
#include "loom/fp16.h"
#include "loom/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define LOOM_KSELF "kernels/matmul_q8.c"
#include "kernels/isa_variants.h"

#if defined(__x86_64__) && !defined(LOOM_NATIVE)
/* the VNNI variant: the avx512 level's features and AVX512_VNNI */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx512vnni,avx2,fma,bmi,bmi2,popcnt,sse4.2")
#define LOOM_KV(name) name##_vnni
#include LOOM_KSELF
#undef LOOM_KV
#pragma GCC pop_options
#endif

void q8_quantize_rows(int8_t *q, uint16_t *d, const float *x, int64_t N, int IC) {
    const int nb = IC / LOOM_Q8_BLOCK;
    for (int64_t r = 0; r < N; r++)
        for (int b = 0; b < nb; b++) {
            const float *xb = x + r * IC + (int64_t)b * LOOM_Q8_BLOCK;
            int8_t *qb = q + r * IC + (int64_t)b * LOOM_Q8_BLOCK;
            float amax = 0.0f;
            for (int j = 0; j < LOOM_Q8_BLOCK; j++) {
                const float a = fabsf(xb[j]);
                amax = a > amax ? a : amax;
            }
            const float s = amax / 127.0f, id = s != 0.0f ? 1.0f / s : 0.0f;
            d[r * nb + b] = loom_fp16_round(s);
            for (int j = 0; j < LOOM_Q8_BLOCK; j++) {
                const float v = roundf(xb[j] * id); /* in [-127, 127] but for inf / NaN rows */
                qb[j] = v >= -127.0f && v <= 127.0f ? (int8_t)v : 0;
            }
        }
}

void q8_dequantize_rows(float *x, const int8_t *q, const uint16_t *d, int64_t N, int IC) {
    const int nb = IC / LOOM_Q8_BLOCK;
    for (int64_t r = 0; r < N; r++)
        for (int b = 0; b < nb; b++) {
            const float s = loom_fp16_widen(d[r * nb + b]);
            for (int j = 0; j < LOOM_Q8_BLOCK; j++) {
                const int64_t i = r * IC + (int64_t)b * LOOM_Q8_BLOCK + j;
                x[i] = (float)q[i] * s;
            }
        }
}

static atomic_int g_no_vnni; /* matmul_q8_allow_vnni(0): the avx512 level without VPDPBUSD */

void matmul_q8_allow_vnni(int allow) { atomic_store(&g_no_vnni, !allow); }

int matmul_q8_vnni(void) {
    if (atomic_load_explicit(&g_no_vnni, memory_order_relaxed)) return 0;
#if defined(LOOM_NATIVE)
#ifdef __AVX512VNNI__
    return 1;
#else
    return 0;
#endif
#elif defined(__x86_64__)
    if (loom_isa_active() != LOOM_ISA_AVX512) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
#else
    return 0;
#endif
}

void matmul_q8_forward(float *out, const int8_t *xq, const uint16_t *xd, const int8_t *wq,
                       const uint16_t *wd, const float *bias, int64_t N, int IC, int OC) {
#if defined(LOOM_NATIVE)
    matmul_q8_forward_native(out, xq, xd, wq, wd, bias, N, IC, OC);
#else
    switch (loom_isa_active()) {
    case LOOM_ISA_AVX512:
#if defined(__x86_64__)
        if (matmul_q8_vnni()) {
            matmul_q8_forward_vnni(out, xq, xd, wq, wd, bias, N, IC, OC);
            break;
        }
#endif
        matmul_q8_forward_avx512(out, xq, xd, wq, wd, bias, N, IC, OC);
        break;
    case LOOM_ISA_AVX2: matmul_q8_forward_avx2(out, xq, xd, wq, wd, bias, N, IC, OC); break;
    default: matmul_q8_forward_base(out, xq, xd, wq, wd, bias, N, IC, OC); break;
    }
#endif
}

#else /* one variant (isa_variants.h, or _vnni above) */

#ifndef LOOM_Q8_TYPES
#define LOOM_Q8_TYPES
enum { Q8_ROWS = 4 }; /* weight rows per pass over an input row */
#endif

/* the 16 chains of one output, summed in the contract's order, then the bias */
static inline float LOOM_KV(q8_finish)(const float *c, const float *bias) {
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = c[l] + c[8 + l];
    for (int s = 4; s > 0; s /= 2)
        for (int l = 0; l < s; l++) t[l] = t[l] + t[l + s];
    return bias ? t[0] + *bias : t[0];
}

#if defined(__AVX2__)
/* 8 int32 sums of 4 products each (elements 4l..4l+3 of the block): the sign trick */
static inline __attribute__((always_inline)) __m256i LOOM_KV(q8_dot32)(__m256i w, __m256i x) {
#if defined(__AVX512VNNI__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w),
                               _mm256_sign_epi8(x, w));
#else
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}
#endif

#if defined(__AVX512BW__)
/* the same for two blocks (lanes 0-7 the first, 8-15 the second) */
static inline __attribute__((always_inline)) __m512i LOOM_KV(q8_dot64)(__m512i w, __m512i x) {
    const __m512i aw = _mm512_abs_epi8(w);
    const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sx);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), _mm512_set1_epi16(1));
#endif
}
#endif

/* c[r][16] = the 16 chains of rows r < nr (1..Q8_ROWS) of w against one input row x; dd[r][b]
 * = the scales' product of row r, block b; pf: how far ahead of w (bytes) to ask for lines, 0
 * for none (the rows a pass after this one reads: the matrix is one stream, and its next
 * groups' lines are asked for while this group computes, which the hardware prefetchers alone
 * did not keep up with: 4.5-6 -> 8.5-9.5 GB/s on one core, 576-wide rows) */
static inline __attribute__((always_inline)) void LOOM_KV(q8_chains)(
    float (*c)[16], const int8_t *x, const int8_t *w, const float (*dd)[1024], int nb, int IC,
    int nr, int64_t pf) {
#if defined(__AVX512BW__)
    __m512 acc[Q8_ROWS];
    for (int r = 0; r < Q8_ROWS; r++) acc[r] = _mm512_setzero_ps();
    const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m512i xv = _mm512_loadu_si512(x + (int64_t)b * 32);
        for (int r = 0; r < Q8_ROWS; r++) __builtin_prefetch(w + pf + (int64_t)r * IC + b * 32, 0, 3);
        for (int r = 0; r < Q8_ROWS; r++) {
            if (r >= nr) break;
            const __m512i v = LOOM_KV(q8_dot64)(_mm512_loadu_si512(w + (int64_t)r * IC + b * 32), xv);
            const __m512 d = _mm512_permutexvar_ps(
                pick, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)&dd[r][b]))));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(v), d));
        }
    }
    if (b < nb) { /* an odd last block: the even chains only */
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (int64_t)b * 32));
        for (int r = 0; r < Q8_ROWS && r < nr; r++) {
            const __m256i v = LOOM_KV(q8_dot32)(
                _mm256_loadu_si256((const __m256i *)(w + (int64_t)r * IC + b * 32)), xv);
            const __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(dd[r][b]));
            acc[r] = _mm512_mask_add_ps(acc[r], 0x00ff, acc[r], _mm512_castps256_ps512(p));
        }
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(c[r], acc[r]);
#elif defined(__AVX2__)
    __m256 ae[Q8_ROWS], ao[Q8_ROWS];
    for (int r = 0; r < Q8_ROWS; r++) ae[r] = ao[r] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + (int64_t)b * 32));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + (int64_t)b * 32 + 32));
        for (int r = 0; r < Q8_ROWS; r++) __builtin_prefetch(w + pf + (int64_t)r * IC + b * 32, 0, 3);
        for (int r = 0; r < Q8_ROWS; r++) {
            if (r >= nr) break;
            const int8_t *wr = w + (int64_t)r * IC + b * 32;
            const __m256i v0 = LOOM_KV(q8_dot32)(_mm256_loadu_si256((const __m256i *)wr), x0);
            const __m256i v1 = LOOM_KV(q8_dot32)(_mm256_loadu_si256((const __m256i *)(wr + 32)), x1);
            ae[r] = _mm256_add_ps(ae[r], _mm256_mul_ps(_mm256_cvtepi32_ps(v0),
                                                       _mm256_broadcast_ss(&dd[r][b])));
            ao[r] = _mm256_add_ps(ao[r], _mm256_mul_ps(_mm256_cvtepi32_ps(v1),
                                                       _mm256_broadcast_ss(&dd[r][b + 1])));
        }
    }
    if (b < nb) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (int64_t)b * 32));
        for (int r = 0; r < Q8_ROWS && r < nr; r++) {
            const __m256i v = LOOM_KV(q8_dot32)(
                _mm256_loadu_si256((const __m256i *)(w + (int64_t)r * IC + b * 32)), xv);
            ae[r] = _mm256_add_ps(ae[r], _mm256_mul_ps(_mm256_cvtepi32_ps(v),
                                                       _mm256_broadcast_ss(&dd[r][b])));
        }
    }
    for (int r = 0; r < nr; r++) {
        _mm256_storeu_ps(c[r], ae[r]);
        _mm256_storeu_ps(c[r] + 8, ao[r]);
    }
#else
    for (int r = 0; r < nr; r++) {
        float *cr = c[r];
        for (int l = 0; l < 16; l++) cr[l] = 0.0f;
        for (int b = 0; b < nb; b++) {
            const int8_t *wb = w + (int64_t)r * IC + b * 32, *xb = x + (int64_t)b * 32;
            if (b % 2 == 0) __builtin_prefetch(wb + pf, 0, 0);
            float *ch = cr + 8 * (b & 1);
            for (int l = 0; l < 8; l++) {
                int32_t s = 0;
                for (int j = 4 * l; j < 4 * l + 4; j++) s += (int32_t)wb[j] * (int32_t)xb[j];
                ch[l] = ch[l] + (float)s * dd[r][b];
            }
        }
    }
#endif
}

#if defined(__AVX512BW__)
/* q8_chains for two input rows at once (c0, c1; x0, x1; dd0, dd1): each weight vector loaded
 * and its |w| and sign mask made once for both; every chain's operations are q8_chains' */
static inline __attribute__((always_inline)) void LOOM_KV(q8_chains2)(
    float (*c0)[16], float (*c1)[16], const int8_t *x0, const int8_t *x1, const int8_t *w,
    const float (*dd0)[1024], const float (*dd1)[1024], int nb, int IC, int nr, int64_t pf) {
    __m512 a0[Q8_ROWS], a1[Q8_ROWS];
    for (int r = 0; r < Q8_ROWS; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i zero = _mm512_setzero_si512();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m512i xv0 = _mm512_loadu_si512(x0 + (int64_t)b * 32);
        const __m512i xv1 = _mm512_loadu_si512(x1 + (int64_t)b * 32);
        for (int r = 0; r < Q8_ROWS; r++) __builtin_prefetch(w + pf + (int64_t)r * IC + b * 32, 0, 3);
        for (int r = 0; r < Q8_ROWS; r++) {
            if (r >= nr) break;
            const __m512i wv = _mm512_loadu_si512(w + (int64_t)r * IC + b * 32);
            const __m512i aw = _mm512_abs_epi8(wv);
            const __mmask64 neg = _mm512_movepi8_mask(wv);
            const __m512i s0 = _mm512_mask_sub_epi8(xv0, neg, zero, xv0);
            const __m512i s1 = _mm512_mask_sub_epi8(xv1, neg, zero, xv1);
#if defined(__AVX512VNNI__)
            const __m512i v0 = _mm512_dpbusd_epi32(zero, aw, s0);
            const __m512i v1 = _mm512_dpbusd_epi32(zero, aw, s1);
#else
            const __m512i one = _mm512_set1_epi16(1);
            const __m512i v0 = _mm512_madd_epi16(_mm512_maddubs_epi16(aw, s0), one);
            const __m512i v1 = _mm512_madd_epi16(_mm512_maddubs_epi16(aw, s1), one);
#endif
            const __m512 d0 = _mm512_permutexvar_ps(
                pick, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)&dd0[r][b]))));
            const __m512 d1 = _mm512_permutexvar_ps(
                pick, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)&dd1[r][b]))));
            a0[r] = _mm512_add_ps(a0[r], _mm512_mul_ps(_mm512_cvtepi32_ps(v0), d0));
            a1[r] = _mm512_add_ps(a1[r], _mm512_mul_ps(_mm512_cvtepi32_ps(v1), d1));
        }
    }
    if (b < nb) { /* an odd last block: the even chains only */
        const __m256i xv0 = _mm256_loadu_si256((const __m256i *)(x0 + (int64_t)b * 32));
        const __m256i xv1 = _mm256_loadu_si256((const __m256i *)(x1 + (int64_t)b * 32));
        for (int r = 0; r < Q8_ROWS && r < nr; r++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (int64_t)r * IC + b * 32));
            const __m256 p0 = _mm256_mul_ps(_mm256_cvtepi32_ps(LOOM_KV(q8_dot32)(wv, xv0)),
                                            _mm256_set1_ps(dd0[r][b]));
            const __m256 p1 = _mm256_mul_ps(_mm256_cvtepi32_ps(LOOM_KV(q8_dot32)(wv, xv1)),
                                            _mm256_set1_ps(dd1[r][b]));
            a0[r] = _mm512_mask_add_ps(a0[r], 0x00ff, a0[r], _mm512_castps256_ps512(p0));
            a1[r] = _mm512_mask_add_ps(a1[r], 0x00ff, a1[r], _mm512_castps256_ps512(p1));
        }
    }
    for (int r = 0; r < nr; r++) {
        _mm512_storeu_ps(c0[r], a0[r]);
        _mm512_storeu_ps(c1[r], a1[r]);
    }
}
#endif

/* rows [n0, n0 + N) (N <= LOOM_MATMUL_ROWS_MAX) of the product */
static void LOOM_KV(q8_pass)(float *out, const int8_t *xq, const uint16_t *xd, const int8_t *wq,
                             const uint16_t *wd, const float *bias, int64_t N, int IC, int OC) {
    const int nb = IC / LOOM_Q8_BLOCK, G = (OC + Q8_ROWS - 1) / Q8_ROWS;
    float xs[LOOM_MATMUL_ROWS_MAX * 1024]; /* the input rows' scales, widened exactly */
    for (int64_t i = 0; i < N * nb; i++) xs[i] = loom_fp16_widen(xd[i]);
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * N >= 4 * LOOM_PAR_MIN)
    for (int g = 0; g < G; g++) {
        const int o0 = Q8_ROWS * g, nr = OC - o0 < Q8_ROWS ? OC - o0 : Q8_ROWS;
        const int8_t *w = wq + (int64_t)o0 * IC;
        float dw[Q8_ROWS][1024], dd[Q8_ROWS][1024], c[Q8_ROWS][16];
        for (int k = 0; k < 2 * Q8_ROWS * nb * 2; k += 64)
            __builtin_prefetch((const char *)(wd + (int64_t)(o0 + 2 * Q8_ROWS) * nb) + k, 0, 0);
        /* a weight scale is finite and not negative (weights_q8.c refuses non-finite weights):
         * its bits moved to fp32's places times 2^112, branch-free (loom_fp16_widen's case) */
        for (int r = 0; r < nr; r++) {
            const uint16_t *h = wd + (int64_t)(o0 + r) * nb;
            for (int b = 0; b < nb; b++) {
                const uint32_t u = (uint32_t)h[b] << 13;
                float f;
                memcpy(&f, &u, sizeof f);
                dw[r][b] = f * 0x1p112f;
            }
        }
        int64_t n = 0;
#if defined(__AVX512BW__)
        for (; n + 2 <= N; n += 2) { /* two input rows per pass over the weight rows */
            float dd1[Q8_ROWS][1024], c1[Q8_ROWS][16];
            const float *sx0 = xs + n * nb, *sx1 = xs + (n + 1) * nb;
            for (int r = 0; r < nr; r++)
                for (int b = 0; b < nb; b++) dd[r][b] = dw[r][b] * sx0[b], dd1[r][b] = dw[r][b] * sx1[b];
            LOOM_KV(q8_chains2)(c, c1, xq + n * IC, xq + (n + 1) * IC, w, (const float(*)[1024])dd,
                                (const float(*)[1024])dd1, nb, IC, nr,
                                n == 0 ? 2 * (int64_t)Q8_ROWS * IC : 0);
            for (int r = 0; r < nr; r++) {
                out[n * OC + o0 + r] = LOOM_KV(q8_finish)(c[r], bias ? bias + o0 + r : NULL);
                out[(n + 1) * OC + o0 + r] = LOOM_KV(q8_finish)(c1[r], bias ? bias + o0 + r : NULL);
            }
        }
#endif
        for (; n < N; n++) {
            const float *sx = xs + n * nb;
            for (int r = 0; r < nr; r++)
                for (int b = 0; b < nb; b++) dd[r][b] = dw[r][b] * sx[b];
            /* the first input row asks for the group two ahead (the others re-read this one) */
            LOOM_KV(q8_chains)(c, xq + n * IC, w, (const float(*)[1024])dd, nb, IC, nr,
                               n == 0 ? 2 * (int64_t)Q8_ROWS * IC : 0);
            for (int r = 0; r < nr; r++)
                out[n * OC + o0 + r] = LOOM_KV(q8_finish)(c[r], bias ? bias + o0 + r : NULL);
        }
    }
}

static void LOOM_KV(matmul_q8_forward)(float *out, const int8_t *xq, const uint16_t *xd,
                                       const int8_t *wq, const uint16_t *wd, const float *bias,
                                       int64_t N, int IC, int OC) {
    const int nb = IC / LOOM_Q8_BLOCK;
    LOOM_CHECK(IC % LOOM_Q8_BLOCK == 0 && nb <= 1024);
    for (int64_t n0 = 0; n0 < N; n0 += LOOM_MATMUL_ROWS_MAX) {
        const int64_t n = N - n0 < LOOM_MATMUL_ROWS_MAX ? N - n0 : LOOM_MATMUL_ROWS_MAX;
        LOOM_KV(q8_pass)(out + n0 * OC, xq + n0 * IC, xd + n0 * nb, wq, wd, bias, n, IC, OC);
    }
}

#endif
