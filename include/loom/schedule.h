/* loom learning-rate schedules (warmup + cosine, warmup-stable-decay, constant).
 *
 * The optimizer itself (AdamW, global-norm clipping) lives in one place only:
 * src/parallel/optim.c (include/loom/optim.h), which the DP/ZeRO engine (src/parallel/dp.c)
 * runs at every world size and ZeRO stage (tests/reference/test_engine.py compares it with
 * PyTorch) and LoRA fine-tuning steps its adapters with. */
#ifndef LOOM_SCHEDULE_H
#define LOOM_SCHEDULE_H

#include <stdint.h>

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
