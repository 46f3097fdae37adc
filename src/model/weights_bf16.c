/* Inference weights in bfloat16 (`--weights bf16`, docs/inference.md "Weights in bf16"), and
 * the stored-matrix set-up the inference weight options share (weights_q8.c: int8, int4).
 *
 * Each linear's weight matrix (q|k|v, attn_proj, fc or gate|up, fc_proj) and the head matrix
 * (gpt2's tied wte, llama's lm_head) is rounded once to bf16 (to nearest, ties to even: the
 * backend's bf16_from_f32) into one arena of the backend's, streamed every step (mem_alloc
 * LOOM_MEM_STREAMED: on the cpu backend 2 MiB aligned, huge pages asked for), and the pages of
 * its fp32 copy are handed back (mem_release): the model then holds those matrices in half the
 * bytes and a decode step reads half as many. Each is a stored matrix (model_wmat, format
 * LOOM_WF_BF16) the block's linear and the head multiply through model_wmat_forward (block.c):
 * the kernel widens each weight to the fp32 it stands for and computes as in fp32
 * (matmul_rows_bf16_forward), so a step gives what the fp32 model gives on the rounded weights.
 * The norms, biases and position embeddings stay fp32. `--compute bf16` holds the same
 * matrices in the backend's packed layout (LOOM_WF_BF16P) and rounds the input rows too. Only
 * the batched decode (loom_model_decode_batch: the engine of generate, serve and synth) runs
 * such a model; the full forward and the single-sequence decode refuse it. */
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "model/model_internal.h"

/* what inference weights need of the model (what: the option, for the message) */
int model_infer_weights_check(const loom_model *m, const char *what, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    if (c->head != LOOM_HEAD_LM || m->lay.tp != 1 || !m->lay.has_embedding || !m->lay.has_head ||
        !m->params)
        return loom_errf(err, "%s needs a whole language model (tp = 1)", what);
    if (m->E > 0) return loom_errf(err, "%s does not support MoE layers yet", what);
    if (m->lora) return loom_errf(err, "%s does not support LoRA adapters", what);
    if (m->bf16)
        return loom_errf(err, "%s runs an fp32 model, not one in training.precision bf16", what);
    if (m->wopt == LOOM_WF_Q8_0 || m->wopt == LOOM_WF_Q4_K)
        return loom_errf(err, "%s cannot run with --weights %s", what,
                         m->wopt == LOOM_WF_Q4_K ? "int4" : "int8");
    return 0;
}

int loom_model_set_weights_bf16(loom_model *m, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    const loom_backend *be = m->be;
    if (m->wopt == LOOM_WF_BF16 || m->wopt == LOOM_WF_BF16P) return 0; /* bf16 already */
    if (model_infer_weights_check(m, "--weights bf16", err)) return -1;
    if (!be->matmul_bf16_forward)
        return loom_errf(err, "--weights bf16: the %s backend has no bf16 matmul", be->name);
    const int L = c->n_layer, C = c->d_model;
    const size_t sz[4] = {(size_t)m->QKV * C, (size_t)C * m->H * m->D, (size_t)m->FFI * C,
                          (size_t)C * m->F};
    const size_t head = (size_t)c->vocab_size * C;
    size_t total = head;
    for (int k = 0; k < 4; k++) total += (size_t)L * ((sz[k] + 31) & ~(size_t)31);
    uint16_t *arena = be->mem_alloc(total * sizeof(uint16_t), LOOM_MEM_STREAMED);
    m->wmat = loom_calloc((size_t)L * 4 + 1, sizeof *m->wmat);
    size_t at = 0;
    for (int l = 0; l < L; l++) {
        const float *w[4] = LINEAR_WS(m, l);
        for (int k = 0; k < 4; k++) {
            LOOM_CHECK(w[k] != NULL);
            const size_t pad = ((sz[k] + 31) & ~(size_t)31) - sz[k];
            be->bf16_from_f32(arena + at, w[k], (int64_t)sz[k]);
            if (pad) be->mem_set(arena + at + sz[k], 0, pad * sizeof(uint16_t)); /* the gap */
            be->mem_release((void *)w[k], sz[k] * sizeof(float));
            m->wmat[4 * l + k] = (model_wmat){LOOM_WF_BF16, arena + at, NULL};
            at += sz[k] + pad;
        }
    }
    const float *hw = HEAD_W(m);
    LOOM_CHECK(hw != NULL);
    be->bf16_from_f32(arena + at, hw, (int64_t)head);
    be->mem_release((void *)hw, head * sizeof(float));
    m->wmat[4 * L] = (model_wmat){LOOM_WF_BF16, arena + at, NULL};
    m->warena = arena;
    m->warena_bytes = total * sizeof(uint16_t);
    m->wopt = LOOM_WF_BF16;
    return 0;
}

int loom_model_weights_bf16(const loom_model *m) {
    return m->wopt == LOOM_WF_BF16 || m->wopt == LOOM_WF_BF16P;
}

int loom_model_set_compute_bf16(loom_model *m, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    const loom_backend *be = m->be;
    if (m->wopt == LOOM_WF_BF16P) return 0;
    if (model_infer_weights_check(m, "--compute bf16", err)) return -1;
    if (!be->dotbf16_pack || !be->dotbf16_pack_elems || !be->dotbf16_unpack_row ||
        !be->dotbf16_act_elems || !be->bf16_round || !be->matmul_dotbf16_forward)
        return loom_errf(err, "--compute bf16: the %s backend has no bf16 x bf16 matmul",
                         be->name);
    const int L = c->n_layer, C = c->d_model, V = c->vocab_size;
    const int oc[4] = {m->QKV, C, m->FFI, C}, ic[4] = {C, m->H * m->D, C, m->F};
    size_t total = (size_t)be->dotbf16_pack_elems(V, C);
    for (int k = 0; k < 4; k++)
        total += (size_t)L * (((size_t)be->dotbf16_pack_elems(oc[k], ic[k]) + 31) & ~(size_t)31);
    /* every element is written (dotbf16_pack fills its padding) */
    uint16_t *arena = be->mem_alloc(total * sizeof(uint16_t), LOOM_MEM_STREAMED);
    model_wmat *mats = loom_calloc((size_t)L * 4 + 1, sizeof *mats);
    const int from_bf16 = m->wmat != NULL; /* --weights bf16 already: repack those */
    size_t at = 0;
    for (int l = 0; l < L; l++) {
        const float *w[4] = LINEAR_WS(m, l);
        for (int k = 0; k < 4; k++) {
            const void *src = from_bf16 ? m->wmat[4 * l + k].w : (const void *)w[k];
            LOOM_CHECK(src != NULL);
            be->dotbf16_pack(arena + at, src, from_bf16, oc[k], ic[k]);
            if (!from_bf16) be->mem_release((void *)w[k], (size_t)oc[k] * ic[k] * sizeof(float));
            mats[4 * l + k] = (model_wmat){LOOM_WF_BF16P, arena + at, NULL};
            at += ((size_t)be->dotbf16_pack_elems(oc[k], ic[k]) + 31) & ~(size_t)31;
        }
    }
    const float *hw = HEAD_W(m);
    LOOM_CHECK(hw != NULL);
    be->dotbf16_pack(arena + at, from_bf16 ? m->wmat[4 * L].w : (const void *)hw, from_bf16, V,
                     C);
    if (!from_bf16) be->mem_release((void *)hw, (size_t)V * C * sizeof(float));
    mats[4 * L] = (model_wmat){LOOM_WF_BF16P, arena + at, NULL};
    be->mem_free(m->warena);
    free(m->wmat);
    m->wmat = mats;
    m->warena = arena;
    m->warena_bytes = total * sizeof(uint16_t);
    m->wopt = LOOM_WF_BF16P;
    return 0;
}

int loom_model_compute_bf16(const loom_model *m) { return m->wopt == LOOM_WF_BF16P; }
