/* The CUDA backend's inference weight-format ops (cu_common.cuh: the dialect; docs/gpu.md
 * "Inference weight formats"): --weights bf16 | int8 | int4 and --compute bf16.
 *
 * The quantized blocks (Q8_0, Q4_K: GGUF's) are data on disk and in memory, so the quantizers
 * here are the cpu's scalar code (src/kernels/matmul_q8.c, matmul_q4k.c) operation for
 * operation: the same bytes. The two quantized products keep the cpu's contract too (its fp32
 * chains over the blocks in order, the same fixed tree at the end): the integer parts are
 * exact whatever the order, and each chain's multiplies and adds are done one at a time with
 * the round-to-nearest intrinsics (never contracted into an FMA), so the results are the
 * cpu's bits. matmul_bf16_forward and matmul_dotbf16_forward sum in their own orders (within
 * a tolerance of the cpu's, tests/gpu/test_cuda_infer.c).
 *
 *   matmul_bf16_forward   N <= 32: a warp per 4 outputs, 16 rows a pass, the rows' slice of
 *                         IC in shared memory, each weight row read once per pass with 16-byte
 *                         loads; N > 32: slices of the matrix widened into an fp32 scratch and
 *                         multiplied by cu_gemm (fp32, TF32 only when asked for).
 *   q8_quantize           a warp per block of 32
 *   matmul_q8_forward     a warp per output, 16 rows a pass; 4 blocks a step (128 bytes of the
 *                         row, lane 8 * b + l: bytes 4l..4l+3 of block b), 4 steps' weights
 *                         loaded ahead
 *   q4k_quantize          a thread block per Q4_K block: warp j fits sub-block j, lane c + 1 the
 *                         cpu's candidate c, the first best kept
 *   q8k_quantize          a warp per block of 256
 *   matmul_q4k_forward    a warp per output, 8 rows a pass, 4 blocks a step, 2 steps' weights
 *                         loaded ahead
 *   dotbf16 ops           plain row-major bf16, rows padded to a multiple of 8 elements (16
 *                         bytes: cuBLASLt's aligned kernels), zeros in the padding; the product
 *                         is cu_gemm (bf16 operands, fp32 out). */
#include "cu_common.cuh"

#include <pthread.h>

extern "C" {
#include "loom/base.h"
}

namespace LOOM_CU_NS {

/* loops over the rows a warp keeps in registers: unrolled on the GPU (g++ knows no such pragma) */
#ifdef LOOM_CUDA_EMU
#define KI_UNROLL
#else
#define KI_UNROLL _Pragma("unroll")
#endif

/* ---- exact arithmetic: one rounding per operation ----------------------------------------
 * nvcc contracts a * b + c into an FMA; the cpu's quantizers and chains are compiled with
 * -ffp-contract=off. These keep each operation apart on the GPU (the _rn intrinsics are never
 * contracted); the emulator's host build has no FMA instructions at its baseline level. */

/* x86-64 glibc's fmaxf / fminf, which the cpu's Q4_K quantizer calls (maxss / minss after a
 * NaN test): the non-NaN one; of two zeros the second argument. With the operand order the cpu
 * build passes them in (GCC 12 -O3 swaps fminf(lo, x[i]) into fminf(x[i], lo), as it may: the
 * two are the same but for signed zeros), the sign of a zero minimum, and so of a zero dmin,
 * is the cpu's: a block whose sub-blocks are all >= 0 has minimums of -0.0, dmin 0x8000.
 * tests/gpu/test_cuda_infer.c checks both cases. */
static __device__ __forceinline__ float cpu_fmaxf(float x, float y) {
    if (y != y) return x;
    if (x != x) return y;
    return x > y ? x : y;
}
static __device__ __forceinline__ float cpu_fminf(float x, float y) {
    if (y != y) return x;
    if (x != x) return y;
    return x < y ? x : y;
}
static __device__ __forceinline__ int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* include/loom/fp16.h's conversions, bit for bit */
static __device__ __forceinline__ uint16_t fp16_round(float f) {
    const uint32_t x = __float_as_uint(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) {
        const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - (112u << 23);
        return (uint16_t)(sign | (r >> 13));
    }
    const int e = (int)(ax >> 23);
    const int s = 126 - e;
    if (e == 0 || s > 24) return sign;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> s;
    const uint32_t rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}
static __device__ __forceinline__ float fp16_widen(uint16_t h) {
    const uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
    if ((h & 0x7c00u) == 0x7c00u)
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | mag);
    const float f = __fmul_rn(__uint_as_float(mag), 0x1p112f);
    return (h & 0x8000u) ? -f : f;
}

static __device__ __forceinline__ int warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* a 4-byte word at p (4-byte aligned) */
static __device__ __forceinline__ int ld32(const void *p) { return *(const int *)p; }

/* 16 bytes (16-byte aligned): 8 bf16 or 4 floats */
struct __align__(16) ki_w4 {
    uint32_t a, b, c, d;
};
struct __align__(16) ki_f4 {
    float a, b, c, d;
};

static void bad_input(const char *op, const char *what, long long v) {
    loom_panic(__FILE__, __LINE__, "cuda %s: %s (%lld)", op, what, v);
}
static void need_aligned(const char *op, const void *p, unsigned a) {
    if ((uintptr_t)p % a)
        loom_panic(__FILE__, __LINE__, "cuda %s: a pointer that is not %u-byte aligned (%p)", op,
                   a, p);
}

/* ---- matmul_bf16_forward: fp32 rows x bf16 weights widened exactly ------------------------ */

enum { BF_NR = 16, BF_OPW = 4, BF_WARPS = 4, BF_CH = 512 };

/* 8 weights of one 16-byte group widened (exactly) times 8 floats of x, added to a */
static __device__ __forceinline__ float bf_dot8(const ki_w4 &v, const float *x, float a) {
    const uint32_t u[4] = {v.a, v.b, v.c, v.d};
    const ki_f4 x0 = *(const ki_f4 *)x, x1 = *(const ki_f4 *)(x + 4);
    a = fmaf(__uint_as_float(u[0] << 16), x0.a, a);
    a = fmaf(__uint_as_float(u[0] & 0xffff0000u), x0.b, a);
    a = fmaf(__uint_as_float(u[1] << 16), x0.c, a);
    a = fmaf(__uint_as_float(u[1] & 0xffff0000u), x0.d, a);
    a = fmaf(__uint_as_float(u[2] << 16), x1.a, a);
    a = fmaf(__uint_as_float(u[2] & 0xffff0000u), x1.b, a);
    a = fmaf(__uint_as_float(u[3] << 16), x1.c, a);
    a = fmaf(__uint_as_float(u[3] & 0xffff0000u), x1.d, a);
    return a;
}

/* out rows [n0, n0 + nr) (n0 = blockIdx.y * BF_NR), outputs o = (blockIdx.x * BF_WARPS + warp)
 * * BF_OPW + r. Per slice [i0, i0 + BF_CH) of IC: the warp's weights of the slice are loaded
 * first (vec: IC a multiple of 8 and the matrix 16-byte aligned; lane: 8 consecutive weights
 * at 8 lane and 256 + 8 lane of each output, one 16-byte load each), then the rows' slice is
 * staged in shared memory (dynamic: nr rows), so the weights' latency overlaps the staging;
 * fp32 FMAs, then each output's warp sum. Without vec: a weight at a time (any IC, any
 * alignment). */
static __global__ void ki_matmul_bf16(float *out, const float *inp, const uint16_t *w,
                                      const float *bias, int64_t N, int IC, int OC, int vec) {
    CU_DYN_SMEM(float, xs); /* (nr, BF_CH) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o0 = (blockIdx.x * BF_WARPS + warp) * BF_OPW;
    const int64_t n0 = (int64_t)blockIdx.y * BF_NR;
    const int nr = N - n0 < BF_NR ? (int)(N - n0) : BF_NR;
    float acc[BF_OPW][BF_NR];
    for (int r = 0; r < BF_OPW; r++)
        for (int n = 0; n < BF_NR; n++) acc[r][n] = 0.0f;
    for (int i0 = 0; i0 < IC; i0 += BF_CH) {
        const int wid = IC - i0 < BF_CH ? IC - i0 : BF_CH;
        ki_w4 wv[BF_OPW][2];
        if (vec) {
            KI_UNROLL
            for (int r = 0; r < BF_OPW; r++)
                for (int h = 0; h < 2; h++) {
                    const int i = 8 * lane + 256 * h;
                    if (o0 + r < OC && i < wid)
                        wv[r][h] = *(const ki_w4 *)(w + (int64_t)(o0 + r) * IC + i0 + i);
                    else
                        wv[r][h].a = wv[r][h].b = wv[r][h].c = wv[r][h].d = 0;
                }
        }
        __syncthreads(); /* the previous slice is read */
        for (int k = threadIdx.x; k < nr * BF_CH; k += blockDim.x) {
            const int n = k / BF_CH, i = k % BF_CH;
            xs[k] = i < wid ? inp[(n0 + n) * IC + i0 + i] : 0.0f;
        }
        __syncthreads();
        KI_UNROLL
        for (int r = 0; r < BF_OPW; r++) {
            const int o = o0 + r;
            if (o >= OC) continue;
            if (vec) {
                for (int h = 0; h < 2; h++) {
                    const int i = 8 * lane + 256 * h;
                    if (i >= wid) continue;
                    KI_UNROLL
                    for (int n = 0; n < BF_NR; n++)
                        if (n < nr) acc[r][n] = bf_dot8(wv[r][h], xs + n * BF_CH + i, acc[r][n]);
                }
            } else {
                const uint16_t *wr = w + (int64_t)o * IC + i0;
                for (int i = lane; i < wid; i += 32) {
                    const float wf = cu_bf16(wr[i]);
                    KI_UNROLL
                    for (int n = 0; n < BF_NR; n++)
                        if (n < nr) acc[r][n] = fmaf(wf, xs[n * BF_CH + i], acc[r][n]);
                }
            }
        }
    }
    KI_UNROLL
    for (int r = 0; r < BF_OPW; r++) {
        const int o = o0 + r;
        KI_UNROLL
        for (int n = 0; n < BF_NR; n++)
            if (n < nr) { /* nr is the block's: every lane of the warp sums */
                const float s = cu_warp_sum(acc[r][n]);
                if (lane == 0 && o < OC) out[(n0 + n) * OC + o] = bias ? s + bias[o] : s;
            }
    }
}

/* n bf16 widened into fp32 (a slice of rows of the matrix, for the GEMM path) */
static __global__ void ki_widen_rows(float *dst, const uint16_t *src, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = cu_bf16(src[i]);
}

/* the large-N path's fp32 scratch: one per process, taken by one call at a time (a call's
 * widening and its GEMM are enqueued under the lock, so the next call's widening follows the
 * GEMM on the one stream); the emulator's is small, so that its tests cross slices */
#ifdef LOOM_CUDA_EMU
static const int64_t BF_SCRATCH = (int64_t)1 << 12;
#else
static const int64_t BF_SCRATCH = (int64_t)1 << 23; /* floats: 32 MiB */
#endif
static pthread_mutex_t g_bf_lock = PTHREAD_MUTEX_INITIALIZER;
static float *g_bf_scratch;
static int64_t g_bf_cap; /* its floats */

/* N above it: widen slices and cu_gemm (below: the warp kernel, ceil(N / 16) passes) */
enum { BF_GEMM_N = 32 };

static void matmul_bf16_fwd(float *out, const float *inp, const uint16_t *weight,
                            const float *bias, int64_t N, int IC, int OC) {
    if (IC < 0) bad_input("matmul_bf16_forward", "IC is negative", IC);
    if (N <= 0 || OC <= 0) return;
    if (N <= BF_GEMM_N) {
        const int vec = IC % 8 == 0 && (uintptr_t)weight % 16 == 0;
        dim3 grid(cu_blocks(OC, BF_WARPS * BF_OPW), cu_blocks(N, BF_NR));
        const int64_t rows = N < (int64_t)BF_NR ? N : (int64_t)BF_NR;
        const size_t smem = (size_t)rows * BF_CH * sizeof(float);
        CU_LAUNCH(ki_matmul_bf16, grid, 32 * BF_WARPS, smem, out, inp, weight, bias, N, IC, OC,
                  vec);
        return;
    }
    cu_enter();
    pthread_mutex_lock(&g_bf_lock);
    const int64_t cap = IC > BF_SCRATCH ? IC : BF_SCRATCH; /* at least one row */
    if (g_bf_cap < cap) {
        if (g_bf_scratch) {
            CU_CHECK(cudaStreamSynchronize(cu_stream())); /* no GEMM reads it any more */
            CU_CHECK(cudaFree(g_bf_scratch));
        }
        CU_CHECK(cudaMalloc((void **)&g_bf_scratch, (size_t)cap * sizeof(float)));
        g_bf_cap = cap;
    }
    const int rows = IC > 0 ? (int)(g_bf_cap / IC < OC ? g_bf_cap / IC : OC) : OC;
    for (int r0 = 0; r0 < OC; r0 += rows) {
        const int n = OC - r0 < rows ? OC - r0 : rows;
        const int64_t e = (int64_t)n * IC;
        if (e > 0)
            CU_LAUNCH(ki_widen_rows, cu_blocks(e, 256), 256, 0, g_bf_scratch,
                      weight + (int64_t)r0 * IC, e);
        cu_gemm(1, 0, n, (int)N, IC, 1.0f, g_bf_scratch, IC > 0 ? IC : 1, 0, inp, IC > 0 ? IC : 1,
                0, 0.0f, out + r0, OC, 0, 1, CU_F32, CU_F32, bias ? bias + r0 : NULL, 0);
    }
    pthread_mutex_unlock(&g_bf_lock);
}

/* ---- Q8_0 -------------------------------------------------------------------------------- */

/* block b (of 32 values) per warp: the cpu's q8_quantize_rows */
static __global__ void ki_q8_quantize(int8_t *q, uint16_t *d, const float *x, int64_t nblk) {
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= nblk) return; /* the whole warp */
    const float v = x[b * 32 + lane], a = fabsf(v);
    /* the cpu's max (a > amax ? a : amax from 0): a NaN never counts */
    const float amax = cu_warp_max(a > 0.0f ? a : 0.0f);
    const float s = __fdiv_rn(amax, 127.0f), id = s != 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
    if (lane == 0) d[b] = fp16_round(s);
    const float r = roundf(__fmul_rn(v, id)); /* in [-127, 127] but for inf / NaN rows */
    q[b * 32 + lane] = r >= -127.0f && r <= 127.0f ? (int8_t)r : (int8_t)0;
}

static __global__ void ki_q8_dequantize(float *x, const int8_t *q, const uint16_t *d, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn((float)q[i], fp16_widen(d[i >> 5]));
}

static void q8_quantize_(int8_t *q, uint16_t *d, const float *x, int64_t N, int IC) {
    if (IC < 0 || IC % LOOM_Q8_BLOCK) bad_input("q8_quantize", "IC is not a multiple of 32", IC);
    const int64_t nblk = N * (IC / LOOM_Q8_BLOCK);
    if (nblk > 0) CU_LAUNCH(ki_q8_quantize, cu_blocks(nblk, 8), 256, 0, q, d, x, nblk);
}
static void q8_dequantize_(float *x, const int8_t *q, const uint16_t *d, int64_t N, int IC) {
    if (IC < 0 || IC % LOOM_Q8_BLOCK) bad_input("q8_dequantize", "IC is not a multiple of 32", IC);
    const int64_t n = N * IC;
    if (n > 0) CU_LAUNCH(ki_q8_dequantize, cu_blocks(n, 256), 256, 0, x, q, d, n);
}

enum { Q8_NR = 16, Q8_U = 4, MM_WARPS = 4 };

/* output o per warp, rows [n0, n0 + nr): the cpu's 16 chains c[8 (b % 2) + l] += (float)s_bl *
 * (dw_b dx_b), kept by lanes l (even blocks) and 8 + l (odd). A step is 4 blocks, lane
 * 8 kk + l taking bytes 4l..4l+3 of block 4g + kk (128 contiguous bytes of the row); lanes
 * kk = 2, 3 hand their products to kk = 0, 1, which add them after their own (each chain's
 * blocks in order). The weights of Q8_U steps are loaded before any is used (512 bytes of the
 * row in flight per warp). Then the cpu's tree. */
static __global__ void ki_matmul_q8(float *out, const int8_t *xq, const uint16_t *xd,
                                    const int8_t *wq, const uint16_t *wd, const float *bias,
                                    int64_t N, int IC, int OC) {
    const int lane = threadIdx.x & 31, kk = lane >> 3, l = lane & 7;
    const int o = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (o >= OC) return; /* the whole warp */
    const int64_t n0 = (int64_t)blockIdx.y * Q8_NR;
    const int nr = N - n0 < Q8_NR ? (int)(N - n0) : Q8_NR;
    const int nb = IC / LOOM_Q8_BLOCK;
    const int8_t *w = wq + (int64_t)o * IC;
    float c[Q8_NR];
    for (int n = 0; n < Q8_NR; n++) c[n] = 0.0f;
    for (int g0 = 0; g0 < nb; g0 += 4 * Q8_U) {
        int ww[Q8_U];
        float dw[Q8_U];
        KI_UNROLL
        for (int u = 0; u < Q8_U; u++) {
            const int b = g0 + 4 * u + kk;
            ww[u] = b < nb ? ld32(w + b * 32 + 4 * l) : 0;
            dw[u] = b < nb ? fp16_widen(wd[(int64_t)o * nb + b]) : 0.0f;
        }
        KI_UNROLL
        for (int n = 0; n < Q8_NR; n++) {
            if (n >= nr) break; /* nr is the warp's: the shuffles below are reached by all */
            const int64_t row = n0 + n;
            int xw[Q8_U];
            float dx[Q8_U];
            KI_UNROLL
            for (int u = 0; u < Q8_U; u++) {
                const int b = g0 + 4 * u + kk;
                xw[u] = b < nb ? ld32(xq + row * IC + b * 32 + 4 * l) : 0;
                dx[u] = b < nb ? fp16_widen(xd[row * nb + b]) : 0.0f;
            }
            KI_UNROLL
            for (int u = 0; u < Q8_U; u++) {
                const int b = g0 + 4 * u + kk;
                const float p =
                    b < nb ? __fmul_rn((float)__dp4a(ww[u], xw[u], 0), __fmul_rn(dw[u], dx[u])) : 0.0f;
                const float p2 = __shfl_down_sync(0xffffffffu, p, 16);
                if (kk < 2) {
                    if (b < nb) c[n] = __fadd_rn(c[n], p);
                    if (b + 2 < nb) c[n] = __fadd_rn(c[n], p2);
                }
            }
        }
    }
    KI_UNROLL
    for (int n = 0; n < Q8_NR; n++) {
        if (n >= nr) break;
        /* lane l < 8: t_l = c_l + c_{8+l}, then (l, l+4), (l, l+2), (l, l+1) */
        float t = __fadd_rn(c[n], __shfl_down_sync(0xffffffffu, c[n], 8));
        t = __fadd_rn(t, __shfl_down_sync(0xffffffffu, t, 4));
        t = __fadd_rn(t, __shfl_down_sync(0xffffffffu, t, 2));
        t = __fadd_rn(t, __shfl_down_sync(0xffffffffu, t, 1));
        if (lane == 0) out[(n0 + n) * OC + o] = bias ? __fadd_rn(t, bias[o]) : t;
    }
}

/* rows per launch: the grid's y is at most 65,535 */
static const int64_t ROWS_PER_LAUNCH = (int64_t)65535 * 8;

static void matmul_q8_fwd(float *out, const int8_t *xq, const uint16_t *xd, const int8_t *wq,
                          const uint16_t *wd, const float *bias, int64_t N, int IC, int OC) {
    if (IC < 0 || IC % LOOM_Q8_BLOCK)
        bad_input("matmul_q8_forward", "IC is not a multiple of 32", IC);
    if (N <= 0 || OC <= 0) return;
    need_aligned("matmul_q8_forward", xq, 4);
    need_aligned("matmul_q8_forward", wq, 4);
    const int nb = IC / LOOM_Q8_BLOCK;
    for (int64_t r0 = 0; r0 < N; r0 += ROWS_PER_LAUNCH) {
        const int64_t n = N - r0 < ROWS_PER_LAUNCH ? N - r0 : ROWS_PER_LAUNCH;
        dim3 grid(cu_blocks(OC, MM_WARPS), cu_blocks(n, Q8_NR));
        CU_LAUNCH(ki_matmul_q8, grid, 32 * MM_WARPS, 0, out + r0 * OC, xq + r0 * IC,
                  xd + r0 * nb, wq, wd, bias, n, IC, OC);
    }
}

/* ---- Q4_K -------------------------------------------------------------------------------- */

enum { QK = LOOM_Q4K_BLOCK, QB = LOOM_Q4K_BYTES };

/* one Q4_K block per thread block of 256: the cpu's q4k_quantize_rows. Warp j fits sub-block j
 * (the cpu's sub_fit): lane c + 1 tries candidate c = -1..20, the lowest error wins, ties to
 * the lowest c (the cpu's first best). Then the block's scales, and thread t < 128 writes byte
 * t of the values (sub-block 2p's value i low, 2p + 1's high: t = 32p + i), threads 128..143
 * the 16 bytes before them. */
static __global__ void ki_q4k_quantize(uint8_t *dst, const float *x) {
    __shared__ float xs[QK], fs[8], fm[8];
    const int64_t blk = blockIdx.x;
    const int t = threadIdx.x, j = t >> 5, lane = t & 31;
    xs[t] = x[blk * QK + t];
    __syncthreads();
    const float *xb = xs + 32 * j;
    float lo = xb[0], hi = xb[0];
    for (int i = 1; i < 32; i++) lo = cpu_fminf(xb[i], lo), hi = cpu_fmaxf(xb[i], hi);
    if (lo > 0.0f) lo = 0.0f;
    double err = INFINITY;
    float scale = 0.0f, mn = 0.0f;
    if (hi > lo && lane <= 21) {
        const int c = lane - 1;
        const float inv = c < 0 ? __fdiv_rn(15.0f, __fsub_rn(hi, lo))
                                : __fdiv_rn(__fadd_rn(15.0f, __fmul_rn(0.1f, (float)(c - 10))), __fsub_rn(hi, lo));
        double sq = 0, sqq = 0, sx = 0, sxq = 0;
        for (int i = 0; i < 32; i++) {
            const int q = clampi((int)nearbyintf(__fmul_rn(inv, __fsub_rn(xb[i], lo))), 0, 15);
            sq = __dadd_rn(sq, (double)q);
            sqq = __dadd_rn(sqq, __dmul_rn((double)q, (double)q));
            sx = __dadd_rn(sx, (double)xb[i]);
            sxq = __dadd_rn(sxq, __dmul_rn((double)xb[i], (double)q));
        }
        const double det = __dsub_rn(__dmul_rn(32.0, sqq), __dmul_rn(sq, sq));
        if (det > 0) {
            double s = __ddiv_rn(__dsub_rn(__dmul_rn(32.0, sxq), __dmul_rn(sq, sx)), det);
            double b = __ddiv_rn(__dsub_rn(__dmul_rn(sqq, sx), __dmul_rn(sq, sxq)), det);
            if (b > 0) b = 0, s = __ddiv_rn(sxq, sqq);
            if (s > 0) {
                double e = 0;
                for (int i = 0; i < 32; i++) { /* the same q again */
                    const int q = clampi((int)nearbyintf(__fmul_rn(inv, __fsub_rn(xb[i], lo))), 0, 15);
                    const double r = __dsub_rn(__dadd_rn(__dmul_rn(s, (double)q), b), (double)xb[i]);
                    e = __dadd_rn(e, __dmul_rn(r, r));
                }
                if (e < INFINITY) err = e, scale = (float)s, mn = (float)-b;
            }
        }
    }
    /* the warp's best: the lowest (err, lane); err INFINITY where the candidate did not count */
    double be = err;
    int bl = lane;
    for (int o = 16; o > 0; o >>= 1) {
        const double oe = __shfl_xor_sync(0xffffffffu, be, o);
        const int ol = __shfl_xor_sync(0xffffffffu, bl, o);
        if (oe < be || (oe == be && ol < bl)) be = oe, bl = ol;
    }
    scale = __shfl_sync(0xffffffffu, scale, bl);
    mn = __shfl_sync(0xffffffffu, mn, bl);
    if (lane == 0) {
        if (be < INFINITY) fs[j] = scale, fm[j] = mn;
        else fs[j] = 0.0f, fm[j] = -lo; /* no candidate: q = 0, value -m */
    }
    __syncthreads();
    float smax = 0.0f, mmax = 0.0f;
    for (int k = 0; k < 8; k++) smax = cpu_fmaxf(smax, fs[k]), mmax = cpu_fmaxf(mmax, fm[k]);
    const uint16_t dh = fp16_round(__fdiv_rn(smax, 63.0f)), mh = fp16_round(__fdiv_rn(mmax, 63.0f));
    const float d = fp16_widen(dh), dm = fp16_widen(mh);
    const float id = d > 0.0f ? __fdiv_rn(1.0f, d) : 0.0f, idm = dm > 0.0f ? __fdiv_rn(1.0f, dm) : 0.0f;
    int sc[8], mc[8];
    for (int k = 0; k < 8; k++) {
        sc[k] = clampi((int)nearbyintf(__fmul_rn(fs[k], id)), 0, 63);
        mc[k] = clampi((int)nearbyintf(__fmul_rn(fm[k], idm)), 0, 63);
    }
    uint8_t *out = dst + blk * QB;
    if (t < 128) {
        const int p = t >> 5, i = t & 31;
        int byte = 0;
        for (int h = 0; h < 2; h++) {
            const int k = 2 * p + h;
            const float S = __fmul_rn(d, (float)sc[k]), M = __fmul_rn(dm, (float)mc[k]);
            const float inv = S > 0.0f ? __fdiv_rn(1.0f, S) : 0.0f;
            const int q = clampi((int)nearbyintf(__fmul_rn(__fadd_rn(xs[32 * k + i], M), inv)), 0, 15);
            byte |= q << (4 * h);
        }
        out[16 + t] = (uint8_t)byte;
    } else if (t < 144) {
        const int h = t - 128; /* header byte h: d, dmin (little-endian), then the scales */
        int v;
        if (h < 2) v = (dh >> (8 * h)) & 0xff;
        else if (h < 4) v = (mh >> (8 * (h - 2))) & 0xff;
        else if (h < 8) v = sc[h - 4] | (sc[h] >> 4) << 6;
        else if (h < 12) v = mc[h - 8] | (mc[h - 4] >> 4) << 6;
        else v = (sc[h - 8] & 15) | (mc[h - 8] & 15) << 4;
        out[h] = (uint8_t)v;
    }
}

/* a Q4_K block's eight 6-bit scales (u0: sc_0..3, u1: sc_4..7) and minimums (u2, u3) from its
 * scale words w0..w2 (bytes 4..15): the cpu's q4k_words */
static __device__ __forceinline__ void q4k_words(uint32_t w0, uint32_t w1, uint32_t w2,
                                                 uint32_t u[4]) {
    u[0] = w0 & 0x3f3f3f3fu;
    u[1] = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
    u[2] = w1 & 0x3f3f3f3fu;
    u[3] = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
}
static __device__ __forceinline__ int byte_of(const uint32_t *u, int k) {
    return (int)((u[k >> 2] >> (8 * (k & 3))) & 0xffu);
}

/* one Q4_K block per thread block of 256, thread t: sub-block t / 32, value t % 32 */
static __global__ void ki_q4k_dequantize(float *x, const uint8_t *src) {
    const int64_t blk = blockIdx.x;
    const int t = threadIdx.x, j = t >> 5, i = t & 31;
    const uint8_t *b = src + blk * QB;
    uint32_t w[3], u[4];
    for (int k = 0; k < 3; k++)
        w[k] = (uint32_t)b[4 + 4 * k] | (uint32_t)b[5 + 4 * k] << 8 |
               (uint32_t)b[6 + 4 * k] << 16 | (uint32_t)b[7 + 4 * k] << 24;
    q4k_words(w[0], w[1], w[2], u);
    const float d = fp16_widen((uint16_t)(b[0] | b[1] << 8));
    const float dm = fp16_widen((uint16_t)(b[2] | b[3] << 8));
    const float S = __fmul_rn(d, (float)byte_of(u, j)), M = __fmul_rn(dm, (float)byte_of(u + 2, j));
    const int v = b[16 + 32 * (j >> 1) + i];
    x[blk * QK + t] = __fsub_rn(__fmul_rn(S, (float)((j & 1) ? v >> 4 : v & 15)), M);
}

/* one block of 256 input values per warp: the cpu's q8k_quantize_rows (lane: values 32j +
 * lane, j = 0..7) */
static __global__ void ki_q8k_quantize(int8_t *q, float *d, int16_t *sums, const float *x,
                                       int64_t nblk) {
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= nblk) return; /* the whole warp */
    float v[8], amax = 0.0f;
    for (int j = 0; j < 8; j++) {
        v[j] = x[b * QK + 32 * j + lane];
        const float a = fabsf(v[j]);
        amax = a > amax ? a : amax;
    }
    amax = cu_warp_max(amax);
    const float s = __fdiv_rn(amax, 127.0f), inv = s != 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
    if (lane == 0) d[b] = s;
    for (int j = 0; j < 8; j++) {
        const float r = roundf(__fmul_rn(v[j], inv)); /* in [-127, 127] but for inf / NaN */
        const int qi = r >= -127.0f && r <= 127.0f ? (int)r : 0;
        q[b * QK + 32 * j + lane] = (int8_t)qi;
        const int sum = warp_sum_i(qi);
        if (lane == 0) sums[b * 8 + j] = (int16_t)sum;
    }
}

/* Q4_K blocks per launch (a thread block each: the grid's x is at most 2^31 - 1) */
static const int64_t Q4_BLOCKS_PER_LAUNCH = (int64_t)1 << 30;

static void q4k_quantize_(uint8_t *blocks, const float *x, int64_t N, int IC) {
    if (IC < 0 || IC % QK) bad_input("q4k_quantize", "IC is not a multiple of 256", IC);
    const int64_t nblk = N * (IC / QK);
    for (int64_t b0 = 0; b0 < nblk; b0 += Q4_BLOCKS_PER_LAUNCH) {
        const int64_t n = nblk - b0 < Q4_BLOCKS_PER_LAUNCH ? nblk - b0 : Q4_BLOCKS_PER_LAUNCH;
        CU_LAUNCH(ki_q4k_quantize, (unsigned)n, QK, 0, blocks + b0 * QB, x + b0 * QK);
    }
}
static void q4k_dequantize_(float *x, const uint8_t *blocks, int64_t N, int IC) {
    if (IC < 0 || IC % QK) bad_input("q4k_dequantize", "IC is not a multiple of 256", IC);
    const int64_t nblk = N * (IC / QK);
    for (int64_t b0 = 0; b0 < nblk; b0 += Q4_BLOCKS_PER_LAUNCH) {
        const int64_t n = nblk - b0 < Q4_BLOCKS_PER_LAUNCH ? nblk - b0 : Q4_BLOCKS_PER_LAUNCH;
        CU_LAUNCH(ki_q4k_dequantize, (unsigned)n, QK, 0, x + b0 * QK, blocks + b0 * QB);
    }
}
static void q8k_quantize_(int8_t *q, float *d, int16_t *sums, const float *x, int64_t N, int IC) {
    if (IC < 0 || IC % QK) bad_input("q8k_quantize", "IC is not a multiple of 256", IC);
    const int64_t nblk = N * (IC / QK);
    if (nblk > 0) CU_LAUNCH(ki_q8k_quantize, cu_blocks(nblk, 8), 256, 0, q, d, sums, x, nblk);
}

enum { Q4_NR = 8, Q4_U = 2 };

/* output o per warp, rows [n0, n0 + nr): the cpu's chains c_l (8) and e_i (4) over the blocks
 * in order. A step is 4 blocks, lane 8 kk + l taking block 4g + kk: s_l (its 4 nibble words,
 * 8 input words) and, for l < 4, u_l; their products go to lanes kk = 0, which add the 4
 * blocks' in order. The weights of Q4_U steps are loaded before any is used (1,152 bytes of
 * the row in flight per warp). Then the cpu's tree in lane 0. */
static __global__ void ki_matmul_q4k(float *out, const int8_t *xq, const float *xd,
                                     const int16_t *xsum, const uint8_t *w, const float *bias,
                                     int64_t N, int IC, int OC) {
    const int lane = threadIdx.x & 31, kk = lane >> 3, l = lane & 7;
    const int o = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (o >= OC) return; /* the whole warp */
    const int64_t n0 = (int64_t)blockIdx.y * Q4_NR;
    const int nr = N - n0 < Q4_NR ? (int)(N - n0) : Q4_NR;
    const int nk = IC / QK;
    const uint8_t *wr = w + (int64_t)o * nk * QB;
    float c[Q4_NR], e[Q4_NR];
    for (int n = 0; n < Q4_NR; n++) c[n] = e[n] = 0.0f;
    for (int g0 = 0; g0 < nk; g0 += 4 * Q4_U) {
        uint32_t h[Q4_U][4], qw[Q4_U][4];
        KI_UNROLL
        for (int v = 0; v < Q4_U; v++) {
            const int k = g0 + 4 * v + kk;
            const uint32_t *bw = (const uint32_t *)(wr + (int64_t)k * QB);
            for (int p = 0; p < 4; p++) h[v][p] = k < nk ? bw[p] : 0u;
            for (int p = 0; p < 4; p++) qw[v][p] = k < nk ? bw[4 + 8 * p + l] : 0u;
        }
        KI_UNROLL
        for (int v = 0; v < Q4_U; v++) {
            const int k = g0 + 4 * v + kk, k0 = g0 + 4 * v;
            uint32_t u[4];
            q4k_words(h[v][1], h[v][2], h[v][3], u);
            const float dw = fp16_widen((uint16_t)(h[v][0] & 0xffffu));
            const float dmw = fp16_widen((uint16_t)(h[v][0] >> 16));
            KI_UNROLL
            for (int n = 0; n < Q4_NR; n++) {
                if (n >= nr) break; /* the warp's: the shuffles below are reached by all */
                const int64_t row = n0 + n;
                float pc = 0.0f, pe = 0.0f;
                if (k < nk) {
                    const int8_t *xb = xq + row * IC + (int64_t)k * QK;
                    int s = 0;
                    KI_UNROLL
                    for (int j = 0; j < 8; j++) {
                        const uint32_t nib = (j & 1) ? (qw[v][j >> 1] >> 4) & 0x0f0f0f0fu
                                                     : qw[v][j >> 1] & 0x0f0f0f0fu;
                        s += byte_of(u, j) * __dp4a((int)nib, ld32(xb + 32 * j + 4 * l), 0);
                    }
                    const float dx = xd[row * nk + k];
                    pc = __fmul_rn((float)s, __fmul_rn(dw, dx));
                    if (l < 4) {
                        const int16_t *xs = xsum + (row * nk + k) * 8 + 2 * l;
                        const int uu =
                            byte_of(u + 2, 2 * l) * xs[0] + byte_of(u + 2, 2 * l + 1) * xs[1];
                        pe = __fmul_rn((float)uu, __fmul_rn(dmw, dx));
                    }
                }
                float pcs[4] = {pc, 0, 0, 0}, pes[4] = {pe, 0, 0, 0};
                for (int m = 1; m < 4; m++) {
                    pcs[m] = __shfl_down_sync(0xffffffffu, pc, 8 * m);
                    pes[m] = __shfl_down_sync(0xffffffffu, pe, 8 * m);
                }
                if (kk == 0) {
                    for (int m = 0; m < 4 && k0 + m < nk; m++) {
                        c[n] = __fadd_rn(c[n], pcs[m]);
                        if (l < 4) e[n] = __fadd_rn(e[n], pes[m]);
                    }
                }
            }
        }
    }
    KI_UNROLL
    for (int n = 0; n < Q4_NR; n++) {
        if (n >= nr) break;
        float cv[8], ev[4];
        for (int m = 0; m < 8; m++) cv[m] = __shfl_sync(0xffffffffu, c[n], m);
        for (int m = 0; m < 4; m++) ev[m] = __shfl_sync(0xffffffffu, e[n], m);
        if (lane == 0) {
            const float a0 = __fadd_rn(cv[0], cv[4]), a1 = __fadd_rn(cv[1], cv[5]);
            const float a2 = __fadd_rn(cv[2], cv[6]), a3 = __fadd_rn(cv[3], cv[7]);
            const float tt = __fadd_rn(__fadd_rn(a0, a2), __fadd_rn(a1, a3));
            const float uu = __fadd_rn(__fadd_rn(ev[0], ev[2]), __fadd_rn(ev[1], ev[3]));
            const float y = __fsub_rn(tt, uu);
            out[(n0 + n) * OC + o] = bias ? __fadd_rn(y, bias[o]) : y;
        }
    }
}

static void matmul_q4k_fwd(float *out, const int8_t *xq, const float *xd, const int16_t *xsum,
                           const uint8_t *w, const float *bias, int64_t N, int IC, int OC) {
    if (IC < 0 || IC % QK) bad_input("matmul_q4k_forward", "IC is not a multiple of 256", IC);
    if (N <= 0 || OC <= 0) return;
    need_aligned("matmul_q4k_forward", xq, 4);
    need_aligned("matmul_q4k_forward", w, 4);
    const int nk = IC / QK;
    for (int64_t r0 = 0; r0 < N; r0 += ROWS_PER_LAUNCH) {
        const int64_t n = N - r0 < ROWS_PER_LAUNCH ? N - r0 : ROWS_PER_LAUNCH;
        dim3 grid(cu_blocks(OC, MM_WARPS), cu_blocks(n, Q4_NR));
        CU_LAUNCH(ki_matmul_q4k, grid, 32 * MM_WARPS, 0, out + r0 * OC, xq + r0 * IC,
                  xd + r0 * nk, xsum + r0 * nk * 8, w, bias, n, IC, OC);
    }
}

/* ---- bf16 compute: plain row-major bf16, rows of ICp = IC rounded up to 8 ----------------- */

static inline int64_t icp(int IC) { return ((int64_t)IC + 7) & ~(int64_t)7; }

/* rows (n, ld) of dst from (n, IC) fp32 rounded (src_bf16 0) or bf16 copied (1); zeros past IC */
static __global__ void ki_to_rows(uint16_t *dst, const void *src, int src_bf16, int64_t n,
                                  int IC, int64_t ld) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * ld) return;
    const int64_t r = i / ld, c = i % ld;
    uint16_t v = 0;
    if (c < IC) {
        const int64_t at = r * IC + c;
        v = src_bf16 ? ((const uint16_t *)src)[at] : cu_round(((const float *)src)[at]);
    }
    dst[i] = v;
}
static __global__ void ki_row_widen(float *dst, const uint16_t *src, int IC) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < IC) dst[i] = cu_bf16(src[i]);
}

static int64_t dotbf16_pack_elems_(int OC, int IC) { return (int64_t)OC * icp(IC); }
static int64_t dotbf16_act_elems_(int64_t N, int IC) { return N * icp(IC); }

static void dotbf16_pack_(uint16_t *dst, const void *w, int w_bf16, int OC, int IC) {
    const int64_t n = (int64_t)OC * icp(IC);
    if (n > 0)
        CU_LAUNCH(ki_to_rows, cu_blocks(n, 256), 256, 0, dst, w, w_bf16, (int64_t)OC, IC, icp(IC));
}
static void dotbf16_unpack_row_(float *dst, const uint16_t *packed, int OC, int IC, int row) {
    if (row < 0 || row >= OC) bad_input("dotbf16_unpack_row", "row out of range", row);
    if (IC > 0)
        CU_LAUNCH(ki_row_widen, cu_blocks(IC, 256), 256, 0, dst, packed + row * icp(IC), IC);
}
static void bf16_round_(uint16_t *dst, const float *src, int64_t N, int IC) {
    const int64_t n = N * icp(IC);
    if (n > 0) CU_LAUNCH(ki_to_rows, cu_blocks(n, 256), 256, 0, dst, src, 0, N, IC, icp(IC));
}
static void matmul_dotbf16_fwd(float *out, const uint16_t *inp, const uint16_t *weight,
                               const float *bias, int64_t N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (N > 0x7fffffff) bad_input("matmul_dotbf16_forward", "N above 2^31 - 1", N);
    const int ld = (int)icp(IC);
    cu_gemm(1, 0, OC, (int)N, IC, 1.0f, weight, ld, 0, inp, ld, 0, 0.0f, out, OC, 0, 1, CU_BF16,
            CU_F32, bias, 0);
}

void cu_fill_infer(loom_backend *t) {
    t->matmul_bf16_forward = matmul_bf16_fwd;
    t->q8_quantize = q8_quantize_;
    t->q8_dequantize = q8_dequantize_;
    t->matmul_q8_forward = matmul_q8_fwd;
    t->q4k_quantize = q4k_quantize_;
    t->q4k_dequantize = q4k_dequantize_;
    t->q8k_quantize = q8k_quantize_;
    t->matmul_q4k_forward = matmul_q4k_fwd;
    t->dotbf16_pack_elems = dotbf16_pack_elems_;
    t->dotbf16_pack = dotbf16_pack_;
    t->dotbf16_unpack_row = dotbf16_unpack_row_;
    t->dotbf16_act_elems = dotbf16_act_elems_;
    t->bf16_round = bf16_round_;
    t->matmul_dotbf16_forward = matmul_dotbf16_fwd;
}

} // namespace LOOM_CU_NS
