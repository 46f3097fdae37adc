/* The optimizer (src/parallel/optim.c): AdamW with decoupled weight decay and global-norm
 * gradient clipping, in one place. The DP/ZeRO engine (src/parallel/dp.c) steps the model's
 * owned slices with it; LoRA fine-tuning (src/train/train_lora.c) steps the adapters, a
 * parameter group of their own (loom_optim_group), with the same norm (the backend's
 * sum_squares), the same clipping factor (loom_optim_clip_scale, applied inside AdamW) and the
 * same AdamW. The math is the backend's ops (src/kernels/adamw.c). */
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

/* A parameter group the optimizer steps outside the model's arenas, held whole on every rank
 * (LoRA's adapters): n floats each of parameters p, gradients g and AdamW moments m, v, device
 * memory of be; pb: their bf16 copy (training.precision bf16), written by the step with the
 * fp32 masters (NULL: none); decay: the decoupled weight decay applies to every element (1) or
 * none (0). */
typedef struct loom_optim_group {
    const loom_backend *be;
    float *p, *g, *m, *v;
    uint16_t *pb;
    int64_t n;
    int decay;
} loom_optim_group;
/* The sum of squares of the group's gradients (the backend's sum_squares: in double, as the DP
 * engine sums its owned slices); sqrt of it, summed over everything stepped, is the global
 * norm clipping reads. */
double loom_optim_group_sum_squares(const loom_optim_group *o);
/* One AdamW step of the group at optimizer step `step` (1-based) and rate lr, its gradients
 * times grad_scale (loom_optim_clip_scale of the global norm; 1 for none). */
void loom_optim_group_step(const loom_optim_group *o, const loom_adamw *h, float lr,
                           int64_t step, float grad_scale);

#endif
