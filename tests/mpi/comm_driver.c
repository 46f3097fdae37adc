/* comm_driver: exercises src/comm under mpirun / srun for tests/mpi and tests/slurm.
 *
 *   comm_driver MODE [key=value ...]
 *   keys: dp (int or auto) tp pp cp ep timeout     the layout (parallel.*)
 *         heads kv_heads layers seq experts        model dims to validate against
 *         rank after sleep                         which rank misbehaves, after how many
 *                                                  collectives, for how long
 *         backend                                  coll / single: the buffers are that
 *                                                  backend's (mem_alloc, filled and read
 *                                                  through mem_h2d / mem_d2h only) and the mesh
 *                                                  is told so (loom_comm_set_device); "host"
 *                                                  (default): plain host arrays
 *   modes: mesh     build the mesh, check every group against the documented rank order
 *          coll     collectives and point-to-point on every group, results checked
 *                   numerically, plus stats and a repeated round that must not allocate
 *          timeout  `rank` sleeps `sleep` s while the others enter an allreduce on world
 *          exit     `rank` exits with status 3 mid-run (no MPI_Finalize)
 *          fail     `rank` calls loom_comm_fail (bad input seen by one rank)
 *          panic    `rank` hits a LOOM_CHECK
 *          segv     `rank` raises SIGSEGV
 *          kill     `rank` raises SIGKILL
 *          single   world of one: must run without MPI initialised (local groups)
 *          unmatched  every rank waits for a p2p receive from itself that no send matches
 *                   (must end the job after the timeout, naming it)
 *          threads  prints loom_comm_default_threads()
 *          isa      prints the kernels' instruction-set level agreed at loom_parallel_start
 * Every rank prints "rank R: ..." lines; exit status 0 only when every check passed. */
#define _GNU_SOURCE
#include "loom/backend.h"
#include "loom/comm.h"
#include "loom/parallel.h"
#include "loom/kernels.h"
#include "driver_expect.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct opts {
    loom_mesh_spec spec;
    loom_mesh_dims dims;
    int bad_rank, after;
    double sleep_s;
    const char *backend;
} opts;

/* ---- buffers: host arrays, or a backend's (device) buffers reached through its copies ---- */

static const loom_backend *g_be; /* NULL: host arrays */

static void *dalloc(size_t bytes) {
    if (!bytes) bytes = 1;
    return g_be ? g_be->mem_alloc(bytes, 0) : loom_malloc(bytes);
}
static void dfree(void *p) {
    if (g_be) g_be->mem_free(p);
    else free(p);
}
/* host -> buffer, buffer -> host (n bytes) */
static void put(void *dev, const void *host, size_t n) {
    if (!n) return;
    if (g_be) g_be->mem_h2d(dev, host, n);
    else memcpy(dev, host, n);
}
static void get(void *host, const void *dev, size_t n) {
    if (!n) return;
    if (g_be) g_be->mem_d2h(host, dev, n);
    else memcpy(host, dev, n);
}
/* n bytes of an output buffer poisoned (0xff: NaN in float, -1 in ints), so that an element a
 * collective does not write is seen */
static void poison(void *dev, size_t n) {
    if (!n) return;
    unsigned char *h = loom_malloc(n);
    memset(h, 0xff, n);
    put(dev, h, n);
    free(h);
}

static int parse_int(const char *k, const char *v, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || !*v || x < -1000000 || x > 1000000) {
        fprintf(stderr, "comm_driver: %s=%s: not an integer\n", k, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_opts(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    loom_mesh_spec_default(&o->spec);
    o->bad_rank = 1;
    o->after = 3;
    o->sleep_s = 30;
    for (int i = 2; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) { fprintf(stderr, "comm_driver: expected key=value, got %s\n", argv[i]); return -1; }
        *eq = 0;
        const char *k = argv[i], *v = eq + 1;
        int rc = 0;
        if (!strcmp(k, "dp")) {
            if (!strcmp(v, "auto")) o->spec.dp_auto = 1;
            else { o->spec.dp_auto = 0; rc = parse_int(k, v, &o->spec.dp); }
        } else if (!strcmp(k, "tp")) rc = parse_int(k, v, &o->spec.tp);
        else if (!strcmp(k, "pp")) rc = parse_int(k, v, &o->spec.pp);
        else if (!strcmp(k, "cp")) rc = parse_int(k, v, &o->spec.cp);
        else if (!strcmp(k, "ep")) rc = parse_int(k, v, &o->spec.ep);
        else if (!strcmp(k, "timeout")) o->spec.timeout_s = strtod(v, NULL);
        else if (!strcmp(k, "heads")) rc = parse_int(k, v, &o->dims.n_head);
        else if (!strcmp(k, "kv_heads")) rc = parse_int(k, v, &o->dims.n_kv_head);
        else if (!strcmp(k, "layers")) rc = parse_int(k, v, &o->dims.n_layer);
        else if (!strcmp(k, "seq")) rc = parse_int(k, v, &o->dims.seq_len);
        else if (!strcmp(k, "experts")) rc = parse_int(k, v, &o->dims.n_expert);
        else if (!strcmp(k, "rank")) rc = parse_int(k, v, &o->bad_rank);
        else if (!strcmp(k, "after")) rc = parse_int(k, v, &o->after);
        else if (!strcmp(k, "sleep")) o->sleep_s = strtod(v, NULL);
        else if (!strcmp(k, "backend")) o->backend = v;
        else { fprintf(stderr, "comm_driver: unknown key %s\n", k); return -1; }
        if (rc) return -1;
    }
    return 0;
}

/* ---- mesh ------------------------------------------------------------------------------- */

static const char *gname(loom_group g) { return loom_group_name(g); }

static void check_mesh(loom_mesh *m) {
    const loom_mesh_spec *s = loom_mesh_layout(m);
    int me = loom_comm_world_rank(), W = loom_comm_world_size();
    int tp = s->tp, pp = s->pp, cp = s->cp, ep = s->ep, dp = s->dp;
    EXPECT(dp * tp * pp * cp == W, "product %d != world %d", dp * tp * pp * cp, W);
    /* the documented order: r = ((dp_idx * pp + pp_idx) * cp + cp_idx) * tp + tp_idx */
    int di = loom_mesh_rank(m, LOOM_GROUP_DP), pi = loom_mesh_rank(m, LOOM_GROUP_PP);
    int ci = loom_mesh_rank(m, LOOM_GROUP_CP), ti = loom_mesh_rank(m, LOOM_GROUP_TP);
    EXPECT(((di * pp + pi) * cp + ci) * tp + ti == me, "coords (%d,%d,%d,%d) do not give rank %d",
           di, pi, ci, ti, me);
    EXPECT(loom_mesh_size(m, LOOM_GROUP_DP) == dp && loom_mesh_size(m, LOOM_GROUP_TP) == tp &&
               loom_mesh_size(m, LOOM_GROUP_PP) == pp && loom_mesh_size(m, LOOM_GROUP_CP) == cp &&
               loom_mesh_size(m, LOOM_GROUP_EP) == ep &&
               loom_mesh_size(m, LOOM_GROUP_DPCP) == dp * cp &&
               loom_mesh_size(m, LOOM_GROUP_EDP) == dp * cp / ep &&
               loom_mesh_size(m, LOOM_GROUP_WORLD) == W,
           "group sizes");
    /* each member of each group: expected world rank from the formula */
    for (int i = 0; i < tp; i++)
        EXPECT(loom_mesh_group_world_rank(m, LOOM_GROUP_TP, i) == ((di * pp + pi) * cp + ci) * tp + i, "tp member %d", i);
    for (int i = 0; i < dp; i++)
        EXPECT(loom_mesh_group_world_rank(m, LOOM_GROUP_DP, i) == ((i * pp + pi) * cp + ci) * tp + ti, "dp member %d", i);
    for (int i = 0; i < pp; i++)
        EXPECT(loom_mesh_group_world_rank(m, LOOM_GROUP_PP, i) == ((di * pp + i) * cp + ci) * tp + ti, "pp member %d", i);
    for (int i = 0; i < cp; i++)
        EXPECT(loom_mesh_group_world_rank(m, LOOM_GROUP_CP, i) == ((di * pp + pi) * cp + i) * tp + ti, "cp member %d", i);
    int dc = di * cp + ci, ei = dc % ep, edp = dc / ep;
    EXPECT(loom_mesh_rank(m, LOOM_GROUP_EP) == ei && loom_mesh_rank(m, LOOM_GROUP_EDP) == edp &&
               loom_mesh_rank(m, LOOM_GROUP_DPCP) == dc,
           "ep/edp/dpcp ranks");
    for (int i = 0; i < ep; i++) {
        int d2 = edp * ep + i;
        EXPECT(loom_mesh_group_world_rank(m, LOOM_GROUP_EP, i) ==
                   (((d2 / cp) * pp + pi) * cp + d2 % cp) * tp + ti, "ep member %d", i);
    }
    /* the communicators agree with the member tables: sum of world ranks over each group */
    for (int g = 0; g < LOOM_GROUP_COUNT; g++) {
        int64_t v = me, want = 0;
        for (int i = 0; i < loom_mesh_size(m, (loom_group)g); i++)
            want += loom_mesh_group_world_rank(m, (loom_group)g, i);
        loom_allreduce_sum(m, (loom_group)g, &v, 1, LOOM_I64);
        EXPECT(v == want, "group %s: sum of ranks %lld, members say %lld", gname((loom_group)g),
               (long long)v, (long long)want);
    }
    char desc[128];
    printf("rank %d: mesh %s dp=%d/%d tp=%d/%d pp=%d/%d cp=%d/%d ep=%d/%d tp_members=", me,
           loom_mesh_describe(m, desc, sizeof desc), di, dp, ti, tp, pi, pp, ci, cp, ei, ep);
    for (int i = 0; i < tp; i++) printf("%s%d", i ? "," : "", loom_mesh_group_world_rank(m, LOOM_GROUP_TP, i));
    printf(" dp_members=");
    for (int i = 0; i < dp; i++) printf("%s%d", i ? "," : "", loom_mesh_group_world_rank(m, LOOM_GROUP_DP, i));
    printf("\n");
}

/* ---- collectives ------------------------------------------------------------------------ */

/* value contributed by group member r at element i (exact in float for these sizes) */
static double val(int r, size_t i) { return (double)((r + 1) * 1000 + (int)(i % 997)); }

static void check_group(loom_mesh *m, loom_group g) {
    int N = loom_mesh_size(m, g), r = loom_mesh_rank(m, g);
    const size_t counts[] = {0, 1, 7, 64, 1001, 4096};
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        size_t n = counts[ci], nf = n * sizeof(float), nd = n * sizeof(double);
        /* host arrays (f, d, rs, ag) and the buffers the collectives see (F, D, RS, AG) */
        float *f = loom_malloc((n ? n : 1) * sizeof(float));
        double *d = loom_malloc((n ? n : 1) * sizeof(double));
        float *F = dalloc(nf);
        double *D = dalloc(nd);
        for (size_t i = 0; i < n; i++) { f[i] = (float)val(r, i); d[i] = val(r, i) + 0.25; }
        put(F, f, nf);
        put(D, d, nd);
        loom_allreduce_sum(m, g, F, n, LOOM_F32);
        loom_allreduce_sum(m, g, D, n, LOOM_F64);
        get(f, F, nf);
        get(d, D, nd);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int k = 0; k < N; k++) want += val(k, i);
            EXPECT(f[i] == (float)want, "%s allreduce f32 n=%zu [%zu] = %g, want %g", gname(g), n, i, f[i], want);
            EXPECT(d[i] == want + 0.25 * N, "%s allreduce f64 n=%zu [%zu]", gname(g), n, i);
        }
        /* max */
        for (size_t i = 0; i < n; i++) d[i] = (double)((r * 7 + (int)i) % (N + 3));
        put(D, d, nd);
        loom_allreduce_max(m, g, D, n, LOOM_F64);
        get(d, D, nd);
        for (size_t i = 0; i < n; i++) {
            double want = -1;
            for (int k = 0; k < N; k++) want = fmax(want, (double)((k * 7 + (int)i) % (N + 3)));
            EXPECT(d[i] == want, "%s allreduce max n=%zu [%zu]", gname(g), n, i);
        }
        /* reduce-scatter (divisible or not) */
        size_t off, len;
        loom_split(n, N, r, &off, &len);
        for (size_t i = 0; i < n; i++) f[i] = (float)val(r, i);
        put(F, f, nf);
        float *rs = loom_malloc((len ? len : 1) * sizeof(float));
        float *RS = dalloc(len * sizeof(float));
        poison(RS, len * sizeof(float));
        loom_reduce_scatter_sum(m, g, F, RS, n, LOOM_F32);
        get(rs, RS, len * sizeof(float));
        for (size_t i = 0; i < len; i++) {
            double want = 0;
            for (int k = 0; k < N; k++) want += val(k, off + i);
            EXPECT(rs[i] == (float)want, "%s reduce_scatter n=%zu [%zu]", gname(g), n, off + i);
        }
        /* allgather: separate buffer, then in place */
        float *ag = loom_malloc((n ? n : 1) * sizeof(float));
        float *AG = dalloc(nf);
        for (size_t i = 0; i < len; i++) rs[i] = (float)(off + i) * 0.5f;
        put(RS, rs, len * sizeof(float));
        poison(AG, nf);
        loom_allgather(m, g, RS, AG, n, LOOM_F32);
        get(ag, AG, nf);
        for (size_t i = 0; i < n; i++) EXPECT(ag[i] == (float)i * 0.5f, "%s allgather n=%zu [%zu]", gname(g), n, i);
        for (size_t i = 0; i < n; i++) ag[i] = (i >= off && i < off + len) ? (float)i + 1 : -1.0f;
        put(AG, ag, nf);
        loom_allgather(m, g, AG + off, AG, n, LOOM_F32);
        get(ag, AG, nf);
        for (size_t i = 0; i < n; i++) EXPECT(ag[i] == (float)i + 1, "%s allgather in place n=%zu [%zu]", gname(g), n, i);
        /* non-blocking: two in flight at once */
        for (size_t i = 0; i < n; i++) { f[i] = (float)val(r, i); d[i] = 1.0; }
        put(F, f, nf);
        put(D, d, nd);
        loom_comm_req *a = loom_iallreduce_sum(m, g, F, n, LOOM_F32);
        loom_comm_req *b = loom_iallreduce_sum(m, g, D, n, LOOM_F64);
        loom_comm_wait(b);
        loom_comm_wait(a);
        get(f, F, nf);
        get(d, D, nd);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int k = 0; k < N; k++) want += val(k, i);
            EXPECT(f[i] == (float)want && d[i] == N, "%s iallreduce n=%zu [%zu]", gname(g), n, i);
        }
        for (size_t i = 0; i < n; i++) f[i] = (float)val(r, i);
        put(F, f, nf);
        poison(RS, len * sizeof(float));
        loom_comm_req *c = loom_ireduce_scatter_sum(m, g, F, RS, n, LOOM_F32);
        while (!loom_comm_test(c)) {}
        get(rs, RS, len * sizeof(float));
        for (size_t i = 0; i < len; i++) {
            double want = 0;
            for (int k = 0; k < N; k++) want += val(k, off + i);
            EXPECT(rs[i] == (float)want, "%s ireduce_scatter n=%zu [%zu]", gname(g), n, off + i);
        }
        poison(AG, nf);
        loom_comm_wait(loom_iallgather(m, g, RS, AG, n, LOOM_F32));
        get(ag, AG, nf);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int k = 0; k < N; k++) want += val(k, i);
            EXPECT(ag[i] == (float)want, "%s iallgather n=%zu [%zu]", gname(g), n, i);
        }
        /* broadcast from the last member */
        for (size_t i = 0; i < n; i++) d[i] = r == N - 1 ? (double)i * 3 : -7;
        put(D, d, nd);
        loom_broadcast(m, g, D, n, LOOM_F64, N - 1);
        get(d, D, nd);
        for (size_t i = 0; i < n; i++) EXPECT(d[i] == (double)i * 3, "%s broadcast n=%zu [%zu]", gname(g), n, i);
        free(f); free(d); free(rs); free(ag);
        dfree(F); dfree(D); dfree(RS); dfree(AG);
    }
    /* alltoall: block j of member r holds r*100 + j */
    const size_t nb = (size_t)N * 3 * sizeof(int32_t);
    int32_t *snd = loom_malloc(nb), *rcv = loom_malloc(nb);
    int32_t *SND = dalloc(nb), *RCV = dalloc(nb);
    for (int j = 0; j < N; j++)
        for (int e = 0; e < 3; e++) snd[j * 3 + e] = r * 100 + j * 10 + e;
    put(SND, snd, nb);
    poison(RCV, nb);
    loom_alltoall(m, g, SND, RCV, 3, LOOM_I32);
    get(rcv, RCV, nb);
    for (int j = 0; j < N; j++)
        for (int e = 0; e < 3; e++)
            EXPECT(rcv[j * 3 + e] == j * 100 + r * 10 + e, "%s alltoall [%d,%d]", gname(g), j, e);
    /* alltoallv: member r sends (r + j) % 3 elements (some none) to member j, values r*100+j */
    int64_t *sc = loom_malloc(2 * (size_t)N * sizeof(int64_t)), *rc = sc + N;
    size_t so = 0, ro = 0;
    for (int j = 0; j < N; j++) {
        sc[j] = (r + j) % 3;
        rc[j] = (j + r) % 3;
        for (int e = 0; e < sc[j]; e++) snd[so++] = r * 100 + j;
        ro += (size_t)rc[j];
    }
    put(SND, snd, so * sizeof(int32_t));
    poison(RCV, nb);
    loom_alltoallv(m, g, SND, sc, RCV, rc, LOOM_I32);
    get(rcv, RCV, nb);
    for (int j = 0, at = 0; j < N; j++)
        for (int e = 0; e < rc[j]; e++, at++)
            EXPECT(rcv[at] == j * 100 + r, "%s alltoallv from %d [%d] = %d", gname(g), j, e, rcv[at]);
    EXPECT(ro * sizeof(int32_t) == nb || rcv[ro] == -1, "%s alltoallv wrote past its blocks", gname(g));
    free(sc);
    free(snd); free(rcv);
    dfree(SND); dfree(RCV);
    loom_barrier(m, g);
}

/* Point-to-point around the group's ring (member r sends to r + 1): two messages with one tag
 * arrive in the order sent, a receive posted before its send and one after both work, as does
 * a group of one (a member sending to itself); p2p calls and sent bytes are counted. */
static void check_p2p(loom_mesh *m, loom_group g) {
    const int N = loom_mesh_size(m, g), r = loom_mesh_rank(m, g);
    const int next = (r + 1) % N, prev = (r + N - 1) % N;
    const size_t counts[] = {0, 1, 1001};
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        const size_t n = counts[ci], a = n ? n : 1, nf = n * sizeof(float), ni = n * sizeof(int64_t);
        float *s1 = loom_malloc(a * sizeof(float)), *s2 = loom_malloc(a * sizeof(float));
        float *r1 = loom_malloc(a * sizeof(float)), *r2 = loom_malloc(a * sizeof(float));
        int64_t *s3 = loom_malloc(a * sizeof(int64_t)), *r3 = loom_malloc(a * sizeof(int64_t));
        float *S1 = dalloc(nf), *S2 = dalloc(nf), *R1 = dalloc(nf), *R2 = dalloc(nf);
        int64_t *S3 = dalloc(ni), *R3 = dalloc(ni);
        for (size_t i = 0; i < n; i++) {
            s1[i] = (float)val(r, i);
            s2[i] = (float)val(r, i) + 0.5f;
            s3[i] = (int64_t)r * 1000000 + (int64_t)i;
        }
        put(S1, s1, nf);
        put(S2, s2, nf);
        put(S3, s3, ni);
        poison(R1, nf);
        poison(R2, nf);
        poison(R3, ni);
        loom_comm_stats before, after;
        loom_comm_stats_get(m, &before);
        loom_comm_req *q[6];
        q[0] = loom_irecv(m, g, R3, n, LOOM_I64, prev, 9); /* posted before its send */
        q[1] = loom_isend(m, g, S1, n, LOOM_F32, next, 5);
        q[2] = loom_isend(m, g, S2, n, LOOM_F32, next, 5); /* same tag: arrives second */
        q[3] = loom_irecv(m, g, R1, n, LOOM_F32, prev, 5);
        q[4] = loom_irecv(m, g, R2, n, LOOM_F32, prev, 5);
        q[5] = loom_isend(m, g, S3, n, LOOM_I64, next, 9);
        loom_comm_waitall(6, q, "p2p check");
        get(r1, R1, nf);
        get(r2, R2, nf);
        get(r3, R3, ni);
        for (size_t i = 0; i < n; i++) {
            EXPECT(r1[i] == (float)val(prev, i) && r2[i] == (float)val(prev, i) + 0.5f,
                   "%s p2p f32 n=%zu [%zu] = %g, %g", gname(g), n, i, r1[i], r2[i]);
            EXPECT(r3[i] == (int64_t)prev * 1000000 + (int64_t)i, "%s p2p i64 n=%zu [%zu]",
                   gname(g), n, i);
        }
        loom_comm_stats_get(m, &after);
        const double sent = N > 1 ? (double)n * (2 * 4 + 8) : 0;
        EXPECT(after.calls[LOOM_COLL_P2P] - before.calls[LOOM_COLL_P2P] == 6 &&
                   fabs(after.bytes[LOOM_COLL_P2P] - before.bytes[LOOM_COLL_P2P] - sent) < 1e-6,
               "%s p2p stats n=%zu", gname(g), n);
        free(s1); free(s2); free(r1); free(r2); free(s3); free(r3);
        dfree(S1); dfree(S2); dfree(R1); dfree(R2); dfree(S3); dfree(R3);
    }
}

/* The same collectives again allocate nothing (DESIGN 3: no allocation in the step loop): the
 * staged path's bounce buffers and the request records are reused once they exist. One round
 * warms them, the second must not allocate. */
static void check_steady(loom_mesh *m) {
    const size_t n = 3001;
    const int N = loom_mesh_size(m, LOOM_GROUP_WORLD), r = loom_mesh_rank(m, LOOM_GROUP_WORLD);
    float *a = dalloc(n * sizeof(float)), *b = dalloc(n * sizeof(float));
    float *c = dalloc(n * sizeof(float)), *d = dalloc(n * sizeof(float));
    uint64_t calls[3];
    for (int round = 0; round < 3; round++) {
        calls[round] = loom_alloc_calls();
        loom_comm_req *q[4];
        q[0] = loom_iallreduce_sum(m, LOOM_GROUP_WORLD, a, n, LOOM_F32);
        q[1] = loom_ireduce_scatter_sum(m, LOOM_GROUP_WORLD, b, c, 17, LOOM_F32);
        loom_comm_wait(q[1]);
        q[2] = loom_iallgather(m, LOOM_GROUP_WORLD, c, d, n / 3, LOOM_F32);
        loom_comm_wait(q[0]);
        loom_comm_wait(q[2]);
        q[0] = loom_irecv(m, LOOM_GROUP_WORLD, b, 5, LOOM_F32, (r + N - 1) % N, 1);
        q[1] = loom_isend(m, LOOM_GROUP_WORLD, a, 5, LOOM_F32, (r + 1) % N, 1);
        loom_comm_waitall(2, q, "steady p2p");
        loom_allreduce_max(m, LOOM_GROUP_WORLD, d, 7, LOOM_F32);
    }
    EXPECT(calls[2] == calls[1], "collectives allocated %llu times in a repeated round",
           (unsigned long long)(calls[2] - calls[1]));
    dfree(a); dfree(b); dfree(c); dfree(d);
}

static void check_stats(loom_mesh *m) {
    loom_comm_stats_reset(m);
    int N = loom_mesh_size(m, LOOM_GROUP_WORLD);
    float *buf = dalloc(1000 * sizeof(float)), *out = dalloc(1000 * sizeof(float));
    loom_allreduce_sum(m, LOOM_GROUP_WORLD, buf, 1000, LOOM_F32);
    loom_reduce_scatter_sum(m, LOOM_GROUP_WORLD, buf, out, 1000, LOOM_F32);
    loom_allgather(m, LOOM_GROUP_WORLD, out, buf, 1000, LOOM_F32);
    dfree(buf);
    dfree(out);
    loom_barrier(m, LOOM_GROUP_WORLD);
    loom_comm_stats s;
    loom_comm_stats_get(m, &s);
    double want_ar = N > 1 ? 2.0 * (N - 1) / N * 4000 : 0;
    double want_rs = N > 1 ? (double)(N - 1) / N * 4000 : 0;
    EXPECT(s.calls[LOOM_COLL_ALLREDUCE] == 1 && s.calls[LOOM_COLL_BARRIER] == 1 && s.total_calls == 4,
           "stats calls %lld", (long long)s.total_calls);
    EXPECT(fabs(s.bytes[LOOM_COLL_ALLREDUCE] - want_ar) < 1e-6, "allreduce bytes %g want %g",
           s.bytes[LOOM_COLL_ALLREDUCE], want_ar);
    EXPECT(fabs(s.bytes[LOOM_COLL_REDUCE_SCATTER] - want_rs) < 1e-6 &&
               fabs(s.bytes[LOOM_COLL_ALLGATHER] - want_rs) < 1e-6, "rs/ag bytes");
    EXPECT(fabs(s.total_bytes - (want_ar + 2 * want_rs)) < 1e-6, "total bytes");
    EXPECT(s.total_time_s >= 0 && s.total_wait_s >= 0 && s.total_wait_s <= s.total_time_s + 1e-9,
           "times %g %g", s.total_time_s, s.total_wait_s);
    loom_comm_stats_reset(m);
    loom_comm_stats_get(m, &s);
    EXPECT(s.total_calls == 0 && s.total_bytes == 0, "reset");
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: comm_driver MODE [key=value ...]\n");
        return 2;
    }
    const char *mode = argv[1];
    opts o;
    if (parse_opts(argc, argv, &o)) return 2;
    loom_err err;
    if (loom_parallel_start(&argc, &argv, &err)) {
        fprintf(stderr, "comm_driver: %s\n", err.msg);
        return 1;
    }
    int me = loom_comm_world_rank();
    if (!strcmp(mode, "isa")) {
        const char *env = getenv("LOOM_ISA");
        printf("rank %d: kernels %s (this CPU: %s, LOOM_ISA=%s)\n", me,
               loom_isa_name(loom_isa_active()), loom_isa_name(loom_isa_detect()), env ? env : "");
        loom_comm_finalize();
        return 0;
    }
    if (!strcmp(mode, "threads")) {
        printf("rank %d: threads %d\n", me, loom_comm_default_threads());
        loom_comm_finalize();
        return 0;
    }
    loom_mesh *m;
    if (loom_mesh_create(&o.spec, &o.dims, &m, &err)) loom_comm_fail_all(&err);
    if (o.backend && strcmp(o.backend, "host")) {
        g_be = loom_backend_find(o.backend);
        if (!g_be) {
            fprintf(stderr, "comm_driver: backend %s is not in this build (%s)\n", o.backend,
                    loom_backend_names());
            return 77;
        }
        if (loom_backend_ready(g_be, &err)) loom_comm_fail_all(&err);
        if (loom_comm_set_device(m, g_be, &err)) loom_comm_fail_all(&err);
        printf("rank %d: %s buffers, path %s\n", me, g_be->name, loom_comm_path(m));
    }

    if (!strcmp(mode, "mesh")) {
        check_mesh(m);
    } else if (!strcmp(mode, "coll")) {
        for (int g = 0; g < LOOM_GROUP_COUNT; g++) {
            check_group(m, (loom_group)g);
            check_p2p(m, (loom_group)g);
            EXPECT(loom_mesh_group_local(m, (loom_group)g) == !loom_comm_mpi_active(),
                   "local %s", gname((loom_group)g));
        }
        check_steady(m);
        check_stats(m);
        if (!g_fail) printf("rank %d: collectives ok on %d groups\n", me, LOOM_GROUP_COUNT);
    } else if (!strcmp(mode, "single")) {
        EXPECT(!loom_comm_mpi_initialized(), "MPI was initialised in a world of one");
        EXPECT(!loom_comm_mpi_active() && loom_comm_world_size() == 1 && me == 0, "world of one");
        for (int g = 0; g < LOOM_GROUP_COUNT; g++) {
            EXPECT(loom_mesh_size(m, (loom_group)g) == 1 && loom_mesh_rank(m, (loom_group)g) == 0,
                   "group %s", gname((loom_group)g));
            EXPECT(loom_mesh_group_local(m, (loom_group)g), "comm of %s", gname((loom_group)g));
            check_group(m, (loom_group)g);
            check_p2p(m, (loom_group)g);
        }
        check_stats(m);
        EXPECT(!loom_comm_mpi_initialized(), "MPI got initialised by a collective");
        if (!g_fail) printf("rank 0: world of one ok without MPI\n");
    } else if (!strcmp(mode, "unmatched")) {
        float x = 0;
        loom_comm_req *q = loom_irecv(m, LOOM_GROUP_WORLD, &x, 1, LOOM_F32, me, 3);
        loom_comm_waitall(1, &q, "receive nobody sends");
        EXPECT(0, "an unmatched receive completed");
    } else {
        /* misbehaviour modes: every rank runs `after` allreduces, then the bad rank misbehaves
         * while the others go on into more collectives on world */
        for (int i = 0; i < o.after; i++) {
            double x = 1;
            loom_allreduce_sum(m, LOOM_GROUP_WORLD, &x, 1, LOOM_F64);
        }
        if (me == o.bad_rank) {
            fprintf(stderr, "rank %d: misbehaving (%s)\n", me, mode);
            fflush(stderr);
            if (!strcmp(mode, "timeout")) {
                usleep((useconds_t)(o.sleep_s * 1e6));
            } else if (!strcmp(mode, "exit")) {
                exit(3);
            } else if (!strcmp(mode, "fail")) {
                loom_errf(&err, "data/train.bin: bad magic at byte 0");
                loom_comm_fail(&err);
            } else if (!strcmp(mode, "panic")) {
                LOOM_CHECK(o.after < 0);
            } else if (!strcmp(mode, "segv")) {
                raise(SIGSEGV);
            } else if (!strcmp(mode, "kill")) {
                raise(SIGKILL);
            } else {
                fprintf(stderr, "comm_driver: unknown mode %s\n", mode);
                loom_comm_abort(2, "unknown mode");
            }
        }
        for (int i = 0; i < 3; i++) {
            float x[4] = {1, 2, 3, 4};
            loom_allreduce_sum(m, LOOM_GROUP_WORLD, x, 4, LOOM_F32);
        }
        printf("rank %d: survived mode %s\n", me, mode);
    }
    loom_mesh_free(m);
    loom_comm_finalize();
    return g_fail ? 1 : 0;
}
