/* loom import --hf HF_DIR OUT_CKPT [--tokenizer FILE|byte]
 * loom export --hf CKPT OUT_DIR [--max-shard-size N[K|M|G]] [--merge-lora]
 *                   [--chat-template NAME|FILE] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/interop.h"

static int parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return -1;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v == 0 || v > (UINT64_MAX >> 30)) return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

int loom_cli_import(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL};
    int npos = 0, hf = 0;
    loom_hf_import_opts o = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hf")) hf = 1;
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) o.tokenizer = argv[++i];
        else if (argv[i][0] != '-' && npos < 2) pos[npos++] = argv[i];
        else goto usage;
    }
    if (!hf || npos != 2) goto usage;
    loom_err err = {{0}};
    if (loom_hf_import(pos[0], pos[1], &o, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    printf("imported %s -> %s/step_0000000\n", pos[0], pos[1]);
    return 0;
usage:
    fprintf(stderr, "usage: loom import --hf HF_DIR OUT_CKPT [--tokenizer FILE|byte]\n");
    return 2;
}

/* loom export --gguf CKPT OUT.gguf [--type f32|bf16|q8_0|q4_k] */
static int export_gguf(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL}, *type = "f32";
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gguf")) continue;
        if (!strcmp(argv[i], "--type") && i + 1 < argc) type = argv[++i];
        else if (argv[i][0] != '-' && npos < 2) pos[npos++] = argv[i];
        else goto usage;
    }
    if (npos != 2) goto usage;
    if (strcmp(type, "f32") && strcmp(type, "bf16") && strcmp(type, "q8_0") && strcmp(type, "q4_k")) {
        fprintf(stderr, "loom: error: --type '%s': expected f32, bf16, q8_0 or q4_k\n", type);
        return 2;
    }
    loom_err err = {{0}};
    if (loom_gguf_export(pos[0], pos[1], type, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    printf("exported %s -> %s (%s)\n", pos[0], pos[1], type);
    return 0;
usage:
    fprintf(stderr, "usage: loom export --gguf CKPT OUT.gguf [--type f32|bf16|q8_0|q4_k]\n");
    return 2;
}

int loom_cli_export(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL};
    int npos = 0, hf = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--gguf")) return export_gguf(argc, argv);
    loom_hf_export_opts o = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hf")) hf = 1;
        else if (!strcmp(argv[i], "--merge-lora")) o.merge_lora = 1;
        else if (!strcmp(argv[i], "--chat-template") && i + 1 < argc) o.chat_template = argv[++i];
        else if (!strcmp(argv[i], "--max-shard-size") && i + 1 < argc) {
            if (parse_size(argv[++i], &o.max_shard_bytes)) {
                fprintf(stderr, "loom: error: --max-shard-size '%s' is not a size (e.g. 2G, "
                                "500M, 1048576)\n", argv[i]);
                return 2;
            }
        } else if (argv[i][0] != '-' && npos < 2) pos[npos++] = argv[i];
        else goto usage;
    }
    if (!hf || npos != 2) goto usage;
    loom_err err = {{0}};
    if (loom_hf_export(pos[0], pos[1], &o, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    printf("exported %s -> %s\n", pos[0], pos[1]);
    return 0;
usage:
    fprintf(stderr, "usage: loom export --hf CKPT OUT_DIR [--max-shard-size N[K|M|G]] "
                    "[--merge-lora] [--chat-template NAME|FILE]\n"
                    "       loom export --gguf CKPT OUT.gguf [--type f32|bf16|q8_0|q4_k]\n");
    return 2;
}
