/* Alert rules: parsing, rolling statistics per rule, actions, alerts.jsonl. */
#define _GNU_SOURCE
#include "loom/alerts.h"
#include "loom/signals.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

const char *const loom_alert_default_rules[] = {
    "loss nonfinite -> log",
    "loss > 3 * ema(50) -> log",
    "tokens_per_s < 0.5 * median(100) -> log",
    "straggler_lag > 0 -> log",
    "rss_bytes > 1.3 * min(1000) -> log",
};
const int loom_alert_default_count =
    (int)(sizeof loom_alert_default_rules / sizeof loom_alert_default_rules[0]);

static const char *const metrics[] = {"loss", "val_loss", "grad_norm", "lr", "tokens_per_s",
                                      "mfu", "step_ms", "rss_bytes", "comm_exposed_share",
                                      "straggler_lag"};
#define N_METRICS ((int)(sizeof metrics / sizeof metrics[0]))

enum { C_NONFINITE, C_ABS, C_FUNC };
enum { OP_GT, OP_GE, OP_LT, OP_LE };
enum { F_EMA, F_MEDIAN, F_MEAN, F_MIN, F_MAX };
static const char *const func_names[] = {"ema", "median", "mean", "min", "max"};
enum { A_LOG, A_STOP, A_EXEC };
static const char *const action_names[] = {"log", "stop", "exec"};

typedef struct rule {
    char *text, *metric, *cmd;
    int cond, op, func, action;
    double k, threshold;
    int64_t n;            /* window */
    double *hist;         /* (n) ring of earlier values */
    int64_t seen, head;   /* values seen; next ring slot */
    double ema;
    int active;           /* the condition held at the last evaluation */
} rule;

struct loom_alerts {
    rule *r;
    int n;
    char *path;
    pid_t *kids;
    int n_kids, cap_kids;
};

static void free_rule(rule *r) {
    free(r->text);
    free(r->metric);
    free(r->cmd);
    free(r->hist);
}

static const char *skip_ws(const char *p) {
    while (*p && isspace((unsigned char)*p)) p++;
    return p;
}

static int parse_rule(const char *text, const char *what, int item, rule *r, loom_err *err) {
    memset(r, 0, sizeof *r);
    r->text = loom_strdup(text);
#define BAD(...)                                                                               \
    do {                                                                                       \
        char why_[512];                                                                        \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                              \
        loom_errf(err, "%s item %d (\"%.300s\"): %s; a rule is \"METRIC CONDITION -> ACTION\"" \
                  ", e.g. \"loss > 3 * ema(50) -> stop\"", what, item, text, why_);            \
        free_rule(r);                                                                          \
        return -1;                                                                             \
    } while (0)
    const char *arrow = strstr(text, "->");
    if (!arrow) BAD("no \"->\" before the action");
    /* the action */
    const char *a = skip_ws(arrow + 2);
    if (!strncmp(a, "exec:", 5)) {
        const char *c = skip_ws(a + 5);
        size_t len = strlen(c);
        while (len > 0 && isspace((unsigned char)c[len - 1])) len--;
        if (!len) BAD("exec: needs a command");
        r->action = A_EXEC;
        r->cmd = loom_malloc(len + 1);
        memcpy(r->cmd, c, len);
        r->cmd[len] = 0;
    } else {
        char word[32] = "";
        int used = 0;
        if (sscanf(a, "%31s%n", word, &used) != 1 || *skip_ws(a + used))
            BAD("the action must be log, stop or exec: COMMAND");
        if (!strcmp(word, "log")) r->action = A_LOG;
        else if (!strcmp(word, "stop")) r->action = A_STOP;
        else BAD("unknown action '%s' (log, stop or exec: COMMAND)", word);
    }
    /* the metric */
    char lhs[512];
    const size_t ll = (size_t)(arrow - text);
    if (ll >= sizeof lhs) BAD("too long");
    memcpy(lhs, text, ll);
    lhs[ll] = 0;
    const char *p = skip_ws(lhs);
    char metric[64] = "";
    int used = 0;
    if (sscanf(p, "%63[A-Za-z0-9_]%n", metric, &used) != 1) BAD("no metric");
    int known = 0;
    for (int i = 0; i < N_METRICS; i++) known |= !strcmp(metric, metrics[i]);
    if (!known) {
        char list[256] = "";
        for (int i = 0; i < N_METRICS; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     metrics[i]);
        BAD("unknown metric '%s' (known: %s)", metric, list);
    }
    r->metric = loom_strdup(metric);
    p = skip_ws(p + used);
    /* the condition */
    if (!strncmp(p, "nonfinite", 9) && !*skip_ws(p + 9)) {
        r->cond = C_NONFINITE;
        return 0;
    }
    if (!strncmp(p, ">=", 2)) r->op = OP_GE, p += 2;
    else if (!strncmp(p, "<=", 2)) r->op = OP_LE, p += 2;
    else if (*p == '>') r->op = OP_GT, p++;
    else if (*p == '<') r->op = OP_LT, p++;
    else BAD("the condition must be nonfinite or start with >, >=, < or <=");
    p = skip_ws(p);
    char *end;
    double k = 1;
    errno = 0;
    const double num = strtod(p, &end);
    int have_num = end != p && errno == 0 && isfinite(num);
    if (have_num) {
        const char *q = skip_ws(end);
        if (!*q) {
            r->cond = C_ABS;
            r->threshold = num;
            return 0;
        }
        if (*q != '*') BAD("expected '*' after %g", num);
        k = num;
        p = skip_ws(q + 1);
    }
    char fn[16] = "";
    long long n = 0;
    used = 0;
    if (sscanf(p, "%15[a-z] ( %lld )%n", fn, &n, &used) != 2 || *skip_ws(p + used))
        BAD("expected a number or [K *] FUNC(N) with FUNC one of ema, median, mean, min, max");
    r->func = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(fn, func_names[i])) r->func = i;
    if (r->func < 0) BAD("unknown function '%s' (ema, median, mean, min, max)", fn);
    if (n < 1 || n > 1000000) BAD("the window %lld must be in 1..1000000", n);
    r->cond = C_FUNC;
    r->k = k;
    r->n = n;
    r->hist = loom_calloc((size_t)n, sizeof *r->hist);
    return 0;
#undef BAD
}

int loom_alerts_create(char *const *rules, int n, int with_defaults, const char *what,
                       const char *jsonl_path, loom_alerts **out, loom_err *err) {
    *out = NULL;
    loom_alerts *a = loom_calloc(1, sizeof *a);
    const int total = n + (with_defaults ? loom_alert_default_count : 0);
    a->r = loom_calloc((size_t)(total ? total : 1), sizeof *a->r);
    a->path = loom_strdup(jsonl_path);
    for (int i = 0; i < total; i++) {
        const int user = i < n;
        const char *text = user ? rules[i] : loom_alert_default_rules[i - n];
        if (parse_rule(text, user ? what : "default alert rule", user ? i + 1 : i - n + 1,
                       &a->r[a->n], err)) {
            loom_alerts_free(a);
            return -1;
        }
        a->n++;
    }
    *out = a;
    return 0;
}

int loom_alerts_count(const loom_alerts *a) { return a ? a->n : 0; }

static int cmp_d(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* the reference value of rule r over its earlier values, or NAN when not armed yet */
static double reference(const rule *r) {
    const int64_t have = r->seen < r->n ? r->seen : r->n;
    const int64_t need = r->n < 10 ? r->n : 10;
    if (have < need || have == 0) return NAN;
    if (r->func == F_EMA) return r->ema;
    double acc = r->func == F_MIN ? INFINITY : r->func == F_MAX ? -INFINITY : 0;
    if (r->func == F_MEDIAN) {
        double *tmp = loom_malloc((size_t)have * sizeof *tmp);
        memcpy(tmp, r->hist, (size_t)have * sizeof *tmp);
        qsort(tmp, (size_t)have, sizeof *tmp, cmp_d);
        acc = have % 2 ? tmp[have / 2] : 0.5 * (tmp[have / 2 - 1] + tmp[have / 2]);
        free(tmp);
        return acc;
    }
    for (int64_t i = 0; i < have; i++) {
        const double v = r->hist[i];
        if (r->func == F_MEAN) acc += v;
        else if (r->func == F_MIN) acc = v < acc ? v : acc;
        else acc = v > acc ? v : acc;
    }
    return r->func == F_MEAN ? acc / (double)have : acc;
}

static void remember(rule *r, double v) {
    if (r->cond != C_FUNC || !isfinite(v)) return; /* a NaN would poison every statistic */
    const double alpha = 2.0 / ((double)r->n + 1.0);
    r->ema = r->seen == 0 ? v : alpha * v + (1 - alpha) * r->ema;
    r->hist[r->head] = v;
    r->head = (r->head + 1) % r->n;
    r->seen++;
}

static void reap(loom_alerts *a, int block_s) {
    const double until = loom_now() + block_s;
    for (int i = 0; i < a->n_kids;) {
        int st;
        pid_t w = waitpid(a->kids[i], &st, WNOHANG);
        if (w == 0 && loom_now() < until) {
            usleep(10000);
            continue;
        }
        if (w != 0 || block_s > 0) a->kids[i] = a->kids[--a->n_kids]; /* done, or given up */
        else i++;
    }
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.17g", v);
    else fputs("null", f);
}

static int fire(loom_alerts *a, rule *r, int64_t step, double v, double ref, loom_err *err) {
    char vs[64];
    snprintf(vs, sizeof vs, "%.9g", v);
    if (isfinite(ref))
        loom_warn("alert at step %lld: %s (value %s, reference %.9g)", (long long)step, r->text,
                  vs, ref);
    else
        loom_warn("alert at step %lld: %s (value %s)", (long long)step, r->text, vs);
    FILE *f = fopen(a->path, "a");
    if (!f) return loom_errf(err, "%s: cannot open for appending: %s", a->path, strerror(errno));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(f, "{\"time\":%.3f,\"step\":%lld,\"rule\":", (double)ts.tv_sec + 1e-9 * ts.tv_nsec,
            (long long)step);
    json_str(f, r->text);
    fputs(",\"metric\":", f);
    json_str(f, r->metric);
    fputs(",\"value\":", f);
    json_num(f, v);
    fputs(",\"reference\":", f);
    json_num(f, ref);
    fprintf(f, ",\"action\":\"%s\"", action_names[r->action]);
    if (r->cmd) {
        fputs(",\"command\":", f);
        json_str(f, r->cmd);
    }
    fputs("}\n", f);
    if (fclose(f) != 0) return loom_errf(err, "%s: write failed: %s", a->path, strerror(errno));
    if (r->action == A_EXEC) {
        char e_rule[600], e_metric[96], e_value[96], e_step[64], e_action[32];
        snprintf(e_rule, sizeof e_rule, "LOOM_ALERT_RULE=%s", r->text);
        snprintf(e_metric, sizeof e_metric, "LOOM_ALERT_METRIC=%s", r->metric);
        snprintf(e_value, sizeof e_value, "LOOM_ALERT_VALUE=%s", vs);
        snprintf(e_step, sizeof e_step, "LOOM_ALERT_STEP=%lld", (long long)step);
        snprintf(e_action, sizeof e_action, "LOOM_ALERT_ACTION=exec");
        int ne = 0;
        while (environ[ne]) ne++;
        char **env = loom_malloc((size_t)(ne + 6) * sizeof *env);
        int k = 0;
        for (int i = 0; i < ne; i++)
            if (strncmp(environ[i], "LOOM_ALERT_", 11)) env[k++] = environ[i];
        env[k++] = e_rule;
        env[k++] = e_metric;
        env[k++] = e_value;
        env[k++] = e_step;
        env[k++] = e_action;
        env[k] = NULL;
        char *argv[] = {"/bin/sh", "-c", r->cmd, NULL};
        pid_t pid;
        /* the mask and dispositions loom started with (SIGINT/SIGTERM are blocked here) */
        posix_spawnattr_t attr;
        sigset_t mask, dfl;
        loom_signals_child_sets(&mask, &dfl);
        posix_spawnattr_init(&attr);
        posix_spawnattr_setsigmask(&attr, &mask);
        posix_spawnattr_setsigdefault(&attr, &dfl);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
        const int rc = posix_spawn(&pid, "/bin/sh", NULL, &attr, argv, env);
        posix_spawnattr_destroy(&attr);
        free(env);
        if (rc) loom_warn("alert: cannot run \"%s\": %s", r->cmd, strerror(rc));
        else {
            if (a->n_kids == a->cap_kids) {
                a->cap_kids = a->cap_kids ? 2 * a->cap_kids : 8;
                a->kids = loom_realloc(a->kids, (size_t)a->cap_kids * sizeof *a->kids);
            }
            a->kids[a->n_kids++] = pid;
        }
    }
    return 0;
}

int loom_alerts_eval(loom_alerts *a, int64_t step, const loom_alert_value *v, int n, int *stop,
                     int64_t *fired, loom_err *err) {
    if (!a) return 0;
    reap(a, 0);
    for (int i = 0; i < a->n; i++) {
        rule *r = &a->r[i];
        int have = 0;
        double x = 0;
        for (int j = 0; j < n && !have; j++)
            if (!strcmp(v[j].metric, r->metric)) have = 1, x = v[j].value;
        if (!have) {
            r->active = 0;
            continue;
        }
        double ref = NAN;
        int hold = 0;
        if (r->cond == C_NONFINITE) {
            hold = !isfinite(x);
        } else {
            const double base = r->cond == C_ABS ? r->threshold : r->k * (ref = reference(r));
            if (isfinite(x) && isfinite(base)) {
                switch (r->op) {
                case OP_GT: hold = x > base; break;
                case OP_GE: hold = x >= base; break;
                case OP_LT: hold = x < base; break;
                default: hold = x <= base; break;
                }
            }
            if (r->cond == C_ABS || isfinite(ref)) ref = base; /* what x was held against */
        }
        if (hold && !r->active) {
            if (fire(a, r, step, x, ref, err)) return -1;
            ++*fired;
            if (r->action == A_STOP) *stop = 1;
        }
        r->active = hold;
        remember(r, x);
    }
    return 0;
}

void loom_alerts_free(loom_alerts *a) {
    if (!a) return;
    reap(a, 10);
    for (int i = 0; i < a->n; i++) free_rule(&a->r[i]);
    free(a->r);
    free(a->kids);
    free(a->path);
    free(a);
}
