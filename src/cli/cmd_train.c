/* loom train CONFIG.yaml [--set section.key=value ...] */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/comm.h"
#include "loom/parallel.h"
#include "loom/config.h"
#include "loom/train.h"

int loom_cli_train(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: loom train CONFIG.yaml [--set section.key=value ...]\n");
        return 2;
    }
    loom_err err = {{0}};
    if (loom_parallel_start(&argc, &argv, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    loom_config *cfg = loom_config_new();
    int rc = 1;
    if (loom_config_load_yaml(cfg, argv[1], &err)) goto fail;
    for (int i = 2; i < argc; i++) {
        const char *arg = NULL;
        if (!strcmp(argv[i], "--set") && i + 1 < argc) arg = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6)) arg = argv[i] + 6;
        else {
            loom_errf(&err, "unexpected argument '%s' (expected --set section.key=value)", argv[i]);
            goto fail;
        }
        if (loom_config_set_arg(cfg, arg, &err)) goto fail;
    }
    const int trc = loom_train(cfg, &err);
    if (trc == LOOM_TRAIN_EXIT_ALERT_STOP) { /* agreed by every rank, after a checkpoint */
        fprintf(stderr, "loom: %s\n", err.msg);
        rc = trc;
        goto out;
    }
    if (trc > LOOM_TRAIN_EXIT_SIGNAL) {
        /* a signal, agreed by every rank after a checkpoint: an orderly end on every rank, no
         * abort (under srun --kill-on-bad-exit an aborting rank could kill the one that was
         * writing the message); rank 0 says it once */
        if (loom_comm_world_rank() == 0) fprintf(stderr, "loom: %s\n", err.msg);
        rc = trc;
        goto out;
    }
    if (trc) goto fail;
    rc = 0;
    goto out;
fail:
    /* under MPI one rank's error ends the whole job (never a hang in the next collective) */
    if (loom_comm_mpi_active() && loom_comm_world_size() > 1) loom_comm_fail(&err);
    fprintf(stderr, "loom: error: %s\n", err.msg);
out:
    loom_config_free(cfg);
    loom_comm_finalize();
    return rc;
}
