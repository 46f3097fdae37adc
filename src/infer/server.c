/* loom serve: OpenAI-compatible endpoints over the batched engine (docs/inference.md).
 *
 * Threads: libmicrohttpd runs a thread per connection (a handler may block: a non-streaming
 * request waits for its job, a streaming one's content reader waits for the next text); one
 * engine thread owns the engine, takes queued jobs between steps and steps while anything
 * runs. A job is shared by its connection and the engine thread (a reference each); a client
 * that goes away cancels its job. The engine loop runs on the main thread (the one that may
 * call MPI); a signal thread waits for SIGTERM/SIGINT, then stops accepting, lets the requests
 * in flight finish, and stops the loop.
 *
 * Tensor parallelism (opts.tp_mesh, docs/inference.md; server_tp.c): tp rank 0 serves and drives; before
 * each engine step it broadcasts to its tp group what it did to its engine since the last one
 * (submits with their prompt and parameters, cancellations, releases), and the other tp ranks
 * (loom_serve_run's follower loop) replay it on theirs and step with it, so every engine of the
 * group holds the same requests and their forwards meet at the model's communication points. */
#define _GNU_SOURCE
#include "loom/serve.h"
#include "loom/chat.h"
#include "loom/grammar.h"
#include "loom/signals.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "infer/server_internal.h"

/* ---- jobs ------------------------------------------------------------------------------- */

static job *job_new(void) {
    job *j = loom_calloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    return j;
}

static void job_unref(job *j) {
    pthread_mutex_lock(&j->mu);
    const int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    free(j->prompt);
    loom_grammar_unref(j->p.grammar);
    for (int i = 0; i < 16; i++) free(j->stop_mem[i]);
    free(j->buf.p);
    free(j->all.p);
    server_tools_free(&j->tr);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* engine thread: new text of a job */
void server_on_text(void *ctx, int64_t id, int32_t token, const char *text, size_t len, int fin) {
    (void)id;
    (void)token;
    (void)fin;
    job *j = ctx;
    if (!len) return;
    pthread_mutex_lock(&j->mu);
    loom_sbuf_append(j->stream ? &j->buf : &j->all, text, len);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void job_finish(job *j, int finish, int n_gen, const char *err) {
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    j->finish = finish;
    j->n_gen = n_gen;
    if (err) snprintf(j->err, sizeof j->err, "%s", err);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void engine_main(server *S) {
    job *inflight = NULL;
    for (;;) {
        pthread_mutex_lock(&S->mu);
        if (S->tp > 1) { /* idle: a heartbeat to the followers now and then */
            while (!S->queue && !inflight && !S->stop) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += TP_HEARTBEAT_S;
                if (pthread_cond_timedwait(&S->cv, &S->mu, &until) == ETIMEDOUT &&
                    !S->queue && !S->stop) {
                    pthread_mutex_unlock(&S->mu);
                    server_tp_log_send(S);
                    pthread_mutex_lock(&S->mu);
                }
            }
        }
        while (!S->queue && !inflight && !S->stop) pthread_cond_wait(&S->cv, &S->mu);
        job *q = S->queue;
        S->queue = S->queue_tail = NULL;
        const int stop = S->stop;
        pthread_mutex_unlock(&S->mu);
        if (stop) { /* whatever is left (past the drain time) ends with an error */
            while (q) {
                job *j = q;
                q = q->next;
                job_finish(j, LOOM_FINISH_NONE, 0, "the server shut down");
                job_unref(j);
            }
            while (inflight) {
                job *j = inflight;
                inflight = j->next;
                loom_engine_cancel(S->eng, j->engine_id);
                job_finish(j, LOOM_FINISH_NONE, 0, "the server shut down");
                job_unref(j);
            }
            server_tp_stop(S);
            break;
        }
        while (q) { /* join between steps */
            job *j = q;
            q = q->next;
            loom_err err = {{0}};
            if (server_eng_submit(S, j, &err)) {
                job_finish(j, LOOM_FINISH_NONE, 0, err.msg);
                job_unref(j);
                continue;
            }
            j->next = inflight;
            inflight = j;
        }
        for (job *j = inflight; j; j = j->next)
            if (atomic_load(&j->cancelled)) server_eng_op(S, TP_CANCEL, j->engine_id);
        if (loom_engine_pending(S->eng) > 0) server_eng_step(S);
        job **pp = &inflight;
        while (*pp) {
            job *j = *pp;
            int n = 0, fin = 0;
            if (loom_engine_result(S->eng, j->engine_id, NULL, &n, NULL, NULL, &fin) == 0) {
                j->cached = loom_engine_cached_tokens(S->eng, j->engine_id);
                server_eng_op(S, TP_RELEASE, j->engine_id);
                *pp = j->next;
                job_finish(j, fin, n, NULL);
                job_unref(j);
            } else {
                pp = &j->next;
            }
        }
    }
}

static void enqueue(server *S, job *j) {
    pthread_mutex_lock(&S->mu);
    j->next = NULL;
    if (S->queue_tail) S->queue_tail->next = j;
    else S->queue = j;
    S->queue_tail = j;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
}

/* ---- connections ----------------------------------------------------------------------- */

enum { EP_NONE, EP_HEALTH, EP_MODELS, EP_COMPLETIONS, EP_CHAT };

typedef struct conn {
    server *S;
    int ep;
    char *body;
    size_t len, cap;
    int too_big;
    job *j;                     /* a generation in flight */
    int counted;                /* holds a slot of S->active */
    /* streaming */
    loom_sbuf out;              /* SSE bytes not yet handed to MHD */
    size_t ooff;                /* of out, bytes handed already */
    int sent_role, finished;
    loom_sbuf full;             /* tools: the whole reply so far, of which `sent` went out as content */
    size_t sent;
    char id[48];
    time_t created;
} conn;

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    const enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type,
                                  const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type,
                                  const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t n;
    char *clean = loom_utf8_sanitize(msg, strlen(msg), &n);
    json_t *e = json_pack("{s:s%,s:s,s:o,s:o}", "message", clean, n, "type", type, "param",
                          param ? json_string(param) : json_null(), "code", json_null());
    free(clean);
    return send_json(c, status, json_pack("{s:o}", "error", e));
}

static json_t *json_text(const char *s, size_t n) {
    size_t k;
    char *clean = loom_utf8_sanitize(s, n, &k);
    json_t *t = json_stringn(clean, k);
    free(clean);
    return t;
}

static int get_number(json_t *req, const char *key, double lo, double hi, double *v,
                      const char **bad) {
    json_t *x = json_object_get(req, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x)) {
        *bad = key;
        return -1;
    }
    const double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) {
        *bad = key;
        return -1;
    }
    *v = d;
    return 0;
}

static int get_int(json_t *req, const char *key, long long lo, long long hi, long long *v,
                   const char **bad) {
    json_t *x = json_object_get(req, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi) {
        *bad = key;
        return -1;
    }
    *v = json_integer_value(x);
    return 0;
}

static void sse_append(conn *k, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    LOOM_CHECK(s != NULL);
    loom_sbuf_append(&k->out, "data: ", 6);
    loom_sbuf_append(&k->out, s, strlen(s));
    loom_sbuf_append(&k->out, "\n\n", 2);
    free(s);
}

static json_t *stream_chunk(conn *k, const char *text, size_t n, int finish) {
    server *S = k->S;
    json_t *choice;
    if (k->ep == EP_CHAT) {
        json_t *delta = json_object();
        if (!k->sent_role) {
            json_object_set_new(delta, "role", json_string("assistant"));
            k->sent_role = 1;
        }
        if (n || !finish) json_object_set_new(delta, "content", json_text(text, n));
        choice = json_pack("{s:i,s:o,s:o}", "index", 0, "delta", delta, "finish_reason",
                           finish ? json_string(loom_finish_reason_name(finish)) : json_null());
    } else {
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "text", json_text(text, n),
                           "logprobs", json_null(), "finish_reason",
                           finish ? json_string(loom_finish_reason_name(finish)) : json_null());
    }
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", k->id, "object",
                     k->ep == EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)k->created, "model", S->o.model_id, "choices", choice);
}

/* a chunk of tool calls (the whole calls at once; OpenAI's clients join the pieces of
 * delta.tool_calls by index, so one piece each is a valid stream) */
static json_t *stream_tool_chunk(conn *k, json_t *calls) {
    json_t *list = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *x = json_deep_copy(c);
        json_object_set_new(x, "index", json_integer((json_int_t)i));
        json_array_append_new(list, x);
    }
    json_t *delta = json_object();
    if (!k->sent_role) {
        json_object_set_new(delta, "role", json_string("assistant"));
        k->sent_role = 1;
    }
    json_object_set_new(delta, "tool_calls", list);
    json_t *choice = json_pack("{s:i,s:o,s:o}", "index", 0, "delta", delta, "finish_reason", json_null());
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", k->id, "object", "chat.completion.chunk", "created",
                     (json_int_t)k->created, "model", k->S->o.model_id, "choices", choice);
}

static json_t *finish_chunk(conn *k, const char *reason) {
    json_t *choice = json_pack("{s:i,s:{},s:s}", "index", 0, "delta", "finish_reason", reason);
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", k->id, "object", "chat.completion.chunk", "created",
                     (json_int_t)k->created, "model", k->S->o.model_id, "choices", choice);
}

/* tools: new text of the reply; what cannot be part of a call goes out as content now, the
 * rest when the reply is complete (as calls, or as content when it is none) */
static void stream_tools(conn *k, const char *text, size_t n, int done, int fin) {
    job *j = k->j;
    const loom_chat_template *t = k->S->chat_tpl;
    loom_sbuf_append(&k->full, text, n);
    const char *all = k->full.p ? k->full.p : "";
    if (!done) {
        const size_t safe = server_tool_safe_prefix(t, all, k->full.len);
        if (safe > k->sent) {
            sse_append(k, stream_chunk(k, all + k->sent, safe - k->sent, 0));
            k->sent = safe;
        } else if (!k->sent_role) {
            sse_append(k, stream_chunk(k, "", 0, 0));
        }
        return;
    }
    json_t *calls = NULL;
    size_t clen = k->full.len;
    server_tool_calls(t, &j->tr, all, k->full.len, k->id, &calls, &clen);
    if (clen < k->sent) clen = k->sent; /* (cannot happen: content stops before a wrapper) */
    if (clen > k->sent) sse_append(k, stream_chunk(k, all + k->sent, clen - k->sent, 0));
    k->sent = clen;
    if (calls) {
        sse_append(k, stream_tool_chunk(k, calls));
        sse_append(k, finish_chunk(k, "tool_calls"));
        json_decref(calls);
    } else {
        sse_append(k, stream_chunk(k, "", 0, fin));
    }
}

/* MHD's content reader for a streaming response: blocks until the job has text or is done */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn *k = cls;
    job *j = k->j;
    while (k->ooff == k->out.len) {
        k->ooff = k->out.len = 0;
        if (k->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&j->mu);
        while (!j->done && j->buf.len == 0) pthread_cond_wait(&j->cv, &j->mu);
        char *text = j->buf.p;
        size_t n = j->buf.len;
        j->buf = (loom_sbuf){0};
        const int done = j->done, fin = j->finish;
        pthread_mutex_unlock(&j->mu);
        const int tools = j->chat && j->tr.mode != TOOLS_OFF && !j->err[0];
        if (tools) stream_tools(k, text ? text : "", n, done, fin);
        else if (n || (!done && !k->sent_role)) sse_append(k, stream_chunk(k, text ? text : "", n, 0));
        free(text);
        if (done) {
            if (tools) {
            } else if (j->err[0]) {
                json_t *e = json_pack("{s:{s:s,s:s}}", "error", "message", j->err, "type",
                                      "invalid_request_error");
                sse_append(k, e);
            } else {
                sse_append(k, stream_chunk(k, "", 0, fin));
            }
            loom_sbuf_append(&k->out, "data: [DONE]\n\n", 14);
            k->finished = 1;
        }
    }
    size_t n = k->out.len - k->ooff;
    if (n > max) n = max;
    memcpy(buf, k->out.p + k->ooff, n);
    k->ooff += n;
    return (ssize_t)n;
}

static enum MHD_Result handle_generation(server *S, conn *k, struct MHD_Connection *c) {
    json_error_t je;
    json_t *req = json_loadb(k->body ? k->body : "", k->len, JSON_REJECT_DUPLICATES, &je);
    if (!req)
        return send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL,
                          "malformed JSON body: %s (line %d, column %d)", je.text, je.line,
                          je.column);
    enum MHD_Result rc;
    const char *bad = NULL;
    char *prompt_text = NULL, *chat_stop = NULL;
    char why[512], param[96];
    job *j = NULL;
    tool_req tr = {0};
    if (!json_is_object(req)) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL,
                        "the body must be a JSON object");
        goto out;
    }
    json_t *model = json_object_get(req, "model");
    if (model && !json_is_string(model)) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "model",
                        "'model' must be a string");
        goto out;
    }
    if (model && strcmp(json_string_value(model), S->o.model_id)) {
        rc = send_error(c, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model",
                        "the model '%s' does not exist (this server has '%s')",
                        json_string_value(model), S->o.model_id);
        goto out;
    }
    if (k->ep == EP_CHAT) {
        if (server_tools_read(req, S->chat_tpl, &tr, param, sizeof param, why)) {
            rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", param, "%s", why);
            goto out;
        }
        /* the chat template (loom_chat_prompt_tools, shared with generate --chat and synth) */
        if (loom_chat_prompt_tools(S->chat_tpl, json_object_get(req, "messages"), tr.tools,
                                   &prompt_text, &chat_stop, why, sizeof why)) {
            rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "messages", "%s", why);
            goto out;
        }
    } else {
        json_t *p = json_object_get(req, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
        if (!json_is_string(p)) {
            rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "prompt",
                            "'prompt' must be a string (or an array of one string)");
            goto out;
        }
        prompt_text = loom_malloc(json_string_length(p) + 1);
        memcpy(prompt_text, json_string_value(p), json_string_length(p) + 1);
    }
    loom_gen_params gp = loom_gen_params_default();
    double temperature = 1.0, top_p = 1.0, rep = 1.0;
    long long max_tokens = k->ep == EP_CHAT ? S->o.max_output_tokens : 16, top_k = 0, seed = 0,
              n_choices = 1;
    json_t *mt = json_object_get(req, "max_completion_tokens");
    const char *mt_key = mt && !json_is_null(mt) ? "max_completion_tokens" : "max_tokens";
    if (get_number(req, "temperature", 0, 2, &temperature, &bad) ||
        get_number(req, "top_p", 0, 1, &top_p, &bad) ||
        get_number(req, "repetition_penalty", 0.01, 100, &rep, &bad) ||
        get_int(req, mt_key, 0, 1LL << 30, &max_tokens, &bad) ||
        get_int(req, "top_k", 0, 1 << 24, &top_k, &bad) ||
        get_int(req, "seed", -(1LL << 62), 1LL << 62, &seed, &bad) ||
        get_int(req, "n", 1, 1, &n_choices, &bad)) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", bad,
                        "'%s' has the wrong type or is out of range%s", bad,
                        !strcmp(bad, "n") ? " (only n = 1 is supported)" : "");
        goto out;
    }
    json_t *stream = json_object_get(req, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream)) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "stream",
                        "'stream' must be a boolean");
        goto out;
    }
    if (max_tokens > S->o.max_output_tokens) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", mt_key,
                        "'%s' is %lld, over this server's limit of %d", mt_key, max_tokens,
                        S->o.max_output_tokens);
        goto out;
    }
    j = job_new();
    json_t *stop = json_object_get(req, "stop");
    if (json_is_string(stop)) {
        j->stop_mem[0] = strdup(json_string_value(stop));
        gp.n_stop = 1;
    } else if (json_is_array(stop) && json_array_size(stop) <= 16) {
        size_t i;
        json_t *s;
        json_array_foreach(stop, i, s) {
            if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > 1024) {
                bad = "stop";
                break;
            }
            j->stop_mem[gp.n_stop++] = strdup(json_string_value(s));
        }
    } else if (stop && !json_is_null(stop)) {
        bad = "stop";
    }
    if (json_is_string(stop) && (json_string_length(stop) == 0 || json_string_length(stop) > 1024))
        bad = "stop";
    if (bad) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "stop",
                        "'stop' must be a non-empty string or an array of up to 16 of them "
                        "(each at most 1024 bytes)");
        goto out;
    }
    if (server_response_format(S, json_object_get(req, "response_format"), &j->p.grammar, why,
                               sizeof why)) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "response_format", "%s", why);
        goto out;
    }
    if (tr.mode == TOOLS_REQUIRED || tr.mode == TOOLS_NAMED) {
        if (j->p.grammar) {
            rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "response_format",
                            "'response_format' cannot be combined with a 'tool_choice' that requires a call");
            goto out;
        }
        if (server_tools_grammar(S, &tr, &j->p.grammar, why, sizeof why)) {
            rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "tools", "%s", why);
            goto out;
        }
    }
    gp.grammar = j->p.grammar; /* the job's reference */
    /* the assistant's end of turn (under a grammar, the document's end ends the turn) */
    if (chat_stop && chat_stop[0] && gp.n_stop < 16 && !gp.grammar)
        j->stop_mem[gp.n_stop++] = strdup(chat_stop);
    gp.stop = (const char *const *)j->stop_mem;
    gp.max_tokens = (int)max_tokens;
    gp.temperature = (float)temperature;
    gp.top_p = (float)top_p;
    gp.top_k = (int)top_k;
    gp.repetition_penalty = (float)rep;
    gp.seed = (uint64_t)seed;
    loom_ids ids = {0};
    loom_err err = {{0}};
    const size_t plen = strlen(prompt_text);
    if (plen == 0 || loom_tokenizer_encode(S->tok, prompt_text, plen, &ids, &err) || ids.n == 0) {
        loom_ids_free(&ids);
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "prompt",
                        "the prompt is empty or cannot be encoded");
        goto out;
    }
    if (ids.n > (size_t)S->o.max_prompt_tokens) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "prompt",
                        "the prompt has %zu tokens, over the limit of %d", ids.n,
                        S->o.max_prompt_tokens);
        loom_ids_free(&ids);
        goto out;
    }
    json_t *given = json_object_get(req, mt_key);
    if (k->ep == EP_CHAT && (!given || json_is_null(given))) /* chat default: up to the context */
        max_tokens = S->maxT + 1LL - (long long)ids.n < max_tokens ? S->maxT + 1LL - (long long)ids.n
                                                                  : max_tokens;
    if ((long long)ids.n + max_tokens > S->maxT + 1LL) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", mt_key,
                        "this model's maximum context length is %d tokens; the prompt has %zu "
                        "and %lld were asked for", S->maxT, ids.n, max_tokens);
        loom_ids_free(&ids);
        goto out;
    }
    if (atomic_fetch_add(&S->active, 1) >= S->o.max_concurrent) {
        atomic_fetch_sub(&S->active, 1);
        loom_ids_free(&ids);
        rc = send_error(c, MHD_HTTP_TOO_MANY_REQUESTS, "rate_limit_error", NULL,
                        "too many requests in flight (limit %d); retry later",
                        S->o.max_concurrent);
        goto out;
    }
    k->counted = 1;
    j->prompt = ids.ids;
    j->n_prompt = (int)ids.n;
    j->p = gp;
    j->chat = k->ep == EP_CHAT;
    j->tr = tr;
    memset(&tr, 0, sizeof tr); /* the job's now */
    j->stream = stream && json_is_true(stream);
    k->j = j;
    snprintf(k->id, sizeof k->id, "%s-%lld", j->chat ? "chatcmpl" : "cmpl",
             (long long)atomic_fetch_add(&S->next_id, 1));
    k->created = time(NULL);
    j = NULL; /* the connection's now */
    enqueue(S, k->j);
    if (k->j->stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096,
                                                                   stream_reader, k, NULL);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        rc = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        goto out;
    }
    job *jj = k->j;
    pthread_mutex_lock(&jj->mu);
    while (!jj->done) pthread_cond_wait(&jj->cv, &jj->mu);
    pthread_mutex_unlock(&jj->mu);
    if (jj->err[0]) {
        rc = send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL, "%s", jj->err);
        goto out;
    }
    json_t *choice, *calls = NULL;
    const char *fin = loom_finish_reason_name(jj->finish);
    size_t clen = jj->all.len;
    if (jj->chat)
        server_tool_calls(S->chat_tpl, &jj->tr, jj->all.p ? jj->all.p : "", jj->all.len, k->id, &calls, &clen);
    if (calls) { /* content (or null) and the calls */
        choice = json_pack("{s:i,s:{s:s,s:o,s:o},s:s}", "index", 0, "message", "role", "assistant",
                           "content", clen ? json_text(jj->all.p, clen) : json_null(), "tool_calls", calls,
                           "finish_reason", "tool_calls");
    } else if (jj->chat)
        choice = json_pack("{s:i,s:{s:s,s:o},s:s}", "index", 0, "message", "role", "assistant",
                           "content", json_text(jj->all.p ? jj->all.p : "", jj->all.len), "finish_reason",
                           fin);
    else
        choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "text",
                           json_text(jj->all.p ? jj->all.p : "", jj->all.len), "logprobs", json_null(),
                           "finish_reason", fin);
    json_t *usage = json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", jj->n_prompt, "completion_tokens",
                              jj->n_gen, "total_tokens", jj->n_prompt + jj->n_gen, "prompt_tokens_details",
                              "cached_tokens", jj->cached);
    rc = send_json(c, MHD_HTTP_OK,
                   json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", k->id, "object",
                             jj->chat ? "chat.completion" : "text_completion", "created",
                             (json_int_t)k->created, "model", S->o.model_id, "choices", choice,
                             "usage", usage));
out:
    if (j) { /* never queued: both references are ours */
        job_unref(j);
        job_unref(j);
    }
    free(prompt_text);
    free(chat_stop);
    server_tools_free(&tr);
    json_decref(req);
    return rc;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    (void)version;
    server *S = cls;
    conn *k = *con_cls;
    if (!k) { /* the first call: headers only */
        k = loom_calloc(1, sizeof *k);
        k->S = S;
        *con_cls = k;
        atomic_fetch_add(&S->open_requests, 1);
        if (!strcmp(url, "/health")) k->ep = EP_HEALTH;
        else if (!strcmp(url, "/v1/models")) k->ep = EP_MODELS;
        else if (!strcmp(url, "/v1/completions")) k->ep = EP_COMPLETIONS;
        else if (!strcmp(url, "/v1/chat/completions")) k->ep = EP_CHAT;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            const unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || n > S->o.max_body) k->too_big = 1;
        }
        if (k->too_big) { /* refused before its body is read */
            server_sock_reading(S, c, 0);
            return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
                              "the request body is over the limit of %zu bytes", S->o.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) { /* body bytes: kept up to the limit, the rest dropped */
        if (!k->too_big && k->len + *upload_size > S->o.max_body) {
            k->too_big = 1;
        }
        if (!k->too_big) {
            if (k->len + *upload_size + 1 > k->cap) {
                size_t nc = k->cap ? k->cap : 4096;
                while (nc < k->len + *upload_size + 1) nc *= 2;
                k->body = loom_realloc(k->body, nc);
                k->cap = nc;
            }
            memcpy(k->body + k->len, upload, *upload_size);
            k->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    server_sock_reading(S, c, 0); /* the whole request is here: no deadline while it is answered */
    const int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    switch (k->ep) {
    case EP_NONE:
        return send_error(c, MHD_HTTP_NOT_FOUND, "invalid_request_error", NULL,
                          "no endpoint %s %s", method, url);
    case EP_HEALTH:
        if (!is_get) break;
        if (atomic_load(&S->draining))
            return send_json(c, MHD_HTTP_SERVICE_UNAVAILABLE, json_pack("{s:s}", "status", "draining"));
        return send_json(c, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
    case EP_MODELS:
        if (!is_get) break;
        return send_json(c, MHD_HTTP_OK,
                         json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:i}]}", "object", "list", "data",
                                   "id", S->o.model_id, "object", "model", "created",
                                   (json_int_t)S->created, "owned_by", "loom", "max_model_len",
                                   S->maxT));
    default:
        if (!is_post) break;
        if (k->too_big)
            return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
                              "the request body is over the limit of %zu bytes", S->o.max_body);
        if (atomic_load(&S->draining))
            return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL,
                              "the server is shutting down");
        return handle_generation(S, k, c);
    }
    return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
                      "%s is not allowed on %s", method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    server *S = cls;
    server_sock_reading(S, c, 1); /* a next request on this connection: its deadline starts now */
    conn *k = *con_cls;
    if (!k) return;
    if (k->j) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) atomic_store(&k->j->cancelled, 1);
        job_unref(k->j);
    }
    if (k->counted) atomic_fetch_sub(&S->active, 1);
    free(k->body);
    free(k->out.p);
    free(k->full.p);
    free(k);
    *con_cls = NULL;
    atomic_fetch_sub(&S->open_requests, 1);
}

/* SIGTERM / SIGINT: loom's signal thread (loom/signals.h; never a computing or connection
 * thread) calls this; it hands the signal to the server's signal thread through a pipe */
static void on_signal(void *ctx, int sig) {
    server *S = ctx;
    const unsigned char b = (unsigned char)sig;
    if (write(S->sig_pipe[1], &b, 1) < 0) {} /* non-blocking: a full pipe has one already */
}

/* the signal thread: SIGTERM/SIGINT, then stop accepting, drain, and stop the engine loop */
static void *signal_main(void *arg) {
    server *S = arg;
    unsigned char b = 0;
    while (read(S->sig_pipe[0], &b, 1) < 0 && errno == EINTR) {}
    const int sig = b;
    fprintf(stderr, "loom: %s: finishing %d request(s) in flight, then exiting\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT", atomic_load(&S->open_requests));
    atomic_store(&S->draining, 1);
    atomic_store(&S->gate_stop, 1); /* no new connections: the gatekeeper closes its waiting ones */
    server_gate_wakeup(S);
    const double t0 = loom_now();
    while (atomic_load(&S->open_requests) > 0 && loom_now() - t0 < S->o.drain_s) usleep(20000);
    /* the engine loop ends any job still running */
    pthread_mutex_lock(&S->mu);
    S->stop = 1;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    return NULL;
}

int loom_serve_run(loom_model *m, const loom_tokenizer *tok, const loom_serve_opts *o,
                   loom_err *err) {
    server *S = loom_calloc(1, sizeof *S);
    S->listen_fd = S->gate_wake[0] = S->gate_wake[1] = -1;
    S->m = m;
    S->tok = tok;
    S->o = *o;
    S->mesh = o->tp_mesh;
    S->tp = S->mesh ? loom_mesh_size(S->mesh, LOOM_GROUP_TP) : 1;
    S->maxT = loom_model_get_config(m)->max_seq_len;
    S->created = time(NULL);
    if (!S->o.host) S->o.host = "127.0.0.1";
    if (!S->o.model_id) S->o.model_id = "loom";
    if (!S->o.max_body) S->o.max_body = (size_t)1 << 20;
    if (S->o.max_prompt_tokens <= 0 || S->o.max_prompt_tokens > S->maxT)
        S->o.max_prompt_tokens = S->maxT;
    if (S->o.max_output_tokens <= 0) S->o.max_output_tokens = S->maxT;
    if (S->o.max_concurrent <= 0) S->o.max_concurrent = 64;
    if (S->o.max_connections <= 0) S->o.max_connections = 2048;
    if (S->o.timeout_s <= 0) S->o.timeout_s = 120;
    if (S->o.request_timeout_s <= 0) S->o.request_timeout_s = 30;
    if (S->o.max_per_client <= 0) S->o.max_per_client = 256;
    if (S->o.max_per_client > S->o.max_connections) S->o.max_per_client = S->o.max_connections;
    if (S->o.drain_s <= 0) S->o.drain_s = 300;
    if (S->o.engine.max_batch <= 0) S->o.engine.max_batch = 16;
    if (S->tp > 1 && loom_mesh_rank(S->mesh, LOOM_GROUP_TP) > 0) { /* a follower */
        int rc = loom_engine_create(m, tok, &S->o.engine, &S->eng, err);
        if (rc == 0) server_tp_follow(S);
        loom_engine_free(S->eng);
        free(S);
        return rc;
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)S->o.port);
    int rc = 0;
    S->followers_wait = S->tp > 1;
    if (inet_pton(AF_INET, S->o.host, &addr.sin_addr) != 1) {
        rc = loom_errf(err, "--host '%s' is not an IPv4 address", o->host);
        goto out;
    }
    if (loom_chat_template_load(S->o.chat_template ? S->o.chat_template : "plain", &S->chat_tpl, err) == 0 &&
        S->o.chat_default_system && !S->chat_tpl->default_system)
        S->chat_tpl->default_system = loom_strdup(S->o.chat_default_system);
    if (!S->chat_tpl) {
        rc = -1;
        goto out;
    }
    S->gcache = loom_grammar_cache_new(16);
    if (loom_engine_create(m, tok, &S->o.engine, &S->eng, err)) {
        S->followers_wait = 0; /* theirs failed alike: they have left */
        rc = -1;
        goto out;
    }
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    pthread_mutex_init(&S->sock_mu, NULL);
    /* SIGTERM/SIGINT go to the server's signal thread (on_signal) */
    LOOM_CHECK(pipe2(S->sig_pipe, O_CLOEXEC) == 0);
    LOOM_CHECK(fcntl(S->sig_pipe[1], F_SETFL, O_NONBLOCK) == 0);
    loom_signals_catch(on_signal, S);
    signal(SIGPIPE, SIG_IGN);
    pthread_t sig_thread;
    /* loom's own listen socket: the gatekeeper accepts and hands connections to MHD */
    S->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const int one = 1;
    if (S->listen_fd < 0 || setsockopt(S->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(S->listen_fd, (struct sockaddr *)&addr, sizeof addr) || listen(S->listen_fd, 1024)) {
        rc = loom_errf(err, "cannot listen on %s:%d (%s)", S->o.host, S->o.port, strerror(errno));
        goto done;
    }
    struct sockaddr_in bound;
    socklen_t bl = sizeof bound;
    const int port = getsockname(S->listen_fd, (struct sockaddr *)&bound, &bl) == 0
                         ? (int)ntohs(bound.sin_port) : S->o.port;
    S->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD |
                                     MHD_USE_ITC | MHD_USE_NO_LISTEN_SOCKET,
                                 0, NULL, NULL, handler, S, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)S->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)S->o.timeout_s, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                 (unsigned)S->o.max_per_client, MHD_OPTION_NOTIFY_CONNECTION,
                                 server_on_connection, S, MHD_OPTION_THREAD_STACK_SIZE,
                                 (size_t)(512 * 1024), MHD_OPTION_NOTIFY_COMPLETED, completed, S,
                                 MHD_OPTION_END);
    if (!S->daemon) {
        rc = loom_errf(err, "cannot start the HTTP server (libmicrohttpd) on %s:%d%s%s", S->o.host,
                       port, errno ? ": " : "", errno ? strerror(errno) : "");
        goto done;
    }
    if (pipe2(S->gate_wake, O_CLOEXEC | O_NONBLOCK)) {
        rc = loom_errf(err, "cannot create a pipe: %s", strerror(errno));
        goto done;
    }
    if (pthread_create(&S->gate, NULL, server_gate_main, S)) {
        rc = loom_errf(err, "cannot start the gatekeeper thread");
        goto done;
    }
    S->gate_started = 1;
    if (S->o.port_file) {
        char b[32];
        const int n = snprintf(b, sizeof b, "%d\n", port);
        if (loom_write_file_atomic(S->o.port_file, b, (size_t)n, err)) {
            rc = -1;
            goto done;
        }
    }
    if (pthread_create(&S->reaper, NULL, server_reaper_main, S)) {
        rc = loom_errf(err, "cannot start the connection reaper thread");
        goto done;
    }
    S->reaper_started = 1;
    if (pthread_create(&sig_thread, NULL, signal_main, S)) {
        rc = loom_errf(err, "cannot start the signal thread");
        goto done;
    }
    fprintf(stderr, "loom: serving '%s' on http://%s:%d (/v1/completions, /v1/chat/completions, "
                    "/v1/models, /health)%s\n", S->o.model_id, S->o.host, port,
            S->tp > 1 ? " over a tensor-parallel group" : "");
    engine_main(S); /* until the signal thread stops it */
    pthread_join(sig_thread, NULL);
done:
    if (S->gate_started) {
        atomic_store(&S->gate_stop, 2);
        server_gate_wakeup(S);
        pthread_join(S->gate, NULL);
    }
    if (S->listen_fd >= 0) close(S->listen_fd);
    if (S->gate_wake[0] >= 0) close(S->gate_wake[0]), close(S->gate_wake[1]);
    if (S->daemon) MHD_stop_daemon(S->daemon);
    if (S->reaper_started) {
        atomic_store(&S->reaper_stop, 1);
        pthread_join(S->reaper, NULL);
    }
    pthread_mutex_destroy(&S->sock_mu);
    loom_signals_catch(NULL, NULL); /* returns once no call of on_signal runs */
    close(S->sig_pipe[0]);
    close(S->sig_pipe[1]);
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->cv);
out:
    server_tp_stop(S); /* the loop never ran (an error): the followers still wait for it */
    loom_engine_free(S->eng);
    loom_chat_template_free(S->chat_tpl);
    loom_grammar_cache_free(S->gcache);
    free(S->log.p);
    free(S);
    return rc;
}
