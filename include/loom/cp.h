/* loom context parallelism (parallel.cp, parallel.cp_kind): one sequence split over the ranks
 * of the mesh's cp group (docs/context-parallel.md).
 *
 * Causal load balancing: a sequence of T positions is cut into 2 * cp equal chunks; cp rank i
 * holds chunks i and 2 * cp - 1 - i (its model view, loom_model_layout.cp / cp_rank, has T / cp
 * rows per sequence, positions from the chunks' global ones), so every rank does the same
 * amount of causal attention work. Everything but attention is per token and runs on the local
 * rows unchanged; attention goes through the model's attention hook:
 *   ulysses: all-to-all from sequence shards (T / cp rows, all heads) to head shards (all T
 *            rows, H / cp query and KVH / cp key/value heads), local flash attention, and the
 *            all-to-all back (n_head and n_kv_head divisible by cp);
 *   ring:    each rank keeps its query rows; the K/V rows of every rank pass around the ring
 *            (non-blocking send/recv of the next block while the current one is computed),
 *            partial outputs merged by their log-sum-exp; backward passes dK/dV around with
 *            them and home at the end; (query chunk, key chunk) pairs wholly in the causal
 *            future are skipped.
 * Gradients of the (replicated) parameters are partial sums over the cp ranks: data
 * parallelism reduces them over dp x cp (LOOM_GROUP_DPCP), and the loss and token counts are
 * summed there too. */
#ifndef LOOM_CP_H
#define LOOM_CP_H

#include <stdint.h>
#include "loom/base.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/model.h"

typedef enum loom_cp_kind { LOOM_CPKIND_ULYSSES = 0, LOOM_CPKIND_RING = 1 } loom_cp_kind;

/* parallel.cp_kind (ulysses | ring) for a config schema */
extern const loom_config_key loom_cp_config_keys[];
extern const int loom_cp_config_nkeys;

/* Reads parallel.cp_kind (absent: ulysses); an unknown value is an error naming the key. */
int loom_cp_kind_from_config(const loom_config *c, int *kind, loom_err *err);
const char *loom_cp_kind_name(int kind);

/* Whether (model, cp, kind, global sequence length T) can run: T divisible by 2 * cp; for
 * ulysses n_head and n_kv_head (of a tensor-parallel view: H / tp, KVH / tp) divisible by cp;
 * flash attention and the lm head. Errors name the keys. cp = 1 is always fine. */
int loom_cp_check(const loom_model_config *mc, int tp, int cp, int kind, int64_t T,
                  loom_err *err);

typedef struct loom_cp loom_cp;

/* The bytes of the scratch buffers loom_cp_create allocates for a view of a tensor-parallel
 * group of tp (its heads) with B x T local rows (0 at cp = 1 is the caller's business). */
size_t loom_cp_scratch_bytes(const loom_model_config *mc, int tp, int kind, int64_t B, int64_t T,
                             int bf16);

/* Installs the attention hook of `kind` on m (a view with layout cp = the mesh's cp group size
 * and cp_rank = this rank's), with scratch for up to B x T local rows. The hook communicates on
 * the cp group: every rank of the group runs the same layers in the same order. */
int loom_cp_create(loom_model *m, loom_mesh *mesh, int kind, int B, int T, loom_cp **out,
                   loom_err *err);
/* Removes the hook from the model and frees. NULL is a no-op. */
void loom_cp_free(loom_cp *c);

/* This cp rank's rows of B global sequences (B, T): chunks rank and 2 * cp - 1 - rank of each
 * (T divisible by 2 * cp) into local (B, T / cp). */
void loom_cp_local_rows(int cp, int rank, const int32_t *global, int32_t *local, int B,
                        int64_t T);

#endif
