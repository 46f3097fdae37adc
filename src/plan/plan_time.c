/* A step's time on a machine: the busiest rank's FLOPs at a stated efficiency of the peak, each
 * collective's bytes over the link its group crosses (NVLink / shared memory inside a node,
 * the NIC between nodes) with its algorithm's factor, the pipeline's fill and drain, and what
 * overlaps (the DP reductions and ZeRO-3 gathers with the layers' compute; nothing else).
 * docs/plan.md#time. */
#include <math.h>
#include <string.h>

#include "loom/cp.h"
#include "loom/model.h"
#include "loom/plan.h"
#include "loom/pp.h"

/* 1 when a group of `size` ranks whose members are `stride` world ranks apart spans nodes of
 * per_node consecutive ranks */
static int crosses(int size, int64_t stride, int per_node) {
    return size > 1 && per_node > 0 && stride * (int64_t)size > per_node;
}

/* a ring collective of n ranks moving `bytes` per rank with factor f (all-reduce 2 (n-1)/n,
 * all-gather / reduce-scatter / all-to-all (n-1)/n): seconds at bandwidth bw, plus a latency
 * per ring step */
static double ring(double bytes, int n, double f, double bw, double lat) {
    if (n <= 1 || bytes <= 0) return 0;
    return f * bytes / bw + lat * 2.0 * (n - 1);
}

int loom_plan_step_time(const loom_model_config *mc, const loom_plan_layout *L,
                        const loom_plan_hw *hw, loom_plan_time *out, loom_err *err) {
    memset(out, 0, sizeof *out);
    if (!(hw->peak_flops > 0) || !(hw->efficiency > 0))
        return loom_errf(err, "hardware %s: peak FLOP/s and efficiency must be positive",
                         hw->name);
    loom_model *whole = NULL;
    if (loom_model_create_layout(mc, 1, 1, &whole, err)) return -1;
    const double f = loom_model_flops_per_token(whole, (int)L->T);
    const double f1 = loom_model_flops_per_token(whole, 1);
    loom_model_free(whole);
    const double C = mc->d_model, V = mc->vocab_size, D = loom_config_head_dim(mc);
    const double HD = (double)mc->n_head * D, KVD = (double)mc->n_kv_head * D;
    /* the parts of the one FLOPs count (loom_model_flops_per_token): the head's matmul, the
     * attention pairs' (f(T) - f(1) + its T = 1 share), the layers' matmuls */
    const double head = mc->head == LOOM_HEAD_CLASSIFY ? 0.0 : 6.0 * V * C;
    const double attn = f - f1 + 12.0 * HD * mc->n_layer;
    const double layers = f - head;
    /* recompute re-runs forwards in backward: full the whole block (a third of its FLOPs),
     * selective the attention (a third of attention's) */
    const double extra = L->recompute == LOOM_RECOMPUTE_FULL ? layers / 3.0
                         : L->recompute == LOOM_RECOMPUTE_SELECTIVE ? attn / 3.0
                                                                   : 0.0;
    const double tokens = (double)L->B * (double)L->T * (double)L->accum * L->pairs;
    const int64_t world = (int64_t)L->dp * L->tp * L->pp * L->cp;
    /* the busiest rank: the last pipeline stage holds its share of the layers and the head */
    const double share = (double)L->dp * L->tp * L->cp;
    out->flops_rank = tokens * ((layers + extra) / L->pp + head) / share;
    const double rate = hw->peak_flops * hw->efficiency;
    out->compute = out->flops_rank / rate;

    const int per_node = hw->per_node > 0 ? hw->per_node : 1;
    const double lat = hw->latency_s;
    const double ab = L->bf16 ? 2.0 : 4.0; /* activation and parameter-copy bytes */
    const int64_t m = L->microbatches > 0 ? L->microbatches : L->pp;
    const double local_B = (double)L->B / L->dp, local_T = (double)L->T / L->cp;
    const double nl = (double)mc->n_layer / L->pp; /* layers of a stage */
    const double rows_T = local_B * local_T * L->pairs * L->accum; /* a rank's rows per step */

    /* data parallelism over dp x cp (stride tp: rank = ((dp * pp + p) * cp + c) * tp + t; the
     * dp x cp group's members are tp apart within a cp block, tp * cp * pp apart across dp) */
    const int red = L->dp * L->cp;
    out->dp_inter = crosses(L->dp, (int64_t)L->tp * L->cp * L->pp, per_node) ||
                    crosses(L->cp, L->tp, per_node);
    const double dp_bw = out->dp_inter ? hw->inter_bw : hw->intra_bw;
    /* the rank's parameters (every ZeRO stage keeps the view's layout; 4 bytes each) */
    loom_model_layout lay = {.tp = L->tp, .cp = L->cp, .sp = L->sp};
    if (L->pp > 1 || m > 1) loom_pp_stage_layers(mc->n_layer, L->pp, L->pp - 1, &lay.l0, &lay.l1);
    if (mc->n_expert > 0) lay.e0 = 0, lay.e1 = mc->n_expert / L->ep;
    loom_model *view = NULL;
    if (loom_model_create_layout_view(mc, &lay, 1, (int)(L->T / L->cp), &view, err)) return -1;
    const double n = (double)loom_model_num_params(view);
    loom_model_free(view);
    /* gradients reduced in fp32: ZeRO 0-2 move an all-reduce's bytes (all-reduce, or
     * reduce-scatter + all-gather of the updated slices), ZeRO-3 a reduce-scatter, and gathers
     * the parameters (bf16 copies when planned in bf16) for forward and again for backward;
     * ZeRO 2/3 reduce every micro-batch of an accumulation */
    const double reductions = L->zero >= 2 ? (double)L->accum : 1.0;
    const double frac = (double)(red - 1) / red;
    out->dp_comm = reductions * ring(4.0 * n, red, L->zero == 3 ? frac : 2.0 * frac, dp_bw, lat);
    if (L->zero == 3) out->dp_comm += 2.0 * L->accum * ring(ab * n, red, frac, dp_bw, lat);
    /* what the compute hides: the reductions overlap backward (two thirds of the step's
     * layer FLOPs), the gathers forward and backward; the last layer's bucket never hides */
    const double window = L->zero == 3 ? out->compute : out->compute * 2.0 / 3.0;
    const double tail = out->dp_comm / (nl > 1 ? nl : 1);
    out->dp_exposed = red > 1 ? fmax(out->dp_comm - window, tail) : 0.0;

    /* tensor parallelism: per layer two all-reduces forward (attention's and the MLP's row
     * outputs) and two backward (the column inputs' gradients) of the rank's rows x C; with
     * sequence parallelism an all-gather and a reduce-scatter each (the same bytes); full
     * recompute repeats the forward's; the embedding's (vocabulary-parallel) one more */
    if (L->tp > 1) {
        out->tp_inter = crosses(L->tp, 1, per_node);
        const double bw = out->tp_inter ? hw->inter_bw : hw->intra_bw;
        const double calls = nl * (4.0 + (L->recompute == LOOM_RECOMPUTE_FULL ? 2.0 : 0.0)) + 1.0;
        const double one = ring(ab * rows_T * C / L->accum, L->tp, 2.0 * (L->tp - 1) / L->tp, bw,
                                lat);
        out->tp_comm = calls * L->accum * one;
    }
    /* context parallelism: ring passes K and V blocks around the cp group (cp - 1 steps),
     * backward K, V and their gradients; ulysses four all-to-alls forward (q, k, v, out) and
     * four backward */
    if (L->cp > 1) {
        out->cp_inter = crosses(L->cp, L->tp, per_node);
        const double bw = out->cp_inter ? hw->inter_bw : hw->intra_bw;
        const double kv = ab * rows_T * 2.0 * KVD / L->tp;
        if (L->cp_kind == LOOM_CPKIND_RING)
            out->cp_comm = nl * (L->cp - 1) * (3.0 * kv / bw + 3.0 * lat);
        else
            out->cp_comm = nl * 2.0 * ring(ab * rows_T * (2.0 * HD + 2.0 * KVD) / L->tp, L->cp,
                                           (double)(L->cp - 1) / L->cp, bw, lat);
    }
    /* expert parallelism: per MoE layer a dispatch and a combine all-to-all of top_k copies of
     * the rank's tokens forward, and two backward */
    if (L->ep > 1 && mc->n_expert > 0) {
        out->ep_inter = crosses(L->ep, (int64_t)L->tp, per_node);
        const double bw = out->ep_inter ? hw->inter_bw : hw->intra_bw;
        const double moe = (double)mc->n_layer / (mc->moe_every > 0 ? mc->moe_every : 1);
        out->ep_comm = moe * 4.0 * ring(ab * rows_T * mc->top_k * C, L->ep,
                                        (double)(L->ep - 1) / L->ep, bw, lat);
    }
    /* pipeline: each micro-batch's activations forward and gradients backward across a
     * stage boundary; the schedule's fill and drain leave (pp - 1) micro-batch times idle
     * (gpipe and 1f1b alike: 1f1b saves memory, not time) */
    if (L->pp > 1) {
        out->pp_inter = crosses(L->pp, (int64_t)L->tp * L->cp, per_node);
        const double bw = out->pp_inter ? hw->inter_bw : hw->intra_bw;
        out->pp_comm = 2.0 * (ab * rows_T * C / bw + lat * m * L->accum);
    }
    if (L->pp > 1 || m > 1) out->bubble = (double)(L->pp - 1) / (double)m * out->compute;
    out->step = out->compute + out->bubble + out->dp_exposed + out->tp_comm + out->cp_comm +
                out->ep_comm + out->pp_comm;
    out->tokens_per_s = tokens / out->step;
    out->mfu = tokens * f / ((double)world * hw->peak_flops * out->step);
    return 0;
}
