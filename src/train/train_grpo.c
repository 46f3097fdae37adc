/* GRPO in the trainer (finetune.method grpo; docs/finetune.md "GRPO"). data.train is a
 * `kind: chat` build with `pack: false`: each window is one conversation, its prompt the tokens
 * before the first trained token, its reference reply the tokens of its last trained run (the
 * final assistant message). One rollout batch, every finetune.num_iterations steps: each rank
 * takes its prompts of the global batch (training.batch_size prompts), samples G completions of
 * each with the batched inference engine reading the weights being trained (no copy: the DP
 * engine's storage through the model's resident hooks), runs the tool environment on
 * completions that end in a tool call (its output a masked tool message, then the assistant
 * continues), scores the final replies with the reward functions and normalizes the rewards
 * within each group (a group stays on its rank). Each step: the reference's log-probs (beta >
 * 0, once per rollout batch), the policy's forward of the rows, loom_grpo_loss (the clipped
 * objective, include/loom/grpo.h) and loom_model_backward_weighted; the loss and its
 * normalization are the global batch's. */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/chat.h"
#include "loom/comm.h"
#include "loom/infer.h"
#include "loom/load.h"
#include "loom/lora.h"
#include "loom/metrics.h"
#include "loom/parallel.h"
#include "loom/profile.h"
#include "loom/tokenizer.h"
#include "train/train_grpo.h"
#include "train/trainer_internal.h"

static const char *const reward_names[GRPO_R_KINDS] = {"exact", "regex", "tool_call", "length",
                                                       "command"};

/* ---- settings ------------------------------------------------------------------------------ */

static int key_err(const loom_config *c, const char *key, const char *why, loom_err *err) {
    if (!loom_config_get(c, key) || !loom_config_origin(c, key))
        return loom_errf(err, "config key '%s' is not set: %s", key, why);
    return loom_errf(err, "config key '%s' = '%s' (%s): %s", key,
                     loom_config_get(c, key) ? loom_config_get(c, key) : "",
                     loom_config_origin(c, key), why);
}

/* a list key as a NULL-terminated argv (NULL when the key is absent or empty) */
static int argv_of(const loom_config *c, const char *key, char ***out, int *n, loom_err *err) {
    *out = NULL;
    *n = 0;
    const char *v = loom_config_get(c, key);
    if (!v || !*v) return 0;
    char **items = NULL;
    int k = 0;
    if (v[0] == '[') {
        if (loom_config_get_list(c, key, &items, &k, err)) return -1;
    } else {
        items = loom_malloc(sizeof(char *));
        items[0] = loom_strdup(v);
        k = 1;
    }
    if (k == 0) {
        loom_config_free_list(items, k);
        return key_err(c, key, "expected a command (a program and its arguments)", err);
    }
    *out = loom_realloc(items, (size_t)(k + 1) * sizeof(char *));
    (*out)[k] = NULL;
    *n = k;
    return 0;
}

int loom_trainer_grpo_settings(trainer *t, loom_err *err) {
    const loom_config *c = t->cfg;
    const char *m = loom_config_get(c, "finetune.method");
    if (!m || strcmp(m, "grpo")) return 0;
    train_grpo *g = t->grpo = loom_calloc(1, sizeof *g);
    int64_t G, mc, it;
    if (loom_config_get_int(c, "finetune.num_generations", &G, err) ||
        loom_config_get_int(c, "finetune.max_completion_tokens", &mc, err) ||
        loom_config_get_int(c, "finetune.num_iterations", &it, err) ||
        loom_config_get_double(c, "finetune.temperature", &g->temperature, err) ||
        loom_config_get_double(c, "finetune.top_p", &g->top_p, err) ||
        loom_config_get_double(c, "finetune.epsilon", &g->o.epsilon, err) ||
        loom_config_get_int(c, "finetune.env.max_turns", &g->max_turns, err) ||
        loom_config_get_double(c, "finetune.env.timeout_s", &g->timeout_s, err))
        return -1;
    if (G < 2 || G > 1024)
        return key_err(c, "finetune.num_generations", "expected 2..1024 completions per prompt "
                                                      "(the advantages compare a group's)", err);
    if (mc < 1) return key_err(c, "finetune.max_completion_tokens", "expected >= 1", err);
    if (it < 1) return key_err(c, "finetune.num_iterations", "expected >= 1", err);
    if (!(g->temperature > 0 && g->temperature <= 100))
        return key_err(c, "finetune.temperature", "expected a temperature in (0, 100] (GRPO "
                                                  "samples; 0 would make every completion alike)",
                       err);
    if (!(g->top_p > 0 && g->top_p <= 1))
        return key_err(c, "finetune.top_p", "expected (0, 1]", err);
    if (!(g->o.epsilon >= 0 && g->o.epsilon < 1))
        return key_err(c, "finetune.epsilon", "expected 0 <= epsilon < 1", err);
    const char *eh = loom_config_get(c, "finetune.epsilon_high");
    if (!eh || !strcmp(eh, "auto")) g->o.epsilon_high = g->o.epsilon;
    else if (loom_config_get_double(c, "finetune.epsilon_high", &g->o.epsilon_high, err)) return -1;
    if (!(g->o.epsilon_high >= 0 && isfinite(g->o.epsilon_high)))
        return key_err(c, "finetune.epsilon_high", "expected a number >= 0", err);
    const char *b = loom_config_get(c, "finetune.beta");
    if (!b || !strcmp(b, "auto")) g->o.beta = 0;
    else if (loom_config_get_double(c, "finetune.beta", &g->o.beta, err)) return -1;
    if (!(g->o.beta >= 0 && isfinite(g->o.beta)))
        return key_err(c, "finetune.beta", "expected >= 0 (0: no KL term)", err);
    const char *lt = loom_config_get(c, "finetune.loss_type");
    if (!strcmp(lt, "dapo")) g->o.loss_type = LOOM_GRPO_DAPO;
    else if (!strcmp(lt, "grpo")) g->o.loss_type = LOOM_GRPO_GRPO;
    else return key_err(c, "finetune.loss_type", "expected dapo or grpo", err);
    const char *sr = loom_config_get(c, "finetune.scale_rewards");
    if (!strcmp(sr, "group")) g->o.scale_rewards = 1;
    else if (!strcmp(sr, "none")) g->o.scale_rewards = 0;
    else return key_err(c, "finetune.scale_rewards", "expected group or none", err);
    if (g->max_turns < 0 || g->max_turns > 64)
        return key_err(c, "finetune.env.max_turns", "expected 0..64", err);
    if (!(g->timeout_s > 0))
        return key_err(c, "finetune.env.timeout_s", "expected seconds > 0", err);
    g->G = (int)G;
    g->max_completion = (int)mc;
    g->num_iterations = (int)it;
    /* the reward functions and their weights */
    char **names = NULL, **ws = NULL;
    int nn = 0, nw = 0, rc = 0;
    if (loom_config_get_list(c, "finetune.rewards", &names, &nn, err)) return -1;
    if (nn < 1 || nn > GRPO_MAX_REWARDS)
        rc = key_err(c, "finetune.rewards", "expected a list of 1 to 8 of exact, regex, "
                                            "tool_call, length, command", err);
    for (int i = 0; i < nn && !rc; i++) {
        int k = -1;
        for (int j = 0; j < GRPO_R_KINDS; j++)
            if (!strcmp(names[i], reward_names[j])) k = j;
        if (k < 0) {
            char why[300];
            snprintf(why, sizeof why, "'%.100s' is not a reward: expected exact, regex, tool_call,"
                                      " length or command", names[i]);
            rc = key_err(c, "finetune.rewards", why, err);
        }
        g->kind[i] = k;
    }
    g->n_rewards = nn;
    loom_config_free_list(names, nn);
    if (rc) return rc;
    const char *wv = loom_config_get(c, "finetune.reward_weights");
    if (wv && strcmp(wv, "auto")) {
        if (loom_config_get_list(c, "finetune.reward_weights", &ws, &nw, err)) return -1;
        if (nw != g->n_rewards)
            rc = key_err(c, "finetune.reward_weights", "expected one weight per reward of "
                                                       "finetune.rewards", err);
        for (int i = 0; i < nw && !rc; i++) {
            char *end = NULL;
            g->weight[i] = strtod(ws[i], &end);
            if (!end || *end || !isfinite(g->weight[i]))
                rc = key_err(c, "finetune.reward_weights", "expected numbers", err);
        }
        loom_config_free_list(ws, nw);
        if (rc) return rc;
    } else {
        for (int i = 0; i < g->n_rewards; i++) g->weight[i] = 1.0;
    }
    for (int i = 0; i < g->n_rewards; i++) {
        if (g->kind[i] == GRPO_R_REGEX && !g->have_re) {
            const char *pat = loom_config_get(c, "finetune.reward.regex");
            if (!pat || !*pat)
                return key_err(c, "finetune.reward.regex", "the regex reward needs a pattern "
                                                           "(POSIX extended)", err);
            if (regcomp(&g->re, pat, REG_EXTENDED | REG_NOSUB))
                return key_err(c, "finetune.reward.regex", "not a POSIX extended regular "
                                                           "expression", err);
            g->have_re = 1;
        }
        if (g->kind[i] == GRPO_R_LENGTH) {
            if (loom_config_get_int(c, "finetune.reward.length_max", &g->length_max, err))
                return -1;
            if (g->length_max < 1)
                return key_err(c, "finetune.reward.length_max", "the length reward needs the "
                                                                "token count N >= 1 beyond which "
                                                                "it penalizes", err);
        }
        if (g->kind[i] == GRPO_R_COMMAND && !g->reward_cmd) {
            if (argv_of(c, "finetune.reward.command", &g->reward_cmd, &g->n_reward_cmd, err))
                return -1;
            if (!g->reward_cmd)
                return key_err(c, "finetune.reward.command", "the command reward needs a "
                                                             "command", err);
        }
    }
    if (argv_of(c, "finetune.env.command", &g->env_cmd, &g->n_env_cmd, err)) return -1;
    const char *tpl = loom_config_get(c, "finetune.template");
    if (!tpl || !*tpl)
        return key_err(c, "finetune.template", "GRPO needs the chat template data.train was "
                                               "built with (its turn markers and tool-call "
                                               "format)", err);
    if (loom_chat_template_load(tpl, &g->tpl, err))
        return loom_err_prefix(err, "config key 'finetune.template'");
    return 0;
}

static int refuse(const trainer *t, const char *key, const char *why, loom_err *err) {
    return loom_errf(err, "finetune.method = grpo with config key '%s' (%s): %s", key,
                     loom_config_origin(t->cfg, key), why);
}

int loom_trainer_grpo_check(const trainer *t, loom_err *err) {
    if (!t->grpo) return 0;
    const char *multi = "not built for GRPO yet (data parallelism and LoRA are); use 1";
    if (t->classify) return refuse(t, "model.head", "GRPO needs the lm head", err);
    if (t->pp_size > 1) return refuse(t, "parallel.pp", multi, err);
    if (t->tp_size > 1) return refuse(t, "parallel.tp", multi, err);
    if (t->cp_size > 1) return refuse(t, "parallel.cp", multi, err);
    if (t->microbatches > 1) return refuse(t, "parallel.microbatches", multi, err);
    if (t->s.accum > 1) return refuse(t, "training.grad_accum", multi, err);
    if (t->s.zero >= 3)
        return refuse(t, "parallel.zero", "the rollouts read the parameters in place, which "
                                          "stage 3 does not keep whole; use 0, 1 or 2", err);
    if (t->mc.doc_mask) return refuse(t, "model.doc_mask", "a rollout row is one conversation", err);
    if (t->mc.n_expert > 0) return refuse(t, "model.moe.n_expert", multi, err);
    if (t->s.val_dir[0])
        return refuse(t, "data.val", "GRPO has no validation loss; leave data.val empty", err);
    return 0;
}

int loom_trainer_grpo_rows(const trainer *t) { return t->grpo ? t->grpo->G : 1; }

/* ---- set-up -------------------------------------------------------------------------------- */

int loom_trainer_grpo_setup(trainer *t, loom_err *err) {
    train_grpo *g = t->grpo;
    if (!g) return 0;
    const size_t T = (size_t)t->s.T;
    g->rows = (int)t->local_B * g->G;
    if (loom_run_data_tokenizer(t->run_data, &g->tok, err)) return loom_err_prefix(err, "data.train");
    g->eos = loom_tokenizer_special_id(g->tok, "<|endoftext|>");
    /* the assistant's end of turn: the template's stop (its post text without trailing
     * whitespace), or the post text itself when that is all whitespace ("A:{content}\n") */
    char *prompt = NULL;
    loom_chat_prompt(g->tpl, NULL, "x", &prompt, &g->stop);
    free(prompt);
    if (!g->stop[0]) {
        free(g->stop);
        g->stop = loom_strdup(g->tpl->post[LOOM_ROLE_ASSISTANT]);
    }
    if (!g->stop[0])
        return refuse(t, "finetune.template", "the template's assistant turn has no end marker "
                                              "to stop a completion at", err);
    loom_engine_opts eo = {.max_batch = g->rows};
    if (loom_engine_create(t->model, g->tok, &eo, &g->eng, err))
        return loom_err_prefix(err, "GRPO's rollouts");
    g->ro = loom_calloc((size_t)g->rows, sizeof *g->ro);
    for (int i = 0; i < g->rows; i++) {
        grpo_rollout *r = &g->ro[i];
        r->cap = (int)T + 1;
        r->toks = loom_malloc((size_t)r->cap * sizeof(int32_t));
        r->gen = loom_malloc((size_t)r->cap);
        r->slp = loom_malloc((size_t)r->cap * sizeof(float));
    }
    g->ref_text = loom_calloc((size_t)t->local_B, sizeof(char *));
    const size_t n = (size_t)g->rows * T;
    g->inp = loom_malloc(n * sizeof(int32_t));
    g->tgt = loom_malloc(n * sizeof(int32_t));
    g->logp = loom_malloc(n * sizeof(float));
    g->old = loom_malloc(n * sizeof(float));
    g->ref = loom_calloc(n, sizeof(float));
    g->w = loom_malloc(n * sizeof(float));
    g->adv = loom_calloc((size_t)g->rows, sizeof(double));
    g->gstd = loom_calloc((size_t)t->local_B, sizeof(double));
    if (g->o.beta > 0 && !t->lora) { /* the reference: a frozen copy of the starting weights */
        if (loom_model_create_view(&t->mc, NULL, g->rows, (int)T, LOOM_MODEL_INFER, &t->ref, err))
            return loom_err_prefix(err, "the reference model");
        if (loom_trainer_load_reference(t, err)) return -1;
    }
    return 0;
}

void loom_trainer_grpo_free(trainer *t) {
    train_grpo *g = t->grpo;
    if (!g) return;
    loom_engine_free(g->eng);
    for (int i = 0; g->ro && i < g->rows; i++) {
        free(g->ro[i].toks);
        free(g->ro[i].gen);
        free(g->ro[i].slp);
        free(g->ro[i].reply.p);
    }
    free(g->ro);
    for (int i = 0; g->ref_text && i < t->local_B; i++) free(g->ref_text[i]);
    free(g->ref_text);
    free(g->inp);
    free(g->tgt);
    free(g->logp);
    free(g->old);
    free(g->ref);
    free(g->w);
    free(g->adv);
    free(g->gstd);
    if (g->have_re) regfree(&g->re);
    if (g->reward_cmd) loom_config_free_list(g->reward_cmd, g->n_reward_cmd);
    if (g->env_cmd) loom_config_free_list(g->env_cmd, g->n_env_cmd);
    loom_chat_template_free(g->tpl);
    loom_tokenizer_free(g->tok);
    free(g->stop);
    free(g);
    t->grpo = NULL;
}

/* ---- rollouts ------------------------------------------------------------------------------ */

static void trim(const char **s, size_t *n) {
    while (*n && (**s == ' ' || **s == '\n' || **s == '\t' || **s == '\r')) (*s)++, (*n)--;
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\n' || (*s)[*n - 1] == '\t' ||
                  (*s)[*n - 1] == '\r'))
        (*n)--;
}

/* the reference reply of a window: the text of its last trained run, the end marker cut */
static int reference_text(train_grpo *g, const int32_t *tgt, int T, char **out, loom_err *err) {
    int b = T - 1;
    while (b >= 0 && tgt[b] < 0) b--;
    int a = b;
    while (a > 0 && tgt[a - 1] >= 0) a--;
    char *s = NULL;
    size_t n = 0;
    if (loom_tokenizer_decode(g->tok, tgt + a, (size_t)(b - a + 1), &s, &n, err)) return -1;
    const char *post = g->tpl->post[LOOM_ROLE_ASSISTANT];
    const size_t pl = strlen(post), sl = strlen(g->stop);
    if (pl && n >= pl && !memcmp(s + n - pl, post, pl)) n -= pl;
    else if (sl && n >= sl && !memcmp(s + n - sl, g->stop, sl)) n -= sl;
    const char *p = s;
    trim(&p, &n);
    *out = loom_malloc(n + 1);
    memcpy(*out, p, n);
    (*out)[n] = 0;
    free(s);
    return 0;
}

static void push(grpo_rollout *r, int32_t tok, int gen, float lp) {
    r->toks[r->n] = tok;
    r->gen[r->n] = (uint8_t)gen;
    r->slp[r->n] = lp;
    r->n++;
}

/* the tool message after a call: the template's tool turn around the environment's output,
 * then the assistant's opening; appended untrained */
static int tool_turn(train_grpo *g, grpo_rollout *r, const char *text, size_t len, loom_err *err) {
    const loom_chat_template *tp = g->tpl;
    loom_sbuf s = {0};
    if (tp->tool_open) loom_sbuf_append(&s, tp->tool_open, strlen(tp->tool_open));
    loom_sbuf_append(&s, tp->pre[LOOM_ROLE_TOOL], strlen(tp->pre[LOOM_ROLE_TOOL]));
    loom_sbuf_append(&s, text, len);
    loom_sbuf_append(&s, tp->post[LOOM_ROLE_TOOL], strlen(tp->post[LOOM_ROLE_TOOL]));
    if (tp->tool_close) loom_sbuf_append(&s, tp->tool_close, strlen(tp->tool_close));
    loom_sbuf_append(&s, tp->pre[LOOM_ROLE_ASSISTANT], strlen(tp->pre[LOOM_ROLE_ASSISTANT]));
    loom_ids ids = {0};
    const int rc = loom_tokenizer_encode_ex(g->tok, s.p, s.len, LOOM_TOK_CONTINUE, &ids, err);
    free(s.p);
    if (rc) return -1;
    if (r->n + (int)ids.n >= r->cap) r->truncated = 1, r->done = 1; /* no room to answer */
    else
        for (size_t i = 0; i < ids.n; i++) push(r, ids.ids[i], 0, 0.0f);
    loom_ids_free(&ids);
    return 0;
}

/* runs the environment on the reply's first tool call; 1 when a tool message was appended */
static int run_env(train_grpo *g, grpo_rollout *r, loom_err *err) {
    json_t *calls = NULL;
    size_t content_len = 0;
    const int nc = loom_chat_parse_tool_calls(g->tpl, r->reply.p, r->reply.len, &calls,
                                              &content_len);
    if (nc <= 0) {
        json_decref(calls);
        return 0;
    }
    char *in = json_dumps(json_array_get(calls, 0), JSON_COMPACT);
    json_decref(calls);
    loom_sbuf out = {0};
    int status = 0;
    loom_err e2 = {{0}};
    const size_t inl = strlen(in);
    if (grpo_exec(g->env_cmd, NULL, in, inl, g->timeout_s, &out, &status, &e2)) {
        free(out.p);
        out = (loom_sbuf){0};
        loom_sbuf_printf(&out, "error: %s", e2.msg);
    } else if (status != 0) {
        loom_sbuf_printf(&out, "%serror: exit status %d", out.len ? " " : "", status);
    }
    free(in);
    const char *p = out.p;
    size_t n = out.len;
    trim(&p, &n);
    r->tool_calls++;
    const int rc = tool_turn(g, r, p, n, err);
    free(out.p);
    return rc ? -1 : !r->done;
}

/* G completions of each of this rank's prompts, every turn of them batched in the engine */
static int rollouts(trainer *t, train_grpo *g, loom_err *err) {
    const int T = (int)t->s.T, nb = (int)t->local_B;
    for (int i = 0; i < nb; i++) {
        const size_t row = ((size_t)t->dp_rank * (size_t)nb + (size_t)i) * (size_t)T;
        const int32_t *inp = t->g_inp + row, *tgt = t->g_tgt + row;
        int p = 0;
        while (p < T && tgt[p] < 0) p++;
        if (p == T)
            return loom_errf(err, "data.train %s: a window of the batch at step %lld has no "
                                  "trained token (GRPO needs a `kind: chat` build whose "
                                  "conversations end with the reference reply)",
                             t->s.train_dir, (long long)t->step + 1);
        free(g->ref_text[i]);
        if (reference_text(g, tgt, T, &g->ref_text[i], err)) return -1;
        for (int k = 0; k < g->G; k++) {
            grpo_rollout *r = &g->ro[i * g->G + k];
            r->n = r->n_gen = r->turns = r->tool_calls = r->truncated = r->done = 0;
            r->reply.len = 0;
            for (int j = 0; j <= p; j++) push(r, inp[j], 0, 0.0f);
            r->n_prompt = r->n;
        }
    }
    const char *stops[1] = {g->stop};
    for (int turn = 0;; turn++) {
        int64_t *ids = loom_malloc((size_t)g->rows * sizeof(int64_t));
        int live = 0;
        for (int i = 0; i < g->rows; i++) {
            grpo_rollout *r = &g->ro[i];
            ids[i] = -1;
            if (r->done) continue;
            int mt = g->max_completion - r->n_gen;
            if (mt > r->cap - r->n) mt = r->cap - r->n;
            if (mt <= 0) {
                r->truncated = r->done = 1;
                continue;
            }
            loom_gen_params gp = loom_gen_params_default();
            gp.max_tokens = mt;
            gp.temperature = (float)g->temperature;
            gp.top_p = (float)g->top_p;
            gp.stop = stops;
            gp.n_stop = 1;
            gp.logprobs = 1;
            /* a stream per (seed, step, global completion, turn): any number of ranks draws
             * the same completions */
            const uint64_t gi = (uint64_t)t->dp_rank * (uint64_t)g->rows + (uint64_t)i;
            gp.seed = loom_rng_u64((uint64_t)t->s.seed, 0x6772706fULL,
                                   (((uint64_t)t->step << 24) + gi) * 64 + (uint64_t)turn);
            if (loom_engine_submit(g->eng, r->toks, r->n, &gp, NULL, NULL, &ids[i], err)) {
                free(ids);
                return loom_err_prefix(err, "GRPO rollout");
            }
            live++;
        }
        if (!live) {
            free(ids);
            break;
        }
        while (loom_engine_step(g->eng) > 0) {}
        for (int i = 0; i < g->rows; i++) {
            grpo_rollout *r = &g->ro[i];
            if (ids[i] < 0) continue;
            const int32_t *tk;
            const char *text;
            size_t tl;
            int n, fin;
            LOOM_CHECK(loom_engine_result(g->eng, ids[i], &tk, &n, &text, &tl, &fin) == 0);
            const float *lp = loom_engine_logprobs(g->eng, ids[i]);
            for (int j = 0; j < n && r->n < r->cap; j++) push(r, tk[j], 1, lp[j]);
            r->n_gen += n;
            /* the end-of-text token ended it (not a stop string): it is part of the
             * completion, trained on like the end marker (its sampler log-prob unknown) */
            if (fin == LOOM_FINISH_STOP && g->eos >= 0 && r->n < r->cap) {
                char *all = NULL;
                size_t al = 0;
                loom_err e2;
                if (loom_tokenizer_decode(g->tok, tk, (size_t)n, &all, &al, &e2) == 0 &&
                    !memmem(all, al, g->stop, strlen(g->stop)))
                    push(r, g->eos, 1, NAN), r->n_gen++;
                free(all);
            }
            r->reply.len = 0;
            loom_sbuf_append(&r->reply, text, tl);
            r->turns++;
            loom_engine_release(g->eng, ids[i]);
            if (fin == LOOM_FINISH_LENGTH) {
                r->truncated = r->done = 1;
                continue;
            }
            if (!g->env_cmd || turn >= g->max_turns) {
                r->done = 1;
                continue;
            }
            const int more = run_env(g, r, err);
            if (more < 0) {
                free(ids);
                return -1;
            }
            if (!more) r->done = 1;
        }
        free(ids);
    }
    return 0;
}

/* ---- rewards ------------------------------------------------------------------------------- */

/* 1 when the reply and the reference are the same tool calls (name and arguments as JSON) */
static double tool_call_equal(const train_grpo *g, const char *reply, size_t n, const char *ref) {
    json_t *a = NULL, *b = NULL;
    size_t ca = 0, cb = 0;
    const int na = loom_chat_parse_tool_calls(g->tpl, reply, n, &a, &ca);
    const int nb = loom_chat_parse_tool_calls(g->tpl, ref, strlen(ref), &b, &cb);
    const double v = na > 0 && na == nb && json_equal(a, b) ? 1.0 : 0.0;
    json_decref(a);
    json_decref(b);
    return v;
}

static double command_reward(const train_grpo *g, const grpo_rollout *r, const char *reply,
                             size_t n, const char *ref) {
    const char *env[] = {"LOOM_REFERENCE", ref, NULL};
    loom_sbuf out = {0};
    int status = 1;
    loom_err e2;
    double v = 0;
    if (grpo_exec(g->reward_cmd, env, reply, n, g->timeout_s, &out, &status, &e2)) {
        loom_warn("finetune.reward.command: %s (reward 0)", e2.msg);
    } else if (status == 0) {
        /* a number on stdout is the reward; else exit status 0 is 1 */
        char *end = NULL;
        const double x = out.len ? strtod(out.p, &end) : 0;
        v = 1.0;
        if (end && end != out.p) {
            while (*end == ' ' || *end == '\n' || *end == '\t' || *end == '\r') end++;
            if (!*end && isfinite(x)) v = x;
        }
    }
    (void)r;
    free(out.p);
    return v;
}

static void score(train_grpo *g, grpo_rollout *r, const char *ref) {
    const char *rep = r->reply.p ? r->reply.p : "";
    size_t n = r->reply.len;
    trim(&rep, &n);
    r->reward = 0;
    for (int k = 0; k < g->n_rewards; k++) {
        double v = 0;
        switch (g->kind[k]) {
        case GRPO_R_EXACT: v = n == strlen(ref) && !memcmp(rep, ref, n); break;
        case GRPO_R_REGEX: {
            char *z = loom_malloc(n + 1); /* regexec reads a NUL-terminated text */
            memcpy(z, rep, n);
            z[n] = 0;
            v = regexec(&g->re, z, 0, NULL, 0) == 0;
            free(z);
            break;
        }
        case GRPO_R_TOOL_CALL: v = tool_call_equal(g, rep, n, ref); break;
        case GRPO_R_LENGTH:
            v = r->n_gen > g->length_max
                    ? -(double)(r->n_gen - g->length_max) / (double)g->length_max
                    : 0.0;
            break;
        default: v = command_reward(g, r, rep, n, ref); break;
        }
        r->r[k] = v;
        r->reward += g->weight[k] * v;
    }
}

/* ---- one step ------------------------------------------------------------------------------ */

/* metric slots of g->m (sums over the global batch) */
enum { M_N, M_R, M_R2, M_PASS, M_LEN, M_CLIPPED, M_TOOLS, M_GSTD, M_ZSTD, M_GROUPS,
       M_FN = 16, M_FN2 = 24, M_LOSS = 32, M_KL, M_CLOW, M_CHIGH, M_CREG, M_TOK, M_COUNT = 40 };

static void build_rows(trainer *t, train_grpo *g) {
    const int T = (int)t->s.T;
    for (int i = 0; i < g->rows; i++) {
        const grpo_rollout *r = &g->ro[i];
        int32_t *x = g->inp + (size_t)i * T, *y = g->tgt + (size_t)i * T;
        for (int j = 0; j < T; j++) {
            x[j] = j < r->n ? r->toks[j] : 0;
            y[j] = j + 1 < r->n && r->gen[j + 1] ? r->toks[j + 1] : -1;
        }
    }
}

/* LOOM_TEST_GRPO_DUMP=FILE (a test hook): every rollout batch's rows appended to FILE as JSON
 * lines {"step", "row", "inputs", "targets", "reward", "reply", "tool_calls"} (world rank 0's
 * rows), so a test can check what the loss trains on */
static void dump_rows(const trainer *t, const train_grpo *g) {
    const char *path = getenv("LOOM_TEST_GRPO_DUMP");
    if (!path || !*path || t->world_rank != 0) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    const int T = (int)t->s.T;
    for (int i = 0; i < g->rows; i++) {
        json_t *x = json_array(), *y = json_array();
        for (int j = 0; j < T; j++) {
            json_array_append_new(x, json_integer(g->inp[(size_t)i * T + j]));
            json_array_append_new(y, json_integer(g->tgt[(size_t)i * T + j]));
        }
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer((json_int_t)t->step + 1));
        json_object_set_new(o, "row", json_integer(i));
        json_object_set_new(o, "inputs", x);
        json_object_set_new(o, "targets", y);
        json_object_set_new(o, "reward", json_real(g->ro[i].reward));
        size_t sl = 0;
        char *rep = loom_utf8_sanitize(g->ro[i].reply.p ? g->ro[i].reply.p : "",
                                       g->ro[i].reply.len, &sl);
        json_object_set_new(o, "reply", json_stringn(rep, sl));
        free(rep);
        json_object_set_new(o, "tool_calls", json_integer(g->ro[i].tool_calls));
        char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (line) fprintf(f, "%s\n", line);
        free(line);
        json_decref(o);
    }
    fclose(f);
}

int loom_trainer_grpo_grads(trainer *t, loom_trainer_batch_fn next, void *ctx, double *loss,
                            loom_err *err) {
    train_grpo *g = t->grpo;
    const int T = (int)t->s.T, rows = g->rows, G = g->G;
    const size_t n = (size_t)rows * (size_t)T;
    /* a new rollout batch every num_iterations steps (and at the first step of a resumed
     * run: rollouts are not checkpointed) */
    const int fresh = !g->have_rollouts || t->step % g->num_iterations == 0;
    g->have_rollouts = 1;
    double *m = g->m;
    if (fresh) {
        const double t0 = loom_now();
        if (next(t, ctx, err)) return -1;
        if (t->lora) loom_trainer_lora_micro(t, -1); /* no adapter dropout in rollouts */
        loom_prof_begin("rollout", "phase");
        if (rollouts(t, g, err)) return -1;
        loom_prof_end(0, 0, NULL);
        memset(m, 0, M_COUNT * sizeof(double));
        double *rw = loom_malloc((size_t)rows * sizeof(double));
        double lmax[2] = {0, -1e300}; /* the longest completion, minus the shortest */
        for (int i = 0; i < rows; i++) {
            grpo_rollout *r = &g->ro[i];
            score(g, r, g->ref_text[i / G]);
            rw[i] = r->reward;
            m[M_N] += 1;
            m[M_R] += r->reward;
            m[M_R2] += r->reward * r->reward;
            int pass = 1, binary = 0;
            for (int k = 0; k < g->n_rewards; k++) {
                m[M_FN + k] += r->r[k];
                m[M_FN2 + k] += r->r[k] * r->r[k];
                if (g->kind[k] != GRPO_R_LENGTH) binary = 1, pass &= r->r[k] >= 1.0;
            }
            m[M_PASS] += binary ? pass : r->reward > 0;
            m[M_LEN] += r->n_gen;
            m[M_CLIPPED] += r->truncated;
            m[M_TOOLS] += r->tool_calls;
            if (r->n_gen > lmax[0]) lmax[0] = r->n_gen;
            if (-(double)r->n_gen > lmax[1]) lmax[1] = -(double)r->n_gen;
        }
        loom_grpo_advantages(&g->o, rw, rows, G, g->adv, g->gstd);
        free(rw);
        for (int i = 0; i < (int)t->local_B; i++) {
            m[M_GSTD] += g->gstd[i];
            m[M_ZSTD] += g->gstd[i] == 0.0;
            m[M_GROUPS] += 1;
        }
        loom_allreduce_sum(t->mesh, t->red_group, m, M_LOSS, LOOM_F64);
        loom_allreduce_max(t->mesh, t->red_group, lmax, 2, LOOM_F64);
        m[M_COUNT] = lmax[0];
        m[M_COUNT + 1] = -lmax[1];
        build_rows(t, g);
        dump_rows(t, g);
        g->rollout_s = loom_now() - t0;
        if (g->o.beta > 0) { /* the reference, once per rollout batch, no gradients */
            loom_prof_begin("reference", "phase");
            loom_model *rm = t->ref ? t->ref : t->model;
            if (t->lora) loom_lora_set_enabled(t->lora, 0);
            loom_model_forward(rm, g->inp, g->tgt, rows, T);
            loom_model_token_logps(rm, g->ref);
            if (t->lora) loom_lora_set_enabled(t->lora, 1);
            loom_prof_end(0, 0, NULL);
        }
    }
    const double t1 = loom_now();
    if (t->lora) loom_trainer_lora_micro(t, 0);
    loom_prof_begin("forward", "phase");
    loom_model_forward(t->model, g->inp, g->tgt, rows, T);
    loom_model_token_logps(t->model, g->logp);
    loom_prof_end(0, 0, NULL);
    if (fresh) {
        /* the policy's log-probs before any update on these rollouts: the "old" ones, and
         * the sampler's agreement with them (the same weights and precision: rounding only) */
        memcpy(g->old, g->logp, n * sizeof(float));
        double d = 0;
        for (int i = 0; i < rows; i++) {
            const grpo_rollout *r = &g->ro[i];
            for (int j = 1; j < r->n && j <= T; j++)
                if (r->gen[j] && isfinite(r->slp[j])) {
                    const double e = fabs((double)r->slp[j] - (double)g->logp[(size_t)i * T + j - 1]);
                    if (e > d) d = e;
                }
        }
        loom_allreduce_max(t->mesh, t->red_group, &d, 1, LOOM_F64);
        g->logp_diff = d;
    }
    double cnt[2] = {(double)rows, 0};
    for (size_t i = 0; i < n; i++) cnt[1] += g->tgt[i] >= 0;
    loom_allreduce_sum(t->mesh, t->red_group, cnt, 2, LOOM_F64);
    loom_grpo_metrics mx;
    memset(&mx, 0, sizeof mx);
    if (cnt[1] > 0)
        loom_grpo_loss(&g->o, g->logp, g->num_iterations > 1 ? g->old : NULL, g->ref, g->tgt,
                       g->adv, rows, T, cnt[0], cnt[1], g->w, &mx);
    else
        memset(g->w, 0, n * sizeof(float));
    double *mv = (double *)&mx;
    loom_allreduce_sum(t->mesh, t->red_group, mv, sizeof mx / sizeof(double), LOOM_F64);
    m[M_LOSS] = mx.loss, m[M_KL] = mx.kl, m[M_CLOW] = mx.clip_low, m[M_CHIGH] = mx.clip_high;
    m[M_CREG] = mx.clip_region, m[M_TOK] = mx.tokens;
    if (t->inject_nan)
        for (size_t i = 0; i < n; i++) g->w[i] = NAN;
    loom_dp_begin_micro(t->dp, 1, 1);
    loom_prof_begin("backward", "phase");
    loom_model_backward_weighted(t->model, g->w, cnt[1] > 0 ? (float)(1.0 / cnt[1]) : 0.0f);
    loom_prof_end(0, 0, NULL);
    if (t->lora) loom_trainer_lora_micro(t, -1);
    g->update_s = loom_now() - t1;
    *loss = t->inject_nan ? NAN : mx.loss;
    return 0;
}

void loom_trainer_grpo_write(const trainer *t, loom_metrics *mx) {
    const train_grpo *g = t->grpo;
    if (!g) return;
    const double *m = g->m, N = m[M_N] > 0 ? m[M_N] : 1, tok = m[M_TOK] > 0 ? m[M_TOK] : 1;
    const double mean = m[M_R] / N;
    loom_metrics_real(mx, "reward", mean);
    loom_metrics_real(mx, "reward_std", m[M_GROUPS] > 0 ? m[M_GSTD] / m[M_GROUPS] : 0);
    loom_metrics_real(mx, "frac_reward_zero_std", m[M_GROUPS] > 0 ? m[M_ZSTD] / m[M_GROUPS] : 0);
    for (int k = 0; k < g->n_rewards; k++) {
        char key[64];
        const double fm = m[M_FN + k] / N;
        const double var = N > 1 ? (m[M_FN2 + k] - N * fm * fm) / (N - 1) : 0;
        snprintf(key, sizeof key, "rewards/%s/mean", reward_names[g->kind[k]]);
        loom_metrics_real(mx, key, fm);
        snprintf(key, sizeof key, "rewards/%s/std", reward_names[g->kind[k]]);
        loom_metrics_real(mx, key, var > 0 ? sqrt(var) : 0);
    }
    loom_metrics_real(mx, "pass_rate", m[M_PASS] / N);
    loom_metrics_real(mx, "completions/mean_length", m[M_LEN] / N);
    loom_metrics_real(mx, "completions/max_length", m[M_COUNT]);
    loom_metrics_real(mx, "completions/min_length", m[M_COUNT + 1]);
    loom_metrics_real(mx, "completions/clipped_ratio", m[M_CLIPPED] / N);
    if (g->env_cmd) loom_metrics_real(mx, "tools/calls_mean", m[M_TOOLS] / N);
    if (g->o.beta > 0) loom_metrics_real(mx, "kl", m[M_KL] / tok);
    loom_metrics_real(mx, "clip_ratio/low_mean", m[M_CLOW] / tok);
    loom_metrics_real(mx, "clip_ratio/high_mean", m[M_CHIGH] / tok);
    loom_metrics_real(mx, "clip_ratio/region_mean", m[M_CREG] / tok);
    loom_metrics_real(mx, "sampling/logp_diff_max", g->logp_diff);
    loom_metrics_real(mx, "rollout_s", g->rollout_s);
    loom_metrics_real(mx, "update_s", g->update_s);
}
