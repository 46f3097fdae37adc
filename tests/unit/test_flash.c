/* flash_attention_forward/backward under ASan/UBSan against a naive double-precision reference:
 * strided views with gaps between rows (row strides larger than the heads they hold), exactly
 * sized buffers (a read or write past any of them is an ASan error), D = 20 (not a multiple of
 * the 16-lane vectors: masked tails), Tq and Tk not multiples of the 64-row tile, GQA, causal
 * with query/key offsets, document ids, rows that see no key (out 0, lse -inf), sliding
 * windows (qpos - kpos < W, across tile edges and with offsets and documents), soft-capped
 * scores and a custom scale, every ISA this CPU runs. Max relative error 1e-5 (fp32 against
 * double). */
#include "testutil.h"

#include <math.h>

#include "loom/kernels.h"

typedef struct {
    int B, Tq, Tk, H, KVH, D, causal;
    int64_t q0, k0;
    int docs;
    int64_t window;      /* 0: none */
    float scale, softcap; /* 0: 1/sqrt(D), none */
} cfg;

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_buf(size_t n, uint64_t *s) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = frand(s);
    return p;
}

static double max_abs(const double *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* max |got - ref| / max |ref| over the elements (b, t, h, x) of a strided view */
static double view_err(const float *got, const double *ref, int B, int T, int nh, int D,
                       int64_t bs, int64_t ts) {
    size_t n = (size_t)B * T * nh * D;
    double scale = fmax(max_abs(ref, n), 1e-30), e = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++)
                for (int x = 0; x < D; x++) {
                    size_t ri = (((size_t)b * T + t) * nh + h) * D + x;
                    e = fmax(e, fabs(got[b * bs + t * ts + h * D + x] - ref[ri]));
                }
    return e / scale;
}

static void run(const cfg *c, int isa, uint64_t seed) {
    const int B = c->B, Tq = c->Tq, Tk = c->Tk, H = c->H, KVH = c->KVH, D = c->D, G = H / KVH;
    /* rows with gaps: every view's row stride exceeds what the row holds */
    const int64_t q_ts = (int64_t)H * D + 3, k_ts = (int64_t)KVH * D + 5,
                  v_ts = (int64_t)KVH * D + 1, o_ts = (int64_t)H * D + 2;
    loom_attn_dims d = {B, Tq, Tk, H, KVH, D, Tq * q_ts, q_ts, Tk * k_ts, k_ts,
                        Tk * v_ts, v_ts, Tq * o_ts, o_ts};
    const size_t nq = (size_t)B * Tq * q_ts, nk = (size_t)B * Tk * k_ts,
                 nv = (size_t)B * Tk * v_ts, no = (size_t)B * Tq * o_ts;
    uint64_t s = seed;
    float *q = rand_buf(nq, &s), *k = rand_buf(nk, &s), *v = rand_buf(nv, &s);
    float *dout = rand_buf(no, &s);
    float *out = calloc(no, sizeof(float)), *lse = malloc((size_t)B * H * Tq * sizeof(float));
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nk, sizeof(float)),
          *dv = calloc(nv, sizeof(float));
    int32_t *qdoc = NULL, *kdoc = NULL;
    loom_attn_mask mk = {c->causal, c->q0, c->k0, NULL, NULL, 0, 0, c->window, c->scale,
                         c->softcap};
    if (c->docs) { /* documents by absolute position: [0,40), [40,90), [90, ...) */
        qdoc = malloc((size_t)B * Tq * sizeof(int32_t));
        kdoc = malloc((size_t)B * Tk * sizeof(int32_t));
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < Tq; i++) {
                int64_t p = c->q0 + i;
                qdoc[b * Tq + i] = b == 0 ? (p < 40 ? 0 : p < 90 ? 1 : 2) : 7;
            }
            for (int j = 0; j < Tk; j++) {
                int64_t p = c->k0 + j;
                kdoc[b * Tk + j] = b == 0 ? (p < 40 ? 0 : p < 90 ? 1 : 2) : 7;
            }
        }
        mk.q_doc = qdoc;
        mk.k_doc = kdoc;
        mk.q_doc_bs = Tq;
        mk.k_doc_bs = Tk;
    }
    assert_int_equal(flash_attention_forward(out, lse, q, k, v, &d, &mk, isa), 0);
    assert_int_equal(flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, &d, &mk, isa), 0);

    /* reference in double */
    const size_t nqo = (size_t)B * Tq * H * D, nkv = (size_t)B * Tk * KVH * D;
    double *ro = calloc(nqo, sizeof(double)), *rdq = calloc(nqo, sizeof(double));
    double *rdk = calloc(nkv, sizeof(double)), *rdv = calloc(nkv, sizeof(double));
    double *p = malloc((size_t)Tk * sizeof(double)), *dp = malloc((size_t)Tk * sizeof(double));
    double *capg = malloc((size_t)Tk * sizeof(double)); /* 1 - tanh^2 of the capped scores */
    const double scale = c->scale > 0 ? (double)c->scale : 1.0 / sqrt((double)D);
    int lse_ok = 1;
    double lse_err = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Tq; i++) {
                const int kvh = h / G;
                const float *qi = q + b * d.q_bs + i * q_ts + h * D;
                const float *doi = dout + b * d.o_bs + i * o_ts + h * D;
                double mx = -INFINITY;
                for (int j = 0; j < Tk; j++) {
                    const int64_t back = c->q0 + i - (c->k0 + j); /* qpos - kpos */
                    int vis = !c->causal || (back >= 0 && (c->window == 0 || back < c->window));
                    if (qdoc) vis = vis && qdoc[b * Tq + i] == kdoc[b * Tk + j];
                    p[j] = -INFINITY;
                    if (!vis) continue;
                    const float *kj = k + b * d.k_bs + j * k_ts + kvh * D;
                    double dot = 0;
                    for (int x = 0; x < D; x++) dot += (double)qi[x] * kj[x];
                    p[j] = dot * scale;
                    capg[j] = 1.0;
                    if (c->softcap > 0) {
                        const double t = tanh(p[j] / c->softcap);
                        p[j] = c->softcap * t;
                        capg[j] = 1.0 - t * t;
                    }
                    mx = fmax(mx, p[j]);
                }
                double l = lse[((size_t)b * H + h) * Tq + i];
                if (mx == -INFINITY) { /* nothing visible */
                    lse_ok = lse_ok && l == -INFINITY;
                    continue;
                }
                double sum = 0;
                for (int j = 0; j < Tk; j++) sum += p[j] == -INFINITY ? 0 : exp(p[j] - mx);
                lse_err = fmax(lse_err, fabs(l - (mx + log(sum))) / fmax(1.0, fabs(mx + log(sum))));
                double *oi = ro + (((size_t)b * Tq + i) * H + h) * D;
                double delta = 0;
                for (int j = 0; j < Tk; j++) {
                    p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx) / sum;
                    if (p[j] == 0) continue;
                    const float *vj = v + b * d.v_bs + j * v_ts + kvh * D;
                    double t = 0;
                    for (int x = 0; x < D; x++) {
                        oi[x] += p[j] * vj[x];
                        t += (double)doi[x] * vj[x];
                    }
                    dp[j] = t;
                    delta += p[j] * t;
                }
                for (int j = 0; j < Tk; j++) {
                    if (p[j] == 0) continue;
                    const float *kj = k + b * d.k_bs + j * k_ts + kvh * D;
                    double ds = p[j] * (dp[j] - delta) * capg[j] * scale;
                    double *dqi = rdq + (((size_t)b * Tq + i) * H + h) * D;
                    double *dkj = rdk + (((size_t)b * Tk + j) * KVH + kvh) * D;
                    double *dvj = rdv + (((size_t)b * Tk + j) * KVH + kvh) * D;
                    for (int x = 0; x < D; x++) {
                        dqi[x] += ds * kj[x];
                        dkj[x] += ds * qi[x];
                        dvj[x] += p[j] * doi[x];
                    }
                }
            }
    double eo = view_err(out, ro, B, Tq, H, D, d.o_bs, o_ts);
    double eq = view_err(dq, rdq, B, Tq, H, D, d.q_bs, q_ts);
    double ek = view_err(dk, rdk, B, Tk, KVH, D, d.k_bs, k_ts);
    double ev = view_err(dv, rdv, B, Tk, KVH, D, d.v_bs, v_ts);
    print_message("isa %d B%d Tq%d Tk%d H%d KVH%d D%d causal %d q0 %lld k0 %lld docs %d "
                  "window %lld scale %g cap %g: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                  isa, B, Tq, Tk, H, KVH, D, c->causal, (long long)c->q0, (long long)c->k0,
                  c->docs, (long long)c->window, c->scale, c->softcap, eo, lse_err, eq, ek, ev);
    assert_true(lse_ok);
    assert_true(eo <= 1e-5 && lse_err <= 1e-5 && eq <= 1e-5 && ek <= 1e-5 && ev <= 1e-5);
    /* the gaps between rows are never written */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tq; t++) {
            for (int64_t x = (int64_t)H * D; x < o_ts; x++)
                assert_true(out[b * d.o_bs + t * o_ts + x] == 0.0f);
            for (int64_t x = (int64_t)H * D; x < q_ts; x++)
                assert_true(dq[b * d.q_bs + t * q_ts + x] == 0.0f);
        }
    free(p);
    free(dp);
    free(capg);
    free(ro);
    free(rdq);
    free(rdk);
    free(rdv);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    free(qdoc);
    free(kdoc);
}

static void each_isa(const cfg *c, uint64_t seed) {
    run(c, LOOM_ATTN_ISA_PORTABLE, seed);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        run(c, LOOM_ATTN_ISA_AVX2, seed);
    if (flash_attention_have_avx512()) {
        run(c, LOOM_ATTN_ISA_AVX512, seed);
        run(c, LOOM_ATTN_ISA_AVX512_BLAS, seed);
    }
}

static void test_self_causal(void **state) {
    (void)state;
    cfg c = {2, 131, 131, 4, 2, 20, 1, 0, 0, 0, 0, 0, 0};
    each_isa(&c, 1);
}

static void test_full_mqa(void **state) {
    (void)state;
    cfg c = {1, 70, 97, 4, 1, 33, 0, 0, 0, 0, 0, 0, 0};
    each_isa(&c, 2);
}

static void test_offsets(void **state) {
    (void)state;
    /* queries [61, 131) against keys [30, 160); then queries entirely before the keys */
    cfg c = {2, 70, 130, 4, 2, 20, 1, 61, 30, 0, 0, 0, 0};
    each_isa(&c, 3);
    cfg none = {1, 9, 20, 2, 2, 16, 1, 0, 50, 0, 0, 0, 0};
    each_isa(&none, 4);
}

static void test_documents(void **state) {
    (void)state;
    cfg c = {2, 150, 150, 4, 2, 20, 1, 0, 0, 0, 0, 0, 0};
    each_isa(&c, 5);
    cfg chunk = {2, 50, 120, 2, 1, 24, 1, 70, 0, 0, 0, 0, 0};
    each_isa(&chunk, 6);
    cfg full = {1, 100, 100, 2, 2, 16, 0, 0, 0, 0, 0, 0, 0};
    each_isa(&full, 7);
}

/* sliding windows: narrower than a tile (tiles wholly outside it skipped), wider than one,
 * with offsets (a cp chunk) and documents; soft-capping with a custom scale, with and
 * without a window */
static void test_window_softcap(void **state) {
    (void)state;
    cfg w = {2, 200, 200, 4, 2, 20, 1, 0, 0, 0, 37, 0, 0};
    each_isa(&w, 8);
    cfg wide = {1, 150, 150, 2, 1, 16, 1, 0, 0, 0, 70, 0, 0};
    each_isa(&wide, 9);
    cfg off = {2, 70, 130, 4, 2, 20, 1, 61, 30, 0, 50, 0, 0};
    each_isa(&off, 10);
    cfg docs = {1, 150, 150, 2, 2, 16, 1, 0, 0, 1, 29, 0, 0};
    each_isa(&docs, 11);
    cfg cap = {2, 131, 131, 4, 2, 20, 1, 0, 0, 0, 0, 0.3f, 2.5f};
    each_isa(&cap, 12);
    cfg both = {1, 140, 140, 4, 1, 24, 1, 0, 0, 0, 45, 0.25f, 3.0f};
    each_isa(&both, 13);
}

static void test_bad_dims(void **state) {
    (void)state;
    float x[64] = {0};
    loom_attn_dims d = {1, 2, 2, 3, 2, 4, 8, 4, 8, 4, 8, 4, 8, 4}; /* H % KVH != 0 */
    loom_attn_mask mk = {0};
    assert_int_equal(flash_attention_forward(x, x, x, x, x, &d, &mk, 0), -1);
    d.H = 2;
    d.D = 0;
    assert_int_equal(flash_attention_backward(x, x, x, x, x, x, x, x, x, &d, &mk, 0), -1);
    d.D = 4;
    assert_int_equal(flash_attention_forward(x, x, x, x, x, &d, &mk, 99), -2);
    mk.window = 3; /* a window without the causal mask */
    assert_int_equal(flash_attention_forward(x, x, x, x, x, &d, &mk, 0), -1);
    mk.causal = 1;
    mk.softcap = -1.0f;
    assert_int_equal(flash_attention_forward(x, x, x, x, x, &d, &mk, 0), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_causal), cmocka_unit_test(test_full_mqa),
        cmocka_unit_test(test_offsets),     cmocka_unit_test(test_documents),
        cmocka_unit_test(test_window_softcap), cmocka_unit_test(test_bad_dims),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
