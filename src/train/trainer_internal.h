/* Private to src/train: the trainer's state, shared by the loop (trainer.c), its config
 * (train_config.c) and its checkpoints (train_ckpt.c). */
#ifndef LOOM_TRAIN_INTERNAL_H
#define LOOM_TRAIN_INTERNAL_H

#include "loom/checkpoint.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/cp.h"
#include "loom/data.h"
#include "loom/model.h"
#include "loom/optim.h"
#include "loom/parallel.h"
#include "loom/schedule.h"
#include "loom/preference.h"
#include "loom/train.h"
#include "loom/windows.h"

/* the resolved training.*, data.*, eval.*, checkpoint.*, parallel.zero keys */
typedef struct settings {
    const char *run_dir, *train_dir, *val_dir;
    int shuffle, follow, check_replicas;
    int sp;                   /* parallel.sp: sequence parallelism (with tp > 1) */
    int64_t windows_per_doc, pad_id;
    int64_t steps, seed, B, T, accum, threads, log_every, eval_every, eval_batches;
    int64_t ckpt_every, zero, max_skipped;
    int64_t microbatches;     /* parallel.microbatches, 0 = auto (parallel.pp) */
    int pp_schedule;          /* parallel.pp_schedule: LOOM_PP_GPIPE / LOOM_PP_1F1B */
    int precision;            /* training.precision: loom_precision */
    double weight_decay, beta1, beta2, eps, grad_clip, peak_flops;
    loom_schedule sched;
} settings;

typedef struct trainer {
    settings s;
    loom_config *cfg;
    loom_model_config mc;
    loom_mesh *mesh;
    int dp_rank, dp_size, world_rank, world_size;
    int tp_rank, tp_size;     /* this rank in the tensor-parallel group */
    struct loom_tp *tp;       /* tensor parallelism's communication points (tp > 1), else NULL */
    struct loom_ep *ep;       /* expert parallelism's exchange (ep > 1), else NULL */
    double *moe_red;          /* this step's MoE routing statistics summed over dp (train_moe.c) */
    int64_t local_B;          /* B / dp: this rank's rows of each global batch */
    /* context parallelism (parallel.cp): this rank's chunks of each sequence */
    int cp_rank, cp_size, cp_kind;
    int64_t local_T;          /* T / cp: this rank's positions of each sequence */
    loom_group red_group;     /* where losses, token counts and gradients are summed: dp, or
                               * dp x cp with context parallelism */
    loom_cp *cp;              /* the attention hook (cp > 1) */
    int32_t *l_inp, *l_tgt;   /* (local_B, local_T) this rank's chunks (cp > 1) */
    int pp_rank, pp_size;     /* this rank's pipeline stage, and the stages */
    int64_t microbatches;     /* micro-batches per batch through the pipeline (resolved) */
    struct loom_pp *pp;       /* the pipeline (pp > 1 or microbatches > 1), else NULL */
    loom_model *model;
    loom_dp *dp;
    loom_dataset *train_ds, *val_ds;
    loom_loader *train_ld;    /* LM head: token samples */
    int classify;             /* classify head: labelled windows instead */
    loom_windows *train_w;
    int num_classes;          /* classes in the dataset (classify) */
    int32_t *g_inp, *g_tgt;   /* (B,T) the global batch; classify: g_tgt holds (B) labels */
    float *h_logits;          /* classify: (local_B, K) this rank's logits read back (accuracy) */
    int32_t *g_doc;           /* (B,T) its document ids (model.doc_mask), else NULL */
    int32_t *acc_inp, *acc_tgt, *acc_doc; /* (accum, ...) the step's micro-batches of g_inp,
                               * g_tgt, g_doc (grad_accum > 1, train_accum.c), else NULL */
    int64_t step;             /* steps completed (optimizer steps + skipped steps) */
    int64_t skipped_steps;    /* steps skipped for a non-finite loss or gradient norm, in all */
    int inject_nan;           /* LOOM_TEST_INJECT_NAN names this rank and step (a test hook) */
    char ckpt_root[4096];
    loom_run_data *run_data;  /* what data.train was tokenized with (and its classes) */
    double data_wait_s;       /* seconds this step spent getting batches (train_obs.c) */
    struct loom_lora *lora;   /* finetune.lora: the adapters (the dp engine is then frozen) */
    loom_optim_group lora_opt; /* the adapters as the optimizer's parameter group (moments) */
    float lora_clip;          /* clipping's factor for the coming step (finish -> step) */
    /* finetune.method (train_pref.c): sft (0, every field below unused) or a preference
     * method: the model runs 2 rows (chosen, rejected) per pair of local_B */
    loom_pref_opts pref;
    loom_model *ref;          /* DPO without LoRA: the frozen reference (starting weights) */
    float *pref_logp, *pref_w;/* (2 local_B, T) per-token log-probs, backward weights */
    double *pref_seq;         /* (7, 2 local_B) per-sequence sums, counts, scratch */
    loom_pref_metrics pref_mx;/* the last step's metrics, sums over the global batch */
    struct train_grpo *grpo;  /* finetune.method grpo (train_grpo.c), else NULL: the model runs
                               * G rows (completions) per prompt of local_B */
} trainer;


/* ---- the training engine: what one optimizer step of `loom train` runs -----------------
 * loom_train (trainer.c) and loom_train_engine (engine.c, what tests/reference/test_engine.py
 * drives) both set up and step through these three functions: there is no second copy. */

/* The mesh from parallel.* (data and tensor parallelism so far); fills dp/tp/world ranks and
 * local_B. */
int loom_trainer_build_mesh(trainer *t, loom_err *err);
/* The model (this rank's local_B rows) and the DP/ZeRO engine that owns its parameters,
 * gradients and AdamW moments (training.seed, beta1/beta2/eps, weight_decay, parallel.zero). */
int loom_trainer_create_engine(trainer *t, loom_err *err);
/* Fills t->g_inp / t->g_tgt with the next global micro-batch. */
typedef int (*loom_trainer_batch_fn)(trainer *t, void *ctx, loom_err *err);
/* One optimizer step: training.grad_accum micro-batches from next (all read first when
 * grad_accum > 1; forward on this rank's rows, backward with the loss scaled by 1 / (the
 * step's global valid targets, over every micro-batch and rank), the DP reductions),
 * the global gradient norm clipped to training.grad_clip, the lr of the schedule at t->step,
 * AdamW through the DP engine, unless the loss or the norm is not finite on any rank: then
 * *skipped = 1, t->skipped_steps++ and nothing is updated. Then t->step++. *loss: the step's
 * loss summed over its valid targets / their count (= one batch of grad_accum x batch_size
 * rows); *lr: the rate of the schedule; *grad_norm: the norm
 * before clipping. t->inject_nan (test hook) poisons this step's backward and is cleared.
 * Collective over the world. */
int loom_trainer_step(trainer *t, loom_trainer_batch_fn next, void *ctx, double *loss, double *lr,
                      float *grad_norm, int *skipped, loom_err *err);

/* Pipeline parallelism (src/train/train_pp.c), when t->pp is set: one optimizer step's
 * training.grad_accum batches, each cut into t->microbatches micro-batches through the stages
 * (backward scaled by 1 / (the step's global valid targets), the same gradient as one
 * process), *loss the step's loss (sum over its valid targets / their count); and the forward
 * of one batch for evaluation (the global mean loss, valid targets, correct predictions). */
int loom_trainer_pp_grads(trainer *t, loom_trainer_batch_fn next, void *ctx, double *loss,
                          loom_err *err);
double loom_trainer_pp_forward(trainer *t, int64_t *global_valid, int64_t *global_correct);

/* ---- gradient accumulation (train_accum.c) ----------------------------------------------
 * alloc (after g_inp/g_tgt/g_doc): the step's micro-batch buffers when grad_accum > 1; fetch:
 * reads the step's grad_accum global micro-batches from next and counts their valid targets
 * (targets >= 0 of the global batches: over every dp rank); use: micro-batch `micro` into
 * g_inp / g_tgt / g_doc. */
void loom_trainer_accum_alloc(trainer *t);
void loom_trainer_accum_free(trainer *t);
int loom_trainer_accum_fetch(trainer *t, loom_trainer_batch_fn next, void *ctx, int64_t *valid,
                             loom_err *err);
void loom_trainer_accum_use(trainer *t, int64_t micro);

/* ---- mixture of experts (train_moe.c) ---------------------------------------------------
 * setup: this rank's expert range into lay (ep from the mesh) and the routing-group check;
 * attach: the ep exchange on the created model; begin_step: resets the routing statistics;
 * reduce (collective over dp): sums them over the ranks; write (rank 0): moe_load.<layer>,
 * moe_aux_loss, moe_z_loss, moe_dropped_frac, moe_alltoall_s into the step's metrics line. */
struct loom_metrics;
int loom_trainer_moe_setup(trainer *t, loom_model_layout *lay, loom_err *err);
void loom_trainer_moe_attach(trainer *t);
void loom_trainer_moe_free(trainer *t);
void loom_trainer_moe_begin_step(trainer *t);
void loom_trainer_moe_reduce(trainer *t);
void loom_trainer_moe_write(const trainer *t, struct loom_metrics *mx);

/* Reads the keys of a config the schema has already checked into s; errors name
 * the key, its value and where it was set. */
int loom_trainer_read_settings(const loom_config *c, settings *s, loom_err *err);
/* the whole schema (train keys + model.* + parallel.*) */
const loom_config_key *loom_trainer_schema(int *n);

/* Collective over the world: every rank writes its pieces, rank 0 the trainer state and
 * config, then commits the step directory. */
int loom_trainer_save_checkpoint(trainer *t, loom_err *err);
/* Loads a complete step directory into the engine's storage and the loader. */
int loom_trainer_load_checkpoint(trainer *t, const char *dir, loom_err *err);

/* training.init_from (init_from.c): model.* keys from the source's config (keys the config
 * sets must agree where they shape a tensor), before the model config is read; then, for a
 * run that does not resume, the source's parameters into the engine (moments stay zero). */
int loom_trainer_init_from_config(loom_config *cfg, loom_err *err);
int loom_trainer_init_from_load(trainer *t, loom_err *err);

/* finetune.lora (train_lora.c; its keys: loom_lora_settings, loom/load.h): setup attaches the
 * adapters to the model and freezes the dp engine; finish sums their gradients over dp and
 * returns their global norm (the clipping factor kept for step); step runs the optimizer's
 * AdamW on them (loom/optim.h: the DP engine's norm, clipping and AdamW, over a parameter group
 * of their own); save/load handle lora.safetensors. */
int loom_trainer_lora_setup(trainer *t, loom_err *err);
void loom_trainer_lora_free(trainer *t);
/* micro >= 0: adapter dropout on for the coming forward/backward of micro-batch `micro` of
 * this step (keyed by the step and the row of this rank's first row among the step's rows);
 * micro < 0: off */
void loom_trainer_lora_micro(trainer *t, int64_t micro);
float loom_trainer_lora_finish(trainer *t);
void loom_trainer_lora_step(trainer *t, float lr);
int loom_trainer_lora_save(trainer *t, char **buf, size_t *len, loom_err *err);
int loom_trainer_lora_load(trainer *t, const loom_ckpt *ck, loom_err *err);

/* ---- preference optimization (train_pref.c) ---------------------------------------------
 * settings: finetune.method / beta / label_smoothing / gamma into o (errors name the key);
 * check (after the mesh): refuses what the preference step does not implement, naming the key;
 * setup (after LoRA): buffers and, for DPO without LoRA, the frozen reference model (the init
 * of training.seed and training.init_from's weights); grads: one step's batch, the reference
 * and policy forwards, the loss (*loss, the global mean over pairs) and the weighted backward;
 * write (rank 0): the step's preference metrics. */
int loom_trainer_pref_settings(const loom_config *c, loom_pref_opts *o, loom_err *err);
int loom_trainer_pref_check(const trainer *t, loom_err *err);
int loom_trainer_pref_setup(trainer *t, loom_err *err);
void loom_trainer_pref_free(trainer *t);
int loom_trainer_pref_grads(trainer *t, loom_trainer_batch_fn next, void *ctx, double *loss,
                            loom_err *err);
void loom_trainer_pref_write(const trainer *t, struct loom_metrics *mx);

/* The starting weights into t->ref (DPO's and GRPO's frozen reference): the init of
 * training.seed, then training.init_from's parameters when set. */
int loom_trainer_load_reference(trainer *t, loom_err *err);

/* ---- GRPO (train_grpo.c) -----------------------------------------------------------------
 * settings (finetune.method grpo: allocates t->grpo and reads finetune.*; errors name the
 * key); check (after the mesh): refuses what the GRPO step does not implement; rows: the rows
 * per prompt (G, or 1 without GRPO); setup (after LoRA): tokenizer, template, the rollout
 * engine on t->model, buffers, the reference for beta > 0; grads: one step (rollouts every
 * num_iterations steps, the loss, the weighted backward); write (rank 0): its metrics. */
int loom_trainer_grpo_settings(trainer *t, loom_err *err);
int loom_trainer_grpo_check(const trainer *t, loom_err *err);
int loom_trainer_grpo_rows(const trainer *t);
int loom_trainer_grpo_setup(trainer *t, loom_err *err);
void loom_trainer_grpo_free(trainer *t);
int loom_trainer_grpo_grads(trainer *t, loom_trainer_batch_fn next, void *ctx, double *loss,
                            loom_err *err);
void loom_trainer_grpo_write(const trainer *t, struct loom_metrics *mx);
/* checkpoints (grpo_ckpt.c): 1 when a checkpoint now is inside a rollout batch and holds it,
 * the file's name in *name; save (collective over the dp group; rank 0 gets the bytes); load
 * (after the step is restored; a checkpoint without the file: a warning when inside a batch) */
int loom_trainer_grpo_ckpt_file(const trainer *t, const char **name);
int loom_trainer_grpo_save(trainer *t, char **buf, size_t *len, loom_err *err);
struct loom_ckpt;
int loom_trainer_grpo_load(trainer *t, const struct loom_ckpt *ck, loom_err *err);

/* t->run_data from data.train; data.val must share its tokenizer (and classes). */
int loom_trainer_open_run_data(trainer *t, loom_err *err);
/* Resume: the checkpoint's record (data.json) must match t->run_data. */
int loom_trainer_check_run_data(const trainer *t, const loom_ckpt *ck, loom_err *err);

/* Refuses (an error naming the size keys) a layout whose estimated memory per node
 * (parameters, gradients, AdamW moments, activations, batch buffers of this rank, times the
 * ranks on the node) exceeds training.memory_limit: auto = MemAvailable and the cgroup
 * limit, off = no check, or a byte count. Collective over the world under MPI. */
int loom_trainer_check_memory(const trainer *t, loom_err *err);
/* MemAvailable (/proc/meminfo) and the memory limit of this process's cgroup (v2 memory.max,
 * or v1 memory.limit_in_bytes; 0 = none) under root ("" = the real file system). -1 when
 * neither is known. */
int loom_memory_limits(const char *root, uint64_t *avail, uint64_t *cgroup);

#endif
