/* Communication on the device backend's buffers (loom_comm_set_device; docs/gpu.md
 * "Communication"): tests/mpi's collective checks (comm_driver: every collective of comm.h,
 * divisible and uneven counts, in place, non-blocking, alltoall(v), broadcast, point-to-point,
 * on every group of several layouts, buffers filled and read through mem_h2d / mem_d2h only,
 * outputs poisoned first) run by comm_driver_dev on this backend:
 *   1. a world of one without MPI: cuda with LOOM_COMM_NCCL_SOLO=1, so every collective runs
 *      through a 1-rank NCCL communicator (the wrappers of src/cuda/cu_nccl.cu: types, counts,
 *      in place, grouped sends and receives to itself); cuda-emu: the local copies (mem_d2d);
 *   2. two ranks on one GPU (LOOM_CUDA_SHARE_GPU=1): the host-staged path on real device
 *      buffers (cuda-emu: staged as always);
 *   3. cuda only, two ranks with NCCL between them: where two GPUs are visible, or one GPU and
 *      NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE=1); otherwise the test says it did not run
 *      (NCCL 2.28 refuses two ranks on one GPU) and which paths it did run.
 * Each run's exit status and its "collectives ok" and "path" lines are checked. Without mpirun
 * (a GPU image without MPI) only the first runs, and the test says so. */
#define _GNU_SOURCE
#include "cuda_harness.h"

#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_driver[PATH_MAX];

/* runs cmd (through sh, stderr with stdout); its output into out (truncated to cap) and
 * its exit status */
static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t at = 0;
    out[0] = 0;
    char line[1024];
    while (fgets(line, sizeof line, p)) {
        size_t n = strlen(line);
        if (at + n + 1 < cap) {
            memcpy(out + at, line, n + 1);
            at += n;
        }
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* one driver run: exit 0, `ok` printed by every rank, `path` the path of every rank */
static void check_run(const char *what, const char *env, int np, const char *args, const char *ok,
                      const char *path) {
    char cmd[2 * PATH_MAX], want[128];
    static char out[1 << 16];
    if (np > 0)
        snprintf(cmd, sizeof cmd, "%s timeout -k 5 120 mpirun -np %d --oversubscribe %s %s 2>&1",
                 env, np, g_driver, args);
    else
        snprintf(cmd, sizeof cmd, "%s timeout -k 5 120 %s %s 2>&1", env, g_driver, args);
    const int rc = run(cmd, out, sizeof out);
    const int ranks = np > 0 ? np : 1;
    snprintf(want, sizeof want, "%s buffers, path %s\n", cu_dev->name, path);
    cu_checks++;
    if (rc != 0 || count_of(out, ok) != ranks || count_of(out, want) != ranks) {
        cu_failures++;
        printf("FAIL %s: exit %d, want %d x '%s' and path %s; output:\n%s\n", what, rc, ranks, ok,
               path, out);
        return;
    }
    printf("ok   %s (%s path)\n", what, path);
}

int main(int argc, char **argv) {
    cu_setup(argc, argv);
    const int gpu = !strcmp(cu_dev->name, "cuda");
    /* comm_driver_dev sits beside this binary (tests/CMakeLists.txt) */
    ssize_t n = readlink("/proc/self/exe", g_driver, sizeof g_driver - 32);
    if (n <= 0) {
        printf("FAIL: /proc/self/exe unreadable\n");
        return 1;
    }
    g_driver[n] = 0;
    char *slash = strrchr(g_driver, '/');
    snprintf(slash + 1, sizeof g_driver - (size_t)(slash + 1 - g_driver), "comm_driver_dev");
    if (access(g_driver, X_OK)) {
        printf("FAIL: %s not built\n", g_driver);
        return 1;
    }
    char out[4096];
    const int have_mpirun = run("command -v mpirun", out, sizeof out) == 0;
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    unsetenv("LOOM_COMM_STAGE");
    char be[64], single[96];
    snprintf(be, sizeof be, "backend=%s", cu_dev->name);
    snprintf(single, sizeof single, "single %s", be);

    /* 1. one rank */
    check_run(gpu ? "world of one, every collective through a 1-rank NCCL communicator"
                  : "world of one, local copies on device buffers",
              "LOOM_COMM_NCCL_SOLO=1 LOOM_MPI=0", 0, single, "world of one ok without MPI",
              gpu ? "nccl" : "staged");
    if (!have_mpirun) {
        printf("NOTE mpirun not found: the two-rank checks (staged, NCCL) did not run\n");
        return cu_finish();
    }
    /* 2. two ranks sharing the GPU: staged */
    char args[128];
    snprintf(args, sizeof args, "coll %s", be);
    check_run("two ranks on one GPU, host-staged", "LOOM_CUDA_SHARE_GPU=1", 2, args,
              "collectives ok on 8 groups", "staged");
    /* 3. two ranks over NCCL */
    if (gpu) {
        const int rc = run("nvidia-smi -L 2>/dev/null | grep -c '^GPU'", out, sizeof out);
        const int ngpu = rc == 0 || rc == 1 ? atoi(out) : 0;
        if (ngpu >= 2) {
            check_run("two ranks, two GPUs, NCCL", "", 2, args, "collectives ok on 8 groups",
                      "nccl");
            if (ngpu >= 4) {
                snprintf(args, sizeof args, "coll %s tp=2", be);
                check_run("four ranks (dp 2 x tp 2), NCCL", "", 4, args,
                          "collectives ok on 8 groups", "nccl");
            }
        } else {
            /* NCCL >= 2.30 may share the GPU between ranks; older ones refuse, and the mesh
             * stages instead: either is right, the output says which ran */
            static char big[1 << 16];
            char cmd[2 * PATH_MAX];
            snprintf(cmd, sizeof cmd, "LOOM_CUDA_SHARE_GPU=1 NCCL_MULTI_RANK_GPU_ENABLE=1 "
                     "NCCL_NVLS_ENABLE=0 timeout -k 5 120 mpirun -np 2 --oversubscribe %s %s "
                     "2>&1", g_driver, args);
            const int r2 = run(cmd, big, sizeof big);
            cu_checks++;
            if (r2 != 0 || count_of(big, "collectives ok on 8 groups") != 2) {
                cu_failures++;
                printf("FAIL two ranks on one GPU with NCCL_MULTI_RANK_GPU_ENABLE=1: exit %d:\n%s\n",
                       r2, big);
            } else if (count_of(big, "path nccl\n") == 2) {
                printf("ok   two ranks on one GPU over NCCL (NCCL >= 2.30's multi-rank GPUs)\n");
            } else {
                printf("NOTE two-rank NCCL did not run: %d GPU visible and this NCCL refuses two "
                       "ranks on one GPU (before 2.30); ran 1-rank NCCL communicators and the "
                       "2-rank host-staged path instead\n", ngpu);
            }
        }
    }
    return cu_finish();
}
