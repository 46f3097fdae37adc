/* Fuzz target: constrained-decoding grammars (include/loom/grammar.h). The bytes are a JSON
 * schema (up to the first NUL; loom serve compiles what a request sends) and then a document
 * fed byte by byte. A schema that compiles runs the automaton over the document: at every
 * byte, the mask over the byte vocabulary (the trie walk with interned states) must allow the
 * byte exactly when the per-request state accepts it, the mask must allow the end-of-text id
 * exactly when the text is complete, and the distance to a complete document must be 0
 * exactly there. The grammar is also recompiled from its source (a tp follower's path). */
#include "fuzz_common.h"
#include "loom/grammar.h"

static loom_grammar_vocab *byte_vocab(void) {
    static char b[256];
    const char *p[257];
    size_t l[257];
    for (int i = 0; i < 256; i++) b[i] = (char)i, p[i] = b + i, l[i] = 1;
    p[256] = NULL, l[256] = 0;
    return loom_grammar_vocab_new(p, l, 257, 256);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static loom_grammar_vocab *v;
    static loom_grammar_scratch *sc;
    if (!v) v = byte_vocab(), sc = loom_grammar_scratch_new();
    const uint8_t *nul = memchr(data, 0, size);
    const size_t slen = nul ? (size_t)(nul - data) : size;
    char *schema = malloc(slen + 1);
    memcpy(schema, data, slen);
    schema[slen] = 0;
    const uint8_t *doc = nul ? nul + 1 : data + size;
    const size_t dlen = (size_t)(data + size - doc);
    loom_err err;
    loom_grammar *g = NULL;
    /* as a schema; one that starts with a space as the body of a tool-call sequence */
    const int tools = slen > 0 && data[0] == ' ';
    const int rc = tools ? loom_grammar_tool_calls("<c>", schema, "</c>", ",", 3, NULL, &g, &err)
                         : loom_grammar_json(NULL, schema, &g, &err);
    free(schema);
    if (rc) {
        FUZZ_REQUIRE(g == NULL && err.msg[0]);
        return 0;
    }
    loom_grammar *g2 = NULL;
    FUZZ_REQUIRE(loom_grammar_compile_source(loom_grammar_source(g), &g2, &err) == 0);
    FUZZ_REQUIRE(loom_grammar_min_bytes(g2) == loom_grammar_min_bytes(g));
    loom_grammar_unref(g2);
    loom_grammar_state *s = loom_grammar_state_new(g);
    FUZZ_REQUIRE(loom_grammar_state_min_bytes(s) == loom_grammar_min_bytes(g));
    uint8_t allow[257];
    for (size_t i = 0; i < dlen && i < 4096; i++) {
        loom_grammar_mask(s, v, 1 << 30, allow, sc);
        FUZZ_REQUIRE(allow[256] == loom_grammar_state_complete(s));
        FUZZ_REQUIRE((loom_grammar_state_min_bytes(s) == 0) == loom_grammar_state_complete(s));
        const int ok = loom_grammar_state_advance(s, doc + i, 1) == 0;
        FUZZ_REQUIRE(ok == allow[doc[i]]);
        if (!ok) break;
    }
    loom_grammar_state_free(s);
    loom_grammar_unref(g);
    return 0;
}
