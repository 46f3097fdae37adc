/* loom signals (part of base): SIGINT and SIGTERM taken synchronously, on one thread.
 *
 * A signal handler runs on whichever thread the kernel picks, and in a training step or a
 * decode step that is usually one computing inside oneDNN's or OpenBLAS's GEMM: a handler
 * there, even one that only stores a flag, corrupted oneDNN's buffers (issue 30: SIGSEGV,
 * "corrupted size vs. prev_size"). So no computing thread ever takes these signals:
 * loom_signals_init, called first in main() while the process has one thread, blocks SIGINT
 * and SIGTERM in it, every thread started later (OpenMP, oneDNN, libmicrohttpd, curl, MPI's
 * progress threads) inherits the mask, and one signal thread takes them from a signalfd.
 *
 * What the signal thread does with one:
 *  - while a catcher is set (loom_signals_catch: the trainer, the server), it calls the
 *    catcher on the signal thread (an ordinary thread: it may lock, write, signal a condition);
 *    the caller turns that into a stop at its next safe point (the trainer: the step boundary);
 *  - otherwise the default action: the hook (loom_signals_set_hook; comm's, under MPI, ends the
 *    whole job), then the process ends by the signal itself (the shell's status 128 + N). A
 *    signal that was ignored when loom started (a background job's SIGINT) is ignored by the
 *    default action (a catcher still gets it, as the trainer's handler did before).
 * A library thread that unblocks these signals itself (none of those loom links does, as of
 * this writing) would take them in a forwarding handler that hands them to the signal thread.
 *
 * Process-wide by nature (dispositions and masks are), so these functions take no context.
 * Without loom_signals_init (a program embedding libloom) nothing is blocked and SIGINT and
 * SIGTERM keep their dispositions; loom_signals_catch then does nothing. */
#ifndef LOOM_SIGNALS_H
#define LOOM_SIGNALS_H

#include <signal.h>

#include "loom/base.h"

/* Blocks SIGINT and SIGTERM in the calling thread and starts the signal thread. Call once,
 * first in main(), before anything starts a thread. Returns 0, or -1 with err set. */
int loom_signals_init(loom_err *err);
/* 1 after loom_signals_init succeeded */
int loom_signals_active(void);

/* Sets (fn != NULL) or removes (fn == NULL) the catcher; fn(ctx, sig) runs on the signal
 * thread, once per signal, and must not call loom_signals_catch. When loom_signals_catch(NULL, NULL) returns, no call to the previous
 * catcher is running or will start, so its ctx may be freed. */
typedef void (*loom_signal_fn)(void *ctx, int sig);
void loom_signals_catch(loom_signal_fn fn, void *ctx);

/* The default action's hook: hook(sig, from_parent) runs on the signal thread before the
 * process ends by sig (from_parent: the sender is our parent process, e.g. the MPI launcher
 * tearing the job down). It may end the process itself. NULL removes it. */
void loom_signals_set_hook(void (*hook)(int sig, int from_parent));

/* The mask and dispositions a child process starts with: the mask loom started with, and
 * mask_out, dfl_out filled for posix_spawnattr_setsigmask / posix_spawnattr_setsigdefault
 * (POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF). loom_signals_child does the same in a
 * forked child before exec (async-signal-safe). Without them a validator or an alert command
 * would inherit blocked SIGINT/SIGTERM and outlive a kill. */
void loom_signals_child_sets(sigset_t *mask_out, sigset_t *dfl_out);
void loom_signals_child(void);

#endif
