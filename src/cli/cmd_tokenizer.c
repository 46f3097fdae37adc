#include <stdio.h>
#include "cli/cli.h"
int loom_cli_tokenizer(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "loom: tokenizer: not built yet\n");
    return 1;
}
