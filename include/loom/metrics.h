/* metrics.jsonl: one JSON object per optimizer step, appended and flushed as it happens. */
#ifndef LOOM_METRICS_H
#define LOOM_METRICS_H

#include <stdint.h>
#include "loom/base.h"

typedef struct loom_metrics loom_metrics;
/* Opens path for appending. Lines of an earlier run whose "step" is greater than
 * keep_upto_step (the step a resumed run restarts from) are dropped first, so the file
 * always describes one consistent history. */
int loom_metrics_open(const char *path, int64_t keep_upto_step, loom_metrics **out, loom_err *err);
/* One line: begin, then fields in order, then end (writes the line and flushes). The line is
 * built in a buffer the writer keeps, so a step's metrics allocate nothing once the buffer
 * has grown to a line's size. Values must be finite. */
void loom_metrics_begin(loom_metrics *m);
void loom_metrics_int(loom_metrics *m, const char *key, int64_t v);
void loom_metrics_real(loom_metrics *m, const char *key, double v);
/* a JSON array of n values v[0], v[stride], ... */
void loom_metrics_reals(loom_metrics *m, const char *key, const double *v, int n, int stride);
int loom_metrics_end(loom_metrics *m, loom_err *err);
void loom_metrics_close(loom_metrics *m);

#endif
