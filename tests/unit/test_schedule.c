/* Learning-rate schedules against closed forms computed here in double. (Gradient clipping is
 * the DP engine's: tests/reference/test_engine.py checks it against PyTorch.) */
#include "testutil.h"

#include <math.h>

#include "loom/schedule.h"

static void test_cosine(void **state) {
    (void)state;
    loom_schedule s = {LOOM_SCHED_COSINE, 1e-3, 1e-4, 10, 110, 0.2};
    for (int64_t t = 0; t < 10; t++) assert_float_equal(loom_schedule_lr(&s, t), 1e-3 * (t + 1) / 10.0, 1e-15);
    assert_float_equal(loom_schedule_lr(&s, 10), 1e-3, 1e-15);  /* peak right after warmup */
    assert_float_equal(loom_schedule_lr(&s, 60), 5.5e-4, 1e-12); /* half way: the midpoint */
    for (int64_t t = 10; t < 110; t++) {
        const double p = (double)(t - 10) / 100.0;
        const double want = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + cos(M_PI * p));
        assert_float_equal(loom_schedule_lr(&s, t), want, 1e-15);
        assert_true(loom_schedule_lr(&s, t + 1) <= loom_schedule_lr(&s, t) + 1e-18);
    }
    assert_float_equal(loom_schedule_lr(&s, 110), 1e-4, 1e-15);
    assert_float_equal(loom_schedule_lr(&s, 500), 1e-4, 1e-15);
}

static void test_wsd(void **state) {
    (void)state;
    /* warmup 10, then 100 steps: 80 stable, 20 decaying linearly to min_lr */
    loom_schedule s = {LOOM_SCHED_WSD, 2e-3, 0.0, 10, 110, 0.2};
    assert_float_equal(loom_schedule_lr(&s, 4), 2e-3 * 5 / 10.0, 1e-15);
    for (int64_t t = 10; t < 90; t++) assert_float_equal(loom_schedule_lr(&s, t), 2e-3, 1e-15);
    for (int64_t t = 90; t < 110; t++)
        assert_float_equal(loom_schedule_lr(&s, t), 2e-3 * (1.0 - (double)(t - 90) / 20.0), 1e-15);
    assert_float_equal(loom_schedule_lr(&s, 110), 0.0, 1e-15);
}

static void test_constant(void **state) {
    (void)state;
    loom_schedule s = {LOOM_SCHED_CONSTANT, 3e-4, 0.0, 0, 50, 0.0};
    for (int64_t t = 0; t < 200; t += 7) assert_float_equal(loom_schedule_lr(&s, t), 3e-4, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cosine),
        cmocka_unit_test(test_wsd),
        cmocka_unit_test(test_constant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
