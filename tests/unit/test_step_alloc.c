/* The step loop does not allocate (DESIGN section 3): loom_train_engine_step (what `loom train`
 * runs for one optimizer step: forward, backward, clipping, AdamW) makes no allocation once the
 * first steps have run, for the dense flavors and for mixture-of-experts layers (routing,
 * capacity, shared experts, the router's backward), with gradient accumulation and recompute.
 * Counted by loom_alloc_calls (every loom_malloc/_calloc/_realloc/_alloc_aligned). */
#include "testutil.h"

#include "loom/config.h"
#include "loom/train.h"

static const char *BASE = "run:\n"
                          "  dir: /nonexistent\n"
                          "data:\n"
                          "  train: /nonexistent\n"
                          "model:\n"
                          "  vocab_size: 64\n"
                          "  d_model: 32\n"
                          "  n_layer: 2\n"
                          "  n_head: 2\n"
                          "  n_kv_head: %d\n"
                          "  d_ff: 64\n"
                          "  flavor: %s\n"
                          "  recompute: %s\n"
                          "%s"
                          "training:\n"
                          "  steps: 10\n"
                          "  batch_size: 2\n"
                          "  seq_len: 16\n"
                          "  grad_accum: 2\n"
                          "  lr: 1e-3\n"
                          "  warmup: 2\n"
                          "  threads: 1\n";

static const char *MOE = "  moe:\n"
                         "    experts: 4\n"
                         "    top_k: 2\n"
                         "    every: 1\n"
                         "    capacity_factor: 1.0\n"
                         "    aux_loss_coef: 0.01\n"
                         "    z_loss_coef: 0.001\n"
                         "    shared_experts: 1\n";

/* allocations made by steps 3 and 4 of a run of the given model */
static uint64_t step_allocs(const char *flavor, int kvh, const char *recompute, int moe) {
    char text[2048];
    snprintf(text, sizeof text, BASE, kvh, flavor, recompute, moe ? MOE : "");
    loom_err err = {{0}};
    loom_config *cfg = loom_config_new();
    if (loom_config_load_string(cfg, text, "test_step_alloc", &err)) fail_msg("%s", err.msg);
    loom_train_engine *e = NULL;
    if (loom_train_engine_create(cfg, &e, &err)) fail_msg("%s", err.msg);
    enum { N = 2 * 2 * 16 };
    int32_t x[N], y[N];
    uint64_t before = 0;
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < N; i++) {
            x[i] = (int32_t)(loom_rng_u64(9, (uint64_t)s, (uint64_t)i) % 64);
            y[i] = (int32_t)(loom_rng_u64(9, 100 + (uint64_t)s, (uint64_t)i) % 64);
        }
        if (s == 2) before = loom_alloc_calls();
        double loss, lr, norm;
        if (loom_train_engine_step(e, x, y, &loss, &lr, &norm, &err)) fail_msg("%s", err.msg);
        assert_true(loss > 0 && loss < 10);
    }
    const uint64_t made = loom_alloc_calls() - before;
    loom_train_engine_free(e);
    loom_config_free(cfg);
    return made;
}

static void test_counter_counts(void **state) {
    (void)state;
    const uint64_t a = loom_alloc_calls();
    void *p = loom_malloc(8);
    free(p);
    assert_int_equal(loom_alloc_calls() - a, 1);
}

static void test_dense(void **state) {
    (void)state;
    assert_int_equal(step_allocs("gpt2", 2, "none", 0), 0);
    assert_int_equal(step_allocs("llama", 1, "none", 0), 0);
    assert_int_equal(step_allocs("llama", 1, "full", 0), 0);
}

static void test_moe(void **state) {
    (void)state;
    assert_int_equal(step_allocs("gpt2", 2, "none", 1), 0);
    assert_int_equal(step_allocs("llama", 1, "none", 1), 0);
    assert_int_equal(step_allocs("llama", 1, "full", 1), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_counts),
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
