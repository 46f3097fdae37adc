/* loom serve under tensor parallelism (docs/inference.md): tp rank 0 drives its engine and,
 * before each step, broadcasts to its tp group what it did to it since the last one (submits
 * with their prompt and parameters, cancellations, releases); the other tp ranks replay that
 * on their engines (server_tp_follow) and step with it, so every engine of the group holds the
 * same requests and their forwards meet at the model's communication points. With tp 1 these
 * are the engine's own operations. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "infer/server_internal.h"
#include "loom/grammar.h"



static void log_add(server *S, const void *p, size_t n) { loom_sbuf_append(&S->log, p, n); }
static void log_i64(server *S, int64_t v) { log_add(S, &v, sizeof v); }

/* the log to the followers (two broadcasts: its length, its bytes), then empty */
void server_tp_log_send(server *S) {
    int64_t n = (int64_t)S->log.len;
    loom_broadcast(S->mesh, LOOM_GROUP_TP, &n, 1, LOOM_I64, 0);
    if (n) loom_broadcast(S->mesh, LOOM_GROUP_TP, S->log.p, (size_t)n, LOOM_U8, 0);
    S->log.len = 0;
}

/* every field of loom_gen_params travels with a submit (eng_submit, follow): a new field must
 * be added to both */
_Static_assert(sizeof(void *) != 8 || sizeof(loom_gen_params) == 64,
               "loom_gen_params changed: send the new field to the tp followers");

int server_eng_submit(server *S, job *j, loom_err *err) {
    if (loom_engine_submit(S->eng, j->prompt, j->n_prompt, &j->p, server_on_text, j, &j->engine_id, err))
        return -1; /* the engine is unchanged: nothing to replay */
    if (S->tp <= 1) return 0;
    const loom_gen_params *p = &j->p;
    log_i64(S, TP_SUBMIT);
    log_i64(S, j->engine_id);
    log_i64(S, j->n_prompt);
    log_add(S, j->prompt, (size_t)j->n_prompt * sizeof(int32_t));
    const int64_t iv[] = {p->max_tokens, p->top_k, (int64_t)p->seed, p->n_stop, p->ignore_eos,
                           p->logprobs};
    const float fv[] = {p->temperature, p->top_p, p->repetition_penalty};
    log_add(S, iv, sizeof iv);
    log_add(S, fv, sizeof fv);
    for (int i = 0; i < p->n_stop; i++) {
        const int64_t l = (int64_t)strlen(p->stop[i]);
        log_i64(S, l);
        log_add(S, p->stop[i], (size_t)l);
    }
    /* a grammar travels as its canonical source (length 0: none); followers compile it */
    const char *gsrc = p->grammar ? loom_grammar_source(p->grammar) : "";
    log_i64(S, (int64_t)strlen(gsrc));
    log_add(S, gsrc, strlen(gsrc));
    return 0;
}

void server_eng_op(server *S, int op, int64_t id) {
    if (op == TP_CANCEL) loom_engine_cancel(S->eng, id);
    else loom_engine_release(S->eng, id);
    if (S->tp <= 1) return;
    log_i64(S, op);
    log_i64(S, id);
}

void server_eng_step(server *S) {
    if (S->tp > 1) {
        log_i64(S, TP_STEP);
        server_tp_log_send(S);
    }
    loom_engine_step(S->eng);
}

/* the followers leave their loop (once) */
void server_tp_stop(server *S) {
    if (S->tp <= 1 || !S->followers_wait) return;
    log_i64(S, TP_STOP);
    server_tp_log_send(S);
    S->followers_wait = 0;
}

typedef struct rdr {
    const char *p;
    size_t n, at;
} rdr;
static const void *rd_take(rdr *r, size_t n) {
    LOOM_CHECK(r->at + n <= r->n); /* the leader's own encoding: a broken invariant */
    const char *p = r->p + r->at;
    r->at += n;
    return p;
}
static int64_t rd_i64(rdr *r) {
    int64_t v;
    memcpy(&v, rd_take(r, sizeof v), sizeof v);
    return v;
}

/* A tp rank > 0: replays the leader's operations on its engine until TP_STOP. */
void server_tp_follow(server *S) {
    char *buf = NULL;
    size_t cap = 0;
    for (int stop = 0; !stop;) {
        int64_t n = 0;
        loom_broadcast(S->mesh, LOOM_GROUP_TP, &n, 1, LOOM_I64, 0);
        if (n == 0) continue; /* a heartbeat */
        if ((size_t)n > cap) {
            cap = (size_t)n;
            free(buf);
            buf = loom_malloc(cap);
        }
        loom_broadcast(S->mesh, LOOM_GROUP_TP, buf, (size_t)n, LOOM_U8, 0);
        rdr r = {buf, (size_t)n, 0};
        while (r.at < r.n && !stop) {
            const int64_t op = rd_i64(&r);
            if (op == TP_SUBMIT) {
                const int64_t id = rd_i64(&r), np = rd_i64(&r);
                LOOM_CHECK(np > 0 && np <= S->maxT);
                int32_t *prompt = loom_malloc((size_t)np * sizeof(int32_t));
                memcpy(prompt, rd_take(&r, (size_t)np * sizeof(int32_t)), (size_t)np * sizeof(int32_t));
                int64_t iv[6];
                float fv[3];
                memcpy(iv, rd_take(&r, sizeof iv), sizeof iv);
                memcpy(fv, rd_take(&r, sizeof fv), sizeof fv);
                loom_gen_params p = loom_gen_params_default();
                p.max_tokens = (int)iv[0];
                p.top_k = (int)iv[1];
                p.seed = (uint64_t)iv[2];
                p.n_stop = (int)iv[3];
                p.ignore_eos = (int)iv[4];
                p.logprobs = (int)iv[5];
                p.temperature = fv[0];
                p.top_p = fv[1];
                p.repetition_penalty = fv[2];
                LOOM_CHECK(p.n_stop >= 0 && p.n_stop <= 16);
                char *stop_mem[16] = {0};
                for (int i = 0; i < p.n_stop; i++) {
                    const int64_t l = rd_i64(&r);
                    stop_mem[i] = loom_malloc((size_t)l + 1);
                    memcpy(stop_mem[i], rd_take(&r, (size_t)l), (size_t)l);
                    stop_mem[i][l] = 0;
                }
                p.stop = (const char *const *)stop_mem;
                loom_err err = {{0}};
                int64_t got = -1;
                const int64_t gl = rd_i64(&r);
                if (gl > 0) {
                    char *gsrc = loom_malloc((size_t)gl + 1);
                    memcpy(gsrc, rd_take(&r, (size_t)gl), (size_t)gl);
                    gsrc[gl] = 0;
                    if (loom_grammar_compile_source(gsrc, &p.grammar, &err))
                        loom_comm_abort(1, "loom serve: tp follower: the grammar of request %lld "
                                           "does not compile (%s)", (long long)id, err.msg);
                    free(gsrc);
                }
                /* the leader's engine took it: this one, in the same state, must too */
                if (loom_engine_submit(S->eng, prompt, (int)np, &p, NULL, NULL, &got, &err) ||
                    got != id)
                    loom_comm_abort(1, "loom serve: tp follower: request %lld not replayed as "
                                       "the leader ran it (%s)", (long long)id, err.msg);
                loom_grammar_unref(p.grammar);
                for (int i = 0; i < p.n_stop; i++) free(stop_mem[i]);
                free(prompt);
            } else if (op == TP_CANCEL) {
                loom_engine_cancel(S->eng, rd_i64(&r));
            } else if (op == TP_RELEASE) {
                loom_engine_release(S->eng, rd_i64(&r));
            } else if (op == TP_STEP) {
                loom_engine_step(S->eng);
            } else {
                LOOM_CHECK(op == TP_STOP);
                stop = 1;
            }
        }
    }
    free(buf);
}
