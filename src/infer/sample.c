/* Temperature / top-k sampling and the generation loop. */
#include "loom/infer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const float *g_sort_p;
static int by_prob_desc(const void *a, const void *b) {
    const float pa = g_sort_p[*(const int *)a], pb = g_sort_p[*(const int *)b];
    if (pa != pb) return pa > pb ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

int loom_sample(loom_sampler *s, const float *logits, int V, float *p, int *idx) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->temperature <= 0.0f) return best;
    const float maxv = logits[best];
    for (int i = 0; i < V; i++) p[i] = (logits[i] - maxv) / s->temperature;
    int n = V;
    for (int i = 0; i < V; i++) idx[i] = i;
    if (s->top_k > 0 && s->top_k < V) {
        g_sort_p = p;
        qsort(idx, (size_t)V, sizeof(int), by_prob_desc);
        n = s->top_k;
    }
    double sum = 0;
    for (int j = 0; j < n; j++) sum += exp((double)p[idx[j]]);
    const double r = (double)loom_rng_next_uniform(&s->rng) * sum;
    double acc = 0;
    for (int j = 0; j < n; j++) {
        acc += exp((double)p[idx[j]]);
        if (r < acc) return idx[j];
    }
    return idx[n - 1];
}

int loom_generate(loom_model *m, int T, const int32_t *prompt, int n_prompt, int n_new,
                  loom_sampler *s, int32_t *out) {
    const int V = loom_model_get_config(m)->vocab_size;
    float *p = loom_malloc((size_t)V * sizeof(float));
    int *idx = loom_malloc((size_t)V * sizeof(int));
    loom_kv_cache *kc = loom_kv_cache_create(m);
    memcpy(out, prompt, (size_t)n_prompt * sizeof(int32_t));
    int n = n_prompt;
    /* the context in the cache is out[n - ctx .. n); prefill all but the newest token */
    int start = n > T ? n - T : 0;
    const float *logits = NULL;
    for (int i = start; i < n; i++) logits = loom_model_decode(m, kc, out[i]);
    for (int i = 0; i < n_new; i++) {
        const int32_t next = loom_sample(s, logits, V, p, idx);
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
    free(p);
    free(idx);
    return n;
}

int loom_generate_recompute(loom_model *m, int T, const int32_t *prompt, int n_prompt, int n_new,
                            loom_sampler *s, int32_t *out) {
    const int V = loom_model_get_config(m)->vocab_size;
    float *p = loom_malloc((size_t)V * sizeof(float));
    int *idx = loom_malloc((size_t)V * sizeof(int));
    memcpy(out, prompt, (size_t)n_prompt * sizeof(int32_t));
    int n = n_prompt;
    for (int i = 0; i < n_new; i++) {
        const int ctx = n < T ? n : T;
        out[n] = loom_sample(s, loom_model_next_logits(m, out + n - ctx, ctx), V, p, idx);
        n++;
    }
    free(p);
    free(idx);
    return n;
}
