/* The peak FLOP/s for MFU: $LOOM_PEAK_FLOPS stops all measuring, a first use measures (on a busy
 * machine too: that figure is flagged and replaced by a later idle first use), `loom peak` keeps an idle measurement over a busy one, old or corrupt cache
 * entries are not trusted, nothing raises a cached value. The GEMM probe and the load average
 * are replaced by fakes (no test measures this machine's peak), except one short call of the
 * probe itself that checks it returns a plausible number. */
#include "testutil.h"

#include <jansson.h>

#include "loom/peak.h"
#include "loom/plan.h"

static char g_cache[512];
static int g_probe_calls;
static double g_load = 0.0;

static double fake_probe(int threads, double budget_s) {
    (void)budget_s;
    g_probe_calls++;
    return 1e10 * threads;
}

static double fake_load1(void) { return g_load; }

/* a fresh cache directory per test, fakes installed, no override from the environment */
static int setup(void **state) {
    if (tu_setup_tmpdir(state)) return -1;
    tu_path(g_cache, sizeof g_cache, "peak_flops.json");
    setenv("LOOM_CACHE_DIR", tu_dir, 1);
    unsetenv("LOOM_PEAK_FLOPS");
    loom_peak_set_hooks(fake_probe, fake_load1);
    g_probe_calls = 0;
    g_load = 0.0;
    return 0;
}

static int teardown(void **state) {
    loom_peak_set_hooks(NULL, NULL);
    return tu_teardown_tmpdir(state);
}

static json_t *load_cache(void) {
    json_error_t jerr;
    json_t *root = json_load_file(g_cache, 0, &jerr);
    if (!root) fail_msg("%s: %s", g_cache, jerr.text);
    assert_true(json_is_object(root));
    return root;
}

/* the only entry of the cache file */
static json_t *only_entry(json_t *root) {
    assert_int_equal(json_object_size(root), 1);
    const char *key;
    json_t *ent;
    json_object_foreach(root, key, ent) return ent;
    return NULL;
}

static void busy(void) { g_load = 1e6; } /* more than any machine's CPUs */

static void test_env_override_measures_nothing(void **state) {
    (void)state;
    busy();
    setenv("LOOM_PEAK_FLOPS", "1.5e12", 1);
    loom_err err = {{0}};
    loom_peak pk;
    assert_int_equal(loom_peak_get(2, 1, &pk, &err), 0);
    assert_true(pk.flops == 1.5e12);
    assert_int_equal(pk.source, LOOM_PEAK_ENV);
    g_load = 0.0; /* idle: still nothing measured or cached */
    assert_int_equal(loom_peak_get(2, 1, &pk, &err), 0);
    assert_true(pk.flops == 1.5e12);
    /* `loom peak` refuses while it is set */
    int stored = 1;
    assert_int_equal(loom_peak_measure(2, 0.1, &pk, &stored, &err), -1);
    assert_non_null(strstr(err.msg, "LOOM_PEAK_FLOPS"));
    assert_int_equal(stored, 0);
    assert_int_equal(g_probe_calls, 0);
    assert_false(loom_path_exists(g_cache));
}

static void test_env_bad_is_an_error(void **state) {
    (void)state;
    const char *bad[] = {"fast", "0", "-3e11", "1e11x", "inf", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("LOOM_PEAK_FLOPS", bad[i], 1);
        loom_err err = {{0}};
        loom_peak pk;
        assert_int_equal(loom_peak_get(1, 1, &pk, &err), -1);
        assert_non_null(strstr(err.msg, "LOOM_PEAK_FLOPS"));
        assert_non_null(strstr(err.msg, bad[i]));
    }
    assert_int_equal(g_probe_calls, 0);
}

static void test_first_use_idle_measures_once(void **state) {
    (void)state;
    g_load = 0.2;
    loom_err err = {{0}};
    loom_peak pk;
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0);
    assert_int_equal(pk.source, LOOM_PEAK_MEASURED);
    assert_true(pk.flops == 1e10);
    assert_int_equal(pk.idle, 1);
    assert_string_equal(pk.note, "");
    assert_int_equal(g_probe_calls, 1);
    json_t *root = load_cache();
    json_t *ent = only_entry(root);
    assert_true(json_number_value(json_object_get(ent, "flops")) == 1e10);
    assert_true(json_is_true(json_object_get(ent, "idle")));
    assert_true(json_number_value(json_object_get(ent, "load1")) == 0.2);
    assert_int_equal(json_integer_value(json_object_get(ent, "threads")), 1);
    json_decref(root);
    /* later uses come from the cache, busy or not */
    busy();
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0);
    assert_int_equal(pk.source, LOOM_PEAK_CACHE);
    assert_true(pk.flops == 1e10);
    assert_int_equal(g_probe_calls, 1);
}

/* a first use measures even on a busy machine (so every run reports MFU), flags the figure,
 * and an idle first use later replaces it; with may_measure 0 (the multi-rank trainer, which
 * measures on all ranks itself) nothing is measured */
static void test_first_use_busy_measures_flagged(void **state) {
    (void)state;
    loom_err err = {{0}};
    loom_peak pk;
    assert_int_equal(loom_peak_get(1, 0, &pk, &err), 0);
    assert_int_equal(pk.source, LOOM_PEAK_NONE);
    assert_true(pk.flops == 0);
    assert_non_null(strstr(pk.note, "loom peak"));
    assert_int_equal(g_probe_calls, 0);
    assert_false(loom_path_exists(g_cache));
    busy();
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0);
    assert_int_equal(pk.source, LOOM_PEAK_MEASURED);
    assert_true(pk.flops == 1e10);
    assert_int_equal(pk.idle, 0);
    assert_non_null(strstr(pk.note, "busy"));
    assert_int_equal(g_probe_calls, 1);
    json_t *root = load_cache();
    assert_true(json_is_false(json_object_get(only_entry(root), "idle")));
    json_decref(root);
    /* still busy: the flagged figure is used, not measured again */
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0);
    assert_int_equal(pk.source, LOOM_PEAK_CACHE);
    assert_non_null(strstr(pk.note, "busy machine"));
    assert_int_equal(g_probe_calls, 1);
    /* a multi-rank run uses it too */
    assert_int_equal(loom_peak_get(1, 0, &pk, &err), 0);
    assert_int_equal(pk.source, LOOM_PEAK_CACHE);
    /* idle now: measured again, replacing it */
    g_load = 0.0;
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0);
    assert_int_equal(pk.source, LOOM_PEAK_MEASURED);
    assert_int_equal(pk.idle, 1);
    assert_string_equal(pk.note, "");
    assert_int_equal(g_probe_calls, 2);
    root = load_cache();
    assert_true(json_is_true(json_object_get(only_entry(root), "idle")));
    json_decref(root);
    /* loom_peak_store (the multi-rank trainer's) never replaces an idle figure by a busy one */
    loom_peak busy_pk = pk;
    busy_pk.idle = 0;
    busy_pk.flops = 5e9;
    int stored = 1;
    assert_int_equal(loom_peak_store(&busy_pk, &stored, &err), 0);
    assert_int_equal(stored, 0);
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0);
    assert_true(pk.flops == 1e10);
    busy_pk.idle = 1;
    assert_int_equal(loom_peak_store(&busy_pk, &stored, &err), 0);
    assert_int_equal(stored, 1);
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0);
    assert_true(pk.flops == 5e9);
}

static void test_loom_peak_idle_beats_busy(void **state) {
    (void)state;
    loom_err err = {{0}};
    loom_peak pk;
    int stored;
    /* busy, nothing cached yet: stored, with a note */
    busy();
    assert_int_equal(loom_peak_measure(1, 0.1, &pk, &stored, &err), 0);
    assert_int_equal(stored, 1);
    assert_int_equal(pk.idle, 0);
    assert_non_null(strstr(pk.note, "busy"));
    loom_peak got;
    assert_int_equal(loom_peak_get(1, 1, &got, &err), 0);
    assert_int_equal(got.source, LOOM_PEAK_CACHE);
    assert_int_equal(got.idle, 0);
    assert_non_null(strstr(got.note, "busy machine")); /* every use says it is suspect */
    /* idle replaces busy */
    g_load = 0.0;
    assert_int_equal(loom_peak_measure(2, 0.1, &pk, &stored, &err), 0);
    assert_int_equal(stored, 1);
    assert_int_equal(loom_peak_measure(1, 0.1, &pk, &stored, &err), 0);
    assert_int_equal(stored, 1);
    assert_int_equal(loom_peak_get(1, 1, &got, &err), 0);
    assert_int_equal(got.idle, 1);
    assert_string_equal(got.note, "");
    /* busy does not replace idle */
    busy();
    json_t *before = load_cache();
    assert_int_equal(loom_peak_measure(1, 0.1, &pk, &stored, &err), 0);
    assert_int_equal(stored, 0);
    assert_non_null(strstr(pk.note, "not stored"));
    json_t *after = load_cache();
    assert_true(json_equal(before, after));
    assert_int_equal(json_object_size(after), 2); /* keyed by threads */
    json_decref(before);
    json_decref(after);
    assert_int_equal(g_probe_calls, 4);
}

/* entries from older versions (no "idle": they could have been raised by training
 * throughput) and corrupt files are not used */
static void test_untrusted_cache(void **state) {
    (void)state;
    loom_err err = {{0}};
    loom_peak pk;
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0); /* writes the entry for this machine */
    json_t *root = load_cache();
    json_t *ent = only_entry(root);
    json_object_set_new(ent, "flops", json_real(4.25e11));
    json_object_del(ent, "idle");
    assert_int_equal(json_dump_file(root, g_cache, 0), 0);
    json_decref(root);
    assert_int_equal(loom_peak_get(1, 0, &pk, &err), 0); /* not used */
    assert_int_equal(pk.source, LOOM_PEAK_NONE);
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0); /* measured again */
    assert_int_equal(pk.source, LOOM_PEAK_MEASURED);
    assert_true(pk.flops == 1e10);

    const char *junk = "{\"not\": json at all";
    assert_int_equal(loom_write_file_atomic(g_cache, junk, strlen(junk), &err), 0);
    assert_int_equal(loom_peak_get(1, 1, &pk, &err), 0);
    assert_int_equal(pk.source, LOOM_PEAK_MEASURED);
    root = load_cache(); /* rewritten as valid JSON */
    json_decref(root);
    assert_int_equal(g_probe_calls, 3);
}

static void test_idle_rule(void **state) {
    (void)state;
    double l;
    int ncpu;
    g_load = 0.0;
    assert_int_equal(loom_machine_idle(1, &l, &ncpu), 1);
    assert_true(ncpu >= 1);
    g_load = (double)ncpu - 1 + 0.5; /* exactly one core left for one thread */
    assert_int_equal(loom_machine_idle(1, &l, &ncpu), 1);
    g_load = (double)ncpu - 1 + 0.6;
    assert_int_equal(loom_machine_idle(1, &l, &ncpu), 0);
    g_load = -1.0; /* unknown */
    assert_int_equal(loom_machine_idle(1, &l, &ncpu), 0);
}

/* the real GEMM probe runs and gives a plausible number (not cached, not used) */
static void test_probe_plausible(void **state) {
    (void)state;
    double v = loom_peak_probe(1, 0.05);
    if (!(v >= 1e8 && v <= 1e13)) fail_msg("implausible probe result %g FLOP/s", v);
    assert_false(loom_path_exists(g_cache));
}

/* MFU on a GPU: the hardware file whose own cuda_names list the device (data/hardware) */
static void test_gpu_hardware_by_device_name(void **state) {
    (void)state;
    loom_plan_hw hw;
    char path[4400];
    loom_err err;
    assert_int_equal(loom_plan_hw_for_device("NVIDIA H200", &hw, path, sizeof path, &err), 0);
    assert_non_null(strstr(path, "h200-sxm.yaml"));
    assert_true(hw.peak_bf16 == 989.5e12 && hw.peak_fp32 == 494.7e12);
    assert_true(hw.peak_fp32_simt == 66.9e12); /* inherited from h100-sxm with the compute */
    assert_int_equal(loom_plan_hw_for_device("NVIDIA H100 80GB HBM3", &hw, path, sizeof path, &err), 0);
    assert_non_null(strstr(path, "h100-sxm.yaml")); /* not grand-teton's: names are not inherited */
    assert_int_equal(loom_plan_hw_for_device("NVIDIA A100-SXM4-40GB", &hw, path, sizeof path, &err), 0);
    assert_true(hw.peak_bf16 == 312e12 && hw.peak_fp32_simt == 19.5e12);
    assert_int_equal(loom_plan_hw_for_device("NVIDIA B200", &hw, path, sizeof path, &err), 0);
    assert_true(hw.peak_bf16 == 2250e12);
    /* a device no file names (nor a prefix of a named one) */
    assert_int_equal(loom_plan_hw_for_device("NVIDIA H200 NVL", &hw, path, sizeof path, &err), 1);
    assert_int_equal(loom_plan_hw_for_device("NVIDIA", &hw, path, sizeof path, &err), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_env_override_measures_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_env_bad_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_use_idle_measures_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_use_busy_measures_flagged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loom_peak_idle_beats_busy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_untrusted_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_probe_plausible, setup, teardown),
        cmocka_unit_test(test_gpu_hardware_by_device_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
