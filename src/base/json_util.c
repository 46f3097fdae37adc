#include "base/json_util.h"

#include <stdlib.h>

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
