/* The CUDA emulator's scheduler and runtime (src/cuda/emu/emu.h says what it models).
 *
 * Fibers start with makecontext/setcontext and then switch with _setjmp/_longjmp, which do
 * not save or restore the signal mask: swapcontext makes a system call (rt_sigprocmask) at
 * every switch, which made barrier-heavy kernels spend most of their time in the kernel.
 * Fortified longjmp (checking that the target frame is on the current stack) cannot allow
 * jumps between stacks: it is off for this file. */
#undef _FORTIFY_SOURCE
#include "emu.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

extern "C" {
#include "loom/base.h"
}

uint3 emu_threadIdx, emu_blockIdx;
dim3 emu_blockDim, emu_gridDim;

namespace {

enum { RUN = 0, WAIT_BLOCK = 1, WAIT_WARP = 2, DONE = 3 };
enum { STACK = 256 * 1024, MAX_THREADS = 1024 };

struct fiber {
    ucontext_t ctx; /* the first entry */
    jmp_buf jb;     /* where it yielded */
    int started;
    int state;
    uint3 tid;
    uint64_t xin, xout; /* warp exchange: the value put in, the one got */
    int src;
};

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
jmp_buf g_sched;
ucontext_t g_tmpl;
fiber g_fib[MAX_THREADS];
char *g_stacks;        /* MAX_THREADS stacks, mapped once */
int g_nthreads, g_cur; /* threads of the running block, the running fiber */
emu_fn g_fn;
void *g_ctx;
const char *g_name;
unsigned char *g_smem;
size_t g_smem_cap, g_smem_n;
int64_t g_launches;

void trampoline(void) {
    g_fn(g_ctx);
    g_fib[g_cur].state = DONE;
    _longjmp(g_sched, 1); /* never returns: the scheduler goes on */
}

void yield_to_sched(int state) {
    g_fib[g_cur].state = state;
    if (!_setjmp(g_fib[g_cur].jb)) _longjmp(g_sched, 1);
}

/* runs fiber i until it yields or exits */
void resume(int i) {
    g_cur = i;
    emu_threadIdx = g_fib[i].tid;
    if (_setjmp(g_sched)) return;
    if (!g_fib[i].started) {
        g_fib[i].started = 1;
        setcontext(&g_fib[i].ctx);
    }
    _longjmp(g_fib[i].jb, 1);
}

[[noreturn]] void deadlock(const char *why) {
    int nb = 0, nw = 0, nd = 0;
    for (int i = 0; i < g_nthreads; i++) {
        nb += g_fib[i].state == WAIT_BLOCK;
        nw += g_fib[i].state == WAIT_WARP;
        nd += g_fib[i].state == DONE;
    }
    loom_panic(__FILE__, __LINE__,
               "cuda-emu: kernel %s, block (%u,%u,%u): %s (%d threads at __syncthreads, %d at "
               "a warp primitive, %d exited, of %d)",
               g_name, emu_blockIdx.x, emu_blockIdx.y, emu_blockIdx.z, why, nb, nw, nd,
               g_nthreads);
}

void run_block(void) {
    const unsigned bx = emu_blockDim.x, by = emu_blockDim.y;
    for (int i = 0; i < g_nthreads; i++) {
        fiber *f = &g_fib[i];
        f->state = RUN;
        f->started = 0;
        f->tid.x = (unsigned)i % bx;
        f->tid.y = ((unsigned)i / bx) % by;
        f->tid.z = (unsigned)i / (bx * by);
        f->ctx = g_tmpl; /* (one getcontext per process: each is a system call) */
        f->ctx.uc_stack.ss_sp = g_stacks + (size_t)i * STACK;
        f->ctx.uc_stack.ss_size = STACK;
        f->ctx.uc_link = NULL; /* (trampoline never returns) */
        makecontext(&f->ctx, trampoline, 0);
    }
    if (g_smem_n) memset(g_smem, 0xff, g_smem_n);
    for (;;) {
        int ran = 0;
        for (int i = 0; i < g_nthreads; i++) {
            if (g_fib[i].state != RUN) continue;
            resume(i);
            ran = 1;
        }
        (void)ran;
        /* every fiber is now waiting or done */
        int done = 0, at_block = 0, released = 0;
        for (int i = 0; i < g_nthreads; i++) {
            done += g_fib[i].state == DONE;
            at_block += g_fib[i].state == WAIT_BLOCK;
        }
        if (done == g_nthreads) return;
        /* warps whose live lanes all wait at the exchange: do it, release them */
        for (int w = 0; w * 32 < g_nthreads; w++) {
            int lo = w * 32, hi = lo + 32 < g_nthreads ? lo + 32 : g_nthreads;
            int waiting = 0, live = 0;
            for (int i = lo; i < hi; i++) {
                if (g_fib[i].state == DONE) continue;
                live++;
                waiting += g_fib[i].state == WAIT_WARP;
            }
            if (!live || waiting != live) continue;
            for (int i = lo; i < hi; i++) {
                if (g_fib[i].state != WAIT_WARP) continue;
                int s = g_fib[i].src;
                if (s < lo || s >= hi || g_fib[s].state != WAIT_WARP) s = i; /* exited lane */
                g_fib[i].xout = g_fib[s].xin;
            }
            for (int i = lo; i < hi; i++)
                if (g_fib[i].state == WAIT_WARP) g_fib[i].state = RUN, released = 1;
        }
        if (released) continue;
        if (at_block + done == g_nthreads) {
            for (int i = 0; i < g_nthreads; i++)
                if (g_fib[i].state == WAIT_BLOCK) g_fib[i].state = RUN;
            continue;
        }
        deadlock("threads wait at different barriers");
    }
}

} // namespace

void emu_run(dim3 grid, dim3 block, size_t smem, const char *name, emu_fn fn, void *ctx) {
    const int64_t nt = (int64_t)block.x * block.y * block.z;
    if (nt < 1 || nt > MAX_THREADS || grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 ||
        grid.z > 65535 || block.z > 64)
        loom_panic(__FILE__, __LINE__,
                   "cuda-emu: kernel %s: invalid launch (grid %u,%u,%u, block %u,%u,%u)", name,
                   grid.x, grid.y, grid.z, block.x, block.y, block.z);
    if (smem > 227 * 1024)
        loom_panic(__FILE__, __LINE__,
                   "cuda-emu: kernel %s: %zu bytes of dynamic shared memory (at most 227 KiB "
                   "on sm_90, 163 KiB on sm_80)", name, smem);
    pthread_mutex_lock(&g_lock);
    if (!g_stacks) {
        void *p = mmap(NULL, (size_t)MAX_THREADS * STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) loom_panic(__FILE__, __LINE__, "cuda-emu: cannot map fiber stacks");
        g_stacks = (char *)p;
        getcontext(&g_tmpl);
    }
    if (smem > g_smem_cap) {
        free(g_smem);
        g_smem = (unsigned char *)aligned_alloc(64, (smem + 63) / 64 * 64);
        if (!g_smem) loom_panic(__FILE__, __LINE__, "cuda-emu: out of memory");
        g_smem_cap = smem;
    }
    g_smem_n = smem;
    g_fn = fn;
    g_ctx = ctx;
    g_name = name;
    g_nthreads = (int)nt;
    emu_blockDim = block;
    emu_gridDim = grid;
    g_launches++;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu_blockIdx.x = x;
                emu_blockIdx.y = y;
                emu_blockIdx.z = z;
                run_block();
            }
    pthread_mutex_unlock(&g_lock);
}

void *emu_dyn_smem(void) { return g_smem; }
int64_t emu_launches(void) { return g_launches; }

void __syncthreads(void) { yield_to_sched(WAIT_BLOCK); }
int emu_lane(void) { return g_cur & 31; }
uint64_t emu_warp_exchange(uint64_t v, int src) {
    fiber *f = &g_fib[g_cur];
    f->xin = v;
    f->src = (g_cur & ~31) + (src & 31);
    if (src < 0 || src > 31) f->src = g_cur;
    yield_to_sched(WAIT_WARP);
    return g_fib[g_cur].xout;
}
void __syncwarp(unsigned) { (void)emu_warp_exchange(0, emu_lane()); }

/* every live lane of the warp puts n <= 8 words in; each gets all 32 lanes' (lane-major) */
static uint32_t g_wslot[MAX_THREADS][8];
void emu_warp_allgather(const uint32_t *in, int n, uint32_t *out) {
    const int base = g_cur & ~31;
    for (int i = 0; i < n; i++) g_wslot[g_cur][i] = in[i];
    __syncwarp();
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < n; i++)
            out[l * n + i] = base + l < g_nthreads ? g_wslot[base + l][i] : 0;
    __syncwarp(); /* nobody overwrites its slot before every lane has read */
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, PTX's fragment layout (group g =
 * lane / 4, t = lane % 4): A (16 x 16, row-major) a[r] holds rows g (r = 0, 2) or g + 8 (r =
 * 1, 3), columns 2t, 2t + 1 (r < 2) or 2t + 8, 2t + 9, the lower column in the low half; B (16
 * x 8, "col": k by n) b[r] holds k = 2t + 8r, 2t + 8r + 1 of column g; C/D (16 x 8 fp32) c[0],
 * c[1] row g, c[2], c[3] row g + 8, columns 2t, 2t + 1. The products of bf16 are exact in fp32;
 * the sum over k is done here in float, k in order (the tensor core's order and rounding of
 * the accumulation are its own: tests allow for it). */
void emu_mma_bf16_16816(float *d, const uint32_t *a, const uint32_t *b, const float *c) {
    uint32_t in[6] = {a[0], a[1], a[2], a[3], b[0], b[1]}, all[32 * 6];
    emu_warp_allgather(in, 6, all);
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        const uint32_t *f = all + l * 6;
        for (int r = 0; r < 4; r++) {
            const int row = g + ((r & 1) ? 8 : 0), col = 2 * t + ((r & 2) ? 8 : 0);
            A[row][col] = __uint_as_float((f[r] & 0xffffu) << 16);
            A[row][col + 1] = __uint_as_float(f[r] & 0xffff0000u);
        }
        for (int r = 0; r < 2; r++) {
            const int k = 2 * t + 8 * r;
            B[k][g] = __uint_as_float((f[4 + r] & 0xffffu) << 16);
            B[k + 1][g] = __uint_as_float(f[4 + r] & 0xffff0000u);
        }
    }
    const int lane = g_cur & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[i] = acc;
    }
}

/* ---- runtime ------------------------------------------------------------------------- */
const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : e == cudaErrorMemoryAllocation ? "out of memory"
                                                                           : "error";
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
    if (n) memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              cudaMemcpyKind, cudaStream_t) {
    for (size_t r = 0; r < h; r++) memmove((char *)d + r * dp, (const char *)s + r * sp, w);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) {
    if (n) memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
