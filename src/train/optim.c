/* AdamW over the parameter arena, global-norm clipping, learning-rate schedules. */
#include "loom/optim.h"

#include <math.h>
#include <stdlib.h>

#include "loom/kernels.h"

void loom_adamw_init(loom_adamw *o, size_t n, float beta1, float beta2, float eps,
                     float weight_decay) {
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->weight_decay = weight_decay;
    o->n = n;
    o->step = 0;
    o->m = loom_alloc_aligned(n * sizeof(float));
    o->v = loom_alloc_aligned(n * sizeof(float));
}

void loom_adamw_free(loom_adamw *o) {
    free(o->m);
    free(o->v);
    o->m = o->v = NULL;
}

void loom_adamw_step(loom_adamw *o, loom_model *m, float lr) {
    LOOM_CHECK(o->n == loom_model_num_params(m));
    o->step++;
    float *p = loom_model_params(m), *g = loom_model_grads(m);
    for (int i = 0; i < loom_model_num_tensors(m); i++) {
        const loom_tensor_info *t = loom_model_tensor(m, i);
        if (t->numel == 0) continue;
        adamw_update(p + t->offset, g + t->offset, o->m + t->offset, o->v + t->offset,
                     (int64_t)t->numel, lr, o->beta1, o->beta2, o->eps,
                     t->decay ? o->weight_decay : 0.0f, o->step);
    }
}

float loom_clip_grad_norm(float *grads, size_t n, float max_norm) {
    const double norm = sqrt(sum_squares(grads, (int64_t)n));
    if (max_norm > 0.0f && norm > (double)max_norm)
        scale_inplace(grads, (int64_t)n, (float)((double)max_norm / (norm + 1e-6)));
    return (float)norm;
}

double loom_schedule_lr(const loom_schedule *s, int64_t step) {
    if (s->warmup > 0 && step < s->warmup) return s->lr * (double)(step + 1) / (double)s->warmup;
    if (s->kind == LOOM_SCHED_CONSTANT || s->total <= s->warmup) return s->lr;
    if (step >= s->total) return s->min_lr;
    if (s->kind == LOOM_SCHED_WSD) {
        const int64_t decay_steps = (int64_t)ceil(s->decay_frac * (double)(s->total - s->warmup));
        const int64_t decay_start = s->total - decay_steps;
        if (step < decay_start || decay_steps <= 0) return s->lr;
        const double frac = (double)(step - decay_start) / (double)decay_steps;
        return s->lr + (s->min_lr - s->lr) * frac;
    }
    const double progress = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    return s->min_lr + 0.5 * (s->lr - s->min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
}
