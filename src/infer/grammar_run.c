/* Grammars at run time: the automaton's states, vocabularies (tries of the tokens' bytes)
 * and token masks (include/loom/grammar.h; the design in grammar.c's opening comment). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "infer/grammar_internal.h"
#include "loom/tokenizer.h"

/* ---- the automaton --------------------------------------------------------------------- */

typedef struct gframe {
    int32_t pos, dist;        /* element to continue at; fewest bytes that empty this stack */
    const struct gframe *up;  /* where to continue after this alternative; NULL: the end */
} gframe;

/* a bump arena of chunks with marks (released in stack order) */
typedef struct arena {
    char **chunk;
    int n_chunk, cur;
    size_t off;
} arena;
enum { CHUNK = 1 << 16 };

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    LOOM_CHECK(n <= CHUNK);
    if (a->n_chunk == 0 || a->off + n > CHUNK) {
        if (a->n_chunk > 0) a->cur++;
        if (a->cur >= a->n_chunk) {
            a->chunk = loom_realloc(a->chunk, (size_t)(a->n_chunk + 1) * sizeof *a->chunk);
            a->chunk[a->n_chunk++] = loom_malloc(CHUNK);
            a->cur = a->n_chunk - 1;
        }
        a->off = 0;
    }
    void *p = a->chunk[a->cur] + a->off;
    a->off += n;
    return p;
}
typedef struct amark {
    int cur;
    size_t off;
} amark;
static amark arena_mark(const arena *a) { return (amark){a->cur, a->off}; }
static void arena_release(arena *a, amark m) {
    a->cur = m.cur;
    a->off = m.off;
}
static void arena_free(arena *a) {
    for (int i = 0; i < a->n_chunk; i++) free(a->chunk[i]);
    free(a->chunk);
    *a = (arena){0};
}

/* a state under construction: frames with a byte class on top */
typedef struct gset {
    const gframe **f;
    int n, accept, dist;
} gset;

struct loom_grammar_scratch;
typedef struct builder_ctx {
    const loom_grammar *g;
    arena *a;
    gset *out;
    int expand; /* closure steps (a guard) */
    struct loom_grammar_scratch *in; /* frames interned there (masks), else plain (NULL) */
} ctx;

static int same_stack(const gframe *x, const gframe *y) {
    for (int k = 0; x != y; k++) {
        if (!x || !y || x->pos != y->pos || k > 256) return 0;
        x = x->up;
        y = y->up;
    }
    return 1;
}

static void add_frame(ctx *c, const gframe *f) {
    gset *o = c->out;
    for (int i = 0; i < o->n; i++)
        if (o->f[i] == f || (!c->in && same_stack(o->f[i], f))) return;
    if (o->n == MAX_FRAMES) return; /* dropped: every stack kept is still a valid parse */
    o->f[o->n++] = f;
    if (f->dist < o->dist) o->dist = f->dist;
}

static const gframe *intern_frame(struct loom_grammar_scratch *sc, const loom_grammar *g, int pos,
                                  const gframe *up);

static const gframe *new_frame(ctx *c, int pos, const gframe *up) {
    if (c->in) return intern_frame(c->in, c->g, pos, up);
    gframe *f = arena_alloc(c->a, sizeof *f);
    f->pos = pos;
    f->up = up;
    f->dist = sat_add(c->g->suffix[pos], up ? up->dist : 0);
    return f;
}

/* continue at pos (a non-END element) with return frame up */
static void closure(ctx *c, int pos, const gframe *up, const gframe *self);

/* continue with a return frame (NULL: the document is complete) */
static void resume(ctx *c, const gframe *up) {
    if (!up) {
        c->out->accept = 1;
        c->out->dist = 0;
        return;
    }
    closure(c, up->pos, up->up, up);
}

static void closure(ctx *c, int pos, const gframe *up, const gframe *self) {
    if (++c->expand > MAX_EXPAND) return;
    const gel *e = &c->g->el[pos];
    if (e->kind == E_BYTES) {
        add_frame(c, self ? self : new_frame(c, pos, up));
        return;
    }
    LOOM_CHECK(e->kind == E_RULE);
    const gframe *ret = e[1].kind == E_END ? up : new_frame(c, pos + 1, up);
    const grule *r = &c->g->rules[e->arg];
    for (int a = 0; a < r->n_alt; a++) {
        const int start = c->g->alts[r->alt0 + a];
        if (c->g->el[start].kind == E_END) resume(c, ret);
        else closure(c, start, ret, NULL);
    }
}

static void set_init(gset *s, const gframe **store) {
    s->f = store;
    s->n = 0;
    s->accept = 0;
    s->dist = INF;
}

/* s advanced by byte ch into out */
static void advance(const loom_grammar *g, arena *a, const gset *s, unsigned ch, gset *out) {
    ctx c = {g, a, out, 0, NULL};
    for (int i = 0; i < s->n; i++) {
        const gframe *f = s->f[i];
        const uint32_t *cl = g->cls[g->el[f->pos].arg];
        if (!(cl[ch >> 5] >> (ch & 31) & 1)) continue;
        if (g->el[f->pos + 1].kind == E_END) resume(&c, f->up);
        else closure(&c, f->pos + 1, f->up, NULL);
    }
}

/* ---- per-request state ----------------------------------------------------------------- */

struct loom_grammar_state {
    loom_grammar *g;
    arena a;          /* holds the frames of cur (and older ones until compacted) */
    gset cur;
    const gframe *store[MAX_FRAMES];
    size_t live;      /* frames copied at the last compaction */
    int steps;
};

/* copies the frames of s into a fresh arena (chains shared as before: a memo of copies) */
typedef struct memo {
    const gframe **from;
    gframe **to;
    int n, cap;
} memo;

static const gframe *copy_frame(memo *m, arena *a, const gframe *f) {
    if (!f) return NULL;
    for (int i = m->n - 1; i >= 0 && i >= m->n - 64; i--) /* recent copies: shared tails */
        if (m->from[i] == f) return m->to[i];
    gframe *c = arena_alloc(a, sizeof *c);
    c->pos = f->pos;
    c->dist = f->dist;
    c->up = copy_frame(m, a, f->up);
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 64;
        m->from = loom_realloc(m->from, (size_t)m->cap * sizeof *m->from);
        m->to = loom_realloc(m->to, (size_t)m->cap * sizeof *m->to);
    }
    m->from[m->n] = f;
    m->to[m->n++] = c;
    return c;
}

static void compact(loom_grammar_state *s) {
    arena fresh = {0};
    memo m = {0};
    for (int i = 0; i < s->cur.n; i++) s->store[i] = copy_frame(&m, &fresh, s->store[i]);
    s->live = (size_t)m.n;
    free(m.from);
    free(m.to);
    arena_free(&s->a);
    s->a = fresh;
}

loom_grammar_state *loom_grammar_state_new(loom_grammar *g) {
    loom_grammar_state *s = loom_calloc(1, sizeof *s);
    s->g = loom_grammar_ref(g);
    set_init(&s->cur, s->store);
    ctx c = {g, &s->a, &s->cur, 0, NULL};
    const grule *r = &g->rules[g->root];
    for (int a = 0; a < r->n_alt; a++) {
        const int start = g->alts[r->alt0 + a];
        if (g->el[start].kind == E_END) resume(&c, NULL);
        else closure(&c, start, NULL, NULL);
    }
    return s;
}

void loom_grammar_state_free(loom_grammar_state *s) {
    if (!s) return;
    arena_free(&s->a);
    loom_grammar_unref(s->g);
    free(s);
}

int loom_grammar_state_advance(loom_grammar_state *s, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    const gframe *tmp[2][MAX_FRAMES];
    gset from = s->cur, to;
    const amark m0 = arena_mark(&s->a);
    for (size_t i = 0; i < n; i++) {
        set_init(&to, tmp[i & 1]);
        advance(s->g, &s->a, &from, p[i], &to);
        if (to.n == 0 && !(to.accept && i + 1 == n)) {
            arena_release(&s->a, m0);
            return -1;
        }
        from = to;
    }
    if (n == 0) return 0;
    memcpy(s->store, from.f, (size_t)from.n * sizeof *from.f);
    s->cur = from;
    s->cur.f = s->store;
    if (++s->steps % 64 == 0) compact(s); /* the frames no longer reachable go */
    return 0;
}

int loom_grammar_state_complete(const loom_grammar_state *s) { return s->cur.accept; }
int loom_grammar_state_terminal(const loom_grammar_state *s) { return s->cur.accept && s->cur.n == 0; }
int loom_grammar_state_min_bytes(const loom_grammar_state *s) { return s->cur.dist; }

/* ---- vocabularies and masks ------------------------------------------------------------ */

struct loom_grammar_vocab {
    uint64_t id;        /* process-unique (mask caches) */
    int n;
    int32_t eos;
    char *bytes;        /* every token's bytes */
    size_t *off;        /* (n + 1) */
    /* the trie, in preorder: node 0 is the root */
    int n_nodes;
    uint8_t *nbyte;
    int32_t *depth, *end, *tok0; /* end: the node after its subtree; tokens: tok_ids[tok0[i] .. tok0[i+1]) */
    int32_t *tok_ids;
    int max_depth;
    int has_bytes;
};

typedef struct sorted_tok {
    const char *p;
    size_t n;
    int32_t id;
} sorted_tok;

static int tok_cmp(const void *a, const void *b) {
    const sorted_tok *x = a, *y = b;
    const size_t n = x->n < y->n ? x->n : y->n;
    const int c = memcmp(x->p, y->p, n);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

loom_grammar_vocab *loom_grammar_vocab_new(const char *const *bytes, const size_t *lens, int n,
                                           int32_t eos) {
    loom_grammar_vocab *v = loom_calloc(1, sizeof *v);
    v->id = grammar_next_id();
    v->n = n;
    v->eos = eos;
    v->off = loom_calloc((size_t)n + 1, sizeof *v->off);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += bytes[i] && i != eos ? lens[i] : 0;
    v->bytes = loom_malloc(total + 1);
    int m = 0;
    for (int i = 0; i < n; i++) {
        const size_t l = bytes[i] && i != eos ? lens[i] : 0;
        memcpy(v->bytes + v->off[i], l ? bytes[i] : "", l);
        v->off[i + 1] = v->off[i] + l;
        m += l > 0;
    }
    sorted_tok *st = loom_malloc((size_t)(m > 0 ? m : 1) * sizeof *st);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i]) st[k++] = (sorted_tok){v->bytes + v->off[i], v->off[i + 1] - v->off[i], i};
    qsort(st, (size_t)m, sizeof *st, tok_cmp);
    /* nodes: at most 1 + total bytes */
    size_t cap = 1;
    for (int i = 0; i < m; i++) cap += st[i].n;
    v->nbyte = loom_calloc(cap, 1);
    v->depth = loom_calloc(cap, sizeof *v->depth);
    v->end = loom_calloc(cap, sizeof *v->end);
    v->tok0 = loom_calloc(cap + 1, sizeof *v->tok0);
    v->tok_ids = loom_malloc((size_t)(m > 0 ? m : 1) * sizeof *v->tok_ids);
    int32_t *path = loom_malloc((cap + 1) * sizeof *path); /* node at each depth of the path */
    int nn = 1, plen = 0, nt = 0; /* path[0..plen): nodes of depth 1..plen */
    const char *prev = NULL;
    size_t prev_n = 0;
    for (int i = 0; i < m; i++) {
        size_t lcp = 0;
        while (prev && lcp < prev_n && lcp < st[i].n && prev[lcp] == st[i].p[lcp]) lcp++;
        while ((size_t)plen > lcp) v->end[path[--plen]] = nn;
        for (size_t d = lcp; d < st[i].n; d++) {
            v->nbyte[nn] = (uint8_t)st[i].p[d];
            v->depth[nn] = (int32_t)d + 1;
            v->tok0[nn] = nt;
            path[plen++] = nn++;
        }
        /* the token ends at the path's last node: tokens are grouped by node (sorted) */
        v->tok_ids[nt++] = st[i].id;
        v->tok0[nn] = nt;
        if ((int)st[i].n > v->max_depth) v->max_depth = (int)st[i].n;
        prev = st[i].p;
        prev_n = st[i].n;
    }
    while (plen > 0) v->end[path[--plen]] = nn;
    v->end[0] = nn;
    v->n_nodes = nn;
    free(path);
    free(st);
    /* the bytes a shortest completion may need, each a token of its own */
    int have[256] = {0};
    for (int i = 0; i < n; i++)
        if (v->off[i + 1] - v->off[i] == 1) have[(unsigned char)v->bytes[v->off[i]]] = 1;
    v->has_bytes = have['\t'] && have['\n'] && have['\r'];
    for (int c = 0x20; c < 0x7f; c++) v->has_bytes &= have[c];
    for (int c = 0x80; c < 0xc0; c++) v->has_bytes &= have[c];
    return v;
}

int loom_grammar_vocab_from_tokenizer(const loom_tokenizer *tok, int n_ids, int32_t eos,
                                      loom_grammar_vocab **out, loom_err *err) {
    *out = NULL;
    const int tv = (int)loom_tokenizer_vocab_size(tok);
    char **b = loom_calloc((size_t)(n_ids > 0 ? n_ids : 1), sizeof *b);
    size_t *l = loom_calloc((size_t)(n_ids > 0 ? n_ids : 1), sizeof *l);
    int rc = 0;
    for (int32_t i = 0; i < n_ids && i < tv; i++) {
        if (loom_tokenizer_is_added(tok, i)) continue;
        if (loom_tokenizer_decode_ex(tok, &i, 1, LOOM_TOK_CONTINUE, &b[i], &l[i], err)) {
            rc = -1;
            break;
        }
    }
    if (rc == 0) *out = loom_grammar_vocab_new((const char *const *)b, l, n_ids, eos);
    for (int i = 0; i < n_ids; i++) free(b[i]);
    free(b);
    free(l);
    return rc;
}

void loom_grammar_vocab_free(loom_grammar_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->nbyte);
    free(v->depth);
    free(v->end);
    free(v->tok0);
    free(v->tok_ids);
    free(v);
}

int loom_grammar_vocab_size(const loom_grammar_vocab *v) { return v->n; }
int loom_grammar_vocab_has_bytes(const loom_grammar_vocab *v) { return v->has_bytes; }

const char *loom_grammar_vocab_token(const loom_grammar_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n || v->off[id + 1] == v->off[id]) {
        *len = 0;
        return NULL;
    }
    *len = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

/* Mask computation runs the automaton as a DFA built on the fly: frames are interned (one
 * object per (position, return frame), so equal stacks are the same pointer), states are
 * interned sets of them, and each state's transitions are computed once per call. Inside a
 * string the state after any ordinary character is the state before it, so most of the trie
 * costs one table lookup per node. */
typedef struct dstate {
    int32_t off, n;      /* its frames: pool[off .. off + n), sorted */
    int32_t accept, dist;
    int32_t *trans;      /* (256) next state, -1 dead, -2 not computed yet; NULL until used */
} dstate;

/* Masks cached by state: a mask depends on the state and, only where the budget binds, on the
 * budget. An entry keeps the largest distance of any token the walk reached (maxdist); it
 * stands for every budget with budget - 1 >= maxdist. States are keyed by their stacks' positions
 * (the grammar's and vocabulary's ids beside), so the state inside a string, reached again
 * after every ordinary character, costs a copy of its mask. */
enum { MCACHE = 16, MKEY_MAX = 4096 };
typedef struct mcache {
    uint64_t gid, vid, hash, used;
    int32_t *key;
    int klen, n_allowed, maxdist;
    uint8_t *allow;         /* (vocab size) without the end-of-text id */
} mcache;

struct loom_grammar_scratch {
    mcache mc[MCACHE];
    uint64_t clock;
    int32_t key[MKEY_MAX];
    arena a;                /* interned frames, transition tables */
    const gframe **ftab;    /* open addressing: interned frames by (pos, up) */
    size_t fcap, fn;
    const gframe **pool;    /* the states' frames */
    size_t pool_n, pool_cap;
    dstate *st;
    int n_st, cap_st;
    int32_t *stab;          /* open addressing: state index + 1 by content */
    size_t scap;
    int32_t *path;          /* the state at each depth of the trie walk */
    int path_cap;
    const gframe *tmp[MAX_FRAMES];
};

loom_grammar_scratch *loom_grammar_scratch_new(void) { return loom_calloc(1, sizeof(loom_grammar_scratch)); }

void loom_grammar_scratch_free(loom_grammar_scratch *sc) {
    if (!sc) return;
    for (int i = 0; i < MCACHE; i++) free(sc->mc[i].key), free(sc->mc[i].allow);
    arena_free(&sc->a);
    free(sc->ftab);
    free(sc->pool);
    free(sc->st);
    free(sc->stab);
    free(sc->path);
    free(sc);
}

static size_t hash_frame(int pos, const gframe *up) {
    uint64_t h = (uint64_t)(uint32_t)pos * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)up * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ h >> 29);
}

static const gframe *intern_frame(loom_grammar_scratch *sc, const loom_grammar *g, int pos,
                                  const gframe *up) {
    if (2 * (sc->fn + 1) > sc->fcap) { /* grow to keep the load under a half */
        const size_t nc = sc->fcap ? 2 * sc->fcap : 1024;
        const gframe **nt = loom_calloc(nc, sizeof *nt);
        for (size_t i = 0; i < sc->fcap; i++) {
            const gframe *f = sc->ftab[i];
            if (!f) continue;
            size_t h = hash_frame(f->pos, f->up) & (nc - 1);
            while (nt[h]) h = (h + 1) & (nc - 1);
            nt[h] = f;
        }
        free(sc->ftab);
        sc->ftab = nt;
        sc->fcap = nc;
    }
    size_t h = hash_frame(pos, up) & (sc->fcap - 1);
    for (; sc->ftab[h]; h = (h + 1) & (sc->fcap - 1))
        if (sc->ftab[h]->pos == pos && sc->ftab[h]->up == up) return sc->ftab[h];
    gframe *f = arena_alloc(&sc->a, sizeof *f);
    f->pos = pos;
    f->up = up;
    f->dist = sat_add(g->suffix[pos], up ? up->dist : 0);
    sc->ftab[h] = f;
    sc->fn++;
    return f;
}

static const gframe *intern_deep(loom_grammar_scratch *sc, const loom_grammar *g, const gframe *f) {
    return f ? intern_frame(sc, g, f->pos, intern_deep(sc, g, f->up)) : NULL;
}

static size_t hash_state(const gframe *const *f, int n, int accept) {
    uint64_t h = 0x84222325cbf29ce4ull ^ (uint64_t)accept;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uintptr_t)f[i]) * 0x100000001B3ull;
    return (size_t)(h ^ h >> 31);
}

/* the interned state of the frames f[0..n) (sorted here) */
static int intern_state(loom_grammar_scratch *sc, const gframe **f, int n, int accept, int dist) {
    for (int i = 1; i < n; i++) /* insertion sort: a few frames */
        for (int j = i; j > 0 && (uintptr_t)f[j] < (uintptr_t)f[j - 1]; j--) {
            const gframe *t = f[j];
            f[j] = f[j - 1];
            f[j - 1] = t;
        }
    if (2 * ((size_t)sc->n_st + 1) > sc->scap) {
        const size_t nc = sc->scap ? 2 * sc->scap : 256;
        int32_t *nt = loom_calloc(nc, sizeof *nt);
        for (int k = 0; k < sc->n_st; k++) {
            const dstate *d = &sc->st[k];
            size_t h = hash_state(sc->pool + d->off, d->n, d->accept) & (nc - 1);
            while (nt[h]) h = (h + 1) & (nc - 1);
            nt[h] = k + 1;
        }
        free(sc->stab);
        sc->stab = nt;
        sc->scap = nc;
    }
    size_t h = hash_state(f, n, accept) & (sc->scap - 1);
    for (; sc->stab[h]; h = (h + 1) & (sc->scap - 1)) {
        const dstate *d = &sc->st[sc->stab[h] - 1];
        if (d->n == n && d->accept == accept && !memcmp(sc->pool + d->off, f, (size_t)n * sizeof *f))
            return sc->stab[h] - 1;
    }
    if (sc->pool_n + (size_t)n > sc->pool_cap) {
        while (sc->pool_n + (size_t)n > sc->pool_cap) sc->pool_cap = sc->pool_cap ? 2 * sc->pool_cap : 1024;
        sc->pool = loom_realloc(sc->pool, sc->pool_cap * sizeof *sc->pool);
    }
    if (sc->n_st == sc->cap_st) {
        sc->cap_st = sc->cap_st ? 2 * sc->cap_st : 256;
        sc->st = loom_realloc(sc->st, (size_t)sc->cap_st * sizeof *sc->st);
    }
    if (n) memcpy(sc->pool + sc->pool_n, f, (size_t)n * sizeof *f);
    sc->st[sc->n_st] = (dstate){(int32_t)sc->pool_n, n, accept, dist, NULL};
    sc->pool_n += (size_t)n;
    sc->stab[h] = sc->n_st + 1;
    return sc->n_st++;
}

/* the state after byte b from state k: -1 when dead */
static int transition(loom_grammar_scratch *sc, const loom_grammar *g, int k, unsigned b) {
    if (!sc->st[k].trans) {
        int32_t *t = arena_alloc(&sc->a, 256 * sizeof *t);
        for (int i = 0; i < 256; i++) t[i] = -2;
        sc->st[k].trans = t;
    }
    const int32_t known = sc->st[k].trans[b];
    if (known != -2) return known;
    gset from = {(const gframe **)sc->pool + sc->st[k].off, sc->st[k].n, sc->st[k].accept, sc->st[k].dist};
    gset out;
    set_init(&out, sc->tmp);
    ctx c = {g, &sc->a, &out, 0, sc};
    for (int i = 0; i < from.n; i++) { /* advance() with interned frames */
        const gframe *f = from.f[i];
        const uint32_t *cl = g->cls[g->el[f->pos].arg];
        if (!(cl[b >> 5] >> (b & 31) & 1)) continue;
        if (g->el[f->pos + 1].kind == E_END) resume(&c, f->up);
        else closure(&c, f->pos + 1, f->up, NULL);
    }
    const int next = out.n == 0 && !out.accept ? -1 : intern_state(sc, sc->tmp, out.n, out.accept, out.dist);
    sc->st[k].trans[b] = next; /* sc->st may have moved: indexed again */
    return next;
}

/* the key of state s (its stacks' positions, in its own order); -1 when too long to cache */
static int state_key(const loom_grammar_state *s, int32_t *key, uint64_t *hash) {
    int n = 0;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)s->cur.accept;
    for (int i = 0; i < s->cur.n; i++) {
        for (const gframe *f = s->cur.f[i]; f; f = f->up) {
            if (n == MKEY_MAX - 1) return -1;
            key[n++] = f->pos;
        }
        if (n == MKEY_MAX - 1) return -1;
        key[n++] = -1; /* the end of a stack */
    }
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)key[i]) * 0x100000001B3ull;
    *hash = h;
    return n;
}

int loom_grammar_mask(const loom_grammar_state *s, const loom_grammar_vocab *v, int budget,
                      uint8_t *allow, loom_grammar_scratch *sc) {
    int n_allowed = 0;
    const int eos_ok = v->eos >= 0 && v->eos < v->n && s->cur.accept && budget >= 1;
    if (budget < 1 || s->cur.n == 0) {
        memset(allow, 0, (size_t)v->n);
        if (eos_ok) allow[v->eos] = 1, n_allowed++;
        return n_allowed;
    }
    const loom_grammar *g = s->g;
    uint64_t hash = 0;
    const int klen = state_key(s, sc->key, &hash);
    for (int i = 0; klen >= 0 && i < MCACHE; i++) {
        mcache *m = &sc->mc[i];
        if (m->key && m->gid == g->id && m->vid == v->id && m->hash == hash && m->klen == klen &&
            budget - 1 >= m->maxdist && !memcmp(m->key, sc->key, (size_t)klen * sizeof *sc->key)) {
            m->used = ++sc->clock;
            memcpy(allow, m->allow, (size_t)v->n);
            if (eos_ok) allow[v->eos] = 1;
            return m->n_allowed + eos_ok;
        }
    }
    memset(allow, 0, (size_t)v->n);
    /* a fresh automaton for this call */
    arena_release(&sc->a, (amark){0, 0});
    if (sc->ftab) memset(sc->ftab, 0, sc->fcap * sizeof *sc->ftab);
    if (sc->stab) memset(sc->stab, 0, sc->scap * sizeof *sc->stab);
    sc->fn = 0;
    sc->n_st = 0;
    sc->pool_n = 0;
    if (sc->path_cap < v->max_depth + 1) {
        free(sc->path);
        sc->path_cap = v->max_depth + 1;
        sc->path = loom_malloc((size_t)sc->path_cap * sizeof *sc->path);
    }
    for (int i = 0; i < s->cur.n; i++) sc->tmp[i] = intern_deep(sc, g, s->cur.f[i]);
    sc->path[0] = intern_state(sc, sc->tmp, s->cur.n, s->cur.accept, s->cur.dist);
    int maxdist = 0;
    for (int i = 1; i < v->n_nodes;) {
        const int d = v->depth[i];
        const int k = transition(sc, g, sc->path[d - 1], v->nbyte[i]);
        if (k < 0) {
            i = v->end[i]; /* nothing below continues either */
            continue;
        }
        sc->path[d] = k;
        if (v->tok0[i + 1] > v->tok0[i]) {
            const int dist = sc->st[k].dist;
            if (dist > maxdist) maxdist = dist;
            if (dist <= budget - 1)
                for (int t = v->tok0[i]; t < v->tok0[i + 1]; t++) allow[v->tok_ids[t]] = 1, n_allowed++;
        }
        if (sc->st[k].n == 0) i = v->end[i]; /* complete, nothing can follow: no longer token fits */
        else i++;
    }
    if (klen >= 0 && budget - 1 >= maxdist) { /* the budget did not bind: cache it */
        mcache *m = &sc->mc[0];
        for (int i = 1; i < MCACHE; i++)
            if (sc->mc[i].used < m->used) m = &sc->mc[i];
        if (!m->allow || m->vid != v->id) m->allow = loom_realloc(m->allow, (size_t)v->n);
        m->key = loom_realloc(m->key, (size_t)(klen > 0 ? klen : 1) * sizeof *m->key);
        memcpy(m->key, sc->key, (size_t)klen * sizeof *m->key);
        memcpy(m->allow, allow, (size_t)v->n);
        m->gid = g->id;
        m->vid = v->id;
        m->hash = hash;
        m->klen = klen;
        m->n_allowed = n_allowed;
        m->maxdist = maxdist;
        m->used = ++sc->clock;
    }
    if (eos_ok) allow[v->eos] = 1, n_allowed++;
    return n_allowed;
}
