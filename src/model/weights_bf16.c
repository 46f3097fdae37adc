/* Inference weights in bfloat16 (`--weights bf16`, docs/inference.md "Weights in bf16").
 *
 * Each linear's weight matrix (q|k|v, attn_proj, fc or gate|up, fc_proj) and the head matrix
 * (gpt2's tied wte, llama's lm_head) is rounded once to bf16 (to nearest, ties to even) into a
 * packed arena, and the pages of its fp32 copy are handed back to the kernel (madvise
 * MADV_DONTNEED on the whole pages inside the tensor): the model then holds those matrices in
 * half the bytes and a decode step reads half as many. The norms, biases and position
 * embeddings stay fp32. The kernels widen each weight to the fp32 it stands for and compute as
 * in fp32 (matmul_rows_bf16_forward), so a step gives what the fp32 model gives on the rounded
 * weights. Only the batched decode (loom_model_decode_batch: the engine of generate, serve and
 * synth) runs such a model; the full forward and the single-sequence decode refuse it. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loom/backend.h"
#include "loom/bf16.h"
#include "model/model_internal.h"

/* rounds n floats at src into dst, then releases src's whole pages */
static void round_release(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = loom_bf16_round(src[i]);
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)src + pg - 1) & ~(pg - 1);
    const uintptr_t b = ((uintptr_t)(src + n)) & ~(pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

int loom_model_set_weights_bf16(loom_model *m, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    if (m->wbf16) return 0;
    if (c->head != LOOM_HEAD_LM || m->lay.tp != 1 || !m->lay.has_embedding || !m->lay.has_head ||
        !m->params)
        return loom_errf(err, "--weights bf16 needs a whole language model (tp = 1)");
    if (m->E > 0) return loom_errf(err, "--weights bf16 does not support MoE layers yet");
    if (!m->be->matmul_bf16_forward)
        return loom_errf(err, "--weights bf16: the %s backend has no bf16 matmul", m->be->name);
    if (m->lora) return loom_errf(err, "--weights bf16 does not support LoRA adapters");
    const int L = c->n_layer, C = c->d_model;
    const size_t sz[4] = {(size_t)m->QKV * C, (size_t)C * m->H * m->D, (size_t)m->FFI * C,
                          (size_t)C * m->F};
    const size_t head = (size_t)c->vocab_size * C;
    size_t total = head;
    for (int k = 0; k < 4; k++) total += (size_t)L * ((sz[k] + 31) & ~(size_t)31);
    uint16_t *arena = loom_alloc_aligned(total * sizeof(uint16_t));
    m->wbf16_lin = loom_calloc((size_t)L * 4, sizeof *m->wbf16_lin);
    size_t at = 0;
    for (int l = 0; l < L; l++) {
        const float *w[4] = {QKV_W(m, l), LP(m, LOOM_L_ATTN_PROJ_W, l), FC1_W(m, l),
                             LP(m, LOOM_L_FC_PROJ_W, l)};
        for (int k = 0; k < 4; k++) {
            LOOM_CHECK(w[k] != NULL);
            round_release(arena + at, w[k], sz[k]);
            m->wbf16_lin[4 * l + k] = arena + at;
            at += (sz[k] + 31) & ~(size_t)31;
        }
    }
    const float *hw =
        c->flavor == LOOM_FLAVOR_GPT2 ? PARAM(m, LOOM_P_WTE) : PARAM(m, LOOM_P_LM_HEAD);
    LOOM_CHECK(hw != NULL);
    round_release(arena + at, hw, head);
    m->wbf16_head = arena + at;
    m->wbf16 = arena;
    m->wbf16_bytes = total * sizeof(uint16_t);
    return 0;
}

int loom_model_weights_bf16(const loom_model *m) { return m->wbf16 != NULL; }

int loom_model_set_compute_bf16(loom_model *m, loom_err *err) {
    if (!m->be->bf16_round || !m->be->matmul_dotbf16_forward)
        return loom_errf(err, "--compute bf16: the %s backend has no bf16 x bf16 matmul",
                         m->be->name);
    if (loom_model_set_weights_bf16(m, err)) return -1;
    m->cbf16 = 1;
    return 0;
}

int loom_model_compute_bf16(const loom_model *m) { return m->cbf16; }
