/* loom serve CKPT_DIR [--host H] [--port P] [--port-file F] [--model-id ID] [--max-body BYTES]
 *   [--max-prompt-tokens N] [--max-tokens N] [--max-concurrent N] [--max-connections N]
 *   [--max-connections-per-client N] [--batch N] [--kv-budget-mb M] [--timeout S]
 *   [--request-timeout S] [--drain S] [--template plain|chatml|qwen|llama3|llama3.1|mistral|gemma|gemma3|FILE] [--tp T]
 * An OpenAI-compatible server over the batched engine (docs/inference.md). With --tp T under
 * `mpirun -np T` the model is split over the T ranks: rank 0 serves, the others follow. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/comm.h"
#include "loom/load.h"
#include "loom/serve.h"
#include "loom/tp.h"

static int parse_num(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "loom: error: %s '%s' is not an integer in [%lld, %lld]\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int serve_main(int argc, char **argv) {
    const char *ckpt = NULL;
    long long tp = 1;
    loom_serve_opts o;
    memset(&o, 0, sizeof o);
    o.port = 8080;
    long long v;
    int wbf16 = 0, cbf16 = 0, weights_given = 0, prefix = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            if (ckpt) goto usage;
            ckpt = a;
            continue;
        }
        if (!val) goto usage;
        i++;
        if (!strcmp(a, "--host")) o.host = val;
        else if (!strcmp(a, "--port-file")) o.port_file = val;
        else if (!strcmp(a, "--template")) o.chat_template = val;
        else if (!strcmp(a, "--prefix-cache")) {
            if (strcmp(val, "on") && strcmp(val, "off")) {
                fprintf(stderr, "loom: error: --prefix-cache must be on or off\n");
                return 2;
            }
            prefix = !strcmp(val, "on");
        }
        else if (!strcmp(a, "--weights")) {
            if (cli_parse_weights(val, &wbf16)) return 2;
            weights_given = 1;
        } else if (!strcmp(a, "--compute")) {
            if (cli_parse_compute(val, &cbf16)) return 2;
        } else if (!strcmp(a, "--model-id")) {
            if (!val[0] || strlen(val) > 256) {
                fprintf(stderr, "loom: error: --model-id must be 1 to 256 bytes\n");
                return 2;
            }
            o.model_id = val;
        }
#define NUM(flag, lo, hi, dst)                          \
    else if (!strcmp(a, flag)) {                        \
        if (parse_num(a, val, lo, hi, &v)) return 2;    \
        dst = v;                                        \
    }
        NUM("--port", 0, 65535, o.port)
        NUM("--max-body", 64, 1LL << 30, o.max_body)
        NUM("--max-prompt-tokens", 1, 1 << 24, o.max_prompt_tokens)
        NUM("--max-tokens", 1, 1 << 24, o.max_output_tokens)
        NUM("--max-concurrent", 1, 1 << 20, o.max_concurrent)
        NUM("--max-connections", 1, 1 << 20, o.max_connections)
        NUM("--batch", 1, 4096, o.engine.max_batch)
        NUM("--kv-budget-mb", 1, 1LL << 24, o.engine.kv_budget_bytes)
        NUM("--max-connections-per-client", 1, 1 << 20, o.max_per_client)
        NUM("--timeout", 1, 86400, o.timeout_s)
        NUM("--request-timeout", 1, 86400, o.request_timeout_s)
        NUM("--drain", 1, 86400, o.drain_s)
        NUM("--tp", 1, 4096, tp)
#undef NUM
        else goto usage;
    }
    if (!ckpt) goto usage;
    if (cli_compute_weights(cbf16, weights_given, &wbf16)) return 2;
    o.engine.kv_budget_bytes <<= 20;
    if (!o.model_id) { /* the run directory's name */
        const char *b = ckpt + strlen(ckpt);
        while (b > ckpt && b[-1] == '/') b--;
        const char *e = b;
        while (b > ckpt && b[-1] != '/') b--;
        static char id[257];
        snprintf(id, sizeof id, "%.*s", (int)(e - b > 256 ? 256 : e - b), b);
        o.model_id = id[0] ? id : "loom";
    }
    loom_err err = {{0}};
    loom_model *m = NULL;
    loom_run_data *run = NULL;
    loom_tokenizer *tok = NULL;
    loom_mesh *mesh = NULL;
    loom_tp *tpc = NULL;
    int rc = 1;
    const int world = loom_comm_world_size(), rank = loom_comm_world_rank();
    if (tp > 1 && world != tp) { /* one server: one replica */
        if (rank == 0)
            fprintf(stderr, "loom: error: loom serve --tp %lld serves one model split over %lld "
                            "ranks: run it under mpirun -np %lld (this job has %d)\n", tp, tp,
                    tp, world);
        return 2;
    }
    if (tp == 1 && world > 1) {
        if (rank == 0)
            fprintf(stderr, "loom: error: loom serve under mpirun needs --tp (the model split "
                            "over the ranks); for replicas, start one server per process\n");
        return 2;
    }
    const loom_model_layout lay = {.tp = (int)tp, .tp_rank = rank};
    if (tp > 1) {
        loom_mesh_spec spec;
        loom_mesh_spec_default(&spec);
        spec.tp = (int)tp;
        if (loom_mesh_create(&spec, NULL, &mesh, &err)) loom_comm_fail_all(&err);
        tpc = loom_tp_create(mesh);
        o.tp_mesh = mesh;
    }
    if (loom_load_model_view(ckpt, tp > 1 ? &lay : NULL, 1, 0, &m, NULL, &run, NULL, &err))
        goto fail;
    /* the tensor-parallel collectives carry the model's device buffers (staged through host
     * memory, or NCCL, on a GPU backend: docs/gpu.md "Communication") */
    if (mesh && loom_comm_set_device(mesh, loom_model_backend(m), &err)) goto fail;
    if (!o.chat_template && run->chat_template) { /* recorded by an import from the model's tokenizer_config.json */
        o.chat_template = run->chat_template;
        o.chat_default_system = run->chat_default_system;
    }
    if (tpc) {
        const loom_comm_points pts = loom_tp_comm_points(tpc);
        loom_model_set_comm_points(m, &pts);
        /* what this rank holds: its view and, per cached position, its kv heads */
        fprintf(stderr, "loom: rank %d (tp rank %d of %lld): parameters %.2f MiB (%zu floats), "
                        "KV cache %zu bytes per position (at most: a sliding layer holds its "
                        "window)\n", rank, rank, tp,
                (double)loom_model_num_params(m) * sizeof(float) / (1 << 20),
                loom_model_num_params(m), loom_model_kv_floats_per_pos(m) * 2 * sizeof(float));
    }
    if (loom_model_get_config(m)->head != LOOM_HEAD_LM) {
        loom_errf(&err, "%s: a classification model does not generate text", ckpt);
        goto fail;
    }
    /* prefix caching: on unless a layer slides (its ring holds only a window) */
    int ring = 0;
    for (int l = 0; l < loom_model_get_config(m)->n_layer; l++)
        ring |= loom_model_kv_slots(m, l, loom_model_get_config(m)->max_seq_len) < loom_model_get_config(m)->max_seq_len;
    if (prefix < 0) {
        prefix = !ring;
        if (ring && rank == 0) fprintf(stderr, "loom: prefix caching off: the model has sliding-window layers\n");
    }
    o.engine.prefix_cache = prefix;
    if (cli_set_weights(m, wbf16, cbf16, &err)) goto fail;
    if (loom_run_data_tokenizer(run, &tok, &err)) goto fail;
    if (loom_tokenizer_vocab_size(tok) > (uint32_t)loom_model_get_config(m)->vocab_size) {
        loom_errf(&err, "%s: the tokenizer has more ids than model.vocab_size", run->where);
        goto fail;
    }
    if (loom_serve_run(m, tok, &o, &err)) goto fail;
    rc = 0;
fail:
    /* an error before serving is every rank's alike (the checkpoint); a rank's own (the
     * port) ends the job */
    if (rc && world > 1) loom_comm_fail(&err);
    if (rc) fprintf(stderr, "loom: error: %s\n", err.msg);
    loom_tokenizer_free(tok);
    loom_run_data_free(run);
    loom_model_free(m);
    loom_tp_free(tpc);
    loom_mesh_free(mesh);
    return rc;
usage:
    fprintf(stderr, "usage: loom serve CKPT_DIR [--host H (127.0.0.1)] [--port P (8080; 0: any)] "
                    "[--port-file F] [--model-id ID] [--max-body BYTES] [--max-prompt-tokens N] "
                    "[--max-tokens N] [--max-concurrent N] [--max-connections N] "
                    "[--max-connections-per-client N] [--batch N] [--kv-budget-mb M] [--timeout S] "
                    "[--request-timeout S] [--drain S] [--weights fp32|bf16|int8|int4] "
                    "[--compute fp32|bf16] [--prefix-cache on|off (on)] [--template plain|chatml|qwen|llama3|llama3.1|mistral|gemma|gemma3|FILE (plain): the chat template] "
                    "[--tp T: under mpirun -np T, the model split over the T ranks]\n");
    return 2;
}

int loom_cli_serve(int argc, char **argv) { return cli_with_comm(argc, argv, serve_main); }
