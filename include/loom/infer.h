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

/* Draws a token id from logits (V): loom_sample_params (below) with s's temperature and top-k.
 * scratch: loom_sample_scratch_bytes(V) bytes, the caller's (so threads may sample at once). */
int loom_sample(loom_sampler *s, const float *logits, int V, void *scratch);

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

/* ---- the batched inference engine (src/infer/engine.c, docs/inference.md) ----------------
 * Many sequences at once with continuous batching: every step runs one ragged forward
 * (loom_model_decode_batch) over the next token of every running sequence and chunks of the
 * prompts of joining ones; finished sequences leave and waiting ones join between steps. Each
 * running sequence holds a KV cache reserved from a pool with a memory budget for
 * min(prompt + max_tokens, max_seq_len) positions; a request waits until its reservation
 * fits. Sampling is per request (its own RNG stream from its seed), so a request's output does
 * not depend on what else is in the batch. Not thread-safe: one thread drives an engine. */

struct loom_tokenizer;
struct loom_grammar;

typedef struct loom_gen_params {
    int max_tokens;           /* new tokens at most (>= 0) */
    float temperature;        /* 0 = greedy (argmax) */
    int top_k;                /* 0 = off */
    float top_p;              /* nucleus mass in (0, 1]; 1 (or 0) = off */
    float repetition_penalty; /* > 0; 1 (or 0) = off: a logit of a token already in the prompt
                               * or output is divided by it when positive, multiplied when not */
    uint64_t seed;
    const char *const *stop;  /* stop strings: generation ends before the first occurrence
                               * (needs the engine's tokenizer) */
    int n_stop;
    int ignore_eos;           /* 1: do not stop at the tokenizer's end-of-text token */
    struct loom_grammar *grammar; /* NULL: unconstrained; else the output is a document of
                               * the grammar (loom/grammar.h, docs/inference.md "Structured
                               * output"): tokens that cannot continue one are masked before
                               * the other rules, the end-of-text token only where it is
                               * complete, and it finishes ("stop") where nothing can follow
                               * and always within max_tokens (needs the engine's tokenizer;
                               * the engine holds its own reference) */
    int logprobs;             /* 1: record log p(token) of each generated token under the
                               * model's own distribution, log softmax of the raw logits
                               * (temperature 1, before penalties, top-k/top-p and grammar):
                               * loom_engine_logprobs (GRPO's sampler log-probs) */
} loom_gen_params;
/* max_tokens 16, temperature 1, the rest off, seed 0 */
loom_gen_params loom_gen_params_default(void);

enum { LOOM_FINISH_NONE = 0, LOOM_FINISH_LENGTH = 1, LOOM_FINISH_STOP = 2 };
const char *loom_finish_reason_name(int reason); /* "length", "stop" */

/* Draws the next token with p's sampling rules. history: the tokens of the prompt and output
 * so far (for the repetition penalty). scratch: loom_sample_scratch_bytes(V) bytes. */
size_t loom_sample_scratch_bytes(int V);
int32_t loom_sample_params(const loom_gen_params *p, loom_rng *rng, const float *logits, int V,
                           const int32_t *history, int n_history, void *scratch);

typedef struct loom_engine_opts {
    int max_batch;            /* sequences running at once (default 16) */
    int max_step_tokens;      /* rows per step, decode rows plus prefill chunks (default
                               * max(max_seq_len, 256)); a longer prompt is prefilled in chunks */
    size_t kv_budget_bytes;   /* KV-cache pool budget (default: max_batch full-length
                               * sequences) */
    int prefix_cache;         /* 1: reuse the K/V of prompt prefixes shared by requests (blocks
                               * of 16 tokens, least recently used evicted within the budget;
                               * docs/inference.md); refused for sliding-window models */
} loom_engine_opts;

typedef struct loom_engine loom_engine;

/* Called from loom_engine_step for every new token of request id: text is the new text that
 * became final (UTF-8 completed, not part of a possible stop string; may be empty), finish is
 * LOOM_FINISH_* (non-zero on the request's last call). */
typedef void (*loom_engine_cb)(void *ctx, int64_t id, int32_t token, const char *text,
                               size_t len, int finish);

/* tok may be NULL (then stop strings are refused and no text is produced). */
int loom_engine_create(loom_model *m, const struct loom_tokenizer *tok,
                       const loom_engine_opts *o, loom_engine **out, loom_err *err);
void loom_engine_free(loom_engine *e);
/* Queues a request; its id (>= 0) in *id. Errors (a prompt of 0 tokens or longer than
 * max_seq_len, a reservation larger than the whole pool, bad parameters) name the problem.
 * The prompt and params (stop strings included) are copied. cb may be NULL. */
int loom_engine_submit(loom_engine *e, const int32_t *prompt, int n_prompt,
                       const loom_gen_params *p, loom_engine_cb cb, void *ctx, int64_t *id,
                       loom_err *err);
/* One step. Returns the number of requests still running or waiting. */
int loom_engine_step(loom_engine *e);
/* requests running or waiting */
int loom_engine_pending(const loom_engine *e);
/* The result of a finished request (until loom_engine_release): its generated tokens, its
 * text (with a tokenizer) and finish reason. 0, or -1 when the id is unknown or unfinished. */
int loom_engine_result(const loom_engine *e, int64_t id, const int32_t **tokens, int *n,
                       const char **text, size_t *len, int *finish);
/* With params.logprobs: the log-probs of the n generated tokens of loom_engine_result (until
 * loom_engine_release); NULL otherwise or when the id is unknown or unfinished. */
const float *loom_engine_logprobs(const loom_engine *e, int64_t id);
void loom_engine_release(loom_engine *e, int64_t id);
/* Cancels a waiting or running request (its cache freed); it finishes with reason STOP and
 * no callback. */
void loom_engine_cancel(loom_engine *e, int64_t id);
typedef struct loom_engine_stats {
    int64_t steps, prompt_tokens, generated_tokens;
    int64_t masked_tokens;    /* tokens drawn under a grammar */
    double mask_seconds;      /* spent computing their masks */
    int running, waiting, max_running;
    size_t kv_used, kv_budget, kv_peak;
    /* the prefix cache: prompt tokens copied from it, blocks held (and their bytes, which count
     * against kv_budget with kv_used), blocks evicted */
    int64_t prefix_hit_tokens, prefix_blocks, prefix_evicted;
    size_t prefix_bytes;
} loom_engine_stats;
void loom_engine_get_stats(const loom_engine *e, loom_engine_stats *s);
/* the prompt tokens of request id that came from the prefix cache (0 when unknown) */
int loom_engine_cached_tokens(const loom_engine *e, int64_t id);

/* Request set-up from prompt text (src/infer/request.c), shared by loom generate and synth:
 * encodes text with tok into ids and keeps its last `keep` tokens (a prompt longer than the
 * context keeps its end; *truncated, when not NULL, says whether tokens were dropped). A text
 * that encodes to no tokens is an error. */
struct loom_ids;
int loom_prompt_encode(const struct loom_tokenizer *tok, const char *text, size_t len, int keep,
                       struct loom_ids *ids, int *truncated, loom_err *err);
/* loom_prompt_encode, then loom_engine_submit */
int loom_engine_submit_text(loom_engine *e, const struct loom_tokenizer *tok, const char *text,
                            size_t len, int keep, const loom_gen_params *p, loom_engine_cb cb,
                            void *ctx, int64_t *id, int *truncated, loom_err *err);

/* s[0..n) as valid UTF-8 (malloc'd, NUL-terminated, length in *out_len): every byte that is
 * not part of a well-formed sequence (overlong, surrogate, > U+10FFFF, NUL) becomes U+FFFD */
char *loom_utf8_sanitize(const char *s, size_t n, size_t *out_len);

#endif
