/* Flash attention: tiled online-softmax attention (FlashAttention-2 style) with grouped-query
 * heads, strided views, causal / position-offset / document masks, and a per-row log-sum-exp.
 * API and contracts: include/loom/kernels.h; design notes: docs/kernels.md "Flash attention".
 *
 * Tiles: BQ query rows x BK keys. A (query tile, key tile) pair is classified from the mask as
 * skipped (nothing visible: never computed), full (everything visible: no masking work) or
 * partial (masked element by element with -inf before the softmax).
 *
 * Forward, one task per (b, h, query tile): Qsᵀ = (scale * Q tile)ᵀ (D x BQ, transposed once
 * per task); for each key tile: Sᵀ = K Qsᵀ (BK x BQ, K read in place), online softmax down the
 * columns (running max m, sum l, the accumulator rescaled by exp(m_old - m_new)),
 * acc += P V (V read in place). Then out = acc / l, lse = m + log(l). Working on Sᵀ keeps every
 * operand either in place or transposed once per task, never once per tile pair.
 *
 * Backward: every output element is written by exactly one task (no atomics, no cross-thread
 * reductions), in one of two schedules:
 *   fused, one task per (b, kv head): for each key tile (Kᵀ, Vᵀ transposed once), for each
 *     query head of the group and each query tile: S = Qs Kᵀ, P = exp(S - lse),
 *     dP = dO Vᵀ, dS = P (dP - delta) with delta = rowsum(dO * O); dV_acc += Pᵀ dO,
 *     dK_acc += dSᵀ Qs, dq += scale * (dS K); then dk/dv += the accumulators. 5 tile
 *     products per pair, but only B*KVH tasks.
 *   two passes: the same key-tile work without dq, one task per (b, kv head, key tile); then
 *     one task per (b, h, query tile) that recomputes Sᵀ = K Qsᵀ and dPᵀ = V dOᵀ from
 *     transposed tiles and adds dS K for each key tile. 7 products per pair, full parallelism.
 * Both add the same products (bitwise: a tile product and its transpose are the same FMA
 * chains) in the same order (dq: key tiles ascending; dk/dv: heads, then query tiles), so
 * choosing by the thread count (use_fused) changes no bit of the result.
 *
 * Inner loops: one set of tile operations (a small GEMM, the softmax steps, the backward P/dS
 * steps, the row dot products) per ISA, chosen per call: AVX-512 (compiled with a target
 * attribute, run only when the CPU reports avx512f+vl+dq), AVX2 (the same operations at 8
 * lanes, the same bits; run when the CPU reports avx2+fma) or portable C. Each task's arithmetic
 * depends only on the task, so results are bitwise the same for any thread count and
 * schedule.
 *
 * Why one file: the forward, both backward schedules and the per-ISA tile operations share
 * the tile classification, the task layout and static inline tile code that must stay in one
 * translation unit to be inlined per ISA target; split, they would be one header of inline
 * code and thin files around it. */
#ifndef LOOM_KV
#include "kernels/kmath.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_HAVE_X86 1
#endif

#include "loom/kernels.h"

enum { BQ = 64, BK = 64 };

/* C (M x N, ldc) = (acc ? C : 0) + A B, A(r,k) = a[r*as + k*ak], B(k,n) = b[k*ldb + n]. */
typedef void (*gemm_fn)(float *c, int64_t ldc, const float *a, int64_t as, int64_t ak,
                        const float *b, int64_t ldb, int M, int N, int K, int acc);
/* One online-softmax step on a transposed score tile st (n keys x m queries, ld BQ; masked
 * entries -inf): st becomes Pᵀ = exp(st - m_new) per query column, mrow/lrow (running max and
 * sum per query) are updated, alpha[i] = exp(m_old - m_new) is what query i's accumulator row
 * must be multiplied by. */
typedef void (*softmax_fn)(float *st, int n, int m, float *mrow, float *lrow, float *alpha);
/* s (m queries x n keys, ld BK) scores -> P = exp(s - lse[r]); dp -> dS = P (dp - delta[r]);
 * rows whose lse is -inf (nothing visible) become 0. */
typedef void (*bwd_tile_fn)(float *s, float *dp, int m, int n, const float *lse,
                            const float *delta);
/* The same on transposed tiles (n keys x m queries, ld BQ). */
typedef void (*bwd_tile_t_fn)(float *st, float *dpt, int n, int m, const float *lse,
                              const float *delta);
/* delta[r] = sum_x a[r*ats + x] * b[r*bts + x], r < m, x < D */
typedef void (*row_dot_fn)(float *delta, const float *a, int64_t ats, const float *b,
                           int64_t bts, int m, int D);

/* dst (D x ld) = scale * transpose of rows x D rows of src (stride ts) */
typedef void (*transpose_fn)(float *dst, int ld, const float *src, int64_t ts, int rows, int D,
                             float scale);

typedef struct {
    gemm_fn gemm;
    softmax_fn softmax;
    bwd_tile_fn bwd_tile;
    bwd_tile_t_fn bwd_tile_t;
    row_dot_fn row_dot;
    transpose_fn transpose;
} attn_ops;

static void transpose_scaled(float *dst, int ld, const float *src, int64_t ts, int rows, int D,
                             float scale);

/* ---- portable C: the tile operations in plain C, compiled per level (below, after #else) --- */

/* exp(x - lse) must be 0 on rows with nothing visible (lse = -inf): subtract +inf there */
static inline float lse_base(float l) {
    return l == -INFINITY ? INFINITY : l;
}

#define FLASH_UNUSED __attribute__((unused)) /* the avx512 level's copy is not used */
#define LOOM_KSELF "kernels/flash_attention.c"
#include "kernels/isa_variants.h"

#ifdef LOOM_NATIVE
#define FLASH_PORTABLE_OPS(lvl)                                                                \
    {gemm_c_native, softmax_c_native, bwd_tile_c_native, bwd_tile_t_c_native, row_dot_c_native,   \
     transpose_scaled}
#else
#define FLASH_PORTABLE_OPS(lvl)                                                                \
    {gemm_c_##lvl, softmax_c_##lvl, bwd_tile_c_##lvl, bwd_tile_t_c_##lvl, row_dot_c_##lvl,        \
     transpose_scaled}
#endif
static const attn_ops ops_portable = FLASH_PORTABLE_OPS(base);
static const attn_ops ops_portable_avx2 = FLASH_PORTABLE_OPS(avx2);

/* ---- AVX-512 ------------------------------------------------------------------------------ */

#ifdef LOOM_HAVE_X86
#define T512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))
#define INL __attribute__((always_inline)) inline

/* exp with loom_expf's range reduction and polynomial (kmath.h), 16 lanes; inputs <= -87.34
 * (and -inf) give 0. */
T512 static INL __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3365447505531f);
    __m512 xc = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    xc = _mm512_max_ps(xc, lo);
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    __m512 t = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), shifter);
    __m512 nn = _mm512_sub_ps(t, shifter);
    __m512 r = _mm512_fnmadd_ps(nn, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(nn, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    /* y * 2^nn in one instruction (the same bits as building 2^nn and multiplying: checked
     * over every float) */
    __mmask16 keep = _mm512_cmp_ps_mask(xc, lo, _CMP_GT_OQ);
    return _mm512_maskz_scalef_ps(keep, y, nn);
}

/* The register-blocked core: R (<= 6) rows of C by NV (<= 4) vectors of 16 columns, the last
 * vector masked by `last`; R and NV are compile-time constants at every call site. */
T512 static INL void mk512(float *c, int64_t ldc, const float *a, int64_t as, int64_t ak,
                           const float *b, int64_t ldb, const int R, const int NV,
                           __mmask16 last, int K, int acc) {
    __m512 cc[6][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++)
            cc[r][v] = !acc ? _mm512_setzero_ps()
                       : v == NV - 1 ? _mm512_maskz_loadu_ps(last, c + r * ldc + 16 * v)
                                     : _mm512_loadu_ps(c + r * ldc + 16 * v);
    for (int k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        __m512 bv[4];
        for (int v = 0; v < NV; v++)
            bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, bk + 16 * v)
                                : _mm512_loadu_ps(bk + 16 * v);
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_set1_ps(a[r * as + k * ak]);
            for (int v = 0; v < NV; v++) cc[r][v] = _mm512_fmadd_ps(av, bv[v], cc[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            if (v == NV - 1)
                _mm512_mask_storeu_ps(c + r * ldc + 16 * v, last, cc[r][v]);
            else
                _mm512_storeu_ps(c + r * ldc + 16 * v, cc[r][v]);
        }
}

#define MK(R, NV) mk512(cp, ldc, ap, as, ak, bp, ldb, R, NV, last, K, acc)
#define MKR(R)                                                                                 \
    switch (nv) {                                                                              \
    case 1: MK(R, 1); break;                                                                   \
    case 2: MK(R, 2); break;                                                                   \
    case 3: MK(R, 3); break;                                                                   \
    default: MK(R, 4); break;                                                                  \
    }

/* Prefetches the rows r0 .. r0+5 of a strided C that is accumulated into and of a strided
 * row-major A, views of the caller's tensors (dq rows, K read in place) that come from L3 or
 * memory, while the row block before them computes: each block's FMA chains would otherwise
 * wait for their loads of C. The tiles in scratch (ld = their width) stay cached and are not
 * prefetched. Out of line so that gemm512's inner loop keeps its registers. */
T512 static __attribute__((noinline)) void prefetch_next_rows(const float *c, int64_t ldc,
                                                              const float *a, int64_t as,
                                                              int64_t ak, int r0, int M, int N,
                                                              int K, int n0, int nv, int acc) {
    const int pfc = acc && ldc > N, pfa = ak == 1 && as > K && n0 == 0;
    for (int r = r0; r < r0 + 6 && r < M; r++) {
        if (pfc)
            for (int v = 0; v < nv; v++)
                _mm_prefetch((const char *)(c + r * ldc + n0 + 16 * v), _MM_HINT_T0);
        if (pfa)
            for (int x = 0; x < K; x += 16) _mm_prefetch((const char *)(a + r * as + x), _MM_HINT_T0);
    }
}

T512 static void gemm512(float *c, int64_t ldc, const float *a, int64_t as, int64_t ak,
                         const float *b, int64_t ldb, int M, int N, int K, int acc) {
    for (int n0 = 0; n0 < N; n0 += 64) {
        int nn = N - n0 < 64 ? N - n0 : 64;
        int nv = (nn + 15) / 16;
        __mmask16 last = (__mmask16)((1u << (nn - 16 * (nv - 1))) - 1u);
        for (int r0 = 0; r0 < M; r0 += 6) {
            int rr = M - r0 < 6 ? M - r0 : 6;
            float *cp = c + r0 * ldc + n0;
            const float *ap = a + r0 * as;
            const float *bp = b + n0;
            prefetch_next_rows(c, ldc, a, as, ak, r0 + 6, M, N, K, n0, nv, acc);
            switch (rr) {
            case 1: MKR(1) break;
            case 2: MKR(2) break;
            case 3: MKR(3) break;
            case 4: MKR(4) break;
            case 5: MKR(5) break;
            default: MKR(6) break;
            }
        }
    }
}
#undef MK
#undef MKR

T512 static inline __mmask16 tail_mask(int left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

T512 static void softmax512(float *st, int n, int m, float *mrow, float *lrow, float *alpha) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    for (int i0 = 0; i0 < m; i0 += 16) {
        const __mmask16 km = tail_mask(m - i0);
        const __m512 mold = _mm512_mask_loadu_ps(ninf, km, mrow + i0);
        __m512 mnew = mold;
        for (int j = 0; j < n; j++)
            mnew = _mm512_max_ps(mnew, _mm512_mask_loadu_ps(ninf, km, st + (int64_t)j * BQ + i0));
        /* a column with nothing visible yet keeps m = -inf; exp(-inf - 0) = 0 keeps P at 0 */
        const __m512 muse =
            _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mnew, ninf, _CMP_EQ_OQ), mnew, zero);
        __m512 sum = zero;
        for (int j = 0; j < n; j++) {
            float *sj = st + (int64_t)j * BQ + i0;
            __m512 e = exp512(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, km, sj), muse));
            _mm512_mask_storeu_ps(sj, km, e);
            sum = _mm512_add_ps(sum, e);
        }
        const __m512 a = exp512(_mm512_sub_ps(mold, muse));
        _mm512_mask_storeu_ps(alpha + i0, km, a);
        _mm512_mask_storeu_ps(lrow + i0, km,
                              _mm512_fmadd_ps(_mm512_maskz_loadu_ps(km, lrow + i0), a, sum));
        _mm512_mask_storeu_ps(mrow + i0, km, mnew);
    }
}

T512 static INL __m512 lse_base512(__m512 l) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(l, ninf, _CMP_EQ_OQ), l,
                                _mm512_set1_ps(INFINITY));
}

T512 static void bwd_tile512(float *s, float *dp, int m, int n, const float *lse,
                             const float *delta) {
    for (int r = 0; r < m; r++) {
        float *sr = s + (int64_t)r * BK, *dr = dp + (int64_t)r * BK;
        const __m512 vl = _mm512_set1_ps(lse_base(lse[r])), vd = _mm512_set1_ps(delta[r]);
        for (int j = 0; j < n; j += 16) {
            __mmask16 k = tail_mask(n - j);
            __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sr + j), vl));
            __m512 d = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dr + j), vd));
            _mm512_mask_storeu_ps(sr + j, k, p);
            _mm512_mask_storeu_ps(dr + j, k, d);
        }
    }
}

T512 static void bwd_tile_t512(float *st, float *dpt, int n, int m, const float *lse,
                               const float *delta) {
    for (int i0 = 0; i0 < m; i0 += 16) {
        const __mmask16 km = tail_mask(m - i0);
        const __m512 vl = lse_base512(_mm512_maskz_loadu_ps(km, lse + i0));
        const __m512 vd = _mm512_maskz_loadu_ps(km, delta + i0);
        for (int j = 0; j < n; j++) {
            float *sj = st + (int64_t)j * BQ + i0, *dj = dpt + (int64_t)j * BQ + i0;
            __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(km, sj), vl));
            __m512 d = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(km, dj), vd));
            _mm512_mask_storeu_ps(sj, km, p);
            _mm512_mask_storeu_ps(dj, km, d);
        }
    }
}

T512 static void row_dot512(float *delta, const float *a, int64_t ats, const float *b,
                            int64_t bts, int m, int D) {
    for (int r = 0; r < m; r++) {
        const float *ar = a + r * ats, *br = b + r * bts;
        __m512 acc = _mm512_setzero_ps();
        for (int x = 0; x < D; x += 16) {
            __mmask16 k = tail_mask(D - x);
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, ar + x), _mm512_maskz_loadu_ps(k, br + x),
                                  acc);
        }
        delta[r] = _mm512_reduce_add_ps(acc);
    }
}

/* 16 x 16 floats transposed in registers: pairs of rows interleaved by 32 and 64 bits, then
 * 128-bit lanes exchanged twice. */
T512 static INL void tr16x16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), e = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    for (int j = 0; j < 4; j++) {
        t[j] = _mm512_shuffle_f32x4(r[j], r[j + 4], 0x88);
        t[j + 4] = _mm512_shuffle_f32x4(r[j], r[j + 4], 0xdd);
        t[j + 8] = _mm512_shuffle_f32x4(r[j + 8], r[j + 12], 0x88);
        t[j + 12] = _mm512_shuffle_f32x4(r[j + 8], r[j + 12], 0xdd);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
        r[j + 4] = _mm512_shuffle_f32x4(t[j + 4], t[j + 12], 0x88);
        r[j + 12] = _mm512_shuffle_f32x4(t[j + 4], t[j + 12], 0xdd);
    }
}

/* transpose_scaled in 16 x 16 blocks (the scalar loop's strided stores were the largest part
 * of the kernels' own time outside the tile products at T = 256); the same products scale * x,
 * so the same bits. Edges that are not whole blocks go element by element. */
T512 static void transpose512(float *dst, int ld, const float *src, int64_t ts, int rows, int D,
                              float scale) {
    const __m512 vs = _mm512_set1_ps(scale);
    const int R16 = rows / 16 * 16, D16 = D / 16 * 16;
    for (int r0 = 0; r0 < R16; r0 += 16)
        for (int d0 = 0; d0 < D16; d0 += 16) {
            __m512 v[16];
            for (int i = 0; i < 16; i++)
                v[i] = _mm512_mul_ps(vs, _mm512_loadu_ps(src + (r0 + i) * ts + d0));
            tr16x16(v);
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (int64_t)(d0 + i) * ld + r0, v[i]);
        }
    for (int r = 0; r < rows; r++) {
        const float *sr = src + r * ts;
        for (int d = r < R16 ? D16 : 0; d < D; d++) dst[(int64_t)d * ld + r] = scale * sr[d];
    }
}

static const attn_ops ops_avx512 = {gemm512, softmax512, bwd_tile512, bwd_tile_t512,
                                     row_dot512, transpose512};

/* The tile products through OpenBLAS instead of gemm512 (LOOM_ATTN_ISA_AVX512_BLAS): kept to
 * measure the hand-written microkernel against (bench/bench_attention.py). Called inside the
 * parallel region, where the OpenMP build of OpenBLAS runs single-threaded. */
static void gemm_blas(float *c, int64_t ldc, const float *a, int64_t as, int64_t ak,
                      const float *b, int64_t ldb, int M, int N, int K, int acc) {
    const int trans = ak != 1; /* A(r,k) = a[r*as + k*ak]: row-major with lda = as, or its
                                * transpose with lda = ak (as == 1) */
    cblas_sgemm(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, CblasNoTrans, M, N, K, 1.0f,
                a, (blasint)(trans ? ak : as), b, (blasint)ldb, acc ? 1.0f : 0.0f, c,
                (blasint)ldc);
}

static const attn_ops ops_avx512_blas = {gemm_blas, softmax512, bwd_tile512, bwd_tile_t512,
                                         row_dot512, transpose512};
#endif /* LOOM_HAVE_X86 */

/* ---- AVX2 --------------------------------------------------------------------------------- */

/* The AVX-512 operations at 8 lanes with 16 ymm registers, for CPUs with AVX2 + FMA and no
 * AVX-512 (Zen 1-3, Haswell .. Alder Lake). Every output element is the same chain of
 * operations as at the AVX-512 level (the tile products' FMA chains over k, the softmax's
 * per-query max and sum down the keys, the same exp, row_dot's 16 partial sums reduced in
 * _mm512_reduce_add_ps's order), so the two levels give the same bits (tested). */
#ifdef LOOM_HAVE_X86
#define T256 __attribute__((target("avx2,fma")))

/* all-ones in the first `left` lanes (all 8 for left >= 8) */
T256 static INL __m256i lanes8(int left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* exp512 at 8 lanes: the same range reduction and polynomial; 2^nn is built in the exponent
 * bits instead of vscalefps (the same bits: a product by a power of two is rounded once,
 * as vscalefps rounds). t = 1.5*2^23 + nn exactly, so t's low bits hold nn in two's
 * complement and shifting t's bits left by 23 leaves nn << 23: no float-to-int conversion.
 * Inputs <= -87.34 (and -inf) give 0; nn stays in [-126, 127], so 2^nn is a normal float. */
T256 static INL __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365447505531f);
    __m256 xc = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    xc = _mm256_max_ps(xc, lo);
    const __m256 shifter = _mm256_set1_ps(12582912.0f);
    __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), shifter);
    __m256 nn = _mm256_sub_ps(t, shifter);
    __m256 r = _mm256_fnmadd_ps(nn, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(nn, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(t), 23),
                                       _mm256_set1_epi32(127 << 23));
    const __m256 keep = _mm256_cmp_ps(xc, lo, _CMP_GT_OQ);
    return _mm256_mul_ps(y, _mm256_and_ps(_mm256_castsi256_ps(e), keep));
}

/* The register-blocked core: R (<= 6) rows of C by NV (<= 2) vectors of 8 columns (12
 * accumulators, 2 B vectors and a broadcast: 15 of the 16 ymm registers); with TAIL the last
 * vector is masked by `last` (a masked load every k otherwise costs the full tiles). R, NV
 * and TAIL are compile-time constants at every call site. */
T256 static INL void mk256(float *c, int64_t ldc, const float *a, int64_t as, int64_t ak,
                           const float *b, int64_t ldb, const int R, const int NV,
                           const int TAIL, __m256i last, int K, int acc) {
    __m256 cc[6][2];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++)
            cc[r][v] = !acc ? _mm256_setzero_ps()
                       : TAIL && v == NV - 1 ? _mm256_maskload_ps(c + r * ldc + 8 * v, last)
                                             : _mm256_loadu_ps(c + r * ldc + 8 * v);
    for (int k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        __m256 bv[2];
        for (int v = 0; v < NV; v++)
            bv[v] = TAIL && v == NV - 1 ? _mm256_maskload_ps(bk + 8 * v, last)
                                        : _mm256_loadu_ps(bk + 8 * v);
        for (int r = 0; r < R; r++) {
            __m256 av = _mm256_broadcast_ss(a + r * as + k * ak);
            for (int v = 0; v < NV; v++) cc[r][v] = _mm256_fmadd_ps(av, bv[v], cc[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            if (TAIL && v == NV - 1)
                _mm256_maskstore_ps(c + r * ldc + 8 * v, last, cc[r][v]);
            else
                _mm256_storeu_ps(c + r * ldc + 8 * v, cc[r][v]);
        }
}

/* prefetch_next_rows for the AVX2 product: rows r0 .. r0+5 of a strided C accumulated into
 * (all N columns: a row block runs over every column block before the next) and of a strided
 * row-major A; out of line, like the AVX-512 one */
static __attribute__((noinline)) void prefetch_rows256(const float *c, int64_t ldc,
                                                       const float *a, int64_t as, int64_t ak,
                                                       int r0, int M, int N, int K, int acc) {
    const int pfc = acc && ldc > N, pfa = ak == 1 && as > K;
    for (int r = r0; r < r0 + 6 && r < M; r++) {
        if (pfc)
            for (int x = 0; x < N; x += 16) _mm_prefetch((const char *)(c + r * ldc + x), _MM_HINT_T0);
        if (pfa)
            for (int x = 0; x < K; x += 16) _mm_prefetch((const char *)(a + r * as + x), _MM_HINT_T0);
    }
}

#define MK(R, NV, TL) mk256(cp, ldc, ap, as, ak, b + n0, ldb, R, NV, TL, last, K, acc)
#define MKR(R)                                                                                 \
    {                                                                                          \
        if (nv == 2) {                                                                         \
            if (tail) MK(R, 2, 1);                                                             \
            else MK(R, 2, 0);                                                                  \
        } else {                                                                               \
            if (tail) MK(R, 1, 1);                                                             \
            else MK(R, 1, 0);                                                                  \
        }                                                                                      \
    }

/* gemm512's product in blocks of 6 rows x 16 columns: a block of rows runs over all the
 * column blocks (its A rows, K read in place in the forward, come from L2 or L3 once; B, a
 * tile in scratch, stays in L1), and each element is the same FMA chain over k. */
T256 static void gemm256(float *c, int64_t ldc, const float *a, int64_t as, int64_t ak,
                         const float *b, int64_t ldb, int M, int N, int K, int acc) {
    for (int r0 = 0; r0 < M; r0 += 6) {
        const int rr = M - r0 < 6 ? M - r0 : 6;
        const float *ap = a + r0 * as;
        prefetch_rows256(c, ldc, a, as, ak, r0 + 6, M, N, K, acc);
        for (int n0 = 0; n0 < N; n0 += 16) {
            const int nn = N - n0 < 16 ? N - n0 : 16, nv = (nn + 7) / 8, tail = nn % 8 != 0;
            const __m256i last = lanes8(nn - 8 * (nv - 1));
            float *cp = c + r0 * ldc + n0;
            switch (rr) {
            case 1: MKR(1) break;
            case 2: MKR(2) break;
            case 3: MKR(3) break;
            case 4: MKR(4) break;
            case 5: MKR(5) break;
            default: MKR(6) break;
            }
        }
    }
}
#undef MK
#undef MKR

/* softmax512 on 8 query columns at a time: the same max and sum per column */
T256 static void softmax256(float *st, int n, int m, float *mrow, float *lrow, float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    for (int i0 = 0; i0 < m; i0 += 8) {
        float *mr = mrow + i0, *lr = lrow + i0, *al = alpha + i0;
        float mbuf[8], lbuf[8], abuf[8];
        const int w = m - i0 < 8 ? m - i0 : 8;
        if (w < 8) { /* a partial group of columns works on copies padded with -inf / 0 */
            for (int i = 0; i < 8; i++) {
                mbuf[i] = i < w ? mr[i] : -INFINITY;
                lbuf[i] = i < w ? lr[i] : 0.0f;
            }
            mr = mbuf, lr = lbuf, al = abuf;
        }
        const __m256i km = lanes8(w);
        const __m256 mold = _mm256_loadu_ps(mr);
        __m256 mnew = mold;
        if (w == 8)
            for (int j = 0; j < n; j++)
                mnew = _mm256_max_ps(mnew, _mm256_loadu_ps(st + (int64_t)j * BQ + i0));
        else
            for (int j = 0; j < n; j++)
                mnew = _mm256_max_ps(mnew, _mm256_blendv_ps(ninf, _mm256_maskload_ps(st + (int64_t)j * BQ + i0, km),
                                                            _mm256_castsi256_ps(km)));
        /* a column with nothing visible yet keeps m = -inf; exp(-inf - 0) = 0 keeps P at 0 */
        const __m256 muse = _mm256_blendv_ps(mnew, zero, _mm256_cmp_ps(mnew, ninf, _CMP_EQ_OQ));
        __m256 sum = zero;
        for (int j = 0; j < n; j++) {
            float *sj = st + (int64_t)j * BQ + i0;
            if (w == 8) {
                __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sj), muse));
                _mm256_storeu_ps(sj, e);
                sum = _mm256_add_ps(sum, e);
            } else {
                __m256 e = exp256(_mm256_sub_ps(
                    _mm256_blendv_ps(ninf, _mm256_maskload_ps(sj, km), _mm256_castsi256_ps(km)),
                    muse));
                _mm256_maskstore_ps(sj, km, e);
                sum = _mm256_add_ps(sum, e);
            }
        }
        const __m256 a = exp256(_mm256_sub_ps(mold, muse));
        _mm256_storeu_ps(al, a);
        _mm256_storeu_ps(lr, _mm256_fmadd_ps(_mm256_loadu_ps(lr), a, sum));
        _mm256_storeu_ps(mr, mnew);
        if (w < 8)
            for (int i = 0; i < w; i++) {
                mrow[i0 + i] = mbuf[i];
                lrow[i0 + i] = lbuf[i];
                alpha[i0 + i] = abuf[i];
            }
    }
}

T256 static INL __m256 lse_base256(__m256 l) {
    return _mm256_blendv_ps(l, _mm256_set1_ps(INFINITY),
                            _mm256_cmp_ps(l, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
}

T256 static void bwd_tile256(float *s, float *dp, int m, int n, const float *lse,
                             const float *delta) {
    const int n8 = n / 8 * 8;
    const __m256i kt = lanes8(n - n8);
    for (int r = 0; r < m; r++) {
        float *sr = s + (int64_t)r * BK, *dr = dp + (int64_t)r * BK;
        const __m256 vl = _mm256_set1_ps(lse_base(lse[r])), vd = _mm256_set1_ps(delta[r]);
        for (int j = 0; j < n8; j += 8) {
            __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(sr + j), vl));
            __m256 d = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dr + j), vd));
            _mm256_storeu_ps(sr + j, p);
            _mm256_storeu_ps(dr + j, d);
        }
        if (n8 < n) {
            __m256 p = exp256(_mm256_sub_ps(_mm256_maskload_ps(sr + n8, kt), vl));
            __m256 d = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_maskload_ps(dr + n8, kt), vd));
            _mm256_maskstore_ps(sr + n8, kt, p);
            _mm256_maskstore_ps(dr + n8, kt, d);
        }
    }
}

T256 static void bwd_tile_t256(float *st, float *dpt, int n, int m, const float *lse,
                               const float *delta) {
    for (int i0 = 0; i0 < m; i0 += 8) {
        const int w = m - i0 < 8 ? m - i0 : 8;
        const __m256i km = lanes8(w);
        const __m256 vl = lse_base256(_mm256_maskload_ps(lse + i0, km));
        const __m256 vd = _mm256_maskload_ps(delta + i0, km);
        for (int j = 0; j < n; j++) {
            float *sj = st + (int64_t)j * BQ + i0, *dj = dpt + (int64_t)j * BQ + i0;
            if (w == 8) {
                __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(sj), vl));
                __m256 d = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dj), vd));
                _mm256_storeu_ps(sj, p);
                _mm256_storeu_ps(dj, d);
            } else {
                __m256 p = exp256(_mm256_sub_ps(_mm256_maskload_ps(sj, km), vl));
                __m256 d = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_maskload_ps(dj, km), vd));
                _mm256_maskstore_ps(sj, km, p);
                _mm256_maskstore_ps(dj, km, d);
            }
        }
    }
}

/* row_dot512's 16 partial sums (lanes 0-7 in lo, 8-15 in hi) and its reduction order
 * (_mm512_reduce_add_ps: the halves, then the 128-bit halves, then lanes 2 apart, then 1) */
T256 static void row_dot256(float *delta, const float *a, int64_t ats, const float *b,
                            int64_t bts, int m, int D) {
    for (int r = 0; r < m; r++) {
        const float *ar = a + r * ats, *br = b + r * bts;
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        int x = 0;
        for (; x + 16 <= D; x += 16) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(ar + x), _mm256_loadu_ps(br + x), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(ar + x + 8), _mm256_loadu_ps(br + x + 8), hi);
        }
        if (x < D) { /* masked-off lanes add 0 * 0, as AVX-512's zero-masked loads do */
            const __m256i k0 = lanes8(D - x), k1 = lanes8(D - x - 8);
            lo = _mm256_fmadd_ps(_mm256_maskload_ps(ar + x, k0), _mm256_maskload_ps(br + x, k0), lo);
            hi = _mm256_fmadd_ps(_mm256_maskload_ps(ar + x + 8, k1),
                                 _mm256_maskload_ps(br + x + 8, k1), hi);
        }
        const __m256 t3 = _mm256_add_ps(hi, lo);
        const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
        const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
        delta[r] = _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
    }
}

/* 8 x 8 floats transposed in registers: rows interleaved by 32 and 64 bits, then the 128-bit
 * lanes exchanged */
T256 static INL void tr8x8(__m256 r[8]) {
    __m256 t[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    __m256 u[8];
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
}

/* transpose_scaled in 8 x 8 blocks; the same products scale * x, so the same bits */
T256 static void transpose256(float *dst, int ld, const float *src, int64_t ts, int rows, int D,
                              float scale) {
    const __m256 vs = _mm256_set1_ps(scale);
    const int R8 = rows / 8 * 8, D8 = D / 8 * 8;
    for (int r0 = 0; r0 < R8; r0 += 8)
        for (int d0 = 0; d0 < D8; d0 += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = _mm256_mul_ps(vs, _mm256_loadu_ps(src + (r0 + i) * ts + d0));
            tr8x8(v);
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + (int64_t)(d0 + i) * ld + r0, v[i]);
        }
    for (int r = 0; r < rows; r++) {
        const float *sr = src + r * ts;
        for (int d = r < R8 ? D8 : 0; d < D; d++) dst[(int64_t)d * ld + r] = scale * sr[d];
    }
}

static const attn_ops ops_avx2 = {gemm256, softmax256, bwd_tile256, bwd_tile_t256, row_dot256,
                                  transpose256};
#endif /* LOOM_HAVE_X86 */

int flash_attention_have_avx512(void) {
#ifdef LOOM_HAVE_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

static int have_avx2(void) {
#ifdef LOOM_HAVE_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* The tile operations for `isa`, or NULL if it cannot run here. AUTO follows the kernels'
 * level (loom_isa_active: detected, LOOM_ISA, agreed over the ranks of a job), so every rank
 * of a job runs the same code. */
static const attn_ops *pick_ops(int isa) {
    if (isa == LOOM_ATTN_ISA_AUTO) {
        switch (loom_isa_active()) {
        case LOOM_ISA_AVX512: isa = LOOM_ATTN_ISA_AVX512; break;
        case LOOM_ISA_AVX2: isa = LOOM_ATTN_ISA_AVX2; break;
        case LOOM_ISA_NATIVE: { /* NATIVE=1: one level; AVX-512 if the CPU has it, else AVX2
                                 * if it has that, unless LOOM_ISA asks for portable / x86-64 */
            const char *env = getenv("LOOM_ISA");
            int portable = env && (strcmp(env, "portable") == 0 || strcmp(env, "x86-64") == 0);
            isa = portable                       ? LOOM_ATTN_ISA_PORTABLE
                  : flash_attention_have_avx512() ? LOOM_ATTN_ISA_AVX512
                  : have_avx2()                   ? LOOM_ATTN_ISA_AVX2
                                                  : LOOM_ATTN_ISA_PORTABLE;
            break;
        }
        default: isa = LOOM_ATTN_ISA_PORTABLE; break;
        }
    }
    if (isa == LOOM_ATTN_ISA_PORTABLE) return &ops_portable;
    if (isa == LOOM_ATTN_ISA_AVX2_C && have_avx2()) return &ops_portable_avx2;
#ifdef LOOM_HAVE_X86
    if (isa == LOOM_ATTN_ISA_AVX2 && have_avx2()) return &ops_avx2;
    if (isa == LOOM_ATTN_ISA_AVX512 && flash_attention_have_avx512()) return &ops_avx512;
    if (isa == LOOM_ATTN_ISA_AVX512_BLAS && flash_attention_have_avx512())
        return &ops_avx512_blas;
#endif
    return NULL;
}

/* ---- shared driver ------------------------------------------------------------------------ */

loom_attn_dims flash_attention_dims_qkv(int B, int T, int H, int KVH, int D) {
    const int64_t R = (int64_t)(H + 2 * KVH) * D, HD = (int64_t)H * D;
    loom_attn_dims d = {B, T, T, H, KVH, D, T * R, R, T * R, R, T * R, R, T * HD, HD};
    return d;
}

int loom_attn_check(const loom_attn_dims *d, const loom_attn_mask *mk) {
    if (!d || !mk || d->B < 0 || d->Tq < 0 || d->Tk < 0 || d->H < 1 || d->KVH < 1 ||
        d->D < 1 || d->H % d->KVH != 0)
        return -1;
    if ((mk->q_doc == NULL) != (mk->k_doc == NULL)) return -1;
    if (mk->window < 0 || (mk->window > 0 && !mk->causal)) return -1;
    if (!(mk->scale >= 0.0f) || !isfinite(mk->scale) || !(mk->softcap >= 0.0f) ||
        !isfinite(mk->softcap))
        return -1;
    return 0;
}

/* the scores' scale: the mask's, else 1/sqrt(D) */
static float score_scale(const loom_attn_mask *mk, int D) {
    return mk->scale > 0.0f ? mk->scale : 1.0f / sqrtf((float)D);
}

/* Soft-capping of a score tile (rows x cols, ld): s = cap * tanh(s / cap); with g, also
 * g = 1 - tanh^2, the cap's derivative, which the backward multiplies dS by. The same scalar
 * code at every ISA level (the AVX-512 tiles call it too). */
static void softcap_tile(float *s, int rows, int cols, int64_t ld, float cap, float *g) {
    const float inv = 1.0f / cap;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const float t = tanhf(s[r * ld + c] * inv);
            s[r * ld + c] = cap * t;
            if (g) g[r * ld + c] = 1.0f - t * t;
        }
}

/* d *= g elementwise over a tile (rows x cols, ld): dS of the capped scores -> of the raw */
static void softcap_grad(float *d, const float *g, int rows, int cols, int64_t ld) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) d[r * ld + c] *= g[r * ld + c];
}

/* Visible (query, key) region of a tile pair. */
enum { TILE_SKIP = 0, TILE_FULL = 1, TILE_PARTIAL = 2 };

typedef struct {
    int32_t lo, hi; /* document id range of a tile (unused without documents) */
} doc_range;

static doc_range doc_range_of(const int32_t *doc, int n) {
    doc_range r = {doc[0], doc[0]};
    for (int i = 1; i < n; i++) {
        r.lo = doc[i] < r.lo ? doc[i] : r.lo;
        r.hi = doc[i] > r.hi ? doc[i] : r.hi;
    }
    return r;
}

/* qd/kd: the tiles' document ids (NULL without documents). */
static int tile_class(const loom_attn_mask *mk, int i0, int m, int j0, int n, const int32_t *qd,
                      doc_range qr, const int32_t *kd) {
    int full = 1;
    if (mk->causal) {
        int64_t qmin = mk->q_pos0 + i0, qmax = qmin + m - 1;
        int64_t kmin = mk->k_pos0 + j0, kmax = kmin + n - 1;
        if (kmin > qmax) return TILE_SKIP;
        full = kmax <= qmin;
        if (mk->window > 0) { /* a tile wholly before every query's window is never touched */
            if (qmin - kmax >= mk->window) return TILE_SKIP;
            full = full && qmax - kmin < mk->window;
        }
    }
    if (qd) {
        doc_range kr = doc_range_of(kd, n);
        if (kr.hi < qr.lo || qr.hi < kr.lo) return TILE_SKIP;
        full = full && qr.lo == qr.hi && kr.lo == kr.hi && qr.lo == kr.lo;
    }
    return full ? TILE_FULL : TILE_PARTIAL;
}

/* The diagonal tiles of a causal mask (query and key tile at the same positions): query r sees
 * key c only for c <= r, so about half of each tile product is masked out. Their products run
 * in strips of TRI rows that skip the columns (or the inner products' terms) a strip cannot
 * see: what is skipped is either overwritten by the mask (-inf) afterwards or an exact 0
 * (P and dS of an invisible pair) that the full product would have added to a sum, so the
 * results keep their bits. Each strip's extent is whole 16-float vectors. At T = 256 four of
 * the ten visible tile pairs per head are diagonal. */
enum { TRI = 16 };
static inline int diagonal(const loom_attn_mask *mk, int cls, int i0, int j0) {
    /* soft-capped scores take whole tiles (the cap would run on what the strips skip) */
    return cls == TILE_PARTIAL && mk->causal && mk->softcap == 0.0f &&
           mk->q_pos0 + i0 == mk->k_pos0 + j0;
}

/* Visibility of key j0+c to query i0+r (partial tiles only). */
static inline int visible(const loom_attn_mask *mk, int i0, int r, int j0, int c,
                          const int32_t *qd, const int32_t *kd) {
    const int64_t dq = mk->q_pos0 + i0 + r - (mk->k_pos0 + j0 + c); /* qpos - kpos */
    int vis = !mk->causal || (dq >= 0 && (mk->window <= 0 || dq < mk->window));
    return qd ? vis && qd[r] == kd[c] : vis;
}

/* A causal mask without documents: key c of the tile is visible to query r iff
 * c <= r + off, off = (q_pos0 + i0) - (k_pos0 + j0), and with a window W also
 * c > r + off - W; the masked entries of a row are then one run after the visible ones (and
 * with a window one before them), filled without testing each (the element-wise test was a
 * third of the forward's own time at T = 256). */
static inline int64_t causal_off(const loom_attn_mask *mk, int i0, int j0) {
    return mk->q_pos0 + i0 - (mk->k_pos0 + j0);
}
static inline int clampi(int64_t x, int lo, int hi) {
    return x < lo ? lo : x > hi ? hi : (int)x;
}

/* Sets the invisible entries of a partial tile s (m x n, ld BK) to -inf. */
static void mask_tile(float *s, const loom_attn_mask *mk, int i0, int m, int j0, int n,
                      const int32_t *qd, const int32_t *kd) {
    if (mk->causal && !qd) { /* row r: keys from r + off + 1 on (and before r + off - W + 1) */
        const int64_t off = causal_off(mk, i0, j0);
        for (int r = 0; r < m; r++) {
            for (int c = clampi(r + off + 1, 0, n); c < n; c++) s[(int64_t)r * BK + c] = -INFINITY;
            if (mk->window > 0)
                for (int c = 0, e = clampi(r + off - mk->window + 1, 0, n); c < e; c++)
                    s[(int64_t)r * BK + c] = -INFINITY;
        }
        return;
    }
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c++)
            if (!visible(mk, i0, r, j0, c, qd, kd)) s[(int64_t)r * BK + c] = -INFINITY;
}

/* The same on a transposed tile st (n x m, ld BQ). */
static void mask_tile_t(float *st, const loom_attn_mask *mk, int i0, int m, int j0, int n,
                        const int32_t *qd, const int32_t *kd) {
    if (mk->causal && !qd) { /* key c: queries before c - off (and from c - off + W on) */
        const int64_t off = causal_off(mk, i0, j0);
        for (int c = 0; c < n; c++) {
            const int e = clampi(c - off, 0, m);
            for (int r = 0; r < e; r++) st[(int64_t)c * BQ + r] = -INFINITY;
            if (mk->window > 0)
                for (int r = clampi(c - off + mk->window, 0, m); r < m; r++)
                    st[(int64_t)c * BQ + r] = -INFINITY;
        }
        return;
    }
    for (int c = 0; c < n; c++)
        for (int r = 0; r < m; r++)
            if (!visible(mk, i0, r, j0, c, qd, kd)) st[(int64_t)c * BQ + r] = -INFINITY;
}

/* dst (rows x D, ld D) = scale * rows of src (stride ts) */
static void copy_scaled(float *dst, const float *src, int64_t ts, int rows, int D, float scale) {
    for (int r = 0; r < rows; r++)
        for (int d = 0; d < D; d++) dst[(int64_t)r * D + d] = scale * src[r * ts + d];
}

/* dst (D x ld) = scale * transpose of rows x D rows of src (stride ts): the portable ops' */
static void transpose_scaled(float *dst, int ld, const float *src, int64_t ts, int rows, int D,
                             float scale) {
    for (int r = 0; r < rows; r++) {
        const float *sr = src + r * ts;
        for (int d = 0; d < D; d++) dst[(int64_t)d * ld + r] = scale * sr[d];
    }
}

/* dst (rows x D, ld D) = rows of src (stride ts). The B operand of a tile product is reused by
 * every row block, so it is packed first: rows of a strided view are a multiple of 1 KiB
 * apart (D floats per head, several heads per row) and would share a few L1 sets. */
static void pack_rows(float *dst, const float *src, int64_t ts, int rows, int D) {
    for (int r = 0; r < rows; r++) memcpy(dst + (int64_t)r * D, src + r * ts, (size_t)D * 4);
}

static float *scratch_alloc(size_t nfloats) {
    size_t bytes = (nfloats * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes);
}

/* Called by every thread of a parallel region: the thread's own scratch of nfloats, or NULL on
 * every thread when any thread's allocation failed (then *fail, shared, is 1). The barrier
 * makes the answer the same on all threads, so the work-sharing loops that follow are entered
 * by all of them or by none. The caller frees what it got. */
static float *scratch_alloc_team(size_t nfloats, int *fail) {
    float *buf = scratch_alloc(nfloats);
    if (!buf) {
#pragma omp atomic write
        *fail = 1;
    }
#pragma omp barrier
    int failed;
#pragma omp atomic read
    failed = *fail;
    if (failed) {
        free(buf);
        return NULL;
    }
    return buf;
}

int flash_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, const loom_attn_dims *dims,
                            const loom_attn_mask *mask, int isa) {
    if (loom_attn_check(dims, mask)) return -1;
    const attn_ops *ops = pick_ops(isa);
    if (!ops) return -2;
    const loom_attn_dims d = *dims;
    const loom_attn_mask mk = *mask;
    const int D = d.D, G = d.H / d.KVH;
    const int nqt = (d.Tq + BQ - 1) / BQ, nkt = (d.Tk + BK - 1) / BK;
    const int64_t ntask = (int64_t)d.B * d.H * nqt;
    const float scale = score_scale(&mk, D);
    /* qst (D x BQ), st (BK x BQ), acc (BQ x D), vp (BK x D), m/l/alpha (BQ) */
    const size_t nscratch = (size_t)2 * BQ * D + (size_t)BK * BQ + (size_t)BK * D + 3 * BQ;
    int fail = 0;
#pragma omp parallel if (ntask > 1)
    {
        float *buf = scratch_alloc_team(nscratch, &fail);
        if (buf) {
            float *qst = buf, *st = qst + (size_t)D * BQ, *acc = st + (size_t)BK * BQ;
            float *vp = acc + (size_t)BQ * D, *mrow = vp + (size_t)BK * D;
            float *lrow = mrow + BQ, *alpha = lrow + BQ;
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < ntask; task++) {
                /* the last query tiles (the most keys under a causal mask) go first */
                const int it = nqt - 1 - (int)(task % nqt);
                const int h = (int)(task / nqt % d.H), b = (int)(task / nqt / d.H);
                const int kvh = h / G;
                const int i0 = it * BQ, m = d.Tq - i0 < BQ ? d.Tq - i0 : BQ;
                const float *qb = q + b * d.q_bs + i0 * d.q_ts + (int64_t)h * D;
                const float *kb = k + b * d.k_bs + (int64_t)kvh * D;
                const float *vb = v + b * d.v_bs + (int64_t)kvh * D;
                const int32_t *qd = mk.q_doc ? mk.q_doc + b * mk.q_doc_bs + i0 : NULL;
                const int32_t *kdb = mk.k_doc ? mk.k_doc + b * mk.k_doc_bs : NULL;
                doc_range qr = {0, 0};
                if (qd) qr = doc_range_of(qd, m);
                ops->transpose(qst, BQ, qb, d.q_ts, m, D, scale);
                for (int r = 0; r < m; r++) {
                    mrow[r] = -INFINITY;
                    lrow[r] = 0.0f;
                }
                memset(acc, 0, (size_t)m * D * sizeof(float));
                for (int jt = 0; jt < nkt; jt++) {
                    const int j0 = jt * BK, n = d.Tk - j0 < BK ? d.Tk - j0 : BK;
                    const int32_t *kd = kdb ? kdb + j0 : NULL;
                    int cls = tile_class(&mk, i0, m, j0, n, qd, qr, kd);
                    if (cls == TILE_SKIP) continue;
                    const int tri = diagonal(&mk, cls, i0, j0);
                    /* Sᵀ (n x m) = K_j Qsᵀ; on a diagonal tile keys r0.. only against
                     * queries r0.. (the rest is masked below) */
                    if (!tri)
                        ops->gemm(st, BQ, kb + j0 * d.k_ts, d.k_ts, 1, qst, BQ, n, m, D, 0);
                    else
                        for (int r0 = 0; r0 < n && r0 < m; r0 += TRI)
                            ops->gemm(st + (int64_t)r0 * BQ + r0, BQ,
                                      kb + (j0 + r0) * d.k_ts, d.k_ts, 1, qst + r0, BQ,
                                      n - r0 < TRI ? n - r0 : TRI, m - r0, D, 0);
                    if (mk.softcap > 0.0f) softcap_tile(st, n, m, BQ, mk.softcap, NULL);
                    if (cls == TILE_PARTIAL) mask_tile_t(st, &mk, i0, m, j0, n, qd, kd);
                    ops->softmax(st, n, m, mrow, lrow, alpha);
                    for (int r = 0; r < m; r++) {
                        if (alpha[r] == 1.0f) continue;
                        float *ar = acc + (int64_t)r * D;
                        for (int x = 0; x < D; x++) ar[x] *= alpha[r];
                    }
                    /* acc (m x D) += P V_j, P(i, j) = st[j*BQ + i] */
                    pack_rows(vp, vb + j0 * d.v_ts, d.v_ts, n, D);
                    if (!tri)
                        ops->gemm(acc, D, st, 1, BQ, vp, D, m, D, n, 1);
                    else /* queries r0 .. r0+TRI-1 see keys up to r0+TRI-1 at most */
                        for (int r0 = 0; r0 < m; r0 += TRI) {
                            const int rr = m - r0 < TRI ? m - r0 : TRI;
                            const int kk = n < r0 + rr ? n : r0 + rr;
                            ops->gemm(acc + (int64_t)r0 * D, D, st + r0, 1, BQ, vp, D, rr, D,
                                      kk, 1);
                        }
                }
                float *ob = out + b * d.o_bs + i0 * d.o_ts + (int64_t)h * D;
                float *lb = lse ? lse + ((int64_t)b * d.H + h) * d.Tq + i0 : NULL;
                for (int r = 0; r < m; r++) {
                    float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
                    float *orow = ob + r * d.o_ts;
                    const float *ar = acc + (int64_t)r * D;
                    for (int x = 0; x < D; x++) orow[x] = ar[x] * inv;
                    if (lb) lb[r] = lrow[r] > 0.0f ? mrow[r] + logf(lrow[r]) : -INFINITY;
                }
            }
        }
        free(buf);
    }
    return fail ? -3 : 0;
}

static int is_blas(const attn_ops *o) {
#ifdef LOOM_HAVE_X86
    return o == &ops_avx512_blas;
#else
    (void)o;
    return 0;
#endif
}

/* Key tiles per sweep of the fused backward over the query tiles: each query tile's Qs, dO
 * and dq rows are then brought in once for KJ key tiles (they come from L3: a sweep covers
 * (H/KVH) * Tq * D * 3 floats, megabytes at long T). */
enum { KJ = 2 };

/* Everything a backward task reads, and its per-thread scratch. */
typedef struct {
    const attn_ops *ops;
    loom_attn_dims d;
    loom_attn_mask mk;
    float *dq, *dk, *dv;
    const float *dout, *q, *k, *v, *out, *lse;
    float scale;
    int G, nqt, nkt;
    int set; /* dq, dk, dv overwritten (flash_attention_backward_set), not accumulated into */
    /* scratch: qs (BQ x D), s, dp (BQ x BK), pk (max(BQ,BK) x D), delta (BQ); per key tile
     * of a sweep (KJ of them), kts: Kᵀ, Vᵀ (D x BK), scale K and the dK, dV accumulators
     * (BK x D); t1, t2 (D x max(BQ,BK)): q_tile_task's transposes, the first key tile's Kᵀ
     * and Vᵀ (the two passes run one after the other) */
    float *t1, *t2, *qs, *s, *dp, *pk, *delta, *kts;
    float *capg; /* (BQ x BK) the soft-cap's derivative of the score tile s (or sᵀ) */
    /* fused path only: delta of every query row of the task's group, (G, Tq); the group's
     * scaled queries and output gradients packed once per task, (G, Tq, D) each, so the
     * inner loop over (query head, query tile) copies nothing */
    float *delta_all, *qs_all, *do_all;
} bwd_ctx;

enum { BM = BQ > BK ? BQ : BK };

static size_t bwd_scratch_floats(int D) {
    return (size_t)BQ * D + (size_t)3 * BQ * BK + (size_t)BM * D + BQ + (size_t)KJ * 5 * BM * D;
}

static void bwd_ctx_scratch(bwd_ctx *x, float *buf) {
    const size_t dt = (size_t)x->d.D * BM;
    x->qs = buf;
    x->s = x->qs + (size_t)BQ * x->d.D;
    x->dp = x->s + (size_t)BQ * BK;
    x->pk = x->dp + (size_t)BQ * BK;
    x->delta = x->pk + dt;
    x->kts = x->delta + BQ;
    x->t1 = x->kts;
    x->t2 = x->kts + dt;
    x->capg = x->kts + (size_t)KJ * 5 * dt;
}

/* dq rows of (b, h, query tile at i0): the C operand of the dq product, which adds
 * dS (scale K_j) onto them in place (ld q_ts) */
static float *dq_rows(const bwd_ctx *x, int b, int h, int i0) {
    return x->dq + b * x->d.q_bs + i0 * x->d.q_ts + (int64_t)h * x->d.D;
}

/* One key tile of a sweep: its scratch and mask state. */
typedef struct {
    float *kt, *vt, *ks, *dkacc, *dvacc; /* Kᵀ, Vᵀ (D x BK), scale K, dK, dV (BK x D) */
    int j0, n, any;
    const int32_t *kd;
} key_slot;

/* kv_tile_task's five products for a diagonal tile pair (see TRI), in strips: S and dP rows
 * r0.. over keys < r0+TRI only (the rest of S is then masked; the rest of dP is never read);
 * dV, dK rows (keys) r0.. over queries r0.. only; dq rows r0.. over keys < r0+TRI. */
static void tri_pair(bwd_ctx *x, const key_slot *k, int b, int h, int i0, int m,
                     const int32_t *qd, const float *qs, const float *dop, const float *lb,
                     const float *delta, int with_dq) {
    const attn_ops *ops = x->ops;
    const int D = x->d.D, n = k->n;
    for (int r0 = 0; r0 < m; r0 += TRI) {
        const int rr = m - r0 < TRI ? m - r0 : TRI, nn = n < r0 + TRI ? n : r0 + TRI;
        ops->gemm(x->s + (int64_t)r0 * BK, BK, qs + (int64_t)r0 * D, D, 1, k->kt, BK, rr, nn,
                  D, 0);
        ops->gemm(x->dp + (int64_t)r0 * BK, BK, dop + (int64_t)r0 * D, D, 1, k->vt, BK, rr, nn,
                  D, 0);
    }
    mask_tile(x->s, &x->mk, i0, m, k->j0, n, qd, k->kd);
    ops->bwd_tile(x->s, x->dp, m, n, lb, delta);
    for (int r0 = 0; r0 < n && r0 < m; r0 += TRI) {
        const int rr = n - r0 < TRI ? n - r0 : TRI;
        if (x->dv)
            ops->gemm(k->dvacc + (int64_t)r0 * D, D, x->s + (int64_t)r0 * BK + r0, 1, BK,
                      dop + (int64_t)r0 * D, D, rr, D, m - r0, 1);
        if (x->dk)
            ops->gemm(k->dkacc + (int64_t)r0 * D, D, x->dp + (int64_t)r0 * BK + r0, 1, BK,
                      qs + (int64_t)r0 * D, D, rr, D, m - r0, 1);
    }
    if (with_dq)
        for (int r0 = 0; r0 < m; r0 += TRI) {
            const int rr = m - r0 < TRI ? m - r0 : TRI, kk = n < r0 + rr ? n : r0 + rr;
            ops->gemm(dq_rows(x, b, h, i0) + (int64_t)r0 * x->d.q_ts, x->d.q_ts,
                      x->dp + (int64_t)r0 * BK, BK, 1, k->ks, D, rr, D, kk, 1);
        }
}

/* The key tiles jt0 .. jt0+nj-1 (nj <= KJ) of (b, kv head): dk/dv rows += the sum over the
 * group's query heads and the query tiles (in that order) of dSᵀ Qs and Pᵀ dO. With with_dq,
 * each pair's dS (scale K_j) is also added to dq (the fused backward: dq rows then receive
 * their key tiles in ascending order, exactly as q_tile_task adds them). Every key tile gets
 * the same products in the same order for any nj. */
static void kv_tile_task(bwd_ctx *x, int b, int kvh, int jt0, int nj, int with_dq) {
    const attn_ops *ops = x->ops;
    const loom_attn_dims *d = &x->d;
    const loom_attn_mask *mk = &x->mk;
    const int D = d->D;
    const size_t dt = (size_t)D * BM;
    key_slot ks[KJ];
    for (int u = 0; u < nj; u++) {
        key_slot *k = &ks[u];
        float *base = x->kts + (size_t)u * 5 * dt;
        k->kt = base;
        k->vt = base + dt;
        k->ks = base + 2 * dt;
        k->dkacc = base + 3 * dt;
        k->dvacc = base + 4 * dt;
        k->j0 = (jt0 + u) * BK;
        k->n = d->Tk - k->j0 < BK ? d->Tk - k->j0 : BK;
        k->any = 0;
        k->kd = mk->k_doc ? mk->k_doc + b * mk->k_doc_bs + k->j0 : NULL;
        memset(k->dkacc, 0, (size_t)k->n * D * sizeof(float));
        memset(k->dvacc, 0, (size_t)k->n * D * sizeof(float));
    }
    for (int h = kvh * x->G; h < (kvh + 1) * x->G; h++) {
        for (int it = 0; it < x->nqt; it++) {
            const int i0 = it * BQ, m = d->Tq - i0 < BQ ? d->Tq - i0 : BQ;
            const int32_t *qd = mk->q_doc ? mk->q_doc + b * mk->q_doc_bs + i0 : NULL;
            doc_range qr = {0, 0};
            if (qd) qr = doc_range_of(qd, m);
            int cls[KJ], vis = 0;
            for (int u = 0; u < nj; u++) {
                cls[u] = tile_class(mk, i0, m, ks[u].j0, ks[u].n, qd, qr, ks[u].kd);
                vis |= cls[u] != TILE_SKIP;
            }
            if (!vis) continue;
            const float *qb = x->q + b * d->q_bs + i0 * d->q_ts + (int64_t)h * D;
            const float *dob = x->dout + b * d->o_bs + i0 * d->o_ts + (int64_t)h * D;
            const float *lb = x->lse + ((int64_t)b * d->H + h) * d->Tq + i0;
            const float *qs, *dop, *delta;
            if (x->qs_all) { /* fused: packed once per task */
                const int64_t off = ((int64_t)(h - kvh * x->G) * d->Tq + i0);
                qs = x->qs_all + off * D;
                dop = x->do_all + off * D;
                delta = x->delta_all + off;
            } else {
                const float *ob = x->out + b * d->o_bs + i0 * d->o_ts + (int64_t)h * D;
                copy_scaled(x->qs, qb, d->q_ts, m, D, x->scale);
                pack_rows(x->pk, dob, d->o_ts, m, D);
                ops->row_dot(x->delta, dob, d->o_ts, ob, d->o_ts, m, D);
                qs = x->qs;
                dop = x->pk;
                delta = x->delta;
            }
            for (int u = 0; u < nj; u++) {
                if (cls[u] == TILE_SKIP) continue;
                key_slot *k = &ks[u];
                const int j0 = k->j0, n = k->n;
                if (!k->any) {
                    const float *kb = x->k + b * d->k_bs + j0 * d->k_ts + (int64_t)kvh * D;
                    const float *vb = x->v + b * d->v_bs + j0 * d->v_ts + (int64_t)kvh * D;
                    ops->transpose(k->kt, BK, kb, d->k_ts, n, D, 1.0f);
                    ops->transpose(k->vt, BK, vb, d->v_ts, n, D, 1.0f);
                    if (with_dq) copy_scaled(k->ks, kb, d->k_ts, n, D, x->scale);
                    k->any = 1;
                }
                if (diagonal(mk, cls[u], i0, j0)) {
                    tri_pair(x, k, b, h, i0, m, qd, qs, dop, lb, delta, with_dq);
                    continue;
                }
                ops->gemm(x->s, BK, qs, D, 1, k->kt, BK, m, n, D, 0);
                if (mk->softcap > 0.0f) softcap_tile(x->s, m, n, BK, mk->softcap, x->capg);
                if (cls[u] == TILE_PARTIAL) mask_tile(x->s, mk, i0, m, j0, n, qd, k->kd);
                ops->gemm(x->dp, BK, dop, D, 1, k->vt, BK, m, n, D, 0);
                ops->bwd_tile(x->s, x->dp, m, n, lb, delta);
                if (mk->softcap > 0.0f) softcap_grad(x->dp, x->capg, m, n, BK);
                /* dV += Pᵀ dO, dK += dSᵀ (scale Q) */
                if (x->dv) ops->gemm(k->dvacc, D, x->s, 1, BK, dop, D, n, D, m, 1);
                if (x->dk) ops->gemm(k->dkacc, D, x->dp, 1, BK, qs, D, n, D, m, 1);
                if (with_dq) /* dq += dS (scale K_j) */
                    ops->gemm(dq_rows(x, b, h, i0), d->q_ts, x->dp, BK, 1, k->ks, D, m, D, n,
                              1);
            }
        }
    }
    for (int u = 0; u < nj; u++) {
        const key_slot *k = &ks[u];
        if (!k->any && !x->set) continue; /* (set: the accumulators hold zeros) */
        for (int r = 0; r < k->n; r++) {
            if (x->dk) {
                float *dkr = x->dk + b * d->k_bs + (k->j0 + r) * d->k_ts + (int64_t)kvh * D;
                const float *a = k->dkacc + (int64_t)r * D;
                if (x->set) memcpy(dkr, a, (size_t)D * sizeof(float));
                else for (int e = 0; e < D; e++) dkr[e] += a[e];
            }
            if (x->dv) {
                float *dvr = x->dv + b * d->v_bs + (k->j0 + r) * d->v_ts + (int64_t)kvh * D;
                const float *a = k->dvacc + (int64_t)r * D;
                if (x->set) memcpy(dvr, a, (size_t)D * sizeof(float));
                else for (int e = 0; e < D; e++) dvr[e] += a[e];
            }
        }
    }
}

/* dq rows of the query tile it of (b, h): for each visible key tile in ascending order,
 * dq += scale * dS K_j, with Sᵀ and dPᵀ computed from transposed tiles. Bitwise the same
 * additions as kv_tile_task's with_dq (the same products in the same order). */
static void q_tile_task(bwd_ctx *x, int b, int h, int it) {
    const attn_ops *ops = x->ops;
    const loom_attn_dims *d = &x->d;
    const loom_attn_mask *mk = &x->mk;
    const int D = d->D, kvh = h / x->G;
    const int i0 = it * BQ, m = d->Tq - i0 < BQ ? d->Tq - i0 : BQ;
    const float *qb = x->q + b * d->q_bs + i0 * d->q_ts + (int64_t)h * D;
    const float *dob = x->dout + b * d->o_bs + i0 * d->o_ts + (int64_t)h * D;
    const float *ob = x->out + b * d->o_bs + i0 * d->o_ts + (int64_t)h * D;
    const float *lb = x->lse + ((int64_t)b * d->H + h) * d->Tq + i0;
    const float *kb = x->k + b * d->k_bs + (int64_t)kvh * D;
    const float *vb = x->v + b * d->v_bs + (int64_t)kvh * D;
    const int32_t *qd = mk->q_doc ? mk->q_doc + b * mk->q_doc_bs + i0 : NULL;
    const int32_t *kdb = mk->k_doc ? mk->k_doc + b * mk->k_doc_bs : NULL;
    doc_range qr = {0, 0};
    if (qd) qr = doc_range_of(qd, m);
    float *qst = x->t1, *dot = x->t2, *st = x->s, *dpt = x->dp;
    if (x->set) /* this task's dq rows, zeroed before their key tiles add to them */
        for (int r = 0; r < m; r++) memset(dq_rows(x, b, h, i0 + r), 0, (size_t)D * sizeof(float));
    ops->transpose(qst, BQ, qb, d->q_ts, m, D, x->scale);
    ops->transpose(dot, BQ, dob, d->o_ts, m, D, 1.0f);
    ops->row_dot(x->delta, dob, d->o_ts, ob, d->o_ts, m, D);
    for (int jt = 0; jt < x->nkt; jt++) {
        const int j0 = jt * BK, n = d->Tk - j0 < BK ? d->Tk - j0 : BK;
        const int32_t *kd = kdb ? kdb + j0 : NULL;
        int cls = tile_class(mk, i0, m, j0, n, qd, qr, kd);
        if (cls == TILE_SKIP) continue;
        /* Sᵀ = K_j Qsᵀ, dPᵀ = V_j dOᵀ (n x m) */
        ops->gemm(st, BQ, kb + j0 * d->k_ts, d->k_ts, 1, qst, BQ, n, m, D, 0);
        if (mk->softcap > 0.0f) softcap_tile(st, n, m, BQ, mk->softcap, x->capg);
        if (cls == TILE_PARTIAL) mask_tile_t(st, mk, i0, m, j0, n, qd, kd);
        ops->gemm(dpt, BQ, vb + j0 * d->v_ts, d->v_ts, 1, dot, BQ, n, m, D, 0);
        ops->bwd_tile_t(st, dpt, n, m, lb, x->delta);
        if (mk->softcap > 0.0f) softcap_grad(dpt, x->capg, n, m, BQ);
        /* dq += dS (scale K_j), dS(i, j) = dpt[j*BQ + i] */
        copy_scaled(x->pk, kb + j0 * d->k_ts, d->k_ts, n, D, x->scale);
        ops->gemm(dq_rows(x, b, h, i0), d->q_ts, dpt, 1, BQ, x->pk, D, m, D, n, 1);
    }
}

/* The fused backward (one task per (b, kv head): 5 tile products per pair) keeps every thread
 * busy only with enough such tasks; otherwise two passes (7 products per pair) spread the work
 * over key tiles and query tiles. Both add the same products in the same order, so the choice,
 * which depends on the thread count, never changes a bit of the result. */
static int use_fused(int64_t nbk, int nthreads) {
    return nbk >= nthreads && (nbk % nthreads == 0 || nbk >= 4 * (int64_t)nthreads);
}

static int backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                    const float *k, const float *v, const float *out, const float *lse,
                    const loom_attn_dims *dims, const loom_attn_mask *mask, int isa, int set) {
    if (loom_attn_check(dims, mask)) return -1;
    const attn_ops *ops = pick_ops(isa);
    if (!ops) return -2;
    bwd_ctx x0 = {ops, *dims, *mask, dq, dk, dv, dout, q, k, v, out, lse,
                  score_scale(mask, dims->D), dims->H / dims->KVH,
                  (dims->Tq + BQ - 1) / BQ, (dims->Tk + BK - 1) / BK, set,
                  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    const int64_t nbk = (int64_t)dims->B * dims->KVH;
    const int64_t nkv_task = (dk || dv) ? nbk * x0.nkt : 0;
    const int64_t nq_task = dq ? (int64_t)dims->B * dims->H * x0.nqt : 0;
    /* the fused path needs dk or dv (its tasks are key tiles) and dq; the BLAS variant
     * always takes two passes (sgemm is not bitwise the same on a tile and its transpose) */
    const int fused = nkv_task && nq_task && !is_blas(ops) &&
                      use_fused(nbk, omp_get_max_threads());
    const size_t gq = (size_t)x0.G * dims->Tq;
    const size_t nscratch =
        bwd_scratch_floats(dims->D) + (fused ? gq * (1 + 2 * (size_t)dims->D) : 0);
    int fail = 0;
#pragma omp parallel if (nkv_task + nq_task > 1)
    {
        float *buf = scratch_alloc_team(nscratch, &fail);
        if (buf) {
            bwd_ctx x = x0;
            bwd_ctx_scratch(&x, buf);
            if (fused) {
                x.delta_all = buf + bwd_scratch_floats(dims->D);
                x.qs_all = x.delta_all + gq;
                x.do_all = x.qs_all + gq * dims->D;
#pragma omp for schedule(dynamic, 1)
                for (int64_t task = 0; task < nbk; task++) {
                    const int b = (int)(task / dims->KVH), kvh = (int)(task % dims->KVH);
                    const loom_attn_dims *d = &x.d;
                    for (int g = 0; g < x.G; g++) { /* once per task: delta, Qs, dO packed */
                        const int hh = kvh * x.G + g;
                        const int64_t oo = b * d->o_bs + (int64_t)hh * d->D;
                        const int64_t qo = b * d->q_bs + (int64_t)hh * d->D;
                        const int64_t go = (int64_t)g * d->Tq;
                        for (int i0 = 0; i0 < d->Tq; i0 += BQ)
                            ops->row_dot(x.delta_all + go + i0, dout + oo + i0 * d->o_ts,
                                         d->o_ts, out + oo + i0 * d->o_ts, d->o_ts,
                                         d->Tq - i0 < BQ ? d->Tq - i0 : BQ, d->D);
                        copy_scaled(x.qs_all + go * d->D, q + qo, d->q_ts, d->Tq, d->D,
                                    x.scale);
                        if (set) /* the group's dq rows: this task alone adds to them */
                            for (int t = 0; t < d->Tq; t++)
                                memset(dq + qo + t * d->q_ts, 0, (size_t)d->D * sizeof(float));
                        pack_rows(x.do_all + go * d->D, dout + oo, d->o_ts, d->Tq, d->D);
                    }
                    for (int jt = 0; jt < x.nkt; jt += KJ)
                        kv_tile_task(&x, b, kvh, jt, x.nkt - jt < KJ ? x.nkt - jt : KJ, 1);
                }
            } else {
                /* dK/dV by key tile, the earliest first (the most queries under a causal
                 * mask); then dQ by query tile, the last first */
#pragma omp for schedule(dynamic, 1)
                for (int64_t task = 0; task < nkv_task; task++)
                    kv_tile_task(&x, (int)(task / x.nkt / dims->KVH),
                                 (int)(task / x.nkt % dims->KVH), (int)(task % x.nkt), 1, 0);
#pragma omp for schedule(dynamic, 1)
                for (int64_t task = 0; task < nq_task; task++)
                    q_tile_task(&x, (int)(task / x.nqt / dims->H), (int)(task / x.nqt % dims->H),
                                x.nqt - 1 - (int)(task % x.nqt));
            }
        }
        free(buf);
    }
    return fail ? -3 : 0;
}

int flash_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                             const float *q, const float *k, const float *v, const float *out,
                             const float *lse, const loom_attn_dims *dims,
                             const loom_attn_mask *mask, int isa) {
    return backward(dq, dk, dv, dout, q, k, v, out, lse, dims, mask, isa, 0);
}

/* Each task zeroes (dq) or overwrites (dk, dv) the rows it owns: the zeroing pass a caller
 * would run first, done in parallel and just before the rows are used. */
int flash_attention_backward_set(float *dq, float *dk, float *dv, const float *dout,
                                 const float *q, const float *k, const float *v,
                                 const float *out, const float *lse, const loom_attn_dims *dims,
                                 const loom_attn_mask *mask, int isa) {
    return backward(dq, dk, dv, dout, q, k, v, out, lse, dims, mask, isa, 1);
}

#else /* one level of the portable tile operations (isa_variants.h) */

/* ---- portable C --------------------------------------------------------------------------- */

/* One row of C at a time, in chunks of 64 columns accumulated in a local array (no aliasing
 * with a or b, so the compiler keeps it in vector registers). */
FLASH_UNUSED static void LOOM_KV(gemm_c)(float *c, int64_t ldc, const float *a, int64_t as, int64_t ak,
                   const float *b, int64_t ldb, int M, int N, int K, int acc) {
    enum { CB = 64 };
    for (int r = 0; r < M; r++) {
        const float *ar = a + r * as;
        for (int n0 = 0; n0 < N; n0 += CB) {
            float *cr = c + r * ldc + n0;
            float cl[CB];
            if (N - n0 >= CB) {
                for (int x = 0; x < CB; x++) cl[x] = acc ? cr[x] : 0.0f;
                for (int k = 0; k < K; k++) {
                    const float av = ar[k * ak], *bk = b + k * ldb + n0;
                    for (int x = 0; x < CB; x++) cl[x] += av * bk[x];
                }
                for (int x = 0; x < CB; x++) cr[x] = cl[x];
            } else {
                const int nn = N - n0;
                for (int x = 0; x < nn; x++) cl[x] = acc ? cr[x] : 0.0f;
                for (int k = 0; k < K; k++) {
                    const float av = ar[k * ak], *bk = b + k * ldb + n0;
                    for (int x = 0; x < nn; x++) cl[x] += av * bk[x];
                }
                for (int x = 0; x < nn; x++) cr[x] = cl[x];
            }
        }
    }
}

FLASH_UNUSED static void LOOM_KV(softmax_c)(float *st, int n, int m, float *mrow, float *lrow, float *alpha) {
    float mnew[BQ], muse[BQ], sum[BQ];
    for (int i = 0; i < m; i++) {
        mnew[i] = mrow[i];
        sum[i] = 0.0f;
    }
    for (int j = 0; j < n; j++) {
        const float *sj = st + (int64_t)j * BQ;
        for (int i = 0; i < m; i++) mnew[i] = sj[i] > mnew[i] ? sj[i] : mnew[i];
    }
    /* a column with nothing visible yet keeps m = -inf; exp(-inf - 0) = 0 keeps P at 0 */
    for (int i = 0; i < m; i++) muse[i] = mnew[i] == -INFINITY ? 0.0f : mnew[i];
    for (int j = 0; j < n; j++) {
        float *sj = st + (int64_t)j * BQ;
        for (int i = 0; i < m; i++) {
            float e = loom_expf(sj[i] - muse[i]);
            sj[i] = e;
            sum[i] += e;
        }
    }
    for (int i = 0; i < m; i++) {
        alpha[i] = loom_expf(mrow[i] - muse[i]);
        lrow[i] = lrow[i] * alpha[i] + sum[i];
        mrow[i] = mnew[i];
    }
}

FLASH_UNUSED static void LOOM_KV(bwd_tile_c)(float *s, float *dp, int m, int n, const float *lse,
                       const float *delta) {
    for (int r = 0; r < m; r++) {
        float *sr = s + (int64_t)r * BK, *dr = dp + (int64_t)r * BK;
        const float l = lse_base(lse[r]), dl = delta[r];
        for (int j = 0; j < n; j++) {
            float p = loom_expf(sr[j] - l);
            sr[j] = p;
            dr[j] = p * (dr[j] - dl);
        }
    }
}

FLASH_UNUSED static void LOOM_KV(bwd_tile_t_c)(float *st, float *dpt, int n, int m, const float *lse,
                         const float *delta) {
    float l[BQ];
    for (int i = 0; i < m; i++) l[i] = lse_base(lse[i]);
    for (int j = 0; j < n; j++) {
        float *sj = st + (int64_t)j * BQ, *dj = dpt + (int64_t)j * BQ;
        for (int i = 0; i < m; i++) {
            float p = loom_expf(sj[i] - l[i]);
            sj[i] = p;
            dj[i] = p * (dj[i] - delta[i]);
        }
    }
}

FLASH_UNUSED static void LOOM_KV(row_dot_c)(float *delta, const float *a, int64_t ats, const float *b, int64_t bts,
                      int m, int D) {
    for (int r = 0; r < m; r++) {
        const float *ar = a + r * ats, *br = b + r * bts;
        float part[8] = {0};
        int x = 0;
        for (; x + 8 <= D; x += 8)
            for (int u = 0; u < 8; u++) part[u] += ar[x + u] * br[x + u];
        for (; x < D; x++) part[0] += ar[x] * br[x];
        delta[r] = ((part[0] + part[1]) + (part[2] + part[3])) +
                   ((part[4] + part[5]) + (part[6] + part[7]));
    }
}

#endif /* LOOM_KV */
