// Sequence-length warmup in training, under mpirun (1 or 2 ranks).
//
// - Pinned at the full length (min = max = --seq-length) it is the baseline, bitwise: losses and
//   weights (the same micro-batches, the same code path at the same T).
// - A warmup 4 -> 16 tokens trains step i on the scheduled length (recorded per step), counts the
//   consumed tokens at those lengths, and differs from the baseline from step 1 (truncation ran).
// - Stopped at iteration 4 and resumed from the checkpoint it equals the straight run, bitwise
//   (the schedule is a function of the iteration; the consumed tokens come back from the file).
// - On 2 ranks (data parallel, ZeRO-1) it equals the one-rank run within 1e-5 relative on every
//   loss: gradients are summed in MPI's order instead of one rank's (fp32 rounding, ~1e-7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "hpct/comm/process_grid.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"

using namespace hpct;
namespace fs = std::filesystem;

using test::world;

namespace {

engine::TrainConfig tiny(int iters, int lo = 0, int hi = 0) {
  engine::TrainConfig c = test::tiny_gpt(iters, 2, 4);  // seq 16
  c.lr_decay_iters = 10;
  if (lo > 0) {
    auto& cl = c.curriculum;
    cl.enabled = true;
    cl.key = "curriculum_learning";
    cl.schedule_type = "fixed_linear";
    cl.min_difficulty = lo, cl.max_difficulty = hi, cl.total_curriculum_step = 8, cl.difficulty_step = 4;
  }
  return c;
}

struct SlwRun {
  size_t act_start = 0, act_end = 0;  // the model's activation bytes before and after training
  std::vector<double> losses, lrs;
  std::string exit_reason;
  std::vector<int> seqlens;
  std::vector<float> params;
  long long tokens = 0;
  std::string loaded;
};

SlwRun train(engine::TrainConfig c, const comm::Communicator& comm) {
  comm::ProcessGrid grid(comm, 1, 1);
  c.finalize(grid.dp().size());
  io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
  engine::Trainer t(c, grid);
  SlwRun r;
  r.loaded = t.load_checkpoint();
  r.act_start = t.model().activation_bytes();
  auto s = t.train(data, nullptr);
  r.act_end = t.model().activation_bytes();
  for (auto& st : s.steps) r.losses.push_back(st.lm_loss), r.seqlens.push_back(st.seqlen), r.lrs.push_back(st.learning_rate);
  r.exit_reason = s.exit_reason;
  r.params = t.gather_params();
  r.tokens = t.consumed_tokens();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
}  // namespace

TEST(SequenceLengthWarmup, PinnedAtFullLengthIsTheBaselineBitwise) {
  const SlwRun base = train(tiny(6), world());
  const SlwRun pinned = train(tiny(6, 16, 16), world());
  ASSERT_EQ(pinned.losses.size(), base.losses.size());
  for (size_t i = 0; i < base.losses.size(); ++i) EXPECT_EQ(pinned.losses[i], base.losses[i]) << "step " << i + 1;
  EXPECT_TRUE(same_bits(pinned.params, base.params));
  EXPECT_EQ(pinned.tokens, 6 * 4 * 16);
}

TEST(SequenceLengthWarmup, TrainsAtTheScheduledLengths) {
  const SlwRun base = train(tiny(10), world());
  const SlwRun slw = train(tiny(10, 4, 16), world());
  // fixed_linear 4 -> 16 over 8 steps in multiples of 4: d(s) = floor(s/8 * 12 + 4) rounded down.
  const std::vector<int> want = {4, 4, 8, 8, 8, 12, 12, 16, 16, 16};
  EXPECT_EQ(slw.seqlens, want);
  long long tokens = 0;
  for (int T : want) tokens += 4LL * T;
  EXPECT_EQ(slw.tokens, tokens);
  EXPECT_NE(slw.losses[0], base.losses[0]) << "the first step did not truncate";
  // The full length's activations are taken before the first (short) step and never grow.
  EXPECT_GT(slw.act_start, 0u);
  EXPECT_EQ(slw.act_end, slw.act_start);
  EXPECT_EQ(slw.act_end, base.act_end);
  for (double l : slw.losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(SequenceLengthWarmup, ResumeMidScheduleIsExact) {
  const auto& w = world();
  const std::string d = test::shared_dir(w, "slw");
  const SlwRun whole = train(tiny(10, 4, 16), w);
  auto first = tiny(4, 4, 16);
  first.save_dir = d;
  train(first, w);
  auto rest = tiny(10, 4, 16);
  rest.load_path = d;
  const SlwRun cont = train(rest, w);
  ASSERT_FALSE(cont.loaded.empty());
  ASSERT_EQ(cont.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(cont.losses[i], whole.losses[4 + i]) << "step " << i + 5;
    EXPECT_EQ(cont.seqlens[i], whole.seqlens[4 + i]) << "step " << i + 5;
  }
  EXPECT_TRUE(same_bits(cont.params, whole.params));
  EXPECT_EQ(cont.tokens, whole.tokens);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

TEST(SequenceLengthWarmup, DataParallelMatchesOneRank) {
  const auto& w = world();
  if (w.size() == 1) GTEST_SKIP() << "needs 2 ranks";
  const SlwRun one = train(tiny(10, 4, 16), comm::Communicator::self());
  auto c = tiny(10, 4, 16);
  c.zero.stage = 1;
  const SlwRun dp = train(c, w);
  ASSERT_EQ(dp.losses.size(), one.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i)
    EXPECT_NEAR(dp.losses[i], one.losses[i], 1e-5 * std::fabs(one.losses[i])) << "step " << i + 1;
  EXPECT_EQ(dp.tokens, one.tokens);
}

// --train-tokens stops at the step whose tokens reach it; --lr-decay-tokens decays by the tokens
// through each step (4 x 4, 4 x 4, 4 x 8, ...: 16, 32, 64, 96, 128), from the end of a 2-step warmup.
TEST(SequenceLengthWarmup, TokenBudgetAndTokenDecay) {
  auto c = tiny(10, 4, 16);
  c.train_tokens = 100;
  c.lr_warmup_iters = 2;
  c.lr_decay_tokens = 160;
  c.lr_style = engine::LrStyle::linear;
  const SlwRun r = train(c, world());
  EXPECT_EQ(r.exit_reason, "train_tokens");
  ASSERT_EQ(r.losses.size(), 5u);  // 96 < 100 <= 128
  EXPECT_EQ(r.tokens, 128);
  const double through[] = {16, 32, 64, 96, 128}, warm_end = 32;
  EXPECT_DOUBLE_EQ(r.lrs[0], c.lr * 1 / 2);
  EXPECT_DOUBLE_EQ(r.lrs[1], c.lr);
  for (int i = 2; i < 5; ++i)
    EXPECT_NEAR(r.lrs[i], c.min_lr + (1 - (through[i] - warm_end) / (160 - warm_end)) * (c.lr - c.min_lr), 1e-12)
        << "step " << i + 1;
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
