/* loom peak [--threads N] [--seconds S] [--json]: measure this machine's fp32 GEMM peak, the
 * denominator of MFU, and cache it (docs/training.md, "MFU and the peak"). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "loom/peak.h"

static int usage(void) {
    fprintf(stderr, "usage: loom peak [--threads N] [--seconds S] [--json]\n"
                    "  measures the fp32 GEMM peak FLOP/s at N threads (default: all cores, as\n"
                    "  `loom train` uses) for about S seconds (default 2) and caches it for MFU\n");
    return 2;
}

/* a positive integer/real argument of an option, or -1 */
static double num_arg(const char *opt, const char *s, int integer) {
    char *end;
    double v = integer ? (double)strtol(s, &end, 10) : strtod(s, &end);
    if (!*s || *end || !(v > 0) || v > 1e6) {
        fprintf(stderr, "loom peak: %s '%s': expected a positive %s\n", opt, s,
                integer ? "integer" : "number");
        return -1;
    }
    return v;
}

int loom_cli_peak(int argc, char **argv) {
    int threads = 0, json = 0;
    double seconds = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) json = 1;
        else if ((!strcmp(a, "--threads") || !strcmp(a, "--seconds")) && i + 1 < argc) {
            double v = num_arg(a, argv[++i], a[2] == 't');
            if (v < 0) return 2;
            if (a[2] == 't') threads = (int)v;
            else seconds = v;
        } else return usage();
    }
    if (threads <= 0) threads = omp_get_max_threads();
    loom_err err = {{0}};
    loom_peak pk;
    int stored = 0;
    if (loom_peak_measure(threads, seconds, &pk, &stored, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    char *path = loom_peak_cache_path();
    if (json) {
        printf("{\"flops\": %.6g, \"threads\": %d, \"load1\": %.2f, \"ncpu\": %d, \"idle\": %s, "
               "\"stored\": %s, \"measured_at\": %lld}\n", pk.flops, pk.threads, pk.load1, pk.ncpu,
               pk.idle ? "true" : "false", stored ? "true" : "false", (long long)pk.measured_at);
    } else {
        printf("peak fp32 GEMM: %.1f GFLOP/s at %d threads; 1-minute load %.2f on %d CPUs "
               "before measuring: %s\n", pk.flops / 1e9, pk.threads, pk.load1, pk.ncpu,
               pk.idle ? "idle" : "NOT idle");
        if (stored) printf("cached in %s\n", path);
    }
    if (pk.note[0]) fprintf(stderr, "loom peak: note: %s\n", pk.note);
    free(path);
    return 0;
}
