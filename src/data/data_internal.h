/* Private to src/data/: shard layout constants, extra shard
 * accessors, and helpers shared by the builder and the dataset reader. */
#ifndef LOOM_DATA_INTERNAL_H
#define LOOM_DATA_INTERNAL_H

#include "loom/data.h"

#define LOOM_SHARD_MAGIC "LOOMSHRD"
#define LOOM_SHARD_VERSION 1u
#define LOOM_SHARD_HEADER_SIZE 4096u
#define LOOM_SHARD_BLOCK_SIZE (1u << 20)   /* bytes per checksummed block */
#define LOOM_SHARD_DIGEST 32u              /* SHA-256 per block */
#define LOOM_SHARD_ID_LEN 64u              /* tokenizer_id / recipe_id field width */

/* Header byte offsets (all integers little-endian); see docs/data-format.md. */
enum {
    SH_MAGIC = 0,            /* u8[8] "LOOMSHRD" */
    SH_VERSION = 8,          /* u32 */
    SH_HEADER_SIZE = 12,     /* u32, 4096 */
    SH_TOKEN_WIDTH = 16,     /* u32: 1, 2, 4 */
    SH_VOCAB_SIZE = 20,      /* u32 */
    SH_N_TOKENS = 24,        /* u64 */
    SH_N_DOCS = 32,          /* u64 */
    SH_BLOCK_SIZE = 40,      /* u64 */
    SH_N_BLOCKS = 48,        /* u64 */
    SH_TOKENS_OFF = 56,      /* u64 */
    SH_TOKENS_BYTES = 64,    /* u64 */
    SH_DOCS_OFF = 72,        /* u64 */
    SH_DOCS_BYTES = 80,      /* u64 */
    SH_SUMS_OFF = 88,        /* u64 */
    SH_SUMS_BYTES = 96,      /* u64 */
    SH_FILE_SIZE = 104,      /* u64 */
    SH_TOKENIZER_ID = 112,   /* u8[64], NUL-padded */
    SH_RECIPE_ID = 176,      /* u8[64], NUL-padded */
    SH_HEADER_SUM = 240,     /* u8[32]: SHA-256 of the header with this field zeroed */
    SH_LABELS_OFF = 272,     /* u64: the optional labels section (u32 per doc-index entry);
                              * 0 = no labels (shards written before labels existed) */
    SH_LABELS_BYTES = 280,   /* u64: 4 * n_docs, or 0 without labels */
    SH_MASK_OFF = 288,       /* u64: the optional loss-mask section (u8 per token, 0 or 1) */
    SH_MASK_BYTES = 296,     /* u64: n_tokens, or 0 without a mask */
    SH_RESERVED = 304        /* .. 4095: zero */
};

/* loom_shard_write that also returns the SHA-256 (hex) of the file it wrote. */
int loom_shard_write_sha(const char *path, const loom_shard_spec *spec, const uint32_t *tokens,
                         uint64_t n_tokens, const uint64_t *doc_starts, uint64_t n_docs,
                         char sha_hex[65], loom_err *err);

/* The same with an optional label per doc-index entry (labels: n_docs values, or NULL for a
 * version-1 shard without labels). */
int loom_shard_write_ex(const char *path, const loom_shard_spec *spec, const uint32_t *tokens,
                        uint64_t n_tokens, const uint64_t *doc_starts, uint64_t n_docs,
                        const uint32_t *labels, char sha_hex[65], loom_err *err);

uint64_t loom_shard_doc_start(const loom_shard *s, uint64_t i);

/* Reads the lines appended to manifest.jsonl since the last read (a stat first: nothing is
 * read when the file is unchanged), opening and verifying their shards; *n_added counts
 * them. The bytes already read must be unchanged. On error the lines before the bad one stay
 * added. */
int loom_dataset_refresh(loom_dataset *d, int *n_added, loom_err *err);

#endif
