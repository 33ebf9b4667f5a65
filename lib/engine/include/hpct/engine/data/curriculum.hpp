// hpct/engine/data/curriculum.hpp — sequence-length warmup (DeepSpeed's curriculum learning by seqlen).
//
// Each training step trains on its samples truncated to the scheduled length: tokens[:L] and their
// next-token targets (Megatron-DeepSpeed's seqlen_truncate; Li, Zhang, He 2022). The schedule is
// DeepSpeed's CurriculumScheduler, as a pure function of the iteration (so a resume anywhere is
// exact):
//   fixed_root:     d(s) = floor((s / total_curriculum_step)^(1/root_degree) * (max - min) + min),
//                   rounded down to a multiple of difficulty_step, capped at max;
//   fixed_linear:   fixed_root with root_degree 1;
//   fixed_discrete: difficulty[i] while s <= max_step[i], difficulty[last] after max_step[last]
//                   (difficulty has one entry more than max_step);
// where s = iteration + 1 (DeepSpeed updates with global_steps + 1 before each step), and once a
// step reaches max_difficulty the length stays there (DeepSpeed stops updating). Evaluation always
// runs at the full --seq-length.
//
// From the ds_config's legacy "curriculum_learning" block (curriculum_type "seqlen") or from
// "data_efficiency": {"data_sampling": {"curriculum_learning": {"curriculum_metrics":
// {"seqlen_truncate": {...}}}}} (docs/data-efficiency.md). Metric-based curricula (the analyzer's
// index files) are not built yet and are refused by key.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/core/json_config.hpp"
#include "hpct/engine/data/random_ltd.hpp"

namespace hpct::engine {

struct CurriculumConfig {
  bool enabled = false;
  std::string key;  // where it came from in the ds_config ("curriculum_learning" or the metric's path)
  std::string schedule_type = "fixed_linear";  // fixed_linear | fixed_root | fixed_discrete
  int min_difficulty = 0, max_difficulty = 0;
  long long total_curriculum_step = 0;
  int difficulty_step = 1;
  double root_degree = 1;
  std::vector<int> difficulty;       // fixed_discrete
  std::vector<long long> max_step;   // fixed_discrete: one fewer than difficulty

  /// DeepSpeed's get_difficulty(global_steps) for this schedule.
  int difficulty_at(long long global_steps) const;
  /// The sequence length iteration `it` (0-based) trains on, of a full length `full` (capped there).
  int seqlen(long long it, int full) const;
  /// Checks the schedule against the model's full length; throws naming the file and key.
  void validate(int full, const std::string& file) const;
};

struct MetricCurriculumConfig;  // data_sampling.hpp

namespace detail {
/// ds_config's "curriculum_learning" and "data_efficiency" blocks into cfg and ltd (keys as
/// DeepSpeed's; unknown or unsupported keys are errors naming the key).
void apply_ds_data_efficiency(JsonSection& root, const nlohmann::json& raw, CurriculumConfig& cfg, RandomLtdConfig& ltd,
                              std::vector<MetricCurriculumConfig>& metric_cfgs);
}  // namespace detail

}  // namespace hpct::engine
