/* Mean pooling over the sequence (the classification head's input). */
#include <string.h>

#include "loom/kernels.h"

void mean_pool_forward(float *out, const float *inp, int B, int T, int C) {
    const float inv = 1.0f / (float)T;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        float *o = out + (size_t)b * C;
        memset(o, 0, (size_t)C * sizeof(float));
        for (int t = 0; t < T; t++) {
            const float *x = inp + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) o[c] += x[c];
        }
        for (int c = 0; c < C; c++) o[c] *= inv;
    }
}

void mean_pool_backward(float *dinp, const float *dout, int B, int T, int C) {
    const float inv = 1.0f / (float)T;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        float *d = dinp + bt * C;
        const float *g = dout + (bt / T) * C;
        for (int c = 0; c < C; c++) d[c] += g[c] * inv;
    }
}
