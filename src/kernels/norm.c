/* LayerNorm and RMSNorm over the last dim C of (N,C) rows. Row statistics in double;
 * weight/bias gradients are column sums computed per fixed column slice (rows summed in
 * order), so every result is independent of the thread count. */
#ifndef LOOM_KV
#include "kernels/kmath.h"
#include "loom/kernels.h"
enum { NORM_COLS = 64 }; /* column slice for the weight-gradient sums */

/* RMSNorm of each of nh heads of D floats in N rows row_stride floats apart (q or k heads of
 * fused q|k|v rows): out = in * rstd * w, w (D) shared by the heads; rstd (N, rstd_stride),
 * head h of row n at rstd[n * rstd_stride + h]. out may be in. Statistics in double. */
void headnorm_forward(float *out, float *rstd, const float *in, const float *w, int64_t N,
                      int nh, int D, int64_t row_stride, int64_t rstd_stride, float eps) {
#pragma omp parallel for schedule(static) if (N * nh * D >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int h = 0; h < nh; h++) {
            const float *x = in + n * row_stride + (int64_t)h * D;
            float *y = out + n * row_stride + (int64_t)h * D;
            double s = 0.0;
            for (int i = 0; i < D; i++) s += (double)x[i] * x[i];
            const float rs = (float)(1.0 / sqrt(s / D + eps));
            for (int i = 0; i < D; i++) y[i] = x[i] * rs * w[i];
            if (rstd) rstd[n * rstd_stride + h] = rs;
        }
}

/* Its backward: din (same layout as in) is SET, dw (D) accumulated (+=, each column summed
 * over rows then heads in order: independent of the thread count); dw may be NULL. */
void headnorm_backward(float *din, float *dw, const float *dout, const float *in, const float *w,
                       const float *rstd, int64_t N, int nh, int D, int64_t row_stride,
                       int64_t rstd_stride) {
#pragma omp parallel for schedule(static) if (N * nh * D >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int h = 0; h < nh; h++) {
            const int64_t o = n * row_stride + (int64_t)h * D;
            const float *x = in + o, *dy = dout + o;
            float *dx = din + o;
            const float rs = rstd[n * rstd_stride + h];
            double b = 0.0;
            for (int i = 0; i < D; i++) b += dy[i] * w[i] * (x[i] * rs);
            const float mb = (float)(b / D);
            for (int i = 0; i < D; i++) dx[i] = rs * (dy[i] * w[i] - x[i] * rs * mb);
        }
    if (!dw) return;
#pragma omp parallel for schedule(static) if (N * nh * D >= LOOM_PAR_MIN)
    for (int i = 0; i < D; i++) {
        float a = 0.0f;
        for (int64_t n = 0; n < N; n++)
            for (int h = 0; h < nh; h++) {
                const int64_t o = n * row_stride + (int64_t)h * D + i;
                a += dout[o] * (in[o] * rstd[n * rstd_stride + h]);
            }
        dw[i] += a;
    }
}

/* Whole-projection RMSNorm (OLMo 2's q/k norms) in pieces, so that a tensor-parallel view
 * whose row part is n of n_global floats can sum its rows' statistics over its group between
 * them. rownorm_sums: st[r * st_stride] = the sum over the row's n floats of x^2 (dout NULL),
 * or of dout * w * x * rstd (the backward's; rstd[r * st_stride]); sums in double. */
void rownorm_sums(float *st, int64_t st_stride, const float *in, const float *dout,
                  const float *w, const float *rstd, int64_t N, int n, int64_t row_stride) {
#pragma omp parallel for schedule(static) if (N * n >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const float *x = in + r * row_stride;
        double s = 0.0;
        if (!dout) {
            for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
        } else {
            const float *dy = dout + r * row_stride, rs = rstd[r * st_stride];
            for (int i = 0; i < n; i++) s += dy[i] * w[i] * (x[i] * rs);
        }
        st[r * st_stride] = (float)s;
    }
}

/* out = in * rstd * w with rstd = 1 / sqrt(ss / n_global + eps) from the whole row's sum of
 * squares ss[r * st_stride]; rstd[r * st_stride] is written (it may be ss), out may be in. */
void rownorm_forward(float *out, float *rstd, const float *in, const float *w, const float *ss,
                     int64_t N, int n, int64_t row_stride, int64_t st_stride, int n_global,
                     float eps) {
#pragma omp parallel for schedule(static) if (N * n >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const float *x = in + r * row_stride;
        float *y = out + r * row_stride;
        const float rs = (float)(1.0 / sqrt((double)ss[r * st_stride] / n_global + eps));
        for (int i = 0; i < n; i++) y[i] = x[i] * rs * w[i];
        rstd[r * st_stride] = rs;
    }
}

/* Its backward from the whole row's sums of dout * w * xhat (dots): din SET, dw (n) += (each
 * column summed over the rows in order; may be NULL). */
void rownorm_backward(float *din, float *dw, const float *dout, const float *in, const float *w,
                      const float *rstd, const float *dots, int64_t N, int n, int64_t row_stride,
                      int64_t st_stride, int n_global) {
#pragma omp parallel for schedule(static) if (N * n >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const int64_t o = r * row_stride;
        const float rs = rstd[r * st_stride], mb = dots[r * st_stride] / (float)n_global;
        for (int i = 0; i < n; i++)
            din[o + i] = rs * (dout[o + i] * w[i] - in[o + i] * rs * mb);
    }
    if (!dw) return;
#pragma omp parallel for schedule(static) if (N * n >= LOOM_PAR_MIN)
    for (int i = 0; i < n; i++) {
        float a = 0.0f;
        for (int64_t r = 0; r < N; r++)
            a += dout[r * row_stride + i] * (in[r * row_stride + i] * rstd[r * st_stride]);
        dw[i] += a;
    }
}

#define LOOM_KSELF "kernels/norm.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(layernorm_forward, (float *out, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int64_t N, int C,
                                  float eps),
              (out, mean, rstd, inp, weight, bias, N, C, eps))
LOOM_DISPATCH(layernorm_backward, (float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, const float *mean,
                                   const float *rstd, int64_t N, int C),
              (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C))
LOOM_DISPATCH(rmsnorm_forward, (float *out, float *rstd, const float *inp, const float *weight,
                                int64_t N, int C, float eps),
              (out, rstd, inp, weight, N, C, eps))
LOOM_DISPATCH(rmsnorm_backward, (float *dinp, float *dweight, const float *dout, const float *inp,
                                 const float *weight, const float *rstd, int64_t N, int C),
              (dinp, dweight, dout, inp, weight, rstd, N, C))

#else /* one level of the kernels (isa_variants.h) */

static void LOOM_KV(layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int64_t N, int C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++) s += x[i];
        double m = s / C;
        double v = 0.0;
#pragma omp simd reduction(+ : v)
        for (int i = 0; i < C; i++) {
            double d = x[i] - m;
            v += d * d;
        }
        float fm = (float)m;
        float rs = (float)(1.0 / sqrt(v / C + eps));
        for (int i = 0; i < C; i++) y[i] = (x[i] - fm) * rs * weight[i] + bias[i];
        if (mean) mean[n] = fm;
        if (rstd) rstd[n] = rs;
    }
}

static void LOOM_KV(layernorm_backward)(float *dinp, float *dweight, float *dbias,
                                        const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int64_t N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * C, *dy = dout + n * C;
            float *dx = dinp + n * C;
            float m = mean[n], rs = rstd[n];
            /* dxhat = dy * w; dx = rs * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
            double a = 0.0, b = 0.0;
#pragma omp simd reduction(+ : a, b)
            for (int i = 0; i < C; i++) {
                float dxh = dy[i] * weight[i];
                float xh = (x[i] - m) * rs;
                a += dxh;
                b += dxh * xh;
            }
            float ma = (float)(a / C), mb = (float)(b / C);
            for (int i = 0; i < C; i++) {
                float dxh = dy[i] * weight[i];
                float xh = (x[i] - m) * rs;
                dx[i] += rs * (dxh - ma - xh * mb);
            }
        }
    }
    if (dweight || dbias) {
        int nchunks = (C + NORM_COLS - 1) / NORM_COLS;
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
        for (int c = 0; c < nchunks; c++) {
            int i0 = c * NORM_COLS, i1 = i0 + NORM_COLS < C ? i0 + NORM_COLS : C;
            float aw[NORM_COLS], ab[NORM_COLS];
            for (int i = 0; i < i1 - i0; i++) aw[i] = ab[i] = 0.0f;
            for (int64_t n = 0; n < N; n++) {
                const float *x = inp + n * C + i0, *dy = dout + n * C + i0;
                float m = mean[n], rs = rstd[n];
                for (int i = 0; i < i1 - i0; i++) {
                    aw[i] += dy[i] * ((x[i] - m) * rs);
                    ab[i] += dy[i];
                }
            }
            for (int i = i0; i < i1; i++) {
                if (dweight) dweight[i] += aw[i - i0];
                if (dbias) dbias[i] += ab[i - i0];
            }
        }
    }
}

static void LOOM_KV(rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight,
                     int64_t N, int C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++) s += (double)x[i] * x[i];
        float rs = (float)(1.0 / sqrt(s / C + eps));
        for (int i = 0; i < C; i++) y[i] = x[i] * rs * weight[i];
        if (rstd) rstd[n] = rs;
    }
}

static void LOOM_KV(rmsnorm_backward)(float *dinp, float *dweight, const float *dout,
                                      const float *inp,
                      const float *weight, const float *rstd, int64_t N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * C, *dy = dout + n * C;
            float *dx = dinp + n * C;
            float rs = rstd[n];
            /* y = x * rs * w: dx = rs * (dy*w - xhat * mean(dy*w*xhat)), xhat = x * rs */
            double b = 0.0;
#pragma omp simd reduction(+ : b)
            for (int i = 0; i < C; i++) b += dy[i] * weight[i] * (x[i] * rs);
            float mb = (float)(b / C);
            for (int i = 0; i < C; i++) dx[i] += rs * (dy[i] * weight[i] - x[i] * rs * mb);
        }
    }
    if (dweight) {
        int nchunks = (C + NORM_COLS - 1) / NORM_COLS;
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
        for (int c = 0; c < nchunks; c++) {
            int i0 = c * NORM_COLS, i1 = i0 + NORM_COLS < C ? i0 + NORM_COLS : C;
            float aw[NORM_COLS];
            for (int i = 0; i < i1 - i0; i++) aw[i] = 0.0f;
            for (int64_t n = 0; n < N; n++) {
                const float *x = inp + n * C + i0, *dy = dout + n * C + i0;
                float rs = rstd[n];
                for (int i = 0; i < i1 - i0; i++) aw[i] += dy[i] * (x[i] * rs);
            }
            for (int i = i0; i < i1; i++) dweight[i] += aw[i - i0];
        }
    }
}

#endif
