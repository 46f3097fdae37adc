/* loom serve: a request's `response_format` (OpenAI's shape) as a grammar for the engine
 * (docs/inference.md, "Structured output"). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/server_internal.h"
#include "loom/grammar.h"

int server_response_format(server *S, json_t *rf, loom_grammar **out, char *why, size_t n) {
    *out = NULL;
    if (!rf || json_is_null(rf)) return 0;
    json_t *type = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    if (!json_is_string(type)) {
        snprintf(why, n, "'response_format' must be an object with a 'type' (text, json_object "
                         "or json_schema)");
        return -1;
    }
    const char *t = json_string_value(type);
    loom_err err = {{0}};
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        if (loom_grammar_json(S->gcache, NULL, out, &err)) {
            snprintf(why, n, "response_format: %s", err.msg);
            return -1;
        }
        return 0;
    }
    if (strcmp(t, "json_schema")) {
        snprintf(why, n, "response_format: unknown type '%s' (text, json_object or json_schema)", t);
        return -1;
    }
    json_t *js = json_object_get(rf, "json_schema");
    json_t *name = json_is_object(js) ? json_object_get(js, "name") : NULL;
    json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
    json_t *strict = json_is_object(js) ? json_object_get(js, "strict") : NULL;
    if (!json_is_object(js) || !json_is_string(name)) {
        snprintf(why, n, "response_format: json_schema needs an object 'json_schema' with a "
                         "string 'name' and a 'schema'");
        return -1;
    }
    if (strict && !json_is_boolean(strict) && !json_is_null(strict)) {
        snprintf(why, n, "response_format: json_schema.strict must be a boolean");
        return -1;
    }
    if (!schema || (!json_is_object(schema) && !json_is_boolean(schema))) {
        snprintf(why, n, "response_format: json_schema.schema must be a JSON schema (an object)");
        return -1;
    }
    /* strict or not, the output is constrained to the schema */
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    const int rc = loom_grammar_json(S->gcache, text, out, &err);
    free(text);
    if (rc) {
        snprintf(why, n, "response_format: json_schema '%s': %s", json_string_value(name), err.msg);
        return -1;
    }
    return 0;
}
