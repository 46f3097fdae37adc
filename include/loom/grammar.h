/* loom grammars: constrained decoding to JSON, a JSON schema, or a sequence of literal text and
 * schema-matching JSON values (tool calls). docs/inference.md, "Structured output".
 *
 * A grammar is compiled once (a context-free grammar over bytes, run as a pushdown automaton
 * whose stacks are shared lists of positions), immutable, reference-counted and shareable
 * between requests and threads. A loom_grammar_state (per request, small) is the set of the
 * automaton's stacks after the text so far. A loom_grammar_vocab (per tokenizer) is a trie of
 * the tokens' byte strings; loom_grammar_mask walks it with a state and says which tokens can
 * continue the text. Schemas are untrusted input: every compile error names the keyword and
 * where it is (a JSON pointer into the schema). */
#ifndef LOOM_GRAMMAR_H
#define LOOM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "loom/base.h"

struct loom_tokenizer;

/* the bounds the compiled grammars keep (documented in docs/inference.md) */
enum {
    LOOM_GRAMMAR_MAX_WS = 4,         /* whitespace bytes at most between two JSON tokens */
    LOOM_GRAMMAR_MAX_REF_DEPTH = 8,  /* $ref expansions nested at most (deeper: not taken) */
    LOOM_GRAMMAR_MAX_ANY_DEPTH = 6,  /* nesting of free-form values (any JSON, {} schemas) */
    LOOM_GRAMMAR_MAX_DIGITS = 15,    /* digits of an integer part / fraction (exponent: 3) */
    LOOM_GRAMMAR_MAX_CALLS = 64,     /* repetitions of a sequence grammar's body */
};

typedef struct loom_grammar loom_grammar;

/* One part of a grammar's body: literal text (literal != NULL), a JSON value matching a JSON
 * schema (schema: its JSON text), or, with both NULL, any JSON object. */
typedef struct loom_grammar_part {
    const char *literal;
    const char *schema;
} loom_grammar_part;

/* A grammar: the body (parts in order) repeated min_reps..max_reps times (both 0: once), the
 * repetitions joined by separator (NULL or "": nothing). Nothing may precede or follow. */
typedef struct loom_grammar_spec {
    const loom_grammar_part *parts;
    int n_parts;
    const char *separator;
    int min_reps, max_reps;
} loom_grammar_spec;

/* Compiles spec (a new grammar with one reference in *out). An unsupported keyword, a schema
 * no document satisfies, or a malformed schema is an error naming it. */
int loom_grammar_compile(const loom_grammar_spec *spec, loom_grammar **out, loom_err *err);
/* The same from loom_grammar_source's text (what a tp leader sends its followers). */
int loom_grammar_compile_source(const char *source, loom_grammar **out, loom_err *err);
/* The canonical text of the grammar's spec (a JSON object; the schemas as compact JSON in
 * their own key order): the cache's key. Lives as long as g. */
const char *loom_grammar_source(const loom_grammar *g);
loom_grammar *loom_grammar_ref(loom_grammar *g);
void loom_grammar_unref(loom_grammar *g); /* NULL is fine */
/* fewest bytes of a complete document */
int loom_grammar_min_bytes(const loom_grammar *g);

/* ---- a cache of compiled grammars: the capacity most recently used, keyed by the spec's
 * canonical text. Thread-safe. */
typedef struct loom_grammar_cache loom_grammar_cache;
loom_grammar_cache *loom_grammar_cache_new(int capacity);
void loom_grammar_cache_free(loom_grammar_cache *c);
/* A reference to the compiled grammar of spec (from the cache, or compiled and cached); the
 * caller unrefs it. cache may be NULL (then it compiles). */
int loom_grammar_cache_get(loom_grammar_cache *c, const loom_grammar_spec *spec,
                           loom_grammar **out, loom_err *err);
/* cache hits and compilations so far */
void loom_grammar_cache_stats(const loom_grammar_cache *c, int64_t *hits, int64_t *compiled);

/* The two common grammars through the cache (c may be NULL): one JSON value matching the
 * schema (schema_json NULL: any JSON object), and tool calls: 1..max_calls occurrences of
 * prefix + a JSON value matching schema_json + suffix, joined by separator. */
int loom_grammar_json(loom_grammar_cache *c, const char *schema_json, loom_grammar **out,
                      loom_err *err);
int loom_grammar_tool_calls(const char *prefix, const char *schema_json, const char *suffix,
                            const char *separator, int max_calls, loom_grammar_cache *c,
                            loom_grammar **out, loom_err *err);

/* ---- per-request state ------------------------------------------------------------------ */
typedef struct loom_grammar_state loom_grammar_state;
/* the state before any text (holds a reference to g) */
loom_grammar_state *loom_grammar_state_new(loom_grammar *g);
void loom_grammar_state_free(loom_grammar_state *s);
/* Feeds bytes: 0, or -1 when they cannot continue any document (then s is unchanged). */
int loom_grammar_state_advance(loom_grammar_state *s, const void *bytes, size_t n);
/* 1 when the text so far is a complete document */
int loom_grammar_state_complete(const loom_grammar_state *s);
/* 1 when it is complete and nothing can follow */
int loom_grammar_state_terminal(const loom_grammar_state *s);
/* the fewest bytes that complete the text so far (0 when complete) */
int loom_grammar_state_min_bytes(const loom_grammar_state *s);

/* ---- token masks ------------------------------------------------------------------------ */
typedef struct loom_grammar_vocab loom_grammar_vocab;
/* A vocabulary of n ids with the given byte strings (NULL or length 0: never allowed, as
 * special tokens are); eos: the end-of-text id (allowed only where the text is complete), or
 * -1. The strings are copied. */
loom_grammar_vocab *loom_grammar_vocab_new(const char *const *bytes, const size_t *lens, int n,
                                           int32_t eos);
/* The tokenizer's: each id's bytes as the engine's text gets them (decoded alone, continuing a
 * text); added/special tokens are never allowed. Ids n_ids > the tokenizer's are never
 * allowed either (a model vocabulary padded beyond the tokenizer). */
int loom_grammar_vocab_from_tokenizer(const struct loom_tokenizer *tok, int n_ids, int32_t eos,
                                      loom_grammar_vocab **out, loom_err *err);
void loom_grammar_vocab_free(loom_grammar_vocab *v);
int loom_grammar_vocab_size(const loom_grammar_vocab *v);
/* the bytes of id (NULL with *len 0 for a token never allowed) */
const char *loom_grammar_vocab_token(const loom_grammar_vocab *v, int32_t id, size_t *len);
/* 1 when every byte the shortest completions use (the printable ASCII bytes, \t \n \r, and
 * the UTF-8 continuation bytes) is a token of its own: then a budget of min_bytes tokens
 * always suffices (loom_grammar_mask's guarantee) */
int loom_grammar_vocab_has_bytes(const loom_grammar_vocab *v);

/* Scratch memory of mask computations (one per thread that computes masks). */
typedef struct loom_grammar_scratch loom_grammar_scratch;
loom_grammar_scratch *loom_grammar_scratch_new(void);
void loom_grammar_scratch_free(loom_grammar_scratch *sc);
/* allow[id] (vocab size entries) = 1 when token id can come next: its bytes continue the text
 * to a prefix of some document, and the fewest bytes that then complete it are at most
 * budget - 1 (budget: the tokens that may still be generated, this one included), so a
 * generation that keeps to the mask always completes within its budget given single-byte
 * tokens; the eos id when the text is complete. Returns the number of allowed ids. */
int loom_grammar_mask(const loom_grammar_state *s, const loom_grammar_vocab *v, int budget,
                      uint8_t *allow, loom_grammar_scratch *sc);

#endif
