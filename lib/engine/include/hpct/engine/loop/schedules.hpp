// hpct/engine/loop/schedules.hpp — learning-rate schedules (Megatron's and DeepSpeed's) and the fp16
// dynamic loss scaler. Both are pure state machines over the optimizer step, so their state in a
// checkpoint is a few numbers.
#pragma once
#include <nlohmann/json.hpp>
#include "hpct/engine/config/train_config.hpp"

namespace hpct::engine {

/// Learning rate for optimizer step `step` (0-based: the step about to be taken). With
/// --lr-warmup-tokens / --lr-decay-tokens (Megatron-DeepSpeed) warmup and decay follow `tokens`, the
/// tokens consumed through this step; warmup_end_tokens is where a step-based warmup ended in tokens.
/// samples: a sample-based run's count through this step (< 0: (step + 1) x the global batch;
/// with --rampup-batch-size the trainer passes the ramped batches' sum).
double learning_rate(const TrainConfig& cfg, long long step, double tokens = 0, double warmup_end_tokens = 0,
                     double samples = -1);

/// DeepSpeed/Megatron dynamic loss scaling: on overflow skip the step and (after `hysteresis`
/// overflows) halve the scale; after `window` clean steps double it. A static scale never moves.
class LossScaler {
 public:
  LossScaler() = default;
  LossScaler(const LossScaleConfig& cfg, bool enabled);
  double scale() const { return scale_; }
  /// Reports the outcome of a step; returns false when the step must be skipped. Throws when the
  /// scale would go below min_loss_scale (DeepSpeed: "Current loss scale already at minimum").
  bool update(bool overflow);
  /// The evolving part (scale, good steps, hysteresis left) for checkpoints.
  nlohmann::json state() const;
  /// Takes a stored state only when both this scaler and the stored one are dynamic (fp16 with
  /// dynamic scaling); otherwise keeps this one's configured start.
  void restore(const nlohmann::json& state);
  /// What is wrong with a stored state ("" if nothing): null, or an object with a finite positive
  /// "scale" and non-negative integers "good_steps" and "hysteresis_left".
  static std::string state_error(const nlohmann::json& state);

 private:
  LossScaleConfig cfg_;
  bool dynamic_ = false;
  double scale_ = 1;
  int good_steps_ = 0;
  int hysteresis_left_ = 0;
};

}  // namespace hpct::engine
