/* Shared helpers for the cmocka unit tests (tests/unit/test_*.c).
 *
 * Include this header FIRST in a test file: it defines _GNU_SOURCE and pulls in the headers
 * cmocka needs (setjmp, stdarg, stddef, stdint) in the order it needs them, plus stdio,
 * stdlib, string, unistd and loom/base.h. Everything here is static (one copy per test
 * binary); a helper that is not used costs nothing.
 *
 * Helpers fail the current test through cmocka (assert_* / fail_msg) unless said otherwise;
 * the fixture callbacks return 0 / -1 as cmocka's setup/teardown contract wants. */
#ifndef LOOM_TESTS_UNIT_TESTUTIL_H
#define LOOM_TESTS_UNIT_TESTUTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/base.h"

/* ---- temporary directories ------------------------------------------------------------ */

/* Creates a fresh directory $TMPDIR/loom_<test binary>_XXXXXX (TMPDIR unset or empty: /tmp)
 * and writes its path into dir. Returns 0, or -1 when mkdtemp fails (dir then holds the
 * template). */
static inline int tu_mkdtemp(char *dir, size_t size) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, size, "%s/loom_%s_XXXXXX", tmp && *tmp ? tmp : "/tmp",
             program_invocation_short_name);
    return mkdtemp(dir) ? 0 : -1;
}

static inline int tu_rm_entry_(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes dir and everything below it without following links (rm -rf). Returns 0, or -1
 * when something could not be removed; a dir that does not exist counts as removed. */
static inline int tu_rmtree(const char *dir) {
    if (nftw(dir, tu_rm_entry_, 16, FTW_DEPTH | FTW_PHYS) == 0) return 0;
    return errno == ENOENT ? 0 : -1;
}

/* The per-binary scratch directory of the fixture below. */
static char tu_dir[256] __attribute__((unused));

/* cmocka setup/teardown: a fresh tu_dir for a test (or a group), removed afterwards. */
static inline int tu_setup_tmpdir(void **state) {
    (void)state;
    return tu_mkdtemp(tu_dir, sizeof tu_dir);
}

static inline int tu_teardown_tmpdir(void **state) {
    (void)state;
    return tu_rmtree(tu_dir);
}

/* buf = tu_dir/name (truncated to n, always NUL-terminated). Returns buf. */
static inline char *tu_path(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", tu_dir, name);
    return buf;
}

/* ---- whole files ---------------------------------------------------------------------- */

/* Writes exactly n bytes of buf to path (created or truncated); fails the test otherwise. */
static inline void tu_write_file(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("%s: cannot create: %s", path, strerror(errno));
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* tu_write_file of a NUL-terminated string, without the NUL. */
static inline void tu_write_text(const char *path, const char *text) {
    tu_write_file(path, text, strlen(text));
}

/* Reads all of path (up to 1 GiB) into a malloc'd, NUL-terminated buffer the caller frees;
 * *n = its length without the NUL. Fails the test when the file cannot be read. */
static inline void *tu_read_file(const char *path, size_t *n) {
    char *buf = NULL;
    loom_err err = {{0}};
    if (loom_read_file(path, (size_t)1 << 30, &buf, n, &err)) fail_msg("%s", err.msg);
    return buf;
}

/* XORs the byte at offset off of path with mask, in place (off < 0: from the end, -1 = the
 * last byte). Calling it again with the same arguments restores the file. Returns the byte's
 * value before the XOR. */
static inline uint8_t tu_xor_byte(const char *path, int64_t off, uint8_t mask) {
    FILE *f = fopen(path, "r+b");
    if (!f) fail_msg("%s: cannot open: %s", path, strerror(errno));
    assert_int_equal(fseeko(f, (off_t)off, off < 0 ? SEEK_END : SEEK_SET), 0);
    int ch = fgetc(f);
    if (ch == EOF) fail_msg("%s: no byte at offset %lld", path, (long long)off);
    assert_int_equal(fseeko(f, (off_t)off, off < 0 ? SEEK_END : SEEK_SET), 0);
    assert_int_equal(fputc(ch ^ mask, f), ch ^ mask);
    assert_int_equal(fclose(f), 0);
    return (uint8_t)ch;
}

/* ---- little-endian fields ------------------------------------------------------------- */

static inline uint64_t tu_rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline void tu_wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline void tu_wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- error messages ------------------------------------------------------------------- */

/* The first non-NULL entry of want[0..n) that msg does not contain, or NULL when it contains
 * them all. The macros below report through fail_msg at the caller's line. */
static inline const char *tu_missing_(const char *msg, const char *const *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (want[i] && !strstr(msg, want[i])) return want[i];
    return NULL;
}
#define TU_WANTS_(...)                                                                        \
    (const char *const[]){__VA_ARGS__}, sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)

/* TU_ASSERT_HAS(msg, "a", "b", ...): msg contains every given substring (NULLs skipped). */
#define TU_ASSERT_HAS(msg, ...)                                                               \
    do {                                                                                      \
        const char *tu_m_ = (msg), *tu_w_ = tu_missing_(tu_m_, TU_WANTS_(__VA_ARGS__));       \
        if (tu_w_) fail_msg("%s: '%s' lacks '%s'", #msg, tu_m_, tu_w_);                       \
    } while (0)

/* TU_ASSERT_ERR(call, "a", "b", ...): call returns -1 and the loom_err it filled contains
 * every given substring (NULLs skipped). Pass TU_ERR as the call's loom_err * argument; the
 * error lives only inside the macro. A single statement, safe after an unbraced if. */
#define TU_ASSERT_ERR(call, ...)                                                              \
    do {                                                                                      \
        loom_err tu_e_ = {{0}};                                                               \
        int tu_rc_ = (call);                                                                  \
        if (tu_rc_ != -1) fail_msg("%s returned %d, expected -1", #call, tu_rc_);             \
        const char *tu_w_ = tu_missing_(tu_e_.msg, TU_WANTS_(__VA_ARGS__));                  \
        if (tu_w_) fail_msg("%s: error '%s' lacks '%s'", #call, tu_e_.msg, tu_w_);            \
    } while (0)
#define TU_ERR (&tu_e_)

/* ---- kernel levels ---------------------------------------------------------------------- */
#include "loom/backend.h" /* loom_isa */

/* a uniform float in [-1, 1) from a 64-bit LCG state */
static inline float tu_frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

/* the kernel levels this CPU can run, lowest first, into out (at most 3); NATIVE alone in a
 * NATIVE=1 build */
static inline int tu_isa_levels(loom_isa *out) {
    const loom_isa best = loom_isa_detect();
    if (best == LOOM_ISA_NATIVE) {
        out[0] = LOOM_ISA_NATIVE;
        return 1;
    }
    int n = 0;
    const loom_isa all[] = {LOOM_ISA_BASE, LOOM_ISA_AVX2, LOOM_ISA_AVX512};
    for (int i = 0; i < 3; i++)
        if (all[i] <= best) out[n++] = all[i];
    return n;
}

/* the kernels at level lv (nothing to do in a NATIVE=1 build) */
static inline void tu_set_isa(loom_isa lv) {
    if (lv == LOOM_ISA_NATIVE) return;
    loom_err err;
    if (loom_isa_set(lv, &err) != 0) fail_msg("loom_isa_set: %s", err.msg);
}

#endif /* LOOM_TESTS_UNIT_TESTUTIL_H */
