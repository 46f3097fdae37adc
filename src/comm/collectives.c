/* Checked collectives: every collective is started non-blocking and completed by polling
 * MPI_Testall with backoff, so that a wait longer than the mesh's timeout can end the job with
 * a message naming the collective and the ranks that have not entered it (read from the
 * progress window, see mesh.c). Per-kind accounting of calls, ring bytes and time.
 *
 * Three paths to the buffers (loom_comm_set_device, device.c): direct (MPI on the buffers,
 * inside the backend's window), staged (MPI on a host bounce buffer the request keeps: the
 * device send buffer copied in at the start, the result copied back at completion) and NCCL
 * (enqueued on the backend's stream, completion seen through an event; point-to-point staged).
 * On a group of one every path is a local copy (the backend's mem_d2d off the direct path). */
#define _GNU_SOURCE
#include "comm_internal.h"
#include "loom/backend.h"
#ifdef LOOM_HAVE_CUDA
#include "comm_nccl.h"
#endif

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* MPI counts are int: bigger buffers go in chunks of this many elements */
#define CHUNK ((size_t)1 << 30)

struct loom_comm_req {
    loom_mesh *m;
    loom_group g;
    loom_coll_kind kind;
    int64_t seq;
    double t0, bytes;
    int n;
    MPI_Request *reqs; /* (n) */
    int *counts, *displs; /* (group size) for the v-variants; live until completion */
    /* capacities of the arrays above, kept when the record goes back to the pool */
    int reqs_cap, table_cap;
    MPI_Request *own_reqs; /* the record's reqs array */
    struct loom_comm_req *next_free;
    /* point-to-point on a local group: waiting for its match (in m->local_sends/recvs) */
    int local_pending, local_tag;
    void *local_buf;      /* send: the data (const), recv: where it goes */
    size_t local_bytes;
    struct loom_comm_req *local_next;
    /* staged path: the mesh's bounce buffer lent to it (index; -1: none) and the copy of the
     * result back to the device at completion (back_bytes 0: none) */
    int stage;
    void *back_dst;
    const void *back_src;
    size_t back_bytes;
    /* NCCL path: the communicator it was enqueued on, its completion event (kept with the
     * record), 1 until the event has been seen complete */
    struct loom_nccl *nccl;
    void *event;
    int nccl_pending;
};

static const char *kind_names[LOOM_COLL_KIND_COUNT] = {
    "allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "barrier", "p2p"};

const char *loom_coll_kind_name(loom_coll_kind k) {
    return k >= 0 && k < LOOM_COLL_KIND_COUNT ? kind_names[k] : "?";
}

size_t loom_dtype_size(loom_dtype t) {
    switch (t) {
    case LOOM_F32: return 4;
    case LOOM_F64: return 8;
    case LOOM_I32: return 4;
    case LOOM_I64: return 8;
    case LOOM_U8: return 1;
    case LOOM_BF16: return 2;
    }
    LOOM_CHECK(0);
    return 0;
}

static MPI_Datatype mpi_type(loom_dtype t) {
    switch (t) {
    case LOOM_F32: return MPI_FLOAT;
    case LOOM_F64: return MPI_DOUBLE;
    case LOOM_I32: return MPI_INT32_T;
    case LOOM_I64: return MPI_INT64_T;
    case LOOM_U8: return MPI_UINT8_T;
    case LOOM_BF16: return MPI_UINT16_T; /* moved as bits, never reduced */
    }
    LOOM_CHECK(0);
    return MPI_DATATYPE_NULL;
}

void loom_split(size_t n, int size, int i, size_t *off, size_t *len) {
    LOOM_CHECK(size >= 1 && i >= 0 && i < size);
    size_t base = n / (size_t)size, extra = n % (size_t)size, ui = (size_t)i;
    *off = ui * base + (ui < extra ? ui : extra);
    *len = base + (ui < extra ? 1 : 0);
}

/* ---- progress + accounting ------------------------------------------------------------ */

/* Device buffers (loom_comm_set_device_window): the backend's window is open from a request's
 * start to its end (req_new .. req_done), since MPI may progress any pending transfer inside
 * any of its calls, this rank's other requests' included; requests nest (the backend counts). */
static void win_open(const loom_mesh *m) {
    if (m->win_begin) m->win_begin();
}
static void win_close(const loom_mesh *m) {
    if (m->win_end) m->win_end();
}

void loom_comm_set_device_window(loom_mesh *m, void (*begin)(void), void (*end)(void)) {
    m->win_begin = begin;
    m->win_end = end;
}

static void publish(loom_mesh *m, loom_group g, loom_coll_kind k, int64_t seq, int done) {
    int64_t *p = m->progress;
    if (!done) {
        __atomic_store_n(&p[g], seq, __ATOMIC_RELEASE);
        __atomic_store_n(&p[PROG_LAST_GROUP], (int64_t)g, __ATOMIC_RELEASE);
        __atomic_store_n(&p[PROG_LAST_KIND], (int64_t)k, __ATOMIC_RELEASE);
        __atomic_store_n(&p[PROG_LAST_SEQ], seq, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&p[PROG_DONE], (int64_t)done, __ATOMIC_RELEASE);
    if (m->win_ok) MPI_Win_sync(m->win);
}

static loom_comm_req *req_new(loom_mesh *m, loom_group g, loom_coll_kind k, double bytes,
                              int nreq) {
    LOOM_CHECK(m && g >= 0 && g < LOOM_GROUP_COUNT);
    win_open(m); /* closed by req_done */
    loom_comm_req *r = m->free_reqs;
    if (r) m->free_reqs = r->next_free;
    else r = loom_calloc(1, sizeof *r);
    if (r->reqs_cap < (nreq > 0 ? nreq : 1)) {
        free(r->own_reqs);
        r->reqs_cap = nreq > 0 ? nreq : 1;
        r->own_reqs = loom_calloc((size_t)r->reqs_cap, sizeof(MPI_Request));
    }
    r->reqs = r->own_reqs;
    r->next_free = NULL;
    r->local_pending = 0;
    r->local_next = NULL;
    r->back_bytes = 0;
    r->stage = -1;
    r->nccl = NULL;
    r->nccl_pending = 0;
    r->m = m;
    r->g = g;
    r->kind = k;
    r->seq = k == LOOM_COLL_P2P ? m->g[g].seq : ++m->g[g].seq;
    r->t0 = loom_now();
    r->bytes = m->g[g].size > 1 ? bytes : 0;
    r->n = nreq;
    for (int i = 0; i < nreq; i++) r->reqs[i] = MPI_REQUEST_NULL;
    m->stats.calls[k]++;
    m->stats.bytes[k] += r->bytes;
    if (k != LOOM_COLL_P2P) publish(m, g, k, r->seq, 0);
    return r;
}

static void req_done(loom_comm_req *r, double waited) {
    loom_mesh *m = r->m;
    if (r->back_bytes) m->be->mem_h2d(r->back_dst, r->back_src, r->back_bytes);
    r->back_bytes = 0;
    if (r->stage >= 0) m->bounces[r->stage].busy = 0;
    r->stage = -1;
    const double t1 = loom_now();
    m->stats.time_s[r->kind] += t1 - r->t0;
    if (m->observer) m->observer(m->observer_ctx, r->kind, r->g, r->bytes, r->t0, t1, waited);
    m->stats.wait_s[r->kind] += waited;
    if (r->kind != LOOM_COLL_P2P) publish(m, r->g, r->kind, r->seq, 1);
    r->next_free = m->free_reqs;
    m->free_reqs = r;
    win_close(m);
}

void comm_free_request_pool(loom_mesh *m) {
    /* local point-to-point requests never matched (a program error, as in MPI): dropped */
    loom_comm_req **lists[2] = {&m->local_sends, &m->local_recvs};
    for (int k = 0; k < 2; k++)
        while (*lists[k]) {
            loom_comm_req *r = *lists[k];
            *lists[k] = r->local_next;
            r->next_free = m->free_reqs;
            m->free_reqs = r;
        }
    for (int i = 0; i < m->nbounces; i++) free(m->bounces[i].p);
    free(m->bounces);
    m->bounces = NULL;
    m->nbounces = 0;
    while (m->free_reqs) {
        loom_comm_req *r = m->free_reqs;
        m->free_reqs = r->next_free;
        free(r->own_reqs);
        free(r->counts);
        free(r->displs);
#ifdef LOOM_HAVE_CUDA
        loom_nccl_event_free(r->event);
#endif
        free(r);
    }
}

/* ---- the timeout report --------------------------------------------------------------- */

/* Reads the progress slots of the group's members into slots (size * PROG_SLOTS); ok[i] = 1
 * where the read completed within a few seconds (a read never blocks us for longer). */
static void read_progress(loom_mesh *m, const comm_group *cg, int64_t *slots, int *ok) {
    int n = cg->size;
    MPI_Request *rq = loom_calloc((size_t)n, sizeof *rq);
    for (int i = 0; i < n; i++) {
        ok[i] = 0;
        rq[i] = MPI_REQUEST_NULL;
        MPI_Rget(slots + (size_t)i * PROG_SLOTS, PROG_SLOTS, MPI_INT64_T, cg->members[i], 0,
                 PROG_SLOTS, MPI_INT64_T, m->win, &rq[i]);
    }
    double t_end = loom_now() + 5.0;
    int left = n;
    while (left > 0 && loom_now() < t_end) {
        for (int i = 0; i < n; i++) {
            if (ok[i]) continue;
            int flag = 0;
            MPI_Test(&rq[i], &flag, MPI_STATUS_IGNORE);
            if (flag) { ok[i] = 1; left--; }
        }
        if (left > 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    free(rq); /* requests still pending are abandoned: the job is about to be aborted */
}

static void append(char *buf, size_t cap, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *at, const char *fmt, ...) {
    if (*at >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, cap - *at, fmt, ap);
    va_end(ap);
    if (n > 0) *at = *at + (size_t)n < cap ? *at + (size_t)n : cap;
}

static void describe_slot(char *buf, size_t cap, size_t *at, const int64_t *s) {
    int64_t g = s[PROG_LAST_GROUP], k = s[PROG_LAST_KIND], q = s[PROG_LAST_SEQ];
    if (q <= 0) { append(buf, cap, at, "no collective yet"); return; }
    append(buf, cap, at, "%s %s #%lld on %s", s[PROG_DONE] ? "finished" : "inside",
           loom_coll_kind_name((loom_coll_kind)k), (long long)q, loom_group_name((loom_group)g));
}

static void timeout_abort(loom_comm_req *r, const char *what) {
    loom_mesh *m = r->m;
    const comm_group *cg = &m->g[r->g];
    char head[256];
    if (what)
        snprintf(head, sizeof head, "%s (%s) on %s (%d ranks)", what,
                 loom_coll_kind_name(r->kind), loom_group_name(r->g), cg->size);
    else
        snprintf(head, sizeof head, "%s #%lld on %s (%d ranks)", loom_coll_kind_name(r->kind),
                 (long long)r->seq, loom_group_name(r->g), cg->size);
    char msg[4096];
    size_t at = 0;
    append(msg, sizeof msg, &at, "%s did not complete within %g s", head, m->spec.timeout_s);
    char detail[4096];
    size_t dat = 0;
    if (cg->comm == MPI_COMM_NULL) {
        append(msg, sizeof msg, &at, "; its matching send or receive was never posted (a "
                                     "local group: both ends are this process)");
    } else if (m->win_ok) {
        int64_t *slots = loom_calloc((size_t)cg->size * PROG_SLOTS, sizeof(int64_t));
        int *ok = loom_calloc((size_t)cg->size, sizeof(int));
        read_progress(m, cg, slots, ok);
        int nmiss = 0;
        for (int i = 0; i < cg->size; i++) {
            const int64_t *s = slots + (size_t)i * PROG_SLOTS;
            int w = cg->members[i];
            if (w == m->world_rank) continue;
            /* p2p: no sequence to compare, so every other member's activity is shown */
            int missing = r->kind == LOOM_COLL_P2P || !ok[i] || s[r->g] < r->seq;
            if (!missing) continue;
            if (r->kind != LOOM_COLL_P2P) {
                append(msg, sizeof msg, &at, "%s%d", nmiss ? ", " : "; ranks still missing: ", w);
                nmiss++;
            }
            append(detail, sizeof detail, &dat, "\nloom: rank %d:   rank %d: ", m->world_rank, w);
            if (ok[i]) describe_slot(detail, sizeof detail, &dat, s);
            else append(detail, sizeof detail, &dat, "not responding (its progress could not be read)");
        }
        if (r->kind != LOOM_COLL_P2P && nmiss == 0)
            append(msg, sizeof msg, &at, "; every rank of the group entered it (a rank may have "
                                         "died inside it, or the network stalled)");
        free(slots);
        free(ok);
    } else {
        append(msg, sizeof msg, &at, "; ranks still missing: unknown (this MPI's windows use the "
                                     "separate memory model)");
    }
#ifdef LOOM_HAVE_CUDA
    if (r->nccl) loom_nccl_abort(r->nccl); /* its kernels may be spinning on the device */
#endif
    loom_comm_abort(75, "%s%s", msg, dat ? detail : "");
}

#ifdef LOOM_HAVE_CUDA
/* an NCCL or CUDA error on a request's communicator ends the job (as an MPI error does) */
static void nccl_die(loom_comm_req *r, const char *why) __attribute__((noreturn));
static void nccl_die(loom_comm_req *r, const char *why) {
    const comm_group *cg = &r->m->g[r->g];
    if (r->nccl) loom_nccl_abort(r->nccl);
    loom_comm_abort(76, "NCCL %s #%lld on %s (%d ranks) failed: %s", loom_coll_kind_name(r->kind),
                    (long long)r->seq, loom_group_name(r->g), cg->size, why);
}
#endif

/* Polls until every request completes: busy for ~100 tests, then sleeps growing from 1 us to
 * 1 ms between tests. Past the timeout (counted from entering the wait) the job ends. */
static int req_ready(loom_comm_req *r) {
    if (r->local_pending) return 0;
#ifdef LOOM_HAVE_CUDA
    if (r->nccl_pending) {
        char why[512];
        const int done = loom_nccl_event_done(r->event, why, sizeof why);
        if (done < 0) nccl_die(r, why);
        if (!done) {
            /* still running: an asynchronous NCCL error (a peer gone, a network failure)
             * ends the job here rather than at the timeout */
            if (loom_nccl_state(r->nccl, why, sizeof why) < 0) nccl_die(r, why);
            return 0;
        }
        r->nccl_pending = 0;
    }
#endif
    int flag = 1;
    if (r->n > 0) MPI_Testall(r->n, r->reqs, &flag, MPI_STATUSES_IGNORE);
    return flag;
}

static void wait_checked(loom_comm_req *r, const char *what) {
    double t_in = loom_now();
    if (r->n > 0 || r->local_pending || r->nccl_pending) {
        double deadline = t_in + r->m->spec.timeout_s;
        long sleep_ns = 0;
        int spins = 0;
        for (;;) {
            if (req_ready(r)) break;
            if (++spins < 100) continue;
            if (loom_now() > deadline) timeout_abort(r, what);
            sleep_ns = sleep_ns ? sleep_ns * 2 : 1000;
            if (sleep_ns > 1000000) sleep_ns = 1000000;
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
        }
    }
    req_done(r, loom_now() - t_in);
}

void loom_comm_wait(loom_comm_req *r) {
    if (r) wait_checked(r, NULL);
}

int loom_comm_test(loom_comm_req *r) {
    LOOM_CHECK(r);
    const int flag = req_ready(r);
    if (flag) req_done(r, 0);
    return flag;
}

void loom_comm_waitall(int n, loom_comm_req **reqs, const char *what) {
    for (int i = 0; i < n; i++)
        if (reqs[i]) wait_checked(reqs[i], what ? what : "point-to-point");
}

/* ---- the collectives -------------------------------------------------------------------- */

static const comm_group *group_of(loom_mesh *m, loom_group g) {
    LOOM_CHECK(m && g >= 0 && g < LOOM_GROUP_COUNT);
    return &m->g[g];
}

static int as_count(size_t n, const char *what) {
    if (n > (size_t)INT_MAX)
        loom_panic(__FILE__, __LINE__, "%s: %zu elements per rank exceed MPI's int counts; "
                   "split the buffer", what, n);
    return (int)n;
}

/* ---- the buffers' paths ---- */

/* the MPI calls of a group of several ranks go through host bounce buffers */
static int staged(const loom_mesh *m, const comm_group *cg) {
    return m->path != PATH_DIRECT && !cg->nccl;
}

/* a local copy of n bytes between a collective's buffers (a group of one) */
static void dev_copy(const loom_mesh *m, void *dst, const void *src, size_t n) {
    if (!n || dst == src) return;
    if (m->path == PATH_DIRECT) {
        memmove(dst, src, n);
        return;
    }
    const char *d = dst, *s = src;
    LOOM_CHECK(d + n <= s || s + n <= d); /* mem_d2d's buffers do not overlap */
    m->be->mem_d2d(dst, src, n);
}

/* a host bounce buffer of at least n bytes lent to r until it completes: the smallest free
 * one of the mesh's that fits, else the largest free one grown, else a new one. The same
 * sequence of collectives every step gets the same buffers, so after the first step staging
 * allocates nothing. */
static char *bounce(loom_comm_req *r, size_t n) {
    loom_mesh *m = r->m;
    LOOM_CHECK(r->stage < 0);
    if (!n) n = 1;
    int fit = -1, big = -1;
    for (int i = 0; i < m->nbounces; i++) {
        const comm_bounce *b = &m->bounces[i];
        if (b->busy) continue;
        if (b->cap >= n && (fit < 0 || b->cap < m->bounces[fit].cap)) fit = i;
        if (big < 0 || b->cap > m->bounces[big].cap) big = i;
    }
    if (fit < 0 && big >= 0) {
        comm_bounce *b = &m->bounces[big];
        free(b->p);
        b->p = loom_malloc(n);
        b->cap = n;
        fit = big;
    }
    if (fit < 0) {
        m->bounces = loom_realloc(m->bounces, (size_t)(m->nbounces + 1) * sizeof *m->bounces);
        m->bounces[m->nbounces] = (comm_bounce){loom_malloc(n), n, 0};
        fit = m->nbounces++;
    }
    m->bounces[fit].busy = 1;
    r->stage = fit;
    return m->bounces[fit].p;
}

/* device -> bounce now; bounce -> device when the request completes */
static void stage_in(const loom_mesh *m, void *host, const void *dev, size_t n) {
    if (n) loom_dev_read(m->be, host, dev, n, "staged collective");
}
static void stage_back(loom_comm_req *r, void *dev, const void *host, size_t n) {
    r->back_dst = dev;
    r->back_src = host;
    r->back_bytes = n;
}

/* The buffers MPI runs on for a collective from send (sbytes) into recv (rbytes): the caller's,
 * or, staged, one bounce buffer holding the send bytes and then taking the received ones, which
 * go back to recv when the request completes. */
static void stage_pair(const loom_mesh *m, const comm_group *cg, loom_comm_req *r,
                       const void *send, size_t sbytes, void *recv, size_t rbytes,
                       const void **msend, void **mrecv) {
    *msend = send;
    *mrecv = recv;
    if (!staged(m, cg)) return;
    char *b = bounce(r, sbytes + rbytes);
    stage_in(m, b, send, sbytes);
    *msend = b;
    *mrecv = b + sbytes;
    stage_back(r, recv, *mrecv, rbytes);
}

#ifdef LOOM_HAVE_CUDA
/* an enqueue on the NCCL path: failure ends the job; after the request's last enqueue its
 * event is recorded (nccl_end) and the waits poll it */
static void nccl_ok(loom_comm_req *r, int rc, const char *why) {
    if (rc) nccl_die(r, why);
}
static void nccl_end(loom_comm_req *r, loom_nccl *c) {
    char why[512];
    r->nccl = c;
    if (!r->event) r->event = loom_nccl_event_new();
    nccl_ok(r, loom_nccl_event_record(r->event, why, sizeof why), why);
    r->nccl_pending = 1;
}
#define NCCL_WHY char why[512]; const size_t nwhy = sizeof why
#endif

static loom_comm_req *start_allreduce(loom_mesh *m, loom_group g, void *buf, size_t count,
                                      loom_dtype t, MPI_Op op) {
    LOOM_CHECK(t != LOOM_BF16); /* moved only: bf16 sums are taken in fp32 */
    const comm_group *cg = group_of(m, g);
    size_t es = loom_dtype_size(t);
    int N = cg->size;
#ifdef LOOM_HAVE_CUDA
    if (cg->nccl) {
        loom_comm_req *r = req_new(m, g, LOOM_COLL_ALLREDUCE,
                                   2.0 * (N - 1) / N * (double)count * (double)es, 0);
        r->nccl = cg->nccl;
        NCCL_WHY;
        if (count) {
            nccl_ok(r, loom_nccl_allreduce(cg->nccl, buf, count, t, op == MPI_MAX, why, nwhy), why);
            nccl_end(r, cg->nccl);
        }
        return r;
    }
#endif
    int nchunk = N > 1 ? (int)((count + CHUNK - 1) / CHUNK) : 0;
    loom_comm_req *r = req_new(m, g, LOOM_COLL_ALLREDUCE,
                               2.0 * (N - 1) / N * (double)count * (double)es, nchunk);
    char *mbuf = buf;
    if (nchunk && staged(m, cg)) {
        mbuf = bounce(r, count * es);
        stage_in(m, mbuf, buf, count * es);
        stage_back(r, buf, mbuf, count * es);
    }
    for (int c = 0; c < nchunk; c++) {
        size_t off = (size_t)c * CHUNK, n = count - off < CHUNK ? count - off : CHUNK;
        MPI_Iallreduce(MPI_IN_PLACE, mbuf + off * es, (int)n, mpi_type(t), op, cg->comm,
                       &r->reqs[c]);
    }
    return r;
}

loom_comm_req *loom_iallreduce_sum(loom_mesh *m, loom_group g, void *buf, size_t count,
                                   loom_dtype t) {
    return start_allreduce(m, g, buf, count, t, MPI_SUM);
}

void loom_allreduce_sum(loom_mesh *m, loom_group g, void *buf, size_t count, loom_dtype t) {
    wait_checked(start_allreduce(m, g, buf, count, t, MPI_SUM), NULL);
}

void loom_allreduce_max(loom_mesh *m, loom_group g, void *buf, size_t count, loom_dtype t) {
    wait_checked(start_allreduce(m, g, buf, count, t, MPI_MAX), NULL);
}

/* counts/displs of loom_shard's layout, in elements (checked to fit int) */
static void shard_table(loom_comm_req *r, size_t count, int N, const char *what) {
    if (r->table_cap < N) {
        free(r->counts);
        free(r->displs);
        r->counts = loom_calloc((size_t)N, sizeof(int));
        r->displs = loom_calloc((size_t)N, sizeof(int));
        r->table_cap = N;
    }
    as_count(count, what);
    for (int i = 0; i < N; i++) {
        size_t off, len;
        loom_split(count, N, i, &off, &len);
        r->counts[i] = (int)len;
        r->displs[i] = (int)off;
    }
}

#ifdef LOOM_HAVE_CUDA
/* reduce-scatter on NCCL: ncclReduceScatter when count divides evenly, else one ncclReduce
 * per member's slice onto that member, in one group */
static void nccl_reduce_scatter(loom_comm_req *r, const comm_group *cg, const void *send,
                                void *recv, size_t count, loom_dtype t) {
    NCCL_WHY;
    const int N = cg->size;
    const size_t es = loom_dtype_size(t);
    r->nccl = cg->nccl;
    if (!count) return;
    if (count % (size_t)N == 0) {
        nccl_ok(r, loom_nccl_reduce_scatter(cg->nccl, send, recv, count / (size_t)N, t, why, nwhy),
                why);
    } else {
        nccl_ok(r, loom_nccl_group_start(why, nwhy), why);
        for (int i = 0; i < N; i++) {
            size_t off, len;
            loom_split(count, N, i, &off, &len);
            if (len)
                nccl_ok(r, loom_nccl_reduce(cg->nccl, (const char *)send + off * es, recv, len, t,
                                            i, why, nwhy), why);
        }
        nccl_ok(r, loom_nccl_group_end(cg->nccl, why, nwhy), why);
    }
    nccl_end(r, cg->nccl);
}

/* allgather on NCCL: ncclAllGather when count divides evenly, else one ncclBroadcast per
 * member's slice, in one group; src is this member's slice (in place when it is recv's) */
static void nccl_allgather(loom_comm_req *r, const comm_group *cg, const void *src, void *recv,
                           size_t count, size_t es) {
    NCCL_WHY;
    const int N = cg->size;
    r->nccl = cg->nccl;
    if (!count) return;
    if (count % (size_t)N == 0) {
        nccl_ok(r, loom_nccl_allgather(cg->nccl, src, recv, count / (size_t)N * es, why, nwhy),
                why);
    } else {
        nccl_ok(r, loom_nccl_group_start(why, nwhy), why);
        for (int i = 0; i < N; i++) {
            size_t off, len;
            loom_split(count, N, i, &off, &len);
            char *slot = (char *)recv + off * es;
            if (len)
                nccl_ok(r, loom_nccl_broadcast(cg->nccl, i == cg->rank ? src : slot, slot,
                                               len * es, i, why, nwhy), why);
        }
        nccl_ok(r, loom_nccl_group_end(cg->nccl, why, nwhy), why);
    }
    nccl_end(r, cg->nccl);
}

/* all-to-all on NCCL: a send and a receive per member (itself included) in one group, blocks
 * at the running offsets: counts[j] / rcounts[j] elements of es bytes to / from member j, or
 * `block` elements each when the counts are NULL (no table allocated per call) */
static void nccl_alltoall(loom_comm_req *r, const comm_group *cg, const void *send,
                          const int64_t *counts, void *recv, const int64_t *rcounts, size_t block,
                          size_t es) {
    NCCL_WHY;
    size_t so = 0, ro = 0, any = 0;
    r->nccl = cg->nccl;
    nccl_ok(r, loom_nccl_group_start(why, nwhy), why);
    for (int j = 0; j < cg->size; j++) {
        const size_t sb = (counts ? (size_t)counts[j] : block) * es;
        const size_t rb = (rcounts ? (size_t)rcounts[j] : block) * es;
        if (sb)
            nccl_ok(r, loom_nccl_send(cg->nccl, (const char *)send + so, sb, j, why, nwhy), why);
        if (rb) nccl_ok(r, loom_nccl_recv(cg->nccl, (char *)recv + ro, rb, j, why, nwhy), why);
        any |= sb | rb;
        so += sb;
        ro += rb;
    }
    nccl_ok(r, loom_nccl_group_end(cg->nccl, why, nwhy), why);
    if (any) nccl_end(r, cg->nccl);
}
#endif

loom_comm_req *loom_ireduce_scatter_sum(loom_mesh *m, loom_group g, const void *send, void *recv,
                                        size_t count, loom_dtype t) {
    LOOM_CHECK(t != LOOM_BF16); /* moved only */
    const comm_group *cg = group_of(m, g);
    size_t es = loom_dtype_size(t);
    int N = cg->size;
    loom_comm_req *r = req_new(m, g, LOOM_COLL_REDUCE_SCATTER,
                               (double)(N - 1) / N * (double)count * (double)es,
                               N > 1 && !cg->nccl);
    size_t off, len;
    loom_split(count, N, cg->rank, &off, &len);
    if (N > 1) LOOM_CHECK(send != recv);
#ifdef LOOM_HAVE_CUDA
    if (cg->nccl) {
        nccl_reduce_scatter(r, cg, send, recv, count, t);
        return r;
    }
#endif
    if (N == 1) {
        dev_copy(m, recv, send, count * es);
        return r;
    }
    const void *msend;
    void *mrecv;
    stage_pair(m, cg, r, send, count * es, recv, len * es, &msend, &mrecv);
    if (count % (size_t)N == 0) {
        MPI_Ireduce_scatter_block(msend, mrecv, as_count(count / (size_t)N, "reduce_scatter"),
                                  mpi_type(t), MPI_SUM, cg->comm, &r->reqs[0]);
    } else {
        shard_table(r, count, N, "reduce_scatter");
        MPI_Ireduce_scatter(msend, mrecv, r->counts, mpi_type(t), MPI_SUM, cg->comm, &r->reqs[0]);
    }
    return r;
}

void loom_reduce_scatter_sum(loom_mesh *m, loom_group g, const void *send, void *recv,
                             size_t count, loom_dtype t) {
    wait_checked(loom_ireduce_scatter_sum(m, g, send, recv, count, t), NULL);
}

loom_comm_req *loom_iallgather(loom_mesh *m, loom_group g, const void *send, void *recv,
                               size_t count, loom_dtype t) {
    const comm_group *cg = group_of(m, g);
    size_t es = loom_dtype_size(t);
    int N = cg->size;
    loom_comm_req *r = req_new(m, g, LOOM_COLL_ALLGATHER,
                               (double)(N - 1) / N * (double)count * (double)es,
                               N > 1 && !cg->nccl);
    size_t off, len;
    loom_split(count, N, cg->rank, &off, &len);
    char *mine = (char *)recv + off * es;
    const int in_place = send == mine;
    if (!in_place) {
        /* the send slice must not overlap recv unless it is exactly this rank's slice */
        const char *s = send, *rb = recv;
        LOOM_CHECK(s + len * es <= rb || s >= rb + count * es);
    }
#ifdef LOOM_HAVE_CUDA
    if (cg->nccl) {
        nccl_allgather(r, cg, send, recv, count, es);
        return r;
    }
#endif
    if (N == 1) {
        if (!in_place) dev_copy(m, recv, send, count * es);
        return r;
    }
    const void *src = in_place ? MPI_IN_PLACE : send;
    char *mrecv = recv;
    if (staged(m, cg)) {
        /* this member's slice goes into its place in the bounce buffer: MPI works in place */
        mrecv = bounce(r, count * es);
        stage_in(m, mrecv + off * es, send, len * es);
        src = MPI_IN_PLACE;
        stage_back(r, recv, mrecv, count * es);
    }
    if (count % (size_t)N == 0) {
        int c = as_count(len, "allgather");
        MPI_Iallgather(src, c, mpi_type(t), mrecv, c, mpi_type(t), cg->comm, &r->reqs[0]);
    } else {
        shard_table(r, count, N, "allgather");
        MPI_Iallgatherv(src, (int)len, mpi_type(t), mrecv, r->counts, r->displs, mpi_type(t),
                        cg->comm, &r->reqs[0]);
    }
    return r;
}

void loom_allgather(loom_mesh *m, loom_group g, const void *send, void *recv, size_t count,
                    loom_dtype t) {
    wait_checked(loom_iallgather(m, g, send, recv, count, t), NULL);
}

void loom_alltoall(loom_mesh *m, loom_group g, const void *send, void *recv, size_t block,
                   loom_dtype t) {
    const comm_group *cg = group_of(m, g);
    size_t es = loom_dtype_size(t);
    int N = cg->size;
    double total = (double)block * N * (double)es;
    loom_comm_req *r = req_new(m, g, LOOM_COLL_ALLTOALL, (double)(N - 1) / N * total,
                               N > 1 && !cg->nccl);
    if (N > 1) LOOM_CHECK(send != recv);
#ifdef LOOM_HAVE_CUDA
    if (cg->nccl) {
        nccl_alltoall(r, cg, send, NULL, recv, NULL, block, es);
        wait_checked(r, NULL);
        return;
    }
#endif
    if (N == 1) {
        dev_copy(m, recv, send, block * es);
    } else {
        const size_t bytes = (size_t)N * block * es;
        const void *msend;
        void *mrecv;
        stage_pair(m, cg, r, send, bytes, recv, bytes, &msend, &mrecv);
        int c = as_count(block, "alltoall");
        MPI_Ialltoall(msend, c, mpi_type(t), mrecv, c, mpi_type(t), cg->comm, &r->reqs[0]);
    }
    wait_checked(r, NULL);
}

void loom_alltoallv(loom_mesh *m, loom_group g, const void *send, const int64_t *send_counts,
                    void *recv, const int64_t *recv_counts, loom_dtype t) {
    const comm_group *cg = group_of(m, g);
    const size_t es = loom_dtype_size(t);
    const int N = cg->size;
    double out = 0;
    for (int i = 0; i < N; i++)
        if (i != cg->rank) out += (double)send_counts[i] * (double)es;
    loom_comm_req *r = req_new(m, g, LOOM_COLL_ALLTOALL, out, N > 1 && !cg->nccl);
#ifdef LOOM_HAVE_CUDA
    if (cg->nccl) {
        if (N > 1) LOOM_CHECK(send != recv);
        for (int j = 0; j < N; j++) LOOM_CHECK(send_counts[j] >= 0 && recv_counts[j] >= 0);
        nccl_alltoall(r, cg, send, send_counts, recv, recv_counts, 0, es);
        wait_checked(r, NULL);
        return;
    }
#endif
    if (N == 1) {
        LOOM_CHECK(send_counts[0] == recv_counts[0]);
        if (send_counts[0] > 0) dev_copy(m, recv, send, (size_t)send_counts[0] * es);
    } else {
        LOOM_CHECK(send != recv);
        int *c = loom_malloc(4 * (size_t)N * sizeof(int));
        int *sd = c + N, *rc = c + 2 * N, *rd = c + 3 * N;
        size_t so = 0, ro = 0;
        for (int i = 0; i < N; i++) {
            c[i] = as_count((size_t)send_counts[i], "alltoallv");
            rc[i] = as_count((size_t)recv_counts[i], "alltoallv");
            sd[i] = as_count(so, "alltoallv");
            rd[i] = as_count(ro, "alltoallv");
            so += (size_t)send_counts[i];
            ro += (size_t)recv_counts[i];
        }
        const void *msend;
        void *mrecv;
        stage_pair(m, cg, r, send, so * es, recv, ro * es, &msend, &mrecv);
        MPI_Ialltoallv(msend, c, sd, mpi_type(t), mrecv, rc, rd, mpi_type(t), cg->comm,
                       &r->reqs[0]);
        wait_checked(r, NULL);
        free(c);
        return;
    }
    wait_checked(r, NULL);
}

void loom_broadcast(loom_mesh *m, loom_group g, void *buf, size_t count, loom_dtype t, int root) {
    const comm_group *cg = group_of(m, g);
    LOOM_CHECK(root >= 0 && root < cg->size);
    size_t es = loom_dtype_size(t);
    int N = cg->size;
#ifdef LOOM_HAVE_CUDA
    if (cg->nccl) {
        loom_comm_req *r = req_new(m, g, LOOM_COLL_BROADCAST, (double)count * (double)es, 0);
        r->nccl = cg->nccl;
        NCCL_WHY;
        if (count) {
            nccl_ok(r, loom_nccl_broadcast(cg->nccl, buf, buf, count * es, root, why, nwhy), why);
            nccl_end(r, cg->nccl);
        }
        wait_checked(r, NULL);
        return;
    }
#endif
    int nchunk = N > 1 ? (int)((count + CHUNK - 1) / CHUNK) : 0;
    loom_comm_req *r = req_new(m, g, LOOM_COLL_BROADCAST, (double)count * (double)es, nchunk);
    char *mbuf = buf;
    if (nchunk && staged(m, cg)) {
        mbuf = bounce(r, count * es);
        if (cg->rank == root) stage_in(m, mbuf, buf, count * es);
        else stage_back(r, buf, mbuf, count * es);
    }
    for (int c = 0; c < nchunk; c++) {
        size_t off = (size_t)c * CHUNK, n = count - off < CHUNK ? count - off : CHUNK;
        MPI_Ibcast(mbuf + off * es, (int)n, mpi_type(t), root, cg->comm, &r->reqs[c]);
    }
    wait_checked(r, NULL);
}

/* ---- point-to-point ------------------------------------------------------------------- */

/* A local group (no communicator): r (a send when is_send) meets the oldest unmatched request
 * of the other direction with its group and tag, or waits in its own list. */
static void local_post(loom_mesh *m, loom_comm_req *r, int is_send) {
    loom_comm_req **other = is_send ? &m->local_recvs : &m->local_sends;
    for (loom_comm_req **p = other; *p; p = &(*p)->local_next) {
        loom_comm_req *o = *p;
        if (o->g != r->g || o->local_tag != r->local_tag) continue;
        loom_comm_req *snd = is_send ? r : o, *rcv = is_send ? o : r;
        if (snd->local_bytes != rcv->local_bytes)
            loom_comm_abort(1, "p2p on %s, tag %d: a message of %zu bytes met a receive of %zu "
                            "bytes (counts and types must agree)", loom_group_name(r->g),
                            r->local_tag, snd->local_bytes, rcv->local_bytes);
        dev_copy(m, rcv->local_buf, snd->local_buf, snd->local_bytes);
        *p = o->local_next;
        o->local_pending = 0;
        return;
    }
    r->local_pending = 1;
    loom_comm_req **mine = is_send ? &m->local_sends : &m->local_recvs;
    while (*mine) mine = &(*mine)->local_next;
    *mine = r;
}

/* Messages travel over MPI on every path (NCCL's included: its sends and receives run in
 * stream order, so receives posted ahead, as the pipeline posts them, could wait behind a send
 * whose receiver waits for them; MPI's progress independently): off the direct path through a
 * bounce buffer per request. */
static loom_comm_req *start_p2p(loom_mesh *m, loom_group g, void *buf, size_t count,
                                loom_dtype t, int peer, int tag, int is_send) {
    const comm_group *cg = group_of(m, g);
    LOOM_CHECK(peer >= 0 && peer < cg->size && tag >= 0 && tag <= 32767);
    const size_t es = loom_dtype_size(t);
    if (cg->comm == MPI_COMM_NULL) {
        loom_comm_req *r = req_new(m, g, LOOM_COLL_P2P, 0, 0);
        r->local_tag = tag;
        r->local_buf = buf;
        r->local_bytes = count * es;
        local_post(m, r, is_send);
        return r;
    }
    /* one message per chunk (at least one: an empty message still matches its receive) */
    const int nchunk = count ? (int)((count + CHUNK - 1) / CHUNK) : 1;
    loom_comm_req *r = req_new(m, g, LOOM_COLL_P2P, is_send ? (double)count * (double)es : 0,
                               nchunk);
    char *mbuf = buf;
    if (m->path != PATH_DIRECT) {
        mbuf = bounce(r, count * es);
        if (is_send) stage_in(m, mbuf, buf, count * es);
        else stage_back(r, buf, mbuf, count * es);
    }
    for (int c = 0; c < nchunk; c++) {
        const size_t off = (size_t)c * CHUNK, n = count - off < CHUNK ? count - off : CHUNK;
        char *p = mbuf + off * es;
        if (is_send) MPI_Isend(p, (int)n, mpi_type(t), peer, tag, cg->comm, &r->reqs[c]);
        else MPI_Irecv(p, (int)n, mpi_type(t), peer, tag, cg->comm, &r->reqs[c]);
    }
    return r;
}

loom_comm_req *loom_isend(loom_mesh *m, loom_group g, const void *buf, size_t count,
                          loom_dtype t, int peer, int tag) {
    return start_p2p(m, g, (void *)(uintptr_t)buf, count, t, peer, tag, 1);
}

loom_comm_req *loom_irecv(loom_mesh *m, loom_group g, void *buf, size_t count, loom_dtype t,
                          int peer, int tag) {
    return start_p2p(m, g, buf, count, t, peer, tag, 0);
}

void loom_barrier(loom_mesh *m, loom_group g) {
    const comm_group *cg = group_of(m, g);
    loom_comm_req *r = req_new(m, g, LOOM_COLL_BARRIER, 0, cg->size > 1);
    if (cg->size > 1) MPI_Ibarrier(cg->comm, &r->reqs[0]);
    wait_checked(r, NULL);
}

/* ---- accounting ------------------------------------------------------------------------- */

void loom_comm_stats_get(const loom_mesh *m, loom_comm_stats *out) {
    *out = m->stats;
    out->total_calls = 0;
    out->total_bytes = out->total_time_s = out->total_wait_s = 0;
    for (int k = 0; k < LOOM_COLL_KIND_COUNT; k++) {
        out->total_calls += out->calls[k];
        out->total_bytes += out->bytes[k];
        out->total_time_s += out->time_s[k];
        out->total_wait_s += out->wait_s[k];
    }
}

void loom_comm_stats_reset(loom_mesh *m) { memset(&m->stats, 0, sizeof m->stats); }

void loom_comm_set_observer(loom_mesh *m, loom_comm_observer fn, void *ctx) {
    m->observer = fn;
    m->observer_ctx = fn ? ctx : NULL;
}
