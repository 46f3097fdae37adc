/* loom serve's connections (docs/inference.md): the request deadline (each open connection
 * tracked from libmicrohttpd's notifications, a reaper thread shutting down those whose
 * request has not arrived within --request-timeout) and the gatekeeper (loom's own listen
 * socket: request lines checked before libmicrohttpd sees them, the connection caps). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "infer/server_internal.h"

/* ---- the request deadline ---------------------------------------------------------------- */

static sockrec *sock_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* the current request has arrived whole (reading 0), or it was answered (1: the next one's
 * deadline starts now) */
void server_sock_reading(server *S, struct MHD_Connection *c, int reading) {
    sockrec *r = sock_of(c);
    if (!r) return;
    pthread_mutex_lock(&S->sock_mu);
    r->reading = reading;
    if (reading) r->t0 = loom_now();
    pthread_mutex_unlock(&S->sock_mu);
}

void server_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    server *S = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        sockrec *r = loom_calloc(1, sizeof *r);
        r->fd = ci ? ci->connect_fd : -1;
        if (ai && ai->client_addr && ai->client_addr->sa_family == AF_INET)
            r->ip = ((const struct sockaddr_in *)ai->client_addr)->sin_addr.s_addr;
        /* handed over by the gatekeeper (this very call): the deadline runs from the accept */
        r->t0 = S->gate_started && pthread_equal(pthread_self(), S->gate) ? S->handoff_t0 : loom_now();
        r->reading = 1;
        pthread_mutex_lock(&S->sock_mu);
        r->next = S->socks;
        if (S->socks) S->socks->prev = r;
        S->socks = r;
        pthread_mutex_unlock(&S->sock_mu);
        *socket_context = r;
        return;
    }
    sockrec *r = *socket_context; /* CLOSED */
    if (!r) return;
    pthread_mutex_lock(&S->sock_mu);
    if (r->prev) r->prev->next = r->next;
    else S->socks = r->next;
    if (r->next) r->next->prev = r->prev;
    pthread_mutex_unlock(&S->sock_mu);
    free(r);
    *socket_context = NULL;
}

/* the reaper thread: every 200 ms, shuts down the connections past their request deadline
 * (libmicrohttpd's thread for it then reads the end of the stream and closes it) */
void *server_reaper_main(void *arg) {
    server *S = arg;
    double said = 0;
    long long cut = 0;
    while (!atomic_load(&S->reaper_stop)) {
        usleep(200000);
        const double now = loom_now();
        pthread_mutex_lock(&S->sock_mu);
        for (sockrec *r = S->socks; r; r = r->next)
            if (r->reading && !r->cut && r->fd >= 0 && now - r->t0 > S->o.request_timeout_s) {
                shutdown(r->fd, SHUT_RDWR);
                r->cut = 1;
                cut++;
            }
        pthread_mutex_unlock(&S->sock_mu);
        if (cut && now - said >= 10) { /* a line per 10 s at most, however many */
            fprintf(stderr, "loom: serve: closed %lld connection(s) whose request did not arrive "
                            "within --request-timeout %d s\n", cut, S->o.request_timeout_s);
            said = now;
            cut = 0;
        }
    }
    return NULL;
}

/* ---- the gatekeeper ------------------------------------------------------------------------
 * loom accepts the connections itself and hands them to libmicrohttpd (MHD_add_connection)
 * once their request line is known to be one: libmicrohttpd closes a connection whose first
 * line is garbage without a response (or waits for its idle timeout), and reads a chunked
 * body's chunk sizes where the handler cannot see them. The gatekeeper polls the sockets not
 * yet handed over and peeks (MSG_PEEK: the bytes stay for libmicrohttpd) at what arrived:
 *  - a first line that is not `METHOD SP TARGET SP HTTP/1.x` -> 400 (JSON error), closed;
 *  - a POST whose head says Transfer-Encoding: chunked: it waits for the first chunk's size
 *    line, and one over --max-body -> 413 at once, closed (a later chunk over it is refused
 *    while the body is read, as before);
 *  - else handed over at once (a GET) or once the head (and first chunk line) are in;
 *  - nothing complete within --request-timeout of the accept -> closed;
 *  - over --max-connections, or over --max-connections-per-client for its address (counting
 *    its connections here and in libmicrohttpd) -> closed at once. */
enum { GATE_PEEK = 8192 };
typedef struct gate_sock {
    int fd;
    struct sockaddr_in addr;
    double t0;
} gate_sock;

static void gate_reply(int fd, int status, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void gate_reply(int fd, int status, const char *reason, const char *fmt, ...) {
    char msg[400], body[800], out[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *e = json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", msg, "type",
                          "invalid_request_error", "param", "code");
    char *j = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    snprintf(body, sizeof body, "%s", j ? j : "{}");
    free(j);
    const int n = snprintf(out, sizeof out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                           "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", status, reason,
                           strlen(body), body);
    if (send(fd, out, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {} /* best effort */
    shutdown(fd, SHUT_WR);
    /* what was only peeked is still unread: read it, so that the close sends no reset that
     * could overtake the answer */
    char sink[4096];
    for (int i = 0; i < 64 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {}
}

/* what the peeked bytes say: 0 wait for more, 1 hand over, -1 refused (answered) */
static int gate_judge(server *S, int fd, const char *b, size_t n) {
    const char *eol = memchr(b, '\n', n);
    if (!eol) {
        if (n < GATE_PEEK) return 0;
        gate_reply(fd, 400, "Bad Request", "the request line is longer than %d bytes", GATE_PEEK);
        return -1;
    }
    /* METHOD SP TARGET SP HTTP/1.x (CR) LF */
    size_t len = (size_t)(eol - b);
    if (len && b[len - 1] == '\r') len--;
    size_t m = 0;
    while (m < len && m < 32 && b[m] >= 'A' && b[m] <= 'Z') m++;
    const char *sp2 = m < len && b[m] == ' ' ? memchr(b + m + 1, ' ', len - m - 1) : NULL;
    int ok = m > 0 && sp2 && sp2 > b + m + 1 && (size_t)(b + len - sp2 - 1) == 8 &&
             !memcmp(sp2 + 1, "HTTP/1.", 7) && (sp2[8] == '0' || sp2[8] == '1');
    for (const char *p = b + m + 1; ok && p < sp2; p++) ok = (unsigned char)*p > ' ' && *p != 127;
    if (!ok) {
        char shown[81];
        size_t k = 0;
        for (size_t i = 0; i < len && k < 80; i++)
            shown[k++] = (unsigned char)b[i] >= ' ' && (unsigned char)b[i] < 127 ? b[i] : '?';
        shown[k] = 0;
        gate_reply(fd, 400, "Bad Request", "not an HTTP/1.x request line: '%s'", shown);
        return -1;
    }
    if (m != 4 || memcmp(b, "POST", 4)) return 1;
    /* a POST: its head, and for a chunked body the first chunk's size line */
    const char *head_end = memmem(b, n, "\r\n\r\n", 4);
    size_t hl = 4;
    if (!head_end) head_end = memmem(b, n, "\n\n", 2), hl = 2;
    if (!head_end) return n < GATE_PEEK ? 0 : 1; /* a head this long: libmicrohttpd's limits */
    int chunked = 0;
    for (const char *p = eol + 1; p < head_end;) {
        const char *e = memchr(p, '\n', (size_t)(head_end - p));
        if (!e) e = head_end;
        static const char te[] = "transfer-encoding:";
        if ((size_t)(e - p) > sizeof te - 1 && !strncasecmp(p, te, sizeof te - 1)) {
            for (const char *q = p + sizeof te - 1; q + 7 <= e; q++)
                if (!strncasecmp(q, "chunked", 7)) chunked = 1;
        }
        p = e + 1;
    }
    if (!chunked) return 1;
    const char *c0 = head_end + hl, *ce = memchr(c0, '\n', (size_t)(b + n - c0));
    if (!ce) return n < GATE_PEEK ? 0 : 1;
    unsigned long long size = 0;
    int digits = 0, over = 0;
    for (const char *p = c0; p < ce && isxdigit((unsigned char)*p); p++, digits++) {
        const int d = isdigit((unsigned char)*p) ? *p - '0' : (tolower((unsigned char)*p) - 'a' + 10);
        if (size > (1ULL << 59)) over = 1;
        else size = size * 16 + (unsigned long long)d;
    }
    if (digits && (over || size > S->o.max_body)) {
        gate_reply(fd, 413, "Content Too Large", "a chunk of %.*s bytes (hex) is over the body limit "
                   "of %zu bytes", digits > 32 ? 32 : digits, c0, S->o.max_body);
        return -1;
    }
    return 1;
}

/* open connections of ip: not yet handed over (here) plus libmicrohttpd's */
static int gate_count_ip(server *S, const gate_sock *g, int ng, uint32_t ip) {
    int n = 0;
    for (int i = 0; i < ng; i++) n += g[i].addr.sin_addr.s_addr == ip;
    pthread_mutex_lock(&S->sock_mu);
    for (sockrec *r = S->socks; r; r = r->next) n += r->ip == ip;
    pthread_mutex_unlock(&S->sock_mu);
    return n;
}

static int gate_count_all(server *S) {
    int n = 0;
    pthread_mutex_lock(&S->sock_mu);
    for (sockrec *r = S->socks; r; r = r->next) n++;
    pthread_mutex_unlock(&S->sock_mu);
    return n;
}

void *server_gate_main(void *arg) {
    server *S = arg;
    const int cap = S->o.max_connections;
    gate_sock *g = loom_calloc((size_t)cap + 1, sizeof *g);
    struct pollfd *p = loom_calloc((size_t)cap + 2, sizeof *p);
    char *buf = loom_malloc(GATE_PEEK);
    int ng = 0;
    while (atomic_load(&S->gate_stop) < 2) {
        if (atomic_load(&S->gate_stop) && S->listen_fd >= 0) { /* draining: refuse new ones */
            close(S->listen_fd);
            S->listen_fd = -1;
        }
        const int accepting = atomic_load(&S->gate_stop) == 0 && S->listen_fd >= 0;
        p[0] = (struct pollfd){S->gate_wake[0], POLLIN, 0};
        p[1] = (struct pollfd){accepting ? S->listen_fd : -1, POLLIN, 0};
        for (int i = 0; i < ng; i++) p[2 + i] = (struct pollfd){g[i].fd, POLLIN, 0};
        if (poll(p, (nfds_t)ng + 2, 250) < 0 && errno != EINTR) break;
        if (p[0].revents & POLLIN) {
            char d[16];
            if (read(S->gate_wake[0], d, sizeof d) < 0) {}
        }
        const double now = loom_now();
        /* the waiting sockets first (p[] is indexed by the list before any accept) */
        for (int i = ng - 1; i >= 0; i--) {
            int verdict = 0;
            if (p[2 + i].revents & (POLLIN | POLLHUP | POLLERR)) {
                const ssize_t k = recv(g[i].fd, buf, GATE_PEEK, MSG_PEEK | MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) verdict = -1; /* gone */
                else if (k > 0) verdict = gate_judge(S, g[i].fd, buf, (size_t)k);
            }
            if (verdict == 0 && (now - g[i].t0 > S->o.request_timeout_s || atomic_load(&S->gate_stop)))
                verdict = -1; /* too slow, or draining: it never sent a request */
            if (verdict == 0) continue;
            const gate_sock one = g[i];
            g[i] = g[--ng];
            if (verdict < 0) {
                close(one.fd);
                continue;
            }
            S->handoff_t0 = one.t0;
            /* libmicrohttpd owns (and on failure closes) the socket from here */
            MHD_add_connection(S->daemon, one.fd, (const struct sockaddr *)&one.addr, sizeof one.addr);
        }
        if (!accepting || !(p[1].revents & POLLIN)) continue;
        for (;;) {
            struct sockaddr_in a;
            socklen_t al = sizeof a;
            const int fd = accept4(S->listen_fd, (struct sockaddr *)&a, &al, SOCK_CLOEXEC);
            if (fd < 0) break; /* EAGAIN: no more (the listen socket is non-blocking) */
            if (ng >= cap || ng + gate_count_all(S) >= cap ||
                gate_count_ip(S, g, ng, a.sin_addr.s_addr) >= S->o.max_per_client) {
                close(fd); /* over a limit: closed at once */
                continue;
            }
            g[ng++] = (gate_sock){fd, a, now};
        }
    }
    for (int i = 0; i < ng; i++) close(g[i].fd);
    free(g);
    free(p);
    free(buf);
    return NULL;
}

void server_gate_wakeup(server *S) {
    const char b = 1;
    if (write(S->gate_wake[1], &b, 1) < 0) {}
}
