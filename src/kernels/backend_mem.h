/* Private to src/kernels: the cpu memory ops' kernels, shared by the cpu and cpu-guard tables. */
#ifndef LOOM_KERNELS_BACKEND_MEM_H
#define LOOM_KERNELS_BACKEND_MEM_H

#include <stddef.h>
#include <stdint.h>

/* madvise(MADV_DONTNEED) of the whole pages inside [p, p + n) */
void loom_mem_release_pages(void *p, size_t n);
/* *out = sum of x[0..n) in double, index order */
void loom_mem_sum_double(double *out, const float *x, int64_t n);
/* rows copies of width bytes, pitches apart */
void loom_mem_copy_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows);
/* dst[i] += src[i] */
void loom_mem_add_inplace(float *dst, const float *src, int64_t n);

/* the LoRA ops' kernels (src/kernels/lora_ops.c; backend.h "LoRA" gives their contracts) */
void loom_lora_add_scaled(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                          int64_t width, int64_t rows, float a);
void loom_lora_scale_rows(float *dst, const float *src, int64_t src_stride, int64_t width,
                          int64_t rows, float a);
void loom_lora_dropout_forward(float *xd, uint8_t *keep, const float *x, int64_t N, int64_t in,
                               int T, int split, int64_t pos0, int64_t pos1, int64_t row0,
                               int64_t Tg, uint64_t key, float p);
void loom_lora_dropout_backward(float *din, const float *dxd, const uint8_t *keep, int64_t n,
                                float p);
void loom_lora_add_scaled_bf16(uint16_t *dst, int64_t dst_stride, const float *src,
                               int64_t src_stride, int64_t width, int64_t rows, float a);
void loom_lora_merge_into(float *W, const float *A, const float *B, int64_t out, int64_t in,
                          int r, float scale);

#endif
