/* bf16 mixed-precision training GEMMs (training.precision bf16, docs/kernels.md "bf16
 * training"): bf16 operands, fp32 accumulation, fp32 or bf16 results, weight gradients
 * accumulated in fp32.
 *
 * Two paths, chosen per call by bf16_matmul_native():
 *  - oneDNN's matmul primitive with bf16 src/weights (Debian 12's libdnnl 2.6 has no bf16 gemm
 *    in its C API, only the primitive; it runs its avx512_core_bf16 brgemm kernels on
 *    VDPBF16PS), one primitive per shape, kept in a small cache;
 *  - elsewhere (a CPU without AVX512-BF16, or a level below avx512): the operands widened
 *    exactly to fp32 in panels of KB columns and multiplied by dnnl_sgemm. Correct (the same
 *    products, fp32 sums in another order) but slower than fp32 training: the log says so once.
 * The panels are one buffer grown on demand (kept for the process: no allocation once the
 * shapes have been seen); these GEMMs are called from one thread, outside parallel regions. */
#include "kernels/kmath.h"

#include <dnnl.h>
#include <omp.h>
#include <stdlib.h>

#include "loom/backend.h"
#include "loom/base.h"
#include "loom/bf16.h"
#include "loom/kernels.h"

int bf16_matmul_native(void) {
#if defined(__x86_64__)
    if (getenv("LOOM_BF16_GEMM_PORTABLE")) return 0; /* tests: the portable path at avx512 */
    const loom_isa l = loom_isa_active();
    if (l != LOOM_ISA_AVX512 && l != LOOM_ISA_NATIVE) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
#else
    return 0;
#endif
}

/* ---- the oneDNN matmul primitive ------------------------------------------------------- */

typedef struct gemm_key {
    int64_t M, N, K, lda, ldb, ldc;
    char ta, tb;
    char c_bf16, acc, bias;
} gemm_key;

typedef struct gemm_prim {
    gemm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bias;
} gemm_prim;

enum { CACHE = 48 };
static gemm_prim g_cache[CACHE];
static int g_used, g_next;
static dnnl_engine_t g_eng;
static dnnl_stream_t g_stream;

static void dnnl_ok(dnnl_status_t s, const char *what) {
    if (s != dnnl_success) loom_panic(__FILE__, __LINE__, "oneDNN %s failed (status %d)", what, (int)s);
}

static gemm_prim *prim_for(const gemm_key *k) {
    for (int i = 0; i < g_used; i++)
        if (!memcmp(&g_cache[i].key, k, sizeof *k)) return &g_cache[i];
    if (!g_eng) {
        dnnl_ok(dnnl_engine_create(&g_eng, dnnl_cpu, 0), "engine_create");
        dnnl_ok(dnnl_stream_create(&g_stream, g_eng, dnnl_stream_default_flags), "stream_create");
    }
    gemm_prim *p;
    if (g_used < CACHE) {
        p = &g_cache[g_used++];
    } else { /* evict round robin */
        p = &g_cache[g_next];
        g_next = (g_next + 1) % CACHE;
        dnnl_primitive_destroy(p->prim);
        dnnl_memory_destroy(p->a);
        dnnl_memory_destroy(p->b);
        dnnl_memory_destroy(p->c);
        if (p->bias) dnnl_memory_destroy(p->bias);
    }
    memset(p, 0, sizeof *p);
    p->key = *k;
    /* op(A) (M,K), op(B) (K,N), C (M,N): strides give the transposes */
    dnnl_memory_desc_t amd, bmd, cmd, biasmd;
    const dnnl_dims_t ad = {k->M, k->K}, bd = {k->K, k->N}, cd = {k->M, k->N}, bsd = {1, k->N};
    const dnnl_dims_t as = {k->ta == 'T' ? 1 : k->lda, k->ta == 'T' ? k->lda : 1};
    const dnnl_dims_t bs = {k->tb == 'T' ? 1 : k->ldb, k->tb == 'T' ? k->ldb : 1};
    const dnnl_dims_t cs = {k->ldc, 1}, bss = {k->N, 1};
    dnnl_ok(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as), "memory_desc");
    dnnl_ok(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs), "memory_desc");
    dnnl_ok(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, k->c_bf16 ? dnnl_bf16 : dnnl_f32, cs),
            "memory_desc");
    dnnl_ok(dnnl_memory_desc_init_by_strides(&biasmd, 2, bsd, dnnl_f32, bss), "memory_desc");
    dnnl_matmul_desc_t md;
    dnnl_ok(dnnl_matmul_desc_init(&md, &amd, &bmd, k->bias ? &biasmd : NULL, &cmd),
            "matmul_desc_init");
    dnnl_primitive_attr_t attr;
    dnnl_ok(dnnl_primitive_attr_create(&attr), "attr_create");
    if (k->acc) {
        dnnl_post_ops_t po;
        dnnl_ok(dnnl_post_ops_create(&po), "post_ops_create");
        dnnl_ok(dnnl_post_ops_append_sum(po, 1.0f), "append_sum");
        dnnl_ok(dnnl_primitive_attr_set_post_ops(attr, po), "set_post_ops");
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    dnnl_ok(dnnl_primitive_desc_create(&pd, &md, attr, g_eng, NULL), "matmul primitive_desc");
    dnnl_primitive_attr_destroy(attr);
    dnnl_ok(dnnl_primitive_create(&p->prim, pd), "primitive_create");
    dnnl_primitive_desc_destroy(pd);
    dnnl_ok(dnnl_memory_create(&p->a, &amd, g_eng, DNNL_MEMORY_NONE), "memory_create");
    dnnl_ok(dnnl_memory_create(&p->b, &bmd, g_eng, DNNL_MEMORY_NONE), "memory_create");
    dnnl_ok(dnnl_memory_create(&p->c, &cmd, g_eng, DNNL_MEMORY_NONE), "memory_create");
    if (k->bias) dnnl_ok(dnnl_memory_create(&p->bias, &biasmd, g_eng, DNNL_MEMORY_NONE), "memory_create");
    return p;
}

static void gemm_dnnl(const gemm_key *k, const uint16_t *A, const uint16_t *B, void *C,
                      const float *bias) {
    gemm_prim *p = prim_for(k);
    dnnl_ok(dnnl_memory_set_data_handle(p->a, (void *)A), "set_data_handle");
    dnnl_ok(dnnl_memory_set_data_handle(p->b, (void *)B), "set_data_handle");
    dnnl_ok(dnnl_memory_set_data_handle(p->c, C), "set_data_handle");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
    int n = 3;
    if (k->bias) {
        dnnl_ok(dnnl_memory_set_data_handle(p->bias, (void *)bias), "set_data_handle");
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, p->bias};
    }
    dnnl_ok(dnnl_primitive_execute(p->prim, g_stream, n, args), "matmul execute");
    dnnl_ok(dnnl_stream_wait(g_stream), "stream_wait");
}

/* ---- the portable path ------------------------------------------------------------------- */

enum { KB = 128, MB = 512 };
static float *g_panel;
static size_t g_panel_n;

static float *panel(size_t n) {
    if (n > g_panel_n) {
        free(g_panel);
        g_panel = loom_alloc_aligned(n * sizeof(float));
        g_panel_n = n;
    }
    return g_panel;
}

/* rows r0..r0+m of op(X) (X (.,ld) bf16, transposed when t == 'T'), columns k0..k0+kb, widened
 * into dst (m, kb) */
static void widen_panel(float *dst, const uint16_t *X, int64_t ld, char t, int64_t r0, int64_t m,
                        int64_t k0, int64_t kb) {
#pragma omp parallel for schedule(static) if (m * kb >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < kb; j++)
            dst[r * kb + j] = loom_bf16_widen(t == 'T' ? X[(k0 + j) * ld + r0 + r]
                                                       : X[(r0 + r) * ld + k0 + j]);
}

static void gemm_portable(const gemm_key *k, const uint16_t *A, const uint16_t *B, void *C,
                          const float *bias) {
    static int said;
    if (!said) {
        said = 1;
        loom_log("bf16: this CPU (or LOOM_ISA level) has no AVX512-BF16: the bf16 GEMMs widen "
                 "their operands to fp32 and run slower than fp32 training would");
    }
    const int64_t M = k->M, N = k->N, K = k->K;
    const char tbt = k->tb == 'T' ? 'N' : 'T'; /* op(B)^T's rows are op(B)'s columns */
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
        const int64_t mb = M - m0 < MB ? M - m0 : MB;
        /* the block's fp32 result: C itself, or scratch rounded at the end (bf16 C) */
        float *pa = panel((size_t)(mb + N) * KB + (k->c_bf16 ? (size_t)mb * N : 0));
        float *pb = pa + (size_t)mb * KB;
        float *cf = k->c_bf16 ? pb + (size_t)N * KB : (float *)C + m0 * k->ldc;
        const int64_t ldcf = k->c_bf16 ? N : k->ldc;
        for (int64_t k0 = 0; k0 < K; k0 += KB) {
            const int64_t kb = K - k0 < KB ? K - k0 : KB;
            widen_panel(pa, A, k->lda, k->ta, m0, mb, k0, kb);
            widen_panel(pb, B, k->ldb, tbt, 0, N, k0, kb); /* (N, kb): op(B)^T */
            const float beta = k0 > 0 || k->acc ? 1.0f : 0.0f;
            if (dnnl_sgemm('N', 'T', mb, N, kb, 1.0f, pa, kb, pb, kb, beta, cf, ldcf) !=
                dnnl_success)
                loom_panic(__FILE__, __LINE__, "dnnl_sgemm failed");
        }
        if (K == 0 && !k->acc)
            for (int64_t r = 0; r < mb; r++) memset(cf + r * ldcf, 0, (size_t)N * sizeof(float));
        if (bias)
            for (int64_t r = 0; r < mb; r++)
                for (int64_t j = 0; j < N; j++) cf[r * ldcf + j] += bias[j];
        if (k->c_bf16) {
            uint16_t *c16 = (uint16_t *)C + m0 * k->ldc;
#pragma omp parallel for schedule(static) if (mb * N >= LOOM_PAR_MIN)
            for (int64_t r = 0; r < mb; r++)
                for (int64_t j = 0; j < N; j++) c16[r * k->ldc + j] = loom_bf16_round(cf[r * N + j]);
        }
    }
}

/* C (M,N) = op(A) op(B) (+ bias, a row of N; acc: += C, fp32 C only), A, B bf16 */
static void gemm(char ta, char tb, int64_t M, int64_t N, int64_t K, const uint16_t *A,
                 int64_t lda, const uint16_t *B, int64_t ldb, int acc, void *C, int c_bf16,
                 int64_t ldc, const float *bias) {
    LOOM_CHECK(!(acc && c_bf16) && !(acc && bias));
    if (M == 0 || N == 0) return;
    gemm_key k; /* compared with memcmp by the cache: the padding must be zero too */
    memset(&k, 0, sizeof k);
    k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    k.ta = ta, k.tb = tb, k.c_bf16 = (char)c_bf16, k.acc = (char)acc, k.bias = (char)(bias != NULL);
    if (bf16_matmul_native() && K > 0) gemm_dnnl(&k, A, B, C, bias);
    else gemm_portable(&k, A, B, C, bias);
}

/* ---- the linear layer's three GEMMs ---------------------------------------------------- */

void bf16_matmul_forward(uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                         const float *bias, int64_t N, int IC, int OC) {
    gemm('N', 'T', N, OC, IC, inp, IC, weight, IC, 0, out, 1, OC, bias);
}

void bf16_matmul_forward_f32(float *out, const uint16_t *inp, const uint16_t *weight,
                             const float *bias, int64_t N, int IC, int OC) {
    gemm('N', 'T', N, OC, IC, inp, IC, weight, IC, 0, out, 0, OC, bias);
}

void bf16_matmul_backward(float *dinp, int dinp_set, float *dweight, float *dbias,
                          const float *dout, uint16_t *dout_bf16, const uint16_t *inp,
                          const uint16_t *weight, int64_t N, int IC, int OC) {
    const int64_t n = N * OC;
    LOOM_CHECK(dout || !dbias);
    if (dout) {
#pragma omp parallel for simd schedule(static) if (n >= LOOM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) dout_bf16[i] = loom_bf16_round(dout[i]);
    }
    /* dinp (N,IC) = dout (N,OC) @ weight (OC,IC) */
    if (dinp) gemm('N', 'N', N, IC, OC, dout_bf16, OC, weight, IC, !dinp_set, dinp, 0, IC, NULL);
    /* dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC) */
    if (dweight) gemm('T', 'N', OC, IC, N, dout_bf16, OC, inp, IC, 1, dweight, 0, IC, NULL);
    if (dbias && dout) { /* columns in slices of 64, rows summed in order (one fp32 chain each) */
        const int ns = (OC + 63) / 64;
#pragma omp parallel for schedule(static) if (n >= LOOM_PAR_MIN)
        for (int c = 0; c < ns; c++) {
            const int o0 = c * 64, o1 = o0 + 64 < OC ? o0 + 64 : OC;
            float a[64] = {0};
            for (int64_t r = 0; r < N; r++)
                for (int o = o0; o < o1; o++) a[o - o0] += dout[r * OC + o];
            for (int o = o0; o < o1; o++) dbias[o] += a[o - o0];
        }
    }
}
