/* Data parallelism with ZeRO-0/1/2/3 over the model's units. See include/loom/parallel.h.
 * Communication goes through the checked collectives of src/comm; the optimizer (AdamW,
 * clipping's factor) is src/parallel/optim.c; the math goes through the backend table. */
#include "loom/parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/optim.h"

enum { B_EMB = 0, B_FIN = 1, B_L0 = 2, B_L1 = 3, N_BUCKETS = 4 };

/* A unit is one or two segments: its dense part, reduced and sharded over the dp group, and
 * (an MoE layer of an expert-parallel view) its routed experts, the last tensors of the unit,
 * reduced and sharded over the expert-data group (the ranks holding the same experts). */
enum { MAX_SEG = 2 };

struct loom_dp {
    loom_model *m;
    const loom_backend *be; /* the model's: every buffer below is its device memory */
    loom_mesh *mesh;
    loom_group group;      /* where gradients are reduced and state sharded: dp, or dp x cp
                            * with context parallelism (the cp ranks hold partial sums of one
                            * sequence's gradients) */
    int zero, rank, size;
    int U;
    size_t n;              /* parameters in the model */
    float *kv_full;        /* a whole k_w / v_w (KVH*D, C) when kv heads are replicated over tp
                            * ranks (n_kv_head < tp): where their partial gradients are summed */
    size_t *uoff, *ucnt;   /* (U) unit ranges in the arena */
    int nseg;              /* segments in all */
    int *useg, *unseg;     /* (U) first segment of unit u, and how many */
    int *sgroup;           /* (nseg) dp->group (dense) or LOOM_GROUP_EDP (routed experts) */
    int *sunit;            /* (nseg) unit of the segment */
    size_t *goff, *gcnt;   /* (nseg) segment ranges in the arena */
    size_t *soff, *slen;   /* (nseg) this rank's slice of each segment, relative to it */
    size_t *sbase;         /* (nseg) where segment s's slice sits in the shard buffers */
    size_t nshard;         /* floats in the shard buffers */
    size_t max_layer;      /* largest layer unit */
    size_t max_layer_slice;
    size_t first_slice, last_slice; /* owned floats of the first and last units */

    float *params;         /* (n) zero 0-2 */
    float *pshard;         /* (nshard) zero 3 */
    float *grads;          /* (n) zero 0-1 */
    float *gshard;         /* (nshard) reduced, owned gradients */
    float *moments;        /* one arena: adam_m then adam_v */
    float *adam_m, *adam_v;/* (n) zero 0, (nshard) zero 1-3 each, views into moments */
    size_t n_moments;
    int frozen;            /* loom_dp_freeze: no optimizer state, never stepped */

    /* zero 2/3: gradient buckets and the recv buffers of their reduce-scatters */
    float *gbucket[N_BUCKETS];
    float *gtmp[N_BUCKETS];
    loom_comm_req *greq[N_BUCKETS][MAX_SEG];
    int gunit[N_BUCKETS];  /* unit whose reduction is in flight, -1 none */
    /* zero 0/1: per-segment reductions of the full gradient buffer */
    loom_comm_req **ureq;
    /* zero 3: gather buffers and the unit each holds (-1 none) */
    float *pbuf[N_BUCKETS];
    int punit[N_BUCKETS];
    /* zero 3 with training.precision bf16: the gathered units' bf16 copies and the unit each
     * holds round(pbuf) of (-1 none: written by the model at its next acquire) */
    uint16_t *pbf[N_BUCKETS];
    int pbf_unit[N_BUCKETS];

    int first, last;
    int64_t step;
    loom_adamw adamw;      /* the optimizer's hyper-parameters (loom/optim.h) */
    float grad_scale;      /* gradient clipping's factor, applied by the next step's AdamW */

    /* what other strategies add (loom_dp_set_grad_sync, loom_dp_set_copies) */
    void (*sync_fn)(void *ctx, loom_dp *dp);
    void *sync_ctx;
    int (*is_copy)(void *ctx, const loom_tensor_info *t);
    void *copy_ctx;
    loom_group norm_group;   /* summed over too, LOOM_GROUP_WORLD: none */
};

static int grank(const loom_dp *dp, int g) { return loom_mesh_rank(dp->mesh, (loom_group)g); }
static int gsize(const loom_dp *dp, int g) { return loom_mesh_size(dp->mesh, (loom_group)g); }

/* the segment holding tensor t */
static int seg_of(const loom_dp *dp, const loom_tensor_info *t) {
    const int s0 = dp->useg[t->unit];
    for (int s = s0; s < s0 + dp->unseg[t->unit]; s++)
        if (t->offset >= dp->goff[s] && t->offset < dp->goff[s] + dp->gcnt[s]) return s;
    LOOM_CHECK(0);
    return -1;
}

static int bucket_of(const loom_dp *dp, int u) {
    if (u == 0) return B_EMB;
    if (u == dp->U - 1) return B_FIN;
    return B_L0 + (u % 2);
}

/* ---- hooks ---------------------------------------------------------------------------- */

static const float *hook_acquire(void *ctx, int u, int phase) {
    loom_dp *dp = ctx;
    (void)phase;
    if (dp->zero < 3) return dp->params + dp->uoff[u];
    const int b = bucket_of(dp, u);
    if (dp->punit[b] != u) {
        dp->pbf_unit[b] = -1; /* its bf16 copy, if any, is of another unit now */
        for (int s = dp->useg[u]; s < dp->useg[u] + dp->unseg[u]; s++)
            loom_allgather(dp->mesh, (loom_group)dp->sgroup[s], dp->pshard + dp->sbase[s],
                           dp->pbuf[b] + (dp->goff[s] - dp->uoff[u]), dp->gcnt[s], LOOM_F32);
        dp->punit[b] = u;
    }
    return dp->pbuf[b];
}

/* zero 3, bf16: the bf16 copy of gathered unit u (the model writes it when *fresh) */
static uint16_t *hook_bf16(void *ctx, int u, int *fresh) {
    loom_dp *dp = ctx;
    const int b = bucket_of(dp, u);
    LOOM_CHECK(dp->zero == 3 && dp->pbf[b] && dp->punit[b] == u); /* acquired first */
    *fresh = dp->pbf_unit[b] != u;
    dp->pbf_unit[b] = u;
    return dp->pbf[b];
}

/* completes bucket b's reduce-scatter and adds it into the owned gradients */
/* adds the reduced slices of bucket b's unit (in gtmp, one after the other) into gshard */
static void fold_bucket(loom_dp *dp, int b) {
    const int u = dp->gunit[b];
    const float *src = dp->gtmp[b];
    for (int s = dp->useg[u]; s < dp->useg[u] + dp->unseg[u]; s++) {
        dp->be->add_inplace(dp->gshard + dp->sbase[s], src, (int64_t)dp->slen[s]);
        src += dp->slen[s];
    }
    dp->gunit[b] = -1;
}

static void drain_bucket(loom_dp *dp, int b) {
    if (dp->gunit[b] < 0) return;
    for (int k = 0; k < MAX_SEG; k++)
        if (dp->greq[b][k]) {
            loom_comm_wait(dp->greq[b][k]);
            dp->greq[b][k] = NULL;
        }
    fold_bucket(dp, b);
}

static float *hook_grads(void *ctx, int u) {
    loom_dp *dp = ctx;
    if (dp->zero < 2) return dp->grads + dp->uoff[u];
    const int b = bucket_of(dp, u);
    drain_bucket(dp, b);
    dp->be->mem_set(dp->gbucket[b], 0, dp->ucnt[u] * sizeof(float));
    return dp->gbucket[b];
}

/* Lets MPI advance the reductions in flight (non-blocking collectives only progress inside
 * MPI calls): called as backward hands over each unit, so they overlap the remaining
 * compute instead of all running in the final wait. */
static void progress(loom_dp *dp) {
    if (dp->zero < 2) {
        for (int s = 0; s < dp->nseg; s++)
            if (dp->ureq[s] && loom_comm_test(dp->ureq[s])) dp->ureq[s] = NULL;
        return;
    }
    for (int b = 0; b < N_BUCKETS; b++) {
        if (dp->gunit[b] < 0) continue;
        int pending = 0;
        for (int k = 0; k < MAX_SEG; k++) /* a completed request is freed by the test */
            if (dp->greq[b][k] && loom_comm_test(dp->greq[b][k])) dp->greq[b][k] = NULL;
        for (int k = 0; k < MAX_SEG; k++) pending |= dp->greq[b][k] != NULL;
        if (!pending) fold_bucket(dp, b);
    }
}

/* A kv head replicated over tp / n_kv_head consecutive tp ranks (n_kv_head < tp): each of them
 * holds the gradient of its own query heads' part only. Summed over those ranks by placing the
 * box in a zeroed whole tensor, all-reducing that over the tp group (the other kv heads' ranks
 * add their own rows: every row sums exactly its sharers' parts) and taking the box back: one
 * all-reduce of the whole (KVH*D, C) per tensor, which is less than tp boxes since KVH < tp. */
static void reduce_kv_replicas(loom_dp *dp, const loom_tensor_info *t, float *g) {
    size_t whole = 1, row = 1;
    for (int d = 0; d < t->ndim; d++) whole *= (size_t)t->shape[d];
    for (int d = 1; d < t->ndim; d++) row *= (size_t)t->shape[d];
    LOOM_CHECK(t->split_dim == 0 && t->numel == (size_t)t->box_len[0] * row);
    dp->be->mem_set(dp->kv_full, 0, whole * sizeof(float));
    float *box = dp->kv_full + (size_t)t->box_off[0] * row;
    dp->be->mem_d2d(box, g, t->numel * sizeof(float));
    loom_allreduce_sum(dp->mesh, LOOM_GROUP_TP, dp->kv_full, whole, LOOM_F32);
    dp->be->mem_d2d(g, box, t->numel * sizeof(float));
}

/* Sequence parallelism: the norms' gradients in unit u's buffer are this tp rank's partial
 * sums (its rows only): sum them over the tp group before the dp reduction takes them (once per
 * contribution: every micro-batch's bucket at zero 2/3, the accumulated buffer at zero 0/1). */
static void reduce_tp_partial(loom_dp *dp, int u, float *buf) {
    const loom_model *m = dp->m;
    if (!loom_model_get_layout(m)->sp && !dp->kv_full &&
        !(loom_model_get_layout(m)->tp > 1 && loom_model_get_config(m)->arch.qk_norm))
        return;
    const int nt = loom_model_num_tensors(dp->m);
    for (int i = 0; i < nt; i++) {
        const loom_tensor_info *t = loom_model_tensor(dp->m, i);
        if (t->unit != u) continue;
        float *g = buf + (t->offset - dp->uoff[u]);
        if (loom_model_grad_tp_partial(dp->m, t))
            loom_allreduce_sum(dp->mesh, LOOM_GROUP_TP, g, t->numel, LOOM_F32);
        else if (t->tp_replicas > 1)
            reduce_kv_replicas(dp, t, g);
    }
}

static void hook_grads_ready(void *ctx, int u) {
    loom_dp *dp = ctx;
    progress(dp);
    /* frozen (LoRA: the adapters reduce their own gradients): the base's are never read, so
     * they are not reduced either (that was a reduce-scatter of the whole model a step) */
    if (dp->frozen) return;
    if (dp->zero < 2) {
        if (!dp->last) return;
        reduce_tp_partial(dp, u, dp->grads + dp->uoff[u]);
        /* zero 0 and 1 both reduce-scatter; zero 0 all-gathers the result back later */
        for (int s = dp->useg[u]; s < dp->useg[u] + dp->unseg[u]; s++)
            dp->ureq[s] = loom_ireduce_scatter_sum(dp->mesh, (loom_group)dp->sgroup[s],
                                                   dp->grads + dp->goff[s],
                                                   dp->gshard + dp->sbase[s], dp->gcnt[s],
                                                   LOOM_F32);
        return;
    }
    const int b = bucket_of(dp, u);
    LOOM_CHECK(dp->gunit[b] < 0);
    float *tmp = dp->gtmp[b];
    reduce_tp_partial(dp, u, dp->gbucket[b]);
    for (int s = dp->useg[u], k = 0; s < dp->useg[u] + dp->unseg[u]; s++, k++) {
        dp->greq[b][k] = loom_ireduce_scatter_sum(dp->mesh, (loom_group)dp->sgroup[s],
                                                  dp->gbucket[b] + (dp->goff[s] - dp->uoff[u]),
                                                  tmp, dp->gcnt[s], LOOM_F32);
        tmp += dp->slen[s];
    }
    dp->gunit[b] = u;
}

/* ---- create --------------------------------------------------------------------------- */

int loom_dp_create(loom_model *m, loom_mesh *mesh, int zero, uint64_t seed, float beta1,
                   float beta2, float eps, float weight_decay, loom_dp **out, loom_err *err) {
    if (zero < 0 || zero > 3) return loom_errf(err, "parallel.zero = %d: expected 0, 1, 2 or 3", zero);
    loom_dp *dp = loom_calloc(1, sizeof *dp);
    dp->m = m;
    const loom_backend *be = dp->be = loom_model_backend(m);
    /* the mesh's collectives carry the backend's buffers: MPI inside its window, staged
     * through host memory, or NCCL (loom_comm_set_device) */
    if (loom_comm_set_device(mesh, be, err)) {
        free(dp);
        return -1;
    }
    dp->mesh = mesh;
    dp->zero = zero;
    dp->group = loom_mesh_layout(mesh)->cp > 1 ? LOOM_GROUP_DPCP : LOOM_GROUP_DP;
    dp->rank = loom_mesh_rank(mesh, dp->group);
    dp->size = loom_mesh_size(mesh, dp->group);
    dp->U = loom_model_num_units(m);
    dp->n = loom_model_num_params(m);
    dp->norm_group = LOOM_GROUP_WORLD;
    dp->adamw = (loom_adamw){beta1, beta2, eps, weight_decay};
    dp->grad_scale = 1.0f;
    const int U = dp->U;
    size_t kv_whole = 0; /* the largest replicated kv tensor's whole size (reduce_kv_replicas) */
    for (int i = 0; i < loom_model_num_tensors(m); i++) {
        const loom_tensor_info *t = loom_model_tensor(m, i);
        size_t whole = 1;
        for (int d = 0; d < t->ndim; d++) whole *= (size_t)t->shape[d];
        if (t->tp_replicas > 1 && whole > kv_whole) kv_whole = whole;
    }
    if (kv_whole) dp->kv_full = be->mem_alloc(kv_whole * sizeof(float), 0);
    dp->uoff = loom_calloc((size_t)U, sizeof(size_t));
    dp->ucnt = loom_calloc((size_t)U, sizeof(size_t));
    dp->useg = loom_calloc((size_t)U, sizeof(int));
    dp->unseg = loom_calloc((size_t)U, sizeof(int));
    const size_t S = (size_t)U * MAX_SEG;
    dp->sgroup = loom_calloc(S, sizeof(int));
    dp->sunit = loom_calloc(S, sizeof(int));
    dp->goff = loom_calloc(S, sizeof(size_t));
    dp->gcnt = loom_calloc(S, sizeof(size_t));
    dp->soff = loom_calloc(S, sizeof(size_t));
    dp->slen = loom_calloc(S, sizeof(size_t));
    dp->sbase = loom_calloc(S, sizeof(size_t));
    dp->ureq = loom_calloc(S, sizeof(loom_comm_req *));
    for (int u = 0; u < U; u++) {
        loom_model_unit_range(m, u, &dp->uoff[u], &dp->ucnt[u]);
        /* the unit's expert-data tensors (routed experts) are its last ones: where they start */
        size_t split = dp->uoff[u] + dp->ucnt[u];
        const int nt = loom_model_num_tensors(m);
        for (int i = 0; i < nt; i++) {
            const loom_tensor_info *t = loom_model_tensor(m, i);
            if (t->unit == u && t->reduce_group == LOOM_REDUCE_EDP && t->offset < split)
                split = t->offset;
        }
        for (int i = 0; i < nt; i++) { /* checked: nothing dense after the first expert tensor */
            const loom_tensor_info *t = loom_model_tensor(m, i);
            LOOM_CHECK(t->unit != u || (t->reduce_group == LOOM_REDUCE_EDP) == (t->offset >= split));
        }
        dp->useg[u] = dp->nseg;
        size_t slice = 0;
        for (int k = 0; k < 2; k++) {
            const size_t lo = k == 0 ? dp->uoff[u] : split, hi = k == 0 ? split : dp->uoff[u] + dp->ucnt[u];
            if (hi <= lo && !(k == 0 && dp->ucnt[u] == 0)) continue;
            const int s = dp->nseg++;
            dp->unseg[u]++;
            dp->sunit[s] = u;
            dp->sgroup[s] = k == 0 ? (int)dp->group : LOOM_GROUP_EDP;
            dp->goff[s] = lo;
            dp->gcnt[s] = hi - lo;
            loom_split(dp->gcnt[s], gsize(dp, dp->sgroup[s]), grank(dp, dp->sgroup[s]),
                       &dp->soff[s], &dp->slen[s]);
            dp->sbase[s] = dp->nshard;
            dp->nshard += dp->slen[s];
            slice += dp->slen[s];
        }
        if (u > 0 && u < U - 1) {
            if (dp->ucnt[u] > dp->max_layer) dp->max_layer = dp->ucnt[u];
            if (slice > dp->max_layer_slice) dp->max_layer_slice = slice;
        }
        if (u == 0) dp->first_slice = slice;
        if (u == U - 1) dp->last_slice = slice;
    }
    if (zero < 3) {
        dp->params = be->mem_alloc(dp->n * sizeof(float), 0);
        loom_model_init_device(m, seed, 0, dp->n, dp->params);
    } else {
        dp->pshard = be->mem_alloc(dp->nshard * sizeof(float), 0);
        for (int s = 0; s < dp->nseg; s++)
            loom_model_init_device(m, seed, dp->goff[s] + dp->soff[s], dp->slen[s],
                                   dp->pshard + dp->sbase[s]);
        const size_t sizes[N_BUCKETS] = {dp->ucnt[0], dp->ucnt[U - 1], dp->max_layer,
                                         dp->max_layer};
        for (int b = 0; b < N_BUCKETS; b++) {
            dp->pbuf[b] = be->mem_alloc(sizes[b] * sizeof(float), 0);
            dp->punit[b] = -1;
            if (loom_model_get_layout(m)->precision == LOOM_PREC_BF16)
                dp->pbf[b] = be->mem_alloc(sizes[b] * sizeof(uint16_t), 0);
            dp->pbf_unit[b] = -1;
        }
    }
    if (zero < 2) dp->grads = be->mem_alloc(dp->n * sizeof(float), 0);
    /* zero 0/1 with every reduction group of one rank (dp = 1): the reduced gradients are the
     * gradients, one buffer; the reduce-scatter and all-gather are then in place (no copies,
     * no second memset: 2.5 bytes of memory traffic per parameter byte and step less) */
    int alone = zero < 2 && dp->nshard == dp->n;
    for (int s = 0; alone && s < dp->nseg; s++)
        alone = gsize(dp, dp->sgroup[s]) == 1 && dp->sbase[s] == dp->goff[s];
    dp->gshard = alone ? dp->grads : be->mem_alloc(dp->nshard * sizeof(float), 0);
    if (zero >= 2) {
        const size_t sizes[N_BUCKETS] = {dp->ucnt[0], dp->ucnt[U - 1], dp->max_layer,
                                         dp->max_layer};
        const size_t tsizes[N_BUCKETS] = {dp->first_slice, dp->last_slice, dp->max_layer_slice,
                                          dp->max_layer_slice};
        for (int b = 0; b < N_BUCKETS; b++) {
            dp->gbucket[b] = be->mem_alloc(sizes[b] * sizeof(float), 0);
            dp->gtmp[b] = be->mem_alloc(tsizes[b] * sizeof(float), 0);
        }
    }
    for (int b = 0; b < N_BUCKETS; b++) dp->gunit[b] = -1;
    dp->n_moments = zero == 0 ? dp->n : dp->nshard;
    dp->moments = be->mem_alloc(2 * dp->n_moments * sizeof(float), 0);
    dp->adam_m = dp->moments;
    dp->adam_v = dp->moments + dp->n_moments;
    loom_model_hooks h = {.ctx = dp, .acquire_params = hook_acquire, .grads = hook_grads,
                          .grads_ready = hook_grads_ready, .resident = zero < 3,
                          .bf16_buffer = dp->pbf[0] ? hook_bf16 : NULL};
    loom_model_set_hooks(m, &h);
    *out = dp;
    return 0;
}

void loom_dp_free(loom_dp *dp) {
    if (!dp) return;
    const loom_backend *be = dp->be;
    for (int b = 0; b < N_BUCKETS; b++) {
        drain_bucket(dp, b);
        be->mem_free(dp->gbucket[b]);
        be->mem_free(dp->gtmp[b]);
        be->mem_free(dp->pbuf[b]);
        be->mem_free(dp->pbf[b]);
    }
    be->mem_free(dp->kv_full);
    be->mem_free(dp->params);
    be->mem_free(dp->pshard);
    if (dp->gshard != dp->grads) be->mem_free(dp->gshard);
    be->mem_free(dp->grads);
    be->mem_free(dp->moments);
    free(dp->uoff);
    free(dp->ucnt);
    free(dp->soff);
    free(dp->slen);
    free(dp->sbase);
    free(dp->ureq);
    free(dp->useg);
    free(dp->unseg);
    free(dp->sgroup);
    free(dp->sunit);
    free(dp->goff);
    free(dp->gcnt);
    free(dp);
}

/* ---- step ----------------------------------------------------------------------------- */

void loom_dp_begin_micro(loom_dp *dp, int first, int last) {
    dp->first = first;
    dp->last = last;
    if (!first) return;
    if (dp->grads) dp->be->mem_set(dp->grads, 0, dp->n * sizeof(float));
    if (dp->gshard != dp->grads) dp->be->mem_set(dp->gshard, 0, dp->nshard * sizeof(float));
}

/* The sum of squares of this rank's reduced gradients (its owned slices). With tensor
 * parallelism each view holds its box of every tp-split tensor and a whole copy of every
 * other one (norms, row-parallel biases, embeddings and head), whose gradients are equal
 * on every tp rank: tp rank 0 alone counts those, so the sum over the tp group counts each
 * element of the global model once. */
static double grad_sum_squares(const loom_dp *dp) {
    const loom_backend *be = loom_model_backend(dp->m);
    const loom_model_layout *lay = loom_model_get_layout(dp->m);
    if (lay->tp <= 1 && !dp->is_copy) return be->sum_squares(dp->gshard, (int64_t)dp->nshard);
    double ss = 0;
    const int nt = loom_model_num_tensors(dp->m);
    for (int i = 0; i < nt; i++) {
        const loom_tensor_info *t = loom_model_tensor(dp->m, i);
        if (!loom_model_tp_owner(dp->m, t)) continue; /* a tp replica: counted elsewhere */
        if (dp->is_copy && dp->is_copy(dp->copy_ctx, t)) continue; /* counted elsewhere */
        const int sg = seg_of(dp, t);
        const size_t lo = dp->goff[sg] + dp->soff[sg], hi = lo + dp->slen[sg];
        const size_t a = t->offset > lo ? t->offset : lo;
        const size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a < b) ss += be->sum_squares(dp->gshard + dp->sbase[sg] + (a - lo), (int64_t)(b - a));
    }
    return ss;
}

float loom_dp_finish_grads(loom_dp *dp, float max_norm) {
    if (dp->frozen) return 0.0f; /* nothing was reduced (hook_grads_ready), nothing is stepped */
    if (dp->zero < 2) {
        for (int s = 0; s < dp->nseg; s++) /* NULL: already completed by progress() */
            if (dp->ureq[s]) {
                loom_comm_wait(dp->ureq[s]);
                dp->ureq[s] = NULL;
            }
    } else {
        for (int b = 0; b < N_BUCKETS; b++) drain_bucket(dp, b);
    }
    if (dp->sync_fn) dp->sync_fn(dp->sync_ctx, dp);
    /* every reduced element lives on exactly one dp rank: the norm is a sum over dp ranks,
     * and over the tp group's views and the pipeline's stages (below) */
    double ss = grad_sum_squares(dp);
    loom_allreduce_sum(dp->mesh, dp->group, &ss, 1, LOOM_F64);
    if (loom_model_get_layout(dp->m)->tp > 1)
        loom_allreduce_sum(dp->mesh, LOOM_GROUP_TP, &ss, 1, LOOM_F64);
    if (dp->norm_group != LOOM_GROUP_WORLD)
        loom_allreduce_sum(dp->mesh, dp->norm_group, &ss, 1, LOOM_F64);
    const double norm = sqrt(ss);
    /* clipping scales the gradients inside the AdamW step (the same bits as scaling them
     * here, without a pass of its own over them) */
    dp->grad_scale = loom_optim_clip_scale(norm, max_norm);
    if (dp->zero == 0) /* every rank gets the whole reduced gradient, bit-identical */
        for (int s = 0; s < dp->nseg; s++)
            loom_allgather(dp->mesh, (loom_group)dp->sgroup[s], dp->gshard + dp->sbase[s],
                           dp->grads + dp->goff[s], dp->gcnt[s], LOOM_F32);
    return (float)norm;
}

/* AdamW (src/parallel/optim.c) over arena range [lo, hi) of unit u */
static void update_range(loom_dp *dp, int u, size_t lo, size_t hi, float *p, const float *g,
                         float *mm, float *vv, float lr) {
    /* training.precision bf16: the step writes the bf16 copy of the range it updates */
    uint16_t *wb = dp->zero < 3 ? loom_model_bf16_weights(dp->m) : NULL;
    loom_optim_adamw_range_bf16(dp->m, u, lo, hi, p, wb ? wb + lo : NULL, g, mm, vv, &dp->adamw,
                                lr, dp->step, dp->grad_scale);
}

void loom_dp_step(loom_dp *dp, float lr) {
    LOOM_CHECK(!dp->frozen); /* frozen parameters are never stepped */
    dp->step++;
    for (int u = 0; u < dp->U; u++) {
        if (dp->zero == 0) {
            const size_t lo = dp->uoff[u], hi = lo + dp->ucnt[u];
            update_range(dp, u, lo, hi, dp->params + lo, dp->grads + lo, dp->adam_m + lo,
                         dp->adam_v + lo, lr);
            continue;
        }
        for (int s = dp->useg[u]; s < dp->useg[u] + dp->unseg[u]; s++) {
            const size_t lo = dp->goff[s] + dp->soff[s], hi = lo + dp->slen[s], sb = dp->sbase[s];
            float *p = dp->zero == 3 ? dp->pshard + sb : dp->params + lo;
            update_range(dp, u, lo, hi, p, dp->gshard + sb, dp->adam_m + sb, dp->adam_v + sb, lr);
            if (dp->zero < 3)
                loom_allgather(dp->mesh, (loom_group)dp->sgroup[s], dp->params + lo,
                               dp->params + dp->goff[s], dp->gcnt[s], LOOM_F32);
        }
    }
    for (int b = 0; b < N_BUCKETS; b++) dp->punit[b] = dp->pbf_unit[b] = -1; /* stale now */
    /* ZeRO 1/2: the other ranks' slices came by allgather: their bf16 copies are refreshed
     * before the next forward (zero 0 wrote every copy in the step) */
    if (dp->zero > 0) loom_model_params_changed(dp->m);
}

void loom_dp_set_grad_sync(loom_dp *dp, void (*fn)(void *ctx, loom_dp *dp), void *ctx) {
    dp->sync_fn = fn;
    dp->sync_ctx = ctx;
}

void loom_dp_set_copies(loom_dp *dp, loom_group norm_group,
                        int (*is_copy)(void *ctx, const loom_tensor_info *t), void *ctx) {
    dp->norm_group = norm_group;
    dp->is_copy = is_copy;
    dp->copy_ctx = ctx;
}

float *loom_dp_owned_grad(loom_dp *dp, const loom_tensor_info *t, size_t *begin, size_t *count) {
    const int sg = seg_of(dp, t);
    const size_t lo = dp->goff[sg] + dp->soff[sg], hi = lo + dp->slen[sg];
    const size_t a = t->offset > lo ? t->offset : lo;
    const size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
    *begin = *count = 0;
    if (a >= b) return NULL;
    *begin = a - t->offset;
    *count = b - a;
    return dp->gshard + dp->sbase[sg] + (a - lo);
}

void loom_dp_freeze(loom_dp *dp) {
    dp->be->mem_free(dp->moments);
    dp->moments = dp->adam_m = dp->adam_v = NULL;
    dp->n_moments = 0;
    dp->frozen = 1;
}

int64_t loom_dp_optimizer_step(const loom_dp *dp) { return dp->step; }
void loom_dp_set_optimizer_step(loom_dp *dp, int64_t step) { dp->step = step; }

/* The storage loom_dp_create allocates for a layout, from its unit sizes: n parameters in
 * all, nshard owned, the first and last units' sizes and slices, the largest layer and slice. */
typedef struct dp_sizes {
    size_t n, nshard, first, last, max_layer, first_slice, last_slice, max_layer_slice;
} dp_sizes;

/* alone: the gradients and the owned gradients are one buffer (zero 0/1 at dp = 1) */
static void memory_of(int zero, int alone, const dp_sizes *z, loom_dp_memory *out) {
    const size_t f = sizeof(float);
    memset(out, 0, sizeof *out);
    if (zero < 3) out->param_bytes = z->n * f;
    else out->param_bytes = (z->nshard + z->first + z->last + 2 * z->max_layer) * f;
    out->grad_bytes = alone ? 0 : z->nshard * f;
    if (zero < 2) out->grad_bytes += z->n * f;
    else
        out->grad_bytes += (z->first + z->last + 2 * z->max_layer + z->first_slice +
                            z->last_slice + 2 * z->max_layer_slice) * f;
    out->optim_bytes = 2 * (zero == 0 ? z->n : z->nshard) * f;
    out->bf16_elems = zero < 3 ? z->n : z->first + z->last + 2 * z->max_layer;
}

void loom_dp_memory_usage(const loom_dp *dp, loom_dp_memory *out) {
    const dp_sizes z = {dp->n, dp->nshard, dp->ucnt[0], dp->ucnt[dp->U - 1], dp->max_layer,
                        dp->first_slice, dp->last_slice, dp->max_layer_slice};
    memory_of(dp->zero, dp->gshard == dp->grads, &z, out);
    if (dp->frozen) out->optim_bytes = 0;
    if (loom_model_get_layout(dp->m)->precision != LOOM_PREC_BF16) out->bf16_elems = 0;
}

void loom_dp_memory_estimate_groups(const loom_model *m, int dp_size, int dp_rank, int edp_size,
                                    int edp_rank, int zero, loom_dp_memory *out) {
    /* loom_dp_create's segments: each unit's dense tensors sliced over the reduction group,
     * its routed experts' (its last tensors) over the expert-data group */
    const int U = loom_model_num_units(m), nt = loom_model_num_tensors(m);
    dp_sizes z = {.n = loom_model_num_params(m)};
    int alone = zero < 2;
    for (int u = 0; u < U; u++) {
        size_t off, cnt;
        loom_model_unit_range(m, u, &off, &cnt);
        size_t split = off + cnt;
        for (int i = 0; i < nt; i++) {
            const loom_tensor_info *t = loom_model_tensor(m, i);
            if (t->unit == u && t->reduce_group == LOOM_REDUCE_EDP && t->offset < split)
                split = t->offset;
        }
        size_t slice = 0;
        for (int k = 0; k < 2; k++) {
            const size_t lo = k == 0 ? off : split, hi = k == 0 ? split : off + cnt;
            if (hi <= lo && !(k == 0 && cnt == 0)) continue;
            const int size = k == 0 ? dp_size : edp_size, rank = k == 0 ? dp_rank : edp_rank;
            size_t soff, slen;
            loom_split(hi - lo, size, rank, &soff, &slen);
            if (size > 1 || z.nshard != lo) alone = 0; /* the shard is not the arena itself */
            z.nshard += slen;
            slice += slen;
        }
        if (u == 0) z.first = cnt, z.first_slice = slice;
        if (u == U - 1) z.last = cnt, z.last_slice = slice;
        if (u > 0 && u < U - 1) {
            if (cnt > z.max_layer) z.max_layer = cnt;
            if (slice > z.max_layer_slice) z.max_layer_slice = slice;
        }
    }
    memory_of(zero, alone && z.nshard == z.n, &z, out);
}

void loom_dp_memory_estimate(const loom_model *m, int dp_size, int dp_rank, int zero,
                             loom_dp_memory *out) {
    loom_dp_memory_estimate_groups(m, dp_size, dp_rank, dp_size, dp_rank, zero, out);
}

uint64_t loom_dp_param_hash(const loom_dp *dp) {
    const float *p = dp->zero < 3 ? dp->params : dp->pshard;
    const size_t n = dp->zero < 3 ? dp->n : dp->nshard;
    uint64_t h = 0xcbf29ce484222325ULL;
    /* a metric of the parameters (train.param_hash): read back in pieces */
    enum { PIECE = 4096 };
    float buf[PIECE]; /* (no allocation: it may run every step) */
    for (size_t at = 0; at < n; at += PIECE) {
        const size_t k = n - at < PIECE ? n - at : PIECE;
        loom_dev_read(dp->be, buf, p + at, k * sizeof(float), "parameter hash");
        const unsigned char *b = (const unsigned char *)buf;
        for (size_t i = 0; i < k * sizeof(float); i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    }
    return h;
}

/* ---- checkpoint pieces ------------------------------------------------------------------ */

static void push_piece(loom_dp_piece **arr, int *n, int *cap, loom_dp_piece p) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *arr = loom_realloc(*arr, (size_t)*cap * sizeof **arr);
    }
    (*arr)[(*n)++] = p;
}

/* A tensor not split over tp (replicated, or split over ep only) is held whole by every tp
 * rank of a tensor-parallel view: only tp rank 0 writes it (a checkpoint's boxes of one tensor must not overlap); every rank loads it. */
static int skip_replica(const loom_dp *dp, const loom_tensor_info *t, int for_load) {
    if (!for_load && dp->is_copy && dp->is_copy(dp->copy_ctx, t)) return 1; /* written elsewhere */
    return !for_load && !loom_model_tp_owner(dp->m, t);
}

/* Whole (unsharded) copies are written by one rank of the group that replicates them: dense
 * tensors by dp rank 0, routed experts by rank 0 of their expert-data group (each expert
 * group member writes the experts it holds, by global index). */
static int writes_whole(const loom_dp *dp, const loom_tensor_info *t, int for_load) {
    if (for_load) return 1;
    return t->reduce_group == LOOM_REDUCE_EDP ? grank(dp, LOOM_GROUP_EDP) == 0 : dp->rank == 0;
}

/* pieces of `kind` for arena data laid out as the full arena (base indexed by arena offset) */
static void full_pieces(loom_dp *dp, int kind, float *base, loom_dp_piece **arr, int *n, int *cap,
                        int for_load) {
    const int nt = loom_model_num_tensors(dp->m);
    for (int i = 0; i < nt; i++) {
        const loom_tensor_info *t = loom_model_tensor(dp->m, i);
        if (skip_replica(dp, t, for_load) || !writes_whole(dp, t, for_load)) continue;
        push_piece(arr, n, cap, (loom_dp_piece){kind, t, 0, t->numel, base + t->offset});
    }
}

/* pieces of `kind` for data laid out as this rank's shard buffers */
static void shard_pieces(loom_dp *dp, int kind, float *shard, loom_dp_piece **arr, int *n,
                         int *cap, int for_load) {
    const int nt = loom_model_num_tensors(dp->m);
    for (int i = 0; i < nt; i++) {
        const loom_tensor_info *t = loom_model_tensor(dp->m, i);
        if (skip_replica(dp, t, for_load)) continue;
        const int sg = seg_of(dp, t);
        const size_t lo = dp->goff[sg] + dp->soff[sg], hi = lo + dp->slen[sg];
        const size_t a = t->offset > lo ? t->offset : lo;
        const size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        push_piece(arr, n, cap, (loom_dp_piece){kind, t, a - t->offset, b - a,
                                                shard + dp->sbase[sg] + (a - lo)});
    }
}

static loom_dp_piece *collect(loom_dp *dp, int *n, int for_load) {
    loom_dp_piece *arr = NULL;
    int cap = 0;
    *n = 0;
    if (dp->zero < 3) { /* full_pieces leaves out what another rank writes */
        full_pieces(dp, 0, dp->params, &arr, n, &cap, for_load);
    } else {
        shard_pieces(dp, 0, dp->pshard, &arr, n, &cap, for_load);
    }
    if (dp->frozen) return arr; /* no optimizer state */
    if (dp->zero == 0) {
        full_pieces(dp, 1, dp->adam_m, &arr, n, &cap, for_load);
        full_pieces(dp, 2, dp->adam_v, &arr, n, &cap, for_load);
    } else {
        shard_pieces(dp, 1, dp->adam_m, &arr, n, &cap, for_load);
        shard_pieces(dp, 2, dp->adam_v, &arr, n, &cap, for_load);
    }
    return arr;
}

loom_dp_piece *loom_dp_pieces(loom_dp *dp, int *n) { return collect(dp, n, 0); }

float *loom_dp_pieces_stage(const loom_dp *dp, loom_dp_piece *p, int n) {
    if (dp->be->host_memory) return NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += p[i].count;
    float *h = loom_malloc((total ? total : 1) * sizeof(float)), *at = h;
    for (int i = 0; i < n; i++) {
        loom_dev_read(dp->be, at, p[i].data, p[i].count * sizeof(float), "checkpoint pieces");
        p[i].data = at;
        at += p[i].count;
    }
    return h;
}

void loom_dp_pieces_upload(const loom_dp *dp, const loom_dp_piece *host,
                           const loom_dp_piece *dev, int n) {
    for (int i = 0; i < n; i++)
        if (host[i].data != dev[i].data)
            dp->be->mem_h2d(dev[i].data, host[i].data, dev[i].count * sizeof(float));
}
loom_dp_piece *loom_dp_needed(loom_dp *dp, int *n) { return collect(dp, n, 1); }
