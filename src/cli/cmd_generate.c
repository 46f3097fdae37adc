/* loom generate CKPT_DIR --prompt TEXT [--tokens N --temperature T --top-k K --seed S] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/infer.h"
#include "loom/train.h"

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

int loom_cli_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "\n";
    long n_tokens = 200, top_k = 40, seed = 1;
    double temperature = 0.8;
    int recompute = 0, stats = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-kv-cache")) { recompute = 1; continue; }
        if (!strcmp(a, "--stats")) { stats = 1; continue; }
        if (a[0] != '-') {
            if (ckpt) goto usage;
            ckpt = a;
            continue;
        }
        if (!v) goto usage;
        i++;
        if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--tokens")) {
            if (parse_long(a, v, 0, 1000000, &n_tokens)) return 2;
        } else if (!strcmp(a, "--top-k")) {
            if (parse_long(a, v, 0, 1 << 24, &top_k)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (parse_long(a, v, 0, 0x7fffffffL, &seed)) return 2;
        } else if (!strcmp(a, "--temperature")) {
            char *end;
            temperature = strtod(v, &end);
            if (end == v || *end || !(temperature >= 0 && temperature <= 100)) {
                fprintf(stderr, "loom: error: --temperature '%s' is not a number in [0, 100]\n", v);
                return 2;
            }
        } else goto usage;
    }
    if (!ckpt) goto usage;
    loom_err err = {{0}};
    loom_model *m = NULL;
    if (loom_load_model(ckpt, 1, 0, &m, NULL, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    const loom_model_config *mc = loom_model_get_config(m);
    if (mc->head != LOOM_HEAD_LM) {
        fprintf(stderr, "loom: error: %s: a classification model does not generate text (use "
                        "loom eval)\n", ckpt);
        loom_model_free(m);
        return 1;
    }
    if (mc->vocab_size < 256) {
        fprintf(stderr, "loom: error: generate needs a byte-level model (vocab >= 256)\n");
        loom_model_free(m);
        return 1;
    }
    size_t np = strlen(prompt);
    if (np == 0) prompt = "\n", np = 1;
    int32_t *ids = loom_malloc((np + (size_t)n_tokens) * sizeof(int32_t));
    for (size_t i = 0; i < np; i++) ids[i] = (unsigned char)prompt[i];
    loom_sampler s = {.temperature = (float)temperature, .top_k = (int)top_k,
                      .rng = {.seed = (uint64_t)seed, .stream = 0x67656e, .counter = 0}};
    int32_t *out = loom_malloc((np + (size_t)n_tokens) * sizeof(int32_t));
    const double t0 = loom_now();
    int n = recompute ? loom_generate_recompute(m, mc->max_seq_len, ids, (int)np, (int)n_tokens, &s, out)
                      : loom_generate(m, mc->max_seq_len, ids, (int)np, (int)n_tokens, &s, out);
    const double dt = loom_now() - t0;
    for (int i = 0; i < n; i++) {
        /* ids >= 256 are not bytes (a larger vocabulary's unused rows): shown as U+FFFD */
        if (out[i] < 256) putchar(out[i]);
        else fputs("\xEF\xBF\xBD", stdout);
    }
    putchar('\n');
    if (stats)
        fprintf(stderr, "loom: generated %ld tokens in %.3f s (%.1f tokens/s, %s)\n", n_tokens, dt,
                dt > 0 ? (double)n_tokens / dt : 0.0, recompute ? "no KV cache" : "KV cache");
    free(ids);
    free(out);
    loom_model_free(m);
    return 0;
usage:
    fprintf(stderr, "usage: loom generate CKPT_DIR --prompt TEXT [--tokens N --temperature T "
                    "--top-k K --seed S] [--stats] [--no-kv-cache]\n");
    return 2;
}
