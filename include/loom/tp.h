/* loom tensor parallelism (Megatron): what the model's named communication points do when
 * parallel.tp > 1 (docs/parallelism.md).
 *
 * A model view of tp rank r holds H/tp query heads, KVH/tp kv heads and F/tp feed-forward
 * columns of every layer (include/loom/model.h, views). Column-parallel linears (q|k|v;
 * fc or gate|up) take the whole (replicated) input and give this rank's columns; row-parallel
 * linears (attn_proj, fc_proj) take this rank's columns and give a partial sum of the whole
 * output. The points:
 *
 *   COL_IN   forward: identity            backward: all-reduce (sum) of the input gradient
 *   ROW_OUT  forward: all-reduce (sum)    backward: identity
 *   VOCAB_MAX / VOCAB_SUM  forward: all-reduce max / sum (vocab-parallel cross-entropy)
 *   VOCAB_GATHER  forward (decoding, through move): all-gather of the views' logits
 *
 * The embedding and the head are vocab-parallel (wte / lm_head split by rows): the embedding's
 * partial output goes through ROW_OUT, the head's input through COL_IN, and the loss is
 * computed from the reduced per-row statistics without gathering the logits.
 *
 * over the mesh's tp group, every other point a no-op. Collectives are the checked ones of
 * include/loom/comm.h (the mesh's timeout applies, a missing rank is named). */
#ifndef LOOM_TP_H
#define LOOM_TP_H

#include <stdint.h>

#include "loom/comm.h"
#include "loom/model.h"

typedef struct loom_tp loom_tp;

/* The tensor-parallel context of this rank in `mesh` (its tp group). */
loom_tp *loom_tp_create(loom_mesh *mesh);
void loom_tp_free(loom_tp *tp);

/* The loom_comm_points callback (ctx = the loom_tp). */
void loom_tp_point(void *ctx, int point, int dir, int layer, int site, float *buf, int64_t n);
/* The loom_comm_points move callback (sequence parallelism, model layout sp): COL_IN forward
 * and ROW_OUT backward all-gather the tp ranks' row shards (in, n_in) into the whole rows
 * (out, n_out = tp * n_in); COL_IN backward and ROW_OUT forward reduce-scatter the whole rows'
 * partial sums into this rank's shard. Same bytes as the all-reduce they replace. Decoding's
 * VOCAB_GATHER (forward) all-gathers the views' padded logits the same way. elem: the
 * elements' bytes, 4 (fp32) or 2 (bf16 bits, gathers only: a bf16 reduce-scatter stops the
 * run; bf16 partial sums are reduced in fp32). */
void loom_tp_move(void *ctx, int point, int dir, int layer, int site, const void *in,
                  int64_t n_in, void *out, int64_t n_out, size_t elem);
/* {tp, loom_tp_point, loom_tp_move}: what loom_model_set_comm_points takes. */
loom_comm_points loom_tp_comm_points(loom_tp *tp);

/* Seconds spent in the tp collectives of the points and their calls since the last reset. */
double loom_tp_comm_seconds(const loom_tp *tp);
int64_t loom_tp_comm_calls(const loom_tp *tp);
void loom_tp_stats_reset(loom_tp *tp);

#endif
