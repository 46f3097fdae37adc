/* AdamW step, gradient-norm helpers. Flat loops over contiguous buffers. */
#ifndef LOOM_KV
#include "kernels/kmath.h"
#include "loom/bf16.h"
#include "loom/kernels.h"

/* Compiled with -fno-math-errno (CMakeLists.txt) so that gcc vectorizes the AdamW loop: with
 * sqrtf's errno it stayed scalar (vsqrtss, two vdivss and a libm fallback per element: 3.2 ns
 * per parameter even in L1 on this AMD EPYC, ~0.4 CPU-s per gpt2-small step; vectorized,
 * memory-bound). The flag drops only errno for a negative argument (NaN still comes back, and
 * v >= 0 here); vsqrtps and vdivps are correctly rounded like their scalar forms: the same
 * bits. (`#pragma GCC optimize("no-math-errno")` does not reach the OpenMP-outlined loop.) */

#define LOOM_KSELF "kernels/adamw.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(adamw_update, (float *p, const float *g, float *m, float *v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, int64_t step,
                             float grad_scale),
              (p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale))
LOOM_DISPATCH(adamw_update_bf16, (float *p, uint16_t *pb, const float *g, float *m, float *v,
                                  int64_t n, float lr, float beta1, float beta2, float eps,
                                  float weight_decay, int64_t step, float grad_scale),
              (p, pb, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale))
LOOM_DISPATCH_RET(double, sum_squares, (const float *x, int64_t n),
                  (x, n))
LOOM_DISPATCH(scale_inplace, (float *x, int64_t n, float s),
              (x, n, s))

#else /* one level of the kernels (isa_variants.h) */

/* Mirrors torch.optim.AdamW's single-tensor step: scalars computed in double and rounded to
 * float as torch's Python scalars are, the same operation order:
 *   p *= 1 - lr*wd;  m = lerp(m, g, 1-b1);  v = b2 v + (1-b2) g^2;
 *   p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
 * with g = g[i] * grad_scale rounded to float first: the bits of scale_inplace(g, grad_scale)
 * followed by the step (gradient clipping without a pass of its own over the gradients; GCC
 * fuses a product into an FMA only when every use of it is an addition, and g has a product
 * among its uses; tests/unit/test_backend.c checks the bits). */
/* Where the level has FMA, the three fused multiply-adds are written out: they are the
 * contractions gcc chose for the scalar loop, which the vectorized loop would otherwise not
 * keep (p = p*decay - s*q became fmsub(p, decay, s*q) there): the same bits as before the loop
 * was vectorized (tests/unit/test_backend.c). */
#ifdef __FMA__
#define ADAMW_FMA(a, b, c) fmaf(a, b, c)
#else
#define ADAMW_FMA(a, b, c) ((a) * (b) + (c))
#endif
static void LOOM_KV(adamw_update)(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale) {
    const float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    const float w1 = (float)(1.0 - (double)beta1), w2 = (float)(1.0 - (double)beta2);
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float pi = p[i] * decay;
        float mi = ADAMW_FMA(gi - m[i], w1, m[i]);
        float vi = ADAMW_FMA(v[i], beta2, w2 * gi * gi);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = ADAMW_FMA(-(mi / denom), step_size, pi);
        m[i] = mi;
        v[i] = vi;
    }
}

/* The same step (the same bits of p, m, v), also writing the bf16 copy of the updated fp32
 * master, pb[i] = round(p[i]) to nearest even (training.precision bf16): the copy the GEMMs
 * read is refreshed in the step's own pass. */
static void LOOM_KV(adamw_update_bf16)(float *p, uint16_t *pb, const float *g, float *m,
                                       float *v, int64_t n, float lr, float beta1, float beta2,
                                       float eps, float weight_decay, int64_t step,
                                       float grad_scale) {
    const float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    const float w1 = (float)(1.0 - (double)beta1), w2 = (float)(1.0 - (double)beta2);
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float pi = p[i] * decay;
        float mi = ADAMW_FMA(gi - m[i], w1, m[i]);
        float vi = ADAMW_FMA(v[i], beta2, w2 * gi * gi);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        const float pn = ADAMW_FMA(-(mi / denom), step_size, pi);
        p[i] = pn;
        pb[i] = loom_bf16_round(pn);
        m[i] = mi;
        v[i] = vi;
    }
}

#undef ADAMW_FMA

/* Fixed-size blocks whatever the thread count; block sums combined in block order. */
static double LOOM_KV(sum_squares)(const float *x, int64_t n) {
    enum { MAX_BLOCKS = 1024 };
    int64_t bsize = 65536;
    if (n > bsize * MAX_BLOCKS) bsize = (n + MAX_BLOCKS - 1) / MAX_BLOCKS;
    int64_t nb = (n + bsize - 1) / bsize;
    double part[MAX_BLOCKS];
#pragma omp parallel for schedule(static) if (nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * bsize, i1 = i0 + bsize < n ? i0 + bsize : n;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[b] = s;
    }
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) total += part[b];
    return total;
}

static void LOOM_KV(scale_inplace)(float *x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

#endif
