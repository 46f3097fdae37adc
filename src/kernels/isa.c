/* The kernels' instruction-set level: detection, the LOOM_ISA override, the active level.
 * See include/loom/kernels.h and docs/build.md. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/base.h"
#include "loom/kernels.h"

static atomic_int g_active = -1; /* -1: not chosen yet */

const char *loom_isa_name(loom_isa level) {
    switch (level) {
    case LOOM_ISA_NATIVE: return "native";
    case LOOM_ISA_BASE: return "x86-64";
    case LOOM_ISA_AVX2: return "avx2";
    case LOOM_ISA_AVX512: return "avx512";
    }
    return "?";
}

loom_isa loom_isa_detect(void) {
#ifdef LOOM_NATIVE
    return LOOM_ISA_NATIVE;
#elif defined(__x86_64__)
    __builtin_cpu_init();
    /* libgcc's checks include the OS's support (XCR0) for the ymm/zmm state */
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512cd");
    return v4 ? LOOM_ISA_AVX512 : v3 ? LOOM_ISA_AVX2 : LOOM_ISA_BASE;
#else
    return LOOM_ISA_BASE;
#endif
}

static int parse_level(const char *s, loom_isa *out) {
    static const struct { const char *name; loom_isa level; } names[] = {
        {"x86-64", LOOM_ISA_BASE}, {"base", LOOM_ISA_BASE}, {"portable", LOOM_ISA_BASE},
        {"x86-64-v3", LOOM_ISA_AVX2},
        {"avx2", LOOM_ISA_AVX2},   {"x86-64-v4", LOOM_ISA_AVX512}, {"avx512", LOOM_ISA_AVX512},
        {"native", LOOM_ISA_NATIVE},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].level;
            return 0;
        }
    return -1;
}

int loom_isa_set(loom_isa level, loom_err *err) {
    loom_isa best = loom_isa_detect();
    if (best == LOOM_ISA_NATIVE) {
        if (level != LOOM_ISA_NATIVE)
            return loom_errf(err, "kernels: this is a NATIVE=1 build (one variant, compiled for "
                                  "the build machine): level '%s' is not available; build "
                                  "without NATIVE=1 for per-level kernels", loom_isa_name(level));
    } else if (level == LOOM_ISA_NATIVE || level > best) {
        return loom_errf(err, "kernels: level '%s' is not available on this CPU (it supports "
                              "up to '%s')", loom_isa_name(level), loom_isa_name(best));
    }
    atomic_store(&g_active, (int)level);
    return 0;
}

int loom_isa_init(loom_err *err) {
    loom_isa best = loom_isa_detect(), want = best;
    const char *env = getenv("LOOM_ISA");
    if (env && *env && strcmp(env, "auto") != 0) {
        if (parse_level(env, &want) != 0)
            return loom_errf(err, "LOOM_ISA='%s': unknown level (one of x86-64 (or portable), "
                                  "avx2, avx512, auto%s)", env, best == LOOM_ISA_NATIVE ? ", native" : "");
        if (loom_isa_set(want, err) != 0) return loom_err_prefix(err, "LOOM_ISA='%s'", env);
        return 0;
    }
    atomic_store(&g_active, (int)want);
    return 0;
}

loom_isa loom_isa_active(void) {
    int a = atomic_load_explicit(&g_active, memory_order_relaxed);
    if (a >= 0) return (loom_isa)a;
    loom_err err;
    if (loom_isa_init(&err) != 0) loom_panic(__FILE__, __LINE__, "%s", err.msg);
    return (loom_isa)atomic_load(&g_active);
}
