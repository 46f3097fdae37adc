/* `loom data build RECIPE.yaml | inspect DIR | verify DIR`.
 * DIR is a dataset (a directory with manifest.jsonl) or a build output holding train/ and
 * val/ datasets. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "data/data_internal.h"
#include "loom/data.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom data build RECIPE.yaml   build shards + manifest from a recipe\n"
            "       loom data inspect DIR         summarize a dataset (manifest and shards)\n"
            "       loom data verify DIR          re-check every shard and checksum\n"
            "DIR is a dataset directory (with manifest.jsonl) or a build output with train/ and val/.\n");
}

/* The datasets under dir: dir itself when it has a manifest, else dir/train and dir/val. */
static int dataset_dirs(const char *dir, char out[2][4200]) {
    char p[4300];
    snprintf(p, sizeof p, "%s/manifest.jsonl", dir);
    if (loom_path_exists(p) || !loom_is_dir(dir)) {
        snprintf(out[0], 4200, "%s", dir);
        return 1;
    }
    int n = 0;
    const char *splits[2] = {"train", "val"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s/manifest.jsonl", dir, splits[i]);
        if (loom_path_exists(p)) snprintf(out[n++], 4200, "%s/%s", dir, splits[i]);
    }
    if (n == 0) snprintf(out[n++], 4200, "%s", dir); /* let open() report the missing manifest */
    return n;
}

/* Shard-looking files in the directory that the manifest does not list (they are ignored). */
static void report_unlisted(const loom_dataset *d) {
    DIR *dd = opendir(loom_dataset_dir(d));
    if (!dd) return;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 4, ".bin") != 0) continue;
        int listed = 0;
        for (int i = 0; i < loom_dataset_num_shards(d) && !listed; i++)
            listed = !strcmp(loom_dataset_entry(d, i).shard, e->d_name);
        if (!listed)
            printf("  note: %s/%s is not in the manifest (ignored)\n", loom_dataset_dir(d),
                   e->d_name);
    }
    closedir(dd);
}

static void print_preview(const loom_shard *s) {
    int32_t ids[64];
    uint64_t n = loom_shard_num_tokens(s) < 64 ? loom_shard_num_tokens(s) : 64;
    loom_shard_read_tokens(s, 0, n, ids);
    printf("    first tokens: ");
    if (loom_shard_vocab_size(s) <= 256) {
        putchar('"');
        for (uint64_t i = 0; i < n; i++) {
            int c = ids[i];
            if (c == '\n') fputs("\\n", stdout);
            else if (c == '"' || c == '\\') printf("\\%c", c);
            else if (c >= 0x20 && c < 0x7f) putchar(c);
            else printf("\\x%02x", (unsigned)c & 0xff);
        }
        puts("\"");
    } else {
        for (uint64_t i = 0; i < n && i < 16; i++) printf("%d ", ids[i]);
        puts("...");
    }
}

static int inspect_one(const char *dir) {
    loom_err err = {{0}};
    loom_dataset *d;
    if (loom_dataset_open(dir, &d, &err) != 0) {
        fprintf(stderr, "loom: data inspect: %s\n", err.msg);
        return 1;
    }
    int n = loom_dataset_num_shards(d);
    uint64_t docs = 0, bytes = 0;
    printf("dataset %s: %d shard(s), %llu tokens, vocab %u\n", dir, n,
           (unsigned long long)loom_dataset_num_tokens(d), loom_dataset_vocab_size(d));
    for (int i = 0; i < n; i++) {
        const loom_shard *s = loom_dataset_shard(d, i);
        loom_manifest_entry e = loom_dataset_entry(d, i);
        docs += loom_shard_num_docs(s);
        bytes += loom_shard_file_size(s);
        printf("  %s: %llu tokens x %u B, %llu docs, %llu bytes, tokenizer %s, source %s, "
               "created %s\n    sha256 %s  recipe %.16s\n",
               e.shard, (unsigned long long)loom_shard_num_tokens(s), loom_shard_token_width(s),
               (unsigned long long)loom_shard_num_docs(s),
               (unsigned long long)loom_shard_file_size(s), loom_shard_tokenizer_id(s),
               *e.source ? e.source : "-", *e.created ? e.created : "-", e.sha256,
               *loom_shard_recipe_id(s) ? loom_shard_recipe_id(s) : "-");
        if (i == 0 && loom_shard_num_tokens(s) > 0) print_preview(s);
    }
    printf("  total: %llu docs, %llu bytes on disk\n", (unsigned long long)docs,
           (unsigned long long)bytes);
    report_unlisted(d);
    loom_dataset_close(d);
    return 0;
}

static int verify_one(const char *dir) {
    loom_err err = {{0}};
    loom_dataset *d;
    double t0 = loom_now();
    if (loom_dataset_open(dir, &d, &err) != 0) {
        fprintf(stderr, "loom: data verify: FAILED: %s\n", err.msg);
        return 1;
    }
    printf("ok: %s: %d shard(s), %llu tokens: headers, block checksums, doc index, token ids "
           "and manifest sha256 verified (%.2f s)\n",
           dir, loom_dataset_num_shards(d), (unsigned long long)loom_dataset_num_tokens(d),
           loom_now() - t0);
    report_unlisted(d);
    loom_dataset_close(d);
    return 0;
}

int loom_cli_data(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    if (argc != 3) {
        fprintf(stderr, "loom: data %s: expected exactly one argument\n", sub);
        usage(stderr);
        return 2;
    }
    if (!strcmp(sub, "build")) {
        loom_err err = {{0}};
        if (loom_data_build(argv[2], &err) != 0) {
            fprintf(stderr, "loom: data build: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    if (!strcmp(sub, "inspect") || !strcmp(sub, "verify")) {
        char dirs[2][4200];
        int n = dataset_dirs(argv[2], dirs), rc = 0;
        for (int i = 0; i < n; i++)
            rc |= !strcmp(sub, "inspect") ? inspect_one(dirs[i]) : verify_one(dirs[i]);
        return rc;
    }
    fprintf(stderr, "loom: data: unknown subcommand '%s'\n", sub);
    usage(stderr);
    return 2;
}
