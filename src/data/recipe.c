/* Recipe YAML -> loom_recipe, read with base's one YAML reader (base/yaml.h: the dialect,
 * the refusals, file:line:col of each node). Every error names file:line; unknown keys,
 * duplicate keys, wrong types and out-of-range values are errors. The reference is
 * docs/recipes.md. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/recipe.h"

#include <errno.h>
#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/yaml.h"

#define DEFAULT_MAX_LINE ((int64_t)64 << 20)

typedef const loom_yaml_node ynode;

typedef struct ctx {
    const char *file;
    loom_err *err;
} ctx;

static int line_of(ynode *n) { return n->line; }

static int failf(ctx *c, const ynode *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int failf(ctx *c, const ynode *n, const char *fmt, ...) {
    char msg[1500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return loom_errf(c->err, "%s:%d: %s", c->file, n ? line_of(n) : 1, msg);
}

/* A scalar's text (length in *len); NULL with an error when n is not a scalar. */
static const char *scalar(ctx *c, ynode *n, const char *key, size_t *len) {
    if (n->kind != LOOM_YAML_SCALAR) {
        failf(c, n, "'%s' must be a single value", key);
        return NULL;
    }
    if (len) *len = n->len;
    return n->text;
}

static int get_str(ctx *c, ynode *n, const char *key, char **out, size_t *out_len) {
    size_t len;
    const char *s = scalar(c, n, key, &len);
    if (!s) return -1;
    if (!out_len && memchr(s, 0, len)) return failf(c, n, "'%s' contains a NUL byte", key);
    char *p = loom_malloc(len + 1);
    memcpy(p, s, len);
    p[len] = 0;
    free(*out); /* never set twice (duplicates are rejected), but stay leak-free */
    *out = p;
    if (out_len) *out_len = len;
    return 0;
}

/* A quoted scalar is a string (base/yaml.h's typing); say so when a number was wanted. */
static const char *quoted_note(ynode *n) {
    return n->quoted ? " (quoted, so a string)" : "";
}

static int get_int(ctx *c, ynode *n, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const char *s = scalar(c, n, key, NULL);
    if (!s) return -1;
    if (n->v.type != LOOM_YAML_INT)
        return failf(c, n, "'%s' must be an integer, got '%s'%s", key, s, quoted_note(n));
    const int64_t v = n->v.i;
    if (v < lo || v > hi)
        return failf(c, n, "'%s' is out of range: %s (allowed: %lld..%lld)", key, s,
                     (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

static int get_double(ctx *c, ynode *n, const char *key, double *out) {
    const char *s = scalar(c, n, key, NULL);
    if (!s) return -1;
    if ((n->v.type != LOOM_YAML_INT && n->v.type != LOOM_YAML_FLOAT) || !isfinite(n->v.f))
        return failf(c, n, "'%s' must be a number, got '%s'%s", key, s, quoted_note(n));
    *out = n->v.f;
    return 0;
}

static int get_bool(ctx *c, ynode *n, const char *key, int *out) {
    const char *s = scalar(c, n, key, NULL);
    if (!s) return -1;
    if (n->v.type != LOOM_YAML_BOOL)
        return failf(c, n, "'%s' must be true or false, got '%s'%s", key, s, quoted_note(n));
    *out = n->v.b;
    return 0;
}

/* Checks that every key of mapping n is in `known` (the reader refuses a key given twice). */
static int check_keys(ctx *c, ynode *n, const char *const *known, const char *where) {
    char list[512] = "";
    for (int i = 0; known[i]; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, known[i], sizeof list - strlen(list) - 1);
    }
    for (size_t p = 0; p < n->n; p++) {
        ynode *k = &n->kids[2 * p];
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(known[i], k->text);
        if (!ok) return failf(c, k, "unknown key '%s' in %s (known keys: %s)", k->text, where, list);
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

/* ---- canonical text of a node: comments and layout do not matter, content does ---- */
/* (in base's loom_sbuf) */
static void sb_put(loom_sbuf *b, const char *s, size_t n) { loom_sbuf_append(b, s, n); }

static void canon(ynode *n, loom_sbuf *b, int depth) {
    char num[32];
    if (depth > 64) return; /* recipes are shallow; a hostile one only loses cache precision */
    switch (n->kind) {
    case LOOM_YAML_SCALAR:
        snprintf(num, sizeof num, "s%zu:", n->len);
        sb_put(b, num, strlen(num));
        sb_put(b, n->text, n->len);
        break;
    case LOOM_YAML_SEQ:
        sb_put(b, "[", 1);
        for (size_t i = 0; i < n->n; i++) canon(&n->kids[i], b, depth + 1);
        sb_put(b, "]", 1);
        break;
    case LOOM_YAML_MAP:
        sb_put(b, "{", 1);
        for (size_t i = 0; i < 2 * n->n; i++) canon(&n->kids[i], b, depth + 1);
        sb_put(b, "}", 1);
        break;
    }
}

/* ---- steps ---- */
const char *loom_step_name(loom_step_kind k) {
    switch (k) {
    case LOOM_STEP_UTF8_REPAIR: return "utf8_repair";
    case LOOM_STEP_LENGTH: return "length";
    case LOOM_STEP_REGEX: return "regex";
    case LOOM_STEP_DEDUP_EXACT: return "dedup_exact";
    case LOOM_STEP_DEDUP_NEAR: return "dedup_near";
    }
    return "?";
}

static int compile_re(ctx *c, ynode *n, const char *src_name, const char *pat, void **out) {
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &off,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return failf(c, n, "source '%s': regex '%s': %s at offset %zu", src_name, pat,
                     (const char *)msg, (size_t)off);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* best effort: the interpreter also works */
    *out = re;
    return 0;
}

static const char *const length_keys[] = {"min_bytes", "max_bytes", NULL};
static const char *const regex_keys[] = {"include", "exclude", NULL};
static const char *const near_keys[] = {"num_perm", "bands", "shingle", "threshold", NULL};

static int parse_step(ctx *c, ynode *n, const loom_recipe_source *s, loom_recipe_step *st) {
    st->line = line_of(n);
    st->min_bytes = 0;
    st->max_bytes = INT64_MAX;
    st->num_perm = 128;
    st->bands = 16;
    st->shingle = 5;
    st->threshold = 0.8;
    const char *name;
    ynode *params = NULL;
    if (n->kind == LOOM_YAML_SCALAR) {
        name = n->text;
    } else if (n->kind == LOOM_YAML_MAP && n->n == 1) {
        name = n->kids[0].text;
        params = &n->kids[1];
    } else {
        return failf(c, n, "source '%s': a step is a name (utf8_repair) or a one-key mapping "
                     "(length: {min_bytes: 1})", s->name);
    }
    static const struct { const char *name; loom_step_kind kind; int needs_params; } kinds[] = {
        {"utf8_repair", LOOM_STEP_UTF8_REPAIR, 0}, {"length", LOOM_STEP_LENGTH, 1},
        {"regex", LOOM_STEP_REGEX, 1}, {"dedup_exact", LOOM_STEP_DEDUP_EXACT, 0},
        {"dedup_near", LOOM_STEP_DEDUP_NEAR, 0}};
    int found = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(kinds[i].name, name)) found = i;
    if (found < 0)
        return failf(c, n, "source '%s': unknown step '%s' (known: utf8_repair, length, regex, "
                     "dedup_exact, dedup_near)", s->name, name);
    st->kind = kinds[found].kind;
    if (params && params->kind == LOOM_YAML_SCALAR && params->v.type == LOOM_YAML_NULL)
        params = NULL; /* "dedup_exact:" with nothing after it (or ~, null) */
    if (!params && kinds[found].needs_params)
        return failf(c, n, "source '%s': step '%s' needs parameters", s->name, name);
    if (params && st->kind == LOOM_STEP_UTF8_REPAIR)
        return failf(c, params, "source '%s': step 'utf8_repair' takes no parameters", s->name);
    if (params && st->kind == LOOM_STEP_DEDUP_EXACT)
        return failf(c, params, "source '%s': step 'dedup_exact' takes no parameters", s->name);
    if (s->kind == LOOM_SRC_BINARY &&
        (st->kind == LOOM_STEP_UTF8_REPAIR || st->kind == LOOM_STEP_REGEX))
        return failf(c, n, "source '%s': step '%s' does not apply to binary files", s->name, name);
    if (s->kind == LOOM_SRC_CHAT && st->kind == LOOM_STEP_UTF8_REPAIR)
        return failf(c, n, "source '%s': step 'utf8_repair' does not apply to chat sources (JSON "
                           "strings are valid UTF-8; a repair would move the loss mask)", s->name);
    if (!params) return 0;
    if (params->kind != LOOM_YAML_MAP)
        return failf(c, params, "source '%s': the parameters of step '%s' must be a mapping",
                     s->name, name);
    const char *const *known = st->kind == LOOM_STEP_LENGTH ? length_keys
                               : st->kind == LOOM_STEP_REGEX ? regex_keys
                                                             : near_keys;
    char where[128];
    snprintf(where, sizeof where, "step '%s'", name);
    if (check_keys(c, params, known, where) != 0) return -1;
    for (size_t p = 0; p < params->n; p++) {
        const char *k = params->kids[2 * p].text;
        ynode *v = &params->kids[2 * p + 1];
        int64_t iv;
        int rc = 0;
        if (!strcmp(k, "min_bytes")) rc = get_int(c, v, k, 0, INT64_MAX, &st->min_bytes);
        else if (!strcmp(k, "max_bytes")) rc = get_int(c, v, k, 0, INT64_MAX, &st->max_bytes);
        else if (!strcmp(k, "include")) rc = get_str(c, v, k, &st->include, NULL);
        else if (!strcmp(k, "exclude")) rc = get_str(c, v, k, &st->exclude, NULL);
        else if (!strcmp(k, "num_perm")) rc = get_int(c, v, k, 1, 1024, &iv), st->num_perm = (int)iv;
        else if (!strcmp(k, "bands")) rc = get_int(c, v, k, 1, 1024, &iv), st->bands = (int)iv;
        else if (!strcmp(k, "shingle")) rc = get_int(c, v, k, 1, 256, &iv), st->shingle = (int)iv;
        else if (!strcmp(k, "threshold")) {
            rc = get_double(c, v, k, &st->threshold);
            if (!rc && !(st->threshold > 0 && st->threshold <= 1))
                rc = failf(c, v, "'threshold' must be in (0, 1], got %s",
                           v->text);
        }
        if (rc) return -1;
        if (!strcmp(k, "include") && compile_re(c, v, s->name, st->include, &st->include_re)) return -1;
        if (!strcmp(k, "exclude") && compile_re(c, v, s->name, st->exclude, &st->exclude_re)) return -1;
    }
    if (st->kind == LOOM_STEP_LENGTH && st->min_bytes > st->max_bytes)
        return failf(c, params, "source '%s': length: min_bytes %lld > max_bytes %lld", s->name,
                     (long long)st->min_bytes, (long long)st->max_bytes);
    if (st->kind == LOOM_STEP_REGEX && !st->include && !st->exclude)
        return failf(c, params, "source '%s': regex needs 'include' or 'exclude'", s->name);
    if (st->kind == LOOM_STEP_DEDUP_NEAR && st->num_perm % st->bands != 0)
        return failf(c, params, "source '%s': dedup_near: bands (%d) must divide num_perm (%d)",
                     s->name, st->bands, st->num_perm);
    return 0;
}

/* ---- sources ---- */
static const char *const source_keys[] = {
    "name", "kind", "path", "exclude", "split", "doc_suffix", "text_field", "on_error",
    "max_line_bytes", "labels", "label_key", "label_field", "default_label", "weight",
    "repeat_cap", "steps", "template", "messages_field", "pack", "too_long", NULL};

static int parse_source(ctx *c, ynode *n, loom_recipe_source *s) {
    s->line = line_of(n);
    s->weight = 1.0;
    s->repeat_cap = 0.0;
    s->max_line_bytes = DEFAULT_MAX_LINE;
    if (n->kind != LOOM_YAML_MAP)
        return failf(c, n, "each entry of 'sources' must be a mapping (name, kind, path, ...)");
    if (check_keys(c, n, source_keys, "a source") != 0) return -1;
    loom_sbuf cb = {0};
    canon(n, &cb, 0);
    s->canon = cb.p ? cb.p : loom_strdup("");
    ynode *steps = NULL, *kind_node = n, *on_error = NULL, *label_key_node = n;
    ynode *pack_node = NULL, *too_long = NULL, *max_line = NULL;
    s->pack = 1;
    for (size_t p = 0; p < n->n; p++) {
        const char *k = n->kids[2 * p].text;
        ynode *v = &n->kids[2 * p + 1];
        int rc = 0;
        char *tmp = NULL;
        if (!strcmp(k, "name")) rc = get_str(c, v, k, &s->name, NULL);
        else if (!strcmp(k, "kind")) rc = get_str(c, v, k, &s->kind_name, NULL), kind_node = v;
        else if (!strcmp(k, "path")) rc = get_str(c, v, k, &s->path, NULL);
        else if (!strcmp(k, "split")) rc = get_str(c, v, k, &s->split, &s->split_len);
        else if (!strcmp(k, "doc_suffix")) rc = get_str(c, v, k, &s->doc_suffix, &s->doc_suffix_len);
        else if (!strcmp(k, "text_field")) rc = get_str(c, v, k, &s->text_field, NULL);
        else if (!strcmp(k, "labels")) rc = get_str(c, v, k, &s->labels, NULL);
        else if (!strcmp(k, "label_key")) rc = get_str(c, v, k, &s->label_key, NULL), label_key_node = v;
        else if (!strcmp(k, "label_field")) rc = get_str(c, v, k, &s->label_field, NULL);
        else if (!strcmp(k, "default_label")) rc = get_str(c, v, k, &s->default_label, NULL);
        else if (!strcmp(k, "max_line_bytes"))
            rc = get_int(c, v, k, 1, (int64_t)1 << 30, &s->max_line_bytes), max_line = v;
        else if (!strcmp(k, "template")) rc = get_str(c, v, k, &s->chat_template, NULL);
        else if (!strcmp(k, "messages_field")) rc = get_str(c, v, k, &s->messages_field, NULL);
        else if (!strcmp(k, "pack")) rc = get_bool(c, v, k, &s->pack), pack_node = v;
        else if (!strcmp(k, "too_long")) {
            rc = get_str(c, v, k, &tmp, NULL);
            too_long = v;
            if (!rc && !strcmp(tmp, "drop")) s->drop_long = 1;
            else if (!rc && strcmp(tmp, "split") != 0)
                rc = failf(c, v, "'too_long' must be split or drop, got '%s'", tmp);
            free(tmp);
        }
        else if (!strcmp(k, "on_error")) {
            rc = get_str(c, v, k, &tmp, NULL);
            on_error = v;
            if (!rc && !strcmp(tmp, "skip")) s->on_error_skip = 1;
            else if (!rc && strcmp(tmp, "fail") != 0)
                rc = failf(c, v, "'on_error' must be skip or fail, got '%s'", tmp);
            free(tmp);
        } else if (!strcmp(k, "weight")) {
            rc = get_double(c, v, k, &s->weight);
            if (!rc && !(s->weight > 0))
                rc = failf(c, v, "'weight' must be positive, got %s", v->text);
        } else if (!strcmp(k, "repeat_cap")) {
            rc = get_double(c, v, k, &s->repeat_cap);
            if (!rc && !(s->repeat_cap >= 0))
                rc = failf(c, v, "'repeat_cap' must be >= 0 (0 = no cap), got %s",
                           v->text);
        } else if (!strcmp(k, "steps")) steps = v;
        else if (!strcmp(k, "exclude")) {
            if (v->kind != LOOM_YAML_SEQ)
                return failf(c, v, "'exclude' must be a list of file-name patterns");
            int n_items = (int)v->n;
            s->exclude = loom_calloc((size_t)n_items + 1, sizeof *s->exclude);
            for (int i = 0; i < n_items; i++) {
                ynode *it = &v->kids[i];
                if (get_str(c, it, "exclude", &s->exclude[i], NULL) != 0) return -1;
                s->n_exclude = i + 1;
            }
        }
        if (rc) return -1;
    }
    if (!s->name) return failf(c, n, "source is missing 'name'");
    if (!valid_name(s->name))
        return failf(c, n, "source name '%s' must be 1-64 characters of [A-Za-z0-9_.-]", s->name);
    if (!s->kind_name) return failf(c, n, "source '%s' is missing 'kind' (text, jsonl, chat, preference, binary)", s->name);
    if (!strcmp(s->kind_name, "text")) s->kind = LOOM_SRC_TEXT;
    else if (!strcmp(s->kind_name, "jsonl")) s->kind = LOOM_SRC_JSONL;
    else if (!strcmp(s->kind_name, "binary")) s->kind = LOOM_SRC_BINARY;
    else if (!strcmp(s->kind_name, "chat")) s->kind = LOOM_SRC_CHAT;
    else if (!strcmp(s->kind_name, "preference")) s->kind = LOOM_SRC_CHAT, s->preference = 1;
    else
        return failf(c, kind_node, "source '%s': unsupported kind '%s' (supported: text, jsonl, chat, preference, binary)",
                     s->name, s->kind_name);
    if (!s->path || !*s->path) return failf(c, n, "source '%s' is missing 'path'", s->name);
    if (s->split && s->split_len == 0) return failf(c, n, "source '%s': 'split' must not be empty", s->name);
    /* keys that belong to another kind are mistakes, not options to ignore */
    struct { const char *key; int set, ok; } own[] = {
        {"split", s->split != NULL, s->kind == LOOM_SRC_TEXT},
        {"text_field", s->text_field != NULL, s->kind == LOOM_SRC_JSONL},
        {"on_error", on_error != NULL, s->kind == LOOM_SRC_JSONL || s->kind == LOOM_SRC_CHAT},
        {"max_line_bytes", max_line != NULL, s->kind == LOOM_SRC_JSONL || s->kind == LOOM_SRC_CHAT},
        {"template", s->chat_template != NULL, s->kind == LOOM_SRC_CHAT},
        {"messages_field", s->messages_field != NULL, s->kind == LOOM_SRC_CHAT && !s->preference},
        {"pack", pack_node != NULL, s->kind == LOOM_SRC_CHAT && !s->preference},
        {"too_long", too_long != NULL, s->kind == LOOM_SRC_CHAT && !s->pack && !s->preference},
        {"doc_suffix", s->doc_suffix != NULL, s->kind != LOOM_SRC_CHAT},
        {"labels", s->labels != NULL, s->kind == LOOM_SRC_BINARY},
        {"label_key", s->label_key != NULL, s->kind == LOOM_SRC_BINARY},
        {"label_field", s->label_field != NULL, s->kind == LOOM_SRC_BINARY},
        {"default_label", s->default_label != NULL, s->kind == LOOM_SRC_BINARY},
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i].set && !own[i].ok)
            return failf(c, n, "source '%s': '%s' does not apply to kind '%s'", s->name, own[i].key,
                         s->kind_name);
    if (!s->text_field && s->kind == LOOM_SRC_JSONL) s->text_field = loom_strdup("text");
    if (s->preference) s->pack = 0, s->drop_long = 1; /* each half one window */
    if (s->kind == LOOM_SRC_CHAT) {
        if (!s->chat_template) s->chat_template = loom_strdup("chatml");
        if (!s->messages_field) s->messages_field = loom_strdup("messages");
    }
    if (s->kind == LOOM_SRC_BINARY) {
        if (!s->label_key) s->label_key = loom_strdup("path");
        if (strcmp(s->label_key, "path") && strcmp(s->label_key, "sha256"))
            return failf(c, label_key_node, "source '%s': 'label_key' must be path or sha256, got '%s'",
                         s->name, s->label_key);
        if (!s->label_field) s->label_field = loom_strdup("label");
        if ((s->label_field[0] == 0) || !strcmp(s->label_field, s->label_key))
            return failf(c, n, "source '%s': 'label_field' must name a column other than '%s'",
                         s->name, s->label_key);
        if (!s->labels && s->default_label)
            return failf(c, n, "source '%s': 'default_label' needs a 'labels' file", s->name);
    }
    if (steps) {
        if (steps->kind != LOOM_YAML_SEQ)
            return failf(c, steps, "source '%s': 'steps' must be a list", s->name);
        int n_items = (int)steps->n;
        s->steps = loom_calloc((size_t)n_items + 1, sizeof *s->steps);
        for (int i = 0; i < n_items; i++) {
            ynode *it = &steps->kids[i];
            s->n_steps = i + 1;
            if (parse_step(c, it, s, &s->steps[i]) != 0) return -1;
        }
    }
    return 0;
}

static const char *const top_keys[] = {"name", "description", "sources", "tokenizer", "seq_len",
                                       "val_fraction", "output", "shard_tokens",
                                       "dedup_across_sources", NULL};
static const char *const tok_keys[] = {"type", "path", NULL};

static int parse_tokenizer(ctx *c, ynode *v, loom_recipe *r) {
    r->tokenizer_line = line_of(v);
    if (v->kind == LOOM_YAML_SCALAR) return get_str(c, v, "tokenizer", &r->tokenizer, NULL);
    if (v->kind != LOOM_YAML_MAP)
        return failf(c, v, "'tokenizer' must be 'byte' or a mapping {type: bpe, path: tokenizer.json}");
    if (check_keys(c, v, tok_keys, "'tokenizer'") != 0) return -1;
    for (size_t p = 0; p < v->n; p++) {
        const char *k = v->kids[2 * p].text;
        ynode *x = &v->kids[2 * p + 1];
        int rc = !strcmp(k, "type") ? get_str(c, x, k, &r->tokenizer, NULL)
                                    : get_str(c, x, k, &r->tokenizer_path, NULL);
        if (rc) return -1;
    }
    if (!r->tokenizer) return failf(c, v, "'tokenizer' is missing 'type' (byte, bpe)");
    return 0;
}

static int parse_root(ctx *c, ynode *root, loom_recipe *r) {
    if (root->kind != LOOM_YAML_MAP)
        return failf(c, root, "a recipe must be a mapping of keys (name, sources, ...)");
    if (check_keys(c, root, top_keys, "the recipe") != 0) return -1;
    ynode *sources = NULL, *name_node = root, *tok_node = root;
    char *description = NULL;
    for (size_t p = 0; p < root->n; p++) {
        const char *k = root->kids[2 * p].text;
        ynode *v = &root->kids[2 * p + 1];
        int rc = 0;
        if (!strcmp(k, "name")) rc = get_str(c, v, k, &r->name, NULL), name_node = v;
        else if (!strcmp(k, "description")) rc = get_str(c, v, k, &description, NULL);
        else if (!strcmp(k, "tokenizer")) rc = parse_tokenizer(c, v, r), tok_node = v;
        else if (!strcmp(k, "output")) rc = get_str(c, v, k, &r->output, NULL);
        else if (!strcmp(k, "seq_len")) rc = get_int(c, v, k, 1, INT32_MAX, &r->seq_len);
        else if (!strcmp(k, "shard_tokens")) rc = get_int(c, v, k, 1, (int64_t)1 << 28, &r->shard_tokens);
        else if (!strcmp(k, "dedup_across_sources")) rc = get_bool(c, v, k, &r->dedup_across_sources);
        else if (!strcmp(k, "val_fraction")) {
            rc = get_double(c, v, k, &r->val_fraction);
            if (!rc && !(r->val_fraction >= 0.0 && r->val_fraction < 1.0))
                rc = failf(c, v, "'val_fraction' must be in [0, 1), got %s",
                           v->text);
        } else if (!strcmp(k, "sources")) sources = v;
        if (rc) {
            free(description);
            return -1;
        }
    }
    free(description);
    if (!r->name) return failf(c, root, "the recipe is missing 'name'");
    if (!valid_name(r->name))
        return failf(c, name_node, "recipe name '%s' must be 1-64 characters of [A-Za-z0-9_.-]", r->name);
    if (!r->output || !*r->output) return failf(c, root, "the recipe is missing 'output'");
    if (!r->tokenizer) return failf(c, root, "the recipe is missing 'tokenizer' (byte)");
    if (!strcmp(r->tokenizer, "byte")) {
        if (r->tokenizer_path)
            return failf(c, tok_node, "tokenizer 'byte' takes no 'path'");
    } else if (!strcmp(r->tokenizer, "bpe")) {
        if (!r->tokenizer_path || !*r->tokenizer_path)
            return failf(c, tok_node, "tokenizer 'bpe' needs 'path' (a tokenizer.json)");
    } else {
        return failf(c, tok_node, "unsupported tokenizer '%s' (supported: byte, bpe)", r->tokenizer);
    }
    if (!sources) return failf(c, root, "the recipe is missing 'sources'");
    if (sources->kind != LOOM_YAML_SEQ) return failf(c, sources, "'sources' must be a list of sources");
    int n = (int)sources->n;
    if (n == 0) return failf(c, sources, "'sources' is empty");
    r->sources = loom_calloc((size_t)n, sizeof *r->sources);
    for (int i = 0; i < n; i++) {
        r->n_sources = i + 1;
        ynode *sn = &sources->kids[i];
        if (parse_source(c, sn, &r->sources[i]) != 0) return -1;
        for (int j = 0; j < i; j++)
            if (!strcmp(r->sources[j].name, r->sources[i].name))
                return failf(c, sn, "two sources are named '%s'", r->sources[i].name);
        if (r->sources[i].kind == LOOM_SRC_BINARY && strcmp(r->tokenizer, "byte") != 0)
            return failf(c, sn, "source '%s': binary sources need 'tokenizer: byte' (raw bytes are the tokens)",
                         r->sources[i].name);
    }
    return 0;
}

int loom_recipe_load(const char *path, loom_recipe *r, loom_err *err) {
    memset(r, 0, sizeof *r);
    r->file = loom_strdup(path);
    r->seq_len = 256;
    r->shard_tokens = 1 << 20;
    if (loom_read_file(path, LOOM_YAML_MAX_BYTES, &r->text, &r->text_len, err) != 0) return -1;
    loom_sha256_hex(r->text, r->text_len, r->sha256);
    loom_yaml_node *root = NULL;
    if (loom_yaml_parse(path, r->text, r->text_len, &root, err) != 0) return -1;
    ctx c = {path, err};
    int rc;
    if (!root) rc = loom_errf(err, "%s:1: the recipe is empty", path);
    else rc = parse_root(&c, root, r);
    loom_yaml_free(root);
    return rc;
}

void loom_recipe_free(loom_recipe *r) {
    for (int i = 0; i < r->n_sources; i++) {
        loom_recipe_source *s = &r->sources[i];
        free(s->name);
        free(s->kind_name);
        free(s->path);
        for (int j = 0; j < s->n_exclude; j++) free(s->exclude[j]);
        free(s->exclude);
        free(s->split);
        free(s->doc_suffix);
        free(s->text_field);
        free(s->chat_template);
        free(s->messages_field);
        free(s->labels);
        free(s->label_key);
        free(s->label_field);
        free(s->default_label);
        for (int j = 0; j < s->n_steps; j++) {
            free(s->steps[j].include);
            free(s->steps[j].exclude);
            pcre2_code_free((pcre2_code *)s->steps[j].include_re);
            pcre2_code_free((pcre2_code *)s->steps[j].exclude_re);
        }
        free(s->steps);
        free(s->canon);
    }
    free(r->sources);
    free(r->file);
    free(r->text);
    free(r->name);
    free(r->tokenizer);
    free(r->tokenizer_path);
    free(r->output);
    memset(r, 0, sizeof *r);
}
