/* loom synth's private header: the pipeline, its items, validators, generators, the cache, and
 * the functions the files of src/synth/ share (docs/synth.md). One file per concern:
 *   pipeline.c  the pipeline file (read by base's loom_yaml_json_file): its keys, the generator's
 *               and validators' identities
 *   seeds.c     seed sources (text, JSONL, zstd) and templates
 *   minhash.c   the near_duplicate validator's MinHash index
 *   validate.c  the per-item validators (length, regex, json, command) and the validation pool
 *   score.c     the score validator (mean log-likelihood under a checkpoint)
 *   cache.c     the content-hash cache of generations and verdicts
 *   http.c      the HTTP (OpenAI-compatible) generator
 *   local.c     the local generator (the batched engine)
 *   spread.c    spreading the items over MPI ranks
 *   synth.c     the runner (rounds, duplicates in item order, the output) */
#ifndef LOOM_SYNTH_INTERNAL_H
#define LOOM_SYNTH_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/json_util.h"
#include "loom/chat.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/infer.h"
#include "loom/synth.h"
#include "loom/tokenizer.h"

/* ---- small helpers ---------------------------------------------------------------------- */

static inline void sb_str(loom_sbuf *b, const char *s) { loom_sbuf_append(b, s, strlen(s)); }

static inline uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* ---- MinHash (minhash.c) ---- */
typedef struct mh_index {
    int perms, bands, shingle;
    double threshold;
    loom_minhash_index *ix;     /* the seeds' and the accepted samples' signatures */
} mh_index;

/* ---- the content-hash cache (cache.c) ---- */
typedef struct cache {
    int on;
    char dir[4096];
    json_t *gen, *val;
    FILE *fg, *fv;
    long long gen_hits, gen_runs, val_hits, val_runs, skipped;
    int torn[2];                /* the file ends without a newline (generations, validations) */
} cache;

/* ---- the scoring model (score.c) ---- */
typedef struct scorer {
    char ckpt[1024];
    char *prefix;
    pthread_mutex_t mu;
    int loaded, failed;
    loom_err err;
    loom_model *m;
    loom_tokenizer *tok;
    int T, V;
    int32_t *in, *tg;
} scorer;

/* ---- seeds (seeds.c) ---- */
typedef struct seeds {
    char **v;
    size_t *len;
    int n, cap;
} seeds;

/* ---- validators (validate.c) ---- */
enum { V_LENGTH, V_REGEX, V_JSON, V_COMMAND, V_UNIQUE, V_NEARDUP, V_SCORE };

typedef struct validator {
    int kind;
    char name[64];
    long long min, max;          /* length (bytes) */
    pcre2_code *re;              /* regex */
    json_t *schema;              /* json (NULL: parse only) */
    char **argv;                 /* command */
    int argc;
    double timeout_s;
    mh_index *mh;                /* near_duplicate */
    scorer *sc;                  /* score */
    double smin, smax;           /* score: the accepted range */
    char key[65];                /* the cache key of the settings (command, score) */
} validator;

/* ---- generators (http.c, local.c) ---- */
typedef struct gen_cfg {
    int http;
    char url[1024];
    char model[256];
    char checkpoint[1024];
    int max_tokens, top_k, concurrency, retries, chat, batch;
    int bf16;                   /* generator.weights: bf16 (local; docs/inference.md) */
    int cbf16;                  /* generator.compute: bf16 (local; implies weights bf16) */
    int int8;                   /* generator.weights: int8 (local; GGUF Q8_0, docs/inference.md) */
    int int4;                   /* generator.weights: int4 (local; GGUF Q4_K where it fits) */
    double temperature, top_p, timeout_s;
    char *stop[17];             /* + the chat template's end of turn (local) */
    int n_stop;
    loom_chat_template *chat_tpl; /* local chat form: generator.chat_template */
    json_t *schema;             /* generator.json_schema: the schema (NULL: none) */
    char *schema_key;           /* its canonical text (the cache key's part) */
    struct loom_grammar *grammar; /* local: the schema compiled (docs/inference.md) */
} gen_cfg;

typedef struct item {
    int seed_idx, sample;
    int attempt;
    int done, accepted;
    char *prompt;               /* this attempt's prompt */
    char *text;                 /* this attempt's output */
    size_t tlen;
    int gen_ok;
    char gen_err[1536];
    int failed_validator;       /* -1: all passed */
    char vmsg[1024];
    json_t *results;            /* this attempt's validator results */
    int tokens;
    int gen_hit;                /* the output came from the cache */
    int cached;                 /* this attempt's outcome went into the cache */
    char gkey[65];              /* its generation's cache key ("" without a cache) */
    json_t *vfresh;             /* validation results to add to the cache */
    int val_hits, val_runs;
} item;

typedef struct http_pool {
    const gen_cfg *g;
    item **items;
    int n;
    int next;
    uint64_t seed;
    pthread_mutex_t mu;
} http_pool;

/* the sampling seed of an item's attempt (62 bits: it travels as a JSON integer) */
static inline uint64_t item_seed(uint64_t seed, const item *it) {
    return 0x3fffffffffffffffull & loom_mix64(seed ^ loom_mix64((uint64_t)it->seed_idx * 1000003ull + (uint64_t)it->sample) ^
                      ((uint64_t)it->attempt << 48));
}

/* ---- the pipeline (pipeline.c) ---- */
typedef struct pipeline {
    const char *path;
    json_t *root;
    seeds sd;
    char *template_name;
    const char *tpl;
    const char *feedback;
    gen_cfg g;
    validator *v;
    int nv;
    int max_attempts, samples;
    uint64_t seed;
    const char *output, *summary, *rejected;
    char *gen_id;               /* the generator's identity and settings (cache keys) */
    cache C;
} pipeline;

/* the local generator: every pending prompt through the engine at once */
typedef struct local_gen {
    loom_model *m;
    loom_tokenizer *tok;
    loom_engine *eng;
    int tp, tp_rank;              /* the tp view this rank holds (tp 1: the whole model) */
    loom_comm_points tp_points;   /* its tp group's points (tp > 1) */
} local_gen;

/* validation in parallel (validate.c) */
typedef struct vpool {
    pipeline *P;
    item **items;
    int n, next;
    pthread_mutex_t mu;
} vpool;

/* pipeline.c */
int synth_parse_pipeline(pipeline *P, loom_err *err);
/* seeds.c */
int synth_load_seeds(const char *where, json_t *list, seeds *s, loom_err *err);
void synth_render(loom_sbuf *out, const char *tpl, const char *seed, size_t seed_len, const char *fb);
/* minhash.c */
void synth_mh_init(mh_index *m);
void synth_mh_free(mh_index *m);
void synth_mh_signature(const mh_index *m, const char *t, size_t n, uint64_t *sig);
void synth_mh_add(mh_index *m, const uint64_t *sig, int origin);
/* the most similar candidate in the pool: -1 when none; else 1 if it makes sig a near duplicate
 * (0 if not), *origin its origin (an item index, or -1 - the seed index), *best its estimate */
int synth_mh_query(mh_index *m, const uint64_t *sig, int *origin, double *best);
/* cache.c */
void synth_sha_hex_parts(char hex[65], const char *a, const char *b, size_t bn);
int synth_cache_open(cache *c, int writer, loom_err *err);
void synth_cache_close(cache *c);
int synth_cache_sync(cache *c, loom_err *err);
int synth_text_from_json(json_t *o, char **t, size_t *n);
void synth_cache_add(pipeline *P, item *it);
/* score.c */
int synth_score_text(scorer *s, const char *text, size_t len, double *score, char *msg, size_t n);
void synth_scorer_free(scorer *s);
/* validate.c */
void *synth_vworker(void *arg);
/* http.c */
void *synth_http_worker(void *arg);
/* local.c */
void synth_local_generate(pipeline *P, local_gen *L, item **items, int n);
int synth_local_open(pipeline *P, local_gen *L, loom_err *err);
/* spread.c */
int synth_owner_of(const pipeline *P, int k, int replicas);
int synth_pend_pos(item **pend, int np, const item *it);
void synth_exchange_items(loom_mesh *mesh, int rank, int world, int tp, item **pend, int np,
                    const pipeline *P);

#endif
