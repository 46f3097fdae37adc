/* NCCL for src/comm (src/comm/comm_nccl.h): communicators, the collectives and point-to-point
 * calls on the backend's stream, completion events. Only the nvcc build has it (the emulator
 * has no NCCL: its meshes stage through host memory). docs/gpu.md "Communication". */
#ifndef LOOM_CUDA_EMU
#include "cu_common.cuh"

#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_nccl.h"

#include <dlfcn.h>
#include <pthread.h>

static_assert(LOOM_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId's size");

/* NCCL is opened at run time (dlopen), not linked: a process that loads libloom and then
 * PyTorch (whose libtorch_cuda wants its own, newer libnccl.so.2 by the same name: the
 * reference tests' ctypes) would otherwise bind PyTorch to ours and fail on the symbols ours
 * lacks; and a GPU image may hold NCCL only in PyTorch's nvidia-nccl wheel
 * (LD_LIBRARY_PATH). Only nccl.h's types and declarations are used at build time. */
namespace {
#define LOOM_NCCL_FNS(X)                                                                     \
    X(AllGather) X(AllReduce) X(Broadcast) X(CommAbort) X(CommDestroy) X(CommFinalize)       \
    X(CommGetAsyncError) X(CommInitRankConfig) X(GetErrorString) X(GetLastError)             \
    X(GetUniqueId) X(GetVersion) X(GroupEnd) X(GroupStart) X(Recv) X(Reduce)                 \
    X(ReduceScatter) X(Send)
struct nccl_api {
#define LOOM_NCCL_PTR(name) decltype(&nccl##name) name;
    LOOM_NCCL_FNS(LOOM_NCCL_PTR)
#undef LOOM_NCCL_PTR
};
nccl_api g_api;
pthread_once_t g_api_once = PTHREAD_ONCE_INIT;
char g_api_err[512];
void api_load(void) {
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_api_err, sizeof g_api_err, "NCCL is not installed where the loader looks "
                 "(dlopen libnccl.so.2: %s; LD_LIBRARY_PATH names its folder)", dlerror());
        return;
    }
#define LOOM_NCCL_SYM(name)                                                                  \
    g_api.name = (decltype(g_api.name))dlsym(h, "nccl" #name);                               \
    if (!g_api.name && !g_api_err[0])                                                        \
        snprintf(g_api_err, sizeof g_api_err, "libnccl.so.2 has no nccl" #name " (too old)");
    LOOM_NCCL_FNS(LOOM_NCCL_SYM)
#undef LOOM_NCCL_SYM
}
/* 0 when NCCL is there, else -1 with the reason */
int api_ready(char *why, size_t n) {
    pthread_once(&g_api_once, api_load);
    if (!g_api_err[0]) return 0;
    if (why && n) snprintf(why, n, "%s", g_api_err);
    return -1;
}
} // namespace
/* the rest of this file calls NCCL through the opened library */
#define ncclAllGather (g_api.AllGather)
#define ncclAllReduce (g_api.AllReduce)
#define ncclBroadcast (g_api.Broadcast)
#define ncclCommAbort (g_api.CommAbort)
#define ncclCommDestroy (g_api.CommDestroy)
#define ncclCommFinalize (g_api.CommFinalize)
#define ncclCommGetAsyncError (g_api.CommGetAsyncError)
#define ncclCommInitRankConfig (g_api.CommInitRankConfig)
#define ncclGetErrorString (g_api.GetErrorString)
#define ncclGetLastError (g_api.GetLastError)
#define ncclGetUniqueId (g_api.GetUniqueId)
#define ncclGetVersion (g_api.GetVersion)
#define ncclGroupEnd (g_api.GroupEnd)
#define ncclGroupStart (g_api.GroupStart)
#define ncclRecv (g_api.Recv)
#define ncclReduce (g_api.Reduce)
#define ncclReduceScatter (g_api.ReduceScatter)
#define ncclSend (g_api.Send)

struct loom_nccl {
    ncclComm_t comm;
};

namespace LOOM_CU_NS {

static int fail_nccl(ncclComm_t comm, ncclResult_t r, const char *what, char *why, size_t n) {
    const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    if (why && n)
        snprintf(why, n, "%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
                 last ? last : "");
    return -1;
}

/* a nonblocking communicator's call that NCCL reports in progress: wait for its state */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
    while (r == ncclInProgress) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(comm, &st);
        if (q != ncclSuccess) return q;
        r = st;
        if (r == ncclInProgress) sched_yield();
    }
    return r;
}

static int checked(loom_nccl *c, ncclResult_t r, const char *what, char *why, size_t n) {
    r = settle(c->comm, r);
    return r == ncclSuccess ? 0 : fail_nccl(c->comm, r, what, why, n);
}

static int nccl_type(loom_dtype t, ncclDataType_t *out) {
    switch (t) {
    case LOOM_F32: *out = ncclFloat32; return 0;
    case LOOM_F64: *out = ncclFloat64; return 0;
    case LOOM_I32: *out = ncclInt32; return 0;
    case LOOM_I64: *out = ncclInt64; return 0;
    case LOOM_U8: *out = ncclUint8; return 0;
    case LOOM_BF16: break; /* moved only: bf16 sums are taken in fp32 */
    }
    return -1;
}

} // namespace LOOM_CU_NS

using namespace LOOM_CU_NS;

extern "C" {

int loom_nccl_version(void) {
    int v = 0;
    if (api_ready(NULL, 0)) return 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

int loom_nccl_gpu_uuid(unsigned char uuid[16], char *why, size_t n) {
    cu_enter();
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, cu_device());
    if (e != cudaSuccess) {
        snprintf(why, n, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
        return -1;
    }
    memcpy(uuid, p.uuid.bytes, 16);
    return 0;
}

int loom_nccl_unique_id(void *id, char *why, size_t n) {
    if (api_ready(why, n)) return -1;
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return fail_nccl(NULL, r, "ncclGetUniqueId", why, n);
    memcpy(id, u.internal, NCCL_UNIQUE_ID_BYTES);
    return 0;
}

int loom_nccl_init_start(loom_nccl **out, int nranks, int rank, const void *id, char *why,
                         size_t n) {
    *out = NULL;
    if (api_ready(why, n)) return -1;
    cu_enter(); /* NCCL binds the communicator to the calling thread's device */
    ncclUniqueId u;
    memcpy(u.internal, id, NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* src/comm polls the init under the mesh's timeout */
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        fail_nccl(comm, r, "ncclCommInitRankConfig", why, n);
        if (comm) ncclCommAbort(comm);
        return -1;
    }
    loom_nccl *c = (loom_nccl *)calloc(1, sizeof *c);
    if (!c) {
        ncclCommAbort(comm);
        snprintf(why, n, "out of host memory");
        return -1;
    }
    c->comm = comm;
    *out = c;
    return 0;
}

int loom_nccl_state(loom_nccl *c, char *why, size_t n) {
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(c->comm, &st);
    if (q != ncclSuccess) return fail_nccl(c->comm, q, "ncclCommGetAsyncError", why, n);
    if (st == ncclInProgress) return 0;
    if (st != ncclSuccess) return fail_nccl(c->comm, st, "NCCL", why, n);
    return 1;
}

void loom_nccl_abort(loom_nccl *c) {
    if (!c) return;
    cu_enter();
    (void)ncclCommAbort(c->comm);
    free(c);
}

void loom_nccl_free(loom_nccl *c) {
    if (!c) return;
    cu_enter();
    /* everything enqueued on the communicator is done before it goes */
    (void)cudaStreamSynchronize(cu_stream());
    ncclResult_t r = settle(c->comm, ncclCommFinalize(c->comm));
    if (r == ncclSuccess) r = ncclCommDestroy(c->comm);
    else (void)ncclCommAbort(c->comm);
    (void)r;
    free(c);
}

int loom_nccl_allreduce(loom_nccl *c, void *buf, size_t count, loom_dtype t, int max, char *why,
                        size_t n) {
    ncclDataType_t dt;
    if (nccl_type(t, &dt)) return snprintf(why, n, "allreduce of an unreducible type"), -1;
    return checked(c, ncclAllReduce(buf, buf, count, dt, max ? ncclMax : ncclSum, c->comm,
                                    cu_stream()),
                   "ncclAllReduce", why, n);
}

int loom_nccl_reduce_scatter(loom_nccl *c, const void *send, void *recv, size_t recvcount,
                             loom_dtype t, char *why, size_t n) {
    ncclDataType_t dt;
    if (nccl_type(t, &dt)) return snprintf(why, n, "reduce_scatter of an unreducible type"), -1;
    return checked(c, ncclReduceScatter(send, recv, recvcount, dt, ncclSum, c->comm, cu_stream()),
                   "ncclReduceScatter", why, n);
}

int loom_nccl_reduce(loom_nccl *c, const void *send, void *recv, size_t count, loom_dtype t,
                     int root, char *why, size_t n) {
    ncclDataType_t dt;
    if (nccl_type(t, &dt)) return snprintf(why, n, "reduce of an unreducible type"), -1;
    return checked(c, ncclReduce(send, recv, count, dt, ncclSum, root, c->comm, cu_stream()),
                   "ncclReduce", why, n);
}

int loom_nccl_allgather(loom_nccl *c, const void *send, void *recv, size_t bytes, char *why,
                        size_t n) {
    return checked(c, ncclAllGather(send, recv, bytes, ncclUint8, c->comm, cu_stream()),
                   "ncclAllGather", why, n);
}

int loom_nccl_broadcast(loom_nccl *c, const void *send, void *recv, size_t bytes, int root,
                        char *why, size_t n) {
    return checked(c, ncclBroadcast(send, recv, bytes, ncclUint8, root, c->comm, cu_stream()),
                   "ncclBroadcast", why, n);
}

int loom_nccl_send(loom_nccl *c, const void *buf, size_t bytes, int peer, char *why, size_t n) {
    return checked(c, ncclSend(buf, bytes, ncclUint8, peer, c->comm, cu_stream()), "ncclSend",
                   why, n);
}

int loom_nccl_recv(loom_nccl *c, void *buf, size_t bytes, int peer, char *why, size_t n) {
    return checked(c, ncclRecv(buf, bytes, ncclUint8, peer, c->comm, cu_stream()), "ncclRecv",
                   why, n);
}

int loom_nccl_group_start(char *why, size_t n) {
    cu_enter();
    ncclResult_t r = ncclGroupStart();
    return r == ncclSuccess ? 0 : fail_nccl(NULL, r, "ncclGroupStart", why, n);
}

int loom_nccl_group_end(loom_nccl *c, char *why, size_t n) {
    return checked(c, ncclGroupEnd(), "ncclGroupEnd", why, n);
}

void *loom_nccl_event_new(void) {
    cu_enter();
    cudaEvent_t e = NULL;
    CU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return (void *)e;
}

void loom_nccl_event_free(void *e) {
    if (e) (void)cudaEventDestroy((cudaEvent_t)e);
}

int loom_nccl_event_record(void *e, char *why, size_t n) {
    cudaError_t r = cudaEventRecord((cudaEvent_t)e, cu_stream());
    if (r == cudaSuccess) return 0;
    snprintf(why, n, "cudaEventRecord: %s", cudaGetErrorString(r));
    return -1;
}

int loom_nccl_event_done(void *e, char *why, size_t n) {
    cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    if (r == cudaSuccess) return 1;
    if (r == cudaErrorNotReady) return 0;
    snprintf(why, n, "the stream failed: %s", cudaGetErrorString(r));
    return -1;
}

} // extern "C"

#endif /* LOOM_CUDA_EMU */
