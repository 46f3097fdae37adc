/* The CUDA emulator behind the `cuda-emu` backend: src/cuda's kernels, compiled by the host
 * C++ compiler, run on the CPU.
 *
 * A launch runs its blocks one after another on the calling thread; a block's threads are
 * fibers (ucontext), switched at __syncthreads, at the warp primitives and at exit, so
 * shared memory, barriers and shuffles mean what they mean on a GPU. Static __shared__
 * arrays are `static` (one block runs at a time: launches are serialized by a lock);
 * dynamic shared memory is a buffer per launch, filled with 0xff bytes (NaN floats) before
 * each block, so reading what no thread wrote shows. A barrier that not every live thread of
 * the block reaches (or a shuffle that not every live lane of the warp reaches) is reported
 * as a deadlock naming the kernel: the divergent-barrier bugs a GPU would hang on or get
 * wrong silently. Exited threads count as arrived (sm_70 and later).
 *
 * Device memory is host memory (malloc), the runtime calls below are their host
 * equivalents, and the one stream runs everything at once. What it does not model: timing,
 * races between threads of a block that do not meet at a barrier (fibers run each to its
 * next switch point), memory coalescing, tensor cores. docs/gpu.md. */
#ifndef LOOM_CUDA_EMU_H
#define LOOM_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};

/* the running fiber's indices (the scheduler sets them before it switches into a fiber) */
extern uint3 emu_threadIdx, emu_blockIdx;
extern dim3 emu_blockDim, emu_gridDim;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim

typedef void (*emu_fn)(void *);
void emu_run(dim3 grid, dim3 block, size_t smem, const char *name, emu_fn fn, void *ctx);
template <class F>
static inline void emu_launch(dim3 grid, dim3 block, size_t smem, const char *name, F f) {
    emu_run(grid, block, smem, name, [](void *c) { (*(F *)c)(); }, &f);
}
void *emu_dyn_smem(void);
/* launches so far (tests: an op that should have run a kernel did) */
int64_t emu_launches(void);

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
/* the warp exchange under the shuffles: every live lane of the calling lane's warp puts
 * `v` in, each gets lane `src`'s (its own when src is out of the warp) */
uint64_t emu_warp_exchange(uint64_t v, int src);
int emu_lane(void);
/* every live lane of the warp puts n <= 8 words in; each gets all 32 lanes' (lane-major) */
void emu_warp_allgather(const uint32_t *in, int n, uint32_t *out);
/* the tensor cores' bf16 m16n8k16 product with fp32 accumulation, PTX's fragments
 * (cu_common.cuh cu_mma_bf16_16816) */
void emu_mma_bf16_16816(float *d, const uint32_t *a, const uint32_t *b, const float *c);

template <class T> static inline T emu_shfl_from(T v, int src) {
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = emu_warp_exchange(bits, src);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
    const int lane = emu_lane();
    return emu_shfl_from(v, (lane & ~(width - 1)) | ((lane ^ m) & (width - 1)));
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    const int lane = emu_lane(), base = lane & ~(width - 1);
    const int src = lane + (int)d;
    return emu_shfl_from(v, src < base + width ? src : lane);
}
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
    const int lane = emu_lane(), base = lane & ~(width - 1);
    const int src = lane - (int)d;
    return emu_shfl_from(v, src >= base ? src : lane);
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    const int lane = emu_lane();
    return emu_shfl_from(v, (lane & ~(width - 1)) + (src & (width - 1)));
}

/* atomics: one fiber runs at a time */
template <class T> static inline T atomicAdd(T *a, T v) {
    T o = *a;
    *a = o + v;
    return o;
}
template <class T> static inline T atomicMax(T *a, T v) {
    T o = *a;
    if (v > o) *a = v;
    return o;
}

static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __int_as_float(int32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline int32_t __float_as_int(float f) {
    int32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* rounded arithmetic that nvcc does not contract into an FMA: plain operations here (the
 * emulator's objects are compiled with -ffp-contract=off) */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
/* the sum of the four int8 products of two words, plus c */
static inline int __dp4a(int a, int b, int c) {
    for (int k = 0; k < 32; k += 8) c += (int)(int8_t)(a >> k) * (int)(int8_t)(b >> k);
    return c;
}
static inline float __fdividef(float a, float b) { return a / b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

/* ---- the runtime API subset src/cuda uses, on host memory ---------------------------- */
typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind {
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st);
cudaError_t cudaStreamSynchronize(cudaStream_t st);
cudaError_t cudaDeviceSynchronize(void);

#endif
