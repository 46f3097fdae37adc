/* loom synth: the pipeline file (docs/synth.md, "The file"). */
#define _GNU_SOURCE
#include "synth/synth_internal.h"
#include "loom/grammar.h"

#include <sys/stat.h>

#include "loom/checkpoint.h"

/* typed keys: base's getters (src/base/json_util.h); errors name the file and 'WHEREKEY' */
static int jint(pipeline *P, json_t *o, const char *where, const char *k, long long def,
                long long lo, long long hi, long long *out, loom_err *err) {
    int64_t v;
    if (loom_json_int(o, P->path, where, k, 0, def, lo, hi, &v, err)) return -1;
    *out = v;
    return 0;
}

static int jnum(pipeline *P, json_t *o, const char *where, const char *k, double def, double lo,
                double hi, double *out, loom_err *err) {
    return loom_json_num(o, P->path, where, k, def, lo, 0, hi, out, err);
}

static int check_keys(pipeline *P, json_t *o, const char *where, const char *const *known, loom_err *err) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(k, known[i]);
        if (!ok) return loom_errf(err, "%s: unknown key '%s%s'", P->path, where, k);
    }
    return 0;
}

/* what identifies a checkpoint's weights: its COMPLETE marker (the SHA-256 of its manifest,
 * which holds every file's SHA-256) */
static int ckpt_identity(const char *path, char out[65], loom_err *err) {
    char dir[4096], marker[4200];
    if (loom_ckpt_resolve(path, dir, sizeof dir, err)) return -1;
    snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
    char *text = NULL;
    size_t len = 0;
    if (loom_read_file(marker, 4096, &text, &len, err)) return -1;
    loom_sha256_hex(text, len, out);
    free(text);
    return 0;
}

/* a validator's settings (its YAML minus the name) and what they name (the files among a
 * command's arguments, by content; the scoring checkpoint's identity) -> v->key */
static int validator_key(pipeline *P, validator *v, json_t *node, loom_err *err) {
    json_t *o = json_deep_copy(node);
    json_object_del(o, "name");
    json_t *files = json_array();
    for (int i = 0; i < v->argc; i++) {
        struct stat st;
        char hex[65];
        loom_err e2 = {{0}};
        if (stat(v->argv[i], &st) || !S_ISREG(st.st_mode) || loom_sha256_file(v->argv[i], hex, &e2))
            continue;
        json_array_append_new(files, json_pack("[s,s]", v->argv[i], hex));
    }
    json_object_set_new(o, "files", files);
    if (v->sc) {
        char id[65];
        if (ckpt_identity(v->sc->ckpt, id, err)) {
            json_decref(o);
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            return loom_errf(err, "%s: score validator '%s': %s", P->path, v->name, m);
        }
        json_object_set_new(o, "checkpoint_id", json_string(id));
        json_object_del(o, "min"); /* the threshold is applied to the cached score */
        json_object_del(o, "max");
    }
    char *str = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    loom_sha256_hex(str, strlen(str), v->key);
    free(str);
    json_decref(o);
    return 0;
}

/* the generator's identity and every setting that shapes its output */
static int generator_identity(pipeline *P, loom_err *err) {
    json_t *g = json_pack("{s:s,s:s,s:i,s:f,s:f,s:i,s:b}", "kind", P->g.http ? "http" : "local",
                          "model", P->g.model, "max_tokens", P->g.max_tokens, "temperature",
                          P->g.temperature, "top_p", P->g.top_p, "top_k", P->g.top_k, "chat", P->g.chat);
    json_t *st = json_array();
    for (int i = 0; i < P->g.n_stop; i++) json_array_append_new(st, json_string(P->g.stop[i]));
    json_object_set_new(g, "stop", st);
    if (P->g.chat_tpl) json_object_set_new(g, "chat_template", json_string(loom_json_str_or(json_object_get(P->root, "generator"), "chat_template", "plain")));
    if (P->g.bf16 || P->g.int8 || P->g.int4)
        json_object_set_new(g, "weights", json_string(P->g.int4 ? "int4" : P->g.int8 ? "int8" : "bf16"));
    if (P->g.cbf16) json_object_set_new(g, "compute", json_string("bf16"));
    if (P->g.schema_key) json_object_set_new(g, "json_schema", json_string(P->g.schema_key));
    if (P->g.http) {
        json_object_set_new(g, "url", json_string(P->g.url));
    } else if (P->C.on) {
        char id[65];
        if (ckpt_identity(P->g.checkpoint, id, err)) {
            json_decref(g);
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            return loom_errf(err, "%s: generator.checkpoint: %s", P->path, m);
        }
        json_object_set_new(g, "checkpoint_id", json_string(id));
    }
    P->gen_id = json_dumps(g, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(g);
    return 0;
}

int synth_parse_pipeline(pipeline *P, loom_err *err) {
    json_t *r = P->root;
    static const char *const top[] = {"name", "seed", "seeds", "templates", "template", "feedback",
                                      "generator", "validators", "max_attempts", "samples_per_seed",
                                      "output", "summary", "rejected", "cache", NULL};
    if (check_keys(P, r, "", top, err)) return -1;
    if (synth_load_seeds(P->path, json_object_get(r, "seeds"), &P->sd, err)) return -1;
    long long v = 0;
    if (jint(P, r, "", "seed", 1, 0, (1LL << 62), &v, err)) return -1;
    P->seed = (uint64_t)v;
    if (jint(P, r, "", "max_attempts", 3, 1, 100, &v, err)) return -1;
    P->max_attempts = (int)v;
    if (jint(P, r, "", "samples_per_seed", 1, 1, 1000, &v, err)) return -1;
    P->samples = (int)v;
    json_t *tpls = json_object_get(r, "templates");
    const char *tname = loom_json_str_or(r, "template", NULL);
    if (!json_is_object(tpls) || !tname)
        return loom_errf(err, "%s: 'templates' (a mapping of name: text) and 'template' (the name "
                              "to use) are required", P->path);
    json_t *t = json_object_get(tpls, tname);
    if (json_is_object(t) && json_is_string(json_object_get(t, "chat"))) {
        P->g.chat = 1;
        t = json_object_get(t, "chat");
    }
    if (!json_is_string(t))
        return loom_errf(err, "%s: template '%s' is not in 'templates' (a string, or {chat: string})",
                         P->path, tname);
    P->template_name = strdup(tname);
    P->tpl = json_string_value(t);
    if (!strstr(P->tpl, "{seed}"))
        return loom_errf(err, "%s: templates.%s has no {seed} placeholder", P->path, tname);
    P->feedback = loom_json_str_or(r, "feedback", "\n(An earlier answer was rejected: {message}. Write a corrected one.)\n");
    P->output = loom_json_str_or(r, "output", NULL);
    if (!P->output) return loom_errf(err, "%s: 'output' (the JSONL file of accepted samples) is required", P->path);
    P->summary = loom_json_str_or(r, "summary", NULL);
    P->rejected = loom_json_str_or(r, "rejected", NULL);
    json_t *cj = json_object_get(r, "cache");
    if (cj && !json_is_false(cj) && !(json_is_string(cj) && json_string_length(cj)))
        return loom_errf(err, "%s: 'cache' must be a directory or false", P->path);
    P->C.on = !json_is_false(cj);
    if (json_is_string(cj)) snprintf(P->C.dir, sizeof P->C.dir, "%s", json_string_value(cj));
    else snprintf(P->C.dir, sizeof P->C.dir, "%s.cache", P->output);
    /* generator */
    json_t *g = json_object_get(r, "generator");
    static const char *const gk[] = {"kind", "url", "model", "checkpoint", "max_tokens", "temperature",
                                     "top_p", "top_k", "stop", "concurrency", "timeout_s", "retries",
                                     "batch", "chat_template", "weights", "compute", "json_schema",
                                     NULL};
    if (!json_is_object(g)) return loom_errf(err, "%s: 'generator' (a mapping) is required", P->path);
    if (check_keys(P, g, "generator.", gk, err)) return -1;
    const char *kind = loom_json_str_or(g, "kind", "");
    if (!strcmp(kind, "http")) {
        P->g.http = 1;
        const char *url = loom_json_str_or(g, "url", NULL);
        if (!url || strncmp(url, "http", 4) || strlen(url) >= sizeof P->g.url)
            return loom_errf(err, "%s: generator.url must be an http(s) URL ending at /v1", P->path);
        snprintf(P->g.url, sizeof P->g.url, "%s", url);
        size_t ul = strlen(P->g.url);
        while (ul && P->g.url[ul - 1] == '/') P->g.url[--ul] = 0;
        snprintf(P->g.model, sizeof P->g.model, "%s", loom_json_str_or(g, "model", "loom"));
    } else if (!strcmp(kind, "local")) {
        const char *ck = loom_json_str_or(g, "checkpoint", NULL);
        if (!ck) return loom_errf(err, "%s: generator.checkpoint is required for kind local", P->path);
        snprintf(P->g.checkpoint, sizeof P->g.checkpoint, "%s", ck);
        snprintf(P->g.model, sizeof P->g.model, "%s", ck);
        const char *wt = loom_json_str_or(g, "weights", "fp32");
        if (strcmp(wt, "fp32") && strcmp(wt, "bf16") && strcmp(wt, "int8") && strcmp(wt, "int4"))
            return loom_errf(err, "%s: generator.weights must be fp32, bf16, int8 or int4", P->path);
        P->g.bf16 = !strcmp(wt, "bf16");
        P->g.int8 = !strcmp(wt, "int8");
        P->g.int4 = !strcmp(wt, "int4");
        const char *cm = loom_json_str_or(g, "compute", "fp32");
        if (strcmp(cm, "fp32") && strcmp(cm, "bf16"))
            return loom_errf(err, "%s: generator.compute must be fp32 or bf16", P->path);
        P->g.cbf16 = !strcmp(cm, "bf16");
        if (P->g.cbf16 && json_object_get(g, "weights") && !P->g.bf16)
            return loom_errf(err, "%s: generator.compute bf16 multiplies bf16 weights: it "
                                  "cannot run with generator.weights %s", P->path, wt);
        P->g.bf16 |= P->g.cbf16;
    } else {
        return loom_errf(err, "%s: generator.kind must be local or http", P->path);
    }
    if (jint(P, g, "generator.", "max_tokens", 64, 1, 1 << 20, &v, err)) return -1;
    P->g.max_tokens = (int)v;
    if (jint(P, g, "generator.", "top_k", 0, 0, 1 << 24, &v, err)) return -1;
    P->g.top_k = (int)v;
    if (jint(P, g, "generator.", "concurrency", 8, 1, 1024, &v, err)) return -1;
    P->g.concurrency = (int)v;
    if (jint(P, g, "generator.", "retries", 3, 0, 20, &v, err)) return -1;
    P->g.retries = (int)v;
    if (jint(P, g, "generator.", "batch", 16, 1, 4096, &v, err)) return -1;
    P->g.batch = (int)v;
    if (jnum(P, g, "generator.", "temperature", 1.0, 0, 2, &P->g.temperature, err) ||
        jnum(P, g, "generator.", "top_p", 1.0, 0, 1, &P->g.top_p, err) ||
        jnum(P, g, "generator.", "timeout_s", 60, 0.001, 86400, &P->g.timeout_s, err))
        return -1;
    /* generator.json_schema: FILE: every output a JSON document of the schema (local: by
     * constrained decoding; http: sent as response_format json_schema) */
    json_t *jsf = json_object_get(g, "json_schema");
    if (jsf) {
        if (!json_is_string(jsf) || !json_string_length(jsf))
            return loom_errf(err, "%s: generator.json_schema must be the path of a JSON-schema file", P->path);
        const char *sf = json_string_value(jsf);
        char *text = NULL;
        size_t len = 0;
        json_error_t je;
        if (loom_read_file(sf, (size_t)1 << 24, &text, &len, err)) {
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            return loom_errf(err, "%s: generator.json_schema: %s", P->path, m);
        }
        P->g.schema = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
        if (!P->g.schema) {
            free(text);
            return loom_errf(err, "%s: generator.json_schema: %s:%d:%d: %s", P->path, sf, je.line,
                             je.column, je.text);
        }
        if (!P->g.http && loom_grammar_json(NULL, text, &P->g.grammar, err)) {
            free(text);
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            return loom_errf(err, "%s: generator.json_schema: %s: %s", P->path, sf, m);
        }
        free(text);
        /* the content in its own key order (the order of properties shapes the output) */
        P->g.schema_key = P->g.grammar ? loom_strdup(loom_grammar_source(P->g.grammar))
                                       : json_dumps(P->g.schema, JSON_COMPACT | JSON_ENCODE_ANY);
    }
    json_t *st = json_object_get(g, "stop");
    if (json_is_string(st)) st = json_pack("[O]", st);
    else json_incref(st);
    size_t i;
    json_t *x;
    json_array_foreach(st, i, x) {
        if (!json_is_string(x) || !json_string_length(x) || P->g.n_stop == 16) {
            json_decref(st);
            return loom_errf(err, "%s: generator.stop must be up to 16 non-empty strings", P->path);
        }
        P->g.stop[P->g.n_stop++] = strdup(json_string_value(x));
    }
    json_decref(st);
    const char *ct = loom_json_str_or(g, "chat_template", NULL);
    if (ct && P->g.http)
        return loom_errf(err, "%s: generator.chat_template is for kind local (an HTTP server applies "
                              "its own template)", P->path);
    if (P->g.chat && !P->g.http) { /* the chat form through the shared chat template code */
        if (loom_chat_template_load(ct ? ct : "plain", &P->g.chat_tpl, err)) {
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            return loom_errf(err, "%s: generator.chat_template: %s", P->path, m);
        }
        char *pr = NULL, *eot = NULL;
        loom_chat_prompt(P->g.chat_tpl, NULL, "", &pr, &eot);
        free(pr);
        /* its end of turn (under a schema, the document's end ends the turn) */
        if (eot[0] && P->g.n_stop < 16 && !P->g.grammar) P->g.stop[P->g.n_stop++] = eot;
        else free(eot);
    }
    /* validators */
    json_t *vl = json_object_get(r, "validators");
    if (vl && !json_is_array(vl)) return loom_errf(err, "%s: 'validators' must be a list", P->path);
    P->nv = (int)json_array_size(vl);
    P->v = loom_calloc((size_t)P->nv + 1, sizeof *P->v);
    json_array_foreach(vl, i, x) {
        validator *d = &P->v[i];
        char where[64];
        snprintf(where, sizeof where, "validators[%zu].", i);
        const char *k = loom_json_str_or(x, "kind", "");
        snprintf(d->name, sizeof d->name, "%s", loom_json_str_or(x, "name", k));
        if (!strcmp(k, "length")) {
            static const char *const kk[] = {"kind", "name", "min", "max", NULL};
            if (check_keys(P, x, where, kk, err) || jint(P, x, where, "min", 0, 0, 1LL << 40, &d->min, err) ||
                jint(P, x, where, "max", -1, -1, 1LL << 40, &d->max, err))
                return -1;
            d->kind = V_LENGTH;
        } else if (!strcmp(k, "regex")) {
            static const char *const kk[] = {"kind", "name", "pattern", NULL};
            const char *pat = loom_json_str_or(x, "pattern", NULL);
            if (check_keys(P, x, where, kk, err)) return -1;
            if (!pat) return loom_errf(err, "%s: %spattern is required", P->path, where);
            int ec;
            PCRE2_SIZE eo;
            d->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
            if (!d->re) {
                PCRE2_UCHAR m[256];
                pcre2_get_error_message(ec, m, sizeof m);
                return loom_errf(err, "%s: %spattern: %s at offset %zu", P->path, where, (char *)m, (size_t)eo);
            }
            d->kind = V_REGEX;
        } else if (!strcmp(k, "json")) {
            static const char *const kk[] = {"kind", "name", "schema", NULL};
            if (check_keys(P, x, where, kk, err)) return -1;
            d->schema = json_incref(json_object_get(x, "schema"));
            d->kind = V_JSON;
        } else if (!strcmp(k, "command")) {
            static const char *const kk[] = {"kind", "name", "command", "timeout_s", NULL};
            if (check_keys(P, x, where, kk, err) ||
                jnum(P, x, where, "timeout_s", 10, 0.001, 86400, &d->timeout_s, err))
                return -1;
            json_t *c = json_object_get(x, "command");
            if (!json_is_array(c) || json_array_size(c) == 0)
                return loom_errf(err, "%s: %scommand must be a non-empty list (argv)", P->path, where);
            d->argc = (int)json_array_size(c);
            d->argv = loom_calloc((size_t)d->argc + 1, sizeof(char *));
            size_t j;
            json_t *a;
            json_array_foreach(c, j, a) {
                if (!json_is_string(a)) return loom_errf(err, "%s: %scommand[%zu] is not a string", P->path, where, j);
                d->argv[j] = strdup(json_string_value(a));
            }
            d->kind = V_COMMAND;
        } else if (!strcmp(k, "unique")) {
            static const char *const kk[] = {"kind", "name", NULL};
            if (check_keys(P, x, where, kk, err)) return -1;
            d->kind = V_UNIQUE;
        } else if (!strcmp(k, "near_duplicate")) {
            static const char *const kk[] = {"kind", "name", "shingle", "permutations", "bands",
                                             "threshold", NULL};
            long long sh = 0, pe = 0, ba = 1;
            double th = 0;
            if (check_keys(P, x, where, kk, err) || jint(P, x, where, "shingle", 5, 1, 1024, &sh, err) ||
                jint(P, x, where, "permutations", 128, 1, 1024, &pe, err) ||
                jint(P, x, where, "bands", 16, 1, 1024, &ba, err) ||
                jnum(P, x, where, "threshold", 0.8, 0, 1, &th, err))
                return -1;
            if (pe % ba)
                return loom_errf(err, "%s: %sbands (%lld) must divide permutations (%lld)", P->path,
                                 where, ba, pe);
            d->mh = loom_calloc(1, sizeof *d->mh);
            d->mh->shingle = (int)sh, d->mh->perms = (int)pe, d->mh->bands = (int)ba;
            d->mh->threshold = th;
            synth_mh_init(d->mh);
            d->kind = V_NEARDUP;
        } else if (!strcmp(k, "score")) {
            static const char *const kk[] = {"kind", "name", "checkpoint", "min", "max", "prefix", NULL};
            const char *ck = loom_json_str_or(x, "checkpoint", NULL), *pre = loom_json_str_or(x, "prefix", "");
            if (check_keys(P, x, where, kk, err)) return -1;
            if (!ck) return loom_errf(err, "%s: %scheckpoint (a loom checkpoint) is required", P->path, where);
            if (!json_is_number(json_object_get(x, "min")))
                return loom_errf(err, "%s: %smin (the lowest mean log-likelihood accepted) is required",
                                 P->path, where);
            if (jnum(P, x, where, "min", 0, -1e9, 0, &d->smin, err) ||
                jnum(P, x, where, "max", 0, -1e9, 0, &d->smax, err))
                return -1;
            if (json_object_get(x, "prefix") && !json_is_string(json_object_get(x, "prefix")))
                return loom_errf(err, "%s: %sprefix must be a string", P->path, where);
            d->sc = loom_calloc(1, sizeof *d->sc);
            snprintf(d->sc->ckpt, sizeof d->sc->ckpt, "%s", ck);
            d->sc->prefix = strdup(pre);
            pthread_mutex_init(&d->sc->mu, NULL);
            d->kind = V_SCORE;
        } else {
            return loom_errf(err, "%s: %skind '%s': expected length, regex, json, command, unique, "
                                  "near_duplicate or score", P->path, where, k);
        }
        if ((d->kind == V_COMMAND || d->kind == V_SCORE) && validator_key(P, d, x, err)) return -1;
    }
    return generator_identity(P, err);
}
