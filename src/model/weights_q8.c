/* Inference weights in 8 bits (`--weights int8`, docs/inference.md "Weights in int8") and in
 * 4 bits (`--weights int4`, "Weights in int4").
 *
 * The matrices `--weights bf16` rounds (each linear's: q|k|v, attn_proj, fc or gate|up,
 * fc_proj; and the head: gpt2's tied wte, llama's lm_head) are quantized once to GGUF's Q8_0
 * (src/kernels/matmul_q8.c, through the backend's q8 ops: blocks of 32 along the input dimension, an fp16 scale each) into
 * one arena streamed every step, and the pages of their fp32 copies are handed back to the
 * kernel: a decode step then reads 1.0625 bytes per weight instead of 4. The norms, biases and
 * position embeddings stay fp32. Each linear (and the head) quantizes its input rows the same
 * way and multiplies Q8_0 x Q8_0 (matmul_q8_forward). With a tied head the embedding rows are
 * the quantized wte's, dequantized. Only the batched decode (loom_model_decode_batch: the
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
 * weights' scales to be finite) */
static int all_finite(const float *w, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(w[i])) return 0;
    return 1;
}

/* quantizes w (OC, IC) into the arena at p (q8_bytes), sets q / d, releases w's pages */
static void q8_place(const loom_backend *be, char *p, const float *w, int64_t OC, int IC,
                     const int8_t **q, const uint16_t **d) {
    int8_t *vq = (int8_t *)p;
    uint16_t *vd = (uint16_t *)(p + (((size_t)OC * (size_t)IC + 63) & ~(size_t)63));
    /* in slices of rows, so that at most one slice of fp32 and of int8 is hot at once */
    for (int64_t r = 0; r < OC; r += 256) {
        const int64_t n = OC - r < 256 ? OC - r : 256;
        be->q8_quantize(vq + r * IC, vd + r * (IC / LOOM_Q8_BLOCK), w + r * IC, n, IC);
    }
    model_release_pages(w, (size_t)OC * (size_t)IC);
    *q = vq;
    *d = vd;
}

/* the same into Q4_K blocks (q4k_bytes) */
static void q4k_place(const loom_backend *be, char *p, const float *w, int64_t OC, int IC,
                      const uint8_t **blocks) {
    uint8_t *b = (uint8_t *)p;
    const size_t row = (size_t)(IC / LOOM_Q4K_BLOCK) * LOOM_Q4K_BYTES;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t r = 0; r < OC; r += 64) { /* loom's fit is some 100 ns a value: in parallel */
        const int64_t n = OC - r < 64 ? OC - r : 64;
        be->q4k_quantize(b + (size_t)r * row, w + r * IC, n, IC);
    }
    model_release_pages(w, (size_t)OC * (size_t)IC);
    *blocks = b;
}

static const char *const site_names[4] = {"q|k|v", "attn_proj", "fc", "fc_proj"};

/* --weights int8 (bits 8) or int4 (bits 4) */
static int set_weights_quantized(loom_model *m, int bits, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    const char *opt = bits == 4 ? "--weights int4" : "--weights int8";
    if (m->wq8) {
        if ((m->wq4 != NULL) == (bits == 4)) return 0;
        return loom_errf(err, "%s cannot run with --weights %s", opt, m->wq4 ? "int4" : "int8");
    }
    if (m->wbf16) return loom_errf(err, "%s cannot run with --weights bf16 or --compute bf16", opt);
    if (model_infer_weights_check(m, opt, err)) return -1;
    if (!m->be->q8_quantize || !m->be->q8_dequantize || !m->be->matmul_q8_forward ||
        (bits == 4 && (!m->be->q4k_quantize || !m->be->q8k_quantize || !m->be->matmul_q4k_forward)))
        return loom_errf(err, "%s: the %s backend has no int%d matmul", opt, m->be->name, bits);
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
            if (w[k] && !all_finite(w[k], (int64_t)oc[k] * ic[k]))
                return loom_errf(err, "%s: layer %d's %s weight has a value that is not "
                                      "finite", opt, l, site_names[k]);
    }
    if (HEAD_W(m) && !all_finite(HEAD_W(m), (int64_t)V * C))
        return loom_errf(err, "%s: the head's weight has a value that is not finite", opt);
    size_t total = q8_bytes(V, C);
    for (int k = 0; k < 4; k++)
        total += (size_t)L * (four[k] ? q4k_bytes(oc[k], ic[k]) : q8_bytes(oc[k], ic[k]));
    char *arena = model_alloc_streamed(total);
    m->wq8_q = loom_calloc((size_t)L * 4, sizeof *m->wq8_q);
    m->wq8_d = loom_calloc((size_t)L * 4, sizeof *m->wq8_d);
    if (bits == 4) m->wq4 = loom_calloc((size_t)L * 4, sizeof *m->wq4);
    size_t at = 0;
    for (int l = 0; l < L; l++) {
        const float *w[4] = LINEAR_WS(m, l);
        for (int k = 0; k < 4; k++) {
            LOOM_CHECK(w[k] != NULL);
            if (four[k]) {
                q4k_place(m->be, arena + at, w[k], oc[k], ic[k], &m->wq4[4 * l + k]);
                at += q4k_bytes(oc[k], ic[k]);
            } else {
                q8_place(m->be, arena + at, w[k], oc[k], ic[k], &m->wq8_q[4 * l + k],
                         &m->wq8_d[4 * l + k]);
                at += q8_bytes(oc[k], ic[k]);
            }
        }
    }
    const float *hw = HEAD_W(m);
    LOOM_CHECK(hw != NULL);
    q8_place(m->be, arena + at, hw, V, C, &m->wq8_head_q, &m->wq8_head_d);
    m->wq8 = arena;
    m->wq8_bytes = total;
    return 0;
}

int loom_model_set_weights_int8(loom_model *m, loom_err *err) {
    return set_weights_quantized(m, 8, err);
}
int loom_model_set_weights_int4(loom_model *m, loom_err *err) {
    return set_weights_quantized(m, 4, err);
}

int loom_model_weights_int8(const loom_model *m) { return m->wq8 != NULL && m->wq4 == NULL; }
int loom_model_weights_int4(const loom_model *m) { return m->wq4 != NULL; }

size_t loom_model_decode_weight_bytes(const loom_model *m) {
    const loom_model_config *c = &m->cfg;
    const int64_t L = c->n_layer, C = c->d_model, V = c->vocab_size;
    /* the lookup tables a step reads a row of: an untied wte, and wpe */
    int64_t lookup = c->arch.tied ? 0 : V * C;
    if (PARAM(m, LOOM_P_WPE)) lookup += (int64_t)c->max_seq_len * C;
    size_t total = ((size_t)m->n_params - (size_t)lookup) * sizeof(float);
    if (m->wq8 || m->wbf16) { /* the matrices in their arena instead of in fp32 */
        const int64_t mats = L * ((int64_t)m->QKV * C + (int64_t)C * m->H * m->D +
                                  (int64_t)m->FFI * C + (int64_t)C * m->F) + V * C;
        total -= (size_t)mats * sizeof(float);
        total += m->wq8 ? m->wq8_bytes : m->wbf16_bytes;
    }
    return total;
}
