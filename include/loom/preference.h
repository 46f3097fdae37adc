/* loom preference optimization (module train/, docs/finetune.md "Preference optimization"):
 * the losses of DPO, SimPO and ORPO as functions of per-sequence log-prob sums, with their
 * derivatives, so that one training step is
 *   forward of the chosen and rejected rows -> loom_model_token_logps -> loom_pref_seq_logps
 *   -> loom_pref_loss (the loss and d loss / d logp_sum of every sequence)
 *   -> loom_pref_token_weights -> loom_model_backward_weighted.
 * Everything here is plain arithmetic in float64 (no model, no communication): under data
 * parallelism each rank passes its own pairs with the global counts (n_total, tokens_chosen)
 * and sums the metrics' numerators over the ranks (loom_pref_metrics holds sums). */
#ifndef LOOM_PREFERENCE_H
#define LOOM_PREFERENCE_H

#include <stdint.h>

typedef enum loom_pref_method {
    LOOM_PREF_SFT = 0,   /* not a preference loss: finetune.method sft */
    LOOM_PREF_DPO = 1,   /* Rafailov et al. 2023; TRL DPOTrainer loss_type "sigmoid" */
    LOOM_PREF_SIMPO = 2, /* Meng et al. 2024; TRL CPOTrainer loss_type "simpo", cpo_alpha 0 */
    LOOM_PREF_ORPO = 3,  /* Hong et al. 2024; TRL ORPOTrainer */
} loom_pref_method;

/* The method named s (sft, dpo, simpo, orpo), or -1. */
int loom_pref_method_named(const char *s);
const char *loom_pref_method_name(int method);

typedef struct loom_pref_opts {
    int method;             /* loom_pref_method */
    double beta;            /* DPO / SimPO beta; ORPO's lambda */
    double label_smoothing; /* DPO, SimPO: the conservative form's epsilon, in [0, 0.5) */
    double gamma;           /* SimPO: the target reward margin gamma itself (TRL's simpo_gamma;
                             * the SimPO repository's gamma_beta_ratio is gamma / beta) */
    double rpo_alpha;       /* DPO: the weight of the chosen tokens' mean NLL added to the loss
                             * (RPO, Pang et al. 2024; TRL DPOConfig loss_type [sigmoid, sft]
                             * with loss_weights [1, alpha]); 0: plain DPO */
} loom_pref_opts;

/* Sums over pairs (divide by the number of pairs for the means TRL logs). */
typedef struct loom_pref_metrics {
    double loss;             /* the pairs' share of the loss (already divided by n_total) */
    double rewards_chosen, rewards_rejected, margins, accuracies;
    double logps_chosen, logps_rejected; /* DPO: sums; SimPO, ORPO: per-token averages */
    double nll_loss;         /* ORPO, DPO with rpo_alpha: the chosen tokens' mean NLL x
                              * n_total (in loss too, ORPO's as it is, RPO's times alpha) */
    double log_odds_ratio;   /* ORPO: logsigmoid(log odds) summed over pairs */
    double log_odds_chosen;  /* ORPO: the log odds summed over pairs */
} loom_pref_metrics;

/* Per sequence: sums[b] = sum over t of logp[b, t] where targets[b, t] >= 0, counts[b] = the
 * number of such positions (B rows of T). */
void loom_pref_seq_logps(const float *logp, const int32_t *targets, int B, int T, double *sums,
                         double *counts);

/* n pairs: the policy's log-prob sums lc, lr (n each) over nc, nr completion tokens, the
 * reference's rc, rr (DPO only; NULL otherwise). n_total: the pairs of the whole (global)
 * batch, the loss being the mean over them; tokens_chosen: the global batch's chosen tokens
 * (ORPO's NLL is their mean). Writes dc, dr (n each): d loss / d lc[i], d loss / d lr[i], and
 * ADDS the pairs' metrics into *mx. */
void loom_pref_loss(const loom_pref_opts *o, int64_t n, const double *lc, const double *lr,
                    const double *nc, const double *nr, const double *rc, const double *rr,
                    double n_total, double tokens_chosen, double *dc, double *dr,
                    loom_pref_metrics *mx);

/* The per-token weights of loom_model_backward_weighted for B rows of T: every position of
 * row b gets -dseq[b] (the cross-entropy is minus the log-prob), ignored positions 0. */
void loom_pref_token_weights(const double *dseq, const int32_t *targets, int B, int T,
                             float *w);

#endif
