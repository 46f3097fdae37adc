/* loom synth PIPELINE.yaml [--threads N] [--quiet] [--no-cache]: a synthetic-data pipeline (docs/synth.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/comm.h"
#include "loom/synth.h"

static int synth_main(int argc, char **argv) {
    const char *path = NULL;
    loom_synth_opts o = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quiet")) o.quiet = 1;
        else if (!strcmp(argv[i], "--no-cache")) o.no_cache = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            char *end;
            const long t = strtol(argv[++i], &end, 10);
            if (*end || t < 1 || t > 1024) {
                fprintf(stderr, "loom: error: --threads '%s' is not an integer in [1, 1024]\n", argv[i]);
                return 2;
            }
            o.threads = (int)t;
        } else if (argv[i][0] != '-' && !path) path = argv[i];
        else goto usage;
    }
    if (!path) goto usage;
    loom_err err = {{0}};
    if (loom_synth_run(path, &o, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    return 0;
usage:
    fprintf(stderr, "usage: loom synth PIPELINE.yaml [--threads N] [--quiet] [--no-cache]\n");
    return 2;
}

/* under mpirun the ranks share the pipeline's items (docs/synth.md) */
int loom_cli_synth(int argc, char **argv) {
    loom_err err = {{0}};
    if (loom_comm_init(&argc, &argv, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    const int rc = synth_main(argc, argv);
    loom_comm_finalize();
    return rc;
}
