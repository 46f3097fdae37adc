/* kind: binary -- every regular file under the directory is one document of raw bytes (byte
 * tokens), with an optional class label from a labels file keyed by the file's path
 * (relative to the source root) or by its SHA-256. Files without a label get `default_label`
 * or are skipped, counted and reported by name. */
#define _GNU_SOURCE
#include "data/build_source.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define BINARY_MAX_BYTES ((size_t)1 << 31)
#define LABELS_MAX_BYTES ((size_t)1 << 30)

typedef struct pair {
    char *key, *label;
    int line;
} pair;

struct loom_labels {
    pair *v;     /* sorted by key */
    int n;
    const char **names;  /* distinct labels, sorted */
    int n_names;
};

static int cmp_pair(const void *a, const void *b) {
    return strcmp(((const pair *)a)->key, ((const pair *)b)->key);
}
static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "./a/b" -> "a/b"; sha256 keys are compared in lowercase */
static char *norm_key(const char *k, int is_sha) {
    while (k[0] == '.' && k[1] == '/') k += 2;
    char *s = loom_strdup(k);
    if (is_sha)
        for (char *p = s; *p; p++)
            if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    return s;
}

int loom_csv_record(const char *text, size_t len, size_t *pos, char ***fields, int *n_fields,
                    int *lines_used, loom_err *err) {
    size_t i = *pos;
    char **f = NULL;
    int nf = 0, lines = 1;
    char *cur = NULL;
    size_t cur_n = 0, cur_cap = 0;
#define PUTC(ch)                                                   \
    do {                                                           \
        if (cur_n + 2 > cur_cap) {                                 \
            cur_cap = cur_cap ? 2 * cur_cap : 32;                  \
            cur = loom_realloc(cur, cur_cap);                      \
        }                                                          \
        cur[cur_n++] = (ch);                                       \
    } while (0)
    for (;;) {
        /* one field */
        cur_n = 0;
        if (i < len && text[i] == '"') {
            i++;
            for (;;) {
                if (i >= len) {
                    for (int k = 0; k < nf; k++) free(f[k]);
                    free(f);
                    free(cur);
                    return loom_errf(err, "unterminated quoted field");
                }
                if (text[i] == '"') {
                    if (i + 1 < len && text[i + 1] == '"') {
                        PUTC('"');
                        i += 2;
                        continue;
                    }
                    i++;
                    break;
                }
                if (text[i] == '\n') lines++;
                PUTC(text[i]);
                i++;
            }
            while (i < len && text[i] != ',' && text[i] != '\n' && text[i] != '\r') i++; /* junk after quote */
        } else {
            while (i < len && text[i] != ',' && text[i] != '\n' && text[i] != '\r') {
                PUTC(text[i]);
                i++;
            }
        }
        PUTC(0);
        f = loom_realloc(f, (size_t)(nf + 1) * sizeof *f);
        f[nf++] = loom_strdup(cur);
        if (i < len && text[i] == ',') {
            i++;
            continue;
        }
        if (i < len && text[i] == '\r') i++;
        if (i < len && text[i] == '\n') i++;
        break;
    }
#undef PUTC
    free(cur);
    *pos = i;
    *fields = f;
    *n_fields = nf;
    *lines_used = lines;
    return 0;
}

static void add_pair(loom_labels *l, int *cap, const char *key, const char *label, int line, int is_sha) {
    if (l->n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        l->v = loom_realloc(l->v, (size_t)*cap * sizeof *l->v);
    }
    l->v[l->n++] = (pair){norm_key(key, is_sha), loom_strdup(label), line};
}

static int load_jsonl(loom_labels *l, const char *path, const char *text, size_t len,
                      const char *key, const char *field, int is_sha, loom_err *err) {
    int cap = 0, line = 0;
    size_t pos = 0;
    while (pos < len) {
        line++;
        const char *start = text + pos, *nl = memchr(start, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - start) : len - pos;
        pos += n + (nl ? 1 : 0);
        size_t i = 0;
        while (i < n && (start[i] == ' ' || start[i] == '\t' || start[i] == '\r')) i++;
        if (i == n) continue;
        json_error_t je;
        json_t *o = json_loadb(start, n, JSON_REJECT_DUPLICATES, &je);
        if (!o) return loom_errf(err, "%s:%d: invalid JSON at column %d: %s", path, line, je.column, je.text);
        json_t *k = json_is_object(o) ? json_object_get(o, key) : NULL;
        json_t *v = json_is_object(o) ? json_object_get(o, field) : NULL;
        char num[32];
        const char *label = NULL;
        if (json_is_string(v)) label = json_string_value(v);
        else if (json_is_integer(v)) {
            snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
            label = num;
        }
        if (!json_is_string(k) || !label || !*label || !*json_string_value(k)) {
            json_decref(o);
            return loom_errf(err, "%s:%d: expected an object with a string \"%s\" and a string or "
                             "integer \"%s\"", path, line, key, field);
        }
        add_pair(l, &cap, json_string_value(k), label, line, is_sha);
        json_decref(o);
    }
    return 0;
}

static int load_csv(loom_labels *l, const char *path, const char *text, size_t len,
                    const char *key, const char *field, int is_sha, loom_err *err) {
    size_t pos = 0;
    int line = 1, cap = 0, kcol = -1, lcol = -1, ncol = 0, rc = 0;
    while (pos < len && rc == 0) {
        char **f;
        int nf, used;
        if (loom_csv_record(text, len, &pos, &f, &nf, &used, err) != 0)
            return loom_err_prefix(err, "%s:%d", path, line);
        int blank = nf == 1 && f[0][0] == 0;
        if (blank) {
        } else if (kcol < 0) {
            ncol = nf;
            for (int i = 0; i < nf; i++) {
                if (!strcmp(f[i], key)) kcol = i;
                if (!strcmp(f[i], field)) lcol = i;
            }
            if (kcol < 0 || lcol < 0)
                rc = loom_errf(err, "%s:%d: the header row needs columns \"%s\" and \"%s\"", path,
                               line, key, field);
        } else if (nf != ncol) {
            rc = loom_errf(err, "%s:%d: %d fields, the header has %d", path, line, nf, ncol);
        } else if (!f[kcol][0] || !f[lcol][0]) {
            rc = loom_errf(err, "%s:%d: empty \"%s\" or \"%s\"", path, line, key, field);
        } else {
            add_pair(l, &cap, f[kcol], f[lcol], line, is_sha);
        }
        for (int i = 0; i < nf; i++) free(f[i]);
        free(f);
        line += used;
    }
    if (rc == 0 && kcol < 0) rc = loom_errf(err, "%s: no header row", path);
    return rc;
}

int loom_labels_load(const char *path, const char *key, const char *field, loom_labels **out,
                     loom_err *err) {
    *out = NULL;
    char *text;
    size_t len;
    if (loom_read_file(path, LABELS_MAX_BYTES, &text, &len, err) != 0) return -1;
    loom_labels *l = loom_calloc(1, sizeof *l);
    int is_sha = !strcmp(key, "sha256");
    size_t pn = strlen(path);
    int csv = pn >= 4 && !strcmp(path + pn - 4, ".csv");
    int rc = csv ? load_csv(l, path, text, len, key, field, is_sha, err)
                 : load_jsonl(l, path, text, len, key, field, is_sha, err);
    free(text);
    if (rc == 0 && l->n) {
        qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_pair);
        int w = 0, i;
        for (i = 0; i < l->n && rc == 0; i++) {
            if (w > 0 && !strcmp(l->v[w - 1].key, l->v[i].key)) {
                if (strcmp(l->v[w - 1].label, l->v[i].label) != 0)
                    rc = loom_errf(err, "%s:%d: \"%s\" is labelled \"%s\" here and \"%s\" on line %d",
                                   path, l->v[i].line, l->v[i].key, l->v[i].label,
                                   l->v[w - 1].label, l->v[w - 1].line);
                free(l->v[i].key);
                free(l->v[i].label);
                continue;
            }
            l->v[w++] = l->v[i];
        }
        if (rc == 0) l->n = w;
        else {
            /* the unique prefix [0, w) and the tail (i, n) still own strings; free them all */
            for (int j = 0; j < w; j++) free(l->v[j].key), free(l->v[j].label);
            for (int j = i; j < l->n; j++) free(l->v[j].key), free(l->v[j].label);
            l->n = 0;
        }
    }
    if (rc != 0) {
        loom_labels_free(l);
        return -1;
    }
    l->names = loom_malloc((size_t)(l->n + 1) * sizeof *l->names);
    for (int i = 0; i < l->n; i++) l->names[i] = l->v[i].label;
    if (l->n) qsort(l->names, (size_t)l->n, sizeof *l->names, cmp_cstr);
    int w = 0;
    for (int i = 0; i < l->n; i++)
        if (w == 0 || strcmp(l->names[w - 1], l->names[i])) l->names[w++] = l->names[i];
    l->n_names = w;
    *out = l;
    return 0;
}

void loom_labels_free(loom_labels *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) {
        free(l->v[i].key);
        free(l->v[i].label);
    }
    free(l->v);
    free(l->names);
    free(l);
}

const char *loom_labels_find(const loom_labels *l, const char *key) {
    pair k = {(char *)key, NULL, 0};
    const pair *p = l->n ? bsearch(&k, l->v, (size_t)l->n, sizeof *l->v, cmp_pair) : NULL;
    return p ? p->label : NULL;
}

int loom_labels_names(const loom_labels *l, const char ***names) {
    *names = l->names;
    return l->n_names;
}

int loom_read_binary(loom_read_ctx *c, int fi, loom_err *err) {
    const loom_recipe_source *s = c->src;
    const loom_input *f = &c->inputs->v[fi];
    int32_t label = -1;
    if (c->labels) {
        const char *name = NULL;
        if (!strcmp(s->label_key, "sha256")) name = loom_labels_find(c->labels, f->sha256);
        else {
            char *k = norm_key(f->rel, 0);
            name = loom_labels_find(c->labels, k);
            free(k);
        }
        if (!name) name = s->default_label;
        if (!name) {
            loom_warn("source '%s': skipped %s: no label in %s", s->name, f->path, s->labels);
            loom_skips_add(c->unlabeled, f->path, "no label");
            return 0;
        }
        const char *const *hit = bsearch(&name, c->classes, (size_t)c->n_classes, sizeof *c->classes, cmp_cstr);
        LOOM_CHECK(hit != NULL); /* the build collected every label into classes */
        label = (int32_t)(hit - c->classes);
    }
    uint8_t *buf;
    size_t len;
    if (loom_input_read(f, BINARY_MAX_BYTES, &buf, &len, err) != 0) return -1;
    if (len) loom_docs_add(c->docs, buf, len, label, fi);
    else c->empty_docs++;
    free(buf);
    return 0;
}
