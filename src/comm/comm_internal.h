/* comm internals shared by process.c, mesh.c and collectives.c: the only place (with those
 * files) where MPI appears. */
#ifndef LOOM_COMM_INTERNAL_H
#define LOOM_COMM_INTERNAL_H

#include <mpi.h>

#include "loom/comm.h"

/* Progress each rank publishes in the world window (int64 slots per rank):
 *   [0, LOOM_GROUP_COUNT)  number of collectives entered on each group
 *   PROG_LAST_GROUP, PROG_LAST_KIND, PROG_LAST_SEQ: the most recent one entered
 *   PROG_DONE: 1 when that most recent one has completed on this rank */
enum {
    PROG_LAST_GROUP = LOOM_GROUP_COUNT,
    PROG_LAST_KIND,
    PROG_LAST_SEQ,
    PROG_DONE,
    PROG_SLOTS
};

/* How collectives reach the buffers (loom_comm_set_device, device.c) */
typedef enum comm_path {
    PATH_DIRECT = 0, /* MPI and local copies on the buffers, inside the backend's window */
    PATH_STAGED,     /* MPI on host bounce buffers (mem_d2h / mem_h2d), local copies mem_d2d */
    PATH_NCCL,       /* NCCL on the groups of several ranks; point-to-point staged */
} comm_path;

struct loom_nccl;
struct loom_backend;

/* a host bounce buffer of the staged path (collectives.c): the mesh keeps them for reuse, each
 * lent to one request at a time */
typedef struct comm_bounce {
    char *p;
    size_t cap;
    int busy;
} comm_bounce;

typedef struct comm_group {
    MPI_Comm comm;  /* MPI_COMM_NULL without MPI */
    struct loom_nccl *nccl; /* PATH_NCCL, groups of several ranks: the communicator (shared
                             * with an earlier group of the same members: nccl_owner 0) */
    int nccl_owner;
    int rank, size; /* this rank's member number, member count */
    int *members;   /* (size) world ranks, by member number */
    int64_t seq;    /* collectives entered on this group so far */
} comm_group;

struct loom_mesh {
    loom_mesh_spec spec; /* resolved: dp filled in */
    int world_rank, world_size;
    int mpi;             /* MPI is up */
    comm_group g[LOOM_GROUP_COUNT];
    MPI_Win win;         /* progress window over the world (when win_ok) */
    int64_t *progress;   /* (PROG_SLOTS) this rank's slots: window memory, or local */
    int win_ok;
    loom_comm_stats stats;
    loom_comm_observer observer; /* loom_comm_set_observer; NULL = none */
    void *observer_ctx;
    struct loom_comm_req *free_reqs; /* finished request records, reused (no allocation per
                                      * collective once the list has grown) */
    /* local groups (no communicator): point-to-point requests posted but not matched yet,
     * oldest first (collectives.c) */
    struct loom_comm_req *local_sends, *local_recvs;
    /* loom_comm_set_device_window: opened around every MPI call and local copy that touches
     * a collective's buffers (NULL: none) */
    void (*win_begin)(void);
    void (*win_end)(void);
    /* loom_comm_set_device: the backend whose buffers the collectives carry (NULL: none,
     * host memory) and the path chosen for it */
    const struct loom_backend *be;
    comm_path path;
    comm_bounce *bounces; /* (nbounces) the staged path's host buffers */
    int nbounces;
};

/* device.c: the NCCL communicators go (loom_mesh_free) */
void comm_free_device(loom_mesh *m);

/* collectives.c: frees the request records kept for reuse */
void comm_free_request_pool(loom_mesh *m);

/* process.c */
int comm_mpi_up(void);

#endif
