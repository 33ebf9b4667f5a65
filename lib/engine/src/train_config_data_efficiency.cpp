// Data-efficiency flags -> TrainConfig: the curriculum switch and Megatron-DeepSpeed's token-based
// learning-rate schedule. See train_config.hpp and docs/data-efficiency.md.
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
      {"--train-tokens", {true, tokens(&TrainConfig::train_tokens, "--train-tokens"), "stop (and save) once this many tokens are consumed; --train-iters stays the upper bound"}},
  });
}

void finalize_data_efficiency(TrainConfig& c) {
  c.curriculum.validate(c.model.max_seq_length, c.ds_config_path);
  if (c.curriculum_flag && !c.curriculum.enabled)
    throw config_error("--data-efficiency-curriculum-learning",
                       "--data-efficiency-curriculum-learning needs an enabled curriculum in the ds_config",
                       "set data_efficiency.data_sampling.curriculum_learning (seqlen_truncate) or curriculum_learning "
                       "in the --deepspeed_config file (docs/data-efficiency.md)");
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

}  // namespace hpct::engine::detail
