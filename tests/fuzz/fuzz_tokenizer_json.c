/* Fuzz target: loom_tokenizer_load_json (include/loom/tokenizer.h) on the bytes as a
 * tokenizer.json. A tokenizer that loads encodes and decodes a few fixed texts (ASCII,
 * UTF-8, invalid UTF-8, special-token spellings), every id it emits must be below its
 * vocab_size, and it is saved and loaded back: the saved file must load, with the same id. */
#include "fuzz_common.h"

static const char *const TEXTS[] = {
    "Hello, world! It's the quick brown fox.\n\tcode() { return 1; }",
    "ünïcödé 日本語 🙂 1234567890",
    "<|endoftext|>a<pad>b<|endoftext|>",
    "\xff\xfe\xc3(\xe2\x82\xa1\xf0\x28\x8c\xbc \x80 end",
    "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    char path[600], saved[600];
    fuzz_path(path, sizeof path, "tokenizer.json");
    fuzz_path(saved, sizeof saved, "saved.json");
    fuzz_write(path, data, size);
    loom_tokenizer *t = NULL;
    loom_err err;
    if (loom_tokenizer_load_json(path, &t, &err) != 0) {
        FUZZ_REQUIRE(t == NULL && err.msg[0] != 0);
        return 0;
    }
    const uint32_t vocab = loom_tokenizer_vocab_size(t);
    FUZZ_REQUIRE(vocab > 0);
    FUZZ_REQUIRE(loom_tokenizer_id(t) != NULL);
    (void)loom_tokenizer_special_id(t, "<|endoftext|>");
    (void)loom_tokenizer_token_id(t, "a");
    for (size_t k = 0; k < sizeof TEXTS / sizeof TEXTS[0]; k++) {
        loom_ids ids = {0};
        if (loom_tokenizer_encode(t, TEXTS[k], strlen(TEXTS[k]), &ids, &err) == 0) {
            for (size_t i = 0; i < ids.n; i++)
                FUZZ_REQUIRE(ids.ids[i] >= 0 && (uint32_t)ids.ids[i] < vocab);
            char *out = NULL;
            size_t out_len = 0;
            if (loom_tokenizer_decode(t, ids.ids, ids.n, &out, &out_len, &err) == 0) free(out);
        }
        loom_ids_free(&ids);
    }
    if (loom_tokenizer_save_json(t, saved, &err) == 0) {
        loom_tokenizer *back = NULL;
        if (loom_tokenizer_load_json(saved, &back, &err) != 0) {
            fprintf(stderr, "fuzz: a saved tokenizer.json does not load back: %s\n", err.msg);
            abort();
        }
        FUZZ_REQUIRE(strcmp(loom_tokenizer_id(t), loom_tokenizer_id(back)) == 0);
        FUZZ_REQUIRE(loom_tokenizer_vocab_size(back) == vocab);
        loom_tokenizer_free(back);
    }
    loom_tokenizer_free(t);
    return 0;
}
