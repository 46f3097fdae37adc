/* Point-to-point bandwidth between the ranks of a 2-rank job through loom's own calls
 * (loom_isend / loom_irecv, as ring attention uses them) and the all-to-all (as Ulysses uses
 * it): the bytes-over-bandwidth bound that bench/bench_cp.sh sets beside each step's
 * communication time. Prints one JSON line from rank 0:
 *   {"p2p_GBps": ..., "alltoall_GBps": ...}
 * where p2p is one direction's rate with both directions busy at once (the ring's exchange)
 * and alltoall is the bytes a rank sends ((N-1)/N of its buffer) per second.
 *   mpirun -np 2 bench_cp_bw [MiB]   (default 32) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/parallel.h"

int main(int argc, char **argv) {
    loom_err err;
    if (loom_parallel_start(&argc, &argv, &err)) {
        fprintf(stderr, "bench_cp_bw: %s\n", err.msg);
        return 1;
    }
    const double mib = argc > 1 ? atof(argv[1]) : 32;
    loom_mesh_spec s;
    loom_mesh_spec_default(&s);
    loom_mesh *m;
    if (loom_mesh_create(&s, NULL, &m, &err)) loom_comm_fail_all(&err);
    const int N = loom_mesh_size(m, LOOM_GROUP_WORLD), me = loom_mesh_rank(m, LOOM_GROUP_WORLD);
    const size_t n = (size_t)(mib * 1024 * 1024 / sizeof(float));
    float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
    if (!a || !b) loom_comm_abort(1, "out of memory");
    for (size_t i = 0; i < n; i++) a[i] = (float)i;
    const int reps = 10;
    double best_p2p = 0, best_a2a = 0;
    for (int r = 0; r < reps + 1; r++) { /* the first is a warm-up */
        loom_barrier(m, LOOM_GROUP_WORLD);
        double t0 = loom_now();
        loom_comm_req *q[2];
        q[0] = loom_isend(m, LOOM_GROUP_WORLD, a, n, LOOM_F32, (me + 1) % N, 7);
        q[1] = loom_irecv(m, LOOM_GROUP_WORLD, b, n, LOOM_F32, (me + N - 1) % N, 7);
        loom_comm_waitall(2, q, "bandwidth probe");
        double dt = loom_now() - t0;
        loom_allreduce_max(m, LOOM_GROUP_WORLD, &dt, 1, LOOM_F64);
        if (r > 0 && n * sizeof(float) / dt > best_p2p) best_p2p = n * sizeof(float) / dt;
        loom_barrier(m, LOOM_GROUP_WORLD);
        t0 = loom_now();
        loom_alltoall(m, LOOM_GROUP_WORLD, a, b, n / (size_t)N, LOOM_F32);
        dt = loom_now() - t0;
        loom_allreduce_max(m, LOOM_GROUP_WORLD, &dt, 1, LOOM_F64);
        const double sent = (double)(N - 1) / N * (double)(n / (size_t)N * (size_t)N) * sizeof(float);
        if (r > 0 && sent / dt > best_a2a) best_a2a = sent / dt;
    }
    if (me == 0)
        printf("{\"p2p_GBps\": %.4f, \"alltoall_GBps\": %.4f, \"MiB\": %g, \"ranks\": %d}\n",
               best_p2p / 1e9, best_a2a / 1e9, mib, N);
    free(a);
    free(b);
    loom_mesh_free(m);
    loom_comm_finalize();
    return 0;
}
