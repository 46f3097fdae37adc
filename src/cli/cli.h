/* Subcommand entry points: argv[0] is the subcommand name. Each returns the exit code. */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H
#include "loom/base.h"
#include "loom/model.h"

int loom_cli_train(int argc, char **argv);
int loom_cli_generate(int argc, char **argv);
int loom_cli_serve(int argc, char **argv);
int loom_cli_synth(int argc, char **argv);
int loom_cli_data(int argc, char **argv);
int loom_cli_tokenizer(int argc, char **argv);
int loom_cli_eval(int argc, char **argv);
int loom_cli_peak(int argc, char **argv);
int loom_cli_import(int argc, char **argv);
int loom_cli_export(int argc, char **argv);
int loom_cli_report(int argc, char **argv);
int loom_cli_plan(int argc, char **argv);
/* --weights fp32|bf16|int8 (cli_weights.c): 0 and *mode set (CLI_W_*), or -1 after a
 * message on stderr; the mode's name; the mode (and --compute bf16) applied to a loaded model
 * (loom_model_set_weights_bf16 / _int8 / loom_model_set_compute_bf16: 0 or -1 and err) */
enum { CLI_W_FP32 = 0, CLI_W_BF16 = 1, CLI_W_INT8 = 2, CLI_W_INT4 = 3 };
int cli_parse_weights(const char *v, int *mode);
const char *cli_weights_name(int mode);
int cli_set_weights(loom_model *m, int mode, int cbf16, loom_err *err);
/* --compute fp32|bf16: 0 and *bf16 set, or -1 after a message on stderr */
int cli_parse_compute(const char *v, int *bf16);
/* --compute bf16 multiplies bf16 weights: it sets *wbf16 to CLI_W_BF16; an explicit other
 * --weights (weights_given) with it is an error (-1 after a message on stderr) */
int cli_compute_weights(int cbf16, int weights_given, int *wbf16);
/* this process's resident memory (/proc/self/statm), MiB; 0 when unknown */
double cli_resident_mib(void);
/* loom_parallel_start (loom_comm_init and the ISA agreement), body(argc, argv),
 * loom_comm_finalize; body's exit code (1 when init fails) */
int cli_with_comm(int argc, char **argv, int (*body)(int argc, char **argv));
#endif
