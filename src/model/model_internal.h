/* Private to src/model: the model's state (arenas, tensor table, unit hooks, activations)
 * and the typed parameter views, shared by training (model.c) and decoding (decode.c). */
#ifndef LOOM_MODEL_INTERNAL_H
#define LOOM_MODEL_INTERNAL_H

#include <math.h>

#include "loom/model.h"

/* ---- the block's activation slots (src/model/block.c) ------------------------------------
 * The transformer block is one list of ops over these named slots; forward, backward,
 * recompute and decode all walk it. S_X is the residual stream entering the layer (the
 * previous layer's S_RES3, or the embedding output). */
enum {
    S_X, S_LN1, S_LN1_MEAN, S_LN1_RSTD, S_QKV, S_ATT, S_ATTY, S_RES2, S_LN2, S_LN2_MEAN,
    S_LN2_RSTD, S_FCH, S_FCH_ACT, S_RES3,
    /* sequence parallelism: the whole rows of LN1 / LN2 gathered for the column-parallel
     * linears, and the row-parallel linears' whole partial outputs before their reduce-scatter
     * (one scratch each, not kept per layer); without it they are S_LN1, S_LN2, S_RES2, S_RES3 */
    S_LN1G, S_LN2G, S_RES2P, S_RES3P,
    /* arch.qk_norm: the linear's q|k|v rows before the q/k norms (training arenas; elsewhere
     * S_QKV itself, normed in place) and the norms' rstd (N, H + KVH); without q/k norms
     * S_QKVR is S_QKV */
    S_QKVR, S_QKN_RSTD,
    /* arch.norm_place post / sandwich: the attention's and the feed-forward's outputs before
     * their post-norms (after ROW_OUT: the shard under sequence parallelism) and the post-norms'
     * rstd; with pre-norms only S_ATTO is S_RES2 and S_FFO is S_RES3 */
    S_ATTO, S_FFO, S_PN1_RSTD, S_PN2_RSTD,
    /* MoE layers (src/model/moe.c; sized 0 in a dense model): router probabilities (N,E), their
     * log-sum-exp (N), the routing (int32: N*k experts, N*k rows, -1 = dropped), the rows of this
     * view's experts, expert-major (X, H = first matmul, A = activation, Y = output), the outputs
     * back in the sender's order (YB, expert parallelism only), the shared experts' H and A
     * (S,N,.) and output (N,C; with model.moe.shared_gate each one's, (S,N,C), and its gate
     * values (S,N)), and the exchange's counts (int32) */
    S_MOE_PROB, S_MOE_LSE, S_MOE_ROUTE, S_MOE_X, S_MOE_H, S_MOE_A, S_MOE_Y, S_MOE_YB, S_MOE_SH_H,
    S_MOE_SH_A, S_MOE_SH_Y, S_MOE_META, S_MOE_SH_G,
    S_COUNT
};

/* An activation arena: what one micro-batch's forward keeps (per layer of the stage, stacked)
 * for its backward, the head's activations, and the backward's scratch. */
struct loom_acts {
    int maxB, maxT;
    int stacked;          /* 1: every layer's slots kept (training); 0: one set reused by
                           * every layer, no backward scratch (inference) */
    int nl;               /* the stage's layers */
    float *mem;           /* one allocation */
    size_t floats;
    float *slot[S_COUNT]; /* layer l0's slot (S_X unused: it is the previous S_RES3) */
    int64_t stride[S_COUNT]; /* floats from one layer's slot to the next (0 unstacked); a
                              * slot's elements are m->slot_dt's: bf16 slots hold uint16_t */
    float *encoded;       /* (B,T,C) embedding output = residual stream into the first layer
                           * (bf16 elements with training.precision bf16) */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C) (bf16 with bf16 precision), (B,T), (B,T) */
    float *fws;           /* bf16 precision: flash attention's fp32 workspace (else NULL) */
    float *rowp;          /* bf16 precision with tp > 1: (B*T, C) fp32 partial sums of the
                           * row-parallel linears and the vocab-parallel embedding, reduced in
                           * fp32 before they are rounded into their bf16 slot */
    uint16_t *dout16;     /* bf16 precision, training arenas: the linears' and the head's bf16
                           * dout (rows x their widest output) */
    float *x32;           /* bf16 precision: fp32 scratch for rows widened explicitly (the q/k
                           * norms' q|k|v rows, the scaled embedding rows); NULL when none */
    float *logits;        /* (B,T,V) or (B,K); dlogits after backward */
    float *losses;        /* (B,T) */
    float *pooled, *dpooled; /* (B,C) classify */
    uint16_t *pooled16;   /* (B,C) classify in bf16: the fp32 mean rounded, the head GEMM's input */
    float *vmax, *vsums;  /* (B,T), (B,T,2) vocab-parallel cross-entropy (tp > 1, LM head) */
    /* sequence parallelism: whole-row scratch (B*T, C) (without it the shard buffers): the
     * gathered rows, the row-parallel partial sums, the final norm's gathered output (kept for
     * the head's backward), and the whole rows' gradients. With training.precision bf16 the
     * gathered rows and lnf_full hold bf16, the partial sums are rowp's, and sp_partial is
     * their reduce-scattered fp32 shard (B*T/tp, C) before it is rounded into the stream */
    float *sp_gather, *sp_partial, *lnf_full, *dres_full, *dln_full;
    /* backward scratch (stacked only): gradients of the slots */
    float *dres;          /* (B,T,C) the residual stream's (S_X, S_RES2, S_RES3) */
    float *dln;           /* (B,T,C) S_LN1, S_LN2 */
    float *dqkv, *datty, *dfch, *dfch_act; /* S_QKV, S_ATTY, S_FCH, S_FCH_ACT */
    float *dqkvr;         /* S_QKVR (q/k norms; else dqkv) */
    float *dpost;         /* (B,T,C) S_ATTO, S_FFO (post-norms; else the stream's dres) */
    float *datt;          /* (B,H,T,T) attention backward scratch */
    float *moe_g[S_COUNT];/* MoE backward scratch: gradients of the S_MOE_* slots */
    float *moe_t0, *moe_t1; /* MoE exchange buffers (expert parallelism) */
    int32_t *inputs;      /* (B,T) copy of the last forward's inputs */
    int32_t *targets;     /* (B,T) */
    int B, T;             /* shape of the last forward */
    int has_targets;
    int64_t valid;
    /* model.loss_chunk in a training arena (LM head): logits holds chunk rows only */
    int64_t chunk;        /* 0: the whole (B,T,V) logits */
    /* model.doc_mask (loom_model_set_docs): arrays of maxB*maxT, NULL without doc_mask */
    int32_t *docs;        /* (B,T) run ids of the documents, restarting at 0 per row */
    int32_t *run_row;     /* first row (b*T + t) of each document run */
    int32_t *run_len;     /* its length */
    int32_t *run_pos;     /* the position of its first row (0, or with context parallelism
                           * where the row sits in a document begun in an earlier chunk) */
    int32_t *gdocs;       /* context parallelism: (B, cp*T) ids of the whole sequences */
    int gdocs_cp;         /* its cp */
    int n_runs;           /* 0: no documents set (one per row) */
    int docs_B, docs_T;   /* the shape they were set for */
    /* memory through the backend (docs/engine.md): mem, inputs, targets, docs and gdocs are
     * device buffers of the model's backend; run_row, run_len, run_pos stay on the host (the
     * host walks them to issue per-run ops). What the host computes of them first: */
    const struct loom_backend *be; /* the backend the arena was allocated with */
    int32_t *h_targets;   /* (B,T) host copy of the targets (token log-probs' ignored rows) */
    float *loss_w;        /* (B,T) device: the weighted backward's per-token weights */
    int32_t *h_docs;      /* (B,T) and (B, cp*T) host staging of docs / gdocs */
    int32_t *h_gdocs;
    double *scalars;      /* (8) device: the step's scalars (the loss sum) */
};

/* One walk of the block: the slots' buffers for this layer, their gradients (backward), the
 * rows, and for decoding the layer's KV cache. */
typedef struct block_frame {
    float *s[S_COUNT];
    float *g[S_COUNT];
    int B, T, pos0;
    float *kcache, *vcache; /* decode: this layer's (slots, KVH*D) caches, else NULL */
    int kcap;               /* decode: the positions the cache has room for (its slots:
                             * loom_model_kv_slots(m, layer, kcap)) */
    float *scores;          /* decode scratch (H * maxT) */
    float *datt;            /* backward scratch (B,H,T,T) */
    float *moe_t0, *moe_t1; /* MoE exchange buffers (expert parallelism) */
    int train;              /* a training arena: MoE capacity applies, routing stats counted */
    int recompute;          /* a recompute: routing stats are not counted again */
    float dscale;           /* backward: the loss scale (the MoE router losses use it) */
    /* ragged decode (the batched inference engine, src/infer/engine.c): the B*T rows are nseg
     * segments of different sequences, each at its own positions with its own KV cache; NULL
     * otherwise. Rope and attention then work per segment (kcache/vcache/pos0 unused). */
    const struct block_seg *seg;
    int nseg;
    /* documents (model.doc_mask): (B,T) run ids and the runs, NULL / 0 when none */
    const int32_t *docs, *run_row, *run_len, *run_pos;
    const int32_t *gdocs;   /* context parallelism: the whole sequences' ids (B, cp*T) */
    int n_runs;
    /* --compute bf16: scratch for a linear's input rows rounded to bf16 (the backend's
     * activation layout for the rows and the widest input); set by the batched decode */
    uint16_t *xbf16;
    /* --weights int8: scratch for a linear's input rows quantized to Q8_0 (values for the
     * rows and the widest input, and their scales); set by the batched decode */
    int8_t *xq8;
    uint16_t *xq8d;
    /* --weights int4: the same rows' Q4_K-side scales (one per 256) and sub-block sums (one
     * per 32) for the Q4_K linears, the values in xq8 */
    float *xq4d;
    int16_t *xq4s;
    /* training.precision bf16: the flash attention's fp32 workspace (bf16_flash_ws_floats)
     * and, in a training arena, the linears' bf16 dout scratch (rows x the widest output) */
    float *fws;
    uint16_t *dout16;
    float *rowp;            /* bf16 with tp > 1: the row-parallel partial sums (fp32) */
    float *rowps;           /* bf16 with sequence parallelism: their reduce-scattered fp32
                             * shard (loom_acts sp_partial), else NULL */
    float *x32;             /* bf16: the q/k norms' fp32 q|k|v rows (loom_acts x32) */
} block_frame;

/* One segment of a ragged frame: rows [row0, row0 + n) hold positions [pos0, pos0 + n) of a
 * sequence whose caches for layer l are k + l * layer_stride and v + l * layer_stride, each
 * (positions, KVH*D) with room for pos0 + n positions. The attention op appends the rows'
 * keys and values there, then row i attends to positions [0, pos0 + i] (causal). */
typedef struct block_seg {
    float *k, *v;   /* the sequence's caches of cap positions (model_kv_layer_off) */
    int cap;
    int row0, n, pos0;
} block_seg;

/* The KV cache layout (decode.c, decode_batch.c, the engine): one of K, V of a sequence with
 * room for cap positions is every layer's rows one after the other, layer l's
 * loom_model_kv_slots(m, l, cap) rows of KVH*D floats at this offset (floats). */
size_t model_kv_layer_off(const loom_model *m, int l, int cap);

/* the floats of an activation arena for B x T (stacked or not) */
size_t acts_floats(const loom_model *m, int B, int T, int stacked);
/* layer l's slots (and gradient slots when the arena is stacked) of an arena */
void acts_frame(const loom_model *m, const struct loom_acts *a, int l, int B, int T, block_frame *f);
void block_forward(loom_model *m, block_frame *f, int layer);
void block_backward(loom_model *m, block_frame *f, int layer);
/* the MoE op (src/model/moe.c): floats of MoE slot k at N rows, the exchange buffers' and the
 * backward scratch's floats, and the op's forward (LN2 rows -> RES3) and backward */
int64_t moe_slot_floats(const loom_model *m, int k, int64_t N);
int64_t moe_exchange_floats(const loom_model *m, int64_t N);
int64_t moe_grad_floats(const loom_model *m, int k, int64_t N);
void moe_forward(loom_model *m, block_frame *f, int l, int in, int out);
void moe_backward(loom_model *m, block_frame *f, int l, int in, int out);
/* creates / frees the model's MoE state (stats); called by create / free */
/* elements of the bf16 dout scratch the MoE op's linears need at N rows (0 dense) */
int64_t moe_dout16_elems(const loom_model *m, int64_t N);
void moe_init(loom_model *m);
void moe_free(loom_model *m);
/* The block's linear (block.c), for its dense linears and the MoE op's (experts, router,
 * shared gates): out (N,OC) = in (N,IC) W^T + b, W the i-th (OC,IC) matrix of layer l's tensor
 * wk, b the i-th OC of tensor bk (-1 or absent: none), in the model's precision: fp32 slots
 * and weights, or with training.precision bf16 bf16 input rows and weight copies, the output
 * bf16 (out_f32 = 0) or fp32 (out_f32 = 1: the router's logits, the shared gates' and the
 * row-parallel partial sums). Backward: din (fp32) overwritten (din_set) or accumulated,
 * the weight and bias gradients accumulated (none with no_wgrad); bf16 uses f->dout16. */
void model_linear_forward(loom_model *m, const block_frame *f, int l, int wk, int bk, int64_t i,
                          void *out, const void *in, int64_t N, int IC, int OC, int out_f32);
void model_linear_backward(loom_model *m, const block_frame *f, int l, int wk, int bk,
                           int64_t i, float *din, int din_set, int no_wgrad, const float *dout,
                           const void *in, int64_t N, int IC, int OC);
/* out (N,OC) = in (N,IC) W^T + b (b NULL: none) for a stored matrix w (model_wmat, below) of
 * any format: the one place that picks a matmul from the weight's format and the input's
 * dtype. in_dt LOOM_DT_BF16 (training.precision bf16) takes a bf16 matrix, the output bf16
 * (out_f32 = 0) or fp32; fp32 rows (LOOM_DT_F32) take every format, the output fp32: the
 * inference formats first round (bf16 packed) or quantize (Q8_0, Q4_K) the rows into f's
 * scratch (xbf16; xq8 and xq8d; xq8, xq4d and xq4s). */
struct model_wmat;
void model_wmat_forward(const loom_model *m, const block_frame *f, const struct model_wmat *w,
                        void *out, const void *in, int in_dt, const float *b, int64_t N, int IC,
                        int OC, int out_f32);
/* row r of a stored (OC, IC) matrix in fp32 (widened or dequantized: exactly the value the
 * matmuls multiply by, as fp32) into dst (IC floats of device memory): the tied head's
 * embedding rows */
void model_wmat_row(const loom_model *m, const struct model_wmat *w, float *dst, int OC, int IC,
                    int r);
/* What model.recompute drops, recomputed for one layer before its backward: full = the whole
 * forward again, selective = the norms, the activation and attention. */
void block_recompute(loom_model *m, block_frame *f, int layer);

/* LoRA (lora.c): after a linear's GEMM at `site` (0 q|k|v, 1 attn_proj, 2 fc | gate|up,
 * 3 fc_proj) the adapters of its targets add into out (f's B*T rows of ow floats); backward
 * adds their gradients and their part of din. With adapters attached the base weights are
 * frozen. Adapter dropout (loom_lora_set_dropout) needs f's rows to be B sequences of T.
 * out and in are the block's slots: fp32, or bf16 with training.precision bf16 (din and dout
 * are fp32 gradients either way). */
void lora_linear_forward(loom_model *m, const block_frame *f, int layer, int site, void *out,
                         const void *in, int64_t ow);
void lora_linear_backward(loom_model *m, const block_frame *f, int layer, int site, float *din,
                          const float *dout, const void *in, int64_t ow);

/* ---- stored weight matrices (docs/engine.md "Dtypes") ------------------------------------
 * How a linear's (OC, IC) weight matrix is held: fp32 (the parameter arena), bf16 (uint16_t
 * (OC, IC): training.precision bf16's copy, or --weights bf16's), bf16 in the backend's packed
 * layout for its bf16 x bf16 kernel (dotbf16_pack: --compute bf16), GGUF's Q8_0 (int8 values
 * (OC, IC), then fp16 scales (OC, IC/32): --weights int8) or Q4_K (blocks (OC, IC/256) of 144
 * bytes: --weights int4's linears of input width a multiple of 256). model_wmat_forward picks
 * the matmul from the format and the input rows' dtype; model_wmat_row reads a row back. */
enum { LOOM_WF_F32 = 0, LOOM_WF_BF16, LOOM_WF_BF16P, LOOM_WF_Q8_0, LOOM_WF_Q4_K };
typedef struct model_wmat {
    int fmt;              /* LOOM_WF_* */
    const void *w;        /* the matrix (float, uint16_t, int8_t values or Q4_K blocks) */
    const uint16_t *scales; /* Q8_0's fp16 scales; NULL otherwise */
} model_wmat;

struct loom_model {
    loom_model_config cfg;
    struct loom_lora *lora; /* LoRA adapters (NULL: none); the base weights are then frozen */
    loom_model_layout lay; /* this view (tp = 1 and all layers for the whole model) */
    int maxB, maxT;       /* arena sizes */
    int D;                /* head dim */
    int H, KVH, F;        /* this view's query heads, kv heads, feed-forward width */
    int QKV, FFI;         /* this view's q|k|v width, first MLP matmul width */
    int V0, Vl;           /* this view's vocabulary rows [V0, V0 + Vl) (wte, lm_head, logits) */
    int has_cp;
    loom_comm_points cp;
    int has_attn;         /* an attention hook (context parallelism) is set */
    loom_attn_hook attn;
    loom_tensor_info *info;  /* the tensors present, arena order */
    int n_info;
    int gidx[LOOM_P_COUNT];  /* index into info, -1 when absent */
    int *lidx;               /* (L, LOOM_L_COUNT) index into info, -1 when absent */
    size_t n_params;
    float *params;        /* one arena (NULL when created without own arenas) */
    float *grads;         /* same layout */
    int n_units;          /* L + 2 */
    size_t *unit_off;     /* (U) arena offset of each unit */
    size_t *unit_cnt;     /* (U) floats in each unit */
    const float **pbase;  /* (U) where each unit's parameters are now */
    float **gbase;        /* (U) where each unit's gradients go now */
    int has_hooks;
    loom_model_hooks hooks;
    unsigned char *have_grads; /* (U) grads(u) already asked in this backward */
    int mode;             /* LOOM_MODEL_* */
    struct loom_acts *acts; /* the model's own activation arena (NULL for a layout, and for an
                             * inference model until its first forward) */
    size_t act_floats;    /* its size */
    const struct loom_backend *be; /* the kernels' op table (cfg.backend, or the cpu one) */
    /* mixture of experts: E routed experts, this view's El = e1 - e0 of them, ep = E / El, the
     * view's rank in the expert group, S shared experts; the exchange (expert parallelism) */
    int E, El, ep, ep_rank, S;
    int mF, mFFI;         /* an expert's feed-forward width and first matmul width (whole) */
    int sF, sFFI;         /* the same of a shared expert (model.moe.shared_d_ff) */
    int has_moe_comm;
    loom_moe_comm moe_comm;
    loom_moe_stats moe_stats;
    int *moe_slot;        /* (L) index into moe_stats of an MoE layer, -1 for a dense one */
    int64_t *moe_scr;     /* the MoE op's host scratch, sized at moe_init so that no call
                           * allocates (moe_scratch_words(m)): the plan, exchange counts, and
                           * the counts read back (int32) */
    double *moe_dstats;   /* device: (MoE layers, E + 5) routing statistics (moe_route's) */
    double *moe_hstats;   /* host: their read (loom_model_moe_stats) */
    float *rope_cos;      /* (maxT, D/2) */
    /* inference weights (--weights bf16 | int8 | int4, --compute bf16: weights_bf16.c,
     * weights_q8.c): the option that set them (LOOM_WF_F32: none; LOOM_WF_BF16 --weights bf16,
     * LOOM_WF_BF16P --compute bf16, LOOM_WF_Q8_0 --weights int8, LOOM_WF_Q4_K --weights int4),
     * the stored matrices (NULL: none), 4 per layer by LoRA site (0 q|k|v, 1 attn_proj, 2 fc
     * or gate|up, 3 fc_proj) then the head's, in one streamed arena of the backend's
     * (mem_alloc LOOM_MEM_STREAMED, warena_bytes); their fp32 pages are released */
    int wopt;
    model_wmat *wmat;     /* (L*4 + 1) */
    void *warena;
    size_t warena_bytes;
    float *rope_sin;
    float *h_next;        /* (V) host: loom_model_next_logits' row read back */
    /* training.precision bf16 (block.c, model_forward.c; docs/engine.md "Dtypes"): the bf16
     * copy of the parameter arena (n_params, the arena's offsets; NULL in fp32), which units'
     * copies are stale (refreshed from pbase before the unit's next forward), and the dtype of
     * each activation slot */
    int bf16;
    uint16_t *wb;
    unsigned char *wb_stale;
    const uint16_t **wbase; /* (U) where each unit's bf16 copy is now: wb + unit_off[u], or
                             * the hooks' bf16_buffer (ZeRO 3) */
    unsigned char slot_dt[S_COUNT];
    /* arch.rope_local_theta: the sliding layers' tables (maxT, D/2); NULL: they use the
     * full layers' */
    float *rope_cos_local, *rope_sin_local;
};

/* ---- dtypes (training.precision bf16) ------------------------------------------------------
 * An activation slot's dtype: fp32, bf16 (uint16_t, include/loom/bf16.h) or int32 (MoE's
 * routing and counts); sizes are counted in bytes (each slot padded to 64). Ops read a slot
 * through SLOT_F32 / SLOT_BF16, which check its dtype: a slot of another dtype stops the run
 * at the line that asked (nothing converts silently). */
enum { LOOM_DT_F32 = 0, LOOM_DT_BF16 = 1, LOOM_DT_I32 = 2 };
static inline size_t loom_dt_size(int dt) { return dt == LOOM_DT_BF16 ? 2 : 4; }
/* fills m->slot_dt (block.c): every slot fp32, MoE's ints int32, and with bf16 precision the
 * saved activations bf16 (statistics and lse stay fp32) */
void acts_dtypes(loom_model *m);
/* refreshes unit u's bf16 weight copy when stale (model.c) */
void model_bf16_refresh(loom_model *m, int u);
/* the bf16 copy of a tensor (NULL when absent) */
static inline const uint16_t *bview(const loom_model *m, const loom_tensor_info *t) {
    return t ? m->wbase[t->unit] + (t->offset - m->unit_off[t->unit]) : NULL;
}

/* arch.norm_place: the block has pre-norms (pre, sandwich) / post-norms (post, sandwich) */
static inline int has_pre(const loom_model *m) { return m->cfg.arch.norm_place != LOOM_NORM_POST; }
static inline int has_post(const loom_model *m) { return m->cfg.arch.norm_place != LOOM_NORM_PRE; }
/* whether the head's logits are fp32: always in fp32 precision; in bf16 with a
 * vocab-parallel head (its cross-entropy pieces are fp32) or arch.final_softcap (the capped
 * logits computed in fp32 from the GEMM's fp32 sums, never rounded), else bf16 */
static inline int model_logits_f32(const loom_model *m) {
    return !m->bf16 || m->lay.tp > 1 || m->cfg.arch.final_softcap > 0.0f ||
           m->cfg.head == LOOM_HEAD_CLASSIFY; /* (the classify head's (B,K) logits: fp32) */
}
/* typed views: global tensors by LOOM_P_*, layer tensors by LOOM_L_*; NULL when absent */
static inline const float *pview(const loom_model *m, const loom_tensor_info *t) {
    return t ? m->pbase[t->unit] + (t->offset - m->unit_off[t->unit]) : NULL;
}
static inline float *gview(const loom_model *m, const loom_tensor_info *t) {
    return t ? m->gbase[t->unit] + (t->offset - m->unit_off[t->unit]) : NULL;
}
#define PARAM(m, id) pview((m), loom_model_global((m), (id)))
#define GRAD(m, id) gview((m), loom_model_global((m), (id)))
#define LP(m, id, l) pview((m), loom_model_layer_tensor((m), (l), (id)))
#define LG(m, id, l) gview((m), loom_model_layer_tensor((m), (l), (id)))
/* The fused operands of the block's GEMMs: q_w, k_w, v_w (q_b, k_b, v_b) are adjacent in the
 * arena, so the view of q_w is the (QKV, C) matrix of all three; gpt2's fc_w or llama's
 * adjacent gate_w, up_w are the (FFI, C) first MLP matrix. Checked at create. */
#define QKV_W(m, l) LP((m), LOOM_L_Q_W, (l))
#define QKV_B(m, l) LP((m), LOOM_L_Q_B, (l))
#define QKV_GW(m, l) LG((m), LOOM_L_Q_W, (l))
#define QKV_GB(m, l) LG((m), LOOM_L_Q_B, (l))
#define FC1_KIND(m) ((m)->cfg.arch.mlp == LOOM_MLP_GELU ? LOOM_L_FC_W : LOOM_L_GATE_W)
/* arch.embed_scale's factor: sqrt(d_model) rounded to float32 (as transformers' Gemma) */
#define EMBED_SCALE(m) ((float)sqrt((double)(m)->cfg.d_model))
/* the tied head reads wte (arch.tied, LM head) */
#define HEAD_W(m) ((m)->cfg.arch.tied ? PARAM((m), LOOM_P_WTE) : PARAM((m), LOOM_P_LM_HEAD))
#define HEAD_G(m) ((m)->cfg.arch.tied ? GRAD((m), LOOM_P_WTE) : GRAD((m), LOOM_P_LM_HEAD))
#define HEAD_T(m) loom_model_global((m), (m)->cfg.arch.tied ? LOOM_P_WTE : LOOM_P_LM_HEAD)

/* arch.c: checks a config's descriptor; RoPE's D/2 inverse frequencies of a descriptor,
 * returning the factor its cos/sin tables are scaled by (yarn; else 1) */
int arch_check(const loom_model_config *c, loom_err *err);
float arch_rope_inv_freq(const loom_arch *a, float theta, int D, float *inv_freq);
#define FC1_W(m, l) LP((m), FC1_KIND(m), (l))
#define FC1_GW(m, l) LG((m), FC1_KIND(m), (l))
/* layer l's four linear weight matrices in the order the inference weight copies hold them
 * (q|k|v, attn_proj, fc or gate|up, fc_proj): --weights bf16 and int8 */
#define LINEAR_WS(m, l) {QKV_W(m, l), LP(m, LOOM_L_ATTN_PROJ_W, l), FC1_W(m, l), LP(m, LOOM_L_FC_PROJ_W, l)}

/* The runs of consecutive positions of a view's T rows per sequence: 1 (rows 0..T-1 at
 * positions 0..) or, with context parallelism, 2 chunks of T/2 rows. start[i] (first row),
 * len[i], pos[i] (its global position); returns the count. */
/* points every unit's parameters where decoding reads them: the model's arenas, or its resident
 * hooks' storage (loom_model_can_decode must hold) */
void model_decode_bind(loom_model *m);
int model_row_runs(const loom_model *m, int T, int start[2], int len[2], int pos[2]);

/* LayerNorm or RMSNorm (arch.norm) of N rows; mean is unused by RMSNorm */
void model_norm_fwd(const loom_model *m, float *out, float *mean, float *rstd, const float *in,
                    const float *w, const float *b, int64_t N);

/* The embedding of B x T tokens at positions pos0.. into x (bwd: its backward from x); with
 * tp > 1 the vocab-parallel kernels (this view's rows of wte, wpe added by tp rank 0). */
void model_embed_rows(loom_model *m, int bwd, float *x, const int32_t *inputs, int B, int T,
                      int pos0);
/* arch.final_softcap on n logits in place (nothing without it) */
void model_softcap(const loom_model *m, float *logits, int64_t n);
/* A point of the vocab-parallel embedding and head (tp > 1 only; nothing without points). */
void model_vocab_point(loom_model *m, int point, int dir, int site, float *buf, int64_t n);
/* inference weights (weights_bf16.c, weights_q8.c): what bf16 / int8 / int4 weights need of
 * the model (what: the option, for the message) */
int model_infer_weights_check(const loom_model *m, const char *what, loom_err *err);

#endif
