/* Private to the data build (src/data/build*.c): the build's state and the steps' entry
 * points. build.c runs the steps in order (its opening comment describes the whole build);
 *   build_output.c    the output directory: emptiness, leftovers of killed builds, the lock
 *   build_cache.c     the previous build, input hashes, labels, cache keys, the reuse
 *                     decisions and linking reused shards
 *   build_shards.c    reading a source and its steps, tokenizing, writing shards
 *   build_manifest.c  manifest lines and dataset.json */
#ifndef LOOM_DATA_BUILD_INTERNAL_H
#define LOOM_DATA_BUILD_INTERNAL_H

#include "data/build_source.h"
#include "data/data_internal.h"
#include "data/recipe.h"

#include <jansson.h>
#include <stdint.h>

#if defined(__has_include)
#include "loom/chat.h"
#include "loom/progress.h"
#if __has_include("loom/tokenizer.h")
#include "loom/tokenizer.h"
#define LOOM_HAVE_BPE 1
#endif
#endif

#define BYTE_VOCAB 256u
#define BUILD_KEY_VERSION "loom.data.build/2"
#define DATASET_JSON_MAX ((size_t)256 << 20)

static const char *const SPLITS[2] = {"train", "val"};

typedef struct split_stats {
    uint64_t shards, tokens, docs, pieces;
} split_stats;

typedef struct src_state {
    int *files;           /* indices into the build's inputs */
    int n_files;
    char key[65];
    int reuse, need_docs, has_exact;
    json_t *old_obj;      /* the previous build's source object (borrowed) */
    json_t *old_lines[2]; /* its previous manifest lines, per split (owned arrays) */
    loom_skips skipped, bad_lines, unlabeled;
    uint64_t empty_docs;
    loom_step_count *counts;  /* read + one per step */
    int n_counts;
    split_stats split[2];
    loom_labels *labels;
    char labels_sha[65];
    uint64_t rot;         /* a team: shard blocks and BPE count blocks rotate by this */
    loom_chat_template *chat; /* chat: its template */
    uint64_t dropped_long;    /* chat, pack: false, too_long: drop: conversations dropped */
} src_state;

typedef struct build {
    loom_recipe r;
    loom_inputs in;
    src_state *src;
    const char **classes;   /* sorted distinct class names over all labelled sources */
    int n_classes;
    const char *tok_id;
    uint32_t vocab;
    json_t *old_ds;         /* previous train/dataset.json, or NULL */
    char out[4096], tmp[4200], old[4200];
    uint64_t next_shard[2]; /* next shard number per split */
    loom_hashset *global;   /* dedup_across_sources */
    double t0;
    const loom_build_team *team; /* NULL or a team of one: one process */
    int rank, size;              /* in the team (0 and 1 without one) */
    int fail_shard;              /* LOOM_TEST_FAIL_BUILD names this rank: fail (1) or SIGKILL
                                  * itself (2) at the first shard */
    int lock_fd;                 /* member 0: the lock on the output (.NAME.lock), -1 none */
#ifdef LOOM_HAVE_BPE
    loom_tokenizer *tok;    /* tokenizer: bpe; NULL for byte */
#endif
} build;


static inline int multi(const build *b) { return b->size > 1; }

/* ---- build_output.c ---- */
void build_remove_tree(const char *path);
int build_dir_is_empty(const char *path);
/* OUT holds a previous build (its dataset.json or manifests) */
int build_looks_like_build(const char *out);
/* Member 0: sweeps what killed builds left beside the output and takes the output's lock. */
int build_lock_output(build *b, const char *recipe_path, loom_err *err);

/* ---- build_cache.c ---- */
void build_load_previous(build *b);
int build_hash_inputs(build *b, loom_err *err);
int build_load_labels(build *b, loom_err *err);
void build_compute_keys(build *b);
void build_decide_reuse(build *b);
/* Links the source's previous shards into the new output (member 0 of a team; the others only
 * take the counts). */
int build_reuse_source(build *b, int si, loom_err *err);

/* ---- build_shards.c ---- */
/* Reads source SI, runs its steps, tokenizes it and writes its shards and manifest lines. */
int build_source(build *b, int si, loom_err *err);

/* ---- build_manifest.c ---- */
int build_append_line(build *b, int split, json_t *line, loom_err *err);
json_t *build_manifest_line(const build *b, const loom_recipe_source *s, const char *name,
                            const char *sha, uint64_t tokens, uint64_t docs, const char *created);
int build_write_dataset_json(const build *b, int sp, loom_err *err);

#endif
