/* Token (+ learned position) embedding. wte (V,C), wpe (maxT,C), tokens (B,T), out (B,T,C).
 * Token ids are trusted here: the data loader validates them against V. */
#include <limits.h>

#include "kernels/kmath.h"

#include "loom/kernels.h"

void embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                       int B, int T, int C, int pos0) {
    int64_t rows = (int64_t)B * T;
#pragma omp parallel for schedule(static) if (rows * C >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *e = wte + (int64_t)tokens[r] * C;
        float *y = out + r * C;
        if (wpe) {
            const float *p = wpe + (int64_t)(pos0 + r % T) * C;
            for (int i = 0; i < C; i++) y[i] = e[i] + p[i];
        } else {
            memcpy(y, e, (size_t)C * sizeof(float));
        }
    }
}

void embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                        int B, int T, int C, int pos0) {
    /* the whole table is the shard starting at 0 (ids are below V, so below INT_MAX) */
    embedding_shard_backward(dwte, dwpe, dout, tokens, 0, INT_MAX, B, T, C, pos0);
}

void embedding_shard_forward(float *out, const int32_t *tokens, const float *wte, int v0, int Vl,
                             const float *wpe, int B, int T, int C, int pos0) {
    int64_t rows = (int64_t)B * T;
#pragma omp parallel for schedule(static) if (rows * C >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t v = (int64_t)tokens[r] - v0;
        const float *e = v >= 0 && v < Vl ? wte + v * C : NULL;
        const float *p = wpe ? wpe + (int64_t)(pos0 + r % T) * C : NULL;
        float *y = out + r * C;
        for (int i = 0; i < C; i++) y[i] = (e ? e[i] : 0.0f) + (p ? p[i] : 0.0f);
    }
}

/* Repeated tokens add into the same dwte row, so threads split the channels, not the rows:
 * each owns a fixed slice of C and visits the rows in order (deterministic, race-free). */
void embedding_shard_backward(float *dwte, float *dwpe, const float *dout,
                              const int32_t *tokens, int v0, int Vl, int B, int T, int C,
                              int pos0) {
    enum { COLS = 64 };
    int64_t rows = (int64_t)B * T;
    int nchunks = (C + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) if (rows * C >= LOOM_PAR_MIN)
    for (int c = 0; c < nchunks; c++) {
        int i0 = c * COLS, i1 = i0 + COLS < C ? i0 + COLS : C;
        for (int64_t r = 0; r < rows; r++) {
            const float *dy = dout + r * C;
            const int64_t v = (int64_t)tokens[r] - v0;
            if (dwte && v >= 0 && v < Vl) {
                float *d = dwte + v * C;
                for (int i = i0; i < i1; i++) d[i] += dy[i];
            }
            if (dwpe) {
                float *d = dwpe + (int64_t)(pos0 + r % T) * C;
                for (int i = i0; i < i1; i++) d[i] += dy[i];
            }
        }
    }
}
