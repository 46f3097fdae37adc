/* Pipeline parallelism: micro-batches through the stages in the gpipe or 1f1b order, the
 * stream and its gradient sent between neighbour stages at the model's stage points, the tied
 * embedding's two copies kept equal. See include/loom/pp.h and docs/parallelism.md. The math
 * stays in the model (a stage view runs its layers); this file says what runs when and what
 * travels between stages. */
#include "loom/pp.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/backend.h"

/* p2p tags: the micro-batch's index (mod TAG_MOD), forward activations and backward gradients
 * apart, and the tied embedding's exchange */
enum { TAG_MOD = 8192, TAG_FWD = 0, TAG_BWD = TAG_MOD, TAG_TIED = 2 * TAG_MOD };

typedef struct arena {
    loom_acts *acts;
    loom_comm_req *fsend, *bsend; /* the stream sent on (from the arena), its gradient sent back */
    int busy;                     /* a micro-batch's activations live here */
} arena;

/* a receive posted ahead into a staging buffer */
typedef struct inbox {
    float *buf;
    loom_comm_req *req;
    int next;                     /* the micro-batch whose message is posted (or next to post) */
} inbox;

struct loom_pp {
    loom_model *m;
    const loom_backend *be;       /* the model's: the stream buffers are its device memory */
    float *h_logits;              /* classify, last stage: (mB, K) logits read back */
    loom_mesh *mesh;
    loom_dp *dp;
    loom_comm_points inner;
    int has_inner;
    int stage, P, M, schedule, mB, T, C;
    int first, last, tied, classify;
    size_t stream;                /* elements of one micro-batch's stream: mB * T * C */
    loom_dtype fwd_dt;            /* the stream's: bf16 with training.precision bf16 (its
                                   * gradient is fp32 either way) */

    arena *ar;
    int n_ar, busy_now, peak_busy;
    int *slot;                    /* (M) the arena of each micro-batch */
    inbox in_act, in_grad;
    int cur, cur_slot;            /* the micro-batch running and its arena */
    int run_train, run_M;

    double bubble_s, send_wait_s, run_s;
    int64_t runs;                 /* training batches run */
    int64_t fail_run;             /* test hook: fail inside this training batch, -1 none */
    char fail_mode[16];
    const loom_tensor_info *wte;  /* the tied copy this stage holds, or NULL */
    float *tied_buf, *tied_peer;  /* (V*C) */
};

void loom_pp_stage_layers(int n_layer, int stages, int stage, int *l0, int *l1) {
    LOOM_CHECK(stages > 0 && n_layer % stages == 0 && stage >= 0 && stage < stages);
    *l0 = stage * (n_layer / stages);
    *l1 = *l0 + n_layer / stages;
}

int loom_pp_schedule_from_name(const char *name) {
    if (!strcmp(name, "gpipe")) return LOOM_PP_GPIPE;
    if (!strcmp(name, "1f1b")) return LOOM_PP_1F1B;
    return -1;
}

const char *loom_pp_schedule_name(int schedule) {
    return schedule == LOOM_PP_GPIPE ? "gpipe" : schedule == LOOM_PP_1F1B ? "1f1b" : "?";
}

/* ---- receives ---------------------------------------------------------------------------- */

/* the element type of what travels with tag_base: the stream forward, its gradient back */
static loom_dtype dt_of(const loom_pp *p, int tag_base) {
    return tag_base == TAG_FWD ? p->fwd_dt : LOOM_F32;
}

static void post(loom_pp *p, inbox *b, int peer, int tag_base) {
    if (b->req || b->next >= p->run_M) return;
    b->req = loom_irecv(p->mesh, LOOM_GROUP_PP, b->buf, p->stream, dt_of(p, tag_base), peer,
                        tag_base + b->next % TAG_MOD);
}

/* waits for micro-batch p->cur's message (the bubble), copies it into buf, posts the next */
static void take(loom_pp *p, inbox *b, int peer, int tag_base, float *buf, const char *what) {
    LOOM_CHECK(b->req && b->next == p->cur);
    char msg[160];
    snprintf(msg, sizeof msg, "pipeline %s of micro-batch %d on stage %d (from stage %d, world "
             "rank %d)", what, p->cur, p->stage, peer,
             loom_mesh_group_world_rank(p->mesh, LOOM_GROUP_PP, peer));
    const double t0 = loom_now();
    loom_comm_waitall(1, &b->req, msg);
    p->bubble_s += loom_now() - t0;
    b->req = NULL;
    p->be->mem_d2d(buf, b->buf, p->stream * loom_dtype_size(dt_of(p, tag_base)));
    b->next++;
    post(p, b, peer, tag_base);
}

/* ---- test-only fault injection --------------------------------------------------------------
 * LOOM_TEST_PP_FAIL="RANK:BATCH:kill" makes world rank RANK SIGKILL itself inside its BATCH-th
 * training batch (1-based), at the point where it would send its first input gradient back
 * (a neighbour is then waiting in a pipeline receive); "RANK:BATCH:hang" makes it wait there
 * forever. tests/mpi/test_pp_errors.sh checks that the job ends, naming the rank. */
static void read_fail_hook(loom_pp *p) {
    p->fail_run = -1;
    const char *f = getenv("LOOM_TEST_PP_FAIL");
    long r;
    long long b;
    char mode[16];
    if (!f || sscanf(f, "%ld:%lld:%15s", &r, &b, mode) != 3) return;
    if (r != loom_mesh_rank(p->mesh, LOOM_GROUP_WORLD)) return;
    p->fail_run = b;
    snprintf(p->fail_mode, sizeof p->fail_mode, "%s", mode);
}

static void fail_hook(loom_pp *p) {
    if (!p->run_train || p->runs != p->fail_run) return;
    fprintf(stderr, "loom: rank %d: LOOM_TEST_PP_FAIL: %s inside pipeline batch %lld\n",
            loom_mesh_rank(p->mesh, LOOM_GROUP_WORLD), p->fail_mode, (long long)p->runs);
    fflush(stderr);
    if (!strcmp(p->fail_mode, "kill")) raise(SIGKILL);
    if (!strcmp(p->fail_mode, "hang"))
        for (;;) pause(); /* until the job is ended */
}

/* ---- the model's stage points -------------------------------------------------------------- */

static void point(void *ctx, int pt, int dir, int layer, int site, float *buf, int64_t n) {
    loom_pp *p = ctx;
    const int stage_pt = pt == LOOM_CP_STAGE_IN || pt == LOOM_CP_STAGE_OUT;
    /* what arrives is in place before the inner strategy sees it; what leaves, after */
    if (stage_pt) LOOM_CHECK((size_t)n == p->stream && p->cur_slot >= 0);
    if (pt == LOOM_CP_STAGE_IN && dir == 0 && !p->first)
        take(p, &p->in_act, p->stage - 1, TAG_FWD, buf, "receive of the stream");
    if (pt == LOOM_CP_STAGE_OUT && dir == 1 && !p->last)
        take(p, &p->in_grad, p->stage + 1, TAG_BWD, buf, "receive of the gradient");
    if (p->has_inner) p->inner.fn(p->inner.ctx, pt, dir, layer, site, buf, n);
    arena *a = stage_pt ? &p->ar[p->cur_slot] : NULL;
    if (pt == LOOM_CP_STAGE_OUT && dir == 0 && !p->last) {
        /* buf is the last layer's output in the arena: untouched until the backward */
        LOOM_CHECK(a->fsend == NULL);
        a->fsend = loom_isend(p->mesh, LOOM_GROUP_PP, buf, p->stream, p->fwd_dt, p->stage + 1,
                              TAG_FWD + p->cur % TAG_MOD);
    }
    if (pt == LOOM_CP_STAGE_IN && dir == 1 && !p->first) {
        fail_hook(p);
        /* buf is the arena's gradient scratch: untouched until the arena's next backward */
        LOOM_CHECK(a->bsend == NULL);
        a->bsend = loom_isend(p->mesh, LOOM_GROUP_PP, buf, p->stream, LOOM_F32, p->stage - 1,
                              TAG_BWD + p->cur % TAG_MOD);
    }
}

/* ---- activation arenas ------------------------------------------------------------------- */

static void wait_send(loom_pp *p, loom_comm_req **r, const char *what) {
    if (!*r) return;
    char msg[96];
    snprintf(msg, sizeof msg, "pipeline send of the %s on stage %d", what, p->stage);
    const double t0 = loom_now();
    loom_comm_waitall(1, r, msg);
    p->send_wait_s += loom_now() - t0;
    *r = NULL;
}

static int sends_done(arena *a) {
    if (a->fsend && loom_comm_test(a->fsend)) a->fsend = NULL;
    if (a->bsend && loom_comm_test(a->bsend)) a->bsend = NULL;
    return !a->fsend && !a->bsend;
}

/* a free arena: one whose sends have completed, else one whose sends are waited for, else a new
 * one (so the stage holds as many as its schedule keeps busy at once, no more) */
static int get_arena(loom_pp *p) {
    int pick = -1;
    for (int i = 0; i < p->n_ar && pick < 0; i++)
        if (!p->ar[i].busy && sends_done(&p->ar[i])) pick = i;
    for (int i = 0; i < p->n_ar && pick < 0; i++)
        if (!p->ar[i].busy) {
            wait_send(p, &p->ar[i].fsend, "stream");
            wait_send(p, &p->ar[i].bsend, "gradient");
            pick = i;
        }
    if (pick < 0) {
        p->ar = loom_realloc(p->ar, (size_t)(p->n_ar + 1) * sizeof *p->ar);
        p->ar[p->n_ar] = (arena){.acts = loom_acts_create(p->m, p->mB, p->T, 1)};
        pick = p->n_ar++;
    }
    p->ar[pick].busy = 1;
    if (++p->busy_now > p->peak_busy) p->peak_busy = p->busy_now;
    return pick;
}

static void put_arena(loom_pp *p, int i) {
    LOOM_CHECK(p->ar[i].busy);
    p->ar[i].busy = 0;
    p->busy_now--;
}

/* ---- create -------------------------------------------------------------------------------- */

static int is_tied_copy(void *ctx, const loom_tensor_info *t) {
    const loom_pp *p = ctx;
    return p->wte && t == p->wte && !p->first; /* stage 0's wte counts; the head's is its copy */
}

/* after the dp reductions: both copies of the tied wte get the sum of the two stages' gradients */
static void sync_tied(void *ctx, loom_dp *dp) {
    loom_pp *p = ctx;
    if (!p->wte) return;
    const size_t n = p->wte->numel;
    size_t begin, count;
    float *own = loom_dp_owned_grad(dp, p->wte, &begin, &count);
    /* this stage's whole dp-reduced gradient: each dp rank adds the part it owns */
    p->be->mem_set(p->tied_buf, 0, n * sizeof(float));
    if (own) p->be->mem_d2d(p->tied_buf + begin, own, count * sizeof(float));
    loom_allreduce_sum(p->mesh, LOOM_GROUP_DP, p->tied_buf, n, LOOM_F32);
    const int peer = p->first ? p->P - 1 : 0;
    loom_comm_req *r[2] = {
        loom_irecv(p->mesh, LOOM_GROUP_PP, p->tied_peer, n, LOOM_F32, peer, TAG_TIED),
        loom_isend(p->mesh, LOOM_GROUP_PP, p->tied_buf, n, LOOM_F32, peer, TAG_TIED)};
    char msg[160];
    snprintf(msg, sizeof msg, "pipeline exchange of the tied wte gradient (stage %d with stage "
             "%d, world rank %d)", p->stage, peer,
             loom_mesh_group_world_rank(p->mesh, LOOM_GROUP_PP, peer));
    loom_comm_waitall(2, r, msg);
    /* a + b on both stages (addition commutes bit for bit): the copies stay identical */
    if (own)
        p->be->residual_forward(own, p->tied_buf + begin, p->tied_peer + begin, (int64_t)count);
}

int loom_pp_create(loom_model *m, loom_mesh *mesh, loom_dp *dp, const loom_comm_points *inner,
                   int schedule, int microbatches, int micro_B, int T, loom_pp **out,
                   loom_err *err) {
    *out = NULL;
    if (schedule != LOOM_PP_GPIPE && schedule != LOOM_PP_1F1B)
        return loom_errf(err, "parallel.pp_schedule: unknown schedule %d", schedule);
    if (microbatches < 1 || micro_B < 1 || T < 1)
        return loom_errf(err, "parallel.microbatches = %d with %d rows each: both must be "
                              "positive", microbatches, micro_B);
    const loom_model_config *c = loom_model_get_config(m);
    const loom_model_layout *lay = loom_model_get_layout(m);
    const int stage = loom_mesh_rank(mesh, LOOM_GROUP_PP), P = loom_mesh_size(mesh, LOOM_GROUP_PP);
    int l0, l1;
    loom_pp_stage_layers(c->n_layer, P, stage, &l0, &l1);
    if (lay->l0 != l0 || lay->l1 != l1)
        return loom_errf(err, "pipeline stage %d of %d holds layers [%d, %d), its model view "
                              "[%d, %d)", stage, P, l0, l1, lay->l0, lay->l1);
    loom_pp *p = loom_calloc(1, sizeof *p);
    p->m = m;
    p->mesh = mesh;
    p->dp = dp;
    p->stage = stage;
    p->P = P;
    p->M = microbatches;
    p->schedule = schedule;
    p->mB = micro_B;
    p->T = T;
    p->C = c->d_model;
    p->first = p->stage == 0;
    p->last = p->stage == p->P - 1;
    p->classify = c->head == LOOM_HEAD_CLASSIFY;
    p->tied = c->arch.tied && !p->classify && p->P > 1;
    /* the stream at the stage points: this view's sequence shard under sequence parallelism */
    p->stream = (size_t)micro_B * (size_t)T * (size_t)p->C / (size_t)(lay->sp ? lay->tp : 1);
    p->fwd_dt = lay->precision == LOOM_PREC_BF16 ? LOOM_BF16 : LOOM_F32;
    p->slot = loom_calloc((size_t)p->M, sizeof(int));
    p->cur_slot = -1;
    const loom_backend *be = p->be = loom_model_backend(m);
    if (!p->first) p->in_act.buf = be->mem_alloc(p->stream * loom_dtype_size(p->fwd_dt), 0);
    if (!p->last) p->in_grad.buf = be->mem_alloc(p->stream * sizeof(float), 0);
    if (p->last && p->classify) /* the logits read back (accuracy) */
        p->h_logits = loom_malloc((size_t)micro_B * (size_t)c->num_classes * sizeof(float));
    if (inner && inner->fn) {
        p->inner = *inner;
        p->has_inner = 1;
    }
    if (p->tied && (p->first || p->last)) {
        p->wte = loom_model_global(m, LOOM_P_WTE);
        LOOM_CHECK(p->wte != NULL);
        p->tied_buf = be->mem_alloc(p->wte->numel * sizeof(float), 0);
        p->tied_peer = be->mem_alloc(p->wte->numel * sizeof(float), 0);
    }
    read_fail_hook(p);
    const loom_comm_points cp = {.ctx = p, .fn = point};
    loom_model_set_comm_points(m, &cp);
    if (p->P > 1) {
        loom_dp_set_grad_sync(dp, sync_tied, p);
        loom_dp_set_copies(dp, LOOM_GROUP_PP, is_tied_copy, p);
    }
    *out = p;
    return 0;
}

void loom_pp_free(loom_pp *p) {
    if (!p) return;
    for (int i = 0; i < p->n_ar; i++) {
        wait_send(p, &p->ar[i].fsend, "stream");
        wait_send(p, &p->ar[i].bsend, "gradient");
        loom_acts_free(p->ar[i].acts);
    }
    free(p->ar);
    free(p->slot);
    p->be->mem_free(p->in_act.buf);
    p->be->mem_free(p->in_grad.buf);
    p->be->mem_free(p->tied_buf);
    p->be->mem_free(p->tied_peer);
    free(p->h_logits);
    free(p);
}

/* ---- the schedule -------------------------------------------------------------------------- */

typedef struct run_ctx {
    const int32_t *inputs, *targets;
    int train, first_batch, last_batch;
    float dscale;
    loom_pp_result *res;
    int backwards_done;
} run_ctx;

static void forward(loom_pp *p, run_ctx *r, int i) {
    const int64_t rows = (int64_t)i * p->mB;
    const int32_t *x = r->inputs + rows * p->T;
    const int32_t *y = r->targets + (p->classify ? rows : rows * p->T);
    const int s = get_arena(p);
    p->slot[i] = s;
    p->cur = i;
    p->cur_slot = s;
    loom_acts *a = p->ar[s].acts;
    const float loss = loom_model_forward_acts(p->m, a, x, y, p->mB, p->T);
    if (p->last) { /* the loss is the last stage's */
        const int64_t ny = p->classify ? p->mB : (int64_t)p->mB * p->T;
        const int K = p->classify ? loom_model_get_config(p->m)->num_classes : 0;
        float *lg = p->h_logits;
        if (p->classify) loom_acts_read_logits(p->m, a, lg, 0, (size_t)p->mB * (size_t)K);
        int64_t valid = 0;
        for (int64_t k = 0; k < ny; k++) {
            if (y[k] < 0) continue;
            valid++;
            if (p->classify) {
                int best = 0;
                for (int j = 1; j < K; j++)
                    if (lg[k * K + j] > lg[k * K + best]) best = j;
                if (best == y[k]) r->res->correct++;
            }
        }
        r->res->loss_sum += (double)loss * (double)valid;
        r->res->valid += valid;
    }
    p->cur_slot = -1;
    if (!r->train) put_arena(p, s);
}

static void backward(loom_pp *p, run_ctx *r, int i) {
    const int s = p->slot[i];
    p->cur = i;
    p->cur_slot = s;
    loom_dp_begin_micro(p->dp, r->first_batch && r->backwards_done == 0,
                        r->last_batch && r->backwards_done == p->M - 1);
    loom_model_backward_acts(p->m, p->ar[s].acts, r->dscale);
    r->backwards_done++;
    p->cur_slot = -1;
    put_arena(p, s);
}

void loom_pp_run(loom_pp *p, const int32_t *inputs, const int32_t *targets, int train,
                 float dscale, int first_batch, int last_batch, loom_pp_result *res) {
    memset(res, 0, sizeof *res);
    const double t_run = loom_now();
    run_ctx r = {inputs, targets, train, first_batch, last_batch, dscale, res, 0};
    p->run_M = p->M;
    p->run_train = train;
    if (train) p->runs++;
    p->in_act.next = p->in_grad.next = 0;
    if (!p->first) post(p, &p->in_act, p->stage - 1, TAG_FWD);
    if (train && !p->last) post(p, &p->in_grad, p->stage + 1, TAG_BWD);
    const int M = p->M;
    if (!train) {
        for (int i = 0; i < M; i++) forward(p, &r, i);
    } else if (p->schedule == LOOM_PP_GPIPE) {
        for (int i = 0; i < M; i++) forward(p, &r, i);
        for (int i = 0; i < M; i++) backward(p, &r, i);
    } else { /* 1f1b: warm-up forwards, then one forward / one backward, then the rest */
        const int warm = p->P - p->stage - 1 < M ? p->P - p->stage - 1 : M;
        for (int i = 0; i < warm; i++) forward(p, &r, i);
        for (int i = 0; i + warm < M; i++) {
            forward(p, &r, i + warm);
            backward(p, &r, i);
        }
        for (int i = M - warm; i < M; i++) backward(p, &r, i);
    }
    LOOM_CHECK(p->busy_now == 0 && !p->in_act.req && !p->in_grad.req);
    /* the sends complete before the caller touches parameters (the update) or a later run
     * reuses the arenas: a stage never reads a buffer a neighbour has not received */
    for (int i = 0; i < p->n_ar; i++) {
        wait_send(p, &p->ar[i].fsend, "stream");
        wait_send(p, &p->ar[i].bsend, "gradient");
    }
    if (train) p->run_s += loom_now() - t_run;
}

/* ---- stats ---------------------------------------------------------------------------------- */

int loom_pp_stage(const loom_pp *p) { return p->stage; }
int loom_pp_stages(const loom_pp *p) { return p->P; }
double loom_pp_bubble_seconds(const loom_pp *p) { return p->bubble_s; }
double loom_pp_send_wait_seconds(const loom_pp *p) { return p->send_wait_s; }
double loom_pp_run_seconds(const loom_pp *p) { return p->run_s; }
void loom_pp_stats_reset(loom_pp *p) { p->bubble_s = p->send_wait_s = p->run_s = 0; }
int loom_pp_peak_arenas(const loom_pp *p) { return p->peak_busy; }

size_t loom_pp_activation_bytes(const loom_pp *p) {
    size_t b = 0;
    for (int i = 0; i < p->n_ar; i++) b += loom_acts_bytes(p->ar[i].acts);
    return b;
}

static uint64_t fnv(const loom_backend *be, const float *x, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    enum { PIECE = 4096 };
    float buf[PIECE];
    for (size_t at = 0; at < n; at += PIECE) {
        const size_t k = n - at < PIECE ? n - at : PIECE;
        loom_dev_read(be, buf, x + at, k * sizeof(float), "tied wte hash");
        const unsigned char *b = (const unsigned char *)buf;
        for (size_t i = 0; i < k * sizeof(float); i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    }
    return h;
}

int loom_pp_tied_in_sync(loom_pp *p) {
    /* stage 0 and stage p - 1 put their copy's hash in slots 0 and 1; the others zeros */
    int64_t h[2] = {0, 0};
    if (p->wte) {
        int n = 0;
        loom_dp_piece *pc = loom_dp_needed(p->dp, &n);
        for (int k = 0; k < n; k++)
            if (pc[k].kind == 0 && pc[k].tensor == p->wte && pc[k].count == p->wte->numel)
                h[p->first ? 0 : 1] = (int64_t)(fnv(p->be, pc[k].data, pc[k].count) >> 1) | 1;
        free(pc);
    }
    loom_allreduce_sum(p->mesh, LOOM_GROUP_PP, h, 2, LOOM_I64);
    return h[0] == 0 || h[1] == 0 || h[0] == h[1];
}
