/* The batched inference engine (src/infer/engine.c):
 * - a batch of 16 prompts of mixed lengths, greedy, with continuous batching on (at most 5
 *   running, requests joining mid-run, prompts prefilled in chunks): every output equals
 *   generating that prompt alone (loom_generate, the single-sequence KV-cache path) and the
 *   argmax of the full forward (loom_model_next_logits) at every position (every fourth
 *   request); GPT-2, Llama (grouped-query attention) and a sliding-window Llama (layer 1
 *   slides with a window of 6: prefill chunks of up to 24 rows run into its ring cache);
 * - sampling (temperature, top-k, top-p, repetition penalty) reproducible by seed, and a
 *   request's output independent of what else runs in the batch;
 * - the KV pool's budget bounds the running requests (a sliding layer's cache counted as its
 *   window: the exact bytes); errors for bad requests;
 * - stop strings cut the text (byte tokenizer), streamed chunks add up to the final text;
 * - top-k / top-p draw only from their candidate sets;
 * - prefix caching: the same greedy tokens with it, cached positions counted, evictions;
 * - a model being trained (no arenas of its own, parameters through resident hooks, as the
 *   DP engine serves them at ZeRO 0-2: GRPO's rollouts) samples exactly what a model with
 *   its own copy of the weights samples, and the recorded log-probs (params.logprobs) equal
 *   log softmax of the full forward's logits at each generated position; non-resident hooks
 *   (ZeRO 3) are refused with an error. */
#include "testutil.h"

#include <math.h>

#include "loom/infer.h"
#include "loom/model.h"
#include "loom/tokenizer.h"

enum { NREQ = 16 };

static loom_model *make_model(int flavor, uint64_t seed) {
    loom_model_config cfg = {.flavor = flavor, .vocab_size = 256, .max_seq_len = 64,
                             .n_layer = 2, .n_head = 4, .n_kv_head = flavor ? 2 : 4,
                             .d_model = 64, .d_ff = flavor ? 96 : 256, .norm_eps = 1e-5f,
                             .rope_theta = 10000.0f, .init_std = 0.2f};
    if (flavor == LOOM_FLAVOR_ARCH) { /* Llama with layer 1 sliding, window 6 (Qwen 2's) */
        cfg.n_kv_head = 2;
        cfg.d_ff = 96;
        cfg.arch = *loom_arch_named("llama");
        cfg.arch.sliding_window = 6;
        cfg.arch.window_start = 1;
    }
    loom_err err = {{0}};
    loom_model *m = NULL;
    assert_int_equal(loom_model_create_view(&cfg, NULL, 1, cfg.max_seq_len, LOOM_MODEL_INFER, &m,
                                            &err), 0);
    loom_model_init_weights(m, seed);
    return m;
}

static void prompt_of(int i, uint64_t seed, int32_t *p, int *n) {
    *n = 1 + (i * 7) % 37; /* 1 .. 37 tokens */
    for (int j = 0; j < *n; j++) p[j] = (int32_t)(loom_rng_u64(seed, 11 + (uint64_t)i, (uint64_t)j) % 256);
}

static void check_greedy_batch(int flavor) {
    loom_model *m = make_model(flavor, 5 + (uint64_t)flavor);
    loom_err err = {{0}};
    loom_engine_opts o = {.max_batch = 5, .max_step_tokens = 24};
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(m, NULL, &o, &e, &err), 0);
    int32_t prompts[NREQ][64];
    int np[NREQ], maxtok[NREQ];
    int64_t ids[NREQ];
    loom_gen_params gp = loom_gen_params_default();
    gp.temperature = 0.0f;
    int submitted = 0, steps = 0;
    for (int i = 0; i < NREQ; i++) {
        prompt_of(i, 99, prompts[i], &np[i]);
        maxtok[i] = 3 + (i * 5) % 12;
        if (i == 3) maxtok[i] = 64; /* runs into the context limit */
    }
    /* 10 now, 6 more while the first run */
    for (; submitted < 10; submitted++) {
        gp.max_tokens = maxtok[submitted];
        assert_int_equal(loom_engine_submit(e, prompts[submitted], np[submitted], &gp, NULL, NULL,
                                            &ids[submitted], &err), 0);
    }
    while (loom_engine_step(e) > 0 || submitted < NREQ) {
        steps++;
        if (steps % 3 == 0 && submitted < NREQ) {
            gp.max_tokens = maxtok[submitted];
            assert_int_equal(loom_engine_submit(e, prompts[submitted], np[submitted], &gp, NULL,
                                                NULL, &ids[submitted], &err), 0);
            submitted++;
        }
        assert_true(steps < 10000);
    }
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    assert_int_equal(st.max_running, 5);
    assert_int_equal(st.running + st.waiting, 0);
    assert_true(st.kv_used == 0);
    const int V = 256;
    loom_sampler greedy = {.temperature = 0.0f};
    int32_t *alone = malloc(256 * sizeof(int32_t));
    int32_t seq[256];
    for (int i = 0; i < NREQ; i++) {
        const int32_t *toks;
        int n, fin;
        assert_int_equal(loom_engine_result(e, ids[i], &toks, &n, NULL, NULL, &fin), 0);
        const int expect_n = maxtok[i] < 64 - np[i] + 1 ? maxtok[i] : 64 - np[i] + 1;
        assert_int_equal(n, expect_n);
        assert_int_equal(fin, LOOM_FINISH_LENGTH);
        /* alone, through the single-sequence KV-cache path */
        const int got = loom_generate(m, 64, prompts[i], np[i], n, &greedy, alone);
        assert_int_equal(got, np[i] + n);
        for (int j = 0; j < n; j++) {
            if (toks[j] != alone[np[i] + j])
                fail_msg("flavor %d request %d token %d: batched %d, alone %d", flavor, i, j,
                         toks[j], alone[np[i] + j]);
        }
        /* and the argmax of the full forward over the prefix (every fourth request: the
         * full forward costs a whole prefix per token) */
        if (i % 4) {
            loom_engine_release(e, ids[i]);
            continue;
        }
        memcpy(seq, prompts[i], (size_t)np[i] * sizeof(int32_t));
        memcpy(seq + np[i], toks, (size_t)n * sizeof(int32_t));
        for (int j = 0; j < n; j++) {
            const float *lg = loom_model_next_logits(m, seq, np[i] + j);
            int best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best]) best = v;
            if (best != toks[j])
                fail_msg("flavor %d request %d token %d: batched %d, full forward %d", flavor, i,
                         j, toks[j], best);
        }
        loom_engine_release(e, ids[i]);
    }
    print_message("flavor %d: 16 requests in %d steps, at most %d running\n", flavor, steps,
                  st.max_running);
    free(alone);
    loom_engine_free(e);
    loom_model_free(m);
}

static void test_greedy_gpt2(void **state) {
    (void)state;
    check_greedy_batch(LOOM_FLAVOR_GPT2);
}

static void test_greedy_llama(void **state) {
    (void)state;
    check_greedy_batch(LOOM_FLAVOR_LLAMA);
}

static void test_greedy_window(void **state) {
    (void)state;
    check_greedy_batch(LOOM_FLAVOR_ARCH);
    /* a request's reservation: 29 positions for layer 0, the window's 6 for layer 1 */
    loom_model *m = make_model(LOOM_FLAVOR_ARCH, 31);
    loom_err err = {{0}};
    const size_t row = 2 * 16 * sizeof(float) * 2; /* KVH * D floats, of K and of V */
    assert_int_equal(loom_model_kv_floats(m, 29) * 2 * sizeof(float), (29 + 6) * row);
    loom_engine_opts o = {.max_batch = 8, .kv_budget_bytes = 2 * (29 + 6) * row};
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(m, NULL, &o, &e, &err), 0);
    int32_t p[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    loom_gen_params gp = loom_gen_params_default();
    gp.temperature = 0;
    gp.max_tokens = 20;
    int64_t id;
    for (int i = 0; i < 3; i++) assert_int_equal(loom_engine_submit(e, p, 10, &gp, NULL, NULL, &id, &err), 0);
    assert_true(loom_engine_step(e) > 0);
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    assert_int_equal(st.running, 2); /* the budget holds two windowed reservations */
    assert_int_equal(st.kv_used, 2 * (29 + 6) * row);
    while (loom_engine_step(e) > 0) {}
    loom_engine_free(e);
    loom_model_free(m);
}

/* runs requests (prompt i, params p with seed seeds[i]) through an engine of max_batch mb */
static void run_sampled(loom_model *m, int mb, int nreq, const uint64_t *seeds, int32_t out[][40]) {
    loom_err err = {{0}};
    loom_engine_opts o = {.max_batch = mb};
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(m, NULL, &o, &e, &err), 0);
    loom_gen_params gp = loom_gen_params_default();
    gp.temperature = 0.9f;
    gp.top_k = 20;
    gp.top_p = 0.9f;
    gp.repetition_penalty = 1.3f;
    gp.max_tokens = 12;
    int64_t ids[NREQ];
    for (int i = 0; i < nreq; i++) {
        int32_t p[64];
        int n;
        prompt_of(i, 7, p, &n);
        gp.seed = seeds[i];
        assert_int_equal(loom_engine_submit(e, p, n, &gp, NULL, NULL, &ids[i], &err), 0);
    }
    while (loom_engine_step(e) > 0) {}
    for (int i = 0; i < nreq; i++) {
        const int32_t *t;
        int n;
        assert_int_equal(loom_engine_result(e, ids[i], &t, &n, NULL, NULL, NULL), 0);
        assert_int_equal(n, 12);
        memcpy(out[i], t, 12 * sizeof(int32_t));
    }
    loom_engine_free(e);
}

static void test_sampling_seeded(void **state) {
    (void)state;
    loom_model *m = make_model(LOOM_FLAVOR_LLAMA, 3);
    static int32_t a[NREQ][40], b[NREQ][40], c1[1][40], d[NREQ][40];
    uint64_t seeds[NREQ], other[NREQ];
    for (int i = 0; i < NREQ; i++) seeds[i] = 1000 + (uint64_t)i, other[i] = 5000 + (uint64_t)i;
    run_sampled(m, 16, NREQ, seeds, a);
    run_sampled(m, 3, NREQ, seeds, b); /* another batch composition */
    assert_memory_equal(a, b, sizeof a);
    run_sampled(m, 1, 1, seeds, c1); /* request 0 alone */
    assert_memory_equal(a[0], c1[0], sizeof c1[0]);
    run_sampled(m, 16, NREQ, other, d);
    int differ = 0;
    for (int i = 0; i < NREQ; i++) differ += memcmp(a[i], d[i], sizeof a[i]) != 0;
    assert_true(differ >= NREQ - 1);
    loom_model_free(m);
}

static void test_kv_budget_and_errors(void **state) {
    (void)state;
    loom_model *m = make_model(LOOM_FLAVOR_GPT2, 9);
    loom_err err = {{0}};
    const size_t per_pos = loom_model_kv_floats_per_pos(m) * 2 * sizeof(float);
    /* room for 2 requests of 10 + 20 - 1 positions, not 3 */
    loom_engine_opts o = {.max_batch = 8, .kv_budget_bytes = per_pos * 29 * 2 + per_pos * 5};
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(m, NULL, &o, &e, &err), 0);
    int32_t p[80] = {0};
    for (int i = 0; i < 80; i++) p[i] = i % 256;
    loom_gen_params gp = loom_gen_params_default();
    gp.temperature = 0;
    gp.max_tokens = 20;
    int64_t id;
    for (int i = 0; i < 6; i++) assert_int_equal(loom_engine_submit(e, p + i, 10, &gp, NULL, NULL, &id, &err), 0);
    /* errors */
    assert_int_equal(loom_engine_submit(e, p, 65, &gp, NULL, NULL, &id, &err), -1);
    assert_non_null(strstr(err.msg, "context of 64"));
    gp.max_tokens = 60;
    assert_int_equal(loom_engine_submit(e, p, 30, &gp, NULL, NULL, &id, &err), -1);
    assert_non_null(strstr(err.msg, "budget"));
    gp.max_tokens = 5;
    assert_int_equal(loom_engine_submit(e, p, 0, &gp, NULL, NULL, &id, &err), -1);
    int32_t bad = 300;
    assert_int_equal(loom_engine_submit(e, &bad, 1, &gp, NULL, NULL, &id, &err), -1);
    assert_non_null(strstr(err.msg, "outside the vocabulary"));
    const char *stop[] = {"x"};
    gp.stop = stop;
    gp.n_stop = 1;
    assert_int_equal(loom_engine_submit(e, p, 3, &gp, NULL, NULL, &id, &err), -1);
    assert_non_null(strstr(err.msg, "tokenizer"));
    gp.n_stop = 0;
    gp.top_p = 1.5f;
    assert_int_equal(loom_engine_submit(e, p, 3, &gp, NULL, NULL, &id, &err), -1);
    while (loom_engine_step(e) > 0) {}
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    assert_int_equal(st.max_running, 2);
    assert_true(st.kv_peak <= o.kv_budget_bytes);
    assert_int_equal(st.generated_tokens, 6 * 20);
    loom_engine_free(e);
    loom_model_free(m);
}

typedef struct stream_acc {
    char buf[4096];
    size_t len;
    int calls, finish;
} stream_acc;

static void on_chunk(void *ctx, int64_t id, int32_t token, const char *text, size_t len,
                     int finish) {
    (void)id;
    (void)token;
    stream_acc *a = ctx;
    assert_true(a->finish == 0);
    assert_true(a->len + len < sizeof a->buf);
    memcpy(a->buf + a->len, text, len);
    a->len += len;
    a->calls++;
    a->finish = finish;
}

static void test_stop_strings(void **state) {
    (void)state;
    loom_model *m = make_model(LOOM_FLAVOR_GPT2, 21);
    loom_tokenizer *tok = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_tokenizer_byte(NULL, 0, &tok, &err), 0);
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(m, tok, NULL, &e, &err), 0);
    const int32_t prompt[] = {'a', 'b', 'c'};
    loom_gen_params gp = loom_gen_params_default();
    gp.temperature = 0;
    gp.max_tokens = 40;
    stream_acc full = {{0}, 0, 0, 0};
    int64_t id0, id1;
    assert_int_equal(loom_engine_submit(e, prompt, 3, &gp, on_chunk, &full, &id0, &err), 0);
    while (loom_engine_step(e) > 0) {}
    const char *text;
    size_t tlen;
    int fin;
    assert_int_equal(loom_engine_result(e, id0, NULL, NULL, &text, &tlen, &fin), 0);
    assert_int_equal(tlen, 40);
    assert_int_equal(fin, LOOM_FINISH_LENGTH);
    assert_int_equal(full.len, 40);
    assert_memory_equal(full.buf, text, 40);
    /* stop on the 3 bytes at offset 20 (and a string that never occurs) */
    char stop[4];
    int at = 20;
    while (at < 36 && memchr(text + at, 0, 3)) at++;
    assert_true(at < 36);
    memcpy(stop, text + at, 3);
    stop[3] = 0;
    size_t first = (size_t)((const char *)memmem(text, tlen, stop, 3) - text);
    const char *stops[] = {"\x01\x02\x03never", stop};
    gp.stop = stops;
    gp.n_stop = 2;
    stream_acc cut = {{0}, 0, 0, 0};
    assert_int_equal(loom_engine_submit(e, prompt, 3, &gp, on_chunk, &cut, &id1, &err), 0);
    while (loom_engine_step(e) > 0) {}
    const char *t1;
    size_t l1;
    assert_int_equal(loom_engine_result(e, id1, NULL, NULL, &t1, &l1, &fin), 0);
    assert_int_equal(fin, LOOM_FINISH_STOP);
    assert_int_equal(l1, first);
    assert_memory_equal(t1, text, first);
    assert_int_equal(cut.len, first);
    assert_memory_equal(cut.buf, text, first);
    assert_int_equal(cut.finish, LOOM_FINISH_STOP);
    loom_engine_free(e);
    loom_tokenizer_free(tok);
    loom_model_free(m);
}

static void test_topk_topp(void **state) {
    (void)state;
    enum { V = 1000 };
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)((i * 37) % V) / 100.0f; /* max at 999*37%1000 */
    void *scratch = malloc(loom_sample_scratch_bytes(V));
    loom_gen_params p = loom_gen_params_default();
    p.temperature = 5.0f;
    p.top_k = 3;
    loom_rng rng = {.seed = 1, .stream = 2, .counter = 0};
    int seen[V] = {0};
    for (int d = 0; d < 2000; d++) seen[loom_sample_params(&p, &rng, logits, V, NULL, 0, scratch)]++;
    /* the top 3 logits are the ids with (i*37)%1000 in {999, 998, 997} */
    int n_ids = 0;
    for (int i = 0; i < V; i++) {
        if (!seen[i]) continue;
        n_ids++;
        assert_true((i * 37) % V >= 997);
    }
    assert_int_equal(n_ids, 3);
    /* top-p: two big logits share 0.9 of the mass; p = 0.5 keeps one, 0.95 the two, not more */
    float lg2[V];
    for (int i = 0; i < V; i++) lg2[i] = 0.0f;
    lg2[10] = 10.0f;
    lg2[20] = 9.9f;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 0.5f;
    memset(seen, 0, sizeof seen);
    for (int d = 0; d < 500; d++) seen[loom_sample_params(&p, &rng, lg2, V, NULL, 0, scratch)]++;
    assert_int_equal(seen[10], 500);
    p.top_p = 0.95f;
    memset(seen, 0, sizeof seen);
    for (int d = 0; d < 500; d++) seen[loom_sample_params(&p, &rng, lg2, V, NULL, 0, scratch)]++;
    assert_int_equal(seen[10] + seen[20], 500);
    assert_true(seen[20] > 100);
    /* repetition penalty: a strong one moves greedy off a token in the history */
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 2.0f;
    const int32_t hist[] = {10};
    assert_int_equal(loom_sample_params(&p, &rng, lg2, V, hist, 1, scratch), 20);
    p.repetition_penalty = 1.0f;
    assert_int_equal(loom_sample_params(&p, &rng, lg2, V, hist, 1, scratch), 10);
    free(scratch);
}

/* Prefix caching: requests sharing a 40-token prefix (two full blocks of 16) give the same
 * greedy tokens with the cache as without; the first request fills the cache, the others
 * take 32 positions from it; with a budget too small for cache and requests, blocks are
 * evicted (least recently used) and the outputs stay the same. Sliding-window models refuse
 * the option. */
enum { PREQ = 10, PSHARED = 40, PGEN = 8 };
static void run_prefix(loom_model *m, int cache, size_t budget, int32_t out[PREQ][PGEN], int cached[PREQ],
                       loom_engine_stats *st) {
    loom_err err = {{0}};
    loom_engine_opts o = {.max_batch = 4, .kv_budget_bytes = budget, .prefix_cache = cache};
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(m, NULL, &o, &e, &err), 0);
    loom_gen_params gp = loom_gen_params_default();
    gp.temperature = 0.0f;
    gp.max_tokens = PGEN;
    int64_t ids[PREQ];
    for (int i = 0; i < PREQ; i++) {
        int32_t p[64];
        const int n = PSHARED + 1 + i % 7;
        for (int j = 0; j < n; j++)
            p[j] = (int32_t)(loom_rng_u64(j < PSHARED ? 77 : 78 + (uint64_t)i, 5, (uint64_t)j) % 256);
        assert_int_equal(loom_engine_submit(e, p, n, &gp, NULL, NULL, &ids[i], &err), 0);
        if (i == 0) /* the first alone: its blocks are in the cache when the others join */
            while (loom_engine_step(e) > 0) {}
    }
    while (loom_engine_step(e) > 0) {}
    for (int i = 0; i < PREQ; i++) {
        const int32_t *t;
        int n;
        assert_int_equal(loom_engine_result(e, ids[i], &t, &n, NULL, NULL, NULL), 0);
        assert_int_equal(n, PGEN);
        memcpy(out[i], t, sizeof out[i]);
        cached[i] = loom_engine_cached_tokens(e, ids[i]);
    }
    loom_engine_get_stats(e, st);
    loom_engine_free(e);
}

static void test_prefix_cache(void **state) {
    (void)state;
    loom_model *m = make_model(LOOM_FLAVOR_LLAMA, 21);
    static int32_t plain[PREQ][PGEN], with[PREQ][PGEN], tight[PREQ][PGEN];
    int c0[PREQ], c1[PREQ], c2[PREQ];
    loom_engine_stats s0, s1, s2;
    run_prefix(m, 0, 0, plain, c0, &s0);
    run_prefix(m, 1, 0, with, c1, &s1);
    assert_memory_equal(plain, with, sizeof plain);
    assert_int_equal(c1[0], 0);
    for (int i = 1; i < PREQ; i++) assert_int_equal(c1[i], 32);
    assert_int_equal(s1.prefix_hit_tokens, 32 * (PREQ - 1));
    assert_int_equal(s0.prefix_hit_tokens, 0);
    assert_int_equal(s1.prompt_tokens + s1.prefix_hit_tokens, s0.prompt_tokens);
    assert_true(s1.prefix_blocks >= 2);
    /* room for 4 running requests of at most 54 positions and one block: evictions */
    const size_t per_pos = loom_model_kv_floats_per_pos(m) * 2 * sizeof(float);
    run_prefix(m, 1, per_pos * (4 * 54 + 16), tight, c2, &s2);
    assert_memory_equal(plain, tight, sizeof plain);
    assert_true(s2.prefix_evicted > 0);
    assert_true(s2.prefix_hit_tokens > 0 && s2.prefix_hit_tokens < s1.prefix_hit_tokens);
    print_message("prefix cache: %lld of %lld prompt tokens from the cache; tight budget: %lld evictions, "
                  "%lld tokens from the cache\n", (long long)s1.prefix_hit_tokens, (long long)s0.prompt_tokens,
                  (long long)s2.prefix_evicted, (long long)s2.prefix_hit_tokens);
    loom_model_free(m);
    /* sliding-window layers: refused */
    loom_model *w = make_model(LOOM_FLAVOR_ARCH, 22);
    loom_err err = {{0}};
    loom_engine_opts o = {.prefix_cache = 1};
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(w, NULL, &o, &e, &err), -1);
    assert_non_null(strstr(err.msg, "sliding-window"));
    loom_model_free(w);
}

/* hooks serving another model's parameter arena, as loom_dp does at ZeRO 0-2 */
typedef struct hook_src {
    loom_model *m;
} hook_src;
static const float *hook_params(void *ctx, int u, int phase) {
    (void)phase;
    hook_src *h = ctx;
    size_t off, cnt;
    loom_model_unit_range(h->m, u, &off, &cnt);
    return loom_model_params(h->m) + off;
}

static void test_training_model(void **state) {
    (void)state;
    loom_model *own = make_model(LOOM_FLAVOR_LLAMA, 9);
    const loom_model_config *cfg = loom_model_get_config(own);
    loom_err err = {{0}};
    loom_model *tm = NULL; /* the trainer's kind of model: no parameter arena */
    assert_int_equal(loom_model_create_view(cfg, NULL, 2, cfg->max_seq_len, LOOM_MODEL_NO_ARENAS,
                                            &tm, &err), 0);
    hook_src hs = {own};
    loom_model_hooks h = {.ctx = &hs, .acquire_params = hook_params, .resident = 0};
    loom_model_set_hooks(tm, &h);
    assert_int_equal(loom_model_can_decode(tm), 0);
    loom_engine *e = NULL;
    assert_int_not_equal(loom_engine_create(tm, NULL, NULL, &e, &err), 0);
    assert_non_null(strstr(err.msg, "ZeRO stage 3"));
    h.resident = 1;
    loom_model_set_hooks(tm, &h);
    assert_int_equal(loom_model_can_decode(tm), 1);
    loom_engine *ea = NULL, *eb = NULL;
    assert_int_equal(loom_engine_create(own, NULL, NULL, &ea, &err), 0);
    assert_int_equal(loom_engine_create(tm, NULL, NULL, &eb, &err), 0);
    loom_gen_params gp = loom_gen_params_default();
    gp.temperature = 1.0f;
    gp.max_tokens = 20;
    gp.logprobs = 1;
    int64_t ia[4], ib[4];
    int32_t p[4][64];
    int np[4];
    for (int i = 0; i < 4; i++) {
        prompt_of(i + 3, 13, p[i], &np[i]);
        gp.seed = 77 + (uint64_t)i;
        assert_int_equal(loom_engine_submit(ea, p[i], np[i], &gp, NULL, NULL, &ia[i], &err), 0);
        assert_int_equal(loom_engine_submit(eb, p[i], np[i], &gp, NULL, NULL, &ib[i], &err), 0);
    }
    while (loom_engine_step(ea) > 0) {}
    while (loom_engine_step(eb) > 0) {}
    for (int i = 0; i < 4; i++) {
        const int32_t *ta, *tb;
        int na, nb;
        assert_int_equal(loom_engine_result(ea, ia[i], &ta, &na, NULL, NULL, NULL), 0);
        assert_int_equal(loom_engine_result(eb, ib[i], &tb, &nb, NULL, NULL, NULL), 0);
        assert_int_equal(na, 20);
        assert_int_equal(nb, na);
        assert_memory_equal(ta, tb, (size_t)na * sizeof(int32_t));
        const float *la = loom_engine_logprobs(ea, ia[i]), *lb = loom_engine_logprobs(eb, ib[i]);
        assert_non_null(la);
        assert_memory_equal(la, lb, (size_t)na * sizeof(float));
        int32_t seq[64];
        memcpy(seq, p[i], (size_t)np[i] * sizeof(int32_t));
        memcpy(seq + np[i], ta, (size_t)na * sizeof(int32_t));
        for (int j = 0; j < na; j++) { /* log softmax of the full forward's logits */
            const float *lg = loom_model_next_logits(own, seq, np[i] + j);
            double mx = lg[0], s = 0;
            for (int v = 1; v < cfg->vocab_size; v++) mx = lg[v] > mx ? lg[v] : mx;
            for (int v = 0; v < cfg->vocab_size; v++) s += exp(lg[v] - mx);
            const double want = lg[ta[j]] - mx - log(s);
            assert_true(fabs(la[j] - want) < 1e-4);
        }
    }
    gp.logprobs = 0; /* off: none recorded */
    int64_t id;
    assert_int_equal(loom_engine_submit(ea, p[0], np[0], &gp, NULL, NULL, &id, &err), 0);
    while (loom_engine_step(ea) > 0) {}
    assert_null(loom_engine_logprobs(ea, id));
    loom_engine_free(ea);
    loom_engine_free(eb);
    loom_model_free(tm);
    loom_model_free(own);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_gpt2),     cmocka_unit_test(test_greedy_llama),
        cmocka_unit_test(test_greedy_window),
        cmocka_unit_test(test_sampling_seeded), cmocka_unit_test(test_kv_budget_and_errors),
        cmocka_unit_test(test_stop_strings),    cmocka_unit_test(test_topk_topp),
        cmocka_unit_test(test_prefix_cache),    cmocka_unit_test(test_training_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
