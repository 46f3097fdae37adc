/* The shared progress line (include/loom/progress.h, docs/observability.md "Progress"):
 *  - loom_progress_eta: the ETA from the fraction done (s, m, h forms), the elapsed time when
 *    the total is unknown or nothing is done;
 *  - not a terminal (stderr is a pipe or file under ctest): no unforced line before
 *    plain_every_s has passed, and none at all with plain_every_s <= 0; forced lines draw. */
#include "testutil.h"

#include "loom/progress.h"

static void test_eta(void **state) {
    (void)state;
    char b[48];
    loom_progress_eta(b, sizeof b, 10, 1, 3); /* 10 s for a third: 20 s left */
    assert_string_equal(b, "eta 20s");
    loom_progress_eta(b, sizeof b, 60, 1, 3);
    assert_string_equal(b, "eta 2m00s");
    loom_progress_eta(b, sizeof b, 3600, 1, 2);
    assert_string_equal(b, "eta 1h00m");
    loom_progress_eta(b, sizeof b, 5, 7, 7);
    assert_string_equal(b, "eta 0s");
    loom_progress_eta(b, sizeof b, 75, 4, 0); /* no total */
    assert_string_equal(b, "elapsed 1m15s");
    loom_progress_eta(b, sizeof b, 3, 0, 10); /* nothing done yet */
    assert_string_equal(b, "elapsed 3s");
}

static void test_plain_rate(void **state) {
    (void)state;
    loom_progress p;
    loom_progress_init(&p, 0);
    p.tty = 0; /* whatever ctest's stderr is */
    assert_int_equal(loom_progress_due(&p), 0);
    assert_int_equal(loom_progress_show(&p, 0, "never %d", 1), 0);
    assert_int_equal(loom_progress_show(&p, 1, "progress test: a forced plain line"), 1);
    loom_progress_init(&p, 3600);
    p.tty = 0;
    assert_int_equal(loom_progress_due(&p), 0); /* the first waits plain_every_s too */
    p.t0 -= 3601;
    assert_int_equal(loom_progress_due(&p), 1);
    /* a terminal: the first line is due at once, the next after LOOM_PROGRESS_TTY_S */
    loom_progress_init(&p, 0);
    p.tty = 1;
    assert_int_equal(loom_progress_due(&p), 1);
    p.last = 1e300;
    assert_int_equal(loom_progress_due(&p), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eta),
        cmocka_unit_test(test_plain_rate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
