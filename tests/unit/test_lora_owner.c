/* Who frees LoRA adapters (include/loom/lora.h): the model owns the adapters attached to it, so
 * freeing the model frees them (LeakSanitizer fails this test if it does not), whichever its
 * users let go of first; dropping them early with loom_lora_free detaches them, and the model
 * then does not free them again (AddressSanitizer: no double free). Before, loom_model_free
 * left them behind and a later loom_lora_free read the freed model. */
#include "testutil.h"

#include "loom/lora.h"
#include "loom/model.h"
#include "train/trainer_internal.h"

static const loom_model_config LLAMA = {
    .flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 32, .max_seq_len = 8, .n_layer = 2, .n_head = 2,
    .n_kv_head = 1, .d_model = 16, .d_ff = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.02f};

static loom_model *with_adapters(loom_lora **l) {
    loom_err err = {{0}};
    loom_model *m = NULL;
    if (loom_model_create(&LLAMA, NULL, 1, 8, &m, &err)) fail_msg("%s", err.msg);
    loom_model_init_weights(m, 3);
    if (loom_lora_attach(m, 4, 8.0f, (1u << LOOM_LORA_NT) - 1, 1, l, &err)) fail_msg("%s", err.msg);
    assert_non_null(*l);
    return m;
}

static void test_model_frees_its_adapters(void **state) {
    (void)state;
    loom_lora *l = NULL;
    loom_model *m = with_adapters(&l);
    assert_true(loom_lora_num_params(l) > 0);
    loom_model_free(m); /* the adapters go with it */
}

static void test_adapters_dropped_first(void **state) {
    (void)state;
    loom_lora *l = NULL;
    loom_model *m = with_adapters(&l);
    loom_lora_free(l); /* detached: the model must not free them again */
    int32_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    assert_true(loom_model_forward(m, x, y, 1, 8) > 0); /* and runs without them */
    loom_model_free(m);
}

/* buf (a safetensors file) with its header's text `from` replaced by `to` (the header length
 * rewritten; the data offsets are relative to the data, so they hold) */
static char *edit_header(const char *buf, size_t len, const char *from, const char *to,
                         size_t *out_len) {
    uint64_t n;
    memcpy(&n, buf, 8);
    const char *h = buf + 8, *at = memmem(h, n, from, strlen(from));
    assert_non_null(at);
    const size_t nf = strlen(from), nt = strlen(to), n2 = n - nf + nt;
    char *o = malloc(len - nf + nt);
    const uint64_t n2le = n2;
    memcpy(o, &n2le, 8);
    memcpy(o + 8, h, (size_t)(at - h));
    memcpy(o + 8 + (at - h), to, nt);
    memcpy(o + 8 + (at - h) + nt, at + nf, len - 8 - (size_t)(at - h) - nf);
    *out_len = len - nf + nt;
    return o;
}

/* the adapter file's rank and targets are untrusted metadata: whole integers or an error */
static void test_restore_checks_metadata(void **state) {
    (void)state;
    loom_lora *l = NULL;
    loom_model *m = with_adapters(&l);
    char *buf = NULL;
    size_t len = 0;
    loom_err err = {{0}};
    assert_int_equal(loom_lora_serialize(l, NULL, NULL, &buf, &len, &err), 0);
    assert_int_equal(loom_lora_restore(l, buf, len, "a.safetensors", NULL, NULL, &err), 0);
    static const char *const bad[] = {"\"rank\":\"4abc\"", "\"rank\":\"99999999999999999999\"",
                                      "\"rank\":\" 4\"", "\"rank\":\"\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t n2;
        char *b2 = edit_header(buf, len, "\"rank\":\"4\"", bad[i], &n2);
        memset(&err, 0, sizeof err);
        assert_int_equal(loom_lora_restore(l, b2, n2, "a.safetensors", NULL, NULL, &err), -1);
        assert_non_null(strstr(err.msg, "a.safetensors"));
        assert_non_null(strstr(err.msg, "rank"));
        free(b2);
    }
    size_t n2;
    char *b2 = edit_header(buf, len, "\"targets\":\"", "\"targets\":\"x", &n2);
    assert_int_equal(loom_lora_restore(l, b2, n2, "a.safetensors", NULL, NULL, &err), -1);
    free(b2);
    free(buf);
    loom_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_frees_its_adapters),
        cmocka_unit_test(test_adapters_dropped_first),
        cmocka_unit_test(test_restore_checks_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
