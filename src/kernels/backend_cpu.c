/* The cpu backend: the op table over the kernels of include/loom/kernels.h. Each op is the
 * kernel itself (which dispatches per instruction-set level), except flash attention, whose
 * inner loops follow the active level (LOOM_ATTN_ISA_AUTO). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loom/backend.h"
#include "loom/base.h"
#include "loom/kernels.h"
#include "kernels/backend_mem.h"
#include "kernels/moe_kernels.h"

/* ---- memory: host memory is the device's (aligned malloc, memcpy, memset, nothing) ---- */

static void *cpu_alloc(size_t bytes, int flags) {
    if (!(flags & LOOM_MEM_STREAMED)) return loom_alloc_aligned(bytes);
    /* streamed every step: 2 MiB aligned, huge pages asked for */
    const size_t huge = (size_t)2 << 20, size = (bytes + huge - 1) & ~(huge - 1);
    void *p = NULL;
    if (posix_memalign(&p, huge, size ? size : huge) != 0)
        loom_panic(__FILE__, __LINE__, "out of memory allocating %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size ? size : huge, MADV_HUGEPAGE);
#endif
    return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
}
static void cpu_set(void *dst, int byte, size_t n) {
    if (n) memset(dst, byte, n);
}
static void cpu_nothing(void) {}
void loom_mem_copy_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows) {
    #pragma omp parallel for schedule(static) if (rows * width > ((size_t)1 << 18))
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

void loom_mem_release_pages(void *p, size_t n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1);
    const uintptr_t b = ((uintptr_t)((char *)p + n)) & ~(pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

void loom_mem_sum_double(double *out, const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    *out = s;
}

void loom_mem_add_inplace(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

static void cpu_fill_float(float *x, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++) x[i] = v;
}

static void cpu_add_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                         int64_t width, int64_t rows) {
    #pragma omp parallel for schedule(static) if (rows * width > 65536)
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * dst_stride;
        const float *s = src + r * src_stride;
        for (int64_t j = 0; j < width; j++) d[j] += s[j];
    }
}

static void cpu_attn_lse_merge(float *out, float *lse, const float *blk, const float *blse,
                               int B, int H, int64_t n, int D, int64_t out_bs) {
    const int64_t HD = (int64_t)H * D;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int64_t i = 0; i < n; i++) {
                const int64_t li = ((int64_t)b * H + h) * n + i;
                const float l2 = blse[li], l1 = lse[li];
                if (l2 == -INFINITY) continue; /* the block saw no key for this row */
                float *o = out + (int64_t)b * out_bs + i * HD + (int64_t)h * D;
                const float *p = blk + ((int64_t)b * n + i) * HD + (int64_t)h * D;
                if (l1 == -INFINITY) {
                    memcpy(o, p, (size_t)D * sizeof(float));
                    lse[li] = l2;
                    continue;
                }
                const float mx = l1 > l2 ? l1 : l2;
                const float l = mx + logf(expf(l1 - mx) + expf(l2 - mx));
                const float w1 = expf(l1 - l), w2 = expf(l2 - l);
                for (int64_t d = 0; d < D; d++) o[d] = w1 * o[d] + w2 * p[d];
                lse[li] = l;
            }
}

static void cpu_ce_shard_losses(float *losses, const float *mx, const float *sums,
                                const int32_t *targets, int64_t N) {
    for (int64_t i = 0; i < N; i++)
        losses[i] = targets[i] < 0 ? 0.0f
                                   : (float)(log((double)sums[2 * i]) + (double)mx[i] -
                                             (double)sums[2 * i + 1]);
}

static int cpu_flash_forward(float *out, float *lse, const float *q, const float *k,
                             const float *v, const loom_attn_dims *dims,
                             const loom_attn_mask *mask) {
    return flash_attention_forward(out, lse, q, k, v, dims, mask, LOOM_ATTN_ISA_AUTO);
}

static int cpu_flash_backward(float *dq, float *dk, float *dv, const float *dout,
                              const float *q, const float *k, const float *v, const float *out,
                              const float *lse, const loom_attn_dims *dims,
                              const loom_attn_mask *mask) {
    return flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, dims, mask,
                                    LOOM_ATTN_ISA_AUTO);
}

static int cpu_flash_backward_set(float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, const loom_attn_dims *dims,
                                  const loom_attn_mask *mask) {
    return flash_attention_backward_set(dq, dk, dv, dout, q, k, v, out, lse, dims, mask,
                                        LOOM_ATTN_ISA_AUTO);
}

static const loom_backend cpu = {
    .name = "cpu",
    .host_memory = 1,
    .mem_alloc = cpu_alloc,
    .mem_free = cpu_free,
    .mem_h2d = cpu_copy,
    .mem_d2h = cpu_copy,
    .mem_d2d = cpu_copy,
    .mem_set = cpu_set,
    .mem_d2d_rows = loom_mem_copy_rows,
    .mem_release = loom_mem_release_pages,
    .mem_sync = cpu_nothing,
    .comm_begin = cpu_nothing,
    .comm_end = cpu_nothing,
    .sum_double = loom_mem_sum_double,
    .add_inplace = loom_mem_add_inplace,
    .crossentropy_shard_losses = cpu_ce_shard_losses,
    .fill_float = cpu_fill_float,
    .add_rows = cpu_add_rows,
    .attn_lse_merge = cpu_attn_lse_merge,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .matmul_backward_set = matmul_backward_set,
    .matmul_bf16_forward = matmul_rows_bf16_forward,
    .q8_quantize = q8_quantize_rows,
    .q8_dequantize = q8_dequantize_rows,
    .matmul_q8_forward = matmul_q8_forward,
    .q4k_quantize = q4k_quantize_rows,
    .q4k_dequantize = q4k_dequantize_rows,
    .q8k_quantize = q8k_quantize_rows,
    .matmul_q4k_forward = matmul_q4k_forward,
    .dotbf16_pack_elems = dotbf16_pack_elems,
    .dotbf16_pack = dotbf16_pack,
    .dotbf16_unpack_row = dotbf16_unpack_row,
    .dotbf16_act_elems = dotbf16_act_elems,
    .bf16_round = bf16_round_rows,
    .matmul_dotbf16_forward = matmul_dotbf16_forward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .gelu_backward_set = gelu_backward_set,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .geglu_forward = geglu_forward,
    .geglu_backward = geglu_backward,
    .softcap_forward = softcap_forward,
    .rownorm_sums = rownorm_sums,
    .rownorm_forward = rownorm_forward,
    .rownorm_backward = rownorm_backward,
    .rope_tables = rope_tables,
    .rope_tables_freq = rope_tables_freq,
    .headnorm_forward = headnorm_forward,
    .headnorm_backward = headnorm_backward,
    .rope_forward = rope_forward,
    .rope_backward = rope_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .flash_attention_forward = cpu_flash_forward,
    .flash_attention_backward = cpu_flash_backward,
    .flash_attention_backward_set = cpu_flash_backward_set,
    .attention_decode = attention_decode,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .embedding_shard_forward = embedding_shard_forward,
    .embedding_shard_backward = embedding_shard_backward,
    .mean_pool_forward = mean_pool_forward,
    .mean_pool_backward = mean_pool_backward,
    .residual_forward = residual_forward,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_softmax_backward = crossentropy_softmax_backward,
    .crossentropy_softcap_backward = crossentropy_softcap_backward,
    .crossentropy_shard_max = crossentropy_shard_max,
    .crossentropy_shard_sums = crossentropy_shard_sums,
    .crossentropy_shard_backward = crossentropy_shard_backward,
    .crossentropy_shard_softcap_backward = crossentropy_shard_softcap_backward,
    .adamw_update = adamw_update,
    .sum_squares = sum_squares,
    .scale_inplace = scale_inplace,
    .lora_add_scaled = loom_lora_add_scaled,
    .lora_scale_rows = loom_lora_scale_rows,
    .lora_dropout_forward = loom_lora_dropout_forward,
    .lora_dropout_backward = loom_lora_dropout_backward,
    .lora_merge = loom_lora_merge_into,
    .lora_add_scaled_bf16 = loom_lora_add_scaled_bf16,
    /* bf16 / dtypes */
    .bf16_matmul_native = bf16_matmul_native,
    .bf16_matmul_forward = bf16_matmul_forward,
    .bf16_matmul_forward_f32 = bf16_matmul_forward_f32,
    .bf16_matmul_backward = bf16_matmul_backward,
    .bf16_from_f32 = bf16_from_f32,
    .bf16_to_f32 = bf16_to_f32,
    .bf16_layernorm_forward = bf16_layernorm_forward,
    .bf16_layernorm_backward = bf16_layernorm_backward,
    .bf16_rmsnorm_forward = bf16_rmsnorm_forward,
    .bf16_rmsnorm_backward = bf16_rmsnorm_backward,
    .bf16_gelu_forward = bf16_gelu_forward,
    .bf16_gelu_backward = bf16_gelu_backward,
    .bf16_glu_forward = bf16_glu_forward,
    .bf16_glu_backward = bf16_glu_backward,
    .bf16_residual_forward = bf16_residual_forward,
    .bf16_rope_forward = bf16_rope_forward,
    .bf16_embedding_forward = bf16_embedding_forward,
    .bf16_flash_ws_floats = bf16_flash_ws_floats,
    .bf16_flash_attention_forward = bf16_flash_attention_forward,
    .bf16_flash_attention_backward = bf16_flash_attention_backward,
    .bf16_crossentropy_forward = bf16_crossentropy_forward,
    .bf16_crossentropy_backward = bf16_crossentropy_backward,
    .adamw_update_bf16 = adamw_update_bf16,
    /* MoE (src/kernels/moe.c) */
    .moe_route = loom_moe_route,
    .moe_gather = loom_moe_gather,
    .moe_combine = loom_moe_combine,
    .moe_combine_backward = loom_moe_combine_backward,
    .moe_scatter_add = loom_moe_scatter_add,
    .moe_router_backward = loom_moe_router_backward,
    .moe_sigmoid = loom_moe_sigmoid,
    .moe_gate_add = loom_moe_gate_add,
    .moe_gate_backward = loom_moe_gate_backward,
    .bf16_moe_combine = loom_bf16_moe_combine,
    .bf16_moe_combine_backward = loom_bf16_moe_combine_backward,
    .bf16_moe_gate_backward = loom_bf16_moe_gate_backward,
};

const loom_backend *loom_backend_cpu(void) { return &cpu; }

const loom_backend *loom_backend_find(const char *name) {
    if (name && !strcmp(name, cpu.name)) return &cpu;
    if (name && !strcmp(name, "cpu-guard")) return loom_backend_guard();
#ifdef LOOM_HAVE_CUDA_EMU
    if (name && !strcmp(name, "cuda-emu")) return loom_backend_cuda_emu();
#endif
#ifdef LOOM_HAVE_CUDA
    if (name && !strcmp(name, "cuda")) return loom_backend_cuda();
#endif
    return NULL;
}

const char *loom_backend_names(void) {
#if defined(LOOM_HAVE_CUDA)
    return "cpu, cpu-guard, cuda, cuda-emu";
#elif defined(LOOM_HAVE_CUDA_EMU)
    return "cpu, cpu-guard, cuda-emu; this loom was built without the CUDA backend (nvcc was "
           "not found: docs/gpu.md)";
#else
    return "cpu, cpu-guard";
#endif
}

int loom_backend_ready(const loom_backend *be, loom_err *err) {
#ifdef LOOM_HAVE_CUDA
    if (be == loom_backend_cuda()) {
        char why[512];
        if (loom_cuda_init(why, sizeof why)) return loom_errf(err, "%s", why);
    }
#endif
    (void)be, (void)err;
    return 0;
}

int loom_backend_device_name(const loom_backend *be, char *buf, size_t n) {
#ifdef LOOM_HAVE_CUDA
    if (be == loom_backend_cuda()) return loom_cuda_device_name(buf, n);
#endif
    (void)be;
    if (n) buf[0] = 0;
    return -1;
}

int loom_backend_mem_info(const loom_backend *be, size_t *used, size_t *total) {
#ifdef LOOM_HAVE_CUDA
    if (be == loom_backend_cuda()) return loom_cuda_mem_info(used, total);
#endif
    (void)be;
    *used = *total = 0;
    return -1;
}

int loom_backend_has_cuda(void) {
#ifdef LOOM_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

const loom_backend *loom_backend_default(void) {
    const char *e = getenv("LOOM_BACKEND");
    if (!e || !*e) return &cpu;
    const loom_backend *be = loom_backend_find(e);
    if (!be)
        loom_panic(__FILE__, __LINE__, "LOOM_BACKEND = '%s': unknown backend (known: %s)", e,
                   loom_backend_names());
    return be;
}

void loom_dev_read(const loom_backend *be, void *dst, const void *src, size_t n,
                   const char *what) {
    (void)what; /* the name is for readers and for grep (docs/engine.md's table) */
    be->mem_d2h(dst, src, n);
}
