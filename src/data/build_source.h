/* Private to the data build (src/data/build*.c, source_*.c, filters.c, dedup.c): input files,
 * documents held in memory while a source is processed, and the processing steps.
 *
 * A source is processed as: collect its input files (source_files.c) -> read them into
 * documents (source_text.c, source_jsonl.c, source_binary.c) -> each step of the recipe in
 * order (filters.c, dedup.c), with counts before and after each -> tokenize and write shards
 * (build_shards.c). Documents live in one byte arena per source; they are referred to by offset so the
 * arena can grow. */
#ifndef LOOM_DATA_BUILD_SOURCE_H
#define LOOM_DATA_BUILD_SOURCE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "data/recipe.h"
#include "loom/base.h"

/* ---- input files ---- */
typedef struct loom_input {
    char *path;       /* as found (the walk's path, shown in reports and dataset.json) */
    char *rel;        /* relative to the source root (labels by path), or the path itself */
    char *real;       /* the resolved path that is opened */
    int source;       /* index into the recipe's sources */
    uint64_t bytes;
    int64_t mtime_ns;
    char sha256[65];  /* "" until hashed */
    dev_t dev;
    ino_t ino;
} loom_input;

/* Something a source skipped (a file, or a bad JSONL line), with the reason. */
typedef struct loom_skip {
    char *what;       /* a path, or path:line */
    char *why;
} loom_skip;

typedef struct loom_skips {
    loom_skip *v;     /* the first LOOM_SKIPS_KEPT are kept, all are counted */
    int n_kept;
    uint64_t count;
} loom_skips;
#define LOOM_SKIPS_KEPT 50
void loom_skips_add(loom_skips *s, const char *what, const char *why);
void loom_skips_free(loom_skips *s);

typedef struct loom_inputs {
    loom_input *v;
    int n, cap;
} loom_inputs;

/* Collects the input files of source si (sorted by path), appending them to `all`; files whose
 * (device, inode) is already in `all` are not added twice. Special files (FIFOs, sockets,
 * devices), symlinks that leave a directory source's root, symlinks to directories and
 * files that cannot be opened are skipped and recorded in `skipped` (reported by name).
 * Returns -1 when the path is missing, matches nothing, or leaves no file. */
int loom_inputs_collect(const loom_recipe *r, int si, loom_inputs *all, loom_skips *skipped,
                        loom_err *err);
void loom_inputs_free(loom_inputs *l);
/* Opens an input for reading without following a final symlink and without blocking on a
 * FIFO, and checks that it is still the regular file that was collected. Returns the fd. */
int loom_input_open(const loom_input *f, loom_err *err);
/* Reads a whole input (<= max bytes) into a malloc'd buffer. */
int loom_input_read(const loom_input *f, size_t max, uint8_t **out, size_t *len, loom_err *err);
/* SHA-256 of an input's bytes, streamed. */
int loom_input_sha256(const loom_input *f, char hex[65], loom_err *err);

/* ---- documents ---- */
typedef struct loom_doc {
    uint64_t off, len;   /* bytes [off, off+len) of the arena */
    int32_t label;       /* class id, -1 = none */
    int32_t input;       /* index into the build's inputs (for reports) */
    uint64_t seg0;       /* chat: its segments are segs[seg0, seg0 + n_seg) of the docs */
    uint32_t n_seg;      /* 0 for other kinds */
    uint32_t pair_seg;   /* kind: preference: the first pair_seg segments are the chosen
                          * conversation, the rest the rejected one; 0 otherwise */
} loom_doc;

typedef struct loom_docs {
    uint8_t *arena;
    uint64_t arena_len, arena_cap;
    loom_doc *v;
    size_t n, cap;
    struct loom_chat_seg *segs; /* chat: the segments of every document (ends relative to it) */
    size_t n_segs, cap_segs;
} loom_docs;

void loom_docs_add(loom_docs *d, const void *p, size_t len, int32_t label, int32_t input);
/* Appends bytes to the arena only; returns their offset. */
uint64_t loom_docs_put(loom_docs *d, const void *p, size_t len);
void loom_docs_free(loom_docs *d);
static inline const uint8_t *loom_doc_bytes(const loom_docs *d, size_t i) {
    return d->arena + d->v[i].off;
}

/* ---- readers: one per kind; append the documents of input `fi` to docs ---- */
typedef struct loom_read_ctx {
    const loom_recipe *r;
    const loom_recipe_source *src;
    loom_inputs *inputs;
    loom_docs *docs;
    loom_skips *bad_lines;    /* jsonl: bad lines skipped with on_error: skip */
    loom_skips *unlabeled;    /* binary: files without a label (and no default_label) */
    uint64_t empty_docs;      /* documents dropped because they were empty */
    const struct loom_labels *labels;  /* binary with a labels file */
    const char *const *classes;        /* all class names of the build, sorted: id = index */
    int n_classes;
    const struct loom_chat_template *chat; /* chat: the source's template */
} loom_read_ctx;

int loom_read_text(loom_read_ctx *c, int fi, loom_err *err);
int loom_read_jsonl(loom_read_ctx *c, int fi, loom_err *err);
int loom_read_binary(loom_read_ctx *c, int fi, loom_err *err);

/* ---- labels (binary sources) ---- */
typedef struct loom_labels loom_labels;
/* Reads a labels file (.jsonl, or .csv with a header row) mapping `key` (path | sha256) to the
 * `field` value. Duplicate keys with different labels, missing columns and malformed lines are
 * errors naming file:line. */
int loom_labels_load(const char *path, const char *key, const char *field, loom_labels **out,
                     loom_err *err);
void loom_labels_free(loom_labels *l);
/* The label string of a key, or NULL. */
const char *loom_labels_find(const loom_labels *l, const char *key);
/* All distinct label strings (sorted, borrowed). */
int loom_labels_names(const loom_labels *l, const char ***names);

/* CSV: splits one record (RFC 4180: quotes, "" escapes) starting at *pos of text[0..len);
 * fields are malloc'd into *fields (n in *n_fields); *pos moves past the record's line end.
 * Returns 0, or -1 with a message for an unterminated quote. */
int loom_csv_record(const char *text, size_t len, size_t *pos, char ***fields, int *n_fields,
                    int *lines_used, loom_err *err);

/* ---- steps: counts per step are kept for dataset.json ---- */
typedef struct loom_step_count {
    const char *step;
    uint64_t docs_in, docs_out, bytes_in, bytes_out;
    uint64_t changed;   /* utf8_repair: documents that held invalid UTF-8 */
} loom_step_count;

/* Shared state of exact dedup across sources (dedup_across_sources). */
typedef struct loom_hashset loom_hashset;
loom_hashset *loom_hashset_new(void);
void loom_hashset_free(loom_hashset *h);

/* Runs one step over docs in place (keeps the order of the kept documents). global = the
 * cross-source exact-dedup set, or NULL. */
int loom_step_run(const loom_recipe_step *st, int is_text, loom_docs *docs, loom_hashset *global,
                  loom_step_count *count, loom_err *err);

/* Individual steps, exposed for the unit tests. */
size_t loom_utf8_repair(const uint8_t *p, size_t n, uint8_t *out /* 3*n, or NULL to measure */);
int loom_utf8_valid(const uint8_t *p, size_t n);
/* keep[i] = 0 for documents that are near-duplicates of an earlier kept one */
void loom_near_dedup(const loom_docs *docs, int num_perm, int bands, int shingle, double threshold,
                     int chars, uint8_t *keep);
void loom_exact_dedup(const loom_docs *docs, loom_hashset *set, uint8_t *keep);
/* loom_minhash and the LSH index: include/loom/data.h */

#endif
