/* Elementwise ops: GELU (tanh approximation, GPT-2's gelu_new), SwiGLU, GeGLU, soft-capping,
 * residual add. */
#ifndef LOOM_KV
#include "kernels/kmath.h"
#include "loom/kernels.h"
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

#define LOOM_KSELF "kernels/activation.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(gelu_forward, (float *out, const float *inp, int64_t n),
              (out, inp, n))
LOOM_DISPATCH(gelu_backward, (float *dinp, const float *inp, const float *dout, int64_t n),
              (dinp, inp, dout, n))
LOOM_DISPATCH(gelu_backward_set, (float *dinp, const float *inp, const float *dout, int64_t n),
              (dinp, inp, dout, n))
LOOM_DISPATCH(swiglu_forward, (float *out, const float *inp, int64_t N, int F),
              (out, inp, N, F))
LOOM_DISPATCH(swiglu_backward, (float *dinp, const float *inp, const float *dout, int64_t N, int F),
              (dinp, inp, dout, N, F))
LOOM_DISPATCH(geglu_forward, (float *out, const float *inp, int64_t N, int F),
              (out, inp, N, F))
LOOM_DISPATCH(geglu_backward, (float *dinp, const float *inp, const float *dout, int64_t N, int F),
              (dinp, inp, dout, N, F))
LOOM_DISPATCH(softcap_forward, (float *x, int64_t n, float cap), (x, n, cap))
LOOM_DISPATCH(residual_forward, (float *out, const float *a, const float *b, int64_t n),
              (out, a, b, n))

#else /* one level of the kernels (isa_variants.h) */

static void LOOM_KV(gelu_forward)(float *out, const float *inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_C * x * x * x);
        out[i] = 0.5f * x * (1.0f + loom_tanhf(u));
    }
}

/* d GELU(x) / dx */
static inline float LOOM_KV(gelu_grad)(float x) {
    float u = GELU_K * (x + GELU_C * x * x * x);
    float t = loom_tanhf(u);
    float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    /* sech^2 directly: 1 - t*t would leave ~1e-7 where the true value is ~0, and x*du
     * grows like x^3, so the tails would carry a visible error */
    return 0.5f * (1.0f + t) + 0.5f * x * loom_sech2f(u) * du;
}

static void LOOM_KV(gelu_backward)(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dinp[i] += LOOM_KV(gelu_grad)(inp[i]) * dout[i];
}

/* dinp = (not +=): the caller need not zero dinp first */
static void LOOM_KV(gelu_backward_set)(float *dinp, const float *inp, const float *dout,
                                       int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dinp[i] = LOOM_KV(gelu_grad)(inp[i]) * dout[i];
}

/* inp (N, 2F) rows [gate | up]; out (N, F) = silu(gate) * up */
static void LOOM_KV(swiglu_forward)(float *out, const float *inp, int64_t N, int F) {
#pragma omp parallel for schedule(static) if (N * F >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *g = inp + n * 2 * F, *u = g + F;
        float *y = out + n * F;
        for (int i = 0; i < F; i++) y[i] = g[i] * loom_sigmoidf(g[i]) * u[i];
    }
}

static void LOOM_KV(swiglu_backward)(float *dinp, const float *inp, const float *dout, int64_t N,
                                     int F) {
#pragma omp parallel for schedule(static) if (N * F >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *g = inp + n * 2 * F, *u = g + F, *dy = dout + n * F;
        float *dg = dinp + n * 2 * F, *du = dg + F;
        for (int i = 0; i < F; i++) {
            float s = loom_sigmoidf(g[i]);
            float silu = g[i] * s;
            /* d silu / dg = s * (1 + g * (1 - s)) */
            dg[i] += dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
            du[i] += dy[i] * silu;
        }
    }
}

/* inp (N, 2F) rows [gate | up]; out (N, F) = gelu_tanh(gate) * up (GeGLU, Gemma's
 * gelu_pytorch_tanh) */
static void LOOM_KV(geglu_forward)(float *out, const float *inp, int64_t N, int F) {
#pragma omp parallel for schedule(static) if (N * F >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *g = inp + n * 2 * F, *u = g + F;
        float *y = out + n * F;
        for (int i = 0; i < F; i++) {
            const float x = g[i], t = GELU_K * (x + GELU_C * x * x * x);
            y[i] = 0.5f * x * (1.0f + loom_tanhf(t)) * u[i];
        }
    }
}

static void LOOM_KV(geglu_backward)(float *dinp, const float *inp, const float *dout, int64_t N,
                                    int F) {
#pragma omp parallel for schedule(static) if (N * F >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *g = inp + n * 2 * F, *u = g + F, *dy = dout + n * F;
        float *dg = dinp + n * 2 * F, *du = dg + F;
        for (int i = 0; i < F; i++) {
            const float x = g[i], t = GELU_K * (x + GELU_C * x * x * x);
            dg[i] += dy[i] * u[i] * LOOM_KV(gelu_grad)(x);
            du[i] += dy[i] * 0.5f * x * (1.0f + loom_tanhf(t));
        }
    }
}

/* x = cap * tanh(x / cap) in place (final-logit soft-capping) */
static void LOOM_KV(softcap_forward)(float *x, int64_t n, float cap) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = cap * loom_tanhf(x[i] / cap);
}

static void LOOM_KV(residual_forward)(float *out, const float *a, const float *b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

#endif
