/* Learning-rate schedules (include/loom/schedule.h). */
#include "loom/schedule.h"

#include <math.h>

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
