/* Subcommand entry points: argv[0] is the subcommand name. Each returns the exit code. */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H
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
#endif
