/* The GRPO loss: group-relative advantages and the clipped-ratio objective with its per-token
 * derivative (include/loom/grpo.h; formulas in docs/finetune.md "GRPO"). */
#include "loom/grpo.h"

#include <math.h>
#include <string.h>

#include "loom/base.h"

void loom_grpo_advantages(const loom_grpo_opts *o, const double *rewards, int n, int G,
                          double *adv, double *group_std) {
    LOOM_CHECK(G >= 2 && n % G == 0);
    for (int g = 0; g < n / G; g++) {
        const double *r = rewards + (size_t)g * G;
        double mean = 0, var = 0;
        for (int i = 0; i < G; i++) mean += r[i];
        mean /= G;
        for (int i = 0; i < G; i++) var += (r[i] - mean) * (r[i] - mean);
        const double sd = sqrt(var / (G - 1));
        if (group_std) group_std[g] = sd;
        for (int i = 0; i < G; i++)
            adv[(size_t)g * G + i] = o->scale_rewards ? (r[i] - mean) / (sd + 1e-4) : r[i] - mean;
    }
}

void loom_grpo_loss(const loom_grpo_opts *o, const float *logp, const float *old,
                    const float *ref, const int32_t *targets, const double *adv, int B, int T,
                    double n_seq_total, double n_tok_total, float *w, loom_grpo_metrics *mx) {
    LOOM_CHECK(n_seq_total > 0 && n_tok_total > 0);
    const double lo = 1.0 - o->epsilon, hi = 1.0 + o->epsilon_high;
    for (int b = 0; b < B; b++) {
        const size_t row = (size_t)b * (size_t)T;
        double ntok = 0;
        for (int t = 0; t < T; t++) ntok += targets[row + t] >= 0;
        /* d loss / d l_t: the same for every token of the row */
        const double norm = o->loss_type == LOOM_GRPO_GRPO
                                ? (ntok > 0 ? 1.0 / (ntok * n_seq_total) : 0.0)
                                : 1.0 / n_tok_total;
        const double A = adv[b];
        for (int t = 0; t < T; t++) {
            const size_t i = row + (size_t)t;
            if (targets[i] < 0) {
                w[i] = 0.0f;
                continue;
            }
            const double lp = logp[i], ratio = old ? exp(lp - (double)old[i]) : 1.0;
            const double cr = ratio < lo ? lo : ratio > hi ? hi : ratio;
            const double u = ratio * A, c = cr * A;
            /* -min(u, c): its derivative in logp is -A ratio where u is the minimum (or both
             * are equal: inside the clip range), 0 where the clipped term is (a constant) */
            double l = -(u < c ? u : c), d = u <= c ? -A * ratio : 0.0;
            const int clip_l = ratio < lo && A < 0, clip_h = ratio > hi && A > 0;
            if (o->beta > 0) {
                const double x = (double)ref[i] - lp, ex = exp(x);
                const double kl = ex - x - 1.0;
                l += o->beta * kl;
                d += o->beta * (1.0 - ex); /* d/dlogp of e^(ref-logp) - (ref-logp) - 1 */
                mx->kl += kl;
            }
            mx->loss += l * norm;
            w[i] = (float)(-d * norm);
            mx->clip_low += clip_l;
            mx->clip_high += clip_h;
            mx->clip_region += clip_l || clip_h;
            mx->tokens += 1;
        }
    }
}
