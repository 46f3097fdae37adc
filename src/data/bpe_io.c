/* Loading and saving byte-level BPE tokenizers: Hugging Face tokenizer.json (both merge
 * spellings), GPT-2 vocab.json + merges.txt. Every file is untrusted: errors name the file and
 * the key or line, sizes and ids are bounded. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_util.h"
#include "data/bpe_internal.h"

/* ---- shared building steps ---------------------------------------------------------------- */

/* Fills t->tok and t->vocab from a {"token": id} object. */
static int read_vocab(loom_tokenizer *t, const char *path, const char *key, json_t *vocab,
                      json_t *added, loom_err *err) {
    if (!json_is_object(vocab)) return loom_errf(err, "%s: '%s' must be an object of token -> id", path, key);
    uint32_t max_id = 0;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= (json_int_t)BPE_MAX_ID)
            return loom_errf(err, "%s: '%s' token \"%.80s\" has id %s, expected an integer in [0, %u)", path, key, k,
                             json_is_integer(v) ? "out of range" : "that is not an integer", BPE_MAX_ID);
        if ((uint32_t)id + 1 > max_id) max_id = (uint32_t)id + 1;
    }
    size_t ai;
    json_t *a;
    json_array_foreach(added, ai, a) {
        json_t *jid = json_object_get(a, "id");
        json_int_t id = json_is_integer(jid) ? json_integer_value(jid) : -1;
        if (id < 0 || id >= (json_int_t)BPE_MAX_ID)
            return loom_errf(err, "%s: added_tokens[%zu].id must be an integer in [0, %u)", path, ai, BPE_MAX_ID);
        if ((uint32_t)id + 1 > max_id) max_id = (uint32_t)id + 1;
    }
    if (max_id == 0) return loom_errf(err, "%s: '%s' is empty", path, key);
    t->vocab_size = max_id;
    t->tok = loom_calloc(max_id, sizeof *t->tok);
    bpe_strmap_free(&t->vocab);
    bpe_strmap_init(&t->vocab, json_object_size(vocab));
    size_t len;
    json_object_keylen_foreach(vocab, k, len, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (len == 0 || memchr(k, 0, len))
            return loom_errf(err, "%s: '%s' has an empty token or one with a NUL character (id %d)", path, key, (int)id);
        if (t->tok[id].str)
            return loom_errf(err, "%s: '%s' gives id %d to both \"%.80s\" and \"%.80s\"", path, key, (int)id,
                             t->tok[id].str, k);
        char *s = loom_malloc(len + 1);
        memcpy(s, k, len + 1);
        bpe_set_token(t, id, s, len, 1);
        bpe_strmap_put(&t->vocab, t->tok[id].str, len, id);
    }
    return 0;
}

static int add_merge(loom_tokenizer *t, const char *path, size_t idx, const char *what,
                     const char *a, size_t al, const char *b, size_t bl, loom_err *err) {
    int32_t ia = bpe_strmap_get(&t->vocab, a, al), ib = bpe_strmap_get(&t->vocab, b, bl);
    if (ia < 0) return loom_errf(err, "%s: %s %zu: token \"%.*s\" is not in the vocabulary", path, what, idx, (int)(al > 80 ? 80 : al), a);
    if (ib < 0) return loom_errf(err, "%s: %s %zu: token \"%.*s\" is not in the vocabulary", path, what, idx, (int)(bl > 80 ? 80 : bl), b);
    char sbuf[512], *s = al + bl <= sizeof sbuf ? sbuf : loom_malloc(al + bl);
    memcpy(s, a, al);
    memcpy(s + al, b, bl);
    int32_t in = bpe_strmap_get(&t->vocab, s, al + bl);
    if (s != sbuf) free(s);
    if (in < 0)
        return loom_errf(err, "%s: %s %zu: the merged token \"%.*s%.*s\" is not in the vocabulary", path, what, idx,
                         (int)(al > 80 ? 80 : al), a, (int)(bl > 80 ? 80 : bl), b);
    /* a pair listed twice keeps the later rank (HF builds its map in order, overwriting) */
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    *bpe_u64map_upsert(&t->merge_map, key, 0, NULL) = ((uint64_t)t->n_merges << 32) | (uint32_t)in;
    t->merges[t->n_merges][0] = ia;
    t->merges[t->n_merges][1] = ib;
    t->n_merges++;
    return 0;
}

static int read_added(loom_tokenizer *t, const char *path, json_t *added, loom_err *err) {
    if (!added || json_is_null(added)) return 0;
    if (!json_is_array(added)) return loom_errf(err, "%s: 'added_tokens' must be an array", path);
    size_t n = json_array_size(added);
    if (n > 100000) return loom_errf(err, "%s: 'added_tokens' has %zu entries (limit 100000)", path, n);
    t->added = loom_calloc(n ? n : 1, sizeof *t->added);
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        if (!json_is_object(a)) return loom_errf(err, "%s: added_tokens[%zu] must be an object", path, i);
        json_t *c = json_object_get(a, "content");
        if (!json_is_string(c) || json_string_length(c) == 0)
            return loom_errf(err, "%s: added_tokens[%zu].content must be a non-empty string", path, i);
        if (strlen(json_string_value(c)) != json_string_length(c))
            return loom_errf(err, "%s: added_tokens[%zu].content contains a NUL character", path, i);
        static const char *const unsupported[] = {"single_word"};
        for (int u = 0; u < 1; u++)
            if (json_is_true(json_object_get(a, unsupported[u])))
                return loom_errf(err, "%s: added_tokens[%zu] (\"%.80s\") sets %s=true, which loom does not support",
                                 path, i, json_string_value(c), unsupported[u]);
        json_t *sp = json_object_get(a, "special"), *nz = json_object_get(a, "normalized");
        if (nz && !json_is_boolean(nz) && !json_is_null(nz))
            return loom_errf(err, "%s: added_tokens[%zu].normalized must be true or false", path, i);
        bpe_added *ad = &t->added[t->n_added];
        ad->len = json_string_length(c);
        ad->content = loom_malloc(ad->len + 1);
        memcpy(ad->content, json_string_value(c), ad->len + 1);
        ad->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        ad->special = json_is_true(sp);
        ad->normalized = json_is_boolean(nz) ? json_is_true(nz) : !ad->special; /* HF's default */
        static const char *const strips[] = {"lstrip", "rstrip"};
        for (int u = 0; u < 2; u++) {
            json_t *v = json_object_get(a, strips[u]);
            if (v && !json_is_boolean(v) && !json_is_null(v)) {
                free(ad->content);
                return loom_errf(err, "%s: added_tokens[%zu].%s must be true or false", path, i, strips[u]);
            }
        }
        ad->lstrip = json_is_true(json_object_get(a, "lstrip"));
        ad->rstrip = json_is_true(json_object_get(a, "rstrip"));
        for (int j = 0; j < t->n_added; j++)
            if (t->added[j].id == ad->id || (t->added[j].len == ad->len && !memcmp(t->added[j].content, ad->content, ad->len))) {
                free(ad->content);
                return loom_errf(err, "%s: added_tokens[%zu] (\"%.80s\", id %d) repeats an earlier entry's id or content",
                                 path, i, json_string_value(c), (int)ad->id);
            }
        t->n_added++;
    }
    return 0;
}

static int opt_bool(const char *path, json_t *obj, const char *where, const char *key, int dflt, int *out,
                    loom_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return loom_errf(err, "%s: %s.%s must be true or false", path, where, key);
    *out = json_is_true(v);
    return 0;
}

static int read_model(loom_tokenizer *t, const char *path, json_t *root, loom_err *err) {
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return loom_errf(err, "%s: missing 'model' object", path);
    json_t *type = json_object_get(model, "type");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0))
        return loom_errf(err, "%s: model.type is '%s'; loom supports BPE", path,
                         json_is_string(type) ? json_string_value(type) : "(not a string)");
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return loom_errf(err, "%s: model.dropout must be null or 0 (BPE dropout is not supported)", path);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return loom_errf(err, "%s: model.%s must be null (not supported with byte-level BPE)", path, affixes[i]);
    }
    if (opt_bool(path, model, "model", "fuse_unk", 0, &t->fuse_unk, err) ||
        opt_bool(path, model, "model", "byte_fallback", 0, &t->byte_fallback, err) ||
        opt_bool(path, model, "model", "ignore_merges", 0, &t->ignore_merges, err))
        return -1;
    json_t *added = json_object_get(root, "added_tokens");
    if (read_vocab(t, path, "model.vocab", json_object_get(model, "vocab"), json_is_array(added) ? added : NULL, err))
        return -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) return loom_errf(err, "%s: model.unk_token must be a string or null", path);
        t->unk_id = bpe_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return loom_errf(err, "%s: model.unk_token \"%.80s\" is not in model.vocab", path, json_string_value(unk));
    }
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) return loom_errf(err, "%s: model.merges must be an array", path);
    size_t n = json_array_size(merges);
    t->merges = loom_malloc((n ? n : 1) * sizeof *t->merges);
    bpe_u64map_free(&t->merge_map);
    bpe_u64map_init(&t->merge_map, n);
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        if (json_is_string(m)) { /* older spelling: "a b" */
            const char *s = json_string_value(m);
            size_t len = json_string_length(m);
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
                return loom_errf(err, "%s: model.merges[%zu] \"%.80s\" must be two tokens separated by one space", path, i, s);
            if (add_merge(t, path, i, "model.merges", s, (size_t)(sp - s), sp + 1, len - (size_t)(sp + 1 - s), err)) return -1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) { /* newer spelling: ["a", "b"] */
            json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            if (add_merge(t, path, i, "model.merges", json_string_value(a), json_string_length(a),
                          json_string_value(b), json_string_length(b), err))
                return -1;
        } else {
            return loom_errf(err, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", path, i);
        }
    }
    return read_added(t, path, added, err);
}

static int load_json_root(json_t *root, const char *path, loom_tokenizer **out, loom_err *err);

int loom_tokenizer_load_json(const char *path, loom_tokenizer **out, loom_err *err) {
    json_t *root = NULL;
    if (loom_json_object_file(path, BPE_MAX_FILE, &root, err)) return -1;
    return load_json_root(root, path, out, err);
}

int loom_tokenizer_load_json_text(const char *text, size_t len, const char *name,
                                  loom_tokenizer **out, loom_err *err) {
    if (len > BPE_MAX_FILE) return loom_errf(err, "%s: larger than %zu bytes", name, (size_t)BPE_MAX_FILE);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return loom_errf(err, "%s: invalid JSON at line %d, column %d: %s", name, je.line,
                         je.column, je.text);
    return load_json_root(root, name, out, err);
}

/* Takes ownership of root. */
static int load_json_root(json_t *root, const char *path, loom_tokenizer **out, loom_err *err) {
    loom_tokenizer *t = NULL;
    if (!json_is_object(root)) {
        loom_errf(err, "%s: a tokenizer.json must be a JSON object", path);
        goto fail;
    }
    if (bpe_new(&t, err)) goto fail;
    if (bpe_pipeline_load(t, path, json_object_get(root, "normalizer"), json_object_get(root, "pre_tokenizer"),
                          json_object_get(root, "decoder"), err))
        goto fail;
    if (read_model(t, path, root, err)) goto fail;
    json_decref(root);
    if (bpe_finish(t, err)) {
        loom_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
fail:
    json_decref(root);
    loom_tokenizer_free(t);
    return -1;
}

int loom_tokenizer_load_vocab_merges(const char *vocab_path, const char *merges_path,
                                     loom_tokenizer **out, loom_err *err) {
    json_t *root = NULL;
    loom_tokenizer *t = NULL;
    char *buf = NULL;
    size_t len;
    if (loom_json_object_file(vocab_path, BPE_MAX_FILE, &root, err)) return -1;
    if (bpe_new(&t, err)) goto fail;
    if (read_vocab(t, vocab_path, "vocab", root, NULL, err)) goto fail;
    if (loom_read_file(merges_path, BPE_MAX_FILE, &buf, &len, err)) goto fail;
    if (memchr(buf, 0, len)) {
        loom_errf(err, "%s: merges file contains a NUL byte at offset %zu", merges_path, (size_t)((char *)memchr(buf, 0, len) - buf));
        goto fail;
    }
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    t->merges = loom_malloc(lines * sizeof *t->merges);
    bpe_u64map_free(&t->merge_map);
    bpe_u64map_init(&t->merge_map, lines);
    /* HF: lines (\n or \r\n), "#version" lines skipped, each other line exactly "a b" */
    size_t pos = 0, lineno = 0, rank = 0;
    while (pos < len) {
        char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len, e = end;
        lineno++;
        if (e > pos && buf[e - 1] == '\r') e--;
        const char *s = buf + pos;
        size_t l = e - pos;
        pos = nl ? end + 1 : len;
        if (l >= 8 && !memcmp(s, "#version", 8)) continue;
        rank++;
        const char *sp = memchr(s, ' ', l);
        if (!sp || memchr(sp + 1, ' ', l - (size_t)(sp + 1 - s))) {
            loom_errf(err, "%s: line %zu: \"%.*s\" must be two tokens separated by one space", merges_path, lineno,
                      (int)(l > 80 ? 80 : l), s);
            goto fail;
        }
        char what[64];
        snprintf(what, sizeof what, "line");
        if (add_merge(t, merges_path, lineno, what, s, (size_t)(sp - s), sp + 1, l - (size_t)(sp + 1 - s), err)) goto fail;
    }
    (void)rank;
    /* GPT-2 convention: <|endoftext|> is special when present */
    int32_t eot = bpe_strmap_get(&t->vocab, "<|endoftext|>", 13);
    t->added = loom_calloc(1, sizeof *t->added);
    if (eot >= 0) {
        t->added[0].content = loom_strdup("<|endoftext|>");
        t->added[0].len = 13;
        t->added[0].id = eot;
        t->added[0].special = 1;
        t->n_added = 1;
    }
    free(buf);
    json_decref(root);
    if (bpe_finish(t, err)) {
        loom_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
fail:
    free(buf);
    json_decref(root);
    loom_tokenizer_free(t);
    return -1;
}

int loom_tokenizer_load(const char *spec, loom_tokenizer **out, loom_err *err) {
    if (!strcmp(spec, "byte")) return loom_tokenizer_byte(NULL, 0, out, err);
    return loom_tokenizer_load_json(spec, out, err);
}

/* ---- saving ---------------------------------------------------------------------------------- */
static json_t *byte_level_obj(int add_prefix_space, int trim_offsets, int use_regex) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("ByteLevel"));
    json_object_set_new(o, "add_prefix_space", json_boolean(add_prefix_space));
    json_object_set_new(o, "trim_offsets", json_boolean(trim_offsets));
    json_object_set_new(o, "use_regex", json_boolean(use_regex));
    return o;
}

/* The model.vocab object in id order (added-only tokens excluded). */
static json_t *vocab_obj(const loom_tokenizer *t, int with_added) {
    json_t *v = json_object();
    for (uint32_t i = 0; i < t->vocab_size; i++) {
        const bpe_token *tk = &t->tok[i];
        if (!tk->str || (!tk->in_vocab && !with_added)) continue;
        json_object_setn_new_nocheck(v, tk->str, tk->str_len, json_integer(i));
    }
    return v;
}

char *bpe_json_text(const loom_tokenizer *t, int compact) {
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_t *added = json_array();
    for (int a = 0; a < t->n_added; a++) {
        const bpe_added *ad = &t->added[a];
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(ad->id));
        json_object_set_new(o, "content", json_stringn(ad->content, ad->len));
        json_object_set_new(o, "single_word", json_false());
        json_object_set_new(o, "lstrip", json_boolean(ad->lstrip));
        json_object_set_new(o, "rstrip", json_boolean(ad->rstrip));
        json_object_set_new(o, "normalized", json_boolean(t->general ? ad->normalized : !ad->special));
        json_object_set_new(o, "special", json_boolean(ad->special));
        json_array_append_new(added, o);
    }
    json_object_set_new(root, "added_tokens", added);
    if (t->general) { /* the file's own steps, as loaded (compact JSON); no post-processor:
                         * loom's encode adds no BOS/EOS, and neither does `tokenizers` then */
        json_object_set_new(root, "normalizer", t->j_norm ? json_loads(t->j_norm, JSON_DECODE_ANY, NULL) : json_null());
        json_object_set_new(root, "pre_tokenizer", t->j_pt ? json_loads(t->j_pt, JSON_DECODE_ANY, NULL) : json_null());
        json_object_set_new(root, "post_processor", t->byte_level ? byte_level_obj(1, 1, 1) : json_null());
        json_object_set_new(root, "decoder", t->j_dec ? json_loads(t->j_dec, JSON_DECODE_ANY, NULL) : json_null());
    } else {
        json_object_set_new(root, "normalizer", json_null());
        json_object_set_new(root, "pre_tokenizer", byte_level_obj(t->add_prefix_space, 1, t->use_regex));
        json_object_set_new(root, "post_processor", byte_level_obj(1, 1, 1));
        json_object_set_new(root, "decoder", byte_level_obj(1, 1, 1));
    }
    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token",
                        t->unk_id >= 0 ? json_stringn(t->tok[t->unk_id].str, t->tok[t->unk_id].str_len) : json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_boolean(t->fuse_unk));
    json_object_set_new(model, "byte_fallback", json_boolean(t->byte_fallback));
    json_object_set_new(model, "ignore_merges", json_boolean(t->ignore_merges));
    json_object_set_new(model, "vocab", vocab_obj(t, 0));
    /* merges as "a b" strings (readable by every `tokenizers` version) unless a token holds a
     * space, which only the [a, b] spelling can carry */
    int pairs = 0;
    for (uint32_t m = 0; m < t->n_merges && !pairs; m++)
        for (int j = 0; j < 2; j++)
            if (memchr(t->tok[t->merges[m][j]].str, ' ', t->tok[t->merges[m][j]].str_len)) pairs = 1;
    json_t *merges = json_array();
    for (uint32_t m = 0; m < t->n_merges; m++) {
        const bpe_token *a = &t->tok[t->merges[m][0]], *b = &t->tok[t->merges[m][1]];
        if (pairs) {
            json_t *p = json_array();
            json_array_append_new(p, json_stringn(a->str, a->str_len));
            json_array_append_new(p, json_stringn(b->str, b->str_len));
            json_array_append_new(merges, p);
        } else {
            char *s = loom_malloc(a->str_len + b->str_len + 2);
            memcpy(s, a->str, a->str_len);
            s[a->str_len] = ' ';
            memcpy(s + a->str_len + 1, b->str, b->str_len);
            json_array_append_new(merges, json_stringn(s, a->str_len + 1 + b->str_len));
            free(s);
        }
    }
    json_object_set_new(model, "merges", merges);
    json_object_set_new(root, "model", model);
    char *s = json_dumps(root, compact ? JSON_COMPACT : JSON_INDENT(2));
    json_decref(root);
    LOOM_CHECK(s != NULL);
    return s;
}

int loom_tokenizer_save_json(const loom_tokenizer *t, const char *path, loom_err *err) {
    if (t->kind != LOOM_TOKENIZER_BPE) return loom_errf(err, "%s: a byte tokenizer has no tokenizer.json", path);
    char *s = bpe_json_text(t, 0);
    size_t n = strlen(s);
    s = loom_realloc(s, n + 2);
    s[n++] = '\n';
    int rc = loom_write_file_atomic(path, s, n, err);
    free(s);
    return rc;
}

int loom_tokenizer_save_vocab_merges(const loom_tokenizer *t, const char *vocab_path,
                                     const char *merges_path, loom_err *err) {
    if (t->kind != LOOM_TOKENIZER_BPE) return loom_errf(err, "%s: a byte tokenizer has no vocab.json", vocab_path);
    if (t->general)
        return loom_errf(err, "%s: this tokenizer has normalizers or pre-tokenizers that vocab.json + merges.txt cannot "
                              "describe; save it as tokenizer.json", vocab_path);
    for (uint32_t m = 0; m < t->n_merges; m++)
        for (int j = 0; j < 2; j++)
            if (memchr(t->tok[t->merges[m][j]].str, ' ', t->tok[t->merges[m][j]].str_len))
                return loom_errf(err, "%s: merge %u has a token with a space, which merges.txt cannot hold", merges_path, m);
    json_t *v = vocab_obj(t, 1);
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    LOOM_CHECK(s != NULL);
    int rc = loom_write_file_atomic(vocab_path, s, strlen(s), err);
    free(s);
    if (rc) return -1;
    size_t cap = 64, n = 0;
    for (uint32_t m = 0; m < t->n_merges; m++)
        cap += t->tok[t->merges[m][0]].str_len + t->tok[t->merges[m][1]].str_len + 2;
    char *buf = loom_malloc(cap);
    n += (size_t)snprintf(buf, cap, "#version: 0.2\n");
    for (uint32_t m = 0; m < t->n_merges; m++) {
        const bpe_token *a = &t->tok[t->merges[m][0]], *b = &t->tok[t->merges[m][1]];
        memcpy(buf + n, a->str, a->str_len);
        n += a->str_len;
        buf[n++] = ' ';
        memcpy(buf + n, b->str, b->str_len);
        n += b->str_len;
        buf[n++] = '\n';
    }
    rc = loom_write_file_atomic(merges_path, buf, n, err);
    free(buf);
    return rc;
}

/* ---- Hugging Face interop ------------------------------------------------------------------ */
char *loom_tokenizer_hf_json(const loom_tokenizer *t) {
    /* A byte tokenizer is a byte-level BPE without merges: the vocabulary is the 256 byte
     * characters with id = byte, its specials are added tokens, and with no merges every byte
     * stays its own token whatever the pre-tokenizer splits, so `tokenizers` encodes exactly
     * as loom's byte tokenizer does. */
    return bpe_json_text(t, 0);
}

int loom_tokenizer_is_plain_bytes(const loom_tokenizer *t) {
    if (t->kind == LOOM_TOKENIZER_BYTE) return t->vocab_size == 256;
    if (t->general || t->vocab_size != 256 || t->n_added != 0 || t->n_merges != 0 || t->add_prefix_space ||
        t->byte_fallback)
        return 0;
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] != b) return 0;
    return 1;
}
