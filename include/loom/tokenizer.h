/* loom tokenizers: byte-level (256 + specials) and GPT-2 byte-level BPE compatible with
 * Hugging Face `tokenizers` (tokenizer.json, or vocab.json + merges.txt), plus BPE training.
 * See docs/tokenizers.md for the accepted formats, the compatibility notes and the training
 * algorithm.
 *
 * Tokenizer files are untrusted input: every load error names the file (and the key, the
 * merge line or the JSON line/column). A loaded tokenizer is immutable; encode and decode are
 * thread-safe and may be called from any number of threads on the same tokenizer. */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "loom/base.h"

typedef struct loom_tokenizer loom_tokenizer;

typedef enum loom_tokenizer_kind {
    LOOM_TOKENIZER_BYTE = 0, /* id b < 256 is byte b; specials follow from 256 */
    LOOM_TOKENIZER_BPE = 1,  /* GPT-2 byte-level BPE */
} loom_tokenizer_kind;

/* A growable id buffer: encode appends to it. Zero-initialise; free with loom_ids_free. */
typedef struct loom_ids {
    int32_t *ids;
    size_t n, cap;
} loom_ids;
void loom_ids_free(loom_ids *v);

/* ---- loading ---------------------------------------------------------------------------- */
/* Byte tokenizer: ids 0..255 are the bytes, specials[i] gets id 256+i (matched in the input
 * like added tokens). n_specials may be 0. */
int loom_tokenizer_byte(const char *const *specials, int n_specials, loom_tokenizer **out,
                        loom_err *err);
/* A Hugging Face tokenizer.json with a BPE model: byte-level (GPT-2, Llama 3, Qwen) or
 * SentencePiece-style (Metaspace or Prepend/Replace, byte_fallback: Mistral, Gemma); the
 * normalizers, pre-tokenizers and decoders docs/tokenizers.md lists. */
int loom_tokenizer_load_json(const char *path, loom_tokenizer **out, loom_err *err);
/* The same from the text of a tokenizer.json in memory (name is used in messages). */
int loom_tokenizer_load_json_text(const char *text, size_t len, const char *name,
                                  loom_tokenizer **out, loom_err *err);
/* GPT-2 style vocab.json + merges.txt (ByteLevel, no prefix space). "<|endoftext|>", when in
 * the vocabulary, is treated as a special token (matched in the input), as GPT-2 does. */
int loom_tokenizer_load_vocab_merges(const char *vocab_path, const char *merges_path,
                                     loom_tokenizer **out, loom_err *err);
/* "byte" -> the byte tokenizer; anything else is a path to a tokenizer.json. */
int loom_tokenizer_load(const char *spec, loom_tokenizer **out, loom_err *err);
void loom_tokenizer_free(loom_tokenizer *t);

/* ---- queries ---------------------------------------------------------------------------- */
loom_tokenizer_kind loom_tokenizer_get_kind(const loom_tokenizer *t);
/* 1 + the largest id (vocabulary and added tokens). Every id encode emits is below it. */
uint32_t loom_tokenizer_vocab_size(const loom_tokenizer *t);
/* Id of an added/special token (exact content), or -1 when there is none. */
int32_t loom_tokenizer_special_id(const loom_tokenizer *t, const char *content);
/* 1 when id is an added token (matched in the text before the model: specials and the like). */
int loom_tokenizer_is_added(const loom_tokenizer *t, int32_t id);
/* Id of any token given in its vocabulary spelling (byte-level characters for BPE), or -1. */
int32_t loom_tokenizer_token_id(const loom_tokenizer *t, const char *token);
/* Content hash used as tokenizer_id in shards: "byte" for a byte tokenizer without specials,
 * otherwise the sha256 hex of the canonical tokenizer.json (what loom_tokenizer_save_json
 * writes, compact). A tokenizer loaded from tokenizer.json or from vocab.json + merges.txt
 * has the same id when it encodes the same way. The string lives as long as t. */
const char *loom_tokenizer_id(const loom_tokenizer *t);

/* ---- encode / decode -------------------------------------------------------------------- */
/* Appends the ids of text[0..len) to out. Any bytes are accepted: valid UTF-8 encodes exactly
 * as Hugging Face `tokenizers` does; invalid UTF-8 bytes form pre-tokens of their own (see
 * docs/tokenizers.md). Thread-safe. Fails only on absurd sizes (> 2^31 ids per call). */
int loom_tokenizer_encode(const loom_tokenizer *t, const void *text, size_t len, loom_ids *out,
                          loom_err *err);
/* Flags of the _ex calls. LOOM_TOK_CONTINUE: the text (or the ids) continue an earlier text, so
 * what a tokenizer does only at the start of a text is not done at offset 0: no prefix space
 * (ByteLevel add_prefix_space), no Metaspace/Prepend "▁" for the first piece, no Strip or
 * Metaspace first-token rule in decoding. Encoding a text in parts (a chat conversation's
 * segments) or decoding one token at a time (generation) uses it after the first part. */
#define LOOM_TOK_CONTINUE 1u
int loom_tokenizer_encode_ex(const loom_tokenizer *t, const void *text, size_t len, unsigned flags,
                             loom_ids *out, loom_err *err);
int loom_tokenizer_decode_ex(const loom_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                             char **out, size_t *out_len, loom_err *err);
/* Bytes of ids[0..n) (added tokens give their content): *out is malloc'd, NUL-terminated
 * (one extra byte), owned by the caller. An id outside the vocabulary is an error naming it.
 * decode(encode(x)) == x for every byte string x (unless add_prefix_space is set). */
int loom_tokenizer_decode(const loom_tokenizer *t, const int32_t *ids, size_t n, char **out,
                          size_t *out_len, loom_err *err);

/* ---- training --------------------------------------------------------------------------- */
typedef struct loom_bpe_train_opts {
    uint32_t vocab_size;          /* total, specials included; >= 256 + n_specials */
    uint64_t min_frequency;       /* pairs seen fewer times are never merged (0 = no limit) */
    const char *const *specials;  /* special tokens, ids 0..n_specials-1 */
    int n_specials;
    int verbose;                  /* progress lines on stderr */
} loom_bpe_train_opts;
/* Byte-level BPE training on files (each read line by line, like `tokenizers` does), the
 * same algorithm and tie-break as `tokenizers`' BpeTrainer with the full byte alphabet. */
int loom_tokenizer_train(const char *const *files, int n_files, const loom_bpe_train_opts *o,
                         loom_tokenizer **out, loom_err *err);
/* Same, on in-memory texts (each text is a "line" of the corpus). */
int loom_tokenizer_train_texts(const char *const *texts, const size_t *lens, size_t n_texts,
                               const loom_bpe_train_opts *o, loom_tokenizer **out,
                               loom_err *err);

/* ---- saving ----------------------------------------------------------------------------- */
/* Hugging Face tokenizer.json (BPE model, ByteLevel pre-tokenizer/decoder/post-processor),
 * written atomically. Byte tokenizers cannot be saved. */
int loom_tokenizer_save_json(const loom_tokenizer *t, const char *path, loom_err *err);
/* The same from the text of a tokenizer.json in memory (name is used in messages). */
int loom_tokenizer_load_json_text(const char *text, size_t len, const char *name,
                                  loom_tokenizer **out, loom_err *err);
/* The Hugging Face tokenizer.json text of t (malloc'd, NUL-terminated): for BPE what
 * loom_tokenizer_save_json writes; for a byte tokenizer a byte-level BPE with the 256 byte
 * characters as ids 0..255, no merges, and its specials as added tokens, which `tokenizers`
 * encodes exactly as loom's byte tokenizer. */
char *loom_tokenizer_hf_json(const loom_tokenizer *t);
/* 1 when t encodes every input exactly as the byte tokenizer without specials (the byte
 * tokenizer itself, or the tokenizer.json loom_tokenizer_hf_json writes for it). */
int loom_tokenizer_is_plain_bytes(const loom_tokenizer *t);
/* GPT-2 style vocab.json + merges.txt ("#version: 0.2" header). Added tokens are written into
 * vocab.json when they are not already there. */
int loom_tokenizer_save_vocab_merges(const loom_tokenizer *t, const char *vocab_path,
                                     const char *merges_path, loom_err *err);

#endif
