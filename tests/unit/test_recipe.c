/* Recipe parsing and the data-build steps: UTF-8 repair, exact and near dedup (MinHash +
 * LSH), CSV records, labels files, the shard labels section, and recipe errors (each must name
 * file:line and never crash under ASan). */
#include "testutil.h"

#include "data/build_source.h"
#include "data/data_internal.h"
#include "data/recipe.h"
#include "loom/data.h"
#include "loom/windows.h"
#include "synth/synth_internal.h"

/* ---- UTF-8 repair ---- */
static void check_repair(const char *in, size_t n, const char *want, size_t want_n) {
    uint8_t out[64];
    size_t m = loom_utf8_repair((const uint8_t *)in, n, NULL);
    assert_int_equal(m, want_n);
    assert_int_equal(loom_utf8_repair((const uint8_t *)in, n, out), want_n);
    assert_memory_equal(out, want, want_n);
    assert_true(loom_utf8_valid(out, m));
}

#define FFFD "\xef\xbf\xbd"
static void test_utf8_repair(void **state) {
    (void)state;
    check_repair("plain ascii", 11, "plain ascii", 11);
    check_repair("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14);
    check_repair("a\xff" "b", 3, "a" FFFD "b", 5);
    check_repair("x\xe2\x82", 3, "x" FFFD, 4);                    /* truncated: one U+FFFD */
    check_repair("\xc0\xaf", 2, FFFD FFFD, 6);                    /* overlong: invalid leads */
    check_repair("\xed\xa0\x80", 3, FFFD FFFD FFFD, 9);           /* surrogate */
    check_repair("\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD, 12); /* > U+10FFFF */
    check_repair("\xe2\x28\xa1", 3, FFFD "(" FFFD, 7);
    assert_false(loom_utf8_valid((const uint8_t *)"\x80", 1));
    assert_true(loom_utf8_valid((const uint8_t *)"", 0));
}

/* ---- dedup ---- */
static void words_doc(uint64_t seed, int n, char *out, size_t cap) {
    static const char *w[] = {"river", "stone", "cloud", "maple", "harbor", "lantern", "velvet",
                              "quartz", "meadow", "ember", "falcon", "willow", "copper",
                              "thistle", "orchard", "saffron"};
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        const char *x = w[loom_rng_u64(seed, 7, (uint64_t)i) % 16];
        o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? " " : "", x);
    }
}

static void test_near_dedup(void **state) {
    (void)state;
    loom_docs d = {0};
    char buf[4096];
    for (int i = 0; i < 20; i++) {
        words_doc((uint64_t)i + 1, 150, buf, sizeof buf);
        loom_docs_add(&d, buf, strlen(buf), -1, 0);
    }
    for (int i = 0; i < 20; i++) { /* near copies: a few characters edited */
        words_doc((uint64_t)i + 1, 150, buf, sizeof buf);
        memcpy(buf + 40, "EDIT", 4);
        memcpy(buf + 400, "X", 1);
        loom_docs_add(&d, buf, strlen(buf), -1, 0);
    }
    uint8_t keep[40];
    loom_near_dedup(&d, 128, 16, 5, 0.8, 1, keep);
    for (int i = 0; i < 40; i++) assert_int_equal(keep[i], i < 20);
    /* a threshold above the copies' similarity keeps them */
    loom_near_dedup(&d, 128, 16, 5, 1.0, 1, keep);
    for (int i = 0; i < 40; i++) assert_int_equal(keep[i], 1);
    /* the signature of identical text is identical; of different text mostly not */
    uint64_t a[128], b[128];
    loom_minhash(loom_doc_bytes(&d, 0), d.v[0].len, 5, 1, 128, a);
    loom_minhash(loom_doc_bytes(&d, 0), d.v[0].len, 5, 1, 128, b);
    assert_memory_equal(a, b, sizeof a);
    const char *other = "0123456789 completely unrelated text, with digits 9876543210 and more";
    loom_minhash((const uint8_t *)other, strlen(other), 5, 1, 128, b);
    int eq = 0;
    for (int j = 0; j < 128; j++) eq += a[j] == b[j];
    assert_true(eq < 64);
    loom_docs_free(&d);
}

/* `loom data build`'s dedup_near and `loom synth`'s near_duplicate validator make the same
 * decision on the same pair: data's step on the documents [a, b] drops b exactly when synth,
 * with a in its pool (a seed), rejects b. Pairs from identical to unrelated by edits, across
 * the threshold, ASCII and multi-byte UTF-8 (shingles count code points in both). */
static void test_near_dedup_synth_agrees(void **state) {
    (void)state;
    char a[4096], b[4096];
    int dups = 0, kept = 0;
    for (int utf8 = 0; utf8 < 2; utf8++)
        for (int edits = 0; edits <= 60; edits += 2) {
            words_doc(100 + (uint64_t)utf8, 120, a, sizeof a);
            if (utf8) { /* every 'e' -> U+00E9 (2 bytes) */
                char t[4096];
                size_t o = 0;
                for (const char *p = a; *p && o + 3 < sizeof t; p++) {
                    if (*p == 'e') t[o++] = (char)0xc3, t[o++] = (char)0xa9;
                    else t[o++] = *p;
                }
                t[o] = 0;
                memcpy(a, t, o + 1);
            }
            memcpy(b, a, strlen(a) + 1);
            const size_t n = strlen(b);
            for (int e = 0; e < edits; e++) { /* spread single-byte ASCII edits */
                size_t at = (size_t)(loom_rng_u64(7, (uint64_t)edits, (uint64_t)e) % n);
                while ((unsigned char)b[at] >= 0x80) at = (at + 1) % n;
                b[at] = (char)('A' + e % 26);
            }
            loom_docs d = {0};
            loom_docs_add(&d, a, strlen(a), -1, 0);
            loom_docs_add(&d, b, strlen(b), -1, 0);
            uint8_t keep[2];
            loom_near_dedup(&d, 128, 16, 5, 0.8, 1, keep);
            assert_int_equal(keep[0], 1);
            loom_docs_free(&d);
            mh_index mh = {.perms = 128, .bands = 16, .shingle = 5, .threshold = 0.8};
            synth_mh_init(&mh);
            uint64_t sig[128];
            synth_mh_signature(&mh, a, strlen(a), sig);
            synth_mh_add(&mh, sig, -1);
            synth_mh_signature(&mh, b, strlen(b), sig);
            int origin = 0;
            double best = 0;
            const int found = synth_mh_query(&mh, sig, &origin, &best);
            synth_mh_free(&mh);
            const int near = found > 0;
            if (found >= 0) assert_int_equal(origin, -1);
            assert_int_equal(near, !keep[1]);
            if (near) assert_true(best >= 0.8);
            dups += near, kept += !near;
        }
    assert_true(dups >= 3 && kept >= 3); /* both decisions occur */
}

static void test_exact_dedup(void **state) {
    (void)state;
    loom_docs d = {0};
    const char *docs[] = {"alpha", "beta", "alpha", "gamma", "beta", "alphA"};
    for (int i = 0; i < 6; i++) loom_docs_add(&d, docs[i], strlen(docs[i]), -1, 0);
    loom_hashset *h = loom_hashset_new();
    uint8_t keep[6];
    loom_exact_dedup(&d, h, keep);
    const uint8_t want[6] = {1, 1, 0, 1, 0, 1};
    assert_memory_equal(keep, want, 6);
    /* the same set across sources: everything is now a duplicate */
    loom_exact_dedup(&d, h, keep);
    for (int i = 0; i < 6; i++) assert_int_equal(keep[i], 0);
    loom_hashset_free(h);
    /* a step run keeps order and counts */
    loom_recipe_step st = {.kind = LOOM_STEP_DEDUP_EXACT};
    loom_step_count c;
    loom_err err;
    assert_int_equal(loom_step_run(&st, 1, &d, NULL, &c, &err), 0);
    assert_int_equal(c.docs_in, 6);
    assert_int_equal(c.docs_out, 4);
    assert_int_equal(c.bytes_in, 5 + 4 + 5 + 5 + 4 + 5);
    assert_int_equal(d.n, 4);
    assert_memory_equal(loom_doc_bytes(&d, 3), "alphA", 5);
    loom_docs_free(&d);
}

/* ---- CSV and labels ---- */
static void test_csv(void **state) {
    (void)state;
    const char *t = "a,\"b,c\",\"say \"\"hi\"\"\"\r\n\"multi\nline\",,x\nlast";
    size_t pos = 0, len = strlen(t);
    char **f;
    int n, lines;
    loom_err err;
    assert_int_equal(loom_csv_record(t, len, &pos, &f, &n, &lines, &err), 0);
    assert_int_equal(n, 3);
    assert_string_equal(f[0], "a");
    assert_string_equal(f[1], "b,c");
    assert_string_equal(f[2], "say \"hi\"");
    for (int i = 0; i < n; i++) free(f[i]);
    free(f);
    assert_int_equal(loom_csv_record(t, len, &pos, &f, &n, &lines, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(lines, 2);
    assert_string_equal(f[0], "multi\nline");
    assert_string_equal(f[1], "");
    for (int i = 0; i < n; i++) free(f[i]);
    free(f);
    assert_int_equal(loom_csv_record(t, len, &pos, &f, &n, &lines, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(f[0], "last");
    free(f[0]);
    free(f);
    assert_int_equal(pos, len);
    pos = 0;
    assert_int_equal(loom_csv_record("\"open", 5, &pos, &f, &n, &lines, &err), -1);
    TU_ASSERT_HAS(err.msg, "unterminated");
}

static void test_labels(void **state) {
    (void)state;
    char p[512];
    loom_err err;
    loom_labels *l;
    tu_path(p, sizeof p, "l.jsonl");
    tu_write_text(p, "{\"path\": \"./cat/1.bin\", \"label\": \"cat\"}\n\n{\"path\": \"dog/2.bin\", \"label\": 7}\n");
    assert_int_equal(loom_labels_load(p, "path", "label", &l, &err), 0);
    assert_string_equal(loom_labels_find(l, "cat/1.bin"), "cat");
    assert_string_equal(loom_labels_find(l, "dog/2.bin"), "7");
    assert_null(loom_labels_find(l, "cow.bin"));
    const char **names;
    assert_int_equal(loom_labels_names(l, &names), 2);
    assert_string_equal(names[0], "7");
    assert_string_equal(names[1], "cat");
    loom_labels_free(l);

    tu_path(p, sizeof p, "l.csv");
    tu_write_text(p, "class,sha256\r\ncat,ABCDEF\r\ndog,012345\r\n");
    assert_int_equal(loom_labels_load(p, "sha256", "class", &l, &err), 0);
    assert_string_equal(loom_labels_find(l, "abcdef"), "cat"); /* hashes compare in lowercase */
    loom_labels_free(l);

    struct { const char *text; const char *want; } bad[] = {
        {"path,label\na.bin,cat\na.bin,dog\n", "l.csv:3: \"a.bin\" is labelled \"dog\" here and \"cat\" on line 2"},
        {"name,label\na.bin,cat\n", "l.csv:1: the header row needs columns \"path\" and \"label\""},
        {"path,label\na.bin,cat,extra\n", "l.csv:2: 3 fields, the header has 2"},
        {"path,label\n\"a.bin,cat\n", "l.csv:2: unterminated quoted field"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tu_write_text(p, bad[i].text);
        assert_int_equal(loom_labels_load(p, "path", "label", &l, &err), -1);
        if (!strstr(err.msg, bad[i].want)) fail_msg("'%s' lacks '%s'", err.msg, bad[i].want);
    }
    tu_path(p, sizeof p, "l.jsonl");
    tu_write_text(p, "{\"path\": \"a\", \"label\": \"x\"}\n{\"path\": 3, \"label\": \"y\"}\n");
    assert_int_equal(loom_labels_load(p, "path", "label", &l, &err), -1);
    TU_ASSERT_HAS(err.msg, "l.jsonl:2: expected an object with a string \"path\"");
}

/* ---- shard labels section ---- */
static void test_shard_labels(void **state) {
    (void)state;
    char p[512];
    uint32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    uint64_t starts[3] = {0, 4, 7};
    uint32_t labels[3] = {2, 0, 0xfffffffeu};
    loom_shard_spec spec = {256, 0, "byte", "r"};
    loom_err err;
    loom_shard *s;
    tu_path(p, sizeof p, "l.bin");
    assert_int_equal(loom_shard_write_ex(p, &spec, tok, 10, starts, 3, labels, NULL, &err), 0);
    assert_int_equal(loom_shard_open(p, &s, &err), 0);
    assert_true(loom_shard_has_labels(s));
    for (int i = 0; i < 3; i++) assert_int_equal(loom_shard_doc_label(s, (uint64_t)i), labels[i]);
    loom_shard_close(s);
    /* without labels: the section is absent and the file is the plain v1 layout */
    tu_path(p, sizeof p, "n.bin");
    assert_int_equal(loom_shard_write(p, &spec, tok, 10, starts, 3, &err), 0);
    assert_int_equal(loom_shard_open(p, &s, &err), 0);
    assert_false(loom_shard_has_labels(s));
    assert_int_equal(loom_shard_file_size(s), 4096 + 16 + 24 + 32);
    loom_shard_close(s);
    /* a corrupted labels offset is caught (header checksum first) */
    tu_path(p, sizeof p, "l.bin");
    tu_xor_byte(p, SH_LABELS_OFF, 8);
    assert_int_equal(loom_shard_open(p, &s, &err), -1);
    TU_ASSERT_HAS(err.msg, "header checksum mismatch");
}

/* A one-shard dataset in tu_dir/name: 3 documents with the given labels, tokenizer `tok`,
 * and dataset.json listing classes a, b. */
static void labelled_dataset(const char *name, const uint32_t labels[3], const char *tok) {
    char dir[512], p[600], sha[65], line[512];
    tu_path(dir, sizeof dir, name);
    loom_err err = {{0}};
    assert_int_equal(loom_mkdirs(dir, &err), 0);
    uint32_t tokens[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    uint64_t starts[3] = {0, 4, 8};
    loom_shard_spec spec = {256, 0, tok, "r"};
    snprintf(p, sizeof p, "%s/shard_00000.bin", dir);
    if (loom_shard_write_ex(p, &spec, tokens, 12, starts, 3, labels, sha, &err)) fail_msg("%s", err.msg);
    snprintf(line, sizeof line,
             "{\"shard\":\"shard_00000.bin\",\"sha256\":\"%s\",\"tokens\":12,\"docs\":3,"
             "\"source\":\"s\"}", sha);
    snprintf(p, sizeof p, "%s/manifest.jsonl", dir);
    if (loom_append_line(p, line, &err)) fail_msg("%s", err.msg);
    snprintf(p, sizeof p, "%s/dataset.json", dir);
    tu_write_text(p, "{\"classes\": [\"a\", \"b\"]}\n");
}

/* Labels read from a shard are untrusted: each must index dataset.json's class list (a label
 * >= 2^31 wrote outside `loom eval`'s confusion matrix, one >= K tripped an assertion). */
static void test_window_labels_checked(void **state) {
    (void)state;
    const uint32_t good[3] = {1, 0, 1}, huge[3] = {1, 0x80000001u, 0}, three[3] = {0, 2, 1};
    labelled_dataset("good", good, "byte");
    labelled_dataset("huge", huge, "byte");
    labelled_dataset("three", three, "byte");
    const char *names[3] = {"good", "huge", "three"};
    const char *want[3] = {NULL, "document 1 has label 2147483649, but ",
                           "document 1 has label 2, but "};
    for (int i = 0; i < 3; i++) {
        char dir[512];
        tu_path(dir, sizeof dir, names[i]);
        loom_dataset *d = NULL;
        loom_windows *w = NULL;
        loom_err err = {{0}};
        if (loom_dataset_open(dir, &d, &err)) fail_msg("%s", err.msg);
        int rc = loom_windows_open(d, 4, 1, 1, 0, 0, &w, &err);
        if (!want[i]) {
            if (rc) fail_msg("%s", err.msg);
        } else {
            assert_int_equal(rc, -1);
            TU_ASSERT_HAS(err.msg, want[i]);
            TU_ASSERT_HAS(err.msg, "dataset.json lists 2 classes (0..1)");
            TU_ASSERT_HAS(err.msg, "shard_00000.bin");
        }
        loom_windows_free(w);
        loom_dataset_close(d);
    }
}

/* Every shard of a dataset carries the same tokenizer_id; the dataset reports it. */
static void test_dataset_tokenizer_id(void **state) {
    (void)state;
    const uint32_t good[3] = {1, 0, 1};
    labelled_dataset("tok", good, "byte");
    char dir[512], p[600], sha[65], line[512];
    tu_path(dir, sizeof dir, "tok");
    loom_dataset *d = NULL;
    loom_err err = {{0}};
    if (loom_dataset_open(dir, &d, &err)) fail_msg("%s", err.msg);
    assert_string_equal(loom_dataset_tokenizer_id(d), "byte");
    loom_dataset_close(d);
    /* a second shard of another tokenizer */
    uint32_t tokens[4] = {1, 2, 3, 4};
    uint64_t starts[1] = {0};
    loom_shard_spec spec = {256, 0, "0123abcd", "r"};
    snprintf(p, sizeof p, "%s/shard_00001.bin", dir);
    if (loom_shard_write_ex(p, &spec, tokens, 4, starts, 1, good, sha, &err)) fail_msg("%s", err.msg);
    snprintf(line, sizeof line,
             "{\"shard\":\"shard_00001.bin\",\"sha256\":\"%s\",\"tokens\":4,\"docs\":1,"
             "\"source\":\"s\"}", sha);
    snprintf(p, sizeof p, "%s/manifest.jsonl", dir);
    if (loom_append_line(p, line, &err)) fail_msg("%s", err.msg);
    assert_int_equal(loom_dataset_open(dir, &d, &err), -1);
    TU_ASSERT_HAS(err.msg, "shard_00001.bin: tokenizer_id 0123abcd differs from the dataset's first shard (byte)");
}

/* ---- recipes ---- */
static int load(const char *text, loom_recipe *r, loom_err *err) {
    char p[512];
    tu_path(p, sizeof p, "r.yaml");
    tu_write_text(p, text);
    return loom_recipe_load(p, r, err);
}

static void test_recipe_parse(void **state) {
    (void)state;
    loom_recipe r;
    loom_err err;
    int rc = load("name: t\n"
                  "sources:\n"
                  "  - name: a\n"
                  "    kind: jsonl\n"
                  "    path: x.jsonl.zst\n"
                  "    weight: 0.5\n"
                  "    repeat_cap: 2\n"
                  "    on_error: skip\n"
                  "    steps: [utf8_repair, {length: {min_bytes: 3, max_bytes: 9}}, dedup_exact,\n"
                  "            dedup_near, {regex: {include: '\\p{L}'}}]\n"
                  "  - {name: b, kind: text, path: d, split: '%'}\n"
                  "tokenizer: {type: bpe, path: tok.json}\n"
                  "dedup_across_sources: true\n"
                  "output: o\n",
                  &r, &err);
    if (rc) fail_msg("%s", err.msg);
    assert_int_equal(r.n_sources, 2);
    loom_recipe_source *a = &r.sources[0];
    assert_int_equal(a->kind, LOOM_SRC_JSONL);
    assert_string_equal(a->text_field, "text");
    assert_true(a->on_error_skip);
    assert_true(a->weight == 0.5 && a->repeat_cap == 2.0);
    assert_int_equal(a->n_steps, 5);
    assert_int_equal(a->steps[1].min_bytes, 3);
    assert_int_equal(a->steps[1].max_bytes, 9);
    assert_int_equal(a->steps[3].num_perm, 128);
    assert_int_equal(a->steps[3].bands, 16);
    assert_int_equal(a->steps[3].shingle, 5);
    assert_non_null(a->steps[4].include_re);
    assert_string_equal(r.sources[1].split, "%");
    assert_true(r.sources[1].weight == 1.0 && r.sources[1].repeat_cap == 0.0);
    assert_string_equal(r.tokenizer, "bpe");
    assert_string_equal(r.tokenizer_path, "tok.json");
    assert_true(r.dedup_across_sources);
    /* the canonical section ignores comments and layout */
    char *c1 = loom_strdup(r.sources[1].canon);
    loom_recipe_free(&r);
    rc = load("name: t\nsources:\n  - name: b   # a comment\n    kind: text\n    path: d\n"
              "    split: \"%\"\ntokenizer: byte\noutput: o\n", &r, &err);
    if (rc) fail_msg("%s", err.msg);
    assert_string_equal(r.sources[0].canon, c1);
    free(c1);
    loom_recipe_free(&r);
}

static void test_recipe_errors(void **state) {
    (void)state;
    struct { const char *yaml; const char *want; } cases[] = {
        {"name: t\nsources:\n  - {name: a, kind: text, path: x, steps: [{length: {min: 1}}]}\ntokenizer: byte\noutput: o\n",
         "r.yaml:3: unknown key 'min' in step 'length'"},
        {"name: t\nsources:\n  - name: a\n    kind: text\n    path: x\n    steps:\n      - length: {min_bytes: 9, max_bytes: 3}\ntokenizer: byte\noutput: o\n",
         "r.yaml:7: source 'a': length: min_bytes 9 > max_bytes 3"},
        {"name: t\nsources:\n  - {name: a, kind: binary, path: x, steps: [utf8_repair]}\ntokenizer: byte\noutput: o\n",
         "source 'a': step 'utf8_repair' does not apply to binary files"},
        {"name: t\nsources:\n  - {name: a, kind: text, path: x, steps: [{dedup_near: {threshold: 1.5}}]}\ntokenizer: byte\noutput: o\n",
         "'threshold' must be in (0, 1], got 1.5"},
        {"name: t\nsources:\n  - {name: a, kind: jsonl, path: x, on_error: ignore}\ntokenizer: byte\noutput: o\n",
         "r.yaml:3: 'on_error' must be skip or fail, got 'ignore'"},
        {"name: t\nsources:\n  - {name: a, kind: binary, path: x, label_key: name, labels: l}\ntokenizer: byte\noutput: o\n",
         "'label_key' must be path or sha256, got 'name'"},
        {"name: t\nsources:\n  - {name: a, kind: binary, path: x}\ntokenizer: {type: bpe, path: t.json}\noutput: o\n",
         "source 'a': binary sources need 'tokenizer: byte'"},
        {"name: t\nsources:\n  - {name: a, kind: text, path: x, repeat_cap: -2}\ntokenizer: byte\noutput: o\n",
         "'repeat_cap' must be >= 0 (0 = no cap), got -2"},
        {"name: t\nsources:\n  - {name: a, kind: csv, path: x}\ntokenizer: byte\noutput: o\n",
         "r.yaml:3: source 'a': unsupported kind 'csv' (supported: text, jsonl, chat, preference, binary)"},
        /* chat sources: their keys only on them, no utf8_repair (it would move the mask) */
        {"name: t\nsources:\n  - {name: a, kind: text, path: x, template: chatml}\ntokenizer: byte\noutput: o\n",
         "source 'a': 'template' does not apply to kind 'text'"},
        {"name: t\nsources:\n  - {name: a, kind: chat, path: x, too_long: drop}\ntokenizer: byte\noutput: o\n",
         "source 'a': 'too_long' does not apply to kind 'chat'"},
        {"name: t\nsources:\n  - {name: a, kind: chat, path: x, pack: false, too_long: cut}\ntokenizer: byte\noutput: o\n",
         "'too_long' must be split or drop, got 'cut'"},
        {"name: t\nsources:\n  - {name: a, kind: chat, path: x, steps: [utf8_repair]}\ntokenizer: byte\noutput: o\n",
         "step 'utf8_repair' does not apply to chat sources"},
        {"name: t\nsources:\n  - {name: a, kind: text, path: x}\ntokenizer: {type: byte, vocab: 3}\noutput: o\n",
         "r.yaml:4: unknown key 'vocab' in 'tokenizer'"},
        {"name: t\nsources:\n  - {name: a, kind: text, path: x}\ntokenizer: byte\ndedup_across_sources: maybe\noutput: o\n",
         "r.yaml:5: 'dedup_across_sources' must be true or false, got 'maybe'"},
        /* one dialect (base/yaml.h): yes is a string, a quoted number is a string */
        {"name: t\nsources:\n  - {name: a, kind: text, path: x}\ntokenizer: byte\ndedup_across_sources: yes\noutput: o\n",
         "r.yaml:5: 'dedup_across_sources' must be true or false, got 'yes'"},
        {"name: t\nsources:\n  - {name: a, kind: text, path: x}\ntokenizer: byte\nseq_len: '64'\noutput: o\n",
         "r.yaml:5: 'seq_len' must be an integer, got '64' (quoted, so a string)"},
        {"name: t\nsources:\n  - {name: a, kind: text, path: x}\n  - {name: a, kind: text, path: y, name: b}\ntokenizer: byte\noutput: o\n",
         "r.yaml:4:36: duplicate key 'sources[1].name' (first at line 4)"},
        /* anchors and aliases are refused (a self-referencing one would never finish) */
        {"name: t\nsources: &a [*a, *a]\ntokenizer: byte\noutput: o\n",
         "r.yaml:2:10: YAML anchors and aliases are not supported"},
        {"name: &n t\nsources:\n  - {name: *n, kind: text, path: x}\ntokenizer: byte\noutput: o\n",
         "r.yaml:1:7: YAML anchors and aliases are not supported"},
        /* a reader error names the line and column of the bad byte */
        {"name: t\nsources:\n  - {name: a, kind: text, path: x}\ntokenizer: byte\noutput: o\xff\n",
         "r.yaml:5:10: malformed YAML: invalid leading UTF-8 octet (byte 0xff"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        loom_recipe r;
        loom_err err = {{0}};
        int rc = load(cases[i].yaml, &r, &err);
        loom_recipe_free(&r);
        if (rc != -1) fail_msg("case %zu: accepted", i);
        if (!strstr(err.msg, cases[i].want)) fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_repair),  cmocka_unit_test(test_near_dedup),
        cmocka_unit_test(test_near_dedup_synth_agrees),
        cmocka_unit_test(test_exact_dedup),  cmocka_unit_test(test_csv),
        cmocka_unit_test(test_labels),       cmocka_unit_test(test_shard_labels),
        cmocka_unit_test(test_recipe_parse), cmocka_unit_test(test_recipe_errors),
        cmocka_unit_test(test_window_labels_checked), cmocka_unit_test(test_dataset_tokenizer_id),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
