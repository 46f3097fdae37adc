/* The CUDA backend's op tests (tests/gpu/test_cuda_*.c): each op of a device backend against
 * the cpu backend's on random inputs. One binary, two tests (tests/CMakeLists.txt):
 *   gpu/test_cuda_X       the `cuda` backend; skipped, with the reason, where no GPU is
 *                         visible or the build has no CUDA backend;
 *   emu/test_cuda_X       the same kernels on the CPU through the emulator (`cuda-emu`).
 * Device outputs are poisoned (0xff bytes: NaN) before each op, so an element an op fails to
 * write shows as NaN. Tolerances are per dtype and stated at each check (CU_TOL_*).
 * LOOM_TEST_CUDA_BACKEND names the backend. docs/gpu.md "Tests". */
#ifndef LOOM_TESTS_CUDA_HARNESS_H
#define LOOM_TESTS_CUDA_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/base.h"
#include "loom/bf16.h"

/* fp32 ops against the cpu kernels: different summation orders, FMA contraction */
#define CU_TOL_F32 1e-4
/* ops with bf16 outputs: one bf16 rounding apart (2^-8 relative) plus fp32 noise */
#define CU_TOL_BF16 1e-2

static const loom_backend *cu_dev, *cu_cpu;
static int cu_failures, cu_checks;
static uint64_t cu_seed = 1234;

/* the device backend, or exit 77 (skipped, with the reason recorded for run_test.sh) */
static inline void cu_setup(int argc, char **argv) {
    (void)argc, (void)argv;
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *name = getenv("LOOM_TEST_CUDA_BACKEND");
    if (!name || !*name) name = "cuda-emu";
    cu_cpu = loom_backend_cpu();
    cu_dev = loom_backend_find(name);
    char why[2200] = "";
    if (!cu_dev) snprintf(why, sizeof why, "backend '%s' is not in this build (%s)", name,
                          loom_backend_names());
    else {
        loom_err err = {{0}};
        if (loom_backend_ready(cu_dev, &err)) snprintf(why, sizeof why, "%s", err.msg);
    }
    if (why[0]) {
        printf("SKIP: %s\n", why);
        const char *f = getenv("LOOM_TEST_SKIPPED_FILE");
        FILE *fp = f && *f ? fopen(f, "a") : NULL;
        if (fp) fprintf(fp, "gpu: %s\n", why), fclose(fp);
        exit(77);
    }
    printf("backend %s\n", cu_dev->name);
}

static inline int cu_finish(void) {
    printf("%d checks, %d failed\n", cu_checks, cu_failures);
    return cu_failures ? 1 : 0;
}

/* uniform in [lo, hi) (splitmix-based, reproducible) */
static inline float *cu_rand(int64_t n, float lo, float hi) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = loom_rng_splitmix(cu_seed++);
        x[i] = lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
    }
    return x;
}
static inline uint16_t *cu_rand_bf16(int64_t n, float lo, float hi) {
    float *f = cu_rand(n, lo, hi);
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) h[i] = loom_bf16_round(f[i]);
    free(f);
    return h;
}
static inline int32_t *cu_rand_int(int64_t n, int32_t lo, int32_t hi) {
    int32_t *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (int32_t)(loom_rng_splitmix(cu_seed++) % (uint64_t)(hi - lo));
    return x;
}
/* host copy of n bytes */
static inline void *cu_hdup(const void *src, size_t n) {
    void *p = malloc(n ? n : 1);
    if (n) memcpy(p, src, n);
    return p;
}
/* a device buffer holding the host bytes */
static inline void *cu_up(const void *src, size_t n) {
    void *d = cu_dev->mem_alloc(n, 0);
    cu_dev->mem_h2d(d, src, n);
    return d;
}
/* a poisoned device buffer of n bytes (NaN floats) */
static inline void *cu_poisoned(size_t n) {
    void *d = cu_dev->mem_alloc(n, 0);
    cu_dev->mem_set(d, 0xff, n);
    return d;
}
/* the device buffer's bytes, on the host (malloc'd) */
static inline void *cu_down(const void *d, size_t n) {
    void *h = malloc(n ? n : 1);
    cu_dev->mem_d2h(h, d, n);
    return h;
}

/* |got - ref| <= tol * (1 + |ref|) everywhere (NaN fails; equal infinities pass) */
static inline int cu_check_f32(const char *what, const float *ref, const float *got, int64_t n,
                        double tol) {
    double worst = 0, worst_bad = 0;
    int64_t at = -1, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double r = ref[i], g = got[i];
        if (r == g) continue;
        const double e = fabs(g - r) / (1.0 + fabs(r));
        if (!(e <= tol)) {
            bad++;
            if (at < 0 || !(e <= worst_bad)) worst_bad = e, at = i;
        }
        if (e > worst) worst = e;
    }
    cu_checks++;
    if (bad) {
        cu_failures++;
        printf("FAIL %s: %lld of %lld elements off (tolerance %.1e); worst at %lld: ref %.9g, "
               "got %.9g\n", what, (long long)bad, (long long)n, tol, (long long)at,
               (double)ref[at], (double)got[at]);
        return 1;
    }
    printf("ok   %s (%lld elements, max rel err %.2e <= %.1e)\n", what, (long long)n, worst, tol);
    return 0;
}
/* the device's fp32 result (d, n floats) against the host reference */
static inline int cu_check_dev_f32(const char *what, const float *ref, const void *d, int64_t n,
                            double tol) {
    float *g = cu_down(d, (size_t)n * sizeof(float));
    int r = cu_check_f32(what, ref, g, n, tol);
    free(g);
    return r;
}
static inline int cu_check_dev_bf16(const char *what, const uint16_t *ref, const void *d, int64_t n,
                             double tol) {
    uint16_t *g = cu_down(d, (size_t)n * 2);
    float *rf = malloc((size_t)(n ? n : 1) * 4), *gf = malloc((size_t)(n ? n : 1) * 4);
    for (int64_t i = 0; i < n; i++) rf[i] = loom_bf16_widen(ref[i]), gf[i] = loom_bf16_widen(g[i]);
    int r = cu_check_f32(what, rf, gf, n, tol);
    free(g), free(rf), free(gf);
    return r;
}
static inline int cu_check_dev_i32(const char *what, const int32_t *ref, const void *d, int64_t n) {
    int32_t *g = cu_down(d, (size_t)n * 4);
    int64_t bad = 0, at = -1;
    for (int64_t i = 0; i < n; i++)
        if (g[i] != ref[i]) bad++, at = at < 0 ? i : at;
    cu_checks++;
    if (bad) {
        cu_failures++;
        printf("FAIL %s: %lld of %lld ints differ; first at %lld: ref %d, got %d\n", what,
               (long long)bad, (long long)n, (long long)at, ref[at], g[at]);
    } else
        printf("ok   %s (%lld ints equal)\n", what, (long long)n);
    free(g);
    return bad ? 1 : 0;
}
/* a scalar (a double the op returned) */
static inline int cu_check_scalar(const char *what, double ref, double got, double tol) {
    cu_checks++;
    const double e = fabs(got - ref) / (1.0 + fabs(ref));
    if (!(e <= tol)) {
        cu_failures++;
        printf("FAIL %s: ref %.12g, got %.12g (tolerance %.1e)\n", what, ref, got, tol);
        return 1;
    }
    printf("ok   %s (%.12g, rel err %.2e)\n", what, got, e);
    return 0;
}

#endif
