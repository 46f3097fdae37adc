/* Shard format v1 and dataset manifests: round trips for every token width, and every
 * validation error (each must name the path and the problem, and never crash under ASan). */
#include "testutil.h"

#include "data/data_internal.h"
#include "loom/data.h"

/* ---- raw file helpers ---- */
static void sha_raw(const uint8_t *p, size_t n, uint8_t out[32]) {
    char hex[65];
    loom_sha256_hex(p, n, hex);
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
}

/* Recomputes the block checksums and the header checksum from the header's own fields, so
 * that a test can plant a semantic error behind valid checksums. */
static void reseal(uint8_t *buf, size_t n, int blocks_too) {
    if (blocks_too) {
        uint64_t tok = tu_rd64(buf + SH_TOKENS_OFF), docs = tu_rd64(buf + SH_DOCS_OFF);
        uint64_t end = docs + tu_rd64(buf + SH_DOCS_BYTES), bs = tu_rd64(buf + SH_BLOCK_SIZE);
        uint64_t sums = tu_rd64(buf + SH_SUMS_OFF);
        for (uint64_t b = 0; tok + b * bs < end; b++) {
            uint64_t lo = tok + b * bs, hi = lo + bs < end ? lo + bs : end;
            assert_true(sums + 32 * b + 32 <= n);
            sha_raw(buf + lo, hi - lo, buf + sums + 32 * b);
        }
    }
    memset(buf + SH_HEADER_SUM, 0, 32);
    uint8_t d[32];
    sha_raw(buf, LOOM_SHARD_HEADER_SIZE, d);
    memcpy(buf + SH_HEADER_SUM, d, 32);
}

/* A valid shard: n tokens with ids (i * 7919) % vocab, a doc every 100 tokens. */
static void make_shard(const char *path, uint32_t vocab, uint32_t width, uint64_t n) {
    uint32_t *tok = malloc(n * sizeof *tok);
    uint64_t nd = (n + 99) / 100, *docs = malloc(nd * sizeof *docs);
    for (uint64_t i = 0; i < n; i++) tok[i] = (uint32_t)((i * 7919u) % vocab);
    for (uint64_t i = 0; i < nd; i++) docs[i] = 100 * i;
    loom_shard_spec spec = {vocab, width, "byte", "abc123"};
    loom_err err = {{0}};
    int rc = loom_shard_write(path, &spec, tok, n, docs, nd, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    free(tok);
    free(docs);
}

/* make_shard at tu_dir/name (its path into path); returns the file's bytes (the caller frees
 * them) and their count in *n. */
static uint8_t *shard_bytes(char *path, size_t size, const char *name, uint32_t vocab, uint32_t width,
                            uint64_t n_tokens, size_t *n) {
    make_shard(tu_path(path, size, name), vocab, width, n_tokens);
    return tu_read_file(path, n);
}

/* open must fail with a message containing the path and every `want` substring */
static void expect_open_error(const char *path, const char *want1, const char *want2) {
    loom_shard *s = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_shard_open(path, &s, &err), -1);
    assert_null(s);
    TU_ASSERT_HAS(err.msg, path, want1, want2);
}

/* ---- round trips ---- */
static void round_trip(uint32_t vocab, uint32_t width, uint32_t want_width, uint64_t n) {
    char path[512];
    tu_path(path, sizeof path, "rt.bin");
    make_shard(path, vocab, width, n);
    loom_shard *s;
    loom_err err = {{0}};
    assert_int_equal(loom_shard_open(path, &s, &err), 0);
    assert_int_equal(loom_shard_num_tokens(s), n);
    assert_int_equal(loom_shard_num_docs(s), (n + 99) / 100);
    assert_int_equal(loom_shard_vocab_size(s), vocab);
    assert_int_equal(loom_shard_token_width(s), want_width);
    assert_string_equal(loom_shard_tokenizer_id(s), "byte");
    assert_string_equal(loom_shard_recipe_id(s), "abc123");
    int32_t *out = malloc(n * sizeof *out);
    loom_shard_read_tokens(s, 0, n, out);
    for (uint64_t i = 0; i < n; i++) assert_int_equal(out[i], (int32_t)((i * 7919u) % vocab));
    if (n >= 20) {
        loom_shard_read_tokens(s, n / 3, 5, out); /* a window in the middle */
        for (uint64_t i = 0; i < 5; i++)
            assert_int_equal(out[i], (int32_t)(((n / 3 + i) * 7919u) % vocab));
    }
    if (n > 100) assert_int_equal(loom_shard_doc_start(s, 1), 100);
    free(out);
    loom_shard_close(s);
    /* tokens are 4 KiB aligned; the file size follows the layout */
    size_t len;
    uint8_t *buf = tu_read_file(path, &len);
    assert_int_equal(tu_rd64(buf + SH_TOKENS_OFF), 4096);
    assert_int_equal(tu_rd64(buf + SH_FILE_SIZE), len);
    free(buf);
}

static void test_round_trip_widths(void **state) {
    (void)state;
    round_trip(256, 1, 1, 1000);
    round_trip(1000, 2, 2, 1001);
    round_trip(70000, 4, 4, 999);
    round_trip(256, 0, 1, 10);      /* width 0 = smallest that fits */
    round_trip(65536, 0, 2, 300);
    round_trip(65537, 0, 4, 300);
    round_trip(50257, 4, 4, 1);     /* a wider width than needed is allowed */
    round_trip(300, 2, 2, 300000);  /* 600 KB tokens + docs: still one block */
    round_trip(100000, 4, 4, 300000); /* 1.2 MB: two 1 MiB blocks */
}

static void test_empty_shard(void **state) {
    (void)state;
    char path[512];
    tu_path(path, sizeof path, "empty.bin");
    loom_shard_spec spec = {256, 1, NULL, NULL};
    loom_err err = {{0}};
    assert_int_equal(loom_shard_write(path, &spec, NULL, 0, NULL, 0, &err), 0);
    loom_shard *s;
    assert_int_equal(loom_shard_open(path, &s, &err), 0);
    assert_int_equal(loom_shard_num_tokens(s), 0);
    assert_string_equal(loom_shard_tokenizer_id(s), "");
    loom_shard_close(s);
}

static void test_write_rejects_bad_input(void **state) {
    (void)state;
    char path[512];
    tu_path(path, sizeof path, "bad_write.bin");
    uint32_t tok[4] = {1, 2, 300, 4};
    uint64_t docs[2] = {0, 2}, bad_docs[2] = {0, 0}, late[1] = {1};
    loom_err err = {{0}};
    loom_shard_spec w1 = {256, 1, "byte", NULL}, w2 = {1000, 2, "x", NULL}, w1big = {1000, 1, "x", NULL};
    assert_int_equal(loom_shard_write(path, &w1, tok, 4, docs, 2, &err), -1);
    TU_ASSERT_HAS(err.msg, "id 300 >= vocab_size 256", path);
    assert_int_equal(loom_shard_write(path, &w2, tok, 4, bad_docs, 2, &err), -1);
    TU_ASSERT_HAS(err.msg, "doc_starts[1]");
    assert_int_equal(loom_shard_write(path, &w2, tok, 4, late, 1, &err), -1);
    TU_ASSERT_HAS(err.msg, "doc_starts[0]");
    assert_int_equal(loom_shard_write(path, &w2, tok, 4, NULL, 0, &err), -1);
    TU_ASSERT_HAS(err.msg, "no document starts");
    assert_int_equal(loom_shard_write(path, &w1big, tok, 4, docs, 2, &err), -1);
    TU_ASSERT_HAS(err.msg, "does not fit");
    char long_id[100];
    memset(long_id, 'a', 99);
    long_id[99] = 0;
    loom_shard_spec lid = {1000, 2, long_id, NULL};
    assert_int_equal(loom_shard_write(path, &lid, tok, 4, docs, 2, &err), -1);
    TU_ASSERT_HAS(err.msg, "longer than 64");
    assert_int_equal(access(path, F_OK), -1); /* nothing written */
}

/* ---- validation errors ---- */
static void test_missing_and_tiny(void **state) {
    (void)state;
    char path[512];
    tu_path(path, sizeof path, "nope.bin");
    expect_open_error(path, "cannot open", NULL);
    tu_path(path, sizeof path, "tiny.bin");
    tu_write_file(path, (const uint8_t *)"LOOMSHRD", 8);
    expect_open_error(path, "truncated: file has 8 bytes", NULL);
    tu_write_file(path, (const uint8_t *)"", 0);
    expect_open_error(path, "truncated: file has 0 bytes", NULL);
}

static void test_truncated(void **state) {
    (void)state;
    char path[512];
    size_t n;
    uint8_t *buf = shard_bytes(path, sizeof path, "trunc.bin", 256, 1, 10000, &n);
    tu_write_file(path, buf, 5000);
    char want[128];
    snprintf(want, sizeof want, "truncated: header says %zu bytes, file has 5000", n);
    expect_open_error(path, want, NULL);
    tu_write_file(path, buf, n - 1); /* one byte short: the checksum table is cut */
    snprintf(want, sizeof want, "file has %zu", n - 1);
    expect_open_error(path, "truncated", want);
    uint8_t *longer = calloc(1, n + 3);
    memcpy(longer, buf, n);
    tu_write_file(path, longer, n + 3);
    expect_open_error(path, "3 unexpected bytes after the end", NULL);
    free(longer);
    free(buf);
}

static void test_flipped_token_byte(void **state) {
    (void)state;
    char path[512];
    size_t n;
    /* payload 1.2 MB + docs: blocks 0 and 1 */
    uint8_t *buf = shard_bytes(path, sizeof path, "flip.bin", 100000, 4, 300000, &n);
    buf[4096 + 17] ^= 0x01;
    tu_write_file(path, buf, n);
    expect_open_error(path, "block 0 (bytes 4096..1052672) checksum mismatch", NULL);
    buf[4096 + 17] ^= 0x01;
    buf[4096 + (1 << 20) + 5] ^= 0x80; /* in the second block */
    tu_write_file(path, buf, n);
    expect_open_error(path, "block 1 (bytes 1052672..", "checksum mismatch");
    buf[4096 + (1 << 20) + 5] ^= 0x80;
    buf[n - 1] ^= 0xff; /* the stored digest itself */
    tu_write_file(path, buf, n);
    expect_open_error(path, "block 1", "checksum mismatch");
    buf[n - 1] ^= 0xff;
    tu_write_file(path, buf, n);
    loom_shard *s;
    loom_err err;
    assert_int_equal(loom_shard_open(path, &s, &err), 0); /* restored: fine again */
    loom_shard_close(s);
    free(buf);
}

static void test_header_corruption(void **state) {
    (void)state;
    char path[512];
    size_t n;
    uint8_t *buf = shard_bytes(path, sizeof path, "hdr.bin", 256, 1, 1000, &n);
    uint8_t *orig = malloc(n);
    memcpy(orig, buf, n);

    buf[SH_N_TOKENS] ^= 0x04; /* any flipped header byte */
    tu_write_file(path, buf, n);
    expect_open_error(path, "header checksum mismatch", NULL);
    memcpy(buf, orig, n);
    buf[3000] = 1;
    tu_write_file(path, buf, n);
    expect_open_error(path, "header checksum mismatch", NULL);

    memcpy(buf, orig, n);
    memcpy(buf, "NOTSHARD", 8);
    tu_write_file(path, buf, n);
    expect_open_error(path, "bad magic", NULL);

    memcpy(buf, orig, n);
    tu_wr32(buf + SH_VERSION, 2);
    tu_write_file(path, buf, n);
    expect_open_error(path, "unsupported shard version 2", NULL);
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "unsupported shard version 2", NULL);

    memcpy(buf, orig, n);
    buf[3000] = 1; /* reserved bytes must stay zero even behind a valid checksum */
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "reserved header byte 3000", NULL);

    memcpy(buf, orig, n);
    tu_wr32(buf + SH_TOKEN_WIDTH, 3);
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "token_width 3", NULL);

    memcpy(buf, orig, n);
    tu_wr32(buf + SH_VOCAB_SIZE, 257); /* does not fit 1-byte tokens */
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "vocab_size 257", NULL);

    memcpy(buf, orig, n);
    tu_wr64(buf + SH_DOCS_OFF, tu_rd64(buf + SH_DOCS_OFF) - 8); /* docs overlapping tokens */
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "docs_offset", "overlap");

    memcpy(buf, orig, n);
    buf[SH_TOKENIZER_ID + 10] = 'x'; /* after the NUL of "byte" */
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "tokenizer_id is not NUL-padded", NULL);
    free(orig);
    free(buf);
}

/* Rewrites every layout field of the header for the given counts (as a hostile writer
 * that keeps the header self-consistent would). */
static void claim_counts(uint8_t *buf, uint64_t n_tokens, uint64_t n_docs) {
    uint64_t width = 1, tb = n_tokens * width, doff = (4096 + tb + 7) / 8 * 8, db = n_docs * 8;
    uint64_t covered = doff + db - 4096, nb = (covered + (1 << 20) - 1) >> 20;
    uint64_t soff = (doff + db + 7) / 8 * 8;
    tu_wr64(buf + SH_N_TOKENS, n_tokens);
    tu_wr64(buf + SH_N_DOCS, n_docs);
    tu_wr64(buf + SH_N_BLOCKS, nb);
    tu_wr64(buf + SH_TOKENS_BYTES, tb);
    tu_wr64(buf + SH_DOCS_OFF, doff);
    tu_wr64(buf + SH_DOCS_BYTES, db);
    tu_wr64(buf + SH_SUMS_OFF, soff);
    tu_wr64(buf + SH_SUMS_BYTES, nb * 32);
    tu_wr64(buf + SH_FILE_SIZE, soff + nb * 32);
}

static void test_enormous_counts(void **state) {
    (void)state;
    char path[512];
    size_t n;
    uint8_t *buf = shard_bytes(path, sizeof path, "huge.bin", 256, 1, 1000, &n);
    uint8_t *orig = malloc(n);
    memcpy(orig, buf, n);

    tu_wr64(buf + SH_N_TOKENS, (uint64_t)1 << 63); /* 2^63 tokens: sizes overflow */
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "sizes overflow", NULL);

    memcpy(buf, orig, n);
    tu_wr64(buf + SH_N_DOCS, UINT64_MAX);
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "sizes overflow", NULL);

    memcpy(buf, orig, n);
    claim_counts(buf, (uint64_t)1 << 40, 10); /* consistent header, far larger than the file */
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    char want[128];
    snprintf(want, sizeof want, "file has %zu", n);
    expect_open_error(path, "truncated: header says", want);

    memcpy(buf, orig, n);
    tu_wr64(buf + SH_N_TOKENS, 5000); /* more tokens than written, other fields unchanged */
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "header field", "tokens_bytes");

    memcpy(buf, orig, n);
    tu_wr64(buf + SH_BLOCK_SIZE, 0);
    reseal(buf, n, 0);
    tu_write_file(path, buf, n);
    expect_open_error(path, "block_size 0", NULL);
    free(orig);
    free(buf);
}

static void test_doc_index_and_vocab(void **state) {
    (void)state;
    char path[512];
    size_t n;
    /* 10 docs at 0, 100, ..., 900 */
    uint8_t *buf = shard_bytes(path, sizeof path, "docs.bin", 1000, 2, 1000, &n);
    uint8_t *orig = malloc(n);
    memcpy(orig, buf, n);
    uint64_t doff = tu_rd64(buf + SH_DOCS_OFF);

    tu_wr64(buf + doff + 8 * 3, 150); /* [3] = 150 < [2] = 200 */
    reseal(buf, n, 1);
    tu_write_file(path, buf, n);
    expect_open_error(path, "doc index not ascending: [3] = 150 after 200", NULL);

    memcpy(buf, orig, n);
    tu_wr64(buf + doff, 5);
    reseal(buf, n, 1);
    tu_write_file(path, buf, n);
    expect_open_error(path, "doc index [0] = 5", "must be 0");

    memcpy(buf, orig, n);
    tu_wr64(buf + doff + 8 * 9, 1000); /* past the last token */
    reseal(buf, n, 1);
    tu_write_file(path, buf, n);
    expect_open_error(path, "doc index [9] = 1000", "past 1000 tokens");

    memcpy(buf, orig, n);
    buf[4096 + 2 * 7] = 0xe8; /* token 7 = 1000 (0x03e8) */
    buf[4096 + 2 * 7 + 1] = 0x03;
    reseal(buf, n, 1);
    tu_write_file(path, buf, n);
    expect_open_error(path, "token 7", "id 1000 >= vocab_size 1000");

    free(orig);
    free(buf);
    make_shard(path, 1000, 2, 999); /* tokens end at 6094: two bytes of padding */
    buf = tu_read_file(path, &n);
    buf[6095] = 1;
    reseal(buf, n, 1);
    tu_write_file(path, buf, n);
    expect_open_error(path, "padding byte 6095", NULL);
    free(buf);
}

/* Every single-byte corruption of a small shard is either caught or harmless, never a crash. */
static void test_fuzz_bytes(void **state) {
    (void)state;
    char path[512];
    size_t n;
    uint8_t *buf = shard_bytes(path, sizeof path, "fuzz.bin", 300, 2, 50, &n);
    loom_rng r = {42, 7, 0};
    for (int it = 0; it < 300; it++) {
        size_t at = it < 150 ? (size_t)it : (size_t)(loom_rng_next_u64(&r) % n);
        uint8_t old = buf[at];
        buf[at] ^= (uint8_t)(1 + loom_rng_next_u64(&r) % 255);
        tu_write_file(path, buf, n);
        loom_shard *s = NULL;
        loom_err err = {{0}};
        int rc = loom_shard_open(path, &s, &err);
        /* every byte of a v1 shard is covered by a checksum */
        assert_int_equal(rc, -1);
        TU_ASSERT_HAS(err.msg, path);
        buf[at] = old;
    }
    free(buf);
}

/* ---- datasets ---- */
static void make_dataset(const char *dir, int n_shards) {
    loom_err err = {{0}};
    assert_int_equal(loom_mkdirs(dir, &err), 0);
    char mpath[600];
    snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", dir);
    assert_int_equal(loom_write_file_atomic(mpath, "", 0, &err), 0);
    for (int i = 0; i < n_shards; i++) {
        char sp[600], sha[65], line[1024];
        snprintf(sp, sizeof sp, "%s/shard_%05d.bin", dir, i);
        make_shard(sp, 256, 1, 500 + 100 * (uint64_t)i);
        assert_int_equal(loom_sha256_file(sp, sha, &err), 0);
        snprintf(line, sizeof line,
                 "{\"shard\": \"shard_%05d.bin\", \"sha256\": \"%s\", \"tokens\": %d, \"docs\": %d, "
                 "\"source\": \"t\", \"recipe\": \"abababababababababababababababababababababababababababababababab\", "
                 "\"created\": \"2024-01-01T00:00:00Z\"}",
                 i, sha, 500 + 100 * i, 5 + i);
        assert_int_equal(loom_append_line(mpath, line, &err), 0);
    }
}

static void expect_dataset_error(const char *dir, const char *want1, const char *want2) {
    loom_dataset *d = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_dataset_open(dir, &d, &err), -1);
    assert_null(d);
    TU_ASSERT_HAS(err.msg, want1, want2);
}

static void test_dataset_ok(void **state) {
    (void)state;
    char dir[512];
    tu_path(dir, sizeof dir, "ds_ok");
    make_dataset(dir, 3);
    char extra[600]; /* a shard without a manifest line is ignored */
    snprintf(extra, sizeof extra, "%s/shard_00003.bin", dir);
    make_shard(extra, 256, 1, 77);
    loom_dataset *d;
    loom_err err = {{0}};
    assert_int_equal(loom_dataset_open(dir, &d, &err), 0);
    assert_int_equal(loom_dataset_num_shards(d), 3);
    assert_int_equal(loom_dataset_num_tokens(d), 500 + 600 + 700);
    assert_int_equal(loom_dataset_vocab_size(d), 256);
    assert_int_equal(loom_shard_num_tokens(loom_dataset_shard(d, 2)), 700);
    assert_int_equal(loom_dataset_entry(d, 1).line, 2);
    loom_dataset_close(d);
}

static void test_dataset_errors(void **state) {
    (void)state;
    char dir[512], mpath[600], spath[600];
    loom_err err = {{0}};
    tu_path(dir, sizeof dir, "ds_missing");
    expect_dataset_error(dir, dir, "does not exist");
    assert_int_equal(loom_mkdirs(dir, &err), 0);
    expect_dataset_error(dir, "manifest.jsonl", "no manifest");

    /* sha mismatch: a shard replaced by another valid shard */
    tu_path(dir, sizeof dir, "ds_sha");
    make_dataset(dir, 2);
    snprintf(spath, sizeof spath, "%s/shard_00001.bin", dir);
    make_shard(spath, 256, 1, 600 + 0);
    size_t n;
    uint8_t *buf = tu_read_file(spath, &n);
    buf[SH_RECIPE_ID] = 'z'; /* differs from the manifest's file, still a valid shard */
    reseal(buf, n, 0);
    tu_write_file(spath, buf, n);
    free(buf);
    expect_dataset_error(dir, "shard_00001.bin: sha256 mismatch", "manifest.jsonl:2");

    /* a corrupt shard: the shard's own error, with the manifest line */
    tu_path(dir, sizeof dir, "ds_corrupt");
    make_dataset(dir, 2);
    snprintf(spath, sizeof spath, "%s/shard_00000.bin", dir);
    buf = tu_read_file(spath, &n);
    buf[4100] ^= 1;
    tu_write_file(spath, buf, n);
    free(buf);
    expect_dataset_error(dir, "shard_00000.bin: block 0", "checksum mismatch");

    /* a listed shard that is missing */
    tu_path(dir, sizeof dir, "ds_gone");
    make_dataset(dir, 2);
    snprintf(spath, sizeof spath, "%s/shard_00001.bin", dir);
    unlink(spath);
    expect_dataset_error(dir, "shard_00001.bin: cannot open", NULL);

    /* malformed manifest lines name file:line */
    const char *bad[][2] = {
        {"{not json}\n", "manifest.jsonl:2: invalid JSON"},
        {"[1, 2]\n", "manifest.jsonl:2: expected a JSON object"},
        {"{\"sha256\": \"00\", \"tokens\": 1, \"docs\": 1}\n", "manifest.jsonl:2: missing key \"shard\""},
        {"{\"shard\": \"../etc/passwd\", \"sha256\": \"00\", \"tokens\": 1, \"docs\": 1}\n",
         "manifest.jsonl:2: shard \"../etc/passwd\" is not a plain file name"},
        {"{\"shard\": \"x.bin\", \"sha256\": \"00\", \"tokens\": 1, \"docs\": 1}\n",
         "manifest.jsonl:2: sha256 \"00\" is not 64"},
        {"{\"shard\": \"x.bin\", \"sha256\": \"00\", \"tokens\": -1, \"docs\": 1}\n",
         "manifest.jsonl:2: \"tokens\" must be a non-negative integer"},
        {"{\"shard\": \"x.bin\", \"shard\": \"y.bin\"}\n", "manifest.jsonl:2: invalid JSON"},
        {"\n", "manifest.jsonl:2: empty line"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "ds_bad%zu", i);
        tu_path(dir, sizeof dir, name);
        make_dataset(dir, 1);
        snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", dir);
        FILE *f = fopen(mpath, "a");
        fputs(bad[i][0], f);
        fclose(f);
        expect_dataset_error(dir, mpath, bad[i][1]);
    }

    /* a duplicate line, and counts that disagree with the shard */
    tu_path(dir, sizeof dir, "ds_dup");
    make_dataset(dir, 1);
    snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", dir);
    char *text;
    text = tu_read_file(mpath, &n);
    FILE *f = fopen(mpath, "a");
    fputs(text, f);
    fclose(f);
    expect_dataset_error(dir, "manifest.jsonl:2", "listed twice");
    char *p = strstr(text, "\"tokens\": 500");
    assert_non_null(p);
    memcpy(p, "\"tokens\": 501", 13);
    assert_int_equal(loom_write_file_atomic(mpath, text, n, &err), 0);
    expect_dataset_error(dir, "says 501 tokens", "shard_00000.bin");
    free(text);
}

static void test_dataset_partial_last_line(void **state) {
    (void)state;
    char dir[512], mpath[600];
    tu_path(dir, sizeof dir, "ds_partial");
    make_dataset(dir, 2);
    snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", dir);
    FILE *f = fopen(mpath, "a");
    fputs("{\"shard\": \"shard_00002.b", f); /* an append in progress */
    fclose(f);
    loom_dataset *d;
    loom_err err = {{0}};
    assert_int_equal(loom_dataset_open(dir, &d, &err), 0);
    assert_int_equal(loom_dataset_num_shards(d), 2);
    loom_dataset_close(d);
}

/* The loss-mask section (chat data): written, checksummed, read back, applied to targets. */
static void test_loss_mask(void **state) {
    (void)state;
    char path[512];
    tu_path(path, sizeof path, "mask.bin");
    const uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint64_t starts[2] = {0, 5};
    uint8_t mask[8] = {0, 0, 1, 1, 0, 1, 1, 0};
    loom_shard_spec spec = {256, 1, "byte", NULL};
    loom_err err = {{0}};
    assert_int_equal(loom_shard_write_masked(path, &spec, tok, 8, starts, 2, NULL, mask, NULL, &err), 0);
    loom_shard *s;
    assert_int_equal(loom_shard_open(path, &s, &err), 0);
    assert_true(loom_shard_has_mask(s));
    uint8_t got[8];
    loom_shard_read_mask(s, 0, 8, got);
    assert_memory_equal(got, mask, 8);
    int32_t tg[6] = {3, 4, 5, 6, 7, 8}; /* the targets of tokens 2..7 */
    loom_shard_apply_mask(s, 2, 6, tg);
    const int32_t want[6] = {3, 4, -1, 6, 7, -1};
    assert_memory_equal(tg, want, sizeof want);
    loom_shard_close(s);
    /* a shard without the section: all ones, nothing masked */
    assert_int_equal(loom_shard_write_masked(path, &spec, tok, 8, starts, 2, NULL, NULL, NULL, &err), 0);
    assert_int_equal(loom_shard_open(path, &s, &err), 0);
    assert_false(loom_shard_has_mask(s));
    loom_shard_read_mask(s, 0, 8, got);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], 1);
    loom_shard_close(s);
    /* the writer refuses a value other than 0/1; a flipped mask byte fails its block checksum */
    mask[3] = 2;
    assert_int_equal(loom_shard_write_masked(path, &spec, tok, 8, starts, 2, NULL, mask, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "loss mask of token 3 is 2"));
    mask[3] = 1;
    assert_int_equal(loom_shard_write_masked(path, &spec, tok, 8, starts, 2, NULL, mask, NULL, &err), 0);
    size_t n;
    uint8_t *buf = tu_read_file(path, &n);
    const uint64_t mo = (uint64_t)buf[SH_MASK_OFF] | ((uint64_t)buf[SH_MASK_OFF + 1] << 8);
    buf[mo + 3] ^= 1;
    tu_write_file(path, buf, n);
    expect_open_error(path, "checksum mismatch", NULL);
    free(buf);
}

static void test_byte_decode(void **state) {
    (void)state;
    int32_t ids[5] = {'h', 'i', '\n', 300, -1};
    char out[6];
    loom_byte_decode(ids, 5, out);
    assert_memory_equal(out, "hi\n??", 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_widths),
        cmocka_unit_test(test_empty_shard),
        cmocka_unit_test(test_write_rejects_bad_input),
        cmocka_unit_test(test_missing_and_tiny),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_flipped_token_byte),
        cmocka_unit_test(test_header_corruption),
        cmocka_unit_test(test_enormous_counts),
        cmocka_unit_test(test_doc_index_and_vocab),
        cmocka_unit_test(test_fuzz_bytes),
        cmocka_unit_test(test_dataset_ok),
        cmocka_unit_test(test_dataset_errors),
        cmocka_unit_test(test_dataset_partial_last_line),
        cmocka_unit_test(test_loss_mask),
        cmocka_unit_test(test_byte_decode),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
