#include <stdio.h>
#include "cli/cli.h"
int loom_cli_train(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "loom: train: not built yet\n");
    return 1;
}
