/* Alert rules on the per-step metrics (docs/observability.md, "Alerts").
 *
 * A rule is one line "METRIC CONDITION -> ACTION":
 *   METRIC     loss | val_loss | grad_norm | lr | tokens_per_s | mfu | step_ms | rss_bytes |
 *              comm_exposed_share | straggler_lag
 *   CONDITION  nonfinite                     the value is NaN or infinite
 *              OP NUMBER                     OP: > >= < <=
 *              OP [K *] FUNC(N)              FUNC: ema | median | mean | min | max over the
 *                                            metric's N previous values (this step excluded)
 *   ACTION     log | stop | exec: COMMAND
 * A rule with a FUNC is armed once min(N, 10) earlier values exist. A rule fires when its
 * condition becomes true, and again only after a step where it was false. */
#ifndef LOOM_ALERTS_H
#define LOOM_ALERTS_H

#include <stdint.h>
#include "loom/base.h"

typedef struct loom_alerts loom_alerts;

/* The default rules (obs.default_alerts), one per line, for docs and tests. */
extern const char *const loom_alert_default_rules[];
extern const int loom_alert_default_count;

/* Parses n rule texts (what names them in errors: "config key 'alerts'"), plus the defaults
 * when with_defaults; firings are appended to jsonl_path (alerts.jsonl). An error names the
 * item, its text and what is wrong. */
int loom_alerts_create(char *const *rules, int n, int with_defaults, const char *what,
                       const char *jsonl_path, loom_alerts **out, loom_err *err);
int loom_alerts_count(const loom_alerts *a);

/* One step's values: metric names and values; a metric absent this step is left out. */
typedef struct loom_alert_value {
    const char *metric;
    double value;
} loom_alert_value;
/* Evaluates every rule at `step`, runs the actions of those that fire (log: a warning; exec:
 * the command through /bin/sh, not waited for, with LOOM_ALERT_RULE, LOOM_ALERT_METRIC,
 * LOOM_ALERT_VALUE, LOOM_ALERT_STEP, LOOM_ALERT_ACTION in its environment; stop: *stop = 1),
 * and writes a line per firing to alerts.jsonl. *fired += the firings. */
int loom_alerts_eval(loom_alerts *a, int64_t step, const loom_alert_value *v, int n, int *stop,
                     int64_t *fired, loom_err *err);
/* Waits up to 10 s for commands still running, then frees. */
void loom_alerts_free(loom_alerts *a);

#endif
