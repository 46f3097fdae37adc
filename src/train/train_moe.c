/* The trainer's mixture-of-experts parts: the expert-parallel view and exchange, and the
 * routing metrics of each step (docs/moe.md "Metrics"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/ep.h"
#include "loom/metrics.h"
#include "train/trainer_internal.h"

int loom_trainer_moe_setup(trainer *t, loom_model_layout *lay, loom_err *err) {
    if (t->mc.n_expert <= 0) return 0;
    if (t->cp_size > 1) /* routing groups would straddle the sequence chunks */
        return loom_errf(err, "model.moe with parallel.cp = %d: mixture of experts with context "
                              "parallelism is not built", t->cp_size);
    if (t->pp_size > 1 || t->microbatches > 1)
        return loom_errf(err, "model.moe with a pipeline (parallel.pp = %d, micro-batches %lld): "
                              "mixture of experts with pipeline parallelism is not built",
                         t->pp_size, (long long)t->microbatches);
    loom_ep_layout(t->mesh, t->mc.n_expert, lay);
    const int64_t G = t->mc.group_tokens > 0 ? t->mc.group_tokens : t->s.T;
    if ((t->local_B * t->s.T) % G != 0)
        return loom_errf(err, "model.moe.group_tokens = %lld does not divide the %lld tokens of a "
                              "rank's micro-batch (training.batch_size / dp x training.seq_len): "
                              "routing groups must not straddle ranks",
                         (long long)G, (long long)(t->local_B * t->s.T));
    return 0;
}

void loom_trainer_moe_attach(trainer *t) {
    if (t->mc.n_expert <= 0 || loom_mesh_size(t->mesh, LOOM_GROUP_EP) <= 1) return;
    t->ep = loom_ep_create(t->mesh, loom_model_backend(t->model));
    const loom_moe_comm c = loom_ep_moe_comm(t->ep);
    loom_model_set_moe_comm(t->model, &c);
}

void loom_trainer_moe_free(trainer *t) {
    loom_ep_free(t->ep);
    t->ep = NULL;
    free(t->moe_red);
    t->moe_red = NULL;
}

void loom_trainer_moe_begin_step(trainer *t) {
    loom_model_moe_stats_reset(t->model);
    loom_ep_stats_reset(t->ep);
}

/* per MoE layer: E loads, dropped, assigned, aux_sum, z_sum, tokens */
void loom_trainer_moe_reduce(trainer *t) {
    loom_moe_stats *st = loom_model_moe_stats(t->model);
    if (!st || st->n_layers == 0) return;
    const int E = st->n_expert, per = E + 5, n = st->n_layers * per;
    if (!t->moe_red) t->moe_red = loom_calloc((size_t)n + 1, sizeof(double));
    for (int i = 0; i < st->n_layers; i++) {
        double *r = t->moe_red + (size_t)i * per;
        for (int e = 0; e < E; e++) r[e] = (double)st->load[(size_t)i * E + e];
        r[E] = (double)st->dropped[i];
        r[E + 1] = (double)st->assigned[i];
        r[E + 2] = st->aux_sum[i];
        r[E + 3] = st->z_sum[i];
        r[E + 4] = st->tokens[i];
    }
    t->moe_red[n] = loom_ep_comm_seconds(t->ep); /* the slowest rank's all-to-all time */
    loom_allreduce_sum(t->mesh, LOOM_GROUP_DP, t->moe_red, (size_t)n, LOOM_F64);
    loom_allreduce_max(t->mesh, LOOM_GROUP_DP, t->moe_red + n, 1, LOOM_F64);
}

void loom_trainer_moe_write(const trainer *t, loom_metrics *mx) {
    const loom_moe_stats *st = loom_model_moe_stats(t->model);
    if (!st || st->n_layers == 0 || !t->moe_red) return;
    const int E = st->n_expert, per = E + 5;
    double aux = 0, z = 0, dropped = 0, assigned = 0;
    for (int i = 0; i < st->n_layers; i++) {
        const double *r = t->moe_red + (size_t)i * per;
        char key[64];
        snprintf(key, sizeof key, "moe_load.%d", st->layer[i]);
        loom_metrics_reals(mx, key, r, E, 1); /* tokens routed to each expert (before capacity) */
        dropped += r[E];
        assigned += r[E + 1];
        if (r[E + 4] > 0) {
            aux += r[E + 2] / r[E + 4];
            z += r[E + 3] / r[E + 4];
        }
    }
    loom_metrics_real(mx, "moe_aux_loss", aux / st->n_layers); /* 1 = perfectly balanced */
    loom_metrics_real(mx, "moe_z_loss", z / st->n_layers);
    loom_metrics_real(mx, "moe_dropped_frac", assigned > 0 ? dropped / assigned : 0);
    if (t->ep) loom_metrics_real(mx, "moe_alltoall_s", t->moe_red[(size_t)st->n_layers * per]);
}
