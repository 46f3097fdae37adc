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

/* ---- dataset: a directory with manifest.jsonl ---------------------------------------- */
typedef struct loom_dataset loom_dataset;
/* Reads dir/manifest.jsonl, opens every listed shard, checks its sha256 against the
 * manifest. A missing directory or manifest is an error naming the path. */
int loom_dataset_open(const char *dir, loom_dataset **out, loom_err *err);
void loom_dataset_close(loom_dataset *d);
int loom_dataset_num_shards(const loom_dataset *d);
const loom_shard *loom_dataset_shard(const loom_dataset *d, int i);
uint32_t loom_dataset_vocab_size(const loom_dataset *d);
uint64_t loom_dataset_num_tokens(const loom_dataset *d);

/* ---- loader ---------------------------------------------------------------------------
 * A sample is T+1 consecutive tokens inside one shard: sample j of a shard starts at token
 * j*T. The samples of all shards are numbered globally; each epoch visits them in a seeded
 * permutation (keyed by seed and epoch), or in order when shuffle is 0. A global batch is
 * B consecutive samples of that order, so the order never depends on how many ranks read.
 * The state is two counters, saved in checkpoints: resume is exact. */
typedef struct loom_loader loom_loader;
typedef struct loom_loader_state {
    uint64_t epoch;     /* completed epochs */
    uint64_t position;  /* samples consumed in the current epoch */
} loom_loader_state;

/* Fails when the dataset holds no complete sample of length T+1. */
int loom_loader_create(loom_dataset *d, int T, uint64_t seed, int shuffle,
                       loom_loader **out, loom_err *err);
void loom_loader_free(loom_loader *l);
uint64_t loom_loader_num_samples(const loom_loader *l);
/* Fills inputs/targets (B,T) with the next B samples (targets = inputs shifted by one). */
void loom_loader_next(loom_loader *l, int B, int32_t *inputs, int32_t *targets);
loom_loader_state loom_loader_get_state(const loom_loader *l);
void loom_loader_set_state(loom_loader *l, loom_loader_state s);

/* ---- byte tokenizer ------------------------------------------------------------------- */
/* Token i < 256 is byte i. */
void loom_byte_decode(const int32_t *ids, size_t n, char *out /* n+1 */);

/* ---- recipes ---------------------------------------------------------------------------
 * `loom data build RECIPE.yaml`: reads the sources, tokenizes, writes shards + manifest. */
int loom_data_build(const char *recipe_path, loom_err *err);

#endif
