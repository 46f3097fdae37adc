/* Shared by generate, serve and synth: --weights fp32|bf16, --compute fp32|bf16 and the
 * resident memory line. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

int cli_parse_weights(const char *v, int *bf16) {
    if (!strcmp(v, "fp32") || !strcmp(v, "bf16")) {
        *bf16 = !strcmp(v, "bf16");
        return 0;
    }
    fprintf(stderr, "loom: error: --weights '%s': expected fp32 or bf16\n", v);
    return -1;
}

int cli_parse_compute(const char *v, int *bf16) {
    if (!strcmp(v, "fp32") || !strcmp(v, "bf16")) {
        *bf16 = !strcmp(v, "bf16");
        return 0;
    }
    fprintf(stderr, "loom: error: --compute '%s': expected fp32 or bf16\n", v);
    return -1;
}

int cli_compute_weights(int cbf16, int weights_given, int *wbf16) {
    if (!cbf16) return 0;
    if (weights_given && !*wbf16) {
        fprintf(stderr, "loom: error: --compute bf16 multiplies bf16 weights: it cannot run "
                        "with --weights fp32 (drop --weights, or give --weights bf16)\n");
        return -1;
    }
    *wbf16 = 1;
    return 0;
}

double cli_resident_mib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0.0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}
