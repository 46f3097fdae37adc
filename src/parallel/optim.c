/* The optimizer: AdamW and global-norm clipping (include/loom/optim.h), used by the DP/ZeRO
 * engine (dp.c) and, through a parameter group, LoRA fine-tuning (src/train/train_lora.c). */
#include "loom/optim.h"

float loom_optim_clip_scale(double norm, float max_norm) {
    return max_norm > 0.0f && norm > (double)max_norm ? (float)((double)max_norm / (norm + 1e-6))
                                                      : 1.0f;
}

void loom_optim_adamw(const loom_backend *be, const loom_adamw *h, float *p, const float *g,
                      float *m, float *v, int64_t n, float lr, int decay, int64_t step,
                      float grad_scale) {
    be->adamw_update(p, g, m, v, n, lr, h->beta1, h->beta2, h->eps, decay ? h->weight_decay : 0.0f,
                     step, grad_scale);
}

void loom_optim_adamw_range(const loom_model *m, int unit, size_t lo, size_t hi, float *p,
                            const float *g, float *mm, float *vv, const loom_adamw *h, float lr,
                            int64_t step, float grad_scale) {
    loom_optim_adamw_range_bf16(m, unit, lo, hi, p, NULL, g, mm, vv, h, lr, step, grad_scale);
}

void loom_optim_adamw_range_bf16(const loom_model *m, int unit, size_t lo, size_t hi, float *p,
                                 uint16_t *pb, const float *g, float *mm, float *vv,
                                 const loom_adamw *h, float lr, int64_t step, float grad_scale) {
    const loom_backend *be = loom_model_backend(m);
    const int nt = loom_model_num_tensors(m);
    for (int i = 0; i < nt; i++) {
        const loom_tensor_info *t = loom_model_tensor(m, i);
        if (t->unit != unit) continue;
        const size_t a = t->offset > lo ? t->offset : lo;
        const size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        if (pb) /* training.precision bf16: the step also writes the bf16 copy */
            be->adamw_update_bf16(p + (a - lo), pb + (a - lo), g + (a - lo), mm + (a - lo),
                                  vv + (a - lo), (int64_t)(b - a), lr, h->beta1, h->beta2, h->eps,
                                  t->decay ? h->weight_decay : 0.0f, step, grad_scale);
        else
            loom_optim_adamw(be, h, p + (a - lo), g + (a - lo), mm + (a - lo), vv + (a - lo),
                             (int64_t)(b - a), lr, t->decay, step, grad_scale);
    }
}

double loom_optim_group_sum_squares(const loom_optim_group *o) {
    return o->be->sum_squares(o->g, o->n);
}

void loom_optim_group_step(const loom_optim_group *o, const loom_adamw *h, float lr,
                           int64_t step, float grad_scale) {
    if (o->pb) /* training.precision bf16: the step also writes the bf16 copy */
        o->be->adamw_update_bf16(o->p, o->pb, o->g, o->m, o->v, o->n, lr, h->beta1, h->beta2,
                                 h->eps, o->decay ? h->weight_decay : 0.0f, step, grad_scale);
    else
        loom_optim_adamw(o->be, h, o->p, o->g, o->m, o->v, o->n, lr, o->decay, step, grad_scale);
}
