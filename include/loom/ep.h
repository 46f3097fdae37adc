/* loom expert parallelism: the MoE op's dispatch / combine exchange over the mesh's expert
 * group (include/loom/model.h, loom_moe_comm; docs/moe.md). Member r of the ep group holds
 * routed experts [r * E/ep, (r + 1) * E/ep) of every MoE layer; the expert-data group (the
 * ranks holding the same experts) reduces their gradients (src/parallel/dp.c). */
#ifndef LOOM_EP_H
#define LOOM_EP_H

#include "loom/comm.h"
#include "loom/model.h"

typedef struct loom_ep loom_ep;

struct loom_backend;
/* be: the model's backend, whose device buffers the exchange moves (through its comm window) */
loom_ep *loom_ep_create(loom_mesh *mesh, const struct loom_backend *be);
void loom_ep_free(loom_ep *ep);
/* the exchange for loom_model_set_moe_comm: counts, plan, dispatch, combine */
loom_moe_comm loom_ep_moe_comm(loom_ep *ep);
/* The exchange plan's arithmetic (no communication): from pl->cnt and pl->rcnt, the rows sent to
 * (sn) and received from (rn) each member, each local expert's first expert-major row (roff)
 * and the rows the local experts run (rows). */
void loom_ep_plan(loom_moe_plan *pl);
/* Moves rows of row_bytes bytes (device buffers of be, device-to-device copies) between the
 * exchange's member-major order (member i's rows for its local experts in order) and the
 * experts' expert-major order (to_expert = 1), or back. */
void loom_ep_permute(const struct loom_backend *be, const loom_moe_plan *pl, void *dst,
                     const void *src, size_t row_bytes, int to_expert);
/* this rank's expert range for n_expert experts (lay->e0, lay->e1) */
void loom_ep_layout(const loom_mesh *mesh, int n_expert, loom_model_layout *lay);
/* seconds spent in the exchanges (all-to-all) and their calls since the last reset */
double loom_ep_comm_seconds(const loom_ep *ep);
int64_t loom_ep_comm_calls(const loom_ep *ep);
void loom_ep_stats_reset(loom_ep *ep);

#endif
