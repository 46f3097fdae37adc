/* loom_train_engine: the training engine of `loom train` (mesh, model, DP/ZeRO optimizer,
 * clipping, lr schedule, one optimizer step) driven with batches given by the caller instead
 * of a run directory and a dataset. It sets up and steps through the trainer's own functions
 * (loom_trainer_build_mesh, loom_trainer_create_engine, loom_trainer_step in trainer.c): what
 * tests/reference/test_engine.py compares with PyTorch is what `loom train` runs. */
#include "loom/train.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/lora.h"
#include "loom/model_config.h"
#include "loom/pp.h"
#include "loom/tp.h"
#include "train/trainer_internal.h"

struct loom_train_engine {
    trainer t;
    const int32_t *inputs, *targets; /* the step's micro-batches, while it runs */
    int64_t micro;                   /* the next one */
};

int loom_train_engine_create(loom_config *cfg, loom_train_engine **out, loom_err *err) {
    *out = NULL;
    int n_keys;
    const loom_config_key *keys = loom_trainer_schema(&n_keys);
    if (loom_config_apply_schema(cfg, keys, n_keys, err)) return -1;
    loom_train_engine *e = loom_calloc(1, sizeof *e);
    trainer *t = &e->t;
    t->cfg = cfg;
    if (loom_trainer_read_settings(cfg, &t->s, err) ||
        loom_model_config_from(cfg, (int)t->s.T, &t->mc, err))
        goto fail;
    if (t->s.T > t->mc.max_seq_len) {
        loom_errf(err, "config: training.seq_len %lld exceeds model.max_seq_len %d",
                  (long long)t->s.T, t->mc.max_seq_len);
        goto fail;
    }
    t->classify = t->mc.head == LOOM_HEAD_CLASSIFY;
    if (loom_trainer_build_mesh(t, err)) goto fail;
    if (t->s.threads > 0) omp_set_num_threads((int)t->s.threads);
    if (loom_trainer_create_engine(t, err)) goto fail;
    if (loom_trainer_lora_setup(t, err)) goto fail; /* finetune.lora: adapters, base frozen */
    const size_t BT = (size_t)t->s.B * (size_t)t->s.T;
    t->g_inp = loom_malloc(BT * sizeof(int32_t));
    t->g_tgt = loom_malloc(BT * sizeof(int32_t));
    loom_trainer_accum_alloc(t);
    *out = e;
    return 0;
fail:
    loom_train_engine_free(e);
    return -1;
}

void loom_train_engine_free(loom_train_engine *e) {
    if (!e) return;
    free(e->t.g_inp);
    free(e->t.g_tgt);
    loom_trainer_accum_free(&e->t);
    loom_trainer_lora_free(&e->t);
    loom_pp_free(e->t.pp);
    loom_dp_free(e->t.dp);
    loom_cp_free(e->t.cp);
    free(e->t.l_inp);
    free(e->t.l_tgt);
    free(e->t.h_logits);
    loom_model_free(e->t.model);
    loom_tp_free(e->t.tp);
    loom_trainer_moe_free(&e->t);
    loom_mesh_free(e->t.mesh);
    free(e);
}

/* loom_trainer_batch_fn: micro-batch e->micro of the caller's arrays */
static int given_batch(trainer *t, void *ctx, loom_err *err) {
    (void)err;
    loom_train_engine *e = ctx;
    const size_t BT = (size_t)t->s.B * (size_t)t->s.T;
    const size_t nt = t->classify ? (size_t)t->s.B : BT;
    memcpy(t->g_inp, e->inputs + (size_t)e->micro * BT, BT * sizeof(int32_t));
    memcpy(t->g_tgt, e->targets + (size_t)e->micro * nt, nt * sizeof(int32_t));
    e->micro++;
    return 0;
}

int loom_train_engine_step(loom_train_engine *e, const int32_t *inputs, const int32_t *targets,
                           double *loss, double *lr, double *grad_norm, loom_err *err) {
    trainer *t = &e->t;
    const int64_t V = t->mc.vocab_size, K = t->mc.num_classes;
    const size_t BT = (size_t)t->s.B * (size_t)t->s.T;
    const size_t nt = t->classify ? (size_t)t->s.B : BT;
    /* checked here: the model indexes its tables with these */
    for (size_t i = 0; i < (size_t)t->s.accum * BT; i++)
        if (inputs[i] < 0 || inputs[i] >= V)
            return loom_errf(err, "loom_train_engine_step: input token %lld = %d is outside "
                                  "[0, model.vocab_size = %lld)", (long long)i, inputs[i],
                             (long long)V);
    for (size_t i = 0; i < (size_t)t->s.accum * nt; i++) {
        const int64_t hi = t->classify ? K : V;
        if (targets[i] < -1 || targets[i] >= hi)
            return loom_errf(err, "loom_train_engine_step: target %lld = %d is outside [-1, %lld)",
                             (long long)i, targets[i], (long long)hi);
    }
    e->inputs = inputs;
    e->targets = targets;
    e->micro = 0;
    float norm = 0;
    int skipped = 0;
    const int rc = loom_trainer_step(t, given_batch, e, loss, lr, &norm, &skipped, err);
    *grad_norm = norm;
    e->inputs = e->targets = NULL;
    return rc;
}

int64_t loom_train_engine_steps_done(const loom_train_engine *e) { return e->t.step; }

int64_t loom_train_engine_skipped_steps(const loom_train_engine *e) { return e->t.skipped_steps; }

int64_t loom_train_engine_optimizer_step(const loom_train_engine *e) {
    return loom_dp_optimizer_step(e->t.dp);
}

int loom_train_engine_num_tensors(const loom_train_engine *e) {
    return loom_model_num_tensors(e->t.model);
}

const char *loom_train_engine_tensor_name(const loom_train_engine *e, int i) {
    if (i < 0 || i >= loom_model_num_tensors(e->t.model)) return NULL;
    return loom_model_tensor(e->t.model, i)->name;
}

size_t loom_train_engine_tensor_numel(const loom_train_engine *e, int i) {
    if (i < 0 || i >= loom_model_num_tensors(e->t.model)) return 0;
    return loom_model_tensor(e->t.model, i)->numel;
}

size_t loom_train_engine_read(loom_train_engine *e, int kind, int i, float *out) {
    if (i < 0 || i >= loom_model_num_tensors(e->t.model)) return 0;
    const loom_tensor_info *ti = loom_model_tensor(e->t.model, i);
    int n = 0;
    loom_dp_piece *p = loom_dp_needed(e->t.dp, &n);
    size_t got = 0;
    for (int k = 0; k < n; k++)
        if (p[k].kind == kind && p[k].tensor == ti) {
            loom_dev_read(loom_model_backend(e->t.model), out + p[k].begin, p[k].data,
                          p[k].count * sizeof(float), "engine tensor read (tests)");
            got += p[k].count;
        }
    free(p);
    return got;
}

struct loom_lora *loom_train_engine_lora(loom_train_engine *e) { return e->t.lora; }

size_t loom_train_engine_lora_read(loom_train_engine *e, int kind, float *out) {
    loom_lora *l = e->t.lora;
    if (!l || kind < 0 || kind > 3) return 0;
    const float *src[4] = {loom_lora_params(l), e->t.lora_opt.m, e->t.lora_opt.v,
                           loom_lora_grads(l)};
    const size_t n = loom_lora_num_params(l);
    float *h = loom_lora_to_host(l, src[kind]);
    memcpy(out, h, n * sizeof(float));
    free(h);
    return n;
}
