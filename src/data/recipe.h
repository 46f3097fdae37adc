/* Private: a parsed data recipe (YAML). The reference is docs/recipes.md.
 *
 * Keys the loader reads back from every manifest line of a source (written by the build):
 *   "weight":     the source's sampling weight (> 0, default 1)
 *   "repeat_cap": how many passes over this source's tokens the mixture may make before the
 *                 source is exhausted (> 0; 0 = no cap, the default). A float: 2.5 allows two
 *                 and a half passes. */
#ifndef LOOM_DATA_RECIPE_H
#define LOOM_DATA_RECIPE_H

#include <stddef.h>
#include <stdint.h>
#include "loom/base.h"

typedef enum { LOOM_SRC_TEXT, LOOM_SRC_JSONL, LOOM_SRC_BINARY, LOOM_SRC_CHAT } loom_source_kind;

typedef enum {
    LOOM_STEP_UTF8_REPAIR,
    LOOM_STEP_LENGTH,
    LOOM_STEP_REGEX,
    LOOM_STEP_DEDUP_EXACT,
    LOOM_STEP_DEDUP_NEAR
} loom_step_kind;

typedef struct loom_recipe_step {
    loom_step_kind kind;
    int line;                  /* where the step is written in the recipe */
    int64_t min_bytes, max_bytes;   /* length: keep docs with min <= bytes <= max */
    char *include, *exclude;   /* regex: PCRE2 patterns (UTF); NULL = not given */
    void *include_re, *exclude_re;  /* compiled pcre2_code (owned) */
    int num_perm, bands, shingle;   /* dedup_near */
    double threshold;
} loom_recipe_step;

typedef struct loom_recipe_source {
    char *name;
    loom_source_kind kind;
    char *kind_name;   /* "text" | "jsonl" | "binary" */
    char *path;        /* file, directory or glob (binary: a directory) */
    char **exclude;    /* (n_exclude) fnmatch patterns on file names */
    int n_exclude;
    char *split;       /* text: document separator, NULL = one document per file */
    size_t split_len;
    char *doc_suffix;  /* appended to each document at tokenization, NULL = nothing */
    size_t doc_suffix_len;
    /* jsonl */
    char *text_field;      /* default "text" */
    int on_error_skip;     /* on_error: skip (1) | fail (0, default) */
    int64_t max_line_bytes;  /* default 64 MiB */
    /* chat (also uses on_error and max_line_bytes) */
    char *chat_template;   /* chatml (default) | llama3 | a JSON template file */
    char *messages_field;  /* default "messages" */
    int pack;              /* 1 (default): conversations back to back; 0: each padded to a
                            * multiple of seq_len, so a window never mixes two */
    int preference;        /* kind: preference (a chat source whose rows are (prompt, chosen,
                            * rejected) pairs: pack 0, drop_long 1, each half one window) */
    int drop_long;         /* pack 0: a conversation longer than seq_len is dropped (1) or
                            * continues into the next window (0, too_long: split) */
    /* binary */
    char *labels;          /* labels file (.jsonl or .csv), NULL = unlabeled */
    char *label_key;       /* "path" (relative to the source root, default) | "sha256" */
    char *label_field;     /* default "label" */
    char *default_label;   /* unlabeled files get it; NULL = skip and count them */
    /* mixing (copied into every manifest line of the source) */
    double weight;         /* > 0, default 1 */
    double repeat_cap;     /* >= 0, 0 = no cap (default) */
    loom_recipe_step *steps;
    int n_steps;
    char *canon;           /* canonical text of the source's YAML section (cache key input) */
    int line;              /* where the source starts in the recipe */
} loom_recipe_source;

typedef struct loom_recipe {
    char *file;        /* recipe path as given */
    char *text;        /* the recipe file's bytes */
    size_t text_len;
    char sha256[65];   /* of text */
    char *name;
    loom_recipe_source *sources;
    int n_sources;
    char *tokenizer;       /* type: "byte" | "bpe" */
    char *tokenizer_path;  /* bpe: tokenizer.json */
    int tokenizer_line;
    int64_t seq_len;
    double val_fraction;
    char *output;
    int64_t shard_tokens;
    int dedup_across_sources;  /* dedup_exact also drops documents kept by earlier sources */
} loom_recipe;

int loom_recipe_load(const char *path, loom_recipe *r, loom_err *err);
void loom_recipe_free(loom_recipe *r);
const char *loom_step_name(loom_step_kind k);

#endif
