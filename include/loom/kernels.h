/* loom CPU kernels: forward/backward pairs. Pointer + shape signatures, no I/O, no global
 * state, no allocation (scratch is passed in), so a CUDA twin can be written op by op.
 * Backward functions ACCUMULATE (+=) into their gradient outputs; a NULL gradient output is
 * skipped. Threading: OpenMP loops inside; reductions use fixed per-thread partitions
 * combined in a fixed order, so results are bitwise reproducible for a given thread count.
 * N = number of rows (B*T), C = channels, OC/IC = out/in features, V = vocab,
 * H = query heads, KVH = key/value heads, D = head dim, F = feed-forward width. */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stdint.h>

/* out (N,OC) = inp (N,IC) @ weight(OC,IC)^T + bias(OC); bias may be NULL. */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                    int64_t N, int IC, int OC);
/* dinp (N,IC) += dout (N,OC) @ weight (OC,IC); dweight (OC,IC) += dout^T @ inp;
 * dbias (OC) += sum_n dout. Any of dinp/dweight/dbias may be NULL. */
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int64_t N, int IC, int OC);

/* LayerNorm over the last dim. mean/rstd (N) are saved for backward. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int64_t N, int C, float eps);
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int64_t N, int C);

/* RMSNorm: out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps). rstd (N) saved. */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                     int64_t N, int C, float eps);
void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                      const float *weight, const float *rstd, int64_t N, int C);

/* GELU, tanh approximation (GPT-2's "gelu_new"). */
void gelu_forward(float *out, const float *inp, int64_t n);
void gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);

/* SwiGLU: inp (N, 2F) holds [gate | up] per row; out (N,F) = silu(gate) * up. */
void swiglu_forward(float *out, const float *inp, int64_t N, int F);
void swiglu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int F);

/* Rotary embeddings, "rotate half" convention (Hugging Face Llama): for each head, element
 * i < D/2 pairs with i + D/2, angle = pos * theta^(-2i/D).
 * cos/sin tables are (max_T, D/2), filled by rope_tables. */
void rope_tables(float *cos_t, float *sin_t, int max_T, int D, float theta);
/* Rotates x in place. x points at the first head of row 0; rows are `row_stride` floats
 * apart, B*T rows, row (b,t) has position pos0 + t; nh heads of D floats each. */
void rope_forward(float *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                  const float *cos_t, const float *sin_t, int pos0);
/* The inverse rotation (the gradient of a rotation is its transpose), in place on dx. */
void rope_backward(float *dx, int64_t B, int T, int nh, int D, int64_t row_stride,
                   const float *cos_t, const float *sin_t, int pos0);

/* Causal scaled-dot-product attention with grouped-query heads.
 * qkv (B,T,(H+2*KVH)*D): per row, H query heads, then KVH key heads, then KVH value heads.
 * Query head h uses kv head h / (H/KVH). Scale 1/sqrt(D).
 * out (B,T,H*D); att (B,H,T,T) saved softmax probabilities (upper triangle zero). */
void attention_forward(float *out, float *att, const float *qkv,
                       int B, int T, int H, int KVH, int D);
/* (query, key) pairs per head and sequence whose products the causal attention kernels
 * compute: blocks of 64 query rows, each against the keys up to the block's end, so
 * T(T+64)/2 when 64 divides T (about half of T^2). Each of the two forward GEMMs (Q K^T, P V)
 * and the four backward GEMMs (dO V^T, dS K, dS^T Q, P^T dO) costs 2 * D FLOPs per pair. */
int64_t attention_causal_pairs(int T);
/* dqkv (B,T,(H+2*KVH)*D) +=; scratch must hold B*H*T*T floats. */
void attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                        const float *att, int B, int T, int H, int KVH, int D);

/* One query row against cached keys/values (incremental decoding): q (H*D) for the newest
 * position; kcache, vcache (n, KVH*D) rows 0..n-1 (the newest included); out (H*D).
 * scratch holds H*n floats. Same scale and head grouping as attention_forward. */
void attention_decode(float *out, const float *q, const float *kcache, const float *vcache,
                      int n, int H, int KVH, int D, float *scratch);

/* out (B,T,C) = wte[tokens] (+ wpe[pos0 + t] when wpe is not NULL). */
void embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                       int B, int T, int C, int pos0);
void embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                        int B, int T, int C, int pos0);

/* out (B,C) = mean over t of inp (B,T,C) */
void mean_pool_forward(float *out, const float *inp, int B, int T, int C);
/* dinp (B,T,C) += dout (B,C) / T */
void mean_pool_backward(float *dinp, const float *dout, int B, int T, int C);

/* out = a + b, n floats (out may alias a). */
void residual_forward(float *out, const float *a, const float *b, int64_t n);

/* Softmax cross-entropy over V logits per row. losses (N) = -log softmax(logits)[target];
 * rows with target < 0 get loss 0. Returns nothing; logits are not modified. */
void crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                          int64_t N, int V);
/* In place: logits (N,V) become dlogits = (softmax(logits) - onehot(target)) * dscale;
 * rows with target < 0 become 0. */
void crossentropy_softmax_backward(float *logits, const int32_t *targets, int64_t N, int V,
                                   float dscale);

/* AdamW step on n contiguous parameters, decoupled weight decay (p -= lr*wd*p), bias
 * correction with t = step (>= 1). */
void adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step);
/* sum of squares in double, deterministic for a given thread count */
double sum_squares(const float *x, int64_t n);
/* x *= s */
void scale_inplace(float *x, int64_t n, float s);

#endif
