/* Byte-level BPE training, step for step the algorithm of Hugging Face `tokenizers`'
 * BpeTrainer (with the full 256-byte initial alphabet), so that both produce the same merges:
 *
 *   1. every text (a line of a file, its '\n' kept) is pre-tokenized with the GPT-2 regex and
 *      the pieces ("words") are counted; special tokens get no special treatment here;
 *   2. ids: the specials first, in the order given, then the 256 byte characters sorted by
 *      their code point in the GPT-2 alphabet, then one id per merge;
 *   3. pair counts over all words (weighted by word count) and, per pair, the words holding it;
 *      a max-heap keyed by (count, then the smaller (left id, right id) pair first);
 *   4. pop the top; when its count is stale, re-push it with the current count; stop when the
 *      vocabulary is full, the heap is empty or the count is below max(1, min_frequency);
 *      otherwise merge the pair in the words listed with the entry, and update the counts of
 *      the neighbouring pairs incrementally; pairs that gained occurrences are pushed again
 *      with the words where they gained them.
 * A merged string that already exists (the same bytes from another pair) reuses its id. */
#include <stdlib.h>
#include <string.h>

#include "data/bpe_internal.h"

typedef struct word_arena {
    char **blocks;
    size_t n_blocks, used, block_cap;
} word_arena;

static char *arena_put(word_arena *a, const uint8_t *p, size_t n) {
    if (n > ((size_t)1 << 20)) { /* big words get a block of their own */
        a->blocks = loom_realloc(a->blocks, (a->n_blocks + 1) * sizeof *a->blocks);
        char *b = loom_malloc(n);
        memcpy(b, p, n);
        /* keep the current block last */
        if (a->n_blocks) {
            a->blocks[a->n_blocks] = a->blocks[a->n_blocks - 1];
            a->blocks[a->n_blocks - 1] = b;
        } else {
            a->blocks[0] = b;
            a->used = a->block_cap = 0;
        }
        a->n_blocks++;
        return b;
    }
    if (!a->n_blocks || a->used + n > a->block_cap) {
        a->blocks = loom_realloc(a->blocks, (a->n_blocks + 1) * sizeof *a->blocks);
        a->block_cap = (size_t)1 << 20;
        a->blocks[a->n_blocks++] = loom_malloc(a->block_cap);
        a->used = 0;
    }
    char *dst = a->blocks[a->n_blocks - 1] + a->used;
    memcpy(dst, p, n);
    a->used += n;
    return dst;
}

static void arena_free(word_arena *a) {
    for (size_t i = 0; i < a->n_blocks; i++) free(a->blocks[i]);
    free(a->blocks);
}

typedef struct counter {
    word_arena arena;
    bpe_strmap map;   /* word bytes -> index */
    char **word;
    uint32_t *len;
    uint64_t *count;
    size_t n, cap;
} counter;

static void count_piece(void *vc, const uint8_t *p, size_t n) {
    counter *c = vc;
    if (!n) return;
    if (n > UINT32_MAX) n = UINT32_MAX;
    int32_t i = bpe_strmap_get(&c->map, (const char *)p, n);
    if (i >= 0) {
        c->count[i]++;
        return;
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 4096;
        c->word = loom_realloc(c->word, c->cap * sizeof *c->word);
        c->len = loom_realloc(c->len, c->cap * sizeof *c->len);
        c->count = loom_realloc(c->count, c->cap * sizeof *c->count);
    }
    char *w = arena_put(&c->arena, p, n);
    c->word[c->n] = w;
    c->len[c->n] = (uint32_t)n;
    c->count[c->n] = 1;
    LOOM_CHECK(c->n < INT32_MAX);
    bpe_strmap_put(&c->map, w, n, (int32_t)c->n);
    c->n++;
}

/* ---- the merge loop's data ------------------------------------------------------------------ */
typedef struct wlist { /* word indices, deduplicated as they are appended word by word */
    uint32_t *w;
    uint32_t n, cap;
} wlist;

static void wlist_add(wlist *l, uint32_t w) {
    if (l->n && l->w[l->n - 1] == w) return;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 4;
        l->w = loom_realloc(l->w, l->cap * sizeof *l->w);
    }
    l->w[l->n++] = w;
}

typedef struct qitem {
    int64_t count;
    uint64_t pair; /* left << 32 | right */
    uint32_t list; /* index into the lists pool */
} qitem;

static inline int q_above(const qitem *a, const qitem *b) { /* a pops before b */
    return a->count != b->count ? a->count > b->count : a->pair < b->pair;
}

typedef struct queue {
    qitem *h;
    size_t n, cap;
} queue;

static void q_push(queue *q, qitem x) {
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 1024;
        q->h = loom_realloc(q->h, q->cap * sizeof *q->h);
    }
    size_t i = q->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!q_above(&x, &q->h[p])) break;
        q->h[i] = q->h[p];
        i = p;
    }
    q->h[i] = x;
}

static qitem q_pop(queue *q) {
    qitem top = q->h[0], x = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && q_above(&q->h[c + 1], &q->h[c])) c++;
        if (!q_above(&q->h[c], &x)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = x;
    return top;
}

typedef struct lists {
    wlist *l;
    uint32_t n, cap;
    uint32_t *free_ids;
    uint32_t n_free;
} lists;

static uint32_t lists_new(lists *ls) {
    if (ls->n_free) return ls->free_ids[--ls->n_free];
    if (ls->n == ls->cap) {
        ls->cap = ls->cap ? 2 * ls->cap : 1024;
        ls->l = loom_realloc(ls->l, ls->cap * sizeof *ls->l);
        ls->free_ids = loom_realloc(ls->free_ids, ls->cap * sizeof *ls->free_ids);
    }
    memset(&ls->l[ls->n], 0, sizeof ls->l[ls->n]);
    return ls->n++;
}

static void lists_release(lists *ls, uint32_t i) {
    ls->l[i].n = 0;
    ls->free_ids[ls->n_free++] = i;
}

typedef struct trainer {
    /* vocabulary being built: the spelling of each id (byte-level characters; specials as
     * they are), and spelling -> id, as HF's word_to_id */
    char **raw;
    uint32_t *raw_len;
    uint32_t n_tok, cap_tok;
    bpe_strmap by_raw;
    /* words as symbol arrays */
    int32_t **sym;
    uint32_t *n_sym;
    uint64_t *wcount;
    size_t n_words;
    bpe_u64map pair_count; /* pair -> int64 count (as bits) */
    /* this iteration's pairs that gained occurrences: pair -> list index */
    bpe_u64map gained;
    uint64_t *gained_pairs;
    size_t n_gained, cap_gained;
    lists ls;
    queue q;
} trainer;

static uint32_t tok_add(trainer *tr, const char *raw, size_t len) {
    if (tr->n_tok == tr->cap_tok) {
        tr->cap_tok = tr->cap_tok ? 2 * tr->cap_tok : 1024;
        tr->raw = loom_realloc(tr->raw, tr->cap_tok * sizeof *tr->raw);
        tr->raw_len = loom_realloc(tr->raw_len, tr->cap_tok * sizeof *tr->raw_len);
    }
    char *s = loom_malloc(len + 1);
    memcpy(s, raw, len);
    s[len] = 0;
    tr->raw[tr->n_tok] = s;
    tr->raw_len[tr->n_tok] = (uint32_t)len;
    bpe_strmap_put(&tr->by_raw, s, len, (int32_t)tr->n_tok);
    return tr->n_tok++;
}

static void count_add(trainer *tr, uint64_t pair, int64_t delta) {
    uint64_t *v = bpe_u64map_upsert(&tr->pair_count, pair, 0, NULL);
    *v = (uint64_t)((int64_t)*v + delta);
}

static void gained_add(trainer *tr, uint64_t pair, uint32_t w) {
    int fresh;
    uint64_t *v = bpe_u64map_upsert(&tr->gained, pair, 0, &fresh);
    if (fresh) {
        *v = lists_new(&tr->ls);
        if (tr->n_gained == tr->cap_gained) {
            tr->cap_gained = tr->cap_gained ? 2 * tr->cap_gained : 256;
            tr->gained_pairs = loom_realloc(tr->gained_pairs, tr->cap_gained * sizeof *tr->gained_pairs);
        }
        tr->gained_pairs[tr->n_gained++] = pair;
    }
    wlist_add(&tr->ls.l[*v], w);
}

static inline uint64_t mkpair(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

/* HF's Word::merge on word w: left to right, non-overlapping; the count changes it reports
 * (including the "(b, next) -1" that may hit the merged pair itself) are applied at once. */
static void merge_in_word(trainer *tr, uint32_t w, int32_t a, int32_t b, int32_t nid) {
    int32_t *s = tr->sym[w];
    uint32_t n = tr->n_sym[w];
    int64_t c = (int64_t)tr->wcount[w];
    for (uint32_t i = 0; i < n; i++) {
        if (s[i] != a || i + 1 >= n || s[i + 1] != b) continue;
        if (i > 0) {
            count_add(tr, mkpair(s[i - 1], a), -c);
            count_add(tr, mkpair(s[i - 1], nid), c);
            gained_add(tr, mkpair(s[i - 1], nid), w);
        }
        s[i] = nid;
        memmove(s + i + 1, s + i + 2, (n - i - 2) * sizeof *s);
        n--;
        if (i + 1 < n) {
            count_add(tr, mkpair(b, s[i + 1]), -c);
            count_add(tr, mkpair(nid, s[i + 1]), c);
            gained_add(tr, mkpair(nid, s[i + 1]), w);
        }
    }
    tr->n_sym[w] = n;
}

static void trainer_free(trainer *tr) {
    for (uint32_t i = 0; i < tr->n_tok; i++) free(tr->raw[i]);
    free(tr->raw);
    free(tr->raw_len);
    bpe_strmap_free(&tr->by_raw);
    for (size_t i = 0; i < tr->n_words; i++) free(tr->sym[i]);
    free(tr->sym);
    free(tr->n_sym);
    if (tr->pair_count.cap) bpe_u64map_free(&tr->pair_count);
    if (tr->gained.cap) bpe_u64map_free(&tr->gained);
    free(tr->gained_pairs);
    for (uint32_t i = 0; i < tr->ls.n; i++) free(tr->ls.l[i].w);
    free(tr->ls.l);
    free(tr->ls.free_ids);
    free(tr->q.h);
}

/* Builds the loom_tokenizer from the trained vocabulary and merges. */
static int build_tokenizer(trainer *tr, const loom_bpe_train_opts *o, const int32_t (*merges)[2],
                           uint32_t n_merges, loom_tokenizer **out, loom_err *err) {
    loom_tokenizer *t;
    if (bpe_new(&t, err)) return -1;
    t->vocab_size = tr->n_tok;
    t->tok = loom_calloc(tr->n_tok, sizeof *t->tok);
    bpe_strmap_free(&t->vocab);
    bpe_strmap_init(&t->vocab, tr->n_tok);
    int n_sp = o->n_specials;
    for (uint32_t i = 0; i < tr->n_tok; i++) {
        size_t len = tr->raw_len[i];
        char *s = loom_malloc(len + 1);
        memcpy(s, tr->raw[i], len + 1);
        bpe_set_token(t, (int32_t)i, s, len, 1);
        bpe_strmap_put(&t->vocab, t->tok[i].str, len, (int32_t)i);
    }
    t->merges = loom_malloc((n_merges ? n_merges : 1) * sizeof *t->merges);
    bpe_u64map_free(&t->merge_map);
    bpe_u64map_init(&t->merge_map, n_merges);
    for (uint32_t m = 0; m < n_merges; m++) {
        const bpe_token *a = &t->tok[merges[m][0]], *b = &t->tok[merges[m][1]];
        char *s = loom_malloc(a->str_len + b->str_len + 1);
        memcpy(s, a->str, a->str_len);
        memcpy(s + a->str_len, b->str, b->str_len);
        int32_t nid = bpe_strmap_get(&t->vocab, s, a->str_len + b->str_len);
        free(s);
        LOOM_CHECK(nid >= 0);
        *bpe_u64map_upsert(&t->merge_map, mkpair(merges[m][0], merges[m][1]), 0, NULL) =
            ((uint64_t)t->n_merges << 32) | (uint32_t)nid;
        t->merges[t->n_merges][0] = merges[m][0];
        t->merges[t->n_merges][1] = merges[m][1];
        t->n_merges++;
    }
    t->added = loom_calloc(n_sp ? (size_t)n_sp : 1, sizeof *t->added);
    for (int i = 0; i < n_sp; i++) {
        t->added[i].content = loom_strdup(o->specials[i]);
        t->added[i].len = strlen(o->specials[i]);
        t->added[i].id = i;
        t->added[i].special = 1;
    }
    t->n_added = n_sp;
    if (bpe_finish(t, err)) {
        loom_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

static int train_counted(counter *c, const loom_bpe_train_opts *o, loom_tokenizer **out, loom_err *err) {
    trainer tr;
    memset(&tr, 0, sizeof tr);
    bpe_strmap_init(&tr.by_raw, o->vocab_size + 256);
    int32_t (*merges)[2] = NULL;
    uint32_t n_merges = 0, cap_merges = 0;
    int rc = -1;
    double t0 = loom_now();

    /* 1. specials, then the byte alphabet in code point order */
    for (int i = 0; i < o->n_specials; i++) tok_add(&tr, o->specials[i], strlen(o->specials[i]));
    int32_t byte_id[256];
    for (uint32_t cp = 0; cp < 256 + 68; cp++) {
        int b = bpe_cp_to_byte(cp);
        if (b < 0) continue;
        uint8_t raw = (uint8_t)b;
        char sp[4];
        size_t sl = bpe_bytes_to_spelling(&raw, 1, sp);
        int32_t id = bpe_strmap_get(&tr.by_raw, sp, sl); /* a special may already spell it */
        byte_id[b] = id >= 0 ? id : (int32_t)tok_add(&tr, sp, sl);
    }
    /* 2. words as symbols */
    tr.n_words = c->n;
    tr.sym = loom_calloc(c->n ? c->n : 1, sizeof *tr.sym);
    tr.n_sym = loom_calloc(c->n ? c->n : 1, sizeof *tr.n_sym);
    tr.wcount = c->count;
    for (size_t w = 0; w < c->n; w++) {
        tr.sym[w] = loom_malloc((c->len[w] ? c->len[w] : 1) * sizeof(int32_t));
        for (uint32_t i = 0; i < c->len[w]; i++) tr.sym[w][i] = byte_id[(uint8_t)c->word[w][i]];
        tr.n_sym[w] = c->len[w];
    }
    /* 3. pair counts and where each pair occurs */
    bpe_u64map_init(&tr.pair_count, 1u << 16);
    bpe_u64map_init(&tr.gained, 1u << 16);
    for (size_t w = 0; w < tr.n_words; w++)
        for (uint32_t i = 0; i + 1 < tr.n_sym[w]; i++) {
            uint64_t p = mkpair(tr.sym[w][i], tr.sym[w][i + 1]);
            count_add(&tr, p, (int64_t)tr.wcount[w]);
            gained_add(&tr, p, (uint32_t)w);
        }
    for (size_t g = 0; g < tr.n_gained; g++) {
        uint64_t p = tr.gained_pairs[g];
        uint32_t li = (uint32_t)*bpe_u64map_get(&tr.gained, p);
        int64_t cnt = (int64_t)*bpe_u64map_get(&tr.pair_count, p);
        if (cnt > 0) q_push(&tr.q, (qitem){cnt, p, li});
        else lists_release(&tr.ls, li);
    }
    tr.n_gained = 0;
    bpe_u64map_free(&tr.gained);
    bpe_u64map_init(&tr.gained, 64);

    /* 4. merges */
    uint64_t min_freq = o->min_frequency;
    while (tr.n_tok < o->vocab_size && tr.q.n) {
        qitem top = q_pop(&tr.q);
        int64_t cur = (int64_t)*bpe_u64map_get(&tr.pair_count, top.pair);
        if (top.count != cur) {
            top.count = cur;
            q_push(&tr.q, top);
            continue;
        }
        if (top.count < 1 || (uint64_t)top.count < min_freq) break;
        int32_t a = (int32_t)(top.pair >> 32), b = (int32_t)(uint32_t)top.pair;
        size_t la = tr.raw_len[a], lb = tr.raw_len[b];
        char *s = loom_malloc(la + lb + 1);
        memcpy(s, tr.raw[a], la);
        memcpy(s + la, tr.raw[b], lb);
        int32_t nid = bpe_strmap_get(&tr.by_raw, s, la + lb);
        if (nid < 0) nid = (int32_t)tok_add(&tr, s, la + lb);
        free(s);
        if (n_merges == cap_merges) {
            cap_merges = cap_merges ? 2 * cap_merges : 1024;
            merges = loom_realloc(merges, cap_merges * sizeof *merges);
        }
        merges[n_merges][0] = a;
        merges[n_merges][1] = b;
        n_merges++;
        /* a copy: merging may grow tr.ls.l (this list stays reserved until released) */
        wlist l = tr.ls.l[top.list];
        for (uint32_t k = 0; k < l.n; k++) merge_in_word(&tr, l.w[k], a, b, nid);
        lists_release(&tr.ls, top.list);
        for (size_t g = 0; g < tr.n_gained; g++) {
            uint64_t p = tr.gained_pairs[g];
            uint32_t li = (uint32_t)*bpe_u64map_get(&tr.gained, p);
            int64_t cnt = (int64_t)*bpe_u64map_get(&tr.pair_count, p);
            if (cnt > 0) q_push(&tr.q, (qitem){cnt, p, li});
            else lists_release(&tr.ls, li);
        }
        if (tr.n_gained) {
            bpe_u64map_free(&tr.gained);
            bpe_u64map_init(&tr.gained, tr.n_gained);
        }
        tr.n_gained = 0;
        if (o->verbose && n_merges % 1000 == 0)
            loom_log("tokenizer train: %u merges, vocabulary %u, %.1f s", n_merges, tr.n_tok, loom_now() - t0);
    }
    if (o->verbose)
        loom_log("tokenizer train: %zu distinct words, %u merges, vocabulary %u, %.2f s", c->n, n_merges, tr.n_tok,
                 loom_now() - t0);
    rc = build_tokenizer(&tr, o, (const int32_t(*)[2])merges, n_merges, out, err);
    free(merges);
    tr.wcount = NULL;
    trainer_free(&tr);
    return rc;
}

static int check_opts(const loom_bpe_train_opts *o, loom_err *err) {
    if (o->n_specials < 0 || o->n_specials > 65536)
        return loom_errf(err, "tokenizer train: %d special tokens (0..65536)", o->n_specials);
    for (int i = 0; i < o->n_specials; i++) {
        if (!o->specials[i] || !o->specials[i][0]) return loom_errf(err, "tokenizer train: special token %d is empty", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(o->specials[i], o->specials[j]))
                return loom_errf(err, "tokenizer train: special token '%s' is given twice", o->specials[i]);
    }
    if (o->vocab_size < 256u + (uint32_t)o->n_specials || o->vocab_size >= BPE_MAX_ID)
        return loom_errf(err, "tokenizer train: vocab size %u must be in [256 + %d specials, %u)", o->vocab_size,
                         o->n_specials, BPE_MAX_ID);
    return 0;
}

static void counter_free(counter *c) {
    arena_free(&c->arena);
    bpe_strmap_free(&c->map);
    free(c->word);
    free(c->len);
    free(c->count);
}

/* Feeds text to the counter one line at a time (a line keeps its '\n'). */
static int count_lines(const loom_tokenizer *re, pcre2_match_data *md, counter *c, const uint8_t *s, size_t n,
                       loom_err *err) {
    size_t pos = 0;
    while (pos < n) {
        const uint8_t *nl = memchr(s + pos, '\n', n - pos);
        size_t end = nl ? (size_t)(nl - s) + 1 : n;
        if (bpe_pretokenize(re, md, s + pos, end - pos, count_piece, c, err)) return -1;
        pos = end;
    }
    return 0;
}

static int train_common(const char *const *files, int n_files, const char *const *texts, const size_t *lens,
                        size_t n_texts, const loom_bpe_train_opts *o, loom_tokenizer **out, loom_err *err) {
    if (check_opts(o, err)) return -1;
    loom_tokenizer *re;
    if (bpe_new(&re, err)) return -1;
    counter c;
    memset(&c, 0, sizeof c);
    bpe_strmap_init(&c.map, 1u << 16);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = 0;
    double t0 = loom_now();
    size_t total = 0;
    for (int f = 0; f < n_files && !rc; f++) {
        char *buf;
        size_t len;
        if (loom_read_file(files[f], (size_t)1 << 34, &buf, &len, err)) {
            rc = -1;
            break;
        }
        rc = count_lines(re, md, &c, (const uint8_t *)buf, len, err);
        if (rc) loom_err_prefix(err, "%s", files[f]);
        total += len;
        free(buf);
    }
    for (size_t i = 0; i < n_texts && !rc; i++) {
        rc = bpe_pretokenize(re, md, (const uint8_t *)texts[i], lens[i], count_piece, &c, err);
        total += lens[i];
    }
    pcre2_match_data_free(md);
    loom_tokenizer_free(re);
    if (!rc && o->verbose)
        loom_log("tokenizer train: counted %zu bytes, %zu distinct words in %.2f s", total, c.n, loom_now() - t0);
    if (!rc) rc = train_counted(&c, o, out, err);
    counter_free(&c);
    return rc;
}

int loom_tokenizer_train(const char *const *files, int n_files, const loom_bpe_train_opts *o,
                         loom_tokenizer **out, loom_err *err) {
    return train_common(files, n_files, NULL, NULL, 0, o, out, err);
}

int loom_tokenizer_train_texts(const char *const *texts, const size_t *lens, size_t n_texts,
                               const loom_bpe_train_opts *o, loom_tokenizer **out,
                               loom_err *err) {
    return train_common(NULL, 0, texts, lens, n_texts, o, out, err);
}
