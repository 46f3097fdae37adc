/* loom model: one configurable decoder whose block reads an architecture descriptor
 * (loom_arch, docs/architectures.md): the norm, positions, MLP, biases, q/k norms, RoPE
 * variant, head width and tied head are features, never a family name. The named
 * descriptors (src/model/arch.c) include:
 *
 * gpt2: LayerNorm (with bias), learned positions (wpe), GELU (tanh), biases on every linear,
 * tied embeddings (the LM head is wte).
 * llama: RMSNorm, RoPE (rotate-half), SwiGLU, grouped-query attention, no biases, untied LM
 * head.
 *
 * Parameters, gradients and activations each live in one arena; loom_model_tensor() gives
 * the typed views. */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "loom/base.h"

/* flavor: GPT2 and LLAMA name the built-in descriptors (the config is then read only up to
 * `recompute`, the layout before descriptors existed); ARCH: the descriptor is cfg.arch. */
typedef enum loom_flavor { LOOM_FLAVOR_GPT2 = 0, LOOM_FLAVOR_LLAMA = 1, LOOM_FLAVOR_ARCH = 2 }
    loom_flavor;

enum { LOOM_NORM_LAYER = 0, LOOM_NORM_RMS = 1 };        /* LayerNorm has a bias */
enum { LOOM_POS_LEARNED = 0, LOOM_POS_ROPE = 1 };       /* wpe, or rotate-half RoPE */
enum { LOOM_MLP_GELU = 0, LOOM_MLP_SWIGLU = 1, LOOM_MLP_GEGLU = 2 };
                                                        /* fc -> GELU(tanh) -> fc_proj, or
                                                         * silu(gate) * up -> fc_proj, or
                                                         * gelu_tanh(gate) * up -> fc_proj */
enum { LOOM_QK_NORM_NONE = 0, LOOM_QK_NORM_HEAD = 1, LOOM_QK_NORM_WHOLE = 2 };
                                                        /* RMSNorm of each q and k head over
                                                         * its D floats, or of the whole q
                                                         * (H*D) and k (KVH*D), before RoPE */
/* where the block's norms sit: pre (x + f(norm(x))), post (x + norm(f(x)), no pre-norms:
 * OLMo 2) or sandwich (x + post_norm(f(pre_norm(x))): Gemma 2/3) */
enum { LOOM_NORM_PRE = 0, LOOM_NORM_POST = 1, LOOM_NORM_SANDWICH = 2 };
/* RoPE's inverse frequencies (Hugging Face's rope_type): default theta^(-2i/D); linear
 * divides them by factor; llama3 divides the low frequencies by factor and blends the middle
 * band (low_freq_factor, high_freq_factor, original_max); yarn blends interpolation and
 * extrapolation over [beta_slow, beta_fast] rotations and scales cos/sin by attn_factor. */
enum { LOOM_ROPE_DEFAULT = 0, LOOM_ROPE_LINEAR = 1, LOOM_ROPE_LLAMA3 = 2, LOOM_ROPE_YARN = 3 };

typedef struct loom_arch {
    char name[16];     /* the named descriptor it starts from ("gpt2", "llama", "qwen2", ...) */
    int norm;          /* LOOM_NORM_* */
    int pos;           /* LOOM_POS_* */
    int mlp;           /* LOOM_MLP_* */
    int qkv_bias;      /* biases on q, k and v */
    int o_bias;        /* a bias on the attention output projection */
    int mlp_bias;      /* biases on the MLP's linears */
    int tied;          /* the LM head is wte */
    int head_dim;      /* D; 0: d_model / n_head */
    int qk_norm;       /* LOOM_QK_NORM_* (weights q_norm_w, k_norm_w: (D) each per head,
                        * (H*D) and (KVH*D) whole) */
    int rope_type;     /* LOOM_ROPE_* */
    float rope_factor, rope_low_freq, rope_high_freq; /* linear, llama3, yarn */
    float rope_beta_fast, rope_beta_slow, rope_attn_factor; /* yarn (attn_factor 0: HF's) */
    int rope_orig_max; /* llama3, yarn: the original context length */
    int moe_renorm;    /* MoE: a token's top-k gate weights divided by their sum (Mixtral,
                        * norm_topk_prob); 0: the router's softmax probabilities */
    /* sliding-window attention: a sliding layer's query at position q sees the keys at
     * q - sliding_window < k <= q. Layers l >= window_start slide; with window_period p > 1
     * only p - 1 of every p of them, the last of each period attending fully (Mistral: every
     * layer; Qwen 2: from max_window_layers on; Gemma 2: p = 2; Gemma 3: p = 6).
     * sliding_window 0 = none */
    int sliding_window, window_start, window_period;
    float rope_local_theta;  /* sliding layers' RoPE base (default RoPE, no scaling); 0: the
                              * full layers' (model.rope_theta and rope_type) */
    float attn_softcap;      /* scores = cap * tanh(scores / cap) before the softmax; 0: none */
    float query_pre_attn_scalar; /* the scores' scale is its ^-0.5; 0: head_dim^-0.5 */
    char family[32];   /* the Hugging Face architecture it exports as ("" = its descriptor's;
                        * computes nothing) */
    int norm_place;    /* LOOM_NORM_PRE / POST / SANDWICH (post-norm weights attn_post_w,
                        * ffn_post_w) */
    int norm_offset;   /* Hugging Face's norm weights are w for a norm multiplying by 1 + w
                        * (Gemma): loom stores 1 + w, import and export convert; computes
                        * nothing */
    int embed_scale;   /* the token embeddings times sqrt(d_model) rounded to float32 (Gemma;
                        * not the tied head) */
    float final_softcap; /* > 0: logits = cap * tanh(logits / cap) (Gemma 2's
                          * final_logit_softcapping); 0: none */
} loom_arch;

typedef struct loom_model_config {
    int flavor;        /* loom_flavor: a built-in descriptor, or ARCH (the descriptor below) */
    int vocab_size;    /* V */
    int max_seq_len;   /* maxT: position limit */
    int n_layer;       /* L */
    int n_head;        /* H */
    int n_kv_head;     /* KVH (GPT-2: = H) */
    int d_model;       /* C */
    int d_ff;          /* F */
    float norm_eps;
    float rope_theta;
    float init_std;
    int head;          /* loom_head: LOOM_HEAD_LM or LOOM_HEAD_CLASSIFY */
    int num_classes;   /* K, for the classification head */
    int attention;     /* loom_attention: LOOM_ATTN_FLASH (0, the default) or LOOM_ATTN_SDPA */
    /* the kernels' op table (include/loom/backend.h), chosen at create and called for every
     * kernel of the model, decoding and the optimizer; NULL = loom_backend_cpu(). The config
     * key model.backend names it (cpu). */
    const struct loom_backend *backend;
    /* mixture of experts (docs/moe.md): n_expert = 0 is a dense model. Layer l has an MoE
     * feed-forward when (l + 1) % moe_every == 0: a softmax router over n_expert experts (each a
     * feed-forward of width d_ff), top_k of them per token, plus shared_experts experts every
     * token goes through. Capacity per expert and routing group of group_tokens tokens (0: one
     * sequence, T) is floor(capacity_factor * top_k * group / n_expert); capacity_factor 0 is
     * dropless. aux_loss_coef: Switch load-balancing loss, z_loss_coef: router z-loss. */
    int n_expert;
    int top_k;
    int moe_every;
    int shared_experts;
    int group_tokens;
    float capacity_factor;
    float aux_loss_coef;
    float z_loss_coef;
    /* long context (docs/long-context.md): */
    int doc_mask;      /* 1: a batch's document ids (loom_model_set_docs) keep attention inside
                        * each document and restart positions (RoPE, learned) per document */
    int loss_chunk;    /* > 0: the LM head's logits, softmax, loss and gradients in chunks of
                        * this many rows (tokens) in training arenas: no (B,T,V) logits */
    int recompute;     /* loom_recompute: what backward recomputes instead of keeping */
    /* the architecture (flavor LOOM_FLAVOR_ARCH; with GPT2 / LLAMA it is not read and the
     * model uses the built-in descriptor). loom_model_get_config's always holds the one used. */
    loom_arch arch;
    /* MoE shared experts (after arch: the struct's older prefix stays as it was): their width
     * (0: d_ff; Qwen2-MoE's shared_expert_intermediate_size) and, with shared_gate, a sigmoid
     * gate per shared expert and token, sigmoid(x . moe_shared_gate_w[s]) (Qwen2-MoE) */
    int shared_d_ff;
    int shared_gate;
} loom_model_config;

/* The built-in descriptor called name (gpt2, llama, qwen2, qwen3, ...), or NULL. */
const loom_arch *loom_arch_named(const char *name);
/* The names of the built-in descriptors, ", "-separated (for messages). */
const char *loom_arch_names(void);
/* The descriptor a config uses: its built-in one, or &c->arch for LOOM_FLAVOR_ARCH. */
const loom_arch *loom_config_arch(const loom_model_config *c);
/* The head width D of a config. */
int loom_config_head_dim(const loom_model_config *c);
/* The sliding window of layer l (arch.sliding_window when the layer slides), 0 when the layer
 * attends to every earlier position. */
int loom_config_layer_window(const loom_model_config *c, int l);

/* Activation checkpointing: NONE keeps every layer's activations; FULL keeps only the
 * residual stream entering each layer and re-runs the block's forward in backward; SELECTIVE
 * keeps the matmul outputs (q|k|v, attn_proj, fc, fc_proj) and recomputes the norms, the
 * activation and attention (its output and lse, or probabilities). */
typedef enum loom_recompute {
    LOOM_RECOMPUTE_NONE = 0,
    LOOM_RECOMPUTE_FULL = 1,
    LOOM_RECOMPUTE_SELECTIVE = 2
} loom_recompute;

/* How the block computes attention: flash (tiled online softmax, keeps the per-row
 * log-sum-exp for backward, O(T) extra memory) or sdpa (the materialized reference: keeps the
 * B x H x T x T probabilities per layer). Same weights, same checkpoints. */
typedef enum loom_attention { LOOM_ATTN_FLASH = 0, LOOM_ATTN_SDPA = 1 } loom_attention;

/* LM: next-token logits (B,T,V), targets (B,T). CLASSIFY: the final hidden states are
 * mean-pooled over the T positions and a linear layer gives class logits (B,K); the
 * "targets" of forward are then one label per sequence (B), < 0 = ignored. */
typedef enum loom_head { LOOM_HEAD_LM = 0, LOOM_HEAD_CLASSIFY = 1 } loom_head;

/* Parameter tensors. The arena is layer-major: the embedding block (wte, wpe), then one
 * contiguous block per layer (layers.<l>.<name>), then the final block (lnf_w, lnf_b,
 * lm_head). A layer's parameters (and gradients) are one contiguous range, which is what
 * per-layer sharding, gathering and pipeline stages need. Absent tensors (per flavor) are
 * not in the table. */
enum {  /* global tensors */
    LOOM_P_WTE,         /* (V, C) */
    LOOM_P_WPE,         /* (maxT, C)               gpt2 */
    LOOM_P_LNF_W,       /* (C) */
    LOOM_P_LNF_B,       /* (C)                     gpt2 */
    LOOM_P_LM_HEAD,     /* (V, C)                  llama (untied), lm head */
    LOOM_P_CLS_W,       /* (K, C)                  classify head */
    LOOM_P_CLS_B,       /* (K)                     classify head */
    LOOM_P_COUNT
};
enum {  /* per-layer tensors, named layers.<l>.<name> */
    LOOM_L_LN1_W,       /* (C) */
    LOOM_L_LN1_B,       /* (C)                     gpt2 */
    LOOM_L_Q_W,         /* (H*D, C)   query heads */
    LOOM_L_K_W,         /* (KVH*D, C) key heads */
    LOOM_L_V_W,         /* (KVH*D, C) value heads */
    LOOM_L_Q_B,         /* (H*D)                   gpt2 */
    LOOM_L_K_B,         /* (KVH*D)                 gpt2 */
    LOOM_L_V_B,         /* (KVH*D)                 gpt2 */
    LOOM_L_ATTN_PROJ_W, /* (C, H*D)   attention output projection */
    LOOM_L_ATTN_PROJ_B, /* (C)                     gpt2 */
    LOOM_L_LN2_W,       /* (C) */
    LOOM_L_LN2_B,       /* (C)                     gpt2 */
    LOOM_L_FC_W,        /* (F, C)                  gpt2: MLP up projection */
    LOOM_L_GATE_W,      /* (F, C)                  llama: SwiGLU gate */
    LOOM_L_UP_W,        /* (F, C)                  llama: SwiGLU up */
    LOOM_L_FC_B,        /* (F)                     gpt2 */
    LOOM_L_FC_PROJ_W,   /* (C, F)     MLP down projection */
    LOOM_L_FC_PROJ_B,   /* (C)                     gpt2 */
    /* MoE layers (docs/moe.md) have these instead of fc_w / gate_w, up_w / fc_b / fc_proj_*:
     * the router, the shared experts (S = shared_experts, replicated), then the routed experts
     * (E = n_expert; split over ep by expert, gradients reduced over the expert-data group),
     * the routed experts last in the layer's arena range. FFI = F (gpt2) or 2F (llama: rows
     * [gate | up]); the shared experts' F is model.moe.shared_d_ff (0: F). */
    LOOM_L_MOE_ROUTER_W,    /* (E, C) */
    LOOM_L_MOE_SH_FC_W,     /* (S, FFI, C) */
    LOOM_L_MOE_SH_FC_B,     /* (S, F)                 gpt2 */
    LOOM_L_MOE_SH_PROJ_W,   /* (S, C, F) */
    LOOM_L_MOE_SH_PROJ_B,   /* (S, C)                 gpt2 */
    LOOM_L_MOE_FC_W,        /* (E, FFI, C) */
    LOOM_L_MOE_FC_B,        /* (E, F)                 gpt2 */
    LOOM_L_MOE_PROJ_W,      /* (E, C, F) */
    LOOM_L_MOE_PROJ_B,      /* (E, C)                 gpt2 */
    /* arch.qk_norm (in the arena after v_b): */
    LOOM_L_Q_NORM_W,        /* (D) the RMSNorm weight of every query head; whole: (H*D) */
    LOOM_L_K_NORM_W,        /* (D) of every key head; whole: (KVH*D) */
    LOOM_L_MOE_SH_GATE_W,   /* (S, C) model.moe.shared_gate: the shared experts' gates */
    /* arch.norm_place post / sandwich (in the arena after fc_proj_b): the RMSNorm weights of
     * the attention's and the feed-forward's outputs */
    LOOM_L_ATTN_POST_W,     /* (C) */
    LOOM_L_FFN_POST_W,      /* (C) */
    LOOM_L_COUNT
};
/* Q, K and V (and gate and up) are separate tensors, so a head (column) split of each is one
 * box; the arena keeps them adjacent in that order (q_w, k_w, v_w; q_b, k_b, v_b; gate_w,
 * up_w), so the block runs one GEMM over the three (two) and its activations hold a row as
 * [q | k | v] ([gate | up]). Checkpoints of the fused format (qkv_w/qkv_b rows [q | k | v],
 * llama fc_w rows [gate | up]) are split on load (docs/checkpoints.md). */

/* Mesh groups a tensor's layout names: the group its split dimension is split over, and the
 * group that sums its gradient. */
enum { LOOM_SPLIT_NONE = 0, LOOM_SPLIT_TP = 1, LOOM_SPLIT_EP = 2 };
enum { LOOM_REDUCE_DP = 0, LOOM_REDUCE_EDP = 1 /* expert-data group (routed experts) */ };

/* One parameter tensor: its global shape and layout, and the box of it this model (view)
 * holds. The box is row-major in the arena: numel = product of box_len. */
typedef struct loom_tensor_info {
    char name[48];      /* "wte", "layers.3.q_w", ... */
    int layer;          /* -1 for global tensors */
    int kind;           /* LOOM_P_* for global tensors, LOOM_L_* for per-layer ones */
    size_t offset;      /* in floats, into the parameter (and gradient) arena */
    size_t numel;       /* elements of the box this view holds */
    int ndim;
    int64_t shape[4];   /* the GLOBAL shape */
    int decay;          /* 1 when AdamW weight decay applies (matrices and embeddings) */
    int unit;           /* the unit holding it (see loom_model_num_units) */
    /* In checkpoints written before Q/K/V and gate/up were split (q_w, k_w, v_w, q_b, k_b,
     * v_b; llama gate_w, up_w), this tensor was rows [legacy_row0, legacy_row0 + shape[0]) of
     * the fused tensor legacy_name (qkv_w, qkv_b, fc_w) of global shape legacy_shape; ""
     * otherwise. */
    char legacy_name[48];
    int64_t legacy_row0;
    int legacy_ndim;
    int64_t legacy_shape[2];
    /* layout: dimension split_dim (-1: none, the tensor is replicated) is split evenly over
     * split_group (LOOM_SPLIT_*); reduce_group (LOOM_REDUCE_*) sums its gradient. */
    int split_dim;
    int split_group;
    int reduce_group;
    /* this view's box: elements [box_off[d], box_off[d] + box_len[d]) of each dimension */
    int64_t box_off[4];
    int64_t box_len[4];
    /* tp ranks holding this same box of a tp-split tensor: 1, or tp / n_kv_head for k_w, v_w
     * (k_b, v_b) when n_kv_head < tp (each kv head replicated over that many consecutive tp
     * ranks, whose gradients are partial sums over them) */
    int tp_replicas;
} loom_tensor_info;

/* The flat index in the global tensor of element k (row-major in the box) of t's box. */
int64_t loom_tensor_global_index(const loom_tensor_info *t, int64_t k);

typedef struct loom_model loom_model;

/* ---- views --------------------------------------------------------------------------------
 * A model is created as the view of one rank of a parallel layout (docs/engine.md): with
 * tensor parallelism of degree tp it holds H/tp query heads, KVH/tp key/value heads and F/tp
 * feed-forward columns of every layer (a box of each split tensor), and the rest whole; a
 * pipeline stage holds layers [l0, l1) only. NULL, or every degree 1, is the whole model. */
typedef struct loom_model_layout {
    int tp;            /* tensor-parallel degree (0 or 1: none); must divide n_head, n_kv_head
                        * and d_ff */
    int tp_rank;       /* this view's rank in the tp group, [0, tp) */
    int l0, l1;        /* this pipeline stage's layers [l0, l1); l1 = 0: all layers */
    int e0, e1;        /* routed experts [e0, e1) of an MoE model (0, 0: all of them); the
                        * range must be one of n_expert / (e1 - e0) equal parts (expert
                        * parallelism of degree ep = n_expert / (e1 - e0)) */
    int cp;            /* context-parallel degree (0 or 1: none). With cp > 1 each sequence of
                        * cp * T positions is cut into 2 * cp equal chunks and this view's T
                        * rows are chunk cp_rank then chunk 2 * cp - 1 - cp_rank (causal load
                        * balancing); positions (wpe, RoPE) are the chunks' global ones, and
                        * attention needs the hook of loom_model_set_attention (parallel/cp.c) */
    int cp_rank;       /* this view's rank in the cp group, [0, cp) */
    /* set by create: the stage holds the embedding (l0 = 0) / the head (l1 = n_layer) */
    int has_embedding, has_head;
    int sp;            /* sequence parallelism (tp > 1): the norm / residual regions hold only
                        * rows [r * N / tp, (r + 1) * N / tp) of a micro-batch's N = B * T rows
                        * (tp rank r; tp must divide N); COL_IN and ROW_OUT then change a
                        * buffer's size through loom_comm_points.move. Needs the LM head, dense
                        * layers, one stage and cp = 1. */
    int precision;     /* loom_precision (training.precision): how this view computes; the
                        * parameters are fp32 masters either way */
} loom_model_layout;

/* training.precision (docs/training.md "Precision"): fp32, or bf16 mixed precision: bf16
 * copies of the fp32 masters for the GEMMs (refreshed by the optimizer step), bf16 saved
 * activations, fp32 accumulation, statistics, logits, losses and gradients. */
typedef enum loom_precision { LOOM_PREC_FP32 = 0, LOOM_PREC_BF16 = 1 } loom_precision;

/* Checks the config (divisibility, positive sizes) and the layout, and allocates every arena
 * of the view for batches of up to B x T (T <= max_seq_len). layout NULL: the whole model. */
int loom_model_create(const loom_model_config *cfg, const loom_model_layout *layout, int B,
                      int T, loom_model **out, loom_err *err);
/* bf16 precision: the bf16 copy of the parameter arena (the arena's layout: element i is
 * round(master i)), NULL in fp32. The optimizer writes it with the masters
 * (adamw_update_bf16); whoever else changes the masters calls loom_model_params_changed, and
 * each unit's copy is refreshed before its next forward. */
uint16_t *loom_model_bf16_weights(loom_model *m);
void loom_model_params_changed(loom_model *m);
/* The view's layout (degrees 1 and the whole layer range for the whole model). */
const loom_model_layout *loom_model_get_layout(const loom_model *m);
void loom_model_free(loom_model *m);
const loom_model_config *loom_model_get_config(const loom_model *m);
/* the op table the model calls its kernels through (never NULL) */
const struct loom_backend *loom_model_backend(const loom_model *m);

size_t loom_model_num_params(const loom_model *m);
float *loom_model_params(loom_model *m);  /* the parameter arena */
float *loom_model_grads(loom_model *m);   /* the gradient arena, same layout */
/* the tensors present, in arena order */
int loom_model_num_tensors(const loom_model *m);
const loom_tensor_info *loom_model_tensor(const loom_model *m, int i);
/* a global tensor (LOOM_P_*) or a layer's tensor (LOOM_L_*); NULL when absent */
const loom_tensor_info *loom_model_global(const loom_model *m, int kind);
const loom_tensor_info *loom_model_layer_tensor(const loom_model *m, int layer, int kind);
/* the contiguous arena range [*offset, *offset + *count) of layer l's parameters */
void loom_model_layer_range(const loom_model *m, int l, size_t *offset, size_t *count);
/* bytes held by the model's own parameter and gradient arenas (when it has them) and its
 * activation arena */
size_t loom_model_arena_bytes(const loom_model *m);

/* ---- units ----------------------------------------------------------------------------
 * The arena in contiguous pieces that data parallelism shards, gathers and reduces one at a
 * time: unit 0 = embeddings (wte, wpe), unit 1+l = layer l, unit L+1 = final (lnf_w, lnf_b,
 * lm_head). */
int loom_model_num_units(const loom_model *m);
void loom_model_unit_range(const loom_model *m, int u, size_t *offset, size_t *count);

/* Where the model finds parameters and puts gradients, one unit at a time. With hooks set,
 * forward and backward call acquire_params before reading a unit's parameters and
 * release_params after (phase 0 = forward, 1 = backward; the tied GPT-2 head acquires unit 0
 * a second time); grads(u) gives the buffer (unit count floats, zeroed by the caller) that
 * backward accumulates unit u's gradients into, asked once per backward before the first
 * write; grads_ready(u) says unit u's gradients of this backward are complete (units come
 * ready in the order L+1 (untied head), L, ..., 1, then 0). */
typedef struct loom_model_hooks {
    void *ctx;
    const float *(*acquire_params)(void *ctx, int unit, int phase);
    void (*release_params)(void *ctx, int unit, int phase);
    float *(*grads)(void *ctx, int unit);
    void (*grads_ready)(void *ctx, int unit);
    /* training.precision bf16 with parameters that are gathered, not resident (ZeRO 3):
     * where unit u's bf16 copy lives while it is acquired (unit count uint16_t, the caller's
     * storage), and *fresh = 0 when it already holds round(the acquired masters), 1 when the
     * model must write it (from the fp32 acquire_params returned). NULL: the model keeps a
     * whole bf16 copy of the arena, written by the optimizer step (ZeRO 0-2). Set with it, the
     * model frees that whole copy. */
    uint16_t *(*bf16_buffer)(void *ctx, int unit, int *fresh);
    int resident;   /* 1: acquire_params returns the same storage at every call, with no
                     * communication and no release needed (DP at ZeRO 0-2): decoding
                     * (loom_model_decode, loom_model_decode_batch) may then read the
                     * parameters through the hooks, e.g. rollouts of the model being trained */
} loom_model_hooks;
/* NULL restores the model's own arenas (which must exist). The hooks struct is copied. */
void loom_model_set_hooks(loom_model *m, const loom_model_hooks *h);

/* ---- named communication points ------------------------------------------------------------
 * The block calls out at fixed points so that parallel/ can plug in what a strategy needs
 * there; model/ does no communication itself. At each point, in forward (dir 0) buf holds the
 * activation, in backward (dir 1) its gradient, n floats, and the callback may change them in
 * place (same size). With no comm points set (or fn NULL) nothing happens: a view of degree 1
 * needs none. Tensor parallelism: ROW_OUT forward = all-reduce (sum) of the partial sums,
 * COL_IN backward = all-reduce of the partial input gradient, VOCAB_MAX / VOCAB_SUM forward =
 * all-reduce max / sum, QKNORM_SUM both directions = all-reduce sum, VOCAB_GATHER (decoding) =
 * all-gather, every other point a no-op. */
enum {
    LOOM_CP_STAGE_IN,   /* residual stream (B,T,C) entering the stage's first layer */
    LOOM_CP_ATTN_IN,    /* attention's input, after ln1 (B,T,C) */
    LOOM_CP_COL_IN,     /* before a column-parallel linear (q|k|v; fc or gate|up): its input
                         * (B,T,C); site = LOOM_SITE_ATTN or LOOM_SITE_FFN */
    LOOM_CP_ROW_OUT,    /* after a row-parallel linear (attn_proj; fc_proj): this view's
                         * partial sums (B,T,C) (the bias included by tp rank 0 only) */
    LOOM_CP_ATTN_OUT,   /* attention's output after its projection (B,T,C) */
    LOOM_CP_FFN_IN,     /* the FFN's input, after ln2 (B,T,C) */
    LOOM_CP_FFN_OUT,    /* the FFN's output (B,T,C), before the residual add */
    LOOM_CP_STAGE_OUT,  /* residual stream (B,T,C) leaving the stage's last layer */
    /* vocab-parallel cross-entropy (tp > 1 only: the view holds columns [v0, v0 + V/tp) of the
     * logits), forward only: */
    LOOM_CP_VOCAB_MAX,  /* each row's max over this view's logits (B*T): all-reduce max */
    LOOM_CP_VOCAB_SUM,  /* per row (sum of exp(logit - global max), target logit or 0) over
                         * this view's logits (B*T, 2): all-reduce sum */
    /* decoding (loom_model_decode_batch, tp > 1 only), through loom_comm_points.move: */
    LOOM_CP_VOCAB_GATHER, /* the head's logits of this view's vocabulary rows, padded to
                           * (K, ceil(V/tp)), all-gathered in tp rank order into
                           * (tp, K, ceil(V/tp)) so that every rank samples from the whole
                           * logits (n_out = tp * n_in) */
    LOOM_CP_QKNORM_SUM, /* whole-projection q/k norms (tp > 1 only): per row the view's heads'
                         * partial sums (N, 2) (forward: of squares; backward: of dy*w*xhat):
                         * all-reduce sum, both directions */
    LOOM_CP_COUNT
};
/* Sites. With tp > 1 the embedding and the head are vocab-parallel too: the embedding's output
 * is a partial sum (tokens outside the view's rows give zeros; wpe added by tp rank 0), passed
 * through ROW_OUT with site EMBED; the head is a column-parallel linear over the vocabulary,
 * its input (the final norm's output) passed through COL_IN with site HEAD. */
enum { LOOM_SITE_NONE = 0, LOOM_SITE_ATTN = 1, LOOM_SITE_FFN = 2, LOOM_SITE_EMBED = 3,
       LOOM_SITE_HEAD = 4 };
typedef struct loom_comm_points {
    void *ctx;
    /* layer: the layer (-1 at stage points); site: LOOM_SITE_* */
    void (*fn)(void *ctx, int point, int dir, int layer, int site, float *buf, int64_t n);
    /* Sequence parallelism (layout.sp): COL_IN and ROW_OUT move between a view's row shard
     * (n / tp rows) and the whole rows instead of calling fn. COL_IN forward: in = the shard,
     * out = the whole (all-gather); backward: in = the whole partial gradient, out = the shard
     * (reduce-scatter). ROW_OUT forward: in = the whole partial sums, out = the shard
     * (reduce-scatter); backward: in = the shard's gradient, out = the whole (all-gather).
     * Backward also asks for a COL_IN forward again (the shard re-gathered for the linear's
     * weight gradient). n_in, n_out count elements of elem bytes: 4, fp32 (every move), or 2,
     * bf16 bits (training.precision bf16: the gathers of COL_IN forward, the normed rows, moved
     * and never summed; reduce-scatters always take fp32). */
    void (*move)(void *ctx, int point, int dir, int layer, int site, const void *in,
                 int64_t n_in, void *out, int64_t n_out, size_t elem);
} loom_comm_points;
/* 1 when tensor t's gradient is a partial sum over the tp group that the caller must reduce
 * (sequence parallelism: the norms' weights see only the view's rows; q/k norm weights with
 * tp > 1: each view sees its heads only). */
int loom_model_grad_tp_partial(const loom_model *m, const loom_tensor_info *t);
/* 1 when this tp rank is the one that counts tensor t's box once for the whole tp group (the
 * gradient norm, checkpoint writes): every rank for a box it alone holds, tp rank 0 for a
 * replicated tensor, the first of the tp ranks sharing a replicated kv head's box. */
int loom_model_tp_owner(const loom_model *m, const loom_tensor_info *t);
/* NULL: none. The struct is copied. */
void loom_model_set_comm_points(loom_model *m, const loom_comm_points *cp);

/* ---- mixture of experts: the dispatch / combine exchange (src/model/moe.c) ------------------
 * With expert parallelism (layout e0, e1 a part of the experts) the MoE op sends each routed
 * token's row to the member of the expert group holding its expert and gets the expert's
 * output back. model/ routes (which rows go to which expert, in what order) and runs the
 * experts; the exchange, its plan and the permutation between the exchange's member-major
 * order and the experts' expert-major order are expert parallelism's (src/parallel/ep.c supplies
 * these hooks; model/ does no communication and no dispatch arithmetic itself). Member r of the
 * ep group holds experts [r * El, (r + 1) * El), El = e1 - e0. */

/* One MoE layer's exchange plan. The caller (model/) provides every array; plan() fills sn,
 * rn, roff and rows from cnt and rcnt. */
typedef struct loom_moe_plan {
    int ep, El;            /* the ep group's size, local experts per member */
    const int32_t *cnt;    /* (ep, El) rows this member sends to each expert (all E, in order) */
    const int32_t *rcnt;   /* (ep, El) rows received from each member for each local expert */
    int64_t *sn, *rn;      /* (ep) rows sent to / received from each member */
    int64_t *roff;         /* (El + 1) first expert-major row of each local expert; the rows
                            * of local expert el are those from member 0, then 1, ... */
    int64_t *tmp;          /* (2 ep) scratch: the floats per member of one exchange */
    int64_t rows;          /* rows the local experts run */
} loom_moe_plan;

typedef struct loom_moe_comm {
    void *ctx;
    /* send: ep blocks of `block` counts, block r to member r; recv: ep blocks, block i from
     * member i (an all-to-all of equal blocks; host memory: the counts read back) */
    void (*counts)(void *ctx, const int64_t *send, int64_t *recv, int block);
    /* fills the plan from its counts (arithmetic only, no communication) */
    void (*plan)(void *ctx, loom_moe_plan *pl);
    /* dispatch: rows of row_bytes bytes (fp32 or bf16 rows: the exchange moves bytes) in send
     * (expert-major over all E experts, so member-major: sn[r] rows to member r) go to their
     * experts' members, are received into recv (member-major) and permuted into out
     * (expert-major over the local experts, roff); send, recv, out are device buffers of the
     * model's backend (the plan is host memory) */
    void (*dispatch)(void *ctx, const loom_moe_plan *pl, const void *send, void *recv,
                     void *out, size_t row_bytes);
    /* combine, dispatch's reverse: rows of in (expert-major, roff) are permuted into send
     * (member-major) and go back to their tokens' members, received into out (in the order
     * of dispatch's send) */
    void (*combine)(void *ctx, const loom_moe_plan *pl, const void *in, void *send, void *out,
                    size_t row_bytes);
} loom_moe_comm;
/* NULL: none (a model holding all its experts needs none). The struct is copied. */
void loom_model_set_moe_comm(loom_model *m, const loom_moe_comm *c);
/* 1 when layer l has an MoE feed-forward */
int loom_model_layer_is_moe(const loom_model *m, int l);

/* What the MoE layers' routing did since the last reset (forwards of training arenas, not
 * recomputes), per MoE layer of the view: assignments per expert (before capacity), the
 * assignments dropped by capacity, and the router losses. */
typedef struct loom_moe_stats {
    int n_layers;          /* MoE layers */
    int n_expert;          /* E */
    int *layer;            /* (n_layers) the layer index of each */
    int64_t *load;         /* (n_layers, E) token assignments per expert */
    int64_t *dropped;      /* (n_layers) assignments dropped */
    int64_t *assigned;     /* (n_layers) assignments in all (tokens x top_k) */
    double *aux_sum;       /* (n_layers) sum over routing groups of tokens x balance loss */
    double *z_sum;         /* (n_layers) sum over tokens of the router z-loss */
    double *tokens;        /* (n_layers) tokens routed */
} loom_moe_stats;
/* the model's counters (NULL for a dense model); valid while the model lives */
loom_moe_stats *loom_model_moe_stats(loom_model *m);
void loom_model_moe_stats_reset(loom_model *m);
/* the name of a point ("row_out", ...) */
const char *loom_comm_point_name(int point);

/* ---- the attention hook (context parallelism) ------------------------------------------------
 * With a hook set, the block's flash attention op calls it instead of attending over this
 * view's rows only: parallel/cp.c puts Ulysses (all-to-all to head shards and back) or ring
 * attention (K/V blocks around the cp group, merged by log-sum-exp) there. qkv (B,T,QKV) is
 * this view's rows after RoPE; forward overwrites out (B,T,H*D) and may keep B*H*T floats in
 * lse (its own layout) for backward; backward ACCUMULATES into dqkv (B,T,QKV) from dout
 * (B,T,H*D), given the forward's qkv, out and lse. NULL (or forward NULL): none. The struct is
 * copied. */
typedef struct loom_attn_hook {
    void *ctx;
    /* gdocs: with model.doc_mask (loom_model_set_docs_global), the document ids of the whole
     * sequences (B, cp * T); NULL: no document mask */
    void (*forward)(void *ctx, int layer, float *out, float *lse, const float *qkv, int B, int T,
                    const int32_t *gdocs);
    void (*backward)(void *ctx, int layer, float *dqkv, const float *dout, const float *qkv,
                     const float *out, const float *lse, int B, int T, const int32_t *gdocs);
} loom_attn_hook;
void loom_model_set_attention(loom_model *m, const loom_attn_hook *h);
/* The global position of local row t of a T-row sequence of this view (t with cp = 1). */
int64_t loom_model_row_position(const loom_model *m, int T, int t);

/* What a model allocates of its own (loom_model_create_view's mode). */
enum {
    LOOM_MODEL_NO_ARENAS = 0, /* no parameters or gradients: hooks supply them (training with
                               * data parallelism); a training activation arena */
    LOOM_MODEL_TRAIN = 1,     /* parameters, gradients, a training activation arena */
    LOOM_MODEL_INFER = 2,     /* parameters only: no gradients, no optimizer state, and a
                               * forward-only activation arena allocated at the first forward
                               * (decoding with a KV cache needs none); backward is an error */
    LOOM_MODEL_HOOKS_ONLY = 3,/* as NO_ARENAS, and no activation arena of its own either: the
                               * caller brings arenas (loom_acts_create; a pipeline stage holds
                               * one per micro-batch in flight) and calls the *_acts functions */
};
/* A view (layout NULL: the whole model) with the arenas of `mode` (LOOM_MODEL_*). */
int loom_model_create_view(const loom_model_config *cfg, const loom_model_layout *layout, int B,
                           int T, int mode, loom_model **out, loom_err *err);

/* Like loom_model_create; with own_arenas = 0 no parameter or gradient arena is allocated
 * (loom_model_params/grads return NULL) and hooks must be set before forward. */
int loom_model_create_ex(const loom_model_config *cfg, int B, int T, int own_arenas,
                         loom_model **out, loom_err *err);

/* The model's layout for (cfg, B, T) without any arena: its tensor table, units
 * (loom_model_unit_range) and sizes (loom_model_num_params, loom_model_activation_bytes), to
 * estimate memory before allocating. Forward/backward must not be called on it. */
int loom_model_create_layout(const loom_model_config *cfg, int B, int T, loom_model **out,
                             loom_err *err);
/* The same for one rank's view (layout NULL: the whole model): its boxes, its stage's layers. */
int loom_model_create_layout_view(const loom_model_config *cfg, const loom_model_layout *layout,
                                  int B, int T, loom_model **out, loom_err *err);
/* bytes of the activation arena, the input/target rows and the RoPE tables: what the model
 * allocates beyond parameters and gradients */
size_t loom_model_activation_bytes(const loom_model *m);
/* The floats of one training activation arena of the view (loom_acts_create's arena, without
 * the input/target rows): what loom_model_arena_bytes counts for activations */
size_t loom_model_activation_floats(const loom_model *m);

/* The deterministic init of arena positions [offset, offset + count), written to dst: a shard
 * of any layout, and the box of any view, initializes exactly like the same elements of the
 * whole model (init is keyed by the tensor and the element's global index). */
void loom_model_init_range(const loom_model *m, uint64_t seed, size_t offset, size_t count,
                           float *dst);
/* The parameters are device memory of the model's backend. For host code that must see them
 * whole (Hugging Face import / export, training.init_from): NULL where the backend's memory is
 * host memory (use loom_model_params in place), else a malloc'd host copy (the named read
 * "parameters to host"); loom_model_params_from_host copies such a host array back in. */
float *loom_model_params_to_host(const loom_model *m);
void loom_model_params_from_host(loom_model *m, const float *src);
/* The same into device memory of the model's backend (drawn on the host in chunks, copied in) */
void loom_model_init_device(const loom_model *m, uint64_t seed, size_t offset, size_t count,
                            float *dst);

/* Deterministic init: weights ~ N(0, init_std) keyed by (seed, tensor name, element);
 * residual projections (attn_proj_w, fc_proj_w) scaled by 1/sqrt(2L) in both flavors (GPT-2's
 * scheme, kept for Llama too); norm weights 1; biases 0. */
void loom_model_init_weights(loom_model *m, uint64_t seed);

/* ---- activation arenas -------------------------------------------------------------------
 * What one micro-batch's forward keeps for its backward lives in an activation arena, separate
 * from the model, so a pipeline stage can hold several micro-batches in flight. The model owns
 * one (used by loom_model_forward/backward); more come from loom_acts_create. for_training = 0
 * gives an arena for forward only (one set of slots reused by every layer, no backward
 * scratch): backward must not be called with it. */
typedef struct loom_acts loom_acts;
loom_acts *loom_acts_create(const loom_model *m, int B, int T, int for_training);
void loom_acts_free(loom_acts *a);
size_t loom_acts_bytes(const loom_acts *a);
/* logits of the arena's last forward (valid until its backward) */
const float *loom_acts_logits(const loom_acts *a);
/* Device memory (docs/engine.md): the logits are the backend's; the host reads floats
 * [first, first + n) of them into dst with these (the named read "logits rows") */
void loom_acts_read_logits(const loom_model *m, const loom_acts *a, float *dst, size_t first,
                           size_t n);
void loom_model_read_logits(const loom_model *m, float *dst, size_t first, size_t n);
/* loom_model_forward / loom_model_backward on a given arena (B <= its B, T <= its T) */
float loom_model_forward_acts(loom_model *m, loom_acts *a, const int32_t *inputs,
                              const int32_t *targets, int B, int T);
void loom_model_backward_acts(loom_model *m, loom_acts *a, float dscale);
/* Recomputes layer `layer`'s activations of the arena's last forward from the stream entering
 * it (activation checkpointing walks the same block definition again). */
void loom_model_recompute_layer(loom_model *m, loom_acts *a, int layer);
/* Document ids of the next forwards on arena a (a NULL: the model's own arena): docs (B,T),
 * B and T those of the forward; positions of a row with the same id as the previous one are
 * one document (runs: ids are compared with their neighbour only). Attention stays inside each
 * document and positions (RoPE, learned) restart at 0 where a document starts. docs NULL: one
 * document per row (the default). Needs model.doc_mask. */
void loom_model_set_docs(loom_model *m, loom_acts *a, const int32_t *docs, int B, int T);
/* loom_model_set_docs for a context-parallel view (layout.cp > 1): gdocs (B, cp * T) are the
 * document ids of the B WHOLE sequences, T the rows of the view's forward. The view takes the
 * ids of its two chunks, each document's positions counted from where it starts in the whole
 * sequence (possibly in another rank's chunk), and hands the whole sequences' ids to the
 * attention hook (which masks across ranks with them). gdocs NULL: one document per row. */
void loom_model_set_docs_global(loom_model *m, loom_acts *a, const int32_t *gdocs, int B,
                                int Tg);
/* Overwrites layer `layer`'s kept activations with `value` (what a dropped layer holds before
 * its recompute; tests use it to check that backward reads only recomputed values). */
void loom_acts_poison_layer(const loom_model *m, loom_acts *a, int layer, float value);

/* Forward on inputs (B,T), B <= the B given at create, T <= its T. When targets is not NULL
 * ((B,T) for the LM head, (B) labels for the classify head) returns the mean loss over
 * targets >= 0 (and keeps what backward needs); else returns 0. Logits ((B,T,V), or (B,K)
 * for classify) are kept until backward. */
float loom_model_forward(loom_model *m, const int32_t *inputs, const int32_t *targets, int B,
                         int T);
/* After a forward with targets: grads += d(loss_sum * dscale)/dparams, where loss_sum is
 * the sum of per-token losses (use dscale = 1/valid_tokens for the mean, and divide by the
 * total over all micro-batches when accumulating). Clobbers logits. */
void loom_model_backward(loom_model *m, float dscale);
/* ---- per-token log-probs and weighted losses (preference optimization, docs/finetune.md) --
 * After a forward with targets (LM head): out (B*T) = log p(target_i | prefix) of each
 * position, i.e. minus its cross-entropy (the losses the forward computed; the same in the
 * dense, chunked (model.loss_chunk) and vocab-parallel heads), 0 where target_i < 0. The
 * caller sums them per sequence. */
void loom_model_token_logps(const loom_model *m, float *out);
void loom_model_token_logps_acts(const loom_model *m, const loom_acts *a, float *out);
/* loom_model_backward with a weight per token: grads += d(sum_i w_i * loss_i)/dparams, loss_i
 * the cross-entropy of position i (so w_i = -c makes the gradient of c * log p_i); w (B*T) of
 * the last forward's shape; positions with target < 0 contribute nothing whatever w_i. dscale
 * scales the model's own terms (MoE's load-balancing and z losses) as in loom_model_backward.
 * With every w_i equal to dscale this is loom_model_backward(m, dscale), bit for bit (runs of
 * equal weights are one kernel call each). LM head only. Clobbers logits. */
void loom_model_backward_weighted(loom_model *m, const float *w, float dscale);
void loom_model_backward_weighted_acts(loom_model *m, loom_acts *a, const float *w,
                                       float dscale);
/* number of targets >= 0 in the last forward */
int64_t loom_model_valid_targets(const loom_model *m);
void loom_model_zero_grad(loom_model *m);
/* logits of the last forward (valid until backward): (B,T,V), or (B,K) for classify; a
 * tensor-parallel view's LM logits are its vocabulary columns only, (B,T,Vl) with
 * loom_model_vocab_range; NULL when model.loss_chunk > 0 chunked the LM head of a training
 * arena (no (B,T,V) logits) */
const float *loom_model_logits(const loom_model *m);
/* The rows [*v0, *v0 + *vl) of the vocabulary this view holds (wte, lm_head and the logits'
 * columns): the whole vocabulary at tp = 1; with tp > 1 split as evenly as it goes (the first
 * V % tp ranks one row more). */
void loom_model_vocab_range(const loom_model *m, int *v0, int *vl);
/* Inference: logits (V) of the last position for a single sequence of n tokens (n <= T),
 * read back into a host buffer of the model (valid until the next call). Recomputes the whole
 * prefix (the KV cache comes with the inference issue). */
const float *loom_model_next_logits(loom_model *m, const int32_t *tokens, int n);
/* 1 when decoding can read this model's parameters: its own arenas, or resident hooks (above;
 * the DP engine's storage at ZeRO 0-2, so the model under training decodes from the weights it
 * trains, no copy). Decoding's KV caches and workspaces are the caller's, never the training
 * activation arenas. */
int loom_model_can_decode(const loom_model *m);
/* ---- incremental decoding ---------------------------------------------------------------
 * A KV cache holds, per layer, the keys and values of the positions a sequence has seen
 * (up to max_seq_len), so each new token costs one row of compute instead of the whole
 * prefix. For the LM head of a model with its own arenas (inference). */
typedef struct loom_kv_cache loom_kv_cache;
loom_kv_cache *loom_kv_cache_create(const loom_model *m);
void loom_kv_cache_free(loom_kv_cache *c);
void loom_kv_cache_reset(loom_kv_cache *c);
/* positions held */
int loom_kv_cache_len(const loom_kv_cache *c);
/* The bytes of its K and V caches: 2 * loom_model_kv_floats(m, max_seq_len) floats (a sliding
 * layer's ring holds its window only). */
size_t loom_kv_cache_bytes(const loom_kv_cache *c);
/* Runs `token` at position loom_kv_cache_len(c) (which must be < max_seq_len), appends its
 * keys and values, and returns the next-token logits (V), valid until the next call. */
const float *loom_model_decode(loom_model *m, loom_kv_cache *c, int32_t token);

/* ---- batched (ragged) decoding: the inference engine's step (src/model/decode_batch.c) ----
 * One forward over rows from many sequences at once: segment i is n consecutive tokens of one
 * sequence at positions [pos0, pos0 + n) (a prompt's prefill, a chunk of it, or one decoded
 * token), with its own KV cache in caller memory: k and v each (L, cap, KVH*D) floats,
 * cap >= pos0 + n, positions [0, pos0) filled by earlier steps. The step appends the rows'
 * keys and values and attends causally, so every row sees exactly what a full forward over
 * its sequence would. The linears run once over all rows (one GEMM per weight per step).
 * A tensor-parallel view (layout tp > 1, no sp) decodes too, with its tp group's points set
 * (parallel/tp.c): its caches hold its KVH/tp kv heads (KVH and D of the view), and the
 * logits it returns are the whole vocabulary's, gathered at LOOM_CP_VOCAB_GATHER, the same
 * bits on every rank of the group. */
/* A sequence's KV cache with room for cap positions holds, per layer, loom_model_kv_slots
 * rows: cap, or for a sliding-window layer min(cap, window) rows used as a ring (position p
 * in row p % window); loom_model_kv_floats(m, cap) floats for each of K and V, layer after
 * layer. Without sliding layers that is (L, cap, KVH*D). */
int loom_model_kv_slots(const loom_model *m, int layer, int cap);
size_t loom_model_kv_floats(const loom_model *m, int cap);
/* The scores of layer l's attention (scale, soft-cap) and its window, set in *mask (the rest
 * of it is left alone). */
struct loom_attn_mask;
void loom_model_attn_scores(const loom_model *m, int layer, struct loom_attn_mask *mask);
typedef struct loom_decode_seg {
    float *k, *v;      /* loom_model_kv_floats(m, cap) each (above) */
    int cap;           /* positions the cache holds */
    int pos0, n;       /* this step's positions [pos0, pos0 + n) */
    int want_logits;   /* 1: next-token logits of the segment's last row */
} loom_decode_seg;
typedef struct loom_decode_ws loom_decode_ws;
/* --weights bf16 (src/model/weights_bf16.c, docs/inference.md): rounds the linears' weight
 * matrices and the head matrix to bf16 once, holds them so (their fp32 pages released) and
 * runs them widened to fp32. After it only loom_model_decode_batch may run the model. A whole
 * dense language model (tp = 1, no MoE, no LoRA) or an error. Idempotent. */
int loom_model_set_weights_bf16(loom_model *m, loom_err *err);
int loom_model_weights_bf16(const loom_model *m);
/* --compute bf16 (docs/inference.md "Compute in bf16"): the same matrices as
 * loom_model_set_weights_bf16 rounded to bf16 (or taken from its copies when it ran before),
 * held in the backend's packed layout (their fp32 pages released), and the linears' and the
 * head's input rows rounded to bf16 and multiplied with them, fp32 accumulation (VDPBF16PS
 * where the CPU has it). loom_model_weights_bf16 is then 1 too. The same conditions as
 * loom_model_set_weights_bf16. Idempotent. */
int loom_model_set_compute_bf16(loom_model *m, loom_err *err);
int loom_model_compute_bf16(const loom_model *m);
/* --weights int8 (src/model/weights_q8.c, docs/inference.md "Weights in int8"): the same
 * matrices as loom_model_set_weights_bf16 quantized once to GGUF's Q8_0 (kernels.h
 * q8_quantize_rows), held so (their fp32 pages released); each linear and the head quantize
 * their input rows the same way and multiply Q8_0 x Q8_0 (matmul_q8_forward). After it only
 * loom_model_decode_batch may run the model (create its workspace after this call). The same
 * conditions as loom_model_set_weights_bf16, every linear's input width a multiple of 32, and
 * neither bf16 option before; an error otherwise. Idempotent. */
int loom_model_set_weights_int8(loom_model *m, loom_err *err);
int loom_model_weights_int8(const loom_model *m);
/* --weights int4 (src/model/weights_q8.c, docs/inference.md "Weights in int4"): as int8, but
 * the linears whose input width is a multiple of 256 in GGUF's Q4_K (kernels.h
 * q4k_quantize_rows; their input rows in blocks of 256, q8k_quantize_rows, multiplied by
 * matmul_q4k_forward); the other linears and the head in Q8_0. loom_model_weights_int8 is then
 * 0. The same conditions as int8; either one after the other is an error. Idempotent. */
int loom_model_set_weights_int4(loom_model *m, loom_err *err);
int loom_model_weights_int4(const loom_model *m);
/* The bytes of weights one decode step reads whole, at the precision they are held in: every
 * parameter but the lookup tables (an untied wte, wpe), the quantized or bf16 matrices at their
 * arena's size (its alignment padding included). MoE layers count all experts (an upper bound:
 * a step reads those its rows route to). `loom generate --stats` reports it per token. */
size_t loom_model_decode_weight_bytes(const loom_model *m);

/* scratch for steps of up to max_rows rows and max_logits segments wanting logits (with
 * --compute bf16: create it after loom_model_set_compute_bf16) */
loom_decode_ws *loom_decode_ws_create(const loom_model *m, int max_rows, int max_logits);
void loom_decode_ws_free(loom_decode_ws *w);
size_t loom_decode_ws_bytes(const loom_decode_ws *w);
/* floats of one position of a sequence's K (or V) cache over all layers: L * KVH * D (with
 * sliding-window layers an upper bound: their rings stop growing at the window, so a cache's
 * size is loom_model_kv_floats) */
size_t loom_model_kv_floats_per_pos(const loom_model *m);
/* Runs the step: tokens holds the rows of the segments in order (sum of n). Returns the
 * logits, (number of segments with want_logits, V) in segment order, valid until the next
 * step on w. */
const float *loom_model_decode_batch(loom_model *m, loom_decode_ws *w, const int32_t *tokens,
                                     const loom_decode_seg *segs, int nseg);

/* Training FLOPs (fwd+bwd) per token at sequence length T, for MFU: the GEMM FLOPs the
 * kernels execute, 6 per matmul weight (head included, embedding lookups not) plus causal
 * attention, 12 * L * n_head * D * attention_causal_pairs(T) / T (about half of T^2 per
 * sequence); element-wise work (norms, activations, softmax, AdamW) is not counted. */
double loom_model_flops_per_token(const loom_model *m, int T);

#endif
