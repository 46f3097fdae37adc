/* Shared by generate, serve and synth: --weights fp32|bf16|int8|int4, --compute fp32|bf16 and the
 * resident memory line. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

int cli_parse_weights(const char *v, int *mode) {
    static const char *const names[] = {"fp32", "bf16", "int8", "int4"}; /* CLI_W_* */
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, names[i])) {
            *mode = i;
            return 0;
        }
    fprintf(stderr, "loom: error: --weights '%s': expected fp32, bf16, int8 or int4\n", v);
    return -1;
}

const char *cli_weights_name(int mode) {
    return mode == CLI_W_INT4 ? "int4" : mode == CLI_W_INT8 ? "int8"
           : mode == CLI_W_BF16 ? "bf16" : "fp32";
}

int cli_set_weights(loom_model *m, int mode, int cbf16, loom_err *err) {
    if (cbf16) return loom_model_set_compute_bf16(m, err);
    if (mode == CLI_W_BF16) return loom_model_set_weights_bf16(m, err);
    if (mode == CLI_W_INT8) return loom_model_set_weights_int8(m, err);
    if (mode == CLI_W_INT4) return loom_model_set_weights_int4(m, err);
    return 0;
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
    if (weights_given && *wbf16 != CLI_W_BF16) {
        fprintf(stderr, "loom: error: --compute bf16 multiplies bf16 weights: it cannot run "
                        "with --weights %s (drop --weights, or give --weights bf16)\n",
                cli_weights_name(*wbf16));
        return -1;
    }
    *wbf16 = CLI_W_BF16;
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
