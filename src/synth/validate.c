/* loom synth: the validators that judge one output (docs/synth.md, "Validators"); unique and
 * near_duplicate run in item order in the runner (synth.c). */
#define _GNU_SOURCE
#include "synth/synth_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/signals.h"


/* a JSON-schema subset: type, enum, properties, required, additionalProperties (false),
 * items, minLength/maxLength, minimum/maximum, minItems/maxItems */
static int schema_check(json_t *s, json_t *x, const char *path, char *msg, size_t n) {
    if (!json_is_object(s)) return 0;
    json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) {
        const char *ty = json_string_value(t);
        int ok = !strcmp(ty, "object") ? json_is_object(x)
               : !strcmp(ty, "array") ? json_is_array(x)
               : !strcmp(ty, "string") ? json_is_string(x)
               : !strcmp(ty, "integer") ? json_is_integer(x)
               : !strcmp(ty, "number") ? json_is_number(x)
               : !strcmp(ty, "boolean") ? json_is_boolean(x)
               : !strcmp(ty, "null") ? json_is_null(x) : 1;
        if (!ok) {
            snprintf(msg, n, "%s: expected %s", path, ty);
            return -1;
        }
    }
    json_t *en = json_object_get(s, "enum");
    if (json_is_array(en)) {
        size_t i;
        json_t *v;
        int found = 0;
        json_array_foreach(en, i, v) found |= json_equal(v, x);
        if (!found) {
            snprintf(msg, n, "%s: not one of the allowed values", path);
            return -1;
        }
    }
    if (json_is_string(x)) {
        json_t *a = json_object_get(s, "minLength"), *b = json_object_get(s, "maxLength");
        /* in code points, as JSON Schema counts (jansson's strings are valid UTF-8) */
        long long l = 0;
        const char *sv = json_string_value(x);
        for (size_t k = 0; k < json_string_length(x); k++) l += ((unsigned char)sv[k] & 0xC0) != 0x80;
        if ((json_is_integer(a) && l < json_integer_value(a)) || (json_is_integer(b) && l > json_integer_value(b))) {
            snprintf(msg, n, "%s: string length %lld out of range", path, l);
            return -1;
        }
    }
    if (json_is_number(x)) {
        json_t *a = json_object_get(s, "minimum"), *b = json_object_get(s, "maximum");
        const double v = json_number_value(x);
        if ((json_is_number(a) && v < json_number_value(a)) || (json_is_number(b) && v > json_number_value(b))) {
            snprintf(msg, n, "%s: %g out of range", path, v);
            return -1;
        }
    }
    if (json_is_object(x)) {
        json_t *req = json_object_get(s, "required"), *props = json_object_get(s, "properties");
        size_t i;
        json_t *v;
        json_array_foreach(req, i, v) {
            if (json_is_string(v) && !json_object_get(x, json_string_value(v))) {
                snprintf(msg, n, "%s: missing required key '%s'", path, json_string_value(v));
                return -1;
            }
        }
        const char *k;
        json_object_foreach(x, k, v) {
            json_t *ps = json_is_object(props) ? json_object_get(props, k) : NULL;
            if (!ps && json_is_false(json_object_get(s, "additionalProperties"))) {
                snprintf(msg, n, "%s: unexpected key '%s'", path, k);
                return -1;
            }
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s", path, k);
            if (ps && schema_check(ps, v, sub, msg, n)) return -1;
        }
    }
    if (json_is_array(x)) {
        json_t *a = json_object_get(s, "minItems"), *b = json_object_get(s, "maxItems");
        const long long l = (long long)json_array_size(x);
        if ((json_is_integer(a) && l < json_integer_value(a)) || (json_is_integer(b) && l > json_integer_value(b))) {
            snprintf(msg, n, "%s: %lld items out of range", path, l);
            return -1;
        }
        json_t *it = json_object_get(s, "items");
        size_t i;
        json_t *v;
        json_array_foreach(x, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            if (it && schema_check(it, v, sub, msg, n)) return -1;
        }
    }
    return 0;
}

/* runs argv with the sample on stdin; the verdict is the exit status, the message its stderr */
static int run_command(const validator *v, const char *text, size_t len, char *msg, size_t n) {
    /* close-on-exec: validators run on several threads, and a pipe another thread's child
     * inherited would keep this child's stdin open (no EOF) until that child exits: two
     * such children wait for each other until the timeout. dup2 clears the flag on 0-2. */
    int in[2], er[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(er, O_CLOEXEC)) {
        snprintf(msg, n, "cannot create pipes: %s", strerror(errno));
        return -1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
        snprintf(msg, n, "cannot fork: %s", strerror(errno));
        close(in[0]), close(in[1]), close(er[0]), close(er[1]);
        return -1;
    }
    if (pid == 0) {
        loom_signals_child(); /* the mask and dispositions loom started with */
        dup2(in[0], 0);
        dup2(er[1], 2);
        const int dn = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (dn >= 0) dup2(dn, 1);
        close(in[0]), close(in[1]), close(er[0]), close(er[1]);
        execvp(v->argv[0], v->argv);
        fprintf(stderr, "cannot run %s: %s", v->argv[0], strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(er[1]);
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    fcntl(er[0], F_SETFL, O_NONBLOCK);
    size_t sent = 0, got = 0;
    const double t0 = loom_now();
    int in_open = 1, er_open = 1, timed_out = 0;
    if (len == 0) close(in[1]), in_open = 0;
    char ebuf[1024];
    while (er_open) {
        struct pollfd p[2] = {{er[0], POLLIN, 0}, {in_open ? in[1] : -1, POLLOUT, 0}};
        const double left = v->timeout_s - (loom_now() - t0);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        if (poll(p, 2, (int)(left * 1000) + 1) < 0 && errno != EINTR) break;
        if (in_open && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            const ssize_t w = write(in[1], text + sent, len - sent);
            if (w > 0) sent += (size_t)w;
            if (w < 0 && errno != EAGAIN) sent = len;
            if (sent == len) close(in[1]), in_open = 0;
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            char tmp[512];
            const ssize_t r = read(er[0], tmp, sizeof tmp);
            if (r <= 0) {
                er_open = 0;
            } else {
                const size_t keep = got + (size_t)r < sizeof ebuf - 1 ? (size_t)r : sizeof ebuf - 1 - got;
                memcpy(ebuf + got, tmp, keep);
                got += keep;
            }
        }
    }
    if (in_open) close(in[1]);
    close(er[0]);
    int status = 0;
    if (timed_out) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ebuf[got] = 0;
    while (got && (ebuf[got - 1] == '\n' || ebuf[got - 1] == '\r')) ebuf[--got] = 0;
    if (timed_out) {
        snprintf(msg, n, "timed out after %g s", v->timeout_s);
        return -1;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    snprintf(msg, n, "%.400s", got ? ebuf : "rejected (non-zero exit)");
    return -1;
}

static int validate(const validator *v, const char *text, size_t len, char *msg, size_t n) {
    msg[0] = 0;
    switch (v->kind) {
    case V_LENGTH:
        if ((long long)len < v->min || (v->max >= 0 && (long long)len > v->max)) {
            snprintf(msg, n, "length %zu is outside [%lld, %lld]", len, v->min, v->max);
            return -1;
        }
        return 0;
    case V_REGEX: {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(v->re, NULL);
        const int r = pcre2_match(v->re, (PCRE2_SPTR)text, len, 0, 0, md, NULL);
        pcre2_match_data_free(md);
        if (r < 0) {
            snprintf(msg, n, "does not match the pattern");
            return -1;
        }
        return 0;
    }
    case V_JSON: {
        json_error_t je;
        json_t *x = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
        if (!x) {
            snprintf(msg, n, "not JSON: %s at column %d", je.text, je.column);
            return -1;
        }
        const int r = v->schema ? schema_check(v->schema, x, "$", msg, n) : 0;
        json_decref(x);
        return r;
    }
    case V_COMMAND: return run_command(v, text, len, msg, n);
    default: return 0;
    }
}

static void validate_item(pipeline *P, item *it) {
    it->results = json_array();
    it->failed_validator = -1;
    if (!it->gen_ok) {
        it->failed_validator = P->nv; /* the generator */
        snprintf(it->vmsg, sizeof it->vmsg, "generation failed: %.900s", it->gen_err);
        return;
    }
    for (int k = 0; k < P->nv; k++) {
        const validator *v = &P->v[k];
        if (v->kind == V_UNIQUE || v->kind == V_NEARDUP) continue; /* in item order, after these */
        char msg[512] = "", vk[65] = "";
        int bad;
        double score = NAN;
        json_t *hit = NULL;
        if (P->C.on && (v->kind == V_COMMAND || v->kind == V_SCORE)) {
            synth_sha_hex_parts(vk, v->key, it->text, it->tlen);
            hit = json_object_get(P->C.val, vk);
        }
        if (hit) {
            it->val_hits++;
            bad = !json_is_true(json_object_get(hit, "ok"));
            snprintf(msg, sizeof msg, "%s", loom_json_str_or(hit, "message", ""));
            json_t *sj = json_object_get(hit, "score");
            if (json_is_number(sj)) score = json_number_value(sj);
        } else {
            bad = v->kind == V_SCORE ? synth_score_text(v->sc, it->text, it->tlen, &score, msg, sizeof msg) != 0
                                     : validate(v, it->text, it->tlen, msg, sizeof msg) != 0;
            if (vk[0] && !(v->kind == V_SCORE && v->sc->failed)) {
                size_t ml;
                char *cm = loom_utf8_sanitize(msg, strlen(msg), &ml);
                json_t *e = json_pack("{s:s,s:b,s:s%}", "k", vk, "ok", !bad, "message", cm, ml);
                free(cm);
                if (!isnan(score)) json_object_set_new(e, "score", json_real(score));
                if (!it->vfresh) it->vfresh = json_array();
                json_array_append_new(it->vfresh, e);
                it->val_runs++;
            }
        }
        if (v->kind == V_SCORE && !bad) { /* the threshold applies to the (cached) score */
            bad = !(score >= v->smin && score <= v->smax);
            if (bad) snprintf(msg, sizeof msg, "mean log-likelihood %.4f is outside [%g, %g]", score, v->smin, v->smax);
        }
        size_t ml;
        char *cm = loom_utf8_sanitize(msg, strlen(msg), &ml);
        json_t *res = json_pack("{s:s,s:b,s:s%}", "validator", v->name, "ok", !bad, "message", cm, ml);
        free(cm);
        if (!isnan(score)) json_object_set_new(res, "score", json_real(score));
        json_array_append_new(it->results, res);
        if (bad) {
            it->failed_validator = k;
            snprintf(it->vmsg, sizeof it->vmsg, "%.60s: %.500s", v->name, msg);
            return;
        }
    }
}

void *synth_vworker(void *arg) {
    vpool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        const int i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->mu);
        if (i < 0) break;
        validate_item(p->P, p->items[i]);
    }
    return NULL;
}
