/* The profiling backend: a loom_backend whose every op calls the same op of an inner table and,
 * while the profiler records (profile.steps), wraps it in a span carrying the op's FLOPs and
 * the bytes it reads and writes (docs/observability.md, "Profiler"). Outside the window an op
 * costs one flag test more than the inner table.
 *
 * FLOPs: the GEMMs count 2 per multiply-add (matmul forward 2*N*IC*OC, backward 2*N*IC*OC per
 * gradient computed), attention counts 2*D per (query, key) pair and GEMM (attention_causal_pairs
 * for a causal self-attention), so the matmul and attention spans of a step sum to
 * loom_model_flops_per_token * tokens (the MFU convention). Element-wise ops (norms,
 * activations, softmax, AdamW) carry estimates of their arithmetic; the MFU convention leaves
 * them out. Bytes: the floats each op reads and writes once, a lower bound of its traffic. */
#include <stdio.h>

#include "loom/backend.h"
#include "loom/profile.h"
#include "train/train_obs.h"

static const loom_backend *IN;

/* (query, key) pairs per head and batch row the attention kernels compute */
static double attn_pairs(const loom_attn_dims *d, const loom_attn_mask *mask) {
    if (mask && mask->causal && d->Tq == d->Tk && mask->q_pos0 == mask->k_pos0)
        return (double)attention_causal_pairs(d->Tq);
    return (double)d->Tq * (double)d->Tk;
}

static void p_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int IC, int OC) {
    if (!loom_prof_recording) {
        IN->matmul_forward(out, inp, weight, bias, N, IC, OC);
        return;
    }
    loom_prof_begin("matmul_forward", "op");
    IN->matmul_forward(out, inp, weight, bias, N, IC, OC);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld IC=%d OC=%d", (long long)N, IC, OC);
    loom_prof_end(2.0 * (double)N * IC * OC,
                  4.0 * ((double)N * IC + (double)IC * OC + (double)N * OC + (bias ? OC : 0)), shp);
}

static void p_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight, int64_t N, int IC, int OC) {
    if (!loom_prof_recording) {
        IN->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
        return;
    }
    loom_prof_begin("matmul_backward", "op");
    IN->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld IC=%d OC=%d", (long long)N, IC, OC);
    loom_prof_end(((dinp ? 2.0 : 0.0) + (dweight ? 2.0 : 0.0)) * (double)N * IC * OC,
                  4.0 * ((double)N * OC + (double)N * IC + (double)IC * OC + (dinp ? 2.0 * (double)N * IC : 0) + (dweight ? 2.0 * (double)IC * OC : 0)), shp);
}

static void p_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, int64_t N, int C, float eps) {
    if (!loom_prof_recording) {
        IN->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
        return;
    }
    loom_prof_begin("layernorm_forward", "op");
    IN->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld C=%d", (long long)N, C);
    loom_prof_end(8.0 * (double)N * C,
                  4.0 * (2.0 * (double)N * C + 2.0 * C + 2.0 * (double)N), shp);
}

static void p_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight, const float *mean, const float *rstd, int64_t N, int C) {
    if (!loom_prof_recording) {
        IN->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
        return;
    }
    loom_prof_begin("layernorm_backward", "op");
    IN->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld C=%d", (long long)N, C);
    loom_prof_end(14.0 * (double)N * C,
                  4.0 * (4.0 * (double)N * C + 4.0 * C + 2.0 * (double)N), shp);
}

static void p_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t N, int C, float eps) {
    if (!loom_prof_recording) {
        IN->rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
        return;
    }
    loom_prof_begin("rmsnorm_forward", "op");
    IN->rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld C=%d", (long long)N, C);
    loom_prof_end(5.0 * (double)N * C,
                  4.0 * (2.0 * (double)N * C + C + (double)N), shp);
}

static void p_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, const float *rstd, int64_t N, int C) {
    if (!loom_prof_recording) {
        IN->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
        return;
    }
    loom_prof_begin("rmsnorm_backward", "op");
    IN->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld C=%d", (long long)N, C);
    loom_prof_end(10.0 * (double)N * C,
                  4.0 * (4.0 * (double)N * C + 2.0 * C + (double)N), shp);
}

static void p_gelu_forward(float *out, const float *inp, int64_t n) {
    if (!loom_prof_recording) {
        IN->gelu_forward(out, inp, n);
        return;
    }
    loom_prof_begin("gelu_forward", "op");
    IN->gelu_forward(out, inp, n);
    char shp[40];
    snprintf(shp, sizeof shp, "n=%lld", (long long)n);
    loom_prof_end(12.0 * (double)n,
                  8.0 * (double)n, shp);
}

static void p_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    if (!loom_prof_recording) {
        IN->gelu_backward(dinp, inp, dout, n);
        return;
    }
    loom_prof_begin("gelu_backward", "op");
    IN->gelu_backward(dinp, inp, dout, n);
    char shp[40];
    snprintf(shp, sizeof shp, "n=%lld", (long long)n);
    loom_prof_end(20.0 * (double)n,
                  16.0 * (double)n, shp);
}

static void p_swiglu_forward(float *out, const float *inp, int64_t N, int F) {
    if (!loom_prof_recording) {
        IN->swiglu_forward(out, inp, N, F);
        return;
    }
    loom_prof_begin("swiglu_forward", "op");
    IN->swiglu_forward(out, inp, N, F);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld F=%d", (long long)N, F);
    loom_prof_end(8.0 * (double)N * F,
                  12.0 * (double)N * F, shp);
}

static void p_swiglu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int F) {
    if (!loom_prof_recording) {
        IN->swiglu_backward(dinp, inp, dout, N, F);
        return;
    }
    loom_prof_begin("swiglu_backward", "op");
    IN->swiglu_backward(dinp, inp, dout, N, F);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld F=%d", (long long)N, F);
    loom_prof_end(14.0 * (double)N * F,
                  28.0 * (double)N * F, shp);
}

static void p_rope_tables(float *cos_t, float *sin_t, int max_T, int D, float theta) {
    if (!loom_prof_recording) {
        IN->rope_tables(cos_t, sin_t, max_T, D, theta);
        return;
    }
    loom_prof_begin("rope_tables", "op");
    IN->rope_tables(cos_t, sin_t, max_T, D, theta);
    char shp[40];
    snprintf(shp, sizeof shp, "T=%d D=%d", max_T, D);
    loom_prof_end(4.0 * (double)max_T * D,
                  4.0 * (double)max_T * D, shp);
}

static void p_rope_forward(float *x, int64_t B, int T, int nh, int D, int64_t row_stride, const float *cos_t, const float *sin_t, int pos0) {
    if (!loom_prof_recording) {
        IN->rope_forward(x, B, T, nh, D, row_stride, cos_t, sin_t, pos0);
        return;
    }
    loom_prof_begin("rope_forward", "op");
    IN->rope_forward(x, B, T, nh, D, row_stride, cos_t, sin_t, pos0);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%lld T=%d nh=%d D=%d", (long long)B, T, nh, D);
    loom_prof_end(3.0 * (double)B * T * nh * D,
                  8.0 * (double)B * T * nh * D + 4.0 * (double)T * D, shp);
}

static void p_rope_backward(float *dx, int64_t B, int T, int nh, int D, int64_t row_stride, const float *cos_t, const float *sin_t, int pos0) {
    if (!loom_prof_recording) {
        IN->rope_backward(dx, B, T, nh, D, row_stride, cos_t, sin_t, pos0);
        return;
    }
    loom_prof_begin("rope_backward", "op");
    IN->rope_backward(dx, B, T, nh, D, row_stride, cos_t, sin_t, pos0);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%lld T=%d nh=%d D=%d", (long long)B, T, nh, D);
    loom_prof_end(3.0 * (double)B * T * nh * D,
                  8.0 * (double)B * T * nh * D + 4.0 * (double)T * D, shp);
}

static void p_attention_forward(float *out, float *att, const float *qkv, int B, int T, int H, int KVH, int D) {
    if (!loom_prof_recording) {
        IN->attention_forward(out, att, qkv, B, T, H, KVH, D);
        return;
    }
    loom_prof_begin("attention_forward", "op");
    IN->attention_forward(out, att, qkv, B, T, H, KVH, D);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d T=%d H=%d KVH=%d D=%d", B, T, H, KVH, D);
    loom_prof_end(4.0 * (double)D * (double)attention_causal_pairs(T) * B * H,
                  4.0 * ((double)B * T * (H + 2 * KVH) * D + (double)B * T * H * D + (double)B * H * T * T), shp);
}

static void p_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att, int B, int T, int H, int KVH, int D) {
    if (!loom_prof_recording) {
        IN->attention_backward(dqkv, scratch, dout, qkv, att, B, T, H, KVH, D);
        return;
    }
    loom_prof_begin("attention_backward", "op");
    IN->attention_backward(dqkv, scratch, dout, qkv, att, B, T, H, KVH, D);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d T=%d H=%d KVH=%d D=%d", B, T, H, KVH, D);
    loom_prof_end(8.0 * (double)D * (double)attention_causal_pairs(T) * B * H,
                  4.0 * (3.0 * (double)B * T * (H + 2 * KVH) * D + (double)B * T * H * D + 3.0 * (double)B * H * T * T), shp);
}

static int p_flash_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, const loom_attn_dims *dims, const loom_attn_mask *mask) {
    if (!loom_prof_recording) return IN->flash_attention_forward(out, lse, q, k, v, dims, mask);
    loom_prof_begin("flash_attention_forward", "op");
    const int r = IN->flash_attention_forward(out, lse, q, k, v, dims, mask);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d Tq=%d Tk=%d H=%d KVH=%d D=%d", dims->B, dims->Tq, dims->Tk, dims->H, dims->KVH, dims->D);
    loom_prof_end(4.0 * dims->D * attn_pairs(dims, mask) * dims->B * dims->H,
                  4.0 * ((double)dims->B * dims->Tq * dims->H * dims->D * 2 + 2.0 * dims->B * dims->Tk * dims->KVH * dims->D + (double)dims->B * dims->H * dims->Tq), shp);
    return r;
}

static int p_flash_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *out, const float *lse, const loom_attn_dims *dims, const loom_attn_mask *mask) {
    if (!loom_prof_recording) return IN->flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, dims, mask);
    loom_prof_begin("flash_attention_backward", "op");
    const int r = IN->flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, dims, mask);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d Tq=%d Tk=%d H=%d KVH=%d D=%d", dims->B, dims->Tq, dims->Tk, dims->H, dims->KVH, dims->D);
    loom_prof_end(8.0 * dims->D * attn_pairs(dims, mask) * dims->B * dims->H,
                  4.0 * ((double)dims->B * dims->Tq * dims->H * dims->D * 5 + 6.0 * dims->B * dims->Tk * dims->KVH * dims->D + (double)dims->B * dims->H * dims->Tq), shp);
    return r;
}

static void p_attention_decode(float *out, const float *q, const float *kcache, const float *vcache, int n, int H, int KVH, int D, float *scratch) {
    if (!loom_prof_recording) {
        IN->attention_decode(out, q, kcache, vcache, n, H, KVH, D, scratch);
        return;
    }
    loom_prof_begin("attention_decode", "op");
    IN->attention_decode(out, q, kcache, vcache, n, H, KVH, D, scratch);
    char shp[40];
    snprintf(shp, sizeof shp, "n=%d H=%d KVH=%d D=%d", n, H, KVH, D);
    loom_prof_end(4.0 * (double)n * H * D,
                  4.0 * (2.0 * (double)n * KVH * D + 2.0 * H * D), shp);
}

static void p_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C, int pos0) {
    if (!loom_prof_recording) {
        IN->embedding_forward(out, tokens, wte, wpe, B, T, C, pos0);
        return;
    }
    loom_prof_begin("embedding_forward", "op");
    IN->embedding_forward(out, tokens, wte, wpe, B, T, C, pos0);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d T=%d C=%d", B, T, C);
    loom_prof_end((wpe ? 1.0 : 0.0) * B * T * C,
                  4.0 * (double)B * T * ((wpe ? 3.0 : 2.0) * C + 1), shp);
}

static void p_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C, int pos0) {
    if (!loom_prof_recording) {
        IN->embedding_backward(dwte, dwpe, dout, tokens, B, T, C, pos0);
        return;
    }
    loom_prof_begin("embedding_backward", "op");
    IN->embedding_backward(dwte, dwpe, dout, tokens, B, T, C, pos0);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d T=%d C=%d", B, T, C);
    loom_prof_end((dwpe ? 2.0 : 1.0) * B * T * C,
                  4.0 * (double)B * T * ((dwpe ? 5.0 : 3.0) * C + 1), shp);
}

static void p_mean_pool_forward(float *out, const float *inp, int B, int T, int C) {
    if (!loom_prof_recording) {
        IN->mean_pool_forward(out, inp, B, T, C);
        return;
    }
    loom_prof_begin("mean_pool_forward", "op");
    IN->mean_pool_forward(out, inp, B, T, C);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d T=%d C=%d", B, T, C);
    loom_prof_end((double)B * T * C,
                  4.0 * ((double)B * T * C + (double)B * C), shp);
}

static void p_mean_pool_backward(float *dinp, const float *dout, int B, int T, int C) {
    if (!loom_prof_recording) {
        IN->mean_pool_backward(dinp, dout, B, T, C);
        return;
    }
    loom_prof_begin("mean_pool_backward", "op");
    IN->mean_pool_backward(dinp, dout, B, T, C);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d T=%d C=%d", B, T, C);
    loom_prof_end((double)B * T * C,
                  4.0 * (2.0 * (double)B * T * C + (double)B * C), shp);
}

static void p_residual_forward(float *out, const float *a, const float *b, int64_t n) {
    if (!loom_prof_recording) {
        IN->residual_forward(out, a, b, n);
        return;
    }
    loom_prof_begin("residual_forward", "op");
    IN->residual_forward(out, a, b, n);
    char shp[40];
    snprintf(shp, sizeof shp, "n=%lld", (long long)n);
    loom_prof_end((double)n,
                  12.0 * (double)n, shp);
}

static void p_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int64_t N, int V) {
    if (!loom_prof_recording) {
        IN->crossentropy_forward(losses, logits, targets, N, V);
        return;
    }
    loom_prof_begin("crossentropy_forward", "op");
    IN->crossentropy_forward(losses, logits, targets, N, V);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld V=%d", (long long)N, V);
    loom_prof_end(3.0 * (double)N * V,
                  4.0 * ((double)N * V + 2.0 * (double)N), shp);
}

static void p_crossentropy_softmax_backward(float *logits, const int32_t *targets, int64_t N, int V, float dscale) {
    if (!loom_prof_recording) {
        IN->crossentropy_softmax_backward(logits, targets, N, V, dscale);
        return;
    }
    loom_prof_begin("crossentropy_softmax_backward", "op");
    IN->crossentropy_softmax_backward(logits, targets, N, V, dscale);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld V=%d", (long long)N, V);
    loom_prof_end(4.0 * (double)N * V,
                  8.0 * (double)N * V, shp);
}

static void p_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step) {
    if (!loom_prof_recording) {
        IN->adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
        return;
    }
    loom_prof_begin("adamw_update", "op");
    IN->adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    char shp[40];
    snprintf(shp, sizeof shp, "n=%lld", (long long)n);
    loom_prof_end(14.0 * (double)n,
                  28.0 * (double)n, shp);
}

static double p_sum_squares(const float *x, int64_t n) {
    if (!loom_prof_recording) return IN->sum_squares(x, n);
    loom_prof_begin("sum_squares", "op");
    const double r = IN->sum_squares(x, n);
    char shp[40];
    snprintf(shp, sizeof shp, "n=%lld", (long long)n);
    loom_prof_end(2.0 * (double)n,
                  4.0 * (double)n, shp);
    return r;
}

static void p_scale_inplace(float *x, int64_t n, float s) {
    if (!loom_prof_recording) {
        IN->scale_inplace(x, n, s);
        return;
    }
    loom_prof_begin("scale_inplace", "op");
    IN->scale_inplace(x, n, s);
    char shp[40];
    snprintf(shp, sizeof shp, "n=%lld", (long long)n);
    loom_prof_end((double)n,
                  8.0 * (double)n, shp);
}

static void p_embedding_shard_forward(float *out, const int32_t *tokens, const float *wte, int v0,
                                      int Vl, const float *wpe, int B, int T, int C, int pos0) {
    if (!loom_prof_recording) {
        IN->embedding_shard_forward(out, tokens, wte, v0, Vl, wpe, B, T, C, pos0);
        return;
    }
    loom_prof_begin("embedding_shard_forward", "op");
    IN->embedding_shard_forward(out, tokens, wte, v0, Vl, wpe, B, T, C, pos0);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d T=%d C=%d Vl=%d", B, T, C, Vl);
    loom_prof_end((wpe ? 1.0 : 0.0) * B * T * C, 4.0 * (double)B * T * ((wpe ? 3.0 : 2.0) * C + 1),
                  shp);
}

static void p_embedding_shard_backward(float *dwte, float *dwpe, const float *dout,
                                       const int32_t *tokens, int v0, int Vl, int B, int T, int C,
                                       int pos0) {
    if (!loom_prof_recording) {
        IN->embedding_shard_backward(dwte, dwpe, dout, tokens, v0, Vl, B, T, C, pos0);
        return;
    }
    loom_prof_begin("embedding_shard_backward", "op");
    IN->embedding_shard_backward(dwte, dwpe, dout, tokens, v0, Vl, B, T, C, pos0);
    char shp[40];
    snprintf(shp, sizeof shp, "B=%d T=%d C=%d Vl=%d", B, T, C, Vl);
    loom_prof_end((dwpe ? 2.0 : 1.0) * B * T * C,
                  4.0 * (double)B * T * ((dwpe ? 5.0 : 3.0) * C + 1), shp);
}

static void p_crossentropy_shard_max(float *mx, const float *logits, int64_t N, int Vl) {
    if (!loom_prof_recording) {
        IN->crossentropy_shard_max(mx, logits, N, Vl);
        return;
    }
    loom_prof_begin("crossentropy_shard_max", "op");
    IN->crossentropy_shard_max(mx, logits, N, Vl);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld Vl=%d", (long long)N, Vl);
    loom_prof_end((double)N * Vl, 4.0 * ((double)N * Vl + (double)N), shp);
}

static void p_crossentropy_shard_sums(float *sums, const float *logits, const float *mx,
                                      const int32_t *targets, int v0, int64_t N, int Vl) {
    if (!loom_prof_recording) {
        IN->crossentropy_shard_sums(sums, logits, mx, targets, v0, N, Vl);
        return;
    }
    loom_prof_begin("crossentropy_shard_sums", "op");
    IN->crossentropy_shard_sums(sums, logits, mx, targets, v0, N, Vl);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld Vl=%d", (long long)N, Vl);
    loom_prof_end(3.0 * (double)N * Vl, 4.0 * ((double)N * Vl + 4.0 * (double)N), shp);
}

static void p_crossentropy_shard_backward(float *logits, const int32_t *targets, const float *mx,
                                          const float *sums, int v0, int64_t N, int Vl,
                                          float dscale) {
    if (!loom_prof_recording) {
        IN->crossentropy_shard_backward(logits, targets, mx, sums, v0, N, Vl, dscale);
        return;
    }
    loom_prof_begin("crossentropy_shard_backward", "op");
    IN->crossentropy_shard_backward(logits, targets, mx, sums, v0, N, Vl, dscale);
    char shp[40];
    snprintf(shp, sizeof shp, "N=%lld Vl=%d", (long long)N, Vl);
    loom_prof_end(4.0 * (double)N * Vl, 8.0 * (double)N * Vl, shp);
}

static loom_backend profiled;

const loom_backend *loom_prof_backend(const loom_backend *inner) {
    if (inner == &profiled) return inner;
    IN = inner;
    /* every op of the inner table first: an op added to loom_backend and not wrapped here
     * still works (untraced) */
    profiled = *inner;
    profiled.matmul_forward = p_matmul_forward;
    profiled.matmul_backward = p_matmul_backward;
    profiled.layernorm_forward = p_layernorm_forward;
    profiled.layernorm_backward = p_layernorm_backward;
    profiled.rmsnorm_forward = p_rmsnorm_forward;
    profiled.rmsnorm_backward = p_rmsnorm_backward;
    profiled.gelu_forward = p_gelu_forward;
    profiled.gelu_backward = p_gelu_backward;
    profiled.swiglu_forward = p_swiglu_forward;
    profiled.swiglu_backward = p_swiglu_backward;
    profiled.rope_tables = p_rope_tables;
    profiled.rope_forward = p_rope_forward;
    profiled.rope_backward = p_rope_backward;
    profiled.attention_forward = p_attention_forward;
    profiled.attention_backward = p_attention_backward;
    profiled.flash_attention_forward = p_flash_attention_forward;
    profiled.flash_attention_backward = p_flash_attention_backward;
    profiled.attention_decode = p_attention_decode;
    profiled.embedding_forward = p_embedding_forward;
    profiled.embedding_backward = p_embedding_backward;
    profiled.mean_pool_forward = p_mean_pool_forward;
    profiled.mean_pool_backward = p_mean_pool_backward;
    profiled.residual_forward = p_residual_forward;
    profiled.crossentropy_forward = p_crossentropy_forward;
    profiled.crossentropy_softmax_backward = p_crossentropy_softmax_backward;
    profiled.adamw_update = p_adamw_update;
    profiled.sum_squares = p_sum_squares;
    profiled.scale_inplace = p_scale_inplace;
    profiled.embedding_shard_forward = p_embedding_shard_forward;
    profiled.embedding_shard_backward = p_embedding_shard_backward;
    profiled.crossentropy_shard_max = p_crossentropy_shard_max;
    profiled.crossentropy_shard_sums = p_crossentropy_shard_sums;
    profiled.crossentropy_shard_backward = p_crossentropy_shard_backward;
    return &profiled;
}
