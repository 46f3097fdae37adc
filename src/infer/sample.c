/* Temperature / top-k sampling and the generation loop. */
#include "loom/infer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One sampler: loom_sample is loom_sample_params with temperature and top-k only (no global
 * state, so threads may sample at once; top-k by selection, not a sort of the vocabulary). */
int loom_sample(loom_sampler *s, const float *logits, int V, void *scratch) {
    loom_gen_params p = loom_gen_params_default();
    p.temperature = s->temperature;
    p.top_k = s->top_k;
    return loom_sample_params(&p, &s->rng, logits, V, NULL, 0, scratch);
}

int loom_generate(loom_model *m, int T, const int32_t *prompt, int n_prompt, int n_new,
                  loom_sampler *s, int32_t *out) {
    const int V = loom_model_get_config(m)->vocab_size;
    void *scratch = loom_malloc(loom_sample_scratch_bytes(V));
    loom_kv_cache *kc = loom_kv_cache_create(m);
    memcpy(out, prompt, (size_t)n_prompt * sizeof(int32_t));
    int n = n_prompt;
    /* the context in the cache is out[n - ctx .. n); prefill all but the newest token */
    int start = n > T ? n - T : 0;
    const float *logits = NULL;
    for (int i = start; i < n; i++) logits = loom_model_decode(m, kc, out[i]);
    for (int i = 0; i < n_new; i++) {
        const int32_t next = loom_sample(s, logits, V, scratch);
        out[n++] = next;
        if (i + 1 == n_new) break;
        if (loom_kv_cache_len(kc) == T) {
            /* the cache is full: restart it on the newest half of the context (positions are
             * absolute, so the kept tokens are run again at their new positions) */
            loom_kv_cache_reset(kc);
            start = n - T / 2;
            for (int j = start; j < n - 1; j++) loom_model_decode(m, kc, out[j]);
        }
        logits = loom_model_decode(m, kc, next);
    }
    loom_kv_cache_free(kc);
    free(scratch);
    return n;
}

int loom_generate_recompute(loom_model *m, int T, const int32_t *prompt, int n_prompt, int n_new,
                            loom_sampler *s, int32_t *out) {
    const int V = loom_model_get_config(m)->vocab_size;
    void *scratch = loom_malloc(loom_sample_scratch_bytes(V));
    memcpy(out, prompt, (size_t)n_prompt * sizeof(int32_t));
    int n = n_prompt;
    for (int i = 0; i < n_new; i++) {
        const int ctx = n < T ? n : T;
        out[n] = loom_sample(s, loom_model_next_logits(m, out + n - ctx, ctx), V, scratch);
        n++;
    }
    free(scratch);
    return n;
}

/* ---- per-request sampling (the engine's) ------------------------------------------------ */

loom_gen_params loom_gen_params_default(void) {
    loom_gen_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 16;
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

const char *loom_finish_reason_name(int reason) {
    return reason == LOOM_FINISH_STOP ? "stop" : reason == LOOM_FINISH_LENGTH ? "length" : "none";
}

typedef struct cand {
    float v;
    int32_t i;
} cand;

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

size_t loom_sample_scratch_bytes(int V) { return (size_t)V * (sizeof(cand) + 1); }

int32_t loom_sample_params(const loom_gen_params *p, loom_rng *rng, const float *logits, int V,
                           const int32_t *history, int n_history, void *scratch) {
    cand *c = scratch;
    unsigned char *seen = (unsigned char *)(c + V);
    const float pen = p->repetition_penalty;
    if (p->temperature <= 0.0f && !(pen > 0.0f && pen != 1.0f && n_history > 0)) {
        int best = 0; /* greedy, no penalty: the first largest logit, as below without a copy */
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int i = 0; i < V; i++) c[i] = (cand){logits[i], i};
    if (pen > 0.0f && pen != 1.0f && n_history > 0) {
        /* once per distinct token (Hugging Face's RepetitionPenaltyLogitsProcessor) */
        memset(seen, 0, (size_t)V);
        for (int j = 0; j < n_history; j++) {
            const int32_t t = history[j];
            if (t < 0 || t >= V || seen[t]) continue;
            seen[t] = 1;
            c[t].v = c[t].v > 0.0f ? c[t].v / pen : c[t].v * pen;
        }
    }
    int best = 0;
    for (int i = 1; i < V; i++)
        if (c[i].v > c[best].v) best = i;
    if (p->temperature <= 0.0f) return best;
    const float maxv = c[best].v;
    for (int i = 0; i < V; i++) c[i].v = (c[i].v - maxv) / p->temperature;
    int n = V;
    const int use_k = p->top_k > 0 && p->top_k < V;
    const int use_p = p->top_p > 0.0f && p->top_p < 1.0f;
    if (use_k || use_p) {
        if (use_k) {
            /* partial selection: the k largest to the front, then sorted */
            int k = p->top_k, lo = 0, hi = V - 1;
            while (lo < hi) { /* quickselect on cand_desc order */
                const cand pivot = c[lo + (hi - lo) / 2];
                int i = lo, j = hi;
                while (i <= j) {
                    while (cand_desc(&c[i], &pivot) < 0) i++;
                    while (cand_desc(&c[j], &pivot) > 0) j--;
                    if (i <= j) {
                        const cand t = c[i];
                        c[i] = c[j];
                        c[j] = t;
                        i++;
                        j--;
                    }
                }
                if (k - 1 <= j) hi = j;
                else if (k - 1 >= i) lo = i;
                else break;
            }
            n = k;
        }
        qsort(c, (size_t)n, sizeof *c, cand_desc);
    }
    double sum = 0;
    for (int j = 0; j < n; j++) sum += exp((double)c[j].v);
    if (use_p) {
        /* the smallest prefix (by probability) whose mass reaches top_p, at least one token */
        double acc = 0;
        int keep = 0;
        while (keep < n) {
            acc += exp((double)c[keep].v);
            keep++;
            if (acc >= (double)p->top_p * sum) break;
        }
        n = keep;
        sum = acc;
    }
    const double r = (double)loom_rng_next_uniform(rng) * sum;
    double acc = 0;
    for (int j = 0; j < n; j++) {
        acc += exp((double)c[j].v);
        if (r < acc) return c[j].i;
    }
    return c[n - 1].i;
}
