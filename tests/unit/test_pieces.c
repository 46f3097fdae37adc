/* Checkpoint pieces (src/train/ckpt_pieces.c): what a rank owns round-trips through a
 * checkpoint, and a hostile or mismatched checkpoint is refused with the file and the tensor
 * named: overlapping pieces, a gap, a wrong recorded shape, a malformed piece name, a file that
 * is not a piece file. Runs under ASan/UBSan. */
#include "testutil.h"

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

static loom_ckpt *open_step(const char *root, int64_t step) {
    char dir[512];
    loom_ckpt *ck = NULL;
    loom_err err = {{0}};
    loom_pathf(dir, sizeof dir, "%s/step_%07lld", root, (long long)step);
    assert_int_equal(loom_ckpt_open(dir, &ck, &err), 0);
    return ck;
}

static void test_round_trip_across_stages(void **state) {
    (void)state;
    char root[512];
    tu_path(root, sizeof root, "rt");
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
    tu_path(root, sizeof root, "bad");
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

/* A checkpoint of the fused format (before Q/K/V and gate/up were split: layers.<l>.qkv_w,
 * qkv_b and llama's fc_w = [gate | up]) loads into the split tensors at every ZeRO stage. */
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
        /* the fused tensors: a part with legacy_off 0 stands for its whole group (the parts are
         * adjacent in the arena, so its data runs on through the others) */
        loom_tensor_info *fused = calloc((size_t)n, sizeof *fused);
        loom_dp_piece *old = calloc((size_t)n, sizeof *old);
        int no = 0, nfused = 0;
        for (int i = 0; i < n; i++) {
            const loom_tensor_info *t = p[i].tensor;
            if (!t->legacy_name[0]) {
                old[no++] = p[i];
                continue;
            }
            if (t->legacy_off != 0) continue;
            loom_tensor_info *f = NULL; /* one per name: param, adam_m, adam_v share it */
            for (int j = 0; j < nfused && !f; j++)
                if (!strcmp(fused[j].name, t->legacy_name)) f = &fused[j];
            if (f) {
                old[no++] = (loom_dp_piece){p[i].kind, f, 0, f->numel, p[i].data};
                continue;
            }
            f = &fused[nfused++];
            snprintf(f->name, sizeof f->name, "%s", t->legacy_name);
            f->ndim = t->legacy_ndim;
            f->shape[0] = t->legacy_shape[0];
            f->shape[1] = t->legacy_shape[1];
            f->numel = (size_t)f->shape[0] * (size_t)(f->ndim > 1 ? f->shape[1] : 1);
            old[no++] = (loom_dp_piece){p[i].kind, f, 0, f->numel, p[i].data};
        }
        assert_true(nfused > 0);
        const char *names[] = {"rank_00000.safetensors"};
        save(root, c + 1, 1, names, &old, &no);
        for (int zl = 0; zl < 4; zl++) {
            fixture b;
            make(&b, cfgs[c], zl, 99);
            loom_ckpt *ck = open_step(root, c + 1);
            int nn;
            loom_dp_piece *need = loom_dp_needed(b.dp, &nn);
            loom_err err = {{0}};
            assert_int_equal(loom_pieces_fill(ck, need, nn, &err), 0);
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
        fused[0].shape[0] += 1;
        fused[0].numel += (size_t)fused[0].shape[1];
        save(root, c + 10, 1, names, &old, &no);
        loom_ckpt *ck = open_step(root, c + 10);
        int nn;
        loom_dp_piece *need = loom_dp_needed(a.dp, &nn);
        TU_ASSERT_ERR(loom_pieces_fill(ck, need, nn, TU_ERR), "shape", fused[0].name);
        free(need);
        loom_ckpt_close(ck);
        free(fused);
        free(old);
        free(p);
        unmake(&a);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_across_stages),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_fused_format_converts),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
