/* tp_driver: tensor parallelism's communication points (src/parallel/tp.c) under mpirun.
 *
 *   tp_driver linear     every rank of a tp group of the world's size runs a Megatron pair,
 *                        a column-parallel linear (W1 split by output rows) then a row-parallel
 *                        one (W2 split by input columns), through loom_tp_point at COL_IN and
 *                        ROW_OUT, forward and backward; the output and every gradient (input,
 *                        W1 rows, b1, W2 columns, b2) must equal one plain pair of linears on
 *                        the same whole weights within 1e-5 relative (max |d| / max |plain|).
 *                        Also checked: the partial output before the all-reduce is not the
 *                        whole one (the points do the work), and the points made 2 calls.
 *                        Then with sequence parallelism (tp dividing the 6 rows): the rows
 *                        sharded, moved by loom_tp_move (all-gather / reduce-scatter); each
 *                        rank's rows of the output and input gradient and its weight
 *                        gradients equal the plain pair's; and the rows rounded to bf16
 *                        (training.precision bf16) gather as bf16 elements bit for bit.
 * Prints "rank R: ..." lines; exit status 0 only when every check passed. */
#include "loom/backend.h"
#include "loom/bf16.h"
#include "loom/comm.h"
#include "loom/parallel.h"
#include "loom/tp.h"
#include "driver_expect.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N = 6, C = 8, F = 24 }; /* rows, model width, hidden width (divisible by 1, 2, 3, 4) */

static void fill(float *x, size_t n, uint64_t stream) {
    for (size_t i = 0; i < n; i++) x[i] = loom_rng_normal(7, stream, i);
}

/* max |a - b| / max |b| */
static double rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

/* One Megatron pair, set up alike for both checks: the whole weights, input and output
 * gradient (the same on every rank), the plain pair's forward and backward on them, and this
 * tp rank's boxes: W1 rows [f0, f0 + Fl), b1 the same, W2 columns [f0, f0 + Fl). */
typedef struct pair {
    int tp, r, Fl, f0;
    float X[N * C], W1[F * C], b1[F], W2[C * F], b2[C], dY[N * C];
    float H[N * F], Y[N * C], dH[N * F], dX[N * C], dW1[F * C], db1[F], dW2[C * F], db2[C];
    const float *W1l, *b1l; /* this rank's rows of W1, b1 (views) */
    float W2l[C * F];       /* its columns of W2, (C, Fl) */
} pair;

static void pair_init(pair *p, loom_mesh *mesh) {
    const loom_backend *be = loom_backend_cpu();
    memset(p, 0, sizeof *p);
    p->tp = loom_mesh_size(mesh, LOOM_GROUP_TP);
    p->r = loom_mesh_rank(mesh, LOOM_GROUP_TP);
    p->Fl = F / p->tp;
    p->f0 = p->r * p->Fl;
    fill(p->X, N * C, 1), fill(p->W1, F * C, 2), fill(p->b1, F, 3), fill(p->W2, C * F, 4);
    fill(p->b2, C, 5), fill(p->dY, N * C, 6);
    be->matmul_forward(p->H, p->X, p->W1, p->b1, N, C, F);
    be->matmul_forward(p->Y, p->H, p->W2, p->b2, N, F, C);
    be->matmul_backward(p->dH, p->dW2, p->db2, p->dY, p->H, p->W2, N, F, C);
    be->matmul_backward(p->dX, p->dW1, p->db1, p->dH, p->X, p->W1, N, C, F);
    p->W1l = p->W1 + (size_t)p->f0 * C;
    p->b1l = p->b1 + p->f0;
    for (int i = 0; i < C; i++)
        memcpy(p->W2l + i * p->Fl, p->W2 + i * F + p->f0, (size_t)p->Fl * sizeof(float));
}

/* the rank's weight gradients against the plain pair's same boxes (b2 replicated: whole) */
static void check_weight_grads(const pair *p, const char *what, const float *dW1l,
                               const float *db1l, const float *dW2l, const float *db2l) {
    const int Fl = p->Fl, f0 = p->f0;
    EXPECT(rel(dW1l, p->dW1 + (size_t)f0 * C, (size_t)Fl * C) <= 1e-5, "%s W1 rows gradient", what);
    EXPECT(rel(db1l, p->db1 + f0, (size_t)Fl) <= 1e-5, "%s b1 gradient", what);
    float dW2box[C * F];
    for (int i = 0; i < C; i++)
        memcpy(dW2box + i * Fl, p->dW2 + i * F + f0, (size_t)Fl * sizeof(float));
    EXPECT(rel(dW2l, dW2box, (size_t)C * Fl) <= 1e-5, "%s W2 columns gradient", what);
    EXPECT(rel(db2l, p->db2, C) <= 1e-5, "%s b2 gradient (replicated, whole on every rank)", what);
}

static void check_linear(loom_mesh *mesh) {
    const loom_backend *be = loom_backend_cpu();
    pair p;
    pair_init(&p, mesh);
    const int tp = p.tp, r = p.r, Fl = p.Fl;
    loom_tp *t = loom_tp_create(mesh);
    const loom_comm_points cp = loom_tp_comm_points(t);
    float x[N * C], hl[N * F], y[N * C], part[N * C];
    memcpy(x, p.X, sizeof x);
    cp.fn(cp.ctx, LOOM_CP_COL_IN, 0, 0, LOOM_SITE_FFN, x, N * C);
    be->matmul_forward(hl, x, p.W1l, p.b1l, N, C, Fl);
    /* the row-parallel bias is added once: by tp rank 0, before the all-reduce */
    be->matmul_forward(y, hl, p.W2l, r == 0 ? p.b2 : NULL, N, Fl, C);
    memcpy(part, y, sizeof part);
    cp.fn(cp.ctx, LOOM_CP_ROW_OUT, 0, 0, LOOM_SITE_FFN, y, N * C);
    EXPECT(rel(y, p.Y, N * C) <= 1e-5, "forward output: rel %.3g", rel(y, p.Y, N * C));
    if (tp > 1) EXPECT(rel(part, p.Y, N * C) > 1e-2, "partial output already whole: rel %.3g",
                       rel(part, p.Y, N * C));

    float dy[N * C], dhl[N * F] = {0}, dx[N * C] = {0}, dW1l[F * C] = {0}, db1l[F] = {0},
          dW2l[C * F] = {0}, db2l[C] = {0};
    memcpy(dy, p.dY, sizeof dy);
    cp.fn(cp.ctx, LOOM_CP_ROW_OUT, 1, 0, LOOM_SITE_FFN, dy, N * C);
    be->matmul_backward(dhl, dW2l, db2l, dy, hl, p.W2l, N, Fl, C);
    be->matmul_backward(dx, dW1l, db1l, dhl, x, p.W1l, N, C, Fl);
    cp.fn(cp.ctx, LOOM_CP_COL_IN, 1, 0, LOOM_SITE_FFN, dx, N * C);
    EXPECT(rel(dx, p.dX, N * C) <= 1e-5, "input gradient: rel %.3g", rel(dx, p.dX, N * C));
    check_weight_grads(&p, "tp", dW1l, db1l, dW2l, db2l);
    EXPECT(loom_tp_comm_calls(t) == (tp > 1 ? 2 : 0), "tp collectives: %lld calls",
           (long long)loom_tp_comm_calls(t));
    loom_tp_free(t);
    if (!g_fail)
        printf("rank %d: tp=%d column- then row-parallel linear equals the plain one "
               "(output rel %.2e, input grad rel %.2e)\n",
               loom_comm_world_rank(), tp, rel(y, p.Y, N * C), rel(dx, p.dX, N * C));
}

/* Sequence parallelism: the same pair with the rows sharded around it. Rank r holds rows
 * [r*N/tp, (r+1)*N/tp) of X; COL_IN gathers them (loom_tp_move), ROW_OUT reduce-scatters the
 * partial output to the rank's rows; backward: ROW_OUT gathers the rows' output gradient, COL_IN
 * reduce-scatters the input gradient. Each rank's rows of the output and of the input gradient,
 * and its boxes' weight gradients, must equal the plain pair's. */
static void check_linear_sp(loom_mesh *mesh) {
    const loom_backend *be = loom_backend_cpu();
    pair p;
    pair_init(&p, mesh);
    const int tp = p.tp, r = p.r, Fl = p.Fl;
    if (N % tp != 0) return; /* the rows must split evenly */
    const int Nl = N / tp, n0 = r * Nl;
    loom_tp *t = loom_tp_create(mesh);
    const loom_comm_points cp = loom_tp_comm_points(t);
    float xs[N * C], x[N * C], hl[N * F], part[N * C], ys[N * C];
    memcpy(xs, p.X + (size_t)n0 * C, (size_t)Nl * C * sizeof(float));
    cp.move(cp.ctx, LOOM_CP_COL_IN, 0, 0, LOOM_SITE_FFN, xs, (int64_t)Nl * C, x, N * C,
            sizeof(float));
    be->matmul_forward(hl, x, p.W1l, p.b1l, N, C, Fl);
    be->matmul_forward(part, hl, p.W2l, r == 0 ? p.b2 : NULL, N, Fl, C);
    cp.move(cp.ctx, LOOM_CP_ROW_OUT, 0, 0, LOOM_SITE_FFN, part, N * C, ys, (int64_t)Nl * C,
            sizeof(float));
    EXPECT(rel(ys, p.Y + (size_t)n0 * C, (size_t)Nl * C) <= 1e-5, "sp forward rows: rel %.3g",
           rel(ys, p.Y + (size_t)n0 * C, (size_t)Nl * C));

    float dys[N * C], dy[N * C], dhl[N * F] = {0}, dx[N * C] = {0}, dxs[N * C], dW1l[F * C] = {0},
          db1l[F] = {0}, dW2l[C * F] = {0}, db2l[C] = {0};
    memcpy(dys, p.dY + (size_t)n0 * C, (size_t)Nl * C * sizeof(float));
    cp.move(cp.ctx, LOOM_CP_ROW_OUT, 1, 0, LOOM_SITE_FFN, dys, (int64_t)Nl * C, dy, N * C,
            sizeof(float));
    be->matmul_backward(dhl, dW2l, db2l, dy, hl, p.W2l, N, Fl, C);
    be->matmul_backward(dx, dW1l, db1l, dhl, x, p.W1l, N, C, Fl);
    cp.move(cp.ctx, LOOM_CP_COL_IN, 1, 0, LOOM_SITE_FFN, dx, N * C, dxs, (int64_t)Nl * C,
            sizeof(float));
    EXPECT(rel(dxs, p.dX + (size_t)n0 * C, (size_t)Nl * C) <= 1e-5, "sp input gradient rows");
    check_weight_grads(&p, "sp", dW1l, db1l, dW2l, db2l);
    EXPECT(loom_tp_comm_calls(t) == 4, "sp collectives: %lld calls", (long long)loom_tp_comm_calls(t));
    /* bf16: the shard's rows rounded, gathered as 2-byte elements: the whole rows' bits */
    uint16_t hs[N * C], h[N * C];
    for (int i = 0; i < Nl * C; i++) hs[i] = loom_bf16_round(p.X[(size_t)n0 * C + i]);
    memset(h, 0xff, sizeof h);
    cp.move(cp.ctx, LOOM_CP_COL_IN, 0, 0, LOOM_SITE_ATTN, hs, (int64_t)Nl * C, h, N * C,
            sizeof(uint16_t));
    int bad = 0;
    for (int i = 0; i < N * C; i++) bad += h[i] != loom_bf16_round(p.X[i]);
    EXPECT(bad == 0, "sp bf16 gather: %d of %d elements differ", bad, N * C);
    loom_tp_free(t);
    if (!g_fail)
        printf("rank %d: tp=%d with sequence parallelism: rows %d..%d of the output and input "
               "gradient equal the plain pair's\n", loom_comm_world_rank(), tp, n0, n0 + Nl - 1);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: tp_driver linear\n");
        return 2;
    }
    loom_err err;
    if (loom_parallel_start(&argc, &argv, &err)) {
        fprintf(stderr, "tp_driver: %s\n", err.msg);
        return 1;
    }
    loom_mesh_spec spec;
    loom_mesh_spec_default(&spec);
    spec.dp_auto = 0;
    spec.dp = 1;
    spec.tp = loom_comm_world_size();
    loom_mesh *m;
    if (loom_mesh_create(&spec, NULL, &m, &err)) loom_comm_fail_all(&err);
    if (!strcmp(argv[1], "linear")) {
        check_linear(m);
        check_linear_sp(m);
    }
    else EXPECT(0, "unknown mode %s", argv[1]);
    loom_mesh_free(m);
    loom_comm_finalize();
    return g_fail;
}
