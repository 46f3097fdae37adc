/* Expert parallelism: the MoE op's dispatch and combine (include/loom/ep.h), supplied to the
 * model through its hooks (loom_moe_comm, include/loom/model.h): an all-to-all of counts, the
 * exchange plan (how many rows go to and come from each member, where each local expert's rows
 * start), a variable all-to-all of rows over the mesh's ep group, and the permutation between
 * the exchange's member-major order and the experts' expert-major order, on the model's device
 * buffers (copies and the comm window of its backend). The routing (which
 * rows go to which expert) and the experts' math stay in the model (src/model/moe.c): model/
 * may not use parallel/ (docs/architecture.md), so it reaches this file only through the hooks
 * that parallel/ gives it. */
#include "loom/ep.h"

#include <stdlib.h>
#include "loom/backend.h"
#include <string.h>

struct loom_ep {
    loom_mesh *mesh;
    const loom_backend *be;
    int size;
    double seconds;
    int64_t calls;
};

loom_ep *loom_ep_create(loom_mesh *mesh, const loom_backend *be) {
    loom_ep *ep = loom_calloc(1, sizeof *ep);
    ep->mesh = mesh;
    ep->be = be;
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

void loom_ep_plan(loom_moe_plan *pl) {
    const int El = pl->El, ep = pl->ep;
    pl->rows = 0;
    for (int i = 0; i < ep; i++) {
        pl->sn[i] = pl->rn[i] = 0;
        for (int el = 0; el < El; el++) {
            pl->sn[i] += pl->cnt[i * El + el];
            pl->rn[i] += pl->rcnt[i * El + el];
        }
    }
    for (int el = 0; el < El; el++) {
        pl->roff[el] = pl->rows;
        for (int i = 0; i < ep; i++) pl->rows += pl->rcnt[i * El + el];
    }
    pl->roff[El] = pl->rows;
}

void loom_ep_permute(const loom_backend *be, const loom_moe_plan *pl, void *dst,
                     const void *src, size_t row_bytes, int to_expert) {
    const int El = pl->El, ep = pl->ep;
    int64_t mm = 0; /* member-major row */
    for (int i = 0; i < ep; i++)
        for (int el = 0; el < El; el++) {
            int64_t em = pl->roff[el]; /* expert-major row of member i's first row for el */
            for (int k = 0; k < i; k++) em += pl->rcnt[k * El + el];
            const int64_t n = pl->rcnt[i * El + el];
            const size_t bytes = (size_t)n * row_bytes;
            if (n == 0) continue;
            if (to_expert)
                be->mem_d2d((char *)dst + (size_t)em * row_bytes,
                            (const char *)src + (size_t)mm * row_bytes, bytes);
            else
                be->mem_d2d((char *)dst + (size_t)mm * row_bytes,
                            (const char *)src + (size_t)em * row_bytes, bytes);
            mm += n;
        }
}

/* rows of row_bytes: sn[r] rows of send to member r, rn[i] rows from member i into recv (device
 * buffers, reached through the backend's comm window) */
static void exchange(loom_ep *ep, const loom_moe_plan *pl, const void *send, const int64_t *sn,
                     void *recv, const int64_t *rn, size_t row_bytes) {
    int64_t *s = pl->tmp, *q = pl->tmp + pl->ep;
    for (int i = 0; i < pl->ep; i++) {
        s[i] = sn[i] * (int64_t)row_bytes;
        q[i] = rn[i] * (int64_t)row_bytes;
    }
    const double t0 = loom_now();
    ep->be->comm_begin();
    loom_alltoallv(ep->mesh, LOOM_GROUP_EP, send, s, recv, q, LOOM_U8);
    ep->be->comm_end();
    ep->seconds += loom_now() - t0;
    ep->calls++;
}

static void ep_plan(void *ctx, loom_moe_plan *pl) {
    (void)ctx;
    loom_ep_plan(pl);
}

static void ep_dispatch(void *ctx, const loom_moe_plan *pl, const void *send, void *recv,
                        void *out, size_t row_bytes) {
    loom_ep *ep = ctx;
    exchange(ep, pl, send, pl->sn, recv, pl->rn, row_bytes);
    loom_ep_permute(ep->be, pl, out, recv, row_bytes, 1);
}

static void ep_combine(void *ctx, const loom_moe_plan *pl, const void *in, void *send,
                       void *out, size_t row_bytes) {
    loom_ep *ep = ctx;
    loom_ep_permute(ep->be, pl, send, in, row_bytes, 0);
    exchange(ep, pl, send, pl->rn, out, pl->sn, row_bytes);
}

loom_moe_comm loom_ep_moe_comm(loom_ep *ep) {
    return (loom_moe_comm){.ctx = ep, .counts = ep_counts, .plan = ep_plan,
                           .dispatch = ep_dispatch, .combine = ep_combine};
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
