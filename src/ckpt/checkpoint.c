/* Checkpoint directories: root/step_NNNNNNN/{files..., manifest.json, COMPLETE}.
 *
 * Commit protocol (save): each file and then manifest.json is written atomically (temp,
 * fsync, rename, directory fsync); COMPLETE, holding the manifest's SHA-256, is written last
 * the same way; then the step directory and the root are fsynced and root/latest (a relative
 * symlink) is swung atomically (temp symlink + rename) to the newest complete step.
 * A step directory without COMPLETE is never loaded. See docs/checkpoints.md. */
#define _GNU_SOURCE
#include "loom/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_MAX_MANIFEST ((size_t)16 << 20)
#define CKPT_MAX_FILE ((uint64_t)64 << 30) /* 64 GiB per file */
#define CKPT_MAX_FILES 100000
#define CKPT_PATH 4096

static const char *MANIFEST = "manifest.json";
static const char *COMPLETE = "COMPLETE";

/* A name that can live inside a step directory: non-empty, no '/', not . or .., no control
 * characters, not one of the reserved names. Returns NULL if fine, else the reason. */
static const char *bad_file_name(const char *name) {
    if (!name || !*name) return "is empty";
    if (strlen(name) > 255) return "is longer than 255 bytes";
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) return "is '.' or '..'";
    if (strchr(name, '/')) return "contains '/'";
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p == 0x7f) return "contains a control character";
    if (strcmp(name, MANIFEST) == 0 || strcmp(name, COMPLETE) == 0) return "is reserved";
    return NULL;
}

/* "step_" followed by at least 7 digits and nothing else; *step gets the number. */
static int parse_step_name(const char *name, int64_t *step) {
    if (strncmp(name, "step_", 5) != 0) return 0;
    const char *p = name + 5;
    size_t nd = strlen(p);
    if (nd < 7) return 0;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        int d = *p - '0';
        if (v > (INT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *step = v;
    return 1;
}

static int is_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static const char *base_name(const char *path) {
    /* the last non-empty component (ignores trailing slashes) */
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t i = n;
    while (i > 0 && path[i - 1] != '/') i--;
    static __thread char buf[CKPT_PATH];
    snprintf(buf, sizeof buf, "%.*s", (int)(n - i), path + i);
    return buf;
}

static int copy_out(char *out, size_t size, const char *s, loom_err *err) {
    if (!out) return 0;
    if (strlen(s) >= size) return loom_errf(err, "%s: path does not fit the %zu-byte buffer", s, size);
    memcpy(out, s, strlen(s) + 1);
    return 0;
}

static int unlink_if_present(const char *path, loom_err *err) {
    if (unlink(path) != 0 && errno != ENOENT)
        return loom_errf(err, "%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

/* Clears what a previous, interrupted save of this step may have left: the names this save
 * writes, manifest.json, and their temp files (name.tmp.<pid>). Nothing else is touched. */
static int clear_incomplete(const char *dir, const loom_ckpt_file *files, int n, loom_err *err) {
    char path[CKPT_PATH];
    if (unlink_if_present(loom_pathf(path, sizeof path, "%s/%s", dir, MANIFEST), err) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (unlink_if_present(loom_pathf(path, sizeof path, "%s/%s", dir, files[i].name), err))
            return -1;
    DIR *d = opendir(dir);
    if (!d) return loom_errf(err, "%s: cannot open directory: %s", dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        const char *tmp = strstr(de->d_name, ".tmp.");
        if (!tmp) continue;
        size_t stem = (size_t)(tmp - de->d_name);
        int ours = (strlen(MANIFEST) == stem && strncmp(de->d_name, MANIFEST, stem) == 0) ||
                   (strlen(COMPLETE) == stem && strncmp(de->d_name, COMPLETE, stem) == 0);
        for (int i = 0; i < n && !ours; i++)
            ours = strlen(files[i].name) == stem && strncmp(de->d_name, files[i].name, stem) == 0;
        if (ours) rc = unlink_if_present(loom_pathf(path, sizeof path, "%s/%s", dir, de->d_name), err);
    }
    closedir(d);
    return rc;
}

/* 1 when files a and b both exist and hold the same bytes (small files: COMPLETE markers) */
static int same_small_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    loom_err e = {{0}};
    int same = loom_read_file(a, 4096, &x, &nx, &e) == 0 && loom_read_file(b, 4096, &y, &ny, &e) == 0 &&
               nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

/* Removes dir when it holds only regular files (a step directory's shape); 0 on success. */
static int remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    char path[CKPT_PATH];
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path ||
            lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || unlink(path) != 0)
            rc = -1;
    }
    closedir(d);
    return rc == 0 ? rmdir(dir) : -1;
}

/* root/latest is a real directory, not a link: a run copied with links followed (cp -L,
 * rsync -L, scp -r). A copy of a complete step directory of root (same COMPLETE marker, so the
 * same manifest and files) is removed; anything else is moved aside, never deleted. Either way
 * latest can then become a link again. */
static int clear_latest_dir(const char *root, const char *link, loom_err *err) {
    char marker[CKPT_PATH], other[CKPT_PATH], aside[CKPT_PATH];
    int copy = 0;
    loom_pathf(marker, sizeof marker, "%s/%s", link, COMPLETE);
    DIR *d = opendir(root);
    if (!d) return loom_errf(err, "%s: cannot open directory: %s", root, strerror(errno));
    struct dirent *de;
    while (!copy && (de = readdir(d)) != NULL) {
        int64_t s;
        if (parse_step_name(de->d_name, &s) &&
            snprintf(other, sizeof other, "%s/%s/%s", root, de->d_name, COMPLETE) < (int)sizeof other)
            copy = is_regular(marker) && same_small_file(marker, other);
    }
    closedir(d);
    if (copy && remove_flat_dir(link) == 0) {
        loom_warn("%s was a directory (a copy of a complete step directory, e.g. from `cp -L`); "
                  "removed it so that it can be a link again", link);
        return 0;
    }
    loom_pathf(aside, sizeof aside, "%s/latest.moved.%d", root, (int)getpid());
    if (rename(link, aside) != 0)
        return loom_errf(err, "%s is a directory, not a link, and cannot be moved aside: %s", link,
                         strerror(errno));
    loom_warn("%s was a directory, not a link to a step; moved it to %s", link, aside);
    return 0;
}

/* Points root/latest at target (a name inside root): temp symlink, rename, fsync root. */
static int swing_latest(const char *root, const char *target, loom_err *err) {
    char tmp[CKPT_PATH], link[CKPT_PATH];
    loom_pathf(tmp, sizeof tmp, "%s/.latest.tmp.%d", root, (int)getpid());
    loom_pathf(link, sizeof link, "%s/latest", root);
    struct stat lst;
    if (lstat(link, &lst) == 0 && S_ISDIR(lst.st_mode) && clear_latest_dir(root, link, err) != 0)
        return -1;
    unlink(tmp);
    if (symlink(target, tmp) != 0)
        return loom_errf(err, "%s: cannot create symlink: %s", tmp, strerror(errno));
    if (rename(tmp, link) != 0) {
        int e = errno;
        unlink(tmp);
        return loom_errf(err, "%s: cannot replace with a symlink to %s: %s", link, target,
                         strerror(e));
    }
    return loom_fsync_dir(root, err);
}

static int step_dir(const char *root, int64_t step, char *dir, size_t size, loom_err *err) {
    if (!root || !*root) return loom_errf(err, "checkpoint: empty root path");
    if (step < 0) return loom_errf(err, "%s: checkpoint step %" PRId64 " is negative", root, step);
    if (snprintf(dir, size, "%s/step_%07" PRId64, root, step) >= (int)size - 300)
        return loom_errf(err, "%s: path too long", root);
    return 0;
}

static int check_names(const char *root, const char *const *names, int n, loom_err *err) {
    if (n < 0 || n > CKPT_MAX_FILES || (n > 0 && !names))
        return loom_errf(err, "%s: bad checkpoint file list (n=%d)", root, n);
    for (int i = 0; i < n; i++) {
        const char *why = bad_file_name(names[i]);
        if (why)
            return loom_errf(err, "%s: checkpoint file name '%.200s' %s", root,
                             names[i] ? names[i] : "(null)", why);
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return loom_errf(err, "%s: checkpoint file '%s' listed twice", root, names[i]);
    }
    return 0;
}

int loom_ckpt_prepare(const char *root, int64_t step, const char *const *names, int n,
                      char *out_dir, size_t out_size, loom_err *err) {
    char dir[CKPT_PATH], path[CKPT_PATH];
    if (step_dir(root, step, dir, sizeof dir, err) || check_names(root, names, n, err)) return -1;
    if (loom_mkdirs(root, err) != 0) return -1;
    if (loom_path_exists(dir)) {
        if (!loom_is_dir(dir)) return loom_errf(err, "%s: exists and is not a directory", dir);
        if (loom_path_exists(loom_pathf(path, sizeof path, "%s/%s", dir, COMPLETE)))
            return loom_errf(err,
                             "%s: a complete checkpoint of step %" PRId64
                             " already exists; remove %s to overwrite it",
                             dir, step, path);
        loom_ckpt_file *files = loom_calloc((size_t)n + 1, sizeof *files);
        for (int i = 0; i < n; i++) files[i].name = names[i];
        int rc = clear_incomplete(dir, files, n, err);
        free(files);
        if (rc != 0) return -1;
    }
    if (loom_mkdirs(dir, err) != 0) return -1;
    return copy_out(out_dir, out_size, dir, err);
}

int loom_ckpt_write_file(const char *dir, const char *name, const void *data, size_t len,
                         loom_err *err) {
    char path[CKPT_PATH];
    const char *why = bad_file_name(name);
    if (why) return loom_errf(err, "%s: checkpoint file name '%.200s' %s", dir, name ? name : "(null)", why);
    if (len > 0 && !data) return loom_errf(err, "%s: checkpoint file '%s' has no data", dir, name);
    return loom_write_file_atomic(loom_pathf(path, sizeof path, "%s/%s", dir, name),
                                  data ? data : "", len, err);
}

int loom_ckpt_commit(const char *root, int64_t step, const char *const *names, int n,
                     char *out_dir, size_t out_size, loom_err *err) {
    char dir[CKPT_PATH], path[CKPT_PATH];
    if (step_dir(root, step, dir, sizeof dir, err) || check_names(root, names, n, err)) return -1;
    int rc = -1;
    char *manifest_text = NULL;
    json_t *manifest = json_object(), *list = json_object();
    LOOM_CHECK(manifest && list);
    json_object_set_new(manifest, "step", json_integer(step));
    json_object_set_new(manifest, "files", list);
    json_object_set_new(manifest, "loom_version", json_string(LOOM_VERSION));
    for (int i = 0; i < n; i++) {
        char hex[65];
        struct stat st;
        loom_pathf(path, sizeof path, "%s/%s", dir, names[i]);
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            loom_errf(err, "%s: checkpoint file was not written", path);
            goto done;
        }
        if (loom_sha256_file(path, hex, err) != 0) goto done;
        json_t *ent = json_object();
        LOOM_CHECK(ent != NULL);
        json_object_set_new(ent, "bytes", json_integer((json_int_t)st.st_size));
        json_object_set_new(ent, "sha256", json_string(hex));
        if (json_object_set_new(list, names[i], ent) != 0) {
            loom_errf(err, "%s: checkpoint file name '%.200s' is not valid UTF-8", dir, names[i]);
            goto done;
        }
    }
    char *body = json_dumps(manifest, JSON_INDENT(2));
    LOOM_CHECK(body != NULL);
    size_t blen = strlen(body);
    manifest_text = loom_malloc(blen + 2);
    memcpy(manifest_text, body, blen);
    manifest_text[blen] = '\n';
    manifest_text[blen + 1] = 0;
    free(body);
    if (loom_write_file_atomic(loom_pathf(path, sizeof path, "%s/%s", dir, MANIFEST),
                               manifest_text, blen + 1, err) != 0)
        goto done;

    /* the commit point */
    char marker[66];
    loom_sha256_hex(manifest_text, blen + 1, marker);
    marker[64] = '\n';
    marker[65] = 0;
    if (loom_write_file_atomic(loom_pathf(path, sizeof path, "%s/%s", dir, COMPLETE), marker,
                               65, err) != 0)
        goto done;
    if (loom_fsync_dir(dir, err) != 0 || loom_fsync_dir(root, err) != 0) goto done;

    /* latest follows the newest complete step (the one just saved unless a newer exists) */
    char newest[CKPT_PATH];
    int64_t newest_step;
    if (loom_ckpt_find_latest(root, newest, sizeof newest, &newest_step, err) != 0) goto done;
    LOOM_CHECK(newest_step >= step);
    if (swing_latest(root, base_name(newest), err) != 0) {
        loom_err_prefix(err, "%s is complete, but updating 'latest' failed", dir);
        goto done;
    }
    if (copy_out(out_dir, out_size, dir, err) != 0) goto done;
    rc = 0;
done:
    free(manifest_text);
    json_decref(manifest);
    return rc;
}

int loom_ckpt_save(const char *root, int64_t step, const loom_ckpt_file *files, int n,
                   char *out_dir, size_t out_size, loom_err *err) {
    if (n < 0 || n > CKPT_MAX_FILES || (n > 0 && !files))
        return loom_errf(err, "%s: bad checkpoint file list (n=%d)", root ? root : "", n);
    const char **names = loom_calloc((size_t)n + 1, sizeof *names);
    for (int i = 0; i < n; i++) names[i] = files[i].name;
    char dir[CKPT_PATH];
    int rc = -1;
    /* a result buffer that is too small is refused before anything is written */
    if (step_dir(root, step, dir, sizeof dir, err) != 0) goto done;
    if (out_dir && strlen(dir) >= out_size) {
        loom_errf(err, "%s: path does not fit the %zu-byte buffer", dir, out_size);
        goto done;
    }
    if (loom_ckpt_prepare(root, step, names, n, dir, sizeof dir, err) != 0) goto done;
    for (int i = 0; i < n; i++)
        if (loom_ckpt_write_file(dir, files[i].name, files[i].data, files[i].len, err)) goto done;
    rc = loom_ckpt_commit(root, step, names, n, out_dir, out_size, err);
done:
    free(names);
    return rc;
}

int loom_ckpt_find_latest(const char *root, char *out_dir, size_t out_size, int64_t *step,
                          loom_err *err) {
    *step = -1;
    if (out_dir && out_size) out_dir[0] = 0;
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return 0;
        return loom_errf(err, "%s: cannot open directory: %s", root, strerror(errno));
    }
    char best[CKPT_PATH] = "", path[CKPT_PATH];
    int64_t best_step = -1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int64_t s;
        if (!parse_step_name(de->d_name, &s)) continue;
        if (s < best_step || (s == best_step && strcmp(de->d_name, best) >= 0)) continue;
        if (snprintf(path, sizeof path, "%s/%s/%s", root, de->d_name, COMPLETE) >=
            (int)sizeof path)
            continue;
        if (!is_regular(path)) continue;
        best_step = s;
        snprintf(best, sizeof best, "%s", de->d_name);
    }
    closedir(d);
    if (best_step < 0) return 0;
    if (snprintf(path, sizeof path, "%s/%s", root, best) >= (int)sizeof path)
        return loom_errf(err, "%s: path too long", root);
    if (copy_out(out_dir, out_size, path, err) != 0) return -1;
    *step = best_step;
    return 0;
}

/* Joins a symlink's target with the link's directory when the target is relative. */
static int follow_link(const char *link, char *out, size_t size, loom_err *err) {
    char target[CKPT_PATH];
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) return loom_errf(err, "%s: cannot read link: %s", link, strerror(errno));
    target[n] = 0;
    if (target[0] == '/') return copy_out(out, size, target, err);
    char dir[CKPT_PATH];
    snprintf(dir, sizeof dir, "%s", link);
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') dir[--len] = 0;
    char *slash = strrchr(dir, '/');
    char joined[2 * CKPT_PATH];
    if (!slash) snprintf(joined, sizeof joined, "%s", target);
    else {
        slash[1] = 0;
        snprintf(joined, sizeof joined, "%s%s", dir, target);
    }
    return copy_out(out, size, joined, err);
}

static int looks_like_step_dir(const char *dir) {
    char p[CKPT_PATH];
    int64_t s;
    if (snprintf(p, sizeof p, "%s/%s", dir, COMPLETE) < (int)sizeof p && loom_path_exists(p))
        return 1;
    if (snprintf(p, sizeof p, "%s/%s", dir, MANIFEST) < (int)sizeof p && loom_path_exists(p))
        return 1;
    return parse_step_name(base_name(dir), &s);
}

int loom_ckpt_resolve(const char *path, char *out_dir, size_t out_size, loom_err *err) {
    if (!path || !*path) return loom_errf(err, "checkpoint: empty path");
    if (loom_path_check("checkpoint", path, LOOM_DIR_PATH_MAX, err)) return -1;
    struct stat st;
    if (lstat(path, &st) != 0)
        return loom_errf(err, "%s: no such checkpoint: %s", path, strerror(errno));
    char real[CKPT_PATH];
    if (S_ISLNK(st.st_mode)) {
        /* a `latest` link (or any link to a step directory): report the step directory */
        if (!loom_is_dir(path))
            return loom_errf(err, "%s: symlink does not point to a directory", path);
        if (follow_link(path, real, sizeof real, err) != 0) return -1;
        if (looks_like_step_dir(real)) return copy_out(out_dir, out_size, real, err);
    } else {
        if (!S_ISDIR(st.st_mode)) return loom_errf(err, "%s: not a checkpoint directory", path);
        if (snprintf(real, sizeof real, "%s", path) >= (int)sizeof real)
            return loom_errf(err, "%s: path too long", path);
        if (looks_like_step_dir(real)) return copy_out(out_dir, out_size, real, err);
    }
    /* a ckpt root, or a run directory holding ckpt/ */
    int64_t step;
    char sub[CKPT_PATH];
    if (loom_ckpt_find_latest(real, out_dir, out_size, &step, err) != 0) return -1;
    if (step >= 0) return 0;
    if (snprintf(sub, sizeof sub, "%s/ckpt", real) < (int)sizeof sub && loom_is_dir(sub)) {
        if (loom_ckpt_find_latest(sub, out_dir, out_size, &step, err) != 0) return -1;
        if (step >= 0) return 0;
    }
    return loom_errf(err,
                     "%s: no complete checkpoint found (no step_NNNNNNN directory with a "
                     "COMPLETE marker here or in its ckpt/)",
                     path);
}

/* ---- opening ------------------------------------------------------------------------ */
typedef struct {
    char *name;
    char *data; /* NULL when deferred */
    size_t len;
    int deferred;   /* not read at open: verified while a reader streams it */
    uint64_t bytes; /* the manifest's size and SHA-256 */
    char sha[65];
} ckpt_file;

struct loom_ckpt {
    char *dir;
    int64_t step;
    ckpt_file *files;
    int n;
    int (*defer)(const char *name);
};

void loom_ckpt_close(loom_ckpt *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->files[i].name);
        free(c->files[i].data);
    }
    free(c->files);
    free(c->dir);
    free(c);
}

int64_t loom_ckpt_step(const loom_ckpt *c) { return c->step; }
const char *loom_ckpt_dir(const loom_ckpt *c) { return c->dir; }

int loom_ckpt_num_files(const loom_ckpt *c) { return c->n; }

const char *loom_ckpt_file_name(const loom_ckpt *c, int i) {
    LOOM_CHECK(i >= 0 && i < c->n);
    return c->files[i].name;
}

const char *loom_ckpt_file_data(const loom_ckpt *c, const char *name, size_t *len) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->files[i].name, name) == 0) {
            if (len) *len = c->files[i].len;
            return c->files[i].data;
        }
    return NULL;
}

int loom_ckpt_file_deferred(const loom_ckpt *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->files[i].name, name) == 0) return c->files[i].deferred;
    return 0;
}

static int is_hex64(const char *s) {
    if (strlen(s) != 64) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

/* Reads and verifies one listed file into c->files[c->n]. */
static int load_file(loom_ckpt *c, const char *name, json_t *ent, loom_err *err) {
    const char *dir = c->dir;
    char path[CKPT_PATH];
    const char *why = bad_file_name(name);
    if (why) return loom_errf(err, "%s/%s: file name '%.200s' %s", dir, MANIFEST, name, why);
    if (!json_is_object(ent))
        return loom_errf(err, "%s/%s: entry '%s' is not an object", dir, MANIFEST, name);
    json_t *jb = json_object_get(ent, "bytes"), *jh = json_object_get(ent, "sha256");
    if (!json_is_integer(jb) || json_integer_value(jb) < 0 ||
        (uint64_t)json_integer_value(jb) > CKPT_MAX_FILE)
        return loom_errf(err, "%s/%s: entry '%s': 'bytes' must be an integer in [0, %" PRIu64 "]",
                         dir, MANIFEST, name, CKPT_MAX_FILE);
    if (!json_is_string(jh) || !is_hex64(json_string_value(jh)))
        return loom_errf(err, "%s/%s: entry '%s': 'sha256' must be 64 lowercase hex digits",
                         dir, MANIFEST, name);
    uint64_t want_bytes = (uint64_t)json_integer_value(jb);
    const char *want_sha = json_string_value(jh);
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return loom_errf(err, "%s/%s: path too long", dir, name);

    struct stat st;
    if (lstat(path, &st) != 0)
        return loom_errf(err, "%s: listed in the manifest but cannot be read: %s — the "
                              "checkpoint is incomplete or corrupt",
                         path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return loom_errf(err, "%s: not a regular file (checkpoint files may not be links)", path);
    if ((uint64_t)st.st_size != want_bytes)
        return loom_errf(err,
                         "%s: size mismatch (manifest says %" PRIu64
                         " bytes, file has %lld) — the checkpoint is corrupt",
                         path, want_bytes, (long long)st.st_size);
    if (want_bytes > (uint64_t)SIZE_MAX - 1) return loom_errf(err, "%s: too large", path);
    if (c->defer && c->defer(name)) { /* read (and hashed) later, by a reader */
        ckpt_file *f = &c->files[c->n++];
        f->name = loom_strdup(name);
        f->deferred = 1;
        f->bytes = want_bytes;
        memcpy(f->sha, want_sha, 65);
        return 0;
    }
    char *data = NULL;
    size_t len = 0;
    if (loom_read_file(path, (size_t)want_bytes, &data, &len, err) != 0) return -1;
    char hex[65];
    loom_sha256_hex(data, len, hex);
    if (len != want_bytes || strcmp(hex, want_sha) != 0) {
        free(data);
        return loom_errf(err,
                         "%s: SHA-256 mismatch (manifest says %s, file has %s) — the "
                         "checkpoint is corrupt",
                         path, want_sha, hex);
    }
    ckpt_file *f = &c->files[c->n++];
    f->name = loom_strdup(name);
    f->data = data;
    f->len = len;
    f->bytes = want_bytes;
    memcpy(f->sha, want_sha, 65);
    return 0;
}

int loom_ckpt_open(const char *step_dir, loom_ckpt **out, loom_err *err) {
    return loom_ckpt_open_ex(step_dir, NULL, out, err);
}

int loom_ckpt_open_ex(const char *step_dir, int (*defer)(const char *name), loom_ckpt **out,
                      loom_err *err) {
    *out = NULL;
    if (!step_dir || !*step_dir) return loom_errf(err, "checkpoint: empty path");
    if (!loom_is_dir(step_dir))
        return loom_errf(err, "%s: not a checkpoint directory (missing or not a directory)",
                         step_dir);
    char path[CKPT_PATH];
    if (snprintf(path, sizeof path, "%s/%s", step_dir, COMPLETE) >= (int)sizeof path - 300)
        return loom_errf(err, "%s: path too long", step_dir);
    if (!is_regular(path))
        return loom_errf(err, "%s: incomplete checkpoint (no COMPLETE marker)", step_dir);
    /* the markers, like the files they vouch for, are never followed through a link: a link
     * would let a directory borrow another's commit */
    static const char *const markers[] = {"COMPLETE", "manifest.json"};
    for (int i = 0; i < 2; i++) {
        char mp[CKPT_PATH];
        struct stat st;
        loom_pathf(mp, sizeof mp, "%s/%s", step_dir, markers[i]);
        if (lstat(mp, &st) == 0 && !S_ISREG(st.st_mode))
            return loom_errf(err, "%s: not a regular file (checkpoint markers may not be links)",
                             mp);
    }

    int rc = -1;
    char *marker = NULL, *text = NULL;
    size_t marker_len = 0, text_len = 0;
    json_t *root = NULL;
    loom_ckpt *c = loom_calloc(1, sizeof *c);
    c->dir = loom_strdup(step_dir);
    c->defer = defer;

    if (loom_read_file(path, 4096, &marker, &marker_len, err) != 0) goto done;
    loom_pathf(path, sizeof path, "%s/%s", step_dir, MANIFEST);
    if (loom_read_file(path, CKPT_MAX_MANIFEST, &text, &text_len, err) != 0) goto done;

    /* COMPLETE holds the manifest's SHA-256: a manifest swapped after the commit shows */
    char hex[65];
    loom_sha256_hex(text, text_len, hex);
    while (marker_len > 0 && (marker[marker_len - 1] == '\n' || marker[marker_len - 1] == ' '))
        marker[--marker_len] = 0;
    if (strcmp(marker, hex) != 0) {
        loom_errf(err,
                  "%s: COMPLETE says the manifest's SHA-256 is %.64s, manifest.json has %s — "
                  "the checkpoint is corrupt",
                  step_dir, marker, hex);
        goto done;
    }

    json_error_t je;
    root = json_loadb(text, text_len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        loom_errf(err, "%s: byte %d: %s", path, je.position, je.text);
        goto done;
    }
    if (!json_is_object(root)) {
        loom_errf(err, "%s: not a JSON object", path);
        goto done;
    }
    json_t *js = json_object_get(root, "step"), *jf = json_object_get(root, "files");
    if (!json_is_integer(js) || json_integer_value(js) < 0) {
        loom_errf(err, "%s: 'step' must be a non-negative integer", path);
        goto done;
    }
    c->step = (int64_t)json_integer_value(js);
    int64_t named;
    if (parse_step_name(base_name(step_dir), &named) && named != c->step) {
        loom_errf(err, "%s: manifest says step %" PRId64 " but the directory is step %" PRId64,
                  path, c->step, named);
        goto done;
    }
    if (!json_is_object(jf) || json_object_size(jf) > CKPT_MAX_FILES) {
        loom_errf(err, "%s: 'files' must be an object of at most %d entries", path,
                  CKPT_MAX_FILES);
        goto done;
    }
    c->files = loom_calloc(json_object_size(jf) + 1, sizeof *c->files);
    const char *name;
    json_t *ent;
    json_object_foreach(jf, name, ent) {
        if (load_file(c, name, ent, err) != 0) goto done;
    }
    *out = c;
    c = NULL;
    rc = 0;
done:
    json_decref(root);
    free(text);
    free(marker);
    loom_ckpt_close(c);
    return rc;
}

/* ---- streaming a file through its SHA-256 ----------------------------------------------- */
#define READER_CHUNK ((size_t)1 << 20)

struct loom_ckpt_reader {
    int fd;
    char path[CKPT_PATH];
    uint64_t bytes, pos;
    char sha[65];
    EVP_MD_CTX *ctx;
    char *chunk; /* for the bytes nobody asked for: hashed and dropped */
};

void loom_ckpt_reader_close(loom_ckpt_reader *r) {
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    EVP_MD_CTX_free(r->ctx);
    free(r->chunk);
    free(r);
}

uint64_t loom_ckpt_reader_size(const loom_ckpt_reader *r) { return r->bytes; }
const char *loom_ckpt_reader_path(const loom_ckpt_reader *r) { return r->path; }

int loom_ckpt_reader_open(const loom_ckpt *c, const char *name, loom_ckpt_reader **out,
                          loom_err *err) {
    *out = NULL;
    const ckpt_file *f = NULL;
    for (int i = 0; i < c->n && !f; i++)
        if (strcmp(c->files[i].name, name) == 0) f = &c->files[i];
    if (!f) return loom_errf(err, "%s: checkpoint lists no file '%.200s'", c->dir, name);
    loom_ckpt_reader *r = loom_calloc(1, sizeof *r);
    r->fd = -1;
    r->bytes = f->bytes;
    memcpy(r->sha, f->sha, 65);
    loom_pathf(r->path, sizeof r->path, "%s/%s", c->dir, name);
    r->fd = open(r->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (r->fd < 0) {
        loom_errf(err, "%s: cannot open: %s — the checkpoint is incomplete or corrupt", r->path,
                  strerror(errno));
        goto fail;
    }
    if (fstat(r->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        loom_errf(err, "%s: not a regular file (checkpoint files may not be links)", r->path);
        goto fail;
    }
    if ((uint64_t)st.st_size != r->bytes) {
        loom_errf(err, "%s: size mismatch (manifest says %" PRIu64 " bytes, file has %lld) — the "
                       "checkpoint is corrupt", r->path, r->bytes, (long long)st.st_size);
        goto fail;
    }
    (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    r->ctx = EVP_MD_CTX_new();
    LOOM_CHECK(r->ctx && EVP_DigestInit_ex(r->ctx, EVP_sha256(), NULL) == 1);
    *out = r;
    return 0;
fail:
    loom_ckpt_reader_close(r);
    return -1;
}

/* reads exactly len bytes at the current position into dst and hashes them */
static int reader_take(loom_ckpt_reader *r, char *dst, size_t len, loom_err *err) {
    size_t got = 0;
    while (got < len) {
        ssize_t k = read(r->fd, dst + got, len - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return loom_errf(err, "%s: read error: %s", r->path, strerror(errno));
        if (k == 0)
            return loom_errf(err, "%s: ends at byte %" PRIu64 ", the manifest says %" PRIu64
                                  " bytes (changed while being read?) — the checkpoint is "
                                  "corrupt",
                             r->path, r->pos + got, r->bytes);
        got += (size_t)k;
    }
    LOOM_CHECK(EVP_DigestUpdate(r->ctx, dst, len) == 1);
    r->pos += len;
    return 0;
}

/* hashes and drops the bytes up to offset `to` */
static int reader_skip(loom_ckpt_reader *r, uint64_t to, loom_err *err) {
    if (to > r->pos && !r->chunk) r->chunk = loom_malloc(READER_CHUNK);
    while (r->pos < to) {
        const uint64_t left = to - r->pos;
        if (reader_take(r, r->chunk, left < READER_CHUNK ? (size_t)left : READER_CHUNK, err))
            return -1;
    }
    return 0;
}

int loom_ckpt_reader_read(loom_ckpt_reader *r, uint64_t offset, void *dst, size_t len,
                          loom_err *err) {
    if (offset < r->pos || offset > r->bytes || len > r->bytes - offset)
        return loom_errf(err, "%s: bytes [%" PRIu64 ", +%zu) are behind the reader (at %" PRIu64
                              ") or past the file's %" PRIu64 " bytes",
                         r->path, offset, len, r->pos, r->bytes);
    if (reader_skip(r, offset, err)) return -1;
    return reader_take(r, dst, len, err);
}

int loom_ckpt_reader_finish(loom_ckpt_reader *r, loom_err *err) {
    if (reader_skip(r, r->bytes, err)) return -1;
    char extra;
    ssize_t k;
    while ((k = read(r->fd, &extra, 1)) < 0 && errno == EINTR) {
    }
    if (k != 0)
        return loom_errf(err, "%s: %s after the manifest's %" PRIu64 " bytes (changed while being "
                              "read?) — the checkpoint is corrupt",
                         r->path, k > 0 ? "more bytes" : "read error", r->bytes);
    unsigned char md[32];
    unsigned int mdlen = 0;
    LOOM_CHECK(EVP_DigestFinal_ex(r->ctx, md, &mdlen) == 1 && mdlen == 32);
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    if (strcmp(hex, r->sha) != 0)
        return loom_errf(err,
                         "%s: SHA-256 mismatch (manifest says %s, file has %s) — the "
                         "checkpoint is corrupt",
                         r->path, r->sha, hex);
    return 0;
}
