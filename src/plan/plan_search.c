/* The search: every valid layout of a world of ranks (degrees dividing heads, layers, experts,
 * sequence and batch; ZeRO stage; sequence parallelism; pipeline schedule and micro-batches;
 * recompute; context-parallel kind), its largest rank's memory and its step time, ranked:
 * the layouts that fit by tokens/s, then the rest by the memory they need. docs/plan.md. */
#include <stdlib.h>
#include <string.h>

#include "loom/cp.h"
#include "loom/plan.h"
#include "loom/pp.h"

typedef struct {
    loom_plan_entry *v;
    int n, cap;
} list;

static void push(list *l, const loom_plan_entry *e) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = loom_realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n++] = *e;
}

static int cmp_entry(const void *a, const void *b) {
    const loom_plan_entry *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (x->fits) {
        if (x->time.tokens_per_s != y->time.tokens_per_s)
            return x->time.tokens_per_s > y->time.tokens_per_s ? -1 : 1;
    } else if (x->need != y->need) {
        return x->need < y->need ? -1 : 1;
    }
    /* ties: less memory first, then the simpler layout (lower degrees, lower ZeRO stage) */
    if (x->need != y->need) return x->need < y->need ? -1 : 1;
    const loom_plan_layout *p = &x->layout, *q = &y->layout;
    const int kp[] = {p->tp, p->pp, p->cp, p->ep, p->zero, p->sp, p->recompute, (int)p->microbatches};
    const int kq[] = {q->tp, q->pp, q->cp, q->ep, q->zero, q->sp, q->recompute, (int)q->microbatches};
    for (int i = 0; i < 8; i++)
        if (kp[i] != kq[i]) return kp[i] - kq[i];
    return 0;
}

static int evaluate(const loom_model_config *mc, const loom_plan_layout *L, const loom_plan_hw *hw,
                    list *out) {
    loom_err err;
    if (loom_plan_check(mc, L, &err)) return 0; /* not a valid layout */
    loom_plan_entry e;
    memset(&e, 0, sizeof e);
    e.layout = *L;
    if (loom_plan_max_memory(mc, L, &e.mem, &err) || loom_plan_step_time(mc, L, hw, &e.time, &err))
        return 0; /* the model's views refuse it (e.g. sp with rows not divisible by tp) */
    e.fits = loom_plan_fits(hw, L, &e.mem, &e.need);
    push(out, &e);
    return 1;
}

int loom_plan_search(const loom_model_config *mc, const loom_plan_layout *base, int world,
                     const loom_plan_hw *hw, loom_plan_entry **out, int *n, loom_err *err) {
    *out = NULL;
    *n = 0;
    if (world < 1 || world > (1 << 20))
        return loom_errf(err, "%d ranks: expected 1 to 2^20", world);
    list l = {0};
    static const int recomputes[] = {LOOM_RECOMPUTE_NONE, LOOM_RECOMPUTE_SELECTIVE,
                                     LOOM_RECOMPUTE_FULL};
    for (int tp = 1; tp <= world; tp++) {
        if (world % tp) continue;
        for (int pp = 1; pp <= world / tp; pp++) {
            if ((world / tp) % pp) continue;
            for (int cp = 1; cp <= world / tp / pp; cp++) {
                if ((world / tp / pp) % cp) continue;
                const int dp = world / tp / pp / cp;
                if (base->B % dp) continue;
                const int64_t local_B = base->B / dp;
                for (int ep = 1; ep <= dp * cp; ep++) {
                    if ((dp * cp) % ep || (ep > 1 && (mc->n_expert <= 0 || mc->n_expert % ep)))
                        continue;
                    /* micro-batches: none without a pipeline; with one pp, 2 pp, 4 pp and
                     * every row its own micro-batch (those that divide the rank's rows) */
                    int64_t ms[5] = {1}, nm = 1;
                    if (pp > 1) {
                        nm = 0;
                        const int64_t c[4] = {pp, 2 * (int64_t)pp, 4 * (int64_t)pp, local_B};
                        for (int i = 0; i < 4; i++) {
                            int dup = 0;
                            for (int j = 0; j < nm; j++) dup |= ms[j] == c[i];
                            if (!dup && c[i] <= local_B && local_B % c[i] == 0) ms[nm++] = c[i];
                        }
                    }
                    for (int mi = 0; mi < nm; mi++)
                        for (int zero = 0; zero <= 3; zero++)
                            for (int sp = 0; sp <= (tp > 1); sp++)
                                for (int sched = 0; sched <= (pp > 1); sched++)
                                    for (int kind = 0; kind <= (cp > 1); kind++)
                                        for (int r = 0; r < 3; r++) {
                                            loom_plan_layout L = *base;
                                            L.dp = dp, L.tp = tp, L.pp = pp, L.cp = cp, L.ep = ep;
                                            L.zero = zero, L.sp = sp;
                                            L.microbatches = ms[mi];
                                            L.pp_schedule = pp > 1 ? sched : LOOM_PP_1F1B;
                                            L.cp_kind = cp > 1 ? kind : base->cp_kind;
                                            L.recompute = recomputes[r];
                                            evaluate(mc, &L, hw, &l);
                                        }
                }
            }
        }
    }
    if (!l.n) {
        free(l.v);
        return loom_errf(err, "no valid layout of %d ranks for this model and batch "
                              "(training.batch_size %lld, seq_len %lld): the degrees must divide "
                              "the heads, layers, experts, sequence and batch", world,
                         (long long)base->B, (long long)base->T);
    }
    qsort(l.v, (size_t)l.n, sizeof *l.v, cmp_entry);
    *out = l.v;
    *n = l.n;
    return 0;
}
