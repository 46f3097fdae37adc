/* Byte-level BPE: hostile tokenizer.json / vocab.json / merges.txt files (every error names the
 * file and the problem, nothing crashes under ASan/UBSan, fuzzed files included), a small
 * hand-checked tokenizer, the two merge algorithms against each other, training round trips
 * through both file formats, the byte tokenizer. */
#include "testutil.h"

#include "data/bpe_internal.h"
#include "loom/tokenizer.h"

/* A tiny valid tokenizer: bytes 'a' 'b' 'c' ' '(as Ġ) and merges a b -> ab, ab c -> abc,
 * Ġ a -> Ġa. Its pieces are substituted into the hostile variants below. */
#define VOCAB "{\"a\": 0, \"b\": 1, \"c\": 2, \"\\u0120\": 3, \"ab\": 4, \"abc\": 5, \"\\u0120a\": 6, \"<|endoftext|>\": 7}"
#define MERGES "[\"a b\", [\"ab\", \"c\"], \"\\u0120 a\"]"
#define ADDED "[{\"id\": 7, \"content\": \"<|endoftext|>\", \"special\": true}]"
#define PRE "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"

static char *tok_json(const char *vocab, const char *merges, const char *added, const char *pre,
                      const char *extra_model, const char *extra_root) {
    char *s = NULL;
    int n = asprintf(&s,
                     "{\"version\": \"1.0\", \"added_tokens\": %s, \"normalizer\": null, \"pre_tokenizer\": %s,"
                     " \"decoder\": {\"type\": \"ByteLevel\"}%s, \"model\": {\"type\": \"BPE\", \"dropout\": null,"
                     " \"unk_token\": null%s, \"vocab\": %s, \"merges\": %s}}",
                     added, pre, extra_root, extra_model, vocab, merges);
    assert_true(n > 0);
    return s;
}

static void expect_json_error(const char *name, const char *text, const char *want1, const char *want2) {
    char path[512];
    tu_path(path, sizeof path, name);
    tu_write_text(path, text);
    loom_tokenizer *t = NULL;
    loom_err err;
    memset(&err, 0, sizeof err);
    int rc = loom_tokenizer_load_json(path, &t, &err);
    if (rc == 0 || !strstr(err.msg, path) || (want1 && !strstr(err.msg, want1)) || (want2 && !strstr(err.msg, want2)))
        fail_msg("%s: rc=%d, message '%s' (wanted the path and '%s' '%s')", name, rc, err.msg, want1 ? want1 : "",
                 want2 ? want2 : "");
    assert_null(t);
}

static loom_tokenizer *load_ok(const char *name, const char *text) {
    char path[512];
    tu_path(path, sizeof path, name);
    tu_write_text(path, text);
    loom_tokenizer *t = NULL;
    loom_err err;
    if (loom_tokenizer_load_json(path, &t, &err)) fail_msg("%s: %s", name, err.msg);
    return t;
}

static void expect_ids(loom_tokenizer *t, const char *text, const int32_t *want, size_t n_want) {
    loom_ids ids = {0};
    loom_err err;
    assert_int_equal(loom_tokenizer_encode(t, text, strlen(text), &ids, &err), 0);
    if (ids.n != n_want || (n_want && memcmp(ids.ids, want, n_want * sizeof *want))) {
        fprintf(stderr, "encode('%s') gave", text);
        for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, "\n");
        fail_msg("encode('%s') differs", text);
    }
    char *back;
    size_t blen;
    assert_int_equal(loom_tokenizer_decode(t, ids.ids, ids.n, &back, &blen, &err), 0);
    assert_int_equal(blen, strlen(text));
    assert_memory_equal(back, text, blen);
    free(back);
    loom_ids_free(&ids);
}

static void test_small_tokenizer(void **state) {
    (void)state;
    char *js = tok_json(VOCAB, MERGES, ADDED, PRE, "", "");
    loom_tokenizer *t = load_ok("small.json", js);
    free(js);
    assert_int_equal(loom_tokenizer_vocab_size(t), 8);
    assert_int_equal(loom_tokenizer_special_id(t, "<|endoftext|>"), 7);
    assert_int_equal(loom_tokenizer_special_id(t, "<|nope|>"), -1);
    assert_int_equal(loom_tokenizer_token_id(t, "ab"), 4);
    assert_int_equal(strlen(loom_tokenizer_id(t)), 64);
    expect_ids(t, "abc", (int32_t[]){5}, 1);
    expect_ids(t, "abab a", (int32_t[]){4, 4, 6}, 3);
    expect_ids(t, "cab<|endoftext|>abc", (int32_t[]){2, 4, 7, 5}, 4);
    expect_ids(t, "aaa", (int32_t[]){0, 0, 0}, 3);
    /* bytes that are not in the vocabulary are dropped (no unk token), as in HF: a and b
     * then meet and merge */
    loom_ids ids = {0};
    loom_err err;
    assert_int_equal(loom_tokenizer_encode(t, "axb", 3, &ids, &err), 0);
    assert_int_equal(ids.n, 1);
    assert_int_equal(ids.ids[0], 4);
    loom_ids_free(&ids);
    /* decode errors name the id */
    char *out;
    size_t n;
    assert_int_equal(loom_tokenizer_decode(t, (int32_t[]){1, 99}, 2, &out, &n, &err), -1);
    TU_ASSERT_HAS(err.msg, "99");
    assert_int_equal(loom_tokenizer_decode(t, (int32_t[]){-3}, 1, &out, &n, &err), -1);
    loom_tokenizer_free(t);
}

static void test_hostile_json(void **state) {
    (void)state;
    expect_json_error("trunc.json", "{\"model\": {\"vocab\": {", "invalid JSON", "line 1");
    expect_json_error("empty.json", "", "invalid JSON", NULL);
    expect_json_error("array.json", "[1, 2]", "JSON object", NULL);
    expect_json_error("nomodel.json", "{\"pre_tokenizer\": " PRE "}", "model", NULL);
    expect_json_error("dupkey.json", "{\"model\": {\"vocab\": {\"a\": 0, \"a\": 1}}}", "invalid JSON", "duplicate");
    char deep[5000];
    memset(deep, '[', 4000);
    deep[4000] = 0;
    expect_json_error("deep.json", deep, "invalid JSON", NULL);
    expect_json_error("binary.json", "\x7f" "ELF\x01\x02\x00\x00garbage", "invalid JSON", NULL);

    struct { const char *name, *vocab, *merges, *added, *pre, *model, *root, *want1, *want2; } cases[] = {
        {"wordpiece.json", VOCAB, MERGES, ADDED, PRE, ", \"x\": 1", "", NULL, NULL}, /* valid: extra keys ignored */
        {"vocabarr.json", "[1]", MERGES, ADDED, PRE, "", "", "model.vocab", "object"},
        {"negid.json", "{\"a\": -1}", "[]", "[]", PRE, "", "", "\"a\"", "out of range"},
        {"hugeid.json", "{\"a\": 99999999999}", "[]", "[]", PRE, "", "", "\"a\"", "out of range"},
        {"strid.json", "{\"a\": \"0\"}", "[]", "[]", PRE, "", "", "not an integer", NULL},
        {"dupid.json", "{\"a\": 0, \"b\": 0}", "[]", "[]", PRE, "", "", "id 0", NULL},
        {"nulkey.json", "{\"a\\u0000b\": 0}", "[]", "[]", PRE, "", "", "NUL", NULL},
        {"emptyvocab.json", "{}", "[]", "[]", PRE, "", "", "empty", NULL},
        {"mergesobj.json", VOCAB, "{}", ADDED, PRE, "", "", "model.merges", "array"},
        {"merge3.json", VOCAB, "[\"a b c\"]", ADDED, PRE, "", "", "model.merges[0]", "one space"},
        {"merge1.json", VOCAB, "[\"ab\"]", ADDED, PRE, "", "", "model.merges[0]", NULL},
        {"mergeoov.json", VOCAB, "[\"a z\"]", ADDED, PRE, "", "", "\"z\"", "not in the vocabulary"},
        {"mergeres.json", VOCAB, "[\"b a\"]", ADDED, PRE, "", "", "merged token \"ba\"", NULL},
        {"mergenum.json", VOCAB, "[[1, 2]]", ADDED, PRE, "", "", "model.merges[0]", NULL},
        {"merge3arr.json", VOCAB, "[[\"a\", \"b\", \"c\"]]", ADDED, PRE, "", "", "model.merges[0]", NULL},
        {"addempty.json", VOCAB, MERGES, "[{\"id\": 7, \"content\": \"\"}]", PRE, "", "", "added_tokens[0].content", NULL},
        {"addid.json", VOCAB, MERGES, "[{\"id\": 4000000000, \"content\": \"x\"}]", PRE, "", "", "added_tokens[0].id", NULL},
        {"addsingle.json", VOCAB, MERGES, "[{\"id\": 7, \"content\": \"<m>\", \"single_word\": true}]", PRE, "", "", "single_word", NULL},
        {"addlstrip.json", VOCAB, MERGES, "[{\"id\": 7, \"content\": \"<m>\", \"lstrip\": 1}]", PRE, "", "", "lstrip", NULL},
        {"adddup.json", VOCAB, MERGES, "[{\"id\": 7, \"content\": \"x\"}, {\"id\": 7, \"content\": \"y\"}]", PRE, "", "",
         "added_tokens[1]", "repeats"},
        {"addobj.json", VOCAB, MERGES, "[3]", PRE, "", "", "added_tokens[0]", NULL},
        {"pre.json", VOCAB, MERGES, ADDED, "{\"type\": \"Whitespace\"}", "", "", "Whitespace", "not supported"},
        {"prenull.json", VOCAB, MERGES, ADDED, "null", "", "", NULL, NULL}, /* no pre-tokenizer: characters */
        {"prebool.json", VOCAB, MERGES, ADDED, "{\"type\": \"ByteLevel\", \"use_regex\": 3}", "", "", "use_regex", NULL},
        {"dropout.json", VOCAB, MERGES, ADDED, PRE, ", \"dropout\": 0.1", "", "dropout", NULL},
        {"prefix.json", VOCAB, MERGES, ADDED, PRE, ", \"continuing_subword_prefix\": \"##\"", "", "continuing_subword_prefix", NULL},
        {"unk.json", VOCAB, MERGES, ADDED, PRE, ", \"unk_token\": \"<unk>\"", "", "unk_token", "not in"},
        {"wp.json", VOCAB, MERGES, ADDED, PRE, ", \"type\": \"WordPiece\"", "", "WordPiece", NULL},
        {"norm.json", VOCAB, MERGES, ADDED, PRE, "", ", \"normalizer\": {\"type\": \"Lowercase\"}", "Lowercase", NULL},
        {"normnfc.json", VOCAB, MERGES, ADDED, PRE, "", ", \"normalizer\": {\"type\": \"NFC\"}", NULL, NULL},
        {"dec.json", VOCAB, MERGES, ADDED, PRE, "", ", \"decoder\": {\"type\": \"WordPiece\"}", "decoder", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* duplicate keys are rejected, so the model/root extras replace rather than repeat */
        char *js;
        if (strstr(cases[i].model, "unk_token") || strstr(cases[i].model, "dropout") || strstr(cases[i].model, "type")) {
            int n = asprintf(&js, "{\"added_tokens\": %s, \"pre_tokenizer\": %s, \"model\": {\"vocab\": %s, \"merges\": %s%s}}",
                             cases[i].added, cases[i].pre, cases[i].vocab, cases[i].merges, cases[i].model);
            assert_true(n > 0);
        } else if (strstr(cases[i].root, "normalizer") || strstr(cases[i].root, "decoder")) {
            int n = asprintf(&js, "{\"added_tokens\": %s, \"pre_tokenizer\": %s%s, \"model\": {\"vocab\": %s, \"merges\": %s}}",
                             cases[i].added, cases[i].pre, cases[i].root, cases[i].vocab, cases[i].merges);
            assert_true(n > 0);
        } else {
            js = tok_json(cases[i].vocab, cases[i].merges, cases[i].added, cases[i].pre, cases[i].model, cases[i].root);
        }
        if (!cases[i].want1) {
            loom_tokenizer_free(load_ok(cases[i].name, js));
        } else {
            expect_json_error(cases[i].name, js, cases[i].want1, cases[i].want2);
        }
        free(js);
    }
    loom_tokenizer *t = NULL;
    loom_err err;
    assert_int_equal(loom_tokenizer_load_json("/nonexistent/tokenizer.json", &t, &err), -1);
    TU_ASSERT_HAS(err.msg, "/nonexistent/tokenizer.json");
}

static void expect_vm_error(const char *vocab, const char *merges, const char *which, const char *want) {
    char vp[512], mp[512];
    tu_path(vp, sizeof vp, "v.json");
    tu_path(mp, sizeof mp, "m.txt");
    tu_write_text(vp, vocab);
    tu_write_file(mp, merges, strlen(merges) + (strstr(merges, "NUL") ? 1 : 0));
    loom_tokenizer *t = NULL;
    loom_err err;
    int rc = loom_tokenizer_load_vocab_merges(vp, mp, &t, &err);
    const char *path = !strcmp(which, "vocab") ? vp : mp;
    if (rc == 0 || !strstr(err.msg, path) || !strstr(err.msg, want))
        fail_msg("vocab/merges: rc=%d message '%s' (wanted %s and '%s')", rc, err.msg, path, want);
    assert_null(t);
}

static void test_hostile_vocab_merges(void **state) {
    (void)state;
    expect_vm_error("[1]", "#version: 0.2\n", "vocab", "object");
    expect_vm_error("{\"a\": 0,", "#version: 0.2\n", "vocab", "invalid JSON");
    expect_vm_error(VOCAB, "#version: 0.2\na\n", "merges", "line 2");
    expect_vm_error(VOCAB, "#version: 0.2\na b\n\nab c\n", "merges", "line 3");
    expect_vm_error(VOCAB, "a b c\n", "merges", "line 1");
    expect_vm_error(VOCAB, "a q\n", "merges", "\"q\"");
    expect_vm_error(VOCAB, "c a\n", "merges", "merged token");
    expect_vm_error(VOCAB, "a b\nNUL", "merges", "NUL");
    /* valid, with \r\n line ends and no final newline; <|endoftext|> becomes special */
    char vp[512], mp[512];
    tu_path(vp, sizeof vp, "v.json");
    tu_path(mp, sizeof mp, "m.txt");
    tu_write_text(vp, VOCAB);
    const char *m = "#version: 0.2\r\na b\r\nab c\r\n\xc4\xa0 a";
    tu_write_text(mp, m);
    loom_tokenizer *t = NULL;
    loom_err err;
    if (loom_tokenizer_load_vocab_merges(vp, mp, &t, &err)) fail_msg("%s", err.msg);
    expect_ids(t, "abc a<|endoftext|>", (int32_t[]){5, 6, 7}, 3);
    /* same encoding as the tokenizer.json spelling of the same vocabulary: same id */
    char *js = tok_json(VOCAB, MERGES, ADDED, PRE, "", "");
    loom_tokenizer *tj = load_ok("same.json", js);
    free(js);
    assert_string_equal(loom_tokenizer_id(t), loom_tokenizer_id(tj));
    loom_tokenizer_free(tj);
    loom_tokenizer_free(t);
}

/* Random byte flips, truncations and splices of a valid file: load fails cleanly or works. */
/* A SentencePiece-style file with every general step: normalizers, Split + Metaspace + Digits,
 * byte fallback, unk fusing, lstrip/rstrip and normalized added tokens, the decoder chain. */
static const char GENERAL_JSON[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
    " {\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false, \"rstrip\": true},"
    " {\"id\": 12, \"content\": \"[X]\", \"special\": false, \"normalized\": true, \"lstrip\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Prepend\","
    " \"prepend\": \"\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]},"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
    " {\"Regex\": \"\\\\s+|[,.]\"}, \"behavior\": \"MergedWithNext\", \"invert\": false},"
    " {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"first\", \"split\": true},"
    " {\"type\": \"Digits\", \"individual_digits\": true}]},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\":"
    " \"\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\","
    " \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true, \"fuse_unk\": true,"
    " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"<0xC3>\": 2, \"<0xA9>\": 3, \"<0xFF>\": 4, \"\u2581\": 5, \"a\": 6,"
    " \"b\": 7, \"\u2581a\": 8, \"ab\": 9, \"\u2581ab\": 10, \"1\": 11},"
    " \"merges\": [[\"\u2581\", \"a\"], [\"a\", \"b\"], [\"\u2581a\", \"b\"]]}}";

/* The general pipeline by hand: what tokenizers 0.23 gives for this file (checked once with it). */
static void test_general_small(void **state) {
    (void)state;
    loom_tokenizer *t = load_ok("general.json", GENERAL_JSON);
    loom_err err;
    loom_ids ids = {0};
    /* "ab ab" -> ▁ab▁ab -> ▁ab | ▁ab; "é" -> byte fallback; "q" -> unk; "1" a digit piece */
    const char *text = "ab ab\xc3\xa9q1<s>  ab";
    assert_int_equal(loom_tokenizer_encode(t, text, strlen(text), &ids, &err), 0);
    const int32_t want[] = {10, 10, 2, 3, 0, 11, 1, 10};
    assert_int_equal(ids.n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < ids.n; i++) assert_int_equal(ids.ids[i], want[i]);
    char *out;
    size_t ol;
    assert_int_equal(loom_tokenizer_decode(t, ids.ids, ids.n, &out, &ol, &err), 0);
    assert_string_equal(out, "ab ab\xc3\xa9<unk>1<s> ab");
    free(out);
    loom_ids_free(&ids);
    loom_tokenizer_free(t);
}

static void fuzz_json_base(const char *js, const char *text);

static void test_fuzz_json(void **state) {
    (void)state;
    char *js = tok_json(VOCAB, MERGES, ADDED, PRE, "", "");
    fuzz_json_base(js, "abc ab\xff<|endoftext|> cab");
    fuzz_json_base(GENERAL_JSON, "ab ab\xc3\xa9q1<s>  ab [X] a\xff, b");
    free(js);
}

static void fuzz_json_base(const char *js, const char *text) {
    size_t n = strlen(js);
    char path[512];
    tu_path(path, sizeof path, "fuzz.json");
    char *buf = malloc(n + 64);
    loom_rng r = {42, 7, 0};
    int loaded = 0;
    static const char pieces[][12] = {"\"", "[", "]", "{", "}", ",", ":", "-1", "1e99", "null", "\\u0000", "\"a b\"", "9999999"};
    for (int it = 0; it < 1500; it++) {
        memcpy(buf, js, n + 1);
        size_t len = n;
        int kind = (int)(loom_rng_next_u64(&r) % 3);
        if (kind == 0) {
            for (int k = 0; k < 3; k++) buf[loom_rng_next_u64(&r) % len] = (char)(loom_rng_next_u64(&r) & 0xFF);
        } else if (kind == 1) {
            len = loom_rng_next_u64(&r) % len;
        } else {
            size_t at = loom_rng_next_u64(&r) % len;
            const char *p = pieces[loom_rng_next_u64(&r) % (sizeof pieces / sizeof pieces[0])];
            size_t pl = strlen(p), cut = loom_rng_next_u64(&r) % 4;
            if (at + cut > len) cut = len - at;
            memmove(buf + at + pl, buf + at + cut, len - at - cut);
            memcpy(buf + at, p, pl);
            len = len - cut + pl;
        }
        tu_write_file(path, buf, len);
        loom_tokenizer *t = NULL;
        loom_err err;
        err.msg[0] = 0;
        if (loom_tokenizer_load_json(path, &t, &err) == 0) {
            loaded++;
            loom_ids ids = {0};
            assert_int_equal(loom_tokenizer_encode(t, text, strlen(text), &ids, &err), 0);
            for (size_t i = 0; i < ids.n; i++) assert_true((uint32_t)ids.ids[i] < loom_tokenizer_vocab_size(t));
            char *out;
            size_t ol;
            if (loom_tokenizer_decode(t, ids.ids, ids.n, &out, &ol, &err) == 0) free(out);
            loom_ids_free(&ids);
            loom_tokenizer_free(t);
        } else {
            TU_ASSERT_HAS(err.msg, path);
        }
    }
    assert_true(loaded > 0);
    free(buf);
}

/* The scan merge (short words) and HF's heap algorithm agree on random words. */
static void test_merge_algorithms_agree(void **state) {
    (void)state;
    /* a corpus with many repeats so that training produces long merges */
    size_t n_texts = 400;
    char **texts = calloc(n_texts, sizeof *texts);
    size_t *lens = calloc(n_texts, sizeof *lens);
    loom_rng r = {3, 1, 0};
    for (size_t i = 0; i < n_texts; i++) {
        size_t len = 50 + loom_rng_next_u64(&r) % 200;
        texts[i] = malloc(len + 1);
        for (size_t k = 0; k < len; k++) texts[i][k] = "aaabbc  xyz"[loom_rng_next_u64(&r) % 11];
        texts[i][len] = 0;
        lens[i] = len;
    }
    loom_bpe_train_opts o = {.vocab_size = 400};
    loom_tokenizer *t = NULL;
    loom_err err;
    if (loom_tokenizer_train_texts((const char *const *)texts, lens, n_texts, &o, &t, &err)) fail_msg("%s", err.msg);
    assert_true(t->n_merges > 50);
    int32_t a[300], b[300];
    for (int it = 0; it < 3000; it++) {
        size_t n = 1 + loom_rng_next_u64(&r) % (it < 2500 ? 60 : 300);
        for (size_t k = 0; k < n; k++) a[k] = t->byte_id[(uint8_t)"aaabbc xyz"[loom_rng_next_u64(&r) % 10]];
        memcpy(b, a, n * sizeof *a);
        size_t na = bpe_merge_word_scan(t, a, n), nb = bpe_merge_word_heap(t, b, n);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
    }
    loom_tokenizer_free(t);
    for (size_t i = 0; i < n_texts; i++) free(texts[i]);
    free(texts);
    free(lens);
}

static void test_train_save_load(void **state) {
    (void)state;
    const char *texts[] = {"the cat sat on the mat\n", "the dog sat on the log\n", "  \t tabs\r\n", "caf\xc3\xa9 caf\xc3\xa9\n",
                           "bad \xff\xfe bytes\n", "<|endoftext|> the end\n"};
    size_t lens[6];
    for (int i = 0; i < 6; i++) lens[i] = strlen(texts[i]);
    const char *specials[] = {"<|endoftext|>", "<|pad|>"};
    loom_bpe_train_opts o = {.vocab_size = 290, .specials = specials, .n_specials = 2};
    loom_tokenizer *t = NULL;
    loom_err err;
    if (loom_tokenizer_train_texts(texts, lens, 6, &o, &t, &err)) fail_msg("%s", err.msg);
    assert_true(loom_tokenizer_vocab_size(t) <= 290);
    assert_int_equal(loom_tokenizer_special_id(t, "<|endoftext|>"), 0);
    assert_int_equal(loom_tokenizer_special_id(t, "<|pad|>"), 1);
    char jp[512], vp[512], mp[512];
    tu_path(jp, sizeof jp, "trained.json");
    tu_path(vp, sizeof vp, "trained-vocab.json");
    tu_path(mp, sizeof mp, "trained-merges.txt");
    assert_int_equal(loom_tokenizer_save_json(t, jp, &err), 0);
    assert_int_equal(loom_tokenizer_save_vocab_merges(t, vp, mp, &err), 0);
    loom_tokenizer *tj = NULL, *tv = NULL;
    if (loom_tokenizer_load_json(jp, &tj, &err)) fail_msg("%s", err.msg);
    if (loom_tokenizer_load_vocab_merges(vp, mp, &tv, &err)) fail_msg("%s", err.msg);
    assert_string_equal(loom_tokenizer_id(t), loom_tokenizer_id(tj));
    const char *probe = "the cat sat on the log <|endoftext|> caf\xc3\xa9 \xff<|pad|>";
    loom_ids a = {0}, b = {0}, c = {0};
    assert_int_equal(loom_tokenizer_encode(t, probe, strlen(probe), &a, &err), 0);
    assert_int_equal(loom_tokenizer_encode(tj, probe, strlen(probe), &b, &err), 0);
    assert_int_equal(loom_tokenizer_encode(tv, probe, strlen(probe), &c, &err), 0);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, a.n * sizeof *a.ids);
    assert_int_equal(a.ids[a.n - 1], 1); /* <|pad|> is special in the json */
    /* vocab+merges only knows <|endoftext|>: <|pad|> is spelled out there */
    assert_true(c.n > a.n);
    char *out;
    size_t ol;
    assert_int_equal(loom_tokenizer_decode(tj, b.ids, b.n, &out, &ol, &err), 0);
    assert_int_equal(ol, strlen(probe));
    assert_memory_equal(out, probe, ol);
    free(out);
    loom_ids_free(&a);
    loom_ids_free(&b);
    loom_ids_free(&c);
    loom_tokenizer_free(t);
    loom_tokenizer_free(tj);
    loom_tokenizer_free(tv);
    /* bad options */
    loom_bpe_train_opts bad = {.vocab_size = 100};
    assert_int_equal(loom_tokenizer_train_texts(texts, lens, 6, &bad, &t, &err), -1);
    TU_ASSERT_HAS(err.msg, "vocab size");
    const char *dup[] = {"<x>", "<x>"};
    loom_bpe_train_opts bad2 = {.vocab_size = 300, .specials = dup, .n_specials = 2};
    assert_int_equal(loom_tokenizer_train_texts(texts, lens, 6, &bad2, &t, &err), -1);
    const char *files[] = {"/nonexistent/corpus.txt"};
    assert_int_equal(loom_tokenizer_train(files, 1, &o, &t, &err), -1);
    TU_ASSERT_HAS(err.msg, "/nonexistent/corpus.txt");
}

static void test_byte_tokenizer(void **state) {
    (void)state;
    const char *sp[] = {"<|endoftext|>", "<|end|>"};
    loom_tokenizer *t = NULL;
    loom_err err;
    assert_int_equal(loom_tokenizer_byte(sp, 2, &t, &err), 0);
    assert_int_equal(loom_tokenizer_vocab_size(t), 258);
    expect_ids(t, "a<|end|>\xff<|endoftext|>", (int32_t[]){'a', 257, 255, 256}, 4);
    char *out;
    size_t n;
    assert_int_equal(loom_tokenizer_decode(t, (int32_t[]){258}, 1, &out, &n, &err), -1);
    TU_ASSERT_HAS(err.msg, "258");
    assert_string_not_equal(loom_tokenizer_id(t), "byte");
    char path[512];
    tu_path(path, sizeof path, "byte.json");
    assert_int_equal(loom_tokenizer_save_json(t, path, &err), -1);
    loom_tokenizer_free(t);
    assert_int_equal(loom_tokenizer_load("byte", &t, &err), 0);
    assert_string_equal(loom_tokenizer_id(t), "byte");
    expect_ids(t, "", NULL, 0);
    loom_tokenizer_free(t);
    assert_int_equal(loom_tokenizer_byte((const char *[]){""}, 1, &t, &err), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_tokenizer),
        cmocka_unit_test(test_hostile_json),
        cmocka_unit_test(test_hostile_vocab_merges),
        cmocka_unit_test(test_general_small),
        cmocka_unit_test(test_fuzz_json),
        cmocka_unit_test(test_merge_algorithms_agree),
        cmocka_unit_test(test_train_save_load),
        cmocka_unit_test(test_byte_tokenizer),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
