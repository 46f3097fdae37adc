/* Private to src/data/bpe*.c: the tokenizer struct, small hash maps, the GPT-2 byte alphabet. */
#ifndef LOOM_BPE_INTERNAL_H
#define LOOM_BPE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "loom/tokenizer.h"

#define BPE_MAX_ID (1u << 21)          /* ids must be below this (2,097,152) */
#define BPE_MAX_FILE ((size_t)1 << 30) /* tokenizer files larger than 1 GiB are refused */
#define BPE_CACHE_STRIPES 64
#define BPE_CACHE_SLOTS 4096           /* per stripe (power of two) */
#define BPE_CACHE_MAX_WORD 256         /* longer pre-tokens are not cached (as in HF) */

/* GPT-2 pre-tokenizer. \s / \S are spelled out as the White_Space set that Oniguruma (used by
 * `tokenizers`) matches, because PCRE2's UCP \s also matches U+180E. */
#define BPE_WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define BPE_GPT2_PATTERN                                                                        \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" BPE_WS "\\p{L}\\p{N}]+|[" BPE_WS        \
    "]+(?![^" BPE_WS "])|[" BPE_WS "]+"

typedef void (*bpe_piece_fn_t)(void *ctx, const uint8_t *p, size_t n);

/* ---- hashing ---------------------------------------------------------------------------- */
static inline uint64_t bpe_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xC2B2AE3D27D4EB4Full;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ v) * 0x165667B19E3779F9ull;
    h ^= h >> 29;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}
static inline uint64_t bpe_hash_u64(uint64_t x) { return loom_mix64(x); }

/* string -> int32 (open addressing; keys are borrowed pointers that outlive the map) */
typedef struct bpe_strmap {
    const char **keys;
    uint32_t *lens;
    int32_t *vals;
    size_t cap, n; /* cap: power of two */
} bpe_strmap;
void bpe_strmap_init(bpe_strmap *m, size_t expect);
void bpe_strmap_free(bpe_strmap *m);
/* returns the value, or -1 */
int32_t bpe_strmap_get(const bpe_strmap *m, const char *k, size_t len);
/* inserts or overwrites; returns the previous value or -1 */
int32_t bpe_strmap_put(bpe_strmap *m, const char *k, size_t len, int32_t v);

/* u64 -> u64 (key UINT64_MAX is reserved as empty) */
typedef struct bpe_u64map {
    uint64_t *keys, *vals;
    size_t cap, n;
} bpe_u64map;
void bpe_u64map_init(bpe_u64map *m, size_t expect);
void bpe_u64map_free(bpe_u64map *m);
/* pointer to the value slot, or NULL */
uint64_t *bpe_u64map_get(const bpe_u64map *m, uint64_t k);
/* pointer to the value slot (inserted with `init` when absent; *fresh says which) */
uint64_t *bpe_u64map_upsert(bpe_u64map *m, uint64_t k, uint64_t init, int *fresh);

/* ---- the GPT-2 byte <-> unicode alphabet ------------------------------------------------- */
/* code point that represents byte b in vocabulary spellings */
uint32_t bpe_byte_to_cp(uint8_t b);
/* byte for a code point of the alphabet, or -1 */
int bpe_cp_to_byte(uint32_t cp);
/* raw bytes -> byte-level spelling (UTF-8); out must hold 2*n bytes; returns its length */
size_t bpe_bytes_to_spelling(const uint8_t *s, size_t n, char *out);
/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when s[0] does not start one
 * (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF). */
size_t bpe_utf8_len(const uint8_t *s, size_t n, uint32_t *cp);

/* ---- the Hugging Face pipeline around the model (bpe_pipeline.c) --------------------------
 * A tokenizer.json that is not the plain GPT-2 form (one ByteLevel pre-tokenizer, no
 * normalizer, a ByteLevel or no decoder) is "general": its normalizers, pre-tokenizers and
 * decoders are these steps, applied as `tokenizers` applies them (docs/tokenizers.md). */
enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_PREPEND, NORM_REPLACE };
typedef struct bpe_norm {
    int kind;
    char *a, *b;   /* Prepend: a; Replace: a -> b */
    size_t al, bl;
} bpe_norm;

enum { PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_DIGITS };
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
typedef struct bpe_pretok {
    int kind;
    int add_prefix_space, use_regex;  /* ByteLevel */
    pcre2_code *re;                   /* Split (a literal String pattern compiled as a literal) */
    int jit, behavior, invert;
    char rep[8];                      /* Metaspace replacement (UTF-8 of one character) */
    size_t rep_len;
    int prepend, split;               /* Metaspace prepend_scheme, split */
    int individual;                   /* Digits individual_digits */
} bpe_pretok;

enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
typedef struct bpe_dec {
    int kind;
    char *a, *b;                      /* Replace a -> b; Strip / Metaspace: a = the character */
    size_t al, bl;
    int start, stop;                  /* Strip */
    int prepend;                      /* Metaspace prepend_scheme */
    int whole;                        /* after Fuse: applies to the whole text */
} bpe_dec;

/* Loads normalizer, pre_tokenizer and decoder of a tokenizer.json into t (sets t->general
 * unless the file is the plain GPT-2 form). The JSON values are borrowed. */
struct json_t;
int bpe_pipeline_load(loom_tokenizer *t, const char *path, struct json_t *norm, struct json_t *pt,
                      struct json_t *dec, loom_err *err);
void bpe_pipeline_free(loom_tokenizer *t);
/* Normalizes s[0..n) into *out (malloc'd, or NULL when nothing changed: then the input is the
 * result). split_start: the segment starts a split (Prepend applies). */
int bpe_normalize(const loom_tokenizer *t, const uint8_t *s, size_t n, int split_start,
                  uint8_t **out, size_t *out_len, loom_err *err);
/* Runs pre-tokenizer k.. on a piece; each final piece goes to fn. at0: the piece starts at
 * offset 0 of the encoded text; cont: the text continues earlier text (LOOM_TOK_CONTINUE). */
int bpe_pretok_run(const loom_tokenizer *t, pcre2_match_data *md, int k, const uint8_t *s, size_t n,
                   int at0, int cont, bpe_piece_fn_t fn, void *ctx, loom_err *err);
/* The bytes the decoder chain gives for token string s (per-token steps only, not the first
 * token's Metaspace rule): malloc'd into *out. */
void bpe_decode_token(const loom_tokenizer *t, const char *s, size_t n, int first, char **out,
                      size_t *out_len);

/* ---- the tokenizer ---------------------------------------------------------------------- */
typedef struct bpe_token {
    char *str;          /* vocabulary spelling (UTF-8), NULL when the id is unused */
    uint32_t str_len;
    char *raw;          /* bytes it decodes to */
    uint32_t raw_len;
    uint8_t in_vocab;   /* in model.vocab (vs only an added token) */
    int8_t added;       /* -1 none, else index into added[] */
} bpe_token;

typedef struct bpe_added {
    char *content;
    size_t len;
    int32_t id;
    int special;
    int normalized;     /* matched after normalization (general tokenizers) */
    int lstrip, rstrip; /* the match takes the whitespace before / after it (HF) */
    char *ncontent;     /* normalized tokens: the content normalized, which is what HF matches */
    size_t nlen;
} bpe_added;

typedef struct bpe_cache_entry {
    uint64_t hash;      /* 0 = empty */
    uint32_t key_off, key_len, ids_off, n_ids;
} bpe_cache_entry;

typedef struct bpe_cache_stripe {
    pthread_mutex_t mu;
    bpe_cache_entry *slots; /* BPE_CACHE_SLOTS */
    uint32_t used;
    uint8_t *pool;          /* keys, then ids (4-byte aligned) */
    size_t pool_len, pool_cap;
} bpe_cache_stripe;

struct loom_tokenizer {
    loom_tokenizer_kind kind;
    uint32_t vocab_size;      /* 1 + max id */
    bpe_token *tok;           /* (vocab_size) */
    bpe_strmap vocab;         /* spelling -> id (model vocab) */
    int32_t byte_id[256];     /* id of each byte's character, -1 when absent */
    int32_t fallback_id[256][2]; /* byte_fallback "<0xXX>" ids for the character's UTF-8 bytes */
    /* merges in rank order, and (a,b) -> (rank << 32 | new_id) */
    uint32_t n_merges;
    int32_t (*merges)[2];
    bpe_u64map merge_map;
    /* added tokens, matched leftmost-longest before pre-tokenization */
    int n_added;
    bpe_added *added;
    uint8_t added_first[256]; /* 1 when some added token starts with this byte */
    /* options (HF names) */
    int add_prefix_space, use_regex, ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;           /* -1 when no unk token */
    /* general tokenizers (bpe_pipeline.c): not the plain GPT-2 form */
    int general;
    int byte_level;           /* pieces go through the ByteLevel byte alphabet (else characters) */
    int n_norm, n_pt, n_dec;
    bpe_norm *norm;
    bpe_pretok *pt;
    bpe_dec *dec;
    int dec_meta_first;       /* a Metaspace decoder drops the replacement in the first token */
    int strip_start, strip_stop; /* a Strip decoder after Fuse: characters strip_char at the ends */
    char strip_char[8];
    size_t strip_char_len;
    char *j_norm, *j_pt, *j_dec; /* their JSON (compact), written back by bpe_json_text */
    int32_t char_id[128];     /* char mode: ids of the ASCII characters, -1 when absent */
    int32_t fb_id[256];       /* ids of "<0xXX>", -1 when absent */
    pcre2_code *re;
    int jit;
    bpe_cache_stripe *cache;  /* (BPE_CACHE_STRIPES), NULL for byte tokenizers */
    char id_hex[65];
};

/* Allocates an empty BPE tokenizer (no vocabulary) with the regex compiled. */
int bpe_new(loom_tokenizer **out, loom_err *err);
/* After tok/vocab/merges/added are filled: byte tables, cache, content hash. */
int bpe_finish(loom_tokenizer *t, loom_err *err);
/* Sets id's spelling (takes ownership of str) and derives its raw bytes. */
void bpe_set_token(loom_tokenizer *t, int32_t id, char *str, size_t len, int in_vocab);
/* The canonical tokenizer.json text (compact when compact != 0); malloc'd. */
char *bpe_json_text(const loom_tokenizer *t, int compact);

/* Pre-tokenization callback: one piece of the input at a time. */
typedef bpe_piece_fn_t bpe_piece_fn;
/* Splits text (no added tokens inside) as the ByteLevel pre-tokenizer does: valid UTF-8 runs
 * through the regex, invalid byte runs as pieces of their own. Returns 0 or -1 (regex
 * failure, message in err). md: match data from pcre2_match_data_create(1, NULL). */
int bpe_pretokenize(const loom_tokenizer *t, pcre2_match_data *md, const uint8_t *s, size_t n,
                    bpe_piece_fn fn, void *ctx, loom_err *err);
/* Applies the merges to the symbols in ids[0..n) (in place); returns the new count. */
size_t bpe_merge_word(const loom_tokenizer *t, int32_t *ids, size_t n);
/* The reference heap algorithm (any n); bpe_merge_word uses it above a small size. */
size_t bpe_merge_word_heap(const loom_tokenizer *t, int32_t *ids, size_t n);
size_t bpe_merge_word_scan(const loom_tokenizer *t, int32_t *ids, size_t n);

/* Exported for tests: pre-tokenize text (with added-token splitting) and write the byte
 * offset where each piece ends into ends (up to max); returns the number of pieces or -1. */
long loom_bpe_debug_pieces(const loom_tokenizer *t, const char *text, size_t len, size_t *ends,
                           size_t max);
int loom_bpe_debug_unassigned(uint8_t *bitmap);

#endif
