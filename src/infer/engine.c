/* The batched inference engine: continuous batching over a KV-cache pool with a memory budget.
 *
 * A step: (1) requests with max_tokens 0 finish; waiting requests join in arrival order while
 * fewer than max_batch run and their cache reservation fits the pool's budget (the first that
 * does not fit waits, and so do those behind it: no overtaking, no starvation); (2) one ragged
 * forward (loom_model_decode_batch) over the pending token of every decoding sequence and the
 * next chunk of every prefilling prompt, at most max_step_tokens rows (decode rows first);
 * (3) each sequence whose logits came back samples its next token with its own parameters and
 * RNG; finished ones release their cache and leave. A tensor-parallel view steps the same way:
 * the ranks of its tp group submit the same requests in the same order and step together
 * (their forwards meet at the model's communication points), and since each gets the whole
 * logits bit for bit alike, each samples the same tokens. docs/inference.md. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/grammar.h"
#include "loom/infer.h"
#include "loom/tokenizer.h"

enum { R_WAITING = 0, R_RUNNING = 1, R_DONE = 2 };

typedef struct req {
    int64_t id;
    int state;
    int32_t *toks;          /* prompt, then the generated tokens */
    float *lp;              /* (generated) their log-probs, with p.logprobs */
    int n_prompt, n_gen;
    int fed;                /* positions in the cache */
    int cap;                /* positions reserved */
    size_t bytes;           /* reservation (K and V) */
    float *k, *v;           /* (L, cap, KVH*D) each, while running */
    loom_gen_params p;
    char **stop;            /* copies of p.stop */
    size_t max_stop;        /* longest stop string */
    loom_rng rng;
    loom_engine_cb cb;
    void *ctx;
    loom_sbuf text;         /* decoded output (with a tokenizer) */
    size_t emitted;         /* bytes of text already passed to cb */
    int finish;
    loom_grammar_state *gs; /* under a grammar: its state after the output so far */
    int budget;             /* tokens it may generate in all (max_tokens, or the cache's end) */
    int cached;             /* prompt positions copied from the prefix cache at join */
    int blocks_in;          /* prompt blocks [0, blocks_in) are in the prefix cache */
    uint64_t chain;         /* the chain hash of those blocks */
} req;

/* ---- the prefix cache (docs/inference.md, "Prefix caching") -------------------------------
 * The K and V rows of full blocks of PBLOCK prompt tokens, keyed by the chain hash of every
 * token from position 0 to the block's end (a block matches only after the same whole
 * prefix), its own tokens and its parent's hash checked too. A joining request copies the
 * longest run of cached blocks of its prompt (all but its last token) into its cache and
 * prefills only the rest; its own full prompt blocks go in as its prefill completes them.
 * Copying, not sharing: a running sequence owns every row it reads, so nothing refers to a
 * block and any block may be evicted, least recently used first, when the pool needs room
 * (blocks and running sequences share the budget). Not for models with sliding-window layers
 * (their rings hold only the last window of positions). */
enum { PBLOCK = 16, PBUCKETS = 4096 };
typedef struct pblock {
    uint64_t hash, parent;
    int depth;                  /* positions [depth * PBLOCK, (depth + 1) * PBLOCK) */
    int32_t toks[PBLOCK];
    float *k, *v;               /* (L, PBLOCK, one layer's row) each */
    uint64_t used;              /* LRU clock */
    struct pblock *next;        /* bucket chain */
} pblock;

static uint64_t chain_hash(uint64_t parent, const int32_t *t) {
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < PBLOCK; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ULL;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 29);
}

struct loom_engine {
    loom_model *m;
    const loom_backend *be; /* the model's: the KV caches and cached blocks are its memory */
    const loom_tokenizer *tok;
    int V, maxT, tok_vocab;
    int32_t eos;            /* the tokenizer's end-of-text id, -1 when none */
    loom_engine_opts o;
    size_t fpp;             /* floats per position of K (or V) */
    req **reqs;             /* live requests (not released), in arrival order */
    int n, capn;
    int64_t next_id;
    loom_decode_ws *ws;
    int ws_rows;
    int32_t *rows_tok;      /* (max_step_tokens) */
    loom_decode_seg *segs;  /* (max_batch) */
    req **seg_req;          /* (max_batch) */
    void *sample_scratch;
    /* constrained decoding (built at the first request with a grammar) */
    loom_grammar_vocab *gvocab;
    loom_grammar_scratch *gscratch;
    uint8_t *allow;         /* (V) */
    float *masked;          /* (V) the logits with the disallowed ones -inf */
    loom_engine_stats st;
    /* the prefix cache (o.prefix_cache) */
    pblock *buckets[PBUCKETS];
    size_t pblock_bytes;        /* K and V of one block */
    uint64_t clock;
    int L;
};

static pblock *pc_find(const loom_engine *e, uint64_t hash, uint64_t parent, int depth, const int32_t *t) {
    for (pblock *b = e->buckets[hash % PBUCKETS]; b; b = b->next)
        if (b->hash == hash && b->parent == parent && b->depth == depth &&
            !memcmp(b->toks, t, sizeof b->toks))
            return b;
    return NULL;
}

static void pc_unlink(loom_engine *e, pblock *x) {
    pblock **pp = &e->buckets[x->hash % PBUCKETS];
    while (*pp != x) pp = &(*pp)->next;
    *pp = x->next;
    e->be->mem_free(x->k);
    e->be->mem_free(x->v);
    free(x);
    e->st.prefix_blocks--;
    e->st.prefix_bytes -= e->pblock_bytes;
}

/* evicts the least recently used block older than `below`; 0 when there is none. A walk
 * along a chain stamps a block more recently than every block after it, so a block's parent
 * is never older than it: leaves go first, and no cached block outlives its parent. */
static int pc_evict_one(loom_engine *e, uint64_t below) {
    pblock *lru = NULL;
    for (int i = 0; i < PBUCKETS; i++)
        for (pblock *b = e->buckets[i]; b; b = b->next)
            if (b->used < below && (!lru || b->used < lru->used)) lru = b;
    if (!lru) return 0;
    pc_unlink(e, lru);
    e->st.prefix_evicted++;
    return 1;
}

/* room for `bytes` more in the pool, evicting cached blocks older than `below` as needed */
static int pool_fits(loom_engine *e, size_t bytes, uint64_t below) {
    while (e->st.kv_used + e->st.prefix_bytes + bytes > e->o.kv_budget_bytes)
        if (!pc_evict_one(e, below)) return 0;
    return 1;
}

/* stamps for a walk along r's chain: block i gets base - i (newer than anything before) */
static uint64_t pc_walk_base(loom_engine *e, const req *r) {
    e->clock += (uint64_t)(r->n_prompt / PBLOCK) + 1;
    return e->clock;
}

/* at join: copies the longest cached run of r's prompt blocks (leaving its last token to feed) */
static void pc_take(loom_engine *e, req *r) {
    const size_t fpp = e->fpp / (size_t)e->L; /* one layer's row */
    uint64_t h = 0;
    const uint64_t base = pc_walk_base(e, r);
    int i = 0;
    for (; (i + 1) * PBLOCK <= r->n_prompt - 1; i++) {
        const int32_t *t = r->toks + (size_t)i * PBLOCK;
        const uint64_t nh = chain_hash(h, t);
        pblock *b = pc_find(e, nh, h, i, t);
        if (!b) break;
        b->used = base - (uint64_t)i;
        for (int l = 0; l < e->L; l++) {
            const size_t dst = ((size_t)l * (size_t)r->cap + (size_t)i * PBLOCK) * fpp;
            const size_t src = (size_t)l * PBLOCK * fpp;
            e->be->mem_d2d(r->k + dst, b->k + src, PBLOCK * fpp * sizeof(float));
            e->be->mem_d2d(r->v + dst, b->v + src, PBLOCK * fpp * sizeof(float));
        }
        h = nh;
    }
    r->blocks_in = i;
    r->chain = h;
    r->cached = i * PBLOCK;
    r->fed = r->cached;
    e->st.prefix_hit_tokens += r->cached;
}

/* after a step: r's prompt blocks that its prefill has completed go into the cache */
static void pc_put(loom_engine *e, req *r) {
    const size_t fpp = e->fpp / (size_t)e->L; /* one layer's row */
    const int upto = (r->fed < r->n_prompt ? r->fed : r->n_prompt) / PBLOCK;
    const uint64_t base = pc_walk_base(e, r);
    /* the chain so far (its blocks may have been evicted since: then start again from there) */
    uint64_t h = 0;
    int have = 0;
    for (; have < r->blocks_in; have++) {
        const int32_t *t = r->toks + (size_t)have * PBLOCK;
        const uint64_t nh = chain_hash(h, t);
        pblock *b = pc_find(e, nh, h, have, t);
        if (!b) break;
        b->used = base - (uint64_t)have;
        h = nh;
    }
    if (have < r->blocks_in) { /* a block of it went: what follows it is not reachable */
        r->blocks_in = have;
        r->chain = h;
    }
    for (int i = r->blocks_in; i < upto; i++) {
        const int32_t *t = r->toks + (size_t)i * PBLOCK;
        const uint64_t nh = chain_hash(r->chain, t);
        pblock *b = pc_find(e, nh, r->chain, i, t);
        if (!b) {
            /* no room (other chains' blocks evicted first, never this one's): not cached */
            if (!pool_fits(e, e->pblock_bytes, base - (uint64_t)upto)) break;
            b = loom_calloc(1, sizeof *b);
            b->hash = nh;
            b->parent = r->chain;
            b->depth = i;
            memcpy(b->toks, t, sizeof b->toks);
            b->k = e->be->mem_alloc(e->pblock_bytes / 2, 0);
            b->v = e->be->mem_alloc(e->pblock_bytes / 2, 0);
            for (int l = 0; l < e->L; l++) {
                const size_t src = ((size_t)l * (size_t)r->cap + (size_t)i * PBLOCK) * fpp;
                const size_t dst = (size_t)l * PBLOCK * fpp;
                e->be->mem_d2d(b->k + dst, r->k + src, PBLOCK * fpp * sizeof(float));
                e->be->mem_d2d(b->v + dst, r->v + src, PBLOCK * fpp * sizeof(float));
            }
            b->next = e->buckets[nh % PBUCKETS];
            e->buckets[nh % PBUCKETS] = b;
            e->st.prefix_blocks++;
            e->st.prefix_bytes += e->pblock_bytes;
        }
        b->used = base - (uint64_t)i;
        r->chain = nh;
        r->blocks_in = i + 1;
    }
}

int loom_engine_create(loom_model *m, const loom_tokenizer *tok, const loom_engine_opts *o,
                       loom_engine **out, loom_err *err) {
    const loom_model_config *c = loom_model_get_config(m);
    *out = NULL;
    if (c->head != LOOM_HEAD_LM)
        return loom_errf(err, "a classification model does not generate text");
    if (!loom_model_can_decode(m))
        return loom_errf(err, "the model's parameters are not readable for decoding (a model "
                              "trained under ZeRO stage 3 holds only its shards: use "
                              "parallel.zero 0-2)");
    const loom_model_layout *lay = loom_model_get_layout(m);
    /* a tensor-parallel view (tp > 1) decodes with its group's communication points: every
     * rank of the group gets the whole logits, so the group's engines step alike */
    if (!lay->has_embedding || !lay->has_head || lay->sp || lay->cp > 1)
        return loom_errf(err, "the inference engine needs every layer of the model, without "
                              "sequence or context parallelism (a tp view is fine)");
    loom_engine *e = loom_calloc(1, sizeof *e);
    e->m = m;
    e->be = loom_model_backend(m);
    e->tok = tok;
    e->V = c->vocab_size;
    e->maxT = c->max_seq_len;
    e->eos = -1;
    if (tok) {
        e->tok_vocab = (int)loom_tokenizer_vocab_size(tok);
        e->eos = loom_tokenizer_special_id(tok, "<|endoftext|>");
    }
    e->fpp = loom_model_kv_floats_per_pos(m);
    if (o) e->o = *o;
    if (e->o.max_batch <= 0) e->o.max_batch = 16;
    if (e->o.max_step_tokens <= 0) e->o.max_step_tokens = e->maxT > 256 ? e->maxT : 256;
    if (e->o.max_step_tokens < e->o.max_batch) e->o.max_step_tokens = e->o.max_batch;
    if (e->o.kv_budget_bytes == 0)
        e->o.kv_budget_bytes =
            (size_t)e->o.max_batch * loom_model_kv_floats(m, e->maxT) * 2 * sizeof(float);
    e->rows_tok = loom_calloc((size_t)e->o.max_step_tokens, sizeof(int32_t));
    e->segs = loom_calloc((size_t)e->o.max_batch, sizeof *e->segs);
    e->seg_req = loom_calloc((size_t)e->o.max_batch, sizeof *e->seg_req);
    e->sample_scratch = loom_malloc(loom_sample_scratch_bytes(e->V));
    e->st.kv_budget = e->o.kv_budget_bytes;
    e->L = c->n_layer;
    e->pblock_bytes = 2 * PBLOCK * e->fpp * sizeof(float); /* (fpp: all layers' rows) */
    if (e->o.prefix_cache) /* every layer must hold every position (no ring) */
        for (int l = 0; l < e->L; l++)
            if (loom_model_kv_slots(m, l, e->maxT) < e->maxT) {
                const int slots = loom_model_kv_slots(m, l, e->maxT);
                loom_engine_free(e);
                return loom_errf(err, "prefix caching does not work with sliding-window layers "
                                      "(layer %d holds a ring of %d positions): turn it off", l, slots);
            }
    *out = e;
    return 0;
}

static void req_free(loom_engine *e, req *r) {
    if (!r) return;
    free(r->toks);
    free(r->lp);
    e->be->mem_free(r->k);
    e->be->mem_free(r->v);
    for (int i = 0; r->stop && i < r->p.n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->text.p);
    loom_grammar_state_free(r->gs);
    free(r);
}

void loom_engine_free(loom_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n; i++) req_free(e, e->reqs[i]);
    free(e->reqs);
    loom_decode_ws_free(e->ws);
    free(e->rows_tok);
    free(e->segs);
    free(e->seg_req);
    free(e->sample_scratch);
    loom_grammar_vocab_free(e->gvocab);
    loom_grammar_scratch_free(e->gscratch);
    free(e->allow);
    free(e->masked);
    for (int i = 0; i < PBUCKETS; i++)
        while (e->buckets[i]) pc_unlink(e, e->buckets[i]);
    free(e);
}

static size_t reservation(const loom_engine *e, int n_prompt, int max_tokens, int *cap) {
    int64_t need = (int64_t)n_prompt + max_tokens - 1; /* the last token is never fed */
    if (need < n_prompt) need = n_prompt;
    if (need > e->maxT) need = e->maxT;
    *cap = (int)need;
    /* a sliding-window layer's ring holds min(cap, window) positions */
    return loom_model_kv_floats(e->m, *cap) * 2 * sizeof(float);
}

int loom_engine_submit(loom_engine *e, const int32_t *prompt, int n_prompt,
                       const loom_gen_params *p, loom_engine_cb cb, void *ctx, int64_t *id,
                       loom_err *err) {
    if (n_prompt < 1) return loom_errf(err, "the prompt has no tokens");
    if (n_prompt > e->maxT)
        return loom_errf(err, "the prompt has %d tokens, more than the model's context of %d",
                         n_prompt, e->maxT);
    if (p->max_tokens < 0) return loom_errf(err, "max_tokens %d is negative", p->max_tokens);
    if (!(p->temperature >= 0.0f) || p->temperature > 100.0f)
        return loom_errf(err, "temperature must be in [0, 100]");
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f)) return loom_errf(err, "top_p must be in [0, 1]");
    if (p->top_k < 0) return loom_errf(err, "top_k must be >= 0");
    if (!(p->repetition_penalty >= 0.0f) || p->repetition_penalty > 100.0f)
        return loom_errf(err, "repetition_penalty must be in (0, 100]");
    if (p->n_stop < 0 || p->n_stop > 16) return loom_errf(err, "at most 16 stop strings");
    if (p->n_stop > 0 && !e->tok) return loom_errf(err, "stop strings need a tokenizer");
    for (int i = 0; i < p->n_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0]) return loom_errf(err, "stop string %d is empty", i);
        if (strlen(p->stop[i]) > 1024) return loom_errf(err, "stop string %d is over 1024 bytes", i);
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->V)
            return loom_errf(err, "prompt token %d (id %d) is outside the vocabulary of %d", i,
                             prompt[i], e->V);
    int cap;
    const size_t bytes = reservation(e, n_prompt, p->max_tokens, &cap);
    if (bytes > e->o.kv_budget_bytes)
        return loom_errf(err, "the request needs %zu bytes of KV cache, more than the pool's "
                              "budget of %zu", bytes, e->o.kv_budget_bytes);
    /* the output may have max_tokens tokens, fewer where the cache ends first */
    const int budget = cap - n_prompt + 1 < p->max_tokens ? cap - n_prompt + 1 : p->max_tokens;
    if (p->grammar) {
        if (!e->tok) return loom_errf(err, "constrained decoding needs the engine's tokenizer");
        if (!e->gvocab) {
            if (loom_grammar_vocab_from_tokenizer(e->tok, e->V, e->eos, &e->gvocab, err)) return -1;
            e->gscratch = loom_grammar_scratch_new();
            e->allow = loom_malloc((size_t)e->V);
            e->masked = loom_malloc((size_t)e->V * sizeof(float));
        }
        if (!loom_grammar_vocab_has_bytes(e->gvocab))
            return loom_errf(err, "constrained decoding needs a token for each printable ASCII "
                                  "byte and each UTF-8 continuation byte; this tokenizer lacks "
                                  "some (docs/inference.md)");
        const int need = loom_grammar_min_bytes(p->grammar);
        if (need > budget)
            return loom_errf(err, "max_tokens %d is too small for the response format: its "
                                  "shortest document takes %d tokens of one byte%s", budget, need,
                             budget < p->max_tokens ? " (the context ends first)" : "");
    }
    req *r = loom_calloc(1, sizeof *r);
    r->id = e->next_id++;
    r->p = *p;
    r->n_prompt = n_prompt;
    const int gen_cap = p->max_tokens < e->maxT ? p->max_tokens : e->maxT;
    r->toks = loom_malloc(((size_t)n_prompt + (size_t)gen_cap + 1) * sizeof(int32_t));
    if (p->logprobs) r->lp = loom_malloc(((size_t)gen_cap + 1) * sizeof(float));
    memcpy(r->toks, prompt, (size_t)n_prompt * sizeof(int32_t));
    r->cap = cap;
    r->bytes = bytes;
    r->rng = (loom_rng){.seed = p->seed, .stream = 0x67656e, .counter = 0};
    r->cb = cb;
    r->ctx = ctx;
    r->budget = budget;
    if (p->grammar) r->gs = loom_grammar_state_new(p->grammar);
    if (p->n_stop > 0) {
        r->stop = loom_calloc((size_t)p->n_stop, sizeof(char *));
        for (int i = 0; i < p->n_stop; i++) {
            const size_t l = strlen(p->stop[i]);
            r->stop[i] = loom_malloc(l + 1);
            memcpy(r->stop[i], p->stop[i], l + 1);
            if (l > r->max_stop) r->max_stop = l;
        }
    }
    r->p.stop = (const char *const *)r->stop;
    if (e->n == e->capn) {
        e->capn = e->capn ? 2 * e->capn : 16;
        e->reqs = loom_realloc(e->reqs, (size_t)e->capn * sizeof *e->reqs);
    }
    e->reqs[e->n++] = r;
    e->st.waiting++;
    if (id) *id = r->id;
    return 0;
}

static req *find(const loom_engine *e, int64_t id) {
    /* ids grow with the array order: binary search */
    int lo = 0, hi = e->n - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        if (e->reqs[mid]->id == id) return e->reqs[mid];
        if (e->reqs[mid]->id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

static void release_cache(loom_engine *e, req *r) {
    if (r->state == R_RUNNING) {
        e->be->mem_free(r->k);
        e->be->mem_free(r->v);
        r->k = r->v = NULL;
        e->st.kv_used -= r->bytes;
        e->st.running--;
    } else if (r->state == R_WAITING) {
        e->st.waiting--;
    }
}

static void finish(loom_engine *e, req *r, int reason, int32_t token) {
    release_cache(e, r);
    r->state = R_DONE;
    r->finish = reason;
    if (r->cb) r->cb(r->ctx, r->id, token, r->text.p ? r->text.p + r->emitted : "",
                     r->text.len - r->emitted, reason);
    r->emitted = r->text.len;
}

/* bytes at the end of s[0..n) that start a UTF-8 sequence not yet complete */
static size_t utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        const size_t want = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return want > back ? back : 0;
    }
    return 0;
}

#define REPLACEMENT_CHAR "\xEF\xBF\xBD" /* U+FFFD in UTF-8 */

/* Appends the text of token t; returns 1 when a stop string ended the output (cut there). */
static int add_text(loom_engine *e, req *r, int32_t t) {
    if (!e->tok) return 0;
    const size_t before = r->text.len;
    if (t >= e->tok_vocab) {
        loom_sbuf_append(&r->text, REPLACEMENT_CHAR, 3); /* an id the tokenizer does not have */
    } else {
        char *s = NULL;
        size_t len = 0;
        loom_err err = {{0}};
        if (loom_tokenizer_decode_ex(e->tok, &t, 1, LOOM_TOK_CONTINUE, &s, &len, &err)) /* continues the prompt */
            loom_sbuf_append(&r->text, REPLACEMENT_CHAR, 3);
        else
            loom_sbuf_append(&r->text, s, len);
        free(s);
    }
    if (r->p.n_stop == 0) return 0;
    /* the earliest occurrence that the new bytes complete */
    const size_t from = before > r->max_stop ? before - r->max_stop + 1 : 0;
    size_t best = (size_t)-1;
    for (int i = 0; i < r->p.n_stop; i++) {
        const char *hit = memmem(r->text.p + from, r->text.len - from, r->stop[i], strlen(r->stop[i]));
        if (hit && (size_t)(hit - r->text.p) < best) best = (size_t)(hit - r->text.p);
    }
    if (best == (size_t)-1) return 0;
    if (best < r->emitted) best = r->emitted; /* never happens: the held-back tail covers it */
    r->text.len = best;
    r->text.p[best] = 0;
    return 1;
}

/* how much of the text is final: not an incomplete UTF-8 tail, not a possible stop prefix */
static size_t safe_len(const req *r) {
    size_t safe = r->text.len - utf8_incomplete_tail(r->text.p, r->text.len);
    for (int i = 0; i < r->p.n_stop; i++) {
        const size_t l = strlen(r->stop[i]);
        for (size_t k = l - 1; k >= 1; k--) { /* longest proper prefix of stop at the end */
            if (k <= r->text.len && !memcmp(r->text.p + r->text.len - k, r->stop[i], k)) {
                if (r->text.len - k < safe) safe = r->text.len - k;
                break;
            }
        }
    }
    return safe < r->emitted ? r->emitted : safe;
}

/* logits with the tokens r's grammar does not allow next at -inf (into e->masked); NULL when
 * none is allowed (never, given the tokens of one byte that submit checks) */
static const float *grammar_mask(loom_engine *e, req *r, const float *logits) {
    const double t0 = loom_now();
    const int n = loom_grammar_mask(r->gs, e->gvocab, r->budget - r->n_gen, e->allow, e->gscratch);
    for (int i = 0; i < e->V; i++) e->masked[i] = e->allow[i] ? logits[i] : -INFINITY;
    e->st.masked_tokens++;
    e->st.mask_seconds += loom_now() - t0;
    return n > 0 ? e->masked : NULL;
}

/* log softmax(logits)[t] in double (what the training forward's cross-entropy gives) */
static float token_logprob(const float *logits, int V, int32_t t) {
    float mx = logits[0];
    for (int i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)logits[i] - (double)mx);
    return (float)((double)logits[t] - (double)mx - log(s));
}

static void on_token(loom_engine *e, req *r, const float *logits) {
    const float *raw = logits;
    if (r->gs && !(logits = grammar_mask(e, r, logits))) {
        finish(e, r, LOOM_FINISH_LENGTH, -1);
        return;
    }
    const int32_t t = loom_sample_params(&r->p, &r->rng, logits, e->V, r->toks,
                                         r->n_prompt + r->n_gen, e->sample_scratch);
    e->st.generated_tokens++;
    if (t == e->eos && (!r->p.ignore_eos || r->gs)) {
        finish(e, r, LOOM_FINISH_STOP, t);
        return;
    }
    if (r->lp) r->lp[r->n_gen] = token_logprob(raw, e->V, t);
    r->toks[r->n_prompt + r->n_gen++] = t;
    if (r->gs) { /* the mask allowed it: its bytes continue the document */
        size_t len;
        const char *b = loom_grammar_vocab_token(e->gvocab, t, &len);
        LOOM_CHECK(loom_grammar_state_advance(r->gs, b, len) == 0);
    }
    if (add_text(e, r, t) || (r->gs && loom_grammar_state_terminal(r->gs))) {
        finish(e, r, LOOM_FINISH_STOP, t);
        return;
    }
    /* the next step would feed position n_prompt + n_gen - 1 */
    if (r->n_gen >= r->p.max_tokens || r->n_prompt + r->n_gen - 1 >= r->cap) {
        finish(e, r, LOOM_FINISH_LENGTH, t);
        return;
    }
    if (r->cb) {
        const size_t safe = e->tok ? safe_len(r) : r->emitted;
        r->cb(r->ctx, r->id, t, r->text.p ? r->text.p + r->emitted : "", safe - r->emitted, 0);
        r->emitted = safe;
    }
}

static void ensure_ws(loom_engine *e, int rows) {
    if (e->ws && rows <= e->ws_rows) return;
    int want = 16;
    while (want < rows) want *= 2;
    if (want > e->o.max_step_tokens) want = e->o.max_step_tokens;
    loom_decode_ws_free(e->ws);
    e->ws = loom_decode_ws_create(e->m, want, e->o.max_batch);
    e->ws_rows = want;
}

int loom_engine_step(loom_engine *e) {
    /* (1) leave and join */
    for (int i = 0; i < e->n; i++) {
        req *r = e->reqs[i];
        if (r->state == R_WAITING && r->p.max_tokens == 0) finish(e, r, LOOM_FINISH_LENGTH, -1);
    }
    for (int i = 0; i < e->n; i++) {
        req *r = e->reqs[i];
        if (r->state != R_WAITING) continue;
        if (e->st.running >= e->o.max_batch || e->st.kv_used + r->bytes > e->o.kv_budget_bytes)
            break;
        /* (the cache gives way: its blocks are evicted until the reservation fits) */
        if (!pool_fits(e, r->bytes, UINT64_MAX)) break;
        const size_t n = loom_model_kv_floats(e->m, r->cap) * sizeof(float);
        r->k = e->be->mem_alloc(n, 0);
        r->v = e->be->mem_alloc(n, 0);
        if (e->o.prefix_cache) pc_take(e, r);
        r->state = R_RUNNING;
        e->st.waiting--;
        e->st.running++;
        e->st.kv_used += r->bytes;
        if (e->st.kv_used > e->st.kv_peak) e->st.kv_peak = e->st.kv_used;
        if (e->st.running > e->st.max_running) e->st.max_running = e->st.running;
    }
    /* (2) the step's rows: decode rows first, then prefill chunks */
    int nseg = 0, rows = 0;
    const int budget = e->o.max_step_tokens;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < e->n && nseg < e->o.max_batch; i++) {
            req *r = e->reqs[i];
            if (r->state != R_RUNNING) continue;
            const int decoding = r->fed >= r->n_prompt;
            if (decoding != (pass == 0)) continue;
            int take = decoding ? 1 : r->n_prompt - r->fed;
            if (take > budget - rows) take = budget - rows;
            if (take <= 0) continue;
            memcpy(e->rows_tok + rows, r->toks + r->fed, (size_t)take * sizeof(int32_t));
            e->segs[nseg] = (loom_decode_seg){.k = r->k, .v = r->v, .cap = r->cap,
                                              .pos0 = r->fed, .n = take,
                                              .want_logits = r->fed + take >= r->n_prompt};
            e->seg_req[nseg++] = r;
            rows += take;
            if (!decoding) e->st.prompt_tokens += take;
        }
    }
    if (nseg > 0) {
        ensure_ws(e, rows);
        const float *logits = loom_model_decode_batch(e->m, e->ws, e->rows_tok, e->segs, nseg);
        e->st.steps++;
        int k = 0;
        for (int s = 0; s < nseg; s++) {
            req *r = e->seg_req[s];
            r->fed += e->segs[s].n;
            if (e->o.prefix_cache && r->blocks_in < r->n_prompt / PBLOCK) pc_put(e, r);
            if (!e->segs[s].want_logits) continue;
            on_token(e, r, logits + (size_t)k * (size_t)e->V);
            k++;
        }
    }
    return e->st.running + e->st.waiting;
}

int loom_engine_pending(const loom_engine *e) { return e->st.running + e->st.waiting; }

int loom_engine_result(const loom_engine *e, int64_t id, const int32_t **tokens, int *n,
                       const char **text, size_t *len, int *fin) {
    const req *r = find(e, id);
    if (!r || r->state != R_DONE) return -1;
    if (tokens) *tokens = r->toks + r->n_prompt;
    if (n) *n = r->n_gen;
    if (text) *text = r->text.p ? r->text.p : "";
    if (len) *len = r->text.len;
    if (fin) *fin = r->finish;
    return 0;
}

const float *loom_engine_logprobs(const loom_engine *e, int64_t id) {
    const req *r = find(e, id);
    return r && r->state == R_DONE ? r->lp : NULL;
}

void loom_engine_release(loom_engine *e, int64_t id) {
    req *r = find(e, id);
    if (!r) return;
    release_cache(e, r);
    int i = 0;
    while (e->reqs[i] != r) i++;
    memmove(e->reqs + i, e->reqs + i + 1, (size_t)(e->n - i - 1) * sizeof *e->reqs);
    e->n--;
    req_free(e, r);
}

void loom_engine_cancel(loom_engine *e, int64_t id) {
    req *r = find(e, id);
    if (!r || r->state == R_DONE) return;
    release_cache(e, r);
    r->state = R_DONE;
    r->finish = LOOM_FINISH_STOP;
}

void loom_engine_get_stats(const loom_engine *e, loom_engine_stats *s) { *s = e->st; }

int loom_engine_cached_tokens(const loom_engine *e, int64_t id) {
    const req *r = find(e, id);
    return r ? r->cached : 0;
}

char *loom_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    char *o = loom_malloc(3 * n + 1);
    size_t k = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const unsigned char c = u[i];
        size_t len = 0;
        uint32_t cp = 0, min = 0;
        if (c >= 0x01 && c < 0x80) len = 1, cp = c;
        else if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        int ok = len > 0 && i + len <= n;
        for (size_t j = 1; ok && j < len; j++) {
            if ((u[i + j] & 0xC0) != 0x80) ok = 0;
            else cp = (cp << 6) | (u[i + j] & 0x3F);
        }
        if (ok && len > 1 && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = 0;
        if (!ok) {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
            continue;
        }
        memcpy(o + k, s + i, len);
        k += len;
        i += len;
    }
    o[k] = 0;
    *out_len = k;
    return o;
}
