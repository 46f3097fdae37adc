/* The machine's measured fp32 peak FLOP/s, the denominator of MFU (src/train/peak.c: it runs
 * BLAS, so it sits in the train layer beside its only user). */
#ifndef LOOM_PEAK_H
#define LOOM_PEAK_H

#include "loom/base.h"

/* Measured fp32 GEMM FLOP/s of this machine at `threads` OpenMP threads (<= 0: the current
 * omp_get_max_threads()): the best of a few cblas_sgemm calls of 1024^3 (smaller on slow
 * machines; about 0.5 s in all). The result is cached in $LOOM_CACHE_DIR/peak_flops.json, or
 * ~/.cache/loom/peak_flops.json, keyed by hostname, CPU model (/proc/cpuinfo "model name")
 * and thread count, so each machine measures once. A corrupt cache file is ignored with a
 * warning and rewritten. $LOOM_PEAK_FLOPS (a positive number) overrides the whole probe.
 * Never fails: returns a positive number. */
double loom_peak_flops(int threads);

/* Raises the cached peak of this machine at `threads` to `observed` (FLOP/s a run actually
 * achieved) when that is higher: the cache was then measured while other work shared the
 * cores. Returns the peak now cached (LOOM_PEAK_FLOPS, when set, is not overridden). */
double loom_peak_flops_raise(int threads, double observed);

#endif
