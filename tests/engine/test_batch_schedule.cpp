// --rampup-batch-size (Megatron's RampupBatchsizeNumMicroBatches): the batch of every iteration,
// the iteration count of a sample-based run, the learning rate over a ramp, and the flag's errors.
// Hand values: global batch 16, micro-batch x data-parallel 2, ramp 4 4 40: 3 increments, one every
// 40/3 = 13.33 samples; the step after c consumed samples takes 4 + floor(c / 13.33) x 4 (16 once
// c > 40): batches 4 4 4 4 8 8 12 16 16 ..., consumed 0 4 8 12 16 24 32 44 60 ...
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/engine/data/batch_schedule.hpp"
#include "hpct/engine/loop/schedules.hpp"
#include "hpct/engine/config/train_config.hpp"

using namespace hpct;
using namespace hpct::engine;

TEST(BatchSchedule, RampHandValues) {
  const BatchSchedule b(16, 2, {4, 4, 40});
  ASSERT_TRUE(b.ramps());
  const std::vector<long long> batches = {4, 4, 4, 4, 8, 8, 12, 16, 16, 16};
  const std::vector<long long> consumed = {0, 4, 8, 12, 16, 24, 32, 44, 60, 76};
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(b.batch_of(i), batches[i]) << "iteration " << i;
    EXPECT_EQ(b.consumed_before(i), consumed[i]) << "iteration " << i;
  }
  EXPECT_EQ(b.micro_steps(0), 2);
  EXPECT_EQ(b.micro_steps(7), 8);
  // Megatron's count: the ramp loop runs while consumed <= 40 (7 steps, 44 samples), then
  // (100 - 44) / 16 = 3 whole batches.
  EXPECT_EQ(b.iterations_for(100), 10);
  EXPECT_THROW(b.iterations_for(30), Error);  // ends inside the ramp
  EXPECT_EQ(b.describe(), "ramped from 4 by 4 over 40 samples (7 steps) to 16");
  // No ramp: iteration x batch.
  const BatchSchedule fixed(16, 2);
  EXPECT_FALSE(fixed.ramps());
  EXPECT_EQ(fixed.consumed_before(5), 80);
  EXPECT_EQ(fixed.iterations_for(100), 6);
  EXPECT_FALSE(BatchSchedule(16, 2, {16, 4, 40}).ramps()) << "start = global batch: nothing to ramp";
}

// A recipe-sized ramp (GPT-3 style: 32 -> 1536 by 32 over 6M samples, micro x dp 32) against a
// direct transcription of Megatron's update loop.
TEST(BatchSchedule, MatchesMegatronsLoopOnARecipeRamp) {
  const long long GB = 1536, start = 32, inc = 32, samples = 6000000;
  const BatchSchedule b(GB, 32, {start, inc, samples});
  const double per_inc = double(samples) / double((GB - start) / inc);
  long long c = 0;
  for (long long it = 0; it < 5000; ++it) {
    const long long want = c > samples ? GB : start + static_cast<long long>(c / per_inc) * inc;
    ASSERT_EQ(b.consumed_before(it), c) << "iteration " << it;
    ASSERT_EQ(b.batch_of(it), want) << "iteration " << it;
    c += want;
  }
}

// Sample-based learning rate over the ramp: the n-th step counts the first n batches' samples.
// lr 1, min 0, warmup 20 samples, linear decay to 100.
TEST(BatchSchedule, LearningRateCountsTheRampedSamples) {
  TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.0;
  c.lr_style = LrStyle::linear;
  c.train_samples = 100;
  c.lr_warmup_samples = 20;
  c.lr_decay_samples = 100;
  c.global_batch = 16;
  const BatchSchedule b(16, 2, {4, 4, 40});
  auto lr = [&](long long step) { return learning_rate(c, step, 0, 0, double(b.consumed_before(step + 1))); };
  EXPECT_DOUBLE_EQ(lr(0), 4.0 / 20);   // 4 samples through step 1
  EXPECT_DOUBLE_EQ(lr(3), 16.0 / 20);  // 16
  EXPECT_DOUBLE_EQ(lr(4), 1.0 - (24.0 - 20) / 80);  // 24: decaying
  EXPECT_DOUBLE_EQ(lr(6), 1.0 - (44.0 - 20) / 80);  // 44
}

namespace {
std::string error_of(std::vector<std::string> extra, TrainConfig* out = nullptr, int dp = 2) {
  std::vector<std::string> a = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
                                "--micro-batch-size", "1", "--global-batch-size", "16", "--lr", "1e-3", "--mock-data",
                                "--vocab-size", "100"};
  a.insert(a.end(), extra.begin(), extra.end());
  try {
    TrainConfig c;
    parse_args(a, c);
    c.finalize(dp);
    if (out) *out = c;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(BatchSchedule, FlagsAndTheirErrors) {
  TrainConfig c;
  ASSERT_EQ(error_of({"--train-samples", "100", "--rampup-batch-size", "4", "4", "40"}, &c), "");
  EXPECT_EQ(c.train_iters, 10);
  EXPECT_EQ(c.rampup.start, 4);
  EXPECT_TRUE(has(error_of({"--train-iters", "10", "--rampup-batch-size", "4", "4", "40"}), "--rampup-batch-size ramps the batch by consumed samples: it needs a sample-based run"));
  EXPECT_TRUE(has(error_of({"--train-samples", "100", "--rampup-batch-size", "4", "4"}), "--rampup-batch-size takes three values"));
  EXPECT_TRUE(has(error_of({"--train-samples", "100", "--rampup-batch-size", "4", "5", "40"}), "minus the start batch is not a multiple of the increment"));
  EXPECT_TRUE(has(error_of({"--train-samples", "100", "--rampup-batch-size", "3", "1", "40"}), "multiples of --micro-batch-size x data-parallel size = 2"));
  EXPECT_TRUE(has(error_of({"--train-samples", "100", "--rampup-batch-size", "32", "4", "40"}), "the start batch exceeds --global-batch-size 16"));
  EXPECT_TRUE(has(error_of({"--train-samples", "100", "--rampup-batch-size", "0", "4", "40"}), "--rampup-batch-size 0 must be >= 1"));
}
