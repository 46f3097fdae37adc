/* Shard format v1: writer and validating mmap reader. Byte layout in docs/data-format.md.
 *
 * File = header (4096 bytes) | tokens (token_width bytes each, at a 4096-aligned offset) |
 * pad to 8 | doc start index (u64 each) | [doc labels (u32 each)] | pad to 8 | block
 * checksums (SHA-256 of each block_size-byte block of the range [tokens_offset, end of the
 * doc index or of the labels)). Everything is little-endian. The optional labels section is
 * an additive change: its two header fields (labels_offset, labels_bytes) were reserved
 * zero bytes, and labels_offset == 0 means "no labels", so every older shard reads as before.
 * A shard is untrusted input: every field is checked with overflow-safe arithmetic before a
 * byte it describes is touched, and every error names the path. */
#define _GNU_SOURCE
#include "data/data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct loom_shard {
    char *path;
    const uint8_t *map;  /* (file_size) read-only mapping */
    uint64_t file_size;
    uint32_t width, vocab;
    uint64_t n_tokens, n_docs;
    const uint8_t *tokens;  /* (n_tokens * width) */
    const uint8_t *docs;    /* (n_docs * 8), 8-byte aligned */
    const uint8_t *labels;  /* (n_docs * 4) or NULL (v1) */
    const uint8_t *mask;    /* (n_tokens) loss mask, 0 or 1 per token, or NULL */
    char tokenizer_id[LOOM_SHARD_ID_LEN + 1];
    char recipe_id[LOOM_SHARD_ID_LEN + 1];
};

/* ---- little-endian field access ---- */
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void sha256_raw(const void *data, size_t len, uint8_t out[32]) {
    unsigned int n = 0;
    LOOM_CHECK(EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32);
}

static void header_digest(const uint8_t *hdr, uint8_t out[32]) {
    uint8_t copy[LOOM_SHARD_HEADER_SIZE];
    memcpy(copy, hdr, sizeof copy);
    memset(copy + SH_HEADER_SUM, 0, 32);
    sha256_raw(copy, sizeof copy, out);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* The layout implied by the counts. Returns 0, or -1 when a size overflows 64 bits. */
typedef struct layout {
    uint64_t tokens_off, tokens_bytes, docs_off, docs_bytes, labels_off, labels_bytes;
    uint64_t mask_off, mask_bytes;
    uint64_t sums_off, sums_bytes, n_blocks, file_size;
    uint64_t covered_end; /* the end of the last checksummed section */
} layout;

static int add_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }
static int mul_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }

static int compute_layout(uint64_t n_tokens, uint64_t n_docs, uint32_t width, uint64_t block,
                          int labels, int mask, layout *L) {
    uint64_t end, covered;
    L->tokens_off = LOOM_SHARD_HEADER_SIZE;
    if (!mul_ok(n_tokens, width, &L->tokens_bytes)) return -1;
    if (!add_ok(L->tokens_off, L->tokens_bytes, &end) || end > UINT64_MAX - 8) return -1;
    L->docs_off = align_up(end, 8);
    if (!mul_ok(n_docs, 8, &L->docs_bytes)) return -1;
    if (!add_ok(L->docs_off, L->docs_bytes, &end) || end > UINT64_MAX - 8) return -1;
    L->labels_off = L->labels_bytes = 0;
    if (labels) {
        L->labels_off = end;
        if (!mul_ok(n_docs, 4, &L->labels_bytes)) return -1;
        if (!add_ok(L->labels_off, L->labels_bytes, &end) || end > UINT64_MAX - 8) return -1;
    }
    L->mask_off = L->mask_bytes = 0;
    if (mask) { /* right after the doc index or the labels; covered by the block checksums */
        L->mask_off = end;
        L->mask_bytes = n_tokens;
        if (!add_ok(L->mask_off, L->mask_bytes, &end) || end > UINT64_MAX - 8) return -1;
    }
    L->covered_end = end;
    covered = end - L->tokens_off;
    L->n_blocks = covered / block + (covered % block != 0);
    L->sums_off = align_up(end, 8);
    if (!mul_ok(L->n_blocks, LOOM_SHARD_DIGEST, &L->sums_bytes)) return -1;
    if (!add_ok(L->sums_off, L->sums_bytes, &L->file_size)) return -1;
    /* the whole file must be addressable in memory */
    if (L->file_size > (uint64_t)SIZE_MAX / 2) return -1;
    return 0;
}

static int check_id(const char *path, const char *what, const char *id, loom_err *err) {
    if (!id) return 0;
    if (strlen(id) > LOOM_SHARD_ID_LEN)
        return loom_errf(err, "%s: %s '%s' is longer than %u bytes", path, what, id,
                         LOOM_SHARD_ID_LEN);
    return 0;
}

int loom_shard_write_ex(const char *path, const loom_shard_spec *spec, const uint32_t *tokens,
                        uint64_t n_tokens, const uint64_t *doc_starts, uint64_t n_docs,
                        const uint32_t *labels, char sha_hex[65], loom_err *err) {
    return loom_shard_write_masked(path, spec, tokens, n_tokens, doc_starts, n_docs, labels, NULL,
                                   sha_hex, err);
}

int loom_shard_write_masked(const char *path, const loom_shard_spec *spec, const uint32_t *tokens,
                            uint64_t n_tokens, const uint64_t *doc_starts, uint64_t n_docs,
                            const uint32_t *labels, const uint8_t *mask, char sha_hex[65],
                            loom_err *err) {
    uint32_t vocab = spec->vocab_size, width = spec->token_width;
    if (vocab == 0) return loom_errf(err, "%s: vocab_size must be positive", path);
    if (width == 0) width = vocab <= 256 ? 1 : vocab <= 65536 ? 2 : 4;
    if (width != 1 && width != 2 && width != 4)
        return loom_errf(err, "%s: token_width %u is not 1, 2 or 4", path, width);
    if (width < 4 && (uint64_t)vocab > (1ull << (8 * width)))
        return loom_errf(err, "%s: vocab_size %u does not fit in %u-byte tokens", path, vocab,
                         width);
    if (check_id(path, "tokenizer_id", spec->tokenizer_id, err) ||
        check_id(path, "recipe_id", spec->recipe_id, err))
        return -1;
    if (n_tokens > 0 && n_docs == 0)
        return loom_errf(err, "%s: %llu tokens but no document starts", path,
                         (unsigned long long)n_tokens);
    for (uint64_t i = 0; i < n_docs; i++) {
        uint64_t prev = i ? doc_starts[i - 1] : 0;
        if ((i == 0 && doc_starts[0] != 0) || (i > 0 && doc_starts[i] <= prev) ||
            doc_starts[i] >= n_tokens)
            return loom_errf(err,
                             "%s: doc_starts[%llu] = %llu is invalid (must start at 0, "
                             "ascend strictly and stay below %llu tokens)",
                             path, (unsigned long long)i, (unsigned long long)doc_starts[i],
                             (unsigned long long)n_tokens);
    }
    for (uint64_t i = 0; i < n_tokens; i++)
        if (tokens[i] >= vocab)
            return loom_errf(err, "%s: token %llu has id %u >= vocab_size %u", path,
                             (unsigned long long)i, tokens[i], vocab);
    for (uint64_t i = 0; mask && i < n_tokens; i++)
        if (mask[i] > 1)
            return loom_errf(err, "%s: loss mask of token %llu is %u (0 or 1)", path,
                             (unsigned long long)i, mask[i]);
    layout L;
    if (compute_layout(n_tokens, n_docs, width, LOOM_SHARD_BLOCK_SIZE, labels != NULL,
                       mask != NULL, &L) != 0)
        return loom_errf(err, "%s: %llu tokens / %llu docs is too large for one shard", path,
                         (unsigned long long)n_tokens, (unsigned long long)n_docs);

    uint8_t *buf = calloc(1, (size_t)L.file_size);
    if (!buf)
        return loom_errf(err, "%s: cannot allocate %llu bytes for the shard", path,
                         (unsigned long long)L.file_size);
    uint8_t *tok = buf + L.tokens_off;
    for (uint64_t i = 0; i < n_tokens; i++) {
        if (width == 1) tok[i] = (uint8_t)tokens[i];
        else if (width == 2) { tok[2 * i] = (uint8_t)tokens[i]; tok[2 * i + 1] = (uint8_t)(tokens[i] >> 8); }
        else put_u32(tok + 4 * i, tokens[i]);
    }
    for (uint64_t i = 0; i < n_docs; i++) put_u64(buf + L.docs_off + 8 * i, doc_starts[i]);
    if (labels)
        for (uint64_t i = 0; i < n_docs; i++) put_u32(buf + L.labels_off + 4 * i, labels[i]);
    if (mask && n_tokens) memcpy(buf + L.mask_off, mask, (size_t)n_tokens);
    uint64_t covered_end = L.covered_end;
    for (uint64_t b = 0; b < L.n_blocks; b++) {
        uint64_t lo = L.tokens_off + b * LOOM_SHARD_BLOCK_SIZE;
        uint64_t hi = lo + LOOM_SHARD_BLOCK_SIZE < covered_end ? lo + LOOM_SHARD_BLOCK_SIZE : covered_end;
        sha256_raw(buf + lo, (size_t)(hi - lo), buf + L.sums_off + LOOM_SHARD_DIGEST * b);
    }
    uint8_t *h = buf;
    memcpy(h + SH_MAGIC, LOOM_SHARD_MAGIC, 8);
    put_u32(h + SH_VERSION, LOOM_SHARD_VERSION);
    put_u32(h + SH_HEADER_SIZE, LOOM_SHARD_HEADER_SIZE);
    put_u32(h + SH_TOKEN_WIDTH, width);
    put_u32(h + SH_VOCAB_SIZE, vocab);
    put_u64(h + SH_N_TOKENS, n_tokens);
    put_u64(h + SH_N_DOCS, n_docs);
    put_u64(h + SH_BLOCK_SIZE, LOOM_SHARD_BLOCK_SIZE);
    put_u64(h + SH_N_BLOCKS, L.n_blocks);
    put_u64(h + SH_TOKENS_OFF, L.tokens_off);
    put_u64(h + SH_TOKENS_BYTES, L.tokens_bytes);
    put_u64(h + SH_DOCS_OFF, L.docs_off);
    put_u64(h + SH_DOCS_BYTES, L.docs_bytes);
    put_u64(h + SH_SUMS_OFF, L.sums_off);
    put_u64(h + SH_SUMS_BYTES, L.sums_bytes);
    put_u64(h + SH_FILE_SIZE, L.file_size);
    if (labels) {
        put_u64(h + SH_LABELS_OFF, L.labels_off);
        put_u64(h + SH_LABELS_BYTES, L.labels_bytes);
    }
    if (mask) {
        put_u64(h + SH_MASK_OFF, L.mask_off);
        put_u64(h + SH_MASK_BYTES, L.mask_bytes);
    }
    if (spec->tokenizer_id) memcpy(h + SH_TOKENIZER_ID, spec->tokenizer_id, strlen(spec->tokenizer_id));
    if (spec->recipe_id) memcpy(h + SH_RECIPE_ID, spec->recipe_id, strlen(spec->recipe_id));
    header_digest(h, h + SH_HEADER_SUM);

    if (sha_hex) loom_sha256_hex(buf, (size_t)L.file_size, sha_hex);
    int rc = loom_write_file_atomic(path, buf, (size_t)L.file_size, err);
    free(buf);
    return rc;
}

int loom_shard_write_sha(const char *path, const loom_shard_spec *spec, const uint32_t *tokens,
                         uint64_t n_tokens, const uint64_t *doc_starts, uint64_t n_docs,
                         char sha_hex[65], loom_err *err) {
    return loom_shard_write_ex(path, spec, tokens, n_tokens, doc_starts, n_docs, NULL, sha_hex,
                               err);
}

int loom_shard_write(const char *path, const loom_shard_spec *spec, const uint32_t *tokens,
                     uint64_t n_tokens, const uint64_t *doc_starts, uint64_t n_docs,
                     loom_err *err) {
    return loom_shard_write_sha(path, spec, tokens, n_tokens, doc_starts, n_docs, NULL, err);
}

/* ---- reader ---- */
static int read_id(const char *path, const uint8_t *h, int off, const char *what, char *out,
                   loom_err *err) {
    const uint8_t *field = h + off;
    size_t n = 0;
    while (n < LOOM_SHARD_ID_LEN && field[n]) n++;
    for (size_t i = n; i < LOOM_SHARD_ID_LEN; i++)
        if (field[i])
            return loom_errf(err, "%s: header field %s is not NUL-padded (byte %zu)", path, what,
                             (size_t)off + i);
    for (size_t i = 0; i < n; i++)
        if (field[i] < 0x20 || field[i] > 0x7e)
            return loom_errf(err, "%s: header field %s has a non-printable byte", path, what);
    memcpy(out, field, n);
    out[n] = 0;
    return 0;
}

/* Validates the header (h = first 4096 bytes, file_size = actual size) into s. */
static int validate_header(loom_shard *s, const uint8_t *h, uint64_t actual, layout *L,
                           loom_err *err) {
    const char *path = s->path;
    if (memcmp(h + SH_MAGIC, LOOM_SHARD_MAGIC, 8) != 0)
        return loom_errf(err, "%s: bad magic (not a loom shard)", path);
    uint32_t version = get_u32(h + SH_VERSION);
    if (version != LOOM_SHARD_VERSION)
        return loom_errf(err, "%s: unsupported shard version %u (this loom reads version %u)",
                         path, version, LOOM_SHARD_VERSION);
    uint8_t digest[32];
    header_digest(h, digest);
    if (memcmp(digest, h + SH_HEADER_SUM, 32) != 0)
        return loom_errf(err, "%s: header checksum mismatch (bytes 0..%u are corrupt)", path,
                         LOOM_SHARD_HEADER_SIZE);
    int has_labels = get_u64(h + SH_LABELS_OFF) != 0;
    int has_mask = get_u64(h + SH_MASK_OFF) != 0;
    for (size_t i = SH_RESERVED; i < LOOM_SHARD_HEADER_SIZE; i++)
        if (h[i]) return loom_errf(err, "%s: reserved header byte %zu is not zero", path, i);
    uint32_t hsize = get_u32(h + SH_HEADER_SIZE);
    if (hsize != LOOM_SHARD_HEADER_SIZE)
        return loom_errf(err, "%s: header_size %u, expected %u", path, hsize,
                         LOOM_SHARD_HEADER_SIZE);
    s->width = get_u32(h + SH_TOKEN_WIDTH);
    s->vocab = get_u32(h + SH_VOCAB_SIZE);
    s->n_tokens = get_u64(h + SH_N_TOKENS);
    s->n_docs = get_u64(h + SH_N_DOCS);
    uint64_t block = get_u64(h + SH_BLOCK_SIZE);
    if (s->width != 1 && s->width != 2 && s->width != 4)
        return loom_errf(err, "%s: token_width %u is not 1, 2 or 4", path, s->width);
    if (s->vocab == 0 || (s->width < 4 && (uint64_t)s->vocab > (1ull << (8 * s->width))))
        return loom_errf(err, "%s: vocab_size %u does not fit %u-byte tokens", path, s->vocab,
                         s->width);
    if (block < 4096 || block > (1ull << 30) || block % 4096 != 0)
        return loom_errf(err, "%s: block_size %llu is not a multiple of 4096 in [4 KiB, 1 GiB]",
                         path, (unsigned long long)block);
    if (compute_layout(s->n_tokens, s->n_docs, s->width, block, has_labels, has_mask, L) != 0)
        return loom_errf(err, "%s: header claims %llu tokens and %llu docs: sizes overflow",
                         path, (unsigned long long)s->n_tokens, (unsigned long long)s->n_docs);
    if (s->n_tokens > 0 && s->n_docs == 0)
        return loom_errf(err, "%s: header claims %llu tokens but no documents", path,
                         (unsigned long long)s->n_tokens);
    if (s->n_docs > s->n_tokens)
        return loom_errf(err, "%s: header claims %llu docs but only %llu tokens", path,
                         (unsigned long long)s->n_docs, (unsigned long long)s->n_tokens);
    struct { int off; const char *name; uint64_t want; } fields[] = {
        {SH_N_BLOCKS, "n_blocks", L->n_blocks},
        {SH_TOKENS_OFF, "tokens_offset", L->tokens_off},
        {SH_TOKENS_BYTES, "tokens_bytes", L->tokens_bytes},
        {SH_DOCS_OFF, "docs_offset", L->docs_off},
        {SH_DOCS_BYTES, "docs_bytes", L->docs_bytes},
        {SH_SUMS_OFF, "checksums_offset", L->sums_off},
        {SH_SUMS_BYTES, "checksums_bytes", L->sums_bytes},
        {SH_FILE_SIZE, "file_size", L->file_size},
        {SH_LABELS_OFF, "labels_offset", L->labels_off},
        {SH_LABELS_BYTES, "labels_bytes", L->labels_bytes},
        {SH_MASK_OFF, "mask_offset", L->mask_off},
        {SH_MASK_BYTES, "mask_bytes", L->mask_bytes},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        uint64_t got = get_u64(h + fields[i].off);
        if (got != fields[i].want)
            return loom_errf(err,
                             "%s: header field %s = %llu at byte %d, but %llu tokens x %u bytes "
                             "and %llu docs imply %llu (sections would overlap or leave gaps)",
                             path, fields[i].name, (unsigned long long)got, fields[i].off,
                             (unsigned long long)s->n_tokens, s->width,
                             (unsigned long long)s->n_docs, (unsigned long long)fields[i].want);
    }
    if (actual < L->file_size)
        return loom_errf(err, "%s: truncated: header says %llu bytes, file has %llu", path,
                         (unsigned long long)L->file_size, (unsigned long long)actual);
    if (actual > L->file_size)
        return loom_errf(err, "%s: %llu unexpected bytes after the end (header says %llu bytes)",
                         path, (unsigned long long)(actual - L->file_size),
                         (unsigned long long)L->file_size);
    if (read_id(path, h, SH_TOKENIZER_ID, "tokenizer_id", s->tokenizer_id, err) ||
        read_id(path, h, SH_RECIPE_ID, "recipe_id", s->recipe_id, err))
        return -1;
    return 0;
}

static int validate_body(loom_shard *s, const layout *L, uint64_t block, loom_err *err) {
    const char *path = s->path;
    const uint8_t *m = s->map;
    uint64_t covered_end = L->covered_end;
    for (uint64_t b = 0; b < L->n_blocks; b++) {
        uint64_t lo = L->tokens_off + b * block;
        uint64_t hi = covered_end - lo > block ? lo + block : covered_end;
        uint8_t d[32];
        sha256_raw(m + lo, (size_t)(hi - lo), d);
        if (memcmp(d, m + L->sums_off + LOOM_SHARD_DIGEST * b, 32) != 0)
            return loom_errf(err, "%s: block %llu (bytes %llu..%llu) checksum mismatch", path,
                             (unsigned long long)b, (unsigned long long)lo,
                             (unsigned long long)hi);
    }
    /* padding between sections is covered by the checksums, but must be zero too */
    for (uint64_t i = L->tokens_off + L->tokens_bytes; i < L->docs_off; i++)
        if (m[i]) return loom_errf(err, "%s: padding byte %llu is not zero", path, (unsigned long long)i);
    for (uint64_t i = 0; i < s->n_docs; i++) {
        uint64_t v = get_u64(s->docs + 8 * i), prev = i ? get_u64(s->docs + 8 * (i - 1)) : 0;
        uint64_t at = L->docs_off + 8 * i;
        if (i == 0 && v != 0)
            return loom_errf(err, "%s: doc index [0] = %llu at byte %llu, must be 0", path,
                             (unsigned long long)v, (unsigned long long)at);
        if (i > 0 && v <= prev)
            return loom_errf(err,
                             "%s: doc index not ascending: [%llu] = %llu after %llu (byte %llu)",
                             path, (unsigned long long)i, (unsigned long long)v,
                             (unsigned long long)prev, (unsigned long long)at);
        if (v >= s->n_tokens)
            return loom_errf(err, "%s: doc index [%llu] = %llu at byte %llu is past %llu tokens",
                             path, (unsigned long long)i, (unsigned long long)v,
                             (unsigned long long)at, (unsigned long long)s->n_tokens);
    }
    for (uint64_t i = 0; s->mask && i < s->n_tokens; i++)
        if (s->mask[i] > 1)
            return loom_errf(err, "%s: loss mask of token %llu (byte %llu) is %u, not 0 or 1", path,
                             (unsigned long long)i, (unsigned long long)(L->mask_off + i),
                             s->mask[i]);
    if (s->width == 1 && s->vocab >= 256) return 0;
    for (uint64_t i = 0; i < s->n_tokens; i++) {
        uint32_t t = s->width == 1 ? s->tokens[i]
                     : s->width == 2 ? (uint32_t)(s->tokens[2 * i] | (s->tokens[2 * i + 1] << 8))
                                     : get_u32(s->tokens + 4 * i);
        if (t >= s->vocab)
            return loom_errf(err, "%s: token %llu (byte %llu) has id %u >= vocab_size %u", path,
                             (unsigned long long)i,
                             (unsigned long long)(L->tokens_off + (uint64_t)s->width * i), t,
                             s->vocab);
    }
    return 0;
}

int loom_shard_open(const char *path, loom_shard **out, loom_err *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) return loom_errf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return loom_errf(err, "%s: not a regular file", path);
    }
    uint64_t actual = (uint64_t)st.st_size;
    if (actual < LOOM_SHARD_HEADER_SIZE) {
        close(fd);
        return loom_errf(err, "%s: truncated: file has %llu bytes, less than the %u-byte header",
                         path, (unsigned long long)actual, LOOM_SHARD_HEADER_SIZE);
    }
    if (actual > (uint64_t)SIZE_MAX / 2) {
        close(fd);
        return loom_errf(err, "%s: file too large to map", path);
    }
    void *map = mmap(NULL, (size_t)actual, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) return loom_errf(err, "%s: mmap failed: %s", path, strerror(map_errno));

    loom_shard *s = loom_calloc(1, sizeof *s);
    s->path = loom_strdup(path);
    s->map = map;
    s->file_size = actual;
    layout L;
    if (validate_header(s, s->map, actual, &L, err) != 0) goto fail;
    s->tokens = s->map + L.tokens_off;
    s->docs = s->map + L.docs_off;
    s->labels = L.labels_off ? s->map + L.labels_off : NULL;
    s->mask = L.mask_off ? s->map + L.mask_off : NULL;
    if (validate_body(s, &L, get_u64(s->map + SH_BLOCK_SIZE), err) != 0) goto fail;
    *out = s;
    return 0;
fail:
    loom_shard_close(s);
    return -1;
}

void loom_shard_close(loom_shard *s) {
    if (!s) return;
    if (s->map) munmap((void *)s->map, (size_t)s->file_size);
    free(s->path);
    free(s);
}

uint64_t loom_shard_num_tokens(const loom_shard *s) { return s->n_tokens; }
uint64_t loom_shard_num_docs(const loom_shard *s) { return s->n_docs; }
uint32_t loom_shard_vocab_size(const loom_shard *s) { return s->vocab; }
const char *loom_shard_path(const loom_shard *s) { return s->path; }
uint32_t loom_shard_token_width(const loom_shard *s) { return s->width; }
const char *loom_shard_tokenizer_id(const loom_shard *s) { return s->tokenizer_id; }
const char *loom_shard_recipe_id(const loom_shard *s) { return s->recipe_id; }
uint64_t loom_shard_file_size(const loom_shard *s) { return s->file_size; }

int loom_shard_has_labels(const loom_shard *s) { return s->labels != NULL; }

int loom_shard_has_mask(const loom_shard *s) { return s->mask != NULL; }

void loom_shard_apply_mask(const loom_shard *s, uint64_t start, uint64_t n, int32_t *targets) {
    LOOM_CHECK(start <= s->n_tokens && n <= s->n_tokens - start);
    if (!s->mask) return;
    for (uint64_t i = 0; i < n; i++)
        if (!s->mask[start + i]) targets[i] = -1;
}

void loom_shard_read_mask(const loom_shard *s, uint64_t start, uint64_t n, uint8_t *out) {
    LOOM_CHECK(start <= s->n_tokens && n <= s->n_tokens - start);
    if (s->mask) memcpy(out, s->mask + start, (size_t)n);
    else memset(out, 1, (size_t)n);
}

uint32_t loom_shard_doc_label(const loom_shard *s, uint64_t i) {
    LOOM_CHECK(s->labels != NULL && i < s->n_docs);
    return get_u32(s->labels + 4 * i);
}

uint64_t loom_shard_doc_start(const loom_shard *s, uint64_t i) {
    LOOM_CHECK(i < s->n_docs);
    return get_u64(s->docs + 8 * i);
}

void loom_shard_read_tokens(const loom_shard *s, uint64_t start, uint64_t n, int32_t *out) {
    LOOM_CHECK(start <= s->n_tokens && n <= s->n_tokens - start);
    const uint8_t *p = s->tokens + (uint64_t)s->width * start;
    switch (s->width) {
    case 1:
        for (uint64_t i = 0; i < n; i++) out[i] = p[i];
        break;
    case 2:
        for (uint64_t i = 0; i < n; i++) out[i] = (int32_t)(p[2 * i] | (p[2 * i + 1] << 8));
        break;
    default:
        for (uint64_t i = 0; i < n; i++) out[i] = (int32_t)get_u32(p + 4 * i);
        break;
    }
}

void loom_byte_decode(const int32_t *ids, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) out[i] = (ids[i] >= 0 && ids[i] < 256) ? (char)ids[i] : '?';
    out[n] = 0;
}
