/* bf16 mixed-precision training GEMMs (training.precision bf16, docs/kernels.md "bf16
 * training"): bf16 operands, fp32 accumulation, fp32 or bf16 results, weight gradients
 * accumulated in fp32.
 *
 * Two paths, chosen per call by bf16_matmul_native():
 *  - oneDNN's matmul primitive with bf16 src/weights (Debian 12's libdnnl 2.6 has no bf16 gemm
 *    in its C API, only the primitive), one primitive per shape in a small cache: on a CPU with
 *    AMX (amx_bf16) at the avx512 level, or asked for with LOOM_BF16_GEMM=onednn on one with
 *    AVX512-BF16. On AVX512-BF16 without AMX (this machine's Xeon) VDPBF16PS does 32
 *    multiply-adds per instruction on one port where the two FMA ports do 2 x 16: measured at
 *    1024 x 768 x 3072 on one thread, oneDNN 2.6's bf16 brgemm 69-80 GFLOP/s and PyTorch's
 *    (oneDNN 3.x) 73-79 against fp32 sgemm's 105-150 (docs/kernels.md);
 *  - elsewhere: the operands widened exactly to fp32 (a bf16 is the top half of its fp32) in
 *    tiles and multiplied by loom's fp32 GEMM (kernels/sgemm.h): the same products, fp32 sums
 *    in the fp32 GEMM's order. bf16 training then runs its GEMMs at the fp32 rate, not faster:
 *    the log says so once.
 * The tiles are one buffer grown on demand up to a budget (kept for the process: no
 * allocation once the shapes have been seen); these GEMMs are called from one thread, outside
 * parallel regions. */
#include "kernels/kmath.h"

#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "kernels/sgemm.h"
#include "loom/backend.h"
#include "loom/base.h"
#include "loom/bf16.h"
#include "loom/kernels.h"

int bf16_matmul_native(void) {
#if defined(__x86_64__)
    const loom_isa l = loom_isa_active();
    if (l != LOOM_ISA_AVX512 && l != LOOM_ISA_NATIVE) return 0;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return 0;
    /* oneDNN pinned below it (ONEDNN_MAX_CPU_ISA) has no bf16 matmul: the fp32 path */
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    if ((isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) != (unsigned)dnnl_cpu_isa_avx512_core_bf16)
        return 0;
    const char *e = getenv("LOOM_BF16_GEMM"); /* onednn | fp32 (tests, experiments) */
    if (e && !strcmp(e, "onednn")) return 1;
    if (e && !strcmp(e, "fp32")) return 0;
    return __builtin_cpu_supports("amx-bf16") != 0;
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

/* ---- the fp32 path: operands widened exactly, loom's fp32 GEMM --------------------------- */

enum { TILE_MIN = 16 }; /* the smallest tile side */

/* floats of widened tiles: 8 Mi (32 MiB), or LOOM_BF16_GEMM_BUDGET (tests: small tiles) */
static int64_t budget(void) {
    const char *e = getenv("LOOM_BF16_GEMM_BUDGET");
    int64_t v;
    if (e && loom_parse_i64(e, 1024, (int64_t)1 << 34, &v) == 0) return v;
    return (int64_t)8 << 20;
}
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

/* rows [r0, r0 + nr), columns [c0, c0 + nc) of a bf16 matrix (rows ld apart) widened into dst
 * (nr, nc) */
static void widen_block(float *dst, const uint16_t *src, int64_t ld, int64_t r0, int64_t nr,
                        int64_t c0, int64_t nc) {
#pragma omp parallel for schedule(static) if (nr * nc >= LOOM_PAR_MIN)
    for (int64_t r = 0; r < nr; r++) {
        const uint16_t *s = src + (r0 + r) * ld + c0;
        float *d = dst + r * nc;
        for (int64_t c = 0; c < nc; c++) d[c] = loom_bf16_widen(s[c]);
    }
}

/* op(A) rows [m0, m0 + mb) x columns [k0, k0 + kb), kept in A's stored orientation: returns
 * the leading dimension of dst */
static int64_t widen_a(float *dst, const gemm_key *k, const uint16_t *A, int64_t m0, int64_t mb,
                       int64_t k0, int64_t kb) {
    if (k->ta == 'T') { /* stored (K, M) */
        widen_block(dst, A, k->lda, k0, kb, m0, mb);
        return mb;
    }
    widen_block(dst, A, k->lda, m0, mb, k0, kb);
    return kb;
}

/* op(B) rows [k0, k0 + kb) x columns [n0, n0 + nb), in B's stored orientation */
static int64_t widen_b(float *dst, const gemm_key *k, const uint16_t *B, int64_t k0, int64_t kb,
                       int64_t n0, int64_t nb) {
    if (k->tb == 'T') { /* stored (N, K) */
        widen_block(dst, B, k->ldb, n0, nb, k0, kb);
        return kb;
    }
    widen_block(dst, B, k->ldb, k0, kb, n0, nb);
    return nb;
}

static void say_fp32_path(void) {
    static int said;
    if (said) return;
    said = 1;
    __builtin_cpu_init();
    loom_log("bf16: the GEMMs run on this CPU's fp32 units (%s): bf16 training computes as "
             "fast as fp32 here, not faster; it halves the activation memory (docs/kernels.md)",
             __builtin_cpu_supports("avx512bf16")
                 ? "its AVX512-BF16 dot products run at half the fp32 FMA rate, and it has no AMX"
                 : "no AVX512-BF16 or AMX at this level");
}

static void gemm_fp32(const gemm_key *k, const uint16_t *A, const uint16_t *B, void *C,
                      const float *bias) {
    say_fp32_path();
    const int64_t M = k->M, N = k->N, K = k->K;
    const int c16 = k->c_bf16;
    const int64_t BUDGET = budget();
    /* full-K tiles of mb rows x nb columns: (mb + nb) K widened floats (+ mb nb of fp32
     * result for a bf16 C); the larger side halved until they fit */
    int64_t mb = M, nb = N;
    const int64_t m256 = M < 256 ? M : 256, n256 = N < 256 ? N : 256;
    if (!c16 && (m256 + n256) * K > BUDGET) {
        /* K too long for full-K tiles of 256 (the head's dinp: K = V): blocks of K, C
         * accumulated */
        int64_t kb = BUDGET / (M + N);
        if (kb < 64) kb = 64;
        float *pa = panel((size_t)(M + N) * (size_t)kb), *pb = pa + M * kb;
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
            const int64_t kk = K - k0 < kb ? K - k0 : kb;
            const int64_t la = widen_a(pa, k, A, 0, M, k0, kk);
            const int64_t lb = widen_b(pb, k, B, k0, kk, 0, N);
            kernels_sgemm(k->ta, k->tb, M, N, kk, 1.0f, pa, la, pb, lb,
                          k0 > 0 || k->acc ? 1.0f : 0.0f, (float *)C, k->ldc);
        }
        if (bias)
            for (int64_t r = 0; r < M; r++)
                for (int64_t j = 0; j < N; j++) ((float *)C)[r * k->ldc + j] += bias[j];
        return;
    }
    while ((mb + nb) * K + (c16 ? mb * nb : 0) > BUDGET && (mb > TILE_MIN || nb > TILE_MIN)) {
        if (mb >= nb && mb > TILE_MIN) mb = (mb + 1) / 2;
        else nb = (nb + 1) / 2;
    }
    float *pa = panel((size_t)((mb + nb) * K + (c16 ? mb * nb : 0)));
    float *pb = pa + mb * K, *pc = pb + nb * K;
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
        const int64_t mm = M - m0 < mb ? M - m0 : mb;
        const int64_t la = widen_a(pa, k, A, m0, mm, 0, K);
        for (int64_t n0 = 0; n0 < N; n0 += nb) {
            const int64_t nn = N - n0 < nb ? N - n0 : nb;
            int64_t lb = k->tb == 'T' ? K : nn;
            if (nb < N || m0 == 0) lb = widen_b(pb, k, B, 0, K, n0, nn); /* else still there */
            float *cf = c16 ? pc : (float *)C + m0 * k->ldc + n0;
            const int64_t ldcf = c16 ? nn : k->ldc;
            kernels_sgemm(k->ta, k->tb, mm, nn, K, 1.0f, pa, la, pb, lb, k->acc ? 1.0f : 0.0f, cf,
                          ldcf);
            if (!c16 && !bias) continue;
            uint16_t *c = c16 ? (uint16_t *)C + m0 * k->ldc + n0 : NULL;
#pragma omp parallel for schedule(static) if (mm * nn >= LOOM_PAR_MIN)
            for (int64_t r = 0; r < mm; r++)
                for (int64_t j = 0; j < nn; j++) {
                    const float v = cf[r * ldcf + j] + (bias ? bias[n0 + j] : 0.0f);
                    if (c16) c[r * k->ldc + j] = loom_bf16_round(v);
                    else cf[r * ldcf + j] = v;
                }
        }
    }
}

/* The oneDNN primitive cache and the widening panel are the process's: one GEMM at a time
 * uses them. Concurrent callers (model views in threads of their own) take turns; the threads
 * that compute one GEMM are its OpenMP team, inside the lock. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

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
    pthread_mutex_lock(&g_lock);
    if (bf16_matmul_native() && K > 0) gemm_dnnl(&k, A, B, C, bias);
    else gemm_fp32(&k, A, B, C, bias);
    pthread_mutex_unlock(&g_lock);
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
