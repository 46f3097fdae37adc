/* LoRA adapters: for each targeted linear W (out, in) of each layer, y = W x + (alpha / r) B A x
 * with A (r, in) and B (out, r); the base weights are frozen (backward computes no gradient for
 * the targeted and untargeted linears' weights of the block, only the adapters'). The adapters
 * live in their own arenas (parameters, gradients), in layer order then target order
 * q, k, v, o, gate | fc, up, down | fc_proj, each A then B. Init (PEFT's): A uniform in
 * [-1/sqrt(in), 1/sqrt(in)] keyed by (seed, tensor, element), B zero, so the adapted model
 * starts equal to the base. See docs/finetune.md. (src/model/lora.c) */
#ifndef LOOM_LORA_H
#define LOOM_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "loom/base.h"
#include "loom/model.h"

enum {
    LOOM_LORA_Q = 1 << 0, LOOM_LORA_K = 1 << 1, LOOM_LORA_V = 1 << 2, LOOM_LORA_O = 1 << 3,
    LOOM_LORA_GATE = 1 << 4, LOOM_LORA_UP = 1 << 5, LOOM_LORA_DOWN = 1 << 6,
};
#define LOOM_LORA_NT 7

/* "q", "k", "v", "o", "gate", "up", "down"; with an ungated MLP (gelu_mlp: arch.mlp
 * LOOM_MLP_GELU, gpt2) the spellings "fc" (= gate: the first MLP matrix) and "fc_proj"
 * (= down). -1 for an unknown name. */
int loom_lora_target_bit(const char *name, int gelu_mlp);
/* The targets a name of finetune.lora.targets stands for (a mask; 0 for an unknown name):
 * loom's names (loom_lora_target_bit), and PEFT's target_modules names of the Hugging Face
 * layouts, matched as PEFT matches them (a module-name suffix): q_proj, k_proj, v_proj,
 * o_proj, gate_proj, up_proj, down_proj (Llama, Mistral, Qwen, Mixtral's attention, OLMo,
 * Gemma); Phi-3's fused qkv_proj (q, k, v) and gate_up_proj (gate, up); GPT-2's c_attn (q, k,
 * v), c_fc (fc) and c_proj (o and fc_proj: both modules are named c_proj); and "all-linear"
 * (every target of the MLP kind). */
unsigned loom_lora_target_mask(const char *name, int gelu_mlp);
const char *loom_lora_target_name(int t, int gelu_mlp); /* t in [0, LOOM_LORA_NT) */

typedef struct loom_lora loom_lora;
typedef struct loom_lora_tensor {
    char name[64];     /* "layers.3.q.lora_A" */
    int layer, target; /* target index in [0, LOOM_LORA_NT) */
    int is_b;          /* 0: A (r, in), 1: B (out, r) */
    size_t offset;     /* in floats, into the adapter arenas */
    int64_t rows, cols;
} loom_lora_tensor;

/* Attaches adapters to m (a whole model: tp 1, every layer, no MoE feed-forward when an MLP
 * target is chosen): the block then adds them and m's base weights get no gradients. The model
 * owns the adapters: loom_model_free frees them with it, in whatever order its users let go of
 * them; *out is a borrowed handle, valid until the model or loom_lora_free frees them. */
int loom_lora_attach(loom_model *m, int rank, float alpha, unsigned targets, uint64_t seed,
                     loom_lora **out, loom_err *err);
/* Detaches the adapters from their model and frees them, before the model (merging them and
 * dropping them, or an error while loading them). NULL is a no-op. Never after the model is
 * freed: that freed them already. */
void loom_lora_free(loom_lora *l);
int loom_lora_rank(const loom_lora *l);
float loom_lora_alpha(const loom_lora *l);
unsigned loom_lora_targets(const loom_lora *l);
size_t loom_lora_num_params(const loom_lora *l);
/* The adapters' parameters and gradients (num_params floats each, layout above): device
 * memory of the model's backend (mem_alloc), read by host code only through
 * loom_lora_to_host. */
float *loom_lora_params(loom_lora *l);
float *loom_lora_grads(loom_lora *l);
/* the model's backend, whose memory the adapters are */
const struct loom_backend *loom_lora_backend(const loom_lora *l);
/* A host copy (loom_malloc'd, the caller frees it) of num_params floats of the adapters'
 * device memory at dev (the parameters, or moments of their layout): the named read `lora
 * adapters` (saving them, exporting them). loom_lora_upload is the way back (mem_h2d). */
float *loom_lora_to_host(const loom_lora *l, const float *dev);
void loom_lora_upload(loom_lora *l, float *dev, const float *host);
/* training.precision bf16 (the model's): the adapters' bf16 copy (num_params, device memory),
 * which the forward and backward GEMMs read, written by the optimizer step with the fp32
 * masters (adamw_update_bf16) and refreshed after a load; NULL for an fp32 model. */
uint16_t *loom_lora_bf16_params(loom_lora *l);
/* on = 0: the model's next forwards run without the adapters (the base model: a preference
 * method's reference log-probs); backward must not follow such a forward. on = 1 (the
 * default): with them. */
void loom_lora_set_enabled(loom_lora *l, int on);
void loom_lora_zero_grad(loom_lora *l);
int loom_lora_num_tensors(const loom_lora *l);
const loom_lora_tensor *loom_lora_tensor_at(const loom_lora *l, int i);
/* Adapter dropout (PEFT's lora_dropout): while on, each adapter's input x is replaced by
 * x * keep / (1 - p) before A, keep = 1 where the element's draw u >= p, with
 * u = loom_rng_uniform(seed, stream, counter) (24 bits), stream = (key << 16) | (layer << 3) |
 * target, counter = (global row * T + global position) * in + feature (T: the whole
 * sequence's length, in: the adapter's input width): a pure function of the element, so any
 * data-parallel or context-parallel layout and a recomputed forward draw the same mask, and
 * backward draws it again. set_dropout: p in [0, 1) (0 = none, the default), seed (the run's);
 * off until dropout_key turns it on for the forwards and backwards that follow (training
 * arenas only) with that key (the trainer's: the step) and row0 (the model's first row among
 * the step's rows: micro-batch * batch_size + data-parallel rank * its rows). Layers at most
 * LOOM_LORA_DROP_MAX_LAYERS; keys below 2^48. */
#define LOOM_LORA_DROP_MAX_LAYERS 8192
int loom_lora_set_dropout(loom_lora *l, float p, uint64_t seed, loom_err *err);
float loom_lora_dropout(const loom_lora *l);
void loom_lora_dropout_key(loom_lora *l, int on, uint64_t key, int64_t row0);
/* W += (alpha / r) B A for every adapter, into base (the model's parameter arena layout, device
 * memory of the model's backend: the op lora_merge). */
void loom_lora_merge(const loom_lora *l, const loom_model *m, float *base);

#endif
