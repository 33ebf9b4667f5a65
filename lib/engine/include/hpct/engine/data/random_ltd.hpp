// hpct/engine/data/random_ltd.hpp — random-LTD's schedule and configuration (DeepSpeed's
// data_efficiency.data_routing.random_ltd; Yao et al., "Random-LTD", 2022).
//
// In training, the chosen layers (by default every layer but the first and the last) run on a
// random sorted subset of `kept` tokens per sample (model/gpt.hpp: set_random_ltd_layers); the
// others, and evaluation, see every token. The kept count is DeepSpeed's RandomLTDScheduler
// (fixed_linear), a pure function of the iteration it (0-based; DeepSpeed updates it with
// global_steps before each forward):
//   kept(it) = min(max_value, r - r % seq_per_step),  r = floor(it / require_steps * (max - min) + min)
// capped at the step's sequence length (sequence-length warmup may shorten it). A step consumes
// global_batch * (kept * Lr + T * (L - Lr)) layer-tokens (L layers, Lr of them dropping): DeepSpeed's
// consumed_layer_tokens. Megatron-DeepSpeed feeds the effective tokens, layer-tokens / L, to its
// token-based learning rate and --train-tokens; so does the trainer. The layer-token LR schedule
// that DeepSpeed leaves unimplemented (layer_token_lr_schedule) is built: warmup over
// warmup_layer_tokens and the run's decay style over total_layer_tokens, by consumed layer-tokens.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/core/json_config.hpp"

namespace hpct::engine {

struct RandomLtdConfig {
  bool enabled = false;
  std::string key;               // where it came from in the ds_config, for messages
  int total_layer_num = 0;       // 0: not given (else it must equal --num-layers)
  std::vector<int> layer_ids;    // random_ltd_layer_id, 0-based; empty: every layer but the first and last
  bool layer_num_given = false;  // random_ltd_layer_num was given (it must match layer_ids)
  int layer_num = 0;
  int min_value = 0, max_value = 0;
  long long require_steps = 0;
  int seq_per_step = 1;
  int global_batch_size = 0, micro_batch_size = 0;  // 0: not given (else they must equal the run's)
  // layer_token_lr_schedule (DeepSpeed raises NotImplementedError for it; built here)
  bool layer_token_lr = false;
  long long total_layer_tokens = 0, warmup_layer_tokens = 0;

  /// DeepSpeed's get_value(global_steps): the kept tokens of iteration `it`, before any cap.
  int kept_at(long long it) const;
  /// The tokens per sample the dropping layers keep at iteration it of a T-token step (T when off).
  int kept(long long it, int T) const { return enabled ? std::min(kept_at(it), T) : T; }
  /// The layers that drop tokens, 0-based (the configured ids, or 1 .. L-2), for an L-layer model.
  std::vector<int> layers(int num_layers) const;
  /// Layer-tokens of one step: global_batch * (kept * Lr + T * (L - Lr)).
  long long step_layer_tokens(long long it, int T, int num_layers, long long global_batch) const;
  /// Checks the block against the model and the run; throws naming the file and key.
  void validate(int num_layers, int seq_length, int global_batch, int micro_batch, const std::string& file) const;
};

namespace detail {
/// ds_config's data_efficiency.data_routing block into cfg (keys as DeepSpeed's; unknown keys and
/// values this version cannot honour are errors naming the key). de_on: data_efficiency.enabled.
void apply_ds_random_ltd(JsonSection& data_routing, const nlohmann::json& raw, bool de_on, RandomLtdConfig& cfg);
}  // namespace detail

}  // namespace hpct::engine
