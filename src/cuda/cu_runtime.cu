/* The CUDA backend's runtime: the device this rank uses, the one stream, errors, and the
 * table's memory ops (allocation, copies, the small reductions whose results stay on the
 * device). docs/gpu.md. */
#include "cu_common.cuh"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "loom/base.h"
}

namespace LOOM_CU_NS {

static int g_dev = -1;
static cudaStream_t g_stream;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_init_err[512];
static __thread int t_dev_set;

void cu_fail(const char *file, int line, const char *what, const char *detail) {
    loom_panic(file, line, "%s: %s (device %d)", what, detail, g_dev);
}

#ifndef LOOM_CUDA_EMU
/* the rank on this node: Open MPI's, Slurm's, MPICH's, or torchrun-style LOCAL_RANK */
static int local_rank(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                 "MPI_LOCALRANKID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}
static int local_size(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE",
                                 "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v && atoi(v) > 0) return atoi(v);
    }
    return 1;
}
#endif

static void init_once(void) {
#ifdef LOOM_CUDA_EMU
    g_dev = 0;
    g_stream = NULL;
#else
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(g_init_err, sizeof g_init_err,
                 "model.backend cuda: no CUDA device is visible (%s; CUDA_VISIBLE_DEVICES=%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices",
                 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
        return;
    }
    const int lr = local_rank(), ls = local_size();
    const char *share = getenv("LOOM_CUDA_SHARE_GPU");
    if (ls > n && !(share && !strcmp(share, "1"))) {
        snprintf(g_init_err, sizeof g_init_err,
                 "model.backend cuda: %d ranks on this node but %d GPU%s visible: one rank per "
                 "GPU (or LOOM_CUDA_SHARE_GPU=1 to share, communication then staged through "
                 "host memory: docs/gpu.md)",
                 ls, n, n == 1 ? " is" : "s are");
        return;
    }
    g_dev = lr % n;
    e = cudaSetDevice(g_dev);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(g_init_err, sizeof g_init_err, "model.backend cuda: device %d: %s", g_dev,
                 cudaGetErrorString(e));
        g_dev = -1;
        return;
    }
    t_dev_set = 1;
#endif
}

int cu_init(char *why, size_t n) {
    pthread_once(&g_once, init_once);
    if (g_init_err[0]) {
        if (why && n) snprintf(why, n, "%s", g_init_err);
        return -1;
    }
    return 0;
}

/* every host thread that issues work selects the device first (cudaSetDevice is per
 * thread) */
void cu_enter(void) {
    if (t_dev_set) return;
    char why[512];
    if (cu_init(why, sizeof why)) loom_panic(__FILE__, __LINE__, "%s", why);
#ifndef LOOM_CUDA_EMU
    CU_CHECK(cudaSetDevice(g_dev));
#endif
    t_dev_set = 1;
}

/* "device 0 of 1: NVIDIA H200 (sm_90, 139.8 GiB)", or the reason there is none (loom
 * version; the gpu tests' skip reason); 0 when a device is usable */
int cu_describe(char *buf, size_t n) {
    char why[512];
    if (cu_init(why, sizeof why)) {
        snprintf(buf, n, "%s", why);
        return -1;
    }
#ifdef LOOM_CUDA_EMU
    snprintf(buf, n, "the emulator (src/cuda/emu: the kernels on the CPU)");
#else
    int count = 0;
    cudaDeviceProp p;
    CU_CHECK(cudaGetDeviceCount(&count));
    CU_CHECK(cudaGetDeviceProperties(&p, g_dev));
    snprintf(buf, n, "device %d of %d: %s (sm_%d%d, %.1f GiB, %d SMs)", g_dev, count, p.name,
             p.major, p.minor, (double)p.totalGlobalMem / 1073741824.0, p.multiProcessorCount);
#endif
    return 0;
}

int cu_device_name(char *buf, size_t n) {
    if (cu_init(NULL, 0)) return -1;
#ifdef LOOM_CUDA_EMU
    snprintf(buf, n, "cuda-emu");
#else
    cudaDeviceProp p;
    CU_CHECK(cudaGetDeviceProperties(&p, g_dev));
    snprintf(buf, n, "%s", p.name);
#endif
    return 0;
}

int cu_mem_info(size_t *used, size_t *total) {
    *used = *total = 0;
    if (cu_init(NULL, 0)) return -1;
#ifdef LOOM_CUDA_EMU
    return -1;
#else
    cu_enter();
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
    *used = tot - fr;
    *total = tot;
    return 0;
#endif
}

cudaStream_t cu_stream(void) {
    cu_enter();
    return g_stream;
}
int cu_device(void) { return g_dev; }

void cu_after_launch(const char *kernel) {
#ifndef LOOM_CUDA_EMU
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) cu_fail(__FILE__, __LINE__, kernel, cudaGetErrorString(e));
    static int sync = -1;
    if (sync < 0) sync = getenv("LOOM_CUDA_SYNC") && !strcmp(getenv("LOOM_CUDA_SYNC"), "1");
    if (sync) {
        e = cudaStreamSynchronize(g_stream);
        if (e != cudaSuccess) cu_fail(__FILE__, __LINE__, kernel, cudaGetErrorString(e));
    }
#else
    (void)kernel;
#endif
}

/* ---- memory ---------------------------------------------------------------------------- */

static void *cu_alloc(size_t bytes, int flags) {
    cu_enter();
    void *p = NULL;
    const size_t n = bytes ? (bytes + 255) / 256 * 256 : 256;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess || !p) {
#ifndef LOOM_CUDA_EMU
        size_t fr = 0, tot = 0;
        (void)cudaGetLastError();
        (void)cudaMemGetInfo(&fr, &tot);
        loom_panic(__FILE__, __LINE__,
                   "cuda: out of device memory allocating %.1f MiB on device %d (%.1f MiB "
                   "free of %.1f MiB): the model, its optimizer state and activations do not "
                   "fit (loom plan predicts the arenas; docs/gpu.md)",
                   (double)bytes / 1048576.0, g_dev, (double)fr / 1048576.0,
                   (double)tot / 1048576.0);
#else
        loom_panic(__FILE__, __LINE__, "cuda-emu: out of memory allocating %zu bytes", bytes);
#endif
    }
    if (!(flags & LOOM_MEM_STREAMED)) CU_CHECK(cudaMemsetAsync(p, 0, n, g_stream));
#ifdef LOOM_CUDA_EMU
    else memset(p, 0xff, n); /* the caller writes every byte: show it when it does not */
#endif
    return p;
}
static void cu_free(void *p) {
    if (!p) return;
    cu_enter();
    /* cudaFree waits for the device; the buffer may be in use by queued ops until then */
    CU_CHECK(cudaFree(p));
}
static void cu_h2d(void *dst, const void *src, size_t n) {
    if (!n) return;
    cu_enter();
    CU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, g_stream));
    CU_CHECK(cudaStreamSynchronize(g_stream)); /* src may be reused as soon as we return */
}
static void cu_d2h(void *dst, const void *src, size_t n) {
    if (!n) return;
    cu_enter();
    CU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, g_stream));
    CU_CHECK(cudaStreamSynchronize(g_stream));
}
static void cu_d2d(void *dst, const void *src, size_t n) {
    if (!n) return;
    cu_enter();
    CU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, g_stream));
}
static void cu_set(void *dst, int byte, size_t n) {
    if (!n) return;
    cu_enter();
    CU_CHECK(cudaMemsetAsync(dst, byte, n, g_stream));
}
static void cu_d2d_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows) {
    if (!width || !rows) return;
    cu_enter();
    CU_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice,
                               g_stream));
}
static void cu_release(void *p, size_t n) { (void)p, (void)n; /* device pages stay */ }
static void cu_sync(void) {
    cu_enter();
    CU_CHECK(cudaStreamSynchronize(g_stream));
}
/* MPI (or host staging) reads the buffers after comm_begin: everything queued must be done */
static void cu_comm_begin(void) { cu_sync(); }
static void cu_comm_end(void) {}

/* ---- small reductions and row ops ---------------------------------------------------- */

/* one block: each thread sums a contiguous run in double, then the fixed tree */
__global__ void k_sum_double(double *out, const float *x, int64_t n) {
    __shared__ double sh[32];
    const int64_t per = (n + blockDim.x - 1) / blockDim.x;
    const int64_t lo = (int64_t)threadIdx.x * per;
    const int64_t hi = lo + per < n ? lo + per : n;
    double s = 0.0;
    for (int64_t i = lo; i < hi; i++) s += (double)x[i];
    s = cu_block_sum_d(s, sh);
    if (threadIdx.x == 0) out[0] = s;
}
static void cu_sum_double(double *out, const float *x, int64_t n) {
    CU_LAUNCH(k_sum_double, 1, 1024, 0, out, x, n);
}

__global__ void k_add_inplace(float *dst, const float *src, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}
static void cu_add_inplace(float *dst, const float *src, int64_t n) {
    if (n > 0) CU_LAUNCH(k_add_inplace, cu_blocks(n, 256), 256, 0, dst, src, n);
}

__global__ void k_ce_shard_losses(float *losses, const float *mx, const float *sums,
                                  const int32_t *targets, int64_t N) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    losses[i] = targets[i] < 0 ? 0.0f
                               : (float)(log((double)sums[2 * i]) + (double)mx[i] -
                                         (double)sums[2 * i + 1]);
}
static void cu_ce_shard_losses(float *losses, const float *mx, const float *sums,
                               const int32_t *targets, int64_t N) {
    if (N > 0) CU_LAUNCH(k_ce_shard_losses, cu_blocks(N, 256), 256, 0, losses, mx, sums, targets, N);
}

__global__ void k_fill(float *x, int64_t n, float v) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}
static void cu_fill_float(float *x, int64_t n, float v) {
    if (n > 0) CU_LAUNCH(k_fill, cu_blocks(n, 256), 256, 0, x, n, v);
}

__global__ void k_add_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                           int64_t width, int64_t rows) {
    const int64_t r = blockIdx.y;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < width;
         j += (int64_t)gridDim.x * blockDim.x)
        dst[r * dst_stride + j] += src[r * src_stride + j];
    (void)rows;
}
static void cu_add_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                        int64_t width, int64_t rows) {
    if (width <= 0 || rows <= 0) return;
    for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
        const int64_t nr = rows - r0 < 65535 ? rows - r0 : 65535;
        dim3 grid(cu_blocks(width, 256) < 64 ? cu_blocks(width, 256) : 64, (unsigned)nr);
        CU_LAUNCH(k_add_rows, grid, 256, 0, dst + r0 * dst_stride, dst_stride,
                  src + r0 * src_stride, src_stride, width, nr);
    }
}

/* one warp per (b, h, i) row */
__global__ void k_lse_merge(float *out, float *lse, const float *blk, const float *blse, int B,
                            int H, int64_t n, int D, int64_t out_bs) {
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)B * H * n) return;
    const int64_t i = row % n, bh = row / n;
    const int h = (int)(bh % H), b = (int)(bh / H);
    const int64_t HD = (int64_t)H * D;
    const float l2 = blse[row], l1 = lse[row];
    __syncwarp(); /* every lane has read lse[row] before lane 0 rewrites it */
    if (l2 == -INFINITY) return;
    float *o = out + (int64_t)b * out_bs + i * HD + (int64_t)h * D;
    const float *p = blk + ((int64_t)b * n + i) * HD + (int64_t)h * D;
    if (l1 == -INFINITY) {
        for (int d = lane; d < D; d += 32) o[d] = p[d];
        if (lane == 0) lse[row] = l2;
        return;
    }
    const float mx = l1 > l2 ? l1 : l2;
    const float l = mx + logf(expf(l1 - mx) + expf(l2 - mx));
    const float w1 = expf(l1 - l), w2 = expf(l2 - l);
    for (int d = lane; d < D; d += 32) o[d] = w1 * o[d] + w2 * p[d];
    if (lane == 0) lse[row] = l;
}
static void cu_attn_lse_merge(float *out, float *lse, const float *blk, const float *blse,
                              int B, int H, int64_t n, int D, int64_t out_bs) {
    const int64_t rows = (int64_t)B * H * n;
    if (rows > 0) CU_LAUNCH(k_lse_merge, cu_blocks(rows, 8), 256, 0, out, lse, blk, blse, B, H, n, D, out_bs);
}

void cu_fill_memory(loom_backend *t) {
    t->host_memory = 0;
    t->mem_alloc = cu_alloc;
    t->mem_free = cu_free;
    t->mem_h2d = cu_h2d;
    t->mem_d2h = cu_d2h;
    t->mem_d2d = cu_d2d;
    t->mem_set = cu_set;
    t->mem_d2d_rows = cu_d2d_rows;
    t->mem_release = cu_release;
    t->mem_sync = cu_sync;
    t->comm_begin = cu_comm_begin;
    t->comm_end = cu_comm_end;
    t->sum_double = cu_sum_double;
    t->add_inplace = cu_add_inplace;
    t->crossentropy_shard_losses = cu_ce_shard_losses;
    t->fill_float = cu_fill_float;
    t->add_rows = cu_add_rows;
    t->attn_lse_merge = cu_attn_lse_merge;
}

} // namespace LOOM_CU_NS
