/* The Hugging Face tensor map of the block features (src/hf/hf_weights.c), before a family
 * row uses them (Gemma's rows come later):
 *  - sandwich norms map input_layernorm -> ln1_w, post_attention_layernorm -> attn_post_w,
 *    pre_feedforward_layernorm -> ln2_w, post_feedforward_layernorm -> ffn_post_w; with post
 *    norms only (OLMo 2) there is no ln1_w / ln2_w and post_attention_layernorm is attn_post_w;
 *  - model.arch.norm_offset (Gemma's 1 + w): exactly the norm weights' entries convert (every
 *    norm: pre, post, q/k and final), import gives loom = 1 + w in float32, export w = loom - 1,
 *    and 1 + (exported w) is loom's float again bit for bit for weights in [0.5, 2]; the other
 *    tensors copy unchanged. */
#include "testutil.h"

#include "hf/hf_internal.h"
#include "loom/model.h"

static loom_model *make(const char *base, int place, int offset) {
    loom_model_config c = {.flavor = LOOM_FLAVOR_ARCH, .vocab_size = 40, .max_seq_len = 8,
                           .n_layer = 2, .n_head = 2, .n_kv_head = 1, .d_model = 16,
                           .d_ff = 24, .norm_eps = 1e-6f, .rope_theta = 10000.0f,
                           .init_std = 0.02f};
    c.arch = *loom_arch_named(base);
    c.arch.norm_place = place;
    c.arch.norm_offset = offset;
    if (offset) c.arch.qk_norm = LOOM_QK_NORM_HEAD;
    loom_err err = {{0}};
    loom_model *m = NULL;
    if (loom_model_create(&c, NULL, 1, 4, &m, &err)) fail_msg("%s", err.msg);
    return m;
}

static const hf_map *find(const hf_map_list *l, const char *hf) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->e[i].hf, hf)) return &l->e[i];
    return NULL;
}

static int is_norm(const loom_tensor_info *t) {
    if (t->layer < 0) return t->kind == LOOM_P_LNF_W;
    return t->kind == LOOM_L_LN1_W || t->kind == LOOM_L_LN2_W || t->kind == LOOM_L_ATTN_POST_W ||
           t->kind == LOOM_L_FFN_POST_W || t->kind == LOOM_L_Q_NORM_W ||
           t->kind == LOOM_L_K_NORM_W;
}

static void test_norm_names(void **state) {
    (void)state;
    const hf_family *llama = hf_family_find("LlamaForCausalLM");
    loom_model *m = make("llama", LOOM_NORM_SANDWICH, 0);
    hf_map_list l;
    hf_map_build(m, llama, "model.", &l);
    const char *want[4][2] = {{"input_layernorm", "ln1_w"}, {"post_attention_layernorm", "attn_post_w"},
                              {"pre_feedforward_layernorm", "ln2_w"},
                              {"post_feedforward_layernorm", "ffn_post_w"}};
    for (int k = 0; k < 4; k++) {
        char hf[96], lm[48];
        snprintf(hf, sizeof hf, "model.layers.1.%s.weight", want[k][0]);
        snprintf(lm, sizeof lm, "layers.1.%s", want[k][1]);
        const hf_map *e = find(&l, hf);
        if (!e || strcmp(e->t->name, lm)) fail_msg("%s -> %s", hf, e ? e->t->name : "(none)");
        assert_int_equal(e->add1, 0); /* no norm_offset */
    }
    hf_map_free(&l);
    loom_model_free(m);
    m = make("olmo2", LOOM_NORM_POST, 0); /* post: no pre-norms */
    hf_map_build(m, hf_family_find("Olmo2ForCausalLM"), "model.", &l);
    assert_null(find(&l, "model.layers.0.input_layernorm.weight"));
    assert_null(find(&l, "model.layers.0.pre_feedforward_layernorm.weight"));
    assert_string_equal(find(&l, "model.layers.0.post_attention_layernorm.weight")->t->name,
                        "layers.0.attn_post_w");
    /* whole-projection q/k norms: (H*D) and (KVH*D) */
    assert_int_equal(find(&l, "model.layers.0.self_attn.q_norm.weight")->hf_shape[0], 16);
    assert_int_equal(find(&l, "model.layers.0.self_attn.k_norm.weight")->hf_shape[0], 8);
    hf_map_free(&l);
    loom_model_free(m);
}

static void test_norm_offset(void **state) {
    (void)state;
    loom_model *m = make("llama", LOOM_NORM_SANDWICH, 1);
    hf_map_list l;
    hf_map_build(m, hf_family_find("LlamaForCausalLM"), "model.", &l);
    int norms = 0;
    for (int i = 0; i < l.n; i++) {
        const hf_map *e = &l.e[i];
        assert_int_equal(e->add1, is_norm(e->t)); /* exactly the norms convert */
        const int64_t n = hf_map_numel(e);
        float *hf = malloc((size_t)n * sizeof(float)), *back = malloc((size_t)n * sizeof(float));
        float *lm = malloc(e->t->numel * sizeof(float));
        for (int64_t k = 0; k < n; k++) { /* Gemma-like norm weights around 0, 1 + w in [0.5, 2] */
            const float w = loom_rng_normal(3, (uint64_t)i, (uint64_t)k) * 0.2f;
            hf[k] = w < -0.5f ? -0.5f : w > 1.0f ? 1.0f : w;
        }
        hf_map_to_loom(e, hf, lm);
        hf_map_from_loom(e, lm, back);
        for (size_t k = 0; k < e->t->numel; k++) {
            if (!e->add1) {
                assert_true(lm[k] == hf[k] && back[k] == hf[k]);
                continue;
            }
            assert_true(lm[k] == 1.0f + hf[k]);   /* transformers' 1 + w in float32 */
            assert_true(1.0f + back[k] == lm[k]); /* the exported w gives it back */
        }
        norms += e->add1;
        free(hf);
        free(back);
        free(lm);
    }
    /* per layer ln1, attn_post, ln2, ffn_post, q_norm, k_norm; and the final norm */
    assert_int_equal(norms, 2 * 6 + 1);
    hf_map_free(&l);
    loom_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norm_names),
        cmocka_unit_test(test_norm_offset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
