/* loom base: errors, checked allocation, logging, counter-based RNG, hashing, file I/O.
 *
 * Error convention: a fallible function returns 0 on success and -1 on failure, after
 * filling the caller's loom_err with a message that names the file/key/offset involved.
 * Broken invariants (programmer errors) abort with file:line through LOOM_CHECK.
 * Untrusted input is never checked with assert(). */
#ifndef LOOM_BASE_H
#define LOOM_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define LOOM_VERSION "0.1.0"

typedef struct loom_err {
    char msg[2048];
} loom_err;

/* Formats a message into err (err may be NULL) and returns -1, so callers can write
 * `return loom_errf(err, "%s: truncated header", path);`. */
int loom_errf(loom_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "prefix: " to an existing message; returns -1. */
int loom_err_prefix(loom_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Aborts with file:line on a broken invariant. An expression, safe after an unbraced if. */
#define LOOM_CHECK(cond) \
    ((cond) ? (void)0 : loom_panic(__FILE__, __LINE__, "check failed: %s", #cond))
void loom_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* A hook loom_panic calls (with the formatted "file:line: message") after printing and before
 * abort(); NULL removes it. comm sets one that ends the whole distributed job (MPI_Abort). */
void loom_set_fatal_hook(void (*hook)(const char *msg));

/* Checked allocation: aborts with file:line when memory runs out. */
#define loom_malloc(n) loom_malloc_at((n), __FILE__, __LINE__)
#define loom_calloc(n, s) loom_calloc_at((n), (s), __FILE__, __LINE__)
#define loom_realloc(p, n) loom_realloc_at((p), (n), __FILE__, __LINE__)
void *loom_malloc_at(size_t n, const char *file, int line);
void *loom_calloc_at(size_t n, size_t size, const char *file, int line);
void *loom_realloc_at(void *p, size_t n, const char *file, int line);

/* A growing text buffer: loom_sbuf_printf appends formatted text, doubling the allocation as
 * needed (aborts on allocation failure, as loom_realloc does). Start as {NULL, 0, 0} or with
 * an initial allocation; the owner frees p. */
typedef struct loom_sbuf {
    char *p;
    size_t len, cap;
} loom_sbuf;
void loom_sbuf_printf(loom_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* appends n bytes (any bytes), then keeps a terminating 0 after them (not counted in len),
 * as loom_sbuf_printf does */
void loom_sbuf_append(loom_sbuf *b, const void *p, size_t n);
char *loom_strdup(const char *s);
/* 64-byte aligned, zeroed; free with free(). For arenas. */
void *loom_alloc_aligned(size_t n);
/* How many allocations loom_malloc/_calloc/_realloc/_strdup/_alloc_aligned have made in this
 * process (all threads). The step loop must not allocate (DESIGN section 3):
 * tests/unit/test_step_alloc.c checks that this does not move across training steps. */
uint64_t loom_alloc_calls(void);

/* Parses all of s as a decimal integer in [lo, hi] into *out: no leading space, nothing after
 * the digits, no overflow. Returns 0, or -1 (then *out is untouched). For untrusted text
 * (metadata in files, environment variables); atoi is never used on such input. YAML's scalars
 * are typed by base's YAML reader instead (base/yaml.h, docs/config.md). */
int loom_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* Parses all of s as a finite number (strtod's forms; no leading space, nothing after it;
 * inf, nan and overflow refused). Returns 0, or -1 (*out untouched). */
int loom_parse_f64(const char *s, double *out);

/* Logging to stderr with a level prefix. */
void loom_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void loom_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- counter-based RNG ----------------------------------------------------------------
 * Pure functions of (seed, stream, counter): the same element of the same tensor gets the
 * same value whatever the layout or the order of evaluation. */
uint64_t loom_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter);
/* The same draw in two parts, for many counters of one (seed, stream):
 * loom_rng_at(loom_rng_key(seed, stream), counter) == loom_rng_u64(seed, stream, counter). */
uint64_t loom_rng_key(uint64_t seed, uint64_t stream);
static inline uint64_t loom_rng_splitmix(uint64_t z) { /* splitmix64's finalizer: one round */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static inline uint64_t loom_rng_at(uint64_t key, uint64_t counter) {
    return loom_rng_splitmix(key ^ (counter * 0x9e3779b97f4a7c15ULL + 0x2545f4914f6cdd1dULL));
}
/* uniform in [0, 1) with 24 random bits */
float loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);
/* standard normal (Box-Muller over two counter draws) */
float loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter);
/* A stream as a tiny state: the counter advances per draw. Save/restore = copy the struct. */
typedef struct loom_rng {
    uint64_t seed, stream, counter;
} loom_rng;
uint64_t loom_rng_next_u64(loom_rng *r);
float loom_rng_next_uniform(loom_rng *r);
/* MurmurHash3's 64-bit finalizer: a bijective mix for hash tables and seeds */
static inline uint64_t loom_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}
/* stable 64-bit hash of a string (FNV-1a then mixed); used to key tensors by name */
uint64_t loom_hash_str(const char *s);

/* ---- hashing -------------------------------------------------------------------------- */
/* hex must hold 65 bytes */
void loom_sha256_hex(const void *data, size_t len, char hex[65]);
int loom_sha256_file(const char *path, char hex[65], loom_err *err);

/* ---- files ---------------------------------------------------------------------------- */
/* Reads a whole file (at most max_bytes; larger is an error naming the file). *out is
 * NUL-terminated (one extra byte) and owned by the caller. */
int loom_read_file(const char *path, size_t max_bytes, char **out, size_t *len, loom_err *err);
/* The same from an open descriptor, which it closes in every case (path is for messages):
 * the file must be regular and at most max_bytes. */
int loom_read_fd(int fd, const char *path, size_t max_bytes, char **out, size_t *len,
                 loom_err *err);
/* Durable write: path.tmp.<pid>, write, fsync, rename onto path, fsync the directory. */
int loom_write_file_atomic(const char *path, const void *data, size_t len, loom_err *err);
/* Appends one line (adds '\n') with O_APPEND and fsyncs. */
int loom_append_line(const char *path, const char *line, loom_err *err);
/* mkdir -p */
int loom_mkdirs(const char *path, loom_err *err);
int loom_fsync_dir(const char *dir, loom_err *err);
int loom_path_exists(const char *path);
int loom_is_dir(const char *path);
/* snprintf into buf, aborting (invariant) if it does not fit. Returns buf. Only for paths
 * whose length the program bounds itself; a path built from user input uses loom_path_fmt. */
char *loom_pathf(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* snprintf into buf; a result that does not fit is an error naming the start of the path
 * and its length (buf then holds an empty string). Returns 0 or -1. */
int loom_path_fmt(char *buf, size_t size, loom_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The longest directory a user may name for loom to create files under (run.dir, a data
 * build's output): what is created below it must still fit PATH_MAX (4096) bytes. */
#define LOOM_DIR_PATH_MAX 3584
/* 0 when strlen(path) <= max; else an error "<what>: path too long (N bytes, at most MAX):
 * '<its first 200 bytes>...'". */
int loom_path_check(const char *what, const char *path, size_t max, loom_err *err);
/* 1-based line and column (in characters: UTF-8 continuation bytes do not count) of byte
 * `offset` of text[0..len). */
void loom_text_position(const char *text, size_t len, size_t offset, size_t *line, size_t *col);
/* seconds from a monotonic clock */
double loom_now(void);

/* ---- locks between processes -----------------------------------------------------------
 * An exclusive advisory lock (flock(2), never waiting) on path, created if needed. The kernel
 * releases it when the holder exits or dies, so a crashed holder never blocks the next one; on
 * NFS, Linux arbitrates flock through the server, so processes on different nodes see each
 * other. The holder writes "pid P on HOST since TIME: WHAT" into the file for the message a
 * second process gets. Returns 0 with *fd holding the lock (loom_unlock_file releases it);
 * 1 when another process holds it (err names the file and the holder); -1 on an error. On a
 * filesystem that has no locks it warns and returns 0 with *fd = -1 (nothing is held). */
int loom_lock_file(const char *path, const char *what, int *fd, loom_err *err);
void loom_unlock_file(int fd);

#endif
