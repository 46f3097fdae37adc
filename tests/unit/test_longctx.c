/* Long-context features of the model (docs/long-context.md):
 *  - document masking (model.doc_mask): a packed batch with document ids gives the logits,
 *    loss and every gradient of running each document separately (gpt2 with learned
 *    positions, llama with RoPE; flash and sdpa), and differs without the ids;
 *  - the loader's document ids follow the shard's document index;
 *  - the chunked LM head + loss (model.loss_chunk) gives the unfused loss and every gradient
 *    and holds no (B,T,V) logits;
 *  - activation checkpointing (model.recompute: full, selective) gives bitwise the gradients
 *    of none, with and without documents, in smaller activation arenas; also with post-norms
 *    and whole-projection q/k norms (olmo2) and with sandwich norms, GeGLU, the embedding
 *    scale and final-logit soft-capping (Gemma's features), the last also chunked. */
#include "testutil.h"

#include <math.h>

#include "loom/data.h"
#include "loom/model.h"

enum { B = 2, T = 12 };

/* 0 gpt2, 1 llama, 2 olmo2 (post-norms, whole q/k norms), 3 Gemma's features (sandwich
 * norms, GeGLU, embedding scale, final-logit soft-cap, per-head q/k norms, tied) */
static loom_model_config cfg_of(int llama, int attention) {
    loom_model_config c = {.flavor = LOOM_FLAVOR_GPT2, .vocab_size = 29, .max_seq_len = 16,
                           .n_layer = 2, .n_head = 2, .n_kv_head = 2, .d_model = 16, .d_ff = 32,
                           .norm_eps = 1e-5f, .rope_theta = 10000.0f, .init_std = 0.2f};
    if (llama) {
        c.flavor = LOOM_FLAVOR_LLAMA;
        c.vocab_size = 31;
        c.n_head = 4;
        c.n_kv_head = 2;
        c.d_ff = 24;
    }
    if (llama >= 2) {
        c.flavor = LOOM_FLAVOR_ARCH;
        c.arch = *loom_arch_named(llama == 2 ? "olmo2" : "llama");
    }
    if (llama == 3) {
        c.arch.norm_place = LOOM_NORM_SANDWICH;
        c.arch.mlp = LOOM_MLP_GEGLU;
        c.arch.embed_scale = 1;
        c.arch.final_softcap = 2.0f;
        c.arch.qk_norm = LOOM_QK_NORM_HEAD;
        c.arch.tied = 1;
    }
    c.attention = attention;
    return c;
}

static void tokens(const loom_model_config *c, uint64_t s, int32_t *x, int32_t *y, int n) {
    for (int i = 0; i < n; i++) {
        x[i] = (int32_t)(loom_rng_u64(s, 1, (uint64_t)i) % (uint64_t)c->vocab_size);
        y[i] = (int32_t)(loom_rng_u64(s, 2, (uint64_t)i) % (uint64_t)c->vocab_size);
    }
}

/* max |a - b| over max |b| (1 when b is all zero) */
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return d / (s > 0 ? s : 1);
}

static loom_model *make_prec(const loom_model_config *c, int b, int t, int precision) {
    loom_err err = {{0}};
    loom_model *m = NULL;
    const loom_model_layout lay = {.precision = precision};
    if (loom_model_create(c, &lay, b, t, &m, &err)) fail_msg("%s", err.msg);
    loom_model_init_weights(m, 7);
    return m;
}

static loom_model *make(const loom_model_config *c, int b, int t) {
    loom_err err = {{0}};
    loom_model *m = NULL;
    if (loom_model_create(c, NULL, b, t, &m, &err)) fail_msg("%s", err.msg);
    loom_model_init_weights(m, 7);
    return m;
}

/* document lengths of the two rows: several documents (one of a single token), and one */
static const int DOCS[B][4] = {{5, 1, 4, 2}, {12, 0, 0, 0}};

/* k 0-3: fp32, gpt2 / llama with flash / sdpa; k 4-7: training.precision bf16 (flash), gpt2,
 * llama, olmo2, Gemma's features: the bf16 logits are not readable, so the losses and the
 * gradients are compared (the same bf16 arithmetic per row: within rounding of the sums; each
 * document alone in bf16 is what test_engine checks against autocast) */
static void test_doc_mask_equals_separate(void **state) {
    (void)state;
    for (int k = 0; k < 8; k++) {
        const int bf16 = k >= 4;
        loom_model_config c = bf16 ? cfg_of(k - 4, LOOM_ATTN_FLASH)
                                   : cfg_of(k % 2, k / 2 ? LOOM_ATTN_SDPA : LOOM_ATTN_FLASH);
        c.doc_mask = 1;
        const int prec = bf16 ? LOOM_PREC_BF16 : LOOM_PREC_FP32;
        loom_model *pk = make_prec(&c, B, T, prec), *one = make_prec(&c, 1, T, prec);
        const size_t n = loom_model_num_params(pk), V = (size_t)c.vocab_size;
        int32_t x[B * T], y[B * T], docs[B * T];
        tokens(&c, 11 + (uint64_t)k, x, y, B * T);
        for (int b = 0; b < B; b++) /* arbitrary ids: only a change of id starts a document */
            for (int d = 0, t = 0; d < 4; t += DOCS[b][d], d++)
                for (int i = 0; i < DOCS[b][d]; i++) docs[b * T + t + i] = 100 + 7 * (d % 2);

        /* each document alone, gradients summed (dscale 1: the sum of the losses) */
        float *logits = malloc((size_t)B * T * V * sizeof(float));
        double loss_sum = 0;
        loom_model_zero_grad(one);
        for (int b = 0; b < B; b++)
            for (int d = 0, t = 0; d < 4 && DOCS[b][d] > 0; t += DOCS[b][d], d++) {
                const int row = b * T + t, len = DOCS[b][d];
                const float l = loom_model_forward(one, x + row, y + row, 1, len);
                loss_sum += (double)l * (double)loom_model_valid_targets(one);
                if (!bf16)
                    memcpy(logits + (size_t)row * V, loom_model_logits(one),
                           (size_t)len * V * sizeof(float));
                loom_model_backward(one, 1.0f);
            }

        /* packed, with the documents */
        loom_model_zero_grad(pk);
        loom_model_set_docs(pk, NULL, docs, B, T);
        const float lp = loom_model_forward(pk, x, y, B, T);
        const double dl = bf16 ? 0.0 : rel_diff(loom_model_logits(pk), logits,
                                                (size_t)B * T * V);
        loom_model_backward(pk, 1.0f);
        const double dg = rel_diff(loom_model_grads(pk), loom_model_grads(one), n);
        const double dloss = fabs((double)lp * B * T - loss_sum) / loss_sum;
        static const char *const names[] = {"gpt2", "llama", "olmo2", "gemma"};
        printf("doc_mask %s %s%s: logits %.2e, loss %.2e, grads %.2e\n",
               names[bf16 ? k - 4 : k % 2], !bf16 && k / 2 ? "sdpa" : "flash",
               bf16 ? " bf16" : "", dl, dloss, dg);
        assert_true(dl < 1e-5);
        assert_true(dloss < 1e-6); /* (bf16 observed <= 3.2e-8, grads <= 1.1e-7) */
        assert_true(dg < 1e-5);

        /* the same batch without the documents attends across them: different logits (bf16:
         * a different loss) */
        loom_model_set_docs(pk, NULL, NULL, B, T);
        const float lx = loom_model_forward(pk, x, y, B, T);
        if (bf16) assert_true(fabs((double)lx * B * T - loss_sum) / loss_sum > 1e-4);
        else assert_true(rel_diff(loom_model_logits(pk), logits, (size_t)B * T * V) > 1e-3);
        free(logits);
        loom_model_free(pk);
        loom_model_free(one);
    }
}

/* the loader's document ids: a shard of documents of lengths 3, 9, 1, 20, ... read in windows
 * of T: ids restart at 0 in each row and step where a document starts */
static void test_loader_docs(void **state) {
    (void)state;
    char dir[512], path[700];
    snprintf(dir, sizeof dir, "%s/ds", tu_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    enum { N = 200 };
    uint32_t tok[N];
    uint64_t starts[64];
    int n_docs = 0, doc_of[N];
    static const int lens[] = {3, 9, 1, 20, 2, 14};
    for (int t = 0, d = 0; t < N; d++) {
        starts[n_docs++] = (uint64_t)t;
        for (int i = 0; i < lens[d % 6] && t < N; i++, t++) doc_of[t] = n_docs - 1;
    }
    for (int t = 0; t < N; t++) tok[t] = (uint32_t)(t % 251);
    const loom_shard_spec spec = {.vocab_size = 256, .tokenizer_id = "byte"};
    loom_err err = {{0}};
    snprintf(path, sizeof path, "%s/shard_00000.bin", dir);
    if (loom_shard_write(path, &spec, tok, N, starts, (uint64_t)n_docs, &err))
        fail_msg("%s", err.msg);
    char sha[65] = {0};
    assert_int_equal(loom_sha256_file(path, sha, &err), 0);
    snprintf(path, sizeof path, "%s/manifest.jsonl", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"shard\":\"shard_00000.bin\",\"sha256\":\"%s\",\"tokens\":%d,\"docs\":%d}\n",
            sha, N, n_docs);
    fclose(f);
    loom_dataset *ds = NULL;
    if (loom_dataset_open(dir, &ds, &err)) fail_msg("%s", err.msg);
    enum { TT = 16, BB = 3 };
    loom_loader *l = NULL;
    if (loom_loader_create(ds, TT, 1, 1, &l, &err)) fail_msg("%s", err.msg);
    int32_t x[BB * TT], y[BB * TT], dc[BB * TT];
    for (int step = 0; step < 4; step++) {
        if (loom_loader_next_docs(l, BB, 0, 1, x, y, dc, &err)) fail_msg("%s", err.msg);
        for (int b = 0; b < BB; b++) {
            const int s0 = x[b * TT]; /* token t of the shard is t % 251: its own position */
            for (int t = 0; t < TT; t++)
                assert_int_equal(dc[b * TT + t], doc_of[s0 + t] - doc_of[s0]);
        }
    }
    /* the pass for evaluation gives the same ids */
    loom_loader_pass_slice_docs(l, 1, BB, 0, 1, x, y, dc);
    for (int b = 0; b < BB; b++)
        for (int t = 0; t < TT; t++)
            assert_int_equal(dc[b * TT + t], doc_of[x[b * TT] + t] - doc_of[x[b * TT]]);
    loom_loader_free(l);
    loom_dataset_close(ds);
}

static void test_loss_chunk(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++) { /* gpt2, llama, Gemma's features (the soft-cap chunked) */
        loom_model_config c = cfg_of(k < 2 ? k : 3, LOOM_ATTN_FLASH);
        loom_model *ref = make(&c, B, T);
        c.loss_chunk = 5; /* 24 rows: chunks of 5, the last of 4 */
        loom_model *ch = make(&c, B, T);
        const size_t n = loom_model_num_params(ref);
        int32_t x[B * T], y[B * T];
        tokens(&c, 21 + (uint64_t)k, x, y, B * T);
        y[3] = y[17] = -1; /* ignored targets */
        loom_model_zero_grad(ref);
        loom_model_zero_grad(ch);
        const float l0 = loom_model_forward(ref, x, y, B, T);
        const float l1 = loom_model_forward(ch, x, y, B, T);
        assert_int_equal(loom_model_valid_targets(ch), B * T - 2);
        assert_null(loom_model_logits(ch)); /* no (B,T,V) logits exist */
        loom_model_backward(ref, 1.0f / (B * T - 2));
        loom_model_backward(ch, 1.0f / (B * T - 2));
        const double dg = rel_diff(loom_model_grads(ch), loom_model_grads(ref), n);
        printf("loss_chunk %s: loss %.9g vs %.9g, grads %.2e\n",
               k == 2 ? "gemma features" : k ? "llama" : "gpt2", l1, l0, dg);
        assert_true(fabsf(l1 - l0) <= 1e-6f * fabsf(l0));
        assert_true(dg < 1e-6);
        /* the arena holds 5 rows of logits instead of 24 */
        const size_t V = (size_t)c.vocab_size;
        assert_true(loom_model_activation_bytes(ref) - loom_model_activation_bytes(ch) >=
                    (size_t)(B * T - 5 - 16) * V * sizeof(float));
        loom_model_free(ref);
        loom_model_free(ch);
    }
}

static void test_recompute(void **state) {
    (void)state;
    for (int k = 0; k < 10; k++) { /* flavor x attention x documents; olmo2, gemma features */
        loom_model_config c = cfg_of(k < 8 ? k % 2 : k - 6,
                                     k < 8 && (k / 2) % 2 ? LOOM_ATTN_SDPA : LOOM_ATTN_FLASH);
        c.n_layer = 3;
        c.doc_mask = k < 8 ? k / 4 : 0;
        int32_t x[B * T], y[B * T], docs[B * T];
        tokens(&c, 31 + (uint64_t)k, x, y, B * T);
        for (int i = 0; i < B * T; i++) docs[i] = i < 7 ? 0 : i < 12 ? 1 : 2;
        float *g[3] = {NULL, NULL, NULL}, loss[3];
        size_t bytes[3], n = 0;
        for (int mode = 0; mode < 3; mode++) {
            c.recompute = mode;
            loom_model *m = make(&c, B, T);
            n = loom_model_num_params(m);
            bytes[mode] = loom_model_activation_bytes(m);
            loom_model_zero_grad(m);
            for (int rep = 0; rep < 2; rep++) { /* two micro-batches: the shared buffers reused */
                if (c.doc_mask) loom_model_set_docs(m, NULL, docs, B, T);
                loss[mode] = loom_model_forward(m, x, y, B, T);
                loom_model_backward(m, 0.5f);
            }
            g[mode] = malloc(n * sizeof(float));
            memcpy(g[mode], loom_model_grads(m), n * sizeof(float));
            loom_model_free(m);
        }
        printf("recompute %s %s%s: activation bytes none %zu, full %zu, selective %zu\n",
               k == 8 ? "olmo2" : k == 9 ? "gemma features" : k % 2 ? "llama" : "gpt2",
               k < 8 && (k / 2) % 2 ? "sdpa" : "flash",
               c.doc_mask ? " docs" : "", bytes[0], bytes[1], bytes[2]);
        for (int mode = 1; mode < 3; mode++) { /* the same arithmetic: bitwise */
            assert_true(loss[mode] == loss[0]);
            assert_memory_equal(g[mode], g[0], n * sizeof(float));
        }
        assert_true(bytes[LOOM_RECOMPUTE_FULL] < bytes[LOOM_RECOMPUTE_SELECTIVE]);
        assert_true(bytes[LOOM_RECOMPUTE_SELECTIVE] < bytes[LOOM_RECOMPUTE_NONE]);
        for (int mode = 0; mode < 3; mode++) free(g[mode]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_mask_equals_separate),
        cmocka_unit_test_setup_teardown(test_loader_docs, tu_setup_tmpdir, tu_teardown_tmpdir),
        cmocka_unit_test(test_loss_chunk),
        cmocka_unit_test(test_recompute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
