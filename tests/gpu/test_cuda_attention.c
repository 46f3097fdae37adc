/* The CUDA backend's attention ops against the cpu backend (tests/gpu/cuda_harness.h): the
 * materialized sdpa pair, flash attention in fp32 (separate strided q, k, v buffers with gaps
 * between rows, and the fused qkv rows) and over bf16 fused rows, decode over a KV cache.
 * Masks: causal, position offsets (ring chunks), GQA, sliding windows, documents, scale,
 * soft-capping, rows that see no key; NULL gradients and a NULL lse; the ops' return codes.
 * Tolerances: fp32 outputs CU_TOL_F32 (1e-4 relative to 1 + |ref|: the summation orders
 * differ), bf16 outputs CU_TOL_BF16 (one bf16 rounding apart). Elements outside the views
 * (the gaps) must keep their bytes. Shapes are small: the emulator runs every thread. */
#include "cuda_harness.h"

/* ---- buffers with views ---------------------------------------------------------------- */

/* a view of width floats at column off of rows t < T of batch rows b < B: element
 * b*bs + t*ts + off + c */
typedef struct {
    int64_t off, width, bs, ts;
    int B, T;
} view;

static int in_view(const view *v, int64_t i) {
    if (!v || v->B <= 0 || v->T <= 0 || v->width <= 0) return 0;
    const int64_t b = i / v->bs, rem = i % v->bs, t = rem / v->ts, c = rem % v->ts;
    return b < v->B && t < v->T && c >= v->off && c < v->off + v->width;
}

/* The device buffer d (n floats) against the host reference ref on the views' elements
 * (tolerance tol), and bit for bit against init (n floats, the device buffer's bytes before
 * the op) everywhere else. */
static void check_views(const char *what, const float *ref, const void *d, const float *init,
                        int64_t n, const view *v1, const view *v2, const view *v3, double tol) {
    float *got = cu_down(d, (size_t)n * 4);
    float *r = malloc((size_t)(n ? n : 1) * 4), *g = malloc((size_t)(n ? n : 1) * 4);
    int64_t k = 0, moved = 0, at = -1;
    for (int64_t i = 0; i < n; i++) {
        if (in_view(v1, i) || in_view(v2, i) || in_view(v3, i)) {
            r[k] = ref[i], g[k] = got[i], k++;
        } else if (memcmp(&got[i], &init[i], 4) != 0) {
            moved++;
            if (at < 0) at = i;
        }
    }
    cu_check_f32(what, r, g, k, tol);
    cu_checks++;
    if (moved) {
        cu_failures++;
        printf("FAIL %s: %lld elements outside the views written (first at %lld)\n", what,
               (long long)moved, (long long)at);
    }
    free(got), free(r), free(g);
}

static float *poison_host(int64_t n) {
    float *p = malloc((size_t)(n ? n : 1) * 4);
    memset(p, 0xff, (size_t)(n ? n : 1) * 4);
    return p;
}

/* ---- flash attention, fp32 ------------------------------------------------------------- */

typedef struct {
    const char *name;
    int B, Tq, Tk, H, KVH, D;
    int causal;
    int64_t q_pos0, k_pos0, window;
    int docs;           /* document ids (from one sequence per batch row, by position) */
    float scale, cap;   /* mask->scale, mask->softcap */
    int fused;          /* q, k, v in the fused rows (Tq == Tk), else separate with gaps */
    int grads;          /* the gradients passed: 1 dq, 2 dk, 4 dv */
    int lse;            /* 0: the forward is called with lse NULL */
    int repeat;         /* 1: the backward is run twice, the results compared bit for bit */
} fa_case;

/* document ids of positions 0..P-1 for each batch row: a new document every ~12 positions */
static int32_t *doc_sequence(int B, int64_t P) {
    int32_t *d = malloc((size_t)(B * P > 0 ? B * P : 1) * 4);
    for (int b = 0; b < B; b++) {
        int32_t id = 3 * b;
        for (int64_t p = 0; p < P; p++) {
            if (p > 0 && loom_rng_splitmix(cu_seed++) % 12 == 0) id++;
            d[b * P + p] = id;
        }
    }
    return d;
}

static void test_flash(const fa_case *c) {
    char what[256];
    const int B = c->B, Tq = c->Tq, Tk = c->Tk, H = c->H, KVH = c->KVH, D = c->D;
    const int64_t HD = (int64_t)H * D, KD = (int64_t)KVH * D;
    loom_attn_dims dm;
    int64_t nq, nk, nv, no, qoff = 0, koff = 0, voff = 0;
    if (c->fused) {
        dm = flash_attention_dims_qkv(B, Tq, H, KVH, D);
        nq = nk = nv = (int64_t)B * Tq * (HD + 2 * KD);
        koff = HD, voff = HD + KD;
    } else { /* rows with gaps after them, batch rows with gaps between them */
        dm.B = B, dm.Tq = Tq, dm.Tk = Tk, dm.H = H, dm.KVH = KVH, dm.D = D;
        dm.q_ts = HD + 5, dm.q_bs = Tq * dm.q_ts + 7;
        dm.k_ts = KD + 3, dm.k_bs = Tk * dm.k_ts + 2;
        dm.v_ts = KD + 1, dm.v_bs = Tk * dm.v_ts + 4;
        nq = B * dm.q_bs, nk = B * dm.k_bs, nv = B * dm.v_bs;
    }
    if (c->fused) dm.o_ts = HD, dm.o_bs = Tq * HD;
    else dm.o_ts = HD + 2, dm.o_bs = Tq * dm.o_ts + 3;
    no = B * dm.o_bs;
    const view vq = {qoff, HD, dm.q_bs, dm.q_ts, B, Tq}, vk = {koff, KD, dm.k_bs, dm.k_ts, B, Tk};
    const view vv = {voff, KD, dm.v_bs, dm.v_ts, B, Tk}, vo = {0, HD, dm.o_bs, dm.o_ts, B, Tq};
    const int64_t nl = (int64_t)B * H * Tq;

    /* inputs: one buffer when fused */
    float *hq = cu_rand(nq, -2, 2), *hk = c->fused ? hq : cu_rand(nk, -2, 2);
    float *hv = c->fused ? hq : cu_rand(nv, -1, 1);
    float *dq_ = cu_up(hq, nq * 4), *dk_ = c->fused ? dq_ : cu_up(hk, nk * 4);
    float *dv_ = c->fused ? dq_ : cu_up(hv, nv * 4);
    loom_attn_mask mk = {0};
    mk.causal = c->causal, mk.q_pos0 = c->q_pos0, mk.k_pos0 = c->k_pos0, mk.window = c->window;
    mk.scale = c->scale, mk.softcap = c->cap;
    loom_attn_mask mkd = mk; /* the device's: its document ids on the device */
    int32_t *qdoc = NULL, *kdoc = NULL;
    void *dqdoc = NULL, *dkdoc = NULL;
    if (c->docs) {
        const int64_t P = (c->q_pos0 + Tq > c->k_pos0 + Tk ? c->q_pos0 + Tq : c->k_pos0 + Tk);
        int32_t *seq = doc_sequence(B, P);
        qdoc = malloc((size_t)(B * Tq > 0 ? B * Tq : 1) * 4);
        kdoc = malloc((size_t)(B * Tk > 0 ? B * Tk : 1) * 4);
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < Tq; i++) qdoc[b * Tq + i] = seq[b * P + c->q_pos0 + i];
            for (int j = 0; j < Tk; j++) kdoc[b * Tk + j] = seq[b * P + c->k_pos0 + j];
        }
        free(seq);
        dqdoc = cu_up(qdoc, (size_t)B * Tq * 4), dkdoc = cu_up(kdoc, (size_t)B * Tk * 4);
        mk.q_doc = qdoc, mk.k_doc = kdoc, mk.q_doc_bs = Tq, mk.k_doc_bs = Tk;
        mkd.q_doc = dqdoc, mkd.k_doc = dkdoc, mkd.q_doc_bs = Tq, mkd.k_doc_bs = Tk;
    }
    const float *q = hq, *k = hk + koff, *v = hv + voff;
    const float *qd = dq_, *kd = dk_ + koff, *vd = dv_ + voff;

    /* forward */
    float *out = poison_host(no), *lse = poison_host(nl), *pinit = poison_host(no > nl ? no : nl);
    void *dout_ = cu_poisoned(no * 4), *dlse = cu_poisoned((nl ? nl : 1) * 4);
    const int rc = cu_cpu->flash_attention_forward(out, lse, q, k, v, &dm, &mk);
    const int rd =
        cu_dev->flash_attention_forward(dout_, c->lse ? dlse : NULL, qd, kd, vd, &dm, &mkd);
    snprintf(what, sizeof what, "flash fwd %s: B %d Tq %d Tk %d H %d KVH %d D %d, return codes",
             c->name, B, Tq, Tk, H, KVH, D);
    cu_check_scalar(what, rc, rd, 0);
    check_views("  out", out, dout_, pinit, no, &vo, NULL, NULL, CU_TOL_F32);
    if (c->lse) cu_check_dev_f32("  lse", lse, dlse, nl, CU_TOL_F32);

    /* backward, on the cpu's out and lse */
    float *hg = cu_rand(no, -1, 1);
    void *dg = cu_up(hg, no * 4), *dO = cu_up(out, no * 4), *dL = cu_up(lse, (nl ? nl : 1) * 4);
    const int wq = c->grads & 1, wk = (c->grads & 2) != 0, wv = (c->grads & 4) != 0;
    for (int set = 0; set <= 1; set++) {
        /* gradient buffers shaped as q, k, v (one buffer when fused) */
        float *gq = cu_rand(nq, -1, 1), *gk = c->fused ? gq : cu_rand(nk, -1, 1);
        float *gv = c->fused ? gq : cu_rand(nv, -1, 1);
        float *iq = set ? poison_host(nq) : cu_hdup(gq, nq * 4);
        float *ik = c->fused ? iq : set ? poison_host(nk) : cu_hdup(gk, nk * 4);
        float *iv = c->fused ? iq : set ? poison_host(nv) : cu_hdup(gv, nv * 4);
        float *Dq = cu_up(iq, nq * 4), *Dk = c->fused ? Dq : cu_up(ik, nk * 4);
        float *Dv = c->fused ? Dq : cu_up(iv, nv * 4);
        int (*cpu_op)(float *, float *, float *, const float *, const float *, const float *,
                      const float *, const float *, const float *, const loom_attn_dims *,
                      const loom_attn_mask *) =
            set ? cu_cpu->flash_attention_backward_set : cu_cpu->flash_attention_backward;
        int (*dev_op)(float *, float *, float *, const float *, const float *, const float *,
                      const float *, const float *, const float *, const loom_attn_dims *,
                      const loom_attn_mask *) =
            set ? cu_dev->flash_attention_backward_set : cu_dev->flash_attention_backward;
        const int r1 = cpu_op(wq ? gq : NULL, wk ? gk + koff : NULL, wv ? gv + voff : NULL, hg, q,
                              k, v, out, lse, &dm, &mk);
        const int r2 = dev_op(wq ? Dq : NULL, wk ? Dk + koff : NULL, wv ? Dv + voff : NULL, dg,
                              qd, kd, vd, dO, dL, &dm, &mkd);
        snprintf(what, sizeof what, "flash bwd%s %s (dq%s dk%s dv%s), return codes",
                 set ? "_set =" : " +=", c->name, wq ? "" : " NULL", wk ? "" : " NULL",
                 wv ? "" : " NULL");
        cu_check_scalar(what, r1, r2, 0);
        if (c->fused) {
            check_views("  dqkv", gq, Dq, iq, nq, wq ? &vq : NULL, wk ? &vk : NULL,
                        wv ? &vv : NULL, CU_TOL_F32);
        } else {
            check_views("  dq", gq, Dq, iq, nq, wq ? &vq : NULL, NULL, NULL, CU_TOL_F32);
            check_views("  dk", gk, Dk, ik, nk, wk ? &vk : NULL, NULL, NULL, CU_TOL_F32);
            check_views("  dv", gv, Dv, iv, nv, wv ? &vv : NULL, NULL, NULL, CU_TOL_F32);
        }
        if (set && c->repeat) { /* the same again: the same bits (no atomics, fixed orders) */
            float *first = cu_down(Dq, nq * 4);
            cu_dev->mem_h2d(Dq, iq, nq * 4);
            dev_op(wq ? Dq : NULL, wk ? Dk + koff : NULL, wv ? Dv + voff : NULL, dg, qd, kd, vd,
                   dO, dL, &dm, &mkd);
            float *again = cu_down(Dq, nq * 4);
            const int same = memcmp(first, again, nq * 4) == 0;
            cu_checks++, cu_failures += !same;
            printf("%s  the backward repeats bit for bit\n", same ? "ok  " : "FAIL");
            free(first), free(again);
        }
        free(gq), free(iq);
        if (!c->fused) free(gk), free(gv), free(ik), free(iv);
        cu_dev->mem_free(Dq);
        if (!c->fused) cu_dev->mem_free(Dk), cu_dev->mem_free(Dv);
    }
    free(hq), free(out), free(lse), free(pinit), free(hg), free(qdoc), free(kdoc);
    if (!c->fused) free(hk), free(hv);
    void *all[] = {dout_, dlse, dg, dO, dL, dqdoc, dkdoc, dq_};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
    if (!c->fused) cu_dev->mem_free(dk_), cu_dev->mem_free(dv_);
}

/* ---- flash attention over bf16 fused rows ---------------------------------------------- */

static void test_flash_bf16(int B, int T, int H, int KVH, int D, const loom_attn_mask *m0,
                            int with_docs, int with_lse) {
    char what[200];
    const int64_t R = (int64_t)(H + 2 * KVH) * D, HD = (int64_t)H * D;
    const int64_t nx = (int64_t)B * T * R, no = (int64_t)B * T * HD, nl = (int64_t)B * H * T;
    uint16_t *x = cu_rand_bf16(nx, -2, 2);
    void *dx = cu_up(x, nx * 2);
    loom_attn_mask mk = *m0, mkd = *m0;
    int32_t *docs = NULL;
    void *ddocs = NULL;
    if (with_docs) {
        docs = doc_sequence(B, T);
        ddocs = cu_up(docs, (size_t)B * T * 4);
        mk.q_doc = mk.k_doc = docs, mkd.q_doc = mkd.k_doc = ddocs;
        mk.q_doc_bs = mk.k_doc_bs = mkd.q_doc_bs = mkd.k_doc_bs = T;
    }
    float *ws = malloc((size_t)cu_cpu->bf16_flash_ws_floats(B, T, H, KVH, D) * 4 + 4);
    const int64_t wsd = cu_dev->bf16_flash_ws_floats(B, T, H, KVH, D);
    void *dws = cu_poisoned((size_t)(wsd > 0 ? wsd : 0) * 4);
    uint16_t *out = malloc((size_t)no * 2);
    float *lse = malloc((size_t)nl * 4);
    void *dout = cu_poisoned(no * 2), *dlse = cu_poisoned(nl * 4);
    const int rc = cu_cpu->bf16_flash_attention_forward(out, lse, x, ws, B, T, H, KVH, D, &mk);
    const int rd = cu_dev->bf16_flash_attention_forward(dout, with_lse ? dlse : NULL, dx, dws, B,
                                                        T, H, KVH, D, &mkd);
    snprintf(what, sizeof what,
             "bf16 flash fwd B %d T %d H %d KVH %d D %d%s%s%s%s%s, return codes", B, T, H, KVH,
             D, mk.causal ? " causal" : "", mk.window ? " window" : "", with_docs ? " docs" : "",
             mk.softcap > 0 ? " softcap" : "", with_lse ? "" : " (lse NULL)");
    cu_check_scalar(what, rc, rd, 0);
    cu_check_dev_bf16("  out (bf16)", out, dout, no, CU_TOL_BF16);
    if (with_lse) cu_check_dev_f32("  lse", lse, dlse, nl, CU_TOL_F32);
    /* backward on the cpu's out and lse: dqkv set (fp32) */
    float *g = cu_rand(no, -1, 1), *dqkv = poison_host(nx);
    void *dg = cu_up(g, no * 4), *dO = cu_up(out, no * 2), *dL = cu_up(lse, nl * 4);
    void *ddqkv = cu_poisoned(nx * 4);
    const int r1 = cu_cpu->bf16_flash_attention_backward(dqkv, g, x, out, lse, ws, B, T, H, KVH,
                                                         D, &mk);
    const int r2 = cu_dev->bf16_flash_attention_backward(ddqkv, dg, dx, dO, dL, dws, B, T, H,
                                                         KVH, D, &mkd);
    cu_check_scalar("bf16 flash bwd, return codes", r1, r2, 0);
    cu_check_dev_f32("  dqkv = (fp32, poisoned before)", dqkv, ddqkv, nx, CU_TOL_F32);
    free(x), free(docs), free(ws), free(out), free(lse), free(g), free(dqkv);
    void *all[] = {dx, ddocs, dws, dout, dlse, dg, dO, dL, ddqkv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* ---- argument checks: the cpu's codes; D > 256 refused (-2) with nothing written --------- */

static void test_flash_codes(void) {
    float *h = cu_rand(4096, -1, 1);
    void *d = cu_up(h, 4096 * 4), *o = cu_poisoned(4096 * 4);
    const float *init = poison_host(4096);
    struct {
        const char *what;
        loom_attn_dims dm;
        loom_attn_mask mk;
    } bad[5];
    memset(bad, 0, sizeof bad);
    for (int i = 0; i < 5; i++) bad[i].dm = flash_attention_dims_qkv(1, 4, 2, 1, 8);
    bad[0].what = "H % KVH != 0", bad[0].dm = flash_attention_dims_qkv(1, 4, 3, 2, 8);
    bad[1].what = "window without causal", bad[1].mk.window = 3;
    bad[2].what = "q_doc without k_doc", bad[2].mk.q_doc = (const int32_t *)d;
    bad[3].what = "negative scale", bad[3].mk.scale = -1.0f;
    bad[4].what = "D 0", bad[4].dm.D = 0;
    for (int i = 0; i < 5; i++) {
        char what[120];
        int rc = cu_cpu->flash_attention_forward(h + 2048, NULL, h, h, h, &bad[i].dm, &bad[i].mk);
        int rd = cu_dev->flash_attention_forward(o, NULL, d, d, d, &bad[i].dm, &bad[i].mk);
        snprintf(what, sizeof what, "flash fwd refuses %s (cpu %d)", bad[i].what, rc);
        cu_check_scalar(what, rc, rd, 0);
        rd =
            cu_dev->flash_attention_backward_set(o, o, o, d, d, d, d, d, d, &bad[i].dm, &bad[i].mk);
        snprintf(what, sizeof what, "flash bwd refuses %s (cpu %d)", bad[i].what, rc);
        cu_check_scalar(what, rc, rd, 0);
    }
    /* D 300: T 2, one head: the device has no kernel for it */
    loom_attn_dims big = flash_attention_dims_qkv(1, 2, 1, 1, 300);
    loom_attn_mask none = {0};
    cu_check_scalar("flash fwd D 300: -2 (no kernel for D > 256)", -2,
                    cu_dev->flash_attention_forward(o, NULL, d, (float *)d + 300,
                                                    (float *)d + 600, &big, &none), 0);
    cu_check_scalar("flash bwd D 300: -2", -2,
                    cu_dev->flash_attention_backward(o, NULL, NULL, d, d, d, d, d, d, &big, &none),
                    0);
    cu_check_scalar("bf16 flash fwd D 300: -2", -2,
                    cu_dev->bf16_flash_attention_forward(o, NULL, d, NULL, 1, 2, 1, 1, 300, &none),
                    0);
    /* a backward without lse (the cpu kernel would read it) */
    loom_attn_dims small = flash_attention_dims_qkv(1, 4, 2, 1, 8);
    cu_check_scalar(
        "flash bwd with lse NULL: -1", -1,
        cu_dev->flash_attention_backward(o, NULL, NULL, d, d, d, d, d, NULL, &small, &none), 0);
    check_views("  nothing written by the refused calls", init, o, init, 4096, NULL, NULL, NULL, 0);
    free(h), free((void *)init);
    cu_dev->mem_free(d), cu_dev->mem_free(o);
}

/* ---- materialized attention (sdpa) ------------------------------------------------------ */

static void test_sdpa(int B, int T, int H, int KVH, int D, const loom_attn_mask *mk) {
    char what[200];
    const int64_t R = (int64_t)(H + 2 * KVH) * D, HD = (int64_t)H * D;
    const int64_t nx = (int64_t)B * T * R, no = (int64_t)B * T * HD, na = (int64_t)B * H * T * T;
    float *x = cu_rand(nx, -2, 2), *out = malloc(no * 4), *att = malloc(na * 4);
    void *dx = cu_up(x, nx * 4), *dout = cu_poisoned(no * 4), *datt = cu_poisoned(na * 4);
    cu_cpu->attention_forward(out, att, x, B, T, H, KVH, D, mk);
    cu_dev->attention_forward(dout, datt, dx, B, T, H, KVH, D, mk);
    snprintf(what, sizeof what, "sdpa fwd B %d T %d H %d KVH %d D %d%s%s%s: out", B, T, H, KVH,
             D, mk && mk->window ? " window" : "", mk && mk->scale > 0 ? " scale" : "",
             mk && mk->softcap > 0 ? " softcap" : "");
    cu_check_dev_f32(what, out, dout, no, CU_TOL_F32);
    cu_check_dev_f32("  att (probabilities)", att, datt, na, CU_TOL_F32);
    /* backward on the cpu's probabilities: dqkv += */
    float *g = cu_rand(no, -1, 1), *dqkv = cu_rand(nx, -1, 1), *scr = malloc(na * 4);
    void *dg = cu_up(g, no * 4), *dA = cu_up(att, na * 4), *ddqkv = cu_up(dqkv, nx * 4);
    void *dscr = cu_poisoned(na * 4);
    cu_cpu->attention_backward(dqkv, scr, g, x, att, B, T, H, KVH, D, mk);
    cu_dev->attention_backward(ddqkv, dscr, dg, dx, dA, B, T, H, KVH, D, mk);
    cu_check_dev_f32("sdpa bwd dqkv +=", dqkv, ddqkv, nx, CU_TOL_F32);
    free(x), free(out), free(att), free(g), free(dqkv), free(scr);
    void *all[] = {dx, dout, datt, dg, dA, ddqkv, dscr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* ---- decode ------------------------------------------------------------------------------ */

/* off: the caches start off floats into their buffers (1: not 16-byte aligned) */
static void test_decode(int n, int H, int KVH, int D, const loom_attn_mask *mk, int off) {
    char what[200];
    const int64_t HD = (int64_t)H * D, nc = (int64_t)n * KVH * D;
    float *q = cu_rand(HD, -2, 2), *kc = cu_rand(nc + off, -2, 2), *vc = cu_rand(nc + off, -1, 1);
    float *out = malloc(HD * 4), *scr = malloc((size_t)(H * n > 0 ? H * n : 1) * 4);
    void *dq = cu_up(q, HD * 4), *dk = cu_up(kc, (nc + off) * 4), *dv = cu_up(vc, (nc + off) * 4);
    void *dout = cu_poisoned(HD * 4), *dscr = cu_poisoned((size_t)H * n * 4);
    cu_cpu->attention_decode(out, q, kc + off, vc + off, n, H, KVH, D, scr, mk);
    cu_dev->attention_decode(dout, dq, (float *)dk + off, (float *)dv + off, n, H, KVH, D, dscr,
                             mk);
    snprintf(what, sizeof what, "attention_decode n %d H %d KVH %d D %d%s%s%s", n, H, KVH, D,
             mk && mk->scale > 0 ? " scale" : "", mk && mk->softcap > 0 ? " softcap" : "",
             off ? " (caches not 16-byte aligned)" : "");
    cu_check_dev_f32(what, out, dout, HD, CU_TOL_F32);
    free(q), free(kc), free(vc), free(out), free(scr);
    void *all[] = {dq, dk, dv, dout, dscr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

/* ---- larger sizes (the `cuda` backend, or any with LOOM_TEST_CUDA_BENCH=1) ---------------
 * The checks again at training-like shapes (many tiles per head, many blocks), then timings
 * of flash attention (bf16 fused rows, causal: the training path; fp32) and decode: figures to
 * tune against, not checks. FLOPs as bench_gpu.py counts them: 4 D per causal (query, key)
 * pair forward, 10 D backward (attention_causal_pairs). */
#define BENCH_REPS 5
static double bench_ms(double t0) { return (loom_now() - t0) * 1e3 / BENCH_REPS; }

static void time_flash_bf16(int B, int T, int H, int D) {
    const int64_t R = 3 * (int64_t)H * D, HD = (int64_t)H * D, rows = (int64_t)B * T;
    uint16_t *x = cu_rand_bf16(rows * R, -1, 1);
    float *g = cu_rand(rows * HD, -0.01f, 0.01f);
    void *dx = cu_up(x, (size_t)(rows * R) * 2), *dg = cu_up(g, (size_t)(rows * HD) * 4);
    void *dout = cu_dev->mem_alloc((size_t)(rows * HD) * 2, 0);
    void *dlse = cu_dev->mem_alloc((size_t)B * H * T * 4, 0);
    void *ddx = cu_dev->mem_alloc((size_t)(rows * R) * 4, 0);
    const int64_t ws = cu_dev->bf16_flash_ws_floats(B, T, H, H, D);
    void *dws = cu_dev->mem_alloc((size_t)(ws > 0 ? ws : 0) * 4, 0);
    loom_attn_mask mk = {.causal = 1};
    const double pairs = (double)attention_causal_pairs(T) * B * H;
    cu_dev->bf16_flash_attention_forward(dout, dlse, dx, dws, B, T, H, H, D, &mk);
    cu_dev->mem_sync();
    double t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->bf16_flash_attention_forward(dout, dlse, dx, dws, B, T, H, H, D, &mk);
    cu_dev->mem_sync();
    const double fwd = bench_ms(t0);
    cu_dev->bf16_flash_attention_backward(ddx, dg, dx, dout, dlse, dws, B, T, H, H, D, &mk);
    cu_dev->mem_sync();
    t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->bf16_flash_attention_backward(ddx, dg, dx, dout, dlse, dws, B, T, H, H, D, &mk);
    cu_dev->mem_sync();
    const double bwd = bench_ms(t0);
    printf("time bf16 flash causal B %d T %d H %d D %d: fwd %.3f ms (%.1f TFLOP/s), bwd %.3f ms "
           "(%.1f TFLOP/s)\n", B, T, H, D, fwd, pairs * 4 * D / (fwd * 1e9), bwd,
           pairs * 10 * D / (bwd * 1e9));
    free(x), free(g);
    void *all[] = {dx, dg, dout, dlse, ddx, dws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

static void time_flash_f32(int B, int T, int H, int D) {
    const loom_attn_dims dm = flash_attention_dims_qkv(B, T, H, H, D);
    const int64_t R = 3 * (int64_t)H * D, HD = (int64_t)H * D, rows = (int64_t)B * T;
    float *x = cu_rand(rows * R, -1, 1), *g = cu_rand(rows * HD, -0.01f, 0.01f);
    float *dx = cu_up(x, (size_t)(rows * R) * 4);
    void *dg = cu_up(g, (size_t)(rows * HD) * 4);
    void *dout = cu_dev->mem_alloc((size_t)(rows * HD) * 4, 0);
    void *dlse = cu_dev->mem_alloc((size_t)B * H * T * 4, 0);
    float *ddx = cu_dev->mem_alloc((size_t)(rows * R) * 4, 0);
    loom_attn_mask mk = {.causal = 1};
    const double pairs = (double)attention_causal_pairs(T) * B * H;
    cu_dev->flash_attention_forward(dout, dlse, dx, dx + HD, dx + 2 * HD, &dm, &mk);
    cu_dev->mem_sync();
    double t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->flash_attention_forward(dout, dlse, dx, dx + HD, dx + 2 * HD, &dm, &mk);
    cu_dev->mem_sync();
    const double fwd = bench_ms(t0);
    t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->flash_attention_backward_set(ddx, ddx + HD, ddx + 2 * HD, dg, dx, dx + HD,
                                             dx + 2 * HD, dout, dlse, &dm, &mk);
    cu_dev->mem_sync();
    const double bwd = bench_ms(t0);
    printf("time fp32 flash causal B %d T %d H %d D %d: fwd %.3f ms (%.1f TFLOP/s), bwd %.3f ms "
           "(%.1f TFLOP/s)\n", B, T, H, D, fwd, pairs * 4 * D / (fwd * 1e9), bwd,
           pairs * 10 * D / (bwd * 1e9));
    free(x), free(g);
    void *all[] = {dx, dg, dout, dlse, ddx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

static void time_decode(int n, int H, int KVH, int D) {
    const int64_t nc = (int64_t)n * KVH * D;
    float *kc = cu_rand(nc, -1, 1), *q = cu_rand((int64_t)H * D, -1, 1);
    void *dk = cu_up(kc, nc * 4), *dv = cu_up(kc, nc * 4), *dq = cu_up(q, (size_t)H * D * 4);
    void *dout = cu_dev->mem_alloc((size_t)H * D * 4, 0),
         *ds = cu_dev->mem_alloc((size_t)H * n * 4, 0);
    cu_dev->attention_decode(dout, dq, dk, dv, n, H, KVH, D, ds, NULL);
    cu_dev->mem_sync();
    const double t0 = loom_now();
    for (int r = 0; r < BENCH_REPS; r++)
        cu_dev->attention_decode(dout, dq, dk, dv, n, H, KVH, D, ds, NULL);
    cu_dev->mem_sync();
    const double ms = bench_ms(t0);
    printf(
        "time attention_decode n %d H %d KVH %d D %d: %.3f ms, %.0f GB/s (the cache read once)\n",
        n, H, KVH, D, ms, 8.0 * (double)nc / 1e9 / (ms * 1e-3));
    free(kc), free(q);
    void *all[] = {dk, dv, dq, dout, ds};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu_dev->mem_free(all[i]);
}

static void large(void) {
    const int on_gpu = !strcmp(cu_dev->name, "cuda");
    const char *env = getenv("LOOM_TEST_CUDA_BENCH");
    if (!on_gpu && !(env && !strcmp(env, "1"))) return;
    const int T = on_gpu ? 1024 : 80;
    const fa_case big[] = {
        {"large GQA docs", 2, T, T, 8, 2, 64, 1, 0, 0, 0, 1, 0, 0, 1, 7, 1, 1},
        {"large ring chunk window", 1, T / 2, T, 4, 4, 128, 1, T, 0, T / 3, 0, 0, 0, 0, 7, 1, 1},
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) test_flash(&big[i]);
    loom_attn_mask causal = {.causal = 1};
    test_flash_bf16(1, 2 * T, 4, 2, 128, &causal, 0, 1);
    test_sdpa(1, T / 2, 8, 2, 64, NULL);
    test_decode(on_gpu ? 4096 : 200, 32, 8, 128, NULL, 0);
    if (on_gpu) {
        time_flash_bf16(4, 1024, 12, 64);
        time_flash_bf16(1, 4096, 16, 128);
        time_flash_bf16(1, 16384, 8, 128);
        time_flash_f32(4, 1024, 12, 64);
        time_decode(4096, 32, 8, 128);
    } else {
        time_flash_bf16(1, 96, 2, 64);
        time_flash_f32(1, 70, 2, 16);
        time_decode(100, 4, 2, 16);
    }
}

int main(int argc, char **argv) {
    cu_setup(argc, argv);
    /* name, B Tq Tk H KVH D, causal q_pos0 k_pos0 window, docs scale cap, fused grads lse rep */
    static const fa_case cases[] = {
        {"causal fused", 2, 33, 33, 2, 2, 16, 1, 0, 0, 0, 0, 0, 0, 1, 7, 1, 1},
        {"non-causal GQA", 2, 37, 37, 4, 2, 8, 0, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0},
        {"ring chunk q after k", 1, 20, 45, 2, 1, 16, 1, 40, 0, 0, 0, 0, 0, 0, 7, 0, 0},
        {"ring chunk k after q (empty rows)", 1, 30, 30, 2, 2, 16, 1, 0, 10, 0, 0, 0, 0, 0, 7, 1,
         0},
        {"window", 2, 70, 70, 2, 1, 16, 1, 0, 0, 17, 0, 0, 0, 1, 7, 1, 0},
        {"documents causal", 2, 70, 70, 2, 2, 16, 1, 0, 0, 0, 1, 0, 0, 1, 7, 1, 0},
        {"documents Tq != Tk", 2, 25, 40, 2, 1, 8, 0, 15, 0, 0, 1, 0, 0, 0, 7, 1, 0},
        {"softcap scale", 1, 40, 40, 2, 2, 16, 1, 0, 0, 0, 0, 0.3f, 5.0f, 1, 7, 1, 0},
        {"window docs softcap GQA", 1, 50, 50, 4, 1, 8, 1, 0, 0, 9, 1, 0, 2.0f, 1, 7, 1, 1},
        {"window ring chunk", 1, 40, 64, 2, 1, 8, 1, 60, 0, 30, 0, 0, 0, 0, 7, 1, 0},
        {"D 64", 1, 40, 40, 2, 1, 64, 1, 0, 0, 0, 0, 0, 0, 1, 7, 1, 0},
        {"D 128", 1, 24, 24, 2, 2, 128, 1, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0},
        {"D 256", 1, 40, 24, 1, 1, 256, 0, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0},
        {"D 37", 1, 29, 29, 3, 1, 37, 1, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0},
        {"T 1", 3, 1, 1, 2, 1, 16, 1, 0, 0, 0, 0, 0, 0, 1, 7, 1, 0},
        {"dq NULL", 1, 33, 33, 2, 1, 16, 1, 0, 0, 0, 0, 0, 0, 1, 6, 1, 0},
        {"dk dv NULL, lse NULL", 1, 33, 33, 2, 1, 16, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0},
        {"only dv", 1, 20, 35, 2, 2, 16, 0, 0, 0, 0, 0, 0, 0, 0, 4, 1, 0},
        {"Tk 0", 1, 5, 0, 2, 1, 16, 0, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0},
        {"Tq 0", 1, 0, 6, 2, 1, 16, 0, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_flash(&cases[i]);
    test_flash_codes();

    loom_attn_mask causal = {.causal = 1};
    loom_attn_mask wdc = {.causal = 1, .window = 20, .softcap = 3.0f};
    loom_attn_mask plain = {0};
    test_flash_bf16(2, 45, 2, 1, 16, &causal, 0, 1);
    test_flash_bf16(1, 33, 2, 2, 64, &wdc, 1, 0);
    test_flash_bf16(1, 20, 2, 1, 128, &plain, 0, 1);

    loom_attn_mask win = {.window = 20, .scale = 0.4f};
    loom_attn_mask cap = {.softcap = 4.0f, .scale = 0.2f};
    test_sdpa(2, 33, 2, 1, 16, NULL);
    test_sdpa(1, 70, 2, 2, 8, &win);
    test_sdpa(1, 40, 4, 2, 16, &cap);
    test_sdpa(1, 1, 1, 1, 64, NULL);

    loom_attn_mask dcap = {.softcap = 3.0f};
    loom_attn_mask dscale = {.scale = 0.5f};
    test_decode(1, 4, 2, 16, NULL, 0);
    test_decode(7, 2, 2, 64, &dcap, 0);
    test_decode(64, 8, 1, 128, &dscale, 0);
    test_decode(100, 4, 2, 16, NULL, 0);
    test_decode(33, 2, 1, 40, &dcap, 1);
    test_decode(300, 2, 2, 37, NULL, 0);
    test_decode(90, 3, 1, 64, &dscale, 1);
    large();
    return cu_finish();
}
