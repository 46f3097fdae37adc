/* Softmax cross-entropy over V logits per row; logits (N,V), targets (N), losses (N).
 * Numerically stable (max subtracted), sums in double, one row per task. */
#ifndef LOOM_KV
#include "kernels/kmath.h"
#include "loom/bf16.h"
#include "loom/kernels.h"

#define LOOM_KSELF "kernels/crossentropy.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(crossentropy_forward, (float *losses, const float *logits, const int32_t *targets,
                                     int64_t N, int V),
              (losses, logits, targets, N, V))
LOOM_DISPATCH(crossentropy_softmax_backward, (float *logits, const int32_t *targets, int64_t N,
                                              int V, float dscale, const float *rw),
              (logits, targets, N, V, dscale, rw))

LOOM_DISPATCH(bf16_crossentropy_forward, (float *losses, const uint16_t *logits,
                                          const int32_t *targets, int64_t N, int V),
              (losses, logits, targets, N, V))
LOOM_DISPATCH(bf16_crossentropy_backward, (uint16_t *logits, const int32_t *targets, int64_t N,
                                           int V, float dscale, const float *rw),
              (logits, targets, N, V, dscale, rw))

LOOM_DISPATCH(crossentropy_softcap_backward, (float *logits, const int32_t *targets, int64_t N,
                                              int V, float dscale, float cap, const float *rw),
              (logits, targets, N, V, dscale, cap, rw))

/* ---- vocab-parallel pieces (tensor parallelism): one level, plain loops ---- */

void crossentropy_shard_max(float *mx, const float *logits, int64_t N, int Vl) {
#pragma omp parallel for schedule(static) if (N * Vl >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * Vl;
        float m = x[0];
        for (int i = 1; i < Vl; i++) m = x[i] > m ? x[i] : m;
        mx[n] = m;
    }
}

void crossentropy_shard_sums(float *sums, const float *logits, const float *mx,
                             const int32_t *targets, int v0, int64_t N, int Vl) {
#pragma omp parallel for schedule(static) if (N * Vl >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const int32_t t = targets[n];
        sums[2 * n] = sums[2 * n + 1] = 0.0f;
        if (t < 0) continue;
        const float *x = logits + n * Vl;
        double s = 0.0;
        for (int i = 0; i < Vl; i++) s += (double)loom_expf(x[i] - mx[n]);
        sums[2 * n] = (float)s;
        if (t >= v0 && t < v0 + Vl) sums[2 * n + 1] = x[t - v0];
    }
}

/* the shard's rows' gradient, (softmax - onehot) * dscale, and with cap > 0 through the
 * soft-cap: times 1 - (y / cap)^2, read from the capped logit y before it is overwritten */
static void shard_backward(float *logits, const int32_t *targets, const float *mx,
                           const float *sums, int v0, int64_t N, int Vl, float dscale0,
                           float cap, const float *rw) {
#pragma omp parallel for schedule(static) if (N * Vl >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const int32_t t = targets[n];
        float *x = logits + n * Vl;
        if (t < 0) {
            memset(x, 0, (size_t)Vl * sizeof(float));
            continue;
        }
        const float dscale = rw ? rw[n] : dscale0;
        const float k = (float)(1.0 / (double)sums[2 * n]) * dscale;
        for (int i = 0; i < Vl; i++) {
            const float y = x[i];
            float d = loom_expf(y - mx[n]) * k;
            if (i == t - v0) d -= dscale;
            if (cap > 0.0f) {
                const float c = y / cap;
                d *= 1.0f - c * c;
            }
            x[i] = d;
        }
    }
}

void crossentropy_shard_backward(float *logits, const int32_t *targets, const float *mx,
                                 const float *sums, int v0, int64_t N, int Vl, float dscale,
                                 const float *rw) {
    shard_backward(logits, targets, mx, sums, v0, N, Vl, dscale, 0.0f, rw);
}

void crossentropy_shard_softcap_backward(float *logits, const int32_t *targets, const float *mx,
                                         const float *sums, int v0, int64_t N, int Vl,
                                         float dscale, float cap, const float *rw) {
    shard_backward(logits, targets, mx, sums, v0, N, Vl, dscale, cap, rw);
}

#else /* one level of the kernels (isa_variants.h) */

static float LOOM_KV(row_max)(const float *x, int V) {
    float mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

static double LOOM_KV(row_sumexp)(const float *x, int V, float mx) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < V; i++) s += (double)loom_expf(x[i] - mx);
    return s;
}

static void LOOM_KV(crossentropy_forward)(float *losses, const float *logits,
                                          const int32_t *targets,
                          int64_t N, int V) {
#pragma omp parallel for schedule(static) if (N * V >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        int32_t t = targets[n];
        if (t < 0) {
            losses[n] = 0.0f;
            continue;
        }
        const float *x = logits + n * V;
        float mx = LOOM_KV(row_max)(x, V);
        double s = LOOM_KV(row_sumexp)(x, V, mx);
        losses[n] = (float)(log(s) + (double)mx - (double)x[t]);
    }
}

/* crossentropy_softmax_backward of soft-capped logits y = cap * tanh(z / cap): the gradient
 * with respect to the raw logits z, d * (1 - (y / cap)^2), read from y before it is
 * overwritten (no second (N, V) buffer) */
static void LOOM_KV(crossentropy_softcap_backward)(float *logits, const int32_t *targets,
                                                   int64_t N, int V, float dscale0, float cap,
                                                   const float *rw) {
#pragma omp parallel for schedule(static) if (N * V >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        int32_t t = targets[n];
        float *x = logits + n * V;
        if (t < 0) {
            memset(x, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float dscale = rw ? rw[n] : dscale0;
        float mx = LOOM_KV(row_max)(x, V);
        double s = LOOM_KV(row_sumexp)(x, V, mx);
        float k = (float)(1.0 / s) * dscale;
        for (int i = 0; i < V; i++) {
            const float y = x[i], c = y / cap;
            float d = loom_expf(y - mx) * k;
            if (i == t) d -= dscale;
            x[i] = d * (1.0f - c * c);
        }
    }
}

/* bf16 logits (training.precision bf16): widened exactly, the fp32 forward's math (max, sum of
 * exp in double), fp32 losses; the backward writes (softmax - onehot) * dscale rounded to bf16
 * in place (the head's GEMMs take that bf16 gradient as it is) */
static void LOOM_KV(bf16_crossentropy_forward)(float *losses, const uint16_t *logits,
                                               const int32_t *targets, int64_t N, int V) {
#pragma omp parallel for schedule(static) if (N * V >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const int32_t t = targets[n];
        if (t < 0) {
            losses[n] = 0.0f;
            continue;
        }
        const uint16_t *x = logits + n * V;
        float mx = loom_bf16_widen(x[0]);
#pragma omp simd reduction(max : mx)
        for (int i = 0; i < V; i++) {
            const float xi = loom_bf16_widen(x[i]);
            mx = xi > mx ? xi : mx;
        }
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < V; i++) s += (double)loom_expf(loom_bf16_widen(x[i]) - mx);
        losses[n] = (float)(log(s) + (double)mx - (double)loom_bf16_widen(x[t]));
    }
}

static void LOOM_KV(bf16_crossentropy_backward)(uint16_t *logits, const int32_t *targets,
                                                int64_t N, int V, float dscale0,
                                                const float *rw) {
#pragma omp parallel for schedule(static) if (N * V >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const int32_t t = targets[n];
        const float dscale = rw ? rw[n] : dscale0;
        uint16_t *x = logits + n * V;
        if (t < 0) {
            memset(x, 0, (size_t)V * sizeof(uint16_t));
            continue;
        }
        float mx = loom_bf16_widen(x[0]);
#pragma omp simd reduction(max : mx)
        for (int i = 0; i < V; i++) {
            const float xi = loom_bf16_widen(x[i]);
            mx = xi > mx ? xi : mx;
        }
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < V; i++) s += (double)loom_expf(loom_bf16_widen(x[i]) - mx);
        const float k = (float)(1.0 / s) * dscale;
        for (int i = 0; i < V; i++) {
            float d = loom_expf(loom_bf16_widen(x[i]) - mx) * k;
            if (i == t) d -= dscale;
            x[i] = loom_bf16_round(d);
        }
    }
}

static void LOOM_KV(crossentropy_softmax_backward)(float *logits, const int32_t *targets,
                                                   int64_t N, int V, float dscale0,
                                                   const float *rw) {
#pragma omp parallel for schedule(static) if (N * V >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        int32_t t = targets[n];
        const float dscale = rw ? rw[n] : dscale0;
        float *x = logits + n * V;
        if (t < 0) {
            memset(x, 0, (size_t)V * sizeof(float));
            continue;
        }
        float mx = LOOM_KV(row_max)(x, V);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < V; i++) {
            float e = loom_expf(x[i] - mx);
            x[i] = e;
            s += (double)e;
        }
        float k = (float)(1.0 / s) * dscale;
        for (int i = 0; i < V; i++) x[i] *= k;
        x[t] -= dscale;
    }
}

#endif
