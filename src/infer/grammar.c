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
 * of its stacks'. Mask computation (grammar_run.c) walks the vocabulary's trie depth first
 * with the state, pruning a subtree as soon as its state is dead, and runs the automaton as a
 * DFA built on the fly: frames and states are interned, each state's transitions computed
 * once per mask.
 *
 * Files: grammar.c (specs, sources, finishing, the cache), grammar_build.c (schemas to
 * rules), grammar_run.c (states, vocabularies, masks), grammar_internal.h (the compiled
 * form). */
#define _GNU_SOURCE
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "infer/grammar_internal.h"

/* ---- finishing: fewest bytes per rule, dead alternatives removed ----------------------- */

static int elem_min(const loom_grammar *g, const gel *e) {
    return e->kind == E_BYTES ? 1 : e->kind == E_RULE ? g->minlen[e->arg] : 0;
}

int grammar_finish(loom_grammar *g) {
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

uint64_t grammar_next_id(void) {
    static atomic_ullong next = 1;
    return atomic_fetch_add(&next, 1);
}

void grammar_free(loom_grammar *g) {
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

int loom_grammar_compile_source(const char *source, loom_grammar **out, loom_err *err) {
    *out = NULL;
    json_error_t je;
    json_t *src = json_loads(source, JSON_REJECT_DUPLICATES, &je);
    if (!src) return loom_errf(err, "a grammar source is not JSON: %s", je.text);
    const int rc = grammar_build(src, source, out, err);
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
