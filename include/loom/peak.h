/* The machine's fp32 peak FLOP/s, the denominator of MFU (src/obs/peak.c: it times the linear
 * layers' GEMM through the backend table). docs/training.md, "MFU and the peak".
 *
 * The peak is measured once per machine, by `loom peak` or by the first `loom train` that finds
 * none (busy or not: a busy machine's figure is flagged and replaced by a later idle one), and
 * cached in $LOOM_CACHE_DIR/peak_flops.json (else ~/.cache/loom/peak_flops.json),
 * keyed by hostname, CPU model and thread count. Nothing else ever changes the cached value:
 * training throughput never raises it. $LOOM_PEAK_FLOPS (tests set it) replaces the whole
 * probe: with it set, nothing is measured and the cache is neither read nor written. */
#ifndef LOOM_PEAK_H
#define LOOM_PEAK_H

#include "loom/base.h"

typedef enum {
    LOOM_PEAK_NONE = 0, /* no peak: MFU is not reported */
    LOOM_PEAK_ENV,      /* $LOOM_PEAK_FLOPS */
    LOOM_PEAK_CACHE,    /* an earlier measurement on this machine */
    LOOM_PEAK_MEASURED, /* measured just now */
} loom_peak_source;

typedef struct {
    double flops;            /* FLOP/s at `threads` threads; 0 when source is NONE */
    int threads;
    loom_peak_source source;
    int idle;                /* CACHE/MEASURED: the machine was idle when it was measured */
    double load1;            /* CACHE/MEASURED: 1-minute load average just before measuring */
    int ncpu;                /* CACHE/MEASURED: online CPUs then */
    int64_t measured_at;     /* CACHE/MEASURED: Unix time */
    char note[320];          /* why there is no peak, or why it is suspect; "" when neither */
} loom_peak;

/* The 1-minute load average and the CPUs this process may run on; idle is 1 when the load
 * leaves `threads` cores free: load1 + threads <= ncpu + 0.5. */
int loom_machine_idle(int threads, double *load1, int *ncpu);

/* The peak to use at `threads` OpenMP threads (<= 0: omp_get_max_threads()):
 *   $LOOM_PEAK_FLOPS when set (a positive number; anything else is an error);
 *   else, when may_measure, a measurement now (logged, cached) if nothing is cached, or if the
 *     cached figure was measured on a busy machine and this one is idle now;
 *   else the cached measurement of this machine (a busy one's with a note);
 *   else none (source NONE, flops 0, note says what to run).
 * A multi-rank trainer passes may_measure 0 and, on NONE, measures on every rank at once
 * (loom_peak_measure_now) and stores the result (loom_peak_store). Fails only on a bad
 * $LOOM_PEAK_FLOPS. */
int loom_peak_get(int threads, int may_measure, loom_peak *out, loom_err *err);
/* Measures now (about budget_s seconds, <= 0: 2 s), whatever the load; nothing cached. */
void loom_peak_measure_now(int threads, double budget_s, loom_peak *out);
/* Caches a measurement (pk->threads, flops, idle, load1, ncpu, measured_at) under this machine's
 * key unless that would replace an idle machine's figure by a busy one's (*stored says which). */
int loom_peak_store(const loom_peak *pk, int *stored, loom_err *err);

/* Measures now (`loom peak`), for about budget_s seconds (<= 0: 2 s), whatever the load, and
 * caches the result unless that would replace a measurement made on an idle machine by one
 * made on a busy machine (*stored says which). Fails when $LOOM_PEAK_FLOPS is set (nothing is
 * measured then) or the cache cannot be written. */
int loom_peak_measure(int threads, double budget_s, loom_peak *out, int *stored, loom_err *err);

/* The cache file path (malloc'd), or NULL when neither $LOOM_CACHE_DIR nor $HOME is set. */
char *loom_peak_cache_path(void);

/* The GEMM probe alone: the best FLOP/s of n x n x n cblas_sgemm calls (n 2048, or 512 on a
 * slow machine) over about budget_s seconds, nothing cached. */
double loom_peak_probe(int threads, double budget_s);

/* For unit tests: replace the probe and the load average (NULL restores the real ones). */
void loom_peak_set_hooks(double (*probe)(int threads, double budget_s), double (*load1)(void));

#endif
