/* Inference weights in 8 bits (`--weights int8`, docs/inference.md "Weights in int8") and in
 * 4 bits (`--weights int4`, "Weights in int4").
 *
 * The matrices `--weights bf16` rounds (each linear's: q|k|v, attn_proj, fc or gate|up,
 * fc_proj; and the head: gpt2's tied wte, llama's lm_head) are quantized once to GGUF's Q8_0
 * (src/kernels/matmul_q8.c, through the backend's q8 ops: blocks of 32 along the input
 * dimension, an fp16 scale each) into one arena of the backend's streamed every step
 * (mem_alloc LOOM_MEM_STREAMED), and the pages of their fp32 copies are handed back
 * (mem_release): a decode step then reads 1.0625 bytes per weight instead of 4. Each is a
 * stored matrix (model_wmat: LOOM_WF_Q8_0, or LOOM_WF_Q4_K below) that the block's linear and
 * the head multiply through model_wmat_forward (block.c). The norms, biases and
 * position embeddings stay fp32. Each linear (and the head) quantizes its input rows the same
 * way and multiplies Q8_0 x Q8_0 (matmul_q8_forward). With a tied head the embedding rows are
 * the quantized wte's, dequantized (model_wmat_row). Only the batched decode (loom_model_decode_batch: the
 * engine of generate, serve and synth) runs such a model.
 *
 * int4 holds the linears whose input width is a multiple of 256 in GGUF's Q4_K
 * (src/kernels/matmul_q4k.c: 4.5 bits a weight), their inputs quantized in blocks of 256
 * (q8k_quantize_rows), and the others and the head in Q8_0 as int8 does (llama.cpp's
 * quantizer falls back for such widths too, and keeps the head in more bits). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "model/model_internal.h"

/* bytes of one (OC, IC) matrix in the arena: Q8_0's values, then its scales, each 64-aligned;
 * or Q4_K's blocks */
static size_t q8_bytes(int64_t OC, int IC) {
    const size_t v = ((size_t)OC * (size_t)IC + 63) & ~(size_t)63;
    const size_t d = ((size_t)OC * (size_t)(IC / LOOM_Q8_BLOCK) * 2 + 63) & ~(size_t)63;
    return v + d;
}
static size_t q4k_bytes(int64_t OC, int IC) {
    return ((size_t)OC * (size_t)(IC / LOOM_Q4K_BLOCK) * LOOM_Q4K_BYTES + 63) & ~(size_t)63;
}

/* 1 when every one of n floats is finite (Q8_0 has no inf or NaN; the kernel takes the
 * weights' scales to be finite), through the backend's sum of squares in double (the gradient
 * norm's op, which the NaN skip reads): a finite float's square is below 2^256, so a sum of
 * fewer than 2^700 of them is finite exactly when every value is (inf and NaN stay). */
static int all_finite(const loom_backend *be, const float *w, int64_t n) {
    return isfinite(be->sum_squares(w, n));
}

/* quantizes w (OC, IC) into the arena at p (q8_bytes), releases w's pages; its stored matrix */
static model_wmat q8_place(const loom_backend *be, char *p, const float *w, int64_t OC, int IC) {
    int8_t *vq = (int8_t *)p;
    uint16_t *vd = (uint16_t *)(p + (((size_t)OC * (size_t)IC + 63) & ~(size_t)63));
    /* in slices of rows, so that at most one slice of fp32 and of int8 is hot at once */
    for (int64_t r = 0; r < OC; r += 256) {
        const int64_t n = OC - r < 256 ? OC - r : 256;
        be->q8_quantize(vq + r * IC, vd + r * (IC / LOOM_Q8_BLOCK), w + r * IC, n, IC);
    }
    be->mem_release((void *)w, (size_t)OC * (size_t)IC * sizeof(float));
    return (model_wmat){LOOM_WF_Q8_0, vq, vd};
}

/* the same into Q4_K blocks (q4k_bytes) */
static model_wmat q4k_place(const loom_backend *be, char *p, const float *w, int64_t OC, int IC) {
    uint8_t *b = (uint8_t *)p;
    const size_t row = (size_t)(IC / LOOM_Q4K_BLOCK) * LOOM_Q4K_BYTES;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t r = 0; r < OC; r += 64) { /* loom's fit is some 100 ns a value: in parallel */
        const int64_t n = OC - r < 64 ? OC - r : 64;
        be->q4k_quantize(b + (size_t)r * row, w + r * IC, n, IC);
    }
    be->mem_release((void *)w, (size_t)OC * (size_t)IC * sizeof(float));
    return (model_wmat){LOOM_WF_Q4_K, b, NULL};
}

static const char *const site_names[4] = {"q|k|v", "attn_proj", "fc", "fc_proj"};

/* --weights int8 (bits 8) or int4 (bits 4) */
static int set_weights_quantized(loom_model *m, int bits, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    const loom_backend *be = m->be;
    const char *opt = bits == 4 ? "--weights int4" : "--weights int8";
    const int want = bits == 4 ? LOOM_WF_Q4_K : LOOM_WF_Q8_0;
    if (m->wopt == want) return 0;
    if (m->wopt == LOOM_WF_Q8_0 || m->wopt == LOOM_WF_Q4_K)
        return loom_errf(err, "%s cannot run with --weights %s", opt,
                         m->wopt == LOOM_WF_Q4_K ? "int4" : "int8");
    if (m->wopt != LOOM_WF_F32)
        return loom_errf(err, "%s cannot run with --weights bf16 or --compute bf16", opt);
    if (model_infer_weights_check(m, opt, err)) return -1;
    if (!be->q8_quantize || !be->q8_dequantize || !be->matmul_q8_forward ||
        (bits == 4 && (!be->q4k_quantize || !be->q4k_dequantize || !be->q8k_quantize ||
                       !be->matmul_q4k_forward)))
        return loom_errf(err, "%s: the %s backend has no int%d matmul", opt, be->name, bits);
    const int L = c->n_layer, C = c->d_model, V = c->vocab_size;
    const int oc[4] = {m->QKV, C, m->FFI, C}, ic[4] = {C, m->H * m->D, C, m->F};
    static const char *const names[4] = {"model.d_model", "n_head * head_dim", "model.d_model",
                                         "model.d_ff"};
    for (int k = 0; k < 4; k++)
        if (ic[k] % LOOM_Q8_BLOCK != 0 || ic[k] > 32768)
            return loom_errf(err, "%s: a linear's input width %s = %d is not a multiple of %d "
                                  "up to 32768 (Q8_0 quantizes blocks of %d along it); use "
                                  "--weights bf16 or fp32", opt, names[k], ic[k], LOOM_Q8_BLOCK,
                             LOOM_Q8_BLOCK);
    /* int4: Q4_K where the input width is a multiple of its 256-value blocks, Q8_0 elsewhere
     * (as llama.cpp falls back for such matrices); the head always Q8_0 */
    int four[4];
    for (int k = 0; k < 4; k++) four[k] = bits == 4 && ic[k] % LOOM_Q4K_BLOCK == 0;
    /* every matrix checked before any is quantized (and its fp32 pages released) */
    for (int l = 0; l < L; l++) {
        const float *w[4] = LINEAR_WS(m, l);
        for (int k = 0; k < 4; k++)
            if (w[k] && !all_finite(be, w[k], (int64_t)oc[k] * ic[k]))
                return loom_errf(err, "%s: layer %d's %s weight has a value that is not "
                                      "finite", opt, l, site_names[k]);
    }
    if (HEAD_W(m) && !all_finite(be, HEAD_W(m), (int64_t)V * C))
        return loom_errf(err, "%s: the head's weight has a value that is not finite", opt);
    size_t total = q8_bytes(V, C);
    for (int k = 0; k < 4; k++)
        total += (size_t)L * (four[k] ? q4k_bytes(oc[k], ic[k]) : q8_bytes(oc[k], ic[k]));
    /* every byte a matmul reads is written (the 64-byte gaps after each part are not read) */
    char *arena = be->mem_alloc(total, LOOM_MEM_STREAMED);
    m->wmat = loom_calloc((size_t)L * 4 + 1, sizeof *m->wmat);
    size_t at = 0;
    for (int l = 0; l < L; l++) {
        const float *w[4] = LINEAR_WS(m, l);
        for (int k = 0; k < 4; k++) {
            LOOM_CHECK(w[k] != NULL);
            if (four[k]) {
                m->wmat[4 * l + k] = q4k_place(be, arena + at, w[k], oc[k], ic[k]);
                at += q4k_bytes(oc[k], ic[k]);
            } else {
                m->wmat[4 * l + k] = q8_place(be, arena + at, w[k], oc[k], ic[k]);
                at += q8_bytes(oc[k], ic[k]);
            }
        }
    }
    const float *hw = HEAD_W(m);
    LOOM_CHECK(hw != NULL);
    m->wmat[4 * L] = q8_place(be, arena + at, hw, V, C);
    m->warena = arena;
    m->warena_bytes = total;
    m->wopt = want;
    return 0;
}

int loom_model_set_weights_int8(loom_model *m, loom_err *err) {
    return set_weights_quantized(m, 8, err);
}
int loom_model_set_weights_int4(loom_model *m, loom_err *err) {
    return set_weights_quantized(m, 4, err);
}

int loom_model_weights_int8(const loom_model *m) { return m->wopt == LOOM_WF_Q8_0; }
int loom_model_weights_int4(const loom_model *m) { return m->wopt == LOOM_WF_Q4_K; }

size_t loom_model_decode_weight_bytes(const loom_model *m) {
    const loom_model_config *c = &m->cfg;
    const int64_t L = c->n_layer, C = c->d_model, V = c->vocab_size;
    /* the lookup tables a step reads a row of: an untied wte, and wpe */
    int64_t lookup = c->arch.tied ? 0 : V * C;
    if (PARAM(m, LOOM_P_WPE)) lookup += (int64_t)c->max_seq_len * C;
    size_t total = ((size_t)m->n_params - (size_t)lookup) * sizeof(float);
    if (m->wmat) { /* the matrices in their arena instead of in fp32 */
        const int64_t mats = L * ((int64_t)m->QKV * C + (int64_t)C * m->H * m->D +
                                  (int64_t)m->FFI * C + (int64_t)C * m->F) + V * C;
        total -= (size_t)mats * sizeof(float);
        total += m->warena_bytes;
    }
    return total;
}
