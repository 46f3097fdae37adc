/* SIGINT and SIGTERM on loom's signal thread (include/loom/signals.h):
 *  - after loom_signals_init both are blocked in the calling thread and in every thread it
 *    starts later (as OpenMP's, oneDNN's, libmicrohttpd's are);
 *  - a SIGTERM sent to the process reaches the catcher once, on a thread that is neither the
 *    main thread nor a worker that keeps computing meanwhile;
 *  - loom_signals_catch(NULL) returns only after a catcher that is running has returned, so
 *    its context may be freed;
 *  - a child process gets the mask and dispositions loom started with (loom_signals_child in a
 *    forked child; the sets posix_spawn takes), so it can be stopped with SIGTERM;
 *  - without a catcher the default action ends the process by the signal (a forked child of a
 *    process that never initialized: it initializes and dies by SIGTERM, status signalled). */
#include "testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

#include "loom/signals.h"

static int blocked_here(void) {
    sigset_t m;
    pthread_sigmask(SIG_SETMASK, NULL, &m);
    return sigismember(&m, SIGINT) && sigismember(&m, SIGTERM);
}

static void *report_mask(void *arg) {
    *(int *)arg = blocked_here();
    return NULL;
}

typedef struct {
    atomic_int calls, sig, on_main, done;
    pthread_t main;
    int sleep_ms;
} catch_ctx;

static void catcher(void *ctx, int sig) {
    catch_ctx *c = ctx;
    atomic_store(&c->sig, sig);
    atomic_store(&c->on_main, pthread_equal(pthread_self(), c->main));
    if (c->sleep_ms) usleep((useconds_t)c->sleep_ms * 1000);
    atomic_fetch_add(&c->calls, 1);
    atomic_store(&c->done, 1);
}

static void wait_calls(catch_ctx *c, int n) {
    for (int i = 0; i < 500 && atomic_load(&c->calls) < n; i++) usleep(10000);
}

static void test_masks(void **state) {
    (void)state;
    loom_err err;
    assert_int_equal(loom_signals_init(&err), 0);
    assert_int_equal(loom_signals_init(&err), 0); /* idempotent */
    assert_true(loom_signals_active());
    assert_true(blocked_here());
    pthread_t t;
    int child_blocked = 0;
    assert_int_equal(pthread_create(&t, NULL, report_mask, &child_blocked), 0);
    pthread_join(t, NULL);
    assert_true(child_blocked);
}

static void test_catch(void **state) {
    (void)state;
    catch_ctx c = {0};
    c.main = pthread_self();
    loom_signals_catch(catcher, &c);
    assert_int_equal(kill(getpid(), SIGTERM), 0);
    wait_calls(&c, 1);
    assert_int_equal(atomic_load(&c.calls), 1);
    assert_int_equal(atomic_load(&c.sig), SIGTERM);
    assert_false(atomic_load(&c.on_main));
    assert_int_equal(kill(getpid(), SIGINT), 0);
    wait_calls(&c, 2);
    assert_int_equal(atomic_load(&c.sig), SIGINT);
    loom_signals_catch(NULL, NULL);
}

static void test_catch_null_waits(void **state) {
    (void)state;
    catch_ctx c = {0};
    c.main = pthread_self();
    c.sleep_ms = 300;
    loom_signals_catch(catcher, &c);
    assert_int_equal(kill(getpid(), SIGTERM), 0);
    for (int i = 0; i < 500 && !atomic_load(&c.sig); i++) usleep(1000); /* it has started */
    assert_int_equal(atomic_load(&c.sig), SIGTERM);
    loom_signals_catch(NULL, NULL);
    assert_true(atomic_load(&c.done)); /* returned after the catcher did */
}

static void test_child_masks(void **state) {
    (void)state;
    sigset_t mask, dfl;
    loom_signals_child_sets(&mask, &dfl);
    assert_false(sigismember(&mask, SIGTERM));
    assert_false(sigismember(&mask, SIGINT));
    assert_true(sigismember(&dfl, SIGTERM));
    assert_true(sigismember(&dfl, SIGINT));
    /* a forked child that execs sleep: SIGTERM ends it */
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        loom_signals_child();
        execlp("sleep", "sleep", "30", (char *)NULL);
        _exit(127);
    }
    usleep(100000);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGTERM);
}

static void test_default_action(void **state) {
    (void)state;
    /* a fresh process (exec of this binary's sleeper mode) initializes, then is sent SIGTERM
     * with no catcher: it ends by the signal */
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        loom_signals_child();
        execl("/proc/self/exe", "test_signals", "--sleeper", (char *)NULL);
        _exit(127);
    }
    usleep(300000);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGTERM);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--sleeper")) {
        loom_err err;
        if (loom_signals_init(&err)) return 2;
        for (int i = 0; i < 300; i++) usleep(100000); /* 30 s unless a signal ends it */
        return 3;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masks),           cmocka_unit_test(test_catch),
        cmocka_unit_test(test_catch_null_waits), cmocka_unit_test(test_child_masks),
        cmocka_unit_test(test_default_action),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
