/* metrics.jsonl: one JSON object per optimizer step, appended and flushed as it happens. */
#ifndef LOOM_METRICS_H
#define LOOM_METRICS_H

#include <jansson.h>
#include <stdint.h>
#include "loom/base.h"

typedef struct loom_metrics loom_metrics;
/* Opens path for appending. Lines of an earlier run whose "step" is greater than
 * keep_upto_step (the step a resumed run restarts from) are dropped first, so the file
 * always describes one consistent history. */
int loom_metrics_open(const char *path, int64_t keep_upto_step, loom_metrics **out, loom_err *err);
/* Appends the object as one compact line and flushes. */
int loom_metrics_write(loom_metrics *m, json_t *row, loom_err *err);
void loom_metrics_close(loom_metrics *m);

#endif
