/* Loading a trained model out of a checkpoint for inference (include/loom/load.h): below
 * train/, so that generate, serve, eval, synth and interop do not depend on the trainer. */
#include <stdlib.h>

#include "loom/checkpoint.h"
#include "loom/ckpt_pieces.h"
#include "loom/config.h"
#include "loom/lora.h"
#include "loom/model_config.h"
#include "loom/load.h"

int loom_load_model(const char *path, int B, int T_train, loom_model **out,
                    loom_config **cfg_out, loom_err *err) {
    return loom_load_model_ex(path, B, T_train, out, cfg_out, NULL, err);
}

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

/* A LoRA checkpoint (lora.safetensors): the adapters attached to m (*lora_out) or, when
 * lora_out is NULL, merged into m's parameters (W += alpha/r B A) and dropped. */
static int load_lora(const loom_ckpt *ck, const loom_config *cfg, loom_model *m,
                     loom_lora **lora_out, loom_err *err) {
    size_t len;
    const char *data = loom_ckpt_file_data(ck, "lora.safetensors", &len);
    if (!data) return 0;
    int rank;
    float alpha;
    unsigned targets;
    float dropout;
    loom_lora *l = NULL;
    char where[4300];
    snprintf(where, sizeof where, "%s/lora.safetensors", loom_ckpt_dir(ck));
    if (loom_lora_settings(cfg, loom_model_get_config(m)->arch.mlp == LOOM_MLP_GELU, &rank, &alpha, &targets,
                           &dropout, err))
        return loom_err_prefix(err, "%s/config.yaml", loom_ckpt_dir(ck));
    if (!rank)
        return loom_errf(err, "%s: adapters, but the checkpoint's config has finetune.lora.rank 0",
                         where);
    /* (dropout is recorded for the PEFT export; it is off outside training) */
    if (loom_lora_attach(m, rank, alpha, targets, 0, &l, err) ||
        loom_lora_set_dropout(l, dropout, 0, err) ||
        loom_lora_restore(l, data, len, where, NULL, NULL, err)) {
        loom_lora_free(l);
        return -1;
    }
    if (lora_out) {
        *lora_out = l;
        return 0;
    }
    loom_lora_merge(l, m, loom_model_params(m));
    loom_lora_free(l);
    return 0;
}

int loom_load_model_ex(const char *path, int B, int T_train, loom_model **out,
                       loom_config **cfg_out, loom_run_data **data_out, loom_err *err) {
    return loom_load_model_lora(path, B, T_train, out, cfg_out, data_out, NULL, err);
}

int loom_load_model_lora(const char *path, int B, int T_train, loom_model **out,
                         loom_config **cfg_out, loom_run_data **data_out, loom_lora **lora_out,
                         loom_err *err) {
    return loom_load_model_view(path, NULL, B, T_train, out, cfg_out, data_out, lora_out, err);
}

int loom_load_model_view(const char *path, const loom_model_layout *layout, int B, int T_train,
                         loom_model **out, loom_config **cfg_out, loom_run_data **data_out,
                         loom_lora **lora_out, loom_err *err) {
    char dir[4096], where[4200];
    loom_ckpt *ck = NULL;
    loom_config *cfg = NULL;
    loom_model *m = NULL;
    int rc = -1;
    if (loom_ckpt_resolve(path, dir, sizeof dir, err) || loom_ckpt_open_ex(dir, loom_pieces_is_file, &ck, err))
        return -1; /* the piece files are read by load_params: parameters only, one pass */
    size_t clen;
    const char *ctext = loom_ckpt_file_data(ck, "config.yaml", &clen);
    if (!ctext) {
        loom_errf(err, "%s: checkpoint lacks config.yaml", dir);
        goto done;
    }
    cfg = loom_config_new();
    loom_pathf(where, sizeof where, "%s/config.yaml", dir);
    int nkeys;
    const loom_config_key *keys = loom_train_schema(&nkeys);
    if (loom_config_load_string(cfg, ctext, where, err) ||
        loom_config_apply_schema(cfg, keys, nkeys, err))
        goto done;
    int64_t T, B_cfg;
    if (loom_config_get_int(cfg, "training.seq_len", &T, err) ||
        loom_config_get_int(cfg, "training.batch_size", &B_cfg, err))
        goto done;
    if (B <= 0) B = (int)B_cfg;
    loom_model_config mc;
    if (loom_model_config_from(cfg, (int)T, &mc, err)) goto done;
    /* inference: the parameters only (no gradients, no optimizer state; activations come with
     * the first forward, forward-only, and decoding needs none) */
    /* a view (tensor parallelism) takes its box of each tensor, whatever layout the
     * checkpoint was saved with */
    if (loom_model_create_view(&mc, layout, B, T_train ? (int)T : mc.max_seq_len,
                               LOOM_MODEL_INFER, &m, err)) {
        if (layout) loom_err_prefix(err, "%s", dir);
        goto done;
    }
    if (loom_pieces_load_params(ck, m, err)) goto done;
    if (load_lora(ck, cfg, m, lora_out, err)) goto done;
    if (data_out && loom_run_data_read(ck, cfg, data_out, err)) goto done;
    *out = m;
    m = NULL;
    if (cfg_out) {
        *cfg_out = cfg;
        cfg = NULL;
    }
    rc = 0;
done:
    loom_model_free(m);
    loom_config_free(cfg);
    loom_ckpt_close(ck);
    return rc;
}
