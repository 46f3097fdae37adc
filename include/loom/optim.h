/* loom optimizer: AdamW over the model's parameter arena, global-norm clipping, and the
 * learning-rate schedules (warmup + cosine, warmup-stable-decay). */
#ifndef LOOM_OPTIM_H
#define LOOM_OPTIM_H

#include <stdint.h>
#include "loom/model.h"

typedef struct loom_adamw {
    float beta1, beta2, eps, weight_decay;
    float *m, *v;   /* moments, same layout as the parameters (one arena) */
    size_t n;
    int64_t step;   /* optimizer steps taken */
} loom_adamw;

void loom_adamw_init(loom_adamw *o, size_t n, float beta1, float beta2, float eps,
                     float weight_decay);
void loom_adamw_free(loom_adamw *o);
/* One step over every tensor of the model (decay only where info->decay). */
void loom_adamw_step(loom_adamw *o, loom_model *m, float lr);
/* Global L2 norm of the gradients; when max_norm > 0 and the norm exceeds it, scales the
 * gradients by max_norm / norm. Returns the norm before clipping. */
float loom_clip_grad_norm(float *grads, size_t n, float max_norm);

typedef enum { LOOM_SCHED_COSINE = 0, LOOM_SCHED_WSD = 1, LOOM_SCHED_CONSTANT = 2 } loom_sched_kind;
typedef struct loom_schedule {
    int kind;
    double lr, min_lr;
    int64_t warmup, total;
    double decay_frac;  /* WSD: fraction of total spent in the final linear decay */
} loom_schedule;
/* lr at optimizer step `step` (0-based): linear warmup over `warmup` steps, then cosine to
 * min_lr at `total`, or (WSD) flat then linear decay over the last decay_frac of total. */
double loom_schedule_lr(const loom_schedule *s, int64_t step);

#endif
