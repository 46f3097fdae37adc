#include <stdio.h>
#include "cli/cli.h"
int loom_cli_data(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "loom: data: not built yet\n");
    return 1;
}
