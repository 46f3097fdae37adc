/* TensorBoard event files, written by hand: a file is a stream of records
 *   uint64 length (little-endian) | uint32 masked CRC-32C of the 8 length bytes |
 *   data (length bytes)          | uint32 masked CRC-32C of the data
 * whose data are serialized tensorflow.Event protocol buffers. The fields used:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
 * The first record is the Event with file_version "brain.Event:2". */
#define _GNU_SOURCE
#include "loom/obs_sinks.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct loom_tb {
    FILE *f;
    char *path;
    char buf[1 << 16]; /* the stream's buffer: records reach the file at loom_tb_flush/close */
};

/* ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), one table built on first use --- */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t loom_crc32c(const void *data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t loom_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- protocol buffer encoding ------------------------------------------------------------- */
typedef struct pbuf {
    unsigned char b[512];
    size_t n;
} pbuf;

static void put_byte(pbuf *p, unsigned v) {
    LOOM_CHECK(p->n < sizeof p->b);
    p->b[p->n++] = (unsigned char)v;
}

static void put_varint(pbuf *p, uint64_t v) {
    while (v >= 0x80) {
        put_byte(p, (unsigned)(v & 0x7F) | 0x80);
        v >>= 7;
    }
    put_byte(p, (unsigned)v);
}

static void put_le(pbuf *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) put_byte(p, (unsigned)(v >> (8 * i)) & 0xFF);
}

static void put_bytes(pbuf *p, int field, const void *data, size_t n) {
    put_varint(p, (uint64_t)field << 3 | 2);
    put_varint(p, n);
    LOOM_CHECK(p->n + n <= sizeof p->b);
    memcpy(p->b + p->n, data, n);
    p->n += n;
}

static void put_double(pbuf *p, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    put_varint(p, (uint64_t)field << 3 | 1);
    put_le(p, u, 8);
}

static void put_float(pbuf *p, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_varint(p, (uint64_t)field << 3 | 5);
    put_le(p, u, 4);
}

static int write_record(loom_tb *w, const pbuf *ev, loom_err *err) {
    unsigned char head[12], tail[4];
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)ev->n >> (8 * i));
    const uint32_t hc = loom_crc32c_mask(loom_crc32c(head, 8));
    const uint32_t dc = loom_crc32c_mask(loom_crc32c(ev->b, ev->n));
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(hc >> (8 * i));
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(dc >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(ev->b, 1, ev->n, w->f) != ev->n ||
        fwrite(tail, 1, 4, w->f) != 4)
        return loom_errf(err, "%s: write failed: %s", w->path, strerror(errno));
    return 0;
}

int loom_tb_open(const char *dir, loom_tb **out, loom_err *err) {
    *out = NULL;
    if (loom_mkdirs(dir, err)) return -1;
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    char path[4400];
    loom_pathf(path, sizeof path, "%s/events.out.tfevents.%lld.%s.%d", dir,
               (long long)time(NULL), host, (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return loom_errf(err, "%s: cannot create: %s", path, strerror(errno));
    loom_tb *w = loom_calloc(1, sizeof *w);
    w->f = f;
    w->path = loom_strdup(path);
    setvbuf(f, w->buf, _IOFBF, sizeof w->buf);
    pbuf ev = {.n = 0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    put_double(&ev, 1, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    put_bytes(&ev, 3, "brain.Event:2", 13);
    if (write_record(w, &ev, err) || loom_tb_flush(w, err)) {
        loom_tb_close(w);
        return -1;
    }
    *out = w;
    return 0;
}

int loom_tb_scalar(loom_tb *w, int64_t step, double wall_time, const char *tag, float value,
                   loom_err *err) {
    size_t tl = strlen(tag);
    if (tl > 200) tl = 200;
    pbuf val, sum, ev; /* not zeroed: only the first n bytes are used */
    val.n = sum.n = ev.n = 0;
    put_bytes(&val, 1, tag, tl);
    put_float(&val, 2, value);
    put_bytes(&sum, 1, val.b, val.n);
    put_double(&ev, 1, wall_time);
    put_varint(&ev, 2 << 3 | 0);
    put_varint(&ev, (uint64_t)step);
    put_bytes(&ev, 5, sum.b, sum.n);
    return write_record(w, &ev, err);
}

int loom_tb_flush(loom_tb *w, loom_err *err) {
    if (fflush(w->f) != 0) return loom_errf(err, "%s: write failed: %s", w->path, strerror(errno));
    return 0;
}

void loom_tb_close(loom_tb *w) {
    if (!w) return;
    fclose(w->f);
    free(w->path);
    free(w);
}
