/* LoRA fine-tuning in the trainer (finetune.lora.*): the base model's engine is frozen (no
 * optimizer state, never stepped), the adapters (include/loom/lora.h) are trained with AdamW
 * on their own state; their gradients are summed over the data-parallel group (every rank
 * holds all of them: they are small), clipped by their own norm. Checkpoints carry
 * lora.safetensors (adapters and their moments). See docs/finetune.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/checkpoint.h"
#include "loom/lora.h"
#include "loom/safetensors.h"
#include "train/trainer_internal.h"

#define LORA_FILE "lora.safetensors"

int loom_lora_settings(const loom_config *cfg, int gelu_mlp, int *rank, float *alpha,
                       unsigned *targets, float *dropout, loom_err *err) {
    int64_t r;
    double a, drop;
    *rank = 0;
    if (loom_config_get_int(cfg, "finetune.lora.rank", &r, err)) return -1;
    if (r == 0) return 0;
    if (r < 0 || r > 4096)
        return loom_errf(err, "config key 'finetune.lora.rank' = %lld (%s): expected 0 (off) or "
                              "1..4096", (long long)r, loom_config_origin(cfg, "finetune.lora.rank"));
    if (loom_config_get_double(cfg, "finetune.lora.alpha", &a, err) ||
        loom_config_get_double(cfg, "finetune.lora.dropout", &drop, err))
        return -1;
    if (!(a > 0))
        return loom_errf(err, "config key 'finetune.lora.alpha' (%s) must be positive",
                         loom_config_origin(cfg, "finetune.lora.alpha"));
    if (!(drop >= 0 && drop < 1))
        return loom_errf(err, "config key 'finetune.lora.dropout' = %g (%s): expected a "
                              "probability in [0, 1)", drop,
                         loom_config_origin(cfg, "finetune.lora.dropout"));
    char **items = NULL;
    int n = 0;
    if (loom_config_get_list(cfg, "finetune.lora.targets", &items, &n, err)) return -1;
    unsigned bits = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const unsigned b = loom_lora_target_mask(items[i], gelu_mlp);
        if (!b)
            rc = loom_errf(err, "config key 'finetune.lora.targets' (%s): '%s' is not a target of "
                                "a %s model (q, k, v, o, %s; or PEFT's %s, all-linear)",
                           loom_config_origin(cfg, "finetune.lora.targets"), items[i],
                           gelu_mlp ? "GELU-MLP (gpt2)" : "gated-MLP",
                           gelu_mlp ? "fc, fc_proj" : "gate, up, down",
                           gelu_mlp ? "c_attn, c_proj, c_fc"
                                    : "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                      "down_proj, qkv_proj, gate_up_proj");
        bits |= b;
    }
    loom_config_free_list(items, n);
    if (rc) return -1;
    if (!bits) return loom_errf(err, "config key 'finetune.lora.targets' is empty");
    *rank = (int)r;
    *alpha = (float)a;
    *targets = bits;
    *dropout = (float)drop;
    return 0;
}

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
    t->lora_m = loom_alloc_aligned(n * sizeof(float));
    t->lora_v = loom_alloc_aligned(n * sizeof(float));
    memset(t->lora_m, 0, n * sizeof(float));
    memset(t->lora_v, 0, n * sizeof(float));
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
    free(t->lora_m);
    free(t->lora_v);
    t->lora = NULL;
}

void loom_trainer_lora_micro(trainer *t, int64_t micro) {
    /* keyed by the step, and the row in the step's grad_accum x batch_size rows: batch B x
     * accum a draws the masks of batch a*B, on any number of data-parallel ranks */
    loom_lora_dropout_key(t->lora, micro >= 0, (uint64_t)t->step,
                          micro * t->s.B + (int64_t)t->dp_rank * t->local_B);
}

float loom_trainer_lora_finish(trainer *t) {
    const size_t n = loom_lora_num_params(t->lora);
    float *g = loom_lora_grads(t->lora);
    /* each rank's gradient is of its rows' (with context parallelism: its positions') share of
     * the global mean loss: the sum over the group the loss is reduced in is the mean */
    loom_allreduce_sum(t->mesh, t->red_group, g, (int64_t)n, LOOM_F32);
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    const float norm = (float)sqrt(ss);
    if (t->s.grad_clip > 0 && norm > t->s.grad_clip && isfinite(norm)) {
        const float c = (float)(t->s.grad_clip / norm);
        for (size_t i = 0; i < n; i++) g[i] *= c;
    }
    return norm;
}

void loom_trainer_lora_step(trainer *t, float lr) {
    const int64_t step = loom_dp_optimizer_step(t->dp) + 1;
    const loom_backend *be = loom_model_backend(t->model);
    /* adapters are matrices: AdamW's decoupled weight decay applies to all of them */
    be->adamw_update(loom_lora_params(t->lora), loom_lora_grads(t->lora), t->lora_m, t->lora_v,
                     (int64_t)loom_lora_num_params(t->lora), lr, (float)t->s.beta1,
                     (float)t->s.beta2, (float)t->s.eps, (float)t->s.weight_decay, step, 1.0f);
    loom_dp_set_optimizer_step(t->dp, step);
}

/* ---- checkpoints: lora.safetensors -------------------------------------------------------- */
int loom_lora_serialize(loom_lora *l, const float *m, const float *v, char **buf, size_t *len,
                        loom_err *err) {
    const int nt = loom_lora_num_tensors(l);
    const int kinds = m ? 3 : 1;
    loom_st_tensor *ts = loom_calloc((size_t)nt * 3, sizeof *ts);
    char (*names)[96] = loom_calloc((size_t)nt * 3, sizeof *names);
    static const char *const kind[3] = {"param", "adam_m", "adam_v"};
    const float *src[3] = {loom_lora_params(l), m, v};
    int k = 0;
    for (int c = 0; c < kinds; c++)
        for (int i = 0; i < nt; i++) {
            const loom_lora_tensor *x = loom_lora_tensor_at(l, i);
            snprintf(names[k], sizeof names[k], "%s/%s", kind[c], x->name);
            ts[k] = (loom_st_tensor){names[k], src[c] + x->offset, 2, {x->rows, x->cols}};
            k++;
        }
    char rs[32], al[32], tg[32];
    snprintf(rs, sizeof rs, "%d", loom_lora_rank(l));
    snprintf(al, sizeof al, "%.9g", (double)loom_lora_alpha(l));
    snprintf(tg, sizeof tg, "%u", loom_lora_targets(l));
    const char *meta[] = {"format", "loom-lora-1", "rank", rs, "alpha", al, "targets", tg, NULL};
    const int rc = loom_safetensors_serialize(ts, k, meta, buf, len, err);
    free(ts);
    free(names);
    return rc;
}

int loom_lora_restore(loom_lora *l, const char *data, size_t len, const char *where, float *m,
                      float *v, loom_err *err) {
    loom_st_file *f = NULL;
    if (loom_safetensors_parse(data, len, where, &f, err)) return -1;
    int rc = -1;
    const char *fmt = loom_safetensors_metadata(f, "format");
    const char *rs = loom_safetensors_metadata(f, "rank"), *tg = loom_safetensors_metadata(f, "targets");
    if (!fmt || strcmp(fmt, "loom-lora-1") || !rs || !tg) {
        loom_errf(err, "%s: not a loom LoRA file (format loom-lora-1 with rank and targets)", where);
        goto done;
    }
    int64_t rank, targets;
    if (loom_parse_i64(rs, 1, INT32_MAX, &rank) || loom_parse_i64(tg, 0, UINT32_MAX, &targets)) {
        loom_errf(err, "%s: metadata rank '%s' / targets '%s' are not integers in range", where, rs,
                  tg);
        goto done;
    }
    if (rank != loom_lora_rank(l) || (unsigned)targets != loom_lora_targets(l)) {
        loom_errf(err, "%s: adapters of rank %s and targets %s, but finetune.lora asks for rank "
                       "%d and targets %u", where, rs, tg, loom_lora_rank(l), loom_lora_targets(l));
        goto done;
    }
    static const char *const kind[3] = {"param", "adam_m", "adam_v"};
    float *dst[3] = {loom_lora_params(l), m, v};
    for (int c = 0; c < (m ? 3 : 1); c++)
        for (int i = 0; i < loom_lora_num_tensors(l); i++) {
            const loom_lora_tensor *x = loom_lora_tensor_at(l, i);
            char name[96];
            snprintf(name, sizeof name, "%s/%s", kind[c], x->name);
            const int64_t shape[2] = {x->rows, x->cols};
            if (loom_safetensors_read_into(f, name, dst[c] + x->offset, 2, shape, err)) goto done;
        }
    rc = 0;
done:
    loom_safetensors_close(f);
    return rc;
}

int loom_trainer_lora_save(trainer *t, char **buf, size_t *len, loom_err *err) {
    return loom_lora_serialize(t->lora, t->lora_m, t->lora_v, buf, len, err);
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
    return loom_lora_restore(t->lora, data, len, where, t->lora_m, t->lora_v, err);
}
