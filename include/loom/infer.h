/* loom inference: sampling and generation with a KV cache. */
#ifndef LOOM_INFER_H
#define LOOM_INFER_H

#include <stdint.h>
#include "loom/base.h"
#include "loom/model.h"

typedef struct loom_sampler {
    float temperature;  /* 0 = greedy (argmax) */
    int top_k;          /* 0 = whole vocabulary */
    loom_rng rng;
} loom_sampler;

/* Draws a token id from logits (V). scratch must hold V floats + V ints (see below). */
int loom_sample(loom_sampler *s, const float *logits, int V, float *scratch_p, int *scratch_i);

/* Generates n_new tokens after prompt (n_prompt >= 1) into out (n_prompt + n_new ids, the
 * prompt copied first), decoding incrementally with a KV cache. T is the model's position
 * limit: a prompt longer than T keeps its last T tokens; when the cache fills up it restarts
 * on the newest T/2 tokens. Returns the number of ids in out. */
int loom_generate(loom_model *m, int T, const int32_t *prompt, int n_prompt, int n_new,
                  loom_sampler *s, int32_t *out);

/* The same without a cache: every token recomputes the forward over its whole context (the
 * last T tokens, sliding by one). The reference path, and the peer of the generation bench. */
int loom_generate_recompute(loom_model *m, int T, const int32_t *prompt, int n_prompt, int n_new,
                            loom_sampler *s, int32_t *out);

#endif
