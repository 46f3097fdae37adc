/* safetensors (Hugging Face's tensor container): 8-byte little-endian header length, JSON
 * header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the raw data.
 * loom writes F32 tensors (and F64 / I32 where a tensor says so); reading validates the header strictly (size limits, offsets in
 * bounds, no overlap, dtype and shape consistent with the byte length, duplicate keys
 * rejected). Part of src/base (src/base/safetensors.c). */
#ifndef LOOM_SAFETENSORS_H
#define LOOM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "loom/base.h"

/* ---- safetensors --------------------------------------------------------------------- */
typedef struct loom_st_tensor {
    const char *name;
    const float *data;  /* F32; with dtype set, the elements of that dtype (cast) */
    int ndim;           /* 0..8 */
    int64_t shape[8];
    const char *dtype;  /* NULL: "F32"; or any safetensors dtype name ("F64", "I32", ...) */
} loom_st_tensor;

/* metadata: NULL or NULL-terminated array of key, value, key, value, ..., NULL */
int loom_safetensors_write(const char *path, const loom_st_tensor *tensors, int n,
                           const char *const *metadata, loom_err *err);
/* Same bytes into a malloc'd buffer. */
int loom_safetensors_serialize(const loom_st_tensor *tensors, int n,
                               const char *const *metadata, char **out, size_t *len,
                               loom_err *err);

typedef struct loom_st_file loom_st_file;
int loom_safetensors_open(const char *path, loom_st_file **out, loom_err *err);
/* Parses an in-memory buffer (not copied; must outlive the handle). name is for messages. */
int loom_safetensors_parse(const char *buf, size_t len, const char *name, loom_st_file **out,
                           loom_err *err);
void loom_safetensors_close(loom_st_file *f);
int loom_safetensors_count(const loom_st_file *f);
/* the i-th tensor's name, in sorted name order */
const char *loom_safetensors_name(const loom_st_file *f, int i);
/* Parses a file's header alone: head holds the file's first bytes (at least 8 + the header
 * length), file_len the whole file's size, against which every data offset is checked.
 * Tensor data is then not reachable through get/read_into; locate gives where it lies. */
int loom_safetensors_parse_header(const char *head, size_t head_len, uint64_t file_len,
                                  const char *name, loom_st_file **out, loom_err *err);
/* An F32 tensor's byte offset in the file (8 + header length + its begin), ndim, shape. */
int loom_safetensors_locate(const loom_st_file *f, const char *name, uint64_t *file_offset,
                            int *ndim, int64_t shape[8], loom_err *err);

/* Looks a tensor up; returns -1 with an error naming the file when absent or not F32. */
int loom_safetensors_get(const loom_st_file *f, const char *name, const float **data,
                         int *ndim, int64_t shape[8], loom_err *err);
/* Copies a tensor into dst after checking it has exactly the expected shape. */
int loom_safetensors_read_into(const loom_st_file *f, const char *name, float *dst, int ndim,
                               const int64_t *shape, loom_err *err);
/* A tensor's dtype name ("F32", "BF16", ...), ndim and shape; NULL when there is none of
 * that name. */
const char *loom_safetensors_dtype(const loom_st_file *f, const char *name, int *ndim,
                                   int64_t shape[8]);
/* Like read_into, for an F32, F16, BF16 or F64 tensor, converted to float (F16 and BF16
 * exactly; F64 rounded). Other dtypes are an error naming the tensor. */
int loom_safetensors_read_as_f32(const loom_st_file *f, const char *name, float *dst, int ndim,
                                 const int64_t *shape, loom_err *err);
/* Copies a tensor's raw elements into dst after checking its dtype is exactly `dtype` and its
 * shape exactly the expected one (no conversion: bit for bit). */
int loom_safetensors_read_raw(const loom_st_file *f, const char *name, const char *dtype,
                              void *dst, int ndim, const int64_t *shape, loom_err *err);
/* metadata value or NULL */
const char *loom_safetensors_metadata(const loom_st_file *f, const char *key);

#endif
