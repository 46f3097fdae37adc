/* Preference losses (DPO, SimPO, ORPO) on per-sequence log-prob sums, and their derivatives
 * with respect to those sums (include/loom/preference.h; formulas in docs/finetune.md). */
#include "loom/preference.h"

#include <math.h>
#include <string.h>

#include "loom/base.h"

static const char *const names[] = {"sft", "dpo", "simpo", "orpo"};

int loom_pref_method_named(const char *s) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

const char *loom_pref_method_name(int method) {
    return method >= 0 && method < 4 ? names[method] : "?";
}

/* log sigmoid(x) and sigmoid(x) without overflow */
static double log_sigmoid(double x) {
    return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}
static double sigmoid(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

void loom_pref_seq_logps(const float *logp, const int32_t *targets, int B, int T, double *sums,
                         double *counts) {
    for (int b = 0; b < B; b++) {
        double s = 0, n = 0;
        for (int t = 0; t < T; t++) {
            const size_t i = (size_t)b * (size_t)T + (size_t)t;
            if (targets[i] < 0) continue;
            s += (double)logp[i];
            n += 1;
        }
        sums[b] = s;
        counts[b] = n;
    }
}

/* The smoothed sigmoid loss of x = beta * z, -(1 - ls) logsigmoid(x) - ls logsigmoid(-x), and
 * its derivative with respect to x in *dx. */
static double smoothed(double x, double ls, double *dx) {
    *dx = -(1.0 - ls) * sigmoid(-x) + ls * sigmoid(x);
    return -(1.0 - ls) * log_sigmoid(x) - ls * log_sigmoid(-x);
}

void loom_pref_loss(const loom_pref_opts *o, int64_t n, const double *lc, const double *lr,
                    const double *nc, const double *nr, const double *rc, const double *rr,
                    double n_total, double tokens_chosen, double *dc, double *dr,
                    loom_pref_metrics *mx) {
    LOOM_CHECK(n_total > 0);
    const double beta = o->beta, ls = o->label_smoothing;
    for (int64_t i = 0; i < n; i++) {
        double loss = 0, rw_c = 0, rw_r = 0, pc = 0, pr = 0, dx;
        if (o->method == LOOM_PREF_DPO) {
            /* z = (lc - rc) - (lr - rr); rewards beta (l - r) */
            LOOM_CHECK(rc && rr);
            const double z = (lc[i] - rc[i]) - (lr[i] - rr[i]);
            loss = smoothed(beta * z, ls, &dx);
            dc[i] = beta * dx / n_total;
            dr[i] = -beta * dx / n_total;
            rw_c = beta * (lc[i] - rc[i]);
            rw_r = beta * (lr[i] - rr[i]);
            pc = lc[i], pr = lr[i];
            if (o->rpo_alpha > 0) { /* RPO: + alpha x the chosen tokens' mean NLL */
                LOOM_CHECK(tokens_chosen > 0);
                const double nll = -lc[i] / tokens_chosen;
                dc[i] -= o->rpo_alpha / tokens_chosen;
                mx->nll_loss += nll * n_total;
                mx->loss += o->rpo_alpha * nll;
            }
        } else if (o->method == LOOM_PREF_SIMPO) {
            /* z = lc / nc - lr / nr - gamma / beta: loss -logsigmoid(beta z) (smoothed) */
            LOOM_CHECK(nc[i] > 0 && nr[i] > 0);
            pc = lc[i] / nc[i], pr = lr[i] / nr[i];
            loss = smoothed(beta * (pc - pr) - o->gamma, ls, &dx);
            dc[i] = beta * dx / nc[i] / n_total;
            dr[i] = -beta * dx / nr[i] / n_total;
            rw_c = beta * pc;
            rw_r = beta * pr;
        } else if (o->method == LOOM_PREF_ORPO) {
            /* per-token averages p; log odds(p) = p - log(1 - e^p); the term -lambda
             * logsigmoid(log odds(pc) - log odds(pr)) plus the chosen tokens' mean NLL */
            LOOM_CHECK(nc[i] > 0 && nr[i] > 0 && tokens_chosen > 0);
            pc = lc[i] / nc[i], pr = lr[i] / nr[i];
            const double lo = (pc - log(-expm1(pc))) - (pr - log(-expm1(pr)));
            const double ratio = log_sigmoid(lo);
            const double nll = -lc[i] / tokens_chosen;
            loss = -beta * ratio; /* divided by n_total below; the NLL is a token mean */
            const double dlo = -beta * sigmoid(-lo) / n_total; /* d loss / d lo */
            /* d lo / d pc = 1 / (1 - e^pc) = -1 / expm1(pc); d lo / d pr = 1 / expm1(pr) */
            dc[i] = dlo * (-1.0 / expm1(pc)) / nc[i] - 1.0 / tokens_chosen;
            dr[i] = dlo * (1.0 / expm1(pr)) / nr[i];
            rw_c = beta * pc;
            rw_r = beta * pr;
            mx->nll_loss += nll * n_total; /* a sum over pairs, as the others */
            mx->log_odds_ratio += ratio;
            mx->log_odds_chosen += lo;
            mx->loss += nll;
        } else {
            LOOM_CHECK(0 && "loom_pref_loss: not a preference method");
        }
        mx->loss += loss / n_total;
        mx->rewards_chosen += rw_c;
        mx->rewards_rejected += rw_r;
        mx->margins += rw_c - rw_r;
        mx->accuracies += rw_c > rw_r ? 1.0 : 0.0;
        mx->logps_chosen += pc;
        mx->logps_rejected += pr;
    }
}

void loom_pref_token_weights(const double *dseq, const int32_t *targets, int B, int T,
                             float *w) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t i = (size_t)b * (size_t)T + (size_t)t;
            w[i] = targets[i] < 0 ? 0.0f : (float)-dseq[b];
        }
}
