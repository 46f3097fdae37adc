/* Fuzz target: BPE encoding of arbitrary bytes (include/loom/tokenizer.h) with a fixed
 * valid tokenizer (a tiny byte-level BPE trained by fuzz_common.h, with two specials): the
 * GPT-2 pre-tokenizer on invalid UTF-8, the merge loop, the word cache, special-token
 * matching. Every id must be below vocab_size and decode(encode(x)) must give x back. */
#include "fuzz_common.h"

static loom_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tok = fuzz_fixture_tokenizer();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (64u << 10)) return 0;
    loom_ids ids = {0};
    loom_err err;
    if (loom_tokenizer_encode(tok, data, size, &ids, &err) != 0) {
        fprintf(stderr, "fuzz: encode failed on %zu bytes: %s\n", size, err.msg);
        abort();
    }
    const uint32_t vocab = loom_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < ids.n; i++) FUZZ_REQUIRE(ids.ids[i] >= 0 && (uint32_t)ids.ids[i] < vocab);
    char *out = NULL;
    size_t out_len = 0;
    FUZZ_REQUIRE(loom_tokenizer_decode(tok, ids.ids, ids.n, &out, &out_len, &err) == 0);
    if (out_len != size || (size && memcmp(out, data, size) != 0)) {
        fprintf(stderr, "fuzz: decode(encode(x)) != x (%zu bytes in, %zu out)\n", size, out_len);
        abort();
    }
    FUZZ_REQUIRE(out[out_len] == 0);
    free(out);
    loom_ids_free(&ids);
    return 0;
}
