/* Preference optimization in the trainer (finetune.method dpo | simpo | orpo; docs/finetune.md
 * "Preference optimization"): data.train holds pairs (recipe kind: preference), each a sample of
 * 2T tokens = the chosen window then the rejected one; the model runs 2 rows per pair. One step:
 * the reference's log-probs (DPO: a frozen copy of the starting weights, or with LoRA the same
 * model with the adapters off), the policy's forward, the per-sequence sums, the loss and its
 * per-sequence coefficients (include/loom/preference.h), the backward with per-token weights.
 * Under data parallelism every rank takes its pairs of the global batch; the loss is the mean
 * over all of them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/comm.h"
#include "loom/hf.h"
#include "loom/load.h"
#include "loom/lora.h"
#include "loom/metrics.h"
#include "loom/parallel.h"
#include "loom/preference.h"
#include "loom/profile.h"
#include "train/trainer_internal.h"

/* the method's default beta: DPO 0.1 (TRL DPOConfig), SimPO 2.0 (the SimPO paper's and
 * repository's setting; TRL's CPOConfig default 0.1 is DPO's), ORPO 0.1 (TRL ORPOConfig, the
 * paper's lambda) */
static double default_beta(int method) { return method == LOOM_PREF_SIMPO ? 2.0 : 0.1; }

int loom_trainer_pref_settings(const loom_config *c, loom_pref_opts *o, loom_err *err) {
    memset(o, 0, sizeof *o);
    const char *m = loom_config_get(c, "finetune.method");
    if (!m) m = "sft";
    if (!strcmp(m, "grpo")) return 0; /* train_grpo.c reads its keys (o->method: sft) */
    o->method = loom_pref_method_named(m);
    if (o->method < 0)
        return loom_errf(err, "config key 'finetune.method' = '%s' (%s): expected sft, dpo, simpo, "
                              "orpo or grpo", m, loom_config_origin(c, "finetune.method"));
    const char *b = loom_config_get(c, "finetune.beta");
    if (!b || !strcmp(b, "auto")) o->beta = default_beta(o->method);
    else if (loom_config_get_double(c, "finetune.beta", &o->beta, err)) return -1;
    if (loom_config_get_double(c, "finetune.label_smoothing", &o->label_smoothing, err) ||
        loom_config_get_double(c, "finetune.gamma", &o->gamma, err) ||
        loom_config_get_double(c, "finetune.rpo_alpha", &o->rpo_alpha, err))
        return -1;
    if (!(o->rpo_alpha >= 0) || !isfinite(o->rpo_alpha))
        return loom_errf(err, "config key 'finetune.rpo_alpha' = %g (%s): expected a number >= 0",
                         o->rpo_alpha, loom_config_origin(c, "finetune.rpo_alpha"));
    if (o->rpo_alpha > 0 && o->method != LOOM_PREF_DPO)
        return loom_errf(err, "config key 'finetune.rpo_alpha' = %g (%s): the NLL term of RPO is "
                              "DPO's (finetune.method dpo); ORPO has its own, SimPO none",
                         o->rpo_alpha, loom_config_origin(c, "finetune.rpo_alpha"));
    if (!(o->beta > 0) || !isfinite(o->beta))
        return loom_errf(err, "config key 'finetune.beta' = %g (%s): expected a positive number",
                         o->beta, loom_config_origin(c, "finetune.beta"));
    if (!(o->label_smoothing >= 0 && o->label_smoothing < 0.5))
        return loom_errf(err, "config key 'finetune.label_smoothing' = %g (%s): expected 0 <= "
                              "epsilon < 0.5", o->label_smoothing,
                         loom_config_origin(c, "finetune.label_smoothing"));
    if (o->method == LOOM_PREF_ORPO && o->label_smoothing != 0)
        return loom_errf(err, "config key 'finetune.label_smoothing' = %g (%s): ORPO has no label "
                              "smoothing (DPO and SimPO do)", o->label_smoothing,
                         loom_config_origin(c, "finetune.label_smoothing"));
    if (!isfinite(o->gamma))
        return loom_errf(err, "config key 'finetune.gamma' (%s) is not finite",
                         loom_config_origin(c, "finetune.gamma"));
    return 0;
}

/* a layout or option the preference step does not implement: an error naming the key */
static int refuse(const trainer *t, const char *key, const char *why, loom_err *err) {
    return loom_errf(err, "finetune.method = %s with config key '%s' (%s): %s",
                     loom_pref_method_name(t->pref.method), key,
                     loom_config_origin(t->cfg, key), why);
}

int loom_trainer_pref_check(const trainer *t, loom_err *err) {
    if (t->pref.method == LOOM_PREF_SFT) return 0;
    const char *multi = "not built for preference optimization yet (data parallelism and LoRA "
                        "are); use 1";
    if (t->classify)
        return refuse(t, "model.head", "preference optimization needs the lm head", err);
    if (t->pp_size > 1) return refuse(t, "parallel.pp", multi, err);
    if (t->tp_size > 1) return refuse(t, "parallel.tp", multi, err);
    if (t->cp_size > 1) return refuse(t, "parallel.cp", multi, err);
    if (t->microbatches > 1) return refuse(t, "parallel.microbatches", multi, err);
    if (t->s.accum > 1) return refuse(t, "training.grad_accum", multi, err);
    if (t->mc.doc_mask)
        return refuse(t, "model.doc_mask", "a pair's windows are one conversation each", err);
    if (t->mc.n_expert > 0) return refuse(t, "model.moe.n_expert", multi, err);
    if (t->s.val_dir[0])
        return refuse(t, "data.val", "validation of preference data is not built yet; leave "
                                     "data.val empty", err);
    return 0;
}

/* the starting weights into the reference model: the init of training.seed, then
 * training.init_from's parameters when set (what a fresh run starts from; a resumed run's
 * reference is the same) */
int loom_trainer_load_reference(trainer *t, loom_err *err) {
    loom_model_init_weights(t->ref, (uint64_t)t->s.seed);
    const char *src = loom_config_get(t->cfg, "training.init_from");
    if (!src || !*src) return 0;
    if (loom_hf_is_dir(src)) return loom_hf_load_params(src, t->ref, err);
    loom_model *m = NULL;
    if (loom_load_model_ex(src, 1, 0, &m, NULL, NULL, err))
        return loom_err_prefix(err, "training.init_from (the reference model)");
    /* device memory of both models: the source staged on the host where the backend's memory
     * is not host memory (the named read "parameters to host"), each tensor copied in */
    const loom_backend *be = loom_model_backend(t->ref);
    float *dst = loom_model_params(t->ref);
    float *staged = loom_model_params_to_host(m);
    const float *sp = staged ? staged : loom_model_params(m);
    int rc = 0;
    for (int i = 0; i < loom_model_num_tensors(t->ref) && rc == 0; i++) {
        const loom_tensor_info *ti = loom_model_tensor(t->ref, i);
        const loom_tensor_info *s = ti->layer < 0 ? loom_model_global(m, ti->kind)
                                                  : loom_model_layer_tensor(m, ti->layer, ti->kind);
        if (!s || s->numel != ti->numel)
            rc = loom_errf(err, "training.init_from (%s) has no tensor '%s' of %zu elements", src,
                           ti->name, ti->numel);
        else be->mem_h2d(dst + ti->offset, sp + s->offset, ti->numel * sizeof(float));
    }
    free(staged);
    loom_model_free(m);
    return rc;
}

int loom_trainer_pref_setup(trainer *t, loom_err *err) {
    if (t->pref.method == LOOM_PREF_SFT) return 0;
    const size_t rows = 2 * (size_t)t->local_B, T = (size_t)t->s.T;
    t->pref_logp = loom_malloc(rows * T * sizeof(float));
    t->pref_w = loom_malloc(rows * T * sizeof(float));
    t->pref_seq = loom_calloc(7 * rows, sizeof(double)); /* see loom_trainer_pref_grads */
    if (t->pref.method != LOOM_PREF_DPO || t->lora) return 0; /* LoRA: the adapters off */
    if (loom_model_create_view(&t->mc, NULL, (int)rows, (int)T, LOOM_MODEL_INFER, &t->ref, err))
        return loom_err_prefix(err, "the reference model");
    return loom_trainer_load_reference(t, err);
}

void loom_trainer_pref_free(trainer *t) {
    loom_model_free(t->ref);
    t->ref = NULL;
    free(t->pref_logp);
    free(t->pref_w);
    free(t->pref_seq);
}

/* per-sequence log-prob sums (and counts) of the last forward of m on this rank's rows */
static void seq_logps(trainer *t, loom_model *m, const int32_t *tgt, double *sums,
                      double *counts) {
    const int rows = 2 * (int)t->local_B, T = (int)t->s.T;
    loom_model_token_logps(m, t->pref_logp);
    loom_pref_seq_logps(t->pref_logp, tgt, rows, T, sums, counts);
}

int loom_trainer_pref_grads(trainer *t, loom_trainer_batch_fn next, void *ctx, double *loss,
                            loom_err *err) {
    if (next(t, ctx, err)) return -1;
    const int n = (int)t->local_B, rows = 2 * n, T = (int)t->s.T;
    /* this rank's pairs: samples [dp_rank * local_B, +local_B) of 2T tokens = its rows */
    const size_t off = (size_t)t->dp_rank * (size_t)n * 2 * (size_t)T;
    const int32_t *inp = t->g_inp + off, *tgt = t->g_tgt + off;
    double *sums = t->pref_seq, *counts = sums + rows, *ref = counts + rows;
    double *dseq = ref + rows, *pair = dseq + rows; /* pair: lc, lr, nc, nr, rc, rr (n each) */
    if (t->pref.method == LOOM_PREF_DPO) { /* the reference, once per batch, no gradients */
        loom_prof_begin("reference", "phase");
        loom_model *rm = t->ref ? t->ref : t->model;
        if (t->lora) loom_lora_set_enabled(t->lora, 0);
        loom_model_forward(rm, inp, tgt, rows, T);
        seq_logps(t, rm, tgt, ref, counts);
        if (t->lora) loom_lora_set_enabled(t->lora, 1);
        loom_prof_end(0, 0, NULL);
    }
    if (t->lora) loom_trainer_lora_micro(t, 0);
    loom_prof_begin("forward", "phase");
    loom_model_forward(t->model, inp, tgt, rows, T);
    seq_logps(t, t->model, tgt, sums, counts);
    loom_prof_end(0, 0, NULL);
    /* the global batch's chosen tokens (ORPO's NLL is their mean) and all its tokens */
    double g[2] = {0, 0};
    for (int i = 0; i < n; i++) g[0] += counts[2 * i], g[1] += counts[2 * i] + counts[2 * i + 1];
    loom_allreduce_sum(t->mesh, t->red_group, g, 2, LOOM_F64);
    double *lc = pair, *lr = pair + n, *nc = pair + 2 * n, *nr = pair + 3 * n;
    double *rc = pair + 4 * n, *rr = pair + 5 * n, *dc = dseq, *dr = dseq + n;
    double *w_seq = ref; /* reused below: the reference sums are read into rc, rr first */
    for (int i = 0; i < n; i++) {
        lc[i] = sums[2 * i], lr[i] = sums[2 * i + 1];
        nc[i] = counts[2 * i], nr[i] = counts[2 * i + 1];
        rc[i] = ref[2 * i], rr[i] = ref[2 * i + 1];
        if (nc[i] <= 0 || nr[i] <= 0)
            return loom_errf(err, "data.train %s: a preference pair of the batch at step %lld has "
                                  "no completion token in its %s window (a prompt longer than "
                                  "training.seq_len?)", t->s.train_dir, (long long)t->step + 1,
                             nc[i] <= 0 ? "chosen" : "rejected");
    }
    loom_pref_metrics mx;
    memset(&mx, 0, sizeof mx);
    loom_pref_loss(&t->pref, n, lc, lr, nc, nr, t->pref.method == LOOM_PREF_DPO ? rc : NULL,
                   t->pref.method == LOOM_PREF_DPO ? rr : NULL, (double)t->s.B, g[0], dc, dr,
                   &mx);
    /* the step's metrics: sums over the global batch's pairs */
    double *mv = (double *)&mx;
    const int nm = (int)(sizeof mx / sizeof(double));
    loom_allreduce_sum(t->mesh, t->red_group, mv, nm, LOOM_F64);
    t->pref_mx = mx;
    for (int i = 0; i < n; i++) w_seq[2 * i] = dc[i], w_seq[2 * i + 1] = dr[i];
    loom_pref_token_weights(w_seq, tgt, rows, T, t->pref_w);
    if (t->inject_nan)
        for (size_t i = 0; i < (size_t)rows * (size_t)T; i++) t->pref_w[i] = NAN;
    loom_dp_begin_micro(t->dp, 1, 1);
    loom_prof_begin("backward", "phase");
    loom_model_backward_weighted(t->model, t->pref_w, g[1] > 0 ? (float)(1.0 / g[1]) : 0.0f);
    loom_prof_end(0, 0, NULL);
    if (t->lora) loom_trainer_lora_micro(t, -1);
    *loss = t->inject_nan ? NAN : mx.loss;
    return 0;
}

void loom_trainer_pref_write(const trainer *t, loom_metrics *mx) {
    if (t->pref.method == LOOM_PREF_SFT) return;
    const loom_pref_metrics *p = &t->pref_mx;
    const double n = (double)t->s.B;
    loom_metrics_real(mx, "rewards/chosen", p->rewards_chosen / n);
    loom_metrics_real(mx, "rewards/rejected", p->rewards_rejected / n);
    loom_metrics_real(mx, "rewards/margins", p->margins / n);
    loom_metrics_real(mx, "rewards/accuracies", p->accuracies / n);
    loom_metrics_real(mx, "logps/chosen", p->logps_chosen / n);
    loom_metrics_real(mx, "logps/rejected", p->logps_rejected / n);
    if (t->pref.method == LOOM_PREF_DPO && t->pref.rpo_alpha > 0)
        loom_metrics_real(mx, "nll_loss", p->nll_loss / n);
    if (t->pref.method == LOOM_PREF_ORPO) {
        loom_metrics_real(mx, "nll_loss", p->nll_loss / n);
        loom_metrics_real(mx, "log_odds_ratio", p->log_odds_ratio / n);
        loom_metrics_real(mx, "log_odds_chosen", p->log_odds_chosen / n);
    }
}
