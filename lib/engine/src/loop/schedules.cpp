#include "hpct/engine/loop/schedules.hpp"

#include <algorithm>
#include <cmath>

#include "hpct/core/error.hpp"

namespace hpct::engine {

double learning_rate(const TrainConfig& c, long long step, double tokens, double warmup_end_tokens, double samples) {
  const double Wds = (double)c.lr_warmup_iters;
  const double t = (double)step;
  switch (c.lr_style) {
    case LrStyle::ds_warmup:
    case LrStyle::ds_warmup_decay: {
      // DeepSpeed WarmupLR / WarmupDecayLR (lr_schedules.py): warmup_num_steps is forced >= 2.
      double Wd = std::max(2.0, Wds);
      double gamma = 1.0;
      if (t < Wd) gamma = c.ds_warmup_log ? std::log(t + 1) / std::log(Wd) : t / Wd;
      else if (c.lr_style == LrStyle::ds_warmup_decay) {
        double T = (double)c.lr_decay_iters;
        gamma = std::max(0.0, (T - t) / std::max(1.0, T - Wd));
      }
      return c.ds_warmup_min_lr + (c.ds_warmup_max_lr - c.ds_warmup_min_lr) * gamma;
    }
    case LrStyle::ds_warmup_cosine: {
      double Wd = std::max(2.0, Wds);
      double ratio;
      if (t < Wd) {
        double gamma = c.ds_warmup_log ? std::log(t + 1) / std::log(Wd) : t / Wd;
        ratio = c.ds_warmup_min_ratio + gamma * (1 - c.ds_warmup_min_ratio);
      } else {
        double s = t - Wd + 1, S = (double)c.lr_decay_iters - Wd;
        ratio = std::max(0.0, c.ds_cos_min_ratio + (1 - c.ds_cos_min_ratio) * (1 + std::cos(M_PI * s / std::max(1.0, S))) / 2);
      }
      return c.lr * ratio;
    }
    default:
      break;
  }
  // Megatron's OptimizerParamScheduler: linear warmup from 0, then decay to min_lr. It counts in
  // samples, (step + 1) x global batch after the step being taken; an iteration-based run's
  // lengths are iterations x global batch, so there the unit is the iteration.
  const bool by_samples = c.train_samples > 0;
  const double it = by_samples ? (samples >= 0 ? samples : (t + 1) * double(c.global_batch)) : t + 1;
  const double W = by_samples ? (double)c.lr_warmup_samples : (double)c.lr_warmup_iters;
  if (c.lr_warmup_tokens > 0) {
    if (tokens <= c.lr_warmup_tokens) return c.lr * tokens / c.lr_warmup_tokens;
  } else if (W > 0 && it <= W) {
    return c.lr * it / W;
  }
  if (c.lr_style == LrStyle::constant) return c.lr;
  if (c.lr_decay_tokens > 0) {  // Megatron-DeepSpeed's token-wise decay, from the warmup's end
    const double Dt = (double)c.lr_decay_tokens;
    if (tokens > Dt) return c.min_lr;
    const double Wt = c.lr_warmup_tokens > 0 ? (double)c.lr_warmup_tokens : warmup_end_tokens;
    if (c.lr_style == LrStyle::inverse_square_root)
      return std::max(c.min_lr, c.lr * std::sqrt(std::max(1.0, Wt)) / std::sqrt(std::max(tokens, 1.0)));
    const double ratio = std::clamp((tokens - Wt) / std::max(1.0, Dt - Wt), 0.0, 1.0);
    const double coeff = c.lr_style == LrStyle::cosine ? 0.5 * (std::cos(M_PI * ratio) + 1.0) : 1.0 - ratio;
    return c.min_lr + coeff * (c.lr - c.min_lr);
  }
  const double D = by_samples ? (double)c.lr_decay_samples : (double)c.lr_decay_iters;
  if (it > D) return c.min_lr;
  if (c.lr_style == LrStyle::inverse_square_root) {
    double w = std::max(1.0, W);
    return std::max(c.min_lr, c.lr * std::sqrt(w) / std::sqrt(std::max(it, w)));
  }
  double ratio = (it - W) / std::max(1.0, D - W);
  ratio = std::clamp(ratio, 0.0, 1.0);
  double coeff = c.lr_style == LrStyle::cosine ? 0.5 * (std::cos(M_PI * ratio) + 1.0) : 1.0 - ratio;
  return c.min_lr + coeff * (c.lr - c.min_lr);
}

LossScaler::LossScaler(const LossScaleConfig& cfg, bool enabled) : cfg_(cfg) {
  if (!enabled) return;
  dynamic_ = cfg.static_scale == 0;
  scale_ = dynamic_ ? std::ldexp(1.0, cfg.initial_scale_power) : cfg.static_scale;
  hysteresis_left_ = cfg.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!overflow) {
    if (dynamic_ && ++good_steps_ >= cfg_.window) {
      scale_ *= 2;
      good_steps_ = 0;
      hysteresis_left_ = cfg_.hysteresis;
    }
    return true;
  }
  if (!dynamic_) return false;  // a static scale skips the step and keeps its value
  good_steps_ = 0;
  if (--hysteresis_left_ > 0) return false;
  if (scale_ <= cfg_.min_scale)
    throw Error("Current loss scale already at minimum (" + std::to_string(cfg_.min_scale) +
                "): the fp16 gradients overflow at every step", Error::Context{"", "fp16.min_loss_scale",
                "lower --lr, use --bf16, or lower min_loss_scale"});
  scale_ = std::max(cfg_.min_scale, scale_ / 2);
  hysteresis_left_ = cfg_.hysteresis;
  return false;
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_}, {"good_steps", good_steps_}, {"hysteresis_left", hysteresis_left_}, {"dynamic", dynamic_}};
}

std::string LossScaler::state_error(const nlohmann::json& st) {
  if (st.is_null()) return "";
  if (!st.is_object()) return "is not a JSON object";
  if (!st.contains("scale") || !st["scale"].is_number() || !(st["scale"].get<double>() > 0) ||
      !std::isfinite(st["scale"].get<double>()))
    return "needs a positive finite 'scale'";
  for (const char* k : {"good_steps", "hysteresis_left"})
    if (!st.contains(k) || !st[k].is_number_integer() || st[k].get<long long>() < 0 || st[k].get<long long>() > INT32_MAX)
      return std::string("needs a non-negative integer '") + k + "'";
  return "";
}

void LossScaler::restore(const nlohmann::json& st) {
  if (auto e = state_error(st); !e.empty()) throw Error("loss-scaler state " + e);
  if (st.is_null()) return;
  // Only a dynamic scaler carries state from run to run: a static or disabled one (bf16, fp32) keeps
  // its configured scale, and a dynamic one starts afresh from a run that had none (a precision
  // change at a resume or a --finetune-resume-optimizer start).
  if (!dynamic_ || !st.value("dynamic", false)) return;
  scale_ = st.at("scale").get<double>();
  good_steps_ = st.at("good_steps").get<int>();
  hysteresis_left_ = st.at("hysteresis_left").get<int>();
}

}  // namespace hpct::engine
