/* Device buffers: the path a mesh's collectives take to the buffers of the backend they carry
 * (loom_comm_set_device), and the `cuda` backend's NCCL communicators, one per group of several
 * ranks, their unique ids broadcast over the group's MPI communicator. docs/distributed.md
 * "Device buffers", docs/gpu.md "Communication". */
#include "comm_internal.h"
#include "loom/backend.h"
#ifdef LOOM_HAVE_CUDA
#include "comm_nccl.h"
#endif

#include <sched.h>
#include <stdlib.h>
#include <string.h>

static const char *path_names[] = {"direct", "staged", "nccl"};

const char *loom_comm_path(const loom_mesh *m) {
    LOOM_CHECK(m);
    return path_names[m->path];
}

/* LOOM_COMM_STAGE: unset / "0" (the path the backend asks for) or "1" (staged) */
static int stage_forced(int *out, loom_err *err) {
    const char *v = getenv("LOOM_COMM_STAGE");
    *out = 0;
    if (!v || !*v || !strcmp(v, "0")) return 0;
    if (!strcmp(v, "1")) return *out = 1, 0;
    return loom_errf(err, "LOOM_COMM_STAGE=%s: expected 0 or 1", v);
}

#ifdef LOOM_HAVE_CUDA
/* 1 on every rank when all passed ok 1 (a world of one: ok itself) */
static int all_ok(const loom_mesh *m, int ok) {
    if (!m->mpi) return ok;
    int all = ok;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

static void drop_nccl(loom_mesh *m) {
    for (int g = 0; g < LOOM_GROUP_COUNT; g++) {
        if (m->g[g].nccl_owner) loom_nccl_abort(m->g[g].nccl);
        m->g[g].nccl = NULL;
        m->g[g].nccl_owner = 0;
    }
}

/* A communicator for every group of several ranks (LOOM_COMM_NCCL_SOLO=1: groups of one too,
 * so that one GPU runs every collective through NCCL: tests/gpu/test_cuda_comm.c), created in
 * group order on every rank (each init is collective over its group, so the same order
 * everywhere cannot deadlock); a group with the same members as an earlier one shares its
 * communicator. After each group all ranks agree, so one rank's failure stops them all at the
 * same point. 0, or -1 with the reason (then no communicator is left). */
static int nccl_setup(loom_mesh *m, char *why, size_t nwhy) {
    const char *solo_env = getenv("LOOM_COMM_NCCL_SOLO");
    const int solo = solo_env && !strcmp(solo_env, "1");
    const char *share = getenv("LOOM_CUDA_SHARE_GPU");
    /* NCCL 2.30 lets several ranks use one GPU when asked (experimental) */
    const char *multi = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    const int nccl_shares = multi && !strcmp(multi, "1") && loom_nccl_version() >= 23000;
    int ok = 1;
    why[0] = 0;
    if (share && !strcmp(share, "1") && !nccl_shares) {
        ok = 0;
        snprintf(why, nwhy, "LOOM_CUDA_SHARE_GPU=1");
    }
    /* ranks on one GPU: NCCL refuses them ("Duplicate GPU detected"), found here first */
    unsigned char uuid[16] = {0};
    if (ok && loom_nccl_gpu_uuid(uuid, why, nwhy)) ok = 0;
    if (m->mpi && !nccl_shares) {
        unsigned char *all = loom_calloc((size_t)m->world_size, 16);
        MPI_Allgather(uuid, 16, MPI_BYTE, all, 16, MPI_BYTE, MPI_COMM_WORLD);
        for (int i = 0; i < m->world_size && ok; i++)
            if (i != m->world_rank && !memcmp(all + (size_t)i * 16, uuid, 16)) {
                ok = 0;
                snprintf(why, nwhy, "world ranks %d and %d share one GPU (NCCL refuses that)",
                         i < m->world_rank ? i : m->world_rank,
                         i < m->world_rank ? m->world_rank : i);
            }
        free(all);
    }
    if (!all_ok(m, ok)) {
        if (!why[0]) snprintf(why, nwhy, "another rank cannot use NCCL (its log says why)");
        return -1;
    }
    for (int g = 0; g < LOOM_GROUP_COUNT; g++) {
        comm_group *cg = &m->g[g];
        if (cg->size == 1 && !solo) continue;
        for (int h = 0; h < g && !cg->nccl; h++) {
            const comm_group *o = &m->g[h];
            if (o->nccl && o->size == cg->size &&
                !memcmp(o->members, cg->members, (size_t)cg->size * sizeof(int)))
                cg->nccl = o->nccl;
        }
        if (cg->nccl) continue;
        struct {
            int ok;
            unsigned char id[LOOM_NCCL_ID_BYTES];
        } msg;
        memset(&msg, 0, sizeof msg);
        if (cg->rank == 0) msg.ok = loom_nccl_unique_id(msg.id, why, nwhy) == 0;
        if (cg->size > 1) MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, cg->comm);
        ok = msg.ok;
        if (!ok && !why[0])
            snprintf(why, nwhy, "ncclGetUniqueId failed on the group's first rank");
        loom_nccl *c = NULL;
        if (ok && loom_nccl_init_start(&c, cg->size, cg->rank, msg.id, why, nwhy)) ok = 0;
        const double deadline = loom_now() + m->spec.timeout_s;
        while (ok) {
            const int st = loom_nccl_state(c, why, nwhy);
            if (st > 0) break;
            if (st < 0) ok = 0;
            else if (loom_now() > deadline) {
                snprintf(why, nwhy, "ncclCommInitRank on %s did not complete within %g s",
                         loom_group_name((loom_group)g), m->spec.timeout_s);
                ok = 0;
            } else {
                sched_yield();
            }
        }
        if (c && !ok) loom_nccl_abort(c);
        else if (c) {
            cg->nccl = c;
            cg->nccl_owner = 1;
        }
        if (!all_ok(m, ok)) {
            if (!why[0]) snprintf(why, nwhy, "NCCL failed on another rank (its log says why)");
            drop_nccl(m);
            return -1;
        }
    }
    return 0;
}
#endif

int loom_comm_set_device(loom_mesh *m, const loom_backend *be, loom_err *err) {
    LOOM_CHECK(m);
    if (m->be == be) return 0;
    /* a direct path holds nothing: another backend may replace it */
    if (m->be && m->path != PATH_DIRECT)
        return loom_errf(err, "this mesh carries %s buffers already: it cannot carry %s buffers "
                              "too", m->be->name, be ? be->name : "host");
    int force = 0;
    if (stage_forced(&force, err)) return -1;
    comm_path want = PATH_DIRECT;
    const char *reason = "";
    if (be && !be->host_memory) {
        if (force) {
            want = PATH_STAGED;
            reason = "LOOM_COMM_STAGE=1";
        } else if (!strcmp(be->name, "cuda")) {
            want = PATH_NCCL;
        } else if (!strcmp(be->name, "cuda-emu")) {
            /* the emulator's buffers stand for GPU memory, which plain MPI cannot reach */
            want = PATH_STAGED;
            reason = "the cuda-emu backend's memory stands for a GPU's";
        }
        /* any other (cpu-guard): host memory, reachable inside the backend's window */
    }
    /* host memory takes the direct path on every rank whatever the environment says: only
     * device memory needs the ranks to agree */
    if (m->mpi && be && !be->host_memory) {
        int v[2] = {(int)want, -(int)want}, r[2];
        MPI_Allreduce(v, r, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (r[0] != -r[1])
            return loom_errf(err, "the ranks' collectives would take different paths to the "
                                  "%s buffers (%s here): every rank needs the same backend and "
                                  "the same LOOM_COMM_STAGE", be ? be->name : "host",
                             path_names[want]);
    }
    char why[512] = "";
    if (want == PATH_NCCL) {
#ifdef LOOM_HAVE_CUDA
        if (nccl_setup(m, why, sizeof why)) want = PATH_STAGED;
#else
        snprintf(why, sizeof why, "this build has no NCCL");
        want = PATH_STAGED;
#endif
        reason = why;
    }
    m->be = be;
    m->path = want;
    if (want == PATH_DIRECT) {
        m->win_begin = be ? be->comm_begin : NULL;
        m->win_end = be ? be->comm_end : NULL;
        return 0;
    }
    /* staged and NCCL: MPI never touches the backend's buffers, so no window */
    m->win_begin = m->win_end = NULL;
    if (m->world_rank == 0) {
        if (want == PATH_STAGED)
            loom_log("comm: collectives on %s buffers are staged through host memory over MPI "
                     "(%s): slower than NCCL (docs/gpu.md \"Communication\")", be->name, reason);
#ifdef LOOM_HAVE_CUDA
        else {
            const int v = loom_nccl_version();
            int n = 0;
            for (int g = 0; g < LOOM_GROUP_COUNT; g++) n += m->g[g].nccl_owner;
            /* a world of one has nothing to say */
            if (n)
                loom_log("comm: NCCL %d.%d.%d on %s buffers: %d communicator%s (point-to-point "
                         "messages staged through host memory over MPI)", v / 10000,
                         v / 100 % 100, v % 100, be->name, n, n == 1 ? "" : "s");
        }
#endif
    }
    return 0;
}

void comm_free_device(loom_mesh *m) {
#ifdef LOOM_HAVE_CUDA
    for (int g = 0; g < LOOM_GROUP_COUNT; g++) {
        if (m->g[g].nccl_owner) loom_nccl_free(m->g[g].nccl);
        m->g[g].nccl = NULL;
        m->g[g].nccl_owner = 0;
    }
#else
    (void)m;
#endif
}
