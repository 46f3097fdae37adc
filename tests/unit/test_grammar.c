/* Grammars for constrained decoding (src/infer/grammar.c):
 * - documents accepted and rejected per JSON-schema keyword (type and type lists, properties
 *   with required and optional ones in the schema's order, additionalProperties, enum, const,
 *   items, minItems/maxItems, anyOf/oneOf, $ref to $defs and definitions with recursion,
 *   minLength/maxLength in code points, whitespace bounds), any JSON object;
 * - compile errors that name the keyword: unsupported keywords, unsatisfiable schemas;
 * - masks on a toy vocabulary equal brute force: token t is allowed iff the text + t's bytes is
 *   a prefix of some valid document, by an independent prefix matcher written here over the
 *   schema (sets of end positions, not the grammar's automaton), along random walks;
 * - with a budget, random walks always end in a complete document within it, and the masks
 *   a scratch caches equal fresh ones;
 * - the tool-call sequence grammar, and the cache (one compilation per canonical schema). */
#include "testutil.h"

#include <jansson.h>
#include <string.h>

#include "loom/grammar.h"

static loom_grammar *compile(const char *schema) {
    loom_err err = {{0}};
    loom_grammar *g = NULL;
    if (loom_grammar_json(NULL, schema, &g, &err)) fail_msg("%s: %s", schema, err.msg);
    return g;
}

static int accepts(loom_grammar *g, const char *doc) {
    loom_grammar_state *s = loom_grammar_state_new(g);
    const int ok = loom_grammar_state_advance(s, doc, strlen(doc)) == 0 && loom_grammar_state_complete(s);
    loom_grammar_state_free(s);
    return ok;
}

typedef struct {
    const char *schema, *doc;
    int ok;
} case_t;

static void test_keywords(void **state) {
    (void)state;
    static const case_t cases[] = {
        {"{\"type\":\"integer\"}", "-120", 1}, {"{\"type\":\"integer\"}", "1.5", 0},
        {"{\"type\":\"integer\"}", "01", 0}, {"{\"type\":\"integer\"}", "1234567890123456", 0},
        {"{\"type\":\"number\"}", "-0.5e+10", 1}, {"{\"type\":\"number\"}", "1.", 0},
        {"{\"type\":\"number\"}", ".5", 0}, {"{\"type\":\"boolean\"}", "false", 1},
        {"{\"type\":\"boolean\"}", "1", 0}, {"{\"type\":\"null\"}", "null", 1},
        {"{\"type\":[\"string\",\"null\"]}", "null", 1}, {"{\"type\":[\"string\",\"null\"]}", "\"x\"", 1},
        {"{\"type\":[\"string\",\"null\"]}", "3", 0},
        {"{\"type\":\"string\"}", "\"a\\n\\u00e9\\\"\"", 1}, {"{\"type\":\"string\"}", "\"a\nb\"", 0},
        {"{\"type\":\"string\"}", "\"\\ud800\"", 0}, {"{\"type\":\"string\"}", "\"\xc3\xa9\xe2\x82\xac\"", 1},
        {"{\"type\":\"string\"}", "\"\xc0\xaf\"", 0}, {"{\"type\":\"string\"}", "\"\xed\xa0\x80\"", 0},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"\xc3\xa9\xc3\xa9\"", 1},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"a\"", 0},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"abcd\"", 0},
        {"{\"enum\":[\"red\",3,null,{\"a\":[1]}]}", "{\"a\":[1]}", 1},
        {"{\"enum\":[\"red\",3,null]}", "\"blue\"", 0}, {"{\"const\":\"x\"}", "\"x\"", 1},
        {"{\"type\":\"string\",\"enum\":[\"a\",1]}", "1", 0},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}", "[1, 2]", 1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}", "[]", 0},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}", "[1,2,3]", 0},
        {"{\"type\":\"array\"}", "[1,\"a\",[{}]]", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}",
         "{\"a\": 1, \"b\": \"x\"}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}",
         "{\"b\":\"x\"}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}",
         "{\"a\":1}", 0}, /* b is required */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}",
         "{\"b\":\"x\",\"a\":1}", 0}, /* the schema's order */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"c\":1}", 0},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"k\":1,\"j\":2}", 1},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"k\":\"v\"}", 0},
        {"{\"type\":\"object\",\"additionalProperties\":false}", "{}", 1},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"const\":true}}]}", "[true]", 1},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"}]}", "\"s\"", 0},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},"
         "\"required\":[\"k\"]}},\"$ref\":\"#/$defs/n\"}", "{\"k\":[{\"k\":[]},{\"k\":[{\"k\":[]}]}]}", 1},
        {"{\"definitions\":{\"v\":{\"type\":\"integer\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/v\"}}", "[1,\"x\"]", 0},
        {"{\"type\":\"integer\",\"description\":\"ignored\",\"title\":\"t\",\"default\":1}", "7", 1},
        {"true", "[{\"a\":null}]", 1},
        /* whitespace: at most LOOM_GRAMMAR_MAX_WS (4) bytes between tokens, none around the root */
        {"{\"type\":\"array\"}", "[ \n\t\r1 ,    2]", 1}, {"{\"type\":\"array\"}", "[     1]", 0},
        {"{\"type\":\"array\"}", " [1]", 0}, {"{\"type\":\"array\"}", "[1] ", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        loom_grammar *g = compile(cases[i].schema);
        if (accepts(g, cases[i].doc) != cases[i].ok)
            fail_msg("schema %s, document %s: expected %s", cases[i].schema, cases[i].doc,
                     cases[i].ok ? "accepted" : "rejected");
        loom_grammar_unref(g);
    }
    /* any JSON object (response_format json_object) */
    const loom_grammar_part any = {NULL, NULL};
    const loom_grammar_spec spec = {&any, 1, NULL, 0, 0};
    loom_grammar *g = NULL;
    loom_err err = {{0}};
    assert_int_equal(loom_grammar_compile(&spec, &g, &err), 0);
    assert_true(accepts(g, "{\"a\": [1, {\"b\": null}], \"c\": -2.5}"));
    assert_false(accepts(g, "[1]"));
    assert_false(accepts(g, "{\"a\":}"));
    assert_int_equal(loom_grammar_min_bytes(g), 2);
    loom_grammar_unref(g);
}

static void test_errors(void **state) {
    (void)state;
    static const char *const bad[][2] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "'pattern'"},
        {"{\"type\":\"integer\",\"minimum\":0}", "'minimum'"},
        {"{\"enum\":[]}", "'enum' must be a non-empty"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems 3 > maxItems 2"},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "minLength 3 > maxLength 2"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "'required' names 'b'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}",
         "unsatisfiable: no document matches it (#/properties/a admits no value: the schema is false)"},
        {"{\"$defs\":{\"x\":{\"type\":\"object\",\"properties\":{\"y\":{\"$ref\":\"#/$defs/x\"}},"
         "\"required\":[\"y\"]}},\"$ref\":\"#/$defs/x\"}", "deeper than 8 expansions"},
        {"{\"$ref\":\"#/$defs/missing\"}", "names no definition"},
        {"{\"type\":\"strin\"}", "unknown type 'strin'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"minimum\":1}}}}",
         "#/properties/a/items: the JSON-schema keyword 'minimum'"},
        {"{\"type\":", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        loom_err err = {{0}};
        loom_grammar *g = NULL;
        assert_int_equal(loom_grammar_json(NULL, bad[i][0], &g, &err), -1);
        assert_null(g);
        if (!strstr(err.msg, bad[i][1])) fail_msg("%s: '%s' lacks '%s'", bad[i][0], err.msg, bad[i][1]);
    }
    /* 1,000 nested anyOf (an untrusted schema): an error, not a stack overflow */
    loom_sbuf deep = {0};
    for (int i = 0; i < 1000; i++) loom_sbuf_printf(&deep, "{\"anyOf\":[");
    loom_sbuf_printf(&deep, "true");
    for (int i = 0; i < 1000; i++) loom_sbuf_printf(&deep, "]}");
    loom_err err = {{0}};
    loom_grammar *g = NULL;
    assert_int_equal(loom_grammar_json(NULL, deep.p, &g, &err), -1);
    assert_non_null(strstr(err.msg, "nests over 64 levels"));
    free(deep.p);
    /* format is an annotation (JSON Schema 2020-12): ignored, the string is free */
    loom_err ferr = {{0}};
    loom_grammar *fg = NULL;
    assert_int_equal(loom_grammar_json(NULL, "{\"type\":\"string\",\"format\":\"date-time\"}", &fg, &ferr), 0);
    assert_true(accepts(fg, "\"not a date\""));
    assert_false(accepts(fg, "3"));
    loom_grammar_unref(fg);
}

/* ---- the independent prefix matcher ------------------------------------------------------
 * m_*(schema, pos) gives the set of positions where a match starting at pos can end, and eof
 * when the text ran out inside a match that could still be completed. A text is a prefix of a
 * valid document iff the root's matcher reports eof or ends at its end. Same bounds as the
 * grammar (docs/inference.md): 4 whitespace bytes, 15 digits, no surrogate escapes. */
enum { MAXN = 200, WS = 4 };
typedef struct res {
    uint8_t end[MAXN + 1];
    int eof;
} res;
static const char *T;
static int N;

static void r_union(res *a, const res *b) {
    for (int i = 0; i <= N; i++) a->end[i] |= b->end[i];
    a->eof |= b->eof;
}

typedef void (*matcher)(json_t *s, int pos, res *r);

/* runs m after each end of r (in place) */
static void r_then(res *r, json_t *s, matcher m) {
    res out = {{0}, r->eof};
    for (int i = 0; i <= N; i++) {
        if (!r->end[i]) continue;
        res x = {{0}, 0};
        m(s, i, &x);
        r_union(&out, &x);
    }
    *r = out;
}

static void m_ws(json_t *s, int pos, res *r) {
    (void)s;
    for (int k = 0; k <= WS && pos + k <= N; k++) {
        r->end[pos + k] = 1;
        if (pos + k == N || !strchr(" \t\n\r", T[pos + k]) || !T[pos + k]) break;
    }
}

static void m_lit(const char *lit, int pos, res *r) {
    const int l = (int)strlen(lit);
    for (int i = 0; i < l; i++) {
        if (pos + i == N) {
            r->eof = 1;
            return;
        }
        if (T[pos + i] != lit[i]) return;
    }
    r->end[pos + l] = 1;
}

/* one character of a string at pos: its length, 0 for a bad one, -1 at the end of the text
 * while still completable */
static int str_char(int pos) {
    const unsigned char c = (unsigned char)T[pos];
    if (c == '\\') {
        if (pos + 1 == N) return -1;
        const char e = T[pos + 1];
        if (strchr("\"\\/bfnrt", e) && e) return 2;
        if (e != 'u') return 0;
        unsigned v = 0;
        for (int i = 0; i < 4; i++) {
            if (pos + 2 + i == N) return -1; /* any hex digits can follow (a surrogate is caught below) */
            const char h = T[pos + 2 + i];
            const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return 0;
            v = v * 16 + (unsigned)d;
            if (i == 1 && v >= 0xd8 && v <= 0xdf) return 0; /* a surrogate */
        }
        return 6;
    }
    if (c < 0x20 || c == '"') return 0;
    if (c < 0x80) return 1;
    /* UTF-8: the code point decoded must be in range for its length and not a surrogate;
     * a sequence cut by the end of the text is tried with every second byte */
    const int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (!len || c > 0xf4) return 0;
    unsigned char buf[4] = {c, 0, 0, 0};
    int have = 1;
    while (have < len && pos + have < N) {
        buf[have] = (unsigned char)T[pos + have];
        if ((buf[have] & 0xc0) != 0x80) return 0;
        have++;
    }
    for (int second = 0x80; second <= 0xbf; second++) {
        unsigned char b2[4];
        memcpy(b2, buf, 4);
        for (int i = have; i < len; i++) b2[i] = 0x80;
        if (have < 2) b2[1] = (unsigned char)second;
        unsigned cp = (unsigned)(b2[0] & (0x7f >> len));
        for (int i = 1; i < len; i++) cp = cp << 6 | (b2[i] & 0x3f);
        const unsigned lo = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
        if (cp >= lo && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff))
            return have == len ? len : -1;
        if (have >= 2) break;
    }
    return 0;
}

static void m_string(json_t *s, int pos, res *r) {
    const int lo = json_integer_value(json_object_get(s, "minLength"));
    const int hi = json_object_get(s, "maxLength") ? (int)json_integer_value(json_object_get(s, "maxLength")) : 1 << 30;
    if (pos == N) {
        r->eof = 1;
        return;
    }
    if (T[pos] != '"') return;
    int count = 0;
    for (int p = pos + 1;;) {
        if (p == N) {
            r->eof = 1;
            return;
        }
        if (T[p] == '"') {
            if (count >= lo) r->end[p + 1] = 1;
            return;
        }
        if (count == hi) return;
        const int l = str_char(p);
        if (l == 0) return;
        if (l < 0) {
            r->eof = 1;
            return;
        }
        p += l;
        count++;
    }
}

static void m_digits(int pos, int lo, int hi, res *r) {
    int k = 0;
    while (1) {
        if (k >= lo) r->end[pos + k] = 1;
        if (pos + k == N) {
            if (k < hi) r->eof = 1;
            return;
        }
        if (k == hi || T[pos + k] < '0' || T[pos + k] > '9') return;
        k++;
    }
}

static void m_number(int pos, int integer, res *r) {
    res a = {{0}, 0};
    a.end[pos] = 1;
    if (pos == N) a.eof = 1;
    if (pos < N && T[pos] == '-') a.end[pos + 1] = 1;
    /* the integer part */
    res ip = {{0}, a.eof};
    for (int i = 0; i <= N; i++) {
        if (!a.end[i]) continue;
        if (i == N) { ip.eof = 1; continue; }
        if (T[i] == '0') ip.end[i + 1] = 1;
        else if (T[i] >= '1' && T[i] <= '9') m_digits(i + 1, 0, 14, &ip);
    }
    *r = ip;
    if (integer) return;
    res fr = ip; /* optional fraction */
    for (int i = 0; i <= N; i++) {
        if (!ip.end[i] || i == N) continue;
        if (T[i] == '.') {
            if (i + 1 == N) fr.eof = 1;
            else m_digits(i + 1, 1, 15, &fr);
        }
    }
    res ex = fr; /* optional exponent */
    for (int i = 0; i <= N; i++) {
        if (!fr.end[i] || i == N || (T[i] != 'e' && T[i] != 'E')) continue;
        int j = i + 1;
        if (j < N && (T[j] == '+' || T[j] == '-')) j++;
        if (j == N) ex.eof = 1;
        else m_digits(j, 1, 3, &ex);
    }
    *r = ex;
}

static void m_value(json_t *s, int pos, res *r);

typedef struct obj_ctx {
    json_t *props;
    json_t *req;
} obj_ctx;

static int is_required(json_t *req, const char *k) {
    size_t i;
    json_t *x;
    json_array_foreach(req, i, x) if (!strcmp(json_string_value(x), k)) return 1;
    return 0;
}

/* members from property index i on, after `first` (no member yet) or not */
static void m_members(json_t *props, json_t *req, size_t i, int first, int pos, res *r) {
    if (i == json_object_size(props)) {
        r->end[pos] = 1;
        return;
    }
    void *it = json_object_iter(props);
    for (size_t k = 0; k < i; k++) it = json_object_iter_next(props, it);
    const char *key = json_object_iter_key(it);
    json_t *sub = json_object_iter_value(it);
    if (!is_required(req, key)) m_members(props, req, i + 1, first, pos, r);
    res x = {{0}, 0};
    x.end[pos] = 1;
    if (!first) {
        r_then(&x, NULL, m_ws);
        res y = {{0}, x.eof};
        for (int p = 0; p <= N; p++) if (x.end[p]) m_lit(",", p, &y);
        x = y;
        r_then(&x, NULL, m_ws);
    }
    char lit[256];
    snprintf(lit, sizeof lit, "\"%s\"", key);
    res y = {{0}, x.eof};
    for (int p = 0; p <= N; p++) if (x.end[p]) m_lit(lit, p, &y);
    r_then(&y, NULL, m_ws);
    res z = {{0}, y.eof};
    for (int p = 0; p <= N; p++) if (y.end[p]) m_lit(":", p, &z);
    r_then(&z, NULL, m_ws);
    r_then(&z, sub, m_value);
    for (int p = 0; p <= N; p++) {
        if (!z.end[p]) continue;
        res w = {{0}, 0};
        m_members(props, req, i + 1, 0, p, &w);
        r_union(r, &w);
    }
    r->eof |= z.eof;
}

static void m_close(res *x, const char *c) {
    res y = {{0}, x->eof};
    for (int p = 0; p <= N; p++) if (x->end[p]) m_lit(c, p, &y);
    *x = y;
}

static void m_object(json_t *s, int pos, res *r) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    res x = {{0}, 0};
    m_lit("{", pos, &x);
    r_then(&x, NULL, m_ws);
    int any_req = 0;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) any_req |= is_required(req, k);
    if (!any_req) {
        res e = x;
        m_close(&e, "}");
        r_union(r, &e);
    }
    res m = {{0}, x.eof};
    for (int p = 0; p <= N; p++) {
        if (!x.end[p]) continue;
        res w = {{0}, 0};
        m_members(props, req, 0, 1, p, &w);
        /* members must not be empty here */
        w.end[p] = 0; /* the empty sequence: the '{' ws '}' form above */
        r_union(&m, &w);
    }
    r_then(&m, NULL, m_ws);
    m_close(&m, "}");
    r_union(r, &m);
}

static void m_array(json_t *s, int pos, res *r) {
    json_t *items = json_object_get(s, "items");
    const int lo = (int)json_integer_value(json_object_get(s, "minItems"));
    const int hi = json_object_get(s, "maxItems") ? (int)json_integer_value(json_object_get(s, "maxItems")) : 1 << 30;
    res x = {{0}, 0};
    m_lit("[", pos, &x);
    r_then(&x, NULL, m_ws);
    if (lo == 0) {
        res e = x;
        m_close(&e, "]");
        r_union(r, &e);
    }
    if (hi == 0) return;
    res cur = x; /* after k items */
    r_then(&cur, items, m_value);
    for (int k = 1; k <= hi && k <= MAXN; k++) {
        if (k >= lo) {
            res e = cur;
            r_then(&e, NULL, m_ws);
            m_close(&e, "]");
            r_union(r, &e);
        }
        r->eof |= cur.eof;
        if (k == hi) break;
        res nx = cur;
        nx.eof = 0;
        r_then(&nx, NULL, m_ws);
        m_close(&nx, ",");
        r_then(&nx, NULL, m_ws);
        r_then(&nx, items, m_value);
        int any = nx.eof;
        for (int p = 0; p <= N; p++) any |= nx.end[p];
        if (!any) break;
        cur = nx;
    }
}

static void m_value(json_t *s, int pos, res *r) {
    json_t *x;
    if ((x = json_object_get(s, "anyOf"))) {
        size_t i;
        json_t *b;
        json_array_foreach(x, i, b) m_value(b, pos, r);
        return;
    }
    if ((x = json_object_get(s, "enum"))) {
        size_t i;
        json_t *b;
        json_array_foreach(x, i, b) {
            char *lit = json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT);
            m_lit(lit, pos, r);
            free(lit);
        }
        return;
    }
    json_t *type = json_object_get(s, "type");
    const char *t = json_string_value(type);
    if (!strcmp(t, "object")) m_object(s, pos, r);
    else if (!strcmp(t, "array")) m_array(s, pos, r);
    else if (!strcmp(t, "string")) m_string(s, pos, r);
    else if (!strcmp(t, "integer")) m_number(pos, 1, r);
    else if (!strcmp(t, "number")) m_number(pos, 0, r);
    else if (!strcmp(t, "boolean")) m_lit("true", pos, r), m_lit("false", pos, r);
    else if (!strcmp(t, "null")) m_lit("null", pos, r);
    else fail_msg("matcher: type %s", t);
}

/* 1 when text[0..n) is a prefix of a valid document; *complete when it is one */
static int oracle(json_t *schema, const char *text, int n, int *complete) {
    T = text;
    N = n;
    res r = {{0}, 0};
    m_value(schema, 0, &r);
    *complete = r.end[n];
    return r.eof || r.end[n];
}

static const char *const TOYS[] = {
    "{", "}", "[", "]", ",", ":", " ", "\n", "\"", "\\", "a", "b", "n", "0", "1", "9", "-", ".",
    "e", "+", "u", "d", "8", "t", "f", "true", "fals", "e}", "null", "\"a\"", "\"b\":", "{\"",
    "\": ", ", \"", "12", "0.", "1e", "\xc3", "\xa9", "\xc3\xa9", "\xed", "\xa0", "\\u", "\\ud8",
    "\\u00e9", "\"}", "\"]", "]}", "  ", "     ", "\"red\"", "\"re", "d\"", "\"c\":[", "x", "\t",
    "<|eot|>"};
enum { NTOY = sizeof TOYS / sizeof *TOYS };

static void walk_check(const char *schema_text, uint64_t seed, int walks, int steps) {
    json_error_t je;
    json_t *schema = json_loads(schema_text, 0, &je);
    assert_non_null(schema);
    loom_grammar *g = compile(schema_text);
    size_t lens[NTOY];
    for (int i = 0; i < NTOY; i++) lens[i] = strlen(TOYS[i]);
    const int eos = NTOY - 1; /* "<|eot|>": the end-of-text id, never text */
    loom_grammar_vocab *v = loom_grammar_vocab_new(TOYS, lens, NTOY, eos);
    loom_grammar_scratch *sc = loom_grammar_scratch_new();
    uint8_t allow[NTOY];
    char text[MAXN + 16];
    int checked = 0;
    for (int w = 0; w < walks; w++) {
        loom_grammar_state *s = loom_grammar_state_new(g);
        int n = 0;
        for (int step = 0; step < steps; step++) {
            loom_grammar_mask(s, v, 1 << 20, allow, sc);
            int complete = 0;
            oracle(schema, text, n, &complete);
            assert_int_equal(allow[eos], complete);
            assert_int_equal(loom_grammar_state_complete(s), complete);
            int n_ok = 0, pick[NTOY];
            for (int t = 0; t < eos; t++) {
                if (n + (int)lens[t] > MAXN) continue;
                memcpy(text + n, TOYS[t], lens[t]);
                int c;
                const int want = oracle(schema, text, n + (int)lens[t], &c);
                if (allow[t] != want)
                    fail_msg("schema %s after '%.*s': token '%s' allowed %d, the matcher says %d",
                             schema_text, n, text, TOYS[t], allow[t], want);
                checked++;
                if (want) pick[n_ok++] = t;
            }
            if (n_ok == 0) break;
            const int t = pick[loom_rng_u64(seed, (uint64_t)w, (uint64_t)step) % (uint64_t)n_ok];
            memcpy(text + n, TOYS[t], lens[t]);
            n += (int)lens[t];
            assert_int_equal(loom_grammar_state_advance(s, TOYS[t], lens[t]), 0);
        }
        loom_grammar_state_free(s);
    }
    assert_true(checked > 1000);
    loom_grammar_scratch_free(sc);
    loom_grammar_vocab_free(v);
    loom_grammar_unref(g);
    json_decref(schema);
}

static void test_masks_brute_force(void **state) {
    (void)state;
    walk_check("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3},"
               "\"b\":{\"type\":\"boolean\"},\"c\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",12,null]},"
               "\"maxItems\":2}},\"required\":[\"b\"]}", 1, 40, 24);
    walk_check("{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"string\",\"minLength\":2},"
               "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1}]}", 2, 40, 16);
}

/* random walks under a budget: every walk ends complete within it */
static void test_budget(void **state) {
    (void)state;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":2}},"
                         "\"required\":[\"name\",\"tags\"]}";
    loom_grammar *g = compile(schema);
    const int need = loom_grammar_min_bytes(g); /* {"name":"","tags":["",""]} */
    assert_int_equal(need, (int)strlen("{\"name\":\"\",\"tags\":[\"\",\"\"]}"));
    /* a vocabulary with every byte, some longer tokens, and an end-of-text id */
    const char *toks[260];
    size_t lens[260];
    char bytes[256];
    for (int c = 0; c < 256; c++) bytes[c] = (char)c, toks[c] = bytes + c, lens[c] = 1;
    toks[256] = "\"name\": \"", toks[257] = "aaaa", toks[258] = "\", \"";
    toks[259] = NULL;
    for (int i = 256; i < 259; i++) lens[i] = strlen(toks[i]);
    lens[259] = 0;
    loom_grammar_vocab *v = loom_grammar_vocab_new(toks, lens, 260, 259);
    assert_true(loom_grammar_vocab_has_bytes(v));
    loom_grammar_scratch *sc = loom_grammar_scratch_new();
    uint8_t allow[260];
    for (int w = 0; w < 30; w++) {
        const int budget = need + (w % 5) * 3;
        loom_grammar_state *s = loom_grammar_state_new(g);
        int used = 0;
        for (; used < budget && !loom_grammar_state_terminal(s); used++) {
            int n = loom_grammar_mask(s, v, budget - used, allow, sc);
            assert_true(n > 0);
            /* the scratch's cache of masks (by state, valid where the budget does not bind)
             * gives what a fresh scratch computes */
            loom_grammar_scratch *fresh = loom_grammar_scratch_new();
            uint8_t again[260];
            assert_int_equal(loom_grammar_mask(s, v, budget - used, again, fresh), n);
            assert_memory_equal(allow, again, sizeof again);
            loom_grammar_scratch_free(fresh);
            int t;
            do t = (int)(loom_rng_u64(7, (uint64_t)w, (uint64_t)used * 1000 + (uint64_t)n++) % 260);
            while (!allow[t]);
            if (t == 259) break; /* end of text: only where complete */
            size_t l;
            const char *b = loom_grammar_vocab_token(v, t, &l);
            assert_int_equal(loom_grammar_state_advance(s, b, l), 0);
        }
        assert_true(loom_grammar_state_complete(s));
        assert_true(used <= budget);
        loom_grammar_state_free(s);
    }
    loom_grammar_scratch_free(sc);
    loom_grammar_vocab_free(v);
    loom_grammar_unref(g);
}

static void test_tool_calls_and_cache(void **state) {
    (void)state;
    const char *schema = "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"add\"},"
                         "\"arguments\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                         "\"required\":[\"a\"]}},\"required\":[\"name\",\"arguments\"]},"
                         "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"now\"},"
                         "\"arguments\":{\"type\":\"object\",\"properties\":{}}},\"required\":[\"name\",\"arguments\"]}]}";
    loom_grammar_cache *c = loom_grammar_cache_new(2);
    loom_err err = {{0}};
    loom_grammar *g = NULL, *g2 = NULL;
    assert_int_equal(loom_grammar_tool_calls("<tool_call>\n", schema, "\n</tool_call>", "\n", 2, c,
                                             &g, &err), 0);
    assert_true(accepts(g, "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1}}\n</tool_call>"));
    assert_true(accepts(g, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n"
                           "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": -3}}\n</tool_call>"));
    assert_false(accepts(g, "<tool_call>\n{\"name\":\"sub\",\"arguments\":{}}\n</tool_call>"));
    assert_false(accepts(g, "{\"name\":\"now\",\"arguments\":{}}"));
    assert_false(accepts(g, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n"
                            "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n"
                            "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>")); /* max 2 */
    loom_grammar_state *s = loom_grammar_state_new(g);
    const char *one = "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>";
    assert_int_equal(loom_grammar_state_advance(s, one, strlen(one)), 0);
    assert_true(loom_grammar_state_complete(s) && !loom_grammar_state_terminal(s));
    loom_grammar_state_free(s);
    /* the cache: the same spec again is a hit, the same grammar */
    assert_int_equal(loom_grammar_tool_calls("<tool_call>\n", schema, "\n</tool_call>", "\n", 2, c,
                                             &g2, &err), 0);
    assert_ptr_equal(g, g2);
    int64_t hits, compiled;
    loom_grammar_cache_stats(c, &hits, &compiled);
    assert_int_equal(hits, 1);
    assert_int_equal(compiled, 1);
    /* recompiled from its source (a tp follower's path): the same language */
    loom_grammar *g3 = NULL;
    assert_int_equal(loom_grammar_compile_source(loom_grammar_source(g), &g3, &err), 0);
    assert_true(accepts(g3, one));
    loom_grammar_unref(g3);
    loom_grammar_unref(g2);
    loom_grammar_unref(g);
    loom_grammar_cache_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keywords), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_masks_brute_force), cmocka_unit_test(test_budget),
        cmocka_unit_test(test_tool_calls_and_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
