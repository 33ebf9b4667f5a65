// Megatron-DeepSpeed's flags that recipes pass and that change nothing here (accepted, one note
// line each), aliases, sample-based runs, and what we refuse by name with the reason. Every flag
// of the recipes in docs/compatibility.md is in the main table, here, or refused here.
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "flag_parse.hpp"
#include "hpct/core/error.hpp"

namespace hpct::engine::detail {

namespace {

using Apply = std::function<void(TrainConfig&, const std::string&)>;

// A switch that changes nothing here: accepted, and the run says so once.
FlagSpec no_op(const char* flag, const char* why) {
  return {false, [flag, why](TrainConfig& c, const std::string&) { c.notes.push_back(std::string(flag) + " has no effect here: " + why); },
          why};
}

// A valued flag whose accepted values change nothing here; any other value is refused by name.
FlagSpec no_op_values(const char* flag, std::vector<std::string> ok, const char* why, const char* refusal) {
  std::string list;
  for (const auto& v : ok) list += (list.empty() ? "" : ", ") + v;
  return {true,
          [flag, ok, why, refusal, list](TrainConfig& c, const std::string& v) {
            for (const auto& o : ok)
              if (v == o) {
                c.notes.push_back(std::string(flag) + " " + v + " has no effect here: " + why);
                return;
              }
            throw config_error(flag, std::string(flag) + " " + printable(v) + ": " + refusal, "accepted: " + list);
          },
          why};
}

// A valued flag whose value, whatever it is, changes nothing here.
FlagSpec no_op_any(const char* flag, const char* why) {
  return {true, [flag, why](TrainConfig& c, const std::string&) { c.notes.push_back(std::string(flag) + " has no effect here: " + why); },
          why};
}

// A flag for something this version does not have: refused whatever its value, with the reason.
FlagSpec refused(const char* flag, bool takes_value, const char* why, const char* hint, bool many = false) {
  return {takes_value, [flag, why, hint](TrainConfig&, const std::string&) { throw config_error(flag, std::string(flag) + ": " + why, hint); },
          why, many};
}

Apply recompute(const char* flag) {
  return [flag](TrainConfig& c, const std::string& v) {
    if (!v.empty() && v != "full" && v != "selective")
      throw config_error(flag, std::string(flag) + " must be full or selective, got '" + printable(v) + "'");
    c.recompute_activations = true;
    if (v == "selective" || std::string(flag) == "--recompute-activations")
      c.notes.push_back(std::string(flag) + (v.empty() ? "" : " " + v) +
                        ": selective recomputation is not implemented; whole layers are recomputed (same results, more compute)");
  };
}

FlagSpec samples(long long TrainConfig::*field, const char* flag, const char* help) {
  return {true, [field, flag](TrainConfig& c, const std::string& v) { c.*field = to_int_min(flag, v, 0); }, help};
}

}  // namespace

void add_compat_flags(FlagTable& t) {
  const char* speed = "a kernel-fusion or overlap choice of Megatron's CUDA path; the results are the same";
  const char* flash = "flash attention: cuDNN's fused kernel on the GPU (--attention-kernel fused; an error where it cannot serve)";
  const char* scaling = "attention scores are computed in fp32 and scaled by 1/sqrt(head size) once";
  const char* rng = "every random stream (data order, dropout, routing, random-LTD) is a function of --seed, the iteration and the sample; a checkpoint stores no RNG state";
  const char* signals = "with --save, SIGTERM and SIGUSR1 always stop the run at the end of its step with a checkpoint (exit code 75: requeue)";
  const char* wandb = "nothing is sent over the network; --tensorboard-dir writes the same scalars to local files";
  const std::vector<std::pair<std::string, FlagSpec>> compat = {
      // Accepted without effect: what they choose is how this version always works.
      {"--num-workers", {true, [](TrainConfig& c, const std::string& v) { to_int_min("--num-workers", v, 0); c.notes.push_back("--num-workers " + v + " has no effect here: the dataset is memory-mapped and read by the training thread"); }, "the dataset is memory-mapped and read by the training thread"}},
      {"--data-impl", no_op_values("--data-impl", {"mmap", "infer"}, "indexed datasets are always read as mmap (.bin/.idx)", "only the mmap indexed format is read (see preprocess_data)")},
      {"--distributed-backend", no_op_values("--distributed-backend", {"nccl", "gloo", "mpi", "ccl"}, "ranks communicate over MPI (and NCCL between GPUs)", "is not a backend Megatron knows")},
      {"--DDP-impl", no_op_values("--DDP-impl", {"local", "torch"}, "data-parallel gradients are reduced by the ZeRO engine", "expects local or torch")},
      {"--pipeline-model-parallel-size", no_op_values("--pipeline-model-parallel-size", {"1"}, "pipeline parallelism is off (size 1)", "pipeline parallelism is not implemented; ZeRO-3 and tensor parallelism split the model instead")},
      {"--ds-sequence-parallel-size", no_op_values("--ds-sequence-parallel-size", {"1"}, "DeepSpeed-Ulysses sequence parallelism is off (size 1)", "DeepSpeed-Ulysses sequence parallelism is not implemented (Megatron's --sequence-parallel is)")},
      {"--checkpoint-num-layers", no_op_values("--checkpoint-num-layers", {"1"}, "with --checkpoint-activations every layer is recomputed on its own", "recomputing groups of layers is not implemented")},
      {"--recompute-num-layers", no_op_values("--recompute-num-layers", {"1"}, "with recomputation every layer is recomputed on its own", "recomputing groups of layers is not implemented")},
      {"--recompute-method", no_op_values("--recompute-method", {"uniform", "block"}, "every layer is recomputed on its own (one layer per group)", "expects uniform or block")},
      {"--optimizer", no_op_values("--optimizer", {"adam", "adamw"}, "the optimizer is AdamW (Megatron's adam, decoupled weight decay)", "only Adam(W) is implemented")},
      {"--no-pipeline-parallel", no_op("--no-pipeline-parallel", "pipeline parallelism is never used")},
      {"--no-load-rng", no_op("--no-load-rng", rng)},
      {"--no-save-rng", no_op("--no-save-rng", rng)},
      {"--exit-signal-handler", no_op("--exit-signal-handler", signals)},
      {"--exit-signal", no_op_values("--exit-signal", {"SIGTERM", "SIGUSR1"}, signals, "only SIGTERM and SIGUSR1 are handled")},
      {"--data-cache-path", no_op_any("--data-cache-path", "the datasets' sample indices are built in memory at the start; nothing is cached on disk")},
      {"--wandb-project", no_op_any("--wandb-project", wandb)},
      {"--wandb-exp-name", no_op_any("--wandb-exp-name", wandb)},
      {"--wandb-save-dir", no_op_any("--wandb-save-dir", wandb)},
      {"--use-distributed-optimizer", {false, [](TrainConfig& c, const std::string&) { c.distributed_optimizer = true; }, "Megatron's distributed optimizer: ZeRO stage 1 over the data-parallel group (raises stage 0 to 1)"}},
      {"--no-masked-softmax-fusion", no_op("--no-masked-softmax-fusion", speed)},
      {"--no-bias-gelu-fusion", no_op("--no-bias-gelu-fusion", speed)},
      {"--no-bias-dropout-fusion", no_op("--no-bias-dropout-fusion", speed)},
      {"--no-gradient-accumulation-fusion", no_op("--no-gradient-accumulation-fusion", speed)},
      {"--no-persist-layer-norm", no_op("--no-persist-layer-norm", speed)},
      {"--no-async-tensor-model-parallel-allreduce", no_op("--no-async-tensor-model-parallel-allreduce", speed)},
      {"--use-flash-attn", {false, [](TrainConfig& c, const std::string&) { c.attention_kernel = "fused", c.attention_kernel_flag = "--use-flash-attn"; }, flash}},
      {"--use-flash-attn-v1", {false, [](TrainConfig& c, const std::string&) { c.attention_kernel = "fused", c.attention_kernel_flag = "--use-flash-attn-v1"; }, flash}},
      {"--use-flash-attn-v2", {false, [](TrainConfig& c, const std::string&) { c.attention_kernel = "fused", c.attention_kernel_flag = "--use-flash-attn-v2"; }, flash}},
      {"--use-flash-attn-triton", {false, [](TrainConfig& c, const std::string&) { c.attention_kernel = "fused", c.attention_kernel_flag = "--use-flash-attn-triton"; }, flash}},
      {"--no-query-key-layer-scaling", no_op("--no-query-key-layer-scaling", scaling)},
      {"--apply-query-key-layer-scaling", no_op("--apply-query-key-layer-scaling", scaling)},
      {"--attention-softmax-in-fp32", no_op("--attention-softmax-in-fp32", "the softmax is always computed in fp32")},
      {"--fp16-lm-cross-entropy", no_op("--fp16-lm-cross-entropy", "the loss is always computed in fp32")},
      {"--override-opt_param-scheduler", {false, [](TrainConfig& c, const std::string&) { c.override_opt_param_scheduler = true; }, "on resume, take this run's learning-rate schedule flags even where they differ from the checkpoint's (otherwise refused, as Megatron does)"}},
      {"--universal-checkpoint", no_op("--universal-checkpoint", "checkpoints are topology-free already: any rank count, ZeRO stage and tensor-parallel size loads them")},
      {"--partition-activations", no_op("--partition-activations", "recomputed layers keep only their input, whole, on each rank")},
      {"--contigious-checkpointing", no_op("--contigious-checkpointing", "recomputed layers' inputs are kept in one buffer each")},
      {"--synchronize-each-layer", no_op("--synchronize-each-layer", "a debugging aid of DeepSpeed's activation checkpointing")},
      {"--profile-backward", no_op("--profile-backward", "the timers (--timing-log-level) report backward times")},
      {"--deepspeed_mpi", no_op("--deepspeed_mpi", "ranks are always started by MPI (mpirun or srun)")},
      {"--cpu-optimizer", no_op("--cpu-optimizer", "the optimizer step runs where zero_optimization.offload_optimizer puts it")},
      {"--accumulate-allreduce-grads-in-fp32", {false, [](TrainConfig& c, const std::string&) { c.zero.fp32_communication = true; }, "reduce gradients in fp32 (the ds_config's communication_data_type fp32)"}},
      // Aliases.
      {"--deepspeed-activation-checkpointing", {false, recompute("--deepspeed-activation-checkpointing"), "recompute each layer in backward (= --checkpoint-activations)"}},
      {"--recompute-activations", {false, recompute("--recompute-activations"), "recompute in backward (whole layers here)"}},
      {"--recompute-granularity", {true, recompute("--recompute-granularity"), "full | selective: recompute each layer in backward (whole layers here)"}},
      {"--deepscale", {false, [](TrainConfig&, const std::string&) {}, "DeepSpeed's old name of --deepspeed"}},
      {"--deepscale_config", {true, [](TrainConfig& c, const std::string& v) { c.ds_config_path = v; }, "DeepSpeed's old name of --deepspeed_config"}},
      // Sample-based runs (Megatron's rules; train_config.cpp's finalize checks their combinations).
      {"--train-samples", samples(&TrainConfig::train_samples, "--train-samples", "train on this many samples: --train-iters = samples / --global-batch-size (instead of --train-iters)")},
      {"--lr-warmup-samples", samples(&TrainConfig::lr_warmup_samples, "--lr-warmup-samples", "with --train-samples: linear warmup over this many samples")},
      {"--lr-decay-samples", samples(&TrainConfig::lr_decay_samples, "--lr-decay-samples", "with --train-samples: decay over this many samples (default --train-samples)")},
      {"--lr-warmup-fraction", {true, [](TrainConfig& c, const std::string& v) { c.lr_warmup_fraction = to_double("--lr-warmup-fraction", v); }, "warmup over this fraction of the decay (instead of --lr-warmup-iters/-samples)"}},
      {"--exit-duration-in-mins", {true, [](TrainConfig& c, const std::string& v) { c.exit_duration_mins = to_double("--exit-duration-in-mins", v); }, "save and exit once the run has trained this many minutes (checked every iteration, agreed by all ranks)"}},
      {"--rampup-batch-size", {true, [](TrainConfig& c, const std::string& v) {
         std::istringstream is(v);
         std::string a, b, n, extra;
         is >> a >> b >> n;
         if (n.empty() || (is >> extra))
           throw config_error("--rampup-batch-size", "--rampup-batch-size takes three values, <start> <increment> <ramp-up samples>, got '" + printable(v) + "'");
         c.rampup = {to_int_min("--rampup-batch-size", a, 1), to_int_min("--rampup-batch-size", b, 1), to_int_min("--rampup-batch-size", n, 1)};
       }, "<start> <increment> <samples>: grow the global batch from start by increment over that many samples (Megatron's; with --train-samples)", true}},
      // Refused by name: what this version does not have.
      {"--checkpoint-in-cpu", refused("--checkpoint-in-cpu", false, "moving recomputation checkpoints to CPU memory is not implemented", "drop it; ZeRO offload moves optimizer states and parameters instead")},
      {"--use-checkpoint-opt_param-scheduler", refused("--use-checkpoint-opt_param-scheduler", false, "the learning-rate schedule always comes from this run's flags", "give the schedule flags the checkpoint was trained with")},
      {"--onebitadam", refused("--onebitadam", false, "1-bit Adam is not implemented", "drop it (AdamW)")},
      {"--num-layers-per-virtual-pipeline-stage", refused("--num-layers-per-virtual-pipeline-stage", true, "pipeline parallelism is not implemented", "drop it")},
      {"--train-doc-idx-path", refused("--train-doc-idx-path", true, "Megatron's .npy sample-index files are not read: the index is built from --data-path, --split and --seed", "drop it (a data-metric curriculum takes the analyzer's files in the ds_config)")},
      {"--train-sample-idx-path", refused("--train-sample-idx-path", true, "Megatron's .npy sample-index files are not read: the index is built from --data-path, --split and --seed", "drop it (a data-metric curriculum takes the analyzer's files in the ds_config)")},
      {"--train-shuffle-idx-path", refused("--train-shuffle-idx-path", true, "Megatron's .npy sample-index files are not read: the index is built from --data-path, --split and --seed", "drop it (a data-metric curriculum takes the analyzer's files in the ds_config)")},
  };
  for (const auto& [name, spec] : compat)
    if (!t.emplace(name, spec).second) throw Error("internal: flag " + name + " is defined twice");  // each flag has one meaning
}

void finalize_samples(TrainConfig& c, int dp) {
  if (c.lr_warmup_fraction != -1 && !(c.lr_warmup_fraction >= 0 && c.lr_warmup_fraction <= 1))
    throw config_error("--lr-warmup-fraction", "--lr-warmup-fraction must be in [0, 1]");
  if (c.lr_warmup_fraction >= 0 && (c.lr_warmup_iters > 0 || c.lr_warmup_samples > 0 || c.lr_warmup_tokens > 0))
    throw config_error("--lr-warmup-fraction", "--lr-warmup-fraction and another warmup length are both given", "give one of them");
  if (c.train_samples == 0) {
    // Megatron's rule: the batch ramps by samples, so the run must count in samples.
    if (c.rampup.on())
      throw config_error("--rampup-batch-size", "--rampup-batch-size ramps the batch by consumed samples: it needs a sample-based run",
                         "give --train-samples (with --lr-warmup-samples / --lr-decay-samples) instead of --train-iters");
    for (auto [v, flag] : {std::pair<long long, const char*>{c.lr_warmup_samples, "--lr-warmup-samples"}, {c.lr_decay_samples, "--lr-decay-samples"}})
      if (v > 0) throw config_error(flag, std::string(flag) + " belongs to sample-based runs, but --train-samples is not given",
                                    "give --train-samples (and no --train-iters), or use the -iters flags");
    return;
  }
  // Megatron's rule: a run counts in iterations or in samples, not both.
  if (c.train_iters > 0)
    throw config_error("--train-samples", "--train-samples and --train-iters both set the run's length", "give one of them");
  for (auto [v, flag] : {std::pair<long long, const char*>{c.lr_warmup_iters, "--lr-warmup-iters"}, {c.lr_decay_iters, "--lr-decay-iters"}})
    if (v > 0) throw config_error(flag, std::string(flag) + " belongs to iteration-based runs, but --train-samples is given",
                                  "use --lr-warmup-samples / --lr-decay-samples");
  if (c.lr_style >= LrStyle::ds_warmup)
    throw config_error("--train-samples", "--train-samples schedules Megatron's --lr-decay-style, not the ds_config's scheduler block",
                       "remove the ds_config's scheduler, or give --train-iters");
  if (c.rampup.on() && !c.metric_curricula.empty())
    throw config_error("--rampup-batch-size", "--rampup-batch-size with the data-metric curriculum: its sampler draws whole global batches",
                       "drop one of them");
  c.train_iters = BatchSchedule(c.global_batch, (long long)c.micro_batch * dp, c.rampup).iterations_for(c.train_samples);
  if (c.train_iters <= 0)
    throw config_error("--train-samples", "--train-samples " + std::to_string(c.train_samples) + " is less than one global batch (" +
                                              std::to_string(c.global_batch) + ")");
  if (c.lr_decay_samples == 0) c.lr_decay_samples = c.train_samples;
  if (c.lr_warmup_samples > c.lr_decay_samples)
    throw config_error("--lr-warmup-samples", "--lr-warmup-samples " + std::to_string(c.lr_warmup_samples) +
                                                  " exceeds the decay's " + std::to_string(c.lr_decay_samples));
}

}  // namespace hpct::engine::detail
