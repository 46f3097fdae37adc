/* Tensor-parallel decoding without MPI: the two tp = 2 views of one model, each in its own
 * thread with communication points that do what parallel/tp.c does over MPI (ROW_OUT: sum of
 * the views' partials; VOCAB_GATHER: the views' padded logits in rank order):
 * - loom_model_decode_batch over ragged segments (prefills, a prompt chunk without logits,
 *   decode rows, two steps on the same caches) gives every view the whole logits, the same bits
 *   on both views, and equal to the whole model's within 1e-5 of their scale (the partial sums
 *   add in another order); GPT-2 with a vocabulary that tp does not divide (253), Llama with
 *   grouped-query attention (2 kv heads, one per view) and with one kv head shared by both
 *   views, and a sliding-window Llama (its ring caches); OLMo 2's features (whole q/k norms:
 *   their sums added at QKNORM_SUM) and Gemma's block features (sandwich norms, GeGLU,
 *   embedding scale, final soft-cap of the gathered logits). Each view's cache holds its kv
 *   heads only;
 * - the inference engine (continuous batching, prefill chunks) on the views generates the
 *   whole model's tokens, greedy and sampled with seeds, the same on both views.
 * Observed at the first commit: logits max rel diff 2.9e-7 .. 6.9e-7. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>

#include "loom/infer.h"
#include "loom/model.h"

enum { TP = 2, NSEQ = 3, CAP = 40, NREQ = 7 };

/* what the views' points share */
typedef struct group {
    pthread_barrier_t bar;
    float *slot[TP];
    const float *cslot[TP];
    float *sum;
    int64_t cap;
    int row_out[TP], gather[TP];
} group;

typedef struct view_ctx {
    group *g;
    int rank;
} view_ctx;

static void tp_point(void *ctx, int point, int dir, int layer, int site, float *buf, int64_t n) {
    view_ctx *v = ctx;
    group *g = v->g;
    (void)layer;
    (void)site;
    assert_int_equal(dir, 0); /* decoding is forward only */
    if (point != LOOM_CP_ROW_OUT && point != LOOM_CP_QKNORM_SUM) return;
    /* (whole-projection q/k norms: the views' heads' sums of squares add too) */
    if (point == LOOM_CP_ROW_OUT) g->row_out[v->rank]++;
    assert_true(n <= g->cap);
    g->slot[v->rank] = buf;
    pthread_barrier_wait(&g->bar);
    if (v->rank == 0)
        for (int64_t i = 0; i < n; i++) g->sum[i] = g->slot[0][i] + g->slot[1][i];
    pthread_barrier_wait(&g->bar);
    memcpy(buf, g->sum, (size_t)n * sizeof(float));
    pthread_barrier_wait(&g->bar);
}

static void tp_move(void *ctx, int point, int dir, int layer, int site, const void *in,
                    int64_t n_in, void *out, int64_t n_out, size_t elem) {
    view_ctx *v = ctx;
    group *g = v->g;
    (void)layer;
    assert_int_equal(point, LOOM_CP_VOCAB_GATHER);
    assert_int_equal(dir, 0);
    assert_int_equal(site, LOOM_SITE_HEAD);
    assert_true(n_out == TP * n_in && elem == sizeof(float));
    g->gather[v->rank]++;
    g->cslot[v->rank] = in;
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < TP; r++)
        memcpy((float *)out + r * n_in, g->cslot[r], (size_t)n_in * sizeof(float));
    pthread_barrier_wait(&g->bar);
}

/* flavor 2 (LOOM_FLAVOR_ARCH): a sliding window; 3: olmo2 (post-norms, whole q/k norms); 4:
 * Gemma's block features (sandwich norms, GeGLU, embedding scale, final soft-cap, per-head q/k
 * norms, tied) */
static loom_model_config config(int flavor, int kv) {
    loom_model_config c = {.flavor = flavor >= LOOM_FLAVOR_ARCH ? LOOM_FLAVOR_ARCH : flavor,
                           .vocab_size = flavor ? 256 : 253, .max_seq_len = 64, .n_layer = 2,
                           .n_head = 4, .n_kv_head = kv, .d_model = 64, .d_ff = flavor ? 96 : 256,
                           .norm_eps = 1e-5f, .rope_theta = 10000.0f, .init_std = 0.2f};
    if (flavor == LOOM_FLAVOR_ARCH) { /* Llama with a sliding window of 4 on every layer */
        c.arch = *loom_arch_named("llama");
        c.arch.sliding_window = 4;
    }
    if (flavor > LOOM_FLAVOR_ARCH) c.arch = *loom_arch_named(flavor == 3 ? "olmo2" : "llama");
    if (flavor == 4) {
        c.arch.norm_place = LOOM_NORM_SANDWICH;
        c.arch.mlp = LOOM_MLP_GEGLU;
        c.arch.embed_scale = 1;
        c.arch.final_softcap = 6.0f;
        c.arch.qk_norm = LOOM_QK_NORM_HEAD;
        c.arch.tied = 1;
    }
    return c;
}

static loom_model *make(const loom_model_config *c, int rank) {
    loom_err err = {{0}};
    loom_model *m = NULL;
    const loom_model_layout lay = {.tp = TP, .tp_rank = rank};
    if (loom_model_create_view(c, rank >= 0 ? &lay : NULL, 1, c->max_seq_len, LOOM_MODEL_INFER,
                               &m, &err))
        fail_msg("%s", err.msg);
    loom_model_init_weights(m, 17);
    return m;
}

/* ---- two ragged steps ---------------------------------------------------------------------- */

static const int plen[NSEQ] = {6, 1, 11};
static const int32_t step2_tok[] = {65, 66, 1, 2, 3, 4}; /* seq 0, seq 1, seq 2's last 4 */

typedef struct steps_run {
    loom_model *m;
    view_ctx vc;
    float *kv[NSEQ][2];
    float logits[2][NSEQ * 256]; /* per step: (segments with logits, V) */
    int nlog[2];
} steps_run;

static void *run_steps(void *arg) {
    steps_run *s = arg;
    const int V = loom_model_get_config(s->m)->vocab_size;
    const size_t nkv = loom_model_kv_floats(s->m, CAP); /* a sliding layer: its window's rows */
    for (int i = 0; i < NSEQ; i++)
        for (int j = 0; j < 2; j++) s->kv[i][j] = calloc(nkv, sizeof(float));
    loom_decode_ws *w = loom_decode_ws_create(s->m, 32, NSEQ);
    int32_t tok[32];
    int n = 0;
    for (int i = 0; i < NSEQ; i++)
        for (int j = 0; j < plen[i] - (i == 2 ? 4 : 0); j++) tok[n++] = (int32_t)((i * 31 + j * 7) % V);
    /* step 1: two prompts whole, the third's first 7 tokens (no logits) */
    loom_decode_seg seg[NSEQ];
    for (int i = 0; i < NSEQ; i++)
        seg[i] = (loom_decode_seg){.k = s->kv[i][0], .v = s->kv[i][1], .cap = CAP, .pos0 = 0,
                                   .n = plen[i] - (i == 2 ? 4 : 0), .want_logits = i < 2};
    const float *lg = loom_model_decode_batch(s->m, w, tok, seg, NSEQ);
    memcpy(s->logits[0], lg, 2 * (size_t)V * sizeof(float));
    s->nlog[0] = 2;
    /* step 2: one decoded token each for sequences 0 and 1, the rest of prompt 2 */
    seg[0].pos0 = plen[0], seg[0].n = 1;
    seg[1].pos0 = plen[1], seg[1].n = 1;
    seg[2].pos0 = plen[2] - 4, seg[2].n = 4, seg[2].want_logits = 1;
    lg = loom_model_decode_batch(s->m, w, step2_tok, seg, NSEQ);
    memcpy(s->logits[1], lg, NSEQ * (size_t)V * sizeof(float));
    s->nlog[1] = NSEQ;
    loom_decode_ws_free(w);
    for (int i = 0; i < NSEQ; i++)
        for (int j = 0; j < 2; j++) free(s->kv[i][j]);
    return NULL;
}

static void check_steps(int flavor, int kv) {
    const loom_model_config c = config(flavor, kv);
    const int V = c.vocab_size;
    steps_run whole = {.m = make(&c, -1)};
    run_steps(&whole);
    group g;
    memset(&g, 0, sizeof g);
    pthread_barrier_init(&g.bar, NULL, TP);
    g.cap = 32 * (int64_t)c.d_model;
    g.sum = malloc((size_t)g.cap * sizeof(float));
    steps_run v[TP];
    pthread_t th[TP];
    for (int r = 0; r < TP; r++) {
        v[r] = (steps_run){.m = make(&c, r), .vc = {&g, r}};
        const loom_comm_points cp = {.ctx = &v[r].vc, .fn = tp_point, .move = tp_move};
        loom_model_set_comm_points(v[r].m, &cp);
        /* the view's cache: its kv heads (one shared kv head: that one) */
        const int kvh = kv >= TP ? kv / TP : 1;
        assert_int_equal(loom_model_kv_floats_per_pos(v[r].m),
                         (size_t)c.n_layer * (size_t)kvh * (size_t)(c.d_model / c.n_head));
    }
    for (int r = 0; r < TP; r++) assert_int_equal(pthread_create(&th[r], NULL, run_steps, &v[r]), 0);
    for (int r = 0; r < TP; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    for (int r = 0; r < TP; r++) {
        /* per step: the embedding's and every layer's two row-parallel outputs; one gather */
        assert_int_equal(g.row_out[r], 2 * (2 * c.n_layer + 1));
        assert_int_equal(g.gather[r], 2);
    }
    double worst = 0;
    for (int st = 0; st < 2; st++) {
        const size_t n = (size_t)whole.nlog[st] * (size_t)V;
        double scale = 0;
        for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)whole.logits[st][i]));
        for (int r = 0; r < TP; r++) {
            assert_int_equal(v[r].nlog[st], whole.nlog[st]);
            if (memcmp(v[r].logits[st], v[0].logits[st], n * sizeof(float)))
                fail_msg("step %d: view %d's logits differ from view 0's", st + 1, r);
            for (size_t i = 0; i < n; i++)
                worst = fmax(worst, fabs((double)v[r].logits[st][i] - whole.logits[st][i]) / scale);
        }
    }
    print_message("flavor %d, %d kv heads, V %d: tp 2 decode logits max rel diff %.2e\n", flavor,
                  kv, V, worst);
    assert_true(worst <= 1e-5);
    for (int r = 0; r < TP; r++) loom_model_free(v[r].m);
    loom_model_free(whole.m);
    pthread_barrier_destroy(&g.bar);
    free(g.sum);
}

static void test_steps_gpt2(void **state) {
    (void)state;
    check_steps(LOOM_FLAVOR_GPT2, 4);
}

static void test_steps_llama_gqa(void **state) {
    (void)state;
    check_steps(LOOM_FLAVOR_LLAMA, 2);
}

static void test_steps_llama_shared_kv(void **state) {
    (void)state;
    check_steps(LOOM_FLAVOR_LLAMA, 1);
}

/* a sliding window of 4 (prefills of 6, 7 and 11 rows into the views' rings) */
static void test_steps_window(void **state) {
    (void)state;
    check_steps(LOOM_FLAVOR_ARCH, 2);
}

static void test_steps_olmo2_gemma_features(void **state) {
    (void)state;
    check_steps(3, 2);
    check_steps(4, 2);
}

/* ---- the engine on the views --------------------------------------------------------------- */

typedef struct engine_run {
    loom_model *m;
    view_ctx vc;
    float temperature;
    int32_t out[NREQ][32];
    int nout[NREQ];
    int steps;
} engine_run;

static void *run_engine(void *arg) {
    engine_run *s = arg;
    loom_err err = {{0}};
    loom_engine *e = NULL;
    const loom_engine_opts o = {.max_batch = 3, .max_step_tokens = 12};
    assert_int_equal(loom_engine_create(s->m, NULL, &o, &e, &err), 0);
    int64_t id[NREQ];
    loom_gen_params p = loom_gen_params_default();
    p.temperature = s->temperature;
    p.top_k = 0;
    for (int i = 0; i < NREQ; i++) {
        int32_t prompt[40];
        const int n = 1 + (i * 11) % 23; /* 1 .. 23 tokens: some prefill over several steps */
        for (int j = 0; j < n; j++) prompt[j] = (int32_t)(loom_rng_u64(7, (uint64_t)i, (uint64_t)j) % 256);
        p.max_tokens = 4 + (i * 5) % 20;
        p.seed = 1000 + (uint64_t)i;
        assert_int_equal(loom_engine_submit(e, prompt, n, &p, NULL, NULL, &id[i], &err), 0);
    }
    while (loom_engine_step(e) > 0) s->steps++;
    for (int i = 0; i < NREQ; i++) {
        const int32_t *t;
        assert_int_equal(loom_engine_result(e, id[i], &t, &s->nout[i], NULL, NULL, NULL), 0);
        assert_true(s->nout[i] <= 32);
        memcpy(s->out[i], t, (size_t)s->nout[i] * sizeof(int32_t));
    }
    loom_engine_free(e);
    return NULL;
}

static void check_engine(float temperature) {
    const loom_model_config c = config(LOOM_FLAVOR_LLAMA, 2);
    engine_run whole = {.m = make(&c, -1), .temperature = temperature};
    run_engine(&whole);
    group g;
    memset(&g, 0, sizeof g);
    pthread_barrier_init(&g.bar, NULL, TP);
    g.cap = 12 * (int64_t)c.d_model;
    g.sum = malloc((size_t)g.cap * sizeof(float));
    engine_run v[TP];
    pthread_t th[TP];
    for (int r = 0; r < TP; r++) {
        v[r] = (engine_run){.m = make(&c, r), .vc = {&g, r}, .temperature = temperature};
        const loom_comm_points cp = {.ctx = &v[r].vc, .fn = tp_point, .move = tp_move};
        loom_model_set_comm_points(v[r].m, &cp);
    }
    for (int r = 0; r < TP; r++) assert_int_equal(pthread_create(&th[r], NULL, run_engine, &v[r]), 0);
    for (int r = 0; r < TP; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    int total = 0, distinct = 0, seen[256] = {0};
    for (int r = 0; r < TP; r++) {
        assert_int_equal(v[r].steps, whole.steps);
        assert_true(g.gather[r] > 0 && g.gather[r] <= whole.steps + 1);
        for (int i = 0; i < NREQ; i++) {
            if (v[r].nout[i] != whole.nout[i] ||
                memcmp(v[r].out[i], whole.out[i], (size_t)whole.nout[i] * sizeof(int32_t)))
                fail_msg("temperature %.1f: view %d, request %d: tokens differ from the whole "
                         "model's", (double)temperature, r, i);
        }
    }
    for (int i = 0; i < NREQ; i++)
        for (int j = 0; j < whole.nout[i]; j++, total++) distinct += !seen[whole.out[i][j]]++;
    print_message("temperature %.1f: %d requests, %d tokens (%d distinct) in %d steps: the tp 2 "
                  "views generate the whole model's tokens\n", (double)temperature, NREQ, total,
                  distinct, whole.steps);
    assert_true(distinct >= 8); /* the comparison covers more than one token */
    for (int r = 0; r < TP; r++) loom_model_free(v[r].m);
    loom_model_free(whole.m);
    pthread_barrier_destroy(&g.bar);
    free(g.sum);
}

static void test_engine_greedy(void **state) {
    (void)state;
    check_engine(0.0f);
}

static void test_engine_sampled(void **state) {
    (void)state;
    check_engine(0.9f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps_gpt2),
        cmocka_unit_test(test_steps_llama_gqa),
        cmocka_unit_test(test_steps_llama_shared_kv),
        cmocka_unit_test(test_steps_window),
        cmocka_unit_test(test_steps_olmo2_gemma_features),
        cmocka_unit_test(test_engine_greedy),
        cmocka_unit_test(test_engine_sampled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
