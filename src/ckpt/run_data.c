/* What a model was trained on: the tokenizer (id, and tokenizer.json for BPE) and, for a
 * classifier, its class list. The trainer records it in every checkpoint (data.json and
 * tokenizer.json, see docs/checkpoints.md); generate and eval read it back, and train (on
 * resume) and eval refuse a dataset tokenized differently or labelled with other classes.
 * Below train/ (src/ckpt/) so that loading a model does not depend on the trainer; the
 * trainer's side is src/train/train_run_data.c. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "loom/chat.h"
#include "loom/checkpoint.h"
#include "loom/data.h"
#include "loom/tokenizer.h"
#include "loom/load.h"
#include "loom/windows.h"

#define DATA_JSON LOOM_RUN_DATA_FILE
#define TOKENIZER_JSON "tokenizer.json"
#define DATA_FORMAT "loom-data-1"
#define MAX_DATA_JSON ((size_t)64 << 20)

void loom_run_data_free(loom_run_data *d) {
    if (!d) return;
    free(d->where);
    free(d->tokenizer_id);
    free(d->tokenizer_json);
    loom_free_strings(d->classes, d->n_classes);
    free(d->chat_template);
    free(d->chat_default_system);
    free(d);
}

/* "a", "b", ... as one short line for messages */
static void class_list(char **names, int n, char *buf, size_t size) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k + 8 < size; i++) {
        int w = snprintf(buf + k, size - k, "%s%s", i ? ", " : "", names[i]);
        if (w < 0) break;
        k += (size_t)w;
    }
    if (k >= size) snprintf(buf + size - 4, 4, "...");
}

/* ---- building it from the training data (trainer) ---------------------------------------- */

/* The dataset's own tokenizer.json (BPE datasets carry one since loom records tokenizers):
 * its text when present and of the dataset's id; NULL when absent (an older dataset). */
static int dataset_tokenizer_json(const char *dir, const char *id, char **text, size_t *len,
                                  loom_err *err) {
    char path[4200];
    *text = NULL;
    *len = 0;
    if (loom_path_fmt(path, sizeof path, err, "%s/%s", dir, TOKENIZER_JSON)) return -1;
    if (!loom_path_exists(path)) return 0;
    if (loom_read_file(path, (size_t)1 << 30, text, len, err)) return -1;
    loom_tokenizer *tok = NULL;
    if (loom_tokenizer_load_json_text(*text, *len, path, &tok, err)) goto fail;
    const int same = !strcmp(loom_tokenizer_id(tok), id);
    if (!same)
        loom_errf(err, "%s: tokenizer id %s, but the dataset's shards were tokenized with %s",
                  path, loom_tokenizer_id(tok), id);
    loom_tokenizer_free(tok);
    if (same) return 0;
fail:
    free(*text);
    *text = NULL;
    return -1;
}

int loom_run_data_from_dataset(const loom_dataset *ds, const char *dir, int classify,
                               loom_run_data **out, loom_err *err) {
    loom_run_data *d = loom_calloc(1, sizeof *d);
    const char *id = loom_dataset_tokenizer_id(ds);
    d->tokenizer_id = loom_strdup(id ? id : "byte");
    d->where = loom_malloc(strlen(dir) + 32);
    sprintf(d->where, "%s (data.train)", dir);
    if (strcmp(d->tokenizer_id, "byte") != 0 &&
        dataset_tokenizer_json(dir, d->tokenizer_id, &d->tokenizer_json,
                               &d->tokenizer_json_len, err))
        goto fail;
    if (classify && loom_dataset_classes(dir, &d->classes, &d->n_classes, err)) goto fail;
    *out = d;
    return 0;
fail:
    loom_run_data_free(d);
    return -1;
}

char *loom_run_data_json(const loom_run_data *d, const char *train_dir) {
    json_t *tok = json_pack("{s:s}", "id", d->tokenizer_id);
    if (d->tokenizer_json) json_object_set_new(tok, "file", json_string(TOKENIZER_JSON));
    json_t *o = json_pack("{s:s, s:o, s:s}", "format", DATA_FORMAT, "tokenizer", tok, "train",
                          train_dir);
    LOOM_CHECK(o != NULL);
    if (d->chat_template) {
        json_t *ct = json_pack("{s:s}", "name", d->chat_template);
        if (d->chat_default_system) json_object_set_new(ct, "default_system", json_string(d->chat_default_system));
        json_object_set_new(o, "chat_template", ct);
    }
    if (d->classes) {
        json_t *cl = json_array();
        for (int i = 0; i < d->n_classes; i++) json_array_append_new(cl, json_string(d->classes[i]));
        json_object_set_new(o, "classes", cl);
    }
    char *s = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    LOOM_CHECK(s != NULL);
    return s;
}

/* ---- reading it from a checkpoint -------------------------------------------------------- */

static int strings_of(json_t *arr, const char *where, const char *key, char ***out, int *n,
                      loom_err *err) {
    if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > (1u << 20))
        return loom_errf(err, "%s: '%s' is not a non-empty list", where, key);
    const int k = (int)json_array_size(arr);
    char **v = loom_calloc((size_t)k, sizeof *v);
    for (int i = 0; i < k; i++) {
        const char *s = json_string_value(json_array_get(arr, (size_t)i));
        if (!s) {
            loom_free_strings(v, i);
            return loom_errf(err, "%s: %s[%d] is not a string", where, key, i);
        }
        v[i] = loom_strdup(s);
    }
    *out = v;
    *n = k;
    return 0;
}

static int parse_data_json(loom_run_data *d, const char *text, size_t len, const loom_ckpt *ck,
                           loom_err *err) {
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    int rc = -1;
    if (!json_is_object(o)) {
        loom_errf(err, "%s:%d: %s", d->where, je.line, o ? "not a JSON object" : je.text);
        goto done;
    }
    const char *fmt = json_string_value(json_object_get(o, "format"));
    if (!fmt || strcmp(fmt, DATA_FORMAT) != 0) {
        loom_errf(err, "%s: 'format' is '%s', expected '%s'", d->where, fmt ? fmt : "(missing)",
                  DATA_FORMAT);
        goto done;
    }
    json_t *tok = json_object_get(o, "tokenizer");
    const char *id = json_string_value(json_object_get(tok, "id"));
    if (!id || !*id || strlen(id) > 64) {
        loom_errf(err, "%s: 'tokenizer.id' missing or not a tokenizer id", d->where);
        goto done;
    }
    d->tokenizer_id = loom_strdup(id);
    json_t *file = json_object_get(tok, "file");
    if (file) {
        const char *name = json_string_value(file);
        if (!name || strcmp(name, TOKENIZER_JSON) != 0) {
            loom_errf(err, "%s: 'tokenizer.file' must be \"%s\"", d->where, TOKENIZER_JSON);
            goto done;
        }
        size_t tl;
        const char *tt = loom_ckpt_file_data(ck, TOKENIZER_JSON, &tl);
        if (!tt) {
            loom_errf(err, "%s: names %s, which the checkpoint does not hold", d->where,
                      TOKENIZER_JSON);
            goto done;
        }
        d->tokenizer_json = loom_malloc(tl + 1);
        memcpy(d->tokenizer_json, tt, tl);
        d->tokenizer_json[tl] = 0;
        d->tokenizer_json_len = tl;
    }
    json_t *ct = json_object_get(o, "chat_template");
    if (ct) {
        const char *name = json_string_value(json_object_get(ct, "name"));
        json_t *ds = json_object_get(ct, "default_system");
        if (!name || !loom_chat_template_is_builtin(name) || (ds && !json_is_string(ds))) {
            loom_errf(err, "%s: 'chat_template' must be {\"name\": a built-in template, \"default_system\": text}",
                      d->where);
            goto done;
        }
        d->chat_template = loom_strdup(name);
        if (ds) d->chat_default_system = loom_strdup(json_string_value(ds));
    }
    json_t *cl = json_object_get(o, "classes");
    if (cl && strings_of(cl, d->where, "classes", &d->classes, &d->n_classes, err)) goto done;
    rc = 0;
done:
    json_decref(o);
    return rc;
}

/* A checkpoint written before data.json: what its run's data.train says (dataset.json and
 * tokenizer.json there), when that dataset is still readable. */
static int legacy_from_train_dir(loom_run_data *d, const loom_config *cfg, const char *step_dir,
                                 loom_err *err) {
    const char *train = cfg ? loom_config_get(cfg, "data.train") : NULL;
    const char *head = cfg ? loom_config_get(cfg, "model.head") : NULL;
    char path[4200];
    json_error_t je;
    json_t *o = NULL;
    if (train && !loom_path_fmt(path, sizeof path, NULL, "%s/dataset.json", train))
        o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    const char *id = json_string_value(json_object_get(json_object_get(o, "tokenizer"), "id"));
    if (!id || !*id || strlen(id) > 64) {
        json_decref(o);
        return loom_errf(err, "%s: the checkpoint does not record the tokenizer it was trained "
                              "with (no data.json: written before loom recorded it), and its "
                              "data.train (%s) cannot tell; train it again to record it",
                         step_dir, train ? train : "not set");
    }
    d->tokenizer_id = loom_strdup(id);
    json_decref(o);
    free(d->where);
    d->where = loom_malloc(strlen(train) + 128);
    sprintf(d->where, "%s/dataset.json (the run's data.train; the checkpoint has no data.json)",
            train);
    if (strcmp(d->tokenizer_id, "byte") != 0 &&
        dataset_tokenizer_json(train, d->tokenizer_id, &d->tokenizer_json,
                               &d->tokenizer_json_len, err))
        return -1;
    if (head && !strcmp(head, "classify") &&
        loom_dataset_classes(train, &d->classes, &d->n_classes, err))
        return -1;
    return 0;
}

int loom_run_data_read(const loom_ckpt *ck, const loom_config *cfg, loom_run_data **out,
                       loom_err *err) {
    loom_run_data *d = loom_calloc(1, sizeof *d);
    const char *dir = loom_ckpt_dir(ck);
    d->where = loom_malloc(strlen(dir) + sizeof DATA_JSON + 1);
    sprintf(d->where, "%s/%s", dir, DATA_JSON);
    size_t len;
    const char *text = loom_ckpt_file_data(ck, DATA_JSON, &len);
    const int rc = text ? parse_data_json(d, text, len, ck, err)
                        : legacy_from_train_dir(d, cfg, dir, err);
    if (rc) {
        loom_run_data_free(d);
        return -1;
    }
    *out = d;
    return 0;
}

/* ---- using it ------------------------------------------------------------------------------ */

int loom_run_data_tokenizer(const loom_run_data *d, loom_tokenizer **out, loom_err *err) {
    if (!strcmp(d->tokenizer_id, "byte")) return loom_tokenizer_byte(NULL, 0, out, err);
    if (!d->tokenizer_json)
        return loom_errf(err, "%s: the model was trained with BPE tokenizer %.16s..., but no "
                              "tokenizer.json came with it (its dataset was built before loom "
                              "datasets carried their tokenizer.json: rebuild the dataset with "
                              "`loom data build` and train again)",
                         d->where, d->tokenizer_id);
    loom_tokenizer *t = NULL;
    if (loom_tokenizer_load_json_text(d->tokenizer_json, d->tokenizer_json_len, d->where, &t, err))
        return -1;
    if (strcmp(loom_tokenizer_id(t), d->tokenizer_id) != 0) {
        loom_errf(err, "%s: tokenizer.json has id %s, but the model was trained with %s",
                  d->where, loom_tokenizer_id(t), d->tokenizer_id);
        loom_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int loom_run_data_check_dataset(const loom_run_data *d, const loom_dataset *ds, const char *dir,
                                loom_err *err) {
    const char *id = loom_dataset_tokenizer_id(ds);
    if (!id || !strcmp(id, d->tokenizer_id)) return 0;
    return loom_errf(err, "%s was tokenized with %s, but the model with %s (%s): a dataset must "
                          "use the model's tokenizer",
                     dir, id, d->tokenizer_id, d->where);
}

int loom_run_data_check_classes(const loom_run_data *d, const char *dir, loom_err *err) {
    char **names = NULL;
    int n = 0;
    if (loom_dataset_classes(dir, &names, &n, err)) return -1;
    int same = d->classes && n == d->n_classes;
    for (int i = 0; same && i < n; i++) same = !strcmp(names[i], d->classes[i]);
    if (!same) {
        char a[400], b[400];
        class_list(names, n, a, sizeof a);
        if (d->classes) class_list(d->classes, d->n_classes, b, sizeof b);
        else snprintf(b, sizeof b, "none recorded");
        loom_errf(err, "%s/dataset.json lists the classes [%s], but the model was trained on "
                       "[%s] (%s): names and order must match",
                  dir, a, b, d->where);
    }
    loom_free_strings(names, n);
    return same ? 0 : -1;
}
