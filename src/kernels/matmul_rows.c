/* Linear layer over a few rows (decoding): out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias,
 * reading the weight matrix once, in place. sgemm packs the whole weight matrix into its own
 * layout on every call; at a few rows that copy costs more than the product itself (a decode
 * step at batch 1 spent half its time in OpenBLAS's sgemm_incopy). Here each block of 4 weight
 * rows is read once and multiplied with every input row while it is in L1 (or L2). The next
 * block's rows are prefetched while this one computes, spread over its passes over the input
 * rows (one row per pass of four input rows at 16 rows), so that memory streams all the time
 * rather than in bursts during the first pass. A block of 4 weight rows x 4 input rows sums
 * its 16 vectors of partial sums in one transposing tree (mr_hsum16), the same pairs as
 * mr_hsum's tree for each of them, so the bits are those of 16 mr_hsum calls.
 *
 * Every output element is one dot product computed the same way whatever N is and whichever
 * block it falls in (vector partial sums over IC in order, a fixed reduction tree, then the
 * IC tail, then the bias): a row's result does not depend on the other rows of the step nor
 * on the thread count.
 *
 * matmul_rows_bf16_forward: the same with the weights held as bfloat16 (the upper 16 bits of
 * an fp32, inference's --weights bf16): each weight is widened to the fp32 it stands for
 * exactly as it is loaded, and everything else (products, sums, their order) is the fp32
 * kernel's, so the result is the fp32 kernel's on the weights rounded to bf16. It takes any
 * N, in chunks of 16 rows (a prefill re-reads the half-size weights once per 16 rows). It is
 * compiled from this file into its own object by matmul_rows_bf16.c. */
#ifndef LOOM_KV
#include <string.h>

#include "kernels/kmath.h"
#include "loom/kernels.h"

#define LOOM_KSELF "kernels/matmul_rows.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(matmul_rows_forward, (float *out, const float *inp, const float *weight,
                                    const float *bias, int64_t N, int IC, int OC),
              (out, inp, weight, bias, N, IC, OC))
#else /* one level of the kernels (isa_variants.h) */

#ifndef LOOM_MR_TYPES
#define LOOM_MR_TYPES
/* one vector of partial sums: 16 lanes (one zmm, two ymm, four xmm by level); unaligned */
typedef float mr_vec __attribute__((vector_size(64), aligned(4)));
typedef float mr_half __attribute__((vector_size(32), aligned(4)));
typedef uint16_t mr_hvec __attribute__((vector_size(32), aligned(2)));
typedef uint32_t mr_uvec __attribute__((vector_size(64)));
enum { MR_W = 16 };
#endif

/* MR_W weights from element at of w: fp32 (bf = 0) or bf16 widened (bf = 1) */
static inline __attribute__((always_inline)) void LOOM_KV(mr_loadw)(mr_vec *f, const void *w,
                                                                     int bf, int64_t at) {
    if (bf) {
        const mr_uvec u = __builtin_convertvector(*(const mr_hvec *)((const uint16_t *)w + at),
                                                  mr_uvec) << 16;
        memcpy(f, &u, sizeof *f);
    } else {
        *f = *(const mr_vec *)((const float *)w + at);
    }
}
static inline __attribute__((always_inline)) float LOOM_KV(mr_w1)(const void *w, int bf,
                                                                  int64_t at) {
    if (!bf) return ((const float *)w)[at];
    const uint32_t u = (uint32_t)((const uint16_t *)w)[at] << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* the lanes of a in a fixed tree: (l, l+8), then (l, l+4), (l, l+2), (l, l+1) */
static inline float LOOM_KV(mr_hsum)(mr_vec a) {
    mr_half lo, hi;
    memcpy(&lo, &a, sizeof lo);
    memcpy(&hi, (const char *)&a + sizeof lo, sizeof hi);
    lo += hi;
    float t[MR_W / 2];
    memcpy(t, &lo, sizeof t);
    for (int s = MR_W / 4; s > 0; s /= 2)
        for (int l = 0; l < s; l++) t[l] += t[l + s];
    return t[0];
}

#ifndef LOOM_MR_HSUM16
#define LOOM_MR_HSUM16
typedef int32_t mr_ivec __attribute__((vector_size(64)));
#endif

/* a[0..15] -> lane 4 * (j % 4) + j / 4 holds the sum of a[j], each by mr_hsum's tree: level
 * one adds lanes (l, l+8) of two vectors at once, level two (l, l+4), three (l, l+2), four
 * (l, l+1); float addition commutes exactly, so only the pairs matter. */
static inline __attribute__((always_inline)) void LOOM_KV(mr_hsum16)(const mr_vec *a, mr_vec *sum) {
    const mr_ivec l1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const mr_ivec l2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const mr_ivec l3 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const mr_ivec l4 = {0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30};
    mr_vec p[8], q[4], r[2];
    for (int m = 0; m < 8; m++)
        p[m] = __builtin_shuffle(a[2 * m], a[2 * m + 1], l1) +
               __builtin_shuffle(a[2 * m], a[2 * m + 1], l1 + 8);
    for (int m = 0; m < 4; m++)
        q[m] = __builtin_shuffle(p[2 * m], p[2 * m + 1], l2) +
               __builtin_shuffle(p[2 * m], p[2 * m + 1], l2 + 4);
    for (int m = 0; m < 2; m++)
        r[m] = __builtin_shuffle(q[2 * m], q[2 * m + 1], l3) +
               __builtin_shuffle(q[2 * m], q[2 * m + 1], l3 + 2);
    *sum = __builtin_shuffle(r[0], r[1], l4) + __builtin_shuffle(r[0], r[1], l4 + 1);
}

/* OB weight rows by NB input rows; OB, NB are constants where it is inlined. pf, when not
 * NULL, is the next block's weights, followed by the one after: each step over IC asks for
 * the cache line of each row r (0-3 the next block, 4-7 the one after) with bit r set in pmask
 * at the same offset, so those blocks stream in from memory while this one computes (asking
 * two blocks ahead, each line twice, kept more lines in flight: -7% at 16 rows). */
static inline __attribute__((always_inline)) void LOOM_KV(mr_block)(
    float *out, const float *inp, const void *w, const float *bias, const void *pf,
    int pmask, int IC, int OC, int OB, int NB, int bf) {
    const int es = bf ? 2 : 4; /* bytes per weight */
    mr_vec acc[4][4];
    for (int r = 0; r < OB; r++)
        for (int n = 0; n < NB; n++) acc[r][n] = (mr_vec){0};
    const int ICv = IC - IC % MR_W;
    for (int i = 0; i < ICv; i += MR_W) {
        mr_vec wv[4], xv[4];
        if (pf)
            for (int r = 0; r < 8; r++)
                if (pmask >> r & 1)
                    __builtin_prefetch((const char *)pf + ((int64_t)r * IC + i) * es, 0, 2);
        for (int r = 0; r < OB; r++) LOOM_KV(mr_loadw)(&wv[r], w, bf, (int64_t)r * IC + i);
        for (int n = 0; n < NB; n++) xv[n] = *(const mr_vec *)(inp + (int64_t)n * IC + i);
        for (int r = 0; r < OB; r++)
            for (int n = 0; n < NB; n++) acc[r][n] += wv[r] * xv[n];
    }
    if (OB == 4 && NB == 4) {
        mr_vec a[16], sum;
        for (int r = 0; r < 4; r++)
            for (int n = 0; n < 4; n++) a[4 * r + n] = acc[r][n];
        LOOM_KV(mr_hsum16)(a, &sum); /* lane 4 * n + r: output (n, r) */
        float t[16];
        memcpy(t, &sum, sizeof t);
        for (int n = 0; n < 4; n++)
            for (int r = 0; r < 4; r++) {
                float s = t[4 * n + r];
                const float *xr = inp + (int64_t)n * IC;
                for (int i = ICv; i < IC; i++)
                    s += LOOM_KV(mr_w1)(w, bf, (int64_t)r * IC + i) * xr[i];
                out[(int64_t)n * OC + r] = bias ? s + bias[r] : s;
            }
        return;
    }
    for (int r = 0; r < OB; r++)
        for (int n = 0; n < NB; n++) {
            const float *xr = inp + (int64_t)n * IC;
            float s = LOOM_KV(mr_hsum)(acc[r][n]);
            for (int i = ICv; i < IC; i++) s += LOOM_KV(mr_w1)(w, bf, (int64_t)r * IC + i) * xr[i];
            out[(int64_t)n * OC + r] = bias ? s + bias[r] : s;
        }
}

#if defined(__AVX2__) && !defined(__AVX512F__)
#ifndef LOOM_MR_HALF_TYPES
#define LOOM_MR_HALF_TYPES
typedef uint16_t mr_qvec __attribute__((vector_size(16), aligned(2)));
typedef uint32_t mr_uhalf __attribute__((vector_size(32)));
#endif
/* mr_block at avx2, each vector of 16 partial sums held as its two halves (lanes 0-7, 8-15)
 * in ymm-sized vectors. Arrays of 64-byte vectors are wider than the level's registers, and
 * gcc kept them on the stack, moving halves through general registers: the 4 x 4 block's
 * loop was 188 stack loads and stores in 299 vector instructions. The same sums lane by lane
 * and mr_hsum's tree (its first step adds the halves), so the same bits as mr_block at this
 * level. OB x NB is 2 x 2 or 4 x 1 (8 ymm of sums). (At x86-64, where the 16 xmm registers
 * hold even fewer, the same change measured mixed, -30% and +20% by shape: left as it was.) */
static inline __attribute__((always_inline)) void LOOM_KV(mr_block_h)(
    float *out, const float *inp, const void *w, const float *bias, const void *pf,
    int pmask, int IC, int OC, int OB, int NB, int bf) {
    const int es = bf ? 2 : 4;
    mr_half lo[4][2], hi[4][2];
    for (int r = 0; r < OB; r++)
        for (int n = 0; n < NB; n++) lo[r][n] = hi[r][n] = (mr_half){0};
    const int ICv = IC - IC % MR_W;
    for (int i = 0; i < ICv; i += MR_W) {
        if (pf)
            for (int r = 0; r < 8; r++)
                if (pmask >> r & 1)
                    __builtin_prefetch((const char *)pf + ((int64_t)r * IC + i) * es, 0, 2);
        mr_half wl[4], wh[4];
        for (int r = 0; r < OB; r++) {
            const int64_t at = (int64_t)r * IC + i;
            if (bf) {
                const uint16_t *h = (const uint16_t *)w + at;
                const mr_uhalf ul = __builtin_convertvector(*(const mr_qvec *)h, mr_uhalf) << 16;
                const mr_uhalf uh = __builtin_convertvector(*(const mr_qvec *)(h + 8), mr_uhalf)
                                    << 16;
                memcpy(&wl[r], &ul, sizeof wl[r]);
                memcpy(&wh[r], &uh, sizeof wh[r]);
            } else {
                wl[r] = *(const mr_half *)((const float *)w + at);
                wh[r] = *(const mr_half *)((const float *)w + at + 8);
            }
        }
        for (int n = 0; n < NB; n++) {
            const mr_half xl = *(const mr_half *)(inp + (int64_t)n * IC + i);
            const mr_half xh = *(const mr_half *)(inp + (int64_t)n * IC + i + 8);
            for (int r = 0; r < OB; r++) {
                lo[r][n] += wl[r] * xl;
                hi[r][n] += wh[r] * xh;
            }
        }
    }
    for (int r = 0; r < OB; r++)
        for (int n = 0; n < NB; n++) {
            const float *xr = inp + (int64_t)n * IC;
            mr_half a = lo[r][n] + hi[r][n];
            float t[MR_W / 2];
            memcpy(t, &a, sizeof t);
            for (int s = MR_W / 4; s > 0; s /= 2)
                for (int l = 0; l < s; l++) t[l] += t[l + s];
            float s = t[0];
            for (int i = ICv; i < IC; i++) s += LOOM_KV(mr_w1)(w, bf, (int64_t)r * IC + i) * xr[i];
            out[(int64_t)n * OC + r] = bias ? s + bias[r] : s;
        }
}
#endif

/* block b (weight rows 4b..4b+3) against every input row; bf a constant where inlined (each
 * parallel loop below calls it, so the outlined OpenMP body is specialised) */
static inline __attribute__((always_inline)) void LOOM_KV(mr_rows4)(
    float *out, const float *inp, const void *weight, const float *bias, int64_t N, int IC,
    int OC, int b, int bf) {
    const int es = bf ? 2 : 4;
    {
        const int o = 4 * b;
        const char *w = (const char *)weight + (int64_t)o * IC * es;
        const float *bb = bias ? bias + o : NULL;
        if (o + 4 <= OC) {
            /* the next block's rows, while there is a whole next block; with G groups of 4
             * input rows, group g prefetches the rows r with r % G == g */
            const char *pf = o + 8 <= OC ? w + 4 * (int64_t)IC * es : NULL;
            const int G = N >= 4 ? (int)(N / 4) : 0, two = o + 12 <= OC;
            for (int g = 0; g < G; g++) {
                int mask = 0;
                for (int r = 0; r < 4; r++)
                    mask |= (r % G == g) << r | (two && r % G == g) << (r + 4);
#if !defined(__AVX2__) || defined(__AVX512F__)
                LOOM_KV(mr_block)(out + 4 * g * (int64_t)OC + o, inp + 4 * g * (int64_t)IC, w,
                                  bb, pf, mask, IC, OC, 4, 4, bf);
#else /* avx2: four 2 x 2 blocks (mr_block_h); block s = 2h + q asks for the rows
       * r % 4 == s of the prefetch mask */
                for (int h = 0; h < 2; h++)
                    for (int q = 0; q < 2; q++)
                        LOOM_KV(mr_block_h)(out + (4 * g + 2 * q) * (int64_t)OC + o + 2 * h,
                                            inp + (4 * g + 2 * q) * (int64_t)IC,
                                            w + 2 * h * (int64_t)IC * es, bb ? bb + 2 * h : NULL,
                                            pf, mask & (0x11 << (2 * h + q)), IC, OC, 2, 2, bf);
#endif
            }
            for (int64_t n = 4 * (int64_t)G; n < N; n++)
#if !defined(__AVX2__) || defined(__AVX512F__)
                LOOM_KV(mr_block)(out + n * OC + o, inp + n * IC, w, bb, n == 0 ? pf : NULL,
                                  two ? 0xFF : 0xF, IC, OC, 4, 1, bf);
#else
                LOOM_KV(mr_block_h)(out + n * OC + o, inp + n * IC, w, bb, n == 0 ? pf : NULL,
                                    two ? 0xFF : 0xF, IC, OC, 4, 1, bf);
#endif
        } else {
            for (int r = o; r < OC; r++)
                for (int64_t n = 0; n < N; n++)
                    LOOM_KV(mr_block)(out + n * OC + r, inp + n * IC,
                                      (const char *)weight + (int64_t)r * IC * es,
                                      bias ? bias + r : NULL, NULL, 0, IC, OC, 1, 1, bf);
        }
    }
}

#ifndef LOOM_MR_BF16_FILE
static void LOOM_KV(matmul_rows_forward)(float *out, const float *inp, const float *weight,
                                         const float *bias, int64_t N, int IC, int OC) {
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * N >= 4 * LOOM_PAR_MIN)
    for (int b = 0; b < (OC + 3) / 4; b++)
        LOOM_KV(mr_rows4)(out, inp, weight, bias, N, IC, OC, b, 0);
}

#else /* matmul_rows_bf16.c: its own object (test_flops interposes matmul_rows_forward) */
static void LOOM_KV(matmul_rows_bf16_forward)(float *out, const float *inp,
                                              const uint16_t *weight, const float *bias,
                                              int64_t N, int IC, int OC) {
    for (int64_t n0 = 0; n0 < N; n0 += LOOM_MATMUL_ROWS_MAX) {
        const int64_t n = N - n0 < LOOM_MATMUL_ROWS_MAX ? N - n0 : LOOM_MATMUL_ROWS_MAX;
        float *o = out + n0 * OC;
        const float *x = inp + n0 * IC;
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * n >= 4 * LOOM_PAR_MIN)
        for (int b = 0; b < (OC + 3) / 4; b++)
            LOOM_KV(mr_rows4)(o, x, weight, bias, n, IC, OC, b, 1);
    }
}

#endif

#endif
