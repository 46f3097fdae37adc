/* training.init_from: a new run starts from the weights of a loom checkpoint or a Hugging Face
 * directory instead of the random init, with a fresh optimizer state and schedule. The model
 * config comes from the source; model.* keys the run's config sets explicitly must agree with
 * it where they shape a tensor (docs/finetune.md). */
#include <stdlib.h>
#include <string.h>

#include "loom/checkpoint.h"
#include "loom/ckpt_pieces.h"
#include "loom/hf.h"
#include "loom/model_config.h"
#include "loom/tokenizer.h"
#include "train/trainer_internal.h"

static const char *init_from_path(const loom_config *cfg) {
    const char *p = loom_config_get(cfg, "training.init_from");
    return p && *p ? p : NULL;
}

/* The source's model config (and, for a loom checkpoint, its resolved step directory). */
static int source_config(const char *src, loom_model_config *mc, loom_err *err) {
    if (loom_hf_is_dir(src)) return loom_hf_read_config(src, mc, NULL, err);
    char dir[4096], where[4200];
    loom_ckpt *ck = NULL;
    loom_config *c = NULL;
    int rc = -1;
    if (loom_ckpt_resolve(src, dir, sizeof dir, err)) goto done;
    if (loom_ckpt_open_ex(dir, loom_pieces_is_file, &ck, err)) goto done;
    size_t len;
    const char *text = loom_ckpt_file_data(ck, "config.yaml", &len);
    if (!text) {
        loom_errf(err, "%s: checkpoint lacks config.yaml", dir);
        goto done;
    }
    c = loom_config_new();
    loom_pathf(where, sizeof where, "%s/config.yaml", dir);
    int nk;
    const loom_config_key *keys = loom_trainer_schema(&nk);
    int64_t T;
    if (loom_config_load_string(c, text, where, err) ||
        loom_config_apply_schema(c, keys, nk, err) ||
        loom_config_get_int(c, "training.seq_len", &T, err) ||
        loom_model_config_from(c, (int)T, mc, err))
        goto done;
    rc = 0;
done:
    loom_config_free(c);
    loom_ckpt_close(ck);
    if (rc) loom_err_prefix(err, "training.init_from");
    return rc;
}

int loom_trainer_init_from_config(loom_config *cfg, loom_err *err) {
    const char *src = init_from_path(cfg);
    if (!src) return 0;
    loom_model_config mc;
    if (source_config(src, &mc, err)) return -1;
    char v[64];
    struct { const char *key; int shapes; } keys[] = {
        {"model.flavor", 1},  {"model.vocab_size", 1}, {"model.d_model", 1}, {"model.n_layer", 1},
        {"model.n_head", 1},  {"model.n_kv_head", 1},  {"model.d_ff", 1},
        /* GPT-2's learned positions make max_seq_len a shape; for Llama it is a limit */
        {"model.max_seq_len", loom_config_arch(&mc)->pos == LOOM_POS_LEARNED},
        {"model.norm_eps", 0}, {"model.rope_theta", 0}, {"model.head", 1},
        /* mixture of experts: the experts and the routing are the source's; capacity and the
         * router losses are training options (an HF source's: dropless, none) */
        {"model.moe.experts", 1}, {"model.moe.top_k", 1}, {"model.moe.every", 1},
        {"model.moe.shared_experts", 1}, {"model.moe.shared_d_ff", 1},
        {"model.moe.shared_gate", 1}, {"model.moe.capacity_factor", 0},
        {"model.moe.aux_loss_coef", 0}, {"model.moe.z_loss_coef", 0},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const char *k = keys[i].key;
        if (!strcmp(k, "model.flavor")) snprintf(v, sizeof v, "%s", loom_config_arch(&mc)->name);
        else if (!strcmp(k, "model.vocab_size")) snprintf(v, sizeof v, "%d", mc.vocab_size);
        else if (!strcmp(k, "model.d_model")) snprintf(v, sizeof v, "%d", mc.d_model);
        else if (!strcmp(k, "model.n_layer")) snprintf(v, sizeof v, "%d", mc.n_layer);
        else if (!strcmp(k, "model.n_head")) snprintf(v, sizeof v, "%d", mc.n_head);
        else if (!strcmp(k, "model.n_kv_head")) snprintf(v, sizeof v, "%d", mc.n_kv_head);
        else if (!strcmp(k, "model.d_ff")) snprintf(v, sizeof v, "%d", mc.d_ff);
        else if (!strcmp(k, "model.max_seq_len")) snprintf(v, sizeof v, "%d", mc.max_seq_len);
        else if (!strcmp(k, "model.norm_eps")) snprintf(v, sizeof v, "%.9g", (double)mc.norm_eps);
        else if (!strcmp(k, "model.rope_theta")) snprintf(v, sizeof v, "%.9g", (double)mc.rope_theta);
        else if (!strcmp(k, "model.moe.experts")) snprintf(v, sizeof v, "%d", mc.n_expert);
        else if (!strcmp(k, "model.moe.top_k")) snprintf(v, sizeof v, "%d", mc.n_expert ? mc.top_k : 2);
        else if (!strcmp(k, "model.moe.every")) snprintf(v, sizeof v, "%d", mc.n_expert ? mc.moe_every : 1);
        else if (!strcmp(k, "model.moe.shared_experts")) snprintf(v, sizeof v, "%d", mc.shared_experts);
        else if (!strcmp(k, "model.moe.shared_d_ff")) snprintf(v, sizeof v, "%d", mc.shared_d_ff);
        else if (!strcmp(k, "model.moe.shared_gate"))
            snprintf(v, sizeof v, "%s", mc.shared_gate ? "true" : "false");
        else if (!strcmp(k, "model.moe.capacity_factor")) snprintf(v, sizeof v, "%.9g", (double)mc.capacity_factor);
        else if (!strcmp(k, "model.moe.aux_loss_coef"))
            snprintf(v, sizeof v, "%.9g", mc.n_expert ? (double)mc.aux_loss_coef : 0.01);
        else if (!strcmp(k, "model.moe.z_loss_coef"))
            snprintf(v, sizeof v, "%.9g", mc.n_expert ? (double)mc.z_loss_coef : 0.001);
        else snprintf(v, sizeof v, "%s", mc.head == LOOM_HEAD_LM ? "lm" : "classify");
        const char *have = loom_config_get(cfg, k), *origin = loom_config_origin(cfg, k);
        const int user_set = have && origin && strcmp(origin, "default") != 0;
        if (!user_set) {
            loom_config_set(cfg, k, v, "training.init_from");
            continue;
        }
        if (!keys[i].shapes) continue; /* an override that fits the same weights */
        /* compare as numbers where they are numbers ("64" vs "64.0"), else as text */
        char *e1, *e2;
        const double a = strtod(have, &e1), b = strtod(v, &e2);
        const int same = (*e1 == 0 && *e2 == 0 && e1 != have) ? a == b : !strcmp(have, v);
        if (!same)
            return loom_errf(err, "config key '%s' = %s (%s), but training.init_from (%s) has "
                                  "%s: the weights would not fit; remove the key to take the "
                                  "source's", k, have, origin, src, v);
    }
    /* the source's features beyond its named descriptor (model.arch.*) */
    loom_arch_config_set(cfg, loom_config_arch(&mc), "training.init_from");
    return 0;
}

/* the tokenizer id a source records, or NULL when it does not tell */
static char *source_tokenizer_id(const char *src, const loom_run_data *rd) {
    if (rd) return loom_strdup(rd->tokenizer_id);
    char path[4200];
    loom_tokenizer *tok = NULL;
    if (loom_path_fmt(path, sizeof path, NULL, "%s/tokenizer.json", src) ||
        !loom_path_exists(path) || loom_tokenizer_load_json(path, &tok, NULL))
        return NULL;
    char *id = loom_strdup(loom_tokenizer_is_plain_bytes(tok) ? "byte" : loom_tokenizer_id(tok));
    loom_tokenizer_free(tok);
    return id;
}

int loom_trainer_init_from_load(trainer *t, loom_err *err) {
    const char *src = init_from_path(t->cfg);
    if (!src) return 0;
    loom_model *m = NULL;
    loom_run_data *rd = NULL;
    loom_dp_piece *need = NULL, *dev = NULL;
    float *src_host = NULL, *stage = NULL;
    char *tok_id = NULL;
    int rc = -1, n = 0;
    const int hf = loom_hf_is_dir(src);
    if (hf) {
        if (loom_model_create_view(&t->mc, NULL, 1, 1, LOOM_MODEL_INFER, &m, err) ||
            loom_hf_load_params(src, m, err))
            goto done;
    } else if (loom_load_model_ex(src, 1, 0, &m, NULL, &rd, err)) {
        goto done;
    }
    /* a model fine-tuned on data tokenized differently than it was trained would learn
     * garbage silently: refuse it when the source says which tokenizer it used */
    tok_id = source_tokenizer_id(src, rd);
    if (t->run_data && tok_id && !t->classify && strcmp(tok_id, t->run_data->tokenizer_id) != 0) {
        loom_errf(err, "training.init_from (%s) was trained with tokenizer %.16s, but data.train "
                       "(%s) was tokenized with %.16s: build the dataset with the source's "
                       "tokenizer.json", src, tok_id, t->run_data->where, t->run_data->tokenizer_id);
        goto done;
    }
    /* both models' parameters are device memory: where it is not host memory, the source's
     * are read back whole (loom_model_params_to_host) and the pieces staged */
    src_host = loom_model_params_to_host(m);
    const float *sp = src_host ? src_host : loom_model_params(m);
    need = loom_dp_needed(t->dp, &n);
    dev = loom_malloc((size_t)(n ? n : 1) * sizeof *need);
    if (n) memcpy(dev, need, (size_t)n * sizeof *need);
    stage = loom_dp_pieces_stage(t->dp, need, n);
    for (int i = 0; i < n; i++) {
        const loom_dp_piece *p = &need[i];
        if (p->kind != 0) continue; /* AdamW moments start at zero */
        const loom_tensor_info *ti = p->tensor;
        const loom_tensor_info *s = ti->layer < 0 ? loom_model_global(m, ti->kind)
                                                  : loom_model_layer_tensor(m, ti->layer, ti->kind);
        if (!s) {
            loom_errf(err, "training.init_from (%s) has no tensor '%s'", src, ti->name);
            goto done;
        }
        for (size_t k = 0; k < p->count; k++)
            p->data[k] = sp[s->offset + loom_tensor_global_index(ti, (int64_t)(p->begin + k))];
    }
    loom_dp_pieces_upload(t->dp, need, dev, n);
    rc = 0;
done:
    free(tok_id);
    free(src_host);
    free(stage);
    free(dev);
    free(need);
    loom_run_data_free(rd);
    loom_model_free(m);
    return rc;
}
