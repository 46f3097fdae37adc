/* loom: one binary, one subcommand per file in src/cli/. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/base.h"
#include "loom/backend.h" /* the instruction-set level */
#include "loom/signals.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom <command> [args]\n"
            "  train CONFIG.yaml [--set section.key=value ...]   train (resumes from run.dir)\n"
            "  generate CKPT_DIR --prompt TEXT | --prompts FILE [--tokens N --temperature T ...]\n"
            "  serve CKPT_DIR [--host H --port P ...]             OpenAI-compatible HTTP server\n"
            "  synth PIPELINE.yaml [--threads N] [--quiet]         synthetic data: generate, validate, regenerate\n"
            "  eval CKPT --data DIR [--batches N] [--format json]  loss / accuracy + confusion matrix\n"
            "  data build|inspect|verify ...                       datasets: build shards, show, check\n"
            "  tokenizer train|encode|decode ...                   byte-level BPE (HF compatible)\n"
            "  import --hf HF_DIR OUT_CKPT [--tokenizer FILE|byte]   Hugging Face -> loom checkpoint\n"
            "  export --hf CKPT OUT_DIR [--max-shard-size N]          loom checkpoint -> Hugging Face\n"
            "  report RUN_DIR [--out FILE]                         run.dir/report.html: plots, config, alerts\n"
            "  peak [--threads N] [--seconds S] [--json]           measure the fp32 peak for MFU\n"
            "  plan CONFIG.yaml [--gpu NAME --gpus N | --cluster FILE] [--json]   rank layouts by memory and time\n"
            "  plan --check RUN_DIR                                a run's prediction beside its measurements\n"
            "  version\n");
}

int main(int argc, char **argv) {
    loom_err err;
    /* first, while this is the only thread: every thread started later inherits the blocked
     * SIGINT/SIGTERM, which only the signal thread takes (loom/signals.h) */
    if (loom_signals_init(&err) != 0) {
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (loom_isa_init(&err) != 0) { /* LOOM_ISA names a level this CPU or build lacks */
        fprintf(stderr, "loom: error: %s\n", err.msg);
        return 1;
    }
    if (!strcmp(cmd, "train")) return loom_cli_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return loom_cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return loom_cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return loom_cli_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "data")) return loom_cli_data(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenizer")) return loom_cli_tokenizer(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return loom_cli_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "peak")) return loom_cli_peak(argc - 1, argv + 1);
    if (!strcmp(cmd, "import")) return loom_cli_import(argc - 1, argv + 1);
    if (!strcmp(cmd, "export")) return loom_cli_export(argc - 1, argv + 1);
    if (!strcmp(cmd, "report")) return loom_cli_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return loom_cli_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
#ifdef LOOM_NATIVE
        printf("loom %s (NATIVE=1 build: -march=native)\n", LOOM_VERSION);
#else
        printf("loom %s (portable x86-64; kernels: %s, this CPU supports up to %s)\n", LOOM_VERSION,
               loom_isa_name(loom_isa_active()), loom_isa_name(loom_isa_detect()));
#endif
        printf("backends: %s\n", loom_backend_has_cuda()
                                     ? "cpu, cuda (built with nvcc; docs/gpu.md), cpu-guard and "
                                       "cuda-emu (tests)"
                                     : "cpu (this build has no CUDA backend: nvcc was not found), "
                                       "cpu-guard and cuda-emu (tests)");
#ifdef LOOM_HAVE_CUDA
        char dev[600];
        const int ok = loom_cuda_describe(dev, sizeof dev) == 0;
        printf("cuda: %s%s\n", ok ? "" : "no device: ", dev);
#endif
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "loom: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
