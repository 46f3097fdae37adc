/* loom synth: spreading over MPI ranks.
 * Every rank holds every item. A round's pending items (the same list on every rank) are cut
 * into blocks of generator.batch in item order; block b belongs to replica b % (world / tp)
 * (with --tp, a replica is tp consecutive ranks; else each rank), which generates (a local
 * block is one engine batch of its own, so its batch, and with it every float, is the same
 * whatever the number of ranks; a replica's tp ranks step that batch together) and validates
 * it (its tp rank 0). The ranks then exchange their items' outcomes (allgather), and every
 * rank runs the order-dependent checks (duplicates) over all items in item order, so all ranks
 * agree; rank 0 writes. */
#define _GNU_SOURCE
#include "synth/synth_internal.h"


static void put_u32(loom_sbuf *b, uint32_t v) { loom_sbuf_append(b, (const char *)&v, 4); }
static void put_bytes(loom_sbuf *b, const char *s, size_t n) {
    put_u32(b, (uint32_t)n);
    if (n) loom_sbuf_append(b, s, n);
}

typedef struct rdr {
    const char *p;
    size_t n, at;
} rdr;
static uint32_t get_u32(rdr *r) {
    uint32_t v;
    LOOM_CHECK(r->at + 4 <= r->n);
    memcpy(&v, r->p + r->at, 4);
    r->at += 4;
    return v;
}
static const char *get_bytes(rdr *r, size_t *n) {
    *n = get_u32(r);
    LOOM_CHECK(r->at + *n <= r->n);
    const char *s = r->p + r->at;
    r->at += *n;
    return s;
}

/* the replica (of `replicas`) that owns pending item k */
int synth_owner_of(const pipeline *P, int k, int replicas) { return (k / P->g.batch) % replicas; }

/* an item's position in the round's pending list (items are pending in item order) */
int synth_pend_pos(item **pend, int np, const item *it) {
    int lo = 0, hi = np - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (pend[mid] < it) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* one item's outcome (after generation and the per-item validators) */
static void pack_item(loom_sbuf *b, uint32_t k, const item *it) {
    put_u32(b, k);
    put_u32(b, (uint32_t)it->tokens);
    put_u32(b, (uint32_t)it->gen_ok);
    put_u32(b, (uint32_t)(it->failed_validator + 1));
    put_bytes(b, it->text, it->text ? it->tlen : 0);
    put_bytes(b, it->gen_err, strlen(it->gen_err));
    put_bytes(b, it->vmsg, strlen(it->vmsg));
    char *res = json_dumps(it->results, JSON_COMPACT);
    put_bytes(b, res, strlen(res));
    free(res);
    put_u32(b, (uint32_t)it->gen_hit);
    put_bytes(b, it->gkey, strlen(it->gkey));
    res = it->vfresh ? json_dumps(it->vfresh, JSON_COMPACT) : NULL;
    put_bytes(b, res, res ? strlen(res) : 0);
    free(res);
    put_u32(b, (uint32_t)it->val_hits);
    put_u32(b, (uint32_t)it->val_runs);
}

static void unpack_item(rdr *r, item **pend, int np) {
    const uint32_t k = get_u32(r);
    LOOM_CHECK(k < (uint32_t)np);
    item *it = pend[k];
    it->tokens = (int)get_u32(r);
    it->gen_ok = (int)get_u32(r);
    it->failed_validator = (int)get_u32(r) - 1;
    size_t n;
    const char *s = get_bytes(r, &n);
    free(it->text);
    it->text = loom_malloc(n + 1);
    if (n) memcpy(it->text, s, n);
    it->text[n] = 0;
    it->tlen = n;
    s = get_bytes(r, &n);
    snprintf(it->gen_err, sizeof it->gen_err, "%.*s", (int)n, s);
    s = get_bytes(r, &n);
    snprintf(it->vmsg, sizeof it->vmsg, "%.*s", (int)n, s);
    s = get_bytes(r, &n);
    json_decref(it->results);
    it->results = json_loadb(s, n, 0, NULL);
    LOOM_CHECK(it->results != NULL);
    it->gen_hit = (int)get_u32(r);
    s = get_bytes(r, &n);
    snprintf(it->gkey, sizeof it->gkey, "%.*s", (int)n, s);
    s = get_bytes(r, &n);
    json_decref(it->vfresh);
    it->vfresh = n ? json_loadb(s, n, 0, NULL) : NULL;
    it->val_hits = (int)get_u32(r);
    it->val_runs = (int)get_u32(r);
}

/* every rank's items to every rank (mesh: NULL with one rank); a replica's tp rank 0 sends
 * its items */
void synth_exchange_items(loom_mesh *mesh, int rank, int world, int tp, item **pend, int np,
                           const pipeline *P) {
    loom_sbuf b = {0};
    for (int k = 0; k < np; k++)
        if (rank % tp == 0 && synth_owner_of(P, k, world / tp) == rank / tp)
            pack_item(&b, (uint32_t)k, pend[k]);
    int64_t mine = (int64_t)b.len, longest = 0;
    int64_t *lens = loom_calloc((size_t)world, sizeof *lens);
    loom_allgather(mesh, LOOM_GROUP_WORLD, &mine, lens, (size_t)world, LOOM_I64);
    for (int r = 0; r < world; r++) longest = lens[r] > longest ? lens[r] : longest;
    char *send = loom_calloc((size_t)longest + 1, 1);
    char *all = loom_malloc((size_t)world * ((size_t)longest + 1));
    if (b.len) memcpy(send, b.p, b.len);
    loom_allgather(mesh, LOOM_GROUP_WORLD, send, all, (size_t)world * ((size_t)longest + 1), LOOM_U8);
    for (int r = 0; r < world; r++) {
        if (r == rank) continue;
        rdr rd = {all + (size_t)r * ((size_t)longest + 1), (size_t)lens[r], 0};
        while (rd.at < rd.n) unpack_item(&rd, pend, np);
    }
    free(send);
    free(all);
    free(lens);
    free(b.p);
}
