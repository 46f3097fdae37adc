/* Expert parallelism: the MoE op's exchange (include/loom/ep.h). The routing, the experts'
 * math and the permutations stay in the model (src/model/moe.c); this file only says which
 * collective moves the rows: an all-to-all of counts, then a variable all-to-all of rows, over
 * the mesh's ep group. */
#include "loom/ep.h"

#include <stdlib.h>

struct loom_ep {
    loom_mesh *mesh;
    int size;
    double seconds;
    int64_t calls;
};

loom_ep *loom_ep_create(loom_mesh *mesh) {
    loom_ep *ep = loom_calloc(1, sizeof *ep);
    ep->mesh = mesh;
    ep->size = loom_mesh_size(mesh, LOOM_GROUP_EP);
    return ep;
}

void loom_ep_free(loom_ep *ep) { free(ep); }

static void ep_counts(void *ctx, const int64_t *send, int64_t *recv, int block) {
    loom_ep *ep = ctx;
    const double t0 = loom_now();
    loom_alltoall(ep->mesh, LOOM_GROUP_EP, send, recv, (size_t)block, LOOM_I64);
    ep->seconds += loom_now() - t0;
    ep->calls++;
}

static void ep_exchange(void *ctx, const float *send, const int64_t *send_n, float *recv,
                        const int64_t *recv_n) {
    loom_ep *ep = ctx;
    const double t0 = loom_now();
    loom_alltoallv(ep->mesh, LOOM_GROUP_EP, send, send_n, recv, recv_n, LOOM_F32);
    ep->seconds += loom_now() - t0;
    ep->calls++;
}

loom_moe_comm loom_ep_moe_comm(loom_ep *ep) {
    return (loom_moe_comm){.ctx = ep, .counts = ep_counts, .exchange = ep_exchange};
}

void loom_ep_layout(const loom_mesh *mesh, int n_expert, loom_model_layout *lay) {
    const int ep = loom_mesh_size(mesh, LOOM_GROUP_EP), r = loom_mesh_rank(mesh, LOOM_GROUP_EP);
    if (n_expert <= 0) return;
    lay->e0 = r * (n_expert / ep);
    lay->e1 = lay->e0 + n_expert / ep;
}

double loom_ep_comm_seconds(const loom_ep *ep) { return ep ? ep->seconds : 0; }
int64_t loom_ep_comm_calls(const loom_ep *ep) { return ep ? ep->calls : 0; }

void loom_ep_stats_reset(loom_ep *ep) {
    if (!ep) return;
    ep->seconds = 0;
    ep->calls = 0;
}
