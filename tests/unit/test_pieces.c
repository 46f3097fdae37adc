/* Checkpoint pieces (src/ckpt/ckpt_pieces.c): what a rank owns round-trips through a
 * checkpoint, and a hostile or mismatched checkpoint is refused with the file and the tensor
 * named: overlapping pieces, a gap, a wrong recorded shape, a malformed piece name, a file that
 * is not a piece file. Runs under ASan/UBSan. */
#include "testutil.h"

#include <sys/stat.h>
#include <unistd.h>

#include "loom/ckpt_pieces.h"
#include "loom/comm.h"

static const loom_model_config CFG = {
    .flavor = LOOM_FLAVOR_GPT2, .vocab_size = 64, .max_seq_len = 8, .n_layer = 2, .n_head = 2,
    .n_kv_head = 2, .d_model = 16, .d_ff = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.02f};

typedef struct fixture {
    loom_mesh *mesh;
    loom_model *m;
    loom_dp *dp;
} fixture;

static void make(fixture *f, const loom_model_config *cfg, int zero, uint64_t seed) {
    loom_err err = {{0}};
    loom_mesh_spec spec;
    loom_mesh_spec_default(&spec);
    assert_int_equal(loom_mesh_create(&spec, NULL, &f->mesh, &err), 0);
    assert_int_equal(loom_model_create_ex(cfg, 1, 4, 0, &f->m, &err), 0);
    assert_int_equal(loom_dp_create(f->m, f->mesh, zero, seed, 0.9f, 0.95f, 1e-8f, 0.1f, &f->dp, &err), 0);
}

static void unmake(fixture *f) {
    loom_dp_free(f->dp);
    loom_model_free(f->m);
    loom_mesh_free(f->mesh);
}

/* writes one checkpoint step holding the given piece files (name, pieces) */
static void save(const char *root, int64_t step, int nfiles, const char **names,
                 loom_dp_piece **pieces, const int *counts) {
    loom_err err = {{0}};
    loom_ckpt_file files[4] = {{0}};
    char *bufs[4] = {0};
    for (int i = 0; i < nfiles; i++) {
        size_t len;
        if (loom_pieces_serialize(pieces[i], counts[i], &bufs[i], &len, &err)) fail_msg("%s", err.msg);
        files[i] = (loom_ckpt_file){names[i], bufs[i], len};
    }
    assert_int_equal(loom_ckpt_save(root, step, files, nfiles, NULL, 0, &err), 0);
    for (int i = 0; i < nfiles; i++) free(bufs[i]);
}

/* 1: the tests open checkpoints as an inference load does, piece files deferred (read
 * through a reader, once, by loom_pieces_fill) */
static int g_defer;

static loom_ckpt *open_step(const char *root, int64_t step) {
    char dir[512];
    loom_ckpt *ck = NULL;
    loom_err err = {{0}};
    loom_pathf(dir, sizeof dir, "%s/step_%07lld", root, (long long)step);
    if (loom_ckpt_open_ex(dir, g_defer ? loom_pieces_is_file : NULL, &ck, &err))
        fail_msg("%s", err.msg);
    for (int i = 0; g_defer && i < loom_ckpt_num_files(ck); i++) { /* no piece file read */
        const char *name = loom_ckpt_file_name(ck, i);
        size_t len;
        assert_int_equal(loom_ckpt_file_deferred(ck, name), loom_pieces_is_file(name));
        if (loom_pieces_is_file(name)) assert_null(loom_ckpt_file_data(ck, name, &len));
    }
    return ck;
}

static void test_round_trip_across_stages(void **state) {
    (void)state;
    char root[512];
    tu_path(root, sizeof root, g_defer ? "rt_deferred" : "rt");
    for (int zs = 0; zs < 4; zs++) {
        fixture a, b;
        make(&a, &CFG, zs, 11);
        int n;
        loom_dp_piece *p = loom_dp_pieces(a.dp, &n);
        /* give the moments recognizable values so the copy is checked, not the zeros */
        for (int i = 0; i < n; i++)
            for (size_t k = 0; k < p[i].count && p[i].kind > 0; k++)
                p[i].data[k] = (float)(p[i].kind * 1000 + (int)p[i].begin + (int)k) * 1e-3f;
        const char *names[] = {"rank_00000.safetensors"};
        save(root, zs + 1, 1, names, &p, &n);
        for (int zl = 0; zl < 4; zl++) { /* load at every stage */
            make(&b, &CFG, zl, 99);      /* a different init: everything must come from disk */
            loom_ckpt *ck = open_step(root, zs + 1);
            int nn;
            loom_dp_piece *need = loom_dp_needed(b.dp, &nn);
            loom_err err = {{0}};
            assert_int_equal(loom_pieces_fill(ck, need, nn, &err), 0);
            assert_int_equal(loom_dp_param_hash(b.dp), loom_dp_param_hash(a.dp));
            for (int i = 0; i < nn; i++) /* moments land where they came from */
                for (size_t k = 0; k < need[i].count && need[i].kind > 0; k++)
                    assert_float_equal(need[i].data[k],
                                       (float)(need[i].kind * 1000 + (int)need[i].begin + (int)k) * 1e-3f, 0);
            free(need);
            loom_ckpt_close(ck);
            unmake(&b);
        }
        free(p);
        unmake(&a);
    }
}

static void test_hostile(void **state) {
    (void)state;
    char root[512];
    tu_path(root, sizeof root, g_defer ? "bad_deferred" : "bad");
    fixture a;
    make(&a, &CFG, 0, 5);
    int n;
    loom_dp_piece *p = loom_dp_pieces(a.dp, &n);
    int nn;
    loom_dp_piece *need = loom_dp_needed(a.dp, &nn);
    const char *one[] = {"rank_00000.safetensors"};
    const char *two[] = {"rank_00000.safetensors", "rank_00001.safetensors"};

    /* the same pieces in two files: overlap */
    loom_dp_piece *pp[2] = {p, p};
    int cc[2] = {n, n};
    save(root, 1, 2, two, pp, cc);
    loom_ckpt *ck = open_step(root, 1);
    TU_ASSERT_ERR(loom_pieces_fill(ck, need, nn, TU_ERR), "overlap", "rank_0000");
    loom_ckpt_close(ck);

    /* a missing tensor piece: a gap */
    int m = n - 1;
    save(root, 2, 1, one, &p, &m);
    ck = open_step(root, 2);
    TU_ASSERT_ERR(loom_pieces_fill(ck, need, nn, TU_ERR), "this rank needs", p[n - 1].tensor->name);
    loom_ckpt_close(ck);

    /* half of a tensor only */
    loom_dp_piece half = p[0];
    half.count /= 2;
    loom_dp_piece *hp = &half;
    int one_count = 1;
    save(root, 3, 1, one, &hp, &one_count);
    ck = open_step(root, 3);
    loom_dp_piece need0 = need[0];
    TU_ASSERT_ERR(loom_pieces_fill(ck, &need0, 1, TU_ERR), "holds", p[0].tensor->name);
    loom_ckpt_close(ck);

    /* a model of another shape */
    loom_model_config wide = CFG;
    wide.d_model = 32;
    fixture b;
    make(&b, &wide, 0, 5);
    int nb;
    loom_dp_piece *needb = loom_dp_needed(b.dp, &nb);
    save(root, 4, 1, one, &p, &n);
    ck = open_step(root, 4);
    TU_ASSERT_ERR(loom_pieces_fill(ck, needb, nb, TU_ERR), "shape", "wte");
    loom_ckpt_close(ck);
    free(needb);
    unmake(&b);

    /* a safetensors file that is not a piece file */
    float x[4] = {1, 2, 3, 4};
    loom_st_tensor t = {.name = "wte", .data = x, .ndim = 1, .shape = {4}};
    char *buf;
    size_t len;
    loom_err err = {{0}};
    assert_int_equal(loom_safetensors_serialize(&t, 1, NULL, &buf, &len, &err), 0);
    loom_ckpt_file f = {"rank_00000.safetensors", buf, len};
    assert_int_equal(loom_ckpt_save(root, 5, &f, 1, NULL, 0, &err), 0);
    free(buf);
    ck = open_step(root, 5);
    TU_ASSERT_ERR(loom_pieces_fill(ck, need, nn, TU_ERR), "not a loom piece file", "rank_00000");
    loom_ckpt_close(ck);

    /* a piece name that is not <kind>/<tensor>/<begin> */
    const char *meta[] = {"format", "loom-pieces-1", NULL};
    t.name = "param/wte/12x";
    assert_int_equal(loom_safetensors_serialize(&t, 1, meta, &buf, &len, &err), 0);
    f.data = buf;
    f.len = len;
    assert_int_equal(loom_ckpt_save(root, 6, &f, 1, NULL, 0, &err), 0);
    free(buf);
    ck = open_step(root, 6);
    TU_ASSERT_ERR(loom_pieces_fill(ck, need, nn, TU_ERR), "param/wte/12x", "not named");
    loom_ckpt_close(ck);

    /* no piece files at all */
    loom_ckpt_file other = {"notes.txt", "hi", 2};
    assert_int_equal(loom_ckpt_save(root, 7, &other, 1, NULL, 0, &err), 0);
    ck = open_step(root, 7);
    TU_ASSERT_ERR(loom_pieces_fill(ck, need, nn, TU_ERR), "no rank_*.safetensors");
    loom_ckpt_close(ck);

    free(p);
    free(need);
    unmake(&a);
}

/* The pieces of the first checkpoint format (loom-pieces-1, before boxes): each a flat range
 * [begin, begin + count) of a whole tensor, 1-D, named <kind>/<tensor>/<begin>. tensors names
 * the tensor of each piece by (name, ndim, shape) since fused ones are not in the model. */
typedef struct v1_piece {
    int kind;
    const char *name;
    int ndim;
    int64_t shape[2];
    size_t begin, count;
    const float *data;
} v1_piece;

static void save_v1(const char *root, int64_t step, const v1_piece *p, int n) {
    static const char *kinds[3] = {"param", "adam_m", "adam_v"};
    loom_st_tensor *t = calloc((size_t)n, sizeof *t);
    char **names = calloc((size_t)n, sizeof *names);
    const char **meta = calloc(2 * (size_t)n + 3, sizeof *meta);
    char **own = calloc(2 * (size_t)n + 3, sizeof *own);
    int nm = 0, no = 0;
    meta[nm++] = "format";
    meta[nm++] = "loom-pieces-1";
    for (int i = 0; i < n; i++) {
        char buf[200];
        snprintf(buf, sizeof buf, "%s/%s/%zu", kinds[p[i].kind], p[i].name, p[i].begin);
        names[i] = strdup(buf);
        t[i] = (loom_st_tensor){.name = names[i], .data = p[i].data, .ndim = 1,
                                .shape = {(int64_t)p[i].count}};
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(p[j].name, p[i].name);
        if (seen) continue;
        snprintf(buf, sizeof buf, "shape/%s", p[i].name);
        meta[nm++] = own[no++] = strdup(buf);
        if (p[i].ndim == 1) snprintf(buf, sizeof buf, "[%lld]", (long long)p[i].shape[0]);
        else snprintf(buf, sizeof buf, "[%lld, %lld]", (long long)p[i].shape[0], (long long)p[i].shape[1]);
        meta[nm++] = own[no++] = strdup(buf);
    }
    char *buf;
    size_t len;
    loom_err err = {{0}};
    if (loom_safetensors_serialize(t, n, meta, &buf, &len, &err)) fail_msg("%s", err.msg);
    loom_ckpt_file f = {"rank_00000.safetensors", buf, len};
    if (loom_ckpt_save(root, step, &f, 1, NULL, 0, &err)) fail_msg("%s", err.msg);
    free(buf);
    for (int i = 0; i < n; i++) free(names[i]);
    for (int i = 0; i < no; i++) free(own[i]);
    free(names);
    free(own);
    free(meta);
    free(t);
}

/* a loom_dp_piece of the whole model as a v1 piece */
static v1_piece as_v1(const loom_dp_piece *p) {
    const loom_tensor_info *t = p->tensor;
    return (v1_piece){p->kind, t->name, t->ndim, {t->shape[0], t->shape[1]}, p->begin, p->count,
                      p->data};
}

/* Checkpoints of the first format (flat ranges, loom-pieces-1) load at every ZeRO stage. */
static void test_v1_format_loads(void **state) {
    (void)state;
    char root[512];
    tu_path(root, sizeof root, g_defer ? "v1_deferred" : "v1");
    for (int zs = 0; zs < 4; zs += 3) {
        fixture a;
        make(&a, &CFG, zs, 11);
        int n;
        loom_dp_piece *p = loom_dp_pieces(a.dp, &n);
        for (int i = 0; i < n; i++)
            for (size_t k = 0; k < p[i].count && p[i].kind > 0; k++)
                p[i].data[k] = (float)(p[i].kind * 1000 + (int)p[i].begin + (int)k) * 1e-3f;
        v1_piece *v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
        for (int i = 0; i < n; i++) v[i] = as_v1(&p[i]);
        save_v1(root, zs + 1, v, n);
        for (int zl = 0; zl < 4; zl++) {
            fixture b;
            make(&b, &CFG, zl, 99);
            loom_ckpt *ck = open_step(root, zs + 1);
            int nn;
            loom_dp_piece *need = loom_dp_needed(b.dp, &nn);
            loom_err err = {{0}};
            if (loom_pieces_fill(ck, need, nn, &err)) fail_msg("%s", err.msg);
            assert_int_equal(loom_dp_param_hash(b.dp), loom_dp_param_hash(a.dp));
            for (int i = 0; i < nn; i++)
                for (size_t k = 0; k < need[i].count && need[i].kind > 0; k++)
                    assert_float_equal(need[i].data[k],
                                       (float)(need[i].kind * 1000 + (int)need[i].begin + (int)k) * 1e-3f, 0);
            free(need);
            loom_ckpt_close(ck);
            unmake(&b);
        }
        free(v);
        free(p);
        unmake(&a);
    }
}

/* A checkpoint of the fused format (loom-pieces-1 with layers.<l>.qkv_w, qkv_b and llama's
 * fc_w = [gate | up]) loads into the split tensors at every ZeRO stage. */
static void test_fused_format_converts(void **state) {
    (void)state;
    char root[512];
    tu_path(root, sizeof root, "fused");
    const loom_model_config llama = {
        .flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 64, .max_seq_len = 8, .n_layer = 2,
        .n_head = 4, .n_kv_head = 2, .d_model = 16, .d_ff = 24, .norm_eps = 1e-5f,
        .rope_theta = 10000.0f, .init_std = 0.02f};
    const loom_model_config *cfgs[2] = {&CFG, &llama};
    for (int c = 0; c < 2; c++) {
        fixture a;
        make(&a, cfgs[c], 0, 11);
        int n;
        loom_dp_piece *p = loom_dp_pieces(a.dp, &n); /* whole tensors at ZeRO 0 */
        for (int i = 0; i < n; i++)
            for (size_t k = 0; k < p[i].count && p[i].kind > 0; k++)
                p[i].data[k] = (float)(p[i].kind * 1000 + i * 7 + (int)k) * 1e-3f;
        /* a part at fused row 0 stands for its whole group (the parts are adjacent in the
         * arena, so its data runs on through the others); each fused tensor in two pieces */
        v1_piece *old = calloc(2 * (size_t)n, sizeof *old);
        int no = 0, nfused = 0;
        for (int i = 0; i < n; i++) {
            const loom_tensor_info *t = p[i].tensor;
            if (!t->legacy_name[0]) {
                old[no++] = as_v1(&p[i]);
                continue;
            }
            if (t->legacy_row0 != 0) continue;
            const size_t total = (size_t)t->legacy_shape[0] * (size_t)(t->legacy_ndim > 1 ? t->legacy_shape[1] : 1);
            const size_t half = total / 2 + 3;
            old[no++] = (v1_piece){p[i].kind, t->legacy_name, t->legacy_ndim,
                                   {t->legacy_shape[0], t->legacy_shape[1]}, 0, half, p[i].data};
            old[no++] = (v1_piece){p[i].kind, t->legacy_name, t->legacy_ndim,
                                   {t->legacy_shape[0], t->legacy_shape[1]}, half, total - half,
                                   p[i].data + half};
            nfused++;
        }
        assert_true(nfused > 0);
        save_v1(root, c + 1, old, no);
        for (int zl = 0; zl < 4; zl++) {
            fixture b;
            make(&b, cfgs[c], zl, 99);
            loom_ckpt *ck = open_step(root, c + 1);
            int nn;
            loom_dp_piece *need = loom_dp_needed(b.dp, &nn);
            loom_err err = {{0}};
            if (loom_pieces_fill(ck, need, nn, &err)) fail_msg("%s", err.msg);
            assert_int_equal(loom_dp_param_hash(b.dp), loom_dp_param_hash(a.dp));
            for (int i = 0; i < nn; i++) { /* moments: compare with a's piece of that tensor */
                if (need[i].kind == 0) continue;
                const loom_dp_piece *src = NULL;
                for (int j = 0; j < n && !src; j++)
                    if (p[j].kind == need[i].kind && !strcmp(p[j].tensor->name, need[i].tensor->name))
                        src = &p[j];
                assert_non_null(src);
                assert_memory_equal(need[i].data, src->data + need[i].begin, need[i].count * sizeof(float));
            }
            free(need);
            loom_ckpt_close(ck);
            unmake(&b);
        }
        /* a fused tensor of another shape is refused naming it */
        for (int i = 0; i < no; i++)
            if (strstr(old[i].name, "qkv_w")) old[i].shape[0] += 1;
        save_v1(root, c + 10, old, no);
        loom_ckpt *ck = open_step(root, c + 10);
        int nn;
        loom_dp_piece *need = loom_dp_needed(a.dp, &nn);
        TU_ASSERT_ERR(loom_pieces_fill(ck, need, nn, TU_ERR), "shape", "qkv_w");
        free(need);
        loom_ckpt_close(ck);
        free(old);
        free(p);
        unmake(&a);
    }
}

/* a value determined by (kind, tensor, global element): what every layout must agree on */
static float mark(int kind, const loom_tensor_info *t, int64_t g) {
    return (float)(kind * 100000 + (int)(loom_hash_str(t->name) % 997) * 1000 + (int)(g % 1000)) * 1e-4f;
}

static void make_view(fixture *f, const loom_model_config *cfg, int tp, int rank, int zero,
                      uint64_t seed) {
    loom_err err = {{0}};
    loom_mesh_spec spec;
    loom_mesh_spec_default(&spec);
    assert_int_equal(loom_mesh_create(&spec, NULL, &f->mesh, &err), 0);
    const loom_model_layout lay = {.tp = tp, .tp_rank = rank};
    if (loom_model_create_view(cfg, &lay, 1, 4, 0, &f->m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(loom_dp_create(f->m, f->mesh, zero, seed, 0.9f, 0.95f, 1e-8f, 0.1f, &f->dp, &err), 0);
}

/* Pieces are boxes: the two tp = 2 views of a llama with GQA (heads, kv heads, columns split)
 * write boxes that the whole model loads (and the other way round), at ZeRO stages that cut
 * the boxes at arbitrary flat positions; every element lands at its global position. */
static void test_tp_boxes(void **state) {
    (void)state;
    char root[512];
    tu_path(root, sizeof root, g_defer ? "boxes_deferred" : "boxes");
    const loom_model_config cfgs[2] = {
        CFG,
        {.flavor = LOOM_FLAVOR_LLAMA, .vocab_size = 64, .max_seq_len = 8, .n_layer = 2,
         .n_head = 4, .n_kv_head = 2, .d_model = 16, .d_ff = 24, .norm_eps = 1e-5f,
         .rope_theta = 10000.0f, .init_std = 0.02f}};
    int64_t step = 0;
    for (int c = 0; c < 2; c++)
        for (int zs = 0; zs < 4; zs += 3) {
            /* tp views -> whole model */
            const char *names[] = {"rank_00000.safetensors", "rank_00001.safetensors"};
            fixture v[2];
            loom_dp_piece *pv[2];
            int nv[2];
            for (int r = 0; r < 2; r++) {
                make_view(&v[r], &cfgs[c], 2, r, zs, 11);
                pv[r] = loom_dp_pieces(v[r].dp, &nv[r]);
                for (int i = 0; i < nv[r]; i++)
                    for (size_t k = 0; k < pv[r][i].count && pv[r][i].kind > 0; k++)
                        pv[r][i].data[k] = mark(pv[r][i].kind, pv[r][i].tensor,
                                                loom_tensor_global_index(pv[r][i].tensor, (int64_t)(pv[r][i].begin + k)));
            }
            /* replicated tensors are held whole by both views: only rank 0 writes those */
            int keep = 0;
            for (int i = 0; i < nv[1]; i++)
                if (pv[1][i].tensor->split_dim >= 0) pv[1][keep++] = pv[1][i];
            nv[1] = keep;
            save(root, ++step, 2, names, pv, nv);
            fixture whole, ref;
            make(&ref, &cfgs[c], 0, 11); /* init keyed by global element: the same weights */
            for (int zl = 0; zl < 4; zl++) {
                make(&whole, &cfgs[c], zl, 99);
                loom_ckpt *ck = open_step(root, step);
                int nn;
                loom_dp_piece *need = loom_dp_needed(whole.dp, &nn);
                loom_err err = {{0}};
                if (loom_pieces_fill(ck, need, nn, &err)) fail_msg("%s", err.msg);
                assert_int_equal(loom_dp_param_hash(whole.dp), loom_dp_param_hash(ref.dp));
                for (int i = 0; i < nn; i++)
                    for (size_t k = 0; k < need[i].count && need[i].kind > 0; k++)
                        assert_float_equal(need[i].data[k],
                                           mark(need[i].kind, need[i].tensor, (int64_t)(need[i].begin + k)), 0);
                free(need);
                loom_ckpt_close(ck);
                unmake(&whole);
            }
            /* whole model -> tp views */
            int nr;
            loom_dp_piece *pr = loom_dp_pieces(ref.dp, &nr);
            for (int i = 0; i < nr; i++)
                for (size_t k = 0; k < pr[i].count && pr[i].kind > 0; k++)
                    pr[i].data[k] = mark(pr[i].kind, pr[i].tensor, (int64_t)(pr[i].begin + k));
            save(root, ++step, 1, names, &pr, &nr);
            for (int r = 0; r < 2; r++) {
                fixture w;
                make_view(&w, &cfgs[c], 2, r, 3 - zs, 99);
                loom_ckpt *ck = open_step(root, step);
                int nn;
                loom_dp_piece *need = loom_dp_needed(w.dp, &nn);
                loom_err err = {{0}};
                if (loom_pieces_fill(ck, need, nn, &err)) fail_msg("%s", err.msg);
                for (int i = 0; i < nn; i++)
                    for (size_t k = 0; k < need[i].count; k++) {
                        const int64_t g = loom_tensor_global_index(need[i].tensor, (int64_t)(need[i].begin + k));
                        float want = need[i].kind > 0 ? mark(need[i].kind, need[i].tensor, g) : 0;
                        if (need[i].kind == 0) { /* the parameter: same as the view's init (seed 11) */
                            loom_model_init_range(w.m, 11, need[i].tensor->offset + need[i].begin + k, 1, &want);
                        }
                        assert_float_equal(need[i].data[k], want, 0);
                    }
                free(need);
                loom_ckpt_close(ck);
                unmake(&w);
            }
            free(pr);
            unmake(&ref);
            for (int r = 0; r < 2; r++) {
                free(pv[r]);
                unmake(&v[r]);
            }
        }
}

/* The same loads with the piece files deferred: every element read straight from the file
 * into place (boxes cut at arbitrary flat positions, v1 ranges, tp boxes) */
static void test_deferred_round_trip(void **state) {
    g_defer = 1;
    test_round_trip_across_stages(state);
    g_defer = 0;
}
static void test_deferred_v1(void **state) {
    g_defer = 1;
    test_v1_format_loads(state);
    g_defer = 0;
}
static void test_deferred_tp_boxes(void **state) {
    g_defer = 1;
    test_tp_boxes(state);
    g_defer = 0;
}
static void test_deferred_hostile(void **state) {
    g_defer = 1;
    test_hostile(state);
    g_defer = 0;
}

/* writes byte b at offset off of path (in place, same size) */
static void poke(const char *path, long off, int b) {
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, off, SEEK_SET), 0);
    assert_int_equal(fputc(b, fp), b);
    assert_int_equal(fclose(fp), 0);
}

static long file_size(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (long)st.st_size;
}

/* An inference load (parameters only) of a deferred checkpoint: the parameters equal the
 * saved ones; a byte changed anywhere in the file (in the moments, which are not kept; in a
 * parameter; after open: the TOCTOU case) or a file cut or grown after open is refused with
 * the file named, and nothing is read twice. */
static void test_deferred_params_only(void **state) {
    (void)state;
    char root[512], dir[600], path[700];
    tu_path(root, sizeof root, "infer");
    fixture a;
    make(&a, &CFG, 0, 11);
    int n;
    loom_dp_piece *p = loom_dp_pieces(a.dp, &n);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < p[i].count && p[i].kind > 0; k++) p[i].data[k] = 0.25f * (float)k;
    const char *names[] = {"rank_00000.safetensors"};
    save(root, 1, 1, names, &p, &n);
    loom_pathf(dir, sizeof dir, "%s/step_0000001", root);
    loom_pathf(path, sizeof path, "%s/rank_00000.safetensors", dir);
    const long size = file_size(path);
    loom_err err = {{0}};
    loom_model *m = NULL;
    assert_int_equal(loom_model_create_view(&CFG, NULL, 1, 4, LOOM_MODEL_INFER, &m, &err), 0);
    const size_t pbytes = loom_model_num_params(m) * sizeof(float);

    g_defer = 1;
    loom_ckpt *ck = open_step(root, 1);
    if (loom_pieces_load_params(ck, m, &err)) fail_msg("%s", err.msg);
    size_t seen = 0; /* every parameter as saved */
    for (int i = 0; i < n; i++)
        if (p[i].kind == 0) {
            assert_memory_equal(loom_model_params(m) + p[i].tensor->offset + p[i].begin,
                                p[i].data, p[i].count * sizeof(float));
            seen += p[i].count * sizeof(float);
        }
    assert_int_equal(seen, pbytes);
    loom_ckpt_close(ck);

    /* the moments lie after the parameters in the file: flip the last byte */
    ck = open_step(root, 1);
    poke(path, size - 1, 0x5a);
    TU_ASSERT_ERR(loom_pieces_load_params(ck, m, TU_ERR), path, "SHA-256 mismatch", "corrupt");
    loom_ckpt_close(ck);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &ck, TU_ERR), path, "SHA-256 mismatch");

    /* changed between open and the read: what was read is refused */
    save(root, 2, 1, names, &p, &n);
    loom_pathf(dir, sizeof dir, "%s/step_0000002", root);
    loom_pathf(path, sizeof path, "%s/rank_00000.safetensors", dir);
    ck = open_step(root, 2);
    poke(path, size / 2, 0x33);
    TU_ASSERT_ERR(loom_pieces_load_params(ck, m, TU_ERR), path, "SHA-256 mismatch");
    loom_ckpt_close(ck);

    /* cut or grown after open */
    save(root, 3, 1, names, &p, &n);
    loom_pathf(dir, sizeof dir, "%s/step_0000003", root);
    loom_pathf(path, sizeof path, "%s/rank_00000.safetensors", dir);
    ck = open_step(root, 3);
    assert_int_equal(truncate(path, size - 8), 0);
    TU_ASSERT_ERR(loom_pieces_load_params(ck, m, TU_ERR), path, "size mismatch");
    assert_int_equal(truncate(path, size + 8), 0);
    TU_ASSERT_ERR(loom_pieces_load_params(ck, m, TU_ERR), path, "size mismatch");
    loom_ckpt_close(ck);
    /* cut before open: refused at open, as the eager open does */
    assert_int_equal(truncate(path, 100), 0);
    TU_ASSERT_ERR(loom_ckpt_open_ex(dir, loom_pieces_is_file, &ck, TU_ERR), path, "size mismatch");
    g_defer = 0;

    /* the reader refuses going backwards or past the end */
    save(root, 4, 1, names, &p, &n);
    loom_pathf(dir, sizeof dir, "%s/step_0000004", root);
    assert_int_equal(loom_ckpt_open_ex(dir, loom_pieces_is_file, &ck, &err), 0);
    loom_ckpt_reader *rd = NULL;
    char b8[8];
    assert_int_equal(loom_ckpt_reader_open(ck, "rank_00000.safetensors", &rd, &err), 0);
    assert_int_equal(loom_ckpt_reader_read(rd, 16, b8, 8, &err), 0);
    TU_ASSERT_ERR(loom_ckpt_reader_read(rd, 0, b8, 8, TU_ERR), "rank_00000", "behind");
    TU_ASSERT_ERR(loom_ckpt_reader_read(rd, (uint64_t)size - 4, b8, 8, TU_ERR), "past");
    assert_int_equal(loom_ckpt_reader_finish(rd, &err), 0);
    loom_ckpt_reader_close(rd);
    TU_ASSERT_ERR(loom_ckpt_reader_open(ck, "nope.bin", &rd, TU_ERR), "nope.bin");
    loom_ckpt_close(ck);

    loom_model_free(m);
    free(p);
    unmake(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_across_stages),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_v1_format_loads),
        cmocka_unit_test(test_fused_format_converts),
        cmocka_unit_test(test_tp_boxes),
        cmocka_unit_test(test_deferred_round_trip),
        cmocka_unit_test(test_deferred_v1),
        cmocka_unit_test(test_deferred_tp_boxes),
        cmocka_unit_test(test_deferred_hostile),
        cmocka_unit_test(test_deferred_params_only),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
