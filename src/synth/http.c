/* loom synth: the HTTP generator (an OpenAI-compatible endpoint, libcurl). */
#define _GNU_SOURCE
#include "synth/synth_internal.h"

#include <curl/curl.h>
#include <unistd.h>

static size_t curl_sink(char *p, size_t sz, size_t nm, void *ud) {
    loom_sbuf *b = ud;
    if (b->len + sz * nm > ((size_t)64 << 20)) return 0;
    loom_sbuf_append(b, p, sz * nm);
    return sz * nm;
}

static void http_one(const gen_cfg *g, item *it, uint64_t seed) {
    json_t *req = json_pack("{s:s,s:i,s:f,s:f,s:I}", "model", g->model, "max_tokens", g->max_tokens,
                            "temperature", g->temperature, "top_p", g->top_p, "seed",
                            (json_int_t)(seed & 0x3fffffffffffffffull));
    if (g->top_k) json_object_set_new(req, "top_k", json_integer(g->top_k));
    if (g->n_stop) {
        json_t *a = json_array();
        for (int i = 0; i < g->n_stop; i++) json_array_append_new(a, json_string(g->stop[i]));
        json_object_set_new(req, "stop", a);
    }
    if (g->schema) /* generator.json_schema: OpenAI's structured output */
        json_object_set_new(req, "response_format",
                            json_pack("{s:s,s:{s:s,s:O,s:b}}", "type", "json_schema", "json_schema",
                                      "name", "synth", "schema", g->schema, "strict", 1));
    size_t pl;
    char *clean = loom_utf8_sanitize(it->prompt, strlen(it->prompt), &pl);
    if (g->chat)
        json_object_set_new(req, "messages", json_pack("[{s:s,s:s%}]", "role", "user", "content", clean, pl));
    else
        json_object_set_new(req, "prompt", json_stringn(clean, pl));
    free(clean);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    char url[1200];
    snprintf(url, sizeof url, "%s%s", g->url, g->chat ? "/chat/completions" : "/completions");
    it->gen_ok = 0;
    for (int attempt = 0; attempt <= g->retries; attempt++) {
        if (attempt) usleep((useconds_t)(100000u << (attempt < 6 ? attempt : 6)));
        CURL *c = curl_easy_init();
        loom_sbuf resp = {0};
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, curl_sink);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &resp);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(g->timeout_s * 1000));
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        const CURLcode rc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(h);
        curl_easy_cleanup(c);
        if (rc != CURLE_OK) {
            snprintf(it->gen_err, sizeof it->gen_err, "%s: %s", url, curl_easy_strerror(rc));
            free(resp.p);
            continue; /* connection errors and timeouts are retried */
        }
        json_t *r = resp.p ? json_loads(resp.p, 0, NULL) : NULL;
        free(resp.p);
        if (status != 200) {
            json_t *m = json_object_get(json_object_get(r, "error"), "message");
            snprintf(it->gen_err, sizeof it->gen_err, "%s: HTTP %ld%s%s", url, status,
                     json_is_string(m) ? ": " : "", json_is_string(m) ? json_string_value(m) : "");
            json_decref(r);
            if (status == 429 || status >= 500) continue; /* retried; other 4xx are final */
            break;
        }
        json_t *ch = json_array_get(json_object_get(r, "choices"), 0);
        json_t *t = g->chat ? json_object_get(json_object_get(ch, "message"), "content")
                            : json_object_get(ch, "text");
        if (!json_is_string(t)) {
            snprintf(it->gen_err, sizeof it->gen_err, "%s: no choices[0] text in the response", url);
            json_decref(r);
            continue;
        }
        it->tlen = json_string_length(t);
        it->text = loom_malloc(it->tlen + 1);
        memcpy(it->text, json_string_value(t), it->tlen + 1);
        it->tokens = (int)json_integer_value(json_object_get(json_object_get(r, "usage"), "completion_tokens"));
        it->gen_ok = 1;
        json_decref(r);
        break;
    }
    free(body);
}

void *synth_http_worker(void *arg) {
    http_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        const int i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->mu);
        if (i < 0) break;
        http_one(p->g, p->items[i], item_seed(p->seed, p->items[i]));
    }
    return NULL;
}
