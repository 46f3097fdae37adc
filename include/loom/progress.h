/* One progress line on stderr (part of base, beside logging: src/base/progress.c), shared by
 * train, data build and synth (docs/observability.md,
 * "Progress").
 *
 * When stderr is a terminal the line is redrawn in place ("\r", the text, then the rest of the
 * previous line blanked) at most every LOOM_PROGRESS_TTY_S seconds, and loom_progress_end
 * moves to the next line. Otherwise every drawn line is a plain line ending in "\n", drawn only
 * when the caller forces it or, with plain_every_s > 0, every plain_every_s seconds (the first
 * one plain_every_s after loom_progress_init). */
#ifndef LOOM_PROGRESS_H
#define LOOM_PROGRESS_H

#include <stddef.h>

#define LOOM_PROGRESS_TTY_S 0.25

typedef struct {
    int tty;              /* stderr is a terminal */
    double plain_every_s; /* not a terminal: seconds between unforced lines; <= 0: never */
    double t0;            /* loom_progress_init time */
    double last;          /* time of the last drawn line; < 0: none yet */
    int width;            /* characters of the line on screen (tty) */
} loom_progress;

void loom_progress_init(loom_progress *p, double plain_every_s);
/* 1 when loom_progress_show(p, 0, ...) would draw now */
int loom_progress_due(const loom_progress *p);
/* draws the line when force or due; returns 1 when it drew */
int loom_progress_show(loom_progress *p, int force, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* terminal: ends the updated line with "\n" (when one was drawn); plain: nothing */
void loom_progress_end(loom_progress *p);
/* "eta 12s" from done of total after elapsed seconds; "elapsed 3s" when total <= 0 or
 * nothing is done yet; longer times as 2m05s, 1h02m */
void loom_progress_eta(char *buf, size_t n, double elapsed, double done, double total);

#endif
