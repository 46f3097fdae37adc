/* Context parallelism: the model's attention hook for Ulysses and ring attention over the
 * mesh's cp group. See include/loom/cp.h and docs/context-parallel.md. */
#include "loom/cp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"

const loom_config_key loom_cp_config_keys[] = {
    {"parallel.cp_kind", "ulysses",
     "context parallelism: ulysses (all-to-all to head shards) or ring (K/V blocks around the "
     "cp ranks)"},
};
const int loom_cp_config_nkeys = sizeof loom_cp_config_keys / sizeof loom_cp_config_keys[0];

static const char *const kind_names[] = {"ulysses", "ring"};

const char *loom_cp_kind_name(int kind) {
    return kind == LOOM_CPKIND_ULYSSES || kind == LOOM_CPKIND_RING ? kind_names[kind] : "?";
}

int loom_cp_kind_from_config(const loom_config *c, int *kind, loom_err *err) {
    *kind = LOOM_CPKIND_ULYSSES;
    const char *v = loom_config_get(c, "parallel.cp_kind");
    if (!v) return 0;
    for (int k = 0; k < 2; k++)
        if (!strcmp(v, kind_names[k])) {
            *kind = k;
            return 0;
        }
    const char *o = loom_config_origin(c, "parallel.cp_kind");
    return loom_errf(err, "parallel.cp_kind = '%s' (set at %s): expected ulysses or ring", v,
                     o ? o : "?");
}

int loom_cp_check(const loom_model_config *mc, int tp, int cp, int kind, int64_t T,
                  loom_err *err) {
    if (cp <= 1) return 0;
    if (tp < 1) tp = 1;
    if (T % (2 * cp) != 0)
        return loom_errf(err, "training.seq_len = %lld must be divisible by 2 * parallel.cp = %d "
                              "(context parallelism cuts each sequence into 2 * cp chunks; "
                              "rank i holds chunks i and 2 * cp - 1 - i)", (long long)T, 2 * cp);
    if (mc->attention != LOOM_ATTN_FLASH)
        return loom_errf(err, "model.attention = sdpa: parallel.cp = %d needs model.attention: "
                              "flash", cp);
    if (mc->head != LOOM_HEAD_LM)
        return loom_errf(err, "model.head = classify: parallel.cp = %d needs the lm head (the "
                              "classify head pools over the whole sequence)", cp);
    if (kind == LOOM_CPKIND_ULYSSES && ((mc->n_head / tp) % cp || (mc->n_kv_head / tp) % cp))
        return loom_errf(err, "parallel.cp_kind = ulysses: parallel.cp = %d must divide "
                              "model.n_head (%d) and model.n_kv_head (%d)%s, since each rank "
                              "attends with n_head / cp query heads and n_kv_head / cp key/value "
                              "heads; use parallel.cp_kind: ring, or another cp",
                         cp, mc->n_head / tp, mc->n_kv_head / tp,
                         tp > 1 ? " per tensor-parallel rank" : "");
    return 0;
}

void loom_cp_local_rows(int cp, int rank, const int32_t *global, int32_t *local, int B,
                        int64_t T) {
    LOOM_CHECK(cp >= 1 && rank >= 0 && rank < cp && T % (2 * cp) == 0);
    const int64_t c = T / (2 * cp), Tl = T / cp;
    for (int b = 0; b < B; b++) {
        memcpy(local + b * Tl, global + b * T + rank * c, (size_t)c * sizeof(int32_t));
        memcpy(local + b * Tl + c, global + b * T + (2 * cp - 1 - rank) * c,
               (size_t)c * sizeof(int32_t));
    }
}

struct loom_cp {
    loom_model *m;
    loom_mesh *mesh;
    int kind, P, r;             /* kind, cp degree, this rank in the cp group */
    int H, KVH, D;              /* the view's heads */
    int64_t QKV, HD, KD;        /* row widths: q|k|v, out, one of k / v */
    const loom_backend *be;
    /* ulysses: alltoall buffers and the head-sharded tensors (all of B x T x width floats) */
    float *send, *recv, *qkv_h, *out_h, *dout_h, *dqkv_h;
    /* ring: K|V rows (B, T, 2 KD) in flight (double buffered), their gradients, and one
     * block's partial output and lse */
    float *kv[2], *dkv[2], *dkv_in, *blk_out, *blk_lse;
    /* training.precision bf16: the layer's bf16 q|k|v and output widened to fp32 (B, T, QKV)
     * and (B, T, HD) (else NULL); the kind's fp32 attention runs on them, as the one-process
     * bf16 flash kernel widens its tiles */
    float *w_qkv, *w_out;
    void (*fwd32)(void *ctx, int layer, float *out, float *lse, const float *qkv, int B, int T,
                  const int32_t *gdocs);
    void (*bwd32)(void *ctx, int layer, float *dqkv, const float *dout, const float *qkv,
                  const float *out, const float *lse, int B, int T, const int32_t *gdocs);
};

/* ---- ulysses ----------------------------------------------------------------------------- */

/* The global row of local row t of cp rank i (chunks i and 2P-1-i of c rows each). */
static int64_t global_row(int P, int i, int64_t c, int64_t t) {
    return t < c ? i * c + t : (2 * P - 1 - i) * c + (t - c);
}

/* The columns of head group j of a row: segments (offset, width). qkv rows have three (q, k,
 * v heads of group j), out rows one. */
typedef struct segs {
    int n;
    int64_t off[3], w[3], width; /* width: the head-sharded row (sum of w) */
} segs;

static segs qkv_segs(const loom_cp *c, int j) {
    const int64_t hq = c->HD / c->P, hk = c->KD / c->P;
    return (segs){3, {j * hq, c->HD + j * hk, c->HD + c->KD + j * hk}, {hq, hk, hk}, hq + 2 * hk};
}
static segs out_segs(const loom_cp *c, int j) {
    const int64_t hq = c->HD / c->P;
    return (segs){1, {j * hq, 0, 0}, {hq, 0, 0}, hq};
}

/* One tensor of a sequence-to-head exchange: src (B, T, W) sequence-sharded (q|k|v rows, or
 * out rows) -> dst (B, P*T, W/P) head-sharded (this rank's head group). */
typedef struct s2h {
    const float *src;
    int64_t W;
    int qkv;
    float *dst;
} s2h;

/* Several tensors in ONE all-to-all: each destination's block holds, per row, the head-group
 * columns of every tensor in turn. */
static void seq_to_head(loom_cp *c, const s2h *x, int n, int B, int T) {
    const int P = c->P;
    const int64_t half = T / 2, Tg = (int64_t)P * T, BT = (int64_t)B * T;
    int64_t Wr = 0; /* floats of one row of a block: the tensors' head-group widths */
    for (int k = 0; k < n; k++) Wr += (x[k].qkv ? qkv_segs(c, 0) : out_segs(c, 0)).width;
    const int64_t blk = BT * Wr;
    for (int j = 0; j < P; j++) {
        int64_t col = 0;
        for (int k = 0; k < n; k++) {
            const segs s = x[k].qkv ? qkv_segs(c, j) : out_segs(c, j);
            const float *src = x[k].src;
            const int64_t W = x[k].W;
            int64_t at = col; /* each segment's columns of every row: one strided copy */
            for (int g = 0; g < s.n; g++) {
                c->be->mem_d2d_rows(c->send + j * blk + at, (size_t)Wr * sizeof(float),
                                    src + s.off[g], (size_t)W * sizeof(float),
                                    (size_t)s.w[g] * sizeof(float), (size_t)BT);
                at += s.w[g];
            }
            col += s.width;
        }
    }
    loom_alltoall(c->mesh, LOOM_GROUP_CP, c->send, c->recv, (size_t)blk, LOOM_F32);
    for (int i = 0; i < P; i++) {
        int64_t col = 0;
        for (int k = 0; k < n; k++) {
            const int64_t Wh = (x[k].qkv ? qkv_segs(c, 0) : out_segs(c, 0)).width;
            float *dst = x[k].dst;
            for (int64_t b = 0; b < B; b++) /* each chunk's rows land contiguously */
                for (int64_t t0 = 0; t0 < T; t0 += half) {
                    const int64_t bt = b * T + t0;
                    c->be->mem_d2d_rows(dst + (b * Tg + global_row(P, i, half, t0)) * Wh,
                                        (size_t)Wh * sizeof(float),
                                        c->recv + i * blk + bt * Wr + col,
                                        (size_t)Wr * sizeof(float), (size_t)Wh * sizeof(float),
                                        (size_t)half);
                }
            col += Wh;
        }
    }
}

/* The inverse: src (B, P*T, width) of this rank's head group -> dst (B, T, W) (add: +=) */
static void head_to_seq(loom_cp *c, const float *src, int64_t W, int qkv, float *dst, int B,
                        int T, int add) {
    const int P = c->P;
    const int64_t half = T / 2, Tg = (int64_t)P * T;
    const segs s0 = qkv ? qkv_segs(c, 0) : out_segs(c, 0);
    const int64_t Wh = s0.width, blk = (int64_t)B * T * Wh;
    for (int i = 0; i < P; i++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t t0 = 0; t0 < T; t0 += half) /* a chunk's rows: one copy */
                c->be->mem_d2d(c->send + i * blk + (b * T + t0) * Wh,
                               src + (b * Tg + global_row(P, i, half, t0)) * Wh,
                               (size_t)(half * Wh) * sizeof(float));
    loom_alltoall(c->mesh, LOOM_GROUP_CP, c->send, c->recv, (size_t)blk, LOOM_F32);
    for (int j = 0; j < P; j++) {
        const segs s = qkv ? qkv_segs(c, j) : out_segs(c, j);
        int64_t at = 0; /* the segment's columns in the received rows */
        for (int k = 0; k < s.n; k++) {
            if (add)
                c->be->add_rows(dst + s.off[k], W, c->recv + j * blk + at, Wh, s.w[k],
                                (int64_t)B * T);
            else
                c->be->mem_d2d_rows(dst + s.off[k], (size_t)W * sizeof(float),
                                    c->recv + j * blk + at, (size_t)Wh * sizeof(float),
                                    (size_t)s.w[k] * sizeof(float), (size_t)B * (size_t)T);
            at += s.w[k];
        }
    }
}

/* causal, and with documents inside each document of the whole sequences (B, P*T) */
/* the layer's window and scores (loom_model_attn_scores) are every mask's */
static loom_attn_mask whole_mask(const loom_cp *c, int layer, const int32_t *gdocs, int T) {
    loom_attn_mask mask = {.causal = 1};
    loom_model_attn_scores(c->m, layer, &mask);
    if (gdocs) {
        mask.q_doc = mask.k_doc = gdocs;
        mask.q_doc_bs = mask.k_doc_bs = (int64_t)c->P * T;
    }
    return mask;
}

static void ulysses_forward(void *ctx, int layer, float *out, float *lse, const float *qkv,
                            int B, int T, const int32_t *gdocs) {
    loom_cp *c = ctx;
    const int Hh = c->H / c->P, KVh = c->KVH / c->P;
    const s2h x = {qkv, c->QKV, 1, c->qkv_h};
    seq_to_head(c, &x, 1, B, T);
    const loom_attn_dims dims = flash_attention_dims_qkv(B, c->P * T, Hh, KVh, c->D);
    const loom_attn_mask mask = whole_mask(c, layer, gdocs, T);
    const float *q = c->qkv_h, *k = q + Hh * c->D, *v = k + KVh * c->D;
    /* lse: (B, H/P, P*T) = the B*H*T floats the model keeps for this layer */
    LOOM_CHECK(c->be->flash_attention_forward(c->out_h, lse, q, k, v, &dims, &mask) == 0);
    head_to_seq(c, c->out_h, c->HD, 0, out, B, T, 0);
}

static void ulysses_backward(void *ctx, int layer, float *dqkv, const float *dout,
                             const float *qkv, const float *out, const float *lse, int B,
                             int T, const int32_t *gdocs) {
    loom_cp *c = ctx;
    const int Hh = c->H / c->P, KVh = c->KVH / c->P;
    const int64_t hq = Hh * c->D, hk = KVh * c->D;
    /* the forward's q|k|v and output again (nothing head-sharded is kept), and the output's
     * gradient: one all-to-all */
    const s2h x[3] = {{qkv, c->QKV, 1, c->qkv_h}, {out, c->HD, 0, c->out_h},
                      {dout, c->HD, 0, c->dout_h}};
    seq_to_head(c, x, 3, B, T);
    const int64_t Tg = (int64_t)c->P * T;
    c->be->mem_set(c->dqkv_h, 0, (size_t)(B * Tg * (hq + 2 * hk)) * sizeof(float));
    const loom_attn_dims dims = flash_attention_dims_qkv(B, (int)Tg, Hh, KVh, c->D);
    const loom_attn_mask mask = whole_mask(c, layer, gdocs, T);
    const float *q = c->qkv_h;
    float *dq = c->dqkv_h;
    LOOM_CHECK(c->be->flash_attention_backward(dq, dq + hq, dq + hq + hk, c->dout_h, q, q + hq,
                                               q + hq + hk, c->out_h, lse, &dims, &mask) == 0);
    head_to_seq(c, c->dqkv_h, c->QKV, 1, dqkv, B, T, 1);
}

/* ---- bf16 -------------------------------------------------------------------------------------
 * With training.precision bf16 the model hands the hook its bf16 q|k|v and output slots (as
 * float pointers: the hook's signature) and fp32 lse and gradients. Both kinds widen them and
 * run their fp32 attention, then round the output once: what the one-process bf16 flash kernel
 * does tile by tile (bf16_ops.c), so a cp run differs from one process only as fp32 cp does.
 * The exchanges then move fp32 rows (a bf16 all-to-all / ring would halve them: not done). */

static void bf16_forward(void *ctx, int layer, float *out, float *lse, const float *qkv, int B,
                         int T, const int32_t *gdocs) {
    loom_cp *c = ctx;
    const int64_t rows = (int64_t)B * T;
    c->be->bf16_to_f32(c->w_qkv, (const uint16_t *)qkv, rows * c->QKV);
    c->fwd32(ctx, layer, c->w_out, lse, c->w_qkv, B, T, gdocs);
    c->be->bf16_from_f32((uint16_t *)out, c->w_out, rows * c->HD);
}

static void bf16_backward(void *ctx, int layer, float *dqkv, const float *dout, const float *qkv,
                          const float *out, const float *lse, int B, int T,
                          const int32_t *gdocs) {
    loom_cp *c = ctx;
    const int64_t rows = (int64_t)B * T;
    c->be->bf16_to_f32(c->w_qkv, (const uint16_t *)qkv, rows * c->QKV);
    c->be->bf16_to_f32(c->w_out, (const uint16_t *)out, rows * c->HD);
    c->bwd32(ctx, layer, dqkv, dout, c->w_qkv, c->w_out, lse, B, T, gdocs);
}

/* ---- ring ----------------------------------------------------------------------------------- */

enum { TAG_KV = 101, TAG_DKV = 102 };

/* Lets MPI advance the messages in flight (non-blocking transfers progress only inside MPI
 * calls): called between the block computations of a step, so the exchange overlaps them
 * instead of running in the final wait. A completed request is freed and its slot cleared. */
static void poke(loom_comm_req **req, int n) {
    for (int i = 0; i < n; i++)
        if (req[i] && loom_comm_test(req[i])) req[i] = NULL;
}

/* the K|V columns of the local rows (B, T, 2 KD) */
static void pack_kv(const loom_cp *c, const float *qkv, float *kv, int64_t rows) {
    c->be->mem_d2d_rows(kv, (size_t)(2 * c->KD) * sizeof(float), qkv + c->HD,
                        (size_t)c->QKV * sizeof(float), (size_t)(2 * c->KD) * sizeof(float),
                        (size_t)rows);
}

/* The dims of one (query chunk qi, key chunk ki) block: c rows of the local queries against c
 * rows of a K|V buffer; out rows with stride o_bs per batch row. */
static loom_attn_dims ring_dims(const loom_cp *c, int B, int T, int64_t o_bs) {
    const int64_t half = T / 2;
    loom_attn_dims d = {.B = B, .Tq = (int)half, .Tk = (int)half, .H = c->H, .KVH = c->KVH,
                        .D = c->D};
    d.q_bs = (int64_t)T * c->QKV;
    d.q_ts = c->QKV;
    d.k_bs = d.v_bs = (int64_t)T * 2 * c->KD;
    d.k_ts = d.v_ts = 2 * c->KD;
    d.o_bs = o_bs;
    d.o_ts = c->HD;
    return d;
}

/* the global chunk of local chunk i (0 or 1) of cp rank r */
static int chunk_of(int P, int r, int i) { return i == 0 ? r : 2 * P - 1 - r; }

/* out/lse of query chunk qi (acc: rows of (B, T, HD), lse (B, H, half)) merged with a block's
 * (blk: (B, half, HD), blse (B, H, half)) by log-sum-exp */
static void merge(const loom_cp *c, float *out, float *lse, const float *blk, const float *blse,
                  int B, int T, int qi) {
    const int64_t half = T / 2;
    c->be->attn_lse_merge(out + qi * half * c->HD, lse, blk, blse, B, c->H, half, c->D,
                          (int64_t)T * c->HD);
}

/* lse layout of the ring (the model's B*H*T floats): query chunk qi's (B, H, T/2) at
 * qi * B*H*T/2 */
static float *chunk_lse(const loom_cp *c, const float *lse, int B, int T, int qi) {
    return (float *)lse + (int64_t)qi * B * c->H * (T / 2);
}

/* a block wholly in the causal future of its queries, or wholly before their windows */
static int block_unseen(const loom_attn_mask *mk, int64_t half) {
    return mk->k_pos0 > mk->q_pos0 ||
           (mk->window > 0 && mk->q_pos0 - (mk->k_pos0 + half - 1) >= mk->window);
}

/* the mask of query chunk qg against key chunk kg (global chunk numbers): causal (and the
 * layer's window) by their global positions, and with documents by the whole sequences' ids
 * at those positions */
static loom_attn_mask block_mask(const loom_cp *c, int layer, const int32_t *gdocs, int T,
                                 int qg, int kg) {
    const int64_t half = T / 2;
    loom_attn_mask mask = {.causal = 1, .q_pos0 = qg * half, .k_pos0 = kg * half};
    loom_model_attn_scores(c->m, layer, &mask);
    if (gdocs) {
        mask.q_doc = gdocs + qg * half;
        mask.k_doc = gdocs + kg * half;
        mask.q_doc_bs = mask.k_doc_bs = (int64_t)c->P * T;
    }
    return mask;
}

static void ring_forward(void *ctx, int layer, float *out, float *lse, const float *qkv, int B,
                         int T, const int32_t *gdocs) {
    loom_cp *c = ctx;
    const int P = c->P, r = c->r, next = (r + 1) % P, prev = (r + P - 1) % P;
    const int64_t half = T / 2, rows = (int64_t)B * T, n_kv = rows * 2 * c->KD;
    c->be->mem_set(out, 0, (size_t)(rows * c->HD) * sizeof(float));
    c->be->fill_float(lse, (int64_t)B * c->H * T, -INFINITY);
    pack_kv(c, qkv, c->kv[0], rows);
    const loom_attn_dims dims = ring_dims(c, B, T, half * c->HD);
    int cur = 0;
    for (int s = 0; s < P; s++) {
        const int src = (r - s + P) % P; /* whose K/V rows kv[cur] holds */
        loom_comm_req *req[2] = {NULL, NULL};
        if (s < P - 1) { /* the next block travels while this one is computed */
            req[0] = loom_isend(c->mesh, LOOM_GROUP_CP, c->kv[cur], (size_t)n_kv, LOOM_F32, next,
                                TAG_KV);
            req[1] = loom_irecv(c->mesh, LOOM_GROUP_CP, c->kv[1 - cur], (size_t)n_kv, LOOM_F32,
                                prev, TAG_KV);
        }
        for (int qi = 0; qi < 2; qi++)
            for (int ki = 0; ki < 2; ki++) {
                const int qg = chunk_of(P, r, qi), kg = chunk_of(P, src, ki);
                const loom_attn_mask mask = block_mask(c, layer, gdocs, T, qg, kg);
                if (block_unseen(&mask, half)) continue;
                const float *q = qkv + qi * half * c->QKV;
                const float *k = c->kv[cur] + ki * half * 2 * c->KD, *v = k + c->KD;
                LOOM_CHECK(c->be->flash_attention_forward(c->blk_out, c->blk_lse, q, k, v, &dims,
                                                          &mask) == 0);
                merge(c, out, chunk_lse(c, lse, B, T, qi), c->blk_out, c->blk_lse, B, T, qi);
                poke(req, 2);
            }
        if (s < P - 1) loom_comm_waitall(2, req, "ring attention K/V exchange");
        cur = 1 - cur;
    }
}

static void ring_backward(void *ctx, int layer, float *dqkv, const float *dout, const float *qkv,
                          const float *out, const float *lse, int B, int T,
                          const int32_t *gdocs) {
    loom_cp *c = ctx;
    const int P = c->P, r = c->r, next = (r + 1) % P, prev = (r + P - 1) % P;
    const int64_t half = T / 2, rows = (int64_t)B * T, n_kv = rows * 2 * c->KD;
    pack_kv(c, qkv, c->kv[0], rows);
    const loom_attn_dims dims = ring_dims(c, B, T, (int64_t)T * c->HD);
    /* dkv[0]: this step's contributions; dkv[1]: the accumulated gradient of the block (sent
     * on at the start of the next step, while that step computes); dkv_in: the accumulator
     * of the next block, arriving from the previous rank meanwhile */
    float *part = c->dkv[0], *acc = c->dkv[1], *in = c->dkv_in;
    int cur = 0;
    for (int s = 0; s < P; s++) {
        const int src = (r - s + P) % P;
        loom_comm_req *req[4] = {NULL, NULL, NULL, NULL};
        if (s < P - 1) {
            req[0] = loom_isend(c->mesh, LOOM_GROUP_CP, c->kv[cur], (size_t)n_kv, LOOM_F32, next,
                                TAG_KV);
            req[1] = loom_irecv(c->mesh, LOOM_GROUP_CP, c->kv[1 - cur], (size_t)n_kv, LOOM_F32,
                                prev, TAG_KV);
        }
        if (s > 0) { /* the previous block's gradient goes on; this block's comes in */
            req[2] = loom_isend(c->mesh, LOOM_GROUP_CP, acc, (size_t)n_kv, LOOM_F32, next, TAG_DKV);
            req[3] = loom_irecv(c->mesh, LOOM_GROUP_CP, in, (size_t)n_kv, LOOM_F32, prev, TAG_DKV);
        }
        c->be->mem_set(part, 0, (size_t)n_kv * sizeof(float));
        for (int qi = 0; qi < 2; qi++)
            for (int ki = 0; ki < 2; ki++) {
                const int qg = chunk_of(P, r, qi), kg = chunk_of(P, src, ki);
                const loom_attn_mask mask = block_mask(c, layer, gdocs, T, qg, kg);
                if (block_unseen(&mask, half)) continue;
                const int64_t qoff = qi * half * c->QKV, koff = ki * half * 2 * c->KD;
                const float *k = c->kv[cur] + koff;
                float *dk = part + koff;
                LOOM_CHECK(c->be->flash_attention_backward(
                               dqkv + qoff, dk, dk + c->KD, dout + qi * half * c->HD, qkv + qoff,
                               k, k + c->KD, out + qi * half * c->HD,
                               chunk_lse(c, lse, B, T, qi), &dims, &mask) == 0);
                poke(req, 4);
            }
        loom_comm_waitall(4, req, "ring attention K/V exchange (backward)");
        /* the block's gradient so far: what came with it (none at its first stop) + ours */
        if (s == 0) c->be->mem_d2d(acc, part, (size_t)n_kv * sizeof(float));
        else c->be->residual_forward(acc, in, part, n_kv);
        cur = 1 - cur;
    }
    /* after the last step each block's gradient is complete one rank before its owner: one
     * more hop home; `in` then holds this rank's own K/V gradient over every rank's queries */
    loom_comm_req *req[2];
    req[0] = loom_isend(c->mesh, LOOM_GROUP_CP, acc, (size_t)n_kv, LOOM_F32, next, TAG_DKV);
    req[1] = loom_irecv(c->mesh, LOOM_GROUP_CP, in, (size_t)n_kv, LOOM_F32, prev, TAG_DKV);
    loom_comm_waitall(2, req, "ring attention K/V gradients home");
    c->be->add_rows(dqkv + c->HD, c->QKV, in, 2 * c->KD, 2 * c->KD, rows);
}

/* ---- create ------------------------------------------------------------------------------- */

/* The floats of each scratch buffer loom_cp_create allocates for a view of tp heads and
 * B x T local rows (one table: the allocation and loom_cp_scratch_bytes read it). */
typedef struct cp_sizes {
    size_t send, qkv, out;        /* ulysses: send and recv; q|k|v and its gradient; out, dout */
    size_t kv, blk_out, blk_lse;  /* ring: K|V blocks (two, their gradients two, one more in) */
    size_t wide;                  /* bf16: the widened q|k|v and output rows */
} cp_sizes;

static cp_sizes cp_sizes_of(const loom_model_config *mc, int tp, int kind, int64_t B, int64_t T,
                            int bf16) {
    const int64_t D = loom_config_head_dim(mc), H = mc->n_head / (tp > 1 ? tp : 1),
                  KVH = mc->n_kv_head / (tp > 1 ? tp : 1);
    const size_t HD = (size_t)(H * D), KD = (size_t)(KVH * D), QKV = HD + 2 * KD;
    const size_t rows = (size_t)B * (size_t)T;
    cp_sizes z = {0};
    if (kind == LOOM_CPKIND_ULYSSES) {
        /* head-sharded tensors: P*T rows of width/P = the local rows' floats; the largest
         * exchange is backward's q|k|v, out and dout together */
        z.send = rows * (QKV + 2 * HD);
        z.qkv = rows * QKV;
        z.out = rows * HD;
    } else {
        z.kv = rows * 2 * KD;
        z.blk_out = rows / 2 * HD;
        z.blk_lse = (size_t)B * (size_t)H * (size_t)(T / 2);
    }
    if (bf16) z.wide = rows * (QKV + HD);
    return z;
}

size_t loom_cp_scratch_bytes(const loom_model_config *mc, int tp, int kind, int64_t B, int64_t T,
                             int bf16) {
    const cp_sizes z = cp_sizes_of(mc, tp, kind, B, T, bf16);
    return (2 * z.send + 2 * z.qkv + 2 * z.out + 5 * z.kv + z.blk_out + z.blk_lse + z.wide) *
           sizeof(float);
}

int loom_cp_create(loom_model *m, loom_mesh *mesh, int kind, int B, int T, loom_cp **out,
                   loom_err *err) {
    *out = NULL;
    const loom_model_config *mc = loom_model_get_config(m);
    const loom_model_layout *lay = loom_model_get_layout(m);
    const int P = loom_mesh_size(mesh, LOOM_GROUP_CP);
    if (lay->cp != P || lay->cp_rank != loom_mesh_rank(mesh, LOOM_GROUP_CP))
        return loom_errf(err, "context parallelism: the model view is cp rank %d of %d, the "
                              "mesh's cp group rank %d of %d", lay->cp_rank, lay->cp,
                         loom_mesh_rank(mesh, LOOM_GROUP_CP), P);
    if (kind != LOOM_CPKIND_ULYSSES && kind != LOOM_CPKIND_RING)
        return loom_errf(err, "context parallelism: unknown kind %d", kind);
    if (loom_cp_check(mc, lay->tp, P, kind, (int64_t)T * P, err)) return -1;
    loom_cp *c = loom_calloc(1, sizeof *c);
    c->m = m;
    c->mesh = mesh;
    c->kind = kind;
    c->P = P;
    c->r = lay->cp_rank;
    c->D = loom_config_head_dim(mc); /* model.arch.head_dim, else d_model / n_head */
    c->H = mc->n_head / lay->tp;
    c->KVH = mc->n_kv_head / lay->tp;
    c->HD = (int64_t)c->H * c->D;
    c->KD = (int64_t)c->KVH * c->D;
    c->QKV = c->HD + 2 * c->KD;
    c->be = loom_model_backend(m);
    const int bf16 = lay->precision == LOOM_PREC_BF16;
    const cp_sizes z = cp_sizes_of(mc, lay->tp, kind, B, T, bf16);
    const size_t f = sizeof(float);
    loom_attn_hook h = {.ctx = c};
    const loom_backend *be = c->be;
    if (kind == LOOM_CPKIND_ULYSSES) {
        c->send = be->mem_alloc(z.send * f, 0);
        c->recv = be->mem_alloc(z.send * f, 0);
        c->qkv_h = be->mem_alloc(z.qkv * f, 0);
        c->dqkv_h = be->mem_alloc(z.qkv * f, 0);
        c->out_h = be->mem_alloc(z.out * f, 0);
        c->dout_h = be->mem_alloc(z.out * f, 0);
        h.forward = ulysses_forward;
        h.backward = ulysses_backward;
    } else {
        for (int i = 0; i < 2; i++) {
            c->kv[i] = be->mem_alloc(z.kv * f, 0);
            c->dkv[i] = be->mem_alloc(z.kv * f, 0);
        }
        c->dkv_in = be->mem_alloc(z.kv * f, 0);
        c->blk_out = be->mem_alloc(z.blk_out * f, 0);
        c->blk_lse = be->mem_alloc(z.blk_lse * f, 0);
        h.forward = ring_forward;
        h.backward = ring_backward;
    }
    if (bf16) { /* the kind's fp32 attention behind the widening (bf16_forward/backward) */
        c->w_qkv = be->mem_alloc((size_t)B * (size_t)T * (size_t)c->QKV * f, 0);
        c->w_out = be->mem_alloc((size_t)B * (size_t)T * (size_t)c->HD * f, 0);
        c->fwd32 = h.forward;
        c->bwd32 = h.backward;
        h.forward = bf16_forward;
        h.backward = bf16_backward;
    }
    loom_model_set_attention(m, &h);
    *out = c;
    return 0;
}

void loom_cp_free(loom_cp *c) {
    if (!c) return;
    loom_model_set_attention(c->m, NULL);
    const loom_backend *be = c->be;
    be->mem_free(c->send);
    be->mem_free(c->recv);
    be->mem_free(c->qkv_h);
    be->mem_free(c->dqkv_h);
    be->mem_free(c->out_h);
    be->mem_free(c->dout_h);
    for (int i = 0; i < 2; i++) {
        be->mem_free(c->kv[i]);
        be->mem_free(c->dkv[i]);
    }
    be->mem_free(c->dkv_in);
    be->mem_free(c->blk_out);
    be->mem_free(c->blk_lse);
    be->mem_free(c->w_qkv);
    be->mem_free(c->w_out);
    free(c);
}
