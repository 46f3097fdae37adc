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

#endif
