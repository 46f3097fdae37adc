/* loom CPU kernels: forward/backward pairs. Pointer + shape signatures, no I/O, no global
 * state but the instruction-set level (below), no allocation (scratch is passed in), so a
 * CUDA twin can be written op by op.
 * Backward functions ACCUMULATE (+=) into their gradient outputs; a NULL gradient output is
 * skipped. Threading: OpenMP loops inside; reductions use fixed per-thread partitions
 * combined in a fixed order, so results are bitwise reproducible for a given thread count.
 * N = number of rows (B*T), C = channels, OC/IC = out/in features, V = vocab,
 * H = query heads, KVH = key/value heads, D = head dim, F = feed-forward width. */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stdint.h>

#include "loom/backend.h" /* loom_attn_dims, loom_attn_mask, the shape helpers */

/* out (N,OC) = inp (N,IC) @ weight(OC,IC)^T + bias(OC); bias may be NULL. */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                    int64_t N, int IC, int OC);
/* The same product without packing the weights (src/kernels/matmul_rows.c): each output one
 * dot product whatever N is. matmul_forward takes it for N <= LOOM_MATMUL_ROWS_MAX rows (a
 * decode step), where sgemm's copy of the weight matrix costs more than the product. */
#define LOOM_MATMUL_ROWS_MAX 16
void matmul_rows_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int64_t N, int IC, int OC);
/* The same with bfloat16 weights (the upper half of an fp32), widened exactly to fp32 as they
 * are read: matmul_rows_forward on the weights rounded to bf16, bit for bit. Any N. */
void matmul_rows_bf16_forward(float *out, const float *inp, const uint16_t *weight,
                              const float *bias, int64_t N, int IC, int OC);
/* bf16 compute (--compute bf16, src/kernels/matmul_dotbf16.c): out (N,OC) = inp (N,IC) @
 * weight (OC,IC)^T + bias (may be NULL), inp and weight bf16 in their packed layouts (below),
 * fp32 accumulation in the order of AVX-512 BF16's VDPBF16PS: each output one fp32 chain over
 * the pairs of IC in order, per pair the odd product, then the even one (IC odd: a zero last
 * element), then the bias. The same bits whatever N and at every level (but for values below
 * fp32's normal range, which VDPBF16PS flushes to zero). Any N. */
void matmul_dotbf16_forward(float *out, const uint16_t *inp, const uint16_t *weight,
                            const float *bias, int64_t N, int IC, int OC);
/* 1 when matmul_dotbf16_forward runs VDPBF16PS now (the avx512 level on a CPU with
 * avx512_bf16), 0 when it runs the portable code */
int matmul_dotbf16_vdp(void);
/* the weights' layout: blocks of 16 rows (the last padded with zero rows), in each block the
 * pairs of IC (IC odd: a zero last element) one after the other, each pair of the 16 rows
 * together. dotbf16_pack_elems: its size in bf16 elements; dotbf16_pack: an (OC,IC) matrix,
 * fp32 (w_bf16 = 0: rounded to nearest even, loom_bf16_round) or bf16 (w_bf16 = 1), into it;
 * dotbf16_unpack_row: row `row` of a packed matrix back, widened to fp32 (IC floats). */
int64_t dotbf16_pack_elems(int OC, int IC);
void dotbf16_pack(uint16_t *dst, const void *w, int w_bf16, int OC, int IC);
void dotbf16_unpack_row(float *dst, const uint16_t *packed, int OC, int IC, int row);
/* the activations' layout: groups of 16 rows (the last padded with zero rows), in each group
 * the pairs of IC one after the other, each pair of the 16 rows together. dotbf16_act_elems:
 * its size; bf16_round_rows: N rows of IC floats rounded to bf16 (loom_bf16_round: to
 * nearest, ties to even) into it. */
int64_t dotbf16_act_elems(int64_t N, int IC);
void bf16_round_rows(uint16_t *dst, const float *src, int64_t N, int IC);
/* 8-bit weights (--weights int8, src/kernels/matmul_q8.c): GGUF's Q8_0. A row of IC values
 * (IC a multiple of LOOM_Q8_BLOCK) in blocks of 32, each block a scale d = max|x| / 127 stored
 * as fp16 (loom/fp16.h) and 32 int8 q = roundf(x / d) (ggml's reference quantizer: x times
 * 1 / d, ties away from zero; 0 when d is 0). q8_quantize_rows: N rows of x into q (N,IC) and
 * d (N,IC/32); q8_dequantize_rows: back, x = q * d. */
void q8_quantize_rows(int8_t *q, uint16_t *d, const float *x, int64_t N, int IC);
void q8_dequantize_rows(float *x, const int8_t *q, const uint16_t *d, int64_t N, int IC);
/* out (N,OC) = x (N,IC) @ w (OC,IC)^T + bias (may be NULL), x and w in Q8_0 (values xq, wq and
 * scales xd, wd as q8_quantize_rows writes them): per output 16 fp32 chains over the blocks
 * in order, chain 8 * (b % 2) + l += (float)isum_bl * (dw_b * dx_b) (the exact int32 sum of
 * block b's products 4l..4l+3, the two scales widened), summed (l, l+8), (l, l+4), (l, l+2),
 * (l, l+1), then the bias. The same bits whatever N and at every level. IC <= 32768; the
 * weights' scales finite. */
void matmul_q8_forward(float *out, const int8_t *xq, const uint16_t *xd, const int8_t *wq,
                       const uint16_t *wd, const float *bias, int64_t N, int IC, int OC);
/* 4-bit weights (--weights int4, src/kernels/matmul_q4k.c): GGUF's Q4_K. A row of IC values
 * (IC a multiple of LOOM_Q4K_BLOCK = 256) in blocks of 144 bytes: fp16 d and dmin, eight
 * 6-bit scales and minimums packed in 12 bytes, 128 bytes of 4-bit values; a value is
 * (d * sc_j) * q - (dmin * m_j) in sub-block j of 32. q4k_quantize_rows: N rows into blocks
 * (loom's quantizer: a least-squares fit per sub-block); q4k_dequantize_rows: back (in that
 * order of operations, as the gguf package's numpy does). q8k_quantize_rows: the input side,
 * per block of 256 an fp32 scale d = max|x| / 127 (N, IC/256), int8 q = roundf(x / d) (N,IC)
 * and each sub-block's sum of q (N, IC/32). */
void q4k_quantize_rows(uint8_t *dst, const float *x, int64_t N, int IC);
void q4k_dequantize_rows(float *x, const uint8_t *src, int64_t N, int IC);
void q8k_quantize_rows(int8_t *q, float *d, int16_t *sums, const float *x, int64_t N, int IC);
/* out (N,OC) = x (N,IC) @ w (OC,IC)^T + bias (may be NULL), w in Q4_K blocks and x as
 * q8k_quantize_rows writes it: per output and input row 8 fp32 chains over the blocks in
 * order, c_l += (float)s_l * (dw * dx) with the exact int32 s_l = sum_j sc_j * (products
 * 4l..4l+3 of sub-block j), and 4 chains e_i += (float)(m_2i xsum_2i + m_2i+1 xsum_2i+1) *
 * (dmw * dx), dw and dmw the block's d and dmin widened; then ((c0+c4) + (c2+c6)) + ((c1+c5) +
 * (c3+c7)) minus ((e0+e2) + (e1+e3)), then the bias. The same bits whatever N and at every
 * level. */
void matmul_q4k_forward(float *out, const int8_t *xq, const float *xd, const int16_t *xsum,
                        const uint8_t *w, const float *bias, int64_t N, int IC, int OC);
/* 1 when matmul_q8_forward runs VPDPBUSD now (the avx512 level on a CPU with avx512_vnni) */
int matmul_q8_vnni(void);
/* 0: the avx512 level runs VPMADDUBSW even where the CPU has VNNI (the path of AVX-512 CPUs
 * without it, for tests/unit/test_q8.c); 1 (the default): VPDPBUSD where the CPU has it */
void matmul_q8_allow_vnni(int allow);
/* dinp (N,IC) += dout (N,OC) @ weight (OC,IC); dweight (OC,IC) += dout^T @ inp;
 * dbias (OC) += sum_n dout. Any of dinp/dweight/dbias may be NULL. */
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int64_t N, int IC, int OC);
/* The same with dinp OVERWRITTEN (dinp = dout @ weight): what zeroing dinp first and then
 * matmul_backward gives, without the pass over dinp. dweight and dbias still accumulate. */
void matmul_backward_set(float *dinp, float *dweight, float *dbias, const float *dout,
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

/* RMSNorm of each of nh heads of D floats in N rows row_stride floats apart, w (D) shared by
 * the heads, rstd (N, rstd_stride); out may be in. Backward SETS din, dw += (may be NULL). */
void headnorm_forward(float *out, float *rstd, const float *in, const float *w, int64_t N,
                      int nh, int D, int64_t row_stride, int64_t rstd_stride, float eps);
void headnorm_backward(float *din, float *dw, const float *dout, const float *in, const float *w,
                       const float *rstd, int64_t N, int nh, int D, int64_t row_stride,
                       int64_t rstd_stride);

/* Whole-projection RMSNorm of n floats per row (rows row_stride apart) in pieces, the row
 * statistics (st_stride apart) summable over a tensor-parallel group between them:
 * rownorm_sums = sum of x^2 (dout NULL) or of dout * w * x * rstd; rownorm_forward from the
 * whole row's (n_global floats) sum of squares, writing rstd (may be ss; out may be in);
 * rownorm_backward from the whole row's dots: din SET, dw (n) += (may be NULL). */
void rownorm_sums(float *st, int64_t st_stride, const float *in, const float *dout,
                  const float *w, const float *rstd, int64_t N, int n, int64_t row_stride);
void rownorm_forward(float *out, float *rstd, const float *in, const float *w, const float *ss,
                     int64_t N, int n, int64_t row_stride, int64_t st_stride, int n_global,
                     float eps);
void rownorm_backward(float *din, float *dw, const float *dout, const float *in, const float *w,
                      const float *rstd, const float *dots, int64_t N, int n, int64_t row_stride,
                      int64_t st_stride, int n_global);

/* GELU, tanh approximation (GPT-2's "gelu_new"). */
void gelu_forward(float *out, const float *inp, int64_t n);
void gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
/* dinp = (not +=) GELU'(inp) * dout: zeroing dinp and gelu_backward, without the zeroing */
void gelu_backward_set(float *dinp, const float *inp, const float *dout, int64_t n);

/* SwiGLU: inp (N, 2F) holds [gate | up] per row; out (N,F) = silu(gate) * up. */
void swiglu_forward(float *out, const float *inp, int64_t N, int F);
void swiglu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int F);
/* GeGLU: out (N,F) = gelu_tanh(gate) * up of inp (N, 2F) [gate | up]; backward dinp +=. */
void geglu_forward(float *out, const float *inp, int64_t N, int F);
void geglu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int F);
/* Soft-capping in place: x = cap * tanh(x / cap). */
void softcap_forward(float *x, int64_t n, float cap);

/* Rotary embeddings, "rotate half" convention (Hugging Face Llama): for each head, element
 * i < D/2 pairs with i + D/2, angle = pos * theta^(-2i/D).
 * cos/sin tables are (max_T, D/2), filled by rope_tables. */
void rope_tables(float *cos_t, float *sin_t, int max_T, int D, float theta);
/* the same tables from D/2 given inverse frequencies (RoPE scalings), times scale */
void rope_tables_freq(float *cos_t, float *sin_t, int max_T, int D, const float *inv_freq,
                      float scale);
/* Rotates x in place. x points at the first head of row 0; rows are `row_stride` floats
 * apart, B*T rows, row (b,t) has position pos0 + t; nh heads of D floats each. */
void rope_forward(float *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                  const float *cos_t, const float *sin_t, int pos0);
/* The inverse rotation (the gradient of a rotation is its transpose), in place on dx. */
void rope_backward(float *dx, int64_t B, int T, int nh, int D, int64_t row_stride,
                   const float *cos_t, const float *sin_t, int pos0);

/* Causal scaled-dot-product attention with grouped-query heads.
 * qkv (B,T,(H+2*KVH)*D): per row, H query heads, then KVH key heads, then KVH value heads.
 * Query head h uses kv head h / (H/KVH). Scale 1/sqrt(D), or mask->scale; mask (NULL: plain
 * causal) adds its window and softcap (include/loom/backend.h; documents and positions are not
 * read). out (B,T,H*D); att (B,H,T,T) saved softmax probabilities (invisible pairs zero). */
void attention_forward(float *out, float *att, const float *qkv,
                       int B, int T, int H, int KVH, int D, const loom_attn_mask *mask);
/* attention_causal_pairs (the FLOP count of these kernels): include/loom/backend.h */
/* dqkv (B,T,(H+2*KVH)*D) +=; scratch must hold B*H*T*T floats; the forward's mask. */
void attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                        const float *att, int B, int T, int H, int KVH, int D,
                        const loom_attn_mask *mask);

/* ---- Flash attention (flash_attention.c; docs/kernels.md "Flash attention") ---------------
 * Tiled online-softmax attention (FlashAttention-2 style) with grouped-query heads: extra
 * memory is per-thread tile scratch only (no T x T buffer). Scale 1/sqrt(D) or mask->scale,
 * soft-capping and sliding windows as loom_attn_mask says. Query head h reads kv head
 * h / (H/KVH).
 *
 * loom_attn_dims (strided q, k, v, out views) and loom_attn_mask (causal, positions,
 * document ids) are in include/loom/backend.h. */

/* Inner-loop implementation. AUTO follows loom_isa_active() (below: the detected level, or
 * LOOM_ISA, agreed over a job's ranks): avx512 -> AVX512, avx2 -> AVX2, x86-64 -> PORTABLE.
 * PORTABLE = the tile operations in plain C at the x86-64 baseline (in a NATIVE=1 build:
 * compiled for the build machine); AVX2 = hand-written AVX2 + FMA intrinsics (the same bits
 * as AVX512); AVX512 = hand-written AVX-512 intrinsics; AVX512_BLAS = AVX-512 with the tile
 * products through OpenBLAS sgemm and AVX2_C = the portable C compiled for AVX2 + FMA (both
 * kept for measuring the intrinsics against). */
enum {
    LOOM_ATTN_ISA_AUTO = 0,
    LOOM_ATTN_ISA_PORTABLE = 1,
    LOOM_ATTN_ISA_AVX512 = 2,
    LOOM_ATTN_ISA_AVX512_BLAS = 3,
    LOOM_ATTN_ISA_AVX2 = 4,
    LOOM_ATTN_ISA_AVX2_C = 5
};

/* flash_attention_dims_qkv (dims of the fused qkv rows): include/loom/backend.h */

/* out (overwritten) = softmax(mask(q k^T / sqrt(D))) v; lse (B,H,Tq) (overwritten; may be
 * NULL) = log of each row's softmax denominator, in the natural log of the scaled scores.
 * isa: LOOM_ATTN_ISA_*. Returns 0, or -1 if the dims are invalid (sizes < 1 other than
 * Tq/Tk = 0, H % KVH != 0), -2 if the ISA asked for is not available, -3 if the per-thread
 * scratch could not be allocated; nothing is written then. Deterministic: bitwise the same
 * for any thread count. */
int flash_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, const loom_attn_dims *dims,
                            const loom_attn_mask *mask, int isa);

/* Recomputes the tiles from q, k, v, out, dout and the forward's lse; ACCUMULATES (+=) into
 * dq, dk, dv (dk/dv summed over the query heads of each GQA group); a NULL one is skipped.
 * out and lse must be the forward's (or, for ring
 * attention, the merged ones). Bitwise the same for any thread count. Returns as forward. */
int flash_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                             const float *q, const float *k, const float *v, const float *out,
                             const float *lse, const loom_attn_dims *dims,
                             const loom_attn_mask *mask, int isa);
/* The same with dq, dk, dv OVERWRITTEN (=): the bits of zeroing them and then
 * flash_attention_backward, without the caller's single-threaded zeroing pass (each task
 * zeroes the rows it owns). Only the rows of the views are written (gaps between them are
 * left alone). */
int flash_attention_backward_set(float *dq, float *dk, float *dv, const float *dout,
                                 const float *q, const float *k, const float *v,
                                 const float *out, const float *lse, const loom_attn_dims *dims,
                                 const loom_attn_mask *mask, int isa);

/* 1 if the AVX-512 path can run on this CPU. */
int flash_attention_have_avx512(void);

/* One query row against cached keys/values (incremental decoding): q (H*D) for the newest
 * position; kcache, vcache (n, KVH*D) rows 0..n-1 (the newest included), all visible (in any
 * order: a sliding window's ring); out (H*D). scratch holds H*n floats. Same scale, softcap
 * (mask, may be NULL; nothing else of it is read) and head grouping as attention_forward. */
void attention_decode(float *out, const float *q, const float *kcache, const float *vcache,
                      int n, int H, int KVH, int D, float *scratch, const loom_attn_mask *mask);

/* out (B,T,C) = wte[tokens] (+ wpe[pos0 + t] when wpe is not NULL). */
void embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                       int B, int T, int C, int pos0);
void embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                        int B, int T, int C, int pos0);

/* Vocab-parallel embedding: wte holds rows [v0, v0 + Vl) of the table; a token in that range
 * gives its row (+ wpe[pos0 + t] when wpe is not NULL), any other token gives zeros (+ wpe).
 * Backward: dwte (Vl,C) += the rows of the tokens in range; dwpe (when not NULL) += dout. */
void embedding_shard_forward(float *out, const int32_t *tokens, const float *wte, int v0, int Vl,
                             const float *wpe, int B, int T, int C, int pos0);
void embedding_shard_backward(float *dwte, float *dwpe, const float *dout,
                              const int32_t *tokens, int v0, int Vl, int B, int T, int C,
                              int pos0);

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
 * rows with target < 0 become 0. The cross-entropy backwards all take rw: NULL, or per-row
 * weights (N) that replace dscale row by row (GRPO's and DPO's per-token weights, copied to
 * the device once per backward): row n's result is bit for bit the call with dscale = rw[n]. */
void crossentropy_softmax_backward(float *logits, const int32_t *targets, int64_t N, int V,
                                   float dscale, const float *rw);
/* The same for soft-capped logits (y = cap * tanh(z / cap), the logits given): dlogits with
 * respect to z, (softmax(y) - onehot) * dscale * (1 - (y / cap)^2). */
void crossentropy_softcap_backward(float *logits, const int32_t *targets, int64_t N, int V,
                                   float dscale, float cap, const float *rw);

/* Vocab-parallel cross-entropy: logits (N,Vl) are columns [v0, v0 + Vl) of the whole
 * vocabulary's. shard_max: mx (N) = each row's max over these columns. shard_sums, with mx the
 * max over the whole vocabulary: sums (N,2) = (sum over these columns of exp(logit - mx), the
 * target's logit when the target is in [v0, v0 + Vl), else 0); rows with target < 0 get 0, 0.
 * shard_backward, with sums now the whole vocabulary's: logits become (softmax - onehot) *
 * dscale in place over these columns (rows with target < 0 become 0). */
void crossentropy_shard_max(float *mx, const float *logits, int64_t N, int Vl);
void crossentropy_shard_sums(float *sums, const float *logits, const float *mx,
                             const int32_t *targets, int v0, int64_t N, int Vl);
void crossentropy_shard_backward(float *logits, const int32_t *targets, const float *mx,
                                 const float *sums, int v0, int64_t N, int Vl, float dscale,
                                 const float *rw);
/* shard_backward of soft-capped logits (as crossentropy_softcap_backward) */
void crossentropy_shard_softcap_backward(float *logits, const int32_t *targets, const float *mx,
                                         const float *sums, int v0, int64_t N, int Vl,
                                         float dscale, float cap, const float *rw);

/* AdamW step on n contiguous parameters, decoupled weight decay (p -= lr*wd*p), bias
 * correction with t = step (>= 1), on the gradients g * grad_scale (each product rounded to
 * float: bitwise scale_inplace(g, grad_scale) and then the step; 1 for none). */
void adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale);
/* sum of squares in double, deterministic for a given thread count */
double sum_squares(const float *x, int64_t n);
/* x *= s */
void scale_inplace(float *x, int64_t n, float s);

/* ---- bf16 mixed-precision training (training.precision bf16; src/kernels/matmul_bf16.c,
 * bf16_ops.c, adamw.c; docs/kernels.md "bf16 training") ---------------------------------
 * bf16 tensors are uint16_t (include/loom/bf16.h). Saved activations are bf16, activation
 * gradients, statistics (mean, rstd, lse), losses and parameters' masters fp32; every op
 * widens its bf16 inputs exactly, computes in fp32 and rounds its bf16 outputs once (to
 * nearest even). Backward ops take the fp32 gradient of the output and the bf16 saved inputs.
 *
 * GEMMs: bf16 x bf16 with fp32 accumulation. forward: out (N,OC) = inp (N,IC) @ weight
 * (OC,IC)^T + bias (fp32, may be NULL), out bf16 (rounded once) or fp32 (_f32: the logits).
 * backward: dout (N,OC) fp32 is rounded into dout_bf16 (N*OC scratch; the GEMMs' operand, as
 * autocast's bf16 gradient), then dinp (N,IC) fp32 = (dinp_set) or += dout @ weight (NULL:
 * skipped), dweight (OC,IC) fp32 += dout^T @ inp, dbias += column sums of the fp32 dout.
 * dout NULL: dout_bf16 already holds the bf16 gradient (the head's, from
 * bf16_crossentropy_backward); dbias must then be NULL.
 * bf16_matmul_native: 1 when they run oneDNN's bf16 matmul (the avx512 level on a CPU with
 * AVX512-BF16), 0 when the portable path (operands widened to fp32 panels, dnnl_sgemm: slower
 * than fp32; said once in the log). */
int bf16_matmul_native(void);
void bf16_matmul_forward(uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                         const float *bias, int64_t N, int IC, int OC);
void bf16_matmul_forward_f32(float *out, const uint16_t *inp, const uint16_t *weight,
                             const float *bias, int64_t N, int IC, int OC);
void bf16_matmul_backward(float *dinp, int dinp_set, float *dweight, float *dbias,
                          const float *dout, uint16_t *dout_bf16, const uint16_t *inp,
                          const uint16_t *weight, int64_t N, int IC, int OC);
/* explicit conversions: dst = round(src) / dst = widen(src), n elements */
void bf16_from_f32(uint16_t *dst, const float *src, int64_t n);
void bf16_to_f32(float *dst, const uint16_t *src, int64_t n);
/* norms: out bf16, mean/rstd fp32 (statistics in double, as the fp32 kernels); bias may be
 * NULL; backward dinp +=, dweight/dbias += */
void bf16_layernorm_forward(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                            const float *weight, const float *bias, int64_t N, int C, float eps);
void bf16_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const uint16_t *inp, const float *weight, const float *mean,
                             const float *rstd, int64_t N, int C);
void bf16_rmsnorm_forward(uint16_t *out, float *rstd, const uint16_t *inp, const float *weight,
                          int64_t N, int C, float eps);
void bf16_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const uint16_t *inp,
                           const float *weight, const float *rstd, int64_t N, int C);
/* GELU (tanh) over n; backward dinp = (set) or +=. GLU: inp (N,2F) [gate | up] -> out (N,F)
 * = act(gate) * up, act = silu (gelu 0: SwiGLU) or tanh GELU (gelu 1: GeGLU); backward += */
void bf16_gelu_forward(uint16_t *out, const uint16_t *inp, int64_t n);
void bf16_gelu_backward(float *dinp, int set, const uint16_t *inp, const float *dout, int64_t n);
void bf16_glu_forward(uint16_t *out, const uint16_t *inp, int64_t N, int F, int gelu);
void bf16_glu_backward(float *dinp, const uint16_t *inp, const float *dout, int64_t N, int F,
                       int gelu);
/* out = round(a + b) (out may alias a) */
void bf16_residual_forward(uint16_t *out, const uint16_t *a, const uint16_t *b, int64_t n);
/* RoPE forward in place on bf16 rows (as rope_forward); the backward is rope_backward on the
 * fp32 gradient */
void bf16_rope_forward(uint16_t *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                       const float *cos_t, const float *sin_t, int pos0);
/* out (B,T,C) bf16 = round(wte[token] + wpe[pos0 + t]) from the fp32 tables (wpe may be NULL);
 * the backward is embedding_backward on the fp32 gradient */
void bf16_embedding_forward(uint16_t *out, const int32_t *tokens, const float *wte,
                            const float *wpe, int B, int T, int C, int pos0);
/* flash attention over bf16 fused q|k|v rows (B,T,(H+2*KVH)*D): batch row by batch row
 * widened exactly into ws (bf16_flash_ws_floats: one row's T x (QKV + H*D)), the fp32 kernel (fp32 scores, softmax, lse (B,H,T)), out (B,T,H*D)
 * rounded; backward sets dqkv (fp32) from the fp32 dout. Returns the fp32 kernel's code. */
int64_t bf16_flash_ws_floats(int B, int T, int H, int KVH, int D);
int bf16_flash_attention_forward(uint16_t *out, float *lse, const uint16_t *qkv, float *ws,
                                 int B, int T, int H, int KVH, int D,
                                 const loom_attn_mask *mask);
int bf16_flash_attention_backward(float *dqkv, const float *dout, const uint16_t *qkv,
                                  const uint16_t *out, const float *lse, float *ws, int B, int T,
                                  int H, int KVH, int D, const loom_attn_mask *mask);
/* cross-entropy over bf16 logits (N,V): fp32 losses (the fp32 kernel's math on the widened
 * logits); the backward in place: logits become round((softmax - onehot) * dscale) (rows with
 * target < 0 become 0) */
void bf16_crossentropy_forward(float *losses, const uint16_t *logits, const int32_t *targets,
                               int64_t N, int V);
void bf16_crossentropy_backward(uint16_t *logits, const int32_t *targets, int64_t N, int V,
                                float dscale, const float *rw);
/* adamw_update (the same bits of p, m, v) that also writes pb[i] = round(p[i]), the bf16 copy
 * of the updated master */
void adamw_update_bf16(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       int64_t step, float grad_scale);

/* The instruction-set level (loom_isa_*) is declared in loom/backend.h: process setup, not an
 * op. */

#endif
