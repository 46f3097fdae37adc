/* The FLOP count of MFU is what the kernels execute: every cblas_sgemm and dnnl_sgemm call
 * (the linears go through oneDNN, attention through OpenBLAS) of a forward and backward is
 * counted (this file defines both, each forwarding to the library's through
 * dlsym(RTLD_NEXT)), and the count must equal loom_model_flops_per_token * B * T exactly, with
 * causal attention at the closed form 12 * L * H * D * pairs(T) per sequence, pairs(T) =
 * 2048 q (q + 1) + r T for T = 64 q + r (T(T+64)/2 when 64 divides T: about half of T^2).
 * Linears over <= LOOM_MATMUL_ROWS_MAX rows (T = 1 here) skip sgemm for matmul_rows_forward:
 * this file defines that too (a plain loop that counts its FLOPs; being defined here, the
 * library's is not linked in).
 * model.attention = sdpa: its attention runs through sgemm, so every FLOP is counted here;
 * flash attention (its own tile kernels) is counted by the same formula, the model's FLOPs. */
#include "testutil.h"

#include <cblas.h>
#include <dlfcn.h>
#include <dnnl.h>

#include "loom/kernels.h"
#include "loom/model.h"

static int64_t g_flops;

void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M,
                 OPENBLAS_CONST blasint N, OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha,
                 OPENBLAS_CONST float *A, OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *B,
                 OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float *C,
                 OPENBLAS_CONST blasint ldc) {
    typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
                             blasint, blasint, float, const float *, blasint, const float *,
                             blasint, float, float *, blasint);
    static sgemm_fn real;
    sgemm_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
        if (!f) abort();
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    __atomic_add_fetch(&g_flops, (int64_t)2 * M * N * K, __ATOMIC_RELAXED);
    f(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

dnnl_status_t dnnl_sgemm(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K,
                         float alpha, const float *A, dnnl_dim_t lda, const float *B,
                         dnnl_dim_t ldb, float beta, float *C, dnnl_dim_t ldc) {
    typedef dnnl_status_t (*fn_t)(char, char, dnnl_dim_t, dnnl_dim_t, dnnl_dim_t, float,
                                  const float *, dnnl_dim_t, const float *, dnnl_dim_t, float,
                                  float *, dnnl_dim_t);
    static fn_t real;
    fn_t f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (fn_t)dlsym(RTLD_NEXT, "dnnl_sgemm");
        if (!f) abort();
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    __atomic_add_fetch(&g_flops, (int64_t)2 * M * N * K, __ATOMIC_RELAXED);
    return f(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul_rows_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int64_t N, int IC, int OC) {
    __atomic_add_fetch(&g_flops, (int64_t)2 * N * IC * OC, __ATOMIC_RELAXED);
    for (int64_t n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float s = bias ? bias[o] : 0.0f;
            for (int i = 0; i < IC; i++) s += inp[n * IC + i] * weight[(int64_t)o * IC + i];
            out[n * OC + o] = s;
        }
}

static int64_t closed_form_pairs(int64_t T) {
    const int64_t q = T / 64, r = T % 64;
    return 2048 * q * (q + 1) + r * T;
}

/* weights in matmuls: 6 FLOPs per token each (forward 2, backward 4) */
static double matmul_params(const loom_model_config *c) {
    const double C = c->d_model, D = (double)c->d_model / c->n_head;
    const double QKV = (c->n_head + 2.0 * c->n_kv_head) * D, HD = c->n_head * D;
    const double FFI = c->flavor == LOOM_FLAVOR_LLAMA ? 2.0 * c->d_ff : c->d_ff;
    return c->n_layer * (C * QKV + HD * C + C * FFI + c->d_ff * C) + (double)c->vocab_size * C;
}

static void check(const loom_model_config *cfg, int B, int T) {
    loom_err err = {{0}};
    loom_model *m;
    if (loom_model_create(cfg, NULL, B, T, &m, &err)) fail_msg("%s", err.msg);
    loom_model_init_weights(m, 7);
    int32_t *in = malloc(sizeof(int32_t) * (size_t)(B * T));
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)(B * T));
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 31 + 5) % cfg->vocab_size;
        tg[i] = (i * 17 + 3) % cfg->vocab_size;
    }
    loom_model_zero_grad(m);
    g_flops = 0;
    (void)loom_model_forward(m, in, tg, B, T);
    loom_model_backward(m, 1.0f / (float)(B * T));
    const double executed = (double)g_flops;
    const double counted = loom_model_flops_per_token(m, T) * B * T;
    const double HD = cfg->d_model; /* n_head * D */
    const double attention = 12.0 * cfg->n_layer * HD * (double)closed_form_pairs(T) * B;
    if (executed != counted || executed != 6.0 * matmul_params(cfg) * B * T + attention)
        fail_msg("T=%d: executed %.0f FLOPs, MFU counts %.0f, closed form %.0f", T, executed,
                 counted, 6.0 * matmul_params(cfg) * B * T + attention);
    assert_int_equal(attention_causal_pairs(T), closed_form_pairs(T));
    free(in);
    free(tg);
    loom_model_free(m);
}

static void test_gpt2(void **state) {
    (void)state;
    const loom_model_config cfg = {.flavor = LOOM_FLAVOR_GPT2, .vocab_size = 97, .max_seq_len = 200,
                                   .n_layer = 2, .n_head = 4, .n_kv_head = 4, .d_model = 64,
                                   .d_ff = 256, .norm_eps = 1e-5f, .init_std = 0.02f,
                                   .attention = LOOM_ATTN_SDPA};
    const int Ts[] = {1, 40, 64, 65, 128, 200};
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) check(&cfg, 2, Ts[i]);
}

static void test_llama_gqa(void **state) {
    (void)state;
    const loom_model_config cfg = {.flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 256, .max_seq_len = 192,
                                   .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 64,
                                   .d_ff = 96, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                                   .init_std = 0.02f, .attention = LOOM_ATTN_SDPA};
    check(&cfg, 3, 192);
    check(&cfg, 1, 50);
}

/* the causal count is about half of T^2, not T^2 */
static void test_about_half(void **state) {
    (void)state;
    for (int T = 1024; T <= 65536; T *= 4) {
        const double ratio = (double)attention_causal_pairs(T) / ((double)T * T / 2);
        if (!(ratio >= 1.0 && ratio <= 1.0 + 64.0 / T + 1e-12))
            fail_msg("T=%d: pairs / (T^2/2) = %f", T, ratio);
    }
    assert_int_equal(attention_causal_pairs(256), 256 * (256 + 64) / 2);
    /* a sliding window W: at least the visible pairs (sum of min(i + 1, W)), at most two
     * 64-key tiles more per query (the window's partial edge and the diagonal), and the
     * causal count once the window covers the sequence */
    const int Ts[] = {1, 63, 300, 4096}, Ws[] = {1, 5, 64, 70, 512};
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
        for (size_t b = 0; b < sizeof Ws / sizeof *Ws; b++) {
            const int T = Ts[a], W = Ws[b];
            int64_t vis = 0;
            for (int i = 0; i < T; i++) vis += i + 1 < W ? i + 1 : W;
            const int64_t p = attention_window_pairs(T, W);
            if (p < vis || p > vis + 128 * (int64_t)T)
                fail_msg("T=%d W=%d: %lld pairs, %lld visible", T, W, (long long)p,
                         (long long)vis);
            if (W >= T) assert_int_equal(p, attention_causal_pairs(T));
        }
    assert_int_equal(attention_window_pairs(300, 0), attention_causal_pairs(300));
    /* T = 4096, W = 512: about T * (W + 96) pairs, under a third of the causal count */
    assert_true(attention_window_pairs(4096, 512) * 3 < attention_causal_pairs(4096));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama_gqa),
        cmocka_unit_test(test_about_half),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
