/* loom config tree: a flat, sorted array of (dotted key, value text, origin) built from
 * YAML files (libyaml's event API), `--set` arguments and schema defaults.
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
#include <yaml.h>

#define CONFIG_MAX_FILE_BYTES ((size_t)16 << 20)
#define CONFIG_MAX_DEPTH 64

typedef struct entry {
    char *key;
    char *value;
    char *origin; /* "path:line", "--set", "default", or a caller's label */
    char *help;   /* from the schema, NULL when none; written as a comment */
    long line;    /* 1-based line in the file it came from, 0 when not from a file */
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

static void put(loom_config *c, const char *key, const char *value, const char *origin, long line) {
    int i = find(c, key);
    if (i >= 0) {
        entry *x = &c->e[i];
        free(x->value);
        free(x->origin);
        x->value = loom_strdup(value);
        x->origin = loom_strdup(origin ? origin : "");
        x->line = line;
        return;
    }
    i = -i - 1;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 32;
        c->e = loom_realloc(c->e, (size_t)c->cap * sizeof *c->e);
    }
    memmove(c->e + i + 1, c->e + i, (size_t)(c->n - i) * sizeof *c->e);
    c->e[i] = (entry){loom_strdup(key), loom_strdup(value), loom_strdup(origin ? origin : ""),
                      NULL, line};
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
    put(c, key, value, origin, 0);
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

/* ---- YAML reading ---------------------------------------------------------------------- */

typedef struct reader {
    yaml_parser_t parser;
    const char *name; /* file name (or --set argument) for messages */
    const char *text; /* the input, for positions of reader errors */
    size_t len;
    loom_config *out; /* values read, committed to the caller's tree only on success */
    loom_config *seen; /* every key and section key read, with its line (duplicates) */
    loom_err *err;
} reader;

static long line_of(const yaml_event_t *ev) { return (long)ev->start_mark.line + 1; }

static int parse_error(reader *r) {
    yaml_parser_t *p = &r->parser;
    const char *problem = p->problem ? p->problem : "invalid YAML";
    if (p->error == YAML_READER_ERROR) {
        /* the reader (encoding) reports a byte offset, not a mark */
        size_t line, col;
        loom_text_position(r->text, r->len, p->problem_offset, &line, &col);
        if (p->problem_value >= 0)
            return loom_errf(r->err, "%s:%zu:%zu: %s (byte 0x%02x at offset %zu)", r->name, line,
                             col, problem, (unsigned)p->problem_value, p->problem_offset);
        return loom_errf(r->err, "%s:%zu:%zu: %s (at offset %zu)", r->name, line, col, problem,
                         p->problem_offset);
    }
    if (p->context)
        return loom_errf(r->err, "%s:%zu:%zu: %s %s (which began at line %zu)", r->name,
                         p->problem_mark.line + 1, p->problem_mark.column + 1, problem,
                         p->context, p->context_mark.line + 1);
    return loom_errf(r->err, "%s:%zu:%zu: %s", r->name, p->problem_mark.line + 1,
                     p->problem_mark.column + 1, problem);
}

static int next_event(reader *r, yaml_event_t *ev) {
    if (!yaml_parser_parse(&r->parser, ev)) return parse_error(r);
    const yaml_char_t *anchor = NULL;
    if (ev->type == YAML_SCALAR_EVENT) anchor = ev->data.scalar.anchor;
    else if (ev->type == YAML_MAPPING_START_EVENT) anchor = ev->data.mapping_start.anchor;
    else if (ev->type == YAML_SEQUENCE_START_EVENT) anchor = ev->data.sequence_start.anchor;
    if (ev->type == YAML_ALIAS_EVENT || anchor) {
        long line = line_of(ev);
        yaml_event_delete(ev);
        return loom_errf(r->err, "%s:%ld: YAML anchors and aliases are not supported in configs",
                         r->name, line);
    }
    return 0;
}

/* The scalar's text as a C string; a NUL inside is an error. */
static int scalar_text(reader *r, const yaml_event_t *ev, const char **out) {
    if (strlen((const char *)ev->data.scalar.value) != ev->data.scalar.length)
        return loom_errf(r->err, "%s:%ld: NUL byte in a scalar", r->name, line_of(ev));
    *out = (const char *)ev->data.scalar.value;
    return 0;
}

/* Reads a sequence whose start event was just consumed; appends "[a, b, [c]]" to b. */
static int read_sequence(reader *r, loom_sbuf *b, int depth) {
    if (depth > CONFIG_MAX_DEPTH)
        return loom_errf(r->err, "%s:%zu: nesting deeper than %d levels", r->name,
                         r->parser.mark.line + 1, CONFIG_MAX_DEPTH);
    sb_putc(b, '[');
    for (int first = 1;; first = 0) {
        yaml_event_t ev;
        if (next_event(r, &ev)) return -1;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            sb_putc(b, ']');
            return 0;
        }
        if (!first) sb_puts(b, ", ");
        int rc = 0;
        if (ev.type == YAML_SCALAR_EVENT) {
            const char *text = NULL;
            rc = scalar_text(r, &ev, &text);
            if (!rc) put_scalar(b, text);
        } else if (ev.type == YAML_SEQUENCE_START_EVENT) {
            rc = read_sequence(r, b, depth + 1);
        } else {
            rc = loom_errf(r->err, "%s:%ld: a mapping inside a list is not supported in configs",
                           r->name, line_of(&ev));
        }
        yaml_event_delete(&ev);
        if (rc) return -1;
    }
}

/* Records a key (or section key) as read at `line`; an error if it was read before. */
static int mark_seen(reader *r, const char *key, long line) {
    int i = find(r->seen, key);
    if (i >= 0)
        return loom_errf(r->err, "%s:%ld: duplicate key '%s' (first at line %ld)", r->name, line,
                         key, r->seen->e[i].line);
    put(r->seen, key, "", NULL, line);
    return 0;
}

/* Reads a mapping whose start event was just consumed; keys are prefixed with `prefix.`. */
static int read_mapping(reader *r, const char *prefix, int depth) {
    if (depth > CONFIG_MAX_DEPTH)
        return loom_errf(r->err, "%s:%zu: nesting deeper than %d levels", r->name,
                         r->parser.mark.line + 1, CONFIG_MAX_DEPTH);
    for (;;) {
        yaml_event_t kev, vev;
        if (next_event(r, &kev)) return -1;
        if (kev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&kev);
            return 0;
        }
        long line = line_of(&kev);
        if (kev.type != YAML_SCALAR_EVENT) {
            yaml_event_delete(&kev);
            return loom_errf(r->err, "%s:%ld: a mapping key must be a plain name", r->name, line);
        }
        const char *name = NULL;
        if (scalar_text(r, &kev, &name)) {
            yaml_event_delete(&kev);
            return -1;
        }
        size_t plen = prefix ? strlen(prefix) + 1 : 0;
        char *key = loom_malloc(plen + strlen(name) + 1);
        if (prefix) {
            memcpy(key, prefix, plen - 1);
            key[plen - 1] = '.';
        }
        memcpy(key + plen, name, strlen(name) + 1);
        yaml_event_delete(&kev);

        int rc = -1;
        if (!key_is_valid(key + plen)) {
            loom_errf(r->err, "%s:%ld: invalid key '%s' (empty name or stray '.')", r->name, line,
                      key);
        } else if (!mark_seen(r, key, line) && !next_event(r, &vev)) {
            size_t olen = strlen(r->name) + 32;
            char *origin = loom_malloc(olen);
            snprintf(origin, olen, "%s:%ld", r->name, line);
            if (vev.type == YAML_SCALAR_EVENT) {
                const char *text = NULL;
                rc = scalar_text(r, &vev, &text);
                if (!rc) put(r->out, key, text, origin, line);
            } else if (vev.type == YAML_MAPPING_START_EVENT) {
                rc = read_mapping(r, key, depth + 1);
            } else if (vev.type == YAML_SEQUENCE_START_EVENT) {
                loom_sbuf b = {0};
                rc = read_sequence(r, &b, depth + 1);
                if (!rc) put(r->out, key, b.p, origin, line);
                free(b.p);
            } else {
                rc = loom_errf(r->err, "%s:%ld: unexpected YAML event for key '%s'", r->name, line,
                               key);
            }
            yaml_event_delete(&vev);
            free(origin);
        }
        free(key);
        if (rc) return -1;
    }
}

/* Parses a whole YAML stream of at most one document whose top level is a mapping. */
static int read_stream(reader *r) {
    yaml_event_t ev;
    int docs = 0;
    for (;;) {
        if (next_event(r, &ev)) return -1;
        yaml_event_type_t t = ev.type;
        long line = line_of(&ev);
        int rc = 0;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            return 0;
        } else if (t == YAML_DOCUMENT_START_EVENT) {
            if (++docs > 1)
                rc = loom_errf(r->err, "%s:%ld: more than one YAML document in a config", r->name,
                               line);
        } else if (t == YAML_MAPPING_START_EVENT) {
            rc = read_mapping(r, NULL, 1);
        } else if (t == YAML_SCALAR_EVENT && ev.data.scalar.length == 0 &&
                   ev.data.scalar.plain_implicit) {
            /* an empty document ("---" alone) */
        } else if (t == YAML_SCALAR_EVENT || t == YAML_SEQUENCE_START_EVENT) {
            rc = loom_errf(r->err, "%s:%ld: the top level of a config must be a mapping "
                                   "(key: value lines)",
                           r->name, line);
        }
        yaml_event_delete(&ev);
        if (rc) return -1;
    }
}

static int load_text(loom_config *c, const char *text, size_t len, const char *name,
                     loom_err *err) {
    reader r = {.name = name, .text = text, .len = len, .out = loom_config_new(),
                .seen = loom_config_new(), .err = err};
    if (!yaml_parser_initialize(&r.parser))
        loom_panic(__FILE__, __LINE__, "yaml_parser_initialize failed");
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)text, len);
    int rc = read_stream(&r);
    yaml_parser_delete(&r.parser);
    if (!rc)
        for (int i = 0; i < r.out->n; i++)
            put(c, r.out->e[i].key, r.out->e[i].value, r.out->e[i].origin, r.out->e[i].line);
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
    if (loom_read_file(path, CONFIG_MAX_FILE_BYTES, &text, &len, err))
        return loom_err_prefix(err, "config");
    int rc = load_text(c, text, len, path, err);
    free(text);
    return rc;
}

/* Parses one YAML value (scalar or list) the way it would read after "key: ". */
static int parse_value(const char *text, const char *name, char **out, loom_err *err) {
    reader r = {.name = name, .text = text, .len = strlen(text), .err = err};
    if (!yaml_parser_initialize(&r.parser))
        loom_panic(__FILE__, __LINE__, "yaml_parser_initialize failed");
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)text, strlen(text));
    loom_sbuf b = {0};
    int rc = 0, nodes = 0;
    for (;;) {
        yaml_event_t ev;
        if (next_event(&r, &ev)) {
            rc = -1;
            break;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_SCALAR_EVENT) {
            const char *s = NULL;
            rc = scalar_text(&r, &ev, &s);
            if (!rc) sb_puts(&b, s);
            nodes++;
        } else if (t == YAML_SEQUENCE_START_EVENT) {
            rc = read_sequence(&r, &b, 1);
            nodes++;
        } else if (t == YAML_MAPPING_START_EVENT) {
            rc = loom_errf(err, "%s: the value must be a scalar or a [list], not a mapping "
                                "(quote it if it contains ': ')",
                           name);
        }
        yaml_event_delete(&ev);
        if (rc || t == YAML_STREAM_END_EVENT) break;
        if (nodes > 1) {
            rc = loom_errf(err, "%s: more than one YAML document in the value", name);
            break;
        }
    }
    yaml_parser_delete(&r.parser);
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
    int rc = parse_value(eq + 1, name, &value, err);
    if (!rc) put(c, key, value, "--set", 0);
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
            put(c, known[k].key, known[k].def, "default", 0);
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
    return loom_errf(err, "config key '%s' = '%s' (%s) is not %s", x->key, x->value, x->origin,
                     what);
}

int loom_config_get_int(const loom_config *c, const char *key, int64_t *out, loom_err *err) {
    const entry *x = NULL;
    if (lookup(c, key, &x, err)) return -1;
    if (loom_parse_i64(x->value, INT64_MIN, INT64_MAX, out)) return type_error(x, "an integer", err);
    return 0;
}

int loom_config_get_double(const loom_config *c, const char *key, double *out, loom_err *err) {
    const entry *x = NULL;
    if (lookup(c, key, &x, err)) return -1;
    const char *s = x->value;
    if (!s[0] || isspace((unsigned char)s[0])) return type_error(x, "a number", err);
    if (loom_parse_f64(s, out)) return type_error(x, "a finite number", err);
    return 0;
}

int loom_config_get_bool(const loom_config *c, const char *key, int *out, loom_err *err) {
    const entry *x = NULL;
    if (lookup(c, key, &x, err)) return -1;
    if (!loom_parse_bool(x->value, out)) return 0;
    return type_error(x, "a boolean (true/false, yes/no, on/off, 1/0)", err);
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
    reader r = {.name = "list", .text = x->value, .len = strlen(x->value), .err = NULL};
    if (!yaml_parser_initialize(&r.parser))
        loom_panic(__FILE__, __LINE__, "yaml_parser_initialize failed");
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)x->value, strlen(x->value));
    char **out = NULL;
    int count = 0, cap = 0, depth = 0, rc = 0, done = 0;
    while (!rc && !done) {
        yaml_event_t ev;
        if (next_event(&r, &ev)) {
            rc = -1;
            break;
        }
        char *item = NULL;
        if (ev.type == YAML_SEQUENCE_START_EVENT && depth == 0) {
            depth = 1;
        } else if (ev.type == YAML_SEQUENCE_START_EVENT) {
            loom_sbuf b = {0};
            rc = read_sequence(&r, &b, 2);
            item = sb_take(&b);
        } else if (ev.type == YAML_SEQUENCE_END_EVENT) {
            done = 1;
        } else if (ev.type == YAML_SCALAR_EVENT && depth == 1) {
            const char *text = NULL;
            rc = scalar_text(&r, &ev, &text);
            if (!rc) item = loom_strdup(text);
        } else if (ev.type == YAML_MAPPING_START_EVENT || ev.type == YAML_SCALAR_EVENT ||
                   ev.type == YAML_STREAM_END_EVENT) {
            rc = -1;
        }
        yaml_event_delete(&ev);
        if (item && !rc) {
            if (count == cap) {
                cap = cap ? 2 * cap : 8;
                out = loom_realloc(out, (size_t)cap * sizeof *out);
            }
            out[count++] = item;
        } else {
            free(item);
        }
    }
    /* the list must be the whole value */
    if (!rc) {
        yaml_event_t ev;
        while (!rc) {
            if (next_event(&r, &ev)) rc = -1;
            else {
                yaml_event_type_t t = ev.type;
                yaml_event_delete(&ev);
                if (t == YAML_STREAM_END_EVENT) break;
                if (t != YAML_DOCUMENT_END_EVENT) rc = -1;
            }
        }
    }
    yaml_parser_delete(&r.parser);
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
    if (parse_value(value, "list", &norm, NULL)) return 0;
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
        if (list_reads_back(x->value) && depth + 1 + list_depth(x->value) <= CONFIG_MAX_DEPTH)
            sb_puts(&b, x->value);
        else put_scalar(&b, x->value);
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
