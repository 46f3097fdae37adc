/* metrics.jsonl: one JSON object per optimizer step, appended and flushed as it happens. */
#ifndef LOOM_METRICS_H
#define LOOM_METRICS_H

#include <stdint.h>
#include "loom/base.h"

typedef struct loom_metrics loom_metrics;
/* Opens path for appending. An earlier run's file is first cut to one consistent history
 * up to keep_upto_step (the step a resumed run restarts from): lines whose "step" is greater
 * are dropped, of several lines with the same step only the last written is kept, and
 * unparsable or unterminated lines (a write cut short) are dropped. Steps 1..keep_upto_step
 * that have no line are reported with a warning (they cannot be made up). */
int loom_metrics_open(const char *path, int64_t keep_upto_step, loom_metrics **out, loom_err *err);
/* One line: begin, then fields in order, then end (writes the line and flushes). The line is
 * built in a buffer the writer keeps, so a step's metrics allocate nothing once the buffer
 * has grown to a line's size. A value that is not finite (NaN, inf) is written as null. */
void loom_metrics_begin(loom_metrics *m);
void loom_metrics_int(loom_metrics *m, const char *key, int64_t v);
void loom_metrics_real(loom_metrics *m, const char *key, double v);
/* a JSON array of n values v[0], v[stride], ... */
void loom_metrics_reals(loom_metrics *m, const char *key, const double *v, int n, int stride);
int loom_metrics_end(loom_metrics *m, loom_err *err);
/* Makes every line written so far durable (fsync): called before a checkpoint commits, so the
 * rows up to a durable checkpoint survive a power loss. */
int loom_metrics_sync(loom_metrics *m, loom_err *err);
void loom_metrics_close(loom_metrics *m);

#endif
