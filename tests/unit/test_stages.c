/* Pipeline stages without MPI: a model split into p = 2 and p = 4 stage views (layers
 * [s L/p, (s+1) L/p), the embedding on the first, the final norm and head on the last), run one
 * after the other in one process with communication points that hand the residual stream from
 * stage to stage (STAGE_OUT -> STAGE_IN forward, STAGE_IN -> STAGE_OUT backward: what the
 * pipeline's send/recv does), equal the whole model: the loss, the logits and every gradient.
 * The tied GPT-2 embedding is held by the first stage (embedding) and the last (head): the sum
 * of their two wte gradients is the whole model's. Two micro-batches in flight in two arenas
 * per stage (forward A, forward B, backward A, backward B) give the gradients of both batches.
 * A stage's activation arena holds its layers only, and no head buffers before the last stage.
 * Tolerance: max|d| / max(max|whole grad of the tensor|, 1e-3 * max|whole grad|) <= 1e-5 (the
 * tied wte sums two partial gradients in another order; everything else is the same
 * arithmetic). */
#include "testutil.h"

#include <math.h>

#include "loom/model.h"

enum { B = 2, T = 7, L = 4 };

/* the one buffer the stages hand the stream (or its gradient) through */
typedef struct stage_link {
    float *buf;
    int64_t n;
    int calls[LOOM_CP_COUNT][2];
} stage_link;

typedef struct stage_ctx {
    stage_link *k;
    int first, last;
} stage_ctx;

static void stage_point(void *ctx, int point, int dir, int layer, int site, float *buf, int64_t n) {
    stage_ctx *s = ctx;
    (void)layer;
    (void)site;
    if (point != LOOM_CP_STAGE_IN && point != LOOM_CP_STAGE_OUT) return;
    s->k->calls[point][dir]++;
    assert_true(n == s->k->n);
    /* forward: out -> stage_link -> in; backward: in -> stage_link -> out */
    const int send = (dir == 0) == (point == LOOM_CP_STAGE_OUT);
    if (send && !(dir == 0 ? s->last : s->first)) memcpy(s->k->buf, buf, (size_t)n * sizeof(float));
    if (!send && !(dir == 0 ? s->first : s->last)) memcpy(buf, s->k->buf, (size_t)n * sizeof(float));
}

static double maxabs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

/* the whole model's tensor of the same name */
static const loom_tensor_info *same(const loom_model *whole, const loom_tensor_info *t) {
    return t->layer < 0 ? loom_model_global(whole, t->kind)
                        : loom_model_layer_tensor(whole, t->layer, t->kind);
}

static void tokens(const loom_model_config *c, uint64_t s, int32_t *x, int32_t *y) {
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)(loom_rng_u64(s, 1, (uint64_t)i) % (uint64_t)c->vocab_size);
        y[i] = i % 5 == 4 ? -1 : (int32_t)(loom_rng_u64(s, 2, (uint64_t)i) % (uint64_t)c->vocab_size);
    }
}

static void check_stages(const loom_model_config *cfg, int P) {
    loom_err err = {{0}};
    const int tied = cfg->flavor == LOOM_FLAVOR_GPT2;
    loom_model *whole = NULL, *st[4] = {0};
    if (loom_model_create(cfg, NULL, B, T, &whole, &err)) fail_msg("%s", err.msg);
    loom_model_init_weights(whole, 5);
    int32_t x1[B * T], y1[B * T], x2[B * T], y2[B * T];
    tokens(cfg, 1, x1, y1);
    tokens(cfg, 2, x2, y2);
    /* the whole model: both batches, each scaled by its own valid count */
    loom_model_zero_grad(whole);
    const float w1 = loom_model_forward(whole, x1, y1, B, T);
    const int64_t v1 = loom_model_valid_targets(whole);
    const size_t nlog = (size_t)B * T * (size_t)cfg->vocab_size;
    float *wlog = malloc(nlog * sizeof(float));
    memcpy(wlog, loom_model_logits(whole), nlog * sizeof(float));
    loom_model_backward(whole, 1.0f / (float)v1);
    const float w2 = loom_model_forward(whole, x2, y2, B, T);
    const int64_t v2 = loom_model_valid_targets(whole);
    loom_model_backward(whole, 1.0f / (float)v2);

    stage_link k = {.n = (int64_t)B * T * cfg->d_model};
    k.buf = malloc((size_t)k.n * sizeof(float));
    stage_ctx sc[4];
    loom_acts *a[4][2];
    loom_acts *wa = loom_acts_create(whole, B, T, 1);
    const size_t whole_acts = loom_acts_bytes(wa);
    loom_acts_free(wa);
    for (int s = 0; s < P; s++) {
        const loom_model_layout lay = {.l0 = s * L / P, .l1 = (s + 1) * L / P};
        if (loom_model_create(cfg, &lay, B, T, &st[s], &err)) fail_msg("%s", err.msg);
        loom_model_init_weights(st[s], 5);
        loom_model_zero_grad(st[s]);
        sc[s] = (stage_ctx){&k, s == 0, s == P - 1};
        const loom_comm_points cp = {.ctx = &sc[s], .fn = stage_point};
        loom_model_set_comm_points(st[s], &cp);
        a[s][0] = loom_acts_create(st[s], B, T, 1);
        a[s][1] = loom_acts_create(st[s], B, T, 1);
        /* a stage's arena: its layers only, the head's buffers on the last stage only */
        if (P > 1) assert_true(loom_acts_bytes(a[s][0]) < whole_acts);
    }
    for (int s = 0; s + 1 < P; s++) /* no logits, final norm or losses before the last stage */
        assert_true(loom_acts_bytes(a[s][0]) + (size_t)B * T * cfg->vocab_size * sizeof(float) <=
                    loom_acts_bytes(a[P - 1][0]));
    /* forward A through every stage, then B; backward A, then B */
    float l1 = 0, l2 = 0;
    for (int s = 0; s < P; s++) {
        const float r = loom_model_forward_acts(st[s], a[s][0], x1, y1, B, T);
        if (s == P - 1) l1 = r;
        else assert_true(r == 0.0f);
    }
    float *slog = malloc(nlog * sizeof(float));
    memcpy(slog, loom_acts_logits(a[P - 1][0]), nlog * sizeof(float));
    for (int s = 0; s < P; s++) {
        const float r = loom_model_forward_acts(st[s], a[s][1], x2, y2, B, T);
        if (s == P - 1) l2 = r;
    }
    for (int s = P - 1; s >= 0; s--) loom_model_backward_acts(st[s], a[s][0], 1.0f / (float)v1);
    for (int s = P - 1; s >= 0; s--) loom_model_backward_acts(st[s], a[s][1], 1.0f / (float)v2);
    /* each stage point called once per pass and direction on every stage */
    for (int p = LOOM_CP_STAGE_IN; p <= LOOM_CP_STAGE_OUT; p += LOOM_CP_STAGE_OUT)
        for (int d = 0; d < 2; d++) assert_int_equal(k.calls[p][d], 2 * P);

    if (fabs((double)l1 - w1) > 1e-5 * fabs((double)w1) || fabs((double)l2 - w2) > 1e-5 * fabs((double)w2))
        fail_msg("p=%d: losses %.7f %.7f, whole model %.7f %.7f", P, l1, l2, w1, w2);
    double lworst = 0;
    const double ls = maxabs(wlog, nlog);
    for (size_t i = 0; i < nlog; i++) lworst = fmax(lworst, fabs((double)slog[i] - wlog[i]) / ls);
    assert_true(lworst <= 1e-5);

    /* every tensor of every stage against the whole model's; the tied wte as a sum */
    const float *gw = loom_model_grads(whole);
    const double gall = maxabs(gw, loom_model_num_params(whole));
    size_t covered = 0;
    double worst = 0;
    const char *where = "";
    for (int s = 0; s < P; s++)
        for (int i = 0; i < loom_model_num_tensors(st[s]); i++) {
            const loom_tensor_info *t = loom_model_tensor(st[s], i);
            const loom_tensor_info *w = same(whole, t);
            assert_non_null(w);
            assert_int_equal(t->numel, w->numel);
            const int is_wte = t->layer < 0 && t->kind == LOOM_P_WTE;
            if (is_wte && s == P - 1 && P > 1) continue; /* added to stage 0's below */
            covered += t->numel;
            const double sc_ = fmax(maxabs(gw + w->offset, w->numel), 1e-3 * gall);
            const float *g = loom_model_grads(st[s]) + t->offset;
            const float *g2 = NULL;
            if (is_wte && tied && P > 1)
                g2 = loom_model_grads(st[P - 1]) + loom_model_global(st[P - 1], LOOM_P_WTE)->offset;
            for (size_t e = 0; e < t->numel; e++) {
                const double got = (double)g[e] + (g2 ? (double)g2[e] : 0.0);
                const double d = fabs(got - gw[w->offset + e]) / sc_;
                if (d > worst) worst = d, where = t->name;
            }
            /* the parameters of a stage are the whole model's (init keyed by name) */
            assert_memory_equal(loom_model_params(st[s]) + t->offset,
                                loom_model_params(whole) + w->offset, t->numel * sizeof(float));
        }
    assert_int_equal(covered, loom_model_num_params(whole)); /* every tensor held somewhere */
    print_message("flavor %d, %d stages: loss %.6f (whole %.6f), logits %.1e, worst gradient "
                  "difference %.2e (%s)\n", cfg->flavor, P, l1, w1, lworst, worst, where);
    assert_true(worst <= 1e-5);

    for (int s = 0; s < P; s++) {
        loom_acts_free(a[s][0]);
        loom_acts_free(a[s][1]);
        loom_model_free(st[s]);
    }
    free(k.buf);
    free(slog);
    free(wlog);
    loom_model_free(whole);
}

static const loom_model_config GPT2 = {
    .flavor = LOOM_FLAVOR_GPT2, .vocab_size = 37, .max_seq_len = 8, .n_layer = L, .n_head = 4,
    .n_kv_head = 4, .d_model = 32, .d_ff = 64, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.1f};
static const loom_model_config LLAMA = {
    .flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 41, .max_seq_len = 8, .n_layer = L, .n_head = 4,
    .n_kv_head = 2, .d_model = 32, .d_ff = 48, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.1f};

static void test_gpt2(void **state) {
    (void)state;
    check_stages(&GPT2, 2);
    check_stages(&GPT2, 4);
}

static void test_llama(void **state) {
    (void)state;
    check_stages(&LLAMA, 2);
    check_stages(&LLAMA, 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
