/* The cpu-guard backend (src/kernels/backend_guard.c, docs/engine.md "Memory through the
 * backend"):
 *  - every op of the table is wrapped (none left pointing at the cpu op, none NULL that the
 *    cpu table sets): an unwrapped op would run on closed memory;
 *  - a host read and a host write of its memory fault (SIGSEGV, in a child process), with the
 *    handler's line naming the address;
 *  - an op given a host pointer, and a copy given the wrong side or too many bytes, abort
 *    naming the op and the argument; a freed allocation is refused;
 *  - the copies and an op compute what the cpu table computes.
 * The whole model on cpu-guard against cpu (bitwise) is tests/unit/test_backend.c. */
#include "testutil.h"

#include <signal.h>
#include <sys/wait.h>

#include "loom/backend.h"

/* Runs fn in a child with stderr into a pipe; returns the wait status, the output in out. */
static int in_child(void (*fn)(void), char *out, size_t cap) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        /* cmocka catches SIGSEGV in its tests; the guard's handler and the default action
         * (the process ends on the signal) are what a program sees */
        signal(SIGSEGV, SIG_DFL);
        loom_guard_install_handler();
        fn();
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fd[0], out + n, cap - 1 - n)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fd[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return st;
}

static void test_every_op_wrapped(void **state) {
    (void)state;
    const loom_backend *cpu = loom_backend_cpu(), *g = loom_backend_guard();
    assert_string_equal(g->name, "cpu-guard");
    assert_ptr_equal(loom_backend_find("cpu-guard"), g);
    assert_int_equal(g->host_memory, 0);
    assert_int_equal(cpu->host_memory, 1);
    /* the table is `name`, `host_memory`, then function pointers only */
    typedef void (*fnp)(void);
    const size_t first = offsetof(loom_backend, mem_alloc);
    assert_int_equal((sizeof(loom_backend) - first) % sizeof(fnp), 0);
    int n = 0;
    for (size_t off = first; off < sizeof(loom_backend); off += sizeof(fnp)) {
        fnp a, b;
        memcpy(&a, (const char *)cpu + off, sizeof a);
        memcpy(&b, (const char *)g + off, sizeof b);
        if (!a) continue;
        if (!b || a == b) fail_msg("cpu-guard leaves the op at byte %zu of loom_backend unwrapped "
                                   "(rerun scripts/gen_guard_ops.py)", off);
        n++;
    }
    assert_true(n > 60);
}

static float *G_P; /* a guard allocation for the children */

static void host_read(void) {
    volatile float x = G_P[3];
    (void)x;
}
static void host_write(void) { G_P[5] = 1.0f; }

static void test_host_access_faults(void **state) {
    (void)state;
    const loom_backend *g = loom_backend_guard();
    G_P = g->mem_alloc(64 * sizeof(float), 0);
    assert_true(loom_guard_owns(G_P) && loom_guard_owns(G_P + 63));
    char out[8192];
    void (*fns[2])(void) = {host_read, host_write};
    for (int i = 0; i < 2; i++) {
        const int st = in_child(fns[i], out, sizeof out);
        assert_true(WIFSIGNALED(st));
        assert_int_equal(WTERMSIG(st), SIGSEGV);
        char want[96];
        snprintf(want, sizeof want, "cpu-guard: host access to device memory at %p",
                 (void *)(G_P + (i ? 5 : 3)));
        if (!strstr(out, want)) fail_msg("expected '%s' in:\n%s", want, out);
    }
    /* the same memory through the copies */
    float h[64], back[64];
    for (int i = 0; i < 64; i++) h[i] = (float)i * 0.5f;
    g->mem_h2d(G_P, h, sizeof h);
    g->mem_d2h(back, G_P, sizeof back);
    assert_memory_equal(h, back, sizeof h);
    g->mem_free(G_P);
}

static float *G_D;
static float G_HOST[16];
static void op_host_arg(void) {
    loom_backend_guard()->residual_forward(G_D, G_D, G_HOST, 16); /* b is host memory */
}
static void copy_too_long(void) {
    float big[64] = {0};
    loom_backend_guard()->mem_h2d(G_D, big, 64 * sizeof(float)); /* 16 floats allocated */
}
static void copy_wrong_side(void) {
    loom_backend_guard()->mem_d2h(G_D, G_D, 16 * sizeof(float)); /* dst is device memory */
}
static float *G_FREED;
static void op_freed(void) { loom_backend_guard()->scale_inplace(G_FREED, 4, 2.0f); }

static void test_refused(void **state) {
    (void)state;
    const loom_backend *g = loom_backend_guard();
    G_D = g->mem_alloc(16 * sizeof(float), 0);
    G_FREED = g->mem_alloc(16 * sizeof(float), 0);
    g->mem_free(G_FREED);
    assert_false(loom_guard_owns(G_FREED));
    assert_false(loom_guard_owns(G_HOST));
    struct {
        void (*fn)(void);
        const char *want;
    } cases[] = {
        {op_host_arg, "residual_forward: argument b = "},
        {copy_too_long, "mem_h2d: dst = "},
        {copy_wrong_side, "mem_d2h: dst = "},
        {op_freed, "scale_inplace: argument x = "},
    };
    char out[8192];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int st = in_child(cases[i].fn, out, sizeof out);
        assert_true(WIFSIGNALED(st));
        assert_int_equal(WTERMSIG(st), SIGABRT);
        if (!strstr(out, cases[i].want)) fail_msg("expected '%s' in:\n%s", cases[i].want, out);
    }
    g->mem_free(G_D);
}

static void test_ops_match_cpu(void **state) {
    (void)state;
    const loom_backend *g = loom_backend_guard(), *cpu = loom_backend_cpu();
    enum { N = 1000 };
    float a[N], b[N], want[N], got[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)loom_rng_normal(1, 1, (uint64_t)i);
        b[i] = (float)loom_rng_normal(1, 2, (uint64_t)i);
    }
    float *da = g->mem_alloc(sizeof a, 0), *db = g->mem_alloc(sizeof b, 0);
    double *ds = g->mem_alloc(sizeof(double), 0);
    g->mem_h2d(da, a, sizeof a);
    g->mem_h2d(db, b, sizeof b);
    /* residual, the bucket fold, the loss sum, a set and a strided copy */
    cpu->residual_forward(want, a, b, N);
    g->residual_forward(da, da, db, N);
    g->mem_d2h(got, da, sizeof got);
    assert_memory_equal(want, got, sizeof want);
    cpu->add_inplace(want, b, N);
    g->add_inplace(da, db, N);
    g->mem_d2h(got, da, sizeof got);
    assert_memory_equal(want, got, sizeof want);
    double sw = 0, sg = 0;
    cpu->sum_double(&sw, want, N);
    g->sum_double(ds, da, N);
    g->mem_d2h(&sg, ds, sizeof sg);
    assert_memory_equal(&sw, &sg, sizeof sw);
    double ref = 0;
    for (int i = 0; i < N; i++) ref += want[i]; /* index order, in double */
    assert_memory_equal(&sw, &ref, sizeof sw);
    g->mem_d2d_rows(db, 10 * sizeof(float), da + 3, 20 * sizeof(float), 4 * sizeof(float), 40);
    g->mem_d2h(got, db, sizeof got);
    for (int r = 0; r < 40; r++)
        assert_memory_equal(got + 10 * r, want + 3 + 20 * r, 4 * sizeof(float));
    g->mem_set(da, 0, sizeof a);
    g->mem_d2h(got, da, sizeof got);
    for (int i = 0; i < N; i++) assert_true(got[i] == 0.0f);
    g->mem_free(da);
    g->mem_free(db);
    g->mem_free(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_wrapped),
        cmocka_unit_test(test_host_access_faults),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_ops_match_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
