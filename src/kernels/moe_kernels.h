/* Private to src/kernels: the cpu kernels of the backend's MoE ops (moe.c); their contracts are
 * the ops' in include/loom/backend.h ("MoE"). */
#ifndef LOOM_KERNELS_MOE_KERNELS_H
#define LOOM_KERNELS_MOE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

void loom_moe_route(float *p, float *lse, int32_t *e, int32_t *pos, int32_t *cnt,
                    double *stats, int64_t N, int E, int K, int64_t G, float capacity_factor);
void loom_moe_gather(void *X, const void *x, const int32_t *pos, int64_t N, int K,
                     size_t row_bytes);
void loom_moe_combine(float *y, const float *YB, const float *p, const int32_t *e,
                      const int32_t *pos, int64_t N, int E, int K, int C, int renorm);
void loom_moe_combine_backward(float *dYB, float *dw, const float *dy, const float *YB,
                               const float *p, const int32_t *e, const int32_t *pos, int64_t N,
                               int E, int K, int C, int renorm);
void loom_moe_scatter_add(float *dx, const float *dXB, const int32_t *pos, int64_t N, int K,
                          int C);
void loom_moe_router_backward(float *dl, const float *p, const float *lse, const int32_t *e,
                              const int32_t *pos, const float *dw, int64_t N, int E, int K,
                              int64_t G, double aux, double zc, int renorm);
void loom_moe_sigmoid(float *g, int64_t n);
void loom_moe_gate_add(float *y, const float *g, const float *ys, int64_t N, int C);
void loom_moe_gate_backward(float *dys, float *dz, const float *dy, const float *g,
                            const float *ys, int64_t N, int C);
void loom_bf16_moe_combine(uint16_t *y, const uint16_t *YB, const float *p, const int32_t *e,
                           const int32_t *pos, int64_t N, int E, int K, int C, int renorm,
                           const uint16_t *ys, const float *g, int S);
void loom_bf16_moe_combine_backward(float *dYB, float *dw, const float *dy, const uint16_t *YB,
                                    const float *p, const int32_t *e, const int32_t *pos,
                                    int64_t N, int E, int K, int C, int renorm);
void loom_bf16_moe_gate_backward(float *dys, float *dz, const float *dy, const float *g,
                                 const uint16_t *ys, int64_t N, int C);

#endif
