/* kind: text -- a file is one document, or is cut at every `split` separator (removed;
 * empty pieces are dropped and counted). */
#define _GNU_SOURCE
#include "data/build_source.h"

#include <stdlib.h>
#include <string.h>

#define TEXT_MAX_BYTES ((size_t)1 << 31)

int loom_read_text(loom_read_ctx *c, int fi, loom_err *err) {
    const loom_recipe_source *s = c->src;
    uint8_t *buf;
    size_t len;
    if (loom_input_read(&c->inputs->v[fi], TEXT_MAX_BYTES, &buf, &len, err) != 0) return -1;
    const uint8_t *p = buf, *end = buf + len;
    if (!s->split) {
        if (len) loom_docs_add(c->docs, p, len, -1, fi);
        else c->empty_docs++;
    } else {
        while (p < end) {
            const uint8_t *q = memmem(p, (size_t)(end - p), s->split, s->split_len);
            size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
            if (n) loom_docs_add(c->docs, p, n, -1, fi);
            else c->empty_docs++;
            p += n + (q ? s->split_len : 0);
        }
    }
    free(buf);
    return 0;
}
