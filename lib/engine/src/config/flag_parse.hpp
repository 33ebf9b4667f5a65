// Private to lib/engine: the flag table's entry type and value parsers, shared by train_config.cpp
// (model, batch, optimizer, data, checkpoint flags) and train_config_records.cpp (run records).
#pragma once
#include <climits>
#include <functional>
#include <map>
#include <string>

#include "hpct/core/json_config.hpp"
#include "hpct/engine/config/train_config.hpp"

namespace hpct::engine::detail {

struct FlagSpec {
  bool takes_value;
  std::function<void(TrainConfig&, const std::string&)> apply;
  const char* help;
  bool many = false;  // takes every following value up to the next flag (argparse nargs='+'), space-joined
};
using FlagTable = std::map<std::string, FlagSpec>;

/// Parsers that throw config_error naming the flag: integers (1e9 accepted, never wrapped), numbers.
long long to_int(const std::string& flag, const std::string& v);
int to_i32(const std::string& flag, const std::string& v, long long min = INT_MIN);
long long to_int_min(const std::string& flag, const std::string& v, long long min);
double to_double(const std::string& flag, const std::string& v);

/// --tensorboard-dir and Megatron's --log-*-to-tensorboard flags, --timing-log-level, --skip-train.
void add_run_record_flags(FlagTable& table);
/// ds_config's wall_clock_breakdown, tensorboard and csv_monitor blocks (keys as DeepSpeed's).
void apply_ds_monitors(JsonSection& root, TrainConfig& cfg);
/// activation_checkpointing, checkpoint, data_types, gradient_predivide_factor, memory_breakdown,
/// flops_profiler, comms_logger, wandb, comet (train_config_ds_runtime.cpp).
void apply_ds_runtime_sections(JsonSection& root, const nlohmann::json& j, TrainConfig& cfg);
/// --data-efficiency-curriculum-learning, --lr-warmup-tokens, --lr-decay-tokens, --train-tokens.
void add_data_efficiency_flags(FlagTable& table);
/// --finetune, --load-hf, --prompt-key, --response-key, --eval-only (train_config_finetune.cpp).
void add_finetune_flags(FlagTable& table);
/// Megatron-DeepSpeed's flags that change nothing here, aliases, sample-based runs, refusals by
/// name (train_config_compat.cpp; docs/compatibility.md).
void add_compat_flags(FlagTable& table);
/// --train-samples and its schedule flags: Megatron's combination rules, train_iters from samples.
void finalize_samples(TrainConfig& cfg, int dp);
/// Their checks (and the curriculum's), from TrainConfig::finalize.
void finalize_data_efficiency(TrainConfig& cfg);
/// random-LTD's checks against the model, the batch and the learning-rate flags (after the batch sizes).
void finalize_random_ltd(TrainConfig& cfg);
/// The data-efficiency blocks of config_to_json: curriculum, metric_curriculum, random_ltd.
void data_efficiency_json(const TrainConfig& c, nlohmann::json& j);

}  // namespace hpct::engine::detail
