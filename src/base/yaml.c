/* loom's one YAML reader: libyaml's event API -> a loom_yaml_node tree (base/yaml.h says
 * what is refused and how scalars are typed). Events rather than libyaml's document API so
 * that an anchor or alias is refused where it appears, before anything expands it. */
#include "base/yaml.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* ---- scalar typing ------------------------------------------------------------------- */

static int is_word(const char *s, size_t len, const char *const *words) {
    for (int i = 0; words[i]; i++)
        if (strlen(words[i]) == len && !memcmp(s, words[i], len)) return 1;
    return 0;
}

static int digits(const char *s, size_t len, size_t *i) {
    size_t start = *i;
    while (*i < len && s[*i] >= '0' && s[*i] <= '9') ++*i;
    return *i > start;
}

/* [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? over all of s; *is_int when it is
 * [-+]?[0-9]+ alone */
static int is_number(const char *s, size_t len, int *is_int) {
    size_t i = 0;
    if (i < len && (s[i] == '-' || s[i] == '+')) i++;
    int whole = digits(s, len, &i), frac = 0, dot = 0;
    if (i < len && s[i] == '.') {
        dot = 1;
        i++;
        frac = digits(s, len, &i);
    }
    if (!whole && !frac) return 0;
    int expo = 0;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        expo = 1;
        i++;
        if (i < len && (s[i] == '-' || s[i] == '+')) i++;
        if (!digits(s, len, &i)) return 0;
    }
    *is_int = whole && !dot && !expo;
    return i == len;
}

void loom_yaml_scalar_type(const char *s, size_t len, int quoted, loom_yaml_value *v) {
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL", NULL};
    static const char *const trues[] = {"true", "True", "TRUE", NULL};
    static const char *const falses[] = {"false", "False", "FALSE", NULL};
    static const char *const infs[] = {".inf", ".Inf", ".INF", NULL};
    static const char *const nans[] = {".nan", ".NaN", ".NAN", NULL};
    *v = (loom_yaml_value){.type = LOOM_YAML_STR};
    if (quoted || memchr(s, 0, len)) return;
    int is_int = 0;
    if (is_word(s, len, nulls)) {
        v->type = LOOM_YAML_NULL;
    } else if (is_word(s, len, trues) || is_word(s, len, falses)) {
        v->type = LOOM_YAML_BOOL;
        v->b = s[0] == 't' || s[0] == 'T';
    } else if (is_word(s, len, nans)) {
        v->type = LOOM_YAML_FLOAT;
        v->f = NAN;
    } else if (is_word(s, len, infs) ||
               ((s[0] == '-' || s[0] == '+') && is_word(s + 1, len - 1, infs))) {
        v->type = LOOM_YAML_FLOAT;
        v->f = s[0] == '-' ? -INFINITY : INFINITY;
    } else if (is_number(s, len, &is_int)) {
        /* s is NUL-terminated at len (no NUL inside, checked above) */
        char *end;
        errno = 0;
        long long i = is_int ? strtoll(s, &end, 10) : 0;
        if (is_int && errno != ERANGE) {
            v->type = LOOM_YAML_INT;
            v->i = (int64_t)i;
            v->f = (double)i;
        } else { /* a float, or an integer past int64 */
            v->type = LOOM_YAML_FLOAT;
            v->f = strtod(s, &end); /* overflow gives +-inf: not finite, as getters refuse */
        }
    }
}

/* ---- the tree ----------------------------------------------------------------------- */

typedef struct reader {
    yaml_parser_t p;
    const char *name, *text;
    size_t len;
    long nodes;
    loom_err *err;
} reader;

/* Where a node sits, for duplicate-key messages: a mapping key or a sequence index. */
typedef struct frame {
    const struct frame *up;
    const char *key; /* NULL: index */
    size_t index;
} frame;

static void put_path(loom_sbuf *b, const frame *f) {
    if (!f) return;
    put_path(b, f->up);
    char num[32];
    if (f->key) {
        if (b->len) loom_sbuf_append(b, ".", 1);
        loom_sbuf_append(b, f->key, strlen(f->key));
    } else {
        snprintf(num, sizeof num, "[%zu]", f->index);
        loom_sbuf_append(b, num, strlen(num));
    }
}

static int syntax_error(reader *r) {
    yaml_parser_t *p = &r->p;
    const char *problem = p->problem ? p->problem : "invalid YAML";
    if (p->error == YAML_READER_ERROR) { /* the reader (encoding) gives an offset, not a mark */
        size_t line, col;
        loom_text_position(r->text, r->len, p->problem_offset, &line, &col);
        if (p->problem_value >= 0)
            return loom_errf(r->err, "%s:%zu:%zu: malformed YAML: %s (byte 0x%02x at offset %zu)",
                             r->name, line, col, problem, (unsigned)p->problem_value,
                             p->problem_offset);
        return loom_errf(r->err, "%s:%zu:%zu: malformed YAML: %s (at offset %zu)", r->name, line,
                         col, problem, p->problem_offset);
    }
    if (p->context)
        return loom_errf(r->err, "%s:%zu:%zu: malformed YAML: %s %s (which began at line %zu)",
                         r->name, p->problem_mark.line + 1, p->problem_mark.column + 1, problem,
                         p->context, p->context_mark.line + 1);
    return loom_errf(r->err, "%s:%zu:%zu: malformed YAML: %s", r->name, p->problem_mark.line + 1,
                     p->problem_mark.column + 1, problem);
}

static int at_error(reader *r, const yaml_event_t *ev, const char *what) {
    return loom_errf(r->err, "%s:%zu:%zu: %s", r->name, ev->start_mark.line + 1,
                     ev->start_mark.column + 1, what);
}

/* The next event; anchors, aliases and explicit tags are refused here. */
static int next_event(reader *r, yaml_event_t *ev) {
    if (!yaml_parser_parse(&r->p, ev)) return syntax_error(r);
    const yaml_char_t *anchor = NULL, *tag = NULL;
    if (ev->type == YAML_SCALAR_EVENT) {
        anchor = ev->data.scalar.anchor;
        tag = ev->data.scalar.tag;
    } else if (ev->type == YAML_MAPPING_START_EVENT) {
        anchor = ev->data.mapping_start.anchor;
        tag = ev->data.mapping_start.tag;
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        anchor = ev->data.sequence_start.anchor;
        tag = ev->data.sequence_start.tag;
    }
    int rc = 0;
    if (ev->type == YAML_ALIAS_EVENT || anchor)
        rc = at_error(r, ev, "YAML anchors and aliases are not supported");
    else if (tag)
        rc = at_error(r, ev, "YAML tags (!!str, !name) are not supported: quote a string instead");
    if (rc) yaml_event_delete(ev);
    return rc;
}

static void node_free(loom_yaml_node *n) {
    if (n->kind == LOOM_YAML_SCALAR) {
        free(n->text);
        return;
    }
    size_t k = n->kind == LOOM_YAML_MAP ? 2 * n->n : n->n;
    for (size_t i = 0; i < k; i++) node_free(&n->kids[i]);
    free(n->kids);
}

void loom_yaml_free(loom_yaml_node *root) {
    if (!root) return;
    node_free(root);
    free(root);
}

typedef struct kid_list {
    loom_yaml_node *p;
    size_t n, cap;
} kid_list;

static loom_yaml_node *kid_push(kid_list *l) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 4;
        l->p = loom_realloc(l->p, l->cap * sizeof *l->p);
    }
    loom_yaml_node *n = &l->p[l->n++];
    memset(n, 0, sizeof *n);
    return n;
}

static int key_order(const void *a, const void *b) {
    const loom_yaml_node *x = *(const loom_yaml_node *const *)a, *y = *(const loom_yaml_node *const *)b;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->text, y->text, m);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x < y ? -1 : x > y; /* document order among equal keys */
}

static int same_key(const loom_yaml_node *x, const loom_yaml_node *y) {
    return x->len == y->len && !memcmp(x->text, y->text, x->len);
}

/* The first key (in document order) given twice in mapping m: an error naming its path and
 * the line of its first occurrence. Sorted, so a mapping of many keys stays n log n. */
static int check_duplicates(reader *r, const loom_yaml_node *m, const frame *where) {
    if (m->n < 2) return 0;
    const loom_yaml_node **keys = loom_malloc(m->n * sizeof *keys);
    for (size_t i = 0; i < m->n; i++) keys[i] = &m->kids[2 * i];
    qsort(keys, m->n, sizeof *keys, key_order);
    const loom_yaml_node *dup = NULL, *first = NULL;
    for (size_t i = 1; i < m->n; i++) {
        if (!same_key(keys[i], keys[i - 1]) || (dup && keys[i] > dup)) continue;
        size_t j = i - 1; /* equal keys sort in document order: the run's head came first */
        while (j > 0 && same_key(keys[j - 1], keys[i])) j--;
        dup = keys[i];
        first = keys[j];
    }
    free(keys);
    if (!dup) return 0;
    loom_sbuf path = {0};
    frame f = {where, dup->text, 0};
    put_path(&path, &f);
    int rc = loom_errf(r->err, "%s:%d:%d: duplicate key '%s' (first at line %d)", r->name,
                       dup->line, dup->col, path.p, first->line);
    free(path.p);
    return rc;
}

static int parse_node(reader *r, yaml_event_t *ev, loom_yaml_node *out, int depth,
                      const frame *where);

/* Reads the items (or key/value pairs) of a collection whose start event was consumed. */
static int parse_children(reader *r, loom_yaml_node *out, int depth, const frame *where) {
    const int map = out->kind == LOOM_YAML_MAP;
    const yaml_event_type_t end = map ? YAML_MAPPING_END_EVENT : YAML_SEQUENCE_END_EVENT;
    kid_list kids = {0};
    int rc = 0;
    for (size_t i = 0; !rc; i++) {
        yaml_event_t ev;
        if (next_event(r, &ev)) {
            rc = -1;
            break;
        }
        if (ev.type == end) {
            yaml_event_delete(&ev);
            break;
        }
        frame f = {where, NULL, i};
        if (map) {
            if (ev.type != YAML_SCALAR_EVENT) {
                rc = at_error(r, &ev, "a mapping key must be a plain name, not a list or mapping");
                yaml_event_delete(&ev);
                break;
            }
            if (strlen((const char *)ev.data.scalar.value) != ev.data.scalar.length) {
                rc = at_error(r, &ev, "NUL byte in a mapping key");
                yaml_event_delete(&ev);
                break;
            }
            loom_yaml_node *k = kid_push(&kids);
            rc = parse_node(r, &ev, k, depth + 1, where);
            if (rc) break;
            f.key = k->text;
            yaml_event_t vev;
            if (next_event(r, &vev)) {
                rc = -1;
                break;
            }
            rc = parse_node(r, &vev, kid_push(&kids), depth + 1, &f);
        } else {
            rc = parse_node(r, &ev, kid_push(&kids), depth + 1, &f);
        }
    }
    out->kids = kids.p;
    out->n = map ? kids.n / 2 : kids.n;
    if (map && kids.n % 2) { /* a key without its value (an error stopped the read) */
        node_free(&kids.p[kids.n - 1]);
    }
    if (!rc && map) rc = check_duplicates(r, out, where);
    return rc;
}

/* Builds *out from EV (consumed here) and, for a collection, the events up to its end. */
static int parse_node(reader *r, yaml_event_t *ev, loom_yaml_node *out, int depth,
                      const frame *where) {
    out->line = (int)ev->start_mark.line + 1;
    out->col = (int)ev->start_mark.column + 1;
    int rc = 0;
    const int collection =
        ev->type == YAML_SEQUENCE_START_EVENT || ev->type == YAML_MAPPING_START_EVENT;
    if (++r->nodes > LOOM_YAML_MAX_NODES) {
        rc = loom_errf(r->err, "%s:%d:%d: more than %ld YAML nodes", r->name, out->line, out->col,
                       LOOM_YAML_MAX_NODES);
    } else if (collection && depth > LOOM_YAML_MAX_DEPTH) { /* lists and mappings nest; a scalar
                                                              * adds no level */
        rc = loom_errf(r->err, "%s:%d:%d: nesting deeper than %d levels", r->name, out->line,
                       out->col, LOOM_YAML_MAX_DEPTH);
    } else if (ev->type == YAML_SCALAR_EVENT) {
        out->kind = LOOM_YAML_SCALAR;
        out->len = ev->data.scalar.length;
        out->text = loom_malloc(out->len + 1);
        memcpy(out->text, ev->data.scalar.value, out->len);
        out->text[out->len] = 0;
        out->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
        loom_yaml_scalar_type(out->text, out->len, out->quoted, &out->v);
    } else if (collection) {
        out->kind = ev->type == YAML_SEQUENCE_START_EVENT ? LOOM_YAML_SEQ : LOOM_YAML_MAP;
        yaml_event_delete(ev);
        return parse_children(r, out, depth, where);
    } else {
        rc = at_error(r, ev, "unexpected YAML event");
    }
    yaml_event_delete(ev);
    return rc;
}

int loom_yaml_parse(const char *name, const char *text, size_t len, loom_yaml_node **root,
                    loom_err *err) {
    *root = NULL;
    reader r = {.name = name, .text = text, .len = len, .err = err};
    if (!yaml_parser_initialize(&r.p)) loom_panic(__FILE__, __LINE__, "yaml_parser_initialize failed");
    yaml_parser_set_input_string(&r.p, (const unsigned char *)text, len);
    loom_yaml_node *top = NULL;
    int docs = 0, rc = 0;
    for (;;) {
        yaml_event_t ev;
        if (next_event(&r, &ev)) {
            rc = -1;
            break;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        if (t == YAML_DOCUMENT_START_EVENT && ++docs > 1) {
            rc = at_error(&r, &ev, "more than one YAML document (a second '---')");
            yaml_event_delete(&ev);
            break;
        }
        if (t == YAML_SCALAR_EVENT || t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) {
            top = loom_calloc(1, sizeof *top);
            if ((rc = parse_node(&r, &ev, top, 1, NULL))) break;
            continue;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&r.p);
    if (rc) {
        loom_yaml_free(top);
        return -1;
    }
    /* an empty document ("---" alone, only comments) is no document */
    if (top && top->kind == LOOM_YAML_SCALAR && top->v.type == LOOM_YAML_NULL && top->len == 0) {
        loom_yaml_free(top);
        top = NULL;
    }
    *root = top;
    return 0;
}

int loom_yaml_load_file(const char *path, loom_yaml_node **root, loom_err *err) {
    char *text = NULL;
    size_t len = 0;
    *root = NULL;
    if (loom_read_file(path, LOOM_YAML_MAX_BYTES, &text, &len, err)) return -1;
    int rc = loom_yaml_parse(path, text, len, root, err);
    free(text);
    return rc;
}

/* ---- as JSON (synth's pipelines) ------------------------------------------------------ */

int loom_yaml_to_json(const char *name, const loom_yaml_node *n, json_t **out, loom_err *err) {
    json_t *j = NULL;
    *out = NULL;
    if (n->kind == LOOM_YAML_SCALAR) {
        switch (n->v.type) {
        case LOOM_YAML_NULL: j = json_null(); break;
        case LOOM_YAML_BOOL: j = json_boolean(n->v.b); break;
        case LOOM_YAML_INT: j = json_integer((json_int_t)n->v.i); break;
        case LOOM_YAML_FLOAT:
            if (!isfinite(n->v.f))
                return loom_errf(err, "%s:%d: '%s' is not a finite number (quote it for a string)",
                                 name, n->line, n->text);
            j = json_real(n->v.f);
            break;
        case LOOM_YAML_STR: j = json_stringn(n->text, n->len); break;
        }
        if (!j) return loom_errf(err, "%s:%d: a string that is not valid UTF-8", name, n->line);
    } else {
        const int map = n->kind == LOOM_YAML_MAP;
        j = map ? json_object() : json_array();
        for (size_t i = 0; i < n->n; i++) {
            json_t *x;
            if (loom_yaml_to_json(name, &n->kids[map ? 2 * i + 1 : i], &x, err)) {
                json_decref(j);
                return -1;
            }
            if (map) json_object_set_new(j, n->kids[2 * i].text, x);
            else json_array_append_new(j, x);
        }
    }
    *out = j;
    return 0;
}
