/* Tensor parallelism: the model's communication points over the mesh's tp group. See
 * include/loom/tp.h and docs/parallelism.md. The math stays in the model (each view computes
 * its heads and columns); this file only says which collective runs at which point. */
#include "loom/tp.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct loom_tp {
    loom_mesh *mesh;
    int size;
    double seconds;   /* in the points' collectives since the last reset */
    int64_t calls;
    int64_t total;    /* collectives since create (the test hook counts these) */
    int64_t fail_at;  /* LOOM_TEST_TP_FAIL: the collective to fail before, -1 none */
    char fail_mode[16];
};

/* ---- test-only fault injection -----------------------------------------------------------
 * LOOM_TEST_TP_FAIL="RANK:N:kill" makes world rank RANK SIGKILL itself just before its N-th
 * tensor-parallel collective (1-based, counted from the start of the job); "RANK:N:hang" makes
 * it wait there forever, so the other ranks of its tp group wait inside that collective until
 * parallel.timeout_s ends the job naming it. tests/mpi/test_tp_fail.sh uses it. */
static void read_fail_hook(loom_tp *tp) {
    tp->fail_at = -1;
    const char *f = getenv("LOOM_TEST_TP_FAIL");
    long r;
    long long n;
    char mode[16];
    if (!f || sscanf(f, "%ld:%lld:%15s", &r, &n, mode) != 3) return;
    if (r != loom_mesh_rank(tp->mesh, LOOM_GROUP_WORLD)) return;
    tp->fail_at = n;
    snprintf(tp->fail_mode, sizeof tp->fail_mode, "%s", mode);
}

static void fail_hook(loom_tp *tp) {
    if (++tp->total != tp->fail_at) return;
    if (!strcmp(tp->fail_mode, "kill")) raise(SIGKILL);
    if (!strcmp(tp->fail_mode, "hang"))
        for (;;) pause(); /* until the job is ended */
}

loom_tp *loom_tp_create(loom_mesh *mesh) {
    loom_tp *tp = loom_calloc(1, sizeof *tp);
    tp->mesh = mesh;
    tp->size = loom_mesh_size(mesh, LOOM_GROUP_TP);
    read_fail_hook(tp);
    return tp;
}

void loom_tp_free(loom_tp *tp) { free(tp); }

/* sum (or max) of buf over the tp group, timed */
static void tp_allreduce(loom_tp *tp, float *buf, int64_t n, int max) {
    fail_hook(tp);
    const double t0 = loom_now();
    if (max) loom_allreduce_max(tp->mesh, LOOM_GROUP_TP, buf, (size_t)n, LOOM_F32);
    else loom_allreduce_sum(tp->mesh, LOOM_GROUP_TP, buf, (size_t)n, LOOM_F32);
    tp->seconds += loom_now() - t0;
    tp->calls++;
}

void loom_tp_point(void *ctx, int point, int dir, int layer, int site, float *buf, int64_t n) {
    loom_tp *tp = ctx;
    (void)layer;
    (void)site;
    if (tp->size == 1) return;
    /* row-parallel output (and the vocab-parallel embedding's): each rank holds a partial sum
     * of the whole (B,T,C) output */
    if (point == LOOM_CP_ROW_OUT && dir == 0) tp_allreduce(tp, buf, n, 0);
    /* column-parallel input (and the head's): each rank's columns give a partial input
     * gradient */
    else if (point == LOOM_CP_COL_IN && dir == 1) tp_allreduce(tp, buf, n, 0);
    /* vocab-parallel cross-entropy: the rows' global max, then their sums of exp and target
     * logits */
    else if (point == LOOM_CP_VOCAB_MAX && dir == 0) tp_allreduce(tp, buf, n, 1);
    else if (point == LOOM_CP_VOCAB_SUM && dir == 0) tp_allreduce(tp, buf, n, 0);
    /* whole-projection q/k norms: each rank's heads' part of the rows' sums (of squares;
     * backward of dy * w * xhat) */
    else if (point == LOOM_CP_QKNORM_SUM) tp_allreduce(tp, buf, n, 0);
}

void loom_tp_move(void *ctx, int point, int dir, int layer, int site, const void *in,
                  int64_t n_in, void *out, int64_t n_out, size_t elem) {
    loom_tp *tp = ctx;
    (void)layer;
    (void)site;
    LOOM_CHECK(point == LOOM_CP_COL_IN || point == LOOM_CP_ROW_OUT ||
               (point == LOOM_CP_VOCAB_GATHER && dir == 0));
    LOOM_CHECK(elem == sizeof(float) || elem == sizeof(uint16_t));
    const loom_dtype dt = elem == sizeof(float) ? LOOM_F32 : LOOM_BF16;
    /* COL_IN forward and ROW_OUT backward gather the shards into the whole rows; COL_IN
     * backward and ROW_OUT forward reduce-scatter the whole rows' partial sums to the shards;
     * decoding's VOCAB_GATHER gathers each view's (padded) logits */
    const int gather = point == LOOM_CP_VOCAB_GATHER || (point == LOOM_CP_COL_IN) == (dir == 0);
    fail_hook(tp);
    const double t0 = loom_now();
    if (gather) {
        LOOM_CHECK(n_out == n_in * tp->size);
        loom_allgather(tp->mesh, LOOM_GROUP_TP, in, out, (size_t)n_out, dt);
    } else { /* (fp32 only: loom_reduce_scatter_sum refuses bf16) */
        LOOM_CHECK(n_in == n_out * tp->size);
        loom_reduce_scatter_sum(tp->mesh, LOOM_GROUP_TP, in, out, (size_t)n_in, dt);
    }
    tp->seconds += loom_now() - t0;
    tp->calls++;
}

loom_comm_points loom_tp_comm_points(loom_tp *tp) {
    return (loom_comm_points){.ctx = tp, .fn = loom_tp_point, .move = loom_tp_move};
}

double loom_tp_comm_seconds(const loom_tp *tp) { return tp->seconds; }
int64_t loom_tp_comm_calls(const loom_tp *tp) { return tp->calls; }

void loom_tp_stats_reset(loom_tp *tp) {
    tp->seconds = 0;
    tp->calls = 0;
}
