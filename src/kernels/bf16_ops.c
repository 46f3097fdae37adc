/* bf16 mixed-precision training: the element-wise and norm ops on bf16 storage
 * (training.precision bf16, docs/kernels.md "bf16 training"). Activations saved for backward
 * are bf16 (uint16_t, include/loom/bf16.h); every op widens them exactly to fp32, computes in
 * fp32 (norm statistics in double, as the fp32 kernels), and rounds its bf16 outputs once to
 * nearest even. Activation gradients, norm statistics (mean, rstd), lse and the parameters
 * these ops read (norm weights, biases, the embedding tables) are fp32. The math of each op is
 * the fp32 kernel's of the same name on the widened inputs. */
#ifndef LOOM_KV
#include "kernels/kmath.h"
#include "loom/bf16.h"
#include "loom/kernels.h"
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f
enum { NORM_COLS = 64 };

/* explicit conversions (the only ones: no op converts its operands silently) */
void bf16_from_f32(uint16_t *dst, const float *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = loom_bf16_round(src[i]);
}

void bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = loom_bf16_widen(src[i]);
}

/* out (B,T,C) bf16 = round(wte[token] + wpe[pos0 + t]) (fp32 tables, the sum in fp32) */
void bf16_embedding_forward(uint16_t *out, const int32_t *tokens, const float *wte,
                            const float *wpe, int B, int T, int C, int pos0) {
    const int64_t rows = (int64_t)B * T;
#pragma omp parallel for schedule(static) if (rows * C >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *e = wte + (int64_t)tokens[r] * C;
        const float *p = wpe ? wpe + (int64_t)(pos0 + r % T) * C : NULL;
        uint16_t *y = out + r * C;
        for (int i = 0; i < C; i++) y[i] = loom_bf16_round(p ? e[i] + p[i] : e[i]);
    }
}

/* Flash attention over bf16 fused rows, one batch row at a time: its q|k|v widened exactly
 * into ws, the fp32 kernel (fp32 scores, softmax and lse), its output rounded. ws:
 * bf16_flash_ws_floats (one batch row's). A document mask's ids advance with the row. */
int64_t bf16_flash_ws_floats(int B, int T, int H, int KVH, int D) {
    (void)B;
    return (int64_t)T * ((int64_t)(H + 2 * KVH) * D + (int64_t)H * D);
}

static loom_attn_mask row_mask(const loom_attn_mask *mask, int b) {
    loom_attn_mask mk = *mask;
    if (mk.q_doc) {
        mk.q_doc += (int64_t)b * mk.q_doc_bs;
        mk.k_doc += (int64_t)b * mk.k_doc_bs;
    }
    return mk;
}

int bf16_flash_attention_forward(uint16_t *out, float *lse, const uint16_t *qkv, float *ws,
                                 int B, int T, int H, int KVH, int D,
                                 const loom_attn_mask *mask) {
    const int64_t QKV = (int64_t)(H + 2 * KVH) * D, HD = (int64_t)H * D;
    float *x = ws, *o = ws + (int64_t)T * QKV;
    const loom_attn_dims dims = flash_attention_dims_qkv(1, T, H, KVH, D);
    for (int b = 0; b < B; b++) {
        const loom_attn_mask mk = row_mask(mask, b);
        bf16_to_f32(x, qkv + (int64_t)b * T * QKV, T * QKV);
        const int rc = flash_attention_forward(o, lse ? lse + (int64_t)b * H * T : NULL, x,
                                               x + HD, x + HD + (int64_t)KVH * D, &dims, &mk,
                                               LOOM_ATTN_ISA_AUTO);
        if (rc != 0) return rc;
        bf16_from_f32(out + (int64_t)b * T * HD, o, T * HD);
    }
    return 0;
}

/* dqkv (B,T,QKV) fp32 SET from dout (B,T,H*D) fp32 and the forward's bf16 q|k|v and output */
int bf16_flash_attention_backward(float *dqkv, const float *dout, const uint16_t *qkv,
                                  const uint16_t *out, const float *lse, float *ws, int B,
                                  int T, int H, int KVH, int D, const loom_attn_mask *mask) {
    const int64_t QKV = (int64_t)(H + 2 * KVH) * D, HD = (int64_t)H * D;
    const int64_t KD = (int64_t)KVH * D;
    float *x = ws, *o = ws + (int64_t)T * QKV;
    const loom_attn_dims dims = flash_attention_dims_qkv(1, T, H, KVH, D);
    for (int b = 0; b < B; b++) {
        const loom_attn_mask mk = row_mask(mask, b);
        const int64_t r = (int64_t)b * T;
        bf16_to_f32(x, qkv + r * QKV, T * QKV);
        bf16_to_f32(o, out + r * HD, T * HD);
        float *dq = dqkv + r * QKV;
        const int rc = flash_attention_backward_set(dq, dq + HD, dq + HD + KD, dout + r * HD, x,
                                                    x + HD, x + HD + KD, o,
                                                    lse + (int64_t)b * H * T, &dims, &mk,
                                                    LOOM_ATTN_ISA_AUTO);
        if (rc != 0) return rc;
    }
    return 0;
}

#define LOOM_KSELF "kernels/bf16_ops.c"
#include "kernels/isa_variants.h"

LOOM_DISPATCH(bf16_layernorm_forward,
              (uint16_t *out, float *mean, float *rstd, const uint16_t *inp, const float *weight,
               const float *bias, int64_t N, int C, float eps),
              (out, mean, rstd, inp, weight, bias, N, C, eps))
LOOM_DISPATCH(bf16_layernorm_backward,
              (float *dinp, float *dweight, float *dbias, const float *dout, const uint16_t *inp,
               const float *weight, const float *mean, const float *rstd, int64_t N, int C),
              (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C))
LOOM_DISPATCH(bf16_rmsnorm_forward,
              (uint16_t *out, float *rstd, const uint16_t *inp, const float *weight, int64_t N,
               int C, float eps),
              (out, rstd, inp, weight, N, C, eps))
LOOM_DISPATCH(bf16_rmsnorm_backward,
              (float *dinp, float *dweight, const float *dout, const uint16_t *inp,
               const float *weight, const float *rstd, int64_t N, int C),
              (dinp, dweight, dout, inp, weight, rstd, N, C))
LOOM_DISPATCH(bf16_gelu_forward, (uint16_t *out, const uint16_t *inp, int64_t n), (out, inp, n))
LOOM_DISPATCH(bf16_gelu_backward,
              (float *dinp, int set, const uint16_t *inp, const float *dout, int64_t n),
              (dinp, set, inp, dout, n))
LOOM_DISPATCH(bf16_glu_forward, (uint16_t *out, const uint16_t *inp, int64_t N, int F, int gelu),
              (out, inp, N, F, gelu))
LOOM_DISPATCH(bf16_glu_backward,
              (float *dinp, const uint16_t *inp, const float *dout, int64_t N, int F, int gelu),
              (dinp, inp, dout, N, F, gelu))
LOOM_DISPATCH(bf16_residual_forward,
              (uint16_t *out, const uint16_t *a, const uint16_t *b, int64_t n), (out, a, b, n))
LOOM_DISPATCH(bf16_rope_forward,
              (uint16_t *x, int64_t B, int T, int nh, int D, int64_t row_stride,
               const float *cos_t, const float *sin_t, int pos0),
              (x, B, T, nh, D, row_stride, cos_t, sin_t, pos0))

#else /* one level of the kernels (isa_variants.h) */

#define W16 loom_bf16_widen
#define R16 loom_bf16_round

static void LOOM_KV(bf16_layernorm_forward)(uint16_t *out, float *mean, float *rstd,
                                            const uint16_t *inp, const float *weight,
                                            const float *bias, int64_t N, int C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const uint16_t *x = inp + n * C;
        uint16_t *y = out + n * C;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++) s += W16(x[i]);
        const double m = s / C;
        double v = 0.0;
#pragma omp simd reduction(+ : v)
        for (int i = 0; i < C; i++) {
            const double d = W16(x[i]) - m;
            v += d * d;
        }
        const float fm = (float)m, rs = (float)(1.0 / sqrt(v / C + eps));
        for (int i = 0; i < C; i++)
            y[i] = R16((W16(x[i]) - fm) * rs * weight[i] + (bias ? bias[i] : 0.0f));
        if (mean) mean[n] = fm;
        if (rstd) rstd[n] = rs;
    }
}

/* dinp += (fp32), dweight, dbias += (column slices, rows in order) */
static void LOOM_KV(bf16_layernorm_backward)(float *dinp, float *dweight, float *dbias,
                                             const float *dout, const uint16_t *inp,
                                             const float *weight, const float *mean,
                                             const float *rstd, int64_t N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const uint16_t *x = inp + n * C;
            const float *dy = dout + n * C;
            float *dx = dinp + n * C;
            const float m = mean[n], rs = rstd[n];
            double a = 0.0, b = 0.0;
#pragma omp simd reduction(+ : a, b)
            for (int i = 0; i < C; i++) {
                const float dxh = dy[i] * weight[i], xh = (W16(x[i]) - m) * rs;
                a += dxh;
                b += dxh * xh;
            }
            const float ma = (float)(a / C), mb = (float)(b / C);
            for (int i = 0; i < C; i++) {
                const float dxh = dy[i] * weight[i], xh = (W16(x[i]) - m) * rs;
                dx[i] += rs * (dxh - ma - xh * mb);
            }
        }
    }
    if (dweight || dbias) {
        const int nchunks = (C + NORM_COLS - 1) / NORM_COLS;
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
        for (int c = 0; c < nchunks; c++) {
            const int i0 = c * NORM_COLS, i1 = i0 + NORM_COLS < C ? i0 + NORM_COLS : C;
            float aw[NORM_COLS], ab[NORM_COLS];
            for (int i = 0; i < i1 - i0; i++) aw[i] = ab[i] = 0.0f;
            for (int64_t n = 0; n < N; n++) {
                const uint16_t *x = inp + n * C + i0;
                const float *dy = dout + n * C + i0;
                const float m = mean[n], rs = rstd[n];
                for (int i = 0; i < i1 - i0; i++) {
                    aw[i] += dy[i] * ((W16(x[i]) - m) * rs);
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

static void LOOM_KV(bf16_rmsnorm_forward)(uint16_t *out, float *rstd, const uint16_t *inp,
                                          const float *weight, int64_t N, int C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const uint16_t *x = inp + n * C;
        uint16_t *y = out + n * C;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++) {
            const double xi = W16(x[i]);
            s += xi * xi;
        }
        const float rs = (float)(1.0 / sqrt(s / C + eps));
        for (int i = 0; i < C; i++) y[i] = R16(W16(x[i]) * rs * weight[i]);
        if (rstd) rstd[n] = rs;
    }
}

static void LOOM_KV(bf16_rmsnorm_backward)(float *dinp, float *dweight, const float *dout,
                                           const uint16_t *inp, const float *weight,
                                           const float *rstd, int64_t N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const uint16_t *x = inp + n * C;
            const float *dy = dout + n * C;
            float *dx = dinp + n * C;
            const float rs = rstd[n];
            double b = 0.0;
#pragma omp simd reduction(+ : b)
            for (int i = 0; i < C; i++) b += dy[i] * weight[i] * (W16(x[i]) * rs);
            const float mb = (float)(b / C);
            for (int i = 0; i < C; i++)
                dx[i] += rs * (dy[i] * weight[i] - W16(x[i]) * rs * mb);
        }
    }
    if (dweight) {
        const int nchunks = (C + NORM_COLS - 1) / NORM_COLS;
#pragma omp parallel for schedule(static) if (N * C >= LOOM_PAR_MIN)
        for (int c = 0; c < nchunks; c++) {
            const int i0 = c * NORM_COLS, i1 = i0 + NORM_COLS < C ? i0 + NORM_COLS : C;
            float aw[NORM_COLS];
            for (int i = 0; i < i1 - i0; i++) aw[i] = 0.0f;
            for (int64_t n = 0; n < N; n++) {
                const uint16_t *x = inp + n * C + i0;
                const float *dy = dout + n * C + i0;
                const float rs = rstd[n];
                for (int i = 0; i < i1 - i0; i++) aw[i] += dy[i] * (W16(x[i]) * rs);
            }
            for (int i = i0; i < i1; i++) dweight[i] += aw[i - i0];
        }
    }
}

static inline float LOOM_KV(gelu_f)(float x) {
    const float u = GELU_K * (x + GELU_C * x * x * x);
    return 0.5f * x * (1.0f + loom_tanhf(u));
}

static inline float LOOM_KV(gelu_grad)(float x) {
    const float u = GELU_K * (x + GELU_C * x * x * x);
    const float t = loom_tanhf(u), du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * loom_sech2f(u) * du;
}

static void LOOM_KV(bf16_gelu_forward)(uint16_t *out, const uint16_t *inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = R16(LOOM_KV(gelu_f)(W16(inp[i])));
}

/* dinp = (set) or += gelu'(inp) * dout */
static void LOOM_KV(bf16_gelu_backward)(float *dinp, int set, const uint16_t *inp,
                                        const float *dout, int64_t n) {
    if (set) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) dinp[i] = LOOM_KV(gelu_grad)(W16(inp[i])) * dout[i];
    } else {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) dinp[i] += LOOM_KV(gelu_grad)(W16(inp[i])) * dout[i];
    }
}

/* inp (N, 2F) rows [gate | up] -> out (N, F) = act(gate) * up: SwiGLU (gelu 0: silu) or
 * GeGLU (gelu 1: tanh GELU) */
static void LOOM_KV(bf16_glu_forward)(uint16_t *out, const uint16_t *inp, int64_t N, int F,
                                      int gelu) {
#pragma omp parallel for schedule(static) if (N * F >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const uint16_t *g = inp + n * 2 * F, *u = g + F;
        uint16_t *y = out + n * F;
        if (gelu)
            for (int i = 0; i < F; i++) y[i] = R16(LOOM_KV(gelu_f)(W16(g[i])) * W16(u[i]));
        else
            for (int i = 0; i < F; i++) {
                const float x = W16(g[i]);
                y[i] = R16(x * loom_sigmoidf(x) * W16(u[i]));
            }
    }
}

/* dinp (N, 2F) += */
static void LOOM_KV(bf16_glu_backward)(float *dinp, const uint16_t *inp, const float *dout,
                                       int64_t N, int F, int gelu) {
#pragma omp parallel for schedule(static) if (N * F >= LOOM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const uint16_t *g = inp + n * 2 * F, *u = g + F;
        const float *dy = dout + n * F;
        float *dg = dinp + n * 2 * F, *du = dg + F;
        if (gelu)
            for (int i = 0; i < F; i++) {
                const float x = W16(g[i]), up = W16(u[i]);
                dg[i] += dy[i] * up * LOOM_KV(gelu_grad)(x);
                du[i] += dy[i] * LOOM_KV(gelu_f)(x);
            }
        else
            for (int i = 0; i < F; i++) {
                const float x = W16(g[i]), up = W16(u[i]), s = loom_sigmoidf(x);
                dg[i] += dy[i] * up * s * (1.0f + x * (1.0f - s));
                du[i] += dy[i] * x * s;
            }
    }
}

static void LOOM_KV(bf16_residual_forward)(uint16_t *out, const uint16_t *a, const uint16_t *b,
                                           int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= LOOM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = R16(W16(a[i]) + W16(b[i]));
}

/* RoPE (rotate half) in place on bf16 rows: the fp32 rotation of the widened pair, rounded
 * (the backward is rope_backward on the fp32 gradient) */
static void LOOM_KV(bf16_rope_forward)(uint16_t *x, int64_t B, int T, int nh, int D,
                                       int64_t row_stride, const float *cos_t,
                                       const float *sin_t, int pos0) {
    const int half = D / 2;
    const int64_t rows = B * T;
#pragma omp parallel for schedule(static) if (rows * nh * D >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t pos = pos0 + r % T;
        const float *c = cos_t + pos * half, *s = sin_t + pos * half;
        for (int h = 0; h < nh; h++) {
            uint16_t *x1 = x + r * row_stride + (int64_t)h * D, *x2 = x1 + half;
            for (int i = 0; i < half; i++) {
                const float a = W16(x1[i]), b = W16(x2[i]);
                x1[i] = R16(a * c[i] - b * s[i]);
                x2[i] = R16(b * c[i] + a * s[i]);
            }
        }
    }
}

#undef W16
#undef R16

#endif
