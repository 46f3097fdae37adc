/* The optimizer (src/parallel/optim.c): AdamW with decoupled weight decay and global-norm
 * gradient clipping, in one place. The DP/ZeRO engine (src/parallel/dp.c) steps the model's
 * owned slices with it; LoRA fine-tuning (src/train/train_lora.c) steps the adapters with the
 * same AdamW. The math is the backend's adamw_update op (src/kernels/adamw.c). */
#ifndef LOOM_OPTIM_H
#define LOOM_OPTIM_H

#include <stdint.h>

#include <stddef.h>

#include "loom/backend.h"
#include "loom/model.h"

typedef struct loom_adamw {
    float beta1, beta2, eps, weight_decay;
} loom_adamw;

/* Global-norm clipping's factor for gradients of norm `norm` (the square root of the sum of
 * squares over every element of the global model): max_norm / (norm + 1e-6) when max_norm > 0
 * and norm exceeds it (PyTorch's clip_grad_norm_), else 1. AdamW applies it to the gradient it
 * reads (grad_scale below: the same bits as scaling the gradients first, without a pass). */
float loom_optim_clip_scale(double norm, float max_norm);

/* One AdamW step of n parameters p with gradients g (times grad_scale) and moments m, v, at
 * optimizer step `step` (1-based, for the bias corrections) and rate lr; decay 0 leaves out
 * the weight decay (norms, biases, embeddings of a model with decay off for them). */
void loom_optim_adamw(const loom_backend *be, const loom_adamw *h, float *p, const float *g,
                      float *m, float *v, int64_t n, float lr, int decay, int64_t step,
                      float grad_scale);
/* loom_optim_adamw over arena range [lo, hi) of unit `unit` of model m (parameters p,
 * gradients g, moments mm, vv all pointing at element lo), split at tensor boundaries so that
 * each tensor gets its own weight decay (loom_tensor_info.decay). */
void loom_optim_adamw_range(const loom_model *m, int unit, size_t lo, size_t hi, float *p,
                            const float *g, float *mm, float *vv, const loom_adamw *h, float lr,
                            int64_t step, float grad_scale);
/* The same, also writing pb (pointing at element lo of the model's bf16 copy,
 * loom_model_bf16_weights; NULL: none) = round(p) after the step (training.precision bf16) */
void loom_optim_adamw_range_bf16(const loom_model *m, int unit, size_t lo, size_t hi, float *p,
                                 uint16_t *pb, const float *g, float *mm, float *vv,
                                 const loom_adamw *h, float lr, int64_t step, float grad_scale);

#endif
