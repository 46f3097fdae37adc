/* loom generate CKPT_DIR --prompt TEXT | --prompts FILE [--tokens N --temperature T --top-k K
 *   --top-p P --repetition-penalty R --stop S ... --seed S --batch N --kv-budget-mb M --tp T
 *   --weights fp32|bf16 --compute fp32|bf16 --json-schema FILE | --json]
 * Generation runs through the batched engine (src/infer/engine.c): --prompts gives many
 * prompts (one per line, or JSONL with a "prompt" key) that run batched, one JSON line out per
 * prompt, in input order. Under mpirun the world's N ranks are N / T replicas (data-parallel
 * groups) of T tensor-parallel ranks each (--tp T, default 1): each replica takes prompts
 * i % (N / T), and the T ranks of a replica hold a tp view of the model and step their engines
 * together (docs/inference.md). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "loom/chat.h"
#include "loom/comm.h"
#include "loom/grammar.h"
#include "loom/infer.h"
#include "loom/load.h"
#include "loom/tokenizer.h"
#include "loom/tp.h"

/* CPU seconds of this process (all its threads): on a loaded machine the wall clock counts
 * other processes' turns, this does not */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "loom: error: %s '%s' is not an integer in [%ld, %ld]\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "loom: error: %s '%s' is not a number in [%g, %g]\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* the prompts of FILE: JSONL objects with a "prompt" string when the first non-blank byte is
 * '{', otherwise one prompt per line (an empty line is the prompt "\n") */
static int read_prompts(const char *path, char ***out, int *n_out, loom_err *err) {
    char *buf = NULL;
    size_t len = 0;
    if (loom_read_file(path, (size_t)1 << 30, &buf, &len, err)) return -1;
    size_t i0 = 0;
    while (i0 < len && (buf[i0] == ' ' || buf[i0] == '\n' || buf[i0] == '\r' || buf[i0] == '\t')) i0++;
    const int jsonl = i0 < len && buf[i0] == '{';
    char **v = NULL;
    int n = 0, cap = 0, line = 0, rc = 0;
    for (size_t p = 0; p < len;) {
        char *nl = memchr(buf + p, '\n', len - p);
        const size_t e = nl ? (size_t)(nl - buf) : len;
        line++;
        char *text = NULL;
        size_t tl = e - p;
        if (tl && buf[p + tl - 1] == '\r') tl--;
        if (jsonl) {
            if (tl == 0) {
                p = e + 1;
                continue;
            }
            json_error_t je;
            json_t *o = json_loadb(buf + p, tl, JSON_REJECT_DUPLICATES, &je);
            json_t *pr = o ? json_object_get(o, "prompt") : NULL;
            if (!o || !json_is_string(pr)) {
                loom_errf(err, "%s:%d: %s", path, line,
                          !o ? je.text : "expected an object with a string \"prompt\"");
                json_decref(o);
                rc = -1;
                break;
            }
            tl = json_string_length(pr);
            text = loom_malloc(tl + 1);
            memcpy(text, json_string_value(pr), tl + 1);
            json_decref(o);
        } else {
            text = loom_malloc(tl + 2);
            memcpy(text, buf + p, tl);
            text[tl] = 0;
            if (tl == 0) strcpy(text, "\n");
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            v = loom_realloc(v, (size_t)cap * sizeof *v);
        }
        v[n++] = text;
        p = e + 1;
    }
    free(buf);
    if (rc == 0 && n == 0) rc = loom_errf(err, "%s: no prompts", path);
    if (rc) {
        for (int i = 0; i < n; i++) free(v[i]);
        free(v);
        return -1;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* encodes a prompt (empty: a newline), keeping its last max_len tokens */
static int encode_prompt(const loom_tokenizer *tok, const char *text, int max_len, loom_ids *ids,
                         int *truncated, loom_err *err) {
    size_t np = strlen(text);
    if (np == 0) text = "\n", np = 1;
    return loom_prompt_encode(tok, text, np, max_len, ids, truncated, err);
}

static void print_ids(const loom_tokenizer *tok, const int32_t *ids, int n) {
    const uint32_t tv = loom_tokenizer_vocab_size(tok);
    for (int i = 0; i < n; i++) {
        /* ids the tokenizer does not have (a vocabulary padded beyond it) show as U+FFFD */
        char *text = NULL;
        size_t len = 0;
        loom_err e2 = {{0}};
        if (ids[i] < 0 || (uint32_t)ids[i] >= tv || loom_tokenizer_decode_ex(tok, ids + i, 1, LOOM_TOK_CONTINUE, &text, &len, &e2)) {
            fputs("\xEF\xBF\xBD", stdout);
            continue;
        }
        fwrite(text, 1, len, stdout);
        free(text);
    }
}

static int generate_main(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "\n", *prompts_file = NULL;
    long n_tokens = 200, top_k = 40, seed = 1, batch = 16, kv_mb = 0, tp = 1;
    int prefix = -1; /* --prefix-cache: on unless a layer slides */
    double temperature = 0.8, top_p = 1.0, rep = 1.0;
    int recompute = 0, stats = 0, n_stop = 0, fmt_ids = 0, chat = 0, wbf16 = 0;
    int cbf16 = 0, weights_given = 0;
    const char *stops[17], *template_spec = NULL, *system = NULL, *schema_file = NULL;
    int any_json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-kv-cache")) { recompute = 1; continue; }
        if (!strcmp(a, "--json")) { any_json = 1; continue; }
        if (!strcmp(a, "--stats")) { stats = 1; continue; }
        if (!strcmp(a, "--chat")) { chat = 1; continue; }
        if (a[0] != '-') {
            if (ckpt) goto usage;
            ckpt = a;
            continue;
        }
        if (!v) goto usage;
        i++;
        if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--prompts")) prompts_file = v;
        else if (!strcmp(a, "--template")) template_spec = v;
        else if (!strcmp(a, "--json-schema")) schema_file = v;
        else if (!strcmp(a, "--weights")) {
            if (cli_parse_weights(v, &wbf16)) return 2;
            weights_given = 1;
        } else if (!strcmp(a, "--compute")) {
            if (cli_parse_compute(v, &cbf16)) return 2;
        }
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--format")) {
            if (strcmp(v, "text") && strcmp(v, "ids")) {
                fprintf(stderr, "loom: error: --format '%s': expected text or ids\n", v);
                return 2;
            }
            fmt_ids = !strcmp(v, "ids");
        }
        else if (!strcmp(a, "--stop")) {
            if (n_stop == 16 || !v[0]) {
                fprintf(stderr, "loom: error: --stop: at most 16 non-empty stop strings\n");
                return 2;
            }
            stops[n_stop++] = v;
        } else if (!strcmp(a, "--tokens")) {
            if (parse_long(a, v, 0, 1000000, &n_tokens)) return 2;
        } else if (!strcmp(a, "--top-k")) {
            if (parse_long(a, v, 0, 1 << 24, &top_k)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (parse_long(a, v, 0, 0x7fffffffL, &seed)) return 2;
        } else if (!strcmp(a, "--batch")) {
            if (parse_long(a, v, 1, 4096, &batch)) return 2;
        } else if (!strcmp(a, "--kv-budget-mb")) {
            if (parse_long(a, v, 1, 1L << 24, &kv_mb)) return 2;
        } else if (!strcmp(a, "--prefix-cache")) {
            if (strcmp(v, "on") && strcmp(v, "off")) {
                fprintf(stderr, "loom: error: --prefix-cache must be on or off\n");
                return 2;
            }
            prefix = !strcmp(v, "on");
        } else if (!strcmp(a, "--tp")) {
            if (parse_long(a, v, 1, 4096, &tp)) return 2;
        } else if (!strcmp(a, "--temperature")) {
            if (parse_float(a, v, 0, 100, &temperature)) return 2;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_float(a, v, 0, 1, &top_p)) return 2;
        } else if (!strcmp(a, "--repetition-penalty")) {
            if (parse_float(a, v, 0.01, 100, &rep)) return 2;
        } else goto usage;
    }
    if (!ckpt) goto usage;
    if (cli_compute_weights(cbf16, weights_given, &wbf16)) return 2;
    /* --json-schema FILE / --json: the output constrained to a document (docs/inference.md,
     * "Structured output"); a schema loom cannot constrain to is a usage error */
    loom_grammar *grammar = NULL;
    if (schema_file || any_json) {
        loom_err gerr = {{0}};
        char *schema = NULL;
        size_t slen = 0;
        if (schema_file && any_json) {
            fprintf(stderr, "loom: error: --json-schema and --json are exclusive\n");
            return 2;
        }
        if (recompute) {
            fprintf(stderr, "loom: error: --%s runs through the KV-cache engine, not --no-kv-cache\n",
                    any_json ? "json" : "json-schema");
            return 2;
        }
        if ((schema_file && loom_read_file(schema_file, (size_t)1 << 24, &schema, &slen, &gerr)) ||
            loom_grammar_json(NULL, schema, &grammar, &gerr)) {
            fprintf(stderr, "loom: error: %s: %s\n", schema_file ? schema_file : "--json", gerr.msg);
            free(schema);
            return 2;
        }
        free(schema);
    }
    /* the world's ranks: dp replicas of tp ranks each, tp innermost (rank = dp_idx * tp +
     * tp_idx); each replica a group that steps together */
    const int rank = loom_comm_world_rank(), world = loom_comm_world_size();
    if (world % tp) {
        if (rank == 0)
            fprintf(stderr, "loom: error: --tp %ld does not divide the %d ranks of the job "
                            "(mpirun -np must be a multiple of --tp)\n", tp, world);
        loom_grammar_unref(grammar);
        return 2;
    }
    const int dp = world / (int)tp, dp_idx = rank / (int)tp, tp_idx = rank % (int)tp;
    loom_err err = {{0}};
    loom_mesh *mesh = NULL;
    loom_tp *tpc = NULL;
    if (tp > 1) {
        loom_mesh_spec spec;
        loom_mesh_spec_default(&spec);
        spec.tp = (int)tp;
        if (loom_mesh_create(&spec, NULL, &mesh, &err)) loom_comm_fail_all(&err);
        LOOM_CHECK(loom_mesh_rank(mesh, LOOM_GROUP_TP) == tp_idx &&
                   loom_mesh_rank(mesh, LOOM_GROUP_DP) == dp_idx);
        tpc = loom_tp_create(mesh);
    }
    if (!prompts_file && dp_idx > 0) { /* one prompt: the first replica runs it */
        loom_grammar_unref(grammar);
        loom_tp_free(tpc);
        loom_mesh_free(mesh);
        return 0;
    }
    loom_model *m = NULL;
    loom_run_data *run = NULL;
    loom_tokenizer *tok = NULL;
    loom_engine *eng = NULL;
    char **prompts = NULL;
    int n_prompts = 0;
    int64_t *ids = NULL;
    loom_ids enc = {0};
    loom_chat_template *tpl = NULL;
    char **rendered = NULL, *stop = NULL; /* --chat: each prompt as a user turn + the opening */
    int n_rendered = 0;
    int rc = 1;
    if (prompts_file && read_prompts(prompts_file, &prompts, &n_prompts, &err)) goto fail;
    if (prompts_file && recompute) {
        loom_errf(&err, "--no-kv-cache runs one --prompt, not --prompts");
        goto fail;
    }
    if (tp > 1 && recompute) {
        loom_errf(&err, "--no-kv-cache runs the whole model in one process, not with --tp");
        goto fail;
    }
    if (wbf16 && recompute) {
        loom_errf(&err, "--%s %s runs through the KV-cache engine, not --no-kv-cache",
                  cbf16 ? "compute" : "weights", cbf16 ? "bf16" : cli_weights_name(wbf16));
        goto fail;
    }
    /* --tp: this rank's tensor-parallel view, its boxes read from the checkpoint */
    const loom_model_layout lay = {.tp = (int)tp, .tp_rank = tp_idx};
    if (loom_load_model_view(ckpt, tp > 1 ? &lay : NULL, 1, 0, &m, NULL, &run, NULL, &err))
        goto fail;
    /* the tensor-parallel collectives carry the model's device buffers (staged through host
     * memory, or NCCL, on a GPU backend: docs/gpu.md "Communication") */
    if (mesh && loom_comm_set_device(mesh, loom_model_backend(m), &err)) goto fail;
    if (tpc) {
        const loom_comm_points pts = loom_tp_comm_points(tpc);
        loom_model_set_comm_points(m, &pts);
    }
    if (cli_set_weights(m, wbf16, cbf16, &err)) goto fail;
    const loom_model_config *mc = loom_model_get_config(m);
    if (mc->head != LOOM_HEAD_LM) {
        loom_errf(&err, "%s: a classification model does not generate text (use loom eval)", ckpt);
        goto fail;
    }
    /* prompts are encoded and outputs decoded with the tokenizer the model was trained with */
    if (loom_run_data_tokenizer(run, &tok, &err)) goto fail;
    if (loom_tokenizer_vocab_size(tok) > (uint32_t)mc->vocab_size) {
        loom_errf(&err, "%s: the tokenizer has %u ids, more than model.vocab_size %d", run->where,
                  loom_tokenizer_vocab_size(tok), mc->vocab_size);
        goto fail;
    }
    const int T = mc->max_seq_len;
    if (chat) { /* the chat template the model was fine-tuned with (docs/finetune.md) */
        /* --template, else the one an import recorded from the model's tokenizer_config.json, else chatml */
        if (loom_chat_template_load(template_spec ? template_spec : run->chat_template ? run->chat_template : "chatml",
                                    &tpl, &err))
            goto fail;
        if (!template_spec && run->chat_template && run->chat_default_system && !tpl->default_system)
            tpl->default_system = loom_strdup(run->chat_default_system);
        if (system && *system && !(tpl->roles & (1u << LOOM_ROLE_SYSTEM))) {
            loom_errf(&err, "--system: template '%s' has no system role (its Hugging Face template refuses one); "
                            "put the instructions into the prompt", tpl->name);
            goto fail;
        }
        n_rendered = prompts_file ? n_prompts : 1;
        rendered = loom_calloc((size_t)n_rendered, sizeof *rendered);
        for (int i = 0; i < n_rendered; i++) {
            free(stop);
            loom_chat_prompt(tpl, system, prompts_file ? prompts[i] : prompt, &rendered[i], &stop);
        }
        /* the assistant's end of turn (with a grammar, the document's end ends the turn) */
        if (stop[0] && n_stop < 17 && !grammar) stops[n_stop++] = stop;
    }
    if (recompute) { /* the reference path without a cache: one prompt */
        int trunc = 0;
        if (encode_prompt(tok, chat ? rendered[0] : prompt, T, &enc, &trunc, &err)) goto fail;
        loom_sampler s = {.temperature = (float)temperature, .top_k = (int)top_k,
                          .rng = {.seed = (uint64_t)seed, .stream = 0x67656e, .counter = 0}};
        int32_t *out = loom_malloc((enc.n + (size_t)n_tokens) * sizeof(int32_t));
        const double t0 = loom_now();
        const int n = loom_generate_recompute(m, T, enc.ids, (int)enc.n, (int)n_tokens, &s, out);
        const double dt = loom_now() - t0;
        /* --format ids: the generated ids (not the prompt's), space-separated, for scripts */
        for (int i = (int)enc.n; fmt_ids && i < n; i++)
            printf("%s%d", i > (int)enc.n ? " " : "", (int)out[i]);
        if (!fmt_ids) print_ids(tok, out, n);
        putchar('\n');
        free(out);
        if (stats)
            fprintf(stderr, "loom: generated %ld tokens in %.3f s (%.1f tokens/s, no KV cache)\n",
                    n_tokens, dt, dt > 0 ? (double)n_tokens / dt : 0.0);
        rc = 0;
        goto fail;
    }
    loom_engine_opts eo = {.max_batch = (int)batch, .kv_budget_bytes = (size_t)kv_mb << 20};
    if (prefix < 0) { /* prompts sharing a prefix (a system message, a template) reuse it */
        prefix = 1;
        for (int l = 0; l < mc->n_layer; l++)
            if (loom_model_kv_slots(m, l, mc->max_seq_len) < mc->max_seq_len) prefix = 0;
    }
    eo.prefix_cache = prefix;
    if (loom_engine_create(m, tok, &eo, &eng, &err)) goto fail;
    loom_gen_params gp = loom_gen_params_default();
    gp.max_tokens = (int)n_tokens;
    gp.temperature = (float)temperature;
    gp.top_k = (int)top_k;
    gp.top_p = (float)top_p;
    gp.repetition_penalty = (float)rep;
    gp.stop = stops;
    gp.n_stop = n_stop;
    gp.grammar = grammar;
    const int np = prompts_file ? n_prompts : 1;
    ids = loom_calloc((size_t)np, sizeof *ids);
    int n_trunc = 0;
    /* under mpirun each replica (dp group) takes prompts i with i % dp == dp_idx, every rank of
     * its tp group the same ones in the same order; the seeds depend on i only, so the output
     * does not depend on the number of ranks */
    for (int i = 0; i < np; i++) {
        int trunc = 0;
        ids[i] = -1;
        if (i % dp != dp_idx) continue;
        const char *pi = chat ? rendered[i] : prompts_file ? prompts[i] : prompt;
        if (encode_prompt(tok, pi, T, &enc, &trunc, &err)) goto fail;
        n_trunc += trunc;
        /* each prompt its own RNG stream: the seed, then the prompt's index */
        gp.seed = (uint64_t)seed + (uint64_t)i * 0x9E3779B97F4A7C15ull;
        if (loom_engine_submit(eng, enc.ids, (int)enc.n, &gp, NULL, NULL, &ids[i], &err)) {
            char msg[sizeof err.msg];
            snprintf(msg, sizeof msg, "%s", err.msg);
            if (prompts_file) loom_errf(&err, "%s: prompt %d: %s", prompts_file, i + 1, msg);
            goto fail;
        }
        /* echo the prompt as given (not before a document of --json-schema / --json: stdout is
         * the document alone) */
        if (!prompts_file && !fmt_ids && !chat && !grammar && tp_idx == 0) {
            print_ids(tok, enc.ids, (int)enc.n);
            fflush(stdout);
        }
    }
    if (n_trunc && tp_idx == 0)
        fprintf(stderr, "loom: warning: %d prompt(s) longer than the context of %d tokens keep "
                        "their last %d tokens\n", n_trunc, T, T);
    const double t0 = loom_now(), c0 = cpu_seconds();
    while (loom_engine_step(eng) > 0) {}
    const double dt = loom_now() - t0, cpu = cpu_seconds() - c0;
    int64_t total = 0;
    char *lines = NULL; /* this rank's JSON lines (--prompts) */
    size_t lines_len = 0, lines_cap = 0;
    for (int i = 0; i < np; i++) {
        const char *text;
        size_t len;
        int n, fin;
        if (ids[i] < 0) continue;
        if (tp_idx > 0) continue; /* the replica's tp rank 0 prints (its peers hold the same) */
        LOOM_CHECK(loom_engine_result(eng, ids[i], NULL, &n, &text, &len, &fin) == 0);
        total += n;
        if (!prompts_file && fmt_ids) {
            const int32_t *gt;
            LOOM_CHECK(loom_engine_result(eng, ids[i], &gt, NULL, NULL, NULL, NULL) == 0);
            for (int j = 0; j < n; j++) printf("%s%d", j ? " " : "", (int)gt[j]);
            putchar('\n');
            continue;
        }
        if (!prompts_file) {
            fwrite(text, 1, len, stdout);
            putchar('\n');
            continue;
        }
        json_t *o = json_object();
        json_object_set_new(o, "index", json_integer(i));
        /* invalid UTF-8 (sampled bytes, a prompt line) shows as U+FFFD */
        size_t sl;
        char *ps = loom_utf8_sanitize(prompts[i], strlen(prompts[i]), &sl);
        json_object_set_new(o, "prompt", json_stringn(ps, sl));
        free(ps);
        char *ts = loom_utf8_sanitize(text, len, &sl);
        json_object_set_new(o, "text", json_stringn(ts, sl));
        free(ts);
        json_object_set_new(o, "tokens", json_integer(n));
        if (fmt_ids) { /* --format ids: the generated ids too */
            const int32_t *gt;
            LOOM_CHECK(loom_engine_result(eng, ids[i], &gt, NULL, NULL, NULL, NULL) == 0);
            json_t *a = json_array();
            for (int j = 0; j < n; j++) json_array_append_new(a, json_integer(gt[j]));
            json_object_set_new(o, "ids", a);
        }
        json_object_set_new(o, "finish_reason", json_string(loom_finish_reason_name(fin)));
        char *line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        const size_t ll = strlen(line);
        if (lines_len + ll + 2 > lines_cap) {
            lines_cap = (lines_len + ll + 2) * 2;
            lines = loom_realloc(lines, lines_cap);
        }
        memcpy(lines + lines_len, line, ll);
        lines_len += ll;
        lines[lines_len++] = '\n';
        free(line);
        json_decref(o);
    }
    if (prompts_file && world == 1 && lines_len) fwrite(lines, 1, lines_len, stdout);
    if (prompts_file && world > 1) {
        /* gather every rank's lines to rank 0, which prints them in prompt order */
        loom_mesh_spec spec;
        loom_mesh *wmesh = NULL;
        loom_mesh_spec_default(&spec);
        spec.timeout_s = 86400; /* ranks wait for the slowest one's generation */
        if (loom_mesh_create(&spec, NULL, &wmesh, &err)) loom_comm_fail_all(&err);
        int64_t mine = (int64_t)lines_len, longest = 0;
        int64_t *lens = loom_calloc((size_t)world, sizeof *lens);
        loom_allgather(wmesh, LOOM_GROUP_WORLD, &mine, lens, (size_t)world, LOOM_I64); /* total count */
        for (int r = 0; r < world; r++) longest = lens[r] > longest ? lens[r] : longest;
        char *send = loom_calloc((size_t)longest + 1, 1);
        char *all = loom_malloc((size_t)world * ((size_t)longest + 1));
        if (lines_len) memcpy(send, lines, lines_len);
        loom_allgather(wmesh, LOOM_GROUP_WORLD, send, all, (size_t)world * ((size_t)longest + 1),
                       LOOM_U8);
        if (rank == 0) {
            /* replica d's tp rank 0 (world rank d * tp) holds prompts d, d + dp, ... in order:
             * one line from each in turn */
            size_t *at = loom_calloc((size_t)world, sizeof *at);
            for (int i = 0; i < np; i++) {
                const int r = (i % dp) * (int)tp;
                const char *b = all + (size_t)r * ((size_t)longest + 1);
                const char *e = memchr(b + at[r], '\n', (size_t)lens[r] - at[r]);
                LOOM_CHECK(e != NULL);
                fwrite(b + at[r], 1, (size_t)(e - (b + at[r])) + 1, stdout);
                at[r] = (size_t)(e - b) + 1;
            }
            free(at);
        }
        free(send);
        free(all);
        free(lens);
        loom_mesh_free(wmesh);
    }
    free(lines);
    if (stats) { /* what this rank holds: its view (tp > 1) and its cache */
        loom_engine_stats st;
        loom_engine_get_stats(eng, &st);
        fprintf(stderr, "loom: rank %d (replica %d, tp rank %d of %ld): parameters %.2f MiB "
                        "(%zu floats), KV cache %.2f MiB (%zu bytes) at its peak of a %.2f MiB budget\n",
                rank, dp_idx, tp_idx, tp,
                (double)loom_model_num_params(m) * sizeof(float) / (1 << 20),
                loom_model_num_params(m), (double)st.kv_peak / (1 << 20), st.kv_peak,
                (double)st.kv_budget / (1 << 20));
        if (eo.prefix_cache)
            fprintf(stderr, "loom: prefix cache: %lld prompt tokens copied from it, %lld computed; %lld "
                            "blocks held, %lld evicted\n", (long long)st.prefix_hit_tokens,
                    (long long)st.prompt_tokens, (long long)st.prefix_blocks, (long long)st.prefix_evicted);
    }
    if (stats && tp_idx == 0) {
        loom_engine_stats st;
        loom_engine_get_stats(eng, &st);
        fprintf(stderr, "loom: generated %lld tokens in %.3f s (%.1f tokens/s, KV cache, %d "
                        "prompts, batch %d, %lld steps; %.3f s of CPU: %.1f tokens per CPU second)\n",
                (long long)total, dt, dt > 0 ? (double)total / dt : 0.0, np, st.max_running,
                (long long)st.steps, cpu, cpu > 0 ? (double)total / cpu : 0.0);
        fprintf(stderr, "loom: weights %s%s; resident memory %.1f MiB\n",
                cli_weights_name(wbf16), cbf16 ? ", compute bf16" : "", cli_resident_mib());
        /* each step streams the weights once, whatever its rows (prefill steps included) */
        const double wb = (double)loom_model_decode_weight_bytes(m);
        fprintf(stderr, "loom: weight bytes: %.3f MB a step, %.3f MB per generated token (%lld "
                        "steps for %lld tokens; the KV cache's reads not counted)\n",
                wb / 1e6, total > 0 ? wb * (double)st.steps / (double)total / 1e6 : 0.0,
                (long long)st.steps, (long long)total);
        if (st.masked_tokens)
            fprintf(stderr, "loom: constrained decoding: %lld tokens masked, %.3f ms of mask per "
                            "token\n", (long long)st.masked_tokens,
                    1e3 * st.mask_seconds / (double)st.masked_tokens);
    }
    rc = 0;
fail:
    /* ends the job (the replica's peers, and the other replicas, would wait for this rank) */
    if (rc && (prompts_file || tp > 1) && world > 1) loom_comm_fail(&err);
    if (rc) fprintf(stderr, "loom: error: %s\n", err.msg);
    loom_ids_free(&enc);
    for (int i = 0; i < n_rendered; i++) free(rendered[i]);
    free(rendered);
    free(stop);
    loom_chat_template_free(tpl);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(ids);
    loom_engine_free(eng);
    loom_grammar_unref(grammar);
    loom_tokenizer_free(tok);
    loom_run_data_free(run);
    loom_model_free(m);
    loom_tp_free(tpc);
    loom_mesh_free(mesh);
    return rc;
usage:
    fprintf(stderr, "usage: loom generate CKPT_DIR (--prompt TEXT | --prompts FILE) [--tokens N "
                    "--temperature T --top-k K --top-p P --repetition-penalty R --stop S ... "
                    "--seed S --batch N --kv-budget-mb M --prefix-cache on|off] [--format text|ids] [--stats] [--no-kv-cache]\n"
                    "       [--tp T]: under mpirun -np N, N / T replicas of T tensor-parallel ranks\n"
                    "       [--weights fp32|bf16|int8|int4] [--compute fp32|bf16]: the linears' weights held "
                    "in bf16, in int8 (GGUF's Q8_0) or in int4 (Q4_K); their products in bf16 too (docs/inference.md)\n"
                    "       [--json-schema FILE | --json]: the output is a JSON document matching the schema "
                    "(any JSON object with --json; docs/inference.md, \"Structured output\")\n"
                    "       [--chat [--template chatml|qwen|llama3|llama3.1|mistral|gemma|gemma3|FILE] [--system TEXT]]: the prompt as a user "
                    "turn, the reply up to the end of the assistant's turn\n");
    return 2;
}

int loom_cli_generate(int argc, char **argv) { return cli_with_comm(argc, argv, generate_main); }
