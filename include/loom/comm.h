/* loom comm: the process mesh (dp x pp x cp x tp, ep carved from dp x cp), checked
 * collectives with a timeout, and the failure behaviour of a distributed run.
 *
 * One process is a world of one: when no launcher started us (no mpirun, no srun --mpi=...)
 * loom_comm_init makes no MPI call at all, every group has one rank and every collective is
 * a local copy. Under a launcher MPI is initialised (MPI_THREAD_FUNNELED: only the main
 * thread calls MPI; OpenMP threads inside kernels never do).
 *
 * Mesh order (TP innermost, DP outermost), for world rank r:
 *     r = ((dp_idx * pp + pp_idx) * cp + cp_idx) * tp + tp_idx
 * EP is carved from dp x cp: with dc = dp_idx * cp + cp_idx, ep_idx = dc % ep and
 * edp_idx = dc / ep. The EP group holds the ranks with the same (pp, tp, edp) indices; the
 * EDP group (expert data parallel: where expert gradients are reduced) the ranks with the same
 * (pp, tp, ep) indices.
 *
 * Failure behaviour: a fatal error on any rank (loom_panic, loom_comm_fail, loom_comm_abort,
 * SIGSEGV/SIGBUS/SIGFPE/SIGABRT/SIGTERM) ends the whole job through MPI_Abort. A collective that
 * does not complete within the mesh's timeout ends the job with a message naming the collective,
 * its group and the ranks of that group that have not entered it yet (see docs/distributed.md).
 *
 * MPI stays inside src/comm/: this header names no MPI type (groups are loom_group, requests
 * loom_comm_req, element types loom_dtype), so a later backend (NCCL) can sit behind the same
 * calls. tests/e2e/test_mpi_confined.sh checks that no file outside src/comm/ uses MPI. */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "loom/base.h"
#include "loom/config.h"

/* ---- process ------------------------------------------------------------------------- */

/* Initialises MPI when a launcher started this process (OMPI_COMM_WORLD_SIZE, PMIX_RANK,
 * PMI_RANK/PMI_SIZE, or srun with SLURM_STEP_NUM_TASKS > 1; LOOM_MPI=1 forces it, LOOM_MPI=0
 * forbids it); otherwise a world of one with no MPI call at all. Under MPI it also installs the
 * fatal hook (loom_panic -> MPI_Abort) and the signal handlers. Idempotent. An error (srun
 * started N tasks but MPI sees a world of one: wrong --mpi plugin) fills err. */
int loom_comm_init(int *argc, char ***argv, loom_err *err);
/* MPI_Finalize when MPI was initialised by loom_comm_init; a no-op otherwise. */
void loom_comm_finalize(void);
/* Whether the MPI library has been initialised in this process (MPI_Initialized: by
 * loom_comm_init or by anyone else) and not finalized. */
int loom_comm_mpi_initialized(void);
int loom_comm_world_rank(void);
int loom_comm_world_size(void);
/* 1 when MPI is up (a launcher started us), 0 for a world of one without MPI. */
int loom_comm_mpi_active(void);
/* One allreduce over the world (a world of one: its own values): *min and *max of every rank's
 * `level`, *all_ok 0 when any rank passed ok 0. Collective over the world when MPI is up. Used
 * to agree on the kernels' instruction-set level (loom_parallel_start, include/loom/parallel.h):
 * comm itself does not depend on the kernels. */
int loom_comm_world_agree(int level, int ok, int *min, int *max, int *all_ok, loom_err *err);

/* Threads per rank: OMP_NUM_THREADS when set to a positive integer (the user's explicit choice,
 * e.g. mpirun -x OMP_NUM_THREADS=4); otherwise max(1, min(CPUs in this process's affinity mask,
 * CPUs of the node / ranks on the node, SLURM_CPUS_PER_TASK when set)); ranks on the node come
 * from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Collective over the world when MPI is up (call
 * it on every rank, e.g. right after loom_comm_init). */
int loom_comm_default_threads(void);
/* Ranks on this node (MPI_COMM_TYPE_SHARED), 1 without MPI. Collective over the world when
 * MPI is up. */
int loom_comm_node_ranks(void);

/* Ends the whole job: prints "loom: rank R: <message>" to stderr, then MPI_Abort(world, code)
 * when MPI is up, exit(code) otherwise. */
void loom_comm_abort(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
/* "Bad input seen by one rank": prints "loom: rank R: error: <err->msg>" and ends the whole
 * job with exit code 1 (MPI_Abort under MPI, exit(1) otherwise). */
void loom_comm_fail(const loom_err *err) __attribute__((noreturn));
/* An error every rank sees identically (a config or layout error): rank 0 prints it once and
 * ends the job; the other ranks wait up to 5 s for that, then end it themselves. */
void loom_comm_fail_all(const loom_err *err) __attribute__((noreturn));

/* ---- mesh ---------------------------------------------------------------------------- */

typedef enum loom_group {
    LOOM_GROUP_WORLD = 0,
    LOOM_GROUP_DP,   /* data parallel: same (pp, cp, tp) */
    LOOM_GROUP_TP,   /* tensor parallel: consecutive world ranks */
    LOOM_GROUP_PP,   /* pipeline stages: same (dp, cp, tp) */
    LOOM_GROUP_CP,   /* context parallel: same (dp, pp, tp) */
    LOOM_GROUP_EP,   /* expert parallel: same (pp, tp, edp), ep ranks of dp x cp */
    LOOM_GROUP_DPCP, /* dp x cp: same (pp, tp); where dense gradients are reduced with cp > 1 */
    LOOM_GROUP_EDP,  /* expert data parallel: same (pp, tp, ep); where expert gradients go */
    LOOM_GROUP_COUNT
} loom_group;

/* Degrees of parallelism (each >= 1). dp_auto: dp = world / (tp * pp * cp). timeout_s: how long
 * a collective may take before the job is ended (> 0). */
typedef struct loom_mesh_spec {
    int dp, tp, pp, cp, ep;
    int dp_auto;
    double timeout_s;
} loom_mesh_spec;

/* What the model needs divisible. A field <= 0 is not checked. */
typedef struct loom_mesh_dims {
    int n_head;    /* H:   % tp */
    int n_kv_head; /* KVH: % tp */
    int n_layer;   /* L:   % pp */
    int seq_len;   /* T:   % cp */
    int n_expert;  /* E:   % ep (ep > 1 needs E > 0) */
} loom_mesh_dims;

/* The parallel.* keys (dp, tp, pp, cp, ep, timeout_s) for a config schema. */
extern const loom_config_key loom_comm_config_keys[];
extern const int loom_comm_config_nkeys;

/* defaults: all degrees 1, dp_auto = 1, timeout 600 s */
void loom_mesh_spec_default(loom_mesh_spec *s);
/* Reads parallel.dp (an integer or "auto"), .tp, .pp, .cp, .ep, .timeout_s; an absent key keeps
 * its default. Errors name the key, its value and where it was set. */
int loom_mesh_spec_from_config(const loom_config *c, loom_mesh_spec *s, loom_err *err);
/* Checks a layout against a world size and model dims without building anything (no MPI). The
 * error names the parallel.* key and the model.* key involved. *out gets dp resolved. */
int loom_mesh_validate(const loom_mesh_spec *s, int world_size, const loom_mesh_dims *dims,
                       loom_mesh_spec *out, loom_err *err);

/* A world rank's coordinates in a resolved spec (dp filled in): rank = ((dp * pp + pp_i) * cp
 * + cp_i) * tp + tp_i (tp innermost); dc = dp * cp + cp_i (its rank in the dp x cp group), ep
 * = dc % ep, edp = dc / ep. Pure arithmetic, no MPI (the planner asks about any rank). */
typedef struct loom_mesh_coords {
    int dp, pp, cp, tp, ep, edp, dc;
} loom_mesh_coords;
loom_mesh_coords loom_mesh_coords_of(const loom_mesh_spec *s, int rank);

typedef struct loom_mesh loom_mesh;

/* Validates the spec against the world size and dims (dims may be NULL), then builds every
 * group's communicator with MPI_Comm_split (collective over the world: every rank calls it with
 * the same spec) and the progress window used to name missing ranks on a timeout. A world of
 * one without MPI gets MPI_COMM_NULL communicators. */
int loom_mesh_create(const loom_mesh_spec *s, const loom_mesh_dims *dims, loom_mesh **out,
                     loom_err *err);
/* Collective over the world. NULL is a no-op. */
void loom_mesh_free(loom_mesh *m);

int loom_mesh_rank(const loom_mesh *m, loom_group g);
int loom_mesh_size(const loom_mesh *m, loom_group g);
/* 1 when group g has no communicator (a world of one without MPI): its collectives are local
 * copies and its point-to-point messages are matched inside this process. */
int loom_mesh_group_local(const loom_mesh *m, loom_group g);
/* World rank of the group's member number i (0 <= i < size). */
int loom_mesh_group_world_rank(const loom_mesh *m, loom_group g, int i);
/* The resolved spec (dp filled in). */
const loom_mesh_spec *loom_mesh_layout(const loom_mesh *m);
const char *loom_group_name(loom_group g);
/* "dp=2 tp=2 pp=1 cp=1 ep=1 (world 4)" into buf; returns buf. */
char *loom_mesh_describe(const loom_mesh *m, char *buf, size_t size);

/* ---- checked collectives -------------------------------------------------------------
 * Each waits by polling MPI_Test with backoff; when it has not completed within the mesh's
 * timeout it prints "loom: rank R: allreduce #17 on dp (4 ranks) did not complete within 600 s;
 * ranks still missing: 2, 3" (world ranks that have not entered collective #17 on that group)
 * and aborts the job. Counts are element counts; buffers must not alias unless stated. On a
 * group of one rank each is a local copy. All members of a group must call the group's
 * collectives in the same order (as MPI requires). */

/* LOOM_BF16: bf16 elements (uint16_t) moved, never summed or maxed (a reduction refuses it:
 * bf16 sums are taken in fp32); the pipeline's bf16 stream (training.precision bf16) */
typedef enum loom_dtype { LOOM_F32 = 0, LOOM_F64, LOOM_I32, LOOM_I64, LOOM_U8, LOOM_BF16 } loom_dtype;
size_t loom_dtype_size(loom_dtype t);

/* In-place sum over the group. Sum is only defined for the numeric types (all of them). */
void loom_allreduce_sum(loom_mesh *m, loom_group g, void *buf, size_t count, loom_dtype t);
/* Max (e.g. for a global grad-norm check or "any rank saw a NaN"). */
void loom_allreduce_max(loom_mesh *m, loom_group g, void *buf, size_t count, loom_dtype t);
/* Sum of send (count elements on every rank), scattered: rank i of the group gets the slice
 * loom_split(count, size, i) into recv. count need not be divisible by the group size: the
 * first count % size ranks get one element more. */
void loom_reduce_scatter_sum(loom_mesh *m, loom_group g, const void *send, void *recv,
                             size_t count, loom_dtype t);
/* Inverse layout: rank i contributes its slice loom_split(count, size, i) (send) and every
 * rank gets all count elements in recv. send may point into recv at its own slice. */
void loom_allgather(loom_mesh *m, loom_group g, const void *send, void *recv, size_t count,
                    loom_dtype t);
/* Equal blocks: send holds size blocks of block elements; block j goes to member j. */
void loom_alltoall(loom_mesh *m, loom_group g, const void *send, void *recv, size_t block,
                   loom_dtype t);
/* Variable blocks: send_counts[j] elements of send (blocks in member order) go to member j;
 * recv_counts[i] elements from member i land in recv, in member order. Each member's
 * recv_counts[i] must be member i's send_counts[this member]. Accounted as alltoall (bytes:
 * what this rank sends to other members). */
void loom_alltoallv(loom_mesh *m, loom_group g, const void *send, const int64_t *send_counts,
                    void *recv, const int64_t *recv_counts, loom_dtype t);
/* root is the member number in the group (0 <= root < size). */
void loom_broadcast(loom_mesh *m, loom_group g, void *buf, size_t count, loom_dtype t, int root);
void loom_barrier(loom_mesh *m, loom_group g);

/* The slice of n elements that member i of `size` owns: [*off, *off + *len). */
void loom_split(size_t n, int size, int i, size_t *off, size_t *len);

/* Non-blocking variants: start now, complete in loom_comm_wait (the timeout counts the time
 * spent in the wait, so compute overlapped with the collective never counts against it).
 * Buffers must stay untouched until then. A request is freed by the wait. */
typedef struct loom_comm_req loom_comm_req;
loom_comm_req *loom_iallreduce_sum(loom_mesh *m, loom_group g, void *buf, size_t count,
                                   loom_dtype t);
loom_comm_req *loom_ireduce_scatter_sum(loom_mesh *m, loom_group g, const void *send, void *recv,
                                        size_t count, loom_dtype t);
loom_comm_req *loom_iallgather(loom_mesh *m, loom_group g, const void *send, void *recv,
                               size_t count, loom_dtype t);
void loom_comm_wait(loom_comm_req *r);
/* 1 when complete (the request is then freed and must not be used again), 0 otherwise. */
int loom_comm_test(loom_comm_req *r);

/* Point-to-point (pipeline stages, ring attention's K/V exchange): count elements to / from
 * member `peer` of group g (0 <= peer < size; itself included), told apart by tag
 * (0 <= tag <= 32767); messages between two members with one tag arrive in the order sent. A
 * receive's count and type must be the sender's. Start now, complete in
 * loom_comm_wait / loom_comm_waitall; buffers stay untouched until then. Accounted as p2p
 * (bytes: what this rank sends). On a local group a send and a receive of the same tag are
 * matched in the order posted and copied at once. */
loom_comm_req *loom_isend(loom_mesh *m, loom_group g, const void *buf, size_t count,
                          loom_dtype t, int peer, int tag);
loom_comm_req *loom_irecv(loom_mesh *m, loom_group g, void *buf, size_t count, loom_dtype t,
                          int peer, int tag);
/* Checked wait for n requests (NULL entries skipped; each freed): the mesh's timeout applies
 * and `what` (e.g. "pipeline recv of stage 2") names them in the message. */
void loom_comm_waitall(int n, loom_comm_req **reqs, const char *what);

/* ---- accounting ----------------------------------------------------------------------
 * Per kind of collective: calls, bytes sent by this rank as a ring algorithm would send them
 * (allreduce 2(N-1)/N * bytes, reduce-scatter / allgather / alltoall (N-1)/N * bytes of the full
 * buffer, broadcast bytes for N > 1, barrier 0), seconds from start to observed completion, and
 * seconds spent blocked in a wait. Groups of one rank count calls only. */
typedef enum loom_coll_kind {
    LOOM_COLL_ALLREDUCE = 0,
    LOOM_COLL_REDUCE_SCATTER,
    LOOM_COLL_ALLGATHER,
    LOOM_COLL_ALLTOALL,
    LOOM_COLL_BROADCAST,
    LOOM_COLL_BARRIER,
    LOOM_COLL_P2P,
    LOOM_COLL_KIND_COUNT
} loom_coll_kind;
typedef struct loom_comm_stats {
    int64_t calls[LOOM_COLL_KIND_COUNT];
    double bytes[LOOM_COLL_KIND_COUNT];
    double time_s[LOOM_COLL_KIND_COUNT];
    double wait_s[LOOM_COLL_KIND_COUNT];
    /* sums over the kinds */
    int64_t total_calls;
    double total_bytes, total_time_s, total_wait_s;
} loom_comm_stats;
const char *loom_coll_kind_name(loom_coll_kind k);
/* Copies the counters accumulated since the last reset (totals filled in). */
void loom_comm_stats_get(const loom_mesh *m, loom_comm_stats *out);
void loom_comm_stats_reset(loom_mesh *m);

/* An observer of every collective and point-to-point request as it completes (the profiler's
 * per-collective spans): kind, group, the bytes accounted (as above), start and completion
 * (loom_now() seconds) and the seconds spent blocked waiting for it. Called on the thread that
 * completes the request. NULL removes it. */
typedef void (*loom_comm_observer)(void *ctx, loom_coll_kind kind, loom_group g, double bytes,
                                   double t0, double t1, double waited);
void loom_comm_set_observer(loom_mesh *m, loom_comm_observer fn, void *ctx);
/* Device buffers (docs/engine.md "Memory through the backend"): begin / end are called around
 * every MPI call and local copy that touches a collective's or message's buffers, as a
 * CUDA-aware MPI or NCCL reaches device memory; the trainer passes its backend's comm_begin /
 * comm_end (cpu: nothing; cpu-guard: its memory is reachable between them). NULL: none. */
void loom_comm_set_device_window(loom_mesh *m, void (*begin)(void), void (*end)(void));

/* Tells the mesh whose buffers its collectives and messages carry (the trainer's backend,
 * include/loom/backend.h) and picks the path to them, the same on every rank:
 *   direct  MPI on the buffers, inside the backend's comm_begin / comm_end window (set as by
 *           loom_comm_set_device_window): host memory (cpu), or host memory the window makes
 *           reachable (cpu-guard);
 *   staged  each collective copies its device send buffer to a host bounce buffer (mem_d2h),
 *           runs MPI there and copies the result back (mem_h2d); the non-blocking ones copy in
 *           at the start and back at completion (wait / test); groups of one copy with
 *           mem_d2d. MPI never sees the backend's memory. Taken by cuda-emu, by cuda when
 *           ranks share a GPU (LOOM_CUDA_SHARE_GPU=1, or two ranks' GPUs have one UUID; not
 *           under NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1) or NCCL fails to start, and
 *           by any backend whose memory is not host memory under LOOM_COMM_STAGE=1 (tests);
 *   nccl    cuda: an NCCL communicator per group of several ranks (groups with the same
 *           members share one), the collectives on the backend's stream, each request's
 *           completion awaited through an event (NCCL's asynchronous errors checked while
 *           waiting, the mesh's timeout applies); point-to-point messages staged as above.
 * The staged and nccl paths are said once in the log (world rank 0). Collective over the world
 * (every rank calls it with the same backend); again with the same backend a no-op; with another
 * one an error once the path is staged or nccl (a direct path is simply replaced), as is a path
 * that would differ between ranks. NULL: host buffers, no window.
 * docs/distributed.md "Device buffers", docs/gpu.md "Communication". */
struct loom_backend;
int loom_comm_set_device(loom_mesh *m, const struct loom_backend *be, loom_err *err);
/* The path loom_comm_set_device chose: "direct", "staged" or "nccl". */
const char *loom_comm_path(const loom_mesh *m);

#endif
