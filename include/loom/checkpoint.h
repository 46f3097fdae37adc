/* loom checkpoints (the safetensors format itself is in loom/safetensors.h).
 *
 * Checkpoint: a directory per step, ckpt/step_NNNNNNN/, holding any number of files
 * (safetensors and others), manifest.json with the SHA-256 of every file, and a COMPLETE
 * marker written last (temp + fsync + rename + directory fsync). A step directory without
 * COMPLETE is never loaded. Opening verifies every file's SHA-256. */
#ifndef LOOM_CHECKPOINT_H
#define LOOM_CHECKPOINT_H

#include <stdint.h>
#include <stddef.h>
#include "loom/base.h"
#include "loom/safetensors.h"

/* ---- checkpoint directories --------------------------------------------------------- */
typedef struct loom_ckpt_file {
    const char *name;  /* file name inside the step directory, no '/' */
    const void *data;
    size_t len;
} loom_ckpt_file;

/* Writes root/step_%07lld/ with the given files, manifest.json, then COMPLETE; then points
 * root/latest (a symlink) at it. An existing incomplete directory of that step is replaced.
 * out_dir (may be NULL) receives the step directory path. */
int loom_ckpt_save(const char *root, int64_t step, const loom_ckpt_file *files, int n,
                   char *out_dir, size_t out_size, loom_err *err);
/* The same protocol for several writers (one file per rank): one process prepares the step
 * directory (refusing a complete one, clearing what an interrupted save of these names left),
 * every writer writes its files with loom_ckpt_write_file (atomic), and after all of them
 * one process commits: hashes the files from disk into manifest.json, writes COMPLETE and
 * swings latest. loom_ckpt_save is prepare + write + commit in one process. */
int loom_ckpt_prepare(const char *root, int64_t step, const char *const *names, int n,
                      char *out_dir, size_t out_size, loom_err *err);
int loom_ckpt_write_file(const char *dir, const char *name, const void *data, size_t len,
                         loom_err *err);
int loom_ckpt_commit(const char *root, int64_t step, const char *const *names, int n,
                     char *out_dir, size_t out_size, loom_err *err);

/* Finds the newest step directory under root that has COMPLETE. *step = -1 and returns 0
 * when there is none (or root does not exist). */
int loom_ckpt_find_latest(const char *root, char *out_dir, size_t out_size, int64_t *step,
                          loom_err *err);
/* Resolves a user path: a step directory, a `latest` link, or a ckpt root / run directory
 * (then the newest complete step). */
int loom_ckpt_resolve(const char *path, char *out_dir, size_t out_size, loom_err *err);

typedef struct loom_ckpt loom_ckpt;
/* Opens a step directory: requires COMPLETE, reads manifest.json, verifies every listed
 * file's size and SHA-256 (a mismatch is an error naming the file). */
int loom_ckpt_open(const char *step_dir, loom_ckpt **out, loom_err *err);
void loom_ckpt_close(loom_ckpt *c);
int64_t loom_ckpt_step(const loom_ckpt *c);
const char *loom_ckpt_dir(const loom_ckpt *c);
/* The files listed in the manifest, in manifest order. */
int loom_ckpt_num_files(const loom_ckpt *c);
const char *loom_ckpt_file_name(const loom_ckpt *c, int i);
/* Contents of a verified file (owned by the handle, NUL-terminated); NULL if absent or
 * deferred. */
const char *loom_ckpt_file_data(const loom_ckpt *c, const char *name, size_t *len);

/* loom_ckpt_open, except that the files for which defer(name) is nonzero are not read: open
 * checks that they are regular files of the manifest's size and records their SHA-256; their
 * bytes are read (and verified) only through a reader. Used by inference loads, which need
 * the parameters of rank_*.safetensors and not the optimizer state beside them. */
int loom_ckpt_open_ex(const char *step_dir, int (*defer)(const char *name), loom_ckpt **out,
                      loom_err *err);
int loom_ckpt_file_deferred(const loom_ckpt *c, const char *name);

/* A reader streams one listed file front to back, once, through SHA-256: read copies the
 * bytes [offset, offset + len) into dst (offset at or after the end of the previous read; the
 * bytes between are hashed and dropped, through a 1 MiB buffer); finish hashes the rest and
 * checks the size and the manifest's SHA-256 (an error naming the file otherwise). Every byte
 * handed out is a byte that was hashed: a file changed between open and finish fails finish,
 * and what was read before must then be discarded. See docs/checkpoints.md. */
typedef struct loom_ckpt_reader loom_ckpt_reader;
int loom_ckpt_reader_open(const loom_ckpt *c, const char *name, loom_ckpt_reader **out,
                          loom_err *err);
uint64_t loom_ckpt_reader_size(const loom_ckpt_reader *r);
const char *loom_ckpt_reader_path(const loom_ckpt_reader *r);
int loom_ckpt_reader_read(loom_ckpt_reader *r, uint64_t offset, void *dst, size_t len,
                          loom_err *err);
int loom_ckpt_reader_finish(loom_ckpt_reader *r, loom_err *err);
void loom_ckpt_reader_close(loom_ckpt_reader *r);

#endif
