/* loom config tree: YAML in, `--set section.key=value` overrides, typed getters, unknown
 * keys rejected, the resolved tree written back as YAML.
 *
 * The tree is flat: nested YAML mappings become dotted keys ("training.steps"). Every value
 * remembers where it came from ("configs/x.yaml:12", "--set", "default") so that errors
 * name the file and line. Sequences are stored as a YAML flow string ("[a, b]") and may be
 * read back with loom_config_get_list. */
#ifndef LOOM_CONFIG_H
#define LOOM_CONFIG_H

#include <stdint.h>
#include "loom/base.h"

typedef struct loom_config loom_config;

/* One known key: its dotted name, default value as text (NULL = no default, key optional),
 * and a one-line description (written as a comment in the resolved config). */
typedef struct loom_config_key {
    const char *key;
    const char *def;
    const char *help;
} loom_config_key;

loom_config *loom_config_new(void);
void loom_config_free(loom_config *c);

/* Loads a YAML file into the tree (later loads override earlier ones). Malformed YAML is an
 * error naming path:line:column and the parser's problem; a top-level non-mapping, a
 * duplicate key, an anchor/alias or a tag is an error too (base/yaml.h: one reader, one
 * dialect for configs, recipes and pipelines; docs/config.md). */
int loom_config_load_yaml(loom_config *c, const char *path, loom_err *err);
/* Parses YAML text (name is used in messages). */
int loom_config_load_string(loom_config *c, const char *text, const char *name, loom_err *err);
/* Applies "a.b=value" (from --set). The value is parsed as a YAML scalar. */
int loom_config_set_arg(loom_config *c, const char *assignment, loom_err *err);
/* Sets a value programmatically (origin recorded as `origin`). */
void loom_config_set(loom_config *c, const char *key, const char *value, const char *origin);

/* Fills in defaults for absent keys, then rejects any key not in `known` (an error naming
 * the key and where it was set, with a close match suggested when there is one). */
int loom_config_apply_schema(loom_config *c, const loom_config_key *known, int n_known, loom_err *err);

/* One schema from several key tables, in order, of any size: a heap array the caller owns
 * (free()), its length in *n. A key in two tables is an invariant failure (file:line). */
loom_config_key *loom_config_schema_join(const loom_config_key *const *tables, const int *counts,
                                         int n_tables, int *n);

/* Raw lookup: NULL when absent. */
const char *loom_config_get(const loom_config *c, const char *key);
const char *loom_config_origin(const loom_config *c, const char *key);
/* Typed getters: strict parsing (the whole text must be a number / bool); an absent key is
 * an error unless a default was applied. Errors name the key, its value and its origin. */
int loom_config_get_int(const loom_config *c, const char *key, int64_t *out, loom_err *err);
int loom_config_get_double(const loom_config *c, const char *key, double *out, loom_err *err);
int loom_config_get_bool(const loom_config *c, const char *key, int *out, loom_err *err);
int loom_config_get_str(const loom_config *c, const char *key, const char **out, loom_err *err);
/* A list value ("[a, b, [c, d]]") as *n malloc'd item texts (a nested list comes back as its
 * flow text); an error when the value is not a list. Free with loom_config_free_list. */
int loom_config_get_list(const loom_config *c, const char *key, char ***items, int *n,
                         loom_err *err);
void loom_config_free_list(char **items, int n);

/* Iteration in sorted key order. */
int loom_config_count(const loom_config *c);
const char *loom_config_key_at(const loom_config *c, int i);
const char *loom_config_value_at(const loom_config *c, int i);

/* Writes the tree as nested YAML (sections as mappings), atomically. Strings are quoted
 * when needed so that loading the file gives the same tree back. */
int loom_config_write_yaml(const loom_config *c, const char *path, loom_err *err);
/* The same YAML as a malloc'd string. */
char *loom_config_to_yaml(const loom_config *c);

#endif
