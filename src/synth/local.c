/* loom synth: the local generator (a loom checkpoint through the batched engine). */
#define _GNU_SOURCE
#include "synth/synth_internal.h"


#include "loom/load.h"

void synth_local_generate(pipeline *P, local_gen *L, item **items, int n) {
    int64_t *ids = loom_calloc((size_t)n, sizeof *ids);
    loom_gen_params gp = loom_gen_params_default();
    gp.max_tokens = P->g.max_tokens;
    gp.temperature = (float)P->g.temperature;
    gp.top_p = (float)P->g.top_p;
    gp.top_k = P->g.top_k;
    gp.stop = (const char *const *)P->g.stop;
    gp.n_stop = P->g.n_stop;
    gp.grammar = P->g.grammar; /* generator.json_schema */
    const int T = loom_model_get_config(L->m)->max_seq_len;
    for (int i = 0; i < n; i++) {
        /* the prompt's end, leaving room for a token; the engine stops at the context */
        gp.seed = item_seed(P->seed, items[i]);
        loom_err e2 = {{0}};
        char *chat = NULL, *eot = NULL, why[256];
        if (P->g.chat_tpl) { /* a user message, as the server renders /v1/chat/completions */
            json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", items[i]->prompt);
            if (!msgs || loom_chat_prompt_messages(P->g.chat_tpl, msgs, &chat, &eot, why, sizeof why))
                loom_errf(&e2, "chat prompt: %s", msgs ? why : "not UTF-8");
            json_decref(msgs);
            free(eot);
        }
        const char *pt = chat ? chat : items[i]->prompt;
        if (e2.msg[0] || loom_engine_submit_text(L->eng, L->tok, pt, strlen(pt), T - 1, &gp, NULL,
                                                 NULL, &ids[i], NULL, &e2)) {
            items[i]->gen_ok = 0;
            snprintf(items[i]->gen_err, sizeof items[i]->gen_err, "%.1000s", e2.msg);
            ids[i] = -1;
        }
        free(chat);
    }
    while (loom_engine_step(L->eng) > 0) {}
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0) continue;
        const char *text;
        size_t len;
        int ntok;
        LOOM_CHECK(loom_engine_result(L->eng, ids[i], NULL, &ntok, &text, &len, NULL) == 0);
        items[i]->text = loom_malloc(len + 1);
        memcpy(items[i]->text, text, len);
        items[i]->text[len] = 0;
        items[i]->tlen = len;
        items[i]->tokens = ntok;
        items[i]->gen_ok = 1;
        loom_engine_release(L->eng, ids[i]);
    }
    free(ids);
}

/* the local generator, loaded on first use */
int synth_local_open(pipeline *P, local_gen *L, loom_err *err) {
    if (L->eng) return 0;
    loom_run_data *run = NULL;
    /* with --tp this rank's view (docs/inference.md), stepped with its tp group */
    const loom_model_layout lay = {.tp = L->tp, .tp_rank = L->tp_rank};
    if (loom_load_model_view(P->g.checkpoint, L->tp > 1 ? &lay : NULL, 1, 0, &L->m, NULL, &run,
                             NULL, err) ||
        loom_run_data_tokenizer(run, &L->tok, err)) {
        loom_run_data_free(run);
        return -1;
    }
    loom_run_data_free(run);
    if (L->tp > 1) loom_model_set_comm_points(L->m, &L->tp_points);
    if (P->g.bf16 && !P->g.cbf16 && loom_model_set_weights_bf16(L->m, err)) return -1;
    if (P->g.int8 && loom_model_set_weights_int8(L->m, err)) return -1;
    if (P->g.int4 && loom_model_set_weights_int4(L->m, err)) return -1;
    if (P->g.cbf16 && loom_model_set_compute_bf16(L->m, err)) return -1;
    loom_engine_opts eo = {.max_batch = P->g.batch};
    return loom_engine_create(L->m, L->tok, &eo, &L->eng, err);
}
