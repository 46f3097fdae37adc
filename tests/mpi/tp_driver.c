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
 *                        gradients equal the plain pair's.
 * Prints "rank R: ..." lines; exit status 0 only when every check passed. */
#include "loom/backend.h"
#include "loom/comm.h"
#include "loom/tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int g_fail;
#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", loom_comm_world_rank(), __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fputc('\n', stderr);                                                             \
            g_fail = 1;                                                                      \
        }                                                                                    \
    } while (0)

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

static void check_linear(loom_mesh *mesh) {
    const loom_backend *be = loom_backend_cpu();
    const int tp = loom_mesh_size(mesh, LOOM_GROUP_TP), r = loom_mesh_rank(mesh, LOOM_GROUP_TP);
    const int Fl = F / tp, f0 = r * Fl;
    float X[N * C], W1[F * C], b1[F], W2[C * F], b2[C], dY[N * C];
    fill(X, N * C, 1), fill(W1, F * C, 2), fill(b1, F, 3), fill(W2, C * F, 4), fill(b2, C, 5);
    fill(dY, N * C, 6);

    /* the plain pair on the whole weights */
    float H[N * F], Y[N * C], dH[N * F] = {0}, dX[N * C] = {0}, dW1[F * C] = {0}, db1[F] = {0},
          dW2[C * F] = {0}, db2[C] = {0};
    be->matmul_forward(H, X, W1, b1, N, C, F);
    be->matmul_forward(Y, H, W2, b2, N, F, C);
    be->matmul_backward(dH, dW2, db2, dY, H, W2, N, F, C);
    be->matmul_backward(dX, dW1, db1, dH, X, W1, N, C, F);

    /* this rank's boxes: W1 rows [f0, f0 + Fl), b1 the same, W2 columns [f0, f0 + Fl) */
    float *W1l = W1 + (size_t)f0 * C, *b1l = b1 + f0;
    float W2l[C * F];
    for (int i = 0; i < C; i++) memcpy(W2l + i * Fl, W2 + i * F + f0, (size_t)Fl * sizeof(float));
    loom_tp *t = loom_tp_create(mesh);
    const loom_comm_points cp = loom_tp_comm_points(t);
    float x[N * C], hl[N * F], y[N * C], part[N * C];
    memcpy(x, X, sizeof x);
    cp.fn(cp.ctx, LOOM_CP_COL_IN, 0, 0, LOOM_SITE_FFN, x, N * C);
    be->matmul_forward(hl, x, W1l, b1l, N, C, Fl);
    /* the row-parallel bias is added once: by tp rank 0, before the all-reduce */
    be->matmul_forward(y, hl, W2l, r == 0 ? b2 : NULL, N, Fl, C);
    memcpy(part, y, sizeof part);
    cp.fn(cp.ctx, LOOM_CP_ROW_OUT, 0, 0, LOOM_SITE_FFN, y, N * C);
    EXPECT(rel(y, Y, N * C) <= 1e-5, "forward output: rel %.3g", rel(y, Y, N * C));
    if (tp > 1) EXPECT(rel(part, Y, N * C) > 1e-2, "partial output already whole: rel %.3g",
                       rel(part, Y, N * C));

    float dy[N * C], dhl[N * F] = {0}, dx[N * C] = {0}, dW1l[F * C] = {0}, db1l[F] = {0},
          dW2l[C * F] = {0}, db2l[C] = {0};
    memcpy(dy, dY, sizeof dy);
    cp.fn(cp.ctx, LOOM_CP_ROW_OUT, 1, 0, LOOM_SITE_FFN, dy, N * C);
    be->matmul_backward(dhl, dW2l, db2l, dy, hl, W2l, N, Fl, C);
    be->matmul_backward(dx, dW1l, db1l, dhl, x, W1l, N, C, Fl);
    cp.fn(cp.ctx, LOOM_CP_COL_IN, 1, 0, LOOM_SITE_FFN, dx, N * C);
    EXPECT(rel(dx, dX, N * C) <= 1e-5, "input gradient: rel %.3g", rel(dx, dX, N * C));
    EXPECT(rel(dW1l, dW1 + (size_t)f0 * C, (size_t)Fl * C) <= 1e-5, "W1 rows gradient");
    EXPECT(rel(db1l, db1 + f0, (size_t)Fl) <= 1e-5, "b1 gradient");
    float dW2box[C * F];
    for (int i = 0; i < C; i++) memcpy(dW2box + i * Fl, dW2 + i * F + f0, (size_t)Fl * sizeof(float));
    EXPECT(rel(dW2l, dW2box, (size_t)C * Fl) <= 1e-5, "W2 columns gradient");
    EXPECT(rel(db2l, db2, C) <= 1e-5, "b2 gradient (replicated, whole on every rank)");
    EXPECT(loom_tp_comm_calls(t) == (tp > 1 ? 2 : 0), "tp collectives: %lld calls",
           (long long)loom_tp_comm_calls(t));
    loom_tp_free(t);
    if (!g_fail)
        printf("rank %d: tp=%d column- then row-parallel linear equals the plain one "
               "(output rel %.2e, input grad rel %.2e)\n",
               loom_comm_world_rank(), tp, rel(y, Y, N * C), rel(dx, dX, N * C));
}

/* Sequence parallelism: the same pair with the rows sharded around it. Rank r holds rows
 * [r*N/tp, (r+1)*N/tp) of X; COL_IN gathers them (loom_tp_move), ROW_OUT reduce-scatters the
 * partial output to the rank's rows; backward: ROW_OUT gathers the rows' output gradient, COL_IN
 * reduce-scatters the input gradient. Each rank's rows of the output and of the input gradient,
 * and its boxes' weight gradients, must equal the plain pair's. */
static void check_linear_sp(loom_mesh *mesh) {
    const loom_backend *be = loom_backend_cpu();
    const int tp = loom_mesh_size(mesh, LOOM_GROUP_TP), r = loom_mesh_rank(mesh, LOOM_GROUP_TP);
    if (N % tp != 0) return; /* the rows must split evenly */
    const int Fl = F / tp, f0 = r * Fl, Nl = N / tp, n0 = r * Nl;
    float X[N * C], W1[F * C], b1[F], W2[C * F], b2[C], dY[N * C];
    fill(X, N * C, 1), fill(W1, F * C, 2), fill(b1, F, 3), fill(W2, C * F, 4), fill(b2, C, 5);
    fill(dY, N * C, 6);
    float H[N * F], Y[N * C], dH[N * F] = {0}, dX[N * C] = {0}, dW1[F * C] = {0}, db1[F] = {0},
          dW2[C * F] = {0}, db2[C] = {0};
    be->matmul_forward(H, X, W1, b1, N, C, F);
    be->matmul_forward(Y, H, W2, b2, N, F, C);
    be->matmul_backward(dH, dW2, db2, dY, H, W2, N, F, C);
    be->matmul_backward(dX, dW1, db1, dH, X, W1, N, C, F);

    float *W1l = W1 + (size_t)f0 * C, *b1l = b1 + f0;
    float W2l[C * F];
    for (int i = 0; i < C; i++) memcpy(W2l + i * Fl, W2 + i * F + f0, (size_t)Fl * sizeof(float));
    loom_tp *t = loom_tp_create(mesh);
    const loom_comm_points cp = loom_tp_comm_points(t);
    float xs[N * C], x[N * C], hl[N * F], part[N * C], ys[N * C];
    memcpy(xs, X + (size_t)n0 * C, (size_t)Nl * C * sizeof(float));
    cp.move(cp.ctx, LOOM_CP_COL_IN, 0, 0, LOOM_SITE_FFN, xs, (int64_t)Nl * C, x, N * C);
    be->matmul_forward(hl, x, W1l, b1l, N, C, Fl);
    be->matmul_forward(part, hl, W2l, r == 0 ? b2 : NULL, N, Fl, C);
    cp.move(cp.ctx, LOOM_CP_ROW_OUT, 0, 0, LOOM_SITE_FFN, part, N * C, ys, (int64_t)Nl * C);
    EXPECT(rel(ys, Y + (size_t)n0 * C, (size_t)Nl * C) <= 1e-5, "sp forward rows: rel %.3g",
           rel(ys, Y + (size_t)n0 * C, (size_t)Nl * C));

    float dys[N * C], dy[N * C], dhl[N * F] = {0}, dx[N * C] = {0}, dxs[N * C], dW1l[F * C] = {0},
          db1l[F] = {0}, dW2l[C * F] = {0}, db2l[C] = {0};
    memcpy(dys, dY + (size_t)n0 * C, (size_t)Nl * C * sizeof(float));
    cp.move(cp.ctx, LOOM_CP_ROW_OUT, 1, 0, LOOM_SITE_FFN, dys, (int64_t)Nl * C, dy, N * C);
    be->matmul_backward(dhl, dW2l, db2l, dy, hl, W2l, N, Fl, C);
    be->matmul_backward(dx, dW1l, db1l, dhl, x, W1l, N, C, Fl);
    cp.move(cp.ctx, LOOM_CP_COL_IN, 1, 0, LOOM_SITE_FFN, dx, N * C, dxs, (int64_t)Nl * C);
    EXPECT(rel(dxs, dX + (size_t)n0 * C, (size_t)Nl * C) <= 1e-5, "sp input gradient rows");
    EXPECT(rel(dW1l, dW1 + (size_t)f0 * C, (size_t)Fl * C) <= 1e-5, "sp W1 rows gradient");
    EXPECT(rel(db1l, db1 + f0, (size_t)Fl) <= 1e-5, "sp b1 gradient");
    float dW2box[C * F];
    for (int i = 0; i < C; i++) memcpy(dW2box + i * Fl, dW2 + i * F + f0, (size_t)Fl * sizeof(float));
    EXPECT(rel(dW2l, dW2box, (size_t)C * Fl) <= 1e-5, "sp W2 columns gradient");
    EXPECT(rel(db2l, db2, C) <= 1e-5, "sp b2 gradient");
    EXPECT(loom_tp_comm_calls(t) == 4, "sp collectives: %lld calls", (long long)loom_tp_comm_calls(t));
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
    if (loom_comm_init(&argc, &argv, &err)) {
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
