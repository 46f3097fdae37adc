/* The profiler: spans of one process (rank) recorded during a window of training steps
 * (config key profile.steps: "A-B"), written as Chrome-trace JSON (the Trace Event format,
 * opened by Perfetto and chrome://tracing). docs/observability.md, "Profiler".
 *
 * One process-wide recorder (the trainer runs one per rank). Track layout in the trace:
 * pid = world rank, tid 0 = the rank's main thread (step > phase > op spans, and the time
 * blocked waiting for a collective as "wait:<kind>" spans), tid 1.. = collectives from start
 * to completion (non-blocking ones overlap compute; each gets the first lane free at its start,
 * so spans on one lane never overlap). Every op span carries its FLOPs and bytes.
 *
 * Recording is single-threaded (the thread that calls the backend ops and the collectives);
 * outside the window every call is a flag test. */
#ifndef LOOM_PROFILE_H
#define LOOM_PROFILE_H

#include <stdint.h>
#include "loom/base.h"

/* 1 while a step of the window is being recorded (the fast-path test). */
extern int loom_prof_recording;

/* Arms the profiler for steps [first, last] (1-based, the step being computed) of world rank
 * `rank`; peak_flops (per rank, 0 = unknown) gives each op span its share of the peak. */
void loom_prof_init(int rank, int64_t first, int64_t last, double peak_flops);
/* Parses "A-B" (or "A": one step) into first/last; an error naming `key` otherwise. */
int loom_prof_parse_steps(const char *text, const char *key, int64_t *first, int64_t *last,
                          loom_err *err);
/* 1 when armed and step is in the window: starts recording and opens the "step N" span. */
int loom_prof_step_begin(int64_t step);
/* Closes the step span and stops recording. Its args: model_flops, the step's model FLOPs of
 * the model replica this rank belongs to, and replica_ranks, the ranks that share that work
 * (tp x pp x cp; their op spans sum to model_flops). */
void loom_prof_step_end(double model_flops, int replica_ranks);
/* 1 once the last step of the window has been recorded (the parts can be written). */
int loom_prof_window_done(int64_t step);

/* A span on tid 0; name and cat must be string literals (or live as long as the recorder).
 * Spans nest: end closes the innermost open one. flops/bytes (0 = none) and shape ("" or
 * NULL) become its args. */
void loom_prof_begin(const char *name, const char *cat);
void loom_prof_end(double flops, double bytes, const char *shape);
/* loom_prof_end with a shape of n (<= LOOM_PROF_MAX_DIMS) integers named by keys, a string
 * literal of space-separated names ("N IC OC"): kept as numbers while recording and written
 * as "N=64 IC=32 OC=96" with the trace, so an op span costs no formatting. */
#define LOOM_PROF_MAX_DIMS 6
void loom_prof_end_dims(double flops, double bytes, const char *keys, const int64_t *dims,
                        int n);
/* A collective that ran from t0 to t1 (loom_now() seconds) of which `waited` seconds were
 * spent blocked in a wait: a span on a collective lane, and a "wait:<kind>" span of tid 0 when
 * waited > 0. kind and group: string literals. */
void loom_prof_comm(const char *kind, const char *group, double bytes, double t0, double t1,
                    double waited);

/* Writes this rank's events to <run_dir>/trace.rank_NNNNN.json (atomic). */
int loom_prof_write_part(const char *run_dir, loom_err *err);
/* Rank 0, after every rank wrote its part: merges the parts of ranks 0..world-1 into
 * <run_dir>/trace.json (one Trace Event JSON object, a track per rank), writes the summary
 * <run_dir>/profile_summary.json (per op: calls, seconds, FLOPs, bytes, achieved FLOP/s and
 * its share of the peak; compute / exposed communication / data wait per rank) and removes
 * the parts. */
int loom_prof_merge(const char *run_dir, int world, loom_err *err);
/* Frees the recorder (disarms). */
void loom_prof_shutdown(void);

/* The profiling twin of `inner` (src/obs/prof_backend.c): a table whose every op calls inner's
 * and, while the profiler records, wraps it in a span with its FLOPs and bytes. */
struct loom_backend;
const struct loom_backend *loom_prof_backend(const struct loom_backend *inner);

#endif
