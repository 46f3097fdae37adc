/* The run config's schema: every key `loom train` accepts, with defaults (include/loom/load.h,
 * loom_train_schema). Here, below train/, because loading a model for inference reads a
 * checkpoint's config.yaml back with it (src/ckpt/load.c); the trainer reads its settings out
 * of the same keys (src/train/train_config.c). */
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/cp.h"
#include "loom/load.h"
#include "loom/model_config.h"

/* the obs.*, profile.* and alerts keys (the trainer's observability: src/train/train_obs.c) */
const loom_config_key loom_obs_config_keys[] = {
    {"profile.steps", "", "profile steps \"A-B\" (1-based, inclusive) into run.dir/trace.json "
                          "(Chrome trace, a track per rank); empty = off"},
    {"obs.straggler_ratio", "1.2", "name the slowest rank when its busy time exceeds the "
                                   "median rank's by this factor for 3 logged steps"},
    {"obs.prometheus_port", "0", "serve Prometheus metrics on 127.0.0.1:PORT (rank 0); 0 = off"},
    {"obs.tensorboard", "false", "write TensorBoard event files into run.dir/tb/"},
    {"obs.default_alerts", "true", "the built-in alert rules (loss spike, throughput drop, "
                                   "straggler, memory growth), with action log"},
    {"alerts", NULL, "alert rules: a list of \"METRIC CONDITION -> ACTION\" (ACTION: log | "
                     "stop | exec: CMD)"},
};
const int loom_obs_config_nkeys = (int)(sizeof loom_obs_config_keys /
                                        sizeof loom_obs_config_keys[0]);

static const loom_config_key train_only_keys[] = {
    {"run.dir", "runs/default", "run directory: config.yaml, metrics.jsonl, ckpt/"},
    {"data.train", NULL, "training dataset directory (with manifest.jsonl)"},
    {"data.val", "", "validation dataset directory; empty = no validation"},
    {"data.shuffle", "true", "visit training samples in a seeded permutation per epoch"},
    {"data.follow", "false", "pick up shards appended to the training manifest while training"},
    {"data.windows_per_doc", "4", "classify: windows per document and epoch (head, tail, body)"},
    {"data.pad_id", "256", "classify: token that pads documents shorter than seq_len"},
    {"training.steps", "1000", "optimizer steps to reach (raising it continues a run)"},
    {"training.schedule_steps", NULL, "horizon of the lr schedule (default training.steps); "
                                      "fix it to stop and continue a run along one schedule"},
    {"training.seed", "1337", "seeds init and data order"},
    {"training.init_from", "", "start from these weights: a loom checkpoint or a Hugging Face "
                               "directory (fresh optimizer and schedule; model.* from it)"},
    {"training.batch_size", "8", "B: sequences per micro-batch (the global batch under dp)"},
    {"training.seq_len", "256", "T: tokens per sequence"},
    {"training.grad_accum", "1", "micro-batches per optimizer step"},
    {"training.lr", "3e-4", "peak learning rate"},
    {"training.min_lr", NULL, "final learning rate (default lr/10)"},
    {"training.warmup", "100", "linear warmup steps"},
    {"training.schedule", "cosine", "cosine | wsd | constant"},
    {"training.decay_frac", "0.2", "wsd: fraction of the steps after warmup spent decaying"},
    {"training.weight_decay", "0.1", "AdamW decoupled weight decay (matrices only)"},
    {"training.beta1", "0.9", "AdamW beta1"},
    {"training.beta2", "0.95", "AdamW beta2"},
    {"training.eps", "1e-8", "AdamW epsilon"},
    {"training.precision", "fp32", "fp32 | bf16: bf16 mixed precision (fp32 masters and "
                                   "moments, bf16 weight copies and activations; docs/training.md)"},
    {"training.grad_clip", "1.0", "global gradient-norm clip; 0 = off"},
    {"training.threads", "0", "OpenMP/BLAS threads; 0 = all cores"},
    {"training.peak_flops", "0", "peak FLOP/s for MFU; 0 = measure once per machine"},
    {"training.log_every", "1", "progress line every N steps"},
    {"training.max_skipped", "10", "stop (with a checkpoint) after this many consecutive steps "
                                   "skipped for a non-finite loss or gradient norm"},
    {"training.memory_limit", "auto", "refuse a layout whose estimated memory exceeds this: auto "
                                      "(MemAvailable, cgroup limit), off, or bytes"},
    {"finetune.method", "sft", "sft (cross-entropy on the targets) | dpo | simpo | orpo "
                               "(preference pairs: recipe kind preference) | grpo (rollouts "
                               "scored by rewards)"},
    {"finetune.beta", "auto", "dpo / simpo beta, orpo lambda, grpo KL coefficient; auto: dpo "
                              "0.1, simpo 2.0, orpo 0.1, grpo 0"},
    {"finetune.template", NULL, "grpo: the chat template data.train was built with"},
    {"finetune.num_generations", "8", "grpo: G, completions per prompt (TRL's default)"},
    {"finetune.max_completion_tokens", "512", "grpo: generated tokens per completion at most "
                                              "(all turns)"},
    {"finetune.temperature", "1.0", "grpo: the rollouts' sampling temperature"},
    {"finetune.top_p", "1.0", "grpo: the rollouts' nucleus mass"},
    {"finetune.loss_type", "dapo", "grpo: dapo (token-level mean over the batch) | grpo "
                                   "(per-sequence mean, then over sequences)"},
    {"finetune.scale_rewards", "group", "grpo: group (advantages / the group's std) | none"},
    {"finetune.epsilon", "0.2", "grpo: the ratio's lower clip 1 - epsilon"},
    {"finetune.epsilon_high", "auto", "grpo: the upper clip 1 + epsilon_high; auto = epsilon "
                                      "(DAPO uses 0.28)"},
    {"finetune.num_iterations", "1", "grpo: updates per batch of rollouts"},
    {"finetune.rewards", "[exact]", "grpo: reward functions: exact, regex, tool_call, length, "
                                    "command"},
    {"finetune.reward_weights", "auto", "grpo: one weight per reward (auto: all 1)"},
    {"finetune.reward.regex", NULL, "grpo regex reward: a POSIX extended pattern"},
    {"finetune.reward.length_max", "0", "grpo length reward: -(n - N) / N beyond N tokens"},
    {"finetune.reward.command", NULL, "grpo command reward: argv; the reply on stdin"},
    {"finetune.env.command", NULL, "grpo tool environment: argv; a tool call on stdin, its "
                                   "stdout the tool message"},
    {"finetune.env.max_turns", "1", "grpo: tool calls executed per completion at most"},
    {"finetune.env.timeout_s", "10", "grpo: seconds a command may run"},
    {"finetune.label_smoothing", "0", "dpo / simpo: the conservative loss's epsilon in [0, 0.5)"},
    {"finetune.gamma", "0.5", "simpo: the target reward margin gamma (TRL's simpo_gamma)"},
    {"finetune.rpo_alpha", "0", "dpo: weight of the chosen tokens' mean NLL added to the loss "
                                "(RPO; TRL loss_type [sigmoid, sft], loss_weights [1, alpha])"},
    {"finetune.lora.rank", "0", "LoRA adapters' rank (0 = off: every weight is trained)"},
    {"finetune.lora.alpha", "16", "LoRA scale numerator: the adapters add (alpha / rank) B A x"},
    {"finetune.lora.dropout", "0",
     "dropout probability on the adapters' input, in [0, 1) (training steps only)"},
    {"finetune.lora.targets", "[q, v]", "the adapted linears: q, k, v, o, gate, up, down "
                                        "(gpt2: q, k, v, o, fc, fc_proj), or PEFT's module "
                                        "names (q_proj, ..., c_attn, ..., all-linear)"},
    {"eval.every", "100", "validation loss every N steps (0 = only at the end)"},
    {"eval.batches", "8", "validation batches per evaluation (0 = every window once)"},
    {"checkpoint.every", "0", "checkpoint every N steps (0 = no checkpoints)"},
    {"parallel.zero", "0", "ZeRO stage over the dp ranks: 0, 1, 2 or 3"},
    {"parallel.microbatches", "auto", "micro-batches each batch is cut into for the pipeline: "
                                      "auto (= parallel.pp) or a number dividing the rows per dp "
                                      "rank"},
    {"parallel.pp_schedule", "1f1b", "pipeline schedule: gpipe | 1f1b"},
    {"parallel.sp", "false", "sequence parallelism with parallel.tp > 1: the norm and residual "
                             "regions sharded along the sequence (all-gather / reduce-scatter "
                             "instead of the all-reduces)"},
    {"parallel.check_replicas", "false", "after every step, check that the dp replicas' "
                                         "parameters are bit-identical (zero 0-2), and the "
                                         "pipeline's two tied wte copies"},
};
#define N_TRAIN_ONLY ((int)(sizeof train_only_keys / sizeof train_only_keys[0]))

/* the full schema, assembled once on first use (no fixed-size table: any section may grow) */
static loom_config_key *all_keys;
static int n_all_keys;

static void build_schema(void) {
    if (all_keys) return;
    const loom_config_key *const tables[] = {train_only_keys, loom_model_config_keys,
                                             loom_comm_config_keys, loom_obs_config_keys,
                                             loom_cp_config_keys};
    const int counts[] = {N_TRAIN_ONLY, loom_model_config_nkeys, loom_comm_config_nkeys,
                          loom_obs_config_nkeys, loom_cp_config_nkeys};
    all_keys = loom_config_schema_join(tables, counts, 5, &n_all_keys);
}

const loom_config_key *loom_train_schema(int *n) {
    build_schema();
    *n = n_all_keys;
    return all_keys;
}
