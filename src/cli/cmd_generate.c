#include <stdio.h>
#include "cli/cli.h"
int loom_cli_generate(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "loom: generate: not built yet\n");
    return 1;
}
