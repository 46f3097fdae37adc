/* Config tree: YAML loading, --set, schema defaults and unknown keys, strict getters,
 * write -> reload round trips. */
#include "testutil.h"

#include <math.h>

#include "base/json_util.h"
#include "base/yaml.h"
#include "data/recipe.h"
#include "loom/config.h"
#include "loom/comm.h"
#include "loom/model_config.h"
#include "loom/train.h"

/* Writes text to tu_dir/name and returns the path (static buffer, one at a time). */
static const char *write_tmp(const char *name, const char *text) {
    static char path[512];
    tu_write_text(tu_path(path, sizeof path, name), text);
    return path;
}

static void test_nested_load(void **state) {
    (void)state;
    const char *path = write_tmp("nested.yaml", "# a comment\n"
                                                "model:\n"
                                                "  flavor: llama\n"
                                                "  n_layer: 4\n"
                                                "  moe:\n"
                                                "    experts: 8\n"
                                                "training:\n"
                                                "  steps: 100\n"
                                                "  lr: 3e-4\n"
                                                "  name: \"quoted: text\"\n"
                                                "  tags: [a, b, 'c d']\n"
                                                "  block_list:\n"
                                                "    - x\n"
                                                "    - 2\n"
                                                "flat.key: 7\n");
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    int rc = loom_config_load_yaml(c, path, &err);
    if (rc) fail_msg("%s", err.msg);
    assert_int_equal(loom_config_count(c), 9);
    assert_string_equal(loom_config_get(c, "model.flavor"), "llama");
    assert_string_equal(loom_config_get(c, "model.n_layer"), "4");
    assert_string_equal(loom_config_get(c, "model.moe.experts"), "8");
    assert_string_equal(loom_config_get(c, "training.steps"), "100");
    assert_string_equal(loom_config_get(c, "training.name"), "quoted: text");
    assert_string_equal(loom_config_get(c, "training.tags"), "[a, b, \"c d\"]");
    assert_string_equal(loom_config_get(c, "training.block_list"), "[x, 2]");
    assert_string_equal(loom_config_get(c, "flat.key"), "7");
    assert_null(loom_config_get(c, "model"));
    assert_null(loom_config_get(c, "nope"));

    char want[600];
    snprintf(want, sizeof want, "%s:8", path);
    assert_string_equal(loom_config_origin(c, "training.steps"), want);

    /* sorted iteration, sections contiguous */
    assert_string_equal(loom_config_key_at(c, 0), "flat.key");
    assert_string_equal(loom_config_key_at(c, 1), "model.flavor");
    assert_string_equal(loom_config_key_at(c, 2), "model.moe.experts");
    assert_string_equal(loom_config_value_at(c, 2), "8");
    for (int i = 1; i < loom_config_count(c); i++)
        assert_true(strcmp(loom_config_key_at(c, i - 1), loom_config_key_at(c, i)) < 0);

    double lr = 0;
    assert_int_equal(loom_config_get_double(c, "training.lr", &lr, &err), 0);
    assert_true(lr == 3e-4);
    int64_t steps = 0;
    assert_int_equal(loom_config_get_int(c, "training.steps", &steps, &err), 0);
    assert_int_equal(steps, 100);
    loom_config_free(c);
}

static void test_later_load_overrides(void **state) {
    (void)state;
    loom_config *c = loom_config_new();
    loom_err err;
    assert_int_equal(loom_config_load_string(c, "a:\n  x: 1\n  y: 2\n", "base", &err), 0);
    assert_int_equal(loom_config_load_string(c, "a:\n  y: 3\n", "over", &err), 0);
    assert_string_equal(loom_config_get(c, "a.x"), "1");
    assert_string_equal(loom_config_get(c, "a.y"), "3");
    assert_string_equal(loom_config_origin(c, "a.y"), "over:2");
    /* a failed load leaves the tree untouched */
    assert_int_equal(loom_config_load_string(c, "a:\n  y: 9\n  z: [\n", "bad", &err), -1);
    assert_string_equal(loom_config_get(c, "a.y"), "3");
    assert_null(loom_config_get(c, "a.z"));
    /* empty documents are fine */
    assert_int_equal(loom_config_load_string(c, "", "empty", &err), 0);
    assert_int_equal(loom_config_load_string(c, "# only a comment\n", "c", &err), 0);
    assert_int_equal(loom_config_load_string(c, "---\n", "d", &err), 0);
    assert_int_equal(loom_config_count(c), 2);
    loom_config_free(c);
}

static void test_set_arg(void **state) {
    (void)state;
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    assert_int_equal(loom_config_load_string(c, "training:\n  steps: 100\n", "x.yaml", &err), 0);
    assert_int_equal(loom_config_set_arg(c, "training.steps=2000", &err), 0);
    assert_string_equal(loom_config_get(c, "training.steps"), "2000");
    assert_string_equal(loom_config_origin(c, "training.steps"), "--set");
    assert_int_equal(loom_config_set_arg(c, "data.path='a b: c'", &err), 0);
    assert_string_equal(loom_config_get(c, "data.path"), "a b: c");
    assert_int_equal(loom_config_set_arg(c, "data.url=http://h:80/x=y", &err), 0);
    assert_string_equal(loom_config_get(c, "data.url"), "http://h:80/x=y");
    assert_int_equal(loom_config_set_arg(c, "model.dims=[1,2, 3]", &err), 0);
    assert_string_equal(loom_config_get(c, "model.dims"), "[1, 2, 3]");
    assert_int_equal(loom_config_set_arg(c, "model.empty=", &err), 0);
    assert_string_equal(loom_config_get(c, "model.empty"), "");

    memset(&err, 0, sizeof err);
    assert_int_equal(loom_config_set_arg(c, "training.steps", &err), -1);
    TU_ASSERT_HAS(err.msg, "'training.steps'");
    assert_int_equal(loom_config_set_arg(c, "=5", &err), -1);
    TU_ASSERT_HAS(err.msg, "'=5'");
    assert_int_equal(loom_config_set_arg(c, "a..b=5", &err), -1);
    TU_ASSERT_HAS(err.msg, "'a..b=5'");
    assert_int_equal(loom_config_set_arg(c, "a.b=[1, 2", &err), -1);
    TU_ASSERT_HAS(err.msg, "a.b=[1, 2");
    assert_int_equal(loom_config_set_arg(c, "a.b=x: y", &err), -1);
    TU_ASSERT_HAS(err.msg, "mapping");
    assert_null(loom_config_get(c, "a.b"));
    loom_config_free(c);
}

static const loom_config_key schema[] = {
    {"training.steps", "1000", "optimizer steps"},
    {"training.lr", "3e-4", "peak learning rate"},
    {"training.resume", NULL, "checkpoint to resume from"},
    {"model.flavor", "gpt2", "gpt2 or llama"},
    {"data.manifest", NULL, NULL},
};

static void test_schema_defaults(void **state) {
    (void)state;
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    assert_int_equal(loom_config_load_string(c, "training:\n  steps: 5\n", "x.yaml", &err), 0);
    int rc = loom_config_apply_schema(c, schema, 5, &err);
    if (rc) fail_msg("%s", err.msg);
    assert_string_equal(loom_config_get(c, "training.steps"), "5");
    assert_string_equal(loom_config_origin(c, "training.steps"), "x.yaml:2");
    assert_string_equal(loom_config_get(c, "training.lr"), "3e-4");
    assert_string_equal(loom_config_origin(c, "training.lr"), "default");
    assert_string_equal(loom_config_get(c, "model.flavor"), "gpt2");
    assert_null(loom_config_get(c, "training.resume"));
    assert_int_equal(loom_config_count(c), 3);
    const char *s = NULL;
    assert_int_equal(loom_config_get_str(c, "training.resume", &s, &err), -1);
    TU_ASSERT_HAS(err.msg, "training.resume");
    /* the schema's help is written as a comment */
    char *yaml = loom_config_to_yaml(c);
    TU_ASSERT_HAS(yaml, "# peak learning rate\n");
    free(yaml);
    loom_config_free(c);
}

static void test_unknown_key(void **state) {
    (void)state;
    const char *path = write_tmp("x.yaml", "training:\n  steps: 5\nmodel:\n  flavr: llama\n");
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    assert_int_equal(loom_config_load_yaml(c, path, &err), 0);
    assert_int_equal(loom_config_apply_schema(c, schema, 5, &err), -1);
    char want[600];
    snprintf(want, sizeof want,
             "unknown config key 'model.flavr' (set at %s:4); did you mean 'model.flavor'?", path);
    assert_string_equal(err.msg, want);
    /* nothing applied on failure */
    assert_null(loom_config_get(c, "training.lr"));
    loom_config_free(c);

    c = loom_config_new();
    assert_int_equal(loom_config_set_arg(c, "trainig.steps=3", &err), 0);
    assert_int_equal(loom_config_apply_schema(c, schema, 5, &err), -1);
    TU_ASSERT_HAS(err.msg, "'trainig.steps'");
    TU_ASSERT_HAS(err.msg, "--set");
    TU_ASSERT_HAS(err.msg, "did you mean 'training.steps'?");
    loom_config_free(c);

    /* nothing close: no hint */
    c = loom_config_new();
    loom_config_set(c, "completely.different", "1", "test");
    assert_int_equal(loom_config_apply_schema(c, schema, 5, &err), -1);
    assert_string_equal(err.msg, "unknown config key 'completely.different' (set at test)");
    loom_config_free(c);
}

static void test_malformed_yaml(void **state) {
    (void)state;
    const char *path = write_tmp("bad.yaml", "a:\n  b: 1\n  c: [1, 2\nd: 3\n");
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    assert_int_equal(loom_config_load_yaml(c, path, &err), -1);
    char want[600];
    snprintf(want, sizeof want, "%s:4:", path);
    TU_ASSERT_HAS(err.msg, want);

    path = write_tmp("bad2.yaml", "a: 1\n b: 2\n");
    assert_int_equal(loom_config_load_yaml(c, path, &err), -1);
    snprintf(want, sizeof want, "%s:2:", path);
    TU_ASSERT_HAS(err.msg, want);

    path = write_tmp("tab.yaml", "a:\n\tb: 1\n");
    assert_int_equal(loom_config_load_yaml(c, path, &err), -1);
    snprintf(want, sizeof want, "%s:2:", path);
    TU_ASSERT_HAS(err.msg, want);

    /* top level not a mapping */
    assert_int_equal(loom_config_load_string(c, "- a\n- b\n", "list.yaml", &err), -1);
    TU_ASSERT_HAS(err.msg, "list.yaml:1: the top level");
    assert_int_equal(loom_config_load_string(c, "just text\n", "s.yaml", &err), -1);
    TU_ASSERT_HAS(err.msg, "s.yaml:1: the top level");

    /* anchors and aliases */
    assert_int_equal(loom_config_load_string(c, "a: &x 1\nb: *x\n", "anc.yaml", &err), -1);
    TU_ASSERT_HAS(err.msg, "anc.yaml:1:4: YAML anchors and aliases are not supported");
    assert_int_equal(loom_config_load_string(c, "a: 1\nb: *x\n", "al.yaml", &err), -1);
    TU_ASSERT_HAS(err.msg, "al.yaml:");

    /* a reader (encoding) error names its real line and column: a byte that is not UTF-8
     * on line 18, after "  name: ab" and before "cd" */
    {
        char text[512] = "";
        for (int i = 1; i < 17; i++) {
            char line[32];
            snprintf(line, sizeof line, "k%d: %d\n", i, i);
            strcat(text, line);
        }
        strcat(text, "s:\n  name: ab\xff" "cd\n");
        path = write_tmp("utf8.yaml", text);
        assert_int_equal(loom_config_load_yaml(c, path, &err), -1);
        snprintf(want, sizeof want, "%s:18:11: malformed YAML: invalid leading UTF-8 octet (byte 0xff",
                 path);
        TU_ASSERT_HAS(err.msg, want);
        /* a multi-byte character before the bad byte counts as one column */
        assert_int_equal(loom_config_load_string(c, "a: 1\nb: \xc3\xa9\xfe\n", "u.yaml", &err),
                         -1);
        TU_ASSERT_HAS(err.msg, "u.yaml:2:5: ");
    }

    /* empty key, two documents, mapping in a list */
    assert_int_equal(loom_config_load_string(c, "a:\n  \"\": 1\n", "e.yaml", &err), -1);
    TU_ASSERT_HAS(err.msg, "e.yaml:2: invalid key");
    assert_int_equal(loom_config_load_string(c, "a: 1\n---\nb: 2\n", "m.yaml", &err), -1);
    TU_ASSERT_HAS(err.msg, "m.yaml:2:1: more than one YAML document");
    assert_int_equal(loom_config_load_string(c, "a:\n  - x: 1\n", "l.yaml", &err), -1);
    TU_ASSERT_HAS(err.msg, "l.yaml:2:");

    /* missing file */
    char missing[600];
    tu_path(missing, sizeof missing, "does-not-exist.yaml");
    assert_int_equal(loom_config_load_yaml(c, missing, &err), -1);
    TU_ASSERT_HAS(err.msg, missing);
    assert_int_equal(loom_config_count(c), 0);
    loom_config_free(c);
}

static void test_duplicate_key(void **state) {
    (void)state;
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    assert_int_equal(loom_config_load_string(c, "training:\n  steps: 1\n  lr: 2\n  steps: 3\n",
                                             "configs/x.yaml", &err),
                     -1);
    assert_string_equal(err.msg, "configs/x.yaml:4:3: duplicate key 'training.steps' (first at line 2)");
    /* the same key spelled flat and nested */
    assert_int_equal(loom_config_load_string(c, "training.steps: 1\ntraining:\n  steps: 2\n",
                                             "y.yaml", &err),
                     -1);
    assert_string_equal(err.msg, "y.yaml:3: duplicate key 'training.steps' (first at line 1)");
    /* a section given twice */
    assert_int_equal(loom_config_load_string(c, "a:\n  x: 1\nb: 2\na:\n  y: 1\n", "z.yaml", &err),
                     -1);
    assert_string_equal(err.msg, "z.yaml:4:1: duplicate key 'a' (first at line 1)");
    assert_int_equal(loom_config_count(c), 0);
    loom_config_free(c);
}

static void test_strict_getters(void **state) {
    (void)state;
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    const char *yaml = "training:\n"
                       "  steps: 12x\n"
                       "  empty: ''\n"
                       "  space: ' 3'\n"
                       "  big: 99999999999999999999\n"
                       "  neg: -42\n"
                       "  lr: 3e-4\n"
                       "  one: 1.0\n"
                       "  nan: nan\n"
                       "  inf: -inf\n"
                       "  huge: 1e999\n"
                       "  b1: YES\n"
                       "  b2: off\n"
                       "  b3: 0\n"
                       "  b4: maybe\n"
                       "  trail: '7 '\n";
    assert_int_equal(loom_config_load_string(c, yaml, "configs/x.yaml", &err), 0);
    int64_t i = 0;
    assert_int_equal(loom_config_get_int(c, "training.steps", &i, &err), -1);
    assert_string_equal(err.msg,
                        "config key 'training.steps' = '12x' (configs/x.yaml:2) is not an integer");
    assert_int_equal(loom_config_get_int(c, "training.empty", &i, &err), -1);
    TU_ASSERT_HAS(err.msg, "is not an integer");
    assert_int_equal(loom_config_get_int(c, "training.space", &i, &err), -1);
    TU_ASSERT_HAS(err.msg, "' 3'");
    assert_int_equal(loom_config_get_int(c, "training.trail", &i, &err), -1);
    assert_int_equal(loom_config_get_int(c, "training.big", &i, &err), -1);
    TU_ASSERT_HAS(err.msg, "configs/x.yaml:5");
    assert_int_equal(loom_config_get_int(c, "training.lr", &i, &err), -1);
    assert_int_equal(loom_config_get_int(c, "training.neg", &i, &err), 0);
    assert_int_equal(i, -42);
    assert_int_equal(loom_config_get_int(c, "training.absent", &i, &err), -1);
    TU_ASSERT_HAS(err.msg, "'training.absent' is not set");

    double d = 0;
    assert_int_equal(loom_config_get_double(c, "training.lr", &d, &err), 0);
    assert_true(d == 3e-4);
    assert_int_equal(loom_config_get_double(c, "training.one", &d, &err), 0);
    assert_true(d == 1.0);
    assert_int_equal(loom_config_get_double(c, "training.neg", &d, &err), 0);
    assert_true(d == -42.0);
    assert_int_equal(loom_config_get_double(c, "training.nan", &d, &err), -1);
    TU_ASSERT_HAS(err.msg, "'training.nan' = 'nan'");
    assert_int_equal(loom_config_get_double(c, "training.inf", &d, &err), -1);
    assert_int_equal(loom_config_get_double(c, "training.huge", &d, &err), -1);
    assert_int_equal(loom_config_get_double(c, "training.steps", &d, &err), -1);
    assert_int_equal(loom_config_get_double(c, "training.empty", &d, &err), -1);
    assert_int_equal(loom_config_get_double(c, "training.space", &d, &err), -1);

    /* booleans are true/false (YAML 1.2's core schema, as recipes and pipelines read them):
     * YES, off and 0 are not */
    int b = -1;
    assert_int_equal(loom_config_get_bool(c, "training.b1", &b, &err), -1);
    TU_ASSERT_HAS(err.msg, "'training.b1' = 'YES' (configs/x.yaml:12) is not a boolean (true or false)");
    assert_int_equal(loom_config_get_bool(c, "training.b2", &b, &err), -1);
    assert_int_equal(loom_config_get_bool(c, "training.b3", &b, &err), -1);
    assert_int_equal(loom_config_get_bool(c, "training.b4", &b, &err), -1);
    TU_ASSERT_HAS(err.msg, "'training.b4' = 'maybe' (configs/x.yaml:15) is not a boolean");
    assert_int_equal(b, -1);
    assert_int_equal(loom_config_get_bool(c, "training.empty", &b, &err), -1);
    loom_config_free(c);
}

/* Loads `yaml` text written by to_yaml and checks it gives the same key -> value table. */
static void assert_same_tree(const loom_config *a, const loom_config *b) {
    assert_int_equal(loom_config_count(a), loom_config_count(b));
    for (int i = 0; i < loom_config_count(a); i++) {
        assert_string_equal(loom_config_key_at(a, i), loom_config_key_at(b, i));
        assert_string_equal(loom_config_value_at(a, i), loom_config_value_at(b, i));
    }
}

static void test_round_trip(void **state) {
    (void)state;
    static const char *const tricky[][2] = {
        {"s.empty", ""},
        {"s.yes", "yes"},
        {"s.num", "1e5"},
        {"s.colon", "a: b"},
        {"s.hash", "x # not a comment"},
        {"s.lead", "  leading"},
        {"s.trail", "trailing  "},
        {"s.quote", "say \"hi\" \\ back"},
        {"s.newline", "line1\nline2"},
        {"s.tab", "a\tb"},
        {"s.star", "*alias"},
        {"s.amp", "&anchor"},
        {"s.dash", "-"},
        {"s.dashspace", "- item"},
        {"s.neg", "-3"},
        {"s.brace", "{a: 1}"},
        {"s.bracket_text", "[not, closed"},
        {"s.list", "[1, 2, \"a b\"]"},
        {"s.list_spacing", "[1,2]"},
        {"s.tilde", "~"},
        {"s.null", "null"},
        {"s.pct", "%YAML"},
        {"s.at", "@x"},
        {"s.bang", "!tag"},
        {"s.pipe", "| block"},
        {"s.gt", "> folded"},
        {"s.question", "? key"},
        {"s.utf8", "caf\xc3\xa9 \xe2\x86\x92"},
        {"s.ctrl", "bell\x07"},
        {"s.docstart", "---"},
        {"weird key.with space", "v"},
        {"k.x:y", "colon key"},
        {"k.---", "dashes key"},
        {"deep.a.b.c.d", "5"},
        {"top", "1"},
    };
    loom_config *c = loom_config_new();
    for (size_t i = 0; i < sizeof tricky / sizeof tricky[0]; i++)
        loom_config_set(c, tricky[i][0], tricky[i][1], "test");
    loom_err err = {{0}};
    char path[512];
    tu_path(path, sizeof path, "resolved.yaml");
    assert_int_equal(loom_config_write_yaml(c, path, &err), 0);

    loom_config *back = loom_config_new();
    int rc = loom_config_load_yaml(back, path, &err);
    if (rc) {
        char *y = loom_config_to_yaml(c);
        fail_msg("%s\n%s", err.msg, y);
    }
    assert_same_tree(c, back);

    /* the writer nests sections and writes a list bare when it reads back the same */
    char *text = loom_config_to_yaml(c);
    TU_ASSERT_HAS(text, "\ndeep:\n  a:\n    b:\n      c:\n        d: 5\n");
    TU_ASSERT_HAS(text, "  list: [1, 2, \"a b\"]\n");
    TU_ASSERT_HAS(text, "  list_spacing: \"[1,2]\"\n");
    TU_ASSERT_HAS(text, "  yes: yes\n");
    TU_ASSERT_HAS(text, "  empty: \"\"\n");
    free(text);

    /* writing the reloaded tree gives the same bytes */
    char *t1 = loom_config_to_yaml(c), *t2 = loom_config_to_yaml(back);
    assert_string_equal(t1, t2);
    free(t1);
    free(t2);
    loom_config_free(back);
    loom_config_free(c);
}

static void test_leaf_and_section(void **state) {
    (void)state;
    /* "a.b" and "a.b.c" both present: a.b stays a leaf, a.b.c is written as the dotted key
     * "b.c" inside section a, which reads back as the same flat key */
    loom_config *c = loom_config_new();
    loom_config_set(c, "a.b", "1", "t");
    loom_config_set(c, "a.b.c", "2", "t");
    loom_config_set(c, "a.b.d.e", "3", "t");
    loom_config_set(c, "a.bz", "4", "t");
    loom_config_set(c, "a", "0", "t");
    loom_config_set(c, "x.y", "5", "t");
    char *text = loom_config_to_yaml(c);
    assert_string_equal(text, "# resolved loom config\n"
                              "a: 0\n"
                              "a.b: 1\n"
                              "a.b.c: 2\n"
                              "a.b.d.e: 3\n"
                              "a.bz: 4\n"
                              "x:\n"
                              "  y: 5\n");
    free(text);
    loom_config_free(c);

    c = loom_config_new();
    loom_config_set(c, "a.b", "1", "t");
    loom_config_set(c, "a.b.c", "2", "t");
    loom_config_set(c, "a.d", "3", "t");
    text = loom_config_to_yaml(c);
    assert_string_equal(text, "# resolved loom config\n"
                              "a:\n"
                              "  b: 1\n"
                              "  b.c: 2\n"
                              "  d: 3\n");
    loom_config *back = loom_config_new();
    loom_err err = {{0}};
    int rc = loom_config_load_string(back, text, "written", &err);
    if (rc) fail_msg("%s", err.msg);
    assert_same_tree(c, back);
    free(text);
    loom_config_free(back);
    loom_config_free(c);
}

/* One dialect: a run config (file and --set), a data recipe and a synth pipeline type the
 * same scalars the same way (base/yaml.h's loom_yaml_scalar_type; docs/config.md). For each
 * scalar: the config's typed getters, a recipe's integer, number and boolean keys, and the
 * pipeline's JSON value agree with the expected type. */
static void test_one_dialect(void **state) {
    (void)state;
    static const struct {
        const char *text;
        loom_yaml_type type;
        double value; /* INT, FLOAT, BOOL */
    } cases[] = {
        {"10", LOOM_YAML_INT, 10},        {"+10", LOOM_YAML_INT, 10},
        {"007", LOOM_YAML_INT, 7},        {"0x10", LOOM_YAML_STR, 0},
        {"1e3", LOOM_YAML_FLOAT, 1000},   {"2.5", LOOM_YAML_FLOAT, 2.5},
        {".5", LOOM_YAML_FLOAT, 0.5},     {"'10'", LOOM_YAML_STR, 0},
        {"\"true\"", LOOM_YAML_STR, 0},   {".inf", LOOM_YAML_FLOAT, INFINITY},
        {"1e999", LOOM_YAML_FLOAT, INFINITY}, {"yes", LOOM_YAML_STR, 0},
        {"on", LOOM_YAML_STR, 0},         {"True", LOOM_YAML_BOOL, 1},
        {"FALSE", LOOM_YAML_BOOL, 0},     {"true", LOOM_YAML_BOOL, 1},
        {"~", LOOM_YAML_NULL, 0},         {"null", LOOM_YAML_NULL, 0},
        {"", LOOM_YAML_NULL, 0},          {"nan", LOOM_YAML_STR, 0},
        {"1_000", LOOM_YAML_STR, 0},      {"99999999999999999999", LOOM_YAML_FLOAT, 1e20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *t = cases[i].text;
        const loom_yaml_type ty = cases[i].type;
        const double want = cases[i].value;
        const int finite = isfinite(want);
        char text[256], set[128];
        loom_err err = {{0}};
        /* the config, from a file and from --set */
        snprintf(text, sizeof text, "k: %s\n", t);
        snprintf(set, sizeof set, "k=%s", t);
        for (int from_set = 0; from_set < 2; from_set++) {
            loom_config *c = loom_config_new();
            int rc = from_set ? loom_config_set_arg(c, set, &err)
                              : loom_config_load_string(c, text, "c.yaml", &err);
            if (rc) fail_msg("case '%s': %s", t, err.msg);
            int64_t iv = 0;
            double dv = 0;
            int bv = -1;
            int ok_i = loom_config_get_int(c, "k", &iv, &err) == 0;
            int ok_d = loom_config_get_double(c, "k", &dv, &err) == 0;
            int ok_b = loom_config_get_bool(c, "k", &bv, &err) == 0;
            if (ok_i != (ty == LOOM_YAML_INT) || (ok_i && iv != (int64_t)want))
                fail_msg("config '%s' (set %d): get_int %d %lld", t, from_set, ok_i, (long long)iv);
            if (ok_d != ((ty == LOOM_YAML_INT || ty == LOOM_YAML_FLOAT) && finite) ||
                (ok_d && dv != want))
                fail_msg("config '%s' (set %d): get_double %d %g", t, from_set, ok_d, dv);
            if (ok_b != (ty == LOOM_YAML_BOOL) || (ok_b && bv != (int)want))
                fail_msg("config '%s' (set %d): get_bool %d %d", t, from_set, ok_b, bv);
            loom_config_free(c);
        }
        /* a recipe: seq_len (an integer), weight (a number), dedup_across_sources (a boolean) */
        static const char *const keys[3] = {"seq_len", "weight", "dedup_across_sources"};
        for (int k = 0; k < 3; k++) {
            char path[512];
            tu_path(path, sizeof path, "dialect.yaml");
            snprintf(text, sizeof text,
                     "name: t\nsources:\n  - {name: a, kind: text, path: x%s%s}\ntokenizer: byte\n"
                     "output: o\n%s%s%s\n",
                     k == 1 ? ", weight: " : "", k == 1 ? t : "", k == 1 ? "" : keys[k],
                     k == 1 ? "" : ": ", k == 1 ? "" : t);
            tu_write_text(path, text);
            loom_recipe r;
            const int ok = loom_recipe_load(path, &r, &err) == 0;
            const int want_ok = k == 0   ? ty == LOOM_YAML_INT
                                : k == 1 ? (ty == LOOM_YAML_INT || ty == LOOM_YAML_FLOAT) && finite
                                         : ty == LOOM_YAML_BOOL;
            if (ok != want_ok) fail_msg("recipe %s: '%s': %s", keys[k], t, ok ? "accepted" : err.msg);
            if (ok && k == 0) assert_true(r.seq_len == (int64_t)want);
            if (ok && k == 1) assert_true(r.sources[0].weight == want);
            if (ok && k == 2) assert_int_equal(r.dedup_across_sources, (int)want);
            loom_recipe_free(&r);
        }
        /* a synth pipeline (YAML -> JSON) */
        {
            char path[512];
            tu_path(path, sizeof path, "pipe.yaml");
            snprintf(text, sizeof text, "k: %s\n", t);
            tu_write_text(path, text);
            json_t *o = NULL;
            const int ok = loom_yaml_json_file(path, 1 << 20, &o, &err) == 0;
            if (ok != (ty != LOOM_YAML_FLOAT || finite))
                fail_msg("pipeline '%s': %s", t, ok ? "accepted" : err.msg);
            if (!ok) {
                TU_ASSERT_HAS(err.msg, "pipe.yaml:1: ");
                TU_ASSERT_HAS(err.msg, "is not a finite number");
                continue;
            }
            json_t *v = json_object_get(o, "k");
            switch (ty) {
            case LOOM_YAML_NULL: assert_true(json_is_null(v)); break;
            case LOOM_YAML_BOOL: assert_true(json_is_boolean(v) && json_is_true(v) == (int)want); break;
            case LOOM_YAML_INT: assert_true(json_is_integer(v) && json_integer_value(v) == (json_int_t)want); break;
            case LOOM_YAML_FLOAT: assert_true(json_is_real(v) && json_real_value(v) == want); break;
            case LOOM_YAML_STR: assert_true(json_is_string(v)); break;
            }
            json_decref(o);
        }
    }
    /* the same refusals: a tag, a second document, a key twice */
    static const char *const refused[][2] = {
        {"k: !!str 10\n", ":1:4: YAML tags"},
        {"k: 1\n---\nj: 2\n", ":2:1: more than one YAML document"},
        {"k: 1\nk: 2\n", ":2:1: duplicate key 'k' (first at line 1)"},
        {"k: &a 1\n", ":1:4: YAML anchors and aliases are not supported"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        loom_err err = {{0}};
        loom_config *c = loom_config_new();
        assert_int_equal(loom_config_load_string(c, refused[i][0], "c.yaml", &err), -1);
        TU_ASSERT_HAS(err.msg, refused[i][1]);
        loom_config_free(c);
        char path[512], text[256];
        tu_path(path, sizeof path, "pipe.yaml");
        tu_write_text(path, refused[i][0]);
        json_t *o = NULL;
        assert_int_equal(loom_yaml_json_file(path, 1 << 20, &o, &err), -1);
        TU_ASSERT_HAS(err.msg, refused[i][1]);
        snprintf(text, sizeof text, "%sname: t\nsources: [{name: a, kind: text, path: x}]\n"
                                    "tokenizer: byte\noutput: o\n", refused[i][0]);
        tu_path(path, sizeof path, "dialect.yaml");
        tu_write_text(path, text);
        loom_recipe r;
        assert_int_equal(loom_recipe_load(path, &r, &err), -1);
        TU_ASSERT_HAS(err.msg, refused[i][1]);
        loom_recipe_free(&r);
    }
}

static void test_get_list(void **state) {
    (void)state;
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    const char *yaml = "m:\n"
                       "  dims: [1, 'a b', [2, 3], \"x,y\"]\n"
                       "  block:\n"
                       "    - p\n"
                       "    - q\n"
                       "  none: []\n"
                       "  scalar: 5\n";
    assert_int_equal(loom_config_load_string(c, yaml, "l.yaml", &err), 0);
    char **items = NULL;
    int n = -1;
    assert_int_equal(loom_config_get_list(c, "m.dims", &items, &n, &err), 0);
    assert_int_equal(n, 4);
    assert_string_equal(items[0], "1");
    assert_string_equal(items[1], "a b");
    assert_string_equal(items[2], "[2, 3]");
    assert_string_equal(items[3], "x,y");
    loom_config_free_list(items, n);
    assert_int_equal(loom_config_get_list(c, "m.block", &items, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(items[1], "q");
    loom_config_free_list(items, n);
    assert_int_equal(loom_config_get_list(c, "m.none", &items, &n, &err), 0);
    assert_int_equal(n, 0);
    loom_config_free_list(items, n);
    assert_int_equal(loom_config_get_list(c, "m.scalar", &items, &n, &err), -1);
    assert_string_equal(err.msg, "config key 'm.scalar' = '5' (l.yaml:7) is not a list ([a, b, ...])");
    loom_config_set(c, "m.broken", "[1, 2", "t");
    assert_int_equal(loom_config_get_list(c, "m.broken", &items, &n, &err), -1);
    TU_ASSERT_HAS(err.msg, "'m.broken'");
    loom_config_set(c, "m.trailing", "[1] x", "t");
    assert_int_equal(loom_config_get_list(c, "m.trailing", &items, &n, &err), -1);
    loom_config_free(c);
}

/* A schema is joined from tables of any size: 3 tables of 50 keys make one of 150 (more than
 * the old fixed table of 64), defaults from the last table apply, and the trainer's own
 * schema holds every model and comm key. */
static void test_schema_join(void **state) {
    (void)state;
    enum { PER = 50, TABLES = 3 };
    static char names[TABLES][PER][32];
    static loom_config_key keys[TABLES][PER];
    for (int t = 0; t < TABLES; t++)
        for (int i = 0; i < PER; i++) {
            snprintf(names[t][i], sizeof names[t][i], "s%d.k%02d", t, i);
            keys[t][i] = (loom_config_key){names[t][i], t == 2 ? "7" : NULL, "help"};
        }
    const loom_config_key *const tables[] = {keys[0], keys[1], keys[2]};
    const int counts[] = {PER, PER, PER};
    int n = 0;
    loom_config_key *all = loom_config_schema_join(tables, counts, TABLES, &n);
    assert_int_equal(n, TABLES * PER);
    assert_string_equal(all[0].key, "s0.k00");
    assert_string_equal(all[n - 1].key, "s2.k49");
    loom_config *c = loom_config_new();
    loom_err err = {{0}};
    assert_int_equal(loom_config_load_string(c, "s1:\n  k33: 5\n", "x.yaml", &err), 0);
    if (loom_config_apply_schema(c, all, n, &err)) fail_msg("%s", err.msg);
    assert_string_equal(loom_config_get(c, "s1.k33"), "5");
    assert_string_equal(loom_config_get(c, "s2.k49"), "7");
    assert_null(loom_config_get(c, "s0.k01"));
    loom_config_free(c);
    free(all);

    int nt = 0;
    const loom_config_key *train = loom_train_schema(&nt);
    assert_true(nt > loom_model_config_nkeys + loom_comm_config_nkeys);
    for (int i = 0; i < loom_model_config_nkeys + loom_comm_config_nkeys; i++) {
        const char *key = i < loom_model_config_nkeys
                              ? loom_model_config_keys[i].key
                              : loom_comm_config_keys[i - loom_model_config_nkeys].key;
        int found = 0;
        for (int k = 0; k < nt; k++) found |= !strcmp(train[k].key, key);
        if (!found) fail_msg("key %s missing from the trainer schema", key);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_dialect),
        cmocka_unit_test(test_nested_load),      cmocka_unit_test(test_later_load_overrides),
        cmocka_unit_test(test_set_arg),          cmocka_unit_test(test_schema_defaults),
        cmocka_unit_test(test_unknown_key),      cmocka_unit_test(test_malformed_yaml),
        cmocka_unit_test(test_duplicate_key),    cmocka_unit_test(test_strict_getters),
        cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_leaf_and_section),
        cmocka_unit_test(test_get_list),         cmocka_unit_test(test_schema_join),
    };
    return cmocka_run_group_tests(tests, tu_setup_tmpdir, tu_teardown_tmpdir);
}
