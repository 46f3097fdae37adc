/* `loom report RUN_DIR`: one self-contained HTML page about a run (inline SVG plots, no
 * scripts, nothing fetched). docs/observability.md, "Report". */
#ifndef LOOM_REPORT_H
#define LOOM_REPORT_H

#include "loom/base.h"

/* Reads run_dir's metrics.jsonl (required), config.yaml, alerts.jsonl, profile_summary.json
 * and the training data's manifest (when found), and writes out_path (NULL:
 * <run_dir>/report.html) atomically. */
int loom_report(const char *run_dir, const char *out_path, loom_err *err);

#endif
