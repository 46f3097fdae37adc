/* The block definition and activation arenas (src/model/block.c):
 *  - two micro-batches in flight in two arenas (forward A, forward B, backward B, backward A)
 *    give bit for bit the gradients of running them one after the other in the model's own;
 *  - recompute: a layer's activations overwritten with garbage and recomputed from the stream
 *    entering it (the same block walked again) give bit for bit the same gradients;
 *  - a forward-only arena (inference: one set of slots for every layer, no backward scratch)
 *    gives the same logits and loss as a training one, and is smaller.
 * Both flavors. (Decode through the block against the full forward: tests/unit/test_decode.c.) */
#include "testutil.h"

#include "loom/model.h"

enum { B = 2, T = 6 };

static const loom_model_config CFGS[2] = {
    {.flavor = LOOM_FLAVOR_GPT2, .vocab_size = 29, .max_seq_len = 8, .n_layer = 3, .n_head = 2,
     .n_kv_head = 2, .d_model = 16, .d_ff = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
     .init_std = 0.1f},
    {.flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 31, .max_seq_len = 8, .n_layer = 3, .n_head = 4,
     .n_kv_head = 2, .d_model = 16, .d_ff = 24, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
     .init_std = 0.1f}};

static void tokens(const loom_model_config *c, uint64_t s, int32_t *x, int32_t *y) {
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)(loom_rng_u64(s, 1, (uint64_t)i) % (uint64_t)c->vocab_size);
        y[i] = (int32_t)(loom_rng_u64(s, 2, (uint64_t)i) % (uint64_t)c->vocab_size);
    }
}

static void test_arenas_and_recompute(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        const loom_model_config *c = &CFGS[k];
        loom_err err = {{0}};
        loom_model *m = NULL;
        if (loom_model_create(c, NULL, B, T, &m, &err)) fail_msg("%s", err.msg);
        loom_model_init_weights(m, 3);
        const size_t n = loom_model_num_params(m);
        int32_t x1[B * T], y1[B * T], x2[B * T], y2[B * T];
        tokens(c, 1, x1, y1);
        tokens(c, 2, x2, y2);

        /* one after the other, in the model's own arena */
        loom_model_zero_grad(m);
        const float l1 = loom_model_forward(m, x1, y1, B, T);
        loom_model_backward(m, 0.5f);
        const float l2 = loom_model_forward(m, x2, y2, B, T);
        loom_model_backward(m, 0.25f);
        float *ref = malloc(n * sizeof(float));
        memcpy(ref, loom_model_grads(m), n * sizeof(float));

        /* both in flight */
        loom_acts *a = loom_acts_create(m, B, T, 1), *b = loom_acts_create(m, B, T, 1);
        loom_model_zero_grad(m);
        assert_true(loom_model_forward_acts(m, a, x1, y1, B, T) == l1);
        assert_true(loom_model_forward_acts(m, b, x2, y2, B, T) == l2);
        loom_model_backward_acts(m, b, 0.25f);
        loom_model_backward_acts(m, a, 0.5f);
        /* accumulation order differs (b before a): equal up to rounding, not bitwise */
        double worst = 0, scale = 0;
        for (size_t i = 0; i < n; i++) {
            const double d = (double)loom_model_grads(m)[i] - ref[i];
            worst = d > worst ? d : (-d > worst ? -d : worst);
            scale = ref[i] > scale ? ref[i] : (-ref[i] > scale ? -ref[i] : scale);
        }
        assert_true(worst <= 1e-6 * scale);

        /* in order a then b in the two arenas: bitwise */
        loom_model_zero_grad(m);
        loom_model_forward_acts(m, a, x1, y1, B, T);
        loom_model_forward_acts(m, b, x2, y2, B, T);
        loom_model_backward_acts(m, a, 0.5f);
        loom_model_backward_acts(m, b, 0.25f);
        assert_memory_equal(loom_model_grads(m), ref, n * sizeof(float));

        /* recompute: garbage in a middle layer's activations, recomputed before backward */
        loom_model_zero_grad(m);
        loom_model_forward(m, x1, y1, B, T);
        loom_model_forward_acts(m, a, x1, y1, B, T);
        loom_model_backward(m, 0.5f);
        memcpy(ref, loom_model_grads(m), n * sizeof(float));
        loom_model_zero_grad(m);
        loom_acts_poison_layer(m, a, 1, 12345.0f); /* clobber layer 1's slots */
        loom_model_recompute_layer(m, a, 1);
        loom_model_backward_acts(m, a, 0.5f);
        assert_memory_equal(loom_model_grads(m), ref, n * sizeof(float));
        /* without the recompute the garbage shows */
        loom_model_zero_grad(m);
        loom_model_forward_acts(m, a, x1, y1, B, T);
        loom_acts_poison_layer(m, a, 1, 12345.0f);
        loom_model_backward_acts(m, a, 0.5f);
        assert_true(memcmp(loom_model_grads(m), ref, n * sizeof(float)) != 0);

        /* a forward-only arena: same logits and loss, smaller */
        loom_acts *inf = loom_acts_create(m, B, T, 0);
        assert_true(loom_acts_bytes(inf) < loom_acts_bytes(a));
        const float li = loom_model_forward_acts(m, inf, x2, y2, B, T);
        const float lt = loom_model_forward_acts(m, a, x2, y2, B, T);
        assert_true(li == lt);
        assert_memory_equal(loom_acts_logits(inf), loom_acts_logits(a),
                            (size_t)B * T * (size_t)c->vocab_size * sizeof(float));
        loom_acts_free(inf);
        loom_acts_free(a);
        loom_acts_free(b);
        free(ref);
        loom_model_free(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arenas_and_recompute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
