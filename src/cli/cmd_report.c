/* loom report RUN_DIR [--out FILE] */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/report.h"

int loom_cli_report(int argc, char **argv) {
    const char *run = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] != '-' && !run) run = argv[i];
        else {
            fprintf(stderr, "usage: loom report RUN_DIR [--out FILE]\n");
            return 2;
        }
    }
    if (!run) {
        fprintf(stderr, "usage: loom report RUN_DIR [--out FILE]\n");
        return 2;
    }
    loom_err err = {{0}};
    if (loom_report(run, out, &err)) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    return 0;
}
