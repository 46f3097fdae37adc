/* loom data: byte tokenizer, shard format v1, manifest, minimal recipes, the loader.
 * See docs/data-format.md for the byte layout. Shards and manifests are untrusted input:
 * every read is bounds-checked and checksummed, and errors name the file and the offset. */
#ifndef LOOM_DATA_H
#define LOOM_DATA_H

#include <stdint.h>
#include <stddef.h>
#include "loom/base.h"

/* ---- shard v1 ------------------------------------------------------------------------ */
typedef struct loom_shard loom_shard;

typedef struct loom_shard_spec {
    uint32_t vocab_size;       /* token ids must be < vocab_size */
    uint32_t token_width;      /* 1, 2 or 4 bytes; 0 = smallest that fits vocab_size */
    const char *tokenizer_id;  /* e.g. "byte" or a sha256 of tokenizer.json (<= 64 chars) */
    const char *recipe_id;     /* sha256 hex of the recipe (<= 64 chars) */
} loom_shard_spec;

/* Writes a shard atomically (temp file, fsync, rename). tokens (n_tokens),
 * doc_starts (n_docs) token offsets of each document's first token, ascending, [0] = 0. */
int loom_shard_write(const char *path, const loom_shard_spec *spec, const uint32_t *tokens,
                     uint64_t n_tokens, const uint64_t *doc_starts, uint64_t n_docs,
                     loom_err *err);
/* Opens (mmap) and validates a shard: magic, version, header checksum, section bounds, every
 * block checksum, doc index monotonic, token ids < vocab. Any problem is an error naming the
 * path and what is wrong (and the byte offset where it applies). */
int loom_shard_open(const char *path, loom_shard **out, loom_err *err);
void loom_shard_close(loom_shard *s);
uint64_t loom_shard_num_tokens(const loom_shard *s);
uint64_t loom_shard_num_docs(const loom_shard *s);
uint32_t loom_shard_vocab_size(const loom_shard *s);
/* copies tokens [start, start+n) as int32 */
void loom_shard_read_tokens(const loom_shard *s, uint64_t start, uint64_t n, int32_t *out);
/* Per-document labels (an optional shard section, written for labelled binary sources): one u32 class id
 * per doc-index entry (a document cut at a shard boundary has the same label in both shards;
 * the class names are in dataset.json). has_labels is 0 for shards without a label section. */
int loom_shard_has_labels(const loom_shard *s);
uint32_t loom_shard_doc_label(const loom_shard *s, uint64_t i); /* i < num_docs */
/* The loss mask (an optional shard section, written for chat sources): one byte per token, 1
 * when the token is a training target (an assistant token), 0 when it is context only.
 * read_mask gives all ones for a shard without the section. */
int loom_shard_has_mask(const loom_shard *s);
void loom_shard_read_mask(const loom_shard *s, uint64_t start, uint64_t n, uint8_t *out);
/* targets[i] = -1 (ignored by the loss) where token start + i has mask 0; no-op without one */
void loom_shard_apply_mask(const loom_shard *s, uint64_t start, uint64_t n, int32_t *targets);
/* loom_shard_write_ex with a loss mask (n_tokens bytes, each 0 or 1; NULL = no section). */
int loom_shard_write_masked(const char *path, const loom_shard_spec *spec, const uint32_t *tokens,
                            uint64_t n_tokens, const uint64_t *doc_starts, uint64_t n_docs,
                            const uint32_t *labels, const uint8_t *mask, char sha_hex[65],
                            loom_err *err);
/* What `loom data inspect` / `verify` show of a shard: its file, the bytes per token, the
 * tokenizer and recipe ids of its header, the file's size. */
const char *loom_shard_path(const loom_shard *s);
uint32_t loom_shard_token_width(const loom_shard *s);
const char *loom_shard_tokenizer_id(const loom_shard *s);
const char *loom_shard_recipe_id(const loom_shard *s);
uint64_t loom_shard_file_size(const loom_shard *s);

/* ---- dataset: a directory with manifest.jsonl ---------------------------------------- */
typedef struct loom_dataset loom_dataset;
/* Reads dir/manifest.jsonl, opens every listed shard, checks its sha256 against the
 * manifest. A missing directory or manifest is an error naming the path. */
int loom_dataset_open(const char *dir, loom_dataset **out, loom_err *err);
void loom_dataset_close(loom_dataset *d);
int loom_dataset_num_shards(const loom_dataset *d);
/* The manifest line of shard i of a dataset (borrowed strings). */
typedef struct loom_manifest_entry {
    const char *shard;   /* file name inside the dataset directory */
    const char *sha256;
    const char *source;  /* may be "" */
    const char *recipe;  /* may be "" */
    const char *created; /* may be "" */
    uint64_t tokens, docs;
    int line;            /* 1-based line in manifest.jsonl */
    double weight;       /* "weight": the source's mixing weight (> 0, default 1) */
    double repeat_cap;   /* "repeat_cap": passes allowed over the source (0 = no cap) */
} loom_manifest_entry;
loom_manifest_entry loom_dataset_entry(const loom_dataset *d, int i);
const char *loom_dataset_dir(const loom_dataset *d);
const loom_shard *loom_dataset_shard(const loom_dataset *d, int i);
uint32_t loom_dataset_vocab_size(const loom_dataset *d);
/* The tokenizer_id every shard carries ("byte" or a sha256 of the canonical tokenizer.json;
 * open refuses shards that differ); NULL for a dataset without shards. */
const char *loom_dataset_tokenizer_id(const loom_dataset *d);
uint64_t loom_dataset_num_tokens(const loom_dataset *d);

/* ---- loader ---------------------------------------------------------------------------
 * Fixed-length samples (T+1 consecutive tokens inside one shard; sample j of a shard starts
 * at token j*T) from the sources of a dataset (manifest lines grouped by "source"), mixed
 * deterministically by their "weight" (no RNG: each source's share of any prefix of the order
 * is exact to within one sample), each source visited in a seeded permutation per segment
 * (a run of its manifest lines) and per epoch, for at most "repeat_cap" passes. A global
 * batch is B consecutive samples of that order, so the order never depends on how many ranks
 * read it. The state is a few counters per source (loom_loader_state_json), saved in
 * checkpoints: resume is exact. See docs/data-format.md, "Loader". */
typedef struct loom_loader loom_loader;
typedef struct loom_loader_opts {
    int T;             /* sequence length: a sample is T+1 tokens */
    uint64_t seed;     /* keys the permutations */
    int shuffle;       /* 0: each segment in manifest order */
    int follow;        /* re-read manifest.jsonl in every next() (a cheap stat when unchanged)
                        * and use the shards appended to it; single process only: with DP,
                        * rank 0 calls loom_loader_refresh and broadcasts the line count */
    int ignore_caps;   /* cycle sources past their repeat_cap (evaluation sets) */
    int lines;         /* use only the first `lines` manifest lines (DP ranks agree on a
                        * count); 0 = all */
} loom_loader_opts;

/* Fails when the dataset holds no complete sample of length T+1, or when the lines of one
 * source disagree on weight or repeat_cap. The dataset must outlive the loader. */
int loom_loader_open(loom_dataset *d, const loom_loader_opts *o, loom_loader **out,
                     loom_err *err);
/* loom_loader_open with only T, seed and shuffle set. */
int loom_loader_create(loom_dataset *d, int T, uint64_t seed, int shuffle,
                       loom_loader **out, loom_err *err);
void loom_loader_free(loom_loader *l);
/* samples in the manifest lines the loader uses (one pass over every source) */
uint64_t loom_loader_num_samples(const loom_loader *l);
/* samples delivered so far (all ranks' slices count) */
uint64_t loom_loader_position(const loom_loader *l);
/* Fills inputs/targets (B,T) with the next B samples (targets = inputs shifted by one).
 * Returns -1 when every source has reached its repeat_cap before B samples ("all sources
 * exhausted at sample N"; the samples before it are consumed), or when follow mode finds a
 * bad new manifest line or shard. */
int loom_loader_next(loom_loader *l, int B, int32_t *inputs, int32_t *targets, loom_err *err);
/* The slice of the next global batch of B samples that DP rank dp_rank of dp_size reads:
 * samples [B*r/dp, B*(r+1)/dp) of it into inputs/targets ((that many), T). The loader
 * advances by the whole global batch, so every rank stays on the same order. */
int loom_loader_next_slice(loom_loader *l, int B, int dp_rank, int dp_size, int32_t *inputs,
                           int32_t *targets, loom_err *err);
/* loom_loader_next_slice, and (docs not NULL) the document of each input position: docs
 * ((that many), T) numbered from 0 at each row's first token, one more at every doc-index
 * entry that starts inside the row (model.doc_mask; docs/long-context.md). */
int loom_loader_next_docs(loom_loader *l, int B, int dp_rank, int dp_size, int32_t *inputs,
                          int32_t *targets, int32_t *docs, loom_err *err);
/* One pass, for evaluation: every sample of the manifest lines the loader uses exactly once,
 * in a fixed order (the sources in order of first appearance, each source's samples in
 * manifest-line order: no mixing, no shuffle, no repeat caps), cut into global batches of B
 * samples; the last one holds the remainder. Independent of the loader's state (next() and
 * the pass do not disturb each other). */
uint64_t loom_loader_pass_batches(const loom_loader *l, int B); /* ceil(samples / B) */
/* DP rank dp_rank's rows [B*r/dp, B*(r+1)/dp) of global batch `batch` (< pass_batches) into
 * inputs/targets ((that many), T); rows past the end of the pass get inputs 0 and targets -1
 * (ignored by the loss). Returns the number of real samples in the slice. Over every batch
 * and rank, each sample is read once. */
int loom_loader_pass_slice(loom_loader *l, uint64_t batch, int B, int dp_rank, int dp_size,
                           int32_t *inputs, int32_t *targets);
/* loom_loader_pass_slice with the rows' document ids (as loom_loader_next_docs; rows past
 * the end are one document). */
int loom_loader_pass_slice_docs(loom_loader *l, uint64_t batch, int B, int dp_rank,
                                int dp_size, int32_t *inputs, int32_t *targets, int32_t *docs);
/* Reads lines appended to the manifest (a stat first) and uses them, up to `lines` lines in
 * all (0 = every complete line); *n_lines (may be NULL) gets the number of lines used. */
int loom_loader_refresh(loom_loader *l, int lines, int *n_lines, loom_err *err);
/* The state as a JSON object (malloc'd, the caller frees): seq_len, seed, shuffle, samples,
 * and per source {name, consumed, skip, epoch, position, segments}. */
char *loom_loader_state_json(const loom_loader *l);
/* Continues from a saved state: the loader must have been opened over the same dataset (or
 * a grown one: the same manifest with lines appended), T, seed and shuffle. Errors name what
 * does not match (a source the manifest lacks, fewer lines than the state covers, ...). */
int loom_loader_restore_json(loom_loader *l, const char *json, loom_err *err);
/* Sources in order of first appearance in the manifest: name, samples delivered, epoch. */
int loom_loader_num_sources(const loom_loader *l);
const char *loom_loader_source(const loom_loader *l, int i, uint64_t *consumed, uint64_t *epoch);

/* ---- byte tokenizer ------------------------------------------------------------------- */
/* Token i < 256 is byte i. */
void loom_byte_decode(const int32_t *ids, size_t n, char *out /* n+1 */);

/* ---- MinHash near duplicates (src/data/dedup.c; docs/recipes.md, "dedup_near") ---------
 * One definition for `loom data build` (the dedup_near step) and `loom synth` (the
 * near_duplicate validator), so both make the same decision on the same text. */
/* The MinHash signature (num_perm <= 1024 values) of P (N bytes): shingles of K units (UTF-8
 * code points when CHARS, else bytes; a string shorter than K is one shingle), each hashed
 * with XXH3-64, hash function j: h -> a_j h + b_j mod 2^64 (a_j odd). */
void loom_minhash(const uint8_t *p, size_t n, int k, int chars, int num_perm, uint64_t *sig);
/* The number of equal signature entries (of num_perm) that makes a duplicate at THRESHOLD:
 * the least integer >= threshold * num_perm (within 1e-9). */
int loom_minhash_need(double threshold, int num_perm);
/* An LSH index of signatures: BANDS bands (dividing num_perm <= 1024; callers check) of
 * num_perm / bands rows; two signatures are candidates when they agree on a whole band. */
typedef struct loom_minhash_index loom_minhash_index;
loom_minhash_index *loom_minhash_index_new(int num_perm, int bands, double threshold);
void loom_minhash_index_free(loom_minhash_index *m);
/* Adds a copy of SIG under the caller's ID. */
void loom_minhash_index_add(loom_minhash_index *m, const uint64_t *sig, int64_t id);
/* The candidate with the most entries equal to SIG's (ties: the one added first): its id, and
 * *EQ its equal entries; -1 (and *EQ 0) when no indexed signature shares a band. With
 * FIRST_DUP, stops at the first candidate that is a duplicate (the decision is the same). */
int64_t loom_minhash_index_query(loom_minhash_index *m, const uint64_t *sig, int first_dup, int *eq);
/* EQ equal entries make a duplicate (eq >= loom_minhash_need of the index's threshold) */
int loom_minhash_index_is_dup(const loom_minhash_index *m, int eq);

/* ---- recipes ---------------------------------------------------------------------------
 * `loom data build RECIPE.yaml`: reads the sources, tokenizes, writes shards + manifest. */
int loom_data_build(const char *recipe_path, loom_err *err);

/* ---- building over several processes -------------------------------------------------
 * `loom data build` split over the processes of a team (MPI ranks). The data layer does not
 * use src/comm: the CLI fills these hooks from the mesh's world group. Every member calls the
 * same hooks in the same order. All members must see the same file system (one machine, or a
 * shared file system): the shards are written by every member into one temp directory. */
typedef struct loom_build_team {
    int rank, size;    /* this member, the team's size (>= 1) */
    void *ctx;
    /* in-place element-wise max over the team (results combined by zero-filling what is not
     * this member's, then taking the max) */
    void (*max_u8)(void *ctx, uint8_t *buf, size_t n);
    /* in-place element-wise sum over the team */
    void (*sum_i64)(void *ctx, int64_t *buf, size_t n);
    /* buf on member 0 -> every member */
    void (*bcast_i64)(void *ctx, int64_t *buf, size_t n);
    void (*barrier)(void *ctx);
} loom_build_team;

/* loom_data_build with the work split over a team (NULL, or a team of one: one process, exactly
 * like loom_data_build). Every member parses the recipe, collects the inputs, reads the sources
 * and runs the steps (so documents and dedup decisions agree); input hashing, the check of
 * cached shards, BPE tokenization and shard writing are split; member 0 alone writes the
 * manifests and dataset.json and renames the result into place. An error fills err on the
 * member that saw it; the caller must end the whole team then (the temp directory is already
 * removed). */
int loom_data_build_team(const char *recipe_path, const loom_build_team *team, loom_err *err);

#endif
