/* Metric sinks beside metrics.jsonl (docs/observability.md, "Sinks"):
 *   a Prometheus text-format endpoint on 127.0.0.1 (obs.prometheus_port), served by a thread
 *   of its own, which renders the snapshot the trainer last published when a scrape comes;
 *   TensorBoard event files (obs.tensorboard): length-prefixed, masked-CRC32C records of
 *   hand-encoded Event protocol buffers, one scalar summary per value. */
#ifndef LOOM_OBS_SINKS_H
#define LOOM_OBS_SINKS_H

#include <stddef.h>
#include <stdint.h>
#include "loom/base.h"

/* ---- Prometheus ---------------------------------------------------------------------------- */
typedef struct loom_prom loom_prom;
/* Makes the exposition text of a published snapshot (data, len bytes: a private copy) into out.
 * Runs on the endpoint's thread, once per scrape. */
typedef void (*loom_prom_render_fn)(const void *data, size_t len, loom_sbuf *out);
/* Listens on 127.0.0.1:port (1..65535) and answers GET /metrics (and GET /) with
 * render(the last published snapshot) (render NULL: the snapshot is the text itself), 404
 * otherwise. what names the config key in errors. */
int loom_prom_start(int port, const char *what, loom_prom_render_fn render, loom_prom **out,
                    loom_err *err);
/* Replaces the snapshot served: a copy into a reused buffer under a mutex held only for the
 * copy (no formatting, no allocation after the first). */
void loom_prom_publish(loom_prom *p, const void *data, size_t len);
/* Stops the thread and closes the socket. */
void loom_prom_stop(loom_prom *p);

/* ---- TensorBoard ---------------------------------------------------------------------------- */
typedef struct loom_tb loom_tb;
/* Creates dir (and parents) and a new event file in it,
 * events.out.tfevents.<unix seconds>.<hostname>.<pid>, starting with the file_version event. */
int loom_tb_open(const char *dir, loom_tb **out, loom_err *err);
/* One Event (wall_time, step) with a scalar summary value (tag, value), into the file's 64 KiB
 * buffer: it reaches the file at loom_tb_flush or loom_tb_close (or when the buffer fills). */
int loom_tb_scalar(loom_tb *w, int64_t step, double wall_time, const char *tag, float value,
                   loom_err *err);
/* Makes the records written so far reach the file (fflush). */
int loom_tb_flush(loom_tb *w, loom_err *err);
void loom_tb_close(loom_tb *w);
/* CRC-32C (Castagnoli) of n bytes, and TensorFlow's masked form of a CRC (exposed for tests). */
uint32_t loom_crc32c(const void *data, size_t n);
uint32_t loom_crc32c_mask(uint32_t crc);

#endif
