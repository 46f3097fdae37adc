/* Recipe YAML -> loom_recipe, with libyaml's document API. Every error names file:line;
 * unknown keys, duplicate keys, wrong types and out-of-range values are errors. */
#include "data/recipe.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define RECIPE_MAX_BYTES ((size_t)1 << 20)

typedef struct ctx {
    const char *file;
    yaml_document_t *doc;
    loom_err *err;
} ctx;

static int line_of(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

static int fail(ctx *c, const yaml_node_t *n, const char *fmt, const char *a, const char *b) {
    char msg[1500];
    snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
    return loom_errf(c->err, "%s:%d: %s", c->file, n ? line_of(n) : 1, msg);
}

/* A scalar's text (length in *len); NULL with an error when n is not a scalar. */
static const char *scalar(ctx *c, yaml_node_t *n, const char *key, size_t *len) {
    if (n->type != YAML_SCALAR_NODE) {
        fail(c, n, "'%s' must be a single value%s", key, "");
        return NULL;
    }
    if (len) *len = n->data.scalar.length;
    return (const char *)n->data.scalar.value;
}

static int get_str(ctx *c, yaml_node_t *n, const char *key, char **out, size_t *out_len) {
    size_t len;
    const char *s = scalar(c, n, key, &len);
    if (!s) return -1;
    if (!out_len && memchr(s, 0, len)) return fail(c, n, "'%s' contains a NUL byte%s", key, "");
    char *p = loom_malloc(len + 1);
    memcpy(p, s, len);
    p[len] = 0;
    free(*out); /* never set twice (duplicates are rejected), but stay leak-free */
    *out = p;
    if (out_len) *out_len = len;
    return 0;
}

static int get_int(ctx *c, yaml_node_t *n, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const char *s = scalar(c, n, key, NULL);
    if (!s) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno) return fail(c, n, "'%s' must be an integer, got '%s'", key, s);
    if (v < lo || v > hi) {
        char range[128];
        snprintf(range, sizeof range, "%s (allowed: %lld..%lld)", s, (long long)lo, (long long)hi);
        return fail(c, n, "'%s' is out of range: %s", key, range);
    }
    *out = v;
    return 0;
}

static int get_double(ctx *c, yaml_node_t *n, const char *key, double *out) {
    const char *s = scalar(c, n, key, NULL);
    if (!s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v))
        return fail(c, n, "'%s' must be a number, got '%s'", key, s);
    *out = v;
    return 0;
}

/* Checks that every key of mapping n is in `known` and appears once. */
static int check_keys(ctx *c, yaml_node_t *n, const char *const *known, const char *where) {
    char list[512] = "";
    for (int i = 0; known[i]; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, known[i], sizeof list - strlen(list) - 1);
    }
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        if (k->type != YAML_SCALAR_NODE) return fail(c, k, "keys must be plain names%s%s", "", "");
        const char *name = (const char *)k->data.scalar.value;
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(known[i], name);
        if (!ok) {
            char msg[1200];
            snprintf(msg, sizeof msg, "%s (known keys: %s)", where, list);
            return fail(c, k, "unknown key '%s' in %s", name, msg);
        }
        for (yaml_node_pair_t *q = n->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *k2 = yaml_document_get_node(c->doc, q->key);
            if (k2->type == YAML_SCALAR_NODE && !strcmp((const char *)k2->data.scalar.value, name))
                return fail(c, k, "duplicate key '%s' in %s", name, where);
        }
    }
    return 0;
}

static int valid_name(const char *s) {
    if (!*s || strlen(s) > 64) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-' || *p == '.'))
            return 0;
    return 1;
}

static const char *const source_keys[] = {"name", "kind", "path", "exclude", "split",
                                          "doc_suffix", NULL};
static const char *const top_keys[] = {"name", "description", "sources", "tokenizer", "seq_len",
                                       "val_fraction", "output", "shard_tokens", NULL};

static int parse_source(ctx *c, yaml_node_t *n, loom_recipe_source *s) {
    s->line = line_of(n);
    if (n->type != YAML_MAPPING_NODE)
        return fail(c, n, "each entry of 'sources' must be a mapping (name, kind, path, ...)%s%s", "", "");
    if (check_keys(c, n, source_keys, "a source") != 0) return -1;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = (const char *)yaml_document_get_node(c->doc, p->key)->data.scalar.value;
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        int rc = 0;
        if (!strcmp(k, "name")) rc = get_str(c, v, k, &s->name, NULL);
        else if (!strcmp(k, "kind")) rc = get_str(c, v, k, &s->kind, NULL);
        else if (!strcmp(k, "path")) rc = get_str(c, v, k, &s->path, NULL);
        else if (!strcmp(k, "split")) rc = get_str(c, v, k, &s->split, &s->split_len);
        else if (!strcmp(k, "doc_suffix")) rc = get_str(c, v, k, &s->doc_suffix, &s->doc_suffix_len);
        else if (!strcmp(k, "exclude")) {
            if (v->type != YAML_SEQUENCE_NODE)
                return fail(c, v, "'exclude' must be a list of file-name patterns%s%s", "", "");
            int n_items = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
            s->exclude = loom_calloc((size_t)n_items + 1, sizeof *s->exclude);
            for (int i = 0; i < n_items; i++) {
                yaml_node_t *it = yaml_document_get_node(c->doc, v->data.sequence.items.start[i]);
                if (get_str(c, it, "exclude", &s->exclude[i], NULL) != 0) return -1;
                s->n_exclude = i + 1;
            }
        }
        if (rc) return -1;
    }
    if (!s->name) return fail(c, n, "source is missing 'name'%s%s", "", "");
    if (!valid_name(s->name))
        return fail(c, n, "source name '%s' must be 1-64 characters of [A-Za-z0-9_.-]%s", s->name, "");
    if (!s->kind) return fail(c, n, "source '%s' is missing 'kind' (text)%s", s->name, "");
    if (strcmp(s->kind, "text") != 0)
        return fail(c, n, "source '%s': unsupported kind '%s' (supported: text)", s->name, s->kind);
    if (!s->path || !*s->path) return fail(c, n, "source '%s' is missing 'path'%s", s->name, "");
    if (s->split && s->split_len == 0)
        return fail(c, n, "source '%s': 'split' must not be empty%s", s->name, "");
    return 0;
}

static int parse_root(ctx *c, yaml_node_t *root, loom_recipe *r) {
    if (root->type != YAML_MAPPING_NODE)
        return fail(c, root, "a recipe must be a mapping of keys (name, sources, ...)%s%s", "", "");
    if (check_keys(c, root, top_keys, "the recipe") != 0) return -1;
    yaml_node_t *sources = NULL, *name_node = root, *tok_node = root;
    char *description = NULL;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        const char *k = (const char *)yaml_document_get_node(c->doc, p->key)->data.scalar.value;
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        int rc = 0;
        if (!strcmp(k, "name")) rc = get_str(c, v, k, &r->name, NULL), name_node = v;
        else if (!strcmp(k, "description")) rc = get_str(c, v, k, &description, NULL);
        else if (!strcmp(k, "tokenizer")) rc = get_str(c, v, k, &r->tokenizer, NULL), tok_node = v;
        else if (!strcmp(k, "output")) rc = get_str(c, v, k, &r->output, NULL);
        else if (!strcmp(k, "seq_len")) rc = get_int(c, v, k, 1, INT32_MAX, &r->seq_len);
        else if (!strcmp(k, "shard_tokens")) rc = get_int(c, v, k, 1, (int64_t)1 << 28, &r->shard_tokens);
        else if (!strcmp(k, "val_fraction")) {
            rc = get_double(c, v, k, &r->val_fraction);
            if (!rc && !(r->val_fraction >= 0.0 && r->val_fraction < 1.0))
                rc = fail(c, v, "'val_fraction' must be in [0, 1), got %s%s",
                          (const char *)v->data.scalar.value, "");
        } else if (!strcmp(k, "sources")) sources = v;
        if (rc) {
            free(description);
            return -1;
        }
    }
    free(description);
    if (!r->name) return fail(c, root, "the recipe is missing 'name'%s%s", "", "");
    if (!valid_name(r->name))
        return fail(c, name_node, "recipe name '%s' must be 1-64 characters of [A-Za-z0-9_.-]%s", r->name, "");
    if (!r->output || !*r->output) return fail(c, root, "the recipe is missing 'output'%s%s", "", "");
    if (!r->tokenizer) return fail(c, root, "the recipe is missing 'tokenizer' (byte)%s%s", "", "");
    if (strcmp(r->tokenizer, "byte") != 0)
        return fail(c, tok_node, "unsupported tokenizer '%s' (supported: byte)%s", r->tokenizer, "");
    if (!sources) return fail(c, root, "the recipe is missing 'sources'%s%s", "", "");
    if (sources->type != YAML_SEQUENCE_NODE)
        return fail(c, sources, "'sources' must be a list of sources%s%s", "", "");
    int n = (int)(sources->data.sequence.items.top - sources->data.sequence.items.start);
    if (n == 0) return fail(c, sources, "'sources' is empty%s%s", "", "");
    r->sources = loom_calloc((size_t)n, sizeof *r->sources);
    for (int i = 0; i < n; i++) {
        r->n_sources = i + 1;
        yaml_node_t *sn = yaml_document_get_node(c->doc, sources->data.sequence.items.start[i]);
        if (parse_source(c, sn, &r->sources[i]) != 0) return -1;
        for (int j = 0; j < i; j++)
            if (!strcmp(r->sources[j].name, r->sources[i].name))
                return fail(c, sn, "two sources are named '%s'%s", r->sources[i].name, "");
    }
    return 0;
}

int loom_recipe_load(const char *path, loom_recipe *r, loom_err *err) {
    memset(r, 0, sizeof *r);
    r->file = loom_strdup(path);
    r->seq_len = 256;
    r->shard_tokens = 1 << 20;
    if (loom_read_file(path, RECIPE_MAX_BYTES, &r->text, &r->text_len, err) != 0) return -1;
    loom_sha256_hex(r->text, r->text_len, r->sha256);

    yaml_parser_t parser;
    yaml_document_t doc;
    LOOM_CHECK(yaml_parser_initialize(&parser));
    yaml_parser_set_input_string(&parser, (const unsigned char *)r->text, r->text_len);
    if (!yaml_parser_load(&parser, &doc)) {
        loom_errf(err, "%s:%d:%d: malformed YAML: %s%s%s", path,
                  (int)parser.problem_mark.line + 1, (int)parser.problem_mark.column + 1,
                  parser.problem ? parser.problem : "parse error",
                  parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return -1;
    }
    yaml_parser_delete(&parser);
    ctx c = {path, &doc, err};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    int rc;
    if (!root) rc = loom_errf(err, "%s:1: the recipe is empty", path);
    else rc = parse_root(&c, root, r);
    yaml_document_delete(&doc);
    return rc;
}

void loom_recipe_free(loom_recipe *r) {
    for (int i = 0; i < r->n_sources; i++) {
        loom_recipe_source *s = &r->sources[i];
        free(s->name);
        free(s->kind);
        free(s->path);
        for (int j = 0; j < s->n_exclude; j++) free(s->exclude[j]);
        free(s->exclude);
        free(s->split);
        free(s->doc_suffix);
    }
    free(r->sources);
    free(r->file);
    free(r->text);
    free(r->name);
    free(r->tokenizer);
    free(r->output);
    memset(r, 0, sizeof *r);
}
