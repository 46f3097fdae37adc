/* loom base: errors, checked allocation, logging, RNG, hashing, files. */
#define _GNU_SOURCE
#include "loom/base.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int loom_errf(loom_err *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int loom_err_prefix(loom_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[1024], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%.1000s: %.1040s", prefix, old);
    return -1;
}

static void (*fatal_hook)(const char *msg);

void loom_set_fatal_hook(void (*hook)(const char *msg)) { fatal_hook = hook; }

void loom_panic(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof msg) vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "loom: fatal: %s\n", msg);
    fflush(stderr);
    void (*hook)(const char *) = fatal_hook;
    fatal_hook = NULL; /* a panic inside the hook must not recurse */
    if (hook) hook(msg);
    abort();
}

static uint64_t alloc_calls;
static void count_alloc(void) { __atomic_fetch_add(&alloc_calls, 1, __ATOMIC_RELAXED); }
uint64_t loom_alloc_calls(void) { return __atomic_load_n(&alloc_calls, __ATOMIC_RELAXED); }

void *loom_malloc_at(size_t n, const char *file, int line) {
    count_alloc();
    void *p = malloc(n ? n : 1);
    if (!p) loom_panic(file, line, "out of memory allocating %zu bytes", n);
    return p;
}

void *loom_calloc_at(size_t n, size_t size, const char *file, int line) {
    count_alloc();
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) loom_panic(file, line, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *loom_realloc_at(void *p, size_t n, const char *file, int line) {
    count_alloc();
    void *q = realloc(p, n ? n : 1);
    if (!q) loom_panic(file, line, "out of memory reallocating %zu bytes", n);
    return q;
}

void loom_sbuf_printf(loom_sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int n = b->p ? vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap) : -2;
        va_end(ap);
        LOOM_CHECK(n >= 0 || n == -2);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = 2 * b->cap + (n > 0 ? (size_t)n : 0) + 256;
        b->p = loom_realloc(b->p, b->cap);
    }
}

void loom_sbuf_append(loom_sbuf *b, const void *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1) c *= 2;
        b->p = loom_realloc(b->p, c);
        b->cap = c;
    }
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
}

int loom_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !s[0] || isspace((unsigned char)s[0])) return -1;
    errno = 0;
    char *end;
    const long long v = strtoll(s, &end, 10);
    if (errno == ERANGE || *end || v < lo || v > hi) return -1;
    *out = (int64_t)v;
    return 0;
}

int loom_parse_f64(const char *s, double *out) {
    if (!s || !s[0] || isspace((unsigned char)s[0])) return -1;
    errno = 0;
    char *end;
    const double v = strtod(s, &end);
    /* underflow (ERANGE with a tiny result) is fine; overflow, nan and inf are not */
    if (*end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

char *loom_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = loom_malloc(n);
    memcpy(p, s, n);
    return p;
}

void *loom_alloc_aligned(size_t n) {
    count_alloc();
    size_t size = (n + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, size ? size : 64) != 0)
        loom_panic(__FILE__, __LINE__, "out of memory allocating %zu bytes", n);
    memset(p, 0, size ? size : 64);
    return p;
}

/* One line is formatted into one buffer and written with one call: stderr is unbuffered, and
 * under mpirun the ranks' streams are merged, so a line written in pieces can be split by
 * another rank's line. Longer lines fall back to pieces. */
static void vlog(const char *level, const char *fmt, va_list ap) {
    char line[2048];
    int n = snprintf(line, sizeof line, "loom%s: ", level);
    va_list aq;
    va_copy(aq, ap);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, aq);
    va_end(aq);
    if (m >= 0 && (size_t)n + (size_t)m + 1 < sizeof line) {
        line[n + m] = '\n';
        fwrite(line, 1, (size_t)(n + m + 1), stderr);
        return;
    }
    fprintf(stderr, "loom%s: ", level);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void loom_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog("", fmt, ap);
    va_end(ap);
}

void loom_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(": warning", fmt, ap);
    va_end(ap);
}

/* ---- RNG: a keyed mix of (seed, stream, counter), three rounds of splitmix64's
 * finalizer interleaved with distinct odd constants. Statistically strong enough for
 * initialization, sampling and permutations; not cryptographic. */
uint64_t loom_rng_key(uint64_t seed, uint64_t stream) {
    const uint64_t z = loom_rng_splitmix(seed + 0x9e3779b97f4a7c15ULL);
    return loom_rng_splitmix(z ^ (stream * 0xd1342543de82ef95ULL + 0x632be59bd9b4e019ULL));
}

uint64_t loom_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    return loom_rng_at(loom_rng_key(seed, stream), counter); /* (base.h: the last round) */
}

float loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (float)(loom_rng_u64(seed, stream, counter) >> 40) * (1.0f / 16777216.0f);
}

float loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t r = loom_rng_u64(seed, stream, counter);
    /* two 32-bit uniforms from one draw; u1 in (0,1] so log is finite */
    double u1 = ((double)(r >> 32) + 1.0) * (1.0 / 4294967296.0);
    double u2 = (double)(r & 0xffffffffULL) * (1.0 / 4294967296.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t loom_rng_next_u64(loom_rng *r) { return loom_rng_u64(r->seed, r->stream, r->counter++); }

float loom_rng_next_uniform(loom_rng *r) {
    return loom_rng_uniform(r->seed, r->stream, r->counter++);
}

uint64_t loom_hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return loom_rng_splitmix(h);
}

/* ---- hashing ---- */
static void hex_of(const unsigned char *d, size_t n, char *hex) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[2 * n] = 0;
}

void loom_sha256_hex(const void *data, size_t len, char hex[65]) {
    unsigned char md[32];
    unsigned int mdlen = 0;
    LOOM_CHECK(EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) == 1 && mdlen == 32);
    hex_of(md, 32, hex);
}

int loom_sha256_file(const char *path, char hex[65], loom_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_errf(err, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    LOOM_CHECK(ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1);
    char *buf = loom_malloc(1 << 20);
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) EVP_DigestUpdate(ctx, buf, n);
    int bad = ferror(f);
    fclose(f);
    free(buf);
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    if (bad) return loom_errf(err, "%s: read error", path);
    hex_of(md, 32, hex);
    return 0;
}

/* ---- files ---- */
int loom_read_fd(int fd, const char *path, size_t max_bytes, char **out, size_t *len,
                 loom_err *err) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return loom_errf(err, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return loom_errf(err, "%s: file is %lld bytes, more than the limit of %zu", path,
                         (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = loom_malloc(n + 1);
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            const int e = r < 0 ? errno : 0;
            free(buf);
            close(fd);
            return loom_errf(err, "%s: read failed at byte %zu%s%s", path, got,
                             e ? ": " : " (file shrank)", e ? strerror(e) : "");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int loom_read_file(const char *path, size_t max_bytes, char **out, size_t *len, loom_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loom_errf(err, "%s: cannot open: %s", path, strerror(errno));
    return loom_read_fd(fd, path, max_bytes, out, len, err);
}

int loom_fsync_dir(const char *dir, loom_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return loom_errf(err, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return loom_errf(err, "%s: fsync failed: %s", dir, strerror(errno));
    return 0;
}

static void dir_of(const char *path, char *dir, size_t size) {
    snprintf(dir, size, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, size, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
}

int loom_write_file_atomic(const char *path, const void *data, size_t len, loom_err *err) {
    char tmp[4096], dir[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return loom_errf(err, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return loom_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return loom_errf(err, "%s: write failed: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return loom_errf(err, "%s: fsync failed: %s", tmp, strerror(e));
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return loom_errf(err, "%s: rename failed: %s", path, strerror(e));
    }
    dir_of(path, dir, sizeof dir);
    return loom_fsync_dir(dir, err);
}

int loom_append_line(const char *path, const char *line, loom_err *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return loom_errf(err, "%s: cannot open for append: %s", path, strerror(errno));
    size_t n = strlen(line);
    char *buf = loom_malloc(n + 1);
    memcpy(buf, line, n);
    buf[n] = '\n';
    ssize_t w = write(fd, buf, n + 1);
    free(buf);
    int bad = (w != (ssize_t)(n + 1)) || fsync(fd) != 0;
    close(fd);
    if (bad) return loom_errf(err, "%s: append failed", path);
    return 0;
}

int loom_mkdirs(const char *path, loom_err *err) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return loom_errf(err, "%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return loom_errf(err, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return loom_errf(err, "%s: cannot create directory: %s", buf, strerror(errno));
    if (!loom_is_dir(buf)) return loom_errf(err, "%s: exists and is not a directory", buf);
    return 0;
}

int loom_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int loom_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *loom_pathf(char *buf, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    LOOM_CHECK(n >= 0 && (size_t)n < size);
    return buf;
}

int loom_path_fmt(char *buf, size_t size, loom_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < size) return 0;
    /* name the path: format it again into a buffer of the right size */
    char *full = NULL;
    va_start(ap, fmt);
    int m = vasprintf(&full, fmt, ap);
    va_end(ap);
    if (size) buf[0] = 0;
    if (m < 0) return loom_errf(err, "path too long (limit %zu bytes)", size ? size - 1 : 0);
    loom_errf(err, "path too long: %d bytes, the limit is %zu: '%.200s...'", m,
              size ? size - 1 : 0, full);
    free(full);
    return -1;
}

int loom_path_check(const char *what, const char *path, size_t max, loom_err *err) {
    const size_t n = strlen(path);
    if (n <= max) return 0;
    return loom_errf(err, "%s: path too long (%zu bytes, at most %zu): '%.200s...'", what, n, max,
                     path);
}

void loom_text_position(const char *text, size_t len, size_t offset, size_t *line, size_t *col) {
    if (offset > len) offset = len;
    size_t l = 1, c = 1;
    for (size_t i = 0; i < offset; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch == '\n' || (ch == '\r' && !(i + 1 < len && text[i + 1] == '\n'))) {
            l++;
            c = 1;
        } else if ((ch & 0xc0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

double loom_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- locks between processes ---------------------------------------------------------- */

int loom_lock_file(const char *path, const char *what, int *fd, loom_err *err) {
    *fd = -1;
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0) return loom_errf(err, "%s: cannot open the lock file: %s", path, strerror(errno));
    int rc;
    while ((rc = flock(f, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {}
    if (rc != 0) {
        const int e = errno;
        if (e == EWOULDBLOCK) {
            char holder[512];
            ssize_t n = pread(f, holder, sizeof holder - 1, 0);
            close(f);
            holder[n > 0 ? n : 0] = 0;
            size_t len = strlen(holder);
            while (len > 0 && (holder[len - 1] == '\n' || holder[len - 1] == ' ')) holder[--len] = 0;
            for (char *c = holder; *c; c++)
                if ((unsigned char)*c < 0x20) *c = ' ';
            loom_errf(err, "%s is locked by another process (%s)", path,
                      len ? holder : "it has not said who it is yet");
            return 1;
        }
        close(f);
        if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS) {
            loom_warn("%s: this filesystem has no file locks (%s): %s cannot be protected "
                      "against a second process", path, strerror(e), what);
            return 0;
        }
        return loom_errf(err, "%s: cannot lock: %s", path, strerror(e));
    }
    /* who holds it, for the message of the next process that tries */
    char host[256] = "?", stamp[64] = "?", line[800];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof line, "pid %d on %s since %s: %s\n", (int)getpid(), host, stamp,
                     what);
    if (n < 0 || (size_t)n >= sizeof line) n = (int)strlen(line);
    if (ftruncate(f, 0) != 0 || pwrite(f, line, (size_t)n, 0) != (ssize_t)n)
        loom_warn("%s: cannot record the lock holder: %s", path, strerror(errno));
    *fd = f;
    return 0;
}

void loom_unlock_file(int fd) {
    if (fd < 0) return;
    /* forget the holder (a process that locks without saying who it is must not be named
     * after this one), then release: closing the only descriptor drops the flock */
    if (ftruncate(fd, 0) != 0) {}
    close(fd);
}
