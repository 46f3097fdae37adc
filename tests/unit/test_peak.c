/* Peak FLOP/s probe: plausible value, cached per (host, cpu, threads), corrupt cache
 * recovered from, $LOOM_PEAK_FLOPS override. */
#include "testutil.h"

#include <jansson.h>

#include "loom/peak.h"

static char g_cache[512];

/* tu_dir is the cache directory; no override from the environment. */
static int setup_dir(void **state) {
    if (tu_setup_tmpdir(state)) return -1;
    tu_path(g_cache, sizeof g_cache, "peak_flops.json");
    setenv("LOOM_CACHE_DIR", tu_dir, 1);
    unsetenv("LOOM_PEAK_FLOPS");
    return 0;
}

static json_t *load_cache(void) {
    json_error_t jerr;
    json_t *root = json_load_file(g_cache, 0, &jerr);
    if (!root) fail_msg("%s: %s", g_cache, jerr.text);
    assert_true(json_is_object(root));
    return root;
}

static void assert_plausible(double v) {
    if (!(v >= 1e9 && v <= 1e13)) fail_msg("implausible peak FLOP/s %g", v);
}

/* Sets every entry's "flops" in the cache file to v. */
static void rewrite_cache_flops(double v) {
    json_t *root = load_cache();
    const char *k;
    json_t *ent;
    json_object_foreach(root, k, ent) json_object_set_new(ent, "flops", json_real(v));
    assert_int_equal(json_dump_file(root, g_cache, 0), 0);
    json_decref(root);
}

static void test_measure_and_cache(void **state) {
    (void)state;
    double v1 = loom_peak_flops(1);
    assert_plausible(v1);
    assert_true(loom_path_exists(g_cache));
    json_t *root = load_cache();
    assert_int_equal(json_object_size(root), 1);
    const char *key;
    json_t *ent;
    json_object_foreach(root, key, ent) {
        assert_true(json_number_value(json_object_get(ent, "flops")) == v1);
        assert_int_equal(json_integer_value(json_object_get(ent, "threads")), 1);
        assert_non_null(strstr(key, "|1"));
    }
    json_decref(root);

    double t0 = loom_now();
    double v2 = loom_peak_flops(1);
    double dt = loom_now() - t0;
    if (dt >= 0.05) fail_msg("second call took %.3f s: not served from the cache", dt);
    assert_true(v2 == v1);

    /* the value really comes from the file */
    rewrite_cache_flops(4.25e11);
    assert_true(loom_peak_flops(1) == 4.25e11);
}

static void test_keyed_by_threads(void **state) {
    (void)state;
    rewrite_cache_flops(4.25e11);
    double v = loom_peak_flops(2); /* not cached yet: measured */
    assert_plausible(v);
    assert_true(v != 4.25e11);
    json_t *root = load_cache();
    assert_int_equal(json_object_size(root), 2);
    json_decref(root);
    assert_true(loom_peak_flops(1) == 4.25e11);
}

static void test_corrupt_cache(void **state) {
    (void)state;
    loom_err err;
    const char *junk = "{\"not\": json at all";
    assert_int_equal(loom_write_file_atomic(g_cache, junk, strlen(junk), &err), 0);
    double v = loom_peak_flops(1);
    assert_plausible(v);
    json_t *root = load_cache(); /* rewritten as valid JSON */
    assert_int_equal(json_object_size(root), 1);
    json_decref(root);
    double t0 = loom_now();
    assert_true(loom_peak_flops(1) == v);
    assert_true(loom_now() - t0 < 0.05);

    /* a well-formed file with a bad entry is re-measured too */
    const char *bad = "[1, 2, 3]";
    assert_int_equal(loom_write_file_atomic(g_cache, bad, strlen(bad), &err), 0);
    assert_plausible(loom_peak_flops(1));
    root = load_cache();
    assert_int_equal(json_object_size(root), 1);
    json_decref(root);
}

static void test_env_override(void **state) {
    (void)state;
    setenv("LOOM_PEAK_FLOPS", "1.5e12", 1);
    assert_true(loom_peak_flops(1) == 1.5e12);
    setenv("LOOM_PEAK_FLOPS", "fast", 1); /* ignored with a warning: falls back to the cache */
    assert_plausible(loom_peak_flops(1));
    unsetenv("LOOM_PEAK_FLOPS");
}

/* a run that achieved more than the cached peak raises the cache; a lower one does not */
static void test_raise(void **state) {
    (void)state;
    const double cached = loom_peak_flops(1);
    assert_true(loom_peak_flops_raise(1, cached * 0.5) == cached);
    assert_true(loom_peak_flops(1) == cached);
    const double higher = cached * 3.0;
    assert_true(loom_peak_flops_raise(1, higher) == higher);
    assert_true(loom_peak_flops(1) == higher); /* persisted */
    assert_true(loom_peak_flops_raise(1, -1.0) == higher); /* nonsense is ignored */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_measure_and_cache),
        cmocka_unit_test(test_keyed_by_threads),
        cmocka_unit_test(test_corrupt_cache),
        cmocka_unit_test(test_env_override),
        cmocka_unit_test(test_raise),
    };
    return cmocka_run_group_tests(tests, setup_dir, tu_teardown_tmpdir);
}
