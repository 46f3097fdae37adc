/* Private to src/train: GRPO's state in the trainer (train_grpo.c, grpo_exec.c). */
#ifndef LOOM_TRAIN_GRPO_H
#define LOOM_TRAIN_GRPO_H

#include <regex.h>

#include "loom/base.h"
#include "loom/grpo.h"

enum { GRPO_R_EXACT, GRPO_R_REGEX, GRPO_R_TOOL_CALL, GRPO_R_LENGTH, GRPO_R_COMMAND, GRPO_R_KINDS };
enum { GRPO_MAX_REWARDS = 8 };

/* one completion of a rollout batch */
typedef struct grpo_rollout {
    int32_t *toks;     /* prompt, completion turns and tool messages */
    uint8_t *gen;      /* (n) 1 where the token was generated (trained on), 0 otherwise */
    float *slp;        /* (n) the sampler's log-prob of each generated token */
    int n, cap, n_prompt;
    int n_gen;         /* generated tokens in all turns */
    int turns, tool_calls, truncated, done;
    loom_sbuf reply;   /* the text of the last assistant turn (its end marker cut) */
    double r[GRPO_MAX_REWARDS], reward;
} grpo_rollout;

typedef struct train_grpo {
    loom_grpo_opts o;
    int G, max_completion, num_iterations;
    double temperature, top_p;
    int n_rewards;
    int kind[GRPO_MAX_REWARDS];
    double weight[GRPO_MAX_REWARDS];
    regex_t re;
    int have_re;
    int64_t length_max;
    char **reward_cmd;      /* NULL-terminated argv */
    int n_reward_cmd;
    char **env_cmd;         /* finetune.env.command, NULL-terminated, or NULL */
    int n_env_cmd;
    int64_t max_turns;
    double timeout_s;
    struct loom_chat_template *tpl;
    struct loom_tokenizer *tok;
    struct loom_engine *eng;
    char *stop;             /* the assistant's end-of-turn marker */
    int32_t eos;
    int rows;               /* local_B * G */
    grpo_rollout *ro;       /* (rows) */
    char **ref_text;        /* (local_B) the rows' reference replies */
    int32_t *inp, *tgt;     /* (rows, T) */
    float *logp, *old, *ref, *w; /* (rows, T) */
    double *adv, *gstd;     /* (rows), (local_B) */
    /* the last step's metrics (sums over the global batch, see train_grpo.c) */
    double m[64];
    double rollout_s, update_s, logp_diff;
    int have_rollouts;
} train_grpo;

/* Runs argv (NULL-terminated) with `in` on stdin and env_add's NAME, VALUE pairs (NULL-ended)
 * in its environment; its stdout (up to 64 KiB) into out, its exit status (128 + signal) in
 * *status. -1 with a message when it cannot start or runs past timeout_s (killed). */
int grpo_exec(char *const *argv, const char *const *env_add, const char *in, size_t len,
              double timeout_s, loom_sbuf *out, int *status, loom_err *err);

#endif
