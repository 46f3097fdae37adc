/* bf16 compute (--compute bf16, docs/inference.md "Compute in bf16"): the linear layer with
 * bf16 activations and bf16 weights, fp32 accumulation, in the layouts AVX-512 BF16's
 * VDPBF16PS wants, made once per matrix (weights, at load) and once per call (activations).
 *
 * VDPBF16PS acc, a, b: for each of 16 fp32 lanes l, acc[l] += a[2l+1] * b[2l+1], then
 * acc[l] += a[2l] * b[2l], each addition rounded to nearest-even (Intel SDM; checked on Zen 4).
 * Here lane l is an output column and a is one pair of an activation row broadcast to all
 * lanes, so each output is ONE fp32 chain over the pairs of IC in order:
 *     acc = 0; for p: acc += x[2p+1] * w[2p+1]; acc += x[2p] * w[2p];  out = acc (+ bias)
 * (IC odd: a last pair with a zero second element). That is the contract of
 * matmul_dotbf16_forward: the same bits whatever N is, whatever rows share the call, at every
 * level. On a CPU with avx512_bf16 at the avx512 level VDPBF16PS computes it (twice fp32's
 * multiply rate); elsewhere portable code, compiled per level (isa_variants.h), widens each
 * bf16 to the fp32 it stands for and adds the two products in the same order (a product of two
 * bf16 is exact in fp32, so mul + add and FMA agree). The two give the same bits except where a
 * value falls out of fp32's normal range: VDPBF16PS treats bf16 subnormal inputs as zero and
 * flushes subnormal results to zero (below 2^-126, 1.2e-38), the portable code does not.
 *
 * Layouts (P = pairs of IC = (IC + 1) / 2):
 *  - weights (dotbf16_pack): blocks of 16 output rows (the last padded with zero rows); block
 *    j, pair p holds (w[16j+l][2p], w[16j+l][2p+1]) for l = 0..15: one 64-byte vector, so a
 *    block streams from memory in order;
 *  - activations (bf16_round_rows): groups of 16 rows (the last padded with zero rows); group
 *    g, pair p holds (x[16g+n][2p], x[16g+n][2p+1]) for n = 0..15: one 64-byte line, each pair
 *    a 32-bit operand VDPBF16PS broadcasts from memory.
 *
 * The loop: a tile of up to 4 weight blocks x up to 16 rows of a group, at most 16 fp32
 * accumulators (16 columns x 1 row each), one weight vector and one broadcast per VDPBF16PS; no
 * reduction at the end (98% of the bf16 peak in cache on Zen 4). Threads split the weight
 * blocks; a call reads each weight block from memory once per pass of up to
 * LOOM_DB_GROUPS_PER_PASS groups of rows (16: a decode step is one group, a 256-row prefill one
 * pass). Rows 1 to 4 take 4 blocks at once (4 chains in flight; one block at a time was 30%
 * slower at one row, the chain's latency showing). */
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

LOOM_DISPATCH(bf16_round_rows, (uint16_t *dst, const float *src, int64_t N, int IC),
              (dst, src, N, IC))

int64_t dotbf16_pack_elems(int OC, int IC) {
    return ((int64_t)OC + 15) / 16 * 16 * (((int64_t)IC + 1) & ~(int64_t)1);
}

int64_t dotbf16_act_elems(int64_t N, int IC) {
    return (N + 15) / 16 * 16 * (((int64_t)IC + 1) & ~(int64_t)1);
}

void dotbf16_pack(uint16_t *dst, const void *w, int w_bf16, int OC, int IC) {
    const int64_t P = ((int64_t)IC + 1) / 2, nb = ((int64_t)OC + 15) / 16;
    for (int64_t j = 0; j < nb; j++)
        for (int l = 0; l < 16; l++) {
            const int64_t o = 16 * j + l;
            uint16_t *d = dst + j * P * 32 + 2 * l;
            if (o >= OC) { /* padding rows */
                for (int64_t p = 0; p < P; p++) d[p * 32] = d[p * 32 + 1] = 0;
                continue;
            }
            if (w_bf16) {
                const uint16_t *s = (const uint16_t *)w + o * IC;
                for (int64_t p = 0; p < IC / 2; p++) memcpy(d + p * 32, s + 2 * p, 4);
                if (IC & 1) d[(P - 1) * 32] = s[IC - 1], d[(P - 1) * 32 + 1] = 0;
            } else {
                const float *s = (const float *)w + o * IC;
                for (int64_t p = 0; p < IC / 2; p++) {
                    d[p * 32] = loom_bf16_round(s[2 * p]);
                    d[p * 32 + 1] = loom_bf16_round(s[2 * p + 1]);
                }
                if (IC & 1) d[(P - 1) * 32] = loom_bf16_round(s[IC - 1]), d[(P - 1) * 32 + 1] = 0;
            }
        }
}

void dotbf16_unpack_row(float *dst, const uint16_t *packed, int OC, int IC, int row) {
    (void)OC;
    const int64_t P = ((int64_t)IC + 1) / 2, j = row / 16, l = row % 16;
    const uint16_t *s = packed + j * P * 32 + 2 * l;
    for (int64_t i = 0; i < IC; i++) dst[i] = loom_bf16_widen(s[(i / 2) * 32 + (i & 1)]);
}

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
typedef uint16_t db_hvec __attribute__((vector_size(32)));
/* a weight vector: as loaded (VDPBF16PS) and split into its even and odd elements (portable) */
typedef struct db_w {
    db_uvec raw;
    db_vec even, odd;
} db_w;
/* groups of 16 rows per pass over a weight block (their activations: 16 * IC * 2 bytes each,
 * in L2 while the pass reads them once per weight block) */
#define LOOM_DB_GROUPS_PER_PASS 16
/* how far ahead (in pairs) a tile asks for its weight blocks' lines */
#define LOOM_DB_PF 24
#endif

static inline __attribute__((always_inline)) void LOOM_KV(db_loadw)(db_w *w, const uint16_t *p) {
    memcpy(&w->raw, p, sizeof w->raw);
#ifndef LOOM_DB_VDP
    const db_uvec e = w->raw << 16, o = w->raw & 0xffff0000u;
    memcpy(&w->even, &e, sizeof e);
    memcpy(&w->odd, &o, sizeof o);
#endif
}

/* *acc += x's odd element * w's odd elements, then += x's even element * w's even elements */
static inline __attribute__((always_inline)) void LOOM_KV(db_dot)(db_vec *acc,
                                                                  const uint16_t *xpair,
                                                                  const db_w *w) {
#ifdef LOOM_DB_VDP
    uint32_t u;
    memcpy(&u, xpair, sizeof u);
    *acc = (db_vec)_mm512_dpbf16_ps((__m512)*acc, (__m512bh)_mm512_set1_epi32((int)u),
                                    (__m512bh)w->raw);
#else
    uint32_t u;
    memcpy(&u, xpair, sizeof u);
    const uint32_t ub = u & 0xffff0000u, ua = u << 16;
    float xo, xe;
    memcpy(&xo, &ub, sizeof xo);
    memcpy(&xe, &ua, sizeof xe);
    *acc += xo * w->odd; /* exact products: contracted to an FMA or not, the same bits */
    *acc += xe * w->even;
#endif
}

/* OB weight blocks (wb, P * 32 apart) x NB rows of one activation group (xg) -> out (the
 * group's row 0; rows OC apart) at columns col0 + 16 * b + l. Only rows < nr and columns < OC
 * are stored. OB, NB constants where inlined; OB * NB <= 16. */
static inline __attribute__((always_inline)) void LOOM_KV(db_tile)(
    float *out, const uint16_t *xg, const uint16_t *wb, const float *bias, int64_t P, int OC,
    int col0, int nr, int OB, int NB) {
    db_vec acc[16]; /* acc[NB * b + n]: columns of block b, row n */
    for (int k = 0; k < OB * NB; k++) acc[k] = (db_vec){0};
    for (int64_t p = 0; p < P; p++) {
        db_w w[4];
        for (int b = 0; b < OB; b++) {
            __builtin_prefetch(wb + (b * P + p + LOOM_DB_PF) * 32, 0, 3);
            LOOM_KV(db_loadw)(&w[b], wb + (b * P + p) * 32);
        }
        for (int n = 0; n < NB; n++)
            for (int b = 0; b < OB; b++)
                LOOM_KV(db_dot)(&acc[NB * b + n], xg + p * 32 + 2 * n, &w[b]);
    }
    for (int b = 0; b < OB; b++) {
        const int c0 = col0 + 16 * b;
        if (c0 >= OC) break;
        const int nc = OC - c0 < 16 ? OC - c0 : 16;
        db_vec bv = (db_vec){0};
        if (bias) {
            if (nc == 16) memcpy(&bv, bias + c0, sizeof bv);
            else {
                float t[16] = {0};
                memcpy(t, bias + c0, (size_t)nc * sizeof *t);
                memcpy(&bv, t, sizeof bv);
            }
        }
        for (int n = 0; n < NB && n < nr; n++) {
            const db_vec v = bias ? acc[NB * b + n] + bv : acc[NB * b + n];
            if (nc == 16) memcpy(out + (int64_t)n * OC + c0, &v, sizeof v);
            else memcpy(out + (int64_t)n * OC + c0, &v, (size_t)nc * sizeof(float));
        }
    }
}

/* weight blocks [4s, 4s + 4) against nr (1..16) rows of one group; the tile shape by nr */
static inline __attribute__((always_inline)) void LOOM_KV(db_super)(
    float *out, const uint16_t *xg, const uint16_t *weight, const float *bias, int64_t P,
    int OC, int nblk, int s, int nr) {
    const int j0 = 4 * s, nb = nblk - j0 < 4 ? nblk - j0 : 4;
    const uint16_t *wb = weight + (int64_t)j0 * P * 32;
#define DB_T(ob, NB) LOOM_KV(db_tile)(out, xg, wb + (int64_t)j * P * 32, bias, P, OC, \
                                      16 * (j0 + j), nr, ob, NB)
    if (nr > 8) {
        for (int j = 0; j < nb; j++) DB_T(1, 16);
    } else if (nr > 4) {
        int j = 0;
        for (; j + 2 <= nb; j += 2) DB_T(2, 8);
        for (; j < nb; j++) DB_T(1, 8);
    } else if (nb == 4) {
        const int j = 0;
        if (nr > 2) DB_T(4, 4);
        else if (nr == 2) DB_T(4, 2);
        else DB_T(4, 1);
    } else {
        for (int j = 0; j < nb; j++) {
            if (nr > 2) DB_T(1, 4);
            else if (nr == 2) DB_T(1, 2);
            else DB_T(1, 1);
        }
    }
#undef DB_T
}

static void LOOM_KV(matmul_dotbf16_forward)(float *out, const uint16_t *inp,
                                            const uint16_t *weight, const float *bias,
                                            int64_t N, int IC, int OC) {
    const int64_t P = ((int64_t)IC + 1) / 2, G = (N + 15) / 16;
    const int nblk = (OC + 15) / 16, nsup = (nblk + 3) / 4;
    for (int64_t g0 = 0; g0 < G; g0 += LOOM_DB_GROUPS_PER_PASS) {
        const int64_t g1 = G - g0 < LOOM_DB_GROUPS_PER_PASS ? G : g0 + LOOM_DB_GROUPS_PER_PASS;
        const int64_t rows = (N < 16 * g1 ? N : 16 * g1) - 16 * g0;
#pragma omp parallel for schedule(static) if ((int64_t)OC * IC * rows >= 4 * LOOM_PAR_MIN)
        for (int s = 0; s < nsup; s++)
            for (int64_t g = g0; g < g1; g++) {
                const int nr = N - 16 * g < 16 ? (int)(N - 16 * g) : 16;
                LOOM_KV(db_super)(out + 16 * g * OC, inp + g * P * 32, weight, bias, P, OC,
                                  nblk, s, nr);
            }
    }
}

#ifndef LOOM_DB_EXTRA /* the rounding: integer operations, the same bits at every level */
/* 16 floats -> 16 bf16 (loom_bf16_round) */
static inline __attribute__((always_inline)) void LOOM_KV(db_round16)(uint16_t *dst,
                                                                      const float *src) {
    db_uvec u;
    memcpy(&u, src, sizeof u);
    const db_uvec nan = (db_uvec)((u & 0x7fffffffu) > 0x7f800000u);
    const db_uvec r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const db_uvec q = (u >> 16) | 0x40u; /* a NaN stays a quiet NaN */
    const db_hvec h = __builtin_convertvector((r & ~nan) | (q & nan), db_hvec);
    memcpy(dst, &h, sizeof h);
}

static void LOOM_KV(bf16_round_rows)(uint16_t *dst, const float *src, int64_t N, int IC) {
    const int64_t P = ((int64_t)IC + 1) / 2, G = (N + 15) / 16;
    uint16_t row[32];
    for (int64_t g = 0; g < G; g++) {
        uint16_t *d = dst + g * P * 32;
        for (int n = 0; n < 16; n++) {
            const int64_t r = 16 * g + n;
            if (r >= N) { /* padding rows: zeros */
                for (int64_t p = 0; p < P; p++) memset(d + p * 32 + 2 * n, 0, 2 * sizeof *d);
                continue;
            }
            const float *s = src + r * IC;
            int64_t i = 0;
            for (; i + 32 <= IC; i += 32) { /* 16 pairs: 16 lines of the group, 4 bytes each */
                LOOM_KV(db_round16)(row, s + i);
                LOOM_KV(db_round16)(row + 16, s + i + 16);
                for (int k = 0; k < 16; k++) memcpy(d + (i / 2 + k) * 32 + 2 * n, row + 2 * k, 4);
            }
            for (; i < 2 * P; i += 2) {
                d[(i / 2) * 32 + 2 * n] = loom_bf16_round(s[i]);
                d[(i / 2) * 32 + 2 * n + 1] = i + 1 < IC ? loom_bf16_round(s[i + 1]) : 0;
            }
        }
    }
}
#endif

#endif
