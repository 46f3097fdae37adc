/* metrics.jsonl: values that are not finite never abort (written as null, which JSON can hold),
 * and a resumed run's file is cut to one history up to the resumed step: no row after it, one
 * row per step (the last written), no line cut short. Runs under ASan/UBSan. */
#include "testutil.h"

#include <math.h>

#include "loom/metrics.h"

static void test_not_finite(void **state) {
    (void)state;
    char path[512];
    tu_path(path, sizeof path, "nan.jsonl");
    loom_metrics *m = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_metrics_open(path, 0, &m, &err), 0);
    const double v[3] = {1.5, NAN, -INFINITY};
    loom_metrics_begin(m);
    loom_metrics_int(m, "step", 1);
    loom_metrics_real(m, "loss", NAN);
    loom_metrics_real(m, "grad_norm", INFINITY);
    loom_metrics_reals(m, "comm_s", v, 3, 1);
    assert_int_equal(loom_metrics_end(m, &err), 0);
    assert_int_equal(loom_metrics_sync(m, &err), 0);
    loom_metrics_close(m);
    size_t n;
    char *text = tu_read_file(path, &n);
    assert_string_equal(text, "{\"step\":1,\"loss\":null,\"grad_norm\":null,\"comm_s\":[1.5,null,null]}\n");
    free(text);
}

/* a row of step s with a tag, as an earlier run would have written it */
static void row(char *buf, size_t size, size_t *len, int step, const char *tag) {
    *len += (size_t)snprintf(buf + *len, size - *len, "{\"step\":%d,\"loss\":1,\"tag\":\"%s\"}\n", step, tag);
}

static void test_resume_history(void **state) {
    (void)state;
    char path[512], buf[4096];
    size_t len = 0;
    tu_path(path, sizeof path, "hist.jsonl");
    /* run a: steps 1..8; run b resumed from 4 without cutting the file: 5..9; then a write cut
     * short, and a row without a step (kept: not a step's row) */
    for (int s = 1; s <= 8; s++) row(buf, sizeof buf, &len, s, "a");
    len += (size_t)snprintf(buf + len, sizeof buf - len, "{\"note\":\"kept\"}\n");
    for (int s = 5; s <= 9; s++) row(buf, sizeof buf, &len, s, "b");
    len += (size_t)snprintf(buf + len, sizeof buf - len, "{\"step\":10,\"lo");
    tu_write_file(path, buf, len);

    loom_metrics *m = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_metrics_open(path, 7, &m, &err), 0); /* resumed from step 7 */
    loom_metrics_begin(m);
    loom_metrics_int(m, "step", 8);
    assert_int_equal(loom_metrics_end(m, &err), 0);
    loom_metrics_close(m);

    char want[4096];
    size_t wl = 0;
    for (int s = 1; s <= 4; s++) row(want, sizeof want, &wl, s, "a");
    wl += (size_t)snprintf(want + wl, sizeof want - wl, "{\"note\":\"kept\"}\n");
    for (int s = 5; s <= 7; s++) row(want, sizeof want, &wl, s, "b");
    wl += (size_t)snprintf(want + wl, sizeof want - wl, "{\"step\":8}\n");
    size_t n;
    char *text = tu_read_file(path, &n);
    assert_string_equal(text, want);
    free(text);

    /* a file whose last row lacks its newline but parses: cut (it was a write cut short) */
    tu_write_text(path, "{\"step\":1}\n{\"step\":2}");
    assert_int_equal(loom_metrics_open(path, 5, &m, &err), 0);
    loom_metrics_begin(m);
    loom_metrics_int(m, "step", 6);
    assert_int_equal(loom_metrics_end(m, &err), 0);
    loom_metrics_close(m);
    text = tu_read_file(path, &n);
    assert_string_equal(text, "{\"step\":1}\n{\"step\":6}\n");
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_finite),
        cmocka_unit_test(test_resume_history),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
