/* Grammars from JSON schemas and literal parts: the rules (include/loom/grammar.h; the
 * design in grammar.c's opening comment). Every builder function appends rules to the grammar
 * and returns the id of the rule that derives its construct; errors name the schema's keyword
 * and its place (a JSON pointer). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/grammar_internal.h"

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
    int depth;           /* compile_schema calls nested now (anyOf, $ref and all) */
    /* every schema compiled, for explaining an unsatisfiable one: its place, its rule, the
     * schema it is part of, and whether the parent needs it (a required property, the items
     * of an array with minItems > 0, a branch of anyOf, a $ref's target) */
    struct snode {
        char *path;
        const char *why;
        int rule, parent, mandatory;
    } *nodes;
    int n_nodes, cap_nodes, cur, mand;
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

/* (format: an annotation in JSON Schema 2020-12, asserted only by validators asked to; the
 * schemas pydantic and agent frameworks write carry it on dates, e-mails, URIs) */
static const char *const IGNORED[] = {"description", "title", "default", "examples", "$schema",
                                      "$id", "$comment", "deprecated", "readOnly", "writeOnly",
                                      "$defs", "definitions", "format", NULL};
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
        if (b->cur >= 0) b->nodes[b->cur].why = "its $ref recursion goes deeper than 8 expansions";
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
    json_t *x, *x2;
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
            b->mand = 0; /* {} needs no value */
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
        b->mand = 0;
        json_array_foreach(req, i, x2) if (!strcmp(json_string_value(x2), key)) b->mand = 1;
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

static int compile_schema1(builder *b, json_t *s, const char *path, int rd, int nd, int *out);

/* rd: $ref expansions on the way here; nd: nesting of values (for free-form values). The
 * nesting of calls is bounded (a schema is untrusted: nested anyOf must not overflow a
 * connection thread's stack) */
static int compile_schema(builder *b, json_t *s, const char *path, int rd, int nd, int *out) {
    if (b->depth >= 64) return loom_errf(b->err, "%s: the schema nests over 64 levels", path);
    if (b->n_nodes == b->cap_nodes) {
        b->cap_nodes = b->cap_nodes ? 2 * b->cap_nodes : 64;
        b->nodes = loom_realloc(b->nodes, (size_t)b->cap_nodes * sizeof *b->nodes);
    }
    const int me = b->n_nodes++, parent = b->cur;
    b->nodes[me] = (struct snode){loom_strdup(path), NULL, -1, parent, b->mand};
    b->mand = 1;
    b->cur = me;
    b->depth++;
    const int rc = compile_schema1(b, s, path, rd, nd, out);
    b->depth--;
    b->cur = parent;
    b->mand = 1;
    if (rc == 0) b->nodes[me].rule = *out;
    return rc;
}

/* why no document matches (after grammar_finish found the root dead): the deepest schema on a
 * chain of dead ones that their parents need */
static void explain_dead(const builder *b, const loom_grammar *g, char *buf, size_t n) {
    int at = -1;
    for (int i = 0; i < b->n_nodes && at < 0; i++)
        if (b->nodes[i].parent < 0 && b->nodes[i].rule >= 0 && g->minlen[b->nodes[i].rule] >= INF) at = i;
    for (int moved = at >= 0; moved;) {
        moved = 0;
        for (int i = at + 1; i < b->n_nodes; i++)
            if (b->nodes[i].parent == at && b->nodes[i].mandatory && b->nodes[i].rule >= 0 &&
                g->minlen[b->nodes[i].rule] >= INF) {
                at = i;
                moved = 1;
                break;
            }
    }
    if (at < 0) {
        snprintf(buf, n, "the schema admits no document");
        return;
    }
    snprintf(buf, n, "%s admits no value%s%s", b->nodes[at].path, b->nodes[at].why ? ": " : "",
             b->nodes[at].why ? b->nodes[at].why : "");
}

static int compile_schema1(builder *b, json_t *s, const char *path, int rd, int nd, int *out) {
    char sub[1024];
    if (json_is_true(s)) {
        *out = any_rule(b, nd);
        return 0;
    }
    if (json_is_false(s)) {
        if (b->cur >= 0) b->nodes[b->cur].why = "the schema is false";
        *out = dead_rule(b);
        return 0;
    }
    if (!json_is_object(s)) return loom_errf(b->err, "%s: a schema must be an object or a boolean", path);
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
            b->mand = lo > 0;
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


int grammar_build(json_t *src, const char *text, loom_grammar **out, loom_err *err) {
    json_t *parts = json_object_get(src, "parts");
    json_t *sep = json_object_get(src, "separator");
    const int lo = (int)json_integer_value(json_object_get(src, "min"));
    const int hi = (int)json_integer_value(json_object_get(src, "max"));
    if (!json_is_array(parts) || !json_is_string(sep) || lo < 1 || hi < lo || hi > LOOM_GRAMMAR_MAX_CALLS)
        return loom_errf(err, "a grammar source is malformed");
    loom_grammar *g = loom_calloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    g->id = grammar_next_id();
    g->cap_cls = 512;
    g->cls = loom_calloc((size_t)g->cap_cls, sizeof *g->cls);
    for (int c = 0; c < 256; c++) g->cls[c][c >> 5] = 1u << (c & 31);
    g->n_cls = 256;
    builder b = {.g = g, .err = err, .cur = -1, .mand = 1};
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
        for (int k = 0; k < b.n_nodes; k++) free(b.nodes[k].path);
        free(b.nodes);
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
        for (int k = 0; k < b.n_nodes; k++) free(b.nodes[k].path);
        free(b.nodes);
        grammar_free(g);
        return loom_errf(err, "the schema compiles to a grammar of over %d elements (lower its "
                              "maxLength / maxItems)", MAX_ELEMS);
    }
    const int dead = grammar_finish(g);
    char why[1200] = "";
    if (dead) explain_dead(&b, g, why, sizeof why);
    for (int k = 0; k < b.n_nodes; k++) free(b.nodes[k].path);
    free(b.nodes);
    if (dead) {
        grammar_free(g);
        return loom_errf(err, "the schema is unsatisfiable: no document matches it (%s)", why);
    }
    g->source = loom_strdup(text);
    *out = g;
    return 0;
}
