/* loom import --hf / export --hf: Hugging Face directories (src/hf/) <-> loom checkpoints
 * (src/ckpt/checkpoint.c): the import writes step_0000000 with the parameters, config.yaml,
 * data.json and the tokenizer; the export loads a checkpoint (LoRA adapters merged or as
 * PEFT files) and writes the directory. docs/hf-interop.md. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/chat.h"
#include "loom/checkpoint.h"
#include "loom/ckpt_pieces.h"
#include "loom/config.h"
#include "loom/hf.h"
#include "loom/interop.h"
#include "loom/load.h"
#include "loom/lora.h"
#include "loom/parallel.h"
#include "loom/tokenizer.h"

/* The tokenizer an import records: (id, tokenizer.json text or NULL for bytes). */
static int import_tokenizer(const char *dir, const char *spec, int vocab, char **id,
                            char **json, size_t *json_len, loom_err *err) {
    char path[4200];
    loom_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    *id = NULL;
    *json = NULL;
    *json_len = 0;
    if (spec && !strcmp(spec, "byte")) {
        if (loom_tokenizer_byte(NULL, 0, &tok, err)) return -1;
    } else {
        if (spec) {
            if (loom_path_fmt(path, sizeof path, err, "%s", spec)) return -1;
        } else {
            if (loom_path_fmt(path, sizeof path, err, "%s/tokenizer.json", dir)) return -1;
            if (!loom_path_exists(path))
                return loom_errf(err, "%s: no tokenizer.json; give the tokenizer with "
                                      "--tokenizer FILE (a tokenizer.json) or --tokenizer byte",
                                 dir);
        }
        if (loom_read_file(path, (size_t)1 << 30, &text, &len, err) ||
            loom_tokenizer_load_json_text(text, len, path, &tok, err)) {
            free(text);
            return -1;
        }
    }
    int rc = -1;
    if (loom_tokenizer_vocab_size(tok) > (uint32_t)vocab) {
        loom_errf(err, "%s: the tokenizer has %u ids, more than the model's vocab_size %d",
                  spec ? spec : path, loom_tokenizer_vocab_size(tok), vocab);
        goto done;
    }
    if (loom_tokenizer_is_plain_bytes(tok)) {
        *id = loom_strdup("byte"); /* the byte-level file loom exports for byte models */
    } else {
        *id = loom_strdup(loom_tokenizer_id(tok));
        *json = loom_tokenizer_hf_json(tok); /* canonical: its id is the sha256 of this */
        *json_len = strlen(*json);
    }
    rc = 0;
done:
    free(text);
    loom_tokenizer_free(tok);
    return rc;
}

static int save_ckpt(const char *out_root, loom_model *m, const loom_config *cfg,
                 const loom_run_data *rd, const char *source, loom_err *err) {
    const int n_t = loom_model_num_tensors(m);
    loom_dp_piece *pieces = loom_calloc((size_t)n_t, sizeof *pieces);
    /* the parameters are the backend's memory: read back first where it is not host memory */
    float *hostp = loom_model_params_to_host(m);
    float *params = hostp ? hostp : loom_model_params(m);
    for (int i = 0; i < n_t; i++) {
        const loom_tensor_info *t = loom_model_tensor(m, i);
        pieces[i] = (loom_dp_piece){.kind = 0, .tensor = t, .begin = 0, .count = t->numel,
                                    .data = params + t->offset};
    }
    char *pbuf = NULL, *cbuf = NULL, *dbuf = NULL;
    size_t plen = 0;
    int rc = -1;
    if (loom_pieces_serialize(pieces, n_t, &pbuf, &plen, err)) goto done;
    char pname[64];
    loom_pieces_file_name(0, pname, sizeof pname);
    cbuf = loom_config_to_yaml(cfg);
    dbuf = loom_run_data_json(rd, source);
    loom_ckpt_file files[4] = {
        {pname, pbuf, plen},
        {"config.yaml", cbuf, strlen(cbuf)},
        {"data.json", dbuf, strlen(dbuf)},
        {"tokenizer.json", rd->tokenizer_json, rd->tokenizer_json_len},
    };
    rc = loom_ckpt_save(out_root, 0, files, rd->tokenizer_json ? 4 : 3, NULL, 0, err);
done:
    free(hostp);
    free(pieces);
    free(pbuf);
    free(cbuf);
    free(dbuf);
    return rc;
}

int loom_hf_import(const char *dir, const char *out_root, const loom_hf_import_opts *o,
                   loom_err *err) {
    loom_model_config mc;
    loom_model *m = NULL;
    loom_config *cfg = NULL;
    loom_run_data rd = {0};
    int rc = -1;
    if (loom_hf_read_config(dir, &mc, NULL, err)) return -1;
    if (import_tokenizer(dir, o ? o->tokenizer : NULL, mc.vocab_size, &rd.tokenizer_id,
                         &rd.tokenizer_json, &rd.tokenizer_json_len, err))
        goto done;
    loom_chat_template_from_hf_dir(dir, &rd.chat_template, &rd.chat_default_system); /* when recognized */
    if (loom_model_create_view(&mc, NULL, 1, 1, LOOM_MODEL_INFER, &m, err)) {
        loom_err_prefix(err, "%s/config.json", dir);
        goto done;
    }
    if (loom_hf_load_params(dir, m, err)) goto done;
    cfg = loom_config_new();
    loom_hf_config_set(cfg, &mc);
    char b[32];
    snprintf(b, sizeof b, "%d", mc.max_seq_len < 1024 ? mc.max_seq_len : 1024);
    loom_config_set(cfg, "training.seq_len", b, "hf import");
    int nk;
    const loom_config_key *keys = loom_train_schema(&nk);
    if (loom_config_apply_schema(cfg, keys, nk, err)) goto done;
    char source[4200];
    snprintf(source, sizeof source, "hf:%s", dir);
    rc = save_ckpt(out_root, m, cfg, &rd, source, err);
done:
    free(rd.tokenizer_id);
    free(rd.tokenizer_json);
    free(rd.chat_template);
    free(rd.chat_default_system);
    loom_config_free(cfg);
    loom_model_free(m);
    return rc;
}

int loom_hf_export(const char *ckpt, const char *out_dir, const loom_hf_export_opts *o,
                   loom_err *err) {
    loom_model *m = NULL;
    loom_config *cfg = NULL;
    loom_run_data *rd = NULL;
    loom_tokenizer *tok = NULL;
    int rc = -1;
    const uint64_t max_shard = o && o->max_shard_bytes ? o->max_shard_bytes : (uint64_t)2 << 30;
    loom_lora *lora = NULL;
    loom_chat_template *tpl = NULL;
    char *jinja = NULL;
    if (loom_load_model_lora(ckpt, 1, 0, &m, &cfg, &rd, o && o->merge_lora ? NULL : &lora, err))
        return -1;
    const loom_model_config *c = loom_model_get_config(m);
    if (c->head != LOOM_HEAD_LM) {
        loom_errf(err, "%s: a classifier (model.head = classify) has no Hugging Face causal-LM "
                       "layout to export to", ckpt);
        goto done;
    }
    if (loom_hf_export_check(c, err)) {
        loom_err_prefix(err, "%s", ckpt);
        goto done;
    }
    int eos = -1;
    /* the chat template: the caller's, else the one the checkpoint records */
    const char *spec = o && o->chat_template ? o->chat_template : rd->chat_template;
    if (spec) {
        if (loom_chat_template_load(spec, &tpl, err)) {
            loom_err_prefix(err, "%s", o && o->chat_template ? "--chat-template" : ckpt);
            goto done;
        }
        if (!(o && o->chat_template) && rd->chat_default_system && !tpl->default_system)
            tpl->default_system = loom_strdup(rd->chat_default_system);
        jinja = loom_chat_template_jinja(tpl);
    }
    if (loom_hf_dir_prepare(out_dir, err) || loom_run_data_tokenizer(rd, &tok, err) ||
        loom_hf_write_tokenizer(out_dir, tok, c->max_seq_len, jinja, &eos, err) ||
        loom_hf_write_model(out_dir, m, lora, eos, max_shard, err))
        goto done;
    rc = 0;
done:
    free(jinja);
    loom_chat_template_free(tpl);
    loom_tokenizer_free(tok);
    loom_lora_free(lora);
    loom_run_data_free(rd);
    loom_config_free(cfg);
    loom_model_free(m);
    return rc;
}
