// Learning-rate schedules against the formulas of Megatron and DeepSpeed (reference §1.4), and the
// dynamic loss scaler's state machine.
#include <gtest/gtest.h>

#include <cmath>

#include "hpct/core/error.hpp"
#include "hpct/engine/loop/schedules.hpp"

using namespace hpct::engine;

static TrainConfig sched(LrStyle s) {
  TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.lr_warmup_iters = 10;
  c.lr_decay_iters = 110;
  c.lr_style = s;
  return c;
}

TEST(LrSchedule, MegatronWarmupThenCosine) {
  auto c = sched(LrStyle::cosine);
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.1);   // step 1 of 10
  EXPECT_DOUBLE_EQ(learning_rate(c, 9), 1.0);   // end of warmup
  EXPECT_NEAR(learning_rate(c, 59), 0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.5) + 1), 1e-12);  // half way
  EXPECT_NEAR(learning_rate(c, 109), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(c, 500), 0.1);
}
TEST(LrSchedule, MegatronLinear) {
  auto c = sched(LrStyle::linear);
  EXPECT_NEAR(learning_rate(c, 59), 0.55, 1e-12);
}
TEST(LrSchedule, DeepSpeedWarmupDecayLinearWarmup) {
  auto c = sched(LrStyle::ds_warmup_decay);
  c.ds_warmup_min_lr = 0;
  c.ds_warmup_max_lr = 1;
  c.ds_warmup_log = false;
  EXPECT_DOUBLE_EQ(learning_rate(c, 5), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 60), 0.5);  // (110-60)/(110-10)
}
TEST(LrSchedule, DeepSpeedWarmupLogDefault) {
  auto c = sched(LrStyle::ds_warmup);
  c.ds_warmup_min_lr = 0;
  c.ds_warmup_max_lr = 1;
  EXPECT_NEAR(learning_rate(c, 4), std::log(5.0) / std::log(10.0), 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(c, 1000), 1.0);
}

// Megatron-DeepSpeed's token-based schedule (OptimizerParamScheduler with lr_warmup_tokens /
// lr_decay_tokens): warmup lr * tokens / warmup_tokens, then decay over (tokens - warmup end) /
// (decay_tokens - warmup end), min_lr past decay_tokens; the step count no longer matters.
TEST(LrSchedule, TokenWarmupAndDecay) {
  auto c = sched(LrStyle::cosine);
  c.lr_warmup_iters = 0;
  c.lr_warmup_tokens = 1000;
  c.lr_decay_tokens = 11000;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, 250), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(c, 7, 1000), 1.0);
  EXPECT_NEAR(learning_rate(c, 3, 6000), 0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.5) + 1), 1e-12);  // half way
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, 11001), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(c, 500, 6000), learning_rate(c, 5, 6000));  // steps do not count
  c.lr_style = LrStyle::linear;
  EXPECT_NEAR(learning_rate(c, 3, 3500), 1.0 - 0.9 * 0.25, 1e-12);
}
TEST(LrSchedule, StepWarmupThenTokenDecay) {
  auto c = sched(LrStyle::linear);  // warmup 10 steps
  c.lr_decay_tokens = 10000;
  EXPECT_DOUBLE_EQ(learning_rate(c, 4, 123, 2000), 0.5);  // step-based warmup
  // Decay from the 2000 tokens the warmup's steps consumed: a quarter of the way at 4000.
  EXPECT_NEAR(learning_rate(c, 20, 4000, 2000), 1.0 - 0.9 * 0.25, 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(c, 20, 10001, 2000), 0.1);
}

TEST(LossScaler, HysteresisThenHalve) {
  LossScaleConfig lc;
  lc.initial_scale_power = 4;
  lc.hysteresis = 2;
  lc.window = 3;
  LossScaler s(lc, true);
  EXPECT_EQ(s.scale(), 16);
  EXPECT_FALSE(s.update(true));  // first overflow: tolerated by hysteresis, step skipped
  EXPECT_EQ(s.scale(), 16);
  EXPECT_FALSE(s.update(true));  // second: halve
  EXPECT_EQ(s.scale(), 8);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));  // window of 3 clean steps: double
  EXPECT_EQ(s.scale(), 16);
}
// A stored state moves between dynamic scalers only: a precision change (fp16 <-> bf16/fp32) at a
// resume or a --finetune-resume-optimizer start keeps the new run's configured scale.
TEST(LossScaler, RestoresOnlyBetweenDynamicScalers) {
  LossScaleConfig lc;
  lc.initial_scale_power = 16;
  LossScaler bf16(lc, false);
  const nlohmann::json dyn = {{"scale", 1024.0}, {"good_steps", 3}, {"hysteresis_left", 1}, {"dynamic", true}};
  const nlohmann::json none = bf16.state();  // scale 1, not dynamic
  LossScaler a(lc, true), b(lc, true), c(lc, false);
  a.restore(dyn);
  EXPECT_EQ(a.scale(), 1024.0);
  b.restore(none);
  EXPECT_EQ(b.scale(), 65536.0) << "an fp16 run must not take a bf16 run's scale of 1";
  c.restore(dyn);
  EXPECT_EQ(c.scale(), 1.0) << "a bf16 run must not take an fp16 run's scale";
}

TEST(LossScaler, MinimumIsAnError) {
  LossScaleConfig lc;
  lc.initial_scale_power = 0;
  lc.hysteresis = 1;
  lc.min_scale = 1;
  LossScaler s(lc, true);
  try {
    s.update(true);
    FAIL() << "expected an error at the minimum scale";
  } catch (const hpct::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Current loss scale already at minimum"), std::string::npos);
  }
}
