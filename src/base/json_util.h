/* Parsing a JSON object from text or a file with loom's error wording (internal: it exposes
 * jansson's json_t, which the public headers do not). Duplicate keys are rejected. */
#ifndef LOOM_BASE_JSON_UTIL_H
#define LOOM_BASE_JSON_UTIL_H

#include <stddef.h>

#include <jansson.h>

#include "loom/base.h"

/* Parses TEXT (LEN bytes) into a new reference to a JSON object. Errors name WHERE (a path or
 * "path:line") and say "invalid JSON at line L, column C: ..." or "not a JSON object". */
int loom_json_object(const char *where, const char *text, size_t len, json_t **out, loom_err *err);

/* Reads PATH (at most MAX_BYTES) and parses it as loom_json_object does. */
int loom_json_object_file(const char *path, size_t max_bytes, json_t **out, loom_err *err);

#endif
