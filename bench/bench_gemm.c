/* fp32 GEMM libraries side by side on the shapes loom's training runs (bench/README.md).
 *
 *   cc -O2 -o bench_gemm bench/bench_gemm.c -ldl -fopenmp
 *   OMP_NUM_THREADS=1 ./bench_gemm [-r ROUNDS] NAME=LIB.so[:dnnl][:split] ...
 *
 * Each NAME=LIB is dlopen'ed privately (RTLD_LOCAL | RTLD_DEEPBIND, so several BLAS builds
 * live in one process); its cblas_sgemm is called, or dnnl_sgemm with the suffix ":dnnl"
 * (oneDNN's row-major sgemm); a further ":split" makes each OpenMP thread compute one block of
 * C with a single-threaded call (the library's own threading not used). Shapes are loom's linear layers (src/kernels/matmul.c) for
 * byte-tiny (B*T = 2048, d = 256, V = 256) and gpt2-small (B*T = 1024, d = 768, V = 50257):
 * forward out = inp·Wᵀ (NT), backward dinp = dout·W (NN, beta 1) and dW = doutᵀ·inp (TN,
 * beta 1). Rounds interleave the libraries (A B C, A B C, ...) so a loaded machine hits all
 * of them alike; times are CPU seconds; each (library, shape) keeps the median of its rounds' GFLOP/s. The results
 * of every library are compared with the first one's (max relative difference). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);
typedef int (*dnnl_sgemm_fn)(char, char, long, long, long, float, const float *, long,
                             const float *, long, float, float *, long);
typedef void (*set_threads_fn)(int);

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112, MAX_LIBS = 8, MAX_ROUNDS = 64 };

typedef struct {
    const char *name;
    cblas_sgemm_fn cblas;
    dnnl_sgemm_fn dnnl;
    int split;
} lib_t;

typedef struct {
    const char *what;
    char ta, tb; /* 'N' / 'T' of the row-major operands */
    int M, N, K;
    float beta;
} shape_t;

static const shape_t SHAPES[] = {
    {"tiny qkv fwd", 'N', 'T', 2048, 768, 256, 0.0f},
    {"tiny qkv dinp", 'N', 'N', 2048, 256, 768, 1.0f},
    {"tiny qkv dW", 'T', 'N', 768, 256, 2048, 1.0f},
    {"tiny proj fwd", 'N', 'T', 2048, 256, 256, 0.0f},
    {"tiny fc fwd", 'N', 'T', 2048, 1024, 256, 0.0f},
    {"tiny fc dinp", 'N', 'N', 2048, 256, 1024, 1.0f},
    {"tiny fc dW", 'T', 'N', 1024, 256, 2048, 1.0f},
    {"tiny fcproj fwd", 'N', 'T', 2048, 256, 1024, 0.0f},
    {"tiny fcproj dinp", 'N', 'N', 2048, 1024, 256, 1.0f},
    {"tiny fcproj dW", 'T', 'N', 256, 1024, 2048, 1.0f},
    {"small qkv fwd", 'N', 'T', 1024, 2304, 768, 0.0f},
    {"small qkv dinp", 'N', 'N', 1024, 768, 2304, 1.0f},
    {"small qkv dW", 'T', 'N', 2304, 768, 1024, 1.0f},
    {"small proj fwd", 'N', 'T', 1024, 768, 768, 0.0f},
    {"small fc fwd", 'N', 'T', 1024, 3072, 768, 0.0f},
    {"small fc dinp", 'N', 'N', 1024, 768, 3072, 1.0f},
    {"small fc dW", 'T', 'N', 3072, 768, 1024, 1.0f},
    {"small fcproj fwd", 'N', 'T', 1024, 768, 3072, 0.0f},
    {"small fcproj dW", 'T', 'N', 768, 3072, 1024, 1.0f},
    {"small head fwd", 'N', 'T', 1024, 50257, 768, 0.0f},
    {"small head dinp", 'N', 'N', 1024, 768, 50257, 1.0f},
    {"small head dW", 'T', 'N', 50257, 768, 1024, 1.0f},
};
enum { NSHAPES = sizeof SHAPES / sizeof SHAPES[0] };

/* CPU time of the process: on a loaded machine a 1-thread GEMM's CPU time is its work, while
 * its wall time is mostly waiting for a core (OMP_NUM_THREADS > 1 then sums the threads) */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void gemm1(const lib_t *l, const shape_t *s, int M, int N, const float *a, int lda,
                  const float *b, int ldb, float *c) {
    if (l->dnnl)
        l->dnnl(s->ta, s->tb, M, N, s->K, 1.0f, a, lda, b, ldb, s->beta, c, s->N);
    else
        l->cblas(ROW_MAJOR, s->ta == 'N' ? NO_TRANS : TRANS, s->tb == 'N' ? NO_TRANS : TRANS,
                 M, N, s->K, 1.0f, a, lda, b, ldb, s->beta, c, s->N);
}

/* the whole product, or (l->split) one block of C per OpenMP thread, each a single-threaded
 * call inside the parallel region: rows of C when M >= N, else columns (16-aligned) */
static void gemm(const lib_t *l, const shape_t *s, const float *a, const float *b, float *c) {
    int lda = s->ta == 'N' ? s->K : s->M, ldb = s->tb == 'N' ? s->N : s->K;
    if (!l->split) {
        gemm1(l, s, s->M, s->N, a, lda, b, ldb, c);
        return;
    }
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int rows = s->M >= s->N, n = rows ? s->M : s->N;
        int per = ((n + nt - 1) / nt + 15) / 16 * 16, x0 = t * per;
        int x1 = x0 + per < n ? x0 + per : n;
        if (x0 < x1) {
            if (rows) /* rows x0..x1 of op(A) and C */
                gemm1(l, s, x1 - x0, s->N, a + (size_t)x0 * (s->ta == 'N' ? lda : 1), lda, b,
                      ldb, c + (size_t)x0 * s->N);
            else /* columns x0..x1 of op(B) and C */
                gemm1(l, s, s->M, x1 - x0, a, lda, b + (size_t)x0 * (s->tb == 'N' ? 1 : ldb),
                      ldb, c + x0);
        }
    }
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    int rounds = 5, nlib = 0;
    lib_t libs[MAX_LIBS];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
            continue;
        }
        char *eq = strchr(argv[i], '=');
        if (!eq || nlib == MAX_LIBS) {
            fprintf(stderr, "usage: %s [-r ROUNDS] NAME=LIB.so[:dnnl][:split] ...\n", argv[0]);
            return 2;
        }
        *eq = 0;
        char *path = eq + 1, *split = strstr(path, ":split");
        if (split) *split = 0;
        char *suffix = strstr(path, ":dnnl");
        int is_dnnl = suffix != NULL;
        if (suffix) *suffix = 0;
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        if (!h) {
            fprintf(stderr, "%s: %s\n", path, dlerror());
            return 1;
        }
        lib_t l = {argv[i], NULL, NULL, split != NULL};
        if (is_dnnl)
            l.dnnl = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm");
        else
            l.cblas = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
        if (!l.dnnl && !l.cblas) {
            fprintf(stderr, "%s: no %s\n", path, is_dnnl ? "dnnl_sgemm" : "cblas_sgemm");
            return 1;
        }
        /* one thread unless OMP_NUM_THREADS says otherwise (OpenMP builds follow it) */
        const char *nt = getenv("OMP_NUM_THREADS");
        int threads = nt ? atoi(nt) : 1;
        set_threads_fn f = (set_threads_fn)dlsym(h, "openblas_set_num_threads");
        if (f) f(threads);
        f = (set_threads_fn)dlsym(h, "bli_thread_set_num_threads");
        if (f) f(threads);
        libs[nlib++] = l;
    }
    if (nlib == 0 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "need at least one library and 1..%d rounds\n", MAX_ROUNDS);
        return 2;
    }
    printf("%-18s", "shape (M,N,K)");
    for (int l = 0; l < nlib; l++) printf(" %12s", libs[l].name);
    printf("   GFLOP/s, median of %d interleaved rounds; max rel diff vs %s\n", rounds,
           libs[0].name);
    double total[MAX_LIBS] = {0};
    for (int si = 0; si < NSHAPES; si++) {
        const shape_t *s = &SHAPES[si];
        size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
        float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float));
        float *c0 = malloc(nc * sizeof(float)), *c[MAX_LIBS];
        srand(1234);
        for (size_t i = 0; i < na; i++) a[i] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t i = 0; i < nb; i++) b[i] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t i = 0; i < nc; i++) c0[i] = (float)rand() / RAND_MAX - 0.5f;
        double flops = 2.0 * s->M * s->N * s->K;
        int reps = (int)(2e9 / flops) + 1; /* about 2 GFLOP (~20-50 ms) per timed batch */
        double g[MAX_LIBS][MAX_ROUNDS];
        for (int l = 0; l < nlib; l++) {
            c[l] = malloc(nc * sizeof(float));
            memcpy(c[l], c0, nc * sizeof(float));
            gemm(&libs[l], s, a, b, c[l]); /* warm-up; the result checked below */
        }
        for (int r = 0; r < rounds; r++)
            for (int l = 0; l < nlib; l++) {
                double t0 = now();
                for (int k = 0; k < reps; k++) gemm(&libs[l], s, a, b, c0);
                g[l][r] = flops * reps / (now() - t0) / 1e9;
            }
        double maxrel = 0;
        for (int l = 1; l < nlib; l++)
            for (size_t i = 0; i < nc; i++) {
                double d = fabs((double)c[l][i] - c[0][i]) / (fabs((double)c[0][i]) + 1e-3);
                if (d > maxrel) maxrel = d;
            }
        printf("%-18s", s->what);
        for (int l = 0; l < nlib; l++) {
            qsort(g[l], (size_t)rounds, sizeof(double), cmp_double);
            double med = g[l][rounds / 2];
            total[l] += flops / med;
            printf(" %12.1f", med);
        }
        printf("   (%d,%d,%d %c%c) %.1e\n", s->M, s->N, s->K, s->ta, s->tb, maxrel);
        fflush(stdout);
        for (int l = 0; l < nlib; l++) free(c[l]);
        free(a), free(b), free(c0);
    }
    printf("%-18s", "all (time-weighted)");
    double sumflops = 0;
    for (int si = 0; si < NSHAPES; si++)
        sumflops += 2.0 * SHAPES[si].M * SHAPES[si].N * SHAPES[si].K;
    for (int l = 0; l < nlib; l++) printf(" %12.1f", sumflops / total[l]);
    printf("\n");
    return 0;
}
