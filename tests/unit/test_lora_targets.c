/* finetune.lora.targets (include/loom/lora.h loom_lora_target_mask, read by the trainer's
 * loom_lora_settings): loom's target names and PEFT's target_modules names of the Hugging
 * Face layouts give the same adapters; a name the model kind does not have is an error naming
 * the key and the name. */
#include "testutil.h"

#include "loom/config.h"
#include "loom/lora.h"
#include "train/trainer_internal.h"

enum { Q = LOOM_LORA_Q, K = LOOM_LORA_K, V = LOOM_LORA_V, O = LOOM_LORA_O,
       G = LOOM_LORA_GATE, U = LOOM_LORA_UP, D = LOOM_LORA_DOWN };

/* the targets the trainer reads from a config whose finetune.lora.targets is list */
static int lora_targets_of(const char *list, int gelu, unsigned *targets, loom_err *err) {
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "finetune:\n  lora:\n    rank: 4\n    alpha: 8\n    dropout: 0\n    targets: %s\n",
             list);
    loom_config *cfg = loom_config_new();
    if (loom_config_load_string(cfg, yaml, "t.yaml", err)) fail_msg("%s", err->msg);
    int rank = 0;
    float alpha = 0, drop = 0;
    const int rc = loom_lora_settings(cfg, gelu, &rank, &alpha, targets, &drop, err);
    loom_config_free(cfg);
    return rc;
}

static unsigned mask_of(const char *list, int gelu) {
    loom_err err = {{0}};
    unsigned t = 0;
    if (lora_targets_of(list, gelu, &t, &err)) fail_msg("%s: %s", list, err.msg);
    return t;
}

static void test_gated_names(void **state) {
    (void)state;
    assert_int_equal(mask_of("[q, v]", 0), Q | V);
    assert_int_equal(mask_of("[q_proj, v_proj]", 0), Q | V);
    assert_int_equal(mask_of("[q_proj, k_proj, v_proj, o_proj]", 0), Q | K | V | O);
    assert_int_equal(mask_of("[gate_proj, up_proj, down_proj]", 0), G | U | D);
    /* Phi-3's fused modules */
    assert_int_equal(mask_of("[qkv_proj]", 0), Q | K | V);
    assert_int_equal(mask_of("[gate_up_proj, o_proj]", 0), G | U | O);
    assert_int_equal(mask_of("[all-linear]", 0), Q | K | V | O | G | U | D);
    assert_int_equal(mask_of("[q, q_proj, down]", 0), Q | D); /* the same target twice: once */
}

static void test_gelu_names(void **state) {
    (void)state;
    assert_int_equal(mask_of("[fc, fc_proj]", 1), G | D);
    assert_int_equal(mask_of("[c_attn]", 1), Q | K | V);
    assert_int_equal(mask_of("[c_fc]", 1), G);
    /* PEFT matches a module-name suffix: c_proj is attn.c_proj and mlp.c_proj */
    assert_int_equal(mask_of("[c_proj]", 1), O | D);
    assert_int_equal(mask_of("[all-linear]", 1), Q | K | V | O | G | D);
}

static void test_unknown_names(void **state) {
    (void)state;
    static const struct { const char *list; int gelu; const char *name; } bad[] = {
        {"[q, up]", 1, "'up'"},           /* gpt2 has no up */
        {"[c_attn]", 0, "'c_attn'"},      /* a GPT-2 module on a gated model */
        {"[qkv_proj]", 1, "'qkv_proj'"},
        {"[fc]", 0, "'fc'"},
        {"[w1]", 0, "'w1'"},              /* Mixtral's expert modules: MoE MLPs take none */
        {"[Q_PROJ]", 0, "'Q_PROJ'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned t = 0;
        TU_ASSERT_ERR(lora_targets_of(bad[i].list, bad[i].gelu, &t, TU_ERR), "finetune.lora.targets",
                      bad[i].name, "is not a target");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gated_names),
        cmocka_unit_test(test_gelu_names),
        cmocka_unit_test(test_unknown_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
