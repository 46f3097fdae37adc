/* SIGINT and SIGTERM taken on one signal thread, never on a computing one (loom/signals.h). */
#define _GNU_SOURCE
#include "loom/signals.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

static int g_active;
static sigset_t g_startup_mask;      /* the mask main() started with: children get it back */
static int g_ign_int, g_ign_term;    /* ignored when loom started */
static int g_ign_pipe;
static int g_sfd = -1;               /* signalfd of SIGINT + SIGTERM */
static int g_fwd[2] = {-1, -1};      /* the forwarding handler writes, the signal thread reads */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* the catcher, the hook */
static loom_signal_fn g_fn;
static void *g_ctx;
static void (*g_hook)(int sig, int from_parent);

int loom_signals_active(void) { return g_active; }

/* A thread that unblocked the signals itself takes them here: hand them on. */
static void on_forward(int sig) {
    const unsigned char b = (unsigned char)sig;
    const int saved = errno;
    if (write(g_fwd[1], &b, 1) < 0) {} /* async-signal-safe; full pipe: one is pending anyway */
    errno = saved;
}

/* the default action: the process ends by sig, as if it had never been blocked */
static void die_by(int sig) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    _exit(128 + sig);
}

static void deliver(int sig, int from_parent) {
    pthread_mutex_lock(&g_mu);
    if (g_fn) {
        g_fn(g_ctx, sig); /* under g_mu: loom_signals_catch(NULL) waits for it */
        pthread_mutex_unlock(&g_mu);
        return;
    }
    void (*hook)(int, int) = g_hook;
    pthread_mutex_unlock(&g_mu);
    if ((sig == SIGINT && g_ign_int) || (sig == SIGTERM && g_ign_term)) return;
    if (hook) hook(sig, from_parent);
    die_by(sig);
}

static void *signal_main(void *arg) {
    (void)arg;
    for (;;) {
        struct pollfd p[2] = {{g_sfd, POLLIN, 0}, {g_fwd[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0) continue; /* EINTR */
        int sig = 0, from_parent = 0;
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(g_sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                sig = (int)si.ssi_signo;
                from_parent = si.ssi_code == SI_USER && (pid_t)si.ssi_pid == getppid();
            }
        } else if (p[1].revents & POLLIN) {
            unsigned char b = 0;
            if (read(g_fwd[0], &b, 1) == 1) sig = b;
        }
        if (sig == SIGINT || sig == SIGTERM) deliver(sig, from_parent);
    }
    return NULL;
}

static int was_ignored(int sig) {
    struct sigaction old;
    return sigaction(sig, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
           old.sa_handler == SIG_IGN;
}

int loom_signals_init(loom_err *err) {
    if (g_active) return 0;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, &g_startup_mask))
        return loom_errf(err, "signals: cannot block SIGINT and SIGTERM");
    g_ign_int = was_ignored(SIGINT);
    g_ign_term = was_ignored(SIGTERM);
    g_ign_pipe = was_ignored(SIGPIPE);
    g_sfd = signalfd(-1, &set, SFD_CLOEXEC);
    if (g_sfd < 0) {
        const int e = errno;
        pthread_sigmask(SIG_SETMASK, &g_startup_mask, NULL);
        return loom_errf(err, "signals: signalfd: %s", strerror(e));
    }
    if (pipe2(g_fwd, O_CLOEXEC) || fcntl(g_fwd[1], F_SETFL, O_NONBLOCK)) {
        const int e = errno;
        close(g_sfd);
        pthread_sigmask(SIG_SETMASK, &g_startup_mask, NULL);
        return loom_errf(err, "signals: pipe: %s", strerror(e));
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_forward;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    const int rc = pthread_create(&th, &attr, signal_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc) {
        close(g_sfd), close(g_fwd[0]), close(g_fwd[1]);
        g_sfd = g_fwd[0] = g_fwd[1] = -1;
        pthread_sigmask(SIG_SETMASK, &g_startup_mask, NULL);
        return loom_errf(err, "signals: cannot start the signal thread: %s", strerror(rc));
    }
    /* after the thread exists: a forwarded signal always has a reader. An ignored one stays
     * ignored (children inherit that); blocked, it still reaches the signalfd. */
    if (!g_ign_int) sigaction(SIGINT, &sa, NULL);
    if (!g_ign_term) sigaction(SIGTERM, &sa, NULL);
    g_active = 1;
    return 0;
}

void loom_signals_catch(loom_signal_fn fn, void *ctx) {
    pthread_mutex_lock(&g_mu);
    g_fn = fn;
    g_ctx = fn ? ctx : NULL;
    pthread_mutex_unlock(&g_mu);
}

void loom_signals_set_hook(void (*hook)(int sig, int from_parent)) {
    pthread_mutex_lock(&g_mu);
    g_hook = hook;
    pthread_mutex_unlock(&g_mu);
}

void loom_signals_child_sets(sigset_t *mask_out, sigset_t *dfl_out) {
    sigemptyset(dfl_out);
    if (!g_active) {
        pthread_sigmask(SIG_SETMASK, NULL, mask_out);
        return;
    }
    *mask_out = g_startup_mask;
    if (!g_ign_int) sigaddset(dfl_out, SIGINT);
    if (!g_ign_term) sigaddset(dfl_out, SIGTERM);
    if (!g_ign_pipe) sigaddset(dfl_out, SIGPIPE);
}

void loom_signals_child(void) {
    if (!g_active) return;
    sigset_t mask, dfl;
    loom_signals_child_sets(&mask, &dfl);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    static const int sigs[] = {SIGINT, SIGTERM, SIGPIPE};
    for (int i = 0; i < 3; i++)
        if (sigismember(&dfl, sigs[i])) sigaction(sigs[i], &sa, NULL);
    sigprocmask(SIG_SETMASK, &mask, NULL);
}
