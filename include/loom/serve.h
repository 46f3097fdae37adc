/* loom serve: an OpenAI-compatible HTTP server over the batched inference engine
 * (src/infer/server.c, libmicrohttpd; docs/inference.md). Endpoints: POST /v1/completions,
 * POST /v1/chat/completions (both with "stream": true as server-sent events), GET /v1/models,
 * GET /health. Requests are untrusted: body size, prompt and output tokens and concurrent
 * requests are limited, and every malformed request gets a 4xx with an OpenAI-style error. */
#ifndef LOOM_SERVE_H
#define LOOM_SERVE_H

#include <stddef.h>

#include "loom/base.h"
#include "loom/comm.h"
#include "loom/infer.h"
#include "loom/model.h"
#include "loom/tokenizer.h"

typedef struct loom_serve_opts {
    const char *host;          /* address to bind (default 127.0.0.1) */
    int port;                  /* 0: any free port (printed, and written to port_file) */
    const char *port_file;     /* NULL, or a file that gets the bound port */
    const char *model_id;      /* the id /v1/models lists and requests name */
    size_t max_body;           /* bytes of a request body (default 1 MiB) -> 413 */
    int max_prompt_tokens;     /* default: the model's context -> 400 */
    int max_output_tokens;     /* max_tokens cap (default: the model's context) -> 400 */
    int max_concurrent;        /* generation requests in flight (default 64) -> 429 */
    int max_connections;       /* open connections (default 2048) */
    int max_per_client;        /* open connections from one client address (default: 256, at
                                * most max_connections); over it a connection is closed at once */
    int timeout_s;             /* idle connection timeout (default 120 s) */
    int request_timeout_s;     /* a request's line, headers and body must all arrive within this
                                * many seconds of the connection opening (or of the previous
                                * response on it), however steadily they trickle; else the
                                * connection is closed (default 30 s) */
    int drain_s;               /* on SIGTERM: how long in-flight requests get (default 300 s) */
    const char *chat_template; /* /v1/chat/completions prompts: plain (default), chatml, llama3,
                                * mistral, gemma, a tokenizer_config.json or a JSON template file
                                * (include/loom/chat.h) */
    const char *chat_default_system; /* its default system message when it has none (NULL) */
    loom_engine_opts engine;
    /* Tensor parallelism: the mesh whose tp group holds the model's views (its points set on
     * the model), NULL without. Its tp rank 0 serves and drives the group's engines; on the
     * other tp ranks loom_serve_run replays the leader's engine operations until it stops. */
    struct loom_mesh *tp_mesh;
} loom_serve_opts;

/* Serves until SIGTERM or SIGINT: then it stops accepting connections, lets the requests in
 * flight finish (up to drain_s), and returns 0. Errors (bind, bad options) name the problem. */
int loom_serve_run(loom_model *m, const loom_tokenizer *tok, const loom_serve_opts *o,
                   loom_err *err);

#endif
