/* The data build's records: manifest lines and dataset.json (docs/data-format.md)
 * (build_internal.h). */
#define _GNU_SOURCE
#include "data/build_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static json_t *jstr(const char *s) {
    json_t *j = json_string(s);
    return j ? j : json_string("<not valid UTF-8>");
}

/* ---- manifest ---- */
int build_append_line(build *b, int split, json_t *line, loom_err *err) {
    char *s = json_dumps(line, JSON_COMPACT);
    LOOM_CHECK(s != NULL);
    char mpath[4300];
    loom_pathf(mpath, sizeof mpath, "%s/%s/manifest.jsonl", b->tmp, SPLITS[split]);
    int rc = loom_append_line(mpath, s, err);
    free(s);
    return rc;
}

json_t *build_manifest_line(const build *b, const loom_recipe_source *s, const char *name,
                             const char *sha, uint64_t tokens, uint64_t docs, const char *created) {
    json_t *o = json_object();
    json_object_set_new(o, "shard", json_string(name));
    json_object_set_new(o, "sha256", json_string(sha));
    json_object_set_new(o, "tokens", json_integer((json_int_t)tokens));
    json_object_set_new(o, "docs", json_integer((json_int_t)docs));
    json_object_set_new(o, "source", json_string(s->name));
    json_object_set_new(o, "recipe", json_string(b->r.sha256));
    json_object_set_new(o, "created", json_string(created));
    json_object_set_new(o, "weight", json_real(s->weight));
    json_object_set_new(o, "repeat_cap", json_real(s->repeat_cap));
    return o;
}

/* ---- dataset.json ---- */
static json_t *skips_json(const loom_skips *k) {
    json_t *o = json_object(), *a = json_array();
    json_object_set_new(o, "count", json_integer((json_int_t)k->count));
    for (int i = 0; i < k->n_kept; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "what", jstr(k->v[i].what));
        json_object_set_new(e, "why", jstr(k->v[i].why));
        json_array_append_new(a, e);
    }
    json_object_set_new(o, "first", a);
    return o;
}

static json_t *source_json(const build *b, int si) {
    const src_state *st = &b->src[si];
    const loom_recipe_source *s = &b->r.sources[si];
    json_t *o;
    if (st->reuse && st->old_obj) {
        o = json_deep_copy(st->old_obj);
        json_object_set_new(o, "built", json_string("reused"));
        return o;
    }
    o = json_object();
    json_object_set_new(o, "name", json_string(s->name));
    json_object_set_new(o, "kind", json_string(s->kind_name));
    json_object_set_new(o, "key", json_string(st->key));
    json_object_set_new(o, "built", json_string("rebuilt"));
    json_object_set_new(o, "weight", json_real(s->weight));
    json_object_set_new(o, "repeat_cap", json_real(s->repeat_cap));
    json_object_set_new(o, "files", json_integer(st->n_files));
    json_object_set_new(o, "skipped_files", skips_json(&st->skipped));
    if (s->kind == LOOM_SRC_JSONL || s->kind == LOOM_SRC_CHAT)
        json_object_set_new(o, "bad_lines", skips_json(&st->bad_lines));
    if (s->kind == LOOM_SRC_CHAT) {
        json_object_set_new(o, "template", json_string(s->chat_template));
        json_object_set_new(o, "pack", json_boolean(s->pack));
        if (!s->pack && s->drop_long)
            json_object_set_new(o, "dropped_too_long", json_integer((json_int_t)st->dropped_long));
    }
    if (s->kind == LOOM_SRC_BINARY && st->labels) {
        json_object_set_new(o, "unlabeled", skips_json(&st->unlabeled));
        json_t *l = json_object();
        json_object_set_new(l, "file", jstr(s->labels));
        json_object_set_new(l, "sha256", json_string(st->labels_sha));
        json_object_set_new(l, "key", json_string(s->label_key));
        json_object_set_new(l, "field", jstr(s->label_field));
        json_object_set_new(o, "labels", l);
    }
    json_object_set_new(o, "empty_documents", json_integer((json_int_t)st->empty_docs));
    json_t *steps = json_array();
    for (int k = 0; k < st->n_counts; k++) {
        const loom_step_count *c = &st->counts[k];
        json_t *e = json_object();
        json_object_set_new(e, "step", json_string(c->step));
        if (k > 0) {
            json_object_set_new(e, "docs_in", json_integer((json_int_t)c->docs_in));
            json_object_set_new(e, "bytes_in", json_integer((json_int_t)c->bytes_in));
        }
        json_object_set_new(e, "docs_out", json_integer((json_int_t)c->docs_out));
        json_object_set_new(e, "bytes_out", json_integer((json_int_t)c->bytes_out));
        if (!strcmp(c->step, "utf8_repair")) json_object_set_new(e, "changed", json_integer((json_int_t)c->changed));
        json_array_append_new(steps, e);
    }
    json_object_set_new(o, "steps", steps);
    json_t *splits = json_object();
    for (int sp = 0; sp < 2; sp++) {
        json_t *x = json_object();
        json_object_set_new(x, "shards", json_integer((json_int_t)st->split[sp].shards));
        json_object_set_new(x, "tokens", json_integer((json_int_t)st->split[sp].tokens));
        json_object_set_new(x, "documents", json_integer((json_int_t)st->split[sp].docs));
        json_object_set_new(x, "doc_index_entries", json_integer((json_int_t)st->split[sp].pieces));
        json_object_set_new(splits, SPLITS[sp], x);
    }
    json_object_set_new(o, "splits", splits);
    return o;
}

int build_write_dataset_json(const build *b, int sp, loom_err *err) {
    const loom_recipe *r = &b->r;
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string("loom-dataset"));
    json_object_set_new(o, "format_version", json_integer(1));
    json_object_set_new(o, "name", jstr(r->name));
    json_object_set_new(o, "split", json_string(SPLITS[sp]));
    json_t *rec = json_object();
    json_object_set_new(rec, "path", jstr(r->file));
    json_object_set_new(rec, "sha256", json_string(r->sha256));
    json_t *text = json_stringn(r->text, r->text_len);
    json_object_set_new(rec, "text", text ? text : json_null());
    json_object_set_new(o, "recipe", rec);
    json_t *inputs = json_array();
    for (int i = 0; i < b->in.n; i++) {
        const loom_input *f = &b->in.v[i];
        json_t *x = json_object();
        json_object_set_new(x, "source", jstr(r->sources[f->source].name));
        json_object_set_new(x, "path", jstr(f->path));
        json_object_set_new(x, "bytes", json_integer((json_int_t)f->bytes));
        json_object_set_new(x, "sha256", json_string(f->sha256));
        json_object_set_new(x, "mtime_ns", json_integer((json_int_t)f->mtime_ns));
        json_array_append_new(inputs, x);
    }
    json_object_set_new(o, "inputs", inputs);
    split_stats tot = {0};
    for (int i = 0; i < r->n_sources; i++) {
        tot.shards += b->src[i].split[sp].shards;
        tot.tokens += b->src[i].split[sp].tokens;
        tot.docs += b->src[i].split[sp].docs;
        tot.pieces += b->src[i].split[sp].pieces;
    }
    json_t *counts = json_object();
    json_object_set_new(counts, "shards", json_integer((json_int_t)tot.shards));
    json_object_set_new(counts, "tokens", json_integer((json_int_t)tot.tokens));
    json_object_set_new(counts, "documents", json_integer((json_int_t)tot.docs));
    json_object_set_new(counts, "doc_index_entries", json_integer((json_int_t)tot.pieces));
    json_object_set_new(o, "counts", counts);
    /* the manifest as built: its order is the sample order, so `data verify` checks it */
    char mpath[4300], *mtext = NULL;
    size_t mlen = 0;
    loom_pathf(mpath, sizeof mpath, "%s/%s/manifest.jsonl", b->tmp, SPLITS[sp]);
    if (loom_read_file(mpath, (size_t)1 << 30, &mtext, &mlen, err) != 0) {
        json_decref(o);
        return -1;
    }
    char mhex[65];
    loom_sha256_hex(mtext, mlen, mhex);
    json_t *order = json_array();
    for (char *line = mtext, *nl; line < mtext + mlen; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(mtext + mlen - line));
        if (!nl) nl = mtext + mlen;
        json_t *e = json_loadb(line, (size_t)(nl - line), 0, NULL);
        const char *name = json_string_value(json_object_get(e, "shard"));
        json_array_append_new(order, json_string(name ? name : ""));
        json_decref(e);
    }
    free(mtext);
    json_t *man = json_object();
    json_object_set_new(man, "sha256", json_string(mhex));
    json_object_set_new(man, "shards", order);
    json_object_set_new(o, "manifest", man);
    json_t *tok = json_object();
    json_object_set_new(tok, "id", json_string(b->tok_id));
    json_object_set_new(tok, "vocab_size", json_integer(b->vocab));
#ifdef LOOM_HAVE_BPE
    if (b->tok) json_object_set_new(tok, "file", json_string("tokenizer.json"));
#endif
    json_object_set_new(o, "tokenizer", tok);
    json_object_set_new(o, "seq_len", json_integer((json_int_t)r->seq_len));
    json_object_set_new(o, "val_fraction", json_real(r->val_fraction));
    json_object_set_new(o, "shard_tokens", json_integer((json_int_t)r->shard_tokens));
    json_object_set_new(o, "dedup_across_sources", json_boolean(r->dedup_across_sources));
    if (b->n_classes) {
        json_t *cl = json_array();
        for (int i = 0; i < b->n_classes; i++) json_array_append_new(cl, jstr(b->classes[i]));
        json_object_set_new(o, "classes", cl);
    }
    json_t *srcs = json_array();
    for (int i = 0; i < r->n_sources; i++) json_array_append_new(srcs, source_json(b, i));
    json_object_set_new(o, "sources", srcs);
    json_object_set_new(o, "loom_version", json_string(LOOM_VERSION));
    char *s = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    LOOM_CHECK(s != NULL);
    char path[4300];
#ifdef LOOM_HAVE_BPE
    /* a BPE dataset carries its tokenizer (canonical tokenizer.json, whose id the shards hold):
     * training records it in checkpoints, generate and eval encode and decode with it */
    if (b->tok) {
        loom_pathf(path, sizeof path, "%s/%s/tokenizer.json", b->tmp, SPLITS[sp]);
        if (loom_tokenizer_save_json(b->tok, path, err) != 0) {
            free(s);
            return -1;
        }
    }
#endif
    loom_pathf(path, sizeof path, "%s/%s/dataset.json", b->tmp, SPLITS[sp]);
    size_t n = strlen(s);
    s = loom_realloc(s, n + 2);
    s[n] = '\n';
    s[n + 1] = 0;
    int rc = loom_write_file_atomic(path, s, n + 1, err);
    free(s);
    return rc;
}
