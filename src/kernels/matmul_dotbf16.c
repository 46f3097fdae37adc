/* bf16 compute (--compute bf16, docs/inference.md "Compute in bf16"): the linear layer with
 * bf16 activations and bf16 weights, fp32 accumulation, and the rounding of activations.
 *
 * matmul_dotbf16_forward: out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias, both operands
 * bf16, row-major (the layout of --weights bf16's arena: no packing). Each output is one dot
 * product computed the same way whatever N is and whichever block it falls in: 16 fp32 lanes,
 * lane l taking elements 2l and 2l+1 of every step of 32 along IC (the last step zero-padded),
 * each step adding to the lane first the product of the odd element, then that of the even
 * one, each addition rounded to nearest-even. That is what AVX-512 BF16's VDPBF16PS does (Intel
 * SDM: "srcdest.fp32[i] += src1.bf16[2i+1] * src2.bf16[2i+1]; srcdest.fp32[i] +=
 * src1.bf16[2i+0] * src2.bf16[2i+0]"; checked on Zen 4). The lanes are then summed in a fixed
 * tree ((l, l+8), (l, l+4), (l, l+2), (l, l+1), as matmul_rows.c), then the bias is added.
 *
 * Two implementations compute that: on a CPU with avx512_bf16 at the avx512 level, the
 * VDPBF16PS one (twice fp32's multiply rate); elsewhere a portable one, compiled per level
 * (isa_variants.h), that widens each bf16 to the fp32 it stands for and adds the two products
 * in the same order (a product of two bf16 is exact in fp32, so mul + add and FMA agree). The
 * two give the same bits, except where a value falls out of fp32's normal range: VDPBF16PS
 * treats bf16 subnormal inputs as zero and flushes subnormal results to zero (below 2^-126,
 * 1.2e-38), the portable code does not.
 *
 * The loops are matmul_rows.c's: blocks of 4 weight rows x 4 input rows (16 dot products at
 * once, one transposing reduction), the next blocks' weight rows prefetched while one
 * computes; the input rows in chunks (a prefill's rows in chunks of about 256 KiB of bf16, so
 * each weight block is read once per chunk and the chunk's rows stay in L2).
 *
 * bf16_round_rows: n floats rounded to bf16 to nearest, ties to even (loom_bf16_round, torch's
 * .to(bfloat16)), vectorized. */
#ifndef LOOM_KV
#include <string.h>

#include "kernels/kmath.h"
#include "loom/bf16.h"
#include "loom/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(LOOM_NATIVE) && defined(__AVX512BF16__)
#define LOOM_DB_VDP 1 /* a NATIVE=1 build on a CPU with avx512_bf16: the one variant uses it */
#endif

#define LOOM_KSELF "kernels/matmul_dotbf16.c"
#include "kernels/isa_variants.h"

#if defined(__x86_64__) && !defined(LOOM_NATIVE)
/* the VDPBF16PS variant: the avx512 level's features and AVX512_BF16 */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx512bf16,avx2,fma,bmi,bmi2,popcnt,sse4.2")
#define LOOM_DB_VDP 1
#define LOOM_DB_EXTRA 1 /* not a level of isa_variants.h: the matmul only */
#define LOOM_KV(name) name##_vdp
#include LOOM_KSELF
#undef LOOM_KV
#undef LOOM_DB_EXTRA
#undef LOOM_DB_VDP
#pragma GCC pop_options
#endif

LOOM_DISPATCH(bf16_round_rows, (uint16_t *dst, const float *src, int64_t n), (dst, src, n))

int matmul_dotbf16_vdp(void) {
#if defined(LOOM_NATIVE)
#ifdef LOOM_DB_VDP
    return 1;
#else
    return 0;
#endif
#elif defined(__x86_64__)
    if (loom_isa_active() != LOOM_ISA_AVX512) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
#else
    return 0;
#endif
}

void matmul_dotbf16_forward(float *out, const uint16_t *inp, const uint16_t *weight,
                            const float *bias, int64_t N, int IC, int OC) {
#if defined(LOOM_NATIVE)
    matmul_dotbf16_forward_native(out, inp, weight, bias, N, IC, OC);
#else
    switch (loom_isa_active()) {
    case LOOM_ISA_AVX512:
#if defined(__x86_64__)
        if (matmul_dotbf16_vdp()) {
            matmul_dotbf16_forward_vdp(out, inp, weight, bias, N, IC, OC);
            break;
        }
#endif
        matmul_dotbf16_forward_avx512(out, inp, weight, bias, N, IC, OC);
        break;
    case LOOM_ISA_AVX2: matmul_dotbf16_forward_avx2(out, inp, weight, bias, N, IC, OC); break;
    default: matmul_dotbf16_forward_base(out, inp, weight, bias, N, IC, OC); break;
    }
#endif
}

#else /* one variant (isa_variants.h, or _vdp above) */

#ifndef LOOM_DB_TYPES
#define LOOM_DB_TYPES
typedef float db_vec __attribute__((vector_size(64)));
typedef uint32_t db_uvec __attribute__((vector_size(64)));
typedef int32_t db_ivec __attribute__((vector_size(64)));
typedef uint16_t db_hvec __attribute__((vector_size(32)));
enum { DB_K = 32 }; /* bf16 elements per step: 16 lanes of pairs */
/* chunk of input rows: about this many bytes of bf16 (a prefill's rows stay in L2) */
#define LOOM_DB_CHUNK_BYTES (256 * 1024)
#endif

/* 32 bf16 at p as 16 lanes of pairs (element 2l in the low half of lane l) */
static inline __attribute__((always_inline)) void LOOM_KV(db_load)(db_uvec *v,
                                                                   const uint16_t *p) {
    memcpy(v, p, sizeof *v);
}

/* the first m (0 < m < 32) bf16 at p, the rest zero */
static inline __attribute__((always_inline)) void LOOM_KV(db_load_tail)(db_uvec *v,
                                                                        const uint16_t *p, int m) {
#ifdef LOOM_DB_VDP
    *v = (db_uvec)_mm512_maskz_loadu_epi16((__mmask32)((1u << m) - 1u), p);
#else
    uint16_t t[DB_K] = {0};
    memcpy(t, p, (size_t)m * sizeof *t);
    memcpy(v, t, sizeof *v);
#endif
}

/* acc + (x[2l+1] * w[2l+1]) + (x[2l] * w[2l]) per lane l, each addition rounded */
static inline __attribute__((always_inline)) void LOOM_KV(db_dot)(db_vec *acc,
                                                                  const db_uvec *x,
                                                                  const db_uvec *w) {
#ifdef LOOM_DB_VDP
    *acc = (db_vec)_mm512_dpbf16_ps((__m512)*acc, (__m512bh)*x, (__m512bh)*w);
#else
    const db_uvec xo = *x & 0xffff0000u, wo = *w & 0xffff0000u, xe = *x << 16, we = *w << 16;
    db_vec fxo, fwo, fxe, fwe;
    memcpy(&fxo, &xo, sizeof fxo);
    memcpy(&fwo, &wo, sizeof fwo);
    memcpy(&fxe, &xe, sizeof fxe);
    memcpy(&fwe, &we, sizeof fwe);
    *acc += fxo * fwo; /* exact product: contracted to an FMA or not, the same bits */
    *acc += fxe * fwe;
#endif
}

/* the lanes of a in the fixed tree (l, l+8), (l, l+4), (l, l+2), (l, l+1) */
static inline float LOOM_KV(db_hsum)(const db_vec *a) {
    float t[16];
    memcpy(t, a, sizeof t);
    for (int s = 8; s > 0; s /= 2)
        for (int l = 0; l < s; l++) t[l] += t[l + s];
    return t[0];
}

/* the same tree over 16 vectors at once: lane 4 * (j % 4) + j / 4 of *sum gets a[j]'s sum.
 * Each level adds the pairs of lanes db_hsum adds (float addition commutes exactly). */
static inline __attribute__((always_inline)) void LOOM_KV(db_hsum16)(const db_vec *a,
                                                                     db_vec *sum) {
    const db_ivec s1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const db_ivec s2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const db_ivec s3 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const db_ivec s4 = {0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30};
    db_vec p[8], q[4], r[2];
    for (int m = 0; m < 8; m++) /* lanes 0-7: a[2m]'s (l, l+8); 8-15: a[2m+1]'s */
        p[m] = __builtin_shuffle(a[2 * m], a[2 * m + 1], s1) +
               __builtin_shuffle(a[2 * m], a[2 * m + 1], s1 + 8);
    for (int m = 0; m < 4; m++) /* four lanes for each of a[4m..4m+3]: (l, l+4) */
        q[m] = __builtin_shuffle(p[2 * m], p[2 * m + 1], s2) +
               __builtin_shuffle(p[2 * m], p[2 * m + 1], s2 + 4);
    for (int m = 0; m < 2; m++) /* two lanes each: (l, l+2) */
        r[m] = __builtin_shuffle(q[2 * m], q[2 * m + 1], s3) +
               __builtin_shuffle(q[2 * m], q[2 * m + 1], s3 + 2);
    *sum = __builtin_shuffle(r[0], r[1], s4) + __builtin_shuffle(r[0], r[1], s4 + 1);
}

/* the same tree over 4 vectors: lane 4j of *sum gets a[j]'s sum (the other lanes: junk) */
static inline __attribute__((always_inline)) void LOOM_KV(db_hsum4)(const db_vec *a0,
                                                                    const db_vec *a1,
                                                                    const db_vec *a2,
                                                                    const db_vec *a3,
                                                                    db_vec *sum) {
    const db_ivec s1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const db_ivec s2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const db_ivec s3 = {2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15};
    const db_ivec s4 = {1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9, 13, 13, 13, 13};
    const db_vec p0 = __builtin_shuffle(*a0, *a1, s1) + __builtin_shuffle(*a0, *a1, s1 + 8);
    const db_vec p1 = __builtin_shuffle(*a2, *a3, s1) + __builtin_shuffle(*a2, *a3, s1 + 8);
    const db_vec q = __builtin_shuffle(p0, p1, s2) + __builtin_shuffle(p0, p1, s2 + 4);
    const db_vec r = q + __builtin_shuffle(q, s3);
    *sum = r + __builtin_shuffle(r, s4);
}

/* OB weight rows (w, IC apart) by NB input rows (x, IC apart) -> out (OC apart); OB, NB
 * constants where inlined. pf (when not NULL): the next weight block, then the one after;
 * each step asks for the line of row r (0-3 the next block, 4-7 the one after) for each bit
 * r of pmask, at the same offset. */
static inline __attribute__((always_inline)) void LOOM_KV(db_block)(
    float *out, const uint16_t *x, const uint16_t *w, const float *bias, const uint16_t *pf,
    int pmask, int IC, int OC, int OB, int NB) {
    db_vec acc[4][4];
    for (int r = 0; r < OB; r++)
        for (int n = 0; n < NB; n++) acc[r][n] = (db_vec){0};
    const int ICv = IC - IC % DB_K;
    for (int i = 0; i < ICv; i += DB_K) {
        if (pf)
            for (int r = 0; r < 8; r++)
                if (pmask >> r & 1) __builtin_prefetch(pf + (int64_t)r * IC + i, 0, 2);
        db_uvec wv[4], xv[4];
        for (int r = 0; r < OB; r++) LOOM_KV(db_load)(&wv[r], w + (int64_t)r * IC + i);
        for (int n = 0; n < NB; n++) LOOM_KV(db_load)(&xv[n], x + (int64_t)n * IC + i);
        for (int r = 0; r < OB; r++)
            for (int n = 0; n < NB; n++) LOOM_KV(db_dot)(&acc[r][n], &xv[n], &wv[r]);
    }
    if (ICv < IC) {
        const int m = IC - ICv;
        db_uvec wv[4], xv[4];
        for (int r = 0; r < OB; r++) LOOM_KV(db_load_tail)(&wv[r], w + (int64_t)r * IC + ICv, m);
        for (int n = 0; n < NB; n++) LOOM_KV(db_load_tail)(&xv[n], x + (int64_t)n * IC + ICv, m);
        for (int r = 0; r < OB; r++)
            for (int n = 0; n < NB; n++) LOOM_KV(db_dot)(&acc[r][n], &xv[n], &wv[r]);
    }
    if (OB == 4 && NB == 4) {
        db_vec a[16], sum;
        for (int r = 0; r < 4; r++)
            for (int n = 0; n < 4; n++) a[4 * r + n] = acc[r][n];
        LOOM_KV(db_hsum16)(a, &sum); /* lane 4 * n + r: output (n, r) */
        float t[16];
        memcpy(t, &sum, sizeof t);
        for (int n = 0; n < 4; n++)
            for (int r = 0; r < 4; r++)
                out[(int64_t)n * OC + r] = bias ? t[4 * n + r] + bias[r] : t[4 * n + r];
        return;
    }
    if (OB == 4 || NB == 4) { /* 4 x 1 (a row alone), 1 x 4 (the last weight rows) */
        for (int j = 0; j < (OB == 4 ? NB : OB); j++) {
            db_vec sum;
            if (OB == 4)
                LOOM_KV(db_hsum4)(&acc[0][j], &acc[1][j], &acc[2][j], &acc[3][j], &sum);
            else
                LOOM_KV(db_hsum4)(&acc[j][0], &acc[j][1], &acc[j][2], &acc[j][3], &sum);
            float t[16];
            memcpy(t, &sum, sizeof t);
            for (int k = 0; k < 4; k++) {
                const int r = OB == 4 ? k : j, n = OB == 4 ? j : k;
                out[(int64_t)n * OC + r] = bias ? t[4 * k] + bias[r] : t[4 * k];
            }
        }
        return;
    }
    for (int r = 0; r < OB; r++)
        for (int n = 0; n < NB; n++) {
            const float s = LOOM_KV(db_hsum)(&acc[r][n]);
            out[(int64_t)n * OC + r] = bias ? s + bias[r] : s;
        }
}

/* weight rows 4b..4b+3 against the N input rows */
static inline __attribute__((always_inline)) void LOOM_KV(db_rows4)(
    float *out, const uint16_t *inp, const uint16_t *weight, const float *bias, int64_t N,
    int IC, int OC, int b) {
    const int o = 4 * b;
    const uint16_t *w = weight + (int64_t)o * IC;
    const float *bb = bias ? bias + o : NULL;
    if (o + 4 > OC) { /* the last rows, fewer than 4 */
        for (int r = o; r < OC; r++) {
            const uint16_t *wr = weight + (int64_t)r * IC;
            const float *br = bias ? bias + r : NULL;
            int64_t n = 0;
            for (; n + 4 <= N; n += 4)
                LOOM_KV(db_block)(out + n * OC + r, inp + n * IC, wr, br, NULL, 0, IC, OC, 1, 4);
            for (; n < N; n++)
                LOOM_KV(db_block)(out + n * OC + r, inp + n * IC, wr, br, NULL, 0, IC, OC, 1, 1);
        }
        return;
    }
    /* the next block's rows while there is a whole next block (and the one after); with G
     * groups of 4 input rows, group g asks for the rows r with r % G == g */
    const uint16_t *pf = o + 8 <= OC ? w + 4 * (int64_t)IC : NULL;
    const int64_t G = N / 4;
    const int two = o + 12 <= OC;
    for (int64_t g = 0; g < G; g++) {
        int mask = 0;
        for (int r = 0; r < 4; r++)
            if (r % G == g) mask |= 1 << r | two << (r + 4);
        LOOM_KV(db_block)(out + 4 * g * OC + o, inp + 4 * g * IC, w, bb, mask ? pf : NULL, mask,
                          IC, OC, 4, 4);
    }
    for (int64_t n = 4 * G; n < N; n++)
        LOOM_KV(db_block)(out + n * OC + o, inp + n * IC, w, bb, n == 0 ? pf : NULL,
                          two ? 0xFF : 0xF, IC, OC, 4, 1);
}

static void LOOM_KV(matmul_dotbf16_forward)(float *out, const uint16_t *inp,
                                            const uint16_t *weight, const float *bias,
                                            int64_t N, int IC, int OC) {
    int64_t chunk = (LOOM_DB_CHUNK_BYTES / ((int64_t)IC * 2)) & ~(int64_t)3;
    if (chunk < 16) chunk = 16;
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
        const int64_t n = N - n0 < chunk ? N - n0 : chunk;
        float *o = out + n0 * OC;
        const uint16_t *x = inp + n0 * IC;
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * n >= 4 * LOOM_PAR_MIN)
        for (int b = 0; b < (OC + 3) / 4; b++) LOOM_KV(db_rows4)(o, x, weight, bias, n, IC, OC, b);
    }
}

#ifndef LOOM_DB_EXTRA /* the rounding: integer operations, the same bits at every level */
static void LOOM_KV(bf16_round_rows)(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        db_uvec u;
        memcpy(&u, src + i, sizeof u);
        const db_uvec nan = (db_uvec)((u & 0x7fffffffu) > 0x7f800000u);
        const db_uvec r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        const db_uvec q = (u >> 16) | 0x40u; /* a NaN stays a quiet NaN */
        const db_hvec h = __builtin_convertvector((r & ~nan) | (q & nan), db_hvec);
        memcpy(dst + i, &h, sizeof h);
    }
    for (; i < n; i++) dst[i] = loom_bf16_round(src[i]);
}
#endif

#endif
