/* safetensors: the Hugging Face tensor file format.
 *
 * Layout: u64 little-endian N, N bytes of UTF-8 JSON header, then the data buffer.
 * Header: {"__metadata__": {str: str}, "name": {"dtype": "F32", "shape": [..],
 * "data_offsets": [begin, end]}, ...}, offsets relative to the start of the data buffer.
 *
 * The writer emits F32 tensors back to back in the order given and pads the header with
 * spaces so that the data buffer starts at a multiple of 8 bytes (as the reference
 * implementation does). The reader treats the file as untrusted: every field is checked
 * before any byte of tensor data is touched, and every error names the file and tensor. */
#define _GNU_SOURCE
#include "loom/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "loom's safetensors code assumes a little-endian host"
#endif

#define ST_MAX_HEADER ((uint64_t)100 << 20) /* 100 MiB of JSON is far beyond any model */
#define ST_MAX_NDIM 8

/* ---- dtypes ------------------------------------------------------------------------- */
typedef struct {
    const char *name;
    size_t size;
} st_dtype;

static const st_dtype DTYPES[] = {
    {"F32", 4},     {"F64", 8},     {"F16", 2},     {"BF16", 2},     {"I64", 8},
    {"I32", 4},     {"I16", 2},     {"I8", 1},      {"U64", 8},      {"U32", 4},
    {"U16", 2},     {"U8", 1},      {"BOOL", 1},    {"F8_E4M3", 1},  {"F8_E5M2", 1},
};
enum { DT_F32 = 0, N_DTYPES = sizeof DTYPES / sizeof DTYPES[0] };

static int dtype_lookup(const char *s) {
    for (int i = 0; i < (int)N_DTYPES; i++)
        if (strcmp(DTYPES[i].name, s) == 0) return i;
    return -1;
}

/* ---- the handle --------------------------------------------------------------------- */
typedef struct {
    char *name;
    int dtype;
    int ndim;
    int64_t shape[ST_MAX_NDIM];
    uint64_t begin, end; /* relative to the data buffer */
} st_entry;

struct loom_st_file {
    char *path;         /* for messages */
    const char *data;   /* start of the data buffer (NULL: parsed from the header alone) */
    size_t data_len;
    uint64_t data_start; /* the data buffer's offset in the file: 8 + header length */
    st_entry *e;        /* sorted by begin */
    st_entry **by_name; /* sorted by name, for lookup */
    int n;
    char **meta_k, **meta_v;
    int n_meta;
    void *map; /* mmap of the file (open), or NULL */
    size_t map_len;
    void *copy; /* aligned copy of the file (open, when the header length is odd), or NULL */
};

static void fmt_shape(char *out, size_t size, int ndim, const int64_t *shape) {
    size_t used = 0;
    out[0] = 0;
    used += (size_t)snprintf(out, size, "[");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < size) snprintf(out + used, size - used, "]");
}

static void st_free(loom_st_file *f) {
    if (!f) return;
    if (f->e)
        for (int i = 0; i < f->n; i++) free(f->e[i].name);
    free(f->e);
    free(f->by_name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_k[i]);
        free(f->meta_v[i]);
    }
    free(f->meta_k);
    free(f->meta_v);
    if (f->map) munmap(f->map, f->map_len);
    free(f->copy);
    free(f->path);
    free(f);
}

void loom_safetensors_close(loom_st_file *f) { st_free(f); }

int loom_safetensors_count(const loom_st_file *f) { return f ? f->n : 0; }

const char *loom_safetensors_name(const loom_st_file *f, int i) {
    LOOM_CHECK(f && i >= 0 && i < f->n);
    return f->by_name[i]->name;
}

/* ---- writing ------------------------------------------------------------------------ */
static int numel_of(int ndim, const int64_t *shape, uint64_t *numel) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d) return -1;
        n *= d;
    }
    *numel = n;
    return 0;
}

int loom_safetensors_serialize(const loom_st_tensor *tensors, int n,
                               const char *const *metadata, char **out, size_t *len,
                               loom_err *err) {
    if (n < 0 || (n > 0 && !tensors)) return loom_errf(err, "safetensors: bad tensor list (n=%d)", n);
    int rc = -1;
    char *hdr = NULL;
    uint64_t *nbytes = loom_calloc((size_t)n + 1, sizeof *nbytes);
    json_t *root = json_object();
    LOOM_CHECK(root != NULL);

    if (metadata) {
        json_t *meta = json_object();
        LOOM_CHECK(meta != NULL);
        json_object_set_new(root, "__metadata__", meta);
        for (int i = 0; metadata[i]; i += 2) {
            const char *k = metadata[i], *v = metadata[i + 1];
            if (!v) {
                loom_errf(err, "safetensors: metadata key '%.200s' has no value", k);
                goto done;
            }
            if (json_object_get(meta, k)) {
                loom_errf(err, "safetensors: duplicate metadata key '%.200s'", k);
                goto done;
            }
            json_t *js = json_string(v);
            if (!js) {
                loom_errf(err, "safetensors: metadata '%.200s' is not valid UTF-8", k);
                goto done;
            }
            if (json_object_set_new(meta, k, js) != 0) {
                loom_errf(err, "safetensors: metadata key '%.200s' is not valid UTF-8", k);
                goto done;
            }
        }
    }

    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        const loom_st_tensor *t = &tensors[i];
        if (!t->name) {
            loom_errf(err, "safetensors: tensor %d has no name", i);
            goto done;
        }
        if (strcmp(t->name, "__metadata__") == 0) {
            loom_errf(err, "safetensors: '__metadata__' is reserved and cannot name a tensor");
            goto done;
        }
        if (json_object_get(root, t->name)) {
            loom_errf(err, "safetensors: duplicate tensor name '%.200s'", t->name);
            goto done;
        }
        if (t->ndim < 0 || t->ndim > ST_MAX_NDIM) {
            loom_errf(err, "safetensors: tensor '%.200s': ndim %d is outside 0..%d", t->name,
                      t->ndim, ST_MAX_NDIM);
            goto done;
        }
        uint64_t numel;
        if (numel_of(t->ndim, t->shape, &numel) != 0 || numel > (UINT64_MAX >> 3)) {
            char s[256];
            fmt_shape(s, sizeof s, t->ndim, t->shape);
            loom_errf(err, "safetensors: tensor '%.200s': invalid shape %s", t->name, s);
            goto done;
        }
        if (numel > 0 && !t->data) {
            loom_errf(err, "safetensors: tensor '%.200s' has no data", t->name);
            goto done;
        }
        const int dt = t->dtype ? dtype_lookup(t->dtype) : DT_F32;
        if (dt < 0) {
            loom_errf(err, "safetensors: tensor '%.200s': unknown dtype '%.40s'", t->name,
                      t->dtype);
            goto done;
        }
        nbytes[i] = numel * DTYPES[dt].size;
        if (offset > (UINT64_MAX >> 2) - nbytes[i]) {
            loom_errf(err, "safetensors: tensors too large in total");
            goto done;
        }
        json_t *ent = json_object(), *shape = json_array(), *offs = json_array();
        LOOM_CHECK(ent && shape && offs);
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)offset));
        json_array_append_new(offs, json_integer((json_int_t)(offset + nbytes[i])));
        json_object_set_new(ent, "dtype", json_string(DTYPES[dt].name));
        json_object_set_new(ent, "shape", shape);
        json_object_set_new(ent, "data_offsets", offs);
        if (json_object_set_new(root, t->name, ent) != 0) {
            loom_errf(err, "safetensors: tensor name '%.200s' is not valid UTF-8", t->name);
            goto done;
        }
        offset += nbytes[i];
    }

    hdr = json_dumps(root, JSON_COMPACT);
    LOOM_CHECK(hdr != NULL);
    size_t hl = strlen(hdr);
    size_t padded = (hl + 7) & ~(size_t)7;
    if ((uint64_t)padded > ST_MAX_HEADER) {
        loom_errf(err, "safetensors: header of %zu bytes exceeds the %" PRIu64 "-byte limit",
                  padded, ST_MAX_HEADER);
        goto done;
    }
    if (offset > (uint64_t)SIZE_MAX - 8 - padded) {
        loom_errf(err, "safetensors: file too large for this machine");
        goto done;
    }
    size_t total = 8 + padded + (size_t)offset;
    char *buf = loom_malloc(total);
    uint64_t n_le = padded; /* little-endian host (checked above) */
    memcpy(buf, &n_le, 8);
    memcpy(buf + 8, hdr, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    char *p = buf + 8 + padded;
    for (int i = 0; i < n; i++) {
        if (nbytes[i]) memcpy(p, tensors[i].data, (size_t)nbytes[i]);
        p += nbytes[i];
    }
    *out = buf;
    *len = total;
    rc = 0;
done:
    free(hdr);
    free(nbytes);
    json_decref(root);
    return rc;
}

int loom_safetensors_write(const char *path, const loom_st_tensor *tensors, int n,
                           const char *const *metadata, loom_err *err) {
    char *buf = NULL;
    size_t len = 0;
    if (loom_safetensors_serialize(tensors, n, metadata, &buf, &len, err) != 0)
        return loom_err_prefix(err, "%s", path);
    int rc = loom_write_file_atomic(path, buf, len, err);
    free(buf);
    return rc;
}

/* ---- reading ------------------------------------------------------------------------ */
static int cmp_begin(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    const st_entry *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* A JSON integer in [0, INT64_MAX]; reals, negatives and other types are rejected. */
static int json_nonneg(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (uint64_t)x;
    return 0;
}

static int parse_metadata(loom_st_file *f, json_t *meta, const char *name, loom_err *err) {
    if (!json_is_object(meta))
        return loom_errf(err, "%s: header: '__metadata__' is not an object", name);
    size_t m = json_object_size(meta);
    f->meta_k = loom_calloc(m + 1, sizeof(char *));
    f->meta_v = loom_calloc(m + 1, sizeof(char *));
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return loom_errf(err, "%s: header: metadata '%.200s' is not a string", name, k);
        f->meta_k[f->n_meta] = loom_strdup(k);
        f->meta_v[f->n_meta] = loom_strdup(json_string_value(v));
        f->n_meta++;
    }
    return 0;
}

static int parse_entry(st_entry *e, const char *key, json_t *v, size_t data_len,
                       const char *name, loom_err *err) {
    e->name = loom_strdup(key);
    if (!json_is_object(v))
        return loom_errf(err, "%s: tensor '%.200s': entry is not an object", name, key);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *of = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return loom_errf(err, "%s: tensor '%.200s': missing or non-string 'dtype'", name, key);
    e->dtype = dtype_lookup(json_string_value(dt));
    if (e->dtype < 0)
        return loom_errf(err, "%s: tensor '%.200s': unknown dtype '%.40s'", name, key,
                         json_string_value(dt));
    if (!json_is_array(sh))
        return loom_errf(err, "%s: tensor '%.200s': missing or non-array 'shape'", name, key);
    if (json_array_size(sh) > ST_MAX_NDIM)
        return loom_errf(err, "%s: tensor '%.200s': %zu dimensions, loom supports at most %d",
                         name, key, json_array_size(sh), ST_MAX_NDIM);
    e->ndim = (int)json_array_size(sh);
    for (int d = 0; d < e->ndim; d++) {
        uint64_t x;
        if (json_nonneg(json_array_get(sh, (size_t)d), &x) != 0)
            return loom_errf(err, "%s: tensor '%.200s': shape[%d] is not a non-negative integer",
                             name, key, d);
        e->shape[d] = (int64_t)x;
    }
    char s[256];
    fmt_shape(s, sizeof s, e->ndim, e->shape);
    uint64_t numel, size = DTYPES[e->dtype].size;
    if (numel_of(e->ndim, e->shape, &numel) != 0 || numel > UINT64_MAX / size)
        return loom_errf(err, "%s: tensor '%.200s': shape %s overflows 64 bits", name, key, s);
    if (!json_is_array(of) || json_array_size(of) != 2)
        return loom_errf(err, "%s: tensor '%.200s': 'data_offsets' must be [begin, end]", name,
                         key);
    if (json_nonneg(json_array_get(of, 0), &e->begin) != 0 ||
        json_nonneg(json_array_get(of, 1), &e->end) != 0)
        return loom_errf(err, "%s: tensor '%.200s': data_offsets are not non-negative integers",
                         name, key);
    if (e->begin > e->end || e->end > data_len)
        return loom_errf(err,
                         "%s: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] are outside the %zu-byte data buffer",
                         name, key, e->begin, e->end, data_len);
    if (e->end - e->begin != numel * size)
        return loom_errf(err,
                         "%s: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] hold %" PRIu64 " bytes, shape %s %s needs %" PRIu64,
                         name, key, e->begin, e->end, e->end - e->begin, s,
                         DTYPES[e->dtype].name, numel * size);
    return 0;
}

static int parse_into(loom_st_file *f, const char *buf, size_t len, const char *name,
                      loom_err *err) {
    if (len < 8)
        return loom_errf(err, "%s: file is %zu bytes, too short for the 8-byte header length",
                         name, len);
    uint64_t hl;
    memcpy(&hl, buf, 8);
    if (hl > (uint64_t)(len - 8))
        return loom_errf(err, "%s: header length %" PRIu64 " exceeds the %zu bytes after it (truncated, or "
                         "not a safetensors file)",
                         name, hl, len - 8);
    if (hl > ST_MAX_HEADER)
        return loom_errf(err, "%s: header length %" PRIu64 " exceeds the limit of %" PRIu64,
                         name, hl, ST_MAX_HEADER);
    if (hl == 0 || buf[8] != '{')
        return loom_errf(err, "%s: header does not start with '{' (not a safetensors file?)",
                         name);
    f->data = buf + 8 + hl;
    f->data_len = len - 8 - (size_t)hl;
    f->data_start = 8 + hl;

    json_error_t je;
    json_t *root = json_loadb(buf + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return loom_errf(err, "%s: header JSON, byte %lld: %s", name,
                         (long long)je.position + 8, je.text);
    int rc = -1;
    if (!json_is_object(root)) {
        loom_errf(err, "%s: header JSON is not an object", name);
        goto done;
    }
    size_t cap = json_object_size(root);
    f->e = loom_calloc(cap + 1, sizeof *f->e);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (parse_metadata(f, v, name, err) != 0) goto done;
            continue;
        }
        st_entry *e = &f->e[f->n++];
        if (parse_entry(e, key, v, f->data_len, name, err) != 0) goto done;
    }
    /* no two tensors may share bytes: sort by begin and compare neighbours */
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_begin);
    for (int i = 1; i < f->n; i++) {
        const st_entry *a = &f->e[i - 1], *b = &f->e[i];
        if (b->begin < a->end) {
            loom_errf(err,
                      "%s: tensors '%.200s' [%" PRIu64 ", %" PRIu64 "] and '%.200s' [%" PRIu64
                      ", %" PRIu64 "] overlap",
                      name, a->name, a->begin, a->end, b->name, b->begin, b->end);
            goto done;
        }
    }
    f->by_name = loom_calloc((size_t)f->n + 1, sizeof *f->by_name);
    for (int i = 0; i < f->n; i++) f->by_name[i] = &f->e[i];
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int loom_safetensors_parse(const char *buf, size_t len, const char *name, loom_st_file **out,
                           loom_err *err) {
    *out = NULL;
    if (!name) name = "<buffer>";
    loom_st_file *f = loom_calloc(1, sizeof *f);
    f->path = loom_strdup(name);
    if (!buf && len > 0) {
        st_free(f);
        return loom_errf(err, "%s: no buffer", name);
    }
    if (parse_into(f, buf ? buf : "", len, name, err) != 0) {
        st_free(f);
        return -1;
    }
    *out = f;
    return 0;
}

int loom_safetensors_parse_header(const char *head, size_t head_len, uint64_t file_len,
                                  const char *name, loom_st_file **out, loom_err *err) {
    *out = NULL;
    if (!name) name = "<buffer>";
    if (file_len > (uint64_t)SIZE_MAX) return loom_errf(err, "%s: file too large", name);
    uint64_t hl = 0;
    if (head && head_len >= 8) memcpy(&hl, head, 8);
    /* parse_into reads the 8 length bytes and the header, nothing of the data buffer */
    if (!head || head_len < 8 ||
        (file_len >= 8 && hl <= file_len - 8 && hl <= ST_MAX_HEADER && head_len < 8 + hl))
        return loom_errf(err, "%s: the header was not read in full", name);
    loom_st_file *f = loom_calloc(1, sizeof *f);
    f->path = loom_strdup(name);
    if (parse_into(f, head, (size_t)file_len, name, err) != 0) {
        st_free(f);
        return -1;
    }
    f->data = NULL;
    *out = f;
    return 0;
}

int loom_safetensors_open(const char *path, loom_st_file **out, loom_err *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loom_errf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return loom_errf(err, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return loom_errf(err, "%s: file is %lld bytes, too short for the 8-byte header length",
                         path, (long long)st.st_size);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return loom_errf(err, "%s: file too large for this machine", path);
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) return loom_errf(err, "%s: mmap failed: %s", path, strerror(map_errno));

    loom_st_file *f = loom_calloc(1, sizeof *f);
    f->path = loom_strdup(path);
    f->map = map;
    f->map_len = len;
    const char *buf = map;
    /* The mapping is page aligned, so the data buffer is 8-aligned exactly when the header
     * length is a multiple of 8 (true of every writer we know). Otherwise copy the file to
     * a position that aligns the data buffer, so F32 pointers from get are aligned. */
    uint64_t hl;
    memcpy(&hl, buf, 8);
    if ((8 + hl) % 8 != 0) {
        size_t pad = 8 - (size_t)((8 + hl) % 8);
        f->copy = loom_alloc_aligned(len + 8);
        memcpy((char *)f->copy + pad, map, len);
        munmap(map, len);
        f->map = NULL;
        buf = (const char *)f->copy + pad;
    }
    if (parse_into(f, buf, len, path, err) != 0) {
        st_free(f);
        return -1;
    }
    *out = f;
    return 0;
}

static const st_entry *find(const loom_st_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->by_name[mid]->name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

static const st_entry *find_f32(const loom_st_file *f, const char *name, loom_err *err) {
    const st_entry *e = find(f, name);
    if (!e) {
        loom_errf(err, "%s: no tensor named '%.200s'", f->path, name);
        return NULL;
    }
    if (e->dtype != DT_F32) {
        loom_errf(err, "%s: tensor '%.200s' has dtype %s; loom reads only F32", f->path, name,
                  DTYPES[e->dtype].name);
        return NULL;
    }
    return e;
}

int loom_safetensors_get(const loom_st_file *f, const char *name, const float **data,
                         int *ndim, int64_t shape[8], loom_err *err) {
    const st_entry *e = find_f32(f, name, err);
    if (!e) return -1;
    if (!f->data)
        return loom_errf(err, "%s: tensor '%.200s': only the header was parsed (use "
                              "loom_safetensors_locate)", f->path, name);
    const char *p = f->data + e->begin;
    if (((uintptr_t)p % sizeof(float)) != 0)
        return loom_errf(err,
                         "%s: tensor '%.200s' starts at data offset %" PRIu64
                         ", not 4-byte aligned; use loom_safetensors_read_into",
                         f->path, name, e->begin);
    if (data) *data = (const float *)(const void *)p;
    if (ndim) *ndim = e->ndim;
    if (shape) {
        for (int d = 0; d < ST_MAX_NDIM; d++) shape[d] = d < e->ndim ? e->shape[d] : 0;
    }
    return 0;
}

int loom_safetensors_locate(const loom_st_file *f, const char *name, uint64_t *file_offset,
                            int *ndim, int64_t shape[8], loom_err *err) {
    const st_entry *e = find_f32(f, name, err);
    if (!e) return -1;
    if (file_offset) *file_offset = f->data_start + e->begin;
    if (ndim) *ndim = e->ndim;
    if (shape)
        for (int d = 0; d < ST_MAX_NDIM; d++) shape[d] = d < e->ndim ? e->shape[d] : 0;
    return 0;
}

/* the entry's shape must be exactly (ndim, shape); the error names the file and the tensor */
static int check_shape(const loom_st_file *f, const char *name, const st_entry *e, int ndim,
                       const int64_t *shape, loom_err *err) {
    int same = ndim == e->ndim;
    for (int d = 0; same && d < ndim; d++) same = shape[d] == e->shape[d];
    if (same) return 0;
    char want[256], have[256];
    fmt_shape(have, sizeof have, e->ndim, e->shape);
    if (ndim >= 0 && ndim <= ST_MAX_NDIM) fmt_shape(want, sizeof want, ndim, shape);
    else snprintf(want, sizeof want, "(%d dimensions)", ndim);
    return loom_errf(err, "%s: tensor '%.200s' has shape %s, expected %s", f->path, name, have,
                     want);
}

int loom_safetensors_read_into(const loom_st_file *f, const char *name, float *dst, int ndim,
                               const int64_t *shape, loom_err *err) {
    const st_entry *e = find_f32(f, name, err);
    if (!e) return -1;
    if (check_shape(f, name, e, ndim, shape, err)) return -1;
    size_t bytes = (size_t)(e->end - e->begin);
    if (!f->data)
        return loom_errf(err, "%s: tensor '%.200s': only the header was parsed", f->path, name);
    if (bytes) memcpy(dst, f->data + e->begin, bytes);
    return 0;
}

const char *loom_safetensors_metadata(const loom_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_k[i], key) == 0) return f->meta_v[i];
    return NULL;
}

/* ---- reading other float dtypes (Hugging Face checkpoints) --------------------------- */
const char *loom_safetensors_dtype(const loom_st_file *f, const char *name, int *ndim,
                                   int64_t shape[8]) {
    const st_entry *e = find(f, name);
    if (!e) return NULL;
    if (ndim) *ndim = e->ndim;
    if (shape)
        for (int d = 0; d < ST_MAX_NDIM; d++) shape[d] = d < e->ndim ? e->shape[d] : 0;
    return DTYPES[e->dtype].name;
}

/* IEEE half -> float, exactly (every half is a float) */
static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int loom_safetensors_read_raw(const loom_st_file *f, const char *name, const char *dtype,
                              void *dst, int ndim, const int64_t *shape, loom_err *err) {
    const st_entry *e = find(f, name);
    if (!e) return loom_errf(err, "%s: no tensor named '%.200s'", f->path, name);
    if (strcmp(DTYPES[e->dtype].name, dtype) != 0)
        return loom_errf(err, "%s: tensor '%.200s' has dtype %s, expected %s", f->path, name,
                         DTYPES[e->dtype].name, dtype);
    if (check_shape(f, name, e, ndim, shape, err)) return -1;
    if (!f->data)
        return loom_errf(err, "%s: tensor '%.200s': only the header was parsed", f->path, name);
    memcpy(dst, (const char *)f->data + e->begin, (size_t)(e->end - e->begin));
    return 0;
}

int loom_safetensors_read_as_f32(const loom_st_file *f, const char *name, float *dst, int ndim,
                                 const int64_t *shape, loom_err *err) {
    const st_entry *e = find(f, name);
    if (!e) return loom_errf(err, "%s: no tensor named '%.200s'", f->path, name);
    if (e->dtype == DT_F32) return loom_safetensors_read_into(f, name, dst, ndim, shape, err);
    const char *dt = DTYPES[e->dtype].name;
    const int f16 = !strcmp(dt, "F16"), bf16 = !strcmp(dt, "BF16"), f64 = !strcmp(dt, "F64");
    if (!f16 && !bf16 && !f64)
        return loom_errf(err, "%s: tensor '%.200s' has dtype %s; loom reads F32, F16, BF16 and F64",
                         f->path, name, dt);
    if (check_shape(f, name, e, ndim, shape, err)) return -1;
    if (!f->data)
        return loom_errf(err, "%s: tensor '%.200s': only the header was parsed", f->path, name);
    const size_t size = DTYPES[e->dtype].size, n = (size_t)(e->end - e->begin) / size;
    const unsigned char *p = (const unsigned char *)f->data + e->begin;
    for (size_t i = 0; i < n; i++) {
        if (f64) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            dst[i] = (float)v;
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            if (bf16) {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&dst[i], &bits, 4);
            } else {
                dst[i] = half_to_float(h);
            }
        }
    }
    return 0;
}
