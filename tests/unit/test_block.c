/* The block definition and activation arenas (src/model/block.c):
 *  - two micro-batches in flight in two arenas (forward A, forward B, backward B, backward A)
 *    give bit for bit the gradients of running them one after the other in the model's own;
 *  - recompute: a layer's activations overwritten with garbage and recomputed from the stream
 *    entering it (the same block walked again) give bit for bit the same gradients;
 *  - a forward-only arena (inference: one set of slots for every layer, no backward scratch)
 *    gives the same logits and loss as a training one, and is smaller.
 * Both flavors. (Decode through the block against the full forward: tests/unit/test_decode.c.) */
#include "testutil.h"

#include <math.h>

#include "loom/bf16.h"
#include "loom/config.h"
#include "loom/model.h"
#include "loom/model_config.h"
#include "model/model_internal.h" /* the slots' dtypes (test_bf16_slot_dtype) */

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* training.precision bf16 (layout.precision): the bf16 weight copy is round(master) once a
 * forward has refreshed it, and again after the masters change (loom_model_params_changed);
 * the typed bf16 arena is smaller than fp32's; two arenas in flight and a recompute after
 * clobbering a layer's (bf16) slots give the bits of one arena, as in fp32; the losses are
 * bf16's, not fp32's. For gpt2, llama, and llama with olmo2's and gemma3's features. */
/* The typed slots: an op reading a slot as another dtype than it holds stops the run at that
 * line, naming the slot and both dtypes (nothing converts silently). The bf16 norm writes its
 * output slot S_LN1 as bf16; the slot is marked fp32 here, in a child process. */
static void test_bf16_slot_dtype(void **state) {
    (void)state;
    const loom_model_config *c = &CFGS[1];
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        signal(SIGABRT, SIG_DFL); /* cmocka's handler would go on to the next test here */
        loom_err err = {{0}};
        loom_model *m = NULL;
        const loom_model_layout lay = {.precision = LOOM_PREC_BF16};
        if (loom_model_create(c, &lay, B, T, &m, &err)) _exit(3);
        loom_model_init_weights(m, 3);
        int32_t x[B * T], y[B * T];
        tokens(c, 1, x, y);
        loom_model_forward(m, x, y, B, T); /* the slots as they are: runs */
        m->slot_dt[S_LN1] = LOOM_DT_F32;
        loom_model_forward(m, x, y, B, T);
        _exit(0); /* not reached */
    }
    close(fd[1]);
    char out[4096];
    size_t n = 0;
    ssize_t k;
    while (n + 1 < sizeof out && (k = read(fd[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fd[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_false(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_false(WIFEXITED(st) && WEXITSTATUS(st) == 3); /* the model was created */
    char want[96];
    snprintf(want, sizeof want, "activation slot %d holds dtype %d, read as dtype %d", S_LN1,
             LOOM_DT_F32, LOOM_DT_BF16);
    if (!strstr(out, want)) fail_msg("expected '%s' in: %s", want, out);
    assert_non_null(strstr(out, "block.c:"));
}

static void test_bf16_arenas(void **state) {
    (void)state;
    /* the llama config with the families' features bf16 computes (docs/architectures.md "bf16
     * training"): olmo2 (post-norms, whole-projection q/k norms), gemma3 (sandwich norms, per-head
     * q/k norms, the embedding scale) with a final soft-cap */
    loom_model_config fam[2] = {CFGS[1], CFGS[1]};
    fam[0].flavor = fam[1].flavor = LOOM_FLAVOR_ARCH;
    fam[0].arch = *loom_arch_named("olmo2");
    fam[1].arch = *loom_arch_named("gemma3");
    fam[1].arch.final_softcap = 2.0f;
    { /* what bf16 still refuses is an error naming its key: sdpa attention */
        loom_model_config sd = CFGS[1];
        sd.attention = LOOM_ATTN_SDPA;
        loom_err err = {{0}};
        loom_model *bad = NULL;
        const loom_model_layout lay = {.precision = LOOM_PREC_BF16};
        assert_int_not_equal(loom_model_create(&sd, &lay, B, T, &bad, &err), 0);
        assert_null(bad);
        if (!strstr(err.msg, "model.attention")) fail_msg("expected model.attention in: %s", err.msg);
    }
    for (int k = 0; k < 4; k++) {
        const loom_model_config *c = k < 2 ? &CFGS[k] : &fam[k - 2];
        loom_err err = {{0}};
        loom_model *m = NULL, *f = NULL;
        const loom_model_layout lay = {.precision = LOOM_PREC_BF16};
        if (loom_model_create(c, &lay, B, T, &m, &err)) fail_msg("%s", err.msg);
        if (loom_model_create(c, NULL, B, T, &f, &err)) fail_msg("%s", err.msg);
        assert_null(loom_model_bf16_weights(f));
        loom_model_init_weights(m, 3);
        loom_model_init_weights(f, 3);
        const size_t n = loom_model_num_params(m);
        int32_t x1[B * T], y1[B * T];
        tokens(c, 1, x1, y1);
        loom_model_zero_grad(m);
        const float l1 = loom_model_forward(m, x1, y1, B, T);
        const uint16_t *wb = loom_model_bf16_weights(m);
        assert_non_null(wb);
        for (size_t i = 0; i < n; i++) assert_int_equal(wb[i], loom_bf16_round(loom_model_params(m)[i]));
        assert_true(l1 != loom_model_forward(f, x1, y1, B, T)); /* bf16's loss, not fp32's */
        loom_model_backward(m, 0.5f);
        float *ref = malloc(n * sizeof(float));
        memcpy(ref, loom_model_grads(m), n * sizeof(float));

        /* two arenas, then a clobbered layer recomputed: the bits of the model's own arena */
        loom_acts *a = loom_acts_create(m, B, T, 1), *b = loom_acts_create(m, B, T, 1);
        loom_acts *af = loom_acts_create(f, B, T, 1);
        assert_true(loom_acts_bytes(a) < loom_acts_bytes(af));
        loom_model_zero_grad(m);
        assert_true(loom_model_forward_acts(m, b, x1, y1, B, T) == l1);
        assert_true(loom_model_forward_acts(m, a, x1, y1, B, T) == l1);
        loom_acts_poison_layer(m, a, 1, 12345.0f);
        loom_model_recompute_layer(m, a, 1);
        loom_model_backward_acts(m, a, 0.5f);
        assert_memory_equal(loom_model_grads(m), ref, n * sizeof(float));
        loom_model_zero_grad(m);
        loom_acts_poison_layer(m, b, 1, 12345.0f); /* without the recompute the garbage shows */
        loom_model_backward_acts(m, b, 0.5f);
        assert_true(memcmp(loom_model_grads(m), ref, n * sizeof(float)) != 0);

        /* masters changed by hand: the copy follows at the next forward, once marked */
        loom_model_params(m)[0] += 1.0f;
        loom_model_params_changed(m);
        loom_model_forward(m, x1, y1, B, T);
        assert_int_equal(wb[0], loom_bf16_round(loom_model_params(m)[0]));
        loom_acts_free(a);
        loom_acts_free(b);
        loom_acts_free(af);
        free(ref);
        loom_model_free(m);
        loom_model_free(f);
    }
}

/* An inference model: parameters only; decoding allocates no activations; its first forward a
 * forward-only arena; the same logits as a training model. */
static void test_inference_model(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        const loom_model_config *c = &CFGS[k];
        loom_err err = {{0}};
        loom_model *tr = NULL, *inf = NULL;
        if (loom_model_create(c, NULL, B, T, &tr, &err)) fail_msg("%s", err.msg);
        if (loom_model_create_view(c, NULL, B, T, LOOM_MODEL_INFER, &inf, &err)) fail_msg("%s", err.msg);
        loom_model_init_weights(tr, 4);
        loom_model_init_weights(inf, 4);
        const size_t pbytes = loom_model_num_params(inf) * sizeof(float);
        assert_null(loom_model_grads(inf));
        assert_int_equal(loom_model_arena_bytes(inf), pbytes);
        loom_kv_cache *kc = loom_kv_cache_create(inf);
        for (int i = 0; i < T; i++) loom_model_decode(inf, kc, (int32_t)(i % c->vocab_size));
        loom_kv_cache_free(kc);
        assert_int_equal(loom_model_arena_bytes(inf), pbytes); /* decoding: no activations */
        int32_t x[B * T], y[B * T];
        tokens(c, 5, x, y);
        const float li = loom_model_forward(inf, x, y, B, T);
        const float lt = loom_model_forward(tr, x, y, B, T);
        assert_true(li == lt);
        assert_memory_equal(loom_model_logits(inf), loom_model_logits(tr),
                            (size_t)B * T * (size_t)c->vocab_size * sizeof(float));
        /* forward-only: less than the training model's activation arena */
        assert_true(loom_model_arena_bytes(inf) - pbytes < loom_model_arena_bytes(tr) - 2 * pbytes);
        loom_model_free(inf);
        loom_model_free(tr);
    }
}

/* model.attention: flash by default, sdpa on request, anything else refused naming the key;
 * both give the same loss and (up to rounding) the same gradients */
static void test_attention_key(void **state) {
    (void)state;
    const char *vals[3] = {NULL, "sdpa", "bogus"};
    const int want[2] = {LOOM_ATTN_FLASH, LOOM_ATTN_SDPA};
    for (int i = 0; i < 3; i++) {
        loom_config *cfg = loom_config_new();
        loom_err err = {{0}};
        assert_int_equal(loom_config_load_string(cfg, "model:\n  d_model: 16\n", "t.yaml", &err), 0);
        if (vals[i]) loom_config_set(cfg, "model.attention", vals[i], "--set");
        assert_int_equal(loom_config_apply_schema(cfg, loom_model_config_keys, loom_model_config_nkeys, &err), 0);
        loom_model_config mc;
        if (i < 2) {
            if (loom_model_config_from(cfg, 8, &mc, &err)) fail_msg("%s", err.msg);
            assert_int_equal(mc.attention, want[i]);
        } else {
            TU_ASSERT_ERR(loom_model_config_from(cfg, 8, &mc, TU_ERR), "model.attention", "bogus",
                          "flash or sdpa");
        }
        loom_config_free(cfg);
    }
    for (int k = 0; k < 2; k++) {
        loom_model *m[2];
        float loss[2];
        int32_t x[B * T], y[B * T];
        tokens(&CFGS[k], 9, x, y);
        for (int a = 0; a < 2; a++) {
            loom_model_config c = CFGS[k];
            c.attention = want[a];
            loom_err err = {{0}};
            if (loom_model_create(&c, NULL, B, T, &m[a], &err)) fail_msg("%s", err.msg);
            loom_model_init_weights(m[a], 2);
            loom_model_zero_grad(m[a]);
            loss[a] = loom_model_forward(m[a], x, y, B, T);
            loom_model_backward(m[a], 1.0f / (float)loom_model_valid_targets(m[a]));
        }
        assert_true(fabsf(loss[0] - loss[1]) <= 1e-6f * fabsf(loss[1]));
        const size_t n = loom_model_num_params(m[0]);
        float worst = 0, scale = 0;
        for (size_t i = 0; i < n; i++) {
            worst = fmaxf(worst, fabsf(loom_model_grads(m[0])[i] - loom_model_grads(m[1])[i]));
            scale = fmaxf(scale, fabsf(loom_model_grads(m[1])[i]));
        }
        assert_true(worst <= 1e-5f * scale);
        /* flash keeps the lse, not the T x T probabilities */
        assert_true(loom_model_activation_bytes(m[0]) < loom_model_activation_bytes(m[1]));
        loom_model_free(m[0]);
        loom_model_free(m[1]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* first: its fork comes before any OpenMP team exists (libgomp's pool does not
         * survive a fork) */
        cmocka_unit_test(test_bf16_slot_dtype),
        cmocka_unit_test(test_arenas_and_recompute),
        cmocka_unit_test(test_inference_model),
        cmocka_unit_test(test_bf16_arenas),
        cmocka_unit_test(test_attention_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
