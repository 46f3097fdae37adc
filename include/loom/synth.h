/* loom synth: synthetic-data pipelines (src/synth/, docs/synth.md): seeds -> a prompt
 * template -> a generator (the local checkpoint through the batched engine, or an
 * OpenAI-compatible endpoint over HTTP) -> validators in order -> regeneration of failures with
 * the validator's message -> accepted samples as JSONL with their lineage, and a summary. */
#ifndef LOOM_SYNTH_H
#define LOOM_SYNTH_H

#include "loom/base.h"
#include "loom/model.h"

typedef struct loom_synth_opts {
    int quiet;          /* no progress line */
    int threads;        /* validator threads (default 2) */
    int no_cache;       /* ignore and do not write the pipeline's cache */
    /* Tensor parallelism of the local generator (`loom synth --tp T` under mpirun): the world's
     * ranks are world / tp replicas of tp consecutive ranks; a replica's ranks each hold a tp
     * view of the checkpoint and generate its blocks together, its tp rank 0 validates them.
     * tp 0 or 1: none. tp_points: the rank's tp group's communication points (parallel/tp.c),
     * set by the caller when tp > 1. */
    int tp;
    loom_comm_points tp_points;
} loom_synth_opts;

/* Runs the pipeline file. 0, or -1 with an error naming the file and key. */
int loom_synth_run(const char *pipeline_path, const loom_synth_opts *o, loom_err *err);

#endif
