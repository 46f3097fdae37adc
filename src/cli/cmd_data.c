/* `loom data build RECIPE.yaml | inspect DIR | verify [--inputs] DIR`.
 * DIR is a dataset (a directory with manifest.jsonl) or a build output holding train/ and
 * val/ datasets. inspect prints the manifest, the shards and dataset.json (sources, steps,
 * skipped inputs); verify re-checks every shard checksum, the manifest, dataset.json's
 * consistency with them, and with --inputs the SHA-256 of every input file. */
#define _GNU_SOURCE
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/comm.h"
#include "loom/parallel.h"
#include "loom/data.h"
#include "loom/windows.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom data build RECIPE.yaml   build shards + manifest from a recipe\n"
            "       loom data inspect DIR         summarize a dataset (manifest and shards)\n"
            "       loom data verify [--inputs] DIR  re-check every shard and checksum (and the\n"
            "                                     input files' SHA-256 with --inputs)\n"
            "DIR is a dataset directory (with manifest.jsonl) or a build output with train/ and val/.\n");
}

/* ---- `mpirun -np N loom data build`: the build's team hooks over the mesh's world group ---- */
static void team_max_u8(void *ctx, uint8_t *buf, size_t n) {
    loom_allreduce_max(ctx, LOOM_GROUP_WORLD, buf, n, LOOM_U8);
}
static void team_sum_i64(void *ctx, int64_t *buf, size_t n) {
    loom_allreduce_sum(ctx, LOOM_GROUP_WORLD, buf, n, LOOM_I64);
}
static void team_bcast_i64(void *ctx, int64_t *buf, size_t n) {
    loom_broadcast(ctx, LOOM_GROUP_WORLD, buf, n, LOOM_I64, 0);
}
static void team_barrier(void *ctx) { loom_barrier(ctx, LOOM_GROUP_WORLD); }

/* Builds the recipe in this process, or split over the ranks when a launcher started several.
 * Under MPI one rank's error ends the whole job (loom_comm_fail). Returns the exit code. */
static int data_build(int *argc, char ***argv, const char *recipe) {
    loom_err err = {{0}};
    if (loom_parallel_start(argc, argv, &err) != 0) {
        fprintf(stderr, "loom: data build: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (loom_comm_mpi_active() && loom_comm_world_size() > 1) {
        loom_mesh_spec spec;
        loom_mesh *mesh = NULL;
        loom_mesh_spec_default(&spec);
        /* ranks wait for each other only for imbalance (every rank reads every source), but a
         * big build's imbalance can be long: LOOM_DATA_TIMEOUT_S overrides an hour */
        spec.timeout_s = 3600;
        const char *t = getenv("LOOM_DATA_TIMEOUT_S");
        if (t && *t) {
            char *end;
            double v = strtod(t, &end);
            if (*end || !(v > 0)) {
                loom_errf(&err, "LOOM_DATA_TIMEOUT_S='%s' is not a positive number of seconds", t);
                loom_comm_fail_all(&err);
            }
            spec.timeout_s = v;
        }
        if (loom_mesh_create(&spec, NULL, &mesh, &err) != 0) loom_comm_fail_all(&err);
        loom_build_team team = {loom_comm_world_rank(), loom_comm_world_size(), mesh,
                                team_max_u8, team_sum_i64, team_bcast_i64, team_barrier};
        if (loom_data_build_team(recipe, &team, &err) != 0) {
            loom_err_prefix(&err, "data build");
            loom_comm_fail(&err);
        }
        loom_mesh_free(mesh);
    } else if (loom_data_build(recipe, &err) != 0) {
        fprintf(stderr, "loom: data build: %s\n", err.msg);
        rc = 1;
    }
    loom_comm_finalize();
    return rc;
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

/* dir/dataset.json, or NULL (with a message when it exists but does not parse) */
static json_t *load_dataset_json(const char *dir, int *bad) {
    char p[4300];
    snprintf(p, sizeof p, "%s/dataset.json", dir);
    *bad = 0;
    if (!loom_path_exists(p)) return NULL;
    json_error_t je;
    json_t *o = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        fprintf(stderr, "loom: data: %s:%d: invalid dataset.json: %s\n", p, je.line,
                o ? "not an object" : je.text);
        json_decref(o);
        *bad = 1;
        return NULL;
    }
    return o;
}

static long long jint(json_t *o, const char *k) { return (long long)json_integer_value(json_object_get(o, k)); }
static const char *jstr_or(json_t *o, const char *k, const char *dflt) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : dflt;
}

static void print_skips(json_t *o, const char *what) {
    if (!json_is_object(o) || jint(o, "count") == 0) return;
    printf("      %s: %lld\n", what, jint(o, "count"));
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(o, "first"), i, e) {
        if (i >= 10) {
            printf("        ...\n");
            break;
        }
        printf("        %s: %s\n", jstr_or(e, "what", "?"), jstr_or(e, "why", "?"));
    }
}

static void print_dataset_json(json_t *ds, const char *split) {
    json_t *rec = json_object_get(ds, "recipe"), *tok = json_object_get(ds, "tokenizer");
    printf("  dataset.json: recipe %s (sha256 %.16s), tokenizer %s (vocab %lld), loom %s\n",
           jstr_or(rec, "path", "?"), jstr_or(rec, "sha256", "?"), jstr_or(tok, "id", "?"),
           jint(tok, "vocab_size"), jstr_or(ds, "loom_version", "?"));
    printf("    inputs: %zu file(s)\n", json_array_size(json_object_get(ds, "inputs")));
    json_t *classes = json_object_get(ds, "classes");
    if (json_array_size(classes)) {
        printf("    classes:");
        size_t i;
        json_t *c;
        json_array_foreach(classes, i, c) printf(" %zu=%s", i, json_string_value(c));
        printf("\n");
    }
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(ds, "sources"), i, s) {
        json_t *sp = json_object_get(json_object_get(s, "splits"), split);
        printf("    source %s (%s, %s): weight %g, repeat_cap %g, %lld file(s); %s: %lld shard(s), "
               "%lld tokens, %lld docs\n",
               jstr_or(s, "name", "?"), jstr_or(s, "kind", "?"), jstr_or(s, "built", "?"),
               json_number_value(json_object_get(s, "weight")),
               json_number_value(json_object_get(s, "repeat_cap")), jint(s, "files"), split,
               jint(sp, "shards"), jint(sp, "tokens"), jint(sp, "documents"));
        size_t k;
        json_t *st;
        json_array_foreach(json_object_get(s, "steps"), k, st) {
            if (k == 0) {
                printf("      read: %lld docs, %lld bytes\n", jint(st, "docs_out"), jint(st, "bytes_out"));
                continue;
            }
            printf("      %s: %lld -> %lld docs, %lld -> %lld bytes", jstr_or(st, "step", "?"),
                   jint(st, "docs_in"), jint(st, "docs_out"), jint(st, "bytes_in"), jint(st, "bytes_out"));
            if (json_object_get(st, "changed")) printf(", %lld repaired", jint(st, "changed"));
            printf("\n");
        }
        print_skips(json_object_get(s, "skipped_files"), "skipped files");
        print_skips(json_object_get(s, "bad_lines"), "skipped bad lines");
        print_skips(json_object_get(s, "unlabeled"), "skipped unlabelled files");
    }
}

/* dataset.json against the opened dataset: per-source tokens and shard counts */
static int check_dataset_json(json_t *ds, const loom_dataset *d, const char *dir) {
    const char *split = jstr_or(ds, "split", "");
    json_t *rec = json_object_get(ds, "recipe");
    const char *text = jstr_or(rec, "text", NULL), *sha = jstr_or(rec, "sha256", "");
    if (text) {
        char got[65];
        loom_sha256_hex(text, json_string_length(json_object_get(rec, "text")), got);
        if (strcmp(got, sha) != 0) {
            fprintf(stderr, "loom: data verify: FAILED: %s/dataset.json: recipe.sha256 %s does not match "
                    "the recorded recipe text (%s)\n", dir, sha, got);
            return 1;
        }
    }
    /* every manifest line of a build carries the recipe hash dataset.json records */
    for (int k = 0; *sha && k < loom_dataset_num_shards(d); k++) {
        loom_manifest_entry e = loom_dataset_entry(d, k);
        if (*e.recipe && strcmp(e.recipe, sha) != 0) {
            fprintf(stderr, "loom: data verify: FAILED: %s/manifest.jsonl:%d: recipe %s, but "
                    "%s/dataset.json says the recipe's SHA-256 is %s\n", dir, e.line, e.recipe,
                    dir, sha);
            return 1;
        }
    }
    /* the manifest's order is the sample order: the build recorded it (older builds did not) */
    json_t *man = json_object_get(ds, "manifest");
    if (man) {
        json_t *order = json_object_get(man, "shards");
        const char *msha = jstr_or(man, "sha256", "");
        if (!json_is_array(order)) {
            fprintf(stderr, "loom: data verify: FAILED: %s/dataset.json: manifest.shards is not "
                    "an array\n", dir);
            return 1;
        }
        const int n = loom_dataset_num_shards(d);
        for (int k = 0; k < n && k < (int)json_array_size(order); k++) {
            loom_manifest_entry e = loom_dataset_entry(d, k);
            const char *want = json_string_value(json_array_get(order, (size_t)k));
            if (!want || strcmp(want, e.shard) != 0) {
                fprintf(stderr, "loom: data verify: FAILED: %s/manifest.jsonl:%d lists %s, but the "
                        "build wrote %s there (%s/dataset.json records the manifest's order, which "
                        "is the order of the samples): lines were reordered\n", dir, e.line,
                        e.shard, want ? want : "(not a string)", dir);
                return 1;
            }
        }
        if ((int)json_array_size(order) != n) {
            fprintf(stderr, "loom: data verify: FAILED: %s/manifest.jsonl has %d line(s), the build "
                    "wrote %zu (%s/dataset.json)\n", dir, n, json_array_size(order), dir);
            return 1;
        }
        char mpath[8500], got[65];
        loom_err merr = {{0}};
        snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", dir);
        if (loom_sha256_file(mpath, got, &merr) != 0) {
            fprintf(stderr, "loom: data verify: FAILED: %s\n", merr.msg);
            return 1;
        }
        if (strcmp(got, msha) != 0) {
            fprintf(stderr, "loom: data verify: FAILED: %s: SHA-256 %s, but the build wrote %s "
                    "(%s/dataset.json): a line was edited\n", mpath, got, msha, dir);
            return 1;
        }
    }
    json_t *counts = json_object_get(ds, "counts");
    if (jint(counts, "tokens") != (long long)loom_dataset_num_tokens(d) ||
        jint(counts, "shards") != loom_dataset_num_shards(d)) {
        fprintf(stderr, "loom: data verify: FAILED: %s/dataset.json: counts say %lld shard(s) / %lld "
                "tokens, the manifest lists %d / %llu\n", dir, jint(counts, "shards"),
                jint(counts, "tokens"), loom_dataset_num_shards(d),
                (unsigned long long)loom_dataset_num_tokens(d));
        return 1;
    }
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(ds, "sources"), i, s) {
        const char *name = jstr_or(s, "name", "");
        unsigned long long tokens = 0;
        for (int k = 0; k < loom_dataset_num_shards(d); k++)
            if (!strcmp(loom_dataset_entry(d, k).source, name)) tokens += loom_dataset_entry(d, k).tokens;
        long long want = jint(json_object_get(json_object_get(s, "splits"), split), "tokens");
        if ((long long)tokens != want) {
            fprintf(stderr, "loom: data verify: FAILED: %s/dataset.json: source '%s' has %lld tokens, "
                    "its manifest lines %llu\n", dir, name, want, tokens);
            return 1;
        }
    }
    return 0;
}

/* every input's SHA-256 against dataset.json */
static int check_inputs(json_t *ds, const char *dir) {
    size_t i;
    json_t *in;
    int bad = 0;
    json_array_foreach(json_object_get(ds, "inputs"), i, in) {
        const char *p = jstr_or(in, "path", ""), *want = jstr_or(in, "sha256", "");
        char got[65];
        loom_err err = {{0}};
        if (loom_sha256_file(p, got, &err) != 0) {
            fprintf(stderr, "loom: data verify: FAILED: input %s: %s\n", p, err.msg);
            bad = 1;
        } else if (strcmp(got, want) != 0) {
            fprintf(stderr, "loom: data verify: FAILED: input %s changed since the build: sha256 %s, "
                    "%s/dataset.json says %s\n", p, got, dir, want);
            bad = 1;
        }
    }
    if (!bad) printf("ok: %s: %zu input file(s) match their recorded sha256\n", dir,
                     json_array_size(json_object_get(ds, "inputs")));
    return bad;
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
        printf("  %s: %llu tokens x %u B, %llu docs%s, %llu bytes, tokenizer %s, source %s, "
               "created %s\n    sha256 %s  recipe %.16s\n",
               e.shard, (unsigned long long)loom_shard_num_tokens(s), loom_shard_token_width(s),
               (unsigned long long)loom_shard_num_docs(s),
               loom_shard_has_labels(s) ? " (labelled)" : "",
               (unsigned long long)loom_shard_file_size(s), loom_shard_tokenizer_id(s),
               *e.source ? e.source : "-", *e.created ? e.created : "-", e.sha256,
               *loom_shard_recipe_id(s) ? loom_shard_recipe_id(s) : "-");
        if (i == 0 && loom_shard_num_tokens(s) > 0) print_preview(s);
    }
    printf("  total: %llu docs, %llu bytes on disk\n", (unsigned long long)docs,
           (unsigned long long)bytes);
    report_unlisted(d);
    int bad;
    json_t *ds = load_dataset_json(dir, &bad);
    if (ds) print_dataset_json(ds, jstr_or(ds, "split", "train"));
    json_decref(ds);
    loom_dataset_close(d);
    return bad;
}

/* Labelled shards: every label names a class of dataset.json, the rule classification
 * training applies to the same dataset. */
static int check_labels(const loom_dataset *d, const char *dir) {
    const int n = loom_dataset_num_shards(d);
    int labelled = 0;
    for (int i = 0; i < n; i++) labelled |= loom_shard_has_labels(loom_dataset_shard(d, i));
    if (!labelled) return 0;
    loom_err err = {{0}};
    char **names = NULL;
    int n_classes = 0;
    if (loom_dataset_classes(dir, &names, &n_classes, &err) != 0) {
        fprintf(stderr, "loom: data verify: FAILED: %s\n", err.msg);
        return 1;
    }
    loom_free_strings(names, n_classes);
    uint64_t docs = 0;
    for (int i = 0; i < n; i++) {
        const loom_shard *s = loom_dataset_shard(d, i);
        if (!loom_shard_has_labels(s)) continue; /* a mixed dataset: fine for an LM */
        for (uint64_t k = 0; k < loom_shard_num_docs(s); k++, docs++)
            if (loom_shard_doc_label(s, k) >= (uint32_t)n_classes) {
                fprintf(stderr, "loom: data verify: FAILED: %s: document %llu has label %u, but "
                        "%s/dataset.json lists %d classes (0..%d)\n", loom_shard_path(s),
                        (unsigned long long)k, loom_shard_doc_label(s, k), dir, n_classes,
                        n_classes - 1);
                return 1;
            }
    }
    printf("ok: %s: %llu labelled document(s), every label one of the %d classes of dataset.json\n",
           dir, (unsigned long long)docs, n_classes);
    return 0;
}

static int verify_one(const char *dir, int inputs) {
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
    int bad;
    json_t *ds = load_dataset_json(dir, &bad);
    bad |= check_labels(d, dir);
    if (ds) {
        bad |= check_dataset_json(ds, d, dir);
        if (!bad) printf("ok: %s/dataset.json agrees with the manifest (per-source tokens, recipe hash)\n", dir);
        if (inputs) bad |= check_inputs(ds, dir);
    } else if (inputs && !bad) {
        fprintf(stderr, "loom: data verify: FAILED: %s has no dataset.json to check inputs against\n", dir);
        bad = 1;
    }
    json_decref(ds);
    loom_dataset_close(d);
    return bad;
}

int loom_cli_data(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    int inputs = 0;
    if (!strcmp(sub, "verify") && argc == 4 && !strcmp(argv[2], "--inputs")) {
        inputs = 1;
        argv++;
        argc--;
    }
    if (argc != 3) {
        fprintf(stderr, "loom: data %s: expected exactly one argument\n", sub);
        usage(stderr);
        return 2;
    }
    if (!strcmp(sub, "build")) return data_build(&argc, &argv, argv[2]);
    if (!strcmp(sub, "inspect") || !strcmp(sub, "verify")) {
        char dirs[2][4200];
        int n = dataset_dirs(argv[2], dirs), rc = 0;
        for (int i = 0; i < n; i++)
            rc |= !strcmp(sub, "inspect") ? inspect_one(dirs[i]) : verify_one(dirs[i], inputs);
        return rc;
    }
    fprintf(stderr, "loom: data: unknown subcommand '%s'\n", sub);
    usage(stderr);
    return 2;
}
