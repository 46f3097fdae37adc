/* The CUDA backend's loss and optimizer ops: cross-entropy (whole rows, vocab-parallel shards,
 * bf16 logits, soft-capped logits), AdamW (fp32, and fp32 masters writing their bf16 copies),
 * the sum of squares the gradient norm reads, scale_inplace. The semantics are the cpu
 * kernels' (src/kernels/crossentropy.c, adamw.c; include/loom/kernels.h), op by op;
 * cu_common.cuh is the dialect; docs/gpu.md "Loss and optimizer ops" the design. */
#include "cu_common.cuh"

#include <pthread.h>

extern "C" {
#include "loom/base.h"
}

namespace LOOM_CU_NS {

/* ---- cross-entropy: one block per row ---------------------------------------------------
 * A row's log-sum-exp is one pass over its V logits: each thread keeps a running max m and
 * s = sum of exp(x - m) over its strided part (the sum in double, as the cpu kernel's; each
 * term exp(x - m) in fp32, as the cpu's loom_expf), rescaling s when m grows (16 bytes of
 * loads in flight per thread: 4 floats or 8 bf16 a trip); the block then
 * takes the max M of the threads' m and sums s * exp(m - M) in double, in a fixed order.
 * A backward reads the row a second time to write the gradient (each thread the elements it
 * read in the first pass, so no barrier is needed between them). V is any size (a loop). */
enum { CE_THREADS = 256, EW_THREADS = 256, EW_MAX_BLOCKS = 4096 };

static __device__ __forceinline__ float ce_ld(const float *x, int i) { return x[i]; }
static __device__ __forceinline__ float ce_ld(const uint16_t *x, int i) { return cu_bf16(x[i]); }
static __device__ __forceinline__ void ce_st(float *x, int i, float d) { x[i] = d; }
static __device__ __forceinline__ void ce_st(uint16_t *x, int i, float d) { x[i] = cu_round(d); }

/* one logit into a thread's running (m, s): -inf logits add nothing (exp(-inf) = 0, also
 * while m is still -inf), NaN ones make s NaN (as on the cpu, a NaN logit gives a NaN loss) */
static __device__ __forceinline__ void ce_push(float &m, double &s, float x) {
    if (x > m) {
        s = s * exp((double)m - (double)x) + 1.0;
        m = x;
    } else if (x != -INFINITY) {
        s += (double)expf(x - m);
    }
}

/* loads in flight per thread in a row loop: 16 bytes (4 floats, 8 bf16) */
template <class T> struct ce_unroll {
    enum { U = 16 / sizeof(T) };
};

/* the row's (M, S = sum of exp(x - M)) from every thread's (m, s); every thread gets both */
template <class T>
static __device__ __forceinline__ double ce_row_lse(const T *x, int V, float *M, float *shm,
                                                    double *shs) {
    enum { U = ce_unroll<T>::U };
    const int B = (int)blockDim.x;
    float m = -INFINITY;
    double s = 0.0;
    int i = (int)threadIdx.x;
    for (; i + (U - 1) * B < V; i += U * B) {
        float a[U];
        for (int u = 0; u < U; u++) a[u] = ce_ld(x, i + u * B);
        for (int u = 0; u < U; u++) ce_push(m, s, a[u]);
    }
    for (; i < V; i += B) ce_push(m, s, ce_ld(x, i));
    const float mx = cu_block_max(m, shm);
    /* s == 0: nothing but -inf seen (exp(m - mx) could be exp(-inf + inf)) */
    const double t = s == 0.0 ? 0.0 : s * exp((double)m - (double)mx);
    *M = mx;
    return cu_block_sum_d(t, shs);
}

/* losses[n] = log(S) + M - x[t] in double (0 where t < 0; NaN where t >= V, a target the
 * row does not have: the cpu kernel would read past the row) */
template <class T>
__global__ void k_ce_forward(float *losses, const T *logits, const int32_t *targets, int V) {
    __shared__ float shm[32];
    __shared__ double shs[32];
    const int64_t n = blockIdx.x;
    const int32_t t = targets[n];
    if (t < 0) {
        if (threadIdx.x == 0) losses[n] = 0.0f;
        return;
    }
    const T *x = logits + n * V;
    float M;
    const double S = ce_row_lse(x, V, &M, shm, shs);
    if (threadIdx.x == 0)
        losses[n] = t < V ? (float)(log(S) + (double)M - (double)ce_ld(x, t)) : NAN;
}

/* one gradient element: d = exp(y - M) * k, minus dscale at the target column tl (none when
 * tl is outside [0, V)), times 1 - (y / cap)^2 when capped (y the capped logit) */
static __device__ __forceinline__ float ce_grad(float y, int i, int tl, float M, float k,
                                                float dscale, int capped, float cap) {
    float d = expf(y - M) * k;
    if (i == tl) d -= dscale;
    if (capped) {
        const float c = y / cap;
        d *= 1.0f - c * c;
    }
    return d;
}

/* a row's gradient in place, each element read before it is overwritten (by the same
 * thread) */
template <class T>
static __device__ __forceinline__ void ce_grad_row(T *x, int V, int tl, float M, float k,
                                                   float dscale, int capped, float cap) {
    enum { U = ce_unroll<T>::U };
    const int B = (int)blockDim.x;
    int i = (int)threadIdx.x;
    for (; i + (U - 1) * B < V; i += U * B) {
        float y[U];
        for (int u = 0; u < U; u++) y[u] = ce_ld(x, i + u * B);
        for (int u = 0; u < U; u++)
            ce_st(x, i + u * B, ce_grad(y[u], i + u * B, tl, M, k, dscale, capped, cap));
    }
    for (; i < V; i += B) ce_st(x, i, ce_grad(ce_ld(x, i), i, tl, M, k, dscale, capped, cap));
}

template <class T> static __device__ __forceinline__ void ce_zero_row(T *x, int V, float v) {
    for (int i = (int)threadIdx.x; i < V; i += (int)blockDim.x) ce_st(x, i, v);
}

/* crossentropy_softmax_backward / _softcap_backward / bf16_crossentropy_backward: k =
 * (float)(1 / S) * dscale as the cpu's; rows with t < 0 become 0, rows with t >= V NaN */
template <class T>
__global__ void k_ce_backward(T *logits, const int32_t *targets, int V, float dscale0,
                              const float *rw, int capped, float cap) {
    __shared__ float shm[32];
    __shared__ double shs[32];
    const int64_t n = blockIdx.x;
    const int32_t t = targets[n];
    T *x = logits + n * V;
    if (t < 0 || t >= V) {
        ce_zero_row(x, V, t < 0 ? 0.0f : NAN);
        return;
    }
    const float dscale = rw ? rw[n] : dscale0;
    float M;
    const double S = ce_row_lse(x, V, &M, shm, shs);
    const float k = (float)(1.0 / S) * dscale;
    ce_grad_row(x, V, t, M, k, dscale, capped, cap);
}

/* vocab-parallel pieces: logits (N, Vl) are columns [v0, v0 + Vl) */
__global__ void k_ce_shard_max(float *mx, const float *logits, int Vl) {
    __shared__ float shm[32];
    const int64_t n = blockIdx.x;
    const float *x = logits + n * Vl;
    const int B = (int)blockDim.x;
    float m = -INFINITY;
    int i = (int)threadIdx.x;
    for (; i + 3 * B < Vl; i += 4 * B) {
        const float a = x[i], b = x[i + B], c = x[i + 2 * B], d = x[i + 3 * B];
        m = a > m ? a : m, m = b > m ? b : m, m = c > m ? c : m, m = d > m ? d : m;
    }
    for (; i < Vl; i += B) m = x[i] > m ? x[i] : m;
    m = cu_block_max(m, shm);
    if (threadIdx.x == 0) mx[n] = m;
}

__global__ void k_ce_shard_sums(float *sums, const float *logits, const float *mx,
                                const int32_t *targets, int v0, int Vl) {
    __shared__ double shs[32];
    const int64_t n = blockIdx.x;
    const int32_t t = targets[n];
    if (t < 0) {
        if (threadIdx.x == 0) sums[2 * n] = sums[2 * n + 1] = 0.0f;
        return;
    }
    const float *x = logits + n * Vl;
    const float m = mx[n];
    const int B = (int)blockDim.x;
    double s = 0.0;
    int i = (int)threadIdx.x;
    for (; i + 3 * B < Vl; i += 4 * B) {
        const float a = x[i], b = x[i + B], c = x[i + 2 * B], d = x[i + 3 * B];
        s += (double)expf(a - m), s += (double)expf(b - m), s += (double)expf(c - m),
            s += (double)expf(d - m);
    }
    for (; i < Vl; i += B) s += (double)expf(x[i] - m);
    s = cu_block_sum_d(s, shs);
    if (threadIdx.x == 0) {
        sums[2 * n] = (float)s;
        sums[2 * n + 1] = t >= v0 && t - v0 < Vl ? x[t - v0] : 0.0f;
    }
}

/* the shard's gradient from the whole vocabulary's max and sums: no reduction, the row's
 * pass alone */
__global__ void k_ce_shard_backward(float *logits, const int32_t *targets, const float *mx,
                                    const float *sums, int v0, int Vl, float dscale0,
                                    float cap, const float *rw) {
    const int64_t n = blockIdx.x;
    const int32_t t = targets[n];
    float *x = logits + n * Vl;
    if (t < 0) {
        ce_zero_row(x, Vl, 0.0f);
        return;
    }
    const float dscale = rw ? rw[n] : dscale0;
    const float k = (float)(1.0 / (double)sums[2 * n]) * dscale;
    /* t - v0 outside [0, Vl): the target is another shard's column */
    ce_grad_row(x, Vl, t - v0, mx[n], k, dscale, cap > 0.0f, cap);
}

/* the grid of a row-per-block launch: N rows (a grid's x stays below 2^31: more rows is the
 * caller's error, named) */
static unsigned ce_grid(int64_t N, const char *op) {
    if (N > 0x7fffffffLL)
        loom_panic(__FILE__, __LINE__, "cuda %s: %lld rows, more than one launch takes", op,
                   (long long)N);
    return (unsigned)N;
}

static void ce_forward(float *losses, const float *logits, const int32_t *targets, int64_t N,
                       int V) {
    if (N > 0)
        CU_LAUNCH(k_ce_forward<float>, ce_grid(N, "crossentropy_forward"), CE_THREADS, 0,
                  losses, logits, targets, V);
}
static void ce_softmax_backward(float *logits, const int32_t *targets, int64_t N, int V,
                                float dscale, const float *rw) {
    if (N > 0)
        CU_LAUNCH(k_ce_backward<float>, ce_grid(N, "crossentropy_softmax_backward"), CE_THREADS,
                  0, logits, targets, V, dscale, rw, 0, 0.0f);
}
static void ce_softcap_backward(float *logits, const int32_t *targets, int64_t N, int V,
                                float dscale, float cap, const float *rw) {
    if (N > 0)
        CU_LAUNCH(k_ce_backward<float>, ce_grid(N, "crossentropy_softcap_backward"), CE_THREADS,
                  0, logits, targets, V, dscale, rw, 1, cap);
}
static void bf16_ce_forward(float *losses, const uint16_t *logits, const int32_t *targets,
                            int64_t N, int V) {
    if (N > 0)
        CU_LAUNCH(k_ce_forward<uint16_t>, ce_grid(N, "bf16_crossentropy_forward"), CE_THREADS,
                  0, losses, logits, targets, V);
}
static void bf16_ce_backward(uint16_t *logits, const int32_t *targets, int64_t N, int V,
                             float dscale, const float *rw) {
    if (N > 0)
        CU_LAUNCH(k_ce_backward<uint16_t>, ce_grid(N, "bf16_crossentropy_backward"),
                  CE_THREADS, 0, logits, targets, V, dscale, rw, 0, 0.0f);
}
static void ce_shard_max(float *mx, const float *logits, int64_t N, int Vl) {
    if (N > 0)
        CU_LAUNCH(k_ce_shard_max, ce_grid(N, "crossentropy_shard_max"), CE_THREADS, 0, mx,
                  logits, Vl);
}
static void ce_shard_sums(float *sums, const float *logits, const float *mx,
                          const int32_t *targets, int v0, int64_t N, int Vl) {
    if (N > 0)
        CU_LAUNCH(k_ce_shard_sums, ce_grid(N, "crossentropy_shard_sums"), CE_THREADS, 0, sums,
                  logits, mx, targets, v0, Vl);
}
static void ce_shard_backward(float *logits, const int32_t *targets, const float *mx,
                              const float *sums, int v0, int64_t N, int Vl, float dscale,
                              const float *rw) {
    if (N > 0)
        CU_LAUNCH(k_ce_shard_backward, ce_grid(N, "crossentropy_shard_backward"), CE_THREADS, 0,
                  logits, targets, mx, sums, v0, Vl, dscale, 0.0f, rw);
}
static void ce_shard_softcap_backward(float *logits, const int32_t *targets, const float *mx,
                                      const float *sums, int v0, int64_t N, int Vl,
                                      float dscale, float cap, const float *rw) {
    if (N > 0)
        CU_LAUNCH(k_ce_shard_backward, ce_grid(N, "crossentropy_shard_softcap_backward"),
                  CE_THREADS, 0, logits, targets, mx, sums, v0, Vl, dscale, cap, rw);
}

/* ---- AdamW: elementwise ------------------------------------------------------------------
 * The cpu kernel's formula, operation for operation (src/kernels/adamw.c): the step's scalars
 * in double on the host, rounded to float as the cpu's; per element the grad_scale product
 * rounded to float first (a multiply the compiler may not fuse into the subtraction that
 * follows: nvcc would contract it into an FMA, hence __fmul_rn), then the three FMAs the cpu
 * writes where its level has FMA, IEEE division and square root (nvcc's defaults). So the bits
 * are those of the cpu's avx2 / avx512 levels; its x86-64 level, without FMA, is ~1 ulp away. */

struct adamw_k {
    float beta2, eps, decay, w1, w2, step_size, bc2_sqrt, grad_scale;
};

__global__ void k_adamw(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t n,
                        adamw_k c) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float gi = __fmul_rn(g[i], c.grad_scale);
        const float pi = p[i] * c.decay;
        const float m0 = m[i];
        const float mi = fmaf(gi - m0, c.w1, m0);
        const float vi = fmaf(v[i], c.beta2, c.w2 * gi * gi);
        const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
        const float pn = fmaf(-(mi / denom), c.step_size, pi);
        p[i] = pn;
        if (pb) pb[i] = cu_round(pn);
        m[i] = mi;
        v[i] = vi;
    }
}

static unsigned ew_grid(int64_t n) {
    const unsigned b = cu_blocks(n, EW_THREADS);
    return b < (unsigned)EW_MAX_BLOCKS ? b : (unsigned)EW_MAX_BLOCKS;
}

static void adamw_launch(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         int64_t step, float grad_scale) {
    if (n <= 0) return;
    adamw_k c;
    c.beta2 = beta2;
    c.eps = eps;
    c.decay = (float)(1.0 - (double)lr * (double)weight_decay);
    c.w1 = (float)(1.0 - (double)beta1);
    c.w2 = (float)(1.0 - (double)beta2);
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    c.step_size = (float)((double)lr / bc1);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.grad_scale = grad_scale;
    CU_LAUNCH(k_adamw, ew_grid(n), EW_THREADS, 0, p, pb, g, m, v, n, c);
}
static void adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int64_t step,
                         float grad_scale) {
    adamw_launch(p, NULL, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
}
static void adamw_update_bf16(float *p, uint16_t *pb, const float *g, float *m, float *v,
                              int64_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int64_t step, float grad_scale) {
    adamw_launch(p, pb, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
}

__global__ void k_scale(float *x, int64_t n, float s) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}
static void scale_inplace(float *x, int64_t n, float s) {
    if (n > 0) CU_LAUNCH(k_scale, ew_grid(n), EW_THREADS, 0, x, n, s);
}

/* ---- sum of squares: two passes, deterministic ------------------------------------------
 * Pass 1: a grid whose size depends on n only (at most SS_BLOCKS blocks) sums x^2 in double,
 * each thread over a fixed grid stride, each block in cu_block_sum_d's fixed tree, into one
 * partial per block; pass 2: one block sums the partials in a fixed order. The same n gives
 * the same bits run to run (and on any GPU); the host reads the 8-byte result back (the
 * op's one copy). The partials live in a scratch buffer allocated at the first call and kept
 * for the process; a lock keeps two host threads' calls from sharing it at once. */
enum { SS_THREADS = 256, SS_PER_THREAD = 16, SS_BLOCKS = 1024 };

__global__ void k_ss_partial(double *part, const float *x, int64_t n) {
    __shared__ double shs[32];
    double s = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const double xi = (double)x[i];
        s += xi * xi;
    }
    s = cu_block_sum_d(s, shs);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_ss_final(double *out, const double *part, int nb) {
    __shared__ double shs[32];
    double s = 0.0;
    for (int i = (int)threadIdx.x; i < nb; i += (int)blockDim.x) s += part[i];
    s = cu_block_sum_d(s, shs);
    if (threadIdx.x == 0) out[0] = s;
}

static pthread_mutex_t g_ss_lock = PTHREAD_MUTEX_INITIALIZER;
static double *g_ss_buf; /* SS_BLOCKS partials, then the result */

static double sum_squares(const float *x, int64_t n) {
    if (n <= 0) return 0.0;
    cu_enter();
    const int64_t per = (int64_t)SS_THREADS * SS_PER_THREAD;
    const int64_t want = (n + per - 1) / per;
    const int nb = want < SS_BLOCKS ? (int)want : SS_BLOCKS;
    double r = 0.0;
    pthread_mutex_lock(&g_ss_lock);
    if (!g_ss_buf) CU_CHECK(cudaMalloc((void **)&g_ss_buf, (SS_BLOCKS + 1) * sizeof(double)));
    CU_LAUNCH(k_ss_partial, (unsigned)nb, SS_THREADS, 0, g_ss_buf, x, n);
    CU_LAUNCH(k_ss_final, 1, SS_THREADS, 0, g_ss_buf + SS_BLOCKS, g_ss_buf, nb);
    CU_CHECK(cudaMemcpyAsync(&r, g_ss_buf + SS_BLOCKS, sizeof r, cudaMemcpyDeviceToHost,
                             cu_stream()));
    CU_CHECK(cudaStreamSynchronize(cu_stream()));
    pthread_mutex_unlock(&g_ss_lock);
    return r;
}

void cu_fill_loss(loom_backend *t) {
    t->crossentropy_forward = ce_forward;
    t->crossentropy_softmax_backward = ce_softmax_backward;
    t->crossentropy_softcap_backward = ce_softcap_backward;
    t->crossentropy_shard_max = ce_shard_max;
    t->crossentropy_shard_sums = ce_shard_sums;
    t->crossentropy_shard_backward = ce_shard_backward;
    t->crossentropy_shard_softcap_backward = ce_shard_softcap_backward;
    t->bf16_crossentropy_forward = bf16_ce_forward;
    t->bf16_crossentropy_backward = bf16_ce_backward;
    t->adamw_update = adamw_update;
    t->adamw_update_bf16 = adamw_update_bf16;
    t->sum_squares = sum_squares;
    t->scale_inplace = scale_inplace;
}

} // namespace LOOM_CU_NS
