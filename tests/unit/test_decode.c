/* Incremental decoding with a KV cache against the full forward: at every position of a
 * sequence, loom_model_decode's next-token logits equal the last row of a forward over the
 * whole prefix (max relative error 1e-5: one-row GEMMs and the cached attention sum in another
 * order), for GPT-2 and for Llama with grouped-query attention, up to max_seq_len. With
 * sliding windows (alternating layers), soft-capped scores, a custom scale and a local RoPE
 * base: the same, with each sliding layer's cache a ring of its window (the cache's bytes are
 * counted), and the batched decode (the engine's) fed a prefill chunk longer than the window
 * gives the full forward's logits too. And OLMo 2's features (post-norms, whole-projection q/k
 * norms) and Gemma's block features (sandwich norms, GeGLU, the embedding scale, final-logit
 * soft-capping, per-head q/k norms, tied), also through the batched step with two sequences
 * (prefilled together, then one token each; also with --weights bf16): the soft-capped logits
 * of the full forward. */
#include "testutil.h"

#include <math.h>

#include "loom/model.h"

static void check_flavor(const loom_model_config *cfg, uint64_t seed) {
    loom_err err = {{0}};
    loom_model *m = NULL;
    const int T = cfg->max_seq_len, V = cfg->vocab_size;
    assert_int_equal(loom_model_create(cfg, NULL, 1, T, &m, &err), 0);
    loom_model_init_weights(m, seed);
    int32_t tokens[64];
    for (int i = 0; i < T; i++) tokens[i] = (int32_t)(loom_rng_u64(seed, 7, (uint64_t)i) % (uint64_t)V);
    loom_kv_cache *kc = loom_kv_cache_create(m);
    float *dec = calloc((size_t)V, sizeof(float));
    double worst = 0;
    for (int p = 0; p < T; p++) {
        memcpy(dec, loom_model_decode(m, kc, tokens[p]), (size_t)V * sizeof(float));
        assert_int_equal(loom_kv_cache_len(kc), p + 1);
        const float *full = loom_model_next_logits(m, tokens, p + 1);
        double num = 0, den = 0;
        for (int v = 0; v < V; v++) {
            num = fmax(num, fabs((double)dec[v] - full[v]));
            den = fmax(den, fabs((double)full[v]));
        }
        worst = fmax(worst, num / den);
    }
    print_message("flavor %d: max relative logit error over %d positions: %.2e\n", cfg->flavor, T, worst);
    assert_true(worst <= 1e-5);
    /* a reset cache reproduces the same logits bit for bit */
    float *again = malloc((size_t)V * sizeof(float));
    loom_kv_cache_reset(kc);
    for (int p = 0; p < T; p++) memcpy(again, loom_model_decode(m, kc, tokens[p]), (size_t)V * sizeof(float));
    assert_memory_equal(again, dec, (size_t)V * sizeof(float));
    free(again);
    free(dec);
    loom_kv_cache_free(kc);
    loom_model_free(m);
}

static void test_gpt2(void **state) {
    (void)state;
    const loom_model_config cfg = {.flavor = LOOM_FLAVOR_GPT2, .vocab_size = 97, .max_seq_len = 40,
                                   .n_layer = 2, .n_head = 4, .n_kv_head = 4, .d_model = 64,
                                   .d_ff = 256, .norm_eps = 1e-5f, .init_std = 0.2f};
    check_flavor(&cfg, 3);
}

static void test_llama_gqa(void **state) {
    (void)state;
    const loom_model_config cfg = {.flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 256, .max_seq_len = 48,
                                   .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 64,
                                   .d_ff = 96, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                                   .init_std = 0.2f};
    check_flavor(&cfg, 4);
}

/* The batched decode (loom_model_decode_batch: the engine's) on one sequence: a prefill
 * chunk of n0 rows (longer than the window: written and attended row by row into the ring),
 * then one row at a time; every step's logits against the full forward's. */
static void check_batched(loom_model *m, const int32_t *tokens, int T, int n0) {
    const int V = loom_model_get_config(m)->vocab_size;
    const size_t nf = loom_model_kv_floats(m, T);
    float *k = calloc(nf, sizeof(float)), *v = calloc(nf, sizeof(float));
    loom_decode_ws *w = loom_decode_ws_create(m, n0, 1);
    double worst = 0;
    for (int p = 0; p < T;) {
        const int n = p == 0 ? n0 : 1;
        loom_decode_seg seg = {.k = k, .v = v, .cap = T, .pos0 = p, .n = n, .want_logits = 1};
        const float *lg = loom_model_decode_batch(m, w, tokens + p, &seg, 1);
        float *dec = malloc((size_t)V * sizeof(float));
        memcpy(dec, lg, (size_t)V * sizeof(float));
        p += n;
        const float *full = loom_model_next_logits(m, tokens, p);
        double num = 0, den = 0;
        for (int x = 0; x < V; x++) {
            num = fmax(num, fabs((double)dec[x] - full[x]));
            den = fmax(den, fabs((double)full[x]));
        }
        worst = fmax(worst, num / den);
        free(dec);
    }
    print_message("batched, a prefill of %d rows then single rows: max relative error %.2e\n", n0,
                  worst);
    assert_true(worst <= 1e-5);
    loom_decode_ws_free(w);
    free(k);
    free(v);
}

static void test_sliding_window(void **state) {
    (void)state;
    loom_model_config cfg = {.flavor = LOOM_FLAVOR_ARCH, .vocab_size = 200, .max_seq_len = 40,
                             .n_layer = 3, .n_head = 4, .n_kv_head = 2, .d_model = 64,
                             .d_ff = 96, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                             .init_std = 0.2f};
    cfg.arch = *loom_arch_named("llama");
    /* layers 0 and 2 slide (window 5), layer 1 attends fully (Gemma 2's alternation) */
    cfg.arch.sliding_window = 5;
    cfg.arch.window_period = 2;
    check_flavor(&cfg, 5);
    /* the Gemma-style scores too: soft-capping, query_pre_attn_scalar, the local RoPE base */
    cfg.arch.attn_softcap = 3.0f;
    cfg.arch.query_pre_attn_scalar = 24.0f;
    cfg.arch.rope_local_theta = 500.0f;
    check_flavor(&cfg, 6);

    loom_err err = {{0}};
    loom_model *m = NULL;
    assert_int_equal(loom_model_create(&cfg, NULL, 1, cfg.max_seq_len, &m, &err), 0);
    loom_model_init_weights(m, 7);
    /* the cache: 5 rows for each sliding layer, max_seq_len for the full one */
    assert_int_equal(loom_model_kv_slots(m, 0, 40), 5);
    assert_int_equal(loom_model_kv_slots(m, 1, 40), 40);
    assert_int_equal(loom_model_kv_slots(m, 2, 3), 3); /* a cache shorter than the window */
    loom_kv_cache *kc = loom_kv_cache_create(m);
    const size_t row = 2 * 16 * sizeof(float); /* KVH * D floats */
    assert_int_equal(loom_kv_cache_bytes(kc), 2 * (5 + 40 + 5) * row);
    loom_kv_cache_free(kc);
    int32_t tokens[40];
    for (int i = 0; i < 40; i++) tokens[i] = (int32_t)(loom_rng_u64(8, 7, (uint64_t)i) % 200u);
    check_batched(m, tokens, 40, 13);
    /* the window changes the logits (so the checks above see it) */
    float *win = malloc(200 * sizeof(float));
    memcpy(win, loom_model_next_logits(m, tokens, 30), 200 * sizeof(float));
    loom_model_free(m);
    cfg.arch.sliding_window = 0;
    cfg.arch.rope_local_theta = 0.0f;
    assert_int_equal(loom_model_create(&cfg, NULL, 1, cfg.max_seq_len, &m, &err), 0);
    loom_model_init_weights(m, 7);
    const float *full = loom_model_next_logits(m, tokens, 30);
    double d = 0;
    for (int x = 0; x < 200; x++) d = fmax(d, fabs((double)full[x] - win[x]));
    print_message("window vs full attention: max logit difference %.3g\n", d);
    assert_true(d > 1e-3);
    free(win);
    loom_model_free(m);
}

/* the batched (ragged) step: two sequences prefilled in one step, then one token each; bf16:
 * 1 with --weights bf16, 2 with --compute bf16, 3 with --weights int8 (the logits against the
 * fp32 full forward's, within bf16's rounding, or Q8_0's) */
static void check_two_sequences(const loom_model_config *cfg, uint64_t seed, int bf16) {
    loom_err err = {{0}};
    loom_model *m = NULL, *mb = NULL;
    const int T = cfg->max_seq_len, V = cfg->vocab_size, n[2] = {T / 2, T - 3};
    assert_int_equal(loom_model_create(cfg, NULL, 1, T, &m, &err), 0);
    loom_model_init_weights(m, seed);
    if (bf16) { /* the same weights, rounded to bf16 */
        assert_int_equal(loom_model_create_view(cfg, NULL, 1, T, LOOM_MODEL_INFER, &mb, &err), 0);
        loom_model_init_weights(mb, seed);
        if ((bf16 == 3 ? loom_model_set_weights_int8
             : bf16 == 2 ? loom_model_set_compute_bf16 : loom_model_set_weights_bf16)(mb, &err))
            fail_msg("%s", err.msg);
    }
    int32_t tok[2][64], rows[128];
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < T; t++)
            tok[i][t] = (int32_t)(loom_rng_u64(seed, 9 + (uint64_t)i, (uint64_t)t) % (uint64_t)V);
    const size_t kvf = loom_model_kv_floats(m, T);
    float *kv = calloc(4 * kvf, sizeof(float));
    loom_decode_seg seg[2];
    for (int i = 0; i < 2; i++)
        seg[i] = (loom_decode_seg){.k = kv + 2 * i * kvf, .v = kv + (2 * i + 1) * kvf, .cap = T,
                                   .pos0 = 0, .n = n[i], .want_logits = 1};
    loom_decode_ws *w = loom_decode_ws_create(bf16 ? mb : m, n[0] + n[1], 2);
    double worst = 0, maxlog = 0;
    for (int step = 0; step < 2; step++) {
        int r = 0;
        for (int i = 0; i < 2; i++)
            for (int t = 0; t < seg[i].n; t++) rows[r++] = tok[i][seg[i].pos0 + t];
        const float *lg = loom_model_decode_batch(bf16 ? mb : m, w, rows, seg, 2);
        float got[2][512];
        memcpy(got[0], lg, (size_t)V * sizeof(float));
        memcpy(got[1], lg + V, (size_t)V * sizeof(float));
        for (int i = 0; i < 2; i++) {
            const float *full = loom_model_next_logits(m, tok[i], seg[i].pos0 + seg[i].n);
            double num = 0, den = 0;
            for (int v = 0; v < V; v++) {
                num = fmax(num, fabs((double)got[i][v] - full[v]));
                den = fmax(den, fabs((double)full[v]));
            }
            worst = fmax(worst, num / den);
            maxlog = fmax(maxlog, den);
            seg[i].pos0 += seg[i].n; /* the next step: one token */
            seg[i].n = 1;
        }
    }
    print_message("flavor %d: batched step%s, max relative logit error %.2e (max |logit| %.3f)\n",
                  cfg->flavor, bf16 == 3 ? " (int8 weights)" : bf16 == 2 ? " (bf16 compute)"
                  : bf16 ? " (bf16 weights)" : "", worst,
                  maxlog);
    /* with the soft-cap: the logits are capped, and these reach where tanh bends */
    const float cap = cfg->arch.final_softcap;
    if (cap > 0.0f) assert_true(maxlog <= cap && maxlog > 0.7 * cap);
    assert_true(worst <= (bf16 == 3 ? 6e-2 : bf16 ? 3e-2 : 1e-5));
    loom_decode_ws_free(w);
    loom_model_free(mb);
    free(kv);
    loom_model_free(m);
}

static loom_model_config arch_cfg(int gemma) {
    loom_model_config c = {.flavor = LOOM_FLAVOR_ARCH, .vocab_size = 256, .max_seq_len = 40,
                           .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 64, .d_ff = 96,
                           .norm_eps = 1e-5f, .rope_theta = 10000.0f, .init_std = 0.2f};
    c.arch = *loom_arch_named(gemma ? "llama" : "olmo2");
    if (gemma) {
        c.arch.norm_place = LOOM_NORM_SANDWICH;
        c.arch.mlp = LOOM_MLP_GEGLU;
        c.arch.embed_scale = 1;
        c.arch.final_softcap = 6.0f; /* these logits reach where tanh bends */
        c.arch.qk_norm = LOOM_QK_NORM_HEAD;
        c.arch.tied = 1;
    }
    return c;
}

static void test_olmo2(void **state) {
    (void)state;
    const loom_model_config c = arch_cfg(0);
    check_flavor(&c, 5);
    check_two_sequences(&c, 5, 0);
    check_two_sequences(&c, 5, 1);
    check_two_sequences(&c, 5, 2);
    check_two_sequences(&c, 5, 3);
}

static void test_gemma_features(void **state) {
    (void)state;
    const loom_model_config c = arch_cfg(1);
    check_flavor(&c, 6);
    check_two_sequences(&c, 6, 0);
    check_two_sequences(&c, 6, 1);
    check_two_sequences(&c, 6, 2);
    check_two_sequences(&c, 6, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama_gqa),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_olmo2),
        cmocka_unit_test(test_gemma_features),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
