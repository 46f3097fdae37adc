#include "base/json_util.h"
#include "base/yaml.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int loom_json_object(const char *where, const char *text, size_t len, json_t **out,
                     loom_err *err) {
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return loom_errf(err, "%s: invalid JSON at line %d, column %d: %s", where, je.line,
                         je.column, je.text);
    if (!json_is_object(o)) {
        json_decref(o);
        return loom_errf(err, "%s: not a JSON object", where);
    }
    *out = o;
    return 0;
}

int loom_json_object_file(const char *path, size_t max_bytes, json_t **out, loom_err *err) {
    char *buf;
    size_t len;
    if (loom_read_file(path, max_bytes, &buf, &len, err)) return -1;
    int rc = loom_json_object(path, buf, len, out, err);
    free(buf);
    return rc;
}

const char *loom_json_str_or(json_t *o, const char *key, const char *dflt) {
    json_t *x = json_object_get(o, key);
    return json_is_string(x) ? json_string_value(x) : dflt;
}

int loom_json_str(json_t *o, const char *where, const char *prefix, const char *key,
                  const char **out, loom_err *err) {
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return loom_errf(err, "%s: '%s%s' must be a string", where, prefix, key);
    *out = json_string_value(v);
    return 0;
}

int loom_json_int(json_t *o, const char *where, const char *prefix, const char *key, int required,
                  int64_t dflt, int64_t lo, int64_t hi, int64_t *out, loom_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return loom_errf(err, "%s: '%s%s' is missing", where, prefix, key);
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return loom_errf(err, "%s: '%s%s' must be an integer in [%lld, %lld]", where, prefix, key,
                         (long long)lo, (long long)hi);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

int loom_json_num(json_t *o, const char *where, const char *prefix, const char *key, double dflt,
                  double lo, int lo_open, double hi, double *out, loom_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    const double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi) {
        *out = x;
        return 0;
    }
    if (lo_open && lo == 0 && isinf(hi))
        return loom_errf(err, "%s: '%s%s' must be a positive number", where, prefix, key);
    if (isinf(hi))
        return loom_errf(err, "%s: '%s%s' must be a number %s %g", where, prefix, key,
                         lo_open ? ">" : ">=", lo);
    return loom_errf(err, "%s: '%s%s' must be a number in %c%g, %g]", where, prefix, key,
                     lo_open ? '(' : '[', lo, hi);
}

int loom_json_bool(json_t *o, const char *where, const char *prefix, const char *key, int dflt,
                   int *out, loom_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return loom_errf(err, "%s: '%s%s' must be true or false", where, prefix, key);
    *out = json_is_true(v);
    return 0;
}

/* ---- YAML -> JSON (synth's pipelines): base's one YAML reader (base/yaml.h) ---------- */

int loom_yaml_json_file(const char *path, size_t max_bytes, json_t **result, loom_err *err) {
    char *text = NULL;
    size_t len = 0;
    *result = NULL;
    if (max_bytes > LOOM_YAML_MAX_BYTES) max_bytes = LOOM_YAML_MAX_BYTES;
    if (loom_read_file(path, max_bytes, &text, &len, err)) return -1;
    loom_yaml_node *root = NULL;
    int rc = loom_yaml_parse(path, text, len, &root, err);
    free(text);
    if (rc) return -1;
    if (!root || root->kind != LOOM_YAML_MAP)
        rc = loom_errf(err, "%s:%d: expected a mapping (key: value lines) at the top", path,
                       root ? root->line : 1);
    else
        rc = loom_yaml_to_json(path, root, result, err);
    loom_yaml_free(root);
    return rc;
}
