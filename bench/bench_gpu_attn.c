/* Flash attention forward + backward through a backend's op table (bench/bench_gpu.py's loom
 * side): bf16 fused qkv rows, causal, the ops bf16 training runs (bf16_flash_attention_*).
 *   bench_gpu_attn BACKEND B T H D REPS  ->  one JSON line on stdout:
 *   {"fwd_ms": median, "bwd_ms": median, "pairs": causal (query, key) pairs per head}
 * Each op is timed alone between mem_sync calls (wall clock, the median of REPS after one
 * untimed run). FLOPs are the caller's to count (bench_gpu.py: 4 D per pair forward, 10 D
 * backward with the recomputation, as FlashAttention-2's paper counts). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/backend.h"
#include "loom/base.h"
#include "loom/bf16.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: bench_gpu_attn BACKEND B T H D REPS\n");
        return 2;
    }
    const loom_backend *be = loom_backend_find(argv[1]);
    loom_err err = {{0}};
    if (!be) {
        fprintf(stderr, "bench_gpu_attn: no backend '%s' (%s)\n", argv[1], loom_backend_names());
        return 1;
    }
    if (loom_backend_ready(be, &err)) {
        fprintf(stderr, "bench_gpu_attn: %s\n", err.msg);
        return 1;
    }
    if (!be->bf16_flash_attention_forward || !be->bf16_flash_attention_backward) {
        fprintf(stderr, "bench_gpu_attn: backend %s has no bf16 flash attention\n", be->name);
        return 1;
    }
    const int B = atoi(argv[2]), T = atoi(argv[3]), H = atoi(argv[4]), D = atoi(argv[5]);
    const int reps = atoi(argv[6]);
    if (B < 1 || T < 1 || H < 1 || D < 1 || reps < 1) return 2;
    const int64_t rows = (int64_t)B * T, qkv_w = 3 * (int64_t)H * D, o_w = (int64_t)H * D;
    uint16_t *h = malloc((size_t)(rows * qkv_w) * 2);
    float *g = malloc((size_t)(rows * o_w) * 4);
    uint64_t s = 42;
    for (int64_t i = 0; i < rows * qkv_w; i++)
        h[i] = loom_bf16_round((float)((loom_rng_splitmix(s++) >> 40) / 16777216.0 - 0.5));
    for (int64_t i = 0; i < rows * o_w; i++)
        g[i] = (float)((loom_rng_splitmix(s++) >> 40) / 16777216.0 - 0.5) * 1e-2f;
    void *qkv = be->mem_alloc((size_t)(rows * qkv_w) * 2, 0);
    void *out = be->mem_alloc((size_t)(rows * o_w) * 2, 0);
    void *dout = be->mem_alloc((size_t)(rows * o_w) * 4, 0);
    void *dqkv = be->mem_alloc((size_t)(rows * qkv_w) * 4, 0);
    void *lse = be->mem_alloc((size_t)B * H * T * 4, 0);
    const int64_t wsf = be->bf16_flash_ws_floats ? be->bf16_flash_ws_floats(B, T, H, H, D) : 0;
    void *ws = be->mem_alloc((size_t)(wsf > 0 ? wsf : 1) * 4, 0);
    be->mem_h2d(qkv, h, (size_t)(rows * qkv_w) * 2);
    be->mem_h2d(dout, g, (size_t)(rows * o_w) * 4);
    loom_attn_mask mask;
    memset(&mask, 0, sizeof mask);
    mask.causal = 1;
    double *tf = malloc(sizeof(double) * reps), *tb = malloc(sizeof(double) * reps);
    for (int r = -1; r < reps; r++) {
        be->mem_sync();
        double t0 = now_ms();
        int rc = be->bf16_flash_attention_forward(out, lse, qkv, ws, B, T, H, H, D, &mask);
        be->mem_sync();
        double t1 = now_ms();
        rc |= be->bf16_flash_attention_backward(dqkv, dout, qkv, out, lse, ws, B, T, H, H, D,
                                                &mask);
        be->mem_sync();
        double t2 = now_ms();
        if (rc) {
            fprintf(stderr, "bench_gpu_attn: the flash ops refused B %d T %d H %d D %d (%d)\n",
                    B, T, H, D, rc);
            return 1;
        }
        if (r >= 0) tf[r] = t1 - t0, tb[r] = t2 - t1;
    }
    qsort(tf, reps, sizeof *tf, cmp_d);
    qsort(tb, reps, sizeof *tb, cmp_d);
    printf("{\"fwd_ms\": %.6g, \"bwd_ms\": %.6g, \"pairs\": %lld}\n", tf[reps / 2], tb[reps / 2],
           (long long)attention_causal_pairs(T));
    return 0;
}
