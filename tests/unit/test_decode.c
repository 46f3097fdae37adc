/* Incremental decoding with a KV cache against the full forward: at every position of a
 * sequence, loom_model_decode's next-token logits equal the last row of a forward over the
 * whole prefix (max relative error 1e-5: one-row GEMMs and the cached attention sum in another
 * order), for GPT-2 and for Llama with grouped-query attention, up to max_seq_len. */
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama_gqa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
