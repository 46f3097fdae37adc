/* Grammars for constrained decoding (include/loom/grammar.h, docs/inference.md).
 *
 * Compilation turns a spec (literal text, JSON schemas) into a context-free grammar over
 * bytes: rules with alternatives, each alternative a sequence of elements (a byte class, a
 * reference to a rule, the end). Every recursion the schemas allow is cut to a depth
 * ($ref expansions and free-form values are rules per depth), so the only cycles left are the
 * right recursions of repetitions (string characters, array items), and no rule is
 * left-recursive. Rules that derive no finite text are removed (an unsatisfiable schema is
 * one whose root is removed), and every element knows the fewest bytes that finish its
 * alternative.
 *
 * The automaton: a stack is a linked list of frames (position to continue at, the frame to
 * return to), shared between stacks; a state is the set of stacks whose top is a byte class
 * (plus "complete", when a stack emptied). A byte advances each stack whose class holds it and
 * expands rule references until byte classes are on top again. A frame carries the fewest
 * bytes that empty its stack, so the distance of a state to a complete document is the least
 * of its stacks'. Mask computation walks the vocabulary's trie depth first with the state,
 * allocating the states of the current path from a stack-like arena and pruning a subtree
 * as soon as its state is dead. */
#define _GNU_SOURCE
#include "loom/grammar.h"
#include "loom/tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { E_END = 0, E_BYTES = 1, E_RULE = 2 };
enum { INF = 1 << 29, MAX_ELEMS = 1 << 21, MAX_FRAMES = 512, MAX_EXPAND = 1 << 14 };

typedef struct gel {
    int32_t kind, arg; /* E_BYTES: class id; E_RULE: rule id */
} gel;

typedef struct grule {
    int32_t alt0, n_alt; /* its alternatives: alts[alt0 .. alt0 + n_alt) (element indices) */
} grule;

struct loom_grammar {
    atomic_int refs;
    gel *el;          /* (n_el) alternatives, each ended by E_END */
    int32_t *suffix;  /* (n_el) fewest bytes from this element to its alternative's end */
    int n_el, cap_el;
    int32_t *alts;
    int n_alts, cap_alts;
    grule *rules;
    int32_t *minlen;  /* (n_rules) */
    int n_rules, cap_rules;
    uint32_t (*cls)[8]; /* byte classes: 256-bit sets; class b < 256 is the byte b alone */
    int n_cls, cap_cls;
    int root;
    char *source;
};

/* ---- building -------------------------------------------------------------------------- */

typedef struct seq {
    gel *v;
    int n, cap;
} seq;

static void seq_push(seq *s, int kind, int arg) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->v = loom_realloc(s->v, (size_t)s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (gel){kind, arg};
}
static void seq_lit(seq *s, const char *t, size_t n) {
    for (size_t i = 0; i < n; i++) seq_push(s, E_BYTES, (unsigned char)t[i]);
}

typedef struct refmemo {
    char *ref;
    int depth, rule;
} refmemo;

typedef struct builder {
    loom_grammar *g;
    loom_err *err;
    json_t *root_schema; /* for $ref */
    refmemo *refs;
    int n_refs, cap_refs;
    int any[LOOM_GRAMMAR_MAX_ANY_DEPTH + 1]; /* free-form value rules per depth (0: not yet) */
    int ws, str_char, string_any, number, integer, hex;
    int too_big;
} builder;

static int new_rule(builder *b) {
    loom_grammar *g = b->g;
    if (g->n_rules == g->cap_rules) {
        g->cap_rules = g->cap_rules ? 2 * g->cap_rules : 64;
        g->rules = loom_realloc(g->rules, (size_t)g->cap_rules * sizeof *g->rules);
    }
    g->rules[g->n_rules] = (grule){0, 0};
    return g->n_rules++;
}

/* sets rule r's alternatives (the sequences are consumed) */
static void set_rule(builder *b, int r, seq *alts, int n) {
    loom_grammar *g = b->g;
    if (g->n_alts + n > g->cap_alts) {
        while (g->n_alts + n > g->cap_alts) g->cap_alts = g->cap_alts ? 2 * g->cap_alts : 64;
        g->alts = loom_realloc(g->alts, (size_t)g->cap_alts * sizeof *g->alts);
    }
    g->rules[r] = (grule){g->n_alts, n};
    for (int a = 0; a < n; a++) {
        if (g->n_el + alts[a].n + 1 > MAX_ELEMS) b->too_big = 1;
        if (!b->too_big) {
            if (g->n_el + alts[a].n + 1 > g->cap_el) {
                while (g->n_el + alts[a].n + 1 > g->cap_el) g->cap_el = g->cap_el ? 2 * g->cap_el : 256;
                g->el = loom_realloc(g->el, (size_t)g->cap_el * sizeof *g->el);
            }
            g->alts[g->n_alts++] = g->n_el;
            if (alts[a].n) memcpy(g->el + g->n_el, alts[a].v, (size_t)alts[a].n * sizeof(gel));
            g->n_el += alts[a].n;
            g->el[g->n_el++] = (gel){E_END, 0};
        } else {
            g->rules[r].n_alt = 0;
        }
        free(alts[a].v);
        alts[a] = (seq){0};
    }
}

static int rule1(builder *b, seq *s) {
    const int r = new_rule(b);
    set_rule(b, r, s, 1);
    return r;
}

/* a byte class from ranges "lohi lohi ..." (pairs of bytes) */
static int cls_of(builder *b, const char *ranges, size_t n) {
    uint32_t set[8] = {0};
    for (size_t i = 0; i + 1 < n; i += 2)
        for (int c = (unsigned char)ranges[i]; c <= (unsigned char)ranges[i + 1]; c++)
            set[c >> 5] |= 1u << (c & 31);
    loom_grammar *g = b->g;
    for (int i = 256; i < g->n_cls; i++)
        if (!memcmp(g->cls[i], set, sizeof set)) return i;
    if (g->n_cls == g->cap_cls) {
        g->cap_cls *= 2;
        g->cls = loom_realloc(g->cls, (size_t)g->cap_cls * sizeof *g->cls);
    }
    memcpy(g->cls[g->n_cls], set, sizeof set);
    return g->n_cls++;
}
#define CLS(b, lit) cls_of((b), (lit), sizeof(lit) - 1)

/* X repeated lo..hi times (hi < 0: unbounded) */
static int rep(builder *b, int x, int lo, int hi) {
    int tail = -1;
    if (hi < 0) { /* star = "" | x star */
        tail = new_rule(b);
        seq a[2] = {{0}, {0}};
        seq_push(&a[1], E_RULE, x);
        seq_push(&a[1], E_RULE, tail);
        set_rule(b, tail, a, 2);
    } else {
        for (int k = 0; k < hi - lo && !b->too_big; k++) { /* o_k = "" | x o_{k-1} */
            seq a[2] = {{0}, {0}};
            seq_push(&a[1], E_RULE, x);
            if (tail >= 0) seq_push(&a[1], E_RULE, tail);
            tail = new_rule(b);
            set_rule(b, tail, a, 2);
        }
    }
    seq s = {0};
    for (int i = 0; i < lo && !b->too_big; i++) seq_push(&s, E_RULE, x);
    if (tail >= 0) seq_push(&s, E_RULE, tail);
    return rule1(b, &s);
}

static int ws_rule(builder *b) {
    if (b->ws) return b->ws;
    const int c = CLS(b, "\t\n\r\r  ");
    int w = -1;
    for (int k = 0; k < LOOM_GRAMMAR_MAX_WS; k++) {
        seq a[2] = {{0}, {0}};
        seq_push(&a[1], E_BYTES, c);
        if (w >= 0) seq_push(&a[1], E_RULE, w);
        w = new_rule(b);
        set_rule(b, w, a, 2);
    }
    return b->ws = w;
}

/* one character of a JSON string: a code point as UTF-8, or an escape (\uXXXX never a
 * surrogate, so that a character is a code point for minLength and maxLength) */
static int str_char_rule(builder *b) {
    if (b->str_char) return b->str_char;
    const int cont = CLS(b, "\x80\xbf"), hex = CLS(b, "09afAF");
    seq a[10] = {{0}};
    int n = 0;
    seq_push(&a[n++], E_BYTES, CLS(b, "  !!#[]\x7f"));
    seq_push(&a[n], E_BYTES, CLS(b, "\xc2\xdf"));
    seq_push(&a[n++], E_BYTES, cont);
    seq_push(&a[n], E_BYTES, 0xe0);
    seq_push(&a[n], E_BYTES, CLS(b, "\xa0\xbf"));
    seq_push(&a[n++], E_BYTES, cont);
    seq_push(&a[n], E_BYTES, CLS(b, "\xe1\xec\xee\xef"));
    seq_push(&a[n], E_BYTES, cont);
    seq_push(&a[n++], E_BYTES, cont);
    seq_push(&a[n], E_BYTES, 0xed);
    seq_push(&a[n], E_BYTES, CLS(b, "\x80\x9f"));
    seq_push(&a[n++], E_BYTES, cont);
    seq_push(&a[n], E_BYTES, 0xf0);
    seq_push(&a[n], E_BYTES, CLS(b, "\x90\xbf"));
    seq_push(&a[n], E_BYTES, cont);
    seq_push(&a[n++], E_BYTES, cont);
    seq_push(&a[n], E_BYTES, CLS(b, "\xf1\xf3"));
    for (int i = 0; i < 3; i++) seq_push(&a[n], E_BYTES, cont);
    n++;
    seq_push(&a[n], E_BYTES, 0xf4);
    seq_push(&a[n], E_BYTES, CLS(b, "\x80\x8f"));
    seq_push(&a[n], E_BYTES, cont);
    seq_push(&a[n++], E_BYTES, cont);
    seq_push(&a[n], E_BYTES, '\\');
    seq_push(&a[n++], E_BYTES, CLS(b, "\"\"//\\\\bbffnnrrtt"));
    seq_push(&a[n], E_BYTES, '\\');
    seq_push(&a[n], E_BYTES, 'u');
    seq_push(&a[n], E_BYTES, CLS(b, "09acACefEF"));
    for (int i = 0; i < 3; i++) seq_push(&a[n], E_BYTES, hex);
    n++;
    const int r = new_rule(b);
    set_rule(b, r, a, n);
    /* \uD000-\uD7FF: the non-surrogate half of the d's, as a second rule (the class above
     * leaves d and D out) */
    seq d[2] = {{0}, {0}};
    seq_push(&d[0], E_RULE, r);
    seq_push(&d[1], E_BYTES, '\\');
    seq_push(&d[1], E_BYTES, 'u');
    seq_push(&d[1], E_BYTES, CLS(b, "ddDD"));
    seq_push(&d[1], E_BYTES, CLS(b, "07"));
    seq_push(&d[1], E_BYTES, hex);
    seq_push(&d[1], E_BYTES, hex);
    const int all = new_rule(b);
    set_rule(b, all, d, 2);
    return b->str_char = all;
}

static int string_rule(builder *b, int lo, int hi) {
    const int chars = rep(b, str_char_rule(b), lo, hi);
    seq s = {0};
    seq_push(&s, E_BYTES, '"');
    seq_push(&s, E_RULE, chars);
    seq_push(&s, E_BYTES, '"');
    return rule1(b, &s);
}

/* a rule of one element (for rep() over a byte class) */
static int wrap_cls(builder *b, int c) {
    seq s = {0};
    seq_push(&s, E_BYTES, c);
    return rule1(b, &s);
}

static int number_rule(builder *b, int integer) {
    if (integer && b->integer) return b->integer;
    if (!integer && b->number) return b->number;
    const int dig = wrap_cls(b, CLS(b, "09"));
    seq ip[2] = {{0}, {0}}; /* 0 | [1-9][0-9]{0,14} */
    seq_push(&ip[0], E_BYTES, '0');
    seq_push(&ip[1], E_BYTES, CLS(b, "19"));
    seq_push(&ip[1], E_RULE, rep(b, dig, 0, LOOM_GRAMMAR_MAX_DIGITS - 1));
    const int intpart = new_rule(b);
    set_rule(b, intpart, ip, 2);
    seq sg[2] = {{0}, {0}};
    seq_push(&sg[1], E_BYTES, '-');
    const int sign = new_rule(b);
    set_rule(b, sign, sg, 2);
    seq s = {0};
    seq_push(&s, E_RULE, sign);
    seq_push(&s, E_RULE, intpart);
    if (!integer) {
        seq fr[2] = {{0}, {0}};
        seq_push(&fr[1], E_BYTES, '.');
        seq_push(&fr[1], E_RULE, rep(b, dig, 1, LOOM_GRAMMAR_MAX_DIGITS));
        const int frac = new_rule(b);
        set_rule(b, frac, fr, 2);
        seq ex[2] = {{0}, {0}};
        seq_push(&ex[1], E_BYTES, CLS(b, "eeEE"));
        seq es[2] = {{0}, {0}};
        seq_push(&es[1], E_BYTES, CLS(b, "++--"));
        const int esign = new_rule(b);
        set_rule(b, esign, es, 2);
        seq_push(&ex[1], E_RULE, esign);
        seq_push(&ex[1], E_RULE, rep(b, dig, 1, 3));
        const int exp = new_rule(b);
        set_rule(b, exp, ex, 2);
        seq_push(&s, E_RULE, frac);
        seq_push(&s, E_RULE, exp);
    }
    const int r = rule1(b, &s);
    if (integer) b->integer = r;
    else b->number = r;
    return r;
}

static int literal_rule(builder *b, const char *t, size_t n) {
    seq s = {0};
    seq_lit(&s, t, n);
    return rule1(b, &s);
}

/* '[' ws ']' | '[' ws X (ws ',' ws X){lo-1, hi-1} ws ']' (the empty form when lo == 0) */
static int array_rule(builder *b, int x, int lo, int hi) {
    const int ws = ws_rule(b);
    seq alts[2] = {{0}, {0}};
    int n = 0;
    if (lo == 0) {
        seq_push(&alts[n], E_BYTES, '[');
        seq_push(&alts[n], E_RULE, ws);
        seq_push(&alts[n++], E_BYTES, ']');
    }
    if (hi != 0) {
        seq sx = {0};
        seq_push(&sx, E_RULE, ws);
        seq_push(&sx, E_BYTES, ',');
        seq_push(&sx, E_RULE, ws);
        seq_push(&sx, E_RULE, x);
        const int sepx = rule1(b, &sx);
        seq_push(&alts[n], E_BYTES, '[');
        seq_push(&alts[n], E_RULE, ws);
        seq_push(&alts[n], E_RULE, x);
        seq_push(&alts[n], E_RULE, rep(b, sepx, lo > 1 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1));
        seq_push(&alts[n], E_RULE, ws);
        seq_push(&alts[n++], E_BYTES, ']');
    }
    const int r = new_rule(b);
    set_rule(b, r, alts, n);
    return r;
}

/* '{' ws '}' | '{' ws K ws ':' ws V (ws ',' ws K ws ':' ws V)* ws '}': any keys, values v */
static int free_object_rule(builder *b, int v) {
    const int ws = ws_rule(b);
    seq m = {0};
    seq_push(&m, E_RULE, b->string_any ? b->string_any : (b->string_any = string_rule(b, 0, -1)));
    seq_push(&m, E_RULE, ws);
    seq_push(&m, E_BYTES, ':');
    seq_push(&m, E_RULE, ws);
    seq_push(&m, E_RULE, v);
    const int member = rule1(b, &m);
    seq sm = {0};
    seq_push(&sm, E_RULE, ws);
    seq_push(&sm, E_BYTES, ',');
    seq_push(&sm, E_RULE, ws);
    seq_push(&sm, E_RULE, member);
    const int more = rep(b, rule1(b, &sm), 0, -1);
    seq a[2] = {{0}, {0}};
    seq_push(&a[0], E_BYTES, '{');
    seq_push(&a[0], E_RULE, ws);
    seq_push(&a[0], E_BYTES, '}');
    seq_push(&a[1], E_BYTES, '{');
    seq_push(&a[1], E_RULE, ws);
    seq_push(&a[1], E_RULE, member);
    seq_push(&a[1], E_RULE, more);
    seq_push(&a[1], E_RULE, ws);
    seq_push(&a[1], E_BYTES, '}');
    const int r = new_rule(b);
    set_rule(b, r, a, 2);
    return r;
}

/* any JSON value nested d deep (at the limit: scalars and empty containers) */
static int any_rule(builder *b, int d) {
    if (d > LOOM_GRAMMAR_MAX_ANY_DEPTH) d = LOOM_GRAMMAR_MAX_ANY_DEPTH;
    if (b->any[d]) return b->any[d];
    seq a[9] = {{0}};
    int n = 0;
    if (!b->string_any) b->string_any = string_rule(b, 0, -1);
    seq_push(&a[n++], E_RULE, b->string_any);
    seq_push(&a[n++], E_RULE, number_rule(b, 0));
    seq_lit(&a[n++], "true", 4);
    seq_lit(&a[n++], "false", 5);
    seq_lit(&a[n++], "null", 4);
    if (d < LOOM_GRAMMAR_MAX_ANY_DEPTH) {
        const int inner = any_rule(b, d + 1);
        seq_push(&a[n++], E_RULE, free_object_rule(b, inner));
        seq_push(&a[n++], E_RULE, array_rule(b, inner, 0, -1));
    } else {
        seq_lit(&a[n++], "{}", 2);
        seq_lit(&a[n++], "[]", 2);
    }
    const int r = new_rule(b);
    set_rule(b, r, a, n);
    return b->any[d] = r;
}

static int dead_rule(builder *b) { return new_rule(b); /* no alternatives */ }

static int alt_rules(builder *b, const int *rs, int n) {
    if (n == 1) return rs[0];
    seq *a = loom_calloc((size_t)n, sizeof *a);
    for (int i = 0; i < n; i++) seq_push(&a[i], E_RULE, rs[i]);
    const int r = new_rule(b);
    set_rule(b, r, a, n);
    free(a);
    return r;
}

/* ---- schemas --------------------------------------------------------------------------- */

static const char *const IGNORED[] = {"description", "title", "default", "examples", "$schema",
                                      "$id", "$comment", "deprecated", "readOnly", "writeOnly",
                                      "$defs", "definitions", NULL};
static const char *const KNOWN[] = {"type", "properties", "required", "additionalProperties",
                                    "enum", "const", "items", "minItems", "maxItems", "anyOf",
                                    "oneOf", "allOf", "$ref", "minLength", "maxLength", NULL};

static int in_list(const char *k, const char *const *l) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(k, l[i])) return 1;
    return 0;
}

static int compile_schema(builder *b, json_t *s, const char *path, int rd, int nd, int *out);

static int get_count(builder *b, json_t *s, const char *key, const char *path, int *v) {
    json_t *x = json_object_get(s, key);
    if (!x) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 100000)
        return loom_errf(b->err, "%s: '%s' must be an integer in [0, 100000]", path, key);
    *v = (int)json_integer_value(x);
    return 0;
}

static json_t *resolve_ref(builder *b, const char *ref, const char *path) {
    if (!strcmp(ref, "#")) return b->root_schema;
    const char *name = NULL;
    json_t *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) defs = json_object_get(b->root_schema, "$defs"), name = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14))
        defs = json_object_get(b->root_schema, "definitions"), name = ref + 14;
    if (!name) {
        loom_errf(b->err, "%s: $ref '%s': only '#', '#/$defs/NAME' and '#/definitions/NAME' are "
                          "supported", path, ref);
        return NULL;
    }
    /* a JSON pointer token: ~1 is '/', ~0 is '~'; no further '/' */
    char key[256];
    size_t k = 0;
    for (const char *p = name; *p; p++) {
        char c = *p;
        if (c == '/') break;
        if (c == '~' && (p[1] == '0' || p[1] == '1')) c = *++p == '0' ? '~' : '/';
        if (k + 1 >= sizeof key) break;
        key[k++] = c;
    }
    key[k] = 0;
    json_t *d = json_is_object(defs) ? json_object_get(defs, key) : NULL;
    if (!d || strchr(name, '/')) {
        loom_errf(b->err, "%s: $ref '%s' names no definition of the schema", path, ref);
        return NULL;
    }
    return d;
}

static int compile_ref(builder *b, const char *ref, const char *path, int rd, int nd, int *out) {
    json_t *target = resolve_ref(b, ref, path);
    if (!target) return -1;
    if (rd >= LOOM_GRAMMAR_MAX_REF_DEPTH) { /* deeper: not taken (the rule derives nothing) */
        *out = dead_rule(b);
        return 0;
    }
    for (int i = 0; i < b->n_refs; i++)
        if (b->refs[i].depth == rd + 1 && !strcmp(b->refs[i].ref, ref)) {
            *out = b->refs[i].rule;
            return 0;
        }
    int r;
    if (compile_schema(b, target, ref, rd + 1, nd, &r)) return -1;
    if (b->n_refs == b->cap_refs) {
        b->cap_refs = b->cap_refs ? 2 * b->cap_refs : 16;
        b->refs = loom_realloc(b->refs, (size_t)b->cap_refs * sizeof *b->refs);
    }
    b->refs[b->n_refs++] = (refmemo){loom_strdup(ref), rd + 1, r};
    *out = r;
    return 0;
}

static int type_bit(const char *t) {
    static const char *const names[] = {"object", "array", "string", "number", "integer",
                                        "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return 1 << i;
    return 0;
}
enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_NUM = 8, T_INT = 16, T_BOOL = 32, T_NULL = 64 };

static int json_type_bit(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT | T_NUM;
    case JSON_REAL: {
        const double x = json_real_value(v);
        return T_NUM | (fabs(x) < 1e15 && floor(x) == x ? T_INT : 0);
    }
    case JSON_TRUE: case JSON_FALSE: return T_BOOL;
    default: return T_NULL;
    }
}

static int object_rule(builder *b, json_t *s, const char *path, int rd, int nd, int *out) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    char sub[1024];
    if (props && !json_is_object(props))
        return loom_errf(b->err, "%s: 'properties' must be an object", path);
    if (req && !json_is_array(req))
        return loom_errf(b->err, "%s: 'required' must be an array of property names", path);
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return loom_errf(b->err, "%s: 'additionalProperties' must be a boolean or a schema", path);
    size_t i;
    json_t *x;
    json_array_foreach(req, i, x) {
        if (!json_is_string(x)) return loom_errf(b->err, "%s: 'required' must hold strings", path);
        if (!props || !json_object_get(props, json_string_value(x)))
            return loom_errf(b->err, "%s: 'required' names '%s', which is not in 'properties' "
                                     "(only the listed properties are generated)",
                             path, json_string_value(x));
    }
    if (!props) { /* any keys: values of additionalProperties, or anything */
        int v;
        if (json_is_false(addl)) {
            *out = literal_rule(b, "{}", 2);
            return 0;
        }
        if (json_is_object(addl)) {
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            if (compile_schema(b, addl, sub, rd, nd + 1, &v)) return -1;
        } else {
            v = any_rule(b, nd + 1);
        }
        *out = free_object_rule(b, v);
        return 0;
    }
    /* the listed properties, in the schema's order: g_i = the members from i on, at least
     * one; a_i = the members from i on after one was written (each led by a comma) */
    const size_t np = json_object_size(props);
    int *kv = loom_calloc(np + 1, sizeof *kv), *isreq = loom_calloc(np + 1, sizeof *isreq);
    const int ws = ws_rule(b);
    const char *key;
    size_t k = 0;
    json_object_foreach(props, key, x) {
        snprintf(sub, sizeof sub, "%s/properties/%s", path, key);
        int v;
        if (compile_schema(b, x, sub, rd, nd + 1, &v)) {
            free(kv);
            free(isreq);
            return -1;
        }
        json_t *kj = json_string(key);
        char *lit = json_dumps(kj, JSON_ENCODE_ANY | JSON_COMPACT);
        json_decref(kj);
        seq m = {0};
        seq_lit(&m, lit, strlen(lit));
        free(lit);
        seq_push(&m, E_RULE, ws);
        seq_push(&m, E_BYTES, ':');
        seq_push(&m, E_RULE, ws);
        seq_push(&m, E_RULE, v);
        kv[k] = rule1(b, &m);
        json_array_foreach(req, i, x) if (!strcmp(json_string_value(x), key)) isreq[k] = 1;
        k++;
    }
    int a_next = rule1(b, &(seq){0}), g_next = dead_rule(b); /* a_n = "", g_n = nothing */
    for (size_t j = np; j-- > 0;) {
        seq aa[2] = {{0}, {0}}, gg[2] = {{0}, {0}};
        seq_push(&aa[0], E_RULE, ws);
        seq_push(&aa[0], E_BYTES, ',');
        seq_push(&aa[0], E_RULE, ws);
        seq_push(&aa[0], E_RULE, kv[j]);
        seq_push(&aa[0], E_RULE, a_next);
        seq_push(&gg[0], E_RULE, kv[j]);
        seq_push(&gg[0], E_RULE, a_next);
        if (!isreq[j]) {
            seq_push(&aa[1], E_RULE, a_next);
            seq_push(&gg[1], E_RULE, g_next);
        }
        const int a = new_rule(b), g = new_rule(b);
        set_rule(b, a, aa, isreq[j] ? 1 : 2);
        set_rule(b, g, gg, isreq[j] ? 1 : 2);
        free(aa[1].v);
        free(gg[1].v);
        a_next = a;
        g_next = g;
    }
    int any_req = 0;
    for (size_t j = 0; j < np; j++) any_req |= isreq[j];
    free(kv);
    free(isreq);
    seq o[2] = {{0}, {0}};
    int n = 0;
    if (!any_req) {
        seq_push(&o[n], E_BYTES, '{');
        seq_push(&o[n], E_RULE, ws);
        seq_push(&o[n++], E_BYTES, '}');
    }
    seq_push(&o[n], E_BYTES, '{');
    seq_push(&o[n], E_RULE, ws);
    seq_push(&o[n], E_RULE, g_next);
    seq_push(&o[n], E_RULE, ws);
    seq_push(&o[n++], E_BYTES, '}');
    *out = new_rule(b);
    set_rule(b, *out, o, n);
    return 0;
}

/* rd: $ref expansions on the way here; nd: nesting of values (for free-form values) */
static int compile_schema(builder *b, json_t *s, const char *path, int rd, int nd, int *out) {
    char sub[1024];
    if (json_is_true(s)) {
        *out = any_rule(b, nd);
        return 0;
    }
    if (json_is_false(s)) {
        *out = dead_rule(b);
        return 0;
    }
    if (!json_is_object(s)) return loom_errf(b->err, "%s: a schema must be an object or a boolean", path);
    if (nd > 64) return loom_errf(b->err, "%s: the schema nests over 64 levels", path);
    const char *key;
    json_t *v;
    int n_constraints = 0;
    json_object_foreach(s, key, v) {
        if (in_list(key, IGNORED)) continue;
        if (!in_list(key, KNOWN))
            return loom_errf(b->err, "%s: the JSON-schema keyword '%s' is not supported by "
                                     "constrained decoding (docs/inference.md lists the subset)",
                             path, key);
        if (strcmp(key, "type")) n_constraints++;
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return loom_errf(b->err, "%s: '$ref' must be a string", path);
        if (n_constraints > 1 || json_object_get(s, "type"))
            return loom_errf(b->err, "%s: keywords beside '$ref' are not supported", path);
        return compile_ref(b, json_string_value(ref), path, rd, nd, out);
    }
    json_t *allof = json_object_get(s, "allOf");
    if (allof) {
        if (!json_is_array(allof) || json_array_size(allof) != 1 || n_constraints > 1 ||
            json_object_get(s, "type"))
            return loom_errf(b->err, "%s: 'allOf' is supported only with one schema and no "
                                     "other keywords", path);
        snprintf(sub, sizeof sub, "%s/allOf/0", path);
        return compile_schema(b, json_array_get(allof, 0), sub, rd, nd, out);
    }
    json_t *anyof = json_object_get(s, "anyOf");
    const char *anykey = "anyOf";
    if (!anyof) anyof = json_object_get(s, "oneOf"), anykey = "oneOf";
    if (anyof) {
        if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf"))
            return loom_errf(b->err, "%s: 'anyOf' and 'oneOf' together are not supported", path);
        if (!json_is_array(anyof) || json_array_size(anyof) == 0)
            return loom_errf(b->err, "%s: '%s' must be a non-empty array of schemas", path, anykey);
        if (n_constraints > 1 || json_object_get(s, "type"))
            return loom_errf(b->err, "%s: keywords beside '%s' are not supported (put them into "
                                     "each branch)", path, anykey);
        const size_t n = json_array_size(anyof);
        int *rs = loom_calloc(n, sizeof *rs);
        for (size_t i = 0; i < n; i++) {
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, anykey, i);
            if (compile_schema(b, json_array_get(anyof, i), sub, rd, nd, &rs[i])) {
                free(rs);
                return -1;
            }
        }
        *out = alt_rules(b, rs, (int)n);
        free(rs);
        return 0;
    }
    /* the types allowed */
    json_t *type = json_object_get(s, "type");
    int types = 0;
    if (json_is_string(type)) {
        types = type_bit(json_string_value(type));
        if (!types) return loom_errf(b->err, "%s: unknown type '%s'", path, json_string_value(type));
    } else if (json_is_array(type)) {
        size_t i;
        json_array_foreach(type, i, v) {
            const int t = json_is_string(v) ? type_bit(json_string_value(v)) : 0;
            if (!t) return loom_errf(b->err, "%s: 'type' lists something that is not a type name", path);
            types |= t;
        }
        if (!types) return loom_errf(b->err, "%s: 'type' is an empty list: no value has it", path);
    } else if (type) {
        return loom_errf(b->err, "%s: 'type' must be a type name or a list of them", path);
    }
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if (en && cn) return loom_errf(b->err, "%s: 'enum' and 'const' together are not supported", path);
        if (n_constraints > 1)
            return loom_errf(b->err, "%s: '%s' with other keywords (but 'type') is not supported",
                             path, en ? "enum" : "const");
        if (en && (!json_is_array(en) || json_array_size(en) == 0))
            return loom_errf(b->err, "%s: 'enum' must be a non-empty array (an empty one allows "
                                     "no value)", path);
        const size_t n = en ? json_array_size(en) : 1;
        int *rs = loom_calloc(n, sizeof *rs), k = 0;
        for (size_t i = 0; i < n; i++) {
            json_t *val = en ? json_array_get(en, i) : cn;
            if (types && !(json_type_bit(val) & types)) continue;
            char *lit = json_dumps(val, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
            rs[k++] = literal_rule(b, lit, strlen(lit));
            free(lit);
        }
        if (k == 0) {
            free(rs);
            return loom_errf(b->err, "%s: no value of '%s' has the schema's type", path,
                             en ? "enum" : "const");
        }
        *out = alt_rules(b, rs, k);
        free(rs);
        return 0;
    }
    if (!types) { /* no type: what the keywords describe, else any value */
        if (json_object_get(s, "properties") || json_object_get(s, "required") ||
            json_object_get(s, "additionalProperties"))
            types |= T_OBJ;
        if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
            types |= T_ARR;
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) types |= T_STR;
        if (!types) {
            *out = any_rule(b, nd);
            return 0;
        }
    }
    int rs[7], n = 0;
    if (types & T_OBJ) {
        if (object_rule(b, s, path, rd, nd, &rs[n])) return -1;
        n++;
    }
    if (types & T_ARR) {
        int lo = 0, hi = -1, item;
        if (get_count(b, s, "minItems", path, &lo) || get_count(b, s, "maxItems", path, &hi)) return -1;
        if (hi >= 0 && lo > hi)
            return loom_errf(b->err, "%s: minItems %d > maxItems %d: no array satisfies it", path, lo, hi);
        json_t *items = json_object_get(s, "items");
        if (items && !json_is_object(items) && !json_is_boolean(items))
            return loom_errf(b->err, "%s: 'items' must be one schema (tuples, an array of "
                                     "schemas, are not supported)", path);
        snprintf(sub, sizeof sub, "%s/items", path);
        if (items) {
            if (compile_schema(b, items, sub, rd, nd + 1, &item)) return -1;
        } else {
            item = any_rule(b, nd + 1);
        }
        if (json_is_false(items)) hi = 0;
        if (hi == 0 && lo > 0) return loom_errf(b->err, "%s: 'items' is false but minItems is %d", path, lo);
        rs[n++] = array_rule(b, item, lo, hi);
    }
    if (types & T_STR) {
        int lo = 0, hi = -1;
        if (get_count(b, s, "minLength", path, &lo) || get_count(b, s, "maxLength", path, &hi)) return -1;
        if (hi >= 0 && lo > hi)
            return loom_errf(b->err, "%s: minLength %d > maxLength %d: no string satisfies it", path, lo, hi);
        rs[n++] = lo == 0 && hi < 0 ? (b->string_any ? b->string_any : (b->string_any = string_rule(b, 0, -1)))
                                    : string_rule(b, lo, hi);
    }
    if (types & T_NUM) rs[n++] = number_rule(b, 0);
    else if (types & T_INT) rs[n++] = number_rule(b, 1);
    if (types & T_BOOL) {
        const int t = literal_rule(b, "true", 4), f = literal_rule(b, "false", 5);
        rs[n++] = alt_rules(b, (int[]){t, f}, 2);
    }
    if (types & T_NULL) rs[n++] = literal_rule(b, "null", 4);
    *out = alt_rules(b, rs, n);
    return 0;
}

/* ---- finishing: fewest bytes per rule, dead alternatives removed ----------------------- */

static int sat_add(int a, int b) { return a >= INF || b >= INF || a + b >= INF ? INF : a + b; }

static int elem_min(const loom_grammar *g, const gel *e) {
    return e->kind == E_BYTES ? 1 : e->kind == E_RULE ? g->minlen[e->arg] : 0;
}

static int finish_grammar(loom_grammar *g) {
    g->minlen = loom_malloc((size_t)g->n_rules * sizeof *g->minlen);
    for (int r = 0; r < g->n_rules; r++) g->minlen[r] = INF;
    for (int changed = 1; changed;) { /* a fixed point (rules refer to rules made later too) */
        changed = 0;
        for (int r = 0; r < g->n_rules; r++) {
            int best = g->minlen[r];
            for (int a = 0; a < g->rules[r].n_alt; a++) {
                int len = 0;
                for (const gel *e = g->el + g->alts[g->rules[r].alt0 + a]; e->kind != E_END; e++)
                    len = sat_add(len, elem_min(g, e));
                if (len < best) best = len;
            }
            if (best < g->minlen[r]) g->minlen[r] = best, changed = 1;
        }
    }
    /* drop the alternatives that derive nothing */
    for (int r = 0; r < g->n_rules; r++) {
        int k = 0;
        for (int a = 0; a < g->rules[r].n_alt; a++) {
            const int start = g->alts[g->rules[r].alt0 + a];
            int len = 0;
            for (const gel *e = g->el + start; e->kind != E_END; e++) len = sat_add(len, elem_min(g, e));
            if (len < INF) g->alts[g->rules[r].alt0 + k++] = start;
        }
        g->rules[r].n_alt = k;
    }
    g->suffix = loom_malloc((size_t)(g->n_el > 0 ? g->n_el : 1) * sizeof *g->suffix);
    for (int i = g->n_el - 1; i >= 0; i--)
        g->suffix[i] = g->el[i].kind == E_END ? 0 : sat_add(elem_min(g, &g->el[i]), g->suffix[i + 1]);
    return g->minlen[g->root] < INF ? 0 : -1;
}

/* ---- specs, sources, compilation ------------------------------------------------------- */

static void grammar_free(loom_grammar *g) {
    if (!g) return;
    free(g->el);
    free(g->suffix);
    free(g->alts);
    free(g->rules);
    free(g->minlen);
    free(g->cls);
    free(g->source);
    free(g);
}

/* the canonical source of spec: {"parts":[{"literal":S}|{"schema":V}|{"json_object":true}],
 * "separator":S,"min":N,"max":N} */
static char *spec_source(const loom_grammar_spec *sp, loom_err *err) {
    if (sp->n_parts < 1 || sp->n_parts > 64) {
        loom_errf(err, "a grammar has 1 to 64 parts");
        return NULL;
    }
    int lo = sp->min_reps, hi = sp->max_reps;
    if (lo == 0 && hi == 0) lo = hi = 1;
    if (lo < 1 || hi < lo || hi > LOOM_GRAMMAR_MAX_CALLS) {
        loom_errf(err, "a grammar's body repeats 1 to %d times (asked: %d to %d)",
                  LOOM_GRAMMAR_MAX_CALLS, sp->min_reps, sp->max_reps);
        return NULL;
    }
    json_t *parts = json_array();
    for (int i = 0; i < sp->n_parts; i++) {
        const loom_grammar_part *p = &sp->parts[i];
        json_t *o;
        if (p->literal) {
            o = json_pack("{s:s}", "literal", p->literal);
            if (!o) {
                loom_errf(err, "grammar part %d: the literal is not valid UTF-8", i);
                json_decref(parts);
                return NULL;
            }
        } else if (p->schema) {
            json_error_t je;
            json_t *s = json_loads(p->schema, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
            if (!s) {
                loom_errf(err, "the schema is not valid JSON: %s (line %d, column %d)", je.text,
                          je.line, je.column);
                json_decref(parts);
                return NULL;
            }
            o = json_pack("{s:o}", "schema", s);
        } else {
            o = json_pack("{s:b}", "json_object", 1);
        }
        json_array_append_new(parts, o);
    }
    json_t *src = json_pack("{s:o,s:s,s:i,s:i}", "parts", parts, "separator",
                            sp->separator ? sp->separator : "", "min", lo, "max", hi);
    if (!src) {
        loom_errf(err, "the separator is not valid UTF-8");
        return NULL;
    }
    char *text = json_dumps(src, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(src);
    return text;
}

static int compile_json(json_t *src, const char *text, loom_grammar **out, loom_err *err) {
    json_t *parts = json_object_get(src, "parts");
    json_t *sep = json_object_get(src, "separator");
    const int lo = (int)json_integer_value(json_object_get(src, "min"));
    const int hi = (int)json_integer_value(json_object_get(src, "max"));
    if (!json_is_array(parts) || !json_is_string(sep) || lo < 1 || hi < lo || hi > LOOM_GRAMMAR_MAX_CALLS)
        return loom_errf(err, "a grammar source is malformed");
    loom_grammar *g = loom_calloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    g->cap_cls = 512;
    g->cls = loom_calloc((size_t)g->cap_cls, sizeof *g->cls);
    for (int c = 0; c < 256; c++) g->cls[c][c >> 5] = 1u << (c & 31);
    g->n_cls = 256;
    builder b = {.g = g, .err = err};
    new_rule(&b); /* rule 0: never used (0 means "not built yet" in the builder's caches) */
    seq body = {0};
    size_t i;
    json_t *p;
    int rc = 0;
    json_array_foreach(parts, i, p) {
        json_t *lit = json_object_get(p, "literal"), *s = json_object_get(p, "schema");
        if (json_is_string(lit)) {
            seq_lit(&body, json_string_value(lit), json_string_length(lit));
            continue;
        }
        int r;
        if (s) {
            b.root_schema = s;
            rc = compile_schema(&b, s, "#", 0, 0, &r);
            for (int k = 0; k < b.n_refs; k++) free(b.refs[k].ref);
            b.n_refs = 0;
            if (rc) break;
        } else {
            r = free_object_rule(&b, any_rule(&b, 1)); /* any object */
        }
        seq_push(&body, E_RULE, r);
    }
    free(b.refs);
    if (rc) {
        free(body.v);
        grammar_free(g);
        return -1;
    }
    const int one = rule1(&b, &body);
    int root = one;
    if (hi > 1) {
        seq more = {0};
        seq_lit(&more, json_string_value(sep), json_string_length(sep));
        seq_push(&more, E_RULE, one);
        seq top = {0};
        seq_push(&top, E_RULE, one);
        seq_push(&top, E_RULE, rep(&b, rule1(&b, &more), lo - 1, hi - 1));
        root = rule1(&b, &top);
    }
    g->root = root;
    if (b.too_big) {
        grammar_free(g);
        return loom_errf(err, "the schema compiles to a grammar of over %d elements (lower its "
                              "maxLength / maxItems)", MAX_ELEMS);
    }
    if (finish_grammar(g)) {
        grammar_free(g);
        return loom_errf(err, "the schema is unsatisfiable: no document matches it (within "
                              "loom's bounds: $ref nested at most %d deep)",
                         LOOM_GRAMMAR_MAX_REF_DEPTH);
    }
    g->source = loom_strdup(text);
    *out = g;
    return 0;
}

int loom_grammar_compile_source(const char *source, loom_grammar **out, loom_err *err) {
    *out = NULL;
    json_error_t je;
    json_t *src = json_loads(source, JSON_REJECT_DUPLICATES, &je);
    if (!src) return loom_errf(err, "a grammar source is not JSON: %s", je.text);
    const int rc = compile_json(src, source, out, err);
    json_decref(src);
    return rc;
}

int loom_grammar_compile(const loom_grammar_spec *spec, loom_grammar **out, loom_err *err) {
    *out = NULL;
    char *text = spec_source(spec, err);
    if (!text) return -1;
    const int rc = loom_grammar_compile_source(text, out, err);
    free(text);
    return rc;
}

const char *loom_grammar_source(const loom_grammar *g) { return g->source; }
int loom_grammar_min_bytes(const loom_grammar *g) { return g->minlen[g->root]; }

loom_grammar *loom_grammar_ref(loom_grammar *g) {
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void loom_grammar_unref(loom_grammar *g) {
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) grammar_free(g);
}

/* ---- the cache ------------------------------------------------------------------------- */

typedef struct centry {
    loom_grammar *g;
    uint64_t used;
} centry;

struct loom_grammar_cache {
    pthread_mutex_t mu;
    centry *e;
    int n, cap;
    uint64_t clock;
    int64_t hits, compiled;
};

loom_grammar_cache *loom_grammar_cache_new(int capacity) {
    loom_grammar_cache *c = loom_calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->cap = capacity > 0 ? capacity : 16;
    c->e = loom_calloc((size_t)c->cap, sizeof *c->e);
    return c;
}

void loom_grammar_cache_free(loom_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) loom_grammar_unref(c->e[i].g);
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void loom_grammar_cache_stats(const loom_grammar_cache *c, int64_t *hits, int64_t *compiled) {
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    if (hits) *hits = c->hits;
    if (compiled) *compiled = c->compiled;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
}

int loom_grammar_cache_get(loom_grammar_cache *c, const loom_grammar_spec *spec,
                           loom_grammar **out, loom_err *err) {
    *out = NULL;
    if (!c) return loom_grammar_compile(spec, out, err);
    char *key = spec_source(spec, err);
    if (!key) return -1;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].g->source, key)) {
            c->e[i].used = ++c->clock;
            c->hits++;
            *out = loom_grammar_ref(c->e[i].g);
            pthread_mutex_unlock(&c->mu);
            free(key);
            return 0;
        }
    pthread_mutex_unlock(&c->mu);
    /* compiled outside the lock (a big schema takes a while); two threads may both compile */
    loom_grammar *g;
    const int rc = loom_grammar_compile_source(key, &g, err);
    free(key);
    if (rc) return -1;
    pthread_mutex_lock(&c->mu);
    c->compiled++;
    int slot = c->n;
    if (c->n == c->cap) { /* the least recently used goes */
        slot = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[slot].used) slot = i;
        loom_grammar_unref(c->e[slot].g);
    } else {
        c->n++;
    }
    c->e[slot] = (centry){loom_grammar_ref(g), ++c->clock};
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return 0;
}

int loom_grammar_json(loom_grammar_cache *c, const char *schema_json, loom_grammar **out,
                      loom_err *err) {
    const loom_grammar_part part = {NULL, schema_json};
    const loom_grammar_spec spec = {&part, 1, NULL, 1, 1};
    return loom_grammar_cache_get(c, &spec, out, err);
}

int loom_grammar_tool_calls(const char *prefix, const char *schema_json, const char *suffix,
                            const char *separator, int max_calls, loom_grammar_cache *c,
                            loom_grammar **out, loom_err *err) {
    const loom_grammar_part parts[3] = {{prefix ? prefix : "", NULL}, {NULL, schema_json},
                                        {suffix ? suffix : "", NULL}};
    if (!schema_json) {
        *out = NULL;
        return loom_errf(err, "tool calls need a schema");
    }
    const loom_grammar_spec spec = {parts, 3, separator, 1, max_calls};
    return loom_grammar_cache_get(c, &spec, out, err);
}

/* ---- the automaton --------------------------------------------------------------------- */

typedef struct gframe {
    int32_t pos, dist;        /* element to continue at; fewest bytes that empty this stack */
    const struct gframe *up;  /* where to continue after this alternative; NULL: the end */
} gframe;

/* a bump arena of chunks with marks (released in stack order) */
typedef struct arena {
    char **chunk;
    int n_chunk, cur;
    size_t off;
} arena;
enum { CHUNK = 1 << 16 };

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    LOOM_CHECK(n <= CHUNK);
    if (a->n_chunk == 0 || a->off + n > CHUNK) {
        if (a->n_chunk > 0) a->cur++;
        if (a->cur >= a->n_chunk) {
            a->chunk = loom_realloc(a->chunk, (size_t)(a->n_chunk + 1) * sizeof *a->chunk);
            a->chunk[a->n_chunk++] = loom_malloc(CHUNK);
            a->cur = a->n_chunk - 1;
        }
        a->off = 0;
    }
    void *p = a->chunk[a->cur] + a->off;
    a->off += n;
    return p;
}
typedef struct amark {
    int cur;
    size_t off;
} amark;
static amark arena_mark(const arena *a) { return (amark){a->cur, a->off}; }
static void arena_release(arena *a, amark m) {
    a->cur = m.cur;
    a->off = m.off;
}
static void arena_free(arena *a) {
    for (int i = 0; i < a->n_chunk; i++) free(a->chunk[i]);
    free(a->chunk);
    *a = (arena){0};
}

/* a state under construction: frames with a byte class on top */
typedef struct gset {
    const gframe **f;
    int n, accept, dist;
} gset;

typedef struct builder_ctx {
    const loom_grammar *g;
    arena *a;
    gset *out;
    int expand; /* closure steps (a guard) */
} ctx;

static int same_stack(const gframe *x, const gframe *y) {
    for (int k = 0; x != y; k++) {
        if (!x || !y || x->pos != y->pos || k > 256) return 0;
        x = x->up;
        y = y->up;
    }
    return 1;
}

static void add_frame(ctx *c, const gframe *f) {
    gset *o = c->out;
    for (int i = 0; i < o->n; i++)
        if (same_stack(o->f[i], f)) return;
    if (o->n == MAX_FRAMES) return; /* dropped: every stack kept is still a valid parse */
    o->f[o->n++] = f;
    if (f->dist < o->dist) o->dist = f->dist;
}

static const gframe *new_frame(ctx *c, int pos, const gframe *up) {
    gframe *f = arena_alloc(c->a, sizeof *f);
    f->pos = pos;
    f->up = up;
    f->dist = sat_add(c->g->suffix[pos], up ? up->dist : 0);
    return f;
}

/* continue at pos (a non-END element) with return frame up */
static void closure(ctx *c, int pos, const gframe *up, const gframe *self);

/* continue with a return frame (NULL: the document is complete) */
static void resume(ctx *c, const gframe *up) {
    if (!up) {
        c->out->accept = 1;
        c->out->dist = 0;
        return;
    }
    closure(c, up->pos, up->up, up);
}

static void closure(ctx *c, int pos, const gframe *up, const gframe *self) {
    if (++c->expand > MAX_EXPAND) return;
    const gel *e = &c->g->el[pos];
    if (e->kind == E_BYTES) {
        add_frame(c, self ? self : new_frame(c, pos, up));
        return;
    }
    LOOM_CHECK(e->kind == E_RULE);
    const gframe *ret = e[1].kind == E_END ? up : new_frame(c, pos + 1, up);
    const grule *r = &c->g->rules[e->arg];
    for (int a = 0; a < r->n_alt; a++) {
        const int start = c->g->alts[r->alt0 + a];
        if (c->g->el[start].kind == E_END) resume(c, ret);
        else closure(c, start, ret, NULL);
    }
}

static void set_init(gset *s, const gframe **store) {
    s->f = store;
    s->n = 0;
    s->accept = 0;
    s->dist = INF;
}

/* s advanced by byte ch into out */
static void advance(const loom_grammar *g, arena *a, const gset *s, unsigned ch, gset *out) {
    ctx c = {g, a, out, 0};
    for (int i = 0; i < s->n; i++) {
        const gframe *f = s->f[i];
        const uint32_t *cl = g->cls[g->el[f->pos].arg];
        if (!(cl[ch >> 5] >> (ch & 31) & 1)) continue;
        if (g->el[f->pos + 1].kind == E_END) resume(&c, f->up);
        else closure(&c, f->pos + 1, f->up, NULL);
    }
}

/* ---- per-request state ----------------------------------------------------------------- */

struct loom_grammar_state {
    loom_grammar *g;
    arena a;          /* holds the frames of cur (and older ones until compacted) */
    gset cur;
    const gframe *store[MAX_FRAMES];
    size_t live;      /* frames copied at the last compaction */
    int steps;
};

/* copies the frames of s into a fresh arena (chains shared as before: a memo of copies) */
typedef struct memo {
    const gframe **from;
    gframe **to;
    int n, cap;
} memo;

static const gframe *copy_frame(memo *m, arena *a, const gframe *f) {
    if (!f) return NULL;
    for (int i = m->n - 1; i >= 0 && i >= m->n - 64; i--) /* recent copies: shared tails */
        if (m->from[i] == f) return m->to[i];
    gframe *c = arena_alloc(a, sizeof *c);
    c->pos = f->pos;
    c->dist = f->dist;
    c->up = copy_frame(m, a, f->up);
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 64;
        m->from = loom_realloc(m->from, (size_t)m->cap * sizeof *m->from);
        m->to = loom_realloc(m->to, (size_t)m->cap * sizeof *m->to);
    }
    m->from[m->n] = f;
    m->to[m->n++] = c;
    return c;
}

static void compact(loom_grammar_state *s) {
    arena fresh = {0};
    memo m = {0};
    for (int i = 0; i < s->cur.n; i++) s->store[i] = copy_frame(&m, &fresh, s->store[i]);
    s->live = (size_t)m.n;
    free(m.from);
    free(m.to);
    arena_free(&s->a);
    s->a = fresh;
}

loom_grammar_state *loom_grammar_state_new(loom_grammar *g) {
    loom_grammar_state *s = loom_calloc(1, sizeof *s);
    s->g = loom_grammar_ref(g);
    set_init(&s->cur, s->store);
    ctx c = {g, &s->a, &s->cur, 0};
    const grule *r = &g->rules[g->root];
    for (int a = 0; a < r->n_alt; a++) {
        const int start = g->alts[r->alt0 + a];
        if (g->el[start].kind == E_END) resume(&c, NULL);
        else closure(&c, start, NULL, NULL);
    }
    return s;
}

void loom_grammar_state_free(loom_grammar_state *s) {
    if (!s) return;
    arena_free(&s->a);
    loom_grammar_unref(s->g);
    free(s);
}

int loom_grammar_state_advance(loom_grammar_state *s, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    const gframe *tmp[2][MAX_FRAMES];
    gset from = s->cur, to;
    const amark m0 = arena_mark(&s->a);
    for (size_t i = 0; i < n; i++) {
        set_init(&to, tmp[i & 1]);
        advance(s->g, &s->a, &from, p[i], &to);
        if (to.n == 0 && !(to.accept && i + 1 == n)) {
            arena_release(&s->a, m0);
            return -1;
        }
        from = to;
    }
    if (n == 0) return 0;
    memcpy(s->store, from.f, (size_t)from.n * sizeof *from.f);
    s->cur = from;
    s->cur.f = s->store;
    if (++s->steps % 64 == 0) compact(s); /* the frames no longer reachable go */
    return 0;
}

int loom_grammar_state_complete(const loom_grammar_state *s) { return s->cur.accept; }
int loom_grammar_state_terminal(const loom_grammar_state *s) { return s->cur.accept && s->cur.n == 0; }
int loom_grammar_state_min_bytes(const loom_grammar_state *s) { return s->cur.dist; }

/* ---- vocabularies and masks ------------------------------------------------------------ */

struct loom_grammar_vocab {
    int n;
    int32_t eos;
    char *bytes;        /* every token's bytes */
    size_t *off;        /* (n + 1) */
    /* the trie, in preorder: node 0 is the root */
    int n_nodes;
    uint8_t *nbyte;
    int32_t *depth, *end, *tok0; /* end: the node after its subtree; tokens: tok_ids[tok0[i] .. tok0[i+1]) */
    int32_t *tok_ids;
    int max_depth;
    int has_bytes;
};

typedef struct sorted_tok {
    const char *p;
    size_t n;
    int32_t id;
} sorted_tok;

static int tok_cmp(const void *a, const void *b) {
    const sorted_tok *x = a, *y = b;
    const size_t n = x->n < y->n ? x->n : y->n;
    const int c = memcmp(x->p, y->p, n);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

loom_grammar_vocab *loom_grammar_vocab_new(const char *const *bytes, const size_t *lens, int n,
                                           int32_t eos) {
    loom_grammar_vocab *v = loom_calloc(1, sizeof *v);
    v->n = n;
    v->eos = eos;
    v->off = loom_calloc((size_t)n + 1, sizeof *v->off);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += bytes[i] && i != eos ? lens[i] : 0;
    v->bytes = loom_malloc(total + 1);
    int m = 0;
    for (int i = 0; i < n; i++) {
        const size_t l = bytes[i] && i != eos ? lens[i] : 0;
        memcpy(v->bytes + v->off[i], l ? bytes[i] : "", l);
        v->off[i + 1] = v->off[i] + l;
        m += l > 0;
    }
    sorted_tok *st = loom_malloc((size_t)(m > 0 ? m : 1) * sizeof *st);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i]) st[k++] = (sorted_tok){v->bytes + v->off[i], v->off[i + 1] - v->off[i], i};
    qsort(st, (size_t)m, sizeof *st, tok_cmp);
    /* nodes: at most 1 + total bytes */
    size_t cap = 1;
    for (int i = 0; i < m; i++) cap += st[i].n;
    v->nbyte = loom_calloc(cap, 1);
    v->depth = loom_calloc(cap, sizeof *v->depth);
    v->end = loom_calloc(cap, sizeof *v->end);
    v->tok0 = loom_calloc(cap + 1, sizeof *v->tok0);
    v->tok_ids = loom_malloc((size_t)(m > 0 ? m : 1) * sizeof *v->tok_ids);
    int32_t *path = loom_malloc((cap + 1) * sizeof *path); /* node at each depth of the path */
    int nn = 1, plen = 0, nt = 0; /* path[0..plen): nodes of depth 1..plen */
    const char *prev = NULL;
    size_t prev_n = 0;
    for (int i = 0; i < m; i++) {
        size_t lcp = 0;
        while (prev && lcp < prev_n && lcp < st[i].n && prev[lcp] == st[i].p[lcp]) lcp++;
        while ((size_t)plen > lcp) v->end[path[--plen]] = nn;
        for (size_t d = lcp; d < st[i].n; d++) {
            v->nbyte[nn] = (uint8_t)st[i].p[d];
            v->depth[nn] = (int32_t)d + 1;
            v->tok0[nn] = nt;
            path[plen++] = nn++;
        }
        /* the token ends at the path's last node: tokens are grouped by node (sorted) */
        v->tok_ids[nt++] = st[i].id;
        v->tok0[nn] = nt;
        if ((int)st[i].n > v->max_depth) v->max_depth = (int)st[i].n;
        prev = st[i].p;
        prev_n = st[i].n;
    }
    while (plen > 0) v->end[path[--plen]] = nn;
    v->end[0] = nn;
    v->n_nodes = nn;
    free(path);
    free(st);
    /* the bytes a shortest completion may need, each a token of its own */
    int have[256] = {0};
    for (int i = 0; i < n; i++)
        if (v->off[i + 1] - v->off[i] == 1) have[(unsigned char)v->bytes[v->off[i]]] = 1;
    v->has_bytes = have['\t'] && have['\n'] && have['\r'];
    for (int c = 0x20; c < 0x7f; c++) v->has_bytes &= have[c];
    for (int c = 0x80; c < 0xc0; c++) v->has_bytes &= have[c];
    return v;
}

int loom_grammar_vocab_from_tokenizer(const loom_tokenizer *tok, int n_ids, int32_t eos,
                                      loom_grammar_vocab **out, loom_err *err) {
    *out = NULL;
    const int tv = (int)loom_tokenizer_vocab_size(tok);
    char **b = loom_calloc((size_t)(n_ids > 0 ? n_ids : 1), sizeof *b);
    size_t *l = loom_calloc((size_t)(n_ids > 0 ? n_ids : 1), sizeof *l);
    int rc = 0;
    for (int32_t i = 0; i < n_ids && i < tv; i++) {
        if (loom_tokenizer_is_added(tok, i)) continue;
        if (loom_tokenizer_decode_ex(tok, &i, 1, LOOM_TOK_CONTINUE, &b[i], &l[i], err)) {
            rc = -1;
            break;
        }
    }
    if (rc == 0) *out = loom_grammar_vocab_new((const char *const *)b, l, n_ids, eos);
    for (int i = 0; i < n_ids; i++) free(b[i]);
    free(b);
    free(l);
    return rc;
}

void loom_grammar_vocab_free(loom_grammar_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->nbyte);
    free(v->depth);
    free(v->end);
    free(v->tok0);
    free(v->tok_ids);
    free(v);
}

int loom_grammar_vocab_size(const loom_grammar_vocab *v) { return v->n; }
int loom_grammar_vocab_has_bytes(const loom_grammar_vocab *v) { return v->has_bytes; }

const char *loom_grammar_vocab_token(const loom_grammar_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n || v->off[id + 1] == v->off[id]) {
        *len = 0;
        return NULL;
    }
    *len = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

struct loom_grammar_scratch {
    arena a;
    const gframe **store; /* (max depth + 1) x MAX_FRAMES */
    gset *sets;
    amark *marks;
    int depth_cap;
};

loom_grammar_scratch *loom_grammar_scratch_new(void) { return loom_calloc(1, sizeof(loom_grammar_scratch)); }

void loom_grammar_scratch_free(loom_grammar_scratch *sc) {
    if (!sc) return;
    arena_free(&sc->a);
    free(sc->store);
    free(sc->sets);
    free(sc->marks);
    free(sc);
}

int loom_grammar_mask(const loom_grammar_state *s, const loom_grammar_vocab *v, int budget,
                      uint8_t *allow, loom_grammar_scratch *sc) {
    memset(allow, 0, (size_t)v->n);
    const int D = v->max_depth + 1;
    if (sc->depth_cap < D) {
        free(sc->store);
        free(sc->sets);
        free(sc->marks);
        sc->store = loom_malloc((size_t)D * MAX_FRAMES * sizeof *sc->store);
        sc->sets = loom_malloc((size_t)D * sizeof *sc->sets);
        sc->marks = loom_malloc((size_t)(D + 1) * sizeof *sc->marks);
        sc->depth_cap = D;
    }
    int n_allowed = 0;
    if (v->eos >= 0 && v->eos < v->n && s->cur.accept && budget >= 1) allow[v->eos] = 1, n_allowed++;
    if (budget < 1 || s->cur.n == 0) return n_allowed;
    arena_release(&sc->a, (amark){0, 0});
    sc->sets[0] = s->cur;
    sc->marks[1] = arena_mark(&sc->a);
    const loom_grammar *g = s->g;
    for (int i = 1; i < v->n_nodes;) {
        const int d = v->depth[i];
        arena_release(&sc->a, sc->marks[d]);
        gset *out = &sc->sets[d];
        set_init(out, sc->store + (size_t)d * MAX_FRAMES);
        advance(g, &sc->a, &sc->sets[d - 1], v->nbyte[i], out);
        if (out->n == 0 && !out->accept) {
            i = v->end[i]; /* nothing below continues either */
            continue;
        }
        sc->marks[d + 1] = arena_mark(&sc->a);
        if (v->tok0[i + 1] > v->tok0[i] && out->dist <= budget - 1)
            for (int t = v->tok0[i]; t < v->tok0[i + 1]; t++) allow[v->tok_ids[t]] = 1, n_allowed++;
        if (out->n == 0) i = v->end[i]; /* complete, nothing can follow: no longer token fits */
        else i++;
    }
    return n_allowed;
}
