/* The CUDA backend's MoE and LoRA ops (include/loom/backend.h "MoE", "LoRA"), the twins of
 * src/kernels/moe.c and src/kernels/lora_ops.c (cu_common.cuh: the dialect; docs/gpu.md
 * "MoE and LoRA ops").
 *
 * Every result repeats run to run: no float atomics, fixed reduction trees, and the sums the
 * cpu makes in index order made in index order here too (the softmax's sum, the router
 * backward's sum over experts, the per-expert probability sums, the combines' sums over
 * choices, LoRA's merge over r), with no product contracted into an FMA (mul_rn). So most
 * outputs are the cpu's bit for bit; the exceptions are the device's exp / log / expf (the
 * routing softmax, the shared gate's sigmoid) and the dot products in double, reduced by a
 * tree instead of in index order (then rounded to float: equal but in rare last-bit cases).
 * The routing ints (e, pos, cnt) are the cpu's exactly given the same probabilities: top-k
 * is a comparison, capacity and numbering are counts.
 *
 * Shapes as backend.h: N tokens, E experts, K choices per token, C = d_model, G tokens per
 * routing group (ng = ceil(N / G) groups). */
#include "cu_common.cuh"

#include <pthread.h>

extern "C" {
#include "loom/base.h"
}

namespace LOOM_CU_NS {

static const loom_backend *g_be; /* this table: its memory ops, for the scratch below */

/* ---- scratch ------------------------------------------------------------------------------
 * moe_route and moe_router_backward keep per-group, per-expert counts between their kernels
 * (ng x E ints). One device buffer, grown when a call needs more, kept for the process: the
 * ops run on the backend's one stream, so a call's kernels finish before the next call's
 * start, and the growth's mem_free (cudaFree) waits for the device. */
static pthread_mutex_t g_scr_lock = PTHREAD_MUTEX_INITIALIZER;
static void *g_scr;
static size_t g_scr_bytes;

static void *scratch(size_t bytes) {
    pthread_mutex_lock(&g_scr_lock);
    if (bytes > g_scr_bytes) {
        const size_t n = bytes > 2 * g_scr_bytes ? bytes : 2 * g_scr_bytes;
        g_be->mem_free(g_scr);
        g_scr = g_be->mem_alloc(n, 0);
        g_scr_bytes = n;
    }
    void *p = g_scr;
    pthread_mutex_unlock(&g_scr_lock);
    return p;
}

static const unsigned FULL = 0xffffffffu;

/* a product nvcc may not contract with the sum that follows into an FMA: the cpu kernels are
 * compiled without FMA (src/kernels/moe.c), so with these the device's row arithmetic is
 * theirs bit for bit (the emulator's host compiler targets x86-64 without FMA: a plain
 * product is never contracted there) */
static __device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
static __device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

/* the sum of the lanes' v in lane order, ((s + v_0) + v_1) + ... over lanes < n, returned to
 * every lane: the order of a sequential loop (all lanes call it; n is warp-uniform) */
static __device__ double ordered_warp_add(double s, double v, int n) {
    for (int l = 0; l < n; l++) s += __shfl_sync(FULL, v, l);
    return s;
}

/* ---- ranking equal keys across a block ----------------------------------------------------
 * The capacity rule and the expert-major numbering are the same question: for an item of a
 * sequence (one per thread of the block, in thread order, tile after tile), how many earlier
 * items have its key (its expert)? rank_tile answers it for one tile: `key` is the calling
 * thread's expert, -1 for none; run[E] holds each key's count over the earlier tiles (and
 * gets this tile's added); wc (nw x E, nw = warps) is scratch whose entries carry the tile's
 * stamp (stamp << 6 | count), so nothing is cleared between tiles (stamp 0 = never written:
 * the caller zeroes wc once; stamps go 1, 2, ... and fit in 26 bits, as a group has fewer
 * than 2^31 choices and a tile at least 32). Returns run[key] + the earlier items of
 * the tile with key (0 for key -1). Every thread of the block calls it (barriers). Each
 * lane compares its key with the warp's 32 (shuffles); the first lane of a key in its warp
 * publishes the warp's count; the first item of a key in the tile adds the tile's total. */
static __device__ int rank_tile(int key, int *run, unsigned *wc, unsigned stamp, int E) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int below = 0, same = 0;
    for (int l = 0; l < 32; l++) {
        const int k = __shfl_sync(FULL, key, l);
        if (k == key) {
            same++;
            below += l < lane;
        }
    }
    if (key >= 0 && below == 0) wc[w * E + key] = (stamp << 6) | (unsigned)same;
    __syncthreads();
    int r = 0, tile_total = 0, first = 0;
    if (key >= 0) {
        int before = 0;
        for (int v = 0; v < nw; v++) {
            const unsigned c = wc[v * E + key];
            const int n = (c >> 6) == stamp ? (int)(c & 63u) : 0;
            before += v < w ? n : 0;
            tile_total += n;
        }
        r = run[key] + before + below;
        first = before == 0 && below == 0;
    }
    __syncthreads(); /* every run[key] read before it changes */
    if (first) run[key] += tile_total;
    __syncthreads();
    return r;
}

/* warps of the ranking kernels' blocks for E experts: up to 8, as many as fit (with E ints
 * of run and E doubles) in 48 KiB of shared memory; 0 when not even one does */
static int rank_warps(int E) {
    const int64_t per_warp = 4 * (int64_t)E, fixed = 12 * (int64_t)E, limit = 48 * 1024;
    int64_t nw = (limit - fixed) / per_warp;
    return (int)(nw > 8 ? 8 : nw < 0 ? 0 : nw);
}
static size_t rank_smem(int E, int nw) { return (size_t)E * (8 + 4 + 4 * (size_t)nw); }

/* ---- moe_route ------------------------------------------------------------------------ */

/* 1. per token (a warp each): softmax in double (the sum in expert order, as the cpu), lse,
 * p as float, then top-k. top-k without a taken set: choice j is the best (value, then
 * lower index) among the experts ordered strictly after choice j-1 in that order, which is
 * the cpu's "best not yet taken". A row with a NaN (a NaN or +-inf logit; all of p is NaN
 * then) takes experts 0..K-1, as the cpu's scan does when no comparison holds. */
static __global__ void k_route_softmax_topk(float *p, float *lse, int32_t *e, int64_t N, int E,
                                            int K) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= N) return; /* the whole warp */
    float *row = p + t * E;
    float mx = -INFINITY;
    for (int x = lane; x < E; x += 32) mx = fmaxf(mx, row[x]);
    mx = cu_warp_max(mx);
    double sum = 0.0;
    for (int c0 = 0; c0 < E; c0 += 32) {
        const int x = c0 + lane;
        const double v = x < E ? exp((double)row[x] - mx) : 0.0;
        sum = ordered_warp_add(sum, v, E - c0 < 32 ? E - c0 : 32);
    }
    const double ls = mx + log(sum);
    if (lane == 0) lse[t] = (float)ls;
    for (int x = lane; x < E; x += 32) row[x] = (float)exp((double)row[x] - ls);
    int32_t *et = e + t * K;
    if (ls != ls) {
        for (int j = lane; j < K; j += 32) et[j] = j;
        return;
    }
    float pv = INFINITY;
    int pi = -1;
    for (int j = 0; j < K; j++) {
        float bv = -1.0f; /* below every probability */
        int bi = 0x7fffffff;
        for (int x = lane; x < E; x += 32) {
            const float v = row[x]; /* this lane's own write */
            const int after = v < pv || (v == pv && x > pi);
            if (after && v > bv) bv = v, bi = x; /* x ascends: ties keep the lower */
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(FULL, bv, o);
            const int oi = __shfl_xor_sync(FULL, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) et[j] = bi;
        pv = bv, pi = bi;
    }
}

/* 2. capacity, a block per routing group: the group's assignments in the cpu's order (first
 * choices in token order, then second choices, ...) ranked per expert; kept (pos = 0 for
 * now) while the rank is below the capacity, else pos = -1. Writes the group's per-expert
 * assignments (ac) and kept rows (kc), and with stats its dropped count, balance term
 * (G * E * sum_e f_e P_e, bit for bit the cpu's) and sum of lse^2. */
static __global__ void k_route_capacity(int32_t *pos, const int32_t *e, const float *p,
                                        const float *lse, int32_t *kc, int32_t *ac,
                                        double *gst, int64_t N, int E, int K, int64_t G,
                                        float capacity_factor, int want_stats) {
    __shared__ double sh[32];
    CU_DYN_SMEM(double, term);
    int *run = (int *)(term + E);
    unsigned *wc = (unsigned *)(run + E);
    const int nw = blockDim.x >> 5;
    const int64_t g = blockIdx.x, g0 = g * G, g1 = g0 + G < N ? g0 + G : N, Gg = g1 - g0;
    const int64_t cap = capacity_factor > 0.0f
                            ? (int64_t)floor((double)capacity_factor * K * (double)Gg / E)
                            : INT64_MAX;
    for (int i = threadIdx.x; i < E; i += blockDim.x) run[i] = 0;
    for (int i = threadIdx.x; i < nw * E; i += blockDim.x) wc[i] = 0;
    __syncthreads();
    const int64_t L = Gg * K;
    int64_t dropped = 0;
    unsigned stamp = 1;
    for (int64_t o0 = 0; o0 < L; o0 += blockDim.x, stamp++) {
        const int64_t o = o0 + threadIdx.x;
        int64_t at = -1;
        int key = -1;
        if (o < L) {
            at = (g0 + o % Gg) * K + o / Gg; /* choice o / Gg of token g0 + o % Gg */
            key = e[at];
        }
        const int r = rank_tile(key, run, wc, stamp, E);
        if (key >= 0) {
            const int kept = r < cap;
            pos[at] = kept ? 0 : -1;
            dropped += !kept;
        }
    }
    for (int x = threadIdx.x; x < E; x += blockDim.x) {
        ac[g * E + x] = run[x];
        kc[g * E + x] = (int32_t)(run[x] < cap ? run[x] : cap);
    }
    if (!want_stats) return; /* uniform */
    double z = 0.0;
    for (int64_t t = g0 + threadIdx.x; t < g1; t += blockDim.x) z += (double)lse[t] * lse[t];
    z = cu_block_sum_d(z, sh);
    const double drop = cu_block_sum_d((double)dropped, sh);
    for (int x = threadIdx.x; x < E; x += blockDim.x) {
        double pm = 0.0;
        for (int64_t t = g0; t < g1; t++) pm += p[t * E + x];
        term[x] = (double)run[x] / (double)(Gg * K) * (pm / (double)Gg);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double aux = 0.0;
        for (int x = 0; x < E; x++) aux += term[x];
        gst[g * 3 + 0] = drop;
        gst[g * 3 + 1] = (double)Gg * E * aux;
        gst[g * 3 + 2] = z;
    }
}

/* 3. one block: cnt (each expert's kept rows over the groups), and kc turned in place into
 * each group's first row per expert (the expert's offset in the expert-major order plus the
 * kept rows of the groups before); the stats accumulated in group order */
static __global__ void k_route_offsets(int32_t *kc, const int32_t *ac, const double *gst,
                                       int32_t *cnt, double *stats, int64_t N, int E, int K,
                                       int64_t G, int64_t ng) {
    CU_DYN_SMEM(int64_t, off);
    for (int x = threadIdx.x; x < E; x += blockDim.x) {
        int64_t tot = 0, all = 0;
        for (int64_t g = 0; g < ng; g++) tot += kc[g * E + x], all += ac[g * E + x];
        cnt[x] = (int32_t)tot;
        off[x] = tot;
        if (stats) stats[x] += (double)all; /* integers: any order is exact */
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t at = 0;
        for (int x = 0; x < E; x++) {
            const int64_t c = off[x];
            off[x] = at;
            at += c;
        }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < E; x += blockDim.x) {
        int64_t r = off[x];
        for (int64_t g = 0; g < ng; g++) {
            const int32_t c = kc[g * E + x];
            kc[g * E + x] = (int32_t)r;
            r += c;
        }
    }
    /* dropped, assigned, balance, z, tokens: a thread each, groups in order */
    const int s = (int)threadIdx.x;
    if (stats && s < 5) {
        double acc = stats[E + s];
        for (int64_t g = 0; g < ng; g++) {
            const int64_t g0 = g * G, Gg = (g0 + G < N ? g0 + G : N) - g0;
            acc += s == 0 ? gst[g * 3] : s == 1 ? (double)(Gg * K) : s == 2 ? gst[g * 3 + 1]
                   : s == 3 ? gst[g * 3 + 2] : (double)Gg;
        }
        stats[E + s] = acc;
    }
}

/* 4. numbering, a block per group: each kept choice's row = its group's first row for the
 * expert + the kept choices of that expert at earlier tokens of the group (pos's memory
 * order is token order, and a token's choices are distinct experts) */
static __global__ void k_route_number(int32_t *pos, const int32_t *e, const int32_t *first,
                                      int64_t N, int E, int K, int64_t G) {
    CU_DYN_SMEM(double, term); /* capacity's layout; the doubles unused here */
    int *run = (int *)(term + E);
    unsigned *wc = (unsigned *)(run + E);
    const int nw = blockDim.x >> 5;
    const int64_t g = blockIdx.x, g0 = g * G, g1 = g0 + G < N ? g0 + G : N;
    for (int i = threadIdx.x; i < E; i += blockDim.x) run[i] = first[g * E + i];
    for (int i = threadIdx.x; i < nw * E; i += blockDim.x) wc[i] = 0;
    __syncthreads();
    const int64_t a0 = g0 * K, a1 = g1 * K;
    unsigned stamp = 1;
    for (int64_t o0 = a0; o0 < a1; o0 += blockDim.x, stamp++) {
        const int64_t at = o0 + threadIdx.x;
        const int key = at < a1 && pos[at] >= 0 ? e[at] : -1;
        const int r = rank_tile(key, run, wc, stamp, E);
        if (key >= 0) pos[at] = r;
    }
}

static __global__ void k_zero_i32(int32_t *x, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0;
}

static void check_moe(const char *op, int64_t N, int E, int K, int C) {
    if (N < 0 || E < 1 || K < 1 || K > E || C < 0)
        loom_panic(__FILE__, __LINE__,
                   "%s: bad shape N %lld, E %d, K %d, C %d (need N >= 0, 1 <= K <= E, C >= 0)",
                   op, (long long)N, E, K, C);
}

static void moe_route(float *p, float *lse, int32_t *e, int32_t *pos, int32_t *cnt,
                      double *stats, int64_t N, int E, int K, int64_t G,
                      float capacity_factor) {
    check_moe("moe_route", N, E, K, 0);
    if (G < 1)
        loom_panic(__FILE__, __LINE__, "moe_route: routing group of %lld tokens (need >= 1)",
                   (long long)G);
    const int nw = rank_warps(E);
    if (nw < 1)
        loom_panic(__FILE__, __LINE__, "moe_route: %d experts exceed the CUDA backend's "
                   "routing limit (the per-expert counts must fit in shared memory)", E);
    if (N == 0) {
        CU_LAUNCH(k_zero_i32, cu_blocks(E, 256), 256, 0, cnt, (int64_t)E);
        return;
    }
    const int64_t ng = (N + G - 1) / G;
    CU_LAUNCH(k_route_softmax_topk, cu_blocks(N, 8), 256, 0, p, lse, e, N, E, K);
    double *gst = (double *)scratch((size_t)ng * (3 * sizeof(double) + 2 * E * sizeof(int32_t)));
    int32_t *kc = (int32_t *)(gst + 3 * ng), *ac = kc + ng * E;
    CU_LAUNCH(k_route_capacity, (unsigned)ng, 32 * nw, rank_smem(E, nw), pos, e, p, lse, kc, ac,
              gst, N, E, K, G, capacity_factor, stats != NULL);
    CU_LAUNCH(k_route_offsets, 1, 256, (size_t)E * sizeof(int64_t), kc, ac, gst, cnt, stats, N,
              E, K, G, ng);
    CU_LAUNCH(k_route_number, (unsigned)ng, 32 * nw, rank_smem(E, nw), pos, e, kc, N, E, K, G);
}

/* ---- dispatch ----------------------------------------------------------------------------
 * gather: a block per choice copies its row in words of W bytes (the widest that divides the
 * row and both pointers' alignment) */
template <class W>
static __global__ void k_moe_gather(W *X, const W *x, const int32_t *pos, int K, int64_t words) {
    const int64_t a = blockIdx.x;
    const int32_t q = pos[a];
    if (q < 0) return;
    const W *src = x + (a / K) * words;
    W *dst = X + (int64_t)q * words;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}

static void moe_gather(void *X, const void *x, const int32_t *pos, int64_t N, int K,
                       size_t row_bytes) {
    if (N < 0 || K < 1)
        loom_panic(__FILE__, __LINE__, "moe_gather: bad shape N %lld, K %d", (long long)N, K);
    if (N == 0 || row_bytes == 0) return;
    const unsigned nb = (unsigned)(N * K);
    const uintptr_t al = (uintptr_t)X | (uintptr_t)x | (uintptr_t)row_bytes;
    if (al % 8 == 0)
        CU_LAUNCH(k_moe_gather<uint64_t>, nb, 128, 0, (uint64_t *)X, (const uint64_t *)x, pos, K,
                  (int64_t)(row_bytes / 8));
    else if (al % 4 == 0)
        CU_LAUNCH(k_moe_gather<uint32_t>, nb, 128, 0, (uint32_t *)X, (const uint32_t *)x, pos, K,
                  (int64_t)(row_bytes / 4));
    else if (al % 2 == 0)
        CU_LAUNCH(k_moe_gather<uint16_t>, nb, 128, 0, (uint16_t *)X, (const uint16_t *)x, pos, K,
                  (int64_t)(row_bytes / 2));
    else
        CU_LAUNCH(k_moe_gather<uint8_t>, nb, 128, 0, (uint8_t *)X, (const uint8_t *)x, pos, K,
                  (int64_t)row_bytes);
}

/* the sum of a token's K chosen probabilities, in choice order (float32, as the cpu) */
static __device__ float topk_sum(const float *pt, const int32_t *et, int K) {
    float S = 0.0f;
    for (int i = 0; i < K; i++) S += pt[et[i]];
    return S;
}

/* a token's gate weights and rows into shared memory (w[K], q[K]; 0 and -1 for a dropped
 * choice), by the first K threads; ends with a barrier */
static __device__ void load_choices(float *w, int32_t *q, const float *pt, const int32_t *et,
                                    const int32_t *qt, int K, int renorm) {
    if ((int)threadIdx.x < K) {
        const float S = renorm ? topk_sum(pt, et, K) : 1.0f;
        for (int j = threadIdx.x; j < K; j += blockDim.x) {
            q[j] = qt[j];
            w[j] = q[j] < 0 ? 0.0f : renorm ? pt[et[j]] / S : pt[et[j]];
        }
    }
    __syncthreads();
}

/* combine: a block per token, threads over channels, choices summed in order from 0 */
static __global__ void k_moe_combine(float *y, const float *YB, const float *p, const int32_t *e,
                                     const int32_t *pos, int E, int K, int C, int renorm) {
    CU_DYN_SMEM(float, w);
    int32_t *q = (int32_t *)(w + K);
    const int64_t t = blockIdx.x;
    load_choices(w, q, p + t * E, e + t * K, pos + t * K, K, renorm);
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j < K; j++)
            if (q[j] >= 0) a += mul_rn(w[j], YB[(int64_t)q[j] * C + i]);
        y[t * C + i] = a;
    }
}

static __global__ void k_moe_combine_bf16(uint16_t *y, const uint16_t *YB, const float *p,
                                          const int32_t *e, const int32_t *pos, int64_t N, int E,
                                          int K, int C, int renorm, const uint16_t *ys,
                                          const float *g, int S) {
    CU_DYN_SMEM(float, w);
    int32_t *q = (int32_t *)(w + K);
    const int64_t t = blockIdx.x;
    load_choices(w, q, p + t * E, e + t * K, pos + t * K, K, renorm);
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j < K; j++)
            if (q[j] >= 0) a += mul_rn(w[j], cu_bf16(YB[(int64_t)q[j] * C + i]));
        for (int s = 0; s < S; s++)
            a += mul_rn(g ? g[(int64_t)s * N + t] : 1.0f, cu_bf16(ys[((int64_t)s * N + t) * C + i]));
        y[t * C + i] = cu_round(a);
    }
}

static void moe_combine(float *y, const float *YB, const float *p, const int32_t *e,
                        const int32_t *pos, int64_t N, int E, int K, int C, int renorm) {
    check_moe("moe_combine", N, E, K, C);
    if (N == 0 || C == 0) return;
    CU_LAUNCH(k_moe_combine, (unsigned)N, 128, (size_t)K * 8, y, YB, p, e, pos, E, K, C, renorm);
}

static void bf16_moe_combine(uint16_t *y, const uint16_t *YB, const float *p, const int32_t *e,
                             const int32_t *pos, int64_t N, int E, int K, int C, int renorm,
                             const uint16_t *ys, const float *g, int S) {
    check_moe("bf16_moe_combine", N, E, K, C);
    if (S < 0 || (S > 0 && !ys))
        loom_panic(__FILE__, __LINE__, "bf16_moe_combine: %d shared experts with %s outputs", S,
                   ys ? "their" : "no");
    if (N == 0 || C == 0) return;
    CU_LAUNCH(k_moe_combine_bf16, (unsigned)N, 128, (size_t)K * 8, y, YB, p, e, pos, N, E, K, C,
              renorm, ys, g, S);
}

/* combine's backward: a block per choice; dYB row = w dy (set), dw = <dy, YB row> in double
 * (a fixed tree over the block; 0 for a dropped choice). T: float or bf16 rows of YB. */
static __device__ float load_el(const float *x, int64_t i) { return x[i]; }
static __device__ float load_el(const uint16_t *x, int64_t i) { return cu_bf16(x[i]); }

template <class T>
static __global__ void k_moe_combine_bwd(float *dYB, float *dw, const float *dy, const T *YB,
                                         const float *p, const int32_t *e, const int32_t *pos,
                                         int E, int K, int C, int renorm) {
    __shared__ double sh[32];
    const int64_t a = blockIdx.x, t = a / K;
    const int j = (int)(a % K);
    const int32_t q = pos[a];
    if (q < 0) {
        if (threadIdx.x == 0) dw[a] = 0.0f;
        return; /* the whole block */
    }
    const float *pt = p + t * E;
    const int32_t *et = e + t * K;
    const float w = renorm ? pt[et[j]] / topk_sum(pt, et, K) : pt[et[j]];
    const float *g = dy + t * C;
    float *d = dYB + (int64_t)q * C;
    double dot = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        d[i] = w * g[i];
        dot += (double)g[i] * load_el(YB, (int64_t)q * C + i);
    }
    dot = cu_block_sum_d(dot, sh);
    if (threadIdx.x == 0) dw[a] = (float)dot;
}

static void moe_combine_backward(float *dYB, float *dw, const float *dy, const float *YB,
                                 const float *p, const int32_t *e, const int32_t *pos, int64_t N,
                                 int E, int K, int C, int renorm) {
    check_moe("moe_combine_backward", N, E, K, C);
    if (N == 0) return;
    CU_LAUNCH(k_moe_combine_bwd<float>, (unsigned)(N * K), 128, 0, dYB, dw, dy, YB, p, e, pos, E,
              K, C, renorm);
}

static void bf16_moe_combine_backward(float *dYB, float *dw, const float *dy, const uint16_t *YB,
                                      const float *p, const int32_t *e, const int32_t *pos,
                                      int64_t N, int E, int K, int C, int renorm) {
    check_moe("bf16_moe_combine_backward", N, E, K, C);
    if (N == 0) return;
    CU_LAUNCH(k_moe_combine_bwd<uint16_t>, (unsigned)(N * K), 128, 0, dYB, dw, dy, YB, p, e, pos,
              E, K, C, renorm);
}

/* dispatch's backward: a block per token, each element's K rows added in choice order onto
 * dx (no atomics: a token's thread owns its element) */
static __global__ void k_moe_scatter_add(float *dx, const float *dXB, const int32_t *pos, int K,
                                         int C) {
    const int64_t t = blockIdx.x;
    const int32_t *qt = pos + t * K;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float a = dx[t * C + i];
        for (int j = 0; j < K; j++) {
            const int32_t q = qt[j];
            if (q >= 0) a += dXB[(int64_t)q * C + i];
        }
        dx[t * C + i] = a;
    }
}

static void moe_scatter_add(float *dx, const float *dXB, const int32_t *pos, int64_t N, int K,
                            int C) {
    check_moe("moe_scatter_add", N, K, K, C);
    if (N == 0 || C == 0) return;
    CU_LAUNCH(k_moe_scatter_add, (unsigned)N, 128, 0, dx, dXB, pos, K, C);
}

/* ---- the router's backward ---------------------------------------------------------------
 * 1. per group (a block), each expert's choices before capacity (shared-memory integer
 *    counts: exact, so the order of the atomic increments does not matter) */
static __global__ void k_router_counts(int32_t *fc, const int32_t *e, int64_t N, int E, int K,
                                       int64_t G) {
    CU_DYN_SMEM(int, h);
    const int64_t g = blockIdx.x, g0 = g * G, g1 = g0 + G < N ? g0 + G : N;
    for (int x = threadIdx.x; x < E; x += blockDim.x) h[x] = 0;
    __syncthreads();
    for (int64_t a = g0 * K + threadIdx.x; a < g1 * K; a += blockDim.x) atomicAdd(&h[e[a]], 1);
    __syncthreads();
    for (int x = threadIdx.x; x < E; x += blockDim.x) fc[g * E + x] = h[x];
}

/* dp of expert x of token t: the balance term plus its choice's gate gradient (renorm: through
 * w_j = p_j / S) */
static __device__ double router_dp(int x, double base, const int32_t *et, const int32_t *qt,
                                   const float *dwt, int K, int renorm, double S, double sw) {
    double d = base;
    for (int j = 0; j < K; j++) {
        if (et[j] != x) continue;
        if (renorm) d += ((qt[j] >= 0 ? dwt[j] : 0.0) - sw) / S;
        else if (qt[j] >= 0) d += dwt[j];
    }
    return d;
}

/* 2. per token (a warp each): dp, its softmax backward (sum over experts in order), z-loss */
static __global__ void k_router_bwd(float *dl, const float *p, const float *lse,
                                    const int32_t *e, const int32_t *pos, const float *dw,
                                    const int32_t *fc, int64_t N, int E, int K, int64_t G,
                                    double aux, double zc, int renorm) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= N) return; /* the whole warp */
    const int64_t g = t / G, g0 = g * G, Gg = (g0 + G < N ? g0 + G : N) - g0;
    const float *pt = p + t * E, *dwt = dw + t * K;
    const int32_t *et = e + t * K, *qt = pos + t * K, *ft = fc + g * E;
    double S = 0.0, sw = 0.0;
    if (renorm) {
        const float Sf = topk_sum(pt, et, K);
        for (int j = 0; j < K; j++) S += pt[et[j]];
        for (int j = 0; j < K; j++)
            if (qt[j] >= 0) sw += (double)dwt[j] * (pt[et[j]] / Sf);
    }
    const double denom = (double)(Gg * K);
    double sum = 0.0;
    for (int c0 = 0; c0 < E; c0 += 32) {
        const int x = c0 + lane;
        double v = 0.0;
        if (x < E) v = pt[x] * router_dp(x, aux * E * ((double)ft[x] / denom), et, qt, dwt, K,
                                         renorm, S, sw);
        sum = ordered_warp_add(sum, v, E - c0 < 32 ? E - c0 : 32);
    }
    const double zt = zc * 2.0 * lse[t];
    for (int x = lane; x < E; x += 32) {
        const double d = router_dp(x, aux * E * ((double)ft[x] / denom), et, qt, dwt, K, renorm,
                                   S, sw);
        dl[t * E + x] = (float)(mul_rn((double)pt[x], d - sum) + mul_rn(zt, (double)pt[x]));
    }
}

static void moe_router_backward(float *dl, const float *p, const float *lse, const int32_t *e,
                                const int32_t *pos, const float *dw, int64_t N, int E, int K,
                                int64_t G, double aux, double zc, int renorm) {
    check_moe("moe_router_backward", N, E, K, 0);
    if (G < 1)
        loom_panic(__FILE__, __LINE__,
                   "moe_router_backward: routing group of %lld tokens (need >= 1)", (long long)G);
    if ((size_t)E * 4 > 48 * 1024)
        loom_panic(__FILE__, __LINE__, "moe_router_backward: %d experts exceed the CUDA "
                   "backend's limit (the per-expert counts must fit in shared memory)", E);
    if (N == 0) return;
    const int64_t ng = (N + G - 1) / G;
    int32_t *fc = (int32_t *)scratch((size_t)ng * E * sizeof(int32_t));
    CU_LAUNCH(k_router_counts, (unsigned)ng, 256, (size_t)E * 4, fc, e, N, E, K, G);
    CU_LAUNCH(k_router_bwd, cu_blocks(N, 8), 256, 0, dl, p, lse, e, pos, dw, fc, N, E, K, G, aux,
              zc, renorm);
}

/* ---- the shared experts' gate ----------------------------------------------------------- */
static __global__ void k_moe_sigmoid(float *g, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = 1.0f / (1.0f + expf(-g[i]));
}
static void moe_sigmoid(float *g, int64_t n) {
    if (n > 0) CU_LAUNCH(k_moe_sigmoid, cu_blocks(n, 256), 256, 0, g, n);
}

/* rows x width elements: blockIdx.y (and its stride) over rows, x over the row */
static __global__ void k_moe_gate_add(float *y, const float *g, const float *ys, int64_t N,
                                      int C) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    for (int64_t t = blockIdx.y; t < N; t += gridDim.y) y[t * C + i] += mul_rn(g[t], ys[t * C + i]);
}
static unsigned rows_grid(int64_t rows) { return (unsigned)(rows < 65535 ? rows : 65535); }

static void moe_gate_add(float *y, const float *g, const float *ys, int64_t N, int C) {
    check_moe("moe_gate_add", N, 1, 1, C);
    if (N == 0 || C == 0) return;
    CU_LAUNCH(k_moe_gate_add, dim3(cu_blocks(C, 256), rows_grid(N)), 256, 0, y, g, ys, N, C);
}

/* a block per token: dys = g dy (set), dz = <dy, ys> g (1 - g) with the dot in double */
template <class T>
static __global__ void k_moe_gate_bwd(float *dys, float *dz, const float *dy, const float *g,
                                      const T *ys, int C) {
    __shared__ double sh[32];
    const int64_t t = blockIdx.x;
    const float gt = g[t];
    double dot = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        dys[t * C + i] = gt * dy[t * C + i];
        dot += (double)dy[t * C + i] * load_el(ys, t * C + i);
    }
    dot = cu_block_sum_d(dot, sh);
    if (threadIdx.x == 0) dz[t] = (float)(dot * gt * (1.0 - gt));
}

static void moe_gate_backward(float *dys, float *dz, const float *dy, const float *g,
                              const float *ys, int64_t N, int C) {
    check_moe("moe_gate_backward", N, 1, 1, C);
    if (N > 0) CU_LAUNCH(k_moe_gate_bwd<float>, (unsigned)N, 128, 0, dys, dz, dy, g, ys, C);
}
static void bf16_moe_gate_backward(float *dys, float *dz, const float *dy, const float *g,
                                   const uint16_t *ys, int64_t N, int C) {
    check_moe("bf16_moe_gate_backward", N, 1, 1, C);
    if (N > 0) CU_LAUNCH(k_moe_gate_bwd<uint16_t>, (unsigned)N, 128, 0, dys, dz, dy, g, ys, C);
}

/* ---- LoRA ------------------------------------------------------------------------------- */

static void check_rows(const char *op, int64_t width, int64_t rows) {
    if (width < 0 || rows < 0)
        loom_panic(__FILE__, __LINE__, "%s: bad shape %lld rows of %lld", op, (long long)rows,
                   (long long)width);
}

static __global__ void k_lora_add_scaled(float *dst, int64_t ds, const float *src, int64_t ss,
                                         int64_t width, int64_t rows, float a) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        dst[r * ds + j] += mul_rn(a, src[r * ss + j]);
}
static void lora_add_scaled(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                            int64_t width, int64_t rows, float a) {
    check_rows("lora_add_scaled", width, rows);
    if (width == 0 || rows == 0) return;
    CU_LAUNCH(k_lora_add_scaled, dim3(cu_blocks(width, 256), rows_grid(rows)), 256, 0, dst,
              dst_stride, src, src_stride, width, rows, a);
}

static __global__ void k_lora_add_scaled_bf16(uint16_t *dst, int64_t ds, const float *src,
                                              int64_t ss, int64_t width, int64_t rows, float a) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        dst[r * ds + j] = cu_round(cu_bf16(dst[r * ds + j]) + mul_rn(a, src[r * ss + j]));
}
static void lora_add_scaled_bf16(uint16_t *dst, int64_t dst_stride, const float *src,
                                 int64_t src_stride, int64_t width, int64_t rows, float a) {
    check_rows("lora_add_scaled_bf16", width, rows);
    if (width == 0 || rows == 0) return;
    CU_LAUNCH(k_lora_add_scaled_bf16, dim3(cu_blocks(width, 256), rows_grid(rows)), 256, 0, dst,
              dst_stride, src, src_stride, width, rows, a);
}

static __global__ void k_lora_scale_rows(float *dst, const float *src, int64_t ss, int64_t width,
                                         int64_t rows, float a) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) dst[r * width + j] = a * src[r * ss + j];
}
static void lora_scale_rows(float *dst, const float *src, int64_t src_stride, int64_t width,
                            int64_t rows, float a) {
    check_rows("lora_scale_rows", width, rows);
    if (width == 0 || rows == 0) return;
    CU_LAUNCH(k_lora_scale_rows, dim3(cu_blocks(width, 256), rows_grid(rows)), 256, 0, dst, src,
              src_stride, width, rows, a);
}

/* loom_rng_at (include/loom/base.h), the same arithmetic: splitmix64's finalizer of the key
 * xor the counter's Weyl step */
static __device__ uint64_t rng_at(uint64_t key, uint64_t counter) {
    uint64_t z = key ^ (counter * 0x9e3779b97f4a7c15ULL + 0x2545f4914f6cdd1dULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* element (i, j) keeps when its draw u = 24 bits of rng_at(key, c) >= p, c = ((row0 + i / T)
 * * Tg + pos) * in + j with pos the global position of t = i % T (two chunks at `split`) */
static __global__ void k_lora_dropout_fwd(float *xd, uint8_t *keep, const float *x, int64_t N,
                                          int64_t in, int T, int split, int64_t pos0,
                                          int64_t pos1, int64_t row0, int64_t Tg, uint64_t key,
                                          float p, float keep_scale) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= in) return;
    for (int64_t i = blockIdx.y; i < N; i += gridDim.y) {
        const int t = (int)(i % T);
        const int64_t row = row0 + i / T;
        const int64_t pos = t < split ? pos0 + t : pos1 + (t - split);
        const uint64_t c = (uint64_t)(row * Tg + pos) * (uint64_t)in + (uint64_t)j;
        const float u = (float)(rng_at(key, c) >> 40) * 0x1p-24f;
        const int k = u >= p;
        keep[i * in + j] = (uint8_t)k;
        xd[i * in + j] = k ? x[i * in + j] * keep_scale : 0.0f;
    }
}
static void lora_dropout_forward(float *xd, uint8_t *keep, const float *x, int64_t N, int64_t in,
                                 int T, int split, int64_t pos0, int64_t pos1, int64_t row0,
                                 int64_t Tg, uint64_t key, float p) {
    if (N < 0 || in < 0 || (N > 0 && T < 1) || !(p >= 0.0f && p < 1.0f))
        loom_panic(__FILE__, __LINE__, "lora_dropout_forward: bad arguments N %lld, in %lld, "
                   "T %d, p %g (need T >= 1, 0 <= p < 1)", (long long)N, (long long)in, T,
                   (double)p);
    if (N == 0 || in == 0) return;
    const float keep_scale = 1.0f / (1.0f - p); /* on the host: the cpu's division */
    CU_LAUNCH(k_lora_dropout_fwd, dim3(cu_blocks(in, 256), rows_grid(N)), 256, 0, xd, keep, x, N,
              in, T, split, pos0, pos1, row0, Tg, key, p, keep_scale);
}

static __global__ void k_lora_dropout_bwd(float *din, const float *dxd, const uint8_t *keep,
                                          int64_t n, float keep_scale) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && keep[i]) din[i] += mul_rn(dxd[i], keep_scale);
}
static void lora_dropout_backward(float *din, const float *dxd, const uint8_t *keep, int64_t n,
                                  float p) {
    if (n < 0 || !(p >= 0.0f && p < 1.0f))
        loom_panic(__FILE__, __LINE__, "lora_dropout_backward: bad arguments n %lld, p %g",
                   (long long)n, (double)p);
    if (n == 0) return;
    const float keep_scale = 1.0f / (1.0f - p);
    CU_LAUNCH(k_lora_dropout_bwd, cu_blocks(n, 256), 256, 0, din, dxd, keep, n, keep_scale);
}

/* W (out, in) += scale * (B (out, r) A (r, in)): a thread per element, the product over r in
 * double in order (each term is exact in double, so a fused multiply-add changes nothing) */
static __global__ void k_lora_merge(float *W, const float *A, const float *B, int64_t out,
                                    int64_t in, int r, float scale) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= in) return;
    for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
        double acc = 0.0;
        for (int k = 0; k < r; k++) acc += (double)B[o * r + k] * A[(int64_t)k * in + i];
        W[o * in + i] += mul_rn(scale, (float)acc);
    }
}
static void lora_merge(float *W, const float *A, const float *B, int64_t out, int64_t in, int r,
                       float scale) {
    if (out < 0 || in < 0 || r < 0)
        loom_panic(__FILE__, __LINE__, "lora_merge: bad shape out %lld, in %lld, rank %d",
                   (long long)out, (long long)in, r);
    if (out == 0 || in == 0) return;
    CU_LAUNCH(k_lora_merge, dim3(cu_blocks(in, 256), rows_grid(out)), 256, 0, W, A, B, out, in, r,
              scale);
}

void cu_fill_moe_lora(loom_backend *t) {
    g_be = t;
    t->moe_route = moe_route;
    t->moe_gather = moe_gather;
    t->moe_combine = moe_combine;
    t->moe_combine_backward = moe_combine_backward;
    t->moe_scatter_add = moe_scatter_add;
    t->moe_router_backward = moe_router_backward;
    t->moe_sigmoid = moe_sigmoid;
    t->moe_gate_add = moe_gate_add;
    t->moe_gate_backward = moe_gate_backward;
    t->bf16_moe_combine = bf16_moe_combine;
    t->bf16_moe_combine_backward = bf16_moe_combine_backward;
    t->bf16_moe_gate_backward = bf16_moe_gate_backward;
    t->lora_add_scaled = lora_add_scaled;
    t->lora_scale_rows = lora_scale_rows;
    t->lora_dropout_forward = lora_dropout_forward;
    t->lora_dropout_backward = lora_dropout_backward;
    t->lora_merge = lora_merge;
    t->lora_add_scaled_bf16 = lora_add_scaled_bf16;
}

} // namespace LOOM_CU_NS
