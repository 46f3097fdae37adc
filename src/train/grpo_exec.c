/* External programs of GRPO (docs/finetune.md "GRPO"): a `command` reward and a tool
 * environment's command run with a text on stdin; their stdout is captured (up to a limit),
 * stderr passed through, a timeout kills them. (synth's command validators have the same
 * contract for their exit status; they keep only stderr, so this is a separate small runner.) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/signals.h"
#include "train/train_grpo.h"

enum { OUT_MAX = 1 << 16 };

int grpo_exec(char *const *argv, const char *const *env_add, const char *in, size_t len,
              double timeout_s, loom_sbuf *out, int *status_out, loom_err *err) {
    int pin[2], pout[2];
    if (pipe2(pin, O_CLOEXEC)) return loom_errf(err, "cannot create a pipe: %s", strerror(errno));
    if (pipe2(pout, O_CLOEXEC)) {
        close(pin[0]), close(pin[1]);
        return loom_errf(err, "cannot create a pipe: %s", strerror(errno));
    }
    const pid_t pid = fork();
    if (pid < 0) {
        close(pin[0]), close(pin[1]), close(pout[0]), close(pout[1]);
        return loom_errf(err, "cannot fork: %s", strerror(errno));
    }
    if (pid == 0) {
        loom_signals_child();
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        close(pin[0]), close(pin[1]), close(pout[0]), close(pout[1]);
        for (int i = 0; env_add && env_add[i]; i += 2) setenv(env_add[i], env_add[i + 1], 1);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    fcntl(pin[1], F_SETFL, O_NONBLOCK);
    fcntl(pout[0], F_SETFL, O_NONBLOCK);
    size_t sent = 0;
    int in_open = 1, out_open = 1, timed_out = 0;
    if (len == 0) close(pin[1]), in_open = 0;
    const double t0 = loom_now();
    while (out_open) {
        struct pollfd p[2] = {{pout[0], POLLIN, 0}, {in_open ? pin[1] : -1, POLLOUT, 0}};
        const double left = timeout_s - (loom_now() - t0);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        if (poll(p, 2, (int)(left * 1000) + 1) < 0 && errno != EINTR) break;
        if (in_open && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            const ssize_t w = write(pin[1], in + sent, len - sent);
            if (w > 0) sent += (size_t)w;
            if (w < 0 && errno != EAGAIN) sent = len;
            if (sent == len) close(pin[1]), in_open = 0;
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            char tmp[4096];
            const ssize_t r = read(pout[0], tmp, sizeof tmp);
            if (r <= 0) out_open = 0;
            else if (out->len < OUT_MAX)
                loom_sbuf_append(out, tmp, out->len + (size_t)r > OUT_MAX ? OUT_MAX - out->len
                                                                           : (size_t)r);
        }
    }
    if (in_open) close(pin[1]);
    close(pout[0]);
    int status = 0;
    if (timed_out) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    if (!out->p) loom_sbuf_append(out, "", 0);
    if (timed_out) return loom_errf(err, "%s timed out after %g s", argv[0], timeout_s);
    *status_out = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return 0;
}
