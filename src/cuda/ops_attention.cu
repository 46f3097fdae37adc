/* The CUDA backend's attention ops (cu_common.cuh: the dialect; docs/gpu.md "Attention ops").
 *
 * - sdpa (attention_forward / attention_backward, the materialized reference): the score and
 *   probability matrices (B,H,T,T) through cu_gemm, batched over b, one call per head; a
 *   softmax kernel and a softmax-backward kernel, one block per (b, h, query row).
 * - flash attention (fp32 and bf16 fused rows): FlashAttention-2's schedule on CUDA cores in
 *   fp32. Forward: one block per (b, h, query tile), each warp owning RQ query rows, its lanes
 *   the 32 keys of a key tile; K and V tiles through shared memory; online softmax (the row
 *   max by a warp reduction per tile, the denominator per lane, reduced once at the end).
 *   Backward, without atomics: pass 1, one block per (b, kv head, key tile) looping over the
 *   group's query heads and the visible query tiles, holds dK, dV in registers; pass 2, one
 *   block per (b, h, query tile) looping over the visible key tiles, holds dQ. Both recompute
 *   P = exp(s - lse) and dS = P (dP - delta), delta = rowsum(dO * O) recomputed per tile.
 *   Fixed summation orders everywhere: results repeat bit for bit run to run.
 * - attention_decode: one block per query head over the KV cache rows.
 *
 * Shared-memory tiles are rows of DS = 32 * DL floats (DL = ceil(D / 32) <= 8: D <= 256,
 * padded with zeros). A tile read with one row per lane (lane = key or query) is stored
 * swizzled: 16-byte quad q of row r at quad q ^ (r & 7), so 8 lanes reading the same quad of
 * 8 rows hit 8 different bank groups, and a lane still reads its row 4 floats at a time;
 * tiles read by all lanes of a warp at once (one row broadcast) are stored plainly. */
#include "cu_common.cuh"

extern "C" {
#include "loom/base.h"
}

namespace LOOM_CU_NS {

/* FA_BKF: keys per tile of the forward and the dQ pass (two per lane); FA_BQ1: queries per
 * tile of the dK/dV pass (one per lane) */
enum { FA_WARPS = 4, FA_THREADS = 128, FA_BKF = 64, FA_BQ1 = 32, FA_MAXD = 256 };

/* query rows per warp (forward, dq pass) and keys per warp (dk/dv pass) for DL = ceil(D/32) */
static constexpr int fa_rq(int DL) { return DL <= 2 ? 16 : DL == 4 ? 8 : 4; }
static constexpr int fa_rk(int DL) { return DL <= 4 ? 8 : 4; }

/* loops over a thread's register arrays, unrolled in full (nvcc stops at a size threshold
 * otherwise, and an array indexed in a loop left rolled lives in local memory) */
#ifdef LOOM_CUDA_EMU
#define FA_UNROLL
#else
#define FA_UNROLL _Pragma("unroll")
#endif

struct __align__(16) fa_f4 {
    float x, y, z, w;
};

/* element (r, x) of a swizzled tile row r: quad x/4 moved to quad (x/4) ^ (r % 8) */
static __device__ __forceinline__ int fa_swz(int r, int x) {
    return (((x >> 2) ^ (r & 7)) << 2) | (x & 3);
}
static __device__ __forceinline__ fa_f4 fa_ld4(const float *p) { return *(const fa_f4 *)p; }
static __device__ __forceinline__ float fa_dot4(fa_f4 a, fa_f4 b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

/* fp32 or bf16 element i of p, widened; stores rounded to the output's type */
static __device__ __forceinline__ float fa_ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float fa_ld(const uint16_t *p, int64_t i) {
    return cu_bf16(p[i]);
}
static __device__ __forceinline__ void fa_st(float *p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void fa_st(uint16_t *p, int64_t i, float v) {
    p[i] = cu_round(v);
}

static __device__ __forceinline__ int fa_warp_min(int v) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ int fa_warp_maxi(int v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* key at position kpos visible to the query at qpos (documents qd, kd: compared only with a
 * document mask): include/loom/backend.h loom_attn_mask */
static __device__ __forceinline__ bool fa_visible(const loom_attn_mask &mk, int64_t qpos,
                                                  int64_t kpos, int qd, int kd) {
    if (mk.causal) {
        const int64_t dd = qpos - kpos;
        if (dd < 0 || (mk.window > 0 && dd >= mk.window)) return false;
    }
    return mk.q_doc == NULL || qd == kd;
}

/* the softmax base of a row: its lse, +inf where it is -inf (nothing visible: P = 0) */
static __device__ __forceinline__ float fa_lse_base(float l) {
    return l == -INFINITY ? INFINITY : l;
}

/* The min and max document id of rows [0, n) of doc (n <= 32 * rows per lane), to every
 * lane of the warp: the same on every warp, so a tile skipped on it is skipped by the block. */
static __device__ __forceinline__ void fa_doc_range(const int32_t *doc, int n, int *lo, int *hi) {
    int a = INT32_MAX, z = INT32_MIN;
    for (int r = (int)(threadIdx.x & 31); r < n; r += 32) {
        const int v = doc[r];
        a = min(a, v);
        z = max(z, v);
    }
    *lo = fa_warp_min(a);
    *hi = fa_warp_maxi(z);
}

/* [lo, hi) of the key tiles (width bk) that a query block [i0, i0 + m) can see under the
 * causal mask and window (all of them without one) */
static __device__ __forceinline__ void fa_key_tiles(const loom_attn_mask &mk, int i0, int m,
                                                    int Tk, int bk, int *lo, int *hi) {
    const int nt = (Tk + bk - 1) / bk;
    *lo = 0;
    *hi = nt;
    if (!mk.causal) return;
    const int64_t jmax = mk.q_pos0 + i0 + m - 1 - mk.k_pos0; /* last key position seen */
    *hi = jmax < 0 ? 0 : (int)(jmax / bk + 1 < nt ? jmax / bk + 1 : nt);
    if (mk.window > 0) {
        const int64_t jmin = mk.q_pos0 + i0 - mk.window + 1 - mk.k_pos0;
        *lo = jmin <= 0 ? 0 : (int)(jmin / bk < nt ? jmin / bk : nt);
    }
}

/* [lo, hi) of the query tiles (width bq) that see some key of [j0, j0 + n) */
static __device__ __forceinline__ void fa_query_tiles(const loom_attn_mask &mk, int j0, int n,
                                                      int Tq, int bq, int *lo, int *hi) {
    const int nt = (Tq + bq - 1) / bq;
    *lo = 0;
    *hi = nt;
    if (!mk.causal) return;
    const int64_t imin = mk.k_pos0 + j0 - mk.q_pos0; /* first query position that sees one */
    *lo = imin <= 0 ? 0 : (int)(imin / bq < nt ? imin / bq : nt);
    if (mk.window > 0) {
        const int64_t imax = mk.k_pos0 + j0 + n - 1 + mk.window - 1 - mk.q_pos0;
        *hi = imax < 0 ? 0 : (int)(imax / bq + 1 < nt ? imax / bq + 1 : nt);
    }
}

/* ---- flash attention forward ------------------------------------------------------------ */

struct fa_fwd_args {
    const void *q, *k, *v; /* TI */
    void *out;             /* TO */
    float *lse;            /* (B,H,Tq) or NULL */
    loom_attn_dims d;
    loom_attn_mask mk;
    float scale;
    int nqt; /* query tiles per (b, h) */
};

/* one block per (b, h, query tile of FA_WARPS * RQ rows), key tiles of FA_BKF = 64 keys,
 * two per lane (keys lane and lane + 32: each Q load from shared memory feeds two FMAs);
 * shared: Q tile (scaled, plain), one K-then-V tile (K swizzled, V plain), each warp's P tile
 * (FA_BKF x RQ) */
template <typename TI, typename TO, int DL, int RQ>
__global__ void __launch_bounds__(FA_THREADS) k_fa_forward(fa_fwd_args a) {
    constexpr int DS = 32 * DL, BQ = FA_WARPS * RQ;
    CU_DYN_SMEM(float, sm);
    const int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5);
    float *qs = sm, *kv = qs + BQ * DS, *pw = kv + FA_BKF * DS + w * FA_BKF * RQ;
    const loom_attn_dims d = a.d;
    const loom_attn_mask mk = a.mk;
    const int D = d.D, D4 = (D + 3) & ~3;
    /* the last query tiles (the most keys under a causal mask) are launched first */
    const int it = a.nqt - 1 - (int)(blockIdx.x % (unsigned)a.nqt);
    const int bh = (int)(blockIdx.x / (unsigned)a.nqt);
    const int h = bh % d.H, b = bh / d.H, kvh = h / (d.H / d.KVH);
    const int i0 = it * BQ, m = min(d.Tq - i0, BQ);
    const TI *qb = (const TI *)a.q + b * d.q_bs + (int64_t)i0 * d.q_ts + (int64_t)h * D;
    const TI *kb = (const TI *)a.k + b * d.k_bs + (int64_t)kvh * D;
    const TI *vb = (const TI *)a.v + b * d.v_bs + (int64_t)kvh * D;
    for (int e = (int)threadIdx.x; e < BQ * DS; e += FA_THREADS) {
        const int r = e / DS, x = e % DS;
        qs[e] = r < m && x < D ? a.scale * fa_ld(qb, (int64_t)r * d.q_ts + x) : 0.0f;
    }
    const int32_t *qdoc = mk.q_doc ? mk.q_doc + b * mk.q_doc_bs + i0 : NULL;
    const int32_t *kdoc = mk.k_doc ? mk.k_doc + b * mk.k_doc_bs : NULL;
    int qd[RQ], qlo = 0, qhi = 0;
    for (int rr = 0; rr < RQ; rr++) {
        const int r = w * RQ + rr;
        qd[rr] = qdoc && r < m ? qdoc[r] : 0;
    }
    if (qdoc) fa_doc_range(qdoc, m, &qlo, &qhi);
    const float cap = mk.softcap, icap = cap > 0.0f ? 1.0f / cap : 0.0f;
    float acc[RQ][DL], mrow[RQ], lsum[RQ];
    for (int rr = 0; rr < RQ; rr++) {
        mrow[rr] = -INFINITY;
        lsum[rr] = 0.0f;
        for (int c = 0; c < DL; c++) acc[rr][c] = 0.0f;
    }
    int jlo, jhi;
    fa_key_tiles(mk, i0, m, d.Tk, FA_BKF, &jlo, &jhi);
    for (int jt = jlo; jt < jhi; jt++) {
        const int j0 = jt * FA_BKF, n = min(d.Tk - j0, (int)FA_BKF);
        int kd0 = 0, kd1 = 0; /* the documents of the lane's two keys */
        if (kdoc) {
            int klo, khi;
            fa_doc_range(kdoc + j0, n, &klo, &khi);
            if (khi < qlo || qhi < klo) continue; /* no document in common: skipped */
            kd0 = lane < n ? kdoc[j0 + lane] : 0;
            kd1 = lane + 32 < n ? kdoc[j0 + lane + 32] : 0;
        }
        __syncthreads(); /* the previous tile's V (and, first, nothing) is no longer read */
        for (int e = (int)threadIdx.x; e < FA_BKF * DS; e += FA_THREADS) {
            const int r = e / DS, x = e % DS;
            kv[r * DS + fa_swz(r, x)] =
                r < n && x < D ? fa_ld(kb, (int64_t)(j0 + r) * d.k_ts + x) : 0.0f;
        }
        __syncthreads();
        /* s0[rr], s1[rr] = (scale q_r) . k_j for the keys j0 + lane and j0 + lane + 32 */
        float s0[RQ], s1[RQ];
        for (int rr = 0; rr < RQ; rr++) s0[rr] = s1[rr] = 0.0f;
        const float *kr0 = kv + lane * DS, *kr1 = kv + (lane + 32) * DS;
        for (int x = 0; x < D4; x += 4) {
            const int sx = fa_swz(lane, x); /* (rows lane and lane + 32 swizzle alike) */
            const fa_f4 k0 = fa_ld4(kr0 + sx), k1 = fa_ld4(kr1 + sx);
            for (int rr = 0; rr < RQ; rr++) {
                const fa_f4 qq = fa_ld4(qs + (w * RQ + rr) * DS + x);
                s0[rr] = fa_dot4(qq, k0, s0[rr]);
                s1[rr] = fa_dot4(qq, k1, s1[rr]);
            }
        }
        const int64_t kpos = mk.k_pos0 + j0 + lane;
        FA_UNROLL
        for (int rr = 0; rr < RQ; rr++) {
            const int r = w * RQ + rr;
            const int64_t qpos = mk.q_pos0 + i0 + r;
            float v0 = s0[rr], v1 = s1[rr];
            if (cap > 0.0f) {
                v0 = cap * tanhf(v0 * icap);
                v1 = cap * tanhf(v1 * icap);
            }
            v0 = lane < n && r < m && fa_visible(mk, qpos, kpos, qd[rr], kd0) ? v0 : -INFINITY;
            v1 = lane + 32 < n && r < m && fa_visible(mk, qpos, kpos + 32, qd[rr], kd1)
                     ? v1 : -INFINITY;
            const float mn = fmaxf(mrow[rr], cu_warp_max(fmaxf(v0, v1)));
            const float mu = mn == -INFINITY ? 0.0f : mn; /* nothing visible yet: P stays 0 */
            const float p0 = expf(v0 - mu), p1 = expf(v1 - mu), al = expf(mrow[rr] - mu);
            lsum[rr] = lsum[rr] * al + (p0 + p1);
            mrow[rr] = mn;
            for (int c = 0; c < DL; c++) acc[rr][c] *= al;
            pw[lane * RQ + rr] = p0;
            pw[(lane + 32) * RQ + rr] = p1;
        }
        __syncthreads(); /* K is read by every warp (and each warp's P is visible to its lanes) */
        for (int e = (int)threadIdx.x; e < FA_BKF * DS; e += FA_THREADS) {
            const int r = e / DS, x = e % DS;
            kv[e] = r < n && x < D ? fa_ld(vb, (int64_t)(j0 + r) * d.v_ts + x) : 0.0f;
        }
        __syncthreads();
        /* acc[r][x] += sum_j p[r][j] v[j][x], lane = x (mod 32) */
        for (int jj = 0; jj < n; jj++) {
            float p[RQ];
            for (int rr = 0; rr < RQ; rr += 4) {
                const fa_f4 p4 = fa_ld4(pw + jj * RQ + rr);
                p[rr] = p4.x, p[rr + 1] = p4.y, p[rr + 2] = p4.z, p[rr + 3] = p4.w;
            }
            const float *vr = kv + jj * DS + lane;
            for (int c = 0; c < DL; c++) {
                const float vv = vr[32 * c];
                for (int rr = 0; rr < RQ; rr++) acc[rr][c] = fmaf(p[rr], vv, acc[rr][c]);
            }
        }
    }
    TO *ob = (TO *)a.out + b * d.o_bs + (int64_t)i0 * d.o_ts + (int64_t)h * D;
    for (int rr = 0; rr < RQ; rr++) {
        const int r = w * RQ + rr;
        const float l = cu_warp_sum(lsum[rr]);
        if (r >= m) continue;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int c = 0; c < DL; c++) {
            const int x = lane + 32 * c;
            if (x < D) fa_st(ob, (int64_t)r * d.o_ts + x, acc[rr][c] * inv);
        }
        if (lane == 0 && a.lse)
            a.lse[((int64_t)b * d.H + h) * d.Tq + i0 + r] =
                l > 0.0f ? mrow[rr] + logf(l) : -INFINITY;
    }
}

/* ---- flash attention backward ----------------------------------------------------------- */

struct fa_bwd_args {
    float *dq, *dk, *dv;
    const float *dout;
    const void *q, *k, *v, *out; /* TI */
    const float *lse;
    loom_attn_dims d;
    loom_attn_mask mk;
    float scale;
    int ntile; /* query tiles (dq pass) or key tiles (dk/dv pass) per (b, head) */
    int set;   /* 1: gradients overwritten, 0: accumulated */
};

/* dK, dV: one block per (b, kv head, key tile of FA_WARPS * RK keys), each warp owning RK
 * keys; the lanes are the 32 queries of a query tile. Shared: K, V (plain: a key row is read
 * by all lanes at once), the query tile's scale * Q and dO (swizzled: lane = query), each
 * warp's P and dS (FA_BQ1 x RK), the tile's lse and delta, delta's partial sums. */
template <typename TI, int DL, int RK>
__global__ void __launch_bounds__(FA_THREADS) k_fa_backward_dkv(fa_bwd_args a) {
    constexpr int DS = 32 * DL, BKB = FA_WARPS * RK;
    CU_DYN_SMEM(float, sm);
    const int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5);
    float *ks = sm, *vs = ks + BKB * DS, *qs = vs + BKB * DS, *dos = qs + FA_BQ1 * DS;
    float *pst = dos + FA_BQ1 * DS + w * 2 * FA_BQ1 * RK, *dst = pst + FA_BQ1 * RK;
    float *lse_s = dos + FA_BQ1 * DS + FA_WARPS * 2 * FA_BQ1 * RK, *delta_s = lse_s + FA_BQ1;
    float *dpart = delta_s + FA_BQ1;
    const loom_attn_dims d = a.d;
    const loom_attn_mask mk = a.mk;
    const int D = d.D, D4 = (D + 3) & ~3, G = d.H / d.KVH;
    const int jt = (int)(blockIdx.x % (unsigned)a.ntile);
    const int bk = (int)(blockIdx.x / (unsigned)a.ntile);
    const int kvh = bk % d.KVH, b = bk / d.KVH;
    const int j0 = jt * BKB, n = min(d.Tk - j0, BKB);
    const TI *kb = (const TI *)a.k + b * d.k_bs + (int64_t)j0 * d.k_ts + (int64_t)kvh * D;
    const TI *vb = (const TI *)a.v + b * d.v_bs + (int64_t)j0 * d.v_ts + (int64_t)kvh * D;
    for (int e = (int)threadIdx.x; e < BKB * DS; e += FA_THREADS) {
        const int r = e / DS, x = e % DS;
        const bool in = r < n && x < D;
        ks[e] = in ? fa_ld(kb, (int64_t)r * d.k_ts + x) : 0.0f;
        vs[e] = in ? fa_ld(vb, (int64_t)r * d.v_ts + x) : 0.0f;
    }
    const int32_t *qdoc = mk.q_doc ? mk.q_doc + b * mk.q_doc_bs : NULL;
    const int32_t *kdoc = mk.k_doc ? mk.k_doc + b * mk.k_doc_bs + j0 : NULL;
    int kd[RK], klo = 0, khi = 0;
    for (int rr = 0; rr < RK; rr++) {
        const int r = w * RK + rr;
        kd[rr] = kdoc && r < n ? kdoc[r] : 0;
    }
    if (kdoc) fa_doc_range(kdoc, n, &klo, &khi);
    const float cap = mk.softcap, icap = cap > 0.0f ? 1.0f / cap : 0.0f;
    float dka[RK][DL], dva[RK][DL];
    for (int rr = 0; rr < RK; rr++)
        for (int c = 0; c < DL; c++) dka[rr][c] = dva[rr][c] = 0.0f;
    int ilo, ihi;
    fa_query_tiles(mk, j0, n, d.Tq, FA_BQ1, &ilo, &ihi);
    for (int g = 0; g < G; g++) {
        const int h = kvh * G + g;
        const TI *qh = (const TI *)a.q + b * d.q_bs + (int64_t)h * D;
        const TI *oh = (const TI *)a.out + b * d.o_bs + (int64_t)h * D;
        const float *doh = a.dout + b * d.o_bs + (int64_t)h * D;
        const float *lh = a.lse + ((int64_t)b * d.H + h) * d.Tq;
        for (int it = ilo; it < ihi; it++) {
            const int i0 = it * FA_BQ1, mq = min(d.Tq - i0, (int)FA_BQ1), i = i0 + lane;
            int qd = 0;
            if (qdoc) {
                int qlo, qhi;
                fa_doc_range(qdoc + i0, mq, &qlo, &qhi);
                if (qhi < klo || khi < qlo) continue;
                qd = lane < mq ? qdoc[i] : 0;
            }
            __syncthreads(); /* the previous query tile is no longer read */
            for (int e = (int)threadIdx.x; e < FA_BQ1 * DS; e += FA_THREADS) {
                const int r = e / DS, x = e % DS, at = r * DS + fa_swz(r, x);
                const bool in = r < mq && x < D;
                qs[at] = in ? a.scale * fa_ld(qh, (int64_t)(i0 + r) * d.q_ts + x) : 0.0f;
                dos[at] = in ? doh[(int64_t)(i0 + r) * d.o_ts + x] : 0.0f;
            }
            { /* delta = rowsum(dO * O): 4 threads per query row, quarters added in order */
                const int r = (int)(threadIdx.x >> 2), u = (int)(threadIdx.x & 3);
                float s = 0.0f;
                if (r < mq)
                    for (int x = u; x < D; x += 4)
                        s = fmaf(doh[(int64_t)(i0 + r) * d.o_ts + x],
                                 fa_ld(oh, (int64_t)(i0 + r) * d.o_ts + x), s);
                dpart[threadIdx.x] = s;
            }
            __syncthreads();
            if (threadIdx.x < FA_BQ1) {
                const int r = (int)threadIdx.x;
                delta_s[r] =
                    (dpart[4 * r] + dpart[4 * r + 1]) + (dpart[4 * r + 2] + dpart[4 * r + 3]);
                lse_s[r] = r < mq ? fa_lse_base(lh[i0 + r]) : INFINITY;
            }
            __syncthreads();
            /* s[rr] = k_rr . (scale q_i), dp[rr] = v_rr . dO_i, lane = query i */
            float s[RK], dp[RK];
            for (int rr = 0; rr < RK; rr++) s[rr] = dp[rr] = 0.0f;
            const float *qr = qs + lane * DS, *dr = dos + lane * DS;
            for (int x = 0; x < D4; x += 4) {
                const int sx = fa_swz(lane, x);
                const fa_f4 qq = fa_ld4(qr + sx), oo = fa_ld4(dr + sx);
                for (int rr = 0; rr < RK; rr++) {
                    s[rr] = fa_dot4(fa_ld4(ks + (w * RK + rr) * DS + x), qq, s[rr]);
                    dp[rr] = fa_dot4(fa_ld4(vs + (w * RK + rr) * DS + x), oo, dp[rr]);
                }
            }
            const float li = lse_s[lane], de = delta_s[lane];
            const int64_t qpos = mk.q_pos0 + i;
            for (int rr = 0; rr < RK; rr++) {
                const int r = w * RK + rr;
                float sc = s[rr], gcap = 1.0f;
                if (cap > 0.0f) {
                    const float t = tanhf(sc * icap);
                    sc = cap * t;
                    gcap = 1.0f - t * t;
                }
                const bool vis =
                    lane < mq && r < n && fa_visible(mk, qpos, mk.k_pos0 + j0 + r, qd, kd[rr]);
                const float p = vis ? expf(sc - li) : 0.0f;
                pst[lane * RK + rr] = p;
                dst[lane * RK + rr] = p * (dp[rr] - de) * gcap;
            }
            __syncwarp();
            /* dV[rr] += sum_i P[i][rr] dO_i, dK[rr] += sum_i dS[i][rr] (scale q_i); lane = x */
            for (int ii = 0; ii < mq; ii++) {
                float p[RK], ds[RK];
                for (int rr = 0; rr < RK; rr += 4) {
                    const fa_f4 p4 = fa_ld4(pst + ii * RK + rr), d4 = fa_ld4(dst + ii * RK + rr);
                    p[rr] = p4.x, p[rr + 1] = p4.y, p[rr + 2] = p4.z, p[rr + 3] = p4.w;
                    ds[rr] = d4.x, ds[rr + 1] = d4.y, ds[rr + 2] = d4.z, ds[rr + 3] = d4.w;
                }
                for (int c = 0; c < DL; c++) {
                    const int at = ii * DS + fa_swz(ii, lane + 32 * c);
                    const float oo = dos[at], qq = qs[at];
                    for (int rr = 0; rr < RK; rr++) {
                        dva[rr][c] = fmaf(p[rr], oo, dva[rr][c]);
                        dka[rr][c] = fmaf(ds[rr], qq, dka[rr][c]);
                    }
                }
            }
        }
    }
    for (int rr = 0; rr < RK; rr++) {
        const int r = w * RK + rr;
        if (r >= n) continue;
        float *dkr =
            a.dk ? a.dk + b * d.k_bs + (int64_t)(j0 + r) * d.k_ts + (int64_t)kvh * D : NULL;
        float *dvr =
            a.dv ? a.dv + b * d.v_bs + (int64_t)(j0 + r) * d.v_ts + (int64_t)kvh * D : NULL;
        for (int c = 0; c < DL; c++) {
            const int x = lane + 32 * c;
            if (x >= D) continue;
            if (dkr) dkr[x] = a.set ? dka[rr][c] : dkr[x] + dka[rr][c];
            if (dvr) dvr[x] = a.set ? dva[rr][c] : dvr[x] + dva[rr][c];
        }
    }
}

/* dQ: one block per (b, h, query tile of FA_WARPS * RQ rows), each warp owning RQ query
 * rows; key tiles of FA_BKF = 64 keys, two per lane (keys lane and lane + 32). Shared: scale
 * * Q and dO (plain), one V-then-K tile (swizzled: lane = key; V for dP, then K for S and
 * dq), each warp's dS tile (FA_BKF x RQ). */
template <typename TI, int DL, int RQ>
__global__ void __launch_bounds__(FA_THREADS) k_fa_backward_dq(fa_bwd_args a) {
    constexpr int DS = 32 * DL, BQ = FA_WARPS * RQ;
    CU_DYN_SMEM(float, sm);
    const int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5);
    float *qs = sm, *dos = qs + BQ * DS, *kv = dos + BQ * DS;
    float *pw = kv + FA_BKF * DS + w * FA_BKF * RQ;
    const loom_attn_dims d = a.d;
    const loom_attn_mask mk = a.mk;
    const int D = d.D, D4 = (D + 3) & ~3;
    const int it = a.ntile - 1 - (int)(blockIdx.x % (unsigned)a.ntile); /* (heavy tiles first) */
    const int bh = (int)(blockIdx.x / (unsigned)a.ntile);
    const int h = bh % d.H, b = bh / d.H, kvh = h / (d.H / d.KVH);
    const int i0 = it * BQ, m = min(d.Tq - i0, BQ);
    const TI *qb = (const TI *)a.q + b * d.q_bs + (int64_t)i0 * d.q_ts + (int64_t)h * D;
    const TI *ob = (const TI *)a.out + b * d.o_bs + (int64_t)i0 * d.o_ts + (int64_t)h * D;
    const float *dob = a.dout + b * d.o_bs + (int64_t)i0 * d.o_ts + (int64_t)h * D;
    const TI *kb = (const TI *)a.k + b * d.k_bs + (int64_t)kvh * D;
    const TI *vb = (const TI *)a.v + b * d.v_bs + (int64_t)kvh * D;
    for (int e = (int)threadIdx.x; e < BQ * DS; e += FA_THREADS) {
        const int r = e / DS, x = e % DS;
        const bool in = r < m && x < D;
        qs[e] = in ? a.scale * fa_ld(qb, (int64_t)r * d.q_ts + x) : 0.0f;
        dos[e] = in ? dob[(int64_t)r * d.o_ts + x] : 0.0f;
    }
    const int32_t *qdoc = mk.q_doc ? mk.q_doc + b * mk.q_doc_bs + i0 : NULL;
    const int32_t *kdoc = mk.k_doc ? mk.k_doc + b * mk.k_doc_bs : NULL;
    int qd[RQ], qlo = 0, qhi = 0;
    float lrow[RQ], delta[RQ];
    const float *lb = a.lse ? a.lse + ((int64_t)b * d.H + h) * d.Tq + i0 : NULL;
    for (int rr = 0; rr < RQ; rr++) {
        const int r = w * RQ + rr;
        qd[rr] = qdoc && r < m ? qdoc[r] : 0;
        lrow[rr] = r < m && a.lse ? fa_lse_base(lb[r]) : INFINITY; /* (no lse: no keys) */
        float s = 0.0f; /* delta = rowsum(dO * O), lanes over x */
        if (r < m)
            for (int x = lane; x < D; x += 32)
                s = fmaf(dob[(int64_t)r * d.o_ts + x], fa_ld(ob, (int64_t)r * d.o_ts + x), s);
        delta[rr] = cu_warp_sum(s);
    }
    if (qdoc) fa_doc_range(qdoc, m, &qlo, &qhi);
    const float cap = mk.softcap, icap = cap > 0.0f ? 1.0f / cap : 0.0f;
    float dqa[RQ][DL];
    for (int rr = 0; rr < RQ; rr++)
        for (int c = 0; c < DL; c++) dqa[rr][c] = 0.0f;
    int jlo, jhi;
    fa_key_tiles(mk, i0, m, d.Tk, FA_BKF, &jlo, &jhi);
    for (int jt = jlo; jt < jhi; jt++) {
        const int j0 = jt * FA_BKF, n = min(d.Tk - j0, (int)FA_BKF);
        int kd0 = 0, kd1 = 0; /* the documents of the lane's two keys */
        if (kdoc) {
            int klo, khi;
            fa_doc_range(kdoc + j0, n, &klo, &khi);
            if (khi < qlo || qhi < klo) continue;
            kd0 = lane < n ? kdoc[j0 + lane] : 0;
            kd1 = lane + 32 < n ? kdoc[j0 + lane + 32] : 0;
        }
        __syncthreads(); /* the previous K and dS tiles (and, first, Q and dO) are done */
        for (int e = (int)threadIdx.x; e < FA_BKF * DS; e += FA_THREADS) {
            const int r = e / DS, x = e % DS;
            kv[r * DS + fa_swz(r, x)] =
                r < n && x < D ? fa_ld(vb, (int64_t)(j0 + r) * d.v_ts + x) : 0.0f;
        }
        __syncthreads();
        /* dp0[rr], dp1[rr] = dO_r . v_j for the keys j0 + lane and j0 + lane + 32 */
        float s0[RQ], s1[RQ], dp0[RQ], dp1[RQ];
        for (int rr = 0; rr < RQ; rr++) s0[rr] = s1[rr] = dp0[rr] = dp1[rr] = 0.0f;
        const float *r0 = kv + lane * DS, *r1 = kv + (lane + 32) * DS;
        for (int x = 0; x < D4; x += 4) {
            const int sx = fa_swz(lane, x); /* (rows lane and lane + 32 swizzle alike) */
            const fa_f4 v0 = fa_ld4(r0 + sx), v1 = fa_ld4(r1 + sx);
            for (int rr = 0; rr < RQ; rr++) {
                const fa_f4 oo = fa_ld4(dos + (w * RQ + rr) * DS + x);
                dp0[rr] = fa_dot4(oo, v0, dp0[rr]);
                dp1[rr] = fa_dot4(oo, v1, dp1[rr]);
            }
        }
        __syncthreads(); /* V is read by every warp */
        for (int e = (int)threadIdx.x; e < FA_BKF * DS; e += FA_THREADS) {
            const int r = e / DS, x = e % DS;
            kv[r * DS + fa_swz(r, x)] =
                r < n && x < D ? fa_ld(kb, (int64_t)(j0 + r) * d.k_ts + x) : 0.0f;
        }
        __syncthreads();
        for (int x = 0; x < D4; x += 4) {
            const int sx = fa_swz(lane, x);
            const fa_f4 k0 = fa_ld4(r0 + sx), k1 = fa_ld4(r1 + sx);
            for (int rr = 0; rr < RQ; rr++) {
                const fa_f4 qq = fa_ld4(qs + (w * RQ + rr) * DS + x);
                s0[rr] = fa_dot4(qq, k0, s0[rr]);
                s1[rr] = fa_dot4(qq, k1, s1[rr]);
            }
        }
        const int64_t kpos = mk.k_pos0 + j0 + lane;
        FA_UNROLL
        for (int rr = 0; rr < RQ; rr++) {
            const int r = w * RQ + rr;
            const int64_t qpos = mk.q_pos0 + i0 + r;
            float v0 = s0[rr], v1 = s1[rr], g0 = 1.0f, g1 = 1.0f;
            if (cap > 0.0f) {
                const float t0 = tanhf(v0 * icap), t1 = tanhf(v1 * icap);
                v0 = cap * t0, v1 = cap * t1;
                g0 = 1.0f - t0 * t0, g1 = 1.0f - t1 * t1;
            }
            const bool vis0 = lane < n && r < m && fa_visible(mk, qpos, kpos, qd[rr], kd0);
            const bool vis1 =
                lane + 32 < n && r < m && fa_visible(mk, qpos, kpos + 32, qd[rr], kd1);
            const float p0 = vis0 ? expf(v0 - lrow[rr]) : 0.0f;
            const float p1 = vis1 ? expf(v1 - lrow[rr]) : 0.0f;
            pw[lane * RQ + rr] = p0 * (dp0[rr] - delta[rr]) * g0;
            pw[(lane + 32) * RQ + rr] = p1 * (dp1[rr] - delta[rr]) * g1;
        }
        __syncwarp();
        /* dq[r][x] += sum_j dS[r][j] k_j[x], lane = x (mod 32) */
        for (int jj = 0; jj < n; jj++) {
            float ds[RQ];
            for (int rr = 0; rr < RQ; rr += 4) {
                const fa_f4 d4 = fa_ld4(pw + jj * RQ + rr);
                ds[rr] = d4.x, ds[rr + 1] = d4.y, ds[rr + 2] = d4.z, ds[rr + 3] = d4.w;
            }
            for (int c = 0; c < DL; c++) {
                const float kk = kv[jj * DS + fa_swz(jj, lane + 32 * c)];
                for (int rr = 0; rr < RQ; rr++) dqa[rr][c] = fmaf(ds[rr], kk, dqa[rr][c]);
            }
        }
    }
    float *dqb = a.dq + b * d.q_bs + (int64_t)i0 * d.q_ts + (int64_t)h * D;
    for (int rr = 0; rr < RQ; rr++) {
        const int r = w * RQ + rr;
        if (r >= m) continue;
        for (int c = 0; c < DL; c++) {
            const int x = lane + 32 * c;
            if (x >= D) continue;
            float *p = dqb + (int64_t)r * d.q_ts + x;
            const float g = a.scale * dqa[rr][c];
            *p = a.set ? g : *p + g;
        }
    }
}

/* ---- host side of flash attention -------------------------------------------------------- */

/* kernels with more than 48 KiB of dynamic shared memory say so first (the GPU's opt-in) */
#ifdef LOOM_CUDA_EMU
#define FA_SMEM_OPTIN(kern, bytes) ((void)0)
#else
static void fa_smem_optin(const void *kern, size_t bytes) {
    if (bytes > (size_t)48 * 1024)
        CU_CHECK(
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
#define FA_SMEM_OPTIN(kern, bytes) fa_smem_optin((const void *)(kern), (bytes))
#endif

/* the cpu kernel's argument checks (src/kernels/flash_attention.c): -1 when they fail */
static int fa_check(const loom_attn_dims *d, const loom_attn_mask *mk) {
    return loom_attn_check(d, mk);
}
static float fa_scale(const loom_attn_mask *mk, int D) {
    return mk->scale > 0.0f ? mk->scale : 1.0f / sqrtf((float)D);
}
/* 32-float chunks per head row: 1, 2, 4, 8 (D <= 256), 0 when D is larger */
static int fa_dl(int D) { return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : D <= FA_MAXD ? 8 : 0; }

/* a grid of nblk blocks in one launch (gridDim.x < 2^31), else an error naming the op */
static unsigned fa_grid(int64_t nblk, const char *op) {
    if (nblk > 2147483647)
        loom_panic(__FILE__, __LINE__, "cuda %s: %lld blocks, more than one launch takes", op,
                   (long long)nblk);
    return (unsigned)nblk;
}

template <typename TI, typename TO, int DL>
static void fa_forward_launch(fa_fwd_args a) {
    constexpr int RQ = fa_rq(DL), BQ = FA_WARPS * RQ, DS = 32 * DL;
    a.nqt = (a.d.Tq + BQ - 1) / BQ;
    const int64_t nblk = (int64_t)a.d.B * a.d.H * a.nqt;
    if (nblk == 0) return;
    const size_t smem =
        ((size_t)BQ * DS + (size_t)FA_BKF * DS + (size_t)FA_WARPS * FA_BKF * RQ) * 4;
    FA_SMEM_OPTIN((k_fa_forward<TI, TO, DL, RQ>), smem);
    CU_LAUNCH((k_fa_forward<TI, TO, DL, RQ>), fa_grid(nblk, "flash attention forward"),
              FA_THREADS, smem, a);
}

template <typename TI, int DL>
static void fa_backward_launch(fa_bwd_args a) {
    constexpr int RQ = fa_rq(DL), RK = fa_rk(DL), BQ = FA_WARPS * RQ, BKB = FA_WARPS * RK;
    constexpr int DS = 32 * DL;
    if (a.dk || a.dv) {
        fa_bwd_args x = a;
        x.ntile = (a.d.Tk + BKB - 1) / BKB;
        const int64_t nblk = (int64_t)a.d.B * a.d.KVH * x.ntile;
        const size_t smem = ((size_t)2 * BKB * DS + (size_t)2 * FA_BQ1 * DS +
                             (size_t)FA_WARPS * 2 * FA_BQ1 * RK + 2 * FA_BQ1 + FA_THREADS) * 4;
        if (nblk > 0) {
            FA_SMEM_OPTIN((k_fa_backward_dkv<TI, DL, RK>), smem);
            CU_LAUNCH((k_fa_backward_dkv<TI, DL, RK>), fa_grid(nblk, "flash attention backward"),
                      FA_THREADS, smem, x);
        }
    }
    if (a.dq) {
        fa_bwd_args x = a;
        x.ntile = (a.d.Tq + BQ - 1) / BQ;
        const int64_t nblk = (int64_t)a.d.B * a.d.H * x.ntile;
        const size_t smem = ((size_t)2 * BQ * DS + (size_t)FA_BKF * DS +
                             (size_t)FA_WARPS * FA_BKF * RQ) * 4;
        if (nblk > 0) {
            FA_SMEM_OPTIN((k_fa_backward_dq<TI, DL, RQ>), smem);
            CU_LAUNCH((k_fa_backward_dq<TI, DL, RQ>), fa_grid(nblk, "flash attention backward"),
                      FA_THREADS, smem, x);
        }
    }
}

template <typename TI, typename TO>
static void fa_forward_dl(const fa_fwd_args &a, int DL) {
    switch (DL) {
    case 1: fa_forward_launch<TI, TO, 1>(a); break;
    case 2: fa_forward_launch<TI, TO, 2>(a); break;
    case 4: fa_forward_launch<TI, TO, 4>(a); break;
    default: fa_forward_launch<TI, TO, 8>(a); break;
    }
}
template <typename TI>
static void fa_backward_launch_dl(fa_bwd_args a, int DL) {
    switch (DL) {
    case 1: fa_backward_launch<TI, 1>(a); break;
    case 2: fa_backward_launch<TI, 2>(a); break;
    case 4: fa_backward_launch<TI, 4>(a); break;
    default: fa_backward_launch<TI, 8>(a); break;
    }
}

/* out, lse = flash attention of q, k, v (TI each; out TO): the checks, then the kernel.
 * Returns 0, -1 (the cpu kernel's bad arguments) or -2 (D > 256: no kernel here). */
template <typename TI, typename TO>
static int fa_forward(TO *out, float *lse, const TI *q, const TI *k, const TI *v,
                      const loom_attn_dims *dims, const loom_attn_mask *mask) {
    if (fa_check(dims, mask)) return -1;
    const int DL = fa_dl(dims->D);
    if (!DL) return -2;
    cu_enter();
    fa_fwd_args a;
    a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse;
    a.d = *dims, a.mk = *mask, a.scale = fa_scale(mask, dims->D), a.nqt = 0;
    fa_forward_dl<TI, TO>(a, DL);
    return 0;
}

template <typename TI>
static int fa_backward(float *dq, float *dk, float *dv, const float *dout, const TI *q,
                       const TI *k, const TI *v, const TI *out, const float *lse,
                       const loom_attn_dims *dims, const loom_attn_mask *mask, int set) {
    if (fa_check(dims, mask)) return -1;
    const int DL = fa_dl(dims->D);
    if (!DL) return -2;
    if (!dq && !dk && !dv) return 0;
    /* (the cpu kernel reads lse whenever a key is visible; refused here instead) */
    if (!lse && dims->B > 0 && dims->Tq > 0 && dims->Tk > 0) return -1;
    cu_enter();
    fa_bwd_args a;
    a.dq = dq, a.dk = dk, a.dv = dv, a.dout = dout, a.q = q, a.k = k, a.v = v, a.out = out;
    a.lse = lse, a.d = *dims, a.mk = *mask, a.scale = fa_scale(mask, dims->D);
    a.ntile = 0, a.set = set;
    fa_backward_launch_dl<TI>(a, DL);
    return 0;
}

static int cu_flash_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, const loom_attn_dims *dims,
                            const loom_attn_mask *mask) {
    return fa_forward<float, float>(out, lse, q, k, v, dims, mask);
}
static int cu_flash_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             const loom_attn_dims *dims, const loom_attn_mask *mask) {
    return fa_backward<float>(dq, dk, dv, dout, q, k, v, out, lse, dims, mask, 0);
}
static int cu_flash_backward_set(float *dq, float *dk, float *dv, const float *dout,
                                 const float *q, const float *k, const float *v,
                                 const float *out, const float *lse, const loom_attn_dims *dims,
                                 const loom_attn_mask *mask) {
    return fa_backward<float>(dq, dk, dv, dout, q, k, v, out, lse, dims, mask, 1);
}

/* bf16 fused q|k|v rows: the kernels widen on load, so no workspace is needed (ws unused) */
static int64_t cu_bf16_flash_ws_floats(int B, int T, int H, int KVH, int D) {
    (void)B, (void)T, (void)H, (void)KVH, (void)D;
    return 0;
}
static int cu_bf16_flash_forward(uint16_t *out, float *lse, const uint16_t *qkv, float *ws,
                                 int B, int T, int H, int KVH, int D,
                                 const loom_attn_mask *mask) {
    (void)ws;
    const loom_attn_dims dims = flash_attention_dims_qkv(B, T, H, KVH, D);
    const int64_t HD = (int64_t)H * D, KD = (int64_t)KVH * D;
    return fa_forward<uint16_t, uint16_t>(out, lse, qkv, qkv + HD, qkv + HD + KD, &dims, mask);
}
static int cu_bf16_flash_backward(float *dqkv, const float *dout, const uint16_t *qkv,
                                  const uint16_t *out, const float *lse, float *ws, int B, int T,
                                  int H, int KVH, int D, const loom_attn_mask *mask) {
    (void)ws;
    const loom_attn_dims dims = flash_attention_dims_qkv(B, T, H, KVH, D);
    const int64_t HD = (int64_t)H * D, KD = (int64_t)KVH * D;
    return fa_backward<uint16_t>(dqkv, dqkv + HD, dqkv + HD + KD, dout, qkv, qkv + HD,
                                 qkv + HD + KD, out, lse, &dims, mask, 1);
}

/* ---- materialized attention (sdpa) ------------------------------------------------------- */

/* row (b, h, i) of att (B,H,T,T): softmax over the visible keys [lo, i] (soft-capped first),
 * zero elsewhere */
__global__ void k_sdpa_softmax(float *att, int T, int64_t window, float cap) {
    __shared__ float sh_max[32], sh_sum[32];
    const int64_t row = blockIdx.x;
    const int i = (int)(row % T);
    const int lo = window > 0 && i - window + 1 > 0 ? (int)(i - window + 1) : 0;
    float *s = att + row * T;
    float mx = -INFINITY;
    for (int j = lo + (int)threadIdx.x; j <= i; j += (int)blockDim.x) {
        float v = s[j];
        if (cap > 0.0f) s[j] = v = cap * tanhf(v / cap);
        mx = fmaxf(mx, v);
    }
    mx = cu_block_max(mx, sh_max);
    float sum = 0.0f;
    for (int j = lo + (int)threadIdx.x; j <= i; j += (int)blockDim.x) {
        const float e = expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    const float inv = 1.0f / cu_block_sum(sum, sh_sum);
    for (int j = (int)threadIdx.x; j < T; j += (int)blockDim.x)
        s[j] = j >= lo && j <= i ? s[j] * inv : 0.0f;
}

/* row (b, h, i) of ds: dS = P (dP - rowsum(dP * P)) on the visible keys (times the soft-cap's
 * derivative 1 - tanh^2 of the raw score, recomputed from q and k), zero elsewhere */
__global__ void k_sdpa_softmax_backward(float *ds, const float *att, const float *qkv, int T,
                                        int H, int KVH, int D, int64_t window, float cap,
                                        float scale) {
    __shared__ float sh[32];
    CU_DYN_SMEM(float, qrow);
    const int64_t row = blockIdx.x, R = (int64_t)(H + 2 * KVH) * D;
    const int i = (int)(row % T);
    const int64_t bh = row / T;
    const int h = (int)(bh % H), b = (int)(bh / H), kvh = h / (H / KVH);
    const int lo = window > 0 && i - window + 1 > 0 ? (int)(i - window + 1) : 0;
    float *dr = ds + row * T;
    const float *pr = att + row * T;
    const float *qi = qkv + ((int64_t)b * T + i) * R + (int64_t)h * D;
    const float *kh = qkv + (int64_t)b * T * R + (int64_t)(H + kvh) * D;
    if (cap > 0.0f)
        for (int x = (int)threadIdx.x; x < D; x += (int)blockDim.x) qrow[x] = qi[x];
    float dot = 0.0f;
    for (int j = lo + (int)threadIdx.x; j <= i; j += (int)blockDim.x) dot += dr[j] * pr[j];
    dot = cu_block_sum(dot, sh); /* (its barriers also publish qrow) */
    for (int j = (int)threadIdx.x; j < T; j += (int)blockDim.x) {
        if (j < lo || j > i) {
            dr[j] = 0.0f;
            continue;
        }
        float v = pr[j] * (dr[j] - dot);
        if (cap > 0.0f) {
            const float *kj = kh + (int64_t)j * R;
            float sc = 0.0f;
            for (int x = 0; x < D; x++) sc += qrow[x] * kj[x];
            const float t = tanhf(sc * scale / cap);
            v *= 1.0f - t * t;
        }
        dr[j] = v;
    }
}

static void cu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int H,
                                 int KVH, int D, const loom_attn_mask *mask) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    const int R = (H + 2 * KVH) * D, HD = H * D, G = H / KVH;
    const int64_t TR = (int64_t)T * R, TT = (int64_t)T * T, HTT = (int64_t)H * TT;
    const float scale = mask && mask->scale > 0.0f ? mask->scale : 1.0f / sqrtf((float)D);
    for (int h = 0; h < H; h++) { /* S (T,T) = scale Q_h K^T, row-major: K Q^T column-major */
        const float *qh = qkv + (int64_t)h * D, *kh = qkv + (int64_t)(H + h / G) * D;
        cu_gemm(1, 0, T, T, D, scale, kh, R, TR, qh, R, TR, 0.0f, att + h * TT, T, HTT, B,
                CU_F32, CU_F32, NULL, 0);
    }
    CU_LAUNCH(k_sdpa_softmax, fa_grid((int64_t)B * H * T, "attention_forward"), 128, 0, att, T,
              mask ? mask->window : (int64_t)0, mask ? mask->softcap : 0.0f);
    for (int h = 0; h < H; h++) { /* O_h (T,D) = P V: column-major V^T P^T */
        const float *vh = qkv + (int64_t)(H + KVH + h / G) * D;
        cu_gemm(0, 0, D, T, T, 1.0f, vh, R, TR, att + h * TT, T, HTT, 0.0f, out + (int64_t)h * D,
                HD, (int64_t)T * HD, B, CU_F32, CU_F32, NULL, 0);
    }
}

static void cu_attention_backward(float *dqkv, float *scratch, const float *dout,
                                  const float *qkv, const float *att, int B, int T, int H,
                                  int KVH, int D, const loom_attn_mask *mask) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    const int R = (H + 2 * KVH) * D, HD = H * D, G = H / KVH;
    const int64_t TR = (int64_t)T * R, TT = (int64_t)T * T, HTT = (int64_t)H * TT;
    const int64_t THD = (int64_t)T * HD;
    const float scale = mask && mask->scale > 0.0f ? mask->scale : 1.0f / sqrtf((float)D);
    for (int h = 0; h < H; h++) { /* dP (T,T) = dO_h V^T: column-major V dO^T */
        const float *vh = qkv + (int64_t)(H + KVH + h / G) * D;
        cu_gemm(1, 0, T, T, D, 1.0f, vh, R, TR, dout + (int64_t)h * D, HD, THD, 0.0f,
                scratch + h * TT, T, HTT, B, CU_F32, CU_F32, NULL, 0);
    }
    CU_LAUNCH(k_sdpa_softmax_backward, fa_grid((int64_t)B * H * T, "attention_backward"), 128,
              (size_t)D * 4, scratch, att, qkv, T, H, KVH, D, mask ? mask->window : (int64_t)0,
              mask ? mask->softcap : 0.0f, scale);
    /* in head order, so each kv head's dK, dV add their group's heads in order */
    for (int h = 0; h < H; h++) {
        const float *qh = qkv + (int64_t)h * D, *kh = qkv + (int64_t)(H + h / G) * D;
        const float *dsh = scratch + h * TT, *ph = att + h * TT, *doh = dout + (int64_t)h * D;
        float *dq = dqkv + (int64_t)h * D, *dk = dqkv + (int64_t)(H + h / G) * D;
        float *dv = dqkv + (int64_t)(H + KVH + h / G) * D;
        /* dQ (T,D) += scale dS K: column-major K^T dS^T */
        cu_gemm(0, 0, D, T, T, scale, kh, R, TR, dsh, T, HTT, 1.0f, dq, R, TR, B, CU_F32, CU_F32,
                NULL, 0);
        /* dK (T,D) += scale dS^T Q: column-major Q^T dS */
        cu_gemm(0, 1, D, T, T, scale, qh, R, TR, dsh, T, HTT, 1.0f, dk, R, TR, B, CU_F32, CU_F32,
                NULL, 0);
        /* dV (T,D) += P^T dO: column-major dO^T P */
        cu_gemm(0, 1, D, T, T, 1.0f, doh, HD, THD, ph, T, HTT, 1.0f, dv, R, TR, B, CU_F32,
                CU_F32, NULL, 0);
    }
}

/* ---- decode ------------------------------------------------------------------------------ */

enum { DEC_THREADS = 256 };

/* One block of 8 warps per query head h. Scores: a thread per cache row (its dot product over
 * D against the head's q in shared memory, 4 partial sums, 16-byte loads of the row when it is
 * aligned), so a block has 256 rows in flight; into the op's scratch. Softmax in place (block
 * max and sum, fixed order). Then each warp takes every 8th row, the lanes the elements of the
 * output, 4 rows in flight, and the warps' partial sums are added in warp order. */
__global__ void __launch_bounds__(DEC_THREADS)
k_attention_decode(float *out, const float *q, const float *kc, const float *vc, int n, int H,
                   int KVH, int D, float *scratch, float scale, float cap, int vec4) {
    __shared__ float sh_max[32], sh_sum[32];
    CU_DYN_SMEM(float, sm); /* q (D, padded to 4), then the warps' partial sums (8, D) */
    const int D4 = (D + 3) & ~3;
    float *qs = sm, *part = sm + D4;
    const int h = (int)blockIdx.x, kvh = h / (H / KVH), lane = (int)(threadIdx.x & 31);
    const int w = (int)(threadIdx.x >> 5), nw = (int)(blockDim.x >> 5);
    const int64_t row = (int64_t)KVH * D;
    float *s = scratch + (int64_t)h * n;
    for (int x = (int)threadIdx.x; x < D4; x += (int)blockDim.x)
        qs[x] = x < D ? q[(int64_t)h * D + x] : 0.0f;
    __syncthreads();
    for (int j = (int)threadIdx.x; j < n; j += (int)blockDim.x) {
        const float *k = kc + j * row + (int64_t)kvh * D;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        if (vec4) {
            for (int x = 0; x < D; x += 4) {
                const fa_f4 kk = fa_ld4(k + x), qq = fa_ld4(qs + x);
                a0 = fmaf(qq.x, kk.x, a0), a1 = fmaf(qq.y, kk.y, a1);
                a2 = fmaf(qq.z, kk.z, a2), a3 = fmaf(qq.w, kk.w, a3);
            }
        } else {
            int x = 0;
            for (; x + 4 <= D; x += 4) {
                a0 = fmaf(qs[x], k[x], a0), a1 = fmaf(qs[x + 1], k[x + 1], a1);
                a2 = fmaf(qs[x + 2], k[x + 2], a2), a3 = fmaf(qs[x + 3], k[x + 3], a3);
            }
            for (; x < D; x++) a0 = fmaf(qs[x], k[x], a0);
        }
        const float a = ((a0 + a1) + (a2 + a3)) * scale;
        s[j] = cap > 0.0f ? cap * tanhf(a / cap) : a;
    }
    float mx = -INFINITY; /* (each thread reads back the rows it wrote) */
    for (int j = (int)threadIdx.x; j < n; j += (int)blockDim.x) mx = fmaxf(mx, s[j]);
    mx = cu_block_max(mx, sh_max);
    float sum = 0.0f;
    for (int j = (int)threadIdx.x; j < n; j += (int)blockDim.x) {
        const float e = expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    const float inv = 1.0f / cu_block_sum(sum, sh_sum);
    for (int j = (int)threadIdx.x; j < n; j += (int)blockDim.x) s[j] *= inv;
    __syncthreads(); /* every probability is written before any warp reads them all */
    const float *vh = vc + (int64_t)kvh * D;
    for (int x = lane; x < D; x += 32) {
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        int j = w;
        for (; j + 3 * nw < n; j += 4 * nw) {
            a0 = fmaf(s[j], vh[j * row + x], a0);
            a1 = fmaf(s[j + nw], vh[(j + nw) * row + x], a1);
            a2 = fmaf(s[j + 2 * nw], vh[(j + 2 * nw) * row + x], a2);
            a3 = fmaf(s[j + 3 * nw], vh[(j + 3 * nw) * row + x], a3);
        }
        for (; j < n; j += nw) a0 = fmaf(s[j], vh[j * row + x], a0);
        part[w * D + x] = (a0 + a1) + (a2 + a3);
    }
    __syncthreads();
    for (int x = (int)threadIdx.x; x < D; x += (int)blockDim.x) {
        float a = part[x];
        for (int u = 1; u < nw; u++) a += part[u * D + x];
        out[(int64_t)h * D + x] = a;
    }
}

static void cu_attention_decode(float *out, const float *q, const float *kcache,
                                const float *vcache, int n, int H, int KVH, int D,
                                float *scratch, const loom_attn_mask *mask) {
    if (H <= 0 || D <= 0) return;
    const float scale = mask && mask->scale > 0.0f ? mask->scale : 1.0f / sqrtf((float)D);
    /* 16-byte loads of the cache rows where every row and head starts 16-byte aligned */
    const int vec4 = D % 4 == 0 && ((uintptr_t)kcache & 15) == 0;
    const size_t smem = ((size_t)((D + 3) & ~3) + (size_t)(DEC_THREADS / 32) * D) * 4;
    CU_LAUNCH(k_attention_decode, (unsigned)H, DEC_THREADS, smem, out, q, kcache, vcache, n, H,
              KVH, D, scratch, scale, mask ? mask->softcap : 0.0f, vec4);
}

void cu_fill_attention(loom_backend *t) {
    t->attention_forward = cu_attention_forward;
    t->attention_backward = cu_attention_backward;
    t->flash_attention_forward = cu_flash_forward;
    t->flash_attention_backward = cu_flash_backward;
    t->flash_attention_backward_set = cu_flash_backward_set;
    t->attention_decode = cu_attention_decode;
    t->bf16_flash_ws_floats = cu_bf16_flash_ws_floats;
    t->bf16_flash_attention_forward = cu_bf16_flash_forward;
    t->bf16_flash_attention_backward = cu_bf16_flash_backward;
}

} // namespace LOOM_CU_NS
