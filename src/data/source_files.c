/* Input files of a source: directory walks, globs, hostile entries, and safe reads.
 *
 * A directory source is walked recursively (names starting with '.' skipped) and confined to
 * its root: a symlink is followed only when its target resolves inside the root. FIFOs,
 * sockets, devices, symlinks leaving the root, symlinks to directories, broken symlinks and
 * files that cannot be opened are skipped, counted and reported by name; they never block or
 * crash the build (opens use O_NOFOLLOW | O_NONBLOCK and fstat re-checks the file type). */
#define _GNU_SOURCE
#include "data/build_source.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- skips ---- */
void loom_skips_add(loom_skips *s, const char *what, const char *why) {
    s->count++;
    if (s->n_kept >= LOOM_SKIPS_KEPT) return;
    s->v = loom_realloc(s->v, (size_t)(s->n_kept + 1) * sizeof *s->v);
    s->v[s->n_kept].what = loom_strdup(what);
    s->v[s->n_kept].why = loom_strdup(why);
    s->n_kept++;
}

void loom_skips_free(loom_skips *s) {
    for (int i = 0; i < s->n_kept; i++) {
        free(s->v[i].what);
        free(s->v[i].why);
    }
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* ---- documents ---- */
uint64_t loom_docs_put(loom_docs *d, const void *p, size_t len) {
    if (d->arena_len + len > d->arena_cap) {
        uint64_t cap = d->arena_cap ? d->arena_cap : 1 << 16;
        while (cap < d->arena_len + len) cap *= 2;
        d->arena = loom_realloc(d->arena, (size_t)cap);
        d->arena_cap = cap;
    }
    uint64_t off = d->arena_len;
    if (len) memcpy(d->arena + off, p, len);
    d->arena_len += len;
    return off;
}

void loom_docs_add(loom_docs *d, const void *p, size_t len, int32_t label, int32_t input) {
    uint64_t off = loom_docs_put(d, p, len);
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 1024;
        d->v = loom_realloc(d->v, d->cap * sizeof *d->v);
    }
    d->v[d->n++] = (loom_doc){off, len, label, input, 0, 0, 0};
}

void loom_docs_free(loom_docs *d) {
    free(d->segs);
    free(d->arena);
    free(d->v);
    memset(d, 0, sizeof *d);
}

/* ---- collection ---- */
typedef struct walk {
    const loom_recipe *r;
    int si;
    const char *root_real;   /* confinement root (resolved), NULL = none */
    const char *root;        /* the root as written, to make relative paths */
    loom_inputs *l;
    loom_skips *skipped;
    dev_t labels_dev;
    ino_t labels_ino;
    int has_labels;
} walk;

static int excluded(const loom_recipe_source *s, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (int i = 0; i < s->n_exclude; i++)
        if (fnmatch(s->exclude[i], base, 0) == 0) return 1;
    return 0;
}

static const char *type_name(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISDIR(m)) return "a directory";
    return "not a regular file";
}

static void skip(walk *w, const char *path, const char *fmt, const char *a) {
    char why[PATH_MAX + 128];
    snprintf(why, sizeof why, fmt, a ? a : "");
    loom_warn("source '%s': skipped %s: %s", w->r->sources[w->si].name, path, why);
    loom_skips_add(w->skipped, path, why);
}

static int under(const char *root, const char *p) {
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return 1;
    return strncmp(root, p, n) == 0 && (p[n] == '/' || p[n] == 0);
}

static void push(walk *w, const char *path, const char *real, const struct stat *st) {
    if (w->has_labels && st->st_dev == w->labels_dev && st->st_ino == w->labels_ino) return;
    loom_inputs *l = w->l;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = loom_realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    loom_input *f = &l->v[l->n++];
    memset(f, 0, sizeof *f);
    f->path = loom_strdup(path);
    f->real = loom_strdup(real);
    size_t rn = w->root ? strlen(w->root) : 0;
    while (rn > 1 && w->root[rn - 1] == '/') rn--;
    if (w->root && strncmp(path, w->root, rn) == 0 && path[rn] == '/') f->rel = loom_strdup(path + rn + 1);
    else f->rel = loom_strdup(path);
    f->source = w->si;
    f->bytes = (uint64_t)st->st_size;
    f->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    f->dev = st->st_dev;
    f->ino = st->st_ino;
}

/* A regular file candidate (real = what to open): must open without blocking. */
static void add_file(walk *w, const char *path, const char *real) {
    int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        skip(w, path, "cannot open: %s", strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        skip(w, path, "cannot stat: %s", strerror(errno));
        return;
    }
    close(fd);
    if (!S_ISREG(st.st_mode)) {
        skip(w, path, "%s", type_name(st.st_mode));
        return;
    }
    push(w, path, real, &st);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int walk_dir(walk *w, const char *dir, int depth, loom_err *err) {
    const loom_recipe_source *s = &w->r->sources[w->si];
    if (depth > 32)
        return loom_errf(err, "%s:%d: source '%s': directories nested too deep at '%s'",
                         w->r->file, s->line, s->name, dir);
    DIR *d = opendir(dir);
    if (!d) {
        if (depth == 0)
            return loom_errf(err, "%s:%d: source '%s': cannot open directory '%s': %s", w->r->file,
                             s->line, s->name, dir, strerror(errno));
        skip(w, dir, "cannot open directory: %s", strerror(errno));
        return 0;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = loom_realloc(names, cap * sizeof *names);
        }
        names[n++] = loom_strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        char *child = loom_malloc(len);
        snprintf(child, len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", names[i]);
        struct stat st;
        if (rc != 0) {
        } else if (lstat(child, &st) != 0) {
            skip(w, child, "cannot stat: %s", strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            rc = walk_dir(w, child, depth + 1, err);
        } else if (excluded(s, child)) {
        } else if (S_ISLNK(st.st_mode)) {
            char *real = realpath(child, NULL);
            struct stat ts;
            if (!real) skip(w, child, "broken symlink (%s)", strerror(errno));
            else if (w->root_real && !under(w->root_real, real))
                skip(w, child, "symlink leaves the source root (-> %s)", real);
            else if (stat(real, &ts) != 0) skip(w, child, "cannot stat the target: %s", strerror(errno));
            else if (S_ISDIR(ts.st_mode)) skip(w, child, "symlink to a directory (not followed)%s", "");
            else if (!S_ISREG(ts.st_mode)) skip(w, child, "symlink to %s", type_name(ts.st_mode));
            else add_file(w, child, real);
            free(real);
        } else if (S_ISREG(st.st_mode)) {
            add_file(w, child, child);
        } else {
            skip(w, child, "%s", type_name(st.st_mode));
        }
        free(child);
        free(names[i]);
    }
    free(names);
    return rc;
}

/* a path named directly (a file, a glob match): symlinks are followed, nothing is confined */
static int add_named(walk *w, const char *path, loom_err *err) {
    const loom_recipe_source *s = &w->r->sources[w->si];
    struct stat st;
    if (stat(path, &st) != 0)
        return loom_errf(err, "%s:%d: source '%s': cannot read '%s': %s", w->r->file, s->line,
                         s->name, path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real)
            return loom_errf(err, "%s:%d: source '%s': cannot resolve '%s': %s", w->r->file,
                             s->line, s->name, path, strerror(errno));
        const char *saved_real = w->root_real, *saved_root = w->root;
        w->root_real = real;
        w->root = path;
        int rc = walk_dir(w, path, 0, err);
        w->root_real = saved_real;
        w->root = saved_root;
        free(real);
        return rc;
    }
    if (excluded(s, path)) return 0;
    if (!S_ISREG(st.st_mode)) {
        skip(w, path, "%s", type_name(st.st_mode));
        return 0;
    }
    char *real = realpath(path, NULL);
    add_file(w, path, real ? real : path);
    free(real);
    return 0;
}

typedef struct devino {
    dev_t dev;
    ino_t ino;
    int source;
} devino;

static int cmp_devino(const void *a, const void *b) {
    const devino *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return 0;
}

static int cmp_devino_index(const void *a, const void *b) {
    int c = cmp_devino(a, b);
    if (c) return c;
    return ((const devino *)a)->source - ((const devino *)b)->source;
}

static int cmp_input(const void *a, const void *b) {
    return strcmp(((const loom_input *)a)->path, ((const loom_input *)b)->path);
}

static void input_free(loom_input *f) {
    free(f->path);
    free(f->rel);
    free(f->real);
}

void loom_inputs_free(loom_inputs *l) {
    for (int i = 0; i < l->n; i++) input_free(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

int loom_inputs_collect(const loom_recipe *r, int si, loom_inputs *all, loom_skips *skipped,
                        loom_err *err) {
    const loom_recipe_source *s = &r->sources[si];
    loom_inputs l = {0};
    walk w = {r, si, NULL, NULL, &l, skipped, 0, 0, 0};
    struct stat lst;
    if (s->labels && stat(s->labels, &lst) == 0) {
        w.has_labels = 1;
        w.labels_dev = lst.st_dev;
        w.labels_ino = lst.st_ino;
    }
    int rc = 0;
    if (strpbrk(s->path, "*?[")) {
        if (s->kind == LOOM_SRC_BINARY)
            return loom_errf(err, "%s:%d: source '%s': a binary source's path must be a directory, "
                             "not a glob ('%s')", r->file, s->line, s->name, s->path);
        glob_t g;
        int gr = glob(s->path, 0, NULL, &g);
        if (gr == GLOB_NOMATCH)
            rc = loom_errf(err, "%s:%d: source '%s': path '%s' matches no files", r->file, s->line,
                           s->name, s->path);
        else if (gr != 0)
            rc = loom_errf(err, "%s:%d: source '%s': cannot expand '%s'", r->file, s->line,
                           s->name, s->path);
        for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++) rc = add_named(&w, g.gl_pathv[i], err);
        if (gr == 0) globfree(&g);
    } else if (!loom_path_exists(s->path)) {
        rc = loom_errf(err, "%s:%d: source '%s': path '%s' does not exist", r->file, s->line,
                       s->name, s->path);
    } else if (s->kind == LOOM_SRC_BINARY && !loom_is_dir(s->path)) {
        rc = loom_errf(err, "%s:%d: source '%s': a binary source's path must be a directory ('%s')",
                       r->file, s->line, s->name, s->path);
    } else {
        rc = add_named(&w, s->path, err);
    }
    if (rc == 0 && l.n == 0)
        rc = loom_errf(err, "%s:%d: source '%s': no input files under '%s' (after exclude)",
                       r->file, s->line, s->name, s->path);
    if (l.n) qsort(l.v, (size_t)l.n, sizeof *l.v, cmp_input);
    /* (device, inode) of everything taken so far, sorted, to drop a file reached twice */
    size_t n_ids = (size_t)all->n;
    devino *ids = loom_malloc(((size_t)all->n + 1) * sizeof *ids);
    for (int j = 0; j < all->n; j++) ids[j] = (devino){all->v[j].dev, all->v[j].ino, all->v[j].source};
    if (n_ids) qsort(ids, n_ids, sizeof *ids, cmp_devino);
    /* within this source, the first path (sorted order) of each (device, inode) is kept */
    devino *mine = loom_malloc(((size_t)l.n + 1) * sizeof *mine);
    uint8_t *again = loom_calloc((size_t)l.n + 1, 1);
    for (int i = 0; i < l.n; i++) mine[i] = (devino){l.v[i].dev, l.v[i].ino, i};
    if (l.n) qsort(mine, (size_t)l.n, sizeof *mine, cmp_devino_index);
    for (int i = 1; i < l.n; i++)
        if (cmp_devino(&mine[i - 1], &mine[i]) == 0) again[mine[i].source] = 1;
    free(mine);
    for (int i = 0; i < l.n; i++) {
        devino key = {l.v[i].dev, l.v[i].ino, si};
        const devino *hit = n_ids ? bsearch(&key, ids, n_ids, sizeof *ids, cmp_devino) : NULL;
        int dup = hit ? hit->source : again[i] ? si : -1;
        if (dup >= 0 || rc != 0) {
            if (dup >= 0 && dup != si)
                loom_warn("source '%s': %s was already read by another source; skipped", s->name,
                          l.v[i].path);
            input_free(&l.v[i]);
            continue;
        }
        if (all->n == all->cap) {
            all->cap = all->cap ? 2 * all->cap : 64;
            all->v = loom_realloc(all->v, (size_t)all->cap * sizeof *all->v);
        }
        all->v[all->n++] = l.v[i];
    }
    free(ids);
    free(again);
    free(l.v);
    return rc;
}

/* ---- reading ---- */
int loom_input_open(const loom_input *f, loom_err *err) {
    int fd = open(f->real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return loom_errf(err, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != f->dev || st.st_ino != f->ino) {
        close(fd);
        return loom_errf(err, "%s: changed while the build ran (no longer the regular file listed)",
                         f->path);
    }
    return fd;
}

int loom_input_read(const loom_input *f, size_t max, uint8_t **out, size_t *len, loom_err *err) {
    int fd = loom_input_open(f, err);
    if (fd < 0) return -1;
    return loom_read_fd(fd, f->path, max, (char **)out, len, err);
}

int loom_input_sha256(const loom_input *f, char hex[65], loom_err *err) {
    int fd = loom_input_open(f, err);
    if (fd < 0) return -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    LOOM_CHECK(ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1);
    size_t cap = 1 << 20;
    uint8_t *buf = loom_malloc(cap);
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = loom_errf(err, "%s: read failed: %s", f->path, strerror(errno));
            break;
        }
        if (r == 0) break;
        EVP_DigestUpdate(ctx, buf, (size_t)r);
    }
    close(fd);
    free(buf);
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    if (rc) return -1;
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = 0;
    return 0;
}
