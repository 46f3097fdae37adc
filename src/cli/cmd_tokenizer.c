/* `loom tokenizer train | encode | decode | info`: argument parsing around include/loom/tokenizer.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage:\n"
            "  loom tokenizer train --vocab-size N [--special TOKEN]... [--min-frequency F]\n"
            "                       --out tokenizer.json [--vocab-out vocab.json --merges-out merges.txt] FILES...\n"
            "  loom tokenizer encode TOKENIZER [--format text|json] [FILE|-]   prints the ids\n"
            "  loom tokenizer decode TOKENIZER [FILE|-]                        ids (spaces or a JSON array) -> bytes\n"
            "  loom tokenizer info   TOKENIZER                                 vocabulary size and tokenizer id\n"
            "TOKENIZER is one of: --tokenizer tokenizer.json | --vocab vocab.json --merges merges.txt\n"
            "                     | --byte [--special TOKEN]...\n");
}

static int parse_u64(const char *s, const char *what, uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > max) {
        fprintf(stderr, "loom tokenizer: %s must be an integer in [0, %llu], got '%s'\n", what,
                (unsigned long long)max, s);
        return -1;
    }
    *out = v;
    return 0;
}

typedef struct tok_args {
    const char *json, *vocab, *merges, *format, *input;
    int byte;
    const char **specials;
    int n_specials;
} tok_args;

/* Parses the tokenizer selection and common options; returns 0, or 2 on a usage error. */
static int parse_tok_args(int argc, char **argv, tok_args *a) {
    memset(a, 0, sizeof *a);
    a->specials = loom_calloc((size_t)argc + 1, sizeof *a->specials);
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(k, "--tokenizer") && has) a->json = argv[++i];
        else if (!strcmp(k, "--vocab") && has) a->vocab = argv[++i];
        else if (!strcmp(k, "--merges") && has) a->merges = argv[++i];
        else if (!strcmp(k, "--format") && has) a->format = argv[++i];
        else if (!strcmp(k, "--special") && has) a->specials[a->n_specials++] = argv[++i];
        else if (!strcmp(k, "--byte")) a->byte = 1;
        else if (k[0] == '-' && k[1]) {
            fprintf(stderr, "loom tokenizer: unknown or incomplete option '%s'\n", k);
            return 2;
        } else if (!a->input) a->input = k;
        else {
            fprintf(stderr, "loom tokenizer: more than one input file ('%s', '%s')\n", a->input, k);
            return 2;
        }
    }
    int modes = !!a->json + !!(a->vocab || a->merges) + a->byte;
    if (modes != 1 || (!!a->vocab != !!a->merges)) {
        fprintf(stderr, "loom tokenizer: give exactly one of --tokenizer FILE, --vocab FILE --merges FILE, --byte\n");
        return 2;
    }
    if (a->n_specials && !a->byte) {
        fprintf(stderr, "loom tokenizer: --special applies to --byte here (tokenizer.json lists its own)\n");
        return 2;
    }
    if (a->format && strcmp(a->format, "json") && strcmp(a->format, "text")) {
        fprintf(stderr, "loom tokenizer: --format must be text or json\n");
        return 2;
    }
    return 0;
}

static int load_tok(const tok_args *a, loom_tokenizer **t, loom_err *err) {
    if (a->json) return loom_tokenizer_load_json(a->json, t, err);
    if (a->vocab) return loom_tokenizer_load_vocab_merges(a->vocab, a->merges, t, err);
    return loom_tokenizer_byte(a->specials, a->n_specials, t, err);
}

static int read_input(const char *path, char **buf, size_t *len, loom_err *err) {
    if (path && strcmp(path, "-")) return loom_read_file(path, (size_t)1 << 31, buf, len, err);
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    if (!b) return loom_errf(err, "stdin: out of memory");
    size_t r;
    while ((r = fread(b + n, 1, cap - n, stdin)) > 0) {
        n += r;
        if (n == cap) {
            if (cap >= ((size_t)1 << 31)) {
                free(b);
                return loom_errf(err, "stdin: input larger than 2 GiB");
            }
            cap *= 2;
            char *nb = realloc(b, cap + 1);
            if (!nb) {
                free(b);
                return loom_errf(err, "stdin: out of memory");
            }
            b = nb;
        }
    }
    if (ferror(stdin)) {
        free(b);
        return loom_errf(err, "stdin: read error");
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

static int cmd_encode(int argc, char **argv) {
    tok_args a;
    int rc = parse_tok_args(argc, argv, &a);
    loom_tokenizer *t = NULL;
    char *buf = NULL;
    size_t len = 0;
    loom_ids ids = {0};
    loom_err err;
    if (rc) goto out;
    rc = 1;
    if (load_tok(&a, &t, &err) || read_input(a.input, &buf, &len, &err) ||
        loom_tokenizer_encode(t, buf, len, &ids, &err)) {
        fprintf(stderr, "loom tokenizer encode: %s\n", err.msg);
        goto out;
    }
    int json = a.format && !strcmp(a.format, "json");
    if (json) putchar('[');
    for (size_t i = 0; i < ids.n; i++) printf(i ? (json ? ", %d" : " %d") : "%d", (int)ids.ids[i]);
    printf(json ? "]\n" : "\n");
    rc = fflush(stdout) ? 1 : 0;
    if (rc) fprintf(stderr, "loom tokenizer encode: cannot write the output\n");
out:
    loom_ids_free(&ids);
    free(buf);
    loom_tokenizer_free(t);
    free(a.specials);
    return rc;
}

/* ids separated by white space, or a JSON array of integers */
static int parse_ids(const char *src, char *s, size_t len, loom_ids *out, loom_err *err) {
    size_t i = 0;
    while (i < len && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
    int json = i < len && s[i] == '[';
    if (json) i++;
    int closed = 0;
    while (i < len) {
        char c = s[i];
        if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || (json && c == ',')) {
            i++;
            continue;
        }
        if (json && c == ']') {
            closed = 1;
            i++;
            break;
        }
        if (c < '0' || c > '9')
            return loom_errf(err, "%s: byte %zu: expected a token id, found '%c'", src, i, c >= 32 && c < 127 ? c : '?');
        int64_t v = 0;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            v = v * 10 + (s[i] - '0');
            if (v > INT32_MAX) return loom_errf(err, "%s: byte %zu: token id too large", src, i);
            i++;
        }
        if (out->n == out->cap) {
            out->cap = out->cap ? 2 * out->cap : 1024;
            out->ids = realloc(out->ids, out->cap * sizeof *out->ids);
            if (!out->ids) return loom_errf(err, "%s: out of memory", src);
        }
        out->ids[out->n++] = (int32_t)v;
    }
    if (json && !closed) return loom_errf(err, "%s: the JSON array is not closed", src);
    while (i < len && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
    if (i < len) return loom_errf(err, "%s: byte %zu: unexpected text after the ids", src, i);
    return 0;
}

static int cmd_decode(int argc, char **argv) {
    tok_args a;
    int rc = parse_tok_args(argc, argv, &a);
    loom_tokenizer *t = NULL;
    char *buf = NULL, *text = NULL;
    size_t len = 0, tlen = 0;
    loom_ids ids = {0};
    loom_err err;
    if (rc) goto out;
    rc = 1;
    if (load_tok(&a, &t, &err) || read_input(a.input, &buf, &len, &err) ||
        parse_ids(a.input ? a.input : "stdin", buf, len, &ids, &err) ||
        loom_tokenizer_decode(t, ids.ids, ids.n, &text, &tlen, &err)) {
        fprintf(stderr, "loom tokenizer decode: %s\n", err.msg);
        goto out;
    }
    if (fwrite(text, 1, tlen, stdout) != tlen || fflush(stdout)) {
        fprintf(stderr, "loom tokenizer decode: cannot write the output\n");
        goto out;
    }
    rc = 0;
out:
    loom_ids_free(&ids);
    free(buf);
    free(text);
    loom_tokenizer_free(t);
    free(a.specials);
    return rc;
}

static int cmd_info(int argc, char **argv) {
    tok_args a;
    int rc = parse_tok_args(argc, argv, &a);
    loom_tokenizer *t = NULL;
    loom_err err;
    if (!rc) {
        if (load_tok(&a, &t, &err)) {
            fprintf(stderr, "loom tokenizer info: %s\n", err.msg);
            rc = 1;
        } else {
            printf("kind: %s\nvocab_size: %u\ntokenizer_id: %s\n",
                   loom_tokenizer_get_kind(t) == LOOM_TOKENIZER_BYTE ? "byte" : "bpe",
                   loom_tokenizer_vocab_size(t), loom_tokenizer_id(t));
        }
    }
    loom_tokenizer_free(t);
    free(a.specials);
    return rc;
}

static int cmd_train(int argc, char **argv) {
    loom_bpe_train_opts o = {0};
    const char *outp = NULL, *vocab_out = NULL, *merges_out = NULL;
    const char **specials = loom_calloc((size_t)argc + 1, sizeof *specials);
    const char **files = loom_calloc((size_t)argc + 1, sizeof *files);
    int n_files = 0, rc = 2, have_vocab = 0;
    uint64_t v;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(k, "--vocab-size") && has) {
            if (parse_u64(argv[++i], "--vocab-size", (1u << 21) - 1, &v)) goto out;
            o.vocab_size = (uint32_t)v;
            have_vocab = 1;
        } else if (!strcmp(k, "--min-frequency") && has) {
            if (parse_u64(argv[++i], "--min-frequency", UINT64_MAX, &v)) goto out;
            o.min_frequency = v;
        } else if (!strcmp(k, "--special") && has) specials[o.n_specials++] = argv[++i];
        else if (!strcmp(k, "--out") && has) outp = argv[++i];
        else if (!strcmp(k, "--vocab-out") && has) vocab_out = argv[++i];
        else if (!strcmp(k, "--merges-out") && has) merges_out = argv[++i];
        else if (!strcmp(k, "--quiet")) o.verbose = -1;
        else if (k[0] == '-' && k[1]) {
            fprintf(stderr, "loom tokenizer train: unknown or incomplete option '%s'\n", k);
            goto out;
        } else files[n_files++] = k;
    }
    if (!have_vocab || (!outp && !vocab_out) || !n_files || !!vocab_out != !!merges_out) {
        fprintf(stderr, "loom tokenizer train: needs --vocab-size, --out (or --vocab-out and --merges-out) and FILES\n");
        usage(stderr);
        goto out;
    }
    o.verbose = o.verbose < 0 ? 0 : 1;
    o.specials = specials;
    loom_tokenizer *t = NULL;
    loom_err err;
    rc = 1;
    if (loom_tokenizer_train(files, n_files, &o, &t, &err) ||
        (outp && loom_tokenizer_save_json(t, outp, &err)) ||
        (vocab_out && loom_tokenizer_save_vocab_merges(t, vocab_out, merges_out, &err))) {
        fprintf(stderr, "loom tokenizer train: %s\n", err.msg);
    } else {
        fprintf(stderr, "loom tokenizer train: vocabulary %u, tokenizer_id %s\n", loom_tokenizer_vocab_size(t),
                loom_tokenizer_id(t));
        rc = 0;
    }
    loom_tokenizer_free(t);
out:
    free(specials);
    free(files);
    return rc;
}

int loom_cli_tokenizer(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(sub, "encode")) return cmd_encode(argc - 1, argv + 1);
    if (!strcmp(sub, "decode")) return cmd_decode(argc - 1, argv + 1);
    if (!strcmp(sub, "info")) return cmd_info(argc - 1, argv + 1);
    fprintf(stderr, "loom tokenizer: unknown subcommand '%s'\n", sub);
    usage(stderr);
    return 2;
}
