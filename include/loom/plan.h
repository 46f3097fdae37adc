/* loom plan: the memory and step time of a 5D layout (dp x tp x pp x cp, ep carved from
 * dp x cp; ZeRO stage, sequence parallelism, pipeline schedule and micro-batches, recompute,
 * precision) on a cluster, computed from the config without allocating anything, and the
 * search over every valid layout. docs/plan.md.
 *
 * The memory of a rank is the trainer's own accounting, not a second estimator: the rank's
 * model view (loom_model_create_layout_view: its heads, columns, vocabulary rows, stage
 * layers, experts, sequence chunk), the DP/ZeRO engine's storage for it
 * (loom_dp_memory_estimate_groups) and the activation arenas its pipeline schedule keeps in
 * flight. `loom train` refuses a layout with the same numbers before it allocates
 * (src/train/train_memory.c calls loom_plan_rank_memory). The step time is a model: FLOPs at
 * a stated efficiency of the peak, each collective's bytes over the link it crosses, the
 * pipeline bubble. */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include <stdint.h>

#include "loom/base.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/model.h"

/* One layout: the parallel.* and training.* keys that shape a step. */
typedef struct loom_plan_layout {
    int dp, tp, pp, cp, ep;  /* degrees (>= 1); world = dp * tp * pp * cp */
    int zero;                /* parallel.zero, 0..3 */
    int sp;                  /* parallel.sp (tp > 1) */
    int pp_schedule;         /* LOOM_PP_GPIPE / LOOM_PP_1F1B */
    int cp_kind;             /* LOOM_CPKIND_ULYSSES / LOOM_CPKIND_RING */
    int64_t microbatches;    /* parallel.microbatches, 0 = auto (pp) */
    int64_t B, T, accum;     /* training.batch_size (global rows), seq_len, grad_accum */
    int recompute;           /* model.recompute (loom_recompute) */
    int bf16;                /* precision bf16: modeled only (loom trains in fp32 today) */
    int doc_mask;            /* model.doc_mask */
    int pairs;               /* rows per sample: 2 for a preference pair, G for a GRPO group
                              * (the trainer's), else 1 */
} loom_plan_layout;

/* Reads a run config's layout (parallel.*, training.batch_size/seq_len/grad_accum,
 * finetune.method; recompute and doc_mask from mc; dp = auto resolves against world when
 * world > 0, else 1). */
int loom_plan_layout_from_config(const loom_config *c, const loom_model_config *mc, int world,
                                 loom_plan_layout *out, loom_err *err);

/* The rules `loom train` enforces before it builds anything (the mesh's divisibility of heads,
 * layers, experts and sequence; batch rows per dp rank and micro-batch; sp, cp and MoE
 * limits). The error names the keys. */
int loom_plan_check(const loom_model_config *mc, const loom_plan_layout *L, loom_err *err);

/* Bytes one rank holds. arena = what the engine's arenas hold (parameters, gradients, AdamW
 * moments, activation arenas; with a pipeline each arena's input/target rows too): the
 * metrics' arena_bytes (+ pp_act_bytes under a pipeline). total adds the rest loom allocates by
 * size (RoPE tables, input rows, the trainer's batch buffers, communication scratch). */
typedef struct loom_plan_memory {
    double param, grad, optim;   /* parameters (fp32 masters; + bf16 copies), gradients,
                                  * AdamW moments, at the rank's ZeRO stage */
    double act;                  /* activation arenas: arenas x one micro-batch's */
    double act_rows;             /* their input/target (and document) rows */
    double rope, batch, comm;    /* RoPE tables, batch buffers, communication scratch
                                  * (context parallelism's rows and attention buffers) */
    double arena, total;
    int64_t arenas, rows, local_T;  /* arenas in flight, rows and positions of each */
    int stage;                   /* the rank's pipeline stage */
} loom_plan_memory;

/* The memory of world rank `rank` of the layout (check it first: loom_plan_check). */
int loom_plan_rank_memory(const loom_model_config *mc, const loom_plan_layout *L, int rank,
                          loom_plan_memory *out, loom_err *err);
/* The largest rank's (one rank per pipeline stage is enough: within a stage the dp rank 0
 * holds the largest ZeRO slices and tp, cp, ep ranks hold equal parts). */
int loom_plan_max_memory(const loom_model_config *mc, const loom_plan_layout *L,
                         loom_plan_memory *out, loom_err *err);

/* Inference: the KV cache of one sequence of model.max_seq_len positions on a rank of a
 * tensor-parallel group of tp (its key/value heads; a sliding layer keeps its window), as
 * loom_kv_cache_create allocates it (fp32; bf16: half), bytes. */
int loom_plan_kv_bytes(const loom_model_config *mc, int tp, int bf16, double *out, loom_err *err);

/* A machine: its accelerators (or CPU ranks) and links, from a hardware file
 * (data/hardware/NAME.yaml, docs/plan.md#hardware). */
typedef struct loom_plan_hw {
    char name[64];
    double peak_flops;      /* per device, at the precision planned: bf16 dense tensor (GPUs),
                             * fp32 GEMM (CPU: `loom peak`'s measurement per rank) */
    double peak_fp32;       /* per device, fp32 (tf32 on GPUs) */
    double peak_bf16;
    double efficiency;      /* the fraction of the peak the training step's FLOPs reach */
    double mem_bytes;       /* per device (HBM; CPU: the node's memory shared by its ranks) */
    double mem_bw;          /* HBM bandwidth, bytes/s (reported only) */
    double intra_bw;        /* per device, one direction, inside a node (NVLink; CPU: MPI over
                             * shared memory, measured), bytes/s */
    double inter_bw;        /* per device, one direction, between nodes (NIC), bytes/s */
    double latency_s;       /* per collective step */
    int per_node;           /* devices (ranks) per node */
    int shared_memory;      /* 1: a node's ranks share mem_bytes (CPU), 0: each has its own */
    int nodes;              /* nodes in the cluster (0: as many as the ranks need) */
    int peak_measured, mem_measured; /* the file says "measured": fill in before use */
    char source[256];       /* where the figures come from (the datasheet) */
    char cuda_names[160];   /* the CUDA device names this file is (its own key, "" if none) */
    double peak_fp32_simt;  /* GPUs: fp32 without tensor cores (0: not given) */
} loom_plan_hw;

/* Reads a hardware file (unknown keys refused, naming the file and key; `base: NAME` starts
 * from another hardware file). peak_fp32: measured (the CPU file) sets peak_measured and
 * mem_bytes: measured sets mem_measured: the caller fills them in (`loom plan` with `loom
 * peak`'s figure for this machine and its physical memory). */
int loom_plan_hw_load(const char *path, loom_plan_hw *out, loom_err *err);
/* The hardware file of a name (h100, h100-sxm, h200, b200, a100, cpu): $LOOM_HW_DIR, else the
 * data/hardware/ of loom's source tree. path gets the file's path. */
int loom_plan_hw_find(const char *name, char *path, size_t size, loom_err *err);
/* The hardware file whose cuda_names list the CUDA device name `device` (first in file-name
 * order): 0 with it loaded (path: its path), 1 when no file names the device, -1 on error. */
int loom_plan_hw_for_device(const char *device, loom_plan_hw *out, char *path, size_t size,
                            loom_err *err);

/* A step's time (seconds), by part. */
typedef struct loom_plan_time {
    double flops_rank;          /* FLOPs the busiest rank runs per step (recompute included) */
    double compute;             /* flops_rank / (peak x efficiency) */
    double dp_comm, dp_exposed; /* gradient reduce-scatter / all-reduce (+ ZeRO-3 gathers);
                                 * what backward does not hide */
    double tp_comm, cp_comm, ep_comm, pp_comm; /* not overlapped */
    double bubble;              /* pipeline fill and drain: (pp - 1) / m of the stage's work */
    double step;                /* the sum of the exposed parts */
    double tokens_per_s;        /* B x T x accum / step */
    double mfu;                 /* model FLOPs (no recompute) / (world x peak x step) */
    int dp_inter, tp_inter, cp_inter, ep_inter, pp_inter; /* 1: the group crosses nodes */
} loom_plan_time;

int loom_plan_step_time(const loom_model_config *mc, const loom_plan_layout *L,
                        const loom_plan_hw *hw, loom_plan_time *out, loom_err *err);

/* One candidate of a search. */
typedef struct loom_plan_entry {
    loom_plan_layout layout;
    loom_plan_memory mem;   /* the largest rank's */
    loom_plan_time time;
    double need;            /* bytes a device (CPU: a node) must hold */
    int fits;
} loom_plan_entry;

/* Every valid layout of `world` ranks for the model and the base layout's batch (B, T,
 * accum, doc_mask and precision kept; degrees, zero, sp, schedule, micro-batches and
 * recompute varied), ranked: those that fit first, by tokens/s. *out malloc'd, *n entries. */
int loom_plan_search(const loom_model_config *mc, const loom_plan_layout *base, int world,
                     const loom_plan_hw *hw, loom_plan_entry **out, int *n, loom_err *err);
/* The bytes a device must hold for a rank (CPU: shared_memory, the node's ranks' sum) and
 * whether that fits (hw->mem_bytes; 0 = unknown: fits). */
int loom_plan_fits(const loom_plan_hw *hw, const loom_plan_layout *L, const loom_plan_memory *m,
                   double *need);

#endif
