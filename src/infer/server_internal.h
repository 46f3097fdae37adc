/* The server's private state, shared by server.c (jobs, the engine thread, the handlers,
 * loom_serve_run) and server_conn.c (the connections: the request deadline's reaper and the
 * gatekeeper). */
#ifndef LOOM_INFER_SERVER_INTERNAL_H
#define LOOM_INFER_SERVER_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "loom/chat.h"
#include "loom/infer.h"
#include "loom/serve.h"

/* a request's tools (server_tools.c) */
enum { TOOLS_OFF = 0, TOOLS_AUTO, TOOLS_REQUIRED, TOOLS_NAMED };
typedef struct tool_req {
    json_t *tools;              /* the request's function definitions (checked), or NULL */
    int mode;                   /* TOOLS_*: OFF = the reply is not read for calls */
    char named[65];             /* TOOLS_NAMED: the function */
    int parallel;               /* parallel_tool_calls (default 1) */
} tool_req;

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                   /* connection + engine */
    struct job *next;           /* the submission queue / the engine's in-flight list */
    /* request (set by the handler before queueing) */
    int32_t *prompt;
    int n_prompt;
    loom_gen_params p;
    char *stop_mem[16];
    int chat, stream;
    tool_req tr;                /* chat: its tools and tool_choice */
    /* progress (under mu) */
    loom_sbuf buf;              /* text not yet taken by the reader */
    loom_sbuf all;              /* the whole text (non-streaming) */
    int done, finish, n_gen;
    int cached;                 /* prompt tokens from the prefix cache */
    char err[sizeof(loom_err)];   /* set when the engine refused the request */
    atomic_int cancelled;
    int64_t engine_id;
} job;

typedef struct server {
    loom_model *m;
    loom_mesh *mesh;            /* tp > 1: the tp group's mesh (tp rank 0 drives) */
    int tp;
    int followers_wait;         /* tp > 1: the followers are in their loop until TP_STOP */
    loom_sbuf log;              /* tp > 1: engine operations since the last broadcast */
    int sig_pipe[2];            /* SIGTERM, SIGINT: on_signal writes, the signal thread reads */
    struct MHD_Daemon *daemon;
    const loom_tokenizer *tok;
    loom_serve_opts o;
    int maxT;
    loom_chat_template *chat_tpl; /* builds /v1/chat/completions prompts (--template) */
    struct loom_grammar_cache *gcache; /* response_format grammars, compiled once */
    loom_engine *eng;
    pthread_t eng_thread;
    pthread_mutex_t mu;         /* the queue, stop */
    pthread_cond_t cv;
    job *queue, *queue_tail;
    int stop;
    atomic_int active;          /* generation requests in flight (the 429 limit) */
    atomic_int open_requests;   /* requests being handled (drain waits for 0) */
    atomic_int draining;
    atomic_llong next_id;
    time_t created;
    /* the request deadline (o.request_timeout_s): every open connection, under sock_mu */
    pthread_mutex_t sock_mu;
    struct sockrec *socks;
    pthread_t reaper;
    int reaper_started;
    atomic_int reaper_stop;
    /* the gatekeeper (our own listen socket; see gate_main) */
    int listen_fd;
    pthread_t gate;
    int gate_started;
    atomic_int gate_stop;       /* 1: stop accepting (drain), 2: exit */
    int gate_wake[2];           /* a byte wakes its poll */
    double handoff_t0;          /* the accept time of the socket being handed to MHD */
} server;

/* One open connection (its socket context, MHD_OPTION_NOTIFY_CONNECTION): while its current
 * request's line, headers or body are still arriving (`reading`), the reaper shuts its socket
 * down once request_timeout_s have passed since `t0`, so a client that trickles a byte a
 * second cannot hold it (the idle --timeout restarts with every byte). libmicrohttpd calls the
 * CLOSED notification, which unlinks the record under sock_mu, before it closes the socket, so
 * the reaper never touches a descriptor that was closed and reused. */
typedef struct sockrec {
    struct sockrec *prev, *next;
    int fd;
    uint32_t ip;    /* the client's IPv4 address (network order), for the per-client cap */
    double t0;      /* the connection opened, or its previous request ended */
    int reading;    /* the current request has not fully arrived */
    int cut;        /* shut down by the reaper */
} sockrec;

/* server_conn.c: the request deadline (libmicrohttpd's connection notifications, the reaper
 * thread) and the gatekeeper thread */
void server_sock_reading(server *S, struct MHD_Connection *c, int reading);
void server_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code);
void *server_reaper_main(void *arg);
void *server_gate_main(void *arg);
void server_gate_wakeup(server *S);

/* server_format.c: a request's response_format (NULL or absent: none) as a grammar in *out
 * (NULL for type text; the caller's reference); -1 with the reason in why (a 400) */
struct loom_grammar;
int server_response_format(server *S, json_t *rf, struct loom_grammar **out, char *why, size_t n);

/* server_tools.c: a request's tools and tool_choice checked into tr (-1: the parameter's path
 * in param, the problem in why, 256 bytes); the reply's tool calls as OpenAI's tool_calls list
 * (*content_len: the content before them), 0 when it has none of the request's tools; how
 * much of a streamed reply may go out as content before the whole is known */
int server_tools_read(json_t *req, const loom_chat_template *t, tool_req *tr, char *param, size_t ps,
                      char *why);
void server_tools_free(tool_req *tr);
int server_tool_known(const tool_req *tr, const char *name);
int server_tool_calls(const loom_chat_template *t, const tool_req *tr, const char *text, size_t len,
                      const char *id, json_t **tool_calls, size_t *content_len);
size_t server_tool_safe_prefix(const loom_chat_template *t, const char *text, size_t len);
/* tool_choice required or named: the grammar of the calls allowed (else *out NULL); -1 with
 * the reason when the tools' parameters cannot be compiled */
int server_tools_grammar(server *S, const tool_req *tr, struct loom_grammar **out, char *why, size_t n);

/* server.c: a job's new text (the engine's callback) */
void server_on_text(void *ctx, int64_t id, int32_t token, const char *text, size_t len, int fin);

/* server_tp.c: the engine's operations, replicated over the tp group (tp > 1) */
enum { TP_SUBMIT = 1, TP_CANCEL, TP_RELEASE, TP_STEP, TP_STOP };
/* how long the leader waits, idle, before it sends the followers an empty message (they wait
 * in a broadcast, which the mesh's timeout would otherwise end) */
enum { TP_HEARTBEAT_S = 10 };
int server_eng_submit(server *S, job *j, loom_err *err);
void server_eng_op(server *S, int op, int64_t id);
void server_eng_step(server *S);
void server_tp_stop(server *S);
void server_tp_log_send(server *S);
void server_tp_follow(server *S);

#endif
