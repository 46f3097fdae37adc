#include "base/json_util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

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

/* ---- YAML -> JSON (synth's pipelines) ---------------------------------------------------
 * A plain scalar is typed: a decimal integer (under 32 characters; loom_parse_i64), else a
 * finite number (loom_parse_f64), true / false, null / ~ / empty -> null; anything else, and
 * every quoted scalar, is a string. Duplicate keys, non-scalar keys, more than 64 levels or 10^6 nodes (an alias counts
 * its node each time it is used) are errors. */
static json_t *yaml_node_json(yaml_document_t *d, yaml_node_t *n, int depth, long *budget) {
    if (!n || depth > 64 || --*budget < 0) return NULL;
    switch (n->type) {
    case YAML_SCALAR_NODE: {
        const char *v = (const char *)n->data.scalar.value;
        const size_t len = n->data.scalar.length;
        if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
            int64_t i;
            double x;
            if (len && len < 32) { /* base's number words, as configs' and recipes' keys read them */
                if (!loom_parse_i64(v, INT64_MIN, INT64_MAX, &i)) return json_integer((json_int_t)i);
                if (!loom_parse_f64(v, &x)) return json_real(x);
            }
            if (!strcmp(v, "true")) return json_true();
            if (!strcmp(v, "false")) return json_false();
            if (!strcmp(v, "null") || !strcmp(v, "~") || len == 0) return json_null();
        }
        return json_stringn(v, len);
    }
    case YAML_SEQUENCE_NODE: {
        json_t *a = json_array();
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
            json_t *x = yaml_node_json(d, yaml_document_get_node(d, *it), depth + 1, budget);
            if (!x) {
                json_decref(a);
                return NULL;
            }
            json_array_append_new(a, x);
        }
        return a;
    }
    case YAML_MAPPING_NODE: {
        json_t *o = json_object();
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(d, p->key);
            json_t *x = k && k->type == YAML_SCALAR_NODE
                            ? yaml_node_json(d, yaml_document_get_node(d, p->value), depth + 1, budget)
                            : NULL;
            if (!x || json_object_get(o, (const char *)k->data.scalar.value)) {
                json_decref(x);
                json_decref(o);
                return NULL;
            }
            json_object_set_new(o, (const char *)k->data.scalar.value, x);
        }
        return o;
    }
    default: return NULL;
    }
}

int loom_yaml_json_file(const char *path, size_t max_bytes, json_t **result, loom_err *err) {
    char *text = NULL;
    size_t len = 0;
    *result = NULL;
    if (loom_read_file(path, max_bytes, &text, &len, err)) return -1;
    yaml_parser_t p;
    yaml_document_t d;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    json_t *out = NULL;
    if (!yaml_parser_load(&p, &d)) {
        loom_errf(err, "%s:%zu:%zu: %s", path, p.problem_mark.line + 1, p.problem_mark.column + 1,
                  p.problem ? p.problem : "malformed YAML");
    } else {
        long budget = 1000000;
        yaml_node_t *root = yaml_document_get_root_node(&d);
        out = root ? yaml_node_json(&d, root, 0, &budget) : NULL;
        if (!out || !json_is_object(out)) {
            json_decref(out);
            out = NULL;
            loom_errf(err, "%s: expected a mapping at the top (no duplicate keys, at most 64 "
                           "levels and 10^6 nodes)", path);
        }
        yaml_document_delete(&d);
    }
    yaml_parser_delete(&p);
    free(text);
    *result = out;
    return out ? 0 : -1;
}
