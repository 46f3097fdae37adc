/* Shared helpers of the libFuzzer targets in tests/fuzz (see docs/fuzzing.md).
 *
 * Every target parses untrusted bytes through loom's public API and frees everything; a parse
 * error is fine, a crash, leak, sanitizer report or hang is a bug. Files go to one private
 * temp directory per process (created on first use, under $TMPDIR or /tmp). The fixtures
 * (a valid shard, a tiny BPE tokenizer) are built by code, so they follow the current
 * formats; fuzz_seeds.c writes the binary seed inputs with the same helpers. Include this
 * header first. */
#ifndef LOOM_FUZZ_COMMON_H
#define LOOM_FUZZ_COMMON_H

/* included first by every target (mkdtemp) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/base.h"
#include "loom/ckpt_pieces.h"
#include "loom/data.h"
#include "loom/tokenizer.h"

/* Aborts (a finding libFuzzer reports) when a property that must hold does not. */
#define FUZZ_REQUIRE(cond)                                                             \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "fuzz: %s:%d: property violated: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* The process's private temp directory (created once; removed by nobody: it is small). */
static inline const char *fuzz_tmpdir(void) {
    static char dir[512];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/loom-fuzz.XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
    }
    return dir;
}

/* dir/name (aborts when the path does not fit) */
static inline const char *fuzz_path(char *buf, size_t size, const char *name) {
    return loom_pathf(buf, size, "%s/%s", fuzz_tmpdir(), name);
}

/* Writes bytes to path, non-atomically (the parser under test reads it back at once). */
static inline void fuzz_write(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* The fixed valid shard the dataset target lists in its manifests: 300 byte tokens in
 * three documents, vocab 256. Deterministic, so its SHA-256 is stable for a given format. */
static inline void fuzz_fixture_shard(const char *path) {
    uint32_t tokens[300];
    for (int i = 0; i < 300; i++) tokens[i] = (uint32_t)((i * 37 + 11) & 0xff);
    const uint64_t docs[3] = {0, 100, 220};
    loom_shard_spec spec = {.vocab_size = 256, .token_width = 1, .tokenizer_id = "byte",
                            .recipe_id = "fuzz"};
    loom_err err;
    if (loom_shard_write(path, &spec, tokens, 300, docs, 3, &err) != 0) {
        fprintf(stderr, "fuzz: fixture shard: %s\n", err.msg);
        abort();
    }
}

/* A tiny byte-level BPE tokenizer trained on fixed texts (vocab 320, two specials). */
static inline loom_tokenizer *fuzz_fixture_tokenizer(void) {
    static const char *const texts[] = {
        "the quick brown fox jumps over the lazy dog",
        "Hello, world! It's 2024 and we're training tokenizers.",
        "ünïcödé wörds and more words, numbers 12345 67890",
        "    indented code() { return x + y; }\n\ttabs\r\n",
        "the the the fox fox dog dog lazy lazy quick quick",
    };
    size_t lens[5];
    for (int i = 0; i < 5; i++) lens[i] = strlen(texts[i]);
    static const char *const specials[] = {"<|endoftext|>", "<pad>"};
    loom_bpe_train_opts o = {.vocab_size = 320, .specials = specials, .n_specials = 2};
    loom_tokenizer *t = NULL;
    loom_err err;
    if (loom_tokenizer_train_texts(texts, lens, 5, &o, &t, &err) != 0) {
        fprintf(stderr, "fuzz: fixture tokenizer: %s\n", err.msg);
        abort();
    }
    return t;
}

/* ---- checkpoint pieces ------------------------------------------------------------------
 * A tiny "model" of two tensors (no loom_model: fuzz_stubs.c stands in for the three model
 * functions ckpt_pieces.c links against), the pieces a rank needs of it, and a valid piece
 * file holding all of them. */
static const loom_tensor_info FUZZ_TENSORS[2] = {
    {.name = "wte", .layer = -1, .offset = 0, .numel = 128, .ndim = 2, .shape = {16, 8},
     .split_dim = -1, .box_len = {16, 8}},
    {.name = "ln_f.w", .layer = -1, .offset = 128, .numel = 8, .ndim = 1, .shape = {8},
     .split_dim = -1, .box_len = {8}},
};
enum { FUZZ_N_NEEDED = 4 };
/* kind 0 = param, 1 = adam_m, 2 = adam_v; data points into buf (at least 300 floats) */
static inline void fuzz_needed_pieces(loom_dp_piece p[FUZZ_N_NEEDED], float *buf) {
    p[0] = (loom_dp_piece){0, &FUZZ_TENSORS[0], 0, 128, buf};
    p[1] = (loom_dp_piece){0, &FUZZ_TENSORS[1], 0, 8, buf + 128};
    p[2] = (loom_dp_piece){1, &FUZZ_TENSORS[0], 32, 64, buf + 136};
    p[3] = (loom_dp_piece){2, &FUZZ_TENSORS[1], 2, 5, buf + 200};
}
/* The pieces as one safetensors buffer (malloc'd): param wte in two pieces, the others whole. */
static inline void fuzz_fixture_pieces(char **out, size_t *len) {
    static float vals[400];
    for (int i = 0; i < 400; i++) vals[i] = (float)i * 0.25f - 7.0f;
    loom_dp_piece p[5] = {
        {0, &FUZZ_TENSORS[0], 0, 40, vals},
        {0, &FUZZ_TENSORS[0], 40, 88, vals + 40},
        {0, &FUZZ_TENSORS[1], 0, 8, vals + 128},
        {1, &FUZZ_TENSORS[0], 0, 128, vals + 136},
        {2, &FUZZ_TENSORS[1], 0, 8, vals + 264},
    };
    loom_err err;
    if (loom_pieces_serialize(p, 5, out, len, &err) != 0) {
        fprintf(stderr, "fuzz: fixture pieces: %s\n", err.msg);
        abort();
    }
}
/* The manifest.json loom_ckpt_commit would write for one file (malloc'd text). */
static inline char *fuzz_ckpt_manifest(const char *name, const void *data, size_t len) {
    char hex[65];
    loom_sha256_hex(data, len, hex);
    size_t cap = strlen(name) + 200;
    char *m = malloc(cap);
    snprintf(m, cap, "{\"step\": 1, \"files\": {\"%s\": {\"bytes\": %zu, \"sha256\": \"%s\"}}}\n",
             name, len, hex);
    return m;
}

#endif
