/* Private to src/model: the model's state (arenas, tensor table, unit hooks, activations)
 * and the typed parameter views, shared by training (model.c) and decoding (decode.c). */
#ifndef LOOM_MODEL_INTERNAL_H
#define LOOM_MODEL_INTERNAL_H

#include "loom/model.h"

/* Activations kept for backward, each sized for the maximum B x T given at create.
 * Per-layer buffers are stacked with a leading L. */
typedef struct acts {
    float *encoded;   /* (B,T,C) embedding output = residual stream into layer 0 */
    float *ln1;       /* (L,B,T,C) */
    float *ln1_mean;  /* (L,B,T) */
    float *ln1_rstd;  /* (L,B,T) */
    float *qkv;       /* (L,B,T,QKV) after RoPE when llama */
    float *att;       /* (L,B,H,T,T) softmax probabilities */
    float *atty;      /* (L,B,T,H*D) attention output before the projection */
    float *res2;      /* (L,B,T,C) residual after attention */
    float *ln2;       /* (L,B,T,C) */
    float *ln2_mean;  /* (L,B,T) */
    float *ln2_rstd;  /* (L,B,T) */
    float *fch;       /* (L,B,T,FFI) first MLP matmul output (gate|up for llama) */
    float *fch_act;   /* (L,B,T,F) after GELU / SwiGLU */
    float *res3;      /* (L,B,T,C) residual after the MLP = layer output */
    float *lnf;       /* (B,T,C) */
    float *lnf_mean;  /* (B,T) */
    float *lnf_rstd;  /* (B,T) */
    float *logits;    /* (B,T,V); dlogits after backward */
    float *losses;    /* (B,T) */
    float *pooled;    /* (B,C) classify: mean of lnf over T */
    float *dpooled;   /* (B,C) */
    /* backward scratch */
    float *dres;      /* (B,T,C) gradient of the residual stream */
    float *dln;       /* (B,T,C) */
    float *dqkv;      /* (B,T,QKV) */
    float *datty;     /* (B,T,H*D) */
    float *dfch;      /* (B,T,FFI) */
    float *dfch_act;  /* (B,T,F) */
    float *datt;      /* (B,H,T,T) attention backward scratch */
} acts;

struct loom_model {
    loom_model_config cfg;
    loom_model_layout lay; /* this view (tp = 1 and all layers for the whole model) */
    int maxB, maxT;       /* arena sizes */
    int D;                /* head dim */
    int H, KVH, F;        /* this view's query heads, kv heads, feed-forward width */
    int QKV, FFI;         /* this view's q|k|v width, first MLP matmul width */
    int has_cp;
    loom_comm_points cp;
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
    float *act_mem;       /* one arena for acts */
    size_t act_floats;
    acts a;
    int32_t *inputs;      /* (B,T) copy of the last forward's inputs */
    int32_t *targets;     /* (B,T) */
    float *rope_cos;      /* (maxT, D/2) */
    float *rope_sin;
    int B, T;             /* shape of the last forward */
    int has_targets;
    int64_t valid;
};

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
#define FC1_KIND(m) ((m)->cfg.flavor == LOOM_FLAVOR_GPT2 ? LOOM_L_FC_W : LOOM_L_GATE_W)
#define FC1_W(m, l) LP((m), FC1_KIND(m), (l))
#define FC1_GW(m, l) LG((m), FC1_KIND(m), (l))

/* LayerNorm (gpt2) or RMSNorm (llama) of N rows; mean is unused by RMSNorm */
void model_norm_fwd(const loom_model *m, float *out, float *mean, float *rstd, const float *in,
                    const float *w, const float *b, int64_t N);

#endif
