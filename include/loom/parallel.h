/* loom data parallelism with ZeRO sharding.
 *
 * The engine owns the parameter, gradient and AdamW-moment storage of a model (created with
 * own_arenas = 0) and serves it to forward/backward through the model's unit hooks.
 * Every unit (embeddings, each layer, final block) is split over the dp ranks with
 * loom_split(unit_count, dp, rank): a rank owns one contiguous slice of every unit.
 *
 *   zero 0: full parameters, full gradients (all-reduced per unit as backward makes them
 *           ready), full moments; every rank applies the same update.
 *   zero 1: full parameters and gradients; moments only for the owned slices. Gradients are
 *           reduce-scattered per unit, the owned slices updated, parameters all-gathered.
 *   zero 2: as 1, but gradients are not kept whole: each unit's gradients accumulate in a
 *           bucket (embeddings and final block have their own, layers share two), which is
 *           reduce-scattered into the owned slices as soon as the unit is ready.
 *   zero 3: as 2, and parameters are kept only as owned slices: each unit is all-gathered
 *           into a buffer just before forward or backward reads it and dropped after.
 *
 * Gradients are plain sums over ranks: the caller scales each rank's loss by
 * 1 / (global valid tokens * micro-batches), so the sum is the global mean. */
#ifndef LOOM_PARALLEL_H
#define LOOM_PARALLEL_H

#include <stddef.h>
#include <stdint.h>
#include "loom/comm.h"
#include "loom/model.h"

typedef struct loom_dp loom_dp;

typedef struct loom_dp_memory {
    size_t param_bytes;   /* parameter storage: full, or owned slices + gather buffers */
    size_t grad_bytes;    /* gradient storage: full, or owned slices + buckets */
    size_t optim_bytes;   /* AdamW moments */
    size_t bf16_elems;    /* training.precision bf16: the bf16 weight copies' elements (2 bytes
                           * each, not in param_bytes): every parameter, or at ZeRO 3 the
                           * gather buffers' (each gathered unit rounded into its own);
                           * loom_dp_memory_usage: 0 for an fp32 model */
} loom_dp_memory;

/* Sets the model's hooks and allocates storage for the given stage. Parameters are
 * initialized from the counter-based init (seed), so every layout starts identically. */
int loom_dp_create(loom_model *m, loom_mesh *mesh, int zero, uint64_t seed, float beta1,
                   float beta2, float eps, float weight_decay, loom_dp **out, loom_err *err);
void loom_dp_free(loom_dp *dp);

/* Before each micro-batch's backward: last = 1 on the final micro-batch of a step (zero 0/1
 * reduce only then; zero 2/3 reduce every micro-batch). Zeroes gradients when first = 1. */
void loom_dp_begin_micro(loom_dp *dp, int first, int last);
/* After the last backward: completes the reductions, computes the global gradient norm,
 * clips to max_norm (> 0), returns the norm before clipping. Frozen (loom_dp_freeze: LoRA's
 * base): the gradients are neither reduced nor read, and it returns 0. */
float loom_dp_finish_grads(loom_dp *dp, float max_norm);
/* What other strategies add to loom_dp_finish_grads (pipeline parallelism: the tied
 * embedding's two copies, the norm over every stage). fn runs after the dp reductions have
 * completed and before the norm, on the reduced gradients (loom_dp_owned_grad). */
void loom_dp_set_grad_sync(loom_dp *dp, void (*fn)(void *ctx, loom_dp *dp), void *ctx);
/* Tensors this rank holds as a copy of another rank's (is_copy returns 1: the pipeline's last
 * stage's wte of a tied head) are left out of the gradient norm and of the checkpoint pieces
 * this rank writes (it still loads them); the norm is also summed over norm_group
 * (LOOM_GROUP_WORLD: no further group; the pipeline: LOOM_GROUP_PP). */
void loom_dp_set_copies(loom_dp *dp, loom_group norm_group,
                        int (*is_copy)(void *ctx, const loom_tensor_info *t), void *ctx);
/* The reduced gradient of tensor t this rank owns (valid between the reductions and the
 * update): elements [*begin, *begin + *count) of t's box; NULL when it owns none. */
float *loom_dp_owned_grad(loom_dp *dp, const loom_tensor_info *t, size_t *begin, size_t *count);
/* AdamW on the owned part, then (zero 1/2) all-gather the updated parameters. */
void loom_dp_step(loom_dp *dp, float lr);
int64_t loom_dp_optimizer_step(const loom_dp *dp);
void loom_dp_set_optimizer_step(loom_dp *dp, int64_t step);
void loom_dp_memory_usage(const loom_dp *dp, loom_dp_memory *out);
/* What loom_dp_create would allocate on dp rank dp_rank of dp_size at this ZeRO stage, for a
 * model (a layout from loom_model_create_layout is enough); equals loom_dp_memory_usage of
 * the created loom_dp. */
void loom_dp_memory_estimate(const loom_model *m, int dp_size, int dp_rank, int zero,
                             loom_dp_memory *out);
/* The same with expert parallelism: the routed experts' tensors (reduce_group EDP) are
 * sharded over the expert-data group (edp_size ranks, this one edp_rank), the rest over the
 * dp group, as loom_dp_create does. */
void loom_dp_memory_estimate_groups(const loom_model *m, int dp_size, int dp_rank, int edp_size,
                                    int edp_rank, int zero, loom_dp_memory *out);
/* 64-bit hash of the parameters this rank holds (all of them for zero 0-2, its slices for
 * zero 3): equal on every dp rank for zero 0-2 when the replicas are bit-identical. */
uint64_t loom_dp_param_hash(const loom_dp *dp);
/* Frozen parameters (LoRA fine-tuning trains adapters only): frees the AdamW moments; the
 * engine is never stepped, checkpoints hold its parameters and no moments, and memory usage
 * reports no optimizer state. */
void loom_dp_freeze(loom_dp *dp);

/* ---- checkpoint pieces -----------------------------------------------------------------
 * What this rank holds, tensor by tensor, as flat ranges [begin, begin + count) of the
 * tensor's elements: kind 0 = parameters, 1 = adam_m, 2 = adam_v. Replicated data (zero 0
 * parameters and moments, zero 1/2 parameters) is reported by dp rank 0 only, and a tensor a
 * tensor-parallel view holds whole (split_dim < 0) by tp rank 0 only. */
typedef struct loom_dp_piece {
    int kind;
    const loom_tensor_info *tensor;
    size_t begin, count;
    float *data;          /* count floats */
} loom_dp_piece;
/* Returns a malloc'd array of pieces (*n entries). */
loom_dp_piece *loom_dp_pieces(loom_dp *dp, int *n);
/* Everything this rank needs (its parameters, full or owned, and its moments), as pieces to
 * fill: same as loom_dp_pieces but for the data a rank must load, replicated data included. */
loom_dp_piece *loom_dp_needed(loom_dp *dp, int *n);
/* The pieces' data is device memory of the model's backend. For host code that reads or
 * writes it (checkpoints): on a backend whose memory is host memory (cpu) nothing happens and
 * NULL is returned; otherwise every piece's data is copied (the named read "checkpoint
 * pieces") into one host buffer, which is returned, and the pieces are pointed into it.
 * loom_dp_pieces_upload then copies such host pieces back over dev (the same pieces as
 * loom_dp_needed returned them, before staging). */
float *loom_dp_pieces_stage(const loom_dp *dp, loom_dp_piece *p, int n);
void loom_dp_pieces_upload(const loom_dp *dp, const loom_dp_piece *host,
                           const loom_dp_piece *dev, int n);

/* ---- process start-up ----------------------------------------------------------------
 * loom_comm_init, then the kernels' instruction-set level agreed over the world: each rank
 * chooses its level (loom_isa_init: detected, or LOOM_ISA) and all run the minimum, so replicas
 * stay bit-identical on nodes of different CPU types (rank 0 says when the ranks differ). A
 * LOOM_ISA one rank refuses fails every rank (that rank with its message), without a hang.
 * Without MPI it is loom_comm_init alone. Every program that runs ranks starts with it. */
int loom_parallel_start(int *argc, char ***argv, loom_err *err);

#endif
