/* Running a subcommand inside the communication layer's lifetime. */
#include <stdio.h>

#include "cli/cli.h"
#include "loom/base.h"
#include "loom/comm.h"
#include "loom/parallel.h"

int cli_with_comm(int argc, char **argv, int (*body)(int argc, char **argv)) {
    loom_err err = {{0}};
    if (loom_parallel_start(&argc, &argv, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    const int rc = body(argc, argv);
    loom_comm_finalize();
    return rc;
}
