// Data-efficiency flags -> TrainConfig: the curriculum switch and Megatron-DeepSpeed's token-based
// learning-rate schedule. See train_config.hpp and docs/data-efficiency.md.
#include <cstdint>
#include <string>

#include "flag_parse.hpp"
#include "hpct/core/error.hpp"

namespace hpct::engine::detail {

void add_data_efficiency_flags(FlagTable& t) {
  auto tokens = [](long long TrainConfig::*field, const char* flag) {
    return [field, flag](TrainConfig& c, const std::string& v) { c.*field = to_int_min(flag, v, 1); };
  };
  t.insert({
      {"--data-efficiency-curriculum-learning", {false, [](TrainConfig& c, const std::string&) { c.curriculum_flag = true; }, "Megatron-DeepSpeed's switch for the ds_config's data_efficiency curriculum (sequence-length warmup; docs/data-efficiency.md)"}},
      {"--lr-warmup-tokens", {true, tokens(&TrainConfig::lr_warmup_tokens, "--lr-warmup-tokens"), "linear warmup over this many consumed tokens (instead of --lr-warmup-iters)"}},
      {"--lr-decay-tokens", {true, tokens(&TrainConfig::lr_decay_tokens, "--lr-decay-tokens"), "decay over consumed tokens (instead of iterations): what sequence-length warmup is paired with"}},
      {"--random-ltd", {false, [](TrainConfig& c, const std::string&) { c.random_ltd_flag = true; }, "Megatron-DeepSpeed's switch for the ds_config's data_efficiency.data_routing.random_ltd (random layerwise token dropping; docs/data-efficiency.md)"}},
      {"--train-tokens", {true, tokens(&TrainConfig::train_tokens, "--train-tokens"), "stop (and save) once this many tokens are consumed; --train-iters stays the upper bound"}},
  });
}

void finalize_data_efficiency(TrainConfig& c) {
  c.curriculum.validate(c.model.max_seq_length, c.ds_config_path);
  for (const auto& m : c.metric_curricula) {
    m.schedule.validate(INT32_MAX, c.ds_config_path);  // a metric's difficulty is not a length
    m.validate(c.ds_config_path);
  }
  if (c.curriculum_flag && !c.curriculum.enabled && c.metric_curricula.empty())
    throw config_error("--data-efficiency-curriculum-learning",
                       "--data-efficiency-curriculum-learning needs an enabled curriculum in the ds_config",
                       "set data_efficiency.data_sampling.curriculum_learning (seqlen_truncate) or curriculum_learning "
                       "in the --deepspeed_config file (docs/data-efficiency.md)");
  if (!c.metric_curricula.empty() && (c.data_path.size() > 1 || !c.train_data_path.empty()))
    throw config_error(c.data_path.size() > 1 ? "--data-path" : "--train-data-path",
                       "a data-metric curriculum samples one analysed dataset, not a blend",
                       "give --data-path PREFIX (the dataset analyze_data indexed)");
  if (c.lr_warmup_tokens > 0 && c.lr_warmup_iters > 0)
    throw config_error("--lr-warmup-tokens", "--lr-warmup-tokens and --lr-warmup-iters both set the warmup",
                       "give one of them");
  const bool megatron_style = c.lr_style == LrStyle::constant || c.lr_style == LrStyle::linear ||
                              c.lr_style == LrStyle::cosine || c.lr_style == LrStyle::inverse_square_root;
  if (!megatron_style && (c.lr_warmup_tokens > 0 || c.lr_decay_tokens > 0))
    throw config_error(c.lr_warmup_tokens > 0 ? "--lr-warmup-tokens" : "--lr-decay-tokens",
                       "token-based warmup and decay apply to Megatron's --lr-decay-style schedules, not to the "
                       "ds_config's scheduler block",
                       "remove the ds_config's scheduler, or the token flags");
  if (c.lr_decay_tokens > 0 && c.lr_warmup_tokens >= c.lr_decay_tokens)
    throw config_error("--lr-decay-tokens", "--lr-decay-tokens " + std::to_string(c.lr_decay_tokens) +
                                                " must exceed --lr-warmup-tokens " + std::to_string(c.lr_warmup_tokens));
}

void finalize_random_ltd(TrainConfig& c) {
  const RandomLtdConfig& r = c.random_ltd;
  if (c.random_ltd_flag && !r.enabled)
    throw config_error("--random-ltd", "--random-ltd needs an enabled random_ltd block in the ds_config",
                       "set data_efficiency.enabled, data_efficiency.data_routing.enabled and "
                       "data_efficiency.data_routing.random_ltd.enabled in the --deepspeed_config file (docs/data-efficiency.md)");
  if (!r.enabled) return;
  r.validate(c.model.num_layers, c.model.max_seq_length, c.global_batch, c.micro_batch, c.ds_config_path);
  // The kept sub-batch splits over the ranks too: every kept length is a multiple of seq_per_step
  // or max_value (the full length already splits).
  if (c.model.sequence_parallel && c.model.tensor_parallel > 1)
    for (long long kept : {(long long)r.seq_per_step, (long long)r.max_value})
      if ((long long)c.micro_batch * kept % c.model.tensor_parallel != 0)
        throw config_error("--sequence-parallel", "with --sequence-parallel, --micro-batch-size " + std::to_string(c.micro_batch) +
                                                      " x random-LTD's " + (kept == r.seq_per_step ? "seq_per_step " : "max_value ") +
                                                      std::to_string(kept) + " must be a multiple of --tensor-model-parallel-size " +
                                                      std::to_string(c.model.tensor_parallel),
                           "each kept sub-batch is split over the sequence-parallel ranks; change " + r.key + " or the micro-batch");
  if (!r.layer_token_lr) return;
  const std::string key = r.key + ".layer_token_lr_schedule";
  for (auto [given, flag] : {std::pair{c.lr_warmup_tokens > 0, "--lr-warmup-tokens"}, std::pair{c.lr_decay_tokens > 0, "--lr-decay-tokens"},
                             std::pair{c.lr_warmup_iters > 0, "--lr-warmup-iters"}})
    if (given)
      throw config_error(flag, std::string(flag) + " and " + key + " both set the learning-rate clock",
                         "give warmup and decay in layer-tokens (warmup_layer_tokens, total_layer_tokens), or disable the "
                         "layer-token schedule");
  const bool megatron_style = c.lr_style == LrStyle::constant || c.lr_style == LrStyle::linear ||
                              c.lr_style == LrStyle::cosine || c.lr_style == LrStyle::inverse_square_root;
  if (!megatron_style)
    throw config_error(key, key + " follows Megatron's --lr-decay-style schedules, not the ds_config's scheduler block",
                       "remove the ds_config's scheduler");
}

namespace {
// A curriculum schedule's fields, as both curricula store them.
nlohmann::json schedule_json(const CurriculumConfig& s) {
  return {{"source", s.key},
          {"schedule_type", s.schedule_type},
          {"min_difficulty", s.min_difficulty},
          {"max_difficulty", s.max_difficulty},
          {"total_curriculum_step", s.total_curriculum_step},
          {"difficulty_step", s.difficulty_step},
          {"root_degree", s.root_degree}};
}
}  // namespace

void data_efficiency_json(const TrainConfig& c, nlohmann::json& j) {
  j["curriculum"] = nullptr;
  if (c.curriculum.enabled) {
    j["curriculum"] = schedule_json(c.curriculum);
    j["curriculum"]["difficulty"] = c.curriculum.difficulty;
    j["curriculum"]["max_step"] = c.curriculum.max_step;
  }
  j["metric_curriculum"] = nullptr;  // by metric name, as the ds_config's curriculum_metrics
  for (const MetricCurriculumConfig& m : c.metric_curricula) {
    nlohmann::json one = schedule_json(m.schedule);
    one.update({{"index_to_sample_path", m.index_to_sample_path},
                {"index_to_metric_path", m.index_to_metric_path},
                {"difficulty_type", m.difficulty_type},
                {"clustering_type", m.clustering_type}});
    j["metric_curriculum"][m.metric] = one;
  }
  const RandomLtdConfig& r = c.random_ltd;
  j["random_ltd"] = r.enabled ? nlohmann::json{{"source", r.key},
                                               {"layers", r.layers(c.model.num_layers)},
                                               {"min_value", r.min_value},
                                               {"max_value", r.max_value},
                                               {"require_steps", r.require_steps},
                                               {"seq_per_step", r.seq_per_step},
                                               {"layer_token_lr", r.layer_token_lr},
                                               {"total_layer_tokens", r.total_layer_tokens},
                                               {"warmup_layer_tokens", r.warmup_layer_tokens}}
                              : nlohmann::json(nullptr);
}

}  // namespace hpct::engine::detail
