/* The CUDA backend's pointwise ops: norms (LayerNorm, RMSNorm, q/k head and row norms),
 * activations (GELU, SwiGLU, GeGLU, soft-capping), RoPE, embeddings, mean pooling and the
 * residual add, in fp32 and on bf16 storage. Each op is the cpu kernel of the same name
 * (src/kernels/norm.c, activation.c, rope.c, embedding.c, pool.c, bf16_ops.c) on the device:
 * the same formulas, the statistics in double where the cpu takes them in double, += and =
 * where the cpu has them, NULL gradients skipped. Results repeat run to run (no atomics):
 * the norms' weight gradients are per-block partial sums in a scratch buffer summed in a
 * fixed order, the embedding's are owned column by column with the rows added in order.
 * cu_common.cuh is the dialect; docs/gpu.md "Pointwise ops" the design. */
#include "cu_common.cuh"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

namespace LOOM_CU_NS {

/* ---- scratch: one device buffer for the partial sums, grown, kept for the process ------- */

static pthread_mutex_t g_scratch_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_scratch;
static size_t g_scratch_bytes;

/* Locks the scratch and returns at least `bytes` of it. The caller queues every launch that
 * uses it, then scratch_unlock: the one stream runs them before any later op's, so a second
 * host thread's op cannot overwrite partial sums still to be read. */
static void *scratch_lock(size_t bytes) {
    pthread_mutex_lock(&g_scratch_mu);
    if (bytes > g_scratch_bytes) {
        cu_enter();
        if (g_scratch) CU_CHECK(cudaFree(g_scratch)); /* waits for the queued work */
        g_scratch = NULL;
        g_scratch_bytes = 0;
        const size_t mib = (size_t)1 << 20;
        const size_t n = bytes < mib ? mib : (bytes + 4095) / 4096 * 4096;
        CU_CHECK(cudaMalloc(&g_scratch, n));
        if (!g_scratch) cu_fail(__FILE__, __LINE__, "cudaMalloc", "the pointwise ops' scratch");
        g_scratch_bytes = n;
    }
    return g_scratch;
}
static void scratch_unlock(void) { pthread_mutex_unlock(&g_scratch_mu); }

/* ---- device helpers --------------------------------------------------------------------- */

#define PW_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define PW_GELU_C 0.044715f

/* element i of an fp32 (f) or bf16 (h, when not NULL) tensor, in fp32 */
static __device__ __forceinline__ float pw_ld(const float *f, const uint16_t *h, int64_t i) {
    return h ? cu_bf16(h[i]) : f[i];
}
static __device__ __forceinline__ void pw_st(float *f, uint16_t *h, int64_t i, float v) {
    if (h) h[i] = cu_round(v);
    else f[i] = v;
}
/* kmath.h's forms: tanh through e = exp(-2|x|), sech^2 = 4e / (1 + e)^2 (no cancellation in
 * GELU's tails), sigmoid = 1 / (1 + exp(-x)) */
static __device__ __forceinline__ float pw_tanh(float x) {
    const float e = expf(-2.0f * fabsf(x));
    return copysignf((1.0f - e) / (1.0f + e), x);
}
static __device__ __forceinline__ float pw_sech2(float x) {
    const float e = expf(-2.0f * fabsf(x)), d = 1.0f + e;
    return 4.0f * e / (d * d);
}
static __device__ __forceinline__ float pw_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float pw_gelu(float x) {
    const float u = PW_GELU_K * (x + PW_GELU_C * x * x * x);
    return 0.5f * x * (1.0f + pw_tanh(u));
}
static __device__ __forceinline__ float pw_gelu_grad(float x) {
    const float u = PW_GELU_K * (x + PW_GELU_C * x * x * x);
    const float t = pw_tanh(u), du = PW_GELU_K * (1.0f + 3.0f * PW_GELU_C * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * pw_sech2(u) * du;
}

/* elementwise launches: 256 threads, a grid-stride loop over at most this many blocks */
enum { EW_THREADS = 256, EW_MAX_BLOCKS = 16384 };
static unsigned ew_grid(int64_t n) {
    const int64_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return b < EW_MAX_BLOCKS ? (unsigned)b : (unsigned)EW_MAX_BLOCKS;
}
#define PW_LOOP(i, n)                                                                        \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)gridDim.x * blockDim.x)
/* row launches: one block per row, a stride loop over the rows past 65,535 blocks */
#define PW_BLOCK_ROWS(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)
static unsigned row_blocks(int64_t rows) { return rows < 65535 ? (unsigned)rows : 65535u; }

/* ---- norms ---------------------------------------------------------------------------------
 * Every norm is over "rows" of D floats: a row of (N,C) (LayerNorm, RMSNorm: D = C), one
 * head of a fused q|k|v row (headnorm: row v is head v % nh of row v / nh), or a row's
 * projection part (rownorm). One warp per row: its lanes stride the row, the sums go through
 * the warp's shuffles (no block barriers), lane 0 writes the row's statistics. */

typedef struct norm_rows {
    int64_t V;          /* rows: N, or N * nh for heads */
    int nh, D;          /* heads per row (1: the whole row) and floats per norm row */
    int64_t row_stride; /* floats between rows of the tensor */
    int64_t st_stride;  /* statistics (mean, rstd, sums) between rows of the tensor */
} norm_rows;

static __device__ __forceinline__ int64_t nr_off(const norm_rows &d, int64_t v) {
    return d.nh == 1 ? v * d.row_stride : (v / d.nh) * d.row_stride + (v % d.nh) * (int64_t)d.D;
}
static __device__ __forceinline__ int64_t nr_st(const norm_rows &d, int64_t v) {
    return d.nh == 1 ? v * d.st_stride : (v / d.nh) * d.st_stride + v % d.nh;
}

enum { NORM_WARPS = 8 }; /* rows per block of 256 threads */
static unsigned norm_grid(int64_t rows) {
    const int64_t b = (rows + NORM_WARPS - 1) / NORM_WARPS;
    return b < 65535 ? (unsigned)b : 65535u;
}
#define PW_ROW_LOOP(v, rows)                                                                 \
    for (int64_t v = (int64_t)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5); v < (rows);      \
         v += (int64_t)gridDim.x * NORM_WARPS)

enum { NF_LAYER = 0, NF_RMS = 1, NF_ROW = 2 };

/* A lane's elements of a row are i = lane + 32 k, taken NU at a time with their loads issued
 * before any use (NU loads in flight per lane, also where a store follows that the compiler
 * must assume may alias the next loads: out = in), then the tail; the sums run over them in
 * the same order either way. */
enum { NU = 4 };
#define PW_LANE_TRIPS(i, lane, D) for (i = (lane); i + 32 * (NU - 1) < (D); i += 32 * NU)

/* forward: LayerNorm (mean and variance in double, two passes), RMSNorm (sum of squares in
 * double) or rownorm (rstd from the whole row's sum of squares ss); out = (x - mean) * rstd *
 * w (+ b), written fp32 or rounded to bf16 (outh); mean, rstd (NULL: not kept) fp32. rstd may
 * be ss (rownorm): every lane reads ss before lane 0 writes rstd; out may be inp. */
__global__ void k_norm_fwd(float *out, uint16_t *outh, float *mean, float *rstd,
                           const float *inp, const uint16_t *inph, const float *w,
                           const float *b, const float *ss, norm_rows d, int mode, int n_global,
                           float eps) {
    const int lane = threadIdx.x & 31, D = d.D;
    PW_ROW_LOOP(v, d.V) {
        const int64_t o = nr_off(d, v), si = nr_st(d, v);
        float fm = 0.0f, rs;
        int i;
        if (mode == NF_LAYER) {
            double s = 0.0;
            PW_LANE_TRIPS(i, lane, D) {
                float x[NU];
                for (int u = 0; u < NU; u++) x[u] = pw_ld(inp, inph, o + i + 32 * u);
                for (int u = 0; u < NU; u++) s += (double)x[u];
            }
            for (; i < D; i += 32) s += (double)pw_ld(inp, inph, o + i);
            s = cu_warp_sum_d(s);
            const double m = s / D;
            double q = 0.0;
            PW_LANE_TRIPS(i, lane, D) {
                float x[NU];
                for (int u = 0; u < NU; u++) x[u] = pw_ld(inp, inph, o + i + 32 * u);
                for (int u = 0; u < NU; u++) {
                    const double e = (double)x[u] - m;
                    q += e * e;
                }
            }
            for (; i < D; i += 32) {
                const double e = (double)pw_ld(inp, inph, o + i) - m;
                q += e * e;
            }
            q = cu_warp_sum_d(q);
            fm = (float)m;
            rs = (float)(1.0 / sqrt(q / D + eps));
        } else if (mode == NF_RMS) {
            double s = 0.0;
            PW_LANE_TRIPS(i, lane, D) {
                float x[NU];
                for (int u = 0; u < NU; u++) x[u] = pw_ld(inp, inph, o + i + 32 * u);
                for (int u = 0; u < NU; u++) s += (double)x[u] * (double)x[u];
            }
            for (; i < D; i += 32) {
                const double x = (double)pw_ld(inp, inph, o + i);
                s += x * x;
            }
            s = cu_warp_sum_d(s);
            rs = (float)(1.0 / sqrt(s / D + eps));
        } else {
            rs = (float)(1.0 / sqrt((double)ss[si] / n_global + eps));
        }
        PW_LANE_TRIPS(i, lane, D) {
            float x[NU];
            for (int u = 0; u < NU; u++) x[u] = pw_ld(inp, inph, o + i + 32 * u);
            for (int u = 0; u < NU; u++) {
                const int c = i + 32 * u;
                float y = (x[u] - fm) * rs * w[c];
                if (b) y += b[c];
                pw_st(out, outh, o + c, y);
            }
        }
        for (; i < D; i += 32) {
            float y = (pw_ld(inp, inph, o + i) - fm) * rs * w[i];
            if (b) y += b[i];
            pw_st(out, outh, o + i, y);
        }
        __syncwarp(); /* every lane has read ss[si] (rownorm: it may be rstd) */
        if (lane == 0) {
            if (mean) mean[si] = fm;
            if (rstd) rstd[si] = rs;
        }
    }
}

/* backward into the input: dx = rs * (dy w - ma - xhat mb), xhat = (x - mean) * rs (mean
 * NULL: RMS, ma = 0), ma = mean(dy w), mb = mean(dy w xhat) over the row in double, or mb =
 * dots / n_global from the whole row's sums (rownorm); dinp += (set 0) or = (set 1) */
__global__ void k_norm_bwd_dx(float *dinp, int set, const float *dout, const float *inp,
                              const uint16_t *inph, const float *w, const float *mean,
                              const float *rstd, const float *dots, norm_rows d, int n_global) {
    const int lane = threadIdx.x & 31, D = d.D;
    PW_ROW_LOOP(v, d.V) {
        const int64_t o = nr_off(d, v), si = nr_st(d, v);
        const float m = mean ? mean[si] : 0.0f, rs = rstd[si];
        float ma = 0.0f, mb;
        int i;
        if (dots) {
            mb = dots[si] / (float)n_global;
        } else {
            double a = 0.0, bb = 0.0;
            PW_LANE_TRIPS(i, lane, D) {
                float dy[NU], x[NU];
                for (int u = 0; u < NU; u++) {
                    dy[u] = dout[o + i + 32 * u];
                    x[u] = pw_ld(inp, inph, o + i + 32 * u);
                }
                for (int u = 0; u < NU; u++) {
                    const float dxh = dy[u] * w[i + 32 * u], xh = (x[u] - m) * rs;
                    a += dxh;
                    bb += dxh * xh;
                }
            }
            for (; i < D; i += 32) {
                const float dxh = dout[o + i] * w[i];
                const float xh = (pw_ld(inp, inph, o + i) - m) * rs;
                a += dxh;
                bb += dxh * xh;
            }
            if (mean) ma = (float)(cu_warp_sum_d(a) / D);
            mb = (float)(cu_warp_sum_d(bb) / D);
        }
        PW_LANE_TRIPS(i, lane, D) {
            float dy[NU], x[NU], g0[NU];
            for (int u = 0; u < NU; u++) {
                dy[u] = dout[o + i + 32 * u];
                x[u] = pw_ld(inp, inph, o + i + 32 * u);
                g0[u] = set ? 0.0f : dinp[o + i + 32 * u];
            }
            for (int u = 0; u < NU; u++) {
                const float dxh = dy[u] * w[i + 32 * u], xh = (x[u] - m) * rs;
                const float g = rs * (dxh - ma - xh * mb);
                dinp[o + i + 32 * u] = set ? g : g0[u] + g;
            }
        }
        for (; i < D; i += 32) {
            const float dxh = dout[o + i] * w[i];
            const float xh = (pw_ld(inp, inph, o + i) - m) * rs;
            const float g = rs * (dxh - ma - xh * mb);
            if (set) dinp[o + i] = g;
            else dinp[o + i] += g;
        }
    }
}

/* rownorm_sums: st[si] = the row's sum of x^2 (dout NULL) or of dout * w * (x * rstd), in
 * double. Every lane reads rstd[si] before lane 0 writes st[si] (the warp sum between). */
__global__ void k_row_sums(float *st, const float *inp, const float *dout, const float *w,
                           const float *rstd, norm_rows d) {
    const int lane = threadIdx.x & 31, D = d.D;
    PW_ROW_LOOP(v, d.V) {
        const int64_t o = nr_off(d, v), si = nr_st(d, v);
        double s = 0.0;
        int i;
        if (!dout) {
            PW_LANE_TRIPS(i, lane, D) {
                float x[NU];
                for (int u = 0; u < NU; u++) x[u] = inp[o + i + 32 * u];
                for (int u = 0; u < NU; u++) s += (double)x[u] * x[u];
            }
            for (; i < D; i += 32) s += (double)inp[o + i] * inp[o + i];
        } else {
            const float rs = rstd[si];
            PW_LANE_TRIPS(i, lane, D) {
                float x[NU], dy[NU];
                for (int u = 0; u < NU; u++) {
                    x[u] = inp[o + i + 32 * u];
                    dy[u] = dout[o + i + 32 * u];
                }
                for (int u = 0; u < NU; u++) s += dy[u] * w[i + 32 * u] * (x[u] * rs);
            }
            for (; i < D; i += 32) s += dout[o + i] * w[i] * (inp[o + i] * rs);
        }
        s = cu_warp_sum_d(s);
        if (lane == 0) st[si] = (float)s;
    }
}

/* Weight (and bias) gradients: column sums over the rows, deterministic in two launches.
 * k_col_partial: block (column group of 32, chunk of rows); its 8 warps take every 8th row of
 * the chunk (NU rows' loads at a time), each lane one column (coalesced), then the 8 partial
 * sums are added in warp order; part[chunk][col] (and, with bias, part[nchunk + chunk][col]).
 * k_col_final: each column's chunks summed in order and added (+=) into dw, db. */
enum { COL_W = 32, COL_R = 8 };

__global__ void k_col_partial(float *part, int64_t rows_per_chunk, int nchunk,
                              const float *dout, const float *inp, const uint16_t *inph,
                              const float *mean, const float *rstd, norm_rows d, int want_b) {
    __shared__ float sw[COL_R][COL_W], sb[COL_R][COL_W];
    const int lane = threadIdx.x & 31, ry = threadIdx.x >> 5;
    const int col = blockIdx.x * COL_W + lane;
    const int64_t v0 = (int64_t)blockIdx.y * rows_per_chunk;
    const int64_t v1 = v0 + rows_per_chunk < d.V ? v0 + rows_per_chunk : d.V;
    float aw = 0.0f, ab = 0.0f;
    if (col < d.D) {
        int64_t v = v0 + ry;
        for (; v + COL_R * (NU - 1) < v1; v += COL_R * NU) {
            float dy[NU], xh[NU];
            for (int u = 0; u < NU; u++) {
                const int64_t vu = v + COL_R * u, o = nr_off(d, vu) + col, si = nr_st(d, vu);
                const float m = mean ? mean[si] : 0.0f;
                dy[u] = dout[o];
                xh[u] = (pw_ld(inp, inph, o) - m) * rstd[si];
            }
            for (int u = 0; u < NU; u++) aw += dy[u] * xh[u], ab += dy[u];
        }
        for (; v < v1; v += COL_R) {
            const int64_t o = nr_off(d, v) + col, si = nr_st(d, v);
            const float m = mean ? mean[si] : 0.0f, rs = rstd[si], dy = dout[o];
            aw += dy * ((pw_ld(inp, inph, o) - m) * rs);
            ab += dy;
        }
    }
    sw[ry][lane] = aw;
    sb[ry][lane] = ab;
    __syncthreads();
    if (ry == 0 && col < d.D) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < COL_R; k++) tw += sw[k][lane], tb += sb[k][lane];
        part[(int64_t)blockIdx.y * d.D + col] = tw;
        if (want_b) part[(int64_t)(nchunk + blockIdx.y) * d.D + col] = tb;
    }
}

__global__ void k_col_final(float *dw, float *db, const float *part, int nchunk, int D) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= D) return;
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < nchunk; k++) {
        tw += part[(int64_t)k * D + col];
        if (db) tb += part[(int64_t)(nchunk + k) * D + col];
    }
    if (dw) dw[col] += tw;
    if (db) db[col] += tb;
}

/* dw (D) += sum over rows of dout * xhat, db (D) += sum of dout (either may be NULL) */
static void norm_param_grads(float *dw, float *db, const float *dout, const float *inp,
                             const uint16_t *inph, const float *mean, const float *rstd,
                             const norm_rows &d) {
    if ((!dw && !db) || d.V <= 0 || d.D <= 0) return;
    /* about 1,024 blocks: a few per SM on an H100/H200, at least 64 rows each */
    const int groups = (d.D + COL_W - 1) / COL_W;
    const int64_t want = 1024 / groups > 1 ? 1024 / groups : 1;
    int64_t rpc = (d.V + want - 1) / want;
    if (rpc < 64) rpc = 64;
    const int nchunk = (int)((d.V + rpc - 1) / rpc);
    const size_t bytes = (size_t)(db ? 2 : 1) * nchunk * d.D * sizeof(float);
    float *part = (float *)scratch_lock(bytes);
    CU_LAUNCH(k_col_partial, dim3((unsigned)groups, (unsigned)nchunk), COL_W * COL_R, 0, part,
              rpc, nchunk, dout, inp, inph, mean, rstd, d, db != NULL);
    CU_LAUNCH(k_col_final, cu_blocks(d.D, 256), 256, 0, dw, db, part, nchunk, d.D);
    scratch_unlock();
}

static norm_rows plain_rows(int64_t N, int C) {
    norm_rows d;
    d.V = N, d.nh = 1, d.D = C, d.row_stride = C, d.st_stride = 1;
    return d;
}
static norm_rows head_rows(int64_t N, int nh, int D, int64_t row_stride, int64_t st_stride) {
    norm_rows d;
    d.V = N * nh, d.nh = nh, d.D = D, d.row_stride = row_stride, d.st_stride = st_stride;
    return d;
}

static void norm_fwd(float *out, uint16_t *outh, float *mean, float *rstd, const float *inp,
                     const uint16_t *inph, const float *w, const float *b, const float *ss,
                     const norm_rows &d, int mode, int n_global, float eps) {
    if (d.V <= 0 || d.D <= 0) return;
    CU_LAUNCH(k_norm_fwd, norm_grid(d.V), NORM_WARPS * 32, 0, out, outh, mean, rstd, inp, inph,
              w, b, ss, d, mode, n_global, eps);
}
static void norm_bwd_dx(float *dinp, int set, const float *dout, const float *inp,
                        const uint16_t *inph, const float *w, const float *mean,
                        const float *rstd, const float *dots, const norm_rows &d, int n_global) {
    if (!dinp || d.V <= 0 || d.D <= 0) return;
    CU_LAUNCH(k_norm_bwd_dx, norm_grid(d.V), NORM_WARPS * 32, 0, dinp, set, dout, inp, inph, w,
              mean, rstd, dots, d, n_global);
}

static void cu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int64_t N, int C,
                                 float eps) {
    norm_fwd(out, NULL, mean, rstd, inp, NULL, weight, bias, NULL, plain_rows(N, C), NF_LAYER, 0,
             eps);
}
static void cu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int64_t N, int C) {
    const norm_rows d = plain_rows(N, C);
    norm_bwd_dx(dinp, 0, dout, inp, NULL, weight, mean, rstd, NULL, d, 0);
    norm_param_grads(dweight, dbias, dout, inp, NULL, mean, rstd, d);
}
static void cu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                               int64_t N, int C, float eps) {
    norm_fwd(out, NULL, NULL, rstd, inp, NULL, weight, NULL, NULL, plain_rows(N, C), NF_RMS, 0,
             eps);
}
static void cu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                const float *weight, const float *rstd, int64_t N, int C) {
    const norm_rows d = plain_rows(N, C);
    norm_bwd_dx(dinp, 0, dout, inp, NULL, weight, NULL, rstd, NULL, d, 0);
    norm_param_grads(dweight, NULL, dout, inp, NULL, NULL, rstd, d);
}
static void cu_bf16_layernorm_forward(uint16_t *out, float *mean, float *rstd,
                                      const uint16_t *inp, const float *weight,
                                      const float *bias, int64_t N, int C, float eps) {
    norm_fwd(NULL, out, mean, rstd, NULL, inp, weight, bias, NULL, plain_rows(N, C), NF_LAYER, 0,
             eps);
}
static void cu_bf16_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                       const float *dout, const uint16_t *inp,
                                       const float *weight, const float *mean,
                                       const float *rstd, int64_t N, int C) {
    const norm_rows d = plain_rows(N, C);
    norm_bwd_dx(dinp, 0, dout, NULL, inp, weight, mean, rstd, NULL, d, 0);
    norm_param_grads(dweight, dbias, dout, NULL, inp, mean, rstd, d);
}
static void cu_bf16_rmsnorm_forward(uint16_t *out, float *rstd, const uint16_t *inp,
                                    const float *weight, int64_t N, int C, float eps) {
    norm_fwd(NULL, out, NULL, rstd, NULL, inp, weight, NULL, NULL, plain_rows(N, C), NF_RMS, 0,
             eps);
}
static void cu_bf16_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                     const uint16_t *inp, const float *weight,
                                     const float *rstd, int64_t N, int C) {
    const norm_rows d = plain_rows(N, C);
    norm_bwd_dx(dinp, 0, dout, NULL, inp, weight, NULL, rstd, NULL, d, 0);
    norm_param_grads(dweight, NULL, dout, NULL, inp, NULL, rstd, d);
}

static void cu_headnorm_forward(float *out, float *rstd, const float *in, const float *w,
                                int64_t N, int nh, int D, int64_t row_stride,
                                int64_t rstd_stride, float eps) {
    norm_fwd(out, NULL, NULL, rstd, in, NULL, w, NULL, NULL,
             head_rows(N, nh, D, row_stride, rstd_stride), NF_RMS, 0, eps);
}
static void cu_headnorm_backward(float *din, float *dw, const float *dout, const float *in,
                                 const float *w, const float *rstd, int64_t N, int nh, int D,
                                 int64_t row_stride, int64_t rstd_stride) {
    const norm_rows d = head_rows(N, nh, D, row_stride, rstd_stride);
    norm_bwd_dx(din, 1, dout, in, NULL, w, NULL, rstd, NULL, d, 0);
    norm_param_grads(dw, NULL, dout, in, NULL, NULL, rstd, d);
}

static void cu_rownorm_sums(float *st, int64_t st_stride, const float *in, const float *dout,
                            const float *w, const float *rstd, int64_t N, int n,
                            int64_t row_stride) {
    const norm_rows d = head_rows(N, 1, n, row_stride, st_stride);
    if (N <= 0) return;
    CU_LAUNCH(k_row_sums, norm_grid(N), NORM_WARPS * 32, 0, st, in, dout, w, rstd, d);
}
static void cu_rownorm_forward(float *out, float *rstd, const float *in, const float *w,
                               const float *ss, int64_t N, int n, int64_t row_stride,
                               int64_t st_stride, int n_global, float eps) {
    /* n = 0 still writes rstd (the row's statistics come from the group) */
    const norm_rows d = head_rows(N, 1, n > 0 ? n : 0, row_stride, st_stride);
    if (N <= 0) return;
    CU_LAUNCH(k_norm_fwd, norm_grid(N), NORM_WARPS * 32, 0, out, (uint16_t *)NULL,
              (float *)NULL, rstd, in, (const uint16_t *)NULL, w, (const float *)NULL, ss, d,
              (int)NF_ROW, n_global, eps);
}
static void cu_rownorm_backward(float *din, float *dw, const float *dout, const float *in,
                                const float *w, const float *rstd, const float *dots, int64_t N,
                                int n, int64_t row_stride, int64_t st_stride, int n_global) {
    const norm_rows d = head_rows(N, 1, n, row_stride, st_stride);
    norm_bwd_dx(din, 1, dout, in, NULL, w, NULL, rstd, dots, d, n_global);
    norm_param_grads(dw, NULL, dout, in, NULL, NULL, rstd, d);
}

/* ---- activations ---------------------------------------------------------------------- */

__global__ void k_gelu_fwd(float *out, uint16_t *outh, const float *inp, const uint16_t *inph,
                           int64_t n) {
    PW_LOOP(i, n) pw_st(out, outh, i, pw_gelu(pw_ld(inp, inph, i)));
}
__global__ void k_gelu_bwd(float *dinp, int set, const float *inp, const uint16_t *inph,
                           const float *dout, int64_t n) {
    PW_LOOP(i, n) {
        const float g = pw_gelu_grad(pw_ld(inp, inph, i)) * dout[i];
        if (set) dinp[i] = g;
        else dinp[i] += g;
    }
}
static void cu_gelu_forward(float *out, const float *inp, int64_t n) {
    if (n > 0) CU_LAUNCH(k_gelu_fwd, ew_grid(n), EW_THREADS, 0, out, (uint16_t *)NULL, inp,
                         (const uint16_t *)NULL, n);
}
static void cu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    if (n > 0) CU_LAUNCH(k_gelu_bwd, ew_grid(n), EW_THREADS, 0, dinp, 0, inp,
                         (const uint16_t *)NULL, dout, n);
}
static void cu_gelu_backward_set(float *dinp, const float *inp, const float *dout, int64_t n) {
    if (n > 0) CU_LAUNCH(k_gelu_bwd, ew_grid(n), EW_THREADS, 0, dinp, 1, inp,
                         (const uint16_t *)NULL, dout, n);
}
static void cu_bf16_gelu_forward(uint16_t *out, const uint16_t *inp, int64_t n) {
    if (n > 0) CU_LAUNCH(k_gelu_fwd, ew_grid(n), EW_THREADS, 0, (float *)NULL, out,
                         (const float *)NULL, inp, n);
}
static void cu_bf16_gelu_backward(float *dinp, int set, const uint16_t *inp, const float *dout,
                                  int64_t n) {
    if (n > 0) CU_LAUNCH(k_gelu_bwd, ew_grid(n), EW_THREADS, 0, dinp, set ? 1 : 0,
                         (const float *)NULL, inp, dout, n);
}

/* gated units over rows [gate | up] of inp (N, 2F): out (N, F) = act(gate) * up with act =
 * silu (gelu 0) or tanh GELU (gelu 1); backward dinp (N, 2F) +=. One block per row (a
 * stride loop over the rows), threads over its F columns: no 64-bit division per element. */

__global__ void k_glu_fwd(float *out, uint16_t *outh, const float *inp, const uint16_t *inph,
                          int64_t N, int F, int gelu) {
    PW_BLOCK_ROWS(n, N) {
        const int64_t g0 = n * 2 * F, o = n * F;
        for (int i = threadIdx.x; i < F; i += blockDim.x) {
            const float x = pw_ld(inp, inph, g0 + i), u = pw_ld(inp, inph, g0 + F + i);
            pw_st(out, outh, o + i, gelu ? pw_gelu(x) * u : x * pw_sigmoid(x) * u);
        }
    }
}
__global__ void k_glu_bwd(float *dinp, const float *inp, const uint16_t *inph,
                          const float *dout, int64_t N, int F, int gelu) {
    PW_BLOCK_ROWS(n, N) {
        const int64_t g0 = n * 2 * F, o = n * F;
        for (int i = threadIdx.x; i < F; i += blockDim.x) {
            const float x = pw_ld(inp, inph, g0 + i), u = pw_ld(inp, inph, g0 + F + i);
            const float dy = dout[o + i];
            if (gelu) {
                dinp[g0 + i] += dy * u * pw_gelu_grad(x);
                dinp[g0 + F + i] += dy * pw_gelu(x);
            } else {
                const float s = pw_sigmoid(x);
                dinp[g0 + i] += dy * u * s * (1.0f + x * (1.0f - s));
                dinp[g0 + F + i] += dy * (x * s);
            }
        }
    }
}
static void glu_fwd(float *out, uint16_t *outh, const float *inp, const uint16_t *inph,
                    int64_t N, int F, int gelu) {
    if (N > 0 && F > 0)
        CU_LAUNCH(k_glu_fwd, row_blocks(N), F >= 256 ? 256 : 128, 0, out, outh, inp, inph, N, F,
                  gelu);
}
static void glu_bwd(float *dinp, const float *inp, const uint16_t *inph, const float *dout,
                    int64_t N, int F, int gelu) {
    if (N > 0 && F > 0)
        CU_LAUNCH(k_glu_bwd, row_blocks(N), F >= 256 ? 256 : 128, 0, dinp, inp, inph, dout, N, F,
                  gelu);
}
static void cu_swiglu_forward(float *out, const float *inp, int64_t N, int F) {
    glu_fwd(out, NULL, inp, NULL, N, F, 0);
}
static void cu_swiglu_backward(float *dinp, const float *inp, const float *dout, int64_t N,
                               int F) {
    glu_bwd(dinp, inp, NULL, dout, N, F, 0);
}
static void cu_geglu_forward(float *out, const float *inp, int64_t N, int F) {
    glu_fwd(out, NULL, inp, NULL, N, F, 1);
}
static void cu_geglu_backward(float *dinp, const float *inp, const float *dout, int64_t N,
                              int F) {
    glu_bwd(dinp, inp, NULL, dout, N, F, 1);
}
static void cu_bf16_glu_forward(uint16_t *out, const uint16_t *inp, int64_t N, int F, int gelu) {
    glu_fwd(NULL, out, NULL, inp, N, F, gelu ? 1 : 0);
}
static void cu_bf16_glu_backward(float *dinp, const uint16_t *inp, const float *dout, int64_t N,
                                 int F, int gelu) {
    glu_bwd(dinp, NULL, inp, dout, N, F, gelu ? 1 : 0);
}

__global__ void k_softcap(float *x, int64_t n, float cap) {
    PW_LOOP(i, n) x[i] = cap * pw_tanh(x[i] / cap);
}
static void cu_softcap_forward(float *x, int64_t n, float cap) {
    if (n > 0) CU_LAUNCH(k_softcap, ew_grid(n), EW_THREADS, 0, x, n, cap);
}

/* out = a + b (out may alias a) */
__global__ void k_residual(float *out, uint16_t *outh, const float *a, const uint16_t *ah,
                           const float *b, const uint16_t *bh, int64_t n) {
    PW_LOOP(i, n) pw_st(out, outh, i, pw_ld(a, ah, i) + pw_ld(b, bh, i));
}
static void cu_residual_forward(float *out, const float *a, const float *b, int64_t n) {
    if (n > 0) CU_LAUNCH(k_residual, ew_grid(n), EW_THREADS, 0, out, (uint16_t *)NULL, a,
                         (const uint16_t *)NULL, b, (const uint16_t *)NULL, n);
}
static void cu_bf16_residual_forward(uint16_t *out, const uint16_t *a, const uint16_t *b,
                                     int64_t n) {
    if (n > 0) CU_LAUNCH(k_residual, ew_grid(n), EW_THREADS, 0, (float *)NULL, out,
                         (const float *)NULL, a, (const float *)NULL, b, n);
}

/* ---- RoPE ------------------------------------------------------------------------------
 * Tables (max_T, D/2): the angle float(t) * inv_freq[i] in float32, cos/sin in double, times
 * scale (rope.c). rope_tables' inverse frequencies are computed on the host by the cpu's own
 * expression (powf of the C library): powf on the device differs by a few ulp, and the angle
 * t * inv_freq magnifies that by t. */
__global__ void k_rope_tables(float *cos_t, float *sin_t, int max_T, int half,
                              const float *inv_freq, float scale) {
    PW_LOOP(e, (int64_t)max_T * half) {
        const int t = (int)(e / half), i = (int)(e - (int64_t)t * half);
        const float ang = (float)t * inv_freq[i];
        cos_t[e] = (float)cos((double)ang) * scale;
        sin_t[e] = (float)sin((double)ang) * scale;
    }
}
static void cu_rope_tables_freq(float *cos_t, float *sin_t, int max_T, int D,
                                const float *inv_freq, float scale) {
    const int half = D / 2;
    if (max_T <= 0 || half <= 0) return;
    CU_LAUNCH(k_rope_tables, ew_grid((int64_t)max_T * half), EW_THREADS, 0, cos_t, sin_t, max_T,
              half, inv_freq, scale);
}
static void cu_rope_tables(float *cos_t, float *sin_t, int max_T, int D, float theta) {
    const int half = D / 2;
    if (max_T <= 0 || half <= 0) return;
    float *f = (float *)malloc((size_t)half * sizeof(float));
    if (!f) cu_fail(__FILE__, __LINE__, "malloc", "rope_tables' inverse frequencies");
    for (int i = 0; i < half; i++) f[i] = 1.0f / powf(theta, (float)(2 * i) / (float)D);
    float *df = (float *)scratch_lock((size_t)half * sizeof(float));
    cudaStream_t st = cu_stream();
    CU_CHECK(cudaMemcpyAsync(df, f, (size_t)half * sizeof(float), cudaMemcpyHostToDevice, st));
    CU_CHECK(cudaStreamSynchronize(st)); /* f is freed below */
    CU_LAUNCH(k_rope_tables, ew_grid((int64_t)max_T * half), EW_THREADS, 0, cos_t, sin_t, max_T,
              half, (const float *)df, 1.0f);
    scratch_unlock();
    free(f);
}

/* one block per row (a stride loop over the rows), a thread per rotated pair (i, i + D/2) of
 * a head: x1 = a c - b s, x2 = b c + a s with s times sign (-1: the inverse rotation, the
 * backward) */
__global__ void k_rope(float *x, uint16_t *xh, int64_t rows, int T, int nh, int D,
                       int64_t row_stride, const float *cos_t, const float *sin_t, int pos0,
                       float sign) {
    const int half = D / 2, pairs = nh * half;
    PW_BLOCK_ROWS(r, rows) {
        const int64_t pos = pos0 + r % T;
        const float *c = cos_t + pos * half, *s = sin_t + pos * half;
        for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
            const int h = j / half, i = j - h * half;
            const float cs = c[i], sn = sign * s[i];
            const int64_t p1 = r * row_stride + (int64_t)h * D + i, p2 = p1 + half;
            const float a = pw_ld(x, xh, p1), b = pw_ld(x, xh, p2);
            pw_st(x, xh, p1, a * cs - b * sn);
            pw_st(x, xh, p2, b * cs + a * sn);
        }
    }
}
static void rope(float *x, uint16_t *xh, int64_t B, int T, int nh, int D, int64_t row_stride,
                 const float *cos_t, const float *sin_t, int pos0, float sign) {
    if (B <= 0 || T <= 0 || nh <= 0 || D / 2 <= 0) return;
    CU_LAUNCH(k_rope, row_blocks(B * T), nh * (D / 2) >= 256 ? 256 : 128, 0, x, xh, B * T, T, nh,
              D, row_stride, cos_t, sin_t, pos0, sign);
}
static void cu_rope_forward(float *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                            const float *cos_t, const float *sin_t, int pos0) {
    rope(x, NULL, B, T, nh, D, row_stride, cos_t, sin_t, pos0, 1.0f);
}
static void cu_rope_backward(float *dx, int64_t B, int T, int nh, int D, int64_t row_stride,
                             const float *cos_t, const float *sin_t, int pos0) {
    rope(dx, NULL, B, T, nh, D, row_stride, cos_t, sin_t, pos0, -1.0f);
}
static void cu_bf16_rope_forward(uint16_t *x, int64_t B, int T, int nh, int D,
                                 int64_t row_stride, const float *cos_t, const float *sin_t,
                                 int pos0) {
    rope(NULL, x, B, T, nh, D, row_stride, cos_t, sin_t, pos0, 1.0f);
}

/* ---- embeddings --------------------------------------------------------------------------
 * Forward: one block per row (threads over C). shard: the cpu's shard form, (e or 0) + (p or
 * 0); else e + p, or e copied when wpe is NULL. */
__global__ void k_embed_fwd(float *out, uint16_t *outh, const int32_t *tokens, const float *wte,
                            int64_t v0, int64_t Vl, int shard, const float *wpe, int64_t rows,
                            int T, int C, int pos0) {
    PW_BLOCK_ROWS(r, rows) {
        const int64_t v = (int64_t)tokens[r] - v0;
        const float *e = v >= 0 && v < Vl ? wte + v * C : NULL;
        const float *p = wpe ? wpe + (int64_t)(pos0 + r % T) * C : NULL;
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            float y;
            if (shard) y = (e ? e[i] : 0.0f) + (p ? p[i] : 0.0f);
            else y = p ? e[i] + p[i] : e[i];
            pw_st(out, outh, r * C + i, y);
        }
    }
}
static void embed_fwd(float *out, uint16_t *outh, const int32_t *tokens, const float *wte,
                      int64_t v0, int64_t Vl, int shard, const float *wpe, int B, int T, int C,
                      int pos0) {
    const int64_t rows = (int64_t)B * T;
    if (rows <= 0 || C <= 0) return;
    CU_LAUNCH(k_embed_fwd, row_blocks(rows), C >= 256 ? 256 : 128, 0, out, outh, tokens, wte, v0,
              Vl, shard, wpe, rows, T, C, pos0);
}
static void cu_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                                 const float *wpe, int B, int T, int C, int pos0) {
    embed_fwd(out, NULL, tokens, wte, 0, (int64_t)INT_MAX + 1, 0, wpe, B, T, C, pos0);
}
static void cu_embedding_shard_forward(float *out, const int32_t *tokens, const float *wte,
                                       int v0, int Vl, const float *wpe, int B, int T, int C,
                                       int pos0) {
    embed_fwd(out, NULL, tokens, wte, v0, Vl, 1, wpe, B, T, C, pos0);
}
static void cu_bf16_embedding_forward(uint16_t *out, const int32_t *tokens, const float *wte,
                                      const float *wpe, int B, int T, int C, int pos0) {
    embed_fwd(NULL, out, tokens, wte, 0, (int64_t)INT_MAX + 1, 0, wpe, B, T, C, pos0);
}

/* Backward into the token table, deterministic and without atomics: block (column slice of
 * EMB_COLS, partition p of P) owns the table rows v with v % P == p in its columns. It walks
 * the rows of tokens in order, a tile of EMB_COLS at a time: each thread classifies one row of
 * the tile, a block-wide prefix count (warp shuffles, then the warps' totals) packs the tile's
 * rows this block owns into shared memory in row order, and each thread adds their dout into
 * its column. So each element of dwte gets its rows' dout added in row order, by one thread:
 * the cpu's sums, bit for bit. A run of rows with the same token stays in a register. */
enum { EMB_COLS = 128, EMB_WARPS = EMB_COLS / 32 };
__global__ void k_embed_bwd_wte(float *dwte, const float *dout, const int32_t *tokens,
                                int64_t v0, int64_t Vl, int64_t rows, int C, int P) {
    __shared__ int32_t sv[EMB_COLS], sr[EMB_COLS], sw[EMB_WARPS];
    const int t = threadIdx.x, lane = t & 31, wp = t >> 5;
    const int col = blockIdx.x * EMB_COLS + t, p = blockIdx.y;
    int64_t cur = -1;
    float acc = 0.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += EMB_COLS) {
        const int64_t r = r0 + t;
        int32_t mine = -1;
        if (r < rows) {
            const int64_t v = (int64_t)tokens[r] - v0;
            if (v >= 0 && v < Vl && v % P == p) mine = (int32_t)v;
        }
        /* inclusive count of owned rows up to this lane */
        int inc = mine >= 0;
        for (int dd = 1; dd < 32; dd <<= 1) {
            const int y = __shfl_sync(0xffffffffu, inc, lane >= dd ? lane - dd : lane);
            if (lane >= dd) inc += y;
        }
        __syncthreads(); /* the previous tile's sv, sr, sw have been read by every thread */
        if (lane == 31) sw[wp] = inc;
        __syncthreads();
        int off = 0, tot = 0;
        for (int k = 0; k < EMB_WARPS; k++) {
            if (k < wp) off += sw[k];
            tot += sw[k];
        }
        if (mine >= 0) sv[off + inc - 1] = mine, sr[off + inc - 1] = t;
        __syncthreads();
        if (col < C)
            for (int k = 0; k < tot; k++) {
                const int64_t v = sv[k];
                if (v != cur) {
                    if (cur >= 0) dwte[cur * C + col] = acc;
                    cur = v;
                    acc = dwte[v * C + col];
                }
                acc += dout[(r0 + sr[k]) * C + col];
            }
    }
    if (cur >= 0 && col < C) dwte[cur * C + col] = acc;
}
/* into the position table: one thread per (t, column), the batch rows in order */
__global__ void k_embed_bwd_wpe(float *dwpe, const float *dout, int B, int T, int C, int pos0) {
    PW_LOOP(e, (int64_t)T * C) {
        const int64_t t = e / C, i = e - t * C;
        float *d = dwpe + (pos0 + t) * C + i;
        float acc = *d;
        for (int b = 0; b < B; b++) acc += dout[((int64_t)b * T + t) * C + i];
        *d = acc;
    }
}
static void embed_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                      int64_t v0, int64_t Vl, int B, int T, int C, int pos0) {
    const int64_t rows = (int64_t)B * T;
    if (rows <= 0 || C <= 0) return;
    if (dwte && Vl > 0) {
        /* about 512 blocks (a few per SM), no more partitions than rows */
        const int slices = (C + EMB_COLS - 1) / EMB_COLS;
        int64_t P = 512 / slices;
        if (P > 256) P = 256;
        if (P > rows) P = rows;
        if (P < 1) P = 1;
        CU_LAUNCH(k_embed_bwd_wte, dim3((unsigned)slices, (unsigned)P), EMB_COLS, 0, dwte, dout,
                  tokens, v0, Vl, rows, C, (int)P);
    }
    if (dwpe)
        CU_LAUNCH(k_embed_bwd_wpe, ew_grid((int64_t)T * C), EW_THREADS, 0, dwpe, dout, B, T, C,
                  pos0);
}
static void cu_embedding_backward(float *dwte, float *dwpe, const float *dout,
                                  const int32_t *tokens, int B, int T, int C, int pos0) {
    embed_bwd(dwte, dwpe, dout, tokens, 0, (int64_t)INT_MAX + 1, B, T, C, pos0);
}
static void cu_embedding_shard_backward(float *dwte, float *dwpe, const float *dout,
                                        const int32_t *tokens, int v0, int Vl, int B, int T,
                                        int C, int pos0) {
    embed_bwd(dwte, dwpe, dout, tokens, v0, Vl, B, T, C, pos0);
}

/* ---- mean pooling --------------------------------------------------------------------- */

/* one thread per (b, column): the rows summed in order from 0, then times 1/T (pool.c) */
__global__ void k_mean_pool_fwd(float *out, const float *inp, int B, int T, int C) {
    const float inv = 1.0f / (float)T;
    PW_LOOP(e, (int64_t)B * C) {
        const int64_t b = e / C, c = e - b * C;
        float acc = 0.0f;
        for (int t = 0; t < T; t++) acc += inp[(b * T + t) * C + c];
        out[e] = acc * inv;
    }
}
__global__ void k_mean_pool_bwd(float *dinp, const float *dout, int B, int T, int C) {
    const float inv = 1.0f / (float)T;
    PW_LOOP(e, (int64_t)B * T * C) {
        const int64_t bt = e / C, c = e - bt * C;
        dinp[e] += dout[(bt / T) * C + c] * inv;
    }
}
static void cu_mean_pool_forward(float *out, const float *inp, int B, int T, int C) {
    if (B > 0 && C > 0)
        CU_LAUNCH(k_mean_pool_fwd, ew_grid((int64_t)B * C), EW_THREADS, 0, out, inp, B, T, C);
}
static void cu_mean_pool_backward(float *dinp, const float *dout, int B, int T, int C) {
    if (B > 0 && T > 0 && C > 0)
        CU_LAUNCH(k_mean_pool_bwd, ew_grid((int64_t)B * T * C), EW_THREADS, 0, dinp, dout, B, T,
                  C);
}

void cu_fill_pointwise(loom_backend *t) {
    t->layernorm_forward = cu_layernorm_forward;
    t->layernorm_backward = cu_layernorm_backward;
    t->rmsnorm_forward = cu_rmsnorm_forward;
    t->rmsnorm_backward = cu_rmsnorm_backward;
    t->gelu_forward = cu_gelu_forward;
    t->gelu_backward = cu_gelu_backward;
    t->gelu_backward_set = cu_gelu_backward_set;
    t->swiglu_forward = cu_swiglu_forward;
    t->swiglu_backward = cu_swiglu_backward;
    t->geglu_forward = cu_geglu_forward;
    t->geglu_backward = cu_geglu_backward;
    t->softcap_forward = cu_softcap_forward;
    t->rope_tables = cu_rope_tables;
    t->rope_tables_freq = cu_rope_tables_freq;
    t->rope_forward = cu_rope_forward;
    t->rope_backward = cu_rope_backward;
    t->headnorm_forward = cu_headnorm_forward;
    t->headnorm_backward = cu_headnorm_backward;
    t->rownorm_sums = cu_rownorm_sums;
    t->rownorm_forward = cu_rownorm_forward;
    t->rownorm_backward = cu_rownorm_backward;
    t->embedding_forward = cu_embedding_forward;
    t->embedding_backward = cu_embedding_backward;
    t->embedding_shard_forward = cu_embedding_shard_forward;
    t->embedding_shard_backward = cu_embedding_shard_backward;
    t->mean_pool_forward = cu_mean_pool_forward;
    t->mean_pool_backward = cu_mean_pool_backward;
    t->residual_forward = cu_residual_forward;
    t->bf16_layernorm_forward = cu_bf16_layernorm_forward;
    t->bf16_layernorm_backward = cu_bf16_layernorm_backward;
    t->bf16_rmsnorm_forward = cu_bf16_rmsnorm_forward;
    t->bf16_rmsnorm_backward = cu_bf16_rmsnorm_backward;
    t->bf16_gelu_forward = cu_bf16_gelu_forward;
    t->bf16_gelu_backward = cu_bf16_gelu_backward;
    t->bf16_glu_forward = cu_bf16_glu_forward;
    t->bf16_glu_backward = cu_bf16_glu_backward;
    t->bf16_residual_forward = cu_bf16_residual_forward;
    t->bf16_rope_forward = cu_bf16_rope_forward;
    t->bf16_embedding_forward = cu_bf16_embedding_forward;
}

} // namespace LOOM_CU_NS
