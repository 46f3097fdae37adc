/* loom synth PIPELINE.yaml [--threads N] [--quiet] [--no-cache] [--tp T]: a synthetic-data
 * pipeline (docs/synth.md); --tp T under mpirun splits the local generator's model over T
 * ranks of each replica (docs/inference.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/comm.h"
#include "loom/synth.h"
#include "loom/tp.h"

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
        } else if (!strcmp(argv[i], "--tp") && i + 1 < argc) {
            char *end;
            const long t = strtol(argv[++i], &end, 10);
            if (*end || t < 1 || t > 4096) {
                fprintf(stderr, "loom: error: --tp '%s' is not an integer in [1, 4096]\n", argv[i]);
                return 2;
            }
            o.tp = (int)t;
        } else if (argv[i][0] != '-' && !path) path = argv[i];
        else goto usage;
    }
    if (!path) goto usage;
    loom_err err = {{0}};
    /* --tp: the tp groups of the world (tp innermost), their points wired to MPI */
    loom_mesh *mesh = NULL;
    loom_tp *tp = NULL;
    if (o.tp > 1 && loom_comm_world_size() % o.tp == 0) {
        loom_mesh_spec spec;
        loom_mesh_spec_default(&spec);
        spec.tp = o.tp;
        if (loom_mesh_create(&spec, NULL, &mesh, &err)) loom_comm_fail_all(&err);
        tp = loom_tp_create(mesh);
        o.tp_points = loom_tp_comm_points(tp);
    }
    const int rc = loom_synth_run(path, &o, &err);
    if (rc) fprintf(stderr, "loom: error: %s\n", err.msg);
    loom_tp_free(tp);
    loom_mesh_free(mesh);
    return rc ? 1 : 0;
usage:
    fprintf(stderr, "usage: loom synth PIPELINE.yaml [--threads N] [--quiet] [--no-cache] "
                    "[--tp T]\n");
    return 2;
}

/* under mpirun the ranks share the pipeline's items (docs/synth.md) */
int loom_cli_synth(int argc, char **argv) { return cli_with_comm(argc, argv, synth_main); }
