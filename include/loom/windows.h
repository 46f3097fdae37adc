/* Windows over labelled documents, for sequence classification of byte models.
 *
 * Every document (a doc-index entry of a labelled shard: for binary sources, a file, or the
 * part of it in one shard) gives, per epoch, its head window (offset 0), its tail window
 * (the last T tokens) and per_doc - 2 body windows at offsets drawn from (seed, epoch, the
 * document's content hash, window number); a document of at most T tokens gives one window,
 * padded at the end with pad_id. Windows are visited in a seeded permutation per epoch. The
 * offsets depend on nothing but those keys, so the state is two counters (epoch, position)
 * and resume is exact. */
#ifndef LOOM_WINDOWS_H
#define LOOM_WINDOWS_H

#include <stdint.h>
#include "loom/data.h"

typedef struct loom_windows loom_windows;

/* Fails when the dataset has unlabelled shards or no documents. */
int loom_windows_open(loom_dataset *d, int T, int per_doc, uint64_t seed, int shuffle,
                      int pad_id, loom_windows **out, loom_err *err);
void loom_windows_free(loom_windows *w);
uint64_t loom_windows_per_epoch(const loom_windows *w);
/* B windows into inputs (B,T) and their labels (B). */
void loom_windows_next(loom_windows *w, int B, int32_t *inputs, int32_t *labels);
void loom_windows_get_state(const loom_windows *w, uint64_t *epoch, uint64_t *position);
void loom_windows_set_state(loom_windows *w, uint64_t epoch, uint64_t position);

/* The class names of a dataset directory (dataset.json "classes"), malloc'd; *n gets the
 * count. Errors name the file. */
int loom_dataset_classes(const char *dir, char ***names, int *n, loom_err *err);
void loom_free_strings(char **s, int n);

#endif
