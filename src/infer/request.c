/* A request from prompt text: the set-up loom generate and loom synth share (include/loom/infer.h). */
#include <string.h>

#include "loom/infer.h"
#include "loom/tokenizer.h"

int loom_prompt_encode(const loom_tokenizer *tok, const char *text, size_t len, int keep,
                       loom_ids *ids, int *truncated, loom_err *err) {
    ids->n = 0;
    if (truncated) *truncated = 0;
    if (keep < 1) return loom_errf(err, "no room for a prompt (keep %d tokens)", keep);
    if (loom_tokenizer_encode(tok, text, len, ids, err)) return -1;
    if (ids->n == 0 || ids->n > (size_t)1 << 30)
        return loom_errf(err, "the prompt encodes to %zu tokens", ids->n);
    if (ids->n > (size_t)keep) { /* the prompt's end */
        memmove(ids->ids, ids->ids + (ids->n - (size_t)keep), (size_t)keep * sizeof(int32_t));
        ids->n = (size_t)keep;
        if (truncated) *truncated = 1;
    }
    return 0;
}

int loom_engine_submit_text(loom_engine *e, const loom_tokenizer *tok, const char *text,
                            size_t len, int keep, const loom_gen_params *p, loom_engine_cb cb,
                            void *ctx, int64_t *id, int *truncated, loom_err *err) {
    loom_ids enc = {0};
    int rc = loom_prompt_encode(tok, text, len, keep, &enc, truncated, err);
    if (rc == 0) rc = loom_engine_submit(e, enc.ids, (int)enc.n, p, cb, ctx, id, err);
    loom_ids_free(&enc);
    return rc;
}
