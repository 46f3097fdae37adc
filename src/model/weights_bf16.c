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

/* hands the whole pages inside n floats at src back to the kernel */
void model_release_pages(const float *src, size_t n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)src + pg - 1) & ~(pg - 1);
    const uintptr_t b = ((uintptr_t)(src + n)) & ~(pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* rounds n floats at src into dst, then releases src's whole pages */
static void round_release(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = loom_bf16_round(src[i]);
    model_release_pages(src, n);
}

/* n bytes for matrices streamed every step: 2 MiB aligned and asked for as transparent huge
 * pages (madvise, before the first touch; where THP is off it is a plain allocation). A
 * decode step reads all of them once: with 4 KiB pages it spends ~15% of the step on TLB
 * misses and on the prefetchers stopping at every page (gpt2-small, --compute bf16 at 16 rows;
 * --weights bf16 at 1 row, the linears alone: 10.3 -> 8.5 ms). */
void *model_alloc_streamed(size_t n) {
    const size_t huge = (size_t)2 << 20, size = (n + huge - 1) & ~(huge - 1);
    void *p = NULL;
    if (posix_memalign(&p, huge, size ? size : huge) != 0)
        loom_panic(__FILE__, __LINE__, "out of memory allocating %zu bytes", n);
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size ? size : huge, MADV_HUGEPAGE);
#endif
    return p;
}

/* what bf16 weights need of the model (what: the option, for the message) */
int model_infer_weights_check(const loom_model *m, const char *what, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    if (c->head != LOOM_HEAD_LM || m->lay.tp != 1 || !m->lay.has_embedding || !m->lay.has_head ||
        !m->params)
        return loom_errf(err, "%s needs a whole language model (tp = 1)", what);
    if (m->E > 0) return loom_errf(err, "%s does not support MoE layers yet", what);
    if (m->lora) return loom_errf(err, "%s does not support LoRA adapters", what);
    if (m->wq8) return loom_errf(err, "%s cannot run with --weights int8", what);
    return 0;
}

int loom_model_set_weights_bf16(loom_model *m, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    if (m->wbf16) return 0;
    if (model_infer_weights_check(m, "--weights bf16", err)) return -1;
    if (!m->be->matmul_bf16_forward)
        return loom_errf(err, "--weights bf16: the %s backend has no bf16 matmul", m->be->name);
    const int L = c->n_layer, C = c->d_model;
    const size_t sz[4] = {(size_t)m->QKV * C, (size_t)C * m->H * m->D, (size_t)m->FFI * C,
                          (size_t)C * m->F};
    const size_t head = (size_t)c->vocab_size * C;
    size_t total = head;
    for (int k = 0; k < 4; k++) total += (size_t)L * ((sz[k] + 31) & ~(size_t)31);
    uint16_t *arena = model_alloc_streamed(total * sizeof(uint16_t));
    memset(arena, 0, total * sizeof(uint16_t)); /* the gaps between matrices too */
    m->wbf16_lin = loom_calloc((size_t)L * 4, sizeof *m->wbf16_lin);
    size_t at = 0;
    for (int l = 0; l < L; l++) {
        const float *w[4] = LINEAR_WS(m, l);
        for (int k = 0; k < 4; k++) {
            LOOM_CHECK(w[k] != NULL);
            round_release(arena + at, w[k], sz[k]);
            m->wbf16_lin[4 * l + k] = arena + at;
            at += (sz[k] + 31) & ~(size_t)31;
        }
    }
    const float *hw = HEAD_W(m);
    LOOM_CHECK(hw != NULL);
    round_release(arena + at, hw, head);
    m->wbf16_head = arena + at;
    m->wbf16 = arena;
    m->wbf16_bytes = total * sizeof(uint16_t);
    return 0;
}

int loom_model_weights_bf16(const loom_model *m) { return m->wbf16 != NULL; }

int loom_model_set_compute_bf16(loom_model *m, loom_err *err) {
    const loom_model_config *c = &m->cfg;
    const loom_backend *be = m->be;
    if (m->cbf16) return 0;
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
    uint16_t *arena = model_alloc_streamed(total * sizeof(uint16_t)); /* every element is written */
    const uint16_t **lin = loom_calloc((size_t)L * 4, sizeof *lin);
    const int from_bf16 = m->wbf16 != NULL; /* --weights bf16 already: repack those */
    size_t at = 0;
    for (int l = 0; l < L; l++) {
        const float *w[4] = LINEAR_WS(m, l);
        for (int k = 0; k < 4; k++) {
            const void *src = from_bf16 ? (const void *)m->wbf16_lin[4 * l + k] : (const void *)w[k];
            LOOM_CHECK(src != NULL);
            be->dotbf16_pack(arena + at, src, from_bf16, oc[k], ic[k]);
            if (!from_bf16) model_release_pages(w[k], (size_t)oc[k] * ic[k]);
            lin[4 * l + k] = arena + at;
            at += ((size_t)be->dotbf16_pack_elems(oc[k], ic[k]) + 31) & ~(size_t)31;
        }
    }
    const float *hw = HEAD_W(m);
    LOOM_CHECK(hw != NULL);
    be->dotbf16_pack(arena + at, from_bf16 ? (const void *)m->wbf16_head : (const void *)hw,
                     from_bf16, V, C);
    if (!from_bf16) model_release_pages(hw, (size_t)V * C);
    free(m->wbf16);
    free(m->wbf16_lin);
    m->wbf16 = arena;
    m->wbf16_lin = lin;
    m->wbf16_head = arena + at;
    m->wbf16_bytes = total * sizeof(uint16_t);
    m->cbf16 = 1;
    return 0;
}

int loom_model_compute_bf16(const loom_model *m) { return m->cbf16; }
