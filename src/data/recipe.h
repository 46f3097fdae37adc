/* Private: a parsed data recipe (YAML). Keys are documented in docs/data-format.md. */
#ifndef LOOM_DATA_RECIPE_H
#define LOOM_DATA_RECIPE_H

#include <stddef.h>
#include <stdint.h>
#include "loom/base.h"

typedef struct loom_recipe_source {
    char *name;
    char *kind;        /* "text" */
    char *path;        /* file, directory or glob */
    char **exclude;    /* (n_exclude) fnmatch patterns on file names */
    int n_exclude;
    char *split;       /* document separator, NULL = one document per file */
    size_t split_len;
    char *doc_suffix;  /* appended to each document, NULL = nothing */
    size_t doc_suffix_len;
    int line;          /* where the source starts in the recipe */
} loom_recipe_source;

typedef struct loom_recipe {
    char *file;        /* recipe path as given */
    char *text;        /* the recipe file's bytes */
    size_t text_len;
    char sha256[65];   /* of text */
    char *name;
    loom_recipe_source *sources;
    int n_sources;
    char *tokenizer;
    int64_t seq_len;
    double val_fraction;
    char *output;
    int64_t shard_tokens;
} loom_recipe;

int loom_recipe_load(const char *path, loom_recipe *r, loom_err *err);
void loom_recipe_free(loom_recipe *r);

#endif
