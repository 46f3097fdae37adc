/* Loader throughput: tokens/s that loom_loader_next delivers (4 weighted sources, shuffled,
 * T=256, B=8), a DP rank's slice, follow mode's per-call manifest stat, and the state
 * save/restore cost. Build and run: bash bench/bench_loader.sh [BUILD_DIR]. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/data.h"

enum { N_SRC = 4, SHARDS = 4, SHARD_TOKENS = 1 << 20, T = 256, B = 8 };

static void die(const loom_err *e) {
    fprintf(stderr, "bench_loader: %s\n", e->msg);
    exit(1);
}

static double run(loom_loader *l, int dp, double seconds, int32_t *in, int32_t *tg) {
    loom_err err = {{0}};
    uint64_t tokens = 0;
    double t0 = loom_now(), t = t0;
    while (t - t0 < seconds) {
        for (int i = 0; i < 64; i++) {
            if (loom_loader_next_slice(l, B, 0, dp, in, tg, &err)) die(&err);
            tokens += (uint64_t)(B / dp) * T;
        }
        t = loom_now();
    }
    return (double)tokens / (t - t0);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp/loom_bench_loader";
    loom_err err = {{0}};
    char path[512], sha[65], line[512];
    if (loom_mkdirs(dir, &err)) die(&err);
    snprintf(path, sizeof path, "%s/manifest.jsonl", dir);
    if (!loom_path_exists(path)) {
        uint32_t *tok = malloc((size_t)SHARD_TOKENS * sizeof *tok);
        uint64_t doc0 = 0;
        loom_shard_spec spec = {256, 1, "byte", NULL};
        const double w[N_SRC] = {4, 3, 2, 1};
        for (int s = 0; s < SHARDS * N_SRC; s++) {
            for (int i = 0; i < SHARD_TOKENS; i++) tok[i] = (uint32_t)((i * 7 + s) & 255);
            char name[64], sp[600];
            snprintf(name, sizeof name, "shard_%05d.bin", s);
            snprintf(sp, sizeof sp, "%s/%s", dir, name);
            if (loom_shard_write(sp, &spec, tok, SHARD_TOKENS, &doc0, 1, &err) ||
                loom_sha256_file(sp, sha, &err))
                die(&err);
            snprintf(line, sizeof line,
                     "{\"shard\":\"%s\",\"sha256\":\"%s\",\"tokens\":%d,\"docs\":1,"
                     "\"source\":\"src%d\",\"weight\":%g}",
                     name, sha, SHARD_TOKENS, s % N_SRC, w[s % N_SRC]);
            if (loom_append_line(path, line, &err)) die(&err);
        }
        free(tok);
    }
    double t0 = loom_now();
    loom_dataset *d;
    if (loom_dataset_open(dir, &d, &err)) die(&err);
    double t_open = loom_now() - t0;
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    loom_loader *l;
    loom_loader_opts o = {.T = T, .seed = 1, .shuffle = 1};
    if (loom_loader_open(d, &o, &l, &err)) die(&err);
    double shuffled = run(l, 1, 2.0, in, tg);
    double slice = run(l, 8, 1.0, in, tg);
    t0 = loom_now();
    int reps = 0;
    char *js = NULL;
    for (; loom_now() - t0 < 0.5; reps++) {
        free(js);
        js = loom_loader_state_json(l);
        if (loom_loader_restore_json(l, js, &err)) die(&err);
    }
    double t_state = (loom_now() - t0) / reps;
    loom_loader_free(l);
    o.shuffle = 0;
    if (loom_loader_open(d, &o, &l, &err)) die(&err);
    double seq = run(l, 1, 1.0, in, tg);
    loom_loader_free(l);
    o.shuffle = 1;
    o.follow = 1;
    if (loom_loader_open(d, &o, &l, &err)) die(&err);
    double follow = run(l, 1, 1.0, in, tg);
    loom_loader_free(l);
    printf("dataset: %d sources x %d shards x %d tokens (1 byte each), weights 4:3:2:1, "
           "T=%d, B=%d\n", N_SRC, SHARDS, SHARD_TOKENS, T, B);
    printf("| case | tokens/s |\n|---|---:|\n");
    printf("| shuffled, 4-source mix | %.3g |\n", shuffled);
    printf("| in manifest order (no shuffle) | %.3g |\n", seq);
    printf("| shuffled + follow (a stat of manifest.jsonl per call) | %.3g |\n", follow);
    printf("| one DP rank's slice, dp=8 (its tokens/s) | %.3g |\n", slice);
    printf("dataset open (verifies %d shards, SHA-256 of each): %.3f s; state json + restore: "
           "%.1f us (%zu bytes)\n", N_SRC * SHARDS, t_open, t_state * 1e6, strlen(js));
    free(js);
    free(in);
    free(tg);
    loom_dataset_close(d);
    return 0;
}
