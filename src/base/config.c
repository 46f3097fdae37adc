/* loom config tree: a flat, sorted array of (dotted key, value text, origin) built from
 * YAML files (read by base's one YAML reader, base/yaml.h), `--set` arguments and schema
 * defaults. A value remembers whether it was a quoted scalar: the typed getters type its text
 * as the reader types every scalar (loom_yaml_scalar_type), so a quoted "10" is a string.
 *
 * Keys are ordered component by component ('.' sorts before every other byte), so all keys
 * under one section are contiguous and a section's own keys come out in name order; the
 * YAML writer relies on that to open each section exactly once. */
#define _GNU_SOURCE
#include "loom/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/yaml.h"

#define CONFIG_MAX_DEPTH LOOM_YAML_MAX_DEPTH

typedef struct entry {
    char *key;
    char *value;
    char *origin; /* "path:line", "--set", "default", or a caller's label */
    char *help;   /* from the schema, NULL when none; written as a comment */
    long line;    /* 1-based line in the file it came from, 0 when not from a file */
    int quoted;   /* a quoted scalar in its file or --set (a string, whatever its text) */
} entry;

struct loom_config {
    entry *e; /* sorted by key_cmp */
    int n, cap;
};

/* ---- text building: loom_sbuf (include/loom/base.h) and a few shorthands ------------- */
static void sb_putn(loom_sbuf *b, const char *s, size_t n) { loom_sbuf_append(b, s, n); }
static void sb_puts(loom_sbuf *b, const char *s) { loom_sbuf_append(b, s, strlen(s)); }
static void sb_putc(loom_sbuf *b, char ch) { loom_sbuf_append(b, &ch, 1); }
static void sb_indent(loom_sbuf *b, int depth) {
    for (int i = 0; i < depth; i++) sb_puts(b, "  ");
}
/* Returns the text (never NULL) and hands ownership to the caller. */
static char *sb_take(loom_sbuf *b) {
    if (!b->p) loom_sbuf_append(b, "", 0);
    char *p = b->p;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

/* ---- the sorted entry array ----------------------------------------------------------- */

/* Lexicographic order with '.' below every other byte: "a.b" < "a.b.c" < "a.b-x" < "a.bc". */
static int key_cmp(const char *a, const char *b) {
    for (;; a++, b++) {
        int ca = *a == 0 ? 0 : *a == '.' ? 1 : (unsigned char)*a + 1;
        int cb = *b == 0 ? 0 : *b == '.' ? 1 : (unsigned char)*b + 1;
        if (ca != cb) return ca < cb ? -1 : 1;
        if (ca == 0) return 0;
    }
}

/* Index of key, or -(insertion point) - 1 when absent. */
static int find(const loom_config *c, const char *key) {
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int r = key_cmp(c->e[mid].key, key);
        if (r == 0) return mid;
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -lo - 1;
}

static void put(loom_config *c, const char *key, const char *value, const char *origin, long line,
                int quoted) {
    int i = find(c, key);
    if (i >= 0) {
        entry *x = &c->e[i];
        free(x->value);
        free(x->origin);
        x->value = loom_strdup(value);
        x->origin = loom_strdup(origin ? origin : "");
        x->line = line;
        x->quoted = quoted;
        return;
    }
    i = -i - 1;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 32;
        c->e = loom_realloc(c->e, (size_t)c->cap * sizeof *c->e);
    }
    memmove(c->e + i + 1, c->e + i, (size_t)(c->n - i) * sizeof *c->e);
    c->e[i] = (entry){loom_strdup(key), loom_strdup(value), loom_strdup(origin ? origin : ""),
                      NULL, line, quoted};
    c->n++;
}

/* A key is one or more non-empty components separated by single dots. */
static int key_is_valid(const char *key) {
    if (!key[0] || key[0] == '.') return 0;
    for (const char *p = key; *p; p++)
        if (*p == '.' && (p[1] == '.' || p[1] == 0)) return 0;
    return 1;
}

loom_config *loom_config_new(void) { return loom_calloc(1, sizeof(loom_config)); }

void loom_config_free(loom_config *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].key);
        free(c->e[i].value);
        free(c->e[i].origin);
        free(c->e[i].help);
    }
    free(c->e);
    free(c);
}

void loom_config_set(loom_config *c, const char *key, const char *value, const char *origin) {
    LOOM_CHECK(key_is_valid(key));
    put(c, key, value, origin, 0, 0);
}

/* ---- quoting: shared by the YAML writer and the list normalizer ------------------------ */

/* Text that reads back as itself when written bare (as a mapping value or a list item). */
static int plain_is_safe(const char *s) {
    if (!s[0]) return 0;
    if (s[0] == '-' && !s[1]) return 0; /* a lone '-' opens a block sequence */
    /* "---" and "..." at the start of a line (a top-level key) mark documents */
    if (strncmp(s, "---", 3) == 0 || strncmp(s, "...", 3) == 0) return 0;
    for (const char *p = s; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (!(isalnum(ch) || ch == '_' || ch == '.' || ch == '/' || ch == '+' || ch == '-'))
            return 0;
    }
    return 1;
}

static void put_quoted(loom_sbuf *b, const char *s) {
    sb_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': sb_puts(b, "\\\""); break;
        case '\\': sb_puts(b, "\\\\"); break;
        case '\n': sb_puts(b, "\\n"); break;
        case '\t': sb_puts(b, "\\t"); break;
        case '\r': sb_puts(b, "\\r"); break;
        default:
            if (*p < 0x20 || *p == 0x7f) {
                snprintf(esc, sizeof esc, "\\x%02x", *p);
                sb_puts(b, esc);
            } else if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
                /* C1 controls (U+0080..U+009F) may not appear raw in a YAML stream */
                snprintf(esc, sizeof esc, "\\x%02x", p[1]);
                sb_puts(b, esc);
                p++;
            } else if (p[0] == 0xef && p[1] == 0xbf && (p[2] == 0xbe || p[2] == 0xbf)) {
                /* nor may the noncharacters U+FFFE and U+FFFF */
                sb_puts(b, p[2] == 0xbe ? "\\uFFFE" : "\\uFFFF");
                p += 2;
            } else {
                sb_putc(b, (char)*p); /* UTF-8 passes through untouched */
            }
        }
    }
    sb_putc(b, '"');
}

static void put_scalar(loom_sbuf *b, const char *s) {
    if (plain_is_safe(s)) sb_puts(b, s);
    else put_quoted(b, s);
}

/* ---- YAML reading: base's one reader (base/yaml.h), flattened ------------------------ */

typedef struct reader {
    const char *name; /* file name (or --set argument) for messages */
    loom_config *out; /* values read, committed to the caller's tree only on success */
    loom_config *seen; /* every key and section key read, with its line (duplicates) */
    loom_err *err;
} reader;

/* A scalar written into a list's flow text: bare when it reads back as the same scalar of
 * the same type, quoted otherwise. */
static int reads_back_bare(const char *s, int quoted) {
    if (!plain_is_safe(s)) return 0;
    if (!quoted) return 1;
    loom_yaml_value v;
    loom_yaml_scalar_type(s, strlen(s), 0, &v);
    return v.type == LOOM_YAML_STR;
}

static void put_item(loom_sbuf *b, const char *s, int quoted) {
    if (reads_back_bare(s, quoted)) sb_puts(b, s);
    else put_quoted(b, s);
}

/* A scalar's text as a C string; a NUL inside is an error. */
static int scalar_text(const char *name, const loom_yaml_node *n, loom_err *err) {
    if (strlen(n->text) != n->len)
        return loom_errf(err, "%s:%d: NUL byte in a scalar", name, n->line);
    return 0;
}

/* A sequence as its flow text "[a, b, [c]]", appended to b. */
static int flow_text(const char *name, const loom_yaml_node *seq, loom_sbuf *b, loom_err *err) {
    sb_putc(b, '[');
    for (size_t i = 0; i < seq->n; i++) {
        const loom_yaml_node *it = &seq->kids[i];
        if (i) sb_puts(b, ", ");
        if (it->kind == LOOM_YAML_SCALAR) {
            if (scalar_text(name, it, err)) return -1;
            put_item(b, it->text, it->quoted);
        } else if (it->kind == LOOM_YAML_SEQ) {
            if (flow_text(name, it, b, err)) return -1;
        } else {
            return loom_errf(err, "%s:%d:%d: a mapping inside a list is not supported in configs",
                             name, it->line, it->col);
        }
    }
    sb_putc(b, ']');
    return 0;
}

/* Records a key (or section key) as read at `line`; an error if it was read before (the
 * reader refuses a key twice in one mapping; this catches "a.b: 1" beside "a: {b: 2}"). */
static int mark_seen(reader *r, const char *key, long line) {
    int i = find(r->seen, key);
    if (i >= 0)
        return loom_errf(r->err, "%s:%ld: duplicate key '%s' (first at line %ld)", r->name, line,
                         key, r->seen->e[i].line);
    put(r->seen, key, "", NULL, line, 0);
    return 0;
}

/* Flattens mapping m into r->out, its keys prefixed with `prefix.`. */
static int read_mapping(reader *r, const loom_yaml_node *m, const char *prefix) {
    for (size_t i = 0; i < m->n; i++) {
        const loom_yaml_node *k = &m->kids[2 * i], *v = &m->kids[2 * i + 1];
        const long line = k->line;
        size_t plen = prefix ? strlen(prefix) + 1 : 0;
        char *key = loom_malloc(plen + k->len + 1);
        if (prefix) {
            memcpy(key, prefix, plen - 1);
            key[plen - 1] = '.';
        }
        memcpy(key + plen, k->text, k->len + 1);
        int rc = -1;
        if (!key_is_valid(key + plen)) {
            loom_errf(r->err, "%s:%ld: invalid key '%s' (empty name or stray '.')", r->name, line,
                      key);
        } else if (!mark_seen(r, key, line)) {
            size_t olen = strlen(r->name) + 32;
            char *origin = loom_malloc(olen);
            snprintf(origin, olen, "%s:%ld", r->name, line);
            if (v->kind == LOOM_YAML_SCALAR) {
                rc = scalar_text(r->name, v, r->err);
                if (!rc) put(r->out, key, v->text, origin, line, v->quoted);
            } else if (v->kind == LOOM_YAML_MAP) {
                rc = read_mapping(r, v, key);
            } else {
                loom_sbuf b = {0};
                rc = flow_text(r->name, v, &b, r->err);
                if (!rc) put(r->out, key, b.p, origin, line, 0);
                free(b.p);
            }
            free(origin);
        }
        free(key);
        if (rc) return -1;
    }
    return 0;
}

static int load_text(loom_config *c, const char *text, size_t len, const char *name,
                     loom_err *err) {
    loom_yaml_node *root = NULL;
    if (loom_yaml_parse(name, text, len, &root, err)) return -1;
    if (!root) return 0; /* an empty document */
    if (root->kind != LOOM_YAML_MAP) {
        int line = root->line;
        loom_yaml_free(root);
        return loom_errf(err, "%s:%d: the top level of a config must be a mapping "
                              "(key: value lines)",
                         name, line);
    }
    reader r = {.name = name, .out = loom_config_new(), .seen = loom_config_new(), .err = err};
    int rc = read_mapping(&r, root, NULL);
    loom_yaml_free(root);
    if (!rc)
        for (int i = 0; i < r.out->n; i++)
            put(c, r.out->e[i].key, r.out->e[i].value, r.out->e[i].origin, r.out->e[i].line,
                r.out->e[i].quoted);
    loom_config_free(r.out);
    loom_config_free(r.seen);
    return rc;
}

int loom_config_load_string(loom_config *c, const char *text, const char *name, loom_err *err) {
    return load_text(c, text, strlen(text), name ? name : "<string>", err);
}

int loom_config_load_yaml(loom_config *c, const char *path, loom_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (loom_read_file(path, LOOM_YAML_MAX_BYTES, &text, &len, err))
        return loom_err_prefix(err, "config");
    int rc = load_text(c, text, len, path, err);
    free(text);
    return rc;
}

/* Parses one YAML value (scalar or list) the way it would read after "key: ": its text in
 * *out, and whether it was a quoted scalar in *quoted. */
static int parse_value(const char *text, const char *name, char **out, int *quoted,
                       loom_err *err) {
    loom_yaml_node *root = NULL;
    *quoted = 0;
    if (loom_yaml_parse(name, text, strlen(text), &root, err)) return -1;
    loom_sbuf b = {0};
    int rc = 0;
    if (!root) {
        sb_puts(&b, "");
    } else if (root->kind == LOOM_YAML_SCALAR) {
        rc = scalar_text(name, root, err);
        if (!rc) sb_puts(&b, root->text);
        *quoted = root->quoted;
    } else if (root->kind == LOOM_YAML_SEQ) {
        rc = flow_text(name, root, &b, err);
    } else {
        rc = loom_errf(err, "%s: the value must be a scalar or a [list], not a mapping "
                            "(quote it if it contains ': ')",
                       name);
    }
    loom_yaml_free(root);
    if (rc) {
        free(b.p);
        return -1;
    }
    *out = sb_take(&b);
    return 0;
}

int loom_config_set_arg(loom_config *c, const char *assignment, loom_err *err) {
    const char *eq = strchr(assignment, '=');
    if (!eq) return loom_errf(err, "--set '%s': expected section.key=value", assignment);
    size_t klen = (size_t)(eq - assignment);
    char *key = loom_malloc(klen + 1);
    memcpy(key, assignment, klen);
    key[klen] = 0;
    if (!key_is_valid(key)) {
        free(key);
        return loom_errf(err, "--set '%s': the key before '=' is empty or has an empty part "
                              "(expected section.key=value)",
                         assignment);
    }
    size_t nlen = strlen(assignment) + 16;
    char *name = loom_malloc(nlen);
    snprintf(name, nlen, "--set '%s'", assignment);
    char *value = NULL;
    int quoted = 0;
    int rc = parse_value(eq + 1, name, &value, &quoted, err);
    if (!rc) put(c, key, value, "--set", 0, quoted);
    free(value);
    free(name);
    free(key);
    return rc;
}

/* ---- schema --------------------------------------------------------------------------- */

/* Levenshtein distance, bailing out early above `cap`. */
static int edit_distance(const char *a, const char *b, int cap) {
    size_t n = strlen(a), m = strlen(b);
    if ((n > m ? n - m : m - n) > (size_t)cap) return cap + 1;
    int *row = loom_malloc((m + 1) * sizeof *row);
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0], best = (int)i;
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int up = row[j];
            int v = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < v) v = up + 1;
            if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
            row[j] = v;
            diag = up;
            if (v < best) best = v;
        }
        if (best > cap) {
            free(row);
            return cap + 1;
        }
    }
    int d = row[m];
    free(row);
    return d;
}

loom_config_key *loom_config_schema_join(const loom_config_key *const *tables, const int *counts,
                                         int n_tables, int *n) {
    size_t total = 0;
    for (int t = 0; t < n_tables; t++) {
        LOOM_CHECK(counts[t] >= 0);
        total += (size_t)counts[t];
    }
    loom_config_key *all = loom_malloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    for (int t = 0; t < n_tables; t++)
        for (int i = 0; i < counts[t]; i++) all[k++] = tables[t][i];
    /* duplicates: sort a copy of the names */
    const char **names = loom_malloc((total ? total : 1) * sizeof *names);
    for (size_t i = 0; i < total; i++) names[i] = all[i].key;
    for (size_t i = 1; i < total; i++) /* insertion sort: schemas have tens of keys */
        for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char *tmp = names[j];
            names[j] = names[j - 1];
            names[j - 1] = tmp;
        }
    for (size_t i = 1; i < total; i++)
        if (!strcmp(names[i - 1], names[i]))
            loom_panic(__FILE__, __LINE__, "config schema: key '%s' is defined twice", names[i]);
    free(names);
    LOOM_CHECK(total <= INT32_MAX);
    *n = (int)total;
    return all;
}

int loom_config_apply_schema(loom_config *c, const loom_config_key *known, int n_known,
                             loom_err *err) {
    for (int i = 0; i < c->n; i++) {
        int found = 0;
        for (int k = 0; k < n_known && !found; k++) found = strcmp(known[k].key, c->e[i].key) == 0;
        if (found) continue;
        const char *best = NULL;
        int best_d = 4;
        for (int k = 0; k < n_known; k++) {
            int d = edit_distance(c->e[i].key, known[k].key, 3);
            if (d < best_d) {
                best_d = d;
                best = known[k].key;
            }
        }
        if (best)
            return loom_errf(err, "unknown config key '%s' (set at %s); did you mean '%s'?",
                             c->e[i].key, c->e[i].origin, best);
        return loom_errf(err, "unknown config key '%s' (set at %s)", c->e[i].key, c->e[i].origin);
    }
    for (int k = 0; k < n_known; k++) {
        LOOM_CHECK(key_is_valid(known[k].key));
        int i = find(c, known[k].key);
        if (i < 0 && known[k].def) {
            put(c, known[k].key, known[k].def, "default", 0, 0);
            i = find(c, known[k].key);
        }
        if (i >= 0 && known[k].help && known[k].help[0]) {
            free(c->e[i].help);
            c->e[i].help = loom_strdup(known[k].help);
        }
    }
    return 0;
}

/* ---- lookups and typed getters ------------------------------------------------------- */

const char *loom_config_get(const loom_config *c, const char *key) {
    int i = find(c, key);
    return i >= 0 ? c->e[i].value : NULL;
}

const char *loom_config_origin(const loom_config *c, const char *key) {
    int i = find(c, key);
    return i >= 0 ? c->e[i].origin : NULL;
}

static int lookup(const loom_config *c, const char *key, const entry **out, loom_err *err) {
    int i = find(c, key);
    if (i < 0) return loom_errf(err, "config key '%s' is not set (and has no default)", key);
    *out = &c->e[i];
    return 0;
}

static int type_error(const entry *x, const char *what, loom_err *err) {
    return loom_errf(err, "config key '%s' = '%s' (%s) is not %s%s", x->key, x->value, x->origin,
                     what, x->quoted ? " (it is quoted, so it is a string)" : "");
}

/* The entry's value typed as base's YAML reader types it (docs/config.md). */
static loom_yaml_value typed(const entry *x) {
    loom_yaml_value v;
    loom_yaml_scalar_type(x->value, strlen(x->value), x->quoted, &v);
    return v;
}

int loom_config_get_int(const loom_config *c, const char *key, int64_t *out, loom_err *err) {
    const entry *x = NULL;
    if (lookup(c, key, &x, err)) return -1;
    const loom_yaml_value v = typed(x);
    if (v.type != LOOM_YAML_INT) return type_error(x, "an integer", err);
    *out = v.i;
    return 0;
}

int loom_config_get_double(const loom_config *c, const char *key, double *out, loom_err *err) {
    const entry *x = NULL;
    if (lookup(c, key, &x, err)) return -1;
    const loom_yaml_value v = typed(x);
    if (v.type != LOOM_YAML_INT && v.type != LOOM_YAML_FLOAT) return type_error(x, "a number", err);
    if (!isfinite(v.f)) return type_error(x, "a finite number", err);
    *out = v.f;
    return 0;
}

int loom_config_get_bool(const loom_config *c, const char *key, int *out, loom_err *err) {
    const entry *x = NULL;
    if (lookup(c, key, &x, err)) return -1;
    const loom_yaml_value v = typed(x);
    if (v.type != LOOM_YAML_BOOL) return type_error(x, "a boolean (true or false)", err);
    *out = v.b;
    return 0;
}

int loom_config_get_str(const loom_config *c, const char *key, const char **out, loom_err *err) {
    const entry *x = NULL;
    if (lookup(c, key, &x, err)) return -1;
    *out = x->value;
    return 0;
}

void loom_config_free_list(char **items, int n) {
    for (int i = 0; i < n; i++) free(items[i]);
    free(items);
}

int loom_config_get_list(const loom_config *c, const char *key, char ***items, int *n,
                         loom_err *err) {
    const entry *x = NULL;
    if (lookup(c, key, &x, err)) return -1;
    if (x->value[0] != '[') return type_error(x, "a list ([a, b, ...])", err);
    loom_yaml_node *root = NULL;
    if (loom_yaml_parse("list", x->value, strlen(x->value), &root, NULL) || !root ||
        root->kind != LOOM_YAML_SEQ) {
        loom_yaml_free(root);
        return type_error(x, "a list ([a, b, ...])", err);
    }
    char **out = loom_malloc((root->n ? root->n : 1) * sizeof *out);
    int count = 0, rc = 0;
    for (size_t i = 0; i < root->n && !rc; i++) {
        const loom_yaml_node *it = &root->kids[i];
        if (it->kind == LOOM_YAML_SCALAR) {
            rc = scalar_text("list", it, NULL);
            if (!rc) out[count++] = loom_strdup(it->text);
        } else {
            loom_sbuf b = {0};
            rc = flow_text("list", it, &b, NULL);
            if (!rc) out[count++] = sb_take(&b);
            free(b.p);
        }
    }
    loom_yaml_free(root);
    if (rc) {
        loom_config_free_list(out, count);
        return type_error(x, "a list ([a, b, ...])", err);
    }
    *items = out;
    *n = count;
    return 0;
}

int loom_config_count(const loom_config *c) { return c->n; }

const char *loom_config_key_at(const loom_config *c, int i) {
    LOOM_CHECK(i >= 0 && i < c->n);
    return c->e[i].key;
}

const char *loom_config_value_at(const loom_config *c, int i) {
    LOOM_CHECK(i >= 0 && i < c->n);
    return c->e[i].value;
}

/* ---- YAML writing -------------------------------------------------------------------- */

/* A list value is written bare when reading it back gives the same text. */
static int list_reads_back(const char *value) {
    if (value[0] != '[') return 0;
    char *norm = NULL;
    int quoted = 0;
    if (parse_value(value, "list", &norm, &quoted, NULL)) return 0;
    int same = strcmp(norm, value) == 0;
    free(norm);
    return same;
}

/* How deep the brackets of a list text nest (written in normalized form: items bare or
 * double-quoted), so the writer keeps it within the reader's nesting limit. */
static int list_depth(const char *v) {
    int d = 0, max = 0, quoted = 0;
    for (const char *p = v; *p; p++) {
        if (quoted) {
            if (*p == '\\' && p[1]) p++;
            else if (*p == '"') quoted = 0;
        } else if (*p == '"') {
            quoted = 1;
        } else if (*p == '[') {
            if (++d > max) max = d;
        } else if (*p == ']') {
            d--;
        }
    }
    return max;
}

/* Length of the first `n` components of key (up to, not including, the n-th dot). */
static size_t prefix_len(const char *key, int n) {
    const char *p = key;
    for (int i = 0; i < n; i++) {
        p = strchr(p, '.');
        if (!p) return strlen(key);
        if (i + 1 < n) p++;
    }
    return (size_t)(p - key);
}

static int count_parts(const char *key) {
    int n = 1;
    for (const char *p = key; *p; p++) n += *p == '.';
    return n;
}

/* Writes one key component (or a dotted run of them) bare or quoted, then its ':' (at
 * `depth`). YAML allows implicit keys of at most 1024 characters: a longer key is written
 * in the explicit form "? key" with the ':' on the next line. */
static void put_key(loom_sbuf *b, const char *s, size_t n, int depth) {
    char *tmp = loom_malloc(n + 1);
    memcpy(tmp, s, n);
    tmp[n] = 0;
    loom_sbuf k = {0};
    put_scalar(&k, tmp);
    free(tmp);
    if (k.len > 1000) {
        sb_puts(b, "? ");
        sb_putn(b, k.p, k.len);
        sb_putc(b, '\n');
        sb_indent(b, depth);
    } else {
        sb_putn(b, k.p, k.len);
    }
    sb_putc(b, ':');
    free(k.p);
}

char *loom_config_to_yaml(const loom_config *c) {
    loom_sbuf b = {0};
    sb_puts(&b, "# resolved loom config\n");
    const char *prev = NULL; /* the previous key */
    int prev_open = 0;       /* sections of prev that are open */
    for (int i = 0; i < c->n; i++) {
        const entry *x = &c->e[i];
        int parts = count_parts(x->key);
        /* Open sections for the leading components, stopping before any prefix that is a
         * key of its own ("a.b" beside "a.b.c"): the rest is then written as a dotted key,
         * which reads back as the same flat key. So is the tail of a key with more parts
         * than the reader's nesting limit. */
        int depth = 0;
        while (depth < parts - 1 && depth < CONFIG_MAX_DEPTH - 1) {
            size_t pl = prefix_len(x->key, depth + 1);
            char *pre = loom_malloc(pl + 1);
            memcpy(pre, x->key, pl);
            pre[pl] = 0;
            int is_key = find(c, pre) >= 0;
            free(pre);
            if (is_key) break;
            depth++;
        }
        /* keep the sections shared with the previous key, open the others */
        int common = 0;
        if (prev) {
            while (common < depth && common < prev_open) {
                size_t a = prefix_len(x->key, common + 1), p = prefix_len(prev, common + 1);
                if (a != p || memcmp(x->key, prev, a) != 0) break;
                common++;
            }
        }
        for (int d = common; d < depth; d++) {
            size_t start = d ? prefix_len(x->key, d) + 1 : 0, end = prefix_len(x->key, d + 1);
            sb_indent(&b, d);
            put_key(&b, x->key + start, end - start, d);
            sb_putc(&b, '\n');
        }
        if (x->help) {
            sb_indent(&b, depth);
            sb_puts(&b, "# ");
            for (const char *h = x->help; *h; h++) sb_putc(&b, *h == '\n' ? ' ' : *h);
            sb_putc(&b, '\n');
        }
        size_t start = depth ? prefix_len(x->key, depth) + 1 : 0;
        sb_indent(&b, depth);
        put_key(&b, x->key + start, strlen(x->key) - start, depth);
        sb_putc(&b, ' ');
        /* a list reads back at nesting depth + 1 + its own depth; a deeper one is written
         * quoted, which reads back as the same text */
        if (!x->quoted && list_reads_back(x->value) &&
            depth + 1 + list_depth(x->value) <= CONFIG_MAX_DEPTH)
            sb_puts(&b, x->value);
        else put_item(&b, x->value, x->quoted);
        sb_putc(&b, '\n');
        prev = x->key;
        prev_open = depth;
    }
    return sb_take(&b);
}

int loom_config_write_yaml(const loom_config *c, const char *path, loom_err *err) {
    char *text = loom_config_to_yaml(c);
    int rc = loom_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}
