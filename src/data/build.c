/* `loom data build RECIPE.yaml`: sources -> documents -> steps -> tokens -> shards + manifest.
 *
 * Per source, in recipe order: its input files are collected (source_files.c) and hashed,
 * and a cache key is made from the source's recipe section, the tokenizer, the shard settings
 * and the (path, size, SHA-256) of every input. A source whose key matches the previous build
 * (OUTPUT/train/dataset.json) and whose shards still match their manifest SHA-256 is reused:
 * its shards are hard-linked into the new output, nothing is read or tokenized. Otherwise its
 * files are read into documents, every step runs with counts before and after, documents
 * are routed to train/val by a hash of their bytes, and its shards are written in parallel
 * (OpenMP, one shard per task: each a temp file, fsynced, renamed) and appended to the
 * manifest in order. A shard holds documents of one source; its manifest line carries the
 * source's weight and repeat_cap for the loader. When every source is reused and the recipe
 * is unchanged, the build does nothing at all.
 *
 * Deterministic: inputs are read in sorted path order, shard k of a source is tokens
 * [k*shard_tokens, (k+1)*shard_tokens) of its documents' concatenation, and no step or
 * shard depends on the number of threads; shards carry no timestamps.
 *
 * The new output is built as OUTPUT.tmp.<pid> and renamed into place; an existing OUTPUT is
 * replaced only when it looks like a previous build or is empty.
 *
 * A team (MPI ranks, through the hooks of loom_build_team; this file makes no MPI call): every
 * member reads the sources and runs the steps (documents, dedup and train/val routing then agree
 * everywhere); input hashing and the check of cached shards are split by index, BPE
 * tokenization by blocks of documents (token counts summed over the team), and each split's
 * shards in contiguous blocks, one block per member, rotated by the source's first train shard
 * number (the BPE count blocks too, so a member mostly writes what it counted). Member 0 names the temp directory (its pid), creates it, links reused shards, writes
 * every manifest line in shard order once the shards' SHA-256 and counts are gathered, writes
 * dataset.json and renames. The output is byte-identical to one process's ("created" aside,
 * which member 0 stamps; SOURCE_DATE_EPOCH fixes it).
 *
 * This file runs the steps in order; build_internal.h lists the files that hold them. */
#define _GNU_SOURCE
#include "data/build_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Nothing to do: every source reused, the same recipe file, the same source list. */
static int up_to_date(const build *b) {
    if (!b->old_ds) return 0;
    const char *sha = json_string_value(json_object_get(json_object_get(b->old_ds, "recipe"), "sha256"));
    if (!sha || strcmp(sha, b->r.sha256) != 0) return 0;
    json_t *srcs = json_object_get(b->old_ds, "sources");
    if ((int)json_array_size(srcs) != b->r.n_sources) return 0;
    for (int i = 0; i < b->r.n_sources; i++) {
        const char *n = json_string_value(json_object_get(json_array_get(srcs, (size_t)i), "name"));
        if (!b->src[i].reuse || !n || strcmp(n, b->r.sources[i].name) != 0) return 0;
    }
    /* the inputs list must be the same too (a new empty file changes no key but the list) */
    json_t *ins = json_object_get(b->old_ds, "inputs");
    if ((int)json_array_size(ins) != b->in.n) return 0;
    for (int i = 0; i < b->in.n; i++) {
        json_t *x = json_array_get(ins, (size_t)i);
        const char *p = json_string_value(json_object_get(x, "path"));
        json_t *mt = json_object_get(x, "mtime_ns");
        if (!p || strcmp(p, b->in.v[i].path) || !json_is_integer(mt) ||
            json_integer_value(mt) != b->in.v[i].mtime_ns)
            return 0;
    }
    /* and the output holds exactly what a build writes (a stray file gets a clean rebuild) */
    for (int sp = 0; sp < 2; sp++) {
        char dir[4300];
        loom_pathf(dir, sizeof dir, "%s/%s", b->out, SPLITS[sp]);
        DIR *d = opendir(dir);
        if (!d) return 0;
        size_t listed = 0, seen = 0;
        for (int i = 0; i < b->r.n_sources; i++)
            listed += b->src[i].old_lines[sp] ? json_array_size(b->src[i].old_lines[sp]) : 0;
        struct dirent *e;
        int clean = 1;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                !strcmp(e->d_name, "manifest.jsonl") || !strcmp(e->d_name, "dataset.json"))
                continue;
            seen++;
            int found = 0;
            for (int i = 0; i < b->r.n_sources && !found; i++) {
                size_t j;
                json_t *line;
                json_array_foreach(b->src[i].old_lines[sp], j, line) {
                    const char *n = json_string_value(json_object_get(line, "shard"));
                    if (n && !strcmp(n, e->d_name)) found = 1;
                }
            }
            clean &= found;
        }
        closedir(d);
        if (!clean || seen != listed) return 0;
    }
    return 1;
}

/* template: auto on a chat source: the tokenizer_config.json beside the recipe's tokenizer.json
 * (its chat_template picks the built-in, include/loom/chat.h). */
static int resolve_auto_templates(build *b, loom_err *err) {
    for (int i = 0; i < b->r.n_sources; i++) {
        loom_recipe_source *s = &b->r.sources[i];
        if (s->kind != LOOM_SRC_CHAT || strcmp(s->chat_template, "auto")) continue;
        if (!strcmp(b->r.tokenizer, "byte") || !b->r.tokenizer_path)
            return loom_errf(err, "%s:%d: source '%s': template: auto takes the chat template from the "
                                  "tokenizer_config.json beside a BPE tokenizer.json; with the byte tokenizer name "
                                  "the template", b->r.file, s->line, s->name);
        const char *slash = strrchr(b->r.tokenizer_path, '/');
        size_t dl = slash ? (size_t)(slash - b->r.tokenizer_path) + 1 : 0;
        char *p = loom_malloc(dl + sizeof "tokenizer_config.json");
        memcpy(p, b->r.tokenizer_path, dl);
        memcpy(p + dl, "tokenizer_config.json", sizeof "tokenizer_config.json");
        free(s->chat_template);
        s->chat_template = p;
    }
    return 0;
}

static int resolve_tokenizer(build *b, loom_err *err) {
    if (resolve_auto_templates(b, err)) return -1;
    if (!strcmp(b->r.tokenizer, "byte")) {
        b->tok_id = "byte";
        b->vocab = BYTE_VOCAB;
        return 0;
    }
#ifdef LOOM_HAVE_BPE
    if (loom_tokenizer_load_json(b->r.tokenizer_path, &b->tok, err) != 0)
        return loom_err_prefix(err, "%s:%d: tokenizer", b->r.file, b->r.tokenizer_line);
    b->tok_id = loom_tokenizer_id(b->tok);
    b->vocab = loom_tokenizer_vocab_size(b->tok);
    return 0;
#else
    return loom_errf(err, "%s:%d: tokenizer 'bpe' is not available in this build (no "
                     "include/loom/tokenizer.h); use 'tokenizer: byte'", b->r.file, b->r.tokenizer_line);
#endif
}

int loom_data_build(const char *recipe_path, loom_err *err) {
    return loom_data_build_team(recipe_path, NULL, err);
}

int loom_data_build_team(const char *recipe_path, const loom_build_team *team, loom_err *err) {
    build B;
    memset(&B, 0, sizeof B);
    build *b = &B;
    b->lock_fd = -1;
    int rc = -1, made_tmp = 0;
    b->t0 = loom_now();
    b->size = 1;
    int64_t pid0 = (int64_t)getpid(); /* names the temp directory: member 0's pid */
    if (team && team->size > 1) {
        LOOM_CHECK(team->rank >= 0 && team->rank < team->size);
        b->team = team;
        b->rank = team->rank;
        b->size = team->size;
        team->bcast_i64(team->ctx, &pid0, 1);
    }
    const char *fail_env = getenv("LOOM_TEST_FAIL_BUILD");
    if (fail_env && *fail_env) { /* test hook: "RANK" fails that rank, "RANK:kill" kills it */
        char *end;
        long v = strtol(fail_env, &end, 10);
        if (v == b->rank && (!*end || !strcmp(end, ":kill"))) b->fail_shard = *end ? 2 : 1;
    }
    if (loom_recipe_load(recipe_path, &b->r, err) != 0) goto done;
    loom_recipe *r = &b->r;
    if (loom_path_check("output", r->output, LOOM_DIR_PATH_MAX, err)) {
        loom_err_prefix(err, "%s", recipe_path);
        goto done;
    }
    loom_pathf(b->out, sizeof b->out, "%s", r->output);
    for (size_t n = strlen(b->out); n > 1 && b->out[n - 1] == '/'; n--) b->out[n - 1] = 0;
    if (build_lock_output(b, recipe_path, err) != 0) goto done;
    if (loom_path_exists(b->out) &&
        !(loom_is_dir(b->out) && (build_looks_like_build(b->out) || build_dir_is_empty(b->out)))) {
        loom_errf(err, "%s: output '%s' exists and is not a loom data build; refusing to replace it",
                  recipe_path, b->out);
        goto done;
    }
    loom_pathf(b->tmp, sizeof b->tmp, "%s.tmp.%lld", b->out, (long long)pid0);
    loom_pathf(b->old, sizeof b->old, "%s.old.%lld", b->out, (long long)pid0);
    if (resolve_tokenizer(b, err) != 0) goto done;
    b->src = loom_calloc((size_t)r->n_sources, sizeof *b->src);
    for (int i = 0; i < r->n_sources; i++) {
        int before = b->in.n;
        if (loom_inputs_collect(r, i, &b->in, &b->src[i].skipped, err) != 0) goto done;
        b->src[i].n_files = b->in.n - before;
        b->src[i].files = loom_malloc((size_t)(b->src[i].n_files + 1) * sizeof(int));
        for (int j = 0; j < b->src[i].n_files; j++) b->src[i].files[j] = before + j;
        for (int k = 0; k < r->sources[i].n_steps; k++)
            b->src[i].has_exact |= r->sources[i].steps[k].kind == LOOM_STEP_DEDUP_EXACT;
    }
    if (build_load_labels(b, err) != 0) goto done;
    build_load_previous(b);
    if (build_hash_inputs(b, err) != 0) goto done;
    build_compute_keys(b);
    build_decide_reuse(b);
    uint8_t stale = (uint8_t)!up_to_date(b);
    if (multi(b)) b->team->max_u8(b->team->ctx, &stale, 1); /* every member must agree */
    if (!stale) {
        if (b->rank == 0)
            loom_log("data build: %s: up to date (%d source(s) unchanged: nothing read, nothing written) -> %s",
                 r->name, r->n_sources, b->out);
        rc = 0;
        goto done;
    }
    if (b->rank == 0) {
        build_remove_tree(b->tmp);
        if (loom_mkdirs(b->tmp, err) != 0) goto done;
        made_tmp = 1;
        for (int sp = 0; sp < 2; sp++) {
            char p[4400];
            loom_pathf(p, sizeof p, "%s/%s", b->tmp, SPLITS[sp]);
            if (loom_mkdirs(p, err) != 0) goto done;
            loom_pathf(p, sizeof p, "%s/%s/manifest.jsonl", b->tmp, SPLITS[sp]);
            if (loom_write_file_atomic(p, "", 0, err) != 0) goto done;
        }
    }
    if (multi(b)) {
        b->team->barrier(b->team->ctx); /* the temp directory exists */
        made_tmp = 1;
    }
    if (r->dedup_across_sources) b->global = loom_hashset_new();
    for (int i = 0; i < r->n_sources; i++) {
        int res = b->src[i].need_docs ? build_source(b, i, err) : build_reuse_source(b, i, err);
        if (res != 0) goto done;
    }
    for (int sp = 0; sp < 2 && b->rank == 0; sp++)
        if (build_write_dataset_json(b, sp, err) != 0) goto done;
    uint64_t train_tokens = 0;
    for (int i = 0; i < r->n_sources; i++) train_tokens += b->src[i].split[0].tokens;
    if (train_tokens == 0) {
        loom_errf(err, "%s: the sources hold no training documents (after the steps)", recipe_path);
        goto done;
    }
    if (b->rank != 0) { /* every shard of this member is in place (gathered by member 0) */
        made_tmp = 0;
        rc = 0;
        goto done;
    }
    /* swap into place */
    if (loom_path_exists(b->out) && rename(b->out, b->old) != 0) {
        loom_errf(err, "%s: cannot move the previous build aside: %s", b->out, strerror(errno));
        goto done;
    }
    if (rename(b->tmp, b->out) != 0) {
        loom_errf(err, "%s: cannot rename the new build into place: %s", b->out, strerror(errno));
        if (loom_path_exists(b->old)) rename(b->old, b->out);
        goto done;
    }
    made_tmp = 0;
    build_remove_tree(b->old);
    int reused = 0;
    uint64_t tok[2] = {0, 0}, docs[2] = {0, 0}, shards[2] = {0, 0};
    for (int i = 0; i < r->n_sources; i++) {
        reused += b->src[i].reuse;
        for (int sp = 0; sp < 2; sp++) {
            tok[sp] += b->src[i].split[sp].tokens;
            docs[sp] += b->src[i].split[sp].docs;
            shards[sp] += b->src[i].split[sp].shards;
        }
    }
    char team_note[64] = "";
    if (multi(b)) snprintf(team_note, sizeof team_note, ", %d ranks", b->size);
    loom_log("data build: %s: %d files, %d source(s) rebuilt, %d reused -> %s: train %llu shard(s), "
             "%llu tokens, %llu docs; val %llu shard(s), %llu tokens, %llu docs (%.2f s%s)",
             r->name, b->in.n, r->n_sources - reused, reused, b->out, (unsigned long long)shards[0],
             (unsigned long long)tok[0], (unsigned long long)docs[0], (unsigned long long)shards[1],
             (unsigned long long)tok[1], (unsigned long long)docs[1], loom_now() - b->t0, team_note);
    rc = 0;
done:
    /* on an error any member removes the temp directory (the caller then ends the team) */
    if (made_tmp && rc != 0) {
        if (multi(b) && !loom_is_dir(b->tmp))
            loom_err_prefix(err, "%s is gone: another rank failed first (see its message); here", b->tmp);
        build_remove_tree(b->tmp);
    }
    for (int i = 0; b->src && i < b->r.n_sources; i++) {
        src_state *st = &b->src[i];
        free(st->files);
        json_decref(st->old_lines[0]);
        json_decref(st->old_lines[1]);
        loom_skips_free(&st->skipped);
        loom_skips_free(&st->bad_lines);
        loom_skips_free(&st->unlabeled);
        free(st->counts);
        loom_labels_free(st->labels);
        loom_chat_template_free(st->chat);
    }
    free(b->src);
    free(b->classes);
    loom_hashset_free(b->global);
    json_decref(b->old_ds);
    loom_inputs_free(&b->in);
#ifdef LOOM_HAVE_BPE
    loom_tokenizer_free(b->tok);
#endif
    loom_recipe_free(&b->r);
    loom_unlock_file(b->lock_fd);
    return rc;
}
