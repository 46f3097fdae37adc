/* loom generate CKPT_DIR --prompt TEXT [--tokens N --temperature T --top-k K --seed S] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/infer.h"
#include "loom/tokenizer.h"
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
    int recompute = 0, stats = 0, fmt_ids = 0;
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
        else if (!strcmp(a, "--format")) {
            if (strcmp(v, "text") && strcmp(v, "ids")) {
                fprintf(stderr, "loom: error: --format '%s': expected text or ids\n", v);
                return 2;
            }
            fmt_ids = !strcmp(v, "ids");
        }
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
    loom_run_data *run = NULL;
    loom_tokenizer *tok = NULL;
    int32_t *ids = NULL, *out = NULL;
    int rc = 1;
    if (loom_load_model_ex(ckpt, 1, 0, &m, NULL, &run, &err)) goto fail;
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
    size_t np = strlen(prompt);
    if (np == 0) prompt = "\n", np = 1;
    loom_ids enc = {0};
    if (loom_tokenizer_encode(tok, prompt, np, &enc, &err)) {
        loom_ids_free(&enc);
        goto fail;
    }
    if (enc.n == 0 || enc.n > (size_t)1 << 30) {
        loom_ids_free(&enc);
        loom_errf(&err, "--prompt: encodes to %zu tokens", enc.n);
        goto fail;
    }
    const size_t n_prompt = enc.n;
    ids = loom_malloc((n_prompt + (size_t)n_tokens) * sizeof(int32_t));
    memcpy(ids, enc.ids, n_prompt * sizeof(int32_t));
    loom_ids_free(&enc);
    loom_sampler s = {.temperature = (float)temperature, .top_k = (int)top_k,
                      .rng = {.seed = (uint64_t)seed, .stream = 0x67656e, .counter = 0}};
    out = loom_malloc((n_prompt + (size_t)n_tokens) * sizeof(int32_t));
    const double t0 = loom_now();
    int n = recompute ? loom_generate_recompute(m, mc->max_seq_len, ids, (int)n_prompt, (int)n_tokens, &s, out)
                      : loom_generate(m, mc->max_seq_len, ids, (int)n_prompt, (int)n_tokens, &s, out);
    const double dt = loom_now() - t0;
    const uint32_t tv = loom_tokenizer_vocab_size(tok);
    /* --format ids: the generated ids (not the prompt's), space-separated, for scripts */
    for (int i = (int)n_prompt; fmt_ids && i < n; i++)
        printf("%s%d", i > (int)n_prompt ? " " : "", (int)out[i]);
    for (int i = 0; !fmt_ids && i < n; i++) {
        /* ids the tokenizer does not have (a vocabulary padded beyond it) show as U+FFFD */
        if (out[i] < 0 || (uint32_t)out[i] >= tv) {
            fputs("\xEF\xBF\xBD", stdout);
            continue;
        }
        char *text = NULL;
        size_t len = 0;
        if (loom_tokenizer_decode(tok, out + i, 1, &text, &len, &err)) goto fail;
        fwrite(text, 1, len, stdout);
        free(text);
    }
    putchar('\n');
    if (stats)
        fprintf(stderr, "loom: generated %ld tokens in %.3f s (%.1f tokens/s, %s)\n", n_tokens, dt,
                dt > 0 ? (double)n_tokens / dt : 0.0, recompute ? "no KV cache" : "KV cache");
    rc = 0;
fail:
    if (rc) fprintf(stderr, "loom: error: %s\n", err.msg);
    free(ids);
    free(out);
    loom_tokenizer_free(tok);
    loom_run_data_free(run);
    loom_model_free(m);
    return rc;
usage:
    fprintf(stderr, "usage: loom generate CKPT_DIR --prompt TEXT [--tokens N --temperature T "
                    "--top-k K --seed S] [--format text|ids] [--stats] [--no-kv-cache]\n");
    return 2;
}
