/* Compiles a kernel file once per instruction-set level (include/loom/kernels.h, docs/build.md).
 *
 * A kernel file is laid out as
 *
 *     #ifndef LOOM_KV                        shared part, compiled once
 *     #include "kernels/kmath.h"  ...
 *     #define LOOM_KSELF "kernels/norm.c"
 *     #include "kernels/isa_variants.h"      includes LOOM_KSELF once per level
 *     LOOM_DISPATCH(layernorm_forward, (float *out, ...), (out, ...))
 *     #else                                  the kernels, named LOOM_KV(name)
 *     static void LOOM_KV(layernorm_forward)(float *out, ...) { ... }
 *     #endif
 *
 * Each level is compiled under `#pragma GCC target`, which also applies to the functions GCC
 * outlines for the OpenMP regions inside them (the hot loops), and to the static inline math
 * of kmath.h inlined there. The features are listed, not given as arch=, so that the baseline
 * inline helpers stay inlinable. LOOM_DISPATCH defines the public function: a switch on
 * loom_isa_active(). In a NATIVE=1 build (-march=native) there is one variant. */
#ifndef LOOM_KSELF
#error "define LOOM_KSELF (this kernel file's path under src/) before including isa_variants.h"
#endif

#ifdef LOOM_NATIVE
#define LOOM_KV(name) name##_native
#include LOOM_KSELF
#undef LOOM_KV
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx2,fma,bmi,bmi2,popcnt,sse4.2")
#define LOOM_KV(name) name##_avx512
#include LOOM_KSELF
#undef LOOM_KV
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2,popcnt,sse4.2")
#define LOOM_KV(name) name##_avx2
#include LOOM_KSELF
#undef LOOM_KV
#pragma GCC pop_options

#define LOOM_KV(name) name##_base
#include LOOM_KSELF
#undef LOOM_KV
#endif

#ifndef LOOM_DISPATCH
#ifdef LOOM_NATIVE
#define LOOM_DISPATCH(name, params, args) \
    void name params { name##_native args; }
#define LOOM_DISPATCH_RET(type, name, params, args) \
    type name params { return name##_native args; }
#else
#define LOOM_DISPATCH(name, params, args)                                \
    void name params {                                                   \
        switch (loom_isa_active()) {                                     \
        case LOOM_ISA_AVX512: name##_avx512 args; break;                 \
        case LOOM_ISA_AVX2: name##_avx2 args; break;                     \
        default: name##_base args; break;                                \
        }                                                                \
    }
#define LOOM_DISPATCH_RET(type, name, params, args)                      \
    type name params {                                                   \
        switch (loom_isa_active()) {                                     \
        case LOOM_ISA_AVX512: return name##_avx512 args;                 \
        case LOOM_ISA_AVX2: return name##_avx2 args;                     \
        default: return name##_base args;                                \
        }                                                                \
    }
#endif
#endif
