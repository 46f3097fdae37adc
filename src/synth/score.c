/* loom synth: the scoring model: mean log-likelihood of the output (docs/synth.md).
 * The output's tokens (after `prefix`'s, which are context only) through a loom checkpoint's
 * forward; the score is the mean of log p(token | the tokens before it) over the output's
 * tokens that have a token before them. Loaded on first use; one forward at a time. */
#define _GNU_SOURCE
#include "synth/synth_internal.h"

#include <math.h>

#include "loom/load.h"


int synth_score_text(scorer *s, const char *text, size_t len, double *score, char *msg, size_t n) {
    pthread_mutex_lock(&s->mu);
    int rc = -1;
    if (!s->loaded && !s->failed) {
        loom_run_data *run = NULL;
        if (loom_load_model_ex(s->ckpt, 1, 0, &s->m, NULL, &run, &s->err) ||
            loom_run_data_tokenizer(run, &s->tok, &s->err)) {
            s->failed = 1;
        } else {
            const loom_model_config *c = loom_model_get_config(s->m);
            s->T = c->max_seq_len;
            s->V = c->vocab_size;
            s->in = loom_malloc((size_t)(s->T + 1) * sizeof *s->in);
            s->tg = loom_malloc((size_t)(s->T + 1) * sizeof *s->tg);
            s->loaded = 1;
        }
        loom_run_data_free(run);
    }
    if (s->failed) {
        snprintf(msg, n, "the scoring model: %.400s", s->err.msg);
        goto out;
    }
    loom_ids a = {0}, b = {0};
    loom_err e = {{0}};
    if ((s->prefix[0] && loom_tokenizer_encode(s->tok, s->prefix, strlen(s->prefix), &a, &e)) ||
        loom_tokenizer_encode_ex(s->tok, text, len, s->prefix[0] ? LOOM_TOK_CONTINUE : 0, &b, &e)) { /* continues it */
        snprintf(msg, n, "cannot tokenize: %.400s", e.msg);
        loom_ids_free(&a), loom_ids_free(&b);
        goto out;
    }
    /* the sequence: prefix + output, at most T + 1 tokens (the output's first ones) */
    int total = 0;
    for (size_t i = 0; i < a.n && total < s->T + 1; i++) s->in[total++] = a.ids[i];
    const int n_prefix = total;
    for (size_t i = 0; i < b.n && total < s->T + 1; i++) s->in[total++] = b.ids[i];
    loom_ids_free(&a), loom_ids_free(&b);
    const int first = n_prefix > 1 ? n_prefix : 1; /* the first scored position */
    if (total - first < 1) {
        snprintf(msg, n, "too short to score (%d tokens)", total - n_prefix);
        goto out;
    }
    const int T = total - 1;
    for (int t = 0; t < T; t++) s->tg[t] = s->in[t + 1];
    loom_model_forward(s->m, s->in, NULL, 1, T);
    float *lg = loom_malloc((size_t)T * (size_t)s->V * sizeof(float));
    loom_model_read_logits(s->m, lg, 0, (size_t)T * (size_t)s->V);
    double sum = 0;
    for (int t = first - 1; t < T; t++) { /* log softmax at the target */
        const float *row = lg + (size_t)t * (size_t)s->V;
        float mx = row[0];
        for (int v = 1; v < s->V; v++) mx = row[v] > mx ? row[v] : mx;
        double z = 0;
        for (int v = 0; v < s->V; v++) z += exp((double)row[v] - mx);
        sum += (double)row[s->tg[t]] - mx - log(z);
    }
    free(lg);
    *score = sum / (T - (first - 1));
    rc = 0;
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void synth_scorer_free(scorer *s) {
    if (!s) return;
    loom_model_free(s->m);
    loom_tokenizer_free(s->tok);
    free(s->in), free(s->tg), free(s->prefix);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
