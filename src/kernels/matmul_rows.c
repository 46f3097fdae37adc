/* Linear layer over a few rows (decoding): out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias,
 * reading the weight matrix once, in place. sgemm packs the whole weight matrix into its own
 * layout on every call; at a few rows that copy costs more than the product itself (a decode
 * step at batch 1 spent half its time in OpenBLAS's sgemm_incopy). Here each block of 4 weight
 * rows is read once and multiplied with every input row while it is in L1.
 *
 * Every output element is one dot product computed the same way whatever N is and whichever
 * block it falls in (vector partial sums over IC in order, a fixed reduction tree, then the
 * IC tail, then the bias): a row's result does not depend on the other rows of the step nor
 * on the thread count. */
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
enum { MR_W = 16 };
#endif

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

/* OB weight rows by NB input rows; OB, NB are constants where it is inlined. pf, when not
 * NULL, is the next block's weights (OB rows): each step over IC asks for the cache line of
 * each of its rows at the same offset, so the next block streams in from memory while this
 * one computes (one block ahead: 4 rows of IC floats). */
static inline __attribute__((always_inline)) void LOOM_KV(mr_block)(
    float *out, const float *inp, const float *w, const float *bias, const float *pf, int IC,
    int OC, int OB, int NB) {
    mr_vec acc[4][4];
    for (int r = 0; r < OB; r++)
        for (int n = 0; n < NB; n++) acc[r][n] = (mr_vec){0};
    const int ICv = IC - IC % MR_W;
    for (int i = 0; i < ICv; i += MR_W) {
        mr_vec wv[4], xv[4];
        if (pf)
            for (int r = 0; r < OB; r++) __builtin_prefetch(pf + (int64_t)r * IC + i, 0, 2);
        for (int r = 0; r < OB; r++) wv[r] = *(const mr_vec *)(w + (int64_t)r * IC + i);
        for (int n = 0; n < NB; n++) xv[n] = *(const mr_vec *)(inp + (int64_t)n * IC + i);
        for (int r = 0; r < OB; r++)
            for (int n = 0; n < NB; n++) acc[r][n] += wv[r] * xv[n];
    }
    for (int r = 0; r < OB; r++)
        for (int n = 0; n < NB; n++) {
            const float *wr = w + (int64_t)r * IC, *xr = inp + (int64_t)n * IC;
            float s = LOOM_KV(mr_hsum)(acc[r][n]);
            for (int i = ICv; i < IC; i++) s += wr[i] * xr[i];
            out[(int64_t)n * OC + r] = bias ? s + bias[r] : s;
        }
}

static void LOOM_KV(matmul_rows_forward)(float *out, const float *inp, const float *weight,
                                         const float *bias, int64_t N, int IC, int OC) {
    const int nblk = (OC + 3) / 4;
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * N >= 4 * LOOM_PAR_MIN)
    for (int b = 0; b < nblk; b++) {
        const int o = 4 * b;
        const float *w = weight + (int64_t)o * IC;
        const float *bb = bias ? bias + o : NULL;
        if (o + 4 <= OC) {
            /* the next block's rows, while there is a whole next block */
            const float *pf = o + 8 <= OC ? w + 4 * (int64_t)IC : NULL;
            int64_t n = 0;
            if (N >= 4) {
                LOOM_KV(mr_block)(out + o, inp, w, bb, pf, IC, OC, 4, 4);
                n = 4;
            } else {
                LOOM_KV(mr_block)(out + o, inp, w, bb, pf, IC, OC, 4, 1);
                n = 1;
            }
            for (; n + 4 <= N; n += 4)
                LOOM_KV(mr_block)(out + n * OC + o, inp + n * IC, w, bb, NULL, IC, OC, 4, 4);
            for (; n < N; n++)
                LOOM_KV(mr_block)(out + n * OC + o, inp + n * IC, w, bb, NULL, IC, OC, 4, 1);
        } else {
            for (int r = o; r < OC; r++)
                for (int64_t n = 0; n < N; n++)
                    LOOM_KV(mr_block)(out + n * OC + r, inp + n * IC, weight + (int64_t)r * IC,
                                      bias ? bias + r : NULL, NULL, IC, OC, 1, 1);
        }
    }
}

#endif
