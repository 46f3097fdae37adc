/* The shared progress line (include/loom/progress.h): part of base, beside logging, so data
 * build, synth and train draw it without depending on obs (docs/architecture.md). */
#include "loom/progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "loom/base.h"

void loom_progress_init(loom_progress *p, double plain_every_s) {
    p->tty = isatty(STDERR_FILENO);
    p->plain_every_s = plain_every_s;
    p->t0 = loom_now();
    p->last = -1;
    p->width = 0;
}

int loom_progress_due(const loom_progress *p) {
    if (p->tty) return p->last < 0 || loom_now() - p->last >= LOOM_PROGRESS_TTY_S;
    /* plain: the first unforced line too waits plain_every_s (quick runs print none) */
    return p->plain_every_s > 0 && loom_now() - (p->last < 0 ? p->t0 : p->last) >= p->plain_every_s;
}

int loom_progress_show(loom_progress *p, int force, const char *fmt, ...) {
    if (!force && !loom_progress_due(p)) return 0;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return 0;
    if (n >= (int)sizeof line) n = (int)sizeof line - 1;
    if (p->tty) {
        /* blank what the previous, longer line left on screen */
        fprintf(stderr, "\r%s%*s", line, p->width > n ? p->width - n : 0, "");
        p->width = n;
    } else {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
    p->last = loom_now();
    return 1;
}

void loom_progress_end(loom_progress *p) {
    if (p->tty && p->width > 0) {
        fputc('\n', stderr);
        fflush(stderr);
    }
    p->width = 0;
}

static void duration(char *buf, size_t n, double s) {
    if (!(s >= 0)) s = 0;
    const long long t = (long long)(s + 0.5);
    if (t < 60) snprintf(buf, n, "%llds", t);
    else if (t < 3600) snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
    else snprintf(buf, n, "%lldh%02lldm", t / 3600, t / 60 % 60);
}

void loom_progress_eta(char *buf, size_t n, double elapsed, double done, double total) {
    char d[32];
    if (total > 0 && done > 0) {
        const double left = total > done ? total - done : 0;
        duration(d, sizeof d, elapsed / done * left);
        snprintf(buf, n, "eta %s", d);
    } else {
        duration(d, sizeof d, elapsed);
        snprintf(buf, n, "elapsed %s", d);
    }
}
