/* Parsing a JSON object from text or a file, and reading its typed keys, with loom's error
 * wording (internal: it exposes jansson's json_t, which the public headers do not). Duplicate
 * keys are rejected. Used by hf/ (config.json) and synth/ (pipelines). */
#ifndef LOOM_BASE_JSON_UTIL_H
#define LOOM_BASE_JSON_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "loom/base.h"

/* Parses TEXT (LEN bytes) into a new reference to a JSON object. Errors name WHERE (a path or
 * "path:line") and say "invalid JSON at line L, column C: ..." or "not a JSON object". */
int loom_json_object(const char *where, const char *text, size_t len, json_t **out, loom_err *err);

/* Reads PATH (at most MAX_BYTES) and parses it as loom_json_object does. */
int loom_json_object_file(const char *path, size_t max_bytes, json_t **out, loom_err *err);

/* Reads PATH (at most MAX_BYTES, never more than base/yaml.h's LOOM_YAML_MAX_BYTES) with
 * base's YAML reader: a document whose top level is a mapping, into a new JSON object (*out),
 * scalars typed by loom_yaml_scalar_type. Errors name PATH:LINE. */
int loom_yaml_json_file(const char *path, size_t max_bytes, json_t **out, loom_err *err);

/* ---- typed keys of an object ----
 * Absent or null means the default. Errors name WHERE (the file) and the key as 'PREFIXKEY'
 * (PREFIX: "" or a path such as "generator." or "validators[2]."). */

/* the string at KEY, or DFLT when it is absent or not a string */
const char *loom_json_str_or(json_t *o, const char *key, const char *dflt);
/* a string (*out NULL when absent or null); any other type is an error */
int loom_json_str(json_t *o, const char *where, const char *prefix, const char *key,
                  const char **out, loom_err *err);
/* an integer in [lo, hi]; absent or null: dflt, or an error "... is missing" when required */
int loom_json_int(json_t *o, const char *where, const char *prefix, const char *key, int required,
                  int64_t dflt, int64_t lo, int64_t hi, int64_t *out, loom_err *err);
/* a finite number in [lo, hi] ((lo, hi] when lo_open; hi may be INFINITY) */
int loom_json_num(json_t *o, const char *where, const char *prefix, const char *key, double dflt,
                  double lo, int lo_open, double hi, double *out, loom_err *err);
/* true or false */
int loom_json_bool(json_t *o, const char *where, const char *prefix, const char *key, int dflt,
                   int *out, loom_err *err);

#endif
