/* The Prometheus endpoint: one thread that accepts on 127.0.0.1:port, reads a request (up to
 * 8 KiB, 2 s), and answers with the exposition of the data last published. One connection at
 * a time: a scrape is a few KiB. The trainer never waits for a scrape and never formats text
 * for one: publish copies its snapshot into a buffer under a mutex, and a scrape copies it out
 * under the same mutex and renders it on this thread, so the text is made only when asked
 * for (a scrape every 15 s costs nothing at the steps between). */
#define _GNU_SOURCE
#include "loom/obs_sinks.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct loom_prom {
    int fd;
    pthread_t thread;
    pthread_mutex_t mu;
    loom_prom_render_fn render;
    void *data;         /* the last published snapshot (under mu) */
    size_t len, cap;
    int stop; /* read and set with __atomic builtins */
};

static void send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void respond(loom_prom *p, int c) {
    char req[8192];
    size_t got = 0;
    /* the request line and headers, until the blank line, 2 s at most */
    while (got < sizeof req - 1) {
        struct pollfd pf = {c, POLLIN, 0};
        if (poll(&pf, 1, 2000) <= 0) return;
        ssize_t r = recv(c, req + got, sizeof req - 1 - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return;
        got += (size_t)r;
        req[got] = 0;
        if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n")) break;
    }
    req[got] = 0;
    char method[8] = "", path[256] = "";
    if (sscanf(req, "%7s %255s", method, path) != 2) return;
    char *q = strchr(path, '?');
    if (q) *q = 0;
    char head[256];
    if (strcmp(method, "GET") || (strcmp(path, "/metrics") && strcmp(path, "/"))) {
        const char *body = "not found: the metrics are at /metrics\n";
        int n = snprintf(head, sizeof head, "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain"
                         "\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", strlen(body));
        send_all(c, head, (size_t)n);
        send_all(c, body, strlen(body));
        return;
    }
    pthread_mutex_lock(&p->mu);
    const size_t len = p->len;
    char *snap = loom_malloc(len + 1);
    if (len) memcpy(snap, p->data, len);
    pthread_mutex_unlock(&p->mu);
    loom_sbuf text = {snap, len, len + 1};
    if (p->render) {
        text = (loom_sbuf){NULL, 0, 0};
        if (len) p->render(snap, len, &text);
        free(snap);
    }
    int n = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: text/plain; "
                     "version=0.0.4; charset=utf-8\r\nContent-Length: %zu\r\nConnection: "
                     "close\r\n\r\n", text.len);
    send_all(c, head, (size_t)n);
    send_all(c, text.p, text.len);
    free(text.p);
}

static void *serve(void *arg) {
    loom_prom *p = arg;
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd pf = {p->fd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0) continue;
        int c = accept(p->fd, NULL, NULL);
        if (c < 0) continue;
        respond(p, c);
        shutdown(c, SHUT_WR);
        close(c);
    }
    return NULL;
}

int loom_prom_start(int port, const char *what, loom_prom_render_fn render, loom_prom **out,
                    loom_err *err) {
    *out = NULL;
    if (port < 1 || port > 65535)
        return loom_errf(err, "%s: port %d is not in 1..65535", what, port);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return loom_errf(err, "%s: socket: %s", what, strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16)) {
        const int e = errno;
        close(fd);
        return loom_errf(err, "%s: cannot listen on 127.0.0.1:%d: %s", what, port, strerror(e));
    }
    loom_prom *p = loom_calloc(1, sizeof *p);
    p->fd = fd;
    p->render = render;
    pthread_mutex_init(&p->mu, NULL);
    if (pthread_create(&p->thread, NULL, serve, p)) {
        close(fd);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return loom_errf(err, "%s: cannot start the server thread", what);
    }
    *out = p;
    return 0;
}

void loom_prom_publish(loom_prom *p, const void *data, size_t len) {
    pthread_mutex_lock(&p->mu);
    if (len > p->cap) { /* once, or when the snapshot grows */
        p->cap = len;
        p->data = loom_realloc(p->data, p->cap);
    }
    if (len) memcpy(p->data, data, len);
    p->len = len;
    pthread_mutex_unlock(&p->mu);
}

void loom_prom_stop(loom_prom *p) {
    if (!p) return;
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_join(p->thread, NULL);
    close(p->fd);
    pthread_mutex_destroy(&p->mu);
    free(p->data);
    free(p);
}
