/* The compiled form of a grammar, shared by grammar.c (specs, sources, the cache),
 * grammar_build.c (schemas to rules) and grammar_run.c (the automaton, masks). */
#ifndef LOOM_INFER_GRAMMAR_INTERNAL_H
#define LOOM_INFER_GRAMMAR_INTERNAL_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

#include "loom/grammar.h"

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
    uint64_t id;      /* unique in the process (mask caches key on it, never on an address) */
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

/* a process-unique id for grammars and vocabularies */
uint64_t grammar_next_id(void);

static inline int sat_add(int a, int b) { return a >= INF || b >= INF || a + b >= INF ? INF : a + b; }

/* grammar_build.c: compiles a parsed source (loom_grammar_source's form) */
int grammar_build(json_t *src, const char *text, loom_grammar **out, loom_err *err);
/* grammar.c: fewest bytes per rule and element, rules deriving nothing dropped; -1 when the
 * root derives nothing. grammar_free frees a grammar (not reference counted). */
int grammar_finish(loom_grammar *g);
void grammar_free(loom_grammar *g);

#endif
