/* A layout's rules and its ranks' memory: the trainer's own accounting (the rank's model view,
 * the DP/ZeRO engine's storage for it, the arenas its pipeline schedule keeps in flight),
 * computed from the config without allocating. `loom train` refuses with these numbers
 * (src/train/train_memory.c); `loom plan` ranks layouts by them. docs/plan.md#memory. */
#include <stdio.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/cp.h"
#include "loom/model.h"
#include "loom/parallel.h"
#include "loom/plan.h"
#include "loom/pp.h"

int loom_plan_layout_from_config(const loom_config *c, const loom_model_config *mc, int world,
                                 loom_plan_layout *out, loom_err *err) {
    memset(out, 0, sizeof *out);
    out->recompute = mc->recompute;
    out->doc_mask = mc->doc_mask;
    loom_mesh_spec spec;
    if (loom_mesh_spec_from_config(c, &spec, err)) return -1;
    if (spec.dp_auto) {
        const int inner = spec.tp * spec.pp * spec.cp;
        spec.dp = world > 0 && world % inner == 0 ? world / inner : 1;
    }
    out->dp = spec.dp;
    out->tp = spec.tp;
    out->pp = spec.pp;
    out->cp = spec.cp;
    out->ep = spec.ep;
    int64_t zero = 0;
    int sp = 0;
    if (loom_config_get(c, "parallel.zero") && loom_config_get_int(c, "parallel.zero", &zero, err))
        return -1;
    if (zero < 0 || zero > 3)
        return loom_errf(err, "config key 'parallel.zero' = %lld (%s): expected 0, 1, 2 or 3",
                         (long long)zero, loom_config_origin(c, "parallel.zero"));
    out->zero = (int)zero;
    if (loom_config_get(c, "parallel.sp") && loom_config_get_bool(c, "parallel.sp", &sp, err))
        return -1;
    out->sp = sp;
    const char *ps = loom_config_get(c, "parallel.pp_schedule");
    out->pp_schedule = loom_pp_schedule_from_name(ps ? ps : "1f1b");
    if (out->pp_schedule < 0)
        return loom_errf(err, "config key 'parallel.pp_schedule' = '%s' (%s): expected gpipe or "
                              "1f1b", ps, loom_config_origin(c, "parallel.pp_schedule"));
    if (loom_cp_kind_from_config(c, &out->cp_kind, err)) return -1;
    const char *mb = loom_config_get(c, "parallel.microbatches");
    if (mb && strcmp(mb, "auto") != 0 &&
        loom_config_get_int(c, "parallel.microbatches", &out->microbatches, err))
        return -1;
    out->B = 8;
    out->T = 256;
    out->accum = 1;
    const struct { const char *key; int64_t *v; } ints[] = {
        {"training.batch_size", &out->B}, {"training.seq_len", &out->T},
        {"training.grad_accum", &out->accum}};
    for (int i = 0; i < 3; i++) {
        if (loom_config_get(c, ints[i].key) && loom_config_get_int(c, ints[i].key, ints[i].v, err))
            return -1;
        if (*ints[i].v < 1 || *ints[i].v > (INT64_C(1) << 30))
            return loom_errf(err, "config key '%s' = %lld (%s): expected an integer in [1, 2^30]",
                             ints[i].key, (long long)*ints[i].v,
                             loom_config_origin(c, ints[i].key));
    }
    if (out->microbatches < 0 || out->microbatches > (1 << 20))
        return loom_errf(err, "config key 'parallel.microbatches' = %lld (%s): expected auto or "
                              "an integer in [1, %d]", (long long)out->microbatches,
                         loom_config_origin(c, "parallel.microbatches"), 1 << 20);
    /* rows a sample becomes: dpo, simpo, orpo a pair; grpo its G completions (the trainer's
     * check counts the same, train_memory.c) */
    const char *method = loom_config_get(c, "finetune.method");
    out->pairs = method && strcmp(method, "sft") != 0 ? 2 : 1;
    if (method && !strcmp(method, "grpo")) {
        int64_t G = 0;
        if (loom_config_get_int(c, "finetune.num_generations", &G, err)) return -1;
        if (G < 1 || G > 1024)
            return loom_errf(err, "config key 'finetune.num_generations' = %lld (%s): expected "
                                  "2..1024", (long long)G,
                             loom_config_origin(c, "finetune.num_generations"));
        out->pairs = (int)G;
    }
    const char *prec = loom_config_get(c, "training.precision");
    out->bf16 = prec && !strcmp(prec, "bf16");
    return 0;
}

int loom_plan_check(const loom_model_config *mc, const loom_plan_layout *L, loom_err *err) {
    /* the mesh's rules (src/comm/mesh.c), then the trainer's (loom_trainer_build_mesh,
     * loom_trainer_create_engine, loom_trainer_moe_setup in src/train/) */
    const loom_mesh_spec spec = {L->dp, L->tp, L->pp, L->cp, L->ep, 0, 600.0};
    const loom_mesh_dims dims = {mc->n_head, mc->n_kv_head, mc->n_layer, (int)L->T, mc->n_expert};
    const int64_t world = (int64_t)L->dp * L->tp * L->pp * L->cp;
    if (world < 1 || world > (1 << 24))
        return loom_errf(err, "parallel.dp * tp * pp * cp = %lld ranks: out of range",
                         (long long)world);
    if (loom_mesh_validate(&spec, (int)world, &dims, NULL, err)) return -1;
    if (L->zero < 0 || L->zero > 3)
        return loom_errf(err, "parallel.zero = %d: expected 0, 1, 2 or 3", L->zero);
    if (L->pp > 1 && L->cp > 1)
        return loom_errf(err, "parallel.pp = %d with parallel.cp = %d: pipeline and context "
                              "parallelism do not combine yet; use one of them", L->pp, L->cp);
    if (loom_cp_check(mc, L->tp, L->cp, L->cp_kind, L->T, err)) return -1;
    if (L->pp > 1 && L->doc_mask)
        return loom_errf(err, "model.doc_mask with parallel.pp = %d: document masking is not "
                              "built into pipeline parallelism yet", L->pp);
    if (L->B % L->dp != 0)
        return loom_errf(err, "training.batch_size = %lld (the global batch) is not divisible by "
                              "the %d data-parallel ranks", (long long)L->B, L->dp);
    const int64_t local_B = L->B / L->dp;
    const int64_t m = L->microbatches > 0 ? L->microbatches : L->pp;
    if (local_B % m != 0)
        return loom_errf(err, "training.batch_size = %lld gives %lld rows per data-parallel rank "
                              "(parallel.dp = %d), not divisible by parallel.microbatches = %lld",
                         (long long)L->B, (long long)local_B, L->dp, (long long)m);
    if (L->sp && L->tp == 1)
        return loom_errf(err, "parallel.sp = true: sequence parallelism needs parallel.tp > 1");
    if (mc->n_expert > 0) {
        if (L->cp > 1)
            return loom_errf(err, "model.moe with parallel.cp = %d: mixture of experts with "
                                  "context parallelism is not built", L->cp);
        if (L->pp > 1 || m > 1)
            return loom_errf(err, "model.moe with a pipeline (parallel.pp = %d, micro-batches "
                                  "%lld): not built", L->pp, (long long)m);
        const int64_t G = mc->group_tokens > 0 ? mc->group_tokens : L->T;
        if ((local_B * L->T) % G != 0)
            return loom_errf(err, "model.moe.group_tokens = %lld does not divide the %lld tokens "
                                  "of a rank's micro-batch", (long long)G,
                             (long long)(local_B * L->T));
    }
    if (L->cp > 1 && L->T % L->cp != 0)
        return loom_errf(err, "training.seq_len = %lld is not divisible by parallel.cp = %d",
                         (long long)L->T, L->cp);
    return 0;
}

int loom_plan_rank_memory(const loom_model_config *mc, const loom_plan_layout *L, int rank,
                          loom_plan_memory *out, loom_err *err) {
    memset(out, 0, sizeof *out);
    const loom_mesh_spec spec = {L->dp, L->tp, L->pp, L->cp, L->ep, 0, 600.0};
    const loom_mesh_coords c = loom_mesh_coords_of(&spec, rank);
    const int64_t local_B = L->B / L->dp, local_T = L->T / L->cp;
    const int64_t m = L->microbatches > 0 ? L->microbatches : L->pp;
    const int pipe = L->pp > 1 || m > 1;
    /* this rank's view, as loom_trainer_create_engine builds it: its tp rank's heads and
     * columns, its cp rank's chunks, its experts (ep), with a pipeline its stage's layers for
     * micro-batch rows, and as many activation arenas as its schedule keeps in flight (gpipe:
     * every micro-batch; 1f1b: min(m, pp - stage)) */
    loom_model_layout lay = {.tp = L->tp, .tp_rank = c.tp, .cp = L->cp, .cp_rank = c.cp,
                             .sp = L->sp,
                             .precision = L->bf16 ? LOOM_PREC_BF16 : LOOM_PREC_FP32};
    if (mc->n_expert > 0) { /* loom_ep_layout */
        lay.e0 = c.ep * (mc->n_expert / L->ep);
        lay.e1 = lay.e0 + mc->n_expert / L->ep;
    }
    const int64_t rows = pipe ? local_B / m : local_B * L->pairs;
    int64_t arenas = 1;
    if (pipe) {
        loom_pp_stage_layers(mc->n_layer, L->pp, c.pp, &lay.l0, &lay.l1);
        const int64_t left = L->pp - c.pp;
        arenas = L->pp_schedule == LOOM_PP_GPIPE || left > m ? m : left;
    }
    loom_model_config vc = *mc;
    vc.recompute = L->recompute;
    loom_model *view = NULL;
    if (loom_model_create_layout_view(&vc, &lay, (int)rows, (int)local_T, &view, err))
        return L->tp > 1 || L->cp > 1 || L->sp
                   ? loom_err_prefix(err, "parallel.tp = %d, parallel.cp = %d, parallel.sp = %s",
                                     L->tp, L->cp, L->sp ? "true" : "false")
                   : -1;
    /* state is sharded over the group gradients are reduced in (dp, or dp x cp); routed
     * experts' over the expert-data group (dp x cp / ep) */
    loom_dp_memory dm;
    loom_dp_memory_estimate_groups(view, L->dp * L->cp, c.dc, L->dp * L->cp / L->ep, c.edp,
                                   L->zero, &dm);
    const double floats = (double)loom_model_activation_floats(view);
    const double row_ints = (double)(L->doc_mask ? 6 + (L->cp > 1 ? L->cp : 0) : 2) *
                            (double)rows * (double)local_T;
    /* the view's activation bytes are one arena, its rows and the RoPE tables */
    out->rope = (double)loom_model_activation_bytes(view) - 4.0 * (floats + row_ints);
    out->param = (double)dm.param_bytes;
    out->grad = (double)dm.grad_bytes;
    out->optim = (double)dm.optim_bytes;
    /* the view's arena words are its slots' bytes / 4 (bf16 slots count half) */
    out->act = (double)arenas * 4.0 * floats;
    if (L->bf16) out->param += 2.0 * (double)dm.bf16_elems; /* the bf16 weight copies */
    out->act_rows = (double)arenas * 4.0 * row_ints;
    loom_model_free(view);
    /* the trainer's global batch buffers (inputs and targets, B x T int32 each, a pair's two
     * rows each; grad_accum of each more when accumulating: train_accum.c) */
    out->batch = 2.0 * (double)L->B * (double)L->T * 4.0 * (double)L->pairs *
                 (double)(L->accum > 1 ? 1 + L->accum : 1);
    /* context parallelism's local input and target rows (loom_trainer_create_engine) and its
     * attention scratch (loom_cp_create's buffers for local_B x local_T rows) */
    out->comm = L->cp > 1 ? 2.0 * 4.0 * (double)local_B * (double)local_T +
                                (double)loom_cp_scratch_bytes(mc, L->tp, L->cp_kind, local_B,
                                                              local_T, L->bf16)
                          : 0.0;
    out->arena = out->param + out->grad + out->optim + out->act + (pipe ? out->act_rows : 0.0);
    out->total = out->param + out->grad + out->optim + out->act + out->act_rows + out->rope +
                 out->batch + out->comm;
    out->arenas = arenas;
    out->rows = rows;
    out->local_T = local_T;
    out->stage = c.pp;
    return 0;
}

int loom_plan_max_memory(const loom_model_config *mc, const loom_plan_layout *L,
                         loom_plan_memory *out, loom_err *err) {
    memset(out, 0, sizeof *out);
    for (int s = 0; s < L->pp; s++) { /* rank (dp 0, stage s, cp 0, tp 0) */
        loom_plan_memory m;
        if (loom_plan_rank_memory(mc, L, s * L->cp * L->tp, &m, err)) return -1;
        if (s == 0 || m.total > out->total) *out = m;
    }
    return 0;
}

int loom_plan_fits(const loom_plan_hw *hw, const loom_plan_layout *L, const loom_plan_memory *m,
                   double *need) {
    const int64_t world = (int64_t)L->dp * L->tp * L->pp * L->cp;
    const int64_t node_ranks = hw->shared_memory
                                   ? (world < hw->per_node || hw->per_node < 1 ? world
                                                                                : hw->per_node)
                                   : 1;
    *need = m->total * (double)node_ranks;
    return hw->mem_bytes <= 0 || *need <= hw->mem_bytes;
}

int loom_plan_kv_bytes(const loom_model_config *mc, int tp, int bf16, double *out, loom_err *err) {
    *out = 0;
    const loom_model_layout lay = {.tp = tp};
    loom_model *view = NULL;
    if (loom_model_create_layout_view(mc, &lay, 1, 1, &view, err)) return -1;
    *out = 2.0 * (double)loom_model_kv_floats(view, mc->max_seq_len) * (bf16 ? 2.0 : 4.0);
    loom_model_free(view);
    return 0;
}
