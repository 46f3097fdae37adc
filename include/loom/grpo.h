/* loom GRPO (module train/, docs/finetune.md "GRPO"): group-relative advantages and the
 * clipped-ratio policy loss with its per-token derivative, so that one update is
 *   forward of the rollouts' rows -> loom_model_token_logps (logp)
 *   -> loom_grpo_loss (the loss and w_t = -d loss / d logp_t of every completion token)
 *   -> loom_model_backward_weighted(w).
 * Plain float64 arithmetic (no model, no communication): under data parallelism each rank
 * passes its own rows with the global counts (n_seq_total, n_tok_total) and sums the metrics'
 * numerators over the ranks (loom_grpo_metrics holds sums). */
#ifndef LOOM_GRPO_H
#define LOOM_GRPO_H

#include <stdint.h>

typedef enum loom_grpo_loss_type {
    LOOM_GRPO_DAPO = 0, /* token level: sum over every completion token of the batch / their
                         * number (DAPO; TRL GRPOConfig loss_type "dapo", its default) */
    LOOM_GRPO_GRPO = 1, /* sequence mean: each completion's token mean, then the mean over
                         * completions (the GRPO paper; TRL loss_type "grpo") */
} loom_grpo_loss_type;

typedef struct loom_grpo_opts {
    int loss_type;        /* loom_grpo_loss_type */
    int scale_rewards;    /* 1: advantages divided by the group's std + 1e-4 ("group"); 0: not
                           * ("none") */
    double epsilon;       /* the ratio's lower clip 1 - epsilon */
    double epsilon_high;  /* its upper clip 1 + epsilon_high */
    double beta;          /* the k3 KL estimator's coefficient (0: none, no reference) */
} loom_grpo_opts;

/* Sums over the completion tokens of the rows passed (divide by the global token count for
 * TRL's means), except loss (already the rows' share of the loss). */
typedef struct loom_grpo_metrics {
    double loss;
    double kl;                 /* sum of the k3 estimates exp(ref - logp) - (ref - logp) - 1 */
    double clip_low, clip_high, clip_region; /* tokens clipped below (ratio < 1 - eps, A < 0),
                                 * above (ratio > 1 + eps_high, A > 0), either */
    double tokens;             /* completion tokens */
} loom_grpo_metrics;

/* n rewards in groups of G consecutive (n a multiple of G, G >= 2): adv[i] = r_i - mean of
 * its group, divided by (the group's std + 1e-4) when o->scale_rewards (std with Bessel's
 * correction, as torch.std and TRL). Writes the groups' std into group_std (n / G) when not
 * NULL. */
void loom_grpo_advantages(const loom_grpo_opts *o, const double *rewards, int n, int G,
                          double *adv, double *group_std);

/* B rows of T positions; a completion token is a position with targets >= 0 (prompt, tool
 * output and padding are -1). logp: the policy's log-probs now; old: at the rollouts' policy
 * (NULL: logp itself, ratio 1, as num_iterations 1); ref: the reference model's (read when
 * beta > 0); adv: (B) each row's advantage. n_seq_total, n_tok_total: the completions and
 * completion tokens of the whole (global) batch. Per token, ratio = exp(logp - old),
 *   l_t = -min(ratio A, clip(ratio, 1 - eps, 1 + eps_high) A) + beta (e^(ref-logp) - (ref-logp) - 1)
 * and the loss is sum_t l_t / n_tok_total (dapo) or sum_rows (sum_t l_t / row tokens) /
 * n_seq_total (grpo). Writes w (B*T): -d loss / d logp_t (0 off the completion), the weights
 * of loom_model_backward_weighted (whose per-token loss is -logp), and ADDS into *mx. */
void loom_grpo_loss(const loom_grpo_opts *o, const float *logp, const float *old,
                    const float *ref, const int32_t *targets, const double *adv, int B, int T,
                    double n_seq_total, double n_tok_total, float *w, loom_grpo_metrics *mx);

#endif
