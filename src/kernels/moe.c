/* Mixture-of-experts routing, dispatch and combine: the cpu kernels of the MoE ops of
 * include/loom/backend.h ("MoE"), called by src/model/moe.c through the backend table.
 *
 * Compiled once, at the build's baseline level (not per ISA level): the arithmetic is the
 * order the MoE op had when it looped on the host, so results are bit for bit those (no FMA
 * contraction at the baseline level; exp/log from libm in double). Shapes: N tokens, E
 * experts, K choices per token; e (N,K) the chosen experts best first, pos (N,K) each choice's
 * expert-major row (-1: dropped by capacity), cnt (E) the kept rows of each expert. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/base.h"
#include "loom/bf16.h"
#include "kernels/moe_kernels.h"

/* the gate weight of choice j of a token (probabilities pt (E), choices et (K)): pt[e_j], or
 * renormalized, pt[e_j] over the sum of its K choices' (float32, as transformers) */
static float gate_weight(const float *pt, const int32_t *et, int K, int j, int renorm) {
    if (!renorm) return pt[et[j]];
    float S = 0.0f;
    for (int i = 0; i < K; i++) S += pt[et[i]];
    return pt[et[j]] / S;
}

static void *scratch(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) loom_panic(__FILE__, __LINE__, "out of memory (%zu bytes of MoE scratch)", bytes);
    return p;
}

void loom_moe_route(float *p, float *lse, int32_t *e, int32_t *pos, int32_t *cnt,
                    double *stats, int64_t N, int E, int K, int64_t G, float capacity_factor) {
    /* softmax and lse in double per row; top-k: the j-th best not yet taken (ties: lower) */
    for (int64_t t = 0; t < N; t++) {
        float *row = p + t * E;
        float mx = row[0];
        for (int x = 1; x < E; x++) mx = row[x] > mx ? row[x] : mx;
        double sum = 0;
        for (int x = 0; x < E; x++) sum += exp((double)row[x] - mx);
        const double ls = mx + log(sum);
        lse[t] = (float)ls;
        for (int x = 0; x < E; x++) row[x] = (float)exp((double)row[x] - ls);
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int x = 0; x < E; x++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= e[t * K + i] == x;
                if (!taken && (best < 0 || row[x] > row[best])) best = x;
            }
            e[t * K + j] = best;
        }
    }
    /* capacity per routing group of G tokens: first choices first, then in token order */
    int64_t *all = scratch((size_t)E * 2 * sizeof(int64_t)), *fill = all + E;
    double *pm = scratch((size_t)E * sizeof(double));
    for (int x = 0; x < E; x++) cnt[x] = 0;
    for (int64_t g0 = 0; g0 < N; g0 += G) {
        const int64_t g1 = g0 + G < N ? g0 + G : N, Gg = g1 - g0;
        const int64_t cap = capacity_factor > 0.0f
                                ? (int64_t)floor((double)capacity_factor * K * (double)Gg / E)
                                : INT64_MAX;
        memset(all, 0, (size_t)E * sizeof(int64_t));
        memset(fill, 0, (size_t)E * sizeof(int64_t));
        memset(pm, 0, (size_t)E * sizeof(double));
        int64_t dropped = 0;
        for (int j = 0; j < K; j++)
            for (int64_t t = g0; t < g1; t++) {
                const int x = e[t * K + j];
                all[x]++;
                if (fill[x] < cap) {
                    fill[x]++;
                    pos[t * K + j] = 0; /* kept: its row is numbered below */
                } else {
                    pos[t * K + j] = -1;
                    dropped++;
                }
            }
        if (stats) { /* load (E), dropped, assigned, aux_sum, z_sum, tokens */
            for (int64_t t = g0; t < g1; t++)
                for (int x = 0; x < E; x++) pm[x] += p[t * E + x];
            double aux = 0;
            for (int x = 0; x < E; x++)
                aux += (double)all[x] / (double)(Gg * K) * (pm[x] / (double)Gg);
            stats[E + 2] += (double)Gg * E * aux;
            stats[E + 4] += (double)Gg;
            stats[E] += (double)dropped;
            stats[E + 1] += (double)(Gg * K);
            for (int x = 0; x < E; x++) stats[x] += (double)all[x];
            for (int64_t t = g0; t < g1; t++) stats[E + 3] += (double)lse[t] * lse[t];
        }
    }
    /* number the kept rows expert-major, tokens in order */
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++)
            if (pos[t * K + j] >= 0) cnt[e[t * K + j]]++;
    int64_t *next = all, at = 0;
    for (int x = 0; x < E; x++) {
        next[x] = at;
        at += cnt[x];
    }
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++)
            if (pos[t * K + j] >= 0) pos[t * K + j] = (int32_t)next[e[t * K + j]]++;
    free(all);
    free(pm);
}

void loom_moe_gather(void *X, const void *x, const int32_t *pos, int64_t N, int K,
                     size_t row_bytes) {
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++)
            if (pos[t * K + j] >= 0)
                memcpy((char *)X + (size_t)pos[t * K + j] * row_bytes,
                       (const char *)x + (size_t)t * row_bytes, row_bytes);
}

void loom_moe_combine(float *y, const float *YB, const float *p, const int32_t *e,
                      const int32_t *pos, int64_t N, int E, int K, int C, int renorm) {
    memset(y, 0, (size_t)(N * C) * sizeof(float));
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int32_t q = pos[t * K + j];
            if (q < 0) continue;
            const float w = gate_weight(p + t * E, e + t * K, K, j, renorm);
            const float *src = YB + (int64_t)q * C;
            float *dst = y + t * C;
            for (int i = 0; i < C; i++) dst[i] += w * src[i];
        }
}

void loom_moe_combine_backward(float *dYB, float *dw, const float *dy, const float *YB,
                               const float *p, const int32_t *e, const int32_t *pos, int64_t N,
                               int E, int K, int C, int renorm) {
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int32_t q = pos[t * K + j];
            dw[t * K + j] = 0;
            if (q < 0) continue;
            const float w = gate_weight(p + t * E, e + t * K, K, j, renorm);
            const float *g = dy + t * C, *yq = YB + (int64_t)q * C;
            float *d = dYB + (int64_t)q * C;
            double dot = 0;
            for (int i = 0; i < C; i++) {
                d[i] = w * g[i];
                dot += (double)g[i] * yq[i];
            }
            dw[t * K + j] = (float)dot;
        }
}

void loom_moe_scatter_add(float *dx, const float *dXB, const int32_t *pos, int64_t N, int K,
                          int C) {
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int32_t q = pos[t * K + j];
            if (q < 0) continue;
            const float *src = dXB + (int64_t)q * C;
            float *d = dx + t * C;
            for (int i = 0; i < C; i++) d[i] += src[i];
        }
}

void loom_moe_router_backward(float *dl, const float *p, const float *lse, const int32_t *e,
                              const int32_t *pos, const float *dw, int64_t N, int E, int K,
                              int64_t G, double aux, double zc, int renorm) {
    double *fe = scratch((size_t)E * 2 * sizeof(double)), *dp = fe + E;
    for (int64_t g0 = 0; g0 < N; g0 += G) {
        const int64_t g1 = g0 + G < N ? g0 + G : N, Gg = g1 - g0;
        memset(fe, 0, (size_t)E * sizeof(double));
        for (int64_t t = g0; t < g1; t++)
            for (int j = 0; j < K; j++) fe[e[t * K + j]] += 1.0;
        for (int x = 0; x < E; x++) fe[x] /= (double)(Gg * K);
        for (int64_t t = g0; t < g1; t++) {
            const float *pt = p + t * E;
            const int32_t *et = e + t * K, *qt = pos + t * K;
            for (int x = 0; x < E; x++) dp[x] = aux * E * fe[x];
            if (renorm) { /* w_j = p_j / S over the top k: dp_j = (dw_j - sum_i dw_i w_i) / S */
                double S = 0, sw = 0;
                for (int j = 0; j < K; j++) S += pt[et[j]];
                for (int j = 0; j < K; j++)
                    if (qt[j] >= 0) sw += (double)dw[t * K + j] * gate_weight(pt, et, K, j, 1);
                for (int j = 0; j < K; j++)
                    dp[et[j]] += ((qt[j] >= 0 ? dw[t * K + j] : 0.0) - sw) / S;
            } else {
                for (int j = 0; j < K; j++)
                    if (qt[j] >= 0) dp[et[j]] += dw[t * K + j];
            }
            double sum = 0;
            for (int x = 0; x < E; x++) sum += pt[x] * dp[x];
            for (int x = 0; x < E; x++)
                dl[t * E + x] = (float)(pt[x] * (dp[x] - sum) + zc * 2.0 * lse[t] * pt[x]);
        }
    }
    free(fe);
}

void loom_moe_sigmoid(float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = 1.0f / (1.0f + expf(-g[i]));
}

void loom_moe_gate_add(float *y, const float *g, const float *ys, int64_t N, int C) {
    for (int64_t t = 0; t < N; t++)
        for (int i = 0; i < C; i++) y[t * C + i] += g[t] * ys[t * C + i];
}

void loom_moe_gate_backward(float *dys, float *dz, const float *dy, const float *g,
                            const float *ys, int64_t N, int C) {
    for (int64_t t = 0; t < N; t++) {
        double dot = 0;
        for (int i = 0; i < C; i++) {
            dys[t * C + i] = g[t] * dy[t * C + i];
            dot += (double)dy[t * C + i] * ys[t * C + i];
        }
        dz[t] = (float)(dot * g[t] * (1.0 - g[t]));
    }
}

/* ---- bf16 (training.precision bf16): bf16 rows, fp32 gate weights and accumulation ---- */

void loom_bf16_moe_combine(uint16_t *y, const uint16_t *YB, const float *p, const int32_t *e,
                           const int32_t *pos, int64_t N, int E, int K, int C, int renorm,
                           const uint16_t *ys, const float *g, int S) {
    float *w = scratch((size_t)K * sizeof(float));
    for (int64_t t = 0; t < N; t++) {
        for (int j = 0; j < K; j++)
            w[j] = pos[t * K + j] >= 0 ? gate_weight(p + t * E, e + t * K, K, j, renorm) : 0.0f;
        for (int i = 0; i < C; i++) {
            float a = 0.0f;
            for (int j = 0; j < K; j++) {
                const int32_t q = pos[t * K + j];
                if (q >= 0) a += w[j] * loom_bf16_widen(YB[(int64_t)q * C + i]);
            }
            for (int s = 0; s < S; s++)
                a += (g ? g[(int64_t)s * N + t] : 1.0f) *
                     loom_bf16_widen(ys[((int64_t)s * N + t) * C + i]);
            y[t * C + i] = loom_bf16_round(a);
        }
    }
    free(w);
}

void loom_bf16_moe_combine_backward(float *dYB, float *dw, const float *dy, const uint16_t *YB,
                                    const float *p, const int32_t *e, const int32_t *pos,
                                    int64_t N, int E, int K, int C, int renorm) {
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int32_t q = pos[t * K + j];
            dw[t * K + j] = 0;
            if (q < 0) continue;
            const float w = gate_weight(p + t * E, e + t * K, K, j, renorm);
            const float *gr = dy + t * C;
            const uint16_t *yq = YB + (int64_t)q * C;
            float *d = dYB + (int64_t)q * C;
            double dot = 0;
            for (int i = 0; i < C; i++) {
                d[i] = w * gr[i];
                dot += (double)gr[i] * loom_bf16_widen(yq[i]);
            }
            dw[t * K + j] = (float)dot;
        }
}

void loom_bf16_moe_gate_backward(float *dys, float *dz, const float *dy, const float *g,
                                 const uint16_t *ys, int64_t N, int C) {
    for (int64_t t = 0; t < N; t++) {
        double dot = 0;
        for (int i = 0; i < C; i++) {
            dys[t * C + i] = g[t] * dy[t * C + i];
            dot += (double)dy[t * C + i] * loom_bf16_widen(ys[t * C + i]);
        }
        dz[t] = (float)(dot * g[t] * (1.0 - g[t]));
    }
}
