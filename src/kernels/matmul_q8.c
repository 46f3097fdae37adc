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
 * then for each output one fp32 chain over the blocks in order:
 *     acc = 0; for b: acc += (float)isum_b * (dw_b * dx_b);   out = acc (+ bias)
 * where isum_b is the block's integer dot product (exact in int32: |isum| <= 32 * 127^2), dw_b
 * and dx_b the two fp16 scales widened (their product is exact in fp32: 11 x 11 bits), one
 * rounded multiply and one rounded add per block. That is the contract: the same bits at every
 * level, whatever N, whatever rows share the call. This file is compiled with
 * -ffp-contract=off (CMakeLists.txt), so the multiply and the add are never fused into an FMA
 * at one level and not at another. The integer dot products are computed by vpmaddubsw +
 * vpmaddwd (AVX2, AVX-512 BW: |w| times x with w's sign, the "sign trick"; pairs of products
 * are at most 2 * 127^2 = 32258, so the int16 sums never saturate), by vpdpbusd on a CPU with
 * AVX-512 VNNI (a variant of its own beside the avx512 level), and by plain C at the x86-64
 * level; an integer sum is exact in any order, so the three agree bit for bit. Four weight rows
 * at a time: their block sums land in the four lanes of one vector, whose fp32 operations are
 * lane by lane the scalar chain above. */
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
            for (int j = 0; j < LOOM_Q8_BLOCK; j++) qb[j] = (int8_t)roundf(xb[j] * id);
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

int matmul_q8_vnni(void) {
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
typedef float q8_v4f __attribute__((vector_size(16)));
typedef int32_t q8_v4i __attribute__((vector_size(16)));
#endif

/* the block's integer dot product, plainly */
static inline int32_t LOOM_KV(q8_isum1)(const int8_t *w, const int8_t *x) {
    int32_t s = 0;
    for (int j = 0; j < LOOM_Q8_BLOCK; j++) s += (int32_t)w[j] * (int32_t)x[j];
    return s;
}

#if defined(__AVX2__)
/* 8 int32 partial sums of one block of w . x (sign trick) */
static inline __attribute__((always_inline)) __m256i LOOM_KV(q8_dot32)(__m256i w, __m256i x) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
/* the totals of four vectors of 8 int32, in the lanes of one */
static inline __attribute__((always_inline)) __m128i LOOM_KV(q8_sum4)(__m256i a, __m256i b,
                                                                      __m256i c, __m256i d) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
#endif

#if defined(__AVX512BW__)
/* 16 int32 partial sums of two blocks (lanes 0-7 the first, 8-15 the second) */
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

/* out[r] (r < 4) = row o0 + r of the product with one input row (xq, xs: its values and its
 * scales widened); wq, wd the 4 weight rows' values and scales; nb blocks */
static inline __attribute__((always_inline)) void LOOM_KV(q8_rows4)(
    float *out, const int8_t *xq, const float *xs, const int8_t *wq, const uint16_t *wd,
    const float *bias, int nb, int IC) {
    q8_v4f acc = {0.0f, 0.0f, 0.0f, 0.0f};
    int b = 0;
#if defined(__AVX512BW__)
    for (; b + 2 <= nb; b += 2) {
        const int64_t i = (int64_t)b * LOOM_Q8_BLOCK;
        const __m512i x = _mm512_loadu_si512(xq + i);
        __m512i v[4];
        for (int r = 0; r < 4; r++)
            v[r] = LOOM_KV(q8_dot64)(_mm512_loadu_si512(wq + (int64_t)r * IC + i), x);
        const __m128i s0 = LOOM_KV(q8_sum4)(_mm512_castsi512_si256(v[0]), _mm512_castsi512_si256(v[1]),
                                            _mm512_castsi512_si256(v[2]), _mm512_castsi512_si256(v[3]));
        const __m128i s1 = LOOM_KV(q8_sum4)(_mm512_extracti64x4_epi64(v[0], 1),
                                            _mm512_extracti64x4_epi64(v[1], 1),
                                            _mm512_extracti64x4_epi64(v[2], 1),
                                            _mm512_extracti64x4_epi64(v[3], 1));
        for (int k = 0; k < 2; k++) {
            q8_v4i s;
            memcpy(&s, k ? &s1 : &s0, sizeof s);
            q8_v4f dv = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int r = 0; r < 4; r++) dv[r] = loom_fp16_widen(wd[(int64_t)r * nb + b + k]);
            dv *= xs[b + k];
            acc += __builtin_convertvector(s, q8_v4f) * dv;
        }
    }
#endif
#if defined(__AVX2__)
    for (; b < nb; b++) {
        const int64_t i = (int64_t)b * LOOM_Q8_BLOCK;
        const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i));
        __m256i v[4];
        for (int r = 0; r < 4; r++)
            v[r] = LOOM_KV(q8_dot32)(_mm256_loadu_si256((const __m256i *)(wq + (int64_t)r * IC + i)), x);
        const __m128i s4 = LOOM_KV(q8_sum4)(v[0], v[1], v[2], v[3]);
        q8_v4i s;
        memcpy(&s, &s4, sizeof s);
        q8_v4f dv = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int r = 0; r < 4; r++) dv[r] = loom_fp16_widen(wd[(int64_t)r * nb + b]);
        dv *= xs[b];
        acc += __builtin_convertvector(s, q8_v4f) * dv;
    }
#else
    for (; b < nb; b++) {
        const int64_t i = (int64_t)b * LOOM_Q8_BLOCK;
        q8_v4i s = {0, 0, 0, 0};
        q8_v4f dv = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int r = 0; r < 4; r++) {
            s[r] = LOOM_KV(q8_isum1)(wq + (int64_t)r * IC + i, xq + i);
            dv[r] = loom_fp16_widen(wd[(int64_t)r * nb + b]);
        }
        dv *= xs[b];
        acc += __builtin_convertvector(s, q8_v4f) * dv;
    }
#endif
    for (int r = 0; r < 4; r++) out[r] = bias ? acc[r] + bias[r] : acc[r];
}

/* one weight row against one input row: the same chain, scalar */
static inline float LOOM_KV(q8_row1)(const int8_t *xq, const float *xs, const int8_t *wq,
                                     const uint16_t *wd, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const int64_t i = (int64_t)b * LOOM_Q8_BLOCK;
        const float d = loom_fp16_widen(wd[b]) * xs[b];
        acc += (float)LOOM_KV(q8_isum1)(wq + i, xq + i) * d;
    }
    return acc;
}

static void LOOM_KV(matmul_q8_forward)(float *out, const int8_t *xq, const uint16_t *xd,
                                       const int8_t *wq, const uint16_t *wd, const float *bias,
                                       int64_t N, int IC, int OC) {
    const int nb = IC / LOOM_Q8_BLOCK, G = (OC + 3) / 4;
    /* the input rows' scales widened once per call (at most 16 rows x 8192 / 32 on the stack
     * per chunk of rows) */
    enum { CHUNK = 16, MAXB = 1024 };
    float xs[CHUNK * MAXB];
    LOOM_CHECK(nb <= MAXB);
    for (int64_t n0 = 0; n0 < N; n0 += CHUNK) {
        const int64_t nr = N - n0 < CHUNK ? N - n0 : CHUNK;
        for (int64_t n = 0; n < nr; n++)
            for (int b = 0; b < nb; b++) xs[n * nb + b] = loom_fp16_widen(xd[(n0 + n) * nb + b]);
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * nr >= 4 * LOOM_PAR_MIN)
        for (int g = 0; g < G; g++) {
            const int o0 = 4 * g;
            const int8_t *w = wq + (int64_t)o0 * IC;
            const uint16_t *d = wd + (int64_t)o0 * nb;
            for (int64_t n = 0; n < nr; n++) {
                float *o = out + (n0 + n) * OC + o0;
                const int8_t *x = xq + (n0 + n) * IC;
                if (o0 + 4 <= OC) {
                    LOOM_KV(q8_rows4)(o, x, xs + n * nb, w, d, bias ? bias + o0 : NULL, nb, IC);
                    continue;
                }
                for (int r = 0; o0 + r < OC; r++) {
                    const float s = LOOM_KV(q8_row1)(x, xs + n * nb, w + (int64_t)r * IC,
                                                     d + (int64_t)r * nb, nb);
                    o[r] = bias ? s + bias[o0 + r] : s;
                }
            }
        }
    }
}

#endif
