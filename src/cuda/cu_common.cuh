/* loom's CUDA backend: the dialect every kernel file of src/cuda is written in.
 *
 * Each .cu file here compiles two ways:
 *   - by nvcc for the GPU (sm_80, sm_90: the `cuda` backend, built when nvcc is found);
 *   - by the host C++ compiler with LOOM_CUDA_EMU defined, against src/cuda/emu/emu.h: the
 *     `cuda-emu` backend, the same kernels run on the CPU by an emulator (one fiber per
 *     thread, blocks one after another), so that every kernel is tested against the cpu
 *     backend on machines with no GPU (docs/gpu.md "Testing without a GPU").
 * So a kernel uses only what both sides define:
 *   - __global__ / __device__ functions, threadIdx, blockIdx, blockDim, gridDim (x, y, z),
 *     __syncthreads(), __syncwarp(), __shfl_xor_sync / __shfl_down_sync / __shfl_sync on
 *     int, unsigned, float, double with the full mask, static __shared__ arrays, dynamic
 *     shared memory through CU_DYN_SMEM, atomicAdd on float/double/int (only where results
 *     need not repeat), the math of <math.h> on float and double (expf, logf, tanhf,
 *     sqrtf, fmaxf, erff, ...), rsqrtf, fmaf, __float_as_uint / __uint_as_float, the
 *     uncontracted __fmul_rn / __fadd_rn / __fsub_rn / __fdiv_rn and their double __d*_rn
 *     (a product nvcc must not fuse into the add that follows: the cpu's bits), __dp4a;
 *   - launches through CU_LAUNCH (never <<< >>> directly), on the backend's one stream;
 *   - GEMMs through cu_gemm (cuBLASLt on the GPU, a plain loop in the emulator).
 * Nothing else: no cuda_bf16.h types (bf16 is uint16_t with cu_bf16/cu_round below, the
 * bits of include/loom/bf16.h), no C++ library, no exceptions. */
#ifndef LOOM_CU_COMMON_CUH
#define LOOM_CU_COMMON_CUH

#include <stddef.h>
#include <stdint.h>
#include <math.h>

#ifdef LOOM_CUDA_EMU
#include "emu/emu.h"
#else
#include <cuda_runtime.h>
#endif

extern "C" {
#include "loom/backend.h"
}

/* The GPU build and the emulator's are linked into one binary: each in its own namespace. */
#ifdef LOOM_CUDA_EMU
#define LOOM_CU_NS loom_cu_emu
#else
#define LOOM_CU_NS loom_cu_gpu
#endif
namespace LOOM_CU_NS {

/* ---- errors ---------------------------------------------------------------------------- */
/* A failed CUDA call ends the process naming the call, the op and the error (loom_panic):
 * a GPU error is not recoverable mid-step. */
void cu_fail(const char *file, int line, const char *what, const char *detail);
#ifdef LOOM_CUDA_EMU
#define CU_CHECK(call) ((void)(call))
#else
#define CU_CHECK(call)                                                                      \
    do {                                                                                    \
        cudaError_t cu_e_ = (call);                                                         \
        if (cu_e_ != cudaSuccess) cu_fail(__FILE__, __LINE__, #call, cudaGetErrorString(cu_e_)); \
    } while (0)
#endif

/* selects this rank's device once per process (local rank -> device); 0, or -1 with the
 * reason in why (no GPU, fewer GPUs than local ranks) */
int cu_init(char *why, size_t n);
/* the calling host thread's device is set (every entry point that issues work calls it) */
void cu_enter(void);
int cu_device(void);
/* the device this rank uses, in words, or why there is none (-1) */
int cu_describe(char *buf, size_t n);
int cu_device_name(char *buf, size_t n);
int cu_mem_info(size_t *used, size_t *total);
/* the stream every op runs on (created at cu_init) */
cudaStream_t cu_stream(void);
/* after a launch: a launch error ends the process naming the kernel; LOOM_CUDA_SYNC=1 also
 * waits for the kernel and checks it (debugging) */
void cu_after_launch(const char *kernel);

#ifdef LOOM_CUDA_EMU
#define CU_LAUNCH(kern, grid, block, smem, ...)                                               \
    emu_launch(dim3(grid), dim3(block), (size_t)(smem), #kern, [=]() { kern(__VA_ARGS__); })
#define CU_DYN_SMEM(T, name) T *name = (T *)emu_dyn_smem()
#else
#define CU_LAUNCH(kern, grid, block, smem, ...)                                               \
    do {                                                                                    \
        kern<<<(grid), (block), (smem), cu_stream()>>>(__VA_ARGS__);                        \
        cu_after_launch(#kern);                                                             \
    } while (0)
#define CU_DYN_SMEM(T, name)                                                                \
    extern __shared__ __align__(16) unsigned char cu_dyn_smem_[];                           \
    T *name = (T *)cu_dyn_smem_
#endif

/* ceil(a / b) for launch sizes */
static inline unsigned cu_blocks(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

/* ---- bf16 as uint16_t: the bits of include/loom/bf16.h ------------------------------- */
__device__ __forceinline__ float cu_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* round to nearest even; NaN stays a (quiet) NaN: loom_bf16_round */
__device__ __forceinline__ uint16_t cu_round(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- tensor cores: one warp's bf16 m16n8k16 product, fp32 accumulation ----------------
 * d = a b + c with PTX's mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 fragments (every
 * lane of the warp calls it; group g = lane / 4, t = lane % 4): A (16 x 16, row-major) a[r] =
 * two bf16 of row g (r = 0, 2) or g + 8 (r = 1, 3), columns 2t, 2t + 1 (r < 2) or 2t + 8,
 * 2t + 9, the lower column in the low 16 bits; B (16 x 8, k by n) b[r] = k 2t + 8r and
 * 2t + 8r + 1 of column g; C, D (16 x 8 fp32): [0], [1] row g, [2], [3] row g + 8, columns 2t,
 * 2t + 1. sm_80 and later. The emulator computes it from the fragments (emu.cpp), so a kernel
 * built on it is tested here, and test_cuda_core checks the layout on the GPU. */
__device__ __forceinline__ void cu_mma_bf16_16816(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2], const float c[4]) {
#ifdef LOOM_CUDA_EMU
    emu_mma_bf16_16816(d, a, b, c);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

/* ---- reductions inside a block ------------------------------------------------------- */
__device__ __forceinline__ float cu_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float cu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double cu_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* the sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every
 * thread; `sh` is 32 floats of shared memory the caller owns (reused after the call returns
 * only past a __syncthreads). Fixed order: results repeat run to run. */
__device__ __forceinline__ float cu_block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return cu_warp_sum(t);
}
__device__ __forceinline__ float cu_block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : -INFINITY;
    return cu_warp_max(t);
}
__device__ __forceinline__ double cu_block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
    return cu_warp_sum_d(t);
}

/* ---- GEMM (src/cuda/cu_gemm.cu) ------------------------------------------------------
 * Column-major, as cuBLAS: C (m,n) = alpha * op(A) op(B) + beta * C, op(A) (m,k), op(B)
 * (k,n), leading dimensions lda/ldb/ldc, `batch` matrices stride_a/b/c elements apart.
 * a_t / b_t: 1 = the operand is stored transposed. Types: CU_F32 (fp32 in, fp32 compute,
 * TF32 only when LOOM_CUDA_TF32=1) or CU_BF16 (bf16 in, fp32 accumulate) for A and B; C is
 * CU_F32 or CU_BF16 (rounded once). bias (fp32, m, added to every column, i.e. per output
 * row of the row-major view) or NULL; epi_gelu: C = gelu_tanh(.. + bias) (pre-activation
 * not kept). fp32 accumulation throughout. */
enum { CU_F32 = 0, CU_BF16 = 1 };
void cu_gemm(int a_t, int b_t, int m, int n, int k, float alpha, const void *A, int lda,
             int64_t stride_a, const void *B, int ldb, int64_t stride_b, float beta, void *C,
             int ldc, int64_t stride_c, int batch, int ab_type, int c_type, const float *bias,
             int epi_gelu);

/* ---- the table's pieces --------------------------------------------------------------
 * Each ops file fills its part of the table (src/cuda/backend_cuda.cu calls them all). */
void cu_fill_memory(loom_backend *t);     /* cu_runtime.cu: memory, copies, reductions */
void cu_fill_gemm(loom_backend *t);       /* cu_gemm.cu: matmul_*, bf16_matmul_* */
void cu_fill_pointwise(loom_backend *t);  /* ops_pointwise.cu: norms, activations, rope, ... */
void cu_fill_loss(loom_backend *t);       /* ops_loss.cu: cross-entropy, AdamW, sums */
void cu_fill_attention(loom_backend *t);  /* ops_attention.cu: sdpa, flash, decode */
void cu_fill_moe_lora(loom_backend *t);   /* ops_moe_lora.cu: MoE and LoRA ops */
void cu_fill_infer(loom_backend *t);      /* ops_infer.cu: inference weight formats */

} // namespace LOOM_CU_NS

#endif
