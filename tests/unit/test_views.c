/* Local views without MPI: the two tp = 2 views of one model, run in one process (one thread
 * each) with communication points that sum the views' partials (what tensor parallelism's
 * all-reduce does), equal the whole model: the weights of every box, the logits, the loss and
 * every gradient (each view's box of each tensor against the same elements of the whole
 * model's), for GPT-2 and for Llama with grouped-query attention, also with one kv head shared
 * by both views (n_kv_head 1 < tp: k and v's gradients summed over the views). Also: the
 * layout is checked
 * (degrees that do not divide, ranks, layer ranges, experts) and a pipeline stage's view holds
 * its layers only.
 * Tolerances: logits and loss max|d| / max|whole| <= 1e-5 (the partial sums add in another
 * order); gradients max|d| / max(max|whole grad of the tensor|, 1e-3 * max|whole grad|) <= 1e-5
 * (k_b's gradient is 0 analytically: rounding noise is measured against the model's scale).
 * Observed at the first commit: logits 2.3e-7, gradients 5.0e-7. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>

#include "loom/model.h"

enum { TP = 2, B = 2, T = 7 };

/* what the communication points share: the views meet at each all-reduce */
typedef struct group {
    pthread_barrier_t bar;
    float *slot[TP];
    const float *cslot[TP]; /* the moves' inputs */
    float *sum;
    int64_t sum_cap;
    int calls[TP][LOOM_CP_COUNT][2]; /* per view, point, direction */
} group;

typedef struct view_ctx {
    group *g;
    int rank;
} view_ctx;

/* all-reduce (sum, or max) of buf over the views: both combine the same two arrays in the same
 * order */
static void allreduce(view_ctx *v, float *buf, int64_t n, int max) {
    group *g = v->g;
    g->slot[v->rank] = buf;
    pthread_barrier_wait(&g->bar);
    if (v->rank == 0)
        for (int64_t i = 0; i < n; i++)
            g->sum[i] = max ? fmaxf(g->slot[0][i], g->slot[1][i]) : g->slot[0][i] + g->slot[1][i];
    pthread_barrier_wait(&g->bar);
    memcpy(buf, g->sum, (size_t)n * sizeof(float));
    pthread_barrier_wait(&g->bar);
}

static void tp_point(void *ctx, int point, int dir, int layer, int site, float *buf, int64_t n) {
    view_ctx *v = ctx;
    (void)layer;
    (void)site;
    v->g->calls[v->rank][point][dir]++;
    if ((point == LOOM_CP_ROW_OUT && dir == 0) || (point == LOOM_CP_COL_IN && dir == 1) ||
        (point == LOOM_CP_VOCAB_SUM && dir == 0) || point == LOOM_CP_QKNORM_SUM)
        allreduce(v, buf, n, 0);
    else if (point == LOOM_CP_VOCAB_MAX && dir == 0)
        allreduce(v, buf, n, 1);
}

/* sequence parallelism's moves between a view's row shard and the whole rows: all-gather (the
 * views' shards in rank order) or reduce-scatter (this view's rows of the sum) */
static void tp_move(void *ctx, int point, int dir, int layer, int site, const void *in,
                    int64_t n_in, void *out, int64_t n_out, size_t elem) {
    view_ctx *v = ctx;
    group *g = v->g;
    (void)layer;
    (void)site;
    g->calls[v->rank][point][dir]++;
    g->cslot[v->rank] = in;
    pthread_barrier_wait(&g->bar);
    if (n_out == TP * n_in) { /* (fp32 or bf16 elements: bytes moved) */
        for (int r = 0; r < TP; r++)
            memcpy((char *)out + (size_t)r * (size_t)n_in * elem, g->cslot[r],
                   (size_t)n_in * elem);
    } else {
        assert_true(n_in == TP * n_out && elem == sizeof(float));
        for (int64_t i = 0; i < n_out; i++)
            ((float *)out)[i] = g->cslot[0][v->rank * n_out + i] + g->cslot[1][v->rank * n_out + i];
    }
    pthread_barrier_wait(&g->bar);
}

typedef struct run {
    loom_model *m;
    view_ctx vc;
    const int32_t *x, *y;
    float loss;
    float *logits; /* kept before backward clobbers them */
    size_t nlog;
} run;

static void *run_view(void *arg) {
    run *r = arg;
    loom_model_zero_grad(r->m);
    r->loss = loom_model_forward(r->m, r->x, r->y, B, T);
    memcpy(r->logits, loom_model_logits(r->m), r->nlog * sizeof(float));
    loom_model_backward(r->m, 1.0f / (float)loom_model_valid_targets(r->m));
    return NULL;
}

static double maxabs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

static void check_views(const loom_model_config *cfg, int sp) {
    loom_err err = {{0}};
    loom_model *whole = NULL, *view[TP] = {0};
    if (loom_model_create(cfg, NULL, B, T, &whole, &err)) fail_msg("%s", err.msg);
    loom_model_init_weights(whole, 5);
    size_t view_params = 0;
    for (int r = 0; r < TP; r++) {
        const loom_model_layout lay = {.tp = TP, .tp_rank = r, .sp = sp};
        if (loom_model_create(cfg, &lay, B, T, &view[r], &err)) fail_msg("%s", err.msg);
        loom_model_init_weights(view[r], 5);
        view_params += loom_model_num_params(view[r]);
    }
    /* a view holds boxes only: less than the whole model, more than half of it */
    assert_true(view_params > loom_model_num_params(whole));
    assert_true(loom_model_num_params(view[0]) < loom_model_num_params(whole));

    /* every box initializes like the same elements of the whole model */
    for (int r = 0; r < TP; r++)
        for (int i = 0; i < loom_model_num_tensors(view[r]); i++) {
            const loom_tensor_info *t = loom_model_tensor(view[r], i);
            const loom_tensor_info *w = loom_model_tensor(whole, i);
            assert_string_equal(t->name, w->name);
            for (size_t k = 0; k < t->numel; k++)
                assert_true(loom_model_params(view[r])[t->offset + k] ==
                            loom_model_params(whole)[w->offset + (size_t)loom_tensor_global_index(t, (int64_t)k)]);
        }

    int32_t x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)(loom_rng_u64(3, 1, (uint64_t)i) % (uint64_t)cfg->vocab_size);
        y[i] = i % 5 == 4 ? -1 : (int32_t)(loom_rng_u64(3, 2, (uint64_t)i) % (uint64_t)cfg->vocab_size);
    }
    const size_t nlog = (size_t)B * T * (size_t)cfg->vocab_size;
    run rw = {.m = whole, .x = x, .y = y, .logits = malloc(nlog * sizeof(float)), .nlog = nlog};
    run_view(&rw);

    group g;
    memset(&g, 0, sizeof g);
    pthread_barrier_init(&g.bar, NULL, TP);
    g.sum = malloc((size_t)B * T * cfg->d_model * sizeof(float));
    run rv[TP];
    pthread_t th[TP];
    for (int r = 0; r < TP; r++) {
        int v0, vl;
        loom_model_vocab_range(view[r], &v0, &vl);
        const size_t nl = (size_t)B * T * (size_t)vl; /* the view's vocabulary columns */
        rv[r] = (run){.m = view[r], .vc = {&g, r}, .x = x, .y = y,
                      .logits = malloc(nl * sizeof(float)), .nlog = nl};
        const loom_comm_points cp = {.ctx = &rv[r].vc, .fn = tp_point, .move = tp_move};
        loom_model_set_comm_points(view[r], &cp);
    }
    for (int r = 0; r < TP; r++) assert_int_equal(pthread_create(&th[r], NULL, run_view, &rv[r]), 0);
    for (int r = 0; r < TP; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    pthread_barrier_destroy(&g.bar);
    free(g.sum);

    /* every point was called, per layer where it belongs, in both directions (COL_IN and
     * ROW_OUT also once for the vocab-parallel head and embedding; the cross-entropy's
     * reductions forward only) */
    for (int r = 0; r < TP; r++)
        for (int p = 0; p < LOOM_CP_COUNT; p++) {
            const int per = p == LOOM_CP_STAGE_IN || p == LOOM_CP_STAGE_OUT ? 1
                            : p == LOOM_CP_COL_IN || p == LOOM_CP_ROW_OUT   ? 2 * cfg->n_layer + 1
                            : p == LOOM_CP_VOCAB_MAX || p == LOOM_CP_VOCAB_SUM ? 1
                            : p == LOOM_CP_VOCAB_GATHER ? 0 /* decoding's */
                            : p == LOOM_CP_QKNORM_SUM /* whole-projection q/k norms only */
                                ? (cfg->arch.qk_norm == LOOM_QK_NORM_WHOLE &&
                                   cfg->flavor == LOOM_FLAVOR_ARCH ? cfg->n_layer : 0)
                                                                              : cfg->n_layer;
            const int per_bwd = p == LOOM_CP_VOCAB_MAX || p == LOOM_CP_VOCAB_SUM ? 0 : per;
            /* sequence parallelism gathers each layer's two norm outputs again in backward */
            const int again = sp && p == LOOM_CP_COL_IN ? 2 * cfg->n_layer : 0;
            if (g.calls[r][p][0] != per + again || g.calls[r][p][1] != per_bwd)
                fail_msg("view %d: point %s called %d/%d times (fwd/bwd), want %d/%d", r,
                         loom_comm_point_name(p), g.calls[r][p][0], g.calls[r][p][1], per,
                         per_bwd);
        }

    for (int r = 0; r < TP; r++) {
        const double d = fabs((double)rv[r].loss - rw.loss) / fabs((double)rw.loss);
        if (d > 1e-5) fail_msg("view %d: loss %.7f, whole model %.7f", r, rv[r].loss, rw.loss);
        const double s = maxabs(rw.logits, rw.nlog);
        double worst = 0;
        int v0, vl; /* the view's logits are its vocabulary columns */
        loom_model_vocab_range(view[r], &v0, &vl);
        const size_t V = (size_t)cfg->vocab_size;
        assert_true(v0 == r * (int)(V / TP) + (r < (int)(V % TP) ? r : (int)(V % TP)));
        for (size_t i = 0; i < rw.nlog / V; i++)
            for (size_t j = 0; j < (size_t)vl; j++)
                worst = fmax(worst, fabs((double)rv[r].logits[i * (size_t)vl + j] -
                                         rw.logits[i * V + (size_t)v0 + j]) / s);
        print_message("flavor %d view %d: loss %.6f (whole %.6f), logits max rel diff %.2e\n",
                      cfg->flavor, r, rv[r].loss, rw.loss, worst);
        assert_true(worst <= 1e-5);
        free(rv[r].logits);
    }
    free(rw.logits);

    const float *gw = loom_model_grads(whole);
    const double gall = maxabs(gw, loom_model_num_params(whole));
    double worst = 0;
    const char *where = "";
    for (int r = 0; r < TP; r++)
        for (int i = 0; i < loom_model_num_tensors(view[r]); i++) {
            const loom_tensor_info *t = loom_model_tensor(view[r], i);
            const loom_tensor_info *w = loom_model_tensor(whole, i);
            const double s = fmax(maxabs(gw + w->offset, w->numel), 1e-3 * gall);
            const float *gv = loom_model_grads(view[r]) + t->offset;
            /* sequence parallelism: the norms' gradients are partial sums over the views */
            const int sp_part = loom_model_grad_tp_partial(view[r], t);
            /* (and per-head q/k norm weights: each view's heads' part) */
            const int head_norm = cfg->flavor == LOOM_FLAVOR_ARCH &&
                                  cfg->arch.qk_norm == LOOM_QK_NORM_HEAD &&
                                  strstr(t->name, "_norm_w") != NULL;
            assert_int_equal(sp_part, head_norm || (sp && t->split_dim < 0 &&
                                                    (strstr(t->name, "ln") ||
                                                     strstr(t->name, "_post_w"))));
            /* one kv head shared by both views (n_kv_head 1): k and v's gradients are each
             * view's query heads' parts, summed over the views (dp.c's reduce_kv_replicas) */
            const int shared = t->tp_replicas > 1;
            assert_int_equal(shared, cfg->n_kv_head < TP && (strstr(t->name, ".k_") || strstr(t->name, ".v_")));
            assert_int_equal(loom_model_tp_owner(view[r], t), t->split_dim < 0 || shared ? r == 0 : 1);
            const int partial = sp_part || shared;
            if (partial && r > 0) continue;
            for (size_t k = 0; k < t->numel; k++) {
                double gk = gv[k];
                for (int q = 1; partial && q < TP; q++)
                    gk += loom_model_grads(view[q])[loom_model_tensor(view[q], i)->offset + k];
                const double d = fabs(gk - gw[w->offset + (size_t)loom_tensor_global_index(t, (int64_t)k)]) / s;
                if (d > worst) {
                    worst = d;
                    where = t->name;
                }
            }
        }
    print_message("flavor %d: worst gradient difference %.2e (%s)\n", cfg->flavor, worst, where);
    assert_true(worst <= 1e-5);
    for (int r = 0; r < TP; r++) loom_model_free(view[r]);
    loom_model_free(whole);
}

static const loom_model_config GPT2 = {
    .flavor = LOOM_FLAVOR_GPT2, .vocab_size = 37, .max_seq_len = 8, .n_layer = 2, .n_head = 4,
    .n_kv_head = 4, .d_model = 32, .d_ff = 64, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.02f};
static const loom_model_config LLAMA = {
    .flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 41, .max_seq_len = 8, .n_layer = 2, .n_head = 4,
    .n_kv_head = 2, .d_model = 32, .d_ff = 48, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.1f};

/* one kv head, replicated over the two views (each holds all of k_w, v_w) */
static const loom_model_config LLAMA_KV1 = {
    .flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 41, .max_seq_len = 8, .n_layer = 2, .n_head = 4,
    .n_kv_head = 1, .d_model = 32, .d_ff = 48, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.1f};
/* 6 heads, 2 kv heads: tp 3 neither divides 2 nor is a multiple of it */
static const loom_model_config LLAMA_H6 = {
    .flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 41, .max_seq_len = 8, .n_layer = 2, .n_head = 6,
    .n_kv_head = 2, .d_model = 24, .d_ff = 48, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.1f};

static void test_gpt2(void **state) {
    (void)state;
    check_views(&GPT2, 0);
}

static void test_llama_gqa(void **state) {
    (void)state;
    check_views(&LLAMA, 0);
}

/* sequence parallelism: the norm / residual regions hold half the rows of each view; the moves
 * gather and reduce-scatter them; the norms' gradients summed over the views equal the whole's */
static void test_gpt2_sp(void **state) {
    (void)state;
    check_views(&GPT2, 1);
}

static void test_llama_sp(void **state) {
    (void)state;
    check_views(&LLAMA, 1);
}

static void test_llama_kv_shared(void **state) {
    (void)state;
    check_views(&LLAMA_KV1, 0);
    check_views(&LLAMA_KV1, 1);
}

/* OLMo 2's features: post-norms (no pre-norms; under sequence parallelism on the row shard)
 * and q/k norms over the whole projections (each view's heads' sums added at QKNORM_SUM, the
 * weights split with the heads); and Gemma's: sandwich norms, GeGLU, the embedding scale and
 * the final-logit soft-cap (vocab-parallel cross-entropy through the cap) */
static loom_model_config arch_cfg(const char *name) {
    loom_model_config c = LLAMA;
    c.flavor = LOOM_FLAVOR_ARCH;
    c.arch = *loom_arch_named(!strcmp(name, "gemma") ? "llama" : name);
    if (!strcmp(name, "gemma")) {
        c.arch.norm_place = LOOM_NORM_SANDWICH;
        c.arch.mlp = LOOM_MLP_GEGLU;
        c.arch.embed_scale = 1;
        c.arch.final_softcap = 0.5f; /* small: the cap bends these logits */
        c.arch.qk_norm = LOOM_QK_NORM_HEAD;
        c.arch.tied = 1;
    }
    return c;
}

static void test_olmo2(void **state) {
    (void)state;
    const loom_model_config c = arch_cfg("olmo2");
    check_views(&c, 0);
    check_views(&c, 1);
}

static void test_gemma_features(void **state) {
    (void)state;
    const loom_model_config c = arch_cfg("gemma");
    check_views(&c, 0);
    check_views(&c, 1);
}

static void test_layout_checked(void **state) {
    (void)state;
    loom_model *m = NULL;
    loom_model_layout lay = {.tp = 3};
    TU_ASSERT_ERR(loom_model_create(&LLAMA, &lay, 1, 4, &m, TU_ERR), "degree 3", "n_head (4)");
    lay = (loom_model_layout){.tp = 3}; /* divides n_head, neither divides n_kv_head nor is a
                                         * multiple of it */
    TU_ASSERT_ERR(loom_model_create(&LLAMA_H6, &lay, 1, 4, &m, TU_ERR), "n_kv_head (2)");
    lay = (loom_model_layout){.tp = 4, .cp = 2}; /* shared kv heads are not split over cp */
    TU_ASSERT_ERR(loom_model_create(&LLAMA, &lay, 1, 4, &m, TU_ERR), "context parallelism");
    assert_null(m);
    /* tp 4, 2 kv heads: tp ranks 2 and 3 share kv head 1 (rows 8..15 of k_w) */
    lay = (loom_model_layout){.tp = 4, .tp_rank = 3};
    loom_err err = {{0}};
    if (loom_model_create(&LLAMA, &lay, 1, 4, &m, &err)) fail_msg("%s", err.msg);
    const loom_tensor_info *k = loom_model_layer_tensor(m, 0, LOOM_L_K_W);
    assert_int_equal(k->tp_replicas, 2);
    assert_int_equal(k->box_off[0], 8);
    assert_int_equal(k->box_len[0], 8);
    assert_false(loom_model_tp_owner(m, k));
    loom_model_free(m);
    m = NULL;
    lay = (loom_model_layout){.tp = 2, .tp_rank = 2};
    TU_ASSERT_ERR(loom_model_create(&LLAMA, &lay, 1, 4, &m, TU_ERR), "tp rank 2 of degree 2");
    lay = (loom_model_layout){.l0 = 1, .l1 = 1};
    TU_ASSERT_ERR(loom_model_create(&LLAMA, &lay, 1, 4, &m, TU_ERR), "layer range [1, 1)");
    lay = (loom_model_layout){.l0 = 0, .l1 = 3};
    TU_ASSERT_ERR(loom_model_create(&LLAMA, &lay, 1, 4, &m, TU_ERR), "[0, 3)", "2 layers");
    lay = (loom_model_layout){.e0 = 0, .e1 = 2};
    TU_ASSERT_ERR(loom_model_create(&LLAMA, &lay, 1, 4, &m, TU_ERR), "no experts");
    /* whole-projection q/k norms: a kv head's sum is not split over tp ranks sharing it */
    loom_model_config o = arch_cfg("olmo2");
    o.n_kv_head = 1;
    lay = (loom_model_layout){.tp = 2};
    TU_ASSERT_ERR(loom_model_create(&o, &lay, 1, 4, &m, TU_ERR), "qk_norm: whole", "n_kv_head (1)");
    /* post-norms and GeGLU with MoE layers are refused, naming the key */
    o = arch_cfg("olmo2");
    o.n_expert = 2, o.top_k = 1, o.moe_every = 1;
    TU_ASSERT_ERR(loom_model_create(&o, NULL, 1, 4, &m, TU_ERR), "norm_place", "MoE");
    o = arch_cfg("gemma");
    o.arch.norm_place = LOOM_NORM_PRE;
    o.n_expert = 2, o.top_k = 1, o.moe_every = 1;
    TU_ASSERT_ERR(loom_model_create(&o, NULL, 1, 4, &m, TU_ERR), "geglu", "MoE");
    assert_null(m);
}

/* a pipeline stage's view: its layers only, the embedding on the first stage, the head (and
 * for tied gpt2 the wte it reads) on the last */
static void test_stage_views(void **state) {
    (void)state;
    loom_err err = {{0}};
    loom_model *whole, *s0, *s1;
    const loom_model_layout first = {.l0 = 0, .l1 = 1}, last = {.l0 = 1, .l1 = 2};
    assert_int_equal(loom_model_create_view(&GPT2, NULL, 1, 4, 0, &whole, &err), 0);
    assert_int_equal(loom_model_create_view(&GPT2, &first, 1, 4, 0, &s0, &err), 0);
    assert_int_equal(loom_model_create_view(&GPT2, &last, 1, 4, 0, &s1, &err), 0);
    assert_true(loom_model_get_layout(s0)->has_embedding && !loom_model_get_layout(s0)->has_head);
    assert_true(!loom_model_get_layout(s1)->has_embedding && loom_model_get_layout(s1)->has_head);
    assert_non_null(loom_model_layer_tensor(s0, 0, LOOM_L_Q_W));
    assert_null(loom_model_layer_tensor(s0, 1, LOOM_L_Q_W));
    assert_null(loom_model_layer_tensor(s1, 0, LOOM_L_Q_W));
    assert_non_null(loom_model_layer_tensor(s1, 1, LOOM_L_Q_W));
    assert_null(loom_model_global(s0, LOOM_P_LNF_W));
    assert_non_null(loom_model_global(s1, LOOM_P_LNF_W));
    assert_null(loom_model_global(s1, LOOM_P_WPE));
    assert_non_null(loom_model_global(s1, LOOM_P_WTE)); /* the tied head */
    const size_t wte = loom_model_global(whole, LOOM_P_WTE)->numel;
    assert_int_equal(loom_model_num_params(s0) + loom_model_num_params(s1),
                     loom_model_num_params(whole) + wte);
    assert_int_equal(loom_model_num_units(s1), 3);
    size_t off, cnt;
    loom_model_unit_range(s1, 1, &off, &cnt); /* layer 1 is the stage's unit 1 */
    assert_int_equal(off, loom_model_layer_tensor(s1, 1, LOOM_L_LN1_W)->offset);
    loom_model_free(whole);
    loom_model_free(s0);
    loom_model_free(s1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_gpt2_sp),
        cmocka_unit_test(test_llama_sp),
        cmocka_unit_test(test_llama_gqa),
        cmocka_unit_test(test_llama_kv_shared),
        cmocka_unit_test(test_olmo2),
        cmocka_unit_test(test_gemma_features),
        cmocka_unit_test(test_layout_checked),
        cmocka_unit_test(test_stage_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
