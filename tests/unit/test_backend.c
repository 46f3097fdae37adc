/* The backend op table (include/loom/backend.h, docs/engine.md "Backends"):
 *  - the model, decoding and the optimizer call every kernel through the model's table: a
 *    table whose ops count their calls and forward to the cpu table sees each op the
 *    configuration uses called (forward, backward, decode, AdamW with clipping), and the
 *    results (loss, logits, gradients, decoded logits, parameters after two optimizer steps)
 *    are bitwise those of the plain cpu table; so are cpu-guard's (tests/unit/test_guard.c),
 *    read back through the copies: the model's path touches none of its memory on the host;
 *  - model.backend: cpu selects loom_backend_cpu(), cpu-guard loom_backend_guard(); an unknown
 *    name is an error naming the key; LOOM_BACKEND overrides the key (unknown: an error naming
 *    it) and is what a config without a backend gets;
 *  - clipping runs inside the AdamW step (no scale_inplace pass): adamw_update with grad_scale s
 *    gives bitwise the parameters and moments of scale_inplace(g, s) and then the step; and
 *    the same bits for a parameter whether it is updated alone or inside a long call;
 *  - matmul_backward_set / gelu_backward_set / flash_attention_backward_set (the input
 *    gradients overwritten) give the bits of zeroing them and the accumulating op. */
#include "testutil.h"

#include <math.h>
#include <omp.h>

#include "loom/backend.h"
#include "loom/kernels.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/model.h"
#include "loom/model_config.h"
#include "loom/parallel.h"

enum { B = 2, T = 6 };

/* ---- the counting table: one counter per op, each op forwards to the cpu table ---------- */
enum {
    C_MATMUL_F, C_MATMUL_B, C_LN_F, C_LN_B, C_RMS_F, C_RMS_B, C_GELU_F, C_GELU_B, C_SWIGLU_F,
    C_SWIGLU_B, C_ROPE_T, C_ROPE_F, C_ROPE_B, C_SDPA_F, C_SDPA_B, C_FLASH_F, C_FLASH_B,
    C_DECODE, C_EMB_F, C_EMB_B, C_POOL_F, C_POOL_B, C_RESID, C_CE_F, C_CE_B, C_ADAMW, C_SUMSQ,
    C_SCALE, C_MATMUL_BS, C_GELU_BS, C_FLASH_BS, C_COUNT
};
static const char *const op_names[C_COUNT] = {
    "matmul_forward", "matmul_backward", "layernorm_forward", "layernorm_backward",
    "rmsnorm_forward", "rmsnorm_backward", "gelu_forward", "gelu_backward", "swiglu_forward",
    "swiglu_backward", "rope_tables", "rope_forward", "rope_backward", "attention_forward",
    "attention_backward", "flash_attention_forward", "flash_attention_backward",
    "attention_decode", "embedding_forward", "embedding_backward", "mean_pool_forward",
    "mean_pool_backward", "residual_forward", "crossentropy_forward",
    "crossentropy_softmax_backward", "adamw_update", "sum_squares", "scale_inplace",
    "matmul_backward_set", "gelu_backward_set", "flash_attention_backward_set"};
static long calls[C_COUNT];
#define CPU loom_backend_cpu()

static void s_matmul_f(float *o, const float *i, const float *w, const float *b, int64_t N,
                       int IC, int OC) {
    calls[C_MATMUL_F]++;
    CPU->matmul_forward(o, i, w, b, N, IC, OC);
}
static void s_matmul_b(float *di, float *dw, float *db, const float *d, const float *i,
                       const float *w, int64_t N, int IC, int OC) {
    calls[C_MATMUL_B]++;
    CPU->matmul_backward(di, dw, db, d, i, w, N, IC, OC);
}
static void s_matmul_bs(float *di, float *dw, float *db, const float *d, const float *i,
                        const float *w, int64_t N, int IC, int OC) {
    calls[C_MATMUL_BS]++;
    CPU->matmul_backward_set(di, dw, db, d, i, w, N, IC, OC);
}
static void s_ln_f(float *o, float *mean, float *rstd, const float *i, const float *w,
                   const float *b, int64_t N, int C, float eps) {
    calls[C_LN_F]++;
    CPU->layernorm_forward(o, mean, rstd, i, w, b, N, C, eps);
}
static void s_ln_b(float *di, float *dw, float *db, const float *d, const float *i,
                   const float *w, const float *mean, const float *rstd, int64_t N, int C) {
    calls[C_LN_B]++;
    CPU->layernorm_backward(di, dw, db, d, i, w, mean, rstd, N, C);
}
static void s_rms_f(float *o, float *rstd, const float *i, const float *w, int64_t N, int C,
                    float eps) {
    calls[C_RMS_F]++;
    CPU->rmsnorm_forward(o, rstd, i, w, N, C, eps);
}
static void s_rms_b(float *di, float *dw, const float *d, const float *i, const float *w,
                    const float *rstd, int64_t N, int C) {
    calls[C_RMS_B]++;
    CPU->rmsnorm_backward(di, dw, d, i, w, rstd, N, C);
}
static void s_gelu_f(float *o, const float *i, int64_t n) {
    calls[C_GELU_F]++;
    CPU->gelu_forward(o, i, n);
}
static void s_gelu_b(float *di, const float *i, const float *d, int64_t n) {
    calls[C_GELU_B]++;
    CPU->gelu_backward(di, i, d, n);
}
static void s_gelu_bs(float *di, const float *i, const float *d, int64_t n) {
    calls[C_GELU_BS]++;
    CPU->gelu_backward_set(di, i, d, n);
}
static void s_swiglu_f(float *o, const float *i, int64_t N, int F) {
    calls[C_SWIGLU_F]++;
    CPU->swiglu_forward(o, i, N, F);
}
static void s_swiglu_b(float *di, const float *i, const float *d, int64_t N, int F) {
    calls[C_SWIGLU_B]++;
    CPU->swiglu_backward(di, i, d, N, F);
}
static void s_rope_t(float *c, float *s, int maxT, int D, float theta) {
    calls[C_ROPE_T]++;
    CPU->rope_tables(c, s, maxT, D, theta);
}
static void s_rope_f(float *x, int64_t b, int t, int nh, int D, int64_t rs, const float *c,
                     const float *s, int pos0) {
    calls[C_ROPE_F]++;
    CPU->rope_forward(x, b, t, nh, D, rs, c, s, pos0);
}
static void s_rope_b(float *x, int64_t b, int t, int nh, int D, int64_t rs, const float *c,
                     const float *s, int pos0) {
    calls[C_ROPE_B]++;
    CPU->rope_backward(x, b, t, nh, D, rs, c, s, pos0);
}
static void s_sdpa_f(float *o, float *att, const float *qkv, int b, int t, int H, int KVH,
                     int D, const loom_attn_mask *mk) {
    calls[C_SDPA_F]++;
    CPU->attention_forward(o, att, qkv, b, t, H, KVH, D, mk);
}
static void s_sdpa_b(float *dqkv, float *scr, const float *d, const float *qkv,
                     const float *att, int b, int t, int H, int KVH, int D,
                     const loom_attn_mask *mk) {
    calls[C_SDPA_B]++;
    CPU->attention_backward(dqkv, scr, d, qkv, att, b, t, H, KVH, D, mk);
}
static int s_flash_f(float *o, float *lse, const float *q, const float *k, const float *v,
                     const loom_attn_dims *dims, const loom_attn_mask *mask) {
    calls[C_FLASH_F]++;
    return CPU->flash_attention_forward(o, lse, q, k, v, dims, mask);
}
static int s_flash_b(float *dq, float *dk, float *dv, const float *d, const float *q,
                     const float *k, const float *v, const float *o, const float *lse,
                     const loom_attn_dims *dims, const loom_attn_mask *mask) {
    calls[C_FLASH_B]++;
    return CPU->flash_attention_backward(dq, dk, dv, d, q, k, v, o, lse, dims, mask);
}
static int s_flash_bs(float *dq, float *dk, float *dv, const float *d, const float *q,
                      const float *k, const float *v, const float *o, const float *lse,
                      const loom_attn_dims *dims, const loom_attn_mask *mask) {
    calls[C_FLASH_BS]++;
    return CPU->flash_attention_backward_set(dq, dk, dv, d, q, k, v, o, lse, dims, mask);
}
static void s_decode(float *o, const float *q, const float *kc, const float *vc, int n, int H,
                     int KVH, int D, float *scr, const loom_attn_mask *mk) {
    calls[C_DECODE]++;
    CPU->attention_decode(o, q, kc, vc, n, H, KVH, D, scr, mk);
}
static void s_emb_f(float *o, const int32_t *tok, const float *wte, const float *wpe, int b,
                    int t, int C, int pos0) {
    calls[C_EMB_F]++;
    CPU->embedding_forward(o, tok, wte, wpe, b, t, C, pos0);
}
static void s_emb_b(float *dwte, float *dwpe, const float *d, const int32_t *tok, int b, int t,
                    int C, int pos0) {
    calls[C_EMB_B]++;
    CPU->embedding_backward(dwte, dwpe, d, tok, b, t, C, pos0);
}
static void s_pool_f(float *o, const float *i, int b, int t, int C) {
    calls[C_POOL_F]++;
    CPU->mean_pool_forward(o, i, b, t, C);
}
static void s_pool_b(float *di, const float *d, int b, int t, int C) {
    calls[C_POOL_B]++;
    CPU->mean_pool_backward(di, d, b, t, C);
}
static void s_resid(float *o, const float *a, const float *b, int64_t n) {
    calls[C_RESID]++;
    CPU->residual_forward(o, a, b, n);
}
static void s_ce_f(float *l, const float *lg, const int32_t *tg, int64_t N, int V) {
    calls[C_CE_F]++;
    CPU->crossentropy_forward(l, lg, tg, N, V);
}
static void s_ce_b(float *lg, const int32_t *tg, int64_t N, int V, float dscale,
                   const float *rw) {
    calls[C_CE_B]++;
    CPU->crossentropy_softmax_backward(lg, tg, N, V, dscale, rw);
}
static void s_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                    float b2, float eps, float wd, int64_t step, float gs) {
    calls[C_ADAMW]++;
    CPU->adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, step, gs);
}
static double s_sumsq(const float *x, int64_t n) {
    calls[C_SUMSQ]++;
    return CPU->sum_squares(x, n);
}
static void s_scale(float *x, int64_t n, float s) {
    calls[C_SCALE]++;
    CPU->scale_inplace(x, n, s);
}

static loom_backend counting = {
    .name = "counting",
    .matmul_forward = s_matmul_f, .matmul_backward = s_matmul_b,
    .matmul_backward_set = s_matmul_bs, .gelu_backward_set = s_gelu_bs,
    .layernorm_forward = s_ln_f, .layernorm_backward = s_ln_b,
    .rmsnorm_forward = s_rms_f, .rmsnorm_backward = s_rms_b,
    .gelu_forward = s_gelu_f, .gelu_backward = s_gelu_b,
    .swiglu_forward = s_swiglu_f, .swiglu_backward = s_swiglu_b,
    .rope_tables = s_rope_t, .rope_forward = s_rope_f, .rope_backward = s_rope_b,
    .attention_forward = s_sdpa_f, .attention_backward = s_sdpa_b,
    .flash_attention_forward = s_flash_f, .flash_attention_backward = s_flash_b,
    .flash_attention_backward_set = s_flash_bs,
    .attention_decode = s_decode,
    .embedding_forward = s_emb_f, .embedding_backward = s_emb_b,
    .mean_pool_forward = s_pool_f, .mean_pool_backward = s_pool_b,
    .residual_forward = s_resid,
    .crossentropy_forward = s_ce_f, .crossentropy_softmax_backward = s_ce_b,
    .adamw_update = s_adamw, .sum_squares = s_sumsq, .scale_inplace = s_scale,
};

/* the memory ops (and the reductions that replaced host loops) are the cpu table's: the
 * counting shims are about the compute ops */
static void counting_init(void) {
    const loom_backend *c = CPU;
    counting.mem_alloc = c->mem_alloc;
    counting.mem_free = c->mem_free;
    counting.mem_h2d = c->mem_h2d;
    counting.mem_d2h = c->mem_d2h;
    counting.mem_d2d = c->mem_d2d;
    counting.mem_set = c->mem_set;
    counting.mem_d2d_rows = c->mem_d2d_rows;
    counting.mem_release = c->mem_release;
    counting.mem_sync = c->mem_sync;
    counting.comm_begin = c->comm_begin;
    counting.comm_end = c->comm_end;
    counting.sum_double = c->sum_double;
    counting.add_inplace = c->add_inplace;
    counting.crossentropy_shard_losses = c->crossentropy_shard_losses;
}

/* ---- what one configuration computes ------------------------------------------------------ */
typedef struct result {
    float loss, loss2;
    float *logits, *grads, *decoded;
    size_t nlogits, n;
    float norm[2];
    uint64_t hash;
} result;

static void run(loom_model_config c, const loom_backend *be, result *r) {
    c.backend = be;
    const int cls = c.head == LOOM_HEAD_CLASSIFY;
    int32_t x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)(loom_rng_u64(5, 1, (uint64_t)i) % (uint64_t)c.vocab_size);
        y[i] = (int32_t)(loom_rng_u64(5, 2, (uint64_t)i) %
                         (uint64_t)(cls ? c.num_classes : c.vocab_size));
    }
    loom_err err = {{0}};
    /* the model: forward, backward, and (lm) decoding */
    loom_model *m = NULL;
    if (loom_model_create(&c, NULL, B, T, &m, &err)) fail_msg("%s", err.msg);
    assert_ptr_equal(loom_model_backend(m), be);
    loom_model_init_weights(m, 4);
    loom_model_zero_grad(m);
    r->loss = loom_model_forward(m, x, y, B, T);
    r->nlogits = (size_t)(cls ? B * c.num_classes : B * T * c.vocab_size);
    r->logits = malloc(r->nlogits * sizeof(float));
    loom_model_read_logits(m, r->logits, 0, r->nlogits); /* device memory: read back */
    loom_model_backward(m, 1.0f / (float)loom_model_valid_targets(m));
    r->n = loom_model_num_params(m);
    r->grads = malloc(r->n * sizeof(float));
    be->mem_d2h(r->grads, loom_model_grads(m), r->n * sizeof(float));
    r->decoded = NULL;
    if (!cls) {
        loom_kv_cache *kc = loom_kv_cache_create(m);
        const float *lg = NULL;
        for (int p = 0; p < T; p++) lg = loom_model_decode(m, kc, x[p]);
        r->decoded = malloc((size_t)c.vocab_size * sizeof(float));
        memcpy(r->decoded, lg, (size_t)c.vocab_size * sizeof(float));
        loom_kv_cache_free(kc);
    }
    loom_model_free(m);

    /* the optimizer: two steps of data-parallel AdamW (one rank) with clipping */
    loom_mesh_spec spec;
    loom_mesh_spec_default(&spec);
    loom_mesh *mesh = NULL;
    loom_dp *dp = NULL;
    assert_int_equal(loom_mesh_create(&spec, NULL, &mesh, &err), 0);
    if (loom_model_create_ex(&c, B, T, 0, &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(loom_dp_create(m, mesh, 1, 7, 0.9f, 0.95f, 1e-8f, 0.1f, &dp, &err), 0);
    for (int s = 0; s < 2; s++) {
        loom_dp_begin_micro(dp, 1, 1);
        const float l = loom_model_forward(m, x, y, B, T);
        if (s == 1) r->loss2 = l;
        loom_model_backward(m, 1.0f / (float)loom_model_valid_targets(m));
        r->norm[s] = loom_dp_finish_grads(dp, 1e-3f); /* clips, inside adamw_update */
        loom_dp_step(dp, 1e-2f);
    }
    r->hash = loom_dp_param_hash(dp);
    loom_dp_free(dp);
    loom_model_free(m);
    loom_mesh_free(mesh);
}

static void result_free(result *r) {
    free(r->logits);
    free(r->grads);
    free(r->decoded);
}

static const loom_model_config GPT2 = {
    .flavor = LOOM_FLAVOR_GPT2, .vocab_size = 29, .max_seq_len = 8, .n_layer = 2, .n_head = 2,
    .n_kv_head = 2, .d_model = 16, .d_ff = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.1f};
static const loom_model_config LLAMA = {
    .flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 31, .max_seq_len = 8, .n_layer = 2, .n_head = 4,
    .n_kv_head = 2, .d_model = 16, .d_ff = 24, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.1f};

static void test_model_calls_through_table(void **state) {
    (void)state;
    counting_init();
    long seen[C_COUNT] = {0};
    for (int k = 0; k < 6; k++) {
        loom_model_config c = k % 2 ? LLAMA : GPT2;
        const int gpt2 = k % 2 == 0, sdpa = k >= 2 && k < 4, cls = k >= 4;
        if (sdpa) c.attention = LOOM_ATTN_SDPA;
        if (cls) {
            c.head = LOOM_HEAD_CLASSIFY;
            c.num_classes = 3;
        }
        result ref, got;
        memset(calls, 0, sizeof calls);
        run(c, loom_backend_cpu(), &ref);
        for (int o = 0; o < C_COUNT; o++) assert_int_equal(calls[o], 0); /* cpu: no shim */
        run(c, &counting, &got);
        /* the cpu-guard backend (the cpu kernels over memory the host cannot touch) computes
         * the same bits, and the host touched none of its memory (it would have faulted) */
        result gd;
        run(c, loom_backend_guard(), &gd);
        assert_memory_equal(&gd.loss, &ref.loss, sizeof(float));
        assert_memory_equal(&gd.loss2, &ref.loss2, sizeof(float));
        assert_memory_equal(gd.logits, ref.logits, ref.nlogits * sizeof(float));
        assert_memory_equal(gd.grads, ref.grads, ref.n * sizeof(float));
        if (!cls) assert_memory_equal(gd.decoded, ref.decoded, (size_t)c.vocab_size * 4);
        assert_memory_equal(gd.norm, ref.norm, sizeof ref.norm);
        assert_true(gd.hash == ref.hash);
        result_free(&gd);

        /* bitwise the plain cpu table's results */
        assert_memory_equal(&got.loss, &ref.loss, sizeof(float));
        assert_memory_equal(&got.loss2, &ref.loss2, sizeof(float));
        assert_memory_equal(got.logits, ref.logits, ref.nlogits * sizeof(float));
        assert_memory_equal(got.grads, ref.grads, ref.n * sizeof(float));
        if (!cls) assert_memory_equal(got.decoded, ref.decoded, (size_t)c.vocab_size * 4);
        assert_memory_equal(got.norm, ref.norm, sizeof ref.norm);
        assert_true(got.hash == ref.hash);

        /* each op this configuration uses went through the table, and no other */
        int want[C_COUNT] = {0};
        const int always[] = {C_MATMUL_F, C_MATMUL_BS, C_EMB_F, C_EMB_B, C_RESID, C_CE_F,
                              C_CE_B, C_ADAMW, C_SUMSQ};
        for (size_t i = 0; i < sizeof always / sizeof always[0]; i++) want[always[i]] = 1;
        want[gpt2 ? C_LN_F : C_RMS_F] = want[gpt2 ? C_LN_B : C_RMS_B] = 1;
        /* a fresh gradient buffer is overwritten (the _set ops), not zeroed and accumulated
         * into: the classifier head's matmul_backward and llama's swiglu_backward remain */
        want[gpt2 ? C_GELU_F : C_SWIGLU_F] = want[gpt2 ? C_GELU_BS : C_SWIGLU_B] = 1;
        if (cls) want[C_MATMUL_B] = 1;
        if (!gpt2) want[C_ROPE_T] = want[C_ROPE_F] = want[C_ROPE_B] = 1;
        want[sdpa ? C_SDPA_F : C_FLASH_F] = want[sdpa ? C_SDPA_B : C_FLASH_BS] = 1;
        if (!cls) want[C_DECODE] = 1;
        if (cls) want[C_POOL_F] = want[C_POOL_B] = 1;
        for (int o = 0; o < C_COUNT; o++) {
            if ((calls[o] > 0) != want[o])
                fail_msg("config %d: %s called %ld times through the table", k, op_names[o],
                         calls[o]);
            seen[o] += calls[o];
        }
        /* per-layer ops once per layer and pass (model forward, two dp forwards; decode: one
         * per layer per token) */
        assert_int_equal(calls[gpt2 ? C_LN_F : C_RMS_F],
                         3 * (2 * c.n_layer + 1) + (cls ? 0 : T * (2 * c.n_layer + 1)));
        assert_int_equal(calls[C_CE_B], 3);
        result_free(&ref);
        result_free(&got);
    }
    /* scale_inplace stays in the table for other callers; the trainer's gradient clipping
     * runs inside adamw_update (above: no configuration calls scale_inplace); gelu_backward
     * (+=) and flash_attention_backward (+=, context parallelism's ring sums chunks with it)
     * too: the block overwrites its fresh buffers with the _set ops */
    for (int o = 0; o < C_COUNT; o++)
        if (!seen[o] && o != C_SCALE && o != C_GELU_B && o != C_FLASH_B)
            fail_msg("%s never called through the table", op_names[o]);
}

/* The _set ops overwrite dinp: on a dinp full of NaN they give bitwise what zeroing it and
 * the accumulating op give (sizes on both sides of the one-thread GEMM threshold and the
 * elementwise threading threshold); the weight and bias gradients still accumulate. */
static void test_backward_set(void **state) {
    (void)state;
    const int shapes[3][3] = {{37, 19, 23}, {2048, 256, 64}, {300, 1024, 256}};
    for (int s = 0; s < 3; s++) {
        const int64_t N = shapes[s][0];
        const int IC = shapes[s][1], OC = shapes[s][2];
        float *dout = malloc((size_t)(N * OC) * 4), *inp = malloc((size_t)(N * IC) * 4);
        float *w = malloc((size_t)OC * IC * 4);
        float *di[2], *dw[2], *db[2];
        for (int k = 0; k < 2; k++) {
            di[k] = malloc((size_t)(N * IC) * 4);
            dw[k] = malloc((size_t)OC * IC * 4);
            db[k] = malloc((size_t)OC * 4);
        }
        for (int64_t i = 0; i < N * OC; i++) dout[i] = (float)loom_rng_normal(1, 1, (uint64_t)i);
        for (int64_t i = 0; i < N * IC; i++) inp[i] = (float)loom_rng_normal(1, 2, (uint64_t)i);
        for (int64_t i = 0; i < (int64_t)OC * IC; i++)
            w[i] = (float)loom_rng_normal(1, 3, (uint64_t)i);
        for (int k = 0; k < 2; k++) {
            for (int64_t i = 0; i < (int64_t)OC * IC; i++) dw[k][i] = 0.5f;
            for (int i = 0; i < OC; i++) db[k][i] = -0.25f;
        }
        memset(di[0], 0, (size_t)(N * IC) * 4);
        for (int64_t i = 0; i < N * IC; i++) di[1][i] = NAN;
        CPU->matmul_backward(di[0], dw[0], db[0], dout, inp, w, N, IC, OC);
        CPU->matmul_backward_set(di[1], dw[1], db[1], dout, inp, w, N, IC, OC);
        assert_memory_equal(di[1], di[0], (size_t)(N * IC) * 4);
        assert_memory_equal(dw[1], dw[0], (size_t)OC * IC * 4);
        assert_memory_equal(db[1], db[0], (size_t)OC * 4);
        assert_true(dw[0][0] != 0.5f); /* accumulated onto what was there */

        const int64_t n = N * IC;
        memset(di[0], 0, (size_t)n * 4);
        for (int64_t i = 0; i < n; i++) di[1][i] = NAN;
        CPU->gelu_backward(di[0], inp, dout, n < N * OC ? n : N * OC);
        CPU->gelu_backward_set(di[1], inp, dout, n < N * OC ? n : N * OC);
        assert_memory_equal(di[1], di[0], (size_t)(n < N * OC ? n : N * OC) * 4);
        for (int k = 0; k < 2; k++) {
            free(di[k]);
            free(dw[k]);
            free(db[k]);
        }
        free(dout);
        free(inp);
        free(w);
    }

    /* flash attention on fused q|k|v rows (GQA, T and D not multiples of the tile and the
     * vector), causal, with and without documents, on 1 thread (the fused backward) and 3
     * (the two passes): the _set op on NaN-filled gradients gives the bits of zeroing them
     * and the accumulating op */
    enum { FB = 2, FT = 100, FH = 4, FKVH = 2, FD = 24 };
    const int R = (FH + 2 * FKVH) * FD, HD = FH * FD, KD = FKVH * FD;
    const size_t nq = (size_t)FB * FT * R, no = (size_t)FB * FT * HD;
    float *qkv = malloc(nq * 4), *o = malloc(no * 4), *dout = malloc(no * 4);
    float *lse = malloc((size_t)FB * FH * FT * 4), *g[2] = {malloc(nq * 4), malloc(nq * 4)};
    int32_t docs[FB * FT];
    for (size_t i = 0; i < nq; i++) qkv[i] = (float)loom_rng_normal(2, 1, (uint64_t)i);
    for (size_t i = 0; i < no; i++) dout[i] = (float)loom_rng_normal(2, 2, (uint64_t)i);
    for (int i = 0; i < FB * FT; i++) docs[i] = i % FT < 37 ? 0 : 1;
    const loom_attn_dims dims = flash_attention_dims_qkv(FB, FT, FH, FKVH, FD);
    const int threads = omp_get_max_threads();
    for (int withdocs = 0; withdocs < 2; withdocs++) {
        loom_attn_mask mk = {.causal = 1};
        if (withdocs) {
            mk.q_doc = mk.k_doc = docs;
            mk.q_doc_bs = mk.k_doc_bs = FT;
        }
        assert_int_equal(CPU->flash_attention_forward(o, lse, qkv, qkv + HD, qkv + HD + KD,
                                                      &dims, &mk), 0);
        for (int nt = 1; nt <= 3; nt += 2) {
            omp_set_num_threads(nt);
            memset(g[0], 0, nq * 4);
            for (size_t i = 0; i < nq; i++) g[1][i] = NAN;
            assert_int_equal(CPU->flash_attention_backward(g[0], g[0] + HD, g[0] + HD + KD,
                                                           dout, qkv, qkv + HD, qkv + HD + KD,
                                                           o, lse, &dims, &mk), 0);
            assert_int_equal(CPU->flash_attention_backward_set(g[1], g[1] + HD,
                                                               g[1] + HD + KD, dout, qkv,
                                                               qkv + HD, qkv + HD + KD, o, lse,
                                                               &dims, &mk), 0);
            assert_memory_equal(g[1], g[0], nq * 4);
        }
        omp_set_num_threads(threads);
    }
    free(qkv);
    free(o);
    free(dout);
    free(lse);
    free(g[0]);
    free(g[1]);
}

static void test_backend_key(void **state) {
    (void)state;
    assert_ptr_equal(loom_backend_find("cpu"), loom_backend_cpu());
    assert_null(loom_backend_find("cuda"));
    assert_string_equal(loom_backend_cpu()->name, "cpu");
    const char *vals[3] = {NULL, "cpu", "cuda"};
    for (int i = 0; i < 3; i++) {
        loom_config *cfg = loom_config_new();
        loom_err err = {{0}};
        assert_int_equal(loom_config_load_string(cfg, "model:\n  d_model: 16\n", "t.yaml", &err), 0);
        if (vals[i]) loom_config_set(cfg, "model.backend", vals[i], "--set");
        assert_int_equal(loom_config_apply_schema(cfg, loom_model_config_keys,
                                                  loom_model_config_nkeys, &err), 0);
        loom_model_config mc;
        if (i < 2) {
            if (loom_model_config_from(cfg, 8, &mc, &err)) fail_msg("%s", err.msg);
            assert_ptr_equal(mc.backend, loom_backend_cpu());
        } else {
            TU_ASSERT_ERR(loom_model_config_from(cfg, 8, &mc, TU_ERR), "model.backend", "cuda",
                          "unknown backend");
        }
        loom_config_free(cfg);
    }
    /* a zeroed config (backend NULL) gets the cpu table */
    loom_model *m = NULL;
    loom_err err = {{0}};
    if (loom_model_create(&GPT2, NULL, B, T, &m, &err)) fail_msg("%s", err.msg);
    assert_ptr_equal(loom_model_backend(m), loom_backend_cpu());
    assert_ptr_equal(loom_model_get_config(m)->backend, loom_backend_cpu());
    loom_model_free(m);

    /* model.backend: cpu-guard; the environment's LOOM_BACKEND overrides the key (and is what
     * a config without one gets); an unknown name there is an error naming the variable */
    assert_ptr_equal(loom_backend_find("cpu-guard"), loom_backend_guard());
    const char *envs[3] = {NULL, "cpu-guard", "gpu"};
    for (int i = 0; i < 3; i++) {
        loom_config *cfg = loom_config_new();
        assert_int_equal(loom_config_load_string(cfg, "model:\n  d_model: 16\n", "t.yaml", &err), 0);
        loom_config_set(cfg, "model.backend", i == 0 ? "cpu-guard" : "cpu", "--set");
        assert_int_equal(loom_config_apply_schema(cfg, loom_model_config_keys,
                                                  loom_model_config_nkeys, &err), 0);
        if (envs[i]) setenv("LOOM_BACKEND", envs[i], 1);
        loom_model_config mc;
        if (i < 2) {
            if (loom_model_config_from(cfg, 8, &mc, &err)) fail_msg("%s", err.msg);
            assert_ptr_equal(mc.backend, loom_backend_guard());
        } else {
            TU_ASSERT_ERR(loom_model_config_from(cfg, 8, &mc, TU_ERR), "LOOM_BACKEND", "gpu",
                          "unknown backend");
        }
        unsetenv("LOOM_BACKEND");
        loom_config_free(cfg);
    }
    setenv("LOOM_BACKEND", "cpu-guard", 1);
    if (loom_model_create(&GPT2, NULL, B, T, &m, &err)) fail_msg("%s", err.msg);
    assert_ptr_equal(loom_model_backend(m), loom_backend_guard());
    loom_model_free(m);
    unsetenv("LOOM_BACKEND");
}

static void test_adamw_grad_scale(void **state) {
    (void)state;
    const int64_t n = 40000; /* above LOOM_PAR_MIN: the threaded loop */
    float *buf = malloc(sizeof(float) * (size_t)n * 9);
    assert_non_null(buf);
    float *g = buf, *g2 = g + n, *p[2] = {g2 + n, g2 + 2 * n}, *m[2] = {g2 + 3 * n, g2 + 4 * n};
    float *v[2] = {g2 + 5 * n, g2 + 6 * n};
    uint64_t x = 88172645463325252ULL;
    for (int64_t i = 0; i < n; i++) {
        float r[4];
        for (int k = 0; k < 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            r[k] = (float)((double)(x >> 11) / 9007199254740992.0) - 0.5f;
        }
        g[i] = r[0] * 3.0f;
        p[0][i] = p[1][i] = r[1];
        m[0][i] = m[1][i] = r[2] * 0.1f;
        v[0][i] = v[1][i] = r[3] * r[3] * 0.01f;
    }
    const float scales[] = {0.37f, 1e-3f, 0.999999f, 1.0f};
    for (int s = 0; s < 4; s++) {
        memcpy(g2, g, sizeof(float) * (size_t)n);
        CPU->scale_inplace(g2, n, scales[s]);
        CPU->adamw_update(p[0], g2, m[0], v[0], n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s + 1, 1.0f);
        CPU->adamw_update(p[1], g, m[1], v[1], n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s + 1,
                          scales[s]);
        assert_memory_equal(p[0], p[1], sizeof(float) * (size_t)n);
        assert_memory_equal(m[0], m[1], sizeof(float) * (size_t)n);
        assert_memory_equal(v[0], v[1], sizeof(float) * (size_t)n);
    }
    /* at a level with FMA: exactly the scalar loop's contractions (src/kernels/adamw.c), in
     * the vectorized loop too: m = fma(g - m, 1-b1, m), v = fma(v, b2, (1-b2) g g),
     * p = fma(-(m / (sqrt(v) / sqrt(1-b2^t) + eps)), lr / (1-b1^t), p decay) */
    const loom_isa isa = loom_isa_active();
    if (isa == LOOM_ISA_AVX2 || isa == LOOM_ISA_AVX512) {
        memcpy(p[0], p[1], sizeof(float) * (size_t)n);
        memcpy(m[0], m[1], sizeof(float) * (size_t)n);
        memcpy(v[0], v[1], sizeof(float) * (size_t)n);
        const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
        const int64_t t = 7;
        const float decay = (float)(1.0 - (double)lr * (double)wd);
        const float w1 = (float)(1.0 - (double)b1), w2 = (float)(1.0 - (double)b2);
        const float ss = (float)((double)lr / (1.0 - pow((double)b1, (double)t)));
        const float bc2 = (float)sqrt(1.0 - pow((double)b2, (double)t));
        for (int64_t i = 0; i < n; i++) {
            const float gi = g[i] * gs, pi = p[0][i] * decay;
            const float w2g = w2 * gi, gg = w2g * gi;
            const float mi = fmaf(gi - m[0][i], w1, m[0][i]), vi = fmaf(v[0][i], b2, gg);
            const float sq = sqrtf(vi), den = sq / bc2 + eps, q = mi / den;
            p[0][i] = fmaf(-q, ss, pi);
            m[0][i] = mi;
            v[0][i] = vi;
        }
        CPU->adamw_update(p[1], g, m[1], v[1], n, lr, b1, b2, eps, wd, t, gs);
        assert_memory_equal(p[0], p[1], sizeof(float) * (size_t)n);
        assert_memory_equal(m[0], m[1], sizeof(float) * (size_t)n);
        assert_memory_equal(v[0], v[1], sizeof(float) * (size_t)n);
    }
    /* a parameter's bits do not depend on where it sits in the call (the vectorized loop and
     * its scalar remainder): one call over n against n calls of one element */
    for (int64_t i = 0; i < n; i++)
        CPU->adamw_update(p[0] + i, g + i, m[0] + i, v[0] + i, 1, 3e-4f, 0.9f, 0.95f, 1e-8f,
                          0.1f, 5, 0.5f);
    CPU->adamw_update(p[1], g, m[1], v[1], n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f);
    assert_memory_equal(p[0], p[1], sizeof(float) * (size_t)n);
    assert_memory_equal(m[0], m[1], sizeof(float) * (size_t)n);
    assert_memory_equal(v[0], v[1], sizeof(float) * (size_t)n);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_calls_through_table),
        cmocka_unit_test(test_adamw_grad_scale),
        cmocka_unit_test(test_backward_set),
        cmocka_unit_test(test_backend_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
