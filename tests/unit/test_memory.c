/* The trainer's memory estimate (src/train/train_memory.c): the layout-only model and the
 * DP estimate equal what the real model and loom_dp_create allocate, at every ZeRO stage; the
 * memory limits are read from /proc/meminfo and cgroup v2 / v1 files (a fake tree here). */
#include "testutil.h"

#include "loom/comm.h"
#include "loom/model.h"
#include "loom/parallel.h"
#include "train/trainer_internal.h"

static const loom_model_config GPT2 = {
    .flavor = LOOM_FLAVOR_GPT2, .vocab_size = 64, .max_seq_len = 8, .n_layer = 3, .n_head = 2,
    .n_kv_head = 2, .d_model = 16, .d_ff = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
    .init_std = 0.02f};

static void check_estimate(const loom_model_config *cfg, int zero) {
    loom_err err = {{0}};
    loom_mesh_spec spec;
    loom_mesh_spec_default(&spec);
    loom_mesh *mesh = NULL;
    loom_model *m = NULL, *layout = NULL;
    loom_dp *dp = NULL;
    assert_int_equal(loom_mesh_create(&spec, NULL, &mesh, &err), 0);
    assert_int_equal(loom_model_create_ex(cfg, 2, 8, 0, &m, &err), 0);
    assert_int_equal(loom_dp_create(m, mesh, zero, 1, 0.9f, 0.95f, 1e-8f, 0.1f, &dp, &err), 0);
    assert_int_equal(loom_model_create_layout(cfg, 2, 8, &layout, &err), 0);
    assert_int_equal(loom_model_num_params(layout), loom_model_num_params(m));
    /* the layout's activations are what the real model's arena holds (it owns no params) */
    assert_true(loom_model_activation_bytes(layout) >= loom_model_arena_bytes(m));
    assert_true(loom_model_activation_bytes(layout) <
                loom_model_arena_bytes(m) + 2 * 2 * 8 * 4 + 2 * 8 * 8 * 4 + 1);
    loom_dp_memory real, est;
    loom_dp_memory_usage(dp, &real);
    loom_dp_memory_estimate(layout, 1, 0, zero, &est);
    assert_int_equal(est.param_bytes, real.param_bytes);
    assert_int_equal(est.grad_bytes, real.grad_bytes);
    assert_int_equal(est.optim_bytes, real.optim_bytes);
    /* one process: the reduced gradients are the gradient buffer itself at zero 0/1 */
    if (zero < 2)
        assert_int_equal(real.grad_bytes, sizeof(float) * loom_model_num_params(m));
    /* parameters + AdamW moments at least: 3 x 4 bytes per parameter */
    assert_true(est.param_bytes + est.optim_bytes >= 12 * loom_model_num_params(m));
    /* half of the dp ranks hold about half the moments at zero >= 1 */
    loom_dp_memory half;
    loom_dp_memory_estimate(layout, 2, 1, zero, &half);
    if (zero >= 1) assert_true(half.optim_bytes < est.optim_bytes * 6 / 10);
    else assert_int_equal(half.optim_bytes, est.optim_bytes);
    loom_model_free(layout);
    loom_dp_free(dp);
    loom_model_free(m);
    loom_mesh_free(mesh);
}

static void test_estimate_equals_allocation(void **state) {
    (void)state;
    loom_model_config llama = GPT2;
    llama.flavor = LOOM_FLAVOR_LLAMA;
    llama.n_kv_head = 1;
    for (int zero = 0; zero <= 3; zero++) {
        check_estimate(&GPT2, zero);
        check_estimate(&llama, zero);
    }
}

/* a huge model's layout is built without allocating its arenas */
static void test_layout_allocates_nothing_big(void **state) {
    (void)state;
    loom_model_config big = GPT2;
    big.d_model = 4096;
    big.n_head = 32;
    big.n_kv_head = 32;
    big.d_ff = 4 * 4096;
    big.n_layer = 4096;
    big.max_seq_len = 256;
    loom_model *layout = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_model_create_layout(&big, 8, 256, &layout, &err), 0);
    assert_true(loom_model_num_params(layout) > (size_t)800e9);
    loom_dp_memory est;
    loom_dp_memory_estimate(layout, 1, 0, 0, &est);
    assert_true((double)est.param_bytes > 3.2e12);
    loom_model_free(layout);
}

static void put(const char *rel, const char *text) {
    char p[512];
    tu_path(p, sizeof p, rel);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", p);
    *strrchr(dir, '/') = 0;
    loom_err err = {{0}};
    assert_int_equal(loom_mkdirs(dir, &err), 0);
    tu_write_text(p, text);
}

static void test_limits(void **state) {
    (void)state;
    uint64_t avail, cg;
    /* cgroup v2 with a limit on the process's own group */
    put("v2/proc/meminfo", "MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable:     2048 kB\n");
    put("v2/proc/self/cgroup", "0::/user.slice/job\n");
    put("v2/sys/fs/cgroup/user.slice/job/memory.max", "1048576\n");
    char root[512];
    tu_path(root, sizeof root, "v2");
    assert_int_equal(loom_memory_limits(root, &avail, &cg), 0);
    assert_int_equal(avail, 2048 * 1024);
    assert_int_equal(cg, 1048576);
    /* "max" is no limit; the mount root's limit applies inside a container */
    put("v2/sys/fs/cgroup/user.slice/job/memory.max", "max\n");
    assert_int_equal(loom_memory_limits(root, &avail, &cg), 0);
    assert_int_equal(cg, 0);
    put("v2/sys/fs/cgroup/memory.max", "4096\n");
    assert_int_equal(loom_memory_limits(root, &avail, &cg), 0);
    assert_int_equal(cg, 4096);
    /* cgroup v1 (a hybrid mount), and its "no limit" value */
    put("v1/proc/meminfo", "MemAvailable: 10 kB\n");
    put("v1/proc/self/cgroup", "5:cpu,cpuacct:/\n4:memory:/slurm/job_7\n0::/\n");
    put("v1/sys/fs/cgroup/memory/slurm/job_7/memory.limit_in_bytes", "536870912\n");
    tu_path(root, sizeof root, "v1");
    assert_int_equal(loom_memory_limits(root, &avail, &cg), 0);
    assert_int_equal(avail, 10240);
    assert_int_equal(cg, 536870912);
    put("v1/sys/fs/cgroup/memory/slurm/job_7/memory.limit_in_bytes", "9223372036854771712\n");
    assert_int_equal(loom_memory_limits(root, &avail, &cg), 0);
    assert_int_equal(cg, 0);
    /* nothing known */
    tu_path(root, sizeof root, "none");
    assert_int_equal(loom_memory_limits(root, &avail, &cg), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_estimate_equals_allocation),
        cmocka_unit_test(test_layout_allocates_nothing_big),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
