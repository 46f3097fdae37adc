/* LoRA fine-tuning in the trainer (finetune.lora.*): the base model's engine is frozen (no
 * optimizer state, never stepped), the adapters (include/loom/lora.h) are the one optimizer's
 * parameter group (include/loom/optim.h: the norm, clipping factor and AdamW the DP engine
 * uses), their moments device memory of the model's backend; their gradients are summed over
 * the data-parallel group (every rank holds all of them: they are small). Checkpoints carry
 * lora.safetensors (adapters and their moments). See docs/finetune.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/checkpoint.h"
#include "loom/lora.h"
#include "loom/optim.h"
#include "loom/safetensors.h"
#include "train/trainer_internal.h"

#define LORA_FILE "lora.safetensors"

int loom_trainer_lora_setup(trainer *t, loom_err *err) {
    int rank;
    float alpha;
    unsigned targets;
    float dropout;
    if (loom_lora_settings(t->cfg, loom_config_arch(&t->mc)->mlp == LOOM_MLP_GELU, &rank, &alpha, &targets, &dropout, err))
        return -1;
    if (!rank) return 0;
    if (dropout > 0 && t->pp)
        return loom_errf(err, "config key 'finetune.lora.dropout' = %g with parallel.microbatches "
                              "= %lld: adapter dropout is keyed by the global batch row, which "
                              "micro-batches through the pipeline engine do not pass on; use "
                              "training.grad_accum instead", (double)dropout,
                         (long long)t->microbatches);
    if (loom_lora_attach(t->model, rank, alpha, targets, (uint64_t)t->s.seed, &t->lora, err) ||
        loom_lora_set_dropout(t->lora, dropout, (uint64_t)t->s.seed, err))
        return -1;
    loom_dp_freeze(t->dp);
    const size_t n = loom_lora_num_params(t->lora);
    const loom_backend *be = loom_lora_backend(t->lora);
    t->lora_opt = (loom_optim_group){
        .be = be, .p = loom_lora_params(t->lora), .g = loom_lora_grads(t->lora),
        .m = be->mem_alloc(n * sizeof(float), 0), /* zeroed */
        .v = be->mem_alloc(n * sizeof(float), 0),
        .pb = loom_lora_bf16_params(t->lora), /* bf16 precision: the adapters' bf16 copy */
        .n = (int64_t)n, .decay = 1};
    t->lora_clip = 1.0f;
    if (t->world_rank == 0)
        loom_log("lora: rank %d, alpha %g, %zu adapter parameters (%.2f%% of %zu, frozen); "
                 "optimizer state %.2f MB (adapters only; full fine-tuning would hold %.2f MB)",
                 rank, (double)alpha, n, 100.0 * (double)n / (double)loom_model_num_params(t->model),
                 loom_model_num_params(t->model), 2.0 * (double)n * 4 / 1e6,
                 2.0 * (double)loom_model_num_params(t->model) * 4 / 1e6);
    return 0;
}

/* the adapters themselves belong to t->model (loom_model_free frees them) */
void loom_trainer_lora_free(trainer *t) {
    if (t->lora_opt.be) {
        t->lora_opt.be->mem_free(t->lora_opt.m);
        t->lora_opt.be->mem_free(t->lora_opt.v);
    }
    memset(&t->lora_opt, 0, sizeof t->lora_opt);
    t->lora = NULL;
}

void loom_trainer_lora_micro(trainer *t, int64_t micro) {
    /* keyed by the step, and the row in the step's grad_accum x batch_size rows: batch B x
     * accum a draws the masks of batch a*B, on any number of data-parallel ranks */
    loom_lora_dropout_key(t->lora, micro >= 0, (uint64_t)t->step,
                          micro * t->s.B + (int64_t)t->dp_rank * t->local_B);
}

float loom_trainer_lora_finish(trainer *t) {
    const loom_optim_group *o = &t->lora_opt;
    /* each rank's gradient is of its rows' (with context parallelism: its positions') share of
     * the global mean loss: the sum over the group the loss is reduced in is the mean (a
     * device buffer: the mesh opens the backend's window for it, loom_comm_set_device_window) */
    loom_allreduce_sum(t->mesh, t->red_group, o->g, (size_t)o->n, LOOM_F32);
    /* the one global-norm clip: the base weights are frozen, so the adapters are all the
     * gradient there is; the factor applies inside AdamW, as the DP engine's does */
    const double norm = sqrt(loom_optim_group_sum_squares(o));
    t->lora_clip = loom_optim_clip_scale(norm, (float)t->s.grad_clip);
    return (float)norm;
}

void loom_trainer_lora_step(trainer *t, float lr) {
    const int64_t step = loom_dp_optimizer_step(t->dp) + 1;
    const loom_adamw h = {(float)t->s.beta1, (float)t->s.beta2, (float)t->s.eps,
                          (float)t->s.weight_decay};
    /* adapters are matrices: the decoupled weight decay applies to all of them */
    loom_optim_group_step(&t->lora_opt, &h, lr, step, t->lora_clip);
    loom_dp_set_optimizer_step(t->dp, step);
}

/* ---- checkpoints: lora.safetensors (its format: src/ckpt/lora_file.c) ---------------------- */
int loom_trainer_lora_save(trainer *t, char **buf, size_t *len, loom_err *err) {
    return loom_lora_serialize(t->lora, t->lora_opt.m, t->lora_opt.v, buf, len, err);
}

int loom_trainer_lora_load(trainer *t, const loom_ckpt *ck, loom_err *err) {
    size_t len;
    const char *data = loom_ckpt_file_data(ck, LORA_FILE, &len);
    char where[4300];
    snprintf(where, sizeof where, "%s/%s", loom_ckpt_dir(ck), LORA_FILE);
    if (!data)
        return loom_errf(err, "%s: the checkpoint has no LoRA adapters, but finetune.lora.rank is "
                              "set (start a new run.dir with training.init_from to fine-tune it)",
                         where);
    return loom_lora_restore(t->lora, data, len, where, t->lora_opt.m, t->lora_opt.v, err);
}
