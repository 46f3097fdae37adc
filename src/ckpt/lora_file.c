/* lora.safetensors, the LoRA adapters of a checkpoint (include/loom/load.h): written by the
 * trainer (src/train/train_lora.c), read back by it on resume and by loading a model for
 * inference (load.c). The adapters and their moments are device memory of the model's
 * backend: saving stages them through the host (the named read `lora adapters`), loading
 * reads them into host buffers and copies them in (mem_h2d). */
#include <stdlib.h>
#include <string.h>

#include "loom/load.h"
#include "loom/lora.h"
#include "loom/safetensors.h"

int loom_lora_serialize(loom_lora *l, const float *m, const float *v, char **buf, size_t *len,
                        loom_err *err) {
    const int nt = loom_lora_num_tensors(l);
    const int kinds = m ? 3 : 1;
    loom_st_tensor *ts = loom_calloc((size_t)nt * 3, sizeof *ts);
    char (*names)[96] = loom_calloc((size_t)nt * 3, sizeof *names);
    static const char *const kind[3] = {"param", "adam_m", "adam_v"};
    float *src[3] = {loom_lora_to_host(l, loom_lora_params(l)), m ? loom_lora_to_host(l, m) : NULL,
                     v ? loom_lora_to_host(l, v) : NULL};
    int k = 0;
    for (int c = 0; c < kinds; c++)
        for (int i = 0; i < nt; i++) {
            const loom_lora_tensor *x = loom_lora_tensor_at(l, i);
            snprintf(names[k], sizeof names[k], "%s/%s", kind[c], x->name);
            ts[k] = (loom_st_tensor){names[k], src[c] + x->offset, 2, {x->rows, x->cols}, NULL};
            k++;
        }
    char rs[32], al[32], tg[32];
    snprintf(rs, sizeof rs, "%d", loom_lora_rank(l));
    snprintf(al, sizeof al, "%.9g", (double)loom_lora_alpha(l));
    snprintf(tg, sizeof tg, "%u", loom_lora_targets(l));
    const char *meta[] = {"format", "loom-lora-1", "rank", rs, "alpha", al, "targets", tg, NULL};
    const int rc = loom_safetensors_serialize(ts, k, meta, buf, len, err);
    for (int c = 0; c < 3; c++) free(src[c]);
    free(ts);
    free(names);
    return rc;
}

int loom_lora_restore(loom_lora *l, const char *data, size_t len, const char *where, float *m,
                      float *v, loom_err *err) {
    loom_st_file *f = NULL;
    if (loom_safetensors_parse(data, len, where, &f, err)) return -1;
    int rc = -1;
    float *host = NULL; /* one kind's tensors, then copied in */
    const char *fmt = loom_safetensors_metadata(f, "format");
    const char *rs = loom_safetensors_metadata(f, "rank"), *tg = loom_safetensors_metadata(f, "targets");
    if (!fmt || strcmp(fmt, "loom-lora-1") || !rs || !tg) {
        loom_errf(err, "%s: not a loom LoRA file (format loom-lora-1 with rank and targets)", where);
        goto done;
    }
    int64_t rank, targets;
    if (loom_parse_i64(rs, 1, INT32_MAX, &rank) || loom_parse_i64(tg, 0, UINT32_MAX, &targets)) {
        loom_errf(err, "%s: metadata rank '%s' / targets '%s' are not integers in range", where, rs,
                  tg);
        goto done;
    }
    if (rank != loom_lora_rank(l) || (unsigned)targets != loom_lora_targets(l)) {
        loom_errf(err, "%s: adapters of rank %s and targets %s, but finetune.lora asks for rank "
                       "%d and targets %u", where, rs, tg, loom_lora_rank(l), loom_lora_targets(l));
        goto done;
    }
    static const char *const kind[3] = {"param", "adam_m", "adam_v"};
    float *dst[3] = {loom_lora_params(l), m, v};
    host = loom_malloc(loom_lora_num_params(l) * sizeof *host);
    for (int c = 0; c < (m ? 3 : 1); c++) {
        for (int i = 0; i < loom_lora_num_tensors(l); i++) {
            const loom_lora_tensor *x = loom_lora_tensor_at(l, i);
            char name[96];
            snprintf(name, sizeof name, "%s/%s", kind[c], x->name);
            const int64_t shape[2] = {x->rows, x->cols};
            if (loom_safetensors_read_into(f, name, host + x->offset, 2, shape, err)) goto done;
        }
        loom_lora_upload(l, dst[c], host);
    }
    rc = 0;
done:
    free(host);
    loom_safetensors_close(f);
    return rc;
}
