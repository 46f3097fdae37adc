/* loom's one YAML reader (internal; shared with every module, like base/json_util.h): YAML
 * text -> a tree of nodes, each with its file line and column, every scalar typed by one
 * function. Run configs (base/config.c), data recipes (data/recipe.c) and synth pipelines
 * (loom_yaml_json_file) all read through it, so the three kinds of file share one dialect.
 * docs/config.md ("The YAML dialect") is the user's reference.
 *
 * Refused, as "NAME:LINE:COL: ...": malformed YAML ("malformed YAML: <libyaml's problem>"),
 * anchors and aliases, explicit tags (!!str, !foo), a second document, a mapping key that is
 * not a scalar or holds a NUL byte, a key given twice in one mapping (named by its path,
 * "training.steps", "sources[1].name"), nesting deeper than LOOM_YAML_MAX_DEPTH and more than
 * LOOM_YAML_MAX_NODES nodes. Files are read with at most LOOM_YAML_MAX_BYTES. */
#ifndef LOOM_BASE_YAML_H
#define LOOM_BASE_YAML_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "loom/base.h"

#define LOOM_YAML_MAX_BYTES ((size_t)16 << 20)
#define LOOM_YAML_MAX_DEPTH 64
#define LOOM_YAML_MAX_NODES 1000000L

typedef enum { LOOM_YAML_SCALAR, LOOM_YAML_SEQ, LOOM_YAML_MAP } loom_yaml_kind;

/* A scalar's type (loom_yaml_scalar_type). */
typedef enum {
    LOOM_YAML_NULL,
    LOOM_YAML_BOOL,
    LOOM_YAML_INT,
    LOOM_YAML_FLOAT,
    LOOM_YAML_STR
} loom_yaml_type;

typedef struct loom_yaml_value {
    loom_yaml_type type;
    int b;     /* BOOL: 0 or 1 */
    int64_t i; /* INT */
    double f;  /* FLOAT (may be inf or nan: .inf, .nan, 1e999); INT: the same value */
} loom_yaml_value;

/* The typing rules, the same for every file loom reads (docs/config.md):
 *   quoted ('...' or "...")                 -> a string, always
 *   plain: empty, ~, null, Null, NULL       -> null
 *          true True TRUE false False FALSE -> a boolean
 *          [-+]?[0-9]+ within int64         -> an integer (decimal only: 0x10 is a string)
 *          [-+]?(.[0-9]+|[0-9]+(.[0-9]*)?)([eE][-+]?[0-9]+)?, and an integer past int64
 *                                           -> a float
 *          [-+]?.inf .Inf .INF, .nan .NaN .NAN -> a float (not finite)
 *          anything else (yes, on, nan, 1_000, 0x10) -> a string
 * TEXT is LEN bytes (a NUL inside makes a string). */
void loom_yaml_scalar_type(const char *text, size_t len, int quoted, loom_yaml_value *out);

typedef struct loom_yaml_node loom_yaml_node;
struct loom_yaml_node {
    loom_yaml_kind kind;
    int line, col; /* 1-based, where the node starts */
    /* SCALAR: the text (NUL-terminated; LEN bytes, which may include NULs from escapes),
     * whether it was quoted (or a block scalar: | >), and its typed value */
    char *text;
    size_t len;
    int quoted;
    loom_yaml_value v;
    /* SEQ: N items in kids[0..N-1]; MAP: N pairs, key kids[2i] (a scalar), value kids[2i+1] */
    loom_yaml_node *kids;
    size_t n;
};

/* Parses TEXT (LEN bytes; NAME is used in messages) into a new tree (*root; NULL for an
 * empty document). Free with loom_yaml_free. */
int loom_yaml_parse(const char *name, const char *text, size_t len, loom_yaml_node **root,
                    loom_err *err);
/* Reads PATH (at most LOOM_YAML_MAX_BYTES) and parses it as loom_yaml_parse does. */
int loom_yaml_load_file(const char *path, loom_yaml_node **root, loom_err *err);
void loom_yaml_free(loom_yaml_node *root);

/* A tree as JSON (a new reference): scalars by their type, a non-finite float an error
 * naming NAME:LINE. */
int loom_yaml_to_json(const char *name, const loom_yaml_node *n, json_t **out, loom_err *err);

#endif
