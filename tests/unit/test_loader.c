/* The loader: sample definition, every sample once per epoch, seeded shuffles, exact resume. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "loom/data.h"

#define T 16
/* shard sizes: samples per shard = (n-1)/T when n >= T+1: 62, 0, 2, 0, 32 -> 96 */
static const uint64_t SIZES[] = {1000, 10, 37, 16, 517};
#define N_SHARDS 5
#define N_SAMPLES 96

static char g_dir[256];
static loom_dataset *g_ds;
static uint64_t g_base[N_SHARDS]; /* global token index of each shard's first token */

/* token value = global token index (width 4), so a sample is identified by its first token */
static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/loom_test_loader_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    loom_err err = {{0}};
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", g_dir);
    uint64_t base = 0;
    for (int s = 0; s < N_SHARDS; s++) {
        uint64_t n = SIZES[s];
        uint32_t *tok = malloc(n * sizeof *tok);
        for (uint64_t i = 0; i < n; i++) tok[i] = (uint32_t)(base + i);
        uint64_t docs[1] = {0};
        loom_shard_spec spec = {1u << 20, 4, "test", NULL};
        char sp[512], sha[65], line[512];
        snprintf(sp, sizeof sp, "%s/s%d.bin", g_dir, s);
        if (loom_shard_write(sp, &spec, tok, n, docs, 1, &err) || loom_sha256_file(sp, sha, &err))
            return -1;
        snprintf(line, sizeof line,
                 "{\"shard\":\"s%d.bin\",\"sha256\":\"%s\",\"tokens\":%llu,\"docs\":1}", s, sha,
                 (unsigned long long)n);
        if (loom_append_line(mpath, line, &err)) return -1;
        free(tok);
        g_base[s] = base;
        base += n;
    }
    if (loom_dataset_open(g_dir, &g_ds, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    loom_dataset_close(g_ds);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The first token of global sample g, from the sample definition. */
static int32_t expected_first(uint64_t g) {
    for (int s = 0; s < N_SHARDS; s++) {
        uint64_t ns = SIZES[s] >= T + 1 ? (SIZES[s] - 1) / T : 0;
        if (g < ns) return (int32_t)(g_base[s] + g * T);
        g -= ns;
    }
    fail_msg("sample index out of range");
    return -1;
}

/* Draws n samples one at a time and returns their global indices (by first token). */
static void draw(loom_loader *l, int n, uint64_t *out) {
    int32_t in[T], tg[T];
    for (int i = 0; i < n; i++) {
        loom_loader_next(l, 1, in, tg);
        uint64_t g = UINT64_MAX;
        for (uint64_t k = 0; k < N_SAMPLES; k++)
            if (expected_first(k) == in[0]) g = k;
        assert_true(g != UINT64_MAX);
        for (int t = 0; t < T; t++) {
            assert_int_equal(in[t], in[0] + t);     /* consecutive tokens of one shard */
            assert_int_equal(tg[t], in[0] + t + 1); /* targets shifted by one */
        }
        out[i] = g;
    }
}

static void test_sequential_order(void **state) {
    (void)state;
    loom_loader *l;
    loom_err err = {{0}};
    assert_int_equal(loom_loader_create(g_ds, T, 1, 0, &l, &err), 0);
    assert_int_equal(loom_loader_num_samples(l), N_SAMPLES);
    /* batches of B: consecutive samples, wrapping into the next epoch */
    int B = 5;
    int32_t in[5 * T], tg[5 * T];
    for (uint64_t step = 0; step < 60; step++) {
        loom_loader_next(l, B, in, tg);
        for (int b = 0; b < B; b++) {
            uint64_t g = (step * (uint64_t)B + (uint64_t)b) % N_SAMPLES;
            assert_int_equal(in[b * T], expected_first(g));
            assert_int_equal(tg[b * T + T - 1], expected_first(g) + T);
        }
    }
    loom_loader_state st = loom_loader_get_state(l);
    assert_int_equal(st.epoch, 300 / N_SAMPLES);
    assert_int_equal(st.position, 300 % N_SAMPLES);
    loom_loader_free(l);
}

static void test_every_sample_once_per_epoch(void **state) {
    (void)state;
    loom_loader *l;
    loom_err err = {{0}};
    assert_int_equal(loom_loader_create(g_ds, T, 1234, 1, &l, &err), 0);
    uint64_t order[3][N_SAMPLES];
    for (int e = 0; e < 3; e++) {
        loom_loader_state st = loom_loader_get_state(l);
        assert_int_equal(st.epoch, e);
        assert_int_equal(st.position, 0);
        draw(l, N_SAMPLES, order[e]);
        int seen[N_SAMPLES] = {0};
        for (int i = 0; i < N_SAMPLES; i++) seen[order[e][i]]++;
        for (int i = 0; i < N_SAMPLES; i++) assert_int_equal(seen[i], 1);
    }
    /* shuffled: not the identity, and different in each epoch */
    int identity = 1;
    for (int i = 0; i < N_SAMPLES; i++) identity &= order[0][i] == (uint64_t)i;
    assert_false(identity);
    assert_memory_not_equal(order[0], order[1], sizeof order[0]);
    assert_memory_not_equal(order[1], order[2], sizeof order[0]);
    loom_loader_free(l);

    /* the same seed gives the same order; another seed another one */
    uint64_t again[N_SAMPLES], other[N_SAMPLES];
    assert_int_equal(loom_loader_create(g_ds, T, 1234, 1, &l, &err), 0);
    draw(l, N_SAMPLES, again);
    loom_loader_free(l);
    assert_memory_equal(order[0], again, sizeof again);
    assert_int_equal(loom_loader_create(g_ds, T, 1235, 1, &l, &err), 0);
    draw(l, N_SAMPLES, other);
    loom_loader_free(l);
    assert_memory_not_equal(order[0], other, sizeof other);
}

static void test_resume_exact(void **state) {
    (void)state;
    const int total = 4 * N_SAMPLES + 17, B = 3, steps = total / B;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        loom_loader *ref;
        loom_err err = {{0}};
        assert_int_equal(loom_loader_create(g_ds, T, 99, shuffle, &ref, &err), 0);
        int32_t *in = malloc((size_t)steps * B * T * sizeof *in);
        int32_t *tg = malloc((size_t)steps * B * T * sizeof *tg);
        loom_loader_state *st = malloc((size_t)(steps + 1) * sizeof *st);
        for (int s = 0; s < steps; s++) {
            st[s] = loom_loader_get_state(ref);
            loom_loader_next(ref, B, in + (size_t)s * B * T, tg + (size_t)s * B * T);
        }
        st[steps] = loom_loader_get_state(ref);
        loom_loader_free(ref);
        loom_rng r = {7, (uint64_t)shuffle, 0};
        int32_t bi[3 * T], bt[3 * T];
        for (int k = 0; k < 20; k++) {
            int at = (int)(loom_rng_next_u64(&r) % (uint64_t)steps);
            loom_loader *l;
            /* a fresh loader (another process after a restart) that has seen other data */
            assert_int_equal(loom_loader_create(g_ds, T, 99, shuffle, &l, &err), 0);
            loom_loader_next(l, 2, bi, bt);
            loom_loader_set_state(l, st[at]);
            for (int s = at; s < steps; s++) {
                loom_loader_next(l, B, bi, bt);
                assert_memory_equal(bi, in + (size_t)s * B * T, sizeof bi);
                assert_memory_equal(bt, tg + (size_t)s * B * T, sizeof bt);
            }
            loom_loader_state end = loom_loader_get_state(l);
            assert_int_equal(end.epoch, st[steps].epoch);
            assert_int_equal(end.position, st[steps].position);
            loom_loader_free(l);
        }
        free(in);
        free(tg);
        free(st);
    }
}

static void test_state_normalized(void **state) {
    (void)state;
    loom_loader *a, *b;
    loom_err err = {{0}};
    assert_int_equal(loom_loader_create(g_ds, T, 5, 1, &a, &err), 0);
    assert_int_equal(loom_loader_create(g_ds, T, 5, 1, &b, &err), 0);
    loom_loader_set_state(a, (loom_loader_state){1, N_SAMPLES + 3}); /* = epoch 2, position 3 */
    loom_loader_set_state(b, (loom_loader_state){2, 3});
    loom_loader_state sa = loom_loader_get_state(a);
    assert_int_equal(sa.epoch, 2);
    assert_int_equal(sa.position, 3);
    int32_t ia[4 * T], ta[4 * T], ib[4 * T], tb[4 * T];
    loom_loader_next(a, 4, ia, ta);
    loom_loader_next(b, 4, ib, tb);
    assert_memory_equal(ia, ib, sizeof ia);
    loom_loader_free(a);
    loom_loader_free(b);
}

static void test_no_complete_sample(void **state) {
    (void)state;
    loom_loader *l = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_loader_create(g_ds, 1000, 1, 0, &l, &err), -1); /* needs 1001 tokens */
    assert_null(l);
    assert_non_null(strstr(err.msg, g_dir));
    assert_non_null(strstr(err.msg, "no complete sample of 1001 tokens"));
    assert_int_equal(loom_loader_create(g_ds, 0, 1, 0, &l, &err), -1);
    /* T = 999: exactly one sample (shard 0 has 1000 tokens) */
    assert_int_equal(loom_loader_create(g_ds, 999, 1, 1, &l, &err), 0);
    assert_int_equal(loom_loader_num_samples(l), 1);
    loom_loader_free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_order),
        cmocka_unit_test(test_every_sample_once_per_epoch),
        cmocka_unit_test(test_resume_exact),
        cmocka_unit_test(test_state_normalized),
        cmocka_unit_test(test_no_complete_sample),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
