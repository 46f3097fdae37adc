/* Writes the generated (binary, or format-dependent) seed inputs of the fuzz targets:
 *   fuzz_seeds OUT   ->  OUT/<target>/gen_*  for shard, manifest, safetensors, ckpt,
 *                        tokenizer_json
 * They are built with the same fixtures the targets use (fuzz_common.h), so they stay valid
 * when a format changes. The hand-written seeds live in tests/fuzz/corpus/<target>/. */
#include "fuzz_common.h"
#include "data/data_internal.h"
#include "loom/safetensors.h"

static const char *out_dir;

static void seed(const char *target, const char *name, const void *ctl, size_t ctl_len,
                 const void *data, size_t len) {
    char d[1200], p[1400];
    loom_err err;
    loom_pathf(d, sizeof d, "%s/%s", out_dir, target);
    if (loom_mkdirs(d, &err) != 0) {
        fprintf(stderr, "fuzz_seeds: %s\n", err.msg);
        exit(1);
    }
    uint8_t *buf = malloc(ctl_len + len + 1);
    memcpy(buf, ctl, ctl_len);
    memcpy(buf + ctl_len, data, len);
    fuzz_write(loom_pathf(p, sizeof p, "%s/gen_%s", d, name), buf, ctl_len + len);
    free(buf);
}

static void seed_file(const char *target, const char *name, const void *ctl, size_t ctl_len,
                      const char *path) {
    char *buf;
    size_t len;
    loom_err err;
    if (loom_read_file(path, 1u << 26, &buf, &len, &err) != 0) {
        fprintf(stderr, "fuzz_seeds: %s\n", err.msg);
        exit(1);
    }
    seed(target, name, ctl, ctl_len, buf, len);
    free(buf);
}

static void shards(void) {
    char p[600];
    const uint8_t fix = 3; /* repair both checksums */
    fuzz_fixture_shard(fuzz_path(p, sizeof p, "a.bin"));
    seed_file("shard", "byte", &fix, 1, p);

    uint32_t tok[50];
    for (int i = 0; i < 50; i++) tok[i] = (uint32_t)(i * 97 % 1000);
    uint64_t docs[4] = {0, 5, 6, 30};
    uint32_t labels[4] = {1, 0, 2, 1};
    loom_shard_spec wide = {.vocab_size = 1000, .tokenizer_id = "0123abcd", .recipe_id = "r"};
    loom_err err;
    char sha[65];
    if (loom_shard_write_ex(p, &wide, tok, 50, docs, 4, labels, sha, &err) != 0) goto fail;
    seed_file("shard", "labels_w2", &fix, 1, p);
    loom_shard_spec w4 = {.vocab_size = 70000, .token_width = 4};
    if (loom_shard_write_ex(p, &w4, tok, 7, docs, 2, NULL, sha, &err) != 0) goto fail;
    seed_file("shard", "w4", &fix, 1, p);
    if (loom_shard_write_ex(p, &wide, tok, 0, docs, 0, NULL, sha, &err) != 0) goto fail;
    seed_file("shard", "empty", &fix, 1, p);
    return;
fail:
    fprintf(stderr, "fuzz_seeds: %s\n", err.msg);
    exit(1);
}

static void manifests(void) {
    char p[600], sha[65], line[2048];
    loom_err err;
    fuzz_fixture_shard(fuzz_path(p, sizeof p, "a.bin"));
    if (loom_sha256_file(p, sha, &err) != 0) exit(1);
    snprintf(line, sizeof line,
             "{\"shard\": \"a.bin\", \"sha256\": \"%s\", \"tokens\": 300, \"docs\": 3, "
             "\"source\": \"main\", \"recipe\": \"abababababababababababababababababababababababababababababababab\", "
             "\"created\": \"2024-01-01T00:00:00Z\"}\n",
             sha);
    seed("manifest", "one", "", 0, line, strlen(line));
    snprintf(line, sizeof line,
             "{\"shard\": \"a.bin\", \"sha256\": \"%s\", \"tokens\": 300, \"docs\": 3, "
             "\"source\": \"web\", \"weight\": 3, \"repeat_cap\": 1.5}\n"
             "{\"shard\": \"b.bin\", \"sha256\": \"%s\", \"tokens\": 300, \"docs\": 3, "
             "\"source\": \"code\", \"weight\": 0.5, \"repeat_cap\": 0}\n",
             sha, sha);
    seed("manifest", "two_sources", "", 0, line, strlen(line));
    snprintf(line, sizeof line,
             "{\"shard\": \"a.bin\", \"sha256\": \"%s\", \"tokens\": 300, \"docs\": 3, "
             "\"source\": \"s\", \"repeat_cap\": 0.01}\n"
             "{\"shard\": \"b.bin\", \"sha256\": \"%s\", \"tokens\": 300, \"docs\": 3, "
             "\"source\": \"s\", \"repeat_cap\": 0.01}\n{\"shard\": \"c.bin\"",
             sha, sha);
    seed("manifest", "one_source_partial_line", "", 0, line, strlen(line));
}

static void safetensors_and_ckpt(void) {
    char *buf;
    size_t len;
    fuzz_fixture_pieces(&buf, &len);
    seed("safetensors", "pieces", "", 0, buf, len);
    const uint8_t piece = 0, manifest = 1;
    seed("ckpt", "pieces", &piece, 1, buf, len);
    char *m = fuzz_ckpt_manifest("rank_00000.safetensors", buf, len);
    seed("ckpt", "manifest", &manifest, 1, m, strlen(m));
    free(m);
    free(buf);

    /* other dtypes, an empty tensor, a 0-d tensor, a header length that is not 8-aligned */
    const char hdr[] = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]},"
                       "\"c\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[16,20]},"
                       "\"d\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[20,20]},"
                       "\"e\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[20,26]}}";
    uint64_t hl = sizeof hdr - 1;
    uint8_t file[8 + sizeof hdr + 32];
    memcpy(file, &hl, 8);
    memcpy(file + 8, hdr, hl);
    for (int i = 0; i < 26; i++) file[8 + hl + (size_t)i] = (uint8_t)(i * 11);
    seed("safetensors", "dtypes", "", 0, file, 8 + hl + 26);
}

static void tokenizers(void) {
    char p[600];
    loom_err err;
    loom_tokenizer *t = fuzz_fixture_tokenizer();
    if (loom_tokenizer_save_json(t, fuzz_path(p, sizeof p, "tok.json"), &err) != 0) {
        fprintf(stderr, "fuzz_seeds: %s\n", err.msg);
        exit(1);
    }
    loom_tokenizer_free(t);
    seed_file("tokenizer_json", "trained", "", 0, p);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds OUT_DIR\n");
        return 2;
    }
    out_dir = argv[1];
    shards();
    manifests();
    safetensors_and_ckpt();
    tokenizers();
    return 0;
}
