/* loom backends: the kernels the model, decoding and the optimizer call, as a table of ops.
 *
 * Every op has a pointer + shape signature (no model structs, no I/O, no allocation), so a
 * second backend (a CUDA twin) can implement the table op by op: the model holds a
 * `const loom_backend *` chosen at create (config key model.backend) and calls nothing else.
 * `cpu` (loom_backend_cpu) is the only backend today; its ops are the kernels of
 * include/loom/kernels.h, which dispatch per instruction-set level (docs/build.md).
 *
 * The semantics of each op are those of the kernel of the same name (include/loom/kernels.h,
 * docs/kernels.md): backward ops ACCUMULATE (+=) into their gradient outputs and skip a NULL
 * one; N = rows (B*T), C = channels, OC/IC = out/in features, V = vocab, H = query heads,
 * KVH = key/value heads, D = head dim, F = feed-forward width. docs/engine.md "Backends". */
#ifndef LOOM_BACKEND_H
#define LOOM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* ---- attention shapes (shared by every backend) ----------------------------------------- */

/* Strided views for the attention ops: element d of head h at position t of batch row b of q
 * lives at q[b*q_bs + t*q_ts + h*D + d] (likewise k, v with KVH heads, and out/dout with H
 * heads), so both the fused qkv rows (B,T,(H+2*KVH)*D) and separate Q (B,T,H*D), K, V
 * (B,T,KVH*D) buffers work, and a chunk of rows is a pointer offset. Gradients use the
 * strides of what they are the gradient of (dq: q's, dk: k's, dv: v's). lse is (B,H,Tq)
 * contiguous. */
typedef struct loom_attn_dims {
    int B, Tq, Tk;   /* batch rows, query positions, key positions */
    int H, KVH, D;   /* query heads, key/value heads (H % KVH == 0), head dim */
    int64_t q_bs, q_ts, k_bs, k_ts, v_bs, v_ts, o_bs, o_ts; /* batch / position strides */
} loom_attn_dims;

/* Which keys each query sees, and how its scores are formed. Query row i has position
 * q_pos0 + i, key row j position k_pos0 + j; key j is visible to query i iff
 * (!causal || kpos <= qpos), with a window (> 0, causal only) also qpos - kpos < window
 * (transformers' sliding window: the query's own position and the window - 1 before it), and,
 * with document ids, q_doc[b*q_doc_bs + i] == k_doc[b*k_doc_bs + j]. A row that sees no key
 * gets out = 0 and lse = -inf (and contributes no gradient). The score of a pair is
 * s = scale * q.k (scale 0: 1/sqrt(D)), then with softcap > 0 softcap * tanh(s / softcap)
 * (Gemma 2's attention logit soft-capping), before the mask and the softmax; lse is in these
 * scores. Zero-initialized = non-causal, no window, no documents, 1/sqrt(D), no cap. */
typedef struct loom_attn_mask {
    int causal;
    int64_t q_pos0, k_pos0;
    const int32_t *q_doc, *k_doc; /* both NULL (no document mask) or both set */
    int64_t q_doc_bs, k_doc_bs;   /* ints between batch rows of q_doc / k_doc */
    int64_t window;               /* sliding window (keys qpos - window < kpos); 0 = none */
    float scale;                  /* the scores' scale; 0 = 1/sqrt(D) */
    float softcap;                /* scores soft-capped to (-softcap, softcap); 0 = none */
} loom_attn_mask;

/* The flash ops' argument rules, for every backend: 0 when dims and mask are valid (dims
 * non-negative, H a multiple of KVH, both document arrays or neither, a window only when
 * causal, scale and softcap finite and >= 0), -1 otherwise. (No data touched: not an op.) */
int loom_attn_check(const loom_attn_dims *d, const loom_attn_mask *mk);

/* dims for the fused qkv rows (B,T,(H+2*KVH)*D) and out (B,T,H*D): pass q = qkv,
 * k = qkv + H*D, v = qkv + (H+KVH)*D. (A shape helper, no data touched: not an op.) */
loom_attn_dims flash_attention_dims_qkv(int B, int T, int H, int KVH, int D);

/* (query, key) pairs per head and sequence whose products the causal attention kernels
 * compute: blocks of 64 query rows, each against the keys up to the block's end, so
 * T(T+64)/2 when 64 divides T (about half of T^2). Each of the two forward GEMMs (Q K^T, P V)
 * and the four backward GEMMs (dO V^T, dS K, dS^T Q, P^T dO) costs 2 * D FLOPs per pair.
 * (A count for FLOP accounting, not an op.) */
int64_t attention_causal_pairs(int T);
/* The same with a sliding window W (0: none, = attention_causal_pairs): the flash kernels'
 * 64 x 64 tiles skip the key tiles wholly W or more positions before a query block, so each
 * block of queries pairs with the keys from the first tile it can see up to its end. */
int64_t attention_window_pairs(int T, int W);

/* ---- the op table ---------------------------------------------------------------------- */
/* GGUF's Q8_0 block: 32 values along a row, one fp16 scale (the q8 ops below) */
#define LOOM_Q8_BLOCK 32
/* GGUF's Q4_K block: 256 values along a row in 144 bytes (the q4k ops below) */
#define LOOM_Q4K_BLOCK 256
#define LOOM_Q4K_BYTES 144

/* mem_alloc's flags */
enum {
    /* a matrix read whole every step (inference weight copies): the cpu backend aligns it to
     * 2 MiB and asks for huge pages (madvise), and does not zero it (the caller writes every
     * byte) */
    LOOM_MEM_STREAMED = 1,
};

typedef struct loom_backend {
    const char *name; /* the model.backend value: "cpu", "cpu-guard" */
    /* 1: device buffers are host memory the host may read and write in place (cpu), so
     * host-side staging (checkpoints) is skipped; 0: everything goes through the copies */
    int host_memory;

    /* ---- memory (docs/engine.md "Memory through the backend") ---------------------------
     * Every arena the model, the optimizer, parallelism and inference compute on (parameters,
     * gradients, moments, activations, KV caches, RoPE tables, communication buffers, weight
     * copies) is a device buffer from mem_alloc; host data reaches it only through mem_h2d and
     * host code reads it only through mem_d2h at the named places (loom_dev_read). The ops
     * below take device pointers only (cpu-guard checks it).
     * mem_alloc: `bytes` (0 allowed), zeroed unless LOOM_MEM_STREAMED, 64-byte aligned (cpu);
     * aborts when out of memory. mem_free: NULL is a no-op. Copies of n bytes: h2d (host src,
     * device dst), d2h (device src, host dst), d2d (both device; they do not overlap);
     * mem_set: n bytes of dst = byte. mem_release: the whole pages inside [p, p + n) of a
     * buffer no op reads again are handed back (their contents are lost; a no-op where the
     * backend cannot). mem_sync: every op issued so far has completed (cpu: nothing).
     * comm_begin / comm_end bracket a collective library's direct use of device buffers (MPI
     * here; NCCL or a CUDA-aware MPI for a GPU backend): the buffers are reachable between
     * them; they nest. */
    void *(*mem_alloc)(size_t bytes, int flags);
    void (*mem_free)(void *p);
    void (*mem_h2d)(void *dst, const void *src, size_t n);
    void (*mem_d2h)(void *dst, const void *src, size_t n);
    void (*mem_d2d)(void *dst, const void *src, size_t n);
    void (*mem_set)(void *dst, int byte, size_t n);
    /* rows copies of `width` bytes, device to device: row r from src + r*spitch to
     * dst + r*dpitch (cudaMemcpy2D's shape) */
    void (*mem_d2d_rows)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t rows);
    void (*mem_release)(void *p, size_t n);
    void (*mem_sync)(void);
    void (*comm_begin)(void);
    void (*comm_end)(void);
    /* reductions whose results stay on the device (read back by loom_dev_read):
     * out[0] = the sum of x[0..n) in double, in index order (the loss sum) */
    void (*sum_double)(double *out, const float *x, int64_t n);
    /* dst[i] += src[i], n floats (the DP bucket fold) */
    void (*add_inplace)(float *dst, const float *src, int64_t n);
    /* vocab-parallel cross-entropy's per-row losses from the global row max mx (N) and sums
     * (N,2) = (sum of exp, target logit): losses[i] = log(sums[2i]) + mx[i] - sums[2i+1] in
     * double, 0 where targets[i] < 0 */
    void (*crossentropy_shard_losses)(float *losses, const float *mx, const float *sums,
                                      const int32_t *targets, int64_t N);
    /* x[0..n) = v (the ring's lse starts at -inf) */
    void (*fill_float)(float *x, int64_t n, float v);
    /* rows rows of width floats: dst[r*dst_stride + j] += src[r*src_stride + j] (Ulysses'
     * gradient re-layout, the ring's K/V gradients home) */
    void (*add_rows)(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     int64_t width, int64_t rows);
    /* ring attention's log-sum-exp merge of one block into the running output: for batch b,
     * head h, row i < n: lse (B,H,n) and blse likewise, out row (b,i) at out + b*out_bs +
     * i*H*D (head h at +h*D), blk (B,n,H*D); rows whose blse is -inf are left; rows whose lse
     * is -inf take the block's; else out = w1 out + w2 blk, lse = logaddexp (fp32) */
    void (*attn_lse_merge)(float *out, float *lse, const float *blk, const float *blse, int B,
                           int H, int64_t n, int D, int64_t out_bs);
    /* ---- end of memory ------------------------------------------------------------------ */

    /* linear: out (N,OC) = inp (N,IC) @ weight(OC,IC)^T + bias(OC) (bias may be NULL);
     * dinp (N,IC) += dout @ weight; dweight += dout^T @ inp; dbias += sum_n dout */
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int64_t N, int IC, int OC);
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int64_t N, int IC, int OC);
    /* the same with dinp overwritten (=), not accumulated: a fresh gradient buffer needs no
     * zeroing pass first (dweight, dbias still +=) */
    void (*matmul_backward_set)(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, int64_t N, int IC,
                                int OC);
    /* the forward with bf16 weights (--weights bf16, include/loom/bf16.h), widened exactly to
     * fp32 and computed as in fp32; any N (inference only; NULL where not supported) */
    void (*matmul_bf16_forward)(float *out, const float *inp, const uint16_t *weight,
                                const float *bias, int64_t N, int IC, int OC);
    /* 8-bit weights (--weights int8; kernels.h matmul_q8_forward, Q8_0): N rows quantized
     * into values (N,IC) and fp16 scales (N,IC/32), and the product of such rows with a
     * matrix held the same way; NULL where not supported */
    void (*q8_quantize)(int8_t *q, uint16_t *d, const float *x, int64_t N, int IC);
    void (*q8_dequantize)(float *x, const int8_t *q, const uint16_t *d, int64_t N, int IC);
    void (*matmul_q8_forward)(float *out, const int8_t *xq, const uint16_t *xd,
                              const int8_t *wq, const uint16_t *wd, const float *bias,
                              int64_t N, int IC, int OC);
    /* 4-bit weights (--weights int4; kernels.h matmul_q4k_forward, Q4_K): N rows of weights
     * quantized into Q4_K blocks (N, IC/256, 144 bytes) and back; input rows quantized into
     * int8 values (N,IC), fp32 scales (N,IC/256) and sub-block sums (N,IC/32); their product;
     * NULL where not supported */
    void (*q4k_quantize)(uint8_t *blocks, const float *x, int64_t N, int IC);
    void (*q4k_dequantize)(float *x, const uint8_t *blocks, int64_t N, int IC);
    void (*q8k_quantize)(int8_t *q, float *d, int16_t *sums, const float *x, int64_t N, int IC);
    void (*matmul_q4k_forward)(float *out, const int8_t *xq, const float *xd,
                               const int16_t *xsum, const uint8_t *w, const float *bias,
                               int64_t N, int IC, int OC);
    /* bf16 compute (--compute bf16; kernels.h matmul_dotbf16_forward): bf16 activations x
     * bf16 weights, fp32 accumulation in VDPBF16PS's order, both operands in the backend's
     * packed layouts: the weights packed once (from fp32, rounded, or from bf16; their size in
     * elements; a row back in fp32), the activations rounded into theirs (N rows of IC; their
     * size); any N (inference only; NULL where not supported) */
    int64_t (*dotbf16_pack_elems)(int OC, int IC);
    void (*dotbf16_pack)(uint16_t *dst, const void *w, int w_bf16, int OC, int IC);
    void (*dotbf16_unpack_row)(float *dst, const uint16_t *packed, int OC, int IC, int row);
    int64_t (*dotbf16_act_elems)(int64_t N, int IC);
    void (*bf16_round)(uint16_t *dst, const float *src, int64_t N, int IC);
    void (*matmul_dotbf16_forward)(float *out, const uint16_t *inp, const uint16_t *weight,
                                   const float *bias, int64_t N, int IC, int OC);

    /* norms over the last dim; mean/rstd (N) saved for backward */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int64_t N, int C,
                              float eps);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int64_t N, int C);
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight,
                            int64_t N, int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int64_t N, int C);

    /* activations: GELU (tanh) over n floats; SwiGLU inp (N,2F) = [gate | up] -> out (N,F) */
    void (*gelu_forward)(float *out, const float *inp, int64_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, int64_t n);
    void (*gelu_backward_set)(float *dinp, const float *inp, const float *dout, int64_t n); /* = */
    void (*swiglu_forward)(float *out, const float *inp, int64_t N, int F);
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, int64_t N, int F);
    /* GeGLU inp (N,2F) = [gate | up] -> out (N,F) = gelu_tanh(gate) * up; backward dinp += */
    void (*geglu_forward)(float *out, const float *inp, int64_t N, int F);
    void (*geglu_backward)(float *dinp, const float *inp, const float *dout, int64_t N, int F);
    /* final-logit soft-capping in place: x = cap * tanh(x / cap) */
    void (*softcap_forward)(float *x, int64_t n, float cap);

    /* RoPE (rotate half): tables (max_T, D/2); forward rotates x in place (B*T rows
     * row_stride floats apart, nh heads of D, row (b,t) at position pos0 + t); backward
     * applies the inverse rotation to dx in place */
    void (*rope_tables)(float *cos_t, float *sin_t, int max_T, int D, float theta);
    void (*rope_forward)(float *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                         const float *cos_t, const float *sin_t, int pos0);
    void (*rope_backward)(float *dx, int64_t B, int T, int nh, int D, int64_t row_stride,
                          const float *cos_t, const float *sin_t, int pos0);
    /* RoPE scalings: the tables from D/2 inverse frequencies, times scale */
    void (*rope_tables_freq)(float *cos_t, float *sin_t, int max_T, int D,
                             const float *inv_freq, float scale);
    /* q/k norms: RMSNorm of nh heads of D floats per row (rows row_stride apart), w (D);
     * rstd (N, rstd_stride); backward sets din, dw += */
    void (*headnorm_forward)(float *out, float *rstd, const float *in, const float *w,
                             int64_t N, int nh, int D, int64_t row_stride, int64_t rstd_stride,
                             float eps);
    void (*headnorm_backward)(float *din, float *dw, const float *dout, const float *in,
                              const float *w, const float *rstd, int64_t N, int nh, int D,
                              int64_t row_stride, int64_t rstd_stride);
    /* whole-projection q/k norms in pieces (a tp view sums the row statistics over its group
     * between them; kernels.h) */
    void (*rownorm_sums)(float *st, int64_t st_stride, const float *in, const float *dout,
                         const float *w, const float *rstd, int64_t N, int n, int64_t row_stride);
    void (*rownorm_forward)(float *out, float *rstd, const float *in, const float *w,
                            const float *ss, int64_t N, int n, int64_t row_stride,
                            int64_t st_stride, int n_global, float eps);
    void (*rownorm_backward)(float *din, float *dw, const float *dout, const float *in,
                             const float *w, const float *rstd, const float *dots, int64_t N,
                             int n, int64_t row_stride, int64_t st_stride, int n_global);

    /* materialized causal attention (sdpa, the reference): qkv (B,T,(H+2*KVH)*D), out
     * (B,T,H*D), att (B,H,T,T) probabilities; backward: dqkv +=, scratch B*H*T*T floats.
     * mask (may be NULL): only its window, scale and softcap are read (always causal, no
     * documents, positions from 0) */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int H,
                              int KVH, int D, const loom_attn_mask *mask);
    void (*attention_backward)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int H, int KVH, int D,
                               const loom_attn_mask *mask);

    /* flash attention (tiled online softmax): out and lse (B,H,Tq, may be NULL) overwritten;
     * backward recomputes the tiles and ACCUMULATES into dq, dk, dv (NULL skipped). Return 0,
     * or < 0 with nothing written (bad dims, no scratch; kernels.h lists the codes). The
     * backend picks its own inner loops (cpu: the active ISA level). */
    int (*flash_attention_forward)(float *out, float *lse, const float *q, const float *k,
                                   const float *v, const loom_attn_dims *dims,
                                   const loom_attn_mask *mask);
    int (*flash_attention_backward)(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *out, const float *lse,
                                    const loom_attn_dims *dims, const loom_attn_mask *mask);
    /* the same with dq, dk, dv overwritten (=), not accumulated: no zeroing pass first */
    int (*flash_attention_backward_set)(float *dq, float *dk, float *dv, const float *dout,
                                        const float *q, const float *k, const float *v,
                                        const float *out, const float *lse,
                                        const loom_attn_dims *dims,
                                        const loom_attn_mask *mask);

    /* decoding: one query row q (H*D) against cached rows 0..n-1 of kcache, vcache
     * (n, KVH*D), every one visible (a window is the caller's ring of rows); out (H*D);
     * scratch H*n floats; mask (may be NULL): only its scale and softcap are read */
    void (*attention_decode)(float *out, const float *q, const float *kcache,
                             const float *vcache, int n, int H, int KVH, int D, float *scratch,
                             const loom_attn_mask *mask);

    /* out (B,T,C) = wte[tokens] (+ wpe[pos0 + t] when wpe is not NULL); backward += */
    void (*embedding_forward)(float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C, int pos0);
    void (*embedding_backward)(float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C, int pos0);

    /* vocab-parallel (tensor parallelism): wte holds rows [v0, v0 + Vl); other tokens give
     * zeros (+ wpe); backward += over the rows in range (kernels.h) */
    void (*embedding_shard_forward)(float *out, const int32_t *tokens, const float *wte, int v0,
                                    int Vl, const float *wpe, int B, int T, int C, int pos0);
    void (*embedding_shard_backward)(float *dwte, float *dwpe, const float *dout,
                                     const int32_t *tokens, int v0, int Vl, int B, int T, int C,
                                     int pos0);

    /* out (B,C) = mean over t of inp (B,T,C); dinp (B,T,C) += dout (B,C) / T */
    void (*mean_pool_forward)(float *out, const float *inp, int B, int T, int C);
    void (*mean_pool_backward)(float *dinp, const float *dout, int B, int T, int C);

    /* out = a + b, n floats (out may alias a) */
    void (*residual_forward)(float *out, const float *a, const float *b, int64_t n);

    /* losses (N) = -log softmax(logits)[target] (0 where target < 0); backward in place:
     * logits become (softmax - onehot) * dscale (rows with target < 0 become 0); every
     * cross-entropy backward takes rw: NULL, or device per-row weights (N) that replace dscale
     * row by row (kernels.h) */
    void (*crossentropy_forward)(float *losses, const float *logits, const int32_t *targets,
                                 int64_t N, int V);
    void (*crossentropy_softmax_backward)(float *logits, const int32_t *targets, int64_t N,
                                          int V, float dscale, const float *rw);
    /* the same for soft-capped logits: the gradient with respect to the raw ones (kernels.h) */
    void (*crossentropy_softcap_backward)(float *logits, const int32_t *targets, int64_t N,
                                          int V, float dscale, float cap, const float *rw);

    /* vocab-parallel cross-entropy over logits (N,Vl) = columns [v0, v0 + Vl): a row's local
     * max; (sum of exp(logit - mx), target logit or 0) per row with the global max mx; the
     * in-place backward with the global sums (kernels.h) */
    void (*crossentropy_shard_max)(float *mx, const float *logits, int64_t N, int Vl);
    void (*crossentropy_shard_sums)(float *sums, const float *logits, const float *mx,
                                    const int32_t *targets, int v0, int64_t N, int Vl);
    void (*crossentropy_shard_backward)(float *logits, const int32_t *targets, const float *mx,
                                        const float *sums, int v0, int64_t N, int Vl,
                                        float dscale, const float *rw);
    void (*crossentropy_shard_softcap_backward)(float *logits, const int32_t *targets,
                                                const float *mx, const float *sums, int v0,
                                                int64_t N, int Vl, float dscale, float cap,
                                                const float *rw);

    /* optimizer: AdamW on n contiguous parameters (decoupled decay, bias correction with
     * t = step >= 1) on the gradients g * grad_scale (clipping; 1 for none); sum of squares
     * in double (deterministic); x *= s */
    void (*adamw_update)(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int64_t step,
                         float grad_scale);
    double (*sum_squares)(const float *x, int64_t n);
    void (*scale_inplace)(float *x, int64_t n, float s);

    /* ---- LoRA (src/model/lora.c; cpu kernels: src/kernels/lora_ops.c) ---------------------
     * The host loops LoRA ran over adapter and activation memory, as ops. lora_add_scaled:
     * rows rows of width floats, dst[r*dst_stride + j] += a * src[r*src_stride + j] (the
     * adapters' product added into the linear's output columns, a = alpha / rank).
     * lora_scale_rows: dst (rows, width) contiguous = a * src[r*src_stride + j] (the target's
     * columns of the output gradient, scaled). lora_dropout_forward: adapter dropout of x
     * (N = B*T rows of `in` features, T per sequence) into xd = x * keep / (1 - p) and keep
     * (N, in) = 1 where the element's draw u >= p, u = 24 bits of loom_rng_at(key, c), c =
     * ((row0 + i / T) * Tg + pos) * in + j, pos = t < split ? pos0 + t : pos1 + (t - split)
     * for t = i % T (context parallelism's two chunks; split = T for one: docs/finetune.md
     * "Adapter dropout"). lora_dropout_backward: din[i] += dxd[i] / (1 - p) where keep[i], n
     * floats. lora_merge: W (out, in) += scale * B (out, r) A (r, in), each product summed
     * over r in double. lora_add_scaled_bf16: lora_add_scaled into bf16 rows (training.precision
     * bf16): dst = round(widen(dst) + a * src), the product and the sum in fp32, rounded once. */
    void (*lora_add_scaled)(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                            int64_t width, int64_t rows, float a);
    void (*lora_scale_rows)(float *dst, const float *src, int64_t src_stride, int64_t width,
                            int64_t rows, float a);
    void (*lora_dropout_forward)(float *xd, uint8_t *keep, const float *x, int64_t N,
                                 int64_t in, int T, int split, int64_t pos0, int64_t pos1,
                                 int64_t row0, int64_t Tg, uint64_t key, float p);
    void (*lora_dropout_backward)(float *din, const float *dxd, const uint8_t *keep, int64_t n,
                                  float p);
    void (*lora_merge)(float *W, const float *A, const float *B, int64_t out, int64_t in, int r,
                       float scale);
    void (*lora_add_scaled_bf16)(uint16_t *dst, int64_t dst_stride, const float *src,
                                 int64_t src_stride, int64_t width, int64_t rows, float a);
    /* ---- end of LoRA ---- */

    /* ---- bf16 / dtypes: bf16 mixed-precision training (training.precision bf16) -----------
     * kernels.h "bf16 mixed-precision training" gives each op's contract. Each op states its
     * dtypes in its signature: bf16 tensors are uint16_t (include/loom/bf16.h), fp32 float.
     * Saved activations bf16; activation gradients, norm statistics, lse, logits, losses,
     * parameters' masters and their gradients fp32; GEMMs accumulate in fp32. NULL where a
     * backend does not train in bf16. */
    int (*bf16_matmul_native)(void); /* 1: the GEMMs below run at bf16 speed here */
    void (*bf16_matmul_forward)(uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                                const float *bias, int64_t N, int IC, int OC);
    void (*bf16_matmul_forward_f32)(float *out, const uint16_t *inp, const uint16_t *weight,
                                    const float *bias, int64_t N, int IC, int OC);
    void (*bf16_matmul_backward)(float *dinp, int dinp_set, float *dweight, float *dbias,
                                 const float *dout, uint16_t *dout_bf16, const uint16_t *inp,
                                 const uint16_t *weight, int64_t N, int IC, int OC);
    void (*bf16_from_f32)(uint16_t *dst, const float *src, int64_t n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, int64_t n);
    void (*bf16_layernorm_forward)(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                                   const float *weight, const float *bias, int64_t N, int C,
                                   float eps);
    void (*bf16_layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const uint16_t *inp, const float *weight, const float *mean,
                                    const float *rstd, int64_t N, int C);
    void (*bf16_rmsnorm_forward)(uint16_t *out, float *rstd, const uint16_t *inp,
                                 const float *weight, int64_t N, int C, float eps);
    void (*bf16_rmsnorm_backward)(float *dinp, float *dweight, const float *dout,
                                  const uint16_t *inp, const float *weight, const float *rstd,
                                  int64_t N, int C);
    void (*bf16_gelu_forward)(uint16_t *out, const uint16_t *inp, int64_t n);
    void (*bf16_gelu_backward)(float *dinp, int set, const uint16_t *inp, const float *dout,
                               int64_t n);
    void (*bf16_glu_forward)(uint16_t *out, const uint16_t *inp, int64_t N, int F, int gelu);
    void (*bf16_glu_backward)(float *dinp, const uint16_t *inp, const float *dout, int64_t N,
                              int F, int gelu);
    void (*bf16_residual_forward)(uint16_t *out, const uint16_t *a, const uint16_t *b,
                                  int64_t n);
    void (*bf16_rope_forward)(uint16_t *x, int64_t B, int T, int nh, int D, int64_t row_stride,
                              const float *cos_t, const float *sin_t, int pos0);
    void (*bf16_embedding_forward)(uint16_t *out, const int32_t *tokens, const float *wte,
                                   const float *wpe, int B, int T, int C, int pos0);
    int64_t (*bf16_flash_ws_floats)(int B, int T, int H, int KVH, int D);
    int (*bf16_flash_attention_forward)(uint16_t *out, float *lse, const uint16_t *qkv,
                                        float *ws, int B, int T, int H, int KVH, int D,
                                        const loom_attn_mask *mask);
    int (*bf16_flash_attention_backward)(float *dqkv, const float *dout, const uint16_t *qkv,
                                         const uint16_t *out, const float *lse, float *ws,
                                         int B, int T, int H, int KVH, int D,
                                         const loom_attn_mask *mask);
    void (*bf16_crossentropy_forward)(float *losses, const uint16_t *logits,
                                      const int32_t *targets, int64_t N, int V);
    void (*bf16_crossentropy_backward)(uint16_t *logits, const int32_t *targets, int64_t N,
                                       int V, float dscale, const float *rw);
    void (*adamw_update_bf16)(float *p, uint16_t *pb, const float *g, float *m, float *v,
                              int64_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int64_t step, float grad_scale);
    /* ---- end of bf16 / dtypes ---- */

    /* ---- MoE (src/model/moe.c, docs/moe.md): routing, dispatch, combine, their backward ----
     * N tokens, E experts, K = top_k choices per token, C = d_model. The routing ints are
     * int32: e (N,K) each token's chosen experts, best first; pos (N,K) each choice's row in
     * the expert-major order (experts in order, a token's rows in token order), -1 = dropped
     * by capacity; cnt (E) the kept rows of each expert (the one host read of the routing,
     * "moe dispatch counts", sizes the dispatch). Gate weight of choice j: p[t,e_j], or with
     * renorm p[t,e_j] / sum of the token's K choices' p (float32). Row arithmetic as the host
     * loops had it (the cpu kernels are bit for bit those: src/kernels/moe.c).
     * moe_route: p (N,E) holds the router logits and becomes softmax(logits) (in double, then
     * float32), lse (N) their log-sum-exp; top-k (ties: the lower expert); per routing group of
     * `group` consecutive tokens, at most floor(capacity_factor * K * group / E) kept rows per expert,
     * first choices first, then in token order (capacity_factor 0: dropless); e, pos, cnt
     * written. stats NULL, or (E + 5) doubles ACCUMULATED (+=): per expert its assignments
     * before capacity, then dropped, assigned (G*K), the balance sum (G * E * sum_e f_e P_e per
     * group), the z sum (sum of lse^2), tokens. */
    void (*moe_route)(float *p, float *lse, int32_t *e, int32_t *pos, int32_t *cnt,
                      double *stats, int64_t N, int E, int K, int64_t group,
                      float capacity_factor);
    /* dispatch: row pos[t,j] of X = row t of x, for each kept choice (rows of row_bytes: the
     * permutation is the same for every dtype) */
    void (*moe_gather)(void *X, const void *x, const int32_t *pos, int64_t N, int K,
                       size_t row_bytes);
    /* combine: y (N,C) = sum over kept j of w_j YB[pos[t,j]] (overwritten) */
    void (*moe_combine)(float *y, const float *YB, const float *p, const int32_t *e,
                        const int32_t *pos, int64_t N, int E, int K, int C, int renorm);
    /* its backward: dYB[pos[t,j]] = w_j dy[t] (set), dw (N,K) = <dy[t], YB[pos[t,j]]> in
     * double (0 for a dropped choice) */
    void (*moe_combine_backward)(float *dYB, float *dw, const float *dy, const float *YB,
                                 const float *p, const int32_t *e, const int32_t *pos,
                                 int64_t N, int E, int K, int C, int renorm);
    /* dispatch's backward: dx[t] += dXB[pos[t,j]] for each kept choice */
    void (*moe_scatter_add)(float *dx, const float *dXB, const int32_t *pos, int64_t N, int K,
                            int C);
    /* the router's backward: dl (N,E) = d logits (set) from the gate weights' gradients dw,
     * the balance loss (aux = its coefficient x dscale; f_e per routing group before capacity)
     * and the z-loss (zc likewise) through the softmax */
    void (*moe_router_backward)(float *dl, const float *p, const float *lse, const int32_t *e,
                                const int32_t *pos, const float *dw, int64_t N, int E, int K,
                                int64_t group, double aux, double zc, int renorm);
    /* shared experts' gate (model.moe.shared_gate): g = sigmoid(g) in place (n); y (N,C) +=
     * g[t] ys[t]; backward: dys = g dy (set), dz (N) = <dy, ys> g (1 - g) (set) */
    void (*moe_sigmoid)(float *g, int64_t n);
    void (*moe_gate_add)(float *y, const float *g, const float *ys, int64_t N, int C);
    void (*moe_gate_backward)(float *dys, float *dz, const float *dy, const float *g,
                              const float *ys, int64_t N, int C);
    /* bf16 (training.precision bf16): bf16 rows, fp32 gate weights and accumulation.
     * combine: y (N,C) = round(sum over kept j of w_j YB[pos[t,j]] + sum over s < S of g_s[t]
     * ys[s,t]) (ys (S,N,C) the shared experts' outputs, NULL when S = 0; g (S,N), NULL: 1);
     * backward: as moe_combine_backward / moe_gate_backward on the bf16 YB / ys */
    void (*bf16_moe_combine)(uint16_t *y, const uint16_t *YB, const float *p, const int32_t *e,
                             const int32_t *pos, int64_t N, int E, int K, int C, int renorm,
                             const uint16_t *ys, const float *g, int S);
    void (*bf16_moe_combine_backward)(float *dYB, float *dw, const float *dy,
                                      const uint16_t *YB, const float *p, const int32_t *e,
                                      const int32_t *pos, int64_t N, int E, int K, int C,
                                      int renorm);
    void (*bf16_moe_gate_backward)(float *dys, float *dz, const float *dy, const float *g,
                                   const uint16_t *ys, int64_t N, int C);
    /* ---- end of MoE ---- */
} loom_backend;

/* ---- instruction-set level (src/kernels/isa.c, docs/build.md) --------------------------
 * Process setup, not an op: here rather than in loom/kernels.h, so that start-up code above the
 * kernels (loom_parallel_start) sets it without calling kernels directly.
 * The portable build compiles the hand-written kernels (norms, activations, attention's
 * softmax, cross-entropy, AdamW, RoPE, decode attention) once per x86-64 level and picks one
 * at run time: the only global state of the kernels. Levels differ in bits (FMA contraction,
 * the vector width of in-row reductions), so every rank of a job must use the same one:
 * loom_parallel_start (include/loom/parallel.h) agrees on the minimum over the ranks. matmul
 * goes to OpenBLAS, which dispatches itself. A NATIVE=1 build (-march=native) has one level,
 * "native". */
typedef enum {
    LOOM_ISA_NATIVE = 0, /* NATIVE=1 build: one variant compiled for the build machine */
    LOOM_ISA_BASE = 1,   /* x86-64 (SSE2): any x86-64 CPU */
    LOOM_ISA_AVX2 = 3,   /* x86-64-v3: AVX2 + FMA */
    LOOM_ISA_AVX512 = 4, /* x86-64-v4: AVX-512 F/BW/DQ/VL/CD */
} loom_isa;
struct loom_err;
/* the best level this CPU (and OS) supports; LOOM_ISA_NATIVE in a NATIVE=1 build */
loom_isa loom_isa_detect(void);
/* the level the kernels use now (first call: loom_isa_init's choice, aborting on a bad
 * LOOM_ISA: programs call loom_isa_init first to get the error) */
loom_isa loom_isa_active(void);
/* chooses the local level: the environment's LOOM_ISA (x86-64 | avx2 | avx512 | auto) or the
 * best detected. A level the CPU lacks, or an unknown name, is an error naming LOOM_ISA. */
int loom_isa_init(struct loom_err *err);
/* sets the level (agreement across ranks, tests); it must be <= loom_isa_detect() */
int loom_isa_set(loom_isa level, struct loom_err *err);
/* "native", "x86-64", "avx2", "avx512" */
const char *loom_isa_name(loom_isa level);

/* The CPU backend (static table; the kernels of include/loom/kernels.h). */
const loom_backend *loom_backend_cpu(void);
/* cpu-guard (src/kernels/backend_guard.c): the cpu kernels over memory that is inaccessible
 * (PROT_NONE) except inside its own ops, copies and comm_begin/end windows. Each op aborts,
 * naming itself and the argument, when a pointer argument is not NULL and not inside one of
 * its live allocations; a host access to its memory faults (SIGSEGV, reported with the address
 * and a backtrace). For tests: it proves that host code reads device memory only through the
 * copies (docs/engine.md). */
const loom_backend *loom_backend_guard(void);
/* 1 when p lies inside a live cpu-guard allocation (tests) */
int loom_guard_owns(const void *p);
/* (Re)installs cpu-guard's SIGSEGV handler, for a program that installed its own after the
 * backend's first use (a test framework's) */
void loom_guard_install_handler(void);
/* The backend a model uses when its config names none: the environment's LOOM_BACKEND when
 * set (a name loom_backend_find knows; anything else aborts, naming LOOM_BACKEND), else cpu. */
const loom_backend *loom_backend_default(void);
/* The one way host code reads device memory: n bytes from src (device) into dst (host),
 * `what` naming the read (docs/engine.md lists them; tests/e2e/test_backend_confined.sh keeps
 * the list and the calls in step). */
void loom_dev_read(const loom_backend *be, void *dst, const void *src, size_t n,
                   const char *what);
/* The CUDA backend (src/cuda, docs/gpu.md), in a build that has it (nvcc found): its table;
 * loom_cuda_init picks this rank's GPU (0, or -1 with the reason: no GPU, fewer GPUs than
 * local ranks). cuda-emu: the same kernels run on the CPU by an emulator (tests; every
 * build has it but the sanitizer one). */
const loom_backend *loom_backend_cuda(void);
int loom_cuda_init(char *why, size_t n);
/* "device 0 of 1: NVIDIA H200 (sm_90, ...)": 0; or the reason there is none: -1 */
int loom_cuda_describe(char *buf, size_t n);
const loom_backend *loom_backend_cuda_emu(void);
/* the CUDA device's name as cudaGetDeviceProperties gives it ("NVIDIA H200"): 0; -1 (and "")
 * for a backend without one */
int loom_cuda_device_name(char *buf, size_t n);
int loom_backend_device_name(const loom_backend *be, char *buf, size_t n);
/* the device memory in use and the device's total (cuda: cudaMemGetInfo, the whole GPU's):
 * 0; -1 for a backend without device memory (cpu) */
int loom_cuda_mem_info(size_t *used, size_t *total);
int loom_backend_mem_info(const loom_backend *be, size_t *used, size_t *total);
/* 1 when this build has the CUDA backend (loom version) */
int loom_backend_has_cuda(void);
/* A backend's device is usable: 0, or -1 with the reason in err (cuda: no GPU, too few) */
int loom_backend_ready(const loom_backend *be, struct loom_err *err);
/* The backend named `name` ("cpu", "cpu-guard", "cuda", "cuda-emu"), or NULL when there is
 * none by that name in this build. */
const loom_backend *loom_backend_find(const char *name);
/* The names loom_backend_find knows, for error messages: "cpu, cpu-guard". */
const char *loom_backend_names(void);

#endif
