/* The NCCL calls src/comm makes on the `cuda` backend's device buffers, implemented by
 * src/cuda/cu_nccl.cu (compiled only in the nvcc build: LOOM_HAVE_CUDA). No CUDA or NCCL type
 * appears here: communicators and events are opaque, element types are comm.h's loom_dtype,
 * a unique id is LOOM_NCCL_ID_BYTES opaque bytes (src/comm broadcasts them over MPI).
 *
 * Every operation is enqueued on the backend's one stream (cu_stream), after the host thread's
 * device is selected (cu_enter). Each returns 0, or -1 with NCCL's (or CUDA's) error and
 * NCCL's last error text in why; src/comm turns that into a job-ending message naming the rank,
 * the collective and the group. Communicators are nonblocking (ncclConfig_t.blocking = 0): an
 * init or an enqueue that NCCL reports in progress is settled here before returning, so a
 * caller sees only success or failure; init alone is polled by src/comm (loom_nccl_state), so
 * that the mesh's timeout bounds it. docs/gpu.md "Communication". */
#ifndef LOOM_COMM_NCCL_H
#define LOOM_COMM_NCCL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "loom/comm.h"

#define LOOM_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES (cu_nccl.cu checks it) */

typedef struct loom_nccl loom_nccl; /* one NCCL communicator */

/* NCCL's version as ncclGetVersion reports it (2.28.9: 22809) */
int loom_nccl_version(void);
/* the UUID of the GPU this rank uses (16 bytes): two ranks that share a GPU see the same one
 * (UUIDs are unique across machines too) */
int loom_nccl_gpu_uuid(unsigned char uuid[16], char *why, size_t n);
/* ncclGetUniqueId into id (LOOM_NCCL_ID_BYTES) */
int loom_nccl_unique_id(void *id, char *why, size_t n);
/* starts ncclCommInitRankConfig (nonblocking) of member `rank` of `nranks`; poll
 * loom_nccl_state until it is ready */
int loom_nccl_init_start(loom_nccl **out, int nranks, int rank, const void *id, char *why,
                         size_t n);
/* ncclCommGetAsyncError: 1 ready (no error), 0 still in progress, -1 failed (why) */
int loom_nccl_state(loom_nccl *c, char *why, size_t n);
/* ncclCommAbort (an error, or a timeout: pending work is dropped); frees c */
void loom_nccl_abort(loom_nccl *c);
/* ncclCommFinalize + ncclCommDestroy after the stream's work is done; frees c. NULL: no-op */
void loom_nccl_free(loom_nccl *c);

/* collectives (counts in elements of t; reductions refuse LOOM_BF16 as the MPI path does) */
int loom_nccl_allreduce(loom_nccl *c, void *buf, size_t count, loom_dtype t, int max, char *why,
                        size_t n);
/* MPI_Reduce_scatter_block's layout: recvcount elements per member */
int loom_nccl_reduce_scatter(loom_nccl *c, const void *send, void *recv, size_t recvcount,
                             loom_dtype t, char *why, size_t n);
/* sum of count elements onto member root (recv is written on root only) */
int loom_nccl_reduce(loom_nccl *c, const void *send, void *recv, size_t count, loom_dtype t,
                     int root, char *why, size_t n);
/* equal slices of bytes per member, in member order; in place when send == recv + rank*bytes */
int loom_nccl_allgather(loom_nccl *c, const void *send, void *recv, size_t bytes, char *why,
                        size_t n);
/* bytes from member root's send into every member's recv (in place when send == recv) */
int loom_nccl_broadcast(loom_nccl *c, const void *send, void *recv, size_t bytes, int root,
                        char *why, size_t n);
int loom_nccl_send(loom_nccl *c, const void *buf, size_t bytes, int peer, char *why, size_t n);
int loom_nccl_recv(loom_nccl *c, void *buf, size_t bytes, int peer, char *why, size_t n);
/* ncclGroupStart / ncclGroupEnd around a set of the calls above (c: the communicator whose
 * state settles the group) */
int loom_nccl_group_start(char *why, size_t n);
int loom_nccl_group_end(loom_nccl *c, char *why, size_t n);

/* completion events on the stream (a request's end) */
void *loom_nccl_event_new(void);
void loom_nccl_event_free(void *e);
int loom_nccl_event_record(void *e, char *why, size_t n);
/* 1 when everything enqueued before the record has completed, 0 not yet, -1 a CUDA error */
int loom_nccl_event_done(void *e, char *why, size_t n);

#ifdef __cplusplus
}
#endif

#endif
