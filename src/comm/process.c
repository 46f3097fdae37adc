/* comm process state: MPI start-up (only under a launcher), fatal hook, signal handlers,
 * job abort, threads per rank. The only process-wide state of the module (MPI itself is). */
#define _GNU_SOURCE
#include "comm_internal.h"
#include "loom/signals.h"

#include <errno.h>
#include <execinfo.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_inited;       /* loom_comm_init ran */
static int g_mpi;          /* MPI is up */
static int g_we_init_mpi;  /* we called MPI_Init_thread (so we finalize) */
static int g_rank, g_size = 1;

int comm_mpi_up(void) { return g_mpi; }
int loom_comm_mpi_active(void) { return g_mpi; }
int loom_comm_world_rank(void) { return g_rank; }
int loom_comm_world_size(void) { return g_size; }

static int env_int(const char *name, long *out) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

/* Did a launcher start us? (what loom_comm_init documents) */
static int launched_by_mpi(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                                 "PMI_FD", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

/* ---- fatal paths -------------------------------------------------------------------- */

static void comm_fatal_hook(const char *msg) {
    (void)msg; /* loom_panic printed it already */
    fprintf(stderr, "loom: rank %d: fatal error; ending the whole job\n", g_rank);
    fflush(stderr);
    if (g_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
}

/* async-signal-safe decimal formatting */
static size_t put_str(char *buf, size_t at, size_t cap, const char *s) {
    while (*s && at + 1 < cap) buf[at++] = *s++;
    return at;
}
static size_t put_int(char *buf, size_t at, size_t cap, long v) {
    char tmp[24];
    int n = 0;
    unsigned long u = v < 0 ? (unsigned long)-v : (unsigned long)v;
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u && n < 23);
    if (v < 0 && at + 1 < cap) buf[at++] = '-';
    while (n > 0 && at + 1 < cap) buf[at++] = tmp[--n];
    return at;
}

static const char *sig_name(int sig) {
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    case SIGTERM: return "SIGTERM";
    default: return "signal";
    }
}

/* Runs inside a signal handler: only write(), backtrace_symbols_fd() (warmed up at install so
 * that it does not allocate), sigaction(), alarm() and MPI_Abort, which is not async-signal-safe
 * but is the only way to end a job launched by srun; alarm(10) with SIGALRM's default action
 * bounds it if it hangs. */
static void on_fatal_signal(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    static volatile sig_atomic_t busy;
    if (busy) _exit(128 + sig);
    busy = 1;
    /* The launcher (our parent: orted, mpirun, slurmstepd) tearing the job down sends SIGTERM:
     * leave quietly, the job is ending already. */
    if (sig == SIGTERM && si && si->si_code == SI_USER && si->si_pid == getppid()) _exit(128 + sig);
    char buf[256];
    size_t n = 0;
    n = put_str(buf, n, sizeof buf, "loom: rank ");
    n = put_int(buf, n, sizeof buf, g_rank);
    n = put_str(buf, n, sizeof buf, ": fatal signal ");
    n = put_int(buf, n, sizeof buf, sig);
    n = put_str(buf, n, sizeof buf, " (");
    n = put_str(buf, n, sizeof buf, sig_name(sig));
    n = put_str(buf, n, sizeof buf, "); ending the whole job\n");
    ssize_t w = write(STDERR_FILENO, buf, n);
    (void)w;
    if (sig != SIGTERM) {
        void *frames[48];
        int nf = backtrace(frames, 48);
        backtrace_symbols_fd(frames, nf, STDERR_FILENO);
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGALRM, &dfl, NULL);
    alarm(10);
    if (g_mpi) MPI_Abort(MPI_COMM_WORLD, 128 + sig);
    sigaction(sig, &dfl, NULL);
    raise(sig);
    _exit(128 + sig);
}

/* SIGTERM / SIGINT that nothing catches (loom/signals.h: the signal thread's default action,
 * so an ordinary thread, not a handler): the launcher tearing the job down (our parent:
 * orted, mpirun, slurmstepd) gets a quiet exit, any other sender ends the whole job. MPI_Abort
 * off the main thread is outside MPI_THREAD_FUNNELED but is the only way to end a job launched
 * by srun; alarm(10) with SIGALRM's default action bounds it if it hangs. */
static void comm_signal_hook(int sig, int from_parent) {
    if (from_parent) _exit(128 + sig);
    fprintf(stderr, "loom: rank %d: signal %d (%s); ending the whole job\n", g_rank, sig,
            sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "signal");
    fflush(stderr);
    signal(SIGALRM, SIG_DFL);
    alarm(10);
    if (g_mpi) MPI_Abort(MPI_COMM_WORLD, 128 + sig);
}

/* Installs the handler for sig unless someone (a sanitizer) installed one before MPI did:
 * `before` is the disposition seen before MPI_Init. */
static void install_handler(int sig, const struct sigaction *before) {
    if (before && before->sa_handler != SIG_DFL) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

void loom_comm_abort(int code, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "loom: rank %d: %s\n", g_rank, msg);
    fflush(stderr);
    fflush(stdout);
    if (g_mpi) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
    exit(code ? code : 1);
}

void loom_comm_fail(const loom_err *err) {
    loom_comm_abort(1, "error: %s", err ? err->msg : "(no message)");
}

void loom_comm_fail_all(const loom_err *err) {
    if (g_rank != 0 && g_mpi) {
        struct timespec ts = {5, 0};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        if (g_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
        exit(1);
    }
    loom_comm_fail(err);
}

/* ---- a level agreed over the world -----------------------------------------------------
 * (the kernels' instruction-set level: src/parallel/start.c; comm knows nothing of kernels) */
int loom_comm_world_agree(int level, int ok, int *min, int *max, int *all_ok, loom_err *err) {
    int v[3] = {level, -level, ok ? 0 : -1}, r[3] = {level, -level, ok ? 0 : -1};
    if (g_mpi && MPI_Allreduce(v, r, 3, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        return loom_errf(err, "MPI_Allreduce failed");
    *min = r[0];
    *max = -r[1];
    *all_ok = r[2] == 0;
    return 0;
}

/* ---- init / finalize -------------------------------------------------------------------- */

int loom_comm_init(int *argc, char ***argv, loom_err *err) {
    if (g_inited) return 0;
    const char *force = getenv("LOOM_MPI");
    int want = launched_by_mpi();
    if (force && strcmp(force, "1") == 0) want = 1;
    if (force && strcmp(force, "0") == 0) want = 0;
    long step_tasks = 0;
    int under_srun = env_int("SLURM_STEP_NUM_TASKS", &step_tasks) && getenv("SLURM_PROCID");
    if (!want) {
        if (under_srun && step_tasks > 1 && !(force && strcmp(force, "0") == 0))
            return loom_errf(err, "srun started %ld tasks but no MPI process-management interface "
                                  "reached them: launch with `srun --mpi=pmix` (Open MPI) or "
                                  "`srun --mpi=pmi2` (MPICH)", step_tasks);
        g_inited = 1;
        g_rank = 0;
        g_size = 1;
        return 0;
    }
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
        /* dispositions before MPI: a sanitizer's SEGV handler is kept */
        static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGTERM};
        struct sigaction before[5];
        for (int i = 0; i < 5; i++) sigaction(sigs[i], NULL, &before[i]);
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return loom_errf(err, "MPI_Init_thread failed");
        g_we_init_mpi = 1;
        g_mpi = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_size);
        void *warm[4];
        (void)backtrace(warm, 4); /* loads libgcc now, not inside a handler */
        for (int i = 0; i < 5; i++) {
            if (sigs[i] == SIGTERM && loom_signals_active()) continue; /* the hook below */
            install_handler(sigs[i], sigs[i] == SIGABRT || sigs[i] == SIGTERM ? NULL : &before[i]);
        }
        if (loom_signals_active()) loom_signals_set_hook(comm_signal_hook);
    } else {
        g_mpi = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    }
    g_inited = 1;
    loom_set_fatal_hook(comm_fatal_hook);
    long ompi_size = 0;
    long expect = 0;
    if (under_srun && step_tasks > 1) expect = step_tasks;
    else if (env_int("OMPI_COMM_WORLD_SIZE", &ompi_size) && ompi_size > 1) expect = ompi_size;
    if (expect > 1 && g_size != expect) {
        loom_errf(err, "the launcher started %ld tasks but MPI sees a world of %d: each task is "
                       "running alone (under Slurm use `srun --mpi=pmix` for Open MPI, "
                       "`--mpi=pmi2` for MPICH)", expect, g_size);
        return -1;
    }
    return 0;
}

void loom_comm_finalize(void) {
    if (g_mpi && g_we_init_mpi) {
        loom_set_fatal_hook(NULL);
        loom_signals_set_hook(NULL);
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
        g_mpi = 0;
    }
    g_inited = 0;
}

int loom_comm_mpi_initialized(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

/* ---- threads per rank ------------------------------------------------------------------ */

int loom_comm_node_ranks(void) {
    int local = 1;
    if (g_mpi) {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    return local;
}

int loom_comm_default_threads(void) {
    long node_cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (node_cpus < 1) node_cpus = 1;
    long mask_cpus = node_cpus;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) mask_cpus = CPU_COUNT(&set);
    const int local = loom_comm_node_ranks();
    long omp = 0;
    if (env_int("OMP_NUM_THREADS", &omp) && omp > 0) return omp > 4096 ? 4096 : (int)omp;
    long t = node_cpus / local;
    if (mask_cpus < t) t = mask_cpus;
    long per_task = 0;
    if (env_int("SLURM_CPUS_PER_TASK", &per_task) && per_task > 0 && per_task < t) t = per_task;
    return t < 1 ? 1 : (int)t;
}
