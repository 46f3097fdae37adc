/* The data build's output directory: removing and checking it, what killed builds left
 * beside it, and the lock that makes one build per output (build_internal.h). */
#define _GNU_SOURCE
#include "data/build_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- output directory ---- */
static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(path);
}

void build_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0) nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int build_dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

int build_looks_like_build(const char *out) {
    char p[4200];
    loom_pathf(p, sizeof p, "%s/train/manifest.jsonl", out);
    if (loom_path_exists(p)) return 1;
    loom_pathf(p, sizeof p, "%s/val/manifest.jsonl", out);
    return loom_path_exists(p);
}

/* ---- one build per output, and what killed builds left ---- */

/* "<base><kind><digits>" (kind ".tmp." or ".old."): a temp directory (or a moved-aside previous
 * output) of a build of the output named base */
static int is_leftover(const char *name, const char *base, const char *kind) {
    const size_t nb = strlen(base), nk = strlen(kind);
    if (strncmp(name, base, nb) != 0 || strncmp(name + nb, kind, nk) != 0) return 0;
    const char *d = name + nb + nk;
    if (!*d) return 0;
    for (; *d; d++)
        if (*d < '0' || *d > '9') return 0;
    return 1;
}

/* The directory that holds the output (into parent); returns the output's last component. */
static const char *output_parent(const build *b, char *parent, size_t size) {
    const char *slash = strrchr(b->out, '/');
    if (!slash) loom_pathf(parent, size, ".");
    else if (slash == b->out) loom_pathf(parent, size, "/");
    else loom_pathf(parent, size, "%.*s", (int)(slash - b->out), b->out);
    return slash ? slash + 1 : b->out;
}

/* Member 0, holding the output's lock, so no other build of this output runs: removes the temp
 * directories (OUTPUT.tmp.<pid>) and moved-aside outputs (OUTPUT.old.<pid>) of builds that were
 * killed. A build killed between its two renames leaves no OUTPUT but a complete OUTPUT.old:
 * that one is put back first (the caching then reuses it). */
static void sweep_leftovers(const build *b) {
    char parent[4200], path[8500];
    const char *base = output_parent(b, parent, sizeof parent);
    DIR *d = opendir(parent);
    if (!d) return;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const int tmp = is_leftover(de->d_name, base, ".tmp."), old = is_leftover(de->d_name, base, ".old.");
        if (!tmp && !old) continue;
        loom_pathf(path, sizeof path, "%s/%s", parent, de->d_name);
        if (old && !loom_path_exists(b->out) && build_looks_like_build(path) && rename(path, b->out) == 0) {
            loom_warn("data build: %s was missing and %s (the previous output, moved aside by a "
                      "build that was killed) was put back", b->out, path);
            continue;
        }
        build_remove_tree(path);
        removed++;
    }
    closedir(d);
    if (removed)
        loom_log("data build: removed %d temp director%s of %s left by builds that are no "
                 "longer running", removed, removed == 1 ? "y" : "ies", b->out);
}

/* Member 0 locks PARENT/.NAME.lock (beside the output, which is replaced by a rename; hidden,
 * as it stays) for the whole build, then sweeps what killed builds left; every member learns
 * the outcome. */
int build_lock_output(build *b, const char *recipe_path, loom_err *err) {
    uint8_t bad = 0;
    if (b->rank == 0) {
        char parent[4200], lock[8500];
        const char *base = output_parent(b, parent, sizeof parent);
        int rc = loom_mkdirs(parent, err);
        loom_pathf(lock, sizeof lock, "%s/.%s.lock", parent, base);
        if (rc == 0) rc = loom_lock_file(lock, "loom data build", &b->lock_fd, err);
        if (rc == 1)
            loom_err_prefix(err, "%s: another `loom data build` of output '%s' is running "
                                 "(two builds of one output would replace each other's files)",
                            recipe_path, b->out);
        if (rc == 0) sweep_leftovers(b);
        bad = rc != 0;
    }
    if (multi(b)) b->team->max_u8(b->team->ctx, &bad, 1);
    if (bad && b->rank != 0)
        return loom_errf(err, "%s: member 0 could not lock output '%s' (see its message)",
                         recipe_path, b->out);
    return bad ? -1 : 0;
}
