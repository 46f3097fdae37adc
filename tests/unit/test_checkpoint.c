/* Checkpoint directories: save, COMPLETE rule, latest, resolve, SHA-256 verification and
 * strict manifests. Runs under ASan/UBSan. */
#include "testutil.h"

#include <dirent.h>

#include "loom/checkpoint.h"

/* A model file and a trainer-state file whose contents depend on the step. */
static float g_w[2][6];
static char g_state[2][64];

static void save_step(const char *root, int64_t step, int slot, char *out, size_t out_size) {
    for (int i = 0; i < 6; i++) g_w[slot][i] = (float)step + 0.25f * (float)i;
    snprintf(g_state[slot], sizeof g_state[slot], "{\"step\": %lld}", (long long)step);
    loom_st_tensor t = {.name = "wte", .data = g_w[slot], .ndim = 2, .shape = {2, 3}};
    char *st;
    size_t st_len;
    loom_err err = {{0}};
    assert_int_equal(loom_safetensors_serialize(&t, 1, NULL, &st, &st_len, &err), 0);
    loom_ckpt_file files[] = {{"model.safetensors", st, st_len},
                              {"trainer_state.json", g_state[slot], strlen(g_state[slot])}};
    if (loom_ckpt_save(root, step, files, 2, out, out_size, &err) != 0)
        fail_msg("save step %lld: %s", (long long)step, err.msg);
    free(st);
}

static void test_save_open_latest(void **state) {
    (void)state;
    char root[512], dir[512], path[1024], want[1024];
    tu_path(root, sizeof root, "run/ckpt"); /* created by save (mkdir -p) */
    save_step(root, 10, 0, dir, sizeof dir);
    loom_pathf(want, sizeof want, "%s/step_0000010", root);
    assert_string_equal(dir, want);
    save_step(root, 20, 1, dir, sizeof dir);

    /* the layout */
    const char *names[] = {"model.safetensors", "trainer_state.json", "manifest.json",
                           "COMPLETE"};
    for (int i = 0; i < 4; i++) {
        loom_pathf(path, sizeof path, "%s/step_0000020/%s", root, names[i]);
        assert_true(loom_path_exists(path));
    }
    char target[256] = {0};
    loom_pathf(path, sizeof path, "%s/latest", root);
    assert_true(readlink(path, target, sizeof target - 1) > 0);
    assert_string_equal(target, "step_0000020");

    char found[1024];
    int64_t step = -2;
    loom_err err = {{0}};
    assert_int_equal(loom_ckpt_find_latest(root, found, sizeof found, &step, &err), 0);
    assert_int_equal(step, 20);
    loom_pathf(want, sizeof want, "%s/step_0000020", root);
    assert_string_equal(found, want);

    /* a newer step directory without COMPLETE is ignored by find_latest, refused by open */
    loom_pathf(path, sizeof path, "%s/step_0000030", root);
    assert_int_equal(mkdir(path, 0755), 0);
    loom_pathf(path, sizeof path, "%s/step_0000030/manifest.json", root);
    tu_write_text(path, "{\"step\": 30, \"files\": {}}\n");
    loom_pathf(path, sizeof path, "%s/step_0000030/model.safetensors", root);
    tu_write_text(path, "half-written");
    assert_int_equal(loom_ckpt_find_latest(root, found, sizeof found, &step, &err), 0);
    assert_int_equal(step, 20);
    /* so are names that are not step_ + 7 digits, even with COMPLETE */
    loom_pathf(path, sizeof path, "%s/step_99", root);
    assert_int_equal(mkdir(path, 0755), 0);
    loom_pathf(path, sizeof path, "%s/step_99/COMPLETE", root);
    tu_write_text(path, "x");
    assert_int_equal(loom_ckpt_find_latest(root, found, sizeof found, &step, &err), 0);
    assert_int_equal(step, 20);

    loom_ckpt *c = NULL;
    loom_pathf(path, sizeof path, "%s/step_0000030", root);
    char incomplete_msg[1100];
    loom_pathf(incomplete_msg, sizeof incomplete_msg, "%s: incomplete checkpoint (no COMPLETE marker)",
             path);
    TU_ASSERT_ERR(loom_ckpt_open(path, &c, TU_ERR), incomplete_msg);
    assert_null(c);

    /* open the newest complete one: step, dir, verified bytes */
    assert_int_equal(loom_ckpt_open(found, &c, &err), 0);
    assert_int_equal(loom_ckpt_step(c), 20);
    assert_string_equal(loom_ckpt_dir(c), found);
    size_t len = 0;
    const char *ts = loom_ckpt_file_data(c, "trainer_state.json", &len);
    assert_non_null(ts);
    assert_int_equal(len, strlen(g_state[1]));
    assert_string_equal(ts, g_state[1]); /* NUL-terminated */
    assert_null(loom_ckpt_file_data(c, "optimizer.safetensors", &len));
    const char *model = loom_ckpt_file_data(c, "model.safetensors", &len);
    assert_non_null(model);
    loom_st_file *st = NULL;
    assert_int_equal(loom_safetensors_parse(model, len, "model.safetensors", &st, &err), 0);
    float w[6];
    assert_int_equal(loom_safetensors_read_into(st, "wte", w, 2, (int64_t[]){2, 3}, &err), 0);
    assert_memory_equal(w, g_w[1], sizeof w);
    loom_safetensors_close(st);
    loom_ckpt_close(c);

    /* the manifest lists sizes and hashes */
    char *text;
    loom_pathf(path, sizeof path, "%s/step_0000010/manifest.json", root);
    text = tu_read_file(path, &len);
    char hex[65];
    loom_sha256_hex(g_state[0], strlen(g_state[0]), hex);
    assert_non_null(strstr(text, "\"step\": 10"));
    assert_non_null(strstr(text, hex));
    assert_non_null(strstr(text, "\"loom_version\""));
    free(text);
}

static void test_resolve(void **state) {
    (void)state;
    char run[512], root[512], out[1024], want[1024], path[1024];
    tu_path(run, sizeof run, "resolve_run");
    loom_pathf(root, sizeof root, "%s/ckpt", run);
    save_step(root, 1, 0, NULL, 0);
    save_step(root, 2, 1, NULL, 0);
    loom_pathf(want, sizeof want, "%s/step_0000002", root);
    loom_err err = {{0}};

    /* run dir, ckpt root, latest link, step dir */
    assert_int_equal(loom_ckpt_resolve(run, out, sizeof out, &err), 0);
    assert_string_equal(out, want);
    assert_int_equal(loom_ckpt_resolve(root, out, sizeof out, &err), 0);
    assert_string_equal(out, want);
    loom_pathf(path, sizeof path, "%s/latest", root);
    assert_int_equal(loom_ckpt_resolve(path, out, sizeof out, &err), 0);
    assert_string_equal(out, want);
    loom_pathf(path, sizeof path, "%s/step_0000001", root);
    assert_int_equal(loom_ckpt_resolve(path, out, sizeof out, &err), 0);
    assert_string_equal(out, path);
    loom_ckpt *c = NULL;
    assert_int_equal(loom_ckpt_open(out, &c, &err), 0);
    assert_int_equal(loom_ckpt_step(c), 1);
    loom_ckpt_close(c);

    /* a buffer too small is an error, not a truncated path */
    char tiny[8];
    TU_ASSERT_ERR(loom_ckpt_resolve(root, tiny, sizeof tiny, TU_ERR), "does not fit");

    /* nothing there */
    tu_path(path, sizeof path, "nothing");
    TU_ASSERT_ERR(loom_ckpt_resolve(path, out, sizeof out, TU_ERR), path);
    assert_int_equal(mkdir(path, 0755), 0);
    TU_ASSERT_ERR(loom_ckpt_resolve(path, out, sizeof out, TU_ERR), path, "no complete checkpoint");
    int64_t step = 5;
    assert_int_equal(loom_ckpt_find_latest(path, out, sizeof out, &step, &err), 0);
    assert_int_equal(step, -1);
    tu_path(path, sizeof path, "does/not/exist");
    assert_int_equal(loom_ckpt_find_latest(path, out, sizeof out, &step, &err), 0);
    assert_int_equal(step, -1);
}

static void test_corruption(void **state) {
    (void)state;
    char root[512], path[1024], dir[1024];
    tu_path(root, sizeof root, "corrupt");
    save_step(root, 7, 0, dir, sizeof dir);
    loom_ckpt *c = NULL;
    loom_err err = {{0}};

    /* flip one byte of the model: open names the file and says SHA-256 */
    loom_pathf(path, sizeof path, "%s/model.safetensors", dir);
    tu_xor_byte(path, -3, 0x10);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), path, "SHA-256 mismatch", "corrupt");
    assert_null(c);
    tu_xor_byte(path, -3, 0x10); /* restored */
    assert_int_equal(loom_ckpt_open(dir, &c, &err), 0);
    loom_ckpt_close(c);

    /* a file one byte longer than the manifest says */
    loom_pathf(path, sizeof path, "%s/trainer_state.json", dir);
    FILE *f = fopen(path, "ab");
    fputc(' ', f);
    fclose(f);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), path, "size mismatch");

    /* a listed file that is missing */
    assert_int_equal(unlink(path), 0);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), path, "listed in the manifest");

    /* an edited manifest no longer matches COMPLETE */
    save_step(root, 8, 1, dir, sizeof dir);
    loom_pathf(path, sizeof path, "%s/manifest.json", dir);
    char *text;
    size_t len;
    text = tu_read_file(path, &len);
    text[len - 1] = ' ';
    tu_write_text(path, text);
    free(text);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), dir, "COMPLETE", "corrupt");

    /* not a directory at all */
    loom_pathf(path, sizeof path, "%s/nope", root);
    TU_ASSERT_ERR(loom_ckpt_open(path, &c, TU_ERR), path);
}

/* Hand-made manifests (with a matching COMPLETE) that a strict reader must refuse. */
static void put_manifest(const char *dir, const char *manifest) {
    char path[1024], hex[65], marker[80];
    mkdir(dir, 0755);
    loom_pathf(path, sizeof path, "%s/manifest.json", dir);
    tu_write_text(path, manifest);
    loom_sha256_hex(manifest, strlen(manifest), hex);
    loom_pathf(marker, sizeof marker, "%s\n", hex);
    loom_pathf(path, sizeof path, "%s/COMPLETE", dir);
    tu_write_text(path, marker);
}

static void test_hostile_manifest(void **state) {
    (void)state;
    char dir[512], path[1024];
    loom_ckpt *c = NULL;
    tu_path(dir, sizeof dir, "hostile");
    tu_path(path, sizeof path, "secret");
    tu_write_text(path, "x");
    char hex[65];
    loom_sha256_hex("x", 1, hex);
    char m[512];
    loom_pathf(m, sizeof m, "{\"step\": 1, \"files\": {\"../secret\": {\"bytes\": 1, \"sha256\": \"%s\"}}}",
             hex);
    put_manifest(dir, m);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "'../secret'", "contains '/'");
    loom_pathf(m, sizeof m, "{\"step\": 1, \"files\": {\"..\": {\"bytes\": 1, \"sha256\": \"%s\"}}}", hex);
    put_manifest(dir, m);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "'..'");
    put_manifest(dir, "{\"step\": 1, \"step\": 2, \"files\": {}}");
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "manifest.json", "duplicate");
    put_manifest(dir, "{\"step\": 1, \"files\": {\"a\": {\"bytes\": -1, \"sha256\": \"00\"}}}");
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "'bytes'");
    put_manifest(dir, "{\"step\": 1, \"files\": {\"a\": {\"bytes\": 999999999999999, \"sha256\": \"00\"}}}");
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "'bytes'");
    loom_pathf(m, sizeof m, "{\"step\": 1, \"files\": {\"a\": {\"bytes\": 1, \"sha256\": \"%.63sG\"}}}", hex);
    put_manifest(dir, m);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "'sha256'");
    put_manifest(dir, "[1]");
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "not a JSON object");
    put_manifest(dir, "{\"step\": 1, \"files\": {");
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "manifest.json");
    put_manifest(dir, "{\"step\": \"1\", \"files\": {}}");
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "'step'");
    /* a link inside the step directory is refused even when the hash matches */
    loom_pathf(m, sizeof m, "{\"step\": 1, \"files\": {\"link\": {\"bytes\": 1, \"sha256\": \"%s\"}}}", hex);
    put_manifest(dir, m);
    char link[1024];
    loom_pathf(link, sizeof link, "%s/link", dir);
    assert_int_equal(symlink(path, link), 0);
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "not a regular file");
    /* a manifest whose step disagrees with the directory name */
    tu_path(dir, sizeof dir, "hostile/step_0000005");
    put_manifest(dir, "{\"step\": 6, \"files\": {}}");
    TU_ASSERT_ERR(loom_ckpt_open(dir, &c, TU_ERR), "step 6", "step 5");
    /* and an empty, well-formed one opens */
    put_manifest(dir, "{\"step\": 5, \"files\": {}}");
    loom_err err = {{0}};
    assert_int_equal(loom_ckpt_open(dir, &c, &err), 0);
    assert_int_equal(loom_ckpt_step(c), 5);
    loom_ckpt_close(c);
}

static void test_overwrite_rules(void **state) {
    (void)state;
    char root[512], path[1024], dir[1024], target[256];
    tu_path(root, sizeof root, "overwrite");
    save_step(root, 3, 0, dir, sizeof dir);
    loom_err err = {{0}};
    char data[] = "abc";
    loom_ckpt_file one = {"x.bin", data, 3};

    /* a complete step is not overwritten ... */
    TU_ASSERT_ERR(loom_ckpt_save(root, 3, &one, 1, NULL, 0, TU_ERR), "already exists", "COMPLETE");
    /* ... until its COMPLETE is removed */
    loom_pathf(path, sizeof path, "%s/COMPLETE", dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(loom_ckpt_save(root, 3, &one, 1, NULL, 0, &err), 0);
    loom_ckpt *c = NULL;
    assert_int_equal(loom_ckpt_open(dir, &c, &err), 0);
    size_t len;
    assert_string_equal(loom_ckpt_file_data(c, "x.bin", &len), "abc");
    assert_null(loom_ckpt_file_data(c, "model.safetensors", &len)); /* not in the new manifest */
    loom_ckpt_close(c);

    /* an interrupted save (no COMPLETE, stale manifest and temp file) is replaced; files
     * this save does not write are left alone */
    loom_pathf(dir, sizeof dir, "%s/step_0000009", root);
    assert_int_equal(mkdir(dir, 0755), 0);
    loom_pathf(path, sizeof path, "%s/manifest.json", dir);
    tu_write_text(path, "stale");
    loom_pathf(path, sizeof path, "%s/x.bin.tmp.12345", dir);
    tu_write_text(path, "partial");
    loom_pathf(path, sizeof path, "%s/notes.txt", dir);
    tu_write_text(path, "user file");
    assert_int_equal(loom_ckpt_save(root, 9, &one, 1, NULL, 0, &err), 0);
    assert_true(loom_path_exists(path));
    loom_pathf(path, sizeof path, "%s/x.bin.tmp.12345", dir);
    assert_false(loom_path_exists(path));
    assert_int_equal(loom_ckpt_open(dir, &c, &err), 0);
    assert_int_equal(loom_ckpt_step(c), 9);
    loom_ckpt_close(c);
    loom_pathf(path, sizeof path, "%s/latest", root);
    memset(target, 0, sizeof target);
    assert_true(readlink(path, target, sizeof target - 1) > 0);
    assert_string_equal(target, "step_0000009");

    /* saving an older step keeps latest on the newest complete step */
    assert_int_equal(loom_ckpt_save(root, 4, &one, 1, NULL, 0, &err), 0);
    memset(target, 0, sizeof target);
    assert_true(readlink(path, target, sizeof target - 1) > 0);
    assert_string_equal(target, "step_0000009");

    /* bad file lists */
    loom_ckpt_file bad[] = {{"a/b", data, 3}};
    TU_ASSERT_ERR(loom_ckpt_save(root, 11, bad, 1, NULL, 0, TU_ERR), "'a/b'");
    bad[0].name = "..";
    TU_ASSERT_ERR(loom_ckpt_save(root, 11, bad, 1, NULL, 0, TU_ERR), "'..'");
    bad[0].name = "manifest.json";
    TU_ASSERT_ERR(loom_ckpt_save(root, 11, bad, 1, NULL, 0, TU_ERR), "reserved");
    loom_ckpt_file twice[] = {{"a", data, 3}, {"a", data, 1}};
    TU_ASSERT_ERR(loom_ckpt_save(root, 11, twice, 2, NULL, 0, TU_ERR), "twice");
    TU_ASSERT_ERR(loom_ckpt_save(root, -1, &one, 1, NULL, 0, TU_ERR), "negative");
    char tiny[4];
    TU_ASSERT_ERR(loom_ckpt_save(root, 11, &one, 1, tiny, sizeof tiny, TU_ERR), "does not fit");
    loom_pathf(path, sizeof path, "%s/step_0000011", root);
    assert_false(loom_path_exists(path)); /* rejected before writing anything */

    /* a large step number keeps its digits */
    assert_int_equal(loom_ckpt_save(root, 123456789, &one, 1, dir, sizeof dir, &err), 0);
    char want[1024];
    loom_pathf(want, sizeof want, "%s/step_123456789", root);
    assert_string_equal(dir, want);
    int64_t step;
    assert_int_equal(loom_ckpt_find_latest(root, path, sizeof path, &step, &err), 0);
    assert_int_equal(step, 123456789);
    assert_string_equal(path, want);
}

/* copies the regular files of directory from into a new directory to (cp -L of a step) */
static void copy_flat_dir(const char *from, const char *to) {
    assert_int_equal(mkdir(to, 0755), 0);
    DIR *d = opendir(from);
    assert_non_null(d);
    struct dirent *de;
    char a[1024], b[1024];
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        loom_pathf(a, sizeof a, "%s/%s", from, de->d_name);
        loom_pathf(b, sizeof b, "%s/%s", to, de->d_name);
        char *buf = NULL;
        size_t len = 0;
        loom_err err = {{0}};
        assert_int_equal(loom_read_file(a, 1 << 20, &buf, &len, &err), 0);
        FILE *f = fopen(b, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len, f), len);
        fclose(f);
        free(buf);
    }
    closedir(d);
}

/* latest that is a real directory (a run copied with links followed) does not fail saves: a
 * copy of a complete step is removed, anything else moved aside, and latest is a link again */
static void test_latest_is_a_directory(void **state) {
    (void)state;
    char root[512], path[1024], from[1024], target[256];
    tu_path(root, sizeof root, "copied/ckpt");
    save_step(root, 1, 0, NULL, 0);
    loom_pathf(path, sizeof path, "%s/latest", root);
    loom_pathf(from, sizeof from, "%s/step_0000001", root);
    assert_int_equal(unlink(path), 0);
    copy_flat_dir(from, path); /* latest = a copy of step 1 */
    save_step(root, 2, 1, NULL, 0);
    memset(target, 0, sizeof target);
    assert_true(readlink(path, target, sizeof target - 1) > 0);
    assert_string_equal(target, "step_0000002");
    save_step(root, 3, 0, NULL, 0); /* and every later save */
    memset(target, 0, sizeof target);
    assert_true(readlink(path, target, sizeof target - 1) > 0);
    assert_string_equal(target, "step_0000003");

    /* a directory that is not a copy of a step is kept, moved aside */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    loom_pathf(from, sizeof from, "%s/notes.txt", path);
    tu_write_text(from, "user file");
    save_step(root, 4, 1, NULL, 0);
    memset(target, 0, sizeof target);
    assert_true(readlink(path, target, sizeof target - 1) > 0);
    assert_string_equal(target, "step_0000004");
    loom_pathf(from, sizeof from, "%s/latest.moved.%d/notes.txt", root, (int)getpid());
    assert_true(loom_path_exists(from));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_open_latest),
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_corruption),
        cmocka_unit_test(test_hostile_manifest),
        cmocka_unit_test(test_overwrite_rules),
        cmocka_unit_test(test_latest_is_a_directory),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
