/* The trainer's checkpoints: per-rank pieces, the trainer state (step, optimizer step,
 * loader counters) and the config; loading onto any layout. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "loom/checkpoint.h"
#include "loom/ckpt_pieces.h"
#include "train/trainer_internal.h"

/* Each rank writes rank_RRRRR.safetensors with what it owns; rank 0 also writes the trainer
 * state and the config, and commits (manifest + COMPLETE) after everyone has written. */
int loom_trainer_save_checkpoint(trainer *t, loom_err *err) {
    const int W = t->world_size;
    /* rank 0's files after the pieces: trainer_state.json, config.yaml, data.json and, for a
     * BPE tokenizer, tokenizer.json */
    const int has_tok = t->run_data->tokenizer_json != NULL;
    const char *grpo_name = NULL; /* GRPO inside a rollout batch: the batch (grpo_ckpt.c) */
    const int has_grpo = loom_trainer_grpo_ckpt_file(t, &grpo_name);
    const int NF = W + 3 + has_tok + (t->lora != NULL) + has_grpo;
    char **names = loom_calloc((size_t)NF, sizeof *names);
    char dir[4200];
    char *buf = NULL, *state_buf = NULL, *cfg_buf = NULL, *data_buf = NULL, *gbuf = NULL;
    size_t glen = 0;
    loom_dp_piece *pieces = NULL;
    float *stage = NULL;
    int rc = -1, n = 0;
    for (int r = 0; r < W; r++) {
        names[r] = loom_malloc(64);
        loom_pieces_file_name(r, names[r], 64);
    }
    names[W] = loom_strdup("trainer_state.json");
    names[W + 1] = loom_strdup("config.yaml");
    names[W + 2] = loom_strdup("data.json");
    if (has_tok) names[W + 3] = loom_strdup("tokenizer.json");
    if (t->lora) names[W + 3 + has_tok] = loom_strdup("lora.safetensors");
    if (has_grpo) names[NF - 1] = loom_strdup(grpo_name);
    loom_pathf(dir, sizeof dir, "%s/step_%07lld", t->ckpt_root, (long long)t->step);
    int ok = 1;
    if (t->world_rank == 0)
        ok = loom_ckpt_prepare(t->ckpt_root, t->step, (const char *const *)names, NF, NULL, 0,
                               err) == 0;
    loom_barrier(t->mesh, LOOM_GROUP_WORLD);
    if (!ok) goto done;
    size_t len = 0;
    pieces = loom_dp_pieces(t->dp, &n);
    stage = loom_dp_pieces_stage(t->dp, pieces, n); /* (device memory: read back) */
    if (loom_pieces_serialize(pieces, n, &buf, &len, err) ||
        loom_ckpt_write_file(dir, names[t->world_rank], buf, len, err))
        goto done;
    /* (collective: every rank's rows gathered; rank 0 writes them below) */
    if (has_grpo && loom_trainer_grpo_save(t, &gbuf, &glen, err)) goto done;
    if (t->world_rank == 0) {
        char layout[256];
        json_t *loader;
        if (t->classify) {
            uint64_t ep, pos;
            loom_windows_get_state(t->train_w, &ep, &pos);
            loader = json_pack("{s:s, s:I, s:I}", "kind", "windows", "epoch", (json_int_t)ep,
                               "position", (json_int_t)pos);
        } else {
            char *ls = loom_loader_state_json(t->train_ld);
            loader = json_loads(ls, JSON_REJECT_DUPLICATES, NULL);
            free(ls);
        }
        LOOM_CHECK(loader != NULL);
        json_t *st = json_pack("{s:I, s:I, s:o, s:{s:I, s:s}, s:s, s:s, s:I}", "step",
                               (json_int_t)t->step, "optimizer_step",
                               (json_int_t)loom_dp_optimizer_step(t->dp), "loader", loader,
                               "rng", "seed", (json_int_t)t->s.seed, "kind",
                               "counter-based (stateless)", "loom_version", LOOM_VERSION,
                               "layout", loom_mesh_describe(t->mesh, layout, sizeof layout),
                               "zero", (json_int_t)t->s.zero);
        LOOM_CHECK(st != NULL);
        json_object_set_new(st, "skipped_steps", json_integer((json_int_t)t->skipped_steps));
        state_buf = json_dumps(st, JSON_INDENT(2) | JSON_SORT_KEYS);
        json_decref(st);
        cfg_buf = loom_config_to_yaml(t->cfg);
        data_buf = loom_run_data_json(t->run_data, t->s.train_dir);
        if (loom_ckpt_write_file(dir, names[W], state_buf, strlen(state_buf), err) ||
            loom_ckpt_write_file(dir, names[W + 1], cfg_buf, strlen(cfg_buf), err) ||
            loom_ckpt_write_file(dir, names[W + 2], data_buf, strlen(data_buf), err) ||
            (has_tok && loom_ckpt_write_file(dir, names[W + 3], t->run_data->tokenizer_json,
                                             t->run_data->tokenizer_json_len, err)))
            goto done;
        if (t->lora) { /* the adapters and their moments */
            char *lb = NULL;
            size_t ll = 0;
            const int lrc = loom_trainer_lora_save(t, &lb, &ll, err) ||
                            loom_ckpt_write_file(dir, names[W + 3 + has_tok], lb, ll, err);
            free(lb);
            if (lrc) goto done;
        }
        if (has_grpo && loom_ckpt_write_file(dir, names[NF - 1], gbuf, glen, err)) goto done;
    }
    loom_barrier(t->mesh, LOOM_GROUP_WORLD);
    if (t->world_rank == 0 &&
        loom_ckpt_commit(t->ckpt_root, t->step, (const char *const *)names, NF, NULL, 0, err))
        goto done;
    loom_barrier(t->mesh, LOOM_GROUP_WORLD);
    rc = 0;
done:
    for (int r = 0; r < NF; r++) free(names[r]);
    free(names);
    free(pieces);
    free(stage);
    free(buf);
    free(state_buf);
    free(cfg_buf);
    free(data_buf);
    free(gbuf);
    return rc;
}

static int json_get_int(json_t *obj, const char *key, int64_t *out, const char *where,
                        loom_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return loom_errf(err, "%s: '%s' missing or not a non-negative integer", where, key);
    *out = json_integer_value(v);
    return 0;
}

int loom_trainer_load_checkpoint(trainer *t, const char *dir, loom_err *err) {
    loom_ckpt *ck = NULL;
    json_t *st = NULL;
    loom_dp_piece *need = NULL, *dev = NULL;
    float *stage = NULL;
    int rc = -1, n = 0;
    char where[4200];
    if (loom_ckpt_open(dir, &ck, err)) return -1;
    size_t sl;
    const char *sb = loom_ckpt_file_data(ck, "trainer_state.json", &sl);
    if (!sb) {
        loom_errf(err, "%s: checkpoint lacks trainer_state.json", dir);
        goto done;
    }
    if (loom_trainer_check_run_data(t, ck, err)) goto done;
    if (t->lora && loom_trainer_lora_load(t, ck, err)) goto done;
    if (!t->lora && loom_ckpt_file_data(ck, "lora.safetensors", NULL)) {
        loom_errf(err, "%s: the checkpoint holds LoRA adapters, but finetune.lora.rank is 0: "
                       "resume with the run's finetune.lora settings", dir);
        goto done;
    }
    need = loom_dp_needed(t->dp, &n);
    dev = loom_malloc((size_t)(n ? n : 1) * sizeof *need);
    if (n) memcpy(dev, need, (size_t)n * sizeof *need);
    stage = loom_dp_pieces_stage(t->dp, need, n);
    if (loom_pieces_fill(ck, need, n, err)) goto done;
    loom_dp_pieces_upload(t->dp, need, dev, n);
    json_error_t je;
    loom_pathf(where, sizeof where, "%s/trainer_state.json", dir);
    st = json_loadb(sb, sl, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(st)) {
        loom_errf(err, "%s:%d: %s", where, je.line, st ? "not a JSON object" : je.text);
        goto done;
    }
    int64_t step = 0, ostep = 0;
    json_t *ld = json_object_get(st, "loader");
    if (json_get_int(st, "step", &step, where, err) ||
        json_get_int(st, "optimizer_step", &ostep, where, err))
        goto done;
    /* loom_ckpt_open has checked manifest.json's step against the directory's name */
    if (step != loom_ckpt_step(ck)) {
        loom_errf(err, "%s: 'step' is %lld, but its directory and manifest.json say step %lld; "
                       "the checkpoint is inconsistent", where, (long long)step,
                  (long long)loom_ckpt_step(ck));
        goto done;
    }
    if (ostep > step) {
        loom_errf(err, "%s: 'optimizer_step' %lld is larger than 'step' %lld", where,
                  (long long)ostep, (long long)step);
        goto done;
    }
    if (!json_is_object(ld)) {
        loom_errf(err, "%s: 'loader' missing or not an object", where);
        goto done;
    }
    if (t->classify) {
        int64_t ep = 0, pos = 0;
        if (json_get_int(ld, "epoch", &ep, where, err) || json_get_int(ld, "position", &pos, where, err))
            goto done;
        loom_windows_set_state(t->train_w, (uint64_t)ep, (uint64_t)pos);
    } else {
        char *ldtext = json_dumps(ld, JSON_COMPACT);
        int lrc = loom_loader_restore_json(t->train_ld, ldtext, err);
        free(ldtext);
        if (lrc) {
            loom_err_prefix(err, "%s: loader state", where);
            goto done;
        }
    }
    /* steps skipped for a non-finite loss (absent in older checkpoints: none) */
    int64_t skipped = 0;
    if (json_object_get(st, "skipped_steps") &&
        json_get_int(st, "skipped_steps", &skipped, where, err))
        goto done;
    if (skipped > step || ostep + skipped != step) {
        loom_errf(err, "%s: 'optimizer_step' %lld + 'skipped_steps' %lld should make 'step' %lld",
                  where, (long long)ostep, (long long)skipped, (long long)step);
        goto done;
    }
    /* informational fields (a resume may change the layout and the ZeRO stage) are still
     * checked: a checkpoint whose state has the wrong shape is not trusted */
    json_t *jz = json_object_get(st, "zero");
    if (jz && (!json_is_integer(jz) || json_integer_value(jz) < 0 || json_integer_value(jz) > 3)) {
        loom_errf(err, "%s: 'zero' must be an integer in [0, 3] (the ZeRO stage it was saved at)",
                  where);
        goto done;
    }
    static const char *const strs[] = {"layout", "loom_version"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(st, strs[i]);
        if (v && !json_is_string(v)) {
            loom_errf(err, "%s: '%s' must be a string", where, strs[i]);
            goto done;
        }
    }
    json_t *jr = json_object_get(st, "rng");
    if (jr && (!json_is_object(jr) || !json_is_integer(json_object_get(jr, "seed")))) {
        loom_errf(err, "%s: 'rng' must be an object with an integer 'seed'", where);
        goto done;
    }
    t->step = step;
    t->skipped_steps = skipped;
    loom_dp_set_optimizer_step(t->dp, ostep);
    if (loom_trainer_grpo_load(t, ck, err)) goto done; /* inside a rollout batch: the batch */
    rc = 0;
done:
    json_decref(st);
    free(need);
    free(dev);
    free(stage);
    loom_ckpt_close(ck);
    return rc;
}
