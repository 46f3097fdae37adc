/* The cpu-guard backend: the cpu kernels over memory the host cannot touch.
 *
 * Every allocation comes from one reserved range of address space (mmap PROT_NONE,
 * MAP_NORESERVE), handed out page-aligned in increasing order and never reused, and is
 * registered (start, length, live). The range is readable and writable only while one of the
 * backend's own ops, copies or comm_begin/comm_end windows runs (a depth count under a mutex:
 * the first one in opens it with one mprotect, the last one out closes it), so any other host
 * access to device memory faults at the instruction that made it; the SIGSEGV handler installed
 * here names the address and prints a backtrace before the default action ends the process.
 * Before opening, each op checks that every pointer argument is NULL or inside a live
 * allocation, and aborts naming the op and the argument otherwise (a host pointer passed to a
 * device op); the copies check both sides and their extent. Freed allocations give their pages
 * back (madvise) and stay registered as dead, so a freed pointer is refused too.
 * Threads: a host access from another thread while an op runs is not caught (the range is
 * open for the whole process): the guard proves the single-threaded discipline of the engine. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loom/backend.h"
#include "loom/base.h"
#include "kernels/backend_mem.h"

static const loom_backend *CPU;

static struct {
    char *base;          /* the reserved range */
    size_t reserved;
    size_t used;         /* bytes handed out: [base, base + used) */
    size_t page;
    int depth;           /* open windows */
    pthread_mutex_t mu;
    /* the registry, in address order (allocations only grow upwards) */
    size_t *off, *len;
    unsigned char *live;
    size_t n, cap;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER};

static struct sigaction old_segv;

static void guard_panic(const char *fmt, const char *a, const char *b, const void *p) {
    fprintf(stderr, "cpu-guard: ");
    fprintf(stderr, fmt, a, b, p);
    fprintf(stderr, "\n");
    void *bt[64];
    const int n = backtrace(bt, 64);
    backtrace_symbols_fd(bt, n, 2);
    abort();
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
    const char *a = si->si_addr;
    if (G.base && a >= G.base && a < G.base + G.reserved) {
        char msg[128];
        const int n = snprintf(msg, sizeof msg,
                               "cpu-guard: host access to device memory at %p\n", si->si_addr);
        if (n > 0) (void)!write(2, msg, (size_t)n);
        void *bt[64];
        const int k = backtrace(bt, 64);
        backtrace_symbols_fd(bt, k, 2);
        signal(SIGSEGV, SIG_DFL); /* returning re-runs the access: the default action */
        return;
    }
    /* not ours: whoever handled it before (a sanitizer), or the default action */
    if (old_segv.sa_flags & SA_SIGINFO) {
        old_segv.sa_sigaction(sig, si, uc);
    } else if (old_segv.sa_handler != SIG_DFL && old_segv.sa_handler != SIG_IGN) {
        old_segv.sa_handler(sig);
    } else {
        signal(SIGSEGV, SIG_DFL);
    }
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void guard_init(void) {
    CPU = loom_backend_cpu();
    G.page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t r = (size_t)1 << 40; r >= (size_t)1 << 32; r >>= 1) {
        void *p = mmap(NULL, r, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            G.base = p;
            G.reserved = r;
            break;
        }
    }
    if (!G.base) loom_panic(__FILE__, __LINE__, "cpu-guard: cannot reserve address space");
    loom_guard_install_handler();
}

void loom_guard_install_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
}

/* the registry entry holding address p (live or dead), or -1; G.mu held */
static ptrdiff_t find(const void *p) {
    const char *c = p;
    if (!G.base || c < G.base || c >= G.base + G.used) return -1;
    const size_t o = (size_t)(c - G.base);
    size_t lo = 0, hi = G.n;
    while (lo < hi) { /* the last entry with off <= o */
        const size_t mid = (lo + hi) / 2;
        if (G.off[mid] <= o) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return -1;
    const size_t i = lo - 1;
    return o < G.off[i] + (G.len[i] ? G.len[i] : 1) ? (ptrdiff_t)i : -1;
}

/* 1 when [p, p + n) lies inside one live allocation */
static int owns(const void *p, size_t n) {
    pthread_mutex_lock(&G.mu);
    const ptrdiff_t i = find(p);
    int ok = i >= 0 && G.live[i];
    if (ok) {
        const size_t o = (size_t)((const char *)p - G.base);
        ok = o + n <= G.off[i] + G.len[i] || (n == 0 && G.len[i] == 0);
    }
    pthread_mutex_unlock(&G.mu);
    return ok;
}

int loom_guard_owns(const void *p) { return p && G.base && owns(p, 0); }

static void guard_check(const char *op, const char *arg, const void *p) {
    if (p && !owns(p, 0))
        guard_panic("%s: argument %s = %p is not device memory (a host pointer, or freed)", op,
                    arg, p);
}

static void guard_open(void) {
    pthread_mutex_lock(&G.mu);
    if (G.depth++ == 0 && G.used && mprotect(G.base, G.used, PROT_READ | PROT_WRITE))
        loom_panic(__FILE__, __LINE__, "cpu-guard: mprotect failed");
    pthread_mutex_unlock(&G.mu);
}

static void guard_close(void) {
    pthread_mutex_lock(&G.mu);
    LOOM_CHECK(G.depth > 0);
    if (--G.depth == 0 && G.used && mprotect(G.base, G.used, PROT_NONE))
        loom_panic(__FILE__, __LINE__, "cpu-guard: mprotect failed");
    pthread_mutex_unlock(&G.mu);
}

/* ---- memory ---- */

static void *g_mem_alloc(size_t bytes, int flags) {
    (void)flags; /* fresh pages are zero; huge pages are the cpu backend's concern */
    pthread_mutex_lock(&G.mu);
    const size_t size = ((bytes ? bytes : 1) + G.page - 1) & ~(G.page - 1);
    if (G.used + size > G.reserved)
        loom_panic(__FILE__, __LINE__, "cpu-guard: out of reserved address space (%zu bytes)",
                   bytes);
    if (G.n == G.cap) {
        G.cap = G.cap ? 2 * G.cap : 256;
        G.off = realloc(G.off, G.cap * sizeof *G.off);
        G.len = realloc(G.len, G.cap * sizeof *G.len);
        G.live = realloc(G.live, G.cap);
        if (!G.off || !G.len || !G.live) loom_panic(__FILE__, __LINE__, "out of memory");
    }
    char *p = G.base + G.used;
    G.off[G.n] = G.used;
    G.len[G.n] = bytes;
    G.live[G.n] = 1;
    G.n++;
    G.used += size;
    /* inside an open window the new pages are opened too */
    if (G.depth > 0 && mprotect(p, size, PROT_READ | PROT_WRITE))
        loom_panic(__FILE__, __LINE__, "cpu-guard: mprotect failed");
    pthread_mutex_unlock(&G.mu);
    return p;
}

static void g_mem_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&G.mu);
    const ptrdiff_t i = find(p);
    if (i < 0 || !G.live[i] || G.base + G.off[i] != (char *)p) {
        pthread_mutex_unlock(&G.mu);
        guard_panic("%s%s: %p is not a live allocation", "mem_free", "", p);
    }
    G.live[i] = 0;
    const size_t size = ((G.len[i] ? G.len[i] : 1) + G.page - 1) & ~(G.page - 1);
    (void)madvise(p, size, MADV_DONTNEED);
    pthread_mutex_unlock(&G.mu);
}

static void check_extent(const char *op, const char *arg, const void *p, size_t n) {
    if (!owns(p, n))
        guard_panic("%s: %s = %p: not device memory, or the bytes run past its allocation", op,
                    arg, p);
}
static void check_host(const char *op, const char *arg, const void *p, size_t n) {
    if (n && (owns(p, 0) || owns((const char *)p + n - 1, 0)))
        guard_panic("%s: %s = %p is device memory (expected host memory)", op, arg, p);
}

static void g_mem_h2d(void *dst, const void *src, size_t n) {
    if (!n) return;
    check_extent("mem_h2d", "dst", dst, n);
    check_host("mem_h2d", "src", src, n);
    guard_open();
    memcpy(dst, src, n);
    guard_close();
}
static void g_mem_d2h(void *dst, const void *src, size_t n) {
    if (!n) return;
    check_extent("mem_d2h", "src", src, n);
    check_host("mem_d2h", "dst", dst, n);
    guard_open();
    memcpy(dst, src, n);
    guard_close();
}
static void g_mem_d2d(void *dst, const void *src, size_t n) {
    if (!n) return;
    check_extent("mem_d2d", "dst", dst, n);
    check_extent("mem_d2d", "src", src, n);
    guard_open();
    memmove(dst, src, n);
    guard_close();
}
static void g_mem_set(void *dst, int byte, size_t n) {
    if (!n) return;
    check_extent("mem_set", "dst", dst, n);
    guard_open();
    memset(dst, byte, n);
    guard_close();
}
static void g_mem_d2d_rows(void *dst, size_t dpitch, const void *src, size_t spitch,
                           size_t width, size_t rows) {
    if (!rows || !width) return;
    check_extent("mem_d2d_rows", "dst", dst, (rows - 1) * dpitch + width);
    check_extent("mem_d2d_rows", "src", src, (rows - 1) * spitch + width);
    guard_open();
    loom_mem_copy_rows(dst, dpitch, src, spitch, width, rows);
    guard_close();
}
static void g_mem_release(void *p, size_t n) {
    if (!n) return;
    check_extent("mem_release", "p", p, n);
    loom_mem_release_pages(p, n); /* madvise needs no access */
}
static void g_nothing(void) {}

#include "kernels/backend_guard_ops.h"

static loom_backend guard;

static void set_table(void);
const loom_backend *loom_backend_guard(void) {
    static pthread_once_t table_once = PTHREAD_ONCE_INIT;
    pthread_once(&once, guard_init);
    pthread_once(&table_once, set_table);
    return &guard;
}

static void set_table(void) {
    /* every field from the cpu table first; then every op replaced (an op left unwrapped
     * would run on closed memory: tests/unit/test_guard.c checks none is left) */
    guard = *CPU;
    guard.name = "cpu-guard";
    guard.host_memory = 0;
    guard.mem_alloc = g_mem_alloc;
    guard.mem_free = g_mem_free;
    guard.mem_h2d = g_mem_h2d;
    guard.mem_d2h = g_mem_d2h;
    guard.mem_d2d = g_mem_d2d;
    guard.mem_set = g_mem_set;
    guard.mem_d2d_rows = g_mem_d2d_rows;
    guard.mem_release = g_mem_release;
    guard.mem_sync = g_nothing;
    guard.comm_begin = guard_open;
    guard.comm_end = guard_close;
#define SET(NAME) guard.NAME = CPU->NAME ? g_##NAME : NULL;
    GUARD_WRAPPED(SET)
#undef SET
}
